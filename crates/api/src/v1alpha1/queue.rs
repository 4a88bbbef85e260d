//! The `GpuQueue` resource: one per tenant, cluster-scoped, written by cluster admins (or the
//! GitOps tool that acts for them) and read by the operator.
//!
//! ```text
//! GpuQueue
//! ├── spec (owned by admins / GitOps; the operator never writes it)
//! │   ├── namespaces, namespaceSelector   which pods belong to the queue
//! │   ├── resources[name]                 guaranteed / burstable / lendingLimit / gpuMemory / gpuCores
//! │   ├── weight                          share of idle capacity among borrowers
//! │   └── reclaim                         budget, checkpoint driver, victim grace, anti-thrash
//! └── status (owned by the operator, through the status subresource)
//!     ├── resources[name]                 guaranteed / ceiling / allocated / borrowed / lent / pending
//!     ├── summary                         the printer columns of `kubectl get gq`
//!     ├── conditions[type]                Ready, Overcommitted, Reclaiming, NamespaceConflict
//!     ├── lastHandovers                   the latest reclaims with their phase timings
//!     └── reclaimsInFlight                reclaims started and not finished: the only ones
//!                                         whose pod annotations the operator trusts
//! ```
//!
//! Every validation rule lives in the schema (CEL or bounds), so the API server refuses a bad
//! queue with a message that names the field; `crds/` is generated from these types.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, MicroTime, Time};
use kube::{CustomResource, KubeSchema, core::Duration};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Largest GPU count a quota field accepts: far above any real cluster, low enough to catch typos
/// such as a memory size pasted into a count.
pub const MAX_GPU_COUNT: i32 = 100_000;
/// Most GPU resource kinds one queue may list.
pub const MAX_RESOURCES: usize = 16;
/// Most namespaces one queue may list.
pub const MAX_NAMESPACES: usize = 256;
/// Handovers the operator keeps in `status.lastHandovers` (the API accepts up to 32, what
/// earlier versions kept). Every status write makes kube-apiserver decode, validate and encode
/// the whole queue: with 32 records a queue of the handover benchmark was 47 KB as served, with
/// 8 it is 17 KB, and its mean status patch during bursts went from 33–39 to 15–18 ms. A
/// burst's records are still all written, the older ones in patches before the last, so a
/// watcher sees each one; the longer history is in the events and the metrics.
pub const HANDOVER_RECORDS_KEPT: usize = 8;
/// Most reclaims one queue may have in flight (`status.reclaimsInFlight`).
pub const MAX_RECLAIMS_IN_FLIGHT: usize = 128;

/// Longest handover budget accepted. A reclaim that may take longer than a minute is not a
/// handover but a drain, and belongs to a different tool.
pub const MAX_BUDGET: &str = "60s";
/// Time kept back from the budget, besides the victims' grace period, for the eviction call and
/// kube-scheduler's bind of the owner (the core's `termination::BIND_RESERVE`).
pub const BIND_RESERVE: &str = "250ms";

/// The rule a queue's reclaim budget obeys, as the API server and the operator word it.
pub const BUDGET_RULE: &str = "reclaim.budget must be at least reclaim.checkpoint.timeout plus \
    reclaim.victimGracePeriodSeconds plus 250ms for the eviction call and the bind: raise the \
    budget or lower the checkpoint timeout or the grace period";

/// A Go duration (`time.ParseDuration`): `0`, or numbers with units `ns`, `us`, `ms`, `s`, `m`
/// and `h`, such as `3s`, `1500ms` or `1m30s`.
// `[.]` rather than `\.`: the pattern sits in a CEL string literal, where `\.` is not an escape.
const DURATION_PATTERN: &str = r"^(0|([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+)$";

