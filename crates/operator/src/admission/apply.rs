//! Stage 4: decisions into background writes, one in flight per object: gate releases,
//! waiting reasons, and the start of reclaims (intent written, owner released).

use std::sync::Arc;

use gpuqueue_core::{
    admission::{self, Decision},
    model::{PodKey, is_gated},
    reclaim::ReclaimPlan,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Resource, runtime::reflector::ObjectRef};
use tokio::task::JoinSet;

use super::{
    at_creation::Settled,
    context::{Context, Shared, Written},
    metrics::Outcome,
    waiting::{Due, Known, WaitLine, WaitingSince},
};
use crate::{
    cluster::stores::Stores,
    reclaim::{BeginError, Found, Started},
    writes::{
        events::Notice,
        pod::{self as patch, PatchError},
    },
};

/// What [`apply`] started.
pub(super) struct Applied {
    /// Gate releases started.
    pub(super) admitted: usize,
    /// Waiting reasons being written.
    pub(super) waiting: usize,
    /// Owners to reclaim GPUs for, with their plans.
    pub(super) reclaims: Vec<(Arc<Pod>, ReclaimPlan)>,
    /// When the next pod's first waiting reason is due.
    pub(super) first_reason_due: Option<Timestamp>,
}

/// Starts the writes the decisions (and the pods the core could not read) call for: gate
/// releases and waiting reasons; reclaims are returned to be started.
pub(super) fn apply(
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
                applied.first_reason_due =
                    applied.first_reason_due.into_iter().chain(Some(at)).min();
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
                let line = WaitLine::new(wait.queue.clone(), wait.reason.code(), &wait.reason);
                record(tasks, &mut applied, &pod, line);
            }
            Decision::Reclaim(plan) => applied.reclaims.push((pod, plan)),
        }
    }
    for (pod, error) in unreadable_pods {
        let line = WaitLine::new(None, "InvalidRequest", error);
        record(tasks, &mut applied, &pod, line);
    }
    *waiting_since = still_waiting;
    applied
}

/// What became of starting one reclaim.
pub(super) enum Begun {
    /// The owner is released (remembered as admitted); the rest runs in a task.
    Started(Box<Started>),
    /// Not started: the owner or a victim moved on (decided again on the next change), or
    /// the owner has a write in flight.
    Nothing,
    /// A write failed; the next pass decides again after [`RETRY_AFTER`].
    Failed,
}

/// Records the reclaim's intent and releases its owner (see [`Reclaimer::begin`]).
pub(super) async fn begin_reclaim(
    shared: &Shared,
    stored: &Pod,
    plan: &ReclaimPlan,
    found: Found,
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
            context.metrics.decided(&plan.owner_queue, Outcome::Reclaim);
            tracing::info!(pod = %plan.owner_key, reclaim = %started.handover.id, "{plan}");
            Begun::Started(Box::new(started))
        }
        Err(error) if error.is_stale() => {
            tracing::debug!(%error, "reclaim not started; decided again on the next change");
            Begun::Nothing
        }
        Err(error) => {
            context.metrics.apply_failed(begin_error_kind(&error));
            tracing::warn!(%error, "starting a reclaim failed; retrying");
            Begun::Failed
        }
    }
}

/// The kind of a reclaim that failed to start, as `apply_failed` labels it.
fn begin_error_kind(error: &BeginError) -> &'static str {
    match error {
        BeginError::Write(error) => error.category(),
        BeginError::VictimGone(_) => "victim_gone",
        BeginError::NotLeader => "not_leader",
    }
}

/// Starts releasing the pod's gate on the chosen node, assuming it done at once. Returns
/// whether a write was started.
pub(super) fn start_admission(
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
                crate::sync::lock(&assumed).admitted(patched);
                admitted(&context, &pod, &admission, now);
                Written::Done
            }
            Err(error) => {
                crate::sync::lock(&assumed).forget_admission(&uid);
                write_failed(&context, &error)
            }
        }
    });
    true
}

/// Counts, logs and announces a released gate.
pub(super) fn admitted(
    context: &Context,
    pod: &Pod,
    admission: &admission::Admission,
    now: Timestamp,
) {
    context
        .metrics
        .decided(&admission.queue, Outcome::admitted(admission.admitted_as));
    if let Some(created) = &pod.metadata.creation_timestamp {
        let waited = now.duration_since(created.0);
        context.metrics.admitted_after(waited.as_secs_f64());
    }
    tracing::info!(pod = %admission.key, queue = %admission.queue,
        node = %admission.placement.node_name, admitted_as = %admission.admitted_as, "admitted");
    announce_admitted(context, pod, admission, "");
}

/// The `Admitted` event on the pod; `how` ends its note.
pub(super) fn announce_admitted(
    context: &Context,
    pod: &Pod,
    admission: &admission::Admission,
    how: &str,
) {
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
pub(super) fn admitted_at_creation(context: &Context, settled: &Settled) {
    let admission = &settled.reservation.admission;
    let pod = &settled.pod;
    tracing::info!(pod = %format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or_default(), pod.metadata.name.as_deref().unwrap_or_default()),
        queue = %admission.queue, node = %admission.placement.node_name, "admitted at creation seen");
    announce_admitted(context, pod, admission, " at its creation");
}

/// What [`start_wait`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recording {
    Started,
    Unchanged,
    /// Nothing yet: the reason is due then.
    After(Timestamp),
}

/// Starts recording why the pod waits (it has since `waiting_since`), when [`Known::due`] says
/// so; an event follows when the cause changed.
pub(super) fn start_wait(
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
                crate::sync::lock(&assumed).forget_reason(&uid);
                write_failed(&context, &error)
            }
        }
    });
    Recording::Started
}

/// Counts, logs and announces a new cause of waiting.
pub(super) fn waits(context: &Context, pod: &Pod, wait: &WaitLine) {
    context
        .metrics
        .decided(wait.queue.as_deref().unwrap_or_default(), Outcome::Wait);
    tracing::info!(pod = %patch::describe(pod), reason = %wait.line, "waiting");
    context.events.send(
        pod.object_ref(&()),
        Notice {
            warning: wait.warns(),
            reason: wait.code,
            action: "Wait",
            note: wait.text().to_owned(),
        },
    );
}

pub(super) fn write_failed(context: &Context, error: &PatchError) -> Written {
    if error.is_stale() {
        tracing::debug!(%error, "pod moved on; decided again");
        Written::Stale
    } else {
        context.metrics.apply_failed(error.category());
        tracing::warn!(%error, "write failed; retrying");
        Written::Failed
    }
}

pub(super) fn stored_pod(stores: &Stores, key: &PodKey) -> Option<Arc<Pod>> {
    stores
        .pods
        .get(&ObjectRef::new(&key.name).within(&key.namespace))
}
