#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly
//! `make bench-scale`: the operator on a cluster of DESIGN §9's size, 1,000 KWOK nodes × 8 GPUs,
//! 50 queues and 10,000 pods (`BENCH_SCALE_NODES`, `BENCH_SCALE_PODS`, `BENCH_SCALE_QUEUES`
//! change it; 200 / 2,000 iterates quickly).
//!
//! The queues split the GPUs evenly as guarantees. Queue 0 is an idle owner; the others may
//! borrow as much again, so the GPU pods (four fifths of the pods, at most one per GPU) fill
//! every GPU, queue 0's idle guarantee borrowed. The rest are CPU-only pods the operator does
//! not manage, half in claimed namespaces, half in one no queue claims. The release operator
//! runs as its ServiceAccount with the webhook installed, the pods go through it, and:
//!
//! 1. **load**: every pod created (`BENCH_SCALE_CREATORS` clients at once, 50), until all are bound;
//! 2. **rest**: nothing changes for `BENCH_SCALE_REST_SECONDS` (30): the API requests the
//!    cluster answers, and the operator's passes, must be ~0;
//! 3. **churn**: `BENCH_SCALE_CHURN` (50) times, a borrower's new pod waits at the gate on the
//!    full cluster until one of its queue's pods is deleted: passes on the full snapshot;
//! 4. **reclaim**: queue 0's first pod reclaims a borrowed GPU: the handover's plan phase;
//! 5. **cold start**: the operator stopped (the API requests of the same rest window without
//!    it, the baseline) and started again on the full cluster, until it is ready, leads and
//!    has finished its first pass.
//!
//! Memory is `VmRSS`/`VmHWM` from `/proc` every 250 ms; pass durations both from the operator's
//! histogram (bucket-interpolated, as a dashboard would show them) and exactly from its debug
//! log, one line per pass, with each pass's CPU time: on this machine the control plane and
//! 1,000 KWOK nodes share the operator's cores, and the difference is their share. Results:
//! `e2e/results/scale.{json,md}`.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "scale/counters.rs"]
mod counters;
#[path = "scale/memory.rs"]
mod memory;
#[path = "scale/report.rs"]
mod report;

use std::time::Duration;

use common::{Operator, Options, apply_queue, free_port, install, operator_access, queue_yaml};
use counters::{delta, histogram, histogram_quantile, logged_passes, percentile};
use futures::{StreamExt, stream};
use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, api_requests, env_number, gpu_pod,
    wait_for,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::{
    Client,
    api::{Api, DeleteParams, ListParams, PostParams},
};
use memory::Sampler;
use report::{PassStats, Phase, Scale};
use tokio::time::Instant;

const PASS_HISTOGRAM: &str = "gpuqueue_admission_pass_duration_seconds";

#[allow(clippy::disallowed_methods)] // the benchmark's own clock, lined up with the operator's log
fn wall_clock() -> Timestamp {
    Timestamp::now()
}

/// The cluster's shape.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Shape {
    pub nodes: usize,
    pub queues: usize,
    pub gpu_pods: usize,
    pub cpu_pods: usize,
    pub creators: usize,
}

fn queue_name(q: usize) -> String {
    format!("q{q:02}")
}

/// A CPU-only pod: no GPU, so the operator's pod store drops it.
fn cpu_pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/gpuqueue-e2e/fake:1",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
    }))
    .unwrap()
}

/// Creates `pod` in `namespace`, retrying what the loaded control plane refuses for a moment.
async fn create(client: &Client, namespace: &str, pod: &Pod) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    for attempt in 0.. {
        match pods.create(&PostParams::default(), pod).await {
            Ok(_) => return,
            Err(kube::Error::Api(status)) if status.code == 409 => return,
            Err(error) if attempt < 10 => {
                eprintln!(
                    "create {namespace}/{:?}: {error}; retrying",
                    pod.metadata.name
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => panic!("create failed 10 times: {error}"),
        }
    }
}

/// Waits until no pod is left unbound.
async fn all_bound(client: &Client, what: &str) {
    let pods: Api<Pod> = Api::all(client.clone());
    wait_for(what, Duration::from_mins(20), || async {
        let unbound = pods
            .list(&ListParams::default().fields("spec.nodeName="))
            .await
            .map_err(|e| e.to_string())?;
        if unbound.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} pods unbound", unbound.items.len()))
        }
    })
    .await
    .unwrap();
}