/// A GpuQueue gives one tenant a guaranteed share of the cluster's GPUs and lets it borrow idle
/// GPUs of other tenants up to a burstable ceiling. See `examples/` for annotated queues.
// Each `printcolumn(...)` repeats `type_`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gpuqueue.io",
    version = "v1alpha1",
    kind = "GpuQueue",
    plural = "gpuqueues",
    shortname = "gq",
    category = "gpuqueue",
    status = "GpuQueueStatus",
    derive = "PartialEq",
    doc = "A GpuQueue gives one tenant guaranteed GPUs and lets it borrow idle GPUs of other tenants.",
    printcolumn(
        name = "Guaranteed",
        type_ = "string",
        json_path = ".status.summary.guaranteed",
        description = "GPUs always available to this queue"
    ),
    printcolumn(
        name = "Ceiling",
        type_ = "string",
        json_path = ".status.summary.ceiling",
        description = "guaranteed + burstable: the most this queue may hold"
    ),
    printcolumn(
        name = "Allocated",
        type_ = "string",
        json_path = ".status.summary.allocated",
        description = "GPUs held by admitted pods of this queue"
    ),
    printcolumn(
        name = "Borrowed",
        type_ = "string",
        json_path = ".status.summary.borrowed",
        description = "GPUs held above guaranteed, reclaimable by their owners"
    ),
    printcolumn(
        name = "Lent",
        type_ = "string",
        json_path = ".status.summary.lent",
        description = "guaranteed GPUs of this queue in use by borrowers"
    ),
    printcolumn(
        name = "Pending",
        type_ = "string",
        json_path = ".status.summary.pending",
        description = "GPUs requested by pods still waiting for admission"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("size(self.namespaces) > 0 || has(self.namespaceSelector)")
    .message("spec.namespaces or spec.namespaceSelector must select at least one namespace")
    .reason(Reason::FieldValueRequired)
    .field_path(".namespaces"))]
#[serde(rename_all = "camelCase")]
pub struct GpuQueueSpec {
    /// namespaces: the namespaces whose GPU pods belong to this queue. A namespace claimed by two
    /// queues is reported on both (condition NamespaceConflict) and admits nothing until resolved.
    #[serde(default)]
    #[schemars(length(max = MAX_NAMESPACES), inner(length(min = 1, max = 63)))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    #[x_kube(validation = Rule::new("self.all(n, n.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))")
        .message("namespaces must be namespace names (DNS labels such as team-a)"))]
    pub namespaces: Vec<String>,

    /// namespaceSelector: also claim every namespace whose labels match this selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // What a LabelSelector's own validation refuses, which the schema of k8s-openapi's type
    // does not carry: the operator would refuse the queue after the API server took it.
    #[x_kube(validation = Rule::new("!has(self.matchExpressions) || self.matchExpressions.all(e, \
        e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'] \
        && (e.operator in ['In', 'NotIn'] ? has(e.values) && size(e.values) > 0 : !has(e.values) || size(e.values) == 0))")
        .message("namespaceSelector.matchExpressions: operator must be In, NotIn, Exists or DoesNotExist; In and NotIn need at least one value, Exists and DoesNotExist take none"))]
    pub namespace_selector: Option<LabelSelector>,

    /// resources: the quota for each GPU resource name pods of this queue request. A list keyed
    /// on `name`, so the API server refuses a name listed twice.
    #[schemars(length(min = 1, max = MAX_RESOURCES))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub resources: Vec<ResourceQuota>,

    /// weight: this queue's share of idle capacity when several queues want to borrow at once
    /// (Volcano's queue `weight`). Default 1.
    #[serde(default = "default_weight")]
    #[schemars(range(min = 1, max = 1000))]
    pub weight: i32,

    /// reclaim: how this queue takes back its guaranteed GPUs and how its own borrowing pods are
    /// checkpointed and evicted when another queue takes its GPUs back.
    #[serde(default)]
    pub reclaim: ReclaimPolicy,
}

