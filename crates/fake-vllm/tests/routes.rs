#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! Routes, status codes and bodies, per profile, dev mode and error style, over real HTTP.

mod common;

use std::collections::BTreeSet;

use common::{Stream, dev, get, metric, post, start};
use gpuqueue_fake_vllm::{Config, ErrorStyle, Profile, registered_routes};
use serde_json::{Value, json};

const ALWAYS: [&str; 7] = [
    "/health",
    "/load",
    "/version",
    "/v1/models",
    "/tokenize",
    "/v1/chat/completions",
    "/v1/completions",
];
const PAUSE: [&str; 3] = ["/pause", "/resume", "/is_paused"];
const SLEEP: [&str; 5] = [
    "/reset_prefix_cache",
    "/sleep",
    "/wake_up",
    "/is_sleeping",
    "/collective_rpc",
];

fn set(groups: &[&[&str]]) -> BTreeSet<String> {
    groups
        .iter()
        .flat_map(|group| group.iter().map(|path| (*path).to_owned()))
        .collect()
}

#[tokio::test]
async fn openapi_lists_exactly_the_routes_each_profile_registers() {
    let cases: [(Profile, bool, BTreeSet<String>); 6] = [
        (
            Profile::Latest,
            true,
            set(&[&ALWAYS, &PAUSE, &SLEEP, &["/abort_requests"]]),
        ),
        (Profile::Latest, false, set(&[&ALWAYS])),
        (Profile::V0_19, true, set(&[&ALWAYS, &PAUSE, &SLEEP])),
        (Profile::V0_19, false, set(&[&ALWAYS])),
        // v0.14 attached the pause router without dev mode.
        (Profile::V0_14, true, set(&[&ALWAYS, &PAUSE, &SLEEP])),
        (Profile::V0_14, false, set(&[&ALWAYS, &PAUSE])),
    ];
    for (index, (profile, dev_mode, expected)) in cases.into_iter().enumerate() {
        let config = Config {
            profile,
            dev_mode,
            ..Config::default()
        };
        let listed: BTreeSet<String> = registered_routes(&config)
            .into_iter()
            .map(|(_, path)| path.to_owned())
            .collect();
        assert_eq!(listed, expected, "{profile:?} dev={dev_mode}");

        let server = start(config, 1, u8::try_from(index + 1).unwrap()).await;
        let openapi = get(&server, "/openapi.json").await.json();
        let paths: BTreeSet<String> = openapi["paths"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(paths, expected, "{profile:?} dev={dev_mode}");
        for path in set(&[&PAUSE, &SLEEP, &["/abort_requests"]]).difference(&expected) {
            let answer = post(&server, path, None).await;
            assert_eq!(answer.status, 404, "{path} on {profile:?} dev={dev_mode}");
            assert_eq!(answer.json(), json!({"detail": "Not Found"}));
        }
        server.stop();
    }
}

#[tokio::test]
async fn openapi_documents_each_profiles_pause_parameters() {
    let names = |openapi: &Value, path: &str| -> Vec<String> {
        openapi["paths"][path]["post"]["parameters"]
            .as_array()
            .map(|parameters| {
                parameters
                    .iter()
                    .map(|parameter| parameter["name"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let latest = start(dev(), 2, 1).await;
    let openapi = get(&latest, "/openapi.json").await.json();
    assert_eq!(names(&openapi, "/pause"), ["mode", "clear_cache"]);
    assert_eq!(names(&openapi, "/sleep"), ["level", "mode", "tags"]);

    let old = start(
        Config {
            profile: Profile::V0_14,
            ..dev()
        },
        2,
        2,
    )
    .await;
    let openapi = get(&old, "/openapi.json").await.json();
    assert_eq!(
        names(&openapi, "/pause"),
        ["wait_for_inflight_requests", "clear_cache"]
    );
    assert_eq!(names(&openapi, "/sleep"), ["level"]);
}

#[tokio::test]
async fn framework_errors_follow_the_error_style() {
    let fastapi = start(dev(), 3, 1).await;
    let openai = start(
        Config {
            error_style: ErrorStyle::Openai,
            ..dev()
        },
        3,
        2,
    )
    .await;

    let answer = post(&fastapi, "/pause?mode=sideways", None).await;
    assert_eq!(answer.status, 422);
    let detail = &answer.json()["detail"][0];
    assert_eq!(detail["type"], "enum");
    assert_eq!(detail["loc"], json!(["query", "mode"]));
    assert_eq!(detail["input"], "sideways");

    let answer = post(&openai, "/pause?mode=sideways", None).await;
    assert_eq!(answer.status, 400);
    let error = &answer.json()["error"];
    assert_eq!(error["type"], "BadRequestError");
    assert_eq!(error["code"], 400);
    assert!(error["message"].as_str().unwrap().contains("mode"));

    let answer = post(&fastapi, "/pause?clear_cache=maybe", None).await;
    assert_eq!(answer.status, 422);
    assert_eq!(answer.json()["detail"][0]["type"], "bool_parsing");

    let answer = get(&openai, "/no/such/route").await;
    assert_eq!(answer.status, 404);
    assert_eq!(
        answer.json(),
        json!({"error": {"message": "Not Found", "type": "Not Found", "param": null, "code": 404}})
    );

    let answer = get(&fastapi, "/pause").await;
    assert_eq!(answer.status, 405);
    assert_eq!(answer.json(), json!({"detail": "Method Not Allowed"}));
    let answer = get(&openai, "/pause").await;
    assert_eq!(answer.status, 405);
    assert_eq!(answer.json()["error"]["code"], 405);

    // Nothing invalid paused anything.
    assert_eq!(
        get(&fastapi, "/is_paused").await.json(),
        json!({"is_paused": false})
    );
}

#[tokio::test]
async fn info_routes_answer_with_vllms_bodies() {
    let server = start(
        Config {
            model: "Qwen/Qwen2.5-7B".to_owned(),
            max_model_len: 4096,
            ..dev()
        },
        4,
        1,
    )
    .await;

    let health = get(&server, "/health").await;
    assert_eq!((health.status, health.body.as_str()), (200, ""));
    assert_eq!(
        get(&server, "/version").await.json(),
        json!({"version": "0.32.0"})
    );
    assert_eq!(
        get(&server, "/load").await.json(),
        json!({"server_load": 0})
    );

    let models = get(&server, "/v1/models").await.json();
    assert_eq!(models["object"], "list");
    let model = &models["data"][0];
    assert_eq!(model["id"], "Qwen/Qwen2.5-7B");
    assert_eq!(model["object"], "model");
    assert_eq!(model["owned_by"], "vllm");
    assert_eq!(model["root"], "Qwen/Qwen2.5-7B");
    assert_eq!(model["parent"], Value::Null);
    assert_eq!(model["max_model_len"], 4096);

    let tokens = post(
        &server,
        "/tokenize",
        Some(r#"{"prompt": "three small words"}"#),
    )
    .await
    .json();
    assert_eq!(tokens["count"], 4, "BOS plus three words: {tokens}");
    assert_eq!(tokens["max_model_len"], 4096);
    assert_eq!(tokens["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(tokens["token_strs"], Value::Null);

    let version = start(
        Config {
            profile: Profile::V0_19,
            vllm_version: Some("0.19.1".into()),
            ..dev()
        },
        4,
        2,
    )
    .await;
    assert_eq!(
        get(&version, "/version").await.json(),
        json!({"version": "0.19.1"})
    );
}

#[tokio::test]
async fn completions_answer_in_openai_shapes() {
    let server = start(dev(), 5, 1).await;

    let completion = post(
        &server,
        "/v1/completions",
        Some(r#"{"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hello there", "max_tokens": 5}"#),
    )
    .await;
    assert_eq!(completion.status, 200);
    let completion = completion.json();
    assert!(completion["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(completion["object"], "text_completion");
    let choice = &completion["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["text"], " the queue hands borrowed GPUs");
    assert_eq!(
        completion["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8, "prompt_tokens_details": null})
    );

    // Token ids are a prompt too (what a router resubmits).
    let by_ids = post(
        &server,
        "/v1/completions",
        Some(r#"{"prompt": [1, 2, 3, 4], "max_tokens": 2}"#),
    )
    .await
    .json();
    assert_eq!(by_ids["usage"]["prompt_tokens"], 4);

    let chat = post(
        &server,
        "/v1/chat/completions",
        Some(r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}"#),
    )
    .await
    .json();
    assert!(chat["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    // The default natural length (64 tokens) ends the text before max_tokens.
    assert_eq!(chat["choices"][0]["finish_reason"], "stop");
    assert_eq!(chat["usage"]["completion_tokens"], 64);
}

#[tokio::test]
async fn bad_completion_requests_are_refused_as_vllm_refuses_them() {
    let server = start(
        Config {
            max_model_len: 32,
            ..dev()
        },
        6,
        1,
    )
    .await;

    let unknown = post(
        &server,
        "/v1/completions",
        Some(r#"{"model": "gpt-9", "prompt": "x"}"#),
    )
    .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.json(),
        json!({"error": {"message": "The model `gpt-9` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}})
    );

    let too_long = post(
        &server,
        "/v1/completions",
        Some(r#"{"prompt": "x", "max_tokens": 40}"#),
    )
    .await;
    assert_eq!(too_long.status, 400);
    let message = too_long.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("maximum context length is 32 tokens"),
        "{message}"
    );

    let missing = post(&server, "/v1/completions", Some(r#"{"max_tokens": 4}"#)).await;
    assert_eq!(missing.status, 422);
    assert_eq!(
        missing.json()["detail"][0]["loc"],
        json!(["body", "prompt"])
    );

    let not_json = post(&server, "/v1/chat/completions", Some("{oops")).await;
    assert_eq!(not_json.status, 422);
    assert_eq!(not_json.json()["detail"][0]["type"], "json_invalid");

    let zero = post(
        &server,
        "/v1/completions",
        Some(r#"{"prompt": "x", "max_tokens": 0}"#),
    )
    .await;
    assert_eq!(zero.status, 400);
    assert_eq!(zero.json()["error"]["type"], "BadRequestError");
}

#[tokio::test]
async fn streams_are_server_sent_events_ending_with_done() {
    let server = start(dev(), 7, 1).await;

    let mut stream = Stream::open(
        &server,
        "/v1/completions",
        r#"{"prompt": "a b", "max_tokens": 3, "stream": true}"#,
    )
    .await;
    let frames = stream.rest().await;
    assert_eq!(
        frames.len(),
        5,
        "3 tokens, the finish chunk, [DONE]: {frames:#?}"
    );
    let tokens: Vec<Value> = frames[..3]
        .iter()
        .map(|frame| serde_json::from_str(frame).unwrap())
        .collect();
    assert!(
        tokens
            .iter()
            .all(|chunk| chunk["object"] == "text_completion")
    );
    assert!(
        tokens
            .iter()
            .all(|chunk| chunk["choices"][0]["finish_reason"].is_null())
    );
    let finish: Value = serde_json::from_str(&frames[3]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(frames[4], "[DONE]");

    let mut chat = Stream::open(
        &server,
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}}"#,
    )
    .await;
    let frames = chat.rest().await;
    let first: Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let usage: Value = serde_json::from_str(&frames[frames.len() - 2]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 2);
    assert_eq!(frames.last().unwrap(), "[DONE]");
}

#[tokio::test]
async fn metrics_use_vllms_names_labels_and_content_type() {
    let config = Config {
        kv_offload: true,
        model: "m".to_owned(),
        ..dev()
    };
    let server = start(config, 8, 1).await;
    post(
        &server,
        "/v1/completions",
        Some(r#"{"prompt": "a b c", "max_tokens": 3}"#),
    )
    .await;

    let answer = get(&server, "/metrics").await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.content_type,
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = &answer.body;
    let base = r#"engine="0",model_name="m""#;
    assert_eq!(metric(text, "vllm:num_requests_running", base), "0.0");
    assert_eq!(metric(text, "vllm:num_requests_waiting", base), "0.0");
    assert_eq!(metric(text, "vllm:kv_cache_usage_perc", base), "0.0");
    assert_eq!(
        metric(text, "vllm:engine_sleep_state", r#"sleep_state="awake""#),
        "1.0"
    );
    assert_eq!(
        metric(
            text,
            "vllm:engine_sleep_state",
            r#"sleep_state="weights_offloaded""#
        ),
        "0.0"
    );
    assert_eq!(
        metric(
            text,
            "vllm:engine_sleep_state",
            r#"sleep_state="discard_all""#
        ),
        "0.0"
    );
    assert_eq!(metric(text, "vllm:prompt_tokens_total", base), "4.0");
    assert_eq!(metric(text, "vllm:generation_tokens_total", base), "3.0");
    assert_eq!(
        metric(
            text,
            "vllm:request_success_total",
            r#"finished_reason="length""#
        ),
        "1.0"
    );
    metric(
        text,
        "vllm:kv_offload_total_bytes_total",
        r#"transfer_type="GPU_to_CPU""#,
    );
    metric(
        text,
        "vllm:kv_offload_total_time_total",
        r#"transfer_type="GPU_to_CPU""#,
    );
    assert_eq!(
        metric(text, "vllm:cache_config_info", r#"block_size="16""#),
        "1.0"
    );
    assert!(text.contains("# TYPE vllm:num_requests_running gauge"));
    assert!(text.contains("# TYPE vllm:request_success_total counter"));

    // Without sleep mode or offloading those families are absent, as upstream.
    let plain = start(Config::default(), 8, 2).await;
    let text = get(&plain, "/metrics").await.body;
    assert!(!text.contains("vllm:engine_sleep_state"));
    assert!(!text.contains("vllm:kv_offload_total_bytes_total"));
}
