//! The quota-study scenario format (YAML): a cluster, tenants with GpuQueue-like quotas, the
//! load each tenant offers, and the modelled latencies of a reclaim handover.
//!
//! Unknown fields are errors that name the field, so a typo never silently falls back to a
//! default. Paths starting with `$DATA/` are resolved against the data directory (see
//! [`crate::data`]); other relative paths against the scenario file's folder.
//!
//! `examples/sim/` holds annotated scenarios; every field is documented on its type below.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuqueue_api::duration::GoDuration;
use gpuqueue_core::termination::BIND_RESERVE;
use serde::Deserialize;

use crate::trace::Qos;

/// Most tenants a scenario may declare (one GpuQueue each).
pub const MAX_TENANTS: usize = 1000;

/// A whole scenario.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Scenario {
    /// Short name, used in report titles and file names.
    pub name: String,
    /// What the scenario models and where its numbers come from.
    #[serde(default)]
    pub description: String,
    /// Seed of every random draw; `--seed` overrides it.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Simulated time, such as `72h`.
    pub duration: GoDuration,
    /// Leading time excluded from every metric, so the cluster starts warm. Default 0.
    #[serde(default = "zero")]
    pub warmup: GoDuration,
    /// Resolution of the time series in the report. Default 10m.
    #[serde(default = "ten_minutes")]
    pub sample_every: GoDuration,
    /// The nodes.
    pub cluster: ClusterSpec,
    /// The pod list that `trace` shapes and durations are drawn from.
    #[serde(default)]
    pub shapes: Option<ShapeSource>,
    /// Modelled latencies of a reclaim handover.
    #[serde(default)]
    pub handover: HandoverModel,
    /// The tenants, one GpuQueue each.
    pub tenants: Vec<TenantSpec>,
}

/// The nodes: synthetic pools, or a node list in the openb layout. Exactly one of the two.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Groups of identical nodes.
    #[serde(default)]
    pub pools: Vec<NodePool>,
    /// A node list CSV (`sn,cpu_milli,memory_mib,gpu,model`); CPU-only nodes are skipped.
    #[serde(default)]
    pub trace: Option<String>,
}

/// A group of identical nodes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodePool {
    /// Pool name; nodes are named `<name>-<index>`.
    pub name: String,
    /// Number of nodes.
    pub count: u32,
    /// GPUs per node.
    pub gpus: u32,
    /// GPU model, matched against trace shapes' `gpu_spec` when those are kept.
    pub gpu_model: String,
    /// CPU per node in milli-cores. Default 128000.
    #[serde(default = "default_node_cpu")]
    pub cpu_milli: u32,
}

/// Where trace shapes and durations come from.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ShapeSource {
    /// A pod list CSV in the openb layout.
    pub trace: String,
}

/// One tenant: its queue's quota (the fields of a GpuQueue spec, for `nvidia.com/gpu`) and the
/// load it offers.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TenantSpec {
    /// Queue name (a DNS label).
    pub name: String,
    /// Guaranteed GPUs.
    pub guaranteed: u32,
    /// GPUs this queue may borrow on top of guaranteed. Default 0.
    #[serde(default)]
    pub burstable: u32,
    /// How many guaranteed GPUs may be lent while idle. Default: all.
    #[serde(default)]
    pub lending_limit: Option<u32>,
    /// Share of idle capacity among borrowers. Default 1.
    #[serde(default = "one")]
    pub weight: u32,
    /// Pod priority of this tenant's pods. Default 0.
    #[serde(default)]
    pub priority: i32,
    /// The queue's reclaim settings.
    #[serde(default)]
    pub reclaim: TenantReclaim,
    /// Online serving with a daily cycle.
    #[serde(default)]
    pub online: Option<OnlineLoad>,
    /// Batch jobs.
    #[serde(default)]
    pub batch: Option<BatchLoad>,
}

/// A queue's `spec.reclaim`, as far as the simulator models it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TenantReclaim {
    /// Deadline of a handover to this queue. Default 3s.
    #[serde(default = "three_seconds")]
    pub budget: GoDuration,
    /// Longest checkpoint of this queue's pods before they are evicted anyway. Default 1500ms.
    #[serde(default = "fifteen_hundred_millis")]
    pub checkpoint_timeout: GoDuration,
    /// Grace period of this queue's evicted pods, in seconds. Default 1.
    #[serde(default = "one_i64")]
    pub victim_grace_period_seconds: i64,
    /// A borrowing pod is not reclaimed before it has run this long (unless the budget needs
    /// it). Default: no floor.
    #[serde(default)]
    pub min_borrow_duration: Option<GoDuration>,
}

