//! A queue as the policy sees it: validated quotas in milli-units and reclaim settings as
//! durations. Converting a `GpuQueue` checks every rule again (the CRD's CEL rules may be
//! bypassed by an old CRD or a direct etcd write), so a bad spec becomes a typed error that the
//! operator reports on that queue's status, never a panic or a silent default.

use std::{collections::BTreeSet, fmt, time::Duration};

use gpuqueue_api::v1alpha1::{
    CheckpointDriver, CheckpointPolicy, GpuQueue, GpuQueueSpec, MAX_GPU_COUNT, PauseMode,
    ReclaimPolicy,
};
use kube::core::Duration as KubeDuration;

use super::selector::{LabelSelector, Labels};
use crate::quantity::{Milli, Quantity, ResourceName, parse_bytes};
use crate::termination::BIND_RESERVE;

/// What a queue's `gpuMemory` must be; the API's rule says the same.
const GPU_MEMORY_RULE: &str = "gpuMemory must be a positive quantity below 8Ei, such as 80Gi";

/// The longest handover budget a queue may ask for (the API's `MAX_BUDGET`).
pub const MAX_BUDGET: Duration = Duration::from_mins(1);
/// The longest anti-thrash floor a queue may ask for.
pub const MAX_MIN_BORROW: Duration = Duration::from_hours(24);

/// A tenant's queue.
#[derive(Clone, Debug, PartialEq)]
pub struct Queue {
    pub name: String,
    /// `metadata.generation`, echoed as `status.observedGeneration`.
    pub generation: Option<i64>,
    /// Namespaces claimed by name.
    pub namespaces: Vec<String>,
    /// Namespaces claimed by label.
    pub namespace_selector: Option<LabelSelector>,
    /// One quota per resource name, sorted by name.
    pub quotas: Vec<ResourceQuota>,
    /// Share of idle capacity among borrowers (at least 1).
    pub weight: u32,
    pub reclaim: ReclaimSettings,
}

/// The quota of one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceQuota {
    pub resource: ResourceName,
    pub guaranteed: Milli,
    pub burstable: Milli,
    /// How much of guaranteed may be lent while idle; `None`: all of it.
    pub lending_limit: Option<Milli>,
    /// Cap on the GPU memory this queue's pods of this resource hold, in MiB.
    pub gpu_memory_mib: Option<u64>,
    /// Cap on the GPU compute this queue's pods of this resource hold, milli of a device.
    pub gpu_cores_milli: Option<u64>,
}

impl ResourceQuota {
    /// A quota of whole devices: `guaranteed` plus `burstable` more when idle capacity allows.
    pub fn devices(resource: impl Into<ResourceName>, guaranteed: u64, burstable: u64) -> Self {
        Self {
            resource: resource.into(),
            guaranteed: Milli::devices(guaranteed),
            burstable: Milli::devices(burstable),
            lending_limit: None,
            gpu_memory_mib: None,
            gpu_cores_milli: None,
        }
    }

    /// guaranteed + burstable: the most the queue may hold.
    pub fn ceiling(&self) -> Milli {
        self.guaranteed + self.burstable
    }

    /// The part of guaranteed that may be lent.
    pub fn lendable(&self) -> Milli {
        self.lending_limit
            .map_or(self.guaranteed, |limit| limit.min(self.guaranteed))
    }
}

/// How a queue takes GPUs back, and how its own borrowers are treated when others do.
#[derive(Clone, Debug, PartialEq)]
pub struct ReclaimSettings {
    /// Deadline of a handover to this queue's pods.
    pub budget: Duration,
    pub checkpoint: CheckpointSettings,
    /// Termination grace period of this queue's pods when evicted by a reclaim.
    pub victim_grace: Duration,
    /// This queue's borrowers are not reclaimed before running this long (unless the owner's
    /// budget cannot be met otherwise), and it does not re-borrow within this time after a
    /// reclaim took GPUs from it.
    pub min_borrow: Option<Duration>,
}

impl Default for ReclaimSettings {
    fn default() -> Self {
        Self {
            budget: Duration::from_secs(3),
            checkpoint: CheckpointSettings::default(),
            victim_grace: Duration::from_secs(1),
            min_borrow: None,
        }
    }
}

