//! A kept snapshot brought up to date is the snapshot a build gives (proptest): after every
//! step of generated changes to a cluster's pods (added, removed, pinned, bound, terminating,
//! named devices, shared GPUs), the kept one and a fresh build agree on every device, ledger,
//! deficit and fragmentation figure and on the admission cycle's decisions; pods left out (an
//! invalid request, devices another pod holds) included.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::sync::Arc;

use common::decisions::describe;
use common::world::{GPU, at, node, queue};
use gpuqueue_core::admission::admission_cycle;
use gpuqueue_core::fragmentation::{DEFAULT_POPULARITY, WorkloadMix};
use gpuqueue_core::model::{
    Assignment, DeviceSet, GpuRequest, Pod, PodKey, PodState, ReclaimMark, ReclaimRole, Requests,
};
use gpuqueue_core::snapshot::kept::{KeptSnapshot, Made};
use gpuqueue_core::{Policy, Snapshot};
use proptest::prelude::*;

const NODES: usize = 3;
const QUEUES: usize = 3;

/// One pod as generated: which queue (one past the last: unclaimed), what it asks, its state.
#[derive(Clone, Debug)]
struct Spec {
    queue: usize,
    /// Whole GPUs (1–2), or a share of one in milli.
    ask: Ask,
    state: State,
    time: i64,
    priority: i32,
}

#[derive(Clone, Copy, Debug)]
enum Ask {
    Whole(u32),
    Share(u32),
}

#[derive(Clone, Copy, Debug)]
enum State {
    Pending,
    /// Pinned to a node, not bound yet (an owner awaiting its bind when `owner`).
    Pinned {
        node: usize,
        owner: bool,
    },
    /// Bound; on the named device when `device` is set.
    Bound {
        node: usize,
        device: Option<u16>,
        terminating: bool,
    },
}

fn spec() -> impl Strategy<Value = Spec> {
    // Whole(0) is an invalid request: left out by a build and by an update alike.
    let ask = prop_oneof![
        6 => (1u32..=2).prop_map(Ask::Whole),
        2 => prop_oneof![Just(300u32), Just(500)].prop_map(Ask::Share),
        1 => Just(Ask::Whole(0)),
    ];
    let state = prop_oneof![
        2 => Just(State::Pending),
        1 => (0..NODES, any::<bool>()).prop_map(|(node, owner)| State::Pinned { node, owner }),
        4 => (0..NODES, prop::option::weighted(0.2, 0u16..4), prop::bool::weighted(0.1))
            .prop_map(|(node, device, terminating)| State::Bound { node, device, terminating }),
    ];
    (0..=QUEUES, ask, state, 0i64..50, 0i32..3).prop_map(|(queue, ask, state, time, priority)| {
        Spec {
            queue,
            ask,
            state,
            time,
            priority,
        }
    })
}

fn make(name: usize, spec: &Spec) -> Arc<Pod> {
    let request = match spec.ask {
        Ask::Whole(n) => GpuRequest::devices(GPU, n),
        Ask::Share(milli) => GpuRequest::shared(GPU, milli),
    };
    let mut pod = Pod::new(
        PodKey::new(format!("q{}", spec.queue), format!("p{name}")),
        Requests {
            cpu_milli: 1000,
            memory_bytes: 1 << 30,
            gpus: vec![request],
            quota_only: Vec::new(),
        },
        at(spec.time),
    );
    pod.priority = spec.priority;
    match spec.state {
        State::Pending => {}
        State::Pinned { node, owner } => {
            pod.state = PodState::Admitted(Assignment {
                node: Some(format!("n{node}")),
                bound: false,
                terminating: false,
            });
            pod.admitted_at = Some(at(spec.time + 1));
            if owner {
                pod.reclaim = Some(ReclaimMark {
                    id: format!("rc-{name}"),
                    role: ReclaimRole::Owner,
                });
            }
        }
        State::Bound {
            node,
            device,
            terminating,
        } => {
            pod.state = PodState::Admitted(Assignment {
                node: Some(format!("n{node}")),
                bound: true,
                terminating,
            });
            pod.admitted_at = Some(at(spec.time + 1));
            pod.started_at = Some(at(spec.time + 2));
            if let (Some(device), Ask::Share(_) | Ask::Whole(1)) = (device, spec.ask) {
                pod.devices = vec![DeviceSet {
                    resource: GPU.into(),
                    devices: vec![device],
                }];
            }
        }
    }
    Arc::new(pod)
}

