//! GPU shapes: time-sliced replicas, HAMi memory and compute, MIG slices. How each is read from
//! Kubernetes objects, counted against a queue (devices, `gpuMemory`, `gpuCores`) and placed on
//! the devices with room.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::world::{GPU, at, build, pending, queue, running};
use gpuqueue_core::Policy;
use gpuqueue_core::Snapshot;
use gpuqueue_core::admission::{Decision, admission_cycle, decide};
use gpuqueue_core::model::{
    Assignment, DeviceMemory, DeviceSet, GpuPool, GpuRequest, Node, Pod, PodKey, PodState,
    ReplicaStrategy, Requests, Sharing,
};
use gpuqueue_core::quantity::{Milli, ResourceName};
use k8s_openapi::api::core::v1 as k8s;
use proptest::prelude::*;

fn gpu_node(name: &str, pool: GpuPool) -> Node {
    Node::new(name)
        .cpu_milli(128_000)
        .memory_bytes(1 << 40)
        .pool(pool)
}

fn time_sliced(devices: u32, replicas: u32) -> GpuPool {
    GpuPool {
        memory_mib: Some(16_384),
        sharing: Sharing::Replicas {
            replicas,
            strategy: ReplicaStrategy::TimeSlicing,
        },
        ..GpuPool::exclusive(GPU, devices)
    }
}

fn hami(devices: u32, memory_mib: u64) -> GpuPool {
    GpuPool {
        memory_mib: Some(memory_mib),
        sharing: Sharing::Hami { split: 10 },
        ..GpuPool::exclusive(GPU, devices)
    }
}

fn pod_asking(key: &str, gpu: GpuRequest, created: i64) -> Pod {
    let (ns, name) = key.split_once('/').unwrap();
    Pod::new(
        PodKey::new(ns, name),
        Requests {
            cpu_milli: 100,
            memory_bytes: 1 << 20,
            gpus: vec![gpu],
            quota_only: Vec::new(),
        },
        at(created),
    )
}

fn memory_pod(key: &str, mib: u64, created: i64) -> Pod {
    pod_asking(
        key,
        GpuRequest::devices(GPU, 1).with_memory(DeviceMemory::Mib(mib)),
        created,
    )
}

fn on(mut pod: Pod, node: &str) -> Pod {
    pod.state = PodState::Admitted(Assignment {
        node: Some(node.into()),
        bound: true,
        terminating: false,
    });
    pod.admitted_at = Some(pod.created_at);
    pod
}

fn admitted_nodes(decisions: &[Decision]) -> Vec<String> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Admit(a) => Some(a.placement.node_name.clone()),
            _ => None,
        })
        .collect()
}

fn usage(snapshot: &Snapshot, queue: &str) -> gpuqueue_core::ledger::ResourceUsage {
    let q = snapshot.queue_id(queue).unwrap();
    let gpu = snapshot.resource_id(&GPU.into()).unwrap();
    snapshot.usage_of(q, gpu).cloned().unwrap()
}

#[test]
fn a_time_sliced_node_takes_its_replicas_and_no_more() {
    // One GPU advertised 4 times: 4 sharing pods fit, the fifth waits.
    let pods = (0..5)
        .map(|i| pod_asking(&format!("a/p{i}"), GpuRequest::devices(GPU, 1), i))
        .collect();
    let mut snapshot = build(
        vec![queue("a", 8, 0)],
        vec![gpu_node("ts", time_sliced(1, 4))],
        pods,
    );
    assert_eq!(
        snapshot.capacity(snapshot.resource_id(&GPU.into()).unwrap()),
        Milli::devices(4),
        "quota counts what kube-scheduler counts: each replica"
    );
    let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(100));
    assert_eq!(admitted_nodes(&decisions), vec!["ts"; 4], "{decisions:?}");
    let u = usage(&snapshot, "a");
    assert_eq!(u.allocated, Milli::devices(4));
    assert_eq!(
        u.cores_milli, 1000,
        "four replicas are one device of compute"
    );
    assert_eq!(u.memory_mib, 16_384, "and one device of memory");
}

