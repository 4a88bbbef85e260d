//! `kubectl gpuqueue explain POD`: why a pod waits, or where and as what it was admitted, from
//! what the operator wrote (the pod's annotations, its queue's status, its events).
//!
//! The CLI decides nothing: which queue claims the namespace is answered by the core's own
//! snapshot (as the operator's webhook answers it), the reason a pod waits is the operator's
//! annotation, and the numbers are the queue's status.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;

use gpuqueue_api::v1alpha1::GpuQueue;
use gpuqueue_api::{ADMISSION_GATE, FIELD_MANAGER, annotations};
use gpuqueue_core::Snapshot;
use gpuqueue_core::model::{self, HOSTNAME_LABEL};
use gpuqueue_core::snapshot::Attribution;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::args::ExplainArgs;
use crate::connect::{self, InspectError};
use crate::queues::{self, HandoverSummary, ResourceView};
use crate::render;

/// Everything `explain` says about one pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// `namespace/name`.
    pub pod: String,
    /// One line: waiting and why, admitted and where, or not managed and why.
    pub summary: String,
    pub claim: Claim,
    /// What the pod requests, per GPU resource (`1`, `0.5`).
    pub requests: BTreeMap<String, String>,
    /// Whether the pod still carries the gate `gpuqueue.io/admission`.
    pub gated: bool,
    /// Other scheduling gates, which someone else must release.
    pub other_gates: Vec<String>,
    /// The operator's `gpuqueue.io/waiting-reason`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    /// The node the pod is bound or pinned to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeView>,
    /// The claiming queue's status rows for the resources the pod requests.
    pub queue_resources: Vec<ResourceView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_pods: Option<QueuePods>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<Reclaim>,
    /// The operator's events about this pod, oldest first.
    pub events: Vec<EventView>,
    /// Anything that limits what can be told: no operator status, unreadable objects.
    pub notes: Vec<String>,
}

/// Which queue claims the pod's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Claim {
    /// Exactly one queue: the pod is managed by it.
    Queue { queue: String, namespace: String },
    /// Several queues: nothing there is admitted until one claims it.
    Conflict {
        namespace: String,
        queues: Vec<String>,
    },
    /// No queue: the pod is not managed.
    Unclaimed { namespace: String },
}

/// The operator's record of the pod's admission.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    pub queue: Option<String>,
    /// `guaranteed` or `borrowed`.
    pub admitted_as: Option<String>,
    pub admitted_at: Option<String>,
    /// Admitted by the webhook as it was created, never gated.
    pub at_creation: bool,
}

/// Where the pod runs or will run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub name: String,
    /// Bound by kube-scheduler; otherwise only pinned by the operator.
    pub bound: bool,
    /// kube-scheduler's word on a pinned pod it has not bound (`PodScheduled=False`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler_message: Option<String>,
}

/// The claiming queue's pod counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuePods {
    pub admitted: i32,
    pub pending: i32,
}

/// The pod's part in a reclaim, from its reclaim annotations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reclaim {
    pub id: String,
    /// `owner` or `victim`.
    pub role: Option<String>,
    pub deadline: Option<String>,
    pub node: Option<String>,
    pub progress: Option<String>,
    /// The handover's record, once a queue's status has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handover: Option<HandoverSummary>,
}

/// One event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    pub last_seen: Option<Timestamp>,
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub count: i32,
    pub message: String,
}

