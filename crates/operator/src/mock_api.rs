//! An API server played by the test: each request is answered by a closure, and every request
//! is kept for the test to read, so that a write path can be tried against answers a real
//! server gives only when something goes wrong (a 500 while etcd restarts, a 409, a 404).

use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use hyper::{Request, Response};
use kube::{Client, client::Body};
use serde_json::{Value, json};
use tokio::time::Instant;
use tower_test::mock;

/// One request the server saw.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    /// The body as JSON, `Null` when it was empty or not JSON.
    pub body: Value,
    /// When it came, on tokio's clock.
    pub at: Instant,
}

/// Every request the server saw, in order.
pub(crate) type Log = Arc<Mutex<Vec<Seen>>>;

/// A client whose API server answers each request with the status code and JSON body `answer`
/// gives for it; the log of what it saw.
pub(crate) fn serve(
    mut answer: impl FnMut(&Seen) -> (u16, Value) + Send + 'static,
) -> (Client, Log) {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let log: Log = Arc::default();
    let kept = log.clone();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let seen = read(request).await;
            let (code, body) = answer(&seen);
            crate::sync::lock(&kept).push(seen);
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap(),
            );
        }
    });
    (Client::new(service, "default"), log)
}

/// A client whose API server takes each request and never answers it, as one that stalls.
pub(crate) fn stalled() -> Client {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        let mut unanswered = Vec::new();
        while let Some(request) = handle.next_request().await {
            unanswered.push(request);
        }
    });
    Client::new(service, "default")
}

async fn read(request: Request<Body>) -> Seen {
    let at = Instant::now();
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let content_type = request
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = request.into_body().collect().await.unwrap().to_bytes();
    Seen {
        method,
        path,
        query,
        content_type,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        at,
    }
}

/// The `Status` a request that failed with `code` is answered with.
pub(crate) fn failure(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": reason, "code": code, "message": message}),
    )
}

/// What the server saw, as `(method, path)` pairs.
pub(crate) fn requests(log: &Log) -> Vec<(String, String)> {
    crate::sync::lock(log)
        .iter()
        .map(|s| (s.method.clone(), s.path.clone()))
        .collect()
}
