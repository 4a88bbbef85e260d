//! The FGD authors' published results (`fgd-expected-results/`, from
//! `hkust-adsl/kubernetes-scheduler-simulator`), read so our tables can stand next to them.
//!
//! Each file has one row per (trace, policy, seed) and one column per *arrived* load level
//! 0..=130 (cumulative GPU request as a percentage of capacity); the cell is that file's metric
//! averaged over the pods submitted while the rounded arrived load was at that level.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::stats::MeanStd;

/// Highest arrived-load level of the published curves, in percent.
pub const MAX_ARRIVED_PERCENT: usize = 130;

/// Which published metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// GPU allocation ratio, % of capacity (`analysis_allo_discrete.csv`).
    Allocation,
    /// Fragmentation, % of capacity (`analysis_frag_discrete.csv`).
    FragmentationOfCapacity,
    /// Fragmentation, % of idle GPU (`analysis_frag_ratio_discrete.csv`).
    FragmentationOfIdle,
}

impl Metric {
    /// All three, in file order.
    pub const ALL: [Metric; 3] = [
        Metric::Allocation,
        Metric::FragmentationOfCapacity,
        Metric::FragmentationOfIdle,
    ];

    /// The file holding this metric.
    pub fn file_name(self) -> &'static str {
        match self {
            Metric::Allocation => "analysis_allo_discrete.csv",
            Metric::FragmentationOfCapacity => "analysis_frag_discrete.csv",
            Metric::FragmentationOfIdle => "analysis_frag_ratio_discrete.csv",
        }
    }
}

/// Why the published results could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// The file could not be read or is not CSV.
    #[error("{path}: {message}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A cell is not a number.
    #[error("{path}:{line}:{column}: {value:?} is not a number")]
    BadCell {
        /// The file.
        path: PathBuf,
        /// The line.
        line: u64,
        /// The column, 1-based.
        column: usize,
        /// The cell.
        value: String,
    },
}

/// One published curve: a metric over arrived load, for one trace, policy and seed.
type Curve = Vec<Option<f64>>;

/// The published curves of all three metrics.
#[derive(Debug, Default)]
pub struct Published {
    /// (metric, trace, policy) → one curve per seed.
    curves: BTreeMap<(Metric, String, String), Vec<(u64, Curve)>>,
}

impl Published {
    /// Reads the three files from `dir`.
    pub fn load(dir: &Path) -> Result<Self, ReferenceError> {
        let mut published = Self::default();
        for metric in Metric::ALL {
            let path = dir.join(metric.file_name());
            let text = std::fs::read_to_string(&path).map_err(|e| ReferenceError::Unreadable {
                path: path.clone(),
                message: e.to_string(),
            })?;
            published.add_file(metric, &path, &text)?;
        }
        Ok(published)
    }

    fn add_file(&mut self, metric: Metric, path: &Path, text: &str) -> Result<(), ReferenceError> {
        let unreadable = |e: csv::Error| ReferenceError::Unreadable {
            path: path.to_owned(),
            message: e.to_string(),
        };
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let header = reader.headers().map_err(unreadable)?.clone();
        // Level columns are the ones named 0..=130; the others are metadata.
        let levels: Vec<(usize, usize)> = header
            .iter()
            .enumerate()
            .filter_map(|(i, name)| {
                name.parse::<usize>()
                    .ok()
                    .filter(|&l| l <= MAX_ARRIVED_PERCENT)
                    .map(|l| (i, l))
            })
            .collect();
        let column = |name: &str| header.iter().position(|h| h == name);
        let (Some(workload), Some(policy), Some(seed)) =
            (column("workload"), column("sc_policy"), column("seed"))
        else {
            return Err(ReferenceError::Unreadable {
                path: path.to_owned(),
                message: "the header lacks workload, sc_policy or seed".to_owned(),
            });
        };
        for record in reader.records() {
            let record = record.map_err(unreadable)?;
            let line = record.position().map_or(0, csv::Position::line);
            let cell = |i: usize| record.get(i).unwrap_or_default();
            let number = |i: usize| -> Result<Option<f64>, ReferenceError> {
                let value = cell(i).trim();
                if value.is_empty() {
                    return Ok(None);
                }
                value
                    .parse()
                    .map(Some)
                    .map_err(|_| ReferenceError::BadCell {
                        path: path.to_owned(),
                        line,
                        column: i + 1,
                        value: value.to_owned(),
                    })
            };
            let seed_value = cell(seed)
                .trim()
                .parse()
                .map_err(|_| ReferenceError::BadCell {
                    path: path.to_owned(),
                    line,
                    column: seed + 1,
                    value: cell(seed).to_owned(),
                })?;
            let mut curve = vec![None; MAX_ARRIVED_PERCENT + 1];
            for &(i, level) in &levels {
                curve[level] = number(i)?;
            }
            let trace = cell(workload)
                .trim_start_matches("openb_pod_list_")
                .to_owned();
            self.curves
                .entry((metric, trace, cell(policy).to_owned()))
                .or_default()
                .push((seed_value, curve));
        }
        Ok(())
    }

