//! Admission at creation: when no pod waits, the webhook admits a new GPU pod that fits at once
//! (pins it to a node instead of gating it), so an uncontended pod costs no gate release: no
//! patch, no second watch event, no round trip through the admission loop.
//!
//! The decision is the core's [`admit_at_creation`] on the leader's live snapshot: the one its
//! last admission pass ended with, plus every pod admitted at creation since. Each pass builds
//! its snapshot and publishes it while holding this lock, so the webhook and the loop never
//! decide on the same capacity twice. The webhook never blocks on that lock: while a pass holds
//! it, the webhook tries again a moment later, for a short while, then sends the pod to the gate
//! (the pass that follows decides it), well within its own timeout.
//!
//! A pod admitted here is *reserved* (its capacity counted by every pass) until the pod store
//! shows it, found by the token the webhook annotates it with. A creation can fail after the
//! webhook answered (another admission plugin, or validation, refused the pod), and anyone who
//! may create pods can make it fail on purpose, so a reservation is held in check three ways:
//! it lasts [`RESERVATION_TTL`] and a pass is woken when it expires; a namespace holds at most
//! [`DEFAULT_RESERVATIONS_PER_NAMESPACE`] (configurable) reservations older than
//! [`UNSETTLED_AFTER`] (creates that should have shown their pod by then), beyond which its new
//! pods go to the gate; and a reserved pod is never a reclaim victim (the core's
//! `reserved_unseen`).
//!
//! Only the leader admits at creation, and only while nothing waits: once a pod is gated (it
//! did not fit, or another pod waits), every new pod goes to the gate until a pass has seen the
//! gated ones and found nothing waiting, so the fair order of the admission cycle decides
//! whenever there is contention. A standby, or a leader before its first pass, gates.

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex, MutexGuard, TryLockError,
        atomic::{AtomicI64, Ordering},
    },
};

use gpuqueue_api::annotations;
use gpuqueue_core::{
    Policy, Snapshot,
    admission::{Admission, admit_at_creation},
    model::{self, AdmittedAs, Assignment, PodState},
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::Time};
use tokio::sync::Notify;

use crate::{
    leader::Term,
    seal::{Admitted, Seals},
};

/// How long a reservation waits for its pod. Once our webhook has answered (its
/// `timeoutSeconds` is 3 s), what is left of the create is the rest of admission (other mutating
/// webhooks and their reinvocation, validation, validating webhooks and policies) and the etcd
/// write: 15 s covers a validating webhook at the API server's default 10 s timeout with 2 s
/// to spare. A pod that still arrives later is not lost: the store then shows it pinned and
/// admitted, and it is counted as such; only its room could be promised twice meanwhile.
/// Longer would let a failed create (a tenant can fail one on purpose) hold capacity longer.
pub const RESERVATION_TTL: SignedDuration = SignedDuration::from_secs(15);

/// How many unsettled reservations (older than [`UNSETTLED_AFTER`]) one namespace may hold
/// before its new pods go to the gate: a tenant failing its creates on purpose holds no more
/// than this, plus what it creates within [`UNSETTLED_AFTER`], each for [`RESERVATION_TTL`].
pub const DEFAULT_RESERVATIONS_PER_NAMESPACE: usize = 128;

/// A reservation younger than this is a create still in flight, not a suspect: the pod reaches
/// the store within milliseconds and the next pass settles it. Counting those against the cap
/// would gate a burst of real pods (1,000 created at once hold several hundred reservations
/// between passes), and one gated pod closes admission at creation until a pass has seen it.
const UNSETTLED_AFTER: SignedDuration = SignedDuration::from_secs(1);

/// After the webhook gated a pod, how long until a pass may consider it seen: the pod reaches
/// the store within milliseconds of its creation, so a pass that starts this much later and
/// finds nothing waiting has decided it.
const GATED_SETTLE: SignedDuration = SignedDuration::from_secs(1);

/// The shared state; cheap to clone.
#[derive(Debug, Clone)]
pub struct AtCreation {
    enabled: bool,
    per_namespace: usize,
    state: Arc<Mutex<State>>,
    /// When (Unix milliseconds) the webhook last gated a pod without deciding it here (a pass
    /// held the lock, or the pod is never admitted at creation): kept outside the lock, which
    /// the webhook may not be able to take.
    undecided_gated: Arc<AtomicI64>,
    /// Told when a reservation is made while none is held, so that the loop wakes at its
    /// expiry even if nothing else changes (its pod may never appear).
    first_reservation: Arc<Notify>,
    /// The seal each admission carries ([`crate::seal`]).
    seals: Seals,
}

