//! The events a handover sends, one function per moment: started, planned beyond its budget,
//! a victim's checkpoint, the Eviction API's refusal, a victim's removal, the end (on the owner
//! and on every queue involved), and a reclaim resumed or abandoned by a later leader. Their
//! reasons and texts are what users and the end-to-end tests read.

use std::collections::BTreeSet;
use std::time::Duration;

use gpuqueue_api::conditions::reasons;
use gpuqueue_core::{
    model::format_duration,
    reclaim::BudgetFit,
    termination::{BIND_RESERVE, MIN_SAMPLES, TERMINATION_PRIOR},
};

use super::{
    evict::{Eviction, Refusal},
    handover::{COMPLETED, Handover, HandoverPod, Victim},
    reclaimer::Reclaimer,
    timeline::millis,
};
use crate::{
    checkpoint::{CheckpointOutcome, CheckpointReport, SkipReason},
    writes::events::Notice,
};

/// The longest the announcement of a handover planned beyond its budget holds the eviction
/// back, waiting for its event to be written first.
const BEFORE_EVICTION: Duration = Duration::from_millis(250);

/// `ns/a (queue q), ns/b (queue q)`.
fn victim_list(handover: &Handover) -> String {
    handover
        .victims
        .iter()
        .map(|v| format!("{} (queue {})", v.target.key, v.queue))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Up to the next 100 ms: a budget an admin can write.
fn round_up(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis().div_ceil(100).try_into().unwrap_or(u64::MAX) * 100)
}

impl Reclaimer {
    pub(super) fn announce_start(&self, handover: &Handover) {
        let mut note = format!(
            "reclaim {}: freeing node {} for this pod by evicting {}, within {}",
            handover.id,
            handover.node,
            victim_list(handover),
            format_duration(handover.timeline.budget)
        );
        if handover.overrides_min_borrow {
            note.push_str(
                "; a victim is younger than its queue's minBorrowDuration, but no plan spares it",
            );
        }
        self.events.send(
            handover.owner.reference.clone(),
            Notice {
                warning: false,
                reason: "Reclaiming",
                action: "Reclaim",
                note,
            },
        );
    }

    /// A handover planned beyond its budget, before its first eviction: on the owner pod
    /// (written before this returns, at most [`BEFORE_EVICTION`]) and on its queue, with the
    /// numbers and what the admin can change.
    pub(super) async fn announce_budget(&self, handover: &Handover) {
        let Some((reason, note)) = self.budget_note(handover) else {
            return;
        };
        let notice = Notice {
            warning: true,
            reason,
            action: "Reclaim",
            note,
        };
        if let Some(queue) = self.queue_ref(&handover.owner_queue) {
            self.events.send(queue, notice.clone());
        }
        self.events
            .send_and_wait(handover.owner.reference.clone(), notice, BEFORE_EVICTION)
            .await;
    }

