#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly
//! `make bench-admission`: how fast GPU pods get from creation to Bound with gpuqueue's
//! admission in the path, against kube-scheduler alone, on the same control plane in the same
//! run.
//!
//! The cluster is real (etcd, kube-apiserver, kube-scheduler; KWOK runs the nodes), with
//! `BENCH_NODES` nodes of 8 GPUs (default 100) and `BENCH_PODS` one-GPU pods (default 1,000)
//! created at once by `BENCH_CREATORS` concurrent clients (default 50).
//!
//! 1. **kube-scheduler alone**: the pods go into a namespace no queue claims, with no webhook
//!    installed and no operator running.
//! 2. **webhook only**: the webhook configuration from `config/` and the release build of the
//!    operator, pods in the same unclaimed namespace: the API server calls the webhook for each
//!    pod, which answers "not managed", and the operator watches everything. This is what the
//!    webhook call costs by itself, without the gate.
//! 3. **with gpuqueue**: the same, but a queue claims the namespace with a guarantee that does
//!    not limit anything, so the difference is the cost of the gate: the webhook adds it, the
//!    operator decides, and its patch pins the node and releases the gate.
//!
//! Throughput is the number of pods bound divided by the time from the first create request to
//! the last bind seen (pods beyond the cluster's capacity stay pending in every mode and are
//! left out). Latency is per pod, measured by this process's watch: create request answered
//! → gate released (gpuqueue) and → bound (all). CPU time is read from `/proc` for the whole
//! machine and for each process (control-plane components, operator, this benchmark), with the
//! operator's admission passes from its `/metrics`, to tell where the time went. Results:
//! `e2e/results/admission.json` and `admission.md` (committed, so a change is a visible diff).
//! `BENCH_ROUNDS` (default 2) repeats the three modes, in the reverse order every other round,
//! each run starting once the machine is idle; the best round of each mode counts, and the
//! ratio of the medians is reported next to it.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use common::{Operator, Options, apply_queue, free_port, install, is_gated, queue_yaml};
use futures::{StreamExt, stream};
use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, GpuNode, api_writes, env_number, gpu_pod, node_of, repo_root,
    wait_for,
};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{Api, DeleteParams, ListParams, PostParams},
    runtime::watcher,
};
use serde_json::json;

/// How many pods to create, how many can be bound, and by how many clients at once.
#[derive(Debug, Clone, Copy)]
struct Load {
    count: usize,
    expected: usize,
    creators: usize,
}

/// When this process saw each pod created, released and bound.
#[derive(Default)]
struct Timeline {
    created: HashMap<String, Instant>,
    released: HashMap<String, Instant>,
    bound: HashMap<String, Instant>,
}

/// One mode's numbers.
#[derive(Debug, serde::Serialize)]
struct Run {
    mode: &'static str,
    round: usize,
    pods: usize,
    bound: usize,
    seconds_to_last_bind: f64,
    pods_per_second: f64,
    bind_latency_p50_ms: f64,
    bind_latency_p99_ms: f64,
    admission_latency_p50_ms: Option<f64>,
    admission_latency_p99_ms: Option<f64>,
    /// CPU time the whole machine spent during the run (everything, other work included).
    machine_cpu_seconds: f64,
    /// CPU time each process spent during the run: the control-plane components, the operator
    /// and this benchmark (its pod creators and watch), to tell where the machine's time went.
    process_cpu_seconds: BTreeMap<String, f64>,
    /// The operator's admission passes during the run, from its `/metrics`.
    admission_passes: Option<Passes>,
    /// Write requests the API server answered during the run, by verb and resource (from its
    /// `apiserver_request_total`): what each mode asks of it beyond the pods themselves.
    api_writes: BTreeMap<String, f64>,
}

/// How many admission passes the operator ran and how long they took in all.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Passes {
    count: f64,
    seconds: f64,
}

impl Passes {
    async fn read(operator: &Operator) -> Self {
        Self {
            count: operator
                .metric("gpuqueue_admission_passes_total")
                .await
                .unwrap_or(0.0),
            seconds: operator
                .metric("gpuqueue_admission_pass_duration_seconds_sum")
                .await
                .unwrap_or(0.0),
        }
    }

