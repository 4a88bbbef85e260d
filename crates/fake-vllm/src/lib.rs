//! A fake vLLM server for tests and the demo: vLLM's real routes, status codes, bodies and
//! metric names (see `shared/research/vllm-checkpoint.md` §1 and §5), a simulated engine whose
//! in-flight requests drain with a realistic lag after a pause, injectable faults per route, and
//! a log of the calls it received. One process may serve several addresses (a KWOK pod's
//! loopback IP each), every one with its own state.
//!
//! A request's way through the modules: `listener` accepts it and sends `/_fake/...` to `admin`
//! and anything else to `server` (logged, then `faults`), where vLLM's `routes` (with
//! `generate`, `metrics` and vLLM's error bodies in `errors`) answer from the `engine`. `fleet`
//! holds several servers and the admin routes that reach them. No module imports one before it.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use gpuqueue_fake_vllm::{Config, FakeVllm, FaultAction};
//! let config = Config { dev_mode: true, ..Config::default() };
//! let server = FakeVllm::start(config, "127.100.0.7:0".parse().unwrap()).await?;
//! server.set_fault_action("/pause", FaultAction::Hang);
//! assert!(server.calls_to("/pause").is_empty());
//! # Ok(()) }
//! ```

// Helpers return the early HTTP response as their error; boxing it would only add noise.
#![allow(clippy::result_large_err)]

mod admin;
mod config;
mod engine;
mod errors;
mod faults;
mod fleet;
mod generate;
mod listener;
mod metrics;
mod routes;
mod server;

pub use config::{Config, ErrorStyle, Profile, parse_duration};
pub use engine::{FinishReason, PauseMode, Phase, SleepTag, Snapshot, Weights};
pub use faults::{ANY_ROUTE, Call, Fault, FaultAction, RouteFault};
pub use fleet::{Fleet, fleet_router};
pub use routes::registered as registered_routes;
pub use server::{FakeVllm, Listening};