/// A change between two builds.
#[derive(Clone, Debug)]
enum Step {
    Add(Spec),
    /// Removes the pod at this index (modulo the count).
    Remove(usize),
    /// Gives the pod at this index a new state (a new object, as a watch would).
    Change(usize, State),
    /// Rebuilds a pod unchanged as a new object.
    Touch(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => spec().prop_map(Step::Add),
        2 => any::<usize>().prop_map(Step::Remove),
        3 => (any::<usize>(), spec()).prop_map(|(i, s)| Step::Change(i, s.state)),
        1 => any::<usize>().prop_map(Step::Touch),
    ]
}

/// The cluster for the kept snapshot, which counts the mix of the pods as they change.
fn builder(pods: &[Arc<Pod>], gpus: &[u32]) -> gpuqueue_core::snapshot::SnapshotBuilder {
    fresh(pods, gpus).workload_mix_of_pods(DEFAULT_POPULARITY)
}

/// The cluster for a fresh build, with the mix counted from every pod.
fn built(pods: &[Arc<Pod>], gpus: &[u32]) -> Snapshot {
    let mix = WorkloadMix::from_pods(pods.iter().map(AsRef::as_ref), DEFAULT_POPULARITY);
    let (snapshot, _) = fresh(pods, gpus).workload_mix(mix).build();
    snapshot
}

fn fresh(pods: &[Arc<Pod>], gpus: &[u32]) -> gpuqueue_core::snapshot::SnapshotBuilder {
    Snapshot::builder()
        .queues((0..QUEUES).map(|q| queue(&format!("q{q}"), 3, 6)))
        .nodes(
            gpus.iter()
                .enumerate()
                .map(|(i, g)| node(&format!("n{i}"), *g)),
        )
        .pods(pods.iter().cloned())
        .reclaimed_from("q1", at(10))
}

