#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! `kubectl-gpuqueue simulate --scenario` as a user runs it: the quota study's report, a
//! proposed quota change, and the errors a user meets.

mod common;

use common::Scratch;

use std::path::Path;
use std::process::{Command, Output};

fn simulate(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kubectl-gpuqueue"));
    command.arg("simulate").args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn quickstart() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/sim/quickstart.yaml")
        .display()
        .to_string()
}

#[test]
fn quota_study_compares_the_three_policies() {
    let out = Scratch::new("study");
    let output = simulate(
        &[
            "--scenario",
            &quickstart(),
            "--out",
            out.to_str().unwrap(),
            "--no-progress",
        ],
        &[],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    for policy in ["| no isolation", "| static quotas", "| borrow-and-reclaim"] {
        assert!(stdout.contains(policy), "{policy} missing:\n{stdout}");
    }
    assert!(
        stdout.contains("x the utilisation of static quotas"),
        "{stdout}"
    );
    let report = std::fs::read_to_string(out.join("quota-quickstart.md")).unwrap();
    for section in [
        "## Policies",
        "## Tenants",
        "Arrivals are synthetic",
        "events/s",
    ] {
        assert!(
            report.contains(section),
            "{section} missing from the report"
        );
    }
    for chart in ["utilisation", "fragmentation", "pending"] {
        let svg =
            std::fs::read_to_string(out.join(format!("quota-quickstart-{chart}.svg"))).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("borrow-and-reclaim"),
            "{chart}"
        );
    }
}

#[test]
fn a_proposed_quota_change_runs_next_to_the_current_quotas() {
    let dir = Scratch::new("proposal");
    let manifest = dir.join("batch.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata: {name: batch}\nspec:\n  namespaces: [batch]\n  resources: [{name: nvidia.com/gpu, guaranteed: 4, burstable: 0}]\n",
    )
    .unwrap();
    let output = simulate(
        &[
            "--scenario",
            &quickstart(),
            "--queue",
            manifest.to_str().unwrap(),
            "--out",
            dir.join("r").to_str().unwrap(),
            "--no-progress",
        ],
        &[],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("| current quotas") && stdout.contains("| proposed quotas"),
        "{stdout}"
    );
    assert!(stdout.contains("The proposed quotas give"), "{stdout}");
}

#[test]
fn scenario_errors_name_the_field() {
    let dir = Scratch::new("errors");
    let bad = dir.join("bad.yaml");
    let text_of = |path: &Path, extra: &[&str]| {
        let mut args = vec!["--scenario", path.to_str().unwrap(), "--out", "unused"];
        args.extend_from_slice(extra);
        let output = simulate(&args, &[]);
        assert!(!output.status.success());
        text(&output.stderr)
    };
    std::fs::write(
        &bad,
        std::fs::read_to_string(quickstart())
            .unwrap()
            .replace("burstable: 24", "burstible: 24"),
    )
    .unwrap();
    let err = text_of(&bad, &[]);
    assert!(
        err.contains("tenants[1]: unknown field `burstible`"),
        "{err}"
    );
    assert!(err.contains("line"), "{err}");
    std::fs::write(
        &bad,
        std::fs::read_to_string(quickstart())
            .unwrap()
            .replace("guaranteed: 8", "guaranteed: 8\n    lendingLimit: 9"),
    )
    .unwrap();
    let err = text_of(&bad, &[]);
    assert!(
        err.contains("tenants[1].lendingLimit: must not exceed guaranteed"),
        "{err}"
    );
    let err = text_of(Path::new(&quickstart()), &["--policy", "fifo"]);
    assert!(
        err.contains("unknown quota policy \"fifo\"; expected one of no-isolation, static, borrow"),
        "{err}"
    );
    let manifest = dir.join("not-a-queue.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .unwrap();
    let err = text_of(
        Path::new(&quickstart()),
        &["--queue", manifest.to_str().unwrap()],
    );
    assert!(err.contains("not-a-queue.yaml: document 1: expected apiVersion gpuqueue.io/v1alpha1 and kind GpuQueue"), "{err}");
}

#[test]
fn from_cluster_without_a_cluster_says_so() {
    let dir = Scratch::new("no-cluster");
    let missing = dir.join("no-kubeconfig");
    let output = simulate(
        &[
            "--scenario",
            &quickstart(),
            "--from-cluster",
            "--out",
            dir.join("r").to_str().unwrap(),
        ],
        &[
            ("KUBECONFIG", missing.to_str().unwrap()),
            ("HOME", dir.to_str().unwrap()),
            ("KUBERNETES_SERVICE_HOST", ""),
        ],
    );
    assert!(!output.status.success());
    let err = text(&output.stderr);
    assert!(
        err.contains("cannot connect to the cluster (current kubeconfig context)"),
        "{err}"
    );
}
