//! A node as the policy sees it: host CPU and memory, and its GPU devices grouped in pools (one
//! per resource name: whole GPUs, each MIG profile, shared GPUs) with the GPU model, memory per
//! device and how the devices are shared (see [`Sharing`]).

use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::converted::Converted;
use super::selector::{Labels, Taint};
use super::sharing::{HamiDevice, Sharing, hami_devices};
use crate::quantity::{
    ResourceName, is_gpu_resource, parse_bytes, parse_device_count, parse_milli,
};

/// Most devices of one resource one node may have (8 GPUs × 7 MIG instances fit easily).
pub const MAX_DEVICES_PER_POOL: u32 = 128;

/// The label kube-scheduler and the operator pin pods with.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// A node.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub labels: Labels,
    pub taints: Vec<Taint>,
    /// Ready and not cordoned: new pods may be placed here. Pods already here still count.
    pub schedulable: bool,
    /// Allocatable CPU in milli-cores; `u64::MAX` when the node does not report it.
    pub cpu_milli: u64,
    /// Allocatable memory in bytes; `u64::MAX` when the node does not report it.
    pub memory_bytes: u64,
    /// GPU model (the `nvidia.com/gpu.product` label, or the trace's model column).
    pub gpu_model: Option<String>,
    pub pools: Vec<GpuPool>,
    /// The UUIDs of the devices of its HAMi pool, in pool order (empty without HAMi): how a
    /// running HAMi pod's devices are found (`sharing::seat_hami_pods`).
    pub hami_devices: Vec<String>,
}

/// The devices of one GPU resource on a node: what a node supplies, and what a DRA
/// ResourceSlice maps onto (devices of a resource, memory per device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuPool {
    pub resource: ResourceName,
    /// Physical devices (or MIG slices); a shared device is one device here.
    pub devices: u32,
    /// Memory of one device in MiB, when known.
    pub memory_mib: Option<u64>,
    pub sharing: Sharing,
}

impl GpuPool {
    /// `devices` unshared devices of `resource`, their memory from a MIG profile name.
    pub fn exclusive(resource: impl Into<ResourceName>, devices: u32) -> Self {
        let resource = resource.into();
        Self {
            memory_mib: resource.profile_memory_mib(),
            resource,
            devices,
            sharing: Sharing::Exclusive,
        }
    }

    /// Units kube-scheduler counts in allocatable: devices × replicas (or HAMi's split).
    pub fn schedulable(&self) -> u64 {
        u64::from(self.devices) * u64::from(self.sharing.units_per_device())
    }
}

/// A node that cannot be modelled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("node {node}: {field}: {rule}")]
pub struct NodeError {
    pub node: String,
    pub field: String,
    pub rule: String,
}

impl Node {
    /// A schedulable node with no GPUs and unlimited host resources; add them with the builder
    /// methods.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            labels: [(HOSTNAME_LABEL.to_string(), name.clone())]
                .into_iter()
                .collect(),
            name,
            taints: Vec::new(),
            schedulable: true,
            cpu_milli: u64::MAX,
            memory_bytes: u64::MAX,
            gpu_model: None,
            pools: Vec::new(),
            hami_devices: Vec::new(),
        }
    }

    #[must_use]
    pub fn cpu_milli(mut self, cpu_milli: u64) -> Self {
        self.cpu_milli = cpu_milli;
        self
    }

    #[must_use]
    pub fn memory_bytes(mut self, memory_bytes: u64) -> Self {
        self.memory_bytes = memory_bytes;
        self
    }

    #[must_use]
    pub fn gpu_model(mut self, model: impl Into<String>) -> Self {
        self.gpu_model = Some(model.into());
        self
    }

    /// Adds `devices` devices of `resource`; their memory comes from a MIG profile name.
    #[must_use]
    pub fn gpus(mut self, resource: impl Into<ResourceName>, devices: u32) -> Self {
        self.pools.push(GpuPool::exclusive(resource, devices));
        self
    }

    /// Adds a pool as given (shared devices, memory per device).
    #[must_use]
    pub fn pool(mut self, pool: GpuPool) -> Self {
        self.pools.push(pool);
        self
    }

    #[must_use]
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Reads a Kubernetes node: allocatable CPU, memory and GPU resources, GPU feature
    /// discovery labels, taints, and whether new pods may go there.
    pub fn from_k8s(node: &k8s::Node) -> Result<Converted<Self>, NodeError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let err = |field: &str, rule: String| NodeError {
            node: name.clone(),
            field: field.to_string(),
            rule,
        };
        if name.is_empty() {
            return Err(err("metadata.name", "must be set".into()));
        }
        let mut warnings = Vec::new();
        let labels: Labels = node
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let status = node.status.as_ref();
        let resources = status
            .and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()))
            .cloned()
            .unwrap_or_default();

        let cpu_milli = match resources.get("cpu") {
            Some(q) => parse_milli(&q.0).map_err(|e| err(&allocatable("cpu"), e.to_string()))?,
            None => u64::MAX,
        };
        let memory_bytes = match resources.get("memory") {
            Some(q) => parse_bytes(&q.0).map_err(|e| err(&allocatable("memory"), e.to_string()))?,
            None => u64::MAX,
        };
        let whole_gpu_memory = whole_gpu_memory(&name, &labels, &mut warnings);
        let replicas = Sharing::from_labels(&labels).map_err(|(field, rule)| err(&field, rule))?;
        let hami = hami_devices(node.metadata.annotations.as_ref())
            .map_err(|(field, rule)| err(&field, rule))?;
        let mut pools = gpu_pools(&resources, whole_gpu_memory, replicas, &name, &mut warnings)
            .map_err(|(field, rule)| err(&field, rule))?;
        let mut hami_devices = Vec::new();
        if let Some(devices) = hami {
            pools.retain(|p| p.resource.as_str() != gpuqueue_api::NVIDIA_GPU);
            pools.extend(hami_pool(&devices));
            pools.sort_by(|a, b| a.resource.cmp(&b.resource));
            hami_devices = devices
                .into_iter()
                .filter(|d| d.healthy)
                .map(|d| d.uuid)
                .take(MAX_DEVICES_PER_POOL as usize)
                .collect();
        }
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|t| t.iter().filter_map(Taint::from_k8s).collect())
            .unwrap_or_default();
        Ok(Converted {
            value: Self {
                gpu_model: labels.get(gpuqueue_api::node_labels::GPU_PRODUCT).cloned(),
                name,
                labels,
                taints,
                schedulable: is_schedulable(node),
                cpu_milli,
                memory_bytes,
                pools,
                hami_devices,
            },
            warnings,
        })
    }

    /// The value pods are pinned with: the hostname label, or the name when it is missing.
    pub fn hostname(&self) -> &str {
        self.labels
            .get(HOSTNAME_LABEL)
            .map_or(&self.name, String::as_str)
    }
}

