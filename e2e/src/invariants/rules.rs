//! The invariants, checked on each sample of the [`World`], on each eviction the API server
//! audited and on the checkpoint calls the fake vLLM servers logged. Pure: time comes in as
//! milliseconds since the Unix epoch (the clock of the API server, the operator and the fake
//! servers alike: one machine).
//!
//! Two kinds of rule. *Safety* rules hold at every moment, whatever fails: no queue above its
//! ceiling, no node's GPUs counted twice, no pod evicted twice or evicted while its queue held
//! no more than its guarantee, no checkpoint called twice for one victim and reclaim. *Liveness*
//! rules bound how long something may stay undone: an owner below its guarantee while others
//! borrow, a gated pod without a reason, a reclaim in flight past its deadline. While a fault
//! is being injected and recovered from, a sample is *excused*: its time does not count
//! against a liveness allowance (nobody leads while the leader is killed), and never against a
//! safety rule.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use super::world::{PodView, World, millis};

/// Which invariant a violation broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// A queue's pods hold more GPUs than `guaranteed + burstable`.
    AboveCeiling,
    /// A queue holds less than its guarantee (capped by what it asks for) while another
    /// borrows, longer than its budget plus the allowance.
    BelowGuarantee,
    /// The pods bound to a node hold more GPUs than it has.
    GpuCountedTwice,
    /// A pod's eviction (or deletion by the operator) was accepted twice.
    EvictedTwice,
    /// A pod was evicted while its queue held no more than its guarantee without it.
    EvictedNotBorrower,
    /// A victim's checkpoint was called twice within one reclaim.
    CheckpointTwice,
    /// A gated pod went without a waiting reason longer than the first-reason delay and a pass.
    GatedWithoutReason,
    /// A reclaim stayed in `reclaimsInFlight` past its deadline plus the grace.
    HandoverOverdue,
}

impl Rule {
    /// A safety rule holds at every moment, whatever the machine's load; a liveness rule bounds
    /// a duration, so a loaded machine can break it without a bug (tests assert safety only).
    pub fn is_safety(self) -> bool {
        !matches!(
            self,
            Self::BelowGuarantee | Self::GatedWithoutReason | Self::HandoverOverdue
        )
    }
}

/// One violation, with when it began and the objects involved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct InvariantViolation {
    pub rule: Rule,
    /// When it was first seen, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The objects (`namespace/name` of pods, queue and node names, reclaim ids).
    pub objects: Vec<String>,
    pub detail: String,
    /// For a liveness rule: how long it had lasted (unexcused) when it became a violation.
    pub lasted_ms: u64,
}

/// How long liveness rules allow, beyond what the queue says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Allowances {
    /// Added to a queue's budget before a guarantee deficit is a violation: the checker sees a
    /// pod when it is created, the operator's budget runs from when it finds it blocked.
    pub budget_slack: Duration,
    /// The operator's delay before a waiting pod's first reason (`FIRST_REASON_AFTER`).
    pub first_reason: Duration,
    /// One admission pass, as long as it may take on a loaded machine.
    pub pass: Duration,
    /// Added to a reclaim's deadline before it is overdue: settling and the status write.
    pub handover_grace: Duration,
}

impl Default for Allowances {
    fn default() -> Self {
        Self {
            budget_slack: Duration::from_secs(2),
            first_reason: Duration::from_secs(1),
            pass: Duration::from_secs(2),
            handover_grace: Duration::from_secs(5),
        }
    }
}

/// An accepted eviction, or a deletion, of a pod, as the audit log recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub at_ms: u64,
    /// `namespace/name`.
    pub pod: String,
    /// `evict` or `delete`.
    pub verb: &'static str,
}

/// A checkpoint call (vLLM `POST /pause`) a victim's server received.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointCall {
    /// `namespace/name` and uid of the pod the server stood for.
    pub pod: String,
    pub uid: String,
    pub at_ms: u64,
}

/// A rule seen to hold for one subject (a queue, node, pod uid or reclaim id) at one sample.
struct Finding {
    rule: Rule,
    subject: String,
    objects: Vec<String>,
    detail: String,
}

