//! Small statistics the reports need: percentiles, mean and spread over seeds, and
//! time-weighted averages of a level that changes at events.

use std::time::Duration;

use crate::engine::SimTime;

/// The `p`-th percentile (0–100) by the nearest-rank method, the definition used for latency
/// SLOs: the smallest value with at least `p`% of the sample at or below it. `None` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let rank = ((p.clamp(0.0, 100.0) / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Sorts a sample for [`percentile`], NaNs last.
pub fn sorted(mut sample: Vec<f64>) -> Vec<f64> {
    sample.sort_by(f64::total_cmp);
    sample
}

/// Mean and sample standard deviation.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct MeanStd {
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (n − 1); zero for fewer than two values.
    pub std: f64,
    /// Number of values.
    pub n: usize,
}

impl MeanStd {
    /// Summarises `values`; all zero for an empty slice.
    #[allow(clippy::cast_precision_loss)]
    pub fn of(values: &[f64]) -> Self {
        let n = values.len();
        if n == 0 {
            return Self::default();
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let std = if n > 1 {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Self { mean, std, n }
    }
}

/// A quantity that holds its value between events (allocated GPUs, pending pods): integrates it
/// over time for the average and keeps the peak, counting only time after `from`.
#[derive(Clone, Debug)]
pub struct TimeWeighted {
    from: SimTime,
    last_change: SimTime,
    value: f64,
    integral: f64,
    peak: Option<f64>,
}

impl TimeWeighted {
    /// Starts at `value` at time zero, measuring from `from` on (a warm-up before it is ignored).
    pub fn new(from: SimTime, value: f64) -> Self {
        Self {
            from,
            last_change: SimTime::ZERO,
            value,
            integral: 0.0,
            peak: None,
        }
    }

    /// The value changes to `value` at `now`.
    pub fn set(&mut self, now: SimTime, value: f64) {
        self.close_interval(now);
        self.value = value;
    }

    /// The current value.
    pub fn value(&self) -> f64 {
        self.value
    }

    /// Accounts for the current value held from the last change until `now`.
    fn close_interval(&mut self, now: SimTime) {
        let start = self.last_change.max(self.from);
        if now > start {
            self.integral += self.value * now.since(start).as_secs_f64();
            self.peak = Some(self.peak.map_or(self.value, |p| p.max(self.value)));
        }
        self.last_change = self.last_change.max(now);
    }

    /// Average over `[from, until]` and the peak held in that window.
    pub fn finish(&mut self, until: SimTime) -> (f64, f64) {
        self.close_interval(until);
        if self.from >= until {
            return (self.value, self.value);
        }
        let span = until.since(self.from).as_secs_f64();
        (self.integral / span, self.peak.unwrap_or(self.value))
    }
}

/// Renders a duration for tables: `850ms`, `12.3s`, `4.2m`, `3.1h`.
pub fn human_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 1.0 {
        format!("{:.0}ms", secs * 1000.0)
    } else if secs < 120.0 {
        format!("{secs:.1}s")
    } else if secs < 7200.0 {
        format!("{:.1}m", secs / 60.0)
    } else {
        format!("{:.1}h", secs / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s = sorted(vec![5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!(percentile(&s, 50.0), Some(3.0));
        assert_eq!(percentile(&s, 99.0), Some(5.0));
        assert_eq!(percentile(&s, 0.0), Some(1.0));
        assert_eq!(percentile(&s, 20.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn mean_and_spread() {
        let m = MeanStd::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert!((m.mean - 5.0).abs() < 1e-12);
        assert!((m.std - 2.138_089_935).abs() < 1e-6);
        assert!(MeanStd::of(&[3.0]).std.abs() < f64::EPSILON);
    }

    #[test]
    fn time_weighted_average_ignores_warmup() {
        let t = SimTime::from_secs_f64;
        let mut level = TimeWeighted::new(t(10.0), 0.0);
        level.set(t(5.0), 100.0); // during warm-up: neither averaged nor a peak
        level.set(t(8.0), 4.0);
        level.set(t(20.0), 8.0);
        level.set(t(25.0), 2.0);
        let (avg, peak) = level.finish(t(30.0));
        // (4 × 10 s + 8 × 5 s + 2 × 5 s) / 20 s
        assert!((avg - 4.5).abs() < 1e-9, "{avg}");
        assert!((peak - 8.0).abs() < 1e-9, "{peak}");
        let mut flat = TimeWeighted::new(t(10.0), 0.0);
        flat.set(t(5.0), 100.0);
        flat.set(t(8.0), 4.0);
        let (avg, peak) = flat.finish(t(30.0));
        assert!(
            (avg - 4.0).abs() < 1e-9 && (peak - 4.0).abs() < 1e-9,
            "a value held into the window is its peak"
        );
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(human_duration(Duration::from_secs(12)), "12.0s");
        assert_eq!(human_duration(Duration::from_mins(10)), "10.0m");
        assert_eq!(human_duration(Duration::from_hours(3)), "3.0h");
    }
}
