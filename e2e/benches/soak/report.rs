//! `e2e/results/soak.{json,md}`: faults by kind, handovers, evictions, violations, restarts,
//! leader changes and the replicas' RSS over time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use gpuqueue_api::v1alpha1::HandoverRecord;
use gpuqueue_e2e::{FaultKind, InvariantReport, repo_root};

use super::fleet::FleetTally;
use super::load::LoadTally;
use super::replicas::RssSample;
use super::{Injected, Knobs};

/// Handovers by how they ended (owner records, one per reclaim id).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Handovers {
    /// Finished by a leader that took over mid-way (the record lacks the early phases):
    /// judged by the checker's rules (nothing done twice), not by the budget.
    pub completed_resumed: usize,
    pub completed_within_budget: usize,
    pub completed_over_budget: usize,
    /// Outcomes other than Completed, by outcome.
    pub not_completed: BTreeMap<String, usize>,
    pub over_budget: Vec<Struck>,
    /// Each handover that did not complete, with every fault that overlapped it (leader
    /// faults too: a resumed handover may end incomplete because of one).
    pub incomplete: Vec<Struck>,
}

/// A handover, and the faults that overlapped it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Struck {
    pub record: HandoverRecord,
    /// The API server or etcd down (or restarted to force relists) while it ran, or within
    /// `settle` before it: the handover could not reach the API (`kind at_unix_ms`); for a
    /// handover that did not complete, the leader's faults too.
    pub faults: Vec<String>,
}

impl Handovers {
    /// Over budget with no control-plane fault to explain it.
    pub fn over_budget_unexplained(&self) -> usize {
        self.over_budget
            .iter()
            .filter(|o| o.faults.is_empty())
            .count()
    }
}

/// Sorts the owner `records` by outcome; an over-budget one is set against the `injected`
/// control-plane faults whose outage (plus `settle`, for watches to come back) overlapped it.
pub fn handovers(
    records: &BTreeMap<String, HandoverRecord>,
    injected: &[Injected],
    settle: Duration,
) -> Handovers {
    let mut out = Handovers::default();
    for record in records.values() {
        let resumed = record.phases.first().is_none_or(|p| p.phase != "plan");
        if record.outcome == "Completed" && resumed {
            out.completed_resumed += 1;
        } else if record.outcome == "Completed" {
            if record.total_millis <= record.budget_millis {
                out.completed_within_budget += 1;
            } else {
                out.completed_over_budget += 1;
                out.over_budget.push(Struck {
                    faults: overlapping_faults(record, injected, settle, Leaders::Left),
                    record: record.clone(),
                });
            }
        } else {
            *out.not_completed.entry(record.outcome.clone()).or_default() += 1;
            out.incomplete.push(Struck {
                faults: overlapping_faults(record, injected, settle, Leaders::Counted),
                record: record.clone(),
            });
        }
    }
    out
}

/// Whether the faults that struck the leader count among those that overlapped a handover.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Leaders {
    /// Left out: a handover whose leader was struck is resumed, and its record says so.
    Left,
    Counted,
}

/// The faults whose outage overlapped `record`'s run (its start has whole seconds, so the run
/// is taken as one second longer): the control plane's, and the leader's if `leaders` counts
/// them.
fn overlapping_faults(
    record: &HandoverRecord,
    injected: &[Injected],
    settle: Duration,
    leaders: Leaders,
) -> Vec<String> {
    let Some(started) = record.started_at.as_ref() else {
        return Vec::new();
    };
    let start = u64::try_from(started.0.as_millisecond()).unwrap_or(0);
    let end = start + 1000 + u64::try_from(record.total_millis).unwrap_or(0);
    injected
        .iter()
        .filter(|f| {
            leaders == Leaders::Counted
                || !matches!(f.kind, FaultKind::KillLeader | FaultKind::PauseLeader)
        })
        .filter(|f| {
            let outage_end = f.at_unix_ms + f.down_ms + millis(settle);
            f.at_unix_ms <= end && start <= outage_end
        })
        .map(|f| {
            format!(
                "{} at {} ms, down {} ms",
                f.kind.name(),
                f.at_unix_ms,
                f.down_ms
            )
        })
        .collect()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Soak {
    pub knobs: Knobs,
    pub seconds: f64,
    pub injected: Vec<Injected>,
    pub relists_seen_in_operator_logs: usize,
    pub handovers: Handovers,
    pub invariants: InvariantReport,
    pub operator_restarts: usize,
    pub unexpected_exits: Vec<String>,
    pub leader_changes: usize,
    pub load: LoadTally,
    pub fleet: FleetTally,
    pub rss: Vec<RssSample>,
}

pub fn write(soak: &Soak) {
    let dir = repo_root().join("e2e/results");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("soak.json"),
        serde_json::to_string_pretty(soak).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("soak.md"), markdown(soak)).unwrap();
    eprintln!("wrote {}", dir.join("soak.md").display());
}

