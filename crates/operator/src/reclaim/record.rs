//! The handover records in `status.lastHandovers` of the owner's queue and of each victim's
//! queue: newest first, the last [`HANDOVER_RECORDS_KEPT`], one per reclaim id and role (a
//! resumed handover replaces its record instead of adding a second).
//!
//! These writes do not go through the admission loop's server-side apply of the status (which
//! leaves `lastHandovers` out): each is a JSON merge patch of `status.lastHandovers` alone, with
//! the queue's `resourceVersion` as a precondition, retried on conflict. Two handovers that
//! finish at once for the same queue therefore never drop each other's record, and the
//! admission loop never writes back a list it read before a handover finished.
//!
//! Handovers that finish together (a burst) take turns per queue ([`RecordWriter`]): the one
//! whose turn it is writes every record then waiting for that queue in one patch (more when
//! some are older than the newest [`HANDOVER_RECORDS_KEPT`]: see [`turns`]), so every record is
//! in some version of the status and a watcher sees each one. Written one
//! by one, 22 records raced for one `resourceVersion` (each conflict costs every other writer a
//! read and a write) and the last landed seconds after its handover ended. A record first waits
//! [`GATHER`] for the others of its burst, so that a burst costs its queues one write each, not
//! one per turn (see there why that matters).
//!
//! The first patch that carries the owner's record takes the reclaim out of the queue's
//! `status.reclaimsInFlight` ([`super::in_flight`]): finishing costs no extra write.
//!
//! A victim queue's records are also what the core's anti-thrash rule reads: the queue does
//! not borrow again within its `minBorrowDuration` after the `startedAt` of its newest
//! `victim` record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuqueue_api::{
    FIELD_MANAGER,
    v1alpha1::{GpuQueue, HANDOVER_RECORDS_KEPT, HandoverRecord, MAX_RECLAIMS_IN_FLIGHT},
};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tokio::sync::oneshot;

use super::{
    in_flight,
    intent::{OWNER, VICTIM},
};
use crate::{leader::Term, sync::lock};

/// Conflicting writes of the same queue's status get this many tries. Records of one queue
/// are written one batch at a time ([`RecordWriter`]), but reclaims starting
/// (`status.reclaimsInFlight`) and the admission loop's status apply still move its
/// `resourceVersion`; each conflict means one of those landed. (With 5 tries and one write per
/// record, a 22-owner burst ran out. A retry now writes the records kept from the run,
/// [`super::execute::Unwritten`], where it once rebuilt the handover, whose record then held
/// only its late phases.)
const ATTEMPTS: usize = MAX_RECLAIMS_IN_FLIGHT + 1;

/// How long a record waits for the records of other handovers of its queue before it is
/// written. A burst's handovers end within a few hundred milliseconds of each other, and each
/// status write makes kube-apiserver decode, validate and encode the whole queue while the
/// burst's deletes and binds wait for the same CPU. Without it, a burst's records took a write
/// per turn: 14–30 GpuQueue status patches per burst in the handover benchmark. The record's
/// figures are taken when its handover ends; only the write waits.
const GATHER: Duration = Duration::from_millis(300);

/// Why a record was not written.
#[derive(Debug, thiserror::Error)]
#[error("recording handover {id} on GpuQueue {queue}: {reason}")]
pub struct RecordError {
    pub queue: String,
    pub id: String,
    /// The API server's answer to the write that carried the record (shared by a batch).
    pub reason: String,
}

