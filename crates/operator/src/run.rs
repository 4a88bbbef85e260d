//! The wiring: what runs in every replica, and what runs only in the leader.
//!
//! ```text
//! every replica                          the leader only (per term)
//! ─────────────                          ──────────────────────────
//! watches → stores ──────────────────▶  admission loop: decide, release gates, record
//! /metrics /healthz /readyz              waits, write queue status, publish events;
//!                                        reclaims: checkpoint, evict, hand over
//! webhook (after the stores synced) ◀──  its live snapshot: admit at creation
//! leader election
//! ```
//!
//! SIGTERM or SIGINT stops everything: the leader's work is aborted, the Lease is released
//! so a standby takes over at once, and the servers stop accepting connections.

use std::{sync::Arc, time::Duration};

use gpuqueue_api::v1alpha1::GpuQueue;
use kube::{
    Api, Client, Config,
    api::ListParams,
    config::{KubeConfigOptions, Kubeconfig},
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use gpuqueue_core::model::is_gpu_pod;
use prometheus_client::registry::Registry;

use crate::{
    Args,
    admission::{
        self, Context,
        at_creation::AtCreation,
        metrics::{AdmissionMetrics, FragmentationGauges, QueueGauges},
    },
    checkpoint::CheckpointClient,
    clock,
    cluster::{debounce::Debounce, metrics::WatchMetrics, stores::Stores},
    http::{self, Readiness},
    leader::{self, LeaderConfig, LeaderMetrics},
    metrics,
    reclaim::{self, CrashPoint, ReclaimMetrics, Reclaimer},
    seal::Seals,
    telemetry,
    webhook::{
        self, WebhookConfig,
        certs::RotationPolicy,
        metrics::WebhookMetrics,
        policy::StoreGatePolicy,
        server::{ClientAuth, ClientCaError},
    },
    writes::events::Events,
};

/// Why the operator stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Telemetry(#[from] telemetry::TelemetryError),
    #[error("reading the kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("finding the API server: {0}")]
    InferConfig(#[from] kube::config::InferConfigError),
    #[error("creating the API client: {0}")]
    Client(#[source] kube::Error),
    #[error(
        "the GpuQueue API is not served ({0}); install the CRD first: kubectl apply --server-side -k config/"
    )]
    CrdMissing(#[source] kube::Error),
    #[error("serving /metrics, /healthz and /readyz: {0}")]
    Http(#[source] std::io::Error),
    #[error(transparent)]
    Webhook(#[from] webhook::WebhookError),
    #[error(transparent)]
    ClientCa(#[from] ClientCaError),
    #[error(transparent)]
    Leader(#[from] leader::LeaderError),
    #[error("creating the checkpoint HTTP client: {0}")]
    CheckpointClient(#[source] reqwest::Error),
    #[error(transparent)]
    CrashPoint(#[from] reclaim::BadCrashPoint),
    #[error("the {task} task stopped: {source}")]
    Task {
        task: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl RunError {
    /// The error's kind, for logs and metrics (snake case).
    pub fn category(&self) -> &'static str {
        match self {
            Self::Telemetry(_) => "telemetry",
            Self::Kubeconfig(_) => "kubeconfig",
            Self::InferConfig(_) => "infer_config",
            Self::Client(_) => "client",
            Self::CrdMissing(_) => "crd_missing",
            Self::Http(_) => "http",
            Self::Webhook(error) => error.category(),
            Self::ClientCa(_) => "client_ca",
            Self::Leader(_) => "leader",
            Self::CheckpointClient(_) => "checkpoint_client",
            Self::CrashPoint(_) => "crash_point",
            Self::Task { .. } => "task",
        }
    }
}

/// Every component's metrics, registered here at the wiring and handed to each component.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub admission: AdmissionMetrics,
    pub queues: QueueGauges,
    pub fragmentation: FragmentationGauges,
    pub webhook: WebhookMetrics,
    pub watches: WatchMetrics,
    pub leader: LeaderMetrics,
    pub reclaim: ReclaimMetrics,
}

impl Metrics {
    /// Registers every component's metrics (in this order, which is the order of `/metrics`).
    pub fn register(registry: &mut Registry) -> Self {
        Self {
            admission: AdmissionMetrics::register(registry),
            queues: QueueGauges::register(registry),
            fragmentation: FragmentationGauges::register(registry),
            webhook: WebhookMetrics::register(registry),
            watches: WatchMetrics::register(registry),
            leader: LeaderMetrics::register(registry),
            reclaim: ReclaimMetrics::register(registry),
        }
    }
}

/// Runs the operator until SIGTERM or SIGINT.
pub async fn run(args: Args) -> Result<(), RunError> {
    telemetry::init(&args.log)?;
    let crash = CrashPoint::from_env()?;
    let clients = Clients::connect(&args).await?;
    let client = clients.api.clone();

    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let identity = identity(&args);
    tracing::info!(%identity, namespace = %args.namespace, "starting");
    let webhook_config = webhook_config(&args, &identity)?;

    let mut registry = metrics::registry();
    let metrics = Metrics::register(&mut registry);
    let readiness = Readiness::default();
    let drained = drain_after(&shutdown, args.webhook.webhook_drain, &readiness);
    let (stores, watches) = Stores::new(&client, Arc::new(is_gpu_pod), &metrics.watches);
    tokio::spawn(watches.run());
    let http = tokio::spawn(http::serve(
        args.http.metrics_addr,
        Arc::new(registry),
        readiness.clone(),
        drained.clone(),
    ));

    let seals = Seals::default();
    let at_creation = at_creation(&args, &seals);
    // The webhook answers from the stores, so it starts once they hold their initial lists.
    tokio::select! {
        synced = stores.synced() => if synced.is_ok() {
            readiness.set_stores_synced();
            tracing::info!(?stores, "stores synced");
        },
        () = shutdown.cancelled() => return Ok(()),
    }
    let policy = StoreGatePolicy::new(
        stores.clone(),
        at_creation.clone(),
        metrics.admission.clone(),
    );
    let webhook = tokio::spawn(webhook::run(
        webhook_config,
        client.clone(),
        Arc::new(policy),
        metrics.webhook.clone(),
        readiness.clone(),
        drained.clone(),
    ));

    let (leadership, election) = leader::elect(
        client,
        lease_config(&args, &identity),
        metrics.leader.clone(),
        shutdown.clone(),
        creates_landed(stores.clone(), at_creation.clone()),
    )
    .await?;
    let context = admission_context(
        &args,
        &identity,
        clients,
        stores,
        metrics,
        (at_creation, seals),
        crash,
    );
    let leading = leader::run_while_leader(leadership, shutdown.clone(), move |term| {
        admission::run(context.clone(), term)
    });

    let servers = Servers {
        http,
        webhook,
        drained,
    };
    let result = servers.run_with(leading, &shutdown, election).await;
    tracing::info!("stopped");
    result
}

/// What serves whether this replica leads or not: `/metrics` and `/readyz`, and the webhook,
/// both until `drained`.
struct Servers {
    http: JoinHandle<std::io::Result<()>>,
    webhook: JoinHandle<Result<(), webhook::WebhookError>>,
    drained: CancellationToken,
}

impl Servers {
    /// Runs until shutdown, or until a server fails (then everything stops). Waits for the
    /// Lease to be released (`election`), then, after a signal, for the webhook's drain and
    /// the requests it has in flight.
    async fn run_with(
        mut self,
        leading: impl Future<Output = ()>,
        shutdown: &CancellationToken,
        election: JoinHandle<()>,
    ) -> Result<(), RunError> {
        // A task that ended is not awaited again (its handle would panic).
        let (mut http_ended, mut webhook_ended) = (false, false);
        let result = tokio::select! {
            () = leading => Ok(()),
            served = &mut self.http => {
                http_ended = true;
                flatten(served, "http", RunError::Http)
            }
            served = &mut self.webhook => {
                webhook_ended = true;
                flatten(served, "webhook", RunError::Webhook)
            }
        };
        shutdown.cancel();
        let _ = election.await;
        if result.is_ok() {
            if !webhook_ended {
                let _ = self.webhook.await;
            }
            self.drained.cancel();
            if !http_ended {
                let _ = self.http.await;
            }
        }
        result
    }
}

/// A token cancelled `period` after `shutdown`: the webhook and `/readyz` serve until then,
/// the process marked not ready from `shutdown` on.
fn drain_after(
    shutdown: &CancellationToken,
    period: Duration,
    readiness: &Readiness,
) -> CancellationToken {
    let drained = CancellationToken::new();
    let (shutdown, readiness, done) = (shutdown.clone(), readiness.clone(), drained.clone());
    tokio::spawn(async move {
        shutdown.cancelled().await;
        readiness.set_stopping();
        if !period.is_zero() {
            tracing::info!(?period, "the webhook answers for its drain period");
        }
        tokio::time::sleep(period).await;
        done.cancel();
    });
    drained
}

/// Resolves once every pod this process admitted at its creation has reached the store, or
/// its reservation expired: a leader stepping down releases its lease only then.
async fn creates_landed(stores: Stores, at_creation: AtCreation) {
    while at_creation.awaits_pods(&stores.pods.state(), clock::now()) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The API clients the operator uses.
struct Clients {
    /// For the watches, the admission loop, the webhook and the Lease.
    api: Client,
    /// For the reclaim executor: without kube's default retries.
    reclaim: Client,
    checkpoints: CheckpointClient,
}

impl Clients {
    /// Creates the clients and checks that the GpuQueue API is served.
    async fn connect(args: &Args) -> Result<Self, RunError> {
        let config = config(args).await?;
        let api = Client::try_from(config.clone()).map_err(RunError::Client)?;
        // The reclaim executor handles every answer itself under the handover's deadline;
        // kube's default retries (429 for minutes) would hide a PodDisruptionBudget's refusal.
        let mut reclaim_config = config;
        reclaim_config.default_retry = false;
        let reclaim = Client::try_from(reclaim_config).map_err(RunError::Client)?;
        let checkpoints = CheckpointClient::new().map_err(RunError::CheckpointClient)?;
        // controller-rs's start-up check: a missing CRD is a clear error, not a watch retrying.
        Api::<GpuQueue>::all(api.clone())
            .list(&ListParams::default().limit(1))
            .await
            .map_err(RunError::CrdMissing)?;
        Ok(Self {
            api,
            reclaim,
            checkpoints,
        })
    }
}

/// What the leader's admission loop needs, with the event publisher it sends through (started
/// here, on every replica, so that it is ready when this replica leads).
fn admission_context(
    args: &Args,
    identity: &str,
    clients: Clients,
    stores: Stores,
    metrics: Metrics,
    (at_creation, seals): (AtCreation, Seals),
    crash: Option<CrashPoint>,
) -> Context {
    let (events, publisher) = Events::new(clients.api.clone(), identity);
    tokio::spawn(publisher.run());
    let reclaimer = Reclaimer::new(
        clients.reclaim,
        clients.checkpoints,
        stores.clone(),
        metrics.reclaim,
        events.clone(),
        seals.clone(),
        crash,
    );
    Context {
        client: clients.api,
        stores,
        metrics: metrics.admission,
        queue_gauges: metrics.queues,
        fragmentation_gauges: metrics.fragmentation,
        events,
        reclaimer,
        at_creation,
        assumed: Arc::default(),
        namespace: args.namespace.clone(),
        seals,
        debounce: Debounce {
            quiet: args.admission.debounce,
            max: args.admission.debounce_max,
        },
    }
}

/// The live snapshot the leader shares with the webhook, to admit at creation with.
fn at_creation(args: &Args, seals: &Seals) -> AtCreation {
    AtCreation::new(args.admission.admit_at_creation)
        .with_reservations_per_namespace(args.admission.creation_reservations_per_namespace)
        .with_seals(seals.clone())
}

fn lease_config(args: &Args, identity: &str) -> LeaderConfig {
    LeaderConfig {
        lease_name: args.leader.lease_name.clone(),
        namespace: args.namespace.clone(),
        identity: identity.to_owned(),
        duration: args.leader.lease_duration,
        grace: args.leader.lease_grace,
    }
}

fn webhook_config(args: &Args, identity: &str) -> Result<WebhookConfig, ClientCaError> {
    let client_auth = match &args.webhook.webhook_client_ca {
        Some(path) => ClientAuth::from_pem_file(path)?,
        None => ClientAuth::Anyone,
    };
    Ok(WebhookConfig {
        addr: args.webhook.webhook_addr,
        names: args.webhook.certificate_names(&args.namespace),
        config_name: args.webhook.webhook_config_name.clone(),
        rotation: RotationPolicy {
            cert_validity: args.webhook.webhook_cert_validity,
            renew_before: args.webhook.webhook_cert_renew_before,
            ca_validity: args.webhook.webhook_ca_validity,
        },
        identity: identity.to_owned(),
        client_auth,
    })
}

/// The result of the server task named `task`: its own error, or how the task itself ended
/// (a panic, or an abort).
fn flatten<E>(
    joined: Result<Result<(), E>, tokio::task::JoinError>,
    task: &'static str,
    wrap: impl FnOnce(E) -> RunError,
) -> Result<(), RunError> {
    match joined {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(wrap(error)),
        Err(source) => Err(RunError::Task { task, source }),
    }
}

/// The API client's configuration: from `--kubeconfig` (and `--context`) when given,
/// otherwise as kubectl finds it (`$KUBECONFIG`, `~/.kube/config`, then the in-cluster
/// ServiceAccount).
async fn config(args: &Args) -> Result<Config, RunError> {
    let config = match &args.kube.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)?;
            let options = KubeConfigOptions {
                context: args.kube.context.clone(),
                ..KubeConfigOptions::default()
            };
            Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        None => Config::infer().await?,
    };
    Ok(config)
}

/// This replica's name in the Lease: `--lease-identity` (`$POD_NAME` in the Deployment: a
/// container restarted in the same pod resumes its own lease at once), or else the host name
/// with a random suffix.
fn identity(args: &Args) -> String {
    args.leader.lease_identity.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "gpuqueue-operator".to_owned());
        format!("{host}_{:08x}", rand::random::<u32>())
    })
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT.
async fn stop_on_signal(shutdown: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review finding: with `--webhook-drain=0s` an idle webhook (or `/metrics`) ends with the
    /// signal, and may win the race against the leader's work; its handle was then awaited a
    /// second time, and the process panicked on the way out.
    #[tokio::test]
    async fn servers_that_ended_before_the_leader_are_not_awaited_again() {
        let servers = Servers {
            http: tokio::spawn(async { Ok(()) }),
            webhook: tokio::spawn(async { Ok(()) }),
            drained: CancellationToken::new(),
        };
        let election = tokio::spawn(async {});
        let shutdown = CancellationToken::new();
        let ended = servers
            .run_with(std::future::pending(), &shutdown, election)
            .await;
        assert!(ended.is_ok());
        assert!(shutdown.is_cancelled());
    }
}
