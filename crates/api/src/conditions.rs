//! Condition types and reasons of `GpuQueue` status. Reasons are PascalCase, as Kubernetes
//! conventions ask, and stable: tools may match on them.

/// Condition types.
pub mod types {
    /// The queue's spec was accepted and the operator is admitting its pods.
    pub const READY: &str = "Ready";
    /// The sum of all queues' guarantees for a resource exceeds the cluster's capacity.
    pub const OVERCOMMITTED: &str = "Overcommitted";
    /// A reclaim for or from this queue is in progress.
    pub const RECLAIMING: &str = "Reclaiming";
    /// A namespace of this queue is also claimed by another queue.
    pub const NAMESPACE_CONFLICT: &str = "NamespaceConflict";
    /// Pods of this queue hold capacity without gpuqueue's admission.
    pub const QUOTA_BYPASS: &str = "QuotaBypass";
    /// A handover for this queue was planned not to fit its budget (the checkpoint is cut, or
    /// even without one the victims' termination and the bind outlast it), or the last one
    /// overran it.
    pub const RECLAIM_BUDGET_EXCEEDED: &str = "ReclaimBudgetExceeded";

    /// Every type with the status it is healthy in, in the order tools list them.
    pub const HEALTHY: [(&str, &str); 6] = [
        (READY, "True"),
        (NAMESPACE_CONFLICT, "False"),
        (OVERCOMMITTED, "False"),
        (RECLAIMING, "False"),
        (QUOTA_BYPASS, "False"),
        (RECLAIM_BUDGET_EXCEEDED, "False"),
    ];
}

/// Condition reasons.
pub mod reasons {
    pub const ADMITTING: &str = "Admitting";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const NAMESPACE_CONFLICT: &str = "NamespaceConflict";
    pub const NO_CONFLICT: &str = "NoConflict";
    pub const GUARANTEES_EXCEED_CAPACITY: &str = "GuaranteesExceedCapacity";
    pub const GUARANTEES_FIT: &str = "GuaranteesFit";
    pub const HANDOVER_IN_PROGRESS: &str = "HandoverInProgress";
    pub const IDLE: &str = "Idle";
    pub const UNADMITTED_PODS: &str = "UnadmittedPods";
    pub const ALL_ADMITTED: &str = "AllAdmitted";
    pub const WITHIN_BUDGET: &str = "WithinBudget";
    pub const CHECKPOINT_CUT: &str = "CheckpointCut";
    pub const OVERRUN_PLANNED: &str = "OverrunPlanned";
    pub const LAST_HANDOVER_OVERRAN: &str = "LastHandoverOverran";

    /// Every reason above: the event a condition's change sends carries it as its reason.
    pub const ALL: [&str; 14] = [
        ADMITTING,
        INVALID_SPEC,
        NAMESPACE_CONFLICT,
        NO_CONFLICT,
        GUARANTEES_EXCEED_CAPACITY,
        GUARANTEES_FIT,
        HANDOVER_IN_PROGRESS,
        IDLE,
        UNADMITTED_PODS,
        ALL_ADMITTED,
        WITHIN_BUDGET,
        CHECKPOINT_CUT,
        OVERRUN_PLANNED,
        LAST_HANDOVER_OVERRAN,
    ];
}
