//! Loading the Alibaba `cluster-trace-gpu-v2023` ("openb") node and pod lists, or any CSV in the
//! same layout, with an error that names the file, line, column and broken rule of a bad row.
//!
//! Columns are found by header name, so their order does not matter and extra columns are
//! ignored. Node lists need `sn,cpu_milli,memory_mib,gpu,model`; pod lists need
//! `name,cpu_milli,memory_mib,num_gpu,gpu_milli`, and may carry `gpu_spec,qos,pod_phase,
//! creation_time,deletion_time,scheduled_time` (the `multigpu` variants have only the first
//! five).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Most GPUs one node or one pod may have: above any real machine, low enough to catch a
/// memory size pasted into the GPU column.
pub const MAX_GPUS_PER_NODE: u32 = 64;
/// A whole GPU in milli-GPU, the unit of `gpu_milli`.
pub const MILLI_PER_GPU: u32 = 1000;

/// One machine of a node list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceNode {
    /// `sn`: the node name.
    pub name: String,
    /// `cpu_milli`: CPU capacity in milli-cores.
    pub cpu_milli: u32,
    /// `memory_mib`: host memory in MiB.
    pub memory_mib: u64,
    /// `gpu`: number of GPUs.
    pub gpus: u32,
    /// `model`: GPU model; `None` on CPU-only nodes (and where the list leaves it empty).
    pub gpu_model: Option<String>,
}

/// Quality-of-service class of a trace task.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize, serde::Serialize,
)]
pub enum Qos {
    /// Latency-sensitive (online serving).
    #[serde(rename = "LS")]
    LatencySensitive,
    /// Best effort (batch).
    #[serde(rename = "BE")]
    BestEffort,
    /// Kubernetes `Burstable`.
    Burstable,
    /// Kubernetes `Guaranteed`.
    Guaranteed,
}

impl Qos {
    const NAMES: [(&'static str, Qos); 4] = [
        ("LS", Qos::LatencySensitive),
        ("BE", Qos::BestEffort),
        ("Burstable", Qos::Burstable),
        ("Guaranteed", Qos::Guaranteed),
    ];

    /// The spelling used in the trace.
    pub fn as_str(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, q)| *q == self)
            .map_or("", |(name, _)| name)
    }
}

impl fmt::Display for Qos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Phase of a trace task when the trace was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodPhase {
    /// Still running at the end of the trace (its deletion time is the trace's end).
    Running,
    /// Completed.
    Succeeded,
    /// Failed.
    Failed,
    /// Never scheduled.
    Pending,
}

impl PodPhase {
    const NAMES: [(&'static str, PodPhase); 4] = [
        ("Running", PodPhase::Running),
        ("Succeeded", PodPhase::Succeeded),
        ("Failed", PodPhase::Failed),
        ("Pending", PodPhase::Pending),
    ];
}

/// One task of a pod list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracePod {
    /// `name`: the task name, unique within the list.
    pub name: String,
    /// `cpu_milli`: CPU request in milli-cores.
    pub cpu_milli: u32,
    /// `memory_mib`: memory request in MiB.
    pub memory_mib: u64,
    /// `num_gpu`: number of GPUs requested.
    pub num_gpu: u32,
    /// `gpu_milli`: share of *each* requested GPU, in milli-GPU (1000 = whole GPU).
    pub gpu_milli: u32,
    /// `gpu_spec`: allowed GPU models in the order the trace lists them (duplicates kept, as
    /// the published simulator groups task shapes by the raw value); empty = any model.
    pub gpu_spec: Vec<String>,
    /// `qos`, when the list has it.
    pub qos: Option<Qos>,
    /// `pod_phase`, when the list has it.
    pub phase: Option<PodPhase>,
    /// `creation_time` in seconds since the trace start.
    pub creation_time: Option<u64>,
    /// `deletion_time` in seconds since the trace start.
    pub deletion_time: Option<u64>,
    /// `scheduled_time` in seconds since the trace start.
    pub scheduled_time: Option<u64>,
}

