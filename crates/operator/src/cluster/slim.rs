//! What the stores keep of each object: only what some reader here uses. At 10,000 pods the
//! pod store is most of the operator's memory, and most of a pod's bytes (its containers'
//! environment, probes and mounts, its volumes, its container statuses) are never read:
//! the core reads requests, placement rules and tolerations, the gate, phase and conditions; the
//! executor the pod's addresses, owners and grace period; the writes patch only the gate, the
//! node selector and annotations (JSON patches of those paths, never a whole object).

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::Resource;

/// The annotation `kubectl apply` writes: a full copy of the object, never read here.
pub(super) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops `managedFields` and the last-applied copy: every object.
pub fn strip_metadata<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// A pod as the pod store keeps it: its metadata stripped, and of its spec and status only
/// what is read (resources and restart policy of each container, placement rules and
/// tolerations, gate, priority, grace period, host network; phase, conditions, start time and
/// addresses).
pub fn slim_pod(pod: &mut Pod) {
    strip_metadata(pod);
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes = None;
        spec.ephemeral_containers = None;
        spec.security_context = None;
        spec.image_pull_secrets = None;
        spec.host_aliases = None;
        spec.dns_config = None;
        spec.containers.iter_mut().for_each(slim_container);
        spec.init_containers
            .iter_mut()
            .flatten()
            .for_each(slim_container);
    }
    if let Some(status) = pod.status.as_mut() {
        status.container_statuses = None;
        status.init_container_statuses = None;
        status.ephemeral_container_statuses = None;
    }
}

/// A container's name, resources and restart policy (a sidecar counts in the pod's requests).
fn slim_container(container: &mut Container) {
    *container = Container {
        name: std::mem::take(&mut container.name),
        resources: container.resources.take(),
        restart_policy: container.restart_policy.take(),
        ..Container::default()
    };
}

#[cfg(test)]
mod tests {
    use gpuqueue_core::model;
    use serde_json::json;

    use super::*;

    /// A GPU pod as a real workload has it: environment, probes, mounts, volumes, tolerations,
    /// container statuses, a sidecar, placement rules and the gate.
    fn full_pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "vllm-0", "namespace": "online", "uid": "u-1",
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "annotations": {LAST_APPLIED: "{...}", "gpuqueue.io/queue": "online"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "name": "vllm", "uid": "s-1", "controller": true}],
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            },
            "spec": {
                "priority": 7,
                "hostNetwork": false,
                "terminationGracePeriodSeconds": 45,
                "nodeSelector": {"nvidia.com/gpu.product": "H100"},
                "schedulingGates": [{"name": gpuqueue_api::ADMISSION_GATE}],
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                "volumes": [{"name": "cache", "emptyDir": {}}],
                "initContainers": [{"name": "proxy", "image": "envoy", "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "500m"}}}],
                "containers": [{
                    "name": "vllm", "image": "vllm/vllm-openai:v0.11",
                    "args": ["--model", "x"], "env": [{"name": "HF_HOME", "value": "/cache"}],
                    "ports": [{"containerPort": 8000}],
                    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}},
                    "resources": {"limits": {"nvidia.com/gpu": "2"},
                        "requests": {"cpu": "8", "memory": "64Gi"}},
                }],
            },
            "status": {
                "phase": "Pending", "podIP": "10.0.0.7", "hostIP": "10.0.1.1",
                "startTime": "2026-12-01T10:00:05Z",
                "conditions": [{"type": "PodScheduled", "status": "False",
                    "reason": "Unschedulable"}],
                "containerStatuses": [{"name": "vllm", "image": "vllm", "imageID": "",
                    "ready": false, "restartCount": 0}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_core_reads_a_slim_pod_as_it_reads_the_full_one() {
        let full = full_pod();
        let mut slim = full.clone();
        slim_pod(&mut slim);
        assert_eq!(model::Pod::from_k8s(&slim), model::Pod::from_k8s(&full));
        assert!(
            serde_json::to_vec(&slim).unwrap().len() < serde_json::to_vec(&full).unwrap().len()
        );
    }

    #[test]
    fn a_slim_pod_keeps_what_the_executor_and_the_writes_read() {
        let mut pod = full_pod();
        slim_pod(&mut pod);
        let (spec, status) = (pod.spec.as_ref().unwrap(), pod.status.as_ref().unwrap());
        assert_eq!(spec.termination_grace_period_seconds, Some(45));
        assert_eq!(spec.host_network, Some(false));
        assert_eq!(spec.tolerations.as_ref().map(Vec::len), Some(1));
        assert!(spec.scheduling_gates.is_some() && spec.node_selector.is_some());
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.7"));
        assert_eq!(status.host_ip.as_deref(), Some("10.0.1.1"));
        assert_eq!(pod.metadata.owner_references.as_ref().unwrap().len(), 1);
        let annotations = pod.metadata.annotations.as_ref().unwrap();
        assert!(annotations.contains_key("gpuqueue.io/queue"));
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert!(pod.metadata.managed_fields.is_none());
        assert!(spec.volumes.is_none() && status.container_statuses.is_none());
        assert!(spec.containers[0].env.is_none());
    }
}
