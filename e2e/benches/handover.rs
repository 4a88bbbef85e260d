#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly
//! `make bench-handover`: how long a reclaim takes, phase by phase, on the local control plane
//! (etcd, kube-apiserver, kube-scheduler, kube-controller-manager; KWOK runs the nodes with
//! the harness's default `NodeBehaviour::Kubelet`, so an evicted pod ends as on a kubelet:
//! within its grace period, seen at the kubelet's relists) with the release build of the
//! operator and its webhook in the path.
//!
//! `BENCH_NODES` nodes (default 3) of 8 GPUs are full of one-GPU borrower pods of queue
//! `batch` (guaranteed 0, burstable all, victim grace 1 s), each with a fake vLLM on its pod
//! IP; queue `online` is guaranteed all of them, with the default 3 s budget.
//!
//! - **Single handovers**: an owner pod of `online` asks for one GPU, the operator reclaims it
//!   from one borrower, and the owner is bound; then the owner is deleted and a new borrower
//!   refills the node. `BENCH_HANDOVERS` handovers (default 50) with the `vllm` driver and the
//!   fake's `POST /pause` taking 1.2 s, then as many with checkpoint `none`.
//! - **Bursts**: an owner Deployment of `online` running 2 replicas, every other GPU held by
//!   borrowers, is scaled to 2 + N replicas: N = `BENCH_BURST_PODS` (default 22) with the
//!   1.2 s checkpoint, `BENCH_BURST_NONE_PODS` (default 12) with checkpoint `none`;
//!   `BENCH_BURST_ROUNDS` rounds each (default 5), then it is scaled back and refilled.
//!
//! One warm-up per mode is not counted. The phases come from the operator's own records
//! (`status.lastHandovers`, from the start of the admission pass that found the owner blocked).
//! "End to end" (single) is this process's view, from the owner's create request to its first
//! sight of the owner bound (polled every 5 ms). A burst is timed from the scale request to the
//! *last* owner pod bound: as this process's watch saw it, as the operator's records put it
//! (found blocked + whole handover, on the same machine's clock), and on the API server's clock
//! in whole seconds (latest `PodScheduled` minus the Deployment's update in `managedFields`).
//! The control-plane share is the whole handover minus the checkpoint phase and minus the
//! victims' termination (`victimsGone`).
//!
//! `BENCH_REAL_NODE_HANDOVERS=<n>` (default 0) then runs `n` single handovers per mode on one
//! real kubelet node (`e2e/kubelet/real-node.sh`: containerd, runc, kubelet, our fake device
//! plugin; the fake vLLM in containers), in a cluster of its own: a real SIGTERM and grace
//! period, the kubelet's device manager freeing the GPU, the owner's container started (seen
//! polled every 5 ms). It runs as root and needs `apt-get install -y containerd runc buildah
//! gcc`. `BENCH_REAL_NODE_EVENTED_PLEG=1` runs that kubelet with the alpha Evented PLEG, on
//! containerd v2 built from the Go module proxy.
//!
//! `BENCH_NODE_BEHAVIOUR=fast` runs KWOK's fast stages instead (a victim vanishes at once), for
//! figures comparable with peers measured on those.
//!
//! `BENCH_HANDOVERS=0` skips the single handovers, `BENCH_BURST_PODS=0` (or
//! `BENCH_BURST_NONE_PODS=0`) a mode's bursts: a trial run of one part. `BENCH_OPERATOR_LOG`
//! sets the operator's log filter (default `info`), e.g. `info,gpuqueue_operator=debug`.
//!
//! `BENCH_OWNER_PRIORITY=<value>` gives every owner a PriorityClass of that value above the
//! borrowers' 0, one kube-scheduler would preempt for if it left the gate before its room is
//! free (README "Reclaim"): its handovers should measure as the default's, where owners and
//! borrowers rank equal.
//!
//! `BENCH_OPERATOR_BUILD=debug` runs the operator's debug build (a smoke run of the benchmark
//! itself, without the release build's minutes of compiling; its figures are not the result).
//! `GPUQUEUE_OPERATOR_BINARY=<path>` runs a prebuilt operator instead of building this
//! checkout's: two builds compared run after run, as `e2e/results/burst-trials.md` does.
//!
//! Results: `e2e/results/handover.json` and `e2e/results/handover.md` (committed; another
//! directory with `BENCH_RESULTS`, relative to the repository root, for a smoke run), with the
//! issue's targets next to each figure. Percentiles are nearest-rank.

