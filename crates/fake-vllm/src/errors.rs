//! Error responses shaped as vLLM's are: framework errors follow the configured
//! [`ErrorStyle`]; serving errors are OpenAI objects; the dev routes' own failures are
//! `{"error": "..."}`; unhandled exceptions are Starlette's plain-text 500.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use serde_json::{Value, json};

use crate::config::ErrorStyle;

/// An OpenAI error object, as vLLM's serving layer returns for unknown models, bad prompts and
/// the like, whatever the error style.
pub fn openai(status: StatusCode, message: &str, kind: &str, param: Option<&str>) -> Response {
    let body = json!({
        "error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}
    });
    (status, axum::Json(body)).into_response()
}

/// An `HTTPException(status, detail)`: FastAPI's `{"detail": ...}`, or vLLM's handler's OpenAI
/// object whose type is the status phrase.
pub fn http_exception(style: ErrorStyle, status: StatusCode, detail: &str) -> Response {
    match style {
        ErrorStyle::Fastapi => (status, axum::Json(json!({ "detail": detail }))).into_response(),
        ErrorStyle::Openai => openai(
            status,
            detail,
            status.canonical_reason().unwrap_or("Error"),
            None,
        ),
    }
}

/// Starlette's 404 for a route that is not registered.
pub fn not_found(style: ErrorStyle) -> Response {
    http_exception(style, StatusCode::NOT_FOUND, "Not Found")
}

/// Starlette's 405 for a registered path called with another method.
pub fn method_not_allowed(style: ErrorStyle) -> Response {
    http_exception(style, StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
}

/// One failed field of a request-validation error.
#[derive(Clone, Debug)]
pub struct Invalid {
    /// Pydantic's error type, such as `enum`, `bool_parsing` or `missing`.
    pub kind: &'static str,
    /// Where: `["query", "mode"]`, `["body", "prompt"]`.
    pub loc: [&'static str; 2],
    pub msg: String,
    pub input: Value,
}

/// A `RequestValidationError`: FastAPI answers 422 with the pydantic error list; vLLM's own
/// handler answers 400 with an OpenAI object.
pub fn validation(style: ErrorStyle, invalid: &Invalid) -> Response {
    match style {
        ErrorStyle::Fastapi => {
            let detail = json!([{
                "type": invalid.kind,
                "loc": invalid.loc,
                "msg": invalid.msg,
                "input": invalid.input,
            }]);
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                axum::Json(json!({ "detail": detail })),
            )
                .into_response()
        }
        ErrorStyle::Openai => {
            let message = format!(
                "[{{'type': '{}', 'loc': ('{}', '{}'), 'msg': \"{}\", 'input': {}}}]",
                invalid.kind, invalid.loc[0], invalid.loc[1], invalid.msg, invalid.input
            );
            openai(StatusCode::BAD_REQUEST, &message, "BadRequestError", None)
        }
    }
}

/// An unhandled exception: Starlette's plain-text 500.
pub fn internal_server_error() -> Response {
    Response::builder()
        .status(StatusCode::INTERNAL_SERVER_ERROR)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from("Internal Server Error"))
        .unwrap_or_default()
}

/// The response for an injected `status` fault: what the route's own failure path returns.
pub fn injected(style: ErrorStyle, path: &str, status: StatusCode) -> Response {
    let dev_failure = match path {
        "/pause" => Some("Failed to pause generation"),
        "/resume" => Some("Failed to resume generation"),
        "/is_paused" => Some("Failed to check pause status"),
        "/abort_requests" => Some("Failed to abort requests"),
        _ => None,
    };
    if let Some(what) = dev_failure {
        let body = json!({ "error": format!("{what}: injected fault") });
        return (status, axum::Json(body)).into_response();
    }
    match (path, status) {
        ("/health", _) => status.into_response(),
        (_, StatusCode::INTERNAL_SERVER_ERROR) => internal_server_error(),
        _ => http_exception(
            style,
            status,
            status.canonical_reason().unwrap_or("injected fault"),
        ),
    }
}
