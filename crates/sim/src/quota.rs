//! The quota study: one scenario's arrivals, run under three policies, with the operator's
//! admission and reclaim decisions made by the core.
//!
//! The simulator plays the world around the operator: pods are created and removed, admitted
//! pods are bound by kube-scheduler after an API round trip, batch jobs finish, and a reclaim
//! takes the time its steps take (perf-anchors §4): intent annotations, a checkpoint cut at
//! its deadline, the eviction call, the kubelet starting the kill at its next PLEG relist, the
//! victim's exit within its grace period, the kubelet noticing it at a later relist and
//! writing the pod's terminal phase, then the owner's binding. Every one of those delays is
//! drawn per step from the scenario's latency model. Each victim's
//! termination (eviction accepted to gone) is recorded into the snapshot's
//! [`gpuqueue_core::termination::Terminations`] when it is gone, as the operator records it,
//! so later plans on that node keep back what termination takes there.
//!
//! The policies, all placing with the operator's [`Policy::default`] (`FragmentationAware`,
//! ties to the first node):
//! - **no isolation**: one queue claims every tenant's namespace with the whole cluster as its
//!   guarantee: first come, first served by priority then age, no quotas, no reclaim;
//! - **static quotas**: each tenant's queue with `burstable: 0`: nobody exceeds its guarantee;
//! - **borrow-and-reclaim**: the queues as written: idle guaranteed capacity is lent, and
//!   taken back for owners through reclaim.
//!
//! Evicted pods come back, as their controller recreates them: a batch job with the work its
//! checkpoint saved subtracted, a serving replica unless the autoscaler removed it meanwhile.
//!
//! A victim whose checkpoint was called is judged again at its eviction, as the operator does
//! ([`gpuqueue_core::reclaim::pending_victims`]): if its queue shrank meanwhile and no longer
//! borrows it, it is spared and keeps running, and its owner, whose room was not freed, is
//! deleted and recreated by its controller to be planned anew. The owner's wait runs on from
//! its first creation.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use gpuqueue_api::v1alpha1::CheckpointDriver;
use gpuqueue_core::Policy;
use gpuqueue_core::Snapshot;
use gpuqueue_core::admission::{Decision, WaitReason, admission_cycle, next_expiry};
use gpuqueue_core::fragmentation::WorkloadMix;
use gpuqueue_core::ids::{NodeId, PodId};
use gpuqueue_core::model::{
    CheckpointSettings, Namespace, Node, Pod, PodKey, Queue, ReclaimSettings, ResourceQuota,
};
use gpuqueue_core::quantity::Milli;
use gpuqueue_core::reclaim::{NoPlan, ReclaimPlan, pending_victims};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};

use crate::convert;
use crate::engine::{EventQueue, SimTime};
use crate::quota_metrics::{OverBudgetCause, QuotaMetrics, QuotaSummary};
use crate::scenario::{HandoverModel, Latency, LoadedScenario, TenantSpec};
use crate::workload::{Job, Workload, Z99};

/// A quota policy of the study.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuotaPolicy {
    /// No quotas: one shared queue, first come first served.
    NoIsolation,
    /// Hard quotas at each tenant's guarantee.
    Static,
    /// Guaranteed plus burstable, with reclaim (gpuqueue).
    Borrow,
}

impl QuotaPolicy {
    /// Every policy, in report order.
    pub const ALL: [QuotaPolicy; 3] = [
        QuotaPolicy::NoIsolation,
        QuotaPolicy::Static,
        QuotaPolicy::Borrow,
    ];

    /// The name users type.
    pub fn name(self) -> &'static str {
        match self {
            QuotaPolicy::NoIsolation => "no-isolation",
            QuotaPolicy::Static => "static",
            QuotaPolicy::Borrow => "borrow",
        }
    }

    /// The name in reports.
    pub fn title(self) -> &'static str {
        match self {
            QuotaPolicy::NoIsolation => "no isolation",
            QuotaPolicy::Static => "static quotas",
            QuotaPolicy::Borrow => "borrow-and-reclaim",
        }
    }

    fn stream(self) -> u64 {
        match self {
            QuotaPolicy::NoIsolation => 1_000,
            QuotaPolicy::Static => 1_001,
            QuotaPolicy::Borrow => 1_002,
        }
    }
}

