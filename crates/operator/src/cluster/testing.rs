//! Stores filled by hand, for tests of the modules that read them.

use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod},
    policy::v1::PodDisruptionBudget,
};
use kube::runtime::{
    reflector::{self, store::Writer},
    watcher,
};

use serde_json::json;

use super::devices::{DeviceStores, DeviceWriters};
use super::stores::{Signals, StoredQueue, Stores};

/// Stores with their writers; `add_*` puts an object in as a watch event would.
pub(crate) struct TestStores {
    pub stores: Stores,
    queues: Writer<StoredQueue>,
    pods: Writer<Pod>,
    nodes: Writer<Node>,
    namespaces: Writer<Namespace>,
    budgets: Writer<PodDisruptionBudget>,
    pub devices: DeviceWriters,
    _signals: Signals,
}

impl TestStores {
    pub(crate) fn new() -> Self {
        let (signals, changes, urgent_changes) = Signals::new();
        let (queues, queue_writer) = reflector::store();
        let (pods, pod_writer) = reflector::store();
        let (nodes, node_writer) = reflector::store();
        let (namespaces, namespace_writer) = reflector::store();
        let (budgets, budget_writer) = reflector::store();
        let (devices, device_writers) = DeviceStores::for_tests();
        Self {
            stores: Stores {
                queues,
                pods,
                nodes,
                namespaces,
                budgets,
                devices,
                changes,
                urgent_changes,
                live: Default::default(),
            },
            queues: queue_writer,
            pods: pod_writer,
            nodes: node_writer,
            namespaces: namespace_writer,
            budgets: budget_writer,
            devices: device_writers,
            _signals: signals,
        }
    }

    pub(crate) fn add_queue(&mut self, queue: serde_json::Value) {
        let queue: StoredQueue = serde_json::from_value(queue).unwrap();
        self.queues
            .apply_watcher_event(&watcher::Event::Apply(queue));
    }

    pub(crate) fn add_pod(&mut self, pod: serde_json::Value) {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        self.pods.apply_watcher_event(&watcher::Event::Apply(pod));
    }

    pub(crate) fn add_node(&mut self, node: serde_json::Value) {
        let node: Node = serde_json::from_value(node).unwrap();
        self.nodes.apply_watcher_event(&watcher::Event::Apply(node));
    }

    /// The budgets' initial list, empty: the store is ready.
    pub(crate) fn budgets_listed(&mut self) {
        self.budgets.apply_watcher_event(&watcher::Event::InitDone);
    }

    pub(crate) fn add_budget(&mut self, budget: serde_json::Value) {
        let budget: PodDisruptionBudget = serde_json::from_value(budget).unwrap();
        self.budgets
            .apply_watcher_event(&watcher::Event::Apply(budget));
    }

    pub(crate) fn add_namespace(&mut self, namespace: serde_json::Value) {
        let namespace: Namespace = serde_json::from_value(namespace).unwrap();
        self.namespaces
            .apply_watcher_event(&watcher::Event::Apply(namespace));
    }
}

/// A GpuQueue with 8 guaranteed and 8 burstable GPUs, claiming `namespaces` (and, with a
/// `selector`, the namespaces it matches).
pub(crate) fn queue(
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

/// A pod "p" (uid "u") in `namespace`, with a GPU limit when `gpus` is given.
pub(crate) fn gpu_pod(namespace: &str, gpus: Option<u32>) -> Pod {
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

/// Queues "online", "batch" (also claiming "shared") and "labs" (claiming "shared" and, by
/// label, "lab-1").
pub(crate) fn claiming_stores() -> TestStores {
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
