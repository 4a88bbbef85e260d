#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly
//! `make soak`: gpuqueue under faults for `SOAK_MINUTES` (default 20), bounded, not in CI.
//!
//! Two operator replicas elect a leader; the tenants of `e2e/soak/scenario.yaml` (the
//! simulator's format) offer day/night demand with a day compressed into `SOAK_DAY_SECONDS`
//! (default 240); batch pods serve fake vLLM checkpoints with injected latency, 500s and hangs;
//! and faults arrive on a schedule seeded by `SOAK_SEED` (default 1): rounds of every kind
//! once, shuffled, after quiet gaps of 0–`SOAK_GAP_SECONDS` (default 4):
//!
//! - the leader SIGKILLed (half the time while a reclaim is in flight), restarted at once;
//! - the leader SIGSTOPped for its lease plus 3 s, the standby taking over, then SIGCONT;
//! - kube-apiserver, and etcd, SIGKILLed and started again;
//! - etcd compacted, then kube-apiserver restarted: every watch resumes from a compacted
//!   revision and relists (the operators' logs show the "too old" answers, counted).
//!
//! The invariant checker (`gpuqueue_e2e::InvariantChecker`) watches throughout; liveness rules
//! are excused from each fault until `SETTLE` after recovery. Results go to
//! `e2e/results/soak.{json,md}`; the run fails if any invariant was violated.

#[path = "../tests/common/mod.rs"]
mod common;

// A bench's root is its crate root: its modules are found by path.
#[path = "soak/fleet.rs"]
mod fleet;
#[path = "soak/load.rs"]
mod load;
#[path = "soak/replicas.rs"]
mod replicas;
#[path = "soak/report.rs"]
mod report;

use std::collections::BTreeMap;
use std::time::Duration;

use gpuqueue_api::v1alpha1::{GpuQueue, HandoverRecord};
use gpuqueue_e2e::{
    Allowances, CheckerConfig, Component, ControlPlane, ControlPlaneConfig, FaultKind,
    FaultSchedule, GpuNode, InvariantChecker, Sightings, compact_etcd, env_number, reflect,
    repo_root, wall_clock_ms,
};
use gpuqueue_sim::scenario::Scenario;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    runtime::{reflector::Store, watcher},
};
use tokio::time::Instant;

use common::{OPERATOR_ACCOUNT, OPERATOR_NAMESPACE, apply_queue, free_port, install};
use replicas::Replicas;

const VLLM_PORT: u16 = 8000;
/// How long liveness rules stay excused after a fault has recovered: a lease to expire (6 s in
/// the tests' operator), a handover to resume, a pass to catch up.
const SETTLE: Duration = Duration::from_secs(10);
/// The tests' operator lease (`tests/common`).
const LEASE: Duration = Duration::from_secs(6);

/// The knobs, from the environment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Knobs {
    pub minutes: u64,
    pub seed: u64,
    pub day_seconds: u64,
    pub gap_seconds: u64,
    pub operator_build: &'static str,
}

/// One fault as injected.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Injected {
    pub kind: FaultKind,
    pub at_s: f64,
    /// When it struck, milliseconds since the Unix epoch (the clock of the handover records).
    pub at_unix_ms: u64,
    /// How long the component was down, or the leader paused or gone.
    pub down_ms: u64,
    /// For leader faults: a reclaim was in flight when it struck.
    pub mid_handover: bool,
    pub note: String,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::too_many_lines)] // one soak from start to report, in the order it runs
