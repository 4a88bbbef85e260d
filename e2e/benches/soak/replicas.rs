//! The two operator replicas: which one leads (the Lease's holder), killing, pausing and
//! restarting them, and their resident memory over time.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio::time::Instant;

use super::common::{OPERATOR_NAMESPACE, Operator, Options, free_port};
use gpuqueue_e2e::ControlPlane;

/// The Lease the replicas elect a leader with (the operator's default `--lease-name`).
const LEASE: &str = "gpuqueue-operator";

/// One RSS sample of one replica.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RssSample {
    pub at_s: f64,
    pub replica: String,
    pub rss_mib: f64,
}

pub struct Replicas {
    pub operators: Vec<Operator>,
    options: Vec<Options>,
    pub restarts: usize,
    /// Replicas found exited that the soak did not kill.
    pub unexpected_exits: Vec<String>,
    pub rss: Vec<RssSample>,
    started: Instant,
}

impl Replicas {
    /// Starts replica `a` on the webhook port the configuration calls and `b` on its own.
    pub async fn start(cluster: &ControlPlane, webhook_port: u16, release: bool) -> Self {
        let mut options = vec![
            Options::new("a", webhook_port),
            Options::new("b", free_port()),
        ];
        for o in &mut options {
            o.release = release;
            "info,gpuqueue_operator=debug,kube_runtime=debug".clone_into(&mut o.log_filter);
        }
        let mut operators = Vec::new();
        for o in &options {
            operators.push(Operator::start(cluster, o.clone()).await);
        }
        Self {
            operators,
            options,
            restarts: 0,
            unexpected_exits: Vec::new(),
            rss: Vec::new(),
            started: Instant::now(),
        }
    }

    /// The identity holding the Lease, if it can be read now.
    pub async fn holder(cluster: &ControlPlane) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(cluster.client(), OPERATOR_NAMESPACE);
        let lease = tokio::time::timeout(Duration::from_secs(3), leases.get(LEASE))
            .await
            .ok()?
            .ok()?;
        lease.spec?.holder_identity
    }

    /// Waits (up to `patience`) for a holder that is not `not`, and returns it.
    pub async fn new_holder(
        cluster: &ControlPlane,
        not: Option<&str>,
        patience: Duration,
    ) -> Option<String> {
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if let Some(holder) = Self::holder(cluster).await
                && Some(holder.as_str()) != not
            {
                return Some(holder);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    pub fn index_of(&self, identity: &str) -> Option<usize> {
        self.operators.iter().position(|o| o.identity == identity)
    }

    /// SIGKILL, then a new replica in its place under a new identity, as a Deployment's new
    /// pod would be: it lists everything afresh and must win the Lease like any other.
    pub async fn kill_and_restart(&mut self, cluster: &ControlPlane, index: usize) {
        self.operators[index].process.kill();
        self.restarts += 1;
        let base = self.options[index]
            .identity
            .split('-')
            .next()
            .unwrap_or("x")
            .to_owned();
        self.options[index].identity = format!("{base}-{}", self.restarts);
        self.operators[index] = Operator::start(cluster, self.options[index].clone()).await;
    }

    /// Restarts any replica that exited on its own, noting it.
    pub async fn revive(&mut self, cluster: &ControlPlane) {
        for index in 0..self.operators.len() {
            if self.operators[index].process.ensure_running().is_err() {
                let identity = self.operators[index].identity.clone();
                let tail = self.operators[index].process.log_tail(5);
                self.unexpected_exits.push(format!("{identity}: {tail}"));
                self.operators[index] = Operator::start(cluster, self.options[index].clone()).await;
                self.restarts += 1;
            }
        }
    }

    /// Records each replica's resident memory now.
    pub fn sample_rss(&mut self) {
        let at_s = self.started.elapsed().as_secs_f64();
        for operator in &self.operators {
            let status =
                std::fs::read_to_string(format!("/proc/{}/status", operator.process.pid()))
                    .unwrap_or_default();
            let kib: f64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0.0);
            self.rss.push(RssSample {
                at_s,
                replica: operator.identity.clone(),
                rss_mib: kib / 1024.0,
            });
        }
    }
}
