#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! `make cluster-up`, `eval "$(make -s cluster-env)"` and `make cluster-down` as the README has
//! a user type them: the cluster outlives `up`, the shell that evaluates `env` has the cluster's
//! `kubectl` and the `kubectl gpuqueue` plugin, and `down` stops exactly its processes.

use std::path::Path;
use std::process::{Command, Output};

use gpuqueue_e2e::{repo_root, without_crate_env};

const CLI: &str = env!("CARGO_BIN_EXE_gpuqueue-e2e-cluster");

fn show(what: &str, output: &Output) {
    eprintln!(
        "$ {what}\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `make -s <target> E2E_DIR=<dir> [<vars>]` in the repository, as a user runs it, but with
/// the cluster binary cargo built for this test instead of a `cargo run` that builds it again.
fn make(dir: &Path, target: &str, vars: &[&str]) -> Output {
    let output = without_crate_env(&mut Command::new("make"))
        .args(["-s", target])
        .arg(format!("E2E_DIR={}", dir.display()))
        .arg(format!("E2E_CLUSTER={CLI}"))
        .args(vars)
        .current_dir(repo_root())
        .output()
        .unwrap();
    show(&format!("make -s {target} {}", vars.join(" ")), &output);
    output
}

/// `script` in a bash that first ran `eval "$(make -s cluster-env)"`.
fn in_cluster_env(dir: &Path, script: &str) -> Output {
    let line = format!(
        "eval \"$(make -s cluster-env E2E_DIR='{}' E2E_CLUSTER='{CLI}')\" && {script}",
        dir.display()
    );
    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &line])
        .current_dir(repo_root())
        .output()
        .unwrap();
    show(script, &output);
    output
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Pids recorded in the state file, with their command lines, that are still running.
fn live_processes(state: &serde_json::Value) -> Vec<u64> {
    state["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", p["pid"])).unwrap_or_default();
            let first = p["argv"][0].as_str().unwrap();
            String::from_utf8_lossy(&cmdline).starts_with(first)
        })
        .map(|p| p["pid"].as_u64().unwrap())
        .collect()
}

#[test]
fn cluster_outlives_up_serves_kubectl_and_the_plugin_and_down_stops_exactly_it() {
    let dir = std::env::temp_dir().join(format!("gpuqueue-e2e-cli-{}", std::process::id()));
    let up = make(
        &dir,
        "cluster-up",
        &["CLUSTER_UP_FLAGS=--gpu-nodes 2 --gpus-per-node 4"],
    );
    assert!(up.status.success());

    // A second `up` refuses instead of starting a second cluster on the same state.
    let again = Command::new(CLI)
        .args(["up", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    show("gpuqueue-e2e-cluster up", &again);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already running"));

    let nodes = stdout(&in_cluster_env(&dir, "kubectl get nodes -o name"));
    assert_eq!(
        nodes.lines().collect::<Vec<_>>(),
        ["node/gpu-node-0", "node/gpu-node-1", "node/mig-node-0"]
    );

    // kubectl finds the plugin on the PATH `env` exported: before the CRD, it says so.
    let plugin = stdout(&in_cluster_env(&dir, "command -v kubectl-gpuqueue"));
    assert_eq!(
        plugin.trim(),
        dir.join("plugin/kubectl-gpuqueue").display().to_string()
    );
    let queues = in_cluster_env(&dir, "kubectl gpuqueue queues");
    assert!(!queues.status.success());
    assert!(
        String::from_utf8_lossy(&queues.stderr)
            .contains("the GpuQueue CRD (gpuqueues.gpuqueue.io) is not installed"),
    );
    // Established is not yet served: the API server answers 429 "storage is (re)initializing"
    // until its cache of the new resource is ready, which the CLI reports rather than retries.
    let out = stdout(&in_cluster_env(
        &dir,
        "kubectl apply --server-side -f crds/ >/dev/null \
         && kubectl wait --for condition=established --timeout=60s crd/gpuqueues.gpuqueue.io >/dev/null \
         && timeout 60 bash -c 'until kubectl get gq >/dev/null 2>&1; do sleep 0.2; done' \
         && kubectl gpuqueue queues && kubectl gpuqueue top",
    ));
    assert!(out.starts_with("No GpuQueues found.\nNODE "), "{out}");
    for row in ["gpu-node-0 ", "gpu-node-1 ", "mig-node-0 "] {
        assert!(out.lines().any(|l| l.starts_with(row)), "no {row}in\n{out}");
    }
    assert!(
        out.contains("Cluster: 0 of 17 GPUs allocated (0%), 17 free, "),
        "{out}"
    );

    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).unwrap()).unwrap();
    assert_eq!(
        live_processes(&state).len(),
        5,
        "etcd, apiserver, scheduler, controller manager, kwok"
    );

    let down = make(&dir, "cluster-down", &[]);
    assert!(down.status.success());
    assert!(!dir.exists(), "down removes the state directory");
    assert_eq!(live_processes(&state), Vec::<u64>::new());
    let env = make(&dir, "cluster-env", &[]);
    assert!(!env.status.success(), "env fails when no cluster runs");
}

