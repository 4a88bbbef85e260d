#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! `kubectl gpuqueue top` as a user types it, on a real control plane where the real
//! `gpuqueue-operator` admits pods: known pods on known nodes, and the numbers top shows for
//! them (allocated, free, fragmented by the core's measure, who holds what), which agree with
//! the fragmentation the operator exports.

mod common;

use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, TempNamespace, gpu_pod, wait_for,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

/// `kubectl gpuqueue top <args>` with the plugin's folder first on the PATH.
fn top(cluster: &ControlPlane, args: &[&str]) -> String {
    let output = common::run_ok(
        common::kubectl_with_plugin(cluster)
            .args(["gpuqueue", "top"])
            .args(args),
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The node the pod was bound to.
fn bound_node(pod: &Pod) -> String {
    gpuqueue_e2e::node_of(pod).unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_each_nodes_allocation_fragmentation_and_holders() {
    // Built before the cluster starts, so that its clock does not run meanwhile.
    common::cli_binaries();
    let mut config = ControlPlaneConfig::new("cli_top").with_nodes(vec![
        GpuNode::whole_gpus("gpu-a", 4),
        GpuNode::whole_gpus("gpu-b", 4),
        GpuNode::mig("mig-0"),
    ]);
    // Pods are created directly and nothing is deleted: no controllers needed.
    config.controller_manager = false;
    let cluster = ControlPlane::start(config).await.unwrap();
    let client = cluster.client();
    let webhook_port = common::free_port();
    common::install(&cluster, webhook_port).await;
    let batch = cluster.namespace("batch").await.unwrap();
    let web = cluster.namespace("web").await.unwrap();
    common::apply_queue(&client, &common::queue_yaml("batch", &[batch.name()], 8, 4)).await;
    let operator =
        common::Operator::start(&cluster, common::Options::new("top-e2e", webhook_port)).await;

    let (full, shared) = create_pods(&cluster, &batch, &web).await;

    check_json(&cluster, &full, &shared);

    // The same, for people.
    let text = top(&cluster, &[]);
    let cells = |name: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name} in\n{text}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        cells(&shared)[2..],
        [
            "nvidia.com/gpu",
            "4",
            "2",
            "2",
            "1",
            "(no",
            "queue)",
            "1,",
            "batch",
            "1"
        ],
        "{text}"
    );
    assert!(
        text.contains("Cluster: 6 of 17 GPUs allocated (35%), 11 free, 10 fragmented (91% of free); 1 GPU pod waits at the gate\n"),
        "{text}"
    );

    // The operator measures the same: the core's one measure, read by both.
    let series = format!("gpuqueue_node_fragmented_gpus{{node=\"{shared}\"}}");
    wait_for(
        "the operator's fragmentation gauge",
        DEFAULT_TIMEOUT,
        || async {
            match operator.metric(&series).await {
                Some(v) if (v - 1.0).abs() < 1e-9 => Ok(()),
                other => Err(format!("{series} = {other:?}")),
            }
        },
    )
    .await
    .unwrap();
    cluster.stop();
}

/// batch fills one node with a 4-GPU pod; a pod no queue claims and a 1-GPU batch pod share
/// the other, the only one with room; a second 4-GPU pod finds none and waits. Returns the
/// full node and the shared one.
async fn create_pods(
    cluster: &ControlPlane,
    batch: &TempNamespace,
    web: &TempNamespace,
) -> (String, String) {
    let client = cluster.client();
    let batch_pods: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    let web_pods: Api<Pod> = Api::namespaced(client.clone(), web.name());
    common::create(&batch_pods, &gpu_pod("train", "nvidia.com/gpu", 4)).await;
    let full = bound_node(&common::bound(&batch_pods, "train").await);
    common::create(&web_pods, &gpu_pod("render", "nvidia.com/gpu", 1)).await;
    let shared = bound_node(&common::bound(&web_pods, "render").await);
    common::create(&batch_pods, &gpu_pod("serve", "nvidia.com/gpu", 1)).await;
    assert_eq!(
        bound_node(&common::bound(&batch_pods, "serve").await),
        shared
    );
    assert_ne!(full, shared);
    common::create(&batch_pods, &gpu_pod("train-2", "nvidia.com/gpu", 4)).await;
    common::waiting_reason(&batch_pods, "train-2").await;

    (full, shared)
}

/// `-o json`: the numbers, node by node, and the cluster's.
fn check_json(cluster: &ControlPlane, full: &str, shared: &str) {
    // The mix is two 1-GPU and two 4-GPU pods: the shared node's 2 free GPUs serve half of it
    // (1 GPU fragmented); no pod asks for a MIG instance, so all 9 of mig-0's are.
    let report: serde_json::Value = serde_json::from_str(&top(cluster, &["-o", "json"])).unwrap();
    let node = |name: &str| {
        report["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {report}"))
            .clone()
    };
    let row = |name: &str| {
        let n = node(name);
        let p = &n["pools"][0];
        (
            p["allocatable"].as_u64().unwrap(),
            p["allocatedGpus"].as_f64().unwrap(),
            p["freeGpus"].as_f64().unwrap(),
            n["fragmentedGpus"].as_f64().unwrap(),
            p["holders"].clone(),
        )
    };
    assert_eq!(
        row(full),
        (
            4,
            4.0,
            0.0,
            0.0,
            serde_json::json!([{"queue": "batch", "gpus": 4.0}])
        )
    );
    assert_eq!(
        row(shared),
        (
            4,
            2.0,
            2.0,
            1.0,
            serde_json::json!([{"queue": "(no queue)", "gpus": 1.0}, {"queue": "batch", "gpus": 1.0}])
        )
    );
    let mig = node("mig-0");
    assert_eq!(mig["fragmentedGpus"], 9.0);
    assert_eq!(
        mig["pools"],
        serde_json::json!([
            {"resource": "nvidia.com/mig-1g.10gb", "allocatable": 7, "allocatedGpus": 0.0, "freeGpus": 7.0, "holders": []},
            {"resource": "nvidia.com/mig-3g.40gb", "allocatable": 2, "allocatedGpus": 0.0, "freeGpus": 2.0, "holders": []},
        ])
    );
    assert_eq!(mig["gpuModel"], node(full)["gpuModel"], "{report}");
    let cluster_line = &report["cluster"];
    assert_eq!(cluster_line["capacityGpus"], 17.0);
    assert_eq!(cluster_line["allocatedGpus"], 6.0);
    assert_eq!(cluster_line["fragmentedGpus"], 10.0);
    assert_eq!(cluster_line["waitingPods"], 1);
}
