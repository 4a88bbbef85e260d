//! The reclaim executor: carries out the core's `Decision::Reclaim` (DESIGN §5) and finishes
//! handovers that an earlier leader left half done.
//!
//! ```text
//! admission pass (leader)                         handover task (one per reclaim)
//! ───────────────────────                         ───────────────────────────────
//! recover: resume / abandon intents from the store
//! plan (core) ─▶ intent on every victim (rv-tested; no PDB:
//!                with DisruptionTarget), while the owner
//!                queue's status.reclaimsInFlight records it
//!              ─▶ owner: intent + pin, one patch (gated); ─▶ per victim, all at once:
//!                                                             mark `checkpointing`, checkpoint
//!                                                             (deadline from the budget left),
//!                                                               evict (PDB: retry to the deadline,
//!                                                               then delete; no PDB: delete)
//!                                                             ─▶ watch: victims gone, owner bound
//!                                                             ─▶ record on both queues, events,
//!                                                               metrics; clear the owner's intent
//! ```
//!
//! The files follow the diagram: `begin` writes the intent and releases the owner, `execute`
//! checkpoints, evicts (`evict`; `disruption` says whether a budget guards the victim), waits
//! and records (`record`), `resume` finds what an earlier leader left, and `announce` holds
//! every event text. `handover` says what a handover is, `intent` how it is written on pods,
//! `timeline` how it is timed, and `reclaimer` is the handle they all run on; this file drives
//! the tasks.
//!
//! Every phase is timed from the start of the admission pass that found the owner blocked
//! ([`timeline`]). The intent and the owner's release are written inside that pass, so the next
//! pass already sees the owner admitted on its node and the node closed to other pods; the rest
//! runs in a task of its own, so a 1.2-second checkpoint never holds other admissions back.
//!
//! **Crash safety.** Writes happen in the order [`resume`] relies on, each one testing the pod
//! it changes (uid, the plan's `resourceVersion` or the reclaim id; see [`intent`]), and every
//! write first checks that this replica's leadership [`Term`] is current. Tasks live in a
//! `JoinSet` owned by the admission loop, so they are aborted with it when the term ends; the
//! next leader finds the intents and finishes (or abandons) them without repeating a
//! checkpoint or an eviction.
//!
//! **The API client.** The executor's client does not retry on its own: kube's default client
//! retries 429, 503 and 504 for up to about five minutes, which would turn a
//! PodDisruptionBudget's refusal into a silent five-minute stall. Every call here is made once
//! and its answer handled under the handover's deadline ([`evict`]).
//!
//! **Anti-thrash.** A victim's queue is reported reclaimed-from at once (in memory, then
//! through its `lastHandovers`), so it does not borrow again within its `minBorrowDuration`;
//! its replacement pods wait behind the owner, who already holds the freed GPUs in the
//! snapshot. `gpuqueue_reclaims_per_minute` shows the rate.

mod announce;
mod begin;
mod budget;
mod crash;
mod disruption;
mod evict;
mod execute;
mod handover;
mod in_flight;
mod intent;
mod metrics;
mod planned;
mod progress;
mod recheck;
mod reclaimer;
mod record;
mod release;
mod requeue;
mod resume;
mod terminations;
mod timeline;
mod trust;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use gpuqueue_core::model::{self, PodKey};
use jiff::{SignedDuration, Timestamp};
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;
use tracing::Instrument;

pub use begin::{BeginError, Prepared, Reservation};
pub use crash::{BadCrashPoint, CrashPoint};
pub use evict::{Eviction, EvictionTarget, try_evict};
use execute::{HandoverEnd, Unwritten};
use handover::HandoverPod;
pub use handover::{Handover, PassTiming};
use intent::Mark;
pub use intent::VICTIM;
pub use metrics::ReclaimMetrics;
pub use recheck::Rechecks;
pub use reclaimer::Reclaimer;
pub use resume::Recovery;
use trust::{Claims, Recorded, Trusted, Vouched};

use crate::leader::Term;

/// How long a reclaim whose recovery did not settle (a refused eviction, a failed write) waits
/// before it is tried again.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// How long this process remembers a reclaim it ran to the end: longer than its pod watch lags
/// the owner's clearing write, so that an owner still shown marked then is not cleared again.
const DONE_REMEMBERED: std::time::Duration = std::time::Duration::from_secs(30);

