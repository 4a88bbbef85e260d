//! Starting a handover from the core's plan, inside the admission pass that made it: the
//! reclaim recorded in its owner queue's status (the only evidence its pod annotations are
//! believed, see [`super::trust`]), the intent on every victim (with the `DisruptionTarget` mark
//! on those no budget guards, in the same write: their eviction is then one delete), then the
//! owner's intent together with its admission and pin, in the order [`super::resume`] relies
//! on (the owner keeps its gate until its room is free: [`super::release`]). What a failed
//! start wrote is taken back, marks included; an intent that could not be keeps the reclaim
//! recorded, for recovery to abandon once its deadline passed.
//!
//! A burst starts many handovers in one pass: each is [`prepared`](Reclaimer::prepare) (no
//! write), every one of an owner queue is recorded in one status write
//! ([`Reclaimer::record_in_flight`]), and their pods are written, all at once.
//!
//! The victims' intents are written while that status write is in flight, and the owner is
//! admitted only once both landed: one round trip less before the eviction, and as crash-safe.
//! A victim's intent and its mark go through `pods/status`, which writes metadata too: one
//! write per victim instead of two, 12 fewer pod writes in a 12-owner burst, while
//! kube-apiserver is what the burst waits on (`e2e/results/burst-trials.md`).
//! A leader that stops in between leaves either an entry whose pods carry nothing (forgotten
//! once its deadline passed, like a start that failed) or marks no entry vouches for (ignored
//! and never trusted, [`super::trust`]); an owner is never admitted, and no victim evicted,
//! before its reclaim is recorded and every victim marked.

use std::sync::Arc;

