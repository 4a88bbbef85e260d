//! A snapshot kept from build to build, for a caller that builds one from the whole cluster
//! again and again (the operator, every admission pass). Indexing 10,000 pods each time was most
//! of a pass; between two passes only a few pods change. So the last build is kept, and when the
//! queues, namespaces and nodes are the same and few pods changed, it is brought up to date and
//! copied instead.
//!
//! A pod is the same when it is the same object (`Arc` address): the caller shares unchanged
//! models from build to build, and any change makes a new one. An update gives the snapshot a
//! full build would give, but for the pods' ids (an added pod takes a removed one's slot):
//! every node a changed pod was or is seated on is seated again from empty, its pods in the
//! seating order `build` uses, so devices, deficits, ledger and fragmentation come out as a
//! build's, and a pod naming devices another took first is seated on free ones as a build seats
//! it.
//! The workload mix, where it is the pods' own ([`SnapshotBuilder::workload_mix_of_pods`]), is
//! counted for the changed pods only, and every node is measured against a new one last, as
//! `build` does. Where an update cannot promise a build's snapshot, it builds one:
//!
//! - a queue, namespace or node changed (by value: a node's object may be new and equal);
//! - many pods changed (more than one in [`MAX_CHANGED_SHARE`]): building is cheaper then;
//! - a changed pod's node has pinned pods waiting for room (a deficit): who waits depends on
//!   the order the node's pods came in since;
//! - an added pod brings a resource name the snapshot did not know (ids are handed out in the
//!   order names are first seen) or shares a key with another pod;
//! - empty slots outnumber a quarter of the pods.
//!
//! The issues an update reports are those of the pods it added or left out; the last build's
//! are not repeated.

use std::sync::Arc;

use super::build::seating_rank;
use super::{Index, Snapshot, SnapshotBuilder, SnapshotError};
use crate::fragmentation::{ShapeCounts, WorkloadMix};
use crate::ids::{NodeId, PodId};
use crate::model::{Assignment, Namespace, Node, Pod, PodState, Queue};

/// The largest share of the pods that may change between two builds for an update (past it,
/// building again is cheaper): one in eight.
pub const MAX_CHANGED_SHARE: usize = 8;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct KeptSnapshot {
    last: Option<Last>,
}

/// How [`KeptSnapshot::build`] made its snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Made {
    /// Built from every object.
    Built,
    /// The last build brought up to date: pods removed and added.
    Updated { removed: usize, added: usize },
}

#[derive(Debug)]
struct Last {
    /// As built or updated, before any caller changed a copy.
    snapshot: Snapshot,
    queues: Vec<Queue>,
    namespaces: Vec<Namespace>,
    nodes: Vec<Arc<Node>>,
    mix: Option<WorkloadMix>,
    /// The pods' shapes and the popularity cut, where the mix is the pods'.
    shapes: Option<(ShapeCounts, f64)>,
    /// Every pod given, by address, with its id (`None`: left out).
    pods: Index<usize, Given>,
    /// Counts updates, to find the pods a build was not given again.
    round: u64,
    /// Empty slots, which added pods take first.
    holes: Vec<PodId>,
}

#[derive(Debug)]
struct Given {
    id: Option<PodId>,
    round: u64,
    /// Held, so that no other object takes this address while the entry lives (an accepted
    /// pod is held by its slot too), and uncounted from the mix when gone.
    pod: Arc<Pod>,
}

/// An update that must give way to a build.
struct Rebuild;

fn address(pod: &Arc<Pod>) -> usize {
    Arc::as_ptr(pod).addr()
}

impl KeptSnapshot {
    /// The snapshot `builder` describes, and the issues found with its objects: the last one
    /// brought up to date where that gives the same snapshot, else built anew. Either way the
    /// snapshot is the caller's to change; what is kept is not.
    pub fn build(&mut self, builder: SnapshotBuilder) -> (Snapshot, Vec<SnapshotError>, Made) {
        let builder = builder.normalized();
        if let Some(last) = self.last.as_mut() {
            match last.update(&builder) {
                Ok((issues, made)) => return (last.snapshot.clone(), issues, made),
                Err(Rebuild) => self.last = None,
            }
        }
        let (last, issues) = Last::build(builder);
        let snapshot = last.snapshot.clone();
        self.last = Some(last);
        (snapshot, issues, Made::Built)
    }
}

