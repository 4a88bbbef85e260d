//! The admission loop: the leader's work. Each pass is a short pipeline, run when the stores
//! change (debounced; while no pod waits, a change that calls for no decision is taken in
//! within [`BOOKKEEPING`]) and never on a timer unless a decision names a time:
//!
//! 1. **observe**: read the stores into the core's model (pods seen through [`Assumed`]).
//! 2. **decide**: `gpuqueue_core::admission::admission_cycle` orders the waiting pods fairly and
//!    decides each: admit (node and quota), reclaim, or wait with a reason.
//! 3. **apply**: release the gate on the chosen node (JSON patch that tests the gate), or,
//!    once the pod has waited [`FIRST_REASON_AFTER`], record why it waits (annotation, and an
//!    event when the cause changes).
//! 4. **report**: queue status by server-side apply when it changed, events for quota edits and
//!    condition changes, and the queue and fragmentation gauges.
//!
//! The writes of steps 3 and 4 run in the background, at most [`WRITE_CONCURRENCY`] at once and
//! one per object, while the next pass already decides: what they will write is assumed at
//! once ([`Assumed`]) and corrected by the API server's answer, so no capacity is promised twice
//! and a burst of pods is not held back by the round trips of the one before.
//!
//! Nothing is written unless this replica's leadership [`Term`] is current at that moment, and
//! nothing runs before every store has synced (fail closed). When the term ends this future and
//! every write it started are aborted.
//!
//! Reclaims (see [`crate::reclaim`]): each pass first resumes or abandons handovers an earlier
//! leader left in the intent annotations; a `Reclaim` decision writes its intent and releases
//! the owner before the next pass (so that pass sees the node taken), and the rest of the
//! handover runs in a task the loop owns, aborted with it when the term ends.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use gpuqueue_api::{
    conditions::types,
    v1alpha1::{GpuQueue, GpuQueueStatus},
};
use gpuqueue_core::{
    Snapshot,
    admission::{self, Decision, WaitReason},
    fragmentation::{DEFAULT_POPULARITY, TaskShape, WorkloadMix},
    model::PodKey,
    placement::{FragmentationAware, TieBreak},
    reclaim::ReclaimPlan,
    status::{QueueReport, invalid_spec_status, queue_reports},
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, Resource, runtime::reflector::ObjectRef};
use tokio::{
    sync::{Notify, Semaphore},
    task::JoinSet,
};

use crate::{
    assumed::Assumed,
    at_creation::{AtCreation, Settled},
    clock,
    debounce::Debounce,
    events::{Events, Notice},
    leader::Term,
    metrics::{FragmentationReport, Metrics, Outcome, QueueRow},
    observe::{InvalidQueue, Observed, PodModels, is_gated},
    patch::{self, PatchError},
    reclaim::{Handovers, PassTiming, Reclaimer, Reservation},
    status,
    stores::Stores,
};

/// API writes in flight at once: enough to admit a burst of pods quickly, well under the API
/// server's default limit of 200 concurrent mutating requests.
pub const WRITE_CONCURRENCY: usize = 32;

/// A waiting pod's reason is rewritten at once when its cause changes, but when only its
/// numbers change (capacity filling up around it), at most this often: a burst of pods that do
/// not fit must not cost one write per pod per pass.
const REASON_REFRESH: SignedDuration = SignedDuration::from_secs(30);

/// A pod's first waiting reason is written once it has waited this long (by this process's
/// count): a pod admitted sooner never needs one, so a burst of pods that briefly wait costs no
/// reason written and removed again, and the writes that admit pods go first.
const FIRST_REASON_AFTER: SignedDuration = SignedDuration::from_secs(1);

/// How soon a change that calls for no decision (see `Stores::urgent_changes`) reaches the
/// queue status and the gauges while no pod waits: in a burst of pods admitted at their
/// creation, a pass every few milliseconds would only count them again.
const BOOKKEEPING: Debounce = Debounce {
    quiet: Duration::from_millis(500),
    max: Duration::from_millis(500),
};

/// After a write failed for a reason other than the object moving on (which brings its own
/// watch event), the next pass runs this much later.
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// What the loop needs; cheap to clone.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub stores: Stores,
    pub metrics: Metrics,
    pub events: Events,
    pub debounce: Debounce,
    /// The reclaim executor.
    pub reclaimer: Reclaimer,
    /// The live snapshot this loop shares with the webhook.
    pub at_creation: AtCreation,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("stores", &self.stores)
            .field("debounce", &self.debounce)
            .finish_non_exhaustive()
    }
}

/// State shared by the loop and the writes it started.
#[derive(Clone)]
struct Shared {
    context: Context,
    term: Term,
    assumed: Arc<Mutex<Assumed>>,
    /// Woken by a write that failed, after [`RETRY_AFTER`]: the next pass decides again.
    retry: Arc<Notify>,
    permits: Arc<Semaphore>,
}

