//! The quota ledger: per queue and resource, what is guaranteed, allocated, borrowed, lent and
//! pending, and which admitted pods are the borrowers.
//!
//! Borrowers are chosen deterministically. **The borrowed share of a queue is its least
//! protected pods, taken until the borrowed amount is covered; a pod that straddles the line
//! (part of it within the guarantee, part above) is a borrower.** Least protected means: pods
//! being deleted first (they are leaving: a reclaim waits for them rather than evict a running
//! pod their queue will need once they are gone), then unadmitted pods (they hold quota without
//! passing admission), then lowest priority, then most recently admitted, then name.
//!
//! **Pods reserved at creation that the store has not shown yet are never borrowers, and do not
//! make one.** Their creates may still fail after the webhook answered (another admission
//! plugin refuses the pod), so the borrowed amount the real pods are marked for is what they
//! hold above the guarantee by themselves: otherwise a reclaim could evict a queue that is
//! within its guarantee (the soak caught it: an API server whose policies had not synced refused
//! three pods the webhook had reserved, and a real pod was evicted as a borrower). The price:
//! an owner that needs the room of a reservation waits until the pod shows (milliseconds) or the
//! reservation expires.
//!
//! Why the straddler is a borrower: otherwise a queue that borrows with pods bigger than what
//! it borrows (guarantee 20, two pods of 6 GPUs on top) has no borrower at all and keeps the
//! borrowed GPUs for good (issue 13, case 8), which breaks the owner's guarantee. The price is
//! the other way round and bounded: evicting every borrower may take a queue below its
//! guarantee by less than one pod (the straddler's part within the guarantee). That queue is
//! then within its guarantee again and gets the room back by the same rule, and a straddler is
//! chosen only when the owner needs it (reclaim plans are minimal).

use std::{cmp::Ordering, collections::BTreeSet, sync::Arc};

use jiff::Timestamp;

use crate::ids::{PodId, ResourceId};
use crate::model::{Pod, Queue};
use crate::quantity::Milli;

/// One queue's numbers for one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceUsage {
    pub(crate) resource: ResourceId,
    pub guaranteed: Milli,
    pub burstable: Milli,
    /// The part of guaranteed that may be lent.
    pub lendable: Milli,
    /// Held by admitted pods (running, pinned or terminating).
    pub allocated: Milli,
    /// Requested by pods waiting at the gate.
    pub pending: Milli,
    /// GPU memory held by admitted pods, MiB (on nodes that report device memory).
    pub memory_mib: u64,
    /// The queue's cap on GPU memory of this resource, MiB.
    pub memory_cap_mib: Option<u64>,
    /// GPU compute held by admitted pods, milli of a device (a time-sliced replica holds
    /// `1000/replicas`: a shared device counts once).
    pub cores_milli: u64,
    /// The queue's cap on GPU compute of this resource, milli of a device.
    pub cores_cap_milli: Option<u64>,
    /// Whether the queue's spec lists this resource (pods may use resources it does not).
    pub in_spec: bool,
}

impl ResourceUsage {
    /// The resource these numbers are for.
    pub fn resource(&self) -> ResourceId {
        self.resource
    }

    /// guaranteed + burstable.
    pub fn ceiling(&self) -> Milli {
        self.guaranteed + self.burstable
    }

    /// Allocated above guaranteed.
    pub fn borrowed(&self) -> Milli {
        self.allocated.saturating_sub(self.guaranteed)
    }

    /// Guaranteed capacity this queue does not use.
    pub fn idle_guarantee(&self) -> Milli {
        self.guaranteed.saturating_sub(self.allocated)
    }

    /// Idle guaranteed capacity that may be lent.
    pub fn idle_lendable(&self) -> Milli {
        self.idle_guarantee().min(self.lendable)
    }

    /// Idle guaranteed capacity that must stay free for this queue (never lent).
    pub fn reserved_idle(&self) -> Milli {
        self.idle_guarantee().saturating_sub(self.lendable)
    }
}

/// Orders a queue's admitted pods from the least protected to the most: being deleted, then
/// unadmitted, then lowest priority, then most recently admitted, then name (descending), and
/// pods reserved at creation but not seen yet last, so iteration yields borrowers first.
#[derive(Clone, Debug)]
pub(crate) struct Protection {
    /// Reserved at creation and not seen yet: last, so the real pods are iterated first; it is
    /// neither a borrower nor counted towards what the real ones borrow.
    pub reserved_unseen: bool,
    /// Being deleted: it leaves whatever a reclaim decides.
    pub terminating: bool,
    /// Admitted by gpuqueue (`false` for an unadmitted pod, which is the least protected).
    pub recorded: bool,
    pub priority: i32,
    pub since: Timestamp,
    /// The pod, for its key (shared with its slot, not a copy of the key per member).
    pub pod: Arc<Pod>,
    pub id: PodId,
}

