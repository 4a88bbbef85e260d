//! Phase 1, observe: reading the stores into the core's model, the "dereference" step of the
//! admission pass. Every rule comes from `gpuqueue-core` (what a GPU pod is, what a valid queue
//! is); this module only gathers the objects and converts them.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use gpuqueue_api::v1alpha1::GpuQueueStatus;
use gpuqueue_core::{
    Snapshot,
    fragmentation::DEFAULT_POPULARITY,
    model::{
        self, Converted, FieldError, NodeError, PodError, PodKey, QueueError,
        dra::{DeviceClasses, ExtendedCharge, add_requests, extended_charge},
    },
    pins::{self, Released, UNBINDABLE_AFTER},
    snapshot::kept::{KeptSnapshot, Made},
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

use super::{
    at_creation::{Arrival, Pass, creation_token},
    device_claims,
};
use crate::{
    cluster::{assumed::Assumed, stores::Stores},
    reclaim::VICTIM,
    seal::{self, Seal, Verdict},
};

/// A queue that cannot be used, with what its status should say.
#[derive(Debug, Clone)]
pub struct InvalidQueue {
    pub name: String,
    pub generation: Option<i64>,
    pub error: QueueError,
    pub status: Option<GpuQueueStatus>,
}

/// The cluster as the core sees it, read from the stores.
#[derive(Debug, Default)]
pub struct Observed {
    pub queues: Vec<model::Queue>,
    pub invalid_queues: Vec<InvalidQueue>,
    pub namespaces: Vec<model::Namespace>,
    pub nodes: Vec<Arc<model::Node>>,
    pub pods: Vec<Arc<model::Pod>>,
    /// GPU pods the core cannot model, with why: they stay at the gate, and say so.
    pub unreadable_pods: Vec<(Arc<Pod>, String)>,
    /// Problems with single objects: each object was left out (or read with a default), the
    /// rest is usable.
    pub problems: Vec<String>,
    /// Pinned pods kube-scheduler cannot bind, whose room is released (see [`pins`]).
    pub stuck_pins: Released,
    /// Pods carrying admission annotations the operator does not believe: read as unadmitted.
    pub unbelieved: Vec<Unbelieved>,
}

/// A pod whose admission annotations the term's seal does not vouch for (written by somebody
/// else, or copied from another pod), and why: the core reads it as unadmitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unbelieved {
    pub pod: PodKey,
    pub why: String,
}

/// What reading one pod gave: the model shared, so that a pass copies a pointer per pod.
type PodModel = Result<Option<Converted<Arc<model::Pod>>>, PodError>;

/// What reading one pod gave, kept with its conversion.
#[derive(Clone, Debug, PartialEq)]
struct PodReading {
    model: PodModel,
    /// Whether it claims devices through DRA (kept with the model: a pass would otherwise read
    /// every pod's spec again).
    claims: bool,
    /// Why its admission annotations are not believed, when they are not.
    unbelieved: Option<String>,
}

/// What reading one node gave, shared like a pod's.
type NodeModel = Result<Converted<Arc<model::Node>>, NodeError>;

/// Pods and nodes as the core models them, kept from pass to pass: every pass reads every pod
/// and node, but in a burst each pass finds only a few changed, and converting them all again
/// was most of a pass's time. An entry is reused while the store holds the very same object
/// (the reflector stores a new one for every change); pods seen through [`Assumed`] are
/// converted afresh. The maps are kept in place (at 10,000 pods, building new ones each pass
/// cost a tenth of it): an entry not read in a pass is dropped at its end.
#[derive(Debug, Default)]
pub struct Models {
    pods: Conversions<Pod, PodReading>,
    nodes: Conversions<Node, NodeModel>,
    derived: Derived,
    problems: Problems,
    /// The term's seal: pods whose admission it does not vouch for are read as unadmitted
    /// ([`crate::seal`]). Set before the term's first pass, as the conversions depend on it.
    pub seal: Option<Seal>,
    /// Who holds each reservation token, kept through the term.
    tokens: TokenHolders,
}

/// The problems the last pass met with single objects. Every pass meets them all again, so
/// each is logged as a warning once, when first met (a node or pod left out, or read with a
/// default, must be visible without debug logs), and again only after a pass that did not
/// meet it.
#[derive(Debug, Default)]
struct Problems(HashSet<String>);

impl Problems {
    /// The problems of `met` the last pass did not meet; `met` is remembered for the next.
    fn first_met<'a>(&mut self, met: &'a [String]) -> Vec<&'a String> {
        let last = std::mem::replace(&mut self.0, met.iter().cloned().collect());
        met.iter()
            .filter(|problem| !last.contains(problem.as_str()))
            .collect()
    }
}

/// The pod models the last pass derived itself (a DRA claim's charge, a HAMi pod's devices, a
/// released pin, a reservation), by pod key: a derivation equal to the last one is given the
/// last one's object. The kept snapshot tells a changed pod by a new object: without this,
/// every DRA or HAMi pod would be a change on every pass, and a cluster full of them would be
/// built anew each time instead of updated.
#[derive(Debug, Default)]
struct Derived(HashMap<PodKey, Arc<model::Pod>, foldhash::fast::RandomState>);

