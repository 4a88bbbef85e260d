//! `kubectl-gpuqueue`: the kubectl plugin of gpuqueue.
//!
//! - `queues`, `explain`, `handovers` read what the operator wrote (queue status, pod
//!   annotations, events) and tell it to a person; they never write to the cluster and decide
//!   nothing themselves (which queue claims a namespace and whether a pod is gated are the
//!   core's rules, `gpuqueue_core::model::{claim_of, is_gated}`). `explain` is a folder that
//!   reads (`explain/read`), explains (`explain/facts`, pure) and renders (`explain/text`).
//! - `top` shows each node's GPU allocation and fragmentation, measured by the core from the
//!   nodes and pods it reads (`top/read`, `top/pools`, `top/text`).
//! - `simulate` runs the deterministic simulator (`gpuqueue-sim`) on a trace or a scenario,
//!   optionally starting from the live cluster's nodes and queues: `simulate/placement` is the
//!   trace study, `simulate/quota` the scenario study, and both share only the leaves
//!   `simulate/host` (data folder, progress, stopwatch) and `simulate/error`.

pub mod args;
pub mod cluster;
pub mod connect;
pub mod explain;
pub mod handovers;
pub mod queues;
pub mod render;
pub mod simulate;
pub mod top;
