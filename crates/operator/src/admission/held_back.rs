//! Owners whose reclaim failed to start, held back until [`RETRY_AFTER`] has passed. A failed
//! start leaves changes of its own behind (victims' intents written and taken back, its entry
//! added to and removed from the queue's status), and any change wakes the next pass: without
//! this, a write refused every time (an admission policy that forbids pinning the owner) would
//! be tried again, with every victim's writes, every few milliseconds.
//!
//! [`RETRY_AFTER`]: super::context::RETRY_AFTER

use std::collections::BTreeMap;

use gpuqueue_core::model::PodKey;
use tokio::time::Instant;

/// Each held-back owner, until when.
#[derive(Debug, Default)]
pub(super) struct HeldBack {
    until: BTreeMap<PodKey, Instant>,
}

impl HeldBack {
    /// Holds back the reclaims of `owner` until `until`; forgets the holds that ended by `now`.
    pub(super) fn hold(&mut self, owner: PodKey, now: Instant, until: Instant) {
        self.until.retain(|_, end| *end > now);
        self.until.insert(owner, until);
    }

    /// Whether the reclaims of `owner` are held back at `now`.
    pub(super) fn holds(&self, owner: &PodKey, now: Instant) -> bool {
        self.until.get(owner).is_some_and(|until| *until > now)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_held_owner_is_held_until_its_hold_ends_and_no_other_is() {
        let now = Instant::now();
        let mut held = HeldBack::default();
        let refused = PodKey::new("online", "refused");
        held.hold(refused.clone(), now, now + Duration::from_secs(2));

        let soon = now + Duration::from_millis(5);
        assert!(held.holds(&refused, soon));
        assert!(!held.holds(&PodKey::new("online", "other"), soon));
        assert!(!held.holds(&refused, now + Duration::from_secs(2)));
    }

    #[test]
    fn holding_again_moves_the_end_and_ended_holds_are_forgotten() {
        let now = Instant::now();
        let mut held = HeldBack::default();
        let refused = PodKey::new("online", "refused");
        held.hold(refused.clone(), now, now + Duration::from_secs(2));
        held.hold(refused.clone(), now, now + Duration::from_secs(4));
        assert!(held.holds(&refused, now + Duration::from_secs(3)));

        let later = now + Duration::from_secs(5);
        held.hold(PodKey::new("online", "other"), later, later);
        assert_eq!(held.until.len(), 1, "{held:?}");
    }
}
