//! Bursts: an owner queue with many pods blocked by borrowers is planned in one admission
//! cycle against one snapshot. Several owners may share a node; their victims are disjoint and
//! minimal as a set (removing any victim breaks the fit of some owner pinned on its node); no
//! owner goes beyond its queue's guarantee; a node with owners pinned takes no borrower until
//! they are bound.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::collections::{BTreeMap, HashSet};

use common::world::{at, build, node, pending, queue, running};
use gpuqueue_core::Policy;
use gpuqueue_core::Snapshot;
use gpuqueue_core::admission::{Decision, admission_cycle};
use gpuqueue_core::ids::{NodeId, PodId};
use gpuqueue_core::model::{Assignment, PodKey, PodState, ReclaimMark, ReclaimRole};
use gpuqueue_core::quantity::Milli;
use gpuqueue_core::reclaim::ReclaimPlan;
use proptest::prelude::*;

fn plans(decisions: &[Decision]) -> Vec<&ReclaimPlan> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Reclaim(plan) => Some(plan),
            _ => None,
        })
        .collect()
}

/// The owners of `plans` on each node, and the victims evicted there.
fn by_node(plans: &[&ReclaimPlan]) -> BTreeMap<NodeId, (Vec<PodId>, Vec<PodId>)> {
    let mut nodes: BTreeMap<NodeId, (Vec<PodId>, Vec<PodId>)> = BTreeMap::new();
    for plan in plans {
        let entry = nodes.entry(plan.node).or_default();
        entry.0.push(plan.owner);
        entry.1.extend(plan.victims.iter().map(|v| v.pod));
    }
    nodes
}

/// Whether every one of `owners` holds devices once `removed` are gone from `after` (the
/// snapshot the cycle left, owners pinned as the node's deficit).
fn owners_seated_without(after: &Snapshot, removed: &[PodId], owners: &[PodId]) -> bool {
    let mut s = after.clone();
    for pod in removed {
        s.remove_pod(*pod);
    }
    owners.iter().all(|o| !s.pod_devices(*o).is_empty())
}

/// A cluster of `nodes` (GPUs each) full of borrowers of queue `batch` (GPUs, priority), and
/// `owners` pending pods of queue `online` (GPUs each), which is guaranteed `guarantee`.
fn burst_world(
    nodes: &[u32],
    borrowers: &[(u32, i32)],
    owners: &[u32],
    guarantee: u64,
) -> Snapshot {
    let total: u32 = nodes.iter().sum();
    let queues = vec![
        queue("online", guarantee, 0),
        queue("batch", 0, u64::from(total)),
    ];
    let node_objects = nodes
        .iter()
        .enumerate()
        .map(|(i, g)| node(&format!("n{i}"), *g))
        .collect();
    let mut s = build(queues, node_objects, Vec::new());
    // Borrowers fill the nodes in order, each where it fits.
    let mut free: Vec<u32> = nodes.to_vec();
    for (i, (gpus, priority)) in borrowers.iter().enumerate() {
        let Some(n) = free.iter().position(|f| f >= gpus) else {
            continue;
        };
        free[n] -= gpus;
        let mut pod = running(
            &format!("batch/b{i}"),
            *gpus,
            &format!("n{n}"),
            10 + i64::try_from(i).unwrap(),
        );
        pod.priority = *priority;
        s.add_pod(pod).unwrap();
    }
    for (i, gpus) in owners.iter().enumerate() {
        s.add_pod(pending(
            &format!("online/o{i}"),
            *gpus,
            500 + i64::try_from(i).unwrap(),
        ))
        .unwrap();
    }
    s
}