    /// Mean and spread over seeds of `metric` at `arrived_percent`, for a trace (`default`,
    /// `cpu050`, …) and a published policy name (`06-FGD`, …). `None` when not published.
    pub fn at(
        &self,
        metric: Metric,
        trace: &str,
        policy: &str,
        arrived_percent: usize,
    ) -> Option<MeanStd> {
        let runs = self
            .curves
            .get(&(metric, trace.to_owned(), policy.to_owned()))?;
        let values: Vec<f64> = runs
            .iter()
            .filter_map(|(_, c)| c.get(arrived_percent).copied().flatten())
            .collect();
        (!values.is_empty()).then(|| MeanStd::of(&values))
    }

    /// The mean curve over seeds (`None` where no seed has a value).
    pub fn mean_curve(
        &self,
        metric: Metric,
        trace: &str,
        policy: &str,
    ) -> Option<Vec<Option<f64>>> {
        self.curves
            .get(&(metric, trace.to_owned(), policy.to_owned()))?;
        Some(
            (0..=MAX_ARRIVED_PERCENT)
                .map(|l| self.at(metric, trace, policy, l).map(|m| m.mean))
                .collect(),
        )
    }

    /// The traces that have published results.
    pub fn traces(&self) -> Vec<String> {
        let traces: std::collections::BTreeSet<String> =
            self.curves.keys().map(|(_, t, _)| t.clone()).collect();
        traces.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    #[test]
    fn averages_over_seeds_per_level() {
        let mut published = Published::default();
        let text = "workload,sc_policy,tune,seed,total_gpus,0,1,130\n\
                    openb_pod_list_default,06-FGD,1.3,42,6212,0.2,1.0,95.0\n\
                    openb_pod_list_default,06-FGD,1.3,43,6212,0.4,,96.0\n";
        published
            .add_file(Metric::Allocation, Path::new("a.csv"), text)
            .unwrap();
        let at130 = published
            .at(Metric::Allocation, "default", "06-FGD", 130)
            .unwrap();
        assert!((at130.mean - 95.5).abs() < 1e-9);
        assert_eq!(at130.n, 2);
        assert_eq!(
            published
                .at(Metric::Allocation, "default", "06-FGD", 1)
                .unwrap()
                .n,
            1
        );
        assert!(
            published
                .at(Metric::Allocation, "default", "06-FGD", 50)
                .is_none()
        );
        assert!(
            published
                .at(Metric::Allocation, "cpu050", "06-FGD", 130)
                .is_none()
        );
        assert_eq!(published.traces(), vec!["default".to_owned()]);
    }

    #[test]
    fn bad_cell_names_its_place() {
        let mut published = Published::default();
        let text = "workload,sc_policy,tune,seed,0\nopenb_pod_list_default,06-FGD,1.3,42,x\n";
        let err = published
            .add_file(Metric::Allocation, Path::new("a.csv"), text)
            .unwrap_err();
        assert_eq!(err.to_string(), "a.csv:2:5: \"x\" is not a number");
    }
}
