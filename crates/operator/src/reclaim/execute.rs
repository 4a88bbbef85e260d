//! Carrying out a started handover, in a task of its own: say up front if the plan does not fit
//! the budget, checkpoint and evict each victim, wait for the victims to be gone and the owner
//! to be bound (timing each victim's termination for the budget rule), record what happened on
//! the queues, and clear the owner's intent last.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::future::join_all;
use gpuqueue_api::v1alpha1::{CheckpointDriver, CheckpointResult, GpuQueue, HandoverRecord};
use gpuqueue_core::{model::PodKey, reclaim::checkpoint_allowance};
use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::Time};
use kube::Api;
use tokio::time::Instant;

use super::{
    disruption,
    evict::{self, Eviction},
    handover::{COMPLETED, Handover, HandoverPod, Progress, Victim, resumed_owner_bound},
    intent::{self, Role},
    progress::{self, CallRecord},
    reclaimer::Reclaimer,
    release::PendingRelease,
    requeue::Cause,
    resume::PodAbandon,
    timeline::{Phase, millis},
};
use crate::{
    checkpoint::{CheckpointOutcome, CheckpointReport, Checkpointer, driver_name},
    leader::Term,
};

/// After the deadline, how long the executor still waits for victims to go and the owner to
/// be bound (beyond the victims' grace period) before it records the handover as incomplete.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// How a handover ended, for the loop.
#[derive(Debug)]
pub struct HandoverEnd {
    pub id: String,
    /// Recorded and cleared; `false` when it stopped early (leadership lost, a write failed)
    /// and a later pass or leader has to resume it.
    pub done: bool,
    /// It ran to the end (counted in the metrics, announced), but writing its records or
    /// clearing its owner's intent failed: what a retry writes, as it is.
    pub unwritten: Option<Unwritten>,
}

impl HandoverEnd {
    /// Stopped early, to be resumed.
    fn stopped(id: String) -> Self {
        Self {
            id,
            done: false,
            unwritten: None,
        }
    }
}

/// What a handover that ran to the end still has to write: its records, then its owner's
/// intent cleared. A retry writes them again as they are, never worked out anew: a handover
/// rebuilt once its victims are gone would record none of its phases, over the good records
/// that did land (one queue's write failing, another's not).
#[derive(Debug, Clone)]
pub struct Unwritten {
    owner: HandoverPod,
    writes: Vec<(String, HandoverRecord)>,
}

impl Reclaimer {
    /// Checkpoints and evicts every victim, waits for them to be gone and the owner bound, and
    /// records the handover. Stops (leaving the intent for the next leader) when the term ends.
    pub async fn run(self, term: Term, mut handover: Handover) -> HandoverEnd {
        // Events wait while it runs: their writes would queue ahead of its own.
        let _events_wait = self.events.hold();
        let id = handover.id.clone();
        let deadline = handover.timeline.deadline();
        tracing::info!(reclaim = %id, owner = %handover.owner.key, node = %handover.node,
            victims = handover.victims.len(), resumed = handover.resumed, fit = ?handover.fit,
            "handover running");
        // Held until the task ends: the owner queue's condition says it while it runs.
        let _beyond_budget = self.say_budget_up_front(&handover).await;

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
            return HandoverEnd::stopped(id);
        }
        if let Some(at) = outcomes.iter().filter_map(|o| o.checkpointed_at).max() {
            handover.timeline.end(Phase::Checkpoint, at);
        }
        if let Some(at) = outcomes.iter().filter_map(|o| o.evicted_at).max() {
            handover.timeline.end(Phase::EvictAccepted, at);
        }
        if handover.victims.is_empty() {
            // An owner of a burst whose room other handovers on its node free: nothing of
            // its own to checkpoint or evict.
            let now = Instant::now();
            handover.timeline.end(Phase::Checkpoint, now);
            handover.timeline.end(Phase::EvictAccepted, now);
        }
        self.crash_after(Phase::EvictAccepted, &id);
        if let Some(end) = self.give_up_room(&term, &handover, &outcomes).await {
            return end;
        }

