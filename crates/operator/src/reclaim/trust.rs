//! Which reclaim annotations the operator believes. A tenant with `edit` can put any
//! `gpuqueue.io/reclaim-*` annotation on a pod it creates while the webhook is down, so a mark
//! counts only when the reclaim it names is recorded in operator-owned state
//! ([`super::in_flight`]: the owner queue's `status.reclaimsInFlight`, or this process's own
//! entries the store does not show yet) and names this very pod (key and uid) in this role,
//! with each pod's queue the one that claims its namespace. Anything else is inert: it is not
//! resumed, defers nothing, and does not make a pod un-evictable.
//!
//! Times read back are clamped to now + the longest budget, so a skewed or forged "2099" never
//! defers a reclaim or starts a cool-down in the future.

use std::collections::HashMap;
use std::sync::Arc;

use gpuqueue_api::v1alpha1::ReclaimInFlight;
use gpuqueue_core::model::{
    self, Claim, MAX_BUDGET, PodKey, PodState, ReclaimRole, claim_of, is_gated,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;

use super::intent::{Mark, Role};
use crate::cluster::stores::Stores;

/// The latest a time read back from the cluster may be at `now`: now + the longest budget.
pub fn clamp(at: Timestamp, now: Timestamp) -> Timestamp {
    let latest = SignedDuration::try_from(MAX_BUDGET)
        .ok()
        .and_then(|budget| now.checked_add(budget).ok())
        .unwrap_or(now);
    at.min(latest)
}

/// Which queue claims each namespace, from the queues and namespaces of one pass.
#[derive(Debug, Default)]
pub struct Claims {
    queues: Vec<model::Queue>,
    namespaces: HashMap<String, model::Namespace>,
}

impl Claims {
    pub fn new(queues: &[model::Queue], namespaces: &[model::Namespace]) -> Self {
        Self {
            queues: queues.to_vec(),
            namespaces: namespaces
                .iter()
                .map(|n| (n.name.clone(), n.clone()))
                .collect(),
        }
    }

    /// The valid queues and the namespaces the stores hold.
    pub fn read(stores: &Stores) -> Self {
        let queues: Vec<model::Queue> = stores
            .queues
            .state()
            .iter()
            .filter_map(|stored| model::Queue::from_api(stored.0.as_ref().ok()?).ok())
            .collect();
        let namespaces: Vec<model::Namespace> = stores
            .namespaces
            .state()
            .iter()
            .map(|n| model::Namespace::from_k8s(n))
            .collect();
        Self::new(&queues, &namespaces)
    }

    /// The one queue that claims `namespace`, if exactly one does.
    pub fn queue_of(&self, namespace: &str) -> Option<String> {
        let unlabelled;
        let namespace = if let Some(known) = self.namespaces.get(namespace) {
            known
        } else {
            unlabelled = model::Namespace::new(namespace);
            &unlabelled
        };
        match claim_of(&self.queues, namespace) {
            Claim::Queue(queue) => Some(queue),
            Claim::Conflict(_) | Claim::Unclaimed => None,
        }
    }

    /// Why `queue` may not lose pod `pod` (`namespace/name`) to a reclaim: the queue that
    /// claims its namespace is another one, or none. `None` when it may.
    pub fn refuses_victim(&self, pod: &str, queue: &str) -> Option<String> {
        let namespace = pod.split_once('/').map_or("", |(ns, _)| ns);
        match self.queue_of(namespace) {
            Some(claimed) if claimed == queue => None,
            Some(claimed) => Some(format!(
                "its namespace {namespace} is claimed by queue {claimed}, not by {queue}, the queue the reclaim would take it from"
            )),
            None => Some(format!(
                "no single queue claims its namespace {namespace}, so it cannot be taken from queue {queue}"
            )),
        }
    }
}

/// A reclaim in flight as the operator recorded it, with its times clamped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The owner's queue, whose status holds the entry.
    pub queue: String,
    pub entry: ReclaimInFlight,
}

/// Every reclaim in flight the operator recorded.
#[derive(Debug, Default)]
pub struct Trusted(HashMap<String, Recorded>);

/// What recovery believes: which queue claims each namespace, and the pods whose marks an
/// entry in flight vouches for ([`Trusted::vouches_for`]).
#[derive(Debug, Clone, Copy)]
pub struct Vouched<'a> {
    pub claims: &'a Claims,
    pub pods: &'a [Arc<Pod>],
}

