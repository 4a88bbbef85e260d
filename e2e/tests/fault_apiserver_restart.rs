#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! kube-apiserver restarted in the middle of a handover (issue 16): killed (SIGKILL) while the
//! victim's checkpoint runs, after the intents and the owner's release, before the eviction,
//! and started again with the same etcd. Every call the operator makes meanwhile fails, its
//! watches break, and the restarted API server answers 403 until its authorizer has synced;
//! the handover still completes, each victim checkpointed once and evicted once (with its
//! event), no other pod touched, and the record has every phase.
//!
//! Where the restart lands is fixed, not raced: the checkpoint takes [`CHECKPOINT_TAKES`], and
//! the API server goes as soon as the call arrives. The budgets are long, so that however slow
//! the machine the restart ends within them: this test is about surviving the restart, not
//! about budgets (`handover_budget.rs`). The operator runs with the default lease (15 s, as
//! installed), which a restart of seconds does not cost it; losing the lead mid-handover is
//! `fault_leadership.rs`'s.

mod common;
mod fault_common;

use common::{Operator, Options, all_running, apply_queue, bound, create, event, events};
use fault_common::{
    VLLM_PORT, actions, fake_vllms, gone, handover_record, installed, name, phase_names, uid,
};
use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    Component, DEFAULT_TIMEOUT, IGNORES_SIGTERM_ANNOTATION, gpu_pod, node_of, wait_for,
};
use gpuqueue_fake_vllm::{FakeVllm, Fault};
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

/// How long the victim's checkpoint (vLLM's `/pause`) takes: the API server restarts meanwhile.
const CHECKPOINT_TAKES: std::time::Duration = std::time::Duration::from_secs(5);

/// A GpuQueue of one resource with the longest budget, and for a borrower queue a checkpoint
/// through vLLM's pause endpoint that may take 20 s.
fn queue(name: &str, namespace: &str, guaranteed: u32, burstable: u32, borrower: bool) -> String {
    let checkpoint = if borrower {
        format!(", checkpoint: {{driver: vllm, port: {VLLM_PORT}, timeout: 20s}}")
    } else {
        String::new()
    };
    format!(
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: {name}\nspec:\n  namespaces: [{namespace}]\n  resources:\n    - {{name: nvidia.com/gpu, guaranteed: {guaranteed}, burstable: {burstable}}}\n  reclaim: {{budget: 60s{checkpoint}}}\n"
    )
}

/// Every server's next `/pause` takes [`CHECKPOINT_TAKES`].
fn slow_checkpoints<'a>(servers: impl Iterator<Item = &'a FakeVllm>) {
    for server in servers {
        server.set_fault(
            "/pause",
            Fault {
                delay_ms: CHECKPOINT_TAKES.as_millis().try_into().unwrap(),
                times: Some(1),
                ..Fault::default()
            },
        );
    }
}

/// A borrower that ignores SIGTERM, so it takes the whole grace period its eviction gives it
/// (its queue's) and a relist to stop: the handover is still waiting for it when the API
/// server goes.
fn slow_borrower(name: &str) -> Pod {
    let mut pod = gpu_pod(name, NVIDIA_GPU, 1);
    pod.metadata.annotations =
        Some([(IGNORES_SIGTERM_ANNOTATION.to_owned(), "true".to_owned())].into());
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(2);
    pod
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_survives_a_kube_apiserver_restart_between_intent_and_victims_gone() {
    let (mut cluster, port) = installed("fault_apiserver_restart", 2).await;
    let client = cluster.client();
    let options = Options {
        lease: ("15s", "5s"),
        ..Options::new("only", port)
    };
    let operator = Operator::start(&cluster, options).await;

    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    apply_queue(&client, &queue("online", online.name(), 2, 0, false)).await;
    apply_queue(&client, &queue("batch", batch.name(), 0, 2, true)).await;
    let borrowers: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    for pod in ["b-0", "b-1"] {
        create(&borrowers, &slow_borrower(pod)).await;
    }
    let running = all_running(&borrowers, 2).await;
    let servers = fake_vllms(&running).await;

    slow_checkpoints(servers.values());

    // The API server goes as soon as the victim's checkpoint is called (its intents, the
    // owner's release and the checkpoint's progress mark are written by then).
    let owners: Api<Pod> = Api::namespaced(client.clone(), online.name());
    create(&owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;
    wait_for("the victim's checkpoint call", DEFAULT_TIMEOUT, || async {
        servers
            .values()
            .any(|server| !server.calls_to("/pause").is_empty())
            .then_some(())
            .ok_or_else(|| "no checkpoint call yet".to_owned())
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
    assert_eq!(node_of(&owner), Some(record.node.as_str()));
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
    // Events wait for the handover to end (at most 1 s): the eviction's may still be queued.
    event(&client, batch.name(), &victim, "Evicted").await;
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
