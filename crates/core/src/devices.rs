//! Device state: each node's devices laid out in pools, what is free on them, which pods sit
//! there, and the arithmetic of seating a pod on devices. Everything here works on one node
//! with ids only; the snapshot owns the nodes and says which pod goes where.
//!
//! A node's devices are one flat array of free milli, free memory and free slots per device;
//! a pool is a range of it (one per resource name). What one unit of a request takes of a
//! device depends on how the pool shares it (`unit_cost`): a whole device, `1/replicas` of a
//! time-sliced one, the memory and compute a HAMi pod asks for (one that asks no compute is
//! placed in a slot, and charged all of the device against a `gpuCores` cap). A pod pinned to a node that is
//! still full (the owner of a reclaim whose victims are terminating) is the node's *deficit*:
//! the node takes no new pods until it is seated.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::ids::{ModelId, NodeId, PodId, ResourceId};
use crate::model::selector::tolerates_all;
use crate::model::{
    DeviceMemory, DeviceSet, GpuRequest, MAX_DEVICES_PER_POOL, Node, Pod, Requests, Sharing,
};
use crate::quantity::{MILLI_PER_DEVICE, ResourceName};

/// One pool of devices of a node, within the node's flat device array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolLayout {
    pub resource: ResourceId,
    pub start: u16,
    pub len: u16,
    pub memory_mib: Option<u64>,
    pub sharing: Sharing,
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

/// Free milli and memory taken from one device (index into the node's flat device array), and
/// one of its slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Charge {
    pub device: u16,
    pub milli: u16,
    pub memory_mib: u32,
}

/// What one unit of a request takes of one device of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UnitCost {
    /// Compute, milli of the device, as placement takes it from the device.
    pub milli: u16,
    /// Compute, milli of the device, as a queue's `gpuCores` cap charges it: what the pod may
    /// use. A HAMi pod that asks no `gpucores` has its slot placed, but HAMi limits it to
    /// nothing (its default `nvidia.defaultCores: 0`), so all of the device.
    pub compute_milli: u16,
    /// Memory, MiB (0 where the pool's memory is unknown and none is asked).
    pub memory_mib: u32,
    /// Whether several units of one request may share a device (replicas may; HAMi gives each
    /// unit its own device, and whole devices are whole).
    pub may_repeat: bool,
}

/// What one unit of `gpu` takes of a device of `pool`: see the module documentation.
pub(crate) fn unit_cost(pool: &PoolLayout, gpu: &ResolvedGpu) -> UnitCost {
    let device_mib = pool.memory_mib.unwrap_or(0);
    let of_device = |milli: u64| device_mib * milli / u64::from(MILLI_PER_DEVICE);
    let (milli, share_mib, may_repeat) = match pool.sharing {
        Sharing::Exclusive => (gpu.milli, of_device(u64::from(gpu.milli)), false),
        Sharing::Replicas { replicas, .. } => {
            let milli = u16::try_from(MILLI_PER_DEVICE / replicas.max(1)).unwrap_or(1);
            (milli, of_device(u64::from(milli)), true)
        }
        Sharing::Hami { split } => {
            let slot = MILLI_PER_DEVICE / split.max(1);
            let milli = gpu.cores.map_or(slot, |c| c * 10);
            (u16::try_from(milli).unwrap_or(u16::MAX), device_mib, false)
        }
    };
    let unlimited = matches!(pool.sharing, Sharing::Hami { .. }) && gpu.cores.is_none();
    let compute_milli = if unlimited {
        u16::try_from(MILLI_PER_DEVICE).unwrap_or(u16::MAX)
    } else {
        milli
    };
    let memory_mib = match gpu.memory {
        DeviceMemory::Share => share_mib,
        DeviceMemory::Mib(mib) if matches!(pool.sharing, Sharing::Exclusive) => mib.max(share_mib),
        DeviceMemory::Mib(mib) => mib,
        DeviceMemory::Percent(p) => device_mib * u64::from(p) / 100,
    };
    UnitCost {
        milli,
        compute_milli,
        memory_mib: u32::try_from(memory_mib).unwrap_or(u32::MAX),
        may_repeat,
    }
}

