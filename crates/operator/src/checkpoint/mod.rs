//! Checkpointing a borrower pod before it is evicted (DESIGN §5 step 4).
//!
//! A [`Checkpointer`] is built from a queue's [`CheckpointPolicy`] and asks one pod, at its IP as
//! the API reports it and the queue's port, to get ready for eviction: `vllm` pauses the server
//! and waits until its metrics show it idle, `http` posts to a sidecar, `none` does nothing.
//! Whatever happens, the call returns a [`CheckpointReport`] by the deadline the caller gives:
//! a checkpoint never blocks an eviction, it is recorded and the owner's guarantee wins.

mod client;
mod http;
mod prometheus;
mod vllm;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use gpuqueue_api::v1alpha1::{CheckpointDriver, CheckpointPolicy, PauseMode};
use tokio::time::Instant;

pub use client::{CallError, CheckpointClient};

/// What a checkpoint achieved.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The pod confirmed it is ready to be evicted.
    Succeeded(Evidence),
    /// A call failed (connection refused, 5xx, a server that says it is not paused).
    Failed { step: Step, error: CallError },
    /// The deadline came first; `last_load` is what the metrics said last, if anything.
    TimedOut {
        step: Step,
        last_load: Option<EngineLoad>,
    },
    /// The pod does not offer the call (vLLM without dev mode answers 404 on `/pause`).
    Unsupported { step: Step, status: u16 },
    /// Nothing was called.
    Skipped(SkipReason),
}

/// How a successful checkpoint was confirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// vLLM is paused, no request is running or waiting, and the KV offload counters settled.
    Drained,
    /// vLLM is paused with its requests frozen (`pauseMode: keep`), offload counters settled.
    Frozen,
    /// vLLM accepted the pause but exposes no request metrics; a short settle wait stood in.
    Unmeasured,
    /// The sidecar answered 2xx: the checkpoint is durable.
    Acknowledged { status: u16 },
}

/// The call a checkpoint was at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `POST /pause?mode=...`
    Pause,
    /// `GET /metrics` until idle.
    Drain,
    /// `GET /is_paused`
    ConfirmPaused,
    /// The sidecar's `POST <path>`.
    Post,
}

/// vLLM's request gauges, summed over engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLoad {
    pub running: u64,
    pub waiting: u64,
}

/// Why nothing was called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// The queue's driver is `none`.
    DriverNone,
    /// The pod has no IP yet (not started), so there is nothing to call.
    NoPodIp,
    /// The pod's IP cannot be a pod's (unspecified, multicast, link-local such as the cloud
    /// metadata address): never called.
    NotAPodIp(IpAddr),
    /// The policy lacks a field its driver needs (the CRD's rules prevent this).
    Misconfigured(&'static str),
    /// The deadline had passed before the checkpoint could start.
    NoTimeLeft,
}

/// The result of one checkpoint: what was called, what came of it and how long it took.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointReport {
    pub driver: CheckpointDriver,
    /// The address called (`None` when skipped before a target was known).
    pub target: Option<SocketAddr>,
    pub outcome: Outcome,
    pub elapsed: Duration,
}

impl CheckpointReport {
    /// The `result` label of the checkpoint-outcome metric.
    pub fn result(&self) -> &'static str {
        match self.outcome {
            Outcome::Succeeded(_) => "succeeded",
            Outcome::Failed { .. } => "failed",
            Outcome::TimedOut { .. } => "timed_out",
            Outcome::Unsupported { .. } => "unsupported",
            Outcome::Skipped(_) => "skipped",
        }
    }

    /// The `driver` label of the checkpoint-outcome metric.
    pub fn driver_label(&self) -> &'static str {
        match self.driver {
            CheckpointDriver::Vllm => "vllm",
            CheckpointDriver::Http => "http",
            CheckpointDriver::None => "none",
        }
    }
}

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

    /// Checkpoints the pod at `pod_ip` (from the pod's status in the API, never from anything a
    /// tenant writes). Returns by `deadline` (or the policy's timeout, if sooner) whatever
    /// happens; the outcome says what did.
    pub async fn checkpoint(&self, pod_ip: Option<IpAddr>, deadline: Instant) -> CheckpointReport {
        let started = Instant::now();
        let deadline = deadline.min(started + self.timeout);
        let driver = self.driver();
        let skipped = |target, reason| CheckpointReport {
            driver,
            target,
            outcome: Outcome::Skipped(reason),
            elapsed: started.elapsed(),
        };
        let port = match &self.driver {
            Driver::None => return skipped(None, SkipReason::DriverNone),
            Driver::Misconfigured(_, why) => return skipped(None, SkipReason::Misconfigured(why)),
            Driver::Vllm { port, .. } | Driver::Http { port, .. } => *port,
        };
        let target = match pod_ip.map(|ip| pod_target(ip, port)) {
            None => return skipped(None, SkipReason::NoPodIp),
            Some(Err(reason)) => return skipped(None, reason),
            Some(Ok(target)) => target,
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
                    Outcome::Skipped(SkipReason::DriverNone)
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
}

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

/// Where a driver got to, kept outside its future so a timeout can report it.
#[derive(Debug)]
struct Progress {
    state: Mutex<(Step, Option<EngineLoad>)>,
}

impl Progress {
    fn new() -> Self {
        Self {
            state: Mutex::new((Step::Pause, None)),
        }
    }

    fn at(&self, step: Step) {
        self.lock().0 = step;
    }

    fn saw(&self, load: EngineLoad) {
        self.lock().1 = Some(load);
    }

    fn timed_out(&self) -> Outcome {
        let (step, last_load) = *self.lock();
        Outcome::TimedOut { step, last_load }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Step, Option<EngineLoad>)> {
        crate::sync::lock(&self.state)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pause => "POST /pause",
            Self::Drain => "GET /metrics",
            Self::ConfirmPaused => "GET /is_paused",
            Self::Post => "POST to the sidecar",
        })
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Succeeded(Evidence::Drained) => {
                f.write_str("paused; no request running or waiting, KV offload settled")
            }
            Self::Succeeded(Evidence::Frozen) => {
                f.write_str("paused with requests frozen; KV offload settled")
            }
            Self::Succeeded(Evidence::Unmeasured) => {
                f.write_str("paused; no request metrics to confirm idleness")
            }
            Self::Succeeded(Evidence::Acknowledged { status }) => {
                write!(f, "sidecar answered {status}: checkpoint durable")
            }
            Self::Failed { step, error } => write!(f, "{step} failed: {error}"),
            Self::TimedOut {
                step,
                last_load: Some(load),
            } => write!(
                f,
                "timed out at {step} with {} running and {} waiting",
                load.running, load.waiting
            ),
            Self::TimedOut {
                step,
                last_load: None,
            } => write!(f, "timed out at {step}"),
            Self::Unsupported { step, status } => write!(
                f,
                "{step} answered {status}: not offered (vLLM dev mode off?); evicting without it"
            ),
            Self::Skipped(reason) => write!(f, "skipped: {reason}"),
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DriverNone => f.write_str("the queue's checkpoint driver is none"),
            Self::NoPodIp => f.write_str("the pod has no IP"),
            Self::NotAPodIp(ip) => write!(f, "{ip} cannot be a pod IP"),
            Self::Misconfigured(why) => f.write_str(why),
            Self::NoTimeLeft => f.write_str("no time left in the budget"),
        }
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
