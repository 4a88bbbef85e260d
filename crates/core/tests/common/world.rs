//! Small clusters for scenario and property tests: queues named after their namespace, nodes
//! of whole GPUs, pods by namespace/name with a time in seconds after a fixed epoch.

use gpuqueue_core::Snapshot;
use gpuqueue_core::model::{
    Assignment, GpuRequest, Node, Pod, PodKey, PodState, Queue, Requests, ResourceQuota,
};
use jiff::{SignedDuration, Timestamp};

pub const GPU: &str = "nvidia.com/gpu";

/// `secs` seconds after a fixed epoch.
pub fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_767_225_600).unwrap() + SignedDuration::from_secs(secs)
}

/// A queue claiming the namespace of its name, with a GPU quota.
pub fn queue(name: &str, guaranteed: u64, burstable: u64) -> Queue {
    Queue::new(name)
        .namespace(name)
        .quota(ResourceQuota::devices(GPU, guaranteed, burstable))
}

pub fn node(name: &str, gpus: u32) -> Node {
    Node::new(name)
        .cpu_milli(128_000)
        .memory_bytes(1 << 40)
        .gpus(GPU, gpus)
}

fn pod(key: &str, gpus: u32, created: i64) -> Pod {
    let (ns, name) = key.split_once('/').unwrap();
    Pod::new(
        PodKey::new(ns, name),
        Requests {
            cpu_milli: 1000,
            memory_bytes: 1 << 30,
            gpus: vec![GpuRequest::devices(GPU, gpus)],
            quota_only: Vec::new(),
        },
        at(created),
    )
}

/// A pod waiting at the gate, created at `created`.
pub fn pending(key: &str, gpus: u32, created: i64) -> Pod {
    pod(key, gpus, created)
}

/// A pod running on `node`, admitted and started at `started`.
pub fn running(key: &str, gpus: u32, node: &str, started: i64) -> Pod {
    let mut p = pod(key, gpus, started);
    p.state = PodState::Admitted(Assignment {
        node: Some(node.into()),
        bound: true,
        terminating: false,
    });
    p.admitted_at = Some(at(started));
    p.started_at = Some(at(started));
    p
}

/// Builds a snapshot, failing the test on any issue.
pub fn build(queues: Vec<Queue>, nodes: Vec<Node>, pods: Vec<Pod>) -> Snapshot {
    let (snapshot, issues) = Snapshot::builder()
        .queues(queues)
        .nodes(nodes)
        .pods(pods)
        .build();
    assert!(issues.is_empty(), "{issues:?}");
    snapshot
}