use futures::future::join_all;
use gpuqueue_core::{
    model::{AdmittedAs, PodKey},
    reclaim::ReclaimPlan,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;
use tracing::{Instrument, Span};

use gpuqueue_api::v1alpha1::ReclaimInFlight;

use super::{
    disruption,
    evict::{self, Guard},
    handover::{self, Handover, HandoverPod, OwnerRelease, PassTiming, Victim, checkpoint_policy},
    in_flight::{self, InFlightError},
    intent::{self, Intent, VictimRef},
    reclaimer::Reclaimer,
    timeline::{Phase, Timeline},
    trust::Claims,
};
use crate::{
    leader::Term,
    writes::pod::{self as patch, PatchError},
};

/// A handover whose owner is released: run it with [`Reclaimer::run`].
#[derive(Debug)]
pub struct Reservation {
    /// The owner as the API server returned it, released and pinned.
    pub owner: Pod,
    /// Each victim as the store showed it when its intent was written, and as the API server
    /// returned it, marked.
    pub victims: Vec<(Arc<Pod>, Pod)>,
    pub handover: Handover,
}

/// Why a handover did not start. Whatever was written is taken back (or, if that fails too,
/// left to go stale and be cleaned up after the deadline).
#[derive(Debug, thiserror::Error)]
pub enum BeginError {
    #[error("victim {0} of the plan is no longer in the store")]
    VictimGone(PodKey),
    #[error("this replica is no longer the leader")]
    NotLeader,
    #[error("victim {victim} of the plan is not evicted: {why}")]
    VictimQueue { victim: PodKey, why: String },
    #[error(transparent)]
    InFlight(#[from] InFlightError),
    /// The owner queue's status write of the pass failed (reported once, for all its reclaims).
    #[error("the reclaim was not recorded in its owner queue's status.reclaimsInFlight")]
    NotRecorded,
    #[error(transparent)]
    Write(#[from] PatchError),
}

impl BeginError {
    /// Whether a pod moved on under the plan (the next pass decides again from fresh state).
    pub fn is_stale(&self) -> bool {
        match self {
            Self::VictimGone(_) | Self::NotLeader => true,
            Self::VictimQueue { .. } | Self::InFlight(_) | Self::NotRecorded => false,
            Self::Write(error) => error.is_stale(),
        }
    }

    /// The kind of failure, in snake case: the label a failure counter carries.
    pub fn category(&self) -> &'static str {
        match self {
            Self::VictimGone(_) => "victim_gone",
            Self::NotLeader => "not_leader",
            Self::VictimQueue { .. } => "victim_queue",
            Self::InFlight(InFlightError::Full { .. }) => "reclaims_in_flight_full",
            Self::InFlight(InFlightError::Api { .. }) => "reclaims_in_flight_api",
            Self::NotRecorded => "not_recorded",
            Self::Write(error) => error.category(),
        }
    }
}

/// A start that failed after writing intents, and whether one of them could not be taken back.
#[derive(Debug)]
struct Failed {
    error: BeginError,
    intents_left: bool,
}

impl Failed {
    /// A failure before anything was written.
    fn cleanly(error: BeginError) -> Self {
        Self {
            error,
            intents_left: false,
        }
    }
}

/// A handover planned and checked against the store, not yet written anywhere: its entry goes
/// into its owner queue's `status.reclaimsInFlight` first ([`Reclaimer::record_in_flight`]),
/// then [`Reclaimer::begin`] writes its pods.
#[derive(Debug)]
pub struct Prepared<'a> {
    pub plan: &'a ReclaimPlan,
    owner: &'a Pod,
    found: PassTiming,
    timeline: Timeline,
    stored: Vec<Arc<Pod>>,
    intent: Intent,
    /// Its entry in the owner queue's `status.reclaimsInFlight`.
    pub entry: ReclaimInFlight,
    span: Span,
}

impl Reclaimer {
    /// Checks `plan` against the store (its victims still there, in the queues that claim
    /// them) and gives the handover its id, intent and in-flight entry, for `owner` as the
    /// store shows it. Writes nothing.
    pub fn prepare<'a>(
        &self,
        plan: &'a ReclaimPlan,
        owner: &'a Pod,
        found: PassTiming,
    ) -> Result<Prepared<'a>, BeginError> {
        let id = intent::new_id();
        let span = handover::span(
            &id,
            &plan.owner_queue,
            &plan.owner_key,
            &plan.node_name,
            plan.victims.len(),
        );
        let mut timeline = Timeline::new(found.started, found.started_at, plan.budget);
        timeline.end(Phase::Plan, found.planned);
        let stored = self.stored_victims(plan)?;
        self.check_victim_queues(plan)?;
        let intent = Intent {
            id,
            deadline: timeline.deadline_at(),
            node: plan.node_name.clone(),
            victims: victim_refs(plan, &stored),
        };
        let entry = in_flight::from_intent(&intent, &HandoverPod::of(owner), found.started_at);
        Ok(Prepared {
            plan,
            owner,
            found,
            timeline,
            stored,
            intent,
            entry,
            span,
        })
    }

    /// Records the reclaims of `entries` (prepared, all of owner queue `queue`) in that queue's
    /// `status.reclaimsInFlight`, in one write, before any owner is released.
    pub async fn record_in_flight(
        &self,
        term: &Term,
        queue: &str,
        entries: &[ReclaimInFlight],
    ) -> Result<(), BeginError> {
        if !term.is_current() {
            return Err(BeginError::NotLeader);
        }
        let entries: Vec<&ReclaimInFlight> = entries.iter().collect();
        let stored = self.stores.queues.get(&ObjectRef::new(queue));
        let stored = stored.as_ref().and_then(|q| q.0.as_ref().ok());
        in_flight::add(&self.queues(), queue, stored, &entries).await?;
        Ok(())
    }

    /// Records the intent on every victim while `recorded` (the write of this reclaim's entry in
    /// its owner queue's status: whether it landed) runs, then, once both did, on the owner
    /// together with its release. `BeginError::NotRecorded` when the entry was not written:
    /// the intents are taken back.
    pub async fn begin(
        &self,
        term: &Term,
        prepared: Prepared<'_>,
        recorded: impl Future<Output = bool>,
    ) -> Result<Reservation, BeginError> {
        let span = prepared.span.clone();
        self.begin_traced(term, prepared, recorded)
            .instrument(span)
            .await
    }

    async fn begin_traced(
        &self,
        term: &Term,
        prepared: Prepared<'_>,
        recorded: impl Future<Output = bool>,
    ) -> Result<Reservation, BeginError> {
        let _events_wait = self.events.hold();
        let Prepared {
            plan,
            owner,
            found,
            mut timeline,
            stored,
            intent,
            ..
        } = prepared;

        // 1. Intent on every victim, at once, while the reclaim is recorded; a victim no budget
        //    guards is marked `DisruptionTarget` in the same write.
        let (marked, recorded) =
            futures::join!(self.mark_victims(term, &stored, &intent), recorded);
        let marked = match (marked, recorded) {
            (Ok(marked), true) => marked,
            (Ok(marked), false) => {
                self.take_back(&marked, &intent.id).await;
                return Err(BeginError::NotRecorded);
            }
            (Err(failed), true) => {
                return Err(self
                    .forget_in_flight(&plan.owner_queue, &intent.id, failed)
                    .await);
            }
            (Err(_), false) => return Err(BeginError::NotRecorded),
        };
        timeline.end(Phase::Intent, Instant::now());
        self.crash_after(Phase::Intent, &intent.id);

        // 2. Reserve: the owner's intent, admission and pin, in one patch (it stays gated).
        let owner = match self
            .reserve_owner(term, owner, plan, &intent, found.started_at, &marked)
            .await
        {
            Ok(owner) => owner,
            Err(failed) => {
                return Err(self
                    .forget_in_flight(&plan.owner_queue, &intent.id, failed)
                    .await);
            }
        };
        let (marked, disruption_marked): (Vec<Pod>, Vec<bool>) = marked.into_iter().unzip();
        timeline.end(Phase::Reserve, Instant::now());
        self.crash_after(Phase::Reserve, &intent.id);

        let awaits = self.awaited(&plan.awaits);
        let handover = reserved_handover(
            plan,
            intent.id,
            &owner,
            (&marked, &disruption_marked),
            timeline,
            awaits,
        );
        self.metrics.started(Instant::now());
        self.announce_start(&handover);
        Ok(Reservation {
            owner,
            victims: stored.into_iter().zip(marked).collect(),
            handover,
        })
    }

    /// Every victim's queue is the queue that claims the victim's namespace (the core plans
    /// that way; this holds even if its view was wrong), or nothing starts.
    fn check_victim_queues(&self, plan: &ReclaimPlan) -> Result<(), BeginError> {
        let claims = Claims::read(&self.stores);
        for victim in &plan.victims {
            if let Some(why) = claims.refuses_victim(&victim.key.to_string(), &victim.queue) {
                return Err(BeginError::VictimQueue {
                    victim: victim.key.clone(),
                    why,
                });
            }
        }
        Ok(())
    }

    /// Takes the reclaim out of its owner queue's status after a failed start (best effort: an
    /// entry left behind is removed once its deadline passed); returns the start's error. An
    /// entry is kept while an intent it wrote could not be taken back: recovery abandons that
    /// intent after the deadline, through the entry (without it the mark is believed by
    /// nobody and cleaned by nobody).
    async fn forget_in_flight(&self, owner_queue: &str, id: &str, failed: Failed) -> BeginError {
        if failed.intents_left {
            tracing::warn!(
                reclaim = id,
                "a failed start left an intent on a victim; its reclaim stays in status.reclaimsInFlight until recovery abandons it after the deadline"
            );
        } else if let Err(error) = in_flight::remove(&self.queues(), owner_queue, id).await {
            tracing::warn!(reclaim = id, %error, "taking a reclaim out of status.reclaimsInFlight failed; removed once stale");
        }
        failed.error
    }

    /// The plan's victims as the store shows them, or the first one it no longer holds.
    fn stored_victims(&self, plan: &ReclaimPlan) -> Result<Vec<Arc<Pod>>, BeginError> {
        plan.victims
            .iter()
            .map(|victim| {
                self.stores
                    .pods
                    .get(&ObjectRef::new(&victim.key.name).within(&victim.key.namespace))
                    // A pod created under its name since is not the victim planned.
                    .filter(|stored| stored.metadata.uid == victim.uid)
                    .ok_or_else(|| BeginError::VictimGone(victim.key.clone()))
            })
            .collect()
    }

    /// Writes the intent on every victim at once, with the `DisruptionTarget` mark on each no
    /// budget guards (its eviction is then one delete); each victim as the API server returned
    /// it, and whether it was marked. On a failure, the intents and marks already written are
    /// taken back.
    async fn mark_victims(
        &self,
        term: &Term,
        stored: &[Arc<Pod>],
        intent: &Intent,
    ) -> Result<Vec<(Pod, bool)>, Failed> {
        if !term.is_current() {
            return Err(Failed::cleanly(BeginError::NotLeader));
        }
        let written = join_all(stored.iter().map(|pod| self.mark_victim(pod, intent))).await;
        let mut marked = Vec::with_capacity(written.len());
        let mut failure = None;
        // A write that failed with no answer (a timeout, an API server restarting) may have
        // landed: its intent may be on the pod, which is not in `marked` to take it back.
        let mut unanswered = false;
        for result in written {
            match result {
                Ok(pod) => marked.push(pod),
                Err(error) => {
                    unanswered |= matches!(error, PatchError::Api { .. });
                    failure = failure.or(Some(error));
                }
            }
        }
        if let Some(error) = failure {
            let intents_left = !self.take_back(&marked, &intent.id).await || unanswered;
            return Err(Failed {
                error: error.into(),
                intents_left,
            });
        }
        Ok(marked)
    }

    /// Writes the intent on `pod`, with the `DisruptionTarget` mark through `pods/status` when
    /// no budget guards it and nobody else marks it now ([`intent::disrupted_by_another`]); the
    /// pod as the API server returned it, and whether it was marked. Both refused by an
    /// admission policy or webhook (on `pods/status`, where the intent alone may not be): the
    /// intent goes alone, and the victim is marked just before its delete, or evicted through
    /// the Eviction API ([`evict`]).
    async fn mark_victim(&self, pod: &Pod, intent: &Intent) -> Result<(Pod, bool), PatchError> {
        let victim = HandoverPod::of(pod);
        if disruption::guard(&self.stores, &victim.key, &victim.uid) == Guard::Unbudgeted
            && !intent::disrupted_by_another(pod, evict::DISRUPTION_REASON)
        {
            let condition = evict::disruption_target();
            let patch = intent::victim_intent_and_disruption_patch(pod, intent, &condition)?;
            match self.patch_pod_status(pod, patch).await {
                Ok(marked) => return Ok((marked, true)),
                Err(error @ PatchError::Refused { .. }) => {
                    tracing::warn!(pod = %victim.key, %error,
                    "the intent and DisruptionTarget mark were refused together; writing the intent alone");
                }
                Err(error) => return Err(error),
            }
        }
        let patch = intent::victim_intent_patch(pod, intent)?;
        self.patch_pod(pod, patch)
            .await
            .map(|unmarked| (unmarked, false))
    }

    /// Writes the owner's intent, admission and pin in one patch, as admitted within its
    /// guarantee at `at`, keeping its gate; the owner as the API server returned it. On a failure,
    /// the victims' intents (`marked`) are taken back.
    async fn reserve_owner(
        &self,
        term: &Term,
        owner: &Pod,
        plan: &ReclaimPlan,
        intent: &Intent,
        at: Timestamp,
        marked: &[(Pod, bool)],
    ) -> Result<Pod, Failed> {
        if !term.is_current() {
            let intents_left = !self.take_back(marked, &intent.id).await;
            return Err(Failed {
                error: BeginError::NotLeader,
                intents_left,
            });
        }
        let seal = self.seals.get();
        let admission = patch::Admission {
            node_pin: &plan.pin,
            queue: &plan.owner_queue,
            admitted_as: AdmittedAs::Guaranteed.as_str(),
            at,
            seal: seal.as_ref(),
        };
        let released = match intent::owner_patch(owner, intent, &admission) {
            Ok(patch) => self.patch_pod(owner, patch).await,
            Err(error) => Err(error),
        };
        match released {
            Ok(owner) => Ok(owner),
            Err(error) => {
                let intents_left = !self.take_back(marked, &intent.id).await;
                Err(Failed {
                    error: error.into(),
                    intents_left,
                })
            }
        }
    }

    /// Removes this reclaim's intent from the victims it was written on, with the
    /// `DisruptionTarget` mark on those marked with it (`true`), best effort: what stays behind
    /// goes stale and is cleaned up after the deadline (a mark, by kube-controller-manager after
    /// two minutes). Whether no intent is left (a pod gone took its intent with it; one that
    /// changed under the write may still carry it).
    async fn take_back(&self, marked: &[(Pod, bool)], id: &str) -> bool {
        let removed = join_all(marked.iter().map(|(pod, disrupted)| async move {
            match self.take_back_intent(pod, id, *disrupted).await {
                Ok(()) | Err(PatchError::Gone { .. }) => true,
                Err(error) => {
                    tracing::warn!(reclaim = id, %error, "taking back a reclaim intent failed; it is cleaned up once stale");
                    false
                }
            }
        }))
        .await;
        removed.into_iter().all(|removed| removed)
    }
}

