//! DRA claims as quota: which DeviceClasses hold GPUs and under which quota resource, and what
//! a pod's ResourceClaims charge, so that a pod asking for devices through
//! `spec.resourceClaims` is counted like one asking through `resources.limits`.
//!
//! The mapping lives on the DeviceClass, a cluster-scoped object only an administrator writes
//! (a tenant with `edit` cannot): its `spec.extendedResourceName` when that names a GPU
//! resource (the 1.36 extended-resource bridge says the class *is* that resource), else the
//! `gpuqueue.io/quota-resource` annotation (one class per MIG profile, as NVIDIA's driver
//! demos ship them). A class that may select GPUs but maps to nothing cannot be counted, and
//! its pods wait saying so: one that names GPUs (`gpu` or `mig` in its name or selectors), and
//! one without a selector, which selects every device, GPUs included (a claim's own selectors
//! then pick the GPUs). A class of other devices (NICs, FPGAs) is not charged; an
//! administrator says so of a class the look cannot tell with the annotation's value `none`.
//!
//! Claims are counted from the ResourceClaim object only, never from its template: a template
//! can be edited after the pod is admitted, the claim kube-controller-manager generated from
//! it cannot (claim specs are immutable).
//!
//! A claim's spec cannot change, but a tenant with `edit` can delete the claim and create a
//! larger one under the same name between the gate's release and the pod's scheduling. So a
//! waiting pod's claim is counted only once it carries [`CHARGED_FINALIZER`] and is not being
//! deleted: deleting it then leaves it `Terminating` under its name, which kube-scheduler's DRA
//! plugin refuses to allocate, and the finalizer goes only when no pod waiting to be scheduled
//! names it ([`mark_changes`]). A policy (`config/policy/claim_updates.yaml`) keeps anyone but
//! the operator from removing it.

use std::collections::{BTreeMap, BTreeSet};

use gpuqueue_api::annotations;
use k8s_openapi::api::{core::v1 as core, resource::v1 as dra};

use super::node::MAX_DEVICES_PER_POOL;
use super::pod::{GpuRequest, Pod, PodKey, has_finished, is_gated, uses_resource_claims};
use crate::quantity::{DEVICE_CLASS_PREFIX, ResourceName, is_gpu_resource};

/// What `allocationMode: All` is charged when no node shows how many devices it could take:
/// the most devices one claim may be allocated (`AllocationResultsMaxSize`), as ResourceQuota
/// charges it.
pub const ALLOCATION_RESULTS_MAX: u32 = 32;

/// The finalizer on each ResourceClaim a waiting pod uses, put there before the claim is
/// counted: while it is there, the claim's name cannot be given to another claim.
pub const CHARGED_FINALIZER: &str = "gpuqueue.io/charged";

/// Names in a class that mark it as one of GPUs (driver domains and KAI's own rule, a name
/// containing "gpu"), so that an unmapped one is refused rather than left uncounted.
const GPU_MARKERS: &[&str] = &["gpu", "mig"];

/// How a DeviceClass is charged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClassRole {
    /// Its devices are charged as this GPU resource, one device each.
    Counted(ResourceName),
    /// Not GPUs: left to kube-scheduler, charged nothing.
    NotGpu,
    /// A GPU class with no quota resource: its claims cannot be counted.
    Unmapped,
}

/// The cluster's DeviceClasses, by name, as quota sees them, and the extended resources they
/// declare (`spec.extendedResourceName`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceClasses {
    roles: BTreeMap<String, ClassRole>,
    /// The class each declared extended resource asks for.
    declared: BTreeMap<String, String>,
}

impl DeviceClasses {
    pub fn from_k8s<'a>(classes: impl IntoIterator<Item = &'a dra::DeviceClass>) -> Self {
        let mut by_age: Vec<&dra::DeviceClass> = classes.into_iter().collect();
        // When two classes declare one name, the newest wins, as in kube-scheduler (KEP-5004).
        by_age.sort_by_key(|class| {
            (
                class.metadata.creation_timestamp.clone().map(|t| t.0),
                class.metadata.name.clone(),
            )
        });
        let mut catalogue = Self::default();
        for class in by_age {
            let name = class.metadata.name.clone().unwrap_or_default();
            if let Some(declared) = &class.spec.extended_resource_name {
                catalogue.declared.insert(declared.clone(), name.clone());
            }
            catalogue.roles.insert(name, role_of(class));
        }
        catalogue
    }

    /// Adds one class (tests and the simulator build catalogues by hand).
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, role: ClassRole) -> Self {
        self.roles.insert(name.into(), role);
        self
    }

    /// Adds a class's `spec.extendedResourceName`.
    #[must_use]
    pub fn declaring(mut self, resource: impl Into<String>, class: impl Into<String>) -> Self {
        self.declared.insert(resource.into(), class.into());
        self
    }

    pub fn role(&self, name: &str) -> Option<&ClassRole> {
        self.roles.get(name)
    }

    /// The class a container asks for devices of under extended resource `name`: the one the
    /// implicit name `deviceclass.resource.kubernetes.io/<class>` names (whether it exists or
    /// not), else the one declaring `name`; `None` when no class backs it (a device plugin's).
    pub fn backing<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        name.strip_prefix(DEVICE_CLASS_PREFIX)
            .or_else(|| self.declared.get(name).map(String::as_str))
    }
}

/// The annotation value with which an administrator says a class selects no GPU.
pub const NO_QUOTA_RESOURCE: &str = "none";

