//! `peers.json` (every sample) and `peers.md` (one table, gpuqueue and Kueue side by side,
//! targets beside the figures).

use std::fmt::Write as _;

use gpuqueue_e2e::{QuotaReport, repo_root};

use super::scenarios::{Admission, Burst, Reclaim};
use super::side::System;
use super::{Knobs, percentile};

/// One system's quota sampling over one cluster's scenarios.
#[derive(Debug, serde::Serialize)]
pub struct Quota {
    pub system: System,
    pub scenarios: &'static str,
    pub report: QuotaReport,
}

impl Quota {
    pub fn of(system: System, scenarios: &'static str, report: QuotaReport) -> Self {
        Self {
            system,
            scenarios,
            report,
        }
    }
}

/// Everything measured.
#[derive(Debug, serde::Serialize)]
pub struct Results {
    pub knobs: Knobs,
    /// `/proc/loadavg` before and after: how busy the machine was.
    pub load_before: String,
    pub load_after: String,
    pub reclaims: Vec<Reclaim>,
    pub bursts: Vec<Burst>,
    pub admissions: Vec<Admission>,
    pub quota: Vec<Quota>,
}

const COMMAND: &str = "e2e/scripts/build-tools.sh --peers && make bench-peers";

/// [`COMMAND`] with the `BENCH_*` knobs this run was given.
fn reproduce() -> String {
    let mut knobs: Vec<String> = std::env::vars()
        .filter(|(name, _)| name.starts_with("BENCH_"))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    knobs.sort();
    if knobs.is_empty() {
        COMMAND.to_owned()
    } else {
        COMMAND.replace("make", &format!("{} make", knobs.join(" ")))
    }
}

fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values
}

fn ms(v: f64) -> String {
    if v.is_nan() {
        "—".to_owned()
    } else {
        format!("{v:.0} ms")
    }
}

fn reclaims_of<'a>(
    results: &'a Results,
    system: System,
    mode: &'a str,
) -> impl Iterator<Item = &'a Reclaim> {
    results
        .reclaims
        .iter()
        .filter(move |r| r.system == system && r.mode == mode)
}

/// Writes both files and prints the table.
pub fn write(results: &Results) {
    let dir = std::env::var_os("BENCH_RESULTS").map_or_else(
        || repo_root().join("e2e/results"),
        |dir| repo_root().join(dir),
    );
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("peers.json"),
        serde_json::to_string_pretty(results).unwrap(),
    )
    .unwrap();
    let table = markdown(results);
    std::fs::write(dir.join("peers.md"), &table).unwrap();
    println!("{table}");
    println!("written to {}", dir.display());
}

/// The rows of the bursts of `pods` owner pods: last owner bound, and pods evicted against the
/// minimum.
fn burst_rows(out: &mut String, all: &[Burst], pods: usize) {
    let bursts = |system| -> (Vec<f64>, usize, usize) {
        let of: Vec<&Burst> = all
            .iter()
            .filter(|b| b.system == system && b.owner_pods == pods)
            .collect();
        (
            sorted(of.iter().map(|b| b.last_bound_ms)),
            of.iter().map(|b| b.evicted).sum(),
            of.iter().map(|b| b.minimum).sum(),
        )
    };
    let (gb, ge, gm) = bursts(System::Gpuqueue);
    let (qb, qe, qm) = bursts(System::Kueue);
    let _ = writeln!(
        out,
        "| burst 2 → {} replicas | last owner bound, median / max | {} / {} | {} / {} | — |",
        2 + pods,
        ms(percentile(&gb, 0.5)),
        ms(gb.last().copied().unwrap_or(f64::NAN)),
        ms(percentile(&qb, 0.5)),
        ms(qb.last().copied().unwrap_or(f64::NAN)),
    );
    let _ = writeln!(
        out,
        "| burst of {pods} | pods evicted / minimum, all rounds | {ge} / {gm} | {qe} / {qm} | equal |"
    );
}

