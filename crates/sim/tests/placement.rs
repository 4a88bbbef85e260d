#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The placement study on the real openb trace: the fragmentation measure reproduces the
//! published empty-cluster values, and runs are deterministic and conserve every task.
//! Runs use a slice of the cluster (every tenth node) so the suite stays fast; full runs are
//! `make bench-sim`.

use std::path::{Path, PathBuf};

use gpuqueue_sim::data::{self, GPU_NODE_LIST, REFERENCE_DIR, TRACE_DIR};
use gpuqueue_sim::placement::{self, PlacementPolicy, PlacementTrace};
use gpuqueue_sim::reference::{Metric, Published};
use gpuqueue_sim::trace::{self, TraceNode};

fn data_dir() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    data::find_data_dir(here).unwrap_or_else(|| panic!("{}", data::missing_data_message(here)))
}

fn nodes() -> Vec<TraceNode> {
    trace::load_nodes(&data_dir().join(TRACE_DIR).join(GPU_NODE_LIST)).unwrap()
}

fn trace_on(variant: &str, nodes: &[TraceNode]) -> PlacementTrace {
    let tasks = trace::load_pods(
        &data_dir()
            .join(TRACE_DIR)
            .join(data::pod_list_file(variant)),
    )
    .unwrap();
    PlacementTrace::new(variant, nodes, tasks)
}

#[test]
fn empty_cluster_fragmentation_matches_the_published_values() {
    let nodes = nodes();
    let published = Published::load(&data_dir().join(REFERENCE_DIR)).unwrap();
    // The FGD README's independent reimplementation on the empty cluster, and the published
    // curve at arrival 0 (an average over the first half percent of arrivals).
    for (variant, reimplementation) in [
        ("default", 13.94),
        ("cpu050", 5.55),
        ("cpu250", 25.87),
        ("gpushare100", 13.64),
        ("gpuspec33", 35.49),
    ] {
        let trace = trace_on(variant, &nodes);
        assert_eq!(trace.capacity_gpus(), 6212);
        let ours = 100.0 * trace.empty_fragmentation().share_of_capacity();
        assert!(
            (ours - reimplementation).abs() < 0.01,
            "{variant}: {ours:.3}% vs {reimplementation}%"
        );
        let at0 = published
            .at(Metric::FragmentationOfCapacity, variant, "06-FGD", 0)
            .unwrap()
            .mean;
        assert!(
            (ours - at0).abs() < 0.1,
            "{variant}: {ours:.3}% vs published {at0:.3}% at arrival 0"
        );
    }
}

fn slice() -> PlacementTrace {
    let nodes: Vec<TraceNode> = nodes().into_iter().step_by(10).collect();
    trace_on("default", &nodes)
}

#[test]
fn runs_are_deterministic_per_seed() {
    let trace = slice();
    for policy in PlacementPolicy::ALL {
        let a = placement::run(&trace, policy, 42, 1.3, &|_| {}).unwrap();
        let b = placement::run(&trace, policy, 42, 1.3, &|_| {}).unwrap();
        assert_eq!(a.curves, b.curves, "{policy}");
        assert_eq!(
            (a.placed, a.end.idle_milli),
            (b.placed, b.end.idle_milli),
            "{policy}"
        );
        let c = placement::run(&trace, policy, 43, 1.3, &|_| {}).unwrap();
        assert_ne!(
            a.curves, c.curves,
            "{policy}: another seed submits another sequence"
        );
    }
}

#[test]
fn every_task_is_placed_once_or_dropped() {
    let trace = slice();
    let jobs: Vec<placement::Job> = PlacementPolicy::ALL
        .iter()
        .map(|&policy| placement::Job {
            trace: 0,
            policy,
            seed: 44,
        })
        .collect();
    let counted = std::sync::atomic::AtomicU64::new(0);
    let runs = placement::run_all(std::slice::from_ref(&trace), &jobs, 1.3, 2, &|n| {
        counted.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    })
    .unwrap();
    assert_eq!(runs.len(), jobs.len());
    for (run, job) in runs.iter().zip(&jobs) {
        assert_eq!(run.policy, job.policy, "results come back in job order");
        assert_eq!(run.placed + run.failed, run.submitted);
        assert_eq!(
            run.pods_in_cluster, run.placed,
            "{}: a placed task is in the cluster exactly once",
            run.policy
        );
        assert_eq!(
            run.end.capacity_milli - run.end.idle_milli,
            run.placed_milli,
            "{}",
            run.policy
        );
        assert!(
            run.failed > 0,
            "{}: 130% of capacity cannot all fit",
            run.policy
        );
        let capacity = trace.capacity_gpus() * 1000;
        assert!(
            run.arrived_milli * 10 >= capacity * 13 - 80_000,
            "{}: arrived {}",
            run.policy,
            run.arrived_milli
        );
        assert_eq!(run.curves.last_level(), Some(130));
    }
    let submitted: usize = runs.iter().map(|r| r.submitted).sum();
    assert_eq!(
        counted.into_inner(),
        submitted as u64,
        "progress counts every submission once"
    );
}
