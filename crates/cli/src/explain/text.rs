//! The explanation for people: `Key: value` lines, the claiming queue's numbers, the
//! operator's events and the notes, in that order.

use std::fmt::Write as _;

use gpuqueue_api::{ADMISSION_GATE, FIELD_MANAGER};
use jiff::Timestamp;

use super::explanation::{Admission, Claim, EventView, Explanation, NodeView, Reclaim};
use crate::render;

/// The explanation as text, ages relative to `now`.
pub fn render(e: &Explanation, now: Timestamp) -> String {
    let fields = fields(e, now);
    // Values start one column after the longest key's colon and two spaces.
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 3;
    let mut text = String::new();
    for (key, value) in fields {
        let _ = writeln!(text, "{:width$}{value}", format!("{key}:"));
    }
    if !e.queue_resources.is_empty() {
        text.push_str(&queue_table(e));
    }
    text.push_str(&events_table(&e.events, now));
    if !e.notes.is_empty() {
        text.push_str("\nNotes:\n");
        for note in &e.notes {
            let _ = writeln!(text, "  {note}");
        }
    }
    text
}

/// The `Key: value` lines at the top, in the order they are told.
fn fields(e: &Explanation, now: Timestamp) -> Vec<(&'static str, String)> {
    let mut fields: Vec<(&'static str, String)> = vec![
        ("Pod", e.pod.clone()),
        ("Summary", e.summary.clone()),
        ("Queue", claim_line(&e.claim)),
    ];
    if !e.requests.is_empty() {
        let list: Vec<String> = e.requests.iter().map(|(r, n)| format!("{r} {n}")).collect();
        fields.push(("Requests", list.join(", ")));
    }
    fields.push((
        "Gate",
        if e.gated {
            format!("{ADMISSION_GATE} (held)")
        } else {
            format!("{ADMISSION_GATE} not present")
        },
    ));
    if !e.other_gates.is_empty() {
        fields.push(("Other gates", e.other_gates.join(", ")));
    }
    if let Some(reason) = &e.waiting_reason {
        fields.push(("Waiting reason", reason.clone()));
    }
    if let Some(a) = &e.admission {
        fields.push(("Admitted", admission_line(a, now)));
    }
    if let Some(node) = &e.node {
        fields.push(("Node", node_line(node)));
    }
    if let Some(r) = &e.reclaim {
        fields.push(("Reclaim", reclaim_line(r)));
    }
    fields
}

fn claim_line(claim: &Claim) -> String {
    match claim {
        Claim::Queue { queue, namespace } => {
            format!("{queue} (claims namespace {namespace})")
        }
        Claim::Conflict { namespace, queues } => format!(
            "none: namespace {namespace} is claimed by several queues ({})",
            queues.join(", ")
        ),
        Claim::Unclaimed { namespace } => {
            format!("none: no queue claims namespace {namespace}")
        }
        Claim::Unknown { namespace, why } => {
            format!("unknown for namespace {namespace}: {why}")
        }
    }
}

fn admission_line(a: &Admission, now: Timestamp) -> String {
    let mut line = a.admitted_as.clone().unwrap_or_else(|| "admitted".into());
    if let Some(q) = &a.queue {
        let _ = write!(line, ", queue {q}");
    }
    if let Some(at) = &a.admitted_at {
        let _ = write!(line, ", at {at}");
        if let Ok(t) = at.parse::<Timestamp>() {
            let _ = write!(line, " ({} ago)", render::age(t, now));
        }
    }
    if a.at_creation {
        line.push_str(", at its creation (never gated)");
    }
    if a.not_believed.is_some() {
        line.push_str(" (not the operator's: charged as unadmitted)");
    }
    line
}

fn node_line(node: &NodeView) -> String {
    let mut line = node.name.clone();
    line.push_str(if node.bound {
        " (bound)"
    } else {
        " (pinned by gpuqueue; kube-scheduler has not bound it)"
    });
    if let Some(message) = &node.scheduler_message {
        let _ = write!(line, "; kube-scheduler: {message}");
    }
    line
}

fn reclaim_line(r: &Reclaim) -> String {
    let mut line = format!(
        "{}, this pod is the {}",
        r.id,
        r.role.as_deref().unwrap_or("unknown party")
    );
    if let Some(node) = &r.node {
        let _ = write!(line, ", frees node {node}");
    }
    if let Some(deadline) = &r.deadline {
        let _ = write!(line, ", deadline {deadline}");
    }
    if let Some(progress) = &r.progress {
        let _ = write!(line, ", progress {progress}");
    }
    if let Some(h) = &r.handover {
        let _ = write!(
            line,
            "; handover {} in {}ms of {}ms",
            h.outcome, h.total_millis, h.budget_millis
        );
    }
    line
}

