//! `kubectl gpuqueue queues`: every GpuQueue as the operator reported it in its status, one row
//! per resource, with the conditions that are not in their healthy state and the last handover.
//!
//! Nothing here is computed from pods or nodes: the numbers are the operator's, so the CLI and
//! `kubectl get gq` never disagree. A queue without a status says so (the operator is not
//! running, or has not reached it yet); its spec's guarantee and ceiling are shown from the
//! core's reading of the spec.

use std::io::Write;

use gpuqueue_api::conditions::types;
use gpuqueue_api::v1alpha1::{GpuQueue, HandoverRecord, ResourceStatus};
use gpuqueue_core::model::Queue;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Serialize;

use crate::args::QueuesArgs;
use crate::connect::{self, InspectError};
use crate::render;

/// One queue, as `queues` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueView {
    pub name: String,
    /// Whether the operator has written a status.
    pub has_status: bool,
    pub resources: Vec<ResourceView>,
    /// Pods past the gate; `None` without a status.
    pub admitted_pods: Option<i32>,
    /// Pods held at the gate; `None` without a status.
    pub pending_pods: Option<i32>,
    /// Conditions that are not in their healthy state.
    pub conditions: Vec<ConditionView>,
    /// Why the numbers may not be current (no status, an older generation).
    pub notes: Vec<String>,
    /// The newest entry of `status.lastHandovers`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_handover: Option<HandoverSummary>,
}

/// One resource of a queue, in devices. Numbers the operator has not reported are `None`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceView {
    pub name: String,
    pub guaranteed: Option<i64>,
    pub ceiling: Option<i64>,
    pub allocated: Option<i64>,
    pub borrowed: Option<i64>,
    pub lent: Option<i64>,
    pub pending: Option<i64>,
}

/// A condition, as the operator wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionView {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// A handover in one line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HandoverSummary {
    pub id: String,
    pub role: String,
    pub total_millis: i64,
    pub budget_millis: i64,
    pub outcome: String,
}

impl From<&HandoverRecord> for HandoverSummary {
    fn from(record: &HandoverRecord) -> Self {
        Self {
            id: record.id.clone(),
            role: record.role.clone(),
            total_millis: record.total_millis,
            budget_millis: record.budget_millis,
            outcome: record.outcome.clone(),
        }
    }
}

impl HandoverSummary {
    /// `rc-7f3a 2710ms Completed`: the outcome's code only (the text after `:` is in
    /// `handovers`).
    pub fn line(&self) -> String {
        let code = self
            .outcome
            .split_once(':')
            .map_or(self.outcome.as_str(), |(code, _)| code);
        format!("{} {}ms {code}", self.id, self.total_millis)
    }
}

