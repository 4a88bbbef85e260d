//! Enforcement, the operator's half (issue 13): evicts the unadmitted pods the core's
//! [`enforce`](gpuqueue_core::enforcement::enforce) chose, each with a `QuotaBypass` warning
//! event on the pod that says what it bypassed and what happens, and announces once each pin
//! whose room [`release_stuck_pins`](gpuqueue_core::pins::release_stuck_pins) released
//! (`PinReleased`).
//!
//! An eviction is one request to the Eviction API (PodDisruptionBudgets honoured): a refused
//! one is tried again after [`RETRY_AFTER`](super::context::RETRY_AFTER), on a pass that
//! decides again whether the pod still breaks a quota. It runs on the reclaim executor's
//! client, which never retries by itself, so a refusal does not hold a write slot for minutes.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use gpuqueue_api::events::ADMISSION_NOT_BELIEVED;
use gpuqueue_core::{
    Snapshot,
    admission::Decision,
    enforcement::{Enforcement, enforce},
    pins::StuckPin,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use tokio::task::JoinSet;

use super::{
    apply::{decided_pod, stored_pod},
    context::{Shared, WriteResult},
    observe::Unbelieved,
};
use crate::{
    reclaim::{Eviction, EvictionTarget, try_evict},
    writes::events::Notice,
};

/// Event reason: a pod that bypassed admission is evicted.
const QUOTA_BYPASS: &str = "QuotaBypass";
/// Event reason: a pinned pod kube-scheduler cannot bind lost its room.
const PIN_RELEASED: &str = "PinReleased";
/// Grace period of an evicted pod that sets none (the Kubernetes default).
const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// How often an admission still not believed is announced again: events expire (an hour by
/// default, kube-apiserver's `--event-ttl`), and `explain` tells the pod's story from them.
const ANNOUNCE_AGAIN_AFTER: SignedDuration = SignedDuration::from_mins(30);

/// What enforcement remembers from pass to pass (this term's only).
#[derive(Debug, Default)]
pub(super) struct EnforceMemory {
    /// Pods whose eviction the API server accepted, until the store no longer holds them: not
    /// evicted, counted or announced twice.
    evicted: Arc<Mutex<HashSet<String>>>,
    /// Pods whose released pin was announced, for as long as it stays released.
    announced_pins: HashSet<String>,
    /// Pods whose admission was announced as not believed, and when, for as long as it is not.
    announced_unbelieved: HashMap<String, Timestamp>,
}

impl EnforceMemory {
    /// Starts the evictions the core's enforcement calls for after the cycle that made
    /// `decisions` on `snapshot`, and announces newly released pins.
    pub(super) fn start(
        &mut self,
        shared: &Shared,
        tasks: &mut JoinSet<()>,
        snapshot: &Snapshot,
        decisions: &[Decision],
        stuck: &[StuckPin],
    ) {
        evict(shared, tasks, snapshot, enforce(snapshot, decisions), self);
        announce_pins(shared, stuck, self);
    }

    /// Announces each pod whose admission is newly not believed, and again every
    /// [`ANNOUNCE_AGAIN_AFTER`] while it stays so: a warning in the log and an event on the pod.
    pub(super) fn announce_unbelieved(
        &mut self,
        shared: &Shared,
        unbelieved: &[Unbelieved],
        now: Timestamp,
    ) {
        let mut announced = HashMap::with_capacity(unbelieved.len());
        for pod in unbelieved {
            let Some(stored) = stored_pod(&shared.context.stores, &pod.pod) else {
                continue;
            };
            let Some(uid) = stored.metadata.uid.clone() else {
                continue;
            };
            let last = self.announced_unbelieved.get(&uid).copied();
            let at = match last {
                Some(at) if now.duration_since(at) < ANNOUNCE_AGAIN_AFTER => at,
                _ => {
                    tracing::warn!(pod = %pod.pod, why = %pod.why,
                        "its admission annotations are not the operator's; it is read as unadmitted");
                    shared
                        .context
                        .events
                        .send(stored.object_ref(&()), unbelieved_notice(pod));
                    now
                }
            };
            announced.insert(uid, at);
        }
        self.announced_unbelieved = announced;
    }
}

/// Starts one eviction for each of `enforcements` that is not in flight or done already.
fn evict(
    shared: &Shared,
    tasks: &mut JoinSet<()>,
    snapshot: &Snapshot,
    enforcements: Vec<Enforcement>,
    memory: &EnforceMemory,
) {
    let stores = &shared.context.stores;
    {
        let mut evicted = crate::sync::lock(&memory.evicted);
        if !evicted.is_empty() {
            let pods = stores.pods.state();
            forget_gone(&mut evicted, pods.iter().map(AsRef::as_ref));
        }
    }
    for enforcement in enforcements {
        let Some(pod) = decided_pod(stores, snapshot, &enforcement.key) else {
            continue;
        };
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        if crate::sync::lock(&memory.evicted).contains(&uid) || !shared.assumed().begin(&uid) {
            continue;
        }
        let evicted = memory.evicted.clone();
        let context = shared.context.clone();
        shared.spawn(tasks, uid.clone(), async move {
            let grace = pod
                .spec
                .as_ref()
                .and_then(|spec| spec.termination_grace_period_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map_or(DEFAULT_GRACE, Duration::from_secs);
            let target = EvictionTarget {
                namespace: &enforcement.key.namespace,
                name: &enforcement.key.name,
                uid: &uid,
                grace,
                unchanged_since: None,
            };
            match try_evict(context.reclaimer.client(), &target).await {
                Ok(eviction) => {
                    crate::sync::lock(&evicted).insert(uid.clone());
                    if eviction != Eviction::AlreadyGone {
                        context
                            .metrics
                            .bypass_evicted(&enforcement.queue, enforcement.reason.code());
                        tracing::warn!(pod = %enforcement.key, queue = %enforcement.queue,
                            reason = enforcement.reason.code(), "evicted: {enforcement}");
                        context.events.send(pod.object_ref(&()), bypass_notice(&enforcement));
                    }
                    WriteResult::Done
                }
                Err(refusal) => {
                    tracing::warn!(pod = %enforcement.key, status = ?refusal.status,
                        "evicting a pod that bypassed admission was refused: {}; retrying", refusal.message);
                    WriteResult::Failed
                }
            }
        });
    }
}

/// Forgets the evicted pods the store no longer holds. A pod the store shows terminating is
/// kept: the pass that chose it again read the store before its deletion showed (the soak
/// caught a second eviction 18 ms after the first, when this read kept only pods not yet
/// terminating).
fn forget_gone<'a>(evicted: &mut HashSet<String>, stored: impl Iterator<Item = &'a Pod>) {
    let held: HashSet<&str> = stored
        .filter_map(|pod| pod.metadata.uid.as_deref())
        .collect();
    evicted.retain(|uid| held.contains(uid.as_str()));
}

/// The `QuotaBypass` event of an evicted pod.
fn bypass_notice(enforcement: &Enforcement) -> Notice {
    Notice {
        warning: true,
        reason: QUOTA_BYPASS,
        action: "Evict",
        note: format!("evicted: {enforcement}"),
    }
}

/// The `AdmissionNotBelieved` event of a pod whose admission annotations are not the
/// operator's.
fn unbelieved_notice(pod: &Unbelieved) -> Notice {
    Notice {
        warning: true,
        reason: ADMISSION_NOT_BELIEVED,
        action: "Charge",
        note: format!(
            "its admission annotations are not the operator's ({}): it is charged to its queue as unadmitted, the first victim of any reclaim, and evicted (QuotaBypass) while the queue is over its ceiling, or above its guarantee while another queue waits within its own; only pods the gpuqueue webhook or gate admits are admitted",
            pod.why
        ),
    }
}

/// Announces each newly released pin once; a pod whose pin is no longer released (bound, or
/// gone) may be announced again if it gets stuck again.
fn announce_pins(shared: &Shared, stuck: &[StuckPin], memory: &mut EnforceMemory) {
    let mut announced = HashSet::new();
    for pin in stuck {
        let Some(pod) = stored_pod(&shared.context.stores, &pin.key) else {
            continue;
        };
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        if !memory.announced_pins.contains(&uid) {
            tracing::warn!(pod = %pin.key, node = %pin.node, "{pin}");
            shared
                .context
                .events
                .send(pod.object_ref(&()), pin_notice(pin));
        }
        announced.insert(uid);
    }
    memory.announced_pins = announced;
}

/// The `PinReleased` event of a pinned pod that never bound.
fn pin_notice(pin: &StuckPin) -> Notice {
    Notice {
        warning: true,
        reason: PIN_RELEASED,
        action: "Release",
        note: pin.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use gpuqueue_core::{
        Snapshot,
        model::{Assignment, GpuRequest, Node, PodKey, PodState, Queue, Requests, ResourceQuota},
    };
    use jiff::Timestamp;

    use super::*;

    /// Batch (ceiling 2) with two unadmitted pods of 2 GPUs.
    fn over_ceiling() -> Vec<Enforcement> {
        let pods = (0..2).map(|i| {
            let mut pod = gpuqueue_core::model::Pod::new(
                PodKey::new("batch", format!("p{i}")),
                Requests {
                    gpus: vec![GpuRequest::devices("nvidia.com/gpu", 2)],
                    ..Requests::default()
                },
                Timestamp::from_second(i).unwrap(),
            );
            pod.state = PodState::Admitted(Assignment::default());
            pod.unadmitted = true;
            pod
        });
        let (snapshot, _) = Snapshot::builder()
            .queue(
                Queue::new("batch")
                    .namespace("batch")
                    .quota(ResourceQuota::devices("nvidia.com/gpu", 2, 0)),
            )
            .node(Node::new("n1").gpus("nvidia.com/gpu", 8))
            .pods(pods)
            .build();
        enforce(&snapshot, &[])
    }

    #[test]
    fn an_evicted_pod_is_remembered_while_it_terminates_and_forgotten_once_gone() {
        let pod = |uid: &str, terminating: bool| {
            let mut pod = Pod::default();
            pod.metadata.uid = Some(uid.to_owned());
            if terminating {
                pod.metadata.deletion_timestamp = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
                );
            }
            pod
        };
        let mut evicted: HashSet<String> = ["a", "b", "c"].map(String::from).into();
        let stored = [pod("a", true), pod("b", false)];
        forget_gone(&mut evicted, stored.iter());
        let mut kept: Vec<&str> = evicted.iter().map(String::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["a", "b"]);
    }

    #[test]
    fn the_unbelieved_admission_event_says_why_and_what_follows() {
        let notice = unbelieved_notice(&Unbelieved {
            pod: PodKey::new("batch", "p"),
            why: "no admission seal".into(),
        });
        assert!(notice.warning);
        assert_eq!(notice.reason, "AdmissionNotBelieved");
        assert!(
            notice.note.starts_with(
                "its admission annotations are not the operator's (no admission seal): it is charged to its queue as unadmitted"
            ),
            "{}",
            notice.note
        );
    }

    #[test]
    fn the_bypass_event_says_what_the_pod_bypassed_and_what_happens() {
        let enforcements = over_ceiling();
        assert_eq!(enforcements.len(), 1);
        let notice = bypass_notice(&enforcements[0]);
        assert!(notice.warning);
        assert_eq!(notice.reason, "QuotaBypass");
        assert!(
            notice.note.starts_with(
                "evicted: it holds 2 nvidia.com/gpu of queue batch without admission and batch is over its ceiling of 2 (4 allocated); create GPU pods while the gpuqueue webhook is up"
            ),
            "{}",
            notice.note
        );
    }
}
