//! The operator's view of the cluster: reflector stores of GpuQueues, pods, nodes, namespaces
//! and PodDisruptionBudgets (which victims the Eviction API must judge), kept current by
//! watches, plus the change signals that drive the admission loop: one after every change
//! (budgets aside: they call for no decision), and one after the *urgent* ones, which may call
//! for a decision at once (see [`is_urgent`]). The rest (a pod the live snapshot already counts
//! being bound, starting or going away) only has to reach the queue status and the gauges.
//!
//! - **Fail closed.** Nothing is decided before every store but the budgets holds its initial
//!   list: [`Stores::synced`] resolves only then (Volcano #5174 and ROCm/spur#745 decided from
//!   half a cache and over-admitted). Until the budgets are listed, every victim counts as
//!   guarded by one ([`Stores::budgets_synced`]).
//! - **A bad queue does not wedge the watch.** Queues are read through kube's
//!   `DeserializeGuard`: an object the operator cannot read is kept in the store as an error
//!   (so its status can say why) instead of failing the whole list.
//! - **Memory.** `managedFields`, the `last-applied-configuration` annotation and node image
//!   lists are dropped before objects are stored, and pods keep only what is read (see
//!   [`slim`](super::slim)); terminal pods are filtered out by the API server (they hold no
//!   GPU); pods the pod filter rejects (no GPU request) are not kept.
//! - **Watch errors** are retried with kube's default backoff (800 ms to 30 s), counted in
//!   `gpuqueue_watch_errors_total` and logged; the stores keep their last state meanwhile.
//!   Meanwhile the stores the snapshot is read from (all but the budgets) are not
//!   [`live`](Stores::live): no reclaim is planned, and a reclaim's re-check of its victims
//!   waits ([`crate::reclaim`]). Every watch lists afresh after an error ([`relisting`]), so
//!   that those stores are known live again once the API server answers.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use futures::{FutureExt, Stream, StreamExt, TryStreamExt, future, stream};
use gpuqueue_api::{annotations, v1alpha1::GpuQueue};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod},
    policy::v1::PodDisruptionBudget,
    resource::v1::{DeviceClass, ResourceClaim, ResourceSlice},
};
use kube::{
    Api, Client, Resource,
    core::DeserializeGuard,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store, store::Writer},
        watcher,
    },
};
use tokio::sync::watch;
use tracing::Instrument;

use gpuqueue_core::model::{asks_known_devices, is_gated};

use super::slim::{slim_pod, strip_metadata};
use super::{devices::DeviceStores, metrics::WatchMetrics};

/// Pods in these phases hold no GPU; the API server leaves them out of the watch.
const LIVE_PODS: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// A GpuQueue as stored: the queue, or why it could not be read.
pub type StoredQueue = DeserializeGuard<GpuQueue>;

/// Which pods the pod store keeps.
pub type PodFilter = Arc<dyn Fn(&Pod) -> bool + Send + Sync>;

/// Readers of the stores, and the change signals.
#[derive(Clone)]
pub struct Stores {
    pub queues: Store<StoredQueue>,
    pub pods: Store<Pod>,
    pub nodes: Store<Node>,
    pub namespaces: Store<Namespace>,
    /// Read by the reclaim executor only: a change calls for no admission decision, and
    /// nothing waits for its initial list (see [`Stores::budgets_synced`]).
    pub budgets: Store<PodDisruptionBudget>,
    /// ResourceClaims, DeviceClasses and ResourceSlices (DRA).
    pub devices: DeviceStores,
    pub(super) changes: watch::Receiver<u64>,
    pub(super) urgent_changes: watch::Receiver<u64>,
    /// The [`Liveness`] of the watches the snapshot is read from: queues, pods, nodes,
    /// namespaces and the three DRA kinds (a cluster that does not serve DRA is never
    /// [`synced`](Stores::synced) either: `resource.k8s.io/v1` is GA since Kubernetes 1.34).
    pub(super) live: [Liveness; 7],
}

/// Whether a watch is delivering: not from one of its errors until it delivers again (its relist
/// done, or an event of its resumed watch). Until then its store may be seconds behind (the
/// soak caught a victim evicted on the word of a pod store 9 s old, its watch backing off).
#[derive(Clone, Debug, Default)]
pub(super) struct Liveness(Arc<AtomicBool>);

