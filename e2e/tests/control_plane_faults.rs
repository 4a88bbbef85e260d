#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The harness's fault primitives against a real control plane: each component restarted
//! keeps the cluster's objects and serves again (the soak and the fault tests rely on it), and
//! a paused process is stopped until it is resumed.

use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    Component, ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, describe_pod, gpu_pod,
    node_of, wait_for,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ObjectMeta, PostParams};

async fn wait_bound(pods: &Api<Pod>, name: &str) {
    wait_for(
        format!("pod {name} to be bound"),
        DEFAULT_TIMEOUT,
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            match node_of(&pod) {
                Some(_) => Ok(()),
                None => Err(describe_pod(&pod)),
            }
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_component_restarts_with_its_data_and_serves_again() {
    let mut cluster = ControlPlane::start(
        ControlPlaneConfig::new("control_plane_restart")
            .with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", 8)]),
    )
    .await
    .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let kept = ConfigMap {
        metadata: ObjectMeta {
            name: Some("kept".to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    config_maps
        .create(&PostParams::default(), &kept)
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    for (n, component) in Component::ALL.into_iter().enumerate() {
        let pids_before: Vec<u32> = cluster
            .components()
            .iter()
            .map(gpuqueue_e2e::ManagedProcess::pid)
            .collect();
        let down = cluster.restart(component).await.unwrap();
        eprintln!("{component:?} was down {down:?}");
        let pids_after: Vec<u32> = cluster
            .components()
            .iter()
            .map(gpuqueue_e2e::ManagedProcess::pid)
            .collect();
        let changed: Vec<&str> = cluster
            .components()
            .iter()
            .zip(pids_before.iter().zip(&pids_after))
            .filter(|(_, (before, after))| before != after)
            .map(|(process, _)| process.name())
            .collect();
        assert_eq!(
            changed,
            [component.process_name()],
            "only {component:?} is new"
        );

        // The objects stored before are still there, and the cluster still schedules pods.
        config_maps.get("kept").await.unwrap();
        let name = format!("after-{n}");
        pods.create(&PostParams::default(), &gpu_pod(&name, NVIDIA_GPU, 1))
            .await
            .unwrap();
        wait_bound(&pods, &name).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_api_server_answers_nothing_until_resumed() {
    let cluster = ControlPlane::start(
        ControlPlaneConfig::new("control_plane_pause")
            .with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", 8)]),
    )
    .await
    .unwrap();
    let api_server = cluster
        .components()
        .iter()
        .find(|p| p.name() == Component::ApiServer.process_name())
        .unwrap();
    api_server.pause().unwrap();
    assert!(api_server.is_paused());
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let frozen = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        config_maps.get_opt("anything"),
    )
    .await;
    assert!(
        frozen.is_err(),
        "a paused API server answers nothing: {frozen:?}"
    );
    api_server.resume().unwrap();
    assert_eq!(config_maps.get_opt("anything").await.unwrap(), None);
}
