//! What the invariant checker sees, digested from the watched objects: each pod's GPUs and
//! state, each queue's quota and reclaims in flight, each node's GPUs. The rules read only
//! these, so their tests build them by hand.

use gpuqueue_api::v1alpha1::GpuQueue;
use gpuqueue_api::{ADMISSION_GATE, NVIDIA_GPU, annotations};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::pods::has_finished;

/// One pod as the rules need it.
#[allow(clippy::struct_excessive_bools)] // each is one fact of the pod a rule reads
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodView {
    /// `namespace/name`.
    pub key: String,
    pub uid: String,
    pub namespace: String,
    /// The node it is bound to.
    pub node: Option<String>,
    /// `nvidia.com/gpu` its containers ask for.
    pub gpus: u64,
    /// `Succeeded` or `Failed`: it holds nothing any more.
    pub terminal: bool,
    /// It has a deletion timestamp (evicted, or deleted by its tenant): it still holds its
    /// GPUs, as the scheduler counts them, until it is gone.
    pub deleting: bool,
    /// It still carries gpuqueue's admission gate.
    pub gated: bool,
    /// It carries `gpuqueue.io/waiting-reason`.
    pub has_waiting_reason: bool,
    /// `gpuqueue.io/reclaim-id`, when it takes part in a reclaim.
    pub reclaim_id: Option<String>,
    /// It is the owner a reclaim frees GPUs for (`gpuqueue.io/reclaim-role: owner`).
    pub reclaim_owner: bool,
}

impl PodView {
    pub fn of(pod: &Pod) -> Self {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let annotation = |key: &str| {
            pod.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .cloned()
        };
        let spec = pod.spec.as_ref();
        Self {
            key: format!("{namespace}/{name}"),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            namespace,
            node: spec.and_then(|s| s.node_name.clone()),
            gpus: gpus_of(pod),
            terminal: has_finished(pod),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            gated: spec
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|gates| gates.iter().any(|g| g.name == ADMISSION_GATE)),
            has_waiting_reason: annotation(annotations::WAITING_REASON).is_some(),
            reclaim_id: annotation(annotations::RECLAIM_ID),
            reclaim_owner: annotation(annotations::RECLAIM_ROLE).as_deref() == Some("owner"),
        }
    }

    /// Holds its GPUs: bound and not terminal (terminating included).
    pub fn holds(&self) -> bool {
        self.node.is_some() && !self.terminal
    }

    /// Holds quota, as the operator counts it: admitted (its gate released) and not terminal,
    /// bound or not yet. A pod admitted a moment ago and not yet bound is already a borrower.
    pub fn holds_quota(&self) -> bool {
        !self.gated && !self.terminal
    }

    /// Asks for its GPUs: neither terminal nor being deleted.
    pub fn asks(&self) -> bool {
        !self.terminal && !self.deleting
    }
}

/// One reclaim a queue lists in `status.reclaimsInFlight`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InFlightView {
    pub id: String,
    pub owner_pod: String,
    /// Its deadline, milliseconds since the Unix epoch.
    pub deadline_ms: u64,
}

/// One queue's `nvidia.com/gpu` quota, as the rules need it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueView {
    pub name: String,
    pub namespaces: Vec<String>,
    pub guarantee: u64,
    /// `guaranteed + burstable`.
    pub ceiling: u64,
    /// `spec.reclaim.budget`, in milliseconds.
    pub budget_ms: u64,
    pub in_flight: Vec<InFlightView>,
}

impl QueueView {
    pub fn of(queue: &GpuQueue) -> Self {
        let quota = queue.spec.resources.iter().find(|r| r.name == NVIDIA_GPU);
        let count = |n: Option<i32>| u64::try_from(n.unwrap_or(0)).unwrap_or(0);
        let guarantee = count(quota.map(|q| q.guaranteed));
        let budget: std::time::Duration = queue.spec.reclaim.budget.into();
        Self {
            name: queue.metadata.name.clone().unwrap_or_default(),
            namespaces: queue.spec.namespaces.clone(),
            guarantee,
            ceiling: guarantee + count(quota.map(|q| q.burstable)),
            budget_ms: millis(budget),
            in_flight: queue
                .status
                .iter()
                .flat_map(|s| &s.reclaims_in_flight)
                .map(|r| InFlightView {
                    id: r.id.clone(),
                    owner_pod: r.owner_pod.clone(),
                    deadline_ms: u64::try_from(r.deadline.0.as_millisecond()).unwrap_or(0),
                })
                .collect(),
        }
    }

    pub fn claims(&self, namespace: &str) -> bool {
        self.namespaces.iter().any(|n| n == namespace)
    }
}

/// One node's whole GPUs (`status.allocatable`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub gpus: u64,
}

impl NodeView {
    pub fn of(node: &Node) -> Self {
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            gpus: node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(NVIDIA_GPU))
                .and_then(|q| q.0.parse().ok())
                .unwrap_or(0),
        }
    }
}

/// Everything the watches hold at one sample.
#[derive(Debug, Clone, Default)]
pub struct World {
    pub pods: Vec<PodView>,
    pub queues: Vec<QueueView>,
    pub nodes: Vec<NodeView>,
}

impl World {
    /// The queue claiming `namespace` (the first, if two conflict).
    pub fn queue_of(&self, namespace: &str) -> Option<&QueueView> {
        self.queues.iter().find(|q| q.claims(namespace))
    }

    /// The pods of a queue's namespaces.
    pub fn pods_of<'a>(&'a self, queue: &'a QueueView) -> impl Iterator<Item = &'a PodView> {
        self.pods.iter().filter(|p| queue.claims(&p.namespace))
    }

    /// GPUs a queue's pods hold, and ask for.
    pub fn usage(&self, queue: &QueueView) -> (u64, u64) {
        self.pods_of(queue).fold((0, 0), |(held, asked), pod| {
            (
                held + if pod.holds() { pod.gpus } else { 0 },
                asked + if pod.asks() { pod.gpus } else { 0 },
            )
        })
    }
}

/// `nvidia.com/gpu` the pod's containers ask for (limits; requests default to them).
pub(crate) fn gpus_of(pod: &Pod) -> u64 {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(NVIDIA_GPU))
        .filter_map(|q| q.0.parse::<u64>().ok())
        .sum()
}

pub(crate) fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