impl Derived {
    /// Gives each pod this pass made (only the pass holds it; a conversion is shared with its
    /// entry) the last pass's object when the two are equal, and keeps this pass's for the next.
    fn keep_identity(&mut self, pods: &mut [Arc<model::Pod>]) {
        let mut last = std::mem::take(&mut self.0);
        for pod in pods.iter_mut().filter(|pod| Arc::strong_count(pod) == 1) {
            if let Some(same) = last.remove(&pod.key).filter(|last| **last == **pod) {
                *pod = same;
            }
            self.0.insert(pod.key.clone(), pod.clone());
        }
    }
}

/// The last conversion of each stored object, by the object's address, with the pass that
/// last read it. An entry holds its object, so no other object takes that address while the
/// entry lives; a changed pod is a new object at a new address, and its old entry is dropped
/// at the end of the pass. Every pod is looked up in every pass: an address hashes in a few
/// instructions, where a uid took a tenth of the pass.
#[derive(Debug)]
struct Conversions<K, M> {
    entries: HashMap<usize, Conversion<K, M>, foldhash::fast::RandomState>,
    pass: u64,
}

#[derive(Debug)]
struct Conversion<K, M> {
    /// Held, never read: while the entry lives, no other object takes this one's address.
    _stored: Arc<K>,
    model: M,
    read_in: u64,
}

impl<K, M> Default for Conversions<K, M> {
    fn default() -> Self {
        Self {
            entries: HashMap::default(),
            pass: 0,
        }
    }
}

/// Where a stored object lives: its identity while it is held.
fn address<K>(stored: &Arc<K>) -> usize {
    Arc::as_ptr(stored).addr()
}

impl<K, M: Clone> Conversions<K, M> {
    /// Starts a pass: what it does not read is dropped by [`Self::end_pass`].
    fn start_pass(&mut self) {
        self.pass += 1;
    }

    /// Reads `stored` as `view` shows it, from the last conversion when it is the same object.
    fn read(&mut self, stored: &Arc<K>, view: &K, mut convert: impl FnMut(&K) -> M) -> M {
        if !std::ptr::eq(view, stored.as_ref()) {
            return convert(view);
        }
        let pass = self.pass;
        let address = address(stored);
        if let Some(entry) = self.entries.get_mut(&address) {
            entry.read_in = pass;
            return entry.model.clone();
        }
        let model = convert(stored);
        self.entries.insert(
            address,
            Conversion {
                _stored: stored.clone(),
                model: model.clone(),
                read_in: pass,
            },
        );
        model
    }

    /// Drops the conversions this pass did not read (their objects are gone, or seen through
    /// [`Assumed`]).
    fn end_pass(&mut self) {
        let pass = self.pass;
        self.entries.retain(|_, entry| entry.read_in == pass);
    }
}

impl Observed {
    /// Reads every store; the pods are `pods`, the pod store's state the caller read once for
    /// the whole pass (a second read could show a pod the caller's bookkeeping has not seen).
    /// Pods are seen through `assumed`, so admissions the store has not shown yet already hold
    /// their GPUs. `models` are the last pass's conversions, replaced by this pass's.
    pub fn read(
        stores: &Stores,
        pods: &[Arc<Pod>],
        assumed: &Assumed,
        models: &mut Models,
    ) -> Self {
        let mut observed = Self::default();
        for stored in stores.queues.state() {
            match &stored.0 {
                Ok(queue) => match model::Queue::from_api(queue) {
                    Ok(queue) => observed.queues.push(queue),
                    Err(error) => observed.invalid_queues.push(InvalidQueue {
                        name: queue.name_any(),
                        generation: queue.metadata.generation,
                        error,
                        status: queue.status.clone(),
                    }),
                },
                Err(invalid) => observed.invalid_queues.push(unreadable(invalid)),
            }
        }
        observed.namespaces = stores
            .namespaces
            .state()
            .iter()
            .map(|namespace| model::Namespace::from_k8s(namespace))
            .collect();
        let slices = stores.devices.slices.state();
        let classes = stores.devices.classes.state();
        let dra_pools = model::device_slices::slice_pools(
            slices.iter().map(AsRef::as_ref),
            classes.iter().map(AsRef::as_ref),
        );
        models.nodes.start_pass();
        models.pods.start_pass();
        for node in stores.nodes.state() {
            match models.nodes.read(&node, &node, shared_node) {
                Ok(mut converted) => {
                    observed.problems.extend(converted.warnings);
                    if let Some(pools) = dra_pools.get(&converted.value.name) {
                        model::device_slices::add_slice_pools(
                            Arc::make_mut(&mut converted.value),
                            pools,
                        );
                    }
                    observed.nodes.push(converted.value);
                }
                Err(error) => observed.problems.push(error.to_string()),
            }
        }
        let classes = DeviceClasses::from_k8s(classes.iter().map(AsRef::as_ref));
        let claiming = observed.read_pods(pods, assumed, models, &classes);
        models.nodes.end_pass();
        models.pods.end_pass();
        device_claims::charge(
            &mut observed.pods,
            claiming,
            (&observed.nodes, &stores.devices, &classes),
            (&mut observed.unreadable_pods, &mut observed.problems),
        );
        observed
    }