impl Trusted {
    /// The entries of every queue's status in the store, and `mine` (written by this process,
    /// perhaps not in the store yet), read at `now`.
    pub fn read(stores: &Stores, mine: impl IntoIterator<Item = Recorded>, now: Timestamp) -> Self {
        let queues = stores.queues.state();
        let recorded = queues.iter().filter_map(|object| {
            let queue = object.0.as_ref().ok()?;
            let name = queue.metadata.name.clone()?;
            let entries = queue.status.as_ref()?.reclaims_in_flight.clone();
            Some(entries.into_iter().map(move |entry| Recorded {
                queue: name.clone(),
                entry,
            }))
        });
        let mut trusted = Self::default();
        for mut recorded in recorded.flatten().chain(mine) {
            let entry = &mut recorded.entry;
            entry.deadline.0 = clamp(entry.deadline.0, now);
            entry.started_at.0 = clamp(entry.started_at.0, now).min(entry.deadline.0);
            trusted.0.insert(entry.id.clone(), recorded);
        }
        trusted
    }

    pub fn get(&self, id: &str) -> Option<&Recorded> {
        self.0.get(id)
    }

    /// Whether no reclaim is in flight.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Recorded> {
        self.0.values()
    }

    /// Whether the reclaim mark of `pod` (if any) is one the operator recorded.
    pub fn vouches_for(&self, pod: &Pod, claims: &Claims) -> bool {
        let Some(mark) = Mark::read(pod) else {
            return false;
        };
        let key = PodKey::new(
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        mark.role
            .is_some_and(|role| self.names(&mark.id, role, &key, uid, claims))
    }

    /// Whether reclaim `id` is recorded with pod `key` (uid `uid`) in `role`, and that pod's
    /// queue claims its namespace.
    fn names(&self, id: &str, role: Role, key: &PodKey, uid: &str, claims: &Claims) -> bool {
        let Some(recorded) = self.0.get(id) else {
            return false;
        };
        let pod = key.to_string();
        let claimed = claims.queue_of(&key.namespace);
        match role {
            Role::Owner => {
                recorded.entry.owner_pod == pod
                    && recorded.entry.owner_uid == uid
                    && claimed.as_deref() == Some(recorded.queue.as_str())
            }
            Role::Victim => recorded.entry.victims.iter().any(|v| {
                v.pod == pod && v.uid == uid && claimed.as_deref() == Some(v.queue.as_str())
            }),
        }
    }

    /// Takes the reclaim mark off every pod of `pods` (the core's model of this pass) whose
    /// mark the operator did not record, so that the core plans as if it were not there: a
    /// forged victim mark no longer makes a pod un-evictable. `stored` finds a pod's uid,
    /// `finished` whether the owner's queue keeps a record of the reclaim's end with the pod as
    /// its owner. Returns how many marks were dropped, those owners not counted.
    pub fn drop_unrecorded_marks(
        &self,
        pods: &mut [Arc<model::Pod>],
        claims: &Claims,
        stored: impl Fn(&PodKey) -> Option<Arc<Pod>>,
        finished: impl Fn(&str, &PodKey) -> bool,
    ) -> Dropped {
        let mut dropped = Dropped::default();
        for pod in pods {
            let Some(mark) = &pod.reclaim else { continue };
            let role = match mark.role {
                ReclaimRole::Owner => Role::Owner,
                ReclaimRole::Victim => Role::Victim,
            };
            let stored = stored(&pod.key);
            let uid = stored.as_ref().and_then(|p| p.metadata.uid.clone());
            let recorded =
                uid.is_some_and(|uid| self.names(&mark.id, role, &pod.key, &uid, claims));
            if !recorded {
                if role == Role::Owner && finished(&mark.id, &pod.key) {
                    dropped
                        .finished_owners
                        .push((pod.key.clone(), mark.id.clone()));
                } else {
                    tracing::debug!(pod = %pod.key, reclaim = %mark.id,
                        "a reclaim mark the operator did not record is ignored");
                    dropped.unrecorded += 1;
                }
                let pod = Arc::make_mut(pod);
                pod.reclaim = None;
                // Only a held owner is admitted at the gate: without its mark it waits there.
                if stored.is_some_and(|p| is_gated(&p)) {
                    pod.state = PodState::Pending;
                }
            }
        }
        dropped
    }
}

/// The marks [`Trusted::drop_unrecorded_marks`] took off.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Marks nobody recorded: forged, or left by a start that failed.
    pub unrecorded: usize,
    /// Owners whose reclaim ended and was recorded, each with the reclaim's id: the operator
    /// that ran it stopped before it cleared the owner's intent (the last step, after the
    /// records), which is left to clear.
    pub finished_owners: Vec<(PodKey, String)>,
}

