//! What a checkpoint came to: its outcome, how success was confirmed, the step a failure or a
//! timeout stopped at, and the report the reclaim executor records. Shared by the drivers and
//! the [`Checkpointer`](super::Checkpointer) that runs them.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use gpuqueue_api::v1alpha1::CheckpointDriver;

use super::client::CallError;

/// What a checkpoint achieved.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckpointOutcome {
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
    /// The pod uses its node's network (`hostNetwork`, the node's IP, loopback): a call would
    /// reach whatever listens on the node, so it is never made.
    NodeNetwork { ip: IpAddr, how: &'static str },
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
    pub outcome: CheckpointOutcome,
    pub elapsed: Duration,
}

impl CheckpointReport {
    /// The `result` label of the checkpoint-outcome metric.
    pub fn result(&self) -> &'static str {
        match self.outcome {
            CheckpointOutcome::Succeeded(_) => "succeeded",
            CheckpointOutcome::Failed { .. } => "failed",
            CheckpointOutcome::TimedOut { .. } => "timed_out",
            CheckpointOutcome::Unsupported { .. } => "unsupported",
            CheckpointOutcome::Skipped(_) => "skipped",
        }
    }

    /// The `driver` label of the checkpoint-outcome metric.
    pub fn driver_label(&self) -> &'static str {
        driver_name(self.driver)
    }
}

/// The name of a checkpoint driver, as the CRD spells it: the `driver` label of the
/// checkpoint-outcome metric and of a handover record.
pub fn driver_name(driver: CheckpointDriver) -> &'static str {
    match driver {
        CheckpointDriver::Vllm => "vllm",
        CheckpointDriver::Http => "http",
        CheckpointDriver::None => "none",
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

impl fmt::Display for CheckpointOutcome {
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
            Self::NodeNetwork { ip, how } => write!(
                f,
                "the pod uses the node's network ({how}: {ip}); the operator calls only pod addresses"
            ),
            Self::Misconfigured(why) => f.write_str(why),
            Self::NoTimeLeft => f.write_str("no time left in the budget"),
        }
    }
}