    /// Reads the pods into [`Self::pods`] (or [`Self::unreadable_pods`]), each as `assumed`
    /// shows it, and as unadmitted where its admission is not the operator's, charged for the
    /// extended resources `classes` back; returns those that claim devices through DRA, by
    /// index, for their claims to be charged.
    fn read_pods(
        &mut self,
        pods: &[Arc<Pod>],
        assumed: &Assumed,
        models: &mut Models,
        classes: &DeviceClasses,
    ) -> Vec<(usize, Arc<Pod>)> {
        let mut claiming = Vec::new();
        let Models {
            pods: conversions,
            tokens,
            seal,
            ..
        } = models;
        let seal = seal.as_ref();
        // A term's first pass notes every token before it judges any pod: it may meet a copy
        // before its original. Later passes note the pods they convert (new objects). Only
        // admissions the seal vouches for hold a token: anybody may write one on a pod of
        // their own, created first.
        tokens.forget_the_gone(pods.len());
        if let Some(seal) = seal
            && !tokens.primed
        {
            for stored in pods {
                let view = assumed.view(stored);
                if !matches!(seal.verdict(view), Verdict::Forged(_)) {
                    tokens.note(view);
                }
            }
            tokens.primed = true;
        }
        for stored in pods {
            let view = assumed.view(stored);
            let mut reading = conversions.read(stored, view, |pod| {
                let reading = read_pod(pod, seal);
                if seal.is_some() && reading.unbelieved.is_none() {
                    tokens.note(pod);
                }
                reading
            });
            if let Some(why) = tokens.copied(view) {
                reading = read_forged(view, why);
            }
            let PodReading {
                model,
                claims,
                unbelieved,
            } = reading;
            match model {
                Ok(Some(converted)) => {
                    self.problems.extend(converted.warnings);
                    let Some(pod) = self.charge_extended(converted.value, stored, claims, classes)
                    else {
                        continue;
                    };
                    if let Some(why) = unbelieved {
                        self.unbelieved.push(Unbelieved {
                            pod: pod.key.clone(),
                            why,
                        });
                    }
                    if claims {
                        claiming.push((self.pods.len(), stored.clone()));
                    }
                    self.pods.push(pod);
                }
                Ok(None) => {}
                Err(error) => self
                    .unreadable_pods
                    .push((stored.clone(), error.to_string())),
            }
        }
        claiming
    }
}

impl Observed {
    /// Adds to `pod`'s requests what its extended resources charge through the classes backing
    /// them (`gpuqueue_core::model::dra::extended_charge`). `None` when it leaves the model: an
    /// admitted pod that is no GPU pod after all, or a pending pod they cannot be counted for
    /// (it waits, saying why; an admitted one keeps what it holds otherwise, and the problem is
    /// logged). A pending one that is no GPU pod (the class that made the webhook gate it no
    /// longer declares its resource, or a tenant gated it by hand) is kept charging nothing, so
    /// that a pass releases it rather than leaving it at the gate with no reason.
    fn charge_extended(
        &mut self,
        mut pod: Arc<model::Pod>,
        stored: &Arc<Pod>,
        claims: bool,
        classes: &DeviceClasses,
    ) -> Option<Arc<model::Pod>> {
        if pod.extended.is_empty() {
            return Some(pod);
        }
        match extended_charge(&pod, claims, classes) {
            Ok(ExtendedCharge::NotGpuPod) => (!pod.is_admitted()).then_some(pod),
            Ok(ExtendedCharge::Charged(devices)) => {
                if !devices.is_empty() {
                    add_requests(&mut Arc::make_mut(&mut pod).requests.gpus, &devices);
                }
                Some(pod)
            }
            Err(error) => {
                let reason = format!("pod {}: {error}", pod.key);
                if pod.is_admitted() {
                    self.problems.push(reason);
                    Some(pod)
                } else {
                    self.unreadable_pods.push((stored.clone(), reason));
                    None
                }
            }
        }
    }
}

/// Reads a node into the core's model, shared.
fn shared_node(node: &Node) -> NodeModel {
    model::Node::from_k8s(node).map(|converted| Converted {
        value: Arc::new(converted.value),
        warnings: converted.warnings,
    })
}

/// Reads a pod into the core's model, shared; as unadmitted when it carries an admission
/// `seal` does not vouch for.
fn read_pod(pod: &Pod, seal: Option<&Seal>) -> PodReading {
    if let Some(Verdict::Forged(why)) = seal.map(|seal| seal.verdict(pod)) {
        return read_forged(pod, why);
    }
    PodReading {
        model: convert_pod(pod),
        claims: claims_devices(pod),
        unbelieved: None,
    }
}

/// Reads a pod whose admission is not the operator's as unadmitted, saying why.
fn read_forged(pod: &Pod, why: String) -> PodReading {
    PodReading {
        model: convert_pod(&seal::unadmitted(pod)),
        claims: claims_devices(pod),
        unbelieved: Some(why),
    }
}

fn convert_pod(pod: &Pod) -> PodModel {
    model::Pod::from_k8s(pod).map(|read| {
        read.map(|converted| Converted {
            value: Arc::new(converted.value),
            warnings: converted.warnings,
        })
    })
}

