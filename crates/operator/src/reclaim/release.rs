//! Releasing a reclaim's owner from the gate once its room is free: its own victims are gone,
//! and so are the victims of other reclaims on its node whose room it counts on (its
//! `awaits`, from the plan). Released earlier, kube-scheduler would try it on a node still
//! full: it would try again only after its backoff (in a burst, up to a second after the room
//! was free), or, for an owner that outranks a pod there, preempt for it, deleting pods the
//! plan did not choose with no checkpoint. Once the room is free it fits, and the scheduler
//! only binds it.
//!
//! A handover that ends without the room (a victim held by a finalizer, the deadline long
//! past) releases its owner anyway, to wait for the room as kube-scheduler's pending pod, unless
//! kube-scheduler would preempt for it there: that one stays at the gate.

use std::sync::Arc;
use std::time::Duration;

use gpuqueue_core::model::{PodKey, is_gated};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use super::{
    handover::{Handover, HandoverPod},
    intent::{Mark, Role},
    reclaimer::Reclaimer,
};
use crate::{leader::Term, writes::pod as patch};

/// How soon a failed release is tried again, unless the store changes first.
const RELEASE_RETRY: Duration = Duration::from_millis(250);

/// Whether a settling handover still has its owner to release.
pub(super) struct PendingRelease {
    pending: bool,
}

impl PendingRelease {
    /// For a handover whose owner the store shows at the gate (a resumed one may have been
    /// released by the previous leader).
    pub(super) fn of(reclaimer: &Reclaimer, handover: &Handover) -> Self {
        Self {
            pending: reclaimer
                .stored(&handover.owner)
                .is_some_and(|owner| is_gated(&owner)),
        }
    }

    /// At the end of the wait: whether the owner was still at the gate, its room never free.
    /// Such an owner, still there and `unbound`, is released to wait for its room as
    /// kube-scheduler's pending pod, unless kube-scheduler would preempt for it there.
    pub(super) async fn at_end(
        &mut self,
        reclaimer: &Reclaimer,
        term: &Term,
        handover: &Handover,
        unbound: bool,
    ) -> bool {
        let gated = self.pending;
        if gated && unbound && !handover.release.preempts {
            self.pending = !reclaimer.release_held_owner(term, handover).await;
        }
        gated
    }

    /// Releases the owner once its room is free, given that its own victims are `gone` (and
    /// their claims released); when that failed, when to try again.
    pub(super) async fn advance(
        &mut self,
        reclaimer: &Reclaimer,
        term: &Term,
        handover: &Handover,
        gone: bool,
        now: Instant,
    ) -> Option<Instant> {
        let free = room_is_free(gone, &handover.release.awaits, |pod| {
            reclaimer.holds_its_room(pod)
        });
        if !self.pending || !free {
            return None;
        }
        self.pending = !reclaimer.release_held_owner(term, handover).await;
        self.pending.then_some(now + RELEASE_RETRY)
    }
}

impl Reclaimer {
    /// Removes the held owner's gate; `true` once it is released (or no longer gated, or
    /// gone: the handover settles without it), `false` to try again.
    async fn release_held_owner(&self, term: &Term, handover: &Handover) -> bool {
        if !term.is_current() {
            return false;
        }
        let Some(owner) = self.stored(&handover.owner) else {
            return true;
        };
        if !is_gated(&owner) {
            return true;
        }
        let written = match patch::release_patch(&owner) {
            Ok(release) => self.patch_pod(&owner, release).await,
            Err(error) => Err(error),
        };
        match written {
            Ok(_) | Err(patch::PatchError::NotGated { .. }) => {
                tracing::info!(reclaim = %handover.id, owner = %handover.owner.key,
                    "owner released at the gate: its room is free");
                true
            }
            Err(error) => {
                tracing::warn!(reclaim = %handover.id, %error, "releasing the held owner failed; retrying");
                false
            }
        }
    }

    /// The pods of `keys` the store holds (one it does not is gone already).
    pub(super) fn awaited(&self, keys: &[PodKey]) -> Vec<HandoverPod> {
        keys.iter()
            .filter_map(|key| {
                let pod = self
                    .stores
                    .pods
                    .get(&ObjectRef::new(&key.name).within(&key.namespace))?;
                Some(HandoverPod::of(&pod))
            })
            .collect()
    }
}

/// Whether a held owner's room is free: its own victims are `gone`, and none of the victims
/// of other reclaims it `awaits` is still `present`.
fn room_is_free(
    gone: bool,
    awaits: &[HandoverPod],
    present: impl Fn(&HandoverPod) -> bool,
) -> bool {
    gone && !awaits.iter().any(present)
}

/// The pods of `pods` on `node` marked as some reclaim's victims, but for `own`: what a
/// resumed owner, whose plan is gone, waits for besides its own victims.
pub(super) fn victims_on(pods: &[Arc<Pod>], node: &str, own: &[HandoverPod]) -> Vec<HandoverPod> {
    pods.iter()
        .filter(|pod| {
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                && Mark::read(pod).is_some_and(|m| m.role == Some(Role::Victim))
                && own
                    .iter()
                    .all(|o| pod.metadata.uid.as_deref() != Some(o.uid.as_str()))
        })
        .map(|pod| HandoverPod::of(pod))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, node: &str, role: Option<&str>) -> Arc<Pod> {
        let annotations = role.map_or(
            json!({}),
            |role| json!({"gpuqueue.io/reclaim-id": "rc-1", "gpuqueue.io/reclaim-role": role}),
        );
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "batch", "uid": format!("uid-{name}"),
                             "annotations": annotations},
                "spec": {"nodeName": node, "containers": []},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn an_owner_waits_for_the_victims_it_awaits_as_well_as_its_own() {
        let other = HandoverPod::of(&pod("v-other", "n1", Some("victim")));
        let awaits = [other.clone()];
        // Its own victims are gone, but another reclaim's, whose room it counts on, is not.
        assert!(!room_is_free(true, &awaits, |p| p.uid == other.uid));
        assert!(room_is_free(true, &awaits, |_| false));
        assert!(!room_is_free(false, &awaits, |_| false));
        // No victims of its own and nothing awaited: free at once.
        assert!(room_is_free(true, &[], |_| true));
    }

    #[test]
    fn a_resumed_owner_awaits_the_marked_victims_on_its_node_but_its_own() {
        let pods = [
            pod("own", "n1", Some("victim")),
            pod("other", "n1", Some("victim")),
            pod("elsewhere", "n2", Some("victim")),
            pod("owner", "n1", Some("owner")),
            pod("unmarked", "n1", None),
        ];
        let own = [HandoverPod::of(&pods[0])];
        let awaited: Vec<String> = victims_on(&pods, "n1", &own)
            .into_iter()
            .map(|p| p.key.to_string())
            .collect();
        assert_eq!(awaited, ["batch/other"]);
    }
}
