//! Leader election on a coordination.k8s.io Lease: one replica acts, the others stand by with
//! warm stores and a serving webhook, ready to take over.
//!
//! The lease itself is held by `kube-lease-manager` (acquire by server-side apply, renew before
//! expiry, release on shutdown). No lease gives fencing, and the manager keeps reporting
//! "leader" while its renewals fail, so this module adds a bound of its own: a replica *acts*
//! only while the Lease, as the API server shows it, names it holder and its last renewal is
//! recent: until `renewTime + leaseDurationSeconds − grace/2`, measured on this replica's clock
//! at the moment of each check. A standby takes over only after `renewTime +
//! leaseDurationSeconds`, so the two never act at once as long as clocks drift by less than
//! half the grace. A leader that is paused (SIGSTOP, a long GC-like stall) finds on waking
//! that its term is over before it writes anything.
//!
//! Work that needs leadership runs through [`run_while_leader`]: it starts when a [`Term`]
//! begins and is aborted the moment the term ends. Writers also call [`Term::is_current`]
//! right before each write, so nothing is written after the term ended even if the abort has
//! not landed yet.

use std::{future::Future, time::Duration};

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock;

/// How long a stopping replica waits for its lease to be released.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(3);

/// After work that needs leadership ended on its own (an error), wait this long before
/// starting it again, so that a persistent error does not spin.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// The election's settings.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    pub lease_name: String,
    pub namespace: String,
    pub identity: String,
    pub duration: Duration,
    pub grace: Duration,
}

/// Why the election could not start.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("--lease-grace ({grace:?}) must be shorter than --lease-duration ({duration:?})")]
    Timings { duration: Duration, grace: Duration },
    #[error("setting up Lease {namespace}/{name}: {source}")]
    Lease {
        namespace: String,
        name: String,
        source: LeaseManagerError,
    },
}

/// This replica's leadership as published to the rest of the process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaderState {
    /// Counts the terms this replica has held; 0 before the first.
    pub term: u64,
    /// While acting: the instant the current term ends unless the lease is renewed.
    pub acting_until: Option<Timestamp>,
}

/// The Lease as the API server shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub holder: Option<String>,
    pub renewed: Option<Timestamp>,
    pub duration: Option<SignedDuration>,
}

impl From<&Lease> for LeaseView {
    fn from(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            holder: spec.and_then(|spec| spec.holder_identity.clone()),
            renewed: spec
                .and_then(|spec| spec.renew_time.as_ref())
                .map(|time| time.0),
            duration: spec
                .and_then(|spec| spec.lease_duration_seconds)
                .map(|seconds| SignedDuration::from_secs(i64::from(seconds))),
        }
    }
}

/// Until when `identity` may act, given what the lease manager says (`held`) and the Lease as
/// the API server shows it; `None` when it may not act at all.
pub fn acting_until(
    held: bool,
    view: Option<&LeaseView>,
    identity: &str,
    grace: Duration,
) -> Option<Timestamp> {
    let view = view?;
    if !held || view.holder.as_deref() != Some(identity) {
        return None;
    }
    let margin = SignedDuration::try_from(grace / 2).ok()?;
    let expiry = view.renewed?.checked_add(view.duration?).ok()?;
    expiry.checked_sub(margin).ok()
}

/// Waits for terms of leadership.
#[derive(Debug, Clone)]
pub struct Leadership {
    state: watch::Receiver<LeaderState>,
}

/// One term of leadership. Cheap to clone; every clone ends with the term.
#[derive(Debug, Clone)]
pub struct Term {
    number: u64,
    state: watch::Receiver<LeaderState>,
}

impl Leadership {
    /// Follows a published state (the election's, or a test's).
    pub fn new(state: watch::Receiver<LeaderState>) -> Self {
        Self { state }
    }

    /// Waits until this replica acts; `None` once the election has stopped.
    pub async fn acquired(&mut self) -> Option<Term> {
        loop {
            {
                let state = *self.state.borrow_and_update();
                if state.acting_until.is_some_and(|until| clock::now() < until) {
                    return Some(Term {
                        number: state.term,
                        state: self.state.clone(),
                    });
                }
            }
            self.state.changed().await.ok()?;
        }
    }
}

