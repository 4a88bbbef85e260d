//! Building a snapshot measures each node's fragmentation once, after its pods are seated:
//! the figures are those of setting the workload mix on the finished snapshot.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::world::{node, pending, queue, running};
use gpuqueue_core::Snapshot;
use gpuqueue_core::fragmentation::{DEFAULT_POPULARITY, TaskShape, WorkloadMix};

#[test]
fn fragmentation_after_a_build_is_that_of_the_mix_set_on_the_finished_snapshot() {
    let pods = vec![
        running("a/p1", 1, "n1", 1),
        running("a/p2", 3, "n1", 2),
        running("b/p3", 2, "n2", 3),
        running("b/p4", 5, "n3", 4),
        pending("a/p5", 2, 5),
        pending("b/p6", 4, 6),
    ];
    let mix = WorkloadMix::from_shapes(pods.iter().map(TaskShape::of_pod), DEFAULT_POPULARITY);
    let parts = || {
        (
            [queue("a", 8, 8), queue("b", 8, 8)],
            [node("n1", 8), node("n2", 8), node("n3", 8), node("n4", 8)],
        )
    };
    let (queues, nodes) = parts();
    let (built, issues) = Snapshot::builder()
        .queues(queues)
        .nodes(nodes)
        .pods(pods.clone())
        .workload_mix(mix.clone())
        .build();
    assert!(issues.is_empty(), "{issues:?}");
    let (queues, nodes) = parts();
    let (mut later, _) = Snapshot::builder()
        .queues(queues)
        .nodes(nodes)
        .pods(pods)
        .build();
    later.set_workload_mix(mix);
    let figures =
        |s: &Snapshot| -> Vec<f64> { s.node_ids().map(|id| s.node_fragmentation(id)).collect() };
    assert_eq!(figures(&built), figures(&later));
    assert!(
        figures(&built).iter().any(|f| *f > 0.0),
        "{:?}",
        figures(&built)
    );
}