/// How `class` is charged: its bridge resource, else its annotation, else by its look.
pub fn role_of(class: &dra::DeviceClass) -> ClassRole {
    let bridged = class
        .spec
        .extended_resource_name
        .as_deref()
        .filter(|name| is_gpu_resource(name));
    let annotated = class
        .metadata
        .annotations
        .as_ref()
        .and_then(|notes| notes.get(annotations::QUOTA_RESOURCE));
    match bridged.or(annotated.map(String::as_str)) {
        Some(NO_QUOTA_RESOURCE) => return ClassRole::NotGpu,
        Some(resource) => return ClassRole::Counted(ResourceName::new(resource)),
        None => {}
    }
    let name = class.metadata.name.as_deref().unwrap_or_default();
    let expressions: Vec<&str> = class
        .spec
        .selectors
        .iter()
        .flatten()
        .filter_map(|selector| selector.cel.as_ref().map(|cel| cel.expression.as_str()))
        .collect();
    let looks_like_gpu = std::iter::once(name)
        .chain(expressions.iter().copied())
        .any(|text| GPU_MARKERS.iter().any(|marker| text.contains(marker)));
    if looks_like_gpu || expressions.is_empty() {
        ClassRole::Unmapped
    } else {
        ClassRole::NotGpu
    }
}

/// Why a pod's claims cannot be counted (it waits at the gate, saying so).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct Uncounted {
    pub field: String,
    pub rule: String,
}

fn uncounted(field: impl Into<String>, rule: impl Into<String>) -> Uncounted {
    Uncounted {
        field: field.into(),
        rule: rule.into(),
    }
}

/// The ResourceClaims a pod uses, by the names of the claim objects in its namespace:
/// `resourceClaimName`, or for a template the claim kube-controller-manager generated (from
/// `status.resourceClaimStatuses`). A claim it uses from no template and no name is skipped
/// (the API server refuses that). Fails while a template's claim is not generated yet.
pub fn claim_names(pod: &core::Pod) -> Result<Vec<String>, Uncounted> {
    claim_refs(pod).into_iter().collect()
}

/// Each claim a pod uses, by name, or why it has none yet (see [`claim_names`]).
fn claim_refs(pod: &core::Pod) -> Vec<Result<String, Uncounted>> {
    let Some(claims) = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()) else {
        return Vec::new();
    };
    let generated = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    let mut names = Vec::new();
    for (i, claim) in claims.iter().enumerate() {
        if let Some(name) = &claim.resource_claim_name {
            names.push(Ok(name.clone()));
        } else if let Some(template) = &claim.resource_claim_template_name {
            let made = generated
                .and_then(|statuses| statuses.iter().find(|s| s.name == claim.name))
                .and_then(|s| s.resource_claim_name.clone());
            names.push(made.ok_or_else(|| {
                uncounted(
                    format!("spec.resourceClaims[{i}]"),
                    format!(
                        "the claim from ResourceClaimTemplate {template} is not created yet; \
                         the pod waits until kube-controller-manager creates it"
                    ),
                )
            }));
        }
    }
    names
}

/// Whether a waiting pod may be counted with `claim`: it carries [`CHARGED_FINALIZER`] (so the
/// claim kube-scheduler allocates is the one counted) and is not being deleted (kube-scheduler
/// would never allocate it).
pub fn countable(claim: &dra::ResourceClaim) -> Result<(), Uncounted> {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let field = format!("ResourceClaim {name}");
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(uncounted(
            field,
            "is being deleted, and kube-scheduler allocates no claim being deleted; delete the \
             pod too (the claim goes once no waiting pod names it), then create both again",
        ));
    }
    if !has_mark(claim) {
        return Err(uncounted(
            field,
            format!(
                "does not carry the finalizer {CHARGED_FINALIZER} yet; the operator adds it \
                 before counting the claim, so that the claim cannot be replaced under its name"
            ),
        ));
    }
    Ok(())
}

fn has_mark(claim: &dra::ResourceClaim) -> bool {
    claim
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == CHARGED_FINALIZER)
}

/// The claims pods name, as (namespace, claim name), for [`mark_changes`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimUsers {
    /// Named by a pod held at the gate: marked before it is counted.
    gated: BTreeSet<(String, String)>,
    /// Named by a pod not yet bound and not being deleted (gated or released): kube-scheduler
    /// may still allocate the claim for it, so the mark stays.
    unbound: BTreeSet<(String, String)>,
}

impl ClaimUsers {
    /// Reads the pods' `spec.resourceClaims` (a template's claim once it is generated).
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a core::Pod>) -> Self {
        let mut users = Self::default();
        for pod in pods {
            // Most pods use no claim: they are passed over before anything is read or copied.
            let unbound = pod.spec.as_ref().is_some_and(|spec| {
                spec.node_name.is_none() && super::pod::uses_resource_claims(spec)
            });
            let schedulable = pod.metadata.deletion_timestamp.is_none() && !has_finished(pod);
            if !unbound || !schedulable {
                continue;
            }
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let gated = is_gated(pod);
            for name in claim_refs(pod).into_iter().flatten() {
                let key = (namespace.clone(), name);
                if gated {
                    users.gated.insert(key.clone());
                }
                users.unbound.insert(key);
            }
        }
        users
    }
}

/// A change of a claim's [`CHARGED_FINALIZER`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkChange {
    /// A gated pod names it: mark it, so that it can be counted.
    Add,
    /// It is being deleted and no pod waiting to be scheduled names it: let it go; the
    /// finalizer is at this index of `metadata.finalizers`.
    Remove(usize),
}

/// Which claims' marks change. A mark is kept on a claim not being deleted even when no pod
/// names it any more: removing it then would race a new pod counted from a store that still
/// shows the mark. A claim being deleted is never counted again, so its mark can go as soon as
/// no pod waiting to be scheduled names it.
pub fn mark_changes<'a>(
    claims: impl IntoIterator<Item = &'a dra::ResourceClaim>,
    users: &ClaimUsers,
) -> Vec<(&'a dra::ResourceClaim, MarkChange)> {
    claims
        .into_iter()
        .filter_map(|claim| {
            let key = (
                claim.metadata.namespace.clone().unwrap_or_default(),
                claim.metadata.name.clone().unwrap_or_default(),
            );
            let deleting = claim.metadata.deletion_timestamp.is_some();
            let mark = claim
                .metadata
                .finalizers
                .iter()
                .flatten()
                .position(|f| f == CHARGED_FINALIZER);
            match mark {
                None if !deleting && users.gated.contains(&key) => Some((claim, MarkChange::Add)),
                Some(index) if deleting && !users.unbound.contains(&key) => {
                    Some((claim, MarkChange::Remove(index)))
                }
                _ => None,
            }
        })
        .collect()
}