/// The victims as the owner's intent lists them.
fn victim_refs(plan: &ReclaimPlan, stored: &[Arc<Pod>]) -> Vec<VictimRef> {
    plan.victims
        .iter()
        .zip(stored)
        .map(|(victim, pod)| VictimRef {
            pod: victim.key.to_string(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            queue: victim.queue.clone(),
        })
        .collect()
}

/// The handover of `plan` once its owner is reserved, for the task that carries it out: its
/// victims as `marked` with the intent, and whether each was marked `DisruptionTarget`.
fn reserved_handover(
    plan: &ReclaimPlan,
    id: String,
    owner: &Pod,
    (marked, disruption_marked): (&[Pod], &[bool]),
    timeline: Timeline,
    awaits: Vec<HandoverPod>,
) -> Handover {
    let victims = plan
        .victims
        .iter()
        .zip(marked.iter().zip(disruption_marked))
        .map(|(v, (pod, &disrupted))| Victim {
            disruption_marked: disrupted,
            ..Victim::of(pod, &v.queue, checkpoint_policy(&v.checkpoint), v.grace)
        })
        .collect();
    Handover {
        id,
        owner: HandoverPod::of(owner),
        owner_queue: plan.owner_queue.clone(),
        node: plan.node_name.clone(),
        victims,
        timeline,
        resumed: false,
        overrides_min_borrow: plan.overrides_min_borrow,
        eviction_reserve: plan.eviction_reserve,
        fit: plan.fit,
        release: OwnerRelease {
            awaits,
            preempts: plan.preempts,
        },
    }
}

#[cfg(test)]
mod tests {
    use kube::Client;
    use serde_json::json;

    use super::*;
    use crate::cluster::testing::TestStores;
    use crate::mock_api::{self, Log};

    /// An API server where pod `stuck` cannot be written (500) and pod `gone` is gone (404);
    /// every other pod write lands, and queues have no reclaim in flight.
    fn api() -> (Client, Log) {
        mock_api::serve(|request| {
            if request.path.contains("/pods/stuck") {
                mock_api::failure(500, "InternalError", "etcd restarting")
            } else if request.path.contains("/pods/gone") {
                mock_api::failure(404, "NotFound", "pods \"gone\" not found")
            } else if request.path.contains("/pods/") {
                (200, victim("landed"))
            } else {
                (
                    200,
                    json!({"apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
                    "metadata": {"name": "online", "resourceVersion": "7"},
                    "spec": {"namespaces": ["online"], "resources": []},
                    "status": {"reclaimsInFlight": []}}),
                )
            }
        })
    }

    fn victim(name: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "batch", "uid": format!("uid-{name}"),
                "resourceVersion": "3",
                "annotations": {"gpuqueue.io/reclaim-id": "rc-1", "gpuqueue.io/reclaim-role": "victim"}}})
    }

    fn marked(names: &[&str]) -> Vec<(Pod, bool)> {
        names
            .iter()
            .map(|name| (serde_json::from_value(victim(name)).unwrap(), false))
            .collect()
    }

    /// Review finding (of the fix below): a victim's write that failed with no answer may have
    /// landed, and its pod is not among those whose intents are taken back, so the reclaim
    /// stays recorded for recovery; a victim that is gone took nothing with it.
    #[tokio::test]
    async fn an_unanswered_victim_write_keeps_the_reclaim_recorded() {
        let (client, _seen) = api();
        let mut stores = TestStores::new();
        let pods = |names: &[&str]| -> Vec<Arc<Pod>> {
            names
                .iter()
                .map(|name| {
                    let mut pod = victim(name);
                    pod["metadata"]["annotations"] = json!({});
                    Arc::new(serde_json::from_value(pod).unwrap())
                })
                .collect()
        };
        for name in ["landed", "stuck", "gone"] {
            stores.add_pod(victim(name));
        }
        let reclaimer = Reclaimer::for_tests(client, stores.stores.clone());
        let (term, _state) = crate::leader::test_term().await;
        let intent = Intent {
            id: "rc-1".into(),
            deadline: "2026-01-01T00:00:03Z".parse().unwrap(),
            node: "n1".into(),
            victims: Vec::new(),
        };
        let failed = reclaimer
            .mark_victims(&term, &pods(&["landed", "stuck"]), &intent)
            .await
            .unwrap_err();
        assert!(failed.intents_left, "the stuck write may have landed");
        let failed = reclaimer
            .mark_victims(&term, &pods(&["landed", "gone"]), &intent)
            .await
            .unwrap_err();
        assert!(!failed.intents_left, "{failed:?}");
    }

    /// Review finding: a start that failed took its reclaim out of the owner queue's status
    /// even when an intent it wrote could not be taken back; that mark was then believed by
    /// nobody and cleaned by nobody. The entry now stays, for recovery to abandon the intent.
    #[tokio::test]
    async fn a_failed_start_keeps_its_record_while_an_intent_it_wrote_is_left() {
        let (client, seen) = api();
        let reclaimer = Reclaimer::for_tests(client, TestStores::new().stores.clone());
        let queue_requests = || {
            mock_api::requests(&seen)
                .iter()
                .filter(|(_, path)| path.contains("/gpuqueues/"))
                .count()
        };

        let intents_left = !reclaimer
            .take_back(&marked(&["landed", "stuck"]), "rc-1")
            .await;
        assert!(intents_left, "the stuck victim keeps its intent");
        let failed = Failed {
            error: BeginError::NotLeader,
            intents_left,
        };
        reclaimer.forget_in_flight("online", "rc-1", failed).await;
        assert_eq!(queue_requests(), 0, "the entry is kept");

        let intents_left = !reclaimer
            .take_back(&marked(&["landed", "gone"]), "rc-1")
            .await;
        assert!(!intents_left, "a victim gone took its intent with it");
        let failed = Failed {
            error: BeginError::NotLeader,
            intents_left,
        };
        reclaimer.forget_in_flight("online", "rc-1", failed).await;
        assert!(queue_requests() > 0, "the entry is taken out");
    }

    #[test]
    fn failure_categories_are_snake_case_labels_and_a_write_says_which() {
        let gone = BeginError::VictimGone(PodKey::new("b", "v"));
        let write = BeginError::Write(PatchError::Gone { pod: "b/v".into() });
        assert_eq!(gone.category(), "victim_gone");
        assert_eq!(BeginError::NotLeader.category(), "not_leader");
        assert_eq!(write.category(), "pod_gone");
    }
}