#[test]
fn a_memory_request_goes_to_a_device_with_that_much_free() {
    // split: two 16 GiB devices with 6 GiB used on each (10 + 10 free); roomy: one 24 GiB.
    let build_with = |roomy: bool| {
        let mut nodes = vec![gpu_node("split", hami(2, 16_384))];
        if roomy {
            nodes.push(gpu_node("roomy", hami(1, 24_576)));
        }
        let on_device = |pod: Pod, device: u16| {
            let mut pod = on(pod, "split");
            pod.devices = vec![DeviceSet {
                resource: GPU.into(),
                devices: vec![device],
            }];
            pod
        };
        let pods = vec![
            on_device(memory_pod("a/x0", 6_144, 0), 0),
            on_device(memory_pod("a/x1", 6_144, 1), 1),
            memory_pod("a/big", 18_432, 5),
        ];
        build(vec![queue("a", 8, 0)], nodes, pods)
    };
    let snapshot = build_with(true);
    let split = snapshot.node_id("split").unwrap();
    assert_eq!(
        snapshot.node_view(split).gpu_free_memory(),
        &[10_240, 10_240],
        "the running pods sit one per device"
    );
    let big = snapshot.pod_id(&PodKey::new("a", "big")).unwrap();
    match decide(&snapshot, big, &Policy::default(), at(10)) {
        Decision::Admit(a) => assert_eq!(a.placement.node_name, "roomy"),
        other => panic!("{other:?}"),
    }
    let snapshot = build_with(false);
    let big = snapshot.pod_id(&PodKey::new("a", "big")).unwrap();
    let Decision::Wait(wait) = decide(&snapshot, big, &Policy::default(), at(10)) else {
        panic!("20 GiB free split 10 + 10 never takes an 18 GiB request");
    };
    assert_eq!(wait.reason.code(), "NoRoom");
    let text = wait.reason.to_string();
    assert!(
        text.contains(
            "no device has the 18432 MiB of GPU memory it asks free (the most on one device is 10240 MiB)"
        ),
        "{text}"
    );
}

#[test]
fn a_memory_request_over_the_queue_memory_cap_waits_naming_memory() {
    let mut a = queue("a", 8, 0);
    a.quotas[0].gpu_memory_mib = Some(16_384);
    let snapshot = build(
        vec![a],
        vec![gpu_node("h", hami(2, 40_960))],
        vec![
            on(memory_pod("a/x", 10_240, 0), "h"),
            memory_pod("a/p", 8_192, 5),
        ],
    );
    let p = snapshot.pod_id(&PodKey::new("a", "p")).unwrap();
    let Decision::Wait(wait) = decide(&snapshot, p, &Policy::default(), at(10)) else {
        panic!("must wait");
    };
    assert_eq!(wait.reason.code(), "GpuMemoryCap");
    let text = wait.reason.to_string();
    assert!(
        text.contains("GPU memory in use is 10240 MiB of its cap of 16384 MiB"),
        "{text}"
    );
}

/// One whole device of `memory_mib`.
fn one_device(name: &str, memory_mib: u64) -> Node {
    gpu_node(
        name,
        GpuPool {
            memory_mib: Some(memory_mib),
            ..GpuPool::exclusive(GPU, 1)
        },
    )
}

fn whole_gpu(key: &str, created: i64) -> Pod {
    pod_asking(key, GpuRequest::devices(GPU, 1), created)
}

#[test]
fn a_reclaim_never_frees_room_the_memory_cap_forbids() {
    // a is within its guarantee of 2 devices, but its one running pod holds its whole 80 GiB
    // memory cap: evicting b's borrower would seat the owner above the cap.
    let mut a = queue("a", 2, 0);
    a.quotas[0].gpu_memory_mib = Some(81_920);
    let snapshot = build(
        vec![a, queue("b", 0, 1)],
        vec![one_device("n1", 81_920), one_device("n2", 81_920)],
        vec![
            on(whole_gpu("a/x", 0), "n1"),
            on(whole_gpu("b/y", 1), "n2"),
            whole_gpu("a/p", 5),
        ],
    );
    let p = snapshot.pod_id(&PodKey::new("a", "p")).unwrap();
    let decision = decide(&snapshot, p, &Policy::default(), at(10));
    let Decision::Wait(wait) = decision else {
        panic!("must wait, not reclaim: {decision:?}");
    };
    assert_eq!(wait.reason.code(), "GpuMemoryCap", "{}", wait.reason);
}

