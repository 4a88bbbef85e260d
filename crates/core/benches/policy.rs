//! The policy's cost per decision at scale: 1,000 nodes × 8 GPUs, 10 queues, 10,000 pods
//! (7,500 running on every GPU or on all but 10% of them, 2,500 waiting).
//!
//! - `decide/admit`: one pending pod that fits, placed by our fragmentation-aware scorer over
//!   all nodes; `decide/admit-best-fit` the same with plain best-fit, the baseline;
//! - `decide/reclaim`: one pending owner on a full cluster: placement finds nothing, the
//!   reclaim planner picks a node and victims;
//! - `plan_reclaim`: the planner alone;
//! - `pending-victims`: every pass's answer to the evictions waiting on it (which victims in
//!   flight their queues still borrow), with 200 of the borrowers marked as victims;
//! - `build`: the snapshot from its 10,000 pods, as the operator built it each cycle;
//!   `update-snapshot` the operator's pass now: the kept snapshot with one pod gone and one
//!   new brought up to date and copied.
//!
//! `make bench-core` runs it and writes `target/bench-core/policy.{md,json}` (medians, and
//! the ratio to the 1 ms target and to best-fit).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_precision_loss
)]

use std::{fmt::Write as _, fs, path::PathBuf, sync::Arc, time::Duration};

use std::hint::black_box;

use criterion::{BatchSize, Criterion};
use gpuqueue_core::Policy;
use gpuqueue_core::Snapshot;
use gpuqueue_core::admission::{Decision, decide};
use gpuqueue_core::fragmentation::{DEFAULT_POPULARITY, WorkloadMix};
use gpuqueue_core::ids::PodId;
use gpuqueue_core::model::{
    Assignment, GpuRequest, Node, Pod, PodKey, PodState, Queue, ReclaimMark, ReclaimRole, Requests,
    ResourceQuota,
};
use gpuqueue_core::placement::{BestFit, TieBreak};
use gpuqueue_core::reclaim::{pending_victims, plan_reclaim};
use gpuqueue_core::snapshot::kept::{KeptSnapshot, Made};
use jiff::{SignedDuration, Timestamp};

const GPU: &str = "nvidia.com/gpu";
const NODES: usize = 1000;
const QUEUES: usize = 10;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_767_225_600).unwrap() + SignedDuration::from_secs(secs)
}

fn pod(queue: usize, i: usize, gpus: u32) -> Pod {
    let mut pod = Pod::new(
        PodKey::new(format!("q{queue}"), format!("p{i:05}")),
        Requests {
            cpu_milli: 4000,
            memory_bytes: 32 << 30,
            gpus: vec![GpuRequest::devices(GPU, gpus)],
            quota_only: Vec::new(),
        },
        at(i64::try_from(i).unwrap()),
    );
    pod.priority = i32::try_from(i % 3).unwrap();
    pod
}

/// The cluster; with `leave_free`, the last 10% of the nodes stay empty.
fn inputs(leave_free: bool) -> (Vec<Queue>, Vec<Node>, Vec<Pod>) {
    let queues = (0..QUEUES)
        .map(|q| {
            Queue::new(format!("q{q}"))
                .namespace(format!("q{q}"))
                .quota(ResourceQuota::devices(GPU, 700, 800))
        })
        .collect();
    let nodes = (0..NODES)
        .map(|n| {
            Node::new(format!("gpu-{n:04}"))
                .cpu_milli(128_000)
                .memory_bytes(2 << 40)
                .gpu_model("H100")
                .gpus(GPU, 8)
        })
        .collect();
    // q0..q4 hold 500 GPUs each (below their guarantee of 700), q5..q9 1,100 (borrowing 400);
    // 7,000 single-GPU pods and 500 two-GPU pods fill all 8,000 GPUs.
    let usable_nodes = if leave_free { NODES * 9 / 10 } else { NODES };
    let mut pods = Vec::new();
    let mut held = [0u32; QUEUES];
    let target = |q: usize| if q < 5 { 500 } else { 1100 };
    let (mut node, mut used) = (0usize, 0u32);
    for i in 0..7500 {
        let gpus = if i % 15 == 0 { 2 } else { 1 };
        let Some(q) = (0..QUEUES)
            .map(|k| (i + k) % QUEUES)
            .find(|q| held[*q] + gpus <= target(*q))
        else {
            break;
        };
        if used + gpus > 8 {
            node += 1;
            used = 0;
        }
        if node >= usable_nodes {
            break;
        }
        let mut p = pod(q, i, gpus);
        p.state = PodState::Admitted(Assignment {
            node: Some(format!("gpu-{node:04}")),
            bound: true,
            terminating: false,
        });
        p.admitted_at = Some(at(i64::try_from(i).unwrap()));
        pods.push(p);
        held[q] += gpus;
        used += gpus;
    }
    let running = pods.len();
    for i in running..10_000 {
        pods.push(pod(i % QUEUES, 10_000 + i, 1));
    }
    (queues, nodes, pods)
}