/// Runs `make demo-down` when dropped, so a failed demo leaves nothing running.
struct DemoDown<'a>(&'a Path);

impl Drop for DemoDown<'_> {
    fn drop(&mut self) {
        make(self.0, "demo-down", &[]);
    }
}

/// `make demo` twice in a row, as a new user may: the second run stops what the first left
/// running (its fake vLLM holding the admin port, its operator, its cluster) and shows every
/// section again, with a waiting pod's real reason. Ports are free ones, not the defaults, so
/// that a demo a person is running on this machine is left alone.
#[test]
fn make_demo_runs_twice_and_shows_why_a_pod_waits() {
    let dir = std::env::temp_dir().join(format!("gpuqueue-e2e-demo-{}", std::process::id()));
    let _down = DemoDown(&dir);
    let ports: [u16; 3] = gpuqueue_e2e::free_ports().unwrap();
    let vars = [
        format!("DEMO_METRICS_PORT={}", ports[0]),
        format!("DEMO_WEBHOOK_PORT={}", ports[1]),
        format!("DEMO_VLLM_ADMIN=127.0.0.1:{}", ports[2]),
    ];
    let vars: Vec<&str> = vars.iter().map(String::as_str).collect();
    for run in ["first", "second"] {
        let demo = make(&dir, "demo", &vars);
        let out = String::from_utf8_lossy(&demo.stdout);
        assert!(demo.status.success(), "the {run} demo failed");
        let reason = out
            .split_once("A pod that waits says why")
            .and_then(|(_, rest)| rest.lines().nth(1))
            .unwrap_or_default()
            .trim();
        assert!(
            reason
                .starts_with("OverCeiling: queue batch: nvidia.com/gpu allocated 24 + requested 1"),
            "{run} demo: {reason:?}"
        );
        assert!(out.contains("Normal   OverCeiling   queue batch"), "{out}");
        assert!(out.contains("Cluster: 28 of 41 GPUs allocated"), "{out}");
        assert!(out.contains("BorrowCooldown: queue batch"), "{out}");
        if run == "second" {
            assert!(
                out.contains("demo-down: stopped target/debug/fake-vllm"),
                "{out}"
            );
        }
    }

    // `make demo-down` stops the demo's fake vLLM, its operator and its cluster: exactly those.
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).unwrap()).unwrap();
    let mut demo = live_processes(&state);
    assert_eq!(demo.len(), 5, "the demo's cluster runs");
    for file in ["fake-vllm.pid", "operator.pid"] {
        let pid = std::fs::read_to_string(dir.join(file)).unwrap();
        demo.push(pid.trim().parse().unwrap());
    }
    let down = make(&dir, "demo-down", &[]);
    assert!(down.status.success());
    let running: Vec<u64> = demo
        .into_iter()
        .filter(|pid| {
            !std::fs::read(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .is_empty()
        })
        .collect();
    assert_eq!(running, Vec::<u64>::new(), "still running after demo-down");
    assert!(!dir.exists(), "down removes the state directory");
}