impl Shared {
    fn assumed(&self) -> MutexGuard<'_, Assumed> {
        crate::sync::lock(&self.assumed)
    }

    /// Starts `write` for the object with `uid` in the background; the caller has marked it in
    /// flight. The write waits for a permit, and is skipped if the term ended meanwhile.
    fn spawn<F>(&self, tasks: &mut JoinSet<()>, uid: String, write: F)
    where
        F: Future<Output = Written> + Send + 'static,
    {
        let shared = self.clone();
        tasks.spawn(async move {
            let Ok(_permit) = shared.permits.acquire().await else {
                return;
            };
            let written = if shared.term.is_current() {
                write.await
            } else {
                Written::NotLeader
            };
            shared.assumed().end(&uid);
            // A stale object brings its own watch event; a failure has to be retried.
            if written == Written::Failed {
                tokio::time::sleep(RETRY_AFTER).await;
                shared.retry.notify_one();
            }
        });
    }
}

/// What became of one background write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    Done,
    /// The object moved on under it; decided again from the store.
    Stale,
    Failed,
    NotLeader,
}

/// Runs passes for as long as `term` lasts (the caller aborts this future when it ends, which
/// aborts its writes too).
pub async fn run(context: Context, term: Term) {
    if context.stores.synced().await.is_err() {
        return;
    }
    tracing::info!(term = term.number(), "admission loop started");
    // However the term ends (this future is aborted), the webhook stops admitting at creation.
    let _withdraw = Withdraw(context.at_creation.clone());
    let mut changes = context.stores.changes();
    let mut urgent_changes = context.stores.urgent_changes();
    let shared = Shared {
        context,
        term,
        assumed: Arc::default(),
        retry: Arc::new(Notify::new()),
        permits: Arc::new(Semaphore::new(WRITE_CONCURRENCY)),
    };
    let mut tasks = JoinSet::new();
    // Dropped (aborting every handover task) when the term ends and this future is aborted.
    let mut handovers = Handovers::new(shared.context.reclaimer.clone());
    let mut carried = Carried::default();
    loop {
        while tasks.try_join_next().is_some() {}
        // The pass reads everything: what changed until now is in it.
        changes.borrow_and_update();
        urgent_changes.borrow_and_update();
        let Next { wake, waiting } = pass(&shared, &mut tasks, &mut handovers, &mut carried).await;
        // While pods wait, any change may let one in; otherwise only the urgent ones call for
        // a decision, and the rest is taken in within [`BOOKKEEPING`].
        let bookkeeping = if waiting {
            shared.context.debounce
        } else {
            BOOKKEEPING
        };
        let timer = async {
            match wake.and_then(|at| Duration::try_from(at.duration_since(clock::now())).ok()) {
                Some(wait) => tokio::time::sleep(wait).await,
                None if wake.is_some() => {}
                None => std::future::pending().await,
            }
        };
        // Every branch leads to a pass, which reads everything: a change consumed by an
        // interrupted debounce is not lost.
        tokio::select! {
            more = shared.context.debounce.next_burst(&mut urgent_changes) => if !more { return },
            more = bookkeeping.next_burst(&mut changes) => if !more { return },
            () = shared.retry.notified() => {}
            () = timer => {}
        }
    }
}

/// Withdraws the live snapshot from the webhook when dropped.
struct Withdraw(AtCreation);

impl Drop for Withdraw {
    fn drop(&mut self) {
        self.0.withdraw();
    }
}

/// What the next pass waits for.
struct Next {
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
    carried: &mut Carried,
) -> Next {
    let started = tokio::time::Instant::now();
    let now = clock::now();
    let recovered = handovers.recover(&shared.term, now).await;
    let decided = run_pass(shared, tasks, handovers, carried, started, now);
    let found = PassTiming {
        started,
        started_at: now,
        planned: decided.planned,
    };
    let reclaims = if recovered.defer_reclaims {
        Vec::new()
    } else {
        decided.reclaims
    };
    let begun = futures::future::join_all(
        reclaims
            .iter()
            .map(|(pod, plan)| begin_reclaim(shared, pod, plan, found)),
    )
    .await;
    let mut failed = false;
    for outcome in begun {
        match outcome {
            Begun::Started(started) => {
                let Reservation { owner, handover } = *started;
                shared.assumed().admitted(owner);
                handovers.start(&shared.term, handover);
            }
            Begun::Failed => failed = true,
            Begun::Nothing => {}
        }
    }
    if failed {
        let retry = shared.retry.clone();
        tasks.spawn(async move {
            tokio::time::sleep(RETRY_AFTER).await;
            retry.notify_one();
        });
    }
    Next {
        wake: earliest(decided.wake, recovered.wake),
        waiting: decided.waiting,
    }
}

/// What [`run_pass`] leaves to the async part of the pass.
struct Decided {
    wake: Option<Timestamp>,
    /// Whether pods were left waiting.
    waiting: bool,
    /// When the decisions were ready: the end of a handover's `plan` phase.
    planned: tokio::time::Instant,
    /// Owners to reclaim GPUs for, with their plans.
    reclaims: Vec<(Arc<Pod>, ReclaimPlan)>,
}

