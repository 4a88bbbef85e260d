//! `e2e/results/scale.json` and `scale.md`: what the scale benchmark measured.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use gpuqueue_e2e::repo_root;

use super::Shape;
use super::memory::{Sample, Summary, summary};

/// The targets of issue 16.
const RSS_TARGET_MIB: f64 = 200.0;
const PASS_P99_TARGET_MS: f64 = 50.0;

/// A phase's admission passes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PassStats {
    /// Passes the histogram counted.
    pub passes: f64,
    pub histogram_p50_ms: Option<f64>,
    pub histogram_p99_ms: Option<f64>,
    /// Passes the debug log recorded in the phase's window, and their exact figures.
    pub logged: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub mean_ms: Option<f64>,
    /// The same passes' CPU time (the pass thread's clock): what the operator's own work took,
    /// without the time the machine's other processes held the CPU.
    pub cpu_p50_ms: Option<f64>,
    pub cpu_p99_ms: Option<f64>,
    pub cpu_max_ms: Option<f64>,
    /// Passes that brought the last snapshot up to date (the rest built one).
    pub updated: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    pub name: &'static str,
    pub seconds: f64,
    pub passes: PassStats,
    /// The machine's 1-minute load average at the phase's end: pass times depend on it.
    pub load_average: Option<f64>,
}

/// The 1-minute load average (`/proc/loadavg`).
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The handover queue 0's pod started, from the operator's `gpuqueue_handover_seconds`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reclaim {
    pub plan_ms: Option<f64>,
    pub owner_bound_ms: Option<f64>,
}

/// From the second operator's start on the full cluster.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ColdStart {
    pub ready_seconds: f64,
    pub leader_seconds: f64,
    pub first_pass_seconds: f64,
    pub first_pass_ms: Option<f64>,
}

/// Everything one run measured.
#[derive(Debug, serde::Serialize)]
pub struct Scale {
    pub shape: Shape,
    pub cluster_seconds: f64,
    pub phases: Vec<Phase>,
    /// From every pod bound until the API server took no more writes (KWOK's pod statuses,
    /// the operator's events): the load's tail, before the rest window.
    pub quiet_seconds: f64,
    pub rest_seconds: usize,
    /// Requests the API server answered in the rest window, by verb and resource.
    pub rest_requests: BTreeMap<String, f64>,
    /// The same in an equally long window with the operator stopped.
    pub stopped_requests: BTreeMap<String, f64>,
    pub reclaim: Reclaim,
    pub cold: ColdStart,
    /// Memory samples of the first operator process (load to its stop) and of the second.
    pub first_run: Vec<Sample>,
    pub second_run: Vec<Sample>,
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |v| format!("{v:.1} ms"))
}

fn mib(summary: Option<Summary>) -> (String, String) {
    summary.map_or_else(
        || ("—".to_owned(), "—".to_owned()),
        |s| {
            (
                format!("{:.1} MiB", s.median_rss_mib),
                format!("{:.1} MiB", s.peak_hwm_mib),
            )
        },
    )
}

