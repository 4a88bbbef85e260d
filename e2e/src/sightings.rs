//! A watch that folds every object version it is sent into a value the caller reads while it
//! runs. Benchmarks use it where a later read would miss something: a queue keeps only its
//! newest handover records, and when a pod appeared or was bound is known only as it happens.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

/// What a watch has seen so far; the watch runs until this is dropped or finished.
#[derive(Debug)]
pub struct Sightings<S> {
    seen: Arc<Mutex<S>>,
    task: tokio::task::JoinHandle<()>,
}

impl<S: Default + Send + 'static> Sightings<S> {
    /// Watches `api` with `config` (retrying with the watcher's default backoff; an error
    /// between retries is skipped) and folds each object version into the value as it arrives.
    pub fn start<K>(
        api: Api<K>,
        config: watcher::Config,
        mut fold: impl FnMut(&mut S, K) + Send + 'static,
    ) -> Self
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        let seen = Arc::new(Mutex::new(S::default()));
        let into = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(object) = event else { continue };
                fold(
                    &mut into.lock().unwrap_or_else(PoisonError::into_inner),
                    object,
                );
            }
        });
        Self { seen, task }
    }

    /// What was seen until now; the watch goes on.
    pub fn snapshot(&self) -> S
    where
        S: Clone,
    {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the watch and returns what it saw.
    pub fn finish(self) -> S
    where
        S: Clone,
    {
        self.task.abort();
        self.snapshot()
    }
}

impl<S> Drop for Sightings<S> {
    fn drop(&mut self) {
        self.task.abort();
    }
}