impl PartialEq for Protection {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Protection {}

impl Ord for Protection {
    fn cmp(&self, other: &Self) -> Ordering {
        self.reserved_unseen
            .cmp(&other.reserved_unseen)
            .then_with(|| other.terminating.cmp(&self.terminating))
            .then_with(|| self.recorded.cmp(&other.recorded))
            .then_with(|| self.priority.cmp(&other.priority))
            .then_with(|| other.since.cmp(&self.since))
            .then_with(|| other.pod.key.cmp(&self.pod.key))
            .then_with(|| self.id.cmp(&other.id))
    }
}

impl PartialOrd for Protection {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A queue in the snapshot: its spec and its ledger.
#[derive(Clone, Debug)]
pub(crate) struct QueueState {
    pub queue: Queue,
    /// One entry per resource the spec lists or the queue's pods use, sorted by resource id.
    pub usage: Vec<ResourceUsage>,
    /// Admitted pods, least protected first.
    pub members: BTreeSet<Protection>,
    pub admitted_pods: u32,
    pub pending_pods: u32,
    /// Namespaces this queue claims that another queue claims too.
    pub conflicts: Vec<(String, Vec<String>)>,
}

impl QueueState {
    pub fn new(
        queue: Queue,
        mut resource_id: impl FnMut(&crate::quantity::ResourceName) -> ResourceId,
    ) -> Self {
        let mut usage: Vec<ResourceUsage> = queue
            .quotas
            .iter()
            .map(|q| ResourceUsage {
                resource: resource_id(&q.resource),
                guaranteed: q.guaranteed,
                burstable: q.burstable,
                lendable: q.lendable(),
                allocated: Milli::ZERO,
                pending: Milli::ZERO,
                memory_mib: 0,
                memory_cap_mib: q.gpu_memory_mib,
                cores_milli: 0,
                cores_cap_milli: q.gpu_cores_milli,
                in_spec: true,
            })
            .collect();
        usage.sort_by_key(|u| u.resource);
        Self {
            queue,
            usage,
            members: BTreeSet::new(),
            admitted_pods: 0,
            pending_pods: 0,
            conflicts: Vec::new(),
        }
    }

    /// Charges (`sign` = 1) or refunds (`sign` = -1) a pod's requests: as allocated when it
    /// is admitted (`protection` is then its place among the members), else as pending.
    pub fn charge(
        &mut self,
        amounts: &[(ResourceId, Milli)],
        protection: Option<Protection>,
        sign: i8,
    ) {
        let admitted = protection.is_some();
        for (resource, amount) in amounts {
            let usage = self.usage_mut(*resource);
            let value = if admitted {
                &mut usage.allocated
            } else {
                &mut usage.pending
            };
            *value = signed_add(*value, *amount, sign);
        }
        let counter = if admitted {
            &mut self.admitted_pods
        } else {
            &mut self.pending_pods
        };
        *counter = if sign > 0 {
            *counter + 1
        } else {
            counter.saturating_sub(1)
        };
        if let Some(p) = protection {
            if sign > 0 {
                self.members.insert(p);
            } else {
                self.members.remove(&p);
            }
        }
    }

    /// The usage entry of `resource`, created with a zero quota when the spec does not list it.
    pub fn usage_mut(&mut self, resource: ResourceId) -> &mut ResourceUsage {
        let at = match self.usage.binary_search_by_key(&resource, |u| u.resource) {
            Ok(at) => at,
            Err(at) => {
                self.usage.insert(
                    at,
                    ResourceUsage {
                        resource,
                        guaranteed: Milli::ZERO,
                        burstable: Milli::ZERO,
                        lendable: Milli::ZERO,
                        allocated: Milli::ZERO,
                        pending: Milli::ZERO,
                        memory_mib: 0,
                        memory_cap_mib: None,
                        cores_milli: 0,
                        cores_cap_milli: None,
                        in_spec: false,
                    },
                );
                at
            }
        };
        &mut self.usage[at]
    }

    /// The usage of `resource`; `None` when neither the spec nor any pod names it.
    pub fn usage(&self, resource: ResourceId) -> Option<&ResourceUsage> {
        self.usage
            .binary_search_by_key(&resource, |u| u.resource)
            .ok()
            .map(|at| &self.usage[at])
    }

