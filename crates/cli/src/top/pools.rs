//! The pool report of `top`, from the cluster's objects: the core reads them into a snapshot
//! (the same conversions, seating and workload mix as the operator's admission pass) and this
//! module only reads the snapshot's numbers back out, per node and resource.

use std::collections::BTreeMap;

use gpuqueue_api::v1alpha1::GpuQueue;
use gpuqueue_core::Snapshot;
use gpuqueue_core::fragmentation::{DEFAULT_POPULARITY, WorkloadMix};
use gpuqueue_core::ids::NodeId;
use gpuqueue_core::model::{self, Converted};
use gpuqueue_core::quantity::{MILLI_PER_DEVICE, Milli};
use gpuqueue_core::snapshot::Attribution;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use serde::Serialize;

/// Who holds GPUs of a pod whose namespace no queue claims.
pub const NO_QUEUE: &str = "(no queue)";
/// Who holds GPUs of a pod whose namespace several queues claim.
pub const CONFLICT: &str = "(conflict)";

/// GPU allocation and fragmentation of every GPU node, and of the cluster.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolReport {
    /// Nodes with at least one GPU resource, by name.
    pub nodes: Vec<NodeReport>,
    pub cluster: ClusterReport,
    /// Objects the core could not read, left out of the numbers.
    pub problems: Vec<String>,
}

/// One GPU node.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub name: String,
    /// The `nvidia.com/gpu.product` label.
    pub gpu_model: Option<String>,
    /// Ready and not cordoned.
    pub schedulable: bool,
    /// Free GPU capacity the workload mix cannot use (FGD's `F_n`, in GPUs), over all the
    /// node's resources.
    pub fragmented_gpus: f64,
    pub pools: Vec<PoolRow>,
}

/// One GPU resource of a node.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRow {
    pub resource: String,
    /// Devices the node offers.
    pub allocatable: u32,
    /// GPUs held by the pods seated here (shared devices count their share).
    pub allocated_gpus: f64,
    pub free_gpus: f64,
    /// Who holds the allocated GPUs: queue names, [`NO_QUEUE`] or [`CONFLICT`], by name.
    pub holders: Vec<Holder>,
}

/// GPUs of one resource that one queue's pods hold on a node.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub queue: String,
    pub gpus: f64,
}

/// The cluster in one line, as the core measures it (nodes over-subscribed by a reclaim in
/// progress count as fully allocated).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReport {
    pub capacity_gpus: f64,
    pub allocated_gpus: f64,
    pub free_gpus: f64,
    /// `Σ_n F_n`, in GPUs.
    pub fragmented_gpus: f64,
    /// Fragmented GPUs as a share of free ones (FGD's fragmentation ratio).
    pub fragmentation_of_free: f64,
    /// Allocated GPUs as a share of capacity.
    pub allocation: f64,
    /// GPU pods held at the gate.
    pub waiting_pods: usize,
}

/// The cluster's objects, as listed.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
    pub namespaces: Vec<Namespace>,
    pub queues: Vec<GpuQueue>,
}

/// Builds the report: the core's snapshot of `objects`, read back per node and resource.
pub fn report(objects: &Objects) -> PoolReport {
    let (snapshot, problems) = snapshot(objects);
    let nodes = snapshot
        .node_ids()
        .filter(|id| !snapshot.node(*id).pools.is_empty())
        .map(|id| node_report(&snapshot, id))
        .collect();
    let measured = snapshot.fragmentation();
    let capacity = gpus(measured.capacity_milli);
    let free = gpus(measured.idle_milli);
    PoolReport {
        nodes,
        cluster: ClusterReport {
            capacity_gpus: capacity,
            allocated_gpus: capacity - free,
            free_gpus: free,
            fragmented_gpus: measured.fragmented_milli / f64::from(MILLI_PER_DEVICE),
            fragmentation_of_free: measured.share_of_idle(),
            allocation: measured.allocation(),
            waiting_pods: snapshot.pending_pods().count(),
        },
        problems,
    }
}

