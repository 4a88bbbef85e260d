//! Device state: each node's devices laid out in pools, what is free on them, which pods sit
//! there, and the arithmetic of seating a pod on devices. Everything here works on one node
//! with ids only; the snapshot owns the nodes and says which pod goes where.
//!
//! A node's devices are one flat array of free milli per device; a pool is a range of it (one
//! per resource name). A pod pinned to a node that is still full (the owner of a reclaim whose
//! victims are terminating) is the node's *deficit*: the node takes no new pods until it is
//! seated.

use crate::ids::{ModelId, NodeId, PodId, ResourceId};
use crate::model::{DeviceSet, MAX_DEVICES_PER_POOL, Node, Pod, Requests};
use crate::quantity::{MILLI_PER_DEVICE, ResourceName};

/// One pool of devices of a node, within the node's flat device array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolLayout {
    pub resource: ResourceId,
    pub start: u16,
    pub len: u16,
    pub memory_mib: Option<u64>,
}

impl PoolLayout {
    /// The range of the node's flat device array this pool covers.
    fn devices(&self) -> std::ops::Range<usize> {
        usize::from(self.start)..usize::from(self.start + self.len)
    }

    fn holds(&self, device: u16) -> bool {
        device >= self.start && device < self.start + self.len
    }
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

/// A pod's GPU requests resolved to resource ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ResolvedGpu {
    pub resource: ResourceId,
    pub count: u16,
    pub milli: u16,
}

/// Where an admitted pod sits.
#[derive(Clone, Debug)]
pub(crate) struct Seat {
    pub node: NodeId,
    pub charges: Vec<Charge>,
    /// Pinned here but holding no devices yet.
    pub deficit: bool,
}

/// One node: its object, its pools, what is free and who sits there.
#[derive(Clone, Debug)]
pub(crate) struct NodeState {
    node: Node,
    model: Option<ModelId>,
    layout: Vec<PoolLayout>,
    free: Vec<u16>,
    cpu_free: i64,
    memory_free: i64,
    /// Admitted pods seated here.
    pods: Vec<PodId>,
    /// Admitted pods pinned here that hold no devices yet (the node is over-subscribed).
    deficit: Vec<PodId>,
    /// Reclaim owners seated here that kube-scheduler has not bound yet: until they are, the
    /// node takes no borrower (a victim's replacement would race the owner for the room).
    awaiting_bind: Vec<PodId>,
    /// Cached `F_n` (0 without a workload mix).
    frag: f64,
}

