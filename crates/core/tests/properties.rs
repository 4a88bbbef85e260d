//! Properties of the policy on generated clusters (proptest): device accounting, quota ceilings,
//! reclaim safety and minimality, determinism, guarantees honoured after handovers, and no
//! disruption planned on a snapshot behind the cluster. The clusters include DRA's shapes that
//! change the accounting: devices charged to quota only (a `firstAvailable` claim not allocated
//! yet) and pods sharing a claim charged to another. Each case is a small cluster, so hundreds of
//! cases run in about a second.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::decisions::describe;
use common::world::{GPU, at, build as build_snapshot, node, pending, queue, running};
use gpuqueue_core::Policy;
use gpuqueue_core::Snapshot;
use gpuqueue_core::admission::{Decision, admission_cycle};
use gpuqueue_core::enforcement::enforce;
use gpuqueue_core::ids::{NodeId, PodId, QueueId};
use gpuqueue_core::model::{GpuRequest, Pod};
use gpuqueue_core::placement::{BestFit, TieBreak, mix64};
use gpuqueue_core::quantity::{MILLI_PER_DEVICE, Milli};
use gpuqueue_core::reclaim::plan_reclaim;
use proptest::prelude::*;

/// A generated cluster: node sizes, queue quotas, and pods (running or pending).
#[derive(Clone, Debug)]
struct World {
    nodes: Vec<u32>,
    /// (guaranteed, burstable, lending limit)
    queues: Vec<(u64, u64, Option<u64>)>,
    pods: Vec<PodSpec>,
}

#[derive(Clone, Debug)]
struct PodSpec {
    /// Index into `queues`; one past the end: an unmanaged namespace.
    queue: usize,
    gpus: u32,
    priority: i32,
    /// The node it runs on; `None`: pending.
    node: Option<usize>,
    time: i64,
    /// Devices charged to its queue but not placed: the other alternatives of a DRA
    /// `firstAvailable` request not allocated yet (`Requests::quota_only`).
    quota_only: u32,
    /// Uses a DRA claim charged to the pod this many places before it, charged nothing
    /// itself: where that pod runs, this one runs beside it, in its namespace, as one of its
    /// `claim_sharers`.
    shares_claim_of: Option<usize>,
}

/// Pods of up to `max_gpus` GPUs; with `dra`, some hold quota-only devices and some share a
/// claim charged to another pod.
fn world(max_gpus: u32, unmanaged: bool, dra: bool) -> impl Strategy<Value = World> {
    let nodes = prop::collection::vec(1u32..=8, 1..=5);
    let queues = prop::collection::vec((0u64..=8, 0u64..=8, prop::option::of(0u64..=8)), 1..=4);
    let extra: u32 = if dra { 2 } else { 0 };
    (nodes, queues).prop_flat_map(move |(nodes, queues)| {
        let queue_choices = queues.len() + usize::from(unmanaged);
        let shares = if dra {
            prop::option::weighted(0.3, 1usize..=3).boxed()
        } else {
            Just(None).boxed()
        };
        let pod = (
            0..queue_choices,
            1..=max_gpus,
            0i32..3,
            prop::option::of(0..nodes.len()),
            0i64..100,
            prop_oneof![3 => Just(0u32), 1 => 0..=extra],
            shares,
        )
            .prop_map(
                |(queue, gpus, priority, node, time, quota_only, shares_claim_of)| PodSpec {
                    queue,
                    gpus,
                    priority,
                    node,
                    time,
                    quota_only,
                    shares_claim_of,
                },
            );
        prop::collection::vec(pod, 0..=24).prop_map(move |pods| World {
            nodes: nodes.clone(),
            queues: queues.clone(),
            pods,
        })
    })
}

fn queue_name(i: usize) -> String {
    format!("q{i}")
}

