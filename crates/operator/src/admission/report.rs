//! Phase 4, report: queue status by server-side apply where it changed (counters paced, see
//! [`status_pacing`](super::status_pacing)), events for quota edits and condition changes, and
//! the queue and fragmentation gauges.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gpuqueue_api::v1alpha1::{GpuQueue, GpuQueueStatus};
use gpuqueue_core::{
    Snapshot,
    snapshot::Attribution,
    status::{QueueReport, invalid_spec_status, is_warning, queue_reports},
};
use jiff::Timestamp;
use kube::{Api, Resource};
use tokio::task::JoinSet;

use super::{
    context::{Context, Shared, WriteResult},
    metrics::{FragmentationReport, QueueRow, Waiting},
    observe::InvalidQueue,
    status_pacing::StatusPacing,
};
use crate::{
    cluster::{assumed::Assumed, stores::Stores},
    writes::{
        events::{Events, Notice},
        queue_status as status,
    },
};

/// What phase 4 started, and when a status it held back is due.
pub(super) struct Reported {
    pub(super) statuses: usize,
    pub(super) held_until: Option<Timestamp>,
}

/// Phase 4 of a pass: the queues' status and events, and the queue and fragmentation gauges.
pub(super) fn report(
    shared: &Shared,
    tasks: &mut JoinSet<()>,
    pacing: &mut StatusPacing,
    snapshot: &Snapshot,
    invalid: &[InvalidQueue],
    waiting: Waiting,
    now: Timestamp,
) -> Reported {
    let status_time = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let reports = queue_reports(snapshot, &shared.context.reclaimer.handover_budgets());
    let extras = GaugeExtras {
        namespaces: claimed_namespaces(&shared.context.stores, snapshot),
        waiting,
    };
    let mut reported = Reported {
        statuses: 0,
        held_until: None,
    };
    let (desired, mut rows) = desired_statuses(
        &shared.context.assumed,
        &shared.context.stores,
        &reports,
        invalid,
        status_time,
    );
    extras.fill(&mut rows);
    shared.context.queue_gauges.publish(rows);
    for write in desired {
        match start_status_write(shared, tasks, pacing, write, now) {
            Started::Yes => reported.statuses += 1,
            Started::No => {}
            Started::HeldUntil(due) => {
                reported.held_until = reported.held_until.into_iter().chain(Some(due)).min();
            }
        }
    }
    publish_fragmentation(&shared.context, snapshot);
    reported
}

/// What the queue gauges show beyond the status, by queue.
struct GaugeExtras {
    /// The namespaces each queue alone claims.
    namespaces: BTreeMap<String, Vec<String>>,
    waiting: Waiting,
}

impl GaugeExtras {
    fn fill(mut self, rows: &mut [QueueRow]) {
        for row in rows {
            row.namespaces = self.namespaces.remove(&row.queue).unwrap_or_default();
            row.waiting = self.waiting.remove(&row.queue).unwrap_or_default();
        }
    }
}

/// The stored namespaces each queue alone claims, by the snapshot's attribution.
fn claimed_namespaces(stores: &Stores, snapshot: &Snapshot) -> BTreeMap<String, Vec<String>> {
    let mut claims: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for namespace in stores.namespaces.state() {
        let Some(name) = namespace.metadata.name.as_deref() else {
            continue;
        };
        if let Attribution::Queue(queue) = snapshot.attribution(name) {
            claims
                .entry(snapshot.queue(queue).name.clone())
                .or_default()
                .push(name.to_owned());
        }
    }
    claims
}

/// A queue's status to write, with the one this process last knew.
struct StatusWrite {
    queue: Arc<GpuQueue>,
    previous: Option<GpuQueueStatus>,
    status: GpuQueueStatus,
}

/// Each queue's status as this pass reports it (valid queues, then invalid ones), with the
/// rows of the queue gauges.
fn desired_statuses(
    assumed: &Mutex<Assumed>,
    stores: &Stores,
    reports: &[QueueReport],
    invalid: &[InvalidQueue],
    now: Timestamp,
) -> (Vec<StatusWrite>, Vec<QueueRow>) {
    let queues: Vec<Arc<GpuQueue>> = stores
        .queues
        .state()
        .iter()
        .filter_map(|guarded| guarded.0.as_ref().ok().map(|queue| Arc::new(queue.clone())))
        .collect();
    let find = |name: &str| {
        queues
            .iter()
            .find(|q| q.metadata.name.as_deref() == Some(name))
    };
    let mut desired = Vec::new();
    let mut rows = Vec::new();
    {
        let mut assumed = crate::sync::lock(assumed);
        assumed.settle_queues(queues.iter().map(AsRef::as_ref));
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
                unadmitted_pods: i64::from(report.unadmitted_pods),
                waiting: BTreeMap::new(),
                namespaces: Vec::new(),
            });
            desired.push(StatusWrite {
                queue: queue.clone(),
                previous,
                status,
            });
        }
        for queue in invalid {
            let Some(stored_queue) = find(&queue.name) else {
                continue;
            };
            let previous = assumed.status(stored_queue).cloned();
            let status =
                invalid_spec_status(&queue.error, queue.generation, now, previous.as_ref());
            desired.push(StatusWrite {
                queue: stored_queue.clone(),
                previous,
                status,
            });
        }
    }
    (desired, rows)
}

