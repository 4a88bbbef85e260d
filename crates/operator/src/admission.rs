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
//! Reclaims (see [`crate::reclaim`]): each pass first resumes or abandons handovers an earlier
//! leader left in the intent annotations; a `Reclaim` decision writes its intent and releases
//! the owner within the pass (so the next pass sees the node taken), and the rest of the
//! handover runs in a task the loop owns, aborted with it when the term ends.

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
    reclaim::{Found, Handovers, Reclaimer, Started},
    status,
    stores::Stores,
};

/// API writes of one pass in flight at once: enough to admit a burst of pods quickly, well
/// under the API server's default limit of 200 concurrent mutating requests.
const WRITE_CONCURRENCY: usize = 32;

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
    /// The reclaim executor.
    pub reclaimer: Reclaimer,
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
    // Dropped (aborting every handover task) when the term ends and this future is aborted.
    let mut handovers = Handovers::new(context.reclaimer.clone());
    loop {
        let wake = run_pass(&context, &term, &mut assumed, &mut handovers).await;
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
            task,
        }
    }

    async fn apply(self, context: &Context, term: &Term, pass: Pass) -> Applied {
        let known = self.known_reason.as_deref();
        match &self.task {
            Task::Decide(decision) => apply(context, term, &self.pod, known, decision, pass).await,
            Task::Unreadable(error) => {
                let line = format!("InvalidRequest: {error}");
                record_wait(
                    context,
                    term,
                    &self.pod,
                    known,
                    None,
                    "InvalidRequest",
                    line,
                )
                .await
            }
        }
    }
}

/// What the writes of a pass need to know about it.
#[derive(Clone, Copy)]
struct Pass {
    now: Timestamp,
    /// When the pass started and when its plans were ready: the start of any handover.
    found: Found,
    /// Stale reclaim intents are being taken back this pass: no new reclaim starts.
    defer_reclaims: bool,
}

/// What one write achieved.
enum Applied {
    Admitted {
        pod: Box<Pod>,
    },
    /// A handover started: its owner is released (remembered as admitted), the rest runs in a
    /// task.
    Reclaiming(Box<Started>),
    ReasonRecorded {
        uid: String,
        reason: Option<String>,
    },
    Nothing,
    Failed,
}

