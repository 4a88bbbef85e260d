//! When a waiting pod's reason is written: pure rules over what this process knows of the
//! pod's recorded reason and how long it has waited.

use std::{collections::HashMap, fmt::Display};

use gpuqueue_core::admission::WaitReason;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;

/// A waiting pod's reason is rewritten at once when its cause changes, but when only its
/// numbers change (capacity filling up around it), at most this often: a burst of pods that do
/// not fit must not cost one write per pod per pass.
const REASON_REFRESH: SignedDuration = SignedDuration::from_secs(30);

/// A pod's first waiting reason is written once it has waited this long (by this process's
/// count): a pod admitted sooner never needs one, so a burst of pods that briefly wait costs no
/// reason written and removed again, and the writes that admit pods go first.
pub(super) const FIRST_REASON_AFTER: SignedDuration = SignedDuration::from_secs(1);

/// When this process first saw each waiting pod wait (by uid), kept from pass to pass for the
/// pods that still wait.
#[derive(Debug, Default)]
pub(super) struct WaitingSince(HashMap<String, Timestamp>);

impl WaitingSince {
    /// When the pod began to wait: as the last pass recorded, or `now` for a pod seen waiting
    /// first. `next` collects the record for the next pass, so pods no longer seen waiting are
    /// forgotten.
    pub(super) fn since(&self, next: &mut Self, pod: &Pod, now: Timestamp) -> Timestamp {
        let Some(uid) = pod.metadata.uid.clone() else {
            return now;
        };
        let since = self.0.get(&uid).copied().unwrap_or(now);
        next.0.insert(uid, since);
        since
    }
}

/// What this process knows of a pod's recorded waiting reason.
#[derive(Debug, Clone, Copy)]
pub(super) struct RecordedReason<'a> {
    pub(super) reason: Option<&'a str>,
    pub(super) written_at: Option<Timestamp>,
    /// When this process first saw the pod wait.
    pub(super) waiting_since: Timestamp,
    pub(super) now: Timestamp,
}

/// Whether a waiting reason is to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReasonTiming {
    Now,
    Not,
    /// At this time, if the pod still waits then.
    At(Timestamp),
}

impl RecordedReason<'_> {
    /// Whether `line` (with cause `code`) should replace the recorded reason: a first reason
    /// once the pod has waited [`FIRST_REASON_AFTER`]; then always when the cause changed, and
    /// for new numbers only once the recorded line is [`REASON_REFRESH`] old.
    pub(super) fn due(&self, code: &str, line: &str) -> ReasonTiming {
        let Some(reason) = self.reason else {
            let at = self.waiting_since + FIRST_REASON_AFTER;
            return if self.now < at {
                ReasonTiming::At(at)
            } else {
                ReasonTiming::Now
            };
        };
        if reason == line {
            return ReasonTiming::Not;
        }
        let fresh = self
            .written_at
            .is_some_and(|at| self.now.duration_since(at) < REASON_REFRESH);
        if self.cause_changed(code) || !fresh {
            ReasonTiming::Now
        } else {
            ReasonTiming::Not
        }
    }

    /// Whether the recorded cause differs from `code` (then an event is due).
    pub(super) fn cause_changed(&self, code: &str) -> bool {
        self.reason.and_then(recorded_cause) != Some(code)
    }
}

/// The cause of a recorded reason. The recorded line is the only record of a reason written
/// before this process started, so it is read back here, and only here.
fn recorded_cause(line: &str) -> Option<&str> {
    line.split_once(": ").map(|(cause, _)| cause)
}

/// A waiting reason to record: `<code>: <text>`, with what it needs from the core's reason kept
/// beside the text (its code, and whether it warns), so nothing is read back from the line.
#[derive(Debug)]
pub(super) struct WaitLine {
    pub(super) queue: Option<String>,
    pub(super) code: &'static str,
    pub(super) line: String,
    warns: bool,
}

impl WaitLine {
    /// The line of the core's reason, told in its own words.
    pub(super) fn of(queue: Option<String>, reason: &WaitReason) -> Self {
        Self::new(queue, reason, reason)
    }

    /// The line of `reason` told as `text` (a pod the core cannot read is told by the error
    /// that stopped its conversion).
    pub(super) fn new(queue: Option<String>, reason: &WaitReason, text: impl Display) -> Self {
        let code = reason.code();
        Self {
            queue,
            code,
            line: format!("{code}: {text}"),
            warns: reason.needs_action(),
        }
    }

    /// The text after the code: the note of the event that announces it.
    pub(super) fn text(&self) -> &str {
        &self.line[self.code.len() + 2..]
    }

