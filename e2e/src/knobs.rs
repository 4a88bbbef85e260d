//! Benchmark knobs from the environment (`BENCH_*`, `SOAK_*`): small values make a quick run.

use std::str::FromStr;

/// The number in `name`, or `default` when it is unset or not a number.
pub fn env_number<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The comma-separated numbers in `name` (`12,22`), or `default` when it is unset or any of
/// them is not a number.
pub fn env_numbers<T: FromStr>(name: &str, default: Vec<T>) -> Vec<T> {
    std::env::var(name)
        .ok()
        .and_then(|text| numbers(&text))
        .unwrap_or(default)
}

/// The comma-separated numbers in `text`, or `None` if any is not one.
fn numbers<T: FromStr>(text: &str) -> Option<Vec<T>> {
    text.split(',').map(|n| n.trim().parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::numbers;

    #[test]
    fn a_list_is_read_whole_or_not_at_all() {
        assert_eq!(numbers::<usize>("12,22"), Some(vec![12, 22]));
        assert_eq!(numbers::<usize>(" 12 , 22 "), Some(vec![12, 22]));
        assert_eq!(numbers::<usize>("12"), Some(vec![12]));
        assert_eq!(numbers::<usize>("12,x"), None);
        assert_eq!(numbers::<usize>(""), None);
    }
}
