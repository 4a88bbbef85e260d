//! Writes the stores have not caught up with yet.
//!
//! After the operator releases a gate, its pod store shows the pod gated until the watch
//! delivers the change, typically milliseconds later. A pass that ran in between would see the
//! pod still waiting and its GPUs still free, and could admit another pod into them: the
//! over-admission Kueue hit when its cache and the API disagreed (kubernetes-sigs/kueue#11480).
//! So, like kube-scheduler's "assumed" pods, the pod as the API server returned it from the
//! patch stands in for the stored one until the store shows the gate gone (or the pod gone).
//!
//! The same holds for a reclaim's victims: once their intent is written, the pod as the patch
//! returned it stands in while the store still shows the version the intent was written on
//! (the patch is tested against that `resourceVersion`, so any other version the store shows
//! is newer, even after a relist skipped some). Otherwise a pass
//! that runs before the watch delivers the mark sees the victim as an unclaimed borrower and
//! plans it into a second reclaim: a burst's handovers start evicting while later passes plan.
//!
//! The same holds for the waiting reasons and queue statuses written this term: the last one
//! written is remembered until the store shows it, so a lagging store causes neither a second
//! write nor a second event.
//!
//! Writes run in the background while the next pass decides, so an admission is assumed as
//! soon as it is decided (the pod as the patch will leave it) and replaced by the API server's
//! answer, or forgotten if the write fails. At most one write per object is in flight, so they
//! cannot land out of order.
//!
//! One `Assumed` lives as long as the process, not a leadership term: a term that ends aborts
//! its writes, and one that follows at once (the lease lost and won again) would otherwise
//! forget admissions that landed but that the store does not show yet, and book their GPUs a
//! second time. The writes a term left in flight are answered by fresh reads before the next
//! term's first pass ([`reconcile`]).

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
};

use futures::{TryStreamExt, stream};
use gpuqueue_api::{
    annotations,
    v1alpha1::{GpuQueue, GpuQueueStatus},
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};

use gpuqueue_core::model::is_gated;

use super::stores::Stores;

/// Reads in flight at once while reconciling.
const RECONCILE_CONCURRENCY: usize = 16;

/// By object uid; read for every pod in every pass, so hashed with foldhash, not SipHash.
type ByUid<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// Pods admitted and reasons recorded by this process whose watch events have not arrived.
#[derive(Debug, Default)]
pub struct Assumed {
    admitted: ByUid<Pod>,
    /// Victims whose reclaim intent this process wrote: the `resourceVersion` it was written
    /// on, and the pod as the patch returned it.
    marked: ByUid<(String, Pod)>,
    reasons: ByUid<Option<String>>,
    /// When this process last wrote each pod's waiting reason (kept while the pod exists).
    reasons_written_at: ByUid<Timestamp>,
    /// Queue statuses written, by queue uid (a queue deleted and created again is another).
    statuses: HashMap<String, GpuQueueStatus>,
    /// Objects (pods, queues; by uid) with a write in flight.
    in_flight: HashSet<String>,
}

impl Assumed {
    /// Remembers `pod` as the API server returned it from the admission patch.
    pub fn admitted(&mut self, pod: Pod) {
        if let Some(uid) = pod.metadata.uid.clone() {
            self.reasons.remove(&uid);
            self.admitted.insert(uid, pod);
        }
    }

    /// Remembers `victim` as the API server returned it from its reclaim intent patch,
    /// written on `before` (the stored version the patch was tested against).
    pub fn marked(&mut self, before: &Pod, victim: Pod) {
        let (Some(uid), Some(version)) = (
            victim.metadata.uid.clone(),
            before.metadata.resource_version.clone(),
        ) else {
            return;
        };
        self.marked.insert(uid, (version, victim));
    }

    /// Marks a write to the object with `uid` as in flight; `false` if one already is.
    pub fn begin(&mut self, uid: &str) -> bool {
        self.in_flight.insert(uid.to_owned())
    }

    /// The write to the object with `uid` is done.
    pub fn end(&mut self, uid: &str) {
        self.in_flight.remove(uid);
    }

    /// Whether a write to the object with `uid` is in flight.
    pub fn in_flight(&self, uid: &str) -> bool {
        self.in_flight.contains(uid)
    }