impl Liveness {
    fn is_live(&self) -> bool {
        !self.0.load(Ordering::Relaxed)
    }

    /// Follows `events`: failing from an error, live again at the next delivery.
    fn track<K, S>(
        &self,
        events: S,
    ) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + use<K, S>
    where
        S: Stream<Item = watcher::Result<watcher::Event<K>>>,
    {
        let failing = self.0.clone();
        events.inspect(move |event| {
            let delivered = match event {
                Err(_) => false,
                Ok(
                    watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_),
                ) => true,
                // A relist under way: the store still shows what it showed before.
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => return,
            };
            failing.store(!delivered, Ordering::Relaxed);
        })
    }
}

/// The senders of [`Stores::changes`] and [`Stores::urgent_changes`].
#[derive(Clone)]
pub(super) struct Signals {
    all: watch::Sender<u64>,
    urgent: watch::Sender<u64>,
}

impl Signals {
    pub(super) fn new() -> (Self, watch::Receiver<u64>, watch::Receiver<u64>) {
        let (all, changes) = watch::channel(0_u64);
        let (urgent, urgent_changes) = watch::channel(0_u64);
        (Self { all, urgent }, changes, urgent_changes)
    }

    fn bump(&self, urgent: bool) {
        let next = |generation: &mut u64| *generation = generation.wrapping_add(1);
        self.all.send_modify(next);
        if urgent {
            self.urgent.send_modify(next);
        }
    }
}

impl fmt::Debug for Stores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stores")
            .field("queues", &self.queues.len())
            .field("pods", &self.pods.len())
            .field("nodes", &self.nodes.len())
            .field("namespaces", &self.namespaces.len())
            .field("budgets", &self.budgets.len())
            .finish_non_exhaustive()
    }
}

/// The watches that fill the stores; run them (each forever) with [`Watches::run`].
pub struct Watches {
    tasks: Vec<Task>,
}

/// One watch feeding its store, run forever.
type Task = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

impl fmt::Debug for Watches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watches")
            .field("count", &self.tasks.len())
            .finish()
    }
}

impl Watches {
    /// Runs every watch until the process stops.
    pub async fn run(self) {
        future::join_all(self.tasks).await;
    }
}

impl Stores {
    /// Creates the stores and the watches that fill them. `keep_pod` decides which pods are
    /// worth keeping (those that request a GPU); the others are dropped on arrival.
    pub fn new(client: &Client, keep_pod: PodFilter, metrics: &WatchMetrics) -> (Self, Watches) {
        let (signals, changes, urgent_changes) = Signals::new();
        let (queues, queue_writer) = reflector::store();
        let (pods, pod_writer) = reflector::store();
        let (nodes, node_writer) = reflector::store();
        let (namespaces, namespace_writer) = reflector::store();
        let (budgets, budget_writer) = reflector::store();

        let live: [Liveness; 7] = Default::default();
        let [
            queues_live,
            pods_live,
            nodes_live,
            namespaces_live,
            claims_live,
            classes_live,
            slices_live,
        ] = live.clone();
        let (devices, device_tasks) = device_stores(
            client,
            &signals,
            metrics,
            [claims_live, classes_live, slices_live],
        );
        let mut tasks = vec![
            reflect(
                "gpuqueues",
                queue_writer,
                queue_events(client.clone()),
                (signals.clone(), |_: &_| true),
                metrics,
                count_invalid_queues(queues.clone(), metrics.clone()),
                queues_live,
            ),
            reflect(
                "pods",
                pod_writer,
                pod_events(client.clone(), keep_pod),
                (signals.clone(), {
                    let pods = pods.clone();
                    move |event: &_| is_urgent(event, &pods)
                }),
                metrics,
                || {},
                pods_live,
            ),
            reflect(
                "nodes",
                node_writer,
                node_events(client.clone()),
                (signals.clone(), |_: &_| true),
                metrics,
                || {},
                nodes_live,
            ),
            reflect(
                "namespaces",
                namespace_writer,
                namespace_events(client.clone()),
                (signals, |_: &_| true),
                metrics,
                || {},
                namespaces_live,
            ),
            budget_watch(client, budget_writer, metrics),
        ];
        tasks.extend(device_tasks);
        let stores = Self {
            queues,
            pods,
            nodes,
            namespaces,
            budgets,
            devices,
            changes,
            urgent_changes,
            live,
        };
        (stores, Watches { tasks })
    }

