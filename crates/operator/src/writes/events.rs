//! Kubernetes Events (events.k8s.io/v1) that tell users what the operator did and why: on pods
//! (admitted, waiting with the cause) and on queues (quota edited, conditions changed).
//!
//! Events are queued and published by a task of their own, so a burst of admissions is not
//! slowed by one event write per pod; publishing is best effort (a failed or dropped event is
//! logged, never a reason to stop). An event the API server could not take because it was
//! down, restarting or overloaded is tried again for up to [`RETRY_LIMIT`], as client-go's
//! recorder does: an eviction announced while the API server restarts is still recorded.
//! kube's `Recorder` folds an event repeated within minutes
//! into a series, and the admission loop publishes a waiting event only when a pod's cause of
//! waiting changes, so a pod that waits for an hour gets one event, not one per pass.
//!
//! **Events wait for handovers.** While a handover runs ([`Events::hold`]), queued events are
//! not written, for at most [`HOLD_LIMIT`] each: in a burst of reclaims the API server is the
//! bottleneck, and an event write is one more request ahead of an owner's eviction or release
//! (a 12-owner burst wrote about 22 events before its last owner was bound). An event's time
//! is when it is written, so during a burst it may show up to [`HOLD_LIMIT`] late; the order
//! is kept. An event a caller waits for ([`Events::send_and_wait`]) is written at once, with
//! those queued before it.
//!
//! The `Recorder` keeps every event it published for six minutes, and drops old ones only when
//! it publishes again: after a burst of 10,000 admissions it would hold 10,000 events for as
//! long as the cluster stays at rest. The publisher starts a new one after [`CACHE_ENTRIES`]
//! events, so at most that many are kept, as client-go's recorder keeps an LRU cache of 4,096.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuqueue_api::FIELD_MANAGER;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};

/// Most characters of an event note the API server accepts.
const MAX_NOTE: usize = 1024;

/// Events waiting to be published; beyond this, new ones are dropped (and logged).
const QUEUE_CAPACITY: usize = 8192;

/// How many published events the recorder keeps to fold repeats into series (client-go's
/// event correlator keeps 4,096); a repeat of an older one starts a new event.
const CACHE_ENTRIES: usize = 4096;

/// The longest a queued event waits for the handovers in flight to end ([`Events::hold`]).
const HOLD_LIMIT: Duration = Duration::from_secs(1);

/// How long an event the API server could not take is retried (client-go's recorder tries
/// 12 times, about two minutes; a restart takes seconds). Later events wait meanwhile, in
/// the queue, so their order is kept.
const RETRY_LIMIT: Duration = Duration::from_secs(30);
/// The first wait before a retry; doubled after each, up to [`MAX_RETRY_WAIT`].
const FIRST_RETRY_WAIT: Duration = Duration::from_millis(200);
const MAX_RETRY_WAIT: Duration = Duration::from_secs(4);

/// Queues events for publication as `gpuqueue-operator` (instance: this replica).
#[derive(Debug, Clone)]
pub struct Events {
    queue: mpsc::Sender<Queued>,
    /// How many events were queued, in queue order (taken with the queueing, so that the
    /// count matches the order the publisher sees).
    queued: Arc<Mutex<u64>>,
    /// How many queued events the publisher has written (or given up on).
    written: watch::Receiver<u64>,
    holding: Arc<watch::Sender<Holding>>,
}

/// An event in the queue.
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub regarding: ObjectReference,
    pub notice: Notice,
    at: Instant,
}

/// Whether queued events wait ([`Events::hold`]).
#[derive(Debug, Default, Clone, Copy)]
struct Holding {
    /// [`Hold`]s alive.
    holds: usize,
    /// Events up to this number are written whatever the holds: a caller waits for one.
    flush_to: u64,
}

/// Keeps queued events back while it lives ([`Events::hold`]).
#[derive(Debug)]
#[must_use = "events are held only while the Hold lives"]
pub struct Hold(Arc<watch::Sender<Holding>>);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.send_modify(|holding| holding.holds -= 1);
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

