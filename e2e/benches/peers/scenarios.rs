//! The scenarios, each run on one [`Side`] at a time; the caller alternates the order.
//!
//! Every time is this process's clock: t0 when the request is sent (the pod create, the scale
//! patch), the end when the watch first sees the pod bound. `creationTimestamp` and the
//! `PodScheduled` condition carry whole seconds only, too coarse for reclaims of tens of
//! milliseconds; the one observer watches both systems' API servers the same way.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, stream};
use gpuqueue_e2e::{node_of, wait_for};
use gpuqueue_fake_vllm::{Config as VllmConfig, FakeVllm};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;

use super::side::{Side, System, fill, tenant_pod};
use super::{BORROWER, CHECKPOINT, OWNER, VLLM_PORT, WAIT};

/// One reclaim: the owner asks for one GPU of a full cluster.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reclaim {
    pub system: System,
    pub mode: &'static str,
    pub owner_bound_ms: f64,
    pub victims: usize,
}

/// One burst: the owner Deployment scales from its base to base + `owner_pods`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Burst {
    pub system: System,
    pub owner_pods: usize,
    pub last_bound_ms: f64,
    pub evicted: usize,
    pub minimum: usize,
}

/// One admission run: pods created at once over the tenants.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Admission {
    pub system: System,
    pub round: usize,
    pub pods: usize,
    pub bound: usize,
    /// No pod was bound for [`STALL`] before `expected` were: the run stopped there.
    pub stalled: bool,
    pub seconds_to_last_bind: f64,
    pub pods_per_second: f64,
    /// Create request sent → the watch sees no admission gate (the system admitted it).
    pub released_p50_ms: f64,
    pub released_p99_ms: f64,
    pub bind_p50_ms: f64,
    pub bind_p99_ms: f64,
    /// Write requests the API server answered during the run, by verb and resource.
    pub api_writes: std::collections::BTreeMap<String, f64>,
    pub api_writes_total: f64,
}

/// The per-side state of the reclaim scenarios: pod counters and the fake vLLM servers.
#[derive(Default)]
pub struct ReclaimState {
    next_borrower: usize,
    next_owner: usize,
    /// A fake vLLM per borrower IP, for the checkpoint mode (KWOK reuses a freed IP).
    servers: HashMap<IpAddr, FakeVllm>,
}

/// One reclaim on a full cluster of `gpus` GPUs; with `checkpoint`, every borrower runs a fake
/// vLLM whose pause takes [`CHECKPOINT`].
pub async fn reclaim(
    side: &Side,
    state: &mut ReclaimState,
    gpus: usize,
    mode: &'static str,
) -> Reclaim {
    fill(side, BORROWER, gpus, "b", &mut state.next_borrower).await;
    if mode != "none" {
        serve_borrowers(side, state).await;
    }
    let name = format!("o-{:05}", state.next_owner);
    state.next_owner += 1;
    let sent = Instant::now();
    side.create_pod(OWNER, &name).await;
    let bound = side.bound_at(OWNER, &name).await;
    let owners = side.pods(OWNER);
    owners
        .delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    gone(&owners, &name).await;
    Reclaim {
        system: side.system,
        mode,
        owner_bound_ms: millis(sent, bound),
        victims: side.deleted_since(BORROWER, sent),
    }
}

/// A fake vLLM on every live borrower's IP, unpaused.
async fn serve_borrowers(side: &Side, state: &mut ReclaimState) {
    let list = side
        .pods(BORROWER)
        .list(&ListParams::default())
        .await
        .unwrap();
    for pod in list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let Some(ip) = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_ref())
            .and_then(|ip| ip.parse::<IpAddr>().ok())
        else {
            continue;
        };
        if let Some(server) = state.servers.get(&ip) {
            // A reused address's server was paused by a reclaim.
            reqwest::Client::new()
                .post(server.url("/resume"))
                .send()
                .await
                .unwrap();
        } else {
            let config = VllmConfig {
                dev_mode: true,
                pause_latency: CHECKPOINT,
                ..VllmConfig::default()
            };
            let server = FakeVllm::start(config, SocketAddr::new(ip, VLLM_PORT))
                .await
                .unwrap();
            state.servers.insert(ip, server);
        }
    }
}

/// The owner Deployment (its pods carry the owner's LocalQueue label for Kueue).
const DEPLOYMENT: &str = "owner";