/// What is free on each device of a node, in device order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeviceFree {
    pub milli: Vec<u16>,
    /// MiB; `u32::MAX` where the device's memory is unknown.
    pub memory: Vec<u32>,
    /// Pods the device may still take; `u16::MAX` where only its milli limits them.
    pub slots: Vec<u16>,
}

impl DeviceFree {
    /// Every device of `layout` free.
    fn new(layout: &[PoolLayout]) -> Self {
        let mut free = Self::default();
        for pool in layout {
            let memory = pool
                .memory_mib
                .map_or(u32::MAX, |m| u32::try_from(m).unwrap_or(u32::MAX));
            let slots = pool
                .sharing
                .slots_per_device()
                .map_or(u16::MAX, |s| u16::try_from(s).unwrap_or(u16::MAX));
            for _ in 0..pool.len {
                free.milli
                    .push(u16::try_from(MILLI_PER_DEVICE).unwrap_or(1000));
                free.memory.push(memory);
                free.slots.push(slots);
            }
        }
        free
    }

    /// Whether device `d` has room for one unit costing `cost`.
    fn fits(&self, d: usize, cost: UnitCost) -> bool {
        self.milli[d] >= cost.milli && self.memory[d] >= cost.memory_mib && self.slots[d] > 0
    }

    /// Takes (`sign` = -1) or gives back (`sign` = 1) one charge.
    fn apply(&mut self, c: Charge, sign: i8) {
        let d = usize::from(c.device);
        if sign > 0 {
            self.milli[d] = self.milli[d].saturating_add(c.milli);
            self.memory[d] = self.memory[d].saturating_add(c.memory_mib);
            self.slots[d] = self.slots[d].saturating_add(1);
        } else {
            self.milli[d] = self.milli[d].saturating_sub(c.milli);
            self.memory[d] = self.memory[d].saturating_sub(c.memory_mib);
            self.slots[d] = self.slots[d].saturating_sub(1);
        }
    }
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
    pub memory: DeviceMemory,
    pub cores: Option<u32>,
}

impl ResolvedGpu {
    /// `gpu` with its resource resolved to `resource`; `None` when its numbers exceed what a
    /// device array can hold.
    pub fn new(resource: ResourceId, gpu: &GpuRequest) -> Option<Self> {
        Some(Self {
            resource,
            count: u16::try_from(gpu.count).ok()?,
            milli: u16::try_from(gpu.milli_per_device).ok()?,
            memory: gpu.memory,
            cores: gpu.cores_percent,
        })
    }
}

/// Where an admitted pod sits.
#[derive(Clone, Debug)]
pub(crate) struct Seat {
    pub node: NodeId,
    pub charges: SmallVec<[Charge; 2]>,
    /// Pinned here but holding no devices yet.
    pub deficit: bool,
}

/// One node: its object, its pools, what is free and who sits there.
#[derive(Clone, Debug)]
pub(crate) struct NodeState {
    /// Shared with whoever gave it (the operator keeps each node's model from pass to pass).
    node: Arc<Node>,
    model: Option<ModelId>,
    layout: Vec<PoolLayout>,
    free: DeviceFree,
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
    pub fn new(node: Arc<Node>, model: Option<ModelId>, layout: Vec<PoolLayout>) -> Self {
        Self {
            model,
            free: DeviceFree::new(&layout),
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
        &self.free.milli
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
        &self.free.milli[pool.devices()]
    }

    pub fn view(&self) -> NodeView<'_> {
        NodeView {
            node: &self.node,
            layout: &self.layout,
            free: &self.free.milli,
            free_memory: &self.free.memory,
            cpu_free: self.cpu_free,
            memory_free: self.memory_free,
            model: self.model,
        }
    }

    pub fn capacity_milli(&self) -> u64 {
        self.free.milli.len() as u64 * u64::from(MILLI_PER_DEVICE)
    }

