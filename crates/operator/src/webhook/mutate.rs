//! The mutation: add the scheduling gate `gpuqueue.io/admission` to a pod that a queue manages.
//!
//! Which pods are managed is not decided here: a [`GatePolicy`] answers it from the stores by
//! the core's rules (a GPU request, in a namespace one queue claims). This module only turns
//! the answer into a JSON patch, and is idempotent: a pod that already carries the gate (put
//! there by hand, or by an earlier call) is admitted unchanged, and other gates are kept.
//!
//! A pod created with `spec.nodeName` already set skips the scheduler, and the API server
//! refuses scheduling gates on it, so it is never gated; like any pod that bypassed the gate it
//! is counted as used capacity.

use gpuqueue_api::ADMISSION_GATE;
use k8s_openapi::api::core::v1::Pod;
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
};
use serde_json::json;

use crate::metrics::WebhookResult;

/// Answers, for one pod, which queue manages it (and so whether it gets the gate).
pub trait GatePolicy: Send + Sync + 'static {
    /// The queue that manages `pod`, or `None` when the operator leaves it alone. The pod's
    /// namespace is set, even when the creator left it to the request.
    fn managing_queue(&self, pod: &Pod) -> Option<String>;
}

/// The answer to one admission review: the response body, and what was done for metrics.
#[derive(Debug)]
pub struct Answer {
    pub review: AdmissionReview<DynamicObject>,
    pub result: WebhookResult,
    /// The queue whose gate was added.
    pub queue: Option<String>,
}

/// Why a request body could not be answered at all.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an AdmissionReview of a Pod: {0}")]
    Body(#[from] serde_json::Error),
    #[error("the AdmissionReview carries no request")]
    NoRequest,
}

/// Reads an AdmissionReview and answers it.
pub fn review(body: &[u8], policy: &dyn GatePolicy) -> Result<Answer, ReviewError> {
    let review: AdmissionReview<Pod> = serde_json::from_slice(body)?;
    let request: AdmissionRequest<Pod> = review
        .try_into()
        .map_err(|_: kube::core::admission::ConvertAdmissionReviewError| ReviewError::NoRequest)?;
    Ok(answer(&request, policy))
}

