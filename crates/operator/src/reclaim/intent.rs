//! Intent records: the annotations a reclaim writes on its pods before it acts, how they are
//! read back, and the JSON patches that write and clear them.
//!
//! ```text
//! gpuqueue.io/reclaim-id        rc-3f9c0a7d12e4b6c8        every pod of the reclaim
//! gpuqueue.io/reclaim-role      owner | victim
//! gpuqueue.io/reclaim-deadline  2026-01-01T00:00:03.120Z   found blocked + budget
//! gpuqueue.io/reclaim-node      gpu-node-2                 the node freed for the owner
//! gpuqueue.io/reclaim-progress  checkpointing              victims: the checkpoint call was made
//! gpuqueue.io/reclaim-victims   [{"pod": "batch/vllm-7",   the owner: every victim, so a resumed
//!                                 "uid": "…", "queue":     handover knows those already gone
//!                                 "batch"}]
//! ```
//!
//! Every write tests the pod's uid, so a namesake is never touched. The intent itself also
//! tests the `resourceVersion` the plan was made from: a pod that changed since (deleted,
//! replaced, claimed by another reclaim) refuses the intent with 422 and nothing is written.
//! Later writes (progress, clearing) test that the pod still carries this reclaim's id.

use std::collections::BTreeMap;

use gpuqueue_api::annotations;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::writes::pod::{self as patch, PatchError};

/// `gpuqueue.io/reclaim-role` of the pod the GPUs are freed for.
pub const OWNER: &str = "owner";
/// `gpuqueue.io/reclaim-role` of a pod being checkpointed and evicted.
pub const VICTIM: &str = "victim";
/// `gpuqueue.io/reclaim-progress` once the checkpoint call is about to be made: written first,
/// so that no process ever calls it a second time.
pub const CHECKPOINTING: &str = "checkpointing";

/// Every annotation a reclaim writes, removed together when it is cleared.
const KEYS: [&str; 6] = [
    annotations::RECLAIM_ID,
    annotations::RECLAIM_ROLE,
    annotations::RECLAIM_DEADLINE,
    annotations::RECLAIM_NODE,
    annotations::RECLAIM_PROGRESS,
    annotations::RECLAIM_VICTIMS,
];

/// A pod's part in a reclaim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Owner,
    Victim,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Owner => OWNER,
            Self::Victim => VICTIM,
        }
    }
}

/// What one reclaim writes on each of its pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    pub id: String,
    pub deadline: Timestamp,
    pub node: String,
    /// Written on the owner only.
    pub victims: Vec<VictimRef>,
}

/// A victim as the owner's intent lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VictimRef {
    /// `namespace/name`.
    pub pod: String,
    pub uid: String,
    pub queue: String,
}

impl Intent {
    fn annotations(&self, role: Role) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            (annotations::RECLAIM_ID, self.id.clone()),
            (annotations::RECLAIM_ROLE, role.as_str().to_owned()),
            (
                annotations::RECLAIM_DEADLINE,
                format!("{:.3}", self.deadline),
            ),
            (annotations::RECLAIM_NODE, self.node.clone()),
        ])
    }
}

/// A reclaim's annotations as read from a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub id: String,
    /// `None` for a role this version does not know.
    pub role: Option<Role>,
    /// `None` when missing or not an RFC 3339 time (then the intent counts as stale).
    pub deadline: Option<Timestamp>,
    pub node: Option<String>,
    /// The checkpoint call was made (or was about to be).
    pub checkpoint_started: bool,
    /// On the owner: every victim of the reclaim (empty when missing or unreadable).
    pub victims: Vec<VictimRef>,
}

