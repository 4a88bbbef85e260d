//! The OpenAI-compatible routes (`/v1/completions`, `/v1/chat/completions`, `/v1/models`,
//! `/tokenize`): request shapes, the JSON and SSE response shapes vLLM returns, and a word-level
//! stand-in tokenizer. A client that disconnects aborts its request, as in vLLM.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures::stream;
use http::{StatusCode, header};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::config::ErrorStyle;
use crate::engine::{Engine, FinishReason, GenEvent, LoadGuard};
use crate::errors::{self, Invalid};

const BOS: u32 = 128_000;
const HEADER_START: u32 = 128_006;
const HEADER_END: u32 = 128_007;
const END_OF_TURN: u32 = 128_009;

/// Token ids for `text`: one per whitespace-separated word, stable across calls, after a BOS
/// token when `special` is set.
pub fn encode_text(text: &str, special: bool) -> Vec<u32> {
    let mut tokens: Vec<u32> = special.then_some(BOS).into_iter().collect();
    tokens.extend(text.split_whitespace().map(word_id));
    tokens
}

/// Token ids of a chat rendered with a Llama-3-like template.
fn encode_chat(messages: &[(String, String)], generation_prompt: bool) -> Vec<u32> {
    let mut tokens = vec![BOS];
    for (role, content) in messages {
        tokens.extend([HEADER_START, word_id(role), HEADER_END]);
        tokens.extend(content.split_whitespace().map(word_id));
        tokens.push(END_OF_TURN);
    }
    if generation_prompt {
        tokens.extend([HEADER_START, word_id("assistant"), HEADER_END]);
    }
    tokens
}

/// FNV-1a of the word, folded into the ordinary part of a 128k vocabulary.
fn word_id(word: &str) -> u32 {
    let hash = word.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    1000 + hash % 127_000
}

/// vLLM's `created` fields are wall-clock seconds.
#[allow(clippy::disallowed_methods)] // a test double imitating vLLM, not the pure core
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// `GET /v1/models`.
pub async fn models(State(engine): State<Arc<Engine>>) -> Response {
    let config = engine.config();
    let created = unix_now();
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": config.model,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": config.model,
            "parent": null,
            "max_model_len": config.max_model_len,
            "permission": [{
                "id": format!("modelperm-{created:032x}"),
                "object": "model_permission",
                "created": created,
                "allow_create_engine": false,
                "allow_sampling": true,
                "allow_logprobs": true,
                "allow_search_indices": false,
                "allow_view": true,
                "allow_fine_tuning": false,
                "organization": "*",
                "group": null,
                "is_blocking": false
            }]
        }]
    }))
    .into_response()
}

/// `POST /tokenize`: `{"prompt": ...}` or `{"messages": [...]}`.
pub async fn tokenize(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    let config = engine.config();
    let request = match parse_object(config.error_style, &body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    let tokens = if request.contains_key("messages") {
        let messages = match chat_messages(config.error_style, &request) {
            Ok(messages) => messages,
            Err(response) => return response,
        };
        let generation_prompt = request
            .get("add_generation_prompt")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        encode_chat(&messages, generation_prompt)
    } else {
        let Some(prompt) = request.get("prompt").and_then(Value::as_str) else {
            return missing(config.error_style, "prompt", &request);
        };
        let special = request
            .get("add_special_tokens")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        encode_text(prompt, special)
    };
    axum::Json(json!({
        "count": tokens.len(),
        "max_model_len": config.max_model_len,
        "tokens": tokens,
        "token_strs": null,
    }))
    .into_response()
}

/// Which OpenAI endpoint a generation came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

/// `POST /v1/completions`.
pub async fn completions(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    let style = engine.config().error_style;
    let request = match parse_object(style, &body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    if let Err(response) = check_model(&engine, &request) {
        return response;
    }
    let prompt_tokens = match request.get("prompt") {
        Some(Value::String(text)) => encode_text(text, true).len(),
        Some(Value::Array(ids)) if ids.iter().all(|id| id.as_u64().is_some()) => ids.len(),
        Some(other) => {
            return errors::validation(
                style,
                &Invalid {
                    kind: "string_type",
                    loc: ["body", "prompt"],
                    msg: "Input should be a valid string or a list of token ids".to_owned(),
                    input: other.clone(),
                },
            );
        }
        None => return missing(style, "prompt", &request),
    };
    let max_tokens = match max_tokens(&request, &["max_tokens"], 16) {
        Ok(max) => max,
        Err(response) => return response,
    };
    generate(
        engine,
        Kind::Completion,
        &request,
        prompt_tokens,
        max_tokens,
    )
    .await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    let style = engine.config().error_style;
    let request = match parse_object(style, &body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    if let Err(response) = check_model(&engine, &request) {
        return response;
    }
    let messages = match chat_messages(style, &request) {
        Ok(messages) => messages,
        Err(response) => return response,
    };
    let prompt_tokens = encode_chat(&messages, true).len();
    let room = (engine.config().max_model_len as usize).saturating_sub(prompt_tokens);
    let default = u32::try_from(room).unwrap_or(u32::MAX).max(1);
    let max_tokens = match max_tokens(&request, &["max_completion_tokens", "max_tokens"], default) {
        Ok(max) => max,
        Err(response) => return response,
    };
    generate(engine, Kind::Chat, &request, prompt_tokens, max_tokens).await
}

fn parse_object(style: ErrorStyle, body: &[u8]) -> Result<Map<String, Value>, Response> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => Err(errors::validation(
            style,
            &Invalid {
                kind: "model_attributes_type",
                loc: ["body", "0"],
                msg: "Input should be a valid dictionary or object to extract fields from"
                    .to_owned(),
                input: other,
            },
        )),
        Err(error) => Err(errors::validation(
            style,
            &Invalid {
                kind: "json_invalid",
                loc: ["body", "0"],
                msg: "JSON decode error".to_owned(),
                input: json!({ "error": error.to_string() }),
            },
        )),
    }
}

fn missing(style: ErrorStyle, field: &'static str, request: &Map<String, Value>) -> Response {
    errors::validation(
        style,
        &Invalid {
            kind: "missing",
            loc: ["body", field],
            msg: "Field required".to_owned(),
            input: Value::Object(request.clone()),
        },
    )
}

/// vLLM answers 404 with an OpenAI error for a model it does not serve.
fn check_model(engine: &Engine, request: &Map<String, Value>) -> Result<(), Response> {
    match request.get("model").and_then(Value::as_str) {
        Some(model) if model != engine.config().model => Err(errors::openai(
            StatusCode::NOT_FOUND,
            &format!("The model `{model}` does not exist."),
            "NotFoundError",
            Some("model"),
        )),
        _ => Ok(()),
    }
}

fn chat_messages(
    style: ErrorStyle,
    request: &Map<String, Value>,
) -> Result<Vec<(String, String)>, Response> {
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return Err(missing(style, "messages", request));
    };
    Ok(messages
        .iter()
        .map(|message| {
            let role = message
                .get("role")
                .and_then(Value::as_str)
                .unwrap_or("user")
                .to_owned();
            let content = match message.get("content") {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|part| part.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(" "),
                _ => String::new(),
            };
            (role, content)
        })
        .collect())
}

