//! The scorers' measures checked by hand: FGD's expected-fragmentation increment, and how
//! ours breaks FGD's ties by the capacity whole copies of the mix would strand (the worked
//! numbers are in each test's comment).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use jiff::Timestamp;
use proptest::prelude::*;

use gpuqueue_core::Policy;
use gpuqueue_core::fragmentation::{TaskShape, WorkloadMix};
use gpuqueue_core::model::{Assignment, GpuRequest, Node, Pod, PodKey, PodState, Requests};
use gpuqueue_core::placement::{BestFit, Fgd, FragmentationAware, Scorer, TieBreak};
use gpuqueue_core::snapshot::{Snapshot, SnapshotBuilder};

const GPU: &str = "nvidia.com/gpu";

fn pod(name: &str, cpu_milli: u64, gpu: Option<GpuRequest>) -> Pod {
    Pod::new(
        PodKey::new("t", name),
        Requests {
            cpu_milli,
            memory_bytes: 0,
            gpus: gpu.into_iter().collect(),
            quota_only: Vec::new(),
        },
        Timestamp::UNIX_EPOCH,
    )
}

/// A 1-core pod already holding `gpu` on `node`.
fn running(name: &str, gpu: GpuRequest, node: &str) -> Pod {
    let mut p = pod(name, 1000, Some(gpu));
    p.state = PodState::Admitted(Assignment {
        node: Some(node.into()),
        bound: true,
        terminating: false,
    });
    p
}

fn class(cpu_milli: u64, gpu: GpuRequest, p: f64) -> (TaskShape, f64) {
    let task = TaskShape {
        cpu_milli,
        gpu: Some(gpu),
        gpu_models: Vec::new(),
    };
    (task, p)
}

/// Nodes of 64 cores with `gpus` devices each, `pods` running, measured against `mix`.
fn cluster(nodes: &[(&str, u32)], pods: Vec<Pod>, mix: Vec<(TaskShape, f64)>) -> Snapshot {
    let mut builder = Snapshot::builder().workload_mix(WorkloadMix::new(mix));
    for (name, gpus) in nodes {
        builder = builder.node(Node::new(*name).cpu_milli(64_000).gpus(GPU, *gpus));
    }
    let (snapshot, issues) = pods.into_iter().fold(builder, SnapshotBuilder::pod).build();
    assert!(issues.is_empty(), "{issues:?}");
    snapshot
}

/// Where `scorer` puts `pod`: the node's name and the devices it takes.
fn placed(snapshot: &Snapshot, scorer: &dyn Scorer, pod: &Pod) -> (String, Vec<u16>) {
    let p = Policy::new(scorer, TieBreak::First)
        .find_placement(snapshot, pod)
        .unwrap();
    (p.node_name, p.devices[0].devices.clone())
}

#[test]
fn fgd_takes_the_option_whose_fragmentation_falls_most() {
    // Mix: a 500-milli task and a whole-GPU task, half each. `x` has devices free
    // [600, 1000] (a 400 runs on device 0), `y` [1000, 1000]. A 400-milli pod arrives.
    //   F(x) = ½·0 (500 fits both) + ½·600 (the whole task cannot use the 600) = 300.
    //   x, device 0 -> [200, 1000]: ½·200 + ½·200 = 200, F falls by 100: ⌊σ(0.1)·100⌋ = 52.
    //   x, device 1 -> [600, 600]: ½·0 + ½·1200 (no whole GPU left) = 600, rises by 300.
    //   y -> [600, 1000]: ½·0 + ½·600 = 300 from 0, rises by 300: ⌊σ(−0.3)·100⌋ = 42.
    let snapshot = cluster(
        &[("x", 2), ("y", 2)],
        vec![running("r", GpuRequest::shared(GPU, 400), "x")],
        vec![
            class(1000, GpuRequest::shared(GPU, 500), 0.5),
            class(1000, GpuRequest::devices(GPU, 1), 0.5),
        ],
    );
    let x = snapshot.node_id("x").unwrap();
    assert!((snapshot.node_fragmentation(x) - 300.0).abs() < 1e-9);
    let arriving = pod("p", 1000, Some(GpuRequest::shared(GPU, 400)));
    for scorer in [&Fgd as &dyn Scorer, &FragmentationAware] {
        assert_eq!(placed(&snapshot, scorer, &arriving), ("x".into(), vec![0]));
    }
    let p = Policy::new(&Fgd, TieBreak::First)
        .find_placement(&snapshot, &arriving)
        .unwrap();
    assert!((p.score - 52.0).abs() < 1e-9, "FGD scores it {}", p.score);
}

