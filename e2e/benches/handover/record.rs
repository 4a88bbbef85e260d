//! One handover as the operator recorded it (`status.lastHandovers`), with the shares the
//! report needs.

use gpuqueue_api::v1alpha1::HandoverRecord;

/// The phases of a handover, in order.
pub const PHASES: [&str; 7] = [
    "plan",
    "intent",
    "reserve",
    "checkpoint",
    "evictAccepted",
    "victimsGone",
    "ownerBound",
];

/// One handover record, in milliseconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Handover {
    pub owner: String,
    pub outcome: String,
    pub budget_ms: i64,
    /// Milliseconds from found blocked to the end of each phase.
    pub phases: Vec<(String, i64)>,
    pub total_ms: i64,
    pub checkpoint_ms: i64,
    /// Victim termination: from the eviction accepted until the victims were gone.
    pub victims_gone_ms: i64,
    /// The whole handover minus the checkpoint phase and the victims' termination.
    pub control_plane_ms: i64,
    pub checkpoint_result: String,
    /// Phases of [`PHASES`] the record lacks.
    pub missing_phases: Vec<&'static str>,
}

impl Handover {
    pub fn of(record: &HandoverRecord) -> Self {
        let phases: Vec<(String, i64)> = record
            .phases
            .iter()
            .map(|p| (p.phase.clone(), p.at_millis))
            .collect();
        let mut handover = Self {
            owner: record.owner_pod.clone(),
            outcome: record.outcome.clone(),
            budget_ms: record.budget_millis,
            phases,
            total_ms: record.total_millis,
            checkpoint_ms: 0,
            victims_gone_ms: 0,
            control_plane_ms: 0,
            checkpoint_result: record
                .checkpoints
                .first()
                .map(|c| c.result.clone())
                .unwrap_or_default(),
            missing_phases: Vec::new(),
        };
        handover.missing_phases = PHASES
            .into_iter()
            .filter(|phase| handover.at(phase).is_none())
            .collect();
        handover.checkpoint_ms = handover.duration("checkpoint").unwrap_or(0);
        handover.victims_gone_ms = handover.duration("victimsGone").unwrap_or(0);
        handover.control_plane_ms =
            handover.total_ms - handover.checkpoint_ms - handover.victims_gone_ms;
        handover
    }

    fn at(&self, phase: &str) -> Option<i64> {
        self.phases
            .iter()
            .find(|(p, _)| p == phase)
            .map(|(_, at)| *at)
    }

    /// How long `phase` itself took (from the end of the phase before it).
    pub fn duration(&self, phase: &str) -> Option<i64> {
        let index = PHASES.iter().position(|p| *p == phase)?;
        let end = self.at(phase)?;
        let start = if index == 0 {
            0
        } else {
            self.at(PHASES[index - 1])?
        };
        Some(end - start)
    }

    pub fn over_budget(&self) -> bool {
        self.total_ms > self.budget_ms
    }
}