/// The quota of one GPU resource name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new("!has(self.lendingLimit) || self.lendingLimit <= self.guaranteed")
    .message("lendingLimit must not exceed guaranteed: a queue can lend only GPUs it is guaranteed")
    .field_path(".lendingLimit"))]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuota {
    /// name: the extended resource pods request, such as `nvidia.com/gpu` or a MIG profile like
    /// `nvidia.com/mig-1g.10gb`.
    #[x_kube(validation = Rule::new(
        "self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')")
        .message("name must be an extended resource name such as nvidia.com/gpu"))]
    #[schemars(length(min = 3, max = 253))]
    pub name: String,

    /// guaranteed: GPUs this queue always gets when it has demand (Volcano's `deserved`, Kueue's
    /// `nominalQuota`). Idle guaranteed GPUs are lent to other queues and reclaimed on demand.
    #[schemars(range(min = 0, max = 100_000))]
    pub guaranteed: i32,

    /// burstable: GPUs this queue may borrow on top of guaranteed (Kueue's `borrowingLimit`).
    /// The queue never holds more than guaranteed + burstable. Default 0: no borrowing.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100_000))]
    pub burstable: i32,

    /// maxBurstable: the highest `burstable` a tenant admin of this queue may set
    /// (`config/rbac/tenant_admin.yaml`; the policy `gpuqueue-queue-edits` enforces it). Only
    /// cluster admins may change it. Unset: a tenant admin may lower burstable, not raise it.
    /// The operator does not read it: it limits who may edit, not what the queue may hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100_000))]
    pub max_burstable: Option<i32>,

    /// lendingLimit: how many of the guaranteed GPUs may be lent while idle (Kueue's
    /// `lendingLimit`; guaranteed − lendingLimit is Volcano's never-lent `guarantee`).
    /// Unset: all of them. 0: never lend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100_000))]
    pub lending_limit: Option<i32>,

    /// gpuMemory: optional cap on the GPU memory held by this queue's pods of this resource,
    /// as a quantity such as `320Gi`. A device's memory comes from the node's
    /// `nvidia.com/gpu.memory` label (MiB), or from the MIG profile name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0')) && quantity(self).isLessThan(quantity('8Ei'))")
        .message("gpuMemory must be a positive quantity below 8Ei, such as 80Gi"))]
    // The bound keeps the rule within kube-apiserver's CEL cost budget (unbounded, it
    // exceeds it by a factor of 1.007 across 16 resources and the CRD is refused).
    #[schemars(length(max = 32))]
    pub gpu_memory: Option<String>,

    /// gpuCores: optional cap on the GPU compute held by this queue's pods of this resource,
    /// in percent of one device summed over devices (HAMi's `nvidia.com/gpucores` unit): 250 is
    /// two and a half GPUs. A whole device holds 100, a time-sliced replica 100/replicas, a HAMi
    /// pod its `nvidia.com/gpucores` (or 100 when it asks none: HAMi then limits it to nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000_000))]
    pub gpu_cores: Option<i32>,
}

/// How GPUs are taken back.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
// A victim may use its whole grace period after its checkpoint, so a budget that cannot hold
// both (and the bind) is broken by this queue's own pods; the operator plans with the
// termination it observes on top. In milliseconds: a duration built from a string of unknown
// length is priced beyond the CEL cost budget.
#[x_kube(validation = Rule::new(format!(
    "!self.budget.matches('{DURATION_PATTERN}') || !self.checkpoint.timeout.matches('{DURATION_PATTERN}') \
     || duration(self.budget).getMilliseconds() >= duration(self.checkpoint.timeout).getMilliseconds() \
        + self.victimGracePeriodSeconds * 1000 + duration('{BIND_RESERVE}').getMilliseconds()"))
    .message(BUDGET_RULE)
    .field_path(".budget"))]