    /// Forgets everything assumed of a write to the object with `uid` that was never sent
    /// (the term ended first).
    pub fn abandon(&mut self, uid: &str) {
        self.in_flight.remove(uid);
        self.admitted.remove(uid);
        self.forget_reason(uid);
        self.statuses.remove(uid);
    }

    /// The objects whose writes are in flight: after a term ended, those it aborted, which
    /// may or may not have landed.
    pub fn left_in_flight(&self) -> Vec<String> {
        self.in_flight.iter().cloned().collect()
    }

    /// Takes in `fresh`, the pod with `uid` as read from the API server after its write was
    /// aborted (`None`: gone): the write landed or it did not, and the pod says which.
    pub fn reconcile_pod(&mut self, uid: &str, fresh: Option<&Pod>) {
        let fresh = fresh.filter(|pod| pod.metadata.uid.as_deref() == Some(uid));
        let Some(pod) = fresh else {
            self.abandon(uid);
            return;
        };
        self.in_flight.remove(uid);
        if is_gated(pod) {
            self.admitted.remove(uid);
        } else {
            self.admitted.insert(uid.to_owned(), pod.clone());
        }
        let shown = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|notes| notes.get(annotations::WAITING_REASON));
        if self.reasons.contains_key(uid) {
            self.reasons.insert(uid.to_owned(), shown.cloned());
        }
    }

    /// Takes in `fresh`, the queue with `uid` as read after its status write was aborted.
    pub fn reconcile_queue(&mut self, uid: &str, fresh: Option<&GpuQueue>) {
        self.in_flight.remove(uid);
        match fresh
            .filter(|queue| queue.metadata.uid.as_deref() == Some(uid))
            .and_then(|queue| queue.status.clone())
        {
            Some(status) => self.status_written(uid, status),
            None => self.forget_status(uid),
        }
    }

    /// Forgets an admission whose write failed: the pod is decided again from the store.
    pub fn forget_admission(&mut self, uid: &str) {
        self.admitted.remove(uid);
    }

    /// Forgets a waiting reason whose write failed.
    pub fn forget_reason(&mut self, uid: &str) {
        self.reasons.remove(uid);
        self.reasons_written_at.remove(uid);
    }

    /// Forgets a status whose write failed.
    pub fn forget_status(&mut self, uid: &str) {
        self.statuses.remove(uid);
    }

    /// Remembers the waiting reason written on the pod with `uid` at `at` (`None`: cleared).
    pub fn reason_recorded(&mut self, uid: &str, reason: Option<String>, at: Timestamp) {
        self.reasons.insert(uid.to_owned(), reason);
        self.reasons_written_at.insert(uid.to_owned(), at);
    }

    /// When this process last wrote the pod's waiting reason, if it did.
    pub fn reason_written_at(&self, stored: &Pod) -> Option<Timestamp> {
        let uid = stored.metadata.uid.as_ref()?;
        self.reasons_written_at.get(uid).copied()
    }

    /// The pod to decide with: the admitted version while the store still shows `stored`
    /// gated, the marked victim while the store does not show its mark yet, else `stored`.
    pub fn view<'a>(&'a self, stored: &'a Pod) -> &'a Pod {
        let Some(uid) = stored.metadata.uid.as_ref() else {
            return stored;
        };
        if let Some(admitted) = self.admitted.get(uid).filter(|_| is_gated(stored)) {
            return admitted;
        }
        match self.marked.get(uid) {
            Some((before, marked)) if is_version(stored, before) => marked,
            _ => stored,
        }
    }

    /// The waiting reason the pod carries, as far as this process knows.
    pub fn waiting_reason<'a>(&'a self, stored: &'a Pod) -> Option<&'a str> {
        let recorded = stored
            .metadata
            .uid
            .as_ref()
            .and_then(|uid| self.reasons.get(uid));
        match recorded {
            Some(reason) => reason.as_deref(),
            None => stored
                .metadata
                .annotations
                .as_ref()
                .and_then(|notes| notes.get(annotations::WAITING_REASON))
                .map(String::as_str),
        }
    }

    /// Forgets what the store now shows, and pods that are gone. `stored` is every pod of the
    /// store.
    pub fn settle<'a>(&mut self, stored: impl IntoIterator<Item = &'a Pod>) {
        // Most passes have little or nothing in flight: an empty map is not looked up for
        // each of 10,000 pods.
        let (written, admitted, marked, reasons) = (
            !self.reasons_written_at.is_empty(),
            !self.admitted.is_empty(),
            !self.marked.is_empty(),
            !self.reasons.is_empty(),
        );
        if !(written || admitted || marked || reasons) {
            return;
        }
        let mut still_lagging_admissions = ByUid::default();
        let mut still_lagging_marks = ByUid::default();
        let mut still_lagging_reasons = ByUid::default();
        let mut written_at = ByUid::default();
        for pod in stored {
            let Some(uid) = pod.metadata.uid.as_ref() else {
                continue;
            };
            if written && let Some(at) = self.reasons_written_at.remove(uid) {
                written_at.insert(uid.clone(), at);
            }
            if admitted
                && is_gated(pod)
                && let Some(admitted) = self.admitted.remove(uid)
            {
                still_lagging_admissions.insert(uid.clone(), admitted);
            }
            if marked
                && let Some((before, marked)) = self.marked.remove(uid)
                && is_version(pod, &before)
            {
                still_lagging_marks.insert(uid.clone(), (before, marked));
            }
            if reasons && let Some(reason) = self.reasons.remove(uid) {
                let shown = pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|notes| notes.get(annotations::WAITING_REASON));
                if shown != reason.as_ref() {
                    still_lagging_reasons.insert(uid.clone(), reason);
                }
            }
        }
        self.admitted = still_lagging_admissions;
        self.marked = still_lagging_marks;
        self.reasons = still_lagging_reasons;
        self.reasons_written_at = written_at;
    }

    /// Remembers the status written on the queue with `uid`.
    pub fn status_written(&mut self, uid: &str, status: GpuQueueStatus) {
        self.statuses.insert(uid.to_owned(), status);
    }

    /// The queue's status as far as this process knows: the last one it wrote while the store
    /// does not show it yet, else the store's.
    pub fn status<'a>(&'a self, stored: &'a GpuQueue) -> Option<&'a GpuQueueStatus> {
        stored
            .metadata
            .uid
            .as_ref()
            .and_then(|uid| self.statuses.get(uid))
            .or(stored.status.as_ref())
    }

    /// Forgets the statuses the store now shows, and those of queues that are gone. `stored`
    /// is every readable queue of the store.
    pub fn settle_queues<'a>(&mut self, stored: impl IntoIterator<Item = &'a GpuQueue>) {
        let mut still_lagging = HashMap::new();
        for queue in stored {
            let Some(uid) = queue.metadata.uid.as_ref() else {
                continue;
            };
            if let Some(mut written) = self.statuses.remove(uid) {
                // `lastHandovers` is the reclaim executor's to write (see `status`): the
                // store's copy is the current one, and only the rest has to show up.
                if let Some(stored) = &queue.status {
                    written.last_handovers.clone_from(&stored.last_handovers);
                    written
                        .reclaims_in_flight
                        .clone_from(&stored.reclaims_in_flight);
                }
                if queue.status.as_ref() != Some(&written) {
                    still_lagging.insert(uid.clone(), written);
                }
            }
        }
        self.statuses = still_lagging;
    }
}

