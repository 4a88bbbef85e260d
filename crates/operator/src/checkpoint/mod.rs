//! Checkpointing a borrower pod before it is evicted (DESIGN §5 step 4).
//!
//! A [`Checkpointer`] is built from a queue's [`CheckpointPolicy`] and asks one pod, at its IP as
//! the API reports it and the queue's port, to get ready for eviction: `vllm` pauses the server
//! and waits until its metrics show it idle, `http` posts to a sidecar, `none` does nothing.
//! Whatever happens, the call returns a [`CheckpointReport`] by the deadline the caller gives:
//! a checkpoint never blocks an eviction, it is recorded and the owner's guarantee wins. When
//! the eviction will not come (the reclaim was abandoned), [`Checkpointer::resume`] lets a
//! paused server serve again.
//!
//! This file builds a driver from the policy and runs it under the deadline; the drivers
//! (`vllm`, `http`) share the `client`, report through `outcome`, and leave their
//! `progress` where a timeout can read it.

mod address;
mod client;
mod http;
mod outcome;
mod progress;
mod prometheus;
mod vllm;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use gpuqueue_api::v1alpha1::{CheckpointDriver, CheckpointPolicy, PauseMode};
use tokio::time::Instant;

pub use address::pod_address;
pub use client::{CallError, CheckpointClient};
pub use outcome::{
    CheckpointOutcome, CheckpointReport, EngineLoad, Evidence, SkipReason, Step, driver_name,
};
use progress::Progress;

/// A queue's checkpoint driver, ready to call pods.
#[derive(Clone, Debug)]
pub struct Checkpointer {
    driver: Driver,
    /// The policy's own limit; the caller's deadline may be shorter.
    timeout: Duration,
    client: CheckpointClient,
}

#[derive(Clone, Debug)]
enum Driver {
    None,
    Vllm { port: u16, mode: PauseMode },
    Http { port: u16, path: String },
    Misconfigured(CheckpointDriver, &'static str),
}

impl Checkpointer {
    /// The driver `policy` describes, calling out through `client`.
    pub fn from_policy(policy: &CheckpointPolicy, client: &CheckpointClient) -> Self {
        let port = policy
            .port
            .and_then(|port| u16::try_from(port).ok())
            .filter(|port| *port > 0);
        let driver = match (policy.driver, port, policy.path.as_deref()) {
            (CheckpointDriver::None, _, _) => Driver::None,
            (CheckpointDriver::Vllm, Some(port), _) => Driver::Vllm {
                port,
                mode: policy.pause_mode.unwrap_or_default(),
            },
            (CheckpointDriver::Http, Some(port), Some(path)) if path.starts_with('/') => {
                Driver::Http {
                    port,
                    path: path.to_owned(),
                }
            }
            (driver @ (CheckpointDriver::Vllm | CheckpointDriver::Http), None, _) => {
                Driver::Misconfigured(driver, "checkpoint.port is missing or out of range")
            }
            (CheckpointDriver::Http, Some(_), _) => Driver::Misconfigured(
                CheckpointDriver::Http,
                "checkpoint.path is missing or not an absolute path",
            ),
        };
        Self {
            driver,
            timeout: if policy.timeout.is_negative() {
                Duration::ZERO
            } else {
                Duration::from(policy.timeout)
            },
            client: client.clone(),
        }
    }

    pub fn driver(&self) -> CheckpointDriver {
        match &self.driver {
            Driver::None => CheckpointDriver::None,
            Driver::Vllm { .. } => CheckpointDriver::Vllm,
            Driver::Http { .. } => CheckpointDriver::Http,
            Driver::Misconfigured(driver, _) => *driver,
        }
    }

