//! Command-line arguments of `kubectl-gpuqueue`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// kubectl-gpuqueue: tools for gpuqueue's GPU queues.
#[derive(Debug, Parser)]
#[command(name = "kubectl-gpuqueue", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Every GpuQueue per resource: quota, usage, pods, unhealthy conditions, last handover.
    #[command(visible_aliases = ["get", "ls"], after_help = QUEUES_EXAMPLES)]
    Queues(QueuesArgs),
    /// Why a pod waits at the gate, or where and as what it was admitted.
    #[command(after_help = EXPLAIN_EXAMPLES)]
    Explain(ExplainArgs),
    /// The last handovers (reclaims) with their phase timings, victims and checkpoints.
    #[command(after_help = HANDOVERS_EXAMPLES)]
    Handovers(HandoversArgs),
    /// GPUs per node and resource: allocated, free, fragmented, and which queues hold them.
    #[command(after_help = TOP_EXAMPLES)]
    Top(TopArgs),
    /// Simulate policies without a cluster: placement on a trace, or quotas on a scenario.
    #[command(after_help = SIMULATE_EXAMPLES)]
    Simulate(SimulateArgs),
}

const SIMULATE_EXAMPLES: &str = "\
Examples:
  # Quota study: no isolation vs static quotas vs borrow-and-reclaim
  kubectl gpuqueue simulate --scenario examples/sim/day-night.yaml

  # Placement study on the Alibaba openb trace, FGD paper setup (seeds 42-51, 130% load)
  kubectl gpuqueue simulate --trace openb_node_list_gpu_node.csv openb_pod_list_default.csv

  # Try a quota change on the live cluster's nodes and queues before applying it
  kubectl gpuqueue simulate --from-cluster --scenario load.yaml --queue edited-queue.yaml";

const QUEUES_EXAMPLES: &str = "\
Examples:
  kubectl gpuqueue queues
  kubectl gpuqueue queues batch -o yaml";

const EXPLAIN_EXAMPLES: &str = "\
Examples:
  # Why does this pod wait? Or where was it admitted, and as guaranteed or borrowed?
  kubectl gpuqueue explain vllm-7d9c5-x2x8q -n batch";

const HANDOVERS_EXAMPLES: &str = "\
Examples:
  kubectl gpuqueue handovers
  kubectl gpuqueue handovers online -o json";

const TOP_EXAMPLES: &str = "\
FRAGMENTED is the node's free GPU capacity that the GPU pods in the cluster, as a mix of shapes
(FGD's typical pods), could not use: the measure gpuqueue's placement keeps low, and the one the
operator exports as gpuqueue_node_fragmented_gpus. It covers all the node's resources, so it is
shown on the node's first row.

Examples:
  kubectl gpuqueue top
  kubectl gpuqueue top -o json";

/// How to reach the cluster: kubectl's kubeconfig rules, which a kubectl plugin does not
/// inherit from kubectl's own flags.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// How long to wait for each answer of the API server, such as 10s or 1m.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people.
    #[default]
    Text,
    /// For scripts.
    Json,
    /// For scripts and people who like YAML.
    Yaml,
}

