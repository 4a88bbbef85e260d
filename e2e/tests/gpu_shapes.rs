#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! GPU shapes end to end: time-sliced replicas, HAMi memory and MIG slices on KWOK nodes that
//! advertise them as the NVIDIA device plugin, GPU feature discovery and HAMi's device plugin
//! would, with the real operator and kube-scheduler. Each example under `examples/shapes/`
//! is applied as a tenant would apply it.
//!
//! KWOK nodes of HAMi also advertise `nvidia.com/gpumem` and `nvidia.com/gpucores` totals in
//! allocatable: the test cluster runs the default kube-scheduler, not HAMi's scheduler
//! extender (which has them ignored by the scheduler), and the pods must bind somewhere.

mod common;

use std::collections::BTreeMap;

use common::{
    Operator, Options, apply_queue, bound, event, free_port, install, settled, waiting_reason,
};
use gpuqueue_api::{NVIDIA_GPU, NVIDIA_GPU_SHARED, hami, node_labels};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, GpuNode, apply_file, gpu_pod, node_of, repo_root,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, PostParams};

/// One GPU shared as 4 time-sliced replicas, renamed to `nvidia.com/gpu.shared`.
fn time_sliced_node() -> GpuNode {
    let mut node = GpuNode::whole_gpus("ts-node", 1)
        .with_label(node_labels::GPU_REPLICAS, "4")
        .with_label(node_labels::GPU_SHARING_STRATEGY, "time-slicing");
    node.resources.clear();
    node.with_resource(NVIDIA_GPU_SHARED, 4)
}

/// A node HAMi manages with `devices` GPUs of `memory_mib` each, split 10 ways.
fn hami_node(name: &str, devices: u32, memory_mib: u32) -> GpuNode {
    let register = (0..devices)
        .map(|i| format!("GPU-{name}-{i},10,{memory_mib},100,NVIDIA-A10,0,true"))
        .collect::<Vec<_>>()
        .join(":");
    let mut node = GpuNode::whole_gpus(name, devices)
        .with_annotation(hami::NODE_REGISTER, register)
        .with_resource(NVIDIA_GPU, devices * 10)
        .with_resource(hami::GPU_MEMORY, devices * memory_mib)
        .with_resource(hami::GPU_CORES, devices * 100);
    node.gpu_memory_mib = u64::from(memory_mib);
    "NVIDIA-A10".clone_into(&mut node.gpu_product);
    node
}

async fn start(name: &str) -> (ControlPlane, Operator) {
    let nodes = vec![
        time_sliced_node(),
        // Two 10 GiB devices: 20 GiB free, but split 10 + 10.
        hami_node("hami-split", 2, 10_240),
        hami_node("hami-roomy", 1, 24_576),
        GpuNode::mig("mig-node-0"),
    ];
    let cluster = ControlPlane::start(ControlPlaneConfig::new(name).with_nodes(nodes))
        .await
        .unwrap();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let operator = Operator::start(&cluster, Options::new("only", webhook_port)).await;
    (cluster, operator)
}

fn example(name: &str) -> std::path::PathBuf {
    repo_root().join("examples/shapes").join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shape_is_counted_and_placed_on_the_devices_with_room() {
    let (cluster, _operator) = start("gpu_shapes").await;
    let client = cluster.client();

    // Time-slicing: the node takes its 4 replicas, the fifth pod waits.
    apply_file(&client, &example("time-sliced.yaml"), None)
        .await
        .unwrap();
    let small: Api<Pod> = Api::namespaced(client.clone(), "small-models");
    let pods = settled(&small, 4, 1).await;
    assert!(pods.iter().filter_map(node_of).all(|n| n == "ts-node"));

    // HAMi memory: 18 GiB goes to the device with 24 GiB, never to 10 + 10.
    apply_file(&client, &example("hami-memory.yaml"), None)
        .await
        .unwrap();
    let mid: Api<Pod> = Api::namespaced(client.clone(), "mid-models");
    let pods = settled(&mid, 1, 0).await;
    assert_eq!(node_of(&pods[0]), Some("hami-roomy"));

    // MIG: two 40 GB slices fit the queue's 100Gi, the third pod waits.
    apply_file(&client, &example("mig.yaml"), None)
        .await
        .unwrap();
    let mig: Api<Pod> = Api::namespaced(client.clone(), "mig-models");
    settled(&mig, 2, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_request_over_the_queue_gpu_memory_waits_with_a_reason_naming_memory() {
    let (cluster, _operator) = start("gpu_shapes_memory_cap").await;
    let client = cluster.client();
    let team = cluster.namespace("capped").await.unwrap();
    apply_queue(
        &client,
        &format!(
            "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: capped\nspec:\n  namespaces: [{}]\n  resources:\n    - name: nvidia.com/gpu\n      guaranteed: 4\n      gpuMemory: 16Gi\n",
            team.name()
        ),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), team.name());
    let with_memory = |name: &str, mib: u32| {
        let mut pod = gpu_pod(name, NVIDIA_GPU, 1);
        let limits: &mut BTreeMap<String, Quantity> = pod.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .limits
            .as_mut()
            .unwrap();
        limits.insert(hami::GPU_MEMORY.to_owned(), Quantity(mib.to_string()));
        pod
    };
    // 4 GiB fits the 16 GiB cap; 18 GiB more does not, though a device has it free.
    pods.create(&PostParams::default(), &with_memory("fits", 4_096))
        .await
        .unwrap();
    bound(&pods, "fits").await;
    pods.create(&PostParams::default(), &with_memory("big", 18_432))
        .await
        .unwrap();
    let reason = waiting_reason(&pods, "big").await;
    assert!(
        reason.contains("GPU memory in use is 4096 MiB of its cap of 16384 MiB"),
        "{reason}"
    );
    let message = event(&client, team.name(), "big", "GpuMemoryCap").await;
    assert!(message.contains("GPU memory"), "{message}");

    // GPU use that cannot be counted is held at the gate with the reason, not let through.
    let mut alone = gpu_pod("memory-alone", hami::GPU_MEMORY, 4_096);
    alone.metadata.name = Some("memory-alone".to_owned());
    pods.create(&PostParams::default(), &alone).await.unwrap();
    let reason = waiting_reason(&pods, "memory-alone").await;
    assert!(reason.contains("add nvidia.com/gpu: 1"), "{reason}");
}
