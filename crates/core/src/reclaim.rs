//! Reclaim planning: for an owner's pod that is within its queue's guarantee but finds no
//! room, the node and the smallest set of borrower pods whose eviction makes room.
//!
//! Rules (DESIGN §5):
//! - only borrowers are candidates (see [`crate::ledger`]), so no victim queue goes below its
//!   guarantee, and pods already part of a reclaim are left alone;
//! - victims are taken greedily in order of preference: lower priority, then less work lost
//!   (most recently started, smaller checkpoint cost); a fill-back pass then puts back every
//!   victim the owner can do without, which makes the set minimal (removing any victim left
//!   breaks the fit) — the lesson of Kueue's over-eviction;
//! - across nodes the plan with the fewest victims wins, then the lowest victim priority, then
//!   the least work lost;
//! - a borrower younger than its queue's `minBorrowDuration` is spared, unless no plan exists
//!   without it: waiting for it to age would break the owner's budget, and the guarantee wins.
//!   The plan says so.

use std::{fmt, time::Duration};

use jiff::{SignedDuration, Timestamp};

use crate::Snapshot;
use crate::model::{CheckpointSettings, DeviceSet, EVICTION_RESERVE, PodKey, format_duration};
use crate::placement::Request;
use crate::quantity::{Milli, ResourceName};
use crate::snapshot::{Attribution, Charge, NodeId, PodId, QueueId, ResourceId};

/// A reclaim to carry out: evict `victims`, then bind the owner to `node`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReclaimPlan {
    pub owner: PodId,
    pub owner_key: PodKey,
    pub owner_queue: String,
    pub node: NodeId,
    pub node_name: String,
    /// The value to pin the owner with (`kubernetes.io/hostname`).
    pub pin: String,
    /// The devices the owner takes once the victims are gone.
    pub devices: Vec<DeviceSet>,
    /// In the order they were chosen (most preferred first).
    pub victims: Vec<Victim>,
    /// A victim is younger than its queue's `minBorrowDuration`: no plan without it exists.
    pub overrides_min_borrow: bool,
    /// The owner queue's handover budget.
    pub budget: Duration,
    /// When the handover must be done: the plan's time plus the budget.
    pub deadline: Timestamp,
}

/// A borrower pod to checkpoint and evict.
#[derive(Clone, Debug, PartialEq)]
pub struct Victim {
    pub pod: PodId,
    pub key: PodKey,
    pub queue: String,
    pub priority: i32,
    /// When it started the work a reclaim loses.
    pub running_since: Timestamp,
    pub checkpoint_cost: u64,
    /// How its queue checkpoints its pods.
    pub checkpoint: CheckpointSettings,
    /// Its queue's termination grace period for reclaim victims.
    pub grace: Duration,
    /// Until when its queue's `minBorrowDuration` protects it, if it still does.
    pub protected_until: Option<Timestamp>,
    /// What it frees, per resource.
    pub frees: Vec<(ResourceName, Milli)>,
}

impl ReclaimPlan {
    /// The checkpoint deadline of a victim after `elapsed` of the handover: its queue's
    /// checkpoint timeout, cut so that the eviction reserve still fits in the owner's budget.
    pub fn checkpoint_deadline(&self, victim: &Victim, elapsed: Duration) -> Duration {
        victim
            .checkpoint
            .timeout
            .min(self.budget.saturating_sub(elapsed + EVICTION_RESERVE))
    }
}

/// Why no reclaim plan exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoPlan {
    /// The pod is not pending in a queue.
    NotPendingInAQueue,
    /// The pod asks for more than its queue's guarantee leaves: it may only borrow.
    NotWithinGuarantee {
        resource: ResourceName,
        allocated: Milli,
        requested: Milli,
        guaranteed: Milli,
    },
    /// The pod is already the owner of a reclaim under way.
    InProgress { id: String },
    /// No node could ever take the pod (GPU model, device count, node rules).
    NoSuitableNode,
    /// No queue holds evictable borrowers of what the pod needs.
    NoBorrowers,
    /// Borrowers exist, but evicting them on any one node does not make room: the capacity is
    /// held by owners within their guarantees, unmanaged pods or a reclaim in progress.
    BorrowersCannotMakeRoom { borrower_nodes: usize },
}