#[test]
fn a_reclaim_frees_room_where_the_memory_cap_allows() {
    // 40 GiB of a's cap are left: the borrower on the 40 GiB device is the one to evict, not
    // the one on the 80 GiB device.
    let mut a = queue("a", 3, 0);
    a.quotas[0].gpu_memory_mib = Some(122_880);
    let snapshot = build(
        vec![a, queue("b", 0, 2)],
        vec![
            one_device("n1", 81_920),
            one_device("n2", 81_920),
            one_device("n3", 40_960),
        ],
        vec![
            on(whole_gpu("a/x", 0), "n1"),
            on(whole_gpu("b/big", 2), "n2"),
            on(whole_gpu("b/small", 1), "n3"),
            whole_gpu("a/p", 5),
        ],
    );
    let p = snapshot.pod_id(&PodKey::new("a", "p")).unwrap();
    let decision = decide(&snapshot, p, &Policy::default(), at(10));
    let Decision::Reclaim(plan) = decision else {
        panic!("must reclaim: {decision:?}");
    };
    assert_eq!(plan.node_name, "n3");
    assert_eq!(plan.victims[0].key, PodKey::new("b", "small"));
}

#[test]
fn with_both_caps_the_one_that_blocks_is_named() {
    let mut a = queue("a", 8, 0);
    a.quotas[0].gpu_memory_mib = Some(1 << 20);
    a.quotas[0].gpu_cores_milli = Some(500);
    let both = |key: &str, t: i64| {
        pod_asking(
            key,
            GpuRequest::devices(GPU, 1)
                .with_memory(DeviceMemory::Mib(1_024))
                .with_cores(30),
            t,
        )
    };
    let snapshot = build(
        vec![a],
        vec![gpu_node("h", hami(2, 40_960))],
        vec![on(both("a/x", 0), "h"), both("a/p", 5)],
    );
    let p = snapshot.pod_id(&PodKey::new("a", "p")).unwrap();
    let Decision::Wait(wait) = decide(&snapshot, p, &Policy::default(), at(10)) else {
        panic!("must wait");
    };
    assert_eq!(wait.reason.code(), "GpuCoresCap", "{}", wait.reason);
}

/// A HAMi node `n` of two 16 GiB H100s, `GPU-a` and `GPU-b`, each split `split` ways.
fn hami_h100s(split: u32) -> Node {
    let device = |uuid: &str| format!("{uuid},{split},16384,100,NVIDIA-H100,0,true:");
    let register = device("GPU-a") + &device("GPU-b");
    let gpus = (2 * split).to_string();
    Node::from_k8s(&k8s_node(
        &[("nvidia.com/gpu", &gpus)],
        &[],
        &[("hami.io/node-nvidia-register", &register)],
    ))
    .unwrap()
    .value
}

/// Pod `a/name`, created at `created`, running on node `n` with one HAMi GPU (`limits` more)
/// on the devices `allocated` names in HAMi's annotation.
fn hami_pod(name: &str, created: &str, allocated: &str, limits: &[(&str, &str)]) -> Arc<Pod> {
    let mut all = serde_json::Map::new();
    all.insert("nvidia.com/gpu".into(), "1".into());
    for (k, v) in limits {
        all.insert((*k).into(), (*v).into());
    }
    let pod: k8s::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "a", "creationTimestamp": created,
            "annotations": {"hami.io/vgpu-devices-allocated": allocated}},
        "spec": {"nodeName": "n", "containers": [{"name": "c", "resources": {"limits": all}}]},
    }))
    .unwrap();
    Arc::new(Pod::from_k8s(&pod).unwrap().unwrap().value)
}

#[test]
fn a_running_hami_pod_sits_on_the_devices_hami_gave_it() {
    let node = hami_h100s(10);
    assert_eq!(node.hami_devices, ["GPU-a", "GPU-b"]);
    let read = |allocated: &str| {
        let gpumem = [("nvidia.com/gpumem", "12000")];
        hami_pod("x", "2026-01-01T00:00:00Z", allocated, &gpumem)
    };
    let mut pods = vec![read("GPU-b,NVIDIA,12000,0:;")];
    assert!(
        gpuqueue_core::model::seat_hami_pods(&mut pods, std::slice::from_ref(&node)).is_empty()
    );
    assert_eq!(
        pods[0].devices,
        [DeviceSet {
            resource: GPU.into(),
            devices: vec![1],
        }]
    );
    // In the snapshot too: device 0 keeps its 16 GiB free.
    let snapshot = build(
        vec![queue("a", 8, 0)],
        vec![node.clone()],
        pods.drain(..).map(Arc::unwrap_or_clone).collect(),
    );
    let n = snapshot.node_id("n").unwrap();
    assert_eq!(snapshot.node_view(n).gpu_free_memory(), &[16_384, 4_384]);
    // A device the node does not have: the lowest free one, and a warning naming the pod.
    let mut pods = vec![read("GPU-zz,NVIDIA,12000,0:;")];
    let warnings = gpuqueue_core::model::seat_hami_pods(&mut pods, std::slice::from_ref(&node));
    assert!(pods[0].devices.is_empty());
    assert!(warnings[0].contains("pod a/x"), "{warnings:?}");
}

