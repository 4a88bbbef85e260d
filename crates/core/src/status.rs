//! Queue status: the numbers `kubectl get gq` shows and the conditions that explain them,
//! computed from a snapshot (and, for `ReclaimBudgetExceeded`, from what the reclaim executor
//! knows about handovers: [`HandoverBudgets`]), plus the mapping onto the API's
//! `GpuQueueStatus`.
//!
//! `lent` answers "whose idle guarantee are the borrowers using?": borrowers first use capacity
//! nobody is guaranteed; the rest comes out of the queues' idle lendable guarantees, shared in
//! proportion to them (largest remainder, ties by queue name, so it is deterministic).

use std::collections::HashMap;
use std::time::Duration;

use gpuqueue_api::conditions::{reasons, types};
use gpuqueue_api::v1alpha1::{GpuQueueStatus, ResourceStatus, StatusSummary};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::ids::{QueueId, ResourceId};
use crate::model::{QueueError, ReclaimRole, format_duration};
use crate::quantity::{Milli, ResourceName};
use crate::reclaim::BudgetFit;
use crate::snapshot::Snapshot;

/// One queue's status.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueReport {
    pub queue: String,
    pub generation: Option<i64>,
    /// One entry per resource the spec lists or the queue's pods use, by resource name.
    pub resources: Vec<ResourceReport>,
    pub admitted_pods: u32,
    pub pending_pods: u32,
    /// Pods that hold capacity without gpuqueue's admission (see [`crate::enforcement`]).
    pub unadmitted_pods: u32,
    pub conditions: Vec<ConditionReport>,
}

/// One queue's numbers for one resource, in milli-units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceReport {
    pub resource: ResourceName,
    pub guaranteed: Milli,
    pub ceiling: Milli,
    pub allocated: Milli,
    pub borrowed: Milli,
    pub lent: Milli,
    pub pending: Milli,
    /// Whether the spec lists the resource (pods that bypassed the gate may use others).
    pub in_spec: bool,
}

/// A condition without timestamps (see [`QueueReport::conditions_at`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionReport {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

/// What the reclaim executor knows about handovers against their owner queue's budget, which
/// the snapshot does not hold: the plans of handovers in flight and the last finished ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HandoverBudgets {
    /// Handovers in flight whose plan does not fit the budget, by owner queue.
    pub planned: HashMap<String, Vec<PlannedHandover>>,
    /// The newest finished handover of each owner queue.
    pub last: HashMap<String, FinishedHandover>,
}

/// A handover in flight whose plan does not fit its budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedHandover {
    pub id: String,
    /// `namespace/name` of the owner pod.
    pub owner: String,
    pub budget: Duration,
    pub fit: BudgetFit,
}

/// A finished handover, from its record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinishedHandover {
    pub id: String,
    pub budget: Duration,
    /// From the owner found blocked to the owner bound (or the end of the record).
    pub took: Duration,
}

/// The status of every queue in the snapshot, in name order; `budgets` are the executor's.
pub fn queue_reports(snapshot: &Snapshot, budgets: &HandoverBudgets) -> Vec<QueueReport> {
    let lent = lent_by_queue(snapshot);
    let tallies = PodTally::of_every_queue(snapshot);
    snapshot
        .queue_ids()
        .zip(tallies)
        .map(|(q, tally)| {
            let spec = snapshot.queue(q);
            let mut resources: Vec<ResourceReport> = snapshot
                .usage(q)
                .iter()
                .map(|u| ResourceReport {
                    resource: snapshot.resource_name(u.resource()).clone(),
                    guaranteed: u.guaranteed,
                    ceiling: u.ceiling(),
                    allocated: u.allocated,
                    borrowed: u.borrowed(),
                    lent: lent.get(&(q, u.resource())).copied().unwrap_or_default(),
                    pending: u.pending,
                    in_spec: u.in_spec,
                })
                .collect();
            resources.sort_by(|a, b| a.resource.cmp(&b.resource));
            let (admitted_pods, pending_pods) = snapshot.pod_counts(q);
            QueueReport {
                queue: spec.name.clone(),
                generation: spec.generation,
                resources,
                admitted_pods,
                pending_pods,
                unadmitted_pods: tally.unadmitted.pods,
                conditions: conditions(snapshot, q, &tally, budgets),
            }
        })
        .collect()
}