/// One pass: decide, start the writes, publish the gauges; the reclaims it plans are returned
/// to be started.
fn run_pass(
    shared: &Shared,
    tasks: &mut JoinSet<()>,
    handovers: &Handovers,
    carried: &mut Carried,
    started: tokio::time::Instant,
    now: Timestamp,
) -> Decided {
    let context = &shared.context;
    // Held to the end of the pass: the webhook admits at creation on this pass's result only.
    let mut creation = context.at_creation.pass();

    // 1. observe
    let (observed, settled) = {
        let mut assumed = shared.assumed();
        let stored = context.stores.pods.state();
        assumed.settle(stored.iter().map(AsRef::as_ref));
        let settled = creation.settle(&stored, now);
        // One read of the pod store for all three, so that a pod arriving meanwhile is not
        // counted both as itself and as its reservation.
        let mut observed =
            Observed::read(&context.stores, &stored, &assumed, &mut carried.pod_models);
        // Pods admitted at creation that the store does not show yet hold their room.
        observed.pods.extend(creation.reserved_pods());
        (observed, settled)
    };
    for settled in settled {
        admitted_at_creation(context, &settled);
    }
    for problem in &observed.problems {
        tracing::debug!(%problem, "object left out of the snapshot");
    }
    let mix = WorkloadMix::from_shapes(
        observed.pods.iter().map(TaskShape::of_pod),
        DEFAULT_POPULARITY,
    );
    let mut builder = Snapshot::builder()
        .queues(observed.queues)
        .namespaces(observed.namespaces)
        .nodes(observed.nodes)
        .pods(observed.pods)
        .workload_mix(mix);
    // When each queue was last reclaimed from (its borrowing cool-down): from the queues'
    // handover records, and from this process's handovers whose records are not written yet.
    for (queue, at) in last_reclaims(&context.stores)
        .into_iter()
        .chain(handovers.reclaimed_from())
    {
        builder = builder.reclaimed_from(queue, at);
    }
    let (mut snapshot, issues) = builder.build();
    for issue in &issues {
        tracing::debug!(%issue, "snapshot left an object out");
    }

    // 2. decide
    let decisions =
        admission::admission_cycle(&mut snapshot, &FragmentationAware, TieBreak::First, now);
    let cooldown = earliest_cooldown(&decisions);
    let planned = tokio::time::Instant::now();
    let left_waiting = !observed.unreadable_pods.is_empty()
        || decisions.iter().any(|d| !matches!(d, Decision::Admit(_)));

    // 3. apply
    let applied = apply(
        shared,
        tasks,
        decisions,
        observed.unreadable_pods,
        &mut carried.waiting_since,
        now,
    );

    // 4. report
    let status_time = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let reports = queue_reports(&snapshot);
    let statuses = start_reports(
        shared,
        tasks,
        &reports,
        &observed.invalid_queues,
        status_time,
    );
    publish_fragmentation(context, &snapshot);
    let reopen = creation.publish(shared.term.clone(), snapshot, left_waiting, now);
    let took = started.elapsed();
    context.metrics.admission.pass_took(took.as_secs_f64());
    tracing::debug!(
        ?took,
        admitted = applied.admitted,
        waiting = applied.waiting,
        reclaims = applied.reclaims.len(),
        statuses,
        "admission pass"
    );
    Decided {
        wake: earliest(earliest(cooldown, applied.first_reason_due), reopen),
        waiting: left_waiting,
        planned,
        reclaims: applied.reclaims,
    }
}

/// What [`apply`] started.
struct Applied {
    /// Gate releases started.
    admitted: usize,
    /// Waiting reasons being written.
    waiting: usize,
    /// Owners to reclaim GPUs for, with their plans.
    reclaims: Vec<(Arc<Pod>, ReclaimPlan)>,
    /// When the next pod's first waiting reason is due.
    first_reason_due: Option<Timestamp>,
}

/// Starts the writes the decisions (and the pods the core could not read) call for: gate
/// releases and waiting reasons; reclaims are returned to be started.
fn apply(
    shared: &Shared,
    tasks: &mut JoinSet<()>,
    decisions: Vec<Decision>,
    unreadable_pods: Vec<(Arc<Pod>, String)>,
    waiting_since: &mut WaitingSince,
    now: Timestamp,
) -> Applied {
    let mut applied = Applied {
        admitted: 0,
        waiting: 0,
        reclaims: Vec::new(),
        first_reason_due: None,
    };
    let mut still_waiting = WaitingSince::default();
    let mut record = |tasks: &mut JoinSet<()>, applied: &mut Applied, pod: &Pod, line| {
        let since = waiting_since.since(&mut still_waiting, pod, now);
        match start_wait(shared, tasks, pod, line, since, now) {
            Recording::Started => applied.waiting += 1,
            Recording::Unchanged => {}
            Recording::After(at) => {
                applied.first_reason_due = earliest(applied.first_reason_due, Some(at));
            }
        }
    };
    for decision in decisions {
        let Some(pod) = stored_pod(&shared.context.stores, decision.key()) else {
            continue;
        };
        match decision {
            Decision::Admit(admission) => {
                applied.admitted +=
                    usize::from(start_admission(shared, tasks, &pod, admission, now));
            }
            Decision::Wait(wait) => {
                let line = WaitLine {
                    queue: wait.queue.clone(),
                    code: wait.reason.code(),
                    line: format!("{}: {}", wait.reason.code(), wait.reason),
                };
                record(tasks, &mut applied, &pod, line);
            }
            Decision::Reclaim(plan) => applied.reclaims.push((pod, plan)),
        }
    }
    for (pod, error) in unreadable_pods {
        let line = WaitLine {
            queue: None,
            code: "InvalidRequest",
            line: format!("InvalidRequest: {error}"),
        };
        record(tasks, &mut applied, &pod, line);
    }
    *waiting_since = still_waiting;
    applied
}

