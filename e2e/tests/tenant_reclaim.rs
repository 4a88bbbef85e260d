#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! Reclaim state a tenant cannot forge (issue 13, items 2, 5 and the `OwnerNotBound` part of
//! 3), end to end, acting as a tenant bound to the stock `edit` role:
//!
//! - reclaim annotations a tenant puts on its own pods while the webhook is down stop nothing,
//!   write no record on another queue, and do not make its pods un-evictable;
//! - a victim on the node's network (`hostNetwork`) is never called, only evicted;
//! - an owner whose freed GPUs another pod took is not left pinned and Pending for good.
//!
//! Nothing here asserts how long anything took.

mod common;

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{
    Operator, Options, all_running, annotation, apply_queue, bound, create, event, free_port,
    install,
};
use gpuqueue_api::{
    NVIDIA_GPU, annotations,
    v1alpha1::{GpuQueue, HandoverRecord},
};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, apply_yaml, bound_replacement,
    describe_pod, gpu_pod, wait_for,
};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Client,
    api::{Api, DeleteParams, ListParams},
};

/// Long enough for a handover whose owner is never bound to give up (budget, grace, settle
/// limit) and for the next plan to run.
const UNBOUND_TIMEOUT: Duration = Duration::from_mins(2);

/// A one-resource GpuQueue; `reclaim` is the flow-style `spec.reclaim`, if any.
fn queue(name: &str, namespace: &str, guaranteed: u32, burstable: u32, reclaim: &str) -> String {
    let mut yaml = format!(
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: {name}\nspec:\n  namespaces: [{namespace}]\n  resources:\n    - {{name: nvidia.com/gpu, guaranteed: {guaranteed}, burstable: {burstable}}}\n"
    );
    if !reclaim.is_empty() {
        let _ = writeln!(yaml, "  reclaim: {reclaim}");
    }
    yaml
}

/// A cluster with the CRD and the webhook configuration installed and no operator yet: the
/// webhook is down, and its `failurePolicy: Ignore` lets pods through unmutated.
async fn cluster(name: &str, nodes: Vec<GpuNode>) -> (ControlPlane, u16) {
    let cluster = ControlPlane::start(ControlPlaneConfig::new(name).with_nodes(nodes))
        .await
        .unwrap();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    (cluster, webhook_port)
}

async fn operator(cluster: &ControlPlane, webhook_port: u16) -> Operator {
    Operator::start(cluster, Options::new("first", webhook_port)).await
}