/// Lent capacity per (queue, resource).
fn lent_by_queue(snapshot: &Snapshot) -> std::collections::HashMap<(QueueId, ResourceId), Milli> {
    let mut lent = std::collections::HashMap::new();
    for (i, _) in snapshot.resources().iter().enumerate() {
        let resource = ResourceId::at(i);
        let usages: Vec<(QueueId, &crate::ledger::ResourceUsage)> = snapshot
            .queue_ids()
            .filter_map(|q| Some((q, snapshot.usage_of(q, resource)?)))
            .collect();
        let borrowed: Milli = usages.iter().map(|(_, u)| u.borrowed()).sum();
        let guaranteed: Milli = usages.iter().map(|(_, u)| u.guaranteed).sum();
        let unguaranteed = snapshot
            .capacity(resource)
            .saturating_sub(guaranteed)
            .saturating_sub(snapshot.unmanaged(resource));
        let lendable: Vec<(QueueId, u64)> = usages
            .iter()
            .map(|(q, u)| (*q, u.idle_lendable().0))
            .filter(|(_, l)| *l > 0)
            .collect();
        let total_lendable: u64 = lendable.iter().map(|(_, l)| l).sum();
        let to_share = borrowed.saturating_sub(unguaranteed).0.min(total_lendable);
        if to_share == 0 {
            continue;
        }
        // Largest remainder: floor shares, then one milli each to the largest remainders.
        let mut shares: Vec<(QueueId, u64, u64)> = lendable
            .iter()
            .map(|(q, l)| {
                let exact = u128::from(to_share) * u128::from(*l);
                let total = u128::from(total_lendable);
                let floor = u64::try_from(exact / total).unwrap_or(u64::MAX);
                let remainder = u64::try_from(exact % total).unwrap_or(0);
                (*q, floor, remainder)
            })
            .collect();
        let mut remaining = to_share - shares.iter().map(|(_, f, _)| f).sum::<u64>();
        let mut order: Vec<usize> = (0..shares.len()).collect();
        order.sort_by(|a, b| {
            shares[*b]
                .2
                .cmp(&shares[*a].2)
                .then(shares[*a].0.cmp(&shares[*b].0))
        });
        for i in order {
            if remaining == 0 {
                break;
            }
            shares[i].1 += 1;
            remaining -= 1;
        }
        for (q, amount, _) in shares {
            lent.insert((q, resource), Milli(amount));
        }
    }
    lent
}

fn conditions(
    snapshot: &Snapshot,
    q: QueueId,
    tally: &PodTally,
    budgets: &HandoverBudgets,
) -> Vec<ConditionReport> {
    let conflicts = snapshot.namespace_conflicts(q);
    let ready = if conflicts.is_empty() {
        ConditionReport {
            type_: types::READY,
            status: true,
            reason: reasons::ADMITTING,
            message: "the spec is valid and pods of this queue are being admitted".into(),
        }
    } else {
        ConditionReport {
            type_: types::READY,
            status: true,
            reason: reasons::ADMITTING,
            message: "the spec is valid; pods in namespaces claimed by other queues too wait (see NamespaceConflict)".into(),
        }
    };
    let conflict = if conflicts.is_empty() {
        ConditionReport {
            type_: types::NAMESPACE_CONFLICT,
            status: false,
            reason: reasons::NO_CONFLICT,
            message: "no other queue claims this queue's namespaces".into(),
        }
    } else {
        let list: Vec<String> = conflicts
            .iter()
            .map(|(ns, others)| format!("namespace {ns} is also claimed by {}", others.join(", ")))
            .collect();
        ConditionReport {
            type_: types::NAMESPACE_CONFLICT,
            status: true,
            reason: reasons::NAMESPACE_CONFLICT,
            message: format!(
                "{}; pods there are not admitted until one queue claims it",
                list.join("; ")
            ),
        }
    };
    vec![
        ready,
        overcommitted(snapshot, q),
        conflict,
        reclaiming(tally),
        quota_bypass(&tally.unadmitted),
        reclaim_budget(&snapshot.queue(q).name, budgets),
    ]
}

