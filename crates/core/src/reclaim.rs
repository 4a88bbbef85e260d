//! Reclaim planning: for an owner's pod that is within its queue's guarantee but finds no
//! room, the node and the smallest set of borrower pods whose eviction makes room.
//!
//! Rules (DESIGN §5):
//! - only borrowers are candidates (see [`crate::ledger`]: the pods admitted last until the
//!   borrowed amount is covered, a straddling pod included), so no victim queue goes below its
//!   guarantee by a pod or more, and pods already part of a reclaim are left alone;
//! - a victim is evicted only while its queue still borrows it, asked again just before the
//!   eviction ([`pending_victims`]): the queue may have shrunk since the plan;
//! - only on nodes the owner queue's GPU memory and compute caps allow it (`crate::caps`):
//!   room freed elsewhere could not be the owner's without taking its queue above a cap;
//! - victims are taken greedily in order of preference: those whose termination fits the
//!   owner's budget first, then pods already being deleted (nothing is lost and nothing
//!   evicted), then unadmitted pods (they hold quota without having passed
//!   admission), then lower priority, then less work lost (most recently started, smaller
//!   checkpoint cost); a fill-back pass then puts back every victim the owner can do without,
//!   which makes the set minimal (removing any victim left breaks the fit) — the lesson of
//!   Kueue's over-eviction; then a smaller set is looked for, since minimal is not fewest (one
//!   four-GPU borrower may do what four one-GPU ones do): the most preferred of the fewest;
//! - across nodes a plan whose victims' termination fits the budget wins, then the one with
//!   the fewest victims, then the lowest victim priority, then the least work lost;
//! - a borrower younger than its queue's `minBorrowDuration` is spared, unless no plan exists
//!   without it: waiting for it to age would break the owner's budget, and the guarantee wins.
//!   The plan says so;
//! - the budget plans for termination ([`crate::termination`]): the plan carries what it
//!   keeps back for its victims' termination and the bind, and whether the checkpoint fits
//!   ([`BudgetFit`]), so the operator can say so before it evicts.

use std::{fmt, time::Duration};

use jiff::{SignedDuration, Timestamp};

use gpuqueue_api::v1alpha1::CheckpointDriver;

use crate::caps::cap_filter;
use crate::devices::{NodeState, Request, Trial};
use crate::ids::{NodeId, PodId, QueueId, ResourceId};
use crate::model::{CheckpointSettings, DeviceSet, Pod, PodKey, format_duration};
use crate::quantity::{Milli, ResourceName};
use crate::snapshot::promised::Promised;
use crate::snapshot::{Attribution, Snapshot};
use crate::termination::BIND_RESERVE;

/// A reclaim to carry out: admit the owner and pin it to `node` but keep it at the gate, evict
/// `victims`, and release it once they and those it `awaits` are gone. Released any earlier,
/// kube-scheduler would try it on a node still full: it would try again only after its
/// backoff (up to a second after the room is free), or preempt for it.
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
    /// The expected termination of the slowest victim on the node (grace and history).
    pub termination: Duration,
    /// What the budget keeps back after the checkpoint: `termination` plus
    /// [`BIND_RESERVE`].
    pub eviction_reserve: Duration,
    /// Whether the checkpoints, the termination and the bind fit in the budget, from the plan.
    pub fit: BudgetFit,
    /// The victims of other reclaims on the node whose room the owner's counts on, when its
    /// own victims alone do not make it (an owner of a burst): it leaves the gate only once
    /// they are gone too.
    pub awaits: Vec<PodKey>,
    /// kube-scheduler would preempt for the owner on the node: it outranks a pod seated there
    /// and its `preemptionPolicy` allows it. Such an owner stays at the gate until its room is
    /// free even when the handover ends without it: released early, it would have pods the
    /// plan did not choose deleted, with no checkpoint.
    pub preempts: bool,
}

/// Whether a handover fits in its budget, from the time it is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetFit {
    /// Every victim's checkpoint timeout, its termination and the bind fit.
    Fits,
    /// Termination and bind fit, but the checkpoint is cut to `allowed`, shorter than the
    /// victims' checkpoint `timeout`: a checkpoint that needs its whole timeout is lost.
    CheckpointCut {
        allowed: Duration,
        timeout: Duration,
    },
    /// Even with no checkpoint, termination and bind take `by` longer than the budget has left.
    Overruns { by: Duration },
}

