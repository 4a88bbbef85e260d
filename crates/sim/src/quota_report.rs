//! The quota study's report: the policies side by side, per-tenant waits, and charts of
//! utilisation and fragmentation over time and of the pending-time distribution.

use std::fmt::Write as _;
use std::time::Duration;

use crate::quota::{QuotaInput, QuotaRun};
use crate::report::{Chart, ReportError, Series, Table, cdf_points, line_chart, number};
use crate::stats::{MeanStd, human_duration, percentile, sorted};

/// A run with the label it has in the report (a policy, or current/proposed quotas).
#[derive(Clone, Debug)]
pub struct Labelled {
    /// Column label.
    pub label: String,
    /// The seed of the run.
    pub seed: u64,
    /// The run.
    pub run: QuotaRun,
}

/// What the arrivals are, for every report (the trace's own times are not replayed).
pub const ARRIVAL_PROCESS: &str = "Arrivals are synthetic (the openb trace's time columns are a sparse \
sample and cannot be replayed): online tenants run replicas kept by an autoscaler every `scaleEvery` \
at a target that follows a daily cosine between `troughReplicas` and `peakReplicas` (peak at \
`peakHour`, ±`jitter` noise), scale-down removing the newest replica first; batch tenants submit \
Poisson arrivals at `jobsPerHour` with run times from the scenario's duration model. Pod shapes \
are drawn from the scenario's trace filter (or fixed). Every policy sees the same arrivals.";

fn owners(run: &QuotaRun) -> (u64, u64) {
    let t = &run.metrics.tenants;
    (
        t.iter().map(|m| m.owner_requests).sum(),
        t.iter().map(|m| m.owner_over_budget).sum(),
    )
}

fn all_waits(run: &QuotaRun) -> Vec<f64> {
    sorted(
        run.metrics
            .tenants
            .iter()
            .flat_map(|t| t.waits.iter().copied())
            .collect(),
    )
}

fn secs(value: Option<f64>) -> String {
    value.map_or_else(
        || "—".to_owned(),
        |s| human_duration(Duration::from_secs_f64(s.max(0.0))),
    )
}

/// One row per run: the headline figures.
pub fn summary_table(runs: &[Labelled]) -> Table {
    let mut table = Table::new(&[
        "policy",
        "seed>",
        "util % avg>",
        "util % peak>",
        "frag % cap avg>",
        "owner requests>",
        "owners over budget>",
        "reclaims/h>",
        "evicted GPU-h>",
        "lost GPU-h>",
        "handover p50>",
        "handover p99>",
        "wait p50>",
        "wait p99>",
        "waiting at end>",
    ]);
    for r in runs {
        let run = &r.run;
        let (owner_requests, over) = owners(run);
        let waits = all_waits(run);
        let handovers = sorted(run.metrics.handovers.clone());
        let tenants = &run.metrics.tenants;
        table.row([
            r.label.clone(),
            r.seed.to_string(),
            format!("{:.1}", run.summary.utilisation_percent),
            format!("{:.1}", run.summary.peak_utilisation_percent),
            format!("{:.2}", run.summary.fragmentation_percent),
            owner_requests.to_string(),
            format!("{over} ({:.2}%)", run.summary.owner_over_budget_percent),
            format!("{:.2}", run.summary.reclaims_per_hour),
            format!(
                "{:.1}",
                tenants.iter().map(|t| t.evicted_gpu_hours).sum::<f64>()
            ),
            format!(
                "{:.1}",
                tenants.iter().map(|t| t.lost_gpu_hours).sum::<f64>()
            ),
            secs(percentile(&handovers, 50.0)),
            secs(percentile(&handovers, 99.0)),
            secs(percentile(&waits, 50.0)),
            secs(percentile(&waits, 99.0)),
            tenants
                .iter()
                .map(|t| t.still_pending)
                .sum::<u64>()
                .to_string(),
        ]);
    }
    table
}