fn world() -> impl Strategy<Value = Snapshot> {
    (
        prop::collection::vec(2u32..=8, 1..=4),
        prop::collection::vec((1u32..=4, 0i32..3), 1..=32),
        prop::collection::vec(1u32..=3, 1..=10),
        0u64..=24,
    )
        .prop_map(|(nodes, borrowers, owners, guarantee)| {
            burst_world(&nodes, &borrowers, &owners, guarantee)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_burst_gets_disjoint_victims_minimal_as_a_set_within_its_guarantee(before in world()) {
        let mut after = before.clone();
        let decisions = admission_cycle(&mut after, &Policy::default(), at(1000));
        let plans = plans(&decisions);
        // Disjoint: each victim is checkpointed and evicted once.
        let mut seen = HashSet::new();
        for plan in &plans {
            for v in &plan.victims {
                prop_assert!(seen.insert(v.pod), "{} is a victim of two plans", v.key);
                prop_assert_eq!(before.pod_node(v.pod), Some(plan.node), "a victim is on its plan's node");
                prop_assert_eq!(v.queue.as_str(), "batch");
            }
        }
        // No owner beyond its guarantee.
        let online = before.queue_id("online").unwrap();
        let usage = &before.usage(online)[0];
        let taken: u64 = decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Reclaim(p) => Some(p.owner),
                Decision::Admit(a) if a.queue == "online" => Some(a.pod),
                _ => None,
            })
            .map(|p| before.pod(p).unwrap().requests.gpus[0].total().0)
            .sum();
        prop_assert!(usage.allocated + Milli(taken) <= usage.guaranteed);
        for (_, (owners, victims)) in by_node(&plans) {
            // Enough: once every victim of the node is gone, every owner pinned there fits.
            prop_assert!(owners_seated_without(&after, &victims, &owners), "the owners do not fit once the victims are gone");
            // Minimal as a set: keeping any one victim breaks some owner's fit.
            for keep in &victims {
                let others: Vec<PodId> = victims.iter().copied().filter(|v| v != keep).collect();
                prop_assert!(!owners_seated_without(&after, &others, &owners), "victim {:?} is not needed", keep);
            }
        }
    }
}

#[test]
fn twenty_two_owners_are_planned_in_one_cycle_sharing_nodes() {
    let borrowers = vec![(1, 0); 24];
    let mut s = burst_world(&[8, 8, 8], &borrowers, &[1; 22], 24);
    let decisions = admission_cycle(&mut s, &Policy::default(), at(1000));
    let plans = plans(&decisions);
    assert_eq!(plans.len(), 22, "every owner is planned in the one cycle");
    let nodes = by_node(&plans);
    assert_eq!(
        nodes.len(),
        3,
        "the burst is spread over every node holding borrowers"
    );
    let victims: HashSet<PodId> = plans
        .iter()
        .flat_map(|p| p.victims.iter().map(|v| v.pod))
        .collect();
    assert_eq!(
        victims.len(),
        22,
        "one victim per one-GPU owner, none twice"
    );
    assert!(
        plans.iter().all(|p| p.awaits.is_empty()),
        "each owner's own victim frees its room: it waits for no other"
    );
}

#[test]
fn an_owner_that_fits_in_the_room_another_burst_owner_frees_takes_no_victim() {
    // One borrower of 4 GPUs; two owners of 2: the first plan evicts it, the second shares it.
    let mut s = burst_world(&[4], &[(4, 0)], &[2, 2], 8);
    let decisions = admission_cycle(&mut s, &Policy::default(), at(1000));
    let plans = plans(&decisions);
    assert_eq!(plans.len(), 2);
    let victims: Vec<usize> = plans.iter().map(|p| p.victims.len()).collect();
    assert_eq!(victims, vec![1, 0]);
    // The second leaves the gate only once the first one's victim is gone.
    assert!(plans[0].awaits.is_empty());
    assert_eq!(plans[1].awaits, vec![PodKey::new("batch", "b0")]);
}

#[test]
fn a_pod_sharing_a_victims_claim_is_never_put_back_without_it() {
    // batch/shared holds a DRA claim of 2 GPUs that batch/rider uses too (charged nothing);
    // batch/single holds 2 more. Two owners of 2 need all 4: every one of the three goes,
    // the rider included, though freeing it alone frees nothing.
    let mut holder = running("batch/shared", 2, "n1", 10);
    holder.claim_sharers = vec![PodKey::new("batch", "rider")];
    let mut rider = running("batch/rider", 1, "n1", 10);
    rider.requests.gpus.clear();
    let pods = vec![
        holder,
        rider,
        running("batch/single", 2, "n1", 20),
        pending("online/o0", 2, 100),
        pending("online/o1", 2, 101),
    ];
    let mut s = build(
        vec![queue("online", 4, 0), queue("batch", 0, 4)],
        vec![node("n1", 4)],
        pods,
    );
    let decisions = admission_cycle(&mut s, &Policy::default(), at(1000));
    let mut victims: Vec<String> = plans(&decisions)
        .iter()
        .flat_map(|p| p.victims.iter().map(|v| v.key.to_string()))
        .collect();
    victims.sort();
    assert_eq!(
        victims,
        vec!["batch/rider", "batch/shared", "batch/single"],
        "{decisions:?}"
    );
}

