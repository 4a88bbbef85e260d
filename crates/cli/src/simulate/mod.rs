//! `kubectl-gpuqueue simulate`: runs a study, prints its headline table and writes the report.
//!
//! - `placement`: the placement study of `--trace NODES PODS...` (the FGD comparison);
//! - `quota`: the quota study of `--scenario`, optionally on the live cluster (`--from-cluster`)
//!   and with proposed queue changes (`--queue`);
//! - `host` and `error`: what both share (the data folder, progress, the stopwatch; the error).

mod error;
mod host;
mod placement;
mod quota;

pub use error::SimulateError;

use crate::args::SimulateArgs;

/// Runs the study the arguments ask for.
pub fn run(args: &SimulateArgs) -> Result<(), SimulateError> {
    if args.trace.is_empty() {
        quota::run(args)
    } else {
        placement::run(args)
    }
}