impl SnapshotBuilder {
    /// Queues, namespaces and nodes in the order `build` indexes them, so that two builders of
    /// the same cluster compare equal.
    fn normalized(mut self) -> Self {
        self.queues.sort_by(|a, b| a.name.cmp(&b.name));
        self.namespaces.sort_by(|a, b| a.name.cmp(&b.name));
        self.namespaces.dedup_by(|a, b| a.name == b.name);
        self.nodes.sort_by(|a, b| a.name.cmp(&b.name));
        self
    }
}

impl Last {
    fn build(mut builder: SnapshotBuilder) -> (Self, Vec<SnapshotError>) {
        let shapes = builder.mix_of_pods.take().map(|popularity| {
            let counts = ShapeCounts::of(builder.pods.iter().map(AsRef::as_ref));
            builder.mix = Some(counts.mix(popularity));
            (counts, popularity)
        });
        let queues = builder.queues.clone();
        let namespaces = builder.namespaces.clone();
        let nodes = builder.nodes.clone();
        let mix = builder.mix.clone();
        let mut pods = Index::with_capacity_and_hasher(
            builder.pods.len(),
            foldhash::fast::RandomState::default(),
        );
        let (snapshot, issues) = builder.build_telling(|pod, id| {
            pods.insert(address(&pod), Given { id, round: 0, pod });
        });
        let last = Self {
            queues,
            namespaces,
            nodes,
            mix,
            shapes,
            holes: (0..snapshot.pods.len())
                .map(PodId::at)
                .filter(|id| snapshot.slot(*id).is_none())
                .collect(),
            snapshot,
            pods,
            round: 0,
        };
        (last, issues)
    }

    /// Brings the snapshot up to date with `builder`, or says it must be built again (then it
    /// may be left half changed): the pods that changed, the nodes they touch, those nodes'
    /// pods unseated and seated again in order, then the mix.
    fn update(&mut self, builder: &SnapshotBuilder) -> Result<(Vec<SnapshotError>, Made), Rebuild> {
        if !self.same_cluster(builder) {
            return Err(Rebuild);
        }
        let changes = self.changes(builder)?;
        self.snapshot
            .set_reclaimed_from(builder.reclaimed_from.clone());
        // The mix follows the pods, so it changes with almost every update that changes a
        // pod; `build` measures the nodes against it last, and so does this.
        let unchanged = changes.gone.is_empty() && changes.added.is_empty();
        let mix = match &self.shapes {
            Some(_) if unchanged => None,
            Some((counts, popularity)) => Some(counts.mix(*popularity)),
            None => builder.mix.clone(),
        };
        let mix = mix.filter(|mix| self.mix.as_ref() != Some(mix));
        let issues = if unchanged {
            Vec::new()
        } else {
            self.apply(&changes)?
        };
        if let Some(mix) = mix {
            self.mix = Some(mix.clone());
            self.snapshot.set_workload_mix(mix);
        }
        Ok((issues, changes.made))
    }

    /// Whether the queues, namespaces and nodes are those of the last build.
    fn same_cluster(&self, builder: &SnapshotBuilder) -> bool {
        let same_nodes = self.nodes.len() == builder.nodes.len()
            && self
                .nodes
                .iter()
                .zip(&builder.nodes)
                .all(|(a, b)| Arc::ptr_eq(a, b) || a == b);
        let same_mix_rule = match (&self.shapes, builder.mix_of_pods) {
            (Some((_, kept)), Some(given)) => kept.total_cmp(&given).is_eq(),
            (None, None) => self.mix.is_none() || builder.mix.is_some(),
            _ => false,
        };
        same_nodes
            && same_mix_rule
            && self.queues == builder.queues
            && self.namespaces == builder.namespaces
    }