#[serde(rename_all = "camelCase")]
pub struct ReclaimPolicy {
    /// budget: the deadline for handing reclaimed GPUs to this queue's pod, from the moment it is
    /// found blocked by borrowers until it is bound. Default 3s, at most 60s.
    #[serde(
        default = "default_budget",
        deserialize_with = "crate::duration::deserialize"
    )]
    #[x_kube(validation = Rule::new(format!("self.matches('{DURATION_PATTERN}')"))
        .message("budget must be a duration such as 3s or 2500ms"))]
    #[x_kube(validation = Rule::new(format!("!self.matches('{DURATION_PATTERN}') || duration(self) <= duration('{MAX_BUDGET}')"))
        .message("budget must be at most 60s"))]
    #[x_kube(validation = Rule::new(format!("!self.matches('{DURATION_PATTERN}') || duration(self) > duration('0s')"))
        .message("budget must be longer than 0s"))]
    #[schemars(length(max = 32))]
    pub budget: Duration,

    /// checkpoint: how this queue's pods are asked to save their work before they are evicted
    /// to return borrowed GPUs.
    #[serde(default)]
    pub checkpoint: CheckpointPolicy,

    /// victimGracePeriodSeconds: termination grace period given to this queue's pods when they
    /// are evicted by a reclaim. Default 1, at most 30.
    #[serde(default = "default_victim_grace")]
    #[schemars(range(min = 0, max = 30))]
    pub victim_grace_period_seconds: i64,

    /// minBorrowDuration: a borrowing pod of this queue is not reclaimed before it has run this
    /// long, unless the owner's budget cannot be met otherwise; and GPUs just reclaimed from this
    /// queue are not lent back to it within this time. Unset: no floor.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::deserialize_option"
    )]
    #[x_kube(validation = Rule::new(format!("self.matches('{DURATION_PATTERN}')"))
        .message("minBorrowDuration must be a duration such as 30s or 5m"))]
    #[x_kube(validation = Rule::new(format!("!self.matches('{DURATION_PATTERN}') || duration(self) <= duration('24h')"))
        .message("minBorrowDuration must be at most 24h"))]
    #[schemars(length(max = 32))]
    pub min_borrow_duration: Option<Duration>,
}

/// How a borrowing pod is checkpointed before eviction.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("self.driver == 'none' || has(self.port)")
    .message("checkpoint.port is required for the vllm and http drivers")
    .reason(Reason::FieldValueRequired)
    .field_path(".port"))]
#[x_kube(validation = Rule::new("self.driver != 'none' || !has(self.port)")
    .message("checkpoint.port is only allowed with the vllm and http drivers")
    .reason(Reason::FieldValueForbidden)
    .field_path(".port"))]
#[x_kube(validation = Rule::new("self.driver != 'http' || has(self.path)")
    .message("checkpoint.path is required for the http driver")
    .reason(Reason::FieldValueRequired)
    .field_path(".path"))]
#[x_kube(validation = Rule::new("self.driver == 'http' || !has(self.path)")
    .message("checkpoint.path is only allowed with the http driver")
    .reason(Reason::FieldValueForbidden)
    .field_path(".path"))]
#[x_kube(validation = Rule::new("self.driver == 'vllm' || !has(self.pauseMode)")
    .message("checkpoint.pauseMode is only allowed with the vllm driver")
    .reason(Reason::FieldValueForbidden)
    .field_path(".pauseMode"))]
#[serde(rename_all = "camelCase")]
pub struct CheckpointPolicy {
    /// driver: `vllm` (vLLM's pause endpoint, then its metrics until idle), `http` (a sidecar:
    /// `POST <path>`, 2xx means durable) or `none`. Default none.
    #[serde(default)]
    pub driver: CheckpointDriver,

    /// port: the pod port the driver calls, on the pod's IP as the API reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,

