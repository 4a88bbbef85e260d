//! Converting Kubernetes objects into the model: good objects read fully, bad ones become
//! typed errors that name the field and the rule, optional oddities become warnings.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use gpuqueue_api::v1alpha1::{CheckpointDriver, GpuQueue};
use gpuqueue_core::model::{
    Assignment, GpuRequest, Namespace, Node, Pod, PodState, Queue, ReclaimRole, is_held_owner,
};
use gpuqueue_core::quantity::{Milli, ResourceName};
use k8s_openapi::api::core::v1 as k8s;
use serde_json::json;

fn queue(spec: &serde_json::Value) -> GpuQueue {
    serde_json::from_value(json!({
        "apiVersion": "gpuqueue.io/v1alpha1",
        "kind": "GpuQueue",
        "metadata": {"name": "team-a", "generation": 3},
        "spec": spec,
    }))
    .unwrap()
}

#[test]
fn a_queue_reads_into_milli_quotas_and_durations() {
    let q = Queue::from_api(&queue(&json!({
        "namespaces": ["team-a"],
        "namespaceSelector": {"matchLabels": {"tenant": "a"}},
        "resources": [
            {"name": "nvidia.com/mig-1g.10gb", "guaranteed": 7},
            {"name": "nvidia.com/gpu", "guaranteed": 8, "burstable": 8, "lendingLimit": 6, "gpuMemory": "640Gi"}
        ],
        "weight": 3,
        "reclaim": {
            "budget": "3s",
            "checkpoint": {"driver": "vllm", "port": 8000, "timeout": "1500ms"},
            "minBorrowDuration": "30s"
        }
    })))
    .unwrap();
    assert_eq!(q.name, "team-a");
    assert_eq!(q.generation, Some(3));
    assert_eq!(q.weight, 3);
    let gpu = q.quota_of(&ResourceName::nvidia_gpu()).unwrap();
    assert_eq!(gpu.guaranteed, Milli(8000));
    assert_eq!(gpu.ceiling(), Milli(16000));
    assert_eq!(gpu.lendable(), Milli(6000));
    assert_eq!(gpu.gpu_memory_mib, Some(640 * 1024));
    assert_eq!(
        q.quotas[0].resource.as_str(),
        "nvidia.com/gpu",
        "sorted by name"
    );
    assert_eq!(q.reclaim.budget, Duration::from_secs(3));
    assert_eq!(q.reclaim.checkpoint.driver, CheckpointDriver::Vllm);
    assert_eq!(q.reclaim.checkpoint.timeout, Duration::from_millis(1500));
    assert_eq!(q.reclaim.min_borrow, Some(Duration::from_secs(30)));
    assert!(
        q.claims(
            "other",
            &[("tenant".to_string(), "a".to_string())]
                .into_iter()
                .collect()
        )
    );
    assert!(!q.claims("other", &gpuqueue_core::model::selector::Labels::new()));
}

#[test]
fn a_bad_queue_lists_every_broken_rule_with_its_field() {
    let err = Queue::from_api(&queue(&json!({
        "namespaces": ["Team_A", "b", "b"],
        "resources": [
            {"name": "nvidia.com/gpu", "guaranteed": 2, "lendingLimit": 4},
            {"name": "nvidia.com/gpu", "guaranteed": -1},
            {"name": "gpu", "guaranteed": 1, "gpuMemory": "lots"}
        ],
        "weight": 0,
        "reclaim": {"budget": "1s", "checkpoint": {"driver": "http", "timeout": "2s"}, "minBorrowDuration": "-5s"}
    })))
    .unwrap_err();
    let fields: Vec<&str> = err.problems.iter().map(|p| p.field.as_str()).collect();
    for expected in [
        "spec.namespaces[0]",
        "spec.namespaces[2]",
        "spec.resources[0].lendingLimit",
        "spec.resources[1].name",
        "spec.resources[1].guaranteed",
        "spec.resources[2].name",
        "spec.resources[2].gpuMemory",
        "spec.weight",
        "spec.reclaim.minBorrowDuration",
        "spec.reclaim.budget",
        "spec.reclaim.checkpoint.port",
        "spec.reclaim.checkpoint.path",
    ] {
        assert!(fields.contains(&expected), "{expected} missing from {err}");
    }
    let message = err.to_string();
    assert!(
        message.starts_with("GpuQueue team-a has an invalid spec: "),
        "{message}"
    );
    assert!(
        message.contains("lendingLimit must not exceed guaranteed (4 > 2)"),
        "{message}"
    );
    assert!(
        message.contains("plus reclaim.victimGracePeriodSeconds (1) plus 250ms"),
        "{message}"
    );
}