#[path = "../tests/common/mod.rs"]
mod common;

// A bench's root is its crate root: its modules are found by path.
#[path = "handover/burst.rs"]
mod burst;
#[path = "handover/observe.rs"]
mod observe;
#[path = "handover/real_node.rs"]
mod real_node;
#[path = "handover/record.rs"]
mod record;
#[path = "handover/report.rs"]
mod report;
#[path = "handover/stats.rs"]
mod stats;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::time::Instant;

use common::{Operator, Options, apply_queue, free_port, install};
use gpuqueue_api::{NVIDIA_GPU, v1alpha1::GpuQueue};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, GpuNode, NodeBehaviour, TempNamespace, describe_pod,
    env_number, gpu_pod, node_of, wait_for,
};
use gpuqueue_fake_vllm::{Config as VllmConfig, FakeVllm};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Client,
    api::{Api, DeleteParams, ListParams, PostParams},
};

use record::Handover;

const GPUS_PER_NODE: usize = 8;
const VLLM_PORT: u16 = 8000;
/// How long the fake vLLM's pause takes.
const CHECKPOINT: Duration = Duration::from_millis(1200);
/// The victims' grace period (`victimGracePeriodSeconds`).
const VICTIM_GRACE_SECONDS: u32 = 1;
const WAIT: Duration = Duration::from_mins(2);
/// The owners' PriorityClass with `BENCH_OWNER_PRIORITY`.
const OWNER_CLASS: &str = "bench-owner";

/// The checkpoint modes: a name for the report and the borrower queue's `spec.reclaim`.
fn modes() -> [(&'static str, String); 2] {
    let grace = format!("victimGracePeriodSeconds: {VICTIM_GRACE_SECONDS}");
    [
        (
            "vllm 1.2 s",
            format!(
                "{{checkpoint: {{driver: vllm, port: {VLLM_PORT}, timeout: 1500ms}}, {grace}}}"
            ),
        ),
        ("none", format!("{{checkpoint: {{driver: none}}, {grace}}}")),
    ]
}

/// One single handover as measured.
#[derive(Debug, Clone, serde::Serialize)]
struct Sample {
    mode: &'static str,
    handover: Handover,
    end_to_end_ms: f64,
    /// On the real node: the owner seen bound → its container seen running.
    owner_running_ms: Option<f64>,
}

/// Where the pods run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nodes {
    /// KWOK nodes: each pod IP gets a fake vLLM served by this process.
    Kwok,
    /// The real kubelet node: the fake vLLM runs in each pod's container.
    RealKubelet,
}

fn queue_yaml(
    name: &str,
    namespace: &str,
    guaranteed: usize,
    burstable: usize,
    reclaim: &str,
) -> String {
    format!(
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: {name}\nspec:\n  namespaces: [{namespace}]\n  resources:\n    - {{name: nvidia.com/gpu, guaranteed: {guaranteed}, burstable: {burstable}}}\n  reclaim: {reclaim}\n"
    )
}

/// The benchmark's cluster and what runs on it.
struct Bench {
    client: Client,
    /// kube-apiserver's audit log, whose timestamps time a burst on the API server's clock.
    audit_log: std::path::PathBuf,
    borrowers: Api<Pod>,
    owners: Api<Pod>,
    online: String,
    batch: String,
    /// GPUs in the cluster.
    gpus: usize,
    /// A fake vLLM per pod IP (KWOK hands a freed IP to the next pod, so a server stands for
    /// an address, and is reused).
    servers: HashMap<IpAddr, FakeVllm>,
    next_borrower: usize,
    next_owner: usize,
    /// The owners' PriorityClass, if they outrank the borrowers.
    owner_class: Option<String>,
    nodes: Nodes,
}

impl Bench {
    /// A one-GPU pod for the nodes of this bench.
    fn pod(&self, name: &str) -> Pod {
        match self.nodes {
            Nodes::Kwok => gpu_pod(name, NVIDIA_GPU, 1),
            Nodes::RealKubelet => real_node::vllm_pod(name),
        }
    }

    /// Sets the borrowers' checkpoint mode.
    async fn set_mode(&self, reclaim: &str) {
        apply_queue(
            &self.client,
            &queue_yaml("batch", &self.batch, 0, self.gpus, reclaim),
        )
        .await;
    }