fn markdown(soak: &Soak) -> String {
    let mut md = String::new();
    let k = &soak.knobs;
    let _ = writeln!(
        md,
        "# Soak: {:.1} minutes under faults\n\n`make soak` (`SOAK_MINUTES={}`, `SOAK_SEED={}`, \
         `SOAK_DAY_SECONDS={}`, `SOAK_GAP_SECONDS={}`, {} operator build): two replicas, the \
         tenants of `e2e/soak/scenario.yaml`, faults on the seeded schedule.\n",
        soak.seconds / 60.0,
        k.minutes,
        k.seed,
        k.day_seconds,
        k.gap_seconds,
        k.operator_build
    );
    let _ = writeln!(
        md,
        "## Faults injected\n\n| kind | count | mid-handover | down ms (median / max) |\n| --- | ---: | ---: | ---: |"
    );
    let mut by_kind: BTreeMap<&str, Vec<&Injected>> = BTreeMap::new();
    for fault in &soak.injected {
        by_kind.entry(fault.kind.name()).or_default().push(fault);
    }
    for (kind, faults) in &by_kind {
        let mut downs: Vec<u64> = faults.iter().map(|f| f.down_ms).collect();
        downs.sort_unstable();
        let _ = writeln!(
            md,
            "| {kind} | {} | {} | {} / {} |",
            faults.len(),
            faults.iter().filter(|f| f.mid_handover).count(),
            downs[downs.len() / 2],
            downs.last().copied().unwrap_or(0)
        );
    }
    let f = &soak.fleet;
    let _ = writeln!(
        md,
        "\nCheckpoint faults on {} fake vLLM servers: {} with latency only (100–1000 ms), {} \
         answering 500, {} hanging. Watch answers \"too old resource version\" in the operators' \
         logs (relists): {}.\n",
        f.servers, f.pause_latency, f.pause_500, f.pause_hang, soak.relists_seen_in_operator_logs
    );
    let h = &soak.handovers;
    let _ = writeln!(
        md,
        "## Outcomes\n\n| | |\n| --- | ---: |\n| handovers completed within budget | {} |\n\
         | handovers completed over budget (with the API server or etcd down during it) | {} ({}) |\n| handovers resumed by a new leader and completed | {} |\n| handovers not completed | {} |\n\
         | evictions (accepted, by the operator) | {} |\n| of which unbound owners requeued | {} |\n| checkpoint calls | {} |\n\
         | **invariant violations** | **{}** |\n| operator restarts | {} |\n\
         | unexpected operator exits | {} |\n| leader changes | {} |\n\
         | checker samples (excused) | {} ({}) |\n| online scalings / batch pods created / deleted by tenants | {} / {} / {} |\n\
         | API requests of the load refused during faults | {} |\n",
        h.completed_within_budget,
        h.completed_over_budget,
        h.completed_over_budget - h.over_budget_unexplained(),
        h.completed_resumed,
        h.not_completed.values().sum::<usize>(),
        soak.invariants.tally.evictions,
        soak.invariants.tally.requeued_owners,
        soak.invariants.tally.checkpoint_calls,
        soak.invariants.violations.len(),
        soak.operator_restarts,
        soak.unexpected_exits.len(),
        soak.leader_changes,
        soak.invariants.tally.samples,
        soak.invariants.tally.excused_samples,
        soak.load.online_scalings,
        soak.load.batch_pods_created,
        soak.load.batch_pods_deleted_by_tenant,
        soak.load.requests_failed,
    );
    if !h.not_completed.is_empty() {
        let _ = writeln!(md, "Not completed, by outcome: {:?}\n", h.not_completed);
        incomplete_lines(&mut md, h);
    }
    over_budget_lines(&mut md, h);
    for v in &soak.invariants.violations {
        let _ = writeln!(
            md,
            "- violation `{:?}` at {} ms: {} ({:?})",
            v.rule, v.at_ms, v.detail, v.objects
        );
    }
    rss_table(&mut md, &soak.rss);
    let _ = writeln!(md, "\nEvery 10 s sample is in `soak.json` (`rss`).");
    md
}

/// One line per handover over its budget: its phases, and the outage that explains it.
fn over_budget_lines(md: &mut String, h: &Handovers) {
    for o in &h.over_budget {
        let why = faults_text(&o.faults, "no control-plane fault overlapped it");
        let _ = writeln!(
            md,
            "- over budget: {} ({} ms of {}), {}: {why}",
            o.record.id,
            o.record.total_millis,
            o.record.budget_millis,
            o.record
                .phases
                .iter()
                .map(|p| format!("{} {}", p.phase, p.at_millis))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// One line per handover that did not complete: its outcome, start and the faults around it.
fn incomplete_lines(md: &mut String, h: &Handovers) {
    for o in &h.incomplete {
        let started = o
            .record
            .started_at
            .as_ref()
            .map_or_else(|| "?".to_owned(), |t| t.0.to_string());
        let faults = faults_text(&o.faults, "no fault overlapped it");
        let _ = writeln!(
            md,
            "- not completed: {} (owner {}, started {started}): {}; {faults}",
            o.record.id, o.record.owner_pod, o.record.outcome
        );
    }
    if !h.incomplete.is_empty() {
        md.push('\n');
    }
}

/// The faults, or `none` when there are none.
fn faults_text(faults: &[String], none: &str) -> String {
    if faults.is_empty() {
        none.to_owned()
    } else {
        faults.join("; ")
    }
}

/// The replicas' RSS: min, median and max per replica.
fn rss_table(md: &mut String, rss: &[RssSample]) {
    let _ = writeln!(
        md,
        "\n## Operator RSS (MiB)\n\n| replica | min | median | max |\n| --- | ---: | ---: | ---: |"
    );
    let mut by_replica: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for s in rss {
        by_replica.entry(&s.replica).or_default().push(s.rss_mib);
    }
    for (replica, mut values) in by_replica {
        values.sort_by(f64::total_cmp);
        let _ = writeln!(
            md,
            "| {replica} | {:.1} | {:.1} | {:.1} |",
            values[0],
            values[values.len() / 2],
            values[values.len() - 1]
        );
    }
}