#[derive(Debug, Args)]
pub struct QueuesArgs {
    /// Only this queue (default: every queue).
    pub queue: Option<String>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The pod's name.
    pub pod: String,
    /// The pod's namespace (default: the kubeconfig context's namespace, else `default`).
    #[arg(short, long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Most events shown, newest last.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub events: usize,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct HandoversArgs {
    /// Only this queue's handovers (default: every queue's, each handover once).
    pub queue: Option<String>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Parses a Go-style duration (`30s`, `1m`, `500ms`), as kubectl's `--request-timeout` takes.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = gpuqueue_api::duration::parse(text)
        .map_err(|e| format!("{e}; expected a duration such as 30s or 1m"))?;
    if duration.is_negative() || Duration::from(duration).is_zero() {
        return Err(format!("{text:?}: must be longer than 0s"));
    }
    Ok(duration.into())
}

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Quota study: a scenario YAML (see examples/sim/).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "trace",
        required_unless_present = "trace"
    )]
    pub scenario: Option<PathBuf>,

    /// Placement study: a node list then one or more pod lists (openb CSV layout).
    #[arg(long, num_args = 2.., value_names = ["NODES.csv", "PODS.csv"])]
    pub trace: Vec<PathBuf>,

    /// Policies to compare, comma-separated. Placement: random, best-fit, gpu-packing, fgd,
    /// ours. Quotas: no-isolation, static, borrow. Default: all of the study's policies.
    #[arg(long, value_delimiter = ',', value_name = "POLICY")]
    pub policy: Vec<String>,

    /// Seeds: one number, a range such as 42-51, or a comma-separated list. Default: 42-51
    /// for placement, the scenario's seed for quotas.
    #[arg(long, value_name = "SEEDS")]
    pub seeds: Option<String>,

    /// Placement: arrived GPU request to reach, as a multiple of GPU capacity.
    #[arg(long, default_value_t = 1.3, value_name = "RATIO")]
    pub ratio: f64,

    /// Folder the report (markdown and SVG) is written to.
    #[arg(long, default_value = "gpuqueue-sim-report", value_name = "DIR")]
    pub out: PathBuf,

    /// Data folder for `$DATA/` paths in scenarios and for the FGD published results.
    /// Default: $GPUQUEUE_DATA_DIR, else a shared/data folder beside the current directory or
    /// a parent.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Replace the scenario's nodes and queues with the live cluster's (current kubeconfig
    /// context); the scenario still gives each queue's load.
    #[arg(long, conflicts_with = "trace")]
    pub from_cluster: bool,

    /// A proposed GpuQueue manifest (repeatable; multi-document YAML allowed): the study runs
    /// with the current queues and again with these replacing the ones of the same name.
    #[arg(long = "queue", value_name = "FILE", conflicts_with = "trace")]
    pub queues: Vec<PathBuf>,

    /// Do not draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// Parses `--seeds`: `42`, `42-51` or `42,45,50`.
pub fn parse_seeds(text: &str) -> Result<Vec<u64>, String> {
    let bad = || {
        format!(
            "--seeds {text:?}: expected a number, a range such as 42-51, or a list such as 42,45"
        )
    };
    let text = text.trim();
    if let Some((lo, hi)) = text.split_once('-') {
        let (lo, hi): (u64, u64) = (
            lo.trim().parse().map_err(|_| bad())?,
            hi.trim().parse().map_err(|_| bad())?,
        );
        if lo > hi || hi - lo >= 10_000 {
            return Err(format!(
                "--seeds {text:?}: a range must go up and hold at most 10000 seeds"
            ));
        }
        return Ok((lo..=hi).collect());
    }
    let seeds: Vec<u64> = text
        .split(',')
        .map(|s| s.trim().parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    if seeds.is_empty() {
        return Err(bad());
    }
    Ok(seeds)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn seeds() {
        assert_eq!(parse_seeds("42").unwrap(), vec![42]);
        assert_eq!(parse_seeds("42-45").unwrap(), vec![42, 43, 44, 45]);
        assert_eq!(parse_seeds("1, 5,9").unwrap(), vec![1, 5, 9]);
        assert!(parse_seeds("51-42").unwrap_err().contains("must go up"));
        assert!(parse_seeds("x").unwrap_err().contains("expected a number"));
    }

    #[test]
    fn one_study_at_a_time() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map_err(|e| e.to_string());
        assert!(parse(&["k", "simulate", "--scenario", "s.yaml"]).is_ok());
        assert!(parse(&["k", "simulate", "--trace", "n.csv", "p.csv", "q.csv"]).is_ok());
        let err = parse(&[
            "k",
            "simulate",
            "--scenario",
            "s.yaml",
            "--trace",
            "n.csv",
            "p.csv",
        ])
        .unwrap_err();
        assert!(err.contains("cannot be used with"), "{err}");
        let err = parse(&["k", "simulate", "--trace", "n.csv"]).unwrap_err();
        assert!(err.contains("2 values required"), "{err}");
        let err = parse(&["k", "simulate"]).unwrap_err();
        assert!(err.contains("--scenario"), "{err}");
        let err = parse(&[
            "k",
            "simulate",
            "--trace",
            "n.csv",
            "p.csv",
            "--from-cluster",
        ])
        .unwrap_err();
        assert!(err.contains("cannot be used with"), "{err}");
    }
}
