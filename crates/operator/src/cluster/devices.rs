//! The DRA objects quota reads, in reflector stores beside the others: ResourceClaims (what a
//! pod's `spec.resourceClaims` charge), DeviceClasses (which quota resource each class is
//! charged as) and ResourceSlices (the devices DRA drivers publish per node). The watches are
//! [`super::stores`]'s; every change is urgent: a claim kube-controller-manager generates for a
//! gated pod is what lets it be counted.
//!
//! ResourceClaimTemplates are not watched: a template's claim is counted only once generated
//! (see `gpuqueue_core::model::dra`).

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::runtime::reflector::{self, Store};

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
