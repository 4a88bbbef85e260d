//! The webhook's policy answered from the cluster: which queue manages a pod (the core's
//! rules over the stores), and whether the leader admits it at its creation.

use gpuqueue_api::v1alpha1::GpuQueue;
use gpuqueue_core::model::{
    Claim, Namespace, Queue, claim_of,
    dra::{Asks, DeviceClasses, asks},
};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;

use super::mutate::GatePolicy;
use crate::{
    admission::{
        at_creation::{AtCreation, CreationAdmission, Gate},
        metrics::{AdmissionMetrics, Outcome},
    },
    clock,
    cluster::stores::Stores,
};

/// The webhook's policy, answered from the stores by the core's rules: a pod is managed when
/// it asks for GPUs (by name, through claims, or by an extended resource a DeviceClass in the
/// store backs) and a queue claims its namespace. A namespace that several
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
        if asks(pod, &|| self.classes()) == Asks::Nothing {
            return None;
        }
        self.claiming_queue(pod)
    }

    fn claiming_queue(&self, pod: &Pod) -> Option<String> {
        let namespace = pod.metadata.namespace.clone()?;
        let stored = self.stores.queues.state();
        let queues: Vec<Queue> = stored
            .iter()
            .filter_map(|stored| {
                let queue: &GpuQueue = stored.0.as_ref().ok()?;
                Queue::from_api(queue).ok()
            })
            .collect();
        let labels = self
            .stores
            .namespaces
            .get(&ObjectRef::new(&namespace))
            .map_or_else(|| Namespace::new(&namespace), |ns| Namespace::from_k8s(&ns));
        match claim_of(&queues, &labels) {
            Claim::Queue(queue) => Some(queue),
            Claim::Conflict(queues) => Some(queues.join(",")),
            Claim::Unclaimed => None,
        }
    }

    fn admit_at_creation(&self, pod: &Pod) -> Result<CreationAdmission, Gate> {
        let admitted = self.at_creation.admit(pod, clock::now())?;
        self.metrics
            .decided(&admitted.queue, Outcome::admitted(admitted.admitted_as));
        self.metrics.admitted_after(0.0);
        tracing::info!(namespace = pod.metadata.namespace.as_deref().unwrap_or_default(),
            queue = %admitted.queue, node = %admitted.node_pin, admitted_as = %admitted.admitted_as,
            token = %admitted.token, "admitted at creation");
        Ok(admitted)
    }

    fn gated_undecided(&self) {
        self.at_creation.gated_undecided(clock::now());
    }

    fn through_dra(&self, pod: &Pod) -> bool {
        asks(pod, &|| self.classes()) == Asks::ThroughDra
    }
}

impl StoreGatePolicy {
    fn classes(&self) -> DeviceClasses {
        let classes = self.stores.devices.classes.state();
        DeviceClasses::from_k8s(classes.iter().map(AsRef::as_ref))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use gpuqueue_core::model::is_gpu_pod;
    use kube::runtime::watcher;

    use super::*;
    use crate::{
        cluster::testing::{claiming_stores as stores, gpu_pod as pod},
        webhook::{metrics::WebhookResult, mutate},
    };

    #[test]
    fn only_pods_the_core_models_are_kept() {
        assert!(is_gpu_pod(&pod("batch", Some(1))));
        assert!(!is_gpu_pod(&pod("batch", None)));
        let mut finished = pod("batch", Some(1));
        finished.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
        assert!(!is_gpu_pod(&finished));
    }

    /// The policy of a standby (it never admits at creation).
    fn policy(stores: Stores) -> StoreGatePolicy {
        let metrics = AdmissionMetrics::register(&mut crate::metrics::registry());
        StoreGatePolicy::new(stores, AtCreation::new(true), metrics)
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
    fn any_pod_of_a_claimed_namespace_has_its_claiming_queue() {
        let policy = policy(stores().stores);
        assert_eq!(
            policy.claiming_queue(&pod("online", None)).as_deref(),
            Some("online")
        );
        assert_eq!(policy.claiming_queue(&pod("elsewhere", None)), None);
    }

    /// A pod in `online` asking for `limits`, as the API server reviews its creation.
    fn review_of(limits: &serde_json::Value) -> kube::core::admission::AdmissionRequest<Pod> {
        let mut pod = serde_json::to_value(pod("online", None)).unwrap();
        pod["spec"]["containers"][0]["resources"] = json!({ "limits": limits });
        serde_json::from_value(json!({
            "uid": "0b5f1b6e-1111-2222-3333-444455556666",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "online", "operation": "CREATE", "userInfo": {}, "object": pod,
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_asking_for_a_device_class_by_name_is_gated_in_a_claimed_namespace() {
        let mut stores = stores();
        let class = serde_json::from_value(json!({"metadata": {"name": "accel.example.com"},
            "spec": {"extendedResourceName": "example.com/gpu"}}))
        .unwrap();
        stores
            .devices
            .classes
            .apply_watcher_event(&watcher::Event::Apply(class));
        let policy = policy(stores.stores);
        let implicit = json!({"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "8"});
        for limits in [implicit, json!({"example.com/gpu": "8"})] {
            let answer = mutate::answer(&review_of(&limits), &policy);
            assert_eq!(answer.result, WebhookResult::Gated, "{limits}");
            assert_eq!(answer.queue.as_deref(), Some("online"));
        }
        // An extended resource no class declares is a device plugin's: left alone.
        let answer = mutate::answer(&review_of(&json!({"example.com/nic": "1"})), &policy);
        assert_eq!(answer.result, WebhookResult::NotManaged);
    }

    #[test]
    fn a_namespace_claimed_twice_is_gated_under_both_names() {
        let policy = policy(stores().stores);
        assert_eq!(
            policy.managing_queue(&pod("shared", Some(1))).as_deref(),
            Some("batch,labs")
        );
    }
}
