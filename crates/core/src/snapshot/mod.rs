//! The snapshot: queues, namespaces, nodes and pods, indexed, with each node's free devices,
//! each queue's ledger and each node's fragmentation kept up to date as pods are added,
//! admitted and removed.
//!
//! The operator describes the whole cluster to a [`kept::KeptSnapshot`] every pass, which
//! brings the last pass's snapshot up to date when only a few pods changed and builds one
//! otherwise, and gives the pass a copy; the simulator keeps one and mutates it. Planning tries removals with [`Snapshot::simulate_removal`] and rolls them back
//! with [`Snapshot::restore`] (Kueue's `SimulateWorkloadRemoval`, Volcano's `Statement`); a
//! snapshot is also `Clone` for a working copy.
//!
//! Devices: Kubernetes does not say which device of a node a pod holds, so the snapshot seats
//! each admitted pod on the lowest-numbered devices that fit, unless the pod names its devices
//! (the simulator does). A pod pinned to a node that is still full (the owner of a reclaim
//! whose victims are terminating) is recorded as a *deficit* on that node: the node takes no
//! new pods until the deficit is seated, which happens as soon as room is freed.
//!
//! This file holds the indices and the read-only queries (the planners ask through them and
//! never index the tables); `pod_index.rs` is the pod key index; `build.rs` adds objects,
//! `kept.rs` brings a kept snapshot up to date, `seating.rs` keeps devices and ledger in
//! step as pods come and go, `what_if.rs` admits, marks and removes pods (and simulates
//! removals) for planning, and `promised.rs` says what a node owes the owners waiting on it. The per-node device arithmetic is [`crate::devices`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use smallvec::SmallVec;

use crate::devices::{self, Charge, NodeState, NodeView, Request, ResolvedGpu, Seat};
use crate::fragmentation::{ClusterFragmentation, FragIndex, WorkloadMix};
use crate::ids::{ModelId, NodeId, PodId, QueueId, ResourceId};
use crate::ledger::{QueueState, ResourceUsage};
use crate::model::{
    AdmittedAs, DeviceSet, MAX_DEVICES_PER_POOL, Namespace, Node, Pod, PodKey, Queue,
};
use crate::quantity::{Milli, ResourceName};
use crate::termination::Terminations;

use pod_index::PodIndex;

mod build;
pub mod kept;
mod pod_index;
pub(crate) mod promised;
mod seating;
mod what_if;

/// Which queue a pod belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attribution {
    /// Its namespace is claimed by exactly this queue.
    Queue(QueueId),
    /// Its namespace is claimed by several queues: nothing is admitted until that is resolved.
    Conflict {
        namespace: String,
        queues: Vec<String>,
    },
    /// Its namespace is claimed by no queue: the pod is unmanaged and counts as used capacity.
    Unclaimed,
}

/// A problem with one object given to the snapshot; the object is left out or corrected, the
/// rest of the snapshot is usable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("queue {0} is given twice; the second is ignored")]
    DuplicateQueue(String),
    #[error("node {0} is given twice; the second is ignored")]
    DuplicateNode(String),
    #[error(
        "node {node}: {resource} has {devices} devices; at most {MAX_DEVICES_PER_POOL} are supported"
    )]
    TooManyDevices {
        node: String,
        resource: ResourceName,
        devices: u32,
    },
    #[error("pod {0} is given twice; the second is ignored")]
    DuplicatePod(PodKey),
    #[error("pod {pod}: {rule}")]
    InvalidRequest { pod: PodKey, rule: String },
    #[error(
        "pod {pod} is on node {node}, which is not in the snapshot; its quota is counted, its devices are not"
    )]
    UnknownNode { pod: PodKey, node: String },
    #[error(
        "pod {pod} names devices {devices:?} of {resource} on node {node}, which it cannot hold there"
    )]
    BadDevices {
        pod: PodKey,
        node: String,
        resource: ResourceName,
        devices: Vec<u16>,
    },
    #[error("pod {0} is not pending; only pending pods can be admitted")]
    NotPending(PodKey),
    #[error("pod {pod} does not fit on node {node} as placed")]
    DoesNotFit { pod: PodKey, node: String },
    #[error("the snapshot changed since the removal was simulated; restore it first")]
    StaleRemoval,
}

