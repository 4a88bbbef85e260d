//! The snapshot: queues, namespaces, nodes and pods, indexed, with each node's free devices,
//! each queue's ledger and each node's fragmentation kept up to date as pods are added,
//! admitted and removed.
//!
//! The operator builds one per cycle from its reflector stores; the simulator keeps one and
//! mutates it. Planning tries removals with [`Snapshot::simulate_removal`] and rolls them back
//! with [`Snapshot::restore`] (Kueue's `SimulateWorkloadRemoval`, Volcano's `Statement`); a
//! snapshot is also `Clone` for a working copy.
//!
//! Devices: Kubernetes does not say which device of a node a pod holds, so the snapshot seats
//! each admitted pod on the lowest-numbered devices that fit, unless the pod names its devices
//! (the simulator does). A pod pinned to a node that is still full (the owner of a reclaim
//! whose victims are terminating) is recorded as a *deficit* on that node: the node takes no
//! new pods until the deficit is seated, which happens as soon as room is freed.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;

use crate::fragmentation::{ClusterFragmentation, FragIndex, WorkloadMix};
use crate::ledger::{Protection, QueueState, ResourceUsage};
use crate::model::{
    AdmittedAs, Assignment, DeviceSet, MAX_DEVICES_PER_POOL, Namespace, Node, Pod, PodKey,
    PodState, Queue, ReclaimMark, ReclaimRole, Requests,
};
use crate::placement::{NodeView, Placement};
use crate::quantity::{MILLI_PER_DEVICE, Milli, ResourceName};

/// Index of a GPU resource name in a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceId(pub(crate) u16);

/// Index of a GPU model in a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelId(pub(crate) u16);

/// Index of a node in a snapshot (nodes are ordered by name when built).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub(crate) u32);

/// Index of a pod in a snapshot; stable until the pod is removed, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodId(pub(crate) u32);

/// Index of a queue in a snapshot (queues are ordered by name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueId(pub(crate) u16);

macro_rules! index {
    ($($t:ty),*) => {$(
        impl $t {
            /// The position, for indexing caller-side tables.
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }
    )*};
}
index!(NodeId, PodId, QueueId, ResourceId, ModelId);

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

/// One pool of devices of a node, within the node's flat device array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolLayout {
    pub resource: ResourceId,
    pub start: u16,
    pub len: u16,
    pub memory_mib: Option<u64>,
}

/// Free milli taken from one device (index into the node's flat device array).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Charge {
    pub device: u16,
    pub milli: u16,
}

/// `u64::MAX` host resources mean "not reported": kept far from overflow.
const UNLIMITED: i64 = i64::MAX / 4;

pub(crate) fn host_amount(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(UNLIMITED).min(UNLIMITED)
}

#[derive(Clone, Debug)]
pub(crate) struct NodeState {
    pub node: Node,
    pub model: Option<ModelId>,
    pub layout: Vec<PoolLayout>,
    pub free: Vec<u16>,
    pub cpu_free: i64,
    pub memory_free: i64,
    /// Admitted pods seated here.
    pub pods: Vec<PodId>,
    /// Admitted pods pinned here that hold no devices yet (the node is over-subscribed).
    pub deficit: Vec<PodId>,
    /// Cached `F_n` (0 without a workload mix).
    pub frag: f64,
}

impl NodeState {
    pub fn pool(&self, resource: ResourceId) -> Option<&PoolLayout> {
        self.layout.iter().find(|p| p.resource == resource)
    }

    pub fn view(&self) -> NodeView<'_> {
        NodeView {
            node: &self.node,
            layout: &self.layout,
            free: &self.free,
            cpu_free: self.cpu_free,
            memory_free: self.memory_free,
            model: self.model,
        }
    }

    fn capacity_milli(&self) -> u64 {
        self.free.len() as u64 * u64::from(MILLI_PER_DEVICE)
    }
}

/// A pod's GPU requests resolved to resource ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ResolvedGpu {
    pub resource: ResourceId,
    pub count: u16,
    pub milli: u16,
}

#[derive(Clone, Debug)]
pub(crate) struct Seat {
    pub node: NodeId,
    pub charges: Vec<Charge>,
    /// Pinned here but holding no devices yet.
    pub deficit: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct PodSlot {
    pub pod: Pod,
    pub attribution: Attribution,
    pub gpus: Vec<ResolvedGpu>,
    /// Requested amount per resource (for the ledger).
    pub amounts: Vec<(ResourceId, Milli)>,
    pub seat: Option<Seat>,
    pub admitted_as: Option<AdmittedAs>,
}

/// How [`Snapshot::seat`] places a pod's device charges.
enum SeatMode {
    /// On exactly these devices.
    Exact(Vec<Charge>),
    /// As `Canonical`, else as the node's deficit.
    CanonicalOrDeficit,
    /// As the node's deficit.
    Deficit,
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
    nodes: Vec<Node>,
    pods: Vec<Pod>,
    mix: Option<WorkloadMix>,
    reclaimed_from: Vec<(String, Timestamp)>,
}

impl SnapshotBuilder {
    #[must_use]
    pub fn queue(mut self, queue: Queue) -> Self {
        self.queues.push(queue);
        self
    }

