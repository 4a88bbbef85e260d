//! The running checker: watches of pods, GpuQueues and nodes (reflector stores that re-watch
//! and relist by themselves through API-server and etcd restarts), the audit log read from
//! where it stopped (every [`SAMPLE_INTERVAL`]), and one sample of [`Rules`] after the stores
//! applied a change (changes that arrive while a sample runs are taken in by the next) and
//! every [`SAMPLE_INTERVAL`] meanwhile. Sampling every 100 ms alone could merge two short
//! deficits with a recovery between them into one long one, as it did in `QuotaSampler`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use gpuqueue_api::v1alpha1::GpuQueue;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::sync::Notify;

use super::audit::AuditTail;
use super::quota::SAMPLE_INTERVAL;
use super::rules::{Allowances, CheckpointCall, InvariantViolation, Rules, Tally};
use super::world::{NodeView, PodView, QueueView, World};

/// What to check and how much slack the liveness rules get.
#[derive(Debug, Clone)]
pub struct CheckerConfig {
    /// kube-apiserver's audit log ([`crate::ControlPlane::audit_log_path`]); without it,
    /// evictions are not checked.
    pub audit_log: Option<PathBuf>,
    /// The user whose evictions and deletions count: the operator's service account
    /// (`system:serviceaccount:<namespace>:<name>`).
    pub operator_user: String,
    pub allowances: Allowances,
}

/// Everything the checker found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct InvariantReport {
    pub violations: Vec<InvariantViolation>,
    #[serde(flatten)]
    pub tally: Tally,
}

/// A running checker; [`InvariantChecker::finish`] stops it.
#[derive(Debug)]
pub struct InvariantChecker {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Rules>,
    excused_until_ms: Arc<AtomicU64>,
    violations: Arc<AtomicUsize>,
}

impl InvariantChecker {
    /// Starts the watches; samples once all three stores have listed.
    pub fn start(client: &Client, config: CheckerConfig) -> Self {
        let changed = Arc::new(Notify::new());
        let (pods, pod_watch) = reflect::<Pod>(client, Some(changed.clone()));
        let (queues, queue_watch) = reflect::<GpuQueue>(client, Some(changed.clone()));
        let (nodes, node_watch) = reflect::<Node>(client, Some(changed.clone()));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let excused_until_ms = Arc::new(AtomicU64::new(0));
        let violations = Arc::new(AtomicUsize::new(0));
        let (excused, found) = (excused_until_ms.clone(), violations.clone());
        let task = tokio::spawn(async move {
            let _ = tokio::join!(
                pods.wait_until_ready(),
                queues.wait_until_ready(),
                nodes.wait_until_ready()
            );
            let mut rules = Rules::new(config.allowances);
            let mut audit = config
                .audit_log
                .map(|path| AuditTail::new(path, config.operator_user));
            let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
            loop {
                // The audit log is a file opened per read: read on the ticks, as before,
                // not on every watch event.
                let tick = tokio::select! {
                    _ = ticks.tick() => true,
                    () = changed.notified() => false,
                    _ = stopped.changed() => break,
                };
                let now = wall_clock_ms();
                let world = World {
                    pods: pods.state().iter().map(|p| PodView::of(p)).collect(),
                    queues: queues.state().iter().map(|q| QueueView::of(q)).collect(),
                    nodes: nodes.state().iter().map(|n| NodeView::of(n)).collect(),
                };
                rules.sample(now, now <= excused.load(Ordering::SeqCst), &world);
                if tick {
                    for eviction in audit.as_mut().map(AuditTail::read).unwrap_or_default() {
                        rules.evicted(&eviction, &world);
                    }
                }
                found.store(rules.violations().len(), Ordering::SeqCst);
            }
            for watch in [pod_watch, queue_watch, node_watch] {
                watch.abort();
            }
            rules
        });
        Self {
            stop,
            task,
            excused_until_ms,
            violations,
        }
    }

    /// A fault begins: liveness rules stop counting time until [`Self::excuse_for`].
    pub fn excuse_until_further_notice(&self) {
        self.excused_until_ms.store(u64::MAX, Ordering::SeqCst);
    }

    /// The fault is over: liveness rules count again after `settle` (for the system to notice
    /// and catch up: a lease to expire, a handover to resume).
    pub fn excuse_for(&self, settle: Duration) {
        let until = wall_clock_ms() + super::world::millis(settle);
        self.excused_until_ms.store(until, Ordering::SeqCst);
    }

    /// Violations found so far.
    pub fn violations_so_far(&self) -> usize {
        self.violations.load(Ordering::SeqCst)
    }

    /// Stops sampling, checks `checkpoint_calls` (what the fake vLLM servers logged; a call
    /// belongs to the reclaim its pod was seen with within `lag`) and reports.
    pub async fn finish(
        self,
        checkpoint_calls: &[CheckpointCall],
        lag: Duration,
    ) -> InvariantReport {
        let _ = self.stop.send(true);
        let Ok(mut rules) = self.task.await else {
            return InvariantReport::default();
        };
        rules.checkpoints(checkpoint_calls, lag);
        let (violations, tally) = rules.finish();
        InvariantReport { violations, tally }
    }
}

/// A reflector store of every `K` in the cluster and the task feeding it, which notifies
/// `changed` (if given) each time the store has applied an event.
pub fn reflect<K>(
    client: &Client,
    changed: Option<Arc<Notify>>,
) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let api: Api<K> = Api::all(client.clone());
    let task = tokio::spawn(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .for_each(move |_| {
                if let Some(changed) = &changed {
                    changed.notify_one();
                }
                std::future::ready(())
            }),
    );
    (reader, task)
}

/// Milliseconds since the Unix epoch: the clock the operator's deadlines, the audit log and
/// the fake servers' call logs use (one machine).
#[allow(clippy::disallowed_methods)] // the harness observes from outside; it has no clock passed in
pub fn wall_clock_ms() -> u64 {
    u64::try_from(k8s_openapi::jiff::Timestamp::now().as_millisecond()).unwrap_or(0)
}
