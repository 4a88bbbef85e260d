//! The admission loop: the leader's work. Each pass is a short pipeline, run when the stores
//! change (debounced) and never on a timer unless a decision names a time:
//!
//! 1. **observe**: read the stores into the core's model (pods seen through [`Assumed`]).
//! 2. **decide**: `gpuqueue_core::admission::admission_cycle` orders the waiting pods fairly and
//!    decides each: admit (node and quota), reclaim, or wait with a reason.
//! 3. **apply**: release the gate on the chosen node (JSON patch that tests the gate), or
//!    record why the pod waits (annotation, and an event when the cause changes).
//! 4. **report**: queue status by server-side apply when it changed, events for quota edits and
//!    condition changes, and the queue and fragmentation gauges.
//!
//! Nothing is written unless this replica's leadership [`Term`] is current at that moment, and
//! nothing runs before every store has synced (fail closed).
//!
//! A `Reclaim` decision is reported as a wait naming the plan (its victims and node): taking
//! GPUs back (checkpoint, evict, hand over) belongs to the reclaim executor, which runs on the
//! decisions this loop computes.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::{StreamExt, stream};
use gpuqueue_api::{
    ADMISSION_GATE,
    conditions::types,
    v1alpha1::{GpuQueue, GpuQueueStatus},
};
use gpuqueue_core::{
    Snapshot,
    admission::{self, Decision, WaitReason},
    fragmentation::{DEFAULT_POPULARITY, TaskShape, WorkloadMix},
    model::{AdmittedAs, PodKey},
    placement::{FragmentationAware, TieBreak},
    reclaim::ReclaimPlan,
    status::{QueueReport, invalid_spec_status, queue_reports},
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, Resource, runtime::reflector::ObjectRef};

use crate::{
    assumed::Assumed,
    clock,
    debounce::Debounce,
    events::{Events, Notice},
    leader::Term,
    metrics::{FragmentationReport, Metrics, Outcome, QueueRow},
    observe::{InvalidQueue, Observed},
    patch::{self, PatchError},
    status,
    stores::Stores,
};

/// API writes of one pass in flight at once: enough to admit a burst of pods quickly, well
/// under the API server's default limit of 200 concurrent mutating requests.
const WRITE_CONCURRENCY: usize = 32;

/// A waiting pod's reason is rewritten at once when its cause changes, but when only its
/// numbers change (capacity filling up around it), at most this often: a burst of pods that do
/// not fit must not cost one write per pod per pass.
const REASON_REFRESH: SignedDuration = SignedDuration::from_secs(30);

/// After a write failed for a reason other than the pod moving on (which brings its own watch
/// event), the next pass runs this much later.
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// What the loop needs; cheap to clone.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub stores: Stores,
    pub metrics: Metrics,
    pub events: Events,
    pub debounce: Debounce,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("stores", &self.stores)
            .field("debounce", &self.debounce)
            .finish_non_exhaustive()
    }
}

