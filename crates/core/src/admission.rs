//! Admission: for each pod waiting at the gate, admit it (within its guarantee, or as a
//! borrower of idle capacity), plan a reclaim for it, or say why it waits.
//!
//! A pod whose queue stays within its guarantee is admitted wherever it fits; when nothing
//! fits because borrowers hold the room, a reclaim is planned. A pod that takes its queue
//! above its guarantee borrows: only up to the queue's ceiling (guaranteed + burstable), only
//! from capacity that is idle and may be lent (other queues' never-lent part stays free), and
//! not while the queue is cooling down after a reclaim took GPUs from it (`minBorrowDuration`).
//!
//! [`admission_cycle`] decides every pending pod in a fair order and applies each decision to
//! the snapshot before the next, so no two decisions count on the same capacity: pods within
//! their guarantee first, then borrowers by their queue's weighted share of borrowed capacity
//! (lowest first), then pod priority, then age (Kueue's BestEffortFIFO: a pod that waits does
//! not block the pods behind it).

use std::fmt;

use jiff::{SignedDuration, Timestamp};

use crate::burst;
use crate::caps::{CapBlock, cap_filter};
use crate::devices::{NodeState, Placement, Request};
use crate::ids::{NodeId, PodId, QueueId, ResourceId};
use crate::ledger::ResourceUsage;
use crate::model::{AdmittedAs, Pod, PodKey};
use crate::policy::Policy;
use crate::quantity::{Milli, ResourceName};
use crate::reclaim::{NoPlan, ReclaimPlan, plan_reclaim};
use crate::snapshot::{Attribution, Snapshot};

/// What to do with a pending pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Pin the pod to the node and release its gate.
    Admit(Admission),
    /// Evict the plan's victims for the pod (pin and release it at once: it binds when they
    /// are gone).
    Reclaim(ReclaimPlan),
    /// Leave the pod at the gate, and say why.
    Wait(Wait),
}

impl Decision {
    pub fn pod(&self) -> PodId {
        match self {
            Self::Admit(a) => a.pod,
            Self::Reclaim(p) => p.owner,
            Self::Wait(w) => w.pod,
        }
    }

    pub fn key(&self) -> &PodKey {
        match self {
            Self::Admit(a) => &a.key,
            Self::Reclaim(p) => &p.owner_key,
            Self::Wait(w) => &w.key,
        }
    }
}

/// A pod to admit.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    pub pod: PodId,
    pub key: PodKey,
    pub queue: String,
    pub placement: Placement,
    pub admitted_as: AdmittedAs,
}

/// A pod that waits.
#[derive(Clone, Debug, PartialEq)]
pub struct Wait {
    pub pod: PodId,
    pub key: PodKey,
    /// Its queue, when one claims it.
    pub queue: Option<String>,
    pub reason: WaitReason,
}

/// Why a pod waits. `Display` gives the one line a person reads (on the pod's event and in
/// `kubectl gpuqueue explain`); [`WaitReason::code`] a stable `PascalCase` reason.
#[derive(Clone, Debug, PartialEq)]
pub enum WaitReason {
    /// No queue claims the pod's namespace.
    NoQueue { namespace: String },
    /// Several queues claim the namespace.
    NamespaceConflict {
        namespace: String,
        queues: Vec<String>,
    },
    /// The pod's requests are malformed.
    InvalidRequest { rule: String },
    /// The pod owns a reclaim under way; the reclaim executor admits it.
    ReclaimInProgress { id: String },
    /// The queue lists no quota for a resource the pod requests.
    NoQuota {
        queue: String,
        resource: ResourceName,
    },
    /// The pod would take the queue above guaranteed + burstable.
    OverCeiling {
        queue: String,
        resource: ResourceName,
        allocated: Milli,
        requested: Milli,
        guaranteed: Milli,
        burstable: Milli,
    },
    /// The queue was reclaimed from recently and may not borrow yet.
    BorrowCooldown { queue: String, until: Timestamp },
    /// The pod must borrow, but not enough capacity is idle and lendable.
    NoIdleCapacity {
        queue: String,
        resource: ResourceName,
        allocated: Milli,
        requested: Milli,
        guaranteed: Milli,
        idle: Milli,
    },
    /// No node offers the pod's devices within the queue's GPU memory cap.
    GpuMemoryCap {
        queue: String,
        resource: ResourceName,
        used_mib: u64,
        cap_mib: u64,
    },
    /// No node offers the pod's devices within the queue's GPU compute cap (`gpuCores`).
    GpuCoresCap {
        queue: String,
        resource: ResourceName,
        /// Percent of one device, summed.
        used_percent: u64,
        cap_percent: u64,
    },
    /// Quota allows the pod but no node has room for it (and, within the guarantee, no
    /// reclaim can make room).
    NoRoom {
        queue: String,
        admitted_as: AdmittedAs,
        resource: Option<ResourceName>,
        requested: Milli,
        /// The most the pod could get on one suitable node.
        largest_free: Milli,
        /// Free on all suitable nodes together.
        idle: Milli,
        /// Set when the pod asks more GPU memory of a device than any device of a suitable
        /// node has free (boxed: rare, and it keeps the reason small).
        memory: Option<Box<MemoryShortfall>>,
        reclaim: Option<NoPlan>,
    },
}

