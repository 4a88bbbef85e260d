//! One real kubelet node (issue 14, item 6): `e2e/kubelet/real-node.sh` runs containerd, runc,
//! kubelet v1.36.3 and our fake device plugin on this machine and joins them to a cluster of
//! the benchmark's own. Borrowers and owners run the fake vLLM as containers there, so a victim
//! gets a real SIGTERM and grace period, the kubelet's device manager frees its GPU, and the
//! owner's container is started: the single handovers of the KWOK part, on that node.

use std::path::{Path, PathBuf};

use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    ControlPlane, describe_pod, pod_condition, repo_root, wait_for, without_crate_env,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;

use super::{CHECKPOINT, VLLM_PORT, WAIT};

/// The GPUs the real node's device plugin advertises.
pub const GPUS: usize = 8;
/// The label `real-node.sh` gives the node, which its pods select.
const NODE_LABEL: &str = "gpuqueue.io/real-node";
/// The fake vLLM's image, built offline and imported into the node's containerd.
const IMAGE: &str = "localhost/gpuqueue/fake-vllm:offline";

/// The node, stopped (`real-node.sh down`) when dropped; drop it before its cluster.
pub struct RealNode {
    run_dir: PathBuf,
    /// Where the node's logs are copied before `down` removes its state.
    log_dir: PathBuf,
}

fn script() -> PathBuf {
    repo_root().join("e2e/kubelet/real-node.sh")
}

impl RealNode {
    /// Starts the node on `cluster` and returns once it is Ready with [`GPUS`] GPUs; its
    /// kubelet with the Evented PLEG if `evented_pleg`.
    pub async fn up(cluster: &ControlPlane, evented_pleg: bool) -> Self {
        let node = Self {
            run_dir: cluster.run_dir().join("real-node"),
            log_dir: cluster.log_dir().join("real-node"),
        };
        let mut up = std::process::Command::new(script());
        without_crate_env(&mut up);
        let status = tokio::process::Command::from(up)
            .arg("up")
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path())
            .arg("--run-dir")
            .arg(&node.run_dir)
            .arg("--gpus")
            .arg(GPUS.to_string())
            .args(evented_pleg.then_some("--evented-pleg"))
            .status()
            .await
            .unwrap();
        assert!(
            status.success(),
            "e2e/kubelet/real-node.sh up failed ({status}): it runs as root and needs \
             `apt-get install -y containerd runc buildah gcc`; its logs are in {}",
            node.log_dir.display()
        );
        node
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        copy_logs(&self.run_dir.join("logs"), &self.log_dir);
        let stopped = std::process::Command::new(script())
            .arg("down")
            .arg("--run-dir")
            .arg(&self.run_dir)
            .status();
        if !matches!(stopped, Ok(status) if status.success()) {
            eprintln!(
                "stopping the real node failed ({stopped:?}): run `{} down --run-dir {}`",
                script().display(),
                self.run_dir.display()
            );
        }
    }
}

/// The node's logs (containerd, kubelet, device plugin), kept after `down` for a reader.
fn copy_logs(from: &Path, to: &Path) {
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    let _ = std::fs::create_dir_all(to);
    for entry in entries.flatten() {
        let _ = std::fs::copy(entry.path(), to.join(entry.file_name()));
    }
}

/// A one-GPU fake vLLM on the real node, its `POST /pause` taking [`CHECKPOINT`], Ready once
/// it answers `/health`.
pub fn vllm_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {NODE_LABEL: "true"},
            "dnsPolicy": "Default",
            "containers": [{
                "name": "vllm",
                "image": IMAGE,
                "imagePullPolicy": "Never",
                // --dev-mode: VLLM_SERVER_DEV_MODE=1, without which vLLM offers no POST /pause.
                "args": ["--listen", format!("0.0.0.0:{VLLM_PORT}"), "--dev-mode",
                         "--pause-latency", format!("{}ms", CHECKPOINT.as_millis())],
                "resources": {"limits": {NVIDIA_GPU: 1}},
                "readinessProbe": {"httpGet": {"path": "/health", "port": VLLM_PORT},
                                   "periodSeconds": 1},
            }],
        },
    }))
    .unwrap()
}

/// Waits until the pod's container answers its readiness probe.
pub async fn ready(pods: &Api<Pod>, name: &str) {
    wait_for(format!("pod {name} Ready"), WAIT, || async {
        let pod = pods.get(name).await.map_err(|e| e.to_string())?;
        if pod_condition(&pod, "Ready").is_some_and(|c| c.status == "True") {
            Ok(())
        } else {
            Err(describe_pod(&pod))
        }
    })
    .await
    .unwrap();
}