impl NodeState {
    /// An empty node with every device free.
    pub fn new(node: Node, model: Option<ModelId>, layout: Vec<PoolLayout>) -> Self {
        let devices = layout.iter().map(|p| usize::from(p.len)).sum();
        Self {
            model,
            free: vec![u16::try_from(MILLI_PER_DEVICE).unwrap_or(1000); devices],
            layout,
            cpu_free: host_amount(node.cpu_milli),
            memory_free: host_amount(node.memory_bytes),
            pods: Vec::new(),
            deficit: Vec::new(),
            awaiting_bind: Vec::new(),
            frag: 0.0,
            node,
        }
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    pub fn model(&self) -> Option<ModelId> {
        self.model
    }

    pub fn layout(&self) -> &[PoolLayout] {
        &self.layout
    }

    /// Free milli of every device, in device order.
    pub fn free(&self) -> &[u16] {
        &self.free
    }

    pub fn cpu_free(&self) -> i64 {
        self.cpu_free
    }

    /// Admitted pods seated here.
    pub fn pods(&self) -> &[PodId] {
        &self.pods
    }

    /// Pods pinned here that hold no devices yet.
    pub fn deficit(&self) -> &[PodId] {
        &self.deficit
    }

    /// Whether pinned pods wait here for room (a reclaim in progress): the node takes no one else.
    pub fn is_oversubscribed(&self) -> bool {
        !self.deficit.is_empty()
    }

    /// Whether reclaim owners pinned here wait, for room or to be bound: no borrower is
    /// admitted here meanwhile.
    pub fn is_closed_to_borrowers(&self) -> bool {
        !self.deficit.is_empty() || !self.awaiting_bind.is_empty()
    }

    /// Records a reclaim owner seated here as not bound yet.
    pub fn await_bind(&mut self, pod: PodId) {
        self.awaiting_bind.push(pod);
    }

    /// Cached `F_n`.
    pub fn fragmentation(&self) -> f64 {
        self.frag
    }

    pub fn set_fragmentation(&mut self, frag: f64) {
        self.frag = frag;
    }

    pub fn pool(&self, resource: ResourceId) -> Option<&PoolLayout> {
        self.layout.iter().find(|p| p.resource == resource)
    }

    /// The free milli of each device of a pool.
    pub fn pool_free(&self, pool: &PoolLayout) -> &[u16] {
        &self.free[pool.devices()]
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

    pub fn capacity_milli(&self) -> u64 {
        self.free.len() as u64 * u64::from(MILLI_PER_DEVICE)
    }

    pub fn idle_milli(&self) -> u64 {
        self.free.iter().map(|f| u64::from(*f)).sum()
    }

    /// The lowest-numbered devices that fit `gpus` now; `None` when they do not fit, or when
    /// another pod than `pod` waits in the node's deficit.
    pub fn canonical_charges(&self, pod: PodId, gpus: &[ResolvedGpu]) -> Option<Vec<Charge>> {
        if !self.deficit.is_empty() && !self.deficit.contains(&pod) {
            return None;
        }
        self.lowest_charges(gpus)
    }

    /// The lowest-numbered devices that fit `gpus` now, whoever waits in the deficit.
    pub fn lowest_charges(&self, gpus: &[ResolvedGpu]) -> Option<Vec<Charge>> {
        let mut charges = Vec::new();
        lowest_fitting(&self.layout, &self.free, gpus, &mut charges).then_some(charges)
    }

    /// The charges of `devices` (pool-local numbers) of `resource` at `milli` each; `None`
    /// when the pool lacks one of them or it has not that much free.
    pub fn named_charges(
        &self,
        resource: ResourceId,
        devices: &[u16],
        milli: u16,
    ) -> Option<Vec<Charge>> {
        let pool = self.pool(resource)?;
        let mut charges = Vec::new();
        for d in devices {
            if *d >= pool.len || devices.iter().filter(|x| *x == d).count() > 1 {
                return None;
            }
            let device = pool.start + d;
            if self.free[usize::from(device)] < milli {
                return None;
            }
            charges.push(Charge { device, milli });
        }
        Some(charges)
    }

    /// Whether the node can take exactly these charges now (and has no deficit).
    pub fn can_take(&self, charges: &[Charge]) -> bool {
        self.deficit.is_empty()
            && charges.iter().all(|c| {
                self.free
                    .get(usize::from(c.device))
                    .is_some_and(|f| *f >= c.milli)
            })
    }

    /// Seats `pod` on its charges, with its CPU and memory.
    pub fn seat(&mut self, pod: PodId, charges: &[Charge], cpu: i64, memory: i64) {
        for c in charges {
            let free = &mut self.free[usize::from(c.device)];
            *free = free.saturating_sub(c.milli);
        }
        self.cpu_free -= cpu;
        self.memory_free -= memory;
        self.pods.push(pod);
    }

    /// Frees what `pod` holds: its charges, CPU and memory.
    pub fn unseat(&mut self, pod: PodId, charges: &[Charge], cpu: i64, memory: i64) {
        for c in charges {
            self.free[usize::from(c.device)] += c.milli;
        }
        self.cpu_free += cpu;
        self.memory_free += memory;
        self.pods.retain(|p| *p != pod);
        self.awaiting_bind.retain(|p| *p != pod);
    }

    /// Pins `pod` here with no devices yet.
    pub fn add_deficit(&mut self, pod: PodId) {
        self.deficit.push(pod);
    }

    pub fn remove_deficit(&mut self, pod: PodId) {
        self.deficit.retain(|p| *p != pod);
    }

    /// The resource and pool-local device of each charge, in charge order.
    pub fn local_devices<'c>(
        &'c self,
        charges: &'c [Charge],
    ) -> impl Iterator<Item = (ResourceId, u16)> + 'c {
        charges.iter().filter_map(|c| {
            let pool = self.layout.iter().find(|p| p.holds(c.device))?;
            Some((pool.resource, c.device - pool.start))
        })
    }