impl fmt::Display for NoPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotPendingInAQueue => write!(f, "the pod is not waiting in a queue"),
            Self::NotWithinGuarantee {
                resource,
                allocated,
                requested,
                guaranteed,
            } => write!(
                f,
                "{resource}: allocated {allocated} + requested {requested} exceeds the guarantee of {guaranteed}, so the pod may only borrow"
            ),
            Self::InProgress { id } => write!(f, "reclaim {id} for this pod is under way"),
            Self::NoSuitableNode => {
                write!(
                    f,
                    "no node could ever take the pod (GPU model, device count or node rules)"
                )
            }
            Self::NoBorrowers => write!(f, "no other queue is borrowing what the pod needs"),
            Self::BorrowersCannotMakeRoom { borrower_nodes } => write!(
                f,
                "evicting the borrowers on any one of the {borrower_nodes} nodes holding them would not make room; the rest is held by owners within their guarantees, unmanaged pods or a reclaim under way"
            ),
        }
    }
}

/// A plan on one node, before it is turned into a [`ReclaimPlan`].
struct NodePlan {
    node: NodeId,
    victims: Vec<PodId>,
    rank: (usize, i32, u64, i64),
}

/// A candidate victim on a node with its preference key.
struct Candidate {
    pod: PodId,
    protected: bool,
    priority: i32,
    running_since: Timestamp,
    checkpoint_cost: u64,
    key: PodKey,
}

/// Plans the reclaim for a pending owner pod at `now`.
pub fn plan_reclaim(
    snapshot: &Snapshot,
    owner: PodId,
    now: Timestamp,
) -> Result<ReclaimPlan, NoPlan> {
    let slot = snapshot.slot(owner).ok_or(NoPlan::NotPendingInAQueue)?;
    let (Attribution::Queue(queue), false) = (&slot.attribution, slot.pod.is_admitted()) else {
        return Err(NoPlan::NotPendingInAQueue);
    };
    if let Some(mark) = &slot.pod.reclaim {
        return Err(NoPlan::InProgress {
            id: mark.id.clone(),
        });
    }
    for (resource, amount) in &slot.amounts {
        let usage = snapshot.usage_of(*queue, *resource);
        let (allocated, guaranteed) =
            usage.map_or((Milli::ZERO, Milli::ZERO), |u| (u.allocated, u.guaranteed));
        if allocated + *amount > guaranteed {
            return Err(NoPlan::NotWithinGuarantee {
                resource: snapshot.resource_name(*resource).clone(),
                allocated,
                requested: *amount,
                guaranteed,
            });
        }
    }
    let request = Request::new(snapshot, &slot.pod).ok_or(NoPlan::NoSuitableNode)?;
    let borrowers = evictable_borrowers(snapshot, *queue);
    if !borrowers.iter().any(|b| *b) {
        return Err(NoPlan::NoBorrowers);
    }

    let mut suitable = false;
    let mut borrower_nodes = 0;
    let mut best: Option<NodePlan> = None;
    for spare_protected in [true, false] {
        for id in snapshot.node_ids() {
            let n = &snapshot.nodes[id.index()];
            if !request.fits_statically(n) {
                continue;
            }
            suitable = true;
            if !n.deficit.is_empty() {
                continue; // another owner's reservation
            }
            let mut candidates = candidates_on(snapshot, id, &borrowers, now, spare_protected);
            if candidates.is_empty() {
                continue;
            }
            if !spare_protected {
                borrower_nodes += 1;
            }
            if let Some(plan) = plan_on_node(snapshot, &request, id, &mut candidates, now)
                && best.as_ref().is_none_or(|b| plan.rank < b.rank)
            {
                best = Some(plan);
            }
        }
        if best.is_some() {
            break;
        }
    }
    if !suitable {
        return Err(NoPlan::NoSuitableNode);
    }
    let plan = best.ok_or(NoPlan::BorrowersCannotMakeRoom { borrower_nodes })?;
    Ok(finish(snapshot, owner, *queue, &request, &plan, now))
}

