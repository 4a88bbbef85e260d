//! Scenarios of the policy, table-driven: a small cluster, one pending pod, the decision it
//! must get (admit where and as what, reclaim whom on which node, or wait and why). Then
//! whole admission cycles (fair order, reservation) and queue status.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::time::Duration;

use common::world::{GPU, at, build, node, pending, queue, running};
use gpuqueue_core::Policy;
use gpuqueue_core::Snapshot;
use gpuqueue_core::admission::{
    Decision, NotAtCreation, admission_cycle, admit_at_creation, decide,
};
use gpuqueue_core::model::{
    AdmittedAs, Assignment, GpuRequest, Namespace, Node, Pod, PodKey, PodState, Queue,
    ReclaimSettings, ResourceQuota,
};
use gpuqueue_core::quantity::Milli;
use gpuqueue_core::status::{HandoverBudgets, queue_reports};

#[derive(Debug)]
enum Expect {
    Admit(&'static str, AdmittedAs),
    Reclaim {
        node: &'static str,
        victims: &'static [&'static str],
        overrides_min_borrow: bool,
    },
    Wait {
        code: &'static str,
        says: &'static [&'static str],
    },
}

struct Case {
    name: &'static str,
    world: fn() -> Snapshot,
    pod: &'static str,
    now: i64,
    expect: Expect,
}

fn two_tenants_b_borrowing() -> Snapshot {
    // a: guaranteed 8, idle. b: guaranteed 4 + burstable 8, running 12 single-GPU pods.
    let pods = (0..12)
        .map(|i| running(&format!("b/b{i:02}"), 1, if i < 8 { "n1" } else { "n2" }, i))
        .chain([
            pending("a/a0", 2, 100),
            pending("a/big", 6, 100),
            pending("b/more", 1, 100),
        ])
        .collect();
    build(
        vec![queue("a", 8, 0), queue("b", 4, 8)],
        vec![node("n1", 8), node("n2", 8)],
        pods,
    )
}