fn max_tokens(
    request: &Map<String, Value>,
    fields: &[&str],
    default: u32,
) -> Result<u32, Response> {
    let Some((field, value)) = fields.iter().find_map(|field| {
        request
            .get(*field)
            .filter(|v| !v.is_null())
            .map(|v| (*field, v))
    }) else {
        return Ok(default);
    };
    match value.as_u64().and_then(|max| u32::try_from(max).ok()) {
        Some(max) if max >= 1 => Ok(max),
        _ => Err(errors::openai(
            StatusCode::BAD_REQUEST,
            &format!("{field} must be at least 1, got {value}."),
            "BadRequestError",
            None,
        )),
    }
}

/// Aborts the request in the engine if its consumer goes away before it finished (a client
/// disconnect), and keeps it counted in `/load` meanwhile.
struct InFlight {
    engine: Arc<Engine>,
    id: u64,
    finished: bool,
    _load: LoadGuard,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.finished {
            self.engine.abort(Some(&[self.id]));
        }
    }
}

/// What every chunk and response of one request shares.
struct Meta {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
}

impl Meta {
    fn usage(&self, completion_tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": null,
        })
    }

    fn chunk(&self, choices: &Value, usage: Option<Value>) -> Value {
        let object = match self.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        };
        let mut chunk = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        chunk
    }

    fn delta(&self, text: &str, finish: Option<FinishReason>) -> Value {
        let finish_reason = finish.map(FinishReason::as_str);
        let choice = match self.kind {
            Kind::Completion => json!({
                "index": 0, "text": text, "logprobs": null,
                "finish_reason": finish_reason, "stop_reason": null,
            }),
            Kind::Chat => json!({
                "index": 0, "delta": {"content": text}, "logprobs": null,
                "finish_reason": finish_reason, "stop_reason": null,
            }),
        };
        self.chunk(&json!([choice]), None)
    }

    fn response(&self, text: &str, finish: FinishReason, completion_tokens: usize) -> Value {
        let (object, choice) = match self.kind {
            Kind::Completion => (
                "text_completion",
                json!({
                    "index": 0, "text": text, "logprobs": null,
                    "finish_reason": finish.as_str(), "stop_reason": null,
                    "prompt_logprobs": null,
                }),
            ),
            Kind::Chat => (
                "chat.completion",
                json!({
                    "index": 0,
                    "message": {
                        "role": "assistant", "content": text, "refusal": null,
                        "annotations": null, "audio": null, "function_call": null,
                        "tool_calls": [], "reasoning_content": null,
                    },
                    "logprobs": null, "finish_reason": finish.as_str(), "stop_reason": null,
                }),
            ),
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(completion_tokens),
            "prompt_logprobs": null,
        })
    }
}