/// A tenant can write HAMi's annotation on its own pods: a pod naming a device another pod
/// already fills is seated on a free one, still charged to its queue, and the problem noted;
/// before, it left the snapshot, and its queue's quota with it.
#[test]
fn a_pod_naming_a_full_hami_device_stays_charged() {
    let node = hami_h100s(1);
    let on_a = "GPU-a,NVIDIA,16384,100:;";
    let mut pods = vec![
        hami_pod("first", "2026-01-01T00:00:00Z", on_a, &[]),
        hami_pod("forged", "2026-01-01T00:01:00Z", on_a, &[]),
    ];
    assert!(
        gpuqueue_core::model::seat_hami_pods(&mut pods, std::slice::from_ref(&node)).is_empty()
    );
    let (snapshot, issues) = Snapshot::builder()
        .queues(vec![queue("a", 1, 0)])
        .nodes(vec![node])
        .pods(pods.into_iter().map(Arc::unwrap_or_clone))
        .build();
    assert!(
        issues
            .iter()
            .any(|i| i.to_string().contains("pod a/forged")),
        "{issues:?}"
    );
    assert_eq!(usage(&snapshot, "a").allocated, Milli::devices(2));
    let forged = snapshot.pod_id(&PodKey::new("a", "forged")).unwrap();
    assert_eq!(snapshot.pod_devices(forged)[0].devices, [1]);
}

#[test]
fn a_compute_request_over_the_queue_cores_cap_waits_naming_compute() {
    let mut a = queue("a", 8, 0);
    a.quotas[0].gpu_cores_milli = Some(500);
    let cores = |key: &str, percent: u32, t: i64| {
        pod_asking(key, GpuRequest::devices(GPU, 1).with_cores(percent), t)
    };
    let snapshot = build(
        vec![a],
        vec![gpu_node("h", hami(2, 40_960))],
        vec![on(cores("a/x", 30, 0), "h"), cores("a/p", 30, 5)],
    );
    let p = snapshot.pod_id(&PodKey::new("a", "p")).unwrap();
    let Decision::Wait(wait) = decide(&snapshot, p, &Policy::default(), at(10)) else {
        panic!("must wait");
    };
    assert_eq!(wait.reason.code(), "GpuCoresCap");
    assert!(
        wait.reason
            .to_string()
            .contains("30% of its gpuCores cap of 50%")
    );
}

/// HAMi limits the compute of a pod that asks no `gpucores` to nothing (its default
/// `nvidia.defaultCores: 0`): placed in a slot of its device, it is charged all of the
/// device's compute against `gpuCores`, or ten such pods would use ten devices' worth under a
/// cap of one.
#[test]
fn a_hami_pod_asking_no_compute_is_charged_its_whole_device_against_the_cores_cap() {
    let mut a = queue("a", 8, 0);
    a.quotas[0].gpu_cores_milli = Some(1_500);
    let unlimited = |key: &str, t: i64| pod_asking(key, GpuRequest::devices(GPU, 1), t);
    let snapshot = build(
        vec![a],
        vec![gpu_node("h", hami(2, 40_960))],
        vec![
            on(unlimited("a/x", 0), "h"),
            unlimited("a/p", 5),
            pod_asking("a/q", GpuRequest::devices(GPU, 1).with_cores(30), 6),
        ],
    );
    assert_eq!(usage(&snapshot, "a").cores_milli, 1_000);
    let p = snapshot.pod_id(&PodKey::new("a", "p")).unwrap();
    let Decision::Wait(wait) = decide(&snapshot, p, &Policy::default(), at(10)) else {
        panic!("must wait: 100% in use and 100% more over a cap of 150%");
    };
    assert_eq!(wait.reason.code(), "GpuCoresCap");
    let q = snapshot.pod_id(&PodKey::new("a", "q")).unwrap();
    assert!(
        matches!(
            decide(&snapshot, q, &Policy::default(), at(10)),
            Decision::Admit(_)
        ),
        "30% more fits under the cap"
    );
}

#[test]
fn a_mig_slice_counts_its_profile_memory() {
    let mig = "nvidia.com/mig-3g.40gb";
    let mut a = gpuqueue_core::model::Queue::new("a")
        .namespace("a")
        .quota(gpuqueue_core::model::ResourceQuota::devices(mig, 4, 0));
    a.quotas[0].gpu_memory_mib = Some(100 * 1024);
    let mut snapshot = build(
        vec![a],
        vec![Node::new("m").gpus(mig, 4)],
        (0..3)
            .map(|i| pod_asking(&format!("a/m{i}"), GpuRequest::devices(mig, 1), i))
            .collect(),
    );
    let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(10));
    assert_eq!(
        admitted_nodes(&decisions).len(),
        2,
        "two 40 GiB slices fit 100 GiB"
    );
}

