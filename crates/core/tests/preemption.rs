//! A reclaim never lets kube-scheduler's own preemption act for its owner. Every owner waits at
//! the gate until its room is free; the plan says whether kube-scheduler would preempt for it
//! on its node (its PriorityClass outranks a pod there), and such an owner stays at the gate
//! even when its handover ends without the room.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::world::{at, build, node, pending, queue, running};
use gpuqueue_core::reclaim::plan_reclaim;

/// Owner queue `a` (guaranteed 1) on one 2-GPU node, where `b` borrows a's GPU and `c` runs
/// its own at priority `labs`; the owner has `priority`, and `preempts` unless its
/// `preemptionPolicy` is `Never`.
fn plan_with(priority: i32, labs: i32, preempts: bool) -> bool {
    let mut third = running("c/c0", 1, "n1", 20);
    third.priority = labs;
    let mut snapshot = build(
        vec![queue("a", 1, 0), queue("b", 0, 1), queue("c", 1, 0)],
        vec![node("n1", 2)],
        vec![running("b/b0", 1, "n1", 10), third],
    );
    let mut owner = pending("a/a0", 1, 100);
    owner.priority = priority;
    owner.preempts = preempts;
    let owner = snapshot.add_pod(owner).unwrap();
    let plan = plan_reclaim(&snapshot, owner, at(100)).unwrap();
    assert_eq!(plan.victims[0].key.to_string(), "b/b0");
    plan.preempts
}

fn plan(priority: i32, labs: i32) -> bool {
    plan_with(priority, labs, true)
}

#[test]
fn an_owner_that_outranks_a_pod_on_its_node_is_planned_as_one_kube_scheduler_preempts_for() {
    // Above the victim (the usual online-over-batch classes), or only above a bystander.
    assert!(plan(1000, 0));
    assert!(plan(0, -10));
    // Equal to everyone there, or below: kube-scheduler cannot preempt for it.
    assert!(!plan(0, 0));
    assert!(!plan(-5, 0));
    // A class with `preemptionPolicy: Never`: kube-scheduler preempts nothing for it.
    assert!(!plan_with(1000, 0, false));
}