/// Borrower pods of other queues, by pod index, that may be evicted: seated on a node and not
/// already part of a reclaim.
fn evictable_borrowers(snapshot: &Snapshot, owner_queue: QueueId) -> Vec<bool> {
    let mut evictable = vec![false; snapshot.pods.len()];
    for q in snapshot.queue_ids().filter(|q| *q != owner_queue) {
        for pod in snapshot.borrowers(q) {
            let seated = snapshot.slot(pod).is_some_and(|s| {
                s.pod.reclaim.is_none() && s.seat.as_ref().is_some_and(|seat| !seat.deficit)
            });
            evictable[pod.index()] = seated;
        }
    }
    evictable
}

/// Whether a pod's queue still protects it from reclaim at `now`, and until when.
fn protected_until(snapshot: &Snapshot, pod: PodId, now: Timestamp) -> Option<Timestamp> {
    let slot = snapshot.slot(pod)?;
    let Attribution::Queue(q) = slot.attribution else {
        return None;
    };
    let floor = snapshot.queue(q).reclaim.min_borrow?;
    let until = slot
        .pod
        .running_since()
        .checked_add(SignedDuration::try_from(floor).ok()?)
        .ok()?;
    (until > now).then_some(until)
}

fn candidates_on(
    snapshot: &Snapshot,
    node: NodeId,
    borrowers: &[bool],
    now: Timestamp,
    spare_protected: bool,
) -> Vec<Candidate> {
    let mut candidates: Vec<Candidate> = snapshot.nodes[node.index()]
        .pods
        .iter()
        .filter(|p| borrowers[p.index()])
        .filter_map(|p| {
            let pod = &snapshot.slot(*p)?.pod;
            let protected = protected_until(snapshot, *p, now).is_some();
            (!(protected && spare_protected)).then(|| Candidate {
                pod: *p,
                protected,
                priority: pod.priority,
                running_since: pod.running_since(),
                checkpoint_cost: pod.checkpoint_cost,
                key: pod.key.clone(),
            })
        })
        .collect();
    // Most preferred victim first: unprotected, lowest priority, most recently started,
    // cheapest checkpoint, then name (descending, as the ledger orders borrowers).
    candidates.sort_by(|a, b| {
        a.protected
            .cmp(&b.protected)
            .then(a.priority.cmp(&b.priority))
            .then(b.running_since.cmp(&a.running_since))
            .then(a.checkpoint_cost.cmp(&b.checkpoint_cost))
            .then_with(|| b.key.cmp(&a.key))
    });
    candidates
}

/// Free devices, CPU and memory of a node while victims are tried out.
struct Trial {
    free: Vec<u16>,
    cpu: i64,
    memory: i64,
}

impl Trial {
    fn apply(&mut self, snapshot: &Snapshot, pod: PodId, sign: i8) {
        let Some(slot) = snapshot.slot(pod) else {
            return;
        };
        let Some(seat) = &slot.seat else { return };
        for Charge { device, milli } in &seat.charges {
            let free = &mut self.free[usize::from(*device)];
            *free = if sign > 0 {
                free.saturating_add(*milli)
            } else {
                free.saturating_sub(*milli)
            };
        }
        let cpu = crate::snapshot::host_amount(slot.pod.requests.cpu_milli);
        let memory = crate::snapshot::host_amount(slot.pod.requests.memory_bytes);
        self.cpu += i64::from(sign) * cpu;
        self.memory += i64::from(sign) * memory;
    }
}

