#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The operator's pod watch broken while its writes still go through: an admin's edit of the
//! operator's ClusterRole takes away its pod `list` and `watch`, and every connection it has
//! open to kube-apiserver is cut (a TCP proxy between them), so its pod store stays as it was,
//! its watch failing to list afresh, while its queue watch and its writes work. Meanwhile the
//! admin raises a queue's guarantee, and the owner waiting in that queue could take a
//! borrower's GPU back. The operator must not plan that reclaim on a pod view that may be
//! stale: no borrower is marked or checkpointed, and the owner says why it waits. Once the
//! role is restored and the pod watch has listed afresh, the reclaim runs: one borrower
//! checkpointed and evicted once, the owner bound.

mod common;
mod fault_common;

use std::collections::HashMap;

use common::{
    Operator, Options, all_running, annotation, apply_queue, bound, create, free_port, install,
    is_gated, operator_access, waiting_reason,
};
use fault_common::{fake_vllms, gone, handover_record, name, queue};
use gpuqueue_api::{NVIDIA_GPU, annotations};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, CuttingProxy, DEFAULT_TIMEOUT, GpuNode, gpu_pod, wait_for,
};
use gpuqueue_fake_vllm::FakeVllm;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

/// The operator's ClusterRole, as `config/rbac/` ships it; its first rule is the pods'.
const ROLE: &str = "gpuqueue-operator";

/// Sets the verbs of the operator's pod rule, as an admin editing its ClusterRole would.
async fn pod_verbs(client: &Client, verbs: &[&str]) {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let patch = json!([
        {"op": "test", "path": "/rules/0/resources", "value": ["pods"]},
        {"op": "replace", "path": "/rules/0/verbs", "value": verbs},
    ]);
    let patch: Patch<()> = Patch::Json(serde_json::from_value(patch).unwrap());
    roles
        .patch(ROLE, &PatchParams::default(), &patch)
        .await
        .unwrap();
}