async fn generate(
    engine: Arc<Engine>,
    kind: Kind,
    request: &Map<String, Value>,
    prompt_tokens: usize,
    max_tokens: u32,
) -> Response {
    let config = engine.config();
    let requested = prompt_tokens + max_tokens as usize;
    if requested > config.max_model_len as usize {
        return errors::openai(
            StatusCode::BAD_REQUEST,
            &format!(
                "This model's maximum context length is {} tokens. However, you requested {requested} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.",
                config.max_model_len
            ),
            "BadRequestError",
            None,
        );
    }
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    let include_usage = request
        .get("stream_options")
        .and_then(|options| options.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true);

    let load = engine.track_load();
    let admitted = engine
        .admit(u32::try_from(prompt_tokens).unwrap_or(u32::MAX), max_tokens)
        .await;
    let Ok((id, events)) = admitted else {
        return errors::openai(
            StatusCode::SERVICE_UNAVAILABLE,
            "The server is shutting down.",
            "ServiceUnavailableError",
            None,
        );
    };
    let prefix = match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    };
    let meta = Meta {
        kind,
        id: format!("{prefix}-{id:032x}"),
        created: unix_now(),
        model: config.model.clone(),
        prompt_tokens,
    };
    let in_flight = InFlight {
        engine: Arc::clone(&engine),
        id,
        finished: false,
        _load: load,
    };
    if stream {
        sse(meta, events, in_flight, include_usage)
    } else {
        collect(meta, events, in_flight).await
    }
}

async fn collect(
    meta: Meta,
    mut events: mpsc::UnboundedReceiver<GenEvent>,
    mut in_flight: InFlight,
) -> Response {
    let mut text = String::new();
    let mut tokens = 0;
    let finish = loop {
        match events.recv().await {
            Some(GenEvent::Token(token)) => {
                text.push_str(&token);
                tokens += 1;
            }
            Some(GenEvent::Finished(reason)) => break reason,
            None => break FinishReason::Abort,
        }
    };
    in_flight.finished = true;
    axum::Json(meta.response(&text, finish, tokens)).into_response()
}

/// Where a stream is.
enum Step {
    /// Chat streams open with the assistant's role.
    Role,
    Tokens,
    Usage,
    Done,
    Ended,
}

struct StreamState {
    meta: Meta,
    events: mpsc::UnboundedReceiver<GenEvent>,
    in_flight: InFlight,
    include_usage: bool,
    tokens: usize,
    step: Step,
}

fn frame(chunk: &Value) -> Bytes {
    Bytes::from(format!("data: {chunk}\n\n"))
}

/// Server-sent events: `data: {chunk}` per token, a final chunk with `finish_reason`, an
/// optional usage chunk, then `data: [DONE]`.
fn sse(
    meta: Meta,
    events: mpsc::UnboundedReceiver<GenEvent>,
    in_flight: InFlight,
    include_usage: bool,
) -> Response {
    let step = match meta.kind {
        Kind::Chat => Step::Role,
        Kind::Completion => Step::Tokens,
    };
    let state = StreamState {
        meta,
        events,
        in_flight,
        include_usage,
        tokens: 0,
        step,
    };
    let frames = stream::unfold(state, |mut state| async move {
        let bytes = match state.step {
            Step::Role => {
                state.step = Step::Tokens;
                let choice = json!([{
                    "index": 0, "delta": {"role": "assistant", "content": ""},
                    "logprobs": null, "finish_reason": null,
                }]);
                frame(&state.meta.chunk(&choice, None))
            }
            Step::Tokens => match state.events.recv().await {
                Some(GenEvent::Token(token)) => {
                    state.tokens += 1;
                    frame(&state.meta.delta(&token, None))
                }
                finished => {
                    let reason = match finished {
                        Some(GenEvent::Finished(reason)) => reason,
                        _ => FinishReason::Abort,
                    };
                    state.in_flight.finished = true;
                    state.step = if state.include_usage {
                        Step::Usage
                    } else {
                        Step::Done
                    };
                    frame(&state.meta.delta("", Some(reason)))
                }
            },
            Step::Usage => {
                state.step = Step::Done;
                let usage = state.meta.usage(state.tokens);
                frame(&state.meta.chunk(&json!([]), Some(usage)))
            }
            Step::Done => {
                state.step = Step::Ended;
                Bytes::from_static(b"data: [DONE]\n\n")
            }
            Step::Ended => return None,
        };
        Some((Ok::<_, Infallible>(bytes), state))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(frames))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_is_stable_and_counts_words() {
        let tokens = encode_text("hello queue hello", true);
        assert_eq!(tokens.len(), 4);
        assert_eq!(tokens[0], BOS);
        assert_eq!(tokens[1], tokens[3]);
        assert_ne!(tokens[1], tokens[2]);
        assert_eq!(encode_text("hello", false).len(), 1);
    }

    #[test]
    fn chat_template_wraps_each_turn() {
        let tokens = encode_chat(&[("user".to_owned(), "two words".to_owned())], true);
        // BOS, header(3), 2 words, end of turn, assistant header(3)
        assert_eq!(tokens.len(), 10);
    }
}
