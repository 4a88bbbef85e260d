//! The admission seal: proof that a pod's admission annotations are the operator's. A tenant
//! creating a pod while the webhook cannot answer (`failurePolicy: Ignore`: the operator down,
//! or its webhook flooded past its timeout) can write `gpuqueue.io/admitted-at` itself, and no
//! admission policy can tell that from the webhook's annotations at creation: both arrive in
//! the tenant's own request. Read as admitted, such a pod would never be corrected, and its
//! queue could run over its ceiling for good.
//!
//! So every admission the operator writes (at creation, or releasing the gate, or reserving a
//! reclaim's owner) carries `gpuqueue.io/admission-seal`: an HMAC-SHA256, under a key only the
//! operator reads (the Secret [`SECRET`] in its namespace, made by the first leader that needs
//! it), of what the admission says and of the pod it is for. A pod whose admission does not
//! verify is read as *unadmitted* (charged to its queue, corrected like any pod that bypassed
//! admission). A seal binds the namespace, queue, `admitted-as`, `admitted-at`, the node pin,
//! what the pod is charged for (each container's requests of the resources the core charges,
//! and whether it is a sidecar; its resource claims), and the pod itself: its uid when the
//! gate is released, or, at creation, where no uid exists yet, the reservation token, which
//! must be unique among the pods and the pod created within [`WINDOW`] of its admission. A
//! copied seal is then good for one pod, charged the same, for that minute.
//!
//! Pods created before the key existed keep the admissions they carry: a version without seals
//! wrote them, and the first leader with seals makes the key only once it leads.

use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
};

use data_encoding::HEXLOWER;
use gpuqueue_api::annotations;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    ByteString,
    api::core::v1::{Container, Pod, PodSpec, Secret},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use ring::{hmac, rand::SecureRandom};

use gpuqueue_core::{
    model::HOSTNAME_LABEL as PIN_LABEL,
    quantity::{DEVICE_CLASS_PREFIX, is_device_part, is_gpu_resource},
};
use serde::Serialize;

/// The Secret holding the key, in the operator's namespace.
pub const SECRET: &str = "gpuqueue-admission-seal";

/// The Secret's data field.
const KEY_FIELD: &str = "key";

/// How far a pod's creation may lie from an admission made at its creation: the webhook
/// stamps the admission before the API server stores the pod (within its 15 s reservation),
/// and the two clocks may differ by some seconds.
pub const WINDOW: SignedDuration = SignedDuration::from_secs(60);

/// The annotations that make an admission; stripped together from a pod whose seal fails.
pub const ADMISSION_NOTES: [&str; 5] = [
    annotations::ADMITTED_AT,
    annotations::ADMITTED_AT_CREATION,
    annotations::ADMITTED_AS,
    annotations::QUEUE,
    annotations::ADMISSION_SEAL,
];

/// The operator's key, and when it was made.
#[derive(Clone)]
pub struct Seal {
    key: hmac::Key,
    since: Timestamp,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seal")
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

/// The seal this process writes and verifies with, once its term has loaded the key; shared
/// by the admission loop, the reclaim executor and the webhook. `None` outside a term, or where
/// the key could not be had (admissions then go unsealed and none is checked).
#[derive(Clone, Debug, Default)]
pub struct Seals(Arc<RwLock<Option<Seal>>>);

impl Seals {
    pub fn set(&self, seal: Option<Seal>) {
        *crate::sync::write(&self.0) = seal;
    }

    pub fn get(&self) -> Option<Seal> {
        crate::sync::read(&self.0).clone()
    }
}

/// What an admission says, as its annotations spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted<'a> {
    pub queue: &'a str,
    pub admitted_as: &'a str,
    pub admitted_at: &'a str,
    pub node_pin: &'a str,
    /// The reservation token of an admission at creation.
    pub token: Option<&'a str>,
}

