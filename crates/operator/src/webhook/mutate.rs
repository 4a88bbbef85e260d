//! The mutation: add the scheduling gate `gpuqueue.io/admission` to a pod that a queue manages,
//! or, when the leader can admit it at once ([`crate::admission::at_creation`]), pin it to its node and
//! annotate it as admitted instead, so it never waits at the gate.
//!
//! Which pods are managed is not decided here: a [`GatePolicy`] answers it from the stores by
//! the core's rules (a GPU request, in a namespace one queue claims). This module only turns
//! the answer into a JSON patch, and is idempotent: a pod that already carries the gate (put
//! there by hand, or by an earlier call) keeps it and is not admitted, and other gates are kept.
//!
//! A managed pod is also made tenant-proof, whatever else happens to it: every `gpuqueue.io/*`
//! annotation its creator wrote is removed (the operator's state is the operator's to write;
//! only [`USER_KNOBS`] stay, capped).
//!
//! Its `spec.preemptionPolicy` is left as its PriorityClass sets it: the API server's Priority
//! admission plugin runs again after a webhook mutates a pod and refuses any other value ("the
//! string value of PreemptionPolicy (Never) must not be provided in pod spec"). A high
//! PriorityClass gets a pod nowhere anyway: it cannot leave the gate (the policy in
//! `config/policy/` refuses its removal) and is released pinned to a node with room.
//!
//! A GPU pod created with `spec.nodeName` is refused in a claimed namespace: it skips the
//! scheduler and the gate, so the queue could not count it. The ValidatingAdmissionPolicy in
//! `config/policy/` refuses it with the same message while the webhook is down.
//!
//! A pod with `spec.resourceClaims` (DRA devices) is always gated, never admitted at creation:
//! what its claims charge is read from the claim objects by the admission pass, and a
//! template's claim does not exist yet when the pod is created. So is a pod asking for devices
//! by a DeviceClass's extended-resource name (`deviceclass.resource.kubernetes.io/<class>`, or
//! the class's `spec.extendedResourceName`): what that charges, the class store says. The
//! policy refuses such a pod without the gate (so while the webhook is down), for claims and
//! implicit names; a declared name it cannot tell from a device plugin's.

use std::collections::BTreeMap;

use gpuqueue_api::{
    ADMISSION_GATE,
    annotations::{self, CHECKPOINT_COST_MAX},
};
use gpuqueue_core::model::{is_gated, is_gpu_pod, uses_resource_claims};
use k8s_openapi::api::core::v1::Pod;
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
};
use serde_json::json;

use super::metrics::WebhookResult;
use crate::{
    admission::at_creation::{CreationAdmission, Gate},
    writes::pod::{escape, pin_and_annotate},
};

/// The prefix of every annotation the operator writes and reads.
const OPERATOR_PREFIX: &str = "gpuqueue.io/";

/// The `gpuqueue.io/*` annotations a pod's creator may write: documented knobs, kept at
/// creation (capped) while every other `gpuqueue.io/*` annotation is removed.
pub const USER_KNOBS: &[&str] = &[annotations::CHECKPOINT_COST];

/// Answers, for one pod, which queue manages it (and so whether it gets the gate).
pub trait GatePolicy: Send + Sync + 'static {
    /// The queue that manages `pod`, or `None` when the operator leaves it alone. The pod's
    /// namespace is set, even when the creator left it to the request.
    fn managing_queue(&self, pod: &Pod) -> Option<String>;

    /// The queue that claims `pod`'s namespace, GPU pod or not (to refuse what it could not
    /// count). The default, [`Self::managing_queue`], suffices for a policy that only ever
    /// sees GPU pods.
    fn claiming_queue(&self, pod: &Pod) -> Option<String> {
        self.managing_queue(pod)
    }

    /// Admits a managed pod at its creation instead of gating it, when the leader can decide
    /// it at once; `Err` sends it to the gate, saying why.
    fn admit_at_creation(&self, _pod: &Pod) -> Result<CreationAdmission, Gate> {
        Err(Gate::Declined)
    }

    /// The webhook gated a managed pod that [`Self::admit_at_creation`] did not decide: it
    /// gave up waiting for a busy admission pass, or the pod is never admitted at creation.
    fn gated_undecided(&self) {}

    /// Whether what managed `pod` takes is read from DRA objects by the admission pass (its
    /// claims, or the classes backing its extended resources): it is never admitted at its
    /// creation. The default sees claims only.
    fn through_dra(&self, pod: &Pod) -> bool {
        pod.spec.as_ref().is_some_and(uses_resource_claims)
    }
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

