//! Writes to pods: releasing the admission gate on a chosen node, and recording why a pod
//! waits. Every write is a patch of exactly the fields it changes, never a read-modify-write
//! of the whole pod (a typed PUT drops fields newer than the client: Kueue #2029).
//!
//! Releasing the gate is one JSON patch, applied atomically by the API server:
//!
//! ```text
//! test   /metadata/uid                      = <uid seen>          same pod, not a namesake
//! test   /spec/schedulingGates/<i>/name     = gpuqueue.io/admission   still gated, by us, at i
//! remove /spec/schedulingGates/<i>                                    release (other gates stay)
//! add    /spec/nodeSelector/kubernetes.io~1hostname = <node>      pin (allowed while gated)
//! add    /metadata/annotations/...          queue, admitted-as, admitted-at
//! remove /metadata/annotations/gpuqueue.io~1waiting-reason        no longer waiting
//! ```
//!
//! If anything moved since the pod was read (someone released the gate, the pod was replaced)
//! a `test` fails, the API server answers 422 and nothing is written; the next pass reads the
//! pod again. So a gate is released at most once, and never on a pod that was not seen gated.

use std::collections::BTreeMap;

use gpuqueue_api::{ADMISSION_GATE, annotations};
use gpuqueue_core::model::gate_index;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

use crate::seal::{Admitted, Seal};

/// The node label a pod is pinned by. Every node carries it (kubelet sets it; KWOK nodes too).
pub const PIN_LABEL: &str = "kubernetes.io/hostname";

/// Why a write to a pod did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("pod {pod} no longer carries the admission gate where it was seen")]
    NotGated { pod: String },
    #[error("pod {pod} changed before the write (a test of the patch failed); retried next pass")]
    Changed { pod: String },
    #[error("pod {pod} is gone")]
    Gone { pod: String },
    #[error("writing pod {pod} was refused by an admission policy or webhook: {message}")]
    Refused { pod: String, message: String },
    #[error("writing pod {pod}: {source}")]
    Api { pod: String, source: kube::Error },
    #[error("building the patch for pod {pod}: {source}")]
    Encode {
        pod: String,
        source: serde_json::Error,
    },
}

impl PatchError {
    /// The error's kind, as metrics label it (snake case).
    pub fn category(&self) -> &'static str {
        match self {
            Self::NotGated { .. } => "pod_not_gated",
            Self::Changed { .. } => "pod_changed",
            Self::Gone { .. } => "pod_gone",
            Self::Refused { .. } => "pod_refused",
            Self::Api { .. } => "pod_api",
            Self::Encode { .. } => "pod_encode",
        }
    }

    /// Whether the pod moved on under us (not a failure of the operator or the API).
    pub fn is_stale(&self) -> bool {
        matches!(
            self,
            Self::NotGated { .. } | Self::Changed { .. } | Self::Gone { .. }
        )
    }

    /// Whether the write may have landed though no answer said so: the connection broke or
    /// timed out, or the API server failed after storage may have taken it (5xx, such as a
    /// 504 or an API server stopping).
    pub fn may_have_landed(&self) -> bool {
        match self {
            Self::Api {
                source: kube::Error::Api(status),
                ..
            } => status.code >= 500,
            Self::Api { .. } => true,
            _ => false,
        }
    }
}

/// What an admission writes on the pod besides releasing the gate.
#[derive(Debug, Clone)]
pub struct Admission<'a> {
    /// Value of the pin label of the chosen node.
    pub node_pin: &'a str,
    pub queue: &'a str,
    /// `guaranteed` or `borrowed`.
    pub admitted_as: &'a str,
    pub at: Timestamp,
    /// The leader's seal ([`crate::seal`]); `None` where its key could not be had.
    pub seal: Option<&'a Seal>,
}

/// The JSON patch that admits `pod` as [`Admission`] says, or [`PatchError::NotGated`].
pub fn admission_patch(
    pod: &Pod,
    admission: &Admission<'_>,
) -> Result<json_patch::Patch, PatchError> {
    let mut operations = gate_operations(pod, true)?;
    operations.extend(admission_operations(pod, admission));
    encode_operations(pod, operations)
}

