//! A snapshot kept alive across reclaims (the simulator's use): recording a reclaim on it
//! starts the victim queue's borrowing cooldown, exactly as building it with
//! `reclaimed_from` does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::time::Duration;

use common::world::{at, node, pending, queue};
use gpuqueue_core::Policy;
use gpuqueue_core::Snapshot;
use gpuqueue_core::admission::{Decision, decide};
use gpuqueue_core::model::{PodKey, ReclaimSettings};

#[test]
fn a_recorded_reclaim_starts_the_borrowing_cooldown() {
    let b = queue("b", 0, 8).reclaim(ReclaimSettings {
        min_borrow: Some(Duration::from_mins(1)),
        ..ReclaimSettings::default()
    });
    let (mut snapshot, _) = Snapshot::builder()
        .queues([queue("a", 8, 0), b])
        .node(node("n1", 8))
        .pod(pending("b/p", 1, 0))
        .build();
    let pod = snapshot.pod_id(&PodKey::new("b", "p")).unwrap();
    let queue_b = snapshot.queue_id("b").unwrap();
    let code = |snapshot: &Snapshot, now| match decide(snapshot, pod, &Policy::default(), at(now)) {
        Decision::Wait(w) => w.reason.code(),
        Decision::Admit(_) => "Admit",
        Decision::Reclaim(_) => "Reclaim",
    };
    assert_eq!(code(&snapshot, 100), "Admit");
    snapshot.record_reclaimed_from(queue_b, at(50));
    assert_eq!(snapshot.last_reclaimed(queue_b), Some(at(50)));
    assert_eq!(code(&snapshot, 100), "BorrowCooldown");
    assert_eq!(
        code(&snapshot, 111),
        "Admit",
        "the cooldown ends a minute after the reclaim"
    );
    snapshot.record_reclaimed_from(queue_b, at(20));
    assert_eq!(
        snapshot.last_reclaimed(queue_b),
        Some(at(50)),
        "an older reclaim does not move it back"
    );
}