    /// Resolves once every store but the budgets holds its initial list.
    pub async fn synced(&self) -> Result<(), reflector::store::WriterDropped> {
        self.queues.wait_until_ready().await?;
        self.pods.wait_until_ready().await?;
        self.nodes.wait_until_ready().await?;
        self.namespaces.wait_until_ready().await?;
        self.devices.synced().await?;
        Ok(())
    }

    /// Whether the budget store holds its initial list. Admission does not wait for it: an
    /// operator whose RBAC lacks budgets (an image upgraded without its manifests) still
    /// admits, and evicts every victim through the Eviction API. Its single poll leaves a no-op
    /// waker in the store's ready slot: nothing may await the budgets' readiness as well.
    pub fn budgets_synced(&self) -> bool {
        self.budgets
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|ready| ready.is_ok())
    }

    /// Whether the queue, pod, node, namespace and DRA watches are delivering ([`Liveness`]):
    /// what their stores show is then current but for the milliseconds of the watch.
    pub fn live(&self) -> bool {
        self.live.iter().all(Liveness::is_live)
    }

    /// A signal bumped after every change any store but the budgets applied (after its initial
    /// list).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// A signal bumped after the changes that may call for a decision at once: every change to
    /// queues, namespaces and nodes, and the pod changes [`is_urgent`] names.
    pub fn urgent_changes(&self) -> watch::Receiver<u64> {
        self.urgent_changes.clone()
    }
}

/// Whether a pod event (not yet applied to `pods`) may call for a decision at once: a pod at
/// our gate, or leaving it, waits for one; a new pod the webhook did not admit at its creation
/// (one that bypassed it, or was created while the operator was away) takes capacity the live
/// snapshot does not know of, if it asks for GPUs by a name the core knows (a pod asking only
/// other extended resources, a NIC's, is counted at the next pass if a class backs them). A
/// pod the snapshot already counts being bound, starting or deleted does not: until the next
/// pass the snapshot only counts its GPUs as taken for longer.
fn is_urgent(event: &watcher::Event<Pod>, pods: &Store<Pod>) -> bool {
    match event {
        watcher::Event::Apply(pod) => {
            let before = pods.get(&ObjectRef::from_obj(pod));
            let admitted_at_creation = pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|notes| notes.contains_key(annotations::ADMITTED_AT_CREATION));
            is_gated(pod)
                || before.map_or(!admitted_at_creation && asks_known_devices(pod), |before| {
                    is_gated(&before)
                })
        }
        watcher::Event::Delete(_) => false,
        watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => true,
    }
}

/// The GpuQueue watch; objects the operator cannot read are kept (as errors) and logged.
fn queue_events(
    client: Client,
) -> impl Stream<Item = watcher::Result<watcher::Event<StoredQueue>>> + Send + use<> {
    relisting(Api::<StoredQueue>::all(client), watcher::Config::default())
        .modify(|queue| queue.meta_mut().managed_fields = None)
        .inspect_ok(report_invalid_queue)
}

/// The watch of live pods, keeping only those `keep_pod` accepts.
fn pod_events(
    client: Client,
    keep_pod: PodFilter,
) -> impl Stream<Item = watcher::Result<watcher::Event<Pod>>> + Send + use<> {
    relisting(
        Api::<Pod>::all(client),
        watcher::Config::default().fields(LIVE_PODS),
    )
    .modify(slim_pod)
    .try_filter_map(move |event| future::ready(Ok(keep_pods(event, keep_pod.as_ref()))))
}

