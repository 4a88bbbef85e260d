//! The placement policy: which scorer ranks the nodes and how ties between equally scored
//! nodes are broken. [`Policy::default`] is the one the operator decides with, and the one the
//! simulator replays, so the two cannot drift apart.

use std::cell::OnceCell;
use std::cmp::{Ordering, Reverse};

use crate::devices::{Charge, Placement, Request};
use crate::ids::NodeId;
use crate::model::Pod;
use crate::placement::{Candidate, FragmentationAware, Score, Scorer, TieBreak};
use crate::snapshot::Snapshot;

/// A scorer and a tie-break.
#[derive(Clone, Copy)]
pub struct Policy<'a> {
    pub scorer: &'a dyn Scorer,
    pub tie: TieBreak,
}

impl<'a> Policy<'a> {
    pub fn new(scorer: &'a dyn Scorer, tie: TieBreak) -> Self {
        Self { scorer, tie }
    }
}

impl Default for Policy<'static> {
    /// Ours ([`FragmentationAware`]), ties to the first node by name: deterministic, as the
    /// operator needs.
    fn default() -> Self {
        Self::new(&FragmentationAware, TieBreak::First)
    }
}

impl std::fmt::Debug for Policy<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("tie", &self.tie)
            .finish_non_exhaustive()
    }
}

/// How nodes compare: score, tie score, then the tie-break key (lower wins).
type Rank = (f64, f64, Reverse<u64>);

impl Policy<'_> {
    /// The best node and devices for `pod` now; `None` when no node fits.
    pub fn find_placement(&self, snapshot: &Snapshot, pod: &Pod) -> Option<Placement> {
        self.find_placement_where(snapshot, pod, &|_| true)
    }

    /// [`Policy::find_placement`] among the nodes `allowed` accepts (quota rules such as a
    /// GPU memory cap).
    pub fn find_placement_where(
        &self,
        snapshot: &Snapshot,
        pod: &Pod,
        allowed: &dyn Fn(NodeId) -> bool,
    ) -> Option<Placement> {
        let request = snapshot.request(pod)?;
        let mut scratch = Vec::new();
        let mut charges = Vec::new();
        let mut best: Option<(Rank, NodeId, Option<u16>)> = None;
        for (id, n) in snapshot.node_states() {
            if !request.admits(n) || !allowed(id) {
                continue;
            }
            let Some((score, option)) =
                self.best_option(snapshot, &request, id, &mut scratch, &mut charges)
            else {
                continue;
            };
            let key = (score.node, score.tie, Reverse(self.tie.key(id)));
            if best
                .as_ref()
                .is_none_or(|(b, _, _)| key.partial_cmp(b).is_some_and(Ordering::is_gt))
            {
                best = Some((key, id, option));
            }
        }
        let ((score, _, _), node, option) = best?;
        let n = snapshot.node_state(node);
        request.charges(n, option, &mut charges);
        Some(Placement {
            node,
            node_name: n.node().name.clone(),
            pin: n.node().hostname().to_string(),
            devices: snapshot.device_sets(node, &charges),
            score,
            charges,
        })
    }

    /// The node's best option for the request: the device shared (for a shared request) or
    /// the canonical whole devices, with its score. `None` when the request does not fit.
    fn best_option(
        &self,
        snapshot: &Snapshot,
        request: &Request,
        node: NodeId,
        scratch: &mut Vec<u16>,
        charges: &mut Vec<Charge>,
    ) -> Option<(Score, Option<u16>)> {
        let n = snapshot.node_state(node);
        let frag = snapshot.frag_index();
        let per_copy = snapshot.frag_index_per_copy();
        let mut best: Option<(Score, Option<u16>)> = None;
        let unfillable_before = OnceCell::new();
        let per_copy_before = OnceCell::new();
        let per_copy_unfillable_before = OnceCell::new();
        let mut consider = |option: Option<u16>,
                            charges: &mut Vec<Charge>,
                            scratch: &mut Vec<u16>| {
            if !request.charges(n, option, charges) {
                return false;
            }
            scratch.clear();
            scratch.extend_from_slice(n.free());
            for c in charges.iter() {
                scratch[usize::from(c.device)] -= c.milli;
            }
            let mut after = n.view();
            after.free = scratch;
            after.cpu_free -= request.cpu;
            after.memory_free -= request.memory;
            let candidate = Candidate {
                node,
                before: n.view(),
                after,
                request_cpu_milli: request.cpu_milli,
                request_gpu_milli: request.gpu_milli,
                request_devices: request.gpus.first().map_or(0, |g| u32::from(g.count)),
                request_milli_per_device: request.gpus.first().map_or(0, |g| u32::from(g.milli)),
                shared_device: option.map(usize::from),
                frag,
                frag_before: n.fragmentation(),
                unfillable_before: &unfillable_before,
                per_copy,
                per_copy_before: &per_copy_before,
                per_copy_unfillable_before: &per_copy_unfillable_before,
            };
            let score = self.scorer.score(&candidate);
            if best.as_ref().is_none_or(|(b, _)| {
                (score.node, score.tie, score.device) > (b.node, b.tie, b.device)
            }) {
                best = Some((score, option));
            }
            true
        };
        match request.shared_pool(n) {
            Some(pool) => {
                // Devices with the same free milli score alike: score each value once, on the
                // first device where the request fits (another may lack its memory).
                let mut seen = [0u64; 16];
                for (d, f) in (pool.start..).zip(n.pool_free(pool).iter().copied()) {
                    let (word, bit) = (usize::from(f / 64), f % 64);
                    if f < request.shared_milli || seen[word] & (1 << bit) != 0 {
                        continue;
                    }
                    if consider(Some(d), charges, scratch) {
                        seen[word] |= 1 << bit;
                    }
                }
            }
            None => {
                consider(None, charges, scratch);
            }
        }
        best
    }
}