/// A term that lasts an hour for tests, and the sender that ends it (keep it alive).
#[cfg(test)]
pub(crate) async fn test_term() -> (Term, watch::Sender<LeaderState>) {
    let (state, receiver) = watch::channel(LeaderState {
        term: 1,
        acting_until: Some(clock::now() + SignedDuration::from_hours(1)),
    });
    let term = Leadership::new(receiver).acquired().await.unwrap();
    (term, state)
}

impl Term {
    /// Whether this term still holds, now. Call it right before every write.
    pub fn is_current(&self) -> bool {
        let state = *self.state.borrow();
        state.term == self.number && state.acting_until.is_some_and(|until| clock::now() < until)
    }

    /// The term's number.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Resolves when the term is over: the lease was lost or released, or it was not renewed
    /// in time.
    pub async fn lost(&mut self) {
        loop {
            if !self.is_current() {
                return;
            }
            let until = self.state.borrow().acting_until;
            let wait = until
                .and_then(|until| Duration::try_from(until.duration_since(clock::now())).ok())
                .unwrap_or_default();
            tokio::select! {
                changed = self.state.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// Starts the election. The returned [`Leadership`] reports terms until `shutdown`, when the
/// lease is released so that a standby takes over at once instead of after the lease expires:
/// once the last term has ended and `handed_on` resolved (what the term started that the next
/// leader must see has landed).
pub async fn elect(
    client: Client,
    config: LeaderConfig,
    metrics: LeaderMetrics,
    shutdown: CancellationToken,
    handed_on: impl Future<Output = ()> + Send + 'static,
) -> Result<(Leadership, tokio::task::JoinHandle<()>), LeaderError> {
    if config.grace >= config.duration {
        return Err(LeaderError::Timings {
            duration: config.duration,
            grace: config.grace,
        });
    }
    let lease_error = |source| LeaderError::Lease {
        namespace: config.namespace.clone(),
        name: config.lease_name.clone(),
        source,
    };
    let manager = LeaseManagerBuilder::new(client.clone(), &config.lease_name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(config.duration.as_secs())
        .with_grace(config.grace.as_secs())
        .build()
        .await
        .map_err(lease_error)?;
    let (held, manager_task) = manager.watch().await;
    let (state, receiver) = watch::channel(LeaderState::default());
    let lease_api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let task = tokio::spawn(async move {
        track(lease_api, config, held.clone(), state, metrics, shutdown).await;
        handed_on.await;
        drop(held);
        // `held` is dropped: the manager releases the lease and returns.
        match tokio::time::timeout(RELEASE_TIMEOUT, manager_task).await {
            Ok(Ok(Ok(_))) => tracing::info!("released the leader lease"),
            Ok(Ok(Err(error))) => tracing::warn!(%error, "releasing the leader lease failed"),
            Ok(Err(error)) => tracing::warn!(%error, "the lease manager stopped abnormally"),
            Err(_) => tracing::warn!("releasing the leader lease timed out; it will expire"),
        }
    });
    Ok((Leadership::new(receiver), task))
}

/// Combines the manager's view with the Lease object and publishes [`LeaderState`].
async fn track(
    lease_api: Api<Lease>,
    config: LeaderConfig,
    mut held: watch::Receiver<bool>,
    state: watch::Sender<LeaderState>,
    metrics: LeaderMetrics,
    shutdown: CancellationToken,
) {
    let selector = format!("metadata.name={}", config.lease_name);
    let mut leases = watcher(lease_api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .boxed();
    let mut view: Option<LeaseView> = None;
    let mut is_held = *held.borrow_and_update();
    let mut published = LeaderState::default();
    loop {
        let until = acting_until(is_held, view.as_ref(), &config.identity, config.grace)
            .filter(|until| clock::now() < *until);
        let next = LeaderState {
            term: if until.is_some() && published.acting_until.is_none() {
                published.term + 1
            } else {
                published.term
            },
            acting_until: until,
        };
        if next != published {
            match (published.acting_until.is_some(), until.is_some()) {
                (false, true) => {
                    metrics.acting(true);
                    tracing::info!(identity = %config.identity, term = next.term, "became the leader");
                }
                (true, false) => {
                    metrics.acting(false);
                    tracing::warn!(identity = %config.identity, "stopped acting as the leader");
                }
                _ => {}
            }
            published = next;
            state.send_replace(published);
        }
        let wait = until
            .and_then(|until| Duration::try_from(until.duration_since(clock::now())).ok())
            .map_or(Duration::MAX, |wait| wait);
        tokio::select! {
            () = shutdown.cancelled() => break,
            changed = held.changed() => {
                // The manager's task ended (an error it could not recover from): not leader.
                is_held = changed.is_ok() && *held.borrow_and_update();
            }
            event = leases.next() => match event {
                Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) => {
                    view = Some(LeaseView::from(&lease));
                }
                Some(Ok(watcher::Event::Delete(_))) => view = None,
                Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                Some(Err(error)) => tracing::warn!(%error, "watching the leader lease failed"),
                None => break,
            },
            () = tokio::time::sleep(wait) => {}
        }
    }
    if published.acting_until.is_some() {
        metrics.acting(false);
    }
    state.send_replace(LeaderState {
        term: published.term,
        acting_until: None,
    });
}

/// Runs `work` for every term of leadership, aborting it the moment the term ends, until
/// `shutdown`. `work` should run until it is aborted; if it returns, it is started again after
/// a short delay while the term lasts.
pub async fn run_while_leader<F, Fut>(
    mut leadership: Leadership,
    shutdown: CancellationToken,
    mut work: F,
) where
    F: FnMut(Term) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let term = tokio::select! {
            () = shutdown.cancelled() => return,
            term = leadership.acquired() => match term {
                Some(term) => term,
                None => return,
            },
        };
        let mut watch_term = term.clone();
        let mut task = tokio::spawn(work(term));
        tokio::select! {
            () = shutdown.cancelled() => {
                task.abort();
                let _ = task.await;
                return;
            }
            () = watch_term.lost() => {
                task.abort();
                let _ = task.await;
                tracing::warn!(term = watch_term.number(), "leadership lost: stopped the leader's work");
            }
            _ = &mut task => {
                tracing::warn!(term = watch_term.number(), "the leader's work stopped; restarting it");
                tokio::time::sleep(RESTART_DELAY).await;
            }
        }
    }
}

// === impl LeaderMetrics ===

/// Leader election.
#[derive(Debug, Clone)]
pub struct LeaderMetrics {
    leader: Gauge,
    terms: Counter,
}

impl LeaderMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            leader: Gauge::default(),
            terms: Counter::default(),
        };
        registry.register(
            "leader",
            "1 while this replica holds the Lease and acts, 0 while it stands by",
            metrics.leader.clone(),
        );
        registry.register(
            "leader_terms",
            "Times this replica became the leader",
            metrics.terms.clone(),
        );
        metrics
    }

