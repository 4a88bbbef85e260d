//! Enforcement: which unadmitted pods to evict, and why.
//!
//! An unadmitted pod ([`Pod::unadmitted`](crate::model::Pod::unadmitted): it holds or may hold
//! capacity with no record of gpuqueue's admission) is charged to its queue like any other pod,
//! and it is the first to go.
//! Newest first, and no more than needed, unadmitted pods are evicted when:
//! - **their queue is over its ceiling** (guaranteed + burstable, counting only pods that are
//!   not already leaving): until the queue is within its ceiling, or has no unadmitted pod
//!   left;
//! - **their queue holds more than its guarantee while another queue's pods wait within
//!   theirs** (no node has room and no reclaim makes it, or they are pinned to a node that is
//!   still full): the unadmitted pods above the guarantee go (by the ledger's line, so a
//!   straddling pod too) until what the waiting pods ask for is covered.
//!
//! Admitted pods are never evicted here: taking them is the reclaim's work, with checkpoints
//! and budgets. Pods already part of a reclaim, and terminating pods, are left alone (a
//! terminating pod counts as gone).

use std::{collections::HashMap, fmt};

use crate::admission::{Decision, WaitReason};
use crate::ids::{PodId, QueueId, ResourceId};
use crate::model::{AdmittedAs, PodKey, PodState};
use crate::quantity::{Milli, ResourceName};
use crate::reclaim::NoPlan;
use crate::snapshot::{Attribution, Snapshot};

/// An unadmitted pod to evict.
#[derive(Clone, Debug, PartialEq)]
pub struct Enforcement {
    pub pod: PodId,
    pub key: PodKey,
    pub queue: String,
    /// The resource whose quota it breaks, and how much of it the pod holds.
    pub resource: ResourceName,
    pub holds: Milli,
    pub reason: Bypass,
}

/// What an unadmitted pod's presence breaks.
#[derive(Clone, Debug, PartialEq)]
pub enum Bypass {
    /// Its queue is over its ceiling.
    OverCeiling { allocated: Milli, ceiling: Milli },
    /// Its queue is above its guarantee while these queues wait within theirs.
    HoldsGuarantee {
        allocated: Milli,
        guaranteed: Milli,
        waiting: Vec<String>,
    },
}

impl Bypass {
    /// A stable `PascalCase` code for logs and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::OverCeiling { .. } => "OverCeiling",
            Self::HoldsGuarantee { .. } => "HoldsGuarantee",
        }
    }
}

impl fmt::Display for Enforcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            queue,
            resource,
            holds,
            ..
        } = self;
        write!(
            f,
            "it holds {holds} {resource} of queue {queue} without admission"
        )?;
        match &self.reason {
            Bypass::OverCeiling { allocated, ceiling } => write!(
                f,
                " and {queue} is over its ceiling of {ceiling} ({allocated} allocated)"
            )?,
            Bypass::HoldsGuarantee {
                allocated,
                guaranteed,
                waiting,
            } => write!(
                f,
                " and {queue} is above its guarantee of {guaranteed} ({allocated} allocated) while queue {} waits for its guarantee",
                waiting.join(", ")
            )?,
        }
        write!(
            f,
            "; create GPU pods while the gpuqueue webhook is up, so that they wait at its gate and run within the queue's quota"
        )
    }
}

/// The unadmitted pods to evict, after the admission cycle that made `decisions` has been
/// applied to `snapshot` (so owners it pinned count as waiting there). None while the snapshot
/// may be behind the cluster ([`Snapshot::is_behind`]): a pod it shows unadmitted may have been
/// admitted or deleted since.
pub fn enforce(snapshot: &Snapshot, decisions: &[Decision]) -> Vec<Enforcement> {
    if snapshot.is_behind() {
        return Vec::new();
    }
    let mut books = Books::new(snapshot);
    let mut out = Vec::new();
    for q in snapshot.queue_ids() {
        for u in snapshot.usage(q) {
            let (resource, ceiling) = (u.resource(), u.ceiling());
            while books.live(q, resource) > ceiling {
                let allocated = books.live(q, resource);
                let Some(pod) = books.take(q, resource) else {
                    break;
                };
                out.push(books.enforcement(
                    pod,
                    resource,
                    Bypass::OverCeiling { allocated, ceiling },
                ));
            }
        }
    }
    let (mut need, waiting) = waiting_owners(snapshot, decisions);
    for q in snapshot.queue_ids() {
        for u in snapshot.usage(q) {
            let (resource, guaranteed) = (u.resource(), u.guaranteed);
            let Some(need) = need.get_mut(&resource) else {
                continue;
            };
            let others: Vec<String> = waiting
                .iter()
                .filter(|(r, owner)| *r == resource && *owner != q)
                .map(|(_, owner)| snapshot.queue(*owner).name.clone())
                .collect();
            while *need > Milli::ZERO && !others.is_empty() && books.live(q, resource) > guaranteed
            {
                let allocated = books.live(q, resource);
                let Some(pod) = books.take(q, resource) else {
                    break;
                };
                let enforcement = books.enforcement(
                    pod,
                    resource,
                    Bypass::HoldsGuarantee {
                        allocated,
                        guaranteed,
                        waiting: others.clone(),
                    },
                );
                *need = need.saturating_sub(enforcement.holds);
                out.push(enforcement);
            }
        }
    }
    out
}