/// The admission loop's side of the executor: the running handover tasks and what the next
/// passes must know about them. Dropping it aborts every task.
#[derive(Debug)]
pub struct Handovers {
    reclaimer: Reclaimer,
    tasks: JoinSet<HandoverEnd>,
    running: HashMap<String, Id>,
    by_task: HashMap<Id, String>,
    /// Reclaims whose recovery did not settle, and when to try again.
    retry: HashMap<String, Instant>,
    /// Reclaims this process finished whose intent the store still shows (its watch lags the
    /// clearing write, or a victim is still terminating): never resumed a second time.
    finished: HashSet<String>,
    /// Reclaims this process ran to the end (counted in the metrics, announced) whose records
    /// or intent clearing failed: the retry writes those only, as they were.
    unwritten: HashMap<String, Unwritten>,
    /// Reclaims this process ran to the end, with when ([`DONE_REMEMBERED`]).
    done: HashMap<String, Instant>,
    /// Queues reclaimed from by this process, with the start of the newest reclaim: their
    /// borrowing cool-down holds before their `lastHandovers` show it.
    reclaimed_from: HashMap<String, Timestamp>,
    /// The `status.reclaimsInFlight` entries of the reclaims this process started, until they
    /// end: the queue store may not show them yet, and their marks must count at once.
    mine: HashMap<String, Recorded>,
}

/// What recovery means for the rest of the pass.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecoveryEffect {
    /// Nodes whose stale intents are being taken back (or may still be committed by another
    /// writer): plan no new reclaim on them in this pass, since the plan would count their
    /// victims as taken and could evict others instead. Other nodes' reclaims go ahead.
    pub defer_nodes: BTreeSet<String>,
    /// When a pass must look again.
    pub wake: Option<Timestamp>,
}

impl RecoveryEffect {
    /// Whether a reclaim planned on `node` waits for a later pass.
    pub fn defers(&self, node: &str) -> bool {
        self.defer_nodes.contains(node)
    }
}

impl Handovers {
    pub fn new(reclaimer: Reclaimer) -> Self {
        Self {
            reclaimer,
            tasks: JoinSet::new(),
            running: HashMap::new(),
            by_task: HashMap::new(),
            retry: HashMap::new(),
            finished: HashSet::new(),
            unwritten: HashMap::new(),
            done: HashMap::new(),
            reclaimed_from: HashMap::new(),
            mine: HashMap::new(),
        }
    }