/// How a victim of this queue is checkpointed before eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSettings {
    pub driver: CheckpointDriver,
    pub port: Option<u16>,
    /// URL path of the `http` driver.
    pub path: Option<String>,
    /// vLLM pause mode of the `vllm` driver.
    pub pause_mode: PauseMode,
    pub timeout: Duration,
}

impl Default for CheckpointSettings {
    fn default() -> Self {
        Self {
            driver: CheckpointDriver::None,
            port: None,
            path: None,
            pause_mode: PauseMode::Abort,
            timeout: Duration::from_millis(1500),
        }
    }
}

/// One rule a queue's spec breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field, such as `spec.resources[1].lendingLimit`.
    pub field: String,
    pub rule: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

/// A `GpuQueue` whose spec cannot be used; every broken rule is listed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("GpuQueue {queue} has an invalid spec: {}", .problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct QueueError {
    pub queue: String,
    pub problems: Vec<FieldError>,
}

impl Queue {
    /// A queue with no namespaces and no quotas; add them with the builder methods.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            generation: None,
            namespaces: Vec::new(),
            namespace_selector: None,
            quotas: Vec::new(),
            weight: 1,
            reclaim: ReclaimSettings::default(),
        }
    }

    /// Claims a namespace by name.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespaces.push(namespace.into());
        self
    }

    /// Sets the quota of one resource (replacing an earlier one of the same name).
    #[must_use]
    pub fn quota(mut self, quota: ResourceQuota) -> Self {
        self.quotas.retain(|q| q.resource != quota.resource);
        self.quotas.push(quota);
        self.quotas.sort_by(|a, b| a.resource.cmp(&b.resource));
        self
    }

    #[must_use]
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight.max(1);
        self
    }

    #[must_use]
    pub fn reclaim(mut self, reclaim: ReclaimSettings) -> Self {
        self.reclaim = reclaim;
        self
    }

    /// The quota of `resource`, if the queue has one.
    pub fn quota_of(&self, resource: &ResourceName) -> Option<&ResourceQuota> {
        self.quotas.iter().find(|q| &q.resource == resource)
    }

    /// Whether the queue claims a namespace with this name and labels.
    pub fn claims(&self, namespace: &str, labels: &Labels) -> bool {
        self.namespaces.iter().any(|n| n == namespace)
            || self
                .namespace_selector
                .as_ref()
                .is_some_and(|s| s.matches(labels))
    }

    /// Reads and validates a `GpuQueue`.
    pub fn from_api(queue: &GpuQueue) -> Result<Self, QueueError> {
        let name = queue.metadata.name.clone().unwrap_or_default();
        let mut problems = Problems::default();
        if name.is_empty() {
            problems.add("metadata.name", "must be set");
        }
        let spec = &queue.spec;
        let namespace_selector = namespaces(spec, &mut problems);
        let quotas = quotas(spec, &mut problems);
        let weight = if let Ok(w @ 1..=1000) = u32::try_from(spec.weight) {
            w
        } else {
            problems.add(
                "spec.weight",
                format!("must be between 1 and 1000, not {}", spec.weight),
            );
            1
        };
        let reclaim = reclaim(&spec.reclaim, &mut problems);
        if !problems.0.is_empty() {
            return Err(QueueError {
                queue: name,
                problems: problems.0,
            });
        }
        Ok(Self {
            name,
            generation: queue.metadata.generation,
            namespaces: spec.namespaces.clone(),
            namespace_selector,
            quotas,
            weight,
            reclaim,
        })
    }
}

/// The rules a spec breaks, collected so that one error lists them all.
#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn add(&mut self, field: &str, rule: impl Into<String>) {
        self.0.push(FieldError {
            field: field.to_string(),
            rule: rule.into(),
        });
    }
}

/// Checks `namespaces` and reads `namespaceSelector`.
fn namespaces(spec: &GpuQueueSpec, problems: &mut Problems) -> Option<LabelSelector> {
    if spec.namespaces.is_empty() && spec.namespace_selector.is_none() {
        problems.add(
            "spec.namespaces",
            "spec.namespaces or spec.namespaceSelector must select at least one namespace",
        );
    }
    let mut seen = BTreeSet::new();
    for (i, ns) in spec.namespaces.iter().enumerate() {
        let field = format!("spec.namespaces[{i}]");
        if !is_dns_label(ns) {
            problems.add(
                &field,
                format!("{ns:?} is not a namespace name (a DNS label such as team-a)"),
            );
        } else if !seen.insert(ns) {
            problems.add(&field, format!("namespace {ns} is listed twice"));
        }
    }
    let selector = spec.namespace_selector.as_ref()?;
    LabelSelector::from_k8s(selector, "spec.namespaceSelector")
        .map_err(|e| problems.add(&e.field, e.rule))
        .ok()
}