/// A watch that lists afresh after each of its errors, where kube's watcher resumes from the
/// last resource version it saw: a resumed watch delivers nothing until an object changes, so
/// on a quiet cluster its store would never be known [`Liveness`] again (a re-check after an
/// API server restart waited out its 5 s for a queue watch that had resumed and was never told
/// so), while a relist ends in `InitDone`. The store keeps its last state until then. Retried
/// with kube's default backoff. Errors are rare (an API server restarting, or gone from under
/// its watches), and a resumed watch would often have to relist all the same: the restarted
/// API server's watch cache no longer holds the old resource version.
fn relisting<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + fmt::Debug + Send + 'static,
{
    anew_after_errors(move || watcher(api.clone(), config.clone())).default_backoff()
}

/// The events of `start()`'s stream up to its first error, then those of a new one, and so on:
/// a stream that failed is not polled again.
fn anew_after_errors<S, T, E>(
    start: impl Fn() -> S + Send,
) -> impl Stream<Item = Result<T, E>> + Send
where
    S: Stream<Item = Result<T, E>> + Send + 'static,
{
    stream::unfold(
        (start, None::<Pin<Box<S>>>),
        |(start, current)| async move {
            let mut events = current.unwrap_or_else(|| Box::pin(start()));
            let event = events.next().await?;
            let rest = event.is_ok().then_some(events);
            Some((event, (start, rest)))
        },
    )
}

/// The node watch, without the nodes' image lists; it lists afresh after an error
/// ([`relisting`]).
fn node_events(
    client: Client,
) -> impl Stream<Item = watcher::Result<watcher::Event<Node>>> + Send + use<> {
    relisting(Api::<Node>::all(client), watcher::Config::default()).modify(|node| {
        strip_metadata(node);
        if let Some(status) = node.status.as_mut() {
            status.images = None;
        }
    })
}

/// The namespace watch; it lists afresh after an error ([`relisting`]).
fn namespace_events(
    client: Client,
) -> impl Stream<Item = watcher::Result<watcher::Event<Namespace>>> + Send + use<> {
    relisting(Api::<Namespace>::all(client), watcher::Config::default()).modify(strip_metadata)
}

/// The PodDisruptionBudget watch. It signals nobody: a budget change (its status moves with
/// every pod it selects, GPU or not) calls for no admission pass.
fn budget_watch(
    client: &Client,
    writer: Writer<PodDisruptionBudget>,
    metrics: &WatchMetrics,
) -> Task {
    reflect(
        "poddisruptionbudgets",
        writer,
        relisting_all::<PodDisruptionBudget>(client),
        (Signals::new().0, |_: &_| false),
        metrics,
        || {},
        // Followed by nobody: no pass waits for the budgets (see `Stores::budgets_synced`).
        Liveness::default(),
    )
}

/// The DRA stores ([`DeviceStores`]) and their watches, each followed by its [`Liveness`]
/// (claims, classes, slices) and listing afresh after an error; every change is urgent.
fn device_stores(
    client: &Client,
    signals: &Signals,
    metrics: &WatchMetrics,
    [claims_live, classes_live, slices_live]: [Liveness; 3],
) -> (DeviceStores, [Task; 3]) {
    let (claims, claim_writer) = reflector::store();
    let (classes, class_writer) = reflector::store();
    let (slices, slice_writer) = reflector::store();
    let tasks = [
        reflect(
            "resourceclaims",
            claim_writer,
            relisting_all::<ResourceClaim>(client),
            (signals.clone(), |_: &_| true),
            metrics,
            || {},
            claims_live,
        ),
        reflect(
            "deviceclasses",
            class_writer,
            relisting_all::<DeviceClass>(client),
            (signals.clone(), |_: &_| true),
            metrics,
            || {},
            classes_live,
        ),
        reflect(
            "resourceslices",
            slice_writer,
            relisting_all::<ResourceSlice>(client),
            (signals.clone(), |_: &_| true),
            metrics,
            || {},
            slices_live,
        ),
    ];
    let stores = DeviceStores {
        claims,
        classes,
        slices,
    };
    (stores, tasks)
}

/// The watch of every object of one kind, in every namespace, listing afresh after an error
/// ([`relisting`]).
fn relisting_all<K>(
    client: &Client,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K>
where
    K: Resource + Clone + fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    relisting(Api::<K>::all(client.clone()), watcher::Config::default()).modify(strip_metadata)
}