/// Builds the world: running pods only where they fit (devices and their queue's ceiling), so
/// the starting state is one the policy could have produced.
fn build(w: &World) -> Snapshot {
    let queues: Vec<gpuqueue_core::model::Queue> = w
        .queues
        .iter()
        .enumerate()
        .map(|(i, (g, b, lend))| {
            let mut q = queue(&queue_name(i), *g, *b);
            q.quotas[0].lending_limit = lend.map(|l| Milli::devices(l.min(*g)));
            q
        })
        .collect();
    let nodes: Vec<gpuqueue_core::model::Node> = w
        .nodes
        .iter()
        .enumerate()
        .map(|(i, gpus)| node(&format!("n{i}"), *gpus))
        .collect();
    let mut trial = build_snapshot(queues.clone(), nodes.clone(), Vec::new());
    let mut pods: Vec<Pod> = Vec::new();
    // Each generated pod kept: its index in `pods` and the node it runs on.
    let mut kept: Vec<Option<(usize, Option<usize>)>> = vec![None; w.pods.len()];
    for (i, p) in w.pods.iter().enumerate() {
        // A pod sharing a claim runs beside the claim's holder, in its namespace: a running pod
        // charged for devices of its own.
        let holder = p
            .shares_claim_of
            .and_then(|back| i.checked_sub(back))
            .and_then(|h| Some((h, kept[h]?)))
            .filter(|(_, (at, node))| node.is_some() && !pods[*at].requests.gpus.is_empty());
        let queue = holder.map_or(p.queue, |(h, _)| w.pods[h].queue);
        let key = format!("{}/p{i}", queue_name(queue));
        let holder = holder.map(|(_, kept)| kept);
        let node = holder.map_or(p.node, |(_, node)| node);
        let mut pod = match node {
            Some(n) => running(&key, p.gpus, &format!("n{n}"), p.time),
            None => pending(&key, p.gpus, p.time),
        };
        pod.priority = p.priority;
        if holder.is_some() {
            pod.requests.gpus.clear();
        } else if p.quota_only > 0 {
            pod.requests.quota_only = vec![GpuRequest::devices(GPU, p.quota_only)];
        }
        if let Some(n) = node
            && !fits(&trial, &pod, n, &queue_name(queue))
        {
            continue;
        }
        trial.add_pod(pod.clone()).unwrap();
        if let Some((at, _)) = holder {
            pods[at].claim_sharers.push(pod.key.clone());
        }
        kept[i] = Some((pods.len(), node));
        pods.push(pod);
    }
    build_snapshot(queues, nodes, pods)
}

/// Whether `pod` may run on node `n{n}`: its devices are free there, and what it charges (its
/// quota-only devices included) stays within its queue's ceiling.
fn fits(snapshot: &Snapshot, pod: &Pod, n: usize, queue: &str) -> bool {
    let node = snapshot.node_id(&format!("n{n}")).unwrap();
    let devices: u32 = pod.requests.gpus.iter().map(|g| g.count).sum();
    let within_ceiling = snapshot.queue_id(queue).is_none_or(|q| {
        let u = &snapshot.usage(q)[0];
        u.allocated + charged(pod) <= u.ceiling()
    });
    snapshot.node_view(node).fully_free_devices() >= devices as usize && within_ceiling
}

/// Every device's free milli plus what the pods seated on it hold is exactly one device.
fn devices_add_up(snapshot: &Snapshot) -> Result<(), String> {
    for n in snapshot.node_ids() {
        let free = snapshot.node_view(n).gpu_free().to_vec();
        let mut held = vec![0u32; free.len()];
        for pod in snapshot.pods_on(n) {
            let p = snapshot.pod(pod).unwrap();
            for set in snapshot.pod_devices(pod) {
                let per = p
                    .requests
                    .gpus
                    .iter()
                    .find(|g| g.resource == set.resource)
                    .unwrap()
                    .milli_per_device;
                for d in set.devices {
                    held[usize::from(d)] += per;
                }
            }
        }
        for (d, (f, h)) in free.iter().zip(&held).enumerate() {
            if u32::from(*f) + h != MILLI_PER_DEVICE {
                return Err(format!(
                    "node {n:?} device {d}: free {f} + held {h} != 1000"
                ));
            }
        }
    }
    Ok(())
}

