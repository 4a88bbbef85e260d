#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The checkpoint drivers against real servers over real HTTP on loopback pod-like addresses:
//! the fake vLLM for `vllm`, a small axum sidecar for `http`. Every test asserts the outcome and
//! what the server saw; none asserts how long anything took.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuqueue_api::v1alpha1::{CheckpointDriver, CheckpointPolicy, GpuQueue, PauseMode};
use gpuqueue_fake_vllm::{Config, ErrorStyle, FakeVllm, Fault, FaultAction, Profile};
use gpuqueue_operator::checkpoint::{
    CallError, CheckpointClient, CheckpointOutcome, CheckpointReport, Checkpointer, Evidence,
    SkipReason, Step,
};
use tokio::time::Instant;

/// Generous: successful checkpoints finish long before it.
const DEADLINE: Duration = Duration::from_secs(5);
/// For the cases that must time out.
const SHORT_DEADLINE: Duration = Duration::from_millis(400);

fn policy(driver: CheckpointDriver, port: u16) -> CheckpointPolicy {
    CheckpointPolicy {
        driver,
        port: Some(i32::from(port)),
        path: None,
        pause_mode: None,
        timeout: Duration::from_secs(10).into(),
    }
}

fn vllm_config() -> Config {
    Config {
        dev_mode: true,
        // Long enough that a driver returning right after `/pause` would be caught by the
        // gauges still counting the aborted requests.
        abort_lag: Duration::from_millis(600),
        ..Config::default()
    }
}

/// A fake vLLM on its own loopback "pod IP", busy with `load` requests.
async fn vllm(config: Config, pod: u8, load: usize) -> FakeVllm {
    let addr: SocketAddr = format!("127.100.1.{pod}:0").parse().unwrap();
    let server = FakeVllm::start(config, addr).await.unwrap();
    server.add_load(load, 64, 100_000);
    eventually(|| server.snapshot().running == load).await;
    server
}

async fn run(
    policy: &CheckpointPolicy,
    ip: Option<IpAddr>,
    deadline: Duration,
) -> CheckpointReport {
    let client = CheckpointClient::new().unwrap();
    Checkpointer::from_policy(policy, &client)
        .checkpoint(ip.ok_or(SkipReason::NoPodIp), Instant::now() + deadline)
        .await
}

async fn vllm_checkpoint(
    server: &FakeVllm,
    mode: Option<PauseMode>,
    deadline: Duration,
) -> CheckpointReport {
    let mut policy = policy(CheckpointDriver::Vllm, server.addr().port());
    policy.pause_mode = mode;
    run(&policy, Some(server.addr().ip()), deadline).await
}

/// Waits (up to 10 s, a liveness bound, not a timing assertion) until `done` holds.
async fn eventually(done: impl Fn() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition never held");
}

/// The invariant of every vLLM checkpoint: exactly one pause, never a sleep.
fn assert_one_pause_never_sleep(server: &FakeVllm) {
    assert_eq!(server.calls_to("/pause").len(), 1, "{:#?}", server.calls());
    assert!(
        server.calls_to("/sleep").is_empty(),
        "{:#?}",
        server.calls()
    );
}

#[tokio::test]
async fn vllm_pauses_with_abort_waits_until_idle_and_confirms() {
    for style in [ErrorStyle::Fastapi, ErrorStyle::Openai] {
        let server = vllm(
            Config {
                error_style: style,
                ..vllm_config()
            },
            1,
            4,
        )
        .await;

        let report = vllm_checkpoint(&server, None, DEADLINE).await;

        assert_eq!(
            report.outcome,
            CheckpointOutcome::Succeeded(Evidence::Drained),
            "{style:?}"
        );
        assert_eq!(report.target, Some(server.addr()));
        assert_eq!(report.result(), "succeeded");
        assert_eq!(report.driver_label(), "vllm");
        let state = server.snapshot();
        assert_eq!(
            (state.running, state.waiting),
            (0, 0),
            "returned before the engine drained"
        );
        assert_eq!(state.finished_abort, 4);
        assert_one_pause_never_sleep(&server);
        let calls = server.calls();
        assert_eq!(calls[0].path, "/pause");
        assert_eq!(calls[0].method, "POST");
        assert_eq!(calls[0].query_param("mode"), Some("abort"));
        assert!(calls.iter().any(|call| call.path == "/metrics"));
        assert_eq!(calls.last().unwrap().path, "/is_paused");
        server.stop();
    }
}