/// The claiming queue's rows for the requested resources, under a heading that names it.
fn queue_table(e: &Explanation) -> String {
    let mut text = String::new();
    if let Claim::Queue { queue, .. } = &e.claim {
        let _ = write!(text, "\nQueue {queue}");
        if let Some(p) = &e.queue_pods {
            let _ = write!(
                text,
                " ({} pods admitted, {} pending)",
                p.admitted, p.pending
            );
        }
        text.push_str(":\n");
    }
    let rows: Vec<Vec<String>> = e
        .queue_resources
        .iter()
        .map(|r| {
            let n = |v: Option<i64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
            vec![
                r.name.clone(),
                n(r.guaranteed),
                n(r.ceiling),
                n(r.allocated),
                n(r.borrowed),
                n(r.lent),
                n(r.pending),
            ]
        })
        .collect();
    text.push_str(&indent(&render::table(
        &[
            "RESOURCE",
            "GUARANTEED",
            "CEILING",
            "ALLOCATED",
            "BORROWED",
            "LENT",
            "PENDING",
        ],
        &rows,
    )));
    text
}

/// The operator's events, oldest first, or `none`.
fn events_table(events: &[EventView], now: Timestamp) -> String {
    let mut text = format!("\nEvents from {FIELD_MANAGER}:");
    if events.is_empty() {
        text.push_str(" none\n");
        return text;
    }
    text.push('\n');
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|ev| {
            let mut seen = ev
                .last_seen
                .map_or_else(|| "-".to_owned(), |t| render::age(t, now));
            if ev.count > 1 {
                let _ = write!(seen, " (x{})", ev.count);
            }
            vec![
                seen,
                ev.type_.clone(),
                ev.reason.clone(),
                ev.message.clone(),
            ]
        })
        .collect();
    text.push_str(&indent(&render::table(
        &["LAST SEEN", "TYPE", "REASON", "MESSAGE"],
        &rows,
    )));
    text
}

