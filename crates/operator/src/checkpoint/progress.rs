//! Where a driver got to, kept outside its future so that a timeout can still say which step
//! it stopped at and what load the server showed last.

use std::sync::Mutex;

use super::outcome::{CheckpointOutcome, EngineLoad, Step};

/// Where a driver got to, kept outside its future so a timeout can report it.
#[derive(Debug)]
pub(super) struct Progress {
    state: Mutex<(Step, Option<EngineLoad>)>,
}

impl Progress {
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::new((Step::Pause, None)),
        }
    }

    pub(super) fn at(&self, step: Step) {
        self.lock().0 = step;
    }

    pub(super) fn saw(&self, load: EngineLoad) {
        self.lock().1 = Some(load);
    }

    pub(super) fn timed_out(&self) -> CheckpointOutcome {
        let (step, last_load) = *self.lock();
        CheckpointOutcome::TimedOut { step, last_load }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Step, Option<EngineLoad>)> {
        crate::sync::lock(&self.state)
    }
}