impl fmt::Display for QuotaPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for QuotaPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown quota policy {s:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// Everything a quota run needs: the cluster, one queue per tenant (in tenant order; each
/// claims the namespace of its own name), the arrivals and the world's latencies.
#[derive(Clone, Debug)]
pub struct QuotaInput {
    /// Scenario name.
    pub name: String,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// One queue per tenant, in the order the jobs' tenant indices refer to.
    pub queues: Vec<Queue>,
    /// Pod priority per tenant.
    pub priorities: Vec<i32>,
    /// The arrivals.
    pub jobs: Vec<Job>,
    /// The task mix fragmentation is measured against.
    pub mix: WorkloadMix,
    /// Latencies of the world.
    pub handover: HandoverModel,
    /// Seed of the latency draws.
    pub seed: u64,
    /// End of the run.
    pub end: SimTime,
    /// Start of the measured window.
    pub warmup: SimTime,
    /// Time-series resolution.
    pub sample_every: Duration,
}

/// A tenant's queue as the scenario writes it: guaranteed and burstable `nvidia.com/gpu`,
/// reclaim settings, and a vLLM checkpoint with the tenant's timeout.
pub fn tenant_queue(tenant: &TenantSpec) -> Queue {
    let mut quota = ResourceQuota::devices(
        convert::gpu_resource(),
        u64::from(tenant.guaranteed),
        u64::from(tenant.burstable),
    );
    quota.lending_limit = tenant.lending_limit.map(|l| Milli::devices(u64::from(l)));
    let reclaim = &tenant.reclaim;
    Queue::new(tenant.name.clone())
        .namespace(tenant.name.clone())
        .quota(quota)
        .weight(tenant.weight)
        .reclaim(ReclaimSettings {
            budget: reclaim.budget.into(),
            checkpoint: CheckpointSettings {
                driver: CheckpointDriver::Vllm,
                port: Some(8000),
                timeout: reclaim.checkpoint_timeout.into(),
                ..CheckpointSettings::default()
            },
            victim_grace: Duration::from_secs(
                u64::try_from(reclaim.victim_grace_period_seconds).unwrap_or(0),
            ),
            min_borrow: reclaim.min_borrow_duration.map(Into::into),
        })
}

impl QuotaInput {
    /// The input of a scenario and its generated load.
    pub fn new(loaded: &LoadedScenario, workload: &Workload, seed: u64) -> Self {
        let scenario = &loaded.scenario;
        Self {
            name: scenario.name.clone(),
            nodes: workload.nodes.iter().map(convert::node).collect(),
            queues: scenario.tenants.iter().map(tenant_queue).collect(),
            priorities: scenario.tenants.iter().map(|t| t.priority).collect(),
            mix: convert::shape_mix(workload.jobs.iter().map(|j| &j.shape)),
            jobs: workload.jobs.clone(),
            handover: scenario.handover.clone(),
            seed,
            end: SimTime::from_duration(scenario.duration.into()),
            warmup: SimTime::from_duration(scenario.warmup.into()),
            sample_every: scenario.sample_every.into(),
        }
    }

    /// GPU capacity, milli.
    pub fn capacity_milli(&self) -> u64 {
        self.nodes
            .iter()
            .flat_map(|n| &n.pools)
            .map(|p| u64::from(p.devices) * 1000)
            .sum()
    }

    /// The queues a policy runs with.
    fn policy_queues(&self, policy: QuotaPolicy) -> Vec<Queue> {
        match policy {
            QuotaPolicy::Borrow => self.queues.clone(),
            QuotaPolicy::Static => self
                .queues
                .iter()
                .map(|q| {
                    let mut q = q.clone();
                    for quota in &mut q.quotas {
                        quota.burstable = Milli::ZERO;
                    }
                    q
                })
                .collect(),
            QuotaPolicy::NoIsolation => {
                let mut shared = Queue::new("shared").quota(ResourceQuota::devices(
                    convert::gpu_resource(),
                    self.capacity_milli() / 1000,
                    0,
                ));
                for q in &self.queues {
                    shared = shared.namespace(q.name.clone());
                }
                vec![shared]
            }
        }
    }

    fn guaranteed_milli(&self, tenant: usize) -> u64 {
        self.queues[tenant]
            .quota_of(&convert::gpu_resource())
            .map_or(0, |q| q.guaranteed.0)
    }
}

/// How many pods went where; every created pod ends in exactly one place.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Pods created (arrivals and recreations after eviction).
    pub created: u64,
    /// Pods bound to a node.
    pub bound: u64,
    /// Pods removed by the autoscaler before they were bound.
    pub withdrawn: u64,
    /// Owner pods deleted before they were bound, because a victim of their handover was
    /// spared; each is recreated and planned anew.
    pub requeued: u64,
    /// Pods still waiting (or admitted, not yet bound) at the end.
    pub waiting_at_end: u64,
    /// Bound pods that finished their work.
    pub completed: u64,
    /// Bound pods evicted by reclaim.
    pub evicted: u64,
    /// Bound pods removed by the autoscaler.
    pub scaled_down: u64,
    /// Bound pods still running at the end.
    pub running_at_end: u64,
}

/// One policy's run.
#[derive(Clone, Debug)]
pub struct QuotaRun {
    /// The policy.
    pub policy: QuotaPolicy,
    /// The figures.
    pub summary: QuotaSummary,
    /// The measurements.
    pub metrics: QuotaMetrics,
    /// Where every pod went.
    pub counts: Counts,
    /// Events processed.
    pub events: u64,
}

#[derive(Clone, Copy, Debug)]
enum Event {
    Arrive(usize),
    Recreate(usize),
    Remove(usize),
    Pass,
    Bound {
        job: usize,
        attempt: u32,
    },
    OwnerBound {
        job: usize,
        attempt: u32,
        planned: SimTime,
    },
    Evict(Eviction),
    VictimGone {
        job: usize,
        attempt: u32,
        departure: Departure,
    },
    Finish {
        job: usize,
        attempt: u32,
    },
    Sample,
}

/// A victim's eviction, sent when its checkpoint is over.
#[derive(Clone, Copy, Debug)]
struct Eviction {
    job: usize,
    attempt: u32,
    /// The owner of its handover, and that pod's attempt.
    owner: usize,
    owner_attempt: u32,
    /// A checkpoint was called: time passed since the plan, so the operator asks again.
    recheck: bool,
    departure: Departure,
}