    /// The reason and text of [`Self::announce_budget`]; `None` for a plan that fits.
    fn budget_note(&self, handover: &Handover) -> Option<(&'static str, String)> {
        let slowest = handover.victims.iter().max_by_key(|v| v.grace)?;
        let budget = format_duration(handover.timeline.budget);
        let queue = &handover.owner_queue;
        let termination = handover.eviction_reserve.saturating_sub(BIND_RESERVE);
        let observed = self.terminations.observed(&handover.node);
        let node_adds = if observed < MIN_SAMPLES {
            format!(
                "{} the operator assumes before it has seen {MIN_SAMPLES} victims go there",
                format_duration(TERMINATION_PRIOR)
            )
        } else {
            format!("what the node added to the last {observed} victims it saw go (p95)")
        };
        let why = format!(
            "the victims' termination takes {} on node {} (victimGracePeriodSeconds {} of queue {}, plus {node_adds}) and the eviction call, the owner's release at the gate and its bind {}",
            format_duration(termination),
            handover.node,
            slowest.grace.as_secs(),
            slowest.queue,
            format_duration(BIND_RESERVE)
        );
        let victims = victim_list(handover);
        match handover.fit {
            BudgetFit::Fits => None,
            BudgetFit::Overruns { by } => Some((
                reasons::OVERRUN_PLANNED,
                format!(
                    "reclaim {}: this handover will overrun the budget {budget} of queue {queue} by {}, before any checkpoint: {why}. It goes ahead (the guarantee wins), evicting {victims} with no checkpoint. To fit, raise spec.reclaim.budget of queue {queue} to at least {}, or lower victimGracePeriodSeconds of queue {}",
                    handover.id,
                    format_duration(by),
                    format_duration(round_up(handover.timeline.budget + by)),
                    slowest.queue
                ),
            )),
            BudgetFit::CheckpointCut { allowed, timeout } => Some((
                reasons::CHECKPOINT_CUT,
                format!(
                    "reclaim {}: the budget {budget} of queue {queue} leaves the checkpoint of {victims} {} of its {} timeout: {why}. To keep the whole checkpoint, raise spec.reclaim.budget of queue {queue} to at least {}, or lower checkpoint.timeout or victimGracePeriodSeconds of queue {}",
                    handover.id,
                    format_duration(allowed),
                    format_duration(timeout),
                    format_duration(round_up(
                        handover.timeline.budget + timeout.saturating_sub(allowed)
                    )),
                    slowest.queue
                ),
            )),
        }
    }

    pub(super) fn announce_checkpoint(
        &self,
        handover: &Handover,
        victim: &Victim,
        report: &CheckpointReport,
    ) {
        // A queue without a checkpoint driver asked for none: the metric and the record say so.
        if matches!(
            report.outcome,
            CheckpointOutcome::Skipped(SkipReason::DriverNone)
        ) {
            return;
        }
        let ok = matches!(report.outcome, CheckpointOutcome::Succeeded(_));
        self.events.send(
            victim.target.reference.clone(),
            Notice {
                warning: !ok,
                reason: if ok {
                    "Checkpointed"
                } else {
                    "CheckpointFailed"
                },
                action: "Checkpoint",
                note: format!(
                    "reclaim {} for {}: checkpoint ({}) {} after {}ms; eviction goes ahead",
                    handover.id,
                    handover.owner.key,
                    report.driver_label(),
                    report.outcome,
                    report.elapsed.as_millis()
                ),
            },
        );
    }

    pub(super) fn announce_refusal(&self, handover: &Handover, victim: &Victim, refusal: &Refusal) {
        let (reason, what) = if refusal.is_budget() {
            (
                "EvictionBlocked",
                "a PodDisruptionBudget refuses the eviction (429)",
            )
        } else if refusal.is_misconfigured() {
            (
                "EvictionMisconfigured",
                "the Eviction API cannot decide (500): more than one PodDisruptionBudget selects this pod",
            )
        } else {
            ("EvictionRefused", "the Eviction API refused")
        };
        tracing::warn!(reclaim = %handover.id, victim = %victim.target.key, status = ?refusal.status, message = %refusal.message, "{what}");
        self.events.send(
            victim.target.reference.clone(),
            Notice {
                warning: true,
                reason,
                action: "Evict",
                note: format!(
                    "reclaim {}: {what}: {}; retried until the handover deadline, then the pod is deleted (borrowed GPUs are reclaimable)",
                    handover.id, refusal.message
                ),
            },
        );
    }

    pub(super) fn announce_eviction(
        &self,
        handover: &Handover,
        victim: &Victim,
        eviction: &Eviction,
    ) {
        let (warning, reason, note) = match eviction {
            Eviction::Evicted { .. } => (
                false,
                "Evicted",
                format!(
                    "reclaim {}: evicted to hand node {} back to {} (queue {}), grace period {}s",
                    handover.id,
                    handover.node,
                    handover.owner.key,
                    handover.owner_queue,
                    victim.grace.as_secs()
                ),
            ),
            Eviction::DeletedAfterRefusal { refusal, refusals } => (
                true,
                "DeletedAfterEvictionRefused",
                format!(
                    "reclaim {}: the Eviction API refused {refusals} time(s) until the handover deadline ({}); deleted instead, grace period {}s, because {} (queue {}) is within its guarantee",
                    handover.id,
                    refusal.message,
                    victim.grace.as_secs(),
                    handover.owner.key,
                    handover.owner_queue
                ),
            ),
            Eviction::Failed { error } => (
                true,
                "EvictionFailed",
                format!("reclaim {}: could not remove the pod: {error}", handover.id),
            ),
            // A spared victim is announced with its intent taken back.
            Eviction::AlreadyGone | Eviction::NotLeader | Eviction::Spared => return,
        };
        self.events.send(
            victim.target.reference.clone(),
            Notice {
                warning,
                reason,
                action: "Evict",
                note,
            },
        );
    }

