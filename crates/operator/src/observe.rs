//! Reading the stores into the core's model: the "dereference" step of the admission pass, and
//! the questions the webhook and the pod store ask. Every rule comes from `gpuqueue-core`
//! (what a GPU pod is, which queue claims a namespace, what a valid queue is); this module only
//! gathers the objects and converts them.

use std::sync::Arc;

use gpuqueue_api::v1alpha1::{GpuQueue, GpuQueueStatus};
use gpuqueue_core::{
    Snapshot,
    model::{self, FieldError, QueueError},
    snapshot::Attribution,
};
use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt, runtime::reflector::ObjectRef};

use crate::{
    assumed::Assumed,
    at_creation::{AtCreation, CreationAdmission},
    clock,
    metrics::{AdmissionMetrics, Outcome},
    stores::{PodFilter, Stores},
    webhook::mutate::GatePolicy,
};

/// Whether the pod store keeps `pod`: the pods the core models (live pods with a GPU request),
/// and the GPU pods it cannot read (so the admission pass can say why they wait).
pub fn keep_pod(pod: &Pod) -> bool {
    !matches!(model::Pod::from_k8s(pod), Ok(None))
}

/// [`keep_pod`] as the stores take it.
pub fn pod_filter() -> PodFilter {
    Arc::new(keep_pod)
}

/// A queue that cannot be used, with what its status should say.
#[derive(Debug, Clone)]
pub struct InvalidQueue {
    pub name: String,
    pub generation: Option<i64>,
    pub error: QueueError,
    pub status: Option<GpuQueueStatus>,
}

/// The cluster as the core sees it, read from the stores.
#[derive(Debug, Default)]
pub struct Observed {
    pub queues: Vec<model::Queue>,
    pub invalid_queues: Vec<InvalidQueue>,
    pub namespaces: Vec<model::Namespace>,
    pub nodes: Vec<model::Node>,
    pub pods: Vec<model::Pod>,
    /// GPU pods the core cannot model, with why: they stay at the gate, and say so.
    pub unreadable_pods: Vec<(Arc<Pod>, String)>,
    /// Problems with single objects: each object was left out (or read with a default), the
    /// rest is usable.
    pub problems: Vec<String>,
}

impl Observed {
    /// Reads every store; the pods are `pods`, the pod store's state the caller read once for
    /// the whole pass (a second read could show a pod the caller's bookkeeping has not seen).
    /// Pods are seen through `assumed`, so admissions the store has not shown yet already hold
    /// their GPUs.
    pub fn read(stores: &Stores, pods: &[Arc<Pod>], assumed: &Assumed) -> Self {
        let mut observed = Self::default();
        for stored in stores.queues.state() {
            match &stored.0 {
                Ok(queue) => match model::Queue::from_api(queue) {
                    Ok(queue) => observed.queues.push(queue),
                    Err(error) => observed.invalid_queues.push(InvalidQueue {
                        name: queue.name_any(),
                        generation: queue.metadata.generation,
                        error,
                        status: queue.status.clone(),
                    }),
                },
                Err(invalid) => observed.invalid_queues.push(unreadable(invalid)),
            }
        }
        observed.namespaces = stores
            .namespaces
            .state()
            .iter()
            .map(|namespace| model::Namespace::from_k8s(namespace))
            .collect();
        for node in stores.nodes.state() {
            match model::Node::from_k8s(&node) {
                Ok(converted) => {
                    observed.problems.extend(converted.warnings);
                    observed.nodes.push(converted.value);
                }
                Err(error) => observed.problems.push(error.to_string()),
            }
        }
        for stored in pods {
            match model::Pod::from_k8s(assumed.view(stored)) {
                Ok(Some(converted)) => {
                    observed.problems.extend(converted.warnings);
                    observed.pods.push(converted.value);
                }
                Ok(None) => {}
                Err(error) => observed
                    .unreadable_pods
                    .push((stored.clone(), error.to_string())),
            }
        }
        observed
    }
}

/// A queue object the operator could not even deserialise (its schema and the operator's
/// types disagree), as an invalid spec naming the error.
fn unreadable(invalid: &kube::core::error_boundary::InvalidObject) -> InvalidQueue {
    let name = invalid.metadata.name.clone().unwrap_or_default();
    InvalidQueue {
        error: QueueError {
            queue: name.clone(),
            problems: vec![FieldError {
                field: "spec".into(),
                rule: format!("cannot be read by this operator version: {}", invalid.error),
            }],
        },
        name,
        generation: invalid.metadata.generation,
        status: None,
    }
}

/// The webhook's policy, answered from the stores by the core's rules: a pod is managed when
/// the core models it as a GPU pod and a queue claims its namespace. A namespace that several
/// queues claim is managed too (its pods wait until the conflict is resolved). Managed pods
/// are admitted at creation when the leader can ([`AtCreation`]), gated otherwise.
#[derive(Debug, Clone)]
pub struct StoreGatePolicy {
    stores: Stores,
    at_creation: AtCreation,
    metrics: AdmissionMetrics,
}

impl StoreGatePolicy {
    pub fn new(stores: Stores, at_creation: AtCreation, metrics: AdmissionMetrics) -> Self {
        Self {
            stores,
            at_creation,
            metrics,
        }
    }
}

