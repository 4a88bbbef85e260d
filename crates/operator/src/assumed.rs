//! Writes the stores have not caught up with yet.
//!
//! After the operator releases a gate, its pod store shows the pod gated until the watch
//! delivers the change, typically milliseconds later. A pass that ran in between would see the
//! pod still waiting and its GPUs still free, and could admit another pod into them: the
//! over-admission Kueue hit when its cache and the API disagreed (kubernetes-sigs/kueue#11480).
//! So, like kube-scheduler's "assumed" pods, the pod as the API server returned it from the
//! patch stands in for the stored one until the store shows the gate gone (or the pod gone).
//!
//! The same holds for the waiting reasons written this term: the last one written is
//! remembered until the store shows it, so a lagging store does not cause a second event.

use std::collections::HashMap;

use gpuqueue_api::{ADMISSION_GATE, annotations};
use k8s_openapi::api::core::v1::Pod;

/// Pods admitted and reasons recorded by this process whose watch events have not arrived.
#[derive(Debug, Default)]
pub struct Assumed {
    admitted: HashMap<String, Pod>,
    reasons: HashMap<String, Option<String>>,
}

impl Assumed {
    /// Remembers `pod` as the API server returned it from the admission patch.
    pub fn admitted(&mut self, pod: Pod) {
        if let Some(uid) = pod.metadata.uid.clone() {
            self.reasons.remove(&uid);
            self.admitted.insert(uid, pod);
        }
    }

    /// Remembers the waiting reason written on the pod with `uid` (`None`: cleared).
    pub fn reason_recorded(&mut self, uid: &str, reason: Option<String>) {
        self.reasons.insert(uid.to_owned(), reason);
    }

    /// The pod to decide with: the admitted version while the store still shows `stored`
    /// gated, else `stored` itself.
    pub fn view<'a>(&'a self, stored: &'a Pod) -> &'a Pod {
        stored
            .metadata
            .uid
            .as_ref()
            .and_then(|uid| self.admitted.get(uid))
            .filter(|_| is_gated(stored))
            .unwrap_or(stored)
    }

    /// The waiting reason the pod carries, as far as this process knows.
    pub fn waiting_reason<'a>(&'a self, stored: &'a Pod) -> Option<&'a str> {
        let recorded = stored
            .metadata
            .uid
            .as_ref()
            .and_then(|uid| self.reasons.get(uid));
        match recorded {
            Some(reason) => reason.as_deref(),
            None => stored
                .metadata
                .annotations
                .as_ref()
                .and_then(|notes| notes.get(annotations::WAITING_REASON))
                .map(String::as_str),
        }
    }

    /// Forgets what the store now shows, and pods that are gone. `stored` is every pod of the
    /// store.
    pub fn settle<'a>(&mut self, stored: impl IntoIterator<Item = &'a Pod>) {
        let mut still_lagging_admissions = HashMap::new();
        let mut still_lagging_reasons = HashMap::new();
        for pod in stored {
            let Some(uid) = pod.metadata.uid.as_ref() else {
                continue;
            };
            if is_gated(pod)
                && let Some(admitted) = self.admitted.remove(uid)
            {
                still_lagging_admissions.insert(uid.clone(), admitted);
            }
            if let Some(reason) = self.reasons.remove(uid) {
                let shown = pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|notes| notes.get(annotations::WAITING_REASON));
                if shown != reason.as_ref() {
                    still_lagging_reasons.insert(uid.clone(), reason);
                }
            }
        }
        self.admitted = still_lagging_admissions;
        self.reasons = still_lagging_reasons;
    }

    /// How many admissions the store has not shown yet.
    pub fn lagging_admissions(&self) -> usize {
        self.admitted.len()
    }
}

fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.scheduling_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|gate| gate.name == ADMISSION_GATE))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(uid: &str, gated: bool, reason: Option<&str>) -> Pod {
        let gate_list: Vec<_> = if gated {
            vec![json!({"name": ADMISSION_GATE})]
        } else {
            vec![]
        };
        let mut pod = json!({
            "metadata": {"name": uid, "namespace": "batch", "uid": uid},
            "spec": {"containers": [], "schedulingGates": gate_list},
        });
        if let Some(reason) = reason {
            pod["metadata"]["annotations"] = json!({annotations::WAITING_REASON: reason});
        }
        serde_json::from_value(pod).unwrap()
    }

    #[test]
    fn an_admitted_pod_stands_in_until_the_store_catches_up() {
        let mut assumed = Assumed::default();
        let stored = pod("a", true, None);
        assumed.admitted(pod("a", false, None));
        assert!(
            !is_gated(assumed.view(&stored)),
            "the store lags: the admitted version is used"
        );
        assumed.settle([&stored]);
        assert_eq!(assumed.lagging_admissions(), 1);

        let caught_up = pod("a", false, None);
        assumed.settle([&caught_up]);
        assert_eq!(assumed.lagging_admissions(), 0);
        assert!(std::ptr::eq(assumed.view(&caught_up), &raw const caught_up));
    }

    #[test]
    fn a_deleted_pod_is_forgotten() {
        let mut assumed = Assumed::default();
        assumed.admitted(pod("a", false, None));
        assumed.reason_recorded("b", Some("full".into()));
        assumed.settle([]);
        assert_eq!(assumed.lagging_admissions(), 0);
        assert_eq!(assumed.waiting_reason(&pod("b", true, None)), None);
    }

    #[test]
    fn a_namesake_is_not_mistaken_for_the_admitted_pod() {
        let mut assumed = Assumed::default();
        assumed.admitted(pod("a", false, None));
        let namesake = pod("a2", true, None);
        assert!(is_gated(assumed.view(&namesake)));
    }

    #[test]
    fn the_recorded_reason_wins_until_the_store_shows_it() {
        let mut assumed = Assumed::default();
        let stored = pod("a", true, Some("old reason"));
        assert_eq!(assumed.waiting_reason(&stored), Some("old reason"));
        assumed.reason_recorded("a", Some("new reason".into()));
        assert_eq!(assumed.waiting_reason(&stored), Some("new reason"));
        assumed.settle([&stored]);
        assert_eq!(
            assumed.waiting_reason(&stored),
            Some("new reason"),
            "store still lags"
        );
        let caught_up = pod("a", true, Some("new reason"));
        assumed.settle([&caught_up]);
        assert_eq!(assumed.waiting_reason(&caught_up), Some("new reason"));
        // Cleared, and the store not yet showing it.
        assumed.reason_recorded("a", None);
        assert_eq!(assumed.waiting_reason(&caught_up), None);
    }
}