        // 5-6. Wait until the watch shows the victims gone and the owner bound.
        let grace = handover
            .victims
            .iter()
            .map(|v| v.grace)
            .max()
            .unwrap_or_default();
        let settled = self.settle(&term, &mut handover, deadline + grace).await;
        let Some(settled) = settled else {
            return HandoverEnd::stopped(id);
        };
        self.terminations.record(
            &id,
            &handover.node,
            &terminations(&handover.victims, &outcomes, &settled),
        );

        // The owner goes before its intent is cleared: the intent is what says it was an owner.
        if settled.owner_not_bound() {
            self.requeue_unbound_owner(&term, &handover, Cause::NotBound)
                .await;
        }
        let outcome = outcome(&settled, &outcomes);
        self.finish(&term, &handover, &outcomes, &outcome).await
    }

    /// Checkpoint (unless already started or pointless), then evict one victim, unless its
    /// queue no longer borrows it by then: then it is spared ([`super::recheck`]). Asked again
    /// only where time passed since the plan: a checkpoint was called, or the handover resumed.
    async fn remove_victim(
        &self,
        term: &Term,
        handover: &Handover,
        victim: &Victim,
    ) -> VictimRemoval {
        if victim.progress == Progress::Spared {
            return VictimRemoval {
                victim: victim.target.key.clone(),
                checkpoint: skipped_checkpoint(handover, victim),
                checkpointed_at: None,
                eviction: Eviction::Spared,
                evicted_at: None,
            };
        }
        let checkpoint = self.checkpoint(term, handover, victim).await;
        let checkpointed_at = checkpoint.as_ref().map(|c| c.at);
        if checkpointed_at.is_some() {
            self.crash_after(Phase::Checkpoint, &handover.id);
        }
        let called = checkpoint.as_ref().is_some_and(|c| c.called);
        let result = checkpoint.map_or_else(|| skipped_checkpoint(handover, victim), |c| c.result);
        let leaving = victim.progress == Progress::Leaving;
        let spared = if leaving || !(called || handover.resumed) {
            None
        } else {
            self.no_longer_to_evict(handover, victim).await
        };
        let eviction = if leaving {
            Eviction::AlreadyGone
        } else if let Some(reason) = spared {
            self.spare(term, handover, victim, called, &reason).await
        } else {
            let target = evict::EvictionTarget {
                namespace: &victim.target.key.namespace,
                name: &victim.target.key.name,
                uid: &victim.target.uid,
                grace: victim.grace,
                unchanged_since: None,
            };
            evict::evict(
                &self.client,
                term,
                &target,
                disruption::guard(&self.stores, &victim.target.key, &victim.target.uid)
                    .marked(victim.disruption_marked),
                handover.timeline.deadline(),
                |refusal| self.announce_refusal(handover, victim, refusal),
            )
            .await
        };
        // Only an eviction this process made ends the phase (not one it found done).
        let evicted_at = (!leaving && eviction.removed()).then(Instant::now);
        if !matches!(eviction, Eviction::NotLeader) {
            self.metrics.evicted(eviction.outcome());
            self.announce_eviction(handover, victim, &eviction);
        }
        VictimRemoval {
            victim: victim.target.key.clone(),
            checkpoint: result,
            checkpointed_at,
            eviction,
            evicted_at,
        }
    }

    /// Why `victim` is no longer to be evicted, asked once time passed since the plan: its
    /// owner was deleted meanwhile (a Deployment scaled back down: nobody needs the room), or
    /// its queue no longer borrows it ([`super::recheck`]).
    async fn no_longer_to_evict(&self, handover: &Handover, victim: &Victim) -> Option<String> {
        if self.owner_gone(handover) {
            return Some(format!(
                "its reclaim's owner {} was deleted, so nobody needs the room it holds",
                handover.owner.key
            ));
        }
        let borrowed = self
            .rechecks
            .still_borrowed(&victim.target.key, Instant::now())
            .await;
        (!borrowed).then(|| format!(
            "its queue {} no longer borrows this pod (the queue shrank since the plan, and without the pod it would hold less than its guarantee), or the operator could not tell in time",
            victim.queue
        ))
    }

    /// Whether the handover's owner is deleted, or being deleted, as the store shows it.
    fn owner_gone(&self, handover: &Handover) -> bool {
        self.stored(&handover.owner)
            .is_none_or(|pod| pod.metadata.deletion_timestamp.is_some())
    }

    /// Takes a victim no longer to evict out of the handover, for `reason`: its server resumed
    /// if `checkpointed` paused it, its intent and mark taken back, never evicted.
    async fn spare(
        &self,
        term: &Term,
        handover: &Handover,
        victim: &Victim,
        checkpointed: bool,
        reason: &str,
    ) -> Eviction {
        if !term.is_current() {
            return Eviction::NotLeader;
        }
        // Gone or being deleted meanwhile: it leaves all the same, and its room with it.
        let Some(pod) = self
            .stored(&victim.target)
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        else {
            return Eviction::AlreadyGone;
        };
        match self
            .abandon_pod(&handover.id, reason, &pod, &victim.target, checkpointed)
            .await
        {
            PodAbandon::Done(note) => {
                tracing::warn!(reclaim = %handover.id, victim = %victim.target.key, "{note}");
                self.announce_abandoned(&victim.target, note);
            }
            PodAbandon::Nothing => {}
            PodAbandon::Later => {
                tracing::warn!(reclaim = %handover.id, victim = %victim.target.key,
                    "the spared victim keeps its intent for now; taken back once the reclaim is stale");
            }
        }
        Eviction::Spared
    }

    /// Ends a handover one of whose victims was spared, if any was: the owner's room is not
    /// freed, so the owner is planned anew ([`super::requeue`]), and the handover is recorded
    /// as such.
    async fn give_up_room(
        &self,
        term: &Term,
        handover: &Handover,
        outcomes: &[VictimRemoval],
    ) -> Option<HandoverEnd> {
        let (spared, _) = handover
            .victims
            .iter()
            .zip(outcomes)
            .find(|(_, o)| matches!(o.eviction, Eviction::Spared))?;
        if self.owner_gone(handover) {
            let outcome = format!(
                "OwnerGone: the owner was deleted during the handover, so its victims on node {} were spared",
                handover.node
            );
            return Some(self.finish(term, handover, outcomes, &outcome).await);
        }
        let cause = Cause::VictimSpared {
            victim: &spared.target.key,
            queue: &spared.queue,
        };
        self.requeue_unbound_owner(term, handover, cause).await;
        let outcome = format!(
            "VictimSpared: {}: its queue {} no longer borrows it, so the room on node {} was not freed and the owner is planned anew",
            spared.target.key, spared.queue, handover.node
        );
        Some(self.finish(term, handover, outcomes, &outcome).await)
    }

    /// The victim's checkpoint, if this process makes one: the progress mark is written first,
    /// so that no process ever makes the call twice. `None` when no call is made.
    async fn checkpoint(
        &self,
        term: &Term,
        handover: &Handover,
        victim: &Victim,
    ) -> Option<Checkpointed> {
        if victim.progress != Progress::Marked {
            return None;
        }
        let checkpointer = Checkpointer::from_policy(&victim.checkpoint, &self.checkpoints);
        let started = Instant::now();
        let allowance = checkpoint_allowance(
            handover.timeline.budget,
            checkpointer.timeout(),
            handover.eviction_reserve,
            handover.timeline.elapsed(started),
        );
        // Nothing to call, or no time to call it: no mark needed, the driver reports why.
        let calls = checkpointer.driver() != CheckpointDriver::None
            && !allowance.is_zero()
            && victim.address.is_ok();
        if calls {
            if !term.is_current() {
                return None;
            }
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &victim.target.key.namespace);
            let target = (victim.target.key.name.as_str(), victim.target.uid.as_str());
            let marked =
                progress::record_call(&pods, target, &handover.id, started + allowance).await;
            if marked == Ok(CallRecord::MadeBefore) {
                let made_before = Victim {
                    progress: Progress::Checkpointed,
                    ..victim.clone()
                };
                return Some(Checkpointed {
                    result: skipped_checkpoint(handover, &made_before),
                    at: Instant::now(),
                    called: true,
                });
            }
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
                return Some(Checkpointed {
                    result,
                    at: Instant::now(),
                    called: false,
                });
            }
        }
        // The allowance counts from `started`: the mark's writes are part of it.
        let report = checkpointer
            .checkpoint(victim.address.clone(), started + allowance)
            .await;
        let done = Instant::now();
        self.metrics
            .checkpointed(report.driver_label(), report.result());
        self.announce_checkpoint(handover, victim, &report);
        Some(Checkpointed {
            result: checkpoint_result(victim, &report),
            at: done,
            called: calls,
        })
    }

    /// Releases the owner once its room is free and waits until the store shows every victim
    /// gone and the owner bound, until `terminated` (the deadline plus the victims' grace) and
    /// [`SETTLE_LIMIT`] more; only until `terminated` when each victim left is held by
    /// finalizers then, which no wait of ours removes. `None` when the term ended first.
    async fn settle(
        &self,
        term: &Term,
        handover: &mut Handover,
        terminated: Instant,
    ) -> Option<Settlement> {
        let limit = terminated + SETTLE_LIMIT;
        let mut changes = self.stores.changes();
        let mut term_watch = term.clone();
        let mut crashed_checked = false;
        let mut gone_at = vec![None; handover.victims.len()];
        let mut held_claims = false;
        let mut release = PendingRelease::of(self, handover);
        loop {
            changes.borrow_and_update();
            let now = Instant::now();
            for (victim, at) in handover.victims.iter().zip(&mut gone_at) {
                if at.is_none() && !self.holds_its_room(&victim.target) {
                    *at = Some(now);
                }
            }
            let victims_gone = gone_at.iter().all(Option::is_some);
            let holding = self.victims_hold_claims(handover);
            held_claims |= holding;
            // A victim's DRA devices are free only once its claims are released, after it is
            // gone: the handover is not done before.
            let gone = victims_gone && !holding;
            if held_claims && gone {
                handover.timeline.end(Phase::ClaimsFreed, now);
            }
            let retry_release = release.advance(self, term, handover, gone, now).await;
            let owner = self.stored(&handover.owner);
            let owner_gone = owner.is_none();
            let bound = owner
                .as_ref()
                .and_then(|p| p.spec.as_ref())
                .and_then(|s| s.node_name.clone());
            if let (Some(node), Some(owner)) = (&bound, &owner) {
                note_bound(handover, owner, node, now);
            }
            // Without victims of its own, the room it waits for is free when it is bound.
            if victims_gone && !handover.victims.is_empty() {
                handover.timeline.end(Phase::VictimsGone, now);
                if !crashed_checked {
                    crashed_checked = true;
                    self.crash_after(Phase::VictimsGone, &handover.id);
                }
            }
            let held = self.held_by_finalizers(handover, &gone_at);
            let stuck =
                now >= terminated && held.len() == gone_at.iter().filter(|g| g.is_none()).count();
            if (gone && bound.is_some()) || owner_gone || now >= limit || (!gone && stuck) {
                let unbound = !owner_gone && bound.is_none();
                let gated = release.at_end(self, term, handover, unbound).await;
                return Some(Settlement {
                    gone,
                    gone_at,
                    bound,
                    owner_gone,
                    held,
                    gated,
                });
            }
            let wake = if now < terminated { terminated } else { limit };
            let wake = retry_release.map_or(wake, |at| at.min(wake));
            tokio::select! {
                signal = changes.changed() => if signal.is_err() { return None },
                () = tokio::time::sleep_until(wake) => {}
                () = term_watch.lost() => return None,
            }
        }
    }

    /// The victims not gone yet (by `gone_at`) that finalizers hold, with those finalizers.
    fn held_by_finalizers(
        &self,
        handover: &Handover,
        gone_at: &[Option<Instant>],
    ) -> Vec<(PodKey, Vec<String>)> {
        handover
            .victims
            .iter()
            .zip(gone_at)
            .filter(|(_, gone)| gone.is_none())
            .filter_map(|(victim, _)| {
                let stored = self.stored(&victim.target)?;
                stored.metadata.deletion_timestamp.as_ref()?;
                let finalizers = stored.metadata.finalizers.clone().unwrap_or_default();
                (!finalizers.is_empty()).then(|| (victim.target.key.clone(), finalizers))
            })
            .collect()
    }

    /// Records the handover on both queues, announces it, and clears the owner's intent last
    /// (a crash before that makes the next leader record it again, under the same id).
    async fn finish(
        &self,
        term: &Term,
        handover: &Handover,
        removals: &[VictimRemoval],
        outcome: &str,
    ) -> HandoverEnd {
        let id = handover.id.clone();
        let victim_queues: BTreeSet<&str> =
            handover.victims.iter().map(|v| v.queue.as_str()).collect();
        let writes = record_writes(handover, &victim_queues, removals, outcome);
        if !term.is_current() {
            return HandoverEnd::stopped(id);
        }
        self.count_finish(handover, outcome, &victim_queues);
        let unwritten = Unwritten {
            owner: handover.owner.clone(),
            writes: writes
                .into_iter()
                .map(|(queue, record)| (queue.to_owned(), record))
                .collect(),
        };
        self.write_out(term, id, unwritten).await
    }

    /// Writes again what handover `id` left unwritten ([`Unwritten`]).
    pub async fn write_again(self, term: Term, id: String, unwritten: Unwritten) -> HandoverEnd {
        tracing::info!(reclaim = %id, "writing the records of a finished handover again");
        self.write_out(&term, id, unwritten).await
    }

    /// Writes the records, then clears the owner's intent: it goes last, being what makes the
    /// next leader finish this handover.
    async fn write_out(&self, term: &Term, id: String, unwritten: Unwritten) -> HandoverEnd {
        let recorded = self.write_records(term, &unwritten.writes).await;
        if recorded {
            self.crash_after_records(&id);
        }
        let done =
            recorded && term.is_current() && self.clear_owner_intent(&unwritten.owner, &id).await;
        HandoverEnd {
            id,
            done,
            unwritten: (!done).then_some(unwritten),
        }
    }

    /// Writes every record at once; whether all of them were written.
    async fn write_records(&self, term: &Term, writes: &[(String, HandoverRecord)]) -> bool {
        let queues: Api<GpuQueue> = Api::all(self.client.clone());
        let results = join_all(
            writes
                .iter()
                .map(|(queue, record)| self.records.write(&queues, term, queue, record)),
        )
        .await;
        let mut recorded = true;
        for error in results.into_iter().filter_map(Result::err) {
            recorded = false;
            tracing::warn!(%error, "writing a handover record failed");
        }
        recorded
    }

    /// Counts the end of the handover in the metrics and announces it (once per handover).
    fn count_finish(&self, handover: &Handover, outcome: &str, victim_queues: &BTreeSet<&str>) {
        let timeline = &handover.timeline;
        for phase in Phase::ALL {
            if let Some(at) = timeline.at(phase) {
                self.metrics.phase(phase, at);
            }
        }
        let completed = outcome == COMPLETED;
        self.metrics
            .finished(if completed { "completed" } else { "incomplete" });
        self.metrics.handover_finished(
            &handover.owner_queue,
            timeline.at(Phase::OwnerBound),
            timeline.budget,
        );
        self.announce_finish(handover, outcome, victim_queues);
        tracing::info!(reclaim = %handover.id, outcome, resumed = handover.resumed, timeline = %timeline.summary(), "handover finished");
    }

    /// Clears the intent of reclaim `id` on `owner`, left there by an operator that stopped
    /// after recording the handover's end (see [`super::trust::Dropped`]).
    pub(super) async fn clear_finished_owner(
        self,
        term: Term,
        owner: HandoverPod,
        id: String,
    ) -> HandoverEnd {
        let done = term.is_current() && self.clear_owner_intent(&owner, &id).await;
        HandoverEnd {
            id,
            done,
            unwritten: None,
        }
    }

    /// Clears the owner's intent, if the store still holds the owner; `false` when that
    /// failed and must be retried.
    async fn clear_owner_intent(&self, owner: &HandoverPod, id: &str) -> bool {
        let Some(owner) = self.stored(owner) else {
            return true;
        };
        let cleared = match intent::clear_patch(&owner, id) {
            Ok(patch) => self.patch_pod(&owner, patch).await.map(drop),
            Err(error) => Err(error),
        };
        if let Err(error) = cleared
            && !error.is_stale()
        {
            tracing::warn!(reclaim = %id, %error, "clearing the owner's intent failed; retried");
            return false;
        }
        true
    }
}