/// Review finding: the API server's rule compares the budget in whole milliseconds, so it took a
/// checkpoint timeout of 1500.5ms under a 2750ms budget that this check then refused (and its
/// message, dropping the half millisecond, asked to raise the budget to what it was).
#[test]
fn the_budget_is_checked_in_whole_milliseconds_as_the_api_server_checks_it() {
    let with = |budget: &str, timeout: &str| {
        Queue::from_api(&queue(&json!({
            "namespaces": ["team-a"],
            "resources": [{"name": "nvidia.com/gpu", "guaranteed": 1}],
            "reclaim": {"budget": budget, "victimGracePeriodSeconds": 1,
                        "checkpoint": {"driver": "none", "timeout": timeout}}
        })))
    };
    assert!(with("2750ms", "1500500us").is_ok());
    assert!(with("2750ms", "1500.5ms").is_ok());
    let refused = with("2749ms", "1500500us").unwrap_err().to_string();
    assert!(refused.contains("raise the budget to 2750ms"), "{refused}");
}

#[test]
fn gpu_memory_is_refused_from_8ei_as_the_api_server_refuses_it() {
    let with = |memory: &str| {
        Queue::from_api(&queue(&json!({
            "namespaces": ["team-a"],
            "resources": [{"name": "nvidia.com/gpu", "guaranteed": 1, "gpuMemory": memory}]
        })))
    };
    assert!(with("7Ei").is_ok());
    for memory in ["8Ei", "20Ei", "0"] {
        let refused = with(memory).unwrap_err().to_string();
        assert!(refused.contains("below 8Ei"), "{memory}: {refused}");
    }
}

fn node(json: serde_json::Value) -> k8s::Node {
    serde_json::from_value(json).unwrap()
}

fn ready() -> serde_json::Value {
    json!([{"type": "Ready", "status": "True"}])
}

#[test]
fn a_node_reads_its_gpu_pools_models_and_taints() {
    let n = Node::from_k8s(&node(json!({
        "metadata": {"name": "gpu-1", "labels": {
            "kubernetes.io/hostname": "gpu-1-host",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.memory": "81559"
        }},
        "spec": {"taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "4", "nvidia.com/mig-1g.10gb": "7", "example.com/nic": "2"},
            "conditions": ready()
        }
    })))
    .unwrap();
    assert!(n.warnings.is_empty());
    let n = n.value;
    assert!(n.schedulable);
    assert_eq!(n.cpu_milli, 96_000);
    assert_eq!(n.memory_bytes, 1 << 40);
    assert_eq!(n.gpu_model.as_deref(), Some("NVIDIA-H100-80GB-HBM3"));
    assert_eq!(n.hostname(), "gpu-1-host");
    assert_eq!(n.taints.len(), 1);
    assert_eq!(n.pools.len(), 2, "{:?}", n.pools);
    let gpu = n
        .pools
        .iter()
        .find(|p| p.resource.as_str() == "nvidia.com/gpu")
        .unwrap();
    assert_eq!((gpu.devices, gpu.memory_mib), (4, Some(81559)));
    let mig = n
        .pools
        .iter()
        .find(|p| p.resource.as_str() == "nvidia.com/mig-1g.10gb")
        .unwrap();
    assert_eq!((mig.devices, mig.memory_mib), (7, Some(10240)));
}

