//! Pins that never bind. A pod the operator admitted and pinned to a node (released from the
//! gate, `nodeSelector` on the node's hostname) that kube-scheduler still reports
//! `Unschedulable` after [`UNBINDABLE_AFTER`] (say a pod affinity, a volume or a taint that
//! node cannot satisfy) would hold its room there for good: the snapshot seats it and admits
//! nobody into its devices.
//!
//! Its room is released: the snapshot no longer seats it on the node, so other pods are
//! admitted there. It keeps its quota charge: its admission stands, and evicting it would only
//! bring it back through the gate to be pinned the same way again; its owner is told what keeps
//! it off the node. If kube-scheduler binds it later, it is seated where it is bound. A reclaim's
//! owner is left pinned: it waits for its victims, and the handover budget bounds that wait.

use std::{fmt, sync::Arc, time::Duration};

use jiff::{SignedDuration, Timestamp};

use crate::model::Pod;
use crate::model::{PodKey, PodState, format_duration};

/// How long kube-scheduler may report a pinned pod unschedulable before its room is released.
pub const UNBINDABLE_AFTER: Duration = Duration::from_mins(1);

/// A pinned pod whose room was released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StuckPin {
    pub key: PodKey,
    /// The node it is pinned to.
    pub node: String,
    /// Since when kube-scheduler reports it unschedulable.
    pub since: Timestamp,
}

impl fmt::Display for StuckPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kube-scheduler has not bound the pod to node {}, where gpuqueue admitted it, since {} (more than {}); its room there is released for other pods and it keeps its queue's quota: fix what keeps it off that node (pod affinity, volumes, taints) or delete it",
            self.node,
            self.since,
            format_duration(UNBINDABLE_AFTER)
        )
    }
}

/// What [`release_stuck_pins`] did, and when it has more to do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Released {
    pub pins: Vec<StuckPin>,
    /// When the next pinned pod that kube-scheduler reports unschedulable reaches the limit
    /// (nothing else may change by then: the caller wakes up for it).
    pub next: Option<Timestamp>,
}

/// Releases the room of every pinned, unbound pod that kube-scheduler has reported
/// unschedulable for `after` or longer at `now`, and says which.
pub fn release_stuck_pins(pods: &mut [Arc<Pod>], now: Timestamp, after: Duration) -> Released {
    let after = SignedDuration::try_from(after).unwrap_or(SignedDuration::MAX);
    let mut released = Released::default();
    for pod in pods {
        let (Some(since), None) = (pod.unschedulable_since, &pod.reclaim) else {
            continue;
        };
        let PodState::Admitted(assignment) = &pod.state else {
            continue;
        };
        if assignment.bound || assignment.terminating || assignment.node.is_none() {
            continue;
        }
        if now.duration_since(since) < after {
            let due = since.checked_add(after).ok();
            released.next = released.next.into_iter().chain(due).min();
            continue;
        }
        // Copied only now, when released (a pod model is shared from pass to pass).
        let pod = Arc::make_mut(pod);
        if let PodState::Admitted(assignment) = &mut pod.state
            && let Some(node) = assignment.node.take()
        {
            released.pins.push(StuckPin {
                key: pod.key.clone(),
                node,
                since,
            });
        }
    }
    released
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Assignment, GpuRequest, Requests};

    fn pinned(name: &str, unschedulable_since: Option<i64>) -> Pod {
        let mut pod = Pod::new(
            PodKey::new("ns", name),
            Requests {
                gpus: vec![GpuRequest::devices("nvidia.com/gpu", 1)],
                ..Requests::default()
            },
            Timestamp::UNIX_EPOCH,
        );
        pod.state = PodState::Admitted(Assignment {
            node: Some("n1".into()),
            bound: false,
            terminating: false,
        });
        pod.unschedulable_since = unschedulable_since.map(|s| Timestamp::from_second(s).unwrap());
        pod
    }

    #[test]
    fn a_pin_unschedulable_for_long_enough_loses_its_room_only() {
        let mut pods = [
            pinned("stuck", Some(0)),
            pinned("young", Some(30)),
            pinned("fine", None),
        ]
        .map(Arc::new);
        let now = Timestamp::from_second(60).unwrap();
        let Released {
            pins: released,
            next,
        } = release_stuck_pins(&mut pods, now, UNBINDABLE_AFTER);
        assert_eq!(released.len(), 1);
        assert_eq!(
            next,
            Some(Timestamp::from_second(90).unwrap()),
            "the young one is due then"
        );
        assert_eq!(released[0].key.name, "stuck");
        assert_eq!(released[0].node, "n1");
        // Still admitted (charged to its queue), but seated nowhere.
        assert_eq!(pods[0].state, PodState::Admitted(Assignment::default()));
        assert!(matches!(&pods[1].state, PodState::Admitted(a) if a.node.is_some()));
        assert!(released[0].to_string().contains("keeps its queue's quota"));
    }

    #[test]
    fn bound_pods_and_reclaim_owners_keep_their_node() {
        let mut bound = pinned("bound", Some(0));
        if let PodState::Admitted(a) = &mut bound.state {
            a.bound = true;
        }
        let mut owner = pinned("owner", Some(0));
        owner.reclaim = Some(crate::model::ReclaimMark {
            id: "r1".into(),
            role: crate::model::ReclaimRole::Owner,
        });
        let mut pods = [bound, owner].map(Arc::new);
        let now = Timestamp::from_second(600).unwrap();
        assert_eq!(
            release_stuck_pins(&mut pods, now, UNBINDABLE_AFTER),
            Released::default()
        );
    }
}
