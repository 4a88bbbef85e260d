//! A queue's caps on GPU memory and compute (`gpuMemory`, `gpuCores`): which nodes they keep
//! a pod off. What a pod's devices cost depends on the node's pool (a HAMi slice or a
//! time-sliced replica costs a share of the device's memory), so a cap is judged per node.
//! Admission places a pod only where its caps allow, and a reclaim frees room only there.

use crate::devices::{ResolvedGpu, unit_cost};
use crate::ids::{NodeId, PodId, QueueId, ResourceId};
use crate::model::DeviceMemory;
use crate::snapshot::Snapshot;

/// A queue's room left under its GPU memory and compute caps for one resource of a pod.
struct CapRoom {
    gpu: ResolvedGpu,
    memory_left_mib: Option<u64>,
    cores_left_milli: Option<u64>,
    /// Devices the pod is placed on; otherwise held in quota only (`Requests::quota_only`:
    /// devices kube-scheduler may allocate instead), judged only where the node has their pool.
    placed: bool,
}

/// Which of a queue's caps keeps the pod's devices off a node, for one resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CapBlock {
    Memory(ResourceId),
    Cores(ResourceId),
}

/// For each node, the cap that keeps the pod's devices off it, if one does (what the pod's
/// units take there: see `devices::unit_cost`). Memory is checked first.
pub(crate) fn cap_filter(
    snapshot: &Snapshot,
    queue: QueueId,
    pod: PodId,
) -> impl Fn(NodeId) -> Option<CapBlock> + '_ {
    let caps: Vec<CapRoom> = snapshot.slot(pod).map_or_else(Vec::new, |slot| {
        let quota_only = slot.pod.requests.quota_only.iter().filter_map(|g| {
            let resolved = ResolvedGpu::new(snapshot.resource_id(&g.resource)?, g)?;
            Some((resolved, false))
        });
        slot.gpus
            .iter()
            .map(|g| (g.clone(), true))
            .chain(quota_only)
            .filter_map(|(g, placed)| {
                let usage = snapshot.usage_of(queue, g.resource)?;
                let room = CapRoom {
                    placed,
                    gpu: g,
                    memory_left_mib: usage
                        .memory_cap_mib
                        .map(|cap| cap.saturating_sub(usage.memory_mib)),
                    cores_left_milli: usage
                        .cores_cap_milli
                        .map(|cap| cap.saturating_sub(usage.cores_milli)),
                };
                (room.memory_left_mib.is_some() || room.cores_left_milli.is_some()).then_some(room)
            })
            .collect()
    });
    move |node: NodeId| {
        let n = snapshot.node_state(node);
        caps.iter().find_map(|cap| {
            let resource = cap.gpu.resource;
            let Some(pool) = n.pool(resource) else {
                if !cap.placed {
                    return None;
                }
                return Some(if cap.memory_left_mib.is_some() {
                    CapBlock::Memory(resource)
                } else {
                    CapBlock::Cores(resource)
                });
            };
            let cost = unit_cost(pool, &cap.gpu);
            let units = u64::from(cap.gpu.count);
            // Memory cannot be counted on a pool that does not say its devices' memory.
            let memory_ok = cap.memory_left_mib.is_none_or(|left| {
                (pool.memory_mib.is_some() || matches!(cap.gpu.memory, DeviceMemory::Mib(_)))
                    && u64::from(cost.memory_mib) * units <= left
            });
            let cores_ok = cap
                .cores_left_milli
                .is_none_or(|left| u64::from(cost.compute_milli) * units <= left);
            if !memory_ok {
                Some(CapBlock::Memory(resource))
            } else if !cores_ok {
                Some(CapBlock::Cores(resource))
            } else {
                None
            }
        })
    }
}