/// Runs passes for as long as `term` lasts (the caller aborts this future when it ends).
pub async fn run(context: Context, term: Term) {
    if context.stores.synced().await.is_err() {
        return;
    }
    tracing::info!(term = term.number(), "admission loop started");
    let mut changes = context.stores.changes();
    changes.borrow_and_update();
    let mut assumed = Assumed::default();
    loop {
        let wake = run_pass(&context, &term, &mut assumed).await;
        let timer = async {
            match wake.and_then(|at| Duration::try_from(at.duration_since(clock::now())).ok()) {
                Some(wait) => tokio::time::sleep(wait).await,
                None if wake.is_some() => {}
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            more = context.debounce.next_burst(&mut changes) => if !more { return },
            () = timer => {}
        }
    }
}

/// A write to one pod, with what it needs from this pass (owned, so writes can run at once).
struct Write {
    /// The pod as this process knows it (the store's, or the admitted version it lags behind).
    pod: Pod,
    /// The waiting reason the pod carries, as far as this process knows.
    known_reason: Option<String>,
    /// When this process last wrote that reason.
    reason_written_at: Option<Timestamp>,
    task: Task,
}

enum Task {
    Decide(Decision),
    /// A GPU pod the core cannot model, with why.
    Unreadable(String),
}

impl Write {
    fn new(assumed: &Assumed, stored: &Pod, task: Task) -> Self {
        Self {
            pod: assumed.view(stored).clone(),
            known_reason: assumed.waiting_reason(stored).map(str::to_owned),
            reason_written_at: assumed.reason_written_at(stored),
            task,
        }
    }

    async fn apply(self, context: &Context, term: &Term, now: Timestamp) -> Applied {
        let known = Known {
            reason: self.known_reason.as_deref(),
            written_at: self.reason_written_at,
            now,
        };
        match &self.task {
            Task::Decide(decision) => apply(context, term, &self.pod, known, decision).await,
            Task::Unreadable(error) => {
                let line = format!("InvalidRequest: {error}");
                let wait = WaitLine {
                    queue: None,
                    code: "InvalidRequest",
                    line,
                };
                record_wait(context, term, &self.pod, known, wait).await
            }
        }
    }
}

/// What this process knows of a pod's recorded waiting reason.
#[derive(Debug, Clone, Copy)]
struct Known<'a> {
    reason: Option<&'a str>,
    written_at: Option<Timestamp>,
    now: Timestamp,
}

impl Known<'_> {
    /// Whether `line` (with cause `code`) should replace the recorded reason: always when the
    /// cause changed, and for new numbers only once the recorded line is [`REASON_REFRESH`]
    /// old.
    fn needs_update(&self, code: &str, line: &str) -> bool {
        let Some(reason) = self.reason else {
            return true;
        };
        if reason == line {
            return false;
        }
        let fresh = self
            .written_at
            .is_some_and(|at| self.now.duration_since(at) < REASON_REFRESH);
        self.cause_changed(code) || !fresh
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
struct WaitLine<'a> {
    queue: Option<&'a str>,
    code: &'static str,
    line: String,
}

/// What one write achieved.
enum Applied {
    Admitted { pod: Box<Pod> },
    ReasonRecorded { uid: String, reason: Option<String> },
    Nothing,
    Failed,
}

/// One pass; returns when the next pass must run even without a change.
async fn run_pass(context: &Context, term: &Term, assumed: &mut Assumed) -> Option<Timestamp> {
    let started = tokio::time::Instant::now();
    let now = clock::now();
    let stored_pods = context.stores.pods.state();
    assumed.settle(stored_pods.iter().map(AsRef::as_ref));

    // 1. observe
    let observed = Observed::read(&context.stores, assumed);
    for problem in &observed.problems {
        tracing::debug!(%problem, "object left out of the snapshot");
    }
    let mix = WorkloadMix::from_shapes(
        observed.pods.iter().map(TaskShape::of_pod),
        DEFAULT_POPULARITY,
    );
    let reclaimed = last_reclaims(&context.stores);
    let mut builder = Snapshot::builder()
        .queues(observed.queues)
        .namespaces(observed.namespaces)
        .nodes(observed.nodes)
        .pods(observed.pods)
        .workload_mix(mix);
    for (queue, at) in reclaimed {
        builder = builder.reclaimed_from(queue, at);
    }
    let (mut snapshot, issues) = builder.build();
    for issue in &issues {
        tracing::debug!(%issue, "snapshot left an object out");
    }

    // 2. decide
    let decisions =
        admission::admission_cycle(&mut snapshot, &FragmentationAware, TieBreak::First, now);

    // 3. apply
    let mut wake = earliest_cooldown(&decisions);
    let mut writes = Vec::new();
    for decision in decisions {
        let Some(pod) = stored_pod(&context.stores, decision.key()) else {
            continue;
        };
        writes.push(Write::new(assumed, &pod, Task::Decide(decision)));
    }
    for (pod, error) in observed.unreadable_pods {
        if is_gated(&pod) {
            writes.push(Write::new(assumed, &pod, Task::Unreadable(error)));
        }
    }
    let pending: Vec<_> = writes
        .into_iter()
        .map(|write| write.apply(context, term, now))
        .collect();
    let applied: Vec<Applied> = stream::iter(pending)
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    for outcome in applied {
        match outcome {
            Applied::Admitted { pod } => assumed.admitted(*pod),
            Applied::ReasonRecorded { uid, reason } => assumed.reason_recorded(&uid, reason, now),
            Applied::Failed => {
                wake = earliest(
                    wake,
                    Some(now + SignedDuration::try_from(RETRY_AFTER).unwrap_or_default()),
                );
            }
            Applied::Nothing => {}
        }
    }

    // 4. report
    let status_time = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let reports = queue_reports(&snapshot);
    let failed = report(
        context,
        term,
        assumed,
        &reports,
        &observed.invalid_queues,
        status_time,
    )
    .await;
    if failed {
        wake = earliest(
            wake,
            Some(now + SignedDuration::try_from(RETRY_AFTER).unwrap_or_default()),
        );
    }
    publish_fragmentation(context, &snapshot);
    context
        .metrics
        .admission
        .pass_took(started.elapsed().as_secs_f64());
    wake
}