    /// For one GPU request: the most of it the node could give now, and its idle capacity of
    /// that resource, milli. `None` when the node has no such pool.
    pub fn room_for(&self, gpu: &ResolvedGpu) -> Option<(u64, u64)> {
        let devices = self.pool_free(self.pool(gpu.resource)?);
        let fitting = devices
            .iter()
            .filter(|f| **f >= gpu.milli)
            .count()
            .min(usize::from(gpu.count)) as u64;
        Some((
            fitting * u64::from(gpu.milli),
            devices.iter().map(|f| u64::from(*f)).sum(),
        ))
    }
}

/// A node's free devices, CPU and memory copied out, to try releasing seated pods on (a
/// reclaim's victims) without changing the node.
#[derive(Clone, Debug, Default)]
pub(crate) struct Trial {
    pub free: Vec<u16>,
    pub cpu: i64,
    pub memory: i64,
}

impl Trial {
    pub fn of(n: &NodeState) -> Self {
        let mut trial = Self::default();
        trial.reset(n);
        trial
    }

    /// Starts over from the node as it is.
    pub fn reset(&mut self, n: &NodeState) {
        self.free.clear();
        self.free.extend_from_slice(&n.free);
        self.cpu = n.cpu_free;
        self.memory = n.memory_free;
    }

    /// Gives back (`sign` = 1) or takes again (`sign` = -1) a pod's charges, CPU and memory.
    pub fn release(&mut self, charges: &[Charge], cpu: i64, memory: i64, sign: i8) {
        for Charge { device, milli } in charges {
            let free = &mut self.free[usize::from(*device)];
            *free = if sign > 0 {
                free.saturating_add(*milli)
            } else {
                free.saturating_sub(*milli)
            };
        }
        self.cpu += i64::from(sign) * cpu;
        self.memory += i64::from(sign) * memory;
    }
}

/// Resolves the device sets of `charges` on a node, by resource name.
pub(crate) fn device_sets(
    n: &NodeState,
    charges: &[Charge],
    name: impl Fn(ResourceId) -> ResourceName,
) -> Vec<DeviceSet> {
    let mut sets: Vec<DeviceSet> = Vec::new();
    for (resource, local) in n.local_devices(charges) {
        let resource = name(resource);
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

/// The lowest-numbered devices of `free` that fit each of `gpus`, into `out`. False when one
/// does not fit.
fn lowest_fitting(
    layout: &[PoolLayout],
    free: &[u16],
    gpus: &[ResolvedGpu],
    out: &mut Vec<Charge>,
) -> bool {
    for g in gpus {
        let Some(pool) = layout.iter().find(|p| p.resource == g.resource) else {
            return false;
        };
        let mut wanted = g.count;
        for d in pool.start..pool.start + pool.len {
            if wanted == 0 {
                break;
            }
            if free[usize::from(d)] >= g.milli {
                out.push(Charge {
                    device: d,
                    milli: g.milli,
                });
                wanted -= 1;
            }
        }
        if wanted > 0 {
            return false;
        }
    }
    true
}

/// A node's state: as it is, or as it would be after a placement.
#[derive(Clone, Copy, Debug)]
pub struct NodeView<'a> {
    pub(crate) node: &'a Node,
    pub(crate) layout: &'a [PoolLayout],
    pub(crate) free: &'a [u16],
    pub(crate) cpu_free: i64,
    pub(crate) memory_free: i64,
    pub(crate) model: Option<ModelId>,
}

impl NodeView<'_> {
    pub fn node(&self) -> &Node {
        self.node
    }

    /// Free milli of every device, all resources, in device order.
    pub fn gpu_free(&self) -> &[u16] {
        self.free
    }

    /// Free GPU capacity, milli.
    pub fn idle_milli(&self) -> u64 {
        self.free.iter().map(|f| u64::from(*f)).sum()
    }

    /// GPU capacity, milli.
    pub fn capacity_milli(&self) -> u64 {
        self.free.len() as u64 * u64::from(MILLI_PER_DEVICE)
    }

    /// Devices nobody uses.
    pub fn fully_free_devices(&self) -> usize {
        self.free
            .iter()
            .filter(|f| u32::from(**f) == MILLI_PER_DEVICE)
            .count()
    }

    /// Free CPU, milli-cores (negative when over-subscribed; huge when unreported).
    pub fn cpu_free_milli(&self) -> i64 {
        self.cpu_free
    }

    /// Whether the node reports its CPU.
    pub fn reports_cpu(&self) -> bool {
        self.node.cpu_milli != u64::MAX
    }
}