/// After each queue change: sets the gauge of queue objects the operator cannot read.
fn count_invalid_queues(
    queues: Store<StoredQueue>,
    metrics: WatchMetrics,
) -> impl Fn() + Send + 'static {
    move || {
        let invalid = queues
            .state()
            .iter()
            .filter(|queue| queue.0.is_err())
            .count();
        metrics.set_invalid_queues(i64::try_from(invalid).unwrap_or(i64::MAX));
    }
}

/// Feeds one watch into its store; bumps the signals after each applied change (the urgent
/// one when `urgent` says so of the event, asked before the store applies it).
fn reflect<K, S, U>(
    resource: &'static str,
    writer: Writer<K>,
    events: S,
    (signals, urgent): (Signals, U),
    metrics: &WatchMetrics,
    after_change: impl Fn() + Send + 'static,
    live: Liveness,
) -> Task
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
    S: futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    U: Fn(&watcher::Event<K>) -> bool + Send + 'static,
{
    let metrics = metrics.clone();
    // The reflector applies each event as it passes, one at a time: the flag carries the
    // verdict on the event from before it is applied to after.
    let pending = Arc::new(AtomicBool::new(false));
    let events = events.inspect_ok({
        let pending = pending.clone();
        move |event| pending.store(urgent(event), Ordering::Relaxed)
    });
    let task = async move {
        // Followed once applied: a pass that finds the watch live finds the store caught up.
        let mut events = std::pin::pin!(live.track(reflector::reflector(writer, events)));
        while let Some(event) = events.next().await {
            match event {
                // The initial list is applied as a whole at `InitDone`.
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Ok(
                    watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_),
                ) => {
                    after_change();
                    signals.bump(pending.swap(false, Ordering::Relaxed));
                }
                Err(error) => {
                    metrics.watch_failed(resource);
                    tracing::warn!(resource, %error, "watch failed; retrying with backoff");
                }
            }
        }
    };
    Box::pin(task.instrument(tracing::info_span!("watch", resource)))
}

/// Keeps the pods `keep` wants. A pod that stops qualifying is deleted from the store rather
/// than left behind with its old content.
fn keep_pods(
    event: watcher::Event<Pod>,
    keep: &(dyn Fn(&Pod) -> bool + Send + Sync),
) -> Option<watcher::Event<Pod>> {
    match event {
        watcher::Event::InitApply(pod) if !keep(&pod) => None,
        watcher::Event::Apply(pod) if !keep(&pod) => Some(watcher::Event::Delete(pod)),
        event => Some(event),
    }
}

fn report_invalid_queue(event: &watcher::Event<StoredQueue>) {
    if let watcher::Event::Apply(queue) | watcher::Event::InitApply(queue) = event
        && let Err(invalid) = &queue.0
    {
        tracing::warn!(
            queue = invalid.metadata.name.as_deref().unwrap_or_default(),
            error = %invalid.error,
            "GpuQueue cannot be read; it is reported on its status and admits nothing"
        );
    }
}

#[cfg(test)]
mod tests {
    use gpuqueue_api::ADMISSION_GATE;
    use std::collections::BTreeMap;

    use futures::stream;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
    use serde_json::json;

    use super::super::{metrics::WatchMetrics, slim::LAST_APPLIED};
    use super::*;
    use crate::metrics;

    #[tokio::test]
    async fn a_store_is_not_live_from_a_watch_error_until_its_watch_delivers_again() {
        let live = Liveness::default();
        let error = || Err(watcher::Error::NoResourceVersion);
        let seen = |events: Vec<watcher::Result<watcher::Event<Pod>>>| {
            let live = live.clone();
            async move {
                let mut tracked = std::pin::pin!(live.track(stream::iter(events)));
                while tracked.next().await.is_some() {}
                live.is_live()
            }
        };
        assert!(live.is_live(), "live once synced");
        assert!(!seen(vec![Ok(watcher::Event::Apply(pod("a", true))), error()]).await);
        // A relist under way does not make it live; its end does.
        assert!(
            !seen(vec![
                Ok(watcher::Event::Init),
                Ok(watcher::Event::InitApply(pod("a", true)))
            ])
            .await
        );
        assert!(seen(vec![Ok(watcher::Event::InitDone)]).await);
        // A resumed watch: its first event.
        assert!(!seen(vec![error()]).await);
        assert!(seen(vec![Ok(watcher::Event::Delete(pod("a", true)))]).await);
    }