/// Applies one decision to its pod.
async fn apply(
    context: &Context,
    term: &Term,
    pod: &Pod,
    known: Known<'_>,
    decision: &Decision,
) -> Applied {
    match decision {
        Decision::Admit(admission) => admit(context, term, pod, admission, known.now).await,
        Decision::Wait(wait) => {
            let line = WaitLine {
                queue: wait.queue.as_deref(),
                code: wait.reason.code(),
                line: format!("{}: {}", wait.reason.code(), wait.reason),
            };
            record_wait(context, term, pod, known, line).await
        }
        Decision::Reclaim(plan) => {
            let line = WaitLine {
                queue: Some(&plan.owner_queue),
                code: "ReclaimNeeded",
                line: format!("ReclaimNeeded: {}", describe_plan(plan)),
            };
            record_wait(context, term, pod, known, line).await
        }
    }
}

/// Pins the pod to the chosen node and releases its gate.
async fn admit(
    context: &Context,
    term: &Term,
    pod: &Pod,
    admission: &admission::Admission,
    now: Timestamp,
) -> Applied {
    if !is_gated(pod) || !term.is_current() {
        return Applied::Nothing;
    }
    let api: Api<Pod> = Api::namespaced(context.client.clone(), &admission.key.namespace);
    let write = patch::Admission {
        node_pin: &admission.placement.pin,
        queue: &admission.queue,
        admitted_as: admission.admitted_as.as_str(),
        at: now,
    };
    match patch::admit(&api, pod, &write).await {
        Ok(patched) => {
            let outcome = match admission.admitted_as {
                AdmittedAs::Guaranteed => Outcome::AdmittedGuaranteed,
                AdmittedAs::Borrowed => Outcome::AdmittedBorrowed,
            };
            context.metrics.admission.decided(&admission.queue, outcome);
            if let Some(created) = &pod.metadata.creation_timestamp {
                let waited = now.duration_since(created.0);
                context
                    .metrics
                    .admission
                    .admitted_after(waited.as_secs_f64());
            }
            tracing::info!(pod = %admission.key, queue = %admission.queue,
                node = %admission.placement.node_name, admitted_as = %admission.admitted_as, "admitted");
            context.events.send(
                pod.object_ref(&()),
                Notice {
                    warning: false,
                    reason: "Admitted",
                    action: "Admit",
                    note: format!(
                        "queue {} admitted the pod ({}) on node {}",
                        admission.queue, admission.admitted_as, admission.placement.node_name
                    ),
                },
            );
            Applied::Admitted {
                pod: Box::new(patched),
            }
        }
        Err(error) => write_failed(context, &error),
    }
}

