//! What the fault tests (`fault_*.rs`) share beyond `common`: a borrowed node with a fake vLLM
//! on each borrower, the handover record of an owner, and what an operator process did by its
//! own account (metrics) and by the API's (the events it reported as its identity).

#![allow(dead_code)] // each fault test uses its own part of these helpers

use std::collections::HashMap;
use std::fmt::Write as _;

use gpuqueue_api::v1alpha1::{GpuQueue, HandoverRecord};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, describe_pod, fake_vllm_on,
    wait_for,
};
use gpuqueue_fake_vllm::{Config as VllmConfig, FakeVllm};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Client,
    api::{Api, ListParams, Patch, PatchParams},
};
use serde_json::json;

use crate::common::{Operator, free_port, install, queue_status};

/// The port the queues' checkpoint drivers call, and the fake vLLM listens on.
pub const VLLM_PORT: u16 = 8000;

/// A one-resource GpuQueue; a borrower queue (`checkpoint: Some(timeout)`) has its pods
/// checkpointed through vLLM's pause endpoint.
pub fn queue(
    name: &str,
    namespace: &str,
    guaranteed: u32,
    burstable: u32,
    checkpoint: Option<&str>,
) -> String {
    let mut yaml = format!(
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: {name}\nspec:\n  namespaces: [{namespace}]\n  resources:\n    - {{name: nvidia.com/gpu, guaranteed: {guaranteed}, burstable: {burstable}}}\n"
    );
    if let Some(timeout) = checkpoint {
        let _ = writeln!(
            yaml,
            "  reclaim: {{checkpoint: {{driver: vllm, port: {VLLM_PORT}, timeout: {timeout}}}}}"
        );
    }
    yaml
}

/// A control plane named `name` with one node of `gpus` GPUs and what `config/` ships installed,
/// its webhook pointed at the returned port.
pub async fn installed(name: &str, gpus: u32) -> (ControlPlane, u16) {
    let cluster = ControlPlane::start(
        ControlPlaneConfig::new(name).with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", gpus)]),
    )
    .await
    .unwrap();
    let port = free_port();
    install(&cluster, port).await;
    (cluster, port)
}

/// The test's clock, to compare with the API server's timestamps (one machine, one clock).
#[allow(clippy::disallowed_methods)]
pub fn now() -> Timestamp {
    Timestamp::now()
}

pub fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap()
}

pub fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap()
}

/// A fake vLLM (dev routes on) on each pod's IP, as the pod's own server would listen; by pod
/// name.
pub async fn fake_vllms(pods: &[Pod]) -> HashMap<String, FakeVllm> {
    let ips: Vec<Option<&str>> = pods
        .iter()
        .map(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_deref()))
        .collect();
    for (i, ip) in ips.iter().enumerate() {
        let twin = ip.and_then(|_| ips[..i].iter().position(|other| other == ip));
        assert!(
            twin.is_none(),
            "KWOK gave {} and {} the same IP {ip:?}",
            describe_pod(&pods[twin.unwrap_or_default()]),
            describe_pod(&pods[i])
        );
    }
    let mut servers = HashMap::new();
    for pod in pods {
        let config = VllmConfig {
            dev_mode: true,
            ..VllmConfig::default()
        };
        servers.insert(
            name(pod),
            fake_vllm_on(pod, VLLM_PORT, config).await.unwrap(),
        );
    }
    servers
}

/// Waits for the record of the handover to `owner` (`namespace/name`) in the owner queue's
/// status, once it has an outcome.
pub async fn handover_record(client: &Client, queue: &str, owner: &str) -> HandoverRecord {
    let find = |q: &GpuQueue| {
        q.status.as_ref().and_then(|s| {
            s.last_handovers
                .iter()
                .find(|r| r.role == "owner" && r.owner_pod == owner)
                .cloned()
        })
    };
    let found = queue_status(
        client,
        queue,
        &format!("a handover record for {owner}"),
        |q| find(q).is_some(),
    )
    .await;
    find(&found).unwrap()
}

pub fn phase_names(record: &HandoverRecord) -> Vec<&str> {
    record.phases.iter().map(|p| p.phase.as_str()).collect()
}

/// Waits until the pod is gone.
pub async fn gone(pods: &Api<Pod>, name: &str) {
    wait_for(
        format!("pod {name} to be gone"),
        DEFAULT_TIMEOUT,
        || async {
            match pods.get_opt(name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(pod) => Err(describe_pod(&pod)),
            }
        },
    )
    .await
    .unwrap();
}

/// The actions an operator counts (API writes that decide something, and checkpoint calls):
/// the sum of each family's series.
pub const ACTIONS: [&str; 5] = [
    "gpuqueue_admission_decisions_total",
    "gpuqueue_reclaims_started_total",
    "gpuqueue_checkpoints_total",
    "gpuqueue_evictions_total",
    "gpuqueue_quota_bypass_evictions_total",
];

/// What the operator counted of each of [`ACTIONS`].
pub async fn actions(operator: &Operator) -> Vec<(&'static str, f64)> {
    let text = operator.metrics().await;
    ACTIONS
        .iter()
        .map(|family| {
            let sum = text
                .lines()
                .filter(|line| {
                    line.strip_prefix(family)
                        .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                })
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            (*family, sum)
        })
        .collect()
}

/// The events of every namespace the operator reported as `identity`, with the last time
/// each was observed.
pub async fn events_reported_by(client: &Client, identity: &str) -> Vec<(Timestamp, Event)> {
    let events: Api<Event> = Api::all(client.clone());
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reporting_instance.as_deref() == Some(identity))
        .map(|e| {
            let last = [
                e.series
                    .as_ref()
                    .and_then(|s| s.last_observed_time.as_ref())
                    .map(|t| t.0),
                e.event_time.as_ref().map(|t| t.0),
                e.last_timestamp.as_ref().map(|t| t.0),
            ]
            .into_iter()
            .flatten()
            .max()
            .unwrap();
            (last, e)
        })
        .collect()
}

/// Points the pod webhook at another replica's port, as a Service would stop sending to a
/// replica whose readiness fails.
pub async fn point_webhook_at(client: &Client, port: u16) {
    let api: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
        Api::all(client.clone());
    let patch = json!([{"op": "replace", "path": "/webhooks/0/clientConfig/url",
                        "value": format!("https://127.0.0.1:{port}/mutate-pods")}]);
    api.patch(
        "gpuqueue-operator",
        &PatchParams::default(),
        &Patch::<()>::Json(serde_json::from_value(patch).unwrap()),
    )
    .await
    .unwrap();
}
