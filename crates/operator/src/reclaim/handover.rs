//! What a handover is: the pods it acts on, its victims with their queues' settings, and its
//! timeline. [`super::begin`] builds one from the core's plan, [`super::resume`] from intent
//! annotations when a new leader finds one half done, and [`super::execute`] carries it out.

use std::net::IpAddr;
use std::time::Duration;

use gpuqueue_api::{
    annotations,
    v1alpha1::{CheckpointPolicy, VictimInFlight},
};
use gpuqueue_core::{
    model::{CheckpointSettings, PodKey},
    reclaim::BudgetFit,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Resource;
use tokio::time::Instant;

use super::{intent, timeline::Timeline};
use crate::checkpoint::{SkipReason, pod_address};

/// A pod the handover acts on.
#[derive(Clone, Debug)]
pub struct HandoverPod {
    pub key: PodKey,
    pub uid: String,
    pub reference: ObjectReference,
}

impl HandoverPod {
    pub fn of(pod: &Pod) -> Self {
        Self {
            key: PodKey::new(
                pod.metadata.namespace.clone().unwrap_or_default(),
                pod.metadata.name.clone().unwrap_or_default(),
            ),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            reference: pod.object_ref(&()),
        }
    }
}

/// A victim, with how its queue wants it checkpointed and evicted.
#[derive(Clone, Debug)]
pub struct Victim {
    pub target: HandoverPod,
    pub queue: String,
    pub checkpoint: CheckpointPolicy,
    pub grace: Duration,
    /// The pod IP from the API, the only address a checkpoint ever calls, or why the pod is
    /// not called (no IP yet, or the node's network: see [`pod_address`]).
    pub address: Result<IpAddr, SkipReason>,
    /// How far it got before this process took the handover on.
    pub progress: Progress,
    /// This process marked it `DisruptionTarget` when the reclaim started: its eviction is a
    /// delete. (A condition found on the pod may be stale or somebody else's: not trusted.)
    pub disruption_marked: bool,
}

/// How far a victim got when its handover was built (begun or resumed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Marked with the intent, nothing done yet.
    Marked,
    /// A process (this one or an earlier leader) already made the checkpoint call.
    Checkpointed,
    /// Being deleted or gone: nothing to checkpoint or evict.
    Leaving,
    /// Its intent was taken back because its queue no longer borrowed it ([`super::recheck`]):
    /// never checkpointed or evicted again.
    Spared,
}

impl Victim {
    /// A victim listed in the owner's intent that the store no longer holds: an earlier leader
    /// evicted it, or it went by itself.
    pub fn departed(
        victim: &VictimInFlight,
        checkpoint: CheckpointPolicy,
        grace: Duration,
    ) -> Self {
        let (namespace, name) = victim.pod.split_once('/').unwrap_or(("", &victim.pod));
        let mut reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            ..ObjectReference::default()
        };
        reference.uid = Some(victim.uid.clone());
        Self {
            target: HandoverPod {
                key: PodKey::new(namespace, name),
                uid: victim.uid.clone(),
                reference,
            },
            queue: victim.queue.clone(),
            checkpoint,
            grace,
            address: Err(SkipReason::NoPodIp),
            progress: Progress::Leaving,
            disruption_marked: false,
        }
    }

    pub fn of(pod: &Pod, queue: &str, checkpoint: CheckpointPolicy, grace: Duration) -> Self {
        Self {
            target: HandoverPod::of(pod),
            queue: queue.to_owned(),
            checkpoint,
            grace,
            address: pod_address(pod),
            progress: if pod.metadata.deletion_timestamp.is_some() {
                Progress::Leaving
            } else if intent::Mark::read(pod).is_some_and(|m| m.checkpoint_started) {
                Progress::Checkpointed
            } else {
                Progress::Marked
            },
            disruption_marked: false,
        }
    }
}

/// One handover in progress.
#[derive(Clone, Debug)]
pub struct Handover {
    pub id: String,
    pub owner: HandoverPod,
    pub owner_queue: String,
    /// The node freed for the owner.
    pub node: String,
    pub victims: Vec<Victim>,
    pub timeline: Timeline,
    /// PassTiming in intent annotations by a later process, not started by this one.
    pub resumed: bool,
    /// A victim was younger than its queue's `minBorrowDuration`, but no plan spared it.
    pub overrides_min_borrow: bool,
    /// What the budget keeps back after the checkpoint: the slowest victim's expected
    /// termination on the node plus the bind (the core's [`gpuqueue_core::termination`]).
    pub eviction_reserve: Duration,
    /// Whether the checkpoint, the termination and the bind fit in the budget, as judged when
    /// the handover was planned (or resumed).
    pub fit: BudgetFit,
    /// When the owner leaves the gate.
    pub release: OwnerRelease,
}

