//! `top` for people: one row per node and GPU resource, then the cluster in one line.

use super::pools::{ClusterReport, NodeReport, PoolReport};
use crate::render;

/// The table, the cluster line, and the objects left out.
pub fn render(report: &PoolReport) -> String {
    if report.nodes.is_empty() {
        return "No node offers a GPU resource.\n".to_owned();
    }
    let mut rows = Vec::new();
    for node in &report.nodes {
        for (i, pool) in node.pools.iter().enumerate() {
            let holders: Vec<String> = pool
                .holders
                .iter()
                .map(|h| format!("{} {}", h.queue, amount(h.gpus)))
                .collect();
            rows.push(vec![
                node_name(node),
                node.gpu_model.clone().unwrap_or_else(|| "-".to_owned()),
                pool.resource.clone(),
                pool.allocatable.to_string(),
                amount(pool.allocated_gpus),
                amount(pool.free_gpus),
                // The measure is the node's, over all its resources: said once.
                if i == 0 {
                    amount(node.fragmented_gpus)
                } else {
                    String::new()
                },
                if holders.is_empty() {
                    "-".to_owned()
                } else {
                    holders.join(", ")
                },
            ]);
        }
    }
    let mut text = render::table(
        &[
            "NODE",
            "GPU MODEL",
            "RESOURCE",
            "ALLOCATABLE",
            "ALLOCATED",
            "FREE",
            "FRAGMENTED",
            "QUEUES",
        ],
        &rows,
    );
    text.push('\n');
    text.push_str(&cluster_line(&report.cluster));
    if !report.problems.is_empty() {
        text.push_str("\nLeft out (the core cannot read them):\n");
        for problem in &report.problems {
            text.push_str("  ");
            text.push_str(problem);
            text.push('\n');
        }
    }
    text
}

fn node_name(node: &NodeReport) -> String {
    if node.schedulable {
        node.name.clone()
    } else {
        format!("{} (unschedulable)", node.name)
    }
}

/// `Cluster: 9 of 23 GPUs allocated (39%), 14 free, 10 fragmented (71% of free); 1 GPU pod waiting at the gate`
pub fn cluster_line(cluster: &ClusterReport) -> String {
    let waiting = match cluster.waiting_pods {
        1 => "1 GPU pod waits".to_owned(),
        n => format!("{n} GPU pods wait"),
    };
    format!(
        "Cluster: {} of {} GPUs allocated ({}), {} free, {} fragmented ({} of free); {waiting} at the gate\n",
        amount(cluster.allocated_gpus),
        amount(cluster.capacity_gpus),
        percent(cluster.allocation),
        amount(cluster.free_gpus),
        amount(cluster.fragmented_gpus),
        percent(cluster.fragmentation_of_free),
    )
}

/// GPUs with at most two decimals and no trailing zeros: `8`, `2.5`, `0.67`.
pub fn amount(gpus: f64) -> String {
    let text = format!("{gpus:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

fn percent(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;
    use crate::top::pools;

    #[test]
    fn one_row_per_node_and_resource_then_the_cluster() {
        let report = pools::report(&pools::tests::objects());
        assert_eq!(
            render(&report),
            "\
NODE    GPU MODEL               RESOURCE                 ALLOCATABLE   ALLOCATED   FREE   FRAGMENTED   QUEUES
gpu-a   NVIDIA-H100-80GB-HBM3   nvidia.com/gpu           4             4           0      0            batch 4
gpu-b   NVIDIA-H100-80GB-HBM3   nvidia.com/gpu           4             2           2      1            (no queue) 1, batch 1
mig-0   NVIDIA-A100-SXM4-80GB   nvidia.com/mig-1g.10gb   7             0           7      9            -
mig-0   NVIDIA-A100-SXM4-80GB   nvidia.com/mig-3g.40gb   2             0           2                   -

Cluster: 6 of 17 GPUs allocated (35%), 11 free, 10 fragmented (91% of free); 1 GPU pod waits at the gate
"
        );
    }

    #[test]
    fn amounts_read_short() {
        assert_eq!(amount(8.0), "8");
        assert_eq!(amount(2.5), "2.5");
        assert_eq!(amount(2.0 / 3.0), "0.67");
        assert_eq!(amount(-0.0001), "0");
        assert_eq!(amount(0.0), "0");
    }

    #[test]
    fn no_gpu_node() {
        let report = pools::report(&pools::Objects::default());
        assert_eq!(render(&report), "No node offers a GPU resource.\n");
    }
}
