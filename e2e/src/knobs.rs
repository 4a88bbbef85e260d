//! Benchmark knobs from the environment (`BENCH_*`, `SOAK_*`): small values make a quick run.

use std::str::FromStr;

/// The number in `name`, or `default` when it is unset or not a number.
pub fn env_number<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
