//! The pure explanation: what was read (`Observed`) becomes what is told (`Explanation`).
//!
//! The CLI decides nothing: which queue claims the namespace is the core's rule
//! (`gpuqueue_core::model::claim_of`, as the operator's webhook answers it), the gate test is
//! the core's (`is_gated`), the reason a pod waits is the operator's annotation, and the numbers
//! are the queue's status.

use std::collections::BTreeMap;

use gpuqueue_api::v1alpha1::GpuQueue;
use gpuqueue_api::{ADMISSION_GATE, FIELD_MANAGER, annotations, events::ADMISSION_NOT_BELIEVED};
use gpuqueue_core::model::{self, HOSTNAME_LABEL};
use k8s_openapi::api::core::v1::{Event, Pod};

use super::explanation::{Admission, Claim, EventView, Explanation, NodeView, QueuePods, Reclaim};
use super::read::Observed;
use crate::queues::{self, HandoverSummary, ResourceView};

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Explains the pod from what was read; at most `max_events` events, the newest. Notes are
/// told in this order: the claim's, the queue status's, the queue numbers', the events'.
pub fn explain(observed: &Observed, max_events: usize) -> Explanation {
    let pod = &observed.pod;
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut notes = Vec::new();

    let claim = claim(observed, &namespace, &mut notes);
    let queue = claiming_queue(&observed.queues, &claim);
    if let Some(queue) = queue {
        notes.extend(queues::status_notes(queue));
    }
    let (requests, modelled) = requests(pod);
    let gated = model::is_gated(pod);
    // A reclaim's owner held at the gate is admitted: it only waits for its room to be free.
    let held = model::is_held_owner(pod);
    let other_gates = other_gates(pod);
    let waiting_reason = annotation(pod, annotations::WAITING_REASON).map(str::to_owned);
    let mut events = operator_events(pod, &observed.events);
    let admission = admission(pod, &events);
    let node = node_of(pod);
    let QueueNumbers {
        resources: queue_resources,
        pods: queue_pods,
    } = queue_numbers(queue, &requests, &mut notes);
    let reclaim = reclaim(pod, &observed.queues);
    let events = events.split_off(events.len().saturating_sub(max_events));
    if let Some(error) = &observed.events_error {
        notes.push(format!("cannot list events: {error}"));
    }

    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let summary = summary(&Facts {
        claim: &claim,
        modelled: &modelled,
        phase,
        gated: gated && !held,
        held,
        waiting_reason: waiting_reason.as_deref(),
        admission: admission.as_ref(),
        node: node.as_ref(),
        reclaim: reclaim.as_ref(),
    });

    Explanation {
        pod: format!("{namespace}/{name}"),
        summary,
        claim,
        requests,
        gated,
        other_gates,
        waiting_reason,
        admission,
        node,
        queue_resources,
        queue_pods,
        reclaim,
        events,
        notes,
    }
}