/// One pass; returns when the next pass must run even without a change.
async fn run_pass(
    context: &Context,
    term: &Term,
    assumed: &mut Assumed,
    handovers: &mut Handovers,
) -> Option<Timestamp> {
    let started = tokio::time::Instant::now();
    let now = clock::now();
    let stored_pods = context.stores.pods.state();
    assumed.settle(stored_pods.iter().map(AsRef::as_ref));

    // 0. recover: handovers an earlier leader left half done.
    let recovered = handovers.recover(term, now).await;

    // 1. observe
    let mut observed = Observed::read(&context.stores, assumed);
    for problem in &observed.problems {
        tracing::debug!(%problem, "object left out of the snapshot");
    }
    let mut snapshot = build_snapshot(context, &mut observed, handovers);

    // 2. decide
    let decisions =
        admission::admission_cycle(&mut snapshot, &FragmentationAware, TieBreak::First, now);
    let pass = Pass {
        now,
        found: Found {
            started,
            started_at: now,
            planned: tokio::time::Instant::now(),
        },
        defer_reclaims: recovered.defer_reclaims,
    };

    // 3. apply
    let mut wake = earliest(earliest_cooldown(&decisions), recovered.wake);
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
        .map(|write| write.apply(context, term, pass))
        .collect();
    let applied: Vec<Applied> = stream::iter(pending)
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    for outcome in applied {
        match outcome {
            Applied::Admitted { pod } => assumed.admitted(*pod),
            Applied::Reclaiming(started) => {
                let Started { owner, handover } = *started;
                assumed.admitted(owner);
                handovers.start(term, handover);
            }
            Applied::ReasonRecorded { uid, reason } => assumed.reason_recorded(&uid, reason),
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

/// The core's snapshot of what was observed, with when each queue was last reclaimed from
/// (for its borrowing cool-down): from the queues' handover records, and from this process's
/// handovers whose records are not written yet.
fn build_snapshot(context: &Context, observed: &mut Observed, handovers: &Handovers) -> Snapshot {
    let pods = std::mem::take(&mut observed.pods);
    let mix = WorkloadMix::from_shapes(pods.iter().map(TaskShape::of_pod), DEFAULT_POPULARITY);
    let reclaimed = last_reclaims(&context.stores);
    let mut builder = Snapshot::builder()
        .queues(std::mem::take(&mut observed.queues))
        .namespaces(std::mem::take(&mut observed.namespaces))
        .nodes(std::mem::take(&mut observed.nodes))
        .pods(pods)
        .workload_mix(mix);
    for (queue, at) in reclaimed.into_iter().chain(handovers.reclaimed_from()) {
        builder = builder.reclaimed_from(queue, at);
    }
    let (snapshot, issues) = builder.build();
    for issue in &issues {
        tracing::debug!(%issue, "snapshot left an object out");
    }
    snapshot
}

/// Applies one decision to its pod.
async fn apply(
    context: &Context,
    term: &Term,
    pod: &Pod,
    known_reason: Option<&str>,
    decision: &Decision,
    pass: Pass,
) -> Applied {
    let now = pass.now;
    match decision {
        Decision::Admit(admission) => {
            if !is_gated(pod) {
                return Applied::Nothing;
            }
            if !term.is_current() {
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
                    tracing::info!(pod = %admission.key, queue = %admission.queue, node = %admission.placement.node_name,
                        admitted_as = %admission.admitted_as, "admitted");
                    context.events.send(
                        pod.object_ref(&()),
                        Notice {
                            warning: false,
                            reason: "Admitted",
                            action: "Admit",
                            note: format!(
                                "queue {} admitted the pod ({}) on node {}",
                                admission.queue,
                                admission.admitted_as,
                                admission.placement.node_name
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
        Decision::Wait(wait) => {
            let line = format!("{}: {}", wait.reason.code(), wait.reason);
            record_wait(
                context,
                term,
                pod,
                known_reason,
                wait.queue.as_deref(),
                wait.reason.code(),
                line,
            )
            .await
        }
        Decision::Reclaim(plan) => {
            if pass.defer_reclaims || !is_gated(pod) {
                return Applied::Nothing;
            }
            match context.reclaimer.begin(term, plan, pod, pass.found).await {
                Ok(started) => {
                    context
                        .metrics
                        .admission
                        .decided(&plan.owner_queue, Outcome::Reclaim);
                    tracing::info!(pod = %plan.owner_key, reclaim = %started.handover.id, "{plan}");
                    Applied::Reclaiming(Box::new(started))
                }
                Err(error) if error.is_stale() => {
                    tracing::debug!(%error, "reclaim not started; decided again on the next change");
                    Applied::Nothing
                }
                Err(error) => {
                    context.metrics.admission.apply_failed();
                    tracing::warn!(%error, "starting a reclaim failed; retrying");
                    Applied::Failed
                }
            }
        }
    }
}

/// Records why `pod` waits, unless it already says so; publishes an event when the cause
/// (the code before the colon) changed.
async fn record_wait(
    context: &Context,
    term: &Term,
    pod: &Pod,
    known_reason: Option<&str>,
    queue: Option<&str>,
    code: &'static str,
    line: String,
) -> Applied {
    if known_reason == Some(line.as_str()) || !is_gated(pod) {
        return Applied::Nothing;
    }
    if !term.is_current() {
        return Applied::Nothing;
    }
    let Some(uid) = pod.metadata.uid.clone() else {
        return Applied::Nothing;
    };
    let api: Api<Pod> = Api::namespaced(
        context.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    );
    match patch::set_waiting_reason(&api, pod, Some(&line)).await {
        Ok(_) => {
            let previous_code = known_reason
                .and_then(|reason| reason.split_once(": "))
                .map(|(code, _)| code);
            if previous_code != Some(code) {
                context.metrics.admission.decided(
                    queue.unwrap_or_default(),
                    if code == "ReclaimNeeded" {
                        Outcome::Reclaim
                    } else {
                        Outcome::Wait
                    },
                );
                tracing::info!(pod = %patch::describe(pod), reason = %line, "waiting");
                context.events.send(
                    pod.object_ref(&()),
                    Notice {
                        warning: matches!(
                            code,
                            "InvalidRequest" | "NamespaceConflict" | "NoQuota" | "NoQueue"
                        ),
                        reason: code,
                        action: "Wait",
                        note: line
                            .split_once(": ")
                            .map_or(line.clone(), |(_, text)| text.to_owned()),
                    },
                );
            }
            Applied::ReasonRecorded {
                uid,
                reason: Some(line),
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
    reports: &[QueueReport],
    invalid: &[InvalidQueue],
    now: Timestamp,
) -> bool {
    let mut desired: Vec<(String, Option<Arc<GpuQueue>>, GpuQueueStatus)> = Vec::new();
    let mut rows = Vec::new();
    for report in reports {
        let stored = stored_queue(&context.stores, &report.queue);
        let previous = stored.as_ref().and_then(|queue| queue.status.as_ref());
        let status = report.to_status(now, previous);
        rows.push(QueueRow {
            queue: report.queue.clone(),
            resources: status.resources.clone(),
            admitted_pods: i64::from(status.admitted_pods),
            pending_pods: i64::from(status.pending_pods),
        });
        desired.push((report.queue.clone(), stored, status));
    }
    context.metrics.queues.publish(rows);
    for queue in invalid {
        let status =
            invalid_spec_status(&queue.error, queue.generation, now, queue.status.as_ref());
        desired.push((
            queue.name.clone(),
            stored_queue(&context.stores, &queue.name),
            status,
        ));
    }
    let api: Api<GpuQueue> = Api::all(context.client.clone());
    let pending: Vec<_> = desired
        .into_iter()
        .map(|(name, stored, status)| write_status(context, term, &api, name, stored, status))
        .collect();
    let results: Vec<bool> = stream::iter(pending)
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    results.contains(&false)
}

/// Writes one queue's status if it changed; `false` when the write failed.
async fn write_status(
    context: &Context,
    term: &Term,
    api: &Api<GpuQueue>,
    name: String,
    stored: Option<Arc<GpuQueue>>,
    status: GpuQueueStatus,
) -> bool {
    let previous = stored.as_ref().and_then(|queue| queue.status.as_ref());
    if !status::needs_write(previous, &status) || !term.is_current() {
        return true;
    }
    if let Some(queue) = &stored {
        announce_changes(&context.events, queue, previous, &status);
    }
    match status::write(api, &name, &status).await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, "status write failed; retrying");
            context.metrics.admission.apply_failed();
            false
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

fn stored_pod(stores: &Stores, key: &PodKey) -> Option<Arc<Pod>> {
    stores
        .pods
        .get(&ObjectRef::new(&key.name).within(&key.namespace))
}

fn stored_queue(stores: &Stores, name: &str) -> Option<Arc<GpuQueue>> {
    let guarded = stores.queues.get(&ObjectRef::new(name))?;
    guarded.0.as_ref().ok().map(|queue| Arc::new(queue.clone()))
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
