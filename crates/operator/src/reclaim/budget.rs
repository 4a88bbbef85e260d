//! Handovers against their owner queue's budget: a handover whose plan cuts the checkpoint or
//! overruns the budget is counted and announced before any victim is evicted, and held
//! ([`super::planned`]) while it runs, for the owner queue's `ReclaimBudgetExceeded` condition
//! (which the core computes from [`HandoverBudgets`], with the last finished handover of each
//! queue from its records); and what the budget rule plans with, the victim terminations
//! observed so far ([`super::terminations`]), for the snapshot.

use std::sync::Arc;
use std::time::Duration;

use gpuqueue_api::v1alpha1::{GpuQueue, HandoverRecord};
use gpuqueue_core::{
    reclaim::BudgetFit,
    status::{FinishedHandover, HandoverBudgets, PlannedHandover},
    termination::Terminations,
};
use tokio::time::Instant;

use super::{handover::Handover, intent::OWNER, planned::HeldPlan, reclaimer::Reclaimer};
use crate::cluster::stores::StoredQueue;

/// The label of `gpuqueue_reclaim_budget_overruns_planned_total` for a fit that does not fit.
fn kind(fit: BudgetFit) -> Option<&'static str> {
    match fit {
        BudgetFit::Fits => None,
        BudgetFit::CheckpointCut { .. } => Some("checkpoint_cut"),
        BudgetFit::Overruns { .. } => Some("overrun"),
    }
}

impl Reclaimer {
    /// Before the first eviction: a handover planned beyond its budget is counted, announced
    /// (the owner pod's event written first) and held for the condition while it runs.
    pub(super) async fn say_budget_up_front(&self, handover: &Handover) -> Option<HeldPlan> {
        let kind = kind(handover.fit)?;
        let planned = PlannedHandover {
            id: handover.id.clone(),
            owner: handover.owner.key.to_string(),
            budget: handover.timeline.budget,
            fit: handover.fit,
        };
        let held = self.budgets.hold(&handover.owner_queue, planned);
        // A resumed handover was announced and counted by the process that planned it.
        if !handover.resumed {
            self.metrics.budget_planned(&handover.owner_queue, kind);
            self.announce_budget(handover).await;
        }
        Some(held)
    }

    /// The handovers planned beyond their budget and the last finished one of each queue,
    /// for the queues' `ReclaimBudgetExceeded` condition.
    pub fn handover_budgets(&self) -> HandoverBudgets {
        let stored = self.stores.queues.state();
        let queues = readable(&stored);
        let mut budgets = HandoverBudgets::default();
        for queue in &queues {
            let records = queue.status.iter().flat_map(|s| &s.last_handovers);
            // Newest first, and among records started in the same second (`startedAt` has
            // whole seconds) the one written last first: the first of the latest start.
            let newest = records.filter(|r| r.role == OWNER).reduce(|newest, r| {
                if r.started_at.as_ref().map(|t| t.0) > newest.started_at.as_ref().map(|t| t.0) {
                    r
                } else {
                    newest
                }
            });
            if let Some(record) = newest {
                let name = queue.metadata.name.clone().unwrap_or_default();
                budgets.last.insert(name, finished(record));
            }
        }
        let recorded = |id: &str| {
            queues
                .iter()
                .flat_map(|q| q.status.iter().flat_map(|s| &s.last_handovers))
                .any(|r| r.id == id)
        };
        budgets.planned = self.budgets.by_queue(recorded, Instant::now());
        budgets
    }

    /// The victim terminations observed per node, the snapshot's for this pass: this process's
    /// own observations and those in the queues' handover records.
    pub fn terminations(&self) -> Terminations {
        self.terminations
            .read(&readable(&self.stores.queues.state()), Instant::now())
    }
}

/// The queues among `stored` this operator can read.
fn readable(stored: &[Arc<StoredQueue>]) -> Vec<&GpuQueue> {
    stored.iter().filter_map(|q| q.0.as_ref().ok()).collect()
}

fn finished(record: &HandoverRecord) -> FinishedHandover {
    let millis = |ms: i64| Duration::from_millis(u64::try_from(ms).unwrap_or_default());
    FinishedHandover {
        id: record.id.clone(),
        budget: millis(record.budget_millis),
        took: millis(record.total_millis),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plan_that_does_not_fit_has_a_kind() {
        let ms = Duration::from_millis;
        assert_eq!(kind(BudgetFit::Fits), None);
        let cut = BudgetFit::CheckpointCut {
            allowed: ms(1),
            timeout: ms(2),
        };
        assert_eq!(kind(cut), Some("checkpoint_cut"));
        assert_eq!(kind(BudgetFit::Overruns { by: ms(1) }), Some("overrun"));
    }
}
