//! Phase 1 (observe) for DRA: adds what each pod's ResourceClaims charge to its requests, read
//! from the claim and class stores by the core's rules (`gpuqueue_core::model::dra`). A pending
//! pod whose claims cannot be counted leaves the model and waits at the gate, saying why: it is
//! never admitted uncounted. An admitted one keeps what it holds otherwise, and the problem is
//! logged.
//!
//! A pending pod's claim counts only once it carries the operator's finalizer ([`guard`] puts
//! it there, and takes it off a deleted claim no waiting pod names), so the claim
//! kube-scheduler allocates is the one counted.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use gpuqueue_core::{
    model::{
        self,
        dra::{
            ALLOCATION_RESULTS_MAX, ClaimCharge, ClaimUser, ClaimUsers, DeviceClasses, Uncounted,
            add_requests, charged_claims, claim_names, claim_requests, claim_sharers, countable,
            joining_freed_claims, mark_changes,
        },
    },
    quantity::ResourceName,
};
use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::{Api, runtime::reflector::ObjectRef};
use tokio::task::JoinSet;

use super::context::{Shared, WriteResult};
use crate::{
    cluster::devices::DeviceStores,
    writes::claim::{ClaimWriteError, write_mark},
};

/// A modelled pod that uses claims: its index in the model's pods, and its object.
pub type ClaimingPod = (usize, Arc<Pod>);

/// What each claim of a pod charges, by claim name.
type ByClaim = HashMap<String, ClaimCharge>;

/// What the claims of one pod charge.
struct Charges {
    index: usize,
    object: Arc<Pod>,
    names: Vec<String>,
    by_claim: ByClaim,
}

/// Charges `claiming` pods (indices into `pods`) for their claims, each shared claim once.
/// Pending pods whose claims cannot be counted are moved from `pods` to `unreadable`; the
/// problems of admitted ones go to `problems`.
pub fn charge(
    pods: &mut Vec<Arc<model::Pod>>,
    claiming: Vec<ClaimingPod>,
    (nodes, stores, classes): (&[Arc<model::Node>], &DeviceStores, &DeviceClasses),
    (unreadable, problems): (&mut Vec<(Arc<Pod>, String)>, &mut Vec<String>),
) {
    if claiming.is_empty() {
        return;
    }
    let most = most_devices(nodes);
    let most_devices = |resource: &ResourceName| {
        most.get(resource)
            .copied()
            .unwrap_or(ALLOCATION_RESULTS_MAX)
    };
    let mut read = Vec::new();
    let mut uncounted = Vec::new();
    for (index, pod) in claiming {
        let pending = !pods[index].is_admitted();
        match charges_of(&pod, pending, stores, classes, &most_devices) {
            Ok((names, by_claim)) => read.push(Charges {
                index,
                object: pod,
                names,
                by_claim,
            }),
            Err(error) => {
                let reason = format!("pod {}: {error}", pods[index].key);
                if pending {
                    unreadable.push((pod, reason));
                    uncounted.push(index);
                } else {
                    problems.push(reason);
                }
            }
        }
    }
    let users: Vec<ClaimUser<'_>> = read
        .iter()
        .map(|charges| ClaimUser {
            pod: &pods[charges.index].key,
            admitted: pods[charges.index].is_admitted(),
            claims: &charges.names,
        })
        .collect();
    let charged = charged_claims(&users);
    let sharers = claim_sharers(&users, &charged);
    let leaving: Vec<bool> = read
        .iter()
        .map(|c| pods[c.index].is_reclaim_victim())
        .collect();
    for (i, claim) in joining_freed_claims(&users, &charged, &leaving) {
        let joiner = &read[i];
        let reason = format!(
            "pod {}: ResourceClaim {claim} is being freed: a reclaim evicts the pod it is charged \
             to, and the pod waits until that one is gone",
            pods[joiner.index].key
        );
        unreadable.push((joiner.object.clone(), reason));
        uncounted.push(joiner.index);
    }
    for ((charges, claims), sharers) in read.iter().zip(charged).zip(sharers) {
        let pod = Arc::make_mut(&mut pods[charges.index]);
        for claim in claims {
            let charge = &charges.by_claim[&claim];
            add_requests(&mut pod.requests.gpus, &charge.placed);
            add_requests(&mut pod.requests.quota_only, &charge.quota_only);
        }
        pod.claim_sharers = sharers;
    }
    uncounted.sort_unstable();
    for index in uncounted.into_iter().rev() {
        pods.remove(index);
    }
}

/// The claims `pod` uses and what each charges, or why they cannot be counted. A `pending`
/// pod counts only marked claims not being deleted (an admitted one holds what it was counted).
fn charges_of(
    pod: &Pod,
    pending: bool,
    stores: &DeviceStores,
    classes: &DeviceClasses,
    most_devices: &dyn Fn(&ResourceName) -> u32,
) -> Result<(Vec<String>, ByClaim), Uncounted> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let names = claim_names(pod)?;
    let mut by_claim = HashMap::new();
    for name in &names {
        let Some(claim) = stores.claims.get(&ObjectRef::new(name).within(namespace)) else {
            return Err(Uncounted {
                field: "spec.resourceClaims".into(),
                rule: format!(
                    "ResourceClaim {name} does not exist yet; the pod waits until it is created"
                ),
            });
        };
        if pending {
            countable(&claim)?;
        }
        by_claim.insert(name.clone(), claim_requests(&claim, classes, most_devices)?);
    }
    Ok((names, by_claim))
}

