//! The tenants' demand, from the scenario (`e2e/soak/scenario.yaml`, the simulator's format)
//! with a day compressed into `day`: online tenants as Deployments scaled along the daily
//! cosine, batch tenants as bare pods arriving as a Poisson process and deleted by their tenant
//! when their drawn run time is over (churn). Requests refused while the API server restarts
//! are counted and retried at the next step.

use std::collections::BTreeMap;
use std::time::Duration;

use gpuqueue_e2e::apply_yaml;
use gpuqueue_sim::scenario::{DurationModel, Scenario, TenantSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use tokio::time::Instant;

use super::VLLM_PORT;

/// What the load did, for the report.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LoadTally {
    pub online_scalings: usize,
    pub batch_pods_created: usize,
    pub batch_pods_deleted_by_tenant: usize,
    /// Requests that failed (the API server restarting); retried at the next step.
    pub requests_failed: usize,
}

/// A tenant's queue, in GpuQueue YAML: batch tenants checkpoint through the vLLM driver.
pub fn queue_yaml(tenant: &TenantSpec, namespace: &str) -> String {
    let budget: Duration = tenant.reclaim.budget.into();
    let timeout: Duration = tenant.reclaim.checkpoint_timeout.into();
    let checkpoint = if tenant.batch.is_some() {
        format!(
            "    checkpoint: {{driver: vllm, port: {VLLM_PORT}, timeout: {}ms}}\n",
            timeout.as_millis()
        )
    } else {
        String::new()
    };
    format!(
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: {name}\nspec:\n  \
         namespaces: [{namespace}]\n  resources:\n    - name: nvidia.com/gpu\n      \
         guaranteed: {g}\n      burstable: {b}\n  reclaim:\n    budget: {budget}ms\n    \
         victimGracePeriodSeconds: {grace}\n{checkpoint}",
        name = tenant.name,
        g = tenant.guaranteed,
        b = tenant.burstable,
        budget = budget.as_millis(),
        grace = tenant.reclaim.victim_grace_period_seconds,
    )
}

fn deployment(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  \
         selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    \
         spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n        - name: server\n          \
         image: vllm/vllm-openai:v0.11.0\n          resources:\n            limits: {{nvidia.com/gpu: 1}}\n"
    )
}

fn batch_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "batch"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.11.0",
                "ports": [{"containerPort": VLLM_PORT}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }],
        },
    }))
    .expect("a valid pod")
}

/// One tenant and its namespace.
pub struct Tenant {
    pub spec: TenantSpec,
    pub namespace: String,
}

/// Drives every tenant's demand until stopped.
pub struct Load {
    client: Client,
    tenants: Vec<Tenant>,
    day: Duration,
    started: Instant,
    rng: ChaCha8Rng,
    next_arrival: BTreeMap<usize, Instant>,
    /// Batch pods to delete when their run time is over: (when, namespace, name).
    ends: Vec<(Instant, String, String)>,
    next_scale: Instant,
    serial: usize,
    pub tally: LoadTally,
}

