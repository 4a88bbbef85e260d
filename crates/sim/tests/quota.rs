#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
#![allow(clippy::cast_precision_loss)] // small GPU counts
//! The quota study on the quickstart scenario (fixed shapes, no trace needed): deterministic,
//! every pod accounted for, and each policy keeps its own rules.

use std::path::Path;

use std::time::Duration;

use gpuqueue_api::v1alpha1::CheckpointDriver;
use gpuqueue_core::Snapshot;
use gpuqueue_core::model::{
    Assignment, CheckpointSettings, GpuRequest, Namespace, Node, Pod, PodKey, PodState, Queue,
    ReclaimSettings, Requests, ResourceQuota,
};
use gpuqueue_core::reclaim::plan_reclaim;
use gpuqueue_sim::convert;
use gpuqueue_sim::engine::SimTime;
use gpuqueue_sim::quota::{self, OverlayError, QuotaInput, QuotaPolicy, QuotaRun};
use gpuqueue_sim::quota_metrics::OverBudgetCause;
use gpuqueue_sim::scenario::{HandoverModel, Latency, Scenario};
use gpuqueue_sim::workload::{Job, JobKind, Shape, Workload};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn input(seed: u64) -> QuotaInput {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sim/quickstart.yaml");
    let loaded = Scenario::load(&path, None).unwrap();
    let workload = Workload::generate(&loaded, seed).unwrap();
    QuotaInput::new(&loaded, &workload, seed)
}

/// Everything a run reports, as text, to compare runs exactly.
fn fingerprint(run: &QuotaRun) -> String {
    format!(
        "{:?} {:?} {} {:?} {:?}",
        run.summary, run.counts, run.events, run.metrics.tenants, run.metrics.samples
    )
}

#[test]
fn same_seed_same_run_other_seed_other_run() {
    let (a, b, c) = (input(7), input(7), input(8));
    for policy in QuotaPolicy::ALL {
        let first = fingerprint(&quota::run(&a, policy));
        assert_eq!(first, fingerprint(&quota::run(&b, policy)), "{policy}");
        assert_ne!(first, fingerprint(&quota::run(&c, policy)), "{policy}");
    }
}

#[test]
fn every_pod_ends_in_exactly_one_place() {
    let input = input(11);
    for run in quota::run_policies(&input, &QuotaPolicy::ALL) {
        let c = &run.counts;
        assert!(c.balanced(), "{}: {c:?}", run.policy);
        assert!(
            c.created >= input.jobs.len() as u64 - c.withdrawn,
            "{}: {c:?}",
            run.policy
        );
        if run.policy != QuotaPolicy::Borrow {
            assert_eq!(
                c.evicted, 0,
                "{}: only borrow-and-reclaim evicts",
                run.policy
            );
            assert_eq!(
                c.created,
                input.jobs.len() as u64 - not_created(&input),
                "{}: nothing is recreated",
                run.policy
            );
        }
    }
}

/// Online replicas removed in the same instant they were to be created never exist.
fn not_created(input: &QuotaInput) -> u64 {
    input
        .jobs
        .iter()
        .filter(|j| j.removed_at.is_some_and(|r| r <= j.arrival))
        .count() as u64
}