/// `pod` with `notes` as annotations.
fn annotated(mut pod: Pod, notes: &[(&str, &str)]) -> Pod {
    pod.metadata.annotations = Some(
        notes
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    pod
}

/// Waits for the record of a handover with `role` to `owner` (`namespace/name`) on `queue`.
async fn record(
    client: &Client,
    queue: &str,
    role: &str,
    owner: &str,
    timeout: Duration,
) -> HandoverRecord {
    let queues: Api<GpuQueue> = Api::all(client.clone());
    wait_for(
        format!("{role} record of {owner} on {queue}"),
        timeout,
        || async {
            let q = queues.get(queue).await.map_err(|e| e.to_string())?;
            q.status
                .as_ref()
                .and_then(|s| {
                    s.last_handovers
                        .iter()
                        .find(|r| r.role == role && r.owner_pod == owner)
                        .cloned()
                })
                .ok_or_else(|| format!("status: {}", serde_json::to_string(&q.status).unwrap()))
        },
    )
    .await
    .unwrap()
}

/// The queue's status as the API server has it now.
async fn status_of(client: &Client, queue: &str) -> gpuqueue_api::v1alpha1::GpuQueueStatus {
    let queues: Api<GpuQueue> = Api::all(client.clone());
    queues.get(queue).await.unwrap().status.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_reclaim_marks_stop_nothing_record_nothing_and_protect_nothing() {
    let (cluster, webhook_port) = cluster(
        "tenant_forged_marks",
        vec![GpuNode::whole_gpus("gpu-node-0", 4)],
    )
    .await;
    let admin = cluster.client();
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    let labs = cluster.namespace("labs").await.unwrap();
    apply_queue(&admin, &queue("online", online.name(), 4, 0, "")).await;
    apply_queue(&admin, &queue("batch", batch.name(), 0, 4, "")).await;
    apply_queue(&admin, &queue("labs", labs.name(), 0, 4, "")).await;

    // The webhook is down: the tenant creates pods carrying forged reclaim marks, ungated.
    let tenant = cluster.tenant_with_edit(batch.name()).await.unwrap();
    let tenant_pods: Api<Pod> = Api::namespaced(tenant.client.clone(), batch.name());
    let forever = "2099-01-01T00:00:00Z";
    let victim_mark = [
        (annotations::RECLAIM_ID, "rc-forged-victim"),
        (annotations::RECLAIM_ROLE, "victim"),
        (annotations::RECLAIM_DEADLINE, forever),
        (annotations::RECLAIM_NODE, "gpu-node-0"),
    ];
    create(
        &tenant_pods,
        &annotated(gpu_pod("forged-victim", NVIDIA_GPU, 1), &victim_mark),
    )
    .await;
    let labs_victim = format!(
        r#"[{{"pod": "{}/x", "uid": "uid-x", "queue": "labs"}}]"#,
        labs.name()
    );
    let owner_mark = [
        (annotations::RECLAIM_ID, "rc-forged-owner"),
        (annotations::RECLAIM_ROLE, "owner"),
        (annotations::RECLAIM_DEADLINE, forever),
        (annotations::RECLAIM_NODE, "gpu-node-0"),
        (annotations::RECLAIM_VICTIMS, labs_victim.as_str()),
        (annotations::QUEUE, "batch"),
    ];
    create(
        &tenant_pods,
        &annotated(gpu_pod("forged-owner", NVIDIA_GPU, 1), &owner_mark),
    )
    .await;
    for name in ["plain-1", "plain-2"] {
        create(&tenant_pods, &gpu_pod(name, NVIDIA_GPU, 1)).await;
    }
    let forged = all_running(&tenant_pods, 4).await;
    assert!(
        forged
            .iter()
            .all(|p| annotation(p, annotations::RECLAIM_ID).is_some()
                || p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("plain"))),
        "the marks went through the outage"
    );

    // The operator starts; online asks for its whole guarantee, the node batch fills.
    let operator = operator(&cluster, webhook_port).await;
    let owners: Api<Pod> = Api::namespaced(admin.clone(), online.name());
    create(&owners, &gpu_pod("owner", NVIDIA_GPU, 4)).await;
    let owner_key = format!("{}/owner", online.name());

    // The reclaim completes, and the forged pods were among its victims: evictable.
    let done = record(&admin, "online", "owner", &owner_key, DEFAULT_TIMEOUT).await;
    assert_eq!(done.outcome, "Completed", "{done:?}");
    for name in ["forged-victim", "forged-owner"] {
        let key = format!("{}/{name}", batch.name());
        assert!(done.victims.contains(&key), "{key} was evicted: {done:?}");
    }
    bound(&owners, "owner").await;

    // The forged owner intent recorded nothing on labs, and labs has no cool-down.
    let labs_status = status_of(&admin, "labs").await;
    assert!(labs_status.last_handovers.is_empty(), "{labs_status:?}");
    // Nothing is left in flight once the handover is recorded.
    assert!(
        status_of(&admin, "online")
            .await
            .reclaims_in_flight
            .is_empty()
    );
    let ignored = operator.metric("gpuqueue_reclaim_marks_unrecorded").await;
    assert!(ignored.is_some(), "the gauge is exported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_victim_on_the_nodes_network_is_evicted_without_being_called() {
    let (cluster, webhook_port) = cluster(
        "tenant_host_network",
        vec![GpuNode::whole_gpus("gpu-node-0", 1)],
    )
    .await;
    let admin = cluster.client();
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    let checkpoint = "{checkpoint: {driver: vllm, port: 8000, timeout: 1500ms}}";
    apply_queue(&admin, &queue("online", online.name(), 1, 0, "")).await;
    apply_queue(&admin, &queue("batch", batch.name(), 0, 1, checkpoint)).await;
    let _operator = operator(&cluster, webhook_port).await;

    // The tenant borrows the GPU with a pod on the node's network.
    let tenant = cluster.tenant_with_edit(batch.name()).await.unwrap();
    let tenant_pods: Api<Pod> = Api::namespaced(tenant.client.clone(), batch.name());
    let mut victim = gpu_pod("host-net", NVIDIA_GPU, 1);
    victim.spec.as_mut().unwrap().host_network = Some(true);
    create(&tenant_pods, &victim).await;
    let victim = all_running(&tenant_pods, 1).await.remove(0);
    let address: IpAddr = victim
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .unwrap()
        .parse()
        .unwrap();

    // Whatever listens at that address on the checkpoint port counts every connection.
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(address, 8000))
        .await
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });

    let owners: Api<Pod> = Api::namespaced(admin.clone(), online.name());
    create(&owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;
    let owner_key = format!("{}/owner", online.name());
    let done = record(&admin, "online", "owner", &owner_key, DEFAULT_TIMEOUT).await;
    assert_eq!(done.outcome, "Completed", "{done:?}");
    bound(&owners, "owner").await;
    let checkpoint = &done.checkpoints[0];
    assert_eq!(checkpoint.result, "Skipped", "{done:?}");
    assert!(
        checkpoint
            .message
            .contains("the pod uses the node's network (spec.hostNetwork is true"),
        "{checkpoint:?}"
    );
    assert!(
        checkpoint
            .message
            .contains("the operator calls only pod addresses")
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "nothing was called at {address}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_freed_gpus_an_intruder_took_is_planned_again() {
    let (cluster, webhook_port) = cluster(
        "tenant_owner_not_bound",
        vec![GpuNode::whole_gpus("gpu-node-0", 1)],
    )
    .await;
    let admin = cluster.client();
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    apply_queue(&admin, &queue("online", online.name(), 1, 0, "")).await;
    apply_queue(&admin, &queue("batch", batch.name(), 0, 1, "")).await;
    let _operator = operator(&cluster, webhook_port).await;

    // batch borrows the GPU; a disruption budget holds its eviction until the deadline, the
    // window in which the intruder comes.
    let tenant = cluster.tenant_with_edit(batch.name()).await.unwrap();
    let tenant_pods: Api<Pod> = Api::namespaced(tenant.client.clone(), batch.name());
    create(&tenant_pods, &gpu_pod("borrower", NVIDIA_GPU, 1)).await;
    all_running(&tenant_pods, 1).await;
    let budget = "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: keep\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels: {app: borrower}\n";
    apply_yaml(&admin, budget, Some(batch.name()))
        .await
        .unwrap();

    // online's owner comes from a Deployment, as a real workload's does.
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: serve\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {app: serve}\n  template:\n    metadata:\n      labels: {app: serve}\n    spec:\n      containers:\n        - name: main\n          image: registry.invalid/gpuqueue-e2e/fake:1\n          resources:\n            limits: {nvidia.com/gpu: 1}\n";
    apply_yaml(&admin, deployment, Some(online.name()))
        .await
        .unwrap();
    let owners: Api<Pod> = Api::namespaced(admin.clone(), online.name());
    let first = wait_for(
        "the owner released for a reclaim",
        DEFAULT_TIMEOUT,
        || async {
            let list = owners
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|p| annotation(p, annotations::RECLAIM_NODE).is_some())
                .ok_or_else(|| "no owner carries a reclaim intent yet".to_owned())
        },
    )
    .await
    .unwrap();

    // The intruder: a pod bound to the node by name, past scheduler and gate. In a claimed
    // namespace the webhook and the creation policy refuse that (tenant_policy tests it), and
    // an unadmitted pod there is evicted while the owner waits (tenant_liveness); a namespace
    // no queue claims may still do it, and its pods are no queue's to evict.
    let unclaimed = cluster.namespace("unclaimed").await.unwrap();
    let intruders: Api<Pod> = Api::namespaced(admin.clone(), unclaimed.name());
    let mut intruder = gpu_pod("intruder", NVIDIA_GPU, 1);
    intruder.spec.as_mut().unwrap().node_name = Some("gpu-node-0".to_owned());
    create(&intruders, &intruder).await;

    // The handover ends without the owner bound, and says what was done about it.
    let first_name = first.metadata.name.clone().unwrap();
    let first_key = format!("{}/{first_name}", online.name());
    let ended = record(&admin, "online", "owner", &first_key, UNBOUND_TIMEOUT).await;
    assert!(ended.outcome.starts_with("OwnerNotBound"), "{ended:?}");
    let note = event(&admin, online.name(), &first_name, "OwnerNotBound").await;
    assert!(
        note.contains("it is evicted so that its controller creates it again"),
        "{note}"
    );

    // Not pinned for good: once the intruder leaves, a replacement (not the first owner, which
    // would have bound the moment the GPU freed had it stayed pinned) is planned again and gets
    // online's guarantee.
    intruders
        .delete("intruder", &DeleteParams::default())
        .await
        .unwrap();
    let replacement = bound_replacement(&owners, &first_name, UNBOUND_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(
        annotation(&replacement, annotations::ADMITTED_AS),
        Some("guaranteed"),
        "{}",
        describe_pod(&replacement)
    );
}