/// Waits until the API server refuses the operator's ServiceAccount a list of pods.
async fn pod_list_refused(operator: &Client) {
    let pods: Api<Pod> = Api::all(operator.clone());
    wait_for(
        "the operator's pod list to be refused",
        DEFAULT_TIMEOUT,
        || async {
            match pods.list(&ListParams::default().limit(1)).await {
                Err(kube::Error::Api(status)) if status.code == 403 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
}

/// Whether the borrower carries any part of a reclaim: an intent annotation or the
/// `DisruptionTarget` condition.
fn touched(pod: &Pod) -> bool {
    let marked = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "DisruptionTarget"));
    marked || annotation(pod, annotations::RECLAIM_ID).is_some()
}

/// The operator, reaching the API server through `proxy` as its ServiceAccount.
async fn operator_through(cluster: &ControlPlane, proxy: &CuttingProxy, port: u16) -> Operator {
    let access = operator_access(cluster).await;
    let kubeconfig = cluster.run_dir().join("operator-through-proxy.kubeconfig");
    let text = std::fs::read_to_string(&access.kubeconfig).unwrap();
    assert!(text.contains(cluster.api_server()), "{text}");
    std::fs::write(
        &kubeconfig,
        text.replace(cluster.api_server(), &proxy.url()),
    )
    .unwrap();
    let options = Options {
        kubeconfig: Some(kubeconfig),
        lease: ("15s", "5s"),
        ..Options::new("only", port)
    };
    Operator::start(cluster, options).await
}

/// Fails the test if a borrower carries any part of a reclaim or was checkpointed.
async fn untouched(borrowers: &Api<Pod>, servers: &HashMap<String, FakeVllm>) {
    for borrower in borrowers.list(&ListParams::default()).await.unwrap() {
        assert!(
            !touched(&borrower),
            "reclaimed on a stale view: {borrower:?}"
        );
    }
    for (pod, server) in servers {
        assert!(
            server.calls_to("/pause").is_empty(),
            "{pod} was checkpointed"
        );
    }
}

/// Waits until the owner's reason says that its reclaim waits for the operator's view; fails
/// the test as soon as a borrower shows a reclaim planned instead.
async fn reclaim_waits(
    owners: &Api<Pod>,
    borrowers: &Api<Pod>,
    servers: &HashMap<String, FakeVllm>,
) -> String {
    wait_for(
        "the owner to say why its reclaim waits",
        DEFAULT_TIMEOUT,
        || async {
            let owner = owners.get("owner").await.map_err(|e| e.to_string())?;
            let reason = annotation(&owner, annotations::WAITING_REASON).unwrap_or_default();
            if reason.contains("a reclaim would make room, but not yet") {
                return Ok(reason.to_owned());
            }
            untouched(borrowers, servers).await;
            Err(reason.to_owned())
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reclaim_is_planned_while_the_pod_watch_cannot_list_and_it_runs_once_it_can() {
    let cluster = ControlPlane::start(
        ControlPlaneConfig::new("fault_watch_cut")
            .with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", 2)]),
    )
    .await
    .unwrap();
    let client = cluster.client();
    let port = free_port();
    install(&cluster, port).await;
    let proxy = CuttingProxy::start(cluster.api_server()).await.unwrap();
    let operator = operator_through(&cluster, &proxy, port).await;

    // Two borrowers hold both GPUs; the owner's queue has no quota yet, so it waits without
    // a reclaim.
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    apply_queue(&client, &queue("online", online.name(), 0, 0, None)).await;
    apply_queue(&client, &queue("batch", batch.name(), 0, 2, Some("1500ms"))).await;
    let borrowers: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    for pod in ["b-0", "b-1"] {
        create(&borrowers, &gpu_pod(pod, NVIDIA_GPU, 1)).await;
    }
    let running = all_running(&borrowers, 2).await;
    let servers = fake_vllms(&running).await;
    let owners: Api<Pod> = Api::namespaced(client.clone(), online.name());
    create(&owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;
    let before = waiting_reason(&owners, "owner").await;
    assert!(before.contains("exceeds its ceiling of 0"), "{before}");

    // The operator may no longer list or watch pods, and its open watches are cut: its pod
    // watch fails, and fails again when it lists afresh.
    pod_verbs(&client, &["get", "patch"]).await;
    pod_list_refused(&operator_access(&cluster).await.client).await;
    let errors = "gpuqueue_watch_errors_total{resource=\"pods\"}";
    let before = operator.metric(errors).await.unwrap_or(0.0);
    proxy.cut();
    wait_for(
        "the pod watch to fail to list afresh",
        DEFAULT_TIMEOUT,
        || async {
            let now = operator.metric(errors).await.unwrap_or(0.0);
            (now >= before + 2.0)
                .then_some(())
                .ok_or_else(|| format!("{now} errors, {before} before the cut"))
        },
    )
    .await
    .unwrap();

    // The admin's edit reaches the operator (its queue watch lists afresh); its pod store
    // still shows the owner waiting and both borrowers.
    apply_queue(&client, &queue("online", online.name(), 1, 0, None)).await;
    let reason = reclaim_waits(&owners, &borrowers, &servers).await;
    assert!(
        reason.contains("the operator's view of pods and queues is catching up"),
        "{reason}"
    );
    let owner = owners.get("owner").await.unwrap();
    assert!(is_gated(&owner), "{owner:?}");
    untouched(&borrowers, &servers).await;

    // The role is restored: the pod watch lists afresh and the reclaim runs, once.
    pod_verbs(&client, &["get", "list", "watch", "patch"]).await;
    let owner = bound(&owners, "owner").await;
    let record = handover_record(&client, "online", &format!("{}/owner", online.name())).await;
    assert_eq!(record.outcome, "Completed", "{record:?}");
    assert_eq!(record.victims.len(), 1, "{record:?}");
    let victim = record.victims[0].split('/').nth(1).unwrap().to_owned();
    gone(&borrowers, &victim).await;
    assert_eq!(servers[&victim].calls_to("/pause").len(), 1, "{record:?}");
    let survivor = running.iter().map(name).find(|p| *p != victim).unwrap();
    assert!(servers[&survivor].calls_to("/pause").is_empty());
    assert!(!touched(&borrowers.get(&survivor).await.unwrap()));
    assert!(owner.spec.unwrap().node_name.is_some());
    drop(operator);
}
