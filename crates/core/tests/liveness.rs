//! Quota liveness (issue 13): unadmitted pods go first and are evicted when they break a quota,
//! a pod that straddles its queue's guarantee is a borrower, and (the property) no owner within
//! its guarantee is ever blocked while another queue holds GPUs above its own guarantee on a
//! node that could seat it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::world::{GPU, at, build, node, pending, queue, running};
use gpuqueue_core::Policy;
use gpuqueue_core::Snapshot;
use gpuqueue_core::admission::{Decision, admission_cycle, decide};
use gpuqueue_core::enforcement::{Bypass, enforce};
use gpuqueue_core::ids::{PodId, QueueId};
use gpuqueue_core::model::{Assignment, Pod, PodKey, PodState};
use gpuqueue_core::quantity::Milli;
use proptest::prelude::*;

/// A pod that holds quota without gpuqueue's admission: ungated by hand or created while the
/// webhook was down; bound to `node`, or waiting for kube-scheduler (`None`).
fn intruder(key: &str, gpus: u32, node: Option<&str>, created: i64) -> Pod {
    let mut p = match node {
        Some(n) => running(key, gpus, n, created),
        None => pending(key, gpus, created),
    };
    p.state = PodState::Admitted(Assignment {
        node: node.map(Into::into),
        bound: node.is_some(),
        terminating: false,
    });
    p.admitted_at = None;
    p.unadmitted = true;
    p
}

fn key(s: &str) -> PodKey {
    let (ns, name) = s.split_once('/').unwrap();
    PodKey::new(ns, name)
}

fn victims(decision: &Decision) -> Vec<String> {
    match decision {
        Decision::Reclaim(plan) => plan.victims.iter().map(|v| v.key.to_string()).collect(),
        other => panic!("expected a reclaim, got {other:?}"),
    }
}

#[test]
fn a_pod_straddling_its_queues_guarantee_is_a_reclaim_victim() {
    // Case 8: batch (guarantee 4) runs one pod of 6: 2 borrowed, inside one pod bigger than
    // that. Online's pod within its guarantee must get the node back.
    let s = build(
        vec![queue("online", 4, 0), queue("batch", 4, 8)],
        vec![node("n1", 8)],
        vec![running("batch/big", 6, "n1", 0), pending("online/o", 4, 10)],
    );
    let owner = s.pod_id(&key("online/o")).unwrap();
    let decision = decide(&s, owner, &Policy::default(), at(100));
    assert_eq!(victims(&decision), ["batch/big"]);
}

#[test]
fn the_borrowed_share_is_the_pods_admitted_last_until_the_borrowed_amount_is_covered() {
    // batch: guarantee 4, holds 2 + 3 + 3 = 8, so 4 borrowed: the newest (3) and the one
    // before it (3, straddling the line), not the oldest.
    let s = build(
        vec![queue("batch", 4, 8)],
        vec![node("n1", 8)],
        vec![
            running("batch/old", 2, "n1", 0),
            running("batch/mid", 3, "n1", 10),
            running("batch/new", 3, "n1", 20),
        ],
    );
    let batch = s.queue_id("batch").unwrap();
    let mut names: Vec<String> = s
        .borrowers(batch)
        .into_iter()
        .map(|p| s.pod(p).unwrap().key.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["mid", "new"]);
}

#[test]
fn unadmitted_pods_are_evicted_before_any_admitted_borrower() {
    // batch borrows 4 with an admitted pod (newest) and an unadmitted one (older): the owner
    // needs 2, and the unadmitted pod goes, whatever its age or priority.
    let mut unadmitted = intruder("batch/intruder", 2, Some("n1"), 5);
    unadmitted.priority = 10;
    let s = build(
        vec![queue("online", 4, 0), queue("batch", 4, 8)],
        vec![node("n1", 8)],
        vec![
            running("batch/base", 4, "n1", 0),
            unadmitted,
            running("batch/borrower", 2, "n1", 20),
            pending("online/o", 2, 30),
        ],
    );
    let owner = s.pod_id(&key("online/o")).unwrap();
    let decision = decide(&s, owner, &Policy::default(), at(100));
    assert_eq!(victims(&decision), ["batch/intruder"]);
}