#[test]
fn a_cordoned_or_unready_node_takes_no_new_pods_and_bad_quantities_are_errors() {
    let cordoned = Node::from_k8s(&node(json!({
        "metadata": {"name": "n"},
        "spec": {"unschedulable": true},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": ready()}
    })))
    .unwrap();
    assert!(!cordoned.value.schedulable);
    let unready = Node::from_k8s(&node(json!({
        "metadata": {"name": "n"},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "Unknown"}]}
    })))
    .unwrap();
    assert!(!unready.value.schedulable);
    let bad = Node::from_k8s(&node(json!({
        "metadata": {"name": "n"},
        "status": {"allocatable": {"nvidia.com/gpu": "1500m"}}
    })))
    .unwrap_err();
    assert_eq!(bad.field, "status.allocatable[nvidia.com/gpu]");
    assert!(bad.to_string().contains("whole numbers"), "{bad}");
    let label = Node::from_k8s(&node(json!({
        "metadata": {"name": "n", "labels": {"nvidia.com/gpu.memory": "80GB"}},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": ready()}
    })))
    .unwrap();
    assert_eq!(label.value.pools[0].memory_mib, None);
    assert!(
        label.warnings[0].contains("nvidia.com/gpu.memory"),
        "{:?}",
        label.warnings
    );
}

fn pod(json: serde_json::Value) -> k8s::Pod {
    serde_json::from_value(json).unwrap()
}

#[test]
fn a_gated_pod_is_pending_with_its_requests_and_hints() {
    let p = Pod::from_k8s(&pod(json!({
        "metadata": {
            "name": "llm-0", "namespace": "team-a",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {"gpuqueue.io/checkpoint-cost": "40"}
        },
        "spec": {
            "priority": 100,
            "schedulingGates": [{"name": "gpuqueue.io/admission"}],
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "initContainers": [{"name": "warm", "resources": {"requests": {"cpu": "8"}}}],
            "containers": [
                {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "4", "memory": "32Gi"}}},
                {"name": "sidecar", "resources": {"requests": {"cpu": "500m"}}}
            ]
        }
    })))
    .unwrap()
    .unwrap()
    .value;
    assert_eq!(p.key.to_string(), "team-a/llm-0");
    assert_eq!(p.state, PodState::Pending);
    assert_eq!(p.priority, 100);
    assert_eq!(
        p.requests.cpu_milli, 8000,
        "the init container's 8 CPUs exceed 4.5"
    );
    assert_eq!(p.requests.memory_bytes, 32 << 30);
    assert_eq!(
        p.requests.gpus,
        vec![GpuRequest::devices("nvidia.com/gpu", 2)],
        "a limit is the request"
    );
    assert_eq!(p.gpu_models, vec!["NVIDIA-H100-80GB-HBM3".to_string()]);
    assert_eq!(p.checkpoint_cost, 40);
    assert!(p.node_rules.is_some());
}

#[test]
fn an_admitted_pod_knows_its_node_and_reclaim_part() {
    let p = Pod::from_k8s(&pod(json!({
        "metadata": {
            "name": "owner", "namespace": "a", "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {
                "gpuqueue.io/admitted-at": "2026-01-01T00:00:05Z",
                "gpuqueue.io/reclaim-id": "r-1", "gpuqueue.io/reclaim-role": "owner",
                "gpuqueue.io/checkpoint-cost": "much"
            }
        },
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "gpu-3"},
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}]
        }
    })))
    .unwrap()
    .unwrap();
    assert_eq!(
        p.value.state,
        PodState::Admitted(Assignment {
            node: Some("gpu-3".into()),
            bound: false,
            terminating: false
        })
    );
    assert_eq!(
        p.value.admitted_at.unwrap().to_string(),
        "2026-01-01T00:00:05Z"
    );
    assert_eq!(p.value.reclaim.as_ref().unwrap().role, ReclaimRole::Owner);
    assert_eq!(p.value.checkpoint_cost, 0);
    assert!(
        p.warnings[0].contains("checkpoint-cost"),
        "{:?}",
        p.warnings
    );
}