impl BudgetFit {
    /// The fit after `elapsed` of a handover with `budget` that keeps `reserve` back after a
    /// checkpoint of at most `timeout` (zero when no victim checkpoints).
    pub fn of(budget: Duration, reserve: Duration, timeout: Duration, elapsed: Duration) -> Self {
        let by = reserve.saturating_sub(budget.saturating_sub(elapsed));
        if !by.is_zero() {
            return Self::Overruns { by };
        }
        let allowed = checkpoint_allowance(budget, timeout, reserve, elapsed);
        if allowed < timeout {
            Self::CheckpointCut { allowed, timeout }
        } else {
            Self::Fits
        }
    }
}

/// A borrower pod to checkpoint and evict.
#[derive(Clone, Debug, PartialEq)]
pub struct Victim {
    pub pod: PodId,
    pub key: PodKey,
    /// Its `metadata.uid`: the victim is this pod, not a later one of its name.
    pub uid: Option<String>,
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
    /// checkpoint timeout, cut so that the plan's eviction reserve still fits in the owner's
    /// budget. (The owner binds once the last victim is gone, so every victim keeps back the
    /// slowest one's termination.)
    pub fn checkpoint_deadline(&self, victim: &Victim, elapsed: Duration) -> Duration {
        checkpoint_allowance(
            self.budget,
            victim.checkpoint.timeout,
            self.eviction_reserve,
            elapsed,
        )
    }
}

/// How long a victim's checkpoint may take after `elapsed` of a handover with `budget`: its
/// queue's checkpoint `timeout`, cut so that `reserve` (the victims' termination and the bind,
/// [`crate::termination::Terminations::reserve`]) still fits in the budget. Zero once the
/// budget is spent: the owner's guarantee wins over the borrower's checkpoint. (A handover
/// resumed after a restart has no plan: it computes the reserve from the node's history and
/// the victim's grace.)
pub fn checkpoint_allowance(
    budget: Duration,
    timeout: Duration,
    reserve: Duration,
    elapsed: Duration,
) -> Duration {
    timeout.min(budget.saturating_sub(elapsed + reserve))
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
    /// The pod fits on a node as things are: admit it, evict nobody.
    RoomAvailable { node: String },
    /// No node could ever take the pod (GPU model, device count, node rules).
    NoSuitableNode,
    /// No queue holds evictable borrowers of what the pod needs.
    NoBorrowers,
    /// Borrowers exist, but evicting them on any one node does not make room: the capacity is
    /// held by owners within their guarantees, unmanaged pods or a reclaim in progress.
    BorrowersCannotMakeRoom { borrower_nodes: usize },
    /// A plan exists, but the snapshot may be behind the cluster ([`Snapshot::is_behind`]):
    /// the borrowers it would evict, and the owner itself, may be gone or changed already.
    ViewBehind,
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
            Self::RoomAvailable { node } => write!(f, "node {node} has room for the pod already"),
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
            Self::ViewBehind => write!(
                f,
                "the operator's view of the cluster is catching up (a watch of pods, queues, nodes, namespaces or DRA objects is listing afresh after an error), and no borrower is disrupted on a view that may be stale"
            ),
        }
    }
}

/// A plan on one node, before it is turned into a [`ReclaimPlan`].
struct NodePlan {
    node: NodeId,
    victims: Vec<PodId>,
    rank: Rank,
}

/// How node plans compare (lower is better): a victim whose termination breaks the budget,
/// victims, their highest priority, their checkpoint cost, the seconds of work they lose.
type Rank = (bool, usize, i32, u64, i64);

/// Who may be a victim for one owner: evictable borrowers by pod index, each queue's
/// `minBorrowDuration`, and the owner's budget their termination must fit in.
struct Eligible<'a> {
    borrowers: &'a [bool],
    floors: &'a [Option<SignedDuration>],
    budget: Duration,
    /// The nodes the owner queue's GPU memory or compute caps keep the owner off: room freed
    /// there would take the queue above its cap.
    capped: &'a dyn Fn(NodeId) -> bool,
}

/// A candidate victim on a node with its preference key.
struct Candidate<'a> {
    pod: PodId,
    /// Its expected termination on the node plus the bind fits in the owner's budget.
    fits: bool,
    standing: Standing,
    protected: bool,
    priority: i32,
    running_since: Timestamp,
    checkpoint_cost: u64,
    key: &'a PodKey,
}