/// The lists one turn writes into a queue's `status.lastHandovers` for `batch` over `stored`,
/// in order. The last is the newest [`HANDOVER_RECORDS_KEPT`] of both (a record of `batch` in
/// place of a stored one with the same id and role; among records started in the same second,
/// `startedAt` having whole seconds, the batch's first). A record of the batch older than those
/// goes in a list before it, after the newest record of each role of all (what the borrowing
/// cool-down and the budget condition read): every record is in some write, and no write shows
/// an older record as the newest of its role than the writes before and after it. A turn that
/// stops between two lists (the leader gone) leaves the older stored records out: history, not
/// a handover in flight, whose reclaim stays recorded until its own record is written.
fn turns(stored: &[HandoverRecord], batch: &[&HandoverRecord]) -> Vec<Vec<HandoverRecord>> {
    let same = |a: &HandoverRecord, b: &HandoverRecord| a.id == b.id && a.role == b.role;
    let mut written: Vec<HandoverRecord> = Vec::with_capacity(batch.len());
    for record in batch {
        written.retain(|w| !same(w, record));
        written.push((*record).clone());
    }
    let others = stored
        .iter()
        .filter(|r| !written.iter().any(|w| same(w, r)));
    let mut kept: Vec<HandoverRecord> = written.iter().rev().chain(others).cloned().collect();
    newest_first(&mut kept);
    let left_out = kept.split_off(kept.len().min(HANDOVER_RECORDS_KEPT));
    let newest: Vec<&HandoverRecord> = [OWNER, VICTIM]
        .iter()
        .filter_map(|role| kept.iter().chain(&left_out).find(|r| r.role == *role))
        .collect();
    let unseen: Vec<&HandoverRecord> = left_out
        .iter()
        .filter(|r| written.iter().any(|w| same(w, r)))
        .collect();
    let rest: Vec<&HandoverRecord> = unseen
        .iter()
        .filter(|r| !newest.iter().any(|n| same(n, r)))
        .copied()
        .collect();
    let mut chunks: Vec<&[&HandoverRecord]> =
        rest.rchunks(HANDOVER_RECORDS_KEPT - newest.len()).collect();
    if chunks.is_empty() && !unseen.is_empty() {
        // Only a newest of its role is left out of the last list: it goes in one of its own.
        chunks.push(&[]);
    }
    let mut lists: Vec<Vec<HandoverRecord>> = chunks
        .into_iter()
        .map(|chunk| {
            let mut list: Vec<HandoverRecord> =
                newest.iter().chain(chunk).map(|r| (*r).clone()).collect();
            newest_first(&mut list);
            list
        })
        .collect();
    lists.push(kept);
    lists
}

/// Sorts `records` newest first (stable); records without a start (never written by this
/// operator) last.
fn newest_first(records: &mut [HandoverRecord]) {
    records.sort_by(|a, b| {
        b.started_at
            .as_ref()
            .map(|t| t.0)
            .cmp(&a.started_at.as_ref().map(|t| t.0))
    });
}

/// Writes handover records into the queues' `status.lastHandovers`, one writer per queue at a
/// time, each write carrying every record waiting for its queue. Cheap to clone.
#[derive(Clone, Default)]
pub struct RecordWriter {
    queues: Arc<Mutex<HashMap<String, Arc<QueueTurn>>>>,
}

/// One queue's records waiting to be written, and the turn to write them.
#[derive(Default)]
struct QueueTurn {
    waiting: Mutex<Vec<Waiting>>,
    turn: tokio::sync::Mutex<()>,
}

struct Waiting {
    record: HandoverRecord,
    written: oneshot::Sender<Result<(), String>>,
}

