//! The vLLM routes a fake server registers, which depend on the profile and dev mode exactly as
//! upstream's do: a route that is not registered answers the framework's 404, and
//! `/openapi.json` lists exactly the registered routes with their query parameters.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use http::{Method, StatusCode, header};
use serde_json::{Map, Value, json};

use crate::config::{Config, ErrorStyle, Profile};
use crate::engine::{Engine, PauseMode, Phase, SleepTag};
use crate::errors::{self, Invalid};
use crate::{generate, metrics};

type Params = Query<Vec<(String, String)>>;

/// One registered route: method, path, the query parameters `/openapi.json` documents.
struct Route {
    method: Method,
    path: &'static str,
    params: Vec<&'static str>,
    handler: MethodRouter<Arc<Engine>>,
}

fn route(
    method: Method,
    path: &'static str,
    params: &[&'static str],
    handler: MethodRouter<Arc<Engine>>,
) -> Route {
    Route {
        method,
        path,
        params: params.to_vec(),
        handler,
    }
}

/// The routes `config` registers, in vLLM's order.
fn routes(config: &Config) -> Vec<Route> {
    let latest = config.profile == Profile::Latest;
    let mut routes = vec![
        route(Method::GET, "/health", &[], get(health)),
        route(Method::GET, "/load", &[], get(load)),
        route(Method::GET, "/version", &[], get(version)),
        route(Method::GET, "/v1/models", &[], get(generate::models)),
        route(Method::POST, "/tokenize", &[], post(generate::tokenize)),
        route(
            Method::POST,
            "/v1/chat/completions",
            &[],
            post(generate::chat_completions),
        ),
        route(
            Method::POST,
            "/v1/completions",
            &[],
            post(generate::completions),
        ),
    ];
    // v0.14 attached the RLHF router unconditionally; later releases only in dev mode.
    if config.dev_mode || config.profile == Profile::V0_14 {
        let pause_params: &[&str] = match config.profile {
            Profile::V0_14 => &["wait_for_inflight_requests", "clear_cache"],
            Profile::V0_19 | Profile::Latest => &["mode", "clear_cache"],
        };
        routes.extend([
            route(Method::POST, "/pause", pause_params, post(pause)),
            route(Method::POST, "/resume", &[], post(resume)),
            route(Method::GET, "/is_paused", &[], get(is_paused)),
        ]);
        if latest && config.dev_mode {
            routes.push(route(
                Method::POST,
                "/abort_requests",
                &[],
                post(abort_requests),
            ));
        }
    }
    if config.dev_mode {
        let sleep_params: &[&str] = if latest {
            &["level", "mode", "tags"]
        } else {
            &["level"]
        };
        let reset_params: &[&str] = if latest {
            &["reset_running_requests", "reset_external"]
        } else {
            &[]
        };
        routes.extend([
            route(
                Method::POST,
                "/reset_prefix_cache",
                reset_params,
                post(reset_prefix_cache),
            ),
            route(Method::POST, "/sleep", sleep_params, post(sleep)),
            route(Method::POST, "/wake_up", &["tags"], post(wake_up)),
            route(Method::GET, "/is_sleeping", &[], get(is_sleeping)),
            route(Method::POST, "/collective_rpc", &[], post(collective_rpc)),
        ]);
    }
    routes
}

/// The `(method, path)` pairs `config` registers (what `/openapi.json` lists).
pub fn registered(config: &Config) -> Vec<(Method, &'static str)> {
    routes(config)
        .into_iter()
        .map(|route| (route.method, route.path))
        .collect()
}

/// The vLLM router for one engine. `/metrics` and `/openapi.json` are mounted beside the API
/// routes, as in vLLM, so they are not listed in the OpenAPI paths.
pub fn router(engine: Arc<Engine>) -> Router {
    let config = engine.config().clone();
    let style = config.error_style;
    let routes = routes(&config);
    let openapi = openapi(&routes);
    let mut api = Router::new();
    for route in routes {
        api = api.route(route.path, route.handler);
    }
    api.route("/metrics", get(metrics_text))
        .route(
            "/openapi.json",
            get(move || async move { axum::Json(openapi).into_response() }),
        )
        .method_not_allowed_fallback(move || async move { errors::method_not_allowed(style) })
        .fallback(move || async move { errors::not_found(style) })
        .with_state(engine)
}

fn openapi(routes: &[Route]) -> Value {
    let mut paths = Map::new();
    for route in routes {
        let parameters: Vec<Value> = route
            .params
            .iter()
            .map(|name| {
                let schema = match *name {
                    "mode" => json!({"type": "string", "enum": ["abort", "wait", "keep"], "default": "abort"}),
                    "tags" => json!({"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]}),
                    "level" => json!({"type": "string", "default": "1"}),
                    "clear_cache" => json!({"type": "boolean", "default": true}),
                    _ => json!({"type": "boolean", "default": false}),
                };
                json!({"name": name, "in": "query", "required": false, "schema": schema})
            })
            .collect();
        let operation_id = format!(
            "{}_{}_{}",
            route.path.trim_start_matches('/').replace('/', "_"),
            route.path.trim_start_matches('/').replace('/', "_"),
            route.method.as_str().to_lowercase()
        );
        let mut operation = json!({
            "summary": route.path.trim_start_matches('/'),
            "operationId": operation_id,
            "responses": {"200": {"description": "Successful Response", "content": {"application/json": {"schema": {}}}}},
        });
        if !parameters.is_empty() {
            operation["parameters"] = Value::Array(parameters);
        }
        let entry = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| json!({}));
        entry[route.method.as_str().to_lowercase()] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "FastAPI", "version": "0.1.0"},
        "paths": paths,
    })
}