#[allow(clippy::too_many_lines)] // one table, one entry per scenario
fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "an owner within its guarantee is admitted where there is room",
            world: two_tenants_b_borrowing,
            pod: "a/a0",
            now: 200,
            expect: Expect::Admit("n2", AdmittedAs::Guaranteed),
        },
        Case {
            name: "an owner that finds no room reclaims from borrowers, fewest victims, most recent first",
            world: two_tenants_b_borrowing,
            pod: "a/big",
            now: 200,
            // n2 has 4 free: 2 more from b's newest borrowers there (b11, b10) make 6.
            expect: Expect::Reclaim {
                node: "n2",
                victims: &["b/b11", "b/b10"],
                overrides_min_borrow: false,
            },
        },
        Case {
            name: "one large borrower is evicted rather than four more recent small ones",
            world: || {
                build(
                    vec![queue("a", 4, 0), queue("b", 0, 8)],
                    vec![node("n1", 8)],
                    vec![
                        running("b/big", 4, "n1", 0),
                        running("b/s1", 1, "n1", 10),
                        running("b/s2", 1, "n1", 11),
                        running("b/s3", 1, "n1", 12),
                        running("b/s4", 1, "n1", 13),
                        pending("a/o", 4, 20),
                    ],
                )
            },
            pod: "a/o",
            now: 100,
            expect: Expect::Reclaim {
                node: "n1",
                victims: &["b/big"],
                overrides_min_borrow: false,
            },
        },
        Case {
            name: "pods being deleted are the borrowers a reclaim waits for, not running ones",
            world: || {
                // b holds 6 of its guarantee of 4, 2 of them already being deleted: once they
                // are gone b is within its guarantee, so none of its running pods is taken.
                let leaving = |key, t| {
                    let mut pod = running(key, 1, "n1", t);
                    pod.state = PodState::Admitted(Assignment {
                        node: Some("n1".into()),
                        bound: true,
                        terminating: true,
                    });
                    pod
                };
                build(
                    vec![queue("a", 4, 0), queue("b", 4, 4)],
                    vec![node("n1", 8)],
                    vec![
                        leaving("b/b0", 0),
                        leaving("b/b1", 1),
                        running("b/b2", 1, "n1", 2),
                        running("b/b3", 1, "n1", 3),
                        running("b/b4", 1, "n1", 4),
                        running("b/b5", 1, "n1", 5),
                        pending("a/o", 4, 20),
                    ],
                )
            },
            pod: "a/o",
            now: 100,
            expect: Expect::Reclaim {
                node: "n1",
                victims: &["b/b1", "b/b0"],
                overrides_min_borrow: false,
            },
        },
        Case {
            name: "a borrower is refused at its ceiling, with the numbers",
            world: two_tenants_b_borrowing,
            pod: "b/more",
            now: 200,
            expect: Expect::Wait {
                code: "OverCeiling",
                says: &[
                    "queue b",
                    "allocated 12 + requested 1 exceeds its ceiling of 12 (guaranteed 4 + burstable 8)",
                ],
            },
        },
        Case {
            name: "a borrower takes idle lendable capacity",
            world: || {
                build(
                    vec![queue("a", 8, 0), queue("b", 0, 4)],
                    vec![node("n1", 8)],
                    vec![pending("b/p", 2, 0)],
                )
            },
            pod: "b/p",
            now: 10,
            expect: Expect::Admit("n1", AdmittedAs::Borrowed),
        },
        Case {
            name: "a guarantee that is never lent stays free",
            world: || {
                let mut a = queue("a", 8, 0);
                a.quotas[0].lending_limit = Some(Milli::devices(6));
                build(
                    vec![a, queue("b", 0, 8)],
                    vec![node("n1", 8)],
                    vec![pending("b/p", 7, 0)],
                )
            },
            pod: "b/p",
            now: 10,
            expect: Expect::Wait {
                code: "NoIdleCapacity",
                says: &[
                    "queue b",
                    "above its guarantee of 0",
                    "only 6 is idle and lendable",
                ],
            },
        },
        Case {
            name: "unmanaged GPU pods count as used capacity",
            world: || {
                build(
                    vec![queue("b", 0, 16)],
                    vec![node("n1", 8), node("n2", 8)],
                    vec![
                        running("kube-system/driver", 8, "n1", 0),
                        pending("b/p", 10, 5),
                    ],
                )
            },
            pod: "b/p",
            now: 10,
            expect: Expect::Wait {
                code: "NoIdleCapacity",
                says: &["only 8 is idle"],
            },
        },
        Case {
            name: "a multi-GPU pod needs its devices on one node",
            world: || {
                build(
                    vec![queue("a", 16, 0)],
                    vec![node("n1", 8), node("n2", 8)],
                    vec![
                        running("a/x", 4, "n1", 0),
                        running("a/y", 4, "n2", 0),
                        pending("a/p", 8, 5),
                    ],
                )
            },
            pod: "a/p",
            now: 10,
            expect: Expect::Wait {
                code: "NoRoom",
                says: &[
                    "no node has room for 8 nvidia.com/gpu",
                    "the most free on one suitable node is 4; 8 idle",
                    "no other queue is borrowing",
                ],
            },
        },
        Case {
            name: "reclaim crosses nodes to where one victim suffices",
            world: || {
                let mut pods: Vec<_> = (0..8)
                    .map(|i| running(&format!("b/small{i}"), 1, "n1", 50 + i))
                    .collect();
                pods.push(running("b/large", 4, "n2", 0));
                pods.push(running("b/large2", 4, "n2", 0));
                pods.push(pending("a/p", 4, 60));
                build(
                    vec![queue("a", 8, 0), queue("b", 0, 16)],
                    vec![node("n1", 8), node("n2", 8)],
                    pods,
                )
            },
            pod: "a/p",
            now: 100,
            expect: Expect::Reclaim {
                node: "n2",
                victims: &["b/large2"],
                overrides_min_borrow: false,
            },
        },
        Case {
            name: "lower priority goes first; equal priority, the most recently admitted",
            world: || {
                let mut important = running("b/important", 1, "n1", 90);
                important.priority = 10;
                build(
                    vec![queue("a", 1, 0), queue("b", 0, 8)],
                    vec![node("n1", 3)],
                    vec![
                        important,
                        running("b/old", 1, "n1", 10),
                        running("b/new", 1, "n1", 20),
                        pending("a/p", 1, 30),
                    ],
                )
            },
            pod: "a/p",
            now: 100,
            expect: Expect::Reclaim {
                node: "n1",
                victims: &["b/new"],
                overrides_min_borrow: false,
            },
        },
        Case {
            name: "equal priority and admission time: the name decides, deterministically",
            world: || {
                build(
                    vec![queue("a", 1, 0), queue("b", 0, 8)],
                    vec![node("n1", 2)],
                    vec![
                        running("b/p1", 1, "n1", 10),
                        running("b/p2", 1, "n1", 10),
                        pending("a/p", 1, 30),
                    ],
                )
            },
            pod: "a/p",
            now: 100,
            expect: Expect::Reclaim {
                node: "n1",
                victims: &["b/p2"],
                overrides_min_borrow: false,
            },
        },
        Case {
            name: "reclaim never takes a victim queue below its guarantee",
            world: || {
                build(
                    vec![queue("a", 2, 0), queue("b", 4, 4)],
                    vec![node("n1", 6)],
                    vec![
                        running("b/four", 4, "n1", 0),
                        running("b/one", 1, "n1", 5),
                        running("b/two", 1, "n1", 6),
                        pending("a/p", 2, 10),
                    ],
                )
            },
            pod: "a/p",
            now: 20,
            // b holds 6 against a guarantee of 4: exactly its two 1-GPU pods borrow.
            expect: Expect::Reclaim {
                node: "n1",
                victims: &["b/two", "b/one"],
                overrides_min_borrow: false,
            },
        },
        Case {
            name: "a borrower pod exactly the size of the loan is reclaimed",
            world: || {
                build(
                    vec![queue("a", 2, 0), queue("b", 4, 4)],
                    vec![node("n1", 6)],
                    vec![
                        running("b/four", 4, "n1", 0),
                        running("b/two", 2, "n1", 5),
                        pending("a/p", 2, 10),
                    ],
                )
            },
            pod: "a/p",
            now: 20,
            // b borrows 2 (6 − 4); removing its 2-GPU pod leaves it exactly at its guarantee.
            expect: Expect::Reclaim {
                node: "n1",
                victims: &["b/two"],
                overrides_min_borrow: false,
            },
        },
        Case {
            name: "a pod straddling its queue's guarantee is a borrower (issue 13, case 8)",
            world: || {
                build(
                    vec![queue("a", 2, 0), queue("b", 5, 4)],
                    vec![node("n1", 6)],
                    vec![
                        running("b/four", 4, "n1", 0),
                        running("b/two", 2, "n1", 5),
                        pending("a/p", 2, 10),
                    ],
                )
            },
            pod: "a/p",
            now: 20,
            // b borrows 1 with a pod of 2: that pod straddles b's guarantee, so it is a
            // borrower (b drops to 4 of its 5; a gets its guarantee).
            expect: Expect::Reclaim {
                node: "n1",
                victims: &["b/two"],
                overrides_min_borrow: false,
            },
        },
        Case {
            name: "young borrowers are spared when an older one elsewhere will do",
            world: || young_and_old(false),
            pod: "a/p",
            now: 100,
            expect: Expect::Reclaim {
                node: "n2",
                victims: &["b/old"],
                overrides_min_borrow: false,
            },
        },
        Case {
            name: "a young borrower is evicted when no plan spares it, and the plan says so",
            world: || young_and_old(true),
            pod: "a/p",
            now: 100,
            expect: Expect::Reclaim {
                node: "n1",
                victims: &["b/young"],
                overrides_min_borrow: true,
            },
        },
        Case {
            name: "a queue reclaimed from does not borrow again within minBorrowDuration",
            world: || {
                let b = queue("b", 0, 8).reclaim(ReclaimSettings {
                    min_borrow: Some(Duration::from_mins(1)),
                    ..ReclaimSettings::default()
                });
                let (snapshot, _) = Snapshot::builder()
                    .queues([queue("a", 8, 0), b])
                    .node(node("n1", 8))
                    .pod(pending("b/p", 1, 0))
                    .reclaimed_from("b", at(50))
                    .build();
                snapshot
            },
            pod: "b/p",
            now: 100,
            expect: Expect::Wait {
                code: "BorrowCooldown",
                says: &["queue b", "may borrow again from 2026-01-01T00:01:50Z"],
            },
        },
        Case {
            name: "MIG profiles are quotas of their own",
            world: mig_world,
            pod: "a/mig",
            now: 10,
            expect: Expect::Admit("mig-node", AdmittedAs::Guaranteed),
        },
        Case {
            name: "a resource the queue lists no quota for waits",
            world: mig_world,
            pod: "a/whole",
            now: 10,
            expect: Expect::Wait {
                code: "NoQuota",
                says: &["queue a has no quota for nvidia.com/gpu"],
            },
        },
        Case {
            name: "a GPU memory cap keeps pods off devices beyond it",
            world: || {
                let mut a = queue("a", 8, 0);
                a.quotas[0].gpu_memory_mib = Some(100 * 1024);
                let mut n = node("n1", 8);
                n.pools[0].memory_mib = Some(80 * 1024);
                build(
                    vec![a],
                    vec![n],
                    vec![running("a/x", 1, "n1", 0), pending("a/p", 1, 5)],
                )
            },
            pod: "a/p",
            now: 10,
            expect: Expect::Wait {
                code: "GpuMemoryCap",
                says: &["in use is 81920 MiB of its cap of 102400 MiB"],
            },
        },
        Case {
            name: "a namespace claimed by two queues admits nothing",
            world: || {
                build(
                    vec![queue("a", 8, 0), queue("b", 8, 0).namespace("a")],
                    vec![node("n1", 8)],
                    vec![pending("a/p", 1, 0)],
                )
            },
            pod: "a/p",
            now: 10,
            expect: Expect::Wait {
                code: "NamespaceConflict",
                says: &["namespace a is claimed by several GpuQueues (a, b)"],
            },
        },
        Case {
            name: "a namespace no queue claims waits for one",
            world: || {
                build(
                    vec![queue("a", 8, 0)],
                    vec![node("n1", 8)],
                    vec![pending("other/p", 1, 0)],
                )
            },
            pod: "other/p",
            now: 10,
            expect: Expect::Wait {
                code: "NoQueue",
                says: &["namespace other is claimed by no GpuQueue"],
            },
        },
    ]
}