    /// path: the URL path the http driver POSTs to, such as `/checkpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.contains('?') && !self.contains('#')")
        .message("checkpoint.path must be an absolute URL path such as /checkpoint"))]
    #[schemars(length(min = 1, max = 1024))]
    pub path: Option<String>,

    /// pauseMode: what vLLM does with in-flight requests when paused: `abort` (default; clients
    /// get their partial output and the router resubmits), `wait` (finish them first) or `keep`
    /// (freeze them on the GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_mode: Option<PauseMode>,

    /// timeout: the longest a checkpoint may take before eviction goes ahead anyway. The budget
    /// may cut it shorter. Default 1500ms.
    #[serde(
        default = "default_checkpoint_timeout",
        deserialize_with = "crate::duration::deserialize"
    )]
    #[x_kube(validation = Rule::new(format!("self.matches('{DURATION_PATTERN}')"))
        .message("checkpoint.timeout must be a duration such as 1500ms or 2s"))]
    #[x_kube(validation = Rule::new(format!("!self.matches('{DURATION_PATTERN}') || duration(self) > duration('0s')"))
        .message("checkpoint.timeout must be longer than 0s"))]
    #[schemars(length(max = 32))]
    pub timeout: Duration,
}

/// The checkpoint drivers.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointDriver {
    /// vLLM's own endpoints: `POST /pause`, `GET /is_paused` and the request-count metrics.
    Vllm,
    /// A sidecar that answers `POST <path>` with 2xx once the checkpoint is durable.
    Http,
    /// Evict without a checkpoint.
    #[default]
    None,
}

/// vLLM's pause modes (`POST /pause?mode=...`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum PauseMode {
    /// End in-flight requests now; clients get their partial output.
    #[default]
    Abort,
    /// Let in-flight requests finish first.
    Wait,
    /// Freeze in-flight requests on the GPU.
    Keep,
}

/// What the operator observed of a queue. Written only by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuQueueStatus {
    /// observedGeneration: the spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// resources: usage of each GPU resource named in the spec.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub resources: Vec<ResourceStatus>,

    /// summary: the numbers `kubectl get gq` prints, one value per resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<StatusSummary>,

    /// admittedPods: pods of this queue whose admission gate was released.
    #[serde(default)]
    pub admitted_pods: i32,

    /// pendingPods: pods of this queue still held at the admission gate.
    #[serde(default)]
    pub pending_pods: i32,

    /// conditions: Ready, Overcommitted, Reclaiming and NamespaceConflict.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// lastHandovers: the most recent reclaims for or from this queue, newest first (the
    /// operator keeps the last 8).
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub last_handovers: Vec<HandoverRecord>,

    /// reclaimsInFlight: the reclaims for this queue's pods that were started and have not
    /// finished. Written by the operator before any pod is annotated, removed with the
    /// handover's record; a pod's reclaim annotations count only when they match an entry here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub reclaims_in_flight: Vec<ReclaimInFlight>,
}

/// A reclaim under way, as the operator recorded it before annotating its pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimInFlight {
    /// id: the reclaim id its pods carry in `gpuqueue.io/reclaim-id`.
    pub id: String,
    /// ownerPod: `namespace/name` of the pod the GPUs are freed for.
    pub owner_pod: String,
    /// ownerUid: that pod's uid.
    pub owner_uid: String,
    /// node: the node freed for the owner.
    pub node: String,
    /// victims: the pods evicted for it.
    #[serde(default)]
    pub victims: Vec<VictimInFlight>,
    /// startedAt: when the owner was found blocked.
    pub started_at: MicroTime,
    /// deadline: startedAt plus the owner queue's budget.
    pub deadline: MicroTime,
}

/// One victim of a reclaim in flight.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VictimInFlight {
    /// pod: `namespace/name`.
    pub pod: String,
    /// uid: the pod's uid.
    pub uid: String,
    /// queue: the queue the victim's GPUs are taken from (the one claiming its namespace).
    pub queue: String,
}

