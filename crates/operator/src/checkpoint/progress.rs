//! Where a driver got to, kept outside its future so that a timeout can still say which step
//! it stopped at and what load the server showed last.

use std::sync::Mutex;

use super::outcome::{CheckpointOutcome, EngineLoad, Evidence, Step};

/// Where a driver got to, kept outside its future so a timeout can report it.
#[derive(Debug)]
pub(super) struct Progress {
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    step: Step,
    last_load: Option<EngineLoad>,
    /// What the drain proved, once it did.
    drained: Option<Evidence>,
}

impl Progress {
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                step: Step::Pause,
                last_load: None,
                drained: None,
            }),
        }
    }

    pub(super) fn at(&self, step: Step) {
        self.lock().step = step;
    }

    pub(super) fn saw(&self, load: EngineLoad) {
        self.lock().last_load = Some(load);
    }

    /// The drain proved the server idle (or frozen): what is left only confirms it.
    pub(super) fn drained(&self, evidence: Evidence) {
        self.lock().drained = Some(evidence);
    }

    /// What a driver stopped by its deadline came to. A drain already proven stands: the
    /// confirmation after it is the one a release without `/is_paused` does without too.
    pub(super) fn timed_out(&self) -> CheckpointOutcome {
        match *self.lock() {
            State {
                step: Step::ConfirmPaused,
                drained: Some(evidence),
                ..
            } => CheckpointOutcome::Succeeded(evidence),
            State {
                step, last_load, ..
            } => CheckpointOutcome::TimedOut { step, last_load },
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }
}
