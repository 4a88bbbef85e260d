//! The reclaim budget plans for termination (DESIGN §5 step 4): what a plan keeps back for its
//! victims' termination and the bind, whether it says up front that the checkpoint is cut or
//! the budget overruns, and how the planner prefers victims whose termination fits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::time::Duration;

use common::world::{at, build, node, pending, queue, running};
use gpuqueue_api::v1alpha1::CheckpointDriver;
use gpuqueue_core::Snapshot;
use gpuqueue_core::model::{CheckpointSettings, Queue, ReclaimSettings};
use gpuqueue_core::reclaim::{BudgetFit, ReclaimPlan, checkpoint_allowance, plan_reclaim};
use gpuqueue_core::termination::{BIND_RESERVE, HISTORY, TERMINATION_PRIOR, Terminations};
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A borrower queue whose pods checkpoint with `timeout` and get `grace` when evicted.
fn borrower(name: &str, grace: Duration, timeout: Duration) -> Queue {
    queue(name, 0, 8).reclaim(ReclaimSettings {
        victim_grace: grace,
        checkpoint: CheckpointSettings {
            driver: CheckpointDriver::Vllm,
            port: Some(8000),
            timeout,
            ..CheckpointSettings::default()
        },
        ..ReclaimSettings::default()
    })
}

/// Owner queue `a` (guaranteed 2, budget 3 s) and the borrowers, with `pods` running.
fn world(borrowers: Vec<Queue>, nodes: &[&str], pods: Vec<gpuqueue_core::model::Pod>) -> Snapshot {
    let mut queues = vec![queue("a", 2, 0)];
    queues.extend(borrowers);
    build(queues, nodes.iter().map(|n| node(n, 2)).collect(), pods)
}

fn plan_for_owner(mut snapshot: Snapshot) -> ReclaimPlan {
    let owner = snapshot.add_pod(pending("a/a0", 1, 100)).unwrap();
    plan_reclaim(&snapshot, owner, at(100)).unwrap()
}

#[test]
fn with_no_history_the_plan_keeps_back_the_grace_the_prior_and_the_bind() {
    let snapshot = world(
        vec![borrower("b", Duration::from_secs(1), ms(500))],
        &["n1"],
        vec![running("b/b0", 1, "n1", 0), running("b/b1", 1, "n1", 0)],
    );
    let plan = plan_for_owner(snapshot);
    assert_eq!(plan.termination, Duration::from_secs(1) + TERMINATION_PRIOR);
    assert_eq!(plan.eviction_reserve, ms(2250));
    // 3 s − 2.25 s leaves 750 ms: the 500 ms checkpoint fits, and its deadline is its timeout.
    assert_eq!(plan.fit, BudgetFit::Fits);
    assert_eq!(plan.checkpoint_deadline(&plan.victims[0], ms(100)), ms(500));
    // Late in the handover the deadline is cut so termination and bind still fit.
    assert_eq!(plan.checkpoint_deadline(&plan.victims[0], ms(600)), ms(150));
}

#[test]
fn a_checkpoint_longer_than_the_budget_leaves_is_cut_up_front() {
    let snapshot = world(
        vec![borrower("b", Duration::from_secs(1), ms(2000))],
        &["n1"],
        vec![running("b/b0", 1, "n1", 0), running("b/b1", 1, "n1", 0)],
    );
    let plan = plan_for_owner(snapshot);
    assert_eq!(
        plan.fit,
        BudgetFit::CheckpointCut {
            allowed: ms(750),
            timeout: ms(2000)
        }
    );
}

#[test]
fn a_victim_whose_grace_does_not_fit_the_budget_is_planned_as_an_overrun() {
    let snapshot = world(
        vec![borrower("slow", Duration::from_secs(10), ms(500))],
        &["n1"],
        vec![
            running("slow/s0", 1, "n1", 0),
            running("slow/s1", 1, "n1", 0),
        ],
    );
    let plan = plan_for_owner(snapshot);
    // 10 s grace + 1 s prior + 250 ms bind against a 3 s budget.
    assert_eq!(plan.fit, BudgetFit::Overruns { by: ms(8250) });
}

#[test]
fn a_victim_whose_termination_fits_is_preferred_on_a_node() {
    // slow/s0 started last (otherwise the preferred victim), but its 10 s grace breaks the
    // owner's 3 s budget; fast/f0 fits.
    let snapshot = world(
        vec![
            borrower("fast", Duration::from_secs(1), ms(500)),
            borrower("slow", Duration::from_secs(10), ms(500)),
        ],
        &["n1"],
        vec![
            running("fast/f0", 1, "n1", 0),
            running("slow/s0", 1, "n1", 50),
        ],
    );
    let plan = plan_for_owner(snapshot);
    let victims: Vec<String> = plan.victims.iter().map(|v| v.key.to_string()).collect();
    assert_eq!(victims, ["fast/f0"]);
    assert_eq!(plan.fit, BudgetFit::Fits);
}

