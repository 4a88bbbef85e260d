//! What a node has promised: the reclaim owners pinned there that wait for room (its deficit)
//! and the victims being freed for them. Several owners of one burst share a node, so a plan
//! for one more owner counts the room those victims free as the waiting owners' first, and only
//! the rest as its own.

use super::Snapshot;
use crate::devices::{NodeState, Request, Trial, host_amount};
use crate::ids::{NodeId, PodId};

/// The owners waiting on one node and the victims evicted for them.
pub(crate) struct Promised<'a> {
    /// The deficit's owners, oldest first, as the node seats them.
    owners: Vec<Request<'a>>,
    /// Seated pods marked as victims of a reclaim: they leave, and their room is promised.
    victims: Vec<PodId>,
}

impl Snapshot {
    /// The node's promises, when owners wait in its deficit.
    pub(crate) fn promised(&self, node: NodeId) -> Option<Promised<'_>> {
        let n = self.node_state(node);
        if !n.is_oversubscribed() {
            return None;
        }
        let owners = n
            .deficit()
            .iter()
            .filter_map(|p| self.request(&self.slot(*p)?.pod))
            .collect();
        let victims = self.marked_victims_on(node).collect();
        Some(Promised { owners, victims })
    }

    /// The seated pods of a node marked as some reclaim's victims.
    pub(crate) fn marked_victims_on(&self, node: NodeId) -> impl Iterator<Item = PodId> + '_ {
        self.node_state(node)
            .pods()
            .iter()
            .copied()
            .filter(|p| self.slot(*p).is_some_and(|s| s.pod.is_reclaim_victim()))
    }

    /// Gives back (`sign` = 1) or takes again (`sign` = -1) what a seated pod holds, on a
    /// trial of its node. (A pod charged for a DRA claim others share gives back the claim's
    /// devices: a reclaim evicts the others with it, see `reclaim::with_sharers`.)
    pub(crate) fn release_on(&self, trial: &mut Trial, pod: PodId, sign: i8) {
        let Some(slot) = self.slot(pod) else {
            return;
        };
        let Some(seat) = slot.seat.as_ref().filter(|s| !s.deficit) else {
            return;
        };
        let cpu = host_amount(slot.pod.requests.cpu_milli);
        let memory = host_amount(slot.pod.requests.memory_bytes);
        trial.release(&seat.charges, cpu, memory, sign);
    }
}

impl Promised<'_> {
    /// The victims whose room is promised.
    pub(crate) fn victims(&self) -> &[PodId] {
        &self.victims
    }

    /// Seats every waiting owner on `trial`, oldest first, on the lowest devices that fit.
    /// False when one does not fit: the trial's room does not keep the node's promises.
    pub(crate) fn seat_owners(&self, n: &NodeState, trial: &mut Trial) -> bool {
        let mut charges = Vec::new();
        self.owners.iter().all(|owner| {
            let fits = owner.charges_in(n.layout(), &trial.free, None, &mut charges)
                && trial.cpu >= owner.cpu
                && trial.memory >= owner.memory;
            if fits {
                trial.release(&charges, owner.cpu, owner.memory, -1);
            }
            fits
        })
    }
}