fn claims_devices(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(model::uses_resource_claims)
}

/// Who holds each reservation token of an admission at creation, kept through a term and
/// told of each pod as it is converted (a changed pod is a new object): a token is one
/// admission, good for one pod, so of the pods carrying it the first created (then the first
/// by name) holds it, and the others are copies, read as unadmitted. A pass costs nothing
/// more while no copy exists.
#[derive(Debug, Default)]
struct TokenHolders {
    holders: HashMap<String, Holder, foldhash::fast::RandomState>,
    /// The copies: uid to the token they carry.
    copies: HashMap<String, String>,
    /// Whether every pod of the term's first pass was noted.
    primed: bool,
}

/// A pod carrying a token: when it was created, its name and uid (ordered so).
type Holder = (Option<Timestamp>, String, String);

impl TokenHolders {
    /// Takes note of `pod`'s token, if it carries one.
    fn note(&mut self, pod: &Pod) {
        let Some(token) = creation_token(pod) else {
            return;
        };
        let candidate: Holder = (
            pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
            pod.metadata.name.clone().unwrap_or_default(),
            pod.metadata.uid.clone().unwrap_or_default(),
        );
        match self.holders.entry(token.to_owned()) {
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(candidate);
            }
            std::collections::hash_map::Entry::Occupied(mut entry) => {
                if entry.get().2 == candidate.2 {
                    return;
                }
                let copy = if candidate < *entry.get() {
                    std::mem::replace(entry.get_mut(), candidate)
                } else {
                    candidate
                };
                self.copies.insert(copy.2, token.to_owned());
            }
        }
    }

    /// Starts afresh (the next notes prime it again) once it keeps far more tokens than pods
    /// exist: the tokens of deleted pods are not dropped one by one.
    fn forget_the_gone(&mut self, pods: usize) {
        if self.holders.len() > 2 * pods + 1024 {
            *self = Self::default();
        }
    }

    /// Why `pod` is read as unadmitted, when it carries another pod's token.
    fn copied(&self, pod: &Pod) -> Option<String> {
        if self.copies.is_empty() {
            return None;
        }
        let token = self.copies.get(pod.metadata.uid.as_deref()?)?;
        let (_, holder, _) = self.holders.get(token)?;
        Some(format!(
            "its reservation token {token} is pod {holder}'s, created before it"
        ))
    }
}

/// A queue object the operator could not even deserialise (its schema and the operator's
/// types disagree), as an invalid spec naming the error.
fn unreadable(invalid: &kube::core::error_boundary::InvalidObject) -> InvalidQueue {
    let name = invalid.metadata.name.clone().unwrap_or_default();
    InvalidQueue {
        error: QueueError {
            queue: name.clone(),
            problems: vec![FieldError {
                field: "spec".into(),
                rule: format!("cannot be read by this operator version: {}", invalid.error),
            }],
        },
        name,
        generation: invalid.metadata.generation,
        status: None,
    }
}

/// What the observe phase hands to the rest of the pass.
#[derive(Debug)]
pub struct Observation {
    /// The core's snapshot: queues, namespaces, nodes and pods (reservations included), with
    /// the workload mix and each queue's last reclaim.
    pub snapshot: Snapshot,
    /// Whether the snapshot was built, or the last one brought up to date.
    pub made: Made,
    /// GPU pods the core cannot model, with why: they stay at the gate, and say so.
    pub unreadable_pods: Vec<(Arc<Pod>, String)>,
    pub invalid_queues: Vec<InvalidQueue>,
    pub stuck_pins: Released,
    pub unbelieved: Vec<Unbelieved>,
}

/// Phase 1 of a pass, first half (under the lock of `assumed`): reads the stores as `assumed`
/// shows them, with the pods the webhook admitted at creation (`creation`). Also returns the
/// reservations whose pods the store now shows.
pub fn read(
    stores: &Stores,
    assumed: &mut Assumed,
    creation: &mut Pass<'_>,
    models: &mut Models,
    now: Timestamp,
) -> (Observed, Vec<Arrival>) {
    let pods = stores.pods.state();
    assumed.settle(pods.iter().map(AsRef::as_ref));
    let settled = creation.settle(&pods, now);
    // One read of the pod store for all three, so that a pod arriving meanwhile is not
    // counted both as itself and as its reservation.
    let mut observed = Observed::read(stores, &pods, assumed, models);
    // Running HAMi pods on the devices HAMi gave them, not the lowest free ones.
    let hami = model::seat_hami_pods(&mut observed.pods, observed.nodes.iter().map(AsRef::as_ref));
    observed.problems.extend(hami);
    observed.stuck_pins = pins::release_stuck_pins(&mut observed.pods, now, UNBINDABLE_AFTER);
    // Pods admitted at creation that the store does not show yet hold their room.
    observed.pods.extend(creation.reserved_pods().map(Arc::new));
    models.derived.keep_identity(&mut observed.pods);
    for problem in models.problems.first_met(&observed.problems) {
        tracing::warn!(%problem, "object left out of the snapshot, or read with a default");
    }
    (observed, settled)
}

