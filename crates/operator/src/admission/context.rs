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
            // A stale object brings its own watch event; a failure has to be retried.
            if written == WriteResult::Failed {
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
