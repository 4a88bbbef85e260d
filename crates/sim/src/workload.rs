//! Turns a scenario into concrete load: the nodes, and every pod request with its arrival time,
//! shape and (for batch) the work it needs. The load depends only on the scenario and the seed,
//! never on the policy, so every policy is compared on the same arrivals.
//!
//! The synthetic arrival process (the openb time columns are a sparse sample and cannot be
//! replayed; see the trace README):
//! - **online**: an autoscaler runs every `scaleEvery` and sets a replica target that follows a
//!   daily cosine between `troughReplicas` and `peakReplicas` (peak at `peakHour`, the run
//!   starting at midnight), times `1 ± jitter` uniform noise. Scale-up adds replicas; scale-down
//!   removes the newest first. A replica never ends on its own.
//! - **batch**: Poisson arrivals at `jobsPerHour`; each job needs a drawn run time of work.
//! - **shapes** are drawn uniformly from the trace tasks passing the tenant's filter (or fixed).
//!
//! Each tenant and load kind draws from its own ChaCha stream, so adding a tenant does not
//! change the others' arrivals.

use std::path::Path;
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, LogNormal};

use crate::engine::SimTime;
use crate::scenario::{
    BatchLoad, DurationModel, LoadedScenario, OnlineLoad, Scenario, ShapeChoice, TraceFilter,
};
use crate::trace::{self, MILLI_PER_GPU, TraceError, TraceNode, TracePod};

/// z-score of the 90th percentile of a standard normal.
const Z90: f64 = 1.281_551_565_545;
/// z-score of the 99th percentile of a standard normal.
pub const Z99: f64 = 2.326_347_874_041;

/// A pod's resource request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// GPUs.
    pub gpus: u32,
    /// Share of each GPU, in milli-GPU (1000 = whole).
    pub gpu_milli: u32,
    /// CPU in milli-cores.
    pub cpu_milli: u32,
    /// Allowed GPU models; empty = any.
    pub gpu_models: Vec<String>,
}

impl Shape {
    /// The shape of a trace task (its GPU-model constraint kept or dropped).
    pub fn of_task(pod: &TracePod, keep_gpu_spec: bool) -> Self {
        Self {
            gpus: pod.num_gpu,
            gpu_milli: pod.gpu_milli,
            cpu_milli: pod.cpu_milli,
            gpu_models: if keep_gpu_spec {
                pod.gpu_spec.clone()
            } else {
                Vec::new()
            },
        }
    }

    /// GPU request in milli-GPU.
    pub fn total_gpu_milli(&self) -> u64 {
        u64::from(self.gpus) * u64::from(self.gpu_milli)
    }
}

/// Online replica or batch job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobKind {
    /// A serving replica: runs until the autoscaler removes it.
    Online,
    /// A batch job: runs until its work is done.
    Batch,
}

/// One pod request of the workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Index in [`Workload::jobs`].
    pub id: usize,
    /// Index of the tenant in the scenario.
    pub tenant: usize,
    /// Online or batch.
    pub kind: JobKind,
    /// When the pod is created.
    pub arrival: SimTime,
    /// What it requests.
    pub shape: Shape,
    /// Batch: run time needed to finish.
    pub work: Option<Duration>,
    /// Online: when the autoscaler removes it (pending or running); `None` = kept to the end.
    pub removed_at: Option<SimTime>,
}

/// Everything a run needs besides the policy.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The nodes (GPU nodes only).
    pub nodes: Vec<TraceNode>,
    /// Every pod request, ordered by arrival (ties by tenant order).
    pub jobs: Vec<Job>,
}

/// Why a workload could not be built.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A trace file is unreadable or malformed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A filter or model has nothing to draw from.
    #[error("{field}: {message}")]
    Empty {
        /// Where, such as `tenants[1].batch.shape.trace`.
        field: String,
        /// What is missing.
        message: String,
    },
}

impl Workload {
    /// Builds the nodes and arrivals of `loaded` for `seed`, reading its trace files.
    pub fn generate(loaded: &LoadedScenario, seed: u64) -> Result<Self, WorkloadError> {
        let nodes = match &loaded.node_trace {
            Some(path) => gpu_nodes(path)?,
            None => pool_nodes(&loaded.scenario),
        };
        let shape_tasks = match &loaded.shape_trace {
            Some(path) => trace::load_pods(path)?,
            None => Vec::new(),
        };
        let jobs = generate_jobs(&loaded.scenario, &shape_tasks, seed)?;
        Ok(Self { nodes, jobs })
    }
}

