//! Bursts: the owner Deployment, running [`BASE_REPLICAS`] replicas with every other GPU held
//! by borrowers, is scaled up by N at once; the measure is the time from the scale request
//! until the last of the N owner pods is bound, and each pod's handover.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use gpuqueue_api::v1alpha1::GpuQueue;
use gpuqueue_e2e::{AuditTail, AuditedRequest, ServerMetrics, apply_yaml, node_of, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::observe::{ReclaimSighting, wall_clock, watch_pods, watch_reclaims};
use super::record::Handover;
use super::{Bench, Knobs, VLLM_PORT, WAIT, modes};

/// Replicas the owner Deployment runs between bursts.
pub const BASE_REPLICAS: usize = 2;
/// The owner Deployment.
const DEPLOYMENT: &str = "online";
/// The benchmark's field manager for the scale request (found again in `managedFields`).
const SCALER: &str = "gpuqueue-bench";
/// The gate webhook, as `config/webhook/mutating_webhook_configuration.yaml` names it.
const WEBHOOK: &str = "gate.gpuqueue.io";
/// The pause before the scale request's `/metrics` read and after it, so that a burst starts
/// on a settled cluster, as a morning's scale-up does: the round before has written its last
/// records and events (not counted in this round's writes), and the API server is done with
/// the read (tens of milliseconds of its CPU, and the garbage, measured inside the round
/// otherwise).
pub const QUIET: Duration = Duration::from_millis(500);

/// One burst as measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Burst {
    pub mode: &'static str,
    pub owner_pods: usize,
    /// Scale request sent → the last owner pod seen bound by this process's watch.
    pub last_bound_ms: f64,
    /// The same from the operator's records: the latest found-blocked time plus its whole
    /// handover, minus the scale request (`None` when a record was not seen).
    pub last_bound_by_records_ms: Option<f64>,
    /// The same on the API server's clock (its audit log, in microseconds): the scale
    /// request received → the last owner pod's binding answered (stored).
    pub last_bound_server_ms: Option<f64>,
    /// Scale request → the last owner pod seen created by this process's watch: the
    /// ReplicaSet's slow start (batches of 1, 2, 4, … creates, each through the webhook).
    pub last_created_ms: Option<f64>,
    /// The API server's mean wait per call of the gate webhook in the round (each create of
    /// the slow start makes one): the webhook's answer and the round trip to it.
    pub webhook_call_ms: Option<f64>,
    /// Scale request → the first and the last owner pod found blocked by the operator.
    pub first_found_blocked_ms: Option<f64>,
    pub last_found_blocked_ms: Option<f64>,
    /// Reclaims the operator started for these pods (more than one per pod: planned again).
    pub reclaims: usize,
    /// Each owner pod: first found blocked (the operator's `startedAt`) → seen bound.
    pub found_blocked_to_bound_ms: Vec<f64>,
    /// The records of the handovers that the watch saw (`lastHandovers` keeps the last 8; the
    /// older ones of a burst are written in patches before that).
    pub handovers: Vec<Handover>,
    /// The API server's write requests from the scale request until the records were seen,
    /// by `VERB resource[/subresource]`: the burst's cost in writes, whatever the machine's load.
    pub api_writes: BTreeMap<String, f64>,
}