/// Where a pod goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub node: NodeId,
    pub node_name: String,
    /// The value to pin the pod with, under the `kubernetes.io/hostname` node selector.
    pub pin: String,
    /// The devices it takes, per resource.
    pub devices: Vec<DeviceSet>,
    /// The winning score (`Score::node`).
    pub score: f64,
    pub(crate) charges: Vec<Charge>,
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

/// A pod's request resolved for placement (the snapshot resolves it: see
/// `Snapshot::request`).
pub(crate) struct Request<'a> {
    pub pod: &'a Pod,
    pub gpus: Vec<ResolvedGpu>,
    /// Allowed models by id; `None`: any.
    models: Option<Vec<bool>>,
    pub cpu: i64,
    pub memory: i64,
    pub cpu_milli: u64,
    pub gpu_milli: u64,
    /// The per-device milli of a shared (fractional, single-device) request, else 0.
    pub shared_milli: u16,
}

impl<'a> Request<'a> {
    /// `gpus` resolved to ids; `models` the allowed models by id (`None`: any).
    pub fn new(pod: &'a Pod, gpus: Vec<ResolvedGpu>, models: Option<Vec<bool>>) -> Self {
        let shared_milli = match gpus.as_slice() {
            [g] if g.count == 1 && u32::from(g.milli) < MILLI_PER_DEVICE => g.milli,
            _ => 0,
        };
        Self {
            pod,
            cpu: host_amount(pod.requests.cpu_milli),
            memory: host_amount(pod.requests.memory_bytes),
            cpu_milli: pod.requests.cpu_milli,
            gpu_milli: pod.requests.gpus.iter().map(|g| g.total().0).sum(),
            gpus,
            models,
            shared_milli,
        }
    }

    /// Whether the node passes the static filters and has room now.
    pub fn admits(&self, n: &NodeState) -> bool {
        !n.is_oversubscribed()
            && self.fits_statically(n)
            && self.has_room(&n.layout, &n.free, n.cpu_free, n.memory_free)
    }

    /// Whether the node could ever take the pod: schedulable, an allowed GPU model, enough
    /// devices of each resource, the pod's node rules.
    pub fn fits_statically(&self, n: &NodeState) -> bool {
        if !n.node.schedulable {
            return false;
        }
        if let Some(models) = &self.models
            && !n.model.is_some_and(|m| models[m.index()])
        {
            return false;
        }
        let enough_devices = self
            .gpus
            .iter()
            .all(|g| n.pool(g.resource).is_some_and(|p| p.len >= g.count));
        enough_devices
            && self
                .pod
                .node_rules
                .as_ref()
                .is_none_or(|r| r.admits(&n.node.name, &n.node.labels, &n.node.taints))
    }

    /// Whether free devices, CPU and memory as given have room for the pod.
    pub fn has_room(
        &self,
        layout: &[PoolLayout],
        free: &[u16],
        cpu_free: i64,
        memory_free: i64,
    ) -> bool {
        if cpu_free < self.cpu || memory_free < self.memory {
            return false;
        }
        self.gpus.iter().all(|g| {
            layout
                .iter()
                .find(|p| p.resource == g.resource)
                .is_some_and(|pool| {
                    let devices = &free[pool.devices()];
                    devices.iter().filter(|f| **f >= g.milli).count() >= usize::from(g.count)
                })
        })
    }

    /// The pool of a shared request, when the request is one.
    pub fn shared_pool<'n>(&self, n: &'n NodeState) -> Option<&'n PoolLayout> {
        if self.shared_milli == 0 {
            return None;
        }
        n.pool(self.gpus[0].resource)
    }

    /// The charges of placing the request on `n`: on `shared` for a shared request, else on
    /// the lowest-numbered devices that fit. False when it does not fit.
    pub fn charges(&self, n: &NodeState, shared: Option<u16>, out: &mut Vec<Charge>) -> bool {
        self.charges_in(&n.layout, &n.free, shared, out)
    }

    /// [`Request::charges`] on free devices as given.
    pub fn charges_in(
        &self,
        layout: &[PoolLayout],
        free: &[u16],
        shared: Option<u16>,
        out: &mut Vec<Charge>,
    ) -> bool {
        out.clear();
        if let Some(device) = shared {
            out.push(Charge {
                device,
                milli: self.shared_milli,
            });
            return free[usize::from(device)] >= self.shared_milli;
        }
        lowest_fitting(layout, free, &self.gpus, out)
    }
}
