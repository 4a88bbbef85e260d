//! Invariants checked while a test or the soak runs, from watches sampled after every change
//! they apply and every 100 ms meanwhile.
//!
//! - [`QuotaSampler`] reads only pods, so it judges any system that enforces the quota
//!   (gpuqueue or a peer such as Kueue): `make bench-peers` uses it.
//! - [`InvariantChecker`] judges gpuqueue itself: its pods, GpuQueues (their quotas, budgets
//!   and `status.reclaimsInFlight`), nodes, the evictions kube-apiserver audited and, at the
//!   end, the checkpoint calls the fake vLLM servers logged (`rules.rs` says which).

mod audit;
mod checker;
mod quota;
mod rules;
mod world;

pub use audit::{AuditTail, AuditedRequest};
pub use checker::{CheckerConfig, InvariantChecker, InvariantReport, reflect, wall_clock_ms};
pub use quota::{QuotaReport, QuotaSampler, SAMPLE_INTERVAL, TenantQuota, Violation};
pub use rules::{Allowances, CheckpointCall, Eviction, InvariantViolation, Rule};
