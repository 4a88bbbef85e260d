//! Reads the Alibaba GPU trace (`openb`) of the shared data folder into the core's model.
//! The folder is `$GPUQUEUE_DATA_DIR`, by default `/work/shared/data`; a missing file fails
//! the test loudly rather than letting it pass without checking anything.

use std::{fs, path::PathBuf};

use gpuqueue_core::fragmentation::TaskShape;
use gpuqueue_core::model::{GpuRequest, Node};

pub fn data_dir() -> PathBuf {
    std::env::var_os("GPUQUEUE_DATA_DIR")
        .map_or_else(|| PathBuf::from("/work/shared/data"), PathBuf::from)
}

fn read(name: &str) -> String {
    let path = data_dir().join("alibaba-gpu-v2023").join(name);
    fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("cannot read the trace file {} ({e}); set GPUQUEUE_DATA_DIR to the folder holding alibaba-gpu-v2023/", path.display())
    })
}

/// Rows of a CSV file with a header and no quoted fields, as (header, rows).
fn rows(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = text.lines();
    let header = lines
        .next()
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    let rows = lines
        .filter(|l| !l.is_empty())
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    (header, rows)
}

fn column(header: &[String], name: &str) -> usize {
    header
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("column {name} missing"))
}

/// The 1213 GPU nodes (6212 GPUs).
pub fn nodes() -> Vec<Node> {
    let (header, rows) = rows(&read("openb_node_list_gpu_node.csv"));
    let (sn, cpu, mem, gpu, model) = (
        column(&header, "sn"),
        column(&header, "cpu_milli"),
        column(&header, "memory_mib"),
        column(&header, "gpu"),
        column(&header, "model"),
    );
    rows.iter()
        .map(|r| {
            let mut node = Node::new(r[sn].clone())
                .cpu_milli(r[cpu].parse().unwrap())
                .memory_bytes(r[mem].parse::<u64>().unwrap() << 20);
            if !r[model].is_empty() {
                node = node.gpu_model(r[model].clone());
            }
            let gpus: u32 = r[gpu].parse().unwrap();
            if gpus > 0 {
                node = node.gpus("nvidia.com/gpu", gpus);
            }
            node
        })
        .collect()
}

/// A task of a pod list: its shape and memory.
#[derive(Clone, Debug)]
pub struct Task {
    pub shape: TaskShape,
    pub memory_mib: u64,
}

/// The tasks of `openb_pod_list_<variant>.csv`.
pub fn tasks(variant: &str) -> Vec<Task> {
    let (header, rows) = rows(&read(&format!("openb_pod_list_{variant}.csv")));
    let (cpu, mem, num, milli) = (
        column(&header, "cpu_milli"),
        column(&header, "memory_mib"),
        column(&header, "num_gpu"),
        column(&header, "gpu_milli"),
    );
    let spec = header.iter().position(|h| h == "gpu_spec");
    rows.iter()
        .map(|r| {
            let count: u32 = r[num].parse().unwrap();
            let per: u32 = r[milli].parse().unwrap();
            // As written: FGD groups tasks by the spec string, so `A|B|B` is not `A|B`.
            let gpu_models: Vec<String> = spec
                .map(|s| {
                    r[s].split('|')
                        .filter(|m| !m.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            let gpu = (count > 0 && per > 0).then(|| GpuRequest {
                count,
                milli_per_device: per,
                ..GpuRequest::devices("nvidia.com/gpu", count)
            });
            Task {
                shape: TaskShape {
                    cpu_milli: r[cpu].parse().unwrap(),
                    gpu,
                    gpu_models,
                },
                memory_mib: r[mem].parse().unwrap(),
            }
        })
        .collect()
}
