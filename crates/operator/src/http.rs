//! The plain-HTTP endpoint: `/metrics` for Prometheus, `/healthz` and `/readyz` for the
//! kubelet.
//!
//! `/healthz` answers 200 while the process serves requests. `/readyz` answers 200 only once
//! every store has synced (the budgets aside, see `Stores::synced`) *and* the webhook serves with its CA published; until then it
//! answers 503 and names what is missing. Readiness does not depend on leadership: a standby
//! replica serves the webhook too, so it is ready as soon as it can answer it.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What must be true before the operator is ready. Shared by the parts that make it true.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    inner: Arc<ReadinessFlags>,
}

#[derive(Debug, Default)]
struct ReadinessFlags {
    stores_synced: AtomicBool,
    webhook_serving: AtomicBool,
    stopping: AtomicBool,
}

impl Readiness {
    /// Every store (the budgets aside) holds its initial list.
    pub fn set_stores_synced(&self) {
        self.inner.stores_synced.store(true, Ordering::Release);
    }

    /// The webhook listens and its CA is in the webhook configuration (or it stopped).
    pub fn set_webhook_serving(&self, serving: bool) {
        self.inner.webhook_serving.store(serving, Ordering::Release);
    }

    /// The process is stopping: it serves out its drain, but takes no new traffic.
    pub fn set_stopping(&self) {
        self.inner.stopping.store(true, Ordering::Release);
    }

    /// `Ok` when ready, or the list of what is missing.
    pub fn check(&self) -> Result<(), Vec<&'static str>> {
        let mut missing = Vec::new();
        if self.inner.stopping.load(Ordering::Acquire) {
            missing.push("stopping");
        }
        if !self.inner.stores_synced.load(Ordering::Acquire) {
            missing.push("stores have not synced");
        }
        if !self.inner.webhook_serving.load(Ordering::Acquire) {
            missing.push("webhook is not serving with a published CA");
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing)
        }
    }
}

#[derive(Debug, Clone)]
struct AppState {
    registry: Arc<Registry>,
    readiness: Readiness,
}

/// The router, separate from the listener so tests can call it directly.
pub fn router(registry: Arc<Registry>, readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            registry,
            readiness,
        })
}

/// Serves the router on `addr` until `shutdown` is cancelled.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, router(registry, readiness))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    match crate::metrics::encode(&state.registry) {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        ),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("encoding metrics failed: {error}\n"),
        ),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    match state.readiness.check() {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
        Err(missing) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", missing.join("; ")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;
    use crate::{leader::LeaderMetrics, metrics};

    async fn get(router: &Router, path: &str) -> (StatusCode, String, Option<String>) {
        let response = router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|value| value.to_str().unwrap().to_owned());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            String::from_utf8(body.to_vec()).unwrap(),
            content_type,
        )
    }

    fn app() -> (Router, Readiness, LeaderMetrics) {
        let mut registry = metrics::registry();
        let metrics = LeaderMetrics::register(&mut registry);
        let readiness = Readiness::default();
        (
            router(Arc::new(registry), readiness.clone()),
            readiness,
            metrics,
        )
    }

    #[tokio::test]
    async fn readyz_waits_for_the_stores_and_the_webhook() {
        let (router, readiness, _) = app();
        let (status, body, _) = get(&router, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("stores have not synced"), "{body}");
        assert!(body.contains("webhook is not serving"), "{body}");

        readiness.set_stores_synced();
        let (status, body, _) = get(&router, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!body.contains("stores"), "{body}");

        readiness.set_webhook_serving(true);
        assert_eq!(get(&router, "/readyz").await.0, StatusCode::OK);

        readiness.set_webhook_serving(false);
        assert_eq!(
            get(&router, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );

        // A replica that drains after SIGTERM still serves, but is not ready.
        readiness.set_webhook_serving(true);
        readiness.set_stopping();
        let (status, body, _) = get(&router, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not ready: stopping\n");
    }

    #[tokio::test]
    async fn healthz_answers_while_not_ready() {
        let (router, _, _) = app();
        assert_eq!(get(&router, "/healthz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_are_openmetrics_text() {
        let (router, _, metrics) = app();
        metrics.acting(true);
        let (status, body, content_type) = get(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            content_type
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
        assert!(body.contains("gpuqueue_leader 1"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
    }

    #[tokio::test]
    async fn unknown_paths_are_not_found() {
        let (router, _, _) = app();
        assert_eq!(get(&router, "/admin").await.0, StatusCode::NOT_FOUND);
    }
}
