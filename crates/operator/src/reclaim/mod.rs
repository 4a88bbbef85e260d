//! The reclaim executor: carries out the core's `Decision::Reclaim` (DESIGN §5) and finishes
//! handovers that an earlier leader left half done.
//!
//! ```text
//! admission pass (leader)                         handover task (one per reclaim)
//! ───────────────────────                         ───────────────────────────────
//! recover: resume / abandon intents from the store
//! plan (core) ─▶ intent on every victim (rv-tested)
//!              ─▶ owner: intent + pin + release, one patch ─▶ per victim, all at once:
//!                                                               mark `checkpointing`, checkpoint
//!                                                               (deadline from the budget left),
//!                                                               evict (PDB: retry to the deadline,
//!                                                               then delete)
//!                                                             ─▶ watch: victims gone, owner bound
//!                                                             ─▶ record on both queues, events,
//!                                                               metrics; clear the owner's intent
//! ```
//!
//! The files follow the diagram: `begin` writes the intent and releases the owner, `execute`
//! checkpoints, evicts (`evict`), waits and records (`record`), `resume` finds what an
//! earlier leader left, and `announce` holds every event text. `handover` says what a
//! handover is, `intent` how it is written on pods, `timeline` how it is timed, and
//! `reclaimer` is the handle they all run on; this file drives the tasks.
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
mod crash;
mod evict;
mod execute;
mod handover;
mod intent;
mod metrics;
mod reclaimer;
mod record;
mod resume;
mod timeline;

use std::collections::{HashMap, HashSet};

use jiff::{SignedDuration, Timestamp};
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;
use tracing::Instrument;

pub use begin::{BeginError, Reservation};
pub use crash::{BadCrashPoint, CrashPoint};
pub use evict::{Eviction, EvictionTarget, try_evict};
use execute::HandoverEnd;
pub use handover::{Handover, PassTiming};
use intent::Mark;
pub use intent::VICTIM;
pub use metrics::ReclaimMetrics;
pub use reclaimer::Reclaimer;
pub use resume::Recovery;

use crate::leader::Term;

/// How long a reclaim whose recovery did not settle (a refused eviction, a failed write) waits
/// before it is tried again.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

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
    /// or intent clearing failed: the retry writes those only.
    counted: HashSet<String>,
    /// Queues reclaimed from by this process, with the start of the newest reclaim: their
    /// borrowing cool-down holds before their `lastHandovers` show it.
    reclaimed_from: HashMap<String, Timestamp>,
}

/// What recovery means for the rest of the pass.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryEffect {
    /// Stale intents are being taken back: plan no new reclaim in this pass, since the plan
    /// would count their victims as taken and could evict others instead.
    pub defer_reclaims: bool,
    /// When a pass must look again.
    pub wake: Option<Timestamp>,
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
            counted: HashSet::new(),
            reclaimed_from: HashMap::new(),
        }
    }

    /// Reclaims this process is running.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Queues a reclaim took GPUs from, and when, for the snapshot's cool-down.
    pub fn reclaimed_from(&self) -> impl Iterator<Item = (String, Timestamp)> + '_ {
        self.reclaimed_from.iter().map(|(q, at)| (q.clone(), *at))
    }

    /// Runs a handover whose owner was just released.
    pub fn start(&mut self, term: &Term, handover: Handover) {
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
            let (task, done, counted) = match joined {
                Ok((task, finished)) => (task, finished.done, finished.counted),
                Err(error) => {
                    tracing::error!(%error, "a handover task failed");
                    (error.id(), false, false)
                }
            };
            if let Some(id) = self.by_task.remove(&task) {
                self.running.remove(&id);
                if done {
                    self.retry.remove(&id);
                    self.counted.remove(&id);
                    self.finished.insert(id);
                } else {
                    if counted {
                        self.counted.insert(id.clone());
                    }
                    self.retry.insert(id, now + RETRY_AFTER);
                }
            }
        }
        self.retry.retain(|_, at| *at > now);
    }

    /// Finds the handovers no task of this process runs and resumes or abandons them (see
    /// [`resume`]). Runs at the start of every pass.
    pub async fn recover(&mut self, term: &Term, now: Timestamp) -> RecoveryEffect {
        let instant = Instant::now();
        self.reap(instant);
        let pods = self.reclaimer.stores.pods.state();
        let marked: HashSet<String> = pods
            .iter()
            .filter_map(|pod| Mark::read(pod).map(|mark| mark.id))
            .collect();
        self.finished.retain(|id| marked.contains(id));
        self.counted.retain(|id| marked.contains(id));
        let found = resume::scan(
            &pods,
            |id| {
                self.running.contains_key(id)
                    || self.retry.contains_key(id)
                    || self.finished.contains(id)
            },
            now,
        );
        let mut recovered = RecoveryEffect::default();
        for recovery in found {
            match recovery {
                Recovery::Resume { id, owner, victims } => {
                    let mut handover = self.reclaimer.rebuild(&id, &owner, &victims, instant, now);
                    if self.counted.contains(&id) {
                        // This process ran it to the end; only its records are missing.
                        handover.counted = true;
                        tracing::info!(reclaim = %id, "writing the records of a finished handover again");
                        self.spawn(term, handover);
                        continue;
                    }
                    tracing::warn!(reclaim = %id, owner = %handover.owner.key, "resuming a handover an earlier leader started");
                    self.reclaimer.announce_resumed(&handover);
                    self.spawn(term, handover);
                }
                Recovery::Abandon { id, owner, victims } => {
                    recovered.defer_reclaims = true;
                    let span =
                        tracing::info_span!("handover", reclaim = %id, victims = victims.len());
                    let settled = self
                        .reclaimer
                        .abandon(term, &id, owner.as_deref(), &victims)
                        .instrument(span)
                        .await;
                    if !settled {
                        self.retry.insert(id, instant + RETRY_AFTER);
                    }
                }
                Recovery::NotYet { until, .. } => {
                    recovered.defer_reclaims = true;
                    recovered.wake = recovered.wake.into_iter().chain(Some(until)).min();
                }
            }
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
}