/// Writes both files and prints the table.
#[allow(clippy::too_many_lines)] // one table after the other
pub fn write(scale: &Scale) {
    let rest = summary(&scale.first_run, Some("rest"));
    let peak = summary(&scale.first_run, None);
    let cold = summary(&scale.second_run, None);
    let churn = scale.phases.iter().find(|p| p.name == "churn");
    let memory = |s: Option<Summary>| s.map(|s| serde_json::to_value(s).unwrap());
    #[allow(clippy::cast_precision_loss)]
    let seconds = scale.rest_seconds as f64;
    let rate = |requests: &BTreeMap<String, f64>| requests.values().sum::<f64>() / seconds;
    let json = serde_json::json!({
        "shape": scale.shape, "cluster_start_seconds": scale.cluster_seconds,
        "memory": {"rest": memory(rest), "whole_run": memory(peak), "after_cold_start": memory(cold)},
        "phases": scale.phases,
        "rest": {"seconds": scale.rest_seconds, "quiet_after_load_seconds": scale.quiet_seconds,
            "requests_per_second_with_operator": rate(&scale.rest_requests),
            "requests_per_second_operator_stopped": rate(&scale.stopped_requests),
            "requests_with_operator": scale.rest_requests,
            "requests_operator_stopped": scale.stopped_requests},
        "reclaim": scale.reclaim, "cold_start": scale.cold,
        "targets": {"rss_mib": RSS_TARGET_MIB, "pass_p99_ms": PASS_P99_TARGET_MS},
        "samples": {"first_operator": scale.first_run, "second_operator": scale.second_run},
    });
    let dir = repo_root().join("e2e/results");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("scale.json"),
        serde_json::to_string_pretty(&json).unwrap(),
    )
    .unwrap();

    let s = &scale.shape;
    let (rest_rss, rest_hwm) = mib(rest);
    let (_, run_hwm) = mib(peak);
    let (cold_rss, cold_hwm) = mib(cold);
    let mut md = format!(
        "# Scale: {} KWOK nodes × 8 GPUs, {} queues, {} pods ({} one-GPU, {} CPU-only)\n\n\
         Release operator, `make bench-scale`; control plane up in {:.0} s. The rest window \
         starts when the API server has taken no write but the Lease's for 5 s: {:.0} s after \
         every pod was bound.\n\n\
         | figure | value | target |\n| --- | --- | --- |\n\
         | operator RSS at rest (median VmRSS) | {rest_rss} | < {RSS_TARGET_MIB:.0} MiB |\n\
         | operator peak (VmHWM, load to stop) | {run_hwm} | < {RSS_TARGET_MIB:.0} MiB |\n\
         | restarted operator: RSS after its first pass / peak | {cold_rss} / {cold_hwm} | |\n\
         | admission pass on the full cluster (churn) p50 / p99, log | {} / {} | p99 < {PASS_P99_TARGET_MS:.0} ms |\n\
         | the same from the operator's histogram | {} / {} | |\n\
         | the same passes' CPU time (pass thread), log | {} / {} | |\n\
         | reclaim: plan phase / owner bound | {} / {} | |\n\
         | cold start: ready / leading / first pass done | {:.1} s / {:.1} s / {:.1} s (first pass {}) | |\n\
         | API requests at rest, operator running / stopped | {:.2}/s / {:.2}/s | ~0 |\n\n",
        s.nodes,
        s.queues,
        s.gpu_pods + s.cpu_pods,
        s.gpu_pods,
        s.cpu_pods,
        scale.cluster_seconds,
        scale.quiet_seconds,
        ms(churn.and_then(|c| c.passes.p50_ms)),
        ms(churn.and_then(|c| c.passes.p99_ms)),
        ms(churn.and_then(|c| c.passes.histogram_p50_ms)),
        ms(churn.and_then(|c| c.passes.histogram_p99_ms)),
        ms(churn.and_then(|c| c.passes.cpu_p50_ms)),
        ms(churn.and_then(|c| c.passes.cpu_p99_ms)),
        ms(scale.reclaim.plan_ms),
        ms(scale.reclaim.owner_bound_ms),
        scale.cold.ready_seconds,
        scale.cold.leader_seconds,
        scale.cold.first_pass_seconds,
        ms(scale.cold.first_pass_ms),
        rate(&scale.rest_requests),
        rate(&scale.stopped_requests),
    );
    let _ = write!(
        md,
        "Operator RSS at rest {rest_rss} (its VmHWM by then {rest_hwm}).\n\n\
         Admission passes by phase (exact, from the debug log; histogram figures interpolated within its power-of-two buckets):\n\n\
         | phase | seconds | passes | snapshot updated | p50 | p99 | max | mean | histogram p50 | histogram p99 | CPU p50 | CPU p99 | CPU max | load average (1 min, {} cores) |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    for phase in &scale.phases {
        let p = &phase.passes;
        let _ = writeln!(
            md,
            "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            phase.name,
            phase.seconds,
            p.logged,
            p.updated,
            ms(p.p50_ms),
            ms(p.p99_ms),
            ms(p.max_ms),
            ms(p.mean_ms),
            ms(p.histogram_p50_ms),
            ms(p.histogram_p99_ms),
            ms(p.cpu_p50_ms),
            ms(p.cpu_p99_ms),
            ms(p.cpu_max_ms),
            phase
                .load_average
                .map_or_else(|| "—".to_owned(), |l| format!("{l:.2}")),
        );
    }
    let _ = write!(
        md,
        "\nRequests the API server answered in {} s at rest, by verb and resource:\n\n\
         | request | operator running | operator stopped |\n| --- | --- | --- |\n",
        scale.rest_seconds
    );
    let keys: std::collections::BTreeSet<&String> = scale
        .rest_requests
        .keys()
        .chain(scale.stopped_requests.keys())
        .collect();
    for key in keys {
        let count = |m: &BTreeMap<String, f64>| m.get(key).copied().unwrap_or(0.0);
        let _ = writeln!(
            md,
            "| {key} | {:.0} | {:.0} |",
            count(&scale.rest_requests),
            count(&scale.stopped_requests)
        );
    }
    std::fs::write(dir.join("scale.md"), &md).unwrap();
    println!("{md}");
    println!("written to {}", dir.display());
}