/// A pod's GPU requests, resolved (one, nearly always): inline, so a copy allocates nothing.
pub(crate) type SlotGpus = SmallVec<[ResolvedGpu; 1]>;

/// A pod's requested amount per resource, inline like [`SlotGpus`].
pub(crate) type SlotAmounts = SmallVec<[(ResourceId, Milli); 1]>;

#[derive(Clone, Debug)]
pub(crate) struct PodSlot {
    /// Shared with whoever gave it (the operator keeps each pod's model from pass to pass):
    /// a pass copies a pointer, not the pod, and only a pod this snapshot changes is copied.
    pub pod: Arc<Pod>,
    pub attribution: Attribution,
    pub gpus: SlotGpus,
    /// Requested amount per resource (for the ledger).
    pub amounts: SlotAmounts,
    pub seat: Option<Seat>,
    pub admitted_as: Option<AdmittedAs>,
}

/// The snapshot's indices, copied every admission pass and rebuilt often: hashed with foldhash (seeded per map,
/// like std's), since SipHash of every pod's key and node name was an eighth of the operator's
/// time in a pass at 10,000 pods.
pub(crate) type Index<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The key of the pod in slot `id`, for the pod index (a function of the slots alone, so the
/// index can be changed while they are read).
fn slot_key(pods: &[Option<PodSlot>], id: PodId) -> Option<&PodKey> {
    pods.get(id.index())
        .and_then(Option::as_ref)
        .map(|slot| &slot.pod.key)
}

/// Removed pods that [`Snapshot::restore`] puts back exactly.
#[derive(Debug)]
#[must_use = "a simulated removal must be restored"]
pub struct Removal {
    generation: u64,
    slots: Vec<(PodId, PodSlot)>,
}

/// Collects the objects of a snapshot; [`SnapshotBuilder::build`] indexes them in a
/// deterministic order (whatever order they were given in).
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    queues: Vec<Queue>,
    namespaces: Vec<Namespace>,
    nodes: Vec<Arc<Node>>,
    pods: Vec<Arc<Pod>>,
    mix: Option<WorkloadMix>,
    /// The mix is the pods', with this popularity cut.
    mix_of_pods: Option<f64>,
    reclaimed_from: Vec<(String, Timestamp)>,
}

/// The cluster as the policy sees it. See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    resources: Vec<ResourceName>,
    resource_ids: Index<ResourceName, ResourceId>,
    models: Vec<String>,
    model_ids: Index<String, ModelId>,
    nodes: Vec<NodeState>,
    node_ids: Index<String, NodeId>,
    hostnames: Index<String, NodeId>,
    pods: Vec<Option<PodSlot>>,
    pod_ids: PodIndex,
    queues: Vec<QueueState>,
    queue_ids: Index<String, QueueId>,
    namespaces: BTreeMap<String, Namespace>,
    /// Namespace → claiming queues (more than one is a conflict).
    claims: BTreeMap<String, Vec<QueueId>>,
    /// Device capacity per resource, milli.
    capacity: Vec<Milli>,
    /// Held by admitted pods of no queue, per resource.
    unmanaged: Vec<Milli>,
    mix: Option<WorkloadMix>,
    frag: Option<FragIndex>,
    /// The same mix per copy ([`WorkloadMix::per_copy`]), which ours ranks by in a mix heavy
    /// in multi-GPU tasks.
    frag_per_copy: Option<FragIndex>,
    reclaimed_from: Index<QueueId, Timestamp>,
    /// Victim terminations observed per node, which the reclaim budget plans with.
    terminations: Terminations,
    /// Whether what the snapshot shows may be behind the cluster ([`Snapshot::set_behind`]).
    behind: bool,
    generation: u64,
    build_notes: Vec<SnapshotError>,
}

impl Snapshot {
    pub fn builder() -> SnapshotBuilder {
        SnapshotBuilder::default()
    }

    /// The id of a resource name, if any node, queue or pod of the snapshot names it.
    pub fn resource_id(&self, name: &ResourceName) -> Option<ResourceId> {
        self.resource_ids.get(name).copied()
    }

    pub fn resource_name(&self, id: ResourceId) -> &ResourceName {
        &self.resources[id.index()]
    }

    /// Every resource name the snapshot knows, by id.
    pub fn resources(&self) -> &[ResourceName] {
        &self.resources
    }

