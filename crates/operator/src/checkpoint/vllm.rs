//! The `vllm` driver (research note §3.3): `POST /pause?mode=...`, then `GET /metrics` every
//! 50 ms until no request is running or waiting and the KV offload counters stopped moving,
//! then `GET /is_paused` to confirm. Only vLLM's own routes are used; `/sleep` never is (it
//! discards the KV cache and can take seconds). Status codes decide; error bodies, whose shape
//! differs between releases, are never read.

use std::net::SocketAddr;
use std::time::Duration;

use gpuqueue_api::v1alpha1::PauseMode;

use super::client::{CallError, CheckpointClient};
use super::outcome::{CheckpointOutcome, EngineLoad, Evidence, Step};
use super::progress::Progress;
use super::prometheus;

/// How often the metrics are read while the server drains.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Stand-in wait for the unflushed KV tail when the server exposes no request metrics
/// (research note §4.3: tens of MB at ~25 GB/s, plus margin).
const SETTLE_WITHOUT_METRICS: Duration = Duration::from_millis(50);
/// Answers of the control routes are tiny; anything bigger is not vLLM.
const CONTROL_BODY_CAP: usize = 64 * 1024;
/// How long a `keep` checkpoint waits for `GET /version`, asked alongside the pause.
const VERSION_WAIT: Duration = Duration::from_millis(200);
/// vLLM's exposition with histograms runs to a few hundred kB.
const METRICS_BODY_CAP: usize = 8 * 1024 * 1024;

const RUNNING: &str = "vllm:num_requests_running";
const WAITING: &str = "vllm:num_requests_waiting";
const OFFLOADED_BYTES: &str = "vllm:kv_offload_total_bytes_total";

/// The query of `POST /pause`. `wait_for_inflight_requests` and `clear_cache` are what v0.13 and
/// v0.14 understand (they ignore `mode`; their default aborts); newer releases ignore them or
/// agree. `keep` must say `clear_cache=false`, or some releases free the frozen requests' KV.
fn pause_query(mode: PauseMode) -> &'static str {
    match mode {
        PauseMode::Abort => "mode=abort",
        PauseMode::Wait => "mode=wait&wait_for_inflight_requests=true",
        PauseMode::Keep => "mode=keep&clear_cache=false",
    }
}

pub(super) async fn checkpoint(
    client: &CheckpointClient,
    target: SocketAddr,
    mode: PauseMode,
    progress: &Progress,
) -> CheckpointOutcome {
    progress.at(Step::Pause);
    let pause = format!("http://{target}/pause?{}", pause_query(mode));
    let (paused, mode) = tokio::join!(
        client.post(&pause, CONTROL_BODY_CAP),
        honoured(client, target, mode)
    );
    match paused {
        Ok(reply) if reply.is_success() => {}
        // 404: dev mode off (the route is not registered); other 4xx: a release that does not
        // understand us. Either way there is nothing to wait for: evict.
        Ok(reply) if (400..500).contains(&reply.status) => {
            return CheckpointOutcome::Unsupported {
                step: Step::Pause,
                status: reply.status,
            };
        }
        Ok(reply) => {
            return CheckpointOutcome::Failed {
                step: Step::Pause,
                error: CallError::Status(reply.status),
            };
        }
        Err(error) => {
            return CheckpointOutcome::Failed {
                step: Step::Pause,
                error,
            };
        }
    }

    progress.at(Step::Drain);
    let evidence = match drain(client, target, mode, progress).await {
        Ok(evidence) => evidence,
        Err(outcome) => return outcome,
    };

    progress.drained(evidence);
    progress.at(Step::ConfirmPaused);
    match is_paused(client, target).await {
        Some(false) => CheckpointOutcome::Failed {
            step: Step::ConfirmPaused,
            error: CallError::NotPaused,
        },
        // Paused, or a release without a readable `/is_paused`: the pause call and the metrics
        // already vouch for it.
        Some(true) | None => CheckpointOutcome::Succeeded(evidence),
    }
}

/// `POST /resume`: lets a server a checkpoint paused serve again (its reclaim was abandoned).
pub(super) async fn resume(client: &CheckpointClient, target: SocketAddr) -> Result<(), CallError> {
    let url = format!("http://{target}/resume");
    let reply = client.post(&url, CONTROL_BODY_CAP).await?;
    if reply.is_success() {
        Ok(())
    } else {
        Err(CallError::Status(reply.status))
    }
}