/// A victim's departure, as the operator observes it when the pod is gone.
#[derive(Clone, Copy, Debug)]
struct Departure {
    /// Its checkpoint saved its work.
    saved: bool,
    node: NodeId,
    /// Its termination: eviction accepted to its phase terminal.
    took: Duration,
    grace: Duration,
}

/// What a requeued owner's next pod carries over: its wait runs on from its first creation.
#[derive(Clone, Copy, Debug)]
struct Carried {
    created: SimTime,
    owner: bool,
    first: Option<OverBudgetCause>,
}

/// Where a job's pod stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// At the gate.
    Waiting,
    /// Admitted, not yet bound.
    Admitted,
    /// Bound to a node at this time.
    Bound(SimTime),
}

impl Live {
    /// `Some` (with what it would be counted under, over budget) for an owner request.
    fn owner_cause(&self) -> Option<OverBudgetCause> {
        self.owner
            .then(|| self.first.unwrap_or(OverBudgetCause::Undecided))
    }
}

impl Stage {
    fn bound_at(self) -> Option<SimTime> {
        match self {
            Stage::Bound(at) => Some(at),
            Stage::Waiting | Stage::Admitted => None,
        }
    }
}

/// A job's current pod.
#[derive(Clone, Debug)]
struct Live {
    pod: PodId,
    attempt: u32,
    created: SimTime,
    owner: bool,
    /// What the first admission cycle that saw it decided.
    first: Option<OverBudgetCause>,
    stage: Stage,
    /// Batch: work left when this pod started.
    remaining: Option<Duration>,
    gpu_milli: u64,
    part: Part,
    /// The autoscaler removed the replica; do not recreate it.
    removed: bool,
}

/// A pod's part in a handover under way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// None (an owner whose handover goes as planned needs no mark).
    Outside,
    /// A victim, until it is gone or spared.
    Victim,
    /// An owner one of whose victims was spared: requeued rather than bound.
    SparedOwner,
}

struct Run<'a> {
    input: &'a QuotaInput,
    queue: EventQueue<Event>,
    snapshot: Snapshot,
    live: Vec<Option<Live>>,
    attempts: Vec<u32>,
    remaining: Vec<Option<Duration>>,
    by_pod: HashMap<PodId, usize>,
    /// Per job: what its next pod carries over from an owner requeued.
    carried: Vec<Option<Carried>>,
    held: Vec<u64>,
    /// Per tenant: GPU milli its pods at the gate ask for.
    asked: Vec<u64>,
    pass_at: Option<SimTime>,
    rng: ChaCha8Rng,
    metrics: QuotaMetrics,
    counts: Counts,
    /// Per handover (its owner's job and attempt): the evictions of its victims not answered
    /// yet, sent or spared.
    evictions_left: HashMap<(usize, u32), usize>,
    /// The victims in flight, until gone, spared or otherwise forgotten.
    leaving: HashMap<PodId, Leaving>,
}

/// A victim in flight: when it is planned to be gone, and the owners of other handovers that
/// count on its room ([`ReclaimPlan::awaits`]: a burst's owners share the room their victims
/// free), with their attempts.
#[derive(Debug)]
struct Leaving {
    gone_at: SimTime,
    awaited_by: Vec<(usize, u32)>,
}

