//! What-if: the changes planning makes to a snapshot: admit a pod (or pin it as a reclaim's
//! owner), mark a victim, mark a pod terminating, remove a pod, and remove pods for a trial
//! that [`Snapshot::restore`] rolls back (Kueue's `SimulateWorkloadRemoval`).

use std::sync::Arc;

use jiff::Timestamp;

use super::seating::SeatMode;
use super::{Removal, Snapshot, SnapshotError, slot_key};
use crate::devices::Placement;
use crate::ids::{NodeId, PodId, QueueId};
use crate::model::{AdmittedAs, Assignment, Pod, PodState, ReclaimMark, ReclaimRole};

impl Snapshot {
    /// A reclaim took GPUs from this queue at `at`: it does not borrow again within its
    /// `minBorrowDuration`. The simulator's counterpart of
    /// [`SnapshotBuilder::reclaimed_from`](super::SnapshotBuilder::reclaimed_from), for a
    /// snapshot kept alive across reclaims.
    pub fn record_reclaimed_from(&mut self, id: QueueId, at: Timestamp) {
        let entry = self.reclaimed_from.entry(id).or_insert(at);
        *entry = (*entry).max(at);
        self.generation += 1;
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
        let fits = n.can_take(&placement.charges)
            && placement.charges.len()
                == slot
                    .gpus
                    .iter()
                    .map(|g| usize::from(g.count))
                    .sum::<usize>();
        if !fits {
            return Err(SnapshotError::DoesNotFit {
                pod: slot.pod.key.clone(),
                node: n.node().name.clone(),
            });
        }
        self.mark_admitted(id, placement.node, as_, now);
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
        self.mark_admitted(id, node, as_, now);
        self.seat(id, node, SeatMode::CanonicalOrDeficit);
        self.generation += 1;
        Ok(())
    }

    /// Moves a pending pod's charge to admitted, pinned to `node` (not yet bound); seating it on
    /// the node's devices is the caller's.
    fn mark_admitted(&mut self, id: PodId, node: NodeId, as_: AdmittedAs, now: Timestamp) {
        let pin = self.nodes[node.index()].node().name.clone();
        self.charge_queue(id, -1);
        if let Some(slot) = self.pods[id.index()].as_mut() {
            let pod = Arc::make_mut(&mut slot.pod);
            pod.state = PodState::Admitted(Assignment {
                node: Some(pin),
                bound: false,
                terminating: false,
            });
            pod.admitted_at = Some(now);
            // Admitted here, so it is no longer one that bypassed admission.
            pod.unadmitted = false;
            slot.admitted_as = Some(as_);
        }
        self.charge_queue(id, 1);
    }

    /// Marks a pod as a victim of reclaim `reclaim_id`: it keeps its GPUs until removed, but
    /// is no longer a candidate for another reclaim.
    pub fn mark_victim(&mut self, id: PodId, reclaim_id: &str) {
        if let Some(slot) = self.pods.get_mut(id.index()).and_then(Option::as_mut) {
            Arc::make_mut(&mut slot.pod).reclaim = Some(ReclaimMark {
                id: reclaim_id.to_string(),
                role: ReclaimRole::Victim,
            });
            self.generation += 1;
        }
    }

    /// Takes a victim mark back (a plan of this pass dropped, or a victim spared at its
    /// eviction): the owners on its node do without the pod.
    pub fn unmark_victim(&mut self, id: PodId) {
        if let Some(slot) = self.pods.get_mut(id.index()).and_then(Option::as_mut) {
            Arc::make_mut(&mut slot.pod).reclaim = None;
            self.generation += 1;
        }
    }

    /// An admitted pod's deletion was accepted: it keeps its room until removed, and its queue
    /// counts it as leaving (the simulator's counterpart of a `deletionTimestamp`).
    pub fn mark_terminating(&mut self, id: PodId) {
        if !self
            .slot(id)
            .is_some_and(|s| s.pod.is_admitted() && !s.pod.is_terminating())
        {
            return;
        }
        self.charge_queue(id, -1);
        if let Some(slot) = self.pods[id.index()].as_mut()
            && let PodState::Admitted(assignment) = &mut Arc::make_mut(&mut slot.pod).state
        {
            assignment.terminating = true;
        }
        self.charge_queue(id, 1);
        self.generation += 1;
    }

    /// Removes a pod (it finished, was deleted or evicted); pods waiting for its room on the
    /// node are seated.
    pub fn remove_pod(&mut self, id: PodId) -> Option<Pod> {
        self.slot(id)?;
        self.unseat(id, true);
        self.charge_queue(id, -1);
        let slot = self.pods[id.index()].take()?;
        self.pod_ids.remove(&slot.pod.key, id);
        self.generation += 1;
        Some(Arc::unwrap_or_clone(slot.pod))
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
                self.pod_ids.remove(&slot.pod.key, *id);
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
            let hash = self.pod_ids.hash(&slot.pod.key);
            self.pods[id.index()] = Some(slot);
            self.pod_ids
                .insert_unique(|id| slot_key(&self.pods, id), hash, id);
            self.charge_queue(id, 1);
            if let Some(seat) = seat {
                let how = if seat.deficit {
                    SeatMode::Deficit
                } else {
                    SeatMode::Exact(seat.charges.to_vec())
                };
                self.seat(id, seat.node, how);
            }
        }
        self.generation += 1;
        Ok(())
    }
}