/// Why the webhook sends a managed pod to the gate instead of admitting it at its creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Admission at creation is off, closed (a pod waits, no pass yet, standby), the pod does
    /// not fit, or its namespace holds as many reservations as it may.
    Declined,
    /// An admission pass held the lock (the decision is not blocked on it: ask again later).
    Busy,
}

#[derive(Debug, Default)]
struct State {
    live: Option<Live>,
    reservations: Vec<Reservation>,
    /// When the webhook last sent a managed pod to the gate.
    last_gated: Option<Timestamp>,
}

impl State {
    /// Takes in the last pod gated without being decided here (Unix milliseconds, 0: none): a
    /// pass that read the stores before it cannot have decided it.
    fn note_undecided_gated(&mut self, undecided_gated: i64) {
        let Some(gated) = Timestamp::from_millisecond(undecided_gated)
            .ok()
            .filter(|_| undecided_gated > 0)
        else {
            return;
        };
        if self.last_gated.is_none_or(|last| last < gated) {
            self.last_gated = Some(gated);
        }
        if let Some(live) = self.live.as_mut().filter(|live| live.started <= gated) {
            live.contended = true;
        }
    }
}

/// The leader's snapshot after its last pass, with the pods admitted at creation since.
#[derive(Debug)]
struct Live {
    term: Term,
    snapshot: Snapshot,
    /// When the pass read the stores.
    started: Timestamp,
    /// A pod waits (or may: one was gated since the pass): admit nothing at creation.
    contended: bool,
}

/// Capacity held for a pod admitted at creation that the pod store has not shown yet.
#[derive(Debug, Clone)]
pub struct Reservation {
    pub token: String,
    pub admission: Admission,
    /// The pod as the core holds it (admitted, pinned).
    pub pod: model::Pod,
    pub made_at: Timestamp,
}

/// What the webhook writes on a pod admitted at its creation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreationAdmission {
    pub queue: String,
    /// Value of the pin label of the chosen node.
    pub node_pin: String,
    pub admitted_as: AdmittedAs,
    pub at: Timestamp,
    pub token: String,
    /// Its seal ([`crate::seal`]), computed on the pod as the webhook pins it.
    pub seal: Option<String>,
}

