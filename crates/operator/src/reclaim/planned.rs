//! The handovers in flight planned beyond their budget, held while their task runs (and a
//! while after, until their record shows), for the owner queues' `ReclaimBudgetExceeded`
//! condition.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuqueue_core::status::PlannedHandover;
use tokio::time::Instant;

/// How long an ended handover still counts as planned while its record does not show (the
/// queue watch lags the record's write): the condition does not flip back and forth.
const UNTIL_RECORDED: Duration = Duration::from_secs(30);

/// The handovers in flight planned beyond their budget, by reclaim id.
#[derive(Clone, Debug, Default)]
pub struct PlannedBudgets(Arc<Mutex<HashMap<String, Planned>>>);

#[derive(Debug)]
struct Planned {
    queue: String,
    handover: PlannedHandover,
    /// When its task ended, if it did.
    ended: Option<Instant>,
}

/// Holds a handover among the planned ones while its task runs (dropped with the task, also
/// when the task is aborted).
#[derive(Debug)]
pub struct HeldPlan {
    planned: PlannedBudgets,
    id: String,
}

impl Drop for HeldPlan {
    fn drop(&mut self) {
        if let Some(planned) = crate::sync::lock(&self.planned.0).get_mut(&self.id) {
            planned.ended = Some(Instant::now());
        }
    }
}

impl PlannedBudgets {
    /// Holds `handover` of owner queue `queue` until the returned guard is dropped.
    pub fn hold(&self, queue: &str, handover: PlannedHandover) -> HeldPlan {
        let id = handover.id.clone();
        let planned = Planned {
            queue: queue.to_owned(),
            handover,
            ended: None,
        };
        crate::sync::lock(&self.0).insert(id.clone(), planned);
        HeldPlan {
            planned: self.clone(),
            id,
        }
    }

    /// The handovers held at `now`, by owner queue, in id order; `recorded` says whether a
    /// reclaim's record shows (an ended handover is forgotten then, or after a while).
    pub fn by_queue(
        &self,
        recorded: impl Fn(&str) -> bool,
        now: Instant,
    ) -> HashMap<String, Vec<PlannedHandover>> {
        let mut planned = crate::sync::lock(&self.0);
        planned.retain(|id, p| {
            p.ended.is_none_or(|at| {
                !recorded(id) && now.saturating_duration_since(at) < UNTIL_RECORDED
            })
        });
        let mut by_queue: HashMap<String, Vec<PlannedHandover>> = HashMap::new();
        for p in planned.values() {
            by_queue
                .entry(p.queue.clone())
                .or_default()
                .push(p.handover.clone());
        }
        for list in by_queue.values_mut() {
            list.sort_by(|a, b| a.id.cmp(&b.id));
        }
        by_queue
    }
}

#[cfg(test)]
mod tests {
    use gpuqueue_core::reclaim::BudgetFit;

    use super::*;

    fn planned(id: &str) -> PlannedHandover {
        PlannedHandover {
            id: id.into(),
            owner: "online/o".into(),
            budget: Duration::from_secs(3),
            fit: BudgetFit::Overruns {
                by: Duration::from_secs(7),
            },
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_plan_is_held_while_its_task_runs_and_until_its_record_shows() {
        let budgets = PlannedBudgets::default();
        let held = budgets.hold("online", planned("rc-1"));
        let _running = budgets.hold("online", planned("rc-2"));
        let count = |recorded: &dyn Fn(&str) -> bool| {
            budgets
                .by_queue(recorded, Instant::now())
                .get("online")
                .map_or(0, Vec::len)
        };
        assert_eq!(
            count(&|_| true),
            2,
            "running: held whatever the records say"
        );
        drop(held);
        assert_eq!(count(&|_| false), 2, "ended, not recorded yet");
        assert_eq!(count(&|id| id == "rc-1"), 1, "ended and recorded");
        drop(budgets.hold("online", planned("rc-3")));
        tokio::time::advance(UNTIL_RECORDED).await;
        assert_eq!(count(&|_| false), 1, "ended long ago");
    }
}