/// GPU memory one unit of a request asks of a device, and the most one device of a suitable
/// node has free (less), for `NoRoom`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryShortfall {
    pub asked_mib: u64,
    pub most_free_mib: u64,
}

impl WaitReason {
    /// When this reason ends by itself, with nothing else changing (a borrowing cool-down).
    pub fn expires_at(&self) -> Option<Timestamp> {
        match self {
            Self::BorrowCooldown { until, .. } => Some(*until),
            _ => None,
        }
    }

    /// A stable `PascalCase` reason for events and conditions.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NoQueue { .. } => "NoQueue",
            Self::NamespaceConflict { .. } => "NamespaceConflict",
            Self::InvalidRequest { .. } => "InvalidRequest",
            Self::ReclaimInProgress { .. } => "ReclaimInProgress",
            Self::NoQuota { .. } => "NoQuota",
            Self::OverCeiling { .. } => "OverCeiling",
            Self::BorrowCooldown { .. } => "BorrowCooldown",
            Self::NoIdleCapacity { .. } => "NoIdleCapacity",
            Self::GpuMemoryCap { .. } => "GpuMemoryCap",
            Self::GpuCoresCap { .. } => "GpuCoresCap",
            Self::NoRoom { .. } => "NoRoom",
        }
    }

    /// Whether the cause is one that only the pod's owner or a cluster admin can remove (no
    /// queue, conflicting claims, an invalid request, no quota), rather than one that passes as
    /// capacity frees: the operator announces the first kind as a warning.
    pub fn needs_action(&self) -> bool {
        matches!(
            self,
            Self::InvalidRequest { .. }
                | Self::NamespaceConflict { .. }
                | Self::NoQuota { .. }
                | Self::NoQueue { .. }
        )
    }

    /// The `NoRoom` line: what the pod asks for, what the best node has, and why no reclaim.
    fn fmt_no_room(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self::NoRoom {
            queue,
            admitted_as,
            resource,
            requested,
            largest_free,
            idle,
            memory,
            reclaim,
        } = self
        else {
            return Ok(());
        };
        let what = resource.as_ref().map_or_else(
            || "its CPU and memory".to_string(),
            |r| format!("{requested} {r}"),
        );
        write!(
            f,
            "queue {queue}: quota allows the pod ({admitted_as}), but no node has room for {what}"
        )?;
        if resource.is_some() {
            write!(
                f,
                " (the most free on one suitable node is {largest_free}; {idle} idle on suitable nodes)"
            )?;
        }
        if let Some(shortfall) = memory {
            let MemoryShortfall {
                asked_mib,
                most_free_mib,
            } = **shortfall;
            write!(
                f,
                "; no device has the {asked_mib} MiB of GPU memory it asks free (the most on one device is {most_free_mib} MiB)"
            )?;
        }
        match reclaim {
            Some(reason @ NoPlan::ViewBehind) => {
                write!(f, "; a reclaim would make room, but not yet: {reason}")?;
            }
            Some(reason) => write!(f, "; no reclaim possible: {reason}")?,
            None => {}
        }
        Ok(())
    }
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoQueue { namespace } => {
                write!(f, "namespace {namespace} is claimed by no GpuQueue")
            }
            Self::NamespaceConflict { namespace, queues } => write!(
                f,
                "namespace {namespace} is claimed by several GpuQueues ({}); nothing there is admitted until only one claims it",
                queues.join(", ")
            ),
            Self::InvalidRequest { rule } => write!(f, "the pod's request is invalid: {rule}"),
            Self::ReclaimInProgress { id } => {
                write!(
                    f,
                    "reclaim {id} is freeing GPUs for this pod; it is admitted when they are free"
                )
            }
            Self::NoQuota { queue, resource } => {
                write!(f, "queue {queue} has no quota for {resource}")
            }
            Self::OverCeiling {
                queue,
                resource,
                allocated,
                requested,
                guaranteed,
                burstable,
            } => write!(
                f,
                "queue {queue}: {resource} allocated {allocated} + requested {requested} exceeds its ceiling of {} (guaranteed {guaranteed} + burstable {burstable})",
                *guaranteed + *burstable
            ),
            Self::BorrowCooldown { queue, until } => write!(
                f,
                "queue {queue}: a reclaim recently took GPUs from this queue; it may borrow again from {until} (minBorrowDuration)"
            ),
            Self::NoIdleCapacity {
                queue,
                resource,
                allocated,
                requested,
                guaranteed,
                idle,
            } => write!(
                f,
                "queue {queue}: {resource} allocated {allocated} + requested {requested} is above its guarantee of {guaranteed}, so the pod must borrow, but only {idle} is idle and lendable"
            ),
            Self::GpuMemoryCap {
                queue,
                resource,
                used_mib,
                cap_mib,
            } => write!(
                f,
                "queue {queue}: {resource} GPU memory in use is {used_mib} MiB of its cap of {cap_mib} MiB; no node offers the pod's devices within what is left"
            ),
            Self::GpuCoresCap {
                queue,
                resource,
                used_percent,
                cap_percent,
            } => write!(
                f,
                "queue {queue}: {resource} GPU compute in use is {used_percent}% of its gpuCores cap of {cap_percent}%; no node offers the pod's devices within what is left"
            ),
            Self::NoRoom { .. } => self.fmt_no_room(f),
        }
    }
}

