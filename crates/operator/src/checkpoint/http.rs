//! The `http` driver: a sidecar in the pod answers `POST <path>` with 2xx once the checkpoint is
//! durable (our contract, research note §3.4). The body tells it how long it has:
//! `{"deadlineMs": N}`. Any other status is a failure; the body is never read.

use std::net::SocketAddr;

use serde_json::json;
use tokio::time::Instant;

use super::client::{CallError, CheckpointClient};
use super::outcome::{CheckpointOutcome, Evidence, Step};
use super::progress::Progress;

const REPLY_BODY_CAP: usize = 64 * 1024;

pub(super) async fn checkpoint(
    client: &CheckpointClient,
    target: SocketAddr,
    path: &str,
    deadline: Instant,
    progress: &Progress,
) -> CheckpointOutcome {
    progress.at(Step::Post);
    let remaining = deadline.saturating_duration_since(Instant::now());
    let body = json!({ "deadlineMs": remaining.as_millis() });
    let url = format!("http://{target}{path}");
    match client.post(&url, Some(&body), REPLY_BODY_CAP).await {
        Ok(reply) if reply.is_success() => CheckpointOutcome::Succeeded(Evidence::Acknowledged {
            status: reply.status,
        }),
        Ok(reply) => CheckpointOutcome::Failed {
            step: Step::Post,
            error: CallError::Status(reply.status),
        },
        Err(error) => CheckpointOutcome::Failed {
            step: Step::Post,
            error,
        },
    }
}
