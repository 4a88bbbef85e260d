#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! Injected faults, connection refusal, the call log, the admin API, several addresses in one
//! process, and the `fake-vllm` binary.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::{call, client, dev, eventually, get, post, start};
use gpuqueue_fake_vllm::{Config, ErrorStyle, Fault, FaultAction, Fleet, Listening, fleet_router};
use serde_json::json;

#[tokio::test]
async fn injected_statuses_answer_with_the_routes_own_error_bodies() {
    let server = start(
        Config {
            error_style: ErrorStyle::Openai,
            ..dev()
        },
        30,
        1,
    )
    .await;
    server.set_fault_action("/pause", FaultAction::Status(500));
    server.set_fault_action("/health", FaultAction::Status(503));
    server.set_fault_action("/metrics", FaultAction::Status(500));
    server.set_fault_action("/v1/models", FaultAction::Status(429));

    let pause = post(&server, "/pause?mode=abort", None).await;
    assert_eq!(
        (pause.status, pause.json()),
        (
            500,
            json!({"error": "Failed to pause generation: injected fault"})
        )
    );
    let health = get(&server, "/health").await;
    assert_eq!((health.status, health.body.as_str()), (503, ""));
    let metrics = get(&server, "/metrics").await;
    assert_eq!(
        (metrics.status, metrics.body.as_str()),
        (500, "Internal Server Error")
    );
    let models = get(&server, "/v1/models").await;
    assert_eq!(models.status, 429);
    assert_eq!(models.json()["error"]["code"], 429);

    assert_eq!(
        server.snapshot().pause_mode,
        None,
        "a failed pause pauses nothing"
    );
}

#[tokio::test]
async fn a_hung_route_never_answers_but_is_logged() {
    let server = start(dev(), 30, 2).await;
    server.set_fault_action("/pause", FaultAction::Hang);

    let result = client()
        .post(server.url("/pause"))
        .timeout(Duration::from_millis(300))
        .send()
        .await;

    assert!(result.unwrap_err().is_timeout());
    assert_eq!(server.calls_to("/pause").len(), 1);
    assert_eq!(server.snapshot().pause_mode, None);
    // Other routes still answer.
    assert_eq!(get(&server, "/health").await.status, 200);
}

#[tokio::test]
async fn a_closing_route_drops_the_connection_without_an_answer() {
    let server = start(dev(), 30, 3).await;
    server.set_fault_action("/pause", FaultAction::Close);

    let error = client()
        .post(server.url("/pause"))
        .send()
        .await
        .unwrap_err();

    assert!(!error.is_timeout() && !error.is_status(), "{error:?}");
    assert_eq!(server.snapshot().pause_mode, None);
}

#[tokio::test]
async fn delays_and_counted_faults_apply_then_clear() {
    let server = start(dev(), 30, 4).await;
    server.set_fault(
        "/version",
        Fault {
            delay_ms: 100,
            action: FaultAction::Status(500),
            times: Some(2),
        },
    );
    server.set_fault(
        "*",
        Fault {
            delay_ms: 50,
            ..Fault::default()
        },
    );

    assert_eq!(get(&server, "/version").await.status, 500);
    assert_eq!(get(&server, "/version").await.status, 500);
    // Cleared after two: the wildcard (latency only) applies now, and answers normally.
    assert_eq!(
        get(&server, "/version").await.json(),
        json!({"version": "0.32.0"})
    );
    assert_eq!(server.faults().len(), 1);
    assert_eq!(server.faults()[0].route, "*");
    // The admin routes are never faulted.
    server.set_fault_action("*", FaultAction::Hang);
    assert_eq!(get(&server, "/_fake/faults").await.status, 200);
    server.clear_faults(None);
    assert!(server.faults().is_empty());
}

