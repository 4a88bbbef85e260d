#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! Admission at creation as a tenant with the stock `edit` role would abuse it (issue 13, case
//! 6 of the review): a forged AdmissionReview posted straight to the webhook, and creates that
//! the API server refuses after the webhook admitted (and so reserved room for) the pod. Each
//! test runs the real operator against a real control plane whose API server calls the webhook
//! with the harness's client certificate, as a cluster admin would configure it.
//!
//! One node of 8 GPUs; `online` is guaranteed all 8 and lends them; `batch`, the tenant's
//! queue, is guaranteed none and may borrow 8.

mod common;

use std::{sync::Arc, time::Duration};

use common::{
    Operator, Options, annotation, apply_queue, bound, free_port, install, is_gated, numbers,
    queue_status, queue_yaml,
};
use gpuqueue_api::{NVIDIA_GPU, annotations};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, GpuNode, TempNamespace, UserAccess, gpu_pod, node_of,
    wait_for,
};
use k8s_openapi::api::{admissionregistration::v1::MutatingWebhookConfiguration, core::v1::Pod};
use kube::{
    Client,
    api::{Api, ListParams, PostParams},
};
use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, ServerName, pem::PemObject},
};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_rustls::TlsConnector;

/// A reservation's life (`RESERVATION_TTL`) and the reclaim, with room for a slow machine.
const AFTER_EXPIRY: Duration = Duration::from_secs(90);

struct World {
    /// Kept for the test's length: dropping it stops the cluster.
    _cluster: ControlPlane,
    client: Client,
    webhook_port: u16,
    operator: Operator,
    online: TempNamespace,
    batch: TempNamespace,
    /// The `batch` tenant: a service account bound to `edit` in its namespace.
    tenant: UserAccess,
}

impl World {
    async fn start(name: &str, env: Vec<(String, String)>) -> Self {
        let config =
            ControlPlaneConfig::new(name).with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", 8)]);
        let cluster = ControlPlane::start(config).await.unwrap();
        eprintln!("{name}: control plane up ({})", cluster.startup_summary());
        let client = cluster.client();
        let webhook_port = free_port();
        install(&cluster, webhook_port).await;
        let mut options = Options::new("only", webhook_port);
        options.env = env;
        let operator = Operator::start(&cluster, options).await;
        let online = cluster.namespace("online").await.unwrap();
        let batch = cluster.namespace("batch").await.unwrap();
        apply_queue(&client, &queue_yaml("online", &[online.name()], 8, 0)).await;
        apply_queue(&client, &queue_yaml("batch", &[batch.name()], 0, 8)).await;
        let tenant = cluster.tenant_with_edit(batch.name()).await.unwrap();
        // A status on both means the leader has run a pass over them: it admits at creation.
        for queue in ["online", "batch"] {
            queue_status(&client, queue, "a first status", |q| numbers(q).is_some()).await;
        }
        Self {
            _cluster: cluster,
            client,
            webhook_port,
            operator,
            online,
            batch,
            tenant,
        }
    }

    fn tenant_pods(&self) -> Api<Pod> {
        Api::namespaced(self.tenant.client.clone(), self.batch.name())
    }

    /// The tenant creates `count` one-GPU pods `batch-<i>`; returns them once bound.
    async fn tenant_runs(&self, count: usize) -> Vec<Pod> {
        let pods = self.tenant_pods();
        let mut bound_pods = Vec::with_capacity(count);
        for i in 0..count {
            let name = format!("batch-{i}");
            pods.create(&PostParams::default(), &gpu_pod(&name, NVIDIA_GPU, 1))
                .await
                .unwrap();
            bound_pods.push(bound(&pods, &name).await);
        }
        bound_pods
    }

