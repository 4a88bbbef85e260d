//! What the quota study measures, kept as the run goes. Only what happens after the warm-up
//! counts: arrivals before it are not in the wait statistics, and utilisation is averaged over
//! the time after it.
//!
//! Definitions (the report repeats them):
//! - **utilisation**: allocated GPUs ÷ GPU capacity, time-averaged; **peak** is its maximum;
//! - **wait**: from a pod's creation until it is bound to a node; pods still waiting at the end
//!   count with their wait so far (a lower bound) and are also counted as such;
//! - **owner request**: a pod that fits within its queue's guaranteed quota when it arrives
//!   (what the queue holds, plus what its pods already at the gate ask for, since the queue
//!   admits them first, plus this pod ≤ guaranteed); it is **over budget** when its wait
//!   exceeds its queue's handover budget, and then counted under its [`OverBudgetCause`];
//! - **evicted GPU-hours**: GPUs × time run, summed over evicted pods (the work interrupted);
//!   **lost GPU-hours**: the part not saved by a checkpoint.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::engine::SimTime;
use crate::stats::{TimeWeighted, percentile, sorted};

/// Why an owner request waited past its budget: what the first admission cycle that saw it
/// decided. Either a reclaim was planned for it at once (the handover itself overran), or it
/// was admitted at once (its binding came late), or the core left it waiting, for the reason
/// the core gave then; unless a victim of its handover was spared, which requeues it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OverBudgetCause {
    /// A reclaim was planned in the first cycle; the handover took longer than the budget.
    Handover {
        /// More than one GPU requested (so, as a rule, more than one victim).
        multi_gpu: bool,
    },
    /// Admitted in the first cycle, bound late.
    Binding,
    /// Left waiting by the first cycle: the core's reason code (`NoRoom` carries the reclaim
    /// planner's reason after a slash), and whether the pod asks for more than one GPU.
    Waited {
        /// The wait reason.
        reason: &'static str,
        /// More than one GPU requested.
        multi_gpu: bool,
    },
    /// A victim of its handover was spared at its eviction (its queue shrank during the
    /// checkpoint), so the owner was deleted and recreated, to be planned anew.
    Requeued {
        /// More than one GPU requested.
        multi_gpu: bool,
    },
    /// Still waiting for its first admission cycle (removed or the run ended first).
    Undecided,
}

impl fmt::Display for OverBudgetCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Handover { multi_gpu } => write!(
                f,
                "reclaim planned at once; handover overran ({})",
                gpus(*multi_gpu)
            ),
            Self::Binding => f.write_str("admitted at once; bound late"),
            Self::Waited { reason, multi_gpu } => {
                write!(f, "waited: {reason} ({})", gpus(*multi_gpu))
            }
            Self::Requeued { multi_gpu } => write!(
                f,
                "a victim spared; requeued and planned anew ({})",
                gpus(*multi_gpu)
            ),
            Self::Undecided => f.write_str("never decided"),
        }
    }
}

fn gpus(multi_gpu: bool) -> &'static str {
    if multi_gpu { "multi-GPU" } else { "1 GPU" }
}

/// Per-tenant measurements.
#[derive(Clone, Debug, Default)]
pub struct TenantMetrics {
    /// Waits of pods that arrived after the warm-up, in seconds (bound ones and, at the end,
    /// those still waiting).
    pub waits: Vec<f64>,
    /// Pods still waiting at the end.
    pub still_pending: u64,
    /// Pods removed by the autoscaler while still waiting.
    pub withdrawn: u64,
    /// Owner requests that arrived after the warm-up.
    pub owner_requests: u64,
    /// Of those, the ones that waited longer than the budget.
    pub owner_over_budget: u64,
    /// The over-budget ones by cause.
    pub over_budget_causes: BTreeMap<OverBudgetCause, u64>,
    /// Pods of this tenant evicted by reclaim.
    pub evictions: u64,
    /// GPU-hours those pods had run.
    pub evicted_gpu_hours: f64,
    /// GPU-hours lost (checkpoint failed).
    pub lost_gpu_hours: f64,
    /// GPU-hours of batch work completed.
    pub completed_gpu_hours: f64,
}

impl TenantMetrics {
    /// Wait percentile in seconds.
    pub fn wait_percentile(&self, p: f64) -> Option<f64> {
        percentile(&sorted(self.waits.clone()), p)
    }
}

/// A point of the time series.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Hours since the start.
    pub hours: f64,
    /// Allocated GPUs, % of capacity.
    pub utilisation_percent: f64,
    /// Fragmented GPU (FGD measure), % of capacity.
    pub fragmentation_percent: f64,
    /// GPUs held per tenant.
    pub held_gpus: Vec<f64>,
}

/// The run's measurements.
#[derive(Clone, Debug)]
pub struct QuotaMetrics {
    warmup: SimTime,
    capacity_milli: f64,
    allocated: TimeWeighted,
    fragmented: TimeWeighted,
    /// Per tenant, in scenario order.
    pub tenants: Vec<TenantMetrics>,
    /// Reclaims started after the warm-up.
    pub reclaims: u64,
    /// Checkpoints that failed or timed out.
    pub failed_checkpoints: u64,
    /// Victims spared at their eviction: their queue no longer borrowed them.
    pub spared_victims: u64,
    /// Handover durations (plan to owner bound) in seconds.
    pub handovers: Vec<f64>,
    /// The time series.
    pub samples: Vec<Sample>,
}

