//! Evicting one victim: the Eviction API with its queue's grace period, PodDisruptionBudgets
//! honoured until the handover's deadline, then a delete with the reason recorded.
//!
//! **A victim no budget guards** ([`Guard::Unbudgeted`], from the operator's store of budgets,
//! see [`super::disruption`]) is deleted directly, with the same grace period and uid
//! precondition, after the `DisruptionTarget` condition the Eviction API would add (a Job's
//! `podFailurePolicy` reads it): written with the victim's intent when its reclaim started
//! ([`Guard::Marked`]), or else just before the delete. The Eviction API lists the
//! namespace's budgets with a consistent read, which waits for the API server's cache to
//! catch up with etcd: during a
//! 12-owner burst an eviction took 103 ms at the median and 219 ms at p90 on the server, a
//! delete 26 ms (audit log of the handover benchmark). If either write fails, the Eviction API
//! is used after all. A budget created after the store last showed the namespace is missed, as
//! one created just after the Eviction API's own read would be.
//!
//! | answer | meaning | what happens |
//! | --- | --- | --- |
//! | 200/201 | eviction accepted | done |
//! | 404, 409 on the uid precondition | the pod (this uid) is gone | done |
//! | 429 | a PodDisruptionBudget forbids it now (or API rate limiting) | retried with backoff until the deadline |
//! | 500 | several budgets select the pod (misconfiguration) | reported at once, retried with backoff until the deadline |
//! | anything else | the API server or the network | retried with backoff until the deadline |
//!
//! At the deadline the pod is deleted, with the same grace period and uid precondition:
//! borrowed capacity is reclaimable by contract, and the owner's guarantee wins. The backoff
//! (100 ms doubling to 1 s) keeps a blocked eviction at no more than about one request a second.
//!
//! The client this runs on must not retry by itself: kube's default client retries 429 for
//! minutes, which would hide the refusal and blow the budget (see [`super`]).
//!
//! The eviction is posted as a `policy/v1` `Eviction` written here, not with kube's
//! `Api::evict`: kube 5.0 sends its delete options under the key `delete_options`, which the API
//! server ignores, so the grace period and the uid precondition would silently be dropped.

use std::time::Duration;

use k8s_openapi::{
    api::{core::v1::Pod, policy::v1::Eviction as EvictionRequest},
    apimachinery::pkg::apis::meta::v1::{
        DeleteOptions, ObjectMeta, Preconditions as MetaPreconditions, Time,
    },
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
};
use serde_json::json;
use tokio::time::Instant;

use super::intent::disrupted_by_another;
use crate::{clock, leader::Term};

/// The `DisruptionTarget` reason on a victim deleted without the Eviction API (the scheduler's
/// own preemption says `PreemptionByScheduler`).
pub const DISRUPTION_REASON: &str = "PreemptionByGpuQueue";

/// The first wait after a refusal; doubled after each, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a delete that fails (not a refusal: the API server or the network) is retried
/// after the deadline before the eviction is reported failed.
const DELETE_RETRY_LIMIT: Duration = Duration::from_secs(30);

/// How a victim left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// The Eviction API accepted it (after `refusals` refused attempts).
    Evicted { refusals: u32 },
    /// It was gone already (or replaced by a namesake).
    AlreadyGone,
    /// The Eviction API refused until the deadline; the pod was deleted.
    DeletedAfterRefusal { refusal: Refusal, refusals: u32 },
    /// Neither eviction nor delete went through.
    Failed { error: String },
    /// This replica stopped leading before the victim was removed; the next leader resumes.
    NotLeader,
    /// Not sent: its queue no longer borrows it, asked just before ([`super::recheck`]).
    Spared,
}

/// Why the Eviction API refused, as it answered the last time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: Option<u16>,
    pub message: String,
}

impl Refusal {
    /// A PodDisruptionBudget forbids the eviction now.
    pub fn is_budget(&self) -> bool {
        self.status == Some(429)
    }

    /// The API server cannot decide: several budgets select the pod.
    pub fn is_misconfigured(&self) -> bool {
        self.status == Some(500)
    }
}