impl Default for TenantReclaim {
    fn default() -> Self {
        Self {
            budget: three_seconds(),
            checkpoint_timeout: fifteen_hundred_millis(),
            victim_grace_period_seconds: 1,
            min_borrow_duration: None,
        }
    }
}

/// Online serving: replicas kept by an autoscaler at a target that follows a daily cosine
/// between `troughReplicas` and `peakReplicas`, with multiplicative jitter at each step.
/// Scale-down removes the newest replica first, as a ReplicaSet does.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OnlineLoad {
    /// Replicas wanted at the daily peak.
    pub peak_replicas: u32,
    /// Replicas wanted at the daily trough (12 hours from the peak).
    pub trough_replicas: u32,
    /// Hour of the day (0–24) of the peak. Default 14.
    #[serde(default = "default_peak_hour")]
    pub peak_hour: f64,
    /// Autoscaler period. Default 5m.
    #[serde(default = "five_minutes")]
    pub scale_every: GoDuration,
    /// Relative jitter of the target at each step, in [0, 1). Default 0.1.
    #[serde(default = "default_jitter")]
    pub jitter: f64,
    /// Shape of each replica.
    #[serde(with = "serde_yaml::with::singleton_map")]
    pub shape: ShapeChoice,
}

/// Batch: jobs arrive as a Poisson process and run for a drawn duration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BatchLoad {
    /// Mean arrivals per hour.
    pub jobs_per_hour: f64,
    /// Shape of each job.
    #[serde(with = "serde_yaml::with::singleton_map")]
    pub shape: ShapeChoice,
    /// How long a job runs once started (work lost to an eviction without checkpoint is rerun).
    #[serde(with = "serde_yaml::with::singleton_map")]
    pub duration: DurationModel,
}

/// A pod shape: fixed, or drawn from the scenario's shape trace.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub enum ShapeChoice {
    /// Every pod the same.
    Fixed(FixedShape),
    /// Drawn uniformly from the trace tasks that pass the filter.
    Trace(TraceFilter),
}

/// A fixed pod shape.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FixedShape {
    /// GPUs per pod.
    pub gpus: u32,
    /// CPU per pod in milli-cores. Default 8000.
    #[serde(default = "default_pod_cpu")]
    pub cpu_milli: u32,
}

/// Which trace tasks a shape may be drawn from.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TraceFilter {
    /// QoS classes to keep (`LS`, `BE`, `Burstable`, `Guaranteed`). Default: all.
    #[serde(default)]
    pub qos: Vec<Qos>,
    /// Fewest GPUs. Default 1.
    #[serde(default = "one")]
    pub min_gpus: u32,
    /// Most GPUs. Default 8.
    #[serde(default = "eight")]
    pub max_gpus: u32,
    /// Keep GPU-sharing tasks (`gpu_milli < 1000`). Default false: quotas of `nvidia.com/gpu`
    /// count whole GPUs, and shared GPUs come from a different device plugin and resource.
    #[serde(default)]
    pub sharing: bool,
    /// Keep the tasks' GPU-model constraints. Default false, since a synthetic cluster's models
    /// are not the trace's.
    #[serde(default)]
    pub keep_gpu_spec: bool,
}

/// How long a batch job runs.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub enum DurationModel {
    /// Always the same.
    Fixed(GoDuration),
    /// Log-normal with this median and 90th percentile.
    LogNormal {
        /// Median.
        median: GoDuration,
        /// 90th percentile (above the median).
        p90: GoDuration,
    },
    /// Run times of the shape trace's finished tasks (`Succeeded`/`Failed`, scheduled to
    /// deleted), clamped to `[min, max]`.
    Trace {
        /// Shortest run time. Default 1m.
        #[serde(default = "one_minute")]
        min: GoDuration,
        /// Longest run time. Default 24h (the trace's longest tasks run for months).
        #[serde(default = "one_day")]
        max: GoDuration,
    },
}