fn indent(text: &str) -> String {
    text.lines().fold(String::new(), |mut out, line| {
        let _ = writeln!(out, "  {line}");
        out
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use k8s_openapi::api::core::v1::Event;

    use super::*;
    use crate::explain::facts::explain;
    use crate::explain::fixtures::{GATE, OVER_CEILING, batch_queue, now, observed, pod, yaml};

    #[test]
    fn a_waiting_pod_reads_like_this() {
        let p = pod(
            "batch",
            "vllm-25",
            &format!("  annotations:\n    gpuqueue.io/waiting-reason: '{OVER_CEILING}'"),
            GATE,
            "  phase: Pending",
        );
        let event = |reason: &str, component: &str, uid: &str, at: &str, message: &str| -> Event {
            yaml(&format!(
                "metadata: {{name: e-{reason}-{at}, namespace: batch}}\ninvolvedObject: {{kind: Pod, name: vllm-25, namespace: batch, uid: {uid}}}\nreason: {reason}\ntype: Normal\nmessage: '{message}'\nreportingComponent: {component}\neventTime: '{at}'\n"
            ))
        };
        let mut obs = observed(p, vec![batch_queue(true)]);
        obs.events = vec![
            event(
                "OverCeiling",
                "gpuqueue-operator",
                "uid-vllm-25",
                "2026-01-10T11:57:00Z",
                "queue batch: nvidia.com/gpu allocated 24 + requested 1 exceeds its ceiling of 24 (guaranteed 8 + burstable 16)",
            ),
            event(
                "NoIdleCapacity",
                "gpuqueue-operator",
                "uid-vllm-25",
                "2026-01-10T11:55:00Z",
                "queue batch: only 0 is idle",
            ),
            event(
                "FailedScheduling",
                "default-scheduler",
                "uid-vllm-25",
                "2026-01-10T11:56:00Z",
                "not ours",
            ),
            event(
                "Admitted",
                "gpuqueue-operator",
                "uid-of-an-older-pod",
                "2026-01-10T11:40:00Z",
                "an older pod of the same name",
            ),
        ];
        let e = explain(&obs, 10);
        assert_eq!(
            render(&e, now()),
            "\
Pod:             batch/vllm-25
Summary:         waiting at the gate: OverCeiling: queue batch: nvidia.com/gpu allocated 24 + requested 1 exceeds its ceiling of 24 (guaranteed 8 + burstable 16)
Queue:           batch (claims namespace batch)
Requests:        nvidia.com/gpu 1
Gate:            gpuqueue.io/admission (held)
Waiting reason:  OverCeiling: queue batch: nvidia.com/gpu allocated 24 + requested 1 exceeds its ceiling of 24 (guaranteed 8 + burstable 16)

Queue batch (24 pods admitted, 2 pending):
  RESOURCE         GUARANTEED   CEILING   ALLOCATED   BORROWED   LENT   PENDING
  nvidia.com/gpu   8            24        24          16         0      2

Events from gpuqueue-operator:
  LAST SEEN   TYPE     REASON           MESSAGE
  5m          Normal   NoIdleCapacity   queue batch: only 0 is idle
  3m          Normal   OverCeiling      queue batch: nvidia.com/gpu allocated 24 + requested 1 exceeds its ceiling of 24 (guaranteed 8 + burstable 16)
"
        );
        // Only the newest events when asked for fewer.
        let e = explain(&obs, 1);
        assert_eq!(e.events.len(), 1);
        assert_eq!(e.events[0].reason, "OverCeiling");
    }

    #[test]
    fn a_pod_admitted_at_its_creation_says_so() {
        let p = pod(
            "batch",
            "vllm-0",
            "  annotations:\n    gpuqueue.io/queue: batch\n    gpuqueue.io/admitted-as: guaranteed\n    gpuqueue.io/admitted-at: '2026-01-10T11:58:00Z'\n    gpuqueue.io/admitted-at-creation: 5f3a",
            "  nodeName: gpu-node-1",
            "  phase: Running",
        );
        let text = render(&explain(&observed(p, vec![batch_queue(true)]), 10), now());
        assert!(
            text.contains("Admitted:  guaranteed, queue batch, at 2026-01-10T11:58:00Z (2m ago), at its creation (never gated)\n"),
            "{text}"
        );
    }

    #[test]
    fn an_admitted_pod_in_a_reclaim_reads_like_this() {
        let p = pod(
            "batch",
            "train-1",
            "  annotations:\n    gpuqueue.io/queue: batch\n    gpuqueue.io/admitted-as: borrowed\n    gpuqueue.io/admitted-at: '2026-01-10T11:58:00Z'\n    gpuqueue.io/reclaim-id: rc-9\n    gpuqueue.io/reclaim-role: victim\n    gpuqueue.io/reclaim-node: gpu-node-1\n    gpuqueue.io/reclaim-deadline: '2026-01-10T11:59:03Z'\n    gpuqueue.io/reclaim-progress: checkpointing",
            "  nodeName: gpu-node-1",
            "  phase: Running",
        );
        let mut obs = observed(p, vec![batch_queue(true)]);
        obs.events_error =
            Some("no permission to list events in namespace batch: forbidden".into());
        let text = render(&explain(&obs, 10), now());
        assert_eq!(
            text,
            "\
Pod:       batch/train-1
Summary:   admitted, bound to node gpu-node-1; being evicted by reclaim rc-9 to return borrowed GPUs
Queue:     batch (claims namespace batch)
Requests:  nvidia.com/gpu 1
Gate:      gpuqueue.io/admission not present
Admitted:  borrowed, queue batch, at 2026-01-10T11:58:00Z (2m ago)
Node:      gpu-node-1 (bound)
Reclaim:   rc-9, this pod is the victim, frees node gpu-node-1, deadline 2026-01-10T11:59:03Z, progress checkpointing; handover Completed in 2710ms of 3000ms

Queue batch (24 pods admitted, 2 pending):
  RESOURCE         GUARANTEED   CEILING   ALLOCATED   BORROWED   LENT   PENDING
  nvidia.com/gpu   8            24        24          16         0      2

Events from gpuqueue-operator: none

Notes:
  cannot list events: no permission to list events in namespace batch: forbidden
"
        );
    }

    #[test]
    fn a_pinned_pod_shows_what_kube_scheduler_says_and_json_has_every_field() {
        let p = pod(
            "batch",
            "p",
            "  annotations: {gpuqueue.io/queue: batch, gpuqueue.io/admitted-as: guaranteed, gpuqueue.io/admitted-at: '2026-01-10T11:58:00Z'}",
            "  nodeSelector: {kubernetes.io/hostname: gpu-node-2}",
            "  phase: Pending\n  conditions: [{type: PodScheduled, status: 'False', reason: Unschedulable, message: '0/5 nodes are available: 1 Insufficient cpu.'}]",
        );
        let e = explain(&observed(p, vec![batch_queue(true)]), 10);
        let text = render(&e, now());
        assert!(
            text.contains("Node:      gpu-node-2 (pinned by gpuqueue; kube-scheduler has not bound it); kube-scheduler: 0/5 nodes are available: 1 Insufficient cpu.\n"),
            "{text}"
        );
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(
            json["claim"],
            serde_json::json!({"kind": "queue", "queue": "batch", "namespace": "batch"})
        );
        assert_eq!(json["admission"]["admittedAs"], "guaranteed");
        assert_eq!(json["node"]["bound"], false);
        assert_eq!(json["gated"], false);
        assert_eq!(json["requests"]["nvidia.com/gpu"], "1");
        assert_eq!(json["queueResources"][0]["ceiling"], 24);
    }
}