fn deployment(replicas: usize) -> serde_json::Value {
    let template = tenant_pod(OWNER, "template");
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "labels": {gpuqueue_e2e::QUEUE_NAME_LABEL: OWNER}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": DEPLOYMENT}},
            "template": {
                "metadata": {"labels": {"app": DEPLOYMENT, gpuqueue_e2e::QUEUE_NAME_LABEL: OWNER}},
                "spec": {"terminationGracePeriodSeconds": 0, "containers": template.spec.unwrap().containers},
            },
        },
    })
}

/// Replicas of the owner Deployment between bursts.
pub const BASE_REPLICAS: usize = 2;

/// The pause between the borrowers refilled and the scale request: as the handover benchmark's
/// (its `QUIET`, twice), longer than gpuqueue's 300 ms gathering of handover records and
/// KWOK's move of the new borrowers to Running; the same for both systems.
const SETTLE: Duration = Duration::from_secs(1);

/// One burst: the owner Deployment at [`BASE_REPLICAS`], every other GPU held by borrowers,
/// is scaled up by `pods`; measured to the last new owner pod bound. Leaves the Deployment at
/// its base with the borrowers refilled.
pub async fn burst(side: &Side, state: &mut ReclaimState, gpus: usize, pods: usize) -> Burst {
    let deployments: Api<Deployment> =
        Api::namespaced(side.cluster.client(), side.namespace(OWNER));
    if deployments.get_opt(DEPLOYMENT).await.unwrap().is_none() {
        let object: Deployment = serde_json::from_value(deployment(BASE_REPLICAS)).unwrap();
        deployments
            .create(&kube::api::PostParams::default(), &object)
            .await
            .unwrap();
    }
    owners_settled(side, BASE_REPLICAS).await;
    fill(
        side,
        BORROWER,
        gpus - BASE_REPLICAS,
        "b",
        &mut state.next_borrower,
    )
    .await;
    // A morning's scale-up starts on a settled cluster: the round before has written its last
    // records and statuses, and the refilled borrowers are running.
    tokio::time::sleep(SETTLE).await;
    let before: Vec<String> = side
        .tenant_times(OWNER)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let sent = Instant::now();
    scale(&deployments, BASE_REPLICAS + pods).await;
    let last_bound = wait_for(
        format!("{}: {pods} new owner pods bound", side.system.name()),
        WAIT,
        || async {
            let new: Vec<_> = side
                .tenant_times(OWNER)
                .into_iter()
                .filter(|(name, _)| !before.contains(name))
                .collect();
            let bound: Vec<Instant> = new.iter().filter_map(|(_, t)| t.bound).collect();
            if bound.len() >= pods {
                Ok(bound.into_iter().max().unwrap())
            } else {
                Err(format!("{} of {} new pods bound", bound.len(), new.len()))
            }
        },
    )
    .await
    .unwrap();
    let evicted = side.deleted_since(BORROWER, sent);
    scale(&deployments, BASE_REPLICAS).await;
    owners_settled(side, BASE_REPLICAS).await;
    Burst {
        system: side.system,
        owner_pods: pods,
        last_bound_ms: millis(sent, last_bound),
        evicted,
        // The cluster is full: each new owner pod needs one borrower's GPU.
        minimum: pods,
    }
}

