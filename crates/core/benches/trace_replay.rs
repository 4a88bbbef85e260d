//! Replays the Alibaba traces the way the FGD paper does (tasks drawn with replacement until
//! 130% of the GPU capacity has arrived; arrivals only, nothing departs) and reports GPU
//! allocation and fragmentation at 100% and 130% arrived:
//!
//! 1. every scorer on the `default` trace, with the time each takes for all seeds;
//! 2. FGD and ours on every pod-list variant, next to the FGD paper's published values (the
//!    mean over its seeds 42–51 of `06-FGD` in `fgd-expected-results/`).
//!
//! `cargo bench -p gpuqueue-core --bench trace_replay` (env: `TRACES=default,cpu050` picks the
//! variants of part 2, `TRACES=none` skips it; `SEEDS=10`; `TIE=first|seeded`). Writes
//! `target/bench-core/trace_replay_{default,variants}_<tie>.md` and `trace_replay_variants_<tie>.json`.
//! Part 2 runs the variants in parallel; each row's time is its own, for all seeds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_precision_loss,
    clippy::disallowed_methods // a benchmark reads the clock to time itself
)]

#[path = "../tests/common/trace.rs"]
mod trace;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpuqueue_core::Policy;
use gpuqueue_core::Snapshot;
use gpuqueue_core::fragmentation::{DEFAULT_POPULARITY, WorkloadMix};
use gpuqueue_core::model::{Pod, PodKey, Requests};
use gpuqueue_core::placement::{
    BestFit, Fgd, FragmentationAware, GpuPacking, Random, Scorer, TieBreak, mix64,
};

const CAPACITY_GPUS: u64 = 6_212;
const CAPACITY_MILLI: u64 = CAPACITY_GPUS * 1000;

/// The pod lists of `alibaba-gpu-v2023/`, as the FGD paper names its workloads.
const VARIANTS: [&str; 16] = [
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare20",
    "gpushare40",
    "gpushare60",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
];

const POLICIES: [&str; 5] = ["random", "best-fit", "packing", "fgd", "ours"];

/// Means over the seeds, in percent (`placements` summed).
#[derive(Clone, Copy, Debug, Default)]
struct Outcome {
    at100: f64,
    at130: f64,
    frag100: f64,
    frag130: f64,
    placements: u64,
    time: Duration,
}

impl Outcome {
    fn unallocated_gpus(&self) -> f64 {
        (100.0 - self.at130) / 100.0 * CAPACITY_GPUS as f64
    }
}

/// One trace variant, ready to replay.
struct Trace {
    tasks: Vec<trace::Task>,
    empty: Snapshot,
}

impl Trace {
    fn load(variant: &str) -> Self {
        let tasks = trace::tasks(variant);
        let mix =
            WorkloadMix::from_shapes(tasks.iter().map(|t| t.shape.clone()), DEFAULT_POPULARITY);
        let (empty, issues) = Snapshot::builder()
            .nodes(trace::nodes())
            .workload_mix(mix)
            .build();
        assert!(issues.is_empty(), "{issues:?}");
        Self { tasks, empty }
    }

    /// Replays `seeds` seeds from 42 with `policy`.
    fn replay(&self, policy: &str, seeds: u64, seeded_ties: bool) -> Outcome {
        let started = Instant::now();
        let mut sum = Outcome::default();
        for seed in 42..42 + seeds {
            let mut snapshot = self.empty.clone();
            let (mut arrived, mut i, mut reached100) = (0u64, 0u64, None);
            while arrived < CAPACITY_MILLI * 13 / 10 {
                i += 1;
                let draw = mix64(seed.wrapping_mul(1_000_003) ^ i) % self.tasks.len() as u64;
                let task = &self.tasks[usize::try_from(draw).unwrap()];
                arrived += task.shape.gpu.as_ref().map_or(0, |g| g.total().0);
                let mut pod = Pod::new(
                    PodKey::new("trace", format!("t{i}")),
                    Requests {
                        cpu_milli: task.shape.cpu_milli,
                        memory_bytes: task.memory_mib << 20,
                        gpus: task.shape.gpu.iter().cloned().collect(),
                        quota_only: Vec::new(),
                    },
                    jiff::Timestamp::UNIX_EPOCH,
                );
                pod.gpu_models.clone_from(&task.shape.gpu_models);
                let draw = mix64(seed ^ i.rotate_left(17));
                let tie = if seeded_ties {
                    TieBreak::Seeded(draw)
                } else {
                    TieBreak::First
                };
                let scorer: Box<dyn Scorer> = match policy {
                    "random" => Box::new(Random { seed: draw }),
                    "best-fit" => Box::new(BestFit),
                    "packing" => Box::new(GpuPacking),
                    "fgd" => Box::new(Fgd),
                    "ours" => Box::new(FragmentationAware),
                    other => panic!("unknown policy {other}"),
                };
                if let Some(placement) =
                    Policy::new(scorer.as_ref(), tie).find_placement(&snapshot, &pod)
                {
                    snapshot.add_placed(pod, &placement).unwrap();
                    sum.placements += 1;
                }
                if reached100.is_none() && arrived >= CAPACITY_MILLI {
                    reached100 = Some(snapshot.fragmentation());
                }
            }
            let (at100, at130) = (reached100.unwrap(), snapshot.fragmentation());
            sum.at100 += at100.allocation();
            sum.frag100 += at100.share_of_capacity();
            sum.at130 += at130.allocation();
            sum.frag130 += at130.share_of_capacity();
        }
        let percent = 100.0 / seeds as f64;
        Outcome {
            at100: sum.at100 * percent,
            at130: sum.at130 * percent,
            frag100: sum.frag100 * percent,
            frag130: sum.frag130 * percent,
            placements: sum.placements,
            time: started.elapsed(),
        }
    }
}

