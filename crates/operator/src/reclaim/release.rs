//! Releasing an owner held at the gate ([`OwnerRelease::OnceRoomIsFree`]) once its room is
//! free. Released earlier, an owner that outranks a pod on its node would have kube-scheduler
//! preempt for it while its victims are still there: pods deleted with no checkpoint, chosen by
//! the scheduler rather than by the plan. Once the room is free it fits, and the scheduler only
//! binds it.

use std::time::Duration;

use gpuqueue_core::{model::is_gated, reclaim::OwnerRelease};
use tokio::time::Instant;

use super::{
    handover::Handover,
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
    pub(super) fn of(handover: &Handover) -> Self {
        Self {
            pending: handover.owner_release == OwnerRelease::OnceRoomIsFree,
        }
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
        if !self.pending || !reclaimer.room_is_free(handover, gone) {
            return None;
        }
        self.pending = !reclaimer.release_held_owner(term, handover).await;
        self.pending.then_some(now + RELEASE_RETRY)
    }
}

impl Reclaimer {
    /// Whether the held owner's room is free, given that its own victims are `gone`: an
    /// owner of a burst without victims of its own waits until no victim of any reclaim is
    /// left on its node.
    fn room_is_free(&self, handover: &Handover, gone: bool) -> bool {
        gone && (!handover.victims.is_empty() || !self.victims_left_on(&handover.node))
    }

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

    /// Whether a pod marked as some reclaim's victim is still on `node`.
    fn victims_left_on(&self, node: &str) -> bool {
        self.stores.pods.state().iter().any(|pod| {
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                && Mark::read(pod).is_some_and(|m| m.role == Some(Role::Victim))
        })
    }
}