/// Whether a queue's status write started.
enum Started {
    Yes,
    /// Nothing to write, or a write to the queue is in flight (the next pass looks again).
    No,
    /// Its counters changed, but not yet: see [`StatusPacing`].
    HeldUntil(Timestamp),
}

/// Starts writing one queue's status when it changed, its turn has come and no write to the
/// queue is in flight.
fn start_status_write(
    shared: &Shared,
    tasks: &mut JoinSet<()>,
    pacing: &mut StatusPacing,
    write: StatusWrite,
    now: Timestamp,
) -> Started {
    let StatusWrite {
        queue,
        previous,
        status,
    } = write;
    let Some(uid) = queue.metadata.uid.clone() else {
        return Started::No;
    };
    if !status::needs_write(previous.as_ref(), &status) {
        return Started::No;
    }
    if let Some(due) = pacing.held_until(&uid, previous.as_ref(), &status, now) {
        return Started::HeldUntil(due);
    }
    {
        let mut assumed = shared.assumed();
        if !assumed.begin(&uid) {
            return Started::No;
        }
        assumed.status_written(&uid, status.clone());
    }
    pacing.wrote(&uid, now);
    let context = shared.context.clone();
    let assumed = shared.context.assumed.clone();
    shared.spawn(tasks, uid.clone(), async move {
        let api: Api<GpuQueue> = Api::all(context.client.clone());
        let name = queue.metadata.name.clone().unwrap_or_default();
        match status::write(&api, &name, &status).await {
            Ok(()) => {
                announce_changes(&context.events, &queue, previous.as_ref(), &status);
                WriteResult::Done
            }
            Err(error) => {
                crate::sync::lock(&assumed).forget_status(&uid);
                tracing::warn!(%error, "status write failed; retrying");
                context.metrics.apply_failed(error.category());
                WriteResult::Failed
            }
        }
    });
    Started::Yes
}

/// Events on a queue for what changed since its last status: quota edits (guaranteed or
/// ceiling of a resource), and conditions that changed status or reason.
pub(super) fn announce_changes(
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
            events.send(
                regarding.clone(),
                Notice {
                    warning: is_warning(condition),
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
pub(super) fn condition_reason(reason: &str) -> &'static str {
    gpuqueue_api::conditions::reasons::ALL
        .into_iter()
        .find(|known| *known == reason)
        .unwrap_or("ConditionChanged")
}

pub(super) fn publish_fragmentation(context: &Context, snapshot: &Snapshot) {
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
    context.fragmentation_gauges.publish(FragmentationReport {
        cluster_gpus: cluster.fragmented_milli / 1000.0,
        share_of_capacity: cluster.share_of_capacity(),
        share_of_idle: cluster.share_of_idle(),
        nodes,
    });
}

#[cfg(test)]
mod tests {
    use gpuqueue_api::conditions::types;
    use gpuqueue_api::v1alpha1::ResourceStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;
    use crate::writes::events::{Events, Queued};

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

    fn drain(receiver: &mut tokio::sync::mpsc::Receiver<Queued>) -> Vec<Notice> {
        let mut notices = Vec::new();
        while let Ok(Queued {
            regarding, notice, ..
        }) = receiver.try_recv()
        {
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
        for known in [
            "GuaranteesExceedCapacity",
            "UnadmittedPods",
            "OverrunPlanned",
            "LastHandoverOverran",
        ] {
            assert_eq!(condition_reason(known), known);
        }
        assert_eq!(condition_reason("SomethingNew"), "ConditionChanged");
    }

    #[test]
    fn a_pass_reports_each_stored_queue_with_its_gauge_row() {
        use crate::{
            admission::{at_creation::AtCreation, observe},
            cluster::testing::{TestStores, queue},
        };
        let mut stores = TestStores::new();
        let mut batch = queue("batch", &["batch"], None);
        batch["metadata"]["uid"] = serde_json::json!("q-uid");
        stores.add_queue(batch);
        let assumed = Mutex::new(Assumed::default());
        let now = Timestamp::UNIX_EPOCH;
        let at_creation = AtCreation::new(false);
        let (observed, _) = observe::read(
            &stores.stores,
            &mut crate::sync::lock(&assumed),
            &mut at_creation.pass(),
            &mut observe::Models::default(),
            now,
        );
        let observation = observe::snapshot(
            observed,
            &stores.stores,
            &mut gpuqueue_core::snapshot::kept::KeptSnapshot::default(),
            [],
            now,
        );
        let budgets = gpuqueue_core::status::HandoverBudgets::default();
        let reports = queue_reports(&observation.snapshot, &budgets);
        let (desired, rows) = desired_statuses(&assumed, &stores.stores, &reports, &[], now);
        assert_eq!(desired.len(), 1);
        assert_eq!(desired[0].queue.metadata.name.as_deref(), Some("batch"));
        assert!(desired[0].previous.is_none());
        assert!(status::needs_write(None, &desired[0].status));
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].queue, "batch");
        assert_eq!(rows[0].resources[0].guaranteed, 8);
    }
}
