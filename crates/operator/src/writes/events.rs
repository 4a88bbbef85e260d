//! Kubernetes Events (events.k8s.io/v1) that tell users what the operator did and why: on pods
//! (admitted, waiting with the cause) and on queues (quota edited, conditions changed).
//!
//! Events are queued and published by a task of their own, so a burst of admissions is not
//! slowed by one event write per pod; publishing is best effort (a failed or dropped event is
//! logged, never a reason to stop). kube's `Recorder` folds an event repeated within minutes
//! into a series, and the admission loop publishes a waiting event only when a pod's cause of
//! waiting changes, so a pod that waits for an hour gets one event, not one per pass.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuqueue_api::FIELD_MANAGER;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tokio::sync::{mpsc, watch};

/// Most characters of an event note the API server accepts.
const MAX_NOTE: usize = 1024;

/// Events waiting to be published; beyond this, new ones are dropped (and logged).
const QUEUE_CAPACITY: usize = 8192;

/// Queues events for publication as `gpuqueue-operator` (instance: this replica).
#[derive(Debug, Clone)]
pub struct Events {
    queue: mpsc::Sender<(ObjectReference, Notice)>,
    /// How many events were queued, in queue order (taken with the queueing, so that the
    /// count matches the order the publisher sees).
    queued: Arc<Mutex<u64>>,
    /// How many queued events the publisher has written (or given up on).
    written: watch::Receiver<u64>,
}

/// One event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub warning: bool,
    /// PascalCase, stable: tools match on it.
    pub reason: &'static str,
    /// What the operator did: `Admit`, `Wait`, `Reconcile`.
    pub action: &'static str,
    pub note: String,
}

/// The task that publishes queued events; run it with [`Publisher::run`].
pub struct Publisher {
    recorder: Recorder,
    queue: mpsc::Receiver<(ObjectReference, Notice)>,
    written: watch::Sender<u64>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

impl Events {
    pub fn new(client: Client, identity: &str) -> (Self, Publisher) {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: Some(identity.to_owned()),
        };
        let (sender, receiver) = mpsc::channel(QUEUE_CAPACITY);
        let (written, written_rx) = watch::channel(0);
        let publisher = Publisher {
            recorder: Recorder::new(client, reporter),
            queue: receiver,
            written,
        };
        (Self::with_queue(sender, written_rx), publisher)
    }

    fn with_queue(
        queue: mpsc::Sender<(ObjectReference, Notice)>,
        written: watch::Receiver<u64>,
    ) -> Self {
        Self {
            queue,
            queued: Arc::default(),
            written,
        }
    }

    /// A handle whose events land in the returned receiver, for tests of what is published.
    #[cfg(test)]
    pub(crate) fn captured() -> (Self, mpsc::Receiver<(ObjectReference, Notice)>) {
        let (sender, receiver) = mpsc::channel(QUEUE_CAPACITY);
        (Self::with_queue(sender, watch::channel(0).1), receiver)
    }

    /// Queues `notice` about `regarding`; never waits.
    pub fn send(&self, regarding: ObjectReference, notice: Notice) {
        self.queue_one(regarding, notice);
    }

    /// Queues `notice` and waits until the publisher has written it, at most `limit`: for an
    /// event that must reach the API server before the action it announces (the operator
    /// acts anyway once `limit` passed, e.g. with events queued ahead or the API slow).
    pub async fn send_and_wait(&self, regarding: ObjectReference, notice: Notice, limit: Duration) {
        let Some(number) = self.queue_one(regarding, notice) else {
            return;
        };
        let mut written = self.written.clone();
        let waited = tokio::time::timeout(limit, written.wait_for(|done| *done >= number)).await;
        if waited.is_err() {
            tracing::debug!(
                ?limit,
                "an event to be written first was not written in time"
            );
        }
    }

    /// Queues one event; its number in queue order, or `None` when it was dropped.
    fn queue_one(&self, regarding: ObjectReference, notice: Notice) -> Option<u64> {
        let mut queued = crate::sync::lock(&self.queued);
        if let Err(error) = self.queue.try_send((regarding, notice)) {
            tracing::warn!(%error, "event queue full or closed; event dropped");
            return None;
        }
        *queued += 1;
        Some(*queued)
    }
}

impl Publisher {
    /// Publishes queued events until every [`Events`] handle is dropped.
    pub async fn run(mut self) {
        while let Some((regarding, notice)) = self.queue.recv().await {
            let event = Event {
                type_: if notice.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: notice.reason.to_owned(),
                note: Some(truncate(notice.note, MAX_NOTE)),
                action: notice.action.to_owned(),
                secondary: None,
            };
            if let Err(error) = self.recorder.publish(&event, &regarding).await {
                tracing::warn!(
                    %error,
                    reason = notice.reason,
                    object = regarding.name.as_deref().unwrap_or_default(),
                    "publishing an event failed"
                );
            }
            self.written.send_modify(|done| *done += 1);
        }
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_within_the_limit_on_a_character_boundary() {
        let short = "queue batch: 24 of 24 GPUs in use".to_owned();
        assert_eq!(truncate(short.clone(), MAX_NOTE), short);
        let long = "é".repeat(MAX_NOTE);
        let cut = truncate(long, MAX_NOTE);
        assert!(cut.len() <= MAX_NOTE);
        assert!(cut.ends_with('…'));
    }
}
