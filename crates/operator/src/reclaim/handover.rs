//! One handover, carried out: start it from a plan (intent, then reserve), then checkpoint and
//! evict each victim, wait for the victims to be gone and the owner to be bound, and record
//! what happened. The same [`Handover`] is built from intent annotations when a new leader
//! resumes one (see [`super::resume`]).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use gpuqueue_api::{
    FIELD_MANAGER, annotations,
    v1alpha1::{CheckpointDriver, CheckpointPolicy, CheckpointResult, GpuQueue, HandoverRecord},
};
use gpuqueue_core::{
    model::{CheckpointSettings, PodKey, format_duration},
    reclaim::{ReclaimPlan, checkpoint_allowance},
};
use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{ObjectReference, Pod},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
    runtime::reflector::ObjectRef,
};
use tokio::time::Instant;

use super::{
    Reclaimer, crash,
    evict::{self, Eviction, Refusal},
    intent::{self, Intent, VictimRef},
    timeline::{Phase, Timeline, millis},
};
use crate::{
    checkpoint::{CheckpointReport, Checkpointer, Outcome, SkipReason},
    leader::Term,
    writes::{
        events::Notice,
        pod::{self as patch, PatchError},
    },
};

/// After the deadline, how long the executor still waits for victims to go and the owner to
/// be bound (beyond the victims' grace period) before it records the handover as incomplete.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// A pod the handover acts on.
#[derive(Clone, Debug)]
pub struct Target {
    pub key: PodKey,
    pub uid: String,
    pub reference: ObjectReference,
}

impl Target {
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
    pub target: Target,
    pub queue: String,
    pub checkpoint: CheckpointPolicy,
    pub grace: Duration,
    /// The pod IP from the API: the only address a checkpoint ever calls.
    pub ip: Option<IpAddr>,
    /// A process (this one or an earlier leader) already made the checkpoint call.
    pub checkpoint_started: bool,
    /// Already being deleted: nothing to checkpoint or evict.
    pub terminating: bool,
}