/// A latency modelled as log-normal by its median and 99th percentile.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Latency {
    /// Median.
    pub median: GoDuration,
    /// 99th percentile (at least the median).
    pub p99: GoDuration,
}

/// The modelled world of a handover (research/perf-anchors.md §4): each delay is drawn per
/// reclaim; none is a constant.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HandoverModel {
    /// One API call (annotate, evict, bind). Default median 20ms, p99 150ms.
    #[serde(default = "default_api")]
    pub api: Latency,
    /// A checkpoint (vLLM pause until in-flight requests drain). Cut at the victim queue's
    /// checkpoint timeout and the owner's budget. Default median 1.2s, p99 2.5s.
    #[serde(default = "default_checkpoint")]
    pub checkpoint: Latency,
    /// Share of checkpoints that fail; the eviction goes ahead and the job's work since start
    /// is lost. Default 0.02.
    #[serde(default = "default_checkpoint_failure")]
    pub checkpoint_failure: f64,
    /// Victim process exit after SIGTERM, capped by its grace period. Default median 300ms,
    /// p99 1s.
    #[serde(default = "default_exit")]
    pub victim_exit: Latency,
    /// Kubelet's generic PLEG relist period: the kill starts at the node's first relist after
    /// the eviction and the exit is noticed at the relist after it, one every this, at a random
    /// phase per handover. Default 1s.
    #[serde(default = "one_second")]
    pub kubelet_relist: GoDuration,
}

impl Default for HandoverModel {
    fn default() -> Self {
        Self {
            api: default_api(),
            checkpoint: default_checkpoint(),
            checkpoint_failure: default_checkpoint_failure(),
            victim_exit: default_exit(),
            kubelet_relist: one_second(),
        }
    }
}

fn default_seed() -> u64 {
    42
}
fn zero() -> GoDuration {
    Duration::ZERO.into()
}
fn ten_minutes() -> GoDuration {
    Duration::from_mins(10).into()
}
fn five_minutes() -> GoDuration {
    Duration::from_mins(5).into()
}
fn one_minute() -> GoDuration {
    Duration::from_mins(1).into()
}
fn one_day() -> GoDuration {
    Duration::from_hours(24).into()
}
fn one_second() -> GoDuration {
    Duration::from_secs(1).into()
}
fn fifteen_hundred_millis() -> GoDuration {
    Duration::from_millis(1500).into()
}
fn three_seconds() -> GoDuration {
    Duration::from_secs(3).into()
}
fn one() -> u32 {
    1
}
fn one_i64() -> i64 {
    1
}
fn eight() -> u32 {
    8
}
fn default_node_cpu() -> u32 {
    128_000
}
fn default_pod_cpu() -> u32 {
    8000
}
fn default_peak_hour() -> f64 {
    14.0
}
fn default_jitter() -> f64 {
    0.1
}
fn default_checkpoint_failure() -> f64 {
    0.02
}
fn latency(median_ms: u64, p99_ms: u64) -> Latency {
    Latency {
        median: Duration::from_millis(median_ms).into(),
        p99: Duration::from_millis(p99_ms).into(),
    }
}
fn default_api() -> Latency {
    latency(20, 150)
}
fn default_checkpoint() -> Latency {
    latency(1200, 2500)
}
fn default_exit() -> Latency {
    latency(300, 1000)
}

/// Why a scenario was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Not valid YAML for the format (includes unknown fields, with their line and column).
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// serde's message, which names the field and its place.
        message: String,
    },
    /// A value breaks a rule.
    #[error("{path}: {field}: {rule}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Where, such as `tenants[2].online.peakReplicas`.
        field: String,
        /// The rule.
        rule: String,
    },
}

/// A parsed and checked scenario, with its file paths resolved.
#[derive(Clone, Debug)]
pub struct LoadedScenario {
    /// The scenario.
    pub scenario: Scenario,
    /// The file it came from (for messages).
    pub source: PathBuf,
    /// The resolved node list, when the cluster comes from a trace.
    pub node_trace: Option<PathBuf>,
    /// The resolved shape trace, when there is one.
    pub shape_trace: Option<PathBuf>,
}

