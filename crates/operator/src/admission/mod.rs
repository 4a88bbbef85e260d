//! The admission loop: the leader's work. Each pass is a short pipeline, run when the stores
//! change (debounced; while no pod waits, a change that calls for no decision is taken in
//! within [`BOOKKEEPING`]) and never on a timer unless a decision names a time, a reservation
//! made at creation expires (its pod may never appear, and bring no change), or a queue status
//! held back by [`status_pacing`] is due:
//!
//! 1. **observe**: read the stores into the core's model (pods seen through [`Assumed`], and the
//!    pods the webhook reserved at creation that the store does not show yet).
//! 2. **decide**: `gpuqueue_core::admission::admission_cycle` orders the waiting pods fairly and
//!    decides each: admit (node and quota), reclaim, or wait with a reason.
//! 3. **apply**: release the gate on the chosen node (JSON patch that tests the gate), or,
//!    once the pod has waited [`FIRST_REASON_AFTER`], record why it waits (annotation, and an
//!    event when the cause changes).
//! 4. **report**: queue status by server-side apply when it changed (a change of counters alone
//!    at most once a second per queue, [`status_pacing`]), events for quota edits and
//!    condition changes, and the queue and fragmentation gauges.
//!
//! The writes of steps 3 and 4 run in the background, at most [`WRITE_CONCURRENCY`] at once and
//! one per object, while the next pass already decides: what they will write is assumed at
//! once ([`Assumed`]) and corrected by the API server's answer, so no capacity is promised twice
//! and a burst of pods is not held back by the round trips of the one before.
//!
//! Nothing is written unless this replica's leadership [`Term`] is current at that moment, and
//! nothing runs before every store has synced, the budgets aside (fail closed). When the term ends this future and
//! every write it started are aborted.
//!
//! The phases are files: [`observe`] (1), the core (2), `apply` (3: plan the writes, then start
//! them), `report` (4); `waiting` says when a waiting reason is due, and `context` holds what
//! the loop and its background writes share.
//!
//! [`Assumed`]: crate::cluster::assumed::Assumed
//! [`FIRST_REASON_AFTER`]: waiting::FIRST_REASON_AFTER
//!
//! Reclaims (see [`crate::reclaim`]): each pass first resumes or abandons handovers an earlier
//! leader left in the intent annotations; a `Reclaim` decision writes its intent and releases
//! the owner before the next pass (so that pass sees the node taken), and the rest of the
//! handover runs in a task the loop owns, aborted with it when the term ends.

mod apply;
pub mod at_creation;
mod context;
mod device_claims;
mod enforce;
mod held_back;
pub mod metrics;
pub mod observe;
mod report;
mod status_pacing;
mod waiting;

use std::{sync::Arc, time::Duration};