/// Records why `pod` waits when [`Known::needs_update`] says so; publishes an event when the
/// cause changed.
async fn record_wait(
    context: &Context,
    term: &Term,
    pod: &Pod,
    known: Known<'_>,
    wait: WaitLine<'_>,
) -> Applied {
    if !is_gated(pod) || !known.needs_update(wait.code, &wait.line) || !term.is_current() {
        return Applied::Nothing;
    }
    let Some(uid) = pod.metadata.uid.clone() else {
        return Applied::Nothing;
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let api: Api<Pod> = Api::namespaced(context.client.clone(), namespace);
    match patch::set_waiting_reason(&api, pod, Some(&wait.line)).await {
        Ok(_) => {
            if known.cause_changed(wait.code) {
                let outcome = if wait.code == "ReclaimNeeded" {
                    Outcome::Reclaim
                } else {
                    Outcome::Wait
                };
                context
                    .metrics
                    .admission
                    .decided(wait.queue.unwrap_or_default(), outcome);
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
            Applied::ReasonRecorded {
                uid,
                reason: Some(wait.line),
            }
        }
        Err(error) => write_failed(context, &error),
    }
}

fn write_failed(context: &Context, error: &PatchError) -> Applied {
    if error.is_stale() {
        tracing::debug!(%error, "pod moved on; decided again on its next change");
        Applied::Nothing
    } else {
        context.metrics.admission.apply_failed();
        tracing::warn!(%error, "write failed; retrying");
        Applied::Failed
    }
}

/// Writes the queues' status where it changed, publishes events for quota edits and condition
/// changes, and the queue gauges. Returns whether a write failed.
async fn report(
    context: &Context,
    term: &Term,
    assumed: &mut Assumed,
    reports: &[QueueReport],
    invalid: &[InvalidQueue],
    now: Timestamp,
) -> bool {
    let stored: Vec<Arc<GpuQueue>> = context
        .stores
        .queues
        .state()
        .iter()
        .filter_map(|guarded| guarded.0.as_ref().ok().map(|queue| Arc::new(queue.clone())))
        .collect();
    assumed.settle_queues(stored.iter().map(AsRef::as_ref));
    let find = |name: &str| {
        stored
            .iter()
            .find(|q| q.metadata.name.as_deref() == Some(name))
    };
    let mut writes = Vec::new();
    let mut rows = Vec::new();
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
        writes.push((queue.clone(), previous, status));
    }
    context.metrics.queues.publish(rows);
    for invalid in invalid {
        let Some(queue) = find(&invalid.name) else {
            continue;
        };
        let previous = assumed.status(queue).cloned();
        let status =
            invalid_spec_status(&invalid.error, invalid.generation, now, previous.as_ref());
        writes.push((queue.clone(), previous, status));
    }
    let api: Api<GpuQueue> = Api::all(context.client.clone());
    let pending: Vec<_> = writes
        .into_iter()
        .filter(|(_, previous, status)| status::needs_write(previous.as_ref(), status))
        .map(|(queue, previous, status)| write_status(context, term, &api, queue, previous, status))
        .collect();
    let results: Vec<StatusWrite> = stream::iter(pending)
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    let mut failed = false;
    for result in results {
        match result {
            StatusWrite::Written { uid, status } => assumed.status_written(&uid, *status),
            StatusWrite::Failed => failed = true,
            StatusWrite::NotLeader => {}
        }
    }
    failed
}

/// What became of one status write.
enum StatusWrite {
    Written {
        uid: String,
        status: Box<GpuQueueStatus>,
    },
    Failed,
    NotLeader,
}

/// Writes one queue's changed status and announces what changed.
async fn write_status(
    context: &Context,
    term: &Term,
    api: &Api<GpuQueue>,
    queue: Arc<GpuQueue>,
    previous: Option<GpuQueueStatus>,
    status: GpuQueueStatus,
) -> StatusWrite {
    if !term.is_current() {
        return StatusWrite::NotLeader;
    }
    let name = queue.metadata.name.clone().unwrap_or_default();
    match status::write(api, &name, &status).await {
        Ok(()) => {
            announce_changes(&context.events, &queue, previous.as_ref(), &status);
            let uid = queue.metadata.uid.clone().unwrap_or_default();
            StatusWrite::Written {
                uid,
                status: Box::new(status),
            }
        }
        Err(error) => {
            tracing::warn!(%error, "status write failed; retrying");
            context.metrics.admission.apply_failed();
            StatusWrite::Failed
        }
    }
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

fn describe_plan(plan: &ReclaimPlan) -> String {
    let victims: Vec<String> = plan.victims.iter().map(|v| v.key.to_string()).collect();
    format!(
        "queue {} is within its guarantee, but borrowers hold the room: evicting {} on node {} frees it",
        plan.owner_queue,
        victims.join(", "),
        plan.node_name
    )
}

fn stored_pod(stores: &Stores, key: &PodKey) -> Option<Arc<Pod>> {
    stores
        .pods
        .get(&ObjectRef::new(&key.name).within(&key.namespace))
}

fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.scheduling_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|gate| gate.name == ADMISSION_GATE))
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

    #[test]
    fn a_waiting_reason_is_rewritten_when_its_cause_changes_and_refreshed_when_stale() {
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let recorded = "NoRoom: queue team: ... (the most free on one suitable node is 2)";
        let known = |written: &str, now: &str| Known {
            reason: Some(recorded),
            written_at: Some(at(written)),
            now: at(now),
        };
        let fresh = known("2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z");
        let stale = known("2026-01-01T00:00:00Z", "2026-01-01T00:00:31Z");
        let new_numbers = "NoRoom: queue team: ... (the most free on one suitable node is 1)";
        assert!(!fresh.needs_update("NoRoom", recorded), "unchanged");
        assert!(
            !fresh.needs_update("NoRoom", new_numbers),
            "same cause, recent: not yet"
        );
        assert!(
            stale.needs_update("NoRoom", new_numbers),
            "same cause, stale: refreshed"
        );
        assert!(
            fresh.needs_update("OverCeiling", "OverCeiling: queue team: ..."),
            "new cause"
        );
        assert!(fresh.cause_changed("OverCeiling") && !fresh.cause_changed("NoRoom"));
        // Written before this process started: unknown age, so refreshed.
        let inherited = Known {
            reason: Some(recorded),
            written_at: None,
            now: at("2026-01-01T00:00:00Z"),
        };
        assert!(inherited.needs_update("NoRoom", new_numbers));
        let first = Known {
            reason: None,
            written_at: None,
            now: at("2026-01-01T00:00:00Z"),
        };
        assert!(first.needs_update("NoRoom", recorded) && first.cause_changed("NoRoom"));
    }

    #[test]
    fn unknown_condition_reasons_map_to_a_generic_one() {
        assert_eq!(
            condition_reason("GuaranteesExceedCapacity"),
            "GuaranteesExceedCapacity"
        );
        assert_eq!(condition_reason("SomethingNew"), "ConditionChanged");
    }

    #[test]
    fn the_next_timed_wake_is_the_earliest() {
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        assert_eq!(
            earliest(
                Some(at("2026-01-01T00:00:05Z")),
                Some(at("2026-01-01T00:00:01Z"))
            ),
            Some(at("2026-01-01T00:00:01Z"))
        );
        assert_eq!(
            earliest(None, Some(at("2026-01-01T00:00:01Z"))),
            Some(at("2026-01-01T00:00:01Z"))
        );
        assert_eq!(earliest(None, None), None);
    }
}
