//! A deterministic discrete-event simulator of gpuqueue's policies on real GPU cluster traces.
//!
//! It drives the same pure policy code as the operator (`gpuqueue-core`) and answers two
//! questions without a cluster:
//! - **placement**: how much of the cluster a placement policy fills, and how much capacity it
//!   leaves fragmented, on the Alibaba openb trace in the FGD paper's setup ([`sampling`]);
//! - **quotas**: how busy a multi-tenant cluster stays, and how long owners wait, under no
//!   isolation, static quotas, or borrow-and-reclaim ([`scenario`]).
//!
//! Runs are pure functions of their inputs and seed: the clock is simulated ([`engine`]) and
//! every random draw comes from a seeded ChaCha generator.
//!
//! - inputs: [`trace`] (openb CSV lists), [`scenario`] (the quota-study YAML), [`workload`]
//!   (a scenario's arrivals), [`data`] (where the real data lives), [`reference`] (the FGD
//!   authors' published curves), [`convert`] (trace rows to the core's model);
//! - runs: [`placement`] (the FGD paper's experiment), [`quota`] (three quota policies on one
//!   scenario), both on [`engine`]'s clock or submission order;
//! - measurements and output: [`curves`], [`quota_metrics`], [`stats`], [`report`],
//!   [`placement_report`], [`quota_report`].

pub mod convert;
pub mod curves;
pub mod data;
pub mod engine;
pub mod placement;
pub mod placement_report;
pub mod quota;
pub mod quota_metrics;
pub mod quota_report;
pub mod reference;
pub mod report;
pub mod sampling;
pub mod scenario;
pub mod stats;
pub mod trace;
pub mod workload;