/// What `pod` charges its queue: its devices and its quota-only ones.
fn charged(pod: &Pod) -> Milli {
    pod.requests
        .gpus
        .iter()
        .chain(&pod.requests.quota_only)
        .map(GpuRequest::total)
        .sum()
}

/// The ledger equals the sum over pods.
fn ledger_adds_up(snapshot: &Snapshot) -> Result<(), String> {
    for q in snapshot.queue_ids() {
        let (mut allocated, mut pending_sum) = (Milli::ZERO, Milli::ZERO);
        for pod in snapshot
            .pod_ids()
            .filter(|p| snapshot.pod_queue(*p) == Some(q))
        {
            let p = snapshot.pod(pod).unwrap();
            let amount = charged(p);
            if p.is_admitted() {
                allocated += amount;
            } else {
                pending_sum += amount;
            }
        }
        let u = snapshot
            .usage(q)
            .first()
            .map_or((Milli::ZERO, Milli::ZERO), |u| (u.allocated, u.pending));
        if u != (allocated, pending_sum) {
            return Err(format!(
                "queue {q:?}: ledger {u:?} != pods ({allocated}, {pending_sum})"
            ));
        }
    }
    Ok(())
}

fn pending_ids(snapshot: &Snapshot) -> Vec<PodId> {
    snapshot.pending_pods().collect()
}

/// A victim's removal leaves its queue at or above its guarantee, or below it by less than one
/// of its victims (the pod that straddled the line: see the ledger's rule).
fn victim_queues_keep_guarantees(
    snapshot: &Snapshot,
    queues: &[QueueId],
    victims: &[gpuqueue_core::reclaim::Victim],
) -> Result<(), String> {
    for q in queues {
        let name = &snapshot.queue(*q).name;
        let largest = victims
            .iter()
            .filter(|v| &v.queue == name)
            .flat_map(|v| v.frees.iter().map(|(_, m)| *m))
            .max()
            .unwrap_or(Milli::ZERO);
        for u in snapshot.usage(*q) {
            if u.allocated < u.guaranteed && u.allocated + largest <= u.guaranteed {
                // A queue may start below its guarantee; it must not be a victim then.
                return Err(format!(
                    "queue {q:?} is a whole victim below its guarantee after the victims left: {u:?}"
                ));
            }
        }
    }
    Ok(())
}

/// Whether the owner fits on the node (only that node considered).
fn owner_fits(snapshot: &Snapshot, owner: &Pod, node: NodeId) -> bool {
    Policy::new(&BestFit, TieBreak::First)
        .find_placement_where(snapshot, owner, &|n| n == node)
        .is_some()
}