    pub fn acting(&self, acting: bool) {
        if acting {
            self.terms.inc();
        }
        self.leader.set(i64::from(acting));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{encode, registry};

    #[test]
    fn leadership_is_exposed() {
        let mut registry = registry();
        let metrics = LeaderMetrics::register(&mut registry);
        metrics.acting(true);
        let text = encode(&registry).unwrap();
        assert!(text.contains("gpuqueue_leader 1"), "{text}");
        assert!(text.contains("gpuqueue_leader_terms_total 1"), "{text}");
        metrics.acting(false);
        assert!(encode(&registry).unwrap().contains("gpuqueue_leader 0"));
    }

    const GRACE: Duration = Duration::from_secs(4);

    fn view(holder: &str, renewed: &str, seconds: i64) -> LeaseView {
        LeaseView {
            holder: Some(holder.to_owned()),
            renewed: Some(renewed.parse().unwrap()),
            duration: Some(SignedDuration::from_secs(seconds)),
        }
    }

    #[test]
    fn the_holder_acts_until_half_the_grace_before_expiry() {
        let lease = view("me", "2026-01-01T00:00:00Z", 15);
        assert_eq!(
            acting_until(true, Some(&lease), "me", GRACE),
            Some("2026-01-01T00:00:13Z".parse().unwrap())
        );
    }

    #[test]
    fn nobody_else_acts_on_my_lease() {
        let lease = view("someone-else", "2026-01-01T00:00:00Z", 15);
        assert_eq!(acting_until(true, Some(&lease), "me", GRACE), None);
    }

    #[test]
    fn the_manager_and_the_api_must_both_agree() {
        let lease = view("me", "2026-01-01T00:00:00Z", 15);
        // The manager no longer holds the lease, though the object still names us.
        assert_eq!(acting_until(false, Some(&lease), "me", GRACE), None);
        // The manager thinks it holds a lease the API has not shown us yet.
        assert_eq!(acting_until(true, None, "me", GRACE), None);
        // A released lease has no renewal time.
        let released = LeaseView {
            holder: Some("me".into()),
            renewed: None,
            duration: None,
        };
        assert_eq!(acting_until(true, Some(&released), "me", GRACE), None);
    }

    fn acting_for(term: u64, duration: SignedDuration) -> LeaderState {
        LeaderState {
            term,
            acting_until: Some(clock::now() + duration),
        }
    }

    #[tokio::test]
    async fn a_term_begins_when_acting_and_ends_when_not_renewed() {
        let (state, receiver) = watch::channel(LeaderState::default());
        let mut leadership = Leadership::new(receiver);
        state.send_replace(acting_for(1, SignedDuration::from_millis(300)));
        let mut term = leadership.acquired().await.unwrap();
        assert_eq!(term.number(), 1);
        assert!(term.is_current());
        // Nobody renews: the term ends by itself.
        term.lost().await;
        assert!(!term.is_current());
    }

    #[tokio::test]
    async fn a_renewal_extends_the_term_and_a_new_term_ends_the_old_one() {
        let (state, receiver) = watch::channel(acting_for(1, SignedDuration::from_secs(60)));
        let mut leadership = Leadership::new(receiver);
        let term = leadership.acquired().await.unwrap();
        state.send_replace(acting_for(1, SignedDuration::from_secs(120)));
        assert!(term.is_current(), "renewal keeps the same term");
        state.send_replace(acting_for(2, SignedDuration::from_secs(120)));
        assert!(
            !term.is_current(),
            "a term that was lost and won again is a new term"
        );
    }

    /// Reports the term whose work was dropped (aborted).
    struct OnDrop(u64, tokio::sync::mpsc::UnboundedSender<u64>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            let _ = self.1.send(self.0);
        }
    }