async fn scale(deployments: &Api<Deployment>, replicas: usize) {
    deployments
        .patch(
            DEPLOYMENT,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

/// Waits until exactly `replicas` owner pods exist, all bound.
async fn owners_settled(side: &Side, replicas: usize) {
    let owners = side.pods(OWNER);
    wait_for(
        format!("{}: {replicas} owner pods bound", side.system.name()),
        WAIT,
        || async {
            let list = owners
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let bound = list.items.iter().filter(|p| node_of(p).is_some()).count();
            if list.items.len() == replicas && bound == replicas {
                Ok(())
            } else {
                Err(format!("{} pods, {bound} bound", list.items.len()))
            }
        },
    )
    .await
    .unwrap();
}

/// `count` one-GPU pods, spread round-robin over `tenants`, created by `creators` clients at
/// once; measured until `expected` are bound. Deletes them all afterwards.
pub async fn admission(
    side: &Side,
    tenants: &[&'static str],
    round: usize,
    count: usize,
    expected: usize,
    creators: usize,
) -> Admission {
    let client = side.cluster.client();
    let writes_before = gpuqueue_e2e::api_writes(&client).await;
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let start = Instant::now();
    stream::iter(0..count)
        .map(|i| {
            let tenant = tenants[i % tenants.len()];
            let name = format!("a{round}-{i:05}");
            let sent = sent.clone();
            async move {
                let key = format!("{}/{name}", side.namespace(tenant));
                sent.lock().unwrap().insert(key, Instant::now());
                side.create_pod(tenant, &name).await;
            }
        })
        .buffer_unordered(creators)
        .collect::<Vec<()>>()
        .await;
    let sent = sent.lock().unwrap().clone();
    let (times, stalled) = until_bound_or_stalled(side, &sent, expected).await;
    let writes = gpuqueue_e2e::api_writes(&client)
        .await
        .into_iter()
        .map(|(key, after)| {
            let during = after - writes_before.get(&key).copied().unwrap_or(0.0);
            (key, during)
        })
        .filter(|(_, during)| *during > 0.0)
        .collect::<std::collections::BTreeMap<_, _>>();
    let last = times
        .iter()
        .filter_map(|(_, t)| t.bound)
        .max()
        .unwrap_or(start);
    let seconds = last.duration_since(start).as_secs_f64();
    let mut bind = latencies(&times, |t| t.bound);
    let mut released = latencies(&times, |t| t.released);
    bind.sort_by(f64::total_cmp);
    released.sort_by(f64::total_cmp);
    let bound = bind.len();
    for tenant in tenants {
        clear(side, tenant).await;
    }
    #[allow(clippy::cast_precision_loss)]
    Admission {
        system: side.system,
        round,
        pods: count,
        bound,
        stalled,
        seconds_to_last_bind: seconds,
        pods_per_second: bound as f64 / seconds,
        released_p50_ms: super::percentile(&released, 0.5),
        released_p99_ms: super::percentile(&released, 0.99),
        bind_p50_ms: super::percentile(&bind, 0.5),
        bind_p99_ms: super::percentile(&bind, 0.99),
        api_writes_total: writes.values().sum(),
        api_writes: writes,
    }
}

/// How long without a new bind ends an admission run short of its expected count.
const STALL: Duration = Duration::from_secs(30);

/// The times of the pods in `sent` once `expected` are bound, or once none has been bound for
/// [`STALL`] (then `true`): a system that stops admitting is reported, not waited for.
async fn until_bound_or_stalled(
    side: &Side,
    sent: &HashMap<String, Instant>,
    expected: usize,
) -> (Vec<(Instant, super::side::PodTimes)>, bool) {
    let (mut last_count, mut last_change) = (0, Instant::now());
    loop {
        let ours: Vec<_> = {
            let timeline = side.timeline.lock().unwrap();
            sent.iter()
                .filter_map(|(key, at)| Some((*at, *timeline.get(key)?)))
                .collect()
        };
        let bound = ours.iter().filter(|(_, t)| t.bound.is_some()).count();
        if bound >= expected {
            return (ours, false);
        }
        if bound > last_count {
            (last_count, last_change) = (bound, Instant::now());
        } else if last_change.elapsed() > STALL {
            eprintln!(
                "{}: admission stalled at {bound} of {expected} bound (none for {STALL:?})",
                side.system.name()
            );
            return (ours, true);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn latencies(
    times: &[(Instant, super::side::PodTimes)],
    of: impl Fn(&super::side::PodTimes) -> Option<Instant>,
) -> Vec<f64> {
    times
        .iter()
        .filter_map(|(sent, t)| Some(millis(*sent, of(t)?)))
        .collect()
}

/// Deletes every pod of the tenant and waits until they are gone.
async fn clear(side: &Side, tenant: &str) {
    let pods = side.pods(tenant);
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default(),
    )
    .await
    .unwrap();
    wait_for(
        format!("{}: the pods of {tenant} to be gone", side.system.name()),
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

async fn gone(pods: &Api<Pod>, name: &str) {
    wait_for(format!("pod {name} gone"), WAIT, || async {
        match pods.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(pod) => Err(gpuqueue_e2e::describe_pod(&pod)),
        }
    })
    .await
    .unwrap();
}

fn millis(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}
