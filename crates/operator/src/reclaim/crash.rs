//! **A test hook, not a feature.** With `GPUQUEUE_TEST_CRASH_AFTER=<phase>` in its environment
//! the operator exits with status 1 the moment a handover has completed that phase (`intent`,
//! `reserve`, `checkpoint`, `evictAccepted` or `victimsGone`), or once its records are written
//! (`recorded`: the last step, clearing the owner's intent, is not taken), without releasing
//! its lease or finishing anything, as a `kill -9` would leave it. The end-to-end tests use it
//! to kill the operator at an exact point of a handover and check that the next process
//! finishes it with no second checkpoint and no second eviction. `checkpoint` fires after the
//! first victim's checkpoint returned, before its eviction.
//!
//! Unset (always, outside those tests) it does nothing; a set value is logged loudly at start,
//! and a value that names no phase stops the operator rather than being ignored.

use super::timeline::Phase;

/// The environment variable.
pub const ENV: &str = "GPUQUEUE_TEST_CRASH_AFTER";

/// Where to crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// Right after a phase of the handover's timeline.
    After(Phase),
    /// Once the handover's records are written, before its owner's intent is cleared.
    Recorded,
}

/// The value naming [`CrashPoint::Recorded`].
const RECORDED: &str = "recorded";

/// `GPUQUEUE_TEST_CRASH_AFTER` holds something other than a phase.
#[derive(Debug, thiserror::Error)]
#[error(
    "{ENV}={0:?} is not a handover phase (intent, reserve, checkpoint, evictAccepted, victimsGone) or recorded; it is a test hook, unset it"
)]
pub struct BadCrashPoint(String);

impl CrashPoint {
    /// The crash point the environment asks for, if any.
    pub fn from_env() -> Result<Option<Self>, BadCrashPoint> {
        std::env::var(ENV)
            .ok()
            .filter(|value| !value.is_empty())
            .map(|value| Self::parse(&value))
            .transpose()
    }

    fn parse(value: &str) -> Result<Self, BadCrashPoint> {
        match Phase::parse(value) {
            Some(phase)
                if !matches!(phase, Phase::Plan | Phase::ClaimsFreed | Phase::OwnerBound) =>
            {
                Ok(Self::After(phase))
            }
            None if value == RECORDED => Ok(Self::Recorded),
            _ => Err(BadCrashPoint(value.to_owned())),
        }
    }

    /// Exits the process if it is `self`, now reached.
    fn reach(self, point: Self, reclaim: &str) {
        if self == point {
            let name = match point {
                Self::After(phase) => phase.as_str(),
                Self::Recorded => RECORDED,
            };
            tracing::error!(
                point = name,
                reclaim,
                "{ENV}: exiting here, as the test asked"
            );
            eprintln!("gpuqueue-operator: {ENV}={name}: exiting during reclaim {reclaim}");
            std::process::exit(1);
        }
    }
}

/// Exits the process if `point` is `reached` (see the module documentation).
pub fn check(point: Option<CrashPoint>, reached: CrashPoint, reclaim: &str) {
    if let Some(point) = point {
        point.reach(reached, reclaim);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_phases_inside_a_handover_are_crash_points() {
        assert_eq!(
            CrashPoint::parse("evictAccepted").unwrap(),
            CrashPoint::After(Phase::EvictAccepted)
        );
        assert_eq!(CrashPoint::parse("recorded").unwrap(), CrashPoint::Recorded);
        for bad in ["plan", "claimsFreed", "ownerBound", "evicted", "INTENT"] {
            let error = CrashPoint::parse(bad).unwrap_err().to_string();
            assert!(error.contains(ENV) && error.contains(bad), "{error}");
        }
    }
}