#[test]
fn a_checkpoint_cost_above_the_maximum_is_read_as_the_maximum() {
    // Written where the webhook did not lower it (an unclaimed namespace, the webhook down):
    // two such victims would overflow the sum a plan ranks by.
    let p = Pod::from_k8s(&pod(json!({
        "metadata": {
            "name": "p", "namespace": "a", "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {"gpuqueue.io/checkpoint-cost": "18446744073709551615"}
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    })))
    .unwrap()
    .unwrap();
    assert_eq!(p.value.checkpoint_cost, 1000);
    assert_eq!(
        p.warnings,
        [
            "pod a/p: annotation gpuqueue.io/checkpoint-cost=\"18446744073709551615\" is above 1000; read as 1000"
        ]
    );
}

#[test]
fn an_owner_held_at_the_gate_holds_its_room_and_a_gated_pod_without_all_its_marks_waits() {
    let held = |annotations: serde_json::Value, node_selector: serde_json::Value| {
        pod(json!({
            "metadata": {
                "name": "owner", "namespace": "a", "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": annotations
            },
            "spec": {
                "priority": 1000,
                "schedulingGates": [{"name": "gpuqueue.io/admission"}],
                "nodeSelector": node_selector,
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            }
        }))
    };
    let marks = json!({
        "gpuqueue.io/admitted-at": "2026-01-01T00:00:05Z",
        "gpuqueue.io/reclaim-id": "r-1", "gpuqueue.io/reclaim-role": "owner"
    });
    let pinned = json!({"kubernetes.io/hostname": "gpu-3"});
    let mut owner = held(marks.clone(), pinned.clone());
    assert!(is_held_owner(&owner));
    let p = Pod::from_k8s(&owner).unwrap().unwrap().value;
    assert!(
        p.preempts,
        "no preemptionPolicy: kube-scheduler's default, PreemptLowerPriority"
    );
    owner.spec.as_mut().unwrap().preemption_policy = Some("Never".into());
    assert!(!Pod::from_k8s(&owner).unwrap().unwrap().value.preempts);
    assert_eq!(
        p.state,
        PodState::Admitted(Assignment {
            node: Some("gpu-3".into()),
            bound: false,
            terminating: false
        })
    );
    assert!(!p.unadmitted);

    // Not pinned, not admitted, a victim's mark, or no reclaim named (nothing the operator
    // could vouch for): a gated pod like any other.
    let nameless = json!({
        "gpuqueue.io/admitted-at": "2026-01-01T00:00:05Z", "gpuqueue.io/reclaim-role": "owner"
    });
    let victim = json!({
        "gpuqueue.io/admitted-at": "2026-01-01T00:00:05Z",
        "gpuqueue.io/reclaim-id": "r-1", "gpuqueue.io/reclaim-role": "victim"
    });
    let unadmitted = json!({"gpuqueue.io/reclaim-id": "r-1", "gpuqueue.io/reclaim-role": "owner"});
    for waiting in [
        held(marks, json!({"nvidia.com/gpu.product": "H100"})),
        held(unadmitted, pinned.clone()),
        held(nameless, pinned.clone()),
        held(victim, pinned),
    ] {
        assert!(!is_held_owner(&waiting));
        let p = Pod::from_k8s(&waiting).unwrap().unwrap().value;
        assert_eq!(p.state, PodState::Pending);
    }
}

#[test]
fn a_pod_asking_for_a_device_class_by_name_is_a_gpu_pod() {
    // kube-scheduler allocates 8 devices of the class through a claim it makes: the pod is
    // read, and charged once the class store says for what.
    let by_class = pod(json!({
        "metadata": {"name": "by-class", "namespace": "a"},
        "spec": {"containers": [{"name": "c", "resources": {"limits":
            {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "8"}}}]}
    }));
    assert!(Pod::from_k8s(&by_class).unwrap().is_some());
    assert!(gpuqueue_core::model::is_gpu_pod(&by_class));
}

#[test]
fn finished_and_cpu_only_pods_are_ignored_and_fractional_gpus_refused() {
    let done = pod(json!({
        "metadata": {"name": "done", "namespace": "a"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Succeeded"}
    }));
    assert!(Pod::from_k8s(&done).unwrap().is_none());
    let cpu = pod(json!({
        "metadata": {"name": "cpu", "namespace": "a"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    }));
    assert!(Pod::from_k8s(&cpu).unwrap().is_none());
    let half = pod(json!({
        "metadata": {"name": "half", "namespace": "a"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "0.5"}}}]}
    }));
    let err = Pod::from_k8s(&half).unwrap_err();
    assert_eq!(
        err.field,
        "spec.containers[0].resources.requests[nvidia.com/gpu]"
    );
    assert!(err.to_string().starts_with("pod a/half: "), "{err}");
    // More devices than any node can have (summed over containers: 2 × 65 > 128) is an error
    // naming the field, not a pod the snapshot silently leaves out.
    let huge = pod(json!({
        "metadata": {"name": "huge", "namespace": "a"},
        "spec": {"containers": [
            {"name": "a", "resources": {"requests": {"nvidia.com/gpu": "65"}}},
            {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "65"}}}
        ]}
    }));
    let err = Pod::from_k8s(&huge).unwrap_err();
    assert_eq!(
        err.field,
        "spec.containers.resources.requests[nvidia.com/gpu]"
    );
    assert!(
        err.rule
            .contains("130 devices is more than any node has (at most 128)"),
        "{err}"
    );
    let most = pod(json!({
        "metadata": {"name": "most", "namespace": "a"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "128"}}}]}
    }));
    assert!(Pod::from_k8s(&most).unwrap().is_some());
    let bad_affinity = pod(json!({
        "metadata": {"name": "aff", "namespace": "a"},
        "spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["x"]}]}
            ]}}},
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]
        }
    }));
    let err = Pod::from_k8s(&bad_affinity).unwrap_err();
    assert!(
        err.field
            .ends_with("nodeSelectorTerms[0].matchExpressions[0]"),
        "{err}"
    );
}