/// The pass histogram now.
async fn pass_buckets(operator: &Operator) -> Vec<(f64, f64)> {
    histogram(&operator.metrics().await, PASS_HISTOGRAM)
}

/// What a phase's passes took: from the histogram between two readings, and exactly from the
/// log lines between two times.
fn pass_stats(
    operator: &Operator,
    before: &[(f64, f64)],
    after: &[(f64, f64)],
    window: (Timestamp, Timestamp),
) -> PassStats {
    let log = std::fs::read_to_string(operator.process.log_path()).unwrap_or_default();
    let passes: Vec<_> = logged_passes(&log)
        .into_iter()
        .filter(|pass| pass.at >= window.0 && pass.at <= window.1)
        .collect();
    let mut logged: Vec<f64> = passes.iter().map(|pass| pass.millis).collect();
    logged.sort_by(f64::total_cmp);
    let mut cpu: Vec<f64> = passes.iter().filter_map(|pass| pass.cpu_millis).collect();
    cpu.sort_by(f64::total_cmp);
    let count = after.last().map_or(0.0, |b| b.1) - before.last().map_or(0.0, |b| b.1);
    let ms = |q| histogram_quantile(before, after, q).map(|s| s * 1000.0);
    PassStats {
        passes: count,
        histogram_p50_ms: ms(0.5),
        histogram_p99_ms: ms(0.99),
        logged: logged.len(),
        p50_ms: percentile(&logged, 0.5),
        p99_ms: percentile(&logged, 0.99),
        max_ms: logged.last().copied(),
        mean_ms: (!logged.is_empty()).then(|| {
            #[allow(clippy::cast_precision_loss)]
            let n = logged.len() as f64;
            logged.iter().sum::<f64>() / n
        }),
        cpu_p50_ms: percentile(&cpu, 0.5),
        cpu_p99_ms: percentile(&cpu, 0.99),
        cpu_max_ms: cpu.last().copied(),
        updated: passes
            .iter()
            .filter(|pass| pass.updated == Some(true))
            .count(),
    }
}

/// Runs `phase` with the sampler labelling it, and records its passes and wall time.
struct PhaseClock {
    name: &'static str,
    started: Instant,
    at: Timestamp,
    buckets: Vec<(f64, f64)>,
}

impl PhaseClock {
    async fn start(name: &'static str, sampler: &Sampler, operator: &Operator) -> Self {
        sampler.phase(name);
        eprintln!("phase {name} ({})", wall_clock());
        Self {
            name,
            started: Instant::now(),
            at: wall_clock(),
            buckets: pass_buckets(operator).await,
        }
    }

    async fn finish(self, operator: &Operator) -> Phase {
        let after = pass_buckets(operator).await;
        let seconds = self.started.elapsed().as_secs_f64();
        let passes = pass_stats(operator, &self.buckets, &after, (self.at, wall_clock()));
        eprintln!("phase {} done in {seconds:.1} s: {passes:?}", self.name);
        Phase {
            name: self.name,
            seconds,
            passes,
            load_average: report::load_average(),
        }
    }
}