impl Eviction {
    /// The `outcome` label of `gpuqueue_evictions_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Evicted { .. } => "evicted",
            Self::AlreadyGone => "already_gone",
            Self::DeletedAfterRefusal { .. } => "deleted_after_refusal",
            Self::Failed { .. } => "failed",
            Self::NotLeader => "not_leader",
            Self::Spared => "spared",
        }
    }

    /// Whether the victim is on its way out.
    pub fn removed(&self) -> bool {
        matches!(
            self,
            Self::Evicted { .. } | Self::AlreadyGone | Self::DeletedAfterRefusal { .. }
        )
    }
}

/// Whether a PodDisruptionBudget may refuse a victim's eviction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// A budget selects it (or the operator cannot tell): the Eviction API judges.
    Budgeted,
    /// No budget selects it: marked `DisruptionTarget`, then deleted directly.
    Unbudgeted,
    /// No budget selects it, and it was marked with its intent when its reclaim started
    /// ([`disruption_target`]): deleted directly.
    Marked,
}

impl Guard {
    /// `Marked` for an unguarded victim already `marked`, else this guard (a budget that
    /// appeared since still sends the victim through the Eviction API).
    pub fn marked(self, marked: bool) -> Self {
        match self {
            Self::Unbudgeted if marked => Self::Marked,
            guard => guard,
        }
    }
}

/// One victim to evict.
#[derive(Clone, Debug)]
pub struct EvictionTarget<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub grace: Duration,
    /// Evicted only while the pod is at this `resourceVersion` (`None`: any), as a conflict
    /// (409) otherwise.
    pub unchanged_since: Option<&'a str>,
}

/// Evicts `target` as the module documentation says; `refused` is told about the first
/// refusal of each kind (for an event), once.
pub async fn evict(
    client: &Client,
    term: &Term,
    target: &EvictionTarget<'_>,
    guard: Guard,
    deadline: Instant,
    mut refused: impl FnMut(&Refusal),
) -> Eviction {
    if guard != Guard::Budgeted
        && let Some(done) = delete_unbudgeted(client, term, target, guard == Guard::Marked).await
    {
        return done;
    }
    let mut backoff = FIRST_BACKOFF;
    let mut refusals = 0;
    let mut last: Option<Refusal> = None;
    loop {
        if !term.is_current() {
            return Eviction::NotLeader;
        }
        let refusal = match try_evict(client, target).await {
            Ok(Eviction::Evicted { .. }) => return Eviction::Evicted { refusals },
            Ok(done) => return done,
            Err(refusal) => refusal,
        };
        refusals += 1;
        if last.as_ref().map(|r| r.status) != Some(refusal.status) {
            refused(&refusal);
        }
        last = Some(refusal);
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        tokio::time::sleep_until((now + backoff).min(deadline)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    let refusal = last.unwrap_or(Refusal {
        status: None,
        message: "the deadline passed before the first attempt".into(),
    });
    let api: Api<Pod> = Api::namespaced(client.clone(), target.namespace);
    delete_after_refusal(
        &api,
        term,
        target,
        &delete_params(target),
        refusal,
        refusals,
    )
    .await
}

/// One request to the Eviction API, honouring PodDisruptionBudgets: `Evicted` or `AlreadyGone`,
/// or the refusal. For a pod no owner waits for (an owner sent back to the gate, a pod that
/// bypassed admission), this is all: a budget that refuses is respected.
pub async fn try_evict(client: &Client, target: &EvictionTarget<'_>) -> Result<Eviction, Refusal> {
    let refused = |error: kube::Error| match error {
        kube::Error::Api(status) => Refusal {
            status: Some(status.code),
            message: status.message.clone(),
        },
        error => Refusal {
            status: None,
            message: error.to_string(),
        },
    };
    let request = eviction_request(target).map_err(|error| Refusal {
        status: None,
        message: format!("building the eviction: {error}"),
    })?;
    match client.request::<serde_json::Value>(request).await {
        Ok(_) => Ok(Eviction::Evicted { refusals: 0 }),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
            Ok(Eviction::AlreadyGone)
        }
        Err(error) => Err(refused(error)),
    }
}

/// `POST …/pods/<name>/eviction` with a complete `policy/v1` Eviction.
fn eviction_request(
    target: &EvictionTarget<'_>,
) -> Result<http::Request<Vec<u8>>, Box<dyn std::error::Error + Send + Sync>> {
    let eviction = EvictionRequest {
        metadata: ObjectMeta {
            name: Some(target.name.to_owned()),
            namespace: Some(target.namespace.to_owned()),
            ..ObjectMeta::default()
        },
        delete_options: Some(DeleteOptions {
            grace_period_seconds: Some(i64::try_from(target.grace.as_secs()).unwrap_or(i64::MAX)),
            preconditions: Some(MetaPreconditions {
                uid: Some(target.uid.to_owned()),
                resource_version: target.unchanged_since.map(str::to_owned),
            }),
            ..DeleteOptions::default()
        }),
    };
    let url = format!(
        "/api/v1/namespaces/{}/pods/{}/eviction",
        target.namespace, target.name
    );
    Ok(http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&eviction)?)?)
}

