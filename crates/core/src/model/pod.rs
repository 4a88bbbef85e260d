//! A pod as the policy sees it: what it requests, which nodes it may use, whether it waits at
//! the gate or holds quota, and the hints reclaim orders victims by.

use std::{collections::BTreeMap, fmt, sync::Arc};

use gpuqueue_api::{ADMISSION_GATE, annotations, node_labels};
use jiff::Timestamp;
use k8s_openapi::api::core::v1 as k8s;

use super::converted::Converted;
use super::node::{HOSTNAME_LABEL, MAX_DEVICES_PER_POOL};
use super::selector::{NodeRules, Operator};
use crate::quantity::{
    DEVICE_CLASS_PREFIX, MILLI_PER_DEVICE, Milli, ResourceName, is_device_part, is_gpu_resource,
    may_be_device_class, parse_bytes, parse_device_count, parse_milli,
};

/// `namespace/name` of a pod: unique in a snapshot, and the last tie-breaker of every ordering.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl PodKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How much memory of each device a request takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceMemory {
    /// What the device gives with the unit asked for: all of a whole device or MIG slice,
    /// `milli/1000` of a fractional share, `1/replicas` of a time-sliced replica, all of a HAMi
    /// device (HAMi's default when no memory is asked).
    #[default]
    Share,
    /// This many MiB (HAMi's `nvidia.com/gpumem`; a DRA claim's memory capacity request).
    Mib(u64),
    /// This percentage of the device's memory (HAMi's `nvidia.com/gpumem-percentage`).
    Percent(u32),
}

/// A request for devices of one GPU resource: the pod demand that whole GPUs, MIG slices,
/// shared replicas, HAMi virtual GPUs and DRA claims (mapped to a quota resource) all map onto.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuRequest {
    pub resource: ResourceName,
    /// Number of devices (schedulable units: replicas of a shared GPU, HAMi virtual GPUs).
    pub count: u32,
    /// Milli-units used on each device: 1000 for whole devices, less for a shared GPU (only
    /// with `count == 1`).
    pub milli_per_device: u32,
    /// Memory taken on each device.
    pub memory: DeviceMemory,
    /// Compute taken on each device, percent (HAMi's `nvidia.com/gpucores`); `None`: the
    /// unit's own share of the device.
    pub cores_percent: Option<u32>,
}

impl GpuRequest {
    /// `count` whole devices.
    pub fn devices(resource: impl Into<ResourceName>, count: u32) -> Self {
        Self {
            resource: resource.into(),
            count,
            milli_per_device: MILLI_PER_DEVICE,
            memory: DeviceMemory::Share,
            cores_percent: None,
        }
    }

    /// A share of one device (`milli` < 1000), as GPU-sharing tasks of the Alibaba trace use.
    pub fn shared(resource: impl Into<ResourceName>, milli: u32) -> Self {
        Self {
            milli_per_device: milli,
            ..Self::devices(resource, 1)
        }
    }

    /// The same request with this memory on each device.
    #[must_use]
    pub fn with_memory(mut self, memory: DeviceMemory) -> Self {
        self.memory = memory;
        self
    }

    /// The same request with this compute on each device, percent.
    #[must_use]
    pub fn with_cores(mut self, percent: u32) -> Self {
        self.cores_percent = Some(percent);
        self
    }

    /// The quota this request is charged: devices × milli per device.
    pub fn total(&self) -> Milli {
        Milli(u64::from(self.count) * u64::from(self.milli_per_device))
    }
}

/// What a pod requests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    pub cpu_milli: u64,
    pub memory_bytes: u64,
    /// One entry per GPU resource, sorted by resource name.
    pub gpus: Vec<GpuRequest>,
    /// Charged to the queue's quota, not placed on a node: devices kube-scheduler may allocate
    /// instead of those in `gpus`, the other alternatives of a DRA `firstAvailable` request
    /// not allocated yet ([`super::dra::ClaimCharge::quota_only`]). Sorted like `gpus`.
    pub quota_only: Vec<GpuRequest>,
}

impl Requests {
    /// The amount of `resource` requested.
    pub fn of(&self, resource: &ResourceName) -> Milli {
        self.gpus
            .iter()
            .filter(|g| &g.resource == resource)
            .map(GpuRequest::total)
            .sum()
    }
}