#[allow(clippy::too_many_lines)] // the phases in order
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let nodes = env_number("BENCH_SCALE_NODES", 1000);
    let pods = env_number("BENCH_SCALE_PODS", 10_000);
    let queues = env_number("BENCH_SCALE_QUEUES", 50);
    let rest_seconds = env_number("BENCH_SCALE_REST_SECONDS", 30);
    let churn = env_number("BENCH_SCALE_CHURN", 50);
    let gpus = nodes * 8;
    let gpu_pods = (pods * 4 / 5).min(gpus);
    let shape = Shape {
        nodes,
        queues,
        gpu_pods,
        cpu_pods: pods - gpu_pods,
        creators: env_number("BENCH_SCALE_CREATORS", 50),
    };
    let sampler = Sampler::start();

    let mut config = ControlPlaneConfig::new("bench_scale").with_nodes(
        (0..nodes)
            .map(|i| GpuNode::whole_gpus(format!("gpu-node-{i:04}"), 8))
            .collect(),
    );
    // Pods are created directly; no workload controllers needed.
    config.controller_manager = false;
    let started = Instant::now();
    let cluster = ControlPlane::start(config).await.unwrap();
    let cluster_seconds = started.elapsed().as_secs_f64();
    eprintln!("control plane up ({})", cluster.startup_summary());
    let client = cluster.client();

    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let mut namespaces = Vec::new();
    for q in 0..queues {
        namespaces.push(cluster.namespace(&queue_name(q)).await.unwrap());
    }
    let plain = cluster.namespace("plain").await.unwrap();
    let guarantee = u32::try_from(gpus / queues).unwrap();
    for (q, namespace) in namespaces.iter().enumerate() {
        let burstable = if q == 0 { 0 } else { guarantee };
        let yaml = queue_yaml(&queue_name(q), &[namespace.name()], guarantee, burstable);
        apply_queue(&client, &yaml).await;
    }
    let access = operator_access(&cluster).await;
    let options = |identity: &str| {
        let mut options = Options::new(identity, webhook_port);
        options.release = true;
        options.kubeconfig = Some(access.kubeconfig.clone());
        // One debug line per admission pass: how long it took.
        "info,gpuqueue_operator::admission=debug".clone_into(&mut options.log_filter);
        options
    };
    let mut operator = Operator::start(&cluster, options("scale-1")).await;
    sampler.follow(operator.process.pid());
    leads(&operator).await;
    let mut phases = Vec::new();

    // 1. load
    let clock = PhaseClock::start("load", &sampler, &operator).await;
    let borrowers: Vec<&str> = namespaces[1..]
        .iter()
        .map(gpuqueue_e2e::TempNamespace::name)
        .collect();
    let claimed: Vec<&str> = namespaces
        .iter()
        .map(gpuqueue_e2e::TempNamespace::name)
        .collect();
    let creations = (0..gpu_pods)
        .map(|i| {
            (
                borrowers[i % borrowers.len()].to_owned(),
                gpu_pod(&format!("g-{i:05}"), NVIDIA_GPU, 1),
            )
        })
        .chain((0..shape.cpu_pods).map(|i| {
            let namespace = if i % 2 == 0 {
                claimed[i % claimed.len()]
            } else {
                plain.name()
            };
            (namespace.to_owned(), cpu_pod(&format!("c-{i:05}")))
        }));
    stream::iter(creations)
        .map(|(namespace, pod)| {
            let client = client.clone();
            async move { create(&client, &namespace, &pod).await }
        })
        .buffer_unordered(shape.creators)
        .collect::<Vec<()>>()
        .await;
    all_bound(&client, "every pod to be bound").await;
    phases.push(clock.finish(&operator).await);
    let passes_total = "gpuqueue_admission_passes_total";
    // Bound is not the end of the load: KWOK still reports pods running, and the operator
    // still publishes their Admitted events, for minutes on this machine. Rest starts when
    // nobody writes any more.
    let quiet_seconds = quiet(&client).await;
    settle(&operator, passes_total).await;

    // 2. rest
    let clock = PhaseClock::start("rest", &sampler, &operator).await;
    let rest_before = api_requests(&client).await;
    tokio::time::sleep(Duration::from_secs(u64::try_from(rest_seconds).unwrap())).await;
    let rest_requests = delta(&rest_before, &api_requests(&client).await);
    phases.push(clock.finish(&operator).await);

    // 3. churn
    let clock = PhaseClock::start("churn", &sampler, &operator).await;
    for round in 0..churn {
        let namespace = borrowers[round % borrowers.len()];
        let name = format!("churn-{round:04}");
        create(&client, namespace, &gpu_pod(&name, NVIDIA_GPU, 1)).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let old = format!("g-{round:05}");
        pods.delete(&old, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        gpuqueue_e2e::bound_pod(&pods, &name).await.unwrap();
    }
    phases.push(clock.finish(&operator).await);

    // 4. reclaim
    let clock = PhaseClock::start("reclaim", &sampler, &operator).await;
    let owner_pods: Api<Pod> = Api::namespaced(client.clone(), namespaces[0].name());
    create(
        &client,
        namespaces[0].name(),
        &gpu_pod("owner", NVIDIA_GPU, 1),
    )
    .await;
    gpuqueue_e2e::bound_pod(&owner_pods, "owner").await.unwrap();
    let handover = |phase: &str| {
        let series = format!("gpuqueue_handover_seconds_sum{{phase=\"{phase}\"}}");
        let operator = &operator;
        async move { operator.metric(&series).await.map(|s| s * 1000.0) }
    };
    // The watch can show the owner bound before the operator has closed the handover's record.
    let owner_bound_ms = wait_for("the handover to be recorded", DEFAULT_TIMEOUT, || async {
        handover("ownerBound")
            .await
            .ok_or_else(|| "no ownerBound phase yet".to_owned())
    })
    .await
    .ok();
    let reclaim = report::Reclaim {
        plan_ms: handover("plan").await,
        owner_bound_ms,
    };
    phases.push(clock.finish(&operator).await);

    // 5. cold start, after the same rest window without the operator
    sampler.phase("stopped");
    operator
        .process
        .terminate(Duration::from_secs(10))
        .await
        .unwrap();
    let first_run = sampler.samples();
    sampler.follow(0);
    let stopped_before = api_requests(&client).await;
    tokio::time::sleep(Duration::from_secs(u64::try_from(rest_seconds).unwrap())).await;
    let stopped_requests = delta(&stopped_before, &api_requests(&client).await);
    sampler.phase("cold start");
    let started = Instant::now();
    operator = Operator::start(&cluster, options("scale-2")).await;
    sampler.follow(operator.process.pid());
    let ready_seconds = started.elapsed().as_secs_f64();
    leads(&operator).await;
    let leader_seconds = started.elapsed().as_secs_f64();
    wait_for("the first pass", Duration::from_mins(5), || async {
        match operator.metric(passes_total).await {
            Some(n) if n >= 1.0 => Ok(()),
            other => Err(format!("{other:?} passes")),
        }
    })
    .await
    .unwrap();
    let first_pass_seconds = started.elapsed().as_secs_f64();
    let cold_log = std::fs::read_to_string(operator.process.log_path()).unwrap_or_default();
    let first_pass_ms = logged_passes(&cold_log).first().map(|p| p.millis);
    settle(&operator, passes_total).await;
    sampler.phase("after cold start");
    tokio::time::sleep(Duration::from_secs(10)).await;

    let cold = report::ColdStart {
        ready_seconds,
        leader_seconds,
        first_pass_seconds,
        first_pass_ms,
    };
    let second_run = sampler.samples().split_off(first_run.len());
    report::write(&Scale {
        shape,
        cluster_seconds,
        phases,
        quiet_seconds,
        rest_seconds,
        rest_requests,
        stopped_requests,
        reclaim,
        cold,
        first_run,
        second_run,
    });
}

