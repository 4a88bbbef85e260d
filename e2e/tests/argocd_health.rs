#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The Argo CD health check of a GpuQueue (`config/argocd/gpuqueue.io/GpuQueue/health.lua`),
//! run in gopher-lua set up as Argo CD sets it up (`e2e/tools/argocd-lua`): on the sample
//! statuses of its `health_test.yaml`, and on the statuses a real operator writes: Healthy for
//! a queue it admits for, Degraded for two queues claiming one namespace.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use gpuqueue_api::v1alpha1::GpuQueue;
use gpuqueue_e2e::{ControlPlane, ControlPlaneConfig, bin_dir, repo_root};
use kube::Api;

use common::{
    Operator, Options, apply_queue, condition, free_port, install, queue_status, queue_yaml,
};

const HEALTH_CHECK: &str = "config/argocd/gpuqueue.io/GpuQueue";

fn interpreter() -> Command {
    let binary = bin_dir().unwrap().join("gpuqueue-argocd-lua");
    assert!(
        binary.exists(),
        "{} is missing: run e2e/scripts/build-tools.sh",
        binary.display()
    );
    let mut command = Command::new(binary);
    command.current_dir(repo_root());
    command
}

#[test]
fn the_health_check_gives_each_sample_status_its_argo_cd_health() {
    let output = interpreter().args(["test", HEALTH_CHECK]).output().unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("7 passed, 0 failed"), "{report}");
}

/// The health Argo CD would show for this queue as the API server returns it.
fn health(dir: &Path, queue: &GpuQueue) -> serde_json::Value {
    let name = queue.metadata.name.clone().unwrap();
    let file: PathBuf = dir.join(format!("{name}.json"));
    std::fs::write(&file, serde_json::to_vec(queue).unwrap()).unwrap();
    let output = interpreter()
        .args(["health", &format!("{HEALTH_CHECK}/health.lua")])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_check_reads_the_status_a_real_operator_writes() {
    let cluster = ControlPlane::start(ControlPlaneConfig::new("argocd_health"))
        .await
        .unwrap();
    let client = cluster.client();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let _operator = Operator::start(&cluster, Options::new("only", webhook_port)).await;

    apply_queue(&client, &queue_yaml("alone", &["alone"], 8, 0)).await;
    let alone = queue_status(&client, "alone", "Ready", |q| {
        condition(q, "Ready").is_some_and(|(status, _)| status == "True")
    })
    .await;
    let healthy = health(cluster.run_dir(), &alone);
    assert_eq!(healthy["status"], "Healthy", "{healthy}");

    apply_queue(&client, &queue_yaml("first", &["shared"], 4, 0)).await;
    apply_queue(&client, &queue_yaml("second", &["shared"], 4, 0)).await;
    let conflicted = queue_status(&client, "second", "NamespaceConflict", |q| {
        condition(q, "NamespaceConflict").is_some_and(|(status, _)| status == "True")
    })
    .await;
    let degraded = health(cluster.run_dir(), &conflicted);
    assert_eq!(degraded["status"], "Degraded", "{degraded}");
    assert!(
        degraded["message"].as_str().unwrap().contains("shared"),
        "{degraded}"
    );

    // A queue the operator has not reported on yet (no status) is Progressing.
    let queues: Api<GpuQueue> = Api::all(client.clone());
    let mut fresh = queues.get("alone").await.unwrap();
    fresh.status = None;
    let progressing = health(cluster.run_dir(), &fresh);
    assert_eq!(progressing["status"], "Progressing", "{progressing}");
}
