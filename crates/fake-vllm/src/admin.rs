//! The fake's own control API, under `/_fake/` (a prefix vLLM never uses): faults, the call log,
//! connection refusal, engine death, shutdown and synthetic load. Each server answers it on its
//! own address; the fleet's admin listener (`fleet.rs`) reaches every server as
//! `/_fake/servers/{addr}/...` through the same routes.

use std::time::Duration;

use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use crate::faults::RouteFault;
use crate::server::FakeVllm;

/// A 400 answer whose JSON body says what is wrong.
pub(crate) fn bad_request(message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({ "error": message })),
    )
        .into_response()
}

/// Unwraps a JSON body or answers 400 naming what is wrong with it.
macro_rules! body {
    ($body:expr) => {
        match $body {
            Ok(axum::Json(body)) => body,
            Err(rejection) => return $crate::admin::bad_request(&rejection.body_text()),
        }
    };
}
pub(crate) use body;

/// The `/_fake/...` routes of one server.
pub fn server_router(server: FakeVllm) -> Router {
    Router::new()
        .route("/_fake/state", get(state))
        .route("/_fake/config", get(config))
        .route("/_fake/calls", get(calls).delete(clear_calls))
        .route(
            "/_fake/faults",
            get(faults).post(set_fault).delete(clear_faults),
        )
        .route("/_fake/listening", post(listening))
        .route("/_fake/engine_dead", post(engine_dead))
        .route("/_fake/shutdown", post(shutdown))
        .route("/_fake/load", post(load))
        .route("/_fake/reset", post(reset))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                axum::Json(json!({"error": "no such admin route"})),
            )
        })
        .with_state(server)
}

async fn state(State(server): State<FakeVllm>) -> Response {
    axum::Json(json!({
        "addr": server.addr(),
        "listening": server.listening(),
        "engine": server.snapshot(),
    }))
    .into_response()
}

async fn config(State(server): State<FakeVllm>) -> Response {
    axum::Json(server.config().clone()).into_response()
}

async fn calls(State(server): State<FakeVllm>) -> Response {
    axum::Json(server.calls()).into_response()
}

async fn clear_calls(State(server): State<FakeVllm>) -> StatusCode {
    server.clear_calls();
    StatusCode::NO_CONTENT
}

async fn faults(State(server): State<FakeVllm>) -> Response {
    axum::Json(server.faults()).into_response()
}

/// `POST /_fake/faults {"route": "/pause", "delay_ms": 1200, "action": {"status": 500}, "times": 1}`;
/// `action` is `"respond"` (default), `{"status": N}`, `"hang"` or `"close"`.
async fn set_fault(State(server): State<FakeVllm>, body: axum::body::Bytes) -> Response {
    let fault: RouteFault = match serde_json::from_slice(&body) {
        Ok(fault) => fault,
        Err(error) => {
            return bad_request(&format!(
                "invalid fault ({error}); expected {{\"route\": \"/pause\", \"delay_ms\": 0, \"action\": \"respond\" | \"hang\" | \"close\" | {{\"status\": 500}}, \"times\": 1}}"
            ));
        }
    };
    if fault.route != crate::faults::ANY_ROUTE && !fault.route.starts_with('/') {
        return bad_request("route must be a path such as /pause, or *");
    }
    server.set_fault(&fault.route, fault.fault);
    axum::Json(server.faults()).into_response()
}

#[derive(Deserialize)]
struct RouteQuery {
    route: Option<String>,
}

async fn clear_faults(
    State(server): State<FakeVllm>,
    Query(query): Query<RouteQuery>,
) -> StatusCode {
    server.clear_faults(query.route.as_deref());
    StatusCode::NO_CONTENT
}

/// Marks an admin request that came in on the server's own address (not the fleet's listener).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ViaOwnAddress;

#[derive(Deserialize)]
struct ListeningBody {
    accepting: bool,
}

/// `POST /_fake/listening {"accepting": false}` closes the socket and every open connection:
/// connections are refused. Sent to the server's own address it takes effect just after this
/// answer (which would otherwise be cut off with the connection), and it is the last call that
/// address answers: use the fleet's admin listener or the in-process handle to accept again.
async fn listening(
    State(server): State<FakeVllm>,
    own_address: Option<Extension<ViaOwnAddress>>,
    body: Result<axum::Json<ListeningBody>, JsonRejection>,
) -> Response {
    let body = body!(body);
    if own_address.is_some() && !body.accepting {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            server.set_accepting(false).await;
        });
        return (
            StatusCode::ACCEPTED,
            [(http::header::CONNECTION, "close")],
            axum::Json(json!({ "listening": "refusing" })),
        )
            .into_response();
    }
    server.set_accepting(body.accepting).await;
    axum::Json(json!({ "listening": server.listening() })).into_response()
}

#[derive(Deserialize)]
struct DeadBody {
    dead: bool,
}

async fn engine_dead(
    State(server): State<FakeVllm>,
    body: Result<axum::Json<DeadBody>, JsonRejection>,
) -> Response {
    let body = body!(body);
    server.set_engine_dead(body.dead);
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
struct ShutdownBody {
    #[serde(default)]
    drain_ms: u64,
}

async fn shutdown(
    State(server): State<FakeVllm>,
    body: Result<axum::Json<ShutdownBody>, JsonRejection>,
) -> Response {
    let body = body!(body);
    server.shutdown(Duration::from_millis(body.drain_ms));
    StatusCode::ACCEPTED.into_response()
}

#[derive(Deserialize)]
struct LoadBody {
    requests: usize,
    #[serde(default = "default_prompt_tokens")]
    prompt_tokens: u32,
    #[serde(default = "default_max_tokens")]
    max_tokens: u32,
}

fn default_prompt_tokens() -> u32 {
    128
}

fn default_max_tokens() -> u32 {
    256
}

async fn load(
    State(server): State<FakeVllm>,
    body: Result<axum::Json<LoadBody>, JsonRejection>,
) -> Response {
    let body = body!(body);
    if body.max_tokens == 0 {
        return bad_request("max_tokens must be at least 1");
    }
    server.add_load(body.requests, body.prompt_tokens, body.max_tokens);
    StatusCode::ACCEPTED.into_response()
}

async fn reset(State(server): State<FakeVllm>) -> StatusCode {
    server.clear_faults(None);
    server.clear_calls();
    StatusCode::NO_CONTENT
}