/// A DRA claim of "one GPU, else three MIG slices" is placed on its slices, but kube-scheduler
/// allocates the GPU wherever one is free: the queue's `nvidia.com/gpu` quota must hold it,
/// or a tenant with MIG quota only takes whole GPUs nobody counts.
#[test]
fn a_first_available_claim_waits_unless_every_alternative_fits_the_quota() {
    let mig = "nvidia.com/mig-1g.10gb";
    let claim_pod = |key: &str, created: i64| {
        let mut pod = pod_asking(key, GpuRequest::devices(mig, 3), created);
        pod.requests.quota_only = vec![GpuRequest::devices(GPU, 1)];
        pod
    };
    let node = Node::new("m")
        .cpu_milli(128_000)
        .memory_bytes(1 << 40)
        .gpus(GPU, 2)
        .gpus(mig, 7);
    let slices_only = gpuqueue_core::model::Queue::new("a")
        .namespace("a")
        .quota(gpuqueue_core::model::ResourceQuota::devices(mig, 3, 0));
    let mut snapshot = build(
        vec![slices_only.clone()],
        vec![node.clone()],
        vec![claim_pod("a/p", 0)],
    );
    let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(10));
    assert!(
        matches!(&decisions[..], [Decision::Wait(_)]),
        "no nvidia.com/gpu quota for the GPU kube-scheduler may allocate: {decisions:?}"
    );
    // With a GPU in its quota it is admitted, and the GPU is held in quota, not placed: a
    // pod of another queue takes both of the node's GPUs.
    let both = slices_only.quota(gpuqueue_core::model::ResourceQuota::devices(GPU, 1, 0));
    let pods = vec![
        claim_pod("a/p", 0),
        pod_asking("b/whole", GpuRequest::devices(GPU, 2), 1),
    ];
    let mut snapshot = build(vec![both, queue("b", 2, 0)], vec![node], pods);
    let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(10));
    assert_eq!(admitted_nodes(&decisions), vec!["m", "m"], "{decisions:?}");
    assert_eq!(usage(&snapshot, "a").allocated, Milli::devices(1));
}

/// The same claim under a `gpuMemory` cap on `nvidia.com/gpu`: the GPU kube-scheduler may
/// allocate is judged against the cap too, on a node that has such GPUs.
#[test]
fn a_first_available_claim_waits_when_an_alternative_breaks_a_memory_cap() {
    let mig = "nvidia.com/mig-1g.10gb";
    let mut pod = pod_asking("a/p", GpuRequest::devices(mig, 3), 0);
    pod.requests.quota_only = vec![GpuRequest::devices(GPU, 1)];
    let node = gpu_node(
        "m",
        GpuPool {
            memory_mib: Some(81_920),
            ..GpuPool::exclusive(GPU, 1)
        },
    )
    .gpus(mig, 7);
    let mut a = gpuqueue_core::model::Queue::new("a")
        .namespace("a")
        .quota(gpuqueue_core::model::ResourceQuota::devices(GPU, 1, 0))
        .quota(gpuqueue_core::model::ResourceQuota::devices(mig, 3, 0));
    a.quotas[0].gpu_memory_mib = Some(20 * 1024);
    let snapshot = build(vec![a], vec![node], vec![pod]);
    let p = snapshot.pod_id(&PodKey::new("a", "p")).unwrap();
    let Decision::Wait(wait) = decide(&snapshot, p, &Policy::default(), at(10)) else {
        panic!("the whole GPU's 80 GiB break the 20 GiB cap");
    };
    assert_eq!(wait.reason.code(), "GpuMemoryCap", "{}", wait.reason);
}