/// The Deployment of owner pods, one GPU each, of PriorityClass `class` if any; removed at
/// once when scaled down.
fn deployment(replicas: usize, class: Option<&str>) -> String {
    let class = class
        .map(|c| format!("      priorityClassName: {c}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {DEPLOYMENT}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: {DEPLOYMENT}}}\n  template:\n    metadata:\n      labels: {{app: {DEPLOYMENT}}}\n    spec:\n{class}      terminationGracePeriodSeconds: 0\n      containers:\n        - name: vllm\n          image: vllm/vllm-openai:v0.11.0\n          ports: [{{containerPort: {VLLM_PORT}}}]\n          resources:\n            limits: {{nvidia.com/gpu: 1}}\n"
    )
}

/// Every mode's rounds (plus one warm-up each, not returned).
pub async fn run(bench: &mut Bench, knobs: &Knobs) -> Vec<Burst> {
    let mut bursts = Vec::new();
    let mut deployed = false;
    for ((mode, reclaim), pods) in modes()
        .into_iter()
        .zip([knobs.burst_pods, knobs.burst_none_pods])
    {
        if pods == 0 {
            continue;
        }
        // The borrowers' queue first: without the single handovers before, it does not exist
        // yet, and a borrower refilled before it is evicted as unadmitted.
        bench.set_mode(&reclaim).await;
        if !deployed {
            apply_yaml(
                &bench.client,
                &deployment(BASE_REPLICAS, bench.owner_class.as_deref()),
                Some(&bench.online),
            )
            .await
            .unwrap();
            settle(bench, BASE_REPLICAS).await;
            deployed = true;
        }
        for round in 0..=knobs.burst_rounds {
            let burst = one(bench, mode, pods).await;
            eprintln!(
                "burst {mode} x{pods} {}: last bound {:.0} ms after the scale request \
                 (records: {:?} ms, server: {:?} ms), {} of {pods} records seen",
                if round == 0 {
                    "warm-up (not counted)".to_owned()
                } else {
                    format!("#{round}")
                },
                burst.last_bound_ms,
                burst.last_bound_by_records_ms,
                burst.last_bound_server_ms,
                burst.handovers.len()
            );
            eprintln!("  API writes: {:?}", burst.api_writes);
            if round > 0 {
                bursts.push(burst);
            }
        }
    }
    bursts
}

/// Scales the owners to `replicas`, waits until exactly they run, and refills the borrowers.
async fn settle(bench: &mut Bench, replicas: usize) {
    scale(bench, replicas).await;
    wait_for(format!("{replicas} owner pods"), WAIT, || async {
        let list = bench
            .owners
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let bound = list.items.iter().filter(|p| node_of(p).is_some()).count();
        if list.items.len() == replicas && bound == replicas {
            Ok(())
        } else {
            Err(format!("{} pods, {bound} bound", list.items.len()))
        }
    })
    .await
    .unwrap();
    bench.refill(bench.gpus - replicas).await;
}

async fn scale(bench: &Bench, replicas: usize) {
    let deployments: Api<Deployment> = Api::namespaced(bench.client.clone(), &bench.online);
    let params = PatchParams {
        field_manager: Some(SCALER.to_owned()),
        ..PatchParams::default()
    };
    deployments
        .patch(
            DEPLOYMENT,
            &params,
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// Milliseconds from `from` to `to`.
fn millis(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64() * 1000.0
}

/// One burst of `pods` owner pods; leaves the cluster as it found it.
async fn one(bench: &mut Bench, mode: &'static str, pods: usize) -> Burst {
    let before: HashSet<String> = bench
        .owners
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(name)
        .collect();
    let sightings = watch_pods(bench.owners.clone());
    let reclaims = watch_reclaims(Api::<GpuQueue>::all(bench.client.clone()), "online");
    wait_for("the owner watch to list the running replicas", WAIT, || {
        let seen = sightings.snapshot();
        let listed = before.iter().all(|n| seen.contains_key(n));
        async move {
            if listed {
                Ok(())
            } else {
                Err("listing".to_owned())
            }
        }
    })
    .await
    .unwrap();

    tokio::time::sleep(QUIET).await;
    let metrics_before = ServerMetrics::read(&bench.client).await;
    tokio::time::sleep(QUIET).await;
    let mut audit = AuditTail::new(bench.audit_log.clone(), String::new());
    let requested = wall_clock();
    scale(bench, BASE_REPLICAS + pods).await;
    let new_pods = wait_for(format!("{pods} new owner pods bound"), WAIT, || {
        let seen = sightings.snapshot();
        let fresh: Vec<(String, Timestamp)> = seen
            .into_iter()
            .filter(|(n, _)| !before.contains(n))
            .filter_map(|(n, s)| s.bound.map(|at| (n, at)))
            .collect();
        async move {
            if fresh.len() >= pods {
                Ok(fresh)
            } else {
                Err(format!("{} bound", fresh.len()))
            }
        }
    })
    .await
    .unwrap();
    let owners: HashSet<String> = new_pods
        .iter()
        .map(|(n, _)| format!("{}/{n}", bench.online))
        .collect();
    // Records are written as their handovers end (a batch per queue at a time); give the last
    // ones a moment, then take what was seen.
    let _ = wait_for("every handover record", Duration::from_secs(10), || {
        let recorded = reclaims
            .snapshot()
            .values()
            .filter(|r| owners.contains(&r.owner_pod) && r.record.is_some())
            .count();
        async move {
            if recorded >= pods {
                Ok(())
            } else {
                Err(format!("{recorded} of {pods}"))
            }
        }
    })
    .await;
    let ours: Vec<ReclaimSighting> = reclaims
        .snapshot()
        .into_values()
        .filter(|r| owners.contains(&r.owner_pod))
        .collect();
    let metrics = ServerMetrics::read(&bench.client).await;
    let calls = metrics.webhook_calls(WEBHOOK);
    let writes_before = metrics_before.writes();
    let mut writes = metrics.writes();
    for (request, count) in &mut writes {
        *count -= writes_before.get(request).copied().unwrap_or_default();
    }
    writes.retain(|_, count| *count > 0.0);
    let bound: HashSet<String> = new_pods.iter().map(|(n, _)| n.clone()).collect();
    let server = server_millis(&mut audit, &bench.online, &bound).await;
    let created = sightings
        .snapshot()
        .into_iter()
        .filter(|(n, _)| !before.contains(n))
        .filter_map(|(_, s)| s.seen)
        .max();
    let mut burst = measure(mode, requested, &new_pods, &ours, &bench.online, server);
    burst.last_created_ms = created.map(|at| millis(requested, at));
    burst.webhook_call_ms = calls.mean_ms_since(&metrics_before.webhook_calls(WEBHOOK));
    burst.api_writes = writes;
    settle(bench, BASE_REPLICAS).await;
    burst
}

/// The scale request received → the last binding of the `owners` (pods of `namespace`)
/// answered, on the API server's clock, from its audit log; `None` when the log does not show
/// them all within a few seconds.
async fn server_millis(
    audit: &mut AuditTail,
    namespace: &str,
    owners: &HashSet<String>,
) -> Option<f64> {
    let mut seen: Vec<AuditedRequest> = Vec::new();
    let of_ours = |r: &AuditedRequest| r.namespace.as_deref() == Some(namespace);
    let found = wait_for("the burst in the audit log", Duration::from_secs(5), || {
        seen.extend(audit.requests().into_iter().filter(of_ours));
        let scaled = seen
            .iter()
            .filter(|r| r.resource == "deployments" && r.name.as_deref() == Some(DEPLOYMENT))
            .map(|r| r.received)
            .min();
        let bindings: Vec<Timestamp> = seen
            .iter()
            .filter(|r| {
                r.subresource.as_deref() == Some("binding")
                    && (200..300).contains(&r.code)
                    && r.name.as_ref().is_some_and(|n| owners.contains(n))
            })
            .map(|r| r.answered)
            .collect();
        let all = bindings.len() >= owners.len();
        let span = scaled.zip(bindings.into_iter().max());
        async move {
            match span {
                Some((from, to)) if all => Ok(millis(from, to)),
                _ => Err("not all audited yet".to_owned()),
            }
        }
    })
    .await;
    found.ok()
}

fn measure(
    mode: &'static str,
    requested: Timestamp,
    new_pods: &[(String, Timestamp)],
    reclaims: &[ReclaimSighting],
    namespace: &str,
    last_bound_server_ms: Option<f64>,
) -> Burst {
    let last_bound = new_pods.iter().map(|(_, at)| *at).max().unwrap();
    // A pod may be found blocked more than once (a reclaim given up and planned again): its
    // wait counts from the first time, its handover is the one with a record.
    let per_pod: Vec<(Option<Timestamp>, Option<f64>, Timestamp)> = new_pods
        .iter()
        .map(|(pod, bound)| {
            let key = format!("{namespace}/{pod}");
            let of: Vec<&ReclaimSighting> =
                reclaims.iter().filter(|r| r.owner_pod == key).collect();
            let first = of.iter().filter_map(|r| r.started).min();
            let end = of.iter().find_map(|r| {
                let total = r.record.as_ref()?.total_millis;
                Some(millis(requested, r.started?) + super::stats::ms(total))
            });
            (first, end, *bound)
        })
        .collect();
    let found: Vec<Timestamp> = per_pod.iter().filter_map(|(first, ..)| *first).collect();
    let found_blocked_to_bound_ms = per_pod
        .iter()
        .filter_map(|(first, _, bound)| Some(millis((*first)?, *bound)))
        .collect();
    let ends: Option<Vec<f64>> = per_pod.iter().map(|(_, end, _)| *end).collect();
    Burst {
        mode,
        owner_pods: new_pods.len(),
        last_bound_ms: millis(requested, last_bound),
        last_bound_by_records_ms: ends.and_then(|e| e.into_iter().max_by(f64::total_cmp)),
        reclaims: reclaims.len(),
        last_bound_server_ms,
        last_created_ms: None,
        webhook_call_ms: None,
        first_found_blocked_ms: found.iter().min().map(|t| millis(requested, *t)),
        last_found_blocked_ms: found.iter().max().map(|t| millis(requested, *t)),
        found_blocked_to_bound_ms,
        handovers: reclaims
            .iter()
            .filter_map(|r| r.record.as_ref().map(Handover::of))
            .collect(),
        api_writes: BTreeMap::new(),
    }
}