impl Mark {
    /// The reclaim annotations of `pod`, if it carries a reclaim id.
    pub fn read(pod: &Pod) -> Option<Self> {
        let notes = pod.metadata.annotations.as_ref()?;
        let id = notes.get(annotations::RECLAIM_ID)?.clone();
        let role = match notes.get(annotations::RECLAIM_ROLE).map(String::as_str) {
            Some(OWNER) => Some(Role::Owner),
            Some(VICTIM) => Some(Role::Victim),
            _ => None,
        };
        Some(Self {
            id,
            role,
            deadline: notes
                .get(annotations::RECLAIM_DEADLINE)
                .and_then(|d| d.parse().ok()),
            node: notes.get(annotations::RECLAIM_NODE).cloned(),
            checkpoint_started: notes
                .get(annotations::RECLAIM_PROGRESS)
                .is_some_and(|p| p == CHECKPOINTING),
            victims: notes
                .get(annotations::RECLAIM_VICTIMS)
                .and_then(|v| serde_json::from_str(v).ok())
                .unwrap_or_default(),
        })
    }
}

/// A fresh reclaim id: `rc-` and 16 random hex digits.
pub fn new_id() -> String {
    format!("rc-{:016x}", rand::random::<u64>())
}

/// The patch that records the intent on a victim: tests its uid and `resourceVersion`, then
/// adds the annotations.
pub fn victim_intent_patch(pod: &Pod, intent: &Intent) -> Result<json_patch::Patch, PatchError> {
    let mut operations = preconditions(pod)?;
    operations.extend(add_annotations(pod, &intent.annotations(Role::Victim)));
    encode(pod, operations)
}

/// The owner's patch: its intent and its admission in one atomic write. It tests the owner's
/// uid, `resourceVersion` and gate, adds the intent annotations and pins the node, but keeps
/// the gate until the owner's room is free ([`patch::held_admission_patch`], then
/// [`patch::release_patch`]). An owner therefore never carries an intent without its
/// admission, and it always had every victim's intent recorded first.
pub fn owner_patch(
    pod: &Pod,
    intent: &Intent,
    admission: &patch::Admission<'_>,
) -> Result<json_patch::Patch, PatchError> {
    let mut operations = preconditions(pod)?;
    let admission = patch::held_admission_patch(pod, admission)?;
    let mut released = serde_json::to_value(&admission)
        .map_err(|source| PatchError::Encode {
            pod: patch::describe(pod),
            source,
        })?
        .as_array()
        .cloned()
        .unwrap_or_default();
    operations.append(&mut released);
    // The admission patch created the annotations map if the pod had none.
    for (key, value) in intent.annotations(Role::Owner) {
        operations.push(json!({"op": "add", "path": annotation_path(key), "value": value}));
    }
    let victims = serde_json::to_string(&intent.victims).map_err(|source| PatchError::Encode {
        pod: patch::describe(pod),
        source,
    })?;
    operations.push(json!({
        "op": "add", "path": annotation_path(annotations::RECLAIM_VICTIMS), "value": victims,
    }));
    encode(pod, operations)
}

/// The patch, for the `pods/status` endpoint (which writes metadata but for owner references),
/// that records the intent on a victim no budget guards together with the `DisruptionTarget`
/// `condition` its eviction needs: [`victim_intent_patch`] and the mark in one write.
pub fn victim_intent_and_disruption_patch(
    pod: &Pod,
    intent: &Intent,
    condition: &Value,
) -> Result<json_patch::Patch, PatchError> {
    let mut operations = preconditions(pod)?;
    operations.extend(add_annotations(pod, &intent.annotations(Role::Victim)));
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    operations.push(match conditions {
        None if pod.status.is_none() => {
            json!({"op": "add", "path": "/status", "value": {"conditions": [condition]}})
        }
        None => json!({"op": "add", "path": "/status/conditions", "value": [condition]}),
        Some(conditions) => match conditions.iter().position(|c| c.type_ == DISRUPTION_TARGET) {
            Some(at) => json!({"op": "replace", "path": format!("/status/conditions/{at}"), "value": condition}),
            None => json!({"op": "add", "path": "/status/conditions/-", "value": condition}),
        },
    });
    encode(pod, operations)
}