impl TracePod {
    /// GPU request summed over the pod's GPUs, in milli-GPU.
    pub fn total_gpu_milli(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    /// How long the task ran, where the trace says so: from scheduling to deletion, for tasks
    /// that finished (`Succeeded` or `Failed`). Running tasks are cut off by the trace's end and
    /// pending ones never ran, so neither has a duration.
    pub fn completed_duration_secs(&self) -> Option<u64> {
        match self.phase? {
            PodPhase::Succeeded | PodPhase::Failed => {
                self.deletion_time?.checked_sub(self.scheduled_time?)
            }
            PodPhase::Running | PodPhase::Pending => None,
        }
    }
}

/// Why a node or pod list could not be loaded. Every variant names the file; row errors name
/// the line (1-based, counting the header) and the column (1-based).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The header lacks a required column.
    #[error("{path}:1: the header has no `{column}` column (a {kind} list needs {required})")]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The missing column.
        column: &'static str,
        /// `node` or `pod`.
        kind: &'static str,
        /// The required columns.
        required: String,
    },
    /// A row is not well-formed CSV, for instance it has the wrong number of fields.
    #[error("{path}:{line}: malformed row: {message}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The line.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// A field breaks a rule.
    #[error("{path}:{line}:{column}: {field} = {value:?}: {rule}")]
    BadField {
        /// The file.
        path: PathBuf,
        /// The line.
        line: u64,
        /// The column, 1-based.
        column: usize,
        /// The column's header name.
        field: &'static str,
        /// The offending value.
        value: String,
        /// The rule it breaks.
        rule: String,
    },
    /// Two rows have the same name.
    #[error(
        "{path}:{line}:{column}: {field} = {name:?} repeats line {first_line}: names must be unique"
    )]
    DuplicateName {
        /// The file.
        path: PathBuf,
        /// The line of the repeat.
        line: u64,
        /// The name column, 1-based.
        column: usize,
        /// `sn` or `name`.
        field: &'static str,
        /// The repeated name.
        name: String,
        /// Where the name first appears.
        first_line: u64,
    },
    /// The list has a header but no rows.
    #[error("{path}: the {kind} list has no rows")]
    Empty {
        /// The file.
        path: PathBuf,
        /// `node` or `pod`.
        kind: &'static str,
    },
}

const NODE_COLUMNS: [&str; 5] = ["sn", "cpu_milli", "memory_mib", "gpu", "model"];
const POD_COLUMNS: [&str; 5] = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"];
const POD_OPTIONAL_COLUMNS: [&str; 6] = [
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
];

/// Reads a node list from a file.
pub fn load_nodes(path: &Path) -> Result<Vec<TraceNode>, TraceError> {
    let text = read(path)?;
    parse_nodes(path, &text)
}

/// Reads a pod list from a file.
pub fn load_pods(path: &Path) -> Result<Vec<TracePod>, TraceError> {
    let text = read(path)?;
    parse_pods(path, &text)
}

