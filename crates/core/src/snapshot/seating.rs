//! Seating: keeps each node's devices, each queue's ledger and each node's fragmentation in
//! step as a pod is charged, seated on devices (or pinned as a node's deficit) and unseated.

use smallvec::SmallVec;

use super::{Attribution, Snapshot};
use crate::devices::{Charge, Seat, host_amount, unit_cost};
use crate::ids::{NodeId, PodId, ResourceId};
use crate::ledger::{Protection, signed_add};
use crate::model::{Assignment, Pod, PodState, ReclaimMark, ReclaimRole};

/// How `Snapshot::seat` places a pod's device charges.
pub(super) enum SeatMode {
    /// On exactly these devices.
    Exact(Vec<Charge>),
    /// On the lowest-numbered devices that fit, else as the node's deficit.
    CanonicalOrDeficit,
    /// As the node's deficit.
    Deficit,
}

impl Snapshot {
    /// Charges (`sign` = 1) or refunds (`sign` = -1) a pod's requests to its queue's ledger or
    /// to the unmanaged total, as pending or allocated by its state.
    pub(super) fn charge_queue(&mut self, id: PodId, sign: i8) {
        let Some(slot) = self.pods[id.index()].as_ref() else {
            return;
        };
        let admitted = slot.pod.is_admitted();
        match slot.attribution {
            Attribution::Queue(q) => {
                let protection = admitted.then(|| Protection {
                    reserved_unseen: slot.pod.reserved_unseen,
                    terminating: slot.pod.is_terminating(),
                    recorded: !slot.pod.unadmitted,
                    priority: slot.pod.priority,
                    since: slot
                        .pod
                        .admitted_at
                        .unwrap_or_else(|| slot.pod.running_since()),
                    pod: slot.pod.clone(),
                    id,
                });
                self.queues[q.index()].charge(&slot.amounts, protection, sign);
            }
            Attribution::Conflict { .. } | Attribution::Unclaimed => {
                if admitted {
                    for (resource, amount) in &slot.amounts {
                        let held = &mut self.unmanaged[resource.index()];
                        *held = signed_add(*held, *amount, sign);
                    }
                }
            }
        }
    }

    /// The lowest-numbered devices of `node` that fit the pod's requests now.
    fn canonical_charges(&self, id: PodId, node: NodeId) -> Option<Vec<Charge>> {
        let slot = self.slot(id)?;
        self.nodes[node.index()].canonical_charges(id, &slot.gpus)
    }

    /// Seats an admitted pod on a node as `how` says. False when it does not fit there.
    pub(super) fn seat(&mut self, id: PodId, node: NodeId, how: SeatMode) -> bool {
        let (charges, allow_deficit) = match how {
            SeatMode::Exact(charges) => (Some(charges), false),
            SeatMode::CanonicalOrDeficit => (self.canonical_charges(id, node), true),
            SeatMode::Deficit => (None, true),
        };
        let Some(slot) = self.pods[id.index()].as_mut() else {
            return false;
        };
        let (cpu, memory) = host_requests(&slot.pod);
        let awaits_bind = awaits_bind(&slot.pod);
        let n = &mut self.nodes[node.index()];
        match charges {
            Some(charges) => {
                n.seat(id, &charges, cpu, memory);
                if awaits_bind {
                    n.await_bind(id);
                }
                slot.seat = Some(Seat {
                    node,
                    charges: SmallVec::from_slice(&charges),
                    deficit: false,
                });
            }
            None if allow_deficit => {
                n.add_deficit(id);
                slot.seat = Some(Seat {
                    node,
                    charges: SmallVec::new(),
                    deficit: true,
                });
            }
            None => return false,
        }
        self.add_memory(id, 1);
        self.refresh_frag(node);
        true
    }

    /// Adds or removes the GPU memory and compute a seated pod holds on its node to its
    /// queue's ledger (what its units take of the node's devices: see `devices::unit_cost`).
    fn add_memory(&mut self, id: PodId, sign: i8) {
        let Some(slot) = self.slot(id) else { return };
        let (Attribution::Queue(q), Some(seat)) = (&slot.attribution, &slot.seat) else {
            return;
        };
        let n = &self.nodes[seat.node.index()];
        let held: Vec<(ResourceId, u64, u64)> = slot
            .gpus
            .iter()
            .filter_map(|gpu| {
                let cost = unit_cost(n.pool(gpu.resource)?, gpu);
                let units = u64::from(gpu.count);
                Some((
                    gpu.resource,
                    u64::from(cost.memory_mib) * units,
                    u64::from(cost.compute_milli) * units,
                ))
            })
            .collect();
        let q = *q;
        for (resource, mib, milli) in held {
            let usage = self.queues[q.index()].usage_mut(resource);
            if sign > 0 {
                usage.memory_mib += mib;
                usage.cores_milli += milli;
            } else {
                usage.memory_mib = usage.memory_mib.saturating_sub(mib);
                usage.cores_milli = usage.cores_milli.saturating_sub(milli);
            }
        }
    }

    /// Frees what a pod holds on its node; with `reseat`, pods waiting in the node's deficit
    /// take the room, oldest first.
    pub(super) fn unseat(&mut self, id: PodId, reseat: bool) {
        self.add_memory(id, -1);
        let Some(seat) = self.pods[id.index()].as_mut().and_then(|s| s.seat.take()) else {
            return;
        };
        let Some(slot) = self.pods[id.index()].as_ref() else {
            return;
        };
        let (cpu, memory) = host_requests(&slot.pod);
        let n = &mut self.nodes[seat.node.index()];
        if seat.deficit {
            n.remove_deficit(id);
        } else {
            n.unseat(id, &seat.charges, cpu, memory);
        }
        if reseat {
            self.reseat_deficit(seat.node);
        }
        self.refresh_frag(seat.node);
    }

    /// Seats the pods waiting in a node's deficit, oldest first, while they fit. Each is tried
    /// against the devices alone: the others still waiting must not count as holding the node
    /// (with two or more waiting, none would ever be seated).
    fn reseat_deficit(&mut self, node: NodeId) {
        let waiting = self.nodes[node.index()].deficit().to_vec();
        for pod in waiting {
            let charges = self
                .slot(pod)
                .and_then(|slot| self.nodes[node.index()].lowest_charges(&slot.gpus));
            let Some(charges) = charges else {
                break;
            };
            self.nodes[node.index()].remove_deficit(pod);
            self.add_memory(pod, -1);
            if let Some(s) = self.pods[pod.index()].as_mut() {
                s.seat = None;
            }
            self.seat(pod, node, SeatMode::Exact(charges));
        }
    }

    pub(super) fn refresh_frag(&mut self, id: NodeId) {
        let n = &self.nodes[id.index()];
        let f = self.frag.as_ref().map_or(0.0, |index| {
            index.node_fragmentation(n.model(), n.cpu_free(), n.layout(), n.free())
        });
        self.nodes[id.index()].set_fragmentation(f);
    }
}

/// Whether a pod is a reclaim's owner that kube-scheduler has not bound yet.
fn awaits_bind(pod: &Pod) -> bool {
    matches!(
        (&pod.reclaim, &pod.state),
        (
            Some(ReclaimMark {
                role: ReclaimRole::Owner,
                ..
            }),
            PodState::Admitted(Assignment { bound: false, .. })
        )
    )
}

/// A pod's CPU and memory requests, as the node's free amounts count them.
fn host_requests(pod: &Pod) -> (i64, i64) {
    (
        host_amount(pod.requests.cpu_milli),
        host_amount(pod.requests.memory_bytes),
    )
}