/// Answers the writes a term left in flight (see [`Assumed::left_in_flight`]) from fresh reads
/// of their objects, found by uid in `stores`; an object no store holds any more is gone.
/// Whether the store shows `pod` at `version` still.
fn is_version(pod: &Pod, version: &str) -> bool {
    pod.metadata.resource_version.as_deref() == Some(version)
}

/// A read that fails leaves its object in flight, and the error to the caller, who tries again.
pub async fn reconcile(
    assumed: &Mutex<Assumed>,
    client: &Client,
    stores: &Stores,
) -> Result<usize, kube::Error> {
    let left: HashSet<String> = crate::sync::lock(assumed)
        .left_in_flight()
        .into_iter()
        .collect();
    if left.is_empty() {
        return Ok(0);
    }
    let pods: HashMap<String, (String, String)> = stores
        .pods
        .state()
        .iter()
        .filter_map(|pod| {
            let uid = pod.metadata.uid.clone().filter(|uid| left.contains(uid))?;
            let namespace = pod.metadata.namespace.clone()?;
            Some((uid, (namespace, pod.metadata.name.clone()?)))
        })
        .collect();
    let queues: HashMap<String, String> = stores
        .queues
        .state()
        .iter()
        .filter_map(|queue| {
            let meta = match &queue.0 {
                Ok(queue) => &queue.metadata,
                Err(invalid) => &invalid.metadata,
            };
            let uid = meta.uid.clone().filter(|uid| left.contains(uid))?;
            Some((uid, meta.name.clone()?))
        })
        .collect();
    // Each answer is taken in as it comes: one read that fails leaves only its own object
    // in flight.
    stream::iter(left.iter().map(Ok))
        .try_for_each_concurrent(RECONCILE_CONCURRENCY, |uid| {
            let pod = pods.get(uid);
            let queue = queues.get(uid);
            async move {
                if let Some((namespace, name)) = pod {
                    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
                    let fresh = api.get_opt(name).await?;
                    crate::sync::lock(assumed).reconcile_pod(uid, fresh.as_ref());
                } else if let Some(name) = queue {
                    let fresh = Api::<GpuQueue>::all(client.clone()).get_opt(name).await?;
                    crate::sync::lock(assumed).reconcile_queue(uid, fresh.as_ref());
                } else {
                    crate::sync::lock(assumed).reconcile_pod(uid, None);
                }
                Ok::<_, kube::Error>(())
            }
        })
        .await?;
    Ok(left.len())
}