/// Usage of one GPU resource by one queue.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceStatus {
    /// name: the GPU resource name.
    pub name: String,
    /// guaranteed: the spec's guaranteed quota.
    pub guaranteed: i64,
    /// ceiling: guaranteed + burstable.
    pub ceiling: i64,
    /// allocated: GPUs held by admitted pods.
    pub allocated: i64,
    /// borrowed: allocated GPUs above guaranteed.
    pub borrowed: i64,
    /// lent: guaranteed GPUs idle here and used by other queues.
    pub lent: i64,
    /// pending: GPUs requested by pods waiting at the gate.
    pub pending: i64,
}

/// The printer columns, rendered by the operator so `kubectl get gq` needs no arithmetic.
/// A queue with one resource shows plain numbers (`8`); with several, `gpu=8,mig-1g.10gb=2`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StatusSummary {
    /// guaranteed: guaranteed GPUs per resource.
    pub guaranteed: String,
    /// ceiling: guaranteed + burstable per resource.
    pub ceiling: String,
    /// allocated: GPUs held by admitted pods per resource.
    pub allocated: String,
    /// borrowed: GPUs held above guaranteed per resource.
    pub borrowed: String,
    /// lent: guaranteed GPUs used by other queues per resource.
    pub lent: String,
    /// pending: GPUs waiting for admission per resource.
    pub pending: String,
}

/// One reclaim, from decision to the owner's pod being bound.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HandoverRecord {
    /// id: the reclaim id, also written on the owner and victim pods.
    pub id: String,
    /// role: `owner` when this queue took GPUs back, `victim` when its pods were evicted.
    pub role: String,
    /// ownerPod: `namespace/name` of the pod the GPUs were handed to.
    pub owner_pod: String,
    /// node: the node the GPUs were freed on.
    pub node: String,
    /// victims: `namespace/name` of each evicted pod.
    #[serde(default)]
    pub victims: Vec<String>,
    /// startedAt: when the owner was found blocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// outcome: Completed, or the reason it was not.
    pub outcome: String,
    /// budgetMillis: the budget the handover ran under.
    pub budget_millis: i64,
    /// totalMillis: from found blocked to owner bound.
    pub total_millis: i64,
    /// phases: milliseconds from the start at the end of each phase, in order.
    #[serde(default)]
    pub phases: Vec<PhaseTiming>,
    /// checkpoints: the checkpoint result of each victim.
    #[serde(default)]
    pub checkpoints: Vec<CheckpointResult>,
}

/// When one phase of a handover ended.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTiming {
    /// phase: plan, intent, reserve, checkpoint, evictAccepted, victimsGone, claimsFreed (DRA
    /// victims only) or ownerBound.
    pub phase: String,
    /// atMillis: milliseconds from the start of the handover.
    pub at_millis: i64,
}

/// The checkpoint result of one victim.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointResult {
    /// pod: `namespace/name` of the victim.
    pub pod: String,
    /// driver: vllm, http or none.
    pub driver: String,
    /// result: Succeeded, Failed, TimedOut, Unsupported or Skipped.
    pub result: String,
    /// millis: how long the checkpoint took.
    pub millis: i64,
    /// message: what went wrong, when something did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

fn default_weight() -> i32 {
    1
}

fn default_budget() -> Duration {
    Duration::from(std::time::Duration::from_secs(3))
}

fn default_victim_grace() -> i64 {
    1
}

fn default_checkpoint_timeout() -> Duration {
    Duration::from(std::time::Duration::from_millis(1500))
}

impl Default for ReclaimPolicy {
    fn default() -> Self {
        Self {
            budget: default_budget(),
            checkpoint: CheckpointPolicy::default(),
            victim_grace_period_seconds: default_victim_grace(),
            min_borrow_duration: None,
        }
    }
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        Self {
            driver: CheckpointDriver::None,
            port: None,
            path: None,
            pause_mode: None,
            timeout: default_checkpoint_timeout(),
        }
    }
}
