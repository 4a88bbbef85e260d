#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The harness itself: control planes started at the same time stay apart and stop cleanly,
//! service-account users are held to RBAC, and processes started against a cluster get its
//! kubeconfig and keep their output.

use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, describe_pod, gpu_pod, wait_for,
};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};

async fn pod_ip(pods: &Api<Pod>, name: &str) -> std::net::Ipv4Addr {
    wait_for(
        format!("pod {name} to get an IP"),
        DEFAULT_TIMEOUT,
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            match pod.status.as_ref().and_then(|s| s.pod_ip.as_ref()) {
                Some(ip) => ip.parse().map_err(|e| format!("{ip}: {e}")),
                None => Err(describe_pod(&pod)),
            }
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_planes_started_together_stay_apart_and_stop_cleanly() {
    let one = ControlPlaneConfig::new("side_by_side_one")
        .with_nodes(vec![GpuNode::whole_gpus("only-in-one", 8)]);
    let two = ControlPlaneConfig::new("side_by_side_two")
        .with_nodes(vec![GpuNode::whole_gpus("only-in-two", 4)]);
    let (one, two) = tokio::join!(ControlPlane::start(one), ControlPlane::start(two));
    let (one, two) = (one.unwrap(), two.unwrap());
    assert_ne!(one.api_server(), two.api_server());
    assert_ne!(one.pod_cidr(), two.pod_cidr());

    for (cluster, node) in [(&one, "only-in-one"), (&two, "only-in-two")] {
        let nodes: Vec<String> = Api::<Node>::all(cluster.client())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        assert_eq!(nodes, [node]);
    }

    // The same first pod in each cluster gets an IP from that cluster's own range.
    let mut ips = Vec::new();
    for cluster in [&one, &two] {
        let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
        pods.create(&PostParams::default(), &gpu_pod("first", NVIDIA_GPU, 1))
            .await
            .unwrap();
        ips.push(pod_ip(&pods, "first").await);
    }
    assert_ne!(ips[0], ips[1]);

    let run_dir = one.run_dir().to_owned();
    let log_dir = one.log_dir().to_owned();
    one.stop();
    assert!(!run_dir.exists(), "stop removes the run directory");
    assert!(
        log_dir.join("kube-apiserver.log").exists(),
        "logs are kept after a stop"
    );
    // The other cluster is untouched.
    let nodes = Api::<Node>::all(two.client())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(nodes.items.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_user_is_held_to_its_cluster_role() {
    let cluster = ControlPlane::start(ControlPlaneConfig::new("rbac_user"))
        .await
        .unwrap();
    let viewer = cluster
        .user_with_cluster_role("viewer", "view")
        .await
        .unwrap();
    assert_eq!(
        viewer.username,
        "system:serviceaccount:gpuqueue-e2e-users:viewer"
    );

    // The API server authenticates the token as that account.
    let review = Api::<SelfSubjectReview>::all(viewer.client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let seen = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username);
    assert_eq!(seen.as_deref(), Some(viewer.username.as_str()));

    let pods: Api<Pod> = Api::namespaced(viewer.client.clone(), "default");
    pods.list(&ListParams::default()).await.unwrap();
    let refused = pods
        .create(
            &PostParams::default(),
            &gpu_pod("not-allowed", NVIDIA_GPU, 1),
        )
        .await
        .unwrap_err();
    match refused {
        kube::Error::Api(status) => assert!(status.is_forbidden(), "{status:?}"),
        other => panic!("expected 403 Forbidden, got {other}"),
    }
    // Nodes are cluster-scoped and outside `view`.
    let nodes = Api::<Node>::all(viewer.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(matches!(nodes, kube::Error::Api(status) if status.is_forbidden()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_process_talks_to_the_cluster_and_its_output_is_kept() {
    let cluster = ControlPlane::start(ControlPlaneConfig::new("spawned_process"))
        .await
        .unwrap();
    let mut get_nodes = cluster.kubectl();
    get_nodes.args(["get", "nodes", "-o", "name"]);
    let mut process = cluster.spawn("kubectl-get-nodes", get_nodes).unwrap();
    let status = process.wait(DEFAULT_TIMEOUT).await.unwrap();
    assert!(status.success(), "{}", process.log());
    let log = process.log();
    for node in cluster.nodes() {
        assert!(log.contains(&format!("node/{}", node.name)), "{log}");
    }
    assert!(process.log_path().starts_with(cluster.log_dir()));

    // A failing command reports its failure and its message.
    let mut bad = cluster.kubectl();
    bad.args(["get", "pod", "no-such-pod"]);
    let mut process = cluster.spawn("kubectl-get-missing", bad).unwrap();
    let status = process.wait(DEFAULT_TIMEOUT).await.unwrap();
    assert!(!status.success());
    assert!(
        process.log().contains("\"no-such-pod\" not found"),
        "{}",
        process.log()
    );

    // A long-running process is killed when its handle goes.
    let mut watch = cluster.kubectl();
    watch.args(["get", "pods", "--watch", "--all-namespaces"]);
    let mut process = cluster.spawn("kubectl-watch", watch).unwrap();
    process.ensure_running().unwrap();
    let pid = process.pid();
    drop(process);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} still runs"
    );
}