#[cfg(test)]
mod tests {
    use gpuqueue_api::ADMISSION_GATE;
    use serde_json::json;

    use super::*;

    fn pod(uid: &str, gated: bool, reason: Option<&str>) -> Pod {
        let gate_list: Vec<_> = if gated {
            vec![json!({"name": ADMISSION_GATE})]
        } else {
            vec![]
        };
        let mut pod = json!({
            "metadata": {"name": uid, "namespace": "batch", "uid": uid},
            "spec": {"containers": [], "schedulingGates": gate_list},
        });
        if let Some(reason) = reason {
            pod["metadata"]["annotations"] = json!({annotations::WAITING_REASON: reason});
        }
        serde_json::from_value(pod).unwrap()
    }

    /// `pod` at `version`, carrying reclaim `mark` if any.
    fn victim(version: &str, mark: Option<&str>) -> Pod {
        let mut victim = pod("v", false, None);
        victim.metadata.resource_version = Some(version.to_owned());
        if let Some(id) = mark {
            victim.metadata.annotations =
                Some([(annotations::RECLAIM_ID.to_owned(), id.to_owned())].into());
        }
        victim
    }

    #[test]
    fn a_marked_victim_stands_in_while_the_store_shows_the_version_it_was_marked_on() {
        let mut assumed = Assumed::default();
        let before = victim("10", None);
        assumed.marked(&before, victim("11", Some("rc-1")));
        let mark = |pod: &Pod| {
            pod.metadata
                .annotations
                .as_ref()
                .and_then(|notes| notes.get(annotations::RECLAIM_ID).cloned())
        };
        assert_eq!(mark(assumed.view(&before)).as_deref(), Some("rc-1"));
        assumed.settle([&before]);
        assert_eq!(
            mark(assumed.view(&before)).as_deref(),
            Some("rc-1"),
            "still lagging: the mark is kept"
        );
        // A relist may skip the marked version: any other version is newer, and is the truth
        // (here the intent was taken back meanwhile).
        let relisted = victim("13", None);
        assert_eq!(mark(assumed.view(&relisted)), None);
        assumed.settle([&relisted]);
        assert!(
            assumed.marked.is_empty(),
            "forgotten once the store moved on"
        );

        assumed.marked(&before, victim("11", Some("rc-2")));
        assumed.settle(std::iter::empty());
        assert!(assumed.marked.is_empty(), "forgotten once the pod is gone");
    }

    #[test]
    fn an_admitted_pod_stands_in_until_the_store_catches_up() {
        let mut assumed = Assumed::default();
        let stored = pod("a", true, None);
        assumed.admitted(pod("a", false, None));
        assert!(
            !is_gated(assumed.view(&stored)),
            "the store lags: the admitted version is used"
        );
        assumed.settle([&stored]);
        assert!(
            !is_gated(assumed.view(&stored)),
            "still lagging: the admission is kept"
        );

        let caught_up = pod("a", false, None);
        assumed.settle([&caught_up]);
        assert!(
            is_gated(assumed.view(&stored)),
            "caught up: the admission is forgotten"
        );
        assert!(std::ptr::eq(assumed.view(&caught_up), &raw const caught_up));
    }

