//! `gpuqueue-operator`: parse the command line and run. Everything else lives in the library.

use clap::Parser;
use gpuqueue_operator::{Args, run};

/// jemalloc, with its background thread purging what the operator freed (after ~10 s): glibc's
/// malloc keeps the memory of a burst (the pass caches and watch events of 10,000 pods
/// arriving) in its arenas for good, so the operator at rest would hold its peak.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // Logging may not be up yet (a bad filter), so the reason goes to stderr as well.
            tracing::error!(%error, category = error.category(), "operator stopped");
            eprintln!("gpuqueue-operator: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