/// A DRA claim two pods of a borrower share is charged to one of them, but its devices are
/// freed only once both are gone: a reclaim that takes them evicts both, in one handover.
#[test]
fn a_reclaim_evicts_every_pod_sharing_the_claim_it_frees() {
    let shared = vec!["shared-gpus".to_owned()];
    let (holder, other) = (PodKey::new("b", "train-0"), PodKey::new("b", "train-1"));
    let users = [
        gpuqueue_core::model::dra::ClaimUser {
            pod: &holder,
            admitted: true,
            claims: &shared,
        },
        gpuqueue_core::model::dra::ClaimUser {
            pod: &other,
            admitted: true,
            claims: &shared,
        },
    ];
    let charged = gpuqueue_core::model::dra::charged_claims(&users);
    let sharers = gpuqueue_core::model::dra::claim_sharers(&users, &charged);
    assert_eq!(sharers, vec![vec![other.clone()], Vec::new()]);
    let mut charged_pod = running("b/train-0", 2, "n1", 10);
    charged_pod.claim_sharers = sharers[0].clone();
    // Charged nothing: its claim is counted on b/train-0.
    let mut using_free = running("b/train-1", 1, "n1", 10);
    using_free.requests.gpus.clear();
    let plan = |pods: Vec<Pod>| {
        let mut snapshot = build(
            vec![queue("a", 2, 0), queue("b", 0, 2)],
            vec![common::world::node("n1", 2)],
            pods,
        );
        let owner = snapshot.add_pod(pending("a/a0", 2, 100)).unwrap();
        gpuqueue_core::reclaim::plan_reclaim(&snapshot, owner, at(100)).map(|p| {
            let victims: Vec<String> = p.victims.iter().map(|v| v.key.to_string()).collect();
            let awaits: Vec<String> = p.awaits.iter().map(ToString::to_string).collect();
            (victims, awaits)
        })
    };
    let (train_0, train_1) = ("b/train-0".to_owned(), "b/train-1".to_owned());
    assert_eq!(
        plan(vec![charged_pod.clone(), using_free.clone()]),
        Ok((vec![train_0.clone(), train_1.clone()], Vec::new())),
        "b/train-1 holds the claim too"
    );
    // One already leaving is awaited, not evicted again.
    let mut leaving = using_free;
    leaving.state = PodState::Admitted(Assignment {
        node: Some("n1".into()),
        bound: true,
        terminating: true,
    });
    assert_eq!(
        plan(vec![charged_pod.clone(), leaving]),
        Ok((vec![train_0.clone()], vec![train_1]))
    );
    assert_eq!(plan(vec![charged_pod]), Ok((vec![train_0], Vec::new())));
}

// ---- reading Kubernetes objects ----------------------------------------------------------

fn k8s_node(
    allocatable: &[(&str, &str)],
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> k8s::Node {
    let map = |kv: &[(&str, &str)]| {
        kv.iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n", "labels": map(labels), "annotations": map(annotations)},
        "status": {
            "allocatable": map(allocatable),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }))
    .unwrap()
}

#[test]
fn a_time_sliced_node_shows_its_physical_devices() {
    let node = Node::from_k8s(&k8s_node(
        &[("nvidia.com/gpu", "32")],
        &[
            ("nvidia.com/gpu.replicas", "4"),
            ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
            ("nvidia.com/gpu.memory", "81920"),
        ],
        &[],
    ))
    .unwrap()
    .value;
    let pool = &node.pools[0];
    assert_eq!((pool.devices, pool.schedulable()), (8, 32));
    assert_eq!(pool.memory_mib, Some(81_920));
    assert!(matches!(
        pool.sharing,
        Sharing::Replicas { replicas: 4, .. }
    ));

    let renamed = Node::from_k8s(&k8s_node(
        &[("nvidia.com/gpu.shared", "20")],
        &[
            ("nvidia.com/gpu.replicas", "10"),
            ("nvidia.com/gpu.sharing-strategy", "mps"),
        ],
        &[],
    ))
    .unwrap()
    .value;
    assert_eq!(renamed.pools[0].resource.as_str(), "nvidia.com/gpu.shared");
    assert_eq!(renamed.pools[0].devices, 2);

    let err = Node::from_k8s(&k8s_node(
        &[("nvidia.com/gpu", "8")],
        &[("nvidia.com/gpu.sharing-strategy", "time-slicing")],
        &[],
    ))
    .unwrap_err();
    assert_eq!(err.field, "metadata.labels[nvidia.com/gpu.replicas]");
}

#[test]
fn a_hami_node_shows_its_registered_devices() {
    let node = Node::from_k8s(&k8s_node(
        &[("nvidia.com/gpu", "20")],
        &[],
        &[(
            "hami.io/node-nvidia-register",
            "GPU-a,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:GPU-b,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:",
        )],
    ))
    .unwrap()
    .value;
    let pool = &node.pools[0];
    assert_eq!((pool.devices, pool.schedulable()), (2, 20));
    assert_eq!(pool.memory_mib, Some(32_768));
    assert_eq!(pool.sharing, Sharing::Hami { split: 10 });

    let err = Node::from_k8s(&k8s_node(
        &[("nvidia.com/gpu", "20")],
        &[],
        &[("hami.io/node-nvidia-register", "GPU-a,ten,32768")],
    ))
    .unwrap_err();
    assert!(err.rule.contains("is not `uuid,split count"), "{err}");
}

