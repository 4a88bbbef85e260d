//! Bursts: the reclaims one admission pass plans on one node, kept minimal as a set.
//!
//! [`crate::admission::admission_cycle`] plans the owners of a burst one after the other
//! against one snapshot, each counting the room the victims chosen before it free (see
//! [`crate::snapshot`]'s promises). Each plan is minimal for its owner given those, but not the
//! set: a later owner's victim may free enough to make an earlier one's unnecessary. So after
//! each plan on a node, every victim this pass chose there is tried without, newest first (the
//! fill-back of a single plan, over the set), and one the node's owners can do without is put
//! back: removing any victim left breaks the fit of some owner pinned there.

use crate::devices::Trial;
use crate::ids::{NodeId, PodId};
use crate::reclaim::{ReclaimPlan, awaited_victims};
use crate::snapshot::Snapshot;

/// Puts back every victim of `plans` (this pass's plans on `node`, in planning order) that the
/// owners waiting on the node do without; the dropped victims are unmarked in `snapshot`.
pub fn keep_minimal(snapshot: &mut Snapshot, node: NodeId, plans: &mut [&mut ReclaimPlan]) {
    let mine: Vec<PodId> = plans
        .iter()
        .flat_map(|p| p.victims.iter().map(|v| v.pod))
        .collect();
    // A pod evicted because it shares a victim's DRA claim frees nothing alone: it is kept or
    // dropped with that victim, never tried by itself.
    let sharing: Vec<PodId> = mine
        .iter()
        .flat_map(|v| sharers_among(snapshot, *v, &mine))
        .collect();
    let mut dropped = Vec::new();
    for candidate in mine.iter().rev().filter(|v| !sharing.contains(v)) {
        let sharers = sharers_among(snapshot, *candidate, &mine);
        // Put back with the candidate, its sharers stay too (they hold CPU and memory).
        let kept: Vec<PodId> = dropped
            .iter()
            .copied()
            .chain(sharers.into_iter().filter(|s| !dropped.contains(s)))
            .collect();
        if owners_fit_without(snapshot, node, &kept, *candidate) {
            dropped = kept;
            dropped.push(*candidate);
        }
    }
    if dropped.is_empty() {
        return;
    }
    for pod in &dropped {
        snapshot.unmark_victim(*pod);
    }
    // An owner whose victim was put back counts on the others' room now.
    for plan in plans.iter_mut() {
        plan.victims.retain(|v| !dropped.contains(&v.pod));
        let own: Vec<PodId> = plan.victims.iter().map(|v| v.pod).collect();
        let request = snapshot
            .slot(plan.owner)
            .and_then(|slot| snapshot.request(&slot.pod));
        if let Some(request) = request {
            plan.awaits = awaited_victims(snapshot, node, &request, &own);
        }
    }
}

/// The pods among `victims` that share a DRA claim `victim` is charged for.
fn sharers_among(snapshot: &Snapshot, victim: PodId, victims: &[PodId]) -> Vec<PodId> {
    snapshot
        .claim_sharers_of(victim)
        .filter(|p| victims.contains(p))
        .collect()
}

/// Whether every owner waiting on `node` fits once the marked victims are gone, but for
/// `kept` and `candidate`, which stay.
fn owners_fit_without(snapshot: &Snapshot, node: NodeId, kept: &[PodId], candidate: PodId) -> bool {
    let Some(promised) = snapshot.promised(node) else {
        return false;
    };
    let n = snapshot.node_state(node);
    let mut trial = Trial::of(n);
    for v in promised.victims() {
        if *v != candidate && !kept.contains(v) {
            snapshot.release_on(&mut trial, *v, 1);
        }
    }
    promised.seat_owners(n, &mut trial)
}