/// What became of starting one reclaim.
enum Begun {
    /// The owner is released (remembered as admitted); the rest runs in a task.
    Started(Box<Reservation>),
    /// Not started: the owner or a victim moved on (decided again on the next change), or
    /// the owner has a write in flight.
    Nothing,
    /// A write failed; the next pass decides again after [`RETRY_AFTER`].
    Failed,
}

/// Records the reclaim's intent and releases its owner (see [`Reclaimer::begin`]).
async fn begin_reclaim(
    shared: &Shared,
    stored: &Pod,
    plan: &ReclaimPlan,
    found: PassTiming,
) -> Begun {
    let context = &shared.context;
    {
        let assumed = shared.assumed();
        let in_flight = stored
            .metadata
            .uid
            .as_deref()
            .is_none_or(|uid| assumed.in_flight(uid));
        if in_flight || !is_gated(assumed.view(stored)) {
            return Begun::Nothing;
        }
    }
    match context
        .reclaimer
        .begin(&shared.term, plan, stored, found)
        .await
    {
        Ok(started) => {
            context
                .metrics
                .admission
                .decided(&plan.owner_queue, Outcome::Reclaim);
            tracing::info!(pod = %plan.owner_key, reclaim = %started.handover.id, "{plan}");
            Begun::Started(Box::new(started))
        }
        Err(error) if error.is_stale() => {
            tracing::debug!(%error, "reclaim not started; decided again on the next change");
            Begun::Nothing
        }
        Err(error) => {
            context.metrics.admission.apply_failed();
            tracing::warn!(%error, "starting a reclaim failed; retrying");
            Begun::Failed
        }
    }
}

/// Starts releasing the pod's gate on the chosen node, assuming it done at once. Returns
/// whether a write was started.
fn start_admission(
    shared: &Shared,
    tasks: &mut JoinSet<()>,
    stored: &Pod,
    admission: admission::Admission,
    now: Timestamp,
) -> bool {
    let Some(uid) = stored.metadata.uid.clone() else {
        return false;
    };
    let (pod, patch) = {
        let mut assumed = shared.assumed();
        let pod = assumed.view(stored).clone();
        if !is_gated(&pod) || assumed.in_flight(&uid) {
            return false;
        }
        let write = patch::Admission {
            node_pin: &admission.placement.pin,
            queue: &admission.queue,
            admitted_as: admission.admitted_as.as_str(),
            at: now,
        };
        let Ok(patch) = patch::admission_patch(&pod, &write) else {
            return false;
        };
        let Some(expected) = patch::applied_locally(&pod, &patch) else {
            return false;
        };
        assumed.begin(&uid);
        assumed.admitted(expected);
        (pod, patch)
    };
    let context = shared.context.clone();
    let assumed = shared.assumed.clone();
    shared.spawn(tasks, uid.clone(), async move {
        let api: Api<Pod> = Api::namespaced(context.client.clone(), &admission.key.namespace);
        match patch::send(&api, &pod, patch).await {
            Ok(patched) => {
                lock(&assumed).admitted(patched);
                admitted(&context, &pod, &admission, now);
                Written::Done
            }
            Err(error) => {
                lock(&assumed).forget_admission(&uid);
                write_failed(&context, &error)
            }
        }
    });
    true
}

/// Counts, logs and announces a released gate.
fn admitted(context: &Context, pod: &Pod, admission: &admission::Admission, now: Timestamp) {
    context
        .metrics
        .admission
        .decided(&admission.queue, Outcome::admitted(admission.admitted_as));
    if let Some(created) = &pod.metadata.creation_timestamp {
        let waited = now.duration_since(created.0);
        context
            .metrics
            .admission
            .admitted_after(waited.as_secs_f64());
    }
    tracing::info!(pod = %admission.key, queue = %admission.queue,
        node = %admission.placement.node_name, admitted_as = %admission.admitted_as, "admitted");
    announce_admitted(context, pod, admission, "");
}

/// The `Admitted` event on the pod; `how` ends its note.
fn announce_admitted(context: &Context, pod: &Pod, admission: &admission::Admission, how: &str) {
    context.events.send(
        pod.object_ref(&()),
        Notice {
            warning: false,
            reason: "Admitted",
            action: "Admit",
            note: format!(
                "queue {} admitted the pod ({}) on node {}{how}",
                admission.queue, admission.admitted_as, admission.placement.node_name
            ),
        },
    );
}