/// Mean ± spread over seeds of the headline figures, per label.
pub fn seeds_table(runs: &[Labelled]) -> Table {
    let mut table = Table::new(&[
        "policy",
        "seeds>",
        "util % avg>",
        "util % peak>",
        "owners over budget %>",
        "reclaims/h>",
    ]);
    let mut labels: Vec<&str> = Vec::new();
    for r in runs {
        if !labels.contains(&r.label.as_str()) {
            labels.push(&r.label);
        }
    }
    for label in labels {
        let group: Vec<&QuotaRun> = runs
            .iter()
            .filter(|r| r.label == label)
            .map(|r| &r.run)
            .collect();
        let of =
            |f: fn(&QuotaRun) -> f64| MeanStd::of(&group.iter().map(|r| f(r)).collect::<Vec<_>>());
        let show = |m: MeanStd, digits: usize| format!("{:.digits$} ± {:.digits$}", m.mean, m.std);
        table.row([
            label.to_owned(),
            group.len().to_string(),
            show(of(|r| r.summary.utilisation_percent), 1),
            show(of(|r| r.summary.peak_utilisation_percent), 1),
            show(of(|r| r.summary.owner_over_budget_percent), 2),
            show(of(|r| r.summary.reclaims_per_hour), 2),
        ]);
    }
    table
}

/// Over-budget owner requests by cause (see [`crate::quota_metrics::OverBudgetCause`]), one
/// column per label, summed over seeds; `None` when no run has any.
pub fn causes_table(runs: &[Labelled]) -> Option<Table> {
    let mut labels: Vec<&str> = Vec::new();
    let mut causes = std::collections::BTreeSet::new();
    for r in runs {
        if !labels.contains(&r.label.as_str()) {
            labels.push(&r.label);
        }
        causes.extend(r.run.metrics.over_budget_causes().into_keys());
    }
    if causes.is_empty() {
        return None;
    }
    let headers: Vec<String> = std::iter::once("cause".to_owned())
        .chain(labels.iter().map(|l| format!("{l}>")))
        .collect();
    let mut table = Table::new(&headers);
    for cause in causes {
        let mut row = vec![cause.to_string()];
        for label in &labels {
            let n: u64 = runs
                .iter()
                .filter(|r| r.label == *label)
                .filter_map(|r| r.run.metrics.over_budget_causes().get(&cause).copied())
                .sum();
            row.push(n.to_string());
        }
        table.row(row);
    }
    Some(table)
}

/// The over-budget causes table with what it counts, when any owner went over budget.
fn causes_paragraph(out: &mut String, runs: &[Labelled]) {
    if let Some(causes) = causes_table(runs) {
        let _ = writeln!(
            out,
            "Owner requests over budget by cause, over every seed: what the first admission cycle \
             that saw the pod decided (a reclaim or an admission at once, else the core's wait \
             reason; for `NoRoom`, the reclaim planner's reason after the slash).\n\n{}",
            causes.to_markdown()
        );
    }
}

/// How many victims were spared at their eviction, over every seed, where any reclaim ran.
fn spared_paragraph(out: &mut String, runs: &[Labelled]) {
    let reclaims: u64 = runs.iter().map(|r| r.run.metrics.reclaims).sum();
    if reclaims == 0 {
        return;
    }
    let spared: u64 = runs.iter().map(|r| r.run.metrics.spared_victims).sum();
    let requeued: u64 = runs.iter().map(|r| r.run.counts.requeued).sum();
    let _ = writeln!(
        out,
        "Victims spared at their eviction, over every seed: {spared} of the victims of {reclaims} \
         reclaims (their queue shrank during the checkpoint and no longer borrowed them, so the \
         operator does not evict them); {requeued} owners requeued for it, each planned anew and \
         counted from its first creation.\n"
    );
}