impl Finding {
    fn new(rule: Rule, subject: &str, objects: Vec<String>, detail: String) -> Self {
        Self {
            rule,
            subject: subject.to_owned(),
            objects,
            detail,
        }
    }
}

/// A condition that has held since `first_ms`, for `unexcused_ms` of unexcused time.
#[derive(Debug, Clone)]
struct Episode {
    first_ms: u64,
    unexcused_ms: u64,
    reported: bool,
}

/// What the rules saw, at the end.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Tally {
    pub samples: usize,
    pub excused_samples: usize,
    /// Accepted evictions and operator deletions, and the checkpoint calls checked.
    pub evictions: usize,
    /// Of those, owners a handover freed a node for and nobody bound, evicted so that their
    /// controller creates them again (reclaim/requeue.rs): they never ran, and are no victims.
    pub requeued_owners: usize,
    pub checkpoint_calls: usize,
}

/// The checker's state between samples.
#[derive(Debug, Default)]
pub struct Rules {
    allowances: Allowances,
    last_sample_ms: Option<u64>,
    open: BTreeMap<(Rule, String), Episode>,
    violations: Vec<InvariantViolation>,
    /// Every pod as last seen, gone ones included (a victim may be gone before its eviction's
    /// audit line is read).
    last_seen: HashMap<String, PodView>,
    /// Uids whose eviction was accepted, with how many times.
    evicted: HashMap<String, u32>,
    /// Per uid, each reclaim id it carried, from when it was first seen with it.
    reclaim_ids: HashMap<String, Vec<(u64, String)>>,
    tally: Tally,
}

impl Rules {
    pub fn new(allowances: Allowances) -> Self {
        Self {
            allowances,
            ..Self::default()
        }
    }

    /// Checks one sample taken at `now_ms`.
    pub fn sample(&mut self, now_ms: u64, excused: bool, world: &World) {
        let elapsed = now_ms.saturating_sub(self.last_sample_ms.unwrap_or(now_ms));
        let dt = if excused { 0 } else { elapsed };
        self.last_sample_ms = Some(now_ms);
        self.tally.samples += 1;
        self.tally.excused_samples += usize::from(excused);
        self.remember(now_ms, world);
        let mut holding = BTreeSet::new();
        self.quotas(now_ms, dt, world, &mut holding);
        self.nodes(now_ms, world, &mut holding);
        self.gated(now_ms, dt, world, &mut holding);
        self.overdue(now_ms, dt, world, &mut holding);
        // A condition not seen this sample has ended.
        self.open.retain(|key, _| holding.contains(key));
    }

    fn remember(&mut self, now_ms: u64, world: &World) {
        for pod in &world.pods {
            if let Some(id) = &pod.reclaim_id {
                let ids = self.reclaim_ids.entry(pod.uid.clone()).or_default();
                if ids.last().is_none_or(|(_, last)| last != id) {
                    ids.push((now_ms, id.clone()));
                }
            }
            self.last_seen.insert(pod.key.clone(), pod.clone());
        }
    }

    fn quotas(
        &mut self,
        now_ms: u64,
        dt: u64,
        world: &World,
        holding: &mut BTreeSet<(Rule, String)>,
    ) {
        let usages: Vec<(u64, u64)> = world.queues.iter().map(|q| world.usage(q)).collect();
        for (index, queue) in world.queues.iter().enumerate() {
            let (held, asked) = usages[index];
            if held > queue.ceiling {
                let detail = format!("holds {held} GPUs, ceiling {}", queue.ceiling);
                let objects = vec![queue.name.clone()];
                self.track(
                    now_ms,
                    Finding::new(Rule::AboveCeiling, &queue.name, objects, detail),
                    None,
                    holding,
                );
            }
            let entitled = queue.guarantee.min(asked);
            let borrowers: Vec<String> = world
                .queues
                .iter()
                .zip(&usages)
                .enumerate()
                .filter(|(other, (q, (held, _)))| *other != index && *held > q.guarantee)
                .map(|(_, (q, _))| q.name.clone())
                .collect();
            if held < entitled && !borrowers.is_empty() {
                let allowance = queue.budget_ms + millis(self.allowances.budget_slack);
                let detail = format!(
                    "holds {held} of the {entitled} GPUs it is entitled to while {} borrow",
                    borrowers.join(", ")
                );
                let mut objects = vec![queue.name.clone()];
                objects.extend(borrowers);
                self.track(
                    now_ms,
                    Finding::new(Rule::BelowGuarantee, &queue.name, objects, detail),
                    Some((dt, allowance)),
                    holding,
                );
            }
        }
    }

