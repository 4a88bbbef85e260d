//! The mutating admission webhook that puts GPU pods behind the admission gate.
//!
//! ```text
//!  pod CREATE ──▶ kube-apiserver ──TLS──▶ /mutate-pods ──▶ GatePolicy (stores + core rules)
//!                      ▲                        │
//!     caBundle ◀── Publisher (this CA)     JSON patch: add gpuqueue.io/admission
//! ```
//!
//! Every replica serves the webhook (a standby too), with its own CA and serving certificate
//! made at start-up ([`certs`]), renewed before expiry and swapped in without a restart. The
//! CA is written into the operator's MutatingWebhookConfiguration ([`ca_bundle`]), which is
//! watched so that the bundle is repaired if anyone resets it. The replica is ready (and so
//! receives traffic through the Service) only once its CA is in the bundle. With
//! `--webhook-client-ca` it answers only clients presenting a certificate that CA signed (the
//! API server, configured for it): see [`server::ClientAuth`].
//!
//! # Failure policy: `Ignore`, with bypassed pods counted as used
//!
//! The configuration in `config/` uses `failurePolicy: Ignore`, deliberately. With `Fail`, an
//! operator outage stops every GPU pod creation the webhook matches, in every tenant; worse, a
//! node drain or a rollout during the outage cannot replace the pods that serve traffic (the
//! failure seen in Kueue #5244 and Volcano #3734). With `Ignore`, while no replica answers:
//! - GPU pods are created without the gate, and kube-scheduler places them as usual;
//! - the operator, when back, counts every such pod as used capacity (of its queue when it
//!   is in a claimed namespace, as unmanaged capacity otherwise), never as free, so the
//!   quotas hold for everything admitted afterwards and nothing is over-committed twice;
//! - `gpuqueue_webhook_requests_total` stops moving, and `/readyz` of a replica without its CA
//!   in the bundle answers 503, which is what alerts should watch.
//!
//! The blast radius is kept small in the configuration itself: `matchConditions` send only pods
//! that request an extended resource (such as `nvidia.com/gpu`) or DRA devices, the namespace
//! selector leaves out the system namespaces and the operator's own, and `timeoutSeconds` is
//! short. What must hold during an outage does not depend on the webhook: the
//! ValidatingAdmissionPolicies in `config/policy/`, which the API server evaluates itself,
//! keep the gate and the operator's annotations to the operator and refuse, in claimed
//! namespaces, the pods the webhook refuses ([`mutate`]).

pub mod ca_bundle;
pub mod certs;
pub mod metrics;
pub mod mutate;
pub mod policy;
pub mod server;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use rustls::pki_types::CertificateDer;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use self::{
    ca_bundle::{Publisher, TrustSet},
    certs::{CaStep, CertError, CertResolver, CertificateAuthority, RotationPolicy},
    metrics::WebhookMetrics,
    mutate::GatePolicy,
};
use crate::{clock, http::Readiness};

/// After a failed publication, try again this much later (watch events also retry it).
const PUBLISH_RETRY: Duration = Duration::from_secs(5);

/// What the webhook needs to run.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub addr: SocketAddr,
    /// The names the serving certificate carries.
    pub names: Vec<String>,
    /// The MutatingWebhookConfiguration whose `caBundle` this process maintains.
    pub config_name: String,
    pub rotation: RotationPolicy,
    /// This replica, for the CA's name.
    pub identity: String,
    /// Who may call the webhook (`--webhook-client-ca`).
    pub client_auth: server::ClientAuth,
}

/// Why the webhook stopped.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("invalid certificate rotation: {0}")]
    Rotation(String),
    #[error(transparent)]
    Certificate(#[from] CertError),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("binding the webhook to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl WebhookError {
    /// The error's kind, for logs and metrics (snake case).
    pub fn category(&self) -> &'static str {
        match self {
            Self::Rotation(_) => "rotation",
            Self::Certificate(_) => "certificate",
            Self::Tls(_) => "tls",
            Self::Bind { .. } => "bind",
        }
    }
}