    #[test]
    fn failed_writes_are_forgotten_and_one_write_per_object_is_in_flight() {
        let mut assumed = Assumed::default();
        assert!(assumed.begin("a"));
        assert!(!assumed.begin("a"), "a second write to the same pod waits");
        assert!(assumed.in_flight("a"));
        assumed.admitted(pod("a", false, None));
        assumed.forget_admission("a");
        assert!(is_gated(assumed.view(&pod("a", true, None))));
        assumed.reason_recorded("a", Some("x".into()), Timestamp::UNIX_EPOCH);
        assumed.forget_reason("a");
        assert_eq!(
            assumed.waiting_reason(&pod("a", true, Some("stored"))),
            Some("stored")
        );
        assert_eq!(assumed.reason_written_at(&pod("a", true, None)), None);
        assumed.end("a");
        assert!(!assumed.in_flight("a") && assumed.begin("a"));
    }

    /// The leadership flap: a term decided admissions, its writes were aborted when it ended
    /// (one landed, one was never sent), and the next term begins while the store still shows
    /// both pods gated.
    #[test]
    fn a_new_term_keeps_an_admission_that_landed_and_forgets_one_that_did_not() {
        let mut assumed = Assumed::default();
        for uid in ["landed", "lost", "gone", "namesake"] {
            assert!(assumed.begin(uid));
            assumed.admitted(pod(uid, false, None));
        }
        let mut left = assumed.left_in_flight();
        left.sort();
        assert_eq!(left, ["gone", "landed", "lost", "namesake"]);

        assumed.reconcile_pod("landed", Some(&pod("landed", false, None)));
        assumed.reconcile_pod("lost", Some(&pod("lost", true, None)));
        assumed.reconcile_pod("gone", None);
        assumed.reconcile_pod("namesake", Some(&pod("other-uid", false, None)));

        assert!(
            !is_gated(assumed.view(&pod("landed", true, None))),
            "the landed admission holds its GPUs until the store shows it"
        );
        assert!(is_gated(assumed.view(&pod("lost", true, None))));
        assert!(is_gated(assumed.view(&pod("namesake", true, None))));
        assert!(
            assumed.left_in_flight().is_empty(),
            "each may be written again"
        );
    }

    #[test]
    fn a_write_the_term_never_sent_is_abandoned() {
        let mut assumed = Assumed::default();
        assumed.begin("a");
        assumed.admitted(pod("a", false, None));
        assumed.begin("q");
        assumed.status_written("q", status(4));
        assumed.abandon("a");
        assumed.abandon("q");
        assert!(is_gated(assumed.view(&pod("a", true, None))));
        assert_eq!(assumed.status(&queue("q", None)), None);
        assert!(assumed.left_in_flight().is_empty());
    }

    #[test]
    fn a_reason_and_a_status_left_in_flight_are_what_the_api_shows() {
        let mut assumed = Assumed::default();
        assumed.begin("a");
        assumed.reason_recorded("a", Some("new".into()), Timestamp::UNIX_EPOCH);
        assumed.reconcile_pod("a", Some(&pod("a", true, Some("old"))));
        assert_eq!(assumed.waiting_reason(&pod("a", true, None)), Some("old"));

        assumed.begin("q");
        assumed.status_written("q", status(4));
        assumed.reconcile_queue("q", Some(&queue("q", Some(status(3)))));
        assert_eq!(assumed.status(&queue("q", None)), Some(&status(3)));
        assumed.begin("q");
        assumed.reconcile_queue("q", None);
        assert_eq!(assumed.status(&queue("q", None)), None);
        assert!(assumed.left_in_flight().is_empty());
    }

