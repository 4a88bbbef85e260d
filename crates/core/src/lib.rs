//! The pure gpuqueue policy. Everything the operator decides is decided here, from a
//! [`Snapshot`] of the cluster and a time passed in: no I/O, no async, no clock.
//!
//! - [`model`]: queues, nodes, pods and namespaces, converted from their Kubernetes objects.
//! - [`quantity`]: GPU amounts in milli-units and Kubernetes quantity strings.
//! - [`snapshot`]: the cluster's state, indexed, with placement and simulated removal.
//! - [`fragmentation`]: the FGD fragmentation measure and the workload mix it weighs.
//! - [`placement`]: node scorers (best-fit, GPU packing, FGD, ours).
//! - [`ledger`]: per queue and resource: allocated, borrowed, pending; which pods borrow.
//! - [`admission`]: admit, borrow, reclaim or wait, for each pending pod in fair order.
//! - [`reclaim`]: the node and minimal set of borrower pods to evict for an owner.
//! - [`status`]: queue status and conditions, mapped onto the API's `GpuQueueStatus`.

pub mod admission;
pub mod fragmentation;
pub mod ledger;
pub mod model;
pub mod placement;
pub mod quantity;
pub mod reclaim;
pub mod snapshot;
pub mod status;

pub use snapshot::Snapshot;