    #[tokio::test]
    async fn the_work_is_aborted_when_the_term_ends_and_restarted_in_the_next() {
        let (state, receiver) = watch::channel(LeaderState::default());
        let shutdown = CancellationToken::new();
        let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<u64>();
        let (stopped_tx, mut stopped) = tokio::sync::mpsc::unbounded_channel::<u64>();

        let runner = tokio::spawn(run_while_leader(
            Leadership::new(receiver),
            shutdown.clone(),
            move |term: Term| {
                let guard = OnDrop(term.number(), stopped_tx.clone());
                let started = started_tx.clone();
                async move {
                    let _guard = guard;
                    let _ = started.send(term.number());
                    std::future::pending::<()>().await;
                }
            },
        ));

        state.send_replace(acting_for(1, SignedDuration::from_secs(60)));
        assert_eq!(started.recv().await, Some(1));
        // Lose the lease: the work of term 1 is aborted.
        state.send_replace(LeaderState {
            term: 1,
            acting_until: None,
        });
        assert_eq!(stopped.recv().await, Some(1));

        // Win it again: the work runs again, in term 2, until shutdown aborts it.
        state.send_replace(acting_for(2, SignedDuration::from_secs(60)));
        assert_eq!(started.recv().await, Some(2));
        shutdown.cancel();
        runner.await.unwrap();
        assert_eq!(stopped.recv().await, Some(2));
    }

    #[tokio::test]
    async fn no_term_while_standing_by() {
        let (state, receiver) = watch::channel(LeaderState::default());
        let mut leadership = Leadership::new(receiver);
        // An expired claim is not a term.
        state.send_replace(LeaderState {
            term: 1,
            acting_until: Some(clock::now() - SignedDuration::from_secs(1)),
        });
        drop(state);
        assert!(leadership.acquired().await.is_none());
    }
}
