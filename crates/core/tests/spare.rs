//! Victims spared just before their eviction: a plan chose them as borrowers, but their queue
//! may have shrunk since (`reclaim::pending_victims`). The soak caught the eviction that used to
//! follow: a tenant deleted 4 of its pods while two victims' checkpoints ran, and both victims
//! were evicted, leaving its queue a GPU below its guarantee.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::world::{build, node, queue, running};
use gpuqueue_core::model::{Assignment, Pod, PodKey, PodState, ReclaimMark, ReclaimRole};
use gpuqueue_core::reclaim::pending_victims;
use proptest::prelude::*;

fn victim(mut pod: Pod) -> Pod {
    pod.reclaim = Some(ReclaimMark {
        id: "rc-1".into(),
        role: ReclaimRole::Victim,
    });
    pod
}

fn deleted(mut pod: Pod) -> Pod {
    if let PodState::Admitted(assignment) = &mut pod.state {
        assignment.terminating = true;
    }
    pod
}

/// Admitted at creation, not seen by the store yet.
fn reserved(key: &str, gpus: u32, node: &str, at: i64) -> Pod {
    let mut pod = running(key, gpus, node, at);
    pod.reserved_unseen = true;
    pod.state = PodState::Admitted(Assignment {
        node: Some(node.into()),
        bound: false,
        terminating: false,
    });
    pod
}

/// The start time of the `i`-th pod, in seconds.
fn at(i: usize) -> i64 {
    i64::try_from(i).unwrap()
}

fn keys(keys: &[&str]) -> Vec<PodKey> {
    keys.iter()
        .map(|k| {
            let (ns, name) = k.split_once('/').unwrap();
            PodKey::new(ns, name)
        })
        .collect()
}

/// Queue `b` (guarantee 7) with 12 one-GPU pods, started in name order; `b/p11` and `b/p12` are
/// victims, and `deleting` of the others are being deleted by the tenant.
fn soak_case(deleting: usize) -> Vec<Pod> {
    (1..=12_usize)
        .map(|i| {
            let pod = running(&format!("b/p{i:02}"), 1, &format!("n{}", i % 3), at(i));
            match i {
                11 | 12 => victim(pod),
                i if i <= deleting => deleted(pod),
                _ => pod,
            }
        })
        .collect()
}

fn spared(pods: Vec<Pod>, guarantee: u64) -> Vec<PodKey> {
    let nodes = (0..3).map(|n| node(&format!("n{n}"), 8)).collect();
    let mut spared: Vec<PodKey> =
        pending_victims(&build(vec![queue("b", guarantee, 8)], nodes, pods))
            .into_iter()
            .filter(|v| !v.borrowed)
            .map(|v| v.key)
            .collect();
    spared.sort();
    spared
}

#[test]
fn victims_of_a_queue_that_still_borrows_them_are_not_spared() {
    assert!(spared(soak_case(0), 7).is_empty());
    // 12 - 2 victims - 3 leaving = 7: exactly the guarantee.
    assert!(spared(soak_case(3), 7).is_empty());
}

#[test]
fn a_tenant_deleting_its_own_pods_spares_the_victims_its_guarantee_needs() {
    // The soak's case: 4 deleted, 8 left, one GPU above the guarantee: one victim still goes,
    // the most protected one (started first) is spared.
    assert_eq!(spared(soak_case(4), 7), keys(&["b/p11"]));
    assert_eq!(spared(soak_case(5), 7), keys(&["b/p11", "b/p12"]));
}

#[test]
fn a_raised_guarantee_spares_victims_too() {
    assert_eq!(spared(soak_case(0), 11), keys(&["b/p11"]));
    assert_eq!(spared(soak_case(0), 12), keys(&["b/p11", "b/p12"]));
}

#[test]
fn a_straddling_victim_still_goes() {
    // Guarantee 7, four 2-GPU pods: the victim lies half above the guarantee, as when planned.
    let pods = vec![
        running("b/a", 2, "n0", 1),
        running("b/b", 2, "n0", 2),
        running("b/c", 2, "n1", 3),
        victim(running("b/d", 2, "n1", 4)),
    ];
    assert!(spared(pods.clone(), 7).is_empty());
    assert_eq!(spared(pods, 8), keys(&["b/d"]));
}

#[test]
fn reservations_not_seen_yet_keep_no_victim_evictable() {
    // 7 running (one a victim) and a reservation of 3 the store has not shown: the reservation
    // may never exist, so the queue holds exactly its guarantee by itself.
    let mut pods: Vec<Pod> = (1..=6)
        .map(|i| running(&format!("b/p{i}"), 1, "n0", i))
        .collect();
    pods.push(victim(running("b/v", 1, "n1", 7)));
    pods.push(reserved("b/r", 3, "n2", 8));
    assert_eq!(spared(pods, 7), keys(&["b/v"]));
}

#[test]
fn a_victim_already_being_deleted_is_neither_spared_nor_counted_as_kept() {
    // Two victims, one already evicted (terminating): it leaves whatever happens, and the
    // other still lies above the guarantee of 5 (7 - 1 leaving = 6).
    let mut pods: Vec<Pod> = (1..=5)
        .map(|i| running(&format!("b/p{i}"), 1, "n0", i))
        .collect();
    pods.push(deleted(victim(running("b/v1", 1, "n1", 6))));
    pods.push(victim(running("b/v2", 1, "n1", 7)));
    assert!(spared(pods.clone(), 5).is_empty());
    assert_eq!(spared(pods, 6), keys(&["b/v2"]));
}

