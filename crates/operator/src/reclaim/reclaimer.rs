//! The executor's handle: what every handover needs from the operator (a client that never
//! retries by itself, the checkpoint client, the stores, metrics and events), and the pod reads
//! and writes the steps of a handover share.

use std::sync::Arc;

use gpuqueue_api::FIELD_MANAGER;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
    runtime::reflector::ObjectRef,
};

use super::{
    evict,
    handover::{Handover, HandoverPod},
    intent,
    metrics::ReclaimMetrics,
    planned::PlannedBudgets,
    recheck::Rechecks,
    record::RecordWriter,
    terminations::ObservedTerminations,
    timeline::Phase,
};
use crate::{
    checkpoint::CheckpointClient,
    cluster::stores::Stores,
    seal::Seals,
    writes::{
        events::Events,
        pod::{self as patch, PatchError},
    },
};

/// What handovers need from the operator; cheap to clone, shared by the loop and the tasks.
#[derive(Clone)]
pub struct Reclaimer {
    /// A client that never retries by itself (see the module documentation of [`super`]).
    pub(super) client: Client,
    pub(super) checkpoints: CheckpointClient,
    pub(super) stores: Stores,
    pub(super) metrics: ReclaimMetrics,
    pub(super) events: Events,
    /// Victim terminations observed per node, kept across passes and terms.
    pub(super) terminations: ObservedTerminations,
    /// Handovers in flight planned beyond their budget, for the queues' condition.
    pub(super) budgets: PlannedBudgets,
    /// The queues' handover records, written a batch per queue at a time.
    pub(super) records: RecordWriter,
    /// Whether a victim's queue still borrows it, as the passes find just before its eviction.
    pub(super) rechecks: Rechecks,
    /// The seal a reserved owner's admission carries ([`crate::seal`]).
    pub(super) seals: Seals,
    crash: Option<super::crash::CrashPoint>,
}

impl std::fmt::Debug for Reclaimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reclaimer")
            .field("crash", &self.crash)
            .finish_non_exhaustive()
    }
}

impl Reclaimer {
    /// The client that never retries by itself, for evictions outside a handover (the
    /// admission loop's enforcement of quotas on unadmitted pods).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// `client` must be built with `Config::default_retry` off.
    pub fn new(
        client: Client,
        checkpoints: CheckpointClient,
        stores: Stores,
        metrics: ReclaimMetrics,
        events: Events,
        seals: Seals,
        crash: Option<super::crash::CrashPoint>,
    ) -> Self {
        if let Some(point) = crash {
            tracing::warn!(
                ?point,
                "{} is set: this process exits in the middle of a handover (a test hook)",
                super::crash::ENV
            );
        }
        Self {
            client,
            checkpoints,
            stores,
            metrics,
            events,
            terminations: ObservedTerminations::default(),
            budgets: PlannedBudgets::default(),
            records: RecordWriter::default(),
            rechecks: Rechecks::default(),
            seals,
            crash,
        }
    }

    /// A reclaimer on `client` and `stores`, for tests; its events go nowhere.
    #[cfg(test)]
    pub(crate) fn for_tests(client: Client, stores: Stores) -> Self {
        let mut registry = crate::metrics::registry();
        let (events, _publisher) = Events::new(client.clone(), "test");
        Self::new(
            client,
            CheckpointClient::new().unwrap(),
            stores,
            ReclaimMetrics::register(&mut registry),
            events,
            Seals::default(),
            None,
        )
    }

    /// What the admission passes publish for the evictions to ask ([`super::recheck`]).
    pub fn rechecks(&self) -> &Rechecks {
        &self.rechecks
    }

    /// Exits the process if the test hook asks to crash after `phase` (see `super::crash`).
    pub(super) fn crash_after(&self, phase: Phase, reclaim: &str) {
        super::crash::check(self.crash, super::crash::CrashPoint::After(phase), reclaim);
    }

    /// Exits the process if the test hook asks to crash once a handover's records are written.
    pub(super) fn crash_after_records(&self, reclaim: &str) {
        super::crash::check(self.crash, super::crash::CrashPoint::Recorded, reclaim);
    }