    fn since(&self, before: &Self) -> Self {
        Self {
            count: self.count - before.count,
            seconds: self.seconds - before.seconds,
        }
    }
}

/// The modes, in the order each round runs them.
const SCHEDULER_ALONE: &str = "kube-scheduler";
const WEBHOOK_ONLY: &str = "webhook only";
const GPUQUEUE: &str = "gpuqueue";

/// Busy CPU time of the machine so far, from `/proc/stat`, in seconds (the kernel counts in
/// USER_HZ, which is 100 on Linux).
fn machine_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    let busy: u64 = fields
        .iter()
        .enumerate()
        .filter(|(i, _)| ![3, 4].contains(i) && *i < 8)
        .map(|(_, v)| v)
        .sum();
    #[allow(clippy::cast_precision_loss)]
    let seconds = busy as f64 / 100.0;
    seconds
}

/// CPU time (user + system) of process `pid` so far, from `/proc/<pid>/stat`, in seconds.
fn process_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name (which may hold spaces) come the fields from 3 (state) on; utime
    // and stime are fields 14 and 15. Some fields before them may be negative (tpgid is -1
    // without a terminal), so fields are counted by position, not by what parses.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |number: usize| -> u64 {
        fields
            .get(number - 3)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    #[allow(clippy::cast_precision_loss)]
    let seconds = (field(14) + field(15)) as f64 / 100.0;
    seconds
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn latencies(from: &HashMap<String, Instant>, to: &HashMap<String, Instant>) -> Vec<f64> {
    let mut values: Vec<f64> = to
        .iter()
        .filter_map(|(name, at)| Some(at.duration_since(*from.get(name)?).as_secs_f64() * 1000.0))
        .collect();
    values.sort_by(f64::total_cmp);
    values
}