fn read(path: &Path) -> Result<String, TraceError> {
    std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Parses a node list; `path` only names the source in errors.
pub fn parse_nodes(path: &Path, text: &str) -> Result<Vec<TraceNode>, TraceError> {
    let mut table = Table::open(path, text, "node", &NODE_COLUMNS, &[])?;
    let mut nodes = Vec::new();
    let mut names = HashMap::new();
    while let Some(row) = table.next_row()? {
        let name = row.required_str("sn")?;
        row.check_unique(&mut names, "sn", name)?;
        let gpus = row.number::<u32>("gpu")?;
        if gpus > MAX_GPUS_PER_NODE {
            return Err(row.bad("gpu", format!("must be at most {MAX_GPUS_PER_NODE}")));
        }
        let model = row.str("model").filter(|m| !m.is_empty());
        if let Some(model) = model {
            row.check_model_name("model", model)?;
        }
        nodes.push(TraceNode {
            name: name.to_owned(),
            cpu_milli: row.number("cpu_milli")?,
            memory_mib: row.number("memory_mib")?,
            gpus,
            gpu_model: model.map(str::to_owned),
        });
    }
    if nodes.is_empty() {
        return Err(TraceError::Empty {
            path: path.to_owned(),
            kind: "node",
        });
    }
    Ok(nodes)
}

/// Parses a pod list; `path` only names the source in errors.
pub fn parse_pods(path: &Path, text: &str) -> Result<Vec<TracePod>, TraceError> {
    let mut table = Table::open(path, text, "pod", &POD_COLUMNS, &POD_OPTIONAL_COLUMNS)?;
    let mut pods = Vec::new();
    let mut names = HashMap::new();
    while let Some(row) = table.next_row()? {
        let name = row.required_str("name")?;
        row.check_unique(&mut names, "name", name)?;
        let num_gpu = row.number::<u32>("num_gpu")?;
        if num_gpu > MAX_GPUS_PER_NODE {
            return Err(row.bad("num_gpu", format!("must be at most {MAX_GPUS_PER_NODE}")));
        }
        let gpu_milli = row.number::<u32>("gpu_milli")?;
        if num_gpu == 0 && gpu_milli != 0 {
            return Err(row.bad("gpu_milli", "must be 0 when num_gpu is 0".to_owned()));
        }
        if num_gpu > 0 && !(1..=MILLI_PER_GPU).contains(&gpu_milli) {
            return Err(row.bad(
                "gpu_milli",
                format!(
                    "must be between 1 and {MILLI_PER_GPU} (milli-GPU per GPU) when num_gpu > 0"
                ),
            ));
        }
        let gpu_spec = match row.str("gpu_spec") {
            None | Some("") => Vec::new(),
            Some(spec) => {
                let models: Vec<String> = spec.split('|').map(str::to_owned).collect();
                for model in &models {
                    row.check_model_name("gpu_spec", model)?;
                }
                models
            }
        };
        pods.push(TracePod {
            name: name.to_owned(),
            cpu_milli: row.number("cpu_milli")?,
            memory_mib: row.number("memory_mib")?,
            num_gpu,
            gpu_milli,
            gpu_spec,
            qos: row.keyword("qos", &Qos::NAMES)?,
            phase: row.keyword("pod_phase", &PodPhase::NAMES)?,
            creation_time: row.optional_number("creation_time")?,
            deletion_time: row.optional_number("deletion_time")?,
            scheduled_time: row.optional_number("scheduled_time")?,
        });
    }
    if pods.is_empty() {
        return Err(TraceError::Empty {
            path: path.to_owned(),
            kind: "pod",
        });
    }
    Ok(pods)
}

/// A CSV file with its header resolved to column positions.
struct Table<'a> {
    path: &'a Path,
    reader: csv::Reader<&'a [u8]>,
    columns: HashMap<&'static str, usize>,
    record: csv::StringRecord,
}

impl<'a> Table<'a> {
    fn open(
        path: &'a Path,
        text: &'a str,
        kind: &'static str,
        required: &[&'static str],
        optional: &[&'static str],
    ) -> Result<Self, TraceError> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .from_reader(text.as_bytes());
        let header = reader.headers().map_err(|e| csv_error(path, &e))?.clone();
        let position = |column: &str| header.iter().position(|h| h.trim() == column);
        let mut columns = HashMap::new();
        for &column in required {
            let index = position(column).ok_or_else(|| TraceError::MissingColumn {
                path: path.to_owned(),
                column,
                kind,
                required: required.join(","),
            })?;
            columns.insert(column, index);
        }
        for &column in optional {
            if let Some(index) = position(column) {
                columns.insert(column, index);
            }
        }
        Ok(Self {
            path,
            reader,
            columns,
            record: csv::StringRecord::new(),
        })
    }

    fn next_row(&mut self) -> Result<Option<Row<'_>>, TraceError> {
        let more = self
            .reader
            .read_record(&mut self.record)
            .map_err(|e| csv_error(self.path, &e))?;
        if !more {
            return Ok(None);
        }
        let line = self.record.position().map_or(0, csv::Position::line);
        Ok(Some(Row {
            path: self.path,
            line,
            columns: &self.columns,
            record: &self.record,
        }))
    }
}

fn csv_error(path: &Path, error: &csv::Error) -> TraceError {
    match error.kind() {
        csv::ErrorKind::Io(e) => TraceError::Io {
            path: path.to_owned(),
            source: std::io::Error::new(e.kind(), e.to_string()),
        },
        csv::ErrorKind::UnequalLengths {
            pos,
            expected_len,
            len,
        } => TraceError::Malformed {
            path: path.to_owned(),
            line: pos.as_ref().map_or(0, csv::Position::line),
            message: format!("{len} fields where the header has {expected_len}"),
        },
        _ => TraceError::Malformed {
            path: path.to_owned(),
            line: error.position().map_or(0, csv::Position::line),
            message: error.to_string(),
        },
    }
}

/// One data row, with helpers that turn a bad field into a [`TraceError::BadField`].
struct Row<'a> {
    path: &'a Path,
    line: u64,
    columns: &'a HashMap<&'static str, usize>,
    record: &'a csv::StringRecord,
}