/// The condition type a pod about to be disrupted carries.
const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// The patch that records, before the call, that a victim's checkpoint is being made: refused
/// unless the pod is still `pod` as read (uid and `resourceVersion`), of reclaim `id`.
pub fn progress_patch(pod: &Pod, id: &str) -> Result<json_patch::Patch, PatchError> {
    let mut operations = preconditions(pod)?;
    operations.extend([
        json!({"op": "test", "path": annotation_path(annotations::RECLAIM_ID), "value": id}),
        json!({"op": "add", "path": annotation_path(annotations::RECLAIM_PROGRESS), "value": CHECKPOINTING}),
    ]);
    encode(pod, operations)
}

/// The patch that removes reclaim `id`'s annotations from `pod` (those it shows), provided it
/// still carries that id.
pub fn clear_patch(pod: &Pod, id: &str) -> Result<json_patch::Patch, PatchError> {
    encode(pod, clear_operations(pod, id))
}

/// [`clear_patch`] for the `pods/status` endpoint, that also takes back the `DisruptionTarget`
/// condition with `reason` [`victim_intent_and_disruption_patch`] wrote (a start that failed
/// after it: the pod is not evicted after all).
pub fn clear_with_disruption_patch(
    pod: &Pod,
    id: &str,
    reason: &str,
) -> Result<json_patch::Patch, PatchError> {
    let mut operations = clear_operations(pod, id);
    if let Some(at) = disruption_mark_at(pod, reason) {
        let path = format!("/status/conditions/{at}");
        operations.extend([
            json!({"op": "test", "path": format!("{path}/type"), "value": DISRUPTION_TARGET}),
            json!({"op": "test", "path": format!("{path}/reason"), "value": reason}),
            json!({"op": "remove", "path": path}),
        ]);
    }
    encode(pod, operations)
}

/// Whether `pod` carries the `DisruptionTarget` condition with `reason` and is not terminating:
/// a mark to take back with the intent, since the pod is not evicted after all.
pub fn carries_disruption_mark(pod: &Pod, reason: &str) -> bool {
    pod.metadata.deletion_timestamp.is_none() && disruption_mark_at(pod, reason).is_some()
}

/// Whether somebody else marks `pod` for disruption now: a `DisruptionTarget` condition that is
/// `True` with a reason other than `reason`. Replacing it with ours would lose it for good if
/// the reclaim is abandoned (the take-back removes our mark), so the intent goes without ours.
/// A stale mark (`False`, as kube-controller-manager leaves one after two minutes) asserts
/// nothing and is replaced.
pub fn disrupted_by_another(pod: &Pod, reason: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.type_ == DISRUPTION_TARGET
                    && c.status == "True"
                    && c.reason.as_deref() != Some(reason)
            })
        })
}

/// Where in `pod`'s conditions the `DisruptionTarget` condition with `reason` is.
fn disruption_mark_at(pod: &Pod, reason: &str) -> Option<usize> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .position(|c| c.type_ == DISRUPTION_TARGET && c.reason.as_deref() == Some(reason))
}

/// Tests that `pod` carries reclaim `id`, then removes its annotations (those it shows).
fn clear_operations(pod: &Pod, id: &str) -> Vec<Value> {
    let present = pod.metadata.annotations.as_ref();
    let mut operations = vec![
        json!({"op": "test", "path": "/metadata/uid", "value": pod.metadata.uid}),
        json!({"op": "test", "path": annotation_path(annotations::RECLAIM_ID), "value": id}),
    ];
    for key in KEYS {
        if present.is_some_and(|notes| notes.contains_key(key)) {
            operations.push(json!({"op": "remove", "path": annotation_path(key)}));
        }
    }
    operations
}

/// Tests of the pod's identity and version, which the intent must be based on.
fn preconditions(pod: &Pod) -> Result<Vec<Value>, PatchError> {
    let version = pod
        .metadata
        .resource_version
        .as_ref()
        .ok_or_else(|| PatchError::Changed {
            pod: patch::describe(pod),
        })?;
    Ok(vec![
        json!({"op": "test", "path": "/metadata/uid", "value": pod.metadata.uid}),
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": version}),
    ])
}

