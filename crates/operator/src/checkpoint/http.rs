//! The `http` driver: a sidecar in the pod answers `POST <path>` with 2xx once the checkpoint is
//! durable. This is our contract: one call, answered when it is done (the research note's §3.4
//! sketched a call answered 202 at once and polled after; a reclaim has no time to poll). The
//! body tells the sidecar how long it has: `{"deadlineMs": N}`. A 202 Accepted says the work
//! was taken, not that it is durable, so it is a failure like any status outside 2xx. The
//! decision is the status line's: the answer's body is not read, so a large one loses nothing.
//! No call undoes it (a spared victim is not told): a sidecar that stopped serving serves again
//! by itself once its pod outlives the deadline and its grace period.

use std::net::SocketAddr;

use serde_json::json;
use tokio::time::Instant;

use super::client::{CallError, CheckpointClient};
use super::outcome::{CheckpointOutcome, Evidence, Step};
use super::progress::Progress;

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
    match client.post_for_status(&url, &body).await {
        Ok(status) if durable(status) => {
            CheckpointOutcome::Succeeded(Evidence::Acknowledged { status })
        }
        Ok(status) => CheckpointOutcome::Failed {
            step: Step::Post,
            error: CallError::Status(status),
        },
        Err(error) => CheckpointOutcome::Failed {
            step: Step::Post,
            error,
        },
    }
}

/// Whether a status says the checkpoint is durable: 2xx, but 202 Accepted (taken, not done).
fn durable(status: u16) -> bool {
    (200..300).contains(&status) && status != 202
}