/// How a candidate holds its room, the cheapest to take first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Standing {
    /// Being deleted already: taking it costs no work and no eviction.
    Leaving,
    /// Holds quota without having passed admission.
    Unadmitted,
    Admitted,
}

impl Standing {
    fn of(pod: &Pod) -> Self {
        if pod.is_terminating() {
            Self::Leaving
        } else if pod.unadmitted {
            Self::Unadmitted
        } else {
            Self::Admitted
        }
    }
}

/// Buffers reused from node to node, so planning over a large cluster does not allocate per
/// node.
struct Scratch<'a> {
    candidates: Vec<Candidate<'a>>,
    chosen: Vec<PodId>,
    trial: Trial,
    /// The trial with the node's waiting owners seated, to test the new owner on.
    seated: Trial,
}

/// Plans the reclaim for a pending owner pod at `now`.
pub fn plan_reclaim(
    snapshot: &Snapshot,
    owner: PodId,
    now: Timestamp,
) -> Result<ReclaimPlan, NoPlan> {
    let (queue, request) = owner_request(snapshot, owner)?;
    let borrowers = evictable_borrowers(snapshot, queue);
    // Without borrowers, only the room promised to owners waiting on a node may still do.
    let promises = || snapshot.node_ids().any(|n| snapshot.is_oversubscribed(n));
    if !borrowers.iter().any(|b| *b) && !promises() {
        return Err(NoPlan::NoBorrowers);
    }
    let floors: Vec<Option<SignedDuration>> = snapshot
        .queue_ids()
        .map(|q| {
            snapshot
                .queue(q)
                .reclaim
                .min_borrow
                .and_then(|d| SignedDuration::try_from(d).ok())
        })
        .collect();
    let caps = cap_filter(snapshot, queue, owner);
    let eligible = Eligible {
        borrowers: &borrowers,
        floors: &floors,
        budget: snapshot.queue(queue).reclaim.budget,
        capped: &|node| caps(node).is_some(),
    };
    let plan = best_node_plan(snapshot, &request, &eligible, now).map_err(|no| match no {
        NoPlan::BorrowersCannotMakeRoom { borrower_nodes: 0 } => NoPlan::NoBorrowers,
        other => other,
    })?;
    if snapshot.is_behind() {
        return Err(NoPlan::ViewBehind);
    }
    Ok(finish(snapshot, owner, queue, &request, &plan, now))
}

/// The owner's queue and its request, when it may own a reclaim: pending in a queue, not
/// already an owner, within its guarantee, and able to fit some node.
fn owner_request(snapshot: &Snapshot, owner: PodId) -> Result<(QueueId, Request<'_>), NoPlan> {
    let slot = snapshot.slot(owner).ok_or(NoPlan::NotPendingInAQueue)?;
    let (Attribution::Queue(queue), false) = (&slot.attribution, slot.pod.is_admitted()) else {
        return Err(NoPlan::NotPendingInAQueue);
    };
    if let Some(mark) = &slot.pod.reclaim {
        return Err(NoPlan::InProgress {
            id: mark.id.clone(),
        });
    }
    within_guarantee(snapshot, *queue, &slot.amounts)?;
    let request = snapshot.request(&slot.pod).ok_or(NoPlan::NoSuitableNode)?;
    Ok((*queue, request))
}

