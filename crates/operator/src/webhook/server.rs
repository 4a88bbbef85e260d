//! Serving the webhook over TLS: a TCP accept loop, a rustls handshake with the certificate the
//! [`CertResolver`] holds at that moment, and HTTP/1.1 or HTTP/2 (as the API server negotiates)
//! into an axum router with one route, `POST /mutate-pods`.
//!
//! Who may call it is [`ClientAuth`]: by default anyone who reaches the port (kube-apiserver
//! presents no client certificate unless configured to); with `--webhook-client-ca`, only a
//! client whose certificate that CA signed, so a forged review from inside the cluster is
//! refused in the handshake, before any reservation is made.

use std::{net::SocketAddr, path::Path, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    body::Bytes,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, pem::PemObject},
    server::WebPkiClientVerifier,
};
use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::metrics::{WebhookMetrics, WebhookResult};
use super::{
    certs::CertResolver,
    mutate::{self, GatePolicy},
};

/// The path the webhook configuration calls.
pub const MUTATE_PODS_PATH: &str = "/mutate-pods";

/// A client that does not finish its handshake in this time is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Once the webhook stops, requests in flight get this long to be answered: a review takes
/// milliseconds, so only a client that stalls a request is cut off.
const FINISH_LIMIT: Duration = Duration::from_secs(5);

/// While an admission pass holds the lock, the webhook asks again this often, for at most
/// [`BUSY_PATIENCE`], then gates the pod. A pass takes milliseconds, and one pod gated this way
/// closes admission at creation for every pod until a pass has seen it, so a burst is worth a
/// short wait; a long pass must not hold the answer near the webhook's 3 s timeout.
const BUSY_RETRY: Duration = Duration::from_millis(1);
const BUSY_PATIENCE: Duration = Duration::from_millis(250);

/// Who may call the webhook.
#[derive(Debug, Clone, Default)]
pub enum ClientAuth {
    /// Anyone who can reach the port: the API server presents no client certificate by
    /// default, so this is what works everywhere (a NetworkPolicy then limits who reaches it).
    #[default]
    Anyone,
    /// Only clients presenting a certificate signed by one of these CAs.
    SignedBy(Vec<CertificateDer<'static>>),
}

/// Why the client CA file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error(
    "--webhook-client-ca {path}: {reason}; give a PEM file of the CA that signs the API server's webhook client certificate"
)]
pub struct ClientCaError {
    pub path: String,
    pub reason: String,
}

impl ClientAuth {
    /// Reads the CA certificates (PEM) that sign the clients' certificates.
    pub fn from_pem_file(path: &Path) -> Result<Self, ClientCaError> {
        let error = |reason: String| ClientCaError {
            path: path.display().to_string(),
            reason,
        };
        let certificates = CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(|e| error(e.to_string()))?;
        if certificates.is_empty() {
            return Err(error("holds no CERTIFICATE block".to_owned()));
        }
        Ok(Self::SignedBy(certificates))
    }
}