/// Adds `notes`, creating the annotations map if the pod has none.
fn add_annotations(pod: &Pod, notes: &BTreeMap<&'static str, String>) -> Vec<Value> {
    if pod.metadata.annotations.is_none() {
        return vec![json!({"op": "add", "path": "/metadata/annotations", "value": notes})];
    }
    notes
        .iter()
        .map(|(key, value)| json!({"op": "add", "path": annotation_path(key), "value": value}))
        .collect()
}

fn annotation_path(key: &str) -> String {
    format!(
        "/metadata/annotations/{}",
        key.replace('~', "~0").replace('/', "~1")
    )
}

fn encode(pod: &Pod, operations: Vec<Value>) -> Result<json_patch::Patch, PatchError> {
    serde_json::from_value(Value::Array(operations)).map_err(|source| PatchError::Encode {
        pod: patch::describe(pod),
        source,
    })
}

#[cfg(test)]
mod tests {
    use gpuqueue_api::ADMISSION_GATE;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn pod(annotations: Option<Value>, gated: bool) -> Pod {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1", "resourceVersion": "42"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        });
        if gated {
            pod["spec"]["schedulingGates"] = json!([{"name": ADMISSION_GATE}]);
        }
        if let Some(annotations) = annotations {
            pod["metadata"]["annotations"] = annotations;
        }
        serde_json::from_value(pod).unwrap()
    }

    fn intent() -> Intent {
        Intent {
            id: "rc-1".into(),
            deadline: "2026-01-01T00:00:03.120Z".parse().unwrap(),
            node: "gpu-node-2".into(),
            victims: vec![VictimRef {
                pod: "batch/v-1".into(),
                uid: "uid-v1".into(),
                queue: "batch".into(),
            }],
        }
    }

    fn apply(pod: &Pod, patch: &json_patch::Patch) -> Result<Pod, json_patch::PatchError> {
        let mut document = serde_json::to_value(pod).unwrap();
        json_patch::patch(&mut document, patch)?;
        Ok(serde_json::from_value(document).unwrap())
    }

    #[test]
    fn a_victim_intent_is_read_back_as_written() {
        for existing in [None, Some(json!({"team": "b"}))] {
            let victim = pod(existing, false);
            let marked = apply(&victim, &victim_intent_patch(&victim, &intent()).unwrap()).unwrap();
            assert_eq!(
                Mark::read(&marked),
                Some(Mark {
                    id: "rc-1".into(),
                    role: Some(Role::Victim),
                    deadline: Some(intent().deadline),
                    node: Some("gpu-node-2".into()),
                    checkpoint_started: false,
                    victims: Vec::new(),
                })
            );
            assert_eq!(
                marked.metadata.annotations.unwrap()[annotations::RECLAIM_DEADLINE],
                "2026-01-01T00:00:03.120Z"
            );
        }
    }

    #[test]
    fn an_intent_is_refused_by_a_pod_that_changed_since_the_plan() {
        let seen = pod(None, false);
        let patch = victim_intent_patch(&seen, &intent()).unwrap();
        let mut newer = seen.clone();
        newer.metadata.resource_version = Some("43".into());
        assert!(apply(&newer, &patch).is_err());
        let mut namesake = seen;
        namesake.metadata.uid = Some("uid-2".into());
        assert!(apply(&namesake, &patch).is_err());
    }

