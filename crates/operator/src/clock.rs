//! The operator's one clock. The core reads no clock (time is passed in); the operator reads
//! wall-clock time here and only here, so every other module takes `now` as an argument and can
//! be tested at any instant.

use jiff::Timestamp;

/// The current wall-clock time.
#[allow(clippy::disallowed_methods)] // the one place the operator reads the clock
pub fn now() -> Timestamp {
    Timestamp::now()
}