#[test]
fn an_earlier_victim_a_later_one_makes_unneeded_is_put_back() {
    // A one-GPU borrower (the most preferred victim: lowest priority) and a four-GPU one on a
    // node of five. Owner o0 (1 GPU) takes the small one; o1 (2 GPUs) needs the large one,
    // whose 4 GPUs hold both owners: the small victim is put back.
    let mut s = burst_world(&[5], &[(4, 1), (1, 0)], &[1, 2], 8);
    let decisions = admission_cycle(&mut s, &Policy::default(), at(1000));
    let plans = plans(&decisions);
    assert_eq!(plans.len(), 2);
    let victims: Vec<Vec<String>> = plans
        .iter()
        .map(|p| p.victims.iter().map(|v| v.key.to_string()).collect())
        .collect();
    assert_eq!(
        victims,
        vec![Vec::<String>::new(), vec!["batch/b0".to_string()]]
    );
    // o0's room is now the large victim's: it waits for that one, and not for the small one
    // it no longer evicts.
    assert_eq!(plans[0].awaits, vec![PodKey::new("batch", "b0")]);
    assert!(plans[1].awaits.is_empty());
    let small = s.pod_id(&PodKey::new("batch", "b1")).unwrap();
    assert!(
        s.pod(small).unwrap().reclaim.is_none(),
        "its mark is taken back"
    );
}

#[test]
fn every_owner_waiting_in_a_deficit_is_seated_once_the_victims_are_gone() {
    // Two owners wait in one node's deficit: removing their victims seats both (the reseat
    // used to stop at the first, which saw the second waiting and gave up).
    let mut s = burst_world(&[2], &[(1, 0), (1, 0)], &[1, 1], 8);
    let decisions = admission_cycle(&mut s, &Policy::default(), at(1000));
    let plans = plans(&decisions);
    assert_eq!(plans.len(), 2);
    let owners: Vec<PodId> = plans.iter().map(|p| p.owner).collect();
    assert!(
        owners.iter().all(|o| s.pod_devices(*o).is_empty()),
        "both wait"
    );
    for plan in &plans {
        for v in &plan.victims {
            s.remove_pod(v.pod);
        }
    }
    for owner in owners {
        assert!(!s.pod_devices(owner).is_empty(), "{owner:?} holds devices");
    }
}

#[test]
fn a_node_whose_owner_is_not_bound_yet_takes_no_borrower() {
    // The owner of a reclaim holds its GPUs on n0 (victims gone) but kube-scheduler has not
    // bound it; a borrower (a victim's replacement) fits the room left on n0 and n1 is full.
    let queues = vec![queue("online", 4, 0), queue("batch", 0, 8)];
    let mut owner = pending("online/o0", 2, 500);
    owner.state = PodState::Admitted(Assignment {
        node: Some("n0".into()),
        bound: false,
        terminating: false,
    });
    owner.admitted_at = Some(at(900));
    owner.reclaim = Some(ReclaimMark {
        id: "rc-1".into(),
        role: ReclaimRole::Owner,
    });
    let pods = vec![
        owner,
        running("batch/full", 4, "n1", 10),
        pending("batch/replacement", 1, 950),
    ];
    let mut s = build(
        queues.clone(),
        vec![node("n0", 4), node("n1", 4)],
        pods.clone(),
    );
    let decisions = admission_cycle(&mut s, &Policy::default(), at(1000));
    assert!(
        decisions.iter().all(|d| !matches!(d, Decision::Admit(_))),
        "{decisions:?}"
    );
    // Once the owner is bound, the room left is lendable again.
    let mut bound = pods;
    bound[0].state = PodState::Admitted(Assignment {
        node: Some("n0".into()),
        bound: true,
        terminating: false,
    });
    let mut s = build(queues, vec![node("n0", 4), node("n1", 4)], bound);
    let decisions = admission_cycle(&mut s, &Policy::default(), at(1000));
    assert!(
        decisions.iter().any(|d| matches!(d, Decision::Admit(_))),
        "{decisions:?}"
    );
}
