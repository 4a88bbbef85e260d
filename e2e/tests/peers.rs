#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The peer harness: Kueue starts against a harness cluster with its webhooks on loopback, and
//! reclaims a borrowed GPU for its owner within the cohort, evicting one borrower. Skipped (with
//! the reason) unless `e2e/scripts/build-tools.sh --peers` has built Kueue, so CI needs no Kueue.

use std::time::Duration;

use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, KUEUE_GATE, Kueue, KueueConfig,
    KueueTenant, NodeBehaviour, QUEUE_NAME_LABEL, QuotaSampler, TenantQuota, describe_pod, gpu_pod,
    node_of, wait_for,
};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};

fn queued_pod(name: &str, queue: &str) -> Pod {
    let mut pod = gpu_pod(name, NVIDIA_GPU, 1);
    pod.metadata
        .labels
        .get_or_insert_default()
        .insert(QUEUE_NAME_LABEL.to_owned(), queue.to_owned());
    pod
}

/// The owner `online` (guaranteed the node's 8 GPUs) and the borrower `batch` (nothing
/// guaranteed, may borrow all 8), as Kueue queues and as quotas for the sampler.
fn owner_and_borrower(online: &str, batch: &str) -> (Vec<KueueTenant>, Vec<TenantQuota>) {
    let tenants = [("online", online, 8, 0), ("batch", batch, 0, 8)];
    let queues = tenants
        .iter()
        .map(|&(name, namespace, nominal, borrowing)| KueueTenant {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            nominal_quota: nominal,
            borrowing_limit: borrowing,
        })
        .collect();
    let quotas = tenants
        .iter()
        .map(|&(name, namespace, nominal, borrowing)| TenantQuota {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            guarantee: nominal as u64,
            ceiling: (nominal + borrowing) as u64,
        })
        .collect();
    (queues, quotas)
}

async fn all_bound(pods: &Api<Pod>, count: usize) {
    wait_for(format!("{count} pods bound"), DEFAULT_TIMEOUT, || async {
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let bound = list.items.iter().filter(|p| node_of(p).is_some()).count();
        if bound == count {
            Ok(())
        } else {
            Err(format!("{bound} bound"))
        }
    })
    .await
    .unwrap();
}

// Ignored, not skipped in silence: a run that passes has run it.
#[tokio::test]
#[ignore = "needs Kueue, built by e2e/scripts/build-tools.sh --peers; run with --ignored"]
async fn kueue_starts_and_reclaims_one_borrowed_gpu_for_its_owner() {
    let bin_dir = gpuqueue_e2e::bin_dir().unwrap();
    if let Some(reason) = Kueue::unavailable(bin_dir) {
        panic!("{reason}");
    }
    // Fast stages: a preempted borrower goes at once, so the owner is bound without waiting
    // out a grace period; the test is about Kueue's decision, not the kubelet.
    let cluster = ControlPlane::start(
        ControlPlaneConfig::new("peers_kueue_reclaim")
            .with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", 8)])
            .with_node_behaviour(NodeBehaviour::Fast),
    )
    .await
    .unwrap();
    let client = cluster.client();
    let kueue = Kueue::start(&cluster, &KueueConfig::default())
        .await
        .unwrap();
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    let (queues, quotas) = owner_and_borrower(online.name(), batch.name());
    kueue.install_queues(&queues).await.unwrap();
    let sampler = QuotaSampler::start(&client, quotas, Duration::from_mins(1));

    // The borrower fills the node through Kueue: gated at creation, admitted by borrowing.
    let borrowers: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    for i in 0..8 {
        let created = borrowers
            .create(
                &PostParams::default(),
                &queued_pod(&format!("b-{i}"), "batch"),
            )
            .await
            .unwrap();
        let gates = created
            .spec
            .and_then(|s| s.scheduling_gates)
            .unwrap_or_default();
        assert!(
            gates.iter().any(|g| g.name == KUEUE_GATE),
            "Kueue's webhook did not gate the pod: {gates:?}"
        );
    }
    all_bound(&borrowers, 8).await;

    // The owner asks for one GPU back: Kueue preempts exactly one borrower, and the owner binds.
    let owners: Api<Pod> = Api::namespaced(client.clone(), online.name());
    owners
        .create(&PostParams::default(), &queued_pod("owner", "online"))
        .await
        .unwrap();
    gpuqueue_e2e::bound_pod(&owners, "owner").await.unwrap();
    let left = borrowers.list(&ListParams::default()).await.unwrap().items;
    let live = left
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .count();
    assert_eq!(
        live,
        7,
        "one borrower should be preempted: {:?}",
        left.iter().map(describe_pod).collect::<Vec<_>>()
    );

    let report = sampler.finish().await;
    assert!(report.samples > 0);
    assert!(report.violations.is_empty(), "{report:?}");
    kueue.stop().await;
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client);
    let names: Vec<String> = webhooks
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|w| w.metadata.name)
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with("kueue-")),
        "Kueue's webhook configurations outlived it: {names:?}"
    );
}