/// TLS settings: TLS 1.2 and 1.3 with ring, client certificates as `client_auth` says, HTTP/2
/// preferred.
pub fn tls_config(
    resolver: Arc<CertResolver>,
    client_auth: &ClientAuth,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_auth {
        ClientAuth::Anyone => builder.with_no_client_auth(),
        ClientAuth::SignedBy(cas) => {
            let mut roots = RootCertStore::empty();
            for ca in cas {
                roots.add(ca.clone())?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|error| rustls::Error::General(error.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[derive(Clone)]
struct AppState {
    policy: Arc<dyn GatePolicy>,
    metrics: WebhookMetrics,
}

/// The webhook's routes.
pub fn router(policy: Arc<dyn GatePolicy>, metrics: WebhookMetrics) -> Router {
    Router::new()
        .route(MUTATE_PODS_PATH, post(mutate_pods))
        .with_state(AppState { policy, metrics })
}

async fn mutate_pods(State(state): State<AppState>, body: Bytes) -> Response {
    let request = match mutate::read(&body) {
        Ok(request) => request,
        Err(error) => {
            state.metrics.answered(WebhookResult::Invalid);
            tracing::warn!(%error, "unreadable admission request");
            return (StatusCode::BAD_REQUEST, error.to_string()).into_response();
        }
    };
    // Read once; while a pass holds the lock, only the decision is asked again.
    let patience = tokio::time::Instant::now() + BUSY_PATIENCE;
    let answer = loop {
        let answer = mutate::answer(&request, state.policy.as_ref());
        if answer.result != WebhookResult::Busy || tokio::time::Instant::now() >= patience {
            break answer;
        }
        tokio::time::sleep(BUSY_RETRY).await;
    };
    if answer.result == WebhookResult::Busy {
        state.policy.gated_undecided();
    }
    state.metrics.answered(answer.result);
    if let Some(queue) = &answer.queue {
        tracing::debug!(%queue, "gated a new pod");
    }
    Json(answer.review).into_response()
}

/// Accepts connections until `stop` is cancelled, then answers the requests in flight (for up
/// to [`FINISH_LIMIT`]) and closes every connection. Each connection is served on its own
/// task; a failed handshake or connection affects only itself.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    router: Router,
    stop: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    let mut connections = JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            () = stop.cancelled() => break,
            // Reaps connections that ended, so the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a webhook connection failed");
                    continue;
                }
            },
        };
        let service = TowerToHyperService::new(router.clone());
        connections.spawn(serve_connection(
            acceptor.clone(),
            (tcp, peer),
            service,
            stop.clone(),
        ));
    }
    drop(listener);
    let finished = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(FINISH_LIMIT, finished).await.is_err() {
        tracing::warn!(
            open = connections.len(),
            "webhook connections still open after the stop; closing them"
        );
    }
}

