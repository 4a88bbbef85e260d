//! Pods, queues and namespaces as the tests of `explain` write them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use gpuqueue_api::v1alpha1::GpuQueue;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Pod};

use super::read::Observed;

pub(super) fn now() -> Timestamp {
    "2026-01-10T12:00:00Z".parse().unwrap()
}

pub(super) fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
    serde_yaml::from_str(text).unwrap()
}

/// A one-GPU pod in `namespace` with extra metadata (`annotations`) and spec lines.
pub(super) fn pod(namespace: &str, name: &str, metadata: &str, spec: &str, status: &str) -> Pod {
    yaml(&format!(
        "metadata:\n  name: {name}\n  namespace: {namespace}\n  uid: uid-{name}\n  creationTimestamp: '2026-01-10T11:50:00Z'\n{metadata}\nspec:\n  containers:\n    - name: vllm\n      resources: {{limits: {{nvidia.com/gpu: 1}}}}\n{spec}\nstatus:\n{status}\n"
    ))
}

pub(super) const GATE: &str = "  schedulingGates: [{name: gpuqueue.io/admission}]";

pub(super) fn batch_queue(with_status: bool) -> GpuQueue {
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

pub(super) fn queue(name: &str, namespaces: &str, selector: &str) -> GpuQueue {
    yaml(&format!(
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata: {{name: {name}, generation: 1}}\nspec:\n  namespaces: [{namespaces}]\n{selector}\n  resources: [{{name: nvidia.com/gpu, guaranteed: 1}}]\n"
    ))
}

pub(super) fn namespace(name: &str, labels: &str) -> Namespace {
    yaml(&format!("metadata: {{name: {name}, labels: {{{labels}}}}}"))
}

pub(super) fn observed(pod: Pod, queues: Vec<GpuQueue>) -> Observed {
    let ns = pod.metadata.namespace.clone().unwrap();
    Observed {
        pod,
        namespace: Some(namespace(&ns, "")),
        queues,
        ..Observed::default()
    }
}

pub(super) const OVER_CEILING: &str = "OverCeiling: queue batch: nvidia.com/gpu allocated 24 + requested 1 exceeds its ceiling of 24 (guaranteed 8 + burstable 16)";