/// Which queue claims the namespace: the core's rule over the queues it can read. Notes what
/// limits the answer: an unreadable namespace while some queue selects by label, and queues
/// the core cannot read that name the namespace.
fn claim(observed: &Observed, namespace: &str, notes: &mut Vec<String>) -> Claim {
    let valid: Vec<model::Queue> = observed
        .queues
        .iter()
        .filter_map(|q| model::Queue::from_api(q).ok())
        .collect();
    let model_namespace = if let Some(ns) = &observed.namespace {
        model::Namespace::from_k8s(ns)
    } else {
        let selecting: Vec<&str> = valid
            .iter()
            .filter(|q| q.namespace_selector.is_some())
            .map(|q| q.name.as_str())
            .collect();
        if !selecting.is_empty() {
            notes.push(format!(
                "cannot read namespace {namespace}{}, so queues that claim namespaces by label ({}) may claim it too",
                observed
                    .namespace_error
                    .as_deref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default(),
                selecting.join(", ")
            ));
        }
        model::Namespace::new(namespace)
    };
    let owned = namespace.to_owned();
    let claim = match model::claim_of(&valid, &model_namespace) {
        model::Claim::Queue(queue) => Claim::Queue {
            queue,
            namespace: owned,
        },
        model::Claim::Conflict(queues) => Claim::Conflict {
            namespace: owned,
            queues,
        },
        model::Claim::Unclaimed => match &observed.queues_error {
            Some(error) => Claim::Unknown {
                namespace: owned,
                why: format!("cannot list GpuQueues ({error})"),
            },
            None => Claim::Unclaimed { namespace: owned },
        },
    };
    // Queues the core cannot read claim nothing; say so when one names this namespace.
    for queue in &observed.queues {
        if let Err(error) = model::Queue::from_api(queue)
            && queue.spec.namespaces.iter().any(|n| n == namespace)
        {
            notes.push(format!(
                "queue {} names namespace {namespace} but claims nothing: {error}",
                queue.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    claim
}

/// The claiming queue's object, when exactly one queue claims the namespace.
fn claiming_queue<'a>(queues: &'a [GpuQueue], claim: &Claim) -> Option<&'a GpuQueue> {
    match claim {
        Claim::Queue { queue, .. } => queues
            .iter()
            .find(|q| q.metadata.name.as_deref() == Some(queue)),
        _ => None,
    }
}

/// What the pod asks for, as the core reads it, and whether the core models it (or why not).
fn requests(pod: &Pod) -> (BTreeMap<String, String>, Result<bool, String>) {
    match model::Pod::from_k8s(pod) {
        Ok(Some(converted)) => (
            converted
                .value
                .requests
                .gpus
                .iter()
                .map(|g| (g.resource.to_string(), g.total().to_string()))
                .collect(),
            Ok(true),
        ),
        Ok(None) => (BTreeMap::new(), Ok(false)),
        Err(error) => (BTreeMap::new(), Err(error.to_string())),
    }
}

/// Scheduling gates other than gpuqueue's, which someone else must release.
fn other_gates(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .into_iter()
        .flatten()
        .map(|g| g.name.clone())
        .filter(|g| g != ADMISSION_GATE)
        .collect()
}

/// The pod's admission annotations, if it carries any, with the operator's word on them when
/// it does not believe them (the newest of its `events` saying so).
fn admission(pod: &Pod, events: &[EventView]) -> Option<Admission> {
    (annotation(pod, annotations::ADMITTED_AT).is_some()
        || annotation(pod, annotations::ADMITTED_AS).is_some())
    .then(|| Admission {
        queue: annotation(pod, annotations::QUEUE).map(str::to_owned),
        admitted_as: annotation(pod, annotations::ADMITTED_AS).map(str::to_owned),
        admitted_at: annotation(pod, annotations::ADMITTED_AT).map(str::to_owned),
        at_creation: annotation(pod, annotations::ADMITTED_AT_CREATION).is_some(),
        not_believed: events
            .iter()
            .rev()
            .find(|e| e.reason == ADMISSION_NOT_BELIEVED)
            .map(|e| e.message.clone()),
    })
}

/// The claiming queue's status rows and pod counts.
struct QueueNumbers {
    resources: Vec<ResourceView>,
    pods: Option<QueuePods>,
}

/// The claiming queue's numbers for the resources the pod requests; notes each requested
/// resource its status has no row for.
fn queue_numbers(
    queue: Option<&GpuQueue>,
    requests: &BTreeMap<String, String>,
    notes: &mut Vec<String>,
) -> QueueNumbers {
    let queue_status = queue.and_then(|q| q.status.as_ref());
    let resources: Vec<ResourceView> = queue_status
        .map(|status| {
            status
                .resources
                .iter()
                .filter(|r| requests.contains_key(&r.name))
                .map(queues::view_resource)
                .collect()
        })
        .unwrap_or_default();
    if let (Some(queue), Some(_)) = (queue, queue_status) {
        for resource in requests.keys() {
            if !resources.iter().any(|r| &r.name == resource) {
                notes.push(format!(
                    "queue {} reports no numbers for {resource}: its spec lists no quota for it",
                    queue.metadata.name.as_deref().unwrap_or_default()
                ));
            }
        }
    }
    let pods = queue_status.map(|s| QueuePods {
        admitted: s.admitted_pods,
        pending: s.pending_pods,
    });
    QueueNumbers { resources, pods }
}

/// The pod's part in a reclaim, with the handover's record once any queue's status has it.
fn reclaim(pod: &Pod, queues: &[GpuQueue]) -> Option<Reclaim> {
    annotation(pod, annotations::RECLAIM_ID).map(|id| Reclaim {
        id: id.to_owned(),
        role: annotation(pod, annotations::RECLAIM_ROLE).map(str::to_owned),
        deadline: annotation(pod, annotations::RECLAIM_DEADLINE).map(str::to_owned),
        node: annotation(pod, annotations::RECLAIM_NODE).map(str::to_owned),
        progress: annotation(pod, annotations::RECLAIM_PROGRESS).map(str::to_owned),
        handover: queues
            .iter()
            .filter_map(|q| q.status.as_ref())
            .flat_map(|s| &s.last_handovers)
            .find(|r| r.id == id)
            .map(HandoverSummary::from),
    })
}

/// The node the pod is bound to, else the one the operator pinned it to.
fn node_of(pod: &Pod) -> Option<NodeView> {
    let spec = pod.spec.as_ref()?;
    if let Some(name) = &spec.node_name {
        return Some(NodeView {
            name: name.clone(),
            bound: true,
            scheduler_message: None,
        });
    }
    let pinned = spec.node_selector.as_ref()?.get(HOSTNAME_LABEL)?;
    let scheduler_message = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.message.clone());
    Some(NodeView {
        name: pinned.clone(),
        bound: false,
        scheduler_message,
    })
}

/// The operator's events about this very pod (not an older pod of the same name), oldest
/// first.
fn operator_events(pod: &Pod, events: &[Event]) -> Vec<EventView> {
    let uid = pod.metadata.uid.as_deref();
    let mut views: Vec<EventView> = events
        .iter()
        .filter(|e| {
            let reporter = e
                .reporting_component
                .as_deref()
                .or_else(|| e.source.as_ref().and_then(|s| s.component.as_deref()));
            reporter == Some(FIELD_MANAGER)
                && (uid.is_none()
                    || e.involved_object.uid.is_none()
                    || e.involved_object.uid.as_deref() == uid)
        })
        .map(|e| EventView {
            last_seen: e
                .series
                .as_ref()
                .and_then(|s| s.last_observed_time.as_ref())
                .map(|t| t.0)
                .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
                .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
                .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0)),
            type_: e.type_.clone().unwrap_or_default(),
            reason: e.reason.clone().unwrap_or_default(),
            count: e
                .series
                .as_ref()
                .and_then(|s| s.count)
                .or(e.count)
                .unwrap_or(1),
            message: e.message.clone().unwrap_or_default(),
        })
        .collect();
    views.sort_by_key(|e| e.last_seen);
    views
}