impl Scenario {
    /// Reads and checks a scenario file. `data_dir` resolves `$DATA/` paths.
    pub fn load(path: &Path, data_dir: Option<&Path>) -> Result<LoadedScenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text, data_dir)
    }

    /// Parses and checks scenario text; `path` names it in errors and anchors relative paths.
    pub fn parse(
        path: &Path,
        text: &str,
        data_dir: Option<&Path>,
    ) -> Result<LoadedScenario, ScenarioError> {
        let scenario: Scenario = serde_yaml::from_str(text).map_err(|e| ScenarioError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let invalid = |field: String, rule: String| ScenarioError::Invalid {
            path: path.to_owned(),
            field,
            rule,
        };
        if let Some((field, rule)) = scenario.first_violation() {
            return Err(invalid(field, rule));
        }
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        let resolve = |field: &str, value: &str| {
            resolve_path(base, value, data_dir).map_err(|rule| invalid(field.to_owned(), rule))
        };
        let node_trace = scenario
            .cluster
            .trace
            .as_deref()
            .map(|t| resolve("cluster.trace", t))
            .transpose()?;
        let shape_trace = scenario
            .shapes
            .as_ref()
            .map(|s| resolve("shapes.trace", &s.trace))
            .transpose()?;
        Ok(LoadedScenario {
            scenario,
            source: path.to_owned(),
            node_trace,
            shape_trace,
        })
    }

    /// Guaranteed GPUs summed over tenants.
    pub fn guaranteed_total(&self) -> u64 {
        self.tenants.iter().map(|t| u64::from(t.guaranteed)).sum()
    }

    /// Whether any tenant draws shapes or durations from the trace.
    fn uses_trace(&self) -> bool {
        self.tenants.iter().any(|t| {
            let online = t
                .online
                .as_ref()
                .is_some_and(|o| matches!(o.shape, ShapeChoice::Trace(_)));
            let batch = t.batch.as_ref().is_some_and(|b| {
                matches!(b.shape, ShapeChoice::Trace(_))
                    || matches!(b.duration, DurationModel::Trace { .. })
            });
            online || batch
        })
    }

    /// The first broken rule, as (field path, rule).
    fn first_violation(&self) -> Option<(String, String)> {
        let positive = |d: &GoDuration| !d.is_negative() && Duration::from(*d) > Duration::ZERO;
        let mut rules: Vec<(bool, String, String)> = vec![
            (
                !self.name.trim().is_empty(),
                "name".into(),
                "must not be empty".into(),
            ),
            (
                positive(&self.duration),
                "duration".into(),
                "must be longer than 0s".into(),
            ),
            (
                !self.warmup.is_negative()
                    && Duration::from(self.warmup) < Duration::from(self.duration),
                "warmup".into(),
                "must be at least 0s and shorter than duration".into(),
            ),
            (
                positive(&self.sample_every),
                "sampleEvery".into(),
                "must be longer than 0s".into(),
            ),
            (
                self.cluster.pools.is_empty() != self.cluster.trace.is_none(),
                "cluster".into(),
                "give exactly one of pools or trace".into(),
            ),
            (
                !self.tenants.is_empty(),
                "tenants".into(),
                "must list at least one tenant".into(),
            ),
            (
                self.tenants.len() <= MAX_TENANTS,
                "tenants".into(),
                format!("at most {MAX_TENANTS} tenants"),
            ),
            (
                self.shapes.is_some() || !self.uses_trace(),
                "shapes".into(),
                "a tenant draws shapes or durations from the trace, so shapes.trace is required"
                    .into(),
            ),
        ];
        for (i, pool) in self.cluster.pools.iter().enumerate() {
            let at = |f: &str| format!("cluster.pools[{i}].{f}");
            rules.push((
                is_dns_label(&pool.name),
                at("name"),
                "must be a DNS label such as a100".into(),
            ));
            rules.push((pool.count >= 1, at("count"), "must be at least 1".into()));
            rules.push((
                (1..=64).contains(&pool.gpus),
                at("gpus"),
                "must be between 1 and 64".into(),
            ));
            rules.push((
                !pool.gpu_model.trim().is_empty(),
                at("gpuModel"),
                "must not be empty".into(),
            ));
            rules.push((
                pool.cpu_milli > 0,
                at("cpuMilli"),
                "must be more than 0".into(),
            ));
        }
        self.handover.violations(&mut rules);
        let mut names = HashSet::new();
        for (i, tenant) in self.tenants.iter().enumerate() {
            tenant.violations(i, &mut names, &mut rules);
        }
        rules
            .into_iter()
            .find(|(ok, _, _)| !ok)
            .map(|(_, field, rule)| (field, rule))
    }
}