#[test]
fn each_policy_keeps_its_rules() {
    let input = input(3);
    let runs = quota::run_policies(&input, &QuotaPolicy::ALL);
    let [none, fixed, borrow] = [&runs[0], &runs[1], &runs[2]];
    let guaranteed: Vec<f64> = input
        .queues
        .iter()
        .map(|q| q.quota_of(&convert::gpu_resource()).unwrap().guaranteed.0 as f64 / 1000.0)
        .collect();
    for sample in &fixed.metrics.samples {
        for (held, cap) in sample.held_gpus.iter().zip(&guaranteed) {
            assert!(
                held <= cap,
                "static quotas: a tenant holds {held} GPUs over its {cap} at {}h",
                sample.hours
            );
        }
    }
    assert!(
        fixed
            .metrics
            .samples
            .iter()
            .all(|s| s.utilisation_percent <= 100.0)
    );
    assert_eq!((none.metrics.reclaims, fixed.metrics.reclaims), (0, 0));
    assert!(
        borrow.metrics.reclaims > 0,
        "the batch tenant borrows at night and is reclaimed from by day"
    );
    assert!(borrow.summary.utilisation_percent > fixed.summary.utilisation_percent);
    assert_eq!(
        borrow.metrics.handovers.len() as u64,
        borrow.metrics.reclaims,
        "every reclaim hands over"
    );
    assert!(
        borrow
            .metrics
            .handovers
            .iter()
            .all(|h| *h > 0.0 && *h < 10.0),
        "{:?}",
        borrow.metrics.handovers
    );
    for run in &runs {
        for (t, tenant) in run.metrics.tenants.iter().enumerate() {
            assert_eq!(
                tenant.over_budget_causes.values().sum::<u64>(),
                tenant.owner_over_budget,
                "{}: tenant {t}'s over-budget owners each have one cause",
                run.policy
            );
        }
        if run.policy != QuotaPolicy::Borrow {
            assert!(
                !run.metrics
                    .over_budget_causes()
                    .keys()
                    .any(|c| matches!(c, OverBudgetCause::Handover { .. })),
                "{}: no reclaim, so no handover overruns",
                run.policy
            );
        }
    }
    let serving = &borrow.metrics.tenants[0];
    assert_eq!(
        serving.evictions, 0,
        "the owner tenant never borrows past its burst here, so it is not evicted"
    );
    assert!(borrow.metrics.tenants[1].evictions > 0);
}

#[test]
fn live_queues_replace_the_scenario_quotas_by_name() {
    let input = input(5);
    let nodes = vec![
        Node::new("live-0")
            .cpu_milli(128_000)
            .gpus(convert::gpu_resource(), 8)
            .gpus("nvidia.com/mig-1g.10gb", 7),
        Node::new("mig-only").gpus("nvidia.com/mig-1g.10gb", 7),
    ];
    let queue = |name: &str, guaranteed| {
        Queue::new(name).quota(ResourceQuota::devices(
            convert::gpu_resource(),
            guaranteed,
            0,
        ))
    };
    let live = input
        .with_cluster(
            nodes.clone(),
            vec![queue("serving", 6), queue("batch", 2), queue("idle", 0)],
        )
        .unwrap();
    assert_eq!(live.nodes.len(), 1, "a node without whole GPUs is left out");
    assert_eq!(
        live.capacity_milli(),
        8000,
        "MIG slices are another resource's capacity"
    );
    assert_eq!(
        live.queues.len(),
        3,
        "a queue without load is kept: it lends"
    );
    assert!(
        live.queues[0].claims("serving", &std::collections::BTreeMap::new()),
        "the simulated pods stay attributed"
    );
    let run = quota::run(&live, QuotaPolicy::Borrow);
    assert!(run.counts.balanced());
    assert!(
        run.metrics
            .samples
            .iter()
            .all(|s| s.held_gpus.iter().sum::<f64>() <= 8.0)
    );
    assert_eq!(
        input
            .with_cluster(nodes.clone(), vec![queue("serving", 6)])
            .unwrap_err(),
        OverlayError::MissingQueue("batch".into())
    );
    assert_eq!(
        input
            .with_cluster(vec![Node::new("cpu")], vec![])
            .unwrap_err(),
        OverlayError::NoGpus
    );
    let proposed = input.with_queues(vec![queue("batch", 16)]);
    assert_eq!(
        proposed.queues[1]
            .quota_of(&convert::gpu_resource())
            .unwrap()
            .guaranteed
            .0,
        16_000
    );
    assert_eq!(proposed.queues[0], input.queues[0]);
}

#[test]
fn handover_timeline_respects_its_steps() {
    let input = input(9);
    let run = quota::run(&input, QuotaPolicy::Borrow);
    let budget = input.queues[0].reclaim.budget.as_secs_f64();
    let within: usize = run
        .metrics
        .handovers
        .iter()
        .filter(|h| **h <= budget)
        .count();
    // Checkpoint median 1.2 s cut where the plan's reserve for termination begins, exit ≤ 1 s,
    // relist ≤ 1 s: most handovers fit 3 s; any tail shows in the report, not hidden.
    assert!(
        within * 2 > run.metrics.handovers.len(),
        "{within} of {}",
        run.metrics.handovers.len()
    );
}

