//! The operator's one clock. The core reads no clock (time is passed in); the operator reads
//! wall-clock time here and only here, so every other module takes `now` as an argument and can
//! be tested at any instant.
//!
//! Besides the wall clock, the CPU time of the calling thread: a pass's wall time on a busy
//! machine includes the time other processes held the CPU, its CPU time does not.

use std::time::Duration;

use jiff::Timestamp;
use nix::time::{ClockId, clock_gettime};

/// The current wall-clock time.
#[allow(clippy::disallowed_methods)] // the one place the operator reads the clock
pub fn now() -> Timestamp {
    Timestamp::now()
}

/// The CPU time the calling thread has used; zero where the system cannot say.
pub fn thread_cpu_time() -> Duration {
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(Duration::ZERO, Duration::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_works_uses_cpu_time_and_a_sleeping_one_does_not() {
        let before = thread_cpu_time();
        let mut x = 0u64;
        while thread_cpu_time().saturating_sub(before) < Duration::from_millis(5) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(thread_cpu_time() > before);
        let slept = thread_cpu_time();
        std::thread::sleep(Duration::from_millis(50));
        assert!(thread_cpu_time().saturating_sub(slept) < Duration::from_millis(50));
    }
}