fn gpu_nodes(path: &Path) -> Result<Vec<TraceNode>, WorkloadError> {
    let nodes: Vec<TraceNode> = trace::load_nodes(path)?
        .into_iter()
        .filter(|n| n.gpus > 0)
        .collect();
    if nodes.is_empty() {
        return Err(WorkloadError::Empty {
            field: "cluster.trace".into(),
            message: format!("{} lists no GPU node", path.display()),
        });
    }
    Ok(nodes)
}

fn pool_nodes(scenario: &Scenario) -> Vec<TraceNode> {
    scenario
        .cluster
        .pools
        .iter()
        .flat_map(|pool| {
            (0..pool.count).map(move |i| TraceNode {
                name: format!("{}-{i:03}", pool.name),
                cpu_milli: pool.cpu_milli,
                memory_mib: 0,
                gpus: pool.gpus,
                gpu_model: Some(pool.gpu_model.clone()),
            })
        })
        .collect()
}

/// A random stream for one tenant's load of one kind.
fn stream(seed: u64, tenant: usize, kind: JobKind) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let kind_index = match kind {
        JobKind::Online => 0,
        JobKind::Batch => 1,
    };
    rng.set_stream(u64::try_from(tenant).unwrap_or(u64::MAX).saturating_mul(2) + kind_index);
    rng
}

fn generate_jobs(
    scenario: &Scenario,
    tasks: &[TracePod],
    seed: u64,
) -> Result<Vec<Job>, WorkloadError> {
    let end = SimTime::from_duration(scenario.duration.into());
    let mut jobs = Vec::new();
    for (tenant, spec) in scenario.tenants.iter().enumerate() {
        if let Some(online) = &spec.online {
            let field = format!("tenants[{tenant}].online.shape");
            let shapes = ShapePool::new(&online.shape, tasks, &field)?;
            online_jobs(
                online,
                &shapes,
                tenant,
                end,
                &mut stream(seed, tenant, JobKind::Online),
                &mut jobs,
            );
        }
        if let Some(batch) = &spec.batch {
            let at = |f: &str| format!("tenants[{tenant}].batch.{f}");
            let shapes = ShapePool::new(&batch.shape, tasks, &at("shape"))?;
            let durations = RunTimes::new(batch, tasks, &at("duration"))?;
            batch_jobs(
                batch,
                &shapes,
                &durations,
                tenant,
                end,
                &mut stream(seed, tenant, JobKind::Batch),
                &mut jobs,
            );
        }
    }
    // Stable: equal arrival times keep tenant order, then generation order.
    jobs.sort_by_key(|job| job.arrival);
    for (id, job) in jobs.iter_mut().enumerate() {
        job.id = id;
    }
    Ok(jobs)
}

/// The replica target at `at`: the daily cosine without jitter.
pub fn online_target(online: &OnlineLoad, at: SimTime) -> f64 {
    let hour = at.as_hours_f64() % 24.0;
    let phase = (hour - online.peak_hour) / 24.0 * std::f64::consts::TAU;
    let trough = f64::from(online.trough_replicas);
    trough + (f64::from(online.peak_replicas) - trough) * (1.0 + phase.cos()) / 2.0
}