/// The FGD paper's `06-FGD` at 100% and 130% arrived, mean over its seeds, per variant:
/// (allocation, fragmentation as a share of capacity), in percent.
type Published = BTreeMap<String, ((f64, f64), (f64, f64))>;

fn published() -> Published {
    let dir = trace::data_dir().join("fgd-expected-results");
    let read = |file: &str| -> BTreeMap<String, (f64, f64)> {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {} ({e})", path.display()));
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let at = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let (workload, policy, at100, at130) =
            (at("workload"), at("sc_policy"), at("100"), at("130"));
        let mut sums: BTreeMap<String, (f64, f64, u32)> = BTreeMap::new();
        for line in lines.filter(|l| !l.is_empty()) {
            let row: Vec<&str> = line.split(',').collect();
            if row[policy] != "06-FGD" {
                continue;
            }
            let variant = row[workload].trim_start_matches("openb_pod_list_");
            let e = sums.entry(variant.to_string()).or_default();
            e.0 += row[at100].parse::<f64>().unwrap();
            e.1 += row[at130].parse::<f64>().unwrap();
            e.2 += 1;
        }
        sums.into_iter()
            .map(|(v, (a, b, n))| (v, (a / f64::from(n), b / f64::from(n))))
            .collect()
    };
    let allocation = read("analysis_allo_discrete.csv");
    let fragmentation = read("analysis_frag_discrete.csv");
    allocation
        .into_iter()
        .map(|(v, a)| {
            let f = fragmentation[&v];
            (v, (a, f))
        })
        .collect()
}

fn out_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        PathBuf::from,
    );
    let out = target.join("bench-core");
    std::fs::create_dir_all(&out).unwrap();
    out
}