/// Phase 1 of a pass, second half: what was read into the core's snapshot, with each queue's
/// last reclaim (from its records, and from `reclaimed_from`, the reclaims not yet recorded).
pub fn snapshot(
    observed: Observed,
    stores: &Stores,
    kept: &mut KeptSnapshot,
    reclaimed_from: impl IntoIterator<Item = (String, Timestamp)>,
    now: Timestamp,
) -> Observation {
    let mut builder = Snapshot::builder()
        .queues(observed.queues)
        .namespaces(observed.namespaces)
        .nodes(observed.nodes)
        .pods(observed.pods)
        .workload_mix_of_pods(DEFAULT_POPULARITY);
    // When each queue was last reclaimed from (its borrowing cool-down): from the queues'
    // handover records, and from this process's handovers whose records are not written yet.
    for (queue, at) in last_reclaims(stores, now).into_iter().chain(reclaimed_from) {
        builder = builder.reclaimed_from(queue, at);
    }
    // The last pass's snapshot brought up to date where only a few pods changed.
    let (snapshot, issues, made) = kept.build(builder);
    for issue in &issues {
        tracing::debug!(%issue, "snapshot left an object out");
    }
    Observation {
        snapshot,
        made,
        unreadable_pods: observed.unreadable_pods,
        invalid_queues: observed.invalid_queues,
        stuck_pins: observed.stuck_pins,
        unbelieved: observed.unbelieved,
    }
}