impl HandoverModel {
    fn violations(&self, rules: &mut Vec<(bool, String, String)>) {
        for (name, latency) in [
            ("api", self.api),
            ("checkpoint", self.checkpoint),
            ("victimExit", self.victim_exit),
        ] {
            rules.push((
                latency.is_valid(),
                format!("handover.{name}"),
                "median must be positive and p99 at least the median".into(),
            ));
        }
        rules.push((
            (0.0..=1.0).contains(&self.checkpoint_failure),
            "handover.checkpointFailure".into(),
            "must be a probability between 0 and 1".into(),
        ));
        rules.push((
            !self.kubelet_relist.is_negative(),
            "handover.kubeletRelist".into(),
            "must be at least 0s".into(),
        ));
    }
}

impl TenantSpec {
    fn violations(
        &self,
        i: usize,
        names: &mut HashSet<String>,
        rules: &mut Vec<(bool, String, String)>,
    ) {
        let at = |f: &str| format!("tenants[{i}].{f}");
        rules.push((
            is_dns_label(&self.name),
            at("name"),
            "must be a DNS label such as team-a".into(),
        ));
        rules.push((
            names.insert(self.name.clone()),
            at("name"),
            format!("{:?} is declared twice", self.name),
        ));
        let max = u32::try_from(gpuqueue_api::v1alpha1::MAX_GPU_COUNT).unwrap_or(u32::MAX);
        rules.push((
            self.guaranteed <= max,
            at("guaranteed"),
            format!("must be at most {max}"),
        ));
        rules.push((
            self.burstable <= max,
            at("burstable"),
            format!("must be at most {max}"),
        ));
        rules.push((
            self.lending_limit.is_none_or(|l| l <= self.guaranteed),
            at("lendingLimit"),
            "must not exceed guaranteed: a queue can lend only GPUs it is guaranteed".into(),
        ));
        rules.push((
            (1..=1000).contains(&self.weight),
            at("weight"),
            "must be between 1 and 1000".into(),
        ));
        let budget = Duration::from(self.reclaim.budget);
        let timeout = Duration::from(self.reclaim.checkpoint_timeout);
        rules.push((
            !self.reclaim.budget.is_negative()
                && budget > Duration::ZERO
                && budget <= Duration::from_mins(1),
            at("reclaim.budget"),
            "must be longer than 0s and at most 60s".into(),
        ));
        let grace = u64::try_from(self.reclaim.victim_grace_period_seconds)
            .map_or(Duration::ZERO, Duration::from_secs);
        rules.push((
            !self.reclaim.checkpoint_timeout.is_negative()
                && budget >= timeout + grace + BIND_RESERVE,
            at("reclaim.budget"),
            "must be at least reclaim.checkpointTimeout plus reclaim.victimGracePeriodSeconds plus 250ms for the eviction call and the bind (the CRD's rule)".into(),
        ));
        rules.push((
            (0..=30).contains(&self.reclaim.victim_grace_period_seconds),
            at("reclaim.victimGracePeriodSeconds"),
            "must be between 0 and 30".into(),
        ));
        rules.push((
            self.reclaim
                .min_borrow_duration
                .is_none_or(|d| !d.is_negative()),
            at("reclaim.minBorrowDuration"),
            "must be at least 0s".into(),
        ));
        if let Some(online) = &self.online {
            let at = |f: &str| format!("tenants[{i}].online.{f}");
            rules.push((
                online.peak_replicas >= online.trough_replicas,
                at("peakReplicas"),
                "must be at least troughReplicas".into(),
            ));
            rules.push((
                (0.0..24.0).contains(&online.peak_hour),
                at("peakHour"),
                "must be in [0, 24)".into(),
            ));
            rules.push((
                (0.0..1.0).contains(&online.jitter),
                at("jitter"),
                "must be in [0, 1)".into(),
            ));
            rules.push((
                !online.scale_every.is_negative()
                    && Duration::from(online.scale_every) >= Duration::from_secs(1),
                at("scaleEvery"),
                "must be at least 1s".into(),
            ));
            online.shape.violations(&at("shape"), rules);
        }
        if let Some(batch) = &self.batch {
            let at = |f: &str| format!("tenants[{i}].batch.{f}");
            rules.push((
                batch.jobs_per_hour.is_finite() && batch.jobs_per_hour > 0.0,
                at("jobsPerHour"),
                "must be a positive number".into(),
            ));
            batch.shape.violations(&at("shape"), rules);
            batch.duration.violations(&at("duration"), rules);
        }
    }
}

