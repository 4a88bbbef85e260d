//! Reading the stores into the core's model: the "dereference" step of the admission pass, and
//! the questions the webhook and the pod store ask. Every rule comes from `gpuqueue-core`
//! (what a GPU pod is, which queue claims a namespace, what a valid queue is); this module only
//! gathers the objects and converts them.

use std::{collections::HashMap, sync::Arc};

use gpuqueue_api::{
    ADMISSION_GATE,
    v1alpha1::{GpuQueue, GpuQueueStatus},
};
use gpuqueue_core::{
    Snapshot,
    model::{self, Converted, FieldError, PodError, QueueError},
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

/// Whether `pod` waits at gpuqueue's scheduling gate.
pub fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.scheduling_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|gate| gate.name == ADMISSION_GATE))
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

/// What reading one pod gave.
type PodModel = Result<Option<Converted<model::Pod>>, PodError>;

/// Pods as the core models them, kept from pass to pass: every pass reads every pod, but in a
/// burst each pass finds only a few changed, and converting them all again was most of a
/// pass's time. An entry is reused while the store holds the very same object (the reflector
/// stores a new one for every change); pods seen through [`Assumed`] are converted afresh.
#[derive(Debug, Default)]
pub struct PodModels(HashMap<String, (Arc<Pod>, PodModel)>);

impl PodModels {
    /// Reads `stored` as `view` shows it, from the last pass's entry when it is the same object.
    /// `next` collects the entries the next pass may reuse.
    fn read(&mut self, next: &mut Self, stored: &Arc<Pod>, view: &Pod) -> PodModel {
        let same_object = std::ptr::eq(view, stored.as_ref());
        let Some(uid) = stored.metadata.uid.clone().filter(|_| same_object) else {
            return model::Pod::from_k8s(view);
        };
        let entry = match self.0.remove(&uid) {
            Some(entry) if Arc::ptr_eq(&entry.0, stored) => entry,
            _ => (stored.clone(), model::Pod::from_k8s(stored)),
        };
        let model = entry.1.clone();
        next.0.insert(uid, entry);
        model
    }
}

impl Observed {
    /// Reads every store; the pods are `pods`, the pod store's state the caller read once for
    /// the whole pass (a second read could show a pod the caller's bookkeeping has not seen).
    /// Pods are seen through `assumed`, so admissions the store has not shown yet already hold
    /// their GPUs. `models` are the last pass's conversions, replaced by this pass's.
    pub fn read(
        stores: &Stores,
        pods: &[Arc<Pod>],
        assumed: &Assumed,
        models: &mut PodModels,
    ) -> Self {
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
        let mut next = PodModels::default();
        for stored in pods {
            match models.read(&mut next, stored, assumed.view(stored)) {
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
        *models = next;
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
    fn a_pod_is_converted_again_only_when_the_store_holds_a_new_object() {
        let gpus = |pod: &PodModel| {
            pod.as_ref()
                .unwrap()
                .as_ref()
                .unwrap()
                .value
                .requests
                .gpus
                .clone()
        };
        let first = Arc::new(pod("batch", Some(1)));
        let mut models = PodModels::default();
        let mut next = PodModels::default();
        let read = models.read(&mut next, &first, &first);
        assert_eq!(read, model::Pod::from_k8s(&first));
        models = next;

        // The same object: the entry is reused (shown by planting a different one).
        let planted = model::Pod::from_k8s(&pod("batch", Some(3)));
        models.0.get_mut("u").unwrap().1 = planted.clone();
        let mut next = PodModels::default();
        assert_eq!(
            gpus(&models.read(&mut next, &first, &first)),
            gpus(&planted)
        );
        models = next;

        // A new object for the same pod (the store saw a change): converted again.
        let changed = Arc::new(pod("batch", Some(2)));
        let mut next = PodModels::default();
        let read = models.read(&mut next, &changed, &changed);
        assert_eq!(read, model::Pod::from_k8s(&changed));
        // Seen through an assumed admission: the view is read, and nothing is kept.
        let mut kept = PodModels::default();
        let view = pod("batch", Some(4));
        assert_eq!(
            models.read(&mut kept, &changed, &view),
            model::Pod::from_k8s(&view)
        );
        assert!(kept.0.is_empty());
        // Only the pods of this pass are carried to the next.
        assert_eq!(next.0.len(), 1);
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
            &mut PodModels::default(),
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
