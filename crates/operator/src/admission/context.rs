//! What the admission loop and the writes it starts share: the [`Context`] the wiring hands
//! in, and the per-term state every background write needs.

use std::{
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use kube::Client;
use tokio::{
    sync::{Notify, Semaphore},
    task::JoinSet,
};

use super::{
    at_creation::AtCreation,
    metrics::{AdmissionMetrics, FragmentationGauges, QueueGauges},
};
use crate::{
    cluster::{assumed::Assumed, debounce::Debounce, stores::Stores},
    leader::Term,
    reclaim::Reclaimer,
    seal::Seals,
    writes::events::Events,
};

/// API writes in flight at once: enough to admit a burst of pods quickly, well under the API
/// server's default limit of 200 concurrent mutating requests.
pub const WRITE_CONCURRENCY: usize = 32;

/// After a write failed for a reason other than the object moving on (which brings its own
/// watch event), the next pass runs this much later.
pub(super) const RETRY_AFTER: Duration = Duration::from_secs(2);

/// What the loop needs; cheap to clone.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub stores: Stores,
    pub metrics: AdmissionMetrics,
    pub queue_gauges: QueueGauges,
    pub fragmentation_gauges: FragmentationGauges,
    pub events: Events,
    pub debounce: Debounce,
    /// The reclaim executor.
    pub reclaimer: Reclaimer,
    /// The live snapshot this loop shares with the webhook.
    pub at_creation: AtCreation,
    /// Writes the stores have not shown yet: the process's, kept from term to term.
    pub assumed: Arc<Mutex<Assumed>>,
    /// The operator's namespace, where the seal's key is kept.
    pub namespace: String,
    /// The seal admissions are written and read with, loaded when a term starts.
    pub seals: Seals,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("stores", &self.stores)
            .field("debounce", &self.debounce)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
impl Context {
    /// A context on `client` and `stores`, with metrics nobody reads and events nobody sends.
    pub(super) fn for_tests(client: Client, stores: Stores) -> Self {
        let mut registry = crate::metrics::registry();
        let (events, _publisher) = Events::new(client.clone(), "test");
        Self {
            reclaimer: Reclaimer::for_tests(client.clone(), stores.clone()),
            client,
            stores,
            metrics: AdmissionMetrics::register(&mut registry),
            queue_gauges: QueueGauges::register(&mut registry),
            fragmentation_gauges: FragmentationGauges::register(&mut registry),
            events,
            debounce: Debounce {
                quiet: Duration::from_millis(10),
                max: Duration::from_millis(100),
            },
            at_creation: AtCreation::new(false),
            assumed: Arc::default(),
            namespace: "gpuqueue-system".into(),
            seals: Seals::default(),
        }
    }
}

/// State shared by the loop and the writes it started.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) context: Context,
    pub(super) term: Term,
    /// Woken by a write that failed, after [`RETRY_AFTER`]: the next pass decides again.
    pub(super) retry: Arc<Notify>,
    pub(super) permits: Arc<Semaphore>,
}

impl Shared {
    pub(super) fn assumed(&self) -> MutexGuard<'_, Assumed> {
        crate::sync::lock(&self.context.assumed)
    }

    /// Starts `write` for the object with `uid` in the background; the caller has marked it in
    /// flight. The write waits for a permit, and is skipped if the term ended meanwhile.
    pub(super) fn spawn<F>(&self, tasks: &mut JoinSet<()>, uid: String, write: F)
    where
        F: Future<Output = WriteResult> + Send + 'static,
    {
        let shared = self.clone();
        tasks.spawn(async move {
            let Ok(_permit) = shared.permits.acquire().await else {
                return;
            };
            if !shared.term.is_current() {
                // Never sent: the next term must not count on it.
                shared.assumed().abandon(&uid);
                return;
            }
            let written = write.await;
            shared.assumed().end(&uid);
            // A failure has to be retried. A stale object usually brings its own watch event,
            // but that event may have come while this write was assumed, and been read through
            // it: nothing else would decide the object again. Not at once: a write the API
            // server refuses the same way each time would start pass after pass.
            if written != WriteResult::Done {
                tokio::time::sleep(RETRY_AFTER).await;
                shared.retry.notify_one();
            }
        });
    }
}

/// What became of one background write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WriteResult {
    Done,
    /// The object moved on under it; decided again from the store.
    Stale,
    Failed,
}

#[cfg(test)]
pub(super) mod tests {
    use tokio::sync::watch;

    use super::*;
    use crate::{cluster::testing::TestStores, leader::LeaderState};

    /// Shared state on `client` and `stores`, with the sender that holds its term.
    pub(crate) async fn shared(
        client: Client,
        stores: Stores,
    ) -> (Shared, watch::Sender<LeaderState>) {
        let (term, state) = crate::leader::test_term().await;
        let shared = Shared {
            context: Context::for_tests(client, stores),
            term,
            retry: Arc::new(Notify::new()),
            permits: Arc::new(Semaphore::new(WRITE_CONCURRENCY)),
        };
        (shared, state)
    }

    /// Review finding: a write that found its pod changed woke no pass, on the belief that
    /// the change brings its own watch event; but that event could come while the write was
    /// assumed, be read through it, and leave the pod gated with no pass to come.
    #[tokio::test(start_paused = true)]
    async fn a_write_that_found_its_object_changed_wakes_a_pass_later() {
        let stores = TestStores::new().stores;
        let (shared, _term) = shared(crate::mock_api::stalled(), stores).await;
        let mut tasks = JoinSet::new();
        let start = tokio::time::Instant::now();
        assert!(shared.assumed().begin("p"));
        shared.spawn(&mut tasks, "p".into(), async { WriteResult::Stale });
        shared.retry.notified().await;
        assert_eq!(start.elapsed(), RETRY_AFTER);
        assert!(!shared.assumed().in_flight("p"));
    }
}