/// Waits until `operator` holds the Lease.
async fn leads(operator: &Operator) {
    wait_for("the operator to lead", Duration::from_mins(2), || async {
        if operator.is_leader().await {
            Ok(())
        } else {
            Err("not the leader yet".to_owned())
        }
    })
    .await
    .unwrap();
}

/// Waits (at most ten minutes) until the API server answers no write but the Lease's for 5 s;
/// how long that took.
async fn quiet(client: &Client) -> f64 {
    let started = Instant::now();
    let give_up = started + Duration::from_mins(10);
    loop {
        let before = api_requests(client).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let writes: f64 = delta(&before, &api_requests(client).await)
            .iter()
            .filter(|(request, _)| {
                let (verb, resource) = request.split_once(' ').unwrap_or((request, ""));
                !matches!(verb, "GET" | "LIST" | "WATCH") && resource != "leases"
            })
            .map(|(_, count)| count)
            .sum();
        let waited = started.elapsed().as_secs_f64();
        if writes == 0.0 {
            eprintln!("quiet after {waited:.1} s");
            return waited;
        }
        if Instant::now() >= give_up {
            eprintln!("still {writes} writes in 5 s after ten minutes; resting anyway");
            return waited;
        }
    }
}

/// Waits (at most a minute) until no pass has run for 3 s: the bookkeeping after a phase is
/// not the next phase's.
async fn settle(operator: &Operator, passes_total: &str) {
    let mut last = operator.metric(passes_total).await;
    let give_up = Instant::now() + Duration::from_mins(1);
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = operator.metric(passes_total).await;
        if now == last || Instant::now() >= give_up {
            return;
        }
        last = now;
    }
}