#[test]
fn unadmitted_pods_over_the_ceiling_are_evicted_newest_first_and_no_more() {
    // batch: ceiling 4 (2 + 2); 2 admitted and four unadmitted pods of 1: 6 allocated. One
    // more unadmitted pod is already terminating: it counts as gone.
    let mut leaving = intruder("batch/leaving", 1, Some("n1"), 50);
    if let PodState::Admitted(a) = &mut leaving.state {
        a.terminating = true;
    }
    let mut s = build(
        vec![queue("batch", 2, 2)],
        vec![node("n1", 8)],
        vec![
            running("batch/admitted", 2, "n1", 0),
            intruder("batch/u1", 1, Some("n1"), 1),
            intruder("batch/u2", 1, Some("n1"), 2),
            intruder("batch/u3", 1, None, 3),
            intruder("batch/u4", 1, None, 4),
            leaving,
        ],
    );
    let decisions = admission_cycle(&mut s, &Policy::default(), at(100));
    let evict = enforce(&s, &decisions);
    let names: Vec<&str> = evict.iter().map(|e| e.key.name.as_str()).collect();
    assert_eq!(names, ["u4", "u3"]);
    assert!(matches!(
        evict[0].reason,
        Bypass::OverCeiling { allocated, ceiling } if allocated == Milli::devices(6) && ceiling == Milli::devices(4)
    ));
    assert_eq!(
        evict[0].to_string(),
        "it holds 1 nvidia.com/gpu of queue batch without admission and batch is over its ceiling of 4 (6 allocated); create GPU pods while the gpuqueue webhook is up, so that they wait at its gate and run within the queue's quota"
    );
}

/// Case 4 of the tenant review: a reclaim frees n1 for online, but batch holds an ungated pod
/// with no node yet that kube-scheduler would bind into the freed room.
fn case_four() -> Snapshot {
    build(
        vec![queue("online", 4, 0), queue("batch", 0, 8)],
        vec![node("n1", 4)],
        vec![
            intruder("batch/bound", 2, Some("n1"), 1),
            running("batch/admitted", 2, "n1", 0),
            intruder("batch/unbound", 2, None, 2),
            pending("online/o", 4, 10),
        ],
    )
}

#[test]
fn unbound_intruders_on_another_queues_guarantee_are_evicted_while_its_owner_waits() {
    // The bound intruder is the reclaim's victim; the unbound one is evicted by enforcement,
    // and admitted pods are left alone.
    let mut s = case_four();
    let decisions = admission_cycle(&mut s, &Policy::default(), at(100));
    assert!(
        matches!(decisions[0], Decision::Reclaim(_)),
        "{decisions:?}"
    );
    let evict = enforce(&s, &decisions);
    let names: Vec<&str> = evict.iter().map(|e| e.key.name.as_str()).collect();
    assert_eq!(names, ["unbound"]);
    match &evict[0].reason {
        Bypass::HoldsGuarantee { waiting, .. } => assert_eq!(waiting, &["online".to_string()]),
        other @ Bypass::OverCeiling { .. } => panic!("{other:?}"),
    }
}

#[test]
fn a_snapshot_behind_the_cluster_neither_reclaims_nor_enforces_while_its_owner_waits() {
    // Case 4, read from stores a watch is listing afresh: the intruders and the admitted
    // borrower may be gone already, or the owner itself.
    let mut s = case_four();
    s.set_behind(true);
    let decisions = admission_cycle(&mut s, &Policy::default(), at(100));
    let [Decision::Wait(wait)] = decisions.as_slice() else {
        panic!("{decisions:?}");
    };
    assert_eq!(wait.key, key("online/o"));
    assert!(
        wait.reason.to_string().ends_with(
            "; a reclaim would make room, but not yet: the operator's view of the cluster is catching up (a watch of pods, queues, nodes, namespaces or DRA objects is listing afresh after an error), and no borrower is disrupted on a view that may be stale"
        ),
        "{}",
        wait.reason
    );
    assert!(enforce(&s, &decisions).is_empty());
    // Current again: the reclaim and the eviction of the unbound intruder.
    s.set_behind(false);
    let decisions = admission_cycle(&mut s, &Policy::default(), at(101));
    assert!(
        matches!(decisions[0], Decision::Reclaim(_)),
        "{decisions:?}"
    );
    assert_eq!(enforce(&s, &decisions).len(), 1);
}

#[test]
fn unadmitted_pods_within_their_guarantee_and_ceiling_are_left_alone() {
    let mut s = build(
        vec![queue("online", 4, 0), queue("batch", 4, 4)],
        vec![node("n1", 8)],
        vec![
            intruder("batch/u", 4, Some("n1"), 1),
            pending("online/o", 4, 10),
        ],
    );
    let decisions = admission_cycle(&mut s, &Policy::default(), at(100));
    assert!(enforce(&s, &decisions).is_empty());
}

// ---- the property: no blocked owner ------------------------------------------------------

#[derive(Clone, Debug)]
struct Running {
    queue: usize,
    gpus: u32,
    node: usize,
    priority: i32,
    time: i64,
    unadmitted: bool,
}