#[test]
fn ours_breaks_fgd_ties_by_what_whole_copies_strand() {
    // Mix: 300-milli tasks only. `a` has 900 free (a 100 runs there), `b` 1000. A 400
    // arrives. F is 0 before and after on both (300 still fits), so FGD scores both 50
    // and takes the first, `a`; best fit takes `a` too (500 left, against 600).
    // Copies: `a` holds 3 (900 used, 0 idle) and would hold 1 of its 500 (200 stranded):
    // +200. `b` holds 3 of 1000 (100 stranded) and 2 of its 600 (none): −100. Ours: `b`.
    let snapshot = cluster(
        &[("a", 1), ("b", 1)],
        vec![running("r", GpuRequest::shared(GPU, 100), "a")],
        vec![class(1000, GpuRequest::shared(GPU, 300), 1.0)],
    );
    let arriving = pod("p", 1000, Some(GpuRequest::shared(GPU, 400)));
    assert_eq!(placed(&snapshot, &Fgd, &arriving).0, "a");
    assert_eq!(placed(&snapshot, &BestFit, &arriving).0, "a");
    assert_eq!(placed(&snapshot, &FragmentationAware, &arriving).0, "b");
}

#[test]
fn ours_keeps_whole_copies_of_multi_gpu_tasks() {
    // Mix: whole-GPU tasks (95%) and 2-GPU tasks (5%, 100 of the 1050 milli the mix
    // requests: under a tenth). `a` has 4 free GPUs, `b` 3 (one runs a whole-GPU task). A
    // whole-GPU pod arrives. F is 0 everywhere (both classes still fit), so FGD takes `a`.
    // Unfillable = idle − 0.95·(free GPUs)·1000 − 0.05·(2-GPU copies)·2000:
    //   a: 4000 − 3800 − 200 = 0 -> 3000 − 2850 − 100 = 50 (the odd GPU): +50.
    //   b: 3000 − 2850 − 100 = 50 -> 2000 − 1900 − 100 = 0: −50. Ours: `b`.
    let snapshot = cluster(
        &[("a", 4), ("b", 4)],
        vec![running("r", GpuRequest::devices(GPU, 1), "b")],
        vec![
            class(1000, GpuRequest::devices(GPU, 1), 0.95),
            class(1000, GpuRequest::devices(GPU, 2), 0.05),
        ],
    );
    let arriving = pod("p", 1000, Some(GpuRequest::devices(GPU, 1)));
    assert_eq!(placed(&snapshot, &Fgd, &arriving).0, "a");
    assert_eq!(placed(&snapshot, &FragmentationAware, &arriving).0, "b");
}

#[test]
fn ours_leaves_single_device_ties_to_the_node_order_when_multi_gpu_tasks_weigh() {
    // The same nodes, and a mix of 2-GPU tasks only (all of its request is multi-GPU, over
    // MULTI_DEVICE_MIX). F is 0 everywhere, FGD scores both 50 and takes `a`. The whole-copy
    // key would take `b` (`a`: 2 copies -> 1 of 3 GPUs, +1000 stranded; `b`: 1000 stranded
    // -> none), but a one-device request keeps FGD's tie: ours takes `a`, the first node.
    let snapshot = cluster(
        &[("a", 4), ("b", 4)],
        vec![running("r", GpuRequest::devices(GPU, 1), "b")],
        vec![class(1000, GpuRequest::devices(GPU, 2), 1.0)],
    );
    let arriving = pod("p", 1000, Some(GpuRequest::devices(GPU, 1)));
    assert_eq!(placed(&snapshot, &Fgd, &arriving).0, "a");
    assert_eq!(placed(&snapshot, &FragmentationAware, &arriving).0, "a");
}

#[test]
fn ours_still_breaks_multi_gpu_requests_ties_when_multi_gpu_tasks_weigh() {
    // Mix: 4-GPU tasks only. `a` has 7 of 8 GPUs free, `b` 6. A 2-GPU pod arrives: `a` keeps
    // 5, `b` 4, both still hold one 4-GPU copy, so F stays 0 and FGD takes `a`. Whole
    // copies: `a` strands 3000 -> 1000, `b` 2000 -> 0: both 2000 less, a tie; best fit then
    // takes `b` (4000 idle left, against 5000).
    let snapshot = cluster(
        &[("a", 8), ("b", 8)],
        vec![
            running("r1", GpuRequest::devices(GPU, 1), "a"),
            running("r2", GpuRequest::devices(GPU, 2), "b"),
        ],
        vec![class(1000, GpuRequest::devices(GPU, 4), 1.0)],
    );
    let arriving = pod("p", 1000, Some(GpuRequest::devices(GPU, 2)));
    assert_eq!(placed(&snapshot, &Fgd, &arriving).0, "a");
    assert_eq!(placed(&snapshot, &FragmentationAware, &arriving).0, "b");
}

