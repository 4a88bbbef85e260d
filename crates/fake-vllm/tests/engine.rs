#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The state machine behind the routes: pause modes, held requests, abort lag, sleep levels and
//! the wake-up sequence, client disconnects, shutdown. Over real HTTP.

mod common;

use std::time::Duration;

use common::{Stream, dev, eventually, get, metric, post, start};
use gpuqueue_fake_vllm::{Config, Phase, Profile, Weights};
use serde_json::{Value, json};

fn slow_request(max_tokens: u32) -> String {
    json!({"prompt": "borrowed capacity", "max_tokens": max_tokens, "stream": true}).to_string()
}

#[tokio::test]
async fn pause_abort_ends_streams_with_abort_and_the_gauges_lag() {
    let config = Config {
        abort_lag: Duration::from_millis(800),
        ..dev()
    };
    let server = start(config, 20, 1).await;
    let mut stream = Stream::open(&server, "/v1/completions", &slow_request(8000)).await;
    let first: Value = serde_json::from_str(&stream.next().await.unwrap()).unwrap();
    assert!(first["choices"][0]["finish_reason"].is_null());

    let paused = post(&server, "/pause?mode=abort", None).await;
    assert_eq!(
        (paused.status, paused.json()),
        (200, json!({"status": "paused"}))
    );

    // The engine has not caught up yet: the request still counts as running.
    let text = get(&server, "/metrics").await.body;
    assert_eq!(metric(&text, "vllm:num_requests_running", "engine"), "1.0");

    let frames = stream.rest().await;
    let finish: Value = serde_json::from_str(&frames[frames.len() - 2]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "abort");
    assert_eq!(frames.last().unwrap(), "[DONE]");

    eventually(|| server.snapshot().running == 0).await;
    assert_eq!(
        get(&server, "/is_paused").await.json(),
        json!({"is_paused": true})
    );
    assert_eq!(server.snapshot().finished_abort, 1);
}