#[derive(Clone, Debug)]
struct World {
    nodes: Vec<u32>,
    /// (guaranteed, burstable)
    queues: Vec<(u64, u64)>,
    running: Vec<Running>,
    owner: (usize, u32),
}

fn world() -> impl Strategy<Value = World> {
    let nodes = prop::collection::vec(1u32..=8, 1..=3);
    let queues = prop::collection::vec((0u64..=12, 0u64..=12), 2..=3);
    (nodes, queues).prop_flat_map(|(nodes, queues)| {
        let pod = (
            0..queues.len(),
            1u32..=8,
            0..nodes.len(),
            0i32..2,
            0i64..100,
            any::<bool>(),
        )
            .prop_map(|(queue, gpus, node, priority, time, unadmitted)| Running {
                queue,
                gpus,
                node,
                priority,
                time,
                unadmitted,
            });
        let owner = (0..queues.len(), 1u32..=8);
        (prop::collection::vec(pod, 0..=12), owner).prop_map(move |(running, owner)| World {
            nodes: nodes.clone(),
            queues: queues.clone(),
            running,
            owner,
        })
    })
}

fn name(q: usize) -> String {
    format!("q{q}")
}

/// Running pods where they fit on their node; admitted ones within their queue's ceiling too
/// (unadmitted ones bypass it, as they do in a cluster).
fn build_world(world: &World) -> Snapshot {
    let queues = world
        .queues
        .iter()
        .enumerate()
        .map(|(i, (guaranteed, burstable))| queue(&name(i), *guaranteed, *burstable))
        .collect::<Vec<_>>();
    let nodes = world
        .nodes
        .iter()
        .enumerate()
        .map(|(i, gpus)| node(&format!("n{i}"), *gpus))
        .collect::<Vec<_>>();
    let (mut snapshot, issues) = Snapshot::builder().queues(queues).nodes(nodes).build();
    assert!(issues.is_empty());
    for (i, pod_spec) in world.running.iter().enumerate() {
        let pod_key = format!("{}/p{i}", name(pod_spec.queue));
        let node_name = format!("n{}", pod_spec.node);
        let n = snapshot.node_id(&node_name).unwrap();
        if snapshot.node_view(n).fully_free_devices() < pod_spec.gpus as usize {
            continue;
        }
        let q = snapshot.queue_id(&name(pod_spec.queue)).unwrap();
        let usage = &snapshot.usage(q)[0];
        if !pod_spec.unadmitted
            && usage.allocated + Milli::devices(u64::from(pod_spec.gpus)) > usage.ceiling()
        {
            continue;
        }
        let mut pod = if pod_spec.unadmitted {
            intruder(&pod_key, pod_spec.gpus, Some(&node_name), pod_spec.time)
        } else {
            running(&pod_key, pod_spec.gpus, &node_name, pod_spec.time)
        };
        pod.priority = pod_spec.priority;
        snapshot.add_pod(pod).unwrap();
    }
    snapshot
        .add_pod(pending(
            &format!("{}/owner", name(world.owner.0)),
            world.owner.1,
            200,
        ))
        .unwrap();
    snapshot
}

