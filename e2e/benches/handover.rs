#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly
//! `make bench-handover`: how long a reclaim takes, phase by phase, on the local control plane
//! (etcd, kube-apiserver, kube-scheduler, kube-controller-manager; KWOK runs the node) with the
//! release build of the operator and its webhook in the path.
//!
//! One node of 8 GPUs is full of one-GPU borrower pods of queue `batch` (guaranteed 0,
//! burstable 8), each with a fake vLLM on its pod IP. Each handover: an owner pod of queue
//! `online` (guaranteed 8) asks for one GPU, the operator reclaims it from one borrower, and
//! the owner is bound; then the owner is deleted and a new borrower refills the node. First
//! `BENCH_HANDOVERS` handovers (default 50) with the `vllm` driver and the fake's `POST /pause`
//! taking 1.2 s, then as many with checkpoint `none`. One warm-up handover per mode is not
//! counted.
//!
//! The phases come from the operator's own record (`status.lastHandovers`, measured from the
//! start of the admission pass that found the owner blocked); "end to end" is this process's
//! view, from the owner's create request to its first sight of the owner bound (polled every
//! 5 ms), so it adds the webhook call, the watch and the debounce before the pass. The
//! control-plane share is the whole handover minus the checkpoint phase.
//!
//! Results: `e2e/results/handover.json` and `e2e/results/handover.md` (committed).
//! Percentiles are nearest-rank: with 50 samples, p99 is the largest.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::time::Instant;

use common::{Operator, Options, apply_queue, free_port, install};
use gpuqueue_api::{NVIDIA_GPU, v1alpha1::GpuQueue};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, GpuNode, describe_pod, gpu_pod, repo_root, wait_for,
};
use gpuqueue_fake_vllm::{Config as VllmConfig, FakeVllm};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Client,
    api::{Api, DeleteParams, ListParams, PostParams},
};
use serde_json::json;

const GPUS: usize = 8;
const VLLM_PORT: u16 = 8000;
const CHECKPOINT: Duration = Duration::from_millis(1200);
const WAIT: Duration = Duration::from_mins(1);
const PHASES: [&str; 7] = [
    "plan",
    "intent",
    "reserve",
    "checkpoint",
    "evictAccepted",
    "victimsGone",
    "ownerBound",
];

/// One handover as measured.
#[derive(Debug, Clone, serde::Serialize)]
struct Sample {
    mode: &'static str,
    /// Milliseconds from found blocked to the end of each phase (the operator's record).
    phases: Vec<(String, i64)>,
    total_ms: i64,
    checkpoint_ms: i64,
    control_plane_ms: i64,
    end_to_end_ms: f64,
    checkpoint_result: String,
    outcome: String,
}

impl Sample {
    fn at(&self, phase: &str) -> Option<i64> {
        self.phases
            .iter()
            .find(|(p, _)| p == phase)
            .map(|(_, at)| *at)
    }

    /// How long `phase` itself took (from the end of the phase before it).
    fn duration(&self, phase: &str) -> Option<i64> {
        let index = PHASES.iter().position(|p| *p == phase)?;
        let end = self.at(phase)?;
        let start = if index == 0 {
            0
        } else {
            self.at(PHASES[index - 1])?
        };
        Some(end - start)
    }
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
    borrowers: Api<Pod>,
    owners: Api<Pod>,
    online: String,
    /// A fake vLLM per pod IP (KWOK hands a freed IP to the next pod, so a server stands for
    /// an address, and is reused).
    servers: HashMap<IpAddr, FakeVllm>,
    next_borrower: usize,
    next_owner: usize,
}

