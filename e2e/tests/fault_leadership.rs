#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! Leadership faults (issue 16): a leader paused past its lease while a standby takes over
//! (split brain: the old one must not act when it resumes), and one process that loses its
//! lease and wins it again while its admissions are in flight (it must not book their GPUs a
//! second time). The pauses are SIGSTOP and SIGCONT; what each process did is read from its
//! metrics, the events it reported under its identity, the Lease and the fake vLLM's calls.

mod common;
mod fault_common;

use std::time::Duration;

use common::{
    OPERATOR_NAMESPACE, Operator, Options, all_running, apply_queue, bound, create, event,
    free_port, is_gated, settled,
};
use fault_common::{
    actions, events_reported_by, fake_vllms, gone, handover_record, installed, name, now,
    point_webhook_at, queue,
};
use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{DEFAULT_TIMEOUT, QuotaSampler, TenantQuota, gpu_pod, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::SignedDuration;
use kube::{
    Client,
    api::{Api, DeleteParams, ListParams},
};

/// Waits until the process reports `leader` as its `gpuqueue_leader` gauge.
async fn leading(operator: &Operator, leader: bool) {
    let want = if leader { 1.0 } else { 0.0 };
    wait_for(
        format!("{} to report gpuqueue_leader {want}", operator.identity),
        DEFAULT_TIMEOUT,
        || async {
            match operator.metric("gpuqueue_leader").await {
                Some(value) if (value - want).abs() < 0.5 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
}

/// The operator's Lease as the API server shows it.
async fn lease(client: &Client) -> Lease {
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    leases.get("gpuqueue-operator").await.unwrap()
}

/// Waits until the Lease has run out unrenewed (its holder is paused).
async fn lease_expired(client: &Client) {
    wait_for(
        "the paused holder's lease to expire",
        DEFAULT_TIMEOUT,
        || async {
            let spec = lease(client).await.spec.unwrap();
            let renewed = spec.renew_time.unwrap().0;
            let duration =
                SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap()));
            if renewed + duration < now() {
                Ok(())
            } else {
                Err(format!("renewed at {renewed}"))
            }
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_does_not_act_when_it_resumes() {
    let (cluster, first_port) = installed("fault_split_brain", 2).await;
    let client = cluster.client();
    let first = Operator::start(&cluster, Options::new("first", first_port)).await;
    leading(&first, true).await;
    let second_port = free_port();
    let second = Operator::start(&cluster, Options::new("second", second_port)).await;
    leading(&second, false).await;

    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    apply_queue(&client, &queue("online", online.name(), 2, 0, None)).await;
    apply_queue(&client, &queue("batch", batch.name(), 0, 2, Some("1s"))).await;
    let borrowers: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    for pod in ["b-0", "b-1"] {
        create(&borrowers, &gpu_pod(pod, NVIDIA_GPU, 1)).await;
    }
    let running = all_running(&borrowers, 2).await;
    let servers = fake_vllms(&running).await;
    // Its announcements of those admissions are out first: events it queued before the pause
    // and published after it would be true, but not what this test is about.
    for pod in ["b-0", "b-1"] {
        event(&client, batch.name(), pod, "Admitted").await;
    }

    // The leader stops where it is, holding the lease, longer than the lease lasts.
    let before = actions(&first).await;
    first.process.pause().unwrap();
    point_webhook_at(&client, second_port).await;
    leading(&second, true).await;

    // The new leader admits an owner and takes a borrower's GPU for it.
    let owners: Api<Pod> = Api::namespaced(client.clone(), online.name());
    create(&owners, &gpu_pod("o-0", NVIDIA_GPU, 1)).await;
    bound(&owners, "o-0").await;
    let record = handover_record(&client, "online", &format!("{}/o-0", online.name())).await;
    assert_eq!(record.outcome, "Completed", "{record:?}");

    // The old leader resumes: it notices it lost the lease, and stands by.
    let resumed_at = now();
    first.process.resume().unwrap();
    leading(&first, false).await;
    wait_for(
        "the old leader to log its lost term",
        DEFAULT_TIMEOUT,
        || async {
            let log = first.process.log();
            if log.contains("stopped acting as the leader") {
                Ok(())
            } else {
                Err(first.process.log_tail(5))
            }
        },
    )
    .await
    .unwrap();

    // More work after it resumed, all the new leader's: the second owner takes the last
    // borrower's GPU.
    create(&owners, &gpu_pod("o-1", NVIDIA_GPU, 1)).await;
    bound(&owners, "o-1").await;
    let record = handover_record(&client, "online", &format!("{}/o-1", online.name())).await;
    assert_eq!(record.outcome, "Completed", "{record:?}");
    for pod in ["b-0", "b-1"] {
        gone(&borrowers, pod).await;
    }

    // The old leader did nothing: not by its metrics, not in the API's events, not on the
    // vLLM servers (each victim paused once, by the new leader's two handovers).
    assert_eq!(actions(&first).await, before, "the old leader acted");
    assert_eq!(first.metric("gpuqueue_leader_terms_total").await, Some(1.0));
    assert_eq!(
        lease(&client)
            .await
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("second")
    );
    let late: Vec<_> = events_reported_by(&client, "first")
        .await
        .into_iter()
        .filter(|(at, _)| *at >= resumed_at)
        .map(|(at, e)| format!("{at} {:?}: {:?}", e.reason, e.message))
        .collect();
    assert!(
        late.is_empty(),
        "events of the old leader after it resumed: {late:?}"
    );
    let new_leader: Vec<_> = events_reported_by(&client, "second").await;
    assert!(
        new_leader
            .iter()
            .any(|(_, e)| e.reason.as_deref() == Some("HandoverCompleted")),
        "the new leader reports its handovers"
    );
    for (pod, server) in &servers {
        assert_eq!(server.calls_to("/pause").len(), 1, "{pod} paused once");
    }
    let second_actions = actions(&second).await;
    assert!(
        second_actions
            .iter()
            .any(|(family, n)| *family == "gpuqueue_reclaims_started_total"
                && (*n - 2.0).abs() < 0.5),
        "{second_actions:?}"
    );
}

/// Pods of `pods` without the admission gate.
async fn ungated(pods: &Api<Pod>) -> Vec<String> {
    let list = pods.list(&ListParams::default()).await.unwrap();
    list.items
        .iter()
        .filter(|p| !is_gated(p))
        .map(name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_its_lease_and_wins_it_again_books_no_gpu_twice() {
    let (cluster, port) = installed("fault_leadership_flap", 8).await;
    let client = cluster.client();
    let solo = Operator::start(&cluster, Options::new("solo", port)).await;
    leading(&solo, true).await;

    // The queue's ceiling (4) is half the node: an admission booked twice would show as a
    // fifth bound pod, not only as one kube-scheduler cannot place.
    let batch = cluster.namespace("batch").await.unwrap();
    apply_queue(&client, &queue("batch", batch.name(), 4, 0, None)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    for i in 0..4 {
        create(&pods, &gpu_pod(&format!("hold-{i}"), NVIDIA_GPU, 1)).await;
    }
    all_running(&pods, 4).await;
    for i in 0..4 {
        create(&pods, &gpu_pod(&format!("next-{i}"), NVIDIA_GPU, 1)).await;
    }
    let sampler = QuotaSampler::start(
        &client,
        vec![TenantQuota {
            name: "batch".into(),
            namespace: batch.name().to_owned(),
            guarantee: 4,
            ceiling: 4,
        }],
        Duration::from_mins(1),
    );

    // The holders go at once; the leader admits the four waiting pods, and is stopped as soon
    // as the first release shows, the others' writes in flight or unseen by its watch.
    for i in 0..4 {
        pods.delete(
            &format!("hold-{i}"),
            &DeleteParams::default().grace_period(0),
        )
        .await
        .unwrap();
    }
    wait_for("a first gate released", DEFAULT_TIMEOUT, || async {
        let released = ungated(&pods).await;
        if released.iter().any(|n| n.starts_with("next-")) {
            Ok(())
        } else {
            Err(format!("{released:?}"))
        }
    })
    .await
    .unwrap();
    solo.process.pause().unwrap();
    lease_expired(&client).await;
    solo.process.resume().unwrap();

    // The same process loses its term and begins another.
    wait_for("a second term", DEFAULT_TIMEOUT, || async {
        match solo.metric("gpuqueue_leader_terms_total").await {
            Some(terms) if terms >= 2.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    leading(&solo, true).await;
    // New pods in the new term find the quota full.
    for i in 0..2 {
        create(&pods, &gpu_pod(&format!("late-{i}"), NVIDIA_GPU, 1)).await;
    }

    let settled = settled(&pods, 4, 2).await;
    let bound_pods: Vec<_> = settled.iter().filter(|p| !is_gated(p)).map(name).collect();
    assert!(
        bound_pods.iter().all(|n| n.starts_with("next-")),
        "the pods admitted before the flap keep their GPUs: {bound_pods:?}"
    );
    let report = sampler.finish().await;
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    for pod in &bound_pods {
        bound(&pods, pod).await;
    }
}
