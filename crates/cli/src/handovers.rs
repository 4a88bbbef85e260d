//! `kubectl gpuqueue handovers [QUEUE]`: the handovers the operator recorded in the queues'
//! `status.lastHandovers`, each with its phases as a compact timeline, its victims and their
//! checkpoint results.
//!
//! The operator writes one record per reclaim into the owner's queue and one into each victim's
//! queue; without a QUEUE each handover is shown once, with every queue and its part.

use std::fmt::Write as _;
use std::io::Write;

use gpuqueue_api::v1alpha1::{GpuQueue, HandoverRecord};
use jiff::Timestamp;
use serde::Serialize;

use crate::args::HandoversArgs;
use crate::connect::{self, InspectError};
use crate::render;

/// One handover.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HandoverView {
    pub id: String,
    /// Each queue that recorded it, with its part (`owner` or `victim`).
    pub queues: Vec<QueuePart>,
    /// `namespace/name` of the pod the GPUs went to.
    pub owner_pod: String,
    pub node: String,
    pub started_at: Option<Timestamp>,
    /// `Completed`, or the reason it was not.
    pub outcome: String,
    pub budget_millis: i64,
    pub total_millis: i64,
    pub phases: Vec<PhaseView>,
    pub victims: Vec<String>,
    pub checkpoints: Vec<CheckpointView>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuePart {
    pub queue: String,
    pub role: String,
}