/// Whether the guarantees of all queues exceed the cluster's capacity, for the resources of
/// this queue.
fn overcommitted(snapshot: &Snapshot, q: QueueId) -> ConditionReport {
    let mut over = Vec::new();
    let mut fit = Vec::new();
    for usage in snapshot.usage(q).iter().filter(|u| u.in_spec) {
        let resource = usage.resource();
        let guaranteed: Milli = snapshot
            .queue_ids()
            .filter_map(|q| snapshot.usage_of(q, resource))
            .map(|u| u.guaranteed)
            .sum();
        let capacity = snapshot.capacity(resource);
        let unmanaged = snapshot.unmanaged(resource);
        let name = snapshot.resource_name(resource);
        if guaranteed + unmanaged > capacity {
            let held = if unmanaged > Milli::ZERO {
                format!(", of which pods of no queue hold {unmanaged}")
            } else {
                String::new()
            };
            over.push(format!(
                "{name}: the guarantees of all queues add up to {guaranteed} but the cluster has {capacity}{held}"
            ));
        } else {
            fit.push(format!("{name}: guarantees {guaranteed} of {capacity}"));
        }
    }
    if over.is_empty() {
        ConditionReport {
            type_: types::OVERCOMMITTED,
            status: false,
            reason: reasons::GUARANTEES_FIT,
            message: if fit.is_empty() {
                "no guarantees".into()
            } else {
                fit.join("; ")
            },
        }
    } else {
        ConditionReport {
            type_: types::OVERCOMMITTED,
            status: true,
            reason: reasons::GUARANTEES_EXCEED_CAPACITY,
            message: format!(
                "{}; not every guarantee can be honoured at once",
                over.join("; ")
            ),
        }
    }
}

/// Whether pods of this queue take part in a reclaim under way (from their reclaim marks).
fn reclaiming(tally: &PodTally) -> ConditionReport {
    let PodTally {
        owners, victims, ..
    } = *tally;
    if owners + victims == 0 {
        ConditionReport {
            type_: types::RECLAIMING,
            status: false,
            reason: reasons::IDLE,
            message: "no reclaim is under way for or from this queue".into(),
        }
    } else {
        ConditionReport {
            type_: types::RECLAIMING,
            status: true,
            reason: reasons::HANDOVER_IN_PROGRESS,
            message: format!(
                "{owners} pod(s) of this queue are receiving reclaimed GPUs; {victims} are being evicted"
            ),
        }
    }
}

/// Whether a handover to this queue's pods is planned beyond its budget (the worst one in
/// flight: an overrun before a cut checkpoint), or else whether the last one overran.
fn reclaim_budget(queue: &str, budgets: &HandoverBudgets) -> ConditionReport {
    let planned = budgets.planned.get(queue).map_or(&[][..], Vec::as_slice);
    let worst = planned
        .iter()
        .filter_map(|p| match p.fit {
            BudgetFit::Overruns { by } => Some(((1, by), p)),
            BudgetFit::CheckpointCut { allowed, timeout } => {
                Some(((0, timeout.saturating_sub(allowed)), p))
            }
            BudgetFit::Fits => None,
        })
        .max_by_key(|(key, _)| *key)
        .and_then(|(_, p)| planned_beyond(p, planned.len() - 1));
    if let Some(report) = worst {
        return report;
    }
    let report = |status, reason, message| ConditionReport {
        type_: types::RECLAIM_BUDGET_EXCEEDED,
        status,
        reason,
        message,
    };
    match budgets.last.get(queue) {
        Some(last) if last.took > last.budget => report(
            true,
            reasons::LAST_HANDOVER_OVERRAN,
            format!(
                "the last handover, {}, took {} of its budget {}; see its record in status.lastHandovers for the phase that overran",
                last.id,
                format_duration(last.took),
                format_duration(last.budget)
            ),
        ),
        Some(last) => report(
            false,
            reasons::WITHIN_BUDGET,
            format!(
                "no handover in flight is planned beyond the budget; the last one, {}, took {} of {}",
                last.id,
                format_duration(last.took),
                format_duration(last.budget)
            ),
        ),
        None => report(
            false,
            reasons::WITHIN_BUDGET,
            "no handover in flight is planned beyond the budget".into(),
        ),
    }
}

