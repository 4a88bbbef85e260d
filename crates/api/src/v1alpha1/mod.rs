//! Version `v1alpha1` of the `gpuqueue.io` API.

mod queue;

pub use queue::*;