#[test]
fn a_namespace_keeps_its_labels() {
    let ns: k8s::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "team-a", "labels": {"tenant": "a"}}}))
            .unwrap();
    assert_eq!(
        Namespace::from_k8s(&ns),
        Namespace::new("team-a").label("tenant", "a")
    );
}

#[test]
fn a_pod_holding_quota_without_an_admission_record_is_unadmitted() {
    let read = |annotations: serde_json::Value, gated: bool, status: serde_json::Value| {
        let gates = if gated {
            json!([{"name": "gpuqueue.io/admission"}])
        } else {
            json!([])
        };
        Pod::from_k8s(&pod(json!({
            "metadata": {
                "name": "p", "namespace": "team-a",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": annotations
            },
            "spec": {
                "schedulingGates": gates,
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            },
            "status": status
        })))
        .unwrap()
        .unwrap()
        .value
    };
    let none = json!({});
    assert!(read(none.clone(), false, none.clone()).unadmitted);
    assert!(
        !read(none.clone(), true, none.clone()).unadmitted,
        "a gated pod holds nothing"
    );
    assert!(
        !read(
            json!({"gpuqueue.io/admitted-at": "2026-01-01T00:00:01Z"}),
            false,
            none.clone()
        )
        .unadmitted
    );
    assert!(
        !read(
            json!({"gpuqueue.io/admitted-at-creation": "token"}),
            false,
            none.clone()
        )
        .unadmitted
    );

    let unschedulable = json!({"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "lastTransitionTime": "2026-01-01T00:01:00Z"
    }]});
    assert_eq!(
        read(none.clone(), false, unschedulable).unschedulable_since,
        Some("2026-01-01T00:01:00Z".parse().unwrap())
    );
    let gated = json!({"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
        "lastTransitionTime": "2026-01-01T00:01:00Z"
    }]});
    assert_eq!(read(none.clone(), true, gated).unschedulable_since, None);
}