#[test]
fn victims_on_one_node_share_its_kubelet_relist() {
    // Two 1-GPU borrowers fill a 2-GPU node; a 2-GPU owner evicts both. With instant API calls
    // and no checkpoint, each victim is killed at the node's first relist after its eviction and
    // gone at the first relist after its exit: the two differ by whole relist periods, never by
    // a fraction of one.
    let gpu = convert::gpu_resource();
    let pod = |ns: &str, name: &str, gpus| {
        Pod::new(
            PodKey::new(ns, name),
            Requests {
                cpu_milli: 1000,
                memory_bytes: 0,
                gpus: vec![GpuRequest::devices(gpu.clone(), gpus)],
                quota_only: Vec::new(),
            },
            jiff::Timestamp::UNIX_EPOCH,
        )
    };
    let running = |name: &str| {
        let mut p = pod("batch", name, 1);
        p.state = PodState::Admitted(Assignment {
            node: Some("n1".into()),
            bound: true,
            terminating: false,
        });
        p
    };
    let (mut snapshot, issues) = Snapshot::builder()
        .queues([
            Queue::new("owner")
                .namespace("owner")
                .quota(ResourceQuota::devices(gpu.clone(), 2, 0)),
            Queue::new("batch")
                .namespace("batch")
                .quota(ResourceQuota::devices(gpu.clone(), 0, 2)),
        ])
        .namespaces([Namespace::new("owner"), Namespace::new("batch")])
        .nodes([Node::new("n1").cpu_milli(8000).gpus(gpu.clone(), 2)])
        .pods([running("b1"), running("b2")])
        .build();
    assert!(issues.is_empty(), "{issues:?}");
    let owner = snapshot.add_pod(pod("owner", "o", 2)).unwrap();
    let plan = plan_reclaim(
        &snapshot,
        owner,
        jiff::Timestamp::from_second(3600).unwrap(),
    )
    .unwrap();
    assert_eq!(plan.victims.len(), 2);
    let instant = Latency {
        median: Duration::ZERO.into(),
        p99: Duration::ZERO.into(),
    };
    let model = HandoverModel {
        api: instant,
        checkpoint: instant,
        checkpoint_failure: 0.0,
        ..HandoverModel::default()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for _ in 0..200 {
        let handover = quota::sample_handover(&plan, &model, &mut rng);
        let (a, b) = (
            handover.victims[0].gone.as_secs_f64(),
            handover.victims[1].gone.as_secs_f64(),
        );
        let apart = (a - b).abs();
        assert!(
            (apart - apart.round()).abs() < 1e-6,
            "gone at {a} and {b}: not on the same relist ticks"
        );
        // What the operator observes and the planner learns from: the wait for the relist that
        // starts the kill (at most 1 s), the exit within the 1 s grace, and the wait for the
        // relist after it: never less than one relist, at most three.
        for v in &handover.victims {
            assert!(v.termination() >= Duration::from_secs(1), "{v:?}");
            assert!(v.termination() <= Duration::from_secs(3), "{v:?}");
        }
    }
}

/// One 2-GPU node. `batch` (guarantee 1) runs two pods, borrowing one; an owner of `online`
/// (guarantee 1) arrives at 10 s, and a reclaim takes the newer batch pod, whose 1.2 s
/// checkpoint starts at once. The older batch pod's work ends at `older_ends_after` of run.
fn spare_input(older_ends_after: Duration) -> QuotaInput {
    let jobs = vec![
        (1, JobKind::Batch, 0.0, Some(older_ends_after), 1),
        (1, JobKind::Batch, 1.0, Some(Duration::from_hours(1)), 1),
        (0, JobKind::Online, 10.0, None, 1),
    ];
    two_gpu_world([1, 1], [0, 1], &jobs)
}

/// One 2-GPU node with queues `online` and `batch` (their `guaranteed` and `burstable` GPUs),
/// running `jobs` (tenant, kind, arrival in seconds, work, GPUs), with fixed latencies: API
/// calls 20 ms, checkpoints 1.2 s, victims' exit 0.3 s, the kubelet's relist every second.
fn two_gpu_world(
    guaranteed: [u64; 2],
    burstable: [u64; 2],
    jobs: &[(usize, JobKind, f64, Option<Duration>, u32)],
) -> QuotaInput {
    let gpu = convert::gpu_resource();
    let fixed = |ms| Latency {
        median: Duration::from_millis(ms).into(),
        p99: Duration::from_millis(ms).into(),
    };
    let queue = |name: &str, tenant: usize| {
        Queue::new(name)
            .namespace(name)
            .quota(ResourceQuota::devices(
                gpu.clone(),
                guaranteed[tenant],
                burstable[tenant],
            ))
            .reclaim(ReclaimSettings {
                budget: Duration::from_secs(3),
                checkpoint: CheckpointSettings {
                    driver: CheckpointDriver::Vllm,
                    port: Some(8000),
                    timeout: Duration::from_millis(1500),
                    ..CheckpointSettings::default()
                },
                victim_grace: Duration::from_secs(1),
                min_borrow: None,
            })
    };
    let jobs: Vec<Job> = jobs
        .iter()
        .enumerate()
        .map(|(id, &(tenant, kind, arrival, work, gpus))| Job {
            id,
            tenant,
            kind,
            arrival: SimTime::from_secs_f64(arrival),
            shape: Shape {
                gpus,
                gpu_milli: 1000 * gpus,
                cpu_milli: 1000,
                gpu_models: Vec::new(),
            },
            work,
            removed_at: None,
        })
        .collect();
    QuotaInput {
        name: "two-gpus".into(),
        nodes: vec![Node::new("n1").cpu_milli(64_000).gpus(gpu.clone(), 2)],
        queues: vec![queue("online", 0), queue("batch", 1)],
        priorities: vec![0, 0],
        mix: convert::shape_mix(jobs.iter().map(|j| &j.shape)),
        jobs,
        handover: HandoverModel {
            api: fixed(20),
            checkpoint: fixed(1200),
            checkpoint_failure: 0.0,
            victim_exit: fixed(300),
            kubelet_relist: Duration::from_secs(1).into(),
        },
        seed: 1,
        end: SimTime::from_secs_f64(60.0),
        warmup: SimTime::ZERO,
        sample_every: Duration::from_secs(1),
    }
}

/// Review finding: a victim whose work ended during its handover's checkpoint was evicted
/// anyway, counted with GPU-hours past its end, and recreated to run again.
#[test]
fn a_victim_whose_work_ends_during_its_handover_completes() {
    // The newer batch pod is the victim; its work ends half a second into the checkpoint.
    let jobs = [
        (1, JobKind::Batch, 0.0, Some(Duration::from_hours(1)), 1),
        (
            1,
            JobKind::Batch,
            1.0,
            Some(Duration::from_millis(9_500)),
            1,
        ),
        (0, JobKind::Online, 10.0, None, 1),
    ];
    let run = quota::run(&two_gpu_world([1, 1], [0, 1], &jobs), QuotaPolicy::Borrow);
    let c = &run.counts;
    assert!(c.balanced(), "{c:?}");
    assert_eq!(run.metrics.reclaims, 1);
    assert_eq!((c.created, c.evicted, c.completed), (3, 0, 1), "{c:?}");
    assert_eq!(
        c.running_at_end, 2,
        "the older batch pod and the owner: {c:?}"
    );
    assert!(run.metrics.tenants[1].evicted_gpu_hours.abs() < f64::EPSILON);
}

/// Review finding: a pod refused for its queue's borrowing cool-down waited for an unrelated
/// change, where the operator wakes when the cool-down ends.
#[test]
fn a_borrower_is_decided_again_when_its_cool_down_ends() {
    // The owner (a job of `online`, 20 s of work) reclaims the borrowed GPU at 10 s; the
    // evicted batch pod is recreated at once and refused until 10 s + 120 s. The owner's GPU
    // is idle from about 32.6 s, and nothing changes after that.
    let jobs = [
        (1, JobKind::Batch, 0.0, Some(Duration::from_hours(1)), 1),
        (1, JobKind::Batch, 1.0, Some(Duration::from_hours(1)), 1),
        (0, JobKind::Batch, 10.0, Some(Duration::from_secs(20)), 1),
    ];
    let mut input = two_gpu_world([1, 1], [0, 1], &jobs);
    // Half a microsecond past the 2 minutes (review finding: the simulator counts whole
    // microseconds, and a wake rounded down found the cool-down running, again and again).
    input.queues[1].reclaim.min_borrow = Some(Duration::from_nanos(120_000_000_500));
    input.end = SimTime::from_secs_f64(600.0);
    let run = quota::run(&input, QuotaPolicy::Borrow);
    let c = &run.counts;
    assert!(c.balanced(), "{c:?}");
    assert_eq!((c.evicted, c.waiting_at_end), (1, 0), "{c:?}");
    let waits = &run.metrics.tenants[1].waits;
    let refused = waits.iter().copied().fold(0.0, f64::max);
    assert!(
        (115.0..120.0).contains(&refused),
        "bound when the cool-down ends, about 117 s after its recreation: {waits:?}"
    );
}

#[test]
fn a_burst_owner_that_counts_on_another_handovers_victim_binds_once_it_is_gone() {
    // `batch` borrows the whole node with one 2-GPU pod; two owners of `online` (guarantee 2)
    // arrive together. One handover evicts that pod; the other owner needs no victim of its
    // own, but its room is that same pod's: neither binds before the pod is gone.
    let jobs = [
        (1, JobKind::Batch, 0.0, Some(Duration::from_hours(1)), 2),
        (0, JobKind::Online, 10.0, None, 1),
        (0, JobKind::Online, 10.0, None, 1),
    ];
    let run = quota::run(&two_gpu_world([2, 0], [0, 2], &jobs), QuotaPolicy::Borrow);
    let c = &run.counts;
    assert!(c.balanced(), "{c:?}");
    assert_eq!(run.metrics.reclaims, 2, "one handover per owner");
    assert_eq!(c.evicted, 1);
    let waits = &run.metrics.tenants[0].waits;
    assert_eq!(waits.len(), 2);
    // The victim's 1.2 s checkpoint and its termination come before either bind.
    assert!(waits.iter().all(|w| *w > 1.5), "{waits:?}");
}

#[test]
fn a_victim_whose_queue_shrank_during_its_checkpoint_is_spared_and_its_owner_requeued() {
    // The older batch pod ends half a second into the checkpoint: evicting the victim would
    // leave `batch` below its guarantee. As the operator does, the simulator spares it, and the
    // owner is deleted, recreated and admitted into the GPU the ended pod left.
    let run = quota::run(
        &spare_input(Duration::from_millis(10_500)),
        QuotaPolicy::Borrow,
    );
    let c = &run.counts;
    assert!(c.balanced(), "{c:?}");
    assert_eq!(run.metrics.reclaims, 1);
    assert_eq!(run.metrics.spared_victims, 1);
    assert_eq!((c.evicted, c.requeued, c.completed), (0, 1, 1), "{c:?}");
    assert_eq!(
        c.running_at_end, 2,
        "the spared victim and the owner: {c:?}"
    );
    assert!(
        run.metrics.handovers.is_empty(),
        "the reclaim freed no room, so it handed nothing over"
    );
    let online = &run.metrics.tenants[0];
    assert_eq!(
        online.owner_requests, 1,
        "the requeued owner is one request"
    );
    // Requeued once its victim's eviction is answered (spared), as the operator does: it
    // waits the checkpoint and a few API calls, not a victim's termination and the kubelet's
    // relist besides (2.46 s when the simulator requeued it at its planned bind).
    assert_eq!(online.waits.len(), 1);
    assert!(online.waits[0] < 1.4, "{:?}", online.waits);
    assert!(
        online
            .over_budget_causes
            .keys()
            .all(|c| matches!(c, OverBudgetCause::Requeued { multi_gpu: false })),
        "{:?}",
        online.over_budget_causes
    );

    // The same world where the older pod runs on: the victim still lies above the guarantee
    // and goes.
    let run = quota::run(&spare_input(Duration::from_hours(1)), QuotaPolicy::Borrow);
    let c = &run.counts;
    assert!(c.balanced(), "{c:?}");
    assert_eq!(run.metrics.spared_victims, 0);
    assert_eq!((c.evicted, c.requeued), (1, 0), "{c:?}");
    assert_eq!(run.metrics.handovers.len(), 1);
}