/// Everything the policy reads, with pods named by key (ids differ: an update appends).
fn figures(snapshot: &Snapshot) -> Vec<String> {
    let key = |id| snapshot.pod(id).unwrap().key.to_string();
    let mut out = Vec::new();
    for q in snapshot.queue_ids() {
        let mut borrowers: Vec<String> = snapshot.borrowers(q).into_iter().map(key).collect();
        borrowers.sort();
        out.push(format!(
            "queue {}: {:?} counts {:?} borrowers {borrowers:?} share {} last {:?}",
            snapshot.queue(q).name,
            snapshot.usage(q),
            snapshot.pod_counts(q),
            snapshot.borrowing_share(q),
            snapshot.last_reclaimed(q),
        ));
    }
    for n in snapshot.node_ids() {
        let view = snapshot.node_view(n);
        let pods: Vec<String> = snapshot.pods_on(n).map(key).collect();
        out.push(format!(
            "node {}: free {:?} memory {:?} cpu {} frag {} over {} closed {} pods {pods:?}",
            view.node().name,
            view.gpu_free(),
            view.gpu_free_memory(),
            view.cpu_free_milli(),
            snapshot.node_fragmentation(n),
            snapshot.is_oversubscribed(n),
            snapshot.is_closed_to_borrowers(n),
        ));
    }
    let mut pods: Vec<String> = snapshot
        .pod_ids()
        .map(|id| {
            format!(
                "pod {} queue {:?} node {:?} devices {:?}",
                key(id),
                snapshot.pod_queue(id),
                snapshot.pod_node(id),
                snapshot.pod_devices(id)
            )
        })
        .collect();
    pods.sort();
    out.extend(pods);
    for name in snapshot.resources() {
        let r = snapshot.resource_id(name).unwrap();
        out.push(format!(
            "resource {}: capacity {:?} unmanaged {:?} allocated {:?}",
            snapshot.resource_name(r),
            snapshot.capacity(r),
            snapshot.unmanaged(r),
            snapshot.allocated(r)
        ));
    }
    out.push(format!("{:?}", snapshot.fragmentation()));
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn an_updated_snapshot_is_the_snapshot_a_build_gives(
        gpus in prop::collection::vec(2u32..=8, NODES),
        start in prop::collection::vec(spec(), 0..=16),
        steps in prop::collection::vec(step(), 1..=12),
    ) {
        let mut names = 0..;
        let mut specs: Vec<(usize, Spec)> =
            start.into_iter().map(|s| (names.next().unwrap(), s)).collect();
        let mut pods: Vec<Arc<Pod>> = specs.iter().map(|(name, s)| make(*name, s)).collect();
        let mut kept = KeptSnapshot::default();
        let now = at(100);
        for step in std::iter::once(None).chain(steps.into_iter().map(Some)) {
            match step {
                Some(Step::Add(spec)) => {
                    let name = names.next().unwrap();
                    pods.push(make(name, &spec));
                    specs.push((name, spec));
                }
                Some(Step::Remove(i)) if !pods.is_empty() => {
                    let i = i % pods.len();
                    pods.remove(i);
                    specs.remove(i);
                }
                Some(Step::Change(i, state)) if !pods.is_empty() => {
                    let i = i % pods.len();
                    specs[i].1.state = state;
                    pods[i] = make(specs[i].0, &specs[i].1);
                }
                Some(Step::Touch(i)) if !pods.is_empty() => {
                    let i = i % pods.len();
                    pods[i] = Arc::new(Pod::clone(&pods[i]));
                }
                // The first build, or a change to an empty cluster.
                None | Some(_) => {}
            }
            let (mut updated, _, _) = kept.build(builder(&pods, &gpus));
            let mut fresh_build = built(&pods, &gpus);
            prop_assert_eq!(figures(&updated), figures(&fresh_build));
            let policy = Policy::default();
            prop_assert_eq!(
                describe(&admission_cycle(&mut updated, &policy, now)),
                describe(&admission_cycle(&mut fresh_build, &policy, now))
            );
            // The pass changed its copy; the kept snapshot is untouched by it.
            let (again, _, made) = kept.build(builder(&pods, &gpus));
            prop_assert_eq!(made, Made::Updated { removed: 0, added: 0 });
            prop_assert_eq!(figures(&again), figures(&built(&pods, &gpus)));
        }
    }
}

/// The common case is an update, not a build: a few pods changed among many.
#[test]
fn a_few_changed_pods_update_the_kept_snapshot() {
    let gpus = [8u32; NODES];
    let mut pods: Vec<Arc<Pod>> = (0..20)
        .map(|i| {
            make(
                i,
                &Spec {
                    queue: i % QUEUES,
                    ask: Ask::Whole(1),
                    state: State::Bound {
                        node: i % NODES,
                        device: None,
                        terminating: false,
                    },
                    time: i64::try_from(i).unwrap(),
                    priority: 0,
                },
            )
        })
        .collect();
    let mut kept = KeptSnapshot::default();
    assert_eq!(kept.build(builder(&pods, &gpus)).2, Made::Built);
    pods.remove(3);
    pods.push(make(
        20,
        &Spec {
            queue: 0,
            ask: Ask::Whole(1),
            state: State::Pending,
            time: 60,
            priority: 0,
        },
    ));
    let (snapshot, issues, made) = kept.build(builder(&pods, &gpus));
    assert_eq!(
        made,
        Made::Updated {
            removed: 1,
            added: 1
        }
    );
    assert!(issues.is_empty(), "{issues:?}");
    assert_eq!(
        figures(&snapshot),
        figures(&builder(&pods, &gpus).build().0)
    );

    // A node changed: built again.
    let (_, _, made) = kept.build(builder(&pods, &[8, 8, 4]));
    assert_eq!(made, Made::Built);
}