    /// The queue a pod of `namespace` belongs to.
    pub fn attribution(&self, namespace: &str) -> Attribution {
        match self.claims.get(namespace).map(Vec::as_slice) {
            Some([queue]) => Attribution::Queue(*queue),
            Some(queues) if queues.len() > 1 => Attribution::Conflict {
                namespace: namespace.to_string(),
                queues: queues
                    .iter()
                    .map(|q| self.queues[q.index()].queue.name.clone())
                    .collect(),
            },
            _ => Attribution::Unclaimed,
        }
    }

    pub fn queue_id(&self, name: &str) -> Option<QueueId> {
        self.queue_ids.get(name).copied()
    }

    pub fn queue(&self, id: QueueId) -> &Queue {
        &self.queues[id.index()].queue
    }

    /// Every queue id, in name order.
    pub fn queue_ids(&self) -> impl Iterator<Item = QueueId> + '_ {
        (0..self.queues.len()).map(QueueId::at)
    }

    /// A queue's ledger: one entry per resource its spec lists or its pods use.
    pub fn usage(&self, id: QueueId) -> &[ResourceUsage] {
        &self.queues[id.index()].usage
    }

    /// A queue's ledger entry for one resource.
    pub fn usage_of(&self, id: QueueId, resource: ResourceId) -> Option<&ResourceUsage> {
        self.queues[id.index()].usage(resource)
    }

    /// Namespaces this queue claims that other queues claim too, with those queues.
    pub fn namespace_conflicts(&self, id: QueueId) -> &[(String, Vec<String>)] {
        &self.queues[id.index()].conflicts
    }

    /// Admitted and pending pod counts of a queue.
    pub fn pod_counts(&self, id: QueueId) -> (u32, u32) {
        let q = &self.queues[id.index()];
        (q.admitted_pods, q.pending_pods)
    }

    /// The borrower pods of a queue (see [`crate::ledger`]).
    pub fn borrowers(&self, id: QueueId) -> Vec<PodId> {
        self.queues[id.index()]
            .borrowers(|pod| self.slot(pod).map_or(&[], |s| s.amounts.as_slice()))
    }

    /// The reclaim victims of a queue, not evicted yet, each with whether it still lies in its
    /// borrowed part (see [`crate::reclaim::pending_victims`]).
    pub(crate) fn judge_victims(&self, id: QueueId) -> Vec<(PodId, bool)> {
        self.queues[id.index()].judge_victims(
            |pod| self.slot(pod).map_or(&[], |s| s.amounts.as_slice()),
            |pod| self.slot(pod).is_some_and(|s| s.pod.is_reclaim_victim()),
        )
    }

    /// The queue's weighted share of capacity held above its guarantee.
    pub fn borrowing_share(&self, id: QueueId) -> f64 {
        self.queues[id.index()].borrowing_share(|r| self.capacity(r))
    }

    /// When a reclaim last took GPUs from this queue.
    pub fn last_reclaimed(&self, id: QueueId) -> Option<Timestamp> {
        self.reclaimed_from.get(&id).copied()
    }

    /// The victim terminations observed per node (none unless set).
    pub fn terminations(&self) -> &Terminations {
        &self.terminations
    }

    /// Hands the planner the victim terminations observed so far (the operator keeps them
    /// across passes; the simulator records into them).
    pub fn set_terminations(&mut self, terminations: Terminations) {
        self.terminations = terminations;
    }

    /// The observed terminations, to record into in place (the simulator).
    pub fn terminations_mut(&mut self) -> &mut Terminations {
        &mut self.terminations
    }

    /// Says whether what the snapshot was read from may be behind the cluster (one of the
    /// operator's watches is listing afresh after an error). A snapshot that is behind still
    /// admits, which takes nobody's GPUs, but disrupts nobody: no reclaim is planned
    /// ([`NoPlan::ViewBehind`](crate::reclaim::NoPlan::ViewBehind)) and no bypassing pod is chosen
    /// for eviction ([`crate::enforcement::enforce`]).
    pub fn set_behind(&mut self, behind: bool) {
        self.behind = behind;
    }

    /// Whether the snapshot may be behind the cluster ([`Snapshot::set_behind`]).
    pub fn is_behind(&self) -> bool {
        self.behind
    }

    // ---- capacity ----------------------------------------------------------------------

    /// Device capacity of a resource over all nodes, milli.
    pub fn capacity(&self, resource: ResourceId) -> Milli {
        self.capacity
            .get(resource.index())
            .copied()
            .unwrap_or_default()
    }

    /// Held by admitted pods that belong to no queue (unclaimed or conflicting namespaces).
    pub fn unmanaged(&self, resource: ResourceId) -> Milli {
        self.unmanaged
            .get(resource.index())
            .copied()
            .unwrap_or_default()
    }

    /// Held by all admitted pods, queued or not.
    pub fn allocated(&self, resource: ResourceId) -> Milli {
        self.unmanaged(resource)
            + self
                .queues
                .iter()
                .filter_map(|q| q.usage(resource))
                .map(|u| u.allocated)
                .sum()
    }

    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.node_ids.get(name).copied()
    }

    /// A node by the value pods are pinned with (its name or hostname label).
    pub fn node_by_pin(&self, pin: &str) -> Option<NodeId> {
        self.node_id(pin)
            .or_else(|| self.hostnames.get(pin).copied())
    }

    pub fn node(&self, id: NodeId) -> &Node {
        self.nodes[id.index()].node()
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Every node id, in name order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes.len()).map(NodeId::at)
    }

    /// The node's current free devices, CPU and memory.
    pub fn node_view(&self, id: NodeId) -> NodeView<'_> {
        self.nodes[id.index()].view()
    }

    /// Pods seated (or pinned with a deficit) on a node.
    pub fn pods_on(&self, id: NodeId) -> impl Iterator<Item = PodId> + '_ {
        let n = &self.nodes[id.index()];
        n.pods().iter().chain(n.deficit()).copied()
    }

    /// Whether the node carries pinned pods it has no room for yet (a reclaim in progress).
    pub fn is_oversubscribed(&self, id: NodeId) -> bool {
        self.nodes[id.index()].is_oversubscribed()
    }

    /// Whether reclaim owners pinned on the node wait for room or for kube-scheduler: the node
    /// takes no borrower until every one of them is bound.
    pub fn is_closed_to_borrowers(&self, id: NodeId) -> bool {
        self.nodes[id.index()].is_closed_to_borrowers()
    }

    pub fn workload_mix(&self) -> Option<&WorkloadMix> {
        self.mix.as_ref()
    }

    /// `F_n` of one node, milli (0 without a workload mix).
    pub fn node_fragmentation(&self, id: NodeId) -> f64 {
        self.nodes[id.index()].fragmentation()
    }

    /// Cluster fragmentation: `Σ_n F_n` with capacity and idle capacity.
    pub fn fragmentation(&self) -> ClusterFragmentation {
        let mut report = ClusterFragmentation {
            capacity_milli: 0,
            idle_milli: 0,
            fragmented_milli: 0.0,
        };
        for n in &self.nodes {
            report.capacity_milli += n.capacity_milli();
            if !n.is_oversubscribed() {
                report.idle_milli += n.idle_milli();
                report.fragmented_milli += n.fragmentation();
            }
        }
        report
    }

    // ---- pods --------------------------------------------------------------------------

    pub fn pod_id(&self, key: &PodKey) -> Option<PodId> {
        self.pod_ids.get(|id| slot_key(&self.pods, id), key)
    }

    pub(crate) fn slot(&self, id: PodId) -> Option<&PodSlot> {
        self.pods.get(id.index()).and_then(Option::as_ref)
    }

    /// The pods here that share a DRA claim `pod` is charged for ([`Pod::claim_sharers`]).
    pub(crate) fn claim_sharers_of(&self, pod: PodId) -> impl Iterator<Item = PodId> + '_ {
        self.slot(pod)
            .into_iter()
            .flat_map(|slot| &slot.pod.claim_sharers)
            .filter_map(|key| self.pod_id(key))
    }

    /// A pod; `None` once removed.
    pub fn pod(&self, id: PodId) -> Option<&Pod> {
        self.slot(id).map(|s| &*s.pod)
    }

    /// The queue of a pod, if exactly one claims it.
    pub fn pod_queue(&self, id: PodId) -> Option<QueueId> {
        match self.slot(id)?.attribution {
            Attribution::Queue(q) => Some(q),
            _ => None,
        }
    }

    /// The node an admitted pod is seated or pinned on.
    pub fn pod_node(&self, id: PodId) -> Option<NodeId> {
        self.slot(id)?.seat.as_ref().map(|s| s.node)
    }

    /// The devices an admitted pod holds, by resource.
    pub fn pod_devices(&self, id: PodId) -> Vec<DeviceSet> {
        let Some(slot) = self.slot(id) else {
            return Vec::new();
        };
        let Some(seat) = &slot.seat else {
            return Vec::new();
        };
        self.device_sets(seat.node, &seat.charges)
    }

    /// What an admitted pod holds of each resource's devices, in milli of a device: a shared
    /// device counts the pod's share (a time-sliced replica 1000/replicas), not its request.
    pub fn pod_held_milli(&self, id: PodId) -> Vec<(ResourceName, Milli)> {
        let Some(seat) = self.slot(id).and_then(|slot| slot.seat.as_ref()) else {
            return Vec::new();
        };
        let node = &self.nodes[seat.node.index()];
        let mut held: Vec<(ResourceName, Milli)> = Vec::new();
        for charge in &seat.charges {
            let Some((resource, _)) = node.local_devices(std::slice::from_ref(charge)).next()
            else {
                continue;
            };
            let resource = self.resource_name(resource);
            let milli = Milli(u64::from(charge.milli));
            match held.iter_mut().find(|(r, _)| r == resource) {
                Some((_, total)) => total.0 += milli.0,
                None => held.push((resource.clone(), milli)),
            }
        }
        held
    }

    pub(crate) fn device_sets(&self, node: NodeId, charges: &[Charge]) -> Vec<DeviceSet> {
        devices::device_sets(&self.nodes[node.index()], charges, |r| {
            self.resource_name(r).clone()
        })
    }

    /// The quota a pod was admitted against, when this snapshot admitted it.
    pub fn admitted_as(&self, id: PodId) -> Option<AdmittedAs> {
        self.slot(id)?.admitted_as
    }

    /// Every pod id, in insertion order.
    pub fn pod_ids(&self) -> impl Iterator<Item = PodId> + '_ {
        self.pods
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| PodId::at(i))
    }

    /// Pods waiting at the gate.
    pub fn pending_pods(&self) -> impl Iterator<Item = PodId> + '_ {
        self.pod_ids()
            .filter(|id| self.pod(*id).is_some_and(|p| !p.is_admitted()))
    }

    // ---- for the planners ----------------------------------------------------------------

    /// A node's devices, for the planners' arithmetic.
    pub(crate) fn node_state(&self, id: NodeId) -> &NodeState {
        &self.nodes[id.index()]
    }

    /// Every node with its id, in name order.
    pub(crate) fn node_states(&self) -> impl Iterator<Item = (NodeId, &NodeState)> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (NodeId::at(i), n))
    }

    /// The fragmentation measure of the workload mix, when one is set.
    pub(crate) fn frag_index(&self) -> Option<&FragIndex> {
        self.frag.as_ref()
    }

    /// The fragmentation measure of the workload mix per copy, when one is set.
    pub(crate) fn frag_index_per_copy(&self) -> Option<&FragIndex> {
        self.frag_per_copy.as_ref()
    }

    pub(crate) fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// One more than the highest pod index handed out: the size of a table by pod index.
    pub(crate) fn pod_index_bound(&self) -> usize {
        self.pods.len()
    }

    /// `pod`'s requests resolved for placement; `None` when they are invalid or some
    /// requested resource exists on no node (nothing can fit).
    pub(crate) fn request<'a>(&self, pod: &'a Pod) -> Option<Request<'a>> {
        devices::validate_requests(&pod.requests).ok()?;
        let mut gpus = Vec::new();
        for g in &pod.requests.gpus {
            gpus.push(ResolvedGpu::new(self.resource_id(&g.resource)?, g)?);
        }
        let models = (!pod.gpu_models.is_empty()).then(|| {
            let mut allowed = vec![false; self.models.len()];
            for m in &pod.gpu_models {
                if let Some(id) = self.model_ids.get(m) {
                    allowed[id.index()] = true;
                }
            }
            allowed
        });
        Some(Request::new(pod, gpus, models))
    }
}
