//! Replays an Alibaba trace the way the FGD paper does (tasks drawn with replacement until 130%
//! of the GPU capacity has arrived; arrivals only, nothing departs) with each scorer, and prints
//! GPU allocation and fragmentation at 100% and 130% arrived, next to the time taken.
//!
//! `cargo bench -p gpuqueue-core --bench trace_replay` (env: `TRACE=default`, `SEEDS=10`,
//! `TIE=first|seeded`). A quick check of the scorers and their speed; the simulator crate owns
//! the full study.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_precision_loss,
    clippy::disallowed_methods // a benchmark reads the clock to time itself
)]

#[path = "../tests/common/trace.rs"]
mod trace;

use std::{fmt::Write as _, time::Instant};

use gpuqueue_core::Snapshot;
use gpuqueue_core::fragmentation::{DEFAULT_POPULARITY, WorkloadMix};
use gpuqueue_core::model::{Pod, PodKey, Requests};
use gpuqueue_core::placement::{
    BestFit, Fgd, FragmentationAware, GpuPacking, Random, Scorer, TieBreak, mix64,
};

const CAPACITY_MILLI: u64 = 6_212_000;

fn main() {
    let variant = std::env::var("TRACE").unwrap_or_else(|_| "default".into());
    let seeds: u64 = std::env::var("SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let seeded_ties = std::env::var("TIE").is_ok_and(|t| t == "seeded");
    let tasks = trace::tasks(&variant);
    let mix = WorkloadMix::from_shapes(tasks.iter().map(|t| t.shape.clone()), DEFAULT_POPULARITY);
    let (empty, _) = Snapshot::builder()
        .nodes(trace::nodes())
        .workload_mix(mix)
        .build();
    let ties = if seeded_ties { "seeded" } else { "first" };
    let mut report = format!(
        "# Placement on the Alibaba `{variant}` trace, 130% arrived, {seeds} seeds, ties {ties}\n\n\
         | policy | GPU allocation at 100% | at 130% | fragmentation at 130% (of capacity) | placements | time |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n"
    );
    println!("trace {variant}, {seeds} seeds, ties {ties}");

    for policy in ["random", "best-fit", "packing", "fgd", "ours"] {
        let started = Instant::now();
        let (mut at100, mut at130, mut frag130, mut placements) = (0.0, 0.0, 0.0, 0u64);
        for seed in 42..42 + seeds {
            let mut snapshot = empty.clone();
            let (mut arrived, mut i, mut reached100) = (0u64, 0u64, None);
            while arrived < CAPACITY_MILLI * 13 / 10 {
                i += 1;
                let task = &tasks[usize::try_from(
                    mix64(seed.wrapping_mul(1_000_003) ^ i) % tasks.len() as u64,
                )
                .unwrap()];
                arrived += task.shape.gpu.as_ref().map_or(0, |g| g.total().0);
                let mut pod = Pod::new(
                    PodKey::new("trace", format!("t{i}")),
                    Requests {
                        cpu_milli: task.shape.cpu_milli,
                        memory_bytes: task.memory_mib << 20,
                        gpus: task.shape.gpu.iter().cloned().collect(),
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
                    _ => Box::new(FragmentationAware),
                };
                if let Some(placement) = snapshot.find_placement(&pod, scorer.as_ref(), tie) {
                    snapshot.add_placed(pod, &placement).unwrap();
                    placements += 1;
                }
                if reached100.is_none() && arrived >= CAPACITY_MILLI {
                    reached100 = Some(snapshot.fragmentation().allocation());
                }
            }
            let f = snapshot.fragmentation();
            at100 += reached100.unwrap();
            at130 += f.allocation();
            frag130 += f.share_of_capacity();
        }
        let n = seeds as f64;
        let elapsed = started.elapsed();
        println!(
            "{policy:>9}: GPU allocation {:.2}% at 100% arrived, {:.2}% at 130%; fragmentation {:.2}% of capacity at 130%; {placements} placements in {elapsed:.2?}",
            100.0 * at100 / n,
            100.0 * at130 / n,
            100.0 * frag130 / n,
        );
        let _ = writeln!(
            report,
            "| {policy} | {:.2}% | {:.2}% | {:.2}% | {placements} | {elapsed:.2?} |",
            100.0 * at100 / n,
            100.0 * at130 / n,
            100.0 * frag130 / n,
        );
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        std::path::PathBuf::from,
    );
    let out = target.join("bench-core");
    std::fs::create_dir_all(&out).unwrap();
    let file = out.join(format!("trace_replay_{variant}_{ties}.md"));
    std::fs::write(&file, report).unwrap();
    println!("written to {}", file.display());
}