/// Announces a pod the webhook admitted at its creation, now that it exists.
fn admitted_at_creation(context: &Context, settled: &Settled) {
    let admission = &settled.reservation.admission;
    let pod = &settled.pod;
    tracing::info!(pod = %format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or_default(), pod.metadata.name.as_deref().unwrap_or_default()),
        queue = %admission.queue, node = %admission.placement.node_name, "admitted at creation seen");
    announce_admitted(context, pod, admission, " at its creation");
}

/// What a pass leaves to the next (this term's only).
#[derive(Debug, Default)]
struct Carried {
    waiting_since: WaitingSince,
    pod_models: PodModels,
}

/// When this process first saw each waiting pod wait (by uid), kept from pass to pass for the
/// pods that still wait.
#[derive(Debug, Default)]
struct WaitingSince(HashMap<String, Timestamp>);

impl WaitingSince {
    /// When the pod began to wait: as the last pass recorded, or `now` for a pod seen waiting
    /// first. `next` collects the record for the next pass, so pods no longer seen waiting are
    /// forgotten.
    fn since(&self, next: &mut Self, pod: &Pod, now: Timestamp) -> Timestamp {
        let Some(uid) = pod.metadata.uid.clone() else {
            return now;
        };
        let since = self.0.get(&uid).copied().unwrap_or(now);
        next.0.insert(uid, since);
        since
    }
}

/// What this process knows of a pod's recorded waiting reason.
#[derive(Debug, Clone, Copy)]
struct Known<'a> {
    reason: Option<&'a str>,
    written_at: Option<Timestamp>,
    /// When this process first saw the pod wait.
    waiting_since: Timestamp,
    now: Timestamp,
}

/// Whether a waiting reason is to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    Now,
    Not,
    /// At this time, if the pod still waits then.
    At(Timestamp),
}

impl Known<'_> {
    /// Whether `line` (with cause `code`) should replace the recorded reason: a first reason
    /// once the pod has waited [`FIRST_REASON_AFTER`]; then always when the cause changed, and
    /// for new numbers only once the recorded line is [`REASON_REFRESH`] old.
    fn due(&self, code: &str, line: &str) -> Due {
        let Some(reason) = self.reason else {
            let at = self.waiting_since + FIRST_REASON_AFTER;
            return if self.now < at { Due::At(at) } else { Due::Now };
        };
        if reason == line {
            return Due::Not;
        }
        let fresh = self
            .written_at
            .is_some_and(|at| self.now.duration_since(at) < REASON_REFRESH);
        if self.cause_changed(code) || !fresh {
            Due::Now
        } else {
            Due::Not
        }
    }

    /// Whether the recorded cause differs from `code` (then an event is due).
    fn cause_changed(&self, code: &str) -> bool {
        self.reason
            .and_then(|reason| reason.split_once(": "))
            .map(|(cause, _)| cause)
            != Some(code)
    }
}

/// A waiting reason to record: `<code>: <text>`.
#[derive(Debug)]
struct WaitLine {
    queue: Option<String>,
    code: &'static str,
    line: String,
}

/// What [`start_wait`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recording {
    Started,
    Unchanged,
    /// Nothing yet: the reason is due then.
    After(Timestamp),
}

/// Starts recording why the pod waits (it has since `waiting_since`), when [`Known::due`] says
/// so; an event follows when the cause changed.
fn start_wait(
    shared: &Shared,
    tasks: &mut JoinSet<()>,
    stored: &Pod,
    wait: WaitLine,
    waiting_since: Timestamp,
    now: Timestamp,
) -> Recording {
    let Some(uid) = stored.metadata.uid.clone() else {
        return Recording::Unchanged;
    };
    let (pod, cause_changed) = {
        let mut assumed = shared.assumed();
        let pod = assumed.view(stored);
        if !is_gated(pod) {
            return Recording::Unchanged;
        }
        let known = Known {
            reason: assumed.waiting_reason(stored),
            written_at: assumed.reason_written_at(stored),
            waiting_since,
            now,
        };
        match known.due(wait.code, &wait.line) {
            Due::Now => {}
            Due::Not => return Recording::Unchanged,
            Due::At(at) => return Recording::After(at),
        }
        let cause_changed = known.cause_changed(wait.code);
        let pod = pod.clone();
        if !assumed.begin(&uid) {
            return Recording::Unchanged;
        }
        assumed.reason_recorded(&uid, Some(wait.line.clone()), now);
        (pod, cause_changed)
    };
    let context = shared.context.clone();
    let assumed = shared.assumed.clone();
    shared.spawn(tasks, uid.clone(), async move {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(context.client.clone(), &namespace);
        match patch::set_waiting_reason(&api, &pod, Some(&wait.line)).await {
            Ok(_) => {
                if cause_changed {
                    waits(&context, &pod, &wait);
                }
                Written::Done
            }
            Err(error) => {
                lock(&assumed).forget_reason(&uid);
                write_failed(&context, &error)
            }
        }
    });
    Recording::Started
}