/// One row per (tenant, run): quota, waits and evictions.
pub fn tenant_table(input: &QuotaInput, runs: &[Labelled]) -> Table {
    let mut table = Table::new(&[
        "tenant",
        "guaranteed>",
        "burstable>",
        "policy",
        "wait p50>",
        "wait p99>",
        "owner requests>",
        "over budget>",
        "waiting at end>",
        "evictions>",
        "evicted GPU-h>",
    ]);
    for (i, queue) in input.queues.iter().enumerate() {
        let quota = queue.quota_of(&crate::convert::gpu_resource());
        for r in runs {
            let Some(t) = r.run.metrics.tenants.get(i) else {
                continue;
            };
            table.row([
                queue.name.clone(),
                quota.map_or_else(String::new, |q| q.guaranteed.to_string()),
                quota.map_or_else(String::new, |q| q.burstable.to_string()),
                r.label.clone(),
                secs(t.wait_percentile(50.0)),
                secs(t.wait_percentile(99.0)),
                t.owner_requests.to_string(),
                t.owner_over_budget.to_string(),
                t.still_pending.to_string(),
                t.evictions.to_string(),
                format!("{:.1}", t.evicted_gpu_hours),
            ]);
        }
    }
    table
}

/// The charts: utilisation and fragmentation over time per run, and the CDF of waits.
pub fn charts(name: &str, runs: &[Labelled]) -> Result<Vec<(String, String)>, ReportError> {
    let over_time = |value: fn(&crate::quota_metrics::Sample) -> f64| -> Vec<Series> {
        runs.iter()
            .map(|r| Series {
                name: r.label.clone(),
                points: r
                    .run
                    .metrics
                    .samples
                    .iter()
                    .map(|s| (s.hours, value(s)))
                    .collect(),
                dashed: false,
            })
            .collect()
    };
    let utilisation = line_chart(
        &Chart {
            title: format!("GPU utilisation over time, {name}"),
            x_label: "hours since start".into(),
            y_label: "allocated GPUs, % of capacity".into(),
            y_range: Some((0.0, 100.0)),
            log_x: false,
        },
        &over_time(|s| s.utilisation_percent),
    )?;
    let fragmentation = line_chart(
        &Chart {
            title: format!("Fragmentation over time, {name}"),
            x_label: "hours since start".into(),
            y_label: "fragmented GPU (FGD), % of capacity".into(),
            y_range: None,
            log_x: false,
        },
        &over_time(|s| s.fragmentation_percent),
    )?;
    // Waits below 10 ms are drawn at 10 ms, so the log axis keeps every pod.
    let waits: Vec<Series> = runs
        .iter()
        .map(|r| Series {
            name: r.label.clone(),
            points: cdf_points(
                &all_waits(&r.run)
                    .into_iter()
                    .map(|w| w.max(0.01))
                    .collect::<Vec<_>>(),
            ),
            dashed: false,
        })
        .collect();
    let pending = line_chart(
        &Chart {
            title: format!("Pending time distribution, {name}"),
            x_label: "seconds from creation to binding (log)".into(),
            y_label: "% of pods bound within".into(),
            y_range: Some((0.0, 100.0)),
            log_x: true,
        },
        &waits,
    )?;
    Ok(vec![
        (format!("quota-{name}-utilisation.svg"), utilisation),
        (format!("quota-{name}-fragmentation.svg"), fragmentation),
        (format!("quota-{name}-pending.svg"), pending),
    ])
}

/// The ratio of the first run labelled `numerator` to the first labelled `denominator`.
pub fn utilisation_ratio(runs: &[Labelled], numerator: &str, denominator: &str) -> Option<f64> {
    let find = |label: &str| {
        let group: Vec<f64> = runs
            .iter()
            .filter(|r| r.label == label)
            .map(|r| r.run.summary.utilisation_percent)
            .collect();
        (!group.is_empty()).then(|| MeanStd::of(&group).mean)
    };
    let (n, d) = (find(numerator)?, find(denominator)?);
    (d > 0.0).then(|| n / d)
}

