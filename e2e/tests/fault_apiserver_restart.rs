#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! kube-apiserver restarted in the middle of a handover (issue 16): killed (SIGKILL) as soon
//! as the owner's intent is written, while the victim is still running, and started again
//! with the same etcd. Every call the operator makes meanwhile fails and its watches break;
//! the handover still completes, each victim checkpointed once and evicted once, no other pod
//! touched, and the record has every phase.

mod common;
mod fault_common;

use common::{
    Operator, Options, all_running, annotation, apply_queue, bound, create, events, free_port,
    install,
};
use fault_common::{actions, fake_vllms, gone, handover_record, name, phase_names, queue, uid};
use gpuqueue_api::{NVIDIA_GPU, annotations};
use gpuqueue_e2e::{
    Component, ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode,
    IGNORES_SIGTERM_ANNOTATION, gpu_pod, wait_for,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

/// The phases of a completed handover, in order.
const PHASES: [&str; 7] = [
    "plan",
    "intent",
    "reserve",
    "checkpoint",
    "evictAccepted",
    "victimsGone",
    "ownerBound",
];

/// A borrower that takes its whole grace period (2 s) to stop once evicted: the handover is
/// still waiting for it when the API server goes.
fn slow_borrower(name: &str) -> Pod {
    let mut pod = gpu_pod(name, NVIDIA_GPU, 1);
    pod.metadata.annotations =
        Some([(IGNORES_SIGTERM_ANNOTATION.to_owned(), "true".to_owned())].into());
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(2);
    pod
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_survives_a_kube_apiserver_restart_between_intent_and_victims_gone() {
    let mut cluster = ControlPlane::start(
        ControlPlaneConfig::new("fault_apiserver_restart")
            .with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", 2)]),
    )
    .await
    .unwrap();
    let client = cluster.client();
    let port = free_port();
    install(&cluster, port).await;
    let operator = Operator::start(&cluster, Options::new("only", port)).await;

    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    apply_queue(&client, &queue("online", online.name(), 2, 0, None)).await;
    apply_queue(&client, &queue("batch", batch.name(), 0, 2, Some("1s"))).await;
    let borrowers: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    for pod in ["b-0", "b-1"] {
        create(&borrowers, &slow_borrower(pod)).await;
    }
    let running = all_running(&borrowers, 2).await;
    let servers = fake_vllms(&running).await;

    // The owner's intent is the handover's first write: the API server goes right after it.
    let owners: Api<Pod> = Api::namespaced(client.clone(), online.name());
    create(&owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;
    wait_for("the owner's reclaim intent", DEFAULT_TIMEOUT, || async {
        let owner = owners.get("owner").await.map_err(|e| e.to_string())?;
        annotation(&owner, annotations::RECLAIM_ID)
            .map(drop)
            .ok_or_else(|| "no intent yet".to_owned())
    })
    .await
    .unwrap();
    let down = cluster.restart(Component::ApiServer).await.unwrap();
    eprintln!("kube-apiserver was down {down:?}");

    // The handover completes.
    let owner = bound(&owners, "owner").await;
    let owner_key = format!("{}/owner", online.name());
    let record = handover_record(&client, "online", &owner_key).await;
    assert_eq!(record.outcome, "Completed", "{record:?}");
    // The phases it saw, in order; a term lost to the outage and resumed has only the
    // phases after the resumption (see the resumed-handover tests in reclaim.rs).
    let phases = phase_names(&record);
    let positions: Vec<usize> = phases
        .iter()
        .map(|p| PHASES.iter().position(|q| q == p).unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{phases:?}");
    assert!(
        phases.ends_with(&["victimsGone", "ownerBound"]),
        "{phases:?}"
    );
    let at: Vec<i64> = record.phases.iter().map(|p| p.at_millis).collect();
    assert!(at.windows(2).all(|w| w[0] <= w[1]), "{record:?}");
    assert_eq!(
        record.node,
        owner.spec.as_ref().unwrap().node_name.clone().unwrap()
    );
    assert_eq!(
        record.victims.len(),
        1,
        "one GPU needs one victim: {record:?}"
    );
    let victim = record.victims[0].split('/').nth(1).unwrap().to_owned();
    gone(&borrowers, &victim).await;

    // Each action once: one checkpoint call and one eviction for the victim, none for the
    // other borrower, which still runs as the same pod.
    let survivor = running.iter().find(|p| name(p) != victim).unwrap();
    assert_eq!(
        uid(&borrowers.get(&name(survivor)).await.unwrap()),
        uid(survivor)
    );
    assert_eq!(
        servers[&victim].calls_to("/pause").len(),
        1,
        "checkpointed once"
    );
    assert!(servers[&name(survivor)].calls_to("/pause").is_empty());
    assert_eq!(record.checkpoints.len(), 1, "{record:?}");
    let evicted = events(&client, batch.name(), &victim, "Evicted").await;
    assert_eq!(evicted.len(), 1, "{evicted:?}");
    assert_eq!(evicted[0].count.unwrap_or(1), 1, "{evicted:?}");
    assert!(
        events(&client, batch.name(), &name(survivor), "Evicted")
            .await
            .is_empty()
    );
    let mut removed = 0.0;
    for outcome in ["evicted", "deleted_after_refusal"] {
        let series = format!("gpuqueue_evictions_total{{outcome=\"{outcome}\"}}");
        removed += operator.metric(&series).await.unwrap_or(0.0);
    }
    assert!((removed - 1.0).abs() < 0.5, "{removed} victims removed");
    let checkpoints = actions(&operator).await;
    assert!(
        checkpoints
            .iter()
            .any(|(f, n)| *f == "gpuqueue_checkpoints_total" && (*n - 1.0).abs() < 0.5),
        "{checkpoints:?}"
    );
}