/// Marks `target` `DisruptionTarget` (unless `marked` already), then deletes it; `None` when
/// either write fails for another reason than the pod being gone (the Eviction API is tried
/// instead).
async fn delete_unbudgeted(
    client: &Client,
    term: &Term,
    target: &EvictionTarget<'_>,
    marked: bool,
) -> Option<Eviction> {
    if !term.is_current() {
        return Some(Eviction::NotLeader);
    }
    let gone = |error: &kube::Error| matches!(error, kube::Error::Api(status) if status.code == 404 || status.code == 409);
    if !marked {
        match mark(client, target.namespace, target.name, target.uid).await {
            Ok(Marking::Marked | Marking::MarkedByAnother) => {}
            Ok(Marking::Gone) => return Some(Eviction::AlreadyGone),
            Err(error) if gone(&error) => return Some(Eviction::AlreadyGone),
            Err(error) => {
                tracing::warn!(pod = target.name, %error, "marking a reclaim victim DisruptionTarget failed; using the Eviction API");
                return None;
            }
        }
        if !term.is_current() {
            return Some(Eviction::NotLeader);
        }
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), target.namespace);
    match api.delete(target.name, &delete_params(target)).await {
        Ok(_) => Some(Eviction::Evicted { refusals: 0 }),
        Err(error) if gone(&error) => Some(Eviction::AlreadyGone),
        Err(error) => {
            tracing::warn!(pod = target.name, %error, "deleting a reclaim victim failed; using the Eviction API");
            None
        }
    }
}

/// What [`mark`] found.
enum Marking {
    Marked,
    /// Somebody else's live `DisruptionTarget` is there, and stays.
    MarkedByAnother,
    /// The pod is gone, or a namesake stands in its place.
    Gone,
}

/// Adds the `DisruptionTarget` condition the Eviction API would add to pod `namespace/name`
/// (uid `uid` only), unless somebody else's live mark is there (a taint eviction or a
/// preemption under way; a victim resumed by a new leader, or one whose intent went alone):
/// the patch merges conditions by type, so ours would replace theirs, and a take-back of ours
/// (the reclaim abandoned) would then lose it for good. Theirs says as much to the pod's
/// controller (a Job's `podFailurePolicy`).
async fn mark(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<Marking, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let current = api.get(name).await?;
    if current.metadata.uid.as_deref() != Some(uid) {
        return Ok(Marking::Gone);
    }
    if disrupted_by_another(&current, DISRUPTION_REASON) {
        return Ok(Marking::MarkedByAnother);
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Strategic(disruption_condition(uid)),
    )
    .await?;
    Ok(Marking::Marked)
}

/// The strategic merge patch adding the `DisruptionTarget` condition, for this uid only (a
/// namesake's uid makes the API server refuse the patch).
fn disruption_condition(uid: &str) -> serde_json::Value {
    json!({
        "metadata": {"uid": uid},
        "status": {"conditions": [disruption_target()]},
    })
}

/// The `DisruptionTarget` condition a victim deleted without the Eviction API carries, as the
/// Eviction API would add it.
pub fn disruption_target() -> serde_json::Value {
    json!({
        "type": "DisruptionTarget",
        "status": "True",
        "reason": DISRUPTION_REASON,
        "message": "gpuqueue: reclaiming this pod's GPUs for the queue that is guaranteed them",
        "lastTransitionTime": Time(clock::now()),
    })
}