impl ShapeChoice {
    fn violations(&self, at: &str, rules: &mut Vec<(bool, String, String)>) {
        match self {
            ShapeChoice::Fixed(shape) => {
                rules.push((
                    (1..=64).contains(&shape.gpus),
                    format!("{at}.fixed.gpus"),
                    "must be between 1 and 64".into(),
                ));
            }
            ShapeChoice::Trace(filter) => {
                rules.push((
                    filter.min_gpus >= 1,
                    format!("{at}.trace.minGpus"),
                    "must be at least 1".into(),
                ));
                rules.push((
                    filter.min_gpus <= filter.max_gpus,
                    format!("{at}.trace.maxGpus"),
                    "must be at least minGpus".into(),
                ));
            }
        }
    }
}

impl DurationModel {
    fn violations(&self, at: &str, rules: &mut Vec<(bool, String, String)>) {
        let positive = |d: &GoDuration| !d.is_negative() && Duration::from(*d) > Duration::ZERO;
        match self {
            DurationModel::Fixed(d) => rules.push((
                positive(d),
                format!("{at}.fixed"),
                "must be longer than 0s".into(),
            )),
            DurationModel::LogNormal { median, p90 } => rules.push((
                positive(median) && Duration::from(*p90) > Duration::from(*median),
                format!("{at}.logNormal"),
                "median must be longer than 0s and p90 longer than the median".into(),
            )),
            DurationModel::Trace { min, max } => rules.push((
                positive(min) && Duration::from(*max) >= Duration::from(*min),
                format!("{at}.trace"),
                "min must be longer than 0s and max at least min".into(),
            )),
        }
    }
}

impl Latency {
    fn is_valid(self) -> bool {
        !self.median.is_negative()
            && !self.p99.is_negative()
            && Duration::from(self.median) > Duration::ZERO
            && Duration::from(self.p99) >= Duration::from(self.median)
    }
}

fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-')
}

