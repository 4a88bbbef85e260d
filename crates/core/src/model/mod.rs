//! The domain model: queues, nodes, pods and namespaces as the policy sees them, each converted
//! from its Kubernetes object by a pure function that returns a typed error for bad input.

mod claim;
mod converted;
pub mod device_slices;
pub mod dra;
mod hami_seats;
mod namespace;
mod node;
mod pod;
mod queue;
pub mod selector;
mod sharing;

pub use claim::{Claim, claim_of};
pub use converted::Converted;
pub use hami_seats::seat_hami_pods;
pub use namespace::Namespace;
pub use node::{GpuPool, HOSTNAME_LABEL, MAX_DEVICES_PER_POOL, Node, NodeError};
pub use pod::{
    AdmittedAs, Assignment, DeviceMemory, DeviceSet, GpuRequest, Pod, PodError, PodKey, PodState,
    ReclaimMark, ReclaimRole, Requests, asks_known_devices, gate_index, has_finished, is_gated,
    is_gpu_pod, is_held_owner, uses_resource_claims,
};
pub use queue::{
    CheckpointSettings, FieldError, MAX_BUDGET, MAX_MIN_BORROW, Queue, QueueError, ReclaimSettings,
    ResourceQuota, format_duration,
};
pub use sharing::{HamiDevice, MAX_SHARES_PER_DEVICE, ReplicaStrategy, Sharing, hami_allocated};
