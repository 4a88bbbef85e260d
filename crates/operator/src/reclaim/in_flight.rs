//! Reclaims in flight in operator-owned state: `status.reclaimsInFlight` of the owner's queue.
//! An entry is written before any pod of the reclaim is annotated and removed in the same
//! write as the owner's handover record ([`super::record`]), so the annotations a tenant can
//! write on its own pods are never the only evidence of a reclaim ([`super::trust`]).
//!
//! One write per owner queue and admission pass: the entries of every reclaim the pass starts
//! for the queue are appended together with a JSON patch (the API server applies it to the
//! newest object, so writers at once never conflict); only a queue without the list (it never
//! had a reclaim; removals leave it empty, not absent) gets a merge patch, with the queue's
//! `resourceVersion` as precondition. A burst of 22 owners thus costs one status write before
//! its intents, not 22 of the same queue, and a store that lags the admission loop's own status
//! write costs no conflict and no read.
//! Removal (after an abandon, or of an entry whose reclaim left nothing behind) reads the
//! status and writes the list without the entry, under the same precondition.

use gpuqueue_api::{
    FIELD_MANAGER,
    v1alpha1::{GpuQueue, MAX_RECLAIMS_IN_FLIGHT, ReclaimInFlight, VictimInFlight},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

use super::{
    handover::{Handover, HandoverPod},
    intent::Intent,
};

/// Conflicting writers of the same queue's list get this many tries: each conflict means
/// another writer's change landed, so every reclaim the list can hold gets its turn.
const ATTEMPTS: usize = MAX_RECLAIMS_IN_FLIGHT + 1;

/// Why an entry was not written or removed.
#[derive(Debug, thiserror::Error)]
pub enum InFlightError {
    #[error("recording reclaims {id} in GpuQueue {queue}'s status.reclaimsInFlight: {source}")]
    Api {
        queue: String,
        id: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "GpuQueue {queue} would have more than {MAX_RECLAIMS_IN_FLIGHT} reclaims in flight (status.reclaimsInFlight is full); reclaims {id} wait until some finish"
    )]
    Full { queue: String, id: String },
}

/// The entry of `handover`, as its owner queue's status records it.
pub fn entry_of(handover: &Handover) -> ReclaimInFlight {
    ReclaimInFlight {
        id: handover.id.clone(),
        owner_pod: handover.owner.key.to_string(),
        owner_uid: handover.owner.uid.clone(),
        node: handover.node.clone(),
        victims: handover
            .victims
            .iter()
            .map(|v| VictimInFlight {
                pod: v.target.key.to_string(),
                uid: v.target.uid.clone(),
                queue: v.queue.clone(),
            })
            .collect(),
        started_at: MicroTime(handover.timeline.started_at),
        deadline: MicroTime(handover.timeline.deadline_at()),
    }
}