/// Whether a pod's admission annotations can be believed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It carries no admission.
    NotAdmitted,
    /// Sealed by the operator.
    Sealed,
    /// Created before the key existed: written by a version without seals.
    Predates,
    /// Not the operator's: read it as unadmitted, for this reason.
    Forged(String),
}

impl Seal {
    /// A seal with `key`, made at `since`.
    pub fn new(key: &[u8], since: Timestamp) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
            since,
        }
    }

    /// The seal of `admitted`, written on `pod` (whose uid binds it when there is no token).
    pub fn sign(&self, pod: &Pod, admitted: &Admitted<'_>) -> String {
        HEXLOWER.encode(hmac::sign(&self.key, message(pod, admitted).as_bytes()).as_ref())
    }

    /// What to believe of `pod`'s admission annotations.
    pub fn verdict(&self, pod: &Pod) -> Verdict {
        let notes = pod.metadata.annotations.as_ref();
        let note = |name: &str| notes.and_then(|n| n.get(name)).map(String::as_str);
        let token = note(annotations::ADMITTED_AT_CREATION);
        let Some(admitted_at) = note(annotations::ADMITTED_AT) else {
            return if token.is_some() {
                Verdict::Forged("a reservation token without an admission time".into())
            } else {
                Verdict::NotAdmitted
            };
        };
        let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
        if created.is_some_and(|created| created < self.since) {
            return Verdict::Predates;
        }
        let Some(seal) = note(annotations::ADMISSION_SEAL) else {
            return Verdict::Forged("no admission seal".into());
        };
        let admitted = Admitted {
            queue: note(annotations::QUEUE).unwrap_or_default(),
            admitted_as: note(annotations::ADMITTED_AS).unwrap_or_default(),
            admitted_at,
            node_pin: node_pin(pod).unwrap_or_default(),
            token,
        };
        let matches = HEXLOWER.decode(seal.as_bytes()).is_ok_and(|tag| {
            hmac::verify(&self.key, message(pod, &admitted).as_bytes(), &tag).is_ok()
        });
        if !matches {
            return Verdict::Forged("its admission seal does not match the admission".into());
        }
        if token.is_some() {
            let at = admitted_at.parse::<Timestamp>().ok();
            let apart = at
                .zip(created)
                .map(|(at, created)| created.duration_since(at).abs());
            if apart.is_none_or(|apart| apart > WINDOW) {
                return Verdict::Forged(format!(
                    "admitted at its creation ({admitted_at}), but created at {}",
                    created.map_or_else(|| "an unknown time".into(), |c| c.to_string())
                ));
            }
        }
        Verdict::Sealed
    }
}

/// The pod as the core should read it when its admission is not the operator's: without the
/// admission annotations, so unadmitted.
pub fn unadmitted(pod: &Pod) -> Pod {
    let mut pod = pod.clone();
    if let Some(notes) = pod.metadata.annotations.as_mut() {
        for name in ADMISSION_NOTES {
            notes.remove(name);
        }
    }
    pod
}

/// The node pin the admission wrote.
fn node_pin(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()?
        .node_selector
        .as_ref()?
        .get(PIN_LABEL)
        .map(String::as_str)
}

