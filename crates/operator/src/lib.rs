//! The gpuqueue operator: everything that talks to the cluster. It observes (watches and
//! stores), asks the pure core what to do, and applies the answer (gates, events, status); it
//! decides nothing itself. The folders follow the data path:
//!
//! ```text
//! cluster/      watches ─▶ stores (+ assumed writes, debounced change signals)   every replica
//!   │
//!   ▼
//! admission/    observe ─▶ gpuqueue-core decides ─▶ apply ─▶ report              the leader
//!   │                                                │   └─▶ reclaim/ ─▶ checkpoint/
//!   ▼                                                ▼
//! writes/       pod patches, queue status, events (one API call each)
//!
//! webhook/      gate (or admit at creation) new GPU pods of claimed namespaces
//! ```
//!
//! Around the path: `run` (the wiring, where every component's metrics are registered),
//! `args`, `telemetry`, `metrics` (the registry), `http` (`/metrics`, `/healthz`, `/readyz`),
//! `leader` (leader election), `seal` (the HMAC that shows an admission is the operator's),
//! `clock` and `sync`.

pub mod admission;
pub mod args;
pub mod checkpoint;
pub mod clock;
pub mod cluster;
pub mod http;
pub mod leader;
pub mod metrics;
#[cfg(test)]
mod mock_api;
pub mod reclaim;
pub mod run;
pub mod seal;
pub mod sync;
pub mod telemetry;
pub mod webhook;
pub mod writes;

pub use args::Args;
pub use run::{RunError, run};
