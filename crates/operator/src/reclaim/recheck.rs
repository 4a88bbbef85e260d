//! Asking again, just before a victim's eviction, whether its queue still borrows it. A plan
//! chose it as a borrower, but while its checkpoint ran the queue may have shrunk (its tenant
//! deleted pods, an admin raised its guarantee): evicting it then would take the queue below its
//! guarantee (the soak caught it). The answer is the core's
//! ([`gpuqueue_core::reclaim::victims_to_spare`]), from the snapshot of an admission pass:
//! every pass publishes it here, and a victim whose checkpoint was called (or whose handover an
//! earlier leader started) waits for the answer of a pass that began after its checkpoint ended,
//! asking for one at once. A victim evicted straight after its plan needs no new pass: its plan
//! is that answer, a few writes old.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use gpuqueue_core::model::PodKey;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How long an eviction waits for a pass that began after it asked: passes take milliseconds,
/// so only a loop that stopped (its term ended: the eviction is refused anyway) or a stalled one
/// makes it wait that long, and the last answer is taken then.
const FRESH_ANSWER_WAIT: Duration = Duration::from_millis(500);

/// The answers the passes publish and the evictions wait for; cheap to clone.
#[derive(Clone, Debug)]
pub struct Rechecks(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    answer: watch::Sender<Answer>,
    /// An eviction asks for a pass.
    wanted: Notify,
}

/// The victims the last pass found no longer borrowed.
#[derive(Debug, Default)]
struct Answer {
    /// When that pass began (before it read the stores).
    from: Option<Instant>,
    spared: HashSet<PodKey>,
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
    /// The answer of the pass that began at `from`: the victims to spare.
    pub fn publish(&self, from: Instant, spared: Vec<PodKey>) {
        self.0.answer.send_replace(Answer {
            from: Some(from),
            spared: spared.into_iter().collect(),
        });
    }

    /// Resolves when an eviction asks for a pass (the admission loop runs one).
    pub async fn wanted(&self) {
        self.0.wanted.notified().await;
    }

    /// Whether `victim`'s queue still borrows it, by a pass that began at `since` or later;
    /// by the last pass when none comes within [`FRESH_ANSWER_WAIT`].
    pub async fn still_borrowed(&self, victim: &PodKey, since: Instant) -> bool {
        let mut answers = self.0.answer.subscribe();
        let fresh = |answer: &Answer| answer.from.is_some_and(|from| from >= since);
        if !fresh(&answers.borrow_and_update()) {
            self.0.wanted.notify_one();
            let waited =
                tokio::time::timeout(FRESH_ANSWER_WAIT, answers.wait_for(|a| fresh(a))).await;
            if !matches!(waited, Ok(Ok(_))) {
                tracing::warn!(%victim, "no admission pass answered in time whether the victim's queue still borrows it; the last answer is taken");
            }
        }
        !answers.borrow().spared.contains(victim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> PodKey {
        PodKey::new("b", name)
    }

    #[tokio::test(start_paused = true)]
    async fn an_eviction_waits_for_a_pass_that_began_after_it_asked() {
        let rechecks = Rechecks::default();
        let old = Instant::now();
        rechecks.publish(old, Vec::new());
        tokio::time::advance(Duration::from_millis(10)).await;
        let since = Instant::now();
        let asking = tokio::spawn({
            let rechecks = rechecks.clone();
            async move { rechecks.still_borrowed(&key("v"), since).await }
        });
        // The loop is asked for a pass; the one before the question does not answer it.
        rechecks.wanted().await;
        tokio::time::advance(Duration::from_millis(5)).await;
        rechecks.publish(Instant::now(), vec![key("v")]);
        assert!(!asking.await.unwrap(), "the fresh pass spares it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fresh_answer_is_taken_at_once_and_a_missing_one_falls_back_to_the_last() {
        let rechecks = Rechecks::default();
        let since = Instant::now();
        rechecks.publish(since, vec![key("spared")]);
        assert!(!rechecks.still_borrowed(&key("spared"), since).await);
        assert!(rechecks.still_borrowed(&key("other"), since).await);
        // No pass comes: after the wait, the last answer.
        tokio::time::advance(Duration::from_millis(1)).await;
        let later = Instant::now();
        assert!(!rechecks.still_borrowed(&key("spared"), later).await);
        assert!(Instant::now() >= later + FRESH_ANSWER_WAIT);
    }
}