/// Serves one connection until it ends or `stop`, then shuts it down gracefully: a request in
/// flight is answered, an idle connection closed (HTTP/2: GOAWAY).
async fn serve_connection(
    acceptor: TlsAcceptor,
    (tcp, peer): (TcpStream, SocketAddr),
    service: TowerToHyperService<Router>,
    stop: CancellationToken,
) {
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let builder = auto::Builder::new(TokioExecutor::new());
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = stop.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%peer, %error, "webhook connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::{BodyExt, Full};
    use hyper::Request;
    use k8s_openapi::api::core::v1::Pod;
    use rustls::{
        ClientConfig,
        pki_types::{PrivateKeyDer, ServerName},
    };
    use serde_json::json;
    use tokio::net::TcpStream;
    use tokio_rustls::TlsConnector;

    use super::*;
    use crate::{
        admission::at_creation::{CreationAdmission, Gate},
        metrics,
        webhook::certs::{CertificateAuthority, ServingCertificate},
    };

    struct EverythingInQueue;

    impl GatePolicy for EverythingInQueue {
        fn managing_queue(&self, _pod: &Pod) -> Option<String> {
            Some("q".to_owned())
        }
    }

    /// Busy for its first `busy_for` calls (every call: `u32::MAX`), then declines; counts the
    /// pods it was told went to the gate busy.
    struct BusyPasses {
        busy_for: u32,
        calls: std::sync::atomic::AtomicU32,
        gated_undecided: Arc<std::sync::atomic::AtomicU32>,
    }

    impl GatePolicy for BusyPasses {
        fn managing_queue(&self, _pod: &Pod) -> Option<String> {
            Some("q".to_owned())
        }

        fn admit_at_creation(&self, _pod: &Pod) -> Result<CreationAdmission, Gate> {
            let call = self
                .calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(if call < self.busy_for {
                Gate::Busy
            } else {
                Gate::Declined
            })
        }

        fn gated_undecided(&self) {
            self.gated_undecided
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    const DAY: Duration = Duration::from_hours(24);

    struct Running {
        addr: std::net::SocketAddr,
        resolver: Arc<CertResolver>,
        ca: CertificateAuthority,
        registry: prometheus_client::registry::Registry,
        shutdown: CancellationToken,
        served: tokio::task::JoinHandle<()>,
    }

    async fn start() -> Running {
        start_with(&ClientAuth::Anyone).await
    }

    async fn start_with(client_auth: &ClientAuth) -> Running {
        start_serving(client_auth, Arc::new(EverythingInQueue)).await
    }

    async fn start_serving(client_auth: &ClientAuth, policy: Arc<dyn GatePolicy>) -> Running {
        let now = crate::clock::now();
        let ca = CertificateAuthority::generate("test CA", now, 30 * DAY).unwrap();
        let serving = ca.issue(&["127.0.0.1".to_owned()], now, DAY).unwrap();
        let resolver = Arc::new(CertResolver::new(&serving));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut registry = metrics::registry();
        let metrics = WebhookMetrics::register(&mut registry);
        let shutdown = CancellationToken::new();
        let served = tokio::spawn(serve(
            listener,
            tls_config(resolver.clone(), client_auth).unwrap(),
            router(policy, metrics),
            shutdown.clone(),
        ));
        Running {
            addr,
            resolver,
            ca,
            registry,
            shutdown,
            served,
        }
    }

    /// Connects trusting `ca`, POSTs `body` over HTTP/1.1 and returns the status, the body and
    /// the certificate the server presented.
    async fn call(
        running: &Running,
        ca: &CertificateAuthority,
        body: Vec<u8>,
    ) -> Result<(u16, serde_json::Value, Vec<u8>), String> {
        call_as(running, ca, None, body).await
    }

    /// [`call`], presenting `identity` (a certificate chain and its key) when given.
    async fn call_as(
        running: &Running,
        ca: &CertificateAuthority,
        identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
        body: Vec<u8>,
    ) -> Result<(u16, serde_json::Value, Vec<u8>), String> {
        let mut roots = RootCertStore::empty();
        roots.add(ca.certificate().clone()).unwrap();
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots);
        let config = match identity {
            Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
            None => builder.with_no_client_auth(),
        };
        let tcp = TcpStream::connect(running.addr).await.unwrap();
        let tls = TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
            .await
            .map_err(|error| error.to_string())?;
        let presented = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
        // With TLS 1.3 a refused client certificate shows on the first exchange, not before.
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|error| error.to_string())?;
        tokio::spawn(connection);
        let request = Request::post(MUTATE_PODS_PATH)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| format!("{error:?}"))?;
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let json = serde_json::from_slice(&bytes).unwrap_or(json!(String::from_utf8_lossy(&bytes)));
        Ok((status, json, presented))
    }

    fn pod_review() -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "abc", "operation": "CREATE", "namespace": "tenant",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "userInfo": {},
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                           "spec": {"containers": [{"name": "c", "image": "i"}]}},
            }
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn the_webhook_answers_over_tls_with_the_gate_patch() {
        let running = start().await;
        let (status, body, _) = call(&running, &running.ca, pod_review()).await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(body["kind"], "AdmissionReview");
        assert_eq!(body["response"]["uid"], "abc");
        assert_eq!(body["response"]["patchType"], "JSONPatch");
        let text = metrics::encode(&running.registry).unwrap();
        assert!(
            text.contains(r#"gpuqueue_webhook_requests_total{result="gated"} 1"#),
            "{text}"
        );
        running.shutdown.cancel();
    }

    #[tokio::test]
    async fn an_unreadable_request_is_a_bad_request() {
        let running = start().await;
        let (status, _, _) = call(&running, &running.ca, b"{}".to_vec()).await.unwrap();
        assert_eq!(status, 400);
        running.shutdown.cancel();
    }

    #[tokio::test]
    async fn a_client_that_does_not_trust_our_ca_is_refused() {
        let running = start().await;
        let stranger =
            CertificateAuthority::generate("stranger", crate::clock::now(), DAY * 30).unwrap();
        let error = call(&running, &stranger, pod_review()).await.unwrap_err();
        assert!(error.contains("certificate"), "{error}");
        running.shutdown.cancel();
    }

    /// A replica stopping during a rollout answers what the API server already sent it: the
    /// request in flight (held here by a busy pass) is answered, then no connection is taken.
    #[tokio::test]
    async fn a_request_in_flight_when_the_webhook_stops_is_answered() {
        let policy = Arc::new(BusyPasses {
            busy_for: u32::MAX,
            calls: std::sync::atomic::AtomicU32::new(0),
            gated_undecided: Arc::default(),
        });
        let running = start_serving(&ClientAuth::Anyone, policy.clone()).await;
        let stop_once_in_flight = async {
            while policy.calls.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            running.shutdown.cancel();
        };
        let (answer, ()) = tokio::join!(
            call(&running, &running.ca, pod_review()),
            stop_once_in_flight
        );
        let (status, body, _) = answer.unwrap();
        assert_eq!(status, 200);
        assert_eq!(body["response"]["patchType"], "JSONPatch");
        running.served.await.unwrap();
        assert!(TcpStream::connect(running.addr).await.is_err());
    }

    #[tokio::test]
    async fn while_a_pass_holds_the_lock_the_webhook_asks_again_then_gates_the_pod_as_busy() {
        let gated_undecided = Arc::new(std::sync::atomic::AtomicU32::new(0));
        for (busy_for, result) in [(3, "gated"), (u32::MAX, "busy")] {
            let policy = BusyPasses {
                busy_for,
                calls: std::sync::atomic::AtomicU32::new(0),
                gated_undecided: gated_undecided.clone(),
            };
            let running = start_serving(&ClientAuth::Anyone, Arc::new(policy)).await;
            let (status, body, _) = call(&running, &running.ca, pod_review()).await.unwrap();
            assert_eq!(status, 200);
            assert_eq!(
                body["response"]["patchType"], "JSONPatch",
                "gated either way"
            );
            let text = metrics::encode(&running.registry).unwrap();
            let series = format!(r#"gpuqueue_webhook_requests_total{{result="{result}"}} 1"#);
            assert!(text.contains(&series), "{text}");
            running.shutdown.cancel();
        }
        assert_eq!(
            gated_undecided.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "only the pod it gave up on"
        );
    }

    /// A client CA (as the API server's PKI), and a client certificate it signed.
    fn client_pki() -> (
        CertificateDer<'static>,
        (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
    ) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let leaf = params.signed_by(&key, &issuer).unwrap();
        (
            ca.der().clone(),
            (vec![leaf.der().clone()], PrivateKeyDer::from(key)),
        )
    }

    #[tokio::test]
    async fn with_a_client_ca_only_clients_it_signed_are_answered() {
        let (client_ca, identity) = client_pki();
        let running = start_with(&ClientAuth::SignedBy(vec![client_ca])).await;
        let refused = call(&running, &running.ca, pod_review()).await.unwrap_err();
        assert!(refused.contains("CertificateRequired"), "{refused}");
        let (_, stranger) = client_pki();
        let refused = call_as(&running, &running.ca, Some(stranger), pod_review())
            .await
            .unwrap_err();
        assert!(
            refused.contains("AlertReceived"),
            "refused in the handshake: {refused}"
        );
        let (status, body, _) = call_as(&running, &running.ca, Some(identity), pod_review())
            .await
            .unwrap();
        assert_eq!(
            (status, body["response"]["uid"].as_str()),
            (200, Some("abc"))
        );
        let text = metrics::encode(&running.registry).unwrap();
        assert!(
            text.contains(r#"gpuqueue_webhook_requests_total{result="gated"} 1"#),
            "only the signed client reached the webhook: {text}"
        );
        running.shutdown.cancel();
    }

    #[test]
    fn a_client_ca_file_without_certificates_is_refused_with_what_to_give() {
        let dir = std::env::temp_dir().join(format!("gpuqueue-client-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("empty.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let error = ClientAuth::from_pem_file(&path).unwrap_err().to_string();
        assert!(error.contains("--webhook-client-ca"), "{error}");
        assert!(error.contains("give a PEM file"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_renewed_certificate_is_served_without_a_restart() {
        let running = start().await;
        let (_, _, before) = call(&running, &running.ca, pod_review()).await.unwrap();
        let renewed: ServingCertificate = running
            .ca
            .issue(&["127.0.0.1".to_owned()], crate::clock::now(), DAY)
            .unwrap();
        running.resolver.replace(&renewed);
        let (status, _, after) = call(&running, &running.ca, pod_review()).await.unwrap();
        assert_eq!(status, 200);
        assert_ne!(before, after, "the renewed certificate is presented");
        assert_eq!(after, renewed.certified.cert[0].to_vec());
        running.shutdown.cancel();
    }
}