/// What one claim charges, one request per GPU resource in each list, sorted, devices summed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimCharge {
    /// Placed on the pod's node and charged to its queue.
    pub placed: Vec<GpuRequest>,
    /// Charged to the queue only (see [`super::pod::Requests::quota_only`]): until a
    /// `firstAvailable` request is allocated, kube-scheduler may allocate any of its
    /// alternatives (the first that fits the node), so the quota holds, per resource, the most
    /// any of them takes beyond the one placed.
    pub quota_only: Vec<GpuRequest>,
}

/// What one claim charges. `most_devices` says how many devices of a resource one node has at
/// most (what `allocationMode: All` may take). A `firstAvailable` request is placed at its
/// largest alternative and charged to quota at the most each resource's alternatives take;
/// once the claim is allocated, at the alternative kube-scheduler allocated (its
/// `status.allocation` names it), both placed and charged.
pub fn claim_requests(
    claim: &dra::ResourceClaim,
    classes: &DeviceClasses,
    most_devices: &dyn Fn(&ResourceName) -> u32,
) -> Result<ClaimCharge, Uncounted> {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let requests = claim
        .spec
        .devices
        .iter()
        .flat_map(|d| d.requests.iter().flatten());
    let mut placed = Devices::new();
    let mut quota = Devices::new();
    for (i, request) in requests.enumerate() {
        let field = format!("ResourceClaim {name}: spec.devices.requests[{i}]");
        if let Some(exactly) = &request.exactly {
            let shape = Shape::exact(exactly);
            let charge =
                charge_of(&shape, classes, most_devices).map_err(|rule| uncounted(&field, rule))?;
            add(&mut placed, charge.clone());
            add(&mut quota, charge);
        } else if let Some(alternatives) = &request.first_available {
            let mut charges = Vec::with_capacity(alternatives.len());
            for (j, sub) in alternatives.iter().enumerate() {
                let shape = Shape::sub(sub);
                charges.push(
                    charge_of(&shape, classes, most_devices)
                        .map_err(|rule| uncounted(format!("{field}.firstAvailable[{j}]"), rule))?,
                );
            }
            let allocated = allocated_alternative(claim, &request.name)
                .and_then(|sub| alternatives.iter().position(|a| a.name == sub));
            if let Some(j) = allocated {
                add(&mut placed, charges[j].clone());
                add(&mut quota, charges[j].clone());
                continue;
            }
            let largest = charges
                .iter()
                .flatten()
                .fold(None::<&(ResourceName, u32)>, |most, c| match most {
                    Some(m) if m.1 >= c.1 => Some(m),
                    _ => Some(c),
                });
            add(&mut placed, largest.cloned());
            let mut most = Devices::new();
            for (resource, count) in charges.into_iter().flatten() {
                let entry = most.entry(resource).or_default();
                *entry = (*entry).max(count);
            }
            for charge in most {
                add(&mut quota, Some(charge));
            }
        } else {
            return Err(uncounted(field, "names neither exactly nor firstAvailable"));
        }
    }
    let requests = |devices: Devices| -> Vec<GpuRequest> {
        devices
            .into_iter()
            .filter(|(_, count)| *count > 0)
            .map(|(resource, count)| GpuRequest::devices(resource, count))
            .collect()
    };
    let quota_only = quota
        .into_iter()
        .map(|(resource, count)| {
            let beyond = count.saturating_sub(placed.get(&resource).copied().unwrap_or(0));
            (resource, beyond)
        })
        .collect();
    Ok(ClaimCharge {
        placed: requests(placed),
        quota_only: requests(quota_only),
    })
}

/// Devices by resource.
type Devices = BTreeMap<ResourceName, u32>;

fn add(devices: &mut Devices, charge: Option<(ResourceName, u32)>) {
    if let Some((resource, count)) = charge {
        let total = devices.entry(resource).or_default();
        *total = total.saturating_add(count);
    }
}

/// The alternative of `request` the claim's allocation names (`<request>/<alternative>`).
fn allocated_alternative<'c>(claim: &'c dra::ResourceClaim, request: &str) -> Option<&'c str> {
    let allocation = claim.status.as_ref()?.allocation.as_ref()?;
    let results = allocation.devices.as_ref()?.results.as_ref()?;
    results
        .iter()
        .find_map(|result| result.request.strip_prefix(request)?.strip_prefix('/'))
}

/// The fields of a request that decide its charge (`exactly` and a `firstAvailable` entry
/// share them).
struct Shape<'a> {
    class: &'a str,
    mode: Option<&'a str>,
    count: Option<i64>,
    admin_access: bool,
}

impl<'a> Shape<'a> {
    fn exact(request: &'a dra::ExactDeviceRequest) -> Self {
        Self {
            class: &request.device_class_name,
            mode: request.allocation_mode.as_deref(),
            count: request.count,
            admin_access: request.admin_access == Some(true),
        }
    }

    fn sub(request: &'a dra::DeviceSubRequest) -> Self {
        Self {
            class: &request.device_class_name,
            mode: request.allocation_mode.as_deref(),
            count: request.count,
            admin_access: false,
        }
    }
}