/// What a seal signs, as JSON: each field escaped, so no two admissions read alike (a value
/// cannot end one field and begin the next, as a line break in a token could in lines).
#[derive(Serialize)]
struct Message<'a> {
    seal: &'static str,
    namespace: &'a str,
    queue: &'a str,
    admitted_as: &'a str,
    admitted_at: &'a str,
    node_pin: &'a str,
    uid: Option<&'a str>,
    token: Option<&'a str>,
    /// `(container kind, container, side, resource, amount)`, in the spec's order.
    requests: Vec<(&'static str, &'a str, &'static str, &'a str, &'a str)>,
    /// `(name, resourceClaimName, resourceClaimTemplateName)`, in the spec's order.
    claims: Vec<(&'a str, Option<&'a str>, Option<&'a str>)>,
}

fn message(pod: &Pod, admitted: &Admitted<'_>) -> String {
    let spec = pod.spec.as_ref();
    let message = Message {
        seal: "gpuqueue.io/admission-seal v2",
        namespace: pod.metadata.namespace.as_deref().unwrap_or_default(),
        queue: admitted.queue,
        admitted_as: admitted.admitted_as,
        admitted_at: admitted.admitted_at,
        node_pin: admitted.node_pin,
        uid: match admitted.token {
            Some(_) => None,
            None => Some(pod.metadata.uid.as_deref().unwrap_or_default()),
        },
        token: admitted.token,
        requests: spec.map(charged_requests).unwrap_or_default(),
        claims: spec
            .and_then(|spec| spec.resource_claims.as_ref())
            .into_iter()
            .flatten()
            .map(|claim| {
                (
                    claim.name.as_str(),
                    claim.resource_claim_name.as_deref(),
                    claim.resource_claim_template_name.as_deref(),
                )
            })
            .collect(),
    };
    // Strings and tuples of them always serialise.
    serde_json::to_string(&message).unwrap_or_default()
}

/// The requests a seal binds: those of every resource the core charges to a queue (GPUs, MIG
/// profiles, HAMi's memory and compute parts, DeviceClasses by their implicit names) in every
/// container, and of what kind each container is, since the core charges a sidecar (an init
/// container that restarts `Always`) for the pod's life and another init container only while
/// it runs. Other resources are not: a mutating webhook after gpuqueue's may add some (an RDMA
/// device, an `ephemeral-storage` default) to what was admitted, and the kubelet resizes CPU
/// and memory in place. A name a DeviceClass declares is not either: which names are, only
/// the class store says, and it may change after the admission.
fn charged_requests(spec: &PodSpec) -> Vec<(&'static str, &str, &'static str, &str, &str)> {
    let init_kind = |container: &Container| {
        if container.restart_policy.as_deref() == Some("Always") {
            "sidecar"
        } else {
            "init"
        }
    };
    let containers = spec.containers.iter().map(|c| ("container", c)).chain(
        spec.init_containers
            .iter()
            .flatten()
            .map(|c| (init_kind(c), c)),
    );
    containers
        .flat_map(|(kind, container)| {
            let resources = container.resources.as_ref();
            let sides = [
                ("requests", resources.and_then(|r| r.requests.as_ref())),
                ("limits", resources.and_then(|r| r.limits.as_ref())),
            ];
            sides.into_iter().flat_map(move |(side, amounts)| {
                amounts
                    .into_iter()
                    .flat_map(BTreeMap::iter)
                    .filter(|(name, _)| {
                        is_gpu_resource(name)
                            || is_device_part(name)
                            || name.starts_with(DEVICE_CLASS_PREFIX)
                    })
                    .map(move |(name, amount)| {
                        (
                            kind,
                            container.name.as_str(),
                            side,
                            name.as_str(),
                            amount.0.as_str(),
                        )
                    })
            })
        })
        .collect()
}

/// Why the key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading or creating Secret {namespace}/{SECRET}: {source}")]
    Api {
        namespace: String,
        source: kube::Error,
    },
    #[error("Secret {namespace}/{SECRET} has no usable `{KEY_FIELD}` (at least 32 bytes)")]
    Malformed { namespace: String },
    #[error("no random bytes for a new key")]
    Random,
}

impl KeyError {
    /// Whether asking again cannot help: the Role refuses the Secret, or it holds no key.
    pub fn is_lasting(&self) -> bool {
        match self {
            Self::Api {
                source: kube::Error::Api(status),
                ..
            } => status.code == 403,
            Self::Api { .. } => false,
            Self::Malformed { .. } | Self::Random => true,
        }
    }
}