async fn delete_after_refusal(
    api: &Api<Pod>,
    term: &Term,
    target: &EvictionTarget<'_>,
    params: &DeleteParams,
    refusal: Refusal,
    refusals: u32,
) -> Eviction {
    let give_up = Instant::now() + DELETE_RETRY_LIMIT;
    let mut backoff = FIRST_BACKOFF;
    loop {
        if !term.is_current() {
            return Eviction::NotLeader;
        }
        match api.delete(target.name, params).await {
            Ok(_) => return Eviction::DeletedAfterRefusal { refusal, refusals },
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                return Eviction::AlreadyGone;
            }
            Err(error) if Instant::now() >= give_up => {
                return Eviction::Failed {
                    error: format!(
                        "eviction refused ({}), then delete failed: {error}",
                        refusal.message
                    ),
                };
            }
            Err(error) => {
                tracing::warn!(pod = target.name, %error, "deleting a reclaim victim failed; retrying");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The victim's queue's grace period, and a uid precondition so that a namesake created
/// meanwhile (a StatefulSet's replacement) is never evicted in its place.
fn delete_params(target: &EvictionTarget<'_>) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(u32::try_from(target.grace.as_secs()).unwrap_or(u32::MAX)),
        preconditions: Some(Preconditions {
            uid: Some(target.uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

#[cfg(test)]
mod tests {
    use kube::Client;
    use serde_json::{Value, json};

    use super::*;
    use crate::leader::{LeaderState, test_term};
    use crate::mock_api::{self, Log, Seen};

    /// The victim as a read shows it: uid `uid-1`, no conditions.
    fn victim() -> serde_json::Value {
        json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "victim", "namespace": "batch", "uid": "uid-1"}})
    }

    /// A client whose API server answers each request by its method: the next of `answers`
    /// for evictions and status patches (the last one repeats), 200 for deletes, and the
    /// [`victim`] for reads.
    fn api(answers: Vec<(u16, &'static str)>) -> (Client, Log) {
        api_reading(answers, Some(victim()))
    }

    /// [`api`], whose reads show `stored` (404 for `None`).
    fn api_reading(answers: Vec<(u16, &'static str)>, stored: Option<Value>) -> (Client, Log) {
        let mut answers = answers.into_iter().peekable();
        mock_api::serve(move |request| match (request.method.as_str(), &stored) {
            ("DELETE", _) => (200, success(200)),
            ("GET", Some(stored)) => (200, stored.clone()),
            ("GET", None) => mock_api::failure(404, "NotFound", "NotFound (test)"),
            (method, _) => {
                let (code, reason) = if answers.len() > 1 {
                    answers.next().unwrap()
                } else {
                    *answers.peek().unwrap()
                };
                // A patch that lands answers with the pod; anything else with a Status.
                match code {
                    ..300 if method == "PATCH" => (
                        code,
                        json!({"kind": "Pod", "apiVersion": "v1",
                            "metadata": {"name": "victim", "namespace": "batch"}}),
                    ),
                    ..300 => (code, success(code)),
                    _ => mock_api::failure(code, reason, &format!("{reason} (test)")),
                }
            }
        })
    }

    fn success(code: u16) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": code})
    }

    /// `evict` with its deadline already reached: one try, no backoff.
    async fn evict_now(client: &Client, guard: Guard) -> Eviction {
        let (term, _state) = test_term().await;
        evict(client, &term, &target(), guard, Instant::now(), |_| {}).await
    }

    fn target() -> EvictionTarget<'static> {
        EvictionTarget {
            namespace: "batch",
            name: "victim",
            uid: "uid-1",
            grace: Duration::from_secs(1),
            unchanged_since: None,
        }
    }

    #[tokio::test]
    async fn an_accepted_eviction_carries_the_grace_period_and_the_uid() {
        let (api, seen) = api(vec![(201, "Created")]);
        let outcome = evict_now(&api, Guard::Budgeted).await;
        assert_eq!(outcome, Eviction::Evicted { refusals: 0 });
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        let Seen {
            method, path, body, ..
        } = &seen[0];
        assert_eq!(method, "POST");
        assert_eq!(path, "/api/v1/namespaces/batch/pods/victim/eviction");
        assert_eq!(body["apiVersion"], "policy/v1");
        assert_eq!(body["kind"], "Eviction");
        assert_eq!(body["metadata"]["name"], "victim");
        assert_eq!(body["deleteOptions"]["gracePeriodSeconds"], 1);
        assert_eq!(body["deleteOptions"]["preconditions"]["uid"], "uid-1");
    }

    #[tokio::test(start_paused = true)]
    async fn a_budget_refusal_is_retried_until_it_passes() {
        let (api, seen) = api(vec![
            (429, "TooManyRequests"),
            (429, "TooManyRequests"),
            (201, "Created"),
        ]);
        let (term, _state) = test_term().await;
        let mut reported = Vec::new();
        let outcome = evict(
            &api,
            &term,
            &target(),
            Guard::Budgeted,
            Instant::now() + Duration::from_secs(3),
            |r| reported.push(r.clone()),
        )
        .await;
        assert_eq!(outcome, Eviction::Evicted { refusals: 2 });
        assert_eq!(reported.len(), 1, "one report per kind of refusal");
        assert!(reported[0].is_budget());
        assert_eq!(seen.lock().unwrap().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_that_outlasts_the_deadline_ends_in_a_delete() {
        let (api, seen) = api(vec![(429, "TooManyRequests")]);
        let (term, _state) = test_term().await;
        let start = Instant::now();
        let outcome = evict(
            &api,
            &term,
            &target(),
            Guard::Budgeted,
            start + Duration::from_secs(2),
            |_| {},
        )
        .await;
        let Eviction::DeletedAfterRefusal { refusal, refusals } = outcome else {
            panic!("{outcome:?}")
        };
        assert!(refusal.is_budget());
        // 0, 0.1, 0.3, 0.7, 1.5, 2.0 s: backoff doubles to at most a second, ends at the deadline.
        assert_eq!(refusals, 6);
        let seen = seen.lock().unwrap();
        let Seen {
            method, path, body, ..
        } = seen.last().unwrap();
        assert_eq!(method, "DELETE");
        assert_eq!(path, "/api/v1/namespaces/batch/pods/victim");
        assert_eq!(body["preconditions"]["uid"], "uid-1");
        assert_eq!(body["gracePeriodSeconds"], 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_misconfigured_budget_is_reported_and_the_pod_deleted_at_the_deadline() {
        let (api, _seen) = api(vec![(500, "InternalError")]);
        let (term, _state) = test_term().await;
        let mut reported = Vec::new();
        let outcome = evict(
            &api,
            &term,
            &target(),
            Guard::Budgeted,
            Instant::now() + Duration::from_millis(150),
            |r| reported.push(r.clone()),
        )
        .await;
        assert!(
            matches!(&outcome, Eviction::DeletedAfterRefusal { refusal, .. } if refusal.is_misconfigured()),
            "{outcome:?}"
        );
        assert_eq!(reported.len(), 1);
    }

    #[tokio::test]
    async fn a_victim_already_gone_or_replaced_is_not_evicted_again() {
        for code in [404, 409] {
            let (api, seen) = api(vec![(code, "Gone")]);
            let outcome = evict_now(&api, Guard::Budgeted).await;
            assert_eq!(outcome, Eviction::AlreadyGone);
            assert_eq!(seen.lock().unwrap().len(), 1);
        }
    }

    #[tokio::test]
    async fn nothing_is_evicted_once_the_term_is_over() {
        let (api, seen) = api(vec![(201, "Created")]);
        let (term, state) = test_term().await;
        state.send_replace(LeaderState {
            term: 1,
            acting_until: None,
        });
        let outcome = evict(
            &api,
            &term,
            &target(),
            Guard::Budgeted,
            Instant::now(),
            |_| {},
        )
        .await;
        assert_eq!(outcome, Eviction::NotLeader);
        assert!(seen.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_victim_no_budget_guards_is_marked_then_deleted_without_the_eviction_api() {
        let (api, seen) = api(vec![(200, "OK")]);
        let outcome = evict_now(&api, Guard::Unbudgeted).await;
        assert_eq!(outcome, Eviction::Evicted { refusals: 0 });
        let seen = seen.lock().unwrap();
        let calls: Vec<(&str, &str)> = seen
            .iter()
            .map(|s| (s.method.as_str(), s.path.as_str()))
            .collect();
        assert_eq!(
            calls,
            [
                ("GET", "/api/v1/namespaces/batch/pods/victim"),
                ("PATCH", "/api/v1/namespaces/batch/pods/victim/status"),
                ("DELETE", "/api/v1/namespaces/batch/pods/victim"),
            ]
        );
        let marked = &seen[1].body;
        assert_eq!(marked["metadata"]["uid"], "uid-1");
        let condition = &marked["status"]["conditions"][0];
        assert_eq!(condition["type"], "DisruptionTarget");
        assert_eq!(condition["status"], "True");
        assert_eq!(condition["reason"], DISRUPTION_REASON);
        let deleted = &seen[2].body;
        assert_eq!(deleted["preconditions"]["uid"], "uid-1");
        assert_eq!(deleted["gracePeriodSeconds"], 1);
    }

    #[tokio::test]
    async fn somebody_elses_disruption_mark_is_kept_and_the_victim_deleted() {
        let mut stored = victim();
        stored["status"] = json!({"conditions": [{"type": "DisruptionTarget", "status": "True",
            "reason": "DeletionByTaintManager"}]});
        let (api, seen) = api_reading(vec![(200, "OK")], Some(stored));
        let outcome = evict_now(&api, Guard::Unbudgeted).await;
        assert_eq!(outcome, Eviction::Evicted { refusals: 0 });
        let seen = seen.lock().unwrap();
        let calls: Vec<&str> = seen.iter().map(|s| s.method.as_str()).collect();
        assert_eq!(calls, ["GET", "DELETE"]);
    }

    #[tokio::test]
    async fn a_victim_marked_when_its_reclaim_started_is_only_deleted() {
        let (api, seen) = api(vec![(200, "OK")]);
        let outcome = evict_now(&api, Guard::Unbudgeted.marked(true)).await;
        assert_eq!(outcome, Eviction::Evicted { refusals: 0 });
        let seen = seen.lock().unwrap();
        let calls: Vec<&str> = seen.iter().map(|s| s.method.as_str()).collect();
        assert_eq!(calls, ["DELETE"]);
        // A budget that guards the victim still sends it through the Eviction API.
        assert_eq!(Guard::Budgeted.marked(true), Guard::Budgeted);
    }

    #[tokio::test]
    async fn a_victim_that_cannot_be_marked_goes_through_the_eviction_api() {
        let (api, seen) = api(vec![(403, "Forbidden"), (201, "Created")]);
        let outcome = evict_now(&api, Guard::Unbudgeted).await;
        assert_eq!(outcome, Eviction::Evicted { refusals: 0 });
        let seen = seen.lock().unwrap();
        let Seen { method, path, .. } = seen.last().unwrap();
        assert_eq!(
            (method.as_str(), path.as_str()),
            ("POST", "/api/v1/namespaces/batch/pods/victim/eviction")
        );
        assert!(seen.iter().all(|s| s.method != "DELETE"));
    }

    #[tokio::test]
    async fn an_unguarded_victim_already_gone_or_replaced_is_not_deleted() {
        // Gone: the read before the mark finds no pod.
        let (client, seen) = api_reading(vec![(200, "OK")], None);
        assert_eq!(
            evict_now(&client, Guard::Unbudgeted).await,
            Eviction::AlreadyGone
        );
        assert_eq!(seen.lock().unwrap().len(), 1);
        // Replaced by a namesake: the read shows another uid; nothing is marked or deleted.
        let mut namesake = victim();
        namesake["metadata"]["uid"] = json!("uid-2");
        let (client, seen) = api_reading(vec![(200, "OK")], Some(namesake));
        assert_eq!(
            evict_now(&client, Guard::Unbudgeted).await,
            Eviction::AlreadyGone
        );
        assert_eq!(seen.lock().unwrap().len(), 1);
        // Replaced between the read and the mark: the API server refuses the mark (its uid is
        // immutable), and the Eviction API's uid precondition finds the victim gone.
        let (client, seen) = api(vec![(422, "Invalid"), (409, "Conflict")]);
        assert_eq!(
            evict_now(&client, Guard::Unbudgeted).await,
            Eviction::AlreadyGone
        );
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        assert!(seen.iter().all(|s| s.method != "DELETE"));
    }
}
