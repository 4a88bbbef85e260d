//! Whether a PodDisruptionBudget guards a victim, from the operator's store of budgets: a
//! guarded victim goes through the Eviction API, which judges the budget; any other is deleted
//! directly ([`super::evict`]).
//!
//! The rule is the Eviction API's own: a budget guards the pods of its namespace its selector
//! matches; a budget without a selector guards none, an empty selector guards all. Where the
//! stores cannot tell (the budgets not listed yet, the victim not in the pod store or another
//! pod of its name, a selector the operator cannot read), the victim counts as guarded: the
//! Eviction API decides.

use k8s_openapi::api::{core::v1::Pod, policy::v1::PodDisruptionBudget};
use kube::{
    core::{Selector, SelectorExt},
    runtime::reflector::{ObjectRef, Store},
};

use gpuqueue_core::model::PodKey;

use super::evict::Guard;
use crate::cluster::stores::Stores;

/// The guard of the victim `key` with `uid`, as the stores show it now.
pub fn guard(stores: &Stores, key: &PodKey, uid: &str) -> Guard {
    let reference = ObjectRef::new(&key.name).within(&key.namespace);
    match stores.pods.get(&reference) {
        Some(pod)
            if stores.budgets_synced()
                && pod.metadata.uid.as_deref() == Some(uid)
                && !any_selects(&stores.budgets, &pod) =>
        {
            Guard::Unbudgeted
        }
        _ => Guard::Budgeted,
    }
}

/// Whether a budget of `pod`'s namespace selects it (or may: see the module documentation).
fn any_selects(budgets: &Store<PodDisruptionBudget>, pod: &Pod) -> bool {
    let namespace = pod.metadata.namespace.as_deref();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    budgets
        .state()
        .iter()
        .filter(|budget| budget.metadata.namespace.as_deref() == namespace)
        .any(|budget| {
            let Some(selector) = budget.spec.as_ref().and_then(|s| s.selector.clone()) else {
                return false;
            };
            Selector::try_from(selector)
                .ok()
                .is_none_or(|selector| selector.matches(&labels))
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cluster::testing::TestStores;

    fn key() -> PodKey {
        PodKey::new("batch", "b-0")
    }

    fn stores_with(budgets: &[serde_json::Value]) -> TestStores {
        let mut stores = TestStores::new();
        stores.add_pod(json!({
            "metadata": {"name": "b-0", "namespace": "batch", "uid": "u",
                         "labels": {"app": "b", "tier": "batch"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }));
        stores.budgets_listed();
        for budget in budgets {
            stores.add_budget(budget.clone());
        }
        stores
    }

    fn budget(
        name: &str,
        namespace: &str,
        selector: Option<serde_json::Value>,
    ) -> serde_json::Value {
        let mut budget = json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"maxUnavailable": 0},
        });
        if let Some(selector) = selector {
            budget["spec"]["selector"] = selector;
        }
        budget
    }

    #[test]
    fn a_victim_no_budget_selects_is_unbudgeted() {
        assert_eq!(
            guard(&stores_with(&[]).stores, &key(), "u"),
            Guard::Unbudgeted
        );
        let elsewhere = budget("everything", "online", Some(json!({})));
        let other_app = budget(
            "other-app",
            "batch",
            Some(json!({"matchLabels": {"app": "other"}})),
        );
        let no_selector = budget("no-selector", "batch", None);
        let stores = stores_with(&[elsewhere, other_app, no_selector]);
        assert_eq!(stores.stores.budgets.len(), 3);
        assert_eq!(guard(&stores.stores, &key(), "u"), Guard::Unbudgeted);
    }

    #[test]
    fn a_budget_that_selects_the_victim_or_may_leaves_it_to_the_eviction_api() {
        let selecting = [
            json!({}),
            json!({"matchLabels": {"app": "b"}}),
            json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["batch"]}]}),
            // Unreadable (In without values): the Eviction API decides.
            json!({"matchExpressions": [{"key": "tier", "operator": "In"}]}),
        ];
        for selector in selecting {
            let stores = stores_with(&[budget("pdb", "batch", Some(selector.clone()))]);
            assert_eq!(
                guard(&stores.stores, &key(), "u"),
                Guard::Budgeted,
                "{selector}"
            );
        }
        // A victim the store does not hold, or holds another pod of its name.
        let absent = PodKey::new("batch", "gone");
        assert_eq!(
            guard(&stores_with(&[]).stores, &absent, "u"),
            Guard::Budgeted
        );
        assert_eq!(
            guard(&stores_with(&[]).stores, &key(), "namesake"),
            Guard::Budgeted
        );
    }

    #[test]
    fn before_the_budgets_are_listed_every_victim_is_left_to_the_eviction_api() {
        let mut stores = TestStores::new();
        stores.add_pod(json!({
            "metadata": {"name": "b-0", "namespace": "batch", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }));
        assert_eq!(guard(&stores.stores, &key(), "u"), Guard::Budgeted);
    }
}
