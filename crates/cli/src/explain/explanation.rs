//! What `explain` tells about one pod, as data: the text view renders it, and `-o json|yaml`
//! prints it as is.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::Serialize;

use crate::queues::{HandoverSummary, ResourceView};

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
    /// The user may not list the queues, and the one it could read (the pod's own, if any)
    /// does not claim the namespace: which queue does is not known.
    Unknown { namespace: String, why: String },
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
    /// Why the operator does not believe these annotations (its `AdmissionNotBelieved` event):
    /// somebody else wrote them, and the pod is charged to its queue as unadmitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_believed: Option<String>,
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
