#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly
//! `make bench-peers`: gpuqueue and Kueue side by side, on identical fresh clusters (one per
//! system per scenario group), the same tenants, the same pods, measured by the same watch in
//! one run, rounds alternating which system goes first.
//!
//! Kueue v0.19.2 is built by `e2e/scripts/build-tools.sh --peers` and run out of cluster by
//! the harness (`gpuqueue_e2e::Kueue`): ClusterQueues in one cohort mapped from the GpuQueues
//! (README, "How it maps to Volcano and Kueue"), `reclaimWithinCohort: Any`, a LocalQueue per
//! tenant namespace, the pod and Deployment integrations. gpuqueue runs the operator's release
//! build with its webhook and admission policies as `config/` installs them. Both clusters run
//! KWOK's fast stages (a deleted pod goes at once), so neither system's handling of the grace
//! period is measured, only how it decides and acts. `BENCH_NODE_BEHAVIOUR=kubelet` runs the
//! harness's kubelet-like stages instead (a victim terminates within its 1 s grace period, the
//! borrower pods' `terminationGracePeriodSeconds` and gpuqueue's `victimGracePeriodSeconds`),
//! to compare what each system serves on such nodes.
//!
//! 1. **Reclaim** (`BENCH_NODES` nodes × 8 GPUs, default 3): the borrower (guaranteed 0,
//!    burstable all) fills the cluster; the owner (guaranteed all) creates one one-GPU pod,
//!    `BENCH_RECLAIMS` times (default 50) per system: owner bound p50/p99 and victims per
//!    reclaim (1 is minimal). gpuqueue also with its vLLM checkpoint (the fake's pause takes
//!    1.2 s); Kueue has no checkpoint.
//! 2. **Burst reclaim**: the owner Deployment scales from 2 to 2 + N replicas, for each N of
//!    `BENCH_BURST_PODS` (comma-separated; default 12, the burst whose target the handover
//!    benchmark reports, and 22, the whole cluster; 0 skips bursts), `BENCH_BURST_ROUNDS`
//!    rounds each (default 5), each on a settled cluster: time to the last owner pod bound,
//!    pods evicted against the minimum.
//! 3. **Admission** (`BENCH_ADMISSION_NODES` × 8 GPUs, default 100): `BENCH_PODS` one-GPU pods
//!    (default 1,000) over 4 tenants guaranteed a quarter of the GPUs each (nothing
//!    burstable), created by `BENCH_CREATORS` clients at once (default 50), `BENCH_ROUNDS` rounds
//!    (default 2): pods/s to bound, admission (gate released) and bind p50/p99, and the API
//!    server's write requests. `BENCH_PODS=0` skips it.
//! 4. **Quota honesty**: through every scenario, `gpuqueue_e2e::QuotaSampler` samples pods
//!    every 100 ms: a tenant above its ceiling, or below its guarantee (while asking for it)
//!    for longer than the 3 s budget, is a violation.
//!
//! One warm-up per system and mode is not counted. Times are this process's clock, from the
//! request sent to the watch's first sight of the pod bound (the API server's own timestamps
//! have whole seconds only). `BENCH_OPERATOR_BUILD=debug` runs the operator's debug build
//! (a smoke run). Results: `e2e/results/peers.json` and `peers.md` (`BENCH_RESULTS` for
//! another directory, relative to the repository root). Percentiles are nearest-rank.

#[path = "../tests/common/mod.rs"]
mod common;

#[path = "peers/report.rs"]
mod report;
#[path = "peers/scenarios.rs"]
mod scenarios;
#[path = "peers/side.rs"]
mod side;

use std::time::Duration;

use gpuqueue_e2e::{Kueue, env_number, env_numbers};

use scenarios::ReclaimState;
use side::{Side, System, Tenant, gpus};

const GPUS_PER_NODE: usize = 8;
const VLLM_PORT: u16 = 8000;
/// How long the fake vLLM's pause takes in gpuqueue's checkpoint mode.
const CHECKPOINT: Duration = Duration::from_millis(1200);
/// How long an owner may stay below its guarantee (gpuqueue's default `reclaim.budget`); the
/// sampler holds Kueue to the same.
const BUDGET: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_mins(2);
const OWNER: &str = "online";
const BORROWER: &str = "batch";