impl Victim {
    /// A victim listed in the owner's intent that the store no longer holds: an earlier leader
    /// evicted it, or it went by itself.
    pub fn departed(victim: &VictimRef, checkpoint: CheckpointPolicy, grace: Duration) -> Self {
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
            target: Target {
                key: PodKey::new(namespace, name),
                uid: victim.uid.clone(),
                reference,
            },
            queue: victim.queue.clone(),
            checkpoint,
            grace,
            ip: None,
            checkpoint_started: false,
            terminating: true,
        }
    }

    pub fn of(pod: &Pod, queue: &str, checkpoint: CheckpointPolicy, grace: Duration) -> Self {
        Self {
            target: Target::of(pod),
            queue: queue.to_owned(),
            checkpoint,
            grace,
            ip: pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok()),
            checkpoint_started: intent::Mark::read(pod).is_some_and(|m| m.checkpoint_started),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// One handover in progress.
#[derive(Clone, Debug)]
pub struct Handover {
    pub id: String,
    pub owner: Target,
    pub owner_queue: String,
    /// The node freed for the owner.
    pub node: String,
    pub victims: Vec<Victim>,
    pub timeline: Timeline,
    /// Found in intent annotations by a later process, not started by this one.
    pub resumed: bool,
    /// This process already counted the handover's end in the metrics and announced it; only
    /// writing its records (or clearing the intent) failed and is being retried.
    pub counted: bool,
    /// A victim was younger than its queue's `minBorrowDuration`, but no plan spared it.
    pub overrides_min_borrow: bool,
}

/// When the owner was found blocked and when the plan was ready: the start and the first
/// phase of every handover planned in one admission pass.
#[derive(Clone, Copy, Debug)]
pub struct Found {
    pub started: Instant,
    pub started_at: Timestamp,
    pub planned: Instant,
}

/// A handover whose owner is released: run it with [`Reclaimer::run`].
#[derive(Debug)]
pub struct Started {
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
}

/// How a handover ended, for the loop.
#[derive(Debug)]
pub struct Finished {
    pub id: String,
    /// Recorded and cleared; `false` when it stopped early (leadership lost, a write failed)
    /// and a later pass or leader has to resume it.
    pub done: bool,
    /// Its end is counted in the metrics and announced: a retry must not do it again.
    pub counted: bool,
}

/// A queue's checkpoint settings as the driver takes them.
pub fn policy(settings: &CheckpointSettings) -> CheckpointPolicy {
    CheckpointPolicy {
        driver: settings.driver,
        port: settings.port.map(i32::from),
        path: settings.path.clone(),
        pause_mode: Some(settings.pause_mode),
        timeout: settings.timeout.into(),
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
        found: Found,
    ) -> Result<Started, BeginError> {
        let mut timeline = Timeline::new(found.started, found.started_at, plan.budget);
        timeline.end(Phase::Plan, found.planned);
        let mut stored = Vec::with_capacity(plan.victims.len());
        for victim in &plan.victims {
            let pod = self
                .stores
                .pods
                .get(&ObjectRef::new(&victim.key.name).within(&victim.key.namespace))
                .ok_or_else(|| BeginError::VictimGone(victim.key.clone()))?;
            stored.push(pod);
        }
        let intent = Intent {
            id: intent::new_id(),
            deadline: timeline.deadline_at(),
            node: plan.node_name.clone(),
            victims: plan
                .victims
                .iter()
                .zip(&stored)
                .map(|(victim, pod)| VictimRef {
                    pod: victim.key.to_string(),
                    uid: pod.metadata.uid.clone().unwrap_or_default(),
                    queue: victim.queue.clone(),
                })
                .collect(),
        };

        // 1. Intent on every victim, at once.
        if !term.is_current() {
            return Err(BeginError::NotLeader);
        }
        let written = join_all(stored.iter().map(|pod| async {
            let patch = intent::victim_intent_patch(pod, &intent)?;
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
        timeline.end(Phase::Intent, Instant::now());
        crash::check(self.crash, Phase::Intent, &intent.id);

        // 2. Reserve: the owner's intent and its release, in one patch.
        if !term.is_current() {
            self.take_back(&marked, &intent.id).await;
            return Err(BeginError::NotLeader);
        }
        let release = patch::Admission {
            node_pin: &plan.pin,
            queue: &plan.owner_queue,
            admitted_as: "guaranteed",
            at: found.started_at,
        };
        let released = match intent::owner_patch(owner, &intent, &release) {
            Ok(patch) => self.patch_pod(owner, patch).await,
            Err(error) => Err(error),
        };
        let owner = match released {
            Ok(owner) => owner,
            Err(error) => {
                self.take_back(&marked, &intent.id).await;
                return Err(error.into());
            }
        };
        timeline.end(Phase::Reserve, Instant::now());
        crash::check(self.crash, Phase::Reserve, &intent.id);

        let victims = plan
            .victims
            .iter()
            .zip(&marked)
            .map(|(v, pod)| Victim::of(pod, &v.queue, policy(&v.checkpoint), v.grace))
            .collect();
        let handover = Handover {
            id: intent.id,
            owner: Target::of(&owner),
            owner_queue: plan.owner_queue.clone(),
            node: plan.node_name.clone(),
            victims,
            timeline,
            resumed: false,
            counted: false,
            overrides_min_borrow: plan.overrides_min_borrow,
        };
        self.metrics.started(Instant::now());
        self.announce_start(&handover);
        Ok(Started { owner, handover })
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

    /// Checkpoints and evicts every victim, waits for them to be gone and the owner bound, and
    /// records the handover. Stops (leaving the intent for the next leader) when the term ends.
    pub async fn run(self, term: Term, mut handover: Handover) -> Finished {
        let id = handover.id.clone();
        let deadline = handover.timeline.deadline();
        tracing::info!(reclaim = %id, owner = %handover.owner.key, node = %handover.node,
            victims = handover.victims.len(), resumed = handover.resumed, "handover running");

        // 3-4. Each victim: checkpoint, then evict; all victims at once.
        let outcomes = join_all(
            handover
                .victims
                .iter()
                .map(|victim| self.remove_victim(&term, &handover, victim)),
        )
        .await;
        if outcomes
            .iter()
            .any(|o| matches!(o.eviction, Eviction::NotLeader))
        {
            tracing::warn!(reclaim = %id, "leadership lost during the handover; the next leader resumes it");
            return Finished {
                id,
                done: false,
                counted: handover.counted,
            };
        }
        if let Some(at) = outcomes.iter().filter_map(|o| o.checkpointed_at).max() {
            handover.timeline.end(Phase::Checkpoint, at);
        }
        if let Some(at) = outcomes.iter().filter_map(|o| o.evicted_at).max() {
            handover.timeline.end(Phase::EvictAccepted, at);
        }
        crash::check(self.crash, Phase::EvictAccepted, &id);

        // 5-6. Wait until the watch shows the victims gone and the owner bound.
        let grace = handover
            .victims
            .iter()
            .map(|v| v.grace)
            .max()
            .unwrap_or_default();
        let settled = self
            .settle(&term, &mut handover, deadline + grace + SETTLE_LIMIT)
            .await;
        let Some(settled) = settled else {
            return Finished {
                id,
                done: false,
                counted: handover.counted,
            };
        };

        let outcome = outcome(&settled, &outcomes);
        self.finish(&term, &handover, &outcomes, &outcome).await
    }

    /// Checkpoint (unless already started or pointless), then evict one victim.
    async fn remove_victim(&self, term: &Term, handover: &Handover, victim: &Victim) -> Removal {
        let checkpoint = self.checkpoint(term, handover, victim).await;
        let checkpointed_at = checkpoint.as_ref().map(|(_, at)| *at);
        if checkpointed_at.is_some() {
            crash::check(self.crash, Phase::Checkpoint, &handover.id);
        }
        let result = checkpoint.map_or_else(
            || skipped_checkpoint(handover, victim),
            |(result, _)| result,
        );
        let eviction = if victim.terminating {
            Eviction::AlreadyGone
        } else {
            let target = evict::Target {
                namespace: &victim.target.key.namespace,
                name: &victim.target.key.name,
                uid: &victim.target.uid,
                grace: victim.grace,
            };
            evict::evict(
                &self.client,
                term,
                &target,
                handover.timeline.deadline(),
                |refusal| self.announce_refusal(handover, victim, refusal),
            )
            .await
        };
        // Only an eviction this process made ends the phase (not one it found done).
        let evicted_at = (!victim.terminating && eviction.removed()).then(Instant::now);
        if !matches!(eviction, Eviction::NotLeader) {
            self.metrics.evicted(eviction.outcome());
            self.announce_eviction(handover, victim, &eviction);
        }
        Removal {
            victim: victim.target.key.clone(),
            checkpoint: result,
            checkpointed_at,
            eviction,
            evicted_at,
        }
    }

    /// The victim's checkpoint, if this process makes one: the progress mark is written first,
    /// so that no process ever makes the call twice. `None` when no call is made.
    async fn checkpoint(
        &self,
        term: &Term,
        handover: &Handover,
        victim: &Victim,
    ) -> Option<(CheckpointResult, Instant)> {
        if victim.checkpoint_started || victim.terminating {
            return None;
        }
        let checkpointer = Checkpointer::from_policy(&victim.checkpoint, &self.checkpoints);
        let started = Instant::now();
        let timeout = positive(victim.checkpoint.timeout);
        let allowance = checkpoint_allowance(
            handover.timeline.budget,
            timeout,
            handover.timeline.elapsed(started),
        );
        // Nothing to call, or no time to call it: no mark needed, the driver reports why.
        let calls = checkpointer.driver() != CheckpointDriver::None
            && !allowance.is_zero()
            && victim.ip.is_some();
        if calls {
            if !term.is_current() {
                return None;
            }
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &victim.target.key.namespace);
            let marked = match intent::progress_patch(&stub(victim), &handover.id) {
                Ok(patch) => pods
                    .patch(
                        &victim.target.key.name,
                        &Self::params(),
                        &Patch::Json::<()>(patch),
                    )
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string()),
                Err(error) => Err(error.to_string()),
            };
            if let Err(error) = marked {
                tracing::warn!(reclaim = %handover.id, victim = %victim.target.key, %error,
                    "could not record the checkpoint before making it; evicting without one");
                let result = CheckpointResult {
                    pod: victim.target.key.to_string(),
                    driver: driver_name(victim.checkpoint.driver).to_owned(),
                    result: "Skipped".into(),
                    millis: 0,
                    message: format!(
                        "not called: recording the call beforehand failed ({error}), and an unrecorded call could be repeated by the next leader"
                    ),
                };
                return Some((result, Instant::now()));
            }
        }
        let report = checkpointer
            .checkpoint(victim.ip, Instant::now() + allowance)
            .await;
        let done = Instant::now();
        self.metrics
            .checkpointed(report.driver_label(), report.result());
        self.announce_checkpoint(handover, victim, &report);
        Some((checkpoint_result(victim, &report), done))
    }

    /// Waits until the store shows every victim gone and the owner bound, until `limit`.
    /// `None` when the term ended first.
    async fn settle(
        &self,
        term: &Term,
        handover: &mut Handover,
        limit: Instant,
    ) -> Option<Settled> {
        let mut changes = self.stores.changes();
        let mut term_watch = term.clone();
        let mut crashed_checked = false;
        loop {
            changes.borrow_and_update();
            let now = Instant::now();
            let gone = handover
                .victims
                .iter()
                .all(|v| !self.stored_uid_is(&v.target));
            if gone {
                handover.timeline.end(Phase::VictimsGone, now);
                if !crashed_checked {
                    crashed_checked = true;
                    crash::check(self.crash, Phase::VictimsGone, &handover.id);
                }
            }
            let owner = self.stored(&handover.owner);
            let owner_gone = owner.is_none();
            let bound = owner
                .as_ref()
                .and_then(|p| p.spec.as_ref())
                .and_then(|s| s.node_name.clone());
            if let Some(node) = &bound {
                handover.timeline.end(Phase::OwnerBound, now);
                if node != &handover.node {
                    tracing::warn!(reclaim = %handover.id, %node, freed = %handover.node,
                        "the owner was bound to another node than the one freed for it");
                }
            }
            if (gone && bound.is_some()) || owner_gone || now >= limit {
                return Some(Settled {
                    gone,
                    bound,
                    owner_gone,
                });
            }
            tokio::select! {
                signal = changes.changed() => if signal.is_err() { return None },
                () = tokio::time::sleep_until(limit) => {}
                () = term_watch.lost() => return None,
            }
        }
    }

    /// Records the handover on both queues, announces it, and clears the owner's intent last
    /// (a crash before that makes the next leader record it again, under the same id).
    async fn finish(
        &self,
        term: &Term,
        handover: &Handover,
        removals: &[Removal],
        outcome: &str,
    ) -> Finished {
        let id = handover.id.clone();
        let timeline = &handover.timeline;
        let total = timeline
            .at(Phase::OwnerBound)
            .unwrap_or_else(|| timeline.elapsed(Instant::now()));
        let record = |role: &str| HandoverRecord {
            id: id.clone(),
            role: role.to_owned(),
            owner_pod: handover.owner.key.to_string(),
            node: handover.node.clone(),
            victims: handover
                .victims
                .iter()
                .map(|v| v.target.key.to_string())
                .collect(),
            started_at: Some(Time(timeline.started_at)),
            outcome: outcome.to_owned(),
            budget_millis: millis(timeline.budget),
            total_millis: millis(total),
            phases: timeline.phase_timings(),
            checkpoints: removals.iter().map(|r| r.checkpoint.clone()).collect(),
        };
        let victim_queues: BTreeSet<&str> =
            handover.victims.iter().map(|v| v.queue.as_str()).collect();
        if !term.is_current() {
            return Finished {
                id,
                done: false,
                counted: handover.counted,
            };
        }
        let queues: Api<GpuQueue> = Api::all(self.client.clone());
        let mut writes = vec![(handover.owner_queue.as_str(), record("owner"))];
        writes.extend(victim_queues.iter().map(|q| (*q, record("victim"))));
        let results = join_all(
            writes
                .iter()
                .map(|(queue, record)| super::record::write(&queues, queue, record)),
        )
        .await;
        let mut recorded = true;
        for error in results.into_iter().filter_map(Result::err) {
            recorded = false;
            tracing::warn!(%error, "writing a handover record failed");
        }

        if !handover.counted {
            for phase in Phase::ALL {
                if let Some(at) = timeline.at(phase) {
                    self.metrics.phase(phase, at);
                }
            }
            let completed = outcome == COMPLETED;
            self.metrics
                .finished(if completed { "completed" } else { "incomplete" });
            self.announce_finish(handover, outcome, &victim_queues);
            tracing::info!(reclaim = %id, outcome, resumed = handover.resumed, timeline = %timeline.summary(), "handover finished");
        }

        // The owner's intent goes last: it is what makes the next leader finish this handover.
        if !recorded || !term.is_current() {
            return Finished {
                id,
                done: false,
                counted: true,
            };
        }
        if let Some(owner) = self.stored(&handover.owner) {
            let cleared = match intent::clear_patch(&owner, &id) {
                Ok(patch) => self.patch_pod(&owner, patch).await.map(drop),
                Err(error) => Err(error),
            };
            if let Err(error) = cleared
                && !error.is_stale()
            {
                tracing::warn!(reclaim = %id, %error, "clearing the owner's intent failed; retried");
                return Finished {
                    id,
                    done: false,
                    counted: true,
                };
            }
        }
        Finished {
            id,
            done: true,
            counted: true,
        }
    }

    /// `Some(pod)` if the store holds the target (same uid).
    fn stored(&self, target: &Target) -> Option<Arc<Pod>> {
        self.stores
            .pods
            .get(&ObjectRef::new(&target.key.name).within(&target.key.namespace))
            .filter(|pod| pod.metadata.uid.as_deref() == Some(target.uid.as_str()))
    }

    fn stored_uid_is(&self, target: &Target) -> bool {
        self.stored(target).is_some()
    }

    fn params() -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        }
    }

    /// Applies a JSON patch to `pod`; the pod as the API server returned it.
    pub(super) async fn patch_pod(
        &self,
        pod: &Pod,
        patch: json_patch::Patch,
    ) -> Result<Pod, PatchError> {
        let api: Api<Pod> = Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        api.patch(
            pod.metadata.name.as_deref().unwrap_or_default(),
            &Self::params(),
            &Patch::Json::<()>(patch),
        )
        .await
        .map_err(|source| classify(pod, source))
    }

    // ---- events ------------------------------------------------------------------------

    fn announce_start(&self, handover: &Handover) {
        let victims: Vec<String> = handover
            .victims
            .iter()
            .map(|v| format!("{} (queue {})", v.target.key, v.queue))
            .collect();
        let mut note = format!(
            "reclaim {}: freeing node {} for this pod by evicting {}, within {}",
            handover.id,
            handover.node,
            victims.join(", "),
            format_duration(handover.timeline.budget)
        );
        if handover.overrides_min_borrow {
            note.push_str(
                "; a victim is younger than its queue's minBorrowDuration, but no plan spares it",
            );
        }
        self.events.send(
            handover.owner.reference.clone(),
            Notice {
                warning: false,
                reason: "Reclaiming",
                action: "Reclaim",
                note,
            },
        );
    }

    fn announce_checkpoint(&self, handover: &Handover, victim: &Victim, report: &CheckpointReport) {
        // A queue without a checkpoint driver asked for none: the metric and the record say so.
        if matches!(report.outcome, Outcome::Skipped(SkipReason::DriverNone)) {
            return;
        }
        let ok = matches!(report.outcome, Outcome::Succeeded(_));
        self.events.send(
            victim.target.reference.clone(),
            Notice {
                warning: !ok,
                reason: if ok {
                    "Checkpointed"
                } else {
                    "CheckpointFailed"
                },
                action: "Checkpoint",
                note: format!(
                    "reclaim {} for {}: checkpoint ({}) {} after {}ms; eviction goes ahead",
                    handover.id,
                    handover.owner.key,
                    report.driver_label(),
                    report.outcome,
                    report.elapsed.as_millis()
                ),
            },
        );
    }

    fn announce_refusal(&self, handover: &Handover, victim: &Victim, refusal: &Refusal) {
        let (reason, what) = if refusal.is_budget() {
            (
                "EvictionBlocked",
                "a PodDisruptionBudget refuses the eviction (429)",
            )
        } else if refusal.is_misconfigured() {
            (
                "EvictionMisconfigured",
                "the Eviction API cannot decide (500): more than one PodDisruptionBudget selects this pod",
            )
        } else {
            ("EvictionRefused", "the Eviction API refused")
        };
        tracing::warn!(reclaim = %handover.id, victim = %victim.target.key, status = ?refusal.status, message = %refusal.message, "{what}");
        self.events.send(
            victim.target.reference.clone(),
            Notice {
                warning: true,
                reason,
                action: "Evict",
                note: format!(
                    "reclaim {}: {what}: {}; retried until the handover deadline, then the pod is deleted (borrowed GPUs are reclaimable)",
                    handover.id, refusal.message
                ),
            },
        );
    }

    fn announce_eviction(&self, handover: &Handover, victim: &Victim, eviction: &Eviction) {
        let (warning, reason, note) = match eviction {
            Eviction::Evicted { .. } => (
                false,
                "Evicted",
                format!(
                    "reclaim {}: evicted to hand node {} back to {} (queue {}), grace period {}s",
                    handover.id,
                    handover.node,
                    handover.owner.key,
                    handover.owner_queue,
                    victim.grace.as_secs()
                ),
            ),
            Eviction::DeletedAfterRefusal { refusal, refusals } => (
                true,
                "DeletedAfterEvictionRefused",
                format!(
                    "reclaim {}: the Eviction API refused {refusals} time(s) until the handover deadline ({}); deleted instead, grace period {}s, because {} (queue {}) is within its guarantee",
                    handover.id,
                    refusal.message,
                    victim.grace.as_secs(),
                    handover.owner.key,
                    handover.owner_queue
                ),
            ),
            Eviction::Failed { error } => (
                true,
                "EvictionFailed",
                format!("reclaim {}: could not remove the pod: {error}", handover.id),
            ),
            Eviction::AlreadyGone | Eviction::NotLeader => return,
        };
        self.events.send(
            victim.target.reference.clone(),
            Notice {
                warning,
                reason,
                action: "Evict",
                note,
            },
        );
    }

    fn announce_finish(&self, handover: &Handover, outcome: &str, victim_queues: &BTreeSet<&str>) {
        let completed = outcome == COMPLETED;
        let timeline = format!(
            "{} (budget {}ms)",
            handover.timeline.summary(),
            millis(handover.timeline.budget)
        );
        let resumed = if handover.resumed {
            " after a new leader resumed it"
        } else {
            ""
        };
        let victims: Vec<String> = handover
            .victims
            .iter()
            .map(|v| v.target.key.to_string())
            .collect();
        self.events.send(
            handover.owner.reference.clone(),
            Notice {
                warning: !completed,
                reason: if completed {
                    "HandoverCompleted"
                } else {
                    "HandoverIncomplete"
                },
                action: "Reclaim",
                note: format!(
                    "reclaim {} {outcome}{resumed} on node {}: {timeline}",
                    handover.id, handover.node
                ),
            },
        );
        if let Some(queue) = self.queue_ref(&handover.owner_queue) {
            self.events.send(
                queue,
                Notice {
                    warning: !completed,
                    reason: "Reclaimed",
                    action: "Reclaim",
                    note: format!(
                        "reclaim {} for {} from queue(s) {} on node {}: {outcome}; {timeline}",
                        handover.id,
                        handover.owner.key,
                        victim_queues.iter().copied().collect::<Vec<_>>().join(", "),
                        handover.node
                    ),
                },
            );
        }
        for name in victim_queues {
            if let Some(queue) = self.queue_ref(name) {
                self.events.send(
                    queue,
                    Notice {
                        warning: false,
                        reason: "ReclaimedFrom",
                        action: "Reclaim",
                        note: format!(
                            "reclaim {}: borrowed GPUs on node {} handed back to {} (queue {}) by evicting {}: {outcome}",
                            handover.id,
                            handover.node,
                            handover.owner.key,
                            handover.owner_queue,
                            victims.join(", ")
                        ),
                    },
                );
            }
        }
    }

    pub(super) fn queue_ref(&self, name: &str) -> Option<ObjectReference> {
        let stored = self.stores.queues.get(&ObjectRef::new(name))?;
        stored.0.as_ref().ok().map(|queue| queue.object_ref(&()))
    }
}

/// The outcome recorded when the owner is bound and every victim gone.
pub const COMPLETED: &str = "Completed";

/// What the wait for the victims and the owner saw.
#[derive(Debug)]
struct Settled {
    gone: bool,
    bound: Option<String>,
    owner_gone: bool,
}

/// One victim's checkpoint and eviction.
#[derive(Debug)]
struct Removal {
    victim: PodKey,
    checkpoint: CheckpointResult,
    checkpointed_at: Option<Instant>,
    eviction: Eviction,
    evicted_at: Option<Instant>,
}

/// `Completed`, or the reason it was not.
fn outcome(settled: &Settled, removals: &[Removal]) -> String {
    if settled.owner_gone {
        return "OwnerGone: the owner pod was deleted before it was bound".into();
    }
    if let Some(failed) = removals.iter().find(|r| !r.eviction.removed()) {
        let why = match &failed.eviction {
            Eviction::Failed { error } => error.clone(),
            other => other.outcome().to_owned(),
        };
        return format!("EvictionFailed: {}: {why}", failed.victim);
    }
    match (&settled.bound, settled.gone) {
        (Some(_), true) => COMPLETED.into(),
        (_, false) => "VictimsNotGone: a victim was still terminating at the limit".into(),
        (None, true) => {
            "OwnerNotBound: the victims are gone but kube-scheduler has not bound the owner".into()
        }
    }
}

/// The record of a victim whose checkpoint this process did not make.
fn skipped_checkpoint(handover: &Handover, victim: &Victim) -> CheckpointResult {
    let message = if victim.checkpoint_started {
        "made by an earlier leader before it stopped; never repeated".to_owned()
    } else if victim.terminating {
        "the pod was already terminating or gone".to_owned()
    } else {
        format!(
            "the term of this replica ended before reclaim {}'s checkpoint",
            handover.id
        )
    };
    CheckpointResult {
        pod: victim.target.key.to_string(),
        driver: driver_name(victim.checkpoint.driver).to_owned(),
        result: "Skipped".into(),
        millis: 0,
        message,
    }
}

fn checkpoint_result(victim: &Victim, report: &CheckpointReport) -> CheckpointResult {
    let result = match report.outcome {
        Outcome::Succeeded(_) => "Succeeded",
        Outcome::Failed { .. } => "Failed",
        Outcome::TimedOut { .. } => "TimedOut",
        Outcome::Unsupported { .. } => "Unsupported",
        Outcome::Skipped(_) => "Skipped",
    };
    CheckpointResult {
        pod: victim.target.key.to_string(),
        driver: report.driver_label().to_owned(),
        result: result.to_owned(),
        millis: millis(report.elapsed),
        message: match report.outcome {
            Outcome::Succeeded(_) => String::new(),
            _ => report.outcome.to_string(),
        },
    }
}

fn driver_name(driver: CheckpointDriver) -> &'static str {
    match driver {
        CheckpointDriver::Vllm => "vllm",
        CheckpointDriver::Http => "http",
        CheckpointDriver::None => "none",
    }
}