/// Counts, logs and announces a new cause of waiting.
fn waits(context: &Context, pod: &Pod, wait: &WaitLine) {
    context
        .metrics
        .admission
        .decided(wait.queue.as_deref().unwrap_or_default(), Outcome::Wait);
    tracing::info!(pod = %patch::describe(pod), reason = %wait.line, "waiting");
    let note = wait
        .line
        .split_once(": ")
        .map_or_else(|| wait.line.clone(), |(_, text)| text.to_owned());
    context.events.send(
        pod.object_ref(&()),
        Notice {
            warning: matches!(
                wait.code,
                "InvalidRequest" | "NamespaceConflict" | "NoQuota" | "NoQueue"
            ),
            reason: wait.code,
            action: "Wait",
            note,
        },
    );
}

fn write_failed(context: &Context, error: &PatchError) -> Written {
    if error.is_stale() {
        tracing::debug!(%error, "pod moved on; decided again");
        Written::Stale
    } else {
        context.metrics.admission.apply_failed();
        tracing::warn!(%error, "write failed; retrying");
        Written::Failed
    }
}

fn lock(assumed: &Mutex<Assumed>) -> MutexGuard<'_, Assumed> {
    crate::sync::lock(assumed)
}

/// Starts writing the queues' status where it changed (events for quota edits and condition
/// changes follow each write), and publishes the queue gauges. Returns how many writes started.
fn start_reports(
    shared: &Shared,
    tasks: &mut JoinSet<()>,
    reports: &[QueueReport],
    invalid: &[InvalidQueue],
    now: Timestamp,
) -> usize {
    let context = &shared.context;
    let stored: Vec<Arc<GpuQueue>> = context
        .stores
        .queues
        .state()
        .iter()
        .filter_map(|guarded| guarded.0.as_ref().ok().map(|queue| Arc::new(queue.clone())))
        .collect();
    let find = |name: &str| {
        stored
            .iter()
            .find(|q| q.metadata.name.as_deref() == Some(name))
    };
    let mut desired = Vec::new();
    let mut rows = Vec::new();
    {
        let mut assumed = shared.assumed();
        assumed.settle_queues(stored.iter().map(AsRef::as_ref));
        for report in reports {
            let Some(queue) = find(&report.queue) else {
                continue;
            };
            let previous = assumed.status(queue).cloned();
            let status = report.to_status(now, previous.as_ref());
            rows.push(QueueRow {
                queue: report.queue.clone(),
                resources: status.resources.clone(),
                admitted_pods: i64::from(status.admitted_pods),
                pending_pods: i64::from(status.pending_pods),
            });
            desired.push((queue.clone(), previous, status));
        }
        for queue in invalid {
            let Some(stored_queue) = find(&queue.name) else {
                continue;
            };
            let previous = assumed.status(stored_queue).cloned();
            let status =
                invalid_spec_status(&queue.error, queue.generation, now, previous.as_ref());
            desired.push((stored_queue.clone(), previous, status));
        }
    }
    context.metrics.queues.publish(rows);
    let mut started = 0;
    for (queue, previous, status) in desired {
        let Some(uid) = queue.metadata.uid.clone() else {
            continue;
        };
        {
            let mut assumed = shared.assumed();
            if !status::needs_write(previous.as_ref(), &status) || !assumed.begin(&uid) {
                continue;
            }
            assumed.status_written(&uid, status.clone());
        }
        started += 1;
        let context = context.clone();
        let assumed = shared.assumed.clone();
        shared.spawn(tasks, uid.clone(), async move {
            let api: Api<GpuQueue> = Api::all(context.client.clone());
            let name = queue.metadata.name.clone().unwrap_or_default();
            match status::write(&api, &name, &status).await {
                Ok(()) => {
                    announce_changes(&context.events, &queue, previous.as_ref(), &status);
                    Written::Done
                }
                Err(error) => {
                    lock(&assumed).forget_status(&uid);
                    tracing::warn!(%error, "status write failed; retrying");
                    context.metrics.admission.apply_failed();
                    Written::Failed
                }
            }
        });
    }
    started
}

/// Events on a queue for what changed since its last status: quota edits (guaranteed or
/// ceiling of a resource), and conditions that changed status or reason.
fn announce_changes(
    events: &Events,
    queue: &GpuQueue,
    previous: Option<&GpuQueueStatus>,
    next: &GpuQueueStatus,
) {
    let Some(previous) = previous else { return };
    let regarding = queue.object_ref(&());
    let mut edits = Vec::new();
    for resource in &next.resources {
        let Some(old) = previous.resources.iter().find(|r| r.name == resource.name) else {
            continue;
        };
        if old.guaranteed != resource.guaranteed || old.ceiling != resource.ceiling {
            edits.push(format!(
                "{}: guaranteed {} → {}, ceiling {} → {}",
                resource.name, old.guaranteed, resource.guaranteed, old.ceiling, resource.ceiling
            ));
        }
    }
    if !edits.is_empty() {
        events.send(
            regarding.clone(),
            Notice {
                warning: false,
                reason: "QuotaChanged",
                action: "Reconcile",
                note: edits.join("; "),
            },
        );
    }
    for condition in &next.conditions {
        let before = previous
            .conditions
            .iter()
            .find(|c| c.type_ == condition.type_);
        let changed =
            before.is_none_or(|b| b.status != condition.status || b.reason != condition.reason);
        if changed && before.is_some() {
            let bad = match condition.type_.as_str() {
                types::READY => condition.status == "False",
                types::OVERCOMMITTED | types::NAMESPACE_CONFLICT => condition.status == "True",
                _ => false,
            };
            events.send(
                regarding.clone(),
                Notice {
                    warning: bad,
                    reason: condition_reason(&condition.reason),
                    action: "Reconcile",
                    note: format!(
                        "{} is {}: {}",
                        condition.type_, condition.status, condition.message
                    ),
                },
            );
        }
    }
}

