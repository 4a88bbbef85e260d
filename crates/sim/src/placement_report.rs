//! The placement study's report: tables of allocation and fragmentation at 100% and at the
//! final arrived load, ours next to the FGD authors' published values, and charts over load.

use std::fmt::Write as _;
use std::time::Duration;

use crate::placement::{PlacementPolicy, PlacementRun};
use crate::reference::{MAX_ARRIVED_PERCENT, Metric, Published};
use crate::report::{Chart, ReportError, Series, Table, line_chart, number};
use crate::stats::MeanStd;

/// One metric at one arrived level: ours over seeds, and the published value if there is one.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cell {
    /// Ours, over seeds.
    pub ours: MeanStd,
    /// Published, over seeds 42–51.
    pub published: Option<MeanStd>,
}

/// A (trace, policy) row of the study.
#[derive(Clone, Debug)]
pub struct Summary {
    /// The trace.
    pub trace: String,
    /// The policy.
    pub policy: PlacementPolicy,
    /// Seeds run.
    pub seeds: usize,
    /// The final arrived level (130 for the paper's setup).
    pub end_level: usize,
    /// GPU allocation, % of capacity, at 100% and at the end.
    pub allocation: [Cell; 2],
    /// Fragmentation, % of capacity, at 100% and at the end.
    pub fragmentation_of_capacity: [Cell; 2],
    /// Fragmentation, % of idle GPU, at 100% and at the end.
    pub fragmentation_of_idle: [Cell; 2],
    /// Tasks that fit nowhere, per run.
    pub failed: MeanStd,
    /// Tasks submitted, per run.
    pub submitted: MeanStd,
    /// FGD's published allocation and fragmentation (% of capacity) at the end on this trace:
    /// the reference the study's goal is stated against.
    pub published_fgd_end: Option<(MeanStd, MeanStd)>,
}

impl Summary {
    /// Unallocated GPUs at the end (mean over seeds), given the trace's capacity.
    pub fn unallocated_gpus(&self, capacity_gpus: u64) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let capacity = capacity_gpus as f64;
        capacity * (100.0 - self.allocation[1].ours.mean) / 100.0
    }
}

/// Groups runs by (trace, policy) in first-seen order and summarises them.
pub fn summarise(runs: &[PlacementRun], published: Option<&Published>) -> Vec<Summary> {
    let mut keys: Vec<(String, PlacementPolicy)> = Vec::new();
    for run in runs {
        let key = (run.trace.clone(), run.policy);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(trace, policy)| {
            let group: Vec<&PlacementRun> = runs
                .iter()
                .filter(|r| r.trace == trace && r.policy == policy)
                .collect();
            let end_level = group
                .iter()
                .filter_map(|r| r.curves.last_level())
                .min()
                .unwrap_or(MAX_ARRIVED_PERCENT);
            let cell = |metric: Metric, level: usize| {
                let values: Vec<f64> = group
                    .iter()
                    .filter_map(|r| {
                        let curve = match metric {
                            Metric::Allocation => &r.curves.allocation,
                            Metric::FragmentationOfCapacity => &r.curves.fragmentation_of_capacity,
                            Metric::FragmentationOfIdle => &r.curves.fragmentation_of_idle,
                        };
                        curve.get(level).copied().flatten()
                    })
                    .collect();
                Cell {
                    ours: MeanStd::of(&values),
                    published: policy
                        .published_name()
                        .and_then(|name| published.and_then(|p| p.at(metric, &trace, name, level))),
                }
            };
            let both = |metric| [cell(metric, 100), cell(metric, end_level)];
            #[allow(clippy::cast_precision_loss)]
            let per_run = |f: fn(&PlacementRun) -> usize| {
                MeanStd::of(&group.iter().map(|r| f(r) as f64).collect::<Vec<_>>())
            };
            let published_fgd_end = published.and_then(|p| {
                Some((
                    p.at(Metric::Allocation, &trace, "06-FGD", end_level)?,
                    p.at(Metric::FragmentationOfCapacity, &trace, "06-FGD", end_level)?,
                ))
            });
            Summary {
                published_fgd_end,
                seeds: group.len(),
                end_level,
                allocation: both(Metric::Allocation),
                fragmentation_of_capacity: both(Metric::FragmentationOfCapacity),
                fragmentation_of_idle: both(Metric::FragmentationOfIdle),
                failed: per_run(|r| r.failed),
                submitted: per_run(|r| r.submitted),
                trace,
                policy,
            }
        })
        .collect()
}

fn ours(cell: &Cell) -> String {
    if cell.ours.n == 0 {
        return "—".into();
    }
    format!("{:.2} ± {:.2}", cell.ours.mean, cell.ours.std)
}

fn published(cell: &Cell) -> String {
    number(cell.published.map(|p| p.mean), 2)
}