/// Greedy removal in preference order until the owner fits, then fill-back.
fn plan_on_node(
    snapshot: &Snapshot,
    request: &Request,
    node: NodeId,
    candidates: &mut [Candidate],
    now: Timestamp,
) -> Option<NodePlan> {
    let n = &snapshot.nodes[node.index()];
    let mut trial = Trial {
        free: n.free.clone(),
        cpu: n.cpu_free,
        memory: n.memory_free,
    };
    let fits = |t: &Trial| request.has_room(&n.layout, &t.free, t.cpu, t.memory);
    let mut chosen = Vec::new();
    for c in candidates.iter() {
        trial.apply(snapshot, c.pod, 1);
        chosen.push(c.pod);
        if fits(&trial) {
            break;
        }
    }
    if !fits(&trial) {
        return None;
    }
    // Fill-back: put back each victim, last chosen first, whose room the owner does not need.
    for i in (0..chosen.len()).rev() {
        trial.apply(snapshot, chosen[i], -1);
        if fits(&trial) {
            chosen.remove(i);
        } else {
            trial.apply(snapshot, chosen[i], 1);
        }
    }
    let victims: Vec<&Candidate> = chosen
        .iter()
        .filter_map(|p| candidates.iter().find(|c| c.pod == *p))
        .collect();
    let max_priority = victims.iter().map(|c| c.priority).max().unwrap_or(i32::MIN);
    let cost: u64 = victims.iter().map(|c| c.checkpoint_cost).sum();
    let work: i64 = victims
        .iter()
        .map(|c| (now - c.running_since).get_seconds().max(0))
        .sum();
    Some(NodePlan {
        node,
        rank: (chosen.len(), max_priority, cost, work),
        victims: chosen,
    })
}

fn finish(
    snapshot: &Snapshot,
    owner: PodId,
    queue: QueueId,
    request: &Request,
    plan: &NodePlan,
    now: Timestamp,
) -> ReclaimPlan {
    let n = &snapshot.nodes[plan.node.index()];
    let mut trial = Trial {
        free: n.free.clone(),
        cpu: n.cpu_free,
        memory: n.memory_free,
    };
    for v in &plan.victims {
        trial.apply(snapshot, *v, 1);
    }
    let mut charges = Vec::new();
    request.charges_in(&n.layout, &trial.free, None, &mut charges);
    let victims = plan
        .victims
        .iter()
        .filter_map(|v| {
            let slot = snapshot.slot(*v)?;
            let Attribution::Queue(q) = slot.attribution else {
                return None;
            };
            let settings = &snapshot.queue(q).reclaim;
            Some(Victim {
                pod: *v,
                key: slot.pod.key.clone(),
                queue: snapshot.queue(q).name.clone(),
                priority: slot.pod.priority,
                running_since: slot.pod.running_since(),
                checkpoint_cost: slot.pod.checkpoint_cost,
                checkpoint: settings.checkpoint.clone(),
                grace: settings.victim_grace,
                protected_until: protected_until(snapshot, *v, now),
                frees: slot
                    .amounts
                    .iter()
                    .map(|(r, m): &(ResourceId, Milli)| (snapshot.resource_name(*r).clone(), *m))
                    .collect(),
            })
        })
        .collect::<Vec<Victim>>();
    let overrides_min_borrow = victims.iter().any(|v| v.protected_until.is_some());
    let budget = snapshot.queue(queue).reclaim.budget;
    let deadline = SignedDuration::try_from(budget)
        .ok()
        .and_then(|b| now.checked_add(b).ok())
        .unwrap_or(now);
    let owner_slot = snapshot.slot(owner);
    ReclaimPlan {
        owner,
        owner_key: owner_slot.map_or_else(|| PodKey::new("", ""), |s| s.pod.key.clone()),
        owner_queue: snapshot.queue(queue).name.clone(),
        node: plan.node,
        node_name: n.node.name.clone(),
        pin: n.node.hostname().to_string(),
        devices: snapshot.device_sets(plan.node, &charges),
        victims,
        overrides_min_borrow,
        budget,
        deadline,
    }
}

impl fmt::Display for ReclaimPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let victims: Vec<String> = self
            .victims
            .iter()
            .map(|v| format!("{} ({})", v.key, v.queue))
            .collect();
        write!(
            f,
            "reclaim for {} of queue {} on node {}: evict {} within {}",
            self.owner_key,
            self.owner_queue,
            self.node_name,
            victims.join(", "),
            format_duration(self.budget)
        )?;
        if self.overrides_min_borrow {
            write!(
                f,
                "; a victim is younger than its queue's minBorrowDuration, but no plan spares it"
            )?;
        }
        Ok(())
    }
}
