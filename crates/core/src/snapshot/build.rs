//! Building a snapshot: the builder's objects indexed in a deterministic order, names interned
//! to ids, namespace claims resolved, nodes laid out and pods added in their state.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;

use super::seating::SeatMode;
use super::{
    Index, PodSlot, SlotAmounts, SlotGpus, Snapshot, SnapshotBuilder, SnapshotError, slot_key,
};
use crate::devices::{self, Charge, NodeState, Placement, PoolLayout, ResolvedGpu};
use crate::fragmentation::{FragIndex, WorkloadMix};
use crate::ids::{ModelId, NodeId, PodId, QueueId, ResourceId};
use crate::ledger::QueueState;
use crate::model::{
    Assignment, DeviceSet, MAX_DEVICES_PER_POOL, Namespace, Node, Pod, PodState, Queue, Requests,
};
use crate::quantity::{Milli, ResourceName};

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
    pub fn node(mut self, node: impl Into<Arc<Node>>) -> Self {
        self.nodes.push(node.into());
        self
    }

    #[must_use]
    pub fn nodes<N: Into<Arc<Node>>>(mut self, nodes: impl IntoIterator<Item = N>) -> Self {
        self.nodes.extend(nodes.into_iter().map(Into::into));
        self
    }

    #[must_use]
    pub fn pod(mut self, pod: impl Into<Arc<Pod>>) -> Self {
        self.pods.push(pod.into());
        self
    }

    #[must_use]
    pub fn pods<P: Into<Arc<Pod>>>(mut self, pods: impl IntoIterator<Item = P>) -> Self {
        self.pods.extend(pods.into_iter().map(Into::into));
        self
    }

    /// The task mix fragmentation is measured against (FGD's typical pods).
    #[must_use]
    pub fn workload_mix(mut self, mix: WorkloadMix) -> Self {
        self.mix = Some(mix);
        self
    }

    /// The task mix of the pods given, with FGD's `popularity` cut
    /// ([`WorkloadMix::from_pods`]); a kept snapshot counts only the pods that changed.
    #[must_use]
    pub fn workload_mix_of_pods(mut self, popularity: f64) -> Self {
        self.mix_of_pods = Some(popularity);
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
    pub fn build(self) -> (Snapshot, Vec<SnapshotError>) {
        self.build_telling(|_, _| {})
    }

    /// [`Self::build`], telling `added` of every pod given, with its id (`None`: left out).
    pub(super) fn build_telling(
        mut self,
        mut added: impl FnMut(Arc<Pod>, Option<PodId>),
    ) -> (Snapshot, Vec<SnapshotError>) {
        let mut issues = Vec::new();
        let mut snapshot = Snapshot::default();
        if let Some(popularity) = self.mix_of_pods.take() {
            let mix = WorkloadMix::from_pods(self.pods.iter().map(AsRef::as_ref), popularity);
            self.mix = Some(mix);
        }

        self.queues.sort_by(|a, b| a.name.cmp(&b.name));
        for queue in self.queues {
            if snapshot.queue_ids.contains_key(&queue.name) {
                issues.push(SnapshotError::DuplicateQueue(queue.name));
                continue;
            }
            let id = QueueId::at(snapshot.queues.len());
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
        snapshot.set_reclaimed_from(self.reclaimed_from);
        // Pods that really hold devices first (bound, oldest first), then pinned ones, so a
        // node over-subscribed by a reclaim's owner records the owner as its deficit.
        for pod in in_seating_order(self.pods) {
            match snapshot.add_pod(pod.clone()) {
                Ok(id) => added(pod, Some(id)),
                Err(e) => {
                    issues.push(e);
                    added(pod, None);
                }
            }
        }
        // The mix last: it measures every node once, where set first each pod seated would
        // measure its node again (10,000 times at 10,000 pods instead of 1,000).
        if let Some(mix) = self.mix {
            snapshot.set_workload_mix(mix);
        }
        // A pod on a node the snapshot lacks is still counted against its queue.
        issues.append(&mut snapshot.build_notes);
        (snapshot, issues)
    }
}

/// Pods bound first, then pinned, then pending; each group oldest first, then by key (then
/// as given, so the first of two pods with one key is the one kept). The rank and age are
/// read once per pod: at 10,000 pods, comparing through each pod's pointer was a tenth of a
/// pass.
fn in_seating_order(pods: Vec<Arc<Pod>>) -> impl Iterator<Item = Arc<Pod>> {
    let mut order: Vec<((u8, Timestamp), usize)> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| (seating_rank(p), i))
        .collect();
    order.sort_unstable_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| pods[a.1].key.cmp(&pods[b.1].key))
            .then(a.1.cmp(&b.1))
    });
    let mut pods: Vec<Option<Arc<Pod>>> = pods.into_iter().map(Some).collect();
    order.into_iter().filter_map(move |(_, i)| pods[i].take())
}

