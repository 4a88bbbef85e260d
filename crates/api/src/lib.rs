//! The `gpuqueue.io` API: the `GpuQueue` custom resource and the names the operator, the CLI
//! and users share (the scheduling gate, annotations, condition types, the field manager).
//!
//! This crate describes what users write; it has no client, no runtime and no I/O.

pub mod conditions;
pub mod duration;
pub mod v1alpha1;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group of every gpuqueue resource.
pub const GROUP: &str = "gpuqueue.io";

/// The scheduling gate that holds a GPU pod until its queue admits it.
pub const ADMISSION_GATE: &str = "gpuqueue.io/admission";

/// The one field manager the operator writes with (status, pod patches, annotations).
pub const FIELD_MANAGER: &str = "gpuqueue-operator";

/// Pod annotations the operator writes and reads.
pub mod annotations {
    /// The queue a pod was admitted under.
    pub const QUEUE: &str = "gpuqueue.io/queue";
    /// RFC 3339 time at which the gate was released.
    pub const ADMITTED_AT: &str = "gpuqueue.io/admitted-at";
    /// `guaranteed` or `borrowed`: the quota the pod was admitted against.
    pub const ADMITTED_AS: &str = "gpuqueue.io/admitted-as";
    /// On a pod the webhook admitted at its creation (never gated): the token of the capacity
    /// the leader reserved for it until its pod store shows the pod.
    pub const ADMITTED_AT_CREATION: &str = "gpuqueue.io/admitted-at-creation";
    /// The operator's HMAC of the admission annotations and of the pod they admit: an admission
    /// without a valid one (written by a tenant while the webhook could not answer) is ignored.
    pub const ADMISSION_SEAL: &str = "gpuqueue.io/admission-seal";
    /// Why a gated pod is still waiting, in one human-readable line (`kubectl gpuqueue explain`).
    pub const WAITING_REASON: &str = "gpuqueue.io/waiting-reason";
    /// A user's hint of how much work a checkpoint of this pod saves (bigger: evict later).
    pub const CHECKPOINT_COST: &str = "gpuqueue.io/checkpoint-cost";
    /// The largest `gpuqueue.io/checkpoint-cost` believed, so that no tenant claims more than
    /// the documented maximum: the webhook lowers a bigger one at creation, and the core reads
    /// one that came another way (an unclaimed namespace, the webhook down) as this.
    pub const CHECKPOINT_COST_MAX: u64 = 1000;
    /// The id of the reclaim this pod takes part in, written before any action.
    pub const RECLAIM_ID: &str = "gpuqueue.io/reclaim-id";
    /// `owner` or `victim`: this pod's part in the reclaim.
    pub const RECLAIM_ROLE: &str = "gpuqueue.io/reclaim-role";
    /// RFC 3339 deadline of the reclaim; an intent past it is stale.
    pub const RECLAIM_DEADLINE: &str = "gpuqueue.io/reclaim-deadline";
    /// The node the reclaim frees for the owner.
    pub const RECLAIM_NODE: &str = "gpuqueue.io/reclaim-node";
    /// Progress of a victim through the reclaim: `checkpointing` once its checkpoint call is
    /// made (written just before it, so that no process ever makes it twice).
    pub const RECLAIM_PROGRESS: &str = "gpuqueue.io/reclaim-progress";
    /// On the owner: its reclaim's victims as JSON, `[{"pod": "namespace/name", "uid": "…",
    /// "queue": "…"}]`, so that a leader resuming the handover knows every victim even once
    /// some are gone.
    pub const RECLAIM_VICTIMS: &str = "gpuqueue.io/reclaim-victims";
    /// On a DeviceClass (admin-owned): the GPU resource its devices are charged as, for a
    /// class with no `spec.extendedResourceName`, such as one per MIG profile.
    pub const QUOTA_RESOURCE: &str = "gpuqueue.io/quota-resource";
}

/// Reasons of the operator's events that `kubectl gpuqueue` reads back.
pub mod events {
    /// On a pod whose admission annotations the operator does not believe (no seal, or one
    /// that does not verify): the pod is charged to its queue as unadmitted.
    pub const ADMISSION_NOT_BELIEVED: &str = "AdmissionNotBelieved";
}

/// Node labels written by NVIDIA GPU feature discovery, which placement reads.
pub mod node_labels {
    /// GPU model, such as `NVIDIA-H100-80GB-HBM3`.
    pub const GPU_PRODUCT: &str = "nvidia.com/gpu.product";
    /// Memory of one GPU device, in MiB.
    pub const GPU_MEMORY_MIB: &str = "nvidia.com/gpu.memory";
    /// Number of GPU devices on the node.
    pub const GPU_COUNT: &str = "nvidia.com/gpu.count";
    /// Times each GPU is advertised when the device plugin shares it (time-slicing or MPS).
    pub const GPU_REPLICAS: &str = "nvidia.com/gpu.replicas";
    /// How the device plugin shares each GPU: `none`, `time-slicing` or `mps`.
    pub const GPU_SHARING_STRATEGY: &str = "nvidia.com/gpu.sharing-strategy";
}

/// HAMi's names: the node annotation its device plugin registers devices with, and the
/// per-container resources that ask for a part of each `nvidia.com/gpu` device.
pub mod hami {
    /// `{uuid},{split count},{memory MiB},{cores %},{type},{numa},{healthy}` per device,
    /// devices separated by `:`.
    pub const NODE_REGISTER: &str = "hami.io/node-nvidia-register";
    /// Device memory per device, MiB.
    pub const GPU_MEMORY: &str = "nvidia.com/gpumem";
    /// Device memory per device, percent of the device's.
    pub const GPU_MEMORY_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";
    /// Compute per device, percent of the device's streaming multiprocessors.
    pub const GPU_CORES: &str = "nvidia.com/gpucores";
}

/// The resource the NVIDIA device plugin advertises shared GPUs under when it renames them.
pub const NVIDIA_GPU_SHARED: &str = "nvidia.com/gpu.shared";

/// The resource name of a whole NVIDIA GPU.
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";

/// The CustomResourceDefinitions of this API, in the order they should be installed.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![v1alpha1::GpuQueue::crd()]
}

/// The files of `crds/`: each CRD as YAML under `<name>.yaml`, exactly as `make crds` writes
/// them, so a test can tell when the committed files are stale.
pub fn crd_files() -> Result<Vec<(String, String)>, serde_yaml::Error> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_yaml::to_string(&crd)?;
            let text = format!("# Generated by `make crds` from crates/api; do not edit.\n{yaml}");
            Ok((format!("{name}.yaml"), text))
        })
        .collect()
}