/// What pods waiting within their queue's guarantee ask for, per resource, and which queues
/// (sorted, once each) wait for which resource: pods that find no room on any suitable node,
/// and owners pinned to a node that is still full.
fn waiting_owners(
    snapshot: &Snapshot,
    decisions: &[Decision],
) -> (HashMap<ResourceId, Milli>, Vec<(ResourceId, QueueId)>) {
    let no_room = decisions.iter().filter_map(|d| match d {
        Decision::Wait(w) => match &w.reason {
            WaitReason::NoRoom {
                admitted_as: AdmittedAs::Guaranteed,
                reclaim,
                ..
            } if !matches!(reclaim, Some(NoPlan::NoSuitableNode)) => Some(w.pod),
            _ => None,
        },
        _ => None,
    });
    // Pinned to a node still full, and of a queue within its guarantee (a reclaim's owner).
    let pinned = snapshot.pod_ids().filter(|p| {
        snapshot.slot(*p).is_some_and(|slot| {
            let within = |q: QueueId| {
                slot.amounts.iter().all(|(r, _)| {
                    snapshot
                        .usage_of(q, *r)
                        .is_some_and(|u| u.allocated <= u.guaranteed)
                })
            };
            slot.seat.as_ref().is_some_and(|seat| seat.deficit)
                && matches!(slot.attribution, Attribution::Queue(q) if within(q))
        })
    });
    let mut need: HashMap<ResourceId, Milli> = HashMap::new();
    let mut waiting = Vec::new();
    for pod in no_room.chain(pinned) {
        let Some(slot) = snapshot.slot(pod) else {
            continue;
        };
        let Attribution::Queue(q) = slot.attribution else {
            continue;
        };
        for (resource, amount) in &slot.amounts {
            *need.entry(*resource).or_default() += *amount;
            waiting.push((*resource, q));
        }
    }
    waiting.sort_unstable_by_key(|(r, q)| (*r, *q));
    waiting.dedup();
    (need, waiting)
}

/// Each queue's usage as enforcement sees it (pods leaving or chosen count as gone), and its
/// unadmitted pods that may still be chosen, newest first.
struct Books<'a> {
    snapshot: &'a Snapshot,
    live: HashMap<(QueueId, ResourceId), Milli>,
    /// Per queue, the candidates, oldest first (taken from the end).
    candidates: Vec<Vec<PodId>>,
}

impl<'a> Books<'a> {
    fn new(snapshot: &'a Snapshot) -> Self {
        let mut live = HashMap::new();
        for q in snapshot.queue_ids() {
            for u in snapshot.usage(q) {
                live.insert((q, u.resource()), u.allocated);
            }
        }
        let mut candidates = vec![Vec::new(); snapshot.queue_count()];
        for p in snapshot.pod_ids() {
            let Some(slot) = snapshot.slot(p) else {
                continue;
            };
            let (Attribution::Queue(q), PodState::Admitted(assignment)) =
                (&slot.attribution, &slot.pod.state)
            else {
                continue;
            };
            if assignment.terminating {
                for (resource, amount) in &slot.amounts {
                    if let Some(held) = live.get_mut(&(*q, *resource)) {
                        *held = held.saturating_sub(*amount);
                    }
                }
            } else if slot.pod.unadmitted && slot.pod.reclaim.is_none() {
                candidates[q.index()].push(p);
            }
        }
        for pods in &mut candidates {
            pods.sort_by_key(|p| {
                snapshot
                    .pod(*p)
                    .map(|pod| (pod.created_at, pod.key.clone()))
            });
        }
        Self {
            snapshot,
            live,
            candidates,
        }
    }

    fn live(&self, queue: QueueId, resource: ResourceId) -> Milli {
        self.live
            .get(&(queue, resource))
            .copied()
            .unwrap_or(Milli::ZERO)
    }

    /// Takes the queue's newest candidate that holds some `resource`, and counts it as gone.
    fn take(&mut self, queue: QueueId, resource: ResourceId) -> Option<PodId> {
        let snapshot = self.snapshot;
        let holds = |p: &PodId| {
            snapshot.slot(*p).is_some_and(|s| {
                s.amounts
                    .iter()
                    .any(|(r, m)| *r == resource && *m > Milli::ZERO)
            })
        };
        let pods = &mut self.candidates[queue.index()];
        let at = pods.iter().rposition(holds)?;
        let pod = pods.remove(at);
        for (r, amount) in self.snapshot.slot(pod).map_or(&[][..], |s| &s.amounts[..]) {
            if let Some(held) = self.live.get_mut(&(queue, *r)) {
                *held = held.saturating_sub(*amount);
            }
        }
        Some(pod)
    }

    fn enforcement(&self, pod: PodId, resource: ResourceId, reason: Bypass) -> Enforcement {
        let slot = self.snapshot.slot(pod);
        let queue = self
            .snapshot
            .pod_queue(pod)
            .map(|q| self.snapshot.queue(q).name.clone())
            .unwrap_or_default();
        Enforcement {
            pod,
            key: slot.map_or_else(|| PodKey::new("", ""), |s| s.pod.key.clone()),
            queue,
            resource: self.snapshot.resource_name(resource).clone(),
            holds: slot
                .and_then(|s| s.amounts.iter().find(|(r, _)| *r == resource))
                .map_or(Milli::ZERO, |(_, m)| *m),
            reason,
        }
    }
}