/// Where a pod stands with the gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodState {
    /// Held at the gate `gpuqueue.io/admission`: waits for admission and holds no quota.
    Pending,
    /// Past the gate (or never gated): holds quota, and capacity on its node when known.
    Admitted(Assignment),
}

/// The node of an admitted pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// The node it is bound to, or pinned to (a node name or hostname label value); `None`
    /// when neither is known yet.
    pub node: Option<String>,
    /// Bound by kube-scheduler (`spec.nodeName` set).
    pub bound: bool,
    /// Being deleted; it holds its GPUs until it is gone.
    pub terminating: bool,
}

/// Which devices of a node a pod holds, for one resource.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceSet {
    pub resource: ResourceName,
    /// Device indices within the node's pool of `resource`.
    pub devices: Vec<u16>,
}

/// The quota a pod was admitted against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdmittedAs {
    /// Within its queue's guaranteed quota.
    Guaranteed,
    /// Above guaranteed, from idle capacity: reclaimable.
    Borrowed,
}

impl AdmittedAs {
    /// The value of the `gpuqueue.io/admitted-as` annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "guaranteed",
            Self::Borrowed => "borrowed",
        }
    }
}

impl fmt::Display for AdmittedAs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pod's part in a reclaim that is under way (from its reclaim annotations).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReclaimMark {
    pub id: String,
    pub role: ReclaimRole,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReclaimRole {
    /// The pod the GPUs are freed for.
    Owner,
    /// A pod being checkpointed and evicted.
    Victim,
}

/// A GPU pod.
#[derive(Clone, Debug, PartialEq)]
pub struct Pod {
    pub key: PodKey,
    /// Its `metadata.uid`, when it has one (the simulator's pods do not): a pod deleted and
    /// created again under its name is another pod, and a decision made for one must not be
    /// applied to the other.
    pub uid: Option<String>,
    pub requests: Requests,
    /// GPU models the pod may run on; empty: any.
    pub gpu_models: Vec<String>,
    /// Node selector, required affinity and tolerations; `None`: no rules. Shared: the operator
    /// copies each pod's model into every pass's snapshot.
    pub node_rules: Option<Arc<NodeRules>>,
    pub priority: i32,
    /// kube-scheduler may preempt lower-priority pods for it (`spec.preemptionPolicy` is not
    /// `Never`).
    pub preempts: bool,
    pub state: PodState,
    pub created_at: Timestamp,
    /// When the gate was released (the `gpuqueue.io/admitted-at` annotation).
    pub admitted_at: Option<Timestamp>,
    /// When its containers started (`status.startTime`).
    pub started_at: Option<Timestamp>,
    /// A user's hint of how much work a checkpoint of this pod saves: bigger is evicted later.
    pub checkpoint_cost: u64,
    pub reclaim: Option<ReclaimMark>,
    /// Devices it holds, when known (the simulator knows; Kubernetes does not say, and the
    /// snapshot assigns devices itself, but for HAMi's: see `sharing::seat_hami_pods`).
    pub devices: Vec<DeviceSet>,
    /// The UUIDs of the devices HAMi says it gave the pod (`hami.io/vgpu-devices-allocated`).
    pub hami_devices: Vec<String>,
    /// Capacity held for a pod admitted at creation that the pod store has not shown yet.
    /// Such a pod may never exist (its creation can fail after admission), so it is never a
    /// reclaim victim: there is nothing to evict.
    pub reserved_unseen: bool,
    /// Holds (or may hold) capacity with no record of gpuqueue's admission: neither
    /// `gpuqueue.io/admitted-at` nor `gpuqueue.io/admitted-at-creation` (created while the
    /// webhook was down, before the queue existed, or ungated by hand). Charged to its queue
    /// like any admitted pod, but the first to go: see [`crate::enforcement`].
    pub unadmitted: bool,
    /// Since when kube-scheduler reports it cannot bind the pod (`PodScheduled=False`, reason
    /// `Unschedulable`): see [`crate::pins`].
    pub unschedulable_since: Option<Timestamp>,
    /// The other admitted pods using a DRA claim this pod is charged for
    /// ([`super::dra::claim_sharers`]): the claim's devices stay allocated while any of them
    /// is there, so this pod leaving frees none of them.
    pub claim_sharers: Vec<PodKey>,
    /// Extended resources a DeviceClass may back (KEP-5004), with the pod's effective count,
    /// sorted by name: not in `requests` until the class store says what they charge
    /// ([`super::dra::extended_charge`]).
    pub extended: Vec<(ResourceName, u64)>,
}