/// The task that publishes queued events; run it with [`Publisher::run`].
pub struct Publisher {
    recorder: Recorder,
    /// What a new recorder is made of, once the current one has cached [`CACHE_ENTRIES`].
    client: Client,
    reporter: Reporter,
    /// Events the current recorder has published.
    cached: usize,
    /// [`CACHE_ENTRIES`] (tests use fewer).
    cache_entries: usize,
    queue: mpsc::Receiver<Queued>,
    written: watch::Sender<u64>,
    holding: watch::Receiver<Holding>,
    /// [`HOLD_LIMIT`] (tests use less).
    hold_limit: Duration,
    /// When a write last found no API server to answer it.
    unreachable_at: Option<tokio::time::Instant>,
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
        let events = Self::with_queue(sender, written_rx);
        let publisher = Publisher {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
            cached: 0,
            cache_entries: CACHE_ENTRIES,
            queue: receiver,
            written,
            holding: events.holding.subscribe(),
            hold_limit: HOLD_LIMIT,
            unreachable_at: None,
        };
        (events, publisher)
    }

    fn with_queue(queue: mpsc::Sender<Queued>, written: watch::Receiver<u64>) -> Self {
        Self {
            queue,
            queued: Arc::default(),
            written,
            holding: Arc::new(watch::Sender::new(Holding::default())),
        }
    }

    /// A handle whose events land in the returned receiver, for tests of what is published.
    #[cfg(test)]
    pub(crate) fn captured() -> (Self, mpsc::Receiver<Queued>) {
        let (sender, receiver) = mpsc::channel(QUEUE_CAPACITY);
        (Self::with_queue(sender, watch::channel(0).1), receiver)
    }

    /// Keeps queued events back until the returned [`Hold`] and every other one are dropped,
    /// each event at most [`HOLD_LIMIT`] after it was queued: a handover takes one while it
    /// runs, so that events do not compete with its writes.
    pub fn hold(&self) -> Hold {
        self.holding.send_modify(|holding| holding.holds += 1);
        Hold(Arc::clone(&self.holding))
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
        self.holding
            .send_modify(|holding| holding.flush_to = holding.flush_to.max(number));
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
        let event = Queued {
            regarding,
            notice,
            at: Instant::now(),
        };
        if let Err(error) = self.queue.try_send(event) {
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
        while let Some(Queued {
            regarding,
            notice,
            at,
        }) = self.queue.recv().await
        {
            self.wait_for_handovers(at).await;
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
            self.cached += 1;
            if self.cached > self.cache_entries {
                self.recorder = Recorder::new(self.client.clone(), self.reporter.clone());
                self.cached = 1;
            }
            if let Err(error) = self.publish(&event, &regarding).await {
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

impl Publisher {
    /// Waits while a [`Hold`] lives, until `queued_at` plus the hold limit, unless a caller
    /// waits for this event or a later one.
    async fn wait_for_handovers(&mut self, queued_at: Instant) {
        let number = *self.written.borrow() + 1;
        let quiet = self
            .holding
            .wait_for(|holding| holding.holds == 0 || holding.flush_to >= number);
        // A closed channel (every handle dropped) holds nothing back either.
        let _ = tokio::time::timeout_at(queued_at + self.hold_limit, quiet).await;
    }

    /// Publishes one event, retrying while the API server is unreachable or answers that it
    /// cannot take it now, for at most [`RETRY_LIMIT`]. A retry after an answer lost on the
    /// way back may write the event twice; losing it would be worse.
    async fn publish(&mut self, event: &Event, regarding: &ObjectReference) -> kube::Result<()> {
        let give_up = tokio::time::Instant::now() + RETRY_LIMIT;
        let mut wait = FIRST_RETRY_WAIT;
        loop {
            let result = self.recorder.publish(event, regarding).await;
            let now = tokio::time::Instant::now();
            if let Err(error) = &result
                && is_unreachable(error)
            {
                self.unreachable_at = Some(now);
            }
            let just_back = self
                .unreachable_at
                .is_some_and(|at| now.duration_since(at) < RETRY_LIMIT);
            match result {
                Err(error) if worth_retrying(&error, just_back) && now + wait < give_up => {
                    tracing::debug!(%error, ?wait, "the API server did not take an event; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(MAX_RETRY_WAIT);
                }
                result => return result,
            }
        }
    }
}

/// Whether a failed write may go through later: the API server was unreachable (restarting,
/// the connection dropped) or answered that it is overloaded or not ready; not a refusal of
/// the event itself (invalid, its namespace gone). A kube-apiserver that has just started
/// answers 403 until its RBAC authorizer has synced, so when the API server was unreachable
/// within [`RETRY_LIMIT`] (`just_back`) a 403 is retried as well; otherwise it is a missing
/// grant, logged.
fn worth_retrying(error: &kube::Error, just_back: bool) -> bool {
    match error {
        kube::Error::Api(status) if status.code == 403 => just_back,
        kube::Error::Api(status) => matches!(status.code, 429 | 500 | 502 | 503 | 504),
        error => is_unreachable(error),
    }
}

/// Whether the request found no API server to answer it.
fn is_unreachable(error: &kube::Error) -> bool {
    matches!(error, kube::Error::HyperError(_) | kube::Error::Service(_))
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
    use crate::mock_api;

    fn pod(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some("batch".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        }
    }

    fn waiting() -> Notice {
        Notice {
            warning: false,
            reason: "Waiting",
            action: "Wait",
            note: "queue batch: 24 of 24 GPUs in use".into(),
        }
    }

    /// A repeat within the recorder's memory is a series (PATCH); once the publisher has
    /// started a new recorder, the same event is created again (POST): at most
    /// `cache_entries` events are kept.
    #[tokio::test]
    async fn the_recorder_keeps_a_bounded_number_of_events_for_series() {
        let (client, log) = mock_api::serve(|request| (200, request.body.clone()));
        let (events, mut publisher) = Events::new(client, "test");
        publisher.cache_entries = 2;
        for name in ["a", "a", "b", "a"] {
            events.send(pod(name), waiting());
        }
        drop(events);
        publisher.run().await;
        let methods: Vec<String> = mock_api::requests(&log).into_iter().map(|r| r.0).collect();
        assert_eq!(methods, ["POST", "PATCH", "POST", "POST"]);
    }

    /// Events whose publisher writes to a mock API server that answers every request with its
    /// body; `arrivals` gives when each request came, on tokio's clock, counted from this call.
    fn timed_events() -> (Events, Publisher, impl Fn() -> Vec<Duration>) {
        let start = tokio::time::Instant::now();
        let (client, log) = mock_api::serve(|request| (200, request.body.clone()));
        let (events, publisher) = Events::new(client, "test");
        let arrivals = move || {
            crate::sync::lock(&log)
                .iter()
                .map(|s| s.at - start)
                .collect()
        };
        (events, publisher, arrivals)
    }

    #[tokio::test(start_paused = true)]
    async fn events_wait_while_a_handover_holds_them_and_go_when_it_ends() {
        let (events, publisher, arrivals) = timed_events();
        let hold = events.hold();
        let second = events.hold();
        events.send(pod("a"), waiting());
        events.send(pod("b"), waiting());
        let publisher = tokio::spawn(publisher.run());
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(hold);
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(second);
        drop(events);
        publisher.await.unwrap();
        let ms = Duration::from_millis;
        // Written once no hold is left.
        assert_eq!(arrivals(), [ms(400), ms(400)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_event_is_written_after_the_limit_and_one_waited_for_at_once() {
        let (events, publisher, arrivals) = timed_events();
        let hold = events.hold();
        events.send(pod("a"), waiting());
        let publisher = tokio::spawn(publisher.run());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        events.send(pod("b"), waiting());
        events.send(pod("c"), waiting());
        events
            .send_and_wait(pod("d"), waiting(), Duration::from_secs(5))
            .await;
        events.send(pod("e"), waiting());
        drop(events);
        drop(hold);
        publisher.await.unwrap();
        let ms = Duration::from_millis;
        // `a` at its limit; `b` and `c` with `d`, which a caller waits for; `e` once the hold
        // is gone.
        assert_eq!(
            arrivals(),
            [ms(1000), ms(1500), ms(1500), ms(1500), ms(1500)]
        );
    }

    #[test]
    fn long_notes_are_cut_within_the_limit_on_a_character_boundary() {
        let short = "queue batch: 24 of 24 GPUs in use".to_owned();
        assert_eq!(truncate(short.clone(), MAX_NOTE), short);
        let long = "é".repeat(MAX_NOTE);
        let cut = truncate(long, MAX_NOTE);
        assert!(cut.len() <= MAX_NOTE);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn an_unreachable_or_overloaded_api_server_is_retried_and_a_refusal_is_not() {
        let answer =
            |code| kube::Error::Api(kube::core::Status::failure("", "").with_code(code).boxed());
        for code in [429, 500, 503, 504] {
            assert!(worth_retrying(&answer(code), false), "{code}");
        }
        for code in [400, 403, 404, 409, 422] {
            assert!(!worth_retrying(&answer(code), false), "{code}");
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let refused = kube::Error::Service(Box::new(refused));
        assert!(is_unreachable(&refused));
        assert!(worth_retrying(&refused, false));
        let bad = serde_json::from_str::<u8>("x").unwrap_err();
        assert!(!worth_retrying(&kube::Error::SerdeError(bad), true));
    }

    #[test]
    fn a_forbidden_answer_right_after_an_outage_is_the_authorizer_warming_up() {
        let forbidden = kube::Error::Api(
            kube::core::Status::failure("events.events.k8s.io is forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        );
        assert!(worth_retrying(&forbidden, true));
        assert!(
            !worth_retrying(&forbidden, false),
            "a missing grant is not retried"
        );
        assert!(!is_unreachable(&forbidden));
    }
}