/// The devices one request charges, `None` when it is not a GPU request (or only watches
/// devices with admin access, which allocates none), or why it cannot be counted.
fn charge_of(
    shape: &Shape<'_>,
    classes: &DeviceClasses,
    most_devices: &dyn Fn(&ResourceName) -> u32,
) -> Result<Option<(ResourceName, u32)>, String> {
    let resource = match classes.role(shape.class) {
        None => {
            return Err(format!(
                "DeviceClass {} does not exist, so its devices cannot be counted; create it \
                 (or fix the class name)",
                shape.class
            ));
        }
        Some(ClassRole::NotGpu) => return Ok(None),
        Some(ClassRole::Unmapped) => {
            return Err(format!(
                "DeviceClass {} may select GPUs (it names them, or has no selector and so \
                 selects every device) but maps to no quota resource; an administrator sets \
                 spec.extendedResourceName or the annotation {} on it (`{}` for a class that \
                 selects no GPU)",
                shape.class,
                annotations::QUOTA_RESOURCE,
                NO_QUOTA_RESOURCE
            ));
        }
        Some(ClassRole::Counted(resource)) => resource.clone(),
    };
    if shape.admin_access {
        return Ok(None);
    }
    let count = match shape.mode {
        Some("All") => most_devices(&resource),
        None | Some("ExactCount") => {
            let count = shape.count.unwrap_or(1);
            u32::try_from(count)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("count {count} must be a positive number of devices"))?
        }
        Some(other) => {
            return Err(format!(
                "allocationMode {other:?} is not one gpuqueue counts (ExactCount or All)"
            ));
        }
    };
    Ok(Some((resource, count)))
}

/// What a pod's extended resources that DeviceClasses may back ([`Pod::extended`]) do to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtendedCharge {
    /// No class backs any of them, and the pod asks for no GPU and uses no claim: it is not a
    /// GPU pod (they are a device plugin's, an RDMA NIC's).
    NotGpuPod,
    /// These devices are added to its requests, one request per resource, sorted (none when no
    /// class backs them, or only classes of other devices do).
    Charged(Vec<GpuRequest>),
}

/// What `pod`'s extended resources charge through the classes backing them, by the rules of
/// claims ([`charge_of`]): a counted class its quota resource, one device each; a class of
/// other devices nothing; a missing or unmapped class cannot be counted, and the pod waits
/// naming it, never charged nothing for devices kube-scheduler allocates. `uses_claims`: the
/// pod has DRA claims (a GPU pod whatever these charge).
pub fn extended_charge(
    pod: &Pod,
    uses_claims: bool,
    classes: &DeviceClasses,
) -> Result<ExtendedCharge, Uncounted> {
    let mut devices = Devices::new();
    let mut backed = false;
    for (name, count) in &pod.extended {
        let Some(class) = classes.backing(name.as_str()) else {
            continue;
        };
        backed = true;
        let field = format!("spec.containers.resources.requests[{name}]");
        let count = u32::try_from(*count)
            .ok()
            .filter(|n| *n <= MAX_DEVICES_PER_POOL)
            .ok_or_else(|| {
                uncounted(
                    &field,
                    format!(
                        "{count} devices is more than any node has (at most {MAX_DEVICES_PER_POOL})"
                    ),
                )
            })?;
        let shape = Shape {
            class,
            mode: None,
            count: Some(i64::from(count)),
            admin_access: false,
        };
        let charge =
            charge_of(&shape, classes, &|_| count).map_err(|rule| uncounted(&field, rule))?;
        add(&mut devices, charge);
    }
    if !backed && pod.requests.gpus.is_empty() && !uses_claims {
        return Ok(ExtendedCharge::NotGpuPod);
    }
    Ok(ExtendedCharge::Charged(
        devices
            .into_iter()
            .map(|(resource, count)| GpuRequest::devices(resource, count))
            .collect(),
    ))
}

/// How a pod asks for devices, as the webhook sees it at its creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asks {
    /// For no GPU: gpuqueue leaves it alone.
    Nothing,
    /// By the names the core counts (or so that the core cannot read it: it waits saying why).
    ByName,
    /// Through DRA: claims, or an extended resource a DeviceClass backs. What it takes is read
    /// from the DRA stores by the admission pass, so it is never admitted at its creation.
    ThroughDra,
}

/// How `pod` asks for devices; `classes` is asked only when the pod names an extended resource
/// a class may back.
pub fn asks(pod: &core::Pod, classes: &dyn Fn() -> DeviceClasses) -> Asks {
    let read = match Pod::from_k8s(pod) {
        Ok(None) => return Asks::Nothing,
        Err(_) => return Asks::ByName,
        Ok(Some(read)) => read.value,
    };
    if pod.spec.as_ref().is_some_and(uses_resource_claims) {
        return Asks::ThroughDra;
    }
    if !read.extended.is_empty() {
        let classes = classes();
        if read
            .extended
            .iter()
            .any(|(name, _)| classes.backing(name.as_str()).is_some())
        {
            return Asks::ThroughDra;
        }
    }
    if read.requests.gpus.is_empty() {
        Asks::Nothing
    } else {
        Asks::ByName
    }
}

/// Adds `extra` to `into`, keeping one request per resource, sorted by resource name.
pub fn add_requests(into: &mut Vec<GpuRequest>, extra: &[GpuRequest]) {
    for request in extra {
        match into.iter_mut().find(|r| r.resource == request.resource) {
            Some(r) => r.count = r.count.saturating_add(request.count),
            None => into.push(request.clone()),
        }
    }
    into.sort();
}

/// One pod's use of claims, for [`charged_claims`].
#[derive(Clone, Debug)]
pub struct ClaimUser<'a> {
    pub pod: &'a PodKey,
    pub admitted: bool,
    /// Names of the claims it uses, in its namespace.
    pub claims: &'a [String],
}