/// The documented rule, written out independently of the ledger: a queue's GPUs above its
/// guarantee are its least protected pods (unadmitted first, then lowest priority, then most
/// recently admitted, then name descending) until its borrowed amount is covered.
fn above_guarantee(s: &Snapshot, q: QueueId) -> Vec<PodId> {
    let u = &s.usage(q)[0];
    let mut borrowed = u.allocated.saturating_sub(u.guaranteed);
    let mut pods: Vec<(PodId, &Pod)> = s
        .pod_ids()
        .filter(|p| s.pod_queue(*p) == Some(q))
        .map(|p| (p, s.pod(p).unwrap()))
        .filter(|(_, pod)| pod.is_admitted())
        .collect();
    pods.sort_by(|(_, a), (_, b)| {
        a.unadmitted
            .cmp(&b.unadmitted)
            .reverse()
            .then(a.priority.cmp(&b.priority))
            .then(b.running_since().cmp(&a.running_since()))
            .then(b.key.cmp(&a.key))
    });
    let mut out = Vec::new();
    for (p, pod) in pods {
        if borrowed == Milli::ZERO {
            break;
        }
        borrowed = borrowed.saturating_sub(pod.requests.of(&GPU.into()));
        out.push(p);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_owner_within_its_guarantee_is_blocked_by_capacity_held_above_a_guarantee(w in world()) {
        let s = build_world(&w);
        let owner = s.pod_id(&key(&format!("{}/owner", name(w.owner.0)))).unwrap();
        let owner_queue = s.pod_queue(owner).unwrap();
        let u = &s.usage(owner_queue)[0];
        let request = Milli::devices(u64::from(w.owner.1));
        prop_assume!(u.allocated + request <= u.guaranteed);

        let decision = decide(&s, owner, &Policy::default(), at(1000));
        let Decision::Wait(wait) = &decision else {
            return Ok(());
        };
        // Blocked: then no node that could seat the owner has room once the GPUs other
        // queues hold above their guarantees there are gone.
        let above: Vec<PodId> = s
            .queue_ids()
            .filter(|q| *q != owner_queue)
            .flat_map(|q| above_guarantee(&s, q))
            .collect();
        for n in s.node_ids() {
            let view = s.node_view(n);
            let capacity = view.gpu_free().len();
            if capacity < w.owner.1 as usize {
                continue;
            }
            let freed: usize = s
                .pods_on(n)
                .filter(|p| above.contains(p))
                .map(|p| s.pod(p).unwrap().requests.gpus[0].count as usize)
                .sum();
            prop_assert!(
                view.fully_free_devices() + freed < w.owner.1 as usize,
                "owner blocked ({}) though node n{} would seat it without the GPUs held above guarantees",
                wait.reason, n.index()
            );
        }
    }

    #[test]
    fn borrowers_cover_what_each_queue_borrows_and_no_more_than_one_pod_beyond(w in world()) {
        let s = build_world(&w);
        for q in s.queue_ids() {
            let u = &s.usage(q)[0];
            let borrowed = u.allocated.saturating_sub(u.guaranteed);
            let amounts: Vec<Milli> = s
                .borrowers(q)
                .into_iter()
                .map(|p| s.pod(p).unwrap().requests.of(&GPU.into()))
                .collect();
            let total: Milli = amounts.iter().copied().sum();
            prop_assert!(total >= borrowed, "queue {q:?}: borrowers hold {total} of {borrowed} borrowed");
            if let Some(last) = amounts.last() {
                prop_assert!(total.saturating_sub(*last) < borrowed, "queue {q:?}: a borrower too many");
            }
            // Unadmitted pods come first.
            let flags: Vec<bool> = s.borrowers(q).into_iter().map(|p| s.pod(p).unwrap().unadmitted).collect();
            prop_assert!(flags.windows(2).all(|w| w[0] || !w[1]), "unadmitted after admitted: {flags:?}");
        }
    }

    #[test]
    fn enforcement_brings_every_queue_within_its_ceiling_with_unadmitted_pods_only(w in world()) {
        let mut snapshot = build_world(&w);
        let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(1000));
        let evict = enforce(&snapshot, &decisions);
        for e in &evict {
            let pod = snapshot.pod(e.pod).unwrap();
            prop_assert!(pod.unadmitted, "{} was admitted", e.key);
            prop_assert!(pod.reclaim.is_none(), "{} is a reclaim's victim already", e.key);
        }
        let ids: Vec<PodId> = evict.iter().map(|e| e.pod).collect();
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        prop_assert_eq!(unique.len(), ids.len(), "a pod chosen twice");
        // Once they and the reclaims' victims are gone, no queue with unadmitted pods left is
        // over its ceiling.
        let mut leaving = ids.clone();
        for d in &decisions {
            if let Decision::Reclaim(plan) = d {
                leaving.extend(plan.victims.iter().map(|v| v.pod));
            }
        }
        let removal = snapshot.simulate_removal(&leaving);
        for q in snapshot.queue_ids() {
            let u = &snapshot.usage(q)[0];
            let unadmitted_left = snapshot
                .pod_ids()
                .any(|p| snapshot.pod_queue(p) == Some(q) && snapshot.pod(p).unwrap().unadmitted);
            prop_assert!(
                u.allocated <= u.ceiling() || !unadmitted_left,
                "queue {:?} still over its ceiling with unadmitted pods: {:?}", q, u
            );
        }
        snapshot.restore(removal).unwrap();
        // Only as many as needed, the newest first.
        for e in evict.iter().filter(|e| matches!(e.reason, Bypass::OverCeiling { .. })) {
            let q = snapshot.queue_id(&e.queue).unwrap();
            let newer_kept = snapshot.pod_ids().any(|p| {
                let pod = snapshot.pod(p).unwrap();
                snapshot.pod_queue(p) == Some(q)
                    && pod.unadmitted
                    && !leaving.contains(&p)
                    && (pod.created_at, &pod.key) > (snapshot.pod(e.pod).unwrap().created_at, &e.key)
            });
            prop_assert!(!newer_kept, "{} evicted while a newer unadmitted pod stays", e.key);
        }
    }
}
