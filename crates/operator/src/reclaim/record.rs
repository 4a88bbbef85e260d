//! The handover records in `status.lastHandovers` of the owner's queue and of each victim's
//! queue: newest first, at most [`MAX_HANDOVER_RECORDS`], one per reclaim id and role (a
//! resumed handover replaces its record instead of adding a second).
//!
//! These writes do not go through the admission loop's server-side apply of the status (which
//! leaves `lastHandovers` out): each is a JSON merge patch of `status.lastHandovers` alone, with
//! the queue's `resourceVersion` as a precondition, retried on conflict. Two handovers that
//! finish at once for the same queue therefore never drop each other's record, and the
//! admission loop never writes back a list it read before a handover finished.
//!
//! The owner's record is written in the same patch that takes the reclaim out of the queue's
//! `status.reclaimsInFlight` ([`super::in_flight`]): finishing costs no extra write.
//!
//! A victim queue's records are also what the core's anti-thrash rule reads: the queue does
//! not borrow again within its `minBorrowDuration` after the `startedAt` of its newest
//! `victim` record.

use gpuqueue_api::{
    FIELD_MANAGER,
    v1alpha1::{GpuQueue, HandoverRecord, MAX_HANDOVER_RECORDS, MAX_RECLAIMS_IN_FLIGHT},
};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

use super::{in_flight, intent::OWNER};

/// Conflicting writers of the same queue's records get this many tries. Each conflict means
/// another writer's record landed, so N handovers finishing at once for one queue (a burst
/// hands over up to [`MAX_RECLAIMS_IN_FLIGHT`] together) are all written within N tries. With
/// 5, the records of a 22-owner burst ran out of tries: the handover was retried 5 s later as
/// a resumed one, whose record holds only the phases seen after the resume and is 5 s over.
const ATTEMPTS: usize = MAX_RECLAIMS_IN_FLIGHT + 1;

/// Why a record was not written.
#[derive(Debug, thiserror::Error)]
#[error("recording handover {id} on GpuQueue {queue}: {source}")]
pub struct RecordError {
    pub queue: String,
    pub id: String,
    #[source]
    pub source: kube::Error,
}

/// `records` with `record` in place of any with the same id and role, newest first, cut to
/// the API's limit.
pub fn upsert(records: &[HandoverRecord], record: HandoverRecord) -> Vec<HandoverRecord> {
    // The one written now goes first, so that among records started in the same second
    // (`startedAt` has whole seconds; a burst starts many) the sort keeps it ahead of older
    // writes and the cut never drops the record just written.
    let (id, role) = (record.id.clone(), record.role.clone());
    let older = records
        .iter()
        .filter(|r| !(r.id == id && r.role == role))
        .cloned();
    let mut next: Vec<HandoverRecord> = std::iter::once(record).chain(older).collect();
    // Newest first (stable); records without a start (never written by this operator) last.
    next.sort_by(|a, b| {
        b.started_at
            .as_ref()
            .map(|t| t.0)
            .cmp(&a.started_at.as_ref().map(|t| t.0))
    });
    next.truncate(MAX_HANDOVER_RECORDS);
    next
}

/// Writes `record` into queue `name`'s `status.lastHandovers`. A queue that no longer exists
/// has nothing to record on: that is not an error (retrying would never end).
pub async fn write(
    api: &Api<GpuQueue>,
    name: &str,
    record: &HandoverRecord,
) -> Result<(), RecordError> {
    let error = |source| RecordError {
        queue: name.to_owned(),
        id: record.id.clone(),
        source,
    };
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let queue = match api.get_status(name).await {
            Ok(queue) => queue,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(source) => return Err(error(source)),
        };
        let status = queue.status.as_ref();
        let current = status
            .map(|s| s.last_handovers.as_slice())
            .unwrap_or_default();
        let mut body = json!({
            "metadata": {"resourceVersion": queue.metadata.resource_version},
            "status": {"lastHandovers": upsert(current, record.clone())},
        });
        let in_flight = status
            .map(|s| s.reclaims_in_flight.as_slice())
            .unwrap_or_default();
        if record.role == OWNER
            && let Some(rest) = in_flight::without(in_flight, &record.id)
        {
            body["status"]["reclaimsInFlight"] = json!(rest);
        }
        match api.patch_status(name, &params, &Patch::Merge(&body)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < ATTEMPTS => {}
            Err(source) => return Err(error(source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn record(id: &str, role: &str, second: i64, outcome: &str) -> HandoverRecord {
        HandoverRecord {
            id: id.into(),
            role: role.into(),
            started_at: Some(Time(jiff::Timestamp::from_second(second).unwrap())),
            outcome: outcome.into(),
            ..HandoverRecord::default()
        }
    }

    #[test]
    fn the_newest_records_are_kept_first() {
        let mut records = Vec::new();
        let written = MAX_HANDOVER_RECORDS + 2;
        for i in 0..written {
            let second = i64::try_from(i).unwrap();
            records = upsert(
                &records,
                record(&format!("rc-{i}"), "victim", second, "Completed"),
            );
        }
        assert_eq!(records.len(), MAX_HANDOVER_RECORDS);
        assert_eq!(records[0].id, format!("rc-{}", written - 1));
        assert_eq!(records[MAX_HANDOVER_RECORDS - 1].id, "rc-2");
    }

    #[test]
    fn a_record_written_in_a_full_second_of_a_burst_is_kept() {
        let mut records = Vec::new();
        for i in 0..=MAX_HANDOVER_RECORDS {
            records = upsert(
                &records,
                record(&format!("rc-{i}"), "owner", 7, "Completed"),
            );
        }
        assert_eq!(records.len(), MAX_HANDOVER_RECORDS);
        assert_eq!(records[0].id, format!("rc-{MAX_HANDOVER_RECORDS}"));
        assert!(records.iter().all(|r| r.id != "rc-0"));
    }

    #[test]
    fn a_resumed_handover_replaces_its_record() {
        let records = vec![
            record("rc-1", "owner", 10, "InProgress"),
            record("rc-0", "owner", 5, "Completed"),
        ];
        let records = upsert(&records, record("rc-1", "owner", 10, "Completed"));
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].outcome, "Completed");
        // The same id in another role is another record.
        let records = upsert(&records, record("rc-1", "victim", 10, "Completed"));
        assert_eq!(records.len(), 3);
    }
}