impl AtCreation {
    /// `enabled: false` (`--admit-at-creation=false`) gates every managed pod.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            per_namespace: DEFAULT_RESERVATIONS_PER_NAMESPACE,
            state: Arc::default(),
            undecided_gated: Arc::default(),
            first_reservation: Arc::default(),
            seals: Seals::default(),
        }
    }

    /// Seals each admission with the leader's seal, once its term has loaded it.
    #[must_use]
    pub fn with_seals(mut self, seals: Seals) -> Self {
        self.seals = seals;
        self
    }

    /// At most `limit` reservations per namespace (0 gates every pod, as `enabled: false`).
    #[must_use]
    pub fn with_reservations_per_namespace(mut self, limit: usize) -> Self {
        self.per_namespace = limit;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// The lock, unless someone holds it (a poisoned one is taken as its holder left it).
    fn try_lock(&self) -> Option<MutexGuard<'_, State>> {
        match self.state.try_lock() {
            Ok(state) => Some(state),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// A pod went to the gate at `now` without being decided here: passes kept the lock, or it
    /// is never admitted at creation (it claims devices through DRA, or its creator gated it).
    /// The pass running then read the stores before the pod existed, so admission at creation
    /// stays closed until one has seen it: a pod created after it must not overtake it.
    pub fn gated_undecided(&self, now: Timestamp) {
        self.undecided_gated
            .fetch_max(now.as_millisecond(), Ordering::Relaxed);
    }

    /// Resolves when a reservation has been made while none was held (a permit is kept if no
    /// one waits): the loop then wakes by [`RESERVATION_TTL`] from now at the latest.
    pub async fn first_reservation(&self) {
        self.first_reservation.notified().await;
    }

    /// Starts an admission pass: the webhook waits until [`Pass::publish`] (or the end of the
    /// pass) so that it decides on the pass's result, never beside it.
    pub fn pass(&self) -> Pass<'_> {
        Pass {
            state: self.lock(),
            enabled: self.enabled,
            undecided_gated: &self.undecided_gated,
        }
    }

    /// The term ended: admit nothing at creation until the next leader's first pass.
    pub fn withdraw(&self) {
        self.lock().live = None;
    }

    /// Whether a pod admitted at creation has neither reached the store (`stored`) nor had its
    /// reservation expire. A leader stepping down keeps its lease until none has: the next
    /// leader counts only what its store shows, and would hand such a pod's room out again.
    pub fn awaits_pods(&self, stored: &[Arc<Pod>], now: Timestamp) -> bool {
        let state = self.lock();
        if state.reservations.is_empty() {
            return false;
        }
        let arrived: HashSet<&str> = stored
            .iter()
            .filter_map(|pod| creation_token(pod))
            .collect();
        state.reservations.iter().any(|reservation| {
            now.duration_since(reservation.made_at) < RESERVATION_TTL
                && !arrived.contains(reservation.token.as_str())
        })
    }

    /// Decides a managed pod about to be created: `Ok` admits it (the webhook pins it), `Err`
    /// sends it to the gate, saying why. Never waits for a pass: `Busy` changes nothing, and
    /// the caller may ask again, or gate the pod and say so with [`Self::gated_undecided`].
    pub fn admit(&self, pod: &Pod, now: Timestamp) -> Result<CreationAdmission, Gate> {
        let Some(mut state) = self.try_lock() else {
            return Err(Gate::Busy);
        };
        state.note_undecided_gated(self.undecided_gated.load(Ordering::Relaxed));
        let was_empty = state.reservations.is_empty();
        let Some(admitted) = self.try_admit(&mut state, pod, now) else {
            state.last_gated = Some(now);
            if let Some(live) = state.live.as_mut() {
                live.contended = true;
            }
            return Err(Gate::Declined);
        };
        if was_empty {
            self.first_reservation.notify_one();
        }
        Ok(admitted)
    }

    fn try_admit(&self, state: &mut State, pod: &Pod, now: Timestamp) -> Option<CreationAdmission> {
        if !self.enabled {
            return None;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let held = state
            .reservations
            .iter()
            .filter(|r| r.pod.key.namespace == namespace && r.made_at + UNSETTLED_AFTER <= now)
            .count();
        if held >= self.per_namespace {
            tracing::debug!(%namespace, held, "namespace holds its most reservations; gated");
            return None;
        }
        let live = state.live.as_mut()?;
        if live.contended || !live.term.is_current() {
            return None;
        }
        let token = format!("{:016x}", rand::random::<u64>());
        let mut pod = pod.clone();
        // Neither is set before the API server stores the pod: a controller's pod gets its
        // name generated after admission.
        pod.metadata.creation_timestamp = Some(Time(now));
        if pod.metadata.name.as_deref().unwrap_or_default().is_empty() {
            let prefix = pod.metadata.generate_name.clone().unwrap_or_default();
            pod.metadata.name = Some(format!("{prefix}{token}"));
        }
        let mut modelled = model::Pod::from_k8s(&pod).ok()??.value;
        // Not gated yet, so read as admitted; it is to be decided.
        modelled.state = PodState::Pending;
        let admission = admit_at_creation(
            &mut live.snapshot,
            modelled.clone(),
            &Policy::default(),
            now,
        )
        .ok()?;
        modelled.state = PodState::Admitted(Assignment {
            node: Some(admission.placement.pin.clone()),
            bound: false,
            terminating: false,
        });
        modelled.admitted_at = Some(now);
        modelled.unadmitted = false; // read ungated and unannotated, but admitted right here
        let seal = self.seals.get().map(|seal| {
            let at = now.to_string();
            let admitted = Admitted {
                queue: &admission.queue,
                admitted_as: admission.admitted_as.as_str(),
                admitted_at: &at,
                node_pin: &admission.placement.pin,
                token: Some(&token),
            };
            seal.sign(&pod, &admitted)
        });
        let admitted = CreationAdmission {
            queue: admission.queue.clone(),
            node_pin: admission.placement.pin.clone(),
            admitted_as: admission.admitted_as,
            at: now,
            token: token.clone(),
            seal,
        };
        state.reservations.push(Reservation {
            token,
            admission,
            pod: modelled,
            made_at: now,
        });
        Some(admitted)
    }
}

/// One admission pass's hold on the state.
#[derive(Debug)]
pub struct Pass<'a> {
    state: MutexGuard<'a, State>,
    enabled: bool,
    undecided_gated: &'a AtomicI64,
}

/// A reservation whose pod the store now shows.
#[derive(Debug)]
pub struct Arrival {
    pub reservation: Reservation,
    pub pod: Arc<Pod>,
}

