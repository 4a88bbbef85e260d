//! Stage 2 for DRA: adds what each pod's ResourceClaims charge to its requests, read from the
//! claim and class stores by the core's rules (`gpuqueue_core::model::dra`). A pending pod whose
//! claims cannot be counted leaves the model and waits at the gate, saying why: it is never
//! admitted uncounted. An admitted one keeps what it holds otherwise, and the problem is logged.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use gpuqueue_core::{
    model::{
        self,
        dra::{
            ALLOCATION_RESULTS_MAX, ClaimUser, DeviceClasses, Uncounted, add_requests,
            charged_claims, claim_names, claim_requests,
        },
    },
    quantity::ResourceName,
};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;

use crate::cluster::devices::DeviceStores;

/// A modelled pod that uses claims: its index in the model's pods, and its object.
pub type ClaimingPod = (usize, Arc<Pod>);

/// What the claims of one pod charge, by claim name.
struct Charges {
    index: usize,
    names: Vec<String>,
    by_claim: HashMap<String, Vec<model::GpuRequest>>,
}

/// Charges `claiming` pods (indices into `pods`) for their claims, each shared claim once.
/// Pending pods whose claims cannot be counted are moved from `pods` to `unreadable`; the
/// problems of admitted ones go to `problems`.
pub fn charge(
    pods: &mut Vec<model::Pod>,
    claiming: Vec<ClaimingPod>,
    nodes: &[model::Node],
    stores: &DeviceStores,
    (unreadable, problems): (&mut Vec<(Arc<Pod>, String)>, &mut Vec<String>),
) {
    if claiming.is_empty() {
        return;
    }
    let classes = DeviceClasses::from_k8s(stores.classes.state().iter().map(AsRef::as_ref));
    let most = most_devices(nodes);
    let most_devices = |resource: &ResourceName| {
        most.get(resource)
            .copied()
            .unwrap_or(ALLOCATION_RESULTS_MAX)
    };
    let mut read = Vec::new();
    let mut uncounted = Vec::new();
    for (index, pod) in claiming {
        match charges_of(&pod, stores, &classes, &most_devices) {
            Ok((names, by_claim)) => read.push(Charges {
                index,
                names,
                by_claim,
            }),
            Err(error) => {
                let reason = format!("pod {}: {error}", pods[index].key);
                if pods[index].is_admitted() {
                    problems.push(reason);
                } else {
                    unreadable.push((pod, reason));
                    uncounted.push(index);
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
    for (charges, claims) in read.iter().zip(charged) {
        let requests = &mut pods[charges.index].requests.gpus;
        for claim in claims {
            add_requests(requests, &charges.by_claim[&claim]);
        }
    }
    uncounted.sort_unstable();
    for index in uncounted.into_iter().rev() {
        pods.remove(index);
    }
}

/// The claims `pod` uses and what each charges, or why they cannot be counted.
fn charges_of(
    pod: &Pod,
    stores: &DeviceStores,
    classes: &DeviceClasses,
    most_devices: &dyn Fn(&ResourceName) -> u32,
) -> Result<(Vec<String>, HashMap<String, Vec<model::GpuRequest>>), Uncounted> {
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
        by_claim.insert(name.clone(), claim_requests(&claim, classes, most_devices)?);
    }
    Ok((names, by_claim))
}

/// The most devices of each GPU resource one node has: what `allocationMode: All` may take.
fn most_devices(nodes: &[model::Node]) -> BTreeMap<ResourceName, u32> {
    let mut most: BTreeMap<ResourceName, u32> = BTreeMap::new();
    for pool in nodes.iter().flat_map(|node| &node.pools) {
        let entry = most.entry(pool.resource.clone()).or_default();
        *entry = (*entry).max(pool.devices);
    }
    most
}