/// The JSON patch that admits and pins `pod` as [`Admission`] says but keeps it at the gate
/// (a reclaim's owner held until its room is free), or [`PatchError::NotGated`].
pub fn held_admission_patch(
    pod: &Pod,
    admission: &Admission<'_>,
) -> Result<json_patch::Patch, PatchError> {
    let mut operations = gate_operations(pod, false)?;
    operations.extend(admission_operations(pod, admission));
    encode_operations(pod, operations)
}

/// The JSON patch that releases the gate of `pod`, admitted and pinned already (a held owner),
/// or [`PatchError::NotGated`].
pub fn release_patch(pod: &Pod) -> Result<json_patch::Patch, PatchError> {
    encode_operations(pod, gate_operations(pod, true)?)
}

/// Tests the pod's uid and its gate, and removes the gate when `release` is set.
fn gate_operations(pod: &Pod, release: bool) -> Result<Vec<Value>, PatchError> {
    let gate_index = gate_index(pod).ok_or_else(|| PatchError::NotGated { pod: describe(pod) })?;
    let mut operations = vec![
        json!({"op": "test", "path": "/metadata/uid", "value": pod.metadata.uid}),
        json!({"op": "test", "path": format!("/spec/schedulingGates/{gate_index}/name"), "value": ADMISSION_GATE}),
    ];
    if release {
        operations
            .push(json!({"op": "remove", "path": format!("/spec/schedulingGates/{gate_index}")}));
    }
    Ok(operations)
}

/// The pin and the admission annotations of `admission`, sealed.
fn admission_operations(pod: &Pod, admission: &Admission<'_>) -> Vec<Value> {
    let at = admission.at.to_string();
    let mut notes = BTreeMap::from([
        (annotations::QUEUE, admission.queue.to_owned()),
        (annotations::ADMITTED_AS, admission.admitted_as.to_owned()),
        (annotations::ADMITTED_AT, at.clone()),
    ]);
    if let Some(seal) = admission.seal {
        let admitted = Admitted {
            queue: admission.queue,
            admitted_as: admission.admitted_as,
            admitted_at: &at,
            node_pin: admission.node_pin,
            token: None,
        };
        notes.insert(annotations::ADMISSION_SEAL, seal.sign(pod, &admitted));
    }
    let mut operations = pin_and_annotate(pod, admission.node_pin, notes);
    // A reservation token nobody reserved (a tenant's, on a pod it gated itself) would make
    // the seal read as one made at creation, and fail.
    if pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|notes| notes.contains_key(annotations::ADMITTED_AT_CREATION))
    {
        operations.push(json!({
            "op": "remove",
            "path": format!("/metadata/annotations/{}", escape(annotations::ADMITTED_AT_CREATION)),
        }));
    }
    operations
}

fn encode_operations(pod: &Pod, operations: Vec<Value>) -> Result<json_patch::Patch, PatchError> {
    serde_json::from_value(Value::Array(operations)).map_err(|source| PatchError::Encode {
        pod: describe(pod),
        source,
    })
}

/// The operations that pin `pod` to the node with `node_pin` and write `notes` as annotations
/// (dropping a waiting reason): what an admission writes besides releasing the gate, and all
/// that an admission at creation writes.
pub(crate) fn pin_and_annotate(
    pod: &Pod,
    node_pin: &str,
    notes: BTreeMap<&str, String>,
) -> Vec<Value> {
    let mut operations = Vec::new();
    if pod
        .spec
        .as_ref()
        .and_then(|spec| spec.node_selector.as_ref())
        .is_some()
    {
        operations.push(json!({
            "op": "add", "path": format!("/spec/nodeSelector/{}", escape(PIN_LABEL)), "value": node_pin,
        }));
    } else {
        operations.push(json!({
            "op": "add", "path": "/spec/nodeSelector", "value": {PIN_LABEL: node_pin},
        }));
    }
    match pod.metadata.annotations.as_ref() {
        None => {
            operations.push(json!({"op": "add", "path": "/metadata/annotations", "value": notes}));
        }
        Some(existing) => {
            for (key, value) in notes {
                operations.push(json!({
                    "op": "add", "path": format!("/metadata/annotations/{}", escape(key)), "value": value,
                }));
            }
            if existing.contains_key(annotations::WAITING_REASON) {
                operations.push(json!({
                    "op": "remove",
                    "path": format!("/metadata/annotations/{}", escape(annotations::WAITING_REASON)),
                }));
            }
        }
    }
    operations
}