fn online_jobs(
    online: &OnlineLoad,
    shapes: &ShapePool,
    tenant: usize,
    end: SimTime,
    rng: &mut ChaCha8Rng,
    jobs: &mut Vec<Job>,
) {
    let step: Duration = online.scale_every.into();
    let mut live: Vec<usize> = Vec::new(); // indices into `jobs`, oldest first
    let mut now = SimTime::ZERO;
    while now < end {
        let noise = if online.jitter > 0.0 {
            rng.random_range(-online.jitter..online.jitter)
        } else {
            0.0
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        // a small non-negative count
        let target = (online_target(online, now) * (1.0 + noise))
            .round()
            .max(0.0) as usize;
        while live.len() < target {
            live.push(jobs.len());
            jobs.push(Job {
                id: 0,
                tenant,
                kind: JobKind::Online,
                arrival: now,
                shape: shapes.draw(rng),
                work: None,
                removed_at: None,
            });
        }
        while live.len() > target {
            if let Some(newest) = live.pop() {
                jobs[newest].removed_at = Some(now);
            }
        }
        now = now.after(step);
    }
}

fn batch_jobs(
    batch: &BatchLoad,
    shapes: &ShapePool,
    durations: &RunTimes,
    tenant: usize,
    end: SimTime,
    rng: &mut ChaCha8Rng,
    jobs: &mut Vec<Job>,
) {
    let Ok(gap) = Exp::new(batch.jobs_per_hour / 3600.0) else {
        return; // the scenario's rules keep the rate positive and finite
    };
    let mut now = SimTime::ZERO;
    loop {
        now = now.after(Duration::from_secs_f64(gap.sample(rng)));
        if now >= end {
            return;
        }
        jobs.push(Job {
            id: 0,
            tenant,
            kind: JobKind::Batch,
            arrival: now,
            shape: shapes.draw(rng),
            work: Some(durations.draw(rng)),
            removed_at: None,
        });
    }
}

/// The shapes one load draws from.
struct ShapePool {
    shapes: Vec<Shape>,
}

impl ShapePool {
    fn new(choice: &ShapeChoice, tasks: &[TracePod], field: &str) -> Result<Self, WorkloadError> {
        let shapes: Vec<Shape> = match choice {
            ShapeChoice::Fixed(fixed) => vec![Shape {
                gpus: fixed.gpus,
                gpu_milli: MILLI_PER_GPU,
                cpu_milli: fixed.cpu_milli,
                gpu_models: Vec::new(),
            }],
            ShapeChoice::Trace(filter) => tasks
                .iter()
                .filter(|t| passes(filter, t))
                .map(|t| Shape::of_task(t, filter.keep_gpu_spec))
                .collect(),
        };
        if shapes.is_empty() {
            return Err(WorkloadError::Empty {
                field: format!("{field}.trace"),
                message: "no task of the shape trace passes this filter".into(),
            });
        }
        Ok(Self { shapes })
    }

    fn draw(&self, rng: &mut ChaCha8Rng) -> Shape {
        self.shapes[rng.random_range(0..self.shapes.len())].clone()
    }
}

/// Whether a trace task may be drawn under `filter`.
pub fn passes(filter: &TraceFilter, task: &TracePod) -> bool {
    let qos = filter.qos.is_empty() || task.qos.is_some_and(|q| filter.qos.contains(&q));
    let gpus = (filter.min_gpus..=filter.max_gpus).contains(&task.num_gpu);
    let sharing = filter.sharing || task.gpu_milli == MILLI_PER_GPU;
    qos && gpus && sharing
}

/// The run-time model of one batch load.
enum RunTimes {
    Fixed(Duration),
    LogNormal(LogNormal<f64>),
    Empirical(Vec<Duration>),
}

impl RunTimes {
    fn new(batch: &BatchLoad, tasks: &[TracePod], field: &str) -> Result<Self, WorkloadError> {
        match &batch.duration {
            DurationModel::Fixed(d) => Ok(RunTimes::Fixed((*d).into())),
            DurationModel::LogNormal { median, p90 } => {
                let median = Duration::from(*median).as_secs_f64();
                let sigma = (Duration::from(*p90).as_secs_f64() / median).ln() / Z90;
                LogNormal::new(median.ln(), sigma)
                    .map(RunTimes::LogNormal)
                    .map_err(|e| WorkloadError::Empty {
                        field: format!("{field}.logNormal"),
                        message: e.to_string(),
                    })
            }
            DurationModel::Trace { min, max } => {
                let (min, max) = (Duration::from(*min), Duration::from(*max));
                let filter = match &batch.shape {
                    ShapeChoice::Trace(filter) => filter.clone(),
                    ShapeChoice::Fixed(_) => TraceFilter::default(),
                };
                let times: Vec<Duration> = tasks
                    .iter()
                    .filter(|t| {
                        filter.qos.is_empty() || t.qos.is_some_and(|q| filter.qos.contains(&q))
                    })
                    .filter_map(TracePod::completed_duration_secs)
                    .map(|secs| Duration::from_secs(secs).clamp(min, max))
                    .collect();
                if times.is_empty() {
                    return Err(WorkloadError::Empty {
                        field: format!("{field}.trace"),
                        message: "the shape trace has no finished task (with scheduled and deletion times) of these QoS classes".into(),
                    });
                }
                Ok(RunTimes::Empirical(times))
            }
        }
    }

    fn draw(&self, rng: &mut ChaCha8Rng) -> Duration {
        match self {
            RunTimes::Fixed(d) => *d,
            RunTimes::LogNormal(dist) => Duration::from_secs_f64(dist.sample(rng).min(1e9)),
            RunTimes::Empirical(times) => times[rng.random_range(0..times.len())],
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;
    use crate::scenario::Scenario;

    const SCENARIO: &str = "
name: t
duration: 48h
cluster: {pools: [{name: a, count: 4, gpus: 8, gpuModel: A100}]}
tenants:
  - name: online
    guaranteed: 24
    online: {peakReplicas: 20, troughReplicas: 4, jitter: 0.0, scaleEvery: 10m, shape: {fixed: {gpus: 1}}}
  - name: batch
    guaranteed: 8
    batch: {jobsPerHour: 12, shape: {fixed: {gpus: 2}}, duration: {logNormal: {median: 30m, p90: 2h}}}
";

    fn workload(text: &str, seed: u64) -> Workload {
        let loaded = Scenario::parse(Path::new("s.yaml"), text, None).unwrap();
        Workload::generate(&loaded, seed).unwrap()
    }

    #[test]
    fn same_seed_same_load() {
        let a = workload(SCENARIO, 7);
        assert_eq!(a.jobs, workload(SCENARIO, 7).jobs);
        assert_ne!(a.jobs, workload(SCENARIO, 8).jobs);
        assert_eq!(a.nodes.len(), 4);
        assert_eq!(a.nodes.iter().map(|n| n.gpus).sum::<u32>(), 32);
        assert!(a.jobs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        assert!(a.jobs.iter().enumerate().all(|(i, j)| j.id == i));
    }

    #[test]
    fn online_replicas_follow_the_daily_cycle() {
        let w = workload(SCENARIO, 1);
        let live_at = |hour: f64| {
            let t = SimTime::from_secs_f64(hour * 3600.0);
            w.jobs
                .iter()
                .filter(|j| {
                    j.kind == JobKind::Online
                        && j.arrival <= t
                        && j.removed_at.is_none_or(|r| r > t)
                })
                .count()
        };
        assert_eq!(live_at(14.0), 20, "peak at 14:00");
        assert_eq!(live_at(26.0), 4, "trough at 02:00 the next day");
        assert_eq!(live_at(38.0), 20);
    }

    #[test]
    fn batch_arrivals_match_the_rate() {
        let w = workload(SCENARIO, 3);
        let batch: Vec<&Job> = w.jobs.iter().filter(|j| j.kind == JobKind::Batch).collect();
        // 12/h over 48 h: 576 expected; Poisson spread is about ±24.
        assert!((480..680).contains(&batch.len()), "{}", batch.len());
        let mut work: Vec<f64> = batch
            .iter()
            .map(|j| j.work.unwrap().as_secs_f64())
            .collect();
        work.sort_by(f64::total_cmp);
        let median = work[work.len() / 2];
        assert!(
            (1200.0..2700.0).contains(&median),
            "median run time {median}s, configured 30m"
        );
    }

    #[test]
    fn trace_filters_select_shapes() {
        let mut task = TracePod {
            name: "p".into(),
            cpu_milli: 1,
            memory_mib: 1,
            num_gpu: 1,
            gpu_milli: 500,
            gpu_spec: vec!["T4".into()],
            qos: Some(crate::trace::Qos::BestEffort),
            phase: None,
            creation_time: None,
            deletion_time: None,
            scheduled_time: None,
        };
        let filter = TraceFilter {
            qos: vec![crate::trace::Qos::BestEffort],
            min_gpus: 1,
            max_gpus: 8,
            ..TraceFilter::default()
        };
        assert!(
            !passes(&filter, &task),
            "sharing tasks are left out by default"
        );
        task.gpu_milli = 1000;
        assert!(passes(&filter, &task));
        task.qos = Some(crate::trace::Qos::LatencySensitive);
        assert!(!passes(&filter, &task));
        assert!(Shape::of_task(&task, false).gpu_models.is_empty());
        assert_eq!(
            Shape::of_task(&task, true).gpu_models,
            vec!["T4".to_owned()]
        );
    }
}