/// Marks the claims gated pods use and lets go of deleted ones no waiting pod names (see
/// `gpuqueue_core::model::dra::mark_changes`): one background write per claim, none while one
/// to the same claim is in flight.
pub(super) fn guard(shared: &Shared, tasks: &mut JoinSet<()>) {
    let stores = &shared.context.stores;
    let claims = stores.devices.claims.state();
    if claims.is_empty() {
        return;
    }
    let pods = stores.pods.state();
    let users = ClaimUsers::of(pods.iter().map(AsRef::as_ref));
    for (claim, change) in mark_changes(claims.iter().map(AsRef::as_ref), &users) {
        let Some(uid) = claim.metadata.uid.clone() else {
            continue;
        };
        if !shared.assumed().begin(&uid) {
            continue;
        }
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let api: Api<ResourceClaim> = Api::namespaced(shared.context.client.clone(), &namespace);
        let claim = claim.clone();
        let context = shared.context.clone();
        shared.spawn(tasks, uid, async move {
            match write_mark(&api, &claim, change).await {
                Ok(()) => WriteResult::Done,
                Err(error @ ClaimWriteError::Changed { .. }) => {
                    tracing::debug!(%error, "claim finalizer not written");
                    WriteResult::Stale
                }
                Err(error) => {
                    context.metrics.apply_failed("claim_api");
                    tracing::warn!(%error, "writing a claim's finalizer failed; retrying");
                    WriteResult::Failed
                }
            }
        });
    }
}

/// The most devices of each GPU resource one node has: what `allocationMode: All` may take.
fn most_devices(nodes: &[Arc<model::Node>]) -> BTreeMap<ResourceName, u32> {
    let mut most: BTreeMap<ResourceName, u32> = BTreeMap::new();
    for pool in nodes.iter().flat_map(|node| &node.pools) {
        let entry = most.entry(pool.resource.clone()).or_default();
        *entry = (*entry).max(pool.devices);
    }
    most
}

#[cfg(test)]
mod tests {
    use gpuqueue_core::model::{Assignment, GpuRequest, PodKey, PodState, Requests};
    use kube::runtime::watcher;
    use serde_json::json;

    use super::*;
    use crate::cluster::testing::TestStores;