/// How many running pods of the borrowing queues [`with_victims`] marks as reclaim victims:
/// a burst's worth, and more.
const VICTIMS: usize = 200;

/// The full cluster with [`VICTIMS`] of the borrowing queues' one-GPU pods marked as victims
/// of reclaims in flight.
fn with_victims() -> Snapshot {
    let (queues, nodes, mut pods) = inputs(false);
    let borrowers = pods.iter_mut().filter(|p| {
        p.key.namespace.as_str() >= "q5"
            && matches!(p.state, PodState::Admitted(_))
            && p.requests.gpus[0].count == 1
    });
    for (i, pod) in borrowers.step_by(20).take(VICTIMS).enumerate() {
        pod.reclaim = Some(ReclaimMark {
            id: format!("rc-{i}"),
            role: ReclaimRole::Victim,
        });
    }
    built(queues, nodes, pods)
}

fn snapshot(leave_free: bool) -> Snapshot {
    let (queues, nodes, pods) = inputs(leave_free);
    built(queues, nodes, pods)
}

fn built(queues: Vec<Queue>, nodes: Vec<Node>, pods: Vec<Pod>) -> Snapshot {
    let mix = WorkloadMix::from_pods(&pods, DEFAULT_POPULARITY);
    let (snapshot, issues) = Snapshot::builder()
        .queues(queues)
        .nodes(nodes)
        .pods(pods)
        .workload_mix(mix)
        .build();
    assert!(issues.is_empty(), "{issues:?}");
    snapshot
}

/// A pending pod of q0, which is below its guarantee.
fn owner(snapshot: &Snapshot) -> PodId {
    snapshot
        .pending_pods()
        .find(|p| snapshot.pod(*p).unwrap().key.namespace == "q0")
        .unwrap()
}