/// The best plan over all nodes: first sparing borrowers that `minBorrowDuration` protects,
/// then, only if no node has a plan, without sparing them.
fn best_node_plan(
    snapshot: &Snapshot,
    request: &Request,
    eligible: &Eligible,
    now: Timestamp,
) -> Result<NodePlan, NoPlan> {
    let mut suitable = false;
    let mut borrower_nodes = 0;
    let mut best: Option<NodePlan> = None;
    let mut scratch = Scratch {
        candidates: Vec::new(),
        chosen: Vec::new(),
        trial: Trial::default(),
        seated: Trial::default(),
    };
    for spare_protected in [true, false] {
        for (id, n) in snapshot.node_states() {
            if !request.fits_statically(n) || (eligible.capped)(id) {
                continue;
            }
            suitable = true;
            if request.admits(n) {
                return Err(NoPlan::RoomAvailable {
                    node: n.node().name.clone(),
                });
            }
            // Owners already wait here (a burst): the room their victims free is theirs
            // first, the rest may spare this owner victims of its own.
            let promised = snapshot.promised(id);
            candidates_on(
                snapshot,
                id,
                eligible,
                now,
                spare_protected,
                &mut scratch.candidates,
            );
            if scratch.candidates.is_empty() && promised.is_none() {
                continue;
            }
            if !spare_protected && !scratch.candidates.is_empty() {
                borrower_nodes += 1;
            }
            // A node with promises may need no victim at all: no floor of one applies.
            let floor = best_possible(&scratch.candidates, now);
            if promised.is_none() && best.as_ref().is_some_and(|b| floor >= b.rank) {
                continue;
            }
            if let Some(rank) =
                plan_on_node(snapshot, request, id, promised.as_ref(), &mut scratch, now)
                && best.as_ref().is_none_or(|b| rank < b.rank)
            {
                best = Some(NodePlan {
                    node: id,
                    victims: scratch.chosen.clone(),
                    rank,
                });
            }
        }
        if best.is_some() {
            break;
        }
    }
    if !suitable {
        return Err(NoPlan::NoSuitableNode);
    }
    best.ok_or(NoPlan::BorrowersCannotMakeRoom { borrower_nodes })
}

/// No plan on a node can rank below one victim with the least priority, cost and work found
/// among its candidates; a node whose floor is no better than the best plan so far is skipped.
fn best_possible(candidates: &[Candidate<'_>], now: Timestamp) -> Rank {
    candidates
        .iter()
        .fold((false, 1, i32::MAX, u64::MAX, i64::MAX), |floor, c| {
            (
                false,
                1,
                floor.2.min(c.priority),
                floor.3.min(c.checkpoint_cost),
                floor
                    .4
                    .min(now.duration_since(c.running_since).as_secs().max(0)),
            )
        })
}

/// A victim of a reclaim in flight, not evicted yet, and whether its queue still borrows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingVictim {
    pub key: PodKey,
    /// `false`: evicting it would take its queue below its guarantee; it is to be spared.
    pub borrowed: bool,
}

/// The victims of reclaims in flight, not evicted yet, each with whether its queue still
/// borrows it. A plan chose each one as a borrower, but the queue may have shrunk since (its
/// tenant deleted pods while the checkpoints ran, an admin raised its guarantee), so each
/// eviction asks again, just before it is sent. What a queue keeps is counted without its pods
/// being deleted (they leave anyway) and its reservations not seen yet, and with the other
/// pending victims gone: of those, the least protected go first (the ledger's order), each
/// while it still lies, at least in part, above the guarantee (a straddler still goes, as it
/// would have been chosen: [`crate::ledger`]). The rest are to be spared.
pub fn pending_victims(snapshot: &Snapshot) -> Vec<PendingVictim> {
    snapshot
        .queue_ids()
        .flat_map(|q| snapshot.judge_victims(q))
        .filter_map(|(pod, borrowed)| {
            let key = snapshot.pod(pod)?.key.clone();
            Some(PendingVictim { key, borrowed })
        })
        .collect()
}