#[tokio::test]
async fn non_streaming_requests_get_their_partial_output_on_abort() {
    let server = start(dev(), 20, 2).await;
    let request = tokio::spawn({
        let url = server.url("/v1/completions");
        async move { common::call("POST", &url, Some(r#"{"prompt": "x", "max_tokens": 8000}"#)).await }
    });
    eventually(|| server.snapshot().generation_tokens_total >= 2).await;

    post(&server, "/pause", None).await;

    let answer = request.await.unwrap().json();
    assert_eq!(answer["choices"][0]["finish_reason"], "abort");
    assert!(answer["usage"]["completion_tokens"].as_u64().unwrap() >= 2);
    assert!(
        answer["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(" the queue")
    );
}

#[tokio::test]
async fn requests_while_paused_are_held_until_resume() {
    let server = start(dev(), 20, 3).await;
    post(&server, "/pause?mode=abort", None).await;

    let request = tokio::spawn({
        let url = server.url("/v1/completions");
        async move { common::call("POST", &url, Some(r#"{"prompt": "x", "max_tokens": 3}"#)).await }
    });
    eventually(|| server.snapshot().server_load == 1).await;
    let held = server.snapshot();
    assert_eq!(
        (held.running, held.waiting),
        (0, 0),
        "held at the door, not in the engine"
    );
    assert!(!request.is_finished());

    let resumed = post(&server, "/resume", None).await;
    assert_eq!(resumed.json(), json!({"status": "resumed"}));
    let answer = request.await.unwrap().json();
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    assert_eq!(
        get(&server, "/is_paused").await.json(),
        json!({"is_paused": false})
    );
}

#[tokio::test]
async fn pause_wait_answers_once_in_flight_requests_finished() {
    let server = start(dev(), 20, 4).await;
    server.add_load(3, 8, 20);
    eventually(|| server.snapshot().running == 3).await;

    let paused = post(&server, "/pause?mode=wait", None).await;

    assert_eq!(paused.status, 200);
    let state = server.snapshot();
    assert_eq!((state.running, state.waiting), (0, 0));
    assert_eq!(state.finished_length, 3);
    assert_eq!(state.finished_abort, 0);
}

#[tokio::test]
async fn pause_keep_freezes_requests_and_resume_continues_them() {
    let server = start(dev(), 20, 5).await;
    server.add_load(2, 8, 1_000_000);
    eventually(|| server.snapshot().running == 2).await;

    post(&server, "/pause?mode=keep&clear_cache=false", None).await;
    let before = server.snapshot();
    let frozen = before.generation_tokens_total;
    // Five engine steps, each of which would decode a token of every request it runs.
    eventually(|| server.snapshot().steps >= before.steps + 5).await;

    let state = server.snapshot();
    assert_eq!(
        state.generation_tokens_total, frozen,
        "frozen requests make no progress"
    );
    assert_eq!(state.running, 2, "and keep their place in the batch");
    assert!(state.kv_cache_usage > 0.0, "with their KV on the GPU");

    post(&server, "/resume", None).await;
    eventually(|| server.snapshot().generation_tokens_total > frozen).await;
    assert_eq!(server.snapshot().finished_abort, 0);
}

#[tokio::test]
async fn keep_with_clear_cache_preempts_on_v0_19_and_is_ignored_on_latest() {
    let old = start(
        Config {
            profile: Profile::V0_19,
            ..dev()
        },
        20,
        6,
    )
    .await;
    let new = start(dev(), 20, 7).await;
    for server in [&old, &new] {
        server.add_load(2, 8, 1_000_000);
        eventually(|| server.snapshot().running == 2).await;
        post(server, "/pause?mode=keep&clear_cache=true", None).await;
    }

    let old = old.snapshot();
    assert_eq!((old.running, old.waiting, old.preemptions_total), (0, 2, 2));
    let new = new.snapshot();
    assert_eq!((new.running, new.waiting, new.preemptions_total), (2, 0, 0));
}

#[tokio::test]
async fn v0_14_ignores_mode_and_waits_only_through_its_own_parameter() {
    let server = start(
        Config {
            profile: Profile::V0_14,
            ..Config::default()
        },
        20,
        8,
    )
    .await;
    server.add_load(1, 8, 1_000_000);
    eventually(|| server.snapshot().running == 1).await;

    // `mode` is unknown to v0.14, so its default (abort) applies.
    post(&server, "/pause?mode=keep", None).await;
    assert_eq!(server.snapshot().finished_abort, 1);

    post(&server, "/resume", None).await;
    server.add_load(2, 8, 10);
    eventually(|| server.snapshot().running == 2).await;
    post(&server, "/pause?wait_for_inflight_requests=true", None).await;
    let state = server.snapshot();
    assert_eq!(
        (state.finished_abort, state.finished_length, state.running),
        (1, 2, 0)
    );
}

#[tokio::test]
async fn abort_requests_takes_ids_or_everything_and_refuses_bad_bodies() {
    let server = start(dev(), 20, 9).await;

    let answer = post(&server, "/abort_requests", Some("{not json")).await;
    assert_eq!(
        (answer.status, answer.json()),
        (400, json!({"detail": "Invalid JSON format"}))
    );
    let answer = post(&server, "/abort_requests", Some("[1, 2]")).await;
    assert_eq!(
        (answer.status, answer.json()),
        (400, json!({"detail": "Request body must be a JSON object"}))
    );

    let mut stream = Stream::open(&server, "/v1/completions", &slow_request(8000)).await;
    let first: Value = serde_json::from_str(&stream.next().await.unwrap()).unwrap();
    let id = first["id"].as_str().unwrap().to_owned();
    server.add_load(2, 8, 1_000_000);
    eventually(|| server.snapshot().running == 3).await;

    let one = post(
        &server,
        "/abort_requests",
        Some(&json!({"request_ids": [id]}).to_string()),
    )
    .await;
    assert_eq!(one.json(), json!({"status": "aborted", "aborted": 1}));
    let frames = stream.rest().await;
    let finish: Value = serde_json::from_str(&frames[frames.len() - 2]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "abort");

    let rest = post(&server, "/abort_requests", Some("{}")).await;
    assert_eq!(rest.json(), json!({"status": "aborted", "aborted": 2}));
    assert_eq!(
        get(&server, "/is_paused").await.json(),
        json!({"is_paused": false})
    );
}

#[tokio::test]
async fn sleep_needs_sleep_mode_and_a_misspelt_level_sleeps_at_level_1() {
    let no_sleep = start(
        Config {
            dev_mode: true,
            ..Config::default()
        },
        21,
        1,
    )
    .await;
    let answer = post(&no_sleep, "/sleep?level=1", None).await;
    assert_eq!(answer.status, 500);
    assert_eq!(answer.body, "Internal Server Error");
    assert!(answer.content_type.starts_with("text/plain"));

    let server = start(dev(), 21, 2).await;
    server.add_load(1, 8, 1_000_000);
    eventually(|| server.snapshot().running == 1).await;
    let answer = post(&server, "/sleep?sleep_level=2", None).await;
    assert_eq!((answer.status, answer.body.as_str()), (200, ""));

    assert_eq!(
        get(&server, "/is_sleeping").await.json(),
        json!({"is_sleeping": true})
    );
    let text = get(&server, "/metrics").await.body;
    assert_eq!(
        metric(&text, "vllm:engine_sleep_state", r#"sleep_state="awake""#),
        "0.0"
    );
    assert_eq!(
        metric(
            &text,
            "vllm:engine_sleep_state",
            r#"sleep_state="weights_offloaded""#
        ),
        "1.0"
    );
    assert_eq!(
        metric(
            &text,
            "vllm:engine_sleep_state",
            r#"sleep_state="discard_all""#
        ),
        "0.0"
    );
    let state = server.snapshot();
    assert_eq!(state.weights, Weights::Offloaded);
    assert_eq!(
        state.finished_abort, 1,
        "sleep aborts in-flight requests first"
    );

    let answer = post(&server, "/wake_up", None).await;
    assert_eq!((answer.status, answer.body.as_str()), (200, ""));
    assert_eq!(
        get(&server, "/is_sleeping").await.json(),
        json!({"is_sleeping": false})
    );
    assert_eq!(server.snapshot().weights, Weights::Loaded);
    let completion = post(
        &server,
        "/v1/completions",
        Some(r#"{"prompt": "x", "max_tokens": 2}"#),
    )
    .await
    .json();
    assert_eq!(completion["choices"][0]["text"], " the queue");
}

#[tokio::test]
async fn level_2_wake_is_coherent_only_after_the_full_sequence_in_order() {
    let server = start(dev(), 21, 3).await;
    let generate = || async {
        let completion = post(
            &server,
            "/v1/completions",
            Some(r#"{"prompt": "x", "max_tokens": 2}"#),
        )
        .await;
        completion.json()["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned()
    };

    // Out of order: reload while the weights still sleep does nothing.
    post(&server, "/sleep?level=2", None).await;
    assert_eq!(server.snapshot().weights, Weights::Discarded);
    post(
        &server,
        "/collective_rpc",
        Some(r#"{"method": "reload_weights"}"#),
    )
    .await;
    post(&server, "/wake_up", None).await;
    post(&server, "/reset_prefix_cache", None).await;
    assert!(
        generate().await.contains('\u{fffd}'),
        "weights never reloaded"
    );

    // In order: wake weights, reload, wake the cache, reset the prefix cache.
    post(&server, "/sleep?level=2", None).await;
    post(&server, "/wake_up?tags=weights", None).await;
    assert_eq!(
        get(&server, "/is_sleeping").await.json(),
        json!({"is_sleeping": true})
    );
    let reload = post(
        &server,
        "/collective_rpc",
        Some(r#"{"method": "reload_weights"}"#),
    )
    .await;
    assert_eq!(reload.json(), json!({"results": [null]}));
    post(&server, "/wake_up?tags=kv_cache", None).await;
    let reset = post(&server, "/reset_prefix_cache", None).await;
    assert_eq!((reset.status, reset.body.as_str()), (200, ""));
    assert_eq!(generate().await, " the queue");

    let missing = post(&server, "/collective_rpc", Some("{}")).await;
    assert_eq!(
        (missing.status, missing.json()),
        (400, json!({"detail": "Missing 'method' in request body"}))
    );
    assert_eq!(
        post(&server, "/collective_rpc", Some(r#"{"method": "nope"}"#))
            .await
            .status,
        500
    );
}

#[tokio::test]
async fn a_client_that_disconnects_aborts_its_request() {
    let server = start(dev(), 22, 1).await;
    let mut stream = Stream::open(&server, "/v1/completions", &slow_request(8000)).await;
    stream.next().await.unwrap();
    assert_eq!(server.snapshot().server_load, 1);

    drop(stream);

    eventually(|| server.snapshot().finished_abort == 1).await;
    eventually(|| server.snapshot().server_load == 0).await;
}

#[tokio::test]
async fn shutdown_refuses_new_requests_aborts_the_rest_at_the_deadline_and_exits() {
    let server = start(dev(), 22, 2).await;
    server.add_load(1, 8, 1_000_000);
    eventually(|| server.snapshot().running == 1).await;

    server.shutdown(Duration::from_millis(300));

    let refused = post(&server, "/v1/completions", Some(r#"{"prompt": "x"}"#)).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.json()["error"]["type"], "ServiceUnavailableError");
    assert_eq!(server.snapshot().phase, Phase::ShuttingDown);
    server.exited().await;
    assert_eq!(server.snapshot().phase, Phase::Exited);
    assert_eq!(server.snapshot().finished_abort, 1);
    eventually(|| server.listening() == gpuqueue_fake_vllm::Listening::Stopped).await;
    let error = common::client()
        .get(server.url("/health"))
        .send()
        .await
        .unwrap_err();
    assert!(error.is_connect(), "{error:?}");
}

#[tokio::test]
async fn a_dead_engine_fails_health_with_an_empty_503() {
    let server = start(dev(), 22, 3).await;
    server.set_engine_dead(true);
    let health = get(&server, "/health").await;
    assert_eq!((health.status, health.body.as_str()), (503, ""));
    server.set_engine_dead(false);
    assert_eq!(get(&server, "/health").await.status, 200);
}

#[tokio::test]
async fn kv_offload_counters_keep_moving_after_an_abort_until_the_tail_lands() {
    let config = Config {
        kv_offload: true,
        offload_prompt_only: false,
        offload_bandwidth: 500_000_000,
        ..dev()
    };
    let server = start(config, 22, 4).await;
    server.add_load(8, 512, 1_000_000);
    eventually(|| server.snapshot().offload_pending_bytes > 0).await;

    post(&server, "/pause", None).await;
    let at_pause = server.snapshot().offload_bytes_total;

    eventually(|| server.snapshot().offload_pending_bytes == 0).await;
    assert!(server.snapshot().offload_bytes_total > at_pause);
}