/// What `explain` read from the cluster.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub pod: Pod,
    /// The pod's namespace; `None` when it could not be read (its labels are then unknown).
    pub namespace: Option<Namespace>,
    /// Why the namespace could not be read.
    pub namespace_error: Option<String>,
    pub queues: Vec<GpuQueue>,
    /// Events about the pod (any reporter; filtered here).
    pub events: Vec<Event>,
    /// Why events could not be listed.
    pub events_error: Option<String>,
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Explains the pod from what was read; at most `max_events` events, the newest.
#[allow(clippy::too_many_lines)] // one pass over the pod's facts, in the order they are told
pub fn explain(observed: &Observed, max_events: usize) -> Explanation {
    let pod = &observed.pod;
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut notes = Vec::new();

    // Which queue claims the namespace: the core's attribution, from the queues it can read.
    let valid: Vec<model::Queue> = observed
        .queues
        .iter()
        .filter_map(|q| model::Queue::from_api(q).ok())
        .collect();
    let selecting: Vec<String> = valid
        .iter()
        .filter(|q| q.namespace_selector.is_some())
        .map(|q| q.name.clone())
        .collect();
    let model_namespace = if let Some(ns) = &observed.namespace {
        model::Namespace::from_k8s(ns)
    } else {
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
        model::Namespace::new(&namespace)
    };
    let (snapshot, _) = Snapshot::builder()
        .queues(valid)
        .namespace(model_namespace)
        .build();
    let claim = match snapshot.attribution(&namespace) {
        Attribution::Queue(q) => Claim::Queue {
            queue: snapshot.queue(q).name.clone(),
            namespace: namespace.clone(),
        },
        Attribution::Conflict { namespace, queues } => Claim::Conflict { namespace, queues },
        Attribution::Unclaimed => Claim::Unclaimed {
            namespace: namespace.clone(),
        },
    };
    // Queues the core cannot read claim nothing; say so when one names this namespace.
    for queue in &observed.queues {
        if let Err(error) = model::Queue::from_api(queue)
            && queue.spec.namespaces.contains(&namespace)
        {
            notes.push(format!(
                "queue {} names namespace {namespace} but claims nothing: {error}",
                queue.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    let queue = match &claim {
        Claim::Queue { queue, .. } => observed
            .queues
            .iter()
            .find(|q| q.metadata.name.as_deref() == Some(queue)),
        _ => None,
    };
    if let Some(queue) = queue {
        notes.extend(queues::status_notes(queue));
    }

    // What the pod asks for, as the core reads it.
    let (requests, modelled) = match model::Pod::from_k8s(pod) {
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
    };

    let spec = pod.spec.as_ref();
    let scheduling_gates: Vec<String> = spec
        .and_then(|s| s.scheduling_gates.as_ref())
        .into_iter()
        .flatten()
        .map(|g| g.name.clone())
        .collect();
    let gated = scheduling_gates.iter().any(|g| g == ADMISSION_GATE);
    let other_gates: Vec<String> = scheduling_gates
        .into_iter()
        .filter(|g| g != ADMISSION_GATE)
        .collect();
    let waiting_reason = annotation(pod, annotations::WAITING_REASON).map(str::to_owned);

    let admission = (annotation(pod, annotations::ADMITTED_AT).is_some()
        || annotation(pod, annotations::ADMITTED_AS).is_some())
    .then(|| Admission {
        queue: annotation(pod, annotations::QUEUE).map(str::to_owned),
        admitted_as: annotation(pod, annotations::ADMITTED_AS).map(str::to_owned),
        admitted_at: annotation(pod, annotations::ADMITTED_AT).map(str::to_owned),
        at_creation: annotation(pod, annotations::ADMITTED_AT_CREATION).is_some(),
    });
    let node = node_of(pod);

    let queue_status = queue.and_then(|q| q.status.as_ref());
    let queue_resources: Vec<ResourceView> = queue_status
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
            if !queue_resources.iter().any(|r| &r.name == resource) {
                notes.push(format!(
                    "queue {} reports no numbers for {resource}: its spec lists no quota for it",
                    queue.metadata.name.as_deref().unwrap_or_default()
                ));
            }
        }
    }
    let queue_pods = queue_status.map(|s| QueuePods {
        admitted: s.admitted_pods,
        pending: s.pending_pods,
    });

    let reclaim = annotation(pod, annotations::RECLAIM_ID).map(|id| Reclaim {
        id: id.to_owned(),
        role: annotation(pod, annotations::RECLAIM_ROLE).map(str::to_owned),
        deadline: annotation(pod, annotations::RECLAIM_DEADLINE).map(str::to_owned),
        node: annotation(pod, annotations::RECLAIM_NODE).map(str::to_owned),
        progress: annotation(pod, annotations::RECLAIM_PROGRESS).map(str::to_owned),
        handover: observed
            .queues
            .iter()
            .filter_map(|q| q.status.as_ref())
            .flat_map(|s| &s.last_handovers)
            .find(|r| r.id == id)
            .map(HandoverSummary::from),
    });

    let events = operator_events(pod, &observed.events, max_events);
    if let Some(error) = &observed.events_error {
        notes.push(format!("cannot list events: {error}"));
    }

    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let summary = summary(&Facts {
        claim: &claim,
        modelled: &modelled,
        phase,
        gated,
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

/// The operator's events about this very pod (not an older pod of the same name), the newest
/// `max` of them, oldest first.
fn operator_events(pod: &Pod, events: &[Event], max: usize) -> Vec<EventView> {
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
    let skip = views.len().saturating_sub(max);
    views.split_off(skip)
}

/// The facts the one-line summary is told from.
struct Facts<'a> {
    claim: &'a Claim,
    /// Whether the core models the pod (requests a GPU, not finished), or why it cannot.
    modelled: &'a Result<bool, String>,
    phase: Option<&'a str>,
    gated: bool,
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
    if let Some(reclaim) = facts.reclaim
        && reclaim.role.as_deref() == Some("victim")
    {
        return format!(
            "admitted, {place}; being evicted by reclaim {} to return borrowed GPUs",
            reclaim.id
        );
    }
    match facts.admission {
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

/// The `Key: value` lines at the top, in the order they are told.
fn fields(e: &Explanation, now: Timestamp) -> Vec<(&'static str, String)> {
    let mut fields: Vec<(&'static str, String)> = vec![
        ("Pod", e.pod.clone()),
        ("Summary", e.summary.clone()),
        (
            "Queue",
            match &e.claim {
                Claim::Queue { queue, namespace } => {
                    format!("{queue} (claims namespace {namespace})")
                }
                Claim::Conflict { namespace, queues } => format!(
                    "none: namespace {namespace} is claimed by several queues ({})",
                    queues.join(", ")
                ),
                Claim::Unclaimed { namespace } => {
                    format!("none: no queue claims namespace {namespace}")
                }
            },
        ),
    ];
    if !e.requests.is_empty() {
        let list: Vec<String> = e.requests.iter().map(|(r, n)| format!("{r} {n}")).collect();
        fields.push(("Requests", list.join(", ")));
    }
    fields.push((
        "Gate",
        if e.gated {
            format!("{ADMISSION_GATE} (held)")
        } else {
            format!("{ADMISSION_GATE} not present")
        },
    ));
    if !e.other_gates.is_empty() {
        fields.push(("Other gates", e.other_gates.join(", ")));
    }
    if let Some(reason) = &e.waiting_reason {
        fields.push(("Waiting reason", reason.clone()));
    }
    if let Some(a) = &e.admission {
        let mut line = a.admitted_as.clone().unwrap_or_else(|| "admitted".into());
        if let Some(q) = &a.queue {
            let _ = write!(line, ", queue {q}");
        }
        if let Some(at) = &a.admitted_at {
            let _ = write!(line, ", at {at}");
            if let Ok(t) = at.parse::<Timestamp>() {
                let _ = write!(line, " ({} ago)", render::age(t, now));
            }
        }
        if a.at_creation {
            line.push_str(", at its creation (never gated)");
        }
        fields.push(("Admitted", line));
    }
    if let Some(node) = &e.node {
        let mut line = node.name.clone();
        line.push_str(if node.bound {
            " (bound)"
        } else {
            " (pinned by gpuqueue; kube-scheduler has not bound it)"
        });
        if let Some(message) = &node.scheduler_message {
            let _ = write!(line, "; kube-scheduler: {message}");
        }
        fields.push(("Node", line));
    }
    if let Some(r) = &e.reclaim {
        let mut line = format!(
            "{}, this pod is the {}",
            r.id,
            r.role.as_deref().unwrap_or("unknown party")
        );
        if let Some(node) = &r.node {
            let _ = write!(line, ", frees node {node}");
        }
        if let Some(deadline) = &r.deadline {
            let _ = write!(line, ", deadline {deadline}");
        }
        if let Some(progress) = &r.progress {
            let _ = write!(line, ", progress {progress}");
        }
        if let Some(h) = &r.handover {
            let _ = write!(
                line,
                "; handover {} in {}ms of {}ms",
                h.outcome, h.total_millis, h.budget_millis
            );
        }
        fields.push(("Reclaim", line));
    }
    fields
}

/// The explanation for people.
pub fn render(e: &Explanation, now: Timestamp) -> String {
    let fields = fields(e, now);
    // Values start one column after the longest key's colon and two spaces.
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 3;
    let mut text = String::new();
    for (key, value) in fields {
        let _ = writeln!(text, "{:width$}{value}", format!("{key}:"));
    }

    if !e.queue_resources.is_empty() {
        if let Claim::Queue { queue, .. } = &e.claim {
            let _ = write!(text, "\nQueue {queue}");
            if let Some(p) = &e.queue_pods {
                let _ = write!(
                    text,
                    " ({} pods admitted, {} pending)",
                    p.admitted, p.pending
                );
            }
            text.push_str(":\n");
        }
        let rows: Vec<Vec<String>> = e
            .queue_resources
            .iter()
            .map(|r| {
                let n = |v: Option<i64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
                vec![
                    r.name.clone(),
                    n(r.guaranteed),
                    n(r.ceiling),
                    n(r.allocated),
                    n(r.borrowed),
                    n(r.lent),
                    n(r.pending),
                ]
            })
            .collect();
        text.push_str(&indent(&render::table(
            &[
                "RESOURCE",
                "GUARANTEED",
                "CEILING",
                "ALLOCATED",
                "BORROWED",
                "LENT",
                "PENDING",
            ],
            &rows,
        )));
    }

    let _ = write!(text, "\nEvents from {FIELD_MANAGER}:");
    if e.events.is_empty() {
        text.push_str(" none\n");
    } else {
        text.push('\n');
        let rows: Vec<Vec<String>> = e
            .events
            .iter()
            .map(|ev| {
                let mut seen = ev
                    .last_seen
                    .map_or_else(|| "-".to_owned(), |t| render::age(t, now));
                if ev.count > 1 {
                    let _ = write!(seen, " (x{})", ev.count);
                }
                vec![
                    seen,
                    ev.type_.clone(),
                    ev.reason.clone(),
                    ev.message.clone(),
                ]
            })
            .collect();
        text.push_str(&indent(&render::table(
            &["LAST SEEN", "TYPE", "REASON", "MESSAGE"],
            &rows,
        )));
    }

    if !e.notes.is_empty() {
        text.push_str("\nNotes:\n");
        for note in &e.notes {
            let _ = writeln!(text, "  {note}");
        }
    }
    text
}

fn indent(text: &str) -> String {
    text.lines().fold(String::new(), |mut out, line| {
        let _ = writeln!(out, "  {line}");
        out
    })
}

/// Reads the pod, its namespace, the queues and the pod's events.
async fn observe(args: &ExplainArgs) -> Result<Observed, InspectError> {
    let cluster = connect::connect(&args.cluster).await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| cluster.default_namespace.clone());
    let client = cluster.client;
    let pod = Api::<Pod>::namespaced(client.clone(), &namespace)
        .get(&args.pod)
        .await
        .map_err(|e| {
            InspectError::from_api(
                format!("get pods in namespace {namespace}"),
                format!("pod {}/{}", namespace, args.pod),
                e,
            )
        })?;
    let queues = connect::read_queues(client.clone(), None).await?;
    // Tenants may read their pods but not namespaces or events: explain what can be told.
    let (namespace_object, namespace_error) =
        match Api::<Namespace>::all(client.clone()).get(&namespace).await {
            Ok(ns) => (Some(ns), None),
            Err(e) => (
                None,
                Some(
                    InspectError::from_api("get namespaces", format!("namespace {namespace}"), e)
                        .to_string(),
                ),
            ),
        };
    let selector = format!("involvedObject.kind=Pod,involvedObject.name={}", args.pod);
    let (events, events_error) = match Api::<Event>::namespaced(client, &namespace)
        .list(&ListParams::default().fields(&selector))
        .await
    {
        Ok(list) => (list.items, None),
        Err(e) => (
            Vec::new(),
            Some(
                InspectError::from_api(
                    format!("list events in namespace {namespace}"),
                    "events",
                    e,
                )
                .to_string(),
            ),
        ),
    };
    Ok(Observed {
        pod,
        namespace: namespace_object,
        namespace_error,
        queues,
        events,
        events_error,
    })
}

/// Runs `kubectl gpuqueue explain`.
pub fn run(args: &ExplainArgs, now: Timestamp, out: &mut dyn Write) -> Result<(), InspectError> {
    let observed = connect::block_on(observe(args))?;
    let explanation = explain(&observed, args.events);
    if !render::structured(&explanation, args.output, out)? {
        out.write_all(render(&explanation, now).as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    fn now() -> Timestamp {
        "2026-01-10T12:00:00Z".parse().unwrap()
    }

    fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
        serde_yaml::from_str(text).unwrap()
    }

    /// A one-GPU pod in `namespace` with extra metadata (`annotations`) and spec lines.
    fn pod(namespace: &str, name: &str, metadata: &str, spec: &str, status: &str) -> Pod {
        yaml(&format!(
            "metadata:\n  name: {name}\n  namespace: {namespace}\n  uid: uid-{name}\n  creationTimestamp: '2026-01-10T11:50:00Z'\n{metadata}\nspec:\n  containers:\n    - name: vllm\n      resources: {{limits: {{nvidia.com/gpu: 1}}}}\n{spec}\nstatus:\n{status}\n"
        ))
    }

    const GATE: &str = "  schedulingGates: [{name: gpuqueue.io/admission}]";

    fn batch_queue(with_status: bool) -> GpuQueue {
        let status = if with_status {
            "status:
  observedGeneration: 1
  resources:
    - {name: nvidia.com/gpu, guaranteed: 8, ceiling: 24, allocated: 24, borrowed: 16, lent: 0, pending: 2}
    - {name: nvidia.com/mig-1g.10gb, guaranteed: 2, ceiling: 2, allocated: 0, borrowed: 0, lent: 0, pending: 0}
  admittedPods: 24
  pendingPods: 2
  lastHandovers:
    - {id: rc-9, role: victim, ownerPod: online/vllm-1, node: gpu-node-1, outcome: Completed, budgetMillis: 3000, totalMillis: 2710}
"
        } else {
            ""
        };
        yaml(&format!(
            "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata: {{name: batch, generation: 1}}\nspec:\n  namespaces: [batch]\n  resources: [{{name: nvidia.com/gpu, guaranteed: 8, burstable: 16}}, {{name: nvidia.com/mig-1g.10gb, guaranteed: 2}}]\n{status}"
        ))
    }

    fn queue(name: &str, namespaces: &str, selector: &str) -> GpuQueue {
        yaml(&format!(
            "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata: {{name: {name}, generation: 1}}\nspec:\n  namespaces: [{namespaces}]\n{selector}\n  resources: [{{name: nvidia.com/gpu, guaranteed: 1}}]\n"
        ))
    }

    fn namespace(name: &str, labels: &str) -> Namespace {
        yaml(&format!("metadata: {{name: {name}, labels: {{{labels}}}}}"))
    }

    fn observed(pod: Pod, queues: Vec<GpuQueue>) -> Observed {
        let ns = pod.metadata.namespace.clone().unwrap();
        Observed {
            pod,
            namespace: Some(namespace(&ns, "")),
            queues,
            ..Observed::default()
        }
    }

    const OVER_CEILING: &str = "OverCeiling: queue batch: nvidia.com/gpu allocated 24 + requested 1 exceeds its ceiling of 24 (guaranteed 8 + burstable 16)";

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

    #[test]
    fn a_waiting_pod_reads_like_this() {
        let p = pod(
            "batch",
            "vllm-25",
            &format!("  annotations:\n    gpuqueue.io/waiting-reason: '{OVER_CEILING}'"),
            GATE,
            "  phase: Pending",
        );
        let event = |reason: &str, component: &str, uid: &str, at: &str, message: &str| -> Event {
            yaml(&format!(
                "metadata: {{name: e-{reason}-{at}, namespace: batch}}\ninvolvedObject: {{kind: Pod, name: vllm-25, namespace: batch, uid: {uid}}}\nreason: {reason}\ntype: Normal\nmessage: '{message}'\nreportingComponent: {component}\neventTime: '{at}'\n"
            ))
        };
        let mut obs = observed(p, vec![batch_queue(true)]);
        obs.events = vec![
            event(
                "OverCeiling",
                "gpuqueue-operator",
                "uid-vllm-25",
                "2026-01-10T11:57:00Z",
                "queue batch: nvidia.com/gpu allocated 24 + requested 1 exceeds its ceiling of 24 (guaranteed 8 + burstable 16)",
            ),
            event(
                "NoIdleCapacity",
                "gpuqueue-operator",
                "uid-vllm-25",
                "2026-01-10T11:55:00Z",
                "queue batch: only 0 is idle",
            ),
            event(
                "FailedScheduling",
                "default-scheduler",
                "uid-vllm-25",
                "2026-01-10T11:56:00Z",
                "not ours",
            ),
            event(
                "Admitted",
                "gpuqueue-operator",
                "uid-of-an-older-pod",
                "2026-01-10T11:40:00Z",
                "an older pod of the same name",
            ),
        ];
        let e = explain(&obs, 10);
        assert_eq!(
            render(&e, now()),
            "\
Pod:             batch/vllm-25
Summary:         waiting at the gate: OverCeiling: queue batch: nvidia.com/gpu allocated 24 + requested 1 exceeds its ceiling of 24 (guaranteed 8 + burstable 16)
Queue:           batch (claims namespace batch)
Requests:        nvidia.com/gpu 1
Gate:            gpuqueue.io/admission (held)
Waiting reason:  OverCeiling: queue batch: nvidia.com/gpu allocated 24 + requested 1 exceeds its ceiling of 24 (guaranteed 8 + burstable 16)

Queue batch (24 pods admitted, 2 pending):
  RESOURCE         GUARANTEED   CEILING   ALLOCATED   BORROWED   LENT   PENDING
  nvidia.com/gpu   8            24        24          16         0      2

Events from gpuqueue-operator:
  LAST SEEN   TYPE     REASON           MESSAGE
  5m          Normal   NoIdleCapacity   queue batch: only 0 is idle
  3m          Normal   OverCeiling      queue batch: nvidia.com/gpu allocated 24 + requested 1 exceeds its ceiling of 24 (guaranteed 8 + burstable 16)
"
        );
        // Only the newest events when asked for fewer.
        let e = explain(&obs, 1);
        assert_eq!(e.events.len(), 1);
        assert_eq!(e.events[0].reason, "OverCeiling");
    }

    #[test]
    fn a_pod_admitted_at_its_creation_says_so() {
        let p = pod(
            "batch",
            "vllm-0",
            "  annotations:\n    gpuqueue.io/queue: batch\n    gpuqueue.io/admitted-as: guaranteed\n    gpuqueue.io/admitted-at: '2026-01-10T11:58:00Z'\n    gpuqueue.io/admitted-at-creation: 5f3a",
            "  nodeName: gpu-node-1",
            "  phase: Running",
        );
        let text = render(&explain(&observed(p, vec![batch_queue(true)]), 10), now());
        assert!(
            text.contains("Admitted:  guaranteed, queue batch, at 2026-01-10T11:58:00Z (2m ago), at its creation (never gated)\n"),
            "{text}"
        );
    }

    #[test]
    fn an_admitted_pod_in_a_reclaim_reads_like_this() {
        let p = pod(
            "batch",
            "train-1",
            "  annotations:\n    gpuqueue.io/queue: batch\n    gpuqueue.io/admitted-as: borrowed\n    gpuqueue.io/admitted-at: '2026-01-10T11:58:00Z'\n    gpuqueue.io/reclaim-id: rc-9\n    gpuqueue.io/reclaim-role: victim\n    gpuqueue.io/reclaim-node: gpu-node-1\n    gpuqueue.io/reclaim-deadline: '2026-01-10T11:59:03Z'\n    gpuqueue.io/reclaim-progress: checkpointing",
            "  nodeName: gpu-node-1",
            "  phase: Running",
        );
        let mut obs = observed(p, vec![batch_queue(true)]);
        obs.events_error =
            Some("no permission to list events in namespace batch: forbidden".into());
        let text = render(&explain(&obs, 10), now());
        assert_eq!(
            text,
            "\
Pod:       batch/train-1
Summary:   admitted, bound to node gpu-node-1; being evicted by reclaim rc-9 to return borrowed GPUs
Queue:     batch (claims namespace batch)
Requests:  nvidia.com/gpu 1
Gate:      gpuqueue.io/admission not present
Admitted:  borrowed, queue batch, at 2026-01-10T11:58:00Z (2m ago)
Node:      gpu-node-1 (bound)
Reclaim:   rc-9, this pod is the victim, frees node gpu-node-1, deadline 2026-01-10T11:59:03Z, progress checkpointing; handover Completed in 2710ms of 3000ms

Queue batch (24 pods admitted, 2 pending):
  RESOURCE         GUARANTEED   CEILING   ALLOCATED   BORROWED   LENT   PENDING
  nvidia.com/gpu   8            24        24          16         0      2

Events from gpuqueue-operator: none

Notes:
  cannot list events: no permission to list events in namespace batch: forbidden
"
        );
    }

    #[test]
    fn a_pinned_pod_shows_what_kube_scheduler_says_and_json_has_every_field() {
        let p = pod(
            "batch",
            "p",
            "  annotations: {gpuqueue.io/queue: batch, gpuqueue.io/admitted-as: guaranteed, gpuqueue.io/admitted-at: '2026-01-10T11:58:00Z'}",
            "  nodeSelector: {kubernetes.io/hostname: gpu-node-2}",
            "  phase: Pending\n  conditions: [{type: PodScheduled, status: 'False', reason: Unschedulable, message: '0/5 nodes are available: 1 Insufficient cpu.'}]",
        );
        let e = explain(&observed(p, vec![batch_queue(true)]), 10);
        let text = render(&e, now());
        assert!(
            text.contains("Node:      gpu-node-2 (pinned by gpuqueue; kube-scheduler has not bound it); kube-scheduler: 0/5 nodes are available: 1 Insufficient cpu.\n"),
            "{text}"
        );
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(
            json["claim"],
            serde_json::json!({"kind": "queue", "queue": "batch", "namespace": "batch"})
        );
        assert_eq!(json["admission"]["admittedAs"], "guaranteed");
        assert_eq!(json["node"]["bound"], false);
        assert_eq!(json["gated"], false);
        assert_eq!(json["requests"]["nvidia.com/gpu"], "1");
        assert_eq!(json["queueResources"][0]["ceiling"], 24);
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