/// The condition reasons the API defines, as the `'static` strings events take.
fn condition_reason(reason: &str) -> &'static str {
    use gpuqueue_api::conditions::reasons;
    [
        reasons::ADMITTING,
        reasons::INVALID_SPEC,
        reasons::NAMESPACE_CONFLICT,
        reasons::NO_CONFLICT,
        reasons::GUARANTEES_EXCEED_CAPACITY,
        reasons::GUARANTEES_FIT,
        reasons::HANDOVER_IN_PROGRESS,
        reasons::IDLE,
    ]
    .into_iter()
    .find(|known| *known == reason)
    .unwrap_or("ConditionChanged")
}

fn publish_fragmentation(context: &Context, snapshot: &Snapshot) {
    let cluster = snapshot.fragmentation();
    let nodes = snapshot
        .node_ids()
        .map(|id| {
            (
                snapshot.node(id).name.clone(),
                snapshot.node_fragmentation(id) / 1000.0,
            )
        })
        .collect();
    context.metrics.fragmentation.publish(FragmentationReport {
        cluster_gpus: cluster.fragmented_milli / 1000.0,
        share_of_capacity: cluster.share_of_capacity(),
        share_of_idle: cluster.share_of_idle(),
        nodes,
    });
}

/// When each queue was last reclaimed from, from the reclaim records in its status.
fn last_reclaims(stores: &Stores) -> Vec<(String, Timestamp)> {
    let mut last: HashMap<String, Timestamp> = HashMap::new();
    for stored in stores.queues.state() {
        let Ok(queue) = &stored.0 else { continue };
        let Some(status) = &queue.status else {
            continue;
        };
        for record in status.last_handovers.iter().filter(|r| r.role == "victim") {
            if let Some(at) = &record.started_at {
                let entry = last
                    .entry(queue.metadata.name.clone().unwrap_or_default())
                    .or_insert(at.0);
                *entry = (*entry).max(at.0);
            }
        }
    }
    last.into_iter().collect()
}

/// The earliest time a waiting pod's cause expires by itself (a borrowing cool-down).
fn earliest_cooldown(decisions: &[Decision]) -> Option<Timestamp> {
    decisions
        .iter()
        .filter_map(|decision| match decision {
            Decision::Wait(wait) => match &wait.reason {
                WaitReason::BorrowCooldown { until, .. } => Some(*until),
                _ => None,
            },
            _ => None,
        })
        .min()
}

fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn stored_pod(stores: &Stores, key: &PodKey) -> Option<Arc<Pod>> {
    stores
        .pods
        .get(&ObjectRef::new(&key.name).within(&key.namespace))
}

#[cfg(test)]
mod tests {
    use gpuqueue_api::v1alpha1::ResourceStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;

