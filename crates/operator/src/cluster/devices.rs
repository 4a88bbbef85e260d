//! The DRA objects quota reads, in reflector stores beside the others: ResourceClaims (what a
//! pod's `spec.resourceClaims` charge), DeviceClasses (which quota resource each class is
//! charged as) and ResourceSlices (the devices DRA drivers publish per node). Every change is
//! urgent: a claim kube-controller-manager generates for a gated pod is what lets it be counted.
//!
//! ResourceClaimTemplates are not watched: a template's claim is counted only once generated
//! (see `gpuqueue_core::model::dra`).

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::{
    Api, Client,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};

use super::{
    metrics::WatchMetrics,
    stores::{Signals, Task, reflect, strip_metadata},
};

/// Readers of the DRA stores.
#[derive(Clone)]
pub struct DeviceStores {
    pub claims: Store<ResourceClaim>,
    pub classes: Store<DeviceClass>,
    pub slices: Store<ResourceSlice>,
}

impl std::fmt::Debug for DeviceStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStores")
            .field("claims", &self.claims.len())
            .field("classes", &self.classes.len())
            .field("slices", &self.slices.len())
            .finish()
    }
}

impl DeviceStores {
    /// The stores and the watches that fill them, bumping `signals` after every change.
    pub(super) fn new(
        client: &Client,
        signals: &Signals,
        metrics: &WatchMetrics,
    ) -> (Self, [Task; 3]) {
        let (claims, claim_writer) = reflector::store();
        let (classes, class_writer) = reflector::store();
        let (slices, slice_writer) = reflector::store();
        let tasks = [
            reflect(
                "resourceclaims",
                claim_writer,
                events::<ResourceClaim>(client),
                (signals.clone(), |_: &_| true),
                metrics,
                || {},
            ),
            reflect(
                "deviceclasses",
                class_writer,
                events::<DeviceClass>(client),
                (signals.clone(), |_: &_| true),
                metrics,
                || {},
            ),
            reflect(
                "resourceslices",
                slice_writer,
                events::<ResourceSlice>(client),
                (signals.clone(), |_: &_| true),
                metrics,
                || {},
            ),
        ];
        (
            Self {
                claims,
                classes,
                slices,
            },
            tasks,
        )
    }

    /// Resolves once every DRA store holds its initial list.
    pub(super) async fn synced(&self) -> Result<(), reflector::store::WriterDropped> {
        self.claims.wait_until_ready().await?;
        self.classes.wait_until_ready().await?;
        self.slices.wait_until_ready().await?;
        Ok(())
    }

    /// Stores with their writers, filled by hand in tests.
    #[cfg(test)]
    pub(crate) fn for_tests() -> (Self, DeviceWriters) {
        let (claims, claim_writer) = reflector::store();
        let (classes, class_writer) = reflector::store();
        let (slices, slice_writer) = reflector::store();
        let writers = DeviceWriters {
            claims: claim_writer,
            classes: class_writer,
            slices: slice_writer,
        };
        (
            Self {
                claims,
                classes,
                slices,
            },
            writers,
        )
    }
}

/// The writers of [`DeviceStores::for_tests`].
#[cfg(test)]
pub(crate) struct DeviceWriters {
    pub claims: reflector::store::Writer<ResourceClaim>,
    pub classes: reflector::store::Writer<DeviceClass>,
    pub slices: reflector::store::Writer<ResourceSlice>,
}

/// The watch of every object of one DRA kind, in every namespace.
fn events<K>(
    client: &Client,
) -> impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(strip_metadata)
}