/// The whole report as markdown.
pub fn markdown(
    input: &QuotaInput,
    description: &str,
    runs: &[Labelled],
    elapsed: Option<Duration>,
    chart_files: &[String],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Quota study: `{}`\n", input.name);
    if !description.is_empty() {
        let _ = writeln!(out, "{description}\n");
    }
    let hours = input.end.since(input.warmup).as_secs_f64() / 3600.0;
    #[allow(clippy::cast_precision_loss)]
    let capacity = input.capacity_milli() as f64 / 1000.0;
    let _ = writeln!(
        out,
        "{} tenants on {} nodes ({capacity:.0} GPUs); {:.0} h simulated, the first {:.0} h excluded as warm-up, \
         so every figure covers {hours:.0} h. {ARRIVAL_PROCESS}\n",
        input.queues.len(),
        input.nodes.len(),
        input.end.as_hours_f64(),
        input.warmup.as_hours_f64(),
    );
    let _ = writeln!(
        out,
        "Definitions: utilisation is allocated GPUs ÷ capacity, time-averaged (peak: its maximum); a \
         pod's wait runs from its creation to its binding (pods still waiting at the end count with \
         their wait so far); an owner request is a pod that fits within its tenant's guarantee when \
         it arrives, after what the tenant holds and what its pods already waiting ask for \
         (the queue admits those first), over budget when it waits longer than its queue's handover budget; evicted \
         GPU-hours are GPUs × run time of evicted pods, lost GPU-hours the part no checkpoint saved; \
         fragmentation is the FGD measure against the scenario's own pod shapes (95% popularity).\n"
    );
    let classes = input.mix.classes();
    let single: f64 = classes
        .iter()
        .filter(|(shape, _)| {
            shape
                .gpu
                .as_ref()
                .is_some_and(|g| g.count == 1 && g.milli_per_device == 1000)
        })
        .map(|(_, share)| share)
        .sum();
    if single > 0.9 {
        let _ = writeln!(
            out,
            "The fragmentation measure's typical pods are {} shapes, {:.0}% of them one whole GPU, which \
             any free GPU can host: the measure stays near zero here, and multi-GPU pods blocked \
             for want of a whole node show in their owners' waits instead.\n",
            classes.len(),
            100.0 * single
        );
    }
    let _ = writeln!(out, "## Policies\n\n{}", summary_table(runs).to_markdown());
    let seeds: std::collections::BTreeSet<u64> = runs.iter().map(|r| r.seed).collect();
    if seeds.len() > 1 {
        let _ = writeln!(out, "Over seeds:\n\n{}", seeds_table(runs).to_markdown());
    }
    if let Some(ratio) = utilisation_ratio(runs, "borrow-and-reclaim", "static quotas") {
        let _ = writeln!(
            out,
            "Borrow-and-reclaim keeps {ratio:.2}x the utilisation of static quotas.\n"
        );
    }
    causes_paragraph(&mut out, runs);
    spared_paragraph(&mut out, runs);
    let first_seed = seeds.iter().next().copied().unwrap_or_default();
    let first: Vec<Labelled> = runs
        .iter()
        .filter(|r| r.seed == first_seed)
        .cloned()
        .collect();
    let _ = writeln!(
        out,
        "## Tenants (seed {first_seed})\n\n{}",
        tenant_table(input, &first).to_markdown()
    );
    if !chart_files.is_empty() {
        let _ = writeln!(out, "## Charts (seed {first_seed})\n");
        for file in chart_files {
            let _ = writeln!(out, "![{file}]({file})\n");
        }
    }
    if let Some(elapsed) = elapsed {
        let events: u64 = runs.iter().map(|r| r.run.events).sum();
        let secs = elapsed.as_secs_f64();
        #[allow(clippy::cast_precision_loss)]
        let rate = if secs > 0.0 {
            events as f64 / secs
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "## Speed\n\n{} runs, {events} events in {secs:.1} s: {} events/s.\n",
            runs.len(),
            number(Some(rate), 0)
        );
    }
    out
}