proptest! {
    // Reclaims, and among them those that take a claim's sharers, are a small share of the
    // worlds: 1,000 cases give a few dozen of the latter, in about two seconds.
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn no_device_is_counted_twice_and_ledgers_add_up(w in world(4, true, true)) {
        let mut snapshot = build(&w);
        prop_assert_eq!(devices_add_up(&snapshot), Ok(()));
        prop_assert_eq!(ledger_adds_up(&snapshot), Ok(()));
        let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(1000));
        prop_assert_eq!(devices_add_up(&snapshot), Ok(()));
        prop_assert_eq!(ledger_adds_up(&snapshot), Ok(()));
        // Victims leave: what they held is free again, and owners are seated.
        for d in &decisions {
            if let Decision::Reclaim(plan) = d {
                for v in &plan.victims {
                    snapshot.remove_pod(v.pod).unwrap();
                }
            }
        }
        prop_assert_eq!(devices_add_up(&snapshot), Ok(()));
        prop_assert_eq!(ledger_adds_up(&snapshot), Ok(()));
        for n in snapshot.node_ids() {
            prop_assert!(!snapshot.is_oversubscribed(n), "victims gone, every owner is seated");
        }
    }

    #[test]
    fn nobody_exceeds_guaranteed_plus_burstable_nor_capacity(w in world(4, true, true)) {
        let mut snapshot = build(&w);
        let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(1000));
        for q in snapshot.queue_ids() {
            for u in snapshot.usage(q) {
                prop_assert!(u.allocated <= u.ceiling(), "queue {:?}: {:?}", q, u);
            }
        }
        // Counting a reclaim's victims as gone, what admitted pods hold on devices never
        // exceeds the devices (quota-only charges hold none).
        let gpu = snapshot.resource_id(&"nvidia.com/gpu".into()).unwrap();
        let leaving: Vec<PodId> = decisions
            .iter()
            .filter_map(|d| if let Decision::Reclaim(p) = d { Some(p) } else { None })
            .flat_map(|p| p.victims.iter().map(|v| v.pod))
            .collect();
        let held: Milli = snapshot
            .pod_ids()
            .filter(|p| !leaving.contains(p))
            .filter_map(|p| snapshot.pod(p))
            .filter(|p| p.is_admitted())
            .flat_map(|p| &p.requests.gpus)
            .map(GpuRequest::total)
            .sum();
        prop_assert!(held <= snapshot.capacity(gpu), "{} held of {}", held, snapshot.capacity(gpu));
    }

    #[test]
    fn reclaim_plans_are_safe_and_minimal(w in world(4, true, true)) {
        let mut snapshot = build(&w);
        for owner in pending_ids(&snapshot) {
            let Ok(plan) = plan_reclaim(&snapshot, owner, at(1000)) else { continue };
            let owner_pod = snapshot.pod(owner).unwrap().clone();
            prop_assert!(!plan.victims.is_empty());
            prop_assert!(!owner_fits(&snapshot, &owner_pod, plan.node), "a plan only when there is no room");
            let ids: Vec<PodId> = plan.victims.iter().map(|v| v.pod).collect();
            // A claim is freed whole: every pod sharing a victim's claim goes with it.
            let sharers: Vec<PodId> = ids
                .iter()
                .flat_map(|v| snapshot.pod(*v).unwrap().claim_sharers.iter())
                .map(|key| snapshot.pod_id(key).unwrap())
                .collect();
            for sharer in &sharers {
                prop_assert!(ids.contains(sharer), "{:?} shares a victim's claim but stays", sharer);
            }
            // The victims chosen for their room (not only for sharing a claim): borrowers of
            // other queues.
            let chosen: Vec<PodId> = ids.iter().copied().filter(|v| !sharers.contains(v)).collect();
            let victim_queues: Vec<QueueId> = plan.victims.iter().map(|v| snapshot.queue_id(&v.queue).unwrap()).collect();
            for (v, q) in plan.victims.iter().zip(&victim_queues) {
                prop_assert!(sharers.contains(&v.pod) || snapshot.borrowers(*q).contains(&v.pod), "{} is not a borrower", v.key);
                prop_assert_ne!(Some(*q), snapshot.pod_queue(owner));
            }
            let removal = snapshot.simulate_removal(&ids);
            prop_assert!(owner_fits(&snapshot, &owner_pod, plan.node), "the owner fits once the victims are gone");
            prop_assert_eq!(victim_queues_keep_guarantees(&snapshot, &victim_queues, &plan.victims), Ok(()));
            snapshot.restore(removal).unwrap();
            // Minimal: keeping any one chosen victim breaks the fit.
            for keep in &chosen {
                let others: Vec<PodId> = ids.iter().copied().filter(|p| p != keep).collect();
                let removal = snapshot.simulate_removal(&others);
                let fits = owner_fits(&snapshot, &owner_pod, plan.node);
                snapshot.restore(removal).unwrap();
                prop_assert!(!fits, "victim {:?} is not needed", keep);
            }
            // Fewest: no smaller set of the node's borrowers makes room.
            let owner_queue = snapshot.pod_queue(owner);
            let borrowers: Vec<PodId> = snapshot
                .queue_ids()
                .filter(|q| Some(*q) != owner_queue)
                .flat_map(|q| snapshot.borrowers(q))
                .filter(|p| snapshot.pod_node(*p) == Some(plan.node))
                .collect();
            for mask in 0u32..(1 << borrowers.len()) {
                if mask.count_ones() as usize >= chosen.len() {
                    continue;
                }
                let set: Vec<PodId> = (0..borrowers.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| borrowers[i])
                    .collect();
                let removal = snapshot.simulate_removal(&set);
                let fits = owner_fits(&snapshot, &owner_pod, plan.node);
                snapshot.restore(removal).unwrap();
                prop_assert!(!fits, "{:?} is a smaller set than the plan's {:?}", set, ids);
            }
        }
    }

    #[test]
    fn decisions_are_deterministic_whatever_the_input_order(w in world(4, true, true), seed in any::<u64>()) {
        let base = build(&w);
        let pods: Vec<Pod> = base.pod_ids().map(|p| base.pod(p).unwrap().clone()).collect();
        let mut shuffled = pods.clone();
        for i in (1..shuffled.len()).rev() {
            let j = usize::try_from(mix64(seed ^ i as u64) % (i as u64 + 1)).unwrap();
            shuffled.swap(i, j);
        }
        let decide_all = |pods: Vec<Pod>| {
            let (mut s, issues) =
                Snapshot::builder().queues(queues_of(&base)).nodes(nodes_of(&base)).pods(pods).build();
            assert!(issues.is_empty(), "{issues:?}");
            describe(&admission_cycle(&mut s, &Policy::default(), at(1000)))
        };
        let first = decide_all(pods);
        prop_assert_eq!(&first, &decide_all(shuffled));
    }

    #[test]
    fn a_snapshot_behind_the_cluster_decides_alike_up_to_the_first_reclaim_which_waits(w in world(4, true, true)) {
        let current = describe(&admission_cycle(&mut build(&w), &Policy::default(), at(1000)));
        let mut behind = build(&w);
        behind.set_behind(true);
        let decisions = admission_cycle(&mut behind, &Policy::default(), at(1000));
        prop_assert!(enforce(&behind, &decisions).is_empty(), "enforcement on a stale view");
        let behind = describe(&decisions);
        let first_reclaim = current.iter().position(|d| d.starts_with("reclaim "));
        let alike = first_reclaim.unwrap_or(current.len());
        prop_assert_eq!(&behind[..alike], &current[..alike]);
        if let Some(i) = first_reclaim {
            prop_assert!(behind[i].ends_with("no borrower is disrupted on a view that may be stale"), "{}", behind[i]);
        }
        prop_assert!(!behind.iter().any(|d| d.starts_with("reclaim ")), "{behind:?}");
    }

    #[test]
    fn queues_with_demand_get_their_guarantee_after_handovers(w in world(1, false, false)) {
        // Single-GPU pods, no unmanaged pods, guarantees that fit the cluster: every queue
        // with demand must reach min(guarantee, demand) once the reclaims are carried out.
        let mut w = w;
        let mut left: u64 = w.nodes.iter().map(|n| u64::from(*n)).sum();
        for (g, _, _) in &mut w.queues {
            *g = (*g).min(left);
            left -= *g;
        }
        let mut snapshot = build(&w);
        // A node takes one reclaim at a time (its owner waits there for the victims), so
        // several owners on one node need several rounds.
        for round in 0..100 {
            let decisions = admission_cycle(&mut snapshot, &Policy::default(), at(1000 + round));
            let mut progressed = false;
            for d in &decisions {
                if let Decision::Reclaim(plan) = d {
                    progressed = true;
                    for v in &plan.victims {
                        snapshot.remove_pod(v.pod).unwrap();
                    }
                }
            }
            if !progressed {
                break;
            }
        }
        for q in snapshot.queue_ids() {
            let u = &snapshot.usage(q)[0];
            let demand = u.allocated + u.pending;
            prop_assert!(
                u.allocated >= u.guaranteed.min(demand),
                "queue {:?} holds {} of guarantee {} with demand {}", q, u.allocated, u.guaranteed, demand
            );
        }
    }
}