    #[test]
    fn a_victims_disruption_mark_goes_with_its_intent_whatever_its_conditions() {
        let mark =
            json!({"type": DISRUPTION_TARGET, "status": "True", "reason": "PreemptionByGpuQueue"});
        let ready = json!({"type": "Ready", "status": "True"});
        let stale = json!({"type": DISRUPTION_TARGET, "status": "False", "reason": "EvictionByEvictionAPI"});
        let statuses = [
            None,
            Some(json!({})),
            Some(json!({"conditions": [ready.clone()]})),
            Some(json!({"conditions": [stale, ready]})),
        ];
        for status in statuses {
            let mut victim = pod(Some(json!({"team": "b"})), false);
            victim.status = status.map(|s| serde_json::from_value(s).unwrap());
            let patch = victim_intent_and_disruption_patch(&victim, &intent(), &mark).unwrap();
            let marked = apply(&victim, &patch).unwrap();
            assert_eq!(Mark::read(&marked).unwrap().role, Some(Role::Victim));
            let conditions = marked.status.unwrap().conditions.unwrap();
            let disruption: Vec<_> = conditions
                .iter()
                .filter(|c| c.type_ == DISRUPTION_TARGET)
                .map(|c| (c.status.as_str(), c.reason.as_deref()))
                .collect();
            assert_eq!(disruption, [("True", Some("PreemptionByGpuQueue"))]);
            assert!(conditions.len() <= 2, "{conditions:?}");
        }
        // Like the intent alone, it is refused by a pod that changed since the plan.
        let seen = pod(None, false);
        let patch = victim_intent_and_disruption_patch(&seen, &intent(), &mark).unwrap();
        let mut newer = seen;
        newer.metadata.resource_version = Some("43".into());
        assert!(apply(&newer, &patch).is_err());
    }

    #[test]
    fn only_somebody_elses_live_disruption_mark_is_left_in_place() {
        let with = |conditions: Value| {
            let mut victim = pod(None, false);
            victim.status =
                Some(serde_json::from_value(json!({"conditions": conditions})).unwrap());
            disrupted_by_another(&victim, "PreemptionByGpuQueue")
        };
        let condition = |status: &str, reason: &str| json!({"type": DISRUPTION_TARGET, "status": status, "reason": reason});
        assert!(with(json!([condition(
            "True",
            "PreemptionByKubeScheduler"
        )])));
        assert!(!with(json!([condition(
            "False",
            "PreemptionByKubeScheduler"
        )])));
        assert!(!with(json!([condition("True", "PreemptionByGpuQueue")])));
        assert!(!with(
            json!([{"type": "Ready", "status": "True", "reason": "x"}])
        ));
        assert!(!disrupted_by_another(
            &pod(None, false),
            "PreemptionByGpuQueue"
        ));
    }

    #[test]
    fn taking_back_a_marked_victim_removes_its_intent_and_only_our_disruption_mark() {
        let mark =
            json!({"type": DISRUPTION_TARGET, "status": "True", "reason": "PreemptionByGpuQueue"});
        let ready = json!({"type": "Ready", "status": "True"});
        for status in [None, Some(json!({"conditions": [ready.clone()]}))] {
            let mut victim = pod(Some(json!({"team": "b"})), false);
            victim.status = status.map(|s| serde_json::from_value(s).unwrap());
            let patch = victim_intent_and_disruption_patch(&victim, &intent(), &mark).unwrap();
            let marked = apply(&victim, &patch).unwrap();
            assert!(carries_disruption_mark(&marked, "PreemptionByGpuQueue"));
            let back = clear_with_disruption_patch(&marked, "rc-1", "PreemptionByGpuQueue");
            let cleared = apply(&marked, &back.unwrap()).unwrap();
            assert_eq!(Mark::read(&cleared), None);
            assert!(!carries_disruption_mark(&cleared, "PreemptionByGpuQueue"));
            let conditions = cleared
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default();
            assert!(
                conditions.iter().all(|c| c.type_ != DISRUPTION_TARGET),
                "{conditions:?}"
            );
            assert_eq!(conditions.len(), usize::from(victim.status.is_some()));
        }
        // Somebody else's mark is not ours to take back; another reclaim's victim is refused.
        let mut victim = pod(Some(json!({"team": "b"})), false);
        let theirs =
            json!({"type": DISRUPTION_TARGET, "status": "True", "reason": "EvictionByEvictionAPI"});
        victim.status = Some(serde_json::from_value(json!({"conditions": [theirs]})).unwrap());
        let marked = apply(&victim, &victim_intent_patch(&victim, &intent()).unwrap()).unwrap();
        assert!(!carries_disruption_mark(&marked, "PreemptionByGpuQueue"));
        let back = clear_with_disruption_patch(&marked, "rc-1", "PreemptionByGpuQueue").unwrap();
        let cleared = apply(&marked, &back).unwrap();
        assert_eq!(cleared.status, victim.status);
        let other = clear_with_disruption_patch(&marked, "rc-2", "PreemptionByGpuQueue").unwrap();
        assert!(apply(&marked, &other).is_err());
    }