async fn health(State(engine): State<Arc<Engine>>) -> Response {
    let snapshot = engine.snapshot();
    let draining =
        snapshot.phase == Phase::ShuttingDown && engine.config().unhealthy_while_draining;
    if snapshot.engine_dead || draining {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

async fn version(State(engine): State<Arc<Engine>>) -> Response {
    axum::Json(json!({ "version": engine.config().version() })).into_response()
}

async fn load(State(engine): State<Arc<Engine>>) -> Response {
    axum::Json(json!({ "server_load": engine.snapshot().server_load })).into_response()
}

async fn metrics_text(State(engine): State<Arc<Engine>>) -> Response {
    let body = metrics::render(engine.config(), &engine.snapshot());
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response()
}

/// The last value of a query parameter, as Starlette's `query_params.get` returns it.
fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .rev()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

/// Pydantic's lax boolean parsing of query strings.
fn parse_bool(
    style: ErrorStyle,
    params: &[(String, String)],
    name: &'static str,
    default: bool,
) -> Result<bool, Response> {
    let Some(value) = param(params, name) else {
        return Ok(default);
    };
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Ok(true),
        "0" | "false" | "f" | "no" | "n" | "off" => Ok(false),
        _ => Err(errors::validation(
            style,
            &Invalid {
                kind: "bool_parsing",
                loc: ["query", name],
                msg: "Input should be a valid boolean, unable to interpret input".to_owned(),
                input: Value::String(value.to_owned()),
            },
        )),
    }
}

fn parse_mode(style: ErrorStyle, params: &[(String, String)]) -> Result<PauseMode, Response> {
    match param(params, "mode") {
        None | Some("abort") => Ok(PauseMode::Abort),
        Some("wait") => Ok(PauseMode::Wait),
        Some("keep") => Ok(PauseMode::Keep),
        Some(other) => Err(errors::validation(
            style,
            &Invalid {
                kind: "enum",
                loc: ["query", "mode"],
                msg: "Input should be 'abort', 'wait' or 'keep'".to_owned(),
                input: Value::String(other.to_owned()),
            },
        )),
    }
}

/// `POST /pause`. v0.14 takes `wait_for_inflight_requests` (unknown `mode` ignored, so it
/// aborts by default); later releases take `mode`.
async fn pause(State(engine): State<Arc<Engine>>, Query(params): Params) -> Response {
    let config = engine.config();
    let style = config.error_style;
    let clear_cache = match parse_bool(style, &params, "clear_cache", true) {
        Ok(clear) => clear,
        Err(response) => return response,
    };
    let mode = if config.profile == Profile::V0_14 {
        match parse_bool(style, &params, "wait_for_inflight_requests", false) {
            Ok(true) => PauseMode::Wait,
            Ok(false) => PauseMode::Abort,
            Err(response) => return response,
        }
    } else {
        match parse_mode(style, &params) {
            Ok(mode) => mode,
            Err(response) => return response,
        }
    };
    engine.pause(mode, clear_cache).await;
    axum::Json(json!({"status": "paused"})).into_response()
}

async fn resume(State(engine): State<Arc<Engine>>) -> Response {
    engine.resume();
    axum::Json(json!({"status": "resumed"})).into_response()
}

async fn is_paused(State(engine): State<Arc<Engine>>) -> Response {
    let paused = engine.snapshot().pause_mode.is_some();
    axum::Json(json!({ "is_paused": paused })).into_response()
}

/// `POST /abort_requests {"request_ids": [...]}`; empty or missing aborts everything.
async fn abort_requests(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    let style = engine.config().error_style;
    let request = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(value) => value,
            Err(_) => {
                return errors::http_exception(
                    style,
                    StatusCode::BAD_REQUEST,
                    "Invalid JSON format",
                );
            }
        }
    };
    let Some(request) = request.as_object() else {
        return errors::http_exception(
            style,
            StatusCode::BAD_REQUEST,
            "Request body must be a JSON object",
        );
    };
    let ids: Vec<u64> = request
        .get("request_ids")
        .and_then(Value::as_array)
        .map(|ids| {
            ids.iter()
                .filter_map(Value::as_str)
                .filter_map(engine_id)
                .collect()
        })
        .unwrap_or_default();
    let everything = request
        .get("request_ids")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    let aborted = engine.abort(if everything { None } else { Some(&ids) });
    axum::Json(json!({"status": "aborted", "aborted": aborted})).into_response()
}