impl Pass<'_> {
    /// Drops the reservations whose pod the store shows (returned, to announce) and those past
    /// [`RESERVATION_TTL`] (their creation failed).
    pub fn settle(&mut self, stored: &[Arc<Pod>], now: Timestamp) -> Vec<Arrival> {
        if self.state.reservations.is_empty() {
            return Vec::new();
        }
        let mut by_token: std::collections::HashMap<&str, &Arc<Pod>> = stored
            .iter()
            .filter_map(|pod| Some((creation_token(pod)?, pod)))
            .collect();
        let mut settled = Vec::new();
        let mut kept = Vec::new();
        for reservation in std::mem::take(&mut self.state.reservations) {
            if let Some(pod) = by_token.remove(reservation.token.as_str()) {
                settled.push(Arrival {
                    reservation,
                    pod: pod.clone(),
                });
            } else if now.duration_since(reservation.made_at) < RESERVATION_TTL {
                kept.push(reservation);
            } else {
                tracing::warn!(token = %reservation.token, queue = %reservation.admission.queue,
                    "a pod admitted at creation never appeared; its reservation is released");
            }
        }
        self.state.reservations = kept;
        settled
    }

    /// The pods reserved at creation that the store does not show yet, as the core holds them:
    /// admitted, and marked unseen (never reclaim victims: they may never exist).
    pub fn reserved_pods(&self) -> impl Iterator<Item = model::Pod> + '_ {
        let mut keys = HashSet::new();
        self.state
            .reservations
            .iter()
            .filter(move |r| keys.insert(r.pod.key.clone()))
            .map(|r| model::Pod {
                reserved_unseen: true,
                ..r.pod.clone()
            })
    }

    /// When the oldest reservation expires: a pass must run then, since a pod that never
    /// appears brings no change that would run one.
    pub fn next_expiry(&self) -> Option<Timestamp> {
        self.state
            .reservations
            .iter()
            .map(|r| r.made_at + RESERVATION_TTL)
            .min()
    }

    /// Publishes the pass's snapshot (after its decisions) for the webhook. `waiting`: the pass
    /// left a pod at the gate. `started`: when the pass read the stores. Returns when a pass
    /// may reopen admission at creation that this one kept closed only because a pod went to
    /// the gate too recently (with nothing waiting, no change may come to run that pass).
    pub fn publish(
        mut self,
        term: Term,
        snapshot: Snapshot,
        waiting: bool,
        started: Timestamp,
    ) -> Option<Timestamp> {
        if !self.enabled {
            drop_later(snapshot);
            return None;
        }
        self.state
            .note_undecided_gated(self.undecided_gated.load(Ordering::Relaxed));
        let reopen = self
            .state
            .last_gated
            .map(|gated| gated + GATED_SETTLE)
            .filter(|reopen| started < *reopen);
        let previous = self.state.live.replace(Live {
            term,
            snapshot,
            started,
            contended: waiting || reopen.is_some(),
        });
        drop_later(previous);
        reopen.filter(|_| !waiting)
    }
}

/// Drops a pass's snapshot off the pass: at 10,000 pods freeing it takes a tenth of a pass,
/// which would be spent under the lock the webhook waits on. Dropped at once without a runtime
/// (unit tests).
fn drop_later<T: Send + 'static>(value: T) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn_blocking(move || drop(value));
    }
}