/// The condition for a handover in flight planned beyond its budget (`None`: it fits), with
/// how many `others` are in flight beyond it.
fn planned_beyond(p: &PlannedHandover, others: usize) -> Option<ConditionReport> {
    let others = match others {
        0 => String::new(),
        n => format!(" ({n} more handover(s) in flight are planned beyond it too)"),
    };
    let budget = format_duration(p.budget);
    let (reason, message) = match p.fit {
        BudgetFit::Fits => return None,
        BudgetFit::Overruns { by } => (
            reasons::OVERRUN_PLANNED,
            format!(
                "handover {} to {} will overrun the budget {budget} by {}: its victims' termination and the bind need more than the budget, even with no checkpoint{others}; raise spec.reclaim.budget here or lower victimGracePeriodSeconds of the victims' queues",
                p.id,
                p.owner,
                format_duration(by)
            ),
        ),
        BudgetFit::CheckpointCut { allowed, timeout } => (
            reasons::CHECKPOINT_CUT,
            format!(
                "handover {} to {}: the budget {budget} leaves the victims' checkpoint {} of its {} timeout after their termination and the bind{others}; raise spec.reclaim.budget here, or lower checkpoint.timeout or victimGracePeriodSeconds of the victims' queues",
                p.id,
                p.owner,
                format_duration(allowed),
                format_duration(timeout)
            ),
        ),
    };
    Some(ConditionReport {
        type_: types::RECLAIM_BUDGET_EXCEEDED,
        status: true,
        reason,
        message,
    })
}

/// A queue's unadmitted pods: how many, and what they hold by resource (sorted).
#[derive(Debug, Default)]
struct Unadmitted {
    pods: u32,
    held: Vec<(ResourceName, Milli)>,
}

/// What one queue's pods are doing, counted for every queue in one scan of the pods (a scan
/// per queue was most of a status report at 50 queues and 10,000 pods).
#[derive(Debug, Default)]
struct PodTally {
    /// Pods marked as a reclaim's owner, and as its victims.
    owners: u32,
    victims: u32,
    unadmitted: Unadmitted,
}

impl PodTally {
    /// One tally per queue, by queue id.
    fn of_every_queue(snapshot: &Snapshot) -> Vec<Self> {
        let mut tallies: Vec<Self> = snapshot.queue_ids().map(|_| Self::default()).collect();
        for pod in snapshot.pod_ids() {
            let (Some(q), Some(p)) = (snapshot.pod_queue(pod), snapshot.pod(pod)) else {
                continue;
            };
            let tally = &mut tallies[q.index()];
            match p.reclaim.as_ref().map(|m| m.role) {
                Some(ReclaimRole::Owner) => tally.owners += 1,
                Some(ReclaimRole::Victim) => tally.victims += 1,
                None => {}
            }
            if !p.unadmitted {
                continue;
            }
            let unadmitted = &mut tally.unadmitted;
            unadmitted.pods += 1;
            for g in &p.requests.gpus {
                match unadmitted.held.iter_mut().find(|(r, _)| *r == g.resource) {
                    Some((_, m)) => *m += g.total(),
                    None => unadmitted.held.push((g.resource.clone(), g.total())),
                }
            }
        }
        for tally in &mut tallies {
            tally.unadmitted.held.sort();
        }
        tallies
    }
}

/// Whether pods of this queue hold capacity without gpuqueue's admission (see
/// [`crate::enforcement`]): a warning, with how many and what happens to them.
fn quota_bypass(unadmitted: &Unadmitted) -> ConditionReport {
    let Unadmitted { pods, held } = unadmitted;
    if *pods == 0 {
        return ConditionReport {
            type_: types::QUOTA_BYPASS,
            status: false,
            reason: reasons::ALL_ADMITTED,
            message: "every pod of this queue that holds capacity was admitted by gpuqueue".into(),
        };
    }
    let held: Vec<String> = held.iter().map(|(r, m)| format!("{m} {r}")).collect();
    ConditionReport {
        type_: types::QUOTA_BYPASS,
        status: true,
        reason: reasons::UNADMITTED_PODS,
        message: format!(
            "{pods} pod(s) of this queue hold {} without gpuqueue's admission (created while its webhook was down, or before the queue existed); they are charged to the queue and evicted, newest first, while the queue is over its ceiling or holds another queue's guarantee",
            held.join(", ")
        ),
    }
}