    /// Creates borrowers until `count` live ones hold GPUs, each running with a fake vLLM on
    /// its IP.
    async fn refill(&mut self, count: usize) {
        loop {
            let list = self.borrowers.list(&ListParams::default()).await.unwrap();
            let live = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .count();
            if live >= count {
                break;
            }
            let name = format!("b-{:04}", self.next_borrower);
            self.next_borrower += 1;
            self.borrowers
                .create(&PostParams::default(), &self.pod(&name))
                .await
                .unwrap();
            match self.nodes {
                Nodes::Kwok => {
                    let pod = running(&self.borrowers, &name).await;
                    self.serve(&pod).await;
                }
                Nodes::RealKubelet => real_node::ready(&self.borrowers, &name).await,
            }
        }
    }

    /// A fake vLLM on the pod's IP, unpaused.
    async fn serve(&mut self, pod: &Pod) {
        let ip: IpAddr = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_ref())
            .unwrap()
            .parse()
            .unwrap();
        if let Some(server) = self.servers.get(&ip) {
            // Unpause it (a reused address's server was checkpointed by a reclaim).
            reqwest::Client::new()
                .post(server.url("/resume"))
                .send()
                .await
                .unwrap();
            server.clear_calls();
        } else {
            let config = VllmConfig {
                dev_mode: true,
                pause_latency: CHECKPOINT,
                ..VllmConfig::default()
            };
            let server = FakeVllm::start(config, SocketAddr::new(ip, VLLM_PORT))
                .await
                .unwrap();
            self.servers.insert(ip, server);
        }
    }

    /// One handover: an owner asks for one GPU; returns what it took.
    async fn handover(&mut self, mode: &'static str) -> Sample {
        self.refill(self.gpus).await;
        let name = format!("o-{:04}", self.next_owner);
        self.next_owner += 1;
        let mut owner = self.pod(&name);
        owner
            .spec
            .as_mut()
            .unwrap()
            .priority_class_name
            .clone_from(&self.owner_class);
        // A kubelet relists every second on its own clock, and this loop would meet it at the
        // same point of that cycle round after round: a random pause spreads the rounds over
        // it. (KWOK's kubelet-like stages draw their relist delay at random already.)
        if self.nodes == Nodes::RealKubelet {
            tokio::time::sleep(Duration::from_millis(rand::random_range(0..1000))).await;
        }
        let created = Instant::now();
        self.owners
            .create(&PostParams::default(), &owner)
            .await
            .unwrap();
        let bound = first_seen(&self.owners, &name, created, |pod| node_of(pod).is_some()).await;
        let owner_running_ms = match self.nodes {
            Nodes::Kwok => None,
            Nodes::RealKubelet => {
                let running = first_seen(&self.owners, &name, created, |pod| {
                    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .await;
                Some(running.saturating_sub(bound).as_secs_f64() * 1000.0)
            }
        };
        let owner = format!("{}/{name}", self.online);
        let queues: Api<GpuQueue> = Api::all(self.client.clone());
        let record = wait_for(format!("the record of {owner}"), WAIT, || async {
            let queue = queues.get("online").await.map_err(|e| e.to_string())?;
            queue
                .status
                .and_then(|s| {
                    s.last_handovers
                        .into_iter()
                        .find(|r| r.owner_pod == owner && r.role == "owner")
                })
                .ok_or_else(|| "not recorded yet".to_owned())
        })
        .await
        .unwrap();
        // A kubelet frees the GPU once the container has ended: no force delete there, or
        // the next borrower could find its device still allocated.
        let grace = match self.nodes {
            Nodes::Kwok => DeleteParams::default().grace_period(0),
            Nodes::RealKubelet => DeleteParams::default(),
        };
        self.owners.delete(&name, &grace).await.unwrap();
        gone(&self.owners, &name).await;
        Sample {
            mode,
            handover: Handover::of(&record),
            end_to_end_ms: bound.as_secs_f64() * 1000.0,
            owner_running_ms,
        }
    }
}

/// Polls the pod every 5 ms until `holds`; returns how long after `since` it was first seen so.
async fn first_seen(
    pods: &Api<Pod>,
    name: &str,
    since: Instant,
    holds: impl Fn(&Pod) -> bool,
) -> Duration {
    loop {
        let pod = pods.get(name).await.unwrap();
        if holds(&pod) {
            return since.elapsed();
        }
        assert!(since.elapsed() < WAIT, "{name}: {}", describe_pod(&pod));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn running(pods: &Api<Pod>, name: &str) -> Pod {
    wait_for(format!("pod {name} running"), WAIT, || async {
        let pod = pods.get(name).await.map_err(|e| e.to_string())?;
        let status = pod.status.as_ref();
        if status.and_then(|s| s.phase.as_deref()) == Some("Running")
            && status.and_then(|s| s.pod_ip.as_ref()).is_some()
        {
            Ok(pod)
        } else {
            Err(describe_pod(&pod))
        }
    })
    .await
    .unwrap()
}

async fn gone(pods: &Api<Pod>, name: &str) {
    wait_for(format!("pod {name} gone"), WAIT, || async {
        match pods.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(pod) => Err(describe_pod(&pod)),
        }
    })
    .await
    .unwrap();
}

/// The knobs, from the environment (small values make a quick smoke run).
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Knobs {
    nodes: usize,
    handovers: usize,
    burst_rounds: usize,
    burst_pods: usize,
    burst_none_pods: usize,
    /// `release` (measured), or `debug` for a smoke run of the benchmark itself.
    operator_build: &'static str,
    /// `kubelet` (default), or `fast` (`BENCH_NODE_BEHAVIOUR=fast`: KWOK's fast stages, where
    /// a victim vanishes at once) for figures comparable with peers measured on those.
    node_behaviour: &'static str,
    /// The owners' priority (`BENCH_OWNER_PRIORITY`, default 0: that of the borrowers).
    owner_priority: usize,
    /// Single handovers per mode on one real kubelet node (`BENCH_REAL_NODE_HANDOVERS`,
    /// default 0: it needs root, containerd, runc and buildah).
    real_node_handovers: usize,
    /// That node's kubelet with the alpha Evented PLEG on containerd v2
    /// (`BENCH_REAL_NODE_EVENTED_PLEG=1`) instead of the default 1 s relists.
    real_node_evented_pleg: bool,
}

impl Knobs {
    fn from_env() -> Self {
        let knobs = Self {
            nodes: env_number("BENCH_NODES", 3),
            handovers: env_number("BENCH_HANDOVERS", 50),
            burst_rounds: env_number("BENCH_BURST_ROUNDS", 5),
            burst_pods: env_number("BENCH_BURST_PODS", 22),
            burst_none_pods: env_number("BENCH_BURST_NONE_PODS", 12),
            operator_build: if std::env::var("BENCH_OPERATOR_BUILD").as_deref() == Ok("debug") {
                "debug"
            } else {
                "release"
            },
            node_behaviour: if std::env::var("BENCH_NODE_BEHAVIOUR").as_deref() == Ok("fast") {
                "fast"
            } else {
                "kubelet"
            },
            owner_priority: env_number("BENCH_OWNER_PRIORITY", 0),
            real_node_handovers: env_number("BENCH_REAL_NODE_HANDOVERS", 0),
            real_node_evented_pleg: std::env::var("BENCH_REAL_NODE_EVENTED_PLEG").as_deref()
                == Ok("1"),
        };
        let spare = knobs.nodes * GPUS_PER_NODE - burst::BASE_REPLICAS;
        assert!(
            knobs.burst_pods <= spare && knobs.burst_none_pods <= spare,
            "a burst of more than {spare} owner pods does not fit {} nodes of {GPUS_PER_NODE} GPUs \
             next to the {} running replicas: raise BENCH_NODES",
            knobs.nodes,
            burst::BASE_REPLICAS
        );
        knobs
    }
}

/// The operator installed and running on a cluster, its queues, and the bench that drives it.
struct Run {
    bench: Bench,
    _operator: Operator,
    _namespaces: [TempNamespace; 2],
}

impl Run {
    /// Installs and starts the operator on `cluster`, whose nodes hold `gpus` GPUs, and
    /// creates queue `online`, guaranteed all of them.
    async fn start(cluster: &ControlPlane, gpus: usize, knobs: &Knobs, nodes: Nodes) -> Self {
        let client = cluster.client();
        let online = cluster.namespace("online").await.unwrap();
        let batch = cluster.namespace("batch").await.unwrap();
        let webhook_port = free_port();
        install(cluster, webhook_port).await;
        apply_queue(&client, &queue_yaml("online", online.name(), gpus, 0, "{}")).await;
        let owner_class = (knobs.owner_priority > 0).then(|| OWNER_CLASS.to_owned());
        if owner_class.is_some() {
            let class = format!(
                "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {{name: {OWNER_CLASS}}}\nvalue: {}\n",
                knobs.owner_priority
            );
            gpuqueue_e2e::apply_yaml(&client, &class, None)
                .await
                .unwrap();
        }
        let mut options = Options::new("bench", webhook_port);
        // The release build is what is measured; a smoke run may take the debug build tests use.
        options.release = knobs.operator_build == "release";
        // `BENCH_OPERATOR_LOG` (a tracing filter) for the operator's debug log of a trial run.
        options.log_filter =
            std::env::var("BENCH_OPERATOR_LOG").unwrap_or_else(|_| "info".to_owned());
        let operator = Operator::start(cluster, options).await;
        let bench = Bench {
            client: client.clone(),
            audit_log: cluster.audit_log_path(),
            borrowers: Api::namespaced(client.clone(), batch.name()),
            owners: Api::namespaced(client.clone(), online.name()),
            online: online.name().to_owned(),
            batch: batch.name().to_owned(),
            gpus,
            servers: HashMap::new(),
            next_borrower: 0,
            next_owner: 0,
            owner_class,
            nodes,
        };
        Self {
            bench,
            _operator: operator,
            _namespaces: [online, batch],
        }
    }
}

/// `handovers` single handovers in each mode, after one warm-up each (not counted).
async fn singles(bench: &mut Bench, handovers: usize, on: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    if handovers == 0 {
        return samples;
    }
    for (mode, reclaim) in modes() {
        bench.set_mode(&reclaim).await;
        let warm_up = bench.handover(mode).await;
        eprintln!(
            "{on}, {mode}: warm-up {} ms (not counted)",
            warm_up.handover.total_ms
        );
        for i in 0..handovers {
            let sample = bench.handover(mode).await;
            let h = &sample.handover;
            eprintln!(
                "{on}, {mode} #{i}: total {} ms, checkpoint {} ms, victims gone {} ms, control plane {} ms, end to end {:.0} ms, owner running {:?} ms later ({})",
                h.total_ms,
                h.checkpoint_ms,
                h.victims_gone_ms,
                h.control_plane_ms,
                sample.end_to_end_ms,
                sample.owner_running_ms,
                h.outcome
            );
            assert_eq!(h.outcome, "Completed", "{sample:?}");
            samples.push(sample);
        }
    }
    samples
}

/// The KWOK part: single handovers, then bursts.
async fn on_kwok_nodes(knobs: &Knobs) -> (Vec<Sample>, Vec<burst::Burst>) {
    let gpus = knobs.nodes * GPUS_PER_NODE;
    let nodes = (0..knobs.nodes)
        .map(|i| GpuNode::whole_gpus(format!("gpu-node-{i}"), 8))
        .collect();
    // The default node behaviour: victims end as on a kubelet (grace period, relists). The
    // controller manager runs the owners' Deployment of the bursts.
    let mut config = ControlPlaneConfig::new("bench_handover").with_nodes(nodes);
    if knobs.node_behaviour == "fast" {
        config = config.with_node_behaviour(NodeBehaviour::Fast);
    }
    let cluster = ControlPlane::start(config).await.unwrap();
    eprintln!("control plane up ({})", cluster.startup_summary());
    let mut run = Run::start(&cluster, gpus, knobs, Nodes::Kwok).await;
    // `BENCH_HANDOVERS=0` measures the bursts alone (no warm-up either).
    let samples = singles(&mut run.bench, knobs.handovers, "KWOK").await;
    let bursts = burst::run(&mut run.bench, knobs).await;
    (samples, bursts)
}

/// The real-node part: single handovers on one real kubelet, in a cluster of its own with no
/// KWOK nodes.
async fn on_the_real_node(knobs: &Knobs) -> Vec<Sample> {
    if knobs.real_node_handovers == 0 {
        return Vec::new();
    }
    let config = ControlPlaneConfig::new("bench_handover_real_node").with_nodes(Vec::new());
    let cluster = ControlPlane::start(config).await.unwrap();
    let mut run = Run::start(&cluster, real_node::GPUS, knobs, Nodes::RealKubelet).await;
    let node = real_node::RealNode::up(&cluster, knobs.real_node_evented_pleg).await;
    let samples = singles(&mut run.bench, knobs.real_node_handovers, "real kubelet").await;
    drop(node);
    samples
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let knobs = Knobs::from_env();
    let (samples, bursts) = on_kwok_nodes(&knobs).await;
    let real = on_the_real_node(&knobs).await;
    report::write(&knobs, &samples, &bursts, &real);
}
