//! The mutation: add the scheduling gate `gpuqueue.io/admission` to a pod that a queue manages,
//! or, when the leader can admit it at once ([`crate::admission::at_creation`]), pin it to its node and
//! annotate it as admitted instead, so it never waits at the gate.
//!
//! Which pods are managed is not decided here: a [`GatePolicy`] answers it from the stores by
//! the core's rules (a GPU request, in a namespace one queue claims). This module only turns
//! the answer into a JSON patch, and is idempotent: a pod that already carries the gate (put
//! there by hand, or by an earlier call) is admitted unchanged, and other gates are kept.
//!
//! A pod created with `spec.nodeName` already set skips the scheduler, and the API server
//! refuses scheduling gates on it, so it is never gated; like any pod that bypassed the gate it
//! is counted as used capacity.

use std::collections::BTreeMap;

use gpuqueue_api::{ADMISSION_GATE, annotations};
use gpuqueue_core::model::is_gated;
use k8s_openapi::api::core::v1::Pod;
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
};
use serde_json::json;

use super::metrics::WebhookResult;
use crate::{
    admission::at_creation::{CreationAdmission, Gate},
    writes::pod::pin_and_annotate,
};

/// Answers, for one pod, which queue manages it (and so whether it gets the gate).
pub trait GatePolicy: Send + Sync + 'static {
    /// The queue that manages `pod`, or `None` when the operator leaves it alone. The pod's
    /// namespace is set, even when the creator left it to the request.
    fn managing_queue(&self, pod: &Pod) -> Option<String>;

    /// Admits a managed pod at its creation instead of gating it, when the leader can decide
    /// it at once; `Err` sends it to the gate, saying why.
    fn admit_at_creation(&self, _pod: &Pod) -> Result<CreationAdmission, Gate> {
        Err(Gate::Declined)
    }

    /// The webhook gave up waiting for a busy admission pass and gated a pod.
    fn gated_busy(&self) {}
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
    if is_gated(&pod) {
        return allow(WebhookResult::AlreadyGated);
    }
    // A dry run creates nothing, so it must reserve nothing: it sees the gate.
    let at_creation = if request.dry_run {
        Err(Gate::Declined)
    } else {
        policy.admit_at_creation(&pod)
    };
    let (operations, result) = match at_creation {
        Ok(admitted) => (
            admission_operations(&pod, &admitted),
            WebhookResult::Admitted,
        ),
        Err(Gate::Declined) => (vec![gate_operation(gates.is_some())], WebhookResult::Gated),
        Err(Gate::Busy) => (vec![gate_operation(gates.is_some())], WebhookResult::Busy),
    };
    let patched = serde_json::from_value::<json_patch::Patch>(serde_json::Value::Array(operations))
        .map_err(|error| error.to_string())
        .and_then(|patch| {
            AdmissionResponse::from(request)
                .with_patch(patch)
                .map_err(|error| error.to_string())
        });
    match patched {
        Ok(response) => Answer {
            review: response.into_review(),
            result,
            queue: Some(queue),
        },
        // Unreachable in practice (a fixed, valid patch); never block the pod over it.
        Err(error) => {
            tracing::error!(%error, "building the patch failed; pod admitted ungated");
            allow(WebhookResult::Invalid)
        }
    }
}