/// Sends a JSON patch built for `pod`. Returns the pod as the API server wrote it.
pub async fn send(api: &Api<Pod>, pod: &Pod, patch: json_patch::Patch) -> Result<Pod, PatchError> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(|source| classify(pod, source))
}

/// `pod` as it will be once `patch` is applied, computed here: what the operator assumes until
/// the API server answers. `None` if the patch does not apply to this copy.
pub fn applied_locally(pod: &Pod, patch: &json_patch::Patch) -> Option<Pod> {
    let mut document = serde_json::to_value(pod).ok()?;
    json_patch::patch(&mut document, patch).ok()?;
    serde_json::from_value(document).ok()
}

/// The JSON patch that records (or clears, with `None`) why `pod` waits, in the annotation
/// the CLI reads. It tests the pod's uid first, so a namesake is never annotated.
pub fn waiting_reason_patch(
    pod: &Pod,
    reason: Option<&str>,
) -> Result<json_patch::Patch, PatchError> {
    let key = format!(
        "/metadata/annotations/{}",
        escape(annotations::WAITING_REASON)
    );
    let has_annotations = pod.metadata.annotations.is_some();
    let change = match reason {
        Some(reason) if has_annotations => json!({"op": "add", "path": key, "value": reason}),
        Some(reason) => json!({
            "op": "add", "path": "/metadata/annotations", "value": {annotations::WAITING_REASON: reason},
        }),
        None => json!({"op": "remove", "path": key}),
    };
    let operations = vec![
        json!({"op": "test", "path": "/metadata/uid", "value": pod.metadata.uid}),
        change,
    ];
    serde_json::from_value(Value::Array(operations)).map_err(|source| PatchError::Encode {
        pod: describe(pod),
        source,
    })
}

/// Records (or clears) why `pod` waits; see [`waiting_reason_patch`].
pub async fn set_waiting_reason(
    api: &Api<Pod>,
    pod: &Pod,
    reason: Option<&str>,
) -> Result<Pod, PatchError> {
    send(api, pod, waiting_reason_patch(pod, reason)?).await
}

/// What a failed pod write means: a failed `test` or a conflict is a pod that changed, a 404 a
/// pod that is gone, a denial by a ValidatingAdmissionPolicy or a webhook a refusal (not a pod
/// that moved on: trying again from fresh state is refused again), anything else a failure of
/// the API. A policy's denial and a failed `test` both answer 422 by default; only the
/// denial's message says "denied" (`... with binding '...' denied request: ...`,
/// `admission webhook "..." denied the request: ...`).
pub fn classify(pod: &Pod, source: kube::Error) -> PatchError {
    let pod = describe(pod);
    match &source {
        kube::Error::Api(status) if status.code == 422 && status.message.contains(" denied ") => {
            PatchError::Refused {
                pod,
                message: status.message.clone(),
            }
        }
        kube::Error::Api(status) if status.code == 422 || status.code == 409 => {
            PatchError::Changed { pod }
        }
        kube::Error::Api(status) if status.code == 404 => PatchError::Gone { pod },
        _ => PatchError::Api { pod, source },
    }
}

