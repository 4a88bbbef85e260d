//! The pure gpuqueue policy. Everything the operator decides is decided here, from a
//! [`Snapshot`] of the cluster and a time passed in: no I/O, no async, no clock.
//!
//! The modules, bottom-up (each imports only those above it):
//! - [`quantity`]: GPU amounts in milli-units and Kubernetes quantity strings.
//! - [`termination`]: victim terminations observed per node, and what the reclaim budget keeps
//!   back for them.
//! - [`model`]: queues, nodes, pods and namespaces, converted from their Kubernetes objects,
//!   with the shared rules (the gate, which pods are GPU pods, which queue claims a namespace).
//! - [`ids`]: the indices a snapshot hands out for resources, models, nodes, pods and queues.
//! - [`devices`]: each node's device pools, what is free, who sits there, and the arithmetic of
//!   seating a pod; [`devices::Placement`] says where a pod goes.
//! - [`ledger`]: per queue and resource: allocated, borrowed, pending; which pods borrow.
//! - [`fragmentation`]: the FGD fragmentation measure and the workload mix it weighs.
//! - [`snapshot`]: the cluster's state, indexed, with read-only queries; building it
//!   (`snapshot/build.rs`), keeping it from build to build (`snapshot/kept.rs`), keeping devices
//!   and ledger in step (`snapshot/seating.rs`) and the changes planning tries
//!   (`snapshot/what_if.rs`).
//! - [`placement`]: node scorers (best-fit, GPU packing, FGD, ours) and tie-breaks.
//! - [`policy`]: the scorer and tie-break the operator and the simulator both decide with, and
//!   the placement search over a snapshot.
//! - `caps`: the nodes a queue's GPU memory and compute caps keep a pod off.
//! - [`reclaim`]: the node and minimal set of borrower pods to evict for an owner.
//! - [`burst`]: the reclaims of one pass on one node kept minimal as a set.
//! - [`pins`]: pinned pods kube-scheduler cannot bind lose their room (before the snapshot).
//! - [`admission`]: admit, borrow, reclaim or wait, for each pending pod in fair order.
//! - [`enforcement`]: which unadmitted pods to evict (over the ceiling, or on another queue's
//!   guarantee), after the cycle.
//! - [`status`]: queue status and conditions, mapped onto the API's `GpuQueueStatus`.

pub mod admission;
pub mod burst;
mod caps;
pub mod devices;
pub mod enforcement;
pub mod fragmentation;
pub mod ids;
pub mod ledger;
pub mod model;
pub mod pins;
pub mod placement;
pub mod policy;
pub mod quantity;
pub mod reclaim;
pub mod snapshot;
pub mod status;
pub mod termination;

pub use policy::Policy;
pub use snapshot::Snapshot;
