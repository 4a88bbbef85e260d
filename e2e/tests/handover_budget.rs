#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The handover budget that plans for termination, end to end: the API server refuses a queue
//! whose budget cannot hold its own checkpoint timeout, victim grace and the bind reserve, and
//! an owner whose handover will overrun its budget is told so (event, condition, metric) before
//! the eviction. Nothing here asserts how long anything took: the order of server-side times.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::{
    Operator, Options, all_running, apply_queue, bound, create, events, free_port, install,
};
use futures::{StreamExt, TryStreamExt};
use gpuqueue_api::{NVIDIA_GPU, conditions, v1alpha1::GpuQueue};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, IGNORES_SIGTERM_ANNOTATION,
    WriteMode, apply_yaml, gpu_pod, install_crds, repo_root, wait_for, write_yaml,
};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{
    Client,
    api::Api,
    runtime::{WatchStreamExt, watcher},
};

/// The victim queue's grace period: far beyond the owner's 3 s budget.
const LONG_GRACE_SECONDS: u32 = 10;

/// A one-resource GpuQueue with the flow-style `spec.reclaim`.
fn queue(name: &str, namespace: &str, guaranteed: u32, burstable: u32, reclaim: &str) -> String {
    format!(
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: {name}\nspec:\n  namespaces: [{namespace}]\n  resources:\n    - {{name: nvidia.com/gpu, guaranteed: {guaranteed}, burstable: {burstable}}}\n  reclaim: {reclaim}\n"
    )
}