/// Runs one policy on the input.
pub fn run(input: &QuotaInput, policy: QuotaPolicy) -> QuotaRun {
    let namespaces = input.queues.iter().map(|q| Namespace::new(q.name.clone()));
    let (mut snapshot, _issues) = Snapshot::builder()
        .queues(input.policy_queues(policy))
        .namespaces(namespaces)
        .nodes(input.nodes.iter().cloned())
        .build();
    snapshot.set_workload_mix(input.mix.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(input.seed);
    rng.set_stream(policy.stream());
    let capacity_milli = input.capacity_milli();
    let mut run = Run {
        input,
        queue: EventQueue::new(),
        snapshot,
        live: vec![None; input.jobs.len()],
        attempts: vec![0; input.jobs.len()],
        remaining: input.jobs.iter().map(|j| j.work).collect(),
        by_pod: HashMap::new(),
        carried: vec![None; input.jobs.len()],
        held: vec![0; input.queues.len()],
        asked: vec![0; input.queues.len()],
        pass_at: None,
        rng,
        metrics: QuotaMetrics::new(input.warmup, capacity_milli, input.queues.len()),
        counts: Counts::default(),
        evictions_left: HashMap::new(),
        leaving: HashMap::new(),
    };
    for job in &input.jobs {
        run.queue.schedule_at(job.arrival, Event::Arrive(job.id));
        if let Some(at) = job.removed_at {
            run.queue.schedule_at(at, Event::Remove(job.id));
        }
    }
    run.queue.schedule_at(SimTime::ZERO, Event::Sample);
    while let Some(at) = run.queue.next_time() {
        if at >= input.end {
            break;
        }
        let Some((now, event)) = run.queue.pop() else {
            break;
        };
        run.handle(now, event);
    }
    run.finish(policy)
}

impl Run<'_> {
    fn job(&self, job: usize) -> &Job {
        &self.input.jobs[job]
    }

    fn budget(&self, tenant: usize) -> Duration {
        self.input.queues[tenant].reclaim.budget
    }

    fn latency(&mut self, latency: Latency) -> Duration {
        sample_latency(latency, &mut self.rng)
    }

    /// Asks for an admission pass at `at` (passes requested for the same instant coalesce).
    fn request_pass(&mut self, at: SimTime) {
        if self.pass_at.is_none_or(|t| at < t) {
            self.pass_at = Some(at);
            self.queue.schedule_at(at, Event::Pass);
        }
    }

    /// The operator sees a change one watch round trip after it happens.
    fn after_change(&mut self, now: SimTime) {
        let watch = self.latency(self.input.handover.api);
        self.request_pass(now.after(watch));
        let f = self.snapshot.fragmentation();
        self.metrics
            .level(now, f.capacity_milli - f.idle_milli, f.fragmented_milli);
    }

    fn handle(&mut self, now: SimTime, event: Event) {
        match event {
            Event::Arrive(job) | Event::Recreate(job) => self.create(now, job),
            Event::Remove(job) => self.scale_down(now, job),
            Event::Pass => {
                if self.pass_at == Some(now) {
                    self.pass_at = None;
                    self.pass(now);
                }
            }
            Event::Bound { job, attempt } => self.bound(now, job, attempt, None),
            // An owner whose own victim was spared was requeued when its handover's evictions
            // were answered, and is no longer current. One that counted on the room of another
            // handover's victim, spared, is requeued at its planned bind (the operator holds
            // it at the gate until its handover ends, then leaves it to kube-scheduler, which
            // finds no room: a requeue is the short of it).
            Event::OwnerBound {
                job,
                attempt,
                planned,
            } => {
                if self.live[job]
                    .as_ref()
                    .is_some_and(|l| l.attempt == attempt && l.part == Part::SparedOwner)
                {
                    self.requeue(now, job);
                } else {
                    self.bound(now, job, attempt, Some(planned));
                }
            }
            Event::Evict(eviction) => {
                self.evict(now, eviction);
                self.eviction_answered(now, eviction.owner, eviction.owner_attempt);
            }
            Event::VictimGone {
                job,
                attempt,
                departure,
            } => {
                let name = self.snapshot.node(departure.node).name.clone();
                self.snapshot
                    .terminations_mut()
                    .record(&name, departure.took, departure.grace);
                self.victim_gone(now, job, attempt, departure.saved);
            }
            Event::Finish { job, attempt } => self.finish_job(now, job, attempt),
            Event::Sample => {
                self.metrics.sample(now, &self.held);
                self.queue
                    .schedule_at(now.after(self.input.sample_every), Event::Sample);
            }
        }
    }

    fn create(&mut self, now: SimTime, job: usize) {
        if self.live[job].is_some() {
            return;
        }
        let spec = self.job(job).clone();
        let carried = self.carried[job].take();
        if spec.removed_at.is_some_and(|at| at <= now) {
            // Scaled down before its controller recreated it; a requeued owner's wait ends.
            if let Some(c) = carried {
                let cause = c
                    .owner
                    .then(|| c.first.unwrap_or(OverBudgetCause::Undecided));
                let budget = self.budget(spec.tenant);
                self.metrics
                    .withdrawn(spec.tenant, c.created, now, cause, budget);
            }
            return;
        }
        let attempt = self.attempts[job] + 1;
        self.attempts[job] = attempt;
        let namespace = self.input.queues[spec.tenant].name.clone();
        let mut pod = Pod::new(
            PodKey::new(namespace, format!("job-{job}-{attempt}")),
            convert::shape_requests(&spec.shape),
            convert::timestamp(now),
        );
        pod.priority = self.input.priorities[spec.tenant];
        pod.gpu_models.clone_from(&spec.shape.gpu_models);
        let Ok(pod) = self.snapshot.add_pod(pod) else {
            return;
        };
        let gpu_milli = spec.shape.total_gpu_milli();
        self.counts.created += 1;
        self.by_pod.insert(pod, job);
        // The queue admits its pods in order (same priority, then age): the requests already
        // at the gate come first, so only what fits after them is an owner's.
        let owner = self.held[spec.tenant] + self.asked[spec.tenant] + gpu_milli
            <= self.input.guaranteed_milli(spec.tenant);
        self.live[job] = Some(Live {
            pod,
            attempt,
            created: carried.map_or(now, |c| c.created),
            owner: carried.map_or(owner, |c| c.owner),
            first: carried.and_then(|c| c.first),
            stage: Stage::Waiting,
            remaining: self.remaining[job],
            gpu_milli,
            part: Part::Outside,
            removed: false,
        });
        self.asked[spec.tenant] += gpu_milli;
        self.after_change(now);
    }

    fn forget(&mut self, job: usize) -> Option<Live> {
        let live = self.live[job].take()?;
        self.by_pod.remove(&live.pod);
        self.leaving.remove(&live.pod);
        self.snapshot.remove_pod(live.pod);
        let tenant = self.job(job).tenant;
        if live.stage == Stage::Waiting {
            self.asked[tenant] -= live.gpu_milli;
        } else {
            self.held[tenant] -= live.gpu_milli;
        }
        Some(live)
    }

    fn scale_down(&mut self, now: SimTime, job: usize) {
        let tenant = self.job(job).tenant;
        let Some(live) = self.live[job].as_mut() else {
            return;
        };
        if live.part == Part::Victim {
            live.removed = true; // its eviction is under way; it is not recreated
            return;
        }
        let Some(live) = self.forget(job) else { return };
        if live.stage.bound_at().is_some() {
            self.counts.scaled_down += 1;
        } else {
            self.counts.withdrawn += 1;
            self.metrics.withdrawn(
                tenant,
                live.created,
                now,
                live.owner_cause(),
                self.budget(tenant),
            );
        }
        self.after_change(now);
    }

    fn pass(&mut self, now: SimTime) {
        let decisions = admission_cycle(
            &mut self.snapshot,
            &Policy::default(),
            convert::timestamp(now),
        );
        // A pod refused for a borrowing cool-down is decided again when it ends, as the
        // operator wakes for it, even if nothing else changes.
        if let Some(at) = next_expiry(&decisions) {
            self.request_pass(convert::sim_time(at).max(now));
        }
        let mut changed = false;
        for decision in decisions {
            self.first_decision(&decision);
            match decision {
                Decision::Admit(admission) => {
                    if let Some(job) = self.admitted(admission.pod) {
                        let delay = self.latency(self.input.handover.api)
                            + self.latency(self.input.handover.api);
                        let attempt = self.attempts[job];
                        self.queue
                            .schedule_at(now.after(delay), Event::Bound { job, attempt });
                        changed = true;
                    }
                }
                Decision::Reclaim(plan) => {
                    self.reclaim(now, &plan);
                    changed = true;
                }
                Decision::Wait(_) => {}
            }
        }
        if changed {
            let f = self.snapshot.fragmentation();
            self.metrics
                .level(now, f.capacity_milli - f.idle_milli, f.fragmented_milli);
        }
    }

    /// Records what the first cycle that saw a pod decided for it.
    fn first_decision(&mut self, decision: &Decision) {
        let Some(&job) = self.by_pod.get(&decision.pod()) else {
            return;
        };
        let multi_gpu = self.input.jobs[job].shape.gpus > 1;
        let Some(live) = self.live[job].as_mut() else {
            return;
        };
        live.first.get_or_insert(match decision {
            Decision::Admit(_) => OverBudgetCause::Binding,
            Decision::Reclaim(_) => OverBudgetCause::Handover { multi_gpu },
            Decision::Wait(w) => OverBudgetCause::Waited {
                reason: wait_label(&w.reason),
                multi_gpu,
            },
        });
    }

    /// Marks the pod's job admitted; returns the job.
    fn admitted(&mut self, pod: PodId) -> Option<usize> {
        let job = *self.by_pod.get(&pod)?;
        let tenant = self.job(job).tenant;
        let live = self.live[job].as_mut()?;
        live.stage = Stage::Admitted;
        self.asked[tenant] -= live.gpu_milli;
        self.held[tenant] += live.gpu_milli;
        Some(job)
    }

    fn reclaim(&mut self, now: SimTime, plan: &ReclaimPlan) {
        let Some(owner) = self.admitted(plan.owner) else {
            return;
        };
        self.metrics.reclaim_started(now);
        let handover = sample_handover(plan, &self.input.handover, &mut self.rng);
        let mut evictions = 0;
        for (victim, timeline) in plan.victims.iter().zip(&handover.victims) {
            if !timeline.saved {
                self.metrics.checkpoint_failed(now);
            }
            if let Some(queue) = self.snapshot.pod_queue(victim.pod) {
                self.snapshot
                    .record_reclaimed_from(queue, convert::timestamp(now));
            }
            let Some(&job) = self.by_pod.get(&victim.pod) else {
                continue;
            };
            let Some(live) = self.live[job].as_mut() else {
                continue;
            };
            live.part = Part::Victim;
            let attempt = live.attempt;
            evictions += 1;
            self.leaving.insert(
                victim.pod,
                Leaving {
                    gone_at: now.after(timeline.gone),
                    awaited_by: Vec::new(),
                },
            );
            self.queue.schedule_at(
                now.after(timeline.evicted),
                Event::Evict(Eviction {
                    job,
                    attempt,
                    owner,
                    owner_attempt: self.attempts[owner],
                    recheck: timeline.checkpointed,
                    departure: Departure {
                        saved: timeline.saved,
                        node: plan.node,
                        took: timeline.termination(),
                        grace: victim.grace,
                    },
                }),
            );
        }
        if evictions > 0 {
            self.evictions_left
                .insert((owner, self.attempts[owner]), evictions);
        }
        let attempt = self.attempts[owner];
        // Released from the gate once the victims it awaits are gone too, then bound. Drawn only
        // for such an owner: a draw for every plan would move every later one.
        let mut bound_at = now.after(handover.owner_bound);
        let release = if plan.awaits.is_empty() {
            Duration::ZERO
        } else {
            self.latency(self.input.handover.api) + self.latency(self.input.handover.api)
        };
        for key in &plan.awaits {
            let Some(leaving) = self
                .snapshot
                .pod_id(key)
                .and_then(|pod| self.leaving.get_mut(&pod))
            else {
                continue;
            };
            leaving.awaited_by.push((owner, attempt));
            bound_at = bound_at.max(leaving.gone_at.after(release));
        }
        self.queue.schedule_at(
            bound_at,
            Event::OwnerBound {
                job: owner,
                attempt,
                planned: now,
            },
        );
    }

    fn current(&self, job: usize, attempt: u32) -> bool {
        self.live[job]
            .as_ref()
            .is_some_and(|l| l.attempt == attempt)
    }

    /// Sends a victim's eviction, unless its checkpoint ran and its queue no longer borrows it
    /// by now: then the victim is spared.
    fn evict(&mut self, now: SimTime, eviction: Eviction) {
        if !self.current(eviction.job, eviction.attempt) {
            return;
        }
        let Some(pod) = self.live[eviction.job].as_ref().map(|l| l.pod) else {
            return;
        };
        if eviction.recheck && !self.still_borrowed(pod) {
            self.spare(now, eviction, pod);
            return;
        }
        self.snapshot.mark_terminating(pod);
        let departure = eviction.departure;
        self.queue.schedule_at(
            now.after(departure.took),
            Event::VictimGone {
                job: eviction.job,
                attempt: eviction.attempt,
                departure,
            },
        );
    }

    /// Counts one of a handover's evictions as answered. Once all are, an owner one of whose
    /// victims was spared is requeued, as the operator does once every eviction call of the
    /// handover returned, not when the victims it did evict are gone.
    fn eviction_answered(&mut self, now: SimTime, owner: usize, owner_attempt: u32) {
        let handover = (owner, owner_attempt);
        let Some(left) = self.evictions_left.get_mut(&handover) else {
            return;
        };
        *left -= 1;
        if *left > 0 {
            return;
        }
        self.evictions_left.remove(&handover);
        if self.live[owner]
            .as_ref()
            .is_some_and(|l| l.attempt == owner_attempt && l.part == Part::SparedOwner)
        {
            self.requeue(now, owner);
        }
    }

    /// The operator's question before an eviction; a victim it does not name is not vouched
    /// for.
    fn still_borrowed(&self, pod: PodId) -> bool {
        let Some(key) = self.snapshot.pod(pod).map(|p| p.key.clone()) else {
            return false;
        };
        pending_victims(&self.snapshot)
            .into_iter()
            .any(|v| v.key == key && v.borrowed)
    }

    /// The victim keeps running (and its work, if it ended meanwhile, ends now); its owner
    /// is requeued instead of bound.
    fn spare(&mut self, now: SimTime, eviction: Eviction, pod: PodId) {
        self.snapshot.unmark_victim(pod);
        self.metrics.victim_spared(now);
        let awaited_by = self
            .leaving
            .remove(&pod)
            .map(|leaving| leaving.awaited_by)
            .unwrap_or_default();
        for (owner, attempt) in
            std::iter::once((eviction.owner, eviction.owner_attempt)).chain(awaited_by)
        {
            if let Some(owner) = self.live[owner].as_mut().filter(|l| l.attempt == attempt) {
                owner.part = Part::SparedOwner;
            }
        }
        let job = eviction.job;
        let Some(live) = self.live[job].as_mut() else {
            return;
        };
        live.part = Part::Outside;
        let done = matches!((live.stage, live.remaining),
            (Stage::Bound(at), Some(work)) if at.after(work) <= now);
        if live.removed {
            self.scale_down(now, job);
        } else if done {
            self.finish_job(now, job, eviction.attempt);
        }
        self.after_change(now);
    }

    /// Deletes an owner whose room was not freed; its controller recreates it and the
    /// operator plans it anew.
    fn requeue(&mut self, now: SimTime, job: usize) {
        let multi_gpu = self.job(job).shape.gpus > 1;
        let Some(live) = self.forget(job) else {
            return;
        };
        self.counts.requeued += 1;
        self.carried[job] = Some(Carried {
            created: live.created,
            owner: live.owner,
            first: Some(OverBudgetCause::Requeued { multi_gpu }),
        });
        let recreate =
            self.latency(self.input.handover.api) + self.latency(self.input.handover.api);
        self.queue
            .schedule_at(now.after(recreate), Event::Recreate(job));
        self.after_change(now);
    }

    fn bound(&mut self, now: SimTime, job: usize, attempt: u32, planned: Option<SimTime>) {
        if !self.current(job, attempt) {
            return;
        }
        let tenant = self.job(job).tenant;
        let budget = self.budget(tenant);
        let Some(live) = self.live[job].as_mut() else {
            return;
        };
        if live.stage != Stage::Admitted {
            return;
        }
        live.stage = Stage::Bound(now);
        let (created, owner, remaining) = (live.created, live.owner_cause(), live.remaining);
        self.counts.bound += 1;
        self.metrics.bound(tenant, created, now, owner, budget);
        if let Some(planned) = planned {
            self.metrics.handover_done(planned, now);
        }
        if let Some(work) = remaining {
            self.queue
                .schedule_at(now.after(work), Event::Finish { job, attempt });
        }
    }

    fn victim_gone(&mut self, now: SimTime, job: usize, attempt: u32, saved: bool) {
        if !self.current(job, attempt) {
            return;
        }
        let tenant = self.job(job).tenant;
        let Some(live) = self.forget(job) else { return };
        let ran = live
            .stage
            .bound_at()
            .map_or(Duration::ZERO, |at| now.since(at));
        if live.stage.bound_at().is_some() {
            self.counts.evicted += 1;
            self.metrics
                .evicted(tenant, now, live.gpu_milli, ran, saved);
        } else {
            self.counts.withdrawn += 1;
        }
        if let Some(work) = live.remaining {
            self.remaining[job] = Some(if saved {
                work.saturating_sub(ran)
            } else {
                work
            });
        }
        if !live.removed {
            let recreate = self.latency(self.input.handover.api);
            self.queue
                .schedule_at(now.after(recreate), Event::Recreate(job));
        }
        self.after_change(now);
    }

    /// A pod's work ended: it completes, a victim of a handover included (its process exits
    /// before the eviction; the operator sees it gone, and the eviction finds nothing to do).
    fn finish_job(&mut self, now: SimTime, job: usize, attempt: u32) {
        if !self.current(job, attempt) {
            return;
        }
        let tenant = self.job(job).tenant;
        let Some(live) = self.forget(job) else { return };
        let ran = live
            .stage
            .bound_at()
            .map_or(Duration::ZERO, |at| now.since(at));
        self.counts.completed += 1;
        self.metrics.completed(tenant, now, live.gpu_milli, ran);
        self.remaining[job] = Some(Duration::ZERO);
        self.after_change(now);
    }

    fn finish(mut self, policy: QuotaPolicy) -> QuotaRun {
        let end = self.input.end;
        for job in 0..self.live.len() {
            let Some(live) = self.live[job].clone() else {
                continue;
            };
            let tenant = self.job(job).tenant;
            if live.stage.bound_at().is_some() {
                self.counts.running_at_end += 1;
            } else {
                self.counts.waiting_at_end += 1;
                self.metrics.still_waiting(
                    tenant,
                    live.created,
                    end,
                    live.owner_cause(),
                    self.budget(tenant),
                );
            }
        }
        let f = self.snapshot.fragmentation();
        self.metrics
            .level(end, f.capacity_milli - f.idle_milli, f.fragmented_milli);
        let summary = self.metrics.finish(end);
        QuotaRun {
            policy,
            summary,
            metrics: self.metrics,
            counts: self.counts,
            events: self.queue.delivered(),
        }
    }
}

