#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The default node behaviour (`NodeBehaviour::Kubelet`, `e2e/stages/kubelet.yaml`) does what
//! the reclaim tests and the handover benchmark rely on: a pod is Running with its IP at once
//! and Ready later; a deleted pod's containers end no sooner than a kubelet's relist would
//! see it (a pod that ignores SIGTERM: than its whole grace period and a relist), its phase
//! turns terminal before its object goes; a deleted pod's finalizers keep its object, not its
//! containers; a pod that never ends stays running until it is deleted with grace 0.

use std::collections::BTreeMap;

use futures::StreamExt;
use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, IGNORES_SIGTERM_ANNOTATION, KubeletTiming,
    NEVER_ENDS_ANNOTATION, READY_AFTER_ANNOTATION, TempNamespace, describe_pod, gpu_pod,
    has_finished, pod_condition, wait_for,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
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

/// A control plane of its own, named `cluster`, running `pod` in a namespace of its own.
async fn running(cluster: &str, pod: &Pod) -> (ControlPlane, TempNamespace, Api<Pod>) {
    let cluster = start(cluster).await;
    let namespace = cluster.namespace("stages").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), namespace.name());
    pods.create(&PostParams::default(), pod).await.unwrap();
    wait_running(&pods, pod.metadata.name.as_deref().unwrap()).await;
    (cluster, namespace, pods)
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
async fn a_deleted_pod_with_a_finalizer_ends_but_stays_until_it_is_removed() {
    let mut pod = gpu_pod("held", NVIDIA_GPU, 1);
    pod.metadata.finalizers = Some(vec!["e2e.gpuqueue.io/hold".to_owned()]);
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(1);
    let (_cluster, _namespace, pods) = running("finalizer_holds_a_deleted_pod", &pod).await;

    pods.delete("held", &DeleteParams::default()).await.unwrap();
    let deleting = pods.get("held").await.unwrap();
    let deadline = deleting.metadata.deletion_timestamp.clone().unwrap().0;
    // By then a pod without finalizers would be gone (its exit seen within two relists of
    // the deletion, its object removed 750 ms after that at the latest); this one has ended,
    // as a kubelet ends it, but its object must stay.
    sleep_until(deadline + std::time::Duration::from_secs(3)).await;
    let still = pods.get_opt("held").await.unwrap();
    assert!(
        still.as_ref().is_some_and(has_finished),
        "a pod with a finalizer ends and stays until the finalizer is removed: {still:?}"
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

/// What a watch saw of one pod from its deletion on: each version (`None`: gone), with when
/// this process saw it.
struct Deletion {
    sent: Timestamp,
    seen: Vec<(Timestamp, Option<Pod>)>,
}

impl Deletion {
    /// Deletes `name` with a watch on it already running, and watches until it is gone.
    #[allow(clippy::disallowed_methods)] // compared with each other, on this process's clock
    async fn watch(pods: &Api<Pod>, name: &str) -> Self {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut stream = watcher::watcher(pods.clone(), config).boxed();
        while !matches!(stream.next().await, Some(Ok(Event::InitDone))) {}
        let sent = Timestamp::now();
        pods.delete(name, &DeleteParams::default()).await.unwrap();
        let mut seen = Vec::new();
        let until_gone = async {
            while let Some(event) = stream.next().await {
                match event.unwrap() {
                    Event::Apply(pod) => seen.push((Timestamp::now(), Some(pod))),
                    Event::Delete(_) => {
                        seen.push((Timestamp::now(), None));
                        return;
                    }
                    _ => {}
                }
            }
        };
        tokio::time::timeout(DEFAULT_TIMEOUT, until_gone)
            .await
            .unwrap_or_else(|_| panic!("{name} not gone within {DEFAULT_TIMEOUT:?}"));
        Self { sent, seen }
    }

    /// The first version seen with a terminal phase, and when; it must come before the pod is
    /// gone, and no version after it may run again.
    fn terminal(&self) -> (Timestamp, &Pod) {
        let terminal = has_finished;
        let first = self
            .seen
            .iter()
            .position(|(_, pod)| pod.as_ref().is_none_or(terminal))
            .unwrap();
        let (at, Some(pod)) = &self.seen[first] else {
            panic!("gone before its phase was terminal: {:?}", self.phases());
        };
        assert!(
            self.seen[first..]
                .iter()
                .all(|(_, pod)| pod.as_ref().is_none_or(terminal)),
            "a terminal pod ran again: {:?}",
            self.phases()
        );
        (*at, pod)
    }

    fn phases(&self) -> Vec<Option<String>> {
        self.seen
            .iter()
            .map(|(_, pod)| pod.as_ref().and_then(|p| p.status.as_ref()?.phase.clone()))
            .collect()
    }
}

/// How the pod ended: its phase and its container's exit code.
fn ending(pod: &Pod) -> (Option<&str>, i32) {
    let status = pod.status.as_ref().unwrap();
    let statuses = status.container_statuses.as_ref();
    let state = statuses.unwrap()[0].state.as_ref().unwrap();
    let code = state.terminated.as_ref().unwrap().exit_code;
    (status.phase.as_deref(), code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_ends_no_sooner_than_a_relist_and_is_terminal_before_it_goes() {
    let mut pod = gpu_pod("cooperative", NVIDIA_GPU, 1);
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(1);
    let (_cluster, _namespace, pods) = running("pod_ends_after_a_relist", &pod).await;

    let deletion = Deletion::watch(&pods, "cooperative").await;
    let (ended, pod) = deletion.terminal();
    // The delete was sent before the node could see it: a stalled test only sees the end
    // later, so a slow machine cannot fail this; a pod that ends early is seen early.
    let relist = KubeletTiming::default().relist;
    assert!(
        ended >= deletion.sent + relist,
        "its exit is seen at a relist after the kill, which starts at one: ended {ended}, deleted {}",
        deletion.sent
    );
    assert_eq!(ending(pod), (Some("Succeeded"), 0), "{}", describe_pod(pod));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_ignores_sigterm_ends_no_sooner_than_its_grace_period_and_a_relist() {
    let mut pod = annotated(
        gpu_pod("stubborn", NVIDIA_GPU, 1),
        &[(IGNORES_SIGTERM_ANNOTATION, "true")],
    );
    let grace = 2;
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(grace);
    let (_cluster, _namespace, pods) = running("pod_ignoring_sigterm", &pod).await;

    let deletion = Deletion::watch(&pods, "stubborn").await;
    let (ended, pod) = deletion.terminal();
    // As above, a slow machine only makes the end seen later.
    let relist = KubeletTiming::default().relist;
    let sigkill = std::time::Duration::from_secs(grace.unsigned_abs()) + relist;
    assert!(
        ended >= deletion.sent + sigkill,
        "a pod ignoring SIGTERM runs until SIGKILL, its end seen at the relist after: ended {ended}, deleted {}",
        deletion.sent
    );
    assert_eq!(ending(pod), (Some("Failed"), 137), "{}", describe_pod(pod));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_never_ends_runs_on_until_it_is_deleted_at_once() {
    let mut pod = annotated(
        gpu_pod("orphan", NVIDIA_GPU, 1),
        &[(NEVER_ENDS_ANNOTATION, "true")],
    );
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(1);
    let (_cluster, _namespace, pods) = running("pod_never_ends", &pod).await;

    pods.delete("orphan", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = pods
        .get("orphan")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .unwrap()
        .0;
    // Past the longest a pod that ends takes (two relists and its grace), it still runs.
    sleep_until(deadline + std::time::Duration::from_secs(3)).await;
    let still = pods.get("orphan").await.unwrap();
    assert!(!has_finished(&still), "{}", describe_pod(&still));

    pods.delete("orphan", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_gone(&pods, "orphan").await;
}