    /// The queue's borrowing share: the largest fraction of a resource's capacity it holds
    /// above its guarantee, divided by its weight. Idle capacity goes to the lowest share.
    pub fn borrowing_share(&self, capacity: impl Fn(ResourceId) -> Milli) -> f64 {
        let share = self
            .usage
            .iter()
            .map(|u| {
                let cap = capacity(u.resource).0.max(1);
                #[allow(clippy::cast_precision_loss)]
                let s = u.borrowed().0 as f64 / cap as f64;
                s
            })
            .fold(0.0, f64::max);
        share / f64::from(self.queue.weight.max(1))
    }

    /// The borrower pods: see the module documentation. `requests(id)` gives a pod's GPU
    /// requests by resource.
    pub fn borrowers<'a>(
        &self,
        requests: impl Fn(PodId) -> &'a [(ResourceId, Milli)],
    ) -> Vec<PodId> {
        let over: Vec<(ResourceId, Milli)> = self
            .usage
            .iter()
            .filter(|u| u.borrowed() > Milli::ZERO)
            .map(|u| (u.resource, u.borrowed()))
            .collect();
        if over.is_empty() {
            return Vec::new();
        }
        let mut room = over;
        // A reservation the store has not shown may never exist (its create can fail after the
        // webhook answered): the real pods are borrowers only for what they hold above the
        // guarantee by themselves, or a reclaim could evict a queue within its guarantee.
        for member in self.members.iter().rev().take_while(|m| m.reserved_unseen) {
            take_off(&mut room, requests(member.id));
        }
        room.retain(|(_, left)| *left > Milli::ZERO);
        let mut borrowers = Vec::new();
        for member in self.members.iter().take_while(|m| !m.reserved_unseen) {
            if room.is_empty() {
                break;
            }
            let wants = requests(member.id);
            if !covers_some(wants, &room) {
                continue;
            }
            take_off(&mut room, wants);
            borrowers.push(member.id);
            if room.iter().all(|(_, left)| *left == Milli::ZERO) {
                break;
            }
        }
        borrowers
    }

    /// The victims of reclaims in flight that are not evicted yet (`pending`), each with whether
    /// it still lies in the queue's borrowed part: see [`crate::reclaim::pending_victims`].
    /// What the queue keeps is what its admitted pods hold, less the pods being deleted (they
    /// leave anyway) and the reservations not seen yet (they may never exist); the pending
    /// victims are then taken from it least protected first, each while some of what it holds
    /// still lies above the guarantee (the straddler rule of [`Self::borrowers`]).
    pub fn judge_victims<'a>(
        &self,
        requests: impl Fn(PodId) -> &'a [(ResourceId, Milli)],
        pending: impl Fn(PodId) -> bool,
    ) -> Vec<(PodId, bool)> {
        let mut room: Vec<(ResourceId, Milli)> = self
            .usage
            .iter()
            .map(|u| (u.resource, u.borrowed()))
            .collect();
        for member in self
            .members
            .iter()
            .filter(|m| m.terminating || m.reserved_unseen)
        {
            take_off(&mut room, requests(member.id));
        }
        room.retain(|(_, left)| *left > Milli::ZERO);
        let mut judged = Vec::new();
        for member in self
            .members
            .iter()
            .filter(|m| !m.terminating && !m.reserved_unseen && pending(m.id))
        {
            let wants = requests(member.id);
            let borrowed = covers_some(wants, &room);
            if borrowed {
                take_off(&mut room, wants);
            }
            judged.push((member.id, borrowed));
        }
        judged
    }
}

/// Whether a pod asking `wants` lies in what is still uncovered of the borrowed `room`: it is
/// made entirely of resources the queue borrows, and covers some of what is left (the straddler
/// is one of them).
fn covers_some(wants: &[(ResourceId, Milli)], room: &[(ResourceId, Milli)]) -> bool {
    !wants.is_empty()
        && wants
            .iter()
            .all(|(resource, _)| room.iter().any(|(r, _)| r == resource))
        && wants.iter().any(|(resource, _)| {
            room.iter()
                .any(|(r, left)| r == resource && *left > Milli::ZERO)
        })
}

/// Takes what a pod asks (`wants`) off `room`.
fn take_off(room: &mut [(ResourceId, Milli)], wants: &[(ResourceId, Milli)]) {
    for (resource, amount) in wants {
        if let Some((_, left)) = room.iter_mut().find(|(r, _)| r == resource) {
            *left = left.saturating_sub(*amount);
        }
    }
}

/// `value + amount` for `sign` = 1, `value - amount` (saturating) for `sign` = -1.
pub(crate) fn signed_add(value: Milli, amount: Milli, sign: i8) -> Milli {
    if sign > 0 {
        value + amount
    } else {
        value.saturating_sub(amount)
    }
}