    fn queue() -> GpuQueue {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "batch", "uid": "q-uid"},
            "spec": {"namespaces": ["batch"], "resources": [{"name": "nvidia.com/gpu", "guaranteed": 8}]},
        }))
        .unwrap()
    }

    fn status(guaranteed: i64, conflict: &str) -> GpuQueueStatus {
        GpuQueueStatus {
            resources: vec![ResourceStatus {
                name: "nvidia.com/gpu".into(),
                guaranteed,
                ceiling: guaranteed + 16,
                ..ResourceStatus::default()
            }],
            conditions: vec![Condition {
                type_: types::NAMESPACE_CONFLICT.into(),
                status: conflict.into(),
                reason: if conflict == "True" {
                    "NamespaceConflict"
                } else {
                    "NoConflict"
                }
                .into(),
                message: "namespace batch is also claimed by queue labs".into(),
                observed_generation: Some(1),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            }],
            ..GpuQueueStatus::default()
        }
    }

    fn drain(
        receiver: &mut tokio::sync::mpsc::Receiver<(
            k8s_openapi::api::core::v1::ObjectReference,
            Notice,
        )>,
    ) -> Vec<Notice> {
        let mut notices = Vec::new();
        while let Ok((regarding, notice)) = receiver.try_recv() {
            assert_eq!(regarding.name.as_deref(), Some("batch"));
            assert_eq!(regarding.kind.as_deref(), Some("GpuQueue"));
            notices.push(notice);
        }
        notices
    }

    #[test]
    fn a_quota_edit_is_announced_with_the_old_and_new_numbers() {
        let (events, mut receiver) = Events::captured();
        announce_changes(
            &events,
            &queue(),
            Some(&status(8, "False")),
            &status(12, "False"),
        );
        let notices = drain(&mut receiver);
        assert_eq!(notices.len(), 1);
        assert_eq!(notices[0].reason, "QuotaChanged");
        assert_eq!(
            notices[0].note,
            "nvidia.com/gpu: guaranteed 8 → 12, ceiling 24 → 28"
        );
    }

    #[test]
    fn a_condition_that_turns_bad_is_a_warning() {
        let (events, mut receiver) = Events::captured();
        announce_changes(
            &events,
            &queue(),
            Some(&status(8, "False")),
            &status(8, "True"),
        );
        let notices = drain(&mut receiver);
        assert_eq!(notices.len(), 1);
        assert!(notices[0].warning);
        assert_eq!(notices[0].reason, "NamespaceConflict");
        assert!(
            notices[0]
                .note
                .starts_with("NamespaceConflict is True: namespace batch")
        );
    }

    #[test]
    fn nothing_is_announced_without_a_change_or_a_previous_status() {
        let (events, mut receiver) = Events::captured();
        announce_changes(
            &events,
            &queue(),
            Some(&status(8, "False")),
            &status(8, "False"),
        );
        announce_changes(&events, &queue(), None, &status(8, "True"));
        assert!(drain(&mut receiver).is_empty());
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_waiting_reason_is_rewritten_when_its_cause_changes_and_refreshed_when_stale() {
        let recorded = "NoRoom: queue team: ... (the most free on one suitable node is 2)";
        let known = |written: &str, now: &str| Known {
            reason: Some(recorded),
            written_at: Some(at(written)),
            waiting_since: at("2026-01-01T00:00:00Z"),
            now: at(now),
        };
        let fresh = known("2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z");
        let stale = known("2026-01-01T00:00:00Z", "2026-01-01T00:00:31Z");
        let new_numbers = "NoRoom: queue team: ... (the most free on one suitable node is 1)";
        assert_eq!(fresh.due("NoRoom", recorded), Due::Not, "unchanged");
        assert_eq!(
            fresh.due("NoRoom", new_numbers),
            Due::Not,
            "same cause, recent: not yet"
        );
        assert_eq!(
            stale.due("NoRoom", new_numbers),
            Due::Now,
            "same cause, stale: refreshed"
        );
        assert_eq!(
            fresh.due("OverCeiling", "OverCeiling: queue team: ..."),
            Due::Now,
            "new cause"
        );
        assert!(fresh.cause_changed("OverCeiling") && !fresh.cause_changed("NoRoom"));
        // Written before this process started: unknown age, so refreshed.
        let inherited = Known {
            reason: Some(recorded),
            written_at: None,
            waiting_since: at("2026-01-01T00:00:00Z"),
            now: at("2026-01-01T00:00:00Z"),
        };
        assert_eq!(inherited.due("NoRoom", new_numbers), Due::Now);
    }

    #[test]
    fn a_first_reason_is_written_once_the_pod_has_waited_a_second() {
        let recorded = "NoRoom: queue team: ...";
        let first = |now: &str| Known {
            reason: None,
            written_at: None,
            waiting_since: at("2026-01-01T00:00:00Z"),
            now: at(now),
        };
        assert_eq!(
            first("2026-01-01T00:00:00.300Z").due("NoRoom", recorded),
            Due::At(at("2026-01-01T00:00:01Z")),
            "a pod admitted within the second never gets one"
        );
        assert_eq!(
            first("2026-01-01T00:00:01Z").due("NoRoom", recorded),
            Due::Now
        );
        assert!(first("2026-01-01T00:00:01Z").cause_changed("NoRoom"));
    }

    #[test]
    fn a_pod_keeps_its_waiting_time_while_it_waits_and_loses_it_when_it_stops() {
        let pod = |uid: &str| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": uid, "uid": uid}}))
                .unwrap()
        };
        let (first, second, third) = (
            at("2026-01-01T00:00:00Z"),
            at("2026-01-01T00:00:00.500Z"),
            at("2026-01-01T00:00:01Z"),
        );
        let mut record = WaitingSince::default();
        let mut next = WaitingSince::default();
        assert_eq!(record.since(&mut next, &pod("a"), first), first);
        record = next;
        let mut next = WaitingSince::default();
        assert_eq!(
            record.since(&mut next, &pod("a"), second),
            first,
            "still waiting"
        );
        assert_eq!(record.since(&mut next, &pod("b"), second), second, "new");
        record = next;
        // "a" was admitted: not seen waiting in this pass, so forgotten.
        let mut next = WaitingSince::default();
        assert_eq!(record.since(&mut next, &pod("b"), third), second);
        record = next;
        let mut next = WaitingSince::default();
        assert_eq!(
            record.since(&mut next, &pod("a"), third),
            third,
            "waits again: anew"
        );
    }

    #[test]
    fn unknown_condition_reasons_map_to_a_generic_one() {
        assert_eq!(
            condition_reason("GuaranteesExceedCapacity"),
            "GuaranteesExceedCapacity"
        );
        assert_eq!(condition_reason("SomethingNew"), "ConditionChanged");
    }
}