/// Whole devices for a status field, rounded up.
fn devices(m: Milli) -> i64 {
    i64::try_from(m.devices_ceil()).unwrap_or(i64::MAX)
}

impl QueueReport {
    /// `status.resources`, in whole devices (a shared fraction counts as a device).
    pub fn resource_statuses(&self) -> Vec<ResourceStatus> {
        self.resources
            .iter()
            .map(|r| ResourceStatus {
                name: r.resource.to_string(),
                guaranteed: devices(r.guaranteed),
                ceiling: devices(r.ceiling),
                allocated: devices(r.allocated),
                borrowed: devices(r.borrowed),
                lent: devices(r.lent),
                pending: devices(r.pending),
            })
            .collect()
    }

    /// `status.summary`: plain numbers for one resource, `gpu=8,mig-1g.10gb=2` for several.
    pub fn summary(&self) -> StatusSummary {
        let column = |value: fn(&ResourceReport) -> Milli| {
            if let [only] = self.resources.as_slice() {
                value(only).to_string()
            } else {
                self.resources
                    .iter()
                    .map(|r| format!("{}={}", r.resource.short(), value(r)))
                    .collect::<Vec<_>>()
                    .join(",")
            }
        };
        StatusSummary {
            guaranteed: column(|r| r.guaranteed),
            ceiling: column(|r| r.ceiling),
            allocated: column(|r| r.allocated),
            borrowed: column(|r| r.borrowed),
            lent: column(|r| r.lent),
            pending: column(|r| r.pending),
        }
    }

    /// The conditions as Kubernetes conditions at `now`; a condition whose status did not
    /// change keeps its `lastTransitionTime` from `previous`.
    pub fn conditions_at(&self, now: Timestamp, previous: &[Condition]) -> Vec<Condition> {
        self.conditions
            .iter()
            .map(|c| to_condition(c, self.generation, now, previous))
            .collect()
    }

    /// The whole status at `now`; handover records and reclaims in flight (the reclaim
    /// executor's) are kept from `previous`.
    pub fn to_status(&self, now: Timestamp, previous: Option<&GpuQueueStatus>) -> GpuQueueStatus {
        GpuQueueStatus {
            observed_generation: self.generation,
            resources: self.resource_statuses(),
            summary: Some(self.summary()),
            admitted_pods: i32::try_from(self.admitted_pods).unwrap_or(i32::MAX),
            pending_pods: i32::try_from(self.pending_pods).unwrap_or(i32::MAX),
            conditions: self.conditions_at(now, previous.map_or(&[], |p| p.conditions.as_slice())),
            last_handovers: previous
                .map(|p| p.last_handovers.clone())
                .unwrap_or_default(),
            reclaims_in_flight: previous
                .map(|p| p.reclaims_in_flight.clone())
                .unwrap_or_default(),
        }
    }
}