/// Whether queue `queue` (as the store shows it) keeps the record of reclaim `id`'s end with
/// `owner` as its owner.
pub fn records_owner(stores: &Stores, queue: &str, id: &str, owner: &PodKey) -> bool {
    let owner = owner.to_string();
    stores
        .queues
        .get(&ObjectRef::new(queue))
        .and_then(|stored| stored.0.as_ref().ok().cloned())
        .and_then(|queue| queue.status)
        .is_some_and(|status| {
            status.last_handovers.iter().any(|record| {
                record.id == id && record.role == Role::Owner.as_str() && record.owner_pod == owner
            })
        })
}

/// The pod `key` names in the store.
pub fn stored_pod(stores: &Stores, key: &PodKey) -> Option<Arc<Pod>> {
    stores
        .pods
        .get(&ObjectRef::new(&key.name).within(&key.namespace))
}

#[cfg(test)]
mod tests {
    use gpuqueue_api::v1alpha1::VictimInFlight;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use serde_json::json;

    use super::*;
    use crate::cluster::testing::claiming_stores;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const NOW: &str = "2026-01-01T00:00:00Z";

    fn entry(id: &str, deadline: &str) -> ReclaimInFlight {
        ReclaimInFlight {
            id: id.into(),
            owner_pod: "online/owner".into(),
            owner_uid: "uid-owner".into(),
            node: "gpu-node-1".into(),
            victims: vec![VictimInFlight {
                pod: "batch/victim".into(),
                uid: "uid-victim".into(),
                queue: "batch".into(),
            }],
            started_at: MicroTime(at(NOW)),
            deadline: MicroTime(at(deadline)),
        }
    }

