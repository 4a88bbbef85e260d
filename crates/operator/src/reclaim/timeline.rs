//! The phases of a handover and when each ended, measured from the moment the owner was found
//! blocked (the start of the admission pass that planned the reclaim).

use std::fmt;
use std::time::Duration;

use gpuqueue_api::v1alpha1::PhaseTiming;
use jiff::{SignedDuration, Timestamp};
use tokio::time::Instant;

/// The phases of a handover, in order (DESIGN §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// The core chose the node and the victims.
    Plan,
    /// Every victim carries the reclaim's intent annotations.
    Intent,
    /// The owner carries the intent, is pinned to the node and its gate is released.
    Reserve,
    /// Every victim's checkpoint returned (succeeded, failed, timed out or skipped).
    Checkpoint,
    /// Every victim's eviction was accepted (or it was deleted after refusals).
    EvictAccepted,
    /// The operator's watch shows every victim gone.
    VictimsGone,
    /// Every DRA claim a victim held is released (kube-controller-manager removed the victim
    /// from its `status.reservedFor` and deallocated it, or deleted it); recorded only for
    /// handovers whose victims held claims.
    ClaimsFreed,
    /// The operator's watch shows the owner bound to a node.
    OwnerBound,
}

impl Phase {
    pub const ALL: [Self; 8] = [
        Self::Plan,
        Self::Intent,
        Self::Reserve,
        Self::Checkpoint,
        Self::EvictAccepted,
        Self::VictimsGone,
        Self::ClaimsFreed,
        Self::OwnerBound,
    ];

    /// The name in `status.lastHandovers[].phases[].phase` and the metric's `phase` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plan => "plan",
            Self::Intent => "intent",
            Self::Reserve => "reserve",
            Self::Checkpoint => "checkpoint",
            Self::EvictAccepted => "evictAccepted",
            Self::VictimsGone => "victimsGone",
            Self::ClaimsFreed => "claimsFreed",
            Self::OwnerBound => "ownerBound",
        }
    }

    /// The phase named `name`, as [`Phase::as_str`] writes it.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|phase| phase.as_str() == name)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a handover started, on both clocks, and when each phase ended.
#[derive(Clone, Debug)]
pub struct Timeline {
    /// The owner found blocked (monotonic, for durations).
    pub started: Instant,
    /// The same moment on the wall clock (for the record and the annotations).
    pub started_at: Timestamp,
    /// The handover's budget.
    pub budget: Duration,
    phases: Vec<(Phase, Duration)>,
}

impl Timeline {
    pub fn new(started: Instant, started_at: Timestamp, budget: Duration) -> Self {
        Self {
            started,
            started_at,
            budget,
            phases: Vec::new(),
        }
    }

    /// A handover found by a later process: it started at `started_at` (wall clock), which is
    /// `now_at` − `started_at` before `now` on the monotonic clock.
    pub fn resumed(
        started_at: Timestamp,
        budget: Duration,
        now: Instant,
        now_at: Timestamp,
    ) -> Self {
        let ago = Duration::try_from(now_at.duration_since(started_at)).unwrap_or_default();
        Self::new(now.checked_sub(ago).unwrap_or(now), started_at, budget)
    }

    /// When the budget runs out (monotonic).
    pub fn deadline(&self) -> Instant {
        self.started + self.budget
    }

    /// When the budget runs out (wall clock), as the intent annotations record it.
    pub fn deadline_at(&self) -> Timestamp {
        SignedDuration::try_from(self.budget)
            .ok()
            .and_then(|budget| self.started_at.checked_add(budget).ok())
            .unwrap_or(self.started_at)
    }

    /// The monotonic instant of `at` on the wall clock, no earlier than the start and no later
    /// than `now`.
    pub fn instant_of(&self, at: Timestamp, now: Instant) -> Instant {
        let after = Duration::try_from(at.duration_since(self.started_at)).unwrap_or_default();
        (self.started + after).min(now)
    }

    /// Time since the start at `now`.
    pub fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// Records the end of `phase` at `now`; returns the time since the start. A phase already
    /// recorded keeps its first time.
    pub fn end(&mut self, phase: Phase, now: Instant) -> Duration {
        let at = self.elapsed(now);
        if let Some((_, known)) = self.phases.iter().find(|(p, _)| *p == phase) {
            return *known;
        }
        self.phases.push((phase, at));
        self.phases.sort_by_key(|(p, _)| *p);
        at
    }

    /// When `phase` ended, if it did.
    pub fn at(&self, phase: Phase) -> Option<Duration> {
        self.phases
            .iter()
            .find(|(p, _)| *p == phase)
            .map(|(_, at)| *at)
    }

    /// The phases for `status.lastHandovers`.
    pub fn phase_timings(&self) -> Vec<PhaseTiming> {
        self.phases
            .iter()
            .map(|(phase, at)| PhaseTiming {
                phase: phase.as_str().to_owned(),
                at_millis: millis(*at),
            })
            .collect()
    }

    /// `plan 3ms, intent 11ms, …` for events and logs.
    pub fn summary(&self) -> String {
        self.phases
            .iter()
            .map(|(phase, at)| format!("{phase} {}ms", millis(*at)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Whole milliseconds, saturating.
pub fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_names_round_trip_in_order() {
        let names: Vec<&str> = Phase::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "plan",
                "intent",
                "reserve",
                "checkpoint",
                "evictAccepted",
                "victimsGone",
                "claimsFreed",
                "ownerBound"
            ]
        );
        for phase in Phase::ALL {
            assert_eq!(Phase::parse(phase.as_str()), Some(phase));
        }
        assert_eq!(Phase::parse("bound"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn phases_are_timed_from_the_start_and_kept_in_order() {
        let start = Instant::now();
        let at: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let mut timeline = Timeline::new(start, at, Duration::from_secs(3));
        assert_eq!(
            timeline.deadline_at(),
            "2026-01-01T00:00:03Z".parse::<Timestamp>().unwrap()
        );
        tokio::time::advance(Duration::from_millis(1250)).await;
        timeline.end(Phase::Checkpoint, Instant::now());
        timeline.end(Phase::Plan, start + Duration::from_millis(4));
        // A phase keeps its first end.
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(
            timeline.end(Phase::Checkpoint, Instant::now()),
            Duration::from_millis(1250)
        );
        assert_eq!(timeline.summary(), "plan 4ms, checkpoint 1250ms");
        let timings = timeline.phase_timings();
        assert_eq!(timings[1].phase, "checkpoint");
        assert_eq!(timings[1].at_millis, 1250);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resumed_timeline_counts_from_the_original_start() {
        let started_at: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let now_at: Timestamp = "2026-01-01T00:00:05Z".parse().unwrap();
        tokio::time::advance(Duration::from_mins(1)).await;
        let now = Instant::now();
        let timeline = Timeline::resumed(started_at, Duration::from_secs(3), now, now_at);
        assert_eq!(timeline.elapsed(now), Duration::from_secs(5));
        assert!(timeline.deadline() < now, "the budget is spent");
    }
}
