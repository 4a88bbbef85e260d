//! The pure gpuqueue policy. Everything the operator decides is decided here, from a
//! [`Snapshot`] of the cluster and a time passed in: no I/O, no async, no clock.
//!
//! - [`model`]: queues, nodes, pods and namespaces, converted from their Kubernetes objects.
//! - [`quantity`]: GPU amounts in milli-units and Kubernetes quantity strings.
//! - [`snapshot`]: the cluster's state, indexed, with placement and simulated removal.
//! - [`fragmentation`]: the FGD fragmentation measure and the workload mix it weighs.
//! - [`placement`]: node scorers (best-fit, GPU packing, FGD, ours).

pub mod fragmentation;
pub mod ledger;
pub mod model;
pub mod placement;
pub mod quantity;
pub mod snapshot;

pub use snapshot::Snapshot;