/// The facts the one-line summary is told from.
struct Facts<'a> {
    claim: &'a Claim,
    /// Whether the core models the pod (requests a GPU, not finished), or why it cannot.
    modelled: &'a Result<bool, String>,
    phase: Option<&'a str>,
    gated: bool,
    /// A reclaim's owner, admitted and pinned, held at the gate until its room is free.
    held: bool,
    waiting_reason: Option<&'a str>,
    admission: Option<&'a Admission>,
    node: Option<&'a NodeView>,
    reclaim: Option<&'a Reclaim>,
}

fn summary(facts: &Facts<'_>) -> String {
    if let Some(phase @ ("Succeeded" | "Failed")) = facts.phase {
        return format!("the pod has finished ({phase}); it holds no GPUs");
    }
    match facts.modelled {
        Ok(false) => {
            return "the pod requests no GPU resource: gpuqueue does not manage it".to_owned();
        }
        Err(error) if !facts.gated => {
            return format!("gpuqueue cannot read the pod's request: {error}");
        }
        _ => {}
    }
    if let Claim::Unclaimed { namespace } = facts.claim
        && !facts.gated
    {
        return format!(
            "no queue claims namespace {namespace}: the pod is not managed (its GPUs count as used capacity)"
        );
    }
    if facts.gated {
        return match facts.waiting_reason {
            Some(reason) => format!("waiting at the gate: {reason}"),
            None => match facts.claim {
                Claim::Unclaimed { namespace } => format!(
                    "waiting at the gate, but no queue claims namespace {namespace}: the pod is not managed and nothing will release it"
                ),
                _ => "waiting at the gate; no reason recorded yet (the operator writes one once a pod has waited a second)".to_owned(),
            },
        };
    }
    let place = match facts.node {
        Some(NodeView {
            name, bound: true, ..
        }) => format!("bound to node {name}"),
        Some(NodeView { name, .. }) => {
            format!("pinned to node {name}, not bound yet")
        }
        None => "not on a node yet".to_owned(),
    };
    if facts.held {
        return format!(
            "admitted, {place}; held at the gate until its reclaim's victims are gone (kube-scheduler tries it only once its room is free)"
        );
    }
    if let Some(reclaim) = facts.reclaim
        && reclaim.role.as_deref() == Some("victim")
    {
        return format!(
            "admitted, {place}; being evicted by reclaim {} to return borrowed GPUs",
            reclaim.id
        );
    }
    match facts.admission {
        Some(Admission {
            not_believed: Some(_),
            ..
        }) => format!(
            "not admitted: its admission annotations are not the operator's, and it is charged to its queue as unadmitted (event {ADMISSION_NOT_BELIEVED} says why); {place}"
        ),
        Some(admission) => format!(
            "admitted{}{}; {place}",
            admission
                .admitted_as
                .as_deref()
                .map(|a| format!(" as {a}"))
                .unwrap_or_default(),
            admission
                .queue
                .as_deref()
                .map(|q| format!(" by queue {q}"))
                .unwrap_or_default(),
        ),
        None => format!(
            "not gated and never admitted by gpuqueue: it bypassed the gate (created before its namespace was claimed, or while the webhook was unreachable), and its GPUs count as used capacity; {place}"
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use k8s_openapi::api::core::v1::Namespace;

    use super::*;
    use crate::explain::fixtures::{
        GATE, OVER_CEILING, batch_queue, namespace, observed, pod, queue, yaml,
    };

    #[test]
    #[allow(clippy::too_many_lines)] // one table, one entry per situation
    fn each_situation_gets_its_summary() {
        let admitted = "  annotations:\n    gpuqueue.io/queue: batch\n    gpuqueue.io/admitted-as: borrowed\n    gpuqueue.io/admitted-at: '2026-01-10T11:58:00Z'";
        let waiting = format!("  annotations:\n    gpuqueue.io/waiting-reason: '{OVER_CEILING}'");
        let cases: Vec<(&str, Observed, &str)> = vec![
            (
                "admitted and bound",
                observed(
                    pod(
                        "batch",
                        "p",
                        admitted,
                        "  nodeName: gpu-node-1\n  nodeSelector: {kubernetes.io/hostname: gpu-node-1}",
                        "  phase: Running",
                    ),
                    vec![batch_queue(true)],
                ),
                "admitted as borrowed by queue batch; bound to node gpu-node-1",
            ),
            (
                "admitted, pinned, not bound",
                observed(
                    pod(
                        "batch",
                        "p",
                        admitted,
                        "  nodeSelector: {kubernetes.io/hostname: gpu-node-1}",
                        "  phase: Pending",
                    ),
                    vec![batch_queue(true)],
                ),
                "admitted as borrowed by queue batch; pinned to node gpu-node-1, not bound yet",
            ),
            (
                "a reclaim's owner held at the gate",
                observed(
                    pod(
                        "batch",
                        "p",
                        "  annotations:\n    gpuqueue.io/admitted-at: '2026-01-10T11:58:00Z'\n    gpuqueue.io/reclaim-id: rc-1\n    gpuqueue.io/reclaim-role: owner",
                        &format!("{GATE}\n  nodeSelector: {{kubernetes.io/hostname: gpu-node-1}}"),
                        "  phase: Pending",
                    ),
                    vec![batch_queue(true)],
                ),
                "admitted, pinned to node gpu-node-1, not bound yet; held at the gate until its reclaim's victims are gone (kube-scheduler tries it only once its room is free)",
            ),
            (
                "over its ceiling",
                observed(
                    pod("batch", "p", &waiting, GATE, "  phase: Pending"),
                    vec![batch_queue(true)],
                ),
                "waiting at the gate: OverCeiling: queue batch: nvidia.com/gpu allocated 24 + requested 1 exceeds its ceiling of 24 (guaranteed 8 + burstable 16)",
            ),
            (
                "gated, no reason yet",
                observed(
                    pod("batch", "p", "", GATE, "  phase: Pending"),
                    vec![batch_queue(false)],
                ),
                "waiting at the gate; no reason recorded yet (the operator writes one once a pod has waited a second)",
            ),
            (
                "unclaimed namespace",
                observed(
                    pod("web", "p", "", "", "  phase: Running"),
                    vec![batch_queue(true)],
                ),
                "no queue claims namespace web: the pod is not managed (its GPUs count as used capacity)",
            ),
            (
                "gated by hand in an unclaimed namespace",
                observed(
                    pod("web", "p", "", GATE, "  phase: Pending"),
                    vec![batch_queue(true)],
                ),
                "waiting at the gate, but no queue claims namespace web: the pod is not managed and nothing will release it",
            ),
            (
                "bypassed the gate",
                observed(
                    pod(
                        "batch",
                        "p",
                        "",
                        "  nodeName: gpu-node-3",
                        "  phase: Running",
                    ),
                    vec![batch_queue(true)],
                ),
                "not gated and never admitted by gpuqueue: it bypassed the gate (created before its namespace was claimed, or while the webhook was unreachable), and its GPUs count as used capacity; bound to node gpu-node-3",
            ),
            (
                "victim of a reclaim",
                observed(
                    pod(
                        "batch",
                        "p",
                        &format!(
                            "{admitted}\n    gpuqueue.io/reclaim-id: rc-9\n    gpuqueue.io/reclaim-role: victim"
                        ),
                        "  nodeName: gpu-node-1",
                        "  phase: Running",
                    ),
                    vec![batch_queue(true)],
                ),
                "admitted, bound to node gpu-node-1; being evicted by reclaim rc-9 to return borrowed GPUs",
            ),
            (
                "finished",
                observed(
                    pod(
                        "batch",
                        "p",
                        admitted,
                        "  nodeName: gpu-node-1",
                        "  phase: Succeeded",
                    ),
                    vec![batch_queue(true)],
                ),
                "the pod has finished (Succeeded); it holds no GPUs",
            ),
            (
                "no GPU",
                observed(
                    yaml(
                        "metadata: {name: web, namespace: batch}\nspec:\n  containers: [{name: nginx}]\n",
                    ),
                    vec![batch_queue(true)],
                ),
                "the pod requests no GPU resource: gpuqueue does not manage it",
            ),
        ];
        for (name, observed, expected) in cases {
            assert_eq!(explain(&observed, 10).summary, expected, "{name}");
        }
    }

    #[test]
    fn an_admission_the_operator_does_not_believe_is_told_as_such() {
        let forged = "  annotations:\n    gpuqueue.io/queue: batch\n    gpuqueue.io/admitted-as: guaranteed\n    gpuqueue.io/admitted-at: '2026-01-10T11:58:00Z'";
        let event = |reason: &str, uid: &str, component: &str| -> Event {
            yaml(&format!(
                "metadata: {{name: e-{reason}-{uid}, namespace: batch, creationTimestamp: '2026-01-10T11:59:00Z'}}\ninvolvedObject: {{kind: Pod, namespace: batch, name: p, uid: {uid}}}\nreason: {reason}\ntype: Warning\nmessage: its admission annotations are not the operator's (no admission seal)\nreportingComponent: {component}"
            ))
        };
        let mut seen = observed(
            pod(
                "batch",
                "p",
                forged,
                "  nodeName: gpu-node-1",
                "  phase: Running",
            ),
            vec![batch_queue(true)],
        );
        // Believed: no such event of the operator's about this very pod.
        seen.events = vec![
            event("AdmissionNotBelieved", "uid-older-p", FIELD_MANAGER),
            event("AdmissionNotBelieved", "uid-p", "someone-else"),
        ];
        let believed = explain(&seen, 10);
        assert_eq!(
            believed.summary,
            "admitted as guaranteed by queue batch; bound to node gpu-node-1"
        );
        assert_eq!(believed.admission.unwrap().not_believed, None);

        // The operator said it does not believe it: told even when no event is shown.
        seen.events
            .push(event("AdmissionNotBelieved", "uid-p", FIELD_MANAGER));
        let told = explain(&seen, 0);
        assert_eq!(
            told.summary,
            "not admitted: its admission annotations are not the operator's, and it is charged to its queue as unadmitted (event AdmissionNotBelieved says why); bound to node gpu-node-1"
        );
        assert!(told.events.is_empty());
        assert_eq!(
            told.admission.unwrap().not_believed.as_deref(),
            Some("its admission annotations are not the operator's (no admission seal)")
        );
    }

    /// What RBAC answers a tenant (or a tenant admin whose role names one queue) listing queues.
    const LIST_REFUSED: &str = "no permission to list GpuQueues: forbidden";

    #[test]
    fn the_claiming_queue_is_the_cores_answer() {
        let selector = "  namespaceSelector: {matchLabels: {tenant: research}}";
        let gated = |ns: &str| pod(ns, "p", "", GATE, "  phase: Pending");
        let with_ns = |pod: Pod, ns: Namespace, queues: Vec<GpuQueue>| Observed {
            pod,
            namespace: Some(ns),
            queues,
            ..Observed::default()
        };
        let cases: Vec<(&str, Observed, Claim, Vec<&str>)> = vec![
            (
                "by name",
                observed(
                    gated("batch"),
                    vec![batch_queue(true), queue("other", "x", "")],
                ),
                Claim::Queue {
                    queue: "batch".into(),
                    namespace: "batch".into(),
                },
                vec![],
            ),
            (
                "by label",
                with_ns(
                    gated("lab"),
                    namespace("lab", "tenant: research"),
                    vec![queue("research", "", selector)],
                ),
                Claim::Queue {
                    queue: "research".into(),
                    namespace: "lab".into(),
                },
                vec![
                    "no status: the operator has not reported on this queue (is gpuqueue-operator running?)",
                ],
            ),
            (
                "two queues",
                observed(
                    gated("shared"),
                    vec![queue("a", "shared", ""), queue("b", "shared", "")],
                ),
                Claim::Conflict {
                    namespace: "shared".into(),
                    queues: vec!["a".into(), "b".into()],
                },
                vec![],
            ),
            (
                "namespace unreadable, a queue selects by label",
                Observed {
                    pod: gated("lab"),
                    namespace: None,
                    namespace_error: Some("no permission to get namespaces: forbidden".into()),
                    queues: vec![queue("research", "", selector)],
                    ..Observed::default()
                },
                Claim::Unclaimed {
                    namespace: "lab".into(),
                },
                vec![
                    "cannot read namespace lab (no permission to get namespaces: forbidden), so queues that claim namespaces by label (research) may claim it too",
                ],
            ),
            (
                "an invalid queue claims nothing",
                observed(
                    gated("batch"),
                    vec![yaml(
                        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata: {name: broken}\nspec:\n  namespaces: [batch]\n  weight: 0\n  resources: [{name: nvidia.com/gpu, guaranteed: 1}]\n",
                    )],
                ),
                Claim::Unclaimed {
                    namespace: "batch".into(),
                },
                vec![
                    "queue broken names namespace batch but claims nothing: GpuQueue broken has an invalid spec: spec.weight: must be between 1 and 1000, not 0",
                ],
            ),
        ];
        for (name, observed, claim, notes) in cases {
            let e = explain(&observed, 10);
            assert_eq!(e.claim, claim, "{name}");
            assert_eq!(e.notes, notes, "{name}");
        }
    }

    /// Review finding: a tenant with the stock `edit` role may not list queues (they are
    /// cluster-scoped), and explain failed for it.
    #[test]
    fn a_user_who_may_not_list_queues_learns_what_its_own_queue_tells() {
        let gated = |ns: &str| pod(ns, "p", "", GATE, "  phase: Pending");
        let cases: Vec<(&str, Observed, Claim, Vec<&str>)> = vec![
            (
                "queues not listable, the pod's own queue read",
                Observed {
                    queues_error: Some(LIST_REFUSED.into()),
                    ..observed(gated("batch"), vec![batch_queue(true)])
                },
                Claim::Queue {
                    queue: "batch".into(),
                    namespace: "batch".into(),
                },
                vec![],
            ),
            (
                "queues not listable, none read",
                Observed {
                    queues_error: Some(LIST_REFUSED.into()),
                    ..observed(gated("batch"), vec![])
                },
                Claim::Unknown {
                    namespace: "batch".into(),
                    why: format!("cannot list GpuQueues ({LIST_REFUSED})"),
                },
                vec![],
            ),
        ];
        for (name, observed, claim, notes) in cases {
            let e = explain(&observed, 10);
            assert_eq!(e.claim, claim, "{name}");
            assert_eq!(e.notes, notes, "{name}");
        }
    }

    #[test]
    fn a_request_the_queue_has_no_quota_for_is_pointed_out() {
        let p: Pod = yaml(
            "metadata: {name: p, namespace: batch}\nspec:\n  schedulingGates: [{name: gpuqueue.io/admission}, {name: example.com/other}]\n  containers:\n    - name: m\n      resources: {limits: {nvidia.com/mig-3g.40gb: 1}}\n",
        );
        let e = explain(&observed(p, vec![batch_queue(true)]), 10);
        assert_eq!(e.other_gates, ["example.com/other"]);
        assert!(e.queue_resources.is_empty());
        assert_eq!(
            e.notes,
            [
                "queue batch reports no numbers for nvidia.com/mig-3g.40gb: its spec lists no quota for it"
            ]
        );
    }
}
