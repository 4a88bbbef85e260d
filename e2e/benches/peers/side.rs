//! One system under test on its own fresh cluster: gpuqueue (the operator's release build and
//! its webhook, as `config/` installs them) or Kueue (pod and Deployment integrations), with
//! the same tenants mapped to each (README, "How it maps to Volcano and Kueue"), a watch that
//! timestamps every pod, and the quota sampler.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, GpuNode, KUEUE_GATE, Kueue, KueueConfig, KueueTenant,
    NodeBehaviour, QUEUE_NAME_LABEL, QuotaSampler, TempNamespace, TenantQuota, gpu_pod, node_of,
    wait_for,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use tokio::time::Instant;

use super::common::{Operator, Options, apply_queue, free_port, install, is_gated};
use super::{GPUS_PER_NODE, Knobs, VICTIM_GRACE_SECONDS, WAIT};

/// The two systems measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum System {
    #[serde(rename = "gpuqueue")]
    Gpuqueue,
    #[serde(rename = "Kueue")]
    Kueue,
}

impl System {
    pub const BOTH: [Self; 2] = [Self::Gpuqueue, Self::Kueue];

    pub fn name(self) -> &'static str {
        match self {
            Self::Gpuqueue => "gpuqueue",
            Self::Kueue => "Kueue",
        }
    }
}

/// A tenant: its queue's name, guarantee and how far beyond it it may borrow.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: &'static str,
    pub guaranteed: usize,
    pub burstable: usize,
}

/// When the watch first saw each pod created, released (no admission gate of either system),
/// bound, and deleting (a deletion timestamp, or gone).
#[derive(Debug, Default, Clone, Copy)]
pub struct PodTimes {
    pub seen: Option<Instant>,
    pub released: Option<Instant>,
    pub bound: Option<Instant>,
    pub deleting: Option<Instant>,
}

/// Pod times by `namespace/name`.
pub type Timeline = Arc<Mutex<HashMap<String, PodTimes>>>;

/// A system on its cluster.
pub struct Side {
    pub system: System,
    pub cluster: ControlPlane,
    /// Tenant name → its namespace.
    pub namespaces: HashMap<&'static str, TempNamespace>,
    pub timeline: Timeline,
    pub sampler: Option<QuotaSampler>,
    pub operator: Option<Operator>,
    pub kueue: Option<Kueue>,
    watch: tokio::task::JoinHandle<()>,
}

impl Side {
    /// A fresh cluster of `nodes` nodes (KWOK's fast stages) running `system` with `tenants`.
    /// On fast nodes a deleted pod goes at once under both systems, so neither's handling of
    /// the grace period is measured; on kubelet-like nodes (`BENCH_NODE_BEHAVIOUR=kubelet`)
    /// every victim terminates within the same 1 s grace under both ([`tenant_pod`]).
    pub async fn start(
        system: System,
        scenario: &str,
        nodes: usize,
        tenants: &[Tenant],
        reclaim: &str,
        knobs: &Knobs,
    ) -> Self {
        let name = format!("bench_peers_{scenario}_{}", system.name().to_lowercase());
        let config = ControlPlaneConfig::new(name)
            .with_nodes(
                (0..nodes)
                    .map(|i| GpuNode::whole_gpus(format!("gpu-node-{i:03}"), 8))
                    .collect(),
            )
            .with_node_behaviour(if knobs.node_behaviour == "kubelet" {
                NodeBehaviour::default()
            } else {
                NodeBehaviour::Fast
            });
        let cluster = ControlPlane::start(config).await.unwrap();
        eprintln!(
            "{}: control plane up ({})",
            system.name(),
            cluster.startup_summary()
        );
        let client = cluster.client();
        let mut namespaces = HashMap::new();
        for tenant in tenants {
            namespaces.insert(tenant.name, cluster.namespace(tenant.name).await.unwrap());
        }
        let (mut operator, mut kueue) = (None, None);
        match system {
            System::Gpuqueue => {
                let webhook_port = free_port();
                install(&cluster, webhook_port).await;
                for tenant in tenants {
                    let namespace = namespaces[tenant.name].name();
                    apply_queue(&client, &gpu_queue(tenant, namespace, reclaim)).await;
                }
                operator = Some(start_operator(&cluster, webhook_port, knobs).await);
            }
            System::Kueue => {
                let started = Kueue::start(&cluster, &KueueConfig::default())
                    .await
                    .unwrap();
                let queues: Vec<KueueTenant> = tenants
                    .iter()
                    .map(|t| KueueTenant {
                        name: t.name.to_owned(),
                        namespace: namespaces[t.name].name().to_owned(),
                        nominal_quota: t.guaranteed,
                        borrowing_limit: t.burstable,
                    })
                    .collect();
                started.install_queues(&queues).await.unwrap();
                kueue = Some(started);
            }
        }
        let timeline = Timeline::default();
        let watch = follow(Api::all(client.clone()), timeline.clone()).await;
        let quotas = tenants
            .iter()
            .map(|t| TenantQuota {
                name: t.name.to_owned(),
                namespace: namespaces[t.name].name().to_owned(),
                guarantee: t.guaranteed as u64,
                ceiling: (t.guaranteed + t.burstable) as u64,
            })
            .collect();
        let sampler = Some(QuotaSampler::start(&client, quotas, super::BUDGET));
        Self {
            system,
            cluster,
            namespaces,
            timeline,
            sampler,
            operator,
            kueue,
            watch,
        }
    }