/// When a handover's owner leaves the gate ([`super::release`]).
#[derive(Clone, Debug)]
pub struct OwnerRelease {
    /// The victims of other reclaims on the node whose room the owner counts on too: it
    /// leaves the gate once they and its own are gone.
    pub awaits: Vec<HandoverPod>,
    /// kube-scheduler would preempt for the owner on the node: it stays at the gate until its
    /// room is free even when the handover ends without it (resumed: assumed).
    pub preempts: bool,
}

/// The span every log line of one handover carries, from its start to its end.
pub fn span(
    id: &str,
    owner_queue: &str,
    owner: &PodKey,
    node: &str,
    victims: usize,
) -> tracing::Span {
    tracing::info_span!("handover", reclaim = %id, owner_queue, %owner, node, victims)
}

impl Handover {
    /// The span every log line of this handover carries.
    pub fn span(&self) -> tracing::Span {
        span(
            &self.id,
            &self.owner_queue,
            &self.owner.key,
            &self.node,
            self.victims.len(),
        )
    }
}

/// When the owner was found blocked and when the plan was ready: the start and the first
/// phase of every handover planned in one admission pass.
#[derive(Clone, Copy, Debug)]
pub struct PassTiming {
    pub started: Instant,
    pub started_at: Timestamp,
    pub planned: Instant,
}

/// The outcome recorded when the owner is bound and every victim gone.
pub const COMPLETED: &str = "Completed";

/// A queue's checkpoint settings as the driver takes them. (A function, not a `From`: both
/// types belong to other crates.)
pub fn checkpoint_policy(settings: &CheckpointSettings) -> CheckpointPolicy {
    CheckpointPolicy {
        driver: settings.driver,
        port: settings.port.map(i32::from),
        path: settings.path.clone(),
        pause_mode: Some(settings.pause_mode),
        timeout: settings.timeout.into(),
    }
}

/// When a resumed handover's owner was bound, seen at `now`: the API server's `PodScheduled`
/// time rounded up to its next second (a condition keeps whole seconds), so that an owner bound
/// before the resume is not timed at the resume, and the time is never earlier than the bind
/// (a budget is never counted met that was not). `now` for an owner without the condition.
pub fn resumed_owner_bound(owner: &Pod, timeline: &Timeline, now: Instant) -> Instant {
    owner
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "PodScheduled"))
        .filter(|scheduled| scheduled.status == "True")
        .and_then(|scheduled| scheduled.last_transition_time.as_ref())
        .and_then(|at| at.0.checked_add(jiff::SignedDuration::from_secs(1)).ok())
        .map_or(now, |at| timeline.instant_of(at, now))
}

/// The QUEUE annotation of a pod: the queue it was admitted under.
pub fn admitted_queue(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(annotations::QUEUE)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{CheckpointClient, Checkpointer};

    /// Review finding: a handover resumed after a failover, whose owner was bound before it,
    /// was timed as bound at the resume, and counted over its budget.
    #[test]
    fn a_resumed_owner_is_timed_bound_when_the_api_server_scheduled_it() {
        let started_at: Timestamp = "2026-12-07T10:00:00.400Z".parse().unwrap();
        let now = Instant::now() + Duration::from_secs(30);
        let resumed_at = started_at + jiff::SignedDuration::from_secs(9);
        let timeline = Timeline::resumed(started_at, Duration::from_secs(3), now, resumed_at);
        let owner = |scheduled: Option<&str>| -> Pod {
            let conditions = scheduled.map(|at| {
                serde_json::json!([{"type": "PodScheduled", "status": "True", "lastTransitionTime": at}])
            });
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "o", "namespace": "online"},
                "status": {"conditions": conditions.unwrap_or_default()}}))
            .unwrap()
        };

        let bound = resumed_owner_bound(&owner(Some("2026-12-07T10:00:02Z")), &timeline, now);
        assert_eq!(
            timeline.elapsed(bound),
            Duration::from_millis(2_600),
            "the scheduled second's end, not the resume"
        );
        let early = resumed_owner_bound(&owner(Some("2026-12-07T09:59:58Z")), &timeline, now);
        assert_eq!(timeline.elapsed(early), Duration::ZERO);
        let unknown = resumed_owner_bound(&owner(None), &timeline, now);
        assert_eq!(unknown, now, "no condition: seen bound at the resume");
    }

    #[test]
    fn a_queue_policy_converts_without_loss() {
        let settings = CheckpointSettings {
            driver: gpuqueue_api::v1alpha1::CheckpointDriver::Vllm,
            port: Some(8000),
            path: None,
            pause_mode: gpuqueue_api::v1alpha1::PauseMode::Keep,
            timeout: Duration::from_millis(1500),
        };
        let policy = checkpoint_policy(&settings);
        assert_eq!(policy.port, Some(8000));
        assert_eq!(
            policy.pause_mode,
            Some(gpuqueue_api::v1alpha1::PauseMode::Keep)
        );
        let client = CheckpointClient::new().unwrap();
        assert_eq!(
            Checkpointer::from_policy(&policy, &client).timeout(),
            Duration::from_millis(1500)
        );
    }
}