/// Reads `resources[]` into quotas sorted by resource name.
/// A queue's `gpuMemory` in MiB (rounded up); `None`, with the problem, when it is no positive
/// quantity below 8Ei, as the API's rule says (a byte count fits in 63 bits).
fn gpu_memory_mib(memory: &str, field: &str, problems: &mut Problems) -> Option<u64> {
    match parse_bytes(memory) {
        Ok(bytes) if bytes > 0 && bytes < 1 << 63 => Some(bytes.div_ceil(1 << 20)),
        // A quantity past 64 bits of bytes is over the same line.
        Ok(_) => {
            problems.add(field, GPU_MEMORY_RULE);
            None
        }
        Err(_) if Quantity::parse(memory).is_ok() => {
            problems.add(field, GPU_MEMORY_RULE);
            None
        }
        Err(e) => {
            problems.add(field, e.to_string());
            None
        }
    }
}

fn quotas(spec: &GpuQueueSpec, problems: &mut Problems) -> Vec<ResourceQuota> {
    if spec.resources.is_empty() {
        problems.add("spec.resources", "must list at least one resource");
    }
    let mut seen = BTreeSet::new();
    let mut quotas = Vec::new();
    for (i, r) in spec.resources.iter().enumerate() {
        let field = |f: &str| format!("spec.resources[{i}].{f}");
        if !seen.insert(r.name.as_str()) {
            problems.add(
                &field("name"),
                format!("resource {} is listed twice", r.name),
            );
        }
        if !r.name.contains('/') {
            problems.add(
                &field("name"),
                format!(
                    "{:?} must be an extended resource name such as nvidia.com/gpu",
                    r.name
                ),
            );
        }
        let mut count = |f: &str, value: i32| -> Milli {
            if (0..=MAX_GPU_COUNT).contains(&value) {
                Milli::devices(u64::from(value.unsigned_abs()))
            } else {
                problems.add(
                    &field(f),
                    format!("must be between 0 and {MAX_GPU_COUNT}, not {value}"),
                );
                Milli::ZERO
            }
        };
        let guaranteed = count("guaranteed", r.guaranteed);
        let burstable = count("burstable", r.burstable);
        let lending_limit = r.lending_limit.map(|l| count("lendingLimit", l));
        if let Some(limit) = r.lending_limit
            && limit > r.guaranteed
        {
            problems.add(
                &field("lendingLimit"),
                format!(
                    "lendingLimit must not exceed guaranteed ({limit} > {}): a queue can lend only GPUs it is guaranteed",
                    r.guaranteed
                ),
            );
        }
        let gpu_memory_mib = r
            .gpu_memory
            .as_deref()
            .and_then(|memory| gpu_memory_mib(memory, &field("gpuMemory"), problems));
        quotas.push(ResourceQuota {
            resource: ResourceName::new(&r.name),
            guaranteed,
            burstable,
            lending_limit,
            gpu_memory_mib,
            gpu_cores_milli: r
                .gpu_cores
                .and_then(|c| u64::try_from(c).ok())
                .map(|c| c * 10),
        });
    }
    quotas.sort_by(|a, b| a.resource.cmp(&b.resource));
    quotas
}

/// A duration field: not negative, within `max`, and longer than zero when `positive`.
fn duration(
    problems: &mut Problems,
    field: &str,
    d: KubeDuration,
    max: Duration,
    positive: bool,
) -> Duration {
    if d.is_negative() {
        problems.add(field, format!("must not be negative, not {d}"));
        return Duration::ZERO;
    }
    let d = Duration::from(d);
    if positive && d.is_zero() {
        problems.add(field, "must be longer than 0s");
    }
    if d > max {
        problems.add(field, format!("must be at most {}", format_duration(max)));
    }
    d
}