    fn k8s_pod(name: &str, claim: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "team"},
                "spec": {"containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
            }))
            .unwrap(),
        )
    }

    /// Charges `claiming` with no node in the snapshot: the pods that cannot be counted, and
    /// the claims' problems.
    fn charge_on_no_nodes(
        pods: &mut Vec<Arc<model::Pod>>,
        claiming: Vec<ClaimingPod>,
        stores: &TestStores,
    ) -> (Vec<(Arc<Pod>, String)>, Vec<String>) {
        let (mut unreadable, mut problems) = (Vec::new(), Vec::new());
        let classes = DeviceClasses::from_k8s(
            stores
                .stores
                .devices
                .classes
                .state()
                .iter()
                .map(AsRef::as_ref),
        );
        charge(
            pods,
            claiming,
            (&[], &stores.stores.devices, &classes),
            (&mut unreadable, &mut problems),
        );
        (unreadable, problems)
    }

    fn stores() -> TestStores {
        let mut stores = TestStores::new();
        let class = serde_json::from_value(json!({"metadata": {"name": "gpu.nvidia.com"},
            "spec": {"extendedResourceName": "nvidia.com/gpu"}}))
        .unwrap();
        stores
            .devices
            .classes
            .apply_watcher_event(&watcher::Event::Apply(class));
        let claim = serde_json::from_value(json!({"metadata": {"name": "shared", "namespace": "team",
                "finalizers": [model::dra::CHARGED_FINALIZER]},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}))
        .unwrap();
        stores
            .devices
            .claims
            .apply_watcher_event(&watcher::Event::Apply(claim));
        stores
    }

    #[test]
    fn a_pending_pod_waits_for_the_mark_and_an_admitted_one_keeps_its_charge() {
        let mut stores = stores();
        let unmarked = serde_json::from_value(json!({"metadata": {"name": "plain", "namespace": "team"},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}))
        .unwrap();
        stores
            .devices
            .claims
            .apply_watcher_event(&watcher::Event::Apply(unmarked));
        let mut admitted = model::Pod::new(
            PodKey::new("team", "ran"),
            Requests::default(),
            jiff::Timestamp::UNIX_EPOCH,
        );
        admitted.state = PodState::Admitted(Assignment::default());
        let pending = model::Pod::new(
            PodKey::new("team", "new"),
            Requests::default(),
            jiff::Timestamp::UNIX_EPOCH,
        );
        let mut pods = vec![Arc::new(admitted), Arc::new(pending)];
        let claiming = vec![(0, k8s_pod("ran", "plain")), (1, k8s_pod("new", "plain"))];
        let (unreadable, problems) = charge_on_no_nodes(&mut pods, claiming, &stores);
        assert_eq!(pods.len(), 1);
        assert_eq!(
            pods[0].requests.gpus,
            vec![GpuRequest::devices("nvidia.com/gpu", 1)]
        );
        assert_eq!(unreadable.len(), 1);
        assert!(
            unreadable[0].1.contains("gpuqueue.io/charged"),
            "{}",
            unreadable[0].1
        );
        assert!(problems.is_empty());
    }

    #[test]
    fn a_first_available_claim_holds_its_other_alternatives_in_quota_only() {
        let mut stores = stores();
        let mig = serde_json::from_value(json!({"metadata": {"name": "mig.nvidia.com",
                "annotations": {gpuqueue_api::annotations::QUOTA_RESOURCE: "nvidia.com/mig-1g.10gb"}},
            "spec": {}}))
        .unwrap();
        stores
            .devices
            .classes
            .apply_watcher_event(&watcher::Event::Apply(mig));
        let either =
            serde_json::from_value(json!({"metadata": {"name": "either", "namespace": "team",
                "finalizers": [model::dra::CHARGED_FINALIZER]},
            "spec": {"devices": {"requests": [{"name": "g", "firstAvailable": [
                {"name": "whole", "deviceClassName": "gpu.nvidia.com"},
                {"name": "slices", "deviceClassName": "mig.nvidia.com", "count": 3}]}]}}}))
            .unwrap();
        stores
            .devices
            .claims
            .apply_watcher_event(&watcher::Event::Apply(either));
        let pending = model::Pod::new(
            PodKey::new("team", "p"),
            Requests::default(),
            jiff::Timestamp::UNIX_EPOCH,
        );
        let mut pods = vec![Arc::new(pending)];
        let (unreadable, problems) =
            charge_on_no_nodes(&mut pods, vec![(0, k8s_pod("p", "either"))], &stores);
        assert!(unreadable.is_empty() && problems.is_empty());
        assert_eq!(
            pods[0].requests.gpus,
            vec![GpuRequest::devices("nvidia.com/mig-1g.10gb", 3)]
        );
        assert_eq!(
            pods[0].requests.quota_only,
            vec![GpuRequest::devices("nvidia.com/gpu", 1)]
        );
    }

    #[test]
    fn a_pending_pod_waits_while_a_reclaim_frees_the_claim_it_names() {
        let stores = stores();
        let mut victim = model::Pod::new(
            PodKey::new("team", "victim"),
            Requests::default(),
            jiff::Timestamp::UNIX_EPOCH,
        );
        victim.state = PodState::Admitted(Assignment::default());
        victim.reclaim = Some(model::ReclaimMark {
            id: "rc-1".into(),
            role: model::ReclaimRole::Victim,
        });
        let joiner = model::Pod::new(
            PodKey::new("team", "joiner"),
            Requests::default(),
            jiff::Timestamp::UNIX_EPOCH,
        );
        let mut pods = vec![Arc::new(victim), Arc::new(joiner)];
        let claiming = vec![
            (0, k8s_pod("victim", "shared")),
            (1, k8s_pod("joiner", "shared")),
        ];
        let (unreadable, problems) = charge_on_no_nodes(&mut pods, claiming, &stores);
        assert!(problems.is_empty());
        assert_eq!(pods.len(), 1, "the joiner waits out of the model");
        assert_eq!(unreadable.len(), 1);
        assert!(
            unreadable[0]
                .1
                .contains("ResourceClaim shared is being freed"),
            "{}",
            unreadable[0].1
        );
    }

    #[test]
    fn a_shared_claim_is_charged_to_its_admitted_user_and_a_missing_one_waits() {
        let stores = stores();
        let model = |name: &str, admitted: bool| {
            let mut pod = model::Pod::new(
                PodKey::new("team", name),
                Requests::default(),
                jiff::Timestamp::UNIX_EPOCH,
            );
            if admitted {
                pod.state = PodState::Admitted(Assignment::default());
            }
            Arc::new(pod)
        };
        let mut pods = vec![model("a", false), model("b", true), model("c", false)];
        let claiming = vec![
            (0, k8s_pod("a", "shared")),
            (1, k8s_pod("b", "shared")),
            (2, k8s_pod("c", "missing")),
        ];
        let (unreadable, problems) = charge_on_no_nodes(&mut pods, claiming, &stores);
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0].requests.gpus, Vec::<GpuRequest>::new());
        assert_eq!(
            pods[1].requests.gpus,
            vec![GpuRequest::devices("nvidia.com/gpu", 2)]
        );
        assert_eq!(unreadable.len(), 1);
        assert!(
            unreadable[0]
                .1
                .contains("ResourceClaim missing does not exist yet"),
            "{}",
            unreadable[0].1
        );
        assert!(problems.is_empty());
    }
}
