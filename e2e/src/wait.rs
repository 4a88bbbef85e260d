//! Waiting for the cluster to reach a state, with a deadline and a message that says what was
//! last seen. Tests never sleep for a fixed time and never assert on how long something took.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};

/// A deadline generous enough for a loaded 2-core CI machine.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Calls `check` until it returns `Ok(value)` or `timeout` passes.
///
/// `check` returns `Err(observation)` while the condition does not hold yet; the last
/// observation ends up in the timeout error, so a failed test says what it saw ("pod is
/// Pending: 0/5 nodes are available: 5 Insufficient nvidia.com/gpu") rather than only
/// "timed out".
pub async fn wait_for<T, F, Fut>(
    what: impl Into<String>,
    timeout: Duration,
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(value) => return Ok(value),
            Err(observation) => observation,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.into(),
                timeout,
                last,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    #[tokio::test]
    async fn returns_the_value_once_the_condition_holds() {
        let mut calls = 0;
        let value = wait_for("three calls", Duration::from_secs(5), || {
            calls += 1;
            let seen = calls;
            async move {
                if seen >= 3 {
                    Ok(seen)
                } else {
                    Err(format!("call {seen}"))
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
    }

    #[tokio::test]
    async fn timeout_names_the_condition_and_the_last_observation() {
        let err = wait_for("the impossible", Duration::from_millis(250), || async {
            Err::<(), _>("still impossible".to_owned())
        })
        .await
        .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("the impossible"), "{message}");
        assert!(
            message.contains("last observed: still impossible"),
            "{message}"
        );
    }
}
