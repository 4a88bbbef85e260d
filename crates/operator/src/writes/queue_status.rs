//! Writing GpuQueue status: server-side apply through the status subresource, under the one
//! field manager [`FIELD_MANAGER`], forcing ownership of the status fields (Kubernetes asks
//! controllers to force on the objects they own). The body carries only `status`, so the
//! operator never becomes a manager of any spec or metadata field: a GitOps tool applying the
//! spec sees no conflict and no drift, and nothing it applies is reverted.
//!
//! A status is written only when it differs from the one the store shows, so a quiet cluster
//! causes no writes.
//!
//! `lastHandovers` is left out of this body: the reclaim executor writes it on its own (a merge
//! patch with a `resourceVersion` precondition, see `reclaim::record`), and an apply built from
//! the store could otherwise write back a list read before a handover finished.

use gpuqueue_api::{
    FIELD_MANAGER,
    v1alpha1::{GpuQueue, GpuQueueStatus},
};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

/// Why a status was not written.
#[derive(Debug, thiserror::Error)]
#[error("writing the status of GpuQueue {queue}: {source}")]
pub struct StatusError {
    pub queue: String,
    #[source]
    pub source: kube::Error,
}

impl StatusError {
    /// The error's kind, as metrics label it (snake case).
    pub fn category(&self) -> &'static str {
        "queue_status_api"
    }
}

/// The server-side apply body for a queue's status: identity and status (less
/// `lastHandovers`, which the reclaim executor owns), nothing else.
pub fn status_body(queue: &str, status: &GpuQueueStatus) -> serde_json::Value {
    let mut status = json!(status);
    if let Some(fields) = status.as_object_mut() {
        fields.remove("lastHandovers");
        fields.remove("reclaimsInFlight");
    }
    json!({
        "apiVersion": "gpuqueue.io/v1alpha1",
        "kind": "GpuQueue",
        "metadata": {"name": queue},
        "status": status,
    })
}

/// Whether `desired` differs from what `current` shows. A queue that has no status yet always
/// gets one.
pub fn needs_write(current: Option<&GpuQueueStatus>, desired: &GpuQueueStatus) -> bool {
    current != Some(desired)
}

/// Applies `status` to queue `queue`.
pub async fn write(
    api: &Api<GpuQueue>,
    queue: &str,
    status: &GpuQueueStatus,
) -> Result<(), StatusError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(queue, &params, &Patch::Apply(status_body(queue, status)))
        .await
        .map(drop)
        .map_err(|source| StatusError {
            queue: queue.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use gpuqueue_api::v1alpha1::ResourceStatus;

    use super::*;
    use crate::mock_api;

    fn status() -> GpuQueueStatus {
        GpuQueueStatus {
            observed_generation: Some(3),
            resources: vec![ResourceStatus {
                name: "nvidia.com/gpu".into(),
                guaranteed: 8,
                ceiling: 24,
                allocated: 12,
                borrowed: 4,
                lent: 0,
                pending: 2,
            }],
            admitted_pods: 12,
            pending_pods: 2,
            ..GpuQueueStatus::default()
        }
    }

    #[test]
    fn the_body_carries_status_and_nothing_of_spec() {
        let body = status_body("batch", &status());
        assert_eq!(body["metadata"], json!({"name": "batch"}));
        assert!(body.get("spec").is_none());
        assert_eq!(body["status"]["observedGeneration"], 3);
        assert_eq!(body["status"]["resources"][0]["borrowed"], 4);
        assert!(
            body["status"].get("lastHandovers").is_none(),
            "the reclaim executor's field"
        );
    }

    #[test]
    fn an_unchanged_status_is_not_written() {
        assert!(!needs_write(Some(&status()), &status()));
        let mut changed = status();
        changed.pending_pods = 3;
        assert!(needs_write(Some(&status()), &changed));
        assert!(needs_write(None, &status()));
    }

    #[tokio::test]
    async fn the_status_is_applied_through_the_status_subresource_with_our_field_manager() {
        let queue = json!({"apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "batch"},
            "spec": {"namespaces": ["batch"], "resources": [{"name": "nvidia.com/gpu", "guaranteed": 8}]}});
        let (client, log) = mock_api::serve(move |_| (200, queue.clone()));
        let api: Api<GpuQueue> = Api::all(client);
        write(&api, "batch", &status()).await.unwrap();
        let seen = crate::sync::lock(&log);
        let [request] = seen.as_slice() else {
            panic!("one request: {seen:?}")
        };
        assert_eq!(request.method, "PATCH");
        assert_eq!(
            request.path,
            "/apis/gpuqueue.io/v1alpha1/gpuqueues/batch/status"
        );
        let query = &request.query;
        assert!(query.contains("fieldManager=gpuqueue-operator"), "{query}");
        assert!(query.contains("force=true"), "{query}");
        assert_eq!(request.content_type, "application/apply-patch+yaml");
        let body = &request.body;
        assert_eq!(body["status"]["observedGeneration"], 3, "{body}");
        assert!(body.get("spec").is_none());
    }
}