/// Where a pod comes in the seating order, before its key: bound, then pinned, then pending,
/// each oldest first. A node's devices go to its pods in this order.
pub(super) fn seating_rank(pod: &Pod) -> (u8, Timestamp) {
    let rank = match &pod.state {
        PodState::Admitted(Assignment { bound: true, .. }) => 0u8,
        PodState::Admitted(_) => 1,
        PodState::Pending => 2,
    };
    (rank, pod.running_since())
}

fn snapshot_intern(
    names: &mut Vec<ResourceName>,
    ids: &mut Index<ResourceName, ResourceId>,
    name: &ResourceName,
) -> ResourceId {
    if let Some(id) = ids.get(name) {
        return *id;
    }
    let id = ResourceId::at(names.len());
    names.push(name.clone());
    ids.insert(name.clone(), id);
    id
}

impl Snapshot {
    // ---- interning ---------------------------------------------------------------------

    fn intern_resource(&mut self, name: &ResourceName) -> ResourceId {
        let id = snapshot_intern(&mut self.resources, &mut self.resource_ids, name);
        if self.capacity.len() < self.resources.len() {
            self.capacity.resize(self.resources.len(), Milli::ZERO);
            self.unmanaged.resize(self.resources.len(), Milli::ZERO);
        }
        id
    }

    // ---- queues and namespaces ---------------------------------------------------------

