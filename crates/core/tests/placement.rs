//! The snapshot's device accounting and the scorers' choices on small, hand-checked clusters.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use gpuqueue_core::Policy;
use gpuqueue_core::Snapshot;
use gpuqueue_core::fragmentation::{TaskShape, WorkloadMix};
use gpuqueue_core::model::selector::{Taint, TaintEffect};
use gpuqueue_core::model::{
    Assignment, DeviceMemory, DeviceSet, GpuPool, GpuRequest, Node, Pod, PodKey, PodState, Requests,
};
use gpuqueue_core::placement::{
    BestFit, Fgd, FragmentationAware, GpuPacking, Random, Scorer, TieBreak,
};
use jiff::Timestamp;

const GPU: &str = "nvidia.com/gpu";

fn task(name: &str, gpu: GpuRequest) -> Pod {
    Pod::new(
        PodKey::new("t", name),
        Requests {
            cpu_milli: 1000,
            memory_bytes: 0,
            gpus: vec![gpu],
            quota_only: Vec::new(),
        },
        Timestamp::UNIX_EPOCH,
    )
}

/// A pod already running on `node`, on `devices` when given.
fn running(name: &str, gpu: GpuRequest, node: &str, devices: &[u16]) -> Pod {
    let mut pod = task(name, gpu.clone());
    pod.state = PodState::Admitted(Assignment {
        node: Some(node.into()),
        bound: true,
        terminating: false,
    });
    if !devices.is_empty() {
        pod.devices = vec![DeviceSet {
            resource: gpu.resource,
            devices: devices.to_vec(),
        }];
    }
    pod
}

fn node(name: &str, gpus: u32) -> Node {
    Node::new(name).cpu_milli(64_000).gpus(GPU, gpus)
}

#[test]
fn running_pods_take_the_lowest_free_devices_and_free_them_when_removed() {
    let (mut snapshot, issues) = Snapshot::builder()
        .node(node("n1", 4))
        .pod(running("a", GpuRequest::devices(GPU, 2), "n1", &[]))
        .pod(running("b", GpuRequest::shared(GPU, 300), "n1", &[3]))
        .build();
    assert!(issues.is_empty(), "{issues:?}");
    let n1 = snapshot.node_id("n1").unwrap();
    assert_eq!(snapshot.node_view(n1).gpu_free(), &[0, 0, 1000, 700]);
    assert_eq!(snapshot.node_view(n1).cpu_free_milli(), 62_000);
    let a = snapshot.pod_id(&PodKey::new("t", "a")).unwrap();
    assert_eq!(
        snapshot.pod_devices(a),
        vec![DeviceSet {
            resource: GPU.into(),
            devices: vec![0, 1]
        }]
    );
    snapshot.remove_pod(a).unwrap();
    assert_eq!(snapshot.node_view(n1).gpu_free(), &[1000, 1000, 1000, 700]);
    assert!(snapshot.pod(a).is_none());
}

#[test]
fn a_pod_pinned_to_a_full_node_waits_there_as_a_deficit_until_room_frees() {
    let mut owner = task("owner", GpuRequest::devices(GPU, 2));
    owner.state = PodState::Admitted(Assignment {
        node: Some("n1".into()),
        bound: false,
        terminating: false,
    });
    let (mut snapshot, _) = Snapshot::builder()
        .node(node("n1", 2))
        .node(node("n2", 2))
        .pod(owner)
        .pod(running("victim", GpuRequest::devices(GPU, 2), "n1", &[]))
        .build();
    let n1 = snapshot.node_id("n1").unwrap();
    assert!(
        snapshot.is_oversubscribed(n1),
        "the bound victim holds the devices; the pinned owner waits"
    );
    // Nothing else may be placed on the over-subscribed node.
    let p = Policy::new(&BestFit, TieBreak::First)
        .find_placement(&snapshot, &task("x", GpuRequest::devices(GPU, 1)))
        .unwrap();
    assert_eq!(p.node_name, "n2");
    let victim = snapshot.pod_id(&PodKey::new("t", "victim")).unwrap();
    snapshot.remove_pod(victim);
    assert!(!snapshot.is_oversubscribed(n1));
    let owner = snapshot.pod_id(&PodKey::new("t", "owner")).unwrap();
    assert_eq!(snapshot.pod_node(owner), Some(n1));
    assert_eq!(snapshot.node_view(n1).gpu_free(), &[0, 0]);
}

#[test]
fn a_simulated_removal_is_restored_exactly() {
    let (mut snapshot, _) = Snapshot::builder()
        .node(node("n1", 4))
        .pod(running("a", GpuRequest::devices(GPU, 1), "n1", &[2]))
        .pod(running("b", GpuRequest::shared(GPU, 500), "n1", &[0]))
        .build();
    let n1 = snapshot.node_id("n1").unwrap();
    let before: Vec<u16> = snapshot.node_view(n1).gpu_free().to_vec();
    let ids: Vec<_> = snapshot.pod_ids().collect();
    let removal = snapshot.simulate_removal(&ids);
    assert_eq!(snapshot.node_view(n1).gpu_free(), &[1000, 1000, 1000, 1000]);
    snapshot.restore(removal).unwrap();
    assert_eq!(snapshot.node_view(n1).gpu_free(), before.as_slice());
    assert_eq!(snapshot.pod_ids().count(), 2);
    // A change in between makes the removal stale instead of corrupting the snapshot.
    let removal = snapshot.simulate_removal(&ids[..1]);
    snapshot.mark_victim(ids[1], "r");
    assert!(snapshot.restore(removal).is_err());
}