/// Follows the namespace's pods, recording when each is first seen released and bound, until
/// `expected` are bound. The receiver resolves once the initial list is in.
fn follow(
    pods: Api<Pod>,
    timeline: Arc<Mutex<Timeline>>,
    expected: usize,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Receiver<()>,
) {
    // kube's watcher re-watches when the API server ends a watch (as it does under load) and
    // relists on 410 Gone, so no state change is missed.
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let watch = tokio::spawn(async move {
        let mut listed_tx = Some(listed_tx);
        let mut events = watcher(pods, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let pod = match event {
                Ok(watcher::Event::InitDone) => {
                    if let Some(listed) = listed_tx.take() {
                        let _ = listed.send(());
                    }
                    continue;
                }
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
                Ok(_) => continue,
                Err(error) => {
                    eprintln!("watch: {error}; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let now = Instant::now();
            let name = pod.metadata.name.clone().unwrap();
            let mut timeline = timeline.lock().unwrap();
            if !is_gated(&pod) {
                timeline.released.entry(name.clone()).or_insert(now);
            }
            if node_of(&pod).is_some() {
                timeline.bound.entry(name).or_insert(now);
                if timeline.bound.len() >= expected {
                    return;
                }
            }
        }
    });
    (watch, listed)
}

/// Creates `count` pods at once in `namespace` and watches them until `expected` are bound.
async fn run(
    cluster: &ControlPlane,
    namespace: &str,
    mode: &'static str,
    round: usize,
    load: Load,
    operator: Option<&Operator>,
) -> Run {
    let Load {
        count,
        expected,
        creators,
    } = load;
    let mut processes: Vec<(String, u32)> = cluster
        .components()
        .iter()
        .map(|process| (process.name().to_owned(), process.pid()))
        .collect();
    processes.push(("benchmark".to_owned(), std::process::id()));
    if let Some(operator) = operator {
        processes.push(("gpuqueue-operator".to_owned(), operator.process.pid()));
    }
    let passes_before = match operator {
        Some(operator) => Some(Passes::read(operator).await),
        None => None,
    };
    let processes_before: Vec<f64> = processes
        .iter()
        .map(|(_, pid)| process_cpu_seconds(*pid))
        .collect();
    let machine_before = machine_cpu_seconds();
    let writes_before = api_writes(&cluster.client()).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), namespace);
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let (watch, listed) = follow(pods.clone(), timeline.clone(), expected);
    listed.await.unwrap();

    let start = Instant::now();
    stream::iter(0..count)
        .map(|i| {
            let pods = pods.clone();
            let timeline = timeline.clone();
            async move {
                let name = format!("bench-{i:05}");
                pods.create(&PostParams::default(), &gpu_pod(&name, NVIDIA_GPU, 1))
                    .await
                    .unwrap();
                timeline
                    .lock()
                    .unwrap()
                    .created
                    .insert(name, Instant::now());
            }
        })
        .buffer_unordered(creators)
        .collect::<Vec<()>>()
        .await;
    tokio::time::timeout(Duration::from_mins(10), watch)
        .await
        .expect("pods were not all bound within 10 minutes")
        .unwrap();

    let writes_after = api_writes(&cluster.client()).await;
    let passes = match (operator, passes_before) {
        (Some(operator), Some(before)) => Some(Passes::read(operator).await.since(&before)),
        _ => None,
    };
    let timeline = timeline.lock().unwrap();
    let last_bind = timeline.bound.values().max().copied().unwrap_or(start);
    let seconds = last_bind.duration_since(start).as_secs_f64();
    let bind = latencies(&timeline.created, &timeline.bound);
    let gated = mode == GPUQUEUE;
    let admission = latencies(&timeline.created, &timeline.released);
    #[allow(clippy::cast_precision_loss)]
    let result = Run {
        mode,
        round,
        pods: count,
        bound: timeline.bound.len(),
        seconds_to_last_bind: seconds,
        pods_per_second: timeline.bound.len() as f64 / seconds,
        bind_latency_p50_ms: percentile(&bind, 0.5),
        bind_latency_p99_ms: percentile(&bind, 0.99),
        admission_latency_p50_ms: gated.then(|| percentile(&admission, 0.5)),
        admission_latency_p99_ms: gated.then(|| percentile(&admission, 0.99)),
        machine_cpu_seconds: machine_cpu_seconds() - machine_before,
        admission_passes: passes,
        api_writes: writes_after
            .into_iter()
            .map(|(key, after)| {
                let during = after - writes_before.get(&key).copied().unwrap_or(0.0);
                (key, during)
            })
            .filter(|(_, during)| *during > 0.0)
            .collect(),
        process_cpu_seconds: processes
            .iter()
            .zip(processes_before)
            .map(|((name, pid), before)| (name.clone(), process_cpu_seconds(*pid) - before))
            .collect(),
    };
    eprintln!("{result:?}");
    result
}

/// Deletes every pod of the namespace and waits until they are gone, freeing the GPUs.
async fn clear(cluster: &ControlPlane, namespace: &str) {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), namespace);
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default(),
    )
    .await
    .unwrap();
    wait_for(
        "the benchmark's pods to be gone",
        Duration::from_mins(5),
        || async {
            let left = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            if left.items.is_empty() {
                Ok(())
            } else {
                Err(format!("{} pods left", left.items.len()))
            }
        },
    )
    .await
    .unwrap();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let nodes = env_number("BENCH_NODES", 100);
    let count = env_number("BENCH_PODS", 1000);
    let creators = env_number("BENCH_CREATORS", 50);
    let rounds = env_number("BENCH_ROUNDS", 2);
    let capacity = nodes * 8;
    let expected = count.min(capacity);
    let load = Load {
        count,
        expected,
        creators,
    };

    let mut config = ControlPlaneConfig::new("bench_admission").with_nodes(
        (0..nodes)
            .map(|i| GpuNode::whole_gpus(format!("gpu-node-{i:03}"), 8))
            .collect(),
    );
    // Pods are created directly; no workload controllers needed.
    config.controller_manager = false;
    let cluster = ControlPlane::start(config).await.unwrap();
    eprintln!("control plane up ({})", cluster.startup_summary());

    let plain = cluster.namespace("plain").await.unwrap();
    let managed = cluster.namespace("managed").await.unwrap();
    let webhook_port = free_port();
    let mut operator: Option<Operator> = None;
    let mut results = Vec::new();
    for round in 1..=rounds {
        // Odd rounds run the modes in one order, even rounds in the other, so that no mode
        // always runs on the cluster the others have just loaded (etcd's history, the API
        // server's heap, the events they left).
        let mut order = [SCHEDULER_ALONE, WEBHOOK_ONLY, GPUQUEUE];
        if round % 2 == 0 {
            order.reverse();
        }
        for mode in order {
            if mode == SCHEDULER_ALONE {
                stop_gpuqueue(&cluster, operator.take()).await;
            } else if operator.is_none() {
                operator =
                    Some(start_gpuqueue(&cluster, webhook_port, round, count, &managed).await);
            }
            let namespace = if mode == GPUQUEUE { &managed } else { &plain };
            wait_for_quiet_machine().await;
            results.push(
                run(
                    &cluster,
                    namespace.name(),
                    mode,
                    round,
                    load,
                    operator.as_ref(),
                )
                .await,
            );
            clear(&cluster, namespace.name()).await;
        }
    }

    write_report(&results, nodes, count, creators, rounds);
}

