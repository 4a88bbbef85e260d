//! What `top` reads from the cluster: every node, pod, namespace and queue.

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Client;
use kube::api::{Api, ListParams};

use super::pools::Objects;
use crate::connect::{self, InspectError};

/// Lists what the report is built from.
pub async fn read(client: Client) -> Result<Objects, InspectError> {
    let all = ListParams::default();
    let failed =
        |what: &'static str| move |e| InspectError::from_api(format!("list {what}"), what, e);
    let nodes = Api::<Node>::all(client.clone())
        .list(&all)
        .await
        .map_err(failed("nodes"))?;
    let pods = Api::<Pod>::all(client.clone())
        .list(&all)
        .await
        .map_err(failed("pods in all namespaces"))?;
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&all)
        .await
        .map_err(failed("namespaces"))?;
    let queues = connect::read_queues(client, None).await?;
    Ok(Objects {
        nodes: nodes.items,
        pods: pods.items,
        namespaces: namespaces.items,
        queues,
    })
}