#[test]
fn invalid_requests_and_devices_are_refused_with_the_rule() {
    let (mut snapshot, _) = Snapshot::builder().node(node("n1", 2)).build();
    let err = snapshot
        .add_pod(task(
            "x",
            GpuRequest {
                milli_per_device: 500,
                ..GpuRequest::devices(GPU, 2)
            },
        ))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("only a single device can be shared"),
        "{err}"
    );
    assert_eq!(
        snapshot.pod_ids().count(),
        0,
        "a refused pod leaves nothing behind"
    );
    // A pod naming a device the node lacks is not refused: what it names never takes it off
    // its queue's charge. It sits on the lowest free device.
    let y = snapshot
        .add_pod(running("y", GpuRequest::devices(GPU, 1), "n1", &[5]))
        .unwrap();
    assert_eq!(snapshot.pod_devices(y)[0].devices, [0]);
}

/// Two nodes: `busy` has one GPU half used, `idle` is empty.
fn half_used() -> Snapshot {
    let (snapshot, _) = Snapshot::builder()
        .node(node("busy", 2))
        .node(node("idle", 2))
        .pod(running("half", GpuRequest::shared(GPU, 500), "busy", &[0]))
        .build();
    snapshot
}

#[test]
fn best_fit_and_packing_share_the_used_gpu() {
    let snapshot = half_used();
    for scorer in [&BestFit as &dyn Scorer, &GpuPacking] {
        let p = Policy::new(scorer, TieBreak::First)
            .find_placement(&snapshot, &task("q", GpuRequest::shared(GPU, 400)))
            .unwrap();
        assert_eq!(p.node_name, "busy");
        assert_eq!(p.devices[0].devices, vec![0], "onto the half-used device");
    }
}

#[test]
fn fgd_avoids_leaving_a_fragment_the_mix_cannot_use() {
    // The mix is all 600-milli tasks. Putting a 400 on the half-used GPU (500 free) leaves 100
    // there (a fragment) and keeps a whole GPU; FGD must prefer that to splitting a whole GPU.
    let mix = WorkloadMix::new(vec![(
        TaskShape {
            cpu_milli: 1000,
            gpu: Some(GpuRequest::shared(GPU, 600)),
            gpu_models: vec![],
        },
        1.0,
    )]);
    let mut snapshot = half_used();
    snapshot.set_workload_mix(mix);
    let busy = snapshot.node_id("busy").unwrap();
    assert!(
        (snapshot.node_fragmentation(busy) - 500.0).abs() < 1e-9,
        "500 free on the shared GPU is unusable"
    );
    for scorer in [&Fgd as &dyn Scorer, &FragmentationAware] {
        let p = Policy::new(scorer, TieBreak::First)
            .find_placement(&snapshot, &task("q", GpuRequest::shared(GPU, 400)))
            .unwrap();
        assert_eq!(
            (p.node_name.as_str(), p.devices[0].devices.as_slice()),
            ("busy", &[0u16][..])
        );
    }
    let cluster = snapshot.fragmentation();
    assert_eq!(cluster.capacity_milli, 4000);
    assert_eq!(cluster.idle_milli, 3500);
    assert!((cluster.share_of_idle() - 500.0 / 3500.0).abs() < 1e-9);
}

#[test]
fn ours_keeps_cpu_next_to_free_gpus_where_fgd_sees_no_difference() {
    // The mix is whole-GPU tasks with 8 cores each. `lean` has 4 free GPUs and 16 cores (CPU
    // for two of them), `roomy` 4 free GPUs and 64 cores. An 8-core CPU-only pod on `lean`
    // strands one more GPU; FGD's `F_n` is 0 either way (one task still fits), so it takes the
    // first node, and so would best fit (less left over); ours takes `roomy`.
    let mix = WorkloadMix::new(vec![(
        TaskShape {
            cpu_milli: 8000,
            gpu: Some(GpuRequest::devices(GPU, 1)),
            gpu_models: vec![],
        },
        1.0,
    )]);
    let (mut snapshot, issues) = Snapshot::builder()
        .node(Node::new("lean").cpu_milli(16_000).gpus(GPU, 4))
        .node(Node::new("roomy").cpu_milli(64_000).gpus(GPU, 4))
        .build();
    assert!(issues.is_empty(), "{issues:?}");
    snapshot.set_workload_mix(mix);
    let cpu_only = Pod::new(
        PodKey::new("t", "cpu"),
        Requests {
            cpu_milli: 8000,
            memory_bytes: 0,
            gpus: vec![],
            quota_only: Vec::new(),
        },
        Timestamp::UNIX_EPOCH,
    );
    let on = |scorer: &dyn Scorer| {
        Policy::new(scorer, TieBreak::First)
            .find_placement(&snapshot, &cpu_only)
            .unwrap()
            .node_name
    };
    assert_eq!(on(&Fgd), "lean");
    assert_eq!(on(&BestFit), "lean");
    assert_eq!(on(&FragmentationAware), "roomy");
}