/// b has a young borrower on n1 and, unless `only_young`, an old one on n2; a needs one GPU.
fn young_and_old(only_young: bool) -> Snapshot {
    let b = queue("b", 0, 8).reclaim(ReclaimSettings {
        min_borrow: Some(Duration::from_mins(1)),
        ..ReclaimSettings::default()
    });
    let mut nodes = vec![node("n1", 1)];
    let mut pods = vec![running("b/young", 1, "n1", 90), pending("a/p", 1, 95)];
    if !only_young {
        nodes.push(node("n2", 1));
        pods.push(running("b/old", 1, "n2", 0));
    }
    build(vec![queue("a", 4, 0), b], nodes, pods)
}

fn mig_world() -> Snapshot {
    let mig = "nvidia.com/mig-1g.10gb";
    let a = Queue::new("a")
        .namespace("a")
        .quota(ResourceQuota::devices(mig, 7, 0));
    let mut mig_pod = pending("a/mig", 1, 0);
    mig_pod.requests.gpus = vec![GpuRequest::devices(mig, 2)];
    build(
        vec![a],
        vec![node("gpu-node", 8), Node::new("mig-node").gpus(mig, 7)],
        vec![mig_pod, pending("a/whole", 1, 0)],
    )
}

#[test]
fn scenarios_decide_as_expected() {
    let mut failures = Vec::new();
    for case in cases() {
        let snapshot = (case.world)();
        let pod = snapshot.pod_id(&key(case.pod)).unwrap();
        let decision = decide(&snapshot, pod, &Policy::default(), at(case.now));
        if let Err(why) = matches(&decision, &case.expect) {
            failures.push(format!("{}: {why}\n  got {decision:#?}", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn key(s: &str) -> PodKey {
    let (ns, name) = s.split_once('/').unwrap();
    PodKey::new(ns, name)
}

fn matches(decision: &Decision, expect: &Expect) -> Result<(), String> {
    match (decision, expect) {
        (Decision::Admit(a), Expect::Admit(node, as_)) => (a.placement.node_name == *node
            && a.admitted_as == *as_)
            .then_some(())
            .ok_or_else(|| format!("expected admit on {node} as {as_}")),
        (
            Decision::Reclaim(plan),
            Expect::Reclaim {
                node,
                victims,
                overrides_min_borrow,
            },
        ) => {
            let got: Vec<String> = plan.victims.iter().map(|v| v.key.to_string()).collect();
            (plan.node_name == *node && got == *victims && plan.overrides_min_borrow == *overrides_min_borrow)
                .then_some(())
                .ok_or_else(|| format!("expected reclaim on {node} of {victims:?} (overrides {overrides_min_borrow})"))
        }
        (Decision::Wait(w), Expect::Wait { code, says }) => {
            let message = w.reason.to_string();
            if w.reason.code() != *code {
                return Err(format!("expected wait {code}, message: {message}"));
            }
            says.iter()
                .find(|s| !message.contains(**s))
                .map_or(Ok(()), |s| Err(format!("message {message:?} lacks {s:?}")))
        }
        _ => Err(format!("expected {expect:?}")),
    }
}

#[test]
fn a_cycle_serves_guarantees_before_borrowers_whatever_their_age() {
    let mut pods: Vec<_> = (0..4)
        .map(|i| pending(&format!("b/early{i}"), 1, i))
        .collect();
    pods.extend((0..4).map(|i| pending(&format!("a/late{i}"), 1, 100 + i)));
    let mut snapshot = build(
        vec![queue("a", 4, 0), queue("b", 0, 4)],
        vec![node("n1", 4)],
        pods,
    );
    let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(200));
    let admitted: Vec<String> = decisions
        .iter()
        .filter(|d| matches!(d, Decision::Admit(_)))
        .map(|d| d.key().to_string())
        .collect();
    assert_eq!(admitted, ["a/late0", "a/late1", "a/late2", "a/late3"]);
    assert!(
        decisions
            .iter()
            .filter(|d| d.key().namespace == "b")
            .all(|d| matches!(d, Decision::Wait(_)))
    );
}

#[test]
fn a_cycle_shares_idle_capacity_by_weight() {
    let mut pods: Vec<_> = (0..8)
        .map(|i| pending(&format!("light/p{i}"), 1, i))
        .collect();
    pods.extend((0..8).map(|i| pending(&format!("heavy/p{i}"), 1, i)));
    let mut snapshot = build(
        vec![
            queue("light", 0, 8),
            queue("heavy", 0, 8).weight(3),
            queue("idle", 8, 0),
        ],
        vec![node("n1", 8)],
        pods,
    );
    let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(100));
    let admitted = |ns: &str| {
        decisions
            .iter()
            .filter(|d| matches!(d, Decision::Admit(_)) && d.key().namespace == ns)
            .count()
    };
    assert_eq!(
        (admitted("light"), admitted("heavy")),
        (2, 6),
        "weights 1:3 share 8 idle GPUs 2:6"
    );
}

#[test]
fn a_reclaim_in_a_cycle_reserves_the_freed_room_for_its_owner() {
    let mut pods: Vec<_> = (0..4)
        .map(|i| running(&format!("b/r{i}"), 1, "n1", i))
        .collect();
    pods.push(pending("a/owner", 2, 10));
    pods.push(pending("b/next", 1, 5));
    let mut snapshot = build(
        vec![queue("a", 2, 0), queue("b", 0, 8)],
        vec![node("n1", 4)],
        pods,
    );
    let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(100));
    let Decision::Reclaim(plan) = &decisions[0] else {
        panic!("{decisions:#?}")
    };
    assert_eq!(
        plan.victims
            .iter()
            .map(|v| v.key.name.as_str())
            .collect::<Vec<_>>(),
        ["r3", "r2"]
    );
    assert!(
        matches!(&decisions[1], Decision::Wait(w) if w.key.name == "next"),
        "{decisions:#?}"
    );
    let n1 = snapshot.node_id("n1").unwrap();
    assert!(
        snapshot.is_oversubscribed(n1),
        "the owner waits on the node for its victims"
    );
    // The victims go; the owner is seated; nothing was evicted twice.
    for victim in &plan.victims {
        snapshot.remove_pod(victim.pod).unwrap();
    }
    assert!(!snapshot.is_oversubscribed(n1));
    assert_eq!(snapshot.pod_node(plan.owner), Some(n1));
    let again = admission_cycle(&mut snapshot, &Policy::default(), at(101));
    assert!(
        again.iter().all(|d| !matches!(d, Decision::Reclaim(_))),
        "{again:#?}"
    );
}

#[test]
fn lowering_a_guarantee_below_use_marks_the_excess_borrowed_and_evicts_nothing() {
    let pods: Vec<_> = (0..8)
        .map(|i| running(&format!("a/p{i}"), 1, "n1", i))
        .collect();
    let mut snapshot = build(
        vec![queue("a", 4, 4), queue("b", 4, 0)],
        vec![node("n1", 8)],
        pods,
    );
    let reports = queue_reports(&snapshot, &HandoverBudgets::default());
    let a = &reports[0].resources[0];
    assert_eq!(
        (a.allocated, a.borrowed),
        (Milli::devices(8), Milli::devices(4))
    );
    assert_eq!(
        reports[1].resources[0].lent,
        Milli::devices(4),
        "b's idle guarantee is what a borrows"
    );
    let a_id = snapshot.queue_id("a").unwrap();
    let borrowers: Vec<String> = snapshot
        .borrowers(a_id)
        .iter()
        .map(|p| snapshot.pod(*p).unwrap().key.name.clone())
        .collect();
    assert_eq!(
        borrowers,
        ["p7", "p6", "p5", "p4"],
        "the most recently admitted borrow"
    );
    assert!(admission_cycle(&mut snapshot, &Policy::default(), at(100)).is_empty());
    // b wants its guarantee back: exactly the borrowers it needs are reclaimed.
    let b_pod = snapshot.add_pod(pending("b/p", 3, 100)).unwrap();
    let Decision::Reclaim(plan) = decide(&snapshot, b_pod, &Policy::default(), at(101)) else {
        panic!()
    };
    assert_eq!(plan.victims.len(), 3);
}

#[test]
fn status_reports_who_has_what() {
    let pods: Vec<_> = (0..12)
        .map(|i| running(&format!("b/p{i}"), 1, if i < 8 { "n1" } else { "n2" }, i))
        .collect();
    let mut pods = pods;
    pods.push(pending("b/waiting", 2, 50));
    pods.push(running("kube-system/monitor", 1, "n2", 0));
    let snapshot = build(
        vec![queue("a", 6, 0), queue("b", 4, 8), queue("c", 4, 0)],
        vec![node("n1", 8), node("n2", 8)],
        pods,
    );
    let reports = queue_reports(&snapshot, &HandoverBudgets::default());
    let names: Vec<&str> = reports.iter().map(|r| r.queue.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let b = &reports[1];
    assert_eq!((b.admitted_pods, b.pending_pods), (12, 1));
    let r = &b.resources[0];
    assert_eq!(r.resource.as_str(), GPU);
    assert_eq!(
        (
            r.guaranteed,
            r.ceiling,
            r.allocated,
            r.borrowed,
            r.lent,
            r.pending
        ),
        (
            Milli::devices(4),
            Milli::devices(12),
            Milli::devices(12),
            Milli::devices(8),
            Milli::ZERO,
            Milli::devices(2)
        )
    );
    // 16 GPUs, 14 guaranteed, 1 held by an unmanaged pod: 1 unguaranteed GPU is free to
    // borrow, the other 7 borrowed come out of a's and c's idle guarantees (6:4).
    let lent: Vec<Milli> = reports.iter().map(|r| r.resources[0].lent).collect();
    assert_eq!(lent, [Milli(4200), Milli::ZERO, Milli(2800)]);
    let summary = b.summary();
    assert_eq!(
        (
            summary.guaranteed.as_str(),
            summary.ceiling.as_str(),
            summary.borrowed.as_str(),
            summary.pending.as_str()
        ),
        ("4", "12", "8", "2")
    );
    let statuses = reports[0].resource_statuses();
    assert_eq!(
        (statuses[0].guaranteed, statuses[0].lent),
        (6, 5),
        "whole GPUs, rounded up"
    );
    let over = b
        .conditions
        .iter()
        .find(|c| c.type_ == "Overcommitted")
        .unwrap();
    assert!(
        !over.status,
        "14 guaranteed + 1 unmanaged GPU fit in 16: {over:?}"
    );
    assert_eq!(over.message, "nvidia.com/gpu: guarantees 14 of 16");
}

#[test]
fn overcommitted_and_conflict_conditions_explain_themselves() {
    let snapshot = build(
        vec![
            queue("a", 10, 0).namespace("shared"),
            queue("b", 10, 0).namespace("shared"),
        ],
        vec![node("n1", 16)],
        vec![],
    );
    let reports = queue_reports(&snapshot, &HandoverBudgets::default());
    for r in &reports {
        let over = r
            .conditions
            .iter()
            .find(|c| c.type_ == "Overcommitted")
            .unwrap();
        assert!(over.status);
        assert_eq!(over.reason, "GuaranteesExceedCapacity");
        assert!(
            over.message.contains(
                "nvidia.com/gpu: the guarantees of all queues add up to 20 but the cluster has 16"
            ),
            "{}",
            over.message
        );
        let conflict = r
            .conditions
            .iter()
            .find(|c| c.type_ == "NamespaceConflict")
            .unwrap();
        assert!(conflict.status);
        assert!(
            conflict
                .message
                .starts_with("namespace shared is also claimed by "),
            "{}",
            conflict.message
        );
    }
    let now = at(0);
    let first = reports[0].to_status(now, None);
    let later = reports[0].to_status(at(60), Some(&first));
    let since = |s: &gpuqueue_api::v1alpha1::GpuQueueStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Overcommitted")
            .unwrap()
            .last_transition_time
            .0
    };
    assert_eq!(
        since(&later),
        now,
        "an unchanged condition keeps its transition time"
    );
}

#[test]
fn namespaces_are_claimed_by_label_selector() {
    let mut a = queue("a", 4, 0);
    a.namespace_selector = Some(gpuqueue_core::model::selector::LabelSelector {
        requirements: vec![gpuqueue_core::model::selector::Requirement {
            key: "tenant".into(),
            operator: gpuqueue_core::model::selector::Operator::In,
            values: vec!["a".into()],
        }],
    });
    let (snapshot, _) = Snapshot::builder()
        .queue(a)
        .namespace(Namespace::new("team-a-dev").label("tenant", "a"))
        .node(node("n1", 4))
        .pod(pending("team-a-dev/p", 1, 0))
        .build();
    let pod = snapshot.pod_id(&key("team-a-dev/p")).unwrap();
    assert!(matches!(
        decide(&snapshot, pod, &Policy::default(), at(1)),
        Decision::Admit(a) if a.queue == "a"
    ));
}

#[test]
fn a_checkpoint_gets_its_timeout_unless_the_budget_leaves_less() {
    use gpuqueue_core::reclaim::checkpoint_allowance;
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    // 3 s budget, 50 ms spent, 1.5 s kept for termination and bind: 1.45 s left, the 2 s
    // timeout is cut.
    assert_eq!(checkpoint_allowance(s(3), s(2), ms(1500), ms(50)), ms(1450));
    // A short timeout is the limit.
    assert_eq!(
        checkpoint_allowance(s(3), ms(500), ms(1500), ms(50)),
        ms(500)
    );
    // A spent budget leaves nothing (a handover resumed after a restart).
    assert_eq!(
        checkpoint_allowance(s(3), s(2), ms(1500), s(2)),
        Duration::ZERO
    );
    assert_eq!(
        checkpoint_allowance(s(3), s(2), ms(1500), s(10)),
        Duration::ZERO
    );
    // A reserve longer than the budget leaves nothing either.
    assert_eq!(
        checkpoint_allowance(s(3), s(2), s(4), ms(0)),
        Duration::ZERO
    );
}

/// a: guaranteed 4 on one node of 4, b: burstable 4; `pods` already there.
fn one_node(pods: Vec<gpuqueue_core::model::Pod>) -> Snapshot {
    build(
        vec![queue("a", 4, 0), queue("b", 0, 4)],
        vec![node("n1", 4)],
        pods,
    )
}

fn at_creation(snapshot: &mut Snapshot, key: &str, gpus: u32) -> Result<AdmittedAs, NotAtCreation> {
    admit_at_creation(
        snapshot,
        pending(key, gpus, 100),
        &Policy::default(),
        at(100),
    )
    .map(|admission| {
        assert_eq!(admission.placement.node_name, "n1");
        admission.admitted_as
    })
}

#[test]
fn a_pod_that_fits_when_nothing_waits_is_admitted_at_creation_and_holds_its_room() {
    let mut snapshot = one_node(vec![running("a/a0", 1, "n1", 0)]);
    assert_eq!(
        at_creation(&mut snapshot, "a/a1", 2),
        Ok(AdmittedAs::Guaranteed)
    );
    // The room it took is gone for the next one: 3 of 4 in use, 2 more do not fit.
    assert!(matches!(
        at_creation(&mut snapshot, "a/a2", 2),
        Err(NotAtCreation::Decided(d)) if matches!(*d, Decision::Wait(_))
    ));
    assert_eq!(
        at_creation(&mut snapshot, "a/a2", 1),
        Ok(AdmittedAs::Guaranteed)
    );
    assert_eq!(snapshot.pending_pods().count(), 0);
}

#[test]
fn a_borrower_is_admitted_at_creation_from_idle_capacity() {
    let mut snapshot = one_node(Vec::new());
    assert_eq!(
        at_creation(&mut snapshot, "b/b0", 3),
        Ok(AdmittedAs::Borrowed)
    );
}

#[test]
fn nothing_is_admitted_at_creation_while_another_pod_waits() {
    // b0 waits (b may borrow only 4 and holds them); a pod of a, which would fit, must not
    // overtake it: the cycle decides both.
    let mut snapshot = build(
        vec![queue("a", 2, 0), queue("b", 0, 2)],
        vec![node("n1", 4)],
        vec![
            running("b/b1", 1, "n1", 0),
            running("b/b2", 1, "n1", 0),
            pending("b/b0", 1, 50),
        ],
    );
    let before = snapshot.pending_pods().count();
    assert_eq!(
        at_creation(&mut snapshot, "a/a0", 1),
        Err(NotAtCreation::OthersWait)
    );
    assert_eq!(snapshot.pending_pods().count(), before);
}

#[test]
fn a_pod_that_needs_a_reclaim_is_not_admitted_at_creation_and_nothing_is_marked() {
    // b borrows all 4 GPUs of a's guarantee; a's new pod needs a reclaim, which is the
    // cycle's business: the snapshot is left exactly as it was.
    let mut snapshot = one_node(
        (0..4)
            .map(|i| running(&format!("b/b{i}"), 1, "n1", i))
            .collect(),
    );
    let reports_before = format!(
        "{:?}",
        queue_reports(&snapshot, &HandoverBudgets::default())
    );
    assert!(matches!(
        at_creation(&mut snapshot, "a/a0", 1),
        Err(NotAtCreation::Decided(d)) if matches!(*d, Decision::Reclaim(_))
    ));
    assert_eq!(
        format!(
            "{:?}",
            queue_reports(&snapshot, &HandoverBudgets::default())
        ),
        reports_before
    );
    assert_eq!(snapshot.pending_pods().count(), 0);
    // A cycle over the same world plans nothing: no victim was left marked.
    assert!(admission_cycle(&mut snapshot, &Policy::default(), at(100)).is_empty());
}

#[test]
fn a_pod_reserved_at_creation_that_the_store_has_not_shown_is_never_a_reclaim_victim() {
    // b borrows all of n1: one running pod, and one admitted at creation a moment ago whose
    // pod may never exist. Evicting the phantom frees nothing; the plan takes the real pod.
    let pods = vec![
        running("b/real", 2, "n1", 10),
        reserved_unseen("b/phantom", 2, "n1", 50),
        pending("a/owner", 2, 60),
    ];
    let mut snapshot = build(
        vec![queue("a", 4, 0), queue("b", 0, 4)],
        vec![node("n1", 4)],
        pods,
    );
    let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(61));
    let Decision::Reclaim(plan) = &decisions[0] else {
        panic!("{decisions:#?}")
    };
    let victims: Vec<&str> = plan.victims.iter().map(|v| v.key.name.as_str()).collect();
    assert_eq!(victims, ["real"]);
}

#[test]
fn a_reservation_the_store_has_not_shown_makes_no_real_pod_a_borrower() {
    // b is guaranteed 2 and holds 2 with a real pod; its newest pod is a reservation the store
    // has not shown, whose create may still fail. Were the real pod marked as b's borrower, a
    // reclaim could take b below its guarantee (the soak caught it, with creates an API server
    // refused after the webhook answered). a waits: the pod shows, or the reservation expires.
    let world = |phantom: Pod| {
        build(
            vec![queue("a", 2, 0), queue("b", 2, 2)],
            vec![node("n1", 4)],
            vec![
                running("b/real", 2, "n1", 10),
                phantom,
                pending("a/owner", 2, 60),
            ],
        )
    };
    let mut unseen = world(reserved_unseen("b/phantom", 2, "n1", 50));
    let decisions = admission_cycle(&mut unseen, &Policy::default(), at(61));
    assert!(matches!(&decisions[0], Decision::Wait(_)), "{decisions:#?}");

    // Once the store shows the pod, it is b's most recent pod, hence its borrower.
    let mut shown = world(running("b/phantom", 2, "n1", 50));
    let decisions = admission_cycle(&mut shown, &Policy::default(), at(61));
    let Decision::Reclaim(plan) = &decisions[0] else {
        panic!("{decisions:#?}")
    };
    let victims: Vec<&str> = plan.victims.iter().map(|v| v.key.name.as_str()).collect();
    assert_eq!(victims, ["phantom"]);
}

/// A pod the webhook admitted at creation on `node` at `at`, which the pod store has not shown.
fn reserved_unseen(key: &str, gpus: u32, node: &str, at: i64) -> Pod {
    let mut pod = running(key, gpus, node, at);
    pod.reserved_unseen = true;
    pod.started_at = None;
    pod.state = PodState::Admitted(Assignment {
        node: Some(node.into()),
        bound: false,
        terminating: false,
    });
    pod
}
