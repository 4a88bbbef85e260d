//! The victim terminations the executor observes, per node, for the core's budget rule
//! ([`gpuqueue_core::termination`]): each victim's time from its eviction being accepted to
//! its end (phase terminal, or the pod gone), recorded when a handover of this process
//! settles, and read from the queues' `status.lastHandovers` for the handovers other processes
//! ran (an earlier leader), so that a new leader does not plan from the prior alone.
//!
//! A record holds the handover's phases, not each victim's: its sample is `victimsGone` minus
//! `evictAccepted` (the last victim's termination after the last eviction), with the grace of
//! the victims' queues as their specs say now. Each reclaim id is counted once, whichever way
//! it is seen first.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuqueue_api::v1alpha1::{GpuQueue, HandoverRecord};
use gpuqueue_core::{
    model::{Queue, ReclaimSettings},
    termination::Terminations,
};
use tokio::time::Instant;

use super::{intent::VICTIM, timeline::Phase};

/// How long a reclaim counted from this process's own observation is remembered while its
/// record does not show yet (the queue watch lags the record's write).
const REMEMBER: Duration = Duration::from_mins(10);

/// The terminations observed so far, shared by the admission loop and the handover tasks.
#[derive(Clone, Debug, Default)]
pub struct ObservedTerminations(Arc<Mutex<Observed>>);

#[derive(Debug, Default)]
struct Observed {
    terminations: Terminations,
    /// Reclaim ids already counted, with when this process counted them.
    counted: HashMap<String, Instant>,
}

/// One sample a handover record gives.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RecordSample {
    id: String,
    node: String,
    took: Duration,
    grace: Duration,
}

impl ObservedTerminations {
    /// Records what reclaim `id` observed on `node`: each victim's termination and grace.
    pub fn record(&self, id: &str, node: &str, samples: &[(Duration, Duration)]) {
        let mut observed = crate::sync::lock(&self.0);
        if observed.counted.contains_key(id) {
            return;
        }
        observed.counted.insert(id.to_owned(), Instant::now());
        for (took, grace) in samples {
            observed.terminations.record(node, *took, *grace);
        }
    }

    /// How many terminations `node` has shown (at most the core's history).
    pub fn observed(&self, node: &str) -> usize {
        crate::sync::lock(&self.0).terminations.observed(node)
    }

    /// What the budget keeps back for victims with `grace` on `node`, as the core's rule says.
    pub fn reserve(&self, node: &str, grace: Duration) -> Duration {
        crate::sync::lock(&self.0).terminations.reserve(node, grace)
    }

    /// Counts the records of `queues` not counted yet, and returns every termination known.
    pub fn read(&self, queues: &[&GpuQueue], now: Instant) -> Terminations {
        let samples = record_samples(queues);
        let mut observed = crate::sync::lock(&self.0);
        for sample in &samples {
            if observed.counted.contains_key(&sample.id) {
                continue;
            }
            observed.counted.insert(sample.id.clone(), now);
            observed
                .terminations
                .record(&sample.node, sample.took, sample.grace);
        }
        // Forget an id once its record is gone from every queue (a record cut from the list
        // never comes back) and its own observation is old.
        let recorded: Vec<&str> = queues
            .iter()
            .flat_map(|q| q.status.iter().flat_map(|s| &s.last_handovers))
            .map(|r| r.id.as_str())
            .collect();
        observed.counted.retain(|id, at| {
            recorded.contains(&id.as_str()) || now.saturating_duration_since(*at) < REMEMBER
        });
        observed.terminations.clone()
    }
}