impl Row<'_> {
    fn index(&self, field: &'static str) -> Option<usize> {
        self.columns.get(field).copied()
    }

    /// The trimmed value of a column the file has; `None` when the file lacks the column.
    fn str(&self, field: &'static str) -> Option<&str> {
        self.index(field)
            .and_then(|i| self.record.get(i))
            .map(str::trim)
    }

    fn bad(&self, field: &'static str, rule: String) -> TraceError {
        TraceError::BadField {
            path: self.path.to_owned(),
            line: self.line,
            column: self.index(field).map_or(0, |i| i + 1),
            field,
            value: self.str(field).unwrap_or_default().to_owned(),
            rule,
        }
    }

    fn required_str(&self, field: &'static str) -> Result<&str, TraceError> {
        match self.str(field) {
            Some(value) if !value.is_empty() => Ok(value),
            _ => Err(self.bad(field, "must not be empty".to_owned())),
        }
    }

    fn number<T: Whole>(&self, field: &'static str) -> Result<T, TraceError> {
        self.str(field).unwrap_or_default().parse().map_err(|_| {
            self.bad(
                field,
                format!("must be a whole number from 0 to {}", T::MAX),
            )
        })
    }

    fn optional_number<T: Whole>(&self, field: &'static str) -> Result<Option<T>, TraceError> {
        match self.str(field) {
            None | Some("") => Ok(None),
            Some(_) => self.number(field).map(Some),
        }
    }

    fn keyword<T: Copy>(
        &self,
        field: &'static str,
        names: &[(&str, T)],
    ) -> Result<Option<T>, TraceError> {
        match self.str(field) {
            None | Some("") => Ok(None),
            Some(value) => names
                .iter()
                .find(|(name, _)| *name == value)
                .map(|(_, v)| Some(*v))
                .ok_or_else(|| {
                    let allowed: Vec<&str> = names.iter().map(|(name, _)| *name).collect();
                    self.bad(
                        field,
                        format!("must be one of {} or empty", allowed.join(", ")),
                    )
                }),
        }
    }

    fn check_model_name(&self, field: &'static str, model: &str) -> Result<(), TraceError> {
        let valid = !model.is_empty()
            && model
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if valid {
            Ok(())
        } else {
            Err(self.bad(
                field,
                format!("GPU model {model:?} must be a non-empty name of letters, digits, '-', '_' or '.' ('|' separates models)"),
            ))
        }
    }

    fn check_unique(
        &self,
        seen: &mut HashMap<String, u64>,
        field: &'static str,
        name: &str,
    ) -> Result<(), TraceError> {
        if let Some(&first_line) = seen.get(name) {
            return Err(TraceError::DuplicateName {
                path: self.path.to_owned(),
                line: self.line,
                column: self.index(field).map_or(0, |i| i + 1),
                field,
                name: name.to_owned(),
                first_line,
            });
        }
        seen.insert(name.to_owned(), self.line);
        Ok(())
    }
}

/// The unsigned integer types of the lists, with their largest value for error messages.
trait Whole: std::str::FromStr {
    const MAX: u64;
}

impl Whole for u32 {
    const MAX: u64 = u32::MAX as u64;
}

impl Whole for u64 {
    const MAX: u64 = u64::MAX;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    fn pods(text: &str) -> Result<Vec<TracePod>, TraceError> {
        parse_pods(Path::new("pods.csv"), text)
    }

    fn nodes(text: &str) -> Result<Vec<TraceNode>, TraceError> {
        parse_nodes(Path::new("nodes.csv"), text)
    }

    const POD_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

    #[test]
    fn reads_a_full_pod_row() {
        let list = pods(&format!(
            "{POD_HEADER}p-1,8000,30517,1,470,V100M16|V100M32,BE,Succeeded,10,700,100\n"
        ))
        .unwrap();
        assert_eq!(
            list[0],
            TracePod {
                name: "p-1".into(),
                cpu_milli: 8000,
                memory_mib: 30517,
                num_gpu: 1,
                gpu_milli: 470,
                gpu_spec: vec!["V100M16".into(), "V100M32".into()],
                qos: Some(Qos::BestEffort),
                phase: Some(PodPhase::Succeeded),
                creation_time: Some(10),
                deletion_time: Some(700),
                scheduled_time: Some(100),
            }
        );
        assert_eq!(list[0].total_gpu_milli(), 470);
        assert_eq!(list[0].completed_duration_secs(), Some(600));
    }