/// Decides one pending pod at `now`, without changing the snapshot.
pub fn decide(snapshot: &Snapshot, pod: PodId, policy: &Policy, now: Timestamp) -> Decision {
    match check(snapshot, pod, policy, now) {
        Ok(decision) => decision,
        Err(reason) => {
            let slot = snapshot.slot(pod);
            let queue = slot.and_then(|s| match s.attribution {
                Attribution::Queue(q) => Some(snapshot.queue(q).name.clone()),
                _ => None,
            });
            Decision::Wait(Wait {
                pod,
                key: slot.map_or_else(|| PodKey::new("", ""), |s| s.pod.key.clone()),
                queue,
                reason,
            })
        }
    }
}

fn check(
    snapshot: &Snapshot,
    pod: PodId,
    policy: &Policy,
    now: Timestamp,
) -> Result<Decision, WaitReason> {
    let slot = snapshot
        .slot(pod)
        .ok_or_else(|| WaitReason::InvalidRequest {
            rule: "the pod is gone".into(),
        })?;
    let queue = match &slot.attribution {
        Attribution::Queue(q) => *q,
        Attribution::Conflict { namespace, queues } => {
            return Err(WaitReason::NamespaceConflict {
                namespace: namespace.clone(),
                queues: queues.clone(),
            });
        }
        Attribution::Unclaimed => {
            return Err(WaitReason::NoQueue {
                namespace: slot.pod.key.namespace.clone(),
            });
        }
    };
    if let Some(mark) = &slot.pod.reclaim {
        return Err(WaitReason::ReclaimInProgress {
            id: mark.id.clone(),
        });
    }
    let name = snapshot.queue(queue).name.clone();
    let admitted_as = quota_check(snapshot, queue, &slot.amounts, now)?;
    let caps = cap_filter(snapshot, queue, pod);
    // A victim's replacement must not race the owners pinned on its node for the room.
    let borrower = admitted_as == AdmittedAs::Borrowed;
    let placement = policy.find_placement_where(snapshot, &slot.pod, &|node| {
        caps(node).is_none() && !(borrower && snapshot.is_closed_to_borrowers(node))
    });
    if let Some(placement) = placement {
        return Ok(Decision::Admit(Admission {
            pod,
            key: slot.pod.key.clone(),
            queue: name,
            placement,
            admitted_as,
        }));
    }
    if let Some(reason) = cap_reason(snapshot, queue, pod, &caps, Request::admits) {
        return Err(reason);
    }
    let reclaim = if admitted_as == AdmittedAs::Guaranteed {
        match plan_reclaim(snapshot, pod, now) {
            Ok(plan) => return Ok(Decision::Reclaim(plan)),
            Err(no) => Some(no),
        }
    } else {
        None
    };
    // A reclaim frees room only where the caps allow the pod: when they keep it off every node
    // it could take, they are why it waits, not the borrowers.
    if reclaim == Some(NoPlan::NoSuitableNode)
        && let Some(reason) = cap_reason(snapshot, queue, pod, &caps, Request::fits_statically)
    {
        return Err(reason);
    }
    let (resource, requested, largest_free, idle) = room(snapshot, pod);
    Err(WaitReason::NoRoom {
        queue: name,
        admitted_as,
        resource,
        requested,
        largest_free,
        idle,
        memory: memory_shortfall(snapshot, pod).map(Box::new),
        reclaim,
    })
}