#[test]
fn ours_counts_stranded_gpus_in_copies_when_multi_gpu_tasks_weigh() {
    // Mix: 2-GPU tasks (70%) and 8-GPU tasks (30%), all of it multi-GPU. `a` has 2 of 8
    // GPUs free, `b` all 8. A 1-GPU pod arrives.
    // FGD, shares as counted (0.7, 0.3):
    //   a: F = 0.3·2000 = 600 (no 8-GPU copy) -> 1 free: 0.3·1000 + 0.7·1000 = 1000:
    //      rises by 400, ⌊σ(−0.4)·100⌋ = 40.
    //   b: F = 0 -> 7 free: 0.3·7000 = 2100: ⌊σ(−2.1)·100⌋ = 10. FGD fills `a`.
    // Per copy, shares 0.7/2 and 0.3/8 renormalised: 28/31 and 3/31:
    //   a: 3/31·2000 = 193.5 -> 3/31·1000 + 28/31·1000 = 1000: rises by 806.5, score 30.
    //   b: 0 -> 3/31·7000 = 677.4: score 33. Ours opens `b`: the GPU stranded on `a` is a
    //   whole 2-GPU copy lost, the seven left on `b` lose one 8-GPU copy and hold three
    //   2-GPU ones.
    let snapshot = cluster(
        &[("a", 8), ("b", 8)],
        vec![
            running("r1", GpuRequest::devices(GPU, 4), "a"),
            running("r2", GpuRequest::devices(GPU, 2), "a"),
        ],
        vec![
            class(1000, GpuRequest::devices(GPU, 2), 0.7),
            class(1000, GpuRequest::devices(GPU, 8), 0.3),
        ],
    );
    let arriving = pod("p", 1000, Some(GpuRequest::devices(GPU, 1)));
    let score = |scorer: &dyn Scorer| {
        let p = Policy::new(scorer, TieBreak::First)
            .find_placement(&snapshot, &arriving)
            .unwrap();
        (p.node_name, p.score)
    };
    assert_eq!(score(&Fgd), ("a".into(), 40.0));
    assert_eq!(score(&FragmentationAware), ("b".into(), 33.0));
}

#[test]
fn ours_never_trades_fgd_score_for_fewer_stranded_copies() {
    // Mix: 300-milli tasks. `a` has 1000 free, `b` 700. A 500 arrives.
    //   a -> 500: 300 still fits, F stays 0: score 50 (copies 3 -> 1: +200 stranded).
    //   b -> 200: a 200 fragment, F rises by 200: ⌊σ(−0.2)·100⌋ = 45 (copies 2 -> 0).
    // FGD's score decides first: both take `a`.
    let snapshot = cluster(
        &[("a", 1), ("b", 1)],
        vec![running("r", GpuRequest::shared(GPU, 300), "b")],
        vec![class(1000, GpuRequest::shared(GPU, 300), 1.0)],
    );
    let arriving = pod("p", 1000, Some(GpuRequest::shared(GPU, 500)));
    for scorer in [&Fgd as &dyn Scorer, &FragmentationAware] {
        assert_eq!(placed(&snapshot, scorer, &arriving).0, "a");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever the cluster and mix, ours places a pod only where it fits, and places
    /// it whenever some node has room (it never refuses what FGD would place).
    #[test]
    fn ours_places_only_where_the_pod_fits_and_whenever_fgd_can(
        used in proptest::collection::vec(0u32..1000, 14),
        shared in proptest::bool::ANY,
        milli in 100u32..1000,
        count in 1u32..4,
        cpu in 0u64..40_000,
    ) {
        // Slots 0-1 on n0, 2-5 on n1, 6-13 on n2: at most one running pod per device.
        let pods = used.iter().enumerate().filter(|(_, m)| **m > 0).map(|(slot, m)| {
            let node = match slot { 0..=1 => "n0", 2..=5 => "n1", _ => "n2" };
            running(&format!("r{slot}"), GpuRequest::shared(GPU, *m), node)
        }).collect();
        let snapshot = cluster(
            &[("n0", 2), ("n1", 4), ("n2", 8)],
            pods,
            vec![
                class(4000, GpuRequest::shared(GPU, 500), 0.4),
                class(8000, GpuRequest::devices(GPU, 1), 0.4),
                class(16_000, GpuRequest::devices(GPU, 2), 0.2),
            ],
        );
        let gpu = if shared { GpuRequest::shared(GPU, milli) } else { GpuRequest::devices(GPU, count) };
        let arriving = pod("p", cpu, Some(gpu));
        let ours = Policy::default().find_placement(&snapshot, &arriving);
        let fgd = Policy::new(&Fgd, TieBreak::First).find_placement(&snapshot, &arriving);
        prop_assert_eq!(ours.is_some(), fgd.is_some());
        if let Some(p) = ours {
            let mut after = snapshot.clone();
            prop_assert!(after.add_placed(arriving, &p).is_ok(), "placed where it does not fit: {p:?}");
        }
    }
}