/// The victims' grace period: gpuqueue's `victimGracePeriodSeconds` below, and every tenant
/// pod's `terminationGracePeriodSeconds`, which Kueue's deletion of a victim uses.
const VICTIM_GRACE_SECONDS: i64 = 1;
/// gpuqueue's reclaim settings for the borrower, by mode.
const NO_CHECKPOINT: &str = "{checkpoint: {driver: none}, victimGracePeriodSeconds: 1}";
const VLLM_CHECKPOINT: &str =
    "{checkpoint: {driver: vllm, port: 8000, timeout: 1500ms}, victimGracePeriodSeconds: 1}";

/// The knobs, from the environment (small values make a quick smoke run).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Knobs {
    nodes: usize,
    reclaims: usize,
    burst_pods: Vec<usize>,
    burst_rounds: usize,
    admission_nodes: usize,
    pods: usize,
    creators: usize,
    rounds: usize,
    operator_build: &'static str,
    /// `fast` (default) or `kubelet` (`BENCH_NODE_BEHAVIOUR`).
    node_behaviour: &'static str,
}

impl Knobs {
    fn from_env() -> Self {
        let nodes = env_number("BENCH_NODES", 3);
        Self {
            nodes,
            reclaims: env_number("BENCH_RECLAIMS", 50),
            burst_pods: burst_sizes(
                env_numbers(
                    "BENCH_BURST_PODS",
                    vec![12, gpus(nodes) - scenarios::BASE_REPLICAS],
                ),
                nodes,
            ),
            burst_rounds: env_number("BENCH_BURST_ROUNDS", 5),
            admission_nodes: env_number("BENCH_ADMISSION_NODES", 100),
            pods: env_number("BENCH_PODS", 1000),
            creators: env_number("BENCH_CREATORS", 50),
            rounds: env_number("BENCH_ROUNDS", 2),
            operator_build: if std::env::var("BENCH_OPERATOR_BUILD").as_deref() == Ok("debug") {
                "debug"
            } else {
                "release"
            },
            node_behaviour: if std::env::var("BENCH_NODE_BEHAVIOUR").as_deref() == Ok("kubelet") {
                "kubelet"
            } else {
                "fast"
            },
        }
    }
}

/// The burst sizes asked for that fit beside the base replicas (the cluster is full), each once,
/// smallest first.
fn burst_sizes(mut asked: Vec<usize>, nodes: usize) -> Vec<usize> {
    asked.retain(|&pods| pods > 0 && pods <= gpus(nodes) - scenarios::BASE_REPLICAS);
    asked.sort_unstable();
    asked.dedup();
    asked
}

/// The two systems in round `round`'s order: gpuqueue first in even rounds, Kueue in odd.
fn order(round: usize) -> [System; 2] {
    let [a, b] = System::BOTH;
    if round.is_multiple_of(2) {
        [a, b]
    } else {
        [b, a]
    }
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
    let index = ((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1);
    sorted[index.min(sorted.len() - 1)]
}

fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let knobs = Knobs::from_env();
    let bin_dir = gpuqueue_e2e::bin_dir().unwrap();
    if let Some(reason) = Kueue::unavailable(bin_dir) {
        panic!("bench-peers measures against Kueue, which cannot run here: {reason}");
    }
    // Built before any cluster starts: a build while the two clusters come up starves the
    // other side's waits (Kueue's CRDs), and its time would count against neither.
    common::operator_binary(knobs.operator_build == "release");
    let load_before = uptime();
    let (reclaims, bursts, quota) = Box::pin(reclaim_scenarios(&knobs)).await;
    let mut results = report::Results {
        knobs,
        load_before,
        load_after: uptime(),
        reclaims,
        bursts,
        admissions: Vec::new(),
        quota,
    };
    // Written now too, so a failure in the admission scenario keeps what was measured.
    report::write(&results);
    if results.knobs.pods == 0 {
        return;
    }
    let (admissions, admission_quota) = Box::pin(admission_scenario(&results.knobs)).await;
    results.admissions = admissions;
    results.quota.extend(admission_quota);
    results.load_after = uptime();
    report::write(&results);
}