    /// Sets how gpuqueue reclaims from `tenant` (its queue's `spec.reclaim`).
    pub async fn set_reclaim(&self, tenant: &Tenant, reclaim: &str) {
        let yaml = gpu_queue(tenant, self.namespace(tenant.name), reclaim);
        apply_queue(&self.cluster.client(), &yaml).await;
    }

    pub fn pods(&self, tenant: &str) -> Api<Pod> {
        Api::namespaced(self.cluster.client(), self.namespaces[tenant].name())
    }

    pub fn namespace(&self, tenant: &str) -> &str {
        self.namespaces[tenant].name()
    }

    /// Creates a one-GPU pod of `tenant` (labelled with its Kueue LocalQueue, which gpuqueue
    /// ignores).
    pub async fn create_pod(&self, tenant: &str, name: &str) {
        self.pods(tenant)
            .create(&PostParams::default(), &tenant_pod(tenant, name))
            .await
            .unwrap();
    }

    /// The pod's times so far.
    pub fn times(&self, tenant: &str, name: &str) -> PodTimes {
        let key = format!("{}/{name}", self.namespace(tenant));
        self.timeline
            .lock()
            .unwrap()
            .get(&key)
            .copied()
            .unwrap_or_default()
    }

    /// Every pod of `tenant`'s namespace with its times.
    pub fn tenant_times(&self, tenant: &str) -> Vec<(String, PodTimes)> {
        let prefix = format!("{}/", self.namespace(tenant));
        self.timeline
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(key, times)| Some((key.strip_prefix(&prefix)?.to_owned(), *times)))
            .collect()
    }

    /// Pods of `tenant` first seen deleting at or after `since`.
    pub fn deleted_since(&self, tenant: &str, since: Instant) -> usize {
        self.tenant_times(tenant)
            .iter()
            .filter(|(_, t)| t.deleting.is_some_and(|d| d >= since))
            .count()
    }

    /// Waits until the watch has seen the pod bound; returns when.
    pub async fn bound_at(&self, tenant: &str, name: &str) -> Instant {
        let began = Instant::now();
        loop {
            if let Some(bound) = self.times(tenant, name).bound {
                return bound;
            }
            assert!(
                began.elapsed() < WAIT,
                "{}: pod {tenant}/{name} not bound within {WAIT:?}",
                self.system.name()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the sampler and the system (Kueue's webhooks first), then the cluster.
    pub async fn stop(mut self) -> gpuqueue_e2e::QuotaReport {
        let report = match self.sampler.take() {
            Some(sampler) => sampler.finish().await,
            None => gpuqueue_e2e::QuotaReport::default(),
        };
        self.watch.abort();
        if let Some(kueue) = self.kueue.take() {
            kueue.stop().await;
        }
        drop(self.operator.take());
        self.cluster.stop();
        report
    }
}

/// A one-GPU pod of `tenant`, labelled with its Kueue LocalQueue. Its grace period is
/// gpuqueue's `victimGracePeriodSeconds` in the benchmark, so that a victim Kueue deletes
/// (with the pod's own grace) and one gpuqueue evicts are given the same time to exit.
pub fn tenant_pod(tenant: &str, name: &str) -> Pod {
    let mut pod = gpu_pod(name, NVIDIA_GPU, 1);
    if let Some(spec) = pod.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(VICTIM_GRACE_SECONDS);
    }
    pod.metadata
        .labels
        .get_or_insert_default()
        .insert(QUEUE_NAME_LABEL.to_owned(), tenant.to_owned());
    pod
}

/// The tenant as a GpuQueue.
fn gpu_queue(tenant: &Tenant, namespace: &str, reclaim: &str) -> String {
    format!(
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: {}\nspec:\n  namespaces: [{namespace}]\n  resources:\n    - {{name: nvidia.com/gpu, guaranteed: {}, burstable: {}}}\n  reclaim: {reclaim}\n",
        tenant.name, tenant.guaranteed, tenant.burstable
    )
}

/// The release build (or the debug one for a smoke run), leading before anything is measured.
async fn start_operator(cluster: &ControlPlane, webhook_port: u16, knobs: &Knobs) -> Operator {
    let mut options = Options::new("bench", webhook_port);
    options.release = knobs.operator_build == "release";
    "info".clone_into(&mut options.log_filter);
    let operator = Operator::start(cluster, options).await;
    wait_for("the operator to lead", Duration::from_mins(1), || async {
        if operator.is_leader().await {
            Ok(())
        } else {
            Err("not the leader yet".to_owned())
        }
    })
    .await
    .unwrap();
    operator
}

/// Follows every pod, recording when each was first seen, released, bound and deleting.
/// Returns once the initial list is in.
async fn follow(pods: Api<Pod>, timeline: Timeline) -> tokio::task::JoinHandle<()> {
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let watch = tokio::spawn(async move {
        let mut listed_tx = Some(listed_tx);
        let mut events = watcher(pods, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let (pod, deleted) = match event {
                Ok(watcher::Event::InitDone) => {
                    if let Some(listed) = listed_tx.take() {
                        let _ = listed.send(());
                    }
                    continue;
                }
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => (pod, false),
                Ok(watcher::Event::Delete(pod)) => (pod, true),
                Ok(watcher::Event::Init) => continue,
                Err(error) => {
                    eprintln!("watch: {error}; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            record(&timeline, &pod, deleted, Instant::now());
        }
    });
    listed.await.unwrap();
    watch
}

fn record(timeline: &Timeline, pod: &Pod, deleted: bool, now: Instant) {
    let key = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let mut timeline = timeline.lock().unwrap();
    let times = timeline.entry(key).or_default();
    times.seen.get_or_insert(now);
    let kueue_gated = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|g| g.name == KUEUE_GATE));
    if !is_gated(pod) && !kueue_gated {
        times.released.get_or_insert(now);
    }
    if node_of(pod).is_some() {
        times.bound.get_or_insert(now);
    }
    if deleted || pod.metadata.deletion_timestamp.is_some() {
        times.deleting.get_or_insert(now);
    }
}

/// Waits until `count` live pods of `tenant` are bound, creating pods named `prefix-N` as
/// needed (the next N from `next`).
pub async fn fill(side: &Side, tenant: &str, count: usize, prefix: &str, next: &mut usize) {
    loop {
        let list = side
            .pods(tenant)
            .list(&ListParams::default())
            .await
            .unwrap();
        let live: Vec<&Pod> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let bound = live.iter().filter(|p| node_of(p).is_some()).count();
        if bound >= count {
            return;
        }
        for _ in live.len()..count {
            side.create_pod(tenant, &format!("{prefix}-{:05}", *next))
                .await;
            *next += 1;
        }
        wait_for(
            format!("{}: {count} pods of {tenant} bound", side.system.name()),
            WAIT,
            || async {
                let list = side
                    .pods(tenant)
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let bound = list
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| node_of(p).is_some())
                    .count();
                if bound >= count {
                    Ok(())
                } else {
                    Err(format!("{bound} bound"))
                }
            },
        )
        .await
        .unwrap();
    }
}

/// The GPUs of a cluster of `nodes` nodes.
pub fn gpus(nodes: usize) -> usize {
    nodes * GPUS_PER_NODE
}
