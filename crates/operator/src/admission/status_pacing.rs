//! How often a queue's status is written. What an admin, a GitOps tool or a handover acts on
//! (a condition's status or reason, a quota edit, the observed generation) is written at once;
//! a change of counters alone (pods and GPUs admitted, pending, borrowed, lent, the summary,
//! a condition's message) at most once per [`COUNTERS_EVERY`] per queue.
//!
//! Why: a burst of owner pods changes the counters at every pass, and each status write costs
//! the API server a decode, schema validation and encode of the whole GpuQueue. Profiled on
//! the handover benchmark (`BENCH_BURST_NONE_PODS=12`, KWOK fast stages, with 32 handover
//! records a queue), GpuQueue status writes took 31% of kube-apiserver's CPU while it was the
//! machine's bottleneck, and slowed every eviction and bind of the burst. The gauges are
//! published at every pass regardless: only the object written waits.

use std::collections::HashMap;

use gpuqueue_api::v1alpha1::GpuQueueStatus;
use jiff::{SignedDuration, Timestamp};

/// The least time between two writes of a queue's status whose counters alone changed.
pub(super) const COUNTERS_EVERY: SignedDuration = SignedDuration::from_secs(1);

/// When each queue's status was last written (by queue uid), this term.
#[derive(Debug, Default)]
pub(super) struct StatusPacing {
    written: HashMap<String, Timestamp>,
}

impl StatusPacing {
    /// `None` when the queue with `uid` may have `next` written now; else when it may.
    pub(super) fn held_until(
        &self,
        uid: &str,
        previous: Option<&GpuQueueStatus>,
        next: &GpuQueueStatus,
        now: Timestamp,
    ) -> Option<Timestamp> {
        if !previous.is_some_and(|previous| counters_only(previous, next)) {
            return None;
        }
        let due = self.written.get(uid)?.checked_add(COUNTERS_EVERY).ok()?;
        (now < due).then_some(due)
    }

    /// Remembers a write of the queue with `uid` started at `now`, and forgets writes long
    /// enough ago to hold nothing back.
    pub(super) fn wrote(&mut self, uid: &str, now: Timestamp) {
        self.written
            .retain(|_, at| at.checked_add(COUNTERS_EVERY).is_ok_and(|due| due > now));
        self.written.insert(uid.to_owned(), now);
    }
}

/// Whether `next` differs from `previous` in counters only: the same observed generation,
/// quotas (guaranteed and ceiling per resource) and conditions (type, status and reason).
fn counters_only(previous: &GpuQueueStatus, next: &GpuQueueStatus) -> bool {
    let quotas = |s: &GpuQueueStatus| -> Vec<(String, i64, i64)> {
        s.resources
            .iter()
            .map(|r| (r.name.clone(), r.guaranteed, r.ceiling))
            .collect()
    };
    let conditions = |s: &GpuQueueStatus| -> Vec<(String, String, String)> {
        s.conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    };
    previous.observed_generation == next.observed_generation
        && quotas(previous) == quotas(next)
        && conditions(previous) == conditions(next)
}

#[cfg(test)]
mod tests {
    use gpuqueue_api::v1alpha1::ResourceStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;

    fn status(allocated: i64, ceiling: i64, reclaiming: &str) -> GpuQueueStatus {
        GpuQueueStatus {
            observed_generation: Some(3),
            resources: vec![ResourceStatus {
                name: "nvidia.com/gpu".into(),
                guaranteed: 8,
                ceiling,
                allocated,
                ..ResourceStatus::default()
            }],
            admitted_pods: i32::try_from(allocated).unwrap(),
            conditions: vec![Condition {
                type_: "Reclaiming".into(),
                status: reclaiming.into(),
                reason: "Reclaiming".into(),
                message: format!("{allocated} allocated"),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: Some(3),
            }],
            ..GpuQueueStatus::default()
        }
    }

    fn at(millis: i64) -> Timestamp {
        Timestamp::from_millisecond(millis).unwrap()
    }

    #[test]
    fn counters_wait_for_their_turn_and_are_written_when_it_comes() {
        let mut pacing = StatusPacing::default();
        let (before, after) = (status(3, 24, "True"), status(4, 24, "True"));
        // Never written this term: at once.
        assert_eq!(pacing.held_until("q", Some(&before), &after, at(0)), None);
        pacing.wrote("q", at(0));
        assert_eq!(
            pacing.held_until("q", Some(&before), &after, at(400)),
            Some(at(1000))
        );
        assert_eq!(
            pacing.held_until("q", Some(&before), &after, at(1000)),
            None
        );
        // Another queue has its own turn.
        assert_eq!(pacing.held_until("r", Some(&before), &after, at(400)), None);
    }

    #[test]
    fn what_someone_acts_on_is_written_at_once() {
        let mut pacing = StatusPacing::default();
        pacing.wrote("q", at(0));
        let before = status(3, 24, "True");
        let now = at(10);
        // A condition's status, a quota edit, the observed generation, a first status.
        assert_eq!(
            pacing.held_until("q", Some(&before), &status(3, 24, "False"), now),
            None
        );
        assert_eq!(
            pacing.held_until("q", Some(&before), &status(3, 16, "True"), now),
            None
        );
        let mut generation = before.clone();
        generation.observed_generation = Some(4);
        assert_eq!(
            pacing.held_until("q", Some(&before), &generation, now),
            None
        );
        assert_eq!(pacing.held_until("q", None, &before, now), None);
    }

    #[test]
    fn old_writes_are_forgotten() {
        let mut pacing = StatusPacing::default();
        pacing.wrote("q", at(0));
        pacing.wrote("r", at(1500));
        assert_eq!(pacing.written.len(), 1);
    }
}