/// Scenarios 1 and 2 on one cluster per system; returns the samples and each system's quota
/// report.
async fn reclaim_scenarios(
    knobs: &Knobs,
) -> (
    Vec<scenarios::Reclaim>,
    Vec<scenarios::Burst>,
    Vec<report::Quota>,
) {
    let gpus = gpus(knobs.nodes);
    let tenants = [
        Tenant {
            name: OWNER,
            guaranteed: gpus,
            burstable: 0,
        },
        Tenant {
            name: BORROWER,
            guaranteed: 0,
            burstable: gpus,
        },
    ];
    let (a, b) = tokio::join!(
        Side::start(
            System::Gpuqueue,
            "reclaim",
            knobs.nodes,
            &tenants,
            NO_CHECKPOINT,
            knobs
        ),
        Side::start(
            System::Kueue,
            "reclaim",
            knobs.nodes,
            &tenants,
            NO_CHECKPOINT,
            knobs
        ),
    );
    let sides = [a, b];
    let mut states = [ReclaimState::default(), ReclaimState::default()];
    let mut reclaims = Vec::new();
    for round in 0..=knobs.reclaims {
        for system in order(round) {
            let i = system as usize;
            let sample = scenarios::reclaim(&sides[i], &mut states[i], gpus, "none").await;
            eprintln!("reclaim {} #{round}: {sample:?}", system.name());
            if round > 0 {
                reclaims.push(sample);
            }
        }
    }
    // gpuqueue's checkpoint: only gpuqueue has one, so its rounds run alone.
    sides[0].set_reclaim(&tenants[1], VLLM_CHECKPOINT).await;
    for round in 0..=knobs.reclaims {
        let sample = scenarios::reclaim(&sides[0], &mut states[0], gpus, "vllm 1.2 s").await;
        eprintln!("reclaim gpuqueue vllm #{round}: {sample:?}");
        if round > 0 {
            reclaims.push(sample);
        }
    }
    sides[0].set_reclaim(&tenants[1], NO_CHECKPOINT).await;
    let mut bursts = Vec::new();
    for &pods in &knobs.burst_pods {
        for round in 0..=knobs.burst_rounds {
            for system in order(round) {
                let i = system as usize;
                let sample = scenarios::burst(&sides[i], &mut states[i], gpus, pods).await;
                eprintln!("burst {} of {pods} #{round}: {sample:?}", system.name());
                if round > 0 {
                    bursts.push(sample);
                }
            }
        }
    }
    let [a, b] = sides;
    let quota = vec![
        report::Quota::of(System::Gpuqueue, "reclaim and burst", a.stop().await),
        report::Quota::of(System::Kueue, "reclaim and burst", b.stop().await),
    ];
    (reclaims, bursts, quota)
}

/// Scenario 3 on one cluster per system.
async fn admission_scenario(knobs: &Knobs) -> (Vec<scenarios::Admission>, Vec<report::Quota>) {
    const TENANTS: [&str; 4] = ["tenant-a", "tenant-b", "tenant-c", "tenant-d"];
    let gpus = gpus(knobs.admission_nodes);
    let share = gpus / TENANTS.len();
    // No borrowing: with it, whichever tenant's pods came first would borrow and then be
    // reclaimed, and the run would measure that churn instead of admission.
    let tenants = TENANTS.map(|name| Tenant {
        name,
        guaranteed: share,
        burstable: 0,
    });
    let (a, b) = tokio::join!(
        Side::start(
            System::Gpuqueue,
            "admission",
            knobs.admission_nodes,
            &tenants,
            NO_CHECKPOINT,
            knobs
        ),
        Side::start(
            System::Kueue,
            "admission",
            knobs.admission_nodes,
            &tenants,
            NO_CHECKPOINT,
            knobs
        ),
    );
    let sides = [a, b];
    let expected = knobs.pods.min(gpus);
    let mut runs = Vec::new();
    for round in 0..knobs.rounds {
        for system in order(round) {
            let side = &sides[system as usize];
            let run =
                scenarios::admission(side, &TENANTS, round, knobs.pods, expected, knobs.creators)
                    .await;
            eprintln!("admission {} #{round}: {run:?}", system.name());
            runs.push(run);
        }
    }
    let [a, b] = sides;
    let quota = vec![
        report::Quota::of(System::Gpuqueue, "admission", a.stop().await),
        report::Quota::of(System::Kueue, "admission", b.stop().await),
    ];
    (runs, quota)
}