/// A wait reason's code; for `NoRoom` within the guarantee, with the reclaim planner's reason.
fn wait_label(reason: &WaitReason) -> &'static str {
    match reason {
        WaitReason::NoRoom {
            reclaim: Some(no), ..
        } => match no {
            NoPlan::NotPendingInAQueue => "NoRoom/NotPendingInAQueue",
            NoPlan::NotWithinGuarantee { .. } => "NoRoom/NotWithinGuarantee",
            NoPlan::InProgress { .. } => "NoRoom/InProgress",
            NoPlan::RoomAvailable { .. } => "NoRoom/RoomAvailable",
            NoPlan::NoSuitableNode => "NoRoom/NoSuitableNode",
            NoPlan::NoBorrowers => "NoRoom/NoBorrowers",
            NoPlan::BorrowersCannotMakeRoom { .. } => "NoRoom/BorrowersCannotMakeRoom",
            NoPlan::ViewBehind => "NoRoom/ViewBehind",
        },
        other => other.code(),
    }
}

/// A draw of a log-normal latency given by its median and 99th percentile.
pub fn sample_latency(latency: Latency, rng: &mut ChaCha8Rng) -> Duration {
    let median = Duration::from(latency.median).as_secs_f64();
    let p99 = Duration::from(latency.p99).as_secs_f64();
    if median <= 0.0 || p99 <= median {
        return Duration::from_secs_f64(median.max(0.0));
    }
    let sigma = (p99 / median).ln() / Z99;
    LogNormal::new(median.ln(), sigma).map_or(Duration::from_secs_f64(median), |d| {
        Duration::from_secs_f64(d.sample(rng).min(3600.0))
    })
}