/// A Deployment of `replicas` one-GPU pods that ignore SIGTERM, so their (kubelet-like) node
/// ends them only when their grace period is over (and a relist after that).
fn stubborn_deployment(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n      annotations: {{{IGNORES_SIGTERM_ANNOTATION}: \"true\"}}\n    spec:\n      containers:\n        - name: trainer\n          image: trainer:latest\n          resources:\n            limits: {{nvidia.com/gpu: 1}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_whose_budget_cannot_hold_checkpoint_and_grace_is_refused_naming_the_fields() {
    let mut config = ControlPlaneConfig::new("budget_refused").with_nodes(Vec::new());
    config.controller_manager = false;
    let cluster = ControlPlane::start(config).await.unwrap();
    let client = cluster.client();
    install_crds(&client, &repo_root().join("crds"))
        .await
        .unwrap();

    // 1500ms of checkpoint and 1s of grace leave 500ms of a 3s budget for termination and
    // bind: accepted. The same in a 2s budget leaves nothing: refused, however it is written.
    let fits = "{budget: 3s, victimGracePeriodSeconds: 1, checkpoint: {driver: vllm, port: 8000, timeout: 1500ms}}";
    apply_queue(&client, &queue("fits", "fits", 1, 0, fits)).await;
    let tight = "{budget: 2s, victimGracePeriodSeconds: 1, checkpoint: {driver: vllm, port: 8000, timeout: 1500ms}}";
    for mode in [WriteMode::Apply, WriteMode::Create] {
        let refused = write_yaml(&client, &queue("tight", "tight", 1, 0, tight), None, mode)
            .await
            .expect_err("a budget of 2s cannot hold 1500ms + 1s");
        let status = refused.api_status().expect("refused by the API server");
        assert_eq!(status.code, 422, "{status:?}");
        for field in ["budget", "checkpoint.timeout", "victimGracePeriodSeconds"] {
            assert!(
                status.message.contains(field),
                "{field}: {}",
                status.message
            );
        }
    }
    let queues: Api<GpuQueue> = Api::all(client.clone());
    assert!(queues.get_opt("tight").await.unwrap().is_none());
}

/// Each pod's deletion as the API server stamped it: when the eviction was accepted
/// (`deletionTimestamp` minus `deletionGracePeriodSeconds`, Unix seconds), by pod name.
#[derive(Clone, Default)]
struct Evictions(Arc<Mutex<HashMap<String, i64>>>);

impl Evictions {
    /// Watches the namespace's pods until the test ends.
    fn watch(pods: Api<Pod>) -> Self {
        let evictions = Self::default();
        let seen = evictions.0.clone();
        tokio::spawn(async move {
            let mut stream = watcher(pods, watcher::Config::default())
                .touched_objects()
                .boxed();
            while let Ok(Some(pod)) = stream.try_next().await {
                let (Some(deleted), Some(grace)) = (
                    pod.metadata.deletion_timestamp.as_ref(),
                    pod.metadata.deletion_grace_period_seconds,
                ) else {
                    continue;
                };
                let accepted = deleted.0.as_second() - grace;
                let name = pod.metadata.name.clone().unwrap_or_default();
                seen.lock().unwrap().entry(name).or_insert(accepted);
            }
        });
        evictions
    }

    fn of(&self, name: &str) -> Option<i64> {
        self.0.lock().unwrap().get(name).copied()
    }
}

/// The first event with `reason` about `name`, once it exists.
async fn first_event(client: &Client, namespace: &str, name: &str, reason: &str) -> Event {
    wait_for(
        format!("event {reason} on {name}"),
        DEFAULT_TIMEOUT,
        || async {
            events(client, namespace, name, reason)
                .await
                .into_iter()
                .next()
                .ok_or_else(|| "no such event yet".to_owned())
        },
    )
    .await
    .unwrap()
}

/// The status, reason and message of the queue's ReclaimBudgetExceeded condition, once it
/// has `reason`.
async fn budget_condition(client: &Client, queue: &str, reason: &str) -> (String, String) {
    let queues: Api<GpuQueue> = Api::all(client.clone());
    let what = format!("queue {queue}: ReclaimBudgetExceeded with reason {reason}");
    wait_for(what, DEFAULT_TIMEOUT, || async {
        let found = queues.get(queue).await.map_err(|e| e.to_string())?;
        let condition = found.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == conditions::types::RECLAIM_BUDGET_EXCEEDED)
                .cloned()
        });
        match condition {
            Some(c) if c.reason == reason => Ok((c.status, c.message)),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_handover_will_overrun_is_told_so_before_the_eviction() {
    let cluster = ControlPlane::start(
        ControlPlaneConfig::new("budget_overrun")
            .with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", 2)]),
    )
    .await
    .unwrap();
    let client = cluster.client();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let operator = Operator::start(&cluster, Options::new("first", webhook_port)).await;
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    // The owner keeps the default 3s budget; the borrowers' queue gives its pods 10s to go
    // (with a budget of its own that holds that).
    apply_queue(&client, &queue("online", online.name(), 2, 0, "{}")).await;
    let slow = format!("{{budget: 15s, victimGracePeriodSeconds: {LONG_GRACE_SECONDS}}}");
    apply_queue(&client, &queue("batch", batch.name(), 0, 2, &slow)).await;
    let on_budget = budget_condition(&client, "online", conditions::reasons::WITHIN_BUDGET).await;
    assert_eq!(on_budget.0, "False");

    let borrowed: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    let evictions = Evictions::watch(borrowed.clone());
    apply_yaml(
        &client,
        &stubborn_deployment("trainer", 2),
        Some(batch.name()),
    )
    .await
    .unwrap();
    all_running(&borrowed, 2).await;

    let owners: Api<Pod> = Api::namespaced(client.clone(), online.name());
    create(&owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;

    // Told on the owner pod and its queue, with the numbers and what to change.
    let reason = conditions::reasons::OVERRUN_PLANNED;
    let told = first_event(&client, online.name(), "owner", reason).await;
    let note = told.message.clone().unwrap_or_default();
    for part in [
        "will overrun the budget 3s of queue online",
        &format!("victimGracePeriodSeconds {LONG_GRACE_SECONDS} of queue batch"),
        "raise spec.reclaim.budget of queue online",
    ] {
        assert!(note.contains(part), "{part}: {note}");
    }
    first_event(&client, "default", "online", reason).await;
    // The condition says so while the victim takes its grace to go.
    let (status, message) = budget_condition(&client, "online", reason).await;
    assert_eq!(status, "True", "{message}");
    let owner_key = format!("{}/owner", online.name());
    assert!(message.contains(&owner_key), "{message}");

    // Only then was the victim evicted (server-side times, whole seconds).
    let owner = bound(&owners, "owner").await;
    let victim = wait_for("the victim's eviction", DEFAULT_TIMEOUT, || async {
        let names: Vec<String> = evictions.0.lock().unwrap().keys().cloned().collect();
        match names.as_slice() {
            [one] => Ok(one.clone()),
            other => Err(format!("evicted: {other:?}")),
        }
    })
    .await
    .unwrap();
    let evicted = evictions.of(&victim).unwrap();
    let told_at = told.metadata.creation_timestamp.unwrap().0.as_second();
    assert!(
        told_at <= evicted,
        "the event ({told_at}) was written after the eviction of {victim} ({evicted})"
    );
    assert!(owner.spec.unwrap().node_name.is_some());

    // The handover overran: the condition now says the last one did, and the metric counts
    // the one plan.
    let (status, message) = budget_condition(
        &client,
        "online",
        conditions::reasons::LAST_HANDOVER_OVERRAN,
    )
    .await;
    assert_eq!(status, "True", "{message}");
    let series = r#"gpuqueue_reclaim_budget_overruns_planned_total{queue="online",kind="overrun"}"#;
    assert_eq!(operator.metric(series).await, Some(1.0));
}