/// The record of the handover for the owner's queue and for each victim's queue, as they
/// stand now (an owner not bound yet counts the time until now).
fn record_writes<'a>(
    handover: &'a Handover,
    victim_queues: &BTreeSet<&'a str>,
    removals: &[VictimRemoval],
    outcome: &str,
) -> Vec<(&'a str, HandoverRecord)> {
    let timeline = &handover.timeline;
    let total = timeline
        .at(Phase::OwnerBound)
        .unwrap_or_else(|| timeline.elapsed(Instant::now()));
    let record = |role: &str| HandoverRecord {
        id: handover.id.clone(),
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
    let mut writes = vec![(handover.owner_queue.as_str(), record(Role::Owner.as_str()))];
    writes.extend(
        victim_queues
            .iter()
            .map(|q| (*q, record(Role::Victim.as_str()))),
    );
    writes
}

/// Times the owner's bind to `node`, seen at `now`.
fn note_bound(handover: &mut Handover, owner: &Pod, node: &str, now: Instant) {
    // Owners of a burst pinned on one node bind as soon as any victim there is gone: one bound
    // before its own victims had its room freed by another handover's, so for its record the
    // room it waited for was free then.
    let at = if handover.resumed {
        resumed_owner_bound(owner, &handover.timeline, now)
    } else {
        now
    };
    handover.timeline.end(Phase::VictimsGone, at);
    handover.timeline.end(Phase::OwnerBound, at);
    if node != handover.node {
        tracing::warn!(reclaim = %handover.id, %node, freed = %handover.node,
            "the owner was bound to another node than the one freed for it");
    }
}

/// What the wait for the victims and the owner saw.
#[derive(Debug)]
struct Settlement {
    gone: bool,
    /// When the store first showed each victim (in the handover's order) gone.
    gone_at: Vec<Option<Instant>>,
    bound: Option<String>,
    owner_gone: bool,
    /// Victims still terminating because finalizers hold them, with those finalizers.
    held: Vec<(PodKey, Vec<String>)>,
    /// The owner was still at the gate when the wait ended: its room was never free.
    gated: bool,
}

/// Each victim's termination (eviction accepted by this process to gone) with its grace, for
/// the budget rule; a victim evicted by an earlier leader, or not gone, gives none.
fn terminations(
    victims: &[Victim],
    removals: &[VictimRemoval],
    settled: &Settlement,
) -> Vec<(Duration, Duration)> {
    victims
        .iter()
        .zip(removals)
        .zip(&settled.gone_at)
        .filter_map(|((victim, removal), gone)| {
            Some((
                gone.as_ref()?
                    .saturating_duration_since(removal.evicted_at?),
                victim.grace,
            ))
        })
        .collect()
}

impl Settlement {
    /// The victims are gone, the owner was released and is still there, and kube-scheduler
    /// did not bind it.
    fn owner_not_bound(&self) -> bool {
        self.gone && !self.gated && self.bound.is_none() && !self.owner_gone
    }
}

/// A checkpoint this process made or judged pointless.
struct Checkpointed {
    result: CheckpointResult,
    /// When it ended.
    at: Instant,
    /// The victim's server was called (and may be paused).
    called: bool,
}

/// One victim's checkpoint and eviction.
#[derive(Debug)]
struct VictimRemoval {
    victim: PodKey,
    checkpoint: CheckpointResult,
    checkpointed_at: Option<Instant>,
    eviction: Eviction,
    evicted_at: Option<Instant>,
}

/// `Completed`, or the reason it was not.
fn outcome(settled: &Settlement, removals: &[VictimRemoval]) -> String {
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
        (_, false) => match settled.held.first() {
            Some((victim, finalizers)) => format!(
                "VictimsNotGone: {victim} is held by the finalizer {}: it has not ended past its grace period (its node's kubelet has not stopped it), so it keeps its GPUs, and the owner stays pinned to the node until it ends or is gone: check its node, and have whoever owns the finalizer finish or remove it",
                finalizers.join(", ")
            ),
            None => "VictimsNotGone: a victim was still terminating at the limit".into(),
        },
        (None, true) if settled.gated => {
            "RoomNotFree: the victims are gone but victims of other reclaims on the node, whose room the owner counted on, were still there at the limit".into()
        }
        (None, true) => {
            "OwnerNotBound: the victims are gone but kube-scheduler has not bound the owner".into()
        }
    }
}