/// The snapshot the operator's admission pass would build from the same objects, and what the
/// core could not read.
fn snapshot(objects: &Objects) -> (Snapshot, Vec<String>) {
    let mut problems = Vec::new();
    let queues = objects
        .queues
        .iter()
        .filter_map(|q| {
            model::Queue::from_api(q)
                .map_err(|e| problems.push(format!("GpuQueue {}: {e}", name_of(&q.metadata))))
                .ok()
        })
        .collect::<Vec<_>>();
    let nodes = objects
        .nodes
        .iter()
        .filter_map(|n| keep(model::Node::from_k8s(n).map(Some), &mut problems))
        .collect::<Vec<_>>();
    let pods = objects
        .pods
        .iter()
        .filter_map(|p| keep(model::Pod::from_k8s(p), &mut problems))
        .collect::<Vec<_>>();
    // FGD's typical pods: the shapes of the GPU pods there are, as the operator measures them.
    let mix = WorkloadMix::from_pods(&pods, DEFAULT_POPULARITY);
    let (snapshot, issues) = Snapshot::builder()
        .queues(queues)
        .namespaces(objects.namespaces.iter().map(model::Namespace::from_k8s))
        .nodes(nodes)
        .pods(pods)
        .workload_mix(mix)
        .build();
    problems.extend(issues.iter().map(ToString::to_string));
    (snapshot, problems)
}

/// The converted object, or `None` with its error noted (warnings are the operator's to log).
fn keep<T, E: std::fmt::Display>(
    converted: Result<Option<Converted<T>>, E>,
    problems: &mut Vec<String>,
) -> Option<T> {
    match converted {
        Ok(value) => value.map(|c| c.value),
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    }
}