use gpuqueue_core::{
    Policy,
    admission::{self, Decision},
    reclaim::{self, ReclaimPlan},
    snapshot::kept::{KeptSnapshot, Made},
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use tokio::{
    sync::{Notify, Semaphore},
    task::JoinSet,
};
use tracing::Instrument;

pub use context::{Context, WRITE_CONCURRENCY};

use crate::{
    clock,
    cluster::{assumed, debounce::Debounce},
    leader::Term,
    reclaim::{Handovers, PassTiming, Reservation},
    seal,
};
use apply::{admitted_at_creation, apply, begin_reclaims};
use at_creation::{AtCreation, RESERVATION_TTL};
use context::{RETRY_AFTER, Shared};
use observe::{Models, Observation};
use report::report;
use waiting::WaitingSince;

/// How soon a change that calls for no decision (see `Stores::urgent_changes`) reaches the
/// gauges while no pod waits (and the queue status, within [`status_pacing`]'s second): in a
/// burst of pods admitted at their creation, a pass every few milliseconds would only count
/// them again.
const BOOKKEEPING: Debounce = Debounce {
    quiet: Duration::from_millis(500),
    max: Duration::from_millis(500),
};

/// Runs passes for as long as `term` lasts (the caller aborts this future when it ends, which
/// aborts its writes too).
pub async fn run(context: Context, term: Term) {
    if context.stores.synced().await.is_err() {
        return;
    }
    reconcile_assumed(&context).await;
    // However the term ends (this future is aborted), the webhook stops admitting at creation
    // and the gauges stop showing this replica's last pass.
    let _withdraw = Withdraw(context.clone());
    let seal = term_seal(&context).await;
    context.seals.set(seal.clone());
    tracing::info!(
        term = term.number(),
        sealed = seal.is_some(),
        "admission loop started"
    );
    let mut changes = context.stores.changes();
    let mut urgent_changes = context.stores.urgent_changes();
    let shared = Shared {
        context,
        term,
        retry: Arc::new(Notify::new()),
        permits: Arc::new(Semaphore::new(WRITE_CONCURRENCY)),
    };
    let mut tasks = JoinSet::new();
    // Dropped (aborting every handover task) when the term ends and this future is aborted.
    let mut handovers = Handovers::new(shared.context.reclaimer.clone());
    let mut carried = PassMemory::default();
    carried.models.seal = seal;
    for number in 1_u64.. {
        if !shared.term.is_current() {
            // The term ran out while this process could not run (paused, starved): a pass now
            // would announce and plan as a leader it no longer is. The caller aborts this
            // future as soon as it sees the term lost.
            std::future::pending::<()>().await;
        }
        while tasks.try_join_next().is_some() {}
        // The pass reads everything: what changed until now is in it.
        changes.borrow_and_update();
        urgent_changes.borrow_and_update();
        let span = tracing::info_span!(
            "admission_pass",
            term = shared.term.number(),
            pass = number,
            pending = tracing::field::Empty,
            decisions = tracing::field::Empty,
        );
        let Wakeup { wake, waiting } = pass(&shared, &mut tasks, &mut handovers, &mut carried)
            .instrument(span)
            .await;
        // While pods wait, any change may let one in; otherwise only the urgent ones call for
        // a decision, and the rest is taken in within [`BOOKKEEPING`].
        let bookkeeping = if waiting {
            shared.context.debounce
        } else {
            BOOKKEEPING
        };
        let timer = wake_at(wake, &shared.context.at_creation);
        // Every branch leads to a pass, which reads everything: a change consumed by an
        // interrupted debounce is not lost.
        tokio::select! {
            more = shared.context.debounce.next_burst(&mut urgent_changes) => if !more { return },
            more = bookkeeping.next_burst(&mut changes) => if !more { return },
            () = shared.retry.notified() => {}
            () = shared.context.reclaimer.rechecks().wanted() => {}
            () = timer => {}
        }
    }
}

/// Answers the writes an earlier term of this process left in flight before the first pass
/// decides with them (see [`assumed::reconcile`]); tries again until the reads succeed.
async fn reconcile_assumed(context: &Context) {
    loop {
        match assumed::reconcile(&context.assumed, &context.client, &context.stores).await {
            Ok(0) => return,
            Ok(read) => {
                tracing::info!(read, "reconciled the writes the last term left in flight");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "reading the objects of writes left in flight failed; retrying");
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}

/// Resolves at `wake`, or earlier at the expiry of a reservation the webhook makes meanwhile
/// (a pass's own `wake` already counts those it saw). Never resolves when neither comes.
async fn wake_at(wake: Option<Timestamp>, at_creation: &AtCreation) {
    let mut wake = wake;
    loop {
        let sleep = async {
            match wake.and_then(|at| Duration::try_from(at.duration_since(clock::now())).ok()) {
                Some(wait) => tokio::time::sleep(wait).await,
                None if wake.is_some() => {}
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sleep => return,
            () = at_creation.first_reservation() => {
                let expiry = clock::now() + RESERVATION_TTL;
                wake = Some(wake.map_or(expiry, |at| at.min(expiry)));
            }
        }
    }
}

/// Withdraws the live snapshot from the webhook when dropped, and empties the queue,
/// fragmentation and left-out gauges: a standby shows no queue rows, so sums across replicas
/// count the leader's alone.
struct Withdraw(Context);

impl Drop for Withdraw {
    fn drop(&mut self) {
        self.0.at_creation.withdraw();
        self.0.seals.set(None);
        self.0.queue_gauges.publish(Vec::new());
        self.0
            .fragmentation_gauges
            .publish(metrics::FragmentationReport::default());
        self.0.metrics.left_out(0);
    }
}

/// The seal of this term's admissions: the key in the operator's namespace, made if there is
/// none yet (by the first leader with seals, after every admission of a version without).
/// Asked again while the API server fails to answer: a term that admitted unsealed meanwhile
/// would leave admissions the next term cannot believe. Only where the key can never be had
/// (the Role refuses it, or the Secret is not a key) does the term admit unsealed, and tell no
/// forged admission apart.
async fn term_seal(context: &Context) -> Option<seal::Seal> {
    let mut wait = Duration::from_millis(200);
    loop {
        match seal::load_or_create(&context.client, &context.namespace).await {
            Ok(seal) => return Some(seal),
            Err(error) if error.is_lasting() => {
                tracing::error!(%error,
                    "admissions go unsealed this term, and a tenant's forged admission is not told apart: grant the operator get and create of this Secret (config/rbac/admission_seal_role.yaml)");
                return None;
            }
            Err(error) => {
                tracing::warn!(%error, "the admission seal's key could not be read; asking again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// What the next pass waits for.
struct Wakeup {
    /// When it must run even without a change.
    wake: Option<Timestamp>,
    /// Whether pods were left waiting (then any change may let one in).
    waiting: bool,
}

/// One pass with its reclaims: handovers an earlier leader left half done are resumed or
/// abandoned first, then [`run_pass`] decides, and the reclaims it planned are started (intent
/// written, owner released) before the next pass.
async fn pass(
    shared: &Shared,
    tasks: &mut JoinSet<()>,
    handovers: &mut Handovers,
    carried: &mut PassMemory,
) -> Wakeup {
    let started = tokio::time::Instant::now();
    let now = clock::now();
    let recovered = handovers.recover(&shared.term, now).await;
    let decided = run_pass(shared, tasks, handovers, carried, started, now);
    let found = PassTiming {
        started,
        started_at: now,
        planned: decided.planned,
    };
    let mut reclaims = decided.reclaims;
    reclaims.retain(|(_, plan)| {
        !recovered.defers(&plan.node_name) && !carried.held_back.holds(&plan.owner_key, started)
    });
    let failed = begin_reclaims(shared, &reclaims, found, |started| {
        let Reservation {
            owner,
            victims,
            handover,
        } = started;
        let mut assumed = shared.assumed();
        assumed.admitted(owner);
        for (before, marked) in victims {
            assumed.marked(&before, marked);
        }
        drop(assumed);
        handovers.start(&shared.term, handover);
    })
    .await;
    if !failed.is_empty() {
        // Held back from the passes their own failed writes wake, until the retry.
        let now = tokio::time::Instant::now();
        for owner in failed {
            carried.held_back.hold(owner, now, now + RETRY_AFTER);
        }
        let retry = shared.retry.clone();
        tasks.spawn(async move {
            tokio::time::sleep(RETRY_AFTER).await;
            retry.notify_one();
        });
    }
    Wakeup {
        wake: decided.wake.into_iter().chain(recovered.wake).min(),
        waiting: decided.waiting,
    }
}

/// What [`run_pass`] leaves to the async part of the pass.
struct PassResult {
    wake: Option<Timestamp>,
    /// Whether pods were left waiting.
    waiting: bool,
    /// When the decisions were ready: the end of a handover's `plan` phase.
    planned: tokio::time::Instant,
    /// Owners to reclaim GPUs for, with their plans.
    reclaims: Vec<(Arc<Pod>, ReclaimPlan)>,
}

/// One pass: decide, start the writes, publish the gauges; the reclaims it plans are returned
/// to be started. Each numbered phase is one call.
fn run_pass(
    shared: &Shared,
    tasks: &mut JoinSet<()>,
    handovers: &mut Handovers,
    carried: &mut PassMemory,
    started: tokio::time::Instant,
    now: Timestamp,
) -> PassResult {
    let context = &shared.context;
    // This function never awaits, so the thread's CPU clock counts this pass alone.
    let cpu_started = clock::thread_cpu_time();
    // Held to the end of the pass: the webhook admits at creation on this pass's result only.
    let mut creation = context.at_creation.pass();

    // 1. observe (no client): stores, assumed writes, reservations and cool-downs
    let Observation {
        mut snapshot,
        made,
        unreadable_pods,
        invalid_queues,
        stuck_pins,
        unbelieved,
    } = observe_pass(shared, handovers, &mut creation, carried, now);

    // 2. decide (pure, in the core)
    let decisions = admission::admission_cycle(&mut snapshot, &Policy::default(), now);
    let cooldown = admission::next_expiry(&decisions);
    let planned = tokio::time::Instant::now();
    let left_waiting =
        !unreadable_pods.is_empty() || decisions.iter().any(|d| !matches!(d, Decision::Admit(_)));
    tracing::Span::current()
        .record("pending", decisions.len() + unreadable_pods.len())
        .record("decisions", decisions.len());

    // 3. apply: the writes the decisions call for start in the background, evictions too
    let waiting = metrics::waiting_pods(&decisions);
    let enforce = &mut carried.enforce;
    enforce.start(shared, tasks, &snapshot, &decisions, &stuck_pins.pins);
    enforce.announce_unbelieved(shared, &unbelieved, now);
    device_claims::guard(shared, tasks);
    let applied = apply(
        shared,
        tasks,
        &snapshot,
        decisions,
        unreadable_pods,
        &mut carried.waiting_since,
        now,
    );

    // 4. report: queue status and events (background writes), gauges, the live snapshot
    let reported = report(
        shared,
        tasks,
        &mut carried.status_pacing,
        &snapshot,
        &invalid_queues,
        waiting,
        now,
    );
    let expiry = creation.next_expiry();
    let reopen = creation.publish(shared.term.clone(), snapshot, left_waiting, now);
    let took = started.elapsed();
    context.metrics.pass_took(took.as_secs_f64());
    let cpu = clock::thread_cpu_time().saturating_sub(cpu_started);
    log_pass(took, cpu, &made, &applied, &reported);
    PassResult {
        wake: cooldown
            .into_iter()
            .chain(applied.first_reason_due)
            .chain(stuck_pins.next)
            .chain(reported.held_until)
            .chain(reopen)
            .chain(expiry)
            .min(),
        waiting: left_waiting,
        planned,
        reclaims: applied.reclaims,
    }
}

/// One debug line per pass: how long it took, and what it started.
fn log_pass(
    took: Duration,
    cpu: Duration,
    made: &Made,
    applied: &apply::ApplySummary,
    reported: &report::Reported,
) {
    tracing::debug!(
        ?took,
        ?cpu,
        updated = matches!(made, Made::Updated { .. }),
        admitted = applied.admitted,
        waiting = applied.waiting,
        reclaims = applied.reclaims.len(),
        statuses = reported.statuses,
        "admission pass"
    );
}

/// Phase 1 of a pass: what the stores show, with the writes still in flight assumed, the
/// reservations that appeared settled, and reclaim marks no in-flight record vouches for ignored,
/// marked behind while a watch it is read from is not live; whether each victim in flight is still
/// borrowed is published for its eviction to ask.
fn observe_pass(
    shared: &Shared,
    handovers: &mut Handovers,
    creation: &mut at_creation::Pass<'_>,
    carried: &mut PassMemory,
    now: Timestamp,
) -> Observation {
    let context = &shared.context;
    let (read_from, live) = (tokio::time::Instant::now(), context.stores.live());
    let (mut observed, settled) = observe::read(
        &context.stores,
        &mut shared.assumed(),
        creation,
        &mut carried.models,
        now,
    );
    context.metrics.left_out(observed.problems.len());
    for settled in settled {
        admitted_at_creation(context, &settled);
    }
    handovers.ignore_unrecorded(
        &shared.term,
        &mut observed.pods,
        &observed.queues,
        &observed.namespaces,
        now,
    );
    let mut observation = observe::snapshot(
        observed,
        &context.stores,
        &mut carried.snapshot,
        handovers.reclaimed_from(),
        now,
    );
    // The victim terminations observed per node, which the reclaim budget plans with.
    observation
        .snapshot
        .set_terminations(context.reclaimer.terminations());
    // A watch listing afresh: admit, but disrupt nobody on a view that may be stale.
    observation.snapshot.set_behind(!live);
    // Whether each victim in flight is still borrowed, for its eviction to ask.
    context.reclaimer.rechecks().publish(
        read_from,
        live,
        reclaim::pending_victims(&observation.snapshot),
    );
    observation
}

/// What a pass leaves to the next (this term's only).
#[derive(Debug, Default)]
struct PassMemory {
    waiting_since: WaitingSince,
    models: Models,
    snapshot: KeptSnapshot,
    enforce: enforce::EnforceMemory,
    status_pacing: status_pacing::StatusPacing,
    held_back: held_back::HeldBack,
}