/// kube-scheduler alone: no webhook configuration, no operator. SIGTERM: the operator
/// releases its Lease, so the next one need not wait it out.
async fn stop_gpuqueue(cluster: &ControlPlane, operator: Option<Operator>) {
    if let Some(mut running) = operator {
        running
            .process
            .terminate(Duration::from_secs(10))
            .await
            .unwrap();
    }
    let webhooks: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
        Api::all(cluster.client());
    let _ = webhooks
        .delete("gpuqueue-operator", &DeleteParams::default())
        .await;
}

/// The webhook and the operator (release build) in the path, leading, with a queue that claims
/// `managed` with a guarantee that limits nothing.
async fn start_gpuqueue(
    cluster: &ControlPlane,
    webhook_port: u16,
    round: usize,
    count: usize,
    managed: &gpuqueue_e2e::TempNamespace,
) -> Operator {
    install(cluster, webhook_port).await;
    apply_queue(
        &cluster.client(),
        &queue_yaml("bench", &[managed.name()], u32::try_from(count).unwrap(), 0),
    )
    .await;
    let mut options = Options::new(&format!("bench-{round}"), webhook_port);
    options.release = true;
    // One debug line per admission pass: how long it took and what it started.
    "info,gpuqueue_operator::admission=debug".clone_into(&mut options.log_filter);
    let started = Operator::start(cluster, options).await;
    // Ready is not leading: pods created before this replica holds the Lease would measure
    // the leader election, not admission.
    wait_for("the operator to lead", Duration::from_mins(1), || async {
        if started.is_leader().await {
            Ok(())
        } else {
            Err("not the leader yet".to_owned())
        }
    })
    .await
    .unwrap();
    started
}

/// Waits (at most 30 s) until the machine has been mostly idle for half a second, so that a
/// run does not share the CPUs with the tail of the one before (watchers still catching up
/// with its deletions, events still being published).
async fn wait_for_quiet_machine() {
    let cpus = std::thread::available_parallelism().map_or(1.0, |n| {
        #[allow(clippy::cast_precision_loss)]
        let n = n.get() as f64;
        n
    });
    let window = Duration::from_millis(500);
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let before = machine_cpu_seconds();
        tokio::time::sleep(window).await;
        let busy = (machine_cpu_seconds() - before) / (window.as_secs_f64() * cpus);
        if busy < 0.15 || Instant::now() >= give_up {
            return;
        }
    }
}

