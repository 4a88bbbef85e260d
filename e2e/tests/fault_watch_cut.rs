#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! One of the operator's watches broken while its writes still go through: an admin's edit of
//! the operator's ClusterRole takes away its `list` and `watch` of pods (or of nodes, or of DRA
//! ResourceClaims), and every
//! connection it has open to kube-apiserver is cut (a TCP proxy between them), so that store
//! stays as it was, its watch failing to list afresh, while the queue watch and the writes
//! work. Meanwhile the admin raises a queue's guarantee, and the owner waiting in that queue
//! could take a borrower's GPU back. The operator must not plan that reclaim on a view that may
//! be stale: no borrower is marked or checkpointed, and the owner says why it waits. Once the
//! role is restored and the watch has listed afresh, the reclaim runs: one borrower
//! checkpointed and evicted once, the owner bound.

mod common;
mod fault_common;

use std::collections::HashMap;

use common::{
    Operator, Options, all_running, annotation, apply_queue, bound, create, is_gated,
    operator_access, waiting_reason,
};
use fault_common::{fake_vllms, gone, handover_record, installed, name, queue};
use gpuqueue_api::{NVIDIA_GPU, annotations};
use gpuqueue_e2e::{ControlPlane, CuttingProxy, DEFAULT_TIMEOUT, gpu_pod, wait_for};
use gpuqueue_fake_vllm::FakeVllm;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

/// The operator's ClusterRole, as `config/rbac/` ships it.
const ROLE: &str = "gpuqueue-operator";

/// Sets the verbs of the operator's rule for `resource` (the rule naming it alone), as an admin
/// editing its ClusterRole would.
async fn rule_verbs(client: &Client, resource: &str, verbs: &[&str]) {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role = roles.get(ROLE).await.unwrap();
    let index = role
        .rules
        .unwrap_or_default()
        .iter()
        .position(|r| r.resources.as_deref() == Some(&[resource.to_owned()]))
        .unwrap();
    let patch = json!([
        {"op": "test", "path": format!("/rules/{index}/resources"), "value": [resource]},
        {"op": "replace", "path": format!("/rules/{index}/verbs"), "value": verbs},
    ]);
    let patch: Patch<()> = Patch::Json(serde_json::from_value(patch).unwrap());
    roles
        .patch(ROLE, &PatchParams::default(), &patch)
        .await
        .unwrap();
}

/// Waits until the API server refuses the operator's ServiceAccount the list at `path`.
async fn list_refused(operator: &Client, path: &str) {
    wait_for(
        format!("the operator's list of {path} to be refused"),
        DEFAULT_TIMEOUT,
        || async {
            let list = http::Request::get(format!("{path}?limit=1"))
                .body(Vec::new())
                .unwrap();
            match operator.request_text(list).await {
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
    reclaim_waits_for_the_watch(
        "fault_watch_cut_pods",
        ("pods", "/api/v1/pods"),
        &["get", "patch"],
        &["get", "list", "watch", "patch"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reclaim_is_planned_while_the_node_watch_cannot_list_and_it_runs_once_it_can() {
    reclaim_waits_for_the_watch(
        "fault_watch_cut_nodes",
        ("nodes", "/api/v1/nodes"),
        // A rule needs a verb: `get`, which the operator never uses.
        &["get"],
        &["list", "watch"],
    )
    .await;
}

/// No pod here has a claim, but the operator cannot know that none was created meanwhile: a
/// claim charges its pod's queue, so a stale claim store is a stale view too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reclaim_is_planned_while_the_claim_watch_cannot_list_and_it_runs_once_it_can() {
    reclaim_waits_for_the_watch(
        "fault_watch_cut_claims",
        ("resourceclaims", "/apis/resource.k8s.io/v1/resourceclaims"),
        &["get", "patch"],
        &["get", "list", "watch", "patch"],
    )
    .await;
}

/// The scenario of the module's documentation, with the operator's `list` and `watch` of
/// `resource` (listed at `path`) taken away (its rule's verbs `reduced`, then `full` again), in
/// a cluster of its own.
async fn reclaim_waits_for_the_watch(
    cluster_name: &str,
    (resource, path): (&str, &str),
    reduced: &[&str],
    full: &[&str],
) {
    let (cluster, port) = installed(cluster_name, 2).await;
    let client = cluster.client();
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

    // The operator may no longer list or watch `resource`, and its open watches are cut: that
    // watch fails, and fails again when it lists afresh.
    rule_verbs(&client, resource, reduced).await;
    list_refused(&operator_access(&cluster).await.client, path).await;
    let errors = format!("gpuqueue_watch_errors_total{{resource=\"{resource}\"}}");
    let before = operator.metric(&errors).await.unwrap_or(0.0);
    proxy.cut();
    wait_for(
        format!("the {resource} watch to fail to list afresh"),
        DEFAULT_TIMEOUT,
        || async {
            let now = operator.metric(&errors).await.unwrap_or(0.0);
            (now >= before + 2.0)
                .then_some(())
                .ok_or_else(|| format!("{now} errors, {before} before the cut"))
        },
    )
    .await
    .unwrap();

    // The admin's edit reaches the operator (its queue watch lists afresh); its store of
    // `resource` still shows what it showed before the cut.
    apply_queue(&client, &queue("online", online.name(), 1, 0, None)).await;
    let reason = reclaim_waits(&owners, &borrowers, &servers).await;
    assert!(
        reason.contains("the operator's view of the cluster is catching up"),
        "{reason}"
    );
    let owner = owners.get("owner").await.unwrap();
    assert!(is_gated(&owner), "{owner:?}");
    untouched(&borrowers, &servers).await;

    // The role is restored: the watch lists afresh and the reclaim runs, once.
    rule_verbs(&client, resource, full).await;
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