    /// [`reconcile`] against a mock API server: each object left in flight is read by the name
    /// the store knows it by.
    #[tokio::test]
    async fn reconcile_reads_each_object_left_in_flight() {
        use crate::cluster::testing::TestStores;
        use crate::mock_api;

        let mut stores = TestStores::new();
        for name in ["landed", "lost", "deleted"] {
            stores.add_pod(serde_json::to_value(pod(name, true, None)).unwrap());
        }
        let assumed = Mutex::new(Assumed::default());
        {
            let mut assumed = crate::sync::lock(&assumed);
            for uid in ["landed", "lost", "deleted", "unknown"] {
                assumed.begin(uid);
                assumed.admitted(pod(uid, false, None));
            }
        }
        let (client, log) =
            mock_api::serve(|request| match request.path.rsplit('/').next().unwrap() {
                "landed" => (
                    200,
                    serde_json::to_value(pod("landed", false, None)).unwrap(),
                ),
                "lost" => (200, serde_json::to_value(pod("lost", true, None)).unwrap()),
                _ => mock_api::failure(404, "NotFound", "not found"),
            });
        let read = reconcile(&assumed, &client, &stores.stores).await.unwrap();
        assert_eq!(read, 4);
        let mut seen = mock_api::requests(&log);
        seen.sort();
        assert_eq!(
            seen,
            ["deleted", "landed", "lost"].map(|name| (
                "GET".to_owned(),
                format!("/api/v1/namespaces/batch/pods/{name}")
            ))
        );
        let assumed = crate::sync::lock(&assumed);
        assert!(!is_gated(assumed.view(&pod("landed", true, None))));
        assert!(is_gated(assumed.view(&pod("lost", true, None))));
        assert!(is_gated(assumed.view(&pod("deleted", true, None))));
        assert!(assumed.left_in_flight().is_empty());
    }

    #[test]
    fn a_deleted_pod_is_forgotten() {
        let mut assumed = Assumed::default();
        assumed.admitted(pod("a", false, None));
        assumed.reason_recorded("b", Some("full".into()), Timestamp::UNIX_EPOCH);
        assumed.settle([]);
        assert!(is_gated(assumed.view(&pod("a", true, None))));
        assert_eq!(assumed.waiting_reason(&pod("b", true, None)), None);
    }

    #[test]
    fn a_namesake_is_not_mistaken_for_the_admitted_pod() {
        let mut assumed = Assumed::default();
        assumed.admitted(pod("a", false, None));
        let namesake = pod("a2", true, None);
        assert!(is_gated(assumed.view(&namesake)));
    }

    fn queue(uid: &str, status: Option<GpuQueueStatus>) -> GpuQueue {
        let mut queue: GpuQueue = serde_json::from_value(json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "batch", "uid": uid},
            "spec": {"namespaces": ["batch"], "resources": [{"name": "nvidia.com/gpu", "guaranteed": 8}]},
        }))
        .unwrap();
        queue.status = status;
        queue
    }

    fn status(pending: i32) -> GpuQueueStatus {
        GpuQueueStatus {
            pending_pods: pending,
            ..GpuQueueStatus::default()
        }
    }

    #[test]
    fn a_written_status_stands_in_until_the_store_shows_it() {
        let mut assumed = Assumed::default();
        let lagging = queue("q1", Some(status(1)));
        assert_eq!(assumed.status(&lagging), Some(&status(1)));
        assumed.status_written("q1", status(2));
        assert_eq!(assumed.status(&lagging), Some(&status(2)));
        assumed.settle_queues([&lagging]);
        assert_eq!(
            assumed.status(&lagging),
            Some(&status(2)),
            "store still lags"
        );

        let caught_up = queue("q1", Some(status(2)));
        assumed.settle_queues([&caught_up]);
        assert!(assumed.statuses.is_empty());

        // A queue created again under the same name is another queue.
        assumed.status_written("q1", status(3));
        let recreated = queue("q2", None);
        assert_eq!(assumed.status(&recreated), None);
        assumed.settle_queues([&recreated]);
        assert!(assumed.statuses.is_empty());
    }

    #[test]
    fn the_recorded_reason_wins_until_the_store_shows_it() {
        let mut assumed = Assumed::default();
        let stored = pod("a", true, Some("old reason"));
        assert_eq!(assumed.waiting_reason(&stored), Some("old reason"));
        assumed.reason_recorded("a", Some("new reason".into()), Timestamp::UNIX_EPOCH);
        assert_eq!(
            assumed.reason_written_at(&stored),
            Some(Timestamp::UNIX_EPOCH)
        );
        assert_eq!(assumed.waiting_reason(&stored), Some("new reason"));
        assumed.settle([&stored]);
        assert_eq!(
            assumed.waiting_reason(&stored),
            Some("new reason"),
            "store still lags"
        );
        let caught_up = pod("a", true, Some("new reason"));
        assumed.settle([&caught_up]);
        assert_eq!(assumed.waiting_reason(&caught_up), Some("new reason"));
        // Cleared, and the store not yet showing it.
        assumed.reason_recorded("a", None, Timestamp::UNIX_EPOCH);
        assert_eq!(assumed.waiting_reason(&caught_up), None);
    }
}