/// The conditions of `conditions` that are not in their healthy state, in the order of the
/// API's [`types::HEALTHY`].
pub fn unhealthy(conditions: &[Condition]) -> Vec<ConditionView> {
    types::HEALTHY
        .iter()
        .filter_map(|(type_, healthy)| {
            let c = conditions.iter().find(|c| c.type_ == *type_)?;
            (c.status != *healthy).then(|| ConditionView {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
        })
        .collect()
}

/// Why a queue's status may not describe its spec: none written, or an older generation.
pub fn status_notes(queue: &GpuQueue) -> Vec<String> {
    let Some(status) = &queue.status else {
        return vec![
            "no status: the operator has not reported on this queue (is gpuqueue-operator running?)"
                .to_owned(),
        ];
    };
    match (status.observed_generation, queue.metadata.generation) {
        (Some(observed), Some(generation)) if observed < generation => vec![format!(
            "the status describes generation {observed} but the spec is at generation {generation}: the operator has not caught up (is gpuqueue-operator running?)"
        )],
        _ => Vec::new(),
    }
}

/// Reads one queue.
pub fn view(queue: &GpuQueue) -> QueueView {
    let name = queue.metadata.name.clone().unwrap_or_default();
    let Some(status) = &queue.status else {
        // The spec's quotas as the core reads them; an invalid spec shows no rows (the
        // operator reports it as Ready=False once it runs).
        let resources = Queue::from_api(queue)
            .map(|q| {
                q.quotas
                    .iter()
                    .map(|quota| ResourceView {
                        name: quota.resource.to_string(),
                        guaranteed: Some(devices(quota.guaranteed)),
                        ceiling: Some(devices(quota.ceiling())),
                        allocated: None,
                        borrowed: None,
                        lent: None,
                        pending: None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        return QueueView {
            name,
            has_status: false,
            resources,
            admitted_pods: None,
            pending_pods: None,
            conditions: Vec::new(),
            notes: status_notes(queue),
            last_handover: None,
        };
    };
    QueueView {
        name,
        has_status: true,
        resources: status.resources.iter().map(view_resource).collect(),
        admitted_pods: Some(status.admitted_pods),
        pending_pods: Some(status.pending_pods),
        conditions: unhealthy(&status.conditions),
        notes: status_notes(queue),
        last_handover: status.last_handovers.first().map(HandoverSummary::from),
    }
}

/// One row of `status.resources`.
pub fn view_resource(r: &ResourceStatus) -> ResourceView {
    ResourceView {
        name: r.name.clone(),
        guaranteed: Some(r.guaranteed),
        ceiling: Some(r.ceiling),
        allocated: Some(r.allocated),
        borrowed: Some(r.borrowed),
        lent: Some(r.lent),
        pending: Some(r.pending),
    }
}

fn devices(m: gpuqueue_core::quantity::Milli) -> i64 {
    i64::try_from(m.devices_ceil()).unwrap_or(i64::MAX)
}

/// Every queue, by name.
pub fn views(queues: &[GpuQueue]) -> Vec<QueueView> {
    let mut views: Vec<QueueView> = queues.iter().map(view).collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    views
}

fn number(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// The table, then the conditions and notes that need a look.
pub fn render(views: &[QueueView]) -> String {
    if views.is_empty() {
        return "No GpuQueues found.\n".to_owned();
    }
    let mut rows = Vec::new();
    for queue in views {
        let first_row = |i: usize| i == 0;
        let resources: Vec<Option<&ResourceView>> = if queue.resources.is_empty() {
            vec![None]
        } else {
            queue.resources.iter().map(Some).collect()
        };
        for (i, resource) in resources.into_iter().enumerate() {
            let cell = |f: fn(&ResourceView) -> Option<i64>| number(resource.and_then(f));
            let per_queue = |value: String| if first_row(i) { value } else { String::new() };
            rows.push(vec![
                queue.name.clone(),
                resource.map_or_else(|| "-".to_owned(), |r| r.name.clone()),
                cell(|r| r.guaranteed),
                cell(|r| r.ceiling),
                cell(|r| r.allocated),
                cell(|r| r.borrowed),
                cell(|r| r.lent),
                cell(|r| r.pending),
                per_queue(number(queue.admitted_pods)),
                per_queue(number(queue.pending_pods)),
                per_queue(
                    queue
                        .last_handover
                        .as_ref()
                        .map_or_else(|| "-".to_owned(), HandoverSummary::line),
                ),
            ]);
        }
    }
    let mut text = render::table(
        &[
            "QUEUE",
            "RESOURCE",
            "GUARANTEED",
            "CEILING",
            "ALLOCATED",
            "BORROWED",
            "LENT",
            "PENDING",
            "ADMITTED PODS",
            "PENDING PODS",
            "LAST HANDOVER",
        ],
        &rows,
    );
    let attention: Vec<String> = views
        .iter()
        .flat_map(|q| {
            q.conditions
                .iter()
                .map(|c| {
                    format!(
                        "  {}: {}={} ({}): {}",
                        q.name, c.type_, c.status, c.reason, c.message
                    )
                })
                .chain(q.notes.iter().map(|note| format!("  {}: {note}", q.name)))
        })
        .collect();
    if !attention.is_empty() {
        text.push_str("\nNeeds attention:\n");
        for line in attention {
            text.push_str(&line);
            text.push('\n');
        }
    }
    text
}

/// Runs `kubectl gpuqueue queues`.
pub fn run(args: &QueuesArgs, out: &mut dyn Write) -> Result<(), InspectError> {
    let queues = connect::block_on(async {
        let cluster = connect::connect(&args.cluster).await?;
        connect::read_queues(cluster.client, args.queue.as_deref()).await
    })?;
    let views = views(&queues);
    if !render::structured(&views, args.output, out)? {
        out.write_all(render(&views).as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    /// A queue as the API server returns it, with `status` as the operator wrote it.
    fn queue(name: &str, spec: &str, generation: i64, status: &str) -> GpuQueue {
        let status = if status.is_empty() {
            String::new()
        } else {
            format!("status:\n{status}")
        };
        serde_yaml::from_str(&format!(
            "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata: {{name: {name}, generation: {generation}}}\nspec:\n{spec}\n{status}"
        ))
        .unwrap()
    }

    const HEALTHY_CONDITIONS: &str = "  conditions:
    - {type: Ready, status: 'True', reason: Admitting, message: ok, lastTransitionTime: '2026-01-10T11:00:00Z'}
    - {type: Overcommitted, status: 'False', reason: GuaranteesFit, message: fit, lastTransitionTime: '2026-01-10T11:00:00Z'}
    - {type: NamespaceConflict, status: 'False', reason: NoConflict, message: none, lastTransitionTime: '2026-01-10T11:00:00Z'}
    - {type: Reclaiming, status: 'False', reason: Idle, message: idle, lastTransitionTime: '2026-01-10T11:00:00Z'}
";

    fn two_tenants() -> Vec<GpuQueue> {
        vec![
            queue(
                "online",
                "  namespaces: [online]\n  resources: [{name: nvidia.com/gpu, guaranteed: 24, lendingLimit: 20}]",
                1,
                &format!(
                    "  observedGeneration: 1
  resources: [{{name: nvidia.com/gpu, guaranteed: 24, ceiling: 24, allocated: 4, borrowed: 0, lent: 16, pending: 0}}]
  admittedPods: 4
  pendingPods: 0
{HEALTHY_CONDITIONS}  lastHandovers:
    - {{id: rc-7f3a, role: owner, ownerPod: online/vllm-4, node: gpu-node-1, outcome: Completed, budgetMillis: 3000, totalMillis: 2710}}
    - {{id: rc-0001, role: owner, ownerPod: online/vllm-1, node: gpu-node-0, outcome: Completed, budgetMillis: 3000, totalMillis: 900}}
"
                ),
            ),
            queue(
                "batch",
                "  namespaces: [batch]\n  resources: [{name: nvidia.com/gpu, guaranteed: 8, burstable: 16}, {name: nvidia.com/mig-1g.10gb, guaranteed: 2}]",
                1,
                "  observedGeneration: 1
  resources:
    - {name: nvidia.com/gpu, guaranteed: 8, ceiling: 24, allocated: 24, borrowed: 16, lent: 0, pending: 2}
    - {name: nvidia.com/mig-1g.10gb, guaranteed: 2, ceiling: 2, allocated: 1, borrowed: 0, lent: 0, pending: 0}
  admittedPods: 25
  pendingPods: 2
  conditions:
    - {type: Ready, status: 'True', reason: Admitting, message: ok, lastTransitionTime: '2026-01-10T11:00:00Z'}
    - {type: Reclaiming, status: 'True', reason: HandoverInProgress, message: 0 pod(s) of this queue are receiving reclaimed GPUs; 1 are being evicted, lastTransitionTime: '2026-01-10T11:00:00Z'}
  lastHandovers:
    - {id: rc-7f3a, role: victim, ownerPod: online/vllm-4, node: gpu-node-1, outcome: 'EvictionFailed: batch/train-1: refused', budgetMillis: 3000, totalMillis: 3400}
",
            ),
        ]
    }

    #[test]
    fn the_table_shows_each_resource_pods_and_the_newest_handover() {
        let text = render(&views(&two_tenants()));
        assert_eq!(
            text,
            "\
QUEUE    RESOURCE                 GUARANTEED   CEILING   ALLOCATED   BORROWED   LENT   PENDING   ADMITTED PODS   PENDING PODS   LAST HANDOVER
batch    nvidia.com/gpu           8            24        24          16         0      2         25              2              rc-7f3a 3400ms EvictionFailed
batch    nvidia.com/mig-1g.10gb   2            2         1           0          0      0
online   nvidia.com/gpu           24           24        4           0          16     0         4               0              rc-7f3a 2710ms Completed

Needs attention:
  batch: Reclaiming=True (HandoverInProgress): 0 pod(s) of this queue are receiving reclaimed GPUs; 1 are being evicted
"
        );
    }

    #[test]
    #[allow(clippy::too_many_lines)] // one table, one entry per case
    fn only_conditions_out_of_their_healthy_state_and_stale_statuses_need_attention() {
        let resources = "  resources: [{name: nvidia.com/gpu, guaranteed: 8, ceiling: 8, allocated: 0, borrowed: 0, lent: 0, pending: 0}]\n";
        let condition = |type_: &str, status: &str, reason: &str, message: &str| {
            format!(
                "  conditions:\n    - {{type: {type_}, status: '{status}', reason: {reason}, message: '{message}', lastTransitionTime: '2026-01-10T11:00:00Z'}}\n"
            )
        };
        let spec = "  namespaces: [a]\n  resources: [{name: nvidia.com/gpu, guaranteed: 8}]";
        let cases: Vec<(&str, GpuQueue, Vec<&str>)> = vec![
            (
                "all healthy",
                queue(
                    "a",
                    spec,
                    1,
                    &format!("  observedGeneration: 1\n{resources}{HEALTHY_CONDITIONS}"),
                ),
                vec![],
            ),
            (
                "invalid spec",
                queue(
                    "a",
                    spec,
                    1,
                    &format!(
                        "  observedGeneration: 1\n{}",
                        condition(
                            "Ready",
                            "False",
                            "InvalidSpec",
                            "spec.weight: must be between 1 and 1000, not 0"
                        )
                    ),
                ),
                vec![
                    "a: Ready=False (InvalidSpec): spec.weight: must be between 1 and 1000, not 0",
                ],
            ),
            (
                "namespace conflict",
                queue(
                    "a",
                    spec,
                    1,
                    &format!(
                        "  observedGeneration: 1\n{resources}{}",
                        condition(
                            "NamespaceConflict",
                            "True",
                            "NamespaceConflict",
                            "namespace a is also claimed by b"
                        )
                    ),
                ),
                vec![
                    "a: NamespaceConflict=True (NamespaceConflict): namespace a is also claimed by b",
                ],
            ),
            (
                "overcommitted",
                queue(
                    "a",
                    spec,
                    1,
                    &format!(
                        "  observedGeneration: 1\n{resources}{}",
                        condition(
                            "Overcommitted",
                            "True",
                            "GuaranteesExceedCapacity",
                            "nvidia.com/gpu: the guarantees of all queues add up to 40 but the cluster has 32"
                        )
                    ),
                ),
                vec![
                    "a: Overcommitted=True (GuaranteesExceedCapacity): nvidia.com/gpu: the guarantees of all queues add up to 40 but the cluster has 32",
                ],
            ),
            (
                "a handover planned beyond its budget",
                queue(
                    "a",
                    spec,
                    1,
                    &format!(
                        "  observedGeneration: 1\n{resources}{}",
                        condition(
                            "ReclaimBudgetExceeded",
                            "True",
                            "OverrunPlanned",
                            "handover rc-1 overruns the budget 3s by 400ms"
                        )
                    ),
                ),
                vec![
                    "a: ReclaimBudgetExceeded=True (OverrunPlanned): handover rc-1 overruns the budget 3s by 400ms",
                ],
            ),
            (
                "stale generation",
                queue(
                    "a",
                    spec,
                    3,
                    &format!("  observedGeneration: 2\n{resources}"),
                ),
                vec![
                    "a: the status describes generation 2 but the spec is at generation 3: the operator has not caught up (is gpuqueue-operator running?)",
                ],
            ),
            (
                "no status",
                queue("a", spec, 1, ""),
                vec![
                    "a: no status: the operator has not reported on this queue (is gpuqueue-operator running?)",
                ],
            ),
        ];
        for (name, queue, expected) in cases {
            let text = render(&[view(&queue)]);
            let attention: Vec<&str> = text
                .split_once("Needs attention:\n")
                .map(|(_, rest)| rest.lines().map(str::trim).collect())
                .unwrap_or_default();
            assert_eq!(attention, expected, "{name}:\n{text}");
        }
    }

    #[test]
    fn a_queue_without_status_shows_its_spec_and_dashes() {
        let q = queue(
            "a",
            "  namespaces: [a]\n  resources: [{name: nvidia.com/gpu, guaranteed: 8, burstable: 4}]",
            1,
            "",
        );
        let text = render(&[view(&q)]);
        let row = text.lines().nth(1).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "a",
                "nvidia.com/gpu",
                "8",
                "12",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-"
            ]
        );
    }

    #[test]
    fn no_queues_and_structured_output() {
        assert_eq!(render(&[]), "No GpuQueues found.\n");
        let views = views(&two_tenants());
        let mut json = Vec::new();
        assert!(render::structured(&views, crate::args::Output::Json, &mut json).unwrap());
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value[0]["name"], "batch");
        assert_eq!(value[0]["resources"][0]["borrowed"], 16);
        assert_eq!(value[0]["pendingPods"], 2);
        assert_eq!(value[0]["conditions"][0]["type"], "Reclaiming");
        assert_eq!(value[1]["lastHandover"]["totalMillis"], 2710);
        let mut yaml = Vec::new();
        assert!(render::structured(&views, crate::args::Output::Yaml, &mut yaml).unwrap());
        let back: serde_yaml::Value = serde_yaml::from_slice(&yaml).unwrap();
        assert_eq!(back[1]["resources"][0]["lent"], 16);
        assert!(!render::structured(&views, crate::args::Output::Text, &mut Vec::new()).unwrap());
    }
}
