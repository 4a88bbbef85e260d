//! Asking again, just before a victim's eviction, whether its queue still borrows it. A plan
//! chose it as a borrower, but while its checkpoint ran the queue may have shrunk (its tenant
//! deleted pods, an admin raised its guarantee): evicting it then would take the queue below its
//! guarantee (the soak caught it). The answer is the core's
//! ([`gpuqueue_core::reclaim::pending_victims`]), from the snapshot of an admission pass: every
//! pass publishes it here, and a victim whose checkpoint was called (or whose handover an
//! earlier leader started) waits for the answer of a pass that read the stores after its
//! checkpoint ended, while their watches (queues, pods, nodes, namespaces, DRA) were
//! delivering (a store whose watch is down may be seconds behind: the soak caught an eviction
//! on the word of one), and asks for one at once. A victim that answer does not name as still
//! borrowed is spared, and so is one no such answer comes for within [`ANSWER_WAIT`]: an
//! eviction the operator cannot vouch for is not sent. A victim evicted straight after its plan needs no new pass: its plan is that
//! answer, a few writes old.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use gpuqueue_core::{model::PodKey, reclaim::PendingVictim};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How long an eviction waits for an answer it can use. Passes take milliseconds; only stores
/// whose watches are down (an API server restarting: the eviction would be refused anyway), or
/// a loop that stopped (its term ended), make it wait that long.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// The answers the passes publish and the evictions wait for; cheap to clone.
#[derive(Clone, Debug)]
pub struct Rechecks(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    answer: watch::Sender<Answer>,
    /// An eviction asks for a pass.
    wanted: Notify,
}

/// What the last pass found of the victims in flight.
#[derive(Debug, Default)]
struct Answer {
    /// When that pass began reading the stores.
    from: Option<Instant>,
    /// Whether the watches the snapshot is read from were delivering then.
    live: bool,
    /// The victims whose queue still borrows them.
    borrowed: HashSet<PodKey>,
}

impl Default for Rechecks {
    fn default() -> Self {
        Self(Arc::new(Shared {
            answer: watch::Sender::new(Answer::default()),
            wanted: Notify::new(),
        }))
    }
}

impl Rechecks {
    /// The answer of the pass that began reading the stores at `from`, `live` or not.
    pub fn publish(&self, from: Instant, live: bool, victims: Vec<PendingVictim>) {
        self.0.answer.send_replace(Answer {
            from: Some(from),
            live,
            borrowed: victims
                .into_iter()
                .filter(|v| v.borrowed)
                .map(|v| v.key)
                .collect(),
        });
    }

    /// Resolves when an eviction asks for a pass (the admission loop runs one).
    pub async fn wanted(&self) {
        self.0.wanted.notified().await;
    }

    /// Whether `victim`'s queue still borrows it, by a pass that began reading live stores at
    /// `since` or later; `false` when none answers within [`ANSWER_WAIT`].
    pub async fn still_borrowed(&self, victim: &PodKey, since: Instant) -> bool {
        let mut answers = self.0.answer.subscribe();
        let usable = |answer: &Answer| answer.live && answer.from.is_some_and(|from| from >= since);
        if !usable(&answers.borrow_and_update()) {
            self.0.wanted.notify_one();
            let waited = tokio::time::timeout(ANSWER_WAIT, answers.wait_for(|a| usable(a))).await;
            if !matches!(waited, Ok(Ok(_))) {
                tracing::warn!(%victim, "no admission pass on live stores answered in time whether the victim's queue still borrows it; it is spared");
                return false;
            }
        }
        answers.borrow().borrowed.contains(victim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> PodKey {
        PodKey::new("b", name)
    }

    fn judged(name: &str, borrowed: bool) -> PendingVictim {
        PendingVictim {
            key: key(name),
            borrowed,
        }
    }

    /// Asks whether victim `b/v` is still borrowed, in a task of its own.
    fn ask(rechecks: &Rechecks, since: Instant) -> tokio::task::JoinHandle<bool> {
        let rechecks = rechecks.clone();
        tokio::spawn(async move { rechecks.still_borrowed(&key("v"), since).await })
    }

    #[tokio::test(start_paused = true)]
    async fn an_eviction_waits_for_a_pass_that_began_after_it_asked() {
        let rechecks = Rechecks::default();
        rechecks.publish(Instant::now(), true, vec![judged("v", true)]);
        tokio::time::advance(Duration::from_millis(10)).await;
        let asking = ask(&rechecks, Instant::now());
        // The loop is asked for a pass; the one before the question does not answer it.
        rechecks.wanted().await;
        tokio::time::advance(Duration::from_millis(5)).await;
        rechecks.publish(Instant::now(), true, vec![judged("v", false)]);
        assert!(!asking.await.unwrap(), "the fresh pass spares it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_on_stores_whose_watches_are_down_answers_nothing() {
        let rechecks = Rechecks::default();
        let asking = ask(&rechecks, Instant::now());
        rechecks.wanted().await;
        tokio::time::advance(Duration::from_millis(5)).await;
        // A stale store still counts the pods its tenant deleted: it would say "borrowed".
        rechecks.publish(Instant::now(), false, vec![judged("v", true)]);
        tokio::time::advance(Duration::from_millis(5)).await;
        rechecks.publish(Instant::now(), true, vec![judged("v", false)]);
        assert!(!asking.await.unwrap(), "answered once the watches deliver");
    }

    #[tokio::test(start_paused = true)]
    async fn a_victim_no_usable_pass_answers_for_in_time_is_spared() {
        let rechecks = Rechecks::default();
        let since = Instant::now();
        rechecks.publish(since, true, vec![judged("borrowed", true)]);
        assert!(rechecks.still_borrowed(&key("borrowed"), since).await);
        assert!(
            !rechecks.still_borrowed(&key("unknown"), since).await,
            "a victim the pass does not know of is not vouched for"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        let later = Instant::now();
        rechecks.publish(later, false, vec![judged("borrowed", true)]);
        assert!(!rechecks.still_borrowed(&key("borrowed"), later).await);
        assert!(Instant::now() >= later + ANSWER_WAIT);
    }
}
