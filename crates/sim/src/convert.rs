//! Trace rows to the core's model: nodes with one `nvidia.com/gpu` pool, pods with a whole or
//! shared GPU request, and the FGD workload mix ("typical pods") of a pod list.

use gpuqueue_core::fragmentation::{DEFAULT_POPULARITY, TaskShape, WorkloadMix};
use gpuqueue_core::model::{GpuRequest, Node, Pod, PodKey, Requests};
use gpuqueue_core::quantity::ResourceName;
use std::time::Duration;

use jiff::Timestamp;

use crate::engine::SimTime;
use crate::trace::{MILLI_PER_GPU, TraceNode, TracePod};
use crate::workload::Shape;

/// The GPU resource every trace node and pod uses.
pub fn gpu_resource() -> ResourceName {
    ResourceName::nvidia_gpu()
}

/// A node of a node list. Memory is in MiB there.
pub fn node(trace: &TraceNode) -> Node {
    let mut node = Node::new(trace.name.clone())
        .cpu_milli(u64::from(trace.cpu_milli))
        .memory_bytes(trace.memory_mib.saturating_mul(1 << 20));
    if let Some(model) = &trace.gpu_model {
        node = node.gpu_model(model.clone());
    }
    if trace.gpus > 0 {
        node = node.gpus(gpu_resource(), trace.gpus);
    }
    node
}

/// The GPU request of `num_gpu` GPUs at `gpu_milli` each, if any.
fn gpu_request(num_gpu: u32, gpu_milli: u32) -> Option<GpuRequest> {
    match (num_gpu, gpu_milli) {
        (0, _) | (_, 0) => None,
        (1, milli) if milli < MILLI_PER_GPU => Some(GpuRequest::shared(gpu_resource(), milli)),
        (count, _) => Some(GpuRequest::devices(gpu_resource(), count)),
    }
}

/// What a trace task requests.
pub fn requests(task: &TracePod) -> Requests {
    Requests {
        cpu_milli: u64::from(task.cpu_milli),
        memory_bytes: task.memory_mib.saturating_mul(1 << 20),
        gpus: gpu_request(task.num_gpu, task.gpu_milli)
            .into_iter()
            .collect(),
        quota_only: Vec::new(),
    }
}

/// What a workload shape requests (no host memory: scenarios do not model it).
pub fn shape_requests(shape: &Shape) -> Requests {
    Requests {
        cpu_milli: u64::from(shape.cpu_milli),
        memory_bytes: 0,
        gpus: gpu_request(shape.gpus, shape.gpu_milli)
            .into_iter()
            .collect(),
        quota_only: Vec::new(),
    }
}

/// The core's timestamp of a simulated instant (the run starts at the Unix epoch).
pub fn timestamp(at: SimTime) -> Timestamp {
    let micros = i64::try_from(at.since(SimTime::ZERO).as_micros()).unwrap_or(i64::MAX);
    Timestamp::from_microsecond(micros).unwrap_or(Timestamp::MAX)
}

/// The first simulated instant at or after a core timestamp (the simulator counts whole
/// microseconds; before the start reads as the start): a pass woken then finds `at` passed.
pub fn sim_time(at: Timestamp) -> SimTime {
    let since = Duration::try_from(at.duration_since(Timestamp::UNIX_EPOCH)).unwrap_or_default();
    let micros = since.as_nanos().div_ceil(1000);
    SimTime::from_duration(Duration::from_micros(
        u64::try_from(micros).unwrap_or(u64::MAX),
    ))
}

/// A pending pod for a trace task.
pub fn pod(namespace: &str, name: String, task: &TracePod, at: SimTime) -> Pod {
    let mut pod = Pod::new(PodKey::new(namespace, name), requests(task), timestamp(at));
    pod.gpu_models.clone_from(&task.gpu_spec);
    pod
}

/// The FGD shape of a trace task.
pub fn task_shape(task: &TracePod) -> TaskShape {
    TaskShape {
        cpu_milli: u64::from(task.cpu_milli),
        gpu: gpu_request(task.num_gpu, task.gpu_milli),
        gpu_models: task.gpu_spec.clone(),
    }
}

/// FGD's typical pods of a pod list: the most frequent shapes covering 95% of the tasks.
pub fn workload_mix(tasks: &[TracePod]) -> WorkloadMix {
    WorkloadMix::from_shapes(tasks.iter().map(task_shape), DEFAULT_POPULARITY)
}

/// The typical pods of workload shapes (for scenarios), with the same 95% rule.
pub fn shape_mix<'a>(shapes: impl IntoIterator<Item = &'a Shape>) -> WorkloadMix {
    WorkloadMix::from_shapes(
        shapes.into_iter().map(|s| TaskShape {
            cpu_milli: u64::from(s.cpu_milli),
            gpu: gpu_request(s.gpus, s.gpu_milli),
            gpu_models: s.gpu_models.clone(),
        }),
        DEFAULT_POPULARITY,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    #[test]
    fn gpu_requests() {
        assert_eq!(gpu_request(0, 0), None);
        assert_eq!(
            gpu_request(1, 470),
            Some(GpuRequest::shared(gpu_resource(), 470))
        );
        assert_eq!(
            gpu_request(8, 1000),
            Some(GpuRequest::devices(gpu_resource(), 8))
        );
        assert_eq!(
            gpu_request(1, 1000),
            Some(GpuRequest::devices(gpu_resource(), 1))
        );
    }

    #[test]
    fn timestamps_count_from_the_epoch() {
        assert_eq!(timestamp(SimTime::ZERO), Timestamp::UNIX_EPOCH);
        assert_eq!(
            timestamp(SimTime::from_secs_f64(1.5)).as_millisecond(),
            1500
        );
    }

    #[test]
    fn nodes_carry_model_cpu_memory_and_gpus() {
        let n = node(&TraceNode {
            name: "n".into(),
            cpu_milli: 64000,
            memory_mib: 2,
            gpus: 2,
            gpu_model: Some("T4".into()),
        });
        assert_eq!((n.cpu_milli, n.memory_bytes), (64000, 2 << 20));
        assert_eq!(n.gpu_model.as_deref(), Some("T4"));
        assert_eq!(n.pools[0].devices, 2);
    }
}
