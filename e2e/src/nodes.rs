//! Fake GPU nodes, as KWOK runs them and as NVIDIA's device plugin and GPU feature discovery
//! would describe them: extended resources in capacity, model and memory in labels.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use gpuqueue_api::{NVIDIA_GPU, node_labels};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;

/// The GPU model of the default nodes, as GPU feature discovery spells it.
pub const H100_PRODUCT: &str = "NVIDIA-H100-80GB-HBM3";
/// Memory of one H100 80GB device in MiB, as GPU feature discovery reports it.
pub const H100_MEMORY_MIB: u64 = 81_559;
/// The MIG profile with a seventh of an H100 (1 compute slice, 10 GB).
pub const MIG_1G_10GB: &str = "nvidia.com/mig-1g.10gb";
/// The MIG profile with three sevenths of an H100 (3 compute slices, 40 GB).
pub const MIG_3G_40GB: &str = "nvidia.com/mig-3g.40gb";

/// One fake node: its name, GPU resources and GPU feature discovery labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuNode {
    /// The node's name (also its `kubernetes.io/hostname`).
    pub name: String,
    /// Extended resources in capacity and allocatable, such as `nvidia.com/gpu: 8`.
    pub resources: BTreeMap<String, u32>,
    /// Physical GPU devices on the node (`nvidia.com/gpu.count`).
    pub gpu_count: u32,
    /// GPU model (`nvidia.com/gpu.product`).
    pub gpu_product: String,
    /// Memory of one device in MiB (`nvidia.com/gpu.memory`).
    pub gpu_memory_mib: u64,
    /// More labels (zones, pools, GPU sharing).
    pub labels: BTreeMap<String, String>,
    /// Annotations beside KWOK's (HAMi's device registration).
    pub annotations: BTreeMap<String, String>,
}

impl GpuNode {
    /// A node with `count` whole H100 GPUs advertised as `nvidia.com/gpu`.
    pub fn whole_gpus(name: impl Into<String>, count: u32) -> Self {
        Self {
            name: name.into(),
            resources: BTreeMap::from([(NVIDIA_GPU.to_owned(), count)]),
            gpu_count: count,
            gpu_product: H100_PRODUCT.to_owned(),
            gpu_memory_mib: H100_MEMORY_MIB,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }

    /// A node with two H100s partitioned by MIG (mixed strategy): one as seven `1g.10gb`
    /// instances, one as two `3g.40gb` instances. No whole `nvidia.com/gpu` is advertised.
    pub fn mig(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            resources: BTreeMap::from([(MIG_1G_10GB.to_owned(), 7), (MIG_3G_40GB.to_owned(), 2)]),
            gpu_count: 2,
            gpu_product: H100_PRODUCT.to_owned(),
            gpu_memory_mib: H100_MEMORY_MIB,
            labels: BTreeMap::from([("nvidia.com/mig.strategy".to_owned(), "mixed".to_owned())]),
            annotations: BTreeMap::new(),
        }
    }

    /// The default cluster: `gpu-node-0`…`gpu-node-3` with 8 `nvidia.com/gpu` each, and
    /// `mig-node-0` with MIG instances.
    pub fn default_set() -> Vec<Self> {
        let mut nodes: Vec<Self> = (0..4)
            .map(|i| Self::whole_gpus(format!("gpu-node-{i}"), 8))
            .collect();
        nodes.push(Self::mig("mig-node-0"));
        nodes
    }

    /// Adds an annotation.
    #[must_use]
    pub fn with_annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Advertises `count` of an extended resource (replacing any count it had).
    #[must_use]
    pub fn with_resource(mut self, name: impl Into<String>, count: u32) -> Self {
        self.resources.insert(name.into(), count);
        self
    }

    /// Adds a label.
    #[must_use]
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The Node object, with its status, as KWOK expects it: KWOK keeps capacity and
    /// allocatable and marks the node Ready.
    pub(crate) fn to_node(&self, address: Ipv4Addr) -> Node {
        let mut labels = self.labels.clone();
        labels.extend(
            [
                ("type", "kwok".to_owned()),
                ("kubernetes.io/hostname", self.name.clone()),
                ("kubernetes.io/os", "linux".to_owned()),
                ("kubernetes.io/arch", "amd64".to_owned()),
                (node_labels::GPU_PRODUCT, self.gpu_product.clone()),
                (node_labels::GPU_MEMORY_MIB, self.gpu_memory_mib.to_string()),
                (node_labels::GPU_COUNT, self.gpu_count.to_string()),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        let mut capacity = BTreeMap::from(
            [("cpu", "64"), ("memory", "512Gi"), ("pods", "110")]
                .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned()))),
        );
        capacity.extend(
            self.resources
                .iter()
                .map(|(name, count)| (name.clone(), Quantity(count.to_string()))),
        );
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(labels),
                annotations: Some({
                    let mut annotations = self.annotations.clone();
                    annotations.insert("kwok.x-k8s.io/node".to_owned(), "fake".to_owned());
                    annotations
                }),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(NodeStatus {
                allocatable: Some(capacity.clone()),
                capacity: Some(capacity),
                addresses: Some(vec![
                    NodeAddress {
                        type_: "InternalIP".to_owned(),
                        address: address.to_string(),
                    },
                    NodeAddress {
                        type_: "Hostname".to_owned(),
                        address: self.name.clone(),
                    },
                ]),
                ..NodeStatus::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_set_is_four_whole_gpu_nodes_and_one_mig_node() {
        let nodes = GpuNode::default_set();
        let whole: u32 = nodes
            .iter()
            .filter_map(|n| n.resources.get(NVIDIA_GPU))
            .sum();
        assert_eq!(whole, 32);
        let mig = nodes
            .iter()
            .find(|n| n.name == "mig-node-0")
            .map(|n| &n.resources);
        assert_eq!(
            mig,
            Some(&BTreeMap::from([
                (MIG_1G_10GB.to_owned(), 7),
                (MIG_3G_40GB.to_owned(), 2)
            ]))
        );
    }

    #[test]
    fn node_carries_gpu_feature_discovery_labels_and_capacity() {
        let node = GpuNode::whole_gpus("n", 8).to_node(Ipv4Addr::new(127, 99, 0, 1));
        let labels = node.metadata.labels.unwrap_or_default();
        assert_eq!(labels[node_labels::GPU_PRODUCT], H100_PRODUCT);
        assert_eq!(labels[node_labels::GPU_MEMORY_MIB], "81559");
        assert_eq!(labels[node_labels::GPU_COUNT], "8");
        let status = node.status.unwrap_or_default();
        assert_eq!(
            status.capacity.unwrap_or_default()[NVIDIA_GPU],
            Quantity("8".into())
        );
        assert_eq!(
            status.addresses.unwrap_or_default()[0].address,
            "127.99.0.1"
        );
    }
}