/// How long the runs took on the wall clock, measured by the caller.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Wall time of all runs.
    pub elapsed: Duration,
    /// Threads used.
    pub threads: usize,
}

/// The headline table for one trace: every policy at 100% and at the end, ours and published.
pub fn trace_table(summaries: &[Summary], trace: &str, capacity_gpus: u64) -> Table {
    let mut table = Table::new(&[
        "policy",
        "alloc % @100>",
        "published>",
        "alloc % @end>",
        "published>",
        "unallocated GPUs @end>",
        "frag % cap @100>",
        "published>",
        "frag % cap @end>",
        "published>",
        "frag % idle @100>",
        "published>",
        "failed tasks>",
    ]);
    for s in summaries.iter().filter(|s| s.trace == trace) {
        table.row([
            s.policy.name().to_owned(),
            ours(&s.allocation[0]),
            published(&s.allocation[0]),
            ours(&s.allocation[1]),
            published(&s.allocation[1]),
            format!("{:.0}", s.unallocated_gpus(capacity_gpus)),
            ours(&s.fragmentation_of_capacity[0]),
            published(&s.fragmentation_of_capacity[0]),
            ours(&s.fragmentation_of_capacity[1]),
            published(&s.fragmentation_of_capacity[1]),
            number(Some(s.fragmentation_of_idle[0].ours.mean), 1),
            number(s.fragmentation_of_idle[0].published.map(|p| p.mean), 1),
            format!("{:.0}", s.failed.mean),
        ]);
    }
    table
}

/// One row per (trace, policy): the four metrics at both levels, ours / published.
pub fn variants_table(summaries: &[Summary]) -> Table {
    let pair = |c: &Cell| {
        format!(
            "{} / {}",
            number(Some(c.ours.mean), 2),
            number(c.published.map(|p| p.mean), 2)
        )
    };
    let mut table = Table::new(&[
        "trace",
        "policy",
        "alloc % @100>",
        "alloc % @end>",
        "frag % cap @100>",
        "frag % cap @end>",
        "frag % idle @100>",
        "frag % idle @end>",
    ]);
    for s in summaries {
        table.row([
            s.trace.clone(),
            s.policy.name().to_owned(),
            pair(&s.allocation[0]),
            pair(&s.allocation[1]),
            pair(&s.fragmentation_of_capacity[0]),
            pair(&s.fragmentation_of_capacity[1]),
            pair(&s.fragmentation_of_idle[0]),
            pair(&s.fragmentation_of_idle[1]),
        ]);
    }
    table
}

/// Ours against FGD's published allocation at the end, per trace: the goal of the study.
pub fn goal_table(summaries: &[Summary]) -> Table {
    let mut table = Table::new(&[
        "trace",
        "ours alloc % @end>",
        "FGD published>",
        "Δ pp>",
        "ours frag % cap @end>",
        "FGD published>",
        "FGD (our run)>",
        "verdict",
    ]);
    let mut traces: Vec<&str> = Vec::new();
    for s in summaries {
        if !traces.contains(&s.trace.as_str()) {
            traces.push(&s.trace);
        }
    }
    for trace in traces {
        let find = |p| summaries.iter().find(|s| s.trace == trace && s.policy == p);
        let Some(ours_row) = find(PlacementPolicy::Ours) else {
            continue;
        };
        let fgd_ours = find(PlacementPolicy::Fgd).map(|s| s.allocation[1].ours.mean);
        let alloc = ours_row.allocation[1].ours.mean;
        let frag = ours_row.fragmentation_of_capacity[1].ours.mean;
        let (fgd_published, fgd_frag_published) = ours_row.published_fgd_end.unzip();
        let verdict = match ours_row.published_fgd_end {
            Some((a, f)) if alloc >= a.mean && frag <= f.mean => "ahead",
            Some((a, _)) if alloc >= a.mean => "more allocated, more fragmented",
            Some(_) => "behind",
            None => "no published FGD",
        };
        table.row([
            trace.to_owned(),
            number(Some(alloc), 2),
            number(fgd_published.map(|p| p.mean), 2),
            number(fgd_published.map(|p| alloc - p.mean), 2),
            number(Some(frag), 2),
            number(fgd_frag_published.map(|p| p.mean), 2),
            number(fgd_ours, 2),
            verdict.to_owned(),
        ]);
    }
    table
}