/// The samples the victim records of `queues` give, one per reclaim id (the longest grace of
/// its victims' queues). An owner record is not read: the victim records carry the queue
/// whose grace the victims had.
fn record_samples(queues: &[&GpuQueue]) -> Vec<RecordSample> {
    let mut by_id: BTreeMap<&str, RecordSample> = BTreeMap::new();
    for queue in queues {
        // An invalid queue's pods were evicted with the default grace.
        let grace = Queue::from_api(queue).map_or_else(
            |_| ReclaimSettings::default().victim_grace,
            |q| q.reclaim.victim_grace,
        );
        let records = queue.status.iter().flat_map(|s| &s.last_handovers);
        for record in records.filter(|r| r.role == VICTIM) {
            let Some(took) = termination(record) else {
                continue;
            };
            by_id
                .entry(record.id.as_str())
                .and_modify(|s| s.grace = s.grace.max(grace))
                .or_insert_with(|| RecordSample {
                    id: record.id.clone(),
                    node: record.node.clone(),
                    took,
                    grace,
                });
        }
    }
    by_id.into_values().collect()
}

/// `victimsGone` minus `evictAccepted` of a record that has both.
fn termination(record: &HandoverRecord) -> Option<Duration> {
    let at = |phase: Phase| {
        record
            .phases
            .iter()
            .find(|p| p.phase == phase.as_str())
            .map(|p| p.at_millis)
    };
    let took = at(Phase::VictimsGone)?.checked_sub(at(Phase::EvictAccepted)?)?;
    u64::try_from(took).ok().map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn queue(name: &str, grace: u32, records: &serde_json::Value) -> GpuQueue {
        serde_json::from_value(json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": name},
            "spec": {"namespaces": [name],
                "resources": [{"name": "nvidia.com/gpu", "guaranteed": 1}],
                "reclaim": {"budget": "20s", "victimGracePeriodSeconds": grace}},
            "status": {"lastHandovers": records},
        }))
        .unwrap()
    }

    fn record(id: &str, role: &str, evicted: i64, gone: i64) -> serde_json::Value {
        json!({"id": id, "role": role, "ownerPod": "online/o", "node": "n1",
            "outcome": "Completed", "budgetMillis": 3000, "totalMillis": 2000,
            "phases": [{"phase": "evictAccepted", "atMillis": evicted},
                {"phase": "victimsGone", "atMillis": gone}]})
    }

    #[test]
    fn a_record_gives_one_sample_per_reclaim_with_its_victims_longest_grace() {
        let queues = [
            queue("batch", 1, &json!([record("rc-1", "victim", 900, 1600)])),
            queue("train", 5, &json!([record("rc-1", "victim", 900, 1600)])),
            queue("online", 1, &json!([record("rc-1", "owner", 900, 1600)])),
        ];
        assert_eq!(
            record_samples(&queues.iter().collect::<Vec<_>>()),
            [RecordSample {
                id: "rc-1".into(),
                node: "n1".into(),
                took: Duration::from_millis(700),
                grace: Duration::from_secs(5),
            }]
        );
        // A record without both phases (a victim that never went) gives none.
        let mut unfinished = record("rc-2", "victim", 900, 0);
        unfinished["phases"] = json!([{"phase": "evictAccepted", "atMillis": 900}]);
        assert!(record_samples(&[&queue("batch", 1, &json!([unfinished]))]).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reclaim_is_counted_once_whether_observed_or_read_first() {
        let observed = ObservedTerminations::default();
        let second = Duration::from_secs(1);
        observed.record("rc-1", "n1", &[(Duration::from_millis(700), second)]);
        let queues = [&queue(
            "batch",
            1,
            &json!([
                record("rc-1", "victim", 900, 1600),
                record("rc-2", "victim", 900, 1500)
            ]),
        )];
        let now = Instant::now();
        assert_eq!(observed.read(&queues, now).observed("n1"), 2);
        assert_eq!(observed.read(&queues, now).observed("n1"), 2, "read again");
        // Long after, with the records still there, nothing is counted twice.
        tokio::time::advance(REMEMBER * 2).await;
        assert_eq!(observed.read(&queues, Instant::now()).observed("n1"), 2);
        observed.record("rc-1", "n1", &[(Duration::from_millis(700), second)]);
        assert_eq!(observed.read(&queues, Instant::now()).observed("n1"), 2);
    }
}
