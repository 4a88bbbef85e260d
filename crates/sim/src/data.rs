//! Where the real data lives: the Alibaba openb trace and the FGD reference results.
//!
//! The data is not in this repository (research-use licence, 8 MB). It is found, in order, in
//! the directory named by `GPUQUEUE_DATA_DIR`, or in a `shared/data` directory beside the
//! checkout or one of its parents (the layout of the team's machines).

use std::path::{Path, PathBuf};

/// Environment variable naming the data directory.
pub const DATA_DIR_ENV: &str = "GPUQUEUE_DATA_DIR";
/// The trace folder inside the data directory.
pub const TRACE_DIR: &str = "alibaba-gpu-v2023";
/// The FGD reference results folder inside the data directory.
pub const REFERENCE_DIR: &str = "fgd-expected-results";
/// The Helios Venus quota folder inside the data directory.
pub const HELIOS_DIR: &str = "helios-venus";
/// The GPU node list the FGD experiments use (1213 nodes, 6212 GPUs).
pub const GPU_NODE_LIST: &str = "openb_node_list_gpu_node.csv";
/// GPUs in the openb GPU node list.
pub const OPENB_GPUS: u64 = 6212;

/// Every pod-list variant shipped in the trace folder, `default` first.
pub const POD_LIST_VARIANTS: [&str; 16] = [
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare20",
    "gpushare40",
    "gpushare60",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
];

/// The pod-list file of a variant (`default` → `openb_pod_list_default.csv`).
pub fn pod_list_file(variant: &str) -> String {
    format!("openb_pod_list_{variant}.csv")
}

/// The data directory: `GPUQUEUE_DATA_DIR` if set, else the first `shared/data` holding the
/// trace found from `start` upwards.
pub fn find_data_dir(start: &Path) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(DATA_DIR_ENV) {
        return Some(PathBuf::from(dir));
    }
    start
        .ancestors()
        .map(|dir| dir.join("shared").join("data"))
        .find(|candidate| candidate.join(TRACE_DIR).is_dir())
}

/// A clear message for when the data cannot be found.
pub fn missing_data_message(start: &Path) -> String {
    format!(
        "the openb trace was not found: set {DATA_DIR_ENV} to the folder holding {TRACE_DIR}/ and \
         {REFERENCE_DIR}/, or place it in shared/data beside {} or a parent",
        start.display()
    )
}
