//! A node as the policy sees it: host CPU and memory, and its GPU devices grouped in pools (one
//! per resource name: whole GPUs, each MIG profile) with the GPU model and memory per device.

use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::converted::Converted;
use super::selector::{Labels, Taint};
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
}

/// The devices of one GPU resource on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuPool {
    pub resource: ResourceName,
    pub devices: u32,
    /// Memory of one device in MiB, when known.
    pub memory_mib: Option<u64>,
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
        let resource = resource.into();
        let memory_mib = resource.profile_memory_mib();
        self.pools.push(GpuPool {
            resource,
            devices,
            memory_mib,
        });
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
        let pools =
            gpu_pools(&resources, whole_gpu_memory).map_err(|(field, rule)| err(&field, rule))?;
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

/// One pool per GPU resource the node has devices of; an error names the field and the rule.
fn gpu_pools(
    resources: &std::collections::BTreeMap<String, Quantity>,
    whole_gpu_memory: Option<u64>,
) -> Result<Vec<GpuPool>, (String, String)> {
    let mut pools = Vec::new();
    for (resource, quantity) in resources {
        if !is_gpu_resource(resource) {
            continue;
        }
        let devices =
            parse_device_count(&quantity.0).map_err(|e| (allocatable(resource), e.to_string()))?;
        if devices == 0 {
            continue;
        }
        let devices = u32::try_from(devices)
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
        let resource = ResourceName::new(resource);
        let memory_mib =
            resource
                .profile_memory_mib()
                .or(if resource.as_str() == gpuqueue_api::NVIDIA_GPU {
                    whole_gpu_memory
                } else {
                    None
                });
        pools.push(GpuPool {
            resource,
            devices,
            memory_mib,
        });
    }
    Ok(pools)
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