    /// The pods gone since the last build and those to add (new ones, and those left out
    /// before: naming devices another pod held, or sharing a key with a removed one, a pod
    /// may be taken now); too many for an update is a rebuild.
    fn changes(&mut self, builder: &SnapshotBuilder) -> Result<Changes, Rebuild> {
        self.round += 1;
        let round = self.round;
        let mut added = Vec::new();
        let mut new = 0;
        for pod in &builder.pods {
            if let Some(given) = self.pods.get_mut(&address(pod)) {
                given.round = round;
                if given.id.is_none() {
                    added.push(pod.clone());
                }
            } else {
                new += 1;
                added.push(pod.clone());
                if let Some((counts, _)) = &mut self.shapes {
                    counts.add(pod);
                }
            }
        }
        let mut gone = Vec::new();
        for (at, given) in &self.pods {
            if given.round != round {
                gone.push((*at, given.id));
                if let Some((counts, _)) = &mut self.shapes {
                    counts.remove(&given.pod);
                }
            }
        }
        // Pods left out before are given again only with a change: the same pods of the same
        // cluster leave them out again, and trying cost a reseat of their nodes every pass
        // (and a rebuild where they are many, or one of those nodes is oversubscribed).
        if new == 0 && gone.is_empty() {
            added.clear();
        }
        let live = builder.pods.len().max(64);
        if (gone.len() + added.len()) * MAX_CHANGED_SHARE > live || self.holes.len() * 4 > live {
            return Err(Rebuild);
        }
        Ok(Changes {
            made: Made::Updated {
                removed: gone.iter().filter(|(_, id)| id.is_some()).count(),
                added: new,
            },
            gone,
            added,
        })
    }

    /// Removes and adds the changed pods, and seats every node they touch again from empty.
    fn apply(&mut self, changes: &Changes) -> Result<Vec<SnapshotError>, Rebuild> {
        let s = &mut self.snapshot;
        let touched = touched_nodes(s, changes);
        if touched.iter().any(|node| s.is_oversubscribed(*node)) {
            return Err(Rebuild);
        }
        for (at, id) in &changes.gone {
            if let Some(id) = id {
                s.remove_pod(*id);
                self.holes.push(*id);
            }
            self.pods.remove(at);
        }
        let mut reseat: Vec<(NodeId, PodId)> = Vec::new();
        for node in &touched {
            let seated = s.nodes[node.index()].pods().to_vec();
            for id in seated {
                s.unseat(id, false);
                reseat.push((*node, id));
            }
        }
        let resources = s.resources.len();
        let mut issues = Vec::new();
        for pod in &changes.added {
            let hole = self.holes.pop();
            let inserted = s.insert_pod(pod.clone(), hole);
            if let Some(hole) = hole
                && !matches!(inserted, Ok((id, _)) if id == hole)
            {
                self.holes.push(hole);
            }
            let id = match inserted {
                Ok((id, node)) => {
                    reseat.extend(node.map(|node| (node, id)));
                    Some(id)
                }
                Err(SnapshotError::DuplicatePod(_)) => return Err(Rebuild),
                Err(e) => {
                    issues.push(e);
                    None
                }
            };
            let given = Given {
                id,
                round: self.round,
                pod: pod.clone(),
            };
            self.pods.insert(address(pod), given);
        }
        if s.resources.len() != resources {
            return Err(Rebuild);
        }
        // Each node's pods in the seating order (`build`'s), so each node is seated as a build
        // would seat it, a pod naming devices taken before it on the lowest free ones.
        let mut reseat: Vec<_> = reseat
            .into_iter()
            .filter_map(|(node, id)| {
                let pod = s.slot(id)?.pod.clone();
                Some((node, seating_rank(&pod), pod, id))
            })
            .collect();
        reseat.sort_unstable_by(|a, b| (a.0, a.1, &a.2.key).cmp(&(b.0, b.1, &b.2.key)));
        for (node, _, _, id) in reseat {
            s.seat_as_given(id, node);
        }
        s.generation += 1;
        issues.append(&mut s.build_notes);
        Ok(issues)
    }
}

/// What changed since the last build.
struct Changes {
    made: Made,
    /// Gone pods' addresses, with their ids (`None`: left out).
    gone: Vec<(usize, Option<PodId>)>,
    added: Vec<Arc<Pod>>,
}

/// The nodes the gone pods were seated on and the added ones are pinned to.
fn touched_nodes(s: &Snapshot, changes: &Changes) -> Vec<NodeId> {
    let gone = changes
        .gone
        .iter()
        .filter_map(|(_, id)| s.slot((*id)?)?.seat.as_ref().map(|seat| seat.node));
    let added = changes.added.iter().filter_map(|pod| match &pod.state {
        PodState::Admitted(Assignment {
            node: Some(name), ..
        }) => s.node_by_pin(name),
        _ => None,
    });
    let mut touched: Vec<NodeId> = gone.chain(added).collect();
    touched.sort_unstable();
    touched.dedup();
    touched
}
