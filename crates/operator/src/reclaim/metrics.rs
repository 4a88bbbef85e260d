//! The reclaim executor's metrics: how long handovers take by phase, what checkpoints and
//! evictions came to, and how often reclaims happen (the anti-thrash signal).
//!
//! `gpuqueue_handover_seconds{phase}` observes, for each phase, the time from the moment the
//! owner was found blocked to the end of that phase (the same numbers as `atMillis` in a
//! queue's `status.lastHandovers`), so `phase="ownerBound"` is the whole handover.
//! `gpuqueue_handovers_total{queue,budget}` counts finished handovers by owner queue, `over`
//! when the owner was not bound within the queue's budget (the alert's ratio).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};
use tokio::time::Instant;

use super::timeline::Phase;

/// The window of `gpuqueue_reclaims_per_minute`.
const MINUTE: Duration = Duration::from_mins(1);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckpointLabels {
    driver: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    queue: String,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandoverLabels {
    queue: String,
    /// `met` or `over`.
    budget: &'static str,
}

type PhaseHistograms = Family<PhaseLabels, Histogram, fn() -> Histogram>;

/// Handover phases, checkpoint and eviction outcomes, reclaims started and finished.
#[derive(Debug, Clone)]
pub struct ReclaimMetrics {
    handover: PhaseHistograms,
    handovers: Family<HandoverLabels, Counter>,
    checkpoints: Family<CheckpointLabels, Counter>,
    evictions: Family<OutcomeLabels, Counter>,
    started: Counter,
    finished: Family<OutcomeLabels, Counter>,
    unrecorded: Gauge,
    budget_planned: Family<BudgetLabels, Counter>,
    recent: RecentReclaims,
}

impl ReclaimMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            // 5 ms to about 80 s: the control-plane phases land in the first buckets, a
            // checkpoint near a second, a victim stuck terminating in the last.
            handover: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 15))
            }),
            handovers: Family::default(),
            checkpoints: Family::default(),
            evictions: Family::default(),
            started: Counter::default(),
            finished: Family::default(),
            unrecorded: Gauge::default(),
            budget_planned: Family::default(),
            recent: RecentReclaims::default(),
        };
        registry.register_with_unit(
            "handover",
            "Time from an owner found blocked by borrowers to the end of each handover phase",
            Unit::Seconds,
            metrics.handover.clone(),
        );
        registry.register(
            "handovers",
            "Finished handovers by owner queue and budget (over: the owner was not bound within the queue's handover budget)",
            metrics.handovers.clone(),
        );
        registry.register(
            "checkpoints",
            "Checkpoints of reclaim victims, by driver and result",
            metrics.checkpoints.clone(),
        );
        registry.register(
            "evictions",
            "Reclaim victims removed, by outcome (evicted, deleted after the Eviction API kept refusing, already gone, failed), or spared (their queue no longer borrowed them)",
            metrics.evictions.clone(),
        );
        registry.register(
            "reclaims_started",
            "Reclaims started (intent recorded, owner released)",
            metrics.started.clone(),
        );
        registry.register(
            "reclaims_finished",
            "Reclaims finished, by outcome",
            metrics.finished.clone(),
        );
        registry.register(
            "reclaim_marks_unrecorded",
            "Pods whose reclaim annotations no reclaim in flight records (forged, or left over), ignored in the last admission pass",
            metrics.unrecorded.clone(),
        );
        registry.register(
            "reclaim_budget_overruns_planned",
            "Handovers whose plan did not fit the owner queue's budget, by owner queue and kind (checkpoint_cut: the checkpoint gets less than its timeout; overrun: even without one the victims' termination and the bind outlast the budget)",
            metrics.budget_planned.clone(),
        );
        registry.register_collector(Box::new(metrics.recent.clone()));
        metrics
    }

    /// A handover reached the end of `phase`, `at` after the owner was found blocked.
    pub fn phase(&self, phase: Phase, at: Duration) {
        self.handover
            .get_or_create(&PhaseLabels {
                phase: phase.as_str(),
            })
            .observe(at.as_secs_f64());
    }

    /// A handover for `queue` finished; the owner was bound `owner_bound` after the start, if
    /// at all.
    pub fn handover_finished(&self, queue: &str, owner_bound: Option<Duration>, budget: Duration) {
        let met = owner_bound.is_some_and(|took| took <= budget);
        self.handovers
            .get_or_create(&HandoverLabels {
                queue: queue.to_owned(),
                budget: if met { "met" } else { "over" },
            })
            .inc();
    }

    pub fn checkpointed(&self, driver: &'static str, result: &'static str) {
        self.checkpoints
            .get_or_create(&CheckpointLabels { driver, result })
            .inc();
    }

    pub fn evicted(&self, outcome: &'static str) {
        self.evictions
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// A reclaim started at `now` (a monotonic instant).
    pub fn started(&self, now: Instant) {
        self.started.inc();
        self.recent.push(now);
    }

    /// How many pods carried a reclaim mark nobody recorded, in the last pass that saw marks.
    pub fn unrecorded_marks(&self, pods: usize) {
        self.unrecorded.set(i64::try_from(pods).unwrap_or(i64::MAX));
    }

    /// A handover for `queue` was planned not to fit its budget; `kind` says how.
    pub fn budget_planned(&self, queue: &str, kind: &'static str) {
        self.budget_planned
            .get_or_create(&BudgetLabels {
                queue: queue.to_owned(),
                kind,
            })
            .inc();
    }

    pub fn finished(&self, outcome: &'static str) {
        self.finished
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
}

/// Starts of the last minute, counted at scrape time so that the gauge falls back to zero when
/// reclaims stop (a gauge set only on starts would keep its last value forever).
#[derive(Debug, Clone, Default)]
struct RecentReclaims {
    starts: Arc<Mutex<VecDeque<Instant>>>,
}

impl RecentReclaims {
    fn push(&self, at: Instant) {
        let mut starts = self.lock();
        starts.push_back(at);
        Self::forget_before(&mut starts, at);
    }

    fn count(&self, now: Instant) -> usize {
        let mut starts = self.lock();
        Self::forget_before(&mut starts, now);
        starts.len()
    }

    fn forget_before(starts: &mut VecDeque<Instant>, now: Instant) {
        while starts
            .front()
            .is_some_and(|first| now.duration_since(*first) > MINUTE)
        {
            starts.pop_front();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Instant>> {
        crate::sync::lock(&self.starts)
    }
}

impl Collector for RecentReclaims {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauge = Gauge::<i64>::default();
        gauge.set(i64::try_from(self.count(Instant::now())).unwrap_or(i64::MAX));
        let metric = encoder.encode_descriptor(
            "reclaims_per_minute",
            "Reclaims started in the last 60 seconds",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{encode, registry};

    #[test]
    fn phases_checkpoints_and_evictions_are_exposed_with_their_labels() {
        let mut registry = registry();
        let metrics = ReclaimMetrics::register(&mut registry);
        metrics.phase(Phase::Checkpoint, Duration::from_millis(1250));
        metrics.phase(Phase::OwnerBound, Duration::from_millis(1400));
        metrics.checkpointed("vllm", "timed_out");
        metrics.evicted("deleted_after_refusal");
        metrics.finished("completed");
        metrics.budget_planned("online", "overrun");
        let budget = Duration::from_secs(3);
        metrics.handover_finished("online", Some(Duration::from_millis(1400)), budget);
        metrics.handover_finished("online", Some(Duration::from_millis(3100)), budget);
        metrics.handover_finished("online", None, budget);
        let text = encode(&registry).unwrap();
        for line in [
            r#"gpuqueue_handover_seconds_count{phase="checkpoint"} 1"#,
            r#"gpuqueue_handover_seconds_sum{phase="ownerBound"} 1.4"#,
            r#"gpuqueue_checkpoints_total{driver="vllm",result="timed_out"} 1"#,
            r#"gpuqueue_evictions_total{outcome="deleted_after_refusal"} 1"#,
            r#"gpuqueue_reclaims_finished_total{outcome="completed"} 1"#,
            r#"gpuqueue_reclaim_budget_overruns_planned_total{queue="online",kind="overrun"} 1"#,
            "gpuqueue_reclaims_per_minute 0",
            r#"gpuqueue_handovers_total{queue="online",budget="met"} 1"#,
            r#"gpuqueue_handovers_total{queue="online",budget="over"} 2"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reclaims_per_minute_counts_only_the_last_minute() {
        let mut registry = registry();
        let metrics = ReclaimMetrics::register(&mut registry);
        metrics.started(Instant::now());
        tokio::time::advance(Duration::from_secs(30)).await;
        metrics.started(Instant::now());
        metrics.started(Instant::now());
        let text = encode(&registry).unwrap();
        assert!(text.contains("gpuqueue_reclaims_per_minute 3"), "{text}");
        assert!(text.contains("gpuqueue_reclaims_started_total 3"), "{text}");
        tokio::time::advance(Duration::from_secs(45)).await;
        let text = encode(&registry).unwrap();
        assert!(text.contains("gpuqueue_reclaims_per_minute 2"), "{text}");
        tokio::time::advance(Duration::from_mins(1)).await;
        let text = encode(&registry).unwrap();
        assert!(text.contains("gpuqueue_reclaims_per_minute 0"), "{text}");
    }
}