#[allow(clippy::too_many_lines)] // one table, row by row
fn markdown(results: &Results) -> String {
    let k = &results.knobs;
    let mut out = format!(
        "# gpuqueue and Kueue on the same cluster\n\n\
         Identical fresh clusters per system ({}), rounds alternating which system \
         goes first; times from the request sent to this process's watch seeing the pod bound. \
         Reclaim and burst: {} nodes × 8 GPUs, {} reclaims, {} bursts of each of {:?} owner \
         pods, each on a settled cluster. \
         {} Operator build: {}. Load average before: {}; after: {}.\n\n\
         Reproduce: `{}`.\n\n",
        if k.node_behaviour == "kubelet" {
            "KWOK stages that behave like kubelets: a victim exits within its 1 s grace period, \
             its end seen at the kubelet's next 1 s relist"
        } else {
            "KWOK fast stages"
        },
        k.nodes,
        k.reclaims,
        k.burst_rounds,
        k.burst_pods,
        if k.pods == 0 {
            "Admission: not run (`BENCH_PODS=0`).".to_owned()
        } else {
            format!(
                "Admission: {} one-GPU pods over 4 tenants on {} nodes × 8 GPUs, {} creators, {} \
                 rounds.",
                k.pods, k.admission_nodes, k.creators, k.rounds
            )
        },
        k.operator_build,
        results.load_before,
        results.load_after,
        reproduce(),
    );
    let reclaim =
        |system, mode| sorted(reclaims_of(results, system, mode).map(|r| r.owner_bound_ms));
    #[allow(clippy::cast_precision_loss)]
    let victims =
        |system, mode| sorted(reclaims_of(results, system, mode).map(|r| r.victims as f64));
    let (g, q) = (
        reclaim(System::Gpuqueue, "none"),
        reclaim(System::Kueue, "none"),
    );
    let gc = reclaim(System::Gpuqueue, "vllm 1.2 s");
    let (gv, qv, gcv) = (
        victims(System::Gpuqueue, "none"),
        victims(System::Kueue, "none"),
        victims(System::Gpuqueue, "vllm 1.2 s"),
    );
    out.push_str(
        "| scenario | figure | gpuqueue | Kueue | target |\n| --- | --- | --- | --- | --- |\n",
    );
    let _ = writeln!(
        out,
        "| reclaim, no checkpoint | owner bound p50 / p99 | {} / {} | {} / {} | gpuqueue p99 ≤ Kueue's |",
        ms(percentile(&g, 0.5)),
        ms(percentile(&g, 0.99)),
        ms(percentile(&q, 0.5)),
        ms(percentile(&q, 0.99)),
    );
    let _ = writeln!(
        out,
        "| reclaim, gpuqueue's 1.2 s vLLM checkpoint | owner bound p50 / p99 | {} / {} | no checkpoint in Kueue | p99 < 3000 ms |",
        ms(percentile(&gc, 0.5)),
        ms(percentile(&gc, 0.99)),
    );
    let victims_cell = |v: &[f64]| {
        let over = v.iter().filter(|&&n| n > 1.0).count();
        format!(
            "max {:.0}, {over} of {} over 1",
            v.last().copied().unwrap_or(f64::NAN),
            v.len()
        )
    };
    let _ = writeln!(
        out,
        "| reclaim | victims per reclaim (1 is minimal) | {} (checkpoint: {}) | {} | 1, no over-eviction |",
        victims_cell(&gv),
        victims_cell(&gcv),
        victims_cell(&qv),
    );
    for &pods in &k.burst_pods {
        burst_rows(&mut out, &results.bursts, pods);
    }
    let best = |system| {
        results
            .admissions
            .iter()
            .filter(|a| a.system == system)
            .max_by(|a, b| a.pods_per_second.total_cmp(&b.pods_per_second))
    };
    if let (Some(ga), Some(qa)) = (best(System::Gpuqueue), best(System::Kueue)) {
        let _ = writeln!(
            out,
            "| admission (best round) | pods/s to bound | {:.1} | {:.1} | gpuqueue ≥ 3× Kueue (here {:.1}×) |",
            ga.pods_per_second,
            qa.pods_per_second,
            ga.pods_per_second / qa.pods_per_second
        );
        let bound = |system| {
            results
                .admissions
                .iter()
                .filter(|a| a.system == system)
                .map(|a| format!("{}{}", a.bound, if a.stalled { " (stalled)" } else { "" }))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "| admission | pods bound per round (of {} that fit) | {} | {} | all |",
            ga.pods.min(k.admission_nodes * 8),
            bound(System::Gpuqueue),
            bound(System::Kueue),
        );
        let _ = writeln!(
            out,
            "| admission | gate released p50 / p99 | {} / {} | {} / {} | — |",
            ms(ga.released_p50_ms),
            ms(ga.released_p99_ms),
            ms(qa.released_p50_ms),
            ms(qa.released_p99_ms),
        );
        let _ = writeln!(
            out,
            "| admission | bound p50 / p99 | {} / {} | {} / {} | — |",
            ms(ga.bind_p50_ms),
            ms(ga.bind_p99_ms),
            ms(qa.bind_p50_ms),
            ms(qa.bind_p99_ms),
        );
        let _ = writeln!(
            out,
            "| admission | API-server write requests ({} pods) | {:.0} | {:.0} | — |",
            ga.pods, ga.api_writes_total, qa.api_writes_total
        );
    }
    for quota in &results.quota {
        let r = &quota.report;
        let cell = format!("{} ({} ms)", r.violations.len(), r.longest_deficit_ms);
        let (g, q) = match quota.system {
            System::Gpuqueue => (cell, String::new()),
            System::Kueue => (String::new(), cell),
        };
        let _ = writeln!(
            out,
            "| quota honesty, {} | violations in {} samples (longest deficit) | {g} | {q} | 0 for gpuqueue |",
            quota.scenarios, r.samples
        );
    }
    out.push_str(
        "\nA deficit is an owner holding less than its guarantee while asking for it and while \
         another tenant holds more than its own guarantee (GPUs a reclaim should give back); one \
         that lasts longer than the 3 s budget, or any moment above a ceiling, is a violation. \
         Kueue has no budget; it is held to gpuqueue's.\n",
    );
    admission_writes(&mut out, results);
    out
}

/// The API server's writes by verb and resource, per admission run.
fn admission_writes(out: &mut String, results: &Results) {
    if results.admissions.is_empty() {
        return;
    }
    let keys: std::collections::BTreeSet<&String> = results
        .admissions
        .iter()
        .flat_map(|a| a.api_writes.keys())
        .collect();
    out.push_str(
        "\nAdmission runs, write requests by verb and resource:\n\n| system | round | pods/s |",
    );
    for key in &keys {
        let _ = write!(out, " {key} |");
    }
    out.push_str("\n| --- | --- | --- |");
    out.push_str(&" --- |".repeat(keys.len()));
    for a in &results.admissions {
        let _ = write!(
            out,
            "\n| {} | {} | {:.1} |",
            a.system.name(),
            a.round,
            a.pods_per_second
        );
        for key in &keys {
            let _ = write!(
                out,
                " {:.0} |",
                a.api_writes.get(*key).copied().unwrap_or(0.0)
            );
        }
    }
    out.push('\n');
}
