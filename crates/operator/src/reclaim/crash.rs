//! **A test hook, not a feature.** With `GPUQUEUE_TEST_CRASH_AFTER=<phase>` in its environment
//! the operator exits with status 1 the moment a handover has completed that phase (`intent`,
//! `reserve`, `checkpoint`, `evictAccepted` or `victimsGone`), without releasing its lease or
//! finishing anything, as a `kill -9` would leave it. The end-to-end tests use it to kill the
//! operator at an exact point of a handover and check that the next process finishes it with no
//! second checkpoint and no second eviction. `checkpoint` fires after the first victim's
//! checkpoint returned, before its eviction.
//!
//! Unset (always, outside those tests) it does nothing; a set value is logged loudly at start,
//! and a value that names no phase stops the operator rather than being ignored.

use super::timeline::Phase;

/// The environment variable.
pub const ENV: &str = "GPUQUEUE_TEST_CRASH_AFTER";

/// Where to crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashPoint(Phase);

/// `GPUQUEUE_TEST_CRASH_AFTER` holds something other than a phase.
#[derive(Debug, thiserror::Error)]
#[error(
    "{ENV}={0:?} is not a handover phase (intent, reserve, checkpoint, evictAccepted, victimsGone); it is a test hook, unset it"
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
                Ok(Self(phase))
            }
            _ => Err(BadCrashPoint(value.to_owned())),
        }
    }

    /// Exits the process if `phase` is the crash point.
    pub fn reached(self, phase: Phase, reclaim: &str) {
        if self.0 == phase {
            tracing::error!(%phase, reclaim, "{ENV}: exiting after this phase, as the test asked");
            eprintln!("gpuqueue-operator: {ENV}={phase}: exiting during reclaim {reclaim}");
            std::process::exit(1);
        }
    }
}

/// Exits the process if `point` is `phase` (see the module documentation).
pub fn check(point: Option<CrashPoint>, phase: Phase, reclaim: &str) {
    if let Some(point) = point {
        point.reached(phase, reclaim);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_phases_inside_a_handover_are_crash_points() {
        assert_eq!(
            CrashPoint::parse("evictAccepted").unwrap(),
            CrashPoint(Phase::EvictAccepted)
        );
        for bad in ["plan", "claimsFreed", "ownerBound", "evicted", "INTENT"] {
            let error = CrashPoint::parse(bad).unwrap_err().to_string();
            assert!(error.contains(ENV) && error.contains(bad), "{error}");
        }
    }
}
