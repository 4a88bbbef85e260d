//! The `kubectl-gpuqueue` binary; `kubectl gpuqueue ...` finds it on the PATH.

use std::process::ExitCode;

use clap::Parser;
use gpuqueue_cli::args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Simulate(args) => gpuqueue_cli::simulate::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}
