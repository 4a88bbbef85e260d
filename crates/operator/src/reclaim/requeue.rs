//! An owner the handover freed a node for but kube-scheduler never bound (another pod took the
//! freed GPUs first: case 4 of the tenant review), or whose room will not be freed (a victim was
//! spared: [`super::recheck`]). Its node selector pins it to that node and can no longer be
//! undone, so it would stay Pending for good, and its node's deficit would keep every later
//! reclaim off that node.
//!
//! Such an owner is evicted: it never ran, so nothing is lost, and its controller creates it
//! again, gated, for the next pass to plan anew (on any node, from what is free then). An owner
//! no controller owns is left pinned (evicting it would delete it for good); the event says so
//! and what to do.

use std::time::Duration;

use gpuqueue_core::model::PodKey;
use k8s_openapi::api::core::v1::Pod;

use kube::Api;

use super::{
    evict::{self, Eviction},
    handover::Handover,
    reclaimer::Reclaimer,
};
use crate::{leader::Term, writes::events::Notice};

/// How many times the owner is read and its eviction tried while it keeps changing.
const REQUEUE_READS: usize = 3;

/// What became of an owner nobody bound.
#[derive(Debug, PartialEq, Eq)]
enum Requeue {
    /// Evicted: its controller creates it again, gated.
    Evicted,
    /// No controller would create it again: left pinned.
    NoController,
    /// Bound, gone or deleted meanwhile: nothing to do.
    Nothing,
    /// The Eviction API refused or failed.
    Refused(String),
}

/// Whether a controller (a ReplicaSet, a Job, a StatefulSet) creates `pod` again once it is
/// evicted.
fn has_controller(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.controller == Some(true))
}

/// Why an owner is planned anew.
#[derive(Debug, Clone, Copy)]
pub(super) enum Cause<'a> {
    /// kube-scheduler never bound it to the node freed for it.
    NotBound,
    /// A victim was spared (its queue no longer borrows it): the room it is pinned to is not
    /// freed.
    VictimSpared { victim: &'a PodKey, queue: &'a str },
}

impl Cause<'_> {
    /// The event's reason, and what happened, for `handover`.
    fn describe(self, handover: &Handover) -> (&'static str, String) {
        match self {
            Self::NotBound => (
                "OwnerNotBound",
                format!(
                    "another pod took the GPUs freed on node {} and this pod, pinned there, was never bound",
                    handover.node
                ),
            ),
            Self::VictimSpared { victim, queue } => (
                "VictimSpared",
                format!(
                    "victim {victim} was spared, its queue {queue} no longer borrowing it, so the room on node {} this pod is pinned to is not freed",
                    handover.node
                ),
            ),
        }
    }
}

impl Reclaimer {
    /// Evicts the owner of `handover` if kube-scheduler has not bound it, so that it is planned
    /// again (see the module documentation).
    pub(super) async fn requeue_unbound_owner(
        &self,
        term: &Term,
        handover: &Handover,
        cause: Cause<'_>,
    ) {
        let requeue = self.requeue(term, handover).await;
        let (reason, what) = cause.describe(handover);
        let id = &handover.id;
        let note = match &requeue {
            Requeue::Nothing => return,
            Requeue::Evicted => format!(
                "reclaim {id}: {what}; it is evicted so that its controller creates it again and the next pass plans for it anew"
            ),
            Requeue::NoController => format!(
                "reclaim {id}: {what}; no controller would create it again, so it stays pinned: delete and create it again to have it planned anew"
            ),
            Requeue::Refused(why) => format!(
                "reclaim {id}: {what}; evicting it so that it is planned anew failed: {why}"
            ),
        };
        tracing::warn!(reclaim = %handover.id, owner = %handover.owner.key, outcome = ?requeue, "{note}");
        self.events.send(
            handover.owner.reference.clone(),
            Notice {
                warning: true,
                reason,
                action: "Reclaim",
                note,
            },
        );
    }

    /// Evicts the owner while a fresh read shows it unbound, and only if it is still that pod
    /// (its `resourceVersion`): the store may lag a bind that came at the last moment, and a bound
    /// owner is running in its room, no longer one to plan anew (the soak caught the eviction of
    /// one bound as its handover gave up on it). A pod that changed meanwhile is read again.
    async fn requeue(&self, term: &Term, handover: &Handover) -> Requeue {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &handover.owner.key.namespace);
        for _ in 0..REQUEUE_READS {
            let owner = match pods.get_opt(&handover.owner.key.name).await {
                Ok(Some(owner)) if owner.metadata.uid.as_deref() == Some(&handover.owner.uid) => {
                    owner
                }
                Ok(_) => return Requeue::Nothing,
                Err(error) => return Requeue::Refused(format!("reading the pod: {error}")),
            };
            if !still_unbound(&owner) || !term.is_current() {
                return Requeue::Nothing;
            }
            if !has_controller(&owner) {
                return Requeue::NoController;
            }
            let target = evict::EvictionTarget {
                namespace: &handover.owner.key.namespace,
                name: &handover.owner.key.name,
                uid: &handover.owner.uid,
                grace: Duration::ZERO,
                unchanged_since: owner.metadata.resource_version.as_deref(),
            };
            match evict::try_evict(&self.client, &target).await {
                Ok(Eviction::Evicted { .. }) => return Requeue::Evicted,
                // Gone, or changed since the read (a conflict): read again.
                Ok(Eviction::AlreadyGone) => {}
                Ok(eviction) => return Requeue::Refused(eviction.outcome().to_owned()),
                Err(refusal) => return Requeue::Refused(refusal.message),
            }
        }
        Requeue::Refused(format!(
            "the pod changed under each of {REQUEUE_READS} reads"
        ))
    }
}

/// Whether an owner is still one to plan anew: neither bound nor being deleted.
fn still_unbound(owner: &Pod) -> bool {
    owner
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_none()
        && owner.metadata.deletion_timestamp.is_none()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_bound_or_deleted_owner_is_not_planned_anew() {
        let pod = |spec, deleted: bool| -> Pod {
            let mut meta = json!({"name": "o"});
            if deleted {
                meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            serde_json::from_value(json!({"metadata": meta, "spec": spec})).unwrap()
        };
        assert!(still_unbound(&pod(json!({"containers": []}), false)));
        assert!(!still_unbound(&pod(
            json!({"containers": [], "nodeName": "gpu-node-2"}),
            false
        )));
        assert!(!still_unbound(&pod(json!({"containers": []}), true)));
    }

    #[test]
    fn only_a_pod_a_controller_creates_again_is_evicted() {
        let pod = |owners| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "o", "ownerReferences": owners}}))
                .unwrap()
        };
        let reference = |controller| {
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u",
                   "controller": controller})
        };
        assert!(has_controller(&pod(json!([reference(true)]))));
        assert!(!has_controller(&pod(json!([reference(false)]))));
        assert!(!has_controller(&pod(json!([]))));
    }
}
