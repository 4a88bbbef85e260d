#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! Proof that the control plane is real: kube-scheduler binds GPU pods to KWOK nodes and
//! explains why it cannot, scheduling gates hold pods, and the Eviction API honours
//! PodDisruptionBudgets. Each test starts its own control plane.

use std::net::{Ipv4Addr, SocketAddr};

use gpuqueue_api::{ADMISSION_GATE, NVIDIA_GPU};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, MIG_3G_40GB, bound_pod, describe_pod,
    gpu_pod, node_of, pod_condition, wait_for,
};
use k8s_openapi::api::core::v1::{Event, Pod, PodSchedulingGate};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, EvictParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

async fn start(name: &str) -> ControlPlane {
    let cluster = ControlPlane::start(ControlPlaneConfig::new(name))
        .await
        .unwrap();
    eprintln!("{name}: control plane up ({})", cluster.startup_summary());
    cluster
}

async fn running_pod(pods: &Api<Pod>, name: &str) -> Pod {
    wait_for(
        format!("pod {name} to be Running with an IP"),
        DEFAULT_TIMEOUT,
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            let status = pod.status.as_ref();
            let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
            if running && status.and_then(|s| s.pod_ip.as_ref()).is_some() {
                Ok(pod)
            } else {
                Err(describe_pod(&pod))
            }
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_pod_is_bound_by_kube_scheduler_and_reachable_on_its_loopback_ip() {
    let cluster = start("gpu_pod_is_bound").await;
    let ns = cluster.namespace("gpu-pod").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), ns.name());
    pods.create(&PostParams::default(), &gpu_pod("server", NVIDIA_GPU, 2))
        .await
        .unwrap();

    let pod = running_pod(&pods, "server").await;
    let node = node_of(&pod).unwrap().to_owned();
    assert!(
        node.starts_with("gpu-node-"),
        "a 2-GPU pod fits only a whole-GPU node, got {node}"
    );
    let ip: Ipv4Addr = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_ref())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        ip.octets()[..2],
        [127, 100],
        "pod IP {ip} is outside 127.100.0.0/16"
    );

    // kube-scheduler itself bound it (not KWOK, not the test).
    let events: Api<Event> = Api::namespaced(cluster.client(), ns.name());
    let scheduled = wait_for(
        "the scheduler's Scheduled event",
        DEFAULT_TIMEOUT,
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("Scheduled"))
                .ok_or_else(|| "no Scheduled event yet".to_owned())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        scheduled.reporting_component.as_deref(),
        Some("default-scheduler")
    );
    assert!(
        scheduled
            .message
            .as_deref()
            .unwrap_or_default()
            .contains(&node),
        "{:?}",
        scheduled.message
    );

    // A server bound to the pod's IP is what a checkpoint call will reach.
    let listener = tokio::net::TcpListener::bind(SocketAddr::from((ip, 8000)))
        .await
        .unwrap();
    let app = axum::Router::new().route(
        "/ping",
        axum::routing::get(|| async { "pong from the pod's IP" }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let body = reqwest::get(format!("http://{ip}:8000/ping"))
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "pong from the pod's IP");
    server.abort();

    // A MIG slice is a resource of its own, which only the MIG node has.
    pods.create(&PostParams::default(), &gpu_pod("slice", MIG_3G_40GB, 1))
        .await
        .unwrap();
    let slice = running_pod(&pods, "slice").await;
    assert_eq!(
        slice.spec.and_then(|s| s.node_name).as_deref(),
        Some("mig-node-0")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_wanting_more_gpus_than_any_node_stays_pending_with_the_schedulers_reason() {
    let cluster = start("too_big_pod_stays_pending").await;
    let ns = cluster.namespace("too-big").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), ns.name());
    pods.create(&PostParams::default(), &gpu_pod("huge", NVIDIA_GPU, 9))
        .await
        .unwrap();

    let pod = wait_for(
        "kube-scheduler to mark pod huge Unschedulable",
        DEFAULT_TIMEOUT,
        || async {
            let pod = pods.get("huge").await.map_err(|e| e.to_string())?;
            match pod_condition(&pod, "PodScheduled") {
                Some(c) if c.status == "False" && c.reason.as_deref() == Some("Unschedulable") => {
                    Ok(pod)
                }
                _ => Err(describe_pod(&pod)),
            }
        },
    )
    .await
    .unwrap();
    let message = pod_condition(&pod, "PodScheduled")
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains("Insufficient nvidia.com/gpu"), "{message}");
    assert!(message.starts_with("0/5 nodes are available"), "{message}");
    assert_eq!(pod.spec.and_then(|s| s.node_name), None);
    assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_pod_waits_for_its_gate_and_takes_a_node_selector_meanwhile() {
    let cluster = start("gated_pod_waits").await;
    let ns = cluster.namespace("gated").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), ns.name());
    let mut gated = gpu_pod("gated", NVIDIA_GPU, 1);
    gated.spec.as_mut().unwrap().scheduling_gates = Some(vec![PodSchedulingGate {
        name: ADMISSION_GATE.to_owned(),
    }]);
    pods.create(&PostParams::default(), &gated).await.unwrap();
    pods.create(&PostParams::default(), &gpu_pod("ungated", NVIDIA_GPU, 1))
        .await
        .unwrap();

    // The ungated twin, created after it, is bound: the scheduler has seen both and skipped the
    // gated one (no fixed sleep needed to show that it "stays" unscheduled).
    bound_pod(&pods, "ungated").await.unwrap();
    let pod = pods.get("gated").await.unwrap();
    assert_eq!(node_of(&pod), None, "{}", describe_pod(&pod));
    let scheduled = pod_condition(&pod, "PodScheduled").unwrap();
    assert_eq!(
        (scheduled.status.as_str(), scheduled.reason.as_deref()),
        ("False", Some("SchedulingGated"))
    );

    // While gated, placement can still be narrowed: this is how admission picks the node.
    let pin = json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu-node-2"}}});
    pods.patch("gated", &PatchParams::default(), &Patch::Merge(&pin))
        .await
        .unwrap();
    // Once a pod is scheduled its node selector is fixed; the API server says so.
    let refused = pods
        .patch("ungated", &PatchParams::default(), &Patch::Merge(&pin))
        .await
        .unwrap_err();
    match refused {
        kube::Error::Api(status) => assert_eq!(status.code, 422, "{status:?}"),
        other => panic!("expected 422 Invalid, got {other}"),
    }

    let ungate = json!({"spec": {"schedulingGates": []}});
    pods.patch("gated", &PatchParams::default(), &Patch::Merge(&ungate))
        .await
        .unwrap();
    let pod = bound_pod(&pods, "gated").await.unwrap();
    assert_eq!(
        pod.spec.and_then(|s| s.node_name).as_deref(),
        Some("gpu-node-2")
    );
}