fn name_of(meta: &kube::api::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

fn node_report(snapshot: &Snapshot, id: NodeId) -> NodeReport {
    let node = snapshot.node(id);
    // Milli held per resource, and per resource and holder.
    let mut held: BTreeMap<&str, u64> = BTreeMap::new();
    let mut holders: BTreeMap<(&str, String), u64> = BTreeMap::new();
    for pod_id in snapshot.pods_on(id) {
        let Some(pod) = snapshot.pod(pod_id) else {
            continue;
        };
        let holder = match snapshot.attribution(&pod.key.namespace) {
            Attribution::Queue(q) => snapshot.queue(q).name.clone(),
            Attribution::Unclaimed => NO_QUEUE.to_owned(),
            Attribution::Conflict { .. } => CONFLICT.to_owned(),
        };
        // A pod pinned here with no room yet (a reclaim's owner) holds no devices; one on a
        // shared device holds its share of it, as the cluster line counts it.
        for (resource, Milli(milli)) in snapshot.pod_held_milli(pod_id) {
            let pool = node
                .pools
                .iter()
                .find(|p| p.resource == resource)
                .map(|p| p.resource.as_str());
            let Some(resource) = pool else { continue };
            *held.entry(resource).or_default() += milli;
            *holders.entry((resource, holder.clone())).or_default() += milli;
        }
    }
    let pools = node
        .pools
        .iter()
        .filter(|p| p.devices > 0)
        .map(|pool| {
            let resource = pool.resource.as_str();
            let allocated = held.get(resource).copied().unwrap_or_default();
            let capacity = u64::from(pool.devices) * u64::from(MILLI_PER_DEVICE);
            PoolRow {
                resource: resource.to_owned(),
                allocatable: pool.devices,
                allocated_gpus: gpus(allocated),
                free_gpus: gpus(capacity.saturating_sub(allocated)),
                holders: holders
                    .iter()
                    .filter(|((r, _), _)| *r == resource)
                    .map(|((_, queue), milli)| Holder {
                        queue: queue.clone(),
                        gpus: gpus(*milli),
                    })
                    .collect(),
            }
        })
        .collect();
    NodeReport {
        name: node.name.clone(),
        gpu_model: node.gpu_model.clone(),
        schedulable: node.schedulable,
        fragmented_gpus: snapshot.node_fragmentation(id) / f64::from(MILLI_PER_DEVICE),
        pools,
    }
}

fn gpus(milli: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)] // GPU counts are far below 2^52 milli
    let milli = milli as f64;
    milli / f64::from(MILLI_PER_DEVICE)
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use serde_json::json;

    use super::*;

    fn node(name: &str, model: &str, gpus: &[(&str, u32)]) -> Node {
        let mut allocatable = json!({"cpu": "64", "memory": "512Gi"});
        for (resource, count) in gpus {
            allocatable[*resource] = json!(count.to_string());
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": model}},
            "status": {"allocatable": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap()
    }

    /// A pod of `namespace` bound to `node`, or held at the gate when `node` is `None`.
    fn pod(namespace: &str, name: &str, resource: &str, count: u32, node: Option<&str>) -> Pod {
        let mut spec = json!({"containers": [{"name": "main",
            "resources": {"limits": {resource: count.to_string()}}}]});
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        } else {
            spec["schedulingGates"] = json!([{"name": gpuqueue_api::ADMISSION_GATE}]);
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace,
                         "creationTimestamp": "2026-01-10T11:00:00Z"},
            "spec": spec,
            "status": {"phase": if node.is_some() { "Running" } else { "Pending" }},
        }))
        .unwrap()
    }

    fn namespace(name: &str) -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    }

    fn queue(name: &str, namespace: &str, guaranteed: u32) -> GpuQueue {
        serde_json::from_value(json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": name},
            "spec": {"namespaces": [namespace],
                     "resources": [{"name": "nvidia.com/gpu", "guaranteed": guaranteed}]},
        }))
        .unwrap()
    }

    /// Two 4-GPU nodes and a MIG node: batch fills gpu-a with one 4-GPU pod and holds 1 GPU
    /// on gpu-b beside a pod no queue claims; a second 4-GPU pod waits at the gate.
    pub(crate) fn objects() -> Objects {
        Objects {
            nodes: vec![
                node("gpu-b", "NVIDIA-H100-80GB-HBM3", &[("nvidia.com/gpu", 4)]),
                node("gpu-a", "NVIDIA-H100-80GB-HBM3", &[("nvidia.com/gpu", 4)]),
                node(
                    "mig-0",
                    "NVIDIA-A100-SXM4-80GB",
                    &[("nvidia.com/mig-1g.10gb", 7), ("nvidia.com/mig-3g.40gb", 2)],
                ),
                node("cpu-0", "", &[]),
            ],
            pods: vec![
                pod("batch", "train", "nvidia.com/gpu", 4, Some("gpu-a")),
                pod("batch", "serve", "nvidia.com/gpu", 1, Some("gpu-b")),
                pod("web", "render", "nvidia.com/gpu", 1, Some("gpu-b")),
                pod("batch", "train-2", "nvidia.com/gpu", 4, None),
            ],
            namespaces: vec![namespace("batch"), namespace("web")],
            queues: vec![queue("batch", "batch", 8)],
        }
    }

    #[test]
    fn each_gpu_node_and_resource_with_its_holders_and_the_nodes_fragmentation() {
        let report = report(&objects());
        assert_eq!(report.problems, Vec::<String>::new());
        let names: Vec<&str> = report.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            ["gpu-a", "gpu-b", "mig-0"],
            "GPU nodes only, by name"
        );

        let a = &report.nodes[0];
        assert_eq!(a.gpu_model.as_deref(), Some("NVIDIA-H100-80GB-HBM3"));
        assert_eq!(
            a.pools,
            [PoolRow {
                resource: "nvidia.com/gpu".into(),
                allocatable: 4,
                allocated_gpus: 4.0,
                free_gpus: 0.0,
                holders: vec![Holder {
                    queue: "batch".into(),
                    gpus: 4.0
                }],
            }]
        );
        assert!(
            a.fragmented_gpus.abs() < 1e-9,
            "nothing free, nothing fragmented"
        );

        // The mix is half 1-GPU, half 4-GPU pods: gpu-b's 2 free GPUs serve the first half
        // and are a fragment to the second.
        let b = &report.nodes[1];
        assert_eq!(
            b.pools[0].holders,
            [
                Holder {
                    queue: NO_QUEUE.into(),
                    gpus: 1.0
                },
                Holder {
                    queue: "batch".into(),
                    gpus: 1.0
                },
            ]
        );
        assert!((b.pools[0].free_gpus - 2.0).abs() < 1e-9);
        assert!((b.fragmented_gpus - 1.0).abs() < 1e-9, "{b:?}");

        // No pod asks for a MIG instance: all 9 free devices are a fragment.
        let mig = &report.nodes[2];
        let rows: Vec<(&str, u32)> = mig
            .pools
            .iter()
            .map(|p| (p.resource.as_str(), p.allocatable))
            .collect();
        assert_eq!(
            rows,
            [("nvidia.com/mig-1g.10gb", 7), ("nvidia.com/mig-3g.40gb", 2)]
        );
        assert!((mig.fragmented_gpus - 9.0).abs() < 1e-9, "{mig:?}");

        let cluster = &report.cluster;
        assert!((cluster.capacity_gpus - 17.0).abs() < 1e-9);
        assert!((cluster.allocated_gpus - 6.0).abs() < 1e-9);
        assert!((cluster.free_gpus - 11.0).abs() < 1e-9);
        assert!((cluster.fragmented_gpus - 10.0).abs() < 1e-9);
        assert!((cluster.fragmentation_of_free - 10.0 / 11.0).abs() < 1e-9);
        assert_eq!(cluster.waiting_pods, 1);
    }

    /// Review finding: a node's row counted a time-sliced replica as a whole GPU (its
    /// request), while the cluster line counted its share: 4 of 2 GPUs on the row, 1 of 2 on
    /// the cluster line.
    #[test]
    fn a_shared_device_counts_its_share_on_the_node_row_as_on_the_cluster_line() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "ts-0", "labels": {
                "nvidia.com/gpu.product": "NVIDIA-L4",
                "nvidia.com/gpu.sharing-strategy": "time-slicing",
                "nvidia.com/gpu.replicas": "4"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        let objects = Objects {
            nodes: vec![node],
            pods: (0..4)
                .map(|i| {
                    pod(
                        "batch",
                        &format!("r-{i}"),
                        "nvidia.com/gpu",
                        1,
                        Some("ts-0"),
                    )
                })
                .collect(),
            namespaces: vec![namespace("batch")],
            queues: vec![queue("batch", "batch", 2)],
        };
        let report = report(&objects);
        assert_eq!(report.problems, Vec::<String>::new());
        let row = &report.nodes[0].pools[0];
        assert_eq!(row.allocatable, 2);
        assert!((row.allocated_gpus - 1.0).abs() < 1e-9, "{row:?}");
        assert!((row.free_gpus - 1.0).abs() < 1e-9, "{row:?}");
        assert_eq!(
            row.holders,
            [Holder {
                queue: "batch".into(),
                gpus: 1.0
            }]
        );
        assert!((report.cluster.allocated_gpus - row.allocated_gpus).abs() < 1e-9);
    }

    #[test]
    fn objects_the_core_cannot_read_are_named_and_left_out() {
        let mut objects = objects();
        objects.queues.push(queue("bad", "x", 1));
        objects.queues[1].spec.weight = 0;
        let report = report(&objects);
        assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
        assert!(
            report.problems[0].starts_with("GpuQueue bad: "),
            "{:?}",
            report.problems
        );
        assert_eq!(report.nodes.len(), 3);
    }
}
