//! Turning a placement run into the published curves: one observation after every submitted
//! pod, binned by arrived load exactly as the FGD authors' analysis scripts do
//! (`experiments/analysis/merge_*_discrete*.py`), so our numbers and theirs mean the same.
//!
//! For each level `l` in 0..=130 the scripts take the observations whose arrived load, as a
//! percentage of capacity rounded to an integer, equals `l` (or, when there are none, lies
//! within `l ± 1`) and average them: the allocation ratio per observation rounded to two
//! decimals first, the fragmentation amount in milli-GPU, and the fragmentation ratio.

use crate::reference::MAX_ARRIVED_PERCENT;

/// The cluster after one submission (or before the first).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// GPU request submitted so far (placed or not), milli-GPU.
    pub arrived_milli: u64,
    /// GPU allocated, milli-GPU.
    pub allocated_milli: u64,
    /// Fragmented GPU (the FGD measure), milli-GPU.
    pub fragmented_milli: f64,
    /// Unallocated GPU, milli-GPU.
    pub idle_milli: u64,
}

/// One run's curves over arrived load, one entry per level 0..=130 (`None` where the run has
/// no observation within a level of it).
#[derive(Clone, Debug, PartialEq)]
pub struct Curves {
    /// GPU allocation, % of capacity.
    pub allocation: Vec<Option<f64>>,
    /// Fragmentation, % of capacity.
    pub fragmentation_of_capacity: Vec<Option<f64>>,
    /// Fragmentation, % of idle GPU.
    pub fragmentation_of_idle: Vec<Option<f64>>,
}

/// Rounds half to even at `digits` decimals, as Python's `round` does.
fn round_to(value: f64, digits: i32) -> f64 {
    let scale = 10_f64.powi(digits);
    (value * scale).round_ties_even() / scale
}

impl Curves {
    /// Bins `observations` of a cluster with `capacity_gpus` GPUs.
    #[allow(clippy::cast_precision_loss)] // milli-GPU counts are far below 2^52
    pub fn from_observations(observations: &[Observation], capacity_gpus: u64) -> Self {
        let capacity = capacity_gpus as f64;
        let rows: Vec<(f64, f64, f64, f64)> = observations
            .iter()
            .map(|o| {
                let level = round_to(o.arrived_milli as f64 / capacity / 10.0, 0);
                let allocation = round_to(o.allocated_milli as f64 / capacity / 10.0, 2);
                let ratio = if o.idle_milli == 0 {
                    f64::NAN
                } else {
                    100.0 * o.fragmented_milli / o.idle_milli as f64
                };
                (level, allocation, o.fragmented_milli, ratio)
            })
            .collect();
        let mut curves = Curves {
            allocation: vec![None; MAX_ARRIVED_PERCENT + 1],
            fragmentation_of_capacity: vec![None; MAX_ARRIVED_PERCENT + 1],
            fragmentation_of_idle: vec![None; MAX_ARRIVED_PERCENT + 1],
        };
        for level in 0..=MAX_ARRIVED_PERCENT {
            let l = level as f64;
            let mut bin: Vec<&(f64, f64, f64, f64)> =
                rows.iter().filter(|r| (r.0 - l).abs() < 0.5).collect();
            if bin.is_empty() {
                bin = rows
                    .iter()
                    .filter(|r| (r.0 - l).abs() <= 1.0 + 1e-9)
                    .collect();
            }
            if bin.is_empty() {
                continue;
            }
            let n = bin.len() as f64;
            let mean =
                |f: fn(&(f64, f64, f64, f64)) -> f64| bin.iter().map(|r| f(r)).sum::<f64>() / n;
            curves.allocation[level] = Some(round_to(mean(|r| r.1), 2));
            curves.fragmentation_of_capacity[level] =
                Some(round_to(100.0 * mean(|r| r.2) / 1000.0 / capacity, 2));
            // pandas' mean skips NaN (a full cluster has no idle GPU to divide by).
            let ratios: Vec<f64> = bin.iter().map(|r| r.3).filter(|v| v.is_finite()).collect();
            if !ratios.is_empty() {
                curves.fragmentation_of_idle[level] =
                    Some(ratios.iter().sum::<f64>() / ratios.len() as f64);
            }
        }
        curves
    }

    /// The last level with an allocation value: the run's final arrived load.
    pub fn last_level(&self) -> Option<usize> {
        self.allocation.iter().rposition(Option::is_some)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    fn obs(arrived: u64, allocated: u64, frag: f64, idle: u64) -> Observation {
        Observation {
            arrived_milli: arrived,
            allocated_milli: allocated,
            fragmented_milli: frag,
            idle_milli: idle,
        }
    }

    #[test]
    fn bins_by_rounded_arrived_load() {
        // 10 GPUs: 1% = 100 milli.
        let observations = [
            obs(0, 0, 1000.0, 10_000),
            obs(40, 40, 1000.0, 9_960),   // 0.4% → level 0
            obs(160, 160, 2000.0, 9_840), // 1.6% → level 2
            obs(240, 200, 3000.0, 9_800), // 2.4% → level 2
        ];
        let curves = Curves::from_observations(&observations, 10);
        assert_eq!(curves.allocation[0], Some(0.2)); // mean of 0.0 and 0.4
        assert_eq!(curves.fragmentation_of_capacity[0], Some(10.0));
        // Level 1 has no observation of its own: it takes levels 0..=2.
        assert_eq!(curves.allocation[1], Some(1.0)); // mean of 0, 0.4, 1.6, 2.0
        assert_eq!(curves.allocation[2], Some(1.8));
        assert_eq!(curves.fragmentation_of_capacity[2], Some(25.0));
        assert!(
            (curves.fragmentation_of_idle[2].unwrap() - (2000.0 / 9840.0 + 3000.0 / 9800.0) * 50.0)
                .abs()
                < 1e-9
        );
        assert_eq!(curves.allocation[3], Some(1.8), "level 3 borrows level 2");
        assert_eq!(curves.allocation[4], None);
        assert_eq!(curves.last_level(), Some(3));
    }

    #[test]
    fn python_rounding() {
        assert!((round_to(2.5, 0) - 2.0).abs() < f64::EPSILON);
        assert!((round_to(3.5, 0) - 4.0).abs() < f64::EPSILON);
        assert!((round_to(95.391, 2) - 95.39).abs() < 1e-12);
    }

    #[test]
    fn full_cluster_has_no_ratio() {
        let curves = Curves::from_observations(&[obs(1000, 1000, 0.0, 0)], 1);
        assert_eq!(curves.fragmentation_of_idle[100], None);
        assert_eq!(curves.allocation[100], Some(100.0));
    }
}