    #[test]
    fn reads_the_five_column_variant_and_empty_optionals() {
        let list =
            pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np-1,12000,16384,8,1000\n").unwrap();
        assert_eq!(list[0].total_gpu_milli(), 8000);
        assert_eq!(list[0].qos, None);
        assert!(list[0].gpu_spec.is_empty());
        let list = pods(&format!("{POD_HEADER}p-1,8000,1,0,0,,,Pending,5,,\n")).unwrap();
        assert_eq!(
            (list[0].scheduled_time, list[0].completed_duration_secs()),
            (None, None)
        );
    }

    #[test]
    fn running_tasks_have_no_duration() {
        let list = pods(&format!(
            "{POD_HEADER}p-1,8000,1,1,1000,,LS,Running,0,100,0\n"
        ))
        .unwrap();
        assert_eq!(list[0].completed_duration_secs(), None);
    }

    #[test]
    fn bad_number_names_line_and_column() {
        let err = pods(&format!(
            "{POD_HEADER}p-1,8000,1,1,1000,,LS,Running,0,1,0\np-2,lots,1,1,1000,,LS,Running,0,1,0\n"
        ))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "pods.csv:3:2: cpu_milli = \"lots\": must be a whole number from 0 to 4294967295"
        );
    }

    #[test]
    fn gpu_milli_rules() {
        let err = pods(&format!("{POD_HEADER}p-1,1,1,1,1500,,,,,,\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("pods.csv:2:5: gpu_milli = \"1500\": must be between 1 and 1000"),
            "{err}"
        );
        let err = pods(&format!("{POD_HEADER}p-1,1,1,0,500,,,,,,\n"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "pods.csv:2:5: gpu_milli = \"500\": must be 0 when num_gpu is 0"
        );
        let err = pods(&format!("{POD_HEADER}p-1,1,1,65,1000,,,,,,\n"))
            .unwrap_err()
            .to_string();
        assert_eq!(err, "pods.csv:2:4: num_gpu = \"65\": must be at most 64");
    }

    #[test]
    fn keywords_and_models_are_checked() {
        let err = pods(&format!("{POD_HEADER}p-1,1,1,1,1000,,Gold,,,,\n"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "pods.csv:2:7: qos = \"Gold\": must be one of LS, BE, Burstable, Guaranteed or empty"
        );
        let err = pods(&format!("{POD_HEADER}p-1,1,1,1,1000,T4||P100,,,,,\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("pods.csv:2:6: gpu_spec = \"T4||P100\": GPU model \"\" must be"),
            "{err}"
        );
    }

    #[test]
    fn wrong_field_count_is_malformed_with_line() {
        let err = pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np-1,1,1,1,1000\np-2,1,1\n")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "pods.csv:3: malformed row: 3 fields where the header has 5"
        );
    }

    #[test]
    fn missing_column_and_duplicates_and_empty() {
        let err = pods("name,cpu_milli,memory_mib,gpu_milli\np,1,1,1\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "pods.csv:1: the header has no `num_gpu` column (a pod list needs name,cpu_milli,memory_mib,num_gpu,gpu_milli)"
        );
        let err = pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1000\np,1,1,1,1000\n")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "pods.csv:3:1: name = \"p\" repeats line 2: names must be unique"
        );
        let err = pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n").unwrap_err();
        assert_eq!(err.to_string(), "pods.csv: the pod list has no rows");
    }

    #[test]
    fn reads_nodes_in_any_column_order() {
        let list =
            nodes("model,gpu,sn,memory_mib,cpu_milli\nT4,2,n-1,262144,64000\n,0,n-2,1,32000\n")
                .unwrap();
        assert_eq!(list[0].gpu_model.as_deref(), Some("T4"));
        assert_eq!((list[0].gpus, list[0].cpu_milli), (2, 64000));
        assert_eq!(list[1].gpu_model, None);
        let err = nodes("sn,cpu_milli,memory_mib,gpu,model\nn-1,64000,1,-2,T4\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "nodes.csv:2:4: gpu = \"-2\": must be a whole number from 0 to 4294967295"
        );
        let err = nodes("sn,cpu_milli,memory_mib,gpu,model\n,64000,1,2,T4\n")
            .unwrap_err()
            .to_string();
        assert_eq!(err, "nodes.csv:2:1: sn = \"\": must not be empty");
    }
}