impl RecordWriter {
    /// Writes `record` into queue `name`'s `status.lastHandovers`, with the records of other
    /// handovers waiting for the same queue, while `term` lasts (a batch whose turn comes
    /// after it ended is not written: the next leader records those handovers). A queue that
    /// no longer exists has nothing to record on: that is not an error (retrying would never
    /// end).
    pub async fn write(
        &self,
        api: &Api<GpuQueue>,
        term: &Term,
        name: &str,
        record: &HandoverRecord,
    ) -> Result<(), RecordError> {
        let turn = lock(&self.queues)
            .entry(name.to_owned())
            .or_default()
            .clone();
        let (written, result) = oneshot::channel();
        lock(&turn.waiting).push(Waiting {
            record: record.clone(),
            written,
        });
        tokio::time::sleep(GATHER).await;
        {
            // Whoever takes the turn after a record was queued writes it: this caller, or one
            // that queued earlier and took the turn later.
            let _turn = turn.turn.lock().await;
            // A record whose handover task was aborted meanwhile (its term ended) is dropped:
            // written later, it would undo what the next leader recorded.
            let batch: Vec<Waiting> = std::mem::take(&mut *lock(&turn.waiting))
                .into_iter()
                .filter(|w| !w.written.is_closed())
                .collect();
            if !batch.is_empty() {
                let records: Vec<&HandoverRecord> = batch.iter().map(|w| &w.record).collect();
                let outcome = if term.is_current() {
                    write_batch(api, name, &records)
                        .await
                        .map_err(|e| e.to_string())
                } else {
                    Err("this replica is no longer the leader".to_owned())
                };
                for waiting in batch {
                    let _ = waiting.written.send(outcome.clone());
                }
            }
        }
        let outcome = result
            .await
            .unwrap_or_else(|_| Err("the write carrying it was dropped".to_owned()));
        outcome.map_err(|reason| RecordError {
            queue: name.to_owned(),
            id: record.id.clone(),
            reason,
        })
    }
}

/// Writes `records` into queue `name`'s `status.lastHandovers`: the lists of [`turns`] over
/// what the status holds, one patch each, each taking the reclaims of the owner records it is
/// the first to carry out of `status.reclaimsInFlight`. Usually one patch. A patch that
/// conflicts is made again from a fresh read, the lists worked out anew over what the status
/// holds then, so that nothing another writer put there meanwhile is dropped (a record already
/// there is replaced by itself); the batch gets [`ATTEMPTS`] tries of a patch in all.
async fn write_batch(
    api: &Api<GpuQueue>,
    name: &str,
    records: &[&HandoverRecord],
) -> Result<(), kube::Error> {
    let Some(mut queue) = read(api, name).await? else {
        return Ok(());
    };
    let owners: Vec<&str> = records
        .iter()
        .filter(|r| r.role == OWNER)
        .map(|r| r.id.as_str())
        .collect();
    let mut conflicts = 0;
    'lists: loop {
        let stored = queue.status.as_ref().map_or(&[][..], |s| &s.last_handovers);
        for list in turns(stored, records) {
            // A reclaim leaves `reclaimsInFlight` in the write that first carries its record.
            let carried: Vec<&str> = owners
                .iter()
                .filter(|id| list.iter().any(|r| r.role == OWNER && r.id == **id))
                .copied()
                .collect();
            match patch_list(api, name, &queue, &list, &carried).await {
                Ok(patched) => queue = patched,
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 && conflicts + 1 < ATTEMPTS => {
                    conflicts += 1;
                    let Some(fresh) = read(api, name).await? else {
                        return Ok(());
                    };
                    queue = fresh;
                    continue 'lists;
                }
                Err(source) => return Err(source),
            }
        }
        return Ok(());
    }
}

/// Queue `name` as the API server has it; `None` when it no longer exists.
async fn read(api: &Api<GpuQueue>, name: &str) -> Result<Option<GpuQueue>, kube::Error> {
    match api.get_status(name).await {
        Ok(queue) => Ok(Some(queue)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(source) => Err(source),
    }
}

/// Sets `status.lastHandovers` of `queue` (as last read) to `list`, and takes the reclaims of
/// `owners` out of its `status.reclaimsInFlight`, under its `resourceVersion`.
async fn patch_list(
    api: &Api<GpuQueue>,
    name: &str,
    queue: &GpuQueue,
    list: &[HandoverRecord],
    owners: &[&str],
) -> Result<GpuQueue, kube::Error> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let mut in_flight = queue
        .status
        .as_ref()
        .map(|s| s.reclaims_in_flight.clone())
        .unwrap_or_default();
    let mut in_flight_changed = false;
    for id in owners {
        if let Some(rest) = in_flight::without(&in_flight, id) {
            in_flight = rest;
            in_flight_changed = true;
        }
    }
    let mut body = json!({
        "metadata": {"resourceVersion": queue.metadata.resource_version},
        "status": {"lastHandovers": list},
    });
    if in_flight_changed {
        body["status"]["reclaimsInFlight"] = json!(in_flight);
    }
    api.patch_status(name, &params, &Patch::Merge(&body)).await
}