    /// Whether the cause is one the pod's owner or an admin must fix (then its event is a
    /// warning).
    pub(super) fn warns(&self) -> bool {
        self.warns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_waiting_reason_is_rewritten_when_its_cause_changes_and_refreshed_when_stale() {
        let recorded = "NoRoom: queue team: ... (the most free on one suitable node is 2)";
        let known = |written: &str, now: &str| RecordedReason {
            reason: Some(recorded),
            written_at: Some(at(written)),
            waiting_since: at("2026-01-01T00:00:00Z"),
            now: at(now),
        };
        let fresh = known("2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z");
        let stale = known("2026-01-01T00:00:00Z", "2026-01-01T00:00:31Z");
        let new_numbers = "NoRoom: queue team: ... (the most free on one suitable node is 1)";
        assert_eq!(
            fresh.due("NoRoom", recorded),
            ReasonTiming::Not,
            "unchanged"
        );
        assert_eq!(
            fresh.due("NoRoom", new_numbers),
            ReasonTiming::Not,
            "same cause, recent: not yet"
        );
        assert_eq!(
            stale.due("NoRoom", new_numbers),
            ReasonTiming::Now,
            "same cause, stale: refreshed"
        );
        assert_eq!(
            fresh.due("OverCeiling", "OverCeiling: queue team: ..."),
            ReasonTiming::Now,
            "new cause"
        );
        assert!(fresh.cause_changed("OverCeiling") && !fresh.cause_changed("NoRoom"));
        // Written before this process started: unknown age, so refreshed.
        let inherited = RecordedReason {
            reason: Some(recorded),
            written_at: None,
            waiting_since: at("2026-01-01T00:00:00Z"),
            now: at("2026-01-01T00:00:00Z"),
        };
        assert_eq!(inherited.due("NoRoom", new_numbers), ReasonTiming::Now);
    }

    #[test]
    fn a_first_reason_is_written_once_the_pod_has_waited_a_second() {
        let recorded = "NoRoom: queue team: ...";
        let first = |now: &str| RecordedReason {
            reason: None,
            written_at: None,
            waiting_since: at("2026-01-01T00:00:00Z"),
            now: at(now),
        };
        assert_eq!(
            first("2026-01-01T00:00:00.300Z").due("NoRoom", recorded),
            ReasonTiming::At(at("2026-01-01T00:00:01Z")),
            "a pod admitted within the second never gets one"
        );
        assert_eq!(
            first("2026-01-01T00:00:01Z").due("NoRoom", recorded),
            ReasonTiming::Now
        );
        assert!(first("2026-01-01T00:00:01Z").cause_changed("NoRoom"));
    }

    #[test]
    fn a_pod_keeps_its_waiting_time_while_it_waits_and_loses_it_when_it_stops() {
        let pod = |uid: &str| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": uid, "uid": uid}}))
                .unwrap()
        };
        let (first, second, third) = (
            at("2026-01-01T00:00:00Z"),
            at("2026-01-01T00:00:00.500Z"),
            at("2026-01-01T00:00:01Z"),
        );
        let mut record = WaitingSince::default();
        let mut next = WaitingSince::default();
        assert_eq!(record.since(&mut next, &pod("a"), first), first);
        record = next;
        let mut next = WaitingSince::default();
        assert_eq!(
            record.since(&mut next, &pod("a"), second),
            first,
            "still waiting"
        );
        assert_eq!(record.since(&mut next, &pod("b"), second), second, "new");
        record = next;
        // "a" was admitted: not seen waiting in this pass, so forgotten.
        let mut next = WaitingSince::default();
        assert_eq!(record.since(&mut next, &pod("b"), third), second);
        record = next;
        let mut next = WaitingSince::default();
        assert_eq!(
            record.since(&mut next, &pod("a"), third),
            third,
            "waits again: anew"
        );
    }

    #[test]
    fn a_wait_line_is_its_code_and_text() {
        let reclaiming = WaitReason::ReclaimInProgress { id: "r1".into() };
        let line = WaitLine::new(Some("batch".into()), &reclaiming, "queue team: full");
        assert_eq!(line.line, "ReclaimInProgress: queue team: full");
        assert_eq!(line.text(), "queue team: full");
        assert!(!line.warns());
        let own = WaitLine::of(Some("batch".into()), &reclaiming);
        assert_eq!(own.text(), reclaiming.to_string());
        let invalid = WaitReason::InvalidRequest { rule: "x".into() };
        assert!(WaitLine::new(None, &invalid, "x").warns());
    }
}
