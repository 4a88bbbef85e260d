//! The `kubectl-gpuqueue` binary; `kubectl gpuqueue ...` finds it on the PATH.

use std::error::Error;
use std::fmt::Write as _;
use std::process::ExitCode;

use clap::Parser;
use gpuqueue_cli::args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut stdout = std::io::stdout().lock();
    // The inspecting commands' messages already carry their cause; the simulator's errors
    // chain theirs.
    let result = match &cli.command {
        Command::Queues(args) => {
            gpuqueue_cli::queues::run(args, &mut stdout).map_err(|e| e.to_string())
        }
        Command::Explain(args) => {
            gpuqueue_cli::explain::run(args, now(), &mut stdout).map_err(|e| e.to_string())
        }
        Command::Handovers(args) => {
            gpuqueue_cli::handovers::run(args, now(), &mut stdout).map_err(|e| e.to_string())
        }
        Command::Top(args) => gpuqueue_cli::top::run(args, &mut stdout).map_err(|e| e.to_string()),
        Command::Simulate(args) => gpuqueue_cli::simulate::run(args).map_err(|e| with_causes(&e)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn with_causes(error: &dyn Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(message, "\n  caused by: {cause}");
        source = cause.source();
    }
    message
}

/// The wall clock, read once here: ages ("3m ago") are shown relative to it, and everything
/// below takes it as an argument so that rendering is testable.
#[allow(clippy::disallowed_methods)]
fn now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}