    pub(super) fn announce_finish(
        &self,
        handover: &Handover,
        outcome: &str,
        victim_queues: &BTreeSet<&str>,
    ) {
        let completed = outcome == COMPLETED;
        let timeline = format!(
            "{} (budget {}ms)",
            handover.timeline.summary(),
            millis(handover.timeline.budget)
        );
        let resumed = if handover.resumed {
            " after a new leader resumed it"
        } else {
            ""
        };
        let victims: Vec<String> = handover
            .victims
            .iter()
            .map(|v| v.target.key.to_string())
            .collect();
        self.events.send(
            handover.owner.reference.clone(),
            Notice {
                warning: !completed,
                reason: if completed {
                    "HandoverCompleted"
                } else {
                    "HandoverIncomplete"
                },
                action: "Reclaim",
                note: format!(
                    "reclaim {} {outcome}{resumed} on node {}: {timeline}",
                    handover.id, handover.node
                ),
            },
        );
        if let Some(queue) = self.queue_ref(&handover.owner_queue) {
            self.events.send(
                queue,
                Notice {
                    warning: !completed,
                    reason: "Reclaimed",
                    action: "Reclaim",
                    note: format!(
                        "reclaim {} for {} from queue(s) {} on node {}: {outcome}; {timeline}",
                        handover.id,
                        handover.owner.key,
                        victim_queues.iter().copied().collect::<Vec<_>>().join(", "),
                        handover.node
                    ),
                },
            );
        }
        for name in victim_queues {
            if let Some(queue) = self.queue_ref(name) {
                self.events.send(
                    queue,
                    Notice {
                        warning: false,
                        reason: "ReclaimedFrom",
                        action: "Reclaim",
                        note: format!(
                            "reclaim {}: borrowed GPUs on node {} handed back to {} (queue {}) by evicting {}: {outcome}",
                            handover.id,
                            handover.node,
                            handover.owner.key,
                            handover.owner_queue,
                            victims.join(", ")
                        ),
                    },
                );
            }
        }
    }

    /// A reclaim an earlier leader started, resumed by this one.
    pub(super) fn announce_resumed(&self, handover: &Handover) {
        self.events.send(
            handover.owner.reference.clone(),
            Notice {
                warning: false,
                reason: "ReclaimResumed",
                action: "Reclaim",
                note: format!(
                    "reclaim {}: the operator that started it stopped; this leader finishes it without repeating a checkpoint or an eviction",
                    handover.id
                ),
            },
        );
    }

    /// A victim a resumed reclaim lists but does not evict: `why` its queue may not lose it.
    pub(super) fn announce_refused_victim(&self, id: &str, victim: &HandoverPod, why: &str) {
        self.events.send(
            victim.reference.clone(),
            Notice {
                warning: true,
                reason: "ReclaimVictimRefused",
                action: "Reclaim",
                note: format!(
                    "reclaim {id}: this pod is not evicted: {why}; the reclaim goes on without it"
                ),
            },
        );
    }

    /// One pod of an abandoned reclaim taken out of it; `note` says how.
    pub(super) fn announce_abandoned(&self, target: &HandoverPod, note: String) {
        self.events.send(
            target.reference.clone(),
            Notice {
                warning: true,
                reason: "ReclaimAbandoned",
                action: "Reclaim",
                note,
            },
        );
    }
}