/// Whether the queue's quota admits the request, and as what.
fn quota_check(
    snapshot: &Snapshot,
    queue: QueueId,
    amounts: &[(ResourceId, Milli)],
    now: Timestamp,
) -> Result<AdmittedAs, WaitReason> {
    let spec = snapshot.queue(queue);
    let name = &spec.name;
    let mut borrowing = Vec::new();
    for (resource, requested) in amounts {
        let Some(usage) = snapshot.usage_of(queue, *resource).filter(|u| u.in_spec) else {
            return Err(WaitReason::NoQuota {
                queue: name.clone(),
                resource: snapshot.resource_name(*resource).clone(),
            });
        };
        if usage.allocated + *requested > usage.ceiling() {
            return Err(WaitReason::OverCeiling {
                queue: name.clone(),
                resource: snapshot.resource_name(*resource).clone(),
                allocated: usage.allocated,
                requested: *requested,
                guaranteed: usage.guaranteed,
                burstable: usage.burstable,
            });
        }
        if usage.allocated + *requested > usage.guaranteed {
            borrowing.push((*resource, *requested, usage.allocated, usage.guaranteed));
        }
    }
    if borrowing.is_empty() {
        return Ok(AdmittedAs::Guaranteed);
    }
    if let (Some(floor), Some(at)) = (spec.reclaim.min_borrow, snapshot.last_reclaimed(queue))
        && let Some(until) = SignedDuration::try_from(floor)
            .ok()
            .and_then(|f| at.checked_add(f).ok())
        && now < until
    {
        return Err(WaitReason::BorrowCooldown {
            queue: name.clone(),
            until,
        });
    }
    for (resource, requested, allocated, guaranteed) in borrowing {
        let idle = idle_for_borrowing(snapshot, queue, resource);
        if requested > idle {
            return Err(WaitReason::NoIdleCapacity {
                queue: name.clone(),
                resource: snapshot.resource_name(resource).clone(),
                allocated,
                requested,
                guaranteed,
                idle,
            });
        }
    }
    Ok(AdmittedAs::Borrowed)
}

/// Capacity a queue may borrow: what no pod holds, less what other queues never lend.
pub fn idle_for_borrowing(snapshot: &Snapshot, queue: QueueId, resource: ResourceId) -> Milli {
    let reserved: Milli = snapshot
        .queue_ids()
        .filter(|q| *q != queue)
        .filter_map(|q| snapshot.usage_of(q, resource))
        .map(ResourceUsage::reserved_idle)
        .sum();
    snapshot
        .capacity(resource)
        .saturating_sub(snapshot.allocated(resource))
        .saturating_sub(reserved)
}

