//! What both studies take from the machine they run on: the data folder, a progress bar on the
//! terminal and the wall clock.

use std::path::PathBuf;
use std::time::Instant;

use gpuqueue_sim::data;
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::SimulateArgs;

/// The data folder: `--data-dir`, else `$GPUQUEUE_DATA_DIR`, else a `shared/data` above the
/// current directory.
pub fn data_dir(args: &SimulateArgs) -> Option<PathBuf> {
    args.data_dir.clone().or_else(|| {
        std::env::current_dir()
            .ok()
            .and_then(|cwd| data::find_data_dir(&cwd))
    })
}

/// A progress bar on stderr (hidden when stderr is not a terminal or `--no-progress`).
pub fn progress_bar(args: &SimulateArgs, total: u64, what: &str) -> ProgressBar {
    if args.no_progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{{spinner}} {what} [{{bar:40}}] {{pos}}/{{len}} ({{per_sec}}, {{eta}} left)"
    )) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Starts a wall-clock stopwatch. Only the CLI reads the clock, to report events per second;
/// the simulation runs on simulated time.
#[allow(clippy::disallowed_methods)]
pub fn stopwatch() -> Instant {
    Instant::now()
}