/// Charts of one trace over arrived load: allocation and fragmentation (% of capacity), each
/// policy's mean over seeds, FGD's published curve dashed.
pub fn trace_charts(
    runs: &[PlacementRun],
    published: Option<&Published>,
    trace: &str,
) -> Result<Vec<(String, String)>, ReportError> {
    let mut charts = Vec::new();
    for (metric, file, title, y_label) in [
        (
            Metric::Allocation,
            "allocation",
            "GPU allocation over arrived load",
            "allocated GPU, % of capacity",
        ),
        (
            Metric::FragmentationOfCapacity,
            "fragmentation",
            "Fragmentation over arrived load",
            "fragmented GPU, % of capacity",
        ),
    ] {
        let mut series = Vec::new();
        for policy in PlacementPolicy::ALL {
            let group: Vec<&PlacementRun> = runs
                .iter()
                .filter(|r| r.trace == trace && r.policy == policy)
                .collect();
            if group.is_empty() {
                continue;
            }
            let points: Vec<(f64, f64)> = (0..=MAX_ARRIVED_PERCENT)
                .filter_map(|level| {
                    let values: Vec<f64> = group
                        .iter()
                        .filter_map(|r| {
                            let curve = match metric {
                                Metric::Allocation => &r.curves.allocation,
                                _ => &r.curves.fragmentation_of_capacity,
                            };
                            curve.get(level).copied().flatten()
                        })
                        .collect();
                    #[allow(clippy::cast_precision_loss)]
                    (!values.is_empty()).then(|| (level as f64, MeanStd::of(&values).mean))
                })
                .collect();
            series.push(Series {
                name: policy.name().to_owned(),
                points,
                dashed: false,
            });
        }
        if let Some(curve) = published.and_then(|p| p.mean_curve(metric, trace, "06-FGD")) {
            #[allow(clippy::cast_precision_loss)]
            let points = curve
                .iter()
                .enumerate()
                .filter_map(|(l, v)| v.map(|v| (l as f64, v)))
                .collect();
            series.push(Series {
                name: "FGD (published)".into(),
                points,
                dashed: true,
            });
        }
        let chart = Chart {
            title: format!("{title}, openb {trace}"),
            x_label: "arrived GPU request, % of capacity".into(),
            y_label: y_label.into(),
            y_range: None,
            log_x: false,
        };
        charts.push((
            format!("placement-{trace}-{file}.svg"),
            line_chart(&chart, &series)?,
        ));
    }
    Ok(charts)
}

/// The whole report as markdown.
pub fn markdown(
    summaries: &[Summary],
    capacity_gpus: u64,
    ratio: f64,
    seeds: &[u64],
    timing: Option<Timing>,
    chart_files: &[String],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Placement study: the FGD paper's setup on the Alibaba openb trace\n"
    );
    let _ = writeln!(
        out,
        "Each run submits a trace's tasks until the arrived GPU request reaches {:.0}% of the \
         {capacity_gpus}-GPU capacity (the published simulator's sampling: shuffle, then draw with \
         replacement), arrivals only, nothing departs; a task that fits nowhere is dropped. Seeds: \
         {}. Values are means ± standard deviation over seeds, binned by arrived load as the \
         authors' scripts do; \"published\" is the mean of the authors' runs (seeds 42–51, Go's \
         random generator, so the same seed is a different draw). Fragmentation is the FGD measure \
         against the trace's typical pods (95% popularity), as a share of capacity and of idle GPU.\n",
        ratio * 100.0,
        seed_list(seeds),
    );
    let mut traces: Vec<&str> = Vec::new();
    for s in summaries {
        if !traces.contains(&s.trace.as_str()) {
            traces.push(&s.trace);
        }
    }
    let _ = writeln!(
        out,
        "## Goal: ours against FGD's published allocation\n\n{}",
        goal_table(summaries).to_markdown()
    );
    for trace in &traces {
        let _ = writeln!(
            out,
            "## Trace `{trace}`\n\n{}",
            trace_table(summaries, trace, capacity_gpus).to_markdown()
        );
    }
    if traces.len() > 1 {
        let _ = writeln!(
            out,
            "## Every trace (ours / published)\n\n{}",
            variants_table(summaries).to_markdown()
        );
    }
    if !chart_files.is_empty() {
        let _ = writeln!(out, "## Charts\n");
        for file in chart_files {
            let _ = writeln!(out, "![{file}]({file})\n");
        }
    }
    if let Some(timing) = timing {
        #[allow(clippy::cast_precision_loss)]
        let submitted: f64 = summaries
            .iter()
            .map(|s| s.submitted.mean * s.seeds as f64)
            .sum();
        let runs: usize = summaries.iter().map(|s| s.seeds).sum();
        let secs = timing.elapsed.as_secs_f64();
        let _ = writeln!(
            out,
            "## Speed\n\n{runs} runs, {submitted:.0} task submissions (events) in {secs:.1} s on {} \
             threads: {:.0} events/s.\n",
            timing.threads,
            if secs > 0.0 { submitted / secs } else { 0.0 },
        );
    }
    out
}

/// `42–51` for a contiguous run of seeds, else a list.
pub fn seed_list(seeds: &[u64]) -> String {
    match seeds {
        [] => String::new(),
        [one] => one.to_string(),
        [first, .., last] if seeds.windows(2).all(|w| w[1] == w[0] + 1) => {
            format!("{first}–{last}")
        }
        _ => seeds
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}