#[tokio::test]
async fn vllm_waits_for_the_kv_offload_tail_to_land() {
    let config = Config {
        kv_offload: true,
        offload_prompt_only: false,
        // 2 MB per block at 1 GB/s: the tail takes a few steps to land after the abort.
        offload_bandwidth: 1_000_000_000,
        abort_lag: Duration::from_millis(20),
        ..vllm_config()
    };
    let server = vllm(config, 2, 8).await;

    let report = vllm_checkpoint(&server, None, DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Drained)
    );
    assert_eq!(server.snapshot().offload_pending_bytes, 0);
    assert!(server.snapshot().offload_bytes_total > 0);
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn vllm_wait_mode_lets_requests_finish() {
    let server = vllm(vllm_config(), 3, 0).await;
    server.add_load(3, 16, 10);
    eventually(|| server.snapshot().running == 3).await;

    let report = vllm_checkpoint(&server, Some(PauseMode::Wait), DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Drained)
    );
    let state = server.snapshot();
    assert_eq!(state.finished_length, 3);
    assert_eq!(state.finished_abort, 0);
    assert_eq!(
        server.calls_to("/pause")[0].query_param("mode"),
        Some("wait")
    );
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn vllm_keep_mode_freezes_requests_and_keeps_the_cache() {
    let server = vllm(vllm_config(), 4, 2).await;

    let report = vllm_checkpoint(&server, Some(PauseMode::Keep), DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Frozen)
    );
    let pause = &server.calls_to("/pause")[0];
    assert_eq!(pause.query_param("mode"), Some("keep"));
    assert_eq!(pause.query_param("clear_cache"), Some("false"));
    let state = server.snapshot();
    assert_eq!(state.running, 2, "frozen requests stay in the batch");
    assert_eq!(state.finished_abort, 0);
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn vllm_without_dev_mode_is_unsupported_and_nothing_else_is_called() {
    for style in [ErrorStyle::Fastapi, ErrorStyle::Openai] {
        let config = Config {
            dev_mode: false,
            error_style: style,
            ..vllm_config()
        };
        let server = vllm(config, 5, 2).await;

        let report = vllm_checkpoint(&server, None, DEADLINE).await;

        assert_eq!(
            report.outcome,
            CheckpointOutcome::Unsupported {
                step: Step::Pause,
                status: 404
            },
            "{style:?}"
        );
        assert_eq!(report.result(), "unsupported");
        assert_eq!(
            server.calls().len(),
            1,
            "only the pause: {:#?}",
            server.calls()
        );
        assert_eq!(server.snapshot().running, 2, "nothing was paused");
        server.stop();
    }
}

#[tokio::test]
async fn vllm_v0_14_ignores_mode_and_aborts_by_default() {
    let config = Config {
        profile: Profile::V0_14,
        // v0.14 attached the pause routes without dev mode.
        dev_mode: false,
        ..vllm_config()
    };
    let server = vllm(config, 6, 3).await;

    let report = vllm_checkpoint(&server, None, DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Drained)
    );
    assert_eq!(server.snapshot().finished_abort, 3);
    assert_one_pause_never_sleep(&server);
}

/// Review finding: v0.14 aborts whatever mode it is asked; a `keep` was recorded as frozen
/// requests a resume would continue, though they were gone.
#[tokio::test]
async fn vllm_v0_14_asked_to_keep_aborts_and_says_so() {
    let config = Config {
        profile: Profile::V0_14,
        dev_mode: false,
        ..vllm_config()
    };
    let server = vllm(config, 20, 2).await;

    let report = vllm_checkpoint(&server, Some(PauseMode::Keep), DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Drained)
    );
    assert_eq!(server.snapshot().finished_abort, 2);
}

#[tokio::test]
async fn vllm_v0_14_waits_when_asked_to_through_its_own_parameter() {
    let config = Config {
        profile: Profile::V0_14,
        dev_mode: false,
        ..vllm_config()
    };
    let server = vllm(config, 7, 0).await;
    server.add_load(2, 16, 8);
    eventually(|| server.snapshot().running == 2).await;

    let report = vllm_checkpoint(&server, Some(PauseMode::Wait), DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Drained)
    );
    assert_eq!(server.snapshot().finished_abort, 0);
    assert_eq!(server.snapshot().finished_length, 2);
}

