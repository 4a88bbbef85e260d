//! Starting a handover from the core's plan, inside the admission pass that made it: the
//! intent on every victim, then the owner's intent together with its release, in the order
//! [`super::resume`] relies on. What a failed start wrote is taken back.

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
use tracing::Instrument;

use super::{
    handover::{self, Handover, HandoverPod, PassTiming, Victim, checkpoint_policy},
    intent::{self, Intent, VictimRef},
    reclaimer::Reclaimer,
    timeline::{Phase, Timeline},
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
    #[error(transparent)]
    Write(#[from] PatchError),
}

impl BeginError {
    /// Whether a pod moved on under the plan (the next pass decides again from fresh state).
    pub fn is_stale(&self) -> bool {
        match self {
            Self::VictimGone(_) | Self::NotLeader => true,
            Self::Write(error) => error.is_stale(),
        }
    }

    /// The kind of failure, in snake case: the label a failure counter carries.
    pub fn category(&self) -> &'static str {
        match self {
            Self::VictimGone(_) => "victim_gone",
            Self::NotLeader => "not_leader",
            Self::Write(error) => error.category(),
        }
    }
}

impl Reclaimer {
    /// Records the intent on every victim, then on the owner together with its release: the
    /// start of the handover `plan` describes, for `owner` as the store shows it.
    pub async fn begin(
        &self,
        term: &Term,
        plan: &ReclaimPlan,
        owner: &Pod,
        found: PassTiming,
    ) -> Result<Reservation, BeginError> {
        let id = intent::new_id();
        let span = handover::span(
            &id,
            &plan.owner_queue,
            &plan.owner_key,
            &plan.node_name,
            plan.victims.len(),
        );
        self.begin_traced(term, plan, owner, found, id)
            .instrument(span)
            .await
    }

    async fn begin_traced(
        &self,
        term: &Term,
        plan: &ReclaimPlan,
        owner: &Pod,
        found: PassTiming,
        id: String,
    ) -> Result<Reservation, BeginError> {
        let mut timeline = Timeline::new(found.started, found.started_at, plan.budget);
        timeline.end(Phase::Plan, found.planned);
        let stored = self.stored_victims(plan)?;
        let intent = Intent {
            id,
            deadline: timeline.deadline_at(),
            node: plan.node_name.clone(),
            victims: victim_refs(plan, &stored),
        };

        // 1. Intent on every victim, at once.
        let marked = self.mark_victims(term, &stored, &intent).await?;
        timeline.end(Phase::Intent, Instant::now());
        self.crash_after(Phase::Intent, &intent.id);

        // 2. Reserve: the owner's intent and its release, in one patch.
        let owner = self
            .reserve_owner(term, owner, plan, &intent, found.started_at, &marked)
            .await?;
        timeline.end(Phase::Reserve, Instant::now());
        self.crash_after(Phase::Reserve, &intent.id);

        let handover = reserved_handover(plan, intent.id, &owner, &marked, timeline);
        self.metrics.started(Instant::now());
        self.announce_start(&handover);
        Ok(Reservation { owner, handover })
    }

    /// The plan's victims as the store shows them, or the first one it no longer holds.
    fn stored_victims(&self, plan: &ReclaimPlan) -> Result<Vec<Arc<Pod>>, BeginError> {
        plan.victims
            .iter()
            .map(|victim| {
                self.stores
                    .pods
                    .get(&ObjectRef::new(&victim.key.name).within(&victim.key.namespace))
                    .ok_or_else(|| BeginError::VictimGone(victim.key.clone()))
            })
            .collect()
    }

    /// Writes the intent on every victim at once; the victims as the API server returned
    /// them. On a failure, the intents already written are taken back.
    async fn mark_victims(
        &self,
        term: &Term,
        stored: &[Arc<Pod>],
        intent: &Intent,
    ) -> Result<Vec<Pod>, BeginError> {
        if !term.is_current() {
            return Err(BeginError::NotLeader);
        }
        let written = join_all(stored.iter().map(|pod| async {
            let patch = intent::victim_intent_patch(pod, intent)?;
            self.patch_pod(pod, patch).await
        }))
        .await;
        let mut marked = Vec::with_capacity(written.len());
        let mut failure = None;
        for result in written {
            match result {
                Ok(pod) => marked.push(pod),
                Err(error) => failure = failure.or(Some(error)),
            }
        }
        if let Some(error) = failure {
            self.take_back(&marked, &intent.id).await;
            return Err(error.into());
        }
        Ok(marked)
    }

    /// Writes the owner's intent and its release (pin and gate) in one patch, as admitted
    /// within its guarantee at `at`; the owner as the API server returned it. On a failure,
    /// the victims' intents (`marked`) are taken back.
    async fn reserve_owner(
        &self,
        term: &Term,
        owner: &Pod,
        plan: &ReclaimPlan,
        intent: &Intent,
        at: Timestamp,
        marked: &[Pod],
    ) -> Result<Pod, BeginError> {
        if !term.is_current() {
            self.take_back(marked, &intent.id).await;
            return Err(BeginError::NotLeader);
        }
        let release = patch::Admission {
            node_pin: &plan.pin,
            queue: &plan.owner_queue,
            admitted_as: AdmittedAs::Guaranteed.as_str(),
            at,
        };
        let released = match intent::owner_patch(owner, intent, &release) {
            Ok(patch) => self.patch_pod(owner, patch).await,
            Err(error) => Err(error),
        };
        match released {
            Ok(owner) => Ok(owner),
            Err(error) => {
                self.take_back(marked, &intent.id).await;
                Err(error.into())
            }
        }
    }

    /// Removes this reclaim's intent from pods it was written on, best effort: what stays
    /// behind goes stale and is cleaned up after the deadline.
    async fn take_back(&self, pods: &[Pod], id: &str) {
        join_all(pods.iter().map(|pod| async move {
            let result = match intent::clear_patch(pod, id) {
                Ok(patch) => self.patch_pod(pod, patch).await.map(drop),
                Err(error) => Err(error),
            };
            if let Err(error) = result {
                tracing::warn!(reclaim = id, %error, "taking back a reclaim intent failed; it is cleaned up once stale");
            }
        }))
        .await;
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

/// The handover of `plan` once its owner is reserved, for the task that carries it out.
fn reserved_handover(
    plan: &ReclaimPlan,
    id: String,
    owner: &Pod,
    marked: &[Pod],
    timeline: Timeline,
) -> Handover {
    let victims = plan
        .victims
        .iter()
        .zip(marked)
        .map(|(v, pod)| Victim::of(pod, &v.queue, checkpoint_policy(&v.checkpoint), v.grace))
        .collect();
    Handover {
        id,
        owner: HandoverPod::of(owner),
        owner_queue: plan.owner_queue.clone(),
        node: plan.node_name.clone(),
        victims,
        timeline,
        resumed: false,
        counted: false,
        overrides_min_borrow: plan.overrides_min_borrow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_categories_are_snake_case_labels_and_a_write_says_which() {
        let gone = BeginError::VictimGone(PodKey::new("b", "v"));
        let write = BeginError::Write(PatchError::Gone { pod: "b/v".into() });
        assert_eq!(gone.category(), "victim_gone");
        assert_eq!(BeginError::NotLeader.category(), "not_leader");
        assert_eq!(write.category(), "pod_gone");
    }
}