/// When each queue was last reclaimed from, from the reclaim records in its status. No reclaim
/// started after `now`: a later start (a skewed clock, or a record an older version resumed from
/// a forged intent) would stop the queue from borrowing until then.
fn last_reclaims(stores: &Stores, now: Timestamp) -> Vec<(String, Timestamp)> {
    let mut last: HashMap<String, Timestamp> = HashMap::new();
    for stored in stores.queues.state() {
        let Ok(queue) = &stored.0 else { continue };
        let Some(status) = &queue.status else {
            continue;
        };
        for record in status.last_handovers.iter().filter(|r| r.role == VICTIM) {
            if let Some(at) = record.started_at.as_ref().map(|at| at.0.min(now)) {
                let entry = last
                    .entry(queue.metadata.name.clone().unwrap_or_default())
                    .or_insert(at);
                *entry = (*entry).max(at);
            }
        }
    }
    last.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cluster::testing::{TestStores, claiming_stores as stores, gpu_pod as pod, queue};

    #[test]
    fn a_reclaim_record_that_starts_after_now_counts_as_starting_now() {
        let mut stores = TestStores::new();
        let mut batch = queue("batch", &["batch"], None);
        batch["status"] = json!({"lastHandovers": [{
            "id": "rc-forged", "role": "victim", "ownerPod": "online/o", "node": "n1",
            "startedAt": "2099-01-01T00:00:00Z", "outcome": "Completed",
            "budgetMillis": 3000, "totalMillis": 900
        }]});
        stores.add_queue(batch);
        let now: Timestamp = "2026-12-01T12:00:00Z".parse().unwrap();
        assert_eq!(
            last_reclaims(&stores.stores, now),
            [("batch".to_owned(), now)]
        );
    }

    #[test]
    fn a_problem_is_told_when_first_met_and_again_only_after_a_pass_without_it() {
        let mut problems = Problems::default();
        let (node, pod) = ("node n1: bad".to_owned(), "pod a/p: bad".to_owned());
        let both = [node.clone(), pod.clone()];
        assert_eq!(problems.first_met(std::slice::from_ref(&node)), [&node]);
        assert!(problems.first_met(std::slice::from_ref(&node)).is_empty());
        assert_eq!(problems.first_met(&both), [&pod]);
        assert!(problems.first_met(std::slice::from_ref(&pod)).is_empty());
        assert_eq!(problems.first_met(&both), [&node]);
    }

    /// A pass over a DRA pod and a HAMi pod that did not change gives the kept snapshot their
    /// last objects again, so it is updated, not built anew; a changed charge is a new object.
    #[test]
    fn a_pass_over_unchanged_derived_pods_updates_the_kept_snapshot() {
        use kube::runtime::watcher::Event;

        use gpuqueue_core::model::GpuRequest;

        use crate::admission::at_creation::AtCreation;

        let mut stores = stores();
        let class = json!({"metadata": {"name": "gpu.nvidia.com"},
            "spec": {"extendedResourceName": "nvidia.com/gpu"}});
        let claim = |count: u32| {
            serde_json::from_value(json!({
                "metadata": {"name": "gpus", "namespace": "batch",
                    "finalizers": [model::dra::CHARGED_FINALIZER]},
                "spec": {"devices": {"requests": [{"name": "g",
                    "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]}}}))
            .unwrap()
        };
        let devices = &mut stores.devices;
        devices
            .classes
            .apply_watcher_event(&Event::Apply(serde_json::from_value(class).unwrap()));
        devices.claims.apply_watcher_event(&Event::Apply(claim(2)));
        stores.add_pod(json!({
            "metadata": {"name": "dra", "namespace": "batch", "uid": "u-dra",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "image": "i"}],
                     "schedulingGates": [{"name": gpuqueue_api::ADMISSION_GATE}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpus"}]},
        }));
        stores.add_node(json!({
            "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"},
                "annotations": {"hami.io/node-nvidia-register":
                    "GPU-a,10,81920,100,NVIDIA-H100,0,true:GPU-b,10,81920,100,NVIDIA-H100,0,true:"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "20"}},
        }));
        stores.add_pod(json!({
            "metadata": {"name": "hami", "namespace": "batch", "uid": "u-hami",
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {"hami.io/vgpu-devices-allocated": "GPU-b,NVIDIA,20000,30:;"}},
            "spec": {"nodeName": "n1",
                     "containers": [{"name": "c", "image": "i",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }));
        let now: Timestamp = "2026-12-01T12:00:00Z".parse().unwrap();
        let at_creation = AtCreation::new(false);
        let mut assumed = Assumed::default();
        let mut models = Models::default();
        let mut kept = KeptSnapshot::default();
        let mut pass = |stores: &TestStores| {
            let (observed, _) = read(
                &stores.stores,
                &mut assumed,
                &mut at_creation.pass(),
                &mut models,
                now,
            );
            let mut pods = observed.pods.clone();
            pods.sort_by(|a, b| a.key.cmp(&b.key));
            (
                pods,
                snapshot(observed, &stores.stores, &mut kept, [], now).made,
            )
        };

        let (first, made) = pass(&stores);
        assert_eq!(made, Made::Built);
        let [dra, hami] = first.as_slice() else {
            panic!("{first:?}")
        };
        assert_eq!(
            dra.requests.gpus,
            [GpuRequest::devices("nvidia.com/gpu", 2)]
        );
        assert_eq!(hami.devices[0].devices, [1], "seated on GPU-b");

        let (second, made) = pass(&stores);
        assert!(Arc::ptr_eq(&first[0], &second[0]) && Arc::ptr_eq(&first[1], &second[1]));
        assert_eq!(
            made,
            Made::Updated {
                removed: 0,
                added: 0
            }
        );

        stores
            .devices
            .claims
            .apply_watcher_event(&Event::Apply(claim(3)));
        let (third, made) = pass(&stores);
        assert_eq!(
            third[0].requests.gpus,
            [GpuRequest::devices("nvidia.com/gpu", 3)]
        );
        assert!(Arc::ptr_eq(&first[1], &third[1]));
        assert!(matches!(made, Made::Updated { added: 1, .. }), "{made:?}");
    }

    #[test]
    fn the_first_created_holds_a_token_whichever_is_met_first() {
        let with_token = |name: &str, created: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {
                "name": name, "uid": format!("u-{name}"), "creationTimestamp": created,
                "annotations": {"gpuqueue.io/admitted-at-creation": "t-1"}}}))
            .unwrap()
        };
        let original = with_token("a", "2026-12-01T11:59:01Z");
        let copy = with_token("b", "2026-12-01T11:59:02Z");
        for order in [[&copy, &original], [&original, &copy]] {
            let mut tokens = TokenHolders::default();
            for pod in order {
                tokens.note(pod);
                tokens.note(pod); // a pod met again (a new object) is still itself
            }
            assert_eq!(tokens.copied(&original), None);
            assert_eq!(
                tokens.copied(&copy).as_deref(),
                Some("its reservation token t-1 is pod a's, created before it")
            );
            tokens.forget_the_gone(0);
            assert_eq!(tokens.holders.len(), 1, "kept while few");
        }
        // Far more tokens than pods: forgotten, to be noted afresh.
        let mut tokens = TokenHolders::default();
        for i in 0..1100 {
            let pod: Pod = serde_json::from_value(json!({"metadata": {
                "name": format!("p{i}"), "uid": format!("u-{i}"),
                "annotations": {"gpuqueue.io/admitted-at-creation": format!("t-{i}")}}}))
            .unwrap();
            tokens.note(&pod);
        }
        tokens.primed = true;
        tokens.forget_the_gone(10);
        assert!(tokens.holders.is_empty() && !tokens.primed);
    }

    #[test]
    fn a_pass_reads_admissions_the_seal_does_not_vouch_for_as_unadmitted() {
        use crate::{
            admission::at_creation::AtCreation,
            seal::{Admitted, Seal},
        };

        let seal = Seal::new(&[1; 32], "2026-01-01T00:00:00Z".parse().unwrap());
        let admitted_at = "2026-12-01T11:59:00Z";
        // A pod admitted at its creation (token t-1) as the webhook writes it, sealed.
        let pod_json = |name: &str, created: &str, notes: serde_json::Value| {
            json!({
                "metadata": {"name": name, "namespace": "batch", "uid": format!("u-{name}"),
                             "creationTimestamp": created, "annotations": notes},
                "spec": {"nodeName": "n1", "nodeSelector": {"kubernetes.io/hostname": "n1"},
                         "containers": [{"name": "c", "image": "i",
                             "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            })
        };
        let unsigned: Pod =
            serde_json::from_value(pod_json("a", "2026-12-01T11:59:01Z", json!({}))).unwrap();
        let tag = seal.sign(
            &unsigned,
            &Admitted {
                queue: "batch",
                admitted_as: "borrowed",
                admitted_at,
                node_pin: "n1",
                token: Some("t-1"),
            },
        );
        let notes = json!({
            "gpuqueue.io/queue": "batch", "gpuqueue.io/admitted-as": "borrowed",
            "gpuqueue.io/admitted-at": admitted_at, "gpuqueue.io/admitted-at-creation": "t-1",
            "gpuqueue.io/admission-seal": tag,
        });
        let mut stores = stores();
        stores.add_pod(pod_json("a", "2026-12-01T11:59:01Z", notes.clone()));
        // Its annotations copied onto a pod created a second later: the token is a's.
        stores.add_pod(pod_json("b", "2026-12-01T11:59:02Z", notes.clone()));
        // a's token on an unsealed pod created the same second, named to sort first: it does
        // not take the token from a.
        let mut unsealed = notes.clone();
        unsealed
            .as_object_mut()
            .unwrap()
            .remove("gpuqueue.io/admission-seal");
        stores.add_pod(pod_json("0", "2026-12-01T11:59:01Z", unsealed));
        // Written by a tenant, without a seal.
        let mut forged = notes;
        forged
            .as_object_mut()
            .unwrap()
            .remove("gpuqueue.io/admission-seal");
        forged["gpuqueue.io/admitted-at-creation"] = json!("t-2");
        stores.add_pod(pod_json("c", "2026-12-01T11:59:03Z", forged));
        let now: Timestamp = "2026-12-01T12:00:00Z".parse().unwrap();
        let pass = |models: &mut Models, now: Timestamp| {
            let (observed, _) = read(
                &stores.stores,
                &mut Assumed::default(),
                &mut AtCreation::new(false).pass(),
                models,
                now,
            );
            let mut names: Vec<String> = observed
                .pods
                .iter()
                .filter(|p| p.unadmitted)
                .map(|p| p.key.name.clone())
                .collect();
            names.sort();
            (names, observed.unbelieved)
        };
        let unadmitted = |seal: Option<Seal>| {
            let mut models = Models {
                seal,
                ..Models::default()
            };
            pass(&mut models, now)
        };
        // Later passes of the term read the copy as such too, from what the first noted.
        let mut models = Models {
            seal: Some(seal.clone()),
            ..Models::default()
        };
        assert_eq!(pass(&mut models, now).0, ["0", "b", "c"]);
        assert_eq!(pass(&mut models, now).0, ["0", "b", "c"], "b stays a copy");
        let (names, mut unbelieved) = unadmitted(Some(seal));
        assert_eq!(names, ["0", "b", "c"]);
        unbelieved.sort_by(|x, y| x.pod.name.cmp(&y.pod.name));
        let said: Vec<(&str, &str)> = unbelieved
            .iter()
            .map(|u| (u.pod.name.as_str(), u.why.as_str()))
            .collect();
        assert_eq!(
            said,
            [
                ("0", "no admission seal"),
                (
                    "b",
                    "its reservation token t-1 is pod a's, created before it"
                ),
                ("c", "no admission seal"),
            ]
        );
        // Without a key (the term could not load it), every admission is believed.
        assert!(unadmitted(None).0.is_empty());
    }

    #[test]
    fn a_pod_is_converted_again_only_when_the_store_holds_a_new_object() {
        let gpus = |pod: &PodReading| {
            pod.model
                .as_ref()
                .unwrap()
                .as_ref()
                .unwrap()
                .value
                .requests
                .gpus
                .clone()
        };
        let first = Arc::new(pod("batch", Some(1)));
        let convert = |pod: &Pod| read_pod(pod, None);
        let mut models = Conversions::default();
        models.start_pass();
        let read = models.read(&first, &first, convert);
        assert_eq!(read, read_pod(&first, None));
        models.end_pass();

        // The same object: the entry is reused (shown by planting a different one).
        let planted = read_pod(&pod("batch", Some(3)), None);
        models.entries.get_mut(&address(&first)).unwrap().model = planted.clone();
        models.start_pass();
        assert_eq!(gpus(&models.read(&first, &first, convert)), gpus(&planted));
        models.end_pass();

        // A new object for the same pod (the store saw a change): converted again.
        let changed = Arc::new(pod("batch", Some(2)));
        models.start_pass();
        let read = models.read(&changed, &changed, convert);
        assert_eq!(read, read_pod(&changed, None));
        models.end_pass();
        assert_eq!(models.entries.len(), 1);

        // Seen through an assumed admission: the view is read, and the pod's entry is not
        // kept past the pass.
        models.start_pass();
        let view = pod("batch", Some(4));
        assert_eq!(models.read(&changed, &view, convert), read_pod(&view, None));
        models.end_pass();
        assert!(models.entries.is_empty());

        // A pod the pass does not read (deleted) is dropped at its end.
        models.start_pass();
        assert!(models.read(&first, &first, convert).model.is_ok());
        models.end_pass();
        models.start_pass();
        models.end_pass();
        assert!(models.entries.is_empty());
    }

    #[test]
    fn a_node_showing_gpus_only_through_dra_gets_them_from_its_slices() {
        use kube::runtime::watcher::Event;
        let mut stores = stores();
        stores.add_node(json!({
            "metadata": {"name": "dra-node-0", "labels": {"kubernetes.io/hostname": "dra-node-0"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}},
        }));
        let class = serde_json::from_value(json!({"metadata": {"name": "gpu.nvidia.com"},
            "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [{"cel":
                {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}))
        .unwrap();
        stores
            .devices
            .classes
            .apply_watcher_event(&Event::Apply(class));
        let slice = serde_json::from_value(json!({"metadata": {"name": "dra-node-0"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "dra-node-0",
                "pool": {"name": "dra-node-0", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}))
        .unwrap();
        stores
            .devices
            .slices
            .apply_watcher_event(&Event::Apply(slice));
        let observed = Observed::read(
            &stores.stores,
            &[],
            &Assumed::default(),
            &mut Models::default(),
        );
        let node = &observed.nodes[0];
        assert_eq!(node.pools.len(), 1);
        assert_eq!(node.pools[0].resource, "nvidia.com/gpu".into());
        assert_eq!(node.pools[0].devices, 2);
    }

    #[test]
    fn a_pass_charges_extended_resources_through_the_classes_that_back_them() {
        use kube::runtime::watcher::Event;
        let mut stores = stores();
        for class in [
            json!({"metadata": {"name": "gpu.nvidia.com"},
                "spec": {"extendedResourceName": "nvidia.com/gpu"}}),
            json!({"metadata": {"name": "unmapped-gpu"}, "spec": {}}),
        ] {
            let class = serde_json::from_value(class).unwrap();
            stores
                .devices
                .classes
                .apply_watcher_event(&Event::Apply(class));
        }
        let asking = |name: &str, limits: serde_json::Value, gated: bool| {
            let mut pod = serde_json::to_value(pod("batch", None)).unwrap();
            pod["metadata"]["name"] = json!(name);
            pod["spec"]["containers"][0]["resources"] = json!({"limits": limits});
            if gated {
                pod["spec"]["schedulingGates"] = json!([{"name": gpuqueue_api::ADMISSION_GATE}]);
            }
            pod
        };
        let implicit = "deviceclass.resource.kubernetes.io/gpu.nvidia.com";
        // Ungated (the webhook was down): it runs, charged in full and unadmitted.
        stores.add_pod(asking(
            "both",
            json!({"nvidia.com/gpu": "1", implicit: "8"}),
            false,
        ));
        let unmapped = "deviceclass.resource.kubernetes.io/unmapped-gpu";
        stores.add_pod(asking("unmapped", json!({unmapped: "1"}), true));
        stores.add_pod(asking("nic", json!({"example.com/nic": "1"}), false));
        // Gated when a class declared its resource, which none does now: released, not stuck.
        stores.add_pod(asking("undeclared", json!({"example.com/gpu": "2"}), true));
        let observed = Observed::read(
            &stores.stores,
            &stores.stores.pods.state(),
            &Assumed::default(),
            &mut Models::default(),
        );
        assert_eq!(observed.pods.len(), 2, "{:?}", observed.pods);
        let named = |name: &str| {
            observed
                .pods
                .iter()
                .find(|p| p.key.name == name)
                .unwrap_or_else(|| panic!("{name} is not in the model"))
        };
        assert_eq!(
            named("both").requests.gpus,
            vec![model::GpuRequest::devices("nvidia.com/gpu", 9)]
        );
        assert!(named("both").unadmitted);
        assert!(named("undeclared").requests.gpus.is_empty());
        assert!(!named("undeclared").is_admitted());
        assert_eq!(observed.unreadable_pods.len(), 1);
        let (pod, why) = &observed.unreadable_pods[0];
        assert_eq!(pod.metadata.name.as_deref(), Some("unmapped"));
        assert!(
            why.contains("DeviceClass unmapped-gpu may select GPUs"),
            "{why}"
        );
    }

    #[test]
    fn observed_reports_invalid_queues_and_keeps_the_rest() {
        let mut stores = stores();
        stores.add_queue(json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "broken", "generation": 4},
            "spec": {"namespaces": ["x"], "resources": "all of them"},
        }));
        stores.add_pod(serde_json::to_value(pod("batch", Some(1))).unwrap());
        let mut malformed = serde_json::to_value(pod("batch", Some(1))).unwrap();
        malformed["metadata"]["name"] = json!("malformed");
        malformed["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("1.5");
        stores.add_pod(malformed);
        stores.add_node(json!({
            "metadata": {"name": "gpu-node-1", "labels": {"kubernetes.io/hostname": "gpu-node-1"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}},
        }));
        let observed = Observed::read(
            &stores.stores,
            &stores.stores.pods.state(),
            &Assumed::default(),
            &mut Models::default(),
        );
        assert_eq!(observed.nodes.len(), 1);
        assert_eq!(observed.queues.len(), 3);
        assert_eq!(observed.pods.len(), 1);
        assert_eq!(observed.unreadable_pods.len(), 1);
        let (pod, error) = &observed.unreadable_pods[0];
        assert_eq!(pod.metadata.name.as_deref(), Some("malformed"));
        assert!(error.contains("nvidia.com/gpu"), "{error}");
        assert_eq!(observed.invalid_queues.len(), 1);
        let broken = &observed.invalid_queues[0];
        assert_eq!(broken.name, "broken");
        assert_eq!(broken.generation, Some(4));
        assert!(
            broken.error.to_string().contains("spec: cannot be read"),
            "{}",
            broken.error
        );
    }
}