    /// Which queues claim each namespace, by the one rule of [`Queue::claims`]; a conflict is
    /// noted on every queue in it. A namespace a queue names but the snapshot was not given
    /// is claimed by name only (it has no labels for a selector to match).
    fn resolve_claims(&mut self) {
        let mut claims: BTreeMap<String, Vec<QueueId>> = BTreeMap::new();
        let listed = self.queues.iter().flat_map(|q| q.queue.namespaces.iter());
        for name in listed.chain(self.namespaces.keys()) {
            if claims.contains_key(name) {
                continue;
            }
            let claimed_by = |queue: &Queue| match self.namespaces.get(name) {
                Some(ns) => queue.claims(&ns.name, &ns.labels),
                None => queue.namespaces.contains(name),
            };
            let ids: Vec<QueueId> = (0..self.queues.len())
                .filter(|i| claimed_by(&self.queues[*i].queue))
                .map(QueueId::at)
                .collect();
            if !ids.is_empty() {
                claims.insert(name.clone(), ids);
            }
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

    /// When each queue was last reclaimed from, the latest of its entries in `reclaims`.
    pub(super) fn set_reclaimed_from(&mut self, reclaims: Vec<(String, Timestamp)>) {
        self.reclaimed_from.clear();
        for (queue, at) in reclaims {
            if let Some(id) = self.queue_ids.get(&queue) {
                let entry = self.reclaimed_from.entry(*id).or_insert(at);
                *entry = (*entry).max(at);
            }
        }
    }

    // ---- nodes -------------------------------------------------------------------------

    /// Adds a node (with no pods).
    pub fn add_node(&mut self, node: impl Into<Arc<Node>>) -> Result<NodeId, SnapshotError> {
        let node = node.into();
        if self.node_ids.contains_key(&node.name) {
            return Err(SnapshotError::DuplicateNode(node.name.clone()));
        }
        let layout = self.lay_out(&node)?;
        let model = self.intern_model(&node);
        let id = NodeId::at(self.nodes.len());
        self.node_ids.insert(node.name.clone(), id);
        self.hostnames
            .entry(node.hostname().to_string())
            .or_insert(id);
        self.nodes
            .push(NodeState::new(node, model.map(|(m, _)| m), layout));
        if model.is_some_and(|(_, new)| new)
            && let Some(mix) = self.mix.take()
        {
            self.set_workload_mix(mix);
        } else {
            self.refresh_frag(id);
        }
        self.generation += 1;
        Ok(id)
    }

    /// The node's pools in its flat device array, each resource once; counts their capacity.
    fn lay_out(&mut self, node: &Node) -> Result<Vec<PoolLayout>, SnapshotError> {
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
                sharing: pool.sharing,
            });
            start += len;
            // Quota counts what kube-scheduler counts: each replica of a shared device.
            self.capacity[resource.index()] += Milli::devices(pool.schedulable());
        }
        Ok(layout)
    }

    /// The id of the node's GPU model, and whether the snapshot had not seen it before.
    fn intern_model(&mut self, node: &Node) -> Option<(ModelId, bool)> {
        let m = node.gpu_model.as_ref()?;
        if let Some(id) = self.model_ids.get(m) {
            return Some((*id, false));
        }
        let id = ModelId::at(self.models.len());
        self.models.push(m.clone());
        self.model_ids.insert(m.clone(), id);
        Some((id, true))
    }

    // ---- fragmentation -----------------------------------------------------------------

    /// Sets the task mix fragmentation is measured against and recomputes every node's.
    pub fn set_workload_mix(&mut self, mix: WorkloadMix) {
        let resource_ids = &self.resource_ids;
        let compile = |mix: &WorkloadMix| {
            (!mix.is_empty())
                .then(|| FragIndex::new(mix, &self.models, |r| resource_ids.get(r).copied()))
        };
        self.frag = compile(&mix);
        self.frag_per_copy = compile(&mix.per_copy());
        self.mix = Some(mix);
        for i in 0..self.nodes.len() {
            self.refresh_frag(NodeId::at(i));
        }
    }

    fn resolve(&mut self, requests: &Requests) -> (SlotGpus, SlotAmounts) {
        let mut gpus = SlotGpus::new();
        let mut amounts = SlotAmounts::new();
        for g in &requests.gpus {
            let resource = self.intern_resource(&g.resource);
            gpus.push(ResolvedGpu::new(resource, g).unwrap_or(ResolvedGpu {
                resource,
                count: u16::MAX,
                milli: u16::MAX,
                memory: g.memory,
                cores: g.cores_percent,
            }));
            amounts.push((resource, g.total()));
        }
        for g in &requests.quota_only {
            let resource = self.intern_resource(&g.resource);
            match amounts.iter_mut().find(|(r, _)| *r == resource) {
                Some((_, amount)) => *amount += g.total(),
                None => amounts.push((resource, g.total())),
            }
        }
        (gpus, amounts)
    }

    /// Adds a pod in its state: pending pods wait; admitted pods hold quota and are seated on
    /// their node (on the devices they name, or the lowest-numbered free ones).
    pub fn add_pod(&mut self, pod: impl Into<Arc<Pod>>) -> Result<PodId, SnapshotError> {
        let (id, node) = self.insert_pod(pod.into(), None)?;
        if let Some(node) = node {
            self.seat_as_given(id, node);
        }
        self.generation += 1;
        Ok(id)
    }

    /// Adds a pod and charges its queue, without seating it, in the empty slot `hole` if
    /// given (else a new one): returns the node it is to be seated on, if it is admitted to
    /// one the snapshot has.
    pub(super) fn insert_pod(
        &mut self,
        pod: Arc<Pod>,
        hole: Option<PodId>,
    ) -> Result<(PodId, Option<NodeId>), SnapshotError> {
        let hole = hole.filter(|id| matches!(self.pods.get(id.index()), Some(None)));
        let id = hole.unwrap_or_else(|| PodId::at(self.pods.len()));
        let hash = self.pod_ids.hash(&pod.key);
        if self
            .pod_ids
            .find(|id| slot_key(&self.pods, id), hash, &pod.key)
            .is_some()
        {
            return Err(SnapshotError::DuplicatePod(pod.key.clone()));
        }
        devices::validate_requests(&pod.requests).map_err(|rule| {
            SnapshotError::InvalidRequest {
                pod: pod.key.clone(),
                rule,
            }
        })?;
        let (gpus, amounts) = self.resolve(&pod.requests);
        let attribution = self.attribution(&pod.key.namespace);
        let admitted_as = None;
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
        let slot = Some(PodSlot {
            pod,
            attribution,
            gpus,
            amounts,
            seat: None,
            admitted_as,
        });
        match hole {
            Some(id) => self.pods[id.index()] = slot,
            None => self.pods.push(slot),
        }
        self.pod_ids
            .insert_unique(|id| slot_key(&self.pods, id), hash, id);
        self.charge_queue(id, 1);
        Ok((id, node))
    }

    /// Seats an inserted pod on `node`: on the devices it names, or the lowest-numbered free
    /// ones (else as the node's deficit). A pod naming devices it cannot hold there (taken by
    /// pods seated before it, or not on the node) is seated as one naming none, and the problem
    /// noted: what a pod names never takes it off its queue's charge, since a tenant can write
    /// the HAMi annotation the names come from on its own pods.
    pub(super) fn seat_as_given(&mut self, id: PodId, node: NodeId) {
        let explicit = match self.slot(id) {
            Some(slot) if !slot.pod.devices.is_empty() => slot.pod.devices.clone(),
            Some(_) => Vec::new(),
            None => return,
        };
        let how = if explicit.is_empty() {
            SeatMode::CanonicalOrDeficit
        } else {
            match self.explicit_charges(id, node, &explicit) {
                Ok(charges) => SeatMode::Exact(charges),
                Err(e) => {
                    self.build_notes.push(e);
                    SeatMode::CanonicalOrDeficit
                }
            }
        };
        self.seat(id, node, how);
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
                node: n.node().name.clone(),
                resource: set.resource.clone(),
                devices: set.devices.clone(),
            };
            let resource = self.resource_id(&set.resource).ok_or_else(bad)?;
            let gpu = slot
                .gpus
                .iter()
                .find(|g| g.resource == resource)
                .ok_or_else(bad)?;
            if set.devices.len() != usize::from(gpu.count) {
                return Err(bad());
            }
            let named = n.named_charges(gpu, &set.devices).ok_or_else(bad)?;
            charges.extend(named);
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
                node: n.node().name.clone(),
                resource: self.resources[slot.gpus[0].resource.index()].clone(),
                devices: Vec::new(),
            });
        }
        Ok(charges)
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
}