/// Adds our gate, after any others.
fn gate_operation(has_gates: bool) -> serde_json::Value {
    if has_gates {
        json!({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": ADMISSION_GATE}})
    } else {
        json!({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": ADMISSION_GATE}]})
    }
}

/// Pins the pod to its node and records the admission, as releasing the gate would have, with
/// the token of its reservation.
fn admission_operations(pod: &Pod, admitted: &CreationAdmission) -> Vec<serde_json::Value> {
    let notes = BTreeMap::from([
        (annotations::QUEUE, admitted.queue.clone()),
        (
            annotations::ADMITTED_AS,
            admitted.admitted_as.as_str().to_owned(),
        ),
        (annotations::ADMITTED_AT, admitted.at.to_string()),
        (annotations::ADMITTED_AT_CREATION, admitted.token.clone()),
    ]);
    pin_and_annotate(pod, &admitted.node_pin, notes)
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

    /// Like [`TenantPolicy`], but the leader admits every managed pod at creation.
    struct AdmittingPolicy;

    impl GatePolicy for AdmittingPolicy {
        fn managing_queue(&self, pod: &Pod) -> Option<String> {
            TenantPolicy.managing_queue(pod)
        }

        fn admit_at_creation(&self, _pod: &Pod) -> Result<CreationAdmission, Gate> {
            Ok(CreationAdmission {
                queue: "tenant-queue".into(),
                node_pin: "gpu-node-3".into(),
                admitted_as: gpuqueue_core::model::AdmittedAs::Borrowed,
                at: "2026-11-29T12:00:00Z".parse().unwrap(),
                token: "00ff".into(),
            })
        }
    }

    #[test]
    fn a_pod_admitted_at_creation_is_pinned_and_annotated_not_gated() {
        let answer = review(
            &review_body("CREATE", "tenant", &gpu_spec(None)),
            &AdmittingPolicy,
        )
        .unwrap();
        assert_eq!(answer.result, WebhookResult::Admitted);
        assert_eq!(
            patch_of(&answer).unwrap(),
            json!([
                {"op": "add", "path": "/spec/nodeSelector",
                 "value": {"kubernetes.io/hostname": "gpu-node-3"}},
                {"op": "add", "path": "/metadata/annotations", "value": {
                    "gpuqueue.io/queue": "tenant-queue",
                    "gpuqueue.io/admitted-as": "borrowed",
                    "gpuqueue.io/admitted-at": "2026-11-29T12:00:00Z",
                    "gpuqueue.io/admitted-at-creation": "00ff",
                }},
            ])
        );
    }

    #[test]
    fn admission_at_creation_keeps_the_pods_own_selector_and_annotations() {
        let mut spec = gpu_spec(None);
        spec["nodeSelector"] = json!({"nvidia.com/gpu.product": "H100"});
        let mut body: serde_json::Value =
            serde_json::from_slice(&review_body("CREATE", "tenant", &spec)).unwrap();
        body["request"]["object"]["metadata"]["annotations"] = json!({"team": "search"});
        let answer = review(&serde_json::to_vec(&body).unwrap(), &AdmittingPolicy).unwrap();
        let patch = patch_of(&answer).unwrap();
        assert_eq!(
            patch[0],
            json!({"op": "add", "path": "/spec/nodeSelector/kubernetes.io~1hostname",
                   "value": "gpu-node-3"})
        );
        assert!(
            patch.as_array().unwrap().contains(
                &json!({"op": "add", "path": "/metadata/annotations/gpuqueue.io~1admitted-at-creation",
                        "value": "00ff"})
            ),
            "{patch}"
        );
        assert_eq!(patch.as_array().unwrap().len(), 5);
    }

    #[test]
    fn a_dry_run_is_never_admitted_at_creation() {
        let mut body: serde_json::Value =
            serde_json::from_slice(&review_body("CREATE", "tenant", &gpu_spec(None))).unwrap();
        body["request"]["dryRun"] = json!(true);
        let answer = review(&serde_json::to_vec(&body).unwrap(), &AdmittingPolicy).unwrap();
        assert_eq!(answer.result, WebhookResult::Gated);
    }

    #[test]
    fn a_pod_gated_by_hand_is_never_admitted_at_creation() {
        let spec = gpu_spec(Some(json!([{"name": "gpuqueue.io/admission"}])));
        let answer = review(&review_body("CREATE", "tenant", &spec), &AdmittingPolicy).unwrap();
        assert_eq!(answer.result, WebhookResult::AlreadyGated);
        assert_eq!(patch_of(&answer), None);
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