/// The record of a victim whose checkpoint this process did not make.
fn skipped_checkpoint(handover: &Handover, victim: &Victim) -> CheckpointResult {
    let message = match victim.progress {
        Progress::Spared => {
            "its queue no longer borrowed it: spared by an earlier leader".to_owned()
        }
        Progress::Checkpointed => {
            "made by an earlier leader before it stopped; never repeated".to_owned()
        }
        Progress::Leaving => "the pod was already terminating or gone".to_owned(),
        Progress::Marked => format!(
            "the term of this replica ended before reclaim {}'s checkpoint",
            handover.id
        ),
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
        CheckpointOutcome::Succeeded(_) => "Succeeded",
        CheckpointOutcome::Failed { .. } => "Failed",
        CheckpointOutcome::TimedOut { .. } => "TimedOut",
        CheckpointOutcome::Unsupported { .. } => "Unsupported",
        CheckpointOutcome::Skipped(_) => "Skipped",
    };
    CheckpointResult {
        pod: victim.target.key.to_string(),
        driver: report.driver_label().to_owned(),
        result: result.to_owned(),
        millis: millis(report.elapsed),
        message: match report.outcome {
            CheckpointOutcome::Succeeded(_) => String::new(),
            _ => report.outcome.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use kube::Client;
    use serde_json::{Value, json};

    use super::*;
    use crate::cluster::testing::TestStores;
    use crate::leader::test_term;
    use crate::mock_api::{self, Log};

    /// An API server whose queues have an empty status and whose pods are `owner`, answering
    /// the first `fail` status patches of queue `batch` with 500.
    fn api(owner: Value, mut fail: usize) -> (Client, Log) {
        mock_api::serve(move |request| {
            if request.method == "PATCH" && request.path.contains("/gpuqueues/batch/") && fail > 0 {
                fail -= 1;
                return mock_api::failure(500, "InternalError", "etcd restarting");
            }
            if request.path.contains("/pods/") {
                return (200, owner.clone());
            }
            let name = request.path.split('/').nth(5).unwrap_or_default();
            (
                200,
                json!({"apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
                    "metadata": {"name": name, "resourceVersion": "7"},
                    "spec": {"namespaces": [name], "resources": []},
                    "status": {"lastHandovers": [], "reclaimsInFlight": []}}),
            )
        })
    }

    /// Path and body of each patch the server saw.
    fn patches(log: &Log) -> Vec<(String, Value)> {
        crate::sync::lock(log)
            .iter()
            .filter(|s| s.method == "PATCH")
            .map(|s| (s.path.clone(), s.body.clone()))
            .collect()
    }

    /// Review finding: one queue's record landing and another's failing (an API server
    /// restarting) made the retry rebuild the handover from its entry, after its victims were
    /// gone, and record it anew without its phases over the good records.
    #[tokio::test]
    async fn records_that_failed_are_written_again_as_they_were_then_the_intent_cleared() {
        let owner = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "o", "namespace": "online", "uid": "uid-o", "resourceVersion": "3",
                "annotations": {"gpuqueue.io/reclaim-id": "rc-1", "gpuqueue.io/reclaim-role": "owner"}}});
        let mut stores = TestStores::new();
        stores.add_pod(owner.clone());
        let (client, log) = api(owner.clone(), 1);
        let reclaimer = Reclaimer::for_tests(client, stores.stores.clone());
        let (term, _state) = test_term().await;
        let record = |role: &str| HandoverRecord {
            id: "rc-1".into(),
            role: role.into(),
            outcome: COMPLETED.into(),
            total_millis: 1_234,
            ..HandoverRecord::default()
        };
        let unwritten = Unwritten {
            owner: HandoverPod::of(&serde_json::from_value(owner).unwrap()),
            writes: vec![
                ("online".into(), record("owner")),
                ("batch".into(), record("victim")),
            ],
        };
        let first = reclaimer.write_out(&term, "rc-1".into(), unwritten).await;
        assert!(!first.done);
        let kept = first.unwritten.expect("the records to write again");
        let owner_cleared = || {
            patches(&log)
                .iter()
                .filter(|(path, _)| path.contains("/pods/"))
                .count()
        };
        assert_eq!(
            owner_cleared(),
            0,
            "the intent goes only after every record"
        );

        let again = reclaimer.write_again(term, "rc-1".into(), kept).await;
        assert!(again.done && again.unwritten.is_none());
        assert_eq!(owner_cleared(), 1);
        let patches = patches(&log);
        let batch: Vec<&Value> = patches
            .iter()
            .filter(|(path, _)| path.contains("/gpuqueues/batch/"))
            .map(|(_, body)| &body["status"]["lastHandovers"][0])
            .collect();
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[0], batch[1], "written again as it was");
        assert_eq!(batch[1]["totalMillis"], 1_234);
    }

    fn removal(eviction: Eviction) -> VictimRemoval {
        VictimRemoval {
            victim: PodKey::new("b", "v"),
            checkpoint: CheckpointResult::default(),
            checkpointed_at: None,
            eviction,
            evicted_at: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_termination_is_timed_from_this_process_eviction_to_gone() {
        let listed = |pod: &str| gpuqueue_api::v1alpha1::VictimInFlight {
            pod: pod.into(),
            uid: pod.into(),
            queue: "batch".into(),
        };
        let grace = Duration::from_secs(2);
        let victims = [
            Victim::departed(
                &listed("b/v1"),
                gpuqueue_api::v1alpha1::CheckpointPolicy::default(),
                grace,
            ),
            Victim::departed(
                &listed("b/v2"),
                gpuqueue_api::v1alpha1::CheckpointPolicy::default(),
                grace,
            ),
            Victim::departed(
                &listed("b/v3"),
                gpuqueue_api::v1alpha1::CheckpointPolicy::default(),
                grace,
            ),
        ];
        let start = Instant::now();
        let at = |ms| Some(start + Duration::from_millis(ms));
        let mut removals = [
            removal(Eviction::Evicted { refusals: 0 }),
            removal(Eviction::AlreadyGone),
            removal(Eviction::Evicted { refusals: 0 }),
        ];
        removals[0].evicted_at = at(100);
        removals[2].evicted_at = at(120);
        let settled = Settlement {
            gone: false,
            // v1 went 700 ms after its eviction; v2 was evicted by an earlier leader; v3 is
            // still there.
            gone_at: vec![at(800), at(50), None],
            bound: None,
            owner_gone: false,
            held: Vec::new(),
            gated: false,
        };
        assert_eq!(
            terminations(&victims, &removals, &settled),
            [(Duration::from_millis(700), grace)]
        );
    }

    #[tokio::test]
    async fn the_outcome_names_what_did_not_happen() {
        let evicted = [removal(Eviction::Evicted { refusals: 0 })];
        let settled = |gone, bound: Option<&str>, owner_gone| Settlement {
            gone,
            gone_at: Vec::new(),
            bound: bound.map(str::to_owned),
            owner_gone,
            held: Vec::new(),
            gated: false,
        };
        assert_eq!(
            outcome(&settled(true, Some("n"), false), &evicted),
            "Completed"
        );
        assert!(outcome(&settled(false, Some("n"), false), &evicted).starts_with("VictimsNotGone"));
        let mut held = settled(false, None, false);
        held.held = vec![(PodKey::new("b", "v"), vec!["example.com/backup".to_owned()])];
        let stuck = outcome(&held, &evicted);
        assert!(
            stuck.starts_with("VictimsNotGone: b/v is held by the finalizer example.com/backup"),
            "{stuck}"
        );
        assert!(outcome(&settled(true, None, false), &evicted).starts_with("OwnerNotBound"));
        let mut waiting = settled(true, None, false);
        waiting.gated = true;
        assert!(
            !waiting.owner_not_bound(),
            "never released: nothing to requeue"
        );
        assert!(outcome(&waiting, &evicted).starts_with("RoomNotFree"));
        assert!(outcome(&settled(true, None, true), &evicted).starts_with("OwnerGone"));
        let failed = [removal(Eviction::Failed {
            error: "forbidden".into(),
        })];
        assert_eq!(
            outcome(&settled(false, None, false), &failed),
            "EvictionFailed: b/v: forbidden"
        );
    }
}
