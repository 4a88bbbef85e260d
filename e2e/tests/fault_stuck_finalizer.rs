#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! A victim stuck Terminating (issue 16): a foreign finalizer (a backup controller's, say)
//! keeps the evicted borrower in the API after its grace period. Its GPUs stay held, as
//! kube-scheduler counts them: the owner is not bound before it is gone, and no other pod
//! gets its GPUs. Meanwhile the operator closes the handover over budget with an outcome that
//! names the finalizer and warns on the owner (HandoverIncomplete), evicts nobody else, and
//! once the finalizer is removed the owner, still pinned, is bound to the freed node.

mod common;
mod fault_common;

use common::{
    Operator, Options, all_running, apply_queue, bound, create, event, events, is_gated,
    waiting_reason,
};
use fault_common::{gone, handover_record, installed, name, queue, uid};
use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{gpu_pod, node_of};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// A finalizer no operator of ours knows.
const FOREIGN_FINALIZER: &str = "backup.example.com/snapshot";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_victim_held_by_a_foreign_finalizer_keeps_its_gpus_until_it_is_gone() {
    let (cluster, port) = installed("fault_stuck_finalizer", 2).await;
    let client = cluster.client();
    let operator = Operator::start(&cluster, Options::new("only", port)).await;

    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    let labs = cluster.namespace("labs").await.unwrap();
    apply_queue(&client, &queue("online", online.name(), 2, 0, None)).await;
    apply_queue(&client, &queue("batch", batch.name(), 0, 2, None)).await;
    apply_queue(&client, &queue("labs", labs.name(), 0, 2, None)).await;
    let borrowers: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    for pod in ["b-0", "b-1"] {
        let mut pod = gpu_pod(pod, NVIDIA_GPU, 1);
        pod.metadata.finalizers = Some(vec![FOREIGN_FINALIZER.to_owned()]);
        pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(1);
        create(&borrowers, &pod).await;
    }
    let running = all_running(&borrowers, 2).await;

    // The owner takes one GPU back: its victim is evicted, and stays.
    let owners: Api<Pod> = Api::namespaced(client.clone(), online.name());
    create(&owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;
    let owner_key = format!("{}/owner", online.name());
    let record = handover_record(&client, "online", &owner_key).await;
    assert_eq!(record.victims.len(), 1, "{record:?}");
    let victim = record.victims[0].split('/').nth(1).unwrap().to_owned();
    assert!(
        record.outcome.starts_with("VictimsNotGone")
            && record.outcome.contains(&record.victims[0])
            && record.outcome.contains(FOREIGN_FINALIZER),
        "{record:?}"
    );
    assert!(record.total_millis > record.budget_millis, "{record:?}");
    let warning = event(&client, online.name(), "owner", "HandoverIncomplete").await;
    assert!(warning.contains(FOREIGN_FINALIZER), "{warning}");

    // Meanwhile: the victim is still there, terminating; the owner waits pinned, unbound; a
    // pod of a third queue that wants a GPU is not given the victim's.
    let stuck = borrowers.get(&victim).await.unwrap();
    assert!(stuck.metadata.deletion_timestamp.is_some());
    let owner = owners.get("owner").await.unwrap();
    assert!(!is_gated(&owner));
    assert!(node_of(&owner).is_none());
    let lab_pods: Api<Pod> = Api::namespaced(client.clone(), labs.name());
    create(&lab_pods, &gpu_pod("l-0", NVIDIA_GPU, 1)).await;
    let reason = waiting_reason(&lab_pods, "l-0").await;
    assert!(!reason.is_empty());
    // Nobody else evicted: the other borrower runs on as the same pod.
    let survivor = running.iter().find(|p| name(p) != victim).unwrap();
    let now = borrowers.get(&name(survivor)).await.unwrap();
    assert_eq!(uid(&now), uid(survivor));
    assert!(now.metadata.deletion_timestamp.is_none(), "evicted too");
    assert!(
        events(&client, batch.name(), &name(survivor), "Evicted")
            .await
            .is_empty()
    );
    assert_eq!(
        operator.metric("gpuqueue_reclaims_started_total").await,
        Some(1.0)
    );

    // The finalizer goes: so does the victim, and the owner is bound where it was pinned.
    let patch = json!([{"op": "remove", "path": "/metadata/finalizers"}]);
    borrowers
        .patch(
            &victim,
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(patch).unwrap()),
        )
        .await
        .unwrap();
    gone(&borrowers, &victim).await;
    let owner = bound(&owners, "owner").await;
    assert_eq!(node_of(&owner), Some(record.node.as_str()));
    let l0 = lab_pods.get("l-0").await.unwrap();
    assert!(is_gated(&l0), "the freed GPU went to the owner");
    assert_eq!(
        operator.metric("gpuqueue_reclaims_started_total").await,
        Some(1.0)
    );
    // The survivor keeps its finalizer: clear it so the namespace can go.
    let patch = json!([{"op": "remove", "path": "/metadata/finalizers"}]);
    borrowers
        .patch(
            &name(survivor),
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(patch).unwrap()),
        )
        .await
        .unwrap();
}
