//! Percentiles (nearest rank: with 50 samples, p99 is the largest).

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// p50, p95, p99 and max of `values`.
pub fn summary(mut values: Vec<f64>) -> [f64; 4] {
    values.sort_by(f64::total_cmp);
    [
        percentile(&values, 0.50),
        percentile(&values, 0.95),
        percentile(&values, 0.99),
        values.last().copied().unwrap_or(f64::NAN),
    ]
}

/// Milliseconds as a float, for [`summary`].
#[allow(clippy::cast_precision_loss)] // milliseconds of a benchmark fit in 52 bits
pub fn ms(value: i64) -> f64 {
    value as f64
}
