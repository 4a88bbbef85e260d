//! Finding handovers that no task of this process is running (an earlier leader died or lost
//! its lease mid-way) from the intent annotations, and deciding what each needs. Only pods
//! whose marks a reclaim in flight records are looked at ([`super::trust`]), and the deadline
//! and the victims come from that record, never from what a pod says.
//!
//! Writes happen in a fixed order: every victim's intent, then the owner's intent together
//! with its admission and release (or, for an owner held until its room is free, with its
//! admission and pin only), then (per victim) the checkpoint mark, the checkpoint call and the
//! eviction, the held owner's release once its room is free, and at the very end the owner's
//! intent is cleared. So the annotations alone say how far a handover got:
//!
//! | what the store shows for reclaim id X | what it means | what is done |
//! | --- | --- | --- |
//! | an owner, released or held (gated, admitted and pinned) | the owner was promised the node | **resume**: checkpoint the victims not marked `checkpointing`, evict those not terminating, wait (releasing a held owner once its room is free), record, clear |
//! | victims only (or a gated owner not admitted), deadline passed | the intent was never committed, or its owner is gone | **abandon**: clear the victims' marks (with the `DisruptionTarget` condition written with them); a victim already marked `checkpointing` (its server is paused) is resumed first, never evicted: with no owner waiting it is no longer a victim, and its queue may be within its guarantee by now |
//! | victims only, deadline not passed | another writer may still be committing it | wait for the deadline |
//!
//! No step is ever repeated: a victim marked `checkpointing` is never called again, a
//! terminating victim is never evicted again, and a released owner is never released again
//! (its gate is gone and its node selector can no longer change), only finished.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpuqueue_api::v1alpha1::{CheckpointDriver, CheckpointPolicy, VictimInFlight};
use gpuqueue_core::{
    model::{ReclaimSettings, is_gated, is_held_owner},
    reclaim::BudgetFit,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use super::{
    evict,
    handover::{
        Handover, HandoverPod, OwnerRelease, Progress, Victim, admitted_queue, checkpoint_policy,
    },
    intent::{self, Mark, Role},
    reclaimer::Reclaimer,
    release,
    timeline::Timeline,
    trust::{Recorded, Vouched},
};
use crate::{
    checkpoint::{Checkpointer, Resumed, pod_address},
    leader::Term,
};

/// What a reclaim found in the store needs.
#[derive(Debug, Clone)]
pub enum Recovery {
    /// Its owner is released, or held at the gate until its room is free: finish it.
    Resume {
        id: String,
        owner: Arc<Pod>,
        victims: Vec<Arc<Pod>>,
    },
    /// Its owner was never released and its deadline passed: take the intent back.
    Abandon {
        id: String,
        /// A gated owner carrying the intent but not its admission (not written by this
        /// version, but possible).
        owner: Option<Arc<Pod>>,
        victims: Vec<Arc<Pod>>,
    },
    /// Not committed yet and not stale yet: look again at `until`.
    NotYet { id: String, until: Timestamp },
}

impl Recovery {
    /// The reclaim's id.
    pub fn id(&self) -> &str {
        match self {
            Self::Resume { id, .. } | Self::Abandon { id, .. } | Self::NotYet { id, .. } => id,
        }
    }
}

/// The reclaims among `pods` (the pods of the store whose marks are recorded) that need
/// recovery at `now`, in id order; `skip` says which ids a task of this process is running,
/// `deadline` each reclaim's recorded deadline (`None`: unknown, then stale).
pub fn scan(
    pods: &[Arc<Pod>],
    skip: impl Fn(&str) -> bool,
    deadline: impl Fn(&str) -> Option<Timestamp>,
    now: Timestamp,
) -> Vec<Recovery> {
    let mut by_id: BTreeMap<String, Vec<(Mark, Arc<Pod>)>> = BTreeMap::new();
    for pod in pods {
        if let Some(mark) = Mark::read(pod)
            && !skip(&mark.id)
        {
            by_id
                .entry(mark.id.clone())
                .or_default()
                .push((mark, pod.clone()));
        }
    }
    by_id
        .into_iter()
        .map(|(id, members)| {
            let owner = members
                .iter()
                .find(|(m, pod)| {
                    m.role == Some(Role::Owner) && pod.metadata.deletion_timestamp.is_none()
                })
                .map(|(_, pod)| pod.clone());
            let victims: Vec<Arc<Pod>> = members
                .iter()
                .filter(|(m, _)| m.role == Some(Role::Victim))
                .map(|(_, pod)| pod.clone())
                .collect();
            if let Some(owner) = owner.as_ref().filter(|o| !is_gated(o) || is_held_owner(o)) {
                return Recovery::Resume {
                    id,
                    owner: owner.clone(),
                    victims,
                };
            }
            // An unknown deadline counts as passed: an intent nobody can date is stale.
            match deadline(&id) {
                Some(until) if now < until => Recovery::NotYet { id, until },
                _ => Recovery::Abandon { id, owner, victims },
            }
        })
        .collect()
}

/// What became of one pod of an abandoned reclaim.
pub(super) enum PodAbandon {
    /// Taken out; the note of its event.
    Done(String),
    /// Nothing left to do (gone, or no longer carrying this reclaim): nothing to announce.
    Nothing,
    /// Refused or failed: a later pass tries again.
    Later,
}

impl Reclaimer {
    /// The handover of a released owner, rebuilt from its record in flight (the victims, the
    /// start, the node) and the queues' specs. A listed victim whose queue no longer claims its
    /// namespace is left out (not evicted), and says why. With no plan, the budget keeps back
    /// what the core's rule says for the slowest victim's grace on the node, from the
    /// terminations observed so far, and the fit is judged from now.
    pub fn rebuild(
        &self,
        recorded: &Recorded,
        owner: &Pod,
        victims: &[Arc<Pod>],
        vouched: Vouched<'_>,
        now: Instant,
        now_at: Timestamp,
    ) -> Handover {
        let entry = &recorded.entry;
        let budget = self.settings(&recorded.queue).budget;
        let mut rebuilt = Vec::with_capacity(entry.victims.len());
        for listed in &entry.victims {
            if let Some(why) = vouched.claims.refuses_victim(&listed.pod, &listed.queue) {
                let (policy, grace) = self.victim_settings(&listed.queue);
                let refused = Victim::departed(listed, policy, grace).target;
                tracing::warn!(reclaim = %entry.id, victim = %listed.pod, "not evicted: {why}");
                self.announce_refused_victim(&entry.id, &refused, &why);
                continue;
            }
            let (policy, grace) = self.victim_settings(&listed.queue);
            // The victims the store still holds carry their progress.
            rebuilt.push(
                match victims
                    .iter()
                    .find(|pod| pod.metadata.uid.as_deref() == Some(listed.uid.as_str()))
                {
                    Some(pod) => Victim::of(pod, &listed.queue, policy, grace),
                    None => self.unmarked(listed, policy, grace),
                },
            );
        }
        let timeline = Timeline::resumed(entry.started_at.0, budget, now, now_at);
        let grace = rebuilt.iter().map(|v| v.grace).max().unwrap_or_default();
        let eviction_reserve = self.terminations.reserve(&entry.node, grace);
        // The plan is gone: the owner waits for every other victim on its node whose mark is
        // recorded (a mark anyone else wrote holds nothing back), and is assumed to be one
        // kube-scheduler would preempt for.
        let own: Vec<HandoverPod> = rebuilt.iter().map(|v| v.target.clone()).collect();
        let awaits = release::victims_on(vouched.pods, &entry.node, &own);
        // Only victims still to be called checkpoint: the others' time is spent or not needed.
        let checkpoint = rebuilt
            .iter()
            .filter(|v| v.progress == Progress::Marked)
            .map(|v| Checkpointer::from_policy(&v.checkpoint, &self.checkpoints))
            .filter(|c| c.driver() != CheckpointDriver::None)
            .map(|c| c.timeout())
            .max()
            .unwrap_or_default();
        let fit = BudgetFit::of(budget, eviction_reserve, checkpoint, timeline.elapsed(now));
        Handover {
            id: entry.id.clone(),
            owner: HandoverPod::of(owner),
            owner_queue: recorded.queue.clone(),
            node: entry.node.clone(),
            victims: rebuilt,
            timeline,
            resumed: true,
            overrides_min_borrow: false,
            eviction_reserve,
            fit,
            release: OwnerRelease {
                awaits,
                preempts: true,
            },
        }
    }

    /// A victim the record lists that no longer carries the intent: spared by an earlier leader
    /// if the store still holds it (and it is not leaving anyway), else gone.
    fn unmarked(
        &self,
        listed: &VictimInFlight,
        policy: CheckpointPolicy,
        grace: Duration,
    ) -> Victim {
        let departed = Victim::departed(listed, policy.clone(), grace);
        let Some(pod) = self.stored(&departed.target) else {
            return departed;
        };
        let victim = Victim::of(&pod, &listed.queue, policy, grace);
        match victim.progress {
            Progress::Leaving => victim,
            _ => Victim {
                progress: Progress::Spared,
                ..victim
            },
        }
    }

    /// Takes back the intent of an abandoned reclaim. Returns whether every pod is settled
    /// (`false`: something is left for a later pass).
    pub async fn abandon(
        &self,
        term: &Term,
        id: &str,
        owner: Option<&Pod>,
        victims: &[Arc<Pod>],
    ) -> bool {
        let reason = match owner {
            Some(owner) => format!(
                "its owner {} was never released before the deadline (the operator that started it stopped)",
                HandoverPod::of(owner).key
            ),
            None => "its owner was never released before the deadline (the operator that started it stopped), or is gone".to_owned(),
        };
        let mut settled = true;
        for pod in owner.into_iter().chain(victims.iter().map(AsRef::as_ref)) {
            if !term.is_current() {
                return false;
            }
            let target = HandoverPod::of(pod);
            match self.abandon_pod(id, &reason, pod, &target, false).await {
                PodAbandon::Done(note) => {
                    tracing::warn!(reclaim = id, pod = %target.key, "{note}");
                    self.announce_abandoned(&target, note);
                }
                PodAbandon::Nothing => {}
                PodAbandon::Later => settled = false,
            }
        }
        if settled {
            self.metrics.finished("abandoned");
        }
        settled
    }

    /// Takes one pod out of an abandoned reclaim: its intent is removed, and a victim whose
    /// checkpoint was made (its server is paused: the store's mark says so, or `called`)
    /// is asked to serve again first. Never evicted: the owner it was for is gone or was never
    /// released, or its queue no longer borrows it, and its queue may be within its guarantee
    /// by now (the soak caught the eviction that used to follow). `reason` says why the reclaim
    /// was abandoned.
    pub(super) async fn abandon_pod(
        &self,
        id: &str,
        reason: &str,
        pod: &Pod,
        target: &HandoverPod,
        called: bool,
    ) -> PodAbandon {
        let paused = (called || Mark::read(pod).is_some_and(|m| m.checkpoint_started))
            && pod.metadata.deletion_timestamp.is_none();
        let resumed = if paused {
            let queue = admitted_queue(pod).unwrap_or_default();
            let (policy, _) = self.victim_settings(queue);
            let checkpointer = Checkpointer::from_policy(&policy, &self.checkpoints);
            match checkpointer.resume(pod_address(pod)).await {
                Resumed::Resumed => {
                    "its server, paused by the checkpoint, was resumed; ".to_owned()
                }
                Resumed::NothingPaused => String::new(),
                Resumed::Failed(why) => {
                    tracing::warn!(reclaim = id, pod = %target.key, %why, "resuming the checkpointed victim of an abandoned reclaim failed; it is left paused");
                    format!(
                        "its server, paused by the checkpoint, could not be resumed ({why}) and is left paused; "
                    )
                }
            }
        } else {
            String::new()
        };
        // A victim the intent marked `DisruptionTarget` would otherwise keep the mark until
        // kube-controller-manager drops it, two minutes on, though it is not evicted.
        let marked = intent::carries_disruption_mark(pod, evict::DISRUPTION_REASON);
        match self.take_back_intent(pod, id, marked).await {
            Ok(()) => PodAbandon::Done(format!(
                "reclaim {id} was abandoned: {reason}; {resumed}its intent was removed and the pod is decided again"
            )),
            Err(error) if error.is_stale() => PodAbandon::Nothing,
            Err(error) => {
                tracing::warn!(reclaim = id, pod = %target.key, %error, "clearing a stale reclaim intent failed; tried again later");
                PodAbandon::Later
            }
        }
    }

    /// A queue's reclaim settings as the store shows them (defaults for a queue that is gone
    /// or invalid).
    fn settings(&self, queue: &str) -> ReclaimSettings {
        self.stores
            .queues
            .get(&ObjectRef::new(queue))
            .and_then(|stored| {
                let queue = stored.0.as_ref().ok()?;
                gpuqueue_core::model::Queue::from_api(queue).ok()
            })
            .map(|q| q.reclaim)
            .unwrap_or_default()
    }

    fn victim_settings(
        &self,
        queue: &str,
    ) -> (
        gpuqueue_api::v1alpha1::CheckpointPolicy,
        std::time::Duration,
    ) {
        let settings = self.settings(queue);
        (
            checkpoint_policy(&settings.checkpoint),
            settings.victim_grace,
        )
    }
}

#[cfg(test)]
mod tests {
    use gpuqueue_api::{ADMISSION_GATE, v1alpha1::ReclaimInFlight};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use serde_json::json;

    use super::*;

    fn pod(name: &str, role: &str, id: &str, deadline: &str, gated: bool) -> Arc<Pod> {
        let mut pod = json!({
            "metadata": {"name": name, "namespace": "ns", "uid": name,
                "annotations": {
                    "gpuqueue.io/reclaim-id": id,
                    "gpuqueue.io/reclaim-role": role,
                    "gpuqueue.io/reclaim-deadline": deadline,
                    "gpuqueue.io/reclaim-node": "n1",
                }},
            "spec": {"containers": []},
        });
        if gated {
            pod["spec"]["schedulingGates"] = json!([{"name": ADMISSION_GATE}]);
        }
        Arc::new(serde_json::from_value(pod).unwrap())
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const DEADLINE: &str = "2026-01-01T00:00:03Z";

    /// The recorded deadlines: rc-1 and rc-2 end at DEADLINE, any other id is unknown.
    fn deadline(id: &str) -> Option<Timestamp> {
        ["rc-1", "rc-2"].contains(&id).then(|| at(DEADLINE))
    }

    #[test]
    fn a_released_owner_is_resumed_with_its_victims() {
        let pods = vec![
            pod("owner", "owner", "rc-1", DEADLINE, false),
            pod("v1", "victim", "rc-1", DEADLINE, false),
            pod("v2", "victim", "rc-1", DEADLINE, false),
            pod("other", "victim", "rc-2", DEADLINE, false),
        ];
        let found = scan(
            &pods,
            |id| id == "rc-2",
            deadline,
            at("2026-01-01T00:01:00Z"),
        );
        assert_eq!(found.len(), 1, "{found:?}");
        let Recovery::Resume { id, owner, victims } = &found[0] else {
            panic!("{found:?}")
        };
        assert_eq!(id, "rc-1");
        assert_eq!(owner.metadata.name.as_deref(), Some("owner"));
        assert_eq!(victims.len(), 2);
    }

    #[test]
    fn victims_without_a_released_owner_wait_for_the_deadline_then_are_abandoned() {
        let pods = vec![
            pod("v1", "victim", "rc-1", DEADLINE, false),
            pod("gated-owner", "owner", "rc-2", DEADLINE, true),
        ];
        let before = scan(&pods, |_| false, deadline, at("2026-01-01T00:00:02Z"));
        assert!(
            before
                .iter()
                .all(|r| matches!(r, Recovery::NotYet { until, .. } if *until == at(DEADLINE))),
            "{before:?}"
        );
        let after = scan(&pods, |_| false, deadline, at(DEADLINE));
        assert!(
            matches!(&after[0], Recovery::Abandon { id, owner: None, victims } if id == "rc-1" && victims.len() == 1),
            "{after:?}"
        );
        assert!(
            matches!(&after[1], Recovery::Abandon { id, owner: Some(_), victims } if id == "rc-2" && victims.is_empty()),
            "{after:?}"
        );
    }

    #[test]
    fn an_owner_held_at_the_gate_admitted_and_pinned_is_resumed() {
        let mut held = (*pod("owner", "owner", "rc-1", DEADLINE, true)).clone();
        held.metadata.annotations.as_mut().unwrap().insert(
            "gpuqueue.io/admitted-at".into(),
            "2026-01-01T00:00:00Z".into(),
        );
        held.spec.as_mut().unwrap().node_selector =
            Some([("kubernetes.io/hostname".to_owned(), "n1".to_owned())].into());
        let pods = vec![Arc::new(held), pod("v1", "victim", "rc-1", DEADLINE, false)];
        let found = scan(&pods, |_| false, deadline, at("2026-01-01T00:00:01Z"));
        assert!(
            matches!(&found[0], Recovery::Resume { id, victims, .. } if id == "rc-1" && victims.len() == 1),
            "{found:?}"
        );
    }

    #[test]
    fn an_intent_without_a_recorded_deadline_is_stale() {
        let pods = vec![pod("v1", "victim", "rc-9", "2099-01-01T00:00:00Z", false)];
        let found = scan(&pods, |_| false, deadline, at("2026-01-01T00:00:00Z"));
        assert!(matches!(&found[0], Recovery::Abandon { .. }), "{found:?}");
    }

    #[test]
    fn the_deadline_a_pod_carries_is_not_the_one_waited_for() {
        // Annotated "2099", recorded DEADLINE: stale at DEADLINE all the same.
        let pods = vec![pod("v1", "victim", "rc-1", "2099-01-01T00:00:00Z", false)];
        let found = scan(&pods, |_| false, deadline, at(DEADLINE));
        assert!(matches!(&found[0], Recovery::Abandon { .. }), "{found:?}");
    }

    #[test]
    fn pods_without_an_intent_need_nothing() {
        let plain: Arc<Pod> = Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"}})).unwrap(),
        );
        assert!(scan(&[plain], |_| false, deadline, at(DEADLINE)).is_empty());
    }

    /// Test audit finding: README promises that a resumed reclaim evicts no pod its queue
    /// no longer claims (with a `ReclaimVictimRefused` event); only the predicate was tested.
    #[tokio::test]
    async fn a_resumed_reclaim_keeps_only_the_victims_their_queue_still_claims() {
        let listed = |pod: &str| VictimInFlight {
            pod: pod.into(),
            uid: format!("uid-{pod}"),
            queue: "batch".into(),
        };
        let recorded = Recorded {
            queue: "online".into(),
            entry: ReclaimInFlight {
                id: "rc-1".into(),
                owner_pod: "online/owner".into(),
                owner_uid: "owner".into(),
                node: "n1".into(),
                // Online's namespace, listed as batch's: not batch's to give.
                victims: vec![listed("batch/victim"), listed("online/not-batch")],
                started_at: MicroTime(at("2026-01-01T00:00:00Z")),
                deadline: MicroTime(at(DEADLINE)),
            },
        };
        let stores = crate::cluster::testing::claiming_stores();
        let claims = crate::reclaim::trust::Claims::read(&stores.stores);
        let reclaimer = Reclaimer::for_tests(crate::mock_api::stalled(), stores.stores.clone());
        let owner = pod("owner", "owner", "rc-1", DEADLINE, true);
        let vouched = Vouched {
            claims: &claims,
            pods: &[],
        };
        let now = Instant::now();
        let handover = reclaimer.rebuild(&recorded, &owner, &[], vouched, now, at(DEADLINE));
        let kept: Vec<String> = handover
            .victims
            .iter()
            .map(|v| v.target.key.to_string())
            .collect();
        assert_eq!(kept, ["batch/victim"]);
    }
}
