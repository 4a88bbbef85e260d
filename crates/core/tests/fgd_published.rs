//! The fragmentation measure against the FGD paper's published values: the empty Alibaba
//! cluster's fragmentation for each trace variant, as `fgd-expected-results/README.md` gives
//! them (an independent reimplementation's values, and the published curves at arrival 0).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::trace;
use gpuqueue_core::Snapshot;
use gpuqueue_core::fragmentation::{DEFAULT_POPULARITY, WorkloadMix};

/// (variant, independent reimplementation %, published % at arrival 0)
const EXPECTED: [(&str, f64, f64); 5] = [
    ("default", 13.94, 13.97),
    ("cpu050", 5.55, 5.58),
    ("cpu250", 25.87, 25.89),
    ("gpushare100", 13.64, 13.71),
    ("gpuspec33", 35.49, 35.45),
];

#[test]
fn empty_cluster_fragmentation_matches_the_published_values() {
    let nodes = trace::nodes();
    assert_eq!(nodes.len(), 1213);
    for (variant, independent, published) in EXPECTED {
        let mix = WorkloadMix::from_shapes(
            trace::tasks(variant).into_iter().map(|t| t.shape),
            DEFAULT_POPULARITY,
        );
        let (snapshot, issues) = Snapshot::builder()
            .nodes(nodes.clone())
            .workload_mix(mix)
            .build();
        assert!(issues.is_empty(), "{issues:?}");
        let frag = snapshot.fragmentation();
        assert_eq!(frag.capacity_milli, 6_212_000);
        assert_eq!(frag.idle_milli, 6_212_000);
        let ours = 100.0 * frag.share_of_capacity();
        println!("{variant}: {ours:.2}% (independent {independent}%, published {published}%)");
        assert!(
            (ours - independent).abs() < 0.006,
            "{variant}: {ours:.3}% != {independent}%"
        );
        assert!(
            (ours - published).abs() < 0.1,
            "{variant}: {ours:.3}% is not within 0.1 of {published}%"
        );
    }
}