    #[tokio::test]
    async fn a_watch_that_failed_is_not_polled_again_and_a_new_one_lists_afresh() {
        let started = std::sync::atomic::AtomicUsize::new(0);
        let events = anew_after_errors(|| {
            let n = started.fetch_add(1, Ordering::Relaxed);
            let script: Vec<Result<&str, &str>> = if n == 0 {
                vec![Ok("synced"), Err("connection refused")]
            } else {
                vec![Ok("listed afresh"), Ok("changed")]
            };
            // Polling a stream after its error would retry it: here, a panic.
            stream::iter(script).chain(stream::poll_fn(move |_| {
                assert_ne!(n, 0, "the failed watch was polled again");
                std::task::Poll::Pending
            }))
        });
        let seen: Vec<_> = events.take(4).collect().await;
        assert_eq!(
            seen,
            [
                Ok("synced"),
                Err("connection refused"),
                Ok("listed afresh"),
                Ok("changed")
            ]
        );
        assert_eq!(started.load(Ordering::Relaxed), 2);
    }

    fn pod(name: &str, gpu: bool) -> Pod {
        let mut annotations = BTreeMap::new();
        annotations.insert(LAST_APPLIED.to_owned(), "{...}".to_owned());
        annotations.insert("gpuqueue.io/queue".to_owned(), "batch".to_owned());
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("batch".to_owned()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                annotations: Some(annotations),
                labels: Some(BTreeMap::from([("gpu".to_owned(), gpu.to_string())])),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn wants_gpu(pod: &Pod) -> bool {
        pod.metadata
            .labels
            .as_ref()
            .is_some_and(|labels| labels["gpu"] == "true")
    }

    #[test]
    fn metadata_nobody_reads_is_dropped_and_the_rest_kept() {
        let mut pod = pod("p", true);
        strip_metadata(&mut pod);
        assert!(pod.metadata.managed_fields.is_none());
        let annotations = pod.metadata.annotations.unwrap();
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert_eq!(annotations["gpuqueue.io/queue"], "batch");
    }

    #[test]
    fn pods_without_a_gpu_are_not_kept() {
        assert!(keep_pods(watcher::Event::InitApply(pod("cpu", false)), &wants_gpu).is_none());
        assert!(matches!(
            keep_pods(watcher::Event::Apply(pod("cpu", false)), &wants_gpu),
            Some(watcher::Event::Delete(_))
        ));
        assert!(matches!(
            keep_pods(watcher::Event::Apply(pod("gpu", true)), &wants_gpu),
            Some(watcher::Event::Apply(_))
        ));
        assert!(matches!(
            keep_pods(watcher::Event::Delete(pod("cpu", false)), &wants_gpu),
            Some(watcher::Event::Delete(_))
        ));
    }

    fn gated(mut pod: Pod) -> Pod {
        pod.spec = Some(
            serde_json::from_value(json!({
                "containers": [], "schedulingGates": [{"name": ADMISSION_GATE}],
            }))
            .unwrap(),
        );
        pod
    }

    fn admitted_at_creation(mut pod: Pod) -> Pod {
        pod.metadata.annotations.get_or_insert_default().insert(
            annotations::ADMITTED_AT_CREATION.to_owned(),
            "t-1".to_owned(),
        );
        pod
    }

    #[test]
    fn only_changes_that_may_call_for_a_decision_are_urgent() {
        let (store, mut writer) = reflector::store::<Pod>();
        let urgent = |event: watcher::Event<Pod>, writer: &mut Writer<Pod>| {
            let verdict = is_urgent(&event, &store);
            writer.apply_watcher_event(&event);
            verdict
        };
        let apply = watcher::Event::Apply;
        assert!(
            urgent(apply(gated(pod("w", true))), &mut writer),
            "a pod at the gate"
        );
        assert!(
            urgent(apply(pod("w", true)), &mut writer),
            "a pod leaving the gate"
        );
        assert!(
            !urgent(apply(pod("w", true)), &mut writer),
            "a released pod changing again (bound, started)"
        );
        assert!(
            !urgent(apply(admitted_at_creation(pod("c", true))), &mut writer),
            "a pod the webhook admitted at creation: the live snapshot counts it already"
        );
        let asking = |name: &str, resource: &str| {
            let mut pod = pod(name, true);
            pod.spec = Some(
                serde_json::from_value(json!({"containers": [{"name": "c",
                    "resources": {"limits": {resource: "1"}}}]}))
                .unwrap(),
            );
            pod
        };
        assert!(
            urgent(apply(asking("bypassed", "nvidia.com/gpu")), &mut writer),
            "a new pod the webhook did not admit takes capacity the snapshot does not know of"
        );
        assert!(
            !urgent(apply(asking("nic", "example.com/nic")), &mut writer),
            "a pod asking only a vendor's resource, on every VM or NIC pod of the cluster"
        );
        assert!(
            !urgent(watcher::Event::Delete(pod("w", true)), &mut writer),
            "a pod going away only frees GPUs later than the snapshot could use them"
        );
        assert!(urgent(watcher::Event::InitDone, &mut writer), "a relist");
    }

    #[tokio::test]
    async fn changes_are_signalled_after_the_initial_list_and_on_every_change() {
        let (store, writer) = reflector::store::<Pod>();
        let (signals, changes, urgent_changes) = Signals::new();
        let mut registry = metrics::registry();
        let metrics = WatchMetrics::register(&mut registry);
        let events = stream::iter(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(pod("a", true))),
            Ok(watcher::Event::InitApply(pod("b", true))),
            Ok(watcher::Event::InitDone),
            Err(watcher::Error::NoResourceVersion),
            Ok(watcher::Event::Delete(pod("a", true))),
        ]);
        let urgent = {
            let store = store.clone();
            move |event: &_| is_urgent(event, &store)
        };
        reflect(
            "pods",
            writer,
            events,
            (signals, urgent),
            &metrics,
            || {},
            Liveness::default(),
        )
        .await;
        assert_eq!(
            *changes.borrow(),
            2,
            "InitDone and the delete; the error is not a change"
        );
        assert_eq!(*urgent_changes.borrow(), 1, "the delete is not urgent");
        assert!(store.get(&ObjectRef::new("b").within("batch")).is_some());
        assert!(store.get(&ObjectRef::new("a").within("batch")).is_none());
        let text = metrics::encode(&registry).unwrap();
        assert!(
            text.contains(r#"gpuqueue_watch_errors_total{resource="pods"} 1"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn an_unreadable_queue_is_stored_as_an_error_and_counted() {
        let good: StoredQueue = serde_json::from_value(json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "good"},
            "spec": {"namespaces": ["a"], "resources": [{"name": "nvidia.com/gpu", "guaranteed": 1}]},
        }))
        .unwrap();
        let bad: StoredQueue = serde_json::from_value(json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "bad"},
            "spec": {"namespaces": ["b"], "resources": "eight GPUs please"},
        }))
        .unwrap();
        assert!(bad.0.is_err());

        let (store, writer) = reflector::store::<StoredQueue>();
        let (signals, _changes, _urgent) = Signals::new();
        let mut registry = metrics::registry();
        let metrics = WatchMetrics::register(&mut registry);
        let events = stream::iter(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(good)),
            Ok(watcher::Event::InitApply(bad)),
            Ok(watcher::Event::InitDone),
        ])
        .inspect_ok(report_invalid_queue);
        let count = {
            let store = store.clone();
            let metrics = metrics.clone();
            move || {
                let invalid = store.state().iter().filter(|q| q.0.is_err()).count();
                metrics.set_invalid_queues(i64::try_from(invalid).unwrap());
            }
        };
        reflect(
            "gpuqueues",
            writer,
            events,
            (signals, |_: &_| true),
            &metrics,
            count,
            Liveness::default(),
        )
        .await;
        assert_eq!(store.len(), 2, "the bad queue did not stop the list");
        let bad = store.get(&ObjectRef::new("bad")).unwrap();
        let error = &bad.0.as_ref().unwrap_err().error;
        assert!(error.contains("Expected a sequence"), "{error}");
        let text = metrics::encode(&registry).unwrap();
        assert!(text.contains("gpuqueue_invalid_queue_objects 1"), "{text}");
    }
}