fn answer(request: &AdmissionRequest<Pod>, policy: &dyn GatePolicy) -> Answer {
    let allow = |result| Answer {
        review: AdmissionResponse::from(request).into_review(),
        result,
        queue: None,
    };
    let Some(mut pod) = request.object.clone() else {
        return allow(WebhookResult::NotManaged);
    };
    if request.operation != Operation::Create {
        return allow(WebhookResult::NotManaged);
    }
    // Pods created by controllers carry their namespace only in the request.
    if pod.metadata.namespace.is_none() {
        pod.metadata.namespace.clone_from(&request.namespace);
    }
    let spec = pod.spec.as_ref();
    if spec.is_some_and(|spec| spec.node_name.is_some()) {
        return allow(WebhookResult::NotManaged);
    }
    let gates = spec.and_then(|spec| spec.scheduling_gates.as_deref());
    let Some(queue) = policy.managing_queue(&pod) else {
        return allow(WebhookResult::NotManaged);
    };
    if gates.is_some_and(|gates| gates.iter().any(|gate| gate.name == ADMISSION_GATE)) {
        return allow(WebhookResult::AlreadyGated);
    }
    let operation = match gates {
        Some(_) => json!({
            "op": "add", "path": "/spec/schedulingGates/-", "value": {"name": ADMISSION_GATE},
        }),
        None => json!({
            "op": "add", "path": "/spec/schedulingGates", "value": [{"name": ADMISSION_GATE}],
        }),
    };
    let patched = serde_json::from_value::<json_patch::Patch>(json!([operation]))
        .map_err(|error| error.to_string())
        .and_then(|patch| {
            AdmissionResponse::from(request)
                .with_patch(patch)
                .map_err(|error| error.to_string())
        });
    match patched {
        Ok(response) => Answer {
            review: response.into_review(),
            result: WebhookResult::Gated,
            queue: Some(queue),
        },
        // Unreachable in practice (a fixed, valid patch); never block the pod over it.
        Err(error) => {
            tracing::error!(%error, "building the gate patch failed; pod admitted ungated");
            allow(WebhookResult::Invalid)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Manages GPU pods of namespace `tenant` in queue `tenant-queue`.
    struct TenantPolicy;

    impl GatePolicy for TenantPolicy {
        fn managing_queue(&self, pod: &Pod) -> Option<String> {
            let in_tenant = pod.metadata.namespace.as_deref() == Some("tenant");
            let wants_gpu = pod.spec.as_ref().is_some_and(|spec| {
                spec.containers.iter().any(|container| {
                    container
                        .resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref())
                        .is_some_and(|limits| limits.contains_key("nvidia.com/gpu"))
                })
            });
            (in_tenant && wants_gpu).then(|| "tenant-queue".to_owned())
        }
    }

    fn review_body(operation: &str, namespace: &str, spec: &serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "0b5f1b6e-1111-2222-3333-444455556666",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": namespace,
                "operation": operation,
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"generateName": "vllm-7d9f-"},
                    "spec": spec,
                },
                "dryRun": false,
            }
        }))
        .unwrap()
    }

    fn gpu_spec(gates: Option<serde_json::Value>) -> serde_json::Value {
        let mut spec = json!({
            "containers": [{
                "name": "vllm",
                "image": "vllm/vllm-openai",
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }],
        });
        if let Some(gates) = gates {
            spec["schedulingGates"] = gates;
        }
        spec
    }

    /// The JSON patch of the answer, decoded, or `None` when the pod passes unchanged.
    fn patch_of(answer: &Answer) -> Option<serde_json::Value> {
        let response = serde_json::to_value(&answer.review).unwrap()["response"].clone();
        assert_eq!(
            response["allowed"], true,
            "the webhook never denies: {response}"
        );
        assert_eq!(response["uid"], "0b5f1b6e-1111-2222-3333-444455556666");
        // kube serialises the patch bytes as a JSON array of numbers, which the API server
        // reads like the base64 string Go would write.
        response.get("patch").map(|patch| {
            let bytes: Vec<u8> = serde_json::from_value(patch.clone()).unwrap();
            serde_json::from_slice(&bytes).unwrap()
        })
    }

    #[test]
    fn a_managed_gpu_pod_gets_the_gate() {
        let answer = review(
            &review_body("CREATE", "tenant", &gpu_spec(None)),
            &TenantPolicy,
        )
        .unwrap();
        assert_eq!(answer.result, WebhookResult::Gated);
        assert_eq!(answer.queue.as_deref(), Some("tenant-queue"));
        assert_eq!(
            patch_of(&answer).unwrap(),
            json!([{"op": "add", "path": "/spec/schedulingGates",
                    "value": [{"name": "gpuqueue.io/admission"}]}])
        );
    }

    #[test]
    fn other_gates_are_kept_and_ours_appended() {
        let spec = gpu_spec(Some(json!([{"name": "example.com/other"}])));
        let answer = review(&review_body("CREATE", "tenant", &spec), &TenantPolicy).unwrap();
        assert_eq!(
            patch_of(&answer).unwrap(),
            json!([{"op": "add", "path": "/spec/schedulingGates/-",
                    "value": {"name": "gpuqueue.io/admission"}}])
        );
    }

    #[test]
    fn a_pod_gated_by_hand_passes_unchanged() {
        let spec = gpu_spec(Some(json!([{"name": "gpuqueue.io/admission"}])));
        let answer = review(&review_body("CREATE", "tenant", &spec), &TenantPolicy).unwrap();
        assert_eq!(answer.result, WebhookResult::AlreadyGated);
        assert_eq!(patch_of(&answer), None);
    }

    #[test]
    fn pods_the_operator_does_not_manage_pass_unchanged() {
        let cpu_only = json!({"containers": [{"name": "web", "image": "nginx"}]});
        for body in [
            review_body("CREATE", "other", &gpu_spec(None)),
            review_body("CREATE", "tenant", &cpu_only),
        ] {
            let answer = review(&body, &TenantPolicy).unwrap();
            assert_eq!(answer.result, WebhookResult::NotManaged);
            assert_eq!(patch_of(&answer), None);
        }
    }

    #[test]
    fn a_pod_bound_at_creation_is_never_gated() {
        let mut spec = gpu_spec(None);
        spec["nodeName"] = json!("gpu-node-1");
        let answer = review(&review_body("CREATE", "tenant", &spec), &TenantPolicy).unwrap();
        assert_eq!(answer.result, WebhookResult::NotManaged);
        assert_eq!(patch_of(&answer), None);
    }

    #[test]
    fn only_creations_are_mutated() {
        let answer = review(
            &review_body("UPDATE", "tenant", &gpu_spec(None)),
            &TenantPolicy,
        )
        .unwrap();
        assert_eq!(answer.result, WebhookResult::NotManaged);
        assert_eq!(patch_of(&answer), None);
    }

    #[test]
    fn a_body_that_is_not_a_review_is_an_error() {
        let no_request = br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#;
        assert!(matches!(
            review(no_request, &TenantPolicy),
            Err(ReviewError::NoRequest)
        ));
        assert!(matches!(
            review(b"not json", &TenantPolicy),
            Err(ReviewError::Body(_))
        ));
    }
}
