//! Watches that follow a burst as the API server saw it: when each owner pod appeared and was
//! bound (this process's wall clock, the same machine's as the operator's), and what the
//! operator recorded (`status.reclaimsInFlight` with its microsecond `startedAt`, and the
//! records of `status.lastHandovers`, which keeps only the newest few: a watch sees each one
//! as it is written).

use std::collections::HashMap;

use gpuqueue_api::v1alpha1::{GpuQueue, HandoverRecord};
use gpuqueue_e2e::{Sightings, node_of};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::watcher;

/// The wall clock, to line this process's sightings up with the operator's timestamps.
#[allow(clippy::disallowed_methods)] // a benchmark's own clock, compared with the operator's
pub fn wall_clock() -> Timestamp {
    Timestamp::now()
}

/// One owner pod as this process saw it.
#[derive(Debug, Clone, Default)]
pub struct PodSighting {
    /// First seen (its creation, within the watch's latency).
    pub seen: Option<Timestamp>,
    /// First seen bound to a node.
    pub bound: Option<Timestamp>,
}

/// A reclaim of the owner queue, as the operator recorded it.
#[derive(Debug, Clone, Default)]
pub struct ReclaimSighting {
    /// `namespace/name` of the owner pod.
    pub owner_pod: String,
    /// When the operator found the owner blocked (microseconds, from `reclaimsInFlight`).
    pub started: Option<Timestamp>,
    /// Its record from `lastHandovers`, if the watch saw it.
    pub record: Option<HandoverRecord>,
}

/// The pods of one namespace, by name: when each was first seen and first seen bound.
pub fn watch_pods(pods: Api<Pod>) -> Sightings<HashMap<String, PodSighting>> {
    Sightings::start(
        pods,
        watcher::Config::default(),
        |log: &mut HashMap<String, PodSighting>, pod: Pod| {
            let now = wall_clock();
            let entry = log
                .entry(pod.metadata.name.clone().unwrap_or_default())
                .or_default();
            entry.seen.get_or_insert(now);
            if node_of(&pod).is_some() {
                entry.bound.get_or_insert(now);
            }
        },
    )
}

/// The reclaims of the queue `name`, by id.
pub fn watch_reclaims(
    queues: Api<GpuQueue>,
    name: &str,
) -> Sightings<HashMap<String, ReclaimSighting>> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    Sightings::start(
        queues,
        config,
        |log: &mut HashMap<String, ReclaimSighting>, queue: GpuQueue| {
            let Some(status) = queue.status else { return };
            for reclaim in status.reclaims_in_flight {
                let entry = log.entry(reclaim.id).or_default();
                entry.owner_pod = reclaim.owner_pod;
                entry.started.get_or_insert(reclaim.started_at.0);
            }
            for record in status.last_handovers {
                if record.role == "owner" && !record.outcome.is_empty() {
                    let entry = log.entry(record.id.clone()).or_default();
                    entry.owner_pod.clone_from(&record.owner_pod);
                    entry.record = Some(record);
                }
            }
        },
    )
}