    /// `Some(pod)` if the store holds the target (same uid).
    pub(super) fn stored(&self, target: &HandoverPod) -> Option<Arc<Pod>> {
        self.stores
            .pods
            .get(&ObjectRef::new(&target.key.name).within(&target.key.namespace))
            .filter(|pod| pod.metadata.uid.as_deref() == Some(target.uid.as_str()))
    }

    /// Whether a ResourceClaim is still reserved for one of the handover's victims: its
    /// devices are not free until kube-controller-manager releases it.
    pub(super) fn victims_hold_claims(&self, handover: &Handover) -> bool {
        self.stores.devices.claims.state().iter().any(|claim| {
            claim
                .status
                .as_ref()
                .and_then(|status| status.reserved_for.as_ref())
                .is_some_and(|users| {
                    users.iter().any(|user| {
                        handover
                            .victims
                            .iter()
                            .any(|victim| victim.target.uid == user.uid)
                    })
                })
        })
    }

    /// Whether the target still holds its room: the store has it (same uid). The pod watch
    /// leaves out finished pods ([`crate::cluster::stores`]), so a victim whose containers
    /// have ended (phase `Succeeded` or `Failed`: kube-scheduler and the kubelet's device manager
    /// free its GPUs then) leaves the store at once, though its object may stay a while (the
    /// kubelet deletes it 50-750 ms later, a finalizer longer).
    pub(super) fn holds_its_room(&self, target: &HandoverPod) -> bool {
        self.stored(target).is_some()
    }

    pub(super) fn params() -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        }
    }

    /// Applies a JSON patch to `pod`; the pod as the API server returned it.
    pub(super) async fn patch_pod(
        &self,
        pod: &Pod,
        patch: json_patch::Patch,
    ) -> Result<Pod, PatchError> {
        self.json_patch(pod, None, patch).await
    }

    /// Applies a JSON patch to `pod` through the `pods/status` endpoint, which writes its
    /// status and metadata (but for owner references); the pod as the API server returned it.
    pub(super) async fn patch_pod_status(
        &self,
        pod: &Pod,
        patch: json_patch::Patch,
    ) -> Result<Pod, PatchError> {
        self.json_patch(pod, Some("status"), patch).await
    }

    /// Removes reclaim `id`'s intent from `pod`, and the `DisruptionTarget` mark written with
    /// it when `marked`: the pod is not evicted after all. Both go in one `pods/status` write,
    /// as they were written; refused there (a policy on `pods/status`), the intent goes alone.
    pub(super) async fn take_back_intent(
        &self,
        pod: &Pod,
        id: &str,
        marked: bool,
    ) -> Result<(), PatchError> {
        if marked {
            let patch = intent::clear_with_disruption_patch(pod, id, evict::DISRUPTION_REASON)?;
            match self.patch_pod_status(pod, patch).await {
                Err(PatchError::Refused { .. }) => {}
                result => return result.map(drop),
            }
        }
        let patch = intent::clear_patch(pod, id)?;
        self.patch_pod(pod, patch).await.map(drop)
    }

    async fn json_patch(
        &self,
        pod: &Pod,
        subresource: Option<&str>,
        patch: json_patch::Patch,
    ) -> Result<Pod, PatchError> {
        let api: Api<Pod> = Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let patch = Patch::Json::<()>(patch);
        let written = match subresource {
            Some(subresource) => {
                api.patch_subresource(subresource, name, &Self::params(), &patch)
                    .await
            }
            None => api.patch(name, &Self::params(), &patch).await,
        };
        written.map_err(|source| patch::classify(pod, source))
    }

    /// The GpuQueue API, through the client that never retries by itself.
    pub(super) fn queues(&self) -> Api<gpuqueue_api::v1alpha1::GpuQueue> {
        Api::all(self.client.clone())
    }

    pub(super) fn queue_ref(&self, name: &str) -> Option<ObjectReference> {
        let stored = self.stores.queues.get(&ObjectRef::new(name))?;
        stored.0.as_ref().ok().map(|queue| queue.object_ref(&()))
    }
}