async fn main() {
    let knobs = Knobs {
        minutes: env_number("SOAK_MINUTES", 20),
        seed: env_number("SOAK_SEED", 1),
        day_seconds: env_number("SOAK_DAY_SECONDS", 240),
        gap_seconds: env_number("SOAK_GAP_SECONDS", 4),
        operator_build: if std::env::var("SOAK_OPERATOR_BUILD").as_deref() == Ok("debug") {
            "debug"
        } else {
            "release"
        },
    };
    eprintln!("soak: {knobs:?}");
    let scenario = Scenario::load(&repo_root().join("e2e/soak/scenario.yaml"), None)
        .unwrap()
        .scenario;
    let nodes = scenario
        .cluster
        .pools
        .iter()
        .flat_map(|pool| {
            (0..pool.count)
                .map(move |i| GpuNode::whole_gpus(format!("{}-{i}", pool.name), pool.gpus))
        })
        .collect();
    let mut cluster = ControlPlane::start(ControlPlaneConfig::new("soak").with_nodes(nodes))
        .await
        .unwrap();
    eprintln!("control plane up ({})", cluster.startup_summary());
    let client = cluster.client();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let mut tenants = Vec::new();
    for spec in &scenario.tenants {
        let namespace = cluster.namespace(&spec.name).await.unwrap();
        apply_queue(&client, &load::queue_yaml(spec, namespace.name())).await;
        tenants.push((
            load::Tenant {
                spec: spec.clone(),
                namespace: namespace.name().to_owned(),
            },
            namespace,
        ));
    }
    let batch_namespaces: Vec<String> = tenants
        .iter()
        .filter(|(t, _)| t.spec.batch.is_some())
        .map(|(t, _)| t.namespace.clone())
        .collect();
    let mut replicas =
        Replicas::start(&cluster, webhook_port, knobs.operator_build == "release").await;
    let checker = InvariantChecker::start(
        &client,
        CheckerConfig {
            audit_log: Some(cluster.audit_log_path()),
            operator_user: format!("system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}"),
            allowances: Allowances::default(),
        },
    );
    let (pods, pod_watch) = reflect::<Pod>(&client, None);
    let (queues, queue_watch) = reflect::<GpuQueue>(&client, None);
    let _ = tokio::join!(pods.wait_until_ready(), queues.wait_until_ready());

    let load = load::Load::new(
        client.clone(),
        &scenario,
        tenants
            .iter()
            .map(|(t, _)| load::Tenant {
                spec: t.spec.clone(),
                namespace: t.namespace.clone(),
            })
            .collect(),
        Duration::from_secs(knobs.day_seconds),
        knobs.seed,
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let load = load.spawn(stopped.clone());
    let fleet = fleet::Fleet::new(knobs.seed).spawn(pods.clone(), batch_namespaces, stopped);
    let record_watch = watch_records(&client);
    let mut leader_changes = 0usize;
    let mut last_holder = Replicas::holder(&cluster).await;
    let mut injected: Vec<Injected> = Vec::new();
    let mut schedule = FaultSchedule::new(
        knobs.seed,
        (Duration::ZERO, Duration::from_secs(knobs.gap_seconds)),
    );
    let began = Instant::now();
    let end = began + Duration::from_secs(knobs.minutes * 60);
    let mut next_rss = began;

    // Between faults the background keeps going: the load, the servers, RSS (the records have
    // a watch of their own).
    macro_rules! background_until {
        ($until:expr) => {{
            let until = $until;
            loop {
                if Instant::now() >= next_rss {
                    replicas.sample_rss();
                    next_rss += Duration::from_secs(10);
                }
                if Instant::now() >= until {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }};
    }

    background_until!(Instant::now() + Duration::from_secs(20));
    'rounds: while Instant::now() < end {
        for (gap, kind) in schedule.round() {
            background_until!(Instant::now() + gap);
            if Instant::now() >= end {
                break 'rounds;
            }
            let at_s = began.elapsed().as_secs_f64();
            let mid_handover = matches!(kind, FaultKind::KillLeader | FaultKind::PauseLeader)
                && schedule.chance(0.5)
                && wait_for_reclaim(&queues, Duration::from_secs(10)).await;
            checker.excuse_until_further_notice();
            let at_unix_ms = wall_clock_ms();
            let (down_ms, note) = inject(kind, &mut cluster, &mut replicas).await;
            checker.excuse_for(SETTLE);
            replicas.revive(&cluster).await;
            let holder = Replicas::holder(&cluster).await;
            if holder.is_some() && holder != last_holder {
                leader_changes += 1;
                last_holder = holder;
            }
            eprintln!(
                "[{at_s:>6.1}s] {} down {down_ms} ms{} {note}; violations so far {}",
                kind.name(),
                if mid_handover { " (mid-handover)" } else { "" },
                checker.violations_so_far()
            );
            injected.push(Injected {
                kind,
                at_s,
                at_unix_ms,
                down_ms,
                mid_handover,
                note,
            });
        }
    }
    // Quiet: let the last handovers finish before the records are read.
    background_until!(Instant::now() + SETTLE);
    let relists = relists_in_logs(&cluster);
    let _ = stop.send(true);
    let load_tally = load.await.unwrap();
    let (calls, fleet_tally) = fleet.await.unwrap();
    let report = checker.finish(&calls, Duration::from_secs(2)).await;
    pod_watch.abort();
    queue_watch.abort();
    let records = record_watch.finish();
    let handovers = report::handovers(&records, &injected, SETTLE);
    let soak = report::Soak {
        knobs,
        seconds: began.elapsed().as_secs_f64(),
        injected,
        relists_seen_in_operator_logs: relists,
        handovers,
        invariants: report,
        operator_restarts: replicas.restarts,
        unexpected_exits: replicas.unexpected_exits.clone(),
        leader_changes,
        load: load_tally,
        fleet: fleet_tally,
        rss: replicas.rss.clone(),
    };
    report::write(&soak);
    drop(tenants);
    assert!(
        soak.invariants.violations.is_empty(),
        "{} invariant violations: {:#?}",
        soak.invariants.violations.len(),
        soak.invariants.violations
    );
    // A handover the leader finished unhindered keeps its budget; only a control-plane outage
    // while it ran excuses it (a leader struck mid-way resumes it, judged by the checker).
    assert_eq!(
        soak.handovers.over_budget_unexplained(),
        0,
        "handovers over budget with no fault to explain it: {:#?}",
        soak.handovers.over_budget
    );
}

/// Injects one fault and waits until the system is whole again; returns how long the
/// component was down (or the leader gone or frozen) and a note.
async fn inject(
    kind: FaultKind,
    cluster: &mut ControlPlane,
    replicas: &mut Replicas,
) -> (u64, String) {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    match kind {
        FaultKind::KillLeader | FaultKind::PauseLeader => {
            let Some(leader) = Replicas::holder(cluster).await else {
                return (0, "no leader to strike".to_owned());
            };
            let Some(index) = replicas.index_of(&leader) else {
                return (0, format!("leader {leader} is not a replica"));
            };
            let struck = Instant::now();
            if kind == FaultKind::KillLeader {
                replicas.kill_and_restart(cluster, index).await;
                // Down until another identity holds the Lease (the dead one's expires first).
                let next = Replicas::new_holder(cluster, Some(&leader), LEASE * 4).await;
                (
                    ms(struck.elapsed()),
                    format!("{leader} killed; leader now {next:?}"),
                )
            } else {
                replicas.operators[index].process.pause().unwrap();
                let next = Replicas::new_holder(cluster, Some(&leader), LEASE * 4).await;
                // Longer than the lease, whatever the standby did.
                let frozen = LEASE + Duration::from_secs(3);
                tokio::time::sleep(frozen.saturating_sub(struck.elapsed())).await;
                replicas.operators[index].process.resume().unwrap();
                (
                    ms(struck.elapsed()),
                    format!("{leader} frozen; {next:?} took over; resumed"),
                )
            }
        }
        FaultKind::ApiServerRestart => {
            let down = cluster.restart(Component::ApiServer).await.unwrap();
            (ms(down), String::new())
        }
        FaultKind::EtcdRestart => {
            let down = cluster.restart(Component::Etcd).await.unwrap();
            (ms(down), String::new())
        }
        FaultKind::WatchRelist => {
            let revision = compact_etcd(&cluster.etcd_url()).await;
            let down = cluster.restart(Component::ApiServer).await.unwrap();
            (ms(down), format!("compacted at {revision:?}"))
        }
    }
}

/// Waits up to `patience` for any reclaim in flight; whether one was.
async fn wait_for_reclaim(queues: &Store<GpuQueue>, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        let in_flight = queues.state().iter().any(|q| {
            q.status
                .as_ref()
                .is_some_and(|s| !s.reclaims_in_flight.is_empty())
        });
        if in_flight {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Every owner record that any version of a queue's status showed, by id: a watch sees each
/// status write, where a queue keeps only its newest 8 records.
fn watch_records(client: &Client) -> Sightings<BTreeMap<String, HandoverRecord>> {
    let queues: Api<GpuQueue> = Api::all(client.clone());
    Sightings::start(
        queues,
        watcher::Config::default(),
        |seen: &mut BTreeMap<String, HandoverRecord>, queue: GpuQueue| {
            for record in queue.status.into_iter().flat_map(|s| s.last_handovers) {
                if record.role == "owner" {
                    seen.insert(record.id.clone(), record);
                }
            }
        },
    )
}

/// Watch answers "too old resource version" (410) in every operator log of the run: relists.
fn relists_in_logs(cluster: &ControlPlane) -> usize {
    let Ok(entries) = std::fs::read_dir(cluster.log_dir()) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("operator-"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|log| {
            log.lines()
                .filter(|l| l.contains("too old resource version"))
                .count()
        })
        .sum()
}
