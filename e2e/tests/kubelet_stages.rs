#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The default node behaviour (`NodeBehaviour::Kubelet`, `e2e/stages/kubelet.yaml`) does what
//! the reclaim tests and the handover benchmark rely on: a pod is Running with its IP at once
//! and Ready later; a deleted pod stays Terminating while it has finalizers; a pod that
//! ignores SIGTERM is not removed before its deletionTimestamp.

use std::collections::BTreeMap;

use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, IGNORES_SIGTERM_ANNOTATION,
    READY_AFTER_ANNOTATION, describe_pod, gpu_pod, pod_condition, wait_for,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

async fn start(name: &str) -> ControlPlane {
    let cluster = ControlPlane::start(ControlPlaneConfig::new(name))
        .await
        .unwrap();
    eprintln!("{name}: control plane up ({})", cluster.startup_summary());
    cluster
}

fn annotated(mut pod: Pod, annotations: &[(&str, &str)]) -> Pod {
    pod.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
    );
    pod
}

fn is_running(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status.and_then(|s| s.pod_ip.as_ref()).is_some()
}

fn is_ready(pod: &Pod) -> bool {
    pod_condition(pod, "Ready").is_some_and(|c| c.status == "True")
}

async fn wait_running(pods: &Api<Pod>, name: &str) -> Pod {
    wait_for(
        format!("pod {name} to be Running with an IP"),
        DEFAULT_TIMEOUT,
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            if is_running(&pod) {
                Ok(pod)
            } else {
                Err(describe_pod(&pod))
            }
        },
    )
    .await
    .unwrap()
}

/// Sleeps until the wall clock (the API server's and KWOK's too: one machine) reaches `when`.
#[allow(clippy::disallowed_methods)] // the deadline is wall-clock time, written by the API server
async fn sleep_until(when: Timestamp) {
    let left = Timestamp::now().duration_until(when);
    tokio::time::sleep(left.try_into().unwrap_or_default()).await;
}

async fn wait_gone(pods: &Api<Pod>, name: &str) {
    wait_for(
        format!("pod {name} to be gone"),
        DEFAULT_TIMEOUT,
        || async {
            match pods.get_opt(name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(pod) => Err(describe_pod(&pod)),
            }
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_with_its_ip_at_once_and_becomes_ready_later() {
    let cluster = start("pod_runs_then_becomes_ready").await;
    let ns = cluster.namespace("ready-later").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), ns.name());
    let pod = annotated(
        gpu_pod("server", NVIDIA_GPU, 1),
        &[(READY_AFTER_ANNOTATION, "3s")],
    );
    pods.create(&PostParams::default(), &pod).await.unwrap();

    let running = wait_running(&pods, "server").await;
    assert!(
        !is_ready(&running),
        "Running comes before Ready: {}",
        describe_pod(&running)
    );
    let ready = wait_for("server to be Ready", DEFAULT_TIMEOUT, || async {
        let pod = pods.get("server").await.map_err(|e| e.to_string())?;
        if is_ready(&pod) {
            Ok(pod)
        } else {
            Err(describe_pod(&pod))
        }
    })
    .await
    .unwrap();
    assert_eq!(
        ready.status.as_ref().unwrap().pod_ip,
        running.status.as_ref().unwrap().pod_ip,
        "readiness keeps the pod's IP"
    );
    assert!(
        pod_condition(&ready, "PodScheduled").is_some_and(|c| c.status == "True"),
        "the kubelet's status patches keep the scheduler's condition: {}",
        describe_pod(&ready)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_with_a_finalizer_stays_terminating_until_it_is_removed() {
    let cluster = start("finalizer_holds_a_deleted_pod").await;
    let ns = cluster.namespace("finalizer").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), ns.name());
    let mut pod = gpu_pod("held", NVIDIA_GPU, 1);
    pod.metadata.finalizers = Some(vec!["e2e.gpuqueue.io/hold".to_owned()]);
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(1);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_running(&pods, "held").await;

    pods.delete("held", &DeleteParams::default()).await.unwrap();
    let deleting = pods.get("held").await.unwrap();
    let deadline = deleting.metadata.deletion_timestamp.clone().unwrap().0;
    // Past the grace period a pod without finalizers would be gone; this one must not be.
    sleep_until(deadline + std::time::Duration::from_secs(2)).await;
    let still = pods.get_opt("held").await.unwrap();
    assert!(
        still.is_some(),
        "a pod with a finalizer stays until the finalizer is removed"
    );

    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_gone(&pods, "held").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_ignores_sigterm_is_removed_at_its_deletion_timestamp_not_before() {
    let cluster = start("pod_ignoring_sigterm").await;
    let ns = cluster.namespace("sigterm").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), ns.name());
    let mut pod = annotated(
        gpu_pod("stubborn", NVIDIA_GPU, 1),
        &[(IGNORES_SIGTERM_ANNOTATION, "true")],
    );
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(3);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_running(&pods, "stubborn").await;

    pods.delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = pods
        .get("stubborn")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .unwrap()
        .0;
    // Same machine, same clock: the pod is seen gone no earlier than its deletionTimestamp
    // (2-3 s away: the API server writes it in whole seconds). A stalled test only sees it
    // later, so a slow machine cannot fail this; a pod removed early is seen early.
    wait_gone(&pods, "stubborn").await;
    #[allow(clippy::disallowed_methods)] // compared with a wall-clock time the API server wrote
    let seen_gone = Timestamp::now();
    assert!(
        seen_gone >= deadline,
        "a pod ignoring SIGTERM is Terminating until its grace period ends: gone at {seen_gone}, deadline {deadline}"
    );
}
