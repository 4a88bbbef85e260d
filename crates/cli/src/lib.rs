//! `kubectl-gpuqueue`: the kubectl plugin of gpuqueue. `simulate` runs the deterministic
//! simulator (`gpuqueue-sim`) on a trace or a scenario, optionally starting from the live
//! cluster's nodes and queues.

pub mod args;
pub mod cluster;
pub mod quota;
pub mod simulate;