    fn nodes(&mut self, now_ms: u64, world: &World, holding: &mut BTreeSet<(Rule, String)>) {
        for node in &world.nodes {
            let on_node: Vec<&PodView> = world
                .pods
                .iter()
                .filter(|p| p.holds() && p.node.as_deref() == Some(node.name.as_str()))
                .collect();
            let held: u64 = on_node.iter().map(|p| p.gpus).sum();
            if held > node.gpus {
                let mut objects = vec![node.name.clone()];
                objects.extend(on_node.iter().filter(|p| p.gpus > 0).map(|p| p.key.clone()));
                let detail = format!("bound pods hold {held} GPUs of its {}", node.gpus);
                self.track(
                    now_ms,
                    Finding::new(Rule::GpuCountedTwice, &node.name, objects, detail),
                    None,
                    holding,
                );
            }
        }
    }

    fn gated(
        &mut self,
        now_ms: u64,
        dt: u64,
        world: &World,
        holding: &mut BTreeSet<(Rule, String)>,
    ) {
        let allowance = millis(self.allowances.first_reason + self.allowances.pass);
        for pod in &world.pods {
            let managed = world.queue_of(&pod.namespace).is_some();
            if managed && pod.gated && pod.asks() && !pod.has_waiting_reason {
                let detail = "gated with no gpuqueue.io/waiting-reason".to_owned();
                let finding = Finding::new(
                    Rule::GatedWithoutReason,
                    &pod.uid,
                    vec![pod.key.clone()],
                    detail,
                );
                self.track(now_ms, finding, Some((dt, allowance)), holding);
            }
        }
    }

    fn overdue(
        &mut self,
        now_ms: u64,
        dt: u64,
        world: &World,
        holding: &mut BTreeSet<(Rule, String)>,
    ) {
        let allowance = millis(self.allowances.handover_grace);
        for queue in &world.queues {
            for reclaim in queue.in_flight.iter().filter(|r| now_ms > r.deadline_ms) {
                let objects = vec![
                    reclaim.id.clone(),
                    queue.name.clone(),
                    reclaim.owner_pod.clone(),
                ];
                let detail = format!(
                    "in flight past its deadline ({} ms ago)",
                    now_ms - reclaim.deadline_ms
                );
                let finding = Finding::new(Rule::HandoverOverdue, &reclaim.id, objects, detail);
                self.track(now_ms, finding, Some((dt, allowance)), holding);
            }
        }
    }

    /// Notes that `finding` holds: a safety rule (`liveness` `None`) is a violation at once, a
    /// liveness rule (`(dt, allowance)`) once its unexcused time passes its allowance. Each
    /// episode is reported once.
    fn track(
        &mut self,
        now_ms: u64,
        finding: Finding,
        liveness: Option<(u64, u64)>,
        holding: &mut BTreeSet<(Rule, String)>,
    ) {
        let Finding {
            rule,
            subject,
            objects,
            detail,
        } = finding;
        let key = (rule, subject);
        holding.insert(key.clone());
        let episode = self.open.entry(key).or_insert(Episode {
            first_ms: now_ms,
            unexcused_ms: 0,
            reported: false,
        });
        let due = match liveness {
            None => true,
            Some((dt, allowance_ms)) => {
                // Time counts from the episode's first sample, not the one before it.
                if episode.first_ms < now_ms {
                    episode.unexcused_ms += dt;
                }
                episode.unexcused_ms > allowance_ms
            }
        };
        if due && !episode.reported {
            episode.reported = true;
            self.violations.push(InvariantViolation {
                rule,
                at_ms: episode.first_ms,
                objects,
                detail,
                lasted_ms: episode.unexcused_ms,
            });
        }
    }