    /// The policy's own limit on a checkpoint (a negative one, which the CRD refuses, as zero).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Checkpoints the pod at `address` (from [`pod_address`]: the pod's status in the API,
    /// never anything a tenant writes, and never the node's network). Returns by `deadline` (or
    /// the policy's timeout, if sooner) whatever happens; the outcome says what did.
    pub async fn checkpoint(
        &self,
        address: Result<IpAddr, SkipReason>,
        deadline: Instant,
    ) -> CheckpointReport {
        let started = Instant::now();
        let deadline = deadline.min(started + self.timeout);
        let driver = self.driver();
        let skipped = |target, reason| CheckpointReport {
            driver,
            target,
            outcome: CheckpointOutcome::Skipped(reason),
            elapsed: started.elapsed(),
        };
        let port = match &self.driver {
            Driver::None => return skipped(None, SkipReason::DriverNone),
            Driver::Misconfigured(_, why) => return skipped(None, SkipReason::Misconfigured(why)),
            Driver::Vllm { port, .. } | Driver::Http { port, .. } => *port,
        };
        let target = match address.and_then(|ip| pod_target(ip, port)) {
            Err(reason) => return skipped(None, reason),
            Ok(target) => target,
        };
        if deadline <= started {
            return skipped(Some(target), SkipReason::NoTimeLeft);
        }

        let progress = Progress::new();
        let run = async {
            match &self.driver {
                Driver::Vllm { mode, .. } => {
                    vllm::checkpoint(&self.client, target, *mode, &progress).await
                }
                Driver::Http { path, .. } => {
                    http::checkpoint(&self.client, target, path, deadline, &progress).await
                }
                Driver::None | Driver::Misconfigured(..) => {
                    CheckpointOutcome::Skipped(SkipReason::DriverNone)
                }
            }
        };
        let outcome = match tokio::time::timeout_at(deadline, run).await {
            Ok(outcome) => outcome,
            Err(_) => progress.timed_out(),
        };
        let report = CheckpointReport {
            driver,
            target: Some(target),
            outcome,
            elapsed: started.elapsed(),
        };
        tracing::info!(
            driver = report.driver_label(),
            %target,
            result = report.result(),
            elapsed_ms = report.elapsed.as_millis(),
            "{}", report.outcome
        );
        report
    }

    /// Lets the pod at `address` serve again after a checkpoint whose eviction will not come
    /// (its reclaim was abandoned): `vllm` posts `/resume`, the other drivers pause nothing.
    pub async fn resume(&self, address: Result<IpAddr, SkipReason>) -> Resumed {
        let Driver::Vllm { port, .. } = &self.driver else {
            return Resumed::NothingPaused;
        };
        let target = match address.and_then(|ip| pod_target(ip, *port)) {
            Ok(target) => target,
            Err(reason) => return Resumed::Failed(reason.to_string()),
        };
        match tokio::time::timeout(RESUME_TIMEOUT, vllm::resume(&self.client, target)).await {
            Ok(Ok(())) => Resumed::Resumed,
            Ok(Err(error)) => Resumed::Failed(format!("{target}: {error}")),
            Err(_) => Resumed::Failed(format!(
                "{target}: no answer within {} ms",
                RESUME_TIMEOUT.as_millis()
            )),
        }
    }
}

/// What asking a checkpointed pod to serve again came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resumed {
    /// The server answered that it serves again.
    Resumed,
    /// The driver pauses nothing (`http`, `none`): there is nothing to undo.
    NothingPaused,
    /// The server could not be asked, or refused.
    Failed(String),
}

/// A control route answers at once; the pass that abandons a reclaim waits on the call.
const RESUME_TIMEOUT: Duration = Duration::from_millis(500);

/// The address to call, refusing addresses no pod can have: a pod IP comes from the API, but
/// the operator still never calls the metadata service or a broadcast address on its behalf.
fn pod_target(ip: IpAddr, port: u16) -> Result<SocketAddr, SkipReason> {
    let impossible = ip.is_unspecified()
        || ip.is_multicast()
        || match ip {
            IpAddr::V4(v4) => v4.is_broadcast() || v4.is_link_local(),
            IpAddr::V6(v6) => v6.is_unicast_link_local(),
        };
    if impossible {
        Err(SkipReason::NotAPodIp(ip))
    } else {
        Ok(SocketAddr::new(ip, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_pod_ips_are_never_called() {
        for ip in [
            "169.254.169.254",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "fe80::1",
            "::",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(pod_target(ip, 8000), Err(SkipReason::NotAPodIp(ip)), "{ip}");
        }
        for ip in ["10.244.1.7", "127.100.0.7", "fd00::7"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(pod_target(ip, 8000), Ok(SocketAddr::new(ip, 8000)));
        }
    }
}
