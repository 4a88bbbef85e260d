#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! Quota liveness against a tenant (issue 13, item 3): pods that got past admission are
//! corrected, a borrower that straddles its queue's guarantee gives it back, and a pinned pod
//! kube-scheduler never binds does not hold its room. Every tenant write is made by the
//! tenant of the threat model: a service account bound to the stock `edit` role in its own
//! namespace. Pods that bypass admission are made the way the review found them: created while
//! the webhook is down (the operator process stopped; `failurePolicy: Ignore`).

mod common;

use std::{collections::BTreeMap, time::Duration};

use common::{
    Operator, Options, apply_queue, condition, event, events, free_port, install, queue_status,
};
use gpuqueue_api::{NVIDIA_GPU, conditions, v1alpha1::GpuQueue};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, TempNamespace, describe_pod,
    gpu_pod, node_of, wait_for,
};
use k8s_openapi::api::core::v1::{Affinity, Pod, PodAffinity, PodAffinityTerm, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{
    Client,
    api::{Api, ListParams, PostParams},
};

/// A control plane with one 8-GPU node and the operator running against it.
struct World {
    cluster: ControlPlane,
    client: Client,
    webhook_port: u16,
    operator: Operator,
    namespaces: Vec<TempNamespace>,
}

impl World {
    async fn start(name: &str) -> Self {
        let nodes = vec![GpuNode::whole_gpus("gpu-node-0", 8)];
        let cluster = ControlPlane::start(ControlPlaneConfig::new(name).with_nodes(nodes))
            .await
            .unwrap();
        let client = cluster.client();
        let webhook_port = free_port();
        install(&cluster, webhook_port).await;
        let operator = Operator::start(&cluster, Options::new("first", webhook_port)).await;
        Self {
            cluster,
            client,
            webhook_port,
            operator,
            namespaces: Vec::new(),
        }
    }

    /// Stops the operator (its webhook with it): an outage.
    async fn outage(&mut self) {
        self.operator
            .process
            .terminate(Duration::from_secs(10))
            .await
            .unwrap();
    }

    /// Starts a new operator process after an outage.
    async fn recover(&mut self) {
        self.operator =
            Operator::start(&self.cluster, Options::new("second", self.webhook_port)).await;
    }

    /// A namespace, its tenant's pod API (stock `edit` role) and a queue claiming it.
    async fn tenant(&mut self, queue: &str, guaranteed: u32, burstable: u32) -> (String, Api<Pod>) {
        let namespace = self.cluster.namespace(queue).await.unwrap();
        let name = namespace.name().to_owned();
        self.namespaces.push(namespace);
        let tenant = self.cluster.tenant_with_edit(&name).await.unwrap();
        apply_queue(
            &self.client,
            &common::queue_yaml(queue, &[&name], guaranteed, burstable),
        )
        .await;
        (name.clone(), Api::namespaced(tenant.client, &name))
    }
}

/// Creates `count` one-GPU pods named `<prefix>-<i>`, in order (so that their names sort as
/// their creation times do).
async fn create_pods(pods: &Api<Pod>, prefix: &str, count: u32) {
    for i in 0..count {
        let pod = gpu_pod(&format!("{prefix}-{i}"), NVIDIA_GPU, 1);
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
}

/// Waits until the namespace holds exactly `names` (sorted), with `bound` of them bound.
async fn exactly(pods: &Api<Pod>, names: &[String], bound: usize, timeout: Duration) {
    wait_for(
        format!("exactly {names:?}, {bound} bound"),
        timeout,
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let live: Vec<&Pod> = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let mut have: Vec<String> = live
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            have.sort();
            let bound_now = live.iter().filter(|p| node_of(p).is_some()).count();
            if have == names && bound_now == bound {
                Ok(())
            } else {
                Err(live
                    .iter()
                    .map(|p| describe_pod(p))
                    .collect::<Vec<_>>()
                    .join("; "))
            }
        },
    )
    .await
    .unwrap();
}

fn names(prefix: &str, range: std::ops::Range<u32>) -> Vec<String> {
    range.map(|i| format!("{prefix}-{i}")).collect()
}

/// Waits until the operator's metrics show `line` exactly.
async fn metric_line(operator: &Operator, line: &str) {
    wait_for(format!("metric {line}"), DEFAULT_TIMEOUT, || async {
        let text = operator.metrics().await;
        if text.lines().any(|l| l == line) {
            Ok(())
        } else {
            Err(text
                .lines()
                .filter(|l| l.contains("unadmitted") || l.contains("bypass"))
                .collect::<Vec<_>>()
                .join("\n"))
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_created_during_an_outage_above_the_ceiling_are_evicted_newest_first() {
    // Case 12: batch (ceiling 4) runs 3 admitted pods; during an outage the tenant adds 3
    // more, which kube-scheduler binds (6 of 4). Once the operator is back, the two newest go.
    let mut world = World::start("liveness_outage").await;
    let (namespace, pods) = world.tenant("batch", 2, 2).await;
    create_pods(&pods, "admitted", 3).await;
    exactly(&pods, &names("admitted", 0..3), 3, DEFAULT_TIMEOUT).await;

    world.outage().await;
    create_pods(&pods, "outage", 3).await;
    let mut all = names("admitted", 0..3);
    all.extend(names("outage", 0..3));
    exactly(&pods, &all, 6, DEFAULT_TIMEOUT).await;

    world.recover().await;
    let mut kept = names("admitted", 0..3);
    kept.push("outage-0".to_owned());
    exactly(&pods, &kept, 4, DEFAULT_TIMEOUT).await;
    for evicted in ["outage-1", "outage-2"] {
        let note = event(&world.client, &namespace, evicted, "QuotaBypass").await;
        assert!(
            note.starts_with(
                "evicted: it holds 1 nvidia.com/gpu of queue batch without admission and batch is over its ceiling of 4"
            ),
            "{note}"
        );
    }
    assert!(
        events(&world.client, &namespace, "outage-0", "QuotaBypass")
            .await
            .is_empty()
    );
    // The one left within the ceiling is still reported.
    let bypass = |q: &GpuQueue| {
        q.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::types::QUOTA_BYPASS)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    queue_status(&world.client, "batch", "QuotaBypass True for 1 pod", |q| {
        bypass(q).is_some_and(|(status, reason, message)| {
            status == "True"
                && reason == conditions::reasons::UNADMITTED_PODS
                && message.starts_with(
                    "1 pod(s) of this queue hold 1 nvidia.com/gpu without gpuqueue's admission",
                )
        })
    })
    .await;
    metric_line(
        &world.operator,
        r#"gpuqueue_queue_unadmitted_pods{queue="batch"} 1"#,
    )
    .await;
    metric_line(
        &world.operator,
        r#"gpuqueue_quota_bypass_evictions_total{queue="batch",reason="OverCeiling"} 2"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_a_tenant_writes_itself_during_an_outage_are_not_believed() {
    // Case 12 with the tenant's own admission annotations: batch (ceiling 4) runs 3 pods the
    // webhook admitted at creation, their admissions sealed. During an outage the tenant adds
    // one pod carrying a copy of admitted-0's annotations and pin (its seal and token), and two
    // with admissions it made up. Read as admitted, they would keep batch at 6 of 4 for good;
    // read as unadmitted, the two newest go.
    let mut world = World::start("liveness_forged").await;
    let (namespace, pods) = world.tenant("batch", 2, 2).await;
    create_pods(&pods, "admitted", 3).await;
    exactly(&pods, &names("admitted", 0..3), 3, DEFAULT_TIMEOUT).await;
    let original = pods.get("admitted-0").await.unwrap();
    let notes = original.metadata.annotations.clone().unwrap();
    assert!(
        notes.contains_key("gpuqueue.io/admission-seal")
            && notes.contains_key("gpuqueue.io/admitted-at-creation"),
        "{notes:?}"
    );

    world.outage().await;
    let with = |name: &str, notes: BTreeMap<String, String>, pinned: bool| {
        let mut pod = gpu_pod(name, NVIDIA_GPU, 1);
        pod.metadata.annotations = Some(notes);
        if pinned {
            pod.spec.as_mut().unwrap().node_selector =
                original.spec.as_ref().and_then(|s| s.node_selector.clone());
        }
        pod
    };
    let made_up = |at: &str| {
        BTreeMap::from([
            ("gpuqueue.io/queue".to_owned(), "batch".to_owned()),
            (
                "gpuqueue.io/admitted-as".to_owned(),
                "guaranteed".to_owned(),
            ),
            ("gpuqueue.io/admitted-at".to_owned(), at.to_owned()),
        ])
    };
    let now = notes["gpuqueue.io/admitted-at"].clone();
    for pod in [
        with("copied-0", notes.clone(), true),
        with("forged-0", made_up(&now), false),
        with("forged-1", made_up(&now), false),
    ] {
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let mut all = names("admitted", 0..3);
    all.extend(["copied-0", "forged-0", "forged-1"].map(str::to_owned));
    all.sort();
    exactly(&pods, &all, 6, DEFAULT_TIMEOUT).await;

    world.recover().await;
    let mut kept = names("admitted", 0..3);
    kept.push("copied-0".to_owned());
    exactly(&pods, &kept, 4, DEFAULT_TIMEOUT).await;
    for evicted in ["forged-0", "forged-1"] {
        let note = event(&world.client, &namespace, evicted, "QuotaBypass").await;
        assert!(
            note.starts_with("evicted: it holds 1 nvidia.com/gpu of queue batch without admission"),
            "{note}"
        );
    }
    // The copy is unadmitted too (one admission, one pod), reported with the queue.
    metric_line(
        &world.operator,
        r#"gpuqueue_queue_unadmitted_pods{queue="batch"} 1"#,
    )
    .await;
    // It says so where the tenant looks: an event on the pod, which `explain` reads.
    let note = event(
        &world.client,
        &namespace,
        "copied-0",
        "AdmissionNotBelieved",
    )
    .await;
    assert!(
        note.starts_with(
            "its admission annotations are not the operator's (its reservation token "
        ) && note.contains(
            "is pod admitted-0's, created before it): it is charged to its queue as unadmitted"
        ),
        "{note}"
    );
    let explained = common::run_ok(
        common::kubectl_with_plugin(&world.cluster)
            .args(["gpuqueue", "explain", "copied-0", "-n", &namespace]),
    );
    let explained = String::from_utf8_lossy(&explained.stdout);
    assert!(
        explained.contains(
            "not admitted: its admission annotations are not the operator's, and it is charged to its queue as unadmitted"
        ) && explained.contains("(not the operator's: charged as unadmitted)"),
        "{explained}"
    );
    // The original keeps its admission.
    let explained = common::run_ok(common::kubectl_with_plugin(&world.cluster).args([
        "gpuqueue",
        "explain",
        "admitted-0",
        "-n",
        &namespace,
    ]));
    let explained = String::from_utf8_lossy(&explained.stdout);
    assert!(
        explained.contains("admitted as borrowed by queue batch")
            || explained.contains("admitted as guaranteed by queue batch"),
        "{explained}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ungated_intruders_do_not_take_the_gpus_a_reclaim_frees_for_the_owner() {
    // Case 4: batch borrows the whole node; during an outage its tenant adds 4 pods that wait
    // for kube-scheduler, ungated, ready to take any GPU that frees. online (guarantee 4) then
    // scales up: it must get all 4 GPUs, and the intruders go.
    let mut world = World::start("liveness_intruders").await;
    let (_, online) = world.tenant("online", 4, 0).await;
    let (namespace, batch) = world.tenant("batch", 0, 12).await;
    create_pods(&batch, "borrower", 8).await;
    exactly(&batch, &names("borrower", 0..8), 8, DEFAULT_TIMEOUT).await;

    world.outage().await;
    create_pods(&batch, "intruder", 4).await;
    world.recover().await;
    queue_status(&world.client, "batch", "QuotaBypass True", |q| {
        condition(q, conditions::types::QUOTA_BYPASS).is_some_and(|(status, _)| status == "True")
    })
    .await;

    create_pods(&online, "online", 4).await;
    exactly(&online, &names("online", 0..4), 4, Duration::from_mins(2)).await;
    // Four of batch's borrowers gave their GPUs back; every intruder was evicted.
    wait_for("the intruders gone", DEFAULT_TIMEOUT, || async {
        let list = batch
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let left: Vec<String> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        if left.iter().all(|n| n.starts_with("borrower")) && left.len() == 4 {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await
    .unwrap();
    let note = event(&world.client, &namespace, "intruder-3", "QuotaBypass").await;
    assert!(
        note.contains("while queue online waits for its guarantee"),
        "{note}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrower_bigger_than_what_its_queue_borrows_gives_the_guarantee_back() {
    // Case 8: batch (guarantee 4) runs one pod of 6 GPUs, borrowing 2. online (guarantee 4)
    // scales to its guarantee: 2 fit, the other 2 need the straddling pod evicted.
    let mut world = World::start("liveness_straddle").await;
    let (_, online) = world.tenant("online", 4, 0).await;
    let (_, batch) = world.tenant("batch", 4, 4).await;
    batch
        .create(&PostParams::default(), &gpu_pod("big", NVIDIA_GPU, 6))
        .await
        .unwrap();
    exactly(&batch, &["big".to_owned()], 1, DEFAULT_TIMEOUT).await;

    create_pods(&online, "online", 4).await;
    exactly(&online, &names("online", 0..4), 4, Duration::from_mins(2)).await;
    exactly(&batch, &[], 0, DEFAULT_TIMEOUT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_pod_that_never_binds_is_reported_and_its_room_released() {
    // Case 11: team's pod is admitted and pinned, but its pod affinity names pods that do not
    // exist, so kube-scheduler never binds it. other's pod within its guarantee finds the
    // node full (on paper) until the stuck pin's room is released.
    let mut world = World::start("liveness_stuck_pin").await;
    let (namespace, team) = world.tenant("team", 4, 0).await;
    let (_, other) = world.tenant("other", 8, 0).await;
    let mut stuck = gpu_pod("stuck", NVIDIA_GPU, 4);
    let spec: &mut PodSpec = stuck.spec.as_mut().unwrap();
    spec.affinity = Some(Affinity {
        pod_affinity: Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Some([("app".to_owned(), "nobody".to_owned())].into()),
                    ..LabelSelector::default()
                }),
                topology_key: "kubernetes.io/hostname".to_owned(),
                ..PodAffinityTerm::default()
            }]),
            ..PodAffinity::default()
        }),
        ..Affinity::default()
    });
    team.create(&PostParams::default(), &stuck).await.unwrap();
    other
        .create(&PostParams::default(), &gpu_pod("first", NVIDIA_GPU, 4))
        .await
        .unwrap();
    exactly(&other, &["first".to_owned()], 1, DEFAULT_TIMEOUT).await;
    other
        .create(&PostParams::default(), &gpu_pod("second", NVIDIA_GPU, 4))
        .await
        .unwrap();
    // Reported after a minute of Unschedulable, then `second` is admitted into the room.
    let wait = Duration::from_secs(150);
    exactly(&other, &["first".to_owned(), "second".to_owned()], 2, wait).await;
    let note = event(&world.client, &namespace, "stuck", "PinReleased").await;
    assert!(
        note.starts_with("kube-scheduler has not bound the pod to node gpu-node-0"),
        "{note}"
    );
    // It keeps its quota: team still holds 4.
    queue_status(&world.client, "team", "4 allocated", |q| {
        common::numbers(q).is_some_and(|(allocated, _, _, _)| allocated == 4)
    })
    .await;
}