/// One step of a simulator-style run: place a task, or remove the `n`-th placed one.
#[derive(Clone, Debug)]
enum Step {
    Place {
        milli: u32,
        count: u32,
        model: Option<usize>,
    },
    Remove(usize),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let place = (
        prop_oneof![100u32..1000, Just(1000u32)],
        1u32..=4,
        prop::option::of(0usize..2),
    )
        .prop_map(|(milli, count, model)| Step::Place {
            milli,
            count: if milli < 1000 { 1 } else { count },
            model,
        });
    prop::collection::vec(
        prop_oneof![3 => place, 1 => (0usize..64).prop_map(Step::Remove)],
        1..60,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    #[test]
    fn shared_gpu_placements_keep_devices_and_fragmentation_consistent(steps in steps(), seed in any::<u64>()) {
        use gpuqueue_core::fragmentation::{TaskShape, WorkloadMix};
        use gpuqueue_core::model::{GpuRequest, PodKey, Requests};
        use gpuqueue_core::placement::Fgd;
        let models = ["A", "B"];
        let mix = WorkloadMix::new(vec![
            (TaskShape { cpu_milli: 2000, gpu: Some(GpuRequest::shared("nvidia.com/gpu", 500)), gpu_models: vec![] }, 0.5),
            (TaskShape { cpu_milli: 8000, gpu: Some(GpuRequest::devices("nvidia.com/gpu", 1)), gpu_models: vec!["A".into()] }, 0.3),
            (TaskShape { cpu_milli: 1000, gpu: None, gpu_models: vec![] }, 0.2),
        ]);
        let nodes = (0..6).map(|i| node(&format!("n{i}"), [1, 2, 4, 8][i % 4]).gpu_model(models[i % 2]).cpu_milli(32_000));
        let (mut snapshot, _) = Snapshot::builder().nodes(nodes).workload_mix(mix.clone()).build();
        let mut placed: Vec<PodId> = Vec::new();
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                Step::Place { milli, count, model } => {
                    let mut pod = Pod::new(
                        PodKey::new("sim", format!("t{i}")),
                        Requests { quota_only: Vec::new(), cpu_milli: 1000, memory_bytes: 0, gpus: vec![GpuRequest { milli_per_device: milli, ..GpuRequest::devices("nvidia.com/gpu", count) }] },
                        at(0),
                    );
                    pod.gpu_models = model.map(|m| vec![models[m].to_string()]).unwrap_or_default();
                    if let Some(p) = Policy::new(&Fgd, TieBreak::Seeded(seed ^ i as u64)).find_placement(&snapshot, &pod) {
                        placed.push(snapshot.add_placed(pod, &p).unwrap());
                    }
                }
                Step::Remove(n) if !placed.is_empty() => {
                    let id = placed.remove(n % placed.len());
                    snapshot.remove_pod(id).unwrap();
                }
                Step::Remove(_) => {}
            }
            prop_assert_eq!(devices_add_up(&snapshot), Ok(()));
        }
        let mut fresh = snapshot.clone();
        fresh.set_workload_mix(mix);
        for n in snapshot.node_ids() {
            let (cached, recomputed) = (snapshot.node_fragmentation(n), fresh.node_fragmentation(n));
            prop_assert!((cached - recomputed).abs() < 1e-6, "node {:?}: cached {} != {}", n, cached, recomputed);
        }
    }
}

fn queues_of(s: &Snapshot) -> Vec<gpuqueue_core::model::Queue> {
    s.queue_ids().map(|q| s.queue(q).clone()).collect()
}

fn nodes_of(s: &Snapshot) -> Vec<gpuqueue_core::model::Node> {
    s.node_ids().map(|n| s.node(n).clone()).collect()
}