/// A budget that keeps at least one pod labelled `app=<app>` running.
fn keep_one(app: &str) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(format!("keep-{app}")),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_owned(), app.to_owned())].into()),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

/// Waits until the disruption controller has counted the one healthy pod and allows `want`.
async fn disruptions_allowed(budgets: &Api<PodDisruptionBudget>, want: i32) {
    wait_for(
        format!("the disruption controller to allow {want} disruptions"),
        DEFAULT_TIMEOUT,
        || async {
            let status = budgets
                .get("keep-victim")
                .await
                .map_err(|e| e.to_string())?
                .status;
            match status {
                Some(s) if s.current_healthy == Some(1) && s.disruptions_allowed == Some(want) => {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_api_evicts_a_kwok_pod_unless_a_disruption_budget_forbids_it() {
    let cluster = start("eviction_honours_pdb").await;
    let ns = cluster.namespace("eviction").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), ns.name());
    pods.create(&PostParams::default(), &gpu_pod("victim", NVIDIA_GPU, 1))
        .await
        .unwrap();
    running_pod(&pods, "victim").await;

    let budgets: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), ns.name());
    budgets
        .create(&PostParams::default(), &keep_one("victim"))
        .await
        .unwrap();
    disruptions_allowed(&budgets, 0).await;

    let refused = pods
        .evict("victim", &EvictParams::default())
        .await
        .unwrap_err();
    match refused {
        kube::Error::Api(status) => {
            assert_eq!(
                (status.code, status.reason.as_str()),
                (429, "TooManyRequests"),
                "{status:?}"
            );
            assert!(
                status.message.contains("disruption budget"),
                "{}",
                status.message
            );
        }
        other => panic!("expected 429 from the Eviction API, got {other}"),
    }
    assert!(
        pods.get("victim")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );

    let relax = json!({"spec": {"minAvailable": 0}});
    budgets
        .patch(
            "keep-victim",
            &PatchParams::default(),
            &Patch::Merge(&relax),
        )
        .await
        .unwrap();
    disruptions_allowed(&budgets, 1).await;
    pods.evict("victim", &EvictParams::default()).await.unwrap();
    wait_for(
        "KWOK to delete the evicted pod",
        DEFAULT_TIMEOUT,
        || async {
            match pods.get_opt("victim").await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(pod) => Err(describe_pod(&pod)),
            }
        },
    )
    .await
    .unwrap();
}