/// Reclaim is only for a pod that keeps its queue within its guarantee.
fn within_guarantee(
    snapshot: &Snapshot,
    queue: QueueId,
    amounts: &[(ResourceId, Milli)],
) -> Result<(), NoPlan> {
    for (resource, amount) in amounts {
        let usage = snapshot.usage_of(queue, *resource);
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
    Ok(())
}

/// Borrower pods of other queues, by pod index, that may be evicted: seated on a node and not
/// already part of a reclaim (a reservation whose pod may never exist is no borrower).
fn evictable_borrowers(snapshot: &Snapshot, owner_queue: QueueId) -> Vec<bool> {
    let mut evictable = vec![false; snapshot.pod_index_bound()];
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
    let slot = snapshot.slot(pod).filter(|s| !s.pod.unadmitted)?;
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

/// The borrowers on a node, most preferred victim first, into `out`.
fn candidates_on<'a>(
    snapshot: &'a Snapshot,
    node: NodeId,
    eligible: &Eligible,
    now: Timestamp,
    spare_protected: bool,
    out: &mut Vec<Candidate<'a>>,
) {
    out.clear();
    let n = snapshot.node_state(node);
    // A node's borrowers mostly share one queue, hence one grace: ask the history once.
    let mut last_fit: Option<(Duration, bool)> = None;
    for p in n.pods() {
        if !eligible.borrowers[p.index()] {
            continue;
        }
        let Some(slot) = snapshot.slot(*p) else {
            continue;
        };
        let Attribution::Queue(q) = slot.attribution else {
            continue;
        };
        let pod = &slot.pod;
        let running_since = pod.running_since();
        // minBorrowDuration protects what the queue borrowed through admission only.
        let protected = !pod.unadmitted
            && eligible.floors[q.index()]
                .and_then(|floor| running_since.checked_add(floor).ok())
                .is_some_and(|until| until > now);
        if protected && spare_protected {
            continue;
        }
        let grace = snapshot.queue(q).reclaim.victim_grace;
        let fits = match last_fit {
            Some((g, fits)) if g == grace => fits,
            _ => {
                let reserve = snapshot.terminations().reserve(&n.node().name, grace);
                let fits = reserve <= eligible.budget;
                last_fit = Some((grace, fits));
                fits
            }
        };
        out.push(Candidate {
            pod: *p,
            fits,
            standing: Standing::of(pod),
            protected,
            priority: pod.priority,
            running_since,
            checkpoint_cost: pod.checkpoint_cost,
            key: &pod.key,
        });
    }
    // Most preferred victim first: fits the owner's budget, being deleted, unadmitted,
    // unprotected, lowest priority, most recently started, cheapest checkpoint, then name
    // (descending, as the ledger orders borrowers).
    out.sort_by(|a, b| {
        b.fits
            .cmp(&a.fits)
            .then(a.standing.cmp(&b.standing))
            .then(a.protected.cmp(&b.protected))
            .then(a.priority.cmp(&b.priority))
            .then(b.running_since.cmp(&a.running_since))
            .then(a.checkpoint_cost.cmp(&b.checkpoint_cost))
            .then_with(|| b.key.cmp(a.key))
    });
}

/// Gives back (`sign` = 1) or takes again (`sign` = -1) what a seated pod holds, on a trial.
fn try_release(trial: &mut Trial, snapshot: &Snapshot, pod: PodId, sign: i8) {
    snapshot.release_on(trial, pod, sign);
}

/// Greedy removal in preference order until the owner fits, then fill-back; the victims are
/// left in `scratch.chosen`. On a node with `promised` room, the victims already being evicted
/// are released first and the owners waiting there seated before the owner is tried, so the
/// new victims are only what the owners together still lack (none when the rest suffices).
fn plan_on_node(
    snapshot: &Snapshot,
    request: &Request,
    node: NodeId,
    promised: Option<&Promised<'_>>,
    scratch: &mut Scratch<'_>,
    now: Timestamp,
) -> Option<Rank> {
    let n = snapshot.node_state(node);
    let Scratch {
        candidates,
        chosen,
        trial,
        seated,
    } = scratch;
    trial.reset(n);
    for v in promised.map_or(&[][..], Promised::victims) {
        try_release(trial, snapshot, *v, 1);
    }
    let mut fits = |t: &Trial| {
        let Some(promised) = promised else {
            return request.has_room(n.layout(), &t.free, t.cpu, t.memory);
        };
        seated.clone_from(t);
        promised.seat_owners(n, seated)
            && request.has_room(n.layout(), &seated.free, seated.cpu, seated.memory)
    };
    chosen.clear();
    if fits(trial) {
        return Some((false, 0, i32::MIN, 0, 0));
    }
    for c in candidates.iter() {
        try_release(trial, snapshot, c.pod, 1);
        chosen.push(c.pod);
        if fits(trial) {
            break;
        }
    }
    if !fits(trial) {
        return None;
    }
    // Fill-back: put back each victim, last chosen first, whose room the owner does not need.
    for i in (0..chosen.len()).rev() {
        try_release(trial, snapshot, chosen[i], -1);
        if fits(trial) {
            chosen.remove(i);
        } else {
            try_release(trial, snapshot, chosen[i], 1);
        }
    }
    fewest(snapshot, candidates, chosen, trial, &mut fits);
    let (mut overruns, mut max_priority, mut cost, mut work) = (false, i32::MIN, 0u64, 0i64);
    for c in candidates.iter().filter(|c| chosen.contains(&c.pod)) {
        overruns |= !c.fits;
        max_priority = max_priority.max(c.priority);
        cost += c.checkpoint_cost;
        work += now.duration_since(c.running_since).as_secs().max(0);
    }
    Some((overruns, chosen.len(), max_priority, cost, work))
}

/// Most room checks spent on one node looking for fewer victims than the greedy set (every
/// set of up to 8 candidates is 255 checks).
const FEWEST_CHECKS: usize = 512;

/// Replaces `chosen`, a minimal set released on `trial`, by the fewest `candidates` that make
/// room, when there are fewer: greedy removal in preference order keeps no victim the owner
/// could do without, but four one-GPU borrowers may be taken where one four-GPU borrower would
/// do. Sets are tried smallest first, each size in preference order, so the first that fits is
/// the most preferred of the fewest; only among candidates as good as the greedy set's on the
/// budget and `minBorrowDuration`, and within [`FEWEST_CHECKS`] (beyond it, the greedy set).
fn fewest(
    snapshot: &Snapshot,
    candidates: &[Candidate<'_>],
    chosen: &mut Vec<PodId>,
    trial: &mut Trial,
    fits: &mut dyn FnMut(&Trial) -> bool,
) {
    let greedy = chosen.len();
    if greedy < 2 {
        return;
    }
    let worst = candidates.iter().filter(|c| chosen.contains(&c.pod));
    let (all_fit, none_protected) =
        worst.fold((true, true), |(f, p), c| (f && c.fits, p && !c.protected));
    let pool: Vec<PodId> = candidates
        .iter()
        .filter(|c| (c.fits || !all_fit) && (!c.protected || !none_protected))
        .map(|c| c.pod)
        .collect();
    let release = |trial: &mut Trial, set: &[usize], sign: i8| {
        for i in set {
            try_release(trial, snapshot, pool[*i], sign);
        }
    };
    for p in chosen.iter() {
        try_release(trial, snapshot, *p, -1);
    }
    let mut checks = FEWEST_CHECKS;
    let mut found = None;
    'sizes: for size in 1..greedy.min(pool.len() + 1) {
        let mut set: Vec<usize> = (0..size).collect();
        loop {
            if checks == 0 {
                break 'sizes;
            }
            checks -= 1;
            release(trial, &set, 1);
            let room = fits(trial);
            release(trial, &set, -1);
            if room {
                found = Some(set);
                break 'sizes;
            }
            if !next_combination(&mut set, pool.len()) {
                break;
            }
        }
    }
    if let Some(set) = found {
        *chosen = set.iter().map(|i| pool[*i]).collect();
    }
    for p in chosen.iter() {
        try_release(trial, snapshot, *p, 1);
    }
}

/// Advances `set` (ascending indices below `n`) to the next combination of its size in
/// lexicographic order; `false` after the last.
fn next_combination(set: &mut [usize], n: usize) -> bool {
    let size = set.len();
    let Some(i) = (0..size).rev().find(|&i| set[i] < n - size + i) else {
        return false;
    };
    set[i] += 1;
    for j in i + 1..size {
        set[j] = set[j - 1] + 1;
    }
    true
}

fn finish(
    snapshot: &Snapshot,
    owner: PodId,
    queue: QueueId,
    request: &Request,
    plan: &NodePlan,
    now: Timestamp,
) -> ReclaimPlan {
    let n = snapshot.node_state(plan.node);
    let mut trial = Trial::of(n);
    for v in &plan.victims {
        try_release(&mut trial, snapshot, *v, 1);
    }
    let mut charges = Vec::new();
    request.charges_in(n.layout(), &trial.free, None, &mut charges);
    let victims = victims_of(snapshot, plan, now);
    let overrides_min_borrow = victims.iter().any(|v| v.protected_until.is_some());
    let budget = snapshot.queue(queue).reclaim.budget;
    let node_name = &n.node().name;
    let termination = victims
        .iter()
        .map(|v| snapshot.terminations().expected(node_name, v.grace))
        .max()
        .unwrap_or_default();
    let owner_slot = snapshot.slot(owner);
    let eviction_reserve = termination + BIND_RESERVE;
    let awaits = awaited_victims(snapshot, plan.node, request, &plan.victims);
    let checkpoint_timeout = victims
        .iter()
        .filter(|v| v.checkpoint.driver != CheckpointDriver::None)
        .map(|v| v.checkpoint.timeout)
        .max()
        .unwrap_or_default();
    let deadline = SignedDuration::try_from(budget)
        .ok()
        .and_then(|b| now.checked_add(b).ok())
        .unwrap_or(now);
    ReclaimPlan {
        owner,
        owner_key: owner_slot.map_or_else(|| PodKey::new("", ""), |s| s.pod.key.clone()),
        owner_queue: snapshot.queue(queue).name.clone(),
        node: plan.node,
        node_name: node_name.clone(),
        pin: n.node().hostname().to_string(),
        devices: snapshot.device_sets(plan.node, &charges),
        victims,
        overrides_min_borrow,
        budget,
        deadline,
        termination,
        eviction_reserve,
        fit: BudgetFit::of(budget, eviction_reserve, checkpoint_timeout, Duration::ZERO),
        awaits,
        preempts: preempts_on(snapshot, n, owner_slot.map(|s| &*s.pod)),
    }
}

/// `victims` and, after each, the other pods using a DRA claim it is charged for
/// ([`crate::model::Pod::claim_sharers`]): the claim's devices are freed only once the last of
/// them is gone, so they leave together. Those already leaving (marked by another reclaim,
/// or being deleted) are not added.
pub(crate) fn with_sharers(snapshot: &Snapshot, victims: &[PodId]) -> Vec<PodId> {
    let mut all = Vec::with_capacity(victims.len());
    for v in victims {
        all.push(*v);
        for sharer in snapshot.claim_sharers_of(*v) {
            // One already leaving is awaited instead ([`awaited_victims`]); one marked as a
            // reclaim's owner is left alone.
            let taken = snapshot
                .slot(sharer)
                .is_none_or(|s| s.pod.is_leaving() || s.pod.reclaim.is_some());
            if !taken && !all.contains(&sharer) && !victims.contains(&sharer) {
                all.push(sharer);
            }
        }
    }
    all
}

/// The plan's victims, the pods sharing their claims included ([`with_sharers`]), with what
/// the handover needs of each: its queue's settings and what it frees.
fn victims_of(snapshot: &Snapshot, plan: &NodePlan, now: Timestamp) -> Vec<Victim> {
    with_sharers(snapshot, &plan.victims)
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
                uid: slot.pod.uid.clone(),
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
        .collect()
}

/// The victims of other reclaims on `node` an owner with `request` waits for besides its own
/// `victims`: none when its own free its room, else every one marked there (its room is then
/// partly theirs).
pub(crate) fn awaited_victims(
    snapshot: &Snapshot,
    node: NodeId,
    request: &Request,
    victims: &[PodId],
) -> Vec<PodKey> {
    // Pods already leaving that share a victim's claim: its devices come free only once they
    // are gone too.
    let mut awaited: Vec<PodKey> = Vec::new();
    let sharers = victims.iter().flat_map(|v| snapshot.claim_sharers_of(*v));
    for sharer in sharers.filter(|p| !victims.contains(p)) {
        let Some(slot) = snapshot.slot(sharer).filter(|s| s.pod.is_leaving()) else {
            continue;
        };
        if !awaited.contains(&slot.pod.key) {
            awaited.push(slot.pod.key.clone());
        }
    }
    let n = snapshot.node_state(node);
    let mut trial = Trial::of(n);
    for v in victims {
        try_release(&mut trial, snapshot, *v, 1);
    }
    if request.has_room(n.layout(), &trial.free, trial.cpu, trial.memory) {
        return awaited;
    }
    for v in snapshot.marked_victims_on(node) {
        let Some(slot) = snapshot.slot(v).filter(|_| !victims.contains(&v)) else {
            continue;
        };
        if !awaited.contains(&slot.pod.key) {
            awaited.push(slot.pod.key.clone());
        }
    }
    awaited
}

/// Whether kube-scheduler would preempt for `owner` on node `n`: it outranks a pod seated
/// there and its `preemptionPolicy` allows it.
fn preempts_on(snapshot: &Snapshot, n: &NodeState, owner: Option<&Pod>) -> bool {
    owner.filter(|o| o.preempts).is_some_and(|owner| {
        n.pods()
            .iter()
            .filter_map(|p| snapshot.slot(*p))
            .any(|s| s.pod.priority < owner.priority)
    })
}

impl fmt::Display for ReclaimPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut victims: Vec<String> = self
            .victims
            .iter()
            .map(|v| format!("{} ({})", v.key, v.queue))
            .collect();
        if victims.is_empty() {
            victims.push("nobody (the victims of other reclaims on the node free its room)".into());
        }
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
