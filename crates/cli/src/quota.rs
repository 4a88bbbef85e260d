//! The quota study of `simulate --scenario`.

use crate::args::SimulateArgs;
use crate::simulate::SimulateError;

/// Runs the scenario's quota study.
pub fn run(_args: &SimulateArgs) -> Result<(), SimulateError> {
    Err(SimulateError::Usage(
        "the quota study needs core's admission; not wired yet".into(),
    ))
}