/// The reservation token of a pod admitted at its creation.
pub(crate) fn creation_token(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(annotations::ADMITTED_AT_CREATION)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use gpuqueue_core::model::{Node, Queue, ResourceQuota};
    use serde_json::json;

    use super::*;
    use crate::leader::test_term;

    const GPU: &str = "nvidia.com/gpu";

    /// Queue `online` (namespace `online`) guaranteed 4 GPUs, on one node of 4.
    fn snapshot() -> Snapshot {
        let (snapshot, issues) = Snapshot::builder()
            .queue(
                Queue::new("online")
                    .namespace("online")
                    .quota(ResourceQuota::devices(GPU, 4, 0)),
            )
            .node(
                Node::new("gpu-node-0")
                    .cpu_milli(64_000)
                    .memory_bytes(1 << 38)
                    .gpus(GPU, 4),
            )
            .build();
        assert!(issues.is_empty(), "{issues:?}");
        snapshot
    }

    /// A pod of a Deployment (no name yet) asking for `gpus` GPUs.
    fn new_pod(gpus: u32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"generateName": "vllm-7d9f-", "namespace": "online",
                         "creationTimestamp": "2026-11-29T12:00:00Z"},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai",
                     "resources": {"limits": {GPU: gpus.to_string()}}}]},
        }))
        .unwrap()
    }

    /// The pod as the store later shows it: named, with the webhook's token.
    fn stored(token: &str) -> Arc<Pod> {
        let mut pod = new_pod(1);
        pod.metadata.name = Some("vllm-7d9f-x2x9q".into());
        pod.metadata.annotations = Some(
            [(
                annotations::ADMITTED_AT_CREATION.to_owned(),
                token.to_owned(),
            )]
            .into(),
        );
        Arc::new(pod)
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_795_000_000 + seconds).unwrap()
    }

    #[tokio::test]
    async fn the_leader_admits_at_creation_after_its_first_pass_and_holds_the_room_until_the_store_shows_the_pod()
     {
        let (term, _state) = test_term().await;
        let at_creation = AtCreation::new(true);
        assert_eq!(
            at_creation.admit(&new_pod(1), at(0)),
            Err(Gate::Declined),
            "no pass yet"
        );

        at_creation
            .pass()
            .publish(term.clone(), snapshot(), false, at(10));
        let admitted = at_creation.admit(&new_pod(3), at(11)).unwrap();
        assert_eq!(admitted.queue, "online");
        assert_eq!(admitted.node_pin, "gpu-node-0");
        assert_eq!(admitted.admitted_as, AdmittedAs::Guaranteed);
        // 3 of 4 GPUs are held: a pod of 2 no longer fits, and goes to the gate.
        assert_eq!(at_creation.admit(&new_pod(2), at(12)), Err(Gate::Declined));

        // The next pass counts the reservation until the store shows the pod.
        let mut pass = at_creation.pass();
        assert!(pass.settle(&[], at(13)).is_empty());
        let reserved: Vec<model::Pod> = pass.reserved_pods().collect();
        assert_eq!(reserved.len(), 1);
        assert!(reserved[0].is_admitted());
        let settled = pass.settle(&[stored(&admitted.token)], at(14));
        assert_eq!(settled.len(), 1);
        assert_eq!(settled[0].reservation.token, admitted.token);
        assert_eq!(pass.reserved_pods().count(), 0);
    }

    #[tokio::test]
    async fn after_a_pod_went_to_the_gate_nothing_is_admitted_at_creation_until_a_pass_has_seen_it()
    {
        let (term, _state) = test_term().await;
        let at_creation = AtCreation::new(true);
        at_creation
            .pass()
            .publish(term.clone(), snapshot(), false, at(0));
        assert_eq!(
            at_creation.admit(&new_pod(8), at(1)),
            Err(Gate::Declined),
            "does not fit"
        );
        assert_eq!(
            at_creation.admit(&new_pod(1), at(2)),
            Err(Gate::Declined),
            "it would overtake"
        );
        // A pass that may have started before the gated pod reached the store decides nothing,
        // and asks for a pass once the gated pod must have been seen.
        let reopen = at_creation
            .pass()
            .publish(term.clone(), snapshot(), false, at(1));
        assert_eq!(
            reopen,
            Some(at(3)),
            "a second after the last pod went to the gate"
        );
        assert_eq!(at_creation.admit(&new_pod(1), at(3)), Err(Gate::Declined));
        // One that found pods waiting neither (the pods' own changes bring the next pass).
        let reopen = at_creation
            .pass()
            .publish(term.clone(), snapshot(), true, at(5));
        assert_eq!(
            (reopen, at_creation.admit(&new_pod(1), at(6))),
            (None, Err(Gate::Declined))
        );
        // One that saw everything decided and nothing waiting re-opens admission at creation.
        let reopen = at_creation.pass().publish(term, snapshot(), false, at(7));
        assert_eq!(reopen, None);
        assert!(at_creation.admit(&new_pod(1), at(8)).is_ok());
    }

    #[tokio::test]
    async fn a_reservation_whose_pod_never_appears_is_released_after_the_request_timeout() {
        let (term, _state) = test_term().await;
        let at_creation = AtCreation::new(true);
        at_creation.pass().publish(term, snapshot(), false, at(0));
        assert!(at_creation.admit(&new_pod(4), at(1)).is_ok());
        let mut pass = at_creation.pass();
        pass.settle(&[], at(1) + RESERVATION_TTL - SignedDuration::from_secs(1));
        assert_eq!(pass.reserved_pods().count(), 1, "still within the timeout");
        pass.settle(&[], at(1) + RESERVATION_TTL);
        assert_eq!(pass.reserved_pods().count(), 0);
    }

    #[tokio::test]
    async fn a_leader_stepping_down_awaits_its_creates_until_the_store_shows_them_or_they_expire() {
        let (term, _state) = test_term().await;
        let at_creation = AtCreation::new(true);
        assert!(!at_creation.awaits_pods(&[], at(0)), "nothing admitted");
        at_creation.pass().publish(term, snapshot(), false, at(0));
        let admitted = at_creation.admit(&new_pod(1), at(1)).unwrap();
        at_creation.withdraw();
        assert!(at_creation.awaits_pods(&[], at(2)));
        assert!(!at_creation.awaits_pods(&[stored(&admitted.token)], at(2)));
        assert!(!at_creation.awaits_pods(&[], at(1) + RESERVATION_TTL));
    }

    #[tokio::test]
    async fn the_webhook_never_blocks_on_a_pass_and_a_pod_it_gates_meanwhile_is_not_overtaken() {
        let (term, _state) = test_term().await;
        let at_creation = AtCreation::new(true);
        at_creation
            .pass()
            .publish(term.clone(), snapshot(), false, at(0));
        let pass = at_creation.pass();
        assert_eq!(
            at_creation.admit(&new_pod(1), at(1)),
            Err(Gate::Busy),
            "the pass holds the lock"
        );
        at_creation.gated_undecided(at(1));
        // The pass read the stores before that pod was gated: it cannot have decided it.
        let reopen = pass.publish(term.clone(), snapshot(), false, at(0));
        assert_eq!(reopen, Some(at(2)));
        assert_eq!(at_creation.admit(&new_pod(1), at(1)), Err(Gate::Declined));
        let reopen = at_creation.pass().publish(term, snapshot(), false, at(2));
        assert_eq!(reopen, None);
        assert!(at_creation.admit(&new_pod(1), at(3)).is_ok());
    }

    #[tokio::test]
    async fn a_namespace_holds_at_most_its_reservations_and_each_wakes_a_pass_at_its_expiry() {
        let (term, _state) = test_term().await;
        let at_creation = AtCreation::new(true).with_reservations_per_namespace(2);
        at_creation.pass().publish(term, snapshot(), false, at(0));
        let first = at_creation.admit(&new_pod(1), at(1));
        assert!(first.is_ok());
        // The first reservation tells the loop (a permit is kept until it listens).
        tokio::time::timeout(
            std::time::Duration::from_secs(1),
            at_creation.first_reservation(),
        )
        .await
        .unwrap();
        assert!(at_creation.admit(&new_pod(1), at(2)).is_ok());
        assert_eq!(
            at_creation.admit(&new_pod(1), at(3)),
            Err(Gate::Declined),
            "two are held: the third pod goes to the gate though it fits"
        );
        let pass = at_creation.pass();
        assert_eq!(pass.next_expiry(), Some(at(1) + RESERVATION_TTL));
        assert!(
            pass.reserved_pods().all(|pod| pod.reserved_unseen),
            "never a reclaim victim"
        );
    }

    #[tokio::test]
    async fn reservations_of_creates_still_in_flight_do_not_count_against_the_cap() {
        let (term, _state) = test_term().await;
        let at_creation = AtCreation::new(true).with_reservations_per_namespace(1);
        at_creation.pass().publish(term, snapshot(), false, at(0));
        // A burst: three creates within a second, before any pass could have seen the pods.
        for _ in 0..3 {
            assert!(at_creation.admit(&new_pod(1), at(1)).is_ok());
        }
        // A second later none has shown its pod: they are suspects, and the cap is reached.
        assert_eq!(at_creation.admit(&new_pod(1), at(2)), Err(Gate::Declined));
    }

    #[tokio::test]
    async fn a_withdrawn_or_disabled_replica_gates_every_pod() {
        let (term, _state) = test_term().await;
        let at_creation = AtCreation::new(true);
        at_creation
            .pass()
            .publish(term.clone(), snapshot(), false, at(0));
        at_creation.withdraw();
        assert_eq!(at_creation.admit(&new_pod(1), at(1)), Err(Gate::Declined));

        let disabled = AtCreation::new(false);
        disabled.pass().publish(term, snapshot(), false, at(0));
        assert_eq!(disabled.admit(&new_pod(1), at(1)), Err(Gate::Declined));
    }
}