    /// Checks one accepted eviction (or operator deletion) against the world as last sampled.
    pub fn evicted(&mut self, eviction: &Eviction, world: &World) {
        self.tally.evictions += 1;
        let Some(victim) = world
            .pods
            .iter()
            .find(|p| p.key == eviction.pod)
            .or_else(|| self.last_seen.get(&eviction.pod))
            .cloned()
        else {
            return; // never seen: not a pod the checker knows a queue of
        };
        let count = self.evicted.entry(victim.uid.clone()).or_insert(0);
        *count += 1;
        if *count == 2 {
            self.violations.push(InvariantViolation {
                rule: Rule::EvictedTwice,
                at_ms: eviction.at_ms,
                objects: vec![victim.key.clone(), victim.uid.clone()],
                detail: format!("a second accepted {} of the same pod", eviction.verb),
                lasted_ms: 0,
            });
            return;
        }
        if *count > 2 {
            return;
        }
        if victim.reclaim_owner && victim.node.is_none() {
            self.tally.requeued_owners += 1;
            return;
        }
        let Some(queue) = world.queue_of(&victim.namespace) else {
            return;
        };
        // Borrowing is a matter of quota, not of binding: the admitted pods the scheduler has
        // not bound yet count, as they do for the operator.
        let kept: u64 = world
            .pods_of(queue)
            .filter(|p| {
                p.holds_quota() && p.uid != victim.uid && !self.evicted.contains_key(&p.uid)
            })
            .map(|p| p.gpus)
            .sum();
        if kept < queue.guarantee {
            self.violations.push(InvariantViolation {
                rule: Rule::EvictedNotBorrower,
                at_ms: eviction.at_ms,
                objects: vec![victim.key.clone(), queue.name.clone()],
                detail: format!(
                    "{} keeps {kept} GPUs without it, below its guarantee of {}",
                    queue.name, queue.guarantee
                ),
                lasted_ms: 0,
            });
        }
    }

    /// Checks the checkpoint calls: at most one per victim and reclaim. A call belongs to the
    /// reclaim the pod was last seen with before it (the annotation is written before the call;
    /// the watch may show it up to `lag` later).
    pub fn checkpoints(&mut self, calls: &[CheckpointCall], lag: Duration) {
        self.tally.checkpoint_calls += calls.len();
        let mut seen: BTreeMap<(String, String), Vec<&CheckpointCall>> = BTreeMap::new();
        for call in calls {
            let reclaim = self
                .reclaim_ids
                .get(&call.uid)
                .and_then(|ids| {
                    ids.iter()
                        .rev()
                        .find(|(since, _)| *since <= call.at_ms + millis(lag))
                })
                .map_or_else(|| "(no reclaim id seen)".to_owned(), |(_, id)| id.clone());
            seen.entry((call.uid.clone(), reclaim))
                .or_default()
                .push(call);
        }
        for ((uid, reclaim), calls) in seen {
            if calls.len() > 1 {
                self.violations.push(InvariantViolation {
                    rule: Rule::CheckpointTwice,
                    at_ms: calls[1].at_ms,
                    objects: vec![calls[0].pod.clone(), uid, reclaim],
                    detail: format!("{} checkpoint calls in one reclaim", calls.len()),
                    lasted_ms: 0,
                });
            }
        }
    }

    pub fn violations(&self) -> &[InvariantViolation] {
        &self.violations
    }