fn k8s_pod(limits: &[(&str, &str)]) -> k8s::Pod {
    let limits: BTreeMap<_, _> = limits.iter().map(|(k, v)| (*k, *v)).collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "a", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }))
    .unwrap()
}

/// [`k8s_pod`] bound to a node, past the gate.
fn bound_pod(limits: &[(&str, &str)]) -> k8s::Pod {
    let mut pod = k8s_pod(limits);
    pod.spec.as_mut().unwrap().node_name = Some("gpu-node-0".into());
    pod
}

/// [`k8s_pod`] waiting at the gate, as the webhook creates it.
fn gated_pod(limits: &[(&str, &str)]) -> k8s::Pod {
    let mut pod = k8s_pod(limits);
    pod.spec.as_mut().unwrap().scheduling_gates = Some(vec![k8s::PodSchedulingGate {
        name: gpuqueue_api::ADMISSION_GATE.into(),
    }]);
    pod
}

#[test]
fn a_hami_container_asking_no_memory_gets_its_whole_device_beside_one_that_asks() {
    // HAMi gives a container without `gpumem` all of its device's memory: the pod's devices
    // must hold that, not the sibling's 4 GiB. A container with no GPU asks nothing of them.
    let containers = |second: serde_json::Value| {
        serde_json::from_value::<k8s::Pod>(serde_json::json!({
            "metadata": {"name": "p", "namespace": "a", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}}},
                {"name": "b", "resources": {"limits": second}},
            ]},
        }))
        .unwrap()
    };
    let read = |pod: &k8s::Pod| Pod::from_k8s(pod).unwrap().unwrap().value.requests.gpus[0].clone();
    let whole = read(&containers(serde_json::json!({"nvidia.com/gpu": "1"})));
    assert_eq!(whole.count, 2);
    assert_eq!(whole.memory, DeviceMemory::Share);
    let sidecar = read(&containers(serde_json::json!({"cpu": "1"})));
    assert_eq!(sidecar.count, 1);
    assert_eq!(sidecar.memory, DeviceMemory::Mib(4096));
}

#[test]
fn hami_requests_are_read_per_device_and_never_ignored() {
    let pod = Pod::from_k8s(&k8s_pod(&[
        ("nvidia.com/gpu", "1"),
        ("nvidia.com/gpumem", "18432"),
        ("nvidia.com/gpucores", "30"),
    ]))
    .unwrap()
    .unwrap()
    .value;
    let gpu = &pod.requests.gpus[0];
    assert_eq!(gpu.memory, DeviceMemory::Mib(18_432));
    assert_eq!(gpu.cores_percent, Some(30));
    let percent = Pod::from_k8s(&k8s_pod(&[
        ("nvidia.com/gpu", "2"),
        ("nvidia.com/gpumem-percentage", "50"),
    ]))
    .unwrap()
    .unwrap()
    .value;
    assert_eq!(percent.requests.gpus[0].memory, DeviceMemory::Percent(50));

    // Memory without a device cannot be counted: refused with the field and what to do.
    let alone = gated_pod(&[("nvidia.com/gpumem", "4096")]);
    let err = Pod::from_k8s(&alone).unwrap_err();
    assert_eq!(
        err.field,
        "spec.containers[0].resources.requests[nvidia.com/gpumem]"
    );
    assert!(err.rule.contains("add nvidia.com/gpu: 1"), "{err}");
    assert!(
        gpuqueue_core::model::is_gpu_pod(&alone),
        "kept, so that it waits with the reason"
    );

    let both = Pod::from_k8s(&gated_pod(&[
        ("nvidia.com/gpu", "1"),
        ("nvidia.com/gpumem", "4096"),
        ("nvidia.com/gpumem-percentage", "50"),
    ]))
    .unwrap_err();
    assert!(both.rule.contains("keep one of them"), "{both}");
    let over = Pod::from_k8s(&gated_pod(&[
        ("nvidia.com/gpu", "1"),
        ("nvidia.com/gpucores", "150"),
    ]))
    .unwrap_err();
    assert!(over.rule.contains("from 1 to 100"), "{over}");
    // 0% is no limit under HAMi, not nothing: refused, or the gpuCores cap would not see it.
    let unlimited = Pod::from_k8s(&gated_pod(&[
        ("nvidia.com/gpu", "1"),
        ("nvidia.com/gpucores", "0"),
    ]))
    .unwrap_err();
    assert!(
        unlimited.rule.contains("HAMi does not limit"),
        "{unlimited}"
    );
    assert!(
        unlimited.field.contains("nvidia.com/gpucores"),
        "{unlimited}"
    );
}