fn main() {
    let seeds: u64 = std::env::var("SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let seeded_ties = std::env::var("TIE").is_ok_and(|t| t == "seeded");
    let ties = if seeded_ties { "seeded" } else { "first" };
    let variants: Vec<String> = match std::env::var("TRACES") {
        Ok(list) if list == "none" => Vec::new(),
        Ok(list) => list.split(',').map(str::to_string).collect(),
        Err(_) => VARIANTS.iter().map(|v| (*v).to_string()).collect(),
    };
    let out = out_dir();
    let published = published();

    // 1. Every scorer on `default`, one after the other (the times compare).
    println!("trace default, {seeds} seeds, ties {ties}");
    let default = Trace::load("default");
    let mut report = format!(
        "# Placement on the Alibaba `default` trace, 130% arrived, {seeds} seeds, ties {ties}\n\n\
         | policy | GPU allocation at 100% | at 130% | unallocated GPUs at 130% | fragmentation at 130% (of capacity) | placements | time |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    for policy in POLICIES {
        let o = default.replay(policy, seeds, seeded_ties);
        println!(
            "{policy:>9}: GPU allocation {:.2}% at 100% arrived, {:.2}% at 130% ({:.0} GPUs unallocated); fragmentation {:.2}% of capacity at 130%; {} placements in {:.2?}",
            o.at100,
            o.at130,
            o.unallocated_gpus(),
            o.frag130,
            o.placements,
            o.time
        );
        let _ = writeln!(
            report,
            "| {policy} | {:.2}% | {:.2}% | {:.0} | {:.2}% | {} | {:.2?} |",
            o.at100,
            o.at130,
            o.unallocated_gpus(),
            o.frag130,
            o.placements,
            o.time
        );
    }
    if let Some(((_, p130), (_, f130))) = published.get("default") {
        let _ = writeln!(
            report,
            "| FGD, published | | {p130:.2}% | {:.0} | {f130:.2}% | | |",
            (100.0 - p130) / 100.0 * CAPACITY_GPUS as f64
        );
    }
    let file = out.join(format!("trace_replay_default_{ties}.md"));
    std::fs::write(&file, report).unwrap();
    println!("written to {}", file.display());

    if !variants.is_empty() {
        replay_variants(&variants, &published, seeds, seeded_ties, &out);
    }
}

/// Part 2: FGD and ours on every variant, in parallel; each job times itself.
fn replay_variants(
    variants: &[String],
    published: &Published,
    seeds: u64,
    seeded_ties: bool,
    out: &std::path::Path,
) {
    let ties = if seeded_ties { "seeded" } else { "first" };
    let jobs: Vec<(usize, &str)> = (0..variants.len())
        .flat_map(|v| [(v, "fgd"), (v, "ours")])
        .collect();
    let results = Mutex::new(BTreeMap::new());
    let next = Mutex::new(0usize);
    let traces: Vec<Trace> = variants.iter().map(|v| Trace::load(v)).collect();
    let workers = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    println!(
        "\n{} variants × fgd, ours, {seeds} seeds each, {workers} workers",
        variants.len()
    );
    std::thread::scope(|scope| {
        for _ in 0..workers.min(jobs.len()) {
            scope.spawn(|| {
                loop {
                    let job = {
                        let mut n = next.lock().unwrap();
                        let Some(job) = jobs.get(*n) else { break };
                        *n += 1;
                        *job
                    };
                    let o = traces[job.0].replay(job.1, seeds, seeded_ties);
                    println!(
                        "{:>12} {:>4}: {:.2}% / {:.2}% allocated at 100% / 130%, fragmentation {:.2}% at 130%, {:.2?}",
                        variants[job.0], job.1, o.at100, o.at130, o.frag130, o.time
                    );
                    results.lock().unwrap().insert(job, o);
                }
            });
        }
    });
    let results = results.into_inner().unwrap();
    let (mut md, json) = variants_report(variants, &results, published, seeds, ties);
    let _ = writeln!(
        md,
        "\nCommand: `cargo bench -p gpuqueue-core --bench trace_replay`. Published: the FGD \
         paper's `06-FGD`, mean of its seeds 42–51 (`fgd-expected-results/`); `—` where it \
         did not publish the variant. Unallocated GPUs are at 130% arrived, of {CAPACITY_GPUS}."
    );
    let file = out.join(format!("trace_replay_variants_{ties}.md"));
    std::fs::write(&file, &md).unwrap();
    std::fs::write(
        out.join(format!("trace_replay_variants_{ties}.json")),
        serde_json::to_string_pretty(&json).unwrap(),
    )
    .unwrap();
    println!("\n{md}\nwritten to {}", file.display());
}

/// The variants table (markdown) and its rows (JSON).
fn variants_report(
    variants: &[String],
    results: &BTreeMap<(usize, &str), Outcome>,
    published: &Published,
    seeds: u64,
    ties: &str,
) -> (String, Vec<serde_json::Value>) {
    let mut md = format!(
        "# FGD and ours on every Alibaba pod list, {seeds} seeds, ties {ties}\n\n\
         GPU allocation (%) at 100% and 130% arrived, fragmentation (% of capacity) and \
         unallocated GPUs at 130%.\n\n\
         | trace | alloc 100: published FGD | FGD | ours | alloc 130: published FGD | FGD | ours | ours − published | frag 130: published FGD | FGD | ours | unallocated: published FGD | ours | time FGD / ours |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    let mut json = Vec::new();
    let cell = |v: Option<f64>| v.map_or_else(|| "—".to_string(), |v| format!("{v:.2}"));
    for (v, variant) in variants.iter().enumerate() {
        let (fgd, ours) = (results[&(v, "fgd")], results[&(v, "ours")]);
        let p = published.get(variant.as_str());
        let (p100, p130) = (p.map(|p| p.0.0), p.map(|p| p.0.1));
        let f130 = p.map(|p| p.1.1);
        let p_unallocated = p130.map(|a| (100.0 - a) / 100.0 * CAPACITY_GPUS as f64);
        let _ = writeln!(
            md,
            "| {variant} | {} | {:.2} | {:.2} | {} | {:.2} | **{:.2}** | {} | {} | {:.2} | {:.2} | {} | {:.0} | {:.1?} / {:.1?} |",
            cell(p100),
            fgd.at100,
            ours.at100,
            cell(p130),
            fgd.at130,
            ours.at130,
            p130.map_or_else(|| "—".to_string(), |p| format!("{:+.2}", ours.at130 - p)),
            cell(f130),
            fgd.frag130,
            ours.frag130,
            p_unallocated.map_or_else(|| "—".to_string(), |u| format!("{u:.0}")),
            ours.unallocated_gpus(),
            fgd.time,
            ours.time,
        );
        json.push(serde_json::json!({
            "trace": variant,
            "published_fgd": p.map(|p| serde_json::json!({
                "allocation_100": p.0.0, "allocation_130": p.0.1,
                "fragmentation_100": p.1.0, "fragmentation_130": p.1.1,
            })),
            "fgd": outcome_json(&fgd),
            "ours": outcome_json(&ours),
        }));
    }
    (md, json)
}

fn outcome_json(o: &Outcome) -> serde_json::Value {
    serde_json::json!({
        "allocation_100": o.at100,
        "allocation_130": o.at130,
        "fragmentation_100": o.frag100,
        "fragmentation_130": o.frag130,
        "unallocated_gpus_130": o.unallocated_gpus(),
        "placements": o.placements,
        "seconds": o.time.as_secs_f64(),
    })
}