/// The entry of a reclaim about to start: `intent` for `owner`, found blocked at `started_at`.
pub fn from_intent(
    intent: &Intent,
    owner: &HandoverPod,
    started_at: jiff::Timestamp,
) -> ReclaimInFlight {
    ReclaimInFlight {
        id: intent.id.clone(),
        owner_pod: owner.key.to_string(),
        owner_uid: owner.uid.clone(),
        node: intent.node.clone(),
        victims: intent
            .victims
            .iter()
            .map(|v| VictimInFlight {
                pod: v.pod.clone(),
                uid: v.uid.clone(),
                queue: v.queue.clone(),
            })
            .collect(),
        started_at: MicroTime(started_at),
        deadline: MicroTime(intent.deadline),
    }
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// Appends `entries` to queue `queue`'s `status.reclaimsInFlight`, in one write. `stored` is
/// the queue as the store shows it (its list and `resourceVersion` spare a read in the common
/// case).
pub async fn add(
    api: &Api<GpuQueue>,
    queue: &str,
    stored: Option<&GpuQueue>,
    entries: &[&ReclaimInFlight],
) -> Result<(), InFlightError> {
    let ids = entries
        .iter()
        .map(|e| e.id.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let error = |source| InFlightError::Api {
        queue: queue.to_owned(),
        id: ids.clone(),
        source,
    };
    let mut seen = stored.cloned();
    // The list stays (empty) once a queue had a reclaim: appending to it never conflicts with
    // another writer, whatever the store showed. Only a queue that never had one needs the
    // merge patch that creates the list.
    let mut list_exists = true;
    for attempt in 1..=ATTEMPTS {
        let current = match seen.take() {
            Some(current) => current,
            None => api.get_status(queue).await.map_err(error)?,
        };
        let listed = current
            .status
            .as_ref()
            .map_or(0, |s| s.reclaims_in_flight.len());
        if listed + entries.len() > MAX_RECLAIMS_IN_FLIGHT {
            return Err(InFlightError::Full {
                queue: queue.to_owned(),
                id: ids.clone(),
            });
        }
        let patch = if listed == 0 && !list_exists {
            Patch::Merge(json!({
                "metadata": {"resourceVersion": current.metadata.resource_version},
                "status": {"reclaimsInFlight": entries},
            }))
        } else {
            Patch::Json(
                serde_json::from_value(append_ops(entries))
                    .map_err(|e| error(kube::Error::SerdeError(e)))?,
            )
        };
        match api.patch_status(queue, &params(), &patch).await {
            Ok(_) => return Ok(()),
            // A stale `resourceVersion`, or no list to append to: read it again.
            Err(kube::Error::Api(status))
                if (status.code == 409 || status.code == 422) && attempt < ATTEMPTS =>
            {
                list_exists &= status.code != 422;
            }
            Err(source) => return Err(error(source)),
        }
    }
    unreachable!("the last attempt returns")
}

/// The JSON patch operations appending `entries` to a list that exists.
fn append_ops(entries: &[&ReclaimInFlight]) -> serde_json::Value {
    entries
        .iter()
        .map(|entry| json!({"op": "add", "path": "/status/reclaimsInFlight/-", "value": entry}))
        .collect()
}

/// Removes reclaim `id` from queue `queue`'s `status.reclaimsInFlight`, if it is there. A queue
/// that is gone has nothing to remove.
pub async fn remove(api: &Api<GpuQueue>, queue: &str, id: &str) -> Result<(), InFlightError> {
    let error = |source| InFlightError::Api {
        queue: queue.to_owned(),
        id: id.to_owned(),
        source,
    };
    for attempt in 1..=ATTEMPTS {
        let current = match api.get_status(queue).await {
            Ok(current) => current,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(source) => return Err(error(source)),
        };
        let listed = current
            .status
            .as_ref()
            .map(|s| s.reclaims_in_flight.as_slice())
            .unwrap_or_default();
        let Some(rest) = without(listed, id) else {
            return Ok(());
        };
        let body = json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "status": {"reclaimsInFlight": rest},
        });
        match api
            .patch_status(queue, &params(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < ATTEMPTS => {}
            Err(source) => return Err(error(source)),
        }
    }
    unreachable!("the last attempt returns")
}

/// `listed` without reclaim `id`; `None` when it is not there (nothing to write).
pub fn without(listed: &[ReclaimInFlight], id: &str) -> Option<Vec<ReclaimInFlight>> {
    listed
        .iter()
        .any(|e| e.id == id)
        .then(|| listed.iter().filter(|e| e.id != id).cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str) -> ReclaimInFlight {
        ReclaimInFlight {
            id: id.into(),
            owner_pod: "online/o".into(),
            owner_uid: "uid-o".into(),
            node: "gpu-node-1".into(),
            victims: vec![VictimInFlight {
                pod: "batch/v".into(),
                uid: "uid-v".into(),
                queue: "batch".into(),
            }],
            started_at: MicroTime("2026-01-01T00:00:00.120Z".parse().unwrap()),
            deadline: MicroTime("2026-01-01T00:00:03.120Z".parse().unwrap()),
        }
    }

    #[test]
    fn only_the_named_entry_is_removed_and_a_missing_one_writes_nothing() {
        let listed = [entry("rc-1"), entry("rc-2")];
        let rest = without(&listed, "rc-1").unwrap();
        assert_eq!(rest, vec![entry("rc-2")]);
        assert_eq!(without(&listed, "rc-3"), None);
    }

    #[test]
    fn a_batch_is_appended_in_one_patch_in_its_order() {
        let (a, b) = (entry("rc-1"), entry("rc-2"));
        let ops = append_ops(&[&a, &b]);
        assert_eq!(ops.as_array().unwrap().len(), 2);
        assert_eq!(ops[0]["path"], "/status/reclaimsInFlight/-");
        assert_eq!(ops[1]["value"]["id"], "rc-2");
    }

    #[test]
    fn an_entry_keeps_its_times_to_the_millisecond() {
        let written = serde_json::to_value(entry("rc-1")).unwrap();
        assert_eq!(written["deadline"], "2026-01-01T00:00:03.120000Z");
        assert_eq!(written["victims"][0]["queue"], "batch");
        let read: ReclaimInFlight = serde_json::from_value(written).unwrap();
        assert_eq!(read, entry("rc-1"));
    }
}