#[test]
fn a_hami_pod_past_the_gate_is_charged_whole_devices_whatever_it_asks() {
    // It slipped in while the webhook was down: it holds its devices, so it is charged, and
    // first to go, rather than left out with its devices looking free.
    for asks in [
        [("nvidia.com/gpu", "2"), ("nvidia.com/gpucores", "0")],
        [("nvidia.com/gpu", "2"), ("nvidia.com/gpumem", "0")],
        [
            ("nvidia.com/gpu", "2"),
            ("nvidia.com/gpumem-percentage", "150"),
        ],
    ] {
        // Created ungated, it is refused until bound: the webhook and admission at creation
        // read it so, and gate it.
        assert!(Pod::from_k8s(&k8s_pod(&asks)).is_err(), "{asks:?}");
        let read = Pod::from_k8s(&bound_pod(&asks)).unwrap().unwrap();
        let pod = read.value;
        assert!(pod.is_admitted() && pod.unadmitted, "{asks:?}");
        assert_eq!(
            pod.requests.gpus,
            vec![GpuRequest::devices("nvidia.com/gpu", 2).with_cores(100)],
            "{asks:?}"
        );
        assert!(
            read.warnings[0].contains("charged each device whole"),
            "{:?}",
            read.warnings
        );
    }
    for asks in [
        &[
            ("nvidia.com/gpu", "1"),
            ("nvidia.com/gpumem", "4096"),
            ("nvidia.com/gpumem-percentage", "50"),
        ][..],
        // A part without a device: HAMi gives it one (its `nvidia.defaultGPUNum`).
        &[("nvidia.com/gpumem", "4096")][..],
    ] {
        let pod = Pod::from_k8s(&bound_pod(asks)).unwrap().unwrap().value;
        assert_eq!(
            pod.requests.of(&ResourceName::nvidia_gpu()),
            Milli::devices(1),
            "{asks:?}"
        );
        assert!(pod.unadmitted, "{asks:?}");
    }
    // Still refused at the gate, where it can wait saying why.
    assert!(
        Pod::from_k8s(&gated_pod(&[
            ("nvidia.com/gpu", "2"),
            ("nvidia.com/gpucores", "0")
        ]))
        .is_err()
    );
}

// ---- properties ---------------------------------------------------------------------------

proptest! {
    /// Whatever HAMi pods arrive, no device is given more memory or compute than it has, nor
    /// more pods than its split; every admitted pod's memory is charged to its queue.
    #[test]
    fn hami_devices_are_never_overcommitted(
        asks in prop::collection::vec((1u64..20_000, prop::option::of(1u32..=100)), 1..40),
    ) {
        let pods: Vec<Pod> = asks
            .iter()
            .enumerate()
            .map(|(i, (mib, cores))| {
                let mut gpu = GpuRequest::devices(GPU, 1).with_memory(DeviceMemory::Mib(*mib));
                gpu.cores_percent = *cores;
                pod_asking(&format!("a/p{i:02}"), gpu, i64::try_from(i).unwrap())
            })
            .collect();
        let mut snapshot = build(
            vec![queue("a", 100, 0)],
            vec![gpu_node("h", hami(4, 24_576))],
            pods.clone(),
        );
        let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(1000));
        let mut memory = [0u64; 4];
        let mut compute = [0u32; 4];
        let mut count = [0u32; 4];
        let mut charged = 0;
        for d in &decisions {
            let Decision::Admit(a) = d else { continue };
            let pod = pods.iter().find(|p| p.key == a.key).unwrap();
            let gpu = &pod.requests.gpus[0];
            let DeviceMemory::Mib(mib) = gpu.memory else { unreachable!() };
            let device = usize::from(a.placement.devices[0].devices[0]);
            memory[device] += mib;
            compute[device] += gpu.cores_percent.unwrap_or(10);
            count[device] += 1;
            charged += mib;
        }
        for d in 0..4 {
            prop_assert!(memory[d] <= 24_576, "device {d}: {memory:?}");
            prop_assert!(compute[d] <= 100, "device {d}: {compute:?}");
            prop_assert!(count[d] <= 10, "device {d}: {count:?}");
        }
        prop_assert_eq!(usage(&snapshot, "a").memory_mib, charged);
    }
}