#[cfg(test)]
mod tests {
    use futures::future::join_all;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::leader::test_term;
    use crate::mock_api::{self, Log};

    /// A client whose API server holds one empty queue status and answers every read and
    /// patch of it with that.
    fn queue_api() -> (Api<GpuQueue>, Log) {
        queue_api_in_flight(&[])
    }

    /// As [`queue_api`], with the reclaims `in_flight` (ids) in the queue's status.
    fn queue_api_in_flight(in_flight: &[String]) -> (Api<GpuQueue>, Log) {
        let entries: Vec<serde_json::Value> = in_flight
            .iter()
            .map(|id| {
                json!({"id": id, "ownerPod": "online/o", "ownerUid": "u", "node": "n1",
                    "victims": [], "startedAt": "2026-01-10T11:00:00.000000Z",
                    "deadline": "2026-01-10T11:00:03.000000Z"})
            })
            .collect();
        let queue = json!({"apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "online", "resourceVersion": "7"},
            "spec": {"namespaces": ["online"], "resources": []},
            "status": {"lastHandovers": [], "reclaimsInFlight": entries}});
        let (client, log) = mock_api::serve(move |_| (200, queue.clone()));
        (Api::all(client), log)
    }

    /// An API server holding queue `online`, whose status another writer changes right before
    /// each of the first `interfere` patches arrives (it adds its own record `rc-other`), so
    /// that each of them conflicts.
    fn contended_queue_api(interfere: usize) -> (Api<GpuQueue>, Log) {
        let (mut version, mut list, mut interfered) = (7_u64, json!([]), 0);
        let (client, log) = mock_api::serve(move |request| {
            if request.method == "PATCH" {
                if interfered < interfere {
                    interfered += 1;
                    version += 1;
                    list = json!([record("rc-other", "owner", 6, "Completed")]);
                }
                let written_on = request.body["metadata"]["resourceVersion"].as_str();
                if written_on.and_then(|v| v.parse().ok()) != Some(version) {
                    return mock_api::failure(409, "Conflict", "the object has been modified");
                }
                version += 1;
                list = request.body["status"]["lastHandovers"].clone();
            }
            (
                200,
                json!({"apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
                    "metadata": {"name": "online", "resourceVersion": version.to_string()},
                    "spec": {"namespaces": ["online"], "resources": []},
                    "status": {"lastHandovers": list.clone(), "reclaimsInFlight": []}}),
            )
        });
        (Api::all(client), log)
    }