/// Each victim's timeline, and when the owner is bound, counted from the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Handover {
    /// Per victim, in plan order.
    pub victims: Vec<VictimTimeline>,
    /// The owner is bound after.
    pub owner_bound: Duration,
}

/// One victim's steps in a handover, counted from the plan.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VictimTimeline {
    /// Its eviction is accepted.
    pub evicted: Duration,
    /// Its pod is gone.
    pub gone: Duration,
    /// Its checkpoint saved its work.
    pub saved: bool,
    /// A checkpoint was called (so the operator asks again before the eviction).
    pub checkpointed: bool,
}

impl VictimTimeline {
    /// Its termination as the operator observes it: eviction accepted to its phase terminal.
    pub fn termination(&self) -> Duration {
        self.gone.saturating_sub(self.evicted)
    }
}

/// Draws one handover's timeline: intent annotations (one API round trip); each victim's
/// checkpoint, cut at the plan's checkpoint deadline (a cut or failed checkpoint loses the
/// victim's work); the eviction call; the kubelet's pod worker starting the kill at the node's
/// first relist after it (it waits for a pod cache newer than its last sync); the victim's
/// exit, at most its grace period; the kubelet noticing it at the next relist (one kubelet per
/// node, so the victims of a plan, all on the plan's node, share the relist ticks) and writing
/// the pod's terminal phase, when its GPUs are free; then kube-scheduler binding the owner once
/// the last victim is gone, after the operator released it from the gate (one more round trip)
/// when the plan holds it there.
pub fn sample_handover(
    plan: &ReclaimPlan,
    model: &HandoverModel,
    rng: &mut ChaCha8Rng,
) -> Handover {
    let intent = sample_latency(model.api, rng);
    let relist = Duration::from(model.kubelet_relist).as_secs_f64();
    // The node's first relist tick after the plan; the next ones follow every `relist`.
    let first_tick = if relist > 0.0 {
        rng.random_range(0.0..relist)
    } else {
        0.0
    };
    // The first relist strictly after `at`: the kubelet acts on what a relist newer than `at`
    // shows.
    let next_relist = |at: f64| {
        if relist <= 0.0 {
            at
        } else if at < first_tick {
            first_tick
        } else {
            first_tick + (((at - first_tick) / relist).floor() + 1.0) * relist
        }
    };
    let victims: Vec<VictimTimeline> = plan
        .victims
        .iter()
        .map(|victim| {
            let deadline = plan.checkpoint_deadline(victim, intent);
            let checkpointed =
                victim.checkpoint.driver != CheckpointDriver::None && !deadline.is_zero();
            let (checkpoint, saved) = if victim.checkpoint.driver == CheckpointDriver::None {
                (Duration::ZERO, false)
            } else {
                let took = sample_latency(model.checkpoint, rng);
                let failed = rng.random_range(0.0..1.0) < model.checkpoint_failure;
                (took.min(deadline), took <= deadline && !failed)
            };
            let evicted = intent + checkpoint + sample_latency(model.api, rng);
            let exit = sample_latency(model.victim_exit, rng).min(victim.grace);
            let killed = next_relist(evicted.as_secs_f64());
            let exited = killed + exit.as_secs_f64();
            let status_written = sample_latency(model.api, rng);
            VictimTimeline {
                evicted,
                gone: Duration::from_secs_f64(next_relist(exited)) + status_written,
                saved,
                checkpointed,
            }
        })
        .collect();
    let last = victims.iter().map(|v| v.gone).max().unwrap_or(intent);
    // The operator sees the victims gone and releases the owner; kube-scheduler binds it.
    let released = last + sample_latency(model.api, rng);
    Handover {
        victims,
        owner_bound: released + sample_latency(model.api, rng),
    }
}

