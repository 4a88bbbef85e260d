//! The placement study of `simulate --trace NODES PODS...`: every policy and seed on each pod
//! list, against the published FGD columns when the data folder has them.

use std::io::Write as _;
use std::path::Path;

use gpuqueue_sim::data::REFERENCE_DIR;
use gpuqueue_sim::placement::{self, Job, PlacementPolicy, PlacementTrace};
use gpuqueue_sim::placement_report::{self, Timing};
use gpuqueue_sim::reference::Published;
use gpuqueue_sim::report;
use gpuqueue_sim::sampling::{FGD_SEEDS, fgd_submission_order};
use gpuqueue_sim::trace::{self, TraceError};

use super::error::SimulateError;
use super::host::{data_dir, progress_bar, stopwatch};
use crate::args::{SimulateArgs, parse_seeds};

/// The name of a pod list: `default` for `openb_pod_list_default.csv`, else the file stem.
fn trace_name(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    stem.strip_prefix("openb_pod_list_")
        .map_or(stem.clone(), str::to_owned)
}

/// The placement study's inputs, read from the flags and files.
struct PlacementInputs {
    policies: Vec<PlacementPolicy>,
    seeds: Vec<u64>,
    traces: Vec<PlacementTrace>,
    capacity_gpus: u64,
    published: Option<Published>,
}

fn placement_inputs(args: &SimulateArgs) -> Result<PlacementInputs, SimulateError> {
    let policies: Vec<PlacementPolicy> = if args.policy.is_empty() {
        PlacementPolicy::ALL.to_vec()
    } else {
        args.policy
            .iter()
            .map(|p| p.parse().map_err(SimulateError::Usage))
            .collect::<Result<_, _>>()?
    };
    let seeds: Vec<u64> = match &args.seeds {
        Some(text) => parse_seeds(text).map_err(SimulateError::Usage)?,
        None => FGD_SEEDS.collect(),
    };
    if !(args.ratio.is_finite() && args.ratio > 0.0 && args.ratio <= 10.0) {
        return Err(SimulateError::Usage(format!(
            "--ratio {}: must be above 0 and at most 10",
            args.ratio
        )));
    }
    let (nodes_path, pod_paths) = args
        .trace
        .split_first()
        .ok_or_else(|| SimulateError::Usage("--trace needs a node list and a pod list".into()))?;
    let nodes = trace::load_nodes(nodes_path)?;
    let traces: Vec<PlacementTrace> = pod_paths
        .iter()
        .map(|path| {
            Ok(PlacementTrace::new(
                trace_name(path),
                &nodes,
                trace::load_pods(path)?,
            ))
        })
        .collect::<Result<_, TraceError>>()?;
    let capacity_gpus = traces.first().map_or(0, PlacementTrace::capacity_gpus);
    if capacity_gpus == 0 {
        return Err(SimulateError::Usage(format!(
            "{}: the node list has no GPU",
            nodes_path.display()
        )));
    }
    let published = match data_dir(args)
        .map(|d| d.join(REFERENCE_DIR))
        .filter(|d| d.is_dir())
    {
        Some(dir) => Published::load(&dir)
            .map_err(|e| {
                eprintln!("warning: no published columns, the FGD results are unreadable: {e}");
            })
            .ok(),
        None => None,
    };
    Ok(PlacementInputs {
        policies,
        seeds,
        traces,
        capacity_gpus,
        published,
    })
}

/// Runs the placement study.
pub fn run(args: &SimulateArgs) -> Result<(), SimulateError> {
    let PlacementInputs {
        policies,
        seeds,
        traces,
        capacity_gpus,
        published,
    } = placement_inputs(args)?;
    let mut jobs = Vec::new();
    for trace in 0..traces.len() {
        for &policy in &policies {
            jobs.extend(seeds.iter().map(|&seed| Job {
                trace,
                policy,
                seed,
            }));
        }
    }
    let mut total = 0u64;
    for job in &jobs {
        let trace = &traces[job.trace];
        total += fgd_submission_order(
            &trace.tasks,
            trace.capacity_gpus() * 1000,
            args.ratio,
            job.seed,
        )?
        .len() as u64;
    }
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let bar = progress_bar(args, total, "placing tasks");
    let started = stopwatch();
    let runs = placement::run_all(&traces, &jobs, args.ratio, threads, &|n| bar.inc(n))?;
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    let summaries = placement_report::summarise(&runs, published.as_ref());
    let mut chart_files = Vec::new();
    if let Some(first) = traces.first() {
        for (name, svg) in placement_report::trace_charts(&runs, published.as_ref(), &first.name)? {
            report::write_file(&args.out, &name, &svg)?;
            chart_files.push(name);
        }
    }
    let timing = Timing { elapsed, threads };
    let text = placement_report::markdown(
        &summaries,
        capacity_gpus,
        args.ratio,
        &seeds,
        Some(timing),
        &chart_files,
    );
    let path = report::write_file(&args.out, "placement.md", &text)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "{}",
        placement_report::goal_table(&summaries).to_markdown()
    )?;
    if let Some(first) = traces.first() {
        writeln!(
            stdout,
            "{}",
            placement_report::trace_table(&summaries, &first.name, capacity_gpus).to_markdown()
        )?;
    }
    #[allow(clippy::cast_precision_loss)] // event counts far below 2^52
    let rate = total as f64 / elapsed.as_secs_f64().max(1e-9);
    writeln!(
        stdout,
        "{} runs, {total} task submissions in {:.1} s ({rate:.0} events/s on {threads} threads). Report: {}",
        runs.len(),
        elapsed.as_secs_f64(),
        path.display()
    )?;
    Ok(())
}
