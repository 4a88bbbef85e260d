#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The real openb trace loads, and the FGD submission sequence on it has the published shape.

use std::path::{Path, PathBuf};

use gpuqueue_sim::data::{self, GPU_NODE_LIST, OPENB_GPUS, POD_LIST_VARIANTS, TRACE_DIR};
use gpuqueue_sim::sampling::{FGD_SEEDS, FGD_TUNE_RATIO, fgd_submission_order};
use gpuqueue_sim::trace::{self, Qos};

fn trace_dir() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    data::find_data_dir(here)
        .unwrap_or_else(|| panic!("{}", data::missing_data_message(here)))
        .join(TRACE_DIR)
}

#[test]
fn every_list_loads_with_the_readme_counts() {
    let dir = trace_dir();
    let nodes = trace::load_nodes(&dir.join(GPU_NODE_LIST)).unwrap();
    assert_eq!(nodes.len(), 1213);
    assert_eq!(
        nodes.iter().map(|n| u64::from(n.gpus)).sum::<u64>(),
        OPENB_GPUS
    );
    let all = trace::load_nodes(&dir.join("openb_node_list_all_node.csv")).unwrap();
    assert_eq!(
        (all.len(), all.iter().filter(|n| n.gpus == 0).count()),
        (1523, 310)
    );

    let expected_rows = |variant: &str| match variant {
        "cpu050" => 7439,
        "cpu100" => 7853,
        "cpu200" => 8832,
        "cpu250" => 9420,
        "multigpu20" => 8324,
        "multigpu30" => 8508,
        "multigpu40" => 8746,
        _ => 8152,
    };
    for variant in POD_LIST_VARIANTS {
        let pods = trace::load_pods(&dir.join(data::pod_list_file(variant))).unwrap();
        assert_eq!(pods.len(), expected_rows(variant), "{variant}");
    }
    let default = trace::load_pods(&dir.join(data::pod_list_file("default"))).unwrap();
    let by_qos = |q: Qos| default.iter().filter(|p| p.qos == Some(q)).count();
    assert_eq!(
        [
            by_qos(Qos::LatencySensitive),
            by_qos(Qos::BestEffort),
            by_qos(Qos::Burstable),
            by_qos(Qos::Guaranteed)
        ],
        [4647, 3398, 100, 7]
    );
    assert_eq!(
        default
            .iter()
            .map(trace::TracePod::total_gpu_milli)
            .sum::<u64>(),
        6_086_800
    );
}

#[test]
fn submission_sequences_reach_130_percent() {
    let dir = trace_dir();
    let capacity = OPENB_GPUS * 1000;
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let target = (FGD_TUNE_RATIO * capacity as f64) as u64;
    for variant in ["default", "multigpu40"] {
        let pods = trace::load_pods(&dir.join(data::pod_list_file(variant))).unwrap();
        for seed in FGD_SEEDS {
            let order = fgd_submission_order(&pods, capacity, FGD_TUNE_RATIO, seed).unwrap();
            let total: u64 = order.iter().map(|&i| pods[i].total_gpu_milli()).sum();
            // At or under the target, within one pod of it (the published quirk lets the last
            // multi-GPU draw pass it by up to 7 GPUs).
            assert!(
                total <= target + 7000 && total + 8000 > target,
                "{variant} seed {seed}: {total}"
            );
        }
    }
}