/// A pod that cannot be modelled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: {field}: {rule}")]
pub struct PodError {
    pub pod: String,
    pub field: String,
    pub rule: String,
}

/// Where gpuqueue's scheduling gate sits in the pod's `spec.schedulingGates`, if it waits there.
/// The gate test the core, the operator, the webhook and the CLI share.
pub fn gate_index(pod: &k8s::Pod) -> Option<usize> {
    pod.spec
        .as_ref()?
        .scheduling_gates
        .as_ref()?
        .iter()
        .position(|gate| gate.name == ADMISSION_GATE)
}

/// Whether the pod's containers have all ended for good (phase `Succeeded` or `Failed`): it holds
/// no devices any more, even while its object stays (finalizers, or the kubelet's delete still
/// to come). kube-scheduler and the kubelet's device manager give its room away from then on.
pub fn has_finished(pod: &k8s::Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// Whether the pod waits at gpuqueue's scheduling gate.
pub fn is_gated(pod: &k8s::Pod) -> bool {
    gate_index(pod).is_some()
}

/// Whether the pod is a reclaim's owner held at the gate until its victims are gone: marked as
/// the owner of a named reclaim, admitted and pinned, but still gated
/// (`crate::reclaim::ReclaimPlan`). It holds its quota and its room on the
/// pinned node like a released owner. The reclaim's name is required: it is what the operator
/// checks against its queue's record, so a mark without one, written by anybody else, must
/// not count as an admission.
pub fn is_held_owner(pod: &k8s::Pod) -> bool {
    let notes = pod.metadata.annotations.as_ref();
    let note = |name: &str| notes.and_then(|a| a.get(name));
    let pinned = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .is_some_and(|s| s.contains_key(HOSTNAME_LABEL));
    is_gated(pod)
        && pinned
        && note(annotations::RECLAIM_ROLE).is_some_and(|r| r == "owner")
        && note(annotations::RECLAIM_ID).is_some_and(|id| !id.is_empty())
        && note(annotations::ADMITTED_AT).is_some()
}

/// Whether the operator keeps the pod: a live pod with a GPU request, DRA claims or an extended
/// resource a DeviceClass may back (the admission pass says whether one does), whether the
/// core can read it or not (one it cannot read is kept so that the pass can say why it waits).
pub fn is_gpu_pod(pod: &k8s::Pod) -> bool {
    !matches!(Pod::from_k8s(pod), Ok(None))
}

impl Pod {
    /// A pending pod (held at the gate) with these requests, created at `created_at`.
    pub fn new(key: PodKey, requests: Requests, created_at: Timestamp) -> Self {
        Self {
            key,
            uid: None,
            requests,
            gpu_models: Vec::new(),
            node_rules: None,
            priority: 0,
            preempts: true,
            state: PodState::Pending,
            created_at,
            admitted_at: None,
            started_at: None,
            checkpoint_cost: 0,
            reclaim: None,
            devices: Vec::new(),
            hami_devices: Vec::new(),
            reserved_unseen: false,
            unadmitted: false,
            unschedulable_since: None,
            claim_sharers: Vec::new(),
            extended: Vec::new(),
        }
    }

    /// Whether the pod holds quota.
    pub fn is_admitted(&self) -> bool {
        matches!(self.state, PodState::Admitted(_))
    }

    /// Whether a reclaim marked it as one of its victims (it is leaving).
    pub fn is_reclaim_victim(&self) -> bool {
        self.reclaim
            .as_ref()
            .is_some_and(|m| m.role == ReclaimRole::Victim)
    }

    /// Whether the pod is on its way out: being deleted, or a reclaim's victim.
    pub fn is_leaving(&self) -> bool {
        self.is_terminating() || self.is_reclaim_victim()
    }

    /// Whether the pod is being deleted (it holds its room until it is gone).
    pub fn is_terminating(&self) -> bool {
        matches!(
            self.state,
            PodState::Admitted(Assignment {
                terminating: true,
                ..
            })
        )
    }

    /// When the pod started doing work that a reclaim would lose: start, admission or creation.
    pub fn running_since(&self) -> Timestamp {
        self.started_at
            .or(self.admitted_at)
            .unwrap_or(self.created_at)
    }

    /// Reads a Kubernetes pod. `Ok(None)` for pods the policy ignores: finished pods and pods
    /// that request no GPU resource, no DRA claim and no extended resource a DeviceClass may
    /// back.
    pub fn from_k8s(pod: &k8s::Pod) -> Result<Option<Converted<Self>>, PodError> {
        let key = PodKey::new(
            pod.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let err = |field: &str, rule: String| PodError {
            pod: key.to_string(),
            field: field.to_string(),
            rule,
        };
        if has_finished(pod) {
            return Ok(None);
        }
        let Some(spec) = pod.spec.as_ref() else {
            return Err(err("spec", "must be set".into()));
        };
        let waits = is_gated(pod) && spec.node_name.is_none() && !is_held_owner(pod);
        let mut warnings = Vec::new();
        let bound = spec.node_name.is_some();
        let ((requests, extended), misread) =
            read_requests(spec, bound, &key, &mut warnings).map_err(|(f, rule)| err(&f, rule))?;
        // Kept without a GPU request too: what claims and classes charge, [`super::dra`] adds.
        if requests.gpus.is_empty() && !uses_resource_claims(spec) && extended.is_empty() {
            return Ok(None);
        }

        let created_at = if let Some(t) = &pod.metadata.creation_timestamp {
            t.0
        } else {
            warnings.push(format!(
                "pod {key}: metadata.creationTimestamp is missing; ordered as the oldest"
            ));
            Timestamp::UNIX_EPOCH
        };
        let hints = Hints::read(&key, pod.metadata.annotations.as_ref(), &mut warnings);

        let node_rules = NodeRules::from_k8s(spec).map_err(|e| err(&e.field, e.rule))?;
        let gpu_models = node_rules.as_ref().map(gpu_models_of).unwrap_or_default();
        let state = if waits {
            PodState::Pending
        } else {
            PodState::Admitted(assignment(pod, spec))
        };
        let is_admitted = matches!(state, PodState::Admitted(_));
        Ok(Some(Converted {
            value: Self {
                key,
                uid: pod.metadata.uid.clone(),
                requests,
                gpu_models,
                node_rules: node_rules.map(Arc::new),
                priority: spec.priority.unwrap_or(0),
                preempts: spec.preemption_policy.as_deref() != Some("Never"),
                state,
                created_at,
                admitted_at: hints.admitted_at,
                started_at: started_at(pod),
                checkpoint_cost: hints.checkpoint_cost,
                reclaim: hints.reclaim,
                devices: Vec::new(),
                hami_devices: super::sharing::hami_allocated(pod.metadata.annotations.as_ref()),
                reserved_unseen: false,
                unadmitted: is_admitted && (!hints.admission_recorded || misread),
                unschedulable_since: unschedulable_since(pod),
                // The claim stores say (the operator's `admission::device_claims`).
                claim_sharers: Vec::new(),
                extended,
            },
            warnings,
        }))
    }
}

/// Where a pod past the gate is: its node, bound or pinned.
fn assignment(pod: &k8s::Pod, spec: &k8s::PodSpec) -> Assignment {
    let pinned = spec
        .node_selector
        .as_ref()
        .and_then(|s| s.get(HOSTNAME_LABEL))
        .cloned();
    Assignment {
        bound: spec.node_name.is_some(),
        node: spec.node_name.clone().or(pinned),
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// The pod's requests, and whether they were misread. A pod not bound yet asking what cannot
/// be counted (HAMi's parts: `gpucores: 0`, `gpumem: 0`, both memory forms, a part without
/// `nvidia.com/gpu`) is refused: at the gate it waits saying why, and the webhook and admission
/// at creation, which read it before it is gated, gate it. One `bound` (it slipped in while
/// the webhook was down) holds its devices whatever it asked: it is read leniently, each device
/// whole with all its compute, so that it is charged (and, misread, is unadmitted) rather than
/// left out with its devices looking free.
fn read_requests(
    spec: &k8s::PodSpec,
    bound: bool,
    key: &PodKey,
    warnings: &mut Vec<String>,
) -> Result<(Extended<Requests>, bool), (String, String)> {
    match effective_requests(spec, Reading::Strict) {
        Ok(read) => Ok((read, false)),
        Err(error) if !bound => Err(error),
        Err((field, rule)) => {
            let read = effective_requests(spec, Reading::Lenient)?;
            warnings.push(format!(
                "pod {key}: {field}: {rule}; it is bound, so it is charged each device whole, \
                 with all its compute, as unadmitted"
            ));
            Ok((read, true))
        }
    }
}

/// How HAMi's device parts are read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// As asked, refusing what cannot be counted.
    Strict,
    /// Each device whole, with all its compute, whatever is asked; a part without a device on
    /// one device (HAMi's `nvidia.defaultGPUNum`).
    Lenient,
}

/// Whether the pod uses DRA ResourceClaims (`spec.resourceClaims`).
pub fn uses_resource_claims(spec: &k8s::PodSpec) -> bool {
    spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty())
}

/// Whether the pod asks for devices the core knows without the class store: a GPU resource, a
/// HAMi part, a class's implicit name, or claims. A pod asking only other extended resources
/// (a NIC's, a virtual machine's) is kept in case a class declares one, but is no GPU pod until
/// a pass finds that one does.
pub fn asks_known_devices(pod: &k8s::Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let known = |name: &String| {
        is_gpu_resource(name) || is_device_part(name) || name.starts_with(DEVICE_CLASS_PREFIX)
    };
    let asks = |c: &k8s::Container| {
        c.resources.as_ref().is_some_and(|r| {
            r.requests
                .iter()
                .chain(r.limits.iter())
                .flat_map(|m| m.keys())
                .any(known)
        })
    };
    uses_resource_claims(spec)
        || spec.containers.iter().any(asks)
        || spec.init_containers.iter().flatten().any(asks)
}

/// When the kubelet started the pod (`status.startTime`).
fn started_at(pod: &k8s::Pod) -> Option<Timestamp> {
    pod.status.as_ref()?.start_time.as_ref().map(|t| t.0)
}

/// When kube-scheduler last said it cannot bind the pod, if that is what it says now.
fn unschedulable_since(pod: &k8s::Pod) -> Option<Timestamp> {
    let condition = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")?;
    if condition.status != "False" || condition.reason.as_deref() != Some("Unschedulable") {
        return None;
    }
    condition.last_transition_time.as_ref().map(|t| t.0)
}

/// What the operator's annotations on a pod say.
struct Hints {
    /// Either admission annotation is there (its value may still be malformed).
    admission_recorded: bool,
    admitted_at: Option<Timestamp>,
    checkpoint_cost: u64,
    reclaim: Option<ReclaimMark>,
}

impl Hints {
    /// Reads the annotations; a malformed one is reported in `warnings` and ignored.
    fn read(
        key: &PodKey,
        notes: Option<&BTreeMap<String, String>>,
        warnings: &mut Vec<String>,
    ) -> Self {
        let note = |name: &str| notes.and_then(|a| a.get(name)).map(String::as_str);
        let admitted_at =
            note(annotations::ADMITTED_AT).and_then(|v| match v.parse::<Timestamp>() {
                Ok(t) => Some(t),
                Err(e) => {
                    warnings.push(format!(
                        "pod {key}: annotation {}={v:?} is not an RFC 3339 time: {e}",
                        annotations::ADMITTED_AT
                    ));
                    None
                }
            });
        let checkpoint_cost =
            note(annotations::CHECKPOINT_COST).map_or(0, |v| match v.parse::<u64>() {
                Ok(cost) if cost > annotations::CHECKPOINT_COST_MAX => {
                    warnings.push(format!(
                        "pod {key}: annotation {}={v:?} is above {}; read as {1}",
                        annotations::CHECKPOINT_COST,
                        annotations::CHECKPOINT_COST_MAX
                    ));
                    annotations::CHECKPOINT_COST_MAX
                }
                Ok(cost) => cost,
                Err(_) => {
                    warnings.push(format!(
                        "pod {key}: annotation {}={v:?} is not a whole number; treated as 0",
                        annotations::CHECKPOINT_COST
                    ));
                    0
                }
            });
        let role = match note(annotations::RECLAIM_ROLE) {
            Some("owner") => Some(ReclaimRole::Owner),
            Some("victim") => Some(ReclaimRole::Victim),
            _ => None,
        };
        let reclaim = match (note(annotations::RECLAIM_ID), role) {
            (Some(id), Some(role)) => Some(ReclaimMark {
                id: id.to_string(),
                role,
            }),
            (None, None) if note(annotations::RECLAIM_ROLE).is_none() => None,
            (id, _) => {
                warnings.push(format!(
                    "pod {key}: reclaim annotations are incomplete or unknown ({}={id:?}, {}={:?}); ignored",
                    annotations::RECLAIM_ID,
                    annotations::RECLAIM_ROLE,
                    note(annotations::RECLAIM_ROLE)
                ));
                None
            }
        };
        Self {
            admission_recorded: note(annotations::ADMITTED_AT).is_some()
                || note(annotations::ADMITTED_AT_CREATION).is_some(),
            admitted_at,
            checkpoint_cost,
            reclaim,
        }
    }
}

/// GPU models a pod's node rules allow, from the `nvidia.com/gpu.product` label: the node
/// selector's value, or the union over affinity terms when every term names models.
fn gpu_models_of(rules: &NodeRules) -> Vec<String> {
    if let Some(model) = rules.node_selector.get(node_labels::GPU_PRODUCT) {
        return vec![model.clone()];
    }
    let mut models = Vec::new();
    for term in &rules.affinity_terms {
        let named = term
            .labels
            .iter()
            .find(|r| r.key == node_labels::GPU_PRODUCT && r.operator == Operator::In);
        match named {
            Some(r) => models.extend(r.values.iter().cloned()),
            None => return Vec::new(),
        }
    }
    models.sort();
    models.dedup();
    models
}

/// What a container asks of each `nvidia.com/gpu` device it gets (HAMi's resources).
#[derive(Default, Clone, Copy, PartialEq, Eq)]
struct DevicePart {
    memory: DeviceMemory,
    cores: Option<u32>,
}

impl DevicePart {
    /// The larger ask of two containers (a pod's devices are alike: each must fit both). A
    /// container that asks no memory gets all of its device, as HAMi gives it.
    fn max(self, other: Self, field: &str) -> Result<Self, (String, String)> {
        let memory = match (self.memory, other.memory) {
            (DeviceMemory::Share, _) | (_, DeviceMemory::Share) => DeviceMemory::Share,
            (DeviceMemory::Mib(a), DeviceMemory::Mib(b)) => DeviceMemory::Mib(a.max(b)),
            (DeviceMemory::Percent(a), DeviceMemory::Percent(b)) => DeviceMemory::Percent(a.max(b)),
            _ => {
                return Err((
                    field.to_string(),
                    format!(
                        "containers ask for device memory both in MiB ({}) and in percent ({}); use one of them in every container",
                        gpuqueue_api::hami::GPU_MEMORY,
                        gpuqueue_api::hami::GPU_MEMORY_PERCENTAGE
                    ),
                ));
            }
        };
        Ok(Self {
            memory,
            cores: self.cores.max(other.cores),
        })
    }
}

/// Amounts of one container's resources: (cpu milli, memory bytes, devices by name (GPUs, and
/// what a DeviceClass may back), and what it asks of each `nvidia.com/gpu` device).
#[derive(Default, Clone)]
struct Amounts {
    cpu: u64,
    memory: u64,
    gpus: Vec<(String, u64)>,
    part: DevicePart,
}

impl Amounts {
    fn add(&mut self, other: &Self) {
        self.cpu = self.cpu.saturating_add(other.cpu);
        self.memory = self.memory.saturating_add(other.memory);
        for (name, n) in &other.gpus {
            match self.gpus.iter_mut().find(|(m, _)| m == name) {
                Some((_, m)) => *m = m.saturating_add(*n),
                None => self.gpus.push((name.clone(), *n)),
            }
        }
    }

    fn max(&mut self, other: &Self) {
        self.cpu = self.cpu.max(other.cpu);
        self.memory = self.memory.max(other.memory);
        for (name, n) in &other.gpus {
            match self.gpus.iter_mut().find(|(m, _)| m == name) {
                Some((_, m)) => *m = (*m).max(*n),
                None => self.gpus.push((name.clone(), *n)),
            }
        }
    }
}

/// Reads HAMi's `nvidia.com/gpumem`, `nvidia.com/gpumem-percentage` or `nvidia.com/gpucores`
/// into `part`: whole numbers, percentages at most 100.
fn read_part(name: &str, value: &str, part: &mut DevicePart) -> Result<(), String> {
    use gpuqueue_api::hami;
    let n = parse_device_count(value).map_err(|e| e.to_string())?;
    let percent = |what: &str| {
        u32::try_from(n)
            .ok()
            .filter(|p| (1..=100).contains(p))
            .ok_or_else(|| format!("{n} is not a percentage of the device's {what} from 1 to 100"))
    };
    match name {
        hami::GPU_MEMORY if n == 0 => {
            return Err(format!(
                "0 MiB of device memory; leave {name} out to take the whole device's memory"
            ));
        }
        hami::GPU_MEMORY => part.memory = DeviceMemory::Mib(n),
        hami::GPU_MEMORY_PERCENTAGE => part.memory = DeviceMemory::Percent(percent("memory")?),
        // HAMi does not limit a pod asking 0% (HAMi-core's rate limiter stands aside): it may
        // take the whole device's compute, which 0 would not charge against `gpuCores`.
        _ if n == 0 => {
            return Err(format!(
                "0% of the device's compute, which HAMi does not limit; ask 1 to 100, or leave \
                 {name} out"
            ));
        }
        _ => part.cores = Some(percent("compute")?),
    }
    Ok(())
}

fn container_amounts(
    c: &k8s::Container,
    field: &str,
    reading: Reading,
) -> Result<Amounts, (String, String)> {
    let resources = c.resources.as_ref();
    let requests = resources.and_then(|r| r.requests.as_ref());
    let limits = resources.and_then(|r| r.limits.as_ref());
    let mut names: Vec<&String> = requests
        .into_iter()
        .chain(limits)
        .flat_map(|m| m.keys())
        .collect();
    names.sort();
    names.dedup();
    let mut amounts = Amounts::default();
    let mut part_names = Vec::new();
    for name in names {
        // Kubernetes defaults a missing request to the limit.
        let Some(q) = requests
            .and_then(|r| r.get(name))
            .or_else(|| limits.and_then(|l| l.get(name)))
        else {
            continue;
        };
        let f = || format!("{field}.resources.requests[{name}]");
        match name.as_str() {
            "cpu" => amounts.cpu = parse_milli(&q.0).map_err(|e| (f(), e.to_string()))?,
            "memory" => amounts.memory = parse_bytes(&q.0).map_err(|e| (f(), e.to_string()))?,
            gpu if is_gpu_resource(gpu) || may_be_device_class(gpu) => {
                let n = parse_device_count(&q.0).map_err(|e| (f(), e.to_string()))?;
                if n > 0 {
                    amounts.gpus.push((gpu.to_string(), n));
                }
            }
            part if is_device_part(part) && reading == Reading::Lenient => {
                amounts.part = DevicePart {
                    memory: DeviceMemory::Share,
                    cores: Some(100),
                };
            }
            part if is_device_part(part) => {
                read_part(part, &q.0, &mut amounts.part).map_err(|rule| (f(), rule))?;
                part_names.push(part.to_string());
            }
            _ => {}
        }
    }
    let asks_part = amounts.part != DevicePart::default();
    let no_device = !amounts
        .gpus
        .iter()
        .any(|(name, _)| name == gpuqueue_api::NVIDIA_GPU);
    if reading == Reading::Lenient && asks_part && no_device {
        amounts.gpus.push((gpuqueue_api::NVIDIA_GPU.to_owned(), 1));
    }
    check_part(&amounts, &part_names, field)?;
    Ok(amounts)
}

/// HAMi's memory and compute apply to the container's `nvidia.com/gpu` devices: without
/// them they could not be counted, and asking for memory twice is ambiguous.
fn check_part(amounts: &Amounts, names: &[String], field: &str) -> Result<(), (String, String)> {
    use gpuqueue_api::{NVIDIA_GPU, hami};
    let Some(first) = names.first() else {
        return Ok(());
    };
    let f = |name: &str| format!("{field}.resources.requests[{name}]");
    if !amounts.gpus.iter().any(|(name, _)| name == NVIDIA_GPU) {
        return Err((
            f(first),
            format!(
                "asks for a part of each {NVIDIA_GPU} device, but the container requests no {NVIDIA_GPU}; add {NVIDIA_GPU}: 1 (the number of devices the part is taken on)"
            ),
        ));
    }
    let both = [hami::GPU_MEMORY, hami::GPU_MEMORY_PERCENTAGE];
    if both.iter().all(|b| names.iter().any(|n| n == b)) {
        return Err((
            f(hami::GPU_MEMORY_PERCENTAGE),
            format!(
                "{} and {} both set the device memory; keep one of them",
                hami::GPU_MEMORY,
                hami::GPU_MEMORY_PERCENTAGE
            ),
        ));
    }
    Ok(())
}

/// Folds what a container asks of each `nvidia.com/gpu` device into the pod's ask; a container
/// that gets no such device asks nothing of them.
fn fold_part(
    part: Option<DevicePart>,
    amounts: &Amounts,
    field: &str,
) -> Result<Option<DevicePart>, (String, String)> {
    if !amounts
        .gpus
        .iter()
        .any(|(name, _)| name == gpuqueue_api::NVIDIA_GPU)
    {
        return Ok(part);
    }
    Ok(Some(match part {
        None => amounts.part,
        Some(part) => part.max(amounts.part, field)?,
    }))
}

/// The pod's effective requests as kube-scheduler computes them: the sum over containers (and
/// sidecars), at least the largest init container, plus the pod overhead; and apart, the
/// extended resources a DeviceClass may back.
fn effective_requests(
    spec: &k8s::PodSpec,
    reading: Reading,
) -> Result<Extended<Requests>, (String, String)> {
    let mut total = Amounts::default();
    let mut part = None;
    for (i, c) in spec.containers.iter().enumerate() {
        let field = format!("spec.containers[{i}]");
        let amounts = container_amounts(c, &field, reading)?;
        part = fold_part(part, &amounts, &field)?;
        total.add(&amounts);
    }
    let mut sidecars = Amounts::default();
    let mut init_peak = Amounts::default();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let field = format!("spec.initContainers[{i}]");
        let amounts = container_amounts(c, &field, reading)?;
        part = fold_part(part, &amounts, &field)?;
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars.add(&amounts);
        } else {
            let mut during = sidecars.clone();
            during.add(&amounts);
            init_peak.max(&during);
        }
    }
    total.add(&sidecars);
    total.max(&init_peak);
    for (name, q) in spec.overhead.iter().flatten() {
        let f = || format!("spec.overhead[{name}]");
        match name.as_str() {
            "cpu" => {
                total.cpu = total
                    .cpu
                    .saturating_add(parse_milli(&q.0).map_err(|e| (f(), e.to_string()))?);
            }
            "memory" => {
                total.memory = total
                    .memory
                    .saturating_add(parse_bytes(&q.0).map_err(|e| (f(), e.to_string()))?);
            }
            _ => {}
        }
    }
    let (gpus, extended) = gpu_requests(total.gpus, part)?;
    let requests = Requests {
        cpu_milli: total.cpu,
        memory_bytes: total.memory,
        gpus,
        quota_only: Vec::new(),
    };
    Ok((requests, extended))
}