/// Serves the webhook until `shutdown`: binds, publishes the CA, renews certificates; then
/// answers the requests in flight.
pub async fn run(
    config: WebhookConfig,
    client: Client,
    policy: Arc<dyn GatePolicy>,
    metrics: WebhookMetrics,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(), WebhookError> {
    config.rotation.validate().map_err(WebhookError::Rotation)?;
    let now = clock::now();
    let mut issuer = Issuer::new(
        format!("gpuqueue webhook CA ({})", config.identity),
        &config,
        now,
    )?;
    let serving = issuer
        .authority
        .issue(&config.names, now, config.rotation.cert_validity)?;
    metrics.certificate_issued(serving.not_after.as_second());
    let resolver = Arc::new(CertResolver::new(&serving));
    let server = serve(&config, resolver.clone(), policy, &metrics, &shutdown).await?;

    let publisher = Arc::new(Publisher::new(
        Api::all(client),
        config.config_name.clone(),
        TrustSet {
            trust: vec![issuer.authority.certificate().clone()],
            retire: vec![],
        },
    ));
    let republisher = tokio::spawn(keep_published(
        publisher.clone(),
        metrics.clone(),
        readiness.clone(),
        shutdown.clone(),
    ));

    // Renew the serving certificate before it expires, and the CA before it ages out.
    let mut not_after = serving.not_after;
    loop {
        let renew_at = config.rotation.renewal_time(not_after);
        let wait = Duration::try_from(renew_at.duration_since(clock::now())).unwrap_or_default();
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
        }
        let now = clock::now();
        let retire = issuer
            .step_ca(&config.rotation, now, &publisher, &metrics, &readiness)
            .await?;
        let serving = issuer
            .authority
            .issue(&config.names, now, config.rotation.cert_validity)?;
        resolver.replace(&serving);
        metrics.certificate_issued(serving.not_after.as_second());
        not_after = serving.not_after;
        tracing::info!(expires = %not_after, "renewed the webhook's serving certificate");
        publisher.set_trust(TrustSet {
            trust: issuer.trusted(),
            retire,
        });
        publish_once(&publisher, &metrics, &readiness).await;
    }
    set_serving(&readiness, &metrics, false);
    republisher.abort();
    let _ = server.await;
    Ok(())
}

/// Binds the webhook's address and serves it over TLS (with the certificate `resolver` holds)
/// in a task of its own, until `shutdown` and the requests then in flight are answered.
async fn serve(
    config: &WebhookConfig,
    resolver: Arc<CertResolver>,
    policy: Arc<dyn GatePolicy>,
    metrics: &WebhookMetrics,
    shutdown: &CancellationToken,
) -> Result<JoinHandle<()>, WebhookError> {
    let listener = TcpListener::bind(config.addr)
        .await
        .map_err(|source| WebhookError::Bind {
            addr: config.addr,
            source,
        })?;
    tracing::info!(addr = %config.addr, names = ?config.names, "serving the webhook over TLS");
    Ok(tokio::spawn(server::serve(
        listener,
        server::tls_config(resolver, &config.client_auth)?,
        server::router(policy, metrics.clone()),
        shutdown.clone(),
    )))
}

/// The CA that issues the serving certificates, and the successor it hands over to.
struct Issuer {
    ca_name: String,
    ca_validity: Duration,
    authority: CertificateAuthority,
    successor: Option<CertificateAuthority>,
}

impl Issuer {
    fn new(ca_name: String, config: &WebhookConfig, now: Timestamp) -> Result<Self, WebhookError> {
        let ca_validity = config.rotation.ca_validity;
        let authority = CertificateAuthority::generate(&ca_name, now, ca_validity)?;
        Ok(Self {
            ca_name,
            ca_validity,
            authority,
            successor: None,
        })
    }

    /// Takes the CA's step of this renewal (see [`RotationPolicy::ca_step`]). Returns the CA
    /// certificates to retire from the trust set.
    async fn step_ca(
        &mut self,
        rotation: &RotationPolicy,
        now: Timestamp,
        publisher: &Publisher,
        metrics: &WebhookMetrics,
        readiness: &Readiness,
    ) -> Result<Vec<CertificateDer<'static>>, WebhookError> {
        let mut retire = Vec::new();
        match rotation.ca_step(now, self.authority.not_after(), self.successor.is_some()) {
            CaStep::Keep => {}
            CaStep::PrepareSuccessor => {
                self.successor = Some(CertificateAuthority::generate(
                    &self.ca_name,
                    now,
                    self.ca_validity,
                )?);
            }
            CaStep::SwitchToSuccessor => {
                if let Some(next) = self.successor.take() {
                    retire.push(self.authority.certificate().clone());
                    self.authority = next;
                }
            }
            CaStep::ReplaceNow => {
                let next = CertificateAuthority::generate(&self.ca_name, now, self.ca_validity)?;
                // Trusted first, presented second; the old CA stays trusted until then.
                publisher.set_trust(TrustSet {
                    trust: vec![
                        self.authority.certificate().clone(),
                        next.certificate().clone(),
                    ],
                    retire: vec![],
                });
                publish_once(publisher, metrics, readiness).await;
                retire.push(self.authority.certificate().clone());
                self.authority = next;
            }
        }
        Ok(retire)
    }

    /// The CA certificates clients should trust: the current one and its successor.
    fn trusted(&self) -> Vec<CertificateDer<'static>> {
        let mut trust = vec![self.authority.certificate().clone()];
        trust.extend(self.successor.iter().map(|next| next.certificate().clone()));
        trust
    }
}

/// Readiness and its gauge, which alerts watch: set together.
fn set_serving(readiness: &Readiness, metrics: &WebhookMetrics, serving: bool) {
    readiness.set_webhook_serving(serving);
    metrics.serving(serving);
}

