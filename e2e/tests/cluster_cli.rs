#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! `gpuqueue-e2e-cluster up | env | down`, as `make cluster-up`, `make cluster-env` and
//! `make cluster-down` run it: the cluster outlives `up`, `env` points kubectl at it, and
//! `down` stops exactly its processes.

use std::path::Path;
use std::process::{Command, Output};

const CLI: &str = env!("CARGO_BIN_EXE_gpuqueue-e2e-cluster");

fn cli(dir: &Path, args: &[&str]) -> Output {
    let output = Command::new(CLI)
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    eprintln!(
        "$ gpuqueue-e2e-cluster {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The value of `export NAME=...` in `env`'s output, unquoted.
fn exported(env: &str, name: &str) -> String {
    let line = env
        .lines()
        .find_map(|line| line.strip_prefix(&format!("export {name}=")))
        .unwrap_or_else(|| panic!("no {name} in {env}"));
    line.split('\'').nth(1).unwrap().to_owned()
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
fn cluster_outlives_up_serves_kubectl_and_down_stops_exactly_it() {
    let dir = std::env::temp_dir().join(format!("gpuqueue-e2e-cli-{}", std::process::id()));
    let up = cli(&dir, &["up", "--gpu-nodes", "2", "--gpus-per-node", "4"]);
    assert!(up.status.success());

    // A second `up` refuses instead of starting a second cluster on the same state.
    let again = cli(&dir, &["up"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already running"));

    let env = cli(&dir, &["env"]);
    assert!(env.status.success());
    let env = String::from_utf8_lossy(&env.stdout);
    let kubeconfig = exported(&env, "KUBECONFIG");
    let kubectl = Path::new(&exported(&env, "PATH")).join("kubectl");
    let nodes = Command::new(kubectl)
        .args(["get", "nodes", "-o", "name"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(
        nodes.status.success(),
        "{}",
        String::from_utf8_lossy(&nodes.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&nodes.stdout)
            .lines()
            .collect::<Vec<_>>(),
        ["node/gpu-node-0", "node/gpu-node-1", "node/mig-node-0"]
    );

    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).unwrap()).unwrap();
    assert_eq!(
        live_processes(&state).len(),
        5,
        "etcd, apiserver, scheduler, controller manager, kwok"
    );

    let down = cli(&dir, &["down"]);
    assert!(down.status.success());
    assert!(!dir.exists(), "down removes the state directory");
    assert_eq!(live_processes(&state), Vec::<u64>::new());
    let env = cli(&dir, &["env"]);
    assert!(!env.status.success(), "env fails when no cluster runs");
}
