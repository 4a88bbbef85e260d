//! The domain model: queues, nodes, pods and namespaces as the policy sees them, each converted
//! from its Kubernetes object by a pure function that returns a typed error for bad input.

mod claim;
mod node;
mod pod;
mod queue;
pub mod selector;

pub use claim::{Claim, claim_of};
pub use node::{GpuPool, HOSTNAME_LABEL, MAX_DEVICES_PER_POOL, Node, NodeError};
pub use pod::{
    AdmittedAs, Assignment, DeviceSet, GpuRequest, Pod, PodError, PodKey, PodState, ReclaimMark,
    ReclaimRole, Requests, gate_index, is_gated, is_gpu_pod,
};
pub use queue::{
    CheckpointSettings, EVICTION_RESERVE, FieldError, MAX_BUDGET, MAX_MIN_BORROW, Queue,
    QueueError, ReclaimSettings, ResourceQuota, format_duration,
};

use k8s_openapi::api::core::v1 as k8s;
use selector::Labels;

/// A converted object with the problems that did not stop the conversion (such as a malformed
/// optional annotation), for the operator to log or report as events.
#[derive(Clone, Debug, PartialEq)]
pub struct Converted<T> {
    pub value: T,
    pub warnings: Vec<String>,
}

/// A namespace: its name and labels, which queues' namespace selectors match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    pub labels: Labels,
}

impl Namespace {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            labels: Labels::new(),
        }
    }

    #[must_use]
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub fn from_k8s(namespace: &k8s::Namespace) -> Self {
        Self {
            name: namespace.metadata.name.clone().unwrap_or_default(),
            labels: namespace
                .metadata
                .labels
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
        }
    }
}