/// Resolves a path of the scenario: `$DATA/…` against the data directory, other relative paths
/// against the scenario's folder.
fn resolve_path(base: &Path, value: &str, data_dir: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(rest) = value.strip_prefix("$DATA/") {
        return data_dir.map(|d| d.join(rest)).ok_or_else(|| {
            format!(
                "{value:?} needs the data directory: pass --data-dir or set {}",
                crate::data::DATA_DIR_ENV
            )
        });
    }
    let path = Path::new(value);
    Ok(if path.is_absolute() {
        path.to_owned()
    } else {
        base.join(path)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    const MINIMAL: &str = "
name: tiny
duration: 2h
cluster:
  pools: [{name: a100, count: 2, gpus: 8, gpuModel: A100}]
tenants:
  - name: search
    guaranteed: 8
    online: {peakReplicas: 6, troughReplicas: 1, shape: {fixed: {gpus: 1}}}
  - name: research
    guaranteed: 4
    burstable: 12
    batch:
      jobsPerHour: 10
      shape: {fixed: {gpus: 2}}
      duration: {logNormal: {median: 20m, p90: 2h}}
";

    fn parse(text: &str) -> Result<LoadedScenario, ScenarioError> {
        Scenario::parse(Path::new("dir/s.yaml"), text, Some(Path::new("/data")))
    }

    fn error(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn minimal_scenario_gets_defaults() {
        let loaded = parse(MINIMAL).unwrap();
        let s = &loaded.scenario;
        assert_eq!(s.seed, 42);
        assert_eq!(Duration::from(s.sample_every), Duration::from_mins(10));
        assert_eq!(s.tenants[0].weight, 1);
        assert_eq!(
            Duration::from(s.tenants[1].reclaim.budget),
            Duration::from_secs(3)
        );
        assert!((s.tenants[0].online.as_ref().unwrap().peak_hour - 14.0).abs() < f64::EPSILON);
        assert_eq!(s.handover.checkpoint, default_checkpoint());
        assert_eq!(s.guaranteed_total(), 12);
        assert_eq!(loaded.shape_trace, None);
    }

    #[test]
    fn unknown_field_is_named() {
        let err = error(&MINIMAL.replace("burstable: 12", "burstible: 12"));
        assert!(
            err.starts_with("dir/s.yaml: tenants[1]: unknown field `burstible`"),
            "{err}"
        );
        assert!(err.contains("line"), "{err}");
        let err = error(&MINIMAL.replace("fixed: {gpus: 2}", "fixed: {gpus: 2, memory: 3}"));
        assert!(err.contains("unknown field `memory`"), "{err}");
    }

    #[test]
    fn rules_name_the_field() {
        assert_eq!(
            error(&MINIMAL.replace(
                "peakReplicas: 6, troughReplicas: 1",
                "peakReplicas: 1, troughReplicas: 6"
            )),
            "dir/s.yaml: tenants[0].online.peakReplicas: must be at least troughReplicas"
        );
        assert_eq!(
            error(&MINIMAL.replace("guaranteed: 4", "guaranteed: 4\n    lendingLimit: 5")),
            "dir/s.yaml: tenants[1].lendingLimit: must not exceed guaranteed: a queue can lend only GPUs it is guaranteed"
        );
        assert_eq!(
            error(&MINIMAL.replace("name: research", "name: search")),
            "dir/s.yaml: tenants[1].name: \"search\" is declared twice"
        );
        assert_eq!(
            error(&MINIMAL.replace("guaranteed: 4", "guaranteed: 4\n    reclaim: {budget: 2s}")),
            "dir/s.yaml: tenants[1].reclaim.budget: must be at least reclaim.checkpointTimeout plus reclaim.victimGracePeriodSeconds plus 250ms for the eviction call and the bind (the CRD's rule)"
        );
        assert_eq!(
            error(&MINIMAL.replace("duration: 2h", "duration: 2h\nwarmup: 3h")),
            "dir/s.yaml: warmup: must be at least 0s and shorter than duration"
        );
        assert_eq!(
            error(&MINIMAL.replace("p90: 2h", "p90: 10m")),
            "dir/s.yaml: tenants[1].batch.duration.logNormal: median must be longer than 0s and p90 longer than the median"
        );
        assert_eq!(
            error(&MINIMAL.replace("name: a100", "name: A100")),
            "dir/s.yaml: cluster.pools[0].name: must be a DNS label such as a100"
        );
    }

    #[test]
    fn trace_shapes_need_a_shape_source() {
        let text = MINIMAL.replace("shape: {fixed: {gpus: 2}}", "shape: {trace: {qos: [BE]}}");
        assert_eq!(
            error(&text),
            "dir/s.yaml: shapes: a tenant draws shapes or durations from the trace, so shapes.trace is required"
        );
        let loaded = parse(&format!("{text}shapes: {{trace: $DATA/pods.csv}}\n")).unwrap();
        assert_eq!(loaded.shape_trace, Some(PathBuf::from("/data/pods.csv")));
        let loaded = parse(&format!("{text}shapes: {{trace: pods.csv}}\n")).unwrap();
        assert_eq!(loaded.shape_trace, Some(PathBuf::from("dir/pods.csv")));
        let err = Scenario::parse(
            Path::new("s.yaml"),
            &format!("{text}shapes: {{trace: $DATA/p.csv}}\n"),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("s.yaml: shapes.trace: \"$DATA/p.csv\" needs the data directory"),
            "{err}"
        );
    }

    #[test]
    fn bad_durations_and_enums_are_parse_errors() {
        let err = error(&MINIMAL.replace("duration: 2h", "duration: two hours"));
        assert!(err.contains("duration"), "{err}");
        let err =
            error(&MINIMAL.replace("{logNormal: {median: 20m, p90: 2h}}", "{weibull: {k: 2}}"));
        assert!(err.contains("unknown variant `weibull`"), "{err}");
        let err = error(&MINIMAL.replace(
            "shape: {fixed: {gpus: 2}}",
            "shape: {trace: {qos: [Gold]}}\nshapes: {trace: p.csv}",
        ));
        assert!(err.contains("unknown variant `Gold`"), "{err}");
    }
}