/// A phase: when it ended since the start, and how long it took after the one before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseView {
    pub phase: String,
    pub at_millis: i64,
    pub took_millis: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointView {
    pub pod: String,
    pub driver: String,
    pub result: String,
    pub millis: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

fn view(queue: &str, record: &HandoverRecord) -> HandoverView {
    let mut previous = 0;
    let phases = record
        .phases
        .iter()
        .map(|p| {
            let took = p.at_millis.saturating_sub(previous).max(0);
            previous = p.at_millis;
            PhaseView {
                phase: p.phase.clone(),
                at_millis: p.at_millis,
                took_millis: took,
            }
        })
        .collect();
    HandoverView {
        id: record.id.clone(),
        queues: vec![QueuePart {
            queue: queue.to_owned(),
            role: record.role.clone(),
        }],
        owner_pod: record.owner_pod.clone(),
        node: record.node.clone(),
        started_at: record.started_at.as_ref().map(|t| t.0),
        outcome: record.outcome.clone(),
        budget_millis: record.budget_millis,
        total_millis: record.total_millis,
        phases,
        victims: record.victims.clone(),
        checkpoints: record
            .checkpoints
            .iter()
            .map(|c| CheckpointView {
                pod: c.pod.clone(),
                driver: c.driver.clone(),
                result: c.result.clone(),
                millis: c.millis,
                message: c.message.clone(),
            })
            .collect(),
    }
}

/// The handovers recorded by `queues`, each id once (the owner's record first), newest first.
pub fn views(queues: &[GpuQueue]) -> Vec<HandoverView> {
    let mut views: Vec<HandoverView> = Vec::new();
    let mut records: Vec<(&str, &HandoverRecord)> = queues
        .iter()
        .flat_map(|q| {
            let name = q.metadata.name.as_deref().unwrap_or_default();
            q.status
                .iter()
                .flat_map(|s| &s.last_handovers)
                .map(move |r| (name, r))
        })
        .collect();
    // The owner's record tells the whole story; victims' queues add their part.
    records.sort_by_key(|(queue, r)| (r.role != "owner", *queue));
    for (queue, record) in records {
        if let Some(seen) = views.iter_mut().find(|v| v.id == record.id) {
            seen.queues.push(QueuePart {
                queue: queue.to_owned(),
                role: record.role.clone(),
            });
        } else {
            views.push(view(queue, record));
        }
    }
    views.sort_by(|a, b| {
        b.started_at
            .cmp(&a.started_at)
            .then_with(|| a.id.cmp(&b.id))
    });
    views
}

/// The handovers for people.
pub fn render(views: &[HandoverView], now: Timestamp) -> String {
    let mut text = String::new();
    for (i, h) in views.iter().enumerate() {
        if i > 0 {
            text.push('\n');
        }
        let mut head = format!(
            "{}   {}   {}ms of {}ms budget",
            h.id, h.outcome, h.total_millis, h.budget_millis
        );
        if h.total_millis > h.budget_millis {
            let _ = write!(head, " (over by {}ms)", h.total_millis - h.budget_millis);
        }
        if let Some(started) = h.started_at {
            let _ = write!(
                head,
                "   started {started} ({} ago)",
                render::age(started, now)
            );
        }
        text.push_str(&head);
        text.push('\n');
        let parts: Vec<String> = h
            .queues
            .iter()
            .map(|p| format!("{} ({})", p.queue, p.role))
            .collect();
        let mut fields = vec![
            ("queues", parts.join(", ")),
            ("owner", format!("{} on node {}", h.owner_pod, h.node)),
            (
                "victims",
                if h.victims.is_empty() {
                    "none".to_owned()
                } else {
                    h.victims.join(", ")
                },
            ),
        ];
        if !h.phases.is_empty() {
            let steps: Vec<String> = h
                .phases
                .iter()
                .map(|p| format!("{} +{}", p.phase, p.took_millis))
                .collect();
            let last = h.phases.last().map_or(0, |p| p.at_millis);
            fields.push(("timeline", format!("{} = {last}ms", steps.join(", "))));
        }
        for (key, value) in fields {
            let _ = writeln!(text, "  {key:<12}{value}");
        }
        if !h.checkpoints.is_empty() {
            text.push_str("  checkpoints\n");
            let rows: Vec<Vec<String>> = h
                .checkpoints
                .iter()
                .map(|c| {
                    vec![
                        c.pod.clone(),
                        c.driver.clone(),
                        c.result.clone(),
                        format!("{}ms", c.millis),
                        c.message.clone(),
                    ]
                })
                .collect();
            let table = render::table(&["POD", "DRIVER", "RESULT", "TOOK", "MESSAGE"], &rows);
            for line in table.lines() {
                let _ = writeln!(text, "    {line}");
            }
        }
    }
    text
}

/// Runs `kubectl gpuqueue handovers`.
pub fn run(args: &HandoversArgs, now: Timestamp, out: &mut dyn Write) -> Result<(), InspectError> {
    let queues = connect::block_on(async {
        let cluster = connect::connect(&args.cluster).await?;
        connect::read_queues(cluster.client, args.queue.as_deref()).await
    })?;
    let views = views(&queues);
    if render::structured(&views, args.output, out)? {
        return Ok(());
    }
    if views.is_empty() {
        let notes: Vec<String> = queues
            .iter()
            .flat_map(|q| {
                let name = q.metadata.name.clone().unwrap_or_default();
                crate::queues::status_notes(q)
                    .into_iter()
                    .map(move |note| format!("{name}: {note}"))
            })
            .collect();
        match &args.queue {
            Some(queue) => writeln!(out, "Queue {queue} has recorded no handover yet.")?,
            None => writeln!(out, "No queue has recorded a handover yet.")?,
        }
        for note in notes {
            writeln!(out, "note: {note}")?;
        }
        return Ok(());
    }
    out.write_all(render(&views, now).as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    fn now() -> Timestamp {
        "2026-01-10T12:00:00Z".parse().unwrap()
    }

    fn queue(name: &str, handovers: &str) -> GpuQueue {
        serde_yaml::from_str(&format!(
            "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata: {{name: {name}}}\nspec:\n  namespaces: [{name}]\n  resources: [{{name: nvidia.com/gpu, guaranteed: 8}}]\nstatus:\n  lastHandovers:\n{handovers}"
        ))
        .unwrap()
    }

    fn record(id: &str, role: &str, started: &str, outcome: &str, total: i64) -> String {
        format!(
            "    - id: {id}
      role: {role}
      ownerPod: online/vllm-4
      node: gpu-node-1
      victims: [batch/train-1, batch/train-2]
      startedAt: '{started}'
      outcome: '{outcome}'
      budgetMillis: 3000
      totalMillis: {total}
      phases:
        - {{phase: plan, atMillis: 12}}
        - {{phase: intent, atMillis: 43}}
        - {{phase: reserve, atMillis: 61}}
        - {{phase: checkpoint, atMillis: 1265}}
        - {{phase: evictAccepted, atMillis: 1305}}
        - {{phase: victimsGone, atMillis: 2405}}
        - {{phase: ownerBound, atMillis: {total}}}
      checkpoints:
        - {{pod: batch/train-1, driver: vllm, result: Succeeded, millis: 1180}}
        - {{pod: batch/train-2, driver: vllm, result: TimedOut, millis: 1204, message: 'vLLM still had 3 requests running at the deadline'}}
"
        )
    }

    #[test]
    fn each_handover_is_shown_once_with_every_queue_and_its_timeline() {
        let queues = vec![
            queue(
                "batch",
                &record("rc-2", "victim", "2026-01-10T11:55:00Z", "Completed", 2710),
            ),
            queue(
                "online",
                &format!(
                    "{}{}",
                    record("rc-2", "owner", "2026-01-10T11:55:00Z", "Completed", 2710),
                    record(
                        "rc-1",
                        "owner",
                        "2026-01-10T10:00:00Z",
                        "VictimsNotGone: a victim was still terminating at the limit",
                        3400
                    )
                ),
            ),
        ];
        let views = views(&queues);
        assert_eq!(views.len(), 2);
        assert_eq!(
            render(&views, now()),
            "\
rc-2   Completed   2710ms of 3000ms budget   started 2026-01-10T11:55:00Z (5m ago)
  queues      online (owner), batch (victim)
  owner       online/vllm-4 on node gpu-node-1
  victims     batch/train-1, batch/train-2
  timeline    plan +12, intent +31, reserve +18, checkpoint +1204, evictAccepted +40, victimsGone +1100, ownerBound +305 = 2710ms
  checkpoints
    POD             DRIVER   RESULT      TOOK     MESSAGE
    batch/train-1   vllm     Succeeded   1180ms
    batch/train-2   vllm     TimedOut    1204ms   vLLM still had 3 requests running at the deadline

rc-1   VictimsNotGone: a victim was still terminating at the limit   3400ms of 3000ms budget (over by 400ms)   started 2026-01-10T10:00:00Z (120m ago)
  queues      online (owner)
  owner       online/vllm-4 on node gpu-node-1
  victims     batch/train-1, batch/train-2
  timeline    plan +12, intent +31, reserve +18, checkpoint +1204, evictAccepted +40, victimsGone +1100, ownerBound +995 = 3400ms
  checkpoints
    POD             DRIVER   RESULT      TOOK     MESSAGE
    batch/train-1   vllm     Succeeded   1180ms
    batch/train-2   vllm     TimedOut    1204ms   vLLM still had 3 requests running at the deadline
"
        );
    }

    #[test]
    fn one_queues_records_and_json() {
        let batch = queue(
            "batch",
            &record("rc-2", "victim", "2026-01-10T11:55:00Z", "Completed", 2710),
        );
        let views = views(&[batch]);
        assert_eq!(
            views[0].queues,
            [QueuePart {
                queue: "batch".into(),
                role: "victim".into()
            }]
        );
        let json = serde_json::to_value(&views).unwrap();
        assert_eq!(
            json[0]["phases"][3],
            serde_json::json!({"phase": "checkpoint", "atMillis": 1265, "tookMillis": 1204})
        );
        assert_eq!(json[0]["checkpoints"][1]["result"], "TimedOut");
        assert_eq!(json[0]["startedAt"], "2026-01-10T11:55:00Z");
        assert!(views_of_nothing().is_empty());
    }

    fn views_of_nothing() -> Vec<HandoverView> {
        views(&[queue("a", "    []\n")])
    }
}
