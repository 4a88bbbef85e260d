//! The gpuqueue operator: everything that talks to the cluster. It observes (watches and
//! stores), asks the pure core what to do, and applies the answer (gates, events, status); it
//! decides nothing itself.
//!
//! ```text
//! watches ─▶ stores ─▶ snapshot ─▶ gpuqueue-core decides ─▶ apply (gate, pin, event, status)
//!                 └──▶ webhook: gate new GPU pods of claimed namespaces
//! ```
//!
//! One module per concern: [`args`] (the command line), [`telemetry`] (logs), [`metrics`] and
//! [`http`] (`/metrics`, `/healthz`, `/readyz`), [`stores`] (reflectors), [`observe`] (stores
//! into the core's model), [`debounce`] (bursts of changes), [`assumed`] (writes the stores
//! have not shown yet), [`patch`] (pod writes), [`status`] (queue status writes), [`events`],
//! [`webhook`] (the mutating webhook and its certificates), [`leader`] (leader election),
//! [`checkpoint`] (checkpoint drivers for reclaim), [`reclaim`] (the reclaim executor: intent,
//! checkpoint, eviction, handover, recovery after a restart), [`clock`] (the one place that
//! reads the time), [`admission`] (the leader's loop) and [`run`] (the wiring).

pub mod admission;
pub mod args;
pub mod assumed;
pub mod at_creation;
pub mod checkpoint;
pub mod clock;
pub mod debounce;
pub mod events;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod observe;
pub mod patch;
pub mod reclaim;
pub mod run;
pub mod status;
pub mod sync;
pub mod stores;
pub mod telemetry;
pub mod webhook;

pub use args::Args;
pub use run::{RunError, run};
