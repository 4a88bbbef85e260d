//! Recording, before the call, that a victim's checkpoint is being made, so that no process
//! ever makes it twice. The pod is read from the API server, not the store: after a failover
//! the new leader's store may still be relisting, and miss the mark the old leader wrote just
//! before it stopped. The mark is then written with a test of the version read, so of two
//! processes at most one writes it.

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::Patch};
use tokio::time::Instant;

use super::{
    intent::{self, Mark},
    reclaimer::Reclaimer,
};

/// How many times a mark is tried when the pod changes between the read and the write (its
/// status, written by the kubelet, changes its version too).
const ATTEMPTS: usize = 3;

/// What recording a checkpoint call found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallRecord {
    /// This process wrote the mark: it makes the call.
    Written,
    /// An earlier leader marked it before it stopped: the call was made, and is never repeated.
    MadeBefore,
}

/// Marks pod `name` (uid `uid`) of reclaim `id` as being checkpointed by `deadline`, the
/// checkpoint's own: an API server slow to take the mark would otherwise hold the checkpoint,
/// and the eviction after it, past the time the budget keeps for them. An error says why not;
/// a mark that may have landed unanswered only keeps the next leader from calling.
pub async fn record_call(
    pods: &Api<Pod>,
    target: (&str, &str),
    id: &str,
    deadline: Instant,
) -> Result<CallRecord, String> {
    tokio::time::timeout_at(deadline, mark_call(pods, target, id))
        .await
        .unwrap_or_else(|_| {
            Err("the API server did not answer before the checkpoint's deadline".into())
        })
}

async fn mark_call(
    pods: &Api<Pod>,
    (name, uid): (&str, &str),
    id: &str,
) -> Result<CallRecord, String> {
    for _ in 0..ATTEMPTS {
        let pod = pods.get(name).await.map_err(|e| e.to_string())?;
        if pod.metadata.uid.as_deref() != Some(uid) {
            return Err(format!("pod {name} was replaced by another of its name"));
        }
        if Mark::read(&pod).is_some_and(|mark| mark.id == id && mark.checkpoint_started) {
            return Ok(CallRecord::MadeBefore);
        }
        let patch = intent::progress_patch(&pod, id).map_err(|e| e.to_string())?;
        match pods
            .patch(name, &Reclaimer::params(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(_) => return Ok(CallRecord::Written),
            // 422: a `test` failed (the pod changed since the read); 409: the same, seen by
            // the storage layer. Read again.
            Err(kube::Error::Api(status)) if status.code == 422 || status.code == 409 => {}
            Err(error) => return Err(error.to_string()),
        }
    }
    Err(format!("pod {name} kept changing under {ATTEMPTS} tries"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly
    use serde_json::{Value, json};

    use std::time::Duration;

    use super::*;
    use crate::mock_api::{self, Log};

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(1)
    }

    /// The victim as the API server shows it: reclaim `rc-1`, version `version`, `progress`.
    fn victim(version: &str, progress: Option<&str>) -> Value {
        let mut annotations = json!({"gpuqueue.io/reclaim-id": "rc-1"});
        if let Some(progress) = progress {
            annotations["gpuqueue.io/reclaim-progress"] = json!(progress);
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "v", "namespace": "batch",
            "uid": "uid-v", "resourceVersion": version, "annotations": annotations}})
    }

    /// Pods whose reads show `reads` in turn (the last repeats), and whose patches are
    /// answered by `patches` in turn.
    fn pods(reads: Vec<Value>, patches: Vec<u16>) -> (Api<Pod>, Log) {
        let (mut reads, mut patches) = (reads.into_iter(), patches.into_iter());
        let mut last = Value::Null;
        let (client, log) = mock_api::serve(move |request| {
            if request.method == "GET" {
                last = reads.next().unwrap_or_else(|| last.clone());
                return (200, last.clone());
            }
            match patches.next().unwrap() {
                200 => (200, last.clone()),
                code => mock_api::failure(code, "Invalid", "the test failed"),
            }
        });
        (Api::namespaced(client, "batch"), log)
    }

    #[tokio::test]
    async fn a_call_an_earlier_leader_recorded_is_never_made_again() {
        let (pods, seen) = pods(vec![victim("7", Some("checkpointing"))], vec![]);
        let recorded = record_call(&pods, ("v", "uid-v"), "rc-1", later()).await;
        assert_eq!(recorded, Ok(CallRecord::MadeBefore));
        let seen = seen.lock().unwrap();
        assert!(seen.iter().all(|s| s.method == "GET"), "{seen:?}");
    }

    #[tokio::test]
    async fn the_mark_tests_the_version_read_and_is_read_again_when_it_changed() {
        let reads = vec![victim("7", None), victim("8", None)];
        let (pods, seen) = pods(reads, vec![422, 200]);
        let recorded = record_call(&pods, ("v", "uid-v"), "rc-1", later()).await;
        assert_eq!(recorded, Ok(CallRecord::Written));
        let seen = seen.lock().unwrap();
        let methods: Vec<&str> = seen.iter().map(|s| s.method.as_str()).collect();
        assert_eq!(methods, ["GET", "PATCH", "GET", "PATCH"]);
        let version = json!({"op": "test", "path": "/metadata/resourceVersion", "value": "8"});
        assert!(
            seen[3].body.as_array().unwrap().contains(&version),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn a_namesake_is_not_marked() {
        let mut namesake = victim("9", None);
        namesake["metadata"]["uid"] = json!("uid-other");
        let (pods, _) = pods(vec![namesake], vec![]);
        assert!(
            record_call(&pods, ("v", "uid-v"), "rc-1", later())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_mark_the_api_server_does_not_answer_is_given_up_at_the_checkpoints_deadline() {
        let pods = Api::namespaced(mock_api::stalled(), "batch");
        let deadline = Instant::now() + Duration::from_millis(300);
        let recorded = record_call(&pods, ("v", "uid-v"), "rc-1", deadline).await;
        assert!(recorded.unwrap_err().contains("deadline"));
        assert_eq!(Instant::now(), deadline);
    }
}