    /// The bodies of the patches the server saw.
    fn bodies(log: &Log) -> Vec<serde_json::Value> {
        lock(log)
            .iter()
            .filter(|s| s.method == "PATCH")
            .map(|s| s.body.clone())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_whose_write_conflicts_is_written_again_over_what_the_other_writer_wrote() {
        let (api, patches) = contended_queue_api(1);
        let (term, _state) = test_term().await;
        let writer = RecordWriter::default();
        let mine = record("rc-1", "owner", 7, "Completed");
        writer.write(&api, &term, "online", &mine).await.unwrap();
        let patches = bodies(&patches);
        assert_eq!(
            patches.len(),
            2,
            "the conflict, then the write: {patches:?}"
        );
        assert_eq!(patches[0]["metadata"]["resourceVersion"], "7");
        assert_eq!(patches[1]["metadata"]["resourceVersion"], "8", "read again");
        let written: Vec<&str> = patches[1]["status"]["lastHandovers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap())
            .collect();
        assert_eq!(
            written,
            ["rc-1", "rc-other"],
            "the other writer's record is kept"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_that_conflicts_every_time_gives_up_after_its_attempts_and_says_so() {
        let (api, patches) = contended_queue_api(usize::MAX);
        let (term, _state) = test_term().await;
        let writer = RecordWriter::default();
        let mine = record("rc-1", "owner", 7, "Completed");
        let error = writer
            .write(&api, &term, "online", &mine)
            .await
            .unwrap_err();
        assert_eq!(bodies(&patches).len(), ATTEMPTS);
        assert_eq!(error.queue, "online");
        assert!(error.reason.contains("Conflict"), "{error:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn records_of_a_burst_that_end_within_the_gather_are_written_in_one_patch() {
        let (api, patches) = queue_api();
        let (term, _state) = test_term().await;
        let writer = RecordWriter::default();
        let first = record("rc-1", "owner", 7, "Completed");
        let second = record("rc-2", "owner", 7, "Completed");
        let late = record("rc-3", "owner", 8, "Completed");
        let (a, b) = tokio::join!(writer.write(&api, &term, "online", &first), async {
            tokio::time::sleep(GATHER / 2).await;
            writer.write(&api, &term, "online", &second).await
        });
        a.unwrap();
        b.unwrap();
        assert_eq!(bodies(&patches).len(), 1, "one write for both");
        let ids: Vec<String> = bodies(&patches)[0]["status"]["lastHandovers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(ids.len(), 2);
        assert!(ids.contains(&"rc-1".to_owned()) && ids.contains(&"rc-2".to_owned()));

        // One that ends after the write is written on its own.
        writer.write(&api, &term, "online", &late).await.unwrap();
        assert_eq!(bodies(&patches).len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn no_record_is_written_after_the_term_or_for_an_aborted_handover() {
        let (api, patches) = queue_api();
        let (term, state) = test_term().await;
        let writer = RecordWriter::default();
        // A handover task aborted while its record waits (its term ended): never written.
        let aborted = tokio::spawn({
            let (writer, api, term) = (writer.clone(), api.clone(), term.clone());
            async move {
                let record = record("rc-1", "owner", 7, "Completed");
                writer.write(&api, &term, "online", &record).await
            }
        });
        tokio::time::sleep(GATHER / 2).await;
        aborted.abort();
        let kept = record("rc-2", "owner", 7, "Completed");
        writer.write(&api, &term, "online", &kept).await.unwrap();
        let written = bodies(&patches)[0]["status"]["lastHandovers"].clone();
        assert_eq!(written.as_array().unwrap().len(), 1, "{written}");
        assert_eq!(written[0]["id"], "rc-2");

        // A term that ends while a record waits: the record is not written, and says why.
        let late = record("rc-3", "owner", 8, "Completed");
        let (result, ()) = tokio::join!(writer.write(&api, &term, "online", &late), async {
            state.send_modify(|s| s.acting_until = Some(crate::clock::now()));
        });
        assert!(result.unwrap_err().reason.contains("no longer the leader"));
        assert_eq!(bodies(&patches).len(), 1);
    }

    fn record(id: &str, role: &str, second: i64, outcome: &str) -> HandoverRecord {
        HandoverRecord {
            id: id.into(),
            role: role.into(),
            started_at: Some(Time(jiff::Timestamp::from_second(second).unwrap())),
            outcome: outcome.into(),
            ..HandoverRecord::default()
        }
    }

    /// What `records` become with `record` written.
    fn merge_one(records: &[HandoverRecord], record: &HandoverRecord) -> Vec<HandoverRecord> {
        turns(records, &[record]).pop().unwrap()
    }

    fn ids(list: &[HandoverRecord]) -> Vec<&str> {
        list.iter().map(|r| r.id.as_str()).collect()
    }

    #[test]
    fn the_newest_records_are_kept_first() {
        let mut records = Vec::new();
        let written = HANDOVER_RECORDS_KEPT + 2;
        for i in 0..written {
            let second = i64::try_from(i).unwrap();
            let next = record(&format!("rc-{i}"), "victim", second, "Completed");
            records = merge_one(&records, &next);
        }
        assert_eq!(records.len(), HANDOVER_RECORDS_KEPT);
        assert_eq!(records[0].id, format!("rc-{}", written - 1));
        assert_eq!(records[HANDOVER_RECORDS_KEPT - 1].id, "rc-2");
    }

    #[test]
    fn a_record_written_in_a_full_second_of_a_burst_is_kept() {
        let mut records = Vec::new();
        for i in 0..=HANDOVER_RECORDS_KEPT {
            let next = record(&format!("rc-{i}"), "owner", 7, "Completed");
            records = merge_one(&records, &next);
        }
        assert_eq!(records.len(), HANDOVER_RECORDS_KEPT);
        assert_eq!(records[0].id, format!("rc-{HANDOVER_RECORDS_KEPT}"));
        assert!(records.iter().all(|r| r.id != "rc-0"));
    }

    #[test]
    fn a_record_older_than_every_kept_one_is_written_once_with_the_newest_of_each_role() {
        let mut stored: Vec<HandoverRecord> = (0..HANDOVER_RECORDS_KEPT - 1)
            .map(|i| record(&format!("rc-new-{i}"), "owner", 100, "Completed"))
            .collect();
        stored.insert(0, record("rc-victim", "victim", 101, "Completed"));
        // A handover that started long before the others and ended after them.
        let slow = record("rc-slow", "owner", 1, "Completed");
        let lists = turns(&stored, &[&slow]);
        assert_eq!(lists.len(), 2, "{lists:?}");
        assert_eq!(ids(&lists[0]), ["rc-victim", "rc-new-0", "rc-slow"]);
        assert_eq!(ids(&lists[1]), ids(&stored), "the newest stay");
    }

    #[test]
    fn a_stored_record_newer_than_a_burst_of_older_ones_is_kept() {
        // Started last, finished first: written before the burst that started earlier.
        let stored = vec![record("rc-late", "owner", 100, "Completed")];
        let burst: Vec<HandoverRecord> = (0..HANDOVER_RECORDS_KEPT)
            .map(|i| record(&format!("rc-{i}"), "owner", 50, "Completed"))
            .collect();
        let batch: Vec<&HandoverRecord> = burst.iter().collect();
        let lists = turns(&stored, &batch);
        let last = lists.last().unwrap();
        assert_eq!(last.len(), HANDOVER_RECORDS_KEPT);
        for list in &lists {
            assert_eq!(list[0].id, "rc-late", "the newest in every write: {list:?}");
        }
        let mut seen: Vec<&str> = lists.iter().flat_map(|l| ids(l)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen.len(),
            HANDOVER_RECORDS_KEPT + 1,
            "every record written"
        );
    }

    #[test]
    fn a_burst_of_22_is_written_in_three_lists_none_longer_than_kept() {
        let burst: Vec<HandoverRecord> = (0..22)
            .map(|i| record(&format!("rc-{i:02}"), "owner", i, "Completed"))
            .collect();
        let batch: Vec<&HandoverRecord> = burst.iter().rev().collect();
        let lists = turns(&[], &batch);
        assert_eq!(lists.len(), 3, "{lists:?}");
        assert!(lists.iter().all(|l| l.len() <= HANDOVER_RECORDS_KEPT));
        assert!(lists.iter().all(|l| l[0].id == "rc-21"));
        let oldest = [
            "rc-06", "rc-05", "rc-04", "rc-03", "rc-02", "rc-01", "rc-00",
        ];
        assert_eq!(ids(&lists[0])[1..], oldest, "the oldest first");
        let mut seen: Vec<&str> = lists.iter().flat_map(|l| ids(l)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 22);
    }

    #[test]
    fn no_write_shows_an_older_newest_of_a_role_than_before_or_after() {
        let stored = vec![record("rc-v50", "victim", 50, "Completed")];
        let mut burst: Vec<HandoverRecord> = (0..HANDOVER_RECORDS_KEPT)
            .map(|i| record(&format!("rc-o{i}"), "owner", 100, "Completed"))
            .collect();
        burst.push(record("rc-v40", "victim", 40, "Completed"));
        let batch: Vec<&HandoverRecord> = burst.iter().collect();
        let lists = turns(&stored, &batch);
        assert_eq!(lists.len(), 2, "{lists:?}");
        let victims: Vec<&str> = lists[0]
            .iter()
            .filter(|r| r.role == "victim")
            .map(|r| r.id.as_str())
            .collect();
        assert_eq!(
            victims,
            ["rc-v50", "rc-v40"],
            "the newest victim stays first"
        );
        assert!(lists[1].iter().all(|r| r.role == "owner"), "8 newer owners");
    }

    #[test]
    fn a_left_out_record_that_is_the_newest_of_its_role_is_written_too() {
        let mut burst: Vec<HandoverRecord> = (0..HANDOVER_RECORDS_KEPT)
            .map(|i| record(&format!("rc-o{i}"), "owner", 100, "Completed"))
            .collect();
        burst.push(record("rc-v", "victim", 40, "Completed"));
        let batch: Vec<&HandoverRecord> = burst.iter().collect();
        let lists = turns(&[], &batch);
        assert_eq!(lists.len(), 2, "{lists:?}");
        assert_eq!(ids(&lists[0]), ["rc-o7", "rc-v"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_larger_than_the_list_is_written_in_turns_each_record_once() {
        let reclaims: Vec<String> = (0..=HANDOVER_RECORDS_KEPT)
            .map(|i| format!("rc-{i}"))
            .collect();
        let (api, patches) = queue_api_in_flight(&reclaims);
        let (term, _state) = test_term().await;
        let writer = RecordWriter::default();
        let burst: Vec<HandoverRecord> = (0..=HANDOVER_RECORDS_KEPT)
            .map(|i| {
                let second = i64::try_from(i).unwrap();
                record(&format!("rc-{i}"), "owner", second, "Completed")
            })
            .collect();
        let written = join_all(
            burst
                .iter()
                .rev()
                .map(|r| writer.write(&api, &term, "online", r)),
        )
        .await;
        assert!(written.iter().all(Result::is_ok), "{written:?}");
        let patches = bodies(&patches);
        // The ids a patch writes in the status list `field`.
        let listed = |patch: &serde_json::Value, field: &str| -> Vec<String> {
            patch["status"][field]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_str().unwrap().to_owned())
                .collect()
        };
        let ids = |patch: &serde_json::Value| listed(patch, "lastHandovers");
        assert_eq!(patches.len(), 2, "the oldest first, with the newest");
        let newest = format!("rc-{HANDOVER_RECORDS_KEPT}");
        assert_eq!(ids(&patches[0]), [newest, "rc-0".to_owned()]);
        assert_eq!(ids(&patches[1]).len(), HANDOVER_RECORDS_KEPT);
        let mut all: Vec<String> = patches.iter().flat_map(ids).collect();
        all.sort();
        all.dedup();
        assert_eq!(
            all.len(),
            burst.len(),
            "every record in some patch: {all:?}"
        );
        // Each reclaim leaves `reclaimsInFlight` in the patch that first carries its record
        // (the server here answers every read with all of them still in flight).
        let in_flight = |patch: &serde_json::Value| listed(patch, "reclaimsInFlight");
        assert_eq!(in_flight(&patches[0]), reclaims[1..HANDOVER_RECORDS_KEPT]);
        assert_eq!(in_flight(&patches[1]), ["rc-0"]);
    }

    #[test]
    fn a_resumed_handover_replaces_its_record() {
        let records = vec![
            record("rc-1", "owner", 10, "InProgress"),
            record("rc-0", "owner", 5, "Completed"),
        ];
        let records = merge_one(&records, &record("rc-1", "owner", 10, "Completed"));
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].outcome, "Completed");
        // The same id in another role is another record.
        let records = merge_one(&records, &record("rc-1", "victim", 10, "Completed"));
        assert_eq!(records.len(), 3);
    }
}