fn to_condition(
    c: &ConditionReport,
    generation: Option<i64>,
    now: Timestamp,
    previous: &[Condition],
) -> Condition {
    let status = if c.status { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|p| p.type_ == c.type_ && p.status == status)
        .map_or(Time(now), |p| p.last_transition_time.clone());
    Condition {
        type_: c.type_.to_string(),
        status: status.to_string(),
        reason: c.reason.to_string(),
        message: c.message.clone(),
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// The status of a queue whose spec cannot be used: `Ready=False` with every broken rule,
/// keeping what else was there.
/// Whether a queue condition in this state is bad news an admin should hear as a warning: the
/// queue is not ready, is overcommitted, claims a namespace another queue claims too, or has
/// pods that bypassed admission, or a handover for it does not fit its budget.
pub fn is_warning(condition: &Condition) -> bool {
    match condition.type_.as_str() {
        types::READY => condition.status == "False",
        types::OVERCOMMITTED
        | types::NAMESPACE_CONFLICT
        | types::QUOTA_BYPASS
        | types::RECLAIM_BUDGET_EXCEEDED => condition.status == "True",
        _ => false,
    }
}

pub fn invalid_spec_status(
    error: &QueueError,
    generation: Option<i64>,
    now: Timestamp,
    previous: Option<&GpuQueueStatus>,
) -> GpuQueueStatus {
    let report = ConditionReport {
        type_: types::READY,
        status: false,
        reason: reasons::INVALID_SPEC,
        message: error.to_string(),
    };
    let old = previous.map_or(&[][..], |p| p.conditions.as_slice());
    let mut conditions: Vec<Condition> = old
        .iter()
        .filter(|c| c.type_ != types::READY)
        .cloned()
        .collect();
    conditions.insert(0, to_condition(&report, generation, now, old));
    GpuQueueStatus {
        observed_generation: generation,
        conditions,
        ..previous.cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: String::new(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn a_queue_not_ready_overcommitted_or_in_conflict_is_a_warning() {
        assert!(is_warning(&condition(types::READY, "False")));
        assert!(!is_warning(&condition(types::READY, "True")));
        assert!(is_warning(&condition(types::OVERCOMMITTED, "True")));
        assert!(!is_warning(&condition(types::OVERCOMMITTED, "False")));
        assert!(is_warning(&condition(types::NAMESPACE_CONFLICT, "True")));
        assert!(!is_warning(&condition(types::RECLAIMING, "True")));
        assert!(is_warning(&condition(types::QUOTA_BYPASS, "True")));
        assert!(!is_warning(&condition(types::QUOTA_BYPASS, "False")));
        assert!(is_warning(&condition(
            types::RECLAIM_BUDGET_EXCEEDED,
            "True"
        )));
    }

    fn planned(id: &str, fit: BudgetFit) -> PlannedHandover {
        PlannedHandover {
            id: id.into(),
            owner: "online/o".into(),
            budget: Duration::from_secs(3),
            fit,
        }
    }

    fn last(took: u64) -> FinishedHandover {
        FinishedHandover {
            id: "rc-0".into(),
            budget: Duration::from_secs(3),
            took: Duration::from_millis(took),
        }
    }

    #[test]
    fn the_budget_condition_names_the_worst_handover_in_flight_then_the_last_one() {
        let ms = Duration::from_millis;
        let mut budgets = HandoverBudgets::default();
        let none = reclaim_budget("online", &budgets);
        assert_eq!((none.status, none.reason), (false, reasons::WITHIN_BUDGET));

        budgets.last.insert("online".into(), last(3400));
        let overran = reclaim_budget("online", &budgets);
        assert_eq!(
            (overran.status, overran.reason),
            (true, reasons::LAST_HANDOVER_OVERRAN)
        );
        assert!(
            overran.message.contains("took 3400ms of its budget 3s"),
            "{}",
            overran.message
        );

        let cut = BudgetFit::CheckpointCut {
            allowed: ms(500),
            timeout: ms(1500),
        };
        budgets
            .planned
            .insert("online".into(), vec![planned("rc-1", cut)]);
        let report = reclaim_budget("online", &budgets);
        assert_eq!(
            (report.status, report.reason),
            (true, reasons::CHECKPOINT_CUT)
        );
        assert!(
            report.message.contains("500ms of its 1500ms timeout"),
            "{}",
            report.message
        );

        budgets
            .planned
            .get_mut("online")
            .unwrap()
            .push(planned("rc-2", BudgetFit::Overruns { by: ms(7250) }));
        let report = reclaim_budget("online", &budgets);
        assert_eq!(
            (report.status, report.reason),
            (true, reasons::OVERRUN_PLANNED)
        );
        assert!(
            report
                .message
                .contains("rc-2 to online/o will overrun the budget 3s by 7250ms")
                && report.message.contains("1 more handover(s)"),
            "{}",
            report.message
        );
        // Another queue's handovers are not this queue's.
        assert!(!reclaim_budget("batch", &budgets).status);

        budgets.planned.clear();
        budgets.last.insert("online".into(), last(1900));
        let fine = reclaim_budget("online", &budgets);
        assert_eq!((fine.status, fine.reason), (false, reasons::WITHIN_BUDGET));
        assert!(
            fine.message.contains("took 1900ms of 3s"),
            "{}",
            fine.message
        );
    }
}