proptest! {
    /// One-GPU pods: the victims that go are exactly those the queue holds above its guarantee
    /// once the deleted pods are gone, and never more.
    #[test]
    fn one_gpu_victims_go_while_the_queue_holds_more_than_its_guarantee(
        kinds in prop::collection::vec(0_u32..3, 1..24),
        guarantee in 0_u64..24,
    ) {
        // 0: running, 1: a victim, 2: being deleted.
        let pods: Vec<Pod> = kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                let pod = running(&format!("b/p{i:02}"), 1, &format!("n{}", i % 3), at(i));
                match kind {
                    1 => victim(pod),
                    2 => deleted(pod),
                    _ => pod,
                }
            })
            .collect();
        let staying = kinds.iter().filter(|k| **k != 2).count() as u64;
        let victims = kinds.iter().filter(|k| **k == 1).count() as u64;
        let above = staying.saturating_sub(guarantee);
        let spared = spared(pods, guarantee);
        prop_assert_eq!(spared.len() as u64, victims - victims.min(above));
    }

    /// Pods of any size: what the queue keeps once the victims not spared are gone is below
    /// its guarantee by less than one of them (the straddler), and a victim is spared only
    /// where the queue keeps no more than its guarantee.
    #[test]
    fn no_victim_takes_its_queue_below_its_guarantee_by_a_whole_pod(
        sizes in prop::collection::vec((1_u32..5, any::<bool>()), 1..16),
        guarantee in 0_u64..40,
    ) {
        let pods: Vec<Pod> = sizes
            .iter()
            .enumerate()
            .map(|(i, (gpus, is_victim))| {
                let pod = running(&format!("b/p{i:02}"), *gpus, &format!("n{}", i % 3), at(i));
                if *is_victim { victim(pod) } else { pod }
            })
            .collect();
        let spared = spared(pods.clone(), guarantee);
        let gpus = |p: &Pod| u64::from(p.requests.gpus[0].count);
        let going: Vec<&Pod> = pods
            .iter()
            .filter(|p| p.reclaim.is_some() && !spared.contains(&p.key))
            .collect();
        let kept: u64 = pods
            .iter()
            .filter(|p| !going.iter().any(|g| g.key == p.key))
            .map(gpus)
            .sum();
        if let Some(largest) = going.iter().map(|p| gpus(p)).max() {
            prop_assert!(kept + largest > guarantee, "kept {} of {}", kept, guarantee);
        }
        // Each spared victim was left because the queue kept no more than its guarantee.
        if !spared.is_empty() {
            prop_assert!(kept <= guarantee, "spared {:?} though the queue keeps {} of {}", spared, kept, guarantee);
        }
    }
}

#[test]
fn every_victim_in_flight_is_judged_and_nothing_else() {
    let nodes = (0..3).map(|n| node(&format!("n{n}"), 8)).collect();
    let mut judged = pending_victims(&build(vec![queue("b", 7, 8)], nodes, soak_case(4)));
    judged.sort_by(|a, b| a.key.cmp(&b.key));
    let judged: Vec<(String, bool)> = judged
        .into_iter()
        .map(|v| (v.key.to_string(), v.borrowed))
        .collect();
    assert_eq!(
        judged,
        [("b/p11".to_owned(), false), ("b/p12".to_owned(), true)],
        "an evicting victim asks the pass; one it does not name is not vouched for"
    );
}

#[test]
fn a_victim_marked_terminating_in_a_live_snapshot_is_judged_as_one_built_deleted() {
    // The simulator keeps one snapshot across a run and marks a victim terminating when its
    // eviction is accepted; the operator rebuilds its snapshot with the pod deleted.
    let pods = |v1_deleted: bool| {
        let mut pods: Vec<Pod> = (1..=5)
            .map(|i| running(&format!("b/p{i}"), 1, "n0", i))
            .collect();
        let v1 = victim(running("b/v1", 1, "n1", 6));
        pods.push(if v1_deleted { deleted(v1) } else { v1 });
        pods.push(victim(running("b/v2", 1, "n1", 7)));
        pods
    };
    let nodes = || (0..3).map(|n| node(&format!("n{n}"), 8)).collect();
    let judged = |snapshot: &gpuqueue_core::Snapshot| {
        let mut judged: Vec<(String, bool)> = pending_victims(snapshot)
            .into_iter()
            .map(|v| (v.key.to_string(), v.borrowed))
            .collect();
        judged.sort();
        judged
    };
    let built = build(vec![queue("b", 6, 8)], nodes(), pods(true));
    let mut live = build(vec![queue("b", 6, 8)], nodes(), pods(false));
    assert_eq!(
        judged(&live),
        [("b/v1".to_owned(), false), ("b/v2".to_owned(), true)],
        "before: the less protected victim takes the one GPU above the guarantee"
    );
    let v1 = live.pod_id(&PodKey::new("b", "v1")).unwrap();
    live.mark_terminating(v1);
    assert_eq!(judged(&live), judged(&built));
    assert_eq!(
        judged(&live),
        [("b/v2".to_owned(), false)],
        "after: the evicted one leaves anyway, so the other is spared"
    );
    let held = |s: &gpuqueue_core::Snapshot| {
        let q = s.queue_ids().next().unwrap();
        s.usage(q).iter().map(|u| u.allocated).collect::<Vec<_>>()
    };
    assert_eq!(
        held(&live),
        held(&built),
        "the leaving pod keeps its charge until removed"
    );
}