/// The engine id inside an OpenAI request id such as `cmpl-<hex>` or `chatcmpl-<hex>-0`.
fn engine_id(request_id: &str) -> Option<u64> {
    let hex = request_id.split('-').nth(1)?;
    u64::from_str_radix(hex, 16).ok()
}

fn parse_tags(params: &[(String, String)]) -> Result<Vec<SleepTag>, Response> {
    params
        .iter()
        .filter(|(key, _)| key == "tags")
        .map(|(_, value)| match value.as_str() {
            "weights" => Ok(SleepTag::Weights),
            "kv_cache" => Ok(SleepTag::KvCache),
            // An unknown tag reaches the engine and raises there.
            _ => Err(errors::internal_server_error()),
        })
        .collect()
}

/// `POST /sleep?level=`; the newest releases also take `mode` and `tags`. An unknown parameter
/// (such as `sleep_level`) is ignored, so the sleep happens at the default level 1.
async fn sleep(State(engine): State<Arc<Engine>>, Query(params): Params) -> Response {
    let config = engine.config();
    let Ok(level) = param(&params, "level").unwrap_or("1").parse::<u8>() else {
        return errors::internal_server_error();
    };
    let (mode, tags) = if config.profile == Profile::Latest {
        let mode = match parse_mode(config.error_style, &params) {
            Ok(mode) => mode,
            Err(response) => return response,
        };
        match parse_tags(&params) {
            Ok(tags) => (mode, tags),
            Err(response) => return response,
        }
    } else {
        (PauseMode::Abort, Vec::new())
    };
    match engine.sleep(level, &tags, mode).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(_) => errors::internal_server_error(),
    }
}

async fn wake_up(State(engine): State<Arc<Engine>>, Query(params): Params) -> Response {
    match parse_tags(&params) {
        Ok(tags) => {
            engine.wake(&tags).await;
            StatusCode::OK.into_response()
        }
        Err(response) => response,
    }
}

async fn is_sleeping(State(engine): State<Arc<Engine>>) -> Response {
    let sleeping = engine.snapshot().sleep_level.is_some();
    axum::Json(json!({ "is_sleeping": sleeping })).into_response()
}

async fn reset_prefix_cache(State(engine): State<Arc<Engine>>) -> Response {
    engine.reset_prefix_cache();
    StatusCode::OK.into_response()
}

/// `POST /collective_rpc {"method": ...}`: `reload_weights` is the one the wake-up sequence
/// needs; an unknown method raises in the workers.
async fn collective_rpc(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    let style = engine.config().error_style;
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return errors::http_exception(style, StatusCode::BAD_REQUEST, "JSON decode error");
    };
    match request.get("method").and_then(Value::as_str) {
        None => errors::http_exception(
            style,
            StatusCode::BAD_REQUEST,
            "Missing 'method' in request body",
        ),
        Some("reload_weights") => {
            engine.reload_weights();
            axum::Json(json!({"results": [null]})).into_response()
        }
        Some(_) => errors::internal_server_error(),
    }
}
