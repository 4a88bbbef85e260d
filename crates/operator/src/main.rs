//! `gpuqueue-operator`: parse the command line and run. Everything else lives in the library.

use clap::Parser;
use gpuqueue_operator::{Args, run};

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