    #[must_use]
    pub fn queues(mut self, queues: impl IntoIterator<Item = Queue>) -> Self {
        self.queues.extend(queues);
        self
    }

    #[must_use]
    pub fn namespace(mut self, namespace: Namespace) -> Self {
        self.namespaces.push(namespace);
        self
    }

    #[must_use]
    pub fn namespaces(mut self, namespaces: impl IntoIterator<Item = Namespace>) -> Self {
        self.namespaces.extend(namespaces);
        self
    }

    #[must_use]
    pub fn node(mut self, node: Node) -> Self {
        self.nodes.push(node);
        self
    }

    #[must_use]
    pub fn nodes(mut self, nodes: impl IntoIterator<Item = Node>) -> Self {
        self.nodes.extend(nodes);
        self
    }

    #[must_use]
    pub fn pod(mut self, pod: Pod) -> Self {
        self.pods.push(pod);
        self
    }

    #[must_use]
    pub fn pods(mut self, pods: impl IntoIterator<Item = Pod>) -> Self {
        self.pods.extend(pods);
        self
    }

    /// The task mix fragmentation is measured against (FGD's typical pods).
    #[must_use]
    pub fn workload_mix(mut self, mix: WorkloadMix) -> Self {
        self.mix = Some(mix);
        self
    }

    /// A reclaim took GPUs from `queue` at `at`: it does not borrow again within its
    /// `minBorrowDuration` (the operator reads this from the queues' handover records).
    #[must_use]
    pub fn reclaimed_from(mut self, queue: impl Into<String>, at: Timestamp) -> Self {
        self.reclaimed_from.push((queue.into(), at));
        self
    }

    /// Indexes everything. Objects that cannot be used are reported and left out; the
    /// snapshot is usable either way.
    pub fn build(mut self) -> (Snapshot, Vec<SnapshotError>) {
        let mut issues = Vec::new();
        let mut snapshot = Snapshot::default();

        self.queues.sort_by(|a, b| a.name.cmp(&b.name));
        for queue in self.queues {
            if snapshot.queue_ids.contains_key(&queue.name) {
                issues.push(SnapshotError::DuplicateQueue(queue.name));
                continue;
            }
            let id = QueueId(u16::try_from(snapshot.queues.len()).unwrap_or(u16::MAX));
            snapshot.queue_ids.insert(queue.name.clone(), id);
            let state = QueueState::new(queue, |r| snapshot.intern_resource(r));
            snapshot.queues.push(state);
        }
        self.namespaces.sort_by(|a, b| a.name.cmp(&b.name));
        self.namespaces.dedup_by(|a, b| a.name == b.name);
        snapshot.namespaces = self
            .namespaces
            .into_iter()
            .map(|n| (n.name.clone(), n))
            .collect();
        snapshot.resolve_claims();

        self.nodes.sort_by(|a, b| a.name.cmp(&b.name));
        for node in self.nodes {
            if let Err(e) = snapshot.add_node(node) {
                issues.push(e);
            }
        }
        for (queue, at) in self.reclaimed_from {
            if let Some(id) = snapshot.queue_ids.get(&queue) {
                let entry = snapshot.reclaimed_from.entry(*id).or_insert(at);
                *entry = (*entry).max(at);
            }
        }
        if let Some(mix) = self.mix {
            snapshot.set_workload_mix(mix);
        }

        // Pods that really hold devices first (bound, oldest first), then pinned ones, so a
        // node over-subscribed by a reclaim's owner records the owner as its deficit.
        self.pods.sort_by(|a, b| {
            let rank = |p: &Pod| match &p.state {
                PodState::Admitted(Assignment { bound: true, .. }) => 0,
                PodState::Admitted(_) => 1,
                PodState::Pending => 2,
            };
            rank(a)
                .cmp(&rank(b))
                .then_with(|| a.running_since().cmp(&b.running_since()))
                .then_with(|| a.key.cmp(&b.key))
        });
        for pod in self.pods {
            match snapshot.add_pod(pod) {
                Ok(_) => {}
                Err(e) => issues.push(e),
            }
        }
        // A pod on a node the snapshot lacks is still counted against its queue.
        issues.append(&mut snapshot.build_notes);
        (snapshot, issues)
    }
}

fn snapshot_intern(
    names: &mut Vec<ResourceName>,
    ids: &mut HashMap<ResourceName, ResourceId>,
    name: &ResourceName,
) -> ResourceId {
    if let Some(id) = ids.get(name) {
        return *id;
    }
    let id = ResourceId(u16::try_from(names.len()).unwrap_or(u16::MAX));
    names.push(name.clone());
    ids.insert(name.clone(), id);
    id
}

/// The cluster as the policy sees it. See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    resources: Vec<ResourceName>,
    resource_ids: HashMap<ResourceName, ResourceId>,
    pub(crate) models: Vec<String>,
    pub(crate) model_ids: HashMap<String, ModelId>,
    pub(crate) nodes: Vec<NodeState>,
    node_ids: HashMap<String, NodeId>,
    hostnames: HashMap<String, NodeId>,
    pub(crate) pods: Vec<Option<PodSlot>>,
    pod_ids: HashMap<PodKey, PodId>,
    pub(crate) queues: Vec<QueueState>,
    queue_ids: HashMap<String, QueueId>,
    namespaces: BTreeMap<String, Namespace>,
    /// Namespace → claiming queues (more than one is a conflict).
    claims: BTreeMap<String, Vec<QueueId>>,
    /// Device capacity per resource, milli.
    capacity: Vec<Milli>,
    /// Held by admitted pods of no queue, per resource.
    unmanaged: Vec<Milli>,
    mix: Option<WorkloadMix>,
    pub(crate) frag: Option<FragIndex>,
    pub(crate) reclaimed_from: HashMap<QueueId, Timestamp>,
    generation: u64,
    build_notes: Vec<SnapshotError>,
}