/// The memory or compute cap reason, when a cap is what keeps the pod off the nodes `on`
/// selects (those with room, or those it could ever take): memory if it is what blocks on
/// some node, else compute.
fn cap_reason<'s>(
    snapshot: &'s Snapshot,
    queue: QueueId,
    pod: PodId,
    caps: &dyn Fn(NodeId) -> Option<CapBlock>,
    on: fn(&Request<'s>, &NodeState) -> bool,
) -> Option<WaitReason> {
    let slot = snapshot.slot(pod)?;
    let request = snapshot.request(&slot.pod)?;
    let blocks: Vec<CapBlock> = snapshot
        .node_states()
        .filter(|(_, n)| on(&request, n))
        .filter_map(|(id, _)| caps(id))
        .collect();
    let block = blocks
        .iter()
        .find(|b| matches!(b, CapBlock::Memory(_)))
        .or(blocks.first())?;
    let name = snapshot.queue(queue).name.clone();
    Some(match *block {
        CapBlock::Memory(resource) => {
            let usage = snapshot.usage_of(queue, resource)?;
            WaitReason::GpuMemoryCap {
                queue: name,
                resource: snapshot.resource_name(resource).clone(),
                used_mib: usage.memory_mib,
                cap_mib: usage.memory_cap_mib?,
            }
        }
        CapBlock::Cores(resource) => {
            let usage = snapshot.usage_of(queue, resource)?;
            WaitReason::GpuCoresCap {
                queue: name,
                resource: snapshot.resource_name(resource).clone(),
                used_percent: usage.cores_milli / 10,
                cap_percent: usage.cores_cap_milli? / 10,
            }
        }
    })
}

/// For the pod's first GPU request: the resource, the request, the most of it one suitable
/// node could give now, and the idle capacity on suitable nodes.
fn room(snapshot: &Snapshot, pod: PodId) -> (Option<ResourceName>, Milli, Milli, Milli) {
    let Some(slot) = snapshot.slot(pod) else {
        return (None, Milli::ZERO, Milli::ZERO, Milli::ZERO);
    };
    let Some(gpu) = slot.gpus.first() else {
        return (None, Milli::ZERO, Milli::ZERO, Milli::ZERO);
    };
    let requested = Milli(u64::from(gpu.milli) * u64::from(gpu.count));
    let Some(request) = snapshot.request(&slot.pod) else {
        return (
            Some(snapshot.resource_name(gpu.resource).clone()),
            requested,
            Milli::ZERO,
            Milli::ZERO,
        );
    };
    let (mut largest, mut idle) = (0u64, 0u64);
    for (_, n) in snapshot.node_states() {
        if !request.fits_statically(n) || n.is_oversubscribed() {
            continue;
        }
        let Some((fitting, free)) = n.room_for(gpu) else {
            continue;
        };
        largest = largest.max(fitting);
        idle += free;
    }
    (
        Some(snapshot.resource_name(gpu.resource).clone()),
        requested,
        Milli(largest),
        Milli(idle),
    )
}

/// For the pod's first GPU request, when it asks more memory of one device than any device of
/// a suitable node has free: what it asks and the most one device has. Where no node is
/// suitable, every node with the pod's devices counts (an ask larger than any device).
fn memory_shortfall(snapshot: &Snapshot, pod: PodId) -> Option<MemoryShortfall> {
    let slot = snapshot.slot(pod)?;
    let gpu = slot.gpus.first()?;
    let request = snapshot.request(&slot.pod)?;
    let most = |suitable_only: bool| {
        snapshot
            .node_states()
            .filter(|(_, n)| !suitable_only || request.fits_statically(n))
            .filter_map(|(_, n)| n.device_memory_room(gpu))
            .reduce(|(a, m), (b, n)| (a.max(b), m.max(n)))
    };
    let (asked_mib, most_free_mib) = most(true).or_else(|| most(false))?;
    (most_free_mib < asked_mib).then_some(MemoryShortfall {
        asked_mib,
        most_free_mib,
    })
}