/// Which claims each pod is charged for (same order as `users`). A claim several pods share is
/// charged once: to the first admitted pod using it (by key), or, while none is admitted, to
/// every pending pod using it, so that whichever is admitted first brings its charge; the
/// others then use it free.
pub fn charged_claims(users: &[ClaimUser<'_>]) -> Vec<Vec<String>> {
    let mut holders: BTreeMap<(&str, &str), &PodKey> = BTreeMap::new();
    for user in users.iter().filter(|u| u.admitted) {
        for claim in user.claims {
            let holder = holders
                .entry((user.pod.namespace.as_str(), claim.as_str()))
                .or_insert(user.pod);
            if user.pod < *holder {
                *holder = user.pod;
            }
        }
    }
    users
        .iter()
        .map(|user| {
            user.claims
                .iter()
                .filter(|claim| {
                    holders
                        .get(&(user.pod.namespace.as_str(), claim.as_str()))
                        .is_none_or(|holder| *holder == user.pod)
                })
                .cloned()
                .collect()
        })
        .collect()
}

/// For each of `users`, the other admitted users of the claims `charged` says it is charged
/// for (same order as `users`; `charged` from [`charged_claims`]): a shared claim's devices stay
/// allocated until every pod using it is gone, so its charged pod alone frees nothing.
pub fn claim_sharers(users: &[ClaimUser<'_>], charged: &[Vec<String>]) -> Vec<Vec<PodKey>> {
    users
        .iter()
        .zip(charged)
        .map(|(user, claims)| {
            let mut sharers: Vec<PodKey> = users
                .iter()
                .filter(|other| other.admitted && other.pod != user.pod)
                .filter(|other| other.pod.namespace == user.pod.namespace)
                .filter(|other| other.claims.iter().any(|c| claims.contains(c)))
                .map(|other| other.pod.clone())
                .collect();
            sharers.sort();
            sharers
        })
        .collect()
}

/// The pending users (indices into `users`, with the claim) that would use a claim charged to
/// a pod leaving through a reclaim (`leaving`, parallel to `users`; `charged` from
/// [`charged_claims`]): the claim is being freed for the reclaim's owner, and a new user,
/// charged nothing while the leaving pod is there, would keep its devices allocated.
pub fn joining_freed_claims(
    users: &[ClaimUser<'_>],
    charged: &[Vec<String>],
    leaving: &[bool],
) -> Vec<(usize, String)> {
    let freed: BTreeSet<(&str, &str)> = users
        .iter()
        .zip(charged)
        .zip(leaving)
        .filter(|(_, leaving)| **leaving)
        .flat_map(|((user, claims), _)| {
            claims
                .iter()
                .map(|c| (user.pod.namespace.as_str(), c.as_str()))
        })
        .collect();
    users
        .iter()
        .enumerate()
        .filter(|(_, user)| !user.admitted)
        .filter_map(|(i, user)| {
            let namespace = user.pod.namespace.as_str();
            let claim = user
                .claims
                .iter()
                .find(|c| freed.contains(&(namespace, c.as_str())))?;
            Some((i, claim.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn classes() -> DeviceClasses {
        DeviceClasses::default()
            .with(
                "gpu.nvidia.com",
                ClassRole::Counted("nvidia.com/gpu".into()),
            )
            .with(
                "mig-1g-10gb.nvidia.com",
                ClassRole::Counted("nvidia.com/mig-1g.10gb".into()),
            )
            .with("nic.example.com", ClassRole::NotGpu)
            .with("gpu.example.com", ClassRole::Unmapped)
    }

    fn claim(requests: serde_json::Value) -> dra::ResourceClaim {
        let mut claim = json!({
            "metadata": {"name": "c", "namespace": "t"},
            "spec": {"devices": {}},
        });
        claim["spec"]["devices"]["requests"] = requests;
        serde_json::from_value(claim).unwrap()
    }

    fn eight(_: &ResourceName) -> u32 {
        8
    }

    /// A pod whose containers ask for `limits` (one map per container; the last one a sidecar).
    fn asking(limits: &[serde_json::Value]) -> core::Pod {
        let container = |(i, limits): (usize, &serde_json::Value)| json!({"name": format!("c{i}"), "resources": {"limits": limits}});
        let (sidecar, main) = limits.split_last().unwrap();
        let mut sidecar = container((main.len(), sidecar));
        sidecar["restartPolicy"] = json!("Always");
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "t", "creationTimestamp": "2026-05-01T00:00:00Z"},
            "spec": {
                "schedulingGates": [{"name": gpuqueue_api::ADMISSION_GATE}],
                "containers": main.iter().enumerate().map(container).collect::<Vec<_>>(),
                "initContainers": [sidecar],
            },
        }))
        .unwrap()
    }

    const IMPLICIT: &str = "deviceclass.resource.kubernetes.io/gpu.nvidia.com";

    /// What the pod is charged once its extended resources are: its GPU requests, or why not.
    fn charged(pod: &core::Pod, classes: &DeviceClasses) -> Result<Vec<GpuRequest>, Uncounted> {
        let read = Pod::from_k8s(pod).unwrap().unwrap().value;
        let mut gpus = read.requests.gpus.clone();
        match extended_charge(
            &read,
            uses_resource_claims(pod.spec.as_ref().unwrap()),
            classes,
        )? {
            ExtendedCharge::Charged(devices) => add_requests(&mut gpus, &devices),
            ExtendedCharge::NotGpuPod => panic!("read as no GPU pod"),
        }
        Ok(gpus)
    }

    #[test]
    fn a_class_asked_for_by_its_implicit_name_is_charged_its_quota_resource() {
        // 6 by a container and 2 by a sidecar: kube-scheduler allocates 8 devices.
        let pod = asking(&[json!({IMPLICIT: "6"}), json!({IMPLICIT: "2"})]);
        assert_eq!(
            charged(&pod, &classes()).unwrap(),
            vec![GpuRequest::devices("nvidia.com/gpu", 8)]
        );
        assert_eq!(asks(&pod, &classes), Asks::ThroughDra);
        // Asked both ways, both are charged.
        let both = asking(&[json!({"nvidia.com/gpu": "1", IMPLICIT: "8"}), json!({})]);
        assert_eq!(
            charged(&both, &classes()).unwrap(),
            vec![GpuRequest::devices("nvidia.com/gpu", 9)]
        );
        let slices = asking(&[
            json!({"deviceclass.resource.kubernetes.io/mig-1g-10gb.nvidia.com": "3"}),
            json!({}),
        ]);
        assert_eq!(
            charged(&slices, &classes()).unwrap(),
            vec![GpuRequest::devices("nvidia.com/mig-1g.10gb", 3)]
        );
    }

    #[test]
    fn an_implicit_name_that_cannot_be_counted_keeps_the_pod_waiting_naming_the_class() {
        let unknown = asking(&[
            json!({"deviceclass.resource.kubernetes.io/nope": "8"}),
            json!({}),
        ]);
        let error = charged(&unknown, &classes()).unwrap_err();
        assert_eq!(
            error.field,
            "spec.containers.resources.requests[deviceclass.resource.kubernetes.io/nope]"
        );
        assert!(
            error.rule.contains("DeviceClass nope does not exist"),
            "{error}"
        );
        assert_eq!(asks(&unknown, &classes), Asks::ThroughDra);
        let unmapped = asking(&[
            json!({}),
            json!({"deviceclass.resource.kubernetes.io/gpu.example.com": "1"}),
        ]);
        let error = charged(&unmapped, &classes()).unwrap_err();
        assert!(
            error
                .rule
                .contains("DeviceClass gpu.example.com may select GPUs"),
            "{error}"
        );
        let huge = asking(&[json!({IMPLICIT: "129"}), json!({})]);
        assert!(
            charged(&huge, &classes())
                .unwrap_err()
                .rule
                .contains("more than any node has")
        );
        // A class of other devices charges nothing, as its claims do.
        let nic = asking(&[
            json!({"deviceclass.resource.kubernetes.io/nic.example.com": "1"}),
            json!({}),
        ]);
        assert_eq!(charged(&nic, &classes()).unwrap(), Vec::new());
    }

    #[test]
    fn an_extended_resource_a_class_declares_is_charged_through_the_class() {
        let declared = classes().declaring("example.com/gpu", "gpu.nvidia.com");
        let pod = asking(&[json!({"example.com/gpu": "8"}), json!({})]);
        assert_eq!(
            charged(&pod, &declared).unwrap(),
            vec![GpuRequest::devices("nvidia.com/gpu", 8)]
        );
        assert_eq!(asks(&pod, &|| declared.clone()), Asks::ThroughDra);
        // No class declares it: a device plugin's resource, and no GPU pod.
        let read = Pod::from_k8s(&pod).unwrap().unwrap().value;
        assert_eq!(
            extended_charge(&read, false, &classes()),
            Ok(ExtendedCharge::NotGpuPod)
        );
        assert_eq!(asks(&pod, &classes), Asks::Nothing);
        let with_gpu = asking(&[
            json!({"example.com/gpu": "8", "nvidia.com/gpu": "1"}),
            json!({}),
        ]);
        assert_eq!(
            charged(&with_gpu, &classes()).unwrap(),
            vec![GpuRequest::devices("nvidia.com/gpu", 1)]
        );
        assert_eq!(asks(&with_gpu, &classes), Asks::ByName);
    }

    #[test]
    fn the_newest_class_declaring_a_name_backs_it() {
        let class = |name: &str, created: &str| -> dra::DeviceClass {
            serde_json::from_value(
                json!({"metadata": {"name": name, "creationTimestamp": created},
                "spec": {"extendedResourceName": "example.com/gpu"}}),
            )
            .unwrap()
        };
        let (old, new) = (
            class("b-old", "2026-01-01T00:00:00Z"),
            class("a-new", "2026-02-01T00:00:00Z"),
        );
        let classes = DeviceClasses::from_k8s([&new, &old]);
        assert_eq!(classes.backing("example.com/gpu"), Some("a-new"));
        assert_eq!(classes.backing(IMPLICIT), Some("gpu.nvidia.com"));
        assert_eq!(classes.backing("example.com/nic"), None);
    }

    #[test]
    fn a_class_maps_by_its_bridge_name_then_its_annotation_then_its_look() {
        let class = |value: serde_json::Value| -> dra::DeviceClass {
            serde_json::from_value(value).unwrap()
        };
        let bridged = class(json!({"metadata": {"name": "gpu.nvidia.com"},
            "spec": {"extendedResourceName": "nvidia.com/gpu"}}));
        assert_eq!(
            role_of(&bridged),
            ClassRole::Counted("nvidia.com/gpu".into())
        );
        let annotated = class(json!({"metadata": {"name": "mig-1g",
            "annotations": {"gpuqueue.io/quota-resource": "nvidia.com/mig-1g.10gb"}}, "spec": {}}));
        assert_eq!(
            role_of(&annotated),
            ClassRole::Counted("nvidia.com/mig-1g.10gb".into())
        );
        let by_selector = class(json!({"metadata": {"name": "accelerators"}, "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}));
        assert_eq!(role_of(&by_selector), ClassRole::Unmapped);
        let nic = class(
            json!({"metadata": {"name": "nic"}, "spec": {"extendedResourceName":
            "example.com/nic", "selectors": [{"cel": {"expression": "device.driver == 'nic.example.com'"}}]}}),
        );
        assert_eq!(role_of(&nic), ClassRole::NotGpu);
        // No selector selects every device, GPUs included: a claim's own selectors pick them.
        let everything = class(json!({"metadata": {"name": "accelerators"}, "spec": {}}));
        assert_eq!(role_of(&everything), ClassRole::Unmapped);
        let said_none = class(json!({"metadata": {"name": "accelerators",
            "annotations": {"gpuqueue.io/quota-resource": "none"}}, "spec": {}}));
        assert_eq!(role_of(&said_none), ClassRole::NotGpu);
    }

    #[test]
    fn exact_counts_all_and_first_available_are_charged() {
        let c = claim(json!([
            {"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
            {"name": "b", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
            {"name": "c", "exactly": {"deviceClassName": "mig-1g-10gb.nvidia.com", "allocationMode": "All"}},
            {"name": "d", "firstAvailable": [
                {"name": "one", "deviceClassName": "gpu.nvidia.com", "count": 1},
                {"name": "three", "deviceClassName": "mig-1g-10gb.nvidia.com", "count": 3}]},
            {"name": "e", "exactly": {"deviceClassName": "nic.example.com", "count": 4}},
            {"name": "f", "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": true}},
        ]));
        assert_eq!(
            claim_requests(&c, &classes(), &eight).unwrap(),
            ClaimCharge {
                placed: vec![
                    GpuRequest::devices("nvidia.com/gpu", 3),
                    GpuRequest::devices("nvidia.com/mig-1g.10gb", 11),
                ],
                // kube-scheduler may allocate "one" instead of the "three" placed.
                quota_only: vec![GpuRequest::devices("nvidia.com/gpu", 1)],
            }
        );
    }

    /// A claim of [1 GPU, else 3 MIG slices]: placed at the 3 slices, but kube-scheduler
    /// allocates the GPU wherever one is free, so the queue's `nvidia.com/gpu` quota must hold
    /// it too; once allocated, the claim is charged the alternative kube-scheduler chose.
    #[test]
    fn first_available_holds_every_alternative_in_quota_until_allocated() {
        let mut c = claim(json!([{"name": "gpu", "firstAvailable": [
            {"name": "whole", "deviceClassName": "gpu.nvidia.com"},
            {"name": "slices", "deviceClassName": "mig-1g-10gb.nvidia.com", "count": 3}]}]));
        let pending = claim_requests(&c, &classes(), &eight).unwrap();
        assert_eq!(
            pending.placed,
            vec![GpuRequest::devices("nvidia.com/mig-1g.10gb", 3)]
        );
        assert_eq!(
            pending.quota_only,
            vec![GpuRequest::devices("nvidia.com/gpu", 1)]
        );
        let allocated = |request: &str| {
            json!({"allocation": {"devices": {"results": [
                {"request": request, "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]}}})
        };
        c.status = serde_json::from_value(allocated("gpu/whole")).unwrap();
        assert_eq!(
            claim_requests(&c, &classes(), &eight).unwrap(),
            ClaimCharge {
                placed: vec![GpuRequest::devices("nvidia.com/gpu", 1)],
                quota_only: Vec::new(),
            }
        );
        c.status = serde_json::from_value(allocated("gpu/slices")).unwrap();
        assert_eq!(
            claim_requests(&c, &classes(), &eight).unwrap().placed,
            vec![GpuRequest::devices("nvidia.com/mig-1g.10gb", 3)]
        );
        // A result naming another request, or none of the alternatives, leaves every one held.
        c.status = serde_json::from_value(allocated("gpus/whole")).unwrap();
        assert_eq!(claim_requests(&c, &classes(), &eight).unwrap(), pending);
        c.status = serde_json::from_value(allocated("gpu/other")).unwrap();
        assert_eq!(claim_requests(&c, &classes(), &eight).unwrap(), pending);
    }

    #[test]
    fn the_charged_user_of_a_shared_claim_knows_the_other_admitted_users() {
        let (a, b, c, d) = (
            PodKey::new("t", "a"),
            PodKey::new("t", "b"),
            PodKey::new("t", "c"),
            PodKey::new("u", "a"),
        );
        let shared = ["shared".to_owned()];
        let alone = ["alone".to_owned()];
        let users = [
            ClaimUser {
                pod: &a,
                admitted: true,
                claims: &shared,
            },
            ClaimUser {
                pod: &b,
                admitted: true,
                claims: &shared,
            },
            // Pending: holds nothing yet.
            ClaimUser {
                pod: &c,
                admitted: false,
                claims: &shared,
            },
            // Another namespace's claim of the same name is another claim.
            ClaimUser {
                pod: &d,
                admitted: true,
                claims: &shared,
            },
        ];
        let charged = charged_claims(&users);
        assert_eq!(
            claim_sharers(&users, &charged),
            vec![vec![b.clone()], Vec::new(), Vec::new(), Vec::new()]
        );
        let single = [ClaimUser {
            pod: &a,
            admitted: true,
            claims: &alone,
        }];
        assert_eq!(
            claim_sharers(&single, &charged_claims(&single)),
            vec![Vec::new()]
        );
    }

    #[test]
    fn a_pending_pod_may_not_join_a_claim_a_reclaim_is_freeing() {
        let (victim, joiner, other) = (
            PodKey::new("t", "a"),
            PodKey::new("t", "b"),
            PodKey::new("t", "c"),
        );
        let shared = ["shared".to_owned()];
        let own = ["own".to_owned()];
        let users = [
            ClaimUser {
                pod: &victim,
                admitted: true,
                claims: &shared,
            },
            ClaimUser {
                pod: &joiner,
                admitted: false,
                claims: &shared,
            },
            ClaimUser {
                pod: &other,
                admitted: false,
                claims: &own,
            },
        ];
        let charged = charged_claims(&users);
        assert_eq!(
            joining_freed_claims(&users, &charged, &[true, false, false]),
            vec![(1, "shared".to_owned())]
        );
        assert!(joining_freed_claims(&users, &charged, &[false, false, false]).is_empty());
    }

    #[test]
    fn a_claim_that_cannot_be_counted_says_which_request_and_why() {
        let unknown = claim(json!([{"name": "a", "exactly": {"deviceClassName": "nope"}}]));
        let error = claim_requests(&unknown, &classes(), &eight).unwrap_err();
        assert_eq!(error.field, "ResourceClaim c: spec.devices.requests[0]");
        assert!(
            error.rule.contains("DeviceClass nope does not exist"),
            "{error}"
        );
        let unmapped = claim(json!([{"name": "a", "firstAvailable": [
            {"name": "x", "deviceClassName": "gpu.example.com"}]}]));
        let error = claim_requests(&unmapped, &classes(), &eight).unwrap_err();
        assert!(error.field.ends_with("firstAvailable[0]"), "{error}");
        assert!(error.rule.contains("gpuqueue.io/quota-resource"), "{error}");
        let zero = claim(
            json!([{"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 0}}]),
        );
        assert!(claim_requests(&zero, &classes(), &eight).is_err());
    }

    #[test]
    fn template_claims_are_named_once_generated() {
        let mut pod: core::Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "t"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "shared", "resourceClaimName": "team-gpus"},
                {"name": "own", "resourceClaimTemplateName": "one-gpu"}]},
        }))
        .unwrap();
        let error = claim_names(&pod).unwrap_err();
        assert_eq!(error.field, "spec.resourceClaims[1]");
        assert!(error.rule.contains("one-gpu"), "{error}");
        pod.status = Some(
            serde_json::from_value(json!({"resourceClaimStatuses": [
                {"name": "own", "resourceClaimName": "p-own-x7k2q"}]}))
            .unwrap(),
        );
        assert_eq!(claim_names(&pod).unwrap(), vec!["team-gpus", "p-own-x7k2q"]);
    }

    #[test]
    fn a_shared_claim_is_charged_once_to_an_admitted_user() {
        let (a, b, c) = (
            PodKey::new("t", "a"),
            PodKey::new("t", "b"),
            PodKey::new("u", "c"),
        );
        let shared = vec!["shared".to_string()];
        let user = |pod, admitted| ClaimUser {
            pod,
            admitted,
            claims: &shared,
        };
        let none: Vec<String> = Vec::new();
        // Nobody holds it yet: every pending user brings it.
        assert_eq!(
            charged_claims(&[user(&a, false), user(&b, false)]),
            vec![shared.clone(), shared.clone()]
        );
        // Once b holds it, a uses it free; c's claim of that name is another namespace's.
        assert_eq!(
            charged_claims(&[user(&a, false), user(&b, true), user(&c, false)]),
            vec![none.clone(), shared.clone(), shared.clone()]
        );
        assert_eq!(
            charged_claims(&[user(&b, true), user(&a, true)]),
            vec![none, shared]
        );
    }

    fn marked(name: &str, finalizers: &[&str], deleting: bool) -> dra::ResourceClaim {
        let mut claim = claim(json!([]));
        claim.metadata.name = Some(name.into());
        claim.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
        if deleting {
            claim.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
            );
        }
        claim
    }

    fn pod(name: &str, claim: &str, gated: bool, node: Option<&str>) -> core::Pod {
        let mut spec = json!({"containers": [],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]});
        if gated {
            spec["schedulingGates"] = json!([{"name": gpuqueue_api::ADMISSION_GATE}]);
        }
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        }
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "t"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn a_waiting_pod_counts_a_claim_only_once_it_is_marked_and_not_being_deleted() {
        let error = countable(&marked("c", &[], false)).unwrap_err();
        assert!(error.rule.contains(CHARGED_FINALIZER), "{error}");
        let error = countable(&marked("c", &[CHARGED_FINALIZER], true)).unwrap_err();
        assert_eq!(error.field, "ResourceClaim c");
        assert!(error.rule.contains("is being deleted"), "{error}");
        assert_eq!(
            countable(&marked("c", &["other", CHARGED_FINALIZER], false)),
            Ok(())
        );
    }

    #[test]
    fn gated_pods_mark_their_claims_and_a_deleted_claim_is_let_go_once_no_pod_waits_for_it() {
        let unmarked = marked("wanted", &[], false);
        let idle = marked("idle", &[CHARGED_FINALIZER], false);
        let deleted_in_use = marked("held", &["x", CHARGED_FINALIZER], true);
        let deleted_unused = marked("gone", &["x", CHARGED_FINALIZER], true);
        let deleted_bound = marked("ran", &[CHARGED_FINALIZER], true);
        let claims = [
            &unmarked,
            &idle,
            &deleted_in_use,
            &deleted_unused,
            &deleted_bound,
        ];
        let pods = [
            pod("a", "wanted", true, None),
            // Released by the operator, not bound yet: kube-scheduler may still allocate it.
            pod("b", "held", false, None),
            pod("c", "ran", false, Some("node")),
        ];
        let users = ClaimUsers::of(&pods);
        let changes: Vec<_> = mark_changes(claims, &users)
            .into_iter()
            .map(|(claim, change)| (claim.metadata.name.clone().unwrap(), change))
            .collect();
        assert_eq!(
            changes,
            vec![
                ("wanted".to_owned(), MarkChange::Add),
                ("gone".to_owned(), MarkChange::Remove(1)),
                ("ran".to_owned(), MarkChange::Remove(0)),
            ]
        );
        // A deleted, unmarked claim is never marked, even for a gated pod.
        let deleting = marked("wanted", &[], true);
        assert!(mark_changes([&deleting], &users).is_empty());
    }

    proptest! {
        /// Whatever the requests, every device of a counted class is charged: the charge is at
        /// least the sum of exact counts, and exactly it when no request uses All.
        #[test]
        fn exact_requests_are_charged_in_full(counts in prop::collection::vec(1_i64..9, 0..6)) {
            let requests: Vec<_> = counts.iter().enumerate().map(|(i, n)| json!({
                "name": format!("r{i}"),
                "exactly": {"deviceClassName": "gpu.nvidia.com", "count": n},
            })).collect();
            let charged = claim_requests(&claim(json!(requests)), &classes(), &eight).unwrap();
            let total: i64 = counts.iter().sum();
            let want = if total == 0 {
                Vec::new()
            } else {
                vec![GpuRequest::devices("nvidia.com/gpu", u32::try_from(total).unwrap())]
            };
            prop_assert_eq!(charged, ClaimCharge { placed: want, quota_only: Vec::new() });
        }

        /// firstAvailable of one resource is placed and charged at its largest alternative,
        /// never less.
        #[test]
        fn first_available_is_charged_at_its_largest(counts in prop::collection::vec(1_i64..9, 1..5)) {
            let subs: Vec<_> = counts.iter().enumerate().map(|(i, n)| json!({
                "name": format!("s{i}"), "deviceClassName": "gpu.nvidia.com", "count": n,
            })).collect();
            let c = claim(json!([{"name": "r", "firstAvailable": subs}]));
            let charged = claim_requests(&c, &classes(), &eight).unwrap();
            let largest = u32::try_from(*counts.iter().max().unwrap()).unwrap();
            prop_assert_eq!(charged.placed, vec![GpuRequest::devices("nvidia.com/gpu", largest)]);
            prop_assert_eq!(charged.quota_only, Vec::new());
        }
    }
}
