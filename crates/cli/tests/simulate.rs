#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! `kubectl-gpuqueue simulate` as a user runs it: the binary, real files, exit codes and
//! messages.

mod common;

use common::Scratch;

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Output};

fn simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-gpuqueue"))
        .arg("simulate")
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
    n-0,64000,262144,8,G2\nn-1,64000,262144,8,G2\nn-2,32000,131072,2,T4\nn-3,32000,131072,4,V100M16\n";

fn pods() -> String {
    let mut text = String::from(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n",
    );
    let shapes = [
        (4000, 1, 1000, ""),
        (2000, 1, 470, ""),
        (8000, 2, 1000, ""),
        (1000, 0, 0, ""),
        (6000, 1, 810, "T4"),
        (16000, 4, 1000, ""),
    ];
    for i in 0..60 {
        let (cpu, gpus, milli, spec) = shapes[i % shapes.len()];
        writeln!(
            text,
            "p-{i:03},{cpu},1024,{gpus},{milli},{spec},LS,Running,0,10,0"
        )
        .unwrap();
    }
    text
}

fn write(dir: &Path, name: &str, contents: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.display().to_string()
}

#[test]
fn placement_study_writes_a_report() {
    let dir = Scratch::new("placement");
    let nodes = write(&dir, "nodes.csv", NODES);
    let pods = write(&dir, "openb_pod_list_tiny.csv", &pods());
    let out = dir.join("report");
    let output = simulate(&[
        "--trace",
        &nodes,
        &pods,
        "--seeds",
        "42-44",
        "--out",
        out.to_str().unwrap(),
        "--no-progress",
        "--data-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    for policy in ["random", "best-fit", "gpu-packing", "fgd", "ours"] {
        assert!(
            stdout.contains(&format!("| {policy}")),
            "{policy} missing from\n{stdout}"
        );
    }
    assert!(stdout.contains("15 runs"), "{stdout}");
    let report = std::fs::read_to_string(out.join("placement.md")).unwrap();
    assert!(report.contains("## Trace `tiny`"), "{report}");
    assert!(report.contains("events/s"), "{report}");
    for chart in [
        "placement-tiny-allocation.svg",
        "placement-tiny-fragmentation.svg",
    ] {
        assert!(
            std::fs::read_to_string(out.join(chart))
                .unwrap()
                .starts_with("<svg"),
            "{chart}"
        );
    }
}

#[test]
fn same_seeds_give_the_same_tables() {
    let dir = Scratch::new("determinism");
    let nodes = write(&dir, "nodes.csv", NODES);
    let pods = write(&dir, "pods.csv", &pods());
    let run = |out: &str| {
        let output = simulate(&[
            "--trace",
            &nodes,
            &pods,
            "--seeds",
            "7",
            "--policy",
            "fgd,ours",
            "--out",
            out,
            "--no-progress",
        ]);
        assert!(output.status.success(), "{}", text(&output.stderr));
        // The last line carries the wall time; the tables above it must match exactly.
        let stdout = text(&output.stdout);
        stdout
            .lines()
            .filter(|l| l.starts_with('|'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        run(dir.join("a").to_str().unwrap()),
        run(dir.join("b").to_str().unwrap())
    );
}

#[test]
fn a_bad_row_is_named_by_line_and_column() {
    let dir = Scratch::new("bad-row");
    let nodes = write(&dir, "nodes.csv", NODES);
    let pods = write(
        &dir,
        "pods.csv",
        &pods().replace("p-002,8000,", "p-002,lots,"),
    );
    let output = simulate(&[
        "--trace",
        &nodes,
        &pods,
        "--out",
        dir.join("r").to_str().unwrap(),
    ]);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("pods.csv:4:2: cpu_milli = \"lots\": must be a whole number"),
        "{stderr}"
    );
}

#[test]
fn the_five_column_variant_loads() {
    let dir = Scratch::new("five-columns");
    let nodes = write(&dir, "nodes.csv", NODES);
    let five: String = pods()
        .lines()
        .map(|l| l.split(',').take(5).collect::<Vec<_>>().join(",") + "\n")
        .collect();
    let pods = write(&dir, "pods.csv", &five);
    let out = dir.join("r");
    let output = simulate(&[
        "--trace",
        &nodes,
        &pods,
        "--seeds",
        "1",
        "--policy",
        "best-fit",
        "--out",
        out.to_str().unwrap(),
        "--no-progress",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
}

#[test]
fn bad_flags_are_explained() {
    let dir = Scratch::new("flags");
    let nodes = write(&dir, "nodes.csv", NODES);
    let pods = write(&dir, "pods.csv", &pods());
    let stderr = |args: &[&str]| {
        let output = simulate(args);
        assert!(!output.status.success());
        text(&output.stderr)
    };
    let err = stderr(&["--trace", &nodes, &pods, "--policy", "tetris"]);
    assert!(
        err.contains("unknown placement policy \"tetris\"; expected one of random, best-fit, gpu-packing, fgd, ours"),
        "{err}"
    );
    let err = stderr(&["--trace", &nodes, &pods, "--seeds", "9-3"]);
    assert!(err.contains("a range must go up"), "{err}");
    let missing = dir.join("missing.csv");
    let err = stderr(&["--trace", &nodes, missing.to_str().unwrap()]);
    assert!(err.contains("missing.csv: cannot read"), "{err}");
}
