//! Writes to ResourceClaims: adding or removing the operator's finalizer
//! [`CHARGED_FINALIZER`], one JSON patch each (see `gpuqueue_core::model::dra` for why).
//!
//! ```text
//! add:    test /metadata/uid = <uid seen>, test /metadata/resourceVersion = <seen>,
//!         add  /metadata/finalizers/- (or the whole list when there is none)
//! remove: test /metadata/uid = <uid seen>, test /metadata/finalizers/<i> = gpuqueue.io/charged,
//!         remove /metadata/finalizers/<i>
//! ```
//!
//! The resource version is tested on the add because a list written whole would drop a
//! finalizer added meanwhile (kube-scheduler's, when it allocates a shared claim).

use gpuqueue_core::model::dra::{CHARGED_FINALIZER, MarkChange};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

/// Why a claim's finalizer was not written.
#[derive(Debug, thiserror::Error)]
pub enum ClaimWriteError {
    /// It changed or went meanwhile (a failed test, a conflict, a 404, or a claim being
    /// deleted, which takes no new finalizer): decided again from the store.
    #[error("claim {claim} changed before the write; decided again on the next pass")]
    Changed { claim: String },
    #[error("writing claim {claim}: {source}")]
    Api { claim: String, source: kube::Error },
    #[error("building the patch for claim {claim}: {source}")]
    Encode {
        claim: String,
        source: serde_json::Error,
    },
}

/// The JSON patch that makes `change` to `claim` as the store shows it.
pub fn mark_patch(
    claim: &ResourceClaim,
    change: MarkChange,
) -> Result<json_patch::Patch, serde_json::Error> {
    let uid = json!({"op": "test", "path": "/metadata/uid", "value": claim.metadata.uid});
    let operations = match change {
        MarkChange::Add => {
            let version = json!({"op": "test", "path": "/metadata/resourceVersion",
                "value": claim.metadata.resource_version});
            let add = if claim
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
            {
                json!({"op": "add", "path": "/metadata/finalizers/-", "value": CHARGED_FINALIZER})
            } else {
                json!({"op": "add", "path": "/metadata/finalizers", "value": [CHARGED_FINALIZER]})
            };
            vec![uid, version, add]
        }
        MarkChange::Remove(index) => {
            let path = format!("/metadata/finalizers/{index}");
            vec![
                uid,
                json!({"op": "test", "path": path, "value": CHARGED_FINALIZER}),
                json!({"op": "remove", "path": path}),
            ]
        }
    };
    serde_json::from_value(Value::Array(operations))
}

/// Sends [`mark_patch`] for `claim`.
pub async fn write_mark(
    api: &Api<ResourceClaim>,
    claim: &ResourceClaim,
    change: MarkChange,
) -> Result<(), ClaimWriteError> {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let described = format!(
        "{}/{name}",
        claim.metadata.namespace.as_deref().unwrap_or_default()
    );
    let patch = mark_patch(claim, change).map_err(|source| ClaimWriteError::Encode {
        claim: described.clone(),
        source,
    })?;
    let patch = Patch::Json::<()>(patch);
    match api.patch(name, &PatchParams::default(), &patch).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409 | 422) => {
            Err(ClaimWriteError::Changed { claim: described })
        }
        Err(source) => Err(ClaimWriteError::Api {
            claim: described,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(finalizers: Option<&[&str]>) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "t", "uid": "u1", "resourceVersion": "7",
                "finalizers": finalizers},
            "spec": {"devices": {}},
        }))
        .unwrap()
    }

    fn applied(claim: &ResourceClaim, change: MarkChange) -> Option<Vec<String>> {
        let mut document = serde_json::to_value(claim).unwrap();
        json_patch::patch(&mut document, &mark_patch(claim, change).unwrap()).unwrap();
        serde_json::from_value::<ResourceClaim>(document)
            .unwrap()
            .metadata
            .finalizers
    }

    #[test]
    fn the_mark_is_added_beside_other_finalizers_and_removed_alone() {
        assert_eq!(
            applied(&claim(None), MarkChange::Add),
            Some(vec![CHARGED_FINALIZER.to_owned()])
        );
        let with_other = claim(Some(&["resource.kubernetes.io/delete-protection"]));
        let added = applied(&with_other, MarkChange::Add).unwrap();
        assert_eq!(
            added,
            [
                "resource.kubernetes.io/delete-protection",
                CHARGED_FINALIZER
            ]
        );
        let marked = claim(Some(&["x", CHARGED_FINALIZER, "y"]));
        assert_eq!(
            applied(&marked, MarkChange::Remove(1)),
            Some(vec!["x".to_owned(), "y".to_owned()])
        );
        // Another claim under the name, or another finalizer at the index: nothing applies.
        let mut document = serde_json::to_value(claim(Some(&["x", "y"]))).unwrap();
        let patch = mark_patch(&marked, MarkChange::Remove(0)).unwrap();
        assert!(json_patch::patch(&mut document, &patch).is_err());
    }
}