/// Reads the metrics until the server is idle (or, with `keep`, until the offload counters
/// settle). Abort reaches the engine asynchronously, so the gauges lag the pause call.
async fn drain(
    client: &CheckpointClient,
    target: SocketAddr,
    mode: PauseMode,
    progress: &Progress,
) -> Result<Evidence, CheckpointOutcome> {
    let metrics = format!("http://{target}/metrics");
    let mut previous_offload: Option<Option<f64>> = None;
    loop {
        match client.get(&metrics, METRICS_BODY_CAP).await {
            Ok(reply) if reply.is_success() => {
                let text = String::from_utf8_lossy(&reply.body);
                let (Some(running), Some(waiting)) = (
                    prometheus::sum(&text, RUNNING),
                    prometheus::sum(&text, WAITING),
                ) else {
                    tokio::time::sleep(SETTLE_WITHOUT_METRICS).await;
                    return Ok(Evidence::Unmeasured);
                };
                let load = EngineLoad {
                    running: gauge(running),
                    waiting: gauge(waiting),
                };
                progress.saw(load);
                let offload = prometheus::sum_where(&text, OFFLOADED_BYTES, |labels| {
                    prometheus::label_matches(labels, "transfer_type", |kind| {
                        kind.starts_with("GPU_to_")
                    })
                });
                // Without an offload tier there is nothing to settle; with one, two equal
                // readings in a row mean the tail has landed.
                let settled = offload.is_none() || previous_offload == Some(offload);
                previous_offload = Some(offload);
                let idle = match mode {
                    PauseMode::Keep => true,
                    PauseMode::Abort | PauseMode::Wait => load.running == 0 && load.waiting == 0,
                };
                if idle && settled {
                    return Ok(match mode {
                        PauseMode::Keep => Evidence::Frozen,
                        PauseMode::Abort | PauseMode::Wait => Evidence::Drained,
                    });
                }
            }
            Ok(reply) if reply.status == 404 => {
                tokio::time::sleep(SETTLE_WITHOUT_METRICS).await;
                return Ok(Evidence::Unmeasured);
            }
            // The server went away: nothing left to drain.
            Err(CallError::Connect(why)) => {
                return Err(CheckpointOutcome::Failed {
                    step: Step::Drain,
                    error: CallError::Connect(why),
                });
            }
            // A 5xx or a broken read: try again until the deadline.
            Ok(_) | Err(_) => {}
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// A gauge's value as a count.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped to ≥ 0, rounded
fn gauge(value: f64) -> u64 {
    if value.is_finite() {
        value.max(0.0).round() as u64
    } else {
        u64::MAX
    }
}

/// The pause mode the server applied. v0.13 and v0.14 ignore `mode` and abort (research note
/// §3.2): a `keep` they took is drained as an abort, and never reported as frozen requests a
/// resume would continue. Asked of `GET /version` for `keep` only, alongside the pause, for
/// [`VERSION_WAIT`] at most; unreadable: as asked.
async fn honoured(client: &CheckpointClient, target: SocketAddr, mode: PauseMode) -> PauseMode {
    if mode != PauseMode::Keep {
        return mode;
    }
    let url = format!("http://{target}/version");
    let reply = tokio::time::timeout(VERSION_WAIT, client.get(&url, CONTROL_BODY_CAP))
        .await
        .ok()
        .and_then(Result::ok)
        .filter(super::client::Reply::is_success);
    let version = reply
        .and_then(|reply| serde_json::from_slice::<serde_json::Value>(&reply.body).ok())
        .and_then(|body| body.get("version")?.as_str().map(str::to_owned));
    match version.as_deref().map(ignores_mode) {
        Some(true) => PauseMode::Abort,
        Some(false) | None => mode,
    }
}

/// Whether a release (`0.14.1`, `0.14.0rc2`, `0.14.1+cu128`) predates `/pause?mode=`: 0.14 or
/// earlier. A build between releases (`0.14.1.dev12`) may have it: it is taken at its word.
fn ignores_mode(version: &str) -> bool {
    if version.contains("dev") {
        return false;
    }
    let mut parts = version.split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        return false;
    };
    let minor: String = minor.chars().take_while(char::is_ascii_digit).collect();
    matches!((major.parse::<u32>(), minor.parse::<u32>()), (Ok(0), Ok(minor)) if minor <= 14)
}

/// `GET /is_paused` → `{"is_paused": bool}`; `None` when the answer is anything else.
async fn is_paused(client: &CheckpointClient, target: SocketAddr) -> Option<bool> {
    let reply = client
        .get(&format!("http://{target}/is_paused"), CONTROL_BODY_CAP)
        .await
        .ok()
        .filter(super::client::Reply::is_success)?;
    let body: serde_json::Value = serde_json::from_slice(&reply.body).ok()?;
    body.get("is_paused")?.as_bool()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_never_lets_the_cache_be_cleared_and_wait_speaks_to_old_releases() {
        assert_eq!(pause_query(PauseMode::Keep), "mode=keep&clear_cache=false");
        assert!(pause_query(PauseMode::Wait).contains("wait_for_inflight_requests=true"));
        assert_eq!(pause_query(PauseMode::Abort), "mode=abort");
    }

    #[test]
    fn releases_before_0_15_ignore_the_pause_mode() {
        for old in ["0.14.1", "0.13.0", "0.14.0rc2", "0.9.2", "0.14.1+cu128"] {
            assert!(ignores_mode(old), "{old}");
        }
        for new in ["0.15.0", "0.19.1", "1.0.0", "0.14.1.dev12", "dev", ""] {
            assert!(!ignores_mode(new), "{new}");
        }
    }

    #[test]
    fn gauges_become_counts() {
        assert_eq!(gauge(3.0), 3);
        assert_eq!(gauge(-1.0), 0);
        assert_eq!(gauge(f64::NAN), u64::MAX);
    }
}