impl Bench {
    /// Creates borrowers until the node is full, each running with a fake vLLM on its IP.
    async fn refill(&mut self) {
        loop {
            let list = self.borrowers.list(&ListParams::default()).await.unwrap();
            let live = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .count();
            if live >= GPUS {
                break;
            }
            let name = format!("b-{:04}", self.next_borrower);
            self.next_borrower += 1;
            self.borrowers
                .create(&PostParams::default(), &gpu_pod(&name, NVIDIA_GPU, 1))
                .await
                .unwrap();
            let pod = running(&self.borrowers, &name).await;
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
    }

    /// One handover: an owner asks for one GPU; returns what it took.
    async fn handover(&mut self, mode: &'static str) -> Sample {
        self.refill().await;
        let name = format!("o-{:04}", self.next_owner);
        self.next_owner += 1;
        let created = Instant::now();
        self.owners
            .create(&PostParams::default(), &gpu_pod(&name, NVIDIA_GPU, 1))
            .await
            .unwrap();
        let bound = loop {
            let pod = self.owners.get(&name).await.unwrap();
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some()
            {
                break created.elapsed();
            }
            assert!(
                created.elapsed() < WAIT,
                "owner not bound: {}",
                describe_pod(&pod)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
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
        self.owners
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        let phases: Vec<(String, i64)> = record
            .phases
            .iter()
            .map(|p| (p.phase.clone(), p.at_millis))
            .collect();
        let mut sample = Sample {
            mode,
            phases,
            total_ms: record.total_millis,
            checkpoint_ms: 0,
            control_plane_ms: 0,
            end_to_end_ms: bound.as_secs_f64() * 1000.0,
            checkpoint_result: record
                .checkpoints
                .first()
                .map(|c| c.result.clone())
                .unwrap_or_default(),
            outcome: record.outcome.clone(),
        };
        sample.checkpoint_ms = sample.duration("checkpoint").unwrap_or(0);
        sample.control_plane_ms = sample.total_ms - sample.checkpoint_ms;
        wait_for(format!("owner {name} gone"), WAIT, || async {
            match self
                .owners
                .get_opt(&name)
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(pod) => Err(describe_pod(&pod)),
            }
        })
        .await
        .unwrap();
        sample
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

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// p50, p95, p99 and max of `values`.
fn summary(mut values: Vec<f64>) -> [f64; 4] {
    values.sort_by(f64::total_cmp);
    [
        percentile(&values, 0.50),
        percentile(&values, 0.95),
        percentile(&values, 0.99),
        values.last().copied().unwrap_or(f64::NAN),
    ]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let handovers = env_number("BENCH_HANDOVERS", 50);
    let mut config = ControlPlaneConfig::new("bench_handover")
        .with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", 8)]);
    // Bare pods only: no workload controllers; the disruption controller is not needed either.
    config.controller_manager = false;
    let cluster = ControlPlane::start(config).await.unwrap();
    eprintln!("control plane up ({})", cluster.startup_summary());
    let client = cluster.client();
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let vllm = format!("{{checkpoint: {{driver: vllm, port: {VLLM_PORT}, timeout: 1500ms}}}}");
    apply_queue(&client, &queue_yaml("online", online.name(), GPUS, 0, "{}")).await;
    apply_queue(&client, &queue_yaml("batch", batch.name(), 0, GPUS, &vllm)).await;
    let mut options = Options::new("bench", webhook_port);
    options.release = true;
    "info".clone_into(&mut options.log_filter);
    let _operator = Operator::start(&cluster, options).await;

    let mut bench = Bench {
        client: client.clone(),
        borrowers: Api::namespaced(client.clone(), batch.name()),
        owners: Api::namespaced(client.clone(), online.name()),
        online: online.name().to_owned(),
        servers: HashMap::new(),
        next_borrower: 0,
        next_owner: 0,
    };
    let mut samples = Vec::new();
    for (mode, reclaim) in [
        ("vllm 1.2 s", vllm.as_str()),
        ("none", "{checkpoint: {driver: none}}"),
    ] {
        apply_queue(
            &client,
            &queue_yaml("batch", batch.name(), 0, GPUS, reclaim),
        )
        .await;
        let warm_up = bench.handover(mode).await;
        eprintln!("{mode}: warm-up {} ms (not counted)", warm_up.total_ms);
        for i in 0..handovers {
            let sample = bench.handover(mode).await;
            eprintln!(
                "{mode} #{i}: total {} ms, checkpoint {} ms, control plane {} ms, end to end {:.0} ms ({})",
                sample.total_ms,
                sample.checkpoint_ms,
                sample.control_plane_ms,
                sample.end_to_end_ms,
                sample.outcome
            );
            assert_eq!(sample.outcome, "Completed", "{sample:?}");
            samples.push(sample);
        }
    }
    write_report(&samples, handovers);
}

fn write_report(samples: &[Sample], handovers: usize) {
    let modes = ["vllm 1.2 s", "none"];
    let mut rows: Vec<(String, &str, [f64; 4])> = Vec::new();
    #[allow(clippy::cast_precision_loss)]
    let ms = |v: i64| v as f64;
    for mode in modes {
        let of: Vec<&Sample> = samples.iter().filter(|s| s.mode == mode).collect();
        for phase in PHASES {
            let values = of
                .iter()
                .filter_map(|s| s.duration(phase))
                .map(ms)
                .collect();
            rows.push((format!("phase: {phase}"), mode, summary(values)));
        }
        rows.push((
            "whole handover (found blocked → owner bound)".into(),
            mode,
            summary(of.iter().map(|s| ms(s.total_ms)).collect()),
        ));
        rows.push((
            "control-plane share (whole − checkpoint)".into(),
            mode,
            summary(of.iter().map(|s| ms(s.control_plane_ms)).collect()),
        ));
        rows.push((
            "end to end (create request → bound seen)".into(),
            mode,
            summary(of.iter().map(|s| s.end_to_end_ms).collect()),
        ));
    }
    let over_budget = |mode: &str| {
        samples
            .iter()
            .filter(|s| s.mode == mode && s.total_ms > 3000)
            .count()
    };
    let results = repo_root().join("e2e/results");
    std::fs::create_dir_all(&results).unwrap();
    let json = json!({
        "handovers_per_mode": handovers,
        "node": "1 KWOK node, 8 GPUs, full of one-GPU borrowers",
        "budget_ms": 3000,
        "fake_vllm_pause_ms": CHECKPOINT.as_millis(),
        "percentiles": "nearest rank",
        "summary": rows.iter().map(|(what, mode, [p50, p95, p99, max])| json!({
            "what": what, "mode": mode, "p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "max_ms": max,
        })).collect::<Vec<_>>(),
        "over_budget": {"vllm 1.2 s": over_budget("vllm 1.2 s"), "none": over_budget("none")},
        "samples": samples,
    });
    std::fs::write(
        results.join("handover.json"),
        serde_json::to_string_pretty(&json).unwrap(),
    )
    .unwrap();
    let mut table = format!(
        "# Handover latency: {handovers} reclaims per mode\n\n\
         One KWOK node with 8 GPUs full of one-GPU borrowers; each owner asks for one GPU within its\n\
         guarantee (budget 3 s). Release build of the operator, real kube-apiserver, kube-scheduler\n\
         and etcd on this machine. Phase durations from the operator's handover records, in ms.\n\n\
         | what | checkpoint | p50 | p95 | p99 | max |\n| --- | --- | --- | --- | --- | --- |\n"
    );
    for (what, mode, [p50, p95, p99, max]) in &rows {
        let _ = writeln!(
            table,
            "| {what} | {mode} | {p50:.0} | {p95:.0} | {p99:.0} | {max:.0} |"
        );
    }
    let _ = write!(
        table,
        "\nHandovers over the 3 s budget: {} of {handovers} with the 1.2 s checkpoint, {} of {handovers} without.\n\
         Targets: whole handover p99 < 3000 ms with the 1.2 s checkpoint; control-plane share p99 < 300 ms.\n",
        over_budget("vllm 1.2 s"),
        over_budget("none"),
    );
    std::fs::write(results.join("handover.md"), &table).unwrap();
    println!("{table}");
    println!("written to {}", results.display());
}