/// A Secret [`SECRET`] with 32 random bytes, immutable.
fn new_key() -> Result<Secret, KeyError> {
    let mut key = [0_u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| KeyError::Random)?;
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(SECRET.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_owned(),
                "gpuqueue".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            KEY_FIELD.to_owned(),
            ByteString(key.to_vec()),
        )])),
        immutable: Some(true),
        ..Secret::default()
    })
}

/// The seal of the key in `namespace`'s Secret [`SECRET`], made (32 random bytes) if there is
/// none. Two leaders racing to make it both end up reading the one that was stored.
pub async fn load_or_create(client: &Client, namespace: &str) -> Result<Seal, KeyError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let api = |source| KeyError::Api {
        namespace: namespace.to_owned(),
        source,
    };
    let secret = if let Some(secret) = secrets.get_opt(SECRET).await.map_err(api)? {
        secret
    } else {
        match secrets.create(&PostParams::default(), &new_key()?).await {
            Ok(created) => created,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                secrets.get(SECRET).await.map_err(api)?
            }
            Err(error) => return Err(api(error)),
        }
    };
    let key = secret
        .data
        .as_ref()
        .and_then(|data| data.get(KEY_FIELD))
        .filter(|key| key.0.len() >= 32);
    let since = secret.metadata.creation_timestamp.as_ref().map(|t| t.0);
    match key.zip(since) {
        Some((key, since)) => Ok(Seal::new(&key.0, since)),
        None => Err(KeyError::Malformed {
            namespace: namespace.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    fn seal() -> Seal {
        Seal::new(&[7; 32], at(0))
    }

    /// A one-GPU pod of namespace `batch`, created at `created`, with `uid` if given.
    fn pod(created: i64, uid: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "namespace": "batch", "name": "p", "uid": uid,
                "creationTimestamp": Time(at(created)),
            },
            "spec": {"containers": [{"name": "main", "resources": {
                "requests": {"cpu": "2", "nvidia.com/gpu": "1"},
                "limits": {"nvidia.com/gpu": "1"},
            }}]},
        }))
        .unwrap()
    }

    const ADMITTED: Admitted<'static> = Admitted {
        queue: "batch",
        admitted_as: "guaranteed",
        admitted_at: "2027-01-15T08:00:00Z",
        node_pin: "gpu-node-0",
        token: None,
    };

    /// Writes `admitted` on `pod` as the operator does, sealed by `seal` if given.
    fn admit(mut pod: Pod, admitted: &Admitted<'_>, seal: Option<&Seal>) -> Pod {
        let tag = seal.map(|s| s.sign(&pod, admitted));
        let mut notes = BTreeMap::from([
            (annotations::QUEUE.to_owned(), admitted.queue.to_owned()),
            (
                annotations::ADMITTED_AS.to_owned(),
                admitted.admitted_as.to_owned(),
            ),
            (
                annotations::ADMITTED_AT.to_owned(),
                admitted.admitted_at.to_owned(),
            ),
        ]);
        if let Some(token) = admitted.token {
            notes.insert(
                annotations::ADMITTED_AT_CREATION.to_owned(),
                token.to_owned(),
            );
        }
        if let Some(tag) = tag {
            notes.insert(annotations::ADMISSION_SEAL.to_owned(), tag);
        }
        pod.metadata.annotations = Some(notes);
        let spec = pod.spec.as_mut().unwrap();
        spec.node_selector = Some(BTreeMap::from([(
            PIN_LABEL.to_owned(),
            admitted.node_pin.to_owned(),
        )]));
        pod
    }

    fn forged(verdict: &Verdict) -> bool {
        matches!(verdict, Verdict::Forged(_))
    }

    #[test]
    fn the_operators_admission_verifies_and_a_tenants_does_not() {
        let seal = seal();
        let sealed = admit(pod(10, Some("u-1")), &ADMITTED, Some(&seal));
        assert_eq!(seal.verdict(&sealed), Verdict::Sealed);
        assert_eq!(seal.verdict(&pod(10, Some("u-1"))), Verdict::NotAdmitted);
        let unsealed = admit(pod(10, Some("u-1")), &ADMITTED, None);
        assert_eq!(
            seal.verdict(&unsealed),
            Verdict::Forged("no admission seal".into())
        );
        let other_key = Seal::new(&[8; 32], at(0));
        let guessed = admit(pod(10, Some("u-1")), &ADMITTED, Some(&other_key));
        assert!(forged(&seal.verdict(&guessed)));
        // A seal that is not even hex, or of the wrong length.
        for junk in ["zz", "abc", "00"] {
            let mut junked = sealed.clone();
            junked
                .metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(annotations::ADMISSION_SEAL.into(), junk.into());
            assert!(forged(&seal.verdict(&junked)), "{junk}");
        }
        // Written before the key existed: a version without seals.
        assert_eq!(
            seal.verdict(&admit(pod(-5, None), &ADMITTED, None)),
            Verdict::Predates
        );
    }

    #[test]
    fn a_seal_is_good_only_for_its_pod_and_what_it_admitted() {
        let seal = seal();
        let sealed = admit(pod(10, Some("u-1")), &ADMITTED, Some(&seal));
        let notes = sealed.metadata.annotations.clone();
        // Copied onto another pod (another uid), or onto a bigger one.
        let mut copy = pod(20, Some("u-2"));
        copy.metadata.annotations.clone_from(&notes);
        copy.spec = sealed.spec.clone();
        assert!(forged(&seal.verdict(&copy)));
        let mut bigger = sealed.clone();
        bigger.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .limits
            .as_mut()
            .unwrap()
            .insert(
                "nvidia.com/gpu".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("8".into()),
            );
        assert!(forged(&seal.verdict(&bigger)));
        // Another queue, another admission time, or another node.
        for (name, value) in [
            (annotations::QUEUE, "online"),
            (annotations::ADMITTED_AT, "2027-01-15T08:00:01Z"),
            (annotations::ADMITTED_AS, "borrowed"),
        ] {
            let mut changed = sealed.clone();
            changed
                .metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(name.into(), value.into());
            assert!(forged(&seal.verdict(&changed)), "{name}");
        }
        let mut moved = sealed.clone();
        moved.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([(
            PIN_LABEL.to_owned(),
            "gpu-node-1".to_owned(),
        )]));
        assert!(forged(&seal.verdict(&moved)));
        // The CPU and memory a kubelet resizes in place are not bound.
        let mut resized = sealed;
        resized.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .requests
            .as_mut()
            .unwrap()
            .insert(
                "cpu".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("4".into()),
            );
        assert_eq!(seal.verdict(&resized), Verdict::Sealed);
    }

    #[test]
    fn an_admission_at_creation_binds_its_token_and_its_minute() {
        let seal = seal();
        let admitted = Admitted {
            admitted_at: "2027-01-15T08:00:00Z",
            token: Some("00c0ffee00c0ffee"),
            ..ADMITTED
        };
        let at_admission: Timestamp = admitted.admitted_at.parse().unwrap();
        let created = at_admission.as_second() - at(0).as_second();
        // The webhook sees no uid; the stored pod has one.
        let sealed = admit(pod(created, None), &admitted, Some(&seal));
        let mut stored = sealed.clone();
        stored.metadata.uid = Some("u-9".into());
        stored.metadata.creation_timestamp = Some(Time(at(created + 2)));
        assert_eq!(seal.verdict(&stored), Verdict::Sealed);
        // The same seal on a pod created two minutes later: a replay.
        let mut late = sealed;
        late.metadata.creation_timestamp = Some(Time(at(created + 120)));
        assert!(forged(&seal.verdict(&late)));
    }

    /// `pod` with `container` appended to its containers (or init containers).
    fn with_container(mut pod: Pod, container: serde_json::Value, init: bool) -> Pod {
        let container: Container = serde_json::from_value(container).unwrap();
        let spec = pod.spec.as_mut().unwrap();
        if init {
            spec.init_containers.get_or_insert_default().push(container);
        } else {
            spec.containers.push(container);
        }
        pod
    }

    #[test]
    fn a_token_cannot_carry_the_start_of_what_it_binds() {
        // The webhook sealed a pod whose first container, before `main`, asks for a GPU. A
        // copy leaves that container out and carries it in its token instead: joined in lines,
        // both read the same, and each pod would hold a token of its own.
        let seal = seal();
        let admitted = Admitted {
            token: Some("00c0ffee00c0ffee"),
            ..ADMITTED
        };
        let first = json!({"name": "z1", "resources": {"limits": {"nvidia.com/gpu": "1"}}});
        let mut original = pod(10, None);
        let containers = &mut original.spec.as_mut().unwrap().containers;
        containers.insert(0, serde_json::from_value(first).unwrap());
        let sealed = admit(original, &admitted, Some(&seal));
        let tag =
            sealed.metadata.annotations.as_ref().unwrap()[annotations::ADMISSION_SEAL].clone();
        let shifted = format!(
            "{}\ncontainer z1 limits nvidia.com/gpu=1",
            admitted.token.unwrap()
        );
        let mut copy = admit(
            pod(10, Some("u-2")),
            &Admitted {
                token: Some(&shifted),
                ..admitted
            },
            None,
        );
        copy.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(annotations::ADMISSION_SEAL.into(), tag);
        assert!(forged(&seal.verdict(&copy)));
    }

    #[test]
    fn a_seal_binds_what_the_core_charges_and_nothing_else() {
        let seal = seal();
        let init = json!({"name": "warmup", "resources": {"limits": {"nvidia.com/gpu": "1"}}});
        let sealed = admit(
            with_container(pod(10, Some("u-1")), init, true),
            &ADMITTED,
            Some(&seal),
        );
        assert_eq!(seal.verdict(&sealed), Verdict::Sealed);
        // The same init container restarting `Always` is a sidecar, charged for the pod's life.
        let mut sidecar = sealed.clone();
        sidecar
            .spec
            .as_mut()
            .unwrap()
            .init_containers
            .as_mut()
            .unwrap()[0]
            .restart_policy = Some("Always".into());
        assert!(forged(&seal.verdict(&sidecar)));
        // A container with a GPU, or a HAMi memory part, added after the admission.
        for added in [
            json!({"name": "more", "resources": {"limits": {"nvidia.com/gpu": "1"}}}),
            json!({"name": "main", "resources": {"limits": {"nvidia.com/gpumem": "1000"}}}),
            json!({"name": "more", "resources": {"limits":
                {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "8"}}}),
        ] {
            let grown = with_container(sealed.clone(), added.clone(), false);
            assert!(forged(&seal.verdict(&grown)), "{added}");
        }
        // What a later mutating webhook adds, and the core does not charge, keeps it.
        let injected = with_container(
            sealed,
            json!({"name": "rdma", "resources": {
                "requests": {"rdma/rdma_shared_device_a": "1", "ephemeral-storage": "1Gi",
                             "cpu": "100m", "memory": "64Mi"},
            }}),
            false,
        );
        assert_eq!(seal.verdict(&injected), Verdict::Sealed);
    }

    #[test]
    fn unadmitted_drops_every_admission_annotation_and_nothing_else() {
        let seal = seal();
        let mut sealed = admit(pod(10, Some("u-1")), &ADMITTED, Some(&seal));
        sealed
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("team".into(), "b".into());
        let read = unadmitted(&sealed);
        assert_eq!(
            read.metadata.annotations,
            Some(BTreeMap::from([("team".to_owned(), "b".to_owned())]))
        );
        assert_eq!(seal.verdict(&read), Verdict::NotAdmitted);
    }
}