impl Load {
    pub fn new(
        client: Client,
        scenario: &Scenario,
        tenants: Vec<Tenant>,
        day: Duration,
        seed: u64,
    ) -> Self {
        let _ = scenario;
        let now = Instant::now();
        Self {
            client,
            tenants,
            day,
            started: now,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed),
            next_arrival: BTreeMap::new(),
            ends: Vec::new(),
            next_scale: now,
            serial: 0,
            tally: LoadTally::default(),
        }
    }

    /// Simulated hours in one real second.
    fn hours_per_second(&self) -> f64 {
        24.0 / self.day.as_secs_f64()
    }

    /// The hour of the simulated day now.
    fn hour(&self) -> f64 {
        (self.started.elapsed().as_secs_f64() * self.hours_per_second()) % 24.0
    }

    /// Creates the online Deployments at their current target, then runs in its own task
    /// (through every fault) until `stop`; returns what it did.
    pub fn spawn(
        mut self,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<LoadTally> {
        tokio::spawn(async move {
            self.scale_online(true).await;
            while !*stop.borrow() {
                self.step().await;
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = stop.changed() => {}
                }
            }
            self.tally
        })
    }

    /// One step: scale online tenants when due, start arrived batch pods, end finished ones.
    async fn step(&mut self) {
        let now = Instant::now();
        if now >= self.next_scale {
            self.scale_online(false).await;
            // Every simulated half hour, and at least 5 s apart: a Deployment's rollout.
            let step = Duration::from_secs_f64((0.5 / self.hours_per_second()).max(5.0));
            self.next_scale = now + step;
        }
        for index in 0..self.tenants.len() {
            let Some(batch) = self.tenants[index].spec.batch.clone() else {
                continue;
            };
            let rate = batch.jobs_per_hour * self.hours_per_second();
            // Every arrival that is due, however late the step (a busy API server).
            loop {
                let due = *self.next_arrival.entry(index).or_insert(now);
                if now < due {
                    break;
                }
                let gap = -self.rng.random_range(f64::EPSILON..1.0).ln() / rate;
                self.next_arrival
                    .insert(index, due + Duration::from_secs_f64(gap));
                let run = self.run_time(&batch.duration);
                self.create_batch(index, run).await;
            }
        }
        let (over, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ends)
            .into_iter()
            .partition(|(end, ..)| *end <= now);
        self.ends = kept;
        for (_, namespace, name) in over {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
            match pods.delete(&name, &DeleteParams::default()).await {
                Ok(_) => self.tally.batch_pods_deleted_by_tenant += 1,
                Err(kube::Error::Api(status)) if status.code == 404 => {} // evicted meanwhile
                Err(_) => {
                    self.tally.requests_failed += 1;
                    self.ends
                        .push((now + Duration::from_secs(1), namespace, name));
                }
            }
        }
    }

    /// A run time drawn from the model, compressed like the day.
    fn run_time(&mut self, model: &DurationModel) -> Duration {
        let hours =
            |d: &gpuqueue_api::duration::GoDuration| Duration::from(*d).as_secs_f64() / 3600.0;
        let sim_hours = match model {
            DurationModel::Fixed(d) => hours(d),
            DurationModel::LogNormal { median, p90 } => {
                let (median, p90) = (hours(median), hours(p90));
                let sigma = (p90 / median).ln() / 1.281_551_6;
                // Box-Muller: one standard normal draw.
                let (radius, angle): (f64, f64) = (
                    self.rng.random_range(f64::EPSILON..1.0),
                    self.rng.random_range(0.0..1.0),
                );
                let normal = (-2.0 * radius.ln()).sqrt() * (std::f64::consts::TAU * angle).cos();
                median * (sigma * normal).exp()
            }
            DurationModel::Trace { min, .. } => hours(min),
        };
        Duration::from_secs_f64((sim_hours / self.hours_per_second()).max(1.0))
    }

    async fn create_batch(&mut self, index: usize, run: Duration) {
        self.serial += 1;
        let tenant = &self.tenants[index];
        let name = format!("{}-{}", tenant.spec.name, self.serial);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &tenant.namespace);
        match pods.create(&PostParams::default(), &batch_pod(&name)).await {
            Ok(_) => {
                self.tally.batch_pods_created += 1;
                self.ends
                    .push((Instant::now() + run, tenant.namespace.clone(), name));
            }
            Err(_) => self.tally.requests_failed += 1,
        }
    }

    async fn scale_online(&mut self, create: bool) {
        let hour = self.hour();
        for index in 0..self.tenants.len() {
            let Some(online) = self.tenants[index].spec.online.clone() else {
                continue;
            };
            let phase = std::f64::consts::TAU * (hour - online.peak_hour) / 24.0;
            let level = f64::midpoint(1.0, phase.cos());
            let jitter = 1.0 + online.jitter * self.rng.random_range(-1.0..1.0);
            let (peak, trough) = (
                f64::from(online.peak_replicas),
                f64::from(online.trough_replicas),
            );
            let target = ((trough + (peak - trough) * level) * jitter)
                .round()
                .clamp(0.0, peak);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            // clamped to 0..=peak
            let replicas = target as u32;
            let tenant = &self.tenants[index];
            let result = if create {
                apply_yaml(
                    &self.client,
                    &deployment(&tenant.spec.name, replicas),
                    Some(&tenant.namespace),
                )
                .await
                .map(drop)
                .map_err(|e| e.to_string())
            } else {
                let deployments: Api<Deployment> =
                    Api::namespaced(self.client.clone(), &tenant.namespace);
                deployments
                    .patch(
                        &tenant.spec.name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"replicas": replicas}})),
                    )
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            };
            match result {
                Ok(()) => self.tally.online_scalings += 1,
                Err(_) => self.tally.requests_failed += 1,
            }
        }
    }
}