/// A spec duration as a span of time; a negative one (which the CRD refuses) as zero.
pub fn positive(duration: kube::core::Duration) -> Duration {
    if duration.is_negative() {
        Duration::ZERO
    } else {
        duration.into()
    }
}

/// Enough of a victim for the progress patch's tests (uid and reclaim id).
fn stub(victim: &Victim) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some(victim.target.key.name.clone());
    pod.metadata.namespace = Some(victim.target.key.namespace.clone());
    pod.metadata.uid = Some(victim.target.uid.clone());
    pod
}

fn classify(pod: &Pod, source: kube::Error) -> PatchError {
    let name = patch::describe(pod);
    match &source {
        kube::Error::Api(status) if status.code == 422 || status.code == 409 => {
            PatchError::Changed { pod: name }
        }
        kube::Error::Api(status) if status.code == 404 => PatchError::Gone { pod: name },
        _ => PatchError::Api { pod: name, source },
    }
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

    fn removal(eviction: Eviction) -> Removal {
        Removal {
            victim: PodKey::new("b", "v"),
            checkpoint: CheckpointResult::default(),
            checkpointed_at: None,
            eviction,
            evicted_at: None,
        }
    }

    #[tokio::test]
    async fn the_outcome_names_what_did_not_happen() {
        let evicted = [removal(Eviction::Evicted { refusals: 0 })];
        let settled = |gone, bound: Option<&str>, owner_gone| Settled {
            gone,
            bound: bound.map(str::to_owned),
            owner_gone,
        };
        assert_eq!(
            outcome(&settled(true, Some("n"), false), &evicted),
            "Completed"
        );
        assert!(outcome(&settled(false, Some("n"), false), &evicted).starts_with("VictimsNotGone"));
        assert!(outcome(&settled(true, None, false), &evicted).starts_with("OwnerNotBound"));
        assert!(outcome(&settled(true, None, true), &evicted).starts_with("OwnerGone"));
        let failed = [removal(Eviction::Failed {
            error: "forbidden".into(),
        })];
        assert_eq!(
            outcome(&settled(false, None, false), &failed),
            "EvictionFailed: b/v: forbidden"
        );
    }

    #[test]
    fn a_queue_policy_converts_without_loss() {
        let settings = CheckpointSettings {
            driver: CheckpointDriver::Vllm,
            port: Some(8000),
            path: None,
            pause_mode: gpuqueue_api::v1alpha1::PauseMode::Keep,
            timeout: Duration::from_millis(1500),
        };
        let policy = policy(&settings);
        assert_eq!(policy.port, Some(8000));
        assert_eq!(
            policy.pause_mode,
            Some(gpuqueue_api::v1alpha1::PauseMode::Keep)
        );
        assert_eq!(positive(policy.timeout), Duration::from_millis(1500));
    }
}