/// Whether the pod would keep its queue within its guarantee.
fn within_guarantee(snapshot: &Snapshot, pod: PodId) -> bool {
    let Some(slot) = snapshot.slot(pod) else {
        return false;
    };
    let Attribution::Queue(q) = slot.attribution else {
        return false;
    };
    slot.amounts.iter().all(|(r, amount)| {
        snapshot
            .usage_of(q, *r)
            .is_some_and(|u| u.allocated + *amount <= u.guaranteed)
    })
}

/// The earliest time a pod of `decisions` stops waiting by itself: a later pass must look
/// again then, though nothing in the cluster changes.
pub fn next_expiry(decisions: &[Decision]) -> Option<Timestamp> {
    decisions
        .iter()
        .filter_map(|decision| match decision {
            Decision::Wait(wait) => wait.reason.expires_at(),
            _ => None,
        })
        .min()
}

/// Decides every pending pod in fair order, applying each decision to `snapshot` before the
/// next: admitted pods hold their room, a reclaim's victims are marked and its owner is
/// pinned to the node (as the node's deficit until the victims are gone). The owners of a
/// burst are planned in this one cycle: several may share a node, counting the room its
/// earlier victims free, with victims disjoint and minimal as a set ([`crate::burst`]).
pub fn admission_cycle(snapshot: &mut Snapshot, policy: &Policy, now: Timestamp) -> Vec<Decision> {
    let mut per_queue: Vec<Vec<PodId>> = vec![Vec::new(); snapshot.queue_count()];
    let mut unqueued = Vec::new();
    for pod in snapshot.pending_pods().collect::<Vec<_>>() {
        match snapshot.pod_queue(pod) {
            Some(q) => per_queue[q.index()].push(pod),
            None => unqueued.push(pod),
        }
    }
    for pods in &mut per_queue {
        // Reversed so that `pop` yields the highest priority, then the oldest.
        pods.sort_by(|a, b| {
            let (a, b) = (snapshot.pod(*a), snapshot.pod(*b));
            let key = b.map(|p| (std::cmp::Reverse(p.priority), p.created_at, &p.key));
            key.cmp(&a.map(|p| (std::cmp::Reverse(p.priority), p.created_at, &p.key)))
        });
    }
    // Each queue's head and its rank. A decision changes only its own queue's usage, so only
    // that queue's rank is recomputed after it: a cycle over many pending pods stays linear.
    let mut ranks: Vec<Option<HeadRank>> = (0..per_queue.len())
        .map(|q| head_rank(snapshot, q, &per_queue[q]))
        .collect();
    let mut decisions = Vec::new();
    loop {
        let next = ranks
            .iter()
            .enumerate()
            .filter_map(|(q, rank)| rank.as_ref().map(|r| (r, q)))
            .min_by(|(a, _), (b, _)| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        let Some((_, q)) = next else { break };
        let Some(pod) = per_queue[q].pop() else { break };
        let decision = apply(snapshot, decide(snapshot, pod, policy, now), now);
        let burst_node = match &decision {
            Decision::Reclaim(plan) => Some(plan.node),
            _ => None,
        };
        decisions.push(decision);
        if let Some(node) = burst_node {
            keep_burst_minimal(snapshot, node, &mut decisions);
        }
        ranks[q] = head_rank(snapshot, q, &per_queue[q]);
    }
    unqueued.sort_by_key(|p| snapshot.pod(*p).map(|p| p.key.clone()));
    for pod in unqueued {
        decisions.push(decide(snapshot, pod, policy, now));
    }
    decisions
}

/// The owners of a burst share a node: its victims are kept minimal as a set (see
/// [`crate::burst`]), over this cycle's reclaims there.
fn keep_burst_minimal(snapshot: &mut Snapshot, node: NodeId, decisions: &mut [Decision]) {
    let mut plans: Vec<&mut ReclaimPlan> = decisions
        .iter_mut()
        .filter_map(|d| match d {
            Decision::Reclaim(plan) if plan.node == node => Some(plan),
            _ => None,
        })
        .collect();
    if plans.len() > 1 {
        burst::keep_minimal(snapshot, node, &mut plans);
    }
}

/// Why a pod is not admitted at its creation (it goes to the gate and the next cycle decides).
#[derive(Clone, Debug, PartialEq)]
pub enum NotAtCreation {
    /// Other pods wait: the fair order of [`admission_cycle`] must choose among them and it.
    OthersWait,
    /// The pod does not fit as it is: it would wait or need a reclaim.
    Decided(Box<Decision>),
    /// The snapshot refused the pod (a duplicate key, an invalid request).
    Refused(String),
}

/// Admission at creation: decides a pod the API server is about to create. It is admitted only
/// when no pod waits, so it overtakes no one (the fair order has nobody to put before it), and
/// only if it fits as it is: the snapshot then holds it as admitted. Otherwise the snapshot is
/// left as it was and the pod goes to the gate like any other.
pub fn admit_at_creation(
    snapshot: &mut Snapshot,
    pod: Pod,
    policy: &Policy,
    now: Timestamp,
) -> Result<Admission, NotAtCreation> {
    if snapshot.pending_pods().next().is_some() {
        return Err(NotAtCreation::OthersWait);
    }
    let id = snapshot
        .add_pod(pod)
        .map_err(|error| NotAtCreation::Refused(error.to_string()))?;
    // Only an admission is applied: a reclaim would mark victims, a wait changes nothing.
    let decision = match decide(snapshot, id, policy, now) {
        admit @ Decision::Admit(_) => apply(snapshot, admit, now),
        other => other,
    };
    match decision {
        Decision::Admit(admission) => Ok(admission),
        other => {
            snapshot.remove_pod(id);
            Err(NotAtCreation::Decided(Box::new(other)))
        }
    }
}

/// Fair order of queue heads (lowest first): pods within their guarantee, then by the queue's
/// weighted borrowing share, pod priority (highest first), age, key.
type HeadRank = (u8, f64, i64, Timestamp, PodKey);

/// The rank of a queue's next pod (the last of `pods`), if any.
fn head_rank(snapshot: &Snapshot, queue: usize, pods: &[PodId]) -> Option<HeadRank> {
    let head = *pods.last()?;
    let pod = snapshot.pod(head)?;
    let guaranteed = within_guarantee(snapshot, head);
    let share = if guaranteed {
        0.0
    } else {
        snapshot.borrowing_share(QueueId::at(queue))
    };
    Some((
        u8::from(!guaranteed),
        share,
        -i64::from(pod.priority),
        pod.created_at,
        pod.key.clone(),
    ))
}

/// Applies a decision to the snapshot; a decision the snapshot refuses becomes a wait.
pub fn apply(snapshot: &mut Snapshot, decision: Decision, now: Timestamp) -> Decision {
    let result = match &decision {
        Decision::Admit(a) => snapshot.admit(a.pod, &a.placement, a.admitted_as, now),
        Decision::Reclaim(plan) => {
            let id = format!("planned-for-{}", plan.owner_key);
            for v in &plan.victims {
                snapshot.mark_victim(v.pod, &id);
            }
            snapshot.admit_pinned(plan.owner, plan.node, AdmittedAs::Guaranteed, now)
        }
        Decision::Wait(_) => Ok(()),
    };
    match result {
        Ok(()) => {
            match &decision {
                Decision::Admit(a) => {
                    tracing::debug!(pod = %a.key, queue = %a.queue, node = %a.placement.node_name, admitted_as = %a.admitted_as, "admit");
                }
                Decision::Reclaim(plan) => {
                    tracing::debug!(pod = %plan.owner_key, victims = plan.victims.len(), "{plan}");
                }
                Decision::Wait(w) => {
                    tracing::debug!(pod = %w.key, reason = w.reason.code(), "wait: {}", w.reason);
                }
            }
            decision
        }
        Err(e) => Decision::Wait(Wait {
            pod: decision.pod(),
            key: decision.key().clone(),
            queue: None,
            reason: WaitReason::InvalidRequest {
                rule: e.to_string(),
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_causes_that_capacity_cannot_remove_need_action() {
        let needs = |reason: WaitReason| reason.needs_action();
        assert!(needs(WaitReason::NoQueue {
            namespace: "ns".into()
        }));
        assert!(needs(WaitReason::InvalidRequest { rule: "x".into() }));
        assert!(!needs(WaitReason::ReclaimInProgress { id: "r".into() }));
    }
}