/// Final figures of a run.
#[derive(Clone, Debug)]
pub struct QuotaSummary {
    /// Average utilisation, %.
    pub utilisation_percent: f64,
    /// Peak utilisation, %.
    pub peak_utilisation_percent: f64,
    /// Average fragmentation, % of capacity.
    pub fragmentation_percent: f64,
    /// Owner requests over budget ÷ owner requests, %.
    pub owner_over_budget_percent: f64,
    /// Reclaims per simulated hour after the warm-up.
    pub reclaims_per_hour: f64,
}

impl QuotaMetrics {
    /// Starts measuring a cluster of `capacity_milli` GPU milli-units shared by `tenants`.
    #[allow(clippy::cast_precision_loss)]
    pub fn new(warmup: SimTime, capacity_milli: u64, tenants: usize) -> Self {
        Self {
            warmup,
            capacity_milli: capacity_milli as f64,
            allocated: TimeWeighted::new(warmup, 0.0),
            fragmented: TimeWeighted::new(warmup, 0.0),
            tenants: vec![TenantMetrics::default(); tenants],
            reclaims: 0,
            failed_checkpoints: 0,
            spared_victims: 0,
            handovers: Vec::new(),
            samples: Vec::new(),
        }
    }

    fn counts(&self, at: SimTime) -> bool {
        at >= self.warmup
    }

    /// A pod created at `arrival` was bound at `now`; `owner` is `Some` for an owner request,
    /// with the cause it is counted under if it waited past its budget.
    pub fn bound(
        &mut self,
        tenant: usize,
        arrival: SimTime,
        now: SimTime,
        owner: Option<OverBudgetCause>,
        budget: Duration,
    ) {
        if !self.counts(arrival) {
            return;
        }
        let wait = now.since(arrival);
        let metrics = &mut self.tenants[tenant];
        metrics.waits.push(wait.as_secs_f64());
        if let Some(cause) = owner {
            metrics.owner_requests += 1;
            if wait > budget {
                metrics.owner_over_budget += 1;
                *metrics.over_budget_causes.entry(cause).or_default() += 1;
            }
        }
    }

    /// Over-budget owner requests by cause, over every tenant.
    pub fn over_budget_causes(&self) -> BTreeMap<OverBudgetCause, u64> {
        let mut all = BTreeMap::new();
        for t in &self.tenants {
            for (cause, n) in &t.over_budget_causes {
                *all.entry(*cause).or_default() += n;
            }
        }
        all
    }

    /// A pod created at `arrival` is still waiting at the end, `end`.
    pub fn still_waiting(
        &mut self,
        tenant: usize,
        arrival: SimTime,
        end: SimTime,
        owner: Option<OverBudgetCause>,
        budget: Duration,
    ) {
        if !self.counts(arrival) {
            return;
        }
        self.bound(tenant, arrival, end, owner, budget);
        self.tenants[tenant].still_pending += 1;
    }

    /// A pod created at `arrival` was removed at `now` while still waiting (its wait counts as
    /// a lower bound, like one still waiting at the end).
    pub fn withdrawn(
        &mut self,
        tenant: usize,
        arrival: SimTime,
        now: SimTime,
        owner: Option<OverBudgetCause>,
        budget: Duration,
    ) {
        if !self.counts(arrival) {
            return;
        }
        self.bound(tenant, arrival, now, owner, budget);
        self.tenants[tenant].withdrawn += 1;
    }

    /// A pod holding `gpu_milli` that had run for `ran` was evicted at `now`; `saved` says
    /// whether its checkpoint succeeded.
    #[allow(clippy::cast_precision_loss)]
    pub fn evicted(
        &mut self,
        tenant: usize,
        now: SimTime,
        gpu_milli: u64,
        ran: Duration,
        saved: bool,
    ) {
        if !self.counts(now) {
            return;
        }
        let gpu_hours = gpu_milli as f64 / 1000.0 * ran.as_secs_f64() / 3600.0;
        let metrics = &mut self.tenants[tenant];
        metrics.evictions += 1;
        metrics.evicted_gpu_hours += gpu_hours;
        if !saved {
            metrics.lost_gpu_hours += gpu_hours;
        }
    }

    /// A batch pod holding `gpu_milli` finished at `now` after running `ran` (this stint).
    #[allow(clippy::cast_precision_loss)]
    pub fn completed(&mut self, tenant: usize, now: SimTime, gpu_milli: u64, ran: Duration) {
        if self.counts(now) {
            self.tenants[tenant].completed_gpu_hours +=
                gpu_milli as f64 / 1000.0 * ran.as_secs_f64() / 3600.0;
        }
    }

    /// A reclaim was started at `now`.
    pub fn reclaim_started(&mut self, now: SimTime) {
        if self.counts(now) {
            self.reclaims += 1;
        }
    }