impl Snapshot {
    pub fn builder() -> SnapshotBuilder {
        SnapshotBuilder::default()
    }

    // ---- interning ---------------------------------------------------------------------

    fn intern_resource(&mut self, name: &ResourceName) -> ResourceId {
        let id = snapshot_intern(&mut self.resources, &mut self.resource_ids, name);
        if self.capacity.len() < self.resources.len() {
            self.capacity.resize(self.resources.len(), Milli::ZERO);
            self.unmanaged.resize(self.resources.len(), Milli::ZERO);
        }
        id
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

    // ---- queues and namespaces ---------------------------------------------------------

    fn resolve_claims(&mut self) {
        let mut claims: BTreeMap<String, Vec<QueueId>> = BTreeMap::new();
        for (i, state) in self.queues.iter().enumerate() {
            let id = QueueId(u16::try_from(i).unwrap_or(u16::MAX));
            for ns in &state.queue.namespaces {
                claims.entry(ns.clone()).or_default().push(id);
            }
            if let Some(selector) = &state.queue.namespace_selector {
                for ns in self.namespaces.values() {
                    if selector.matches(&ns.labels) {
                        claims.entry(ns.name.clone()).or_default().push(id);
                    }
                }
            }
        }
        for ids in claims.values_mut() {
            ids.sort();
            ids.dedup();
        }
        for (ns, ids) in &claims {
            if ids.len() > 1 {
                let names: Vec<String> = ids
                    .iter()
                    .map(|q| self.queues[q.index()].queue.name.clone())
                    .collect();
                for q in ids {
                    let others = names
                        .iter()
                        .filter(|n| **n != self.queues[q.index()].queue.name)
                        .cloned()
                        .collect();
                    self.queues[q.index()].conflicts.push((ns.clone(), others));
                }
            }
        }
        self.claims = claims;
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
        (0..self.queues.len()).map(|i| QueueId(u16::try_from(i).unwrap_or(u16::MAX)))
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

    /// The queue's weighted share of capacity held above its guarantee.
    pub fn borrowing_share(&self, id: QueueId) -> f64 {
        self.queues[id.index()].borrowing_share(|r| self.capacity(r))
    }

    /// When a reclaim last took GPUs from this queue.
    pub fn last_reclaimed(&self, id: QueueId) -> Option<Timestamp> {
        self.reclaimed_from.get(&id).copied()
    }

    /// A reclaim took GPUs from this queue at `at`: it does not borrow again within its
    /// `minBorrowDuration`. The simulator's counterpart of [`SnapshotBuilder::reclaimed_from`],
    /// for a snapshot kept alive across reclaims.
    pub fn record_reclaimed_from(&mut self, id: QueueId, at: Timestamp) {
        let entry = self.reclaimed_from.entry(id).or_insert(at);
        *entry = (*entry).max(at);
        self.generation += 1;
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

    // ---- nodes -------------------------------------------------------------------------

    /// Adds a node (with no pods).
    pub fn add_node(&mut self, node: Node) -> Result<NodeId, SnapshotError> {
        if self.node_ids.contains_key(&node.name) {
            return Err(SnapshotError::DuplicateNode(node.name));
        }
        let mut layout = Vec::new();
        let mut start = 0u16;
        for pool in &node.pools {
            if pool.devices > MAX_DEVICES_PER_POOL {
                return Err(SnapshotError::TooManyDevices {
                    node: node.name.clone(),
                    resource: pool.resource.clone(),
                    devices: pool.devices,
                });
            }
            let resource = self.intern_resource(&pool.resource);
            let len = u16::try_from(pool.devices).unwrap_or(0);
            if len == 0 || layout.iter().any(|p: &PoolLayout| p.resource == resource) {
                continue;
            }
            layout.push(PoolLayout {
                resource,
                start,
                len,
                memory_mib: pool.memory_mib,
            });
            start += len;
            self.capacity[resource.index()] += Milli::devices(u64::from(len));
        }
        let mut new_model = false;
        let model = node.gpu_model.as_ref().map(|m| {
            if let Some(id) = self.model_ids.get(m) {
                *id
            } else {
                let id = ModelId(u16::try_from(self.models.len()).unwrap_or(u16::MAX));
                self.models.push(m.clone());
                self.model_ids.insert(m.clone(), id);
                new_model = true;
                id
            }
        });
        let id = NodeId(u32::try_from(self.nodes.len()).unwrap_or(u32::MAX));
        self.node_ids.insert(node.name.clone(), id);
        self.hostnames
            .entry(node.hostname().to_string())
            .or_insert(id);
        self.nodes.push(NodeState {
            model,
            free: vec![u16::try_from(MILLI_PER_DEVICE).unwrap_or(1000); usize::from(start)],
            layout,
            cpu_free: host_amount(node.cpu_milli),
            memory_free: host_amount(node.memory_bytes),
            pods: Vec::new(),
            deficit: Vec::new(),
            frag: 0.0,
            node,
        });
        if new_model && let Some(mix) = self.mix.take() {
            self.set_workload_mix(mix);
        } else {
            self.refresh_frag(id);
        }
        self.generation += 1;
        Ok(id)
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
        &self.nodes[id.index()].node
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Every node id, in name order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes.len()).map(|i| NodeId(u32::try_from(i).unwrap_or(u32::MAX)))
    }

    /// The node's current free devices, CPU and memory.
    pub fn node_view(&self, id: NodeId) -> NodeView<'_> {
        self.nodes[id.index()].view()
    }

    /// Pods seated (or pinned with a deficit) on a node.
    pub fn pods_on(&self, id: NodeId) -> impl Iterator<Item = PodId> + '_ {
        let n = &self.nodes[id.index()];
        n.pods.iter().chain(n.deficit.iter()).copied()
    }

