//! Why `simulate` failed: the one error both studies return.

use gpuqueue_sim::report::ReportError;
use gpuqueue_sim::sampling::SamplingError;
use gpuqueue_sim::scenario::ScenarioError;
use gpuqueue_sim::trace::TraceError;
use gpuqueue_sim::workload::WorkloadError;

use crate::cluster::ClusterError;

/// Why `simulate` failed. Every message names the file or flag at fault.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// A flag has a bad value.
    #[error("{0}")]
    Usage(String),
    /// A trace file is unreadable or malformed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The scenario is unreadable or invalid.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// The scenario's load could not be built.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The submission sequence could not be built.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// The report could not be written.
    #[error(transparent)]
    Report(#[from] ReportError),
    /// The cluster or a manifest could not be read.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// Writing to the terminal failed.
    #[error("cannot write the summary: {0}")]
    Output(#[from] std::io::Error),
}