    /// A handover planned at `planned` completed (owner bound) at `now`.
    pub fn handover_done(&mut self, planned: SimTime, now: SimTime) {
        if self.counts(planned) {
            self.handovers.push(now.since(planned).as_secs_f64());
        }
    }

    /// A checkpoint failed or timed out at `now`.
    pub fn checkpoint_failed(&mut self, now: SimTime) {
        if self.counts(now) {
            self.failed_checkpoints += 1;
        }
    }

    /// A victim was spared at `now`: its queue shrank during its checkpoint.
    pub fn victim_spared(&mut self, now: SimTime) {
        if self.counts(now) {
            self.spared_victims += 1;
        }
    }

    /// Allocated and fragmented GPU milli-units changed at `now`.
    pub fn level(&mut self, now: SimTime, allocated_milli: u64, fragmented_milli: f64) {
        #[allow(clippy::cast_precision_loss)]
        self.allocated.set(now, allocated_milli as f64);
        self.fragmented.set(now, fragmented_milli);
    }

    /// Records a time-series point.
    pub fn sample(&mut self, now: SimTime, held_milli: &[u64]) {
        #[allow(clippy::cast_precision_loss)]
        self.samples.push(Sample {
            hours: now.as_hours_f64(),
            utilisation_percent: 100.0 * self.allocated.value() / self.capacity_milli,
            fragmentation_percent: 100.0 * self.fragmented.value() / self.capacity_milli,
            held_gpus: held_milli.iter().map(|m| *m as f64 / 1000.0).collect(),
        });
    }

    /// Closes the run at `end`.
    #[allow(clippy::cast_precision_loss)]
    pub fn finish(&mut self, end: SimTime) -> QuotaSummary {
        let (allocated, peak) = self.allocated.finish(end);
        let (fragmented, _) = self.fragmented.finish(end);
        let owners: u64 = self.tenants.iter().map(|t| t.owner_requests).sum();
        let over: u64 = self.tenants.iter().map(|t| t.owner_over_budget).sum();
        let hours = end.since(self.warmup).as_secs_f64() / 3600.0;
        QuotaSummary {
            utilisation_percent: 100.0 * allocated / self.capacity_milli,
            peak_utilisation_percent: 100.0 * peak / self.capacity_milli,
            fragmentation_percent: 100.0 * fragmented / self.capacity_milli,
            owner_over_budget_percent: if owners == 0 {
                0.0
            } else {
                100.0 * over as f64 / owners as f64
            },
            reclaims_per_hour: if hours > 0.0 {
                self.reclaims as f64 / hours
            } else {
                0.0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    fn t(secs: f64) -> SimTime {
        SimTime::from_secs_f64(secs)
    }

    #[test]
    fn waits_and_owner_budget() {
        let mut m = QuotaMetrics::new(t(100.0), 8000, 2);
        let budget = Duration::from_secs(3);
        let handover = Some(OverBudgetCause::Handover { multi_gpu: false });
        m.bound(0, t(50.0), t(60.0), handover, budget); // before warm-up: ignored
        m.bound(0, t(200.0), t(202.0), handover, budget);
        m.bound(0, t(300.0), t(304.0), handover, budget); // over budget
        m.bound(1, t(300.0), t(900.0), None, budget); // borrower: waits count, no budget
        m.still_waiting(1, t(950.0), t(1000.0), None, budget);
        assert_eq!(m.tenants[0].waits, vec![2.0, 4.0]);
        assert_eq!(
            (m.tenants[0].owner_requests, m.tenants[0].owner_over_budget),
            (2, 1)
        );
        assert_eq!(
            m.over_budget_causes().into_iter().collect::<Vec<_>>(),
            vec![(OverBudgetCause::Handover { multi_gpu: false }, 1)]
        );
        assert_eq!(m.tenants[1].still_pending, 1);
        assert_eq!(m.tenants[1].wait_percentile(99.0), Some(600.0));
        let summary = m.finish(t(1000.0));
        assert!((summary.owner_over_budget_percent - 50.0).abs() < 1e-9);
    }

    #[test]
    fn utilisation_and_evictions() {
        let mut m = QuotaMetrics::new(t(0.0), 8000, 1);
        m.level(t(0.0), 4000, 1000.0);
        m.level(t(1800.0), 8000, 0.0);
        m.reclaim_started(t(1800.0));
        m.evicted(0, t(1800.0), 2000, Duration::from_mins(30), false);
        m.evicted(0, t(1800.0), 1000, Duration::from_hours(1), true);
        let summary = m.finish(t(3600.0));
        assert!((summary.utilisation_percent - 75.0).abs() < 1e-9);
        assert!((summary.peak_utilisation_percent - 100.0).abs() < 1e-9);
        assert!((summary.fragmentation_percent - 6.25).abs() < 1e-9);
        assert!((summary.reclaims_per_hour - 1.0).abs() < 1e-9);
        assert!((m.tenants[0].evicted_gpu_hours - 2.0).abs() < 1e-9);
        assert!((m.tenants[0].lost_gpu_hours - 1.0).abs() < 1e-9);
    }
}