#[tokio::test]
async fn refusing_connections_closes_the_socket_and_accepting_again_rebinds_it() {
    let server = start(dev(), 30, 5).await;
    // A pooled keep-alive connection must not survive the refusal.
    let pooled = client();
    assert_eq!(
        pooled
            .get(server.url("/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    server.set_accepting(false).await;
    assert_eq!(server.listening(), Listening::Refusing);
    let error = pooled.get(server.url("/health")).send().await.unwrap_err();
    assert!(error.is_connect() || error.is_request(), "{error:?}");
    let error = client()
        .get(server.url("/health"))
        .send()
        .await
        .unwrap_err();
    assert!(error.is_connect(), "{error:?}");

    server.set_accepting(true).await;
    assert_eq!(get(&server, "/health").await.status, 200);
}

/// A test's servers must not outlive its handles: the next test that takes the same loopback
/// address would fail to bind it ("Address already in use").
#[tokio::test]
async fn a_server_stops_when_its_last_handle_is_dropped_and_its_address_can_be_bound_again() {
    let server = start(dev(), 30, 8).await;
    let addr = server.addr();
    let copy = server.clone();
    drop(server);
    assert_eq!(get(&copy, "/health").await.status, 200, "a clone keeps it");

    drop(copy);
    let mut again = None;
    for _ in 0..1000 {
        if let Ok(listener) = tokio::net::TcpListener::bind(addr).await {
            again = Some(listener);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        again.is_some(),
        "{addr} is still served after its last handle was dropped"
    );
}

#[tokio::test]
async fn the_call_log_records_vllm_calls_in_order_but_not_admin_calls() {
    let server = start(dev(), 30, 6).await;
    post(&server, "/pause?mode=keep&clear_cache=false", None).await;
    get(&server, "/metrics").await;
    get(&server, "/_fake/state").await;
    get(&server, "/no/such/route").await;

    let calls = server.calls();
    let seen: Vec<(&str, &str, Option<&str>)> = calls
        .iter()
        .map(|call| {
            (
                call.method.as_str(),
                call.path.as_str(),
                call.query.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("POST", "/pause", Some("mode=keep&clear_cache=false")),
            ("GET", "/metrics", None),
            ("GET", "/no/such/route", None),
        ]
    );
    assert_eq!(
        calls.iter().map(|call| call.seq).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(
        calls
            .windows(2)
            .all(|pair| pair[0].elapsed_ms <= pair[1].elapsed_ms)
    );
    assert!(calls[0].unix_ms > 0);

    let logged = get(&server, "/_fake/calls").await.json();
    assert_eq!(logged.as_array().unwrap().len(), 3);
    assert_eq!(logged[0]["path"], "/pause");
    assert_eq!(logged[0]["query"], "mode=keep&clear_cache=false");
    assert_eq!(
        call("DELETE", &server.url("/_fake/calls"), None)
            .await
            .status,
        204
    );
    assert!(server.calls().is_empty());
}

#[tokio::test]
async fn the_admin_api_sets_faults_load_death_and_reset() {
    let server = start(dev(), 30, 7).await;

    let set = post(
        &server,
        "/_fake/faults",
        Some(r#"{"route": "/pause", "action": {"status": 503}, "times": 1}"#),
    )
    .await;
    assert_eq!(set.status, 200);
    assert_eq!(
        set.json(),
        json!([{"route": "/pause", "delay_ms": 0, "action": {"status": 503}, "times": 1}])
    );
    assert_eq!(post(&server, "/pause", None).await.status, 503);
    assert_eq!(post(&server, "/pause", None).await.status, 200);

    let bad = post(
        &server,
        "/_fake/faults",
        Some(r#"{"route": "pause", "action": "hang"}"#),
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(bad.json()["error"].as_str().unwrap().contains("path"));
    let bad = post(
        &server,
        "/_fake/faults",
        Some(r#"{"route": "/pause", "action": "explode"}"#),
    )
    .await;
    assert_eq!(bad.status, 400);
    let message = bad.json()["error"].as_str().unwrap().to_owned();
    assert!(
        message.contains("explode") && message.contains("\"action\""),
        "{message}"
    );

    post(&server, "/resume", None).await;
    assert_eq!(
        post(
            &server,
            "/_fake/load",
            Some(r#"{"requests": 3, "max_tokens": 1000000}"#)
        )
        .await
        .status,
        202
    );
    eventually(|| server.snapshot().running == 3).await;
    let state = get(&server, "/_fake/state").await.json();
    assert_eq!(state["engine"]["running"], 3);
    assert_eq!(state["listening"], "accepting");

    assert_eq!(
        post(&server, "/_fake/engine_dead", Some(r#"{"dead": true}"#))
            .await
            .status,
        204
    );
    assert_eq!(get(&server, "/health").await.status, 503);

    assert_eq!(post(&server, "/_fake/reset", None).await.status, 204);
    assert!(server.calls().is_empty() && server.faults().is_empty());

    let refused = post(&server, "/_fake/listening", Some(r#"{"accepting": false}"#)).await;
    assert_eq!(refused.status, 202, "answered before its own socket closes");
    eventually(|| server.listening() == Listening::Refusing).await;
}

#[tokio::test]
async fn a_fleet_serves_independent_addresses_and_its_admin_listener_reaches_each() {
    let fleet = Fleet::new(dev(), vec!["/pause=status:500,times:1".parse().unwrap()]);
    let a = fleet.add("127.100.31.1:0".parse().unwrap()).await.unwrap();
    let b = fleet.add("127.100.31.2:0".parse().unwrap()).await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_addr = admin.local_addr().unwrap();
    tokio::spawn(axum::serve(admin, fleet_router(Arc::clone(&fleet))).into_future());
    let admin_url = |path: &str| format!("http://{admin_addr}{path}");

    // Start-up faults apply to every server; state is per server.
    assert_eq!(post(&a, "/pause", None).await.status, 500);
    assert_eq!(post(&a, "/pause", None).await.status, 200);
    assert_eq!(
        get(&a, "/is_paused").await.json(),
        json!({"is_paused": true})
    );
    assert_eq!(
        get(&b, "/is_paused").await.json(),
        json!({"is_paused": false})
    );

    let listed = call("GET", &admin_url("/_fake/servers"), None).await.json();
    assert_eq!(listed.as_array().unwrap().len(), 2);

    let path = format!("/_fake/servers/{}/listening", a.addr());
    let refused = call("POST", &admin_url(&path), Some(r#"{"accepting": false}"#)).await;
    assert_eq!(refused.json(), json!({"listening": "refusing"}));
    assert!(
        client()
            .get(a.url("/health"))
            .send()
            .await
            .unwrap_err()
            .is_connect()
    );
    assert_eq!(get(&b, "/health").await.status, 200);
    let accepted = call("POST", &admin_url(&path), Some(r#"{"accepting": true}"#)).await;
    assert_eq!(accepted.json(), json!({"listening": "accepting"}));
    assert_eq!(get(&a, "/health").await.status, 200);

    let calls = call(
        "GET",
        &admin_url(&format!("/_fake/servers/{}/calls", b.addr())),
        None,
    )
    .await
    .json();
    assert_eq!(calls.as_array().unwrap().len(), 2);

    let added = call(
        "POST",
        &admin_url("/_fake/servers"),
        Some(r#"{"listen": "127.100.31.3:0"}"#),
    )
    .await;
    assert_eq!(added.status, 201);
    let c: SocketAddr = added.json()["addr"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        call("GET", &format!("http://{c}/health"), None)
            .await
            .status,
        200
    );
    let again = call(
        "POST",
        &admin_url("/_fake/servers"),
        Some(&json!({"listen": c}).to_string()),
    )
    .await;
    assert_eq!(again.status, 409);
    let bad = call(
        "POST",
        &admin_url("/_fake/servers"),
        Some(r#"{"listen": "pod-7"}"#),
    )
    .await;
    assert_eq!(bad.status, 400);

    let removed = call("DELETE", &admin_url(&format!("/_fake/servers/{c}")), None).await;
    assert_eq!(removed.status, 204);
    eventually(|| fleet.get(c).is_none()).await;
    let unknown = call(
        "GET",
        &admin_url("/_fake/servers/127.100.31.9:1/state"),
        None,
    )
    .await;
    assert_eq!(unknown.status, 404);
}

/// Reads the binary's stdout until its ready line.
fn wait_ready(child: &mut std::process::Child) -> String {
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    line
}

#[tokio::test]
async fn the_binary_serves_several_addresses_with_cli_faults_and_exits_on_sigterm() {
    // Fixed ports on addresses outside 127.100/16, which the end-to-end tests use for KWOK pods.
    let mut child = Command::new(env!("CARGO_BIN_EXE_fake-vllm"))
        .args([
            "--listen",
            "127.201.32.1:18000",
            "--listen",
            "127.201.32.2:18000",
            "--admin",
            "127.201.32.3:18001",
            "--dev-mode",
            "--profile",
            "v0_19",
            "--error-style",
            "openai",
            "--fault",
            "/pause=status:500,times:1",
            "--busy",
            "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = wait_ready(&mut child);
    assert_eq!(
        ready.trim(),
        "fake-vllm ready: 127.201.32.1:18000 127.201.32.2:18000"
    );

    for pod in ["127.201.32.1:18000", "127.201.32.2:18000"] {
        assert_eq!(
            call("GET", &format!("http://{pod}/version"), None)
                .await
                .json(),
            json!({"version": "0.19.0"})
        );
        assert_eq!(
            call("POST", &format!("http://{pod}/pause"), None)
                .await
                .status,
            500
        );
        assert_eq!(
            call("POST", &format!("http://{pod}/pause"), None)
                .await
                .status,
            200
        );
        let missing = call("POST", &format!("http://{pod}/abort_requests"), None).await;
        assert_eq!(missing.status, 404);
        assert_eq!(missing.json()["error"]["code"], 404);
    }
    let state = call(
        "GET",
        "http://127.201.32.3:18001/_fake/servers/127.201.32.1:18000/state",
        None,
    )
    .await
    .json();
    assert_eq!(state["engine"]["phase"], "paused");
    assert_eq!(
        state["engine"]["finished_abort"], 2,
        "--busy 2 were in flight"
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "{exit:?}");
}

#[test]
fn the_binary_refuses_bad_flags_naming_them() {
    let output = Command::new(env!("CARGO_BIN_EXE_fake-vllm"))
        .args([
            "--listen",
            "127.201.32.9:18000",
            "--fault",
            "/pause=explode",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--fault") && stderr.contains("unknown fault item"),
        "{stderr}"
    );

    let output = Command::new(env!("CARGO_BIN_EXE_fake-vllm"))
        .args(["--listen", "pod-7:8000"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--listen"));
}