/// Publishes once and updates readiness from the result. Returns whether it succeeded.
async fn publish_once(
    publisher: &Publisher,
    metrics: &WebhookMetrics,
    readiness: &Readiness,
) -> bool {
    match publisher.publish(clock::now()).await {
        Ok(outcome) => {
            if outcome == ca_bundle::Published::Updated {
                metrics.ca_bundle_updated();
                tracing::info!(config = publisher.name(), "published the webhook CA");
            }
            set_serving(readiness, metrics, true);
            true
        }
        Err(error) => {
            // Ready only while the API server trusts this replica's CA: a bundle reset by
            // someone else, or a new CA, that could not be written is not. A configuration
            // that could not even be read says nothing new, so readiness stays as it was.
            if let Some(trusted) = error.trusted() {
                set_serving(readiness, metrics, trusted);
            }
            tracing::warn!(%error, "publishing the webhook CA failed; retrying");
            false
        }
    }
}

/// Watches the webhook configuration and republishes whenever it changes, so a bundle reset
/// by someone else is repaired, and a configuration created after the operator is filled in.
async fn keep_published(
    publisher: Arc<Publisher>,
    metrics: WebhookMetrics,
    readiness: Readiness,
    shutdown: CancellationToken,
) {
    let api: Api<MutatingWebhookConfiguration> = publisher.api().clone();
    let config = watcher::Config::default().fields(&format!("metadata.name={}", publisher.name()));
    let mut changes = watcher(api, config).default_backoff().boxed();
    let mut retry_pending = false;
    loop {
        let retry = async {
            if retry_pending {
                tokio::time::sleep(PUBLISH_RETRY).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = retry => {}
            event = changes.next() => match event {
                None => return,
                Some(Err(error)) => {
                    tracing::warn!(%error, "watching the webhook configuration failed");
                    continue;
                }
                // Deletion, and the markers of a relist, are followed by the event that
                // matters; publishing on each is idempotent anyway.
                Some(Ok(_)) => {}
            },
        }
        retry_pending = !publish_once(&publisher, &metrics, &readiness).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::{http::Readiness, metrics, mock_api, webhook::certs::CertificateAuthority};

    /// A client whose API server shows one webhook with `bundle` and answers every patch with
    /// `patch_code` (a read with `read_code`).
    fn api(bundle: &str, read_code: u16, patch_code: u16) -> Api<MutatingWebhookConfiguration> {
        let config = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "gpuqueue-operator", "resourceVersion": "7"},
            "webhooks": [{"name": "gate.gpuqueue.io", "admissionReviewVersions": ["v1"],
                "sideEffects": "None", "clientConfig": {"caBundle": bundle}}],
        });
        let (client, _) = mock_api::serve(move |request| {
            match if request.method == "GET" {
                read_code
            } else {
                patch_code
            } {
                200 => (200, config.clone()),
                code => mock_api::failure(code, "Forbidden", "refused (test)"),
            }
        });
        Api::all(client)
    }

    /// Whether a replica that was ready still is after publishing, through an API server that
    /// answers reads with `read_code` and writes with `patch_code`, its CA (and a successor
    /// not published yet, when `successor`), the bundle holding its CA when `in_bundle`.
    async fn ready_after_publishing(
        read_code: u16,
        patch_code: u16,
        in_bundle: bool,
        successor: bool,
    ) -> bool {
        let now = clock::now();
        let ca = |name: &str| {
            CertificateAuthority::generate(name, now, Duration::from_hours(720))
                .unwrap()
                .certificate()
                .clone()
        };
        let mut trust = TrustSet {
            trust: vec![ca("ours")],
            retire: vec![],
        };
        let bundle = if in_bundle {
            ca_bundle::merged_bundle(b"", &trust, now).unwrap()
        } else {
            Vec::new()
        };
        if successor {
            trust.trust.push(ca("next"));
        }
        let bundle = serde_json::to_value(k8s_openapi::ByteString(bundle)).unwrap();
        let api = api(bundle.as_str().unwrap(), read_code, patch_code);
        let publisher = Publisher::new(api, "gpuqueue-operator".to_owned(), trust);
        let metrics = WebhookMetrics::register(&mut metrics::registry());
        let readiness = Readiness::default();
        readiness.set_stores_synced();
        readiness.set_webhook_serving(true);
        publish_once(&publisher, &metrics, &readiness).await;
        readiness.check().is_ok()
    }

    #[tokio::test]
    async fn a_replica_whose_ca_could_not_be_written_is_not_ready() {
        // Someone reset the bundle, and the operator may no longer write it (RBAC removed).
        assert!(!ready_after_publishing(200, 403, false, false).await);
        // A configuration that could not even be read says nothing new.
        assert!(ready_after_publishing(500, 403, false, false).await);
        // Its successor could not be added, but the CA it serves with is trusted: ready.
        assert!(ready_after_publishing(200, 500, true, true).await);
    }
}
