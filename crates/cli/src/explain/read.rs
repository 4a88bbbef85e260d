//! What `explain` reads from the cluster: the pod, its namespace, the queues and the pod's
//! events; the one part of `explain` that talks to the API server.

use gpuqueue_api::{annotations, v1alpha1::GpuQueue};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use kube::Client;
use kube::api::{Api, ListParams};

use crate::args::ExplainArgs;
use crate::connect::{self, InspectError};

/// What `explain` read from the cluster.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub pod: Pod,
    /// The pod's namespace; `None` when it could not be read (its labels are then unknown).
    pub namespace: Option<Namespace>,
    /// Why the namespace could not be read.
    pub namespace_error: Option<String>,
    pub queues: Vec<GpuQueue>,
    /// Why the queues could not all be listed (`queues` then holds at most the pod's own).
    pub queues_error: Option<String>,
    /// Events about the pod (any reporter; filtered here).
    pub events: Vec<Event>,
    /// Why events could not be listed.
    pub events_error: Option<String>,
}

/// Every queue; for a user who may not list them (a tenant, or a tenant admin whose role names
/// one queue), the queue the pod was admitted to, if it may read that one, and why the list
/// was refused.
async fn read_queues(
    client: &Client,
    pod: &Pod,
) -> Result<(Vec<GpuQueue>, Option<String>), InspectError> {
    let refused = match connect::read_queues(client.clone(), None).await {
        Ok(queues) => return Ok((queues, None)),
        Err(refused @ InspectError::Forbidden { .. }) => refused,
        Err(other) => return Err(other),
    };
    let own = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|notes| notes.get(annotations::QUEUE));
    let queues = match own {
        Some(name) => connect::read_queues(client.clone(), Some(name))
            .await
            .unwrap_or_default(),
        None => Vec::new(),
    };
    Ok((queues, Some(refused.to_string())))
}

/// Reads the pod, its namespace, the queues and the pod's events.
pub async fn read(args: &ExplainArgs) -> Result<Observed, InspectError> {
    let cluster = connect::connect(&args.cluster).await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| cluster.default_namespace.clone());
    let client = cluster.client;
    let pod = Api::<Pod>::namespaced(client.clone(), &namespace)
        .get(&args.pod)
        .await
        .map_err(|e| {
            InspectError::from_api(
                format!("get pods in namespace {namespace}"),
                format!("pod {}/{}", namespace, args.pod),
                e,
            )
        })?;
    let (queues, queues_error) = read_queues(&client, &pod).await?;
    // Tenants may read their pods but not namespaces or events: explain what can be told.
    let (namespace_object, namespace_error) =
        match Api::<Namespace>::all(client.clone()).get(&namespace).await {
            Ok(ns) => (Some(ns), None),
            Err(e) => (
                None,
                Some(
                    InspectError::from_api("get namespaces", format!("namespace {namespace}"), e)
                        .to_string(),
                ),
            ),
        };
    let selector = format!("involvedObject.kind=Pod,involvedObject.name={}", args.pod);
    let (events, events_error) = match Api::<Event>::namespaced(client, &namespace)
        .list(&ListParams::default().fields(&selector))
        .await
    {
        Ok(list) => (list.items, None),
        Err(e) => (
            Vec::new(),
            Some(
                InspectError::from_api(
                    format!("list events in namespace {namespace}"),
                    "events",
                    e,
                )
                .to_string(),
            ),
        ),
    };
    Ok(Observed {
        pod,
        namespace: namespace_object,
        namespace_error,
        queues,
        queues_error,
        events,
        events_error,
    })
}