/// Reads an AdmissionReview's request.
pub fn read(body: &[u8]) -> Result<AdmissionRequest<Pod>, ReviewError> {
    let review: AdmissionReview<Pod> = serde_json::from_slice(body)?;
    review
        .try_into()
        .map_err(|_: kube::core::admission::ConvertAdmissionReviewError| ReviewError::NoRequest)
}

/// Answers a request: the pod gated, admitted at its creation, refused or left alone.
pub fn answer(request: &AdmissionRequest<Pod>, policy: &dyn GatePolicy) -> Answer {
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
    if let Some((message, queue)) = refusal(&pod, policy) {
        return Answer {
            review: AdmissionResponse::from(request).deny(message).into_review(),
            result: WebhookResult::Refused,
            queue: Some(queue),
        };
    }
    let Some(queue) = policy.managing_queue(&pod) else {
        return allow(WebhookResult::NotManaged);
    };
    let mut operations = tenant_proofing(&mut pod);
    let result = gate_or_admit(request.dry_run, &pod, policy, &mut operations);
    if operations.is_empty() {
        return allow(result);
    }
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

/// Admits managed `pod` at its creation when the leader decides so at once, else gates it
/// (unless gated already); the patch operations go to `operations`.
fn gate_or_admit(
    dry_run: bool,
    pod: &Pod,
    policy: &dyn GatePolicy,
    operations: &mut Vec<serde_json::Value>,
) -> WebhookResult {
    if is_gated(pod) {
        if !dry_run {
            policy.gated_undecided();
        }
        return WebhookResult::AlreadyGated;
    }
    // A dry run creates nothing, so it must reserve nothing: it sees the gate.
    let at_creation = if dry_run {
        Err(Gate::Declined)
    } else if policy.through_dra(pod) {
        policy.gated_undecided();
        Err(Gate::Declined)
    } else {
        policy.admit_at_creation(pod)
    };
    match at_creation {
        Ok(admitted) => {
            operations.extend(admission_operations(pod, &admitted));
            WebhookResult::Admitted
        }
        Err(gate) => {
            let has_gates = pod
                .spec
                .as_ref()
                .is_some_and(|spec| spec.scheduling_gates.is_some());
            operations.push(gate_operation(has_gates));
            match gate {
                Gate::Declined => WebhookResult::Gated,
                Gate::Busy => WebhookResult::Busy,
            }
        }
    }
}

/// The message refusing a pod the queue claiming its namespace could not count, and that
/// queue; `None` when the pod may be created.
fn refusal(pod: &Pod, policy: &dyn GatePolicy) -> Option<(String, String)> {
    let spec = pod.spec.as_ref()?;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    if spec.node_name.is_some() && is_gpu_pod(pod) {
        let queue = policy.managing_queue(pod)?;
        return Some((node_name_refused(namespace, &queue), queue));
    }
    None
}

/// The refusal of a GPU pod bound at creation (the policy in `config/policy/` says the same).
fn node_name_refused(namespace: &str, queue: &str) -> String {
    format!(
        "gpuqueue: spec.nodeName is refused for a GPU pod in namespace {namespace}, which GpuQueue \
         {queue} claims: a pod bound at creation skips the queue's admission. Leave spec.nodeName \
         unset (choose nodes with a nodeSelector or node affinity); the queue admits the pod and \
         kube-scheduler binds it."
    )
}

/// Removes the creator's `gpuqueue.io/*` annotations but the user knobs, and caps the knobs:
/// the operations, applied to `pod` too so that later operations see what the API server will.
fn tenant_proofing(pod: &mut Pod) -> Vec<serde_json::Value> {
    let mut operations = Vec::new();
    if let Some(notes) = pod.metadata.annotations.as_mut() {
        let forged: Vec<String> = notes
            .keys()
            .filter(|key| key.starts_with(OPERATOR_PREFIX) && !USER_KNOBS.contains(&key.as_str()))
            .cloned()
            .collect();
        for key in forged {
            notes.remove(&key);
            let path = format!("/metadata/annotations/{}", escape(&key));
            operations.push(json!({"op": "remove", "path": path}));
        }
        if let Some(cost) = notes.get_mut(annotations::CHECKPOINT_COST)
            && cost
                .parse::<u64>()
                .is_ok_and(|cost| cost > CHECKPOINT_COST_MAX)
        {
            *cost = CHECKPOINT_COST_MAX.to_string();
            let path = format!(
                "/metadata/annotations/{}",
                escape(annotations::CHECKPOINT_COST)
            );
            operations.push(json!({"op": "replace", "path": path, "value": cost}));
        }
    }
    operations
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
    let mut notes = BTreeMap::from([
        (annotations::QUEUE, admitted.queue.clone()),
        (
            annotations::ADMITTED_AS,
            admitted.admitted_as.as_str().to_owned(),
        ),
        (annotations::ADMITTED_AT, admitted.at.to_string()),
        (annotations::ADMITTED_AT_CREATION, admitted.token.clone()),
    ]);
    if let Some(seal) = &admitted.seal {
        notes.insert(annotations::ADMISSION_SEAL, seal.clone());
    }
    pin_and_annotate(pod, &admitted.node_pin, notes)
}

#[cfg(test)]
mod tests {
    use gpuqueue_core::model::dra::{Asks, DeviceClasses, asks};

    use super::*;

    /// Reads an AdmissionReview and answers it, as the server does.
    fn review(body: &[u8], policy: &dyn GatePolicy) -> Result<Answer, ReviewError> {
        Ok(answer(&read(body)?, policy))
    }

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
                }) || uses_resource_claims(spec)
            });
            (in_tenant && (wants_gpu || self.through_dra(pod))).then(|| "tenant-queue".to_owned())
        }

        fn claiming_queue(&self, pod: &Pod) -> Option<String> {
            (pod.metadata.namespace.as_deref() == Some("tenant")).then(|| "tenant-queue".to_owned())
        }

        fn through_dra(&self, pod: &Pod) -> bool {
            asks(pod, &DeviceClasses::default) == Asks::ThroughDra
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
        assert_eq!(response["allowed"], true, "the pod was refused: {response}");
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

        fn through_dra(&self, pod: &Pod) -> bool {
            TenantPolicy.through_dra(pod)
        }

        fn admit_at_creation(&self, _pod: &Pod) -> Result<CreationAdmission, Gate> {
            Ok(CreationAdmission {
                queue: "tenant-queue".into(),
                node_pin: "gpu-node-3".into(),
                admitted_as: gpuqueue_core::model::AdmittedAs::Borrowed,
                at: "2026-11-29T12:00:00Z".parse().unwrap(),
                token: "00ff".into(),
                seal: Some("5ea1".into()),
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
                    "gpuqueue.io/admission-seal": "5ea1",
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
        assert_eq!(patch.as_array().unwrap().len(), 6);
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

    /// The refusal's message, asserting the review refused the pod.
    fn refusal_of(answer: &Answer) -> String {
        let response = serde_json::to_value(&answer.review).unwrap()["response"].clone();
        assert_eq!(response["allowed"], false, "{response}");
        assert_eq!(response.get("patch"), None);
        assert_eq!(answer.result, WebhookResult::Refused);
        response["status"]["message"].as_str().unwrap().to_owned()
    }

    #[test]
    fn a_gpu_pod_bound_at_creation_in_a_claimed_namespace_is_refused() {
        let mut spec = gpu_spec(None);
        spec["nodeName"] = json!("gpu-node-1");
        let answer = review(&review_body("CREATE", "tenant", &spec), &AdmittingPolicy).unwrap();
        let message = refusal_of(&answer);
        assert!(
            message.starts_with(
                "gpuqueue: spec.nodeName is refused for a GPU pod in namespace tenant, \
                 which GpuQueue tenant-queue claims"
            ),
            "{message}"
        );
        assert!(message.contains("Leave spec.nodeName unset"), "{message}");
    }

    #[test]
    fn pods_bound_at_creation_elsewhere_or_without_gpus_pass_unchanged() {
        let mut gpu = gpu_spec(None);
        gpu["nodeName"] = json!("gpu-node-1");
        let cpu = json!({"nodeName": "node-1", "containers": [{"name": "web", "image": "nginx"}]});
        for body in [
            review_body("CREATE", "other", &gpu),
            review_body("CREATE", "tenant", &cpu),
        ] {
            let answer = review(&body, &TenantPolicy).unwrap();
            assert_eq!(answer.result, WebhookResult::NotManaged);
            assert_eq!(patch_of(&answer), None);
        }
    }

    #[test]
    fn any_pod_with_resource_claims_in_a_claimed_namespace_is_gated_never_admitted_at_once() {
        let claims = json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]);
        let mut cpu = json!({"containers": [{"name": "web", "image": "nginx"}]});
        cpu["resourceClaims"] = claims.clone();
        let mut gpu = gpu_spec(None);
        gpu["resourceClaims"] = claims;
        for spec in [&cpu, &gpu] {
            let answer = review(&review_body("CREATE", "tenant", spec), &AdmittingPolicy).unwrap();
            assert_eq!(answer.result, WebhookResult::Gated);
            let patch = patch_of(&answer).unwrap();
            assert!(
                patch.to_string().contains("gpuqueue.io/admission"),
                "{patch}"
            );
        }
        let answer = review(&review_body("CREATE", "other", &cpu), &TenantPolicy).unwrap();
        assert_eq!(answer.result, WebhookResult::NotManaged);
    }

    #[test]
    fn a_pod_asking_for_a_device_class_by_name_is_gated_never_admitted_at_once() {
        // kube-scheduler allocates the class's devices through a claim of its own: what they
        // charge is known from the class store, in the admission pass.
        let implicit = json!({"containers": [{"name": "vllm", "image": "vllm/vllm-openai",
            "resources": {"limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "8"}}}]});
        let answer = review(
            &review_body("CREATE", "tenant", &implicit),
            &AdmittingPolicy,
        )
        .unwrap();
        assert_eq!(answer.result, WebhookResult::Gated);
        assert_eq!(
            patch_of(&answer).unwrap(),
            json!([{"op": "add", "path": "/spec/schedulingGates",
                    "value": [{"name": "gpuqueue.io/admission"}]}])
        );
    }

    /// Like [`AdmittingPolicy`], counting the pods gated without being asked about.
    #[derive(Default)]
    struct CountingPolicy(std::sync::atomic::AtomicU32);

    impl GatePolicy for CountingPolicy {
        fn managing_queue(&self, pod: &Pod) -> Option<String> {
            TenantPolicy.managing_queue(pod)
        }

        fn admit_at_creation(&self, pod: &Pod) -> Result<CreationAdmission, Gate> {
            AdmittingPolicy.admit_at_creation(pod)
        }

        fn gated_undecided(&self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn a_pod_gated_without_asking_the_leader_closes_admission_at_creation() {
        // Pods created after it must not be admitted at creation ahead of it: the leader is
        // told, as when the webhook gave up on a busy pass.
        let policy = CountingPolicy::default();
        let told = || policy.0.load(std::sync::atomic::Ordering::Relaxed);
        let mut claiming = gpu_spec(None);
        claiming["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": "one"}]);
        let gated = gpu_spec(Some(json!([{"name": "gpuqueue.io/admission"}])));
        for spec in [&claiming, &gated] {
            review(&review_body("CREATE", "tenant", spec), &policy).unwrap();
        }
        assert_eq!(told(), 2);
        // Neither a dry run (nothing is created), nor a pod the leader decided.
        let mut dry: serde_json::Value =
            serde_json::from_slice(&review_body("CREATE", "tenant", &claiming)).unwrap();
        dry["request"]["dryRun"] = json!(true);
        review(&serde_json::to_vec(&dry).unwrap(), &policy).unwrap();
        review(&review_body("CREATE", "tenant", &gpu_spec(None)), &policy).unwrap();
        assert_eq!(told(), 2);
    }

    #[test]
    fn a_pod_gated_by_hand_loses_its_forged_annotations() {
        let mut body: serde_json::Value = serde_json::from_slice(&review_body(
            "CREATE",
            "tenant",
            &gpu_spec(Some(json!([{"name": "gpuqueue.io/admission"}]))),
        ))
        .unwrap();
        body["request"]["object"]["metadata"]["annotations"] =
            json!({"gpuqueue.io/reclaim-id": "forged"});
        let answer = review(&serde_json::to_vec(&body).unwrap(), &TenantPolicy).unwrap();
        assert_eq!(answer.result, WebhookResult::AlreadyGated);
        assert_eq!(
            patch_of(&answer).unwrap(),
            json!([{"op": "remove", "path": "/metadata/annotations/gpuqueue.io~1reclaim-id"}])
        );
    }

    /// A review of a GPU pod in `namespace` whose creator wrote `notes`.
    fn annotated(namespace: &str, notes: &serde_json::Value) -> Vec<u8> {
        let mut body: serde_json::Value =
            serde_json::from_slice(&review_body("CREATE", namespace, &gpu_spec(None))).unwrap();
        body["request"]["object"]["metadata"]["annotations"] = notes.clone();
        serde_json::to_vec(&body).unwrap()
    }

    #[test]
    fn forged_operator_annotations_are_removed_and_user_knobs_kept() {
        let notes = json!({
            "team": "search",
            "gpuqueue.io/reclaim-id": "forged",
            "gpuqueue.io/reclaim-role": "victim",
            "gpuqueue.io/reclaim-deadline": "2099-01-01T00:00:00Z",
            "gpuqueue.io/admitted-as": "guaranteed",
            "gpuqueue.io/checkpoint-cost": "40",
        });
        let answer = review(&annotated("tenant", &notes), &TenantPolicy).unwrap();
        assert_eq!(answer.result, WebhookResult::Gated);
        let remove = |key: &str| json!({"op": "remove", "path": format!("/metadata/annotations/gpuqueue.io~1{key}")});
        assert_eq!(
            patch_of(&answer).unwrap(),
            json!([
                remove("admitted-as"),
                remove("reclaim-deadline"),
                remove("reclaim-id"),
                remove("reclaim-role"),
                {"op": "add", "path": "/spec/schedulingGates",
                 "value": [{"name": "gpuqueue.io/admission"}]},
            ])
        );
    }

    #[test]
    fn a_pod_admitted_at_creation_carries_only_the_operators_annotations() {
        let notes = json!({
            "gpuqueue.io/admitted-at-creation": "forged-token",
            "gpuqueue.io/waiting-reason": "forged",
        });
        let answer = review(&annotated("tenant", &notes), &AdmittingPolicy).unwrap();
        assert_eq!(answer.result, WebhookResult::Admitted);
        let patch = patch_of(&answer).unwrap();
        let ops = patch.as_array().unwrap();
        assert_eq!(
            ops[..2],
            [
                json!({"op": "remove", "path": "/metadata/annotations/gpuqueue.io~1admitted-at-creation"}),
                json!({"op": "remove", "path": "/metadata/annotations/gpuqueue.io~1waiting-reason"}),
            ]
        );
        assert!(
            ops.contains(&json!({"op": "add", "path": "/metadata/annotations/gpuqueue.io~1admitted-at-creation", "value": "00ff"})),
            "{patch}"
        );
        // The removed waiting reason is not removed twice.
        assert_eq!(
            ops.iter().filter(|op| op["op"] == "remove").count(),
            2,
            "{patch}"
        );
    }

    #[test]
    fn the_checkpoint_cost_knob_is_capped() {
        let answer = review(
            &annotated(
                "tenant",
                &json!({"gpuqueue.io/checkpoint-cost": "99999999"}),
            ),
            &TenantPolicy,
        )
        .unwrap();
        assert_eq!(
            patch_of(&answer).unwrap()[0],
            json!({"op": "replace", "path": "/metadata/annotations/gpuqueue.io~1checkpoint-cost",
                   "value": CHECKPOINT_COST_MAX.to_string()})
        );
        let answer = review(
            &annotated("tenant", &json!({"gpuqueue.io/checkpoint-cost": "1000"})),
            &TenantPolicy,
        )
        .unwrap();
        assert_eq!(
            patch_of(&answer).unwrap()[0]["path"],
            "/spec/schedulingGates"
        );
    }

    #[test]
    fn unmanaged_pods_keep_their_annotations() {
        let notes = json!({"gpuqueue.io/reclaim-id": "theirs"});
        let answer = review(&annotated("other", &notes), &TenantPolicy).unwrap();
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