/// `namespace/name`, for messages.
pub fn describe(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Escapes a map key for a JSON pointer (RFC 6901): `~` as `~0`, `/` as `~1`.
pub(crate) fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use kube::Client;

    use super::*;
    use crate::mock_api;

    fn gated_pod(
        gates: &[&str],
        annotations: Option<serde_json::Value>,
        selector: Option<serde_json::Value>,
    ) -> Pod {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "vllm-0", "namespace": "batch", "uid": "uid-1"},
            "spec": {
                "containers": [{"name": "vllm", "image": "vllm"}],
                "schedulingGates": gates.iter().map(|g| json!({"name": g})).collect::<Vec<_>>(),
            },
        });
        if let Some(annotations) = annotations {
            pod["metadata"]["annotations"] = annotations;
        }
        if let Some(selector) = selector {
            pod["spec"]["nodeSelector"] = selector;
        }
        serde_json::from_value(pod).unwrap()
    }

    fn admission() -> Admission<'static> {
        Admission {
            node_pin: "gpu-node-3",
            queue: "batch",
            admitted_as: "borrowed",
            at: "2026-01-01T00:00:00Z".parse().unwrap(),
            seal: None,
        }
    }

    /// Applies the patch the way the API server does and returns the result.
    fn apply(pod: &Pod, patch: &json_patch::Patch) -> Result<Pod, ()> {
        applied_locally(pod, patch).ok_or(())
    }

    #[test]
    fn admission_releases_only_our_gate_pins_the_node_and_annotates() {
        let pod = gated_pod(
            &["example.com/other", ADMISSION_GATE],
            Some(json!({"gpuqueue.io/waiting-reason": "queue batch is full", "team": "a"})),
            Some(json!({"nvidia.com/gpu.product": "H100"})),
        );
        let admitted = apply(&pod, &admission_patch(&pod, &admission()).unwrap()).unwrap();
        let spec = admitted.spec.unwrap();
        let gates: Vec<_> = spec
            .scheduling_gates
            .unwrap()
            .into_iter()
            .map(|g| g.name)
            .collect();
        assert_eq!(gates, ["example.com/other"]);
        let selector = spec.node_selector.unwrap();
        assert_eq!(selector[PIN_LABEL], "gpu-node-3");
        assert_eq!(selector["nvidia.com/gpu.product"], "H100");
        let notes = admitted.metadata.annotations.unwrap();
        assert_eq!(notes[annotations::QUEUE], "batch");
        assert_eq!(notes[annotations::ADMITTED_AS], "borrowed");
        assert_eq!(notes[annotations::ADMITTED_AT], "2026-01-01T00:00:00Z");
        assert_eq!(notes["team"], "a");
        assert!(!notes.contains_key(annotations::WAITING_REASON));
    }

    #[test]
    fn a_sealed_admission_drops_a_reservation_token_the_pod_came_with() {
        let seal = crate::seal::Seal::new(&[7; 32], "2026-01-01T00:00:00Z".parse().unwrap());
        let pod = gated_pod(
            &[ADMISSION_GATE],
            Some(json!({"gpuqueue.io/admitted-at-creation": "0123456789abcdef"})),
            None,
        );
        let sealed = Admission {
            seal: Some(&seal),
            ..admission()
        };
        let admitted = apply(&pod, &admission_patch(&pod, &sealed).unwrap()).unwrap();
        let notes = admitted.metadata.annotations.as_ref().unwrap();
        assert!(!notes.contains_key(annotations::ADMITTED_AT_CREATION));
        assert_eq!(seal.verdict(&admitted), crate::seal::Verdict::Sealed);
    }

    #[test]
    fn admission_works_on_a_pod_without_selector_or_annotations() {
        let pod = gated_pod(&[ADMISSION_GATE], None, None);
        let admitted = apply(&pod, &admission_patch(&pod, &admission()).unwrap()).unwrap();
        let spec = admitted.spec.unwrap();
        assert!(spec.scheduling_gates.unwrap_or_default().is_empty());
        assert_eq!(spec.node_selector.unwrap()[PIN_LABEL], "gpu-node-3");
        assert_eq!(
            admitted.metadata.annotations.unwrap()[annotations::QUEUE],
            "batch"
        );
    }

    #[test]
    fn admission_fails_if_the_gate_moved_or_the_pod_was_replaced() {
        let seen = gated_pod(&["example.com/other", ADMISSION_GATE], None, None);
        let patch = admission_patch(&seen, &admission()).unwrap();
        // Someone released our gate meanwhile.
        let released = gated_pod(&["example.com/other"], None, None);
        assert!(apply(&released, &patch).is_err());
        // The gates were reordered.
        let reordered = gated_pod(&[ADMISSION_GATE, "example.com/other"], None, None);
        assert!(apply(&reordered, &patch).is_err());
        // A new pod with the same name.
        let mut namesake = seen.clone();
        namesake.metadata.uid = Some("uid-2".into());
        assert!(apply(&namesake, &patch).is_err());
    }

    #[test]
    fn a_pod_without_our_gate_is_not_admitted() {
        let pod = gated_pod(&["example.com/other"], None, None);
        assert!(matches!(
            admission_patch(&pod, &admission()),
            Err(PatchError::NotGated { .. })
        ));
    }

    /// The answer to every request: a failure with `code` and `message` as its reason.
    fn refusing(code: u16, message: &str) -> Client {
        let message = message.to_owned();
        mock_api::serve(move |_| mock_api::failure(code, &message, &message)).0
    }

    #[tokio::test]
    async fn an_admission_is_sent_as_one_json_patch_to_the_pod() {
        let pod = gated_pod(&[ADMISSION_GATE], None, None);
        let answer = apply(&pod, &admission_patch(&pod, &admission()).unwrap()).unwrap();
        let answer = serde_json::to_value(answer).unwrap();
        let (client, log) = mock_api::serve(move |_| (200, answer.clone()));
        let api: Api<Pod> = Api::namespaced(client, "batch");
        let patch = admission_patch(&pod, &admission()).unwrap();
        let admitted = send(&api, &pod, patch).await.unwrap();
        assert!(
            admitted
                .spec
                .unwrap()
                .scheduling_gates
                .unwrap_or_default()
                .is_empty()
        );
        let seen = crate::sync::lock(&log);
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].method, "PATCH");
        assert_eq!(seen[0].path, "/api/v1/namespaces/batch/pods/vllm-0");
        assert_eq!(seen[0].content_type, "application/json-patch+json");
    }

    #[tokio::test]
    async fn a_failed_test_is_reported_as_a_changed_pod_and_a_denial_as_a_refusal() {
        let pod = gated_pod(&[ADMISSION_GATE], None, None);
        let client = refusing(422, "Invalid");
        let api: Api<Pod> = Api::namespaced(client, "batch");
        let error = send(&api, &pod, admission_patch(&pod, &admission()).unwrap())
            .await
            .unwrap_err();
        assert!(matches!(error, PatchError::Changed { .. }), "{error}");
        assert!(error.is_stale());

        let client = refusing(404, "NotFound");
        let api: Api<Pod> = Api::namespaced(client, "batch");
        let error = send(&api, &pod, admission_patch(&pod, &admission()).unwrap())
            .await
            .unwrap_err();
        assert!(matches!(error, PatchError::Gone { .. }), "{error}");

        // A policy's denial answers 422 too, but is no pod that moved on.
        let denied = "ValidatingAdmissionPolicy 'p' with binding 'p' denied request: no";
        let client = refusing(422, denied);
        let api: Api<Pod> = Api::namespaced(client, "batch");
        let error = send(&api, &pod, admission_patch(&pod, &admission()).unwrap())
            .await
            .unwrap_err();
        assert!(matches!(error, PatchError::Refused { .. }), "{error}");
        assert!(!error.is_stale(), "{error}");

        let client = refusing(500, "InternalError");
        let api: Api<Pod> = Api::namespaced(client, "batch");
        let error = send(&api, &pod, admission_patch(&pod, &admission()).unwrap())
            .await
            .unwrap_err();
        assert!(!error.is_stale(), "{error}");
    }

    #[test]
    fn json_pointer_keys_are_escaped() {
        assert_eq!(
            escape("gpuqueue.io/waiting-reason"),
            "gpuqueue.io~1waiting-reason"
        );
        assert_eq!(escape("a~b/c"), "a~0b~1c");
    }

    #[test]
    fn waiting_reasons_are_added_and_cleared() {
        let pod = gated_pod(&[ADMISSION_GATE], None, None);
        let note = |pod: &Pod| {
            pod.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(annotations::WAITING_REASON).cloned())
        };
        let patch = |pod: &Pod, reason| waiting_reason_patch(pod, reason).unwrap();
        let waiting = apply(&pod, &patch(&pod, Some("full"))).unwrap();
        assert_eq!(note(&waiting).as_deref(), Some("full"));
        let again = apply(&waiting, &patch(&waiting, Some("fuller"))).unwrap();
        assert_eq!(note(&again).as_deref(), Some("fuller"));
        let cleared = apply(&again, &patch(&again, None)).unwrap();
        assert_eq!(note(&cleared), None);
    }
}