    /// Queues a reclaim took GPUs from, and when, for the snapshot's cool-down.
    pub fn reclaimed_from(&self) -> impl Iterator<Item = (String, Timestamp)> + '_ {
        self.reclaimed_from.iter().map(|(q, at)| (q.clone(), *at))
    }

    /// Takes the reclaim mark off every pod of this pass's model whose mark the operator did
    /// not record (see [`trust`]), before the core sees them; `queues` and `namespaces` are
    /// the pass's, for which queue claims a pod's namespace. An owner whose reclaim ended and
    /// was recorded keeps its intent only because the operator that ran it stopped before
    /// clearing it: a task of `term` clears it.
    pub fn ignore_unrecorded(
        &mut self,
        term: &Term,
        pods: &mut [Arc<model::Pod>],
        queues: &[model::Queue],
        namespaces: &[model::Namespace],
        now: Timestamp,
    ) {
        if pods.iter().all(|pod| pod.reclaim.is_none()) {
            self.reclaimer.metrics.unrecorded_marks(0);
            return;
        }
        let stores = &self.reclaimer.stores;
        let trusted = Trusted::read(stores, self.mine.values().cloned(), now);
        let claims = Claims::new(queues, namespaces);
        let dropped = trusted.drop_unrecorded_marks(
            pods,
            &claims,
            |key| trust::stored_pod(stores, key),
            |id, owner| {
                claims
                    .queue_of(&owner.namespace)
                    .is_some_and(|queue| trust::records_owner(stores, &queue, id, owner))
            },
        );
        self.reclaimer.metrics.unrecorded_marks(dropped.unrecorded);
        for (owner, id) in dropped.finished_owners {
            self.clear_finished_owner(term, &owner, id);
        }
    }

    /// Clears, in a task, the intent on `owner` of reclaim `id`, which ended and was recorded
    /// by an operator that stopped before clearing it; unless this process knows the reclaim
    /// (it clears it itself, and its store may lag the write). A clearing that fails is tried
    /// again after a while, as a handover that stopped early.
    fn clear_finished_owner(&mut self, term: &Term, owner: &PodKey, id: String) {
        let known = self.running.contains_key(&id)
            || self.retry.contains_key(&id)
            || self.finished.contains(&id)
            || self.done.contains_key(&id)
            || self.unwritten.contains_key(&id);
        if known {
            return;
        }
        let Some(stored) = trust::stored_pod(&self.reclaimer.stores, owner) else {
            return;
        };
        tracing::info!(reclaim = %id, %owner, "clearing the intent a finished handover left on its owner");
        let span = tracing::info_span!("handover", reclaim = %id);
        let task = self.tasks.spawn(
            self.reclaimer
                .clone()
                .clear_finished_owner(term.clone(), HandoverPod::of(&stored), id.clone())
                .instrument(span),
        );
        self.by_task.insert(task.id(), id.clone());
        self.running.insert(id, task.id());
    }

    /// Runs a handover whose owner was just released.
    pub fn start(&mut self, term: &Term, handover: Handover) {
        self.mine.insert(
            handover.id.clone(),
            Recorded {
                queue: handover.owner_queue.clone(),
                entry: in_flight::entry_of(&handover),
            },
        );
        for victim in &handover.victims {
            let at = handover.timeline.started_at;
            let entry = self
                .reclaimed_from
                .entry(victim.queue.clone())
                .or_insert(at);
            *entry = (*entry).max(at);
        }
        self.spawn(term, handover);
    }

    fn spawn(&mut self, term: &Term, handover: Handover) {
        let id = handover.id.clone();
        let span = handover.span();
        let task = self.tasks.spawn(
            self.reclaimer
                .clone()
                .run(term.clone(), handover)
                .instrument(span),
        );
        self.by_task.insert(task.id(), id.clone());
        self.running.insert(id, task.id());
    }

    /// Forgets finished tasks; one that stopped early is looked at again after a while.
    fn reap(&mut self, now: Instant) {
        while let Some(joined) = self.tasks.try_join_next_with_id() {
            let (task, done, unwritten) = match joined {
                Ok((task, finished)) => (task, finished.done, finished.unwritten),
                Err(error) => {
                    tracing::error!(%error, "a handover task failed");
                    (error.id(), false, None)
                }
            };
            if let Some(id) = self.by_task.remove(&task) {
                self.running.remove(&id);
                if done {
                    self.retry.remove(&id);
                    self.unwritten.remove(&id);
                    self.done.insert(id.clone(), now);
                    self.finished.insert(id);
                } else {
                    if let Some(unwritten) = unwritten {
                        self.unwritten.insert(id.clone(), unwritten);
                    }
                    self.retry.insert(id, now + RETRY_AFTER);
                }
            }
        }
        self.retry.retain(|_, at| *at > now);
        self.done
            .retain(|_, at| now.saturating_duration_since(*at) < DONE_REMEMBERED);
        // Past its task and its retry, a reclaim's entry is the store's to show.
        let (running, retry, unwritten) = (&self.running, &self.retry, &self.unwritten);
        self.mine.retain(|id, _| {
            running.contains_key(id) || retry.contains_key(id) || unwritten.contains_key(id)
        });
    }

    /// Starts writing again, in a task, what each finished handover left unwritten once its
    /// retry is due: from what it kept, whatever the store shows of its reclaim by then.
    fn write_unwritten(&mut self, term: &Term) {
        let due: Vec<(String, Unwritten)> = self
            .unwritten
            .iter()
            .filter(|(id, _)| !self.running.contains_key(*id) && !self.retry.contains_key(*id))
            .map(|(id, unwritten)| (id.clone(), unwritten.clone()))
            .collect();
        for (id, unwritten) in due {
            let span = tracing::info_span!("handover", reclaim = %id);
            let task = self.tasks.spawn(
                self.reclaimer
                    .clone()
                    .write_again(term.clone(), id.clone(), unwritten)
                    .instrument(span),
            );
            self.by_task.insert(task.id(), id.clone());
            self.running.insert(id, task.id());
        }
    }

    /// Finds the handovers no task of this process runs and resumes or abandons them (see
    /// [`resume`]). Only reclaims recorded in operator-owned state count ([`trust`]): a mark
    /// nobody recorded is ignored. Runs at the start of every pass, once every watch delivers:
    /// a store still relisting after a failover may miss what the last leader did just before
    /// it stopped (a checkpoint it called, which an abandon must resume).
    pub async fn recover(&mut self, term: &Term, now: Timestamp) -> RecoveryEffect {
        let instant = Instant::now();
        self.reap(instant);
        self.write_unwritten(term);
        if !self.reclaimer.stores.live() {
            return RecoveryEffect::default();
        }
        let stores = &self.reclaimer.stores;
        let trusted = Trusted::read(stores, self.mine.values().cloned(), now);
        let claims = Claims::read(stores);
        // With no reclaim in flight no mark can be vouched for: the pods are not read (every
        // pass comes here, and at 10,000 pods reading them all is a share of its time).
        let pods: Vec<_> = if trusted.is_empty() {
            Vec::new()
        } else {
            stores
                .pods
                .state()
                .into_iter()
                .filter(|pod| trusted.vouches_for(pod, &claims))
                .collect()
        };
        let marked: HashSet<String> = pods
            .iter()
            .filter_map(|pod| Mark::read(pod).map(|mark| mark.id))
            .collect();
        self.finished.retain(|id| marked.contains(id));
        let skip = |id: &str| {
            self.running.contains_key(id)
                || self.retry.contains_key(id)
                || self.finished.contains(id)
                || self.unwritten.contains_key(id)
        };
        let found = resume::scan(
            &pods,
            skip,
            |id| trusted.get(id).map(|r| r.entry.deadline.0),
            now,
        );
        let left_nothing: Vec<Recorded> = trusted
            .iter()
            .filter(|r| {
                !marked.contains(&r.entry.id) && !skip(&r.entry.id) && r.entry.deadline.0 <= now
            })
            .cloned()
            .collect();
        let mut recovered = RecoveryEffect::default();
        for recovery in found {
            let Some(recorded) = trusted.get(recovery.id()) else {
                continue;
            };
            self.recover_one(
                term,
                recovery,
                recorded,
                Vouched {
                    claims: &claims,
                    pods: &pods,
                },
                &mut recovered,
                instant,
                now,
            )
            .await;
        }
        for recorded in &left_nothing {
            self.forget(recorded).await;
        }
        if let Some(retry) = self.retry.values().min() {
            let wait = SignedDuration::try_from(retry.saturating_duration_since(instant))
                .unwrap_or_default();
            recovered.wake = recovered
                .wake
                .into_iter()
                .chain(now.checked_add(wait).ok())
                .min();
        }
        recovered
    }

    /// Resumes, abandons or waits for one recorded reclaim.
    #[allow(clippy::too_many_arguments)]
    async fn recover_one(
        &mut self,
        term: &Term,
        recovery: Recovery,
        recorded: &Recorded,
        vouched: Vouched<'_>,
        recovered: &mut RecoveryEffect,
        instant: Instant,
        now: Timestamp,
    ) {
        match recovery {
            Recovery::Resume { id, owner, victims } => {
                let handover = self
                    .reclaimer
                    .rebuild(recorded, &owner, &victims, vouched, instant, now);
                tracing::warn!(reclaim = %id, owner = %handover.owner.key, "resuming a handover an earlier leader started");
                self.reclaimer.announce_resumed(&handover);
                self.spawn(term, handover);
            }
            Recovery::Abandon { id, owner, victims } => {
                recovered.defer_nodes.insert(recorded.entry.node.clone());
                let span = tracing::info_span!("handover", reclaim = %id, victims = victims.len());
                let settled = self
                    .reclaimer
                    .abandon(term, &id, owner.as_deref(), &victims)
                    .instrument(span)
                    .await;
                if settled {
                    self.forget(recorded).await;
                } else {
                    self.retry.insert(id, instant + RETRY_AFTER);
                }
            }
            Recovery::NotYet { until, .. } => {
                recovered.defer_nodes.insert(recorded.entry.node.clone());
                recovered.wake = recovered.wake.into_iter().chain(Some(until)).min();
            }
        }
    }

    /// Takes a reclaim that left nothing to do out of its owner queue's status.
    async fn forget(&mut self, recorded: &Recorded) {
        let id = &recorded.entry.id;
        self.mine.remove(id);
        if let Err(error) = in_flight::remove(&self.reclaimer.queues(), &recorded.queue, id).await {
            tracing::warn!(reclaim = %id, %error, "taking a finished reclaim out of status.reclaimsInFlight failed; tried again on a later pass");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_intent_being_committed_defers_reclaims_on_its_node_only() {
        let effect = RecoveryEffect {
            defer_nodes: BTreeSet::from(["gpu-node-1".to_owned()]),
            wake: None,
        };
        assert!(effect.defers("gpu-node-1"));
        assert!(!effect.defers("gpu-node-2"));
        assert!(!RecoveryEffect::default().defers("gpu-node-1"));
    }
}