#[test]
fn gpu_models_taints_and_selectors_filter_nodes() {
    let (snapshot, _) = Snapshot::builder()
        .node(node("t4", 4).gpu_model("T4"))
        .node(node("a100", 4).gpu_model("A100").label("zone", "b"))
        .build();
    let mut p = task("p", GpuRequest::devices(GPU, 1));
    p.gpu_models = vec!["A100".into()];
    assert_eq!(
        Policy::new(&BestFit, TieBreak::First)
            .find_placement(&snapshot, &p)
            .unwrap()
            .node_name,
        "a100"
    );
    p.gpu_models = vec!["H100".into()];
    assert!(
        Policy::new(&BestFit, TieBreak::First)
            .find_placement(&snapshot, &p)
            .is_none()
    );
    let too_big = task("big", GpuRequest::devices(GPU, 5));
    assert!(
        Policy::new(&BestFit, TieBreak::First)
            .find_placement(&snapshot, &too_big)
            .is_none()
    );
}

/// Review finding: a pod with no selector, affinity or toleration (no node rules at all) was
/// placed on a `NoSchedule`-tainted node kube-scheduler keeps it off, and reclaims planned
/// there evicted borrowers for an owner that could never bind.
#[test]
fn a_pod_without_rules_is_kept_off_a_tainted_node() {
    let mut tainted = node("a-tainted", 1);
    tainted.taints.push(Taint {
        key: "dedicated".into(),
        value: "infer".into(),
        effect: TaintEffect::NoSchedule,
    });
    let mut preferred = node("b-prefer-no", 1);
    preferred.taints.push(Taint {
        key: "soft".into(),
        value: String::new(),
        effect: TaintEffect::PreferNoSchedule,
    });
    let (snapshot, _) = Snapshot::builder().node(tainted).node(preferred).build();
    let plain = task("plain", GpuRequest::devices(GPU, 1));
    assert!(plain.node_rules.is_none());
    let placed = Policy::new(&BestFit, TieBreak::First)
        .find_placement(&snapshot, &plain)
        .unwrap();
    assert_eq!(placed.node_name, "b-prefer-no", "a preference is no filter");
}

/// Review finding: a shared request tried one device per free-milli value, and when memory
/// did not fit on that one, never tried another with the same free milli and the memory.
#[test]
fn a_shared_request_tries_each_device_that_may_hold_its_memory() {
    let pool = GpuPool {
        memory_mib: Some(40_960),
        ..GpuPool::exclusive(GPU, 2)
    };
    let holding = |name: &str, gpu: GpuRequest, device: u16| running(name, gpu, "n1", &[device]);
    let (snapshot, issues) = Snapshot::builder()
        .node(Node::new("n1").cpu_milli(64_000).pool(pool))
        .pod(holding(
            "big",
            GpuRequest::shared(GPU, 500).with_memory(DeviceMemory::Mib(30_720)),
            0,
        ))
        .pod(holding("small", GpuRequest::shared(GPU, 500), 1))
        .build();
    assert!(issues.is_empty(), "{issues:?}");
    // Both devices have 500 milli free; only device 1 has 15 GiB of memory free.
    let want = task(
        "x",
        GpuRequest::shared(GPU, 400).with_memory(DeviceMemory::Mib(15_360)),
    );
    let placed = Policy::new(&BestFit, TieBreak::First)
        .find_placement(&snapshot, &want)
        .expect("device 1 holds it");
    assert_eq!(placed.devices[0].devices, vec![1]);
}

#[test]
fn seeded_ties_are_reproducible_and_spread() {
    let (snapshot, _) = Snapshot::builder()
        .nodes((0..16).map(|i| node(&format!("n{i:02}"), 8)))
        .build();
    let p = task("p", GpuRequest::devices(GPU, 1));
    let pick = |seed| {
        Policy::new(&BestFit, TieBreak::Seeded(seed))
            .find_placement(&snapshot, &p)
            .unwrap()
            .node_name
    };
    assert_eq!(pick(7), pick(7));
    let distinct: std::collections::BTreeSet<String> = (0..64).map(pick).collect();
    assert!(
        distinct.len() > 8,
        "seeded ties spread over the equal nodes: {distinct:?}"
    );
    assert_eq!(
        Policy::new(&BestFit, TieBreak::First)
            .find_placement(&snapshot, &p)
            .unwrap()
            .node_name,
        "n00"
    );
    let random: std::collections::BTreeSet<String> = (0..64)
        .map(|seed| {
            Policy::new(&Random { seed }, TieBreak::First)
                .find_placement(&snapshot, &p)
                .unwrap()
                .node_name
        })
        .collect();
    assert!(random.len() > 8, "{random:?}");
}