#[tokio::test]
async fn vllm_pause_that_hangs_times_out_at_the_deadline() {
    let server = vllm(vllm_config(), 8, 1).await;
    server.set_fault_action("/pause", FaultAction::Hang);

    let report = vllm_checkpoint(&server, None, SHORT_DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::TimedOut {
            step: Step::Pause,
            last_load: None
        }
    );
    assert_eq!(report.result(), "timed_out");
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn vllm_policy_timeout_cuts_a_longer_deadline_short() {
    let server = vllm(vllm_config(), 9, 1).await;
    server.set_fault_action("/pause", FaultAction::Hang);
    let mut policy = policy(CheckpointDriver::Vllm, server.addr().port());
    policy.timeout = SHORT_DEADLINE.into();

    let report = run(&policy, Some(server.addr().ip()), Duration::from_hours(1)).await;

    assert!(matches!(
        report.outcome,
        CheckpointOutcome::TimedOut {
            step: Step::Pause,
            ..
        }
    ));
}

#[tokio::test]
async fn vllm_metrics_that_hang_time_out_while_draining() {
    let server = vllm(vllm_config(), 10, 1).await;
    server.set_fault_action("/metrics", FaultAction::Hang);

    let report = vllm_checkpoint(&server, None, SHORT_DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::TimedOut {
            step: Step::Drain,
            last_load: None
        }
    );
    assert_one_pause_never_sleep(&server);
}

/// Review finding: a drain proven idle, then an `/is_paused` too slow for the deadline, was
/// recorded as a timeout, though an unreadable `/is_paused` counts as confirmed.
#[tokio::test]
async fn vllm_drained_then_is_paused_hanging_is_a_checkpoint_made() {
    let server = vllm(vllm_config(), 19, 1).await;
    server.set_fault_action("/is_paused", FaultAction::Hang);

    let report = vllm_checkpoint(&server, None, Duration::from_secs(2)).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Drained)
    );
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn vllm_still_busy_at_the_deadline_times_out_with_the_last_load() {
    let config = Config {
        abort_lag: Duration::from_mins(1),
        ..vllm_config()
    };
    let server = vllm(config, 11, 3).await;

    let report = vllm_checkpoint(&server, None, SHORT_DEADLINE).await;

    match report.outcome {
        CheckpointOutcome::TimedOut {
            step: Step::Drain,
            last_load: Some(load),
        } => assert_eq!(load.running, 3),
        other => panic!("expected a timeout while draining, got {other:?}"),
    }
    assert!(
        report.outcome.to_string().contains("3 running"),
        "{}",
        report.outcome
    );
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn vllm_pause_500_fails_without_waiting() {
    let server = vllm(vllm_config(), 12, 1).await;
    server.set_fault_action("/pause", FaultAction::Status(500));

    let report = vllm_checkpoint(&server, None, DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Failed {
            step: Step::Pause,
            error: CallError::Status(500)
        }
    );
    assert_eq!(report.result(), "failed");
    assert_eq!(server.calls().len(), 1);
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn vllm_refusing_connections_fails() {
    let server = vllm(vllm_config(), 13, 1).await;
    server.set_accepting(false).await;

    let report = vllm_checkpoint(&server, None, DEADLINE).await;

    assert!(
        matches!(
            &report.outcome,
            CheckpointOutcome::Failed { step: Step::Pause, error: CallError::Connect(why) } if why.contains("refused")
        ),
        "{:?}",
        report.outcome
    );
    assert!(server.calls().is_empty());
}

#[tokio::test]
async fn vllm_nobody_listening_fails() {
    let mut policy = policy(CheckpointDriver::Vllm, 8000);
    policy.pause_mode = Some(PauseMode::Abort);

    let report = run(&policy, Some("127.100.1.250".parse().unwrap()), DEADLINE).await;

    assert!(matches!(
        report.outcome,
        CheckpointOutcome::Failed {
            step: Step::Pause,
            error: CallError::Connect(_)
        }
    ));
}

#[tokio::test]
async fn vllm_connection_dropped_mid_call_fails() {
    let server = vllm(vllm_config(), 14, 1).await;
    server.set_fault_action("/pause", FaultAction::Close);

    let report = vllm_checkpoint(&server, None, DEADLINE).await;

    assert!(
        matches!(
            report.outcome,
            CheckpointOutcome::Failed {
                step: Step::Pause,
                error: CallError::Transport(_)
            }
        ),
        "{:?}",
        report.outcome
    );
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn vllm_without_request_metrics_settles_briefly_and_succeeds() {
    let server = vllm(vllm_config(), 15, 1).await;
    server.set_fault_action("/metrics", FaultAction::Status(404));

    let report = vllm_checkpoint(&server, None, DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Unmeasured)
    );
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn vllm_metrics_errors_are_retried_until_they_clear() {
    let server = vllm(vllm_config(), 16, 1).await;
    server.set_fault(
        "/metrics",
        Fault {
            action: FaultAction::Status(500),
            times: Some(2),
            ..Fault::default()
        },
    );

    let report = vllm_checkpoint(&server, None, DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Drained)
    );
    assert!(server.calls_to("/metrics").len() >= 3);
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn vllm_pause_latency_within_the_deadline_still_succeeds() {
    let server = vllm(vllm_config(), 17, 1).await;
    server.set_fault(
        "/pause",
        Fault {
            delay_ms: 200,
            ..Fault::default()
        },
    );

    let report = vllm_checkpoint(&server, None, DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Drained)
    );
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn none_driver_and_missing_targets_call_nothing() {
    let server = vllm(vllm_config(), 18, 0).await;
    let ip = Some(server.addr().ip());

    let none = CheckpointPolicy::default();
    assert_eq!(
        run(&none, ip, DEADLINE).await.outcome,
        CheckpointOutcome::Skipped(SkipReason::DriverNone)
    );

    let vllm_policy = policy(CheckpointDriver::Vllm, server.addr().port());
    assert_eq!(
        run(&vllm_policy, None, DEADLINE).await.outcome,
        CheckpointOutcome::Skipped(SkipReason::NoPodIp)
    );

    let metadata: IpAddr = "169.254.169.254".parse().unwrap();
    assert_eq!(
        run(&vllm_policy, Some(metadata), DEADLINE).await.outcome,
        CheckpointOutcome::Skipped(SkipReason::NotAPodIp(metadata))
    );

    assert_eq!(
        run(&vllm_policy, ip, Duration::ZERO).await.outcome,
        CheckpointOutcome::Skipped(SkipReason::NoTimeLeft)
    );

    let mut no_port = vllm_policy.clone();
    no_port.port = None;
    assert!(matches!(
        run(&no_port, ip, DEADLINE).await.outcome,
        CheckpointOutcome::Skipped(SkipReason::Misconfigured(_))
    ));

    assert!(server.calls().is_empty(), "{:#?}", server.calls());
}

/// A checkpoint sidecar: records what it was posted, answers per path.
#[derive(Clone, Default)]
struct Sidecar {
    bodies: Arc<Mutex<Vec<(String, String)>>>,
}

async fn sidecar(pod: u8) -> (SocketAddr, Sidecar) {
    sidecar_on(format!("127.100.2.{pod}:0").parse().unwrap()).await
}

async fn sidecar_on(addr: SocketAddr) -> (SocketAddr, Sidecar) {
    use axum::routing::post;
    let seen = Sidecar::default();
    let record = |seen: Sidecar, path: &'static str| {
        move |body: String| {
            let seen = seen.clone();
            async move {
                seen.bodies.lock().unwrap().push((path.to_owned(), body));
            }
        }
    };
    let app = axum::Router::new()
        .route(
            "/checkpoint",
            post({
                let record = record(seen.clone(), "/checkpoint");
                move |body: String| async move {
                    record(body).await;
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        )
        .route(
            "/broken",
            post({
                let record = record(seen.clone(), "/broken");
                move |body: String| async move {
                    record(body).await;
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                }
            }),
        )
        .route(
            "/accepted",
            post({
                let record = record(seen.clone(), "/accepted");
                move |body: String| async move {
                    record(body).await;
                    (axum::http::StatusCode::ACCEPTED, r#"{"id":"e-1"}"#)
                }
            }),
        )
        .route(
            "/manifest",
            post({
                let record = record(seen.clone(), "/manifest");
                move |body: String| async move {
                    record(body).await;
                    (axum::http::StatusCode::OK, "x".repeat(1024 * 1024))
                }
            }),
        )
        .route(
            "/stuck",
            post({
                let record = record(seen.clone(), "/stuck");
                move |body: String| async move {
                    record(body).await;
                    std::future::pending::<()>().await;
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

fn http_policy(addr: SocketAddr, path: &str) -> CheckpointPolicy {
    CheckpointPolicy {
        path: Some(path.to_owned()),
        ..policy(CheckpointDriver::Http, addr.port())
    }
}

#[tokio::test]
async fn http_driver_2xx_is_a_durable_checkpoint() {
    let (addr, sidecar) = sidecar(1).await;

    let report = run(&http_policy(addr, "/checkpoint"), Some(addr.ip()), DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Acknowledged { status: 204 })
    );
    assert_eq!(report.driver_label(), "http");
    let bodies = sidecar.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1);
    let body: serde_json::Value = serde_json::from_str(&bodies[0].1).unwrap();
    let deadline_ms = body["deadlineMs"].as_u64().unwrap();
    assert!(deadline_ms > 0 && deadline_ms <= 5000, "{body}");
}

/// Review finding: a sidecar answering 202 Accepted has only taken the work; counting it
/// durable evicted the pod while it was still saving.
#[tokio::test]
async fn http_driver_202_accepted_is_not_a_durable_checkpoint() {
    let (addr, sidecar) = sidecar(6).await;

    let report = run(&http_policy(addr, "/accepted"), Some(addr.ip()), DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Failed {
            step: Step::Post,
            error: CallError::Status(202)
        }
    );
    assert!(
        CallError::Status(202)
            .to_string()
            .contains("not made durable")
    );
    assert_eq!(sidecar.bodies.lock().unwrap().len(), 1);
}

/// Review finding: a 200 whose body was larger than the driver read was recorded as failed.
#[tokio::test]
async fn http_driver_2xx_with_a_large_body_is_durable() {
    let (addr, _sidecar) = sidecar(7).await;

    let report = run(&http_policy(addr, "/manifest"), Some(addr.ip()), DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Acknowledged { status: 200 })
    );
}

#[tokio::test]
async fn http_driver_5xx_fails() {
    let (addr, sidecar) = sidecar(2).await;

    let report = run(&http_policy(addr, "/broken"), Some(addr.ip()), DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Failed {
            step: Step::Post,
            error: CallError::Status(503)
        }
    );
    assert_eq!(sidecar.bodies.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn http_driver_hang_times_out() {
    let (addr, sidecar) = sidecar(3).await;

    let report = run(
        &http_policy(addr, "/stuck"),
        Some(addr.ip()),
        SHORT_DEADLINE,
    )
    .await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::TimedOut {
            step: Step::Post,
            last_load: None
        }
    );
    assert_eq!(
        sidecar.bodies.lock().unwrap().len(),
        1,
        "called exactly once"
    );
}

#[tokio::test]
async fn http_driver_unknown_path_fails_with_its_status() {
    let (addr, _) = sidecar(4).await;

    let report = run(&http_policy(addr, "/missing"), Some(addr.ip()), DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Failed {
            step: Step::Post,
            error: CallError::Status(404)
        }
    );
}

#[tokio::test]
async fn parallel_checkpoints_each_pause_their_own_server_once() {
    let mut servers = Vec::new();
    for pod in 20..24 {
        servers.push(vllm(vllm_config(), pod, 2).await);
    }

    let reports = futures::future::join_all(
        servers
            .iter()
            .map(|server| vllm_checkpoint(server, None, DEADLINE)),
    )
    .await;

    for (server, report) in servers.iter().zip(reports) {
        assert_eq!(report.target, Some(server.addr()));
        assert_eq!(
            report.outcome,
            CheckpointOutcome::Succeeded(Evidence::Drained)
        );
        assert_one_pause_never_sleep(server);
    }
}

/// The checkpoint policy of a queue in `examples/`.
fn example_policy(file: &str) -> CheckpointPolicy {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(file);
    let queue: GpuQueue = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    queue.spec.reclaim.checkpoint
}

// The examples name fixed ports (8000, 9090); these loopback addresses sit outside 127.100/16,
// which the end-to-end tests use for KWOK pods.

#[tokio::test]
async fn the_vllm_example_queue_checkpoints_a_vllm_pod() {
    let policy = example_policy("checkpoint-vllm.yaml");
    let addr: SocketAddr = "127.201.0.1:8000".parse().unwrap();
    let server = FakeVllm::start(vllm_config(), addr).await.unwrap();
    server.add_load(2, 64, 8000);
    eventually(|| server.snapshot().running == 2).await;

    let report = run(&policy, Some(addr.ip()), DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Drained)
    );
    assert_eq!(
        server.calls_to("/pause")[0].query_param("mode"),
        Some("abort")
    );
    assert_one_pause_never_sleep(&server);
}

#[tokio::test]
async fn the_http_example_queue_checkpoints_through_its_sidecar() {
    let policy = example_policy("checkpoint-http.yaml");
    let (addr, sidecar) = sidecar_on("127.201.0.2:9090".parse().unwrap()).await;

    let report = run(&policy, Some(addr.ip()), DEADLINE).await;

    assert_eq!(
        report.outcome,
        CheckpointOutcome::Succeeded(Evidence::Acknowledged { status: 204 })
    );
    assert_eq!(sidecar.bodies.lock().unwrap()[0].0, "/checkpoint");
}

#[tokio::test]
async fn the_none_example_queue_calls_nothing() {
    let policy = example_policy("checkpoint-none.yaml");
    let report = run(&policy, Some("127.201.0.3".parse().unwrap()), DEADLINE).await;
    assert_eq!(
        report.outcome,
        CheckpointOutcome::Skipped(SkipReason::DriverNone)
    );
    assert_eq!(report.result(), "skipped");
}
