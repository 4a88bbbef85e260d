#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! `kubectl-gpuqueue simulate --from-cluster` against a real API server: it reads the live
//! nodes and GpuQueues (the current kubeconfig context), simulates a scenario's load on them,
//! and with `--queue` compares a proposed quota change, without writing to the cluster.

mod common;

use std::process::Command;

use gpuqueue_api::v1alpha1::GpuQueue;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, GpuNode, apply_file, install_crds, repo_root,
};
use kube::api::{Api, ListParams};

const QUEUES: &str = "\
apiVersion: gpuqueue.io/v1alpha1
kind: GpuQueue
metadata: {name: serving}
spec:
  namespaces: [serving]
  resources: [{name: nvidia.com/gpu, guaranteed: 12, burstable: 4}]
---
apiVersion: gpuqueue.io/v1alpha1
kind: GpuQueue
metadata: {name: batch}
spec:
  namespaces: [batch]
  resources: [{name: nvidia.com/gpu, guaranteed: 4, burstable: 12}]
";

const PROPOSED: &str = "\
apiVersion: gpuqueue.io/v1alpha1
kind: GpuQueue
metadata: {name: batch}
spec:
  namespaces: [batch]
  resources: [{name: nvidia.com/gpu, guaranteed: 4, burstable: 0}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_reads_the_live_nodes_and_queues_and_compares_a_proposal() {
    let nodes = vec![
        GpuNode::whole_gpus("gpu-a", 8),
        GpuNode::whole_gpus("gpu-b", 8),
        GpuNode::mig("mig-a"),
    ];
    let mut config = ControlPlaneConfig::new("simulate_from_cluster").with_nodes(nodes);
    config.controller_manager = false;
    let cluster = ControlPlane::start(config).await.unwrap();
    let client = cluster.client();
    install_crds(&client, &repo_root().join("crds"))
        .await
        .unwrap();
    let dir = cluster.run_dir().join("simulate");
    std::fs::create_dir_all(&dir).unwrap();
    let queues = dir.join("queues.yaml");
    std::fs::write(&queues, QUEUES).unwrap();
    apply_file(&client, &queues, None).await.unwrap();
    let proposed = dir.join("proposed.yaml");
    std::fs::write(&proposed, PROPOSED).unwrap();
    let before = Api::<GpuQueue>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();

    let binary = common::cli_binaries().join("kubectl-gpuqueue");
    let scenario = repo_root().join("examples/sim/quickstart.yaml");
    let run = |out: &str, extra: &[&str]| {
        let output = common::run_ok(
            Command::new(&binary)
                .args(["simulate", "--from-cluster", "--no-progress", "--scenario"])
                .arg(&scenario)
                .arg("--out")
                .arg(dir.join(out))
                .args(extra)
                .env("KUBECONFIG", cluster.kubeconfig_path()),
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };

    let stdout = run("study", &[]);
    assert!(stdout.contains("| borrow-and-reclaim"), "{stdout}");
    let report = std::fs::read_to_string(dir.join("study/quota-quickstart.md")).unwrap();
    // The two whole-GPU nodes; the MIG node's slices are another resource's capacity.
    assert!(
        report.contains("2 tenants on 2 nodes (16 GPUs)"),
        "{report}"
    );
    let serving = report
        .lines()
        .find(|l| l.starts_with("| serving "))
        .unwrap();
    let cells: Vec<&str> = serving.split('|').map(str::trim).collect();
    assert_eq!(
        (cells[2], cells[3]),
        ("12", "4"),
        "the live queue's quota, not the scenario's: {serving}"
    );

    let stdout = run("proposal", &["--queue", proposed.to_str().unwrap()]);
    assert!(
        stdout.contains("| current quotas") && stdout.contains("| proposed quotas"),
        "{stdout}"
    );
    assert!(stdout.contains("The proposed quotas give"), "{stdout}");

    let after = Api::<GpuQueue>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap();
    let specs = |list: &kube::api::ObjectList<GpuQueue>| {
        list.items
            .iter()
            .map(|q| q.spec.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        specs(&before),
        specs(&after),
        "simulating writes nothing to the cluster"
    );
    cluster.stop();
}