    fn online_pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), self.online.name())
    }

    /// The webhook's answers with `result`, from the operator's metrics.
    async fn answered(&self, result: &str) -> u64 {
        let series = format!(r#"gpuqueue_webhook_requests_total{{result="{result}"}}"#);
        self.webhook_counts()
            .await
            .into_iter()
            .filter(|(line, _)| *line == series)
            .map(|(_, count)| count)
            .sum()
    }

    /// Every answer the webhook gave, whatever the result.
    async fn answered_at_all(&self) -> u64 {
        self.webhook_counts()
            .await
            .into_iter()
            .map(|(_, n)| n)
            .sum()
    }

    /// The series of `gpuqueue_webhook_requests_total` with their counts.
    async fn webhook_counts(&self) -> Vec<(String, u64)> {
        self.operator
            .metrics()
            .await
            .lines()
            .filter(|line| line.starts_with("gpuqueue_webhook_requests_total{"))
            .filter_map(|line| {
                let (series, count) = line.rsplit_once(' ')?;
                Some((series.to_owned(), count.parse().ok()?))
            })
            .collect()
    }

    /// The tenant creates a GPU pod the API server refuses only after the mutating webhooks
    /// ran (an invalid container name, with a generated pod name), as in the review.
    async fn create_refused_after_mutation(&self, gpus: u32) {
        let mut pod = gpu_pod("unused", NVIDIA_GPU, gpus);
        pod.metadata.name = None;
        pod.metadata.generate_name = Some("phantom-".to_owned());
        "Not_A_Valid_Name".clone_into(&mut pod.spec.as_mut().unwrap().containers[0].name);
        let refused = self
            .tenant_pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_err();
        let kube::Error::Api(status) = refused else {
            panic!("{refused}")
        };
        assert_eq!(status.code, 422, "{status:?}");
        assert!(status.message.contains("Not_A_Valid_Name"), "{status:?}");
    }
}