    pub fn idle_milli(&self) -> u64 {
        self.free.milli.iter().map(|f| u64::from(*f)).sum()
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

    /// The charges of `devices` (pool-local numbers) of `gpu`'s resource; `None` when the
    /// pool lacks one of them or it has not that much free.
    pub fn named_charges(&self, gpu: &ResolvedGpu, devices: &[u16]) -> Option<Vec<Charge>> {
        let pool = self.pool(gpu.resource)?;
        let cost = unit_cost(pool, gpu);
        let mut trial = self.free.clone();
        let mut charges = Vec::new();
        for d in devices {
            if *d >= pool.len
                || (!cost.may_repeat && devices.iter().filter(|x| *x == d).count() > 1)
            {
                return None;
            }
            let device = pool.start + d;
            if !trial.fits(usize::from(device), cost) {
                return None;
            }
            let charge = Charge {
                device,
                milli: cost.milli,
                memory_mib: cost.memory_mib,
            };
            trial.apply(charge, -1);
            charges.push(charge);
        }
        Some(charges)
    }

    /// Whether the node can take exactly these charges now (and has no deficit).
    pub fn can_take(&self, charges: &[Charge]) -> bool {
        if !self.deficit.is_empty() {
            return false;
        }
        let mut trial = self.free.clone();
        charges.iter().all(|c| {
            let d = usize::from(c.device);
            let fits = d < trial.milli.len()
                && trial.milli[d] >= c.milli
                && trial.memory[d] >= c.memory_mib
                && trial.slots[d] > 0;
            if fits {
                trial.apply(*c, -1);
            }
            fits
        })
    }

    /// Seats `pod` on its charges, with its CPU and memory.
    pub fn seat(&mut self, pod: PodId, charges: &[Charge], cpu: i64, memory: i64) {
        for c in charges {
            self.free.apply(*c, -1);
        }
        self.cpu_free -= cpu;
        self.memory_free -= memory;
        self.pods.push(pod);
    }

    /// Frees what `pod` holds: its charges, CPU and memory.
    pub fn unseat(&mut self, pod: PodId, charges: &[Charge], cpu: i64, memory: i64) {
        for c in charges {
            self.free.apply(*c, 1);
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

    /// For one GPU request that takes memory of each device: the MiB one unit takes, and the
    /// most one device of its pool has free. `None` when the node has no such pool, the unit
    /// takes no memory, or the pool's memory is unknown.
    pub fn device_memory_room(&self, gpu: &ResolvedGpu) -> Option<(u64, u64)> {
        let pool = self.pool(gpu.resource)?;
        let cost = unit_cost(pool, gpu);
        if cost.memory_mib == 0 {
            return None;
        }
        let most = self.free.memory[pool.devices()]
            .iter()
            .copied()
            .filter(|m| *m != u32::MAX)
            .max()?;
        Some((u64::from(cost.memory_mib), u64::from(most)))
    }

    /// For one GPU request: the most of it the node could give now, and its idle capacity of
    /// that resource, milli. `None` when the node has no such pool.
    pub fn room_for(&self, gpu: &ResolvedGpu) -> Option<(u64, u64)> {
        let pool = self.pool(gpu.resource)?;
        let fitting = units_fitting(pool, &self.free, gpu).min(usize::from(gpu.count)) as u64;
        let units = u64::from(pool.sharing.units_per_device());
        let idle = self
            .pool_free(pool)
            .iter()
            .map(|f| u64::from(*f))
            .sum::<u64>()
            * units;
        Some((fitting * u64::from(gpu.milli), idle))
    }
}

/// A node's free devices, CPU and memory copied out, to try releasing seated pods on (a
/// reclaim's victims) without changing the node.
#[derive(Clone, Debug, Default)]
pub(crate) struct Trial {
    pub free: DeviceFree,
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
        self.free.clone_from(&n.free);
        self.cpu = n.cpu_free;
        self.memory = n.memory_free;
    }

    /// Gives back (`sign` = 1) or takes again (`sign` = -1) a pod's charges, CPU and memory.
    pub fn release(&mut self, charges: &[Charge], cpu: i64, memory: i64, sign: i8) {
        for c in charges {
            self.free.apply(*c, sign);
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

/// The lowest-numbered devices of `free` that fit each of `gpus`, into `out` (units that may
/// share a device fill it before the next). False when one does not fit.
fn lowest_fitting(
    layout: &[PoolLayout],
    free: &DeviceFree,
    gpus: &[ResolvedGpu],
    out: &mut Vec<Charge>,
) -> bool {
    for g in gpus {
        let Some(pool) = layout.iter().find(|p| p.resource == g.resource) else {
            return false;
        };
        let cost = unit_cost(pool, g);
        let mut wanted = g.count;
        for d in pool.start..pool.start + pool.len {
            let i = usize::from(d);
            let (mut milli, mut memory, mut slots) = (free.milli[i], free.memory[i], free.slots[i]);
            while wanted > 0 && milli >= cost.milli && memory >= cost.memory_mib && slots > 0 {
                out.push(Charge {
                    device: d,
                    milli: cost.milli,
                    memory_mib: cost.memory_mib,
                });
                wanted -= 1;
                if !cost.may_repeat {
                    break;
                }
                milli -= cost.milli;
                memory -= cost.memory_mib;
                slots -= 1;
            }
            if wanted == 0 {
                break;
            }
        }
        if wanted > 0 {
            return false;
        }
    }
    true
}

/// How many units of `gpu` the pool's devices could take now.
fn units_fitting(pool: &PoolLayout, free: &DeviceFree, gpu: &ResolvedGpu) -> usize {
    let cost = unit_cost(pool, gpu);
    pool.devices()
        .map(|d| {
            if !free.fits(d, cost) {
                return 0;
            }
            if !cost.may_repeat {
                return 1;
            }
            let by_milli = free.milli[d] / cost.milli.max(1);
            let by_memory = free.memory[d]
                .checked_div(cost.memory_mib)
                .unwrap_or(u32::MAX);
            usize::from(by_milli.min(free.slots[d]))
                .min(usize::try_from(by_memory).unwrap_or(usize::MAX))
        })
        .sum()
}

/// A node's state: as it is, or as it would be after a placement.
#[derive(Clone, Copy, Debug)]
pub struct NodeView<'a> {
    pub(crate) node: &'a Node,
    pub(crate) layout: &'a [PoolLayout],
    pub(crate) free: &'a [u16],
    /// Free memory of every device, MiB (`u32::MAX` where unknown).
    pub(crate) free_memory: &'a [u32],
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

    /// Free memory of every device, MiB, in device order (`u32::MAX` where unknown).
    pub fn gpu_free_memory(&self) -> &[u32] {
        self.free_memory
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
        let enough_devices = self.gpus.iter().all(|g| {
            n.pool(g.resource).is_some_and(|p| {
                let cost = unit_cost(p, g);
                let units = if cost.may_repeat {
                    u32::from(p.len) * p.sharing.units_per_device()
                } else {
                    u32::from(p.len)
                };
                let memory_fits = p.memory_mib.is_none_or(|m| u64::from(cost.memory_mib) <= m);
                units >= u32::from(g.count) && memory_fits
            })
        });
        // A pod without rules tolerates no taint (kube-scheduler's filter applies to every pod).
        enough_devices
            && self.pod.node_rules.as_ref().map_or_else(
                || tolerates_all(&[], &n.node.taints),
                |r| r.admits(&n.node.name, &n.node.labels, &n.node.taints),
            )
    }

    /// Whether free devices, CPU and memory as given have room for the pod.
    pub fn has_room(
        &self,
        layout: &[PoolLayout],
        free: &DeviceFree,
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
                .is_some_and(|pool| units_fitting(pool, free, g) >= usize::from(g.count))
        })
    }

    /// The pool of a shared request, when the request is one.
    pub fn shared_pool<'n>(&self, n: &'n NodeState) -> Option<&'n PoolLayout> {
        if self.shared_milli == 0 {
            return None;
        }
        n.pool(self.gpus[0].resource)
            .filter(|p| p.sharing == Sharing::Exclusive)
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
        free: &DeviceFree,
        shared: Option<u16>,
        out: &mut Vec<Charge>,
    ) -> bool {
        out.clear();
        if let Some(device) = shared {
            let Some(pool) = layout.iter().find(|p| p.holds(device)) else {
                return false;
            };
            let cost = unit_cost(pool, &self.gpus[0]);
            out.push(Charge {
                device,
                milli: cost.milli,
                memory_mib: cost.memory_mib,
            });
            return free.fits(usize::from(device), cost);
        }
        lowest_fitting(layout, free, &self.gpus, out)
    }
}