/// Writes `admission.json` and `admission.md` under `e2e/results/` and prints the table.
fn write_report(results: &[Run], nodes: usize, count: usize, creators: usize, rounds: usize) {
    use std::fmt::Write as _;
    let best = |mode: &str| {
        results
            .iter()
            .filter(|r| r.mode == mode)
            .map(|r| r.pods_per_second)
            .fold(f64::NAN, f64::max)
    };
    let median = |mode: &str| {
        let mut values: Vec<f64> = results
            .iter()
            .filter(|r| r.mode == mode)
            .map(|r| r.pods_per_second)
            .collect();
        values.sort_by(f64::total_cmp);
        match values.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => values[n / 2],
            n => f64::midpoint(values[n / 2 - 1], values[n / 2]),
        }
    };
    let ratio = best(GPUQUEUE) / best(SCHEDULER_ALONE);
    let webhook_ratio = best(WEBHOOK_ONLY) / best(SCHEDULER_ALONE);
    let median_ratio = median(GPUQUEUE) / median(SCHEDULER_ALONE);
    let median_webhook_ratio = median(WEBHOOK_ONLY) / median(SCHEDULER_ALONE);
    let dir = repo_root().join("e2e/results");
    std::fs::create_dir_all(&dir).unwrap();
    let json = json!({
        "nodes": nodes, "gpus_per_node": 8, "pods": count, "creators": creators, "rounds": rounds,
        "runs": results, "ratio_gpuqueue_to_scheduler": ratio,
        "ratio_webhook_only_to_scheduler": webhook_ratio,
        "median_ratio_gpuqueue_to_scheduler": median_ratio,
        "median_ratio_webhook_only_to_scheduler": median_webhook_ratio, "target_ratio": 0.8,
    });
    std::fs::write(
        dir.join("admission.json"),
        serde_json::to_string_pretty(&json).unwrap(),
    )
    .unwrap();
    let mut table = format!(
        "# Admission throughput: {count} one-GPU pods on {nodes} KWOK nodes × 8 GPUs\n\n\
         | mode | round | bound | seconds to last bind | pods/s | bind p50 | bind p99 | admission p50 | admission p99 | machine CPU s | admission passes (s) |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    );
    let ms = |v: Option<f64>| v.map_or_else(|| "—".to_owned(), |v| format!("{v:.0} ms"));
    for r in results {
        let _ = writeln!(
            table,
            "| {} | {} | {} | {:.2} | {:.1} | {:.0} ms | {:.0} ms | {} | {} | {:.1} | {} |",
            r.mode,
            r.round,
            r.bound,
            r.seconds_to_last_bind,
            r.pods_per_second,
            r.bind_latency_p50_ms,
            r.bind_latency_p99_ms,
            ms(r.admission_latency_p50_ms),
            ms(r.admission_latency_p99_ms),
            r.machine_cpu_seconds,
            r.admission_passes.map_or_else(
                || "—".to_owned(),
                |p| format!("{:.0} ({:.2})", p.count, p.seconds)
            ),
        );
    }
    table.push_str(&per_run_table(
        results,
        "CPU seconds per process during each run",
        |r| &r.process_cpu_seconds,
        |seconds| seconds.map_or_else(|| "—".to_owned(), |s| format!("{s:.2}")),
    ));
    table.push_str(&per_run_table(
        results,
        "Write requests the API server answered during each run",
        |r| &r.api_writes,
        |count| format!("{:.0}", count.unwrap_or(0.0)),
    ));
    let _ = write!(
        table,
        "\nThroughput with gpuqueue / kube-scheduler alone (best round of each): **{ratio:.2}** (target ≥ 0.8);\n\
         with the webhook call alone (no queue claims the namespace): {webhook_ratio:.2}.\n\
         The same from the median round of each: {median_ratio:.2}, and {median_webhook_ratio:.2} with the webhook alone.\n\
         Pods beyond the {} GPUs stay pending in every mode and are not counted.\n",
        nodes * 8
    );
    std::fs::write(dir.join("admission.md"), &table).unwrap();
    println!("{table}");
    println!("written to {}", dir.display());
}

/// A table of one row per run and one column per key of `values`, under `title`.
fn per_run_table(
    results: &[Run],
    title: &str,
    values: impl Fn(&Run) -> &BTreeMap<String, f64>,
    cell: impl Fn(Option<f64>) -> String,
) -> String {
    use std::fmt::Write as _;
    let keys: std::collections::BTreeSet<&String> =
        results.iter().flat_map(|r| values(r).keys()).collect();
    let mut table = format!("\n{title}:\n\n| mode | round |");
    for key in &keys {
        let _ = write!(table, " {key} |");
    }
    table.push_str("\n| --- | --- |");
    table.push_str(&" --- |".repeat(keys.len()));
    for r in results {
        let _ = write!(table, "\n| {} | {} |", r.mode, r.round);
        for key in &keys {
            let _ = write!(table, " {} |", cell(values(r).get(*key).copied()));
        }
    }
    table.push('\n');
    table
}