/// POSTs a forged AdmissionReview of an `gpus`-GPU pod in `namespace` straight to the webhook,
/// as any pod that reaches its Service could: TLS without a client certificate (trusting the
/// webhook's CA, so the handshake fails for the client certificate alone). Returns the answer,
/// or why none came.
async fn forge_review(world: &World, namespace: &str, gpus: u32) -> Result<String, String> {
    let configs: Api<MutatingWebhookConfiguration> = Api::all(world.client.clone());
    let config = configs.get("gpuqueue-operator").await.unwrap();
    let bundle = config.webhooks.unwrap()[0]
        .client_config
        .ca_bundle
        .clone()
        .unwrap();
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&bundle.0) {
        roots.add(ca.unwrap()).unwrap();
    }
    let tls =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "f0f0f0f0-0000-0000-0000-000000000006", "operation": "CREATE",
            "namespace": namespace,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": gpu_pod("forged", NVIDIA_GPU, gpus),
        }
    }))
    .unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", world.webhook_port))
        .await
        .unwrap();
    let mut stream = TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .map_err(|error| error.to_string())?;
    let head = format!(
        "POST /mutate-pods HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(&[head.as_bytes(), &body].concat())
        .await
        .map_err(|error| error.to_string())?;
    let mut answer = Vec::new();
    // With TLS 1.3 the server's refusal of the client arrives as an alert on the first read.
    stream
        .read_to_end(&mut answer)
        .await
        .map_err(|error| error.to_string())?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_review_without_the_api_servers_client_certificate_is_refused_and_reserves_nothing()
 {
    let world = World::start("tenant_creation_forged", Vec::new()).await;
    let answered = world.answered_at_all().await;

    // The batch tenant asks the webhook for all of online's 8 GPUs, three times.
    for _ in 0..3 {
        let refused = forge_review(&world, world.online.name(), 8)
            .await
            .unwrap_err();
        assert!(refused.contains("CertificateRequired"), "{refused}");
    }
    assert_eq!(
        world.answered_at_all().await,
        answered,
        "the webhook never read a forged review"
    );

    // Nothing was reserved: online's pod of 8 GPUs is admitted at its creation, through the
    // API server (which the webhook does answer: it presents the harness's client certificate).
    let pods = world.online_pods();
    let pod = pods
        .create(&PostParams::default(), &gpu_pod("vllm", NVIDIA_GPU, 8))
        .await
        .unwrap();
    assert!(!is_gated(&pod));
    assert!(annotation(&pod, annotations::ADMITTED_AT_CREATION).is_some());
    // The counter the forged reviews were checked against counts the webhook's answers.
    assert!(
        world.answered_at_all().await > answered,
        "{:?}",
        world.webhook_counts().await
    );
    bound(&pods, "vllm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_refused_after_the_webhook_holds_no_lasting_reservation_and_breaks_no_reclaim() {
    let world = World::start("tenant_creation_refused", Vec::new()).await;
    // The tenant borrows half the node with real pods.
    world.tenant_runs(4).await;
    // A pod of 4 GPUs it fits the other half: the webhook reserves it, then the API server
    // refuses the pod. The node now looks full.
    let admitted = world.answered("admitted").await;
    world.create_refused_after_mutation(4).await;
    assert_eq!(
        world.answered("admitted").await,
        admitted + 1,
        "the webhook reserved room for the refused pod"
    );

    // online takes its guarantee back: the reclaim evicts the four real borrowers (the phantom
    // is no victim: nothing to evict), and the phantom's room comes back at its expiry, with
    // no other change in the cluster to run a pass.
    let pods = world.online_pods();
    for i in 0..8 {
        pods.create(
            &PostParams::default(),
            &gpu_pod(&format!("online-{i}"), NVIDIA_GPU, 1),
        )
        .await
        .unwrap();
    }
    wait_for(
        "online's 8 pods bound, batch's pods gone",
        AFTER_EXPIRY,
        || async {
            let online = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let bound = online
                .items
                .iter()
                .filter(|pod| node_of(pod).is_some())
                .count();
            let batch = world
                .tenant_pods()
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            if bound == 8 && batch == 0 {
                Ok(())
            } else {
                Err(format!(
                    "online {bound} of 8 bound, batch {batch} pods left"
                ))
            }
        },
    )
    .await
    .unwrap();
    let log = world.operator.process.log();
    assert!(
        log.contains("a pod admitted at creation never appeared; its reservation is released"),
        "the reservation expired"
    );
    assert!(
        !log.contains("no longer in the store"),
        "no reclaim planned the phantom as a victim"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_refused_after_the_webhook_makes_no_pod_within_its_guarantee_a_victim() {
    // The soak's case: creates the API server refused after the webhook had reserved them
    // inflated a queue, and a reclaim evicted one of its real pods as a borrower while the
    // queue held no more than its guarantee. Here batch is guaranteed 4 and holds 4.
    let world = World::start("tenant_creation_refused_within_guarantee", Vec::new()).await;
    apply_queue(
        &world.client,
        &queue_yaml("online", &[world.online.name()], 4, 0),
    )
    .await;
    apply_queue(
        &world.client,
        &queue_yaml("batch", &[world.batch.name()], 4, 4),
    )
    .await;
    for queue in ["online", "batch"] {
        queue_status(&world.client, queue, "a status of guaranteed 4", |q| {
            q.status
                .as_ref()
                .and_then(|s| s.resources.first())
                .is_some_and(|r| r.guaranteed == 4)
        })
        .await;
    }
    let held = world.tenant_runs(4).await;
    let tenant_pods = world.tenant_pods();
    // 4 more reserved (borrowed from online's idle guarantee) for a pod that never exists.
    let admitted = world.answered("admitted").await;
    world.create_refused_after_mutation(4).await;
    assert_eq!(world.answered("admitted").await, admitted + 1);

    // online wants its 4 back: nothing batch holds is borrowed, so no reclaim evicts it; online
    // gets the phantom's room at its expiry.
    let pods = world.online_pods();
    pods.create(&PostParams::default(), &gpu_pod("vllm", NVIDIA_GPU, 4))
        .await
        .unwrap();
    wait_for("online's pod bound", AFTER_EXPIRY, || async {
        let pod = pods.get("vllm").await.map_err(|e| e.to_string())?;
        pod.spec
            .and_then(|s| s.node_name)
            .map(drop)
            .ok_or_else(|| "not bound yet".to_owned())
    })
    .await
    .unwrap();
    for pod in &held {
        let name = pod.metadata.name.as_deref().unwrap();
        let now = tenant_pods.get(name).await.unwrap();
        assert_eq!(now.metadata.uid, pod.metadata.uid, "{name} was replaced");
        assert!(
            now.metadata.deletion_timestamp.is_none(),
            "{name} was evicted"
        );
    }
    let log = world.operator.process.log();
    assert!(!log.contains("reclaim for"), "no reclaim was planned");
    assert!(log.contains("a pod admitted at creation never appeared; its reservation is released"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_creates_refused_after_the_webhook_hold_at_most_the_namespace_cap() {
    let cap = vec![(
        "GPUQUEUE_CREATION_RESERVATIONS_PER_NAMESPACE".to_owned(),
        "2".to_owned(),
    )];
    let world = World::start("tenant_creation_cap", cap).await;
    let (admitted, gated) = (
        world.answered("admitted").await,
        world.answered("gated").await,
    );
    // Paced past the second in which a reservation counts as a create still in flight: a
    // burst of real creates is never gated by the cap, only reservations whose pods should
    // have shown by then.
    for _ in 0..5 {
        world.create_refused_after_mutation(1).await;
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
    // Two reservations, then the gate (a gated pod that never appears reserves nothing).
    assert_eq!(world.answered("admitted").await, admitted + 2);
    assert_eq!(world.answered("gated").await, gated + 3);

    // So at most 2 of the 8 GPUs are held: online's pod of 6 is admitted.
    let pods = world.online_pods();
    pods.create(&PostParams::default(), &gpu_pod("vllm", NVIDIA_GPU, 6))
        .await
        .unwrap();
    let pod = bound(&pods, "vllm").await;
    assert_eq!(annotation(&pod, annotations::QUEUE), Some("online"));
}