    /// Whether the node carries pinned pods it has no room for yet (a reclaim in progress).
    pub fn is_oversubscribed(&self, id: NodeId) -> bool {
        !self.nodes[id.index()].deficit.is_empty()
    }

    // ---- fragmentation -----------------------------------------------------------------

    /// Sets the task mix fragmentation is measured against and recomputes every node's.
    pub fn set_workload_mix(&mut self, mix: WorkloadMix) {
        let resource_ids = &self.resource_ids;
        self.frag = (!mix.is_empty())
            .then(|| FragIndex::new(&mix, &self.models, |r| resource_ids.get(r).copied()));
        self.mix = Some(mix);
        for i in 0..self.nodes.len() {
            self.refresh_frag(NodeId(u32::try_from(i).unwrap_or(u32::MAX)));
        }
    }

    pub fn workload_mix(&self) -> Option<&WorkloadMix> {
        self.mix.as_ref()
    }

    fn refresh_frag(&mut self, id: NodeId) {
        let n = &self.nodes[id.index()];
        let f = self.frag.as_ref().map_or(0.0, |index| {
            index.node_fragmentation(n.model, n.cpu_free, &n.layout, &n.free)
        });
        self.nodes[id.index()].frag = f;
    }

    /// `F_n` of one node, milli (0 without a workload mix).
    pub fn node_fragmentation(&self, id: NodeId) -> f64 {
        self.nodes[id.index()].frag
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
            report.idle_milli += if n.deficit.is_empty() {
                n.free.iter().map(|f| u64::from(*f)).sum()
            } else {
                0
            };
            report.fragmented_milli += if n.deficit.is_empty() { n.frag } else { 0.0 };
        }
        report
    }

    // ---- pods --------------------------------------------------------------------------

    pub fn pod_id(&self, key: &PodKey) -> Option<PodId> {
        self.pod_ids.get(key).copied()
    }

    pub(crate) fn slot(&self, id: PodId) -> Option<&PodSlot> {
        self.pods.get(id.index()).and_then(Option::as_ref)
    }

    /// A pod; `None` once removed.
    pub fn pod(&self, id: PodId) -> Option<&Pod> {
        self.slot(id).map(|s| &s.pod)
    }

    /// The queue a pod belongs to.
    pub fn pod_attribution(&self, id: PodId) -> Option<&Attribution> {
        self.slot(id).map(|s| &s.attribution)
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

    pub(crate) fn device_sets(&self, node: NodeId, charges: &[Charge]) -> Vec<DeviceSet> {
        let n = &self.nodes[node.index()];
        let mut sets: Vec<DeviceSet> = Vec::new();
        for c in charges {
            let Some(pool) = n
                .layout
                .iter()
                .find(|p| c.device >= p.start && c.device < p.start + p.len)
            else {
                continue;
            };
            let resource = self.resources[pool.resource.index()].clone();
            let local = c.device - pool.start;
            match sets.iter_mut().find(|s| s.resource == resource) {
                Some(set) => set.devices.push(local),
                None => sets.push(DeviceSet {
                    resource,
                    devices: vec![local],
                }),
            }
        }
        sets
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
            .map(|(i, _)| PodId(u32::try_from(i).unwrap_or(u32::MAX)))
    }

    /// Pods waiting at the gate.
    pub fn pending_pods(&self) -> impl Iterator<Item = PodId> + '_ {
        self.pod_ids()
            .filter(|id| self.pod(*id).is_some_and(|p| !p.is_admitted()))
    }

    /// Checks a pod's requests: at least one device each, at most one device per shared
    /// request, at most 1000 milli per device.
    pub fn validate_requests(requests: &Requests) -> Result<(), String> {
        let mut seen: Vec<&ResourceName> = Vec::new();
        for g in &requests.gpus {
            if seen.contains(&&g.resource) {
                return Err(format!("requests {} twice", g.resource));
            }
            seen.push(&g.resource);
            if g.count == 0 || g.milli_per_device == 0 {
                return Err(format!("requests no {}; leave it out instead", g.resource));
            }
            if g.milli_per_device > MILLI_PER_DEVICE {
                return Err(format!(
                    "requests {} milli of each {} device; a device has 1000",
                    g.milli_per_device, g.resource
                ));
            }
            if g.milli_per_device < MILLI_PER_DEVICE && g.count > 1 {
                return Err(format!(
                    "shares {} devices of {}; only a single device can be shared",
                    g.count, g.resource
                ));
            }
            if g.count > MAX_DEVICES_PER_POOL {
                return Err(format!(
                    "requests {} devices of {}; no node has more than {MAX_DEVICES_PER_POOL}",
                    g.count, g.resource
                ));
            }
        }
        Ok(())
    }

    fn resolve(&mut self, requests: &Requests) -> (Vec<ResolvedGpu>, Vec<(ResourceId, Milli)>) {
        let mut gpus = Vec::new();
        let mut amounts = Vec::new();
        for g in &requests.gpus {
            let resource = self.intern_resource(&g.resource);
            gpus.push(ResolvedGpu {
                resource,
                count: u16::try_from(g.count).unwrap_or(u16::MAX),
                milli: u16::try_from(g.milli_per_device).unwrap_or(u16::MAX),
            });
            amounts.push((resource, g.total()));
        }
        (gpus, amounts)
    }

    /// Adds a pod in its state: pending pods wait; admitted pods hold quota and are seated on
    /// their node (on the devices they name, or the lowest-numbered free ones).
    pub fn add_pod(&mut self, pod: Pod) -> Result<PodId, SnapshotError> {
        if self.pod_ids.contains_key(&pod.key) {
            return Err(SnapshotError::DuplicatePod(pod.key));
        }
        Self::validate_requests(&pod.requests).map_err(|rule| SnapshotError::InvalidRequest {
            pod: pod.key.clone(),
            rule,
        })?;
        let (gpus, amounts) = self.resolve(&pod.requests);
        let attribution = self.attribution(&pod.key.namespace);
        let id = PodId(u32::try_from(self.pods.len()).unwrap_or(u32::MAX));
        let admitted_as = None;
        self.pod_ids.insert(pod.key.clone(), id);
        let node = match &pod.state {
            PodState::Admitted(Assignment {
                node: Some(name), ..
            }) => {
                let node = self.node_by_pin(name);
                if node.is_none() {
                    self.build_notes.push(SnapshotError::UnknownNode {
                        pod: pod.key.clone(),
                        node: name.clone(),
                    });
                }
                node
            }
            _ => None,
        };
        let explicit = pod.devices.clone();
        self.pods.push(Some(PodSlot {
            pod,
            attribution,
            gpus,
            amounts,
            seat: None,
            admitted_as,
        }));
        self.charge_queue(id, 1);
        if let Some(node) = node {
            let how = if explicit.is_empty() {
                SeatMode::CanonicalOrDeficit
            } else {
                match self.explicit_charges(id, node, &explicit) {
                    Ok(charges) => SeatMode::Exact(charges),
                    Err(e) => {
                        self.charge_queue(id, -1);
                        if let Some(slot) = self.pods[id.index()].take() {
                            self.pod_ids.remove(&slot.pod.key);
                        }
                        return Err(e);
                    }
                }
            };
            self.seat(id, node, how);
        }
        self.generation += 1;
        Ok(id)
    }

    /// Charges (`sign` = 1) or refunds (`sign` = -1) a pod's requests to its queue's ledger or
    /// to the unmanaged total, as pending or allocated by its state.
    fn charge_queue(&mut self, id: PodId, sign: i8) {
        let Some(slot) = self.pods[id.index()].as_ref() else {
            return;
        };
        let admitted = slot.pod.is_admitted();
        let amounts = slot.amounts.clone();
        let apply = |value: &mut Milli, amount: Milli| {
            *value = if sign > 0 {
                *value + amount
            } else {
                value.saturating_sub(amount)
            };
        };
        match slot.attribution.clone() {
            Attribution::Queue(q) => {
                let protection = admitted.then(|| Protection {
                    priority: slot.pod.priority,
                    since: slot
                        .pod
                        .admitted_at
                        .unwrap_or_else(|| slot.pod.running_since()),
                    key: slot.pod.key.clone(),
                    id,
                });
                let state = &mut self.queues[q.index()];
                for (resource, amount) in amounts {
                    let usage = state.usage_mut(resource);
                    if admitted {
                        apply(&mut usage.allocated, amount);
                    } else {
                        apply(&mut usage.pending, amount);
                    }
                }
                let counter = if admitted {
                    &mut state.admitted_pods
                } else {
                    &mut state.pending_pods
                };
                *counter = if sign > 0 {
                    *counter + 1
                } else {
                    counter.saturating_sub(1)
                };
                if let Some(p) = protection {
                    if sign > 0 {
                        state.members.insert(p);
                    } else {
                        state.members.remove(&p);
                    }
                }
            }
            Attribution::Conflict { .. } | Attribution::Unclaimed => {
                if admitted {
                    for (resource, amount) in amounts {
                        apply(&mut self.unmanaged[resource.index()], amount);
                    }
                }
            }
        }
    }

    fn explicit_charges(
        &self,
        id: PodId,
        node: NodeId,
        sets: &[DeviceSet],
    ) -> Result<Vec<Charge>, SnapshotError> {
        let slot = self.slot(id).ok_or(SnapshotError::StaleRemoval)?;
        let n = &self.nodes[node.index()];
        let mut charges = Vec::new();
        for set in sets {
            let bad = || SnapshotError::BadDevices {
                pod: slot.pod.key.clone(),
                node: n.node.name.clone(),
                resource: set.resource.clone(),
                devices: set.devices.clone(),
            };
            let resource = self.resource_id(&set.resource).ok_or_else(bad)?;
            let gpu = slot
                .gpus
                .iter()
                .find(|g| g.resource == resource)
                .ok_or_else(bad)?;
            let pool = n.pool(resource).ok_or_else(bad)?;
            if set.devices.len() != usize::from(gpu.count) {
                return Err(bad());
            }
            for d in &set.devices {
                if *d >= pool.len || set.devices.iter().filter(|x| *x == d).count() > 1 {
                    return Err(bad());
                }
                let device = pool.start + d;
                if n.free[usize::from(device)] < gpu.milli {
                    return Err(bad());
                }
                charges.push(Charge {
                    device,
                    milli: gpu.milli,
                });
            }
        }
        if charges.len()
            != slot
                .gpus
                .iter()
                .map(|g| usize::from(g.count))
                .sum::<usize>()
        {
            return Err(SnapshotError::BadDevices {
                pod: slot.pod.key.clone(),
                node: n.node.name.clone(),
                resource: self.resources[slot.gpus[0].resource.index()].clone(),
                devices: Vec::new(),
            });
        }
        Ok(charges)
    }

    /// The lowest-numbered devices of `node` that fit the pod's requests now.
    fn canonical_charges(&self, id: PodId, node: NodeId) -> Option<Vec<Charge>> {
        let slot = self.slot(id)?;
        let n = &self.nodes[node.index()];
        if !n.deficit.is_empty() && !n.deficit.contains(&id) {
            return None;
        }
        let mut charges = Vec::new();
        for gpu in &slot.gpus {
            let pool = n.pool(gpu.resource)?;
            let mut wanted = gpu.count;
            for d in pool.start..pool.start + pool.len {
                if wanted == 0 {
                    break;
                }
                if n.free[usize::from(d)] >= gpu.milli {
                    charges.push(Charge {
                        device: d,
                        milli: gpu.milli,
                    });
                    wanted -= 1;
                }
            }
            if wanted > 0 {
                return None;
            }
        }
        Some(charges)
    }

    /// Seats an admitted pod on a node as `how` says. False when it does not fit there.
    fn seat(&mut self, id: PodId, node: NodeId, how: SeatMode) -> bool {
        let (charges, allow_deficit) = match how {
            SeatMode::Exact(charges) => (Some(charges), false),
            SeatMode::CanonicalOrDeficit => (self.canonical_charges(id, node), true),
            SeatMode::Deficit => (None, true),
        };
        let Some(slot) = self.pods[id.index()].as_mut() else {
            return false;
        };
        let (cpu, memory) = (
            host_amount(slot.pod.requests.cpu_milli),
            host_amount(slot.pod.requests.memory_bytes),
        );
        let n = &mut self.nodes[node.index()];
        match charges {
            Some(charges) => {
                for c in &charges {
                    let free = &mut n.free[usize::from(c.device)];
                    *free = free.saturating_sub(c.milli);
                }
                n.cpu_free -= cpu;
                n.memory_free -= memory;
                n.pods.push(id);
                slot.seat = Some(Seat {
                    node,
                    charges,
                    deficit: false,
                });
            }
            None if allow_deficit => {
                n.deficit.push(id);
                slot.seat = Some(Seat {
                    node,
                    charges: Vec::new(),
                    deficit: true,
                });
            }
            None => return false,
        }
        self.add_memory(id, 1);
        self.refresh_frag(node);
        true
    }

    /// Adds or removes the GPU memory a seated pod holds on its node to its queue's ledger.
    fn add_memory(&mut self, id: PodId, sign: i8) {
        let Some(slot) = self.slot(id) else { return };
        let (Attribution::Queue(q), Some(seat)) = (&slot.attribution, &slot.seat) else {
            return;
        };
        let n = &self.nodes[seat.node.index()];
        let mut held: Vec<(ResourceId, u64)> = Vec::new();
        for gpu in &slot.gpus {
            if let Some(memory) = n.pool(gpu.resource).and_then(|p| p.memory_mib) {
                held.push((
                    gpu.resource,
                    memory * u64::from(gpu.milli) * u64::from(gpu.count)
                        / u64::from(MILLI_PER_DEVICE),
                ));
            }
        }
        let q = *q;
        for (resource, mib) in held {
            let usage = self.queues[q.index()].usage_mut(resource);
            usage.memory_mib = if sign > 0 {
                usage.memory_mib + mib
            } else {
                usage.memory_mib.saturating_sub(mib)
            };
        }
    }

    /// Frees what a pod holds on its node; with `reseat`, pods waiting in the node's deficit
    /// take the room, oldest first.
    fn unseat(&mut self, id: PodId, reseat: bool) {
        self.add_memory(id, -1);
        let Some(seat) = self.pods[id.index()].as_mut().and_then(|s| s.seat.take()) else {
            return;
        };
        let Some(slot) = self.pods[id.index()].as_ref() else {
            return;
        };
        let (cpu, memory) = (
            host_amount(slot.pod.requests.cpu_milli),
            host_amount(slot.pod.requests.memory_bytes),
        );
        let n = &mut self.nodes[seat.node.index()];
        if seat.deficit {
            n.deficit.retain(|p| *p != id);
        } else {
            for c in &seat.charges {
                n.free[usize::from(c.device)] += c.milli;
            }
            n.cpu_free += cpu;
            n.memory_free += memory;
            n.pods.retain(|p| *p != id);
        }
        if reseat {
            let waiting = self.nodes[seat.node.index()].deficit.clone();
            for pod in waiting {
                self.nodes[seat.node.index()].deficit.retain(|p| *p != pod);
                let Some(charges) = self.canonical_charges(pod, seat.node) else {
                    self.nodes[seat.node.index()].deficit.insert(0, pod);
                    break;
                };
                self.add_memory(pod, -1);
                if let Some(s) = self.pods[pod.index()].as_mut() {
                    s.seat = None;
                }
                self.seat(pod, seat.node, SeatMode::Exact(charges));
            }
        }
        self.refresh_frag(seat.node);
    }

    /// Adds a pod bound where `placement` says, on its devices (the simulator's arrival: find
    /// a placement, then add the pod there).
    pub fn add_placed(
        &mut self,
        mut pod: Pod,
        placement: &Placement,
    ) -> Result<PodId, SnapshotError> {
        pod.state = PodState::Admitted(Assignment {
            node: Some(placement.node_name.clone()),
            bound: true,
            terminating: false,
        });
        pod.devices.clone_from(&placement.devices);
        self.add_pod(pod)
    }

    /// Admits a pending pod onto a placement: it holds quota from now on.
    pub fn admit(
        &mut self,
        id: PodId,
        placement: &Placement,
        as_: AdmittedAs,
        now: Timestamp,
    ) -> Result<(), SnapshotError> {
        let slot = self.slot(id).ok_or(SnapshotError::StaleRemoval)?;
        if slot.pod.is_admitted() {
            return Err(SnapshotError::NotPending(slot.pod.key.clone()));
        }
        let n = &self.nodes[placement.node.index()];
        let fits = n.deficit.is_empty()
            && placement.charges.iter().all(|c| {
                n.free
                    .get(usize::from(c.device))
                    .is_some_and(|f| *f >= c.milli)
            })
            && placement.charges.len()
                == slot
                    .gpus
                    .iter()
                    .map(|g| usize::from(g.count))
                    .sum::<usize>();
        if !fits {
            return Err(SnapshotError::DoesNotFit {
                pod: slot.pod.key.clone(),
                node: n.node.name.clone(),
            });
        }
        let pin = n.node.name.clone();
        self.charge_queue(id, -1);
        if let Some(slot) = self.pods[id.index()].as_mut() {
            slot.pod.state = PodState::Admitted(Assignment {
                node: Some(pin),
                bound: false,
                terminating: false,
            });
            slot.pod.admitted_at = Some(now);
            slot.admitted_as = Some(as_);
        }
        self.charge_queue(id, 1);
        self.seat(
            id,
            placement.node,
            SeatMode::Exact(placement.charges.clone()),
        );
        self.generation += 1;
        Ok(())
    }

    /// Admits a pending pod pinned to `node` whether or not it fits yet: a reclaim's owner
    /// waits on the node (as its deficit) until the victims are gone.
    pub fn admit_pinned(
        &mut self,
        id: PodId,
        node: NodeId,
        as_: AdmittedAs,
        now: Timestamp,
    ) -> Result<(), SnapshotError> {
        let slot = self.slot(id).ok_or(SnapshotError::StaleRemoval)?;
        if slot.pod.is_admitted() {
            return Err(SnapshotError::NotPending(slot.pod.key.clone()));
        }
        let pin = self.nodes[node.index()].node.name.clone();
        self.charge_queue(id, -1);
        if let Some(slot) = self.pods[id.index()].as_mut() {
            slot.pod.state = PodState::Admitted(Assignment {
                node: Some(pin),
                bound: false,
                terminating: false,
            });
            slot.pod.admitted_at = Some(now);
            slot.admitted_as = Some(as_);
        }
        self.charge_queue(id, 1);
        self.seat(id, node, SeatMode::CanonicalOrDeficit);
        self.generation += 1;
        Ok(())
    }

    /// Marks a pod as a victim of reclaim `reclaim_id`: it keeps its GPUs until removed, but
    /// is no longer a candidate for another reclaim.
    pub fn mark_victim(&mut self, id: PodId, reclaim_id: &str) {
        if let Some(slot) = self.pods.get_mut(id.index()).and_then(Option::as_mut) {
            slot.pod.reclaim = Some(ReclaimMark {
                id: reclaim_id.to_string(),
                role: ReclaimRole::Victim,
            });
            self.generation += 1;
        }
    }

    /// Removes a pod (it finished, was deleted or evicted); pods waiting for its room on the
    /// node are seated.
    pub fn remove_pod(&mut self, id: PodId) -> Option<Pod> {
        self.slot(id)?;
        self.unseat(id, true);
        self.charge_queue(id, -1);
        let slot = self.pods[id.index()].take()?;
        self.pod_ids.remove(&slot.pod.key);
        self.generation += 1;
        Some(slot.pod)
    }

    /// Removes pods to see what would happen without them; [`Snapshot::restore`] puts them
    /// back exactly (same ids, devices and ledger). Other changes in between are refused.
    pub fn simulate_removal(&mut self, ids: &[PodId]) -> Removal {
        let mut slots = Vec::new();
        for id in ids {
            if self.slot(*id).is_none() {
                continue;
            }
            let saved = self.pods[id.index()].clone();
            self.unseat(*id, false);
            self.charge_queue(*id, -1);
            self.pods[id.index()] = None;
            if let Some(slot) = saved {
                self.pod_ids.remove(&slot.pod.key);
                slots.push((*id, slot));
            }
        }
        self.generation += 1;
        Removal {
            generation: self.generation,
            slots,
        }
    }

    /// Puts back pods removed by [`Snapshot::simulate_removal`].
    pub fn restore(&mut self, removal: Removal) -> Result<(), SnapshotError> {
        if removal.generation != self.generation {
            return Err(SnapshotError::StaleRemoval);
        }
        for (id, mut slot) in removal.slots.into_iter().rev() {
            let seat = slot.seat.take();
            self.pod_ids.insert(slot.pod.key.clone(), id);
            self.pods[id.index()] = Some(slot);
            self.charge_queue(id, 1);
            if let Some(seat) = seat {
                let how = if seat.deficit {
                    SeatMode::Deficit
                } else {
                    SeatMode::Exact(seat.charges)
                };
                self.seat(id, seat.node, how);
            }
        }
        self.generation += 1;
        Ok(())
    }
}