#[test]
fn a_node_whose_victims_fit_beats_one_whose_victims_would_overrun() {
    // n1's borrowers are the better victims by work lost (started later), but slow to go.
    let snapshot = world(
        vec![
            borrower("fast", Duration::from_secs(1), ms(500)),
            borrower("slow", Duration::from_secs(10), ms(500)),
        ],
        &["n1", "n2"],
        vec![
            running("slow/s0", 1, "n1", 50),
            running("slow/s1", 1, "n1", 50),
            running("fast/f0", 1, "n2", 0),
            running("fast/f1", 1, "n2", 0),
        ],
    );
    let plan = plan_for_owner(snapshot);
    assert_eq!(plan.node_name, "n2");
    assert_eq!(plan.fit, BudgetFit::Fits);
}

#[test]
fn observed_terminations_on_the_node_replace_the_prior() {
    let mut snapshot = world(
        vec![borrower("b", Duration::from_secs(1), ms(1200))],
        &["n1"],
        vec![running("b/b0", 1, "n1", 0), running("b/b1", 1, "n1", 0)],
    );
    let mut observed = Terminations::default();
    for _ in 0..HISTORY {
        // A slow kubelet: 1.9 s from eviction to gone for a 1 s grace.
        observed.record("n1", ms(1900), Duration::from_secs(1));
    }
    snapshot.set_terminations(observed);
    let plan = plan_for_owner(snapshot);
    assert_eq!(plan.termination, ms(1900));
    assert_eq!(plan.eviction_reserve, ms(1900) + BIND_RESERVE);
    // 3 s − 2.15 s leaves 850 ms for the 1.2 s checkpoint: said at the plan.
    assert_eq!(
        plan.fit,
        BudgetFit::CheckpointCut {
            allowed: ms(850),
            timeout: ms(1200)
        }
    );
}

proptest! {
    /// The checkpoint allowance never lets checkpoint + reserve run past the budget, never
    /// exceeds the timeout, and is the whole timeout whenever the budget leaves room for it.
    #[test]
    fn the_allowance_keeps_the_reserve_within_the_budget(
        budget in 1u64..60_000,
        timeout in 1u64..60_000,
        reserve in 0u64..40_000,
        elapsed in 0u64..70_000,
    ) {
        let allowed = checkpoint_allowance(ms(budget), ms(timeout), ms(reserve), ms(elapsed));
        prop_assert!(allowed <= ms(timeout));
        if !allowed.is_zero() {
            prop_assert!(ms(elapsed) + allowed + ms(reserve) <= ms(budget));
        }
        if elapsed + timeout + reserve <= budget {
            prop_assert_eq!(allowed, ms(timeout));
        }
        let fit = BudgetFit::of(ms(budget), ms(reserve), ms(timeout), ms(elapsed));
        match fit {
            BudgetFit::Fits => prop_assert_eq!(allowed, ms(timeout)),
            BudgetFit::CheckpointCut { allowed: cut, .. } => prop_assert_eq!(cut, allowed),
            BudgetFit::Overruns { by } => {
                prop_assert!(allowed.is_zero());
                prop_assert_eq!(ms(elapsed) + ms(reserve), ms(budget).max(ms(elapsed)) + by);
            }
        }
    }

    /// The estimate is never below the victim's grace, grows with it, and follows the
    /// observations: it lies within their range, raised by the grace difference.
    #[test]
    fn the_estimate_follows_the_observations_and_the_grace(
        samples in prop::collection::vec((0u64..5_000, 0u64..3), 0..40),
        grace in 0u64..5,
    ) {
        let mut t = Terminations::default();
        for (took, g) in &samples {
            t.record("n", ms(*took), Duration::from_secs(*g));
        }
        let grace = Duration::from_secs(grace);
        let expected = t.expected("n", grace);
        prop_assert!(expected >= grace);
        prop_assert!(t.expected("n", grace + Duration::from_secs(1)) >= expected);
        prop_assert_eq!(t.reserve("n", grace), expected + BIND_RESERVE);
        let recent = &samples[samples.len().saturating_sub(HISTORY)..];
        if recent.len() < 5 {
            prop_assert_eq!(expected, grace + TERMINATION_PRIOR);
        } else {
            let raised = |(took, g): &(u64, u64)| ms(*took) + grace.saturating_sub(Duration::from_secs(*g));
            let high = recent.iter().map(raised).max().unwrap();
            let low = recent.iter().map(raised).min().unwrap();
            prop_assert!(expected <= high.max(grace));
            prop_assert!(expected >= low.max(grace));
        }
    }
}
