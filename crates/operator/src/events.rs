//! Kubernetes Events (events.k8s.io/v1) that tell users what the operator did and why: on pods
//! (admitted, waiting with the cause) and on queues (quota edited, invalid spec, namespace
//! conflict). Publishing is best effort: a failed event is logged, never a reason to stop.
//!
//! kube's `Recorder` folds an event repeated within minutes into a series (a count on the
//! first one); the admission loop additionally publishes a waiting event only when a pod's
//! cause of waiting changes, so a pod that waits for an hour gets one event, not one per pass.

use gpuqueue_api::FIELD_MANAGER;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};

/// Most characters of an event note the API server accepts.
const MAX_NOTE: usize = 1024;

/// Publishes events as `gpuqueue-operator` (instance: this replica).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
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

impl Events {
    pub fn new(client: Client, identity: &str) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: Some(identity.to_owned()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Publishes `notice` about `regarding`.
    pub async fn publish(&self, regarding: &ObjectReference, notice: Notice) {
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
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(
                %error,
                reason = notice.reason,
                object = regarding.name.as_deref().unwrap_or_default(),
                "publishing an event failed"
            );
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