/// A value and the extended resources a DeviceClass may back, by name, sorted.
type Extended<T> = (T, Vec<(ResourceName, u64)>);

/// The GPU requests of a pod's effective device counts, with `part` on its `nvidia.com/gpu`;
/// and apart, the counts of names a DeviceClass may back (what they charge, and so how many
/// devices is too many, the class store says).
fn gpu_requests(
    devices: Vec<(String, u64)>,
    part: Option<DevicePart>,
) -> Result<Extended<Vec<GpuRequest>>, (String, String)> {
    let mut gpus = Vec::new();
    let mut extended = Vec::new();
    for (name, count) in devices {
        if !is_gpu_resource(&name) {
            extended.push((ResourceName::new(&name), count));
            continue;
        }
        // Refused here, where the field can be named, and not only by the snapshot, which
        // would leave the pod out and so waiting at the gate with no reason given.
        let count = u32::try_from(count)
            .ok()
            .filter(|n| *n <= MAX_DEVICES_PER_POOL)
            .ok_or_else(|| {
                (
                    format!("spec.containers.resources.requests[{name}]"),
                    format!(
                        "{count} devices is more than any node has (at most {MAX_DEVICES_PER_POOL})"
                    ),
                )
            })?;
        let mut gpu = GpuRequest::devices(name.as_str(), count);
        if name == gpuqueue_api::NVIDIA_GPU
            && let Some(part) = part
        {
            gpu.memory = part.memory;
            gpu.cores_percent = part.cores;
        }
        gpus.push(gpu);
    }
    gpus.sort();
    extended.sort();
    Ok((gpus, extended))
}