fn benches(c: &mut Criterion) {
    let free = snapshot(true);
    let full = snapshot(false);
    assert_eq!(free.pod_ids().count(), 10_000);
    assert_eq!(full.pod_ids().count(), 10_000);
    let now = at(20_000);
    let (free_owner, full_owner) = (owner(&free), owner(&full));
    assert!(matches!(
        decide(&free, free_owner, &Policy::default(), now),
        Decision::Admit(_)
    ));
    let Decision::Reclaim(plan) = decide(&full, full_owner, &Policy::default(), now) else {
        panic!("the full cluster must need a reclaim")
    };
    assert_eq!(plan.victims.len(), 1, "{plan}");

    let mut group = c.benchmark_group("policy");
    group
        .sample_size(50)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    group.bench_function("decide-admit", |b| {
        b.iter(|| decide(black_box(&free), free_owner, &Policy::default(), now));
    });
    group.bench_function("decide-admit-best-fit", |b| {
        b.iter(|| {
            decide(
                black_box(&free),
                free_owner,
                &Policy::new(&BestFit, TieBreak::First),
                now,
            )
        });
    });
    group.bench_function("decide-reclaim", |b| {
        b.iter(|| decide(black_box(&full), full_owner, &Policy::default(), now));
    });
    group.bench_function("plan-reclaim", |b| {
        b.iter(|| plan_reclaim(black_box(&full), full_owner, now));
    });
    let marked = with_victims();
    let judged = pending_victims(&marked);
    assert_eq!(judged.len(), VICTIMS);
    assert!(
        judged.iter().all(|v| v.borrowed),
        "every marked pod is borrowed"
    );
    group.bench_function("pending-victims", |b| {
        b.iter(|| pending_victims(black_box(&marked)));
    });
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    group.bench_function("build-snapshot", |b| {
        b.iter_batched(
            || inputs(false),
            |(queues, nodes, pods)| {
                Snapshot::builder()
                    .queues(queues)
                    .nodes(nodes)
                    .pods(pods)
                    .build()
            },
            BatchSize::LargeInput,
        );
    });
    // The operator's pass on a kept snapshot: one pod gone and one new since the last pass
    // (alternately, so each iteration is a change), brought up to date and copied. With the
    // pods' mix, which changes with them (counted for the changed pods, then measured on every
    // node again).
    let (queues, nodes, pods) = inputs(false);
    let pods: Vec<Arc<Pod>> = pods.into_iter().map(Arc::new).collect();
    let mut changed = pods.clone();
    changed.remove(100);
    changed.push(Arc::new(pod(0, 30_000, 2)));
    let builder = |pods: &[Arc<Pod>]| {
        Snapshot::builder()
            .queues(queues.clone())
            .nodes(nodes.clone())
            .pods(pods.iter().cloned())
            .workload_mix_of_pods(DEFAULT_POPULARITY)
    };
    let (one, other) = (builder(&pods), builder(&changed));
    let mut kept = KeptSnapshot::default();
    assert_eq!(kept.build(one).2, Made::Built);
    assert_eq!(
        kept.build(other).2,
        Made::Updated {
            removed: 1,
            added: 1
        }
    );
    let mut flip = false;
    group.bench_function("update-snapshot", |b| {
        b.iter_batched(
            || {
                flip = !flip;
                builder(if flip { &pods } else { &changed })
            },
            |builder| kept.build(builder),
            BatchSize::LargeInput,
        );
    });
    group.finish();
}

/// The cargo target directory (`$CARGO_TARGET_DIR`, else the workspace's `target`).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .canonicalize()
                .unwrap()
                .join("target")
        },
        PathBuf::from,
    )
}

/// Criterion's output folder, as criterion finds it: `$CRITERION_HOME`, else `criterion` in
/// the target directory.
fn criterion_dir() -> PathBuf {
    std::env::var_os("CRITERION_HOME").map_or_else(|| target_dir().join("criterion"), PathBuf::from)
}

/// The median of one benchmark in nanoseconds, from criterion's estimates.
fn median_ns(name: &str) -> Option<f64> {
    let path = criterion_dir()
        .join("policy")
        .join(name)
        .join("new/estimates.json");
    let text = fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["median"]["point_estimate"].as_f64()
}

/// Writes `target/bench-core/policy.{md,json}`.
fn write_report() {
    let names = [
        "decide-admit",
        "decide-admit-best-fit",
        "decide-reclaim",
        "plan-reclaim",
        "pending-victims",
        "build-snapshot",
        "update-snapshot",
    ];
    let medians: Vec<(&str, f64)> = names
        .iter()
        .filter_map(|n| Some((*n, median_ns(n)?)))
        .collect();
    if medians.len() != names.len() {
        eprintln!(
            "policy bench: criterion estimates not found under {}; no report written",
            criterion_dir().display()
        );
        return;
    }
    let baseline = medians[1].1;
    let mut md = String::from(
        "# Policy core: one decision on 1,000 nodes × 8 GPUs, 10,000 pods\n\n\
         | benchmark | median | vs 1 ms target | vs best-fit admit |\n| --- | ---: | ---: | ---: |\n",
    );
    let mut json = serde_json::Map::new();
    for (name, ns) in &medians {
        let _ = writeln!(
            md,
            "| {name} | {:.1} µs | {:.3} | {:.2} |",
            ns / 1000.0,
            ns / 1e6,
            ns / baseline
        );
        json.insert((*name).to_string(), serde_json::json!({"median_ns": ns, "vs_1ms": ns / 1e6, "vs_best_fit_admit": ns / baseline}));
    }
    let out = target_dir().join("bench-core");
    fs::create_dir_all(&out).unwrap();
    fs::write(out.join("policy.md"), &md).unwrap();
    fs::write(
        out.join("policy.json"),
        serde_json::to_string_pretty(&json).unwrap(),
    )
    .unwrap();
    println!("\n{md}\nwritten to {}", out.display());
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    write_report();
}