/// Reads `reclaim`: budget, checkpoint, victim grace period and the anti-thrash floor.
fn reclaim(policy: &ReclaimPolicy, problems: &mut Problems) -> ReclaimSettings {
    let budget = duration(
        problems,
        "spec.reclaim.budget",
        policy.budget,
        MAX_BUDGET,
        true,
    );
    let checkpoint = checkpoint(&policy.checkpoint, problems);
    let min_borrow = policy.min_borrow_duration.map(|d| {
        duration(
            problems,
            "spec.reclaim.minBorrowDuration",
            d,
            MAX_MIN_BORROW,
            false,
        )
    });
    let victim_grace = if let Ok(s @ 0..=30) = u64::try_from(policy.victim_grace_period_seconds) {
        Duration::from_secs(s)
    } else {
        problems.add(
            "spec.reclaim.victimGracePeriodSeconds",
            format!(
                "must be between 0 and 30, not {}",
                policy.victim_grace_period_seconds
            ),
        );
        Duration::from_secs(1)
    };
    // A victim of this queue may use its whole grace after its checkpoint (the API's rule, in
    // whole milliseconds as its CEL compares them: a queue the API server took is never
    // refused here for a fraction of a millisecond).
    let whole_ms =
        |d: Duration| Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    if whole_ms(budget) < whole_ms(checkpoint.timeout) + victim_grace + BIND_RESERVE {
        problems.add(
            "spec.reclaim.budget",
            format!(
                "reclaim.budget ({}) must be at least reclaim.checkpoint.timeout ({}) plus reclaim.victimGracePeriodSeconds ({}) plus {} for the eviction call and the bind: raise the budget to {} or lower the checkpoint timeout or the grace period",
                format_duration(budget),
                format_duration(checkpoint.timeout),
                victim_grace.as_secs(),
                format_duration(BIND_RESERVE),
                format_duration(whole_ms(checkpoint.timeout) + victim_grace + BIND_RESERVE),
            ),
        );
    }
    ReclaimSettings {
        budget,
        checkpoint,
        victim_grace,
        min_borrow,
    }
}

/// Reads `reclaim.checkpoint`: which fields each driver needs and allows.
fn checkpoint(checkpoint: &CheckpointPolicy, problems: &mut Problems) -> CheckpointSettings {
    let timeout = duration(
        problems,
        "spec.reclaim.checkpoint.timeout",
        checkpoint.timeout,
        MAX_BUDGET,
        true,
    );
    let port = checkpoint.port.and_then(|p| match u16::try_from(p) {
        Ok(p) if p > 0 => Some(p),
        _ => {
            problems.add(
                "spec.reclaim.checkpoint.port",
                format!("must be between 1 and 65535, not {p}"),
            );
            None
        }
    });
    match (checkpoint.driver, checkpoint.port) {
        (CheckpointDriver::None, Some(_)) => problems.add(
            "spec.reclaim.checkpoint.port",
            "checkpoint.port is only allowed with the vllm and http drivers",
        ),
        (CheckpointDriver::Vllm | CheckpointDriver::Http, None) => problems.add(
            "spec.reclaim.checkpoint.port",
            "checkpoint.port is required for the vllm and http drivers",
        ),
        _ => {}
    }
    match (checkpoint.driver, &checkpoint.path) {
        (CheckpointDriver::Http, None) => {
            problems.add(
                "spec.reclaim.checkpoint.path",
                "checkpoint.path is required for the http driver",
            );
        }
        (CheckpointDriver::Http, Some(path))
            if !path.starts_with('/') || path.contains(['?', '#']) =>
        {
            problems.add(
                "spec.reclaim.checkpoint.path",
                "checkpoint.path must be an absolute URL path such as /checkpoint",
            );
        }
        (CheckpointDriver::Vllm | CheckpointDriver::None, Some(_)) => {
            problems.add(
                "spec.reclaim.checkpoint.path",
                "checkpoint.path is only allowed with the http driver",
            );
        }
        _ => {}
    }
    if checkpoint.pause_mode.is_some() && checkpoint.driver != CheckpointDriver::Vllm {
        problems.add(
            "spec.reclaim.checkpoint.pauseMode",
            "checkpoint.pauseMode is only allowed with the vllm driver",
        );
    }
    CheckpointSettings {
        driver: checkpoint.driver,
        port,
        path: checkpoint.path.clone(),
        pause_mode: checkpoint.pause_mode.unwrap_or_default(),
        timeout,
    }
}

/// A duration as a person writes it: `3s`, `1500ms`, `5m`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else if !ms.is_multiple_of(60_000) || ms == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{}m", ms / 60_000)
    }
}

fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}
