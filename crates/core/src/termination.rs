//! How long a reclaim victim takes to terminate on each node, as observed, and what the
//! handover budget keeps back for it (DESIGN §5 step 4).
//!
//! A victim's termination is the time from its eviction being accepted to its containers having
//! ended (its phase terminal, when kube-scheduler counts its GPUs free) or its pod being gone:
//! the victim's own exit after SIGTERM (at most its grace period, after which the kubelet kills
//! it), plus what the node adds (the kubelet starting the kill and noticing the exit, a relist
//! each with the generic PLEG, and its status write). The budget keeps back that termination
//! plus [`BIND_RESERVE`] for the API calls around it, and only the rest goes to the checkpoint.
//!
//! The estimate for a victim with grace `g` on a node:
//! - fewer than [`MIN_SAMPLES`] observations there: `g` + [`TERMINATION_PRIOR`], what a victim
//!   that exits before its grace ends takes on a kubelet with the generic PLEG (one that runs
//!   until SIGKILL takes up to another relist, which the node's history then shows);
//! - otherwise the p95 of the node's last [`HISTORY`] observations, each raised by how much
//!   longer `g` is than the grace of the victim observed, and never below `g`.
//!
//! Why that combination: an observation already contains the observed victim's exit, so
//! adding `g` to it would count the grace twice; but a victim whose grace is longer than those
//! observed may use the difference, so the observation is raised by it (never lowered for a
//! shorter grace: the node's share of the observation does not shrink with the grace). The
//! floor at `g` is the victim's right: the kubelet waits its whole grace before killing it,
//! even where the victims seen so far exited at once.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// Kept back beyond a victim's termination for the eviction call before it, and after it the
/// owner's release at the gate and kube-scheduler's bind (single handovers: p99 7-11 ms to
/// have the eviction accepted, 10-17 ms from the victims gone to the owner bound, in
/// `e2e/results/handover.md`; a burst, whose writes queue at the API server, takes more: p99
/// 95 and 53 ms in its 12-owner bursts). The API's `BIND_RESERVE`.
pub const BIND_RESERVE: Duration = Duration::from_millis(250);

/// What a node is assumed to add to a victim's grace before any history: one relist of a
/// kubelet with the generic PLEG (every second, the default). Its pod worker starts the kill at
/// the first relist after the deletion and sees the exit at a later one, so a victim that exits
/// within a second of SIGTERM is seen ended 1-2 s after its eviction (a real kubelet: 1.5-1.8 s
/// at the median, at most 2.0 s, in `e2e/kubelet/results.md`). A prior of 250 ms, the kubelet's
/// status write alone, let the first handovers on a node overrun their budget there.
pub const TERMINATION_PRIOR: Duration = Duration::from_secs(1);

/// Observations kept per node: the most recent ones describe the node as it is now.
pub const HISTORY: usize = 20;

/// Observations a node needs before they replace the prior.
pub const MIN_SAMPLES: usize = 5;

/// The quantile of the observations the estimate takes, in percent.
const QUANTILE: usize = 95;

/// One victim's termination as observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Observation {
    took: Duration,
    grace: Duration,
}

/// Victim terminations observed per node, the last [`HISTORY`] of each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Terminations {
    nodes: BTreeMap<String, VecDeque<Observation>>,
}

impl Terminations {
    /// Records that a victim with grace period `grace` on `node` took `took` from its eviction
    /// being accepted to its end (see the module documentation).
    pub fn record(&mut self, node: &str, took: Duration, grace: Duration) {
        let history = self.nodes.entry(node.to_owned()).or_default();
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back(Observation { took, grace });
    }

    /// How long a victim with `grace` is expected to take to terminate on `node` (see the
    /// module documentation).
    pub fn expected(&self, node: &str, grace: Duration) -> Duration {
        let history = self.nodes.get(node).filter(|h| h.len() >= MIN_SAMPLES);
        let Some(history) = history else {
            return grace + TERMINATION_PRIOR;
        };
        // On the stack: the planner asks once per node and grace.
        let mut raised = [Duration::ZERO; HISTORY];
        for (slot, o) in raised.iter_mut().zip(history) {
            *slot = o.took + grace.saturating_sub(o.grace);
        }
        let raised = &mut raised[..history.len()];
        raised.sort_unstable();
        // Nearest rank: the smallest observation at or above the quantile.
        let rank = (raised.len() * QUANTILE).div_ceil(100).max(1);
        raised[rank - 1].max(grace)
    }

    /// What the budget keeps back after the checkpoint for a victim with `grace` on `node`:
    /// its expected termination plus [`BIND_RESERVE`].
    pub fn reserve(&self, node: &str, grace: Duration) -> Duration {
        self.expected(node, grace) + BIND_RESERVE
    }

    /// How many observations `node` has (at most [`HISTORY`]).
    pub fn observed(&self, node: &str) -> usize {
        self.nodes.get(node).map_or(0, VecDeque::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_prior_holds_until_enough_observations() {
        let mut t = Terminations::default();
        assert_eq!(t.expected("a", ms(1000)), ms(2000));
        for _ in 0..MIN_SAMPLES - 1 {
            t.record("a", ms(1400), ms(1000));
        }
        assert_eq!(t.expected("a", ms(1000)), ms(2000));
        t.record("a", ms(1400), ms(1000));
        assert_eq!(t.expected("a", ms(1000)), ms(1400));
        assert_eq!(t.reserve("a", ms(1000)), ms(1650));
        assert_eq!(t.expected("b", ms(1000)), ms(2000), "per node");
    }

    #[test]
    fn a_longer_grace_raises_the_observations_a_shorter_one_does_not_lower_them() {
        let mut t = Terminations::default();
        for _ in 0..HISTORY {
            t.record("a", ms(1200), ms(1000));
        }
        assert_eq!(t.expected("a", ms(3000)), ms(3200));
        assert_eq!(t.expected("a", ms(0)), ms(1200));
    }

    #[test]
    fn never_below_the_grace_however_fast_the_victims_seen() {
        let mut t = Terminations::default();
        for _ in 0..HISTORY {
            t.record("a", ms(30), ms(1000));
        }
        assert_eq!(t.expected("a", ms(1000)), ms(1000));
    }

    #[test]
    fn the_p95_of_the_most_recent_observations() {
        let mut t = Terminations::default();
        for i in 1..=HISTORY as u64 {
            t.record("a", ms(1000 + i), ms(0));
        }
        // Nearest rank 19 of 20: one outlier is ignored, two are not.
        assert_eq!(t.expected("a", ms(0)), ms(1019));
        for _ in 0..HISTORY {
            t.record("a", ms(100), ms(0));
        }
        assert_eq!(t.observed("a"), HISTORY);
        assert_eq!(t.expected("a", ms(0)), ms(100), "old observations age out");
    }
}