    #[test]
    fn a_terminating_victims_mark_is_its_eviction_not_one_to_take_back() {
        let mark =
            json!({"type": DISRUPTION_TARGET, "status": "True", "reason": "PreemptionByGpuQueue"});
        let mut victim = pod(None, false);
        victim.status = Some(serde_json::from_value(json!({"conditions": [mark]})).unwrap());
        assert!(carries_disruption_mark(&victim, "PreemptionByGpuQueue"));
        victim.metadata.deletion_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
        assert!(!carries_disruption_mark(&victim, "PreemptionByGpuQueue"));
    }

    #[test]
    fn the_owner_is_marked_and_pinned_at_the_gate_and_released_later() {
        let owner = pod(Some(json!({"gpuqueue.io/waiting-reason": "x"})), true);
        let admission = patch::Admission {
            node_pin: "gpu-node-2",
            queue: "online",
            admitted_as: gpuqueue_core::model::AdmittedAs::Guaranteed.as_str(),
            at: "2026-01-01T00:00:00Z".parse().unwrap(),
            seal: None,
        };
        let held = apply(&owner, &owner_patch(&owner, &intent(), &admission).unwrap()).unwrap();
        let mark = Mark::read(&held).unwrap();
        assert_eq!(mark.role, Some(Role::Owner));
        assert_eq!(
            mark.victims,
            intent().victims,
            "the owner lists every victim"
        );
        assert!(gpuqueue_core::model::is_held_owner(&held));
        let spec = held.spec.as_ref().unwrap();
        assert_eq!(
            spec.node_selector.as_ref().unwrap()["kubernetes.io/hostname"],
            "gpu-node-2"
        );
        let notes = held.metadata.annotations.as_ref().unwrap();
        assert_eq!(notes[annotations::QUEUE], "online");
        assert!(!notes.contains_key(annotations::WAITING_REASON));

        let released = apply(&held, &patch::release_patch(&held).unwrap()).unwrap();
        assert!(!gpuqueue_core::model::is_gated(&released));
        assert_eq!(Mark::read(&released).unwrap().role, Some(Role::Owner));
        assert!(patch::release_patch(&released).is_err(), "released once");

        // Not gated any more (someone else released it): no intent, no admission.
        let ungated = pod(None, false);
        assert!(owner_patch(&ungated, &intent(), &admission).is_err());
    }

    #[test]
    fn progress_and_clearing_apply_only_to_this_reclaim() {
        let victim = pod(Some(json!({"team": "b"})), false);
        let marked = apply(&victim, &victim_intent_patch(&victim, &intent()).unwrap()).unwrap();
        let progressed = apply(&marked, &progress_patch(&marked, "rc-1").unwrap()).unwrap();
        assert!(Mark::read(&progressed).unwrap().checkpoint_started);
        assert!(
            apply(&marked, &progress_patch(&marked, "rc-2").unwrap()).is_err(),
            "another reclaim's victim"
        );
        // A pod read before another process marked it (a new leader's stale view) is not
        // marked again: the write tests the version read.
        let mut marked_since = progressed.clone();
        marked_since.metadata.resource_version = Some("43".into());
        assert!(apply(&marked_since, &progress_patch(&marked, "rc-1").unwrap()).is_err());
        let cleared = apply(&progressed, &clear_patch(&progressed, "rc-1").unwrap()).unwrap();
        assert_eq!(Mark::read(&cleared), None);
        assert_eq!(
            cleared.metadata.annotations.unwrap(),
            BTreeMap::from([("team".to_owned(), "b".to_owned())])
        );
        assert!(apply(&progressed, &clear_patch(&progressed, "rc-2").unwrap()).is_err());
    }

    #[test]
    fn ids_are_distinct() {
        let (a, b) = (new_id(), new_id());
        assert_ne!(a, b);
        assert!(a.starts_with("rc-") && a.len() == 19, "{a}");
    }
}