    fn marked(namespace: &str, name: &str, uid: &str, id: &str, role: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": {
                "gpuqueue.io/reclaim-id": id, "gpuqueue.io/reclaim-role": role,
                "gpuqueue.io/reclaim-deadline": "2099-01-01T00:00:00Z"}},
            "spec": {"containers": []},
        }))
        .unwrap()
    }

    fn recorded_on_online(
        entry: &ReclaimInFlight,
    ) -> (crate::cluster::testing::TestStores, Trusted) {
        let mut stores = claiming_stores();
        let mut online = crate::cluster::testing::queue("online", &["online"], None);
        online["status"] = json!({"reclaimsInFlight": [entry]});
        stores.add_queue(online);
        let trusted = Trusted::read(&stores.stores, [], at(NOW));
        (stores, trusted)
    }

    #[test]
    fn times_read_back_are_clamped_to_now_plus_the_longest_budget() {
        let (_stores, trusted) = recorded_on_online(&entry("rc-1", "2099-01-01T00:00:00Z"));
        let recorded = trusted.get("rc-1").unwrap();
        assert_eq!(recorded.entry.deadline.0, at("2026-01-01T00:01:00Z"));
        assert_eq!(recorded.queue, "online");
        assert_eq!(
            clamp(at("2025-12-31T00:00:00Z"), at(NOW)),
            at("2025-12-31T00:00:00Z")
        );
    }

    #[test]
    fn only_the_pods_a_recorded_reclaim_names_are_vouched_for() {
        let (stores, trusted) = recorded_on_online(&entry("rc-1", "2026-01-01T00:00:03Z"));
        let claims = Claims::read(&stores.stores);
        let yes = |pod: Pod| trusted.vouches_for(&pod, &claims);
        assert!(yes(marked("online", "owner", "uid-owner", "rc-1", "owner")));
        assert!(yes(marked(
            "batch",
            "victim",
            "uid-victim",
            "rc-1",
            "victim"
        )));
        // Forged: an unrecorded id, another pod, a namesake, the wrong role.
        assert!(!yes(marked(
            "batch",
            "victim",
            "uid-victim",
            "rc-forged",
            "victim"
        )));
        assert!(!yes(marked(
            "batch",
            "other",
            "uid-other",
            "rc-1",
            "victim"
        )));
        assert!(!yes(marked("batch", "victim", "uid-new", "rc-1", "victim")));
        assert!(!yes(marked(
            "batch",
            "victim",
            "uid-victim",
            "rc-1",
            "owner"
        )));
        assert!(!yes(marked(
            "online",
            "owner",
            "uid-owner",
            "rc-1",
            "victim"
        )));
    }

    #[test]
    fn a_victim_whose_queue_does_not_claim_its_namespace_is_not_vouched_for() {
        let mut forged = entry("rc-1", "2026-01-01T00:00:03Z");
        // Recorded as batch's, but "online" is online's namespace.
        forged.victims[0].pod = "online/victim".into();
        let (stores, trusted) = recorded_on_online(&forged);
        let claims = Claims::read(&stores.stores);
        assert!(!trusted.vouches_for(
            &marked("online", "victim", "uid-victim", "rc-1", "victim"),
            &claims
        ));
        assert_eq!(claims.refuses_victim("batch/v", "batch"), None);
        let refused = claims.refuses_victim("online/v", "batch").unwrap();
        assert!(
            refused.contains("claimed by queue online, not by batch"),
            "{refused}"
        );
        let shared = claims.refuses_victim("shared/v", "batch").unwrap();
        assert!(shared.contains("no single queue claims"), "{shared}");
    }

    /// The core's model of `pods`, each asking one GPU, created at [`NOW`].
    fn modelled(pods: &[Pod]) -> Vec<Arc<model::Pod>> {
        pods.iter()
            .map(|p| {
                let mut p = serde_json::to_value(p).unwrap();
                p["metadata"]["creationTimestamp"] = json!(NOW);
                p["spec"]["containers"] = json!([{"name": "c", "image": "i",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]);
                let p: Pod = serde_json::from_value(p).unwrap();
                Arc::new(model::Pod::from_k8s(&p).unwrap().unwrap().value)
            })
            .collect()
    }

    #[test]
    fn unrecorded_marks_are_taken_off_the_model_and_recorded_ones_kept() {
        let (mut stores, trusted) = recorded_on_online(&entry("rc-1", "2026-01-01T00:00:03Z"));
        let forged = marked("batch", "forged", "uid-forged", "rc-forged", "victim");
        let real = marked("batch", "victim", "uid-victim", "rc-1", "victim");
        // A gated pod forged to look like a held owner: admitted, pinned and marked.
        let mut held: Pod = marked("online", "held", "uid-held", "rc-forged", "owner");
        held.metadata.annotations.as_mut().unwrap().insert(
            "gpuqueue.io/admitted-at".into(),
            "2026-01-01T00:00:00Z".into(),
        );
        let spec = held.spec.as_mut().unwrap();
        spec.node_selector = Some([("kubernetes.io/hostname".to_owned(), "n1".to_owned())].into());
        spec.scheduling_gates = Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
            name: gpuqueue_api::ADMISSION_GATE.into(),
        }]);
        for pod in [&forged, &real, &held] {
            stores.add_pod(serde_json::to_value(pod).unwrap());
        }
        let mut pods = modelled(&[forged, real, held]);
        assert!(pods.iter().all(|p| p.reclaim.is_some()));
        let claims = Claims::read(&stores.stores);
        let dropped = trusted.drop_unrecorded_marks(
            &mut pods,
            &claims,
            |key| stored_pod(&stores.stores, key),
            |_, _| false,
        );
        assert_eq!(dropped.unrecorded, 2);
        assert!(dropped.finished_owners.is_empty());
        assert_eq!(pods[0].reclaim, None, "the forged mark is gone");
        assert!(pods[1].reclaim.is_some(), "the recorded one stays");
        assert_eq!(pods[2].reclaim, None);
        assert_eq!(pods[2].state, PodState::Pending, "it waits at the gate");
    }

    /// Review finding: an operator that stopped between a handover's records (which take the
    /// reclaim out of `status.reclaimsInFlight`) and clearing its owner's intent left a mark
    /// nobody vouched for, for good: counted as unrecorded (`GpuQueueUnrecordedReclaimMarks`)
    /// and never cleared. The owner queue's record of the end vouches for it now.
    #[test]
    fn an_owner_whose_handover_ended_and_was_recorded_is_left_to_clear_not_counted() {
        let mut stores = claiming_stores();
        let mut online = crate::cluster::testing::queue("online", &["online"], None);
        online["status"] = json!({"lastHandovers": [
            {"id": "rc-done", "role": "owner", "ownerPod": "online/done", "node": "n1",
             "outcome": "Completed", "budgetMillis": 3000, "totalMillis": 1400}]});
        stores.add_queue(online);
        let owner =
            |name: &str, id: &str| marked("online", name, &format!("uid-{name}"), id, "owner");
        let pods = [
            owner("done", "rc-done"),
            owner("other", "rc-done"),
            owner("forged", "rc-x"),
        ];
        for pod in &pods {
            stores.add_pod(serde_json::to_value(pod).unwrap());
        }
        let mut model = modelled(&pods);
        let claims = Claims::read(&stores.stores);
        let trusted = Trusted::read(&stores.stores, [], at(NOW));
        let dropped = trusted.drop_unrecorded_marks(
            &mut model,
            &claims,
            |key| stored_pod(&stores.stores, key),
            |id, owner| records_owner(&stores.stores, "online", id, owner),
        );
        assert_eq!(
            dropped.finished_owners,
            [(PodKey::new("online", "done"), "rc-done".to_owned())]
        );
        assert_eq!(
            dropped.unrecorded, 2,
            "another pod, or another id, is not its owner"
        );
        assert!(model.iter().all(|p| p.reclaim.is_none()));
    }
}