/// Runs every policy in `policies` on the input, in parallel (one thread each).
pub fn run_policies(input: &QuotaInput, policies: &[QuotaPolicy]) -> Vec<QuotaRun> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = policies
            .iter()
            .map(|&policy| scope.spawn(move || run(input, policy)))
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

impl Counts {
    /// Whether every created pod is accounted for exactly once.
    pub fn balanced(&self) -> bool {
        self.created == self.bound + self.withdrawn + self.requeued + self.waiting_at_end
            && self.bound == self.completed + self.evicted + self.scaled_down + self.running_at_end
    }
}

/// Why a live cluster or proposed queues could not replace the scenario's.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OverlayError {
    /// A scenario tenant has no queue of its name.
    #[error(
        "scenario tenant {0:?} has no GpuQueue of that name in the cluster; name the scenario's tenants after the cluster's queues"
    )]
    MissingQueue(String),
    /// The nodes have no GPU.
    #[error("the cluster has no node with GPUs to simulate")]
    NoGpus,
}

impl QuotaInput {
    /// The same load on the live cluster: its nodes, and its queues in place of the scenario's
    /// (matched by name; each still claims the namespace of its name, where the simulated pods
    /// live). Queues the scenario has no tenant for are kept: they carry no load and lend.
    ///
    /// The study is of `nvidia.com/gpu`, the resource the scenario's pods request: other GPU
    /// resources of the nodes (MIG profiles) are left out, and so are nodes without whole GPUs,
    /// so that they count neither as capacity nor as fragments.
    pub fn with_cluster(&self, nodes: Vec<Node>, queues: Vec<Queue>) -> Result<Self, OverlayError> {
        let gpu = convert::gpu_resource();
        let nodes: Vec<Node> = nodes
            .into_iter()
            .filter_map(|mut node| {
                node.pools.retain(|p| p.resource == gpu && p.devices > 0);
                (!node.pools.is_empty()).then_some(node)
            })
            .collect();
        if nodes.is_empty() {
            return Err(OverlayError::NoGpus);
        }
        for tenant in &self.queues {
            if !queues.iter().any(|q| q.name == tenant.name) {
                return Err(OverlayError::MissingQueue(tenant.name.clone()));
            }
        }
        let mut input = self.with_queues(queues);
        input.nodes = nodes;
        Ok(input)
    }

    /// The same load with `queues` replacing the queues of the same name (a proposed change);
    /// new names are added as queues without load.
    #[must_use]
    pub fn with_queues(&self, queues: Vec<Queue>) -> Self {
        let mut input = self.clone();
        for queue in queues {
            let name = queue.name.clone();
            let queue = queue.namespace(name.clone());
            if let Some(existing) = input.queues.iter_mut().find(|q| q.name == name) {
                *existing = queue;
            } else {
                input.queues.push(queue);
                input.priorities.push(0);
            }
        }
        input
    }
}