    pub fn finish(self) -> (Vec<InvariantViolation>, Tally) {
        (self.violations, self.tally)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::world::{InFlightView, NodeView, QueueView};

    /// A bound (or not), running pod of one GPU in namespace `ns`.
    fn pod(ns: &str, name: &str, node: Option<&str>) -> PodView {
        PodView {
            key: format!("{ns}/{name}"),
            uid: format!("uid-{ns}-{name}"),
            namespace: ns.to_owned(),
            node: node.map(str::to_owned),
            gpus: 1,
            ..PodView::default()
        }
    }

    fn queue(name: &str, guarantee: u64, ceiling: u64) -> QueueView {
        QueueView {
            name: name.to_owned(),
            namespaces: vec![name.to_owned()],
            guarantee,
            ceiling,
            budget_ms: 3000,
            in_flight: Vec::new(),
        }
    }

    fn world(pods: Vec<PodView>, queues: Vec<QueueView>) -> World {
        World {
            pods,
            queues,
            nodes: vec![NodeView {
                name: "n".to_owned(),
                gpus: 8,
            }],
        }
    }

    fn rules_of(violations: &[InvariantViolation]) -> Vec<Rule> {
        violations.iter().map(|v| v.rule).collect()
    }

    /// Samples `world` every 100 ms from 0 to `until_ms`, excused or not.
    fn run(world: &World, until_ms: u64, excused: bool) -> Rules {
        let mut rules = Rules::new(Allowances::default());
        for at in (0..=until_ms).step_by(100) {
            rules.sample(1_000_000 + at, excused, world);
        }
        rules
    }

    #[test]
    fn a_queue_above_its_ceiling_is_a_violation_at_once_and_at_it_is_not() {
        let at = world(
            vec![pod("a", "p1", Some("n")), pod("a", "p2", Some("n"))],
            vec![queue("a", 1, 2)],
        );
        assert!(run(&at, 0, false).violations().is_empty());
        let above = world(
            vec![
                pod("a", "p1", Some("n")),
                pod("a", "p2", Some("n")),
                pod("a", "p3", Some("n")),
            ],
            vec![queue("a", 1, 2)],
        );
        // Excused or not: a safety rule.
        let rules = run(&above, 1000, true);
        assert_eq!(
            rules_of(rules.violations()),
            [Rule::AboveCeiling],
            "one report per episode"
        );
        assert_eq!(rules.violations()[0].objects, ["a"]);
    }

    #[test]
    fn an_owner_short_of_its_guarantee_while_another_borrows_is_a_violation_past_budget_and_slack()
    {
        let pods = vec![
            pod("owner", "o1", Some("n")),
            pod("owner", "o2", None),
            pod("borrower", "b1", Some("n")),
            pod("borrower", "b2", Some("n")),
        ];
        let short = world(
            pods.clone(),
            vec![queue("owner", 2, 2), queue("borrower", 1, 4)],
        );
        // Budget 3 s + slack 2 s: 4.9 s is within, 5.2 s is not.
        assert!(run(&short, 4900, false).violations().is_empty());
        let late = run(&short, 5200, false);
        assert_eq!(rules_of(late.violations()), [Rule::BelowGuarantee]);
        assert_eq!(late.violations()[0].objects, ["owner", "borrower"]);
        // Excused time does not count.
        assert!(run(&short, 10_000, true).violations().is_empty());
        // Nobody borrows: admission catching up, not a reclaim owed.
        let alone = world(
            pods[..3].to_vec(),
            vec![queue("owner", 2, 2), queue("borrower", 1, 4)],
        );
        assert!(run(&alone, 10_000, false).violations().is_empty());
    }

    #[test]
    fn a_node_whose_bound_pods_hold_more_than_its_gpus_counts_a_gpu_twice() {
        let mut pods: Vec<PodView> = (0..8)
            .map(|i| pod("a", &format!("p{i}"), Some("n")))
            .collect();
        let full = world(pods.clone(), vec![queue("a", 8, 9)]);
        assert!(run(&full, 0, false).violations().is_empty());
        // A terminating victim still holds its GPU: a pod bound in its place is one too many.
        pods[0].deleting = true;
        pods.push(pod("a", "replacement", Some("n")));
        let rules = run(&world(pods, vec![queue("a", 8, 9)]), 0, false);
        assert_eq!(rules_of(rules.violations()), [Rule::GpuCountedTwice]);
        assert_eq!(rules.violations()[0].objects.len(), 1 + 9);
    }

    #[test]
    fn a_pod_evicted_twice_is_a_violation() {
        let w = world(
            vec![pod("b", "b1", Some("n")), pod("b", "b2", Some("n"))],
            vec![queue("b", 1, 2)],
        );
        let mut rules = run(&w, 0, false);
        let evict = |at_ms| Eviction {
            at_ms,
            pod: "b/b1".to_owned(),
            verb: "evict",
        };
        rules.evicted(&evict(1), &w);
        assert!(rules.violations().is_empty(), "{:?}", rules.violations());
        rules.evicted(&evict(2), &w);
        assert_eq!(rules_of(rules.violations()), [Rule::EvictedTwice]);
    }

    #[test]
    fn evicting_a_pod_its_queue_needs_for_its_guarantee_is_evicting_a_non_borrower() {
        let w = world(
            vec![
                pod("b", "b1", Some("n")),
                pod("b", "b2", Some("n")),
                pod("b", "b3", Some("n")),
            ],
            vec![queue("b", 2, 3)],
        );
        let mut rules = run(&w, 0, false);
        let evict = |pod: &str| Eviction {
            at_ms: 1,
            pod: pod.to_owned(),
            verb: "evict",
        };
        rules.evicted(&evict("b/b1"), &w);
        assert!(rules.violations().is_empty(), "the one borrowed GPU may go");
        // The watch still shows b1 bound; it counts as gone all the same.
        rules.evicted(&evict("b/b2"), &w);
        assert_eq!(rules_of(rules.violations()), [Rule::EvictedNotBorrower]);
        assert_eq!(rules.violations()[0].objects, ["b/b2", "b"]);
    }

    /// The soak's first run reported victims of queues that held their guarantee in quota, most
    /// of it admitted and not yet bound: such a victim is a borrower; gated pods are not quota.
    #[test]
    fn admitted_pods_not_yet_bound_count_toward_the_guarantee_and_gated_ones_do_not() {
        let mut pods: Vec<PodView> = (1..=3)
            .map(|i| pod("b", &format!("bound{i}"), Some("n")))
            .collect();
        pods.extend((1..=5).map(|i| pod("b", &format!("admitted{i}"), None)));
        let w = world(pods.clone(), vec![queue("b", 7, 10)]);
        let mut rules = run(&w, 0, false);
        let eviction = Eviction {
            at_ms: 1,
            pod: "b/admitted1".to_owned(),
            verb: "evict",
        };
        rules.evicted(&eviction, &w);
        assert!(
            rules.violations().is_empty(),
            "8 in quota, guarantee 7: one borrows"
        );

        for pod in &mut pods[3..] {
            pod.gated = true;
        }
        pods[3].gated = false;
        let w = world(pods, vec![queue("b", 7, 10)]);
        let mut rules = run(&w, 0, false);
        rules.evicted(&eviction, &w);
        assert_eq!(rules_of(rules.violations()), [Rule::EvictedNotBorrower]);
        assert_eq!(
            rules.violations()[0].detail,
            "b keeps 3 GPUs without it, below its guarantee of 7"
        );
    }

    #[test]
    fn an_unbound_owner_evicted_to_be_planned_again_is_no_victim_and_a_bound_one_is() {
        let mut owner = pod("o", "o1", None);
        owner.reclaim_owner = true;
        owner.reclaim_id = Some("r1".to_owned());
        let w = world(vec![owner.clone()], vec![queue("o", 4, 4)]);
        let mut rules = run(&w, 0, false);
        let eviction = Eviction {
            at_ms: 1,
            pod: "o/o1".to_owned(),
            verb: "evict",
        };
        rules.evicted(&eviction, &w);
        assert!(rules.violations().is_empty());

        owner.uid = "uid-o-o1-bound".to_owned();
        owner.node = Some("n".to_owned());
        let w = world(vec![owner], vec![queue("o", 4, 4)]);
        let mut rules = run(&w, 0, false);
        rules.evicted(&eviction, &w);
        assert_eq!(rules_of(rules.violations()), [Rule::EvictedNotBorrower]);
        assert_eq!(rules.finish().1.requeued_owners, 0);
    }

    #[test]
    fn a_victim_gone_before_its_audit_line_is_read_is_still_checked() {
        let before = world(vec![pod("b", "b1", Some("n"))], vec![queue("b", 1, 2)]);
        let mut rules = run(&before, 0, false);
        let after = world(Vec::new(), vec![queue("b", 1, 2)]);
        rules.sample(2_000_000, false, &after);
        let eviction = Eviction {
            at_ms: 1,
            pod: "b/b1".to_owned(),
            verb: "evict",
        };
        rules.evicted(&eviction, &after);
        assert_eq!(rules_of(rules.violations()), [Rule::EvictedNotBorrower]);
    }

    #[test]
    fn two_checkpoint_calls_in_one_reclaim_are_a_violation_and_one_per_reclaim_is_not() {
        let mut victim = pod("b", "b1", Some("n"));
        victim.reclaim_id = Some("r1".to_owned());
        let mut rules = Rules::new(Allowances::default());
        rules.sample(
            1000,
            false,
            &world(vec![victim.clone()], vec![queue("b", 0, 2)]),
        );
        victim.reclaim_id = Some("r2".to_owned());
        rules.sample(
            5000,
            false,
            &world(vec![victim.clone()], vec![queue("b", 0, 2)]),
        );
        let call = |at_ms| CheckpointCall {
            pod: victim.key.clone(),
            uid: victim.uid.clone(),
            at_ms,
        };
        let lag = Duration::from_millis(500);
        rules.checkpoints(&[call(1100), call(5100)], lag);
        assert!(rules.violations().is_empty(), "{:?}", rules.violations());
        rules.checkpoints(&[call(5200), call(5300)], lag);
        assert_eq!(rules_of(rules.violations()), [Rule::CheckpointTwice]);
        assert_eq!(rules.violations()[0].objects[2], "r2");
    }

    #[test]
    fn a_gated_pod_without_a_reason_past_the_first_reason_delay_and_a_pass_is_a_violation() {
        let mut gated = pod("a", "waiting", None);
        gated.gated = true;
        let w = world(vec![gated.clone()], vec![queue("a", 1, 1)]);
        // 1 s first-reason delay + 2 s pass.
        assert!(run(&w, 2900, false).violations().is_empty());
        assert_eq!(
            rules_of(run(&w, 3200, false).violations()),
            [Rule::GatedWithoutReason]
        );
        gated.has_waiting_reason = true;
        let explained = world(vec![gated.clone()], vec![queue("a", 1, 1)]);
        assert!(run(&explained, 10_000, false).violations().is_empty());
        // Outside any queue's namespaces, the gate is not gpuqueue's to explain.
        gated.has_waiting_reason = false;
        let unmanaged = world(vec![gated], vec![queue("other", 1, 1)]);
        assert!(run(&unmanaged, 10_000, false).violations().is_empty());
    }

    #[test]
    fn a_reclaim_in_flight_past_its_deadline_and_the_grace_is_overdue() {
        let mut q = queue("owner", 1, 1);
        q.in_flight.push(InFlightView {
            id: "r1".to_owned(),
            owner_pod: "owner/o1".to_owned(),
            deadline_ms: 1_000_000 + 1000,
        });
        let w = world(Vec::new(), vec![q]);
        // Deadline at 1 s, grace 5 s.
        assert!(run(&w, 5900, false).violations().is_empty());
        let late = run(&w, 6300, false);
        assert_eq!(rules_of(late.violations()), [Rule::HandoverOverdue]);
        assert_eq!(late.violations()[0].objects, ["r1", "owner", "owner/o1"]);
        assert!(run(&w, 20_000, true).violations().is_empty());
    }

    #[test]
    fn an_episode_that_ends_starts_afresh() {
        let mut gated = pod("a", "waiting", None);
        gated.gated = true;
        let waiting = world(vec![gated], vec![queue("a", 1, 1)]);
        let admitted = world(vec![pod("a", "waiting", Some("n"))], vec![queue("a", 1, 1)]);
        let mut rules = Rules::new(Allowances::default());
        for round in 0..3 {
            let base = round * 10_000;
            for at in (0..=2000).step_by(100) {
                rules.sample(base + at, false, &waiting);
            }
            rules.sample(base + 2100, false, &admitted);
        }
        assert!(rules.violations().is_empty(), "{:?}", rules.violations());
    }
}
