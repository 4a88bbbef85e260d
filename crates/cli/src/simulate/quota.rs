//! The quota study of `simulate --scenario`, optionally on the live cluster's nodes and queues
//! (`--from-cluster`) and with proposed queue changes (`--queue`).

use std::io::Write as _;

use gpuqueue_core::model::{Node, Queue};
use gpuqueue_sim::quota::{self, QuotaInput, QuotaPolicy};
use gpuqueue_sim::quota_report::{self, Labelled};
use gpuqueue_sim::report;
use gpuqueue_sim::scenario::Scenario;
use gpuqueue_sim::workload::Workload;

use super::error::SimulateError;
use super::host::{data_dir, progress_bar, stopwatch};
use crate::args::{SimulateArgs, parse_seeds};
use crate::cluster::{self, LiveCluster};

/// Label of the current quotas when a change is proposed.
const CURRENT: &str = "current quotas";
/// Label of the proposed quotas.
const PROPOSED: &str = "proposed quotas";

/// Runs the scenario's quota study.
pub fn run(args: &SimulateArgs) -> Result<(), SimulateError> {
    let path = args
        .scenario
        .as_ref()
        .ok_or_else(|| SimulateError::Usage("give --scenario FILE or --trace NODES PODS".into()))?;
    let loaded = Scenario::load(path, data_dir(args).as_deref())?;
    let seeds = match &args.seeds {
        Some(text) => parse_seeds(text).map_err(SimulateError::Usage)?,
        None => vec![loaded.scenario.seed],
    };
    let policies: Vec<QuotaPolicy> = if args.policy.is_empty() {
        QuotaPolicy::ALL.to_vec()
    } else {
        args.policy
            .iter()
            .map(|p| p.parse().map_err(SimulateError::Usage))
            .collect::<Result<_, _>>()?
    };
    let live = if args.from_cluster {
        Some(live_cluster()?)
    } else {
        None
    };
    let proposed = proposed_queues(args)?;

    let runs_per_seed = if proposed.is_empty() {
        policies.len()
    } else {
        2
    };
    let bar = progress_bar(args, (seeds.len() * runs_per_seed) as u64, "simulating");
    let started = stopwatch();
    let mut runs = Vec::new();
    let mut first_input = None;
    for &seed in &seeds {
        let workload = Workload::generate(&loaded, seed)?;
        let mut input = QuotaInput::new(&loaded, &workload, seed);
        if let Some((nodes, queues)) = &live {
            input = input
                .with_cluster(nodes.clone(), queues.clone())
                .map_err(|e| SimulateError::Usage(e.to_string()))?;
        }
        if proposed.is_empty() {
            for run in quota::run_policies(&input, &policies) {
                runs.push(Labelled {
                    label: run.policy.title().to_owned(),
                    seed,
                    run,
                });
            }
        } else {
            let changed = input.with_queues(proposed.clone());
            let [current, next] = [&input, &changed].map(|i| quota::run(i, QuotaPolicy::Borrow));
            runs.push(Labelled {
                label: CURRENT.into(),
                seed,
                run: current,
            });
            runs.push(Labelled {
                label: PROPOSED.into(),
                seed,
                run: next,
            });
        }
        bar.inc(runs_per_seed as u64);
        first_input.get_or_insert(input);
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    match first_input {
        Some(input) => write_report(args, &input, &loaded.scenario.description, &runs, elapsed),
        None => Ok(()),
    }
}

fn write_report(
    args: &SimulateArgs,
    input: &QuotaInput,
    description: &str,
    runs: &[Labelled],
    elapsed: std::time::Duration,
) -> Result<(), SimulateError> {
    let first_seed = runs.first().map(|r| r.seed);
    let first: Vec<Labelled> = runs
        .iter()
        .filter(|r| Some(r.seed) == first_seed)
        .cloned()
        .collect();
    let mut chart_files = Vec::new();
    for (name, svg) in quota_report::charts(&input.name, &first)? {
        report::write_file(&args.out, &name, &svg)?;
        chart_files.push(name);
    }
    let text = quota_report::markdown(input, description, runs, Some(elapsed), &chart_files);
    let report_path = report::write_file(&args.out, &format!("quota-{}.md", input.name), &text)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "{}",
        quota_report::summary_table(runs).to_markdown()
    )?;
    if let Some(ratio) =
        quota_report::utilisation_ratio(runs, "borrow-and-reclaim", "static quotas")
    {
        writeln!(
            stdout,
            "Borrow-and-reclaim keeps {ratio:.2}x the utilisation of static quotas."
        )?;
    }
    if let Some(ratio) = quota_report::utilisation_ratio(runs, PROPOSED, CURRENT) {
        writeln!(
            stdout,
            "The proposed quotas give {ratio:.2}x the utilisation of the current ones."
        )?;
    }
    let events: u64 = runs.iter().map(|r| r.run.events).sum();
    #[allow(clippy::cast_precision_loss)] // event counts far below 2^52
    let rate = events as f64 / elapsed.as_secs_f64().max(1e-9);
    writeln!(
        stdout,
        "{} runs, {events} events in {:.1} s ({rate:.0} events/s). Report: {}",
        runs.len(),
        elapsed.as_secs_f64(),
        report_path.display()
    )?;
    Ok(())
}

/// The live cluster's nodes and queues, converted by the core as the operator converts them.
fn live_cluster() -> Result<(Vec<Node>, Vec<Queue>), SimulateError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(SimulateError::Output)?;
    let LiveCluster { nodes, queues } = runtime.block_on(cluster::fetch())?;
    convert_live(&nodes, &queues)
}

/// Converts listed nodes and queues; a node or queue the operator could not use is an error
/// that names it, since a simulation without it would mislead.
fn convert_live(
    nodes: &[k8s_openapi::api::core::v1::Node],
    queues: &[gpuqueue_api::v1alpha1::GpuQueue],
) -> Result<(Vec<Node>, Vec<Queue>), SimulateError> {
    let nodes = nodes
        .iter()
        .map(|n| {
            Node::from_k8s(n)
                .map(|c| c.value)
                .map_err(|e| SimulateError::Usage(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let queues = queues
        .iter()
        .map(|q| Queue::from_api(q).map_err(|e| SimulateError::Usage(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((nodes, queues))
}

fn proposed_queues(args: &SimulateArgs) -> Result<Vec<Queue>, SimulateError> {
    let mut queues = Vec::new();
    for path in &args.queues {
        for queue in cluster::read_queue_manifests(path)? {
            let queue = Queue::from_api(&queue)
                .map_err(|e| SimulateError::Usage(format!("{}: {e}", path.display())))?;
            queues.push(queue);
        }
    }
    Ok(queues)
}