impl GatePolicy for StoreGatePolicy {
    fn managing_queue(&self, pod: &Pod) -> Option<String> {
        if matches!(model::Pod::from_k8s(pod), Ok(None)) {
            return None;
        }
        let namespace = pod.metadata.namespace.clone()?;
        let stored = self.stores.queues.state();
        let queues = stored.iter().filter_map(|stored| {
            let queue: &GpuQueue = stored.0.as_ref().ok()?;
            model::Queue::from_api(queue).ok()
        });
        let labels = self
            .stores
            .namespaces
            .get(&ObjectRef::new(&namespace))
            .map_or_else(
                || model::Namespace::new(&namespace),
                |ns| model::Namespace::from_k8s(&ns),
            );
        let (snapshot, _) = Snapshot::builder().queues(queues).namespace(labels).build();
        match snapshot.attribution(&namespace) {
            Attribution::Queue(queue) => Some(snapshot.queue(queue).name.clone()),
            Attribution::Conflict { queues, .. } => Some(queues.join(",")),
            Attribution::Unclaimed => None,
        }
    }

    fn admit_at_creation(&self, pod: &Pod) -> Option<CreationAdmission> {
        let admitted = self.at_creation.admit(pod, clock::now())?;
        self.metrics
            .decided(&admitted.queue, Outcome::admitted(admitted.admitted_as));
        self.metrics.admitted_after(0.0);
        tracing::info!(namespace = pod.metadata.namespace.as_deref().unwrap_or_default(),
            queue = %admitted.queue, node = %admitted.node_pin, admitted_as = %admitted.admitted_as,
            token = %admitted.token, "admitted at creation");
        Some(admitted)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::stores::testing::TestStores;

    fn queue(
        name: &str,
        namespaces: &[&str],
        selector: Option<serde_json::Value>,
    ) -> serde_json::Value {
        let mut queue = json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": name, "generation": 1},
            "spec": {"namespaces": namespaces,
                     "resources": [{"name": "nvidia.com/gpu", "guaranteed": 8, "burstable": 8}]},
        });
        if let Some(selector) = selector {
            queue["spec"]["namespaceSelector"] = selector;
        }
        queue
    }

    fn pod(namespace: &str, gpus: Option<u32>) -> Pod {
        let resources = gpus.map_or(
            json!({}),
            |n| json!({"limits": {"nvidia.com/gpu": n.to_string()}}),
        );
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": namespace, "uid": "u",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]},
        }))
        .unwrap()
    }

    fn stores() -> TestStores {
        let mut stores = TestStores::new();
        stores.add_queue(queue("online", &["online"], None));
        stores.add_queue(queue("batch", &["batch", "shared"], None));
        stores.add_queue(queue(
            "labs",
            &["shared"],
            Some(json!({"matchLabels": {"team": "labs"}})),
        ));
        stores.add_namespace(json!({"metadata": {"name": "lab-1", "labels": {"team": "labs"}}}));
        stores
    }

    #[test]
    fn only_pods_the_core_models_are_kept() {
        assert!(keep_pod(&pod("batch", Some(1))));
        assert!(!keep_pod(&pod("batch", None)));
        let mut finished = pod("batch", Some(1));
        finished.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
        assert!(!keep_pod(&finished));
    }

    /// The policy of a standby (it never admits at creation).
    fn policy(stores: Stores) -> StoreGatePolicy {
        let metrics = crate::metrics::Metrics::register(&mut crate::metrics::registry());
        StoreGatePolicy::new(stores, AtCreation::new(true), metrics.admission)
    }

    #[test]
    fn a_gpu_pod_in_a_claimed_namespace_is_managed_by_its_queue() {
        let policy = policy(stores().stores);
        assert_eq!(
            policy.managing_queue(&pod("online", Some(1))).as_deref(),
            Some("online")
        );
        assert_eq!(
            policy.managing_queue(&pod("lab-1", Some(2))).as_deref(),
            Some("labs")
        );
    }

    #[test]
    fn cpu_pods_and_unclaimed_namespaces_are_left_alone() {
        let policy = policy(stores().stores);
        assert_eq!(policy.managing_queue(&pod("online", None)), None);
        assert_eq!(policy.managing_queue(&pod("elsewhere", Some(1))), None);
    }

    #[test]
    fn a_namespace_claimed_twice_is_gated_under_both_names() {
        let policy = policy(stores().stores);
        assert_eq!(
            policy.managing_queue(&pod("shared", Some(1))).as_deref(),
            Some("batch,labs")
        );
    }

    #[test]
    fn observed_reports_invalid_queues_and_keeps_the_rest() {
        let mut stores = stores();
        stores.add_queue(json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "broken", "generation": 4},
            "spec": {"namespaces": ["x"], "resources": "all of them"},
        }));
        stores.add_pod(serde_json::to_value(pod("batch", Some(1))).unwrap());
        let mut malformed = serde_json::to_value(pod("batch", Some(1))).unwrap();
        malformed["metadata"]["name"] = json!("malformed");
        malformed["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("1.5");
        stores.add_pod(malformed);
        stores.add_node(json!({
            "metadata": {"name": "gpu-node-1", "labels": {"kubernetes.io/hostname": "gpu-node-1"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}},
        }));
        let observed = Observed::read(
            &stores.stores,
            &stores.stores.pods.state(),
            &Assumed::default(),
        );
        assert_eq!(observed.nodes.len(), 1);
        assert_eq!(observed.queues.len(), 3);
        assert_eq!(observed.pods.len(), 1);
        assert_eq!(observed.unreadable_pods.len(), 1);
        let (pod, error) = &observed.unreadable_pods[0];
        assert_eq!(pod.metadata.name.as_deref(), Some("malformed"));
        assert!(error.contains("nvidia.com/gpu"), "{error}");
        assert_eq!(observed.invalid_queues.len(), 1);
        let broken = &observed.invalid_queues[0];
        assert_eq!(broken.name, "broken");
        assert_eq!(broken.generation, Some(4));
        assert!(
            broken.error.to_string().contains("spec: cannot be read"),
            "{}",
            broken.error
        );
    }
}