/// The field of an allocatable resource, for errors.
fn allocatable(resource: &str) -> String {
    format!("status.allocatable[{resource}]")
}

/// Memory of one whole GPU from the GPU feature discovery label; a malformed label is a
/// warning and leaves it unknown.
fn whole_gpu_memory(name: &str, labels: &Labels, warnings: &mut Vec<String>) -> Option<u64> {
    let gpu_memory_label = labels.get(gpuqueue_api::node_labels::GPU_MEMORY_MIB);
    match gpu_memory_label.map(|v| v.parse::<u64>()) {
        None => None,
        Some(Ok(mib)) => Some(mib),
        Some(Err(_)) => {
            warnings.push(format!(
                "node {name}: label {}={:?} is not a number of MiB; GPU memory of this node is unknown",
                gpuqueue_api::node_labels::GPU_MEMORY_MIB,
                gpu_memory_label.map(String::as_str).unwrap_or_default()
            ));
            None
        }
    }
}

/// One pool per GPU resource the node has devices of, whole GPUs shared as `sharing` says; an
/// error names the field and the rule.
fn gpu_pools(
    resources: &std::collections::BTreeMap<String, Quantity>,
    whole_gpu_memory: Option<u64>,
    sharing: Sharing,
    node: &str,
    warnings: &mut Vec<String>,
) -> Result<Vec<GpuPool>, (String, String)> {
    let mut pools = Vec::new();
    for (resource, quantity) in resources {
        if !is_gpu_resource(resource) {
            continue;
        }
        let mut units =
            parse_device_count(&quantity.0).map_err(|e| (allocatable(resource), e.to_string()))?;
        if units == 0 {
            continue;
        }
        let whole = is_whole_gpu(resource);
        let sharing = if whole { sharing } else { Sharing::Exclusive };
        let per_device = u64::from(sharing.units_per_device());
        if units % per_device != 0 {
            warnings.push(format!(
                "node {node}: {} {units} is not a multiple of {}={per_device}; counted as {} shared devices",
                allocatable(resource),
                gpuqueue_api::node_labels::GPU_REPLICAS,
                units.div_ceil(per_device)
            ));
        }
        units = units.div_ceil(per_device);
        let devices = u32::try_from(units)
            .ok()
            .filter(|d| *d <= MAX_DEVICES_PER_POOL)
            .ok_or_else(|| {
                (
                    allocatable(resource),
                    format!(
                        "more than {MAX_DEVICES_PER_POOL} devices of one resource are not supported"
                    ),
                )
            })?;
        let mut pool = GpuPool::exclusive(resource.as_str(), devices);
        if whole {
            pool.memory_mib = whole_gpu_memory;
        }
        pool.sharing = sharing;
        pools.push(pool);
    }
    Ok(pools)
}

/// Whole NVIDIA GPUs, shared or not (`nvidia.com/gpu`, or `nvidia.com/gpu.shared` renamed).
fn is_whole_gpu(resource: &str) -> bool {
    resource == gpuqueue_api::NVIDIA_GPU || resource == gpuqueue_api::NVIDIA_GPU_SHARED
}

/// The `nvidia.com/gpu` pool of a node HAMi manages, from its registered healthy devices: the
/// smallest memory and split among them (a pool's devices are alike).
fn hami_pool(devices: &[HamiDevice]) -> Option<GpuPool> {
    let healthy: Vec<&HamiDevice> = devices.iter().filter(|d| d.healthy).collect();
    let count = u32::try_from(healthy.len()).ok().filter(|c| *c > 0)?;
    Some(GpuPool {
        resource: ResourceName::nvidia_gpu(),
        devices: count.min(MAX_DEVICES_PER_POOL),
        memory_mib: healthy.iter().map(|d| d.memory_mib).min(),
        sharing: Sharing::Hami {
            split: healthy.iter().map(|d| d.split).min().unwrap_or(1),
        },
    })
}

/// Ready and not cordoned.
fn is_schedulable(node: &k8s::Node) -> bool {
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    ready && !cordoned
}
