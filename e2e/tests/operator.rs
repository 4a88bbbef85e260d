#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The operator end to end: the real `gpuqueue-operator` binary against a real control plane
//! (kube-apiserver, kube-scheduler, kube-controller-manager, KWOK GPU nodes), its webhook
//! configuration and RBAC from `config/`. Each test starts its own control plane.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{
    OPERATOR_NAMESPACE, Operator, Options, annotation, apply_queue, bound, condition, create,
    event, events, free_port, gated, install, is_gated, numbers, operator_access, queue_status,
    queue_yaml, settled, waiting_reason,
};
use gpuqueue_api::{NVIDIA_GPU, annotations, conditions, v1alpha1::GpuQueue};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, apply_yaml, describe_pod, gpu_pod,
    node_of, repo_root, wait_for,
};
use k8s_openapi::api::{
    admissionregistration::v1::MutatingWebhookConfiguration,
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    core::v1::{Node, Pod, Service},
};
use kube::{
    Client,
    api::{Api, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

async fn start(name: &str, nodes: Option<Vec<GpuNode>>) -> ControlPlane {
    let mut config = ControlPlaneConfig::new(name);
    if let Some(nodes) = nodes {
        config = config.with_nodes(nodes);
    }
    let cluster = ControlPlane::start(config).await.unwrap();
    eprintln!("{name}: control plane up ({})", cluster.startup_summary());
    cluster
}

/// A Deployment of `replicas` one-GPU pods, written as a tenant writes it: nothing about gates
/// or queues.
fn deployment(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n        - name: vllm\n          image: vllm/vllm-openai:v0.11.0\n          resources:\n            limits: {{nvidia.com/gpu: 1}}\n"
    )
}

/// The two-tenant scenario of `examples/two-tenants.yaml` on 32 GPUs: `online` is guaranteed
/// 24 (lends at most 20), `batch` is guaranteed 8 and may borrow 16. A plain Deployment of 26
/// batch pods gets 8 guaranteed and 16 borrowed GPUs; two pods wait above the ceiling.
async fn tenants_borrow_and_wait(cluster: &ControlPlane, client: &Client, operator: &Operator) {
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    apply_queue(
        client,
        &format!(
            "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: online\nspec:\n  namespaces: [{}]\n  resources:\n    - name: nvidia.com/gpu\n      guaranteed: 24\n      lendingLimit: 20\n",
            online.name()
        ),
    )
    .await;
    apply_queue(client, &queue_yaml("batch", &[batch.name()], 8, 16)).await;

    apply_yaml(client, &deployment("vllm", 26), Some(batch.name()))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    let all = settled(&pods, 24, 2).await;

    // Every pod was admitted by the operator: at its creation while nothing waited, through
    // the gate once pods had to wait.
    let admitted: Vec<&Pod> = all.iter().filter(|p| !is_gated(p)).collect();
    let admitted_as = |kind: &str| {
        admitted
            .iter()
            .filter(|p| annotation(p, annotations::ADMITTED_AS) == Some(kind))
            .count()
    };
    assert_eq!(admitted_as("guaranteed"), 8);
    assert_eq!(admitted_as("borrowed"), 16);
    for pod in &admitted {
        assert_eq!(annotation(pod, annotations::QUEUE), Some("batch"));
        let selector = pod.spec.as_ref().unwrap().node_selector.as_ref().unwrap();
        assert_eq!(
            Some(selector["kubernetes.io/hostname"].as_str()),
            node_of(pod),
            "bound where the operator pinned it"
        );
    }

    // The two above the ceiling say why, on the pod and in an event naming the numbers.
    let waiting: Vec<&Pod> = all.iter().filter(|p| is_gated(p)).collect();
    let reason = annotation(waiting[0], annotations::WAITING_REASON).unwrap();
    assert!(
        reason.starts_with("OverCeiling: queue batch: nvidia.com/gpu allocated 24"),
        "{reason}"
    );
    let name = waiting[0].metadata.name.clone().unwrap();
    let message = event(client, batch.name(), &name, "OverCeiling").await;
    assert!(
        message.contains("queue batch")
            && message.contains("ceiling of 24 (guaranteed 8 + burstable 16)"),
        "{message}"
    );

    // kubectl get gq: who has what.
    let batch_queue = queue_status(
        client,
        "batch",
        "24 allocated, 16 borrowed, 2 pending",
        |q| numbers(q) == Some((24, 16, 0, 2)),
    )
    .await;
    assert_eq!(
        condition(&batch_queue, conditions::types::READY),
        Some(("True".into(), "Admitting".into()))
    );
    let summary = batch_queue.status.unwrap().summary.unwrap();
    assert_eq!(
        (summary.allocated.as_str(), summary.borrowed.as_str()),
        ("24", "16")
    );
    queue_status(client, "online", "16 of its GPUs lent", |q| {
        numbers(q) == Some((0, 0, 16, 0))
    })
    .await;

    // /metrics tells the same story.
    let metrics = operator.metrics().await;
    for line in [
        r#"gpuqueue_queue_allocated_gpus{queue="batch",resource="nvidia.com/gpu"} 24"#,
        r#"gpuqueue_queue_borrowed_gpus{queue="batch",resource="nvidia.com/gpu"} 16"#,
        r#"gpuqueue_queue_lent_gpus{queue="online",resource="nvidia.com/gpu"} 16"#,
        r#"gpuqueue_queue_guaranteed_gpus{queue="online",resource="nvidia.com/gpu"} 24"#,
        r#"gpuqueue_queue_pending_gpus{queue="batch",resource="nvidia.com/gpu"} 2"#,
        r#"gpuqueue_admission_decisions_total{queue="batch",outcome="admitted_borrowed"} 16"#,
        "gpuqueue_admission_latency_seconds_count 24",
        "gpuqueue_leader 1",
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
    assert!(metrics.contains("gpuqueue_node_fragmented_gpus{node=\"gpu-node-0\"}"));
    let webhook = |result: &str| {
        let series = format!(r#"gpuqueue_webhook_requests_total{{result="{result}"}} "#);
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series.as_str())?.parse::<u32>().ok())
            .unwrap_or(0)
    };
    let gated = webhook("gated") + webhook("busy");
    assert!(webhook("admitted") + gated == 26 && gated >= 2, "{metrics}");

    pods_the_quota_does_not_count(client, &pods).await;
}

/// In a claimed namespace: a CPU-only pod is never sent to the operator or gated; a pod asking
/// for more devices than any node can have (a typo for 2) waits at the gate and says why,
/// naming the field and the rule, on the pod and in an event.
async fn pods_the_quota_does_not_count(client: &Client, pods: &Api<Pod>) {
    let cpu: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
    }))
    .unwrap();
    create(pods, &cpu).await;
    let cpu = bound(pods, "web").await;
    assert!(annotation(&cpu, annotations::QUEUE).is_none());

    create(pods, &gpu_pod("typo", NVIDIA_GPU, 200)).await;
    let reason = waiting_reason(pods, "typo").await;
    let rule = "spec.containers.resources.requests[nvidia.com/gpu]: 200 devices is more than \
                any node has (at most 128)";
    assert!(
        reason.starts_with("InvalidRequest: ") && reason.contains(rule),
        "{reason}"
    );
    let namespace = pods.namespace().unwrap();
    let message = event(client, namespace, "typo", "InvalidRequest").await;
    assert!(message.contains(rule), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_deployment_is_admitted_within_quota_and_the_rest_waits_with_a_reason() {
    let cluster = start("operator_two_tenants", None).await;
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let operator = Operator::start(&cluster, Options::new("only", webhook_port)).await;
    tenants_borrow_and_wait(&cluster, &cluster.client(), &operator).await;
    a_node_read_with_a_default_is_counted_and_told_once(&cluster.client(), &operator).await;
}

/// A node with a malformed GPU memory label is read with a default: the pass counts it in
/// `objects_left_out` and logs it as a warning naming the label once, not on every pass.
async fn a_node_read_with_a_default_is_counted_and_told_once(client: &Client, operator: &Operator) {
    const LEFT_OUT: &str = "gpuqueue_objects_left_out";
    const PROBLEM: &str =
        r#"node odd-node: label nvidia.com/gpu.memory="lots" is not a number of MiB"#;
    assert_eq!(operator.metric(LEFT_OUT).await, Some(0.0));
    let nodes: Api<Node> = Api::all(client.clone());
    let odd =
        json!({"metadata": {"name": "odd-node", "labels": {"nvidia.com/gpu.memory": "lots"}}});
    let odd: Node = serde_json::from_value(odd).unwrap();
    nodes.create(&PostParams::default(), &odd).await.unwrap();
    let passes = || async {
        operator
            .metric("gpuqueue_admission_passes_total")
            .await
            .unwrap_or_default()
    };
    wait_for("the odd node counted", DEFAULT_TIMEOUT, || async {
        match operator.metric(LEFT_OUT).await {
            Some(n) if (n - 1.0).abs() < f64::EPSILON => Ok(()),
            other => Err(format!("{LEFT_OUT} {other:?}")),
        }
    })
    .await
    .unwrap();
    // Another pass over the same node (a label added) tells nothing new.
    let before = passes().await;
    let touch = json!({"metadata": {"labels": {"touched": "yes"}}});
    nodes
        .patch("odd-node", &PatchParams::default(), &Patch::Merge(touch))
        .await
        .unwrap();
    wait_for("a pass after the touch", DEFAULT_TIMEOUT, || async {
        let now = passes().await;
        if now > before {
            Ok(())
        } else {
            Err(format!("{now} passes"))
        }
    })
    .await
    .unwrap();
    assert_eq!(operator.metric(LEFT_OUT).await, Some(1.0));
    let log = operator.process.log();
    assert_eq!(
        log.matches(PROBLEM).count(),
        1,
        "{}",
        operator.process.log_tail(40)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_pod_is_admitted_at_creation_and_once_one_waits_the_next_goes_to_the_gate() {
    let cluster = start("operator_at_creation", None).await;
    let client = cluster.client();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let operator = Operator::start(&cluster, Options::new("only", webhook_port)).await;
    let team = cluster.namespace("team").await.unwrap();
    apply_queue(&client, &queue_yaml("team", &[team.name()], 2, 0)).await;
    // A status means the leader has run a pass over this queue: it can admit at creation.
    queue_status(&client, "team", "a first status", |q| numbers(q).is_some()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), team.name());
    let create_pod = |name: &'static str, gpus: u32| {
        let pods = pods.clone();
        async move {
            pods.create(&PostParams::default(), &gpu_pod(name, NVIDIA_GPU, gpus))
                .await
                .unwrap()
        }
    };

    // Nothing waits and it fits: the API server stores it pinned and admitted, never gated.
    let first = create_pod("first", 1).await;
    assert!(!is_gated(&first));
    assert_eq!(annotation(&first, annotations::QUEUE), Some("team"));
    assert_eq!(
        annotation(&first, annotations::ADMITTED_AS),
        Some("guaranteed")
    );
    assert!(annotation(&first, annotations::ADMITTED_AT_CREATION).is_some());
    let first = bound(&pods, "first").await;
    let pin =
        &first.spec.as_ref().unwrap().node_selector.as_ref().unwrap()["kubernetes.io/hostname"];
    assert_eq!(Some(pin.as_str()), node_of(&first));
    let note = event(&client, team.name(), "first", "Admitted").await;
    assert!(note.contains("at its creation"), "{note}");

    // Too big for what is left: it goes to the gate and waits, with its reason.
    assert!(is_gated(&create_pod("big", 2).await));
    let reason = waiting_reason(&pods, "big").await;
    assert!(reason.starts_with("OverCeiling"), "{reason}");
    // This one would fit, but a pod waits: the gate, where the fair order decides (it is
    // admitted there, since the waiting pod cannot use the room).
    assert!(is_gated(&create_pod("small", 1).await));
    let small = bound(&pods, "small").await;
    assert!(annotation(&small, annotations::ADMITTED_AT_CREATION).is_none());
    assert_eq!(
        annotation(&small, annotations::ADMITTED_AS),
        Some("guaranteed")
    );
    assert_eq!(
        operator
            .metric(r#"gpuqueue_webhook_requests_total{result="admitted"}"#)
            .await,
        Some(1.0)
    );
    assert_eq!(
        operator
            .metric(r#"gpuqueue_webhook_requests_total{result="gated"}"#)
            .await,
        Some(2.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_needs_no_more_than_the_rbac_in_config() {
    let cluster = start("operator_rbac", None).await;
    let admin = cluster.client();
    let webhook_port = free_port();
    // `install` applies config/rbac/, and the operator runs as its ServiceAccount.
    install(&cluster, webhook_port).await;
    let account = operator_access(&cluster).await;
    let operator = Operator::start(&cluster, Options::new("rbac", webhook_port)).await;

    // The same scenario, run by the operator as its ServiceAccount.
    tenants_borrow_and_wait(&cluster, &admin, &operator).await;

    // And what it must not do, the API server refuses.
    let reviews: Api<SubjectAccessReview> = Api::all(admin.clone());
    let may = |verb: &str, resource: &str, subresource: Option<&str>, name: Option<&str>| {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(account.username.clone()),
                groups: Some(vec!["system:serviceaccounts".into()]),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    group: Some(match resource {
                        "gpuqueues" => "gpuqueue.io".into(),
                        "mutatingwebhookconfigurations" => "admissionregistration.k8s.io".into(),
                        _ => String::new(),
                    }),
                    resource: Some(resource.into()),
                    subresource: subresource.map(Into::into),
                    name: name.map(Into::into),
                    namespace: Some("default".into()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let reviews = reviews.clone();
        async move {
            reviews
                .create(&PostParams::default(), &review)
                .await
                .unwrap()
                .status
                .unwrap()
                .allowed
        }
    };
    assert!(may("patch", "pods", None, None).await);
    assert!(
        !may("update", "pods", None, None).await,
        "pods are patched, never updated"
    );
    assert!(!may("get", "secrets", None, None).await, "no secrets");
    assert!(may("watch", "nodes", None, None).await);
    assert!(
        !may("get", "nodes", None, Some("gpu-node-0")).await,
        "nodes are watched, never read one by one"
    );
    assert!(
        !may("patch", "gpuqueues", None, Some("batch")).await,
        "spec belongs to admins"
    );
    assert!(may("patch", "gpuqueues", Some("status"), Some("batch")).await);
    assert!(
        !may(
            "patch",
            "mutatingwebhookconfigurations",
            None,
            Some("someone-elses")
        )
        .await,
        "only its own webhook configuration"
    );
    assert!(
        may(
            "patch",
            "mutatingwebhookconfigurations",
            None,
            Some("gpuqueue-operator")
        )
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmanaged_and_bypassing_gpu_pods_count_as_used_capacity() {
    // One node of 8 GPUs, so every GPU taken by someone else is visible.
    let cluster = start(
        "operator_unmanaged",
        Some(vec![GpuNode::whole_gpus("gpu-node-0", 8)]),
    )
    .await;
    let client = cluster.client();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;

    let team = cluster.namespace("team").await.unwrap();
    let other = cluster.namespace("other").await.unwrap();
    apply_queue(&client, &queue_yaml("team", &[team.name()], 8, 0)).await;

    // A pod of the team that bypassed the gate: created while no operator answered the
    // webhook (failure policy Ignore), so kube-scheduler bound it ungated. 1 GPU, charged to
    // its queue. (A pod bound at creation with spec.nodeName, the other bypass, is refused
    // by the policy in config/policy/.)
    let pods: Api<Pod> = Api::namespaced(client.clone(), team.name());
    create(&pods, &gpu_pod("bypass", NVIDIA_GPU, 1)).await;
    let bypass = bound(&pods, "bypass").await;
    assert!(!is_gated(&bypass) && annotation(&bypass, annotations::QUEUE).is_none());
    let _operator = Operator::start(&cluster, Options::new("only", webhook_port)).await;

    // Another scheduler's GPU pod outside any queue: 5 GPUs the operator does not manage.
    let others: Api<Pod> = Api::namespaced(client.clone(), other.name());
    create(&others, &gpu_pod("foreign", NVIDIA_GPU, 5)).await;
    let foreign = bound(&others, "foreign").await;
    assert!(!is_gated(&foreign) && annotation(&foreign, annotations::QUEUE).is_none());

    // 4 one-GPU pods, gated by hand: only the 2 GPUs still free are admitted.
    for i in 0..4 {
        create(
            &pods,
            &gated(gpu_pod(&format!("worker-{i}"), NVIDIA_GPU, 1)),
        )
        .await;
    }
    let all = settled(&pods, 3, 2).await;
    let waiting = all.iter().find(|p| is_gated(p)).unwrap();
    let reason = annotation(waiting, annotations::WAITING_REASON).unwrap();
    assert!(reason.starts_with("NoRoom: queue team"), "{reason}");
    queue_status(
        &client,
        "team",
        "3 allocated (one bypassed the gate), 2 pending",
        |q| numbers(q).is_some_and(|(allocated, _, _, pending)| allocated == 3 && pending == 2),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_claimed_by_two_queues_is_a_conflict_on_both_and_admits_nothing() {
    let cluster = start("operator_conflict", None).await;
    let client = cluster.client();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let _operator = Operator::start(&cluster, Options::new("only", webhook_port)).await;

    let shared = cluster.namespace("shared").await.unwrap();
    apply_queue(&client, &queue_yaml("alpha", &[shared.name()], 4, 0)).await;
    apply_queue(&client, &queue_yaml("beta", &[shared.name()], 4, 0)).await;
    for queue in ["alpha", "beta"] {
        let found = queue_status(&client, queue, "NamespaceConflict=True", |q| {
            condition(q, conditions::types::NAMESPACE_CONFLICT)
                == Some((
                    "True".into(),
                    conditions::reasons::NAMESPACE_CONFLICT.into(),
                ))
        })
        .await;
        let message = &found.status.unwrap().conditions;
        let conflict = message
            .iter()
            .find(|c| c.type_ == conditions::types::NAMESPACE_CONFLICT)
            .unwrap();
        assert!(
            conflict.message.contains(shared.name()),
            "{}",
            conflict.message
        );
    }
    // Its pods are gated by the webhook and wait, saying why.
    let pods: Api<Pod> = Api::namespaced(client.clone(), shared.name());
    create(&pods, &gpu_pod("stuck", NVIDIA_GPU, 1)).await;
    let reason = waiting_reason(&pods, "stuck").await;
    assert!(
        reason.starts_with("NamespaceConflict: namespace"),
        "{reason}"
    );
    assert!(
        reason.contains("alpha") && reason.contains("beta"),
        "{reason}"
    );
    let message = event(&client, shared.name(), "stuck", "NamespaceConflict").await;
    assert!(message.contains("alpha, beta"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gitops_apply_of_the_spec_is_never_fought_or_reverted() {
    let cluster = start("operator_gitops", None).await;
    let client = cluster.client();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let _operator = Operator::start(&cluster, Options::new("only", webhook_port)).await;

    let team = cluster.namespace("team").await.unwrap();
    let queues: Api<GpuQueue> = Api::all(client.clone());
    let argo = PatchParams::apply("argocd-controller");
    let spec = |guaranteed: u32, lending: Option<u32>| {
        let mut resource =
            json!({"name": "nvidia.com/gpu", "guaranteed": guaranteed, "burstable": 4});
        if let Some(lending) = lending {
            resource["lendingLimit"] = json!(lending);
        }
        json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "team"},
            "spec": {"namespaces": [team.name()], "resources": [resource]},
        })
    };
    queues
        .patch("team", &argo, &Patch::Apply(spec(8, None)))
        .await
        .unwrap();
    queue_status(&client, "team", "status written for generation 1", |q| {
        q.status.as_ref().and_then(|s| s.observed_generation) == Some(1)
    })
    .await;

    // The same manifest again, without force: no conflict, nothing changes.
    let again = queues
        .patch("team", &argo, &Patch::Apply(spec(8, None)))
        .await
        .unwrap();
    assert_eq!(again.metadata.generation, Some(1));

    // The operator owns status and nothing else.
    let managers = again.metadata.managed_fields.unwrap();
    let ours: Vec<_> = managers
        .iter()
        .filter(|m| m.manager.as_deref() == Some(gpuqueue_api::FIELD_MANAGER))
        .collect();
    assert!(!ours.is_empty());
    for entry in &ours {
        assert_eq!(entry.subresource.as_deref(), Some("status"), "{entry:?}");
        let fields = serde_json::to_string(&entry.fields_v1).unwrap();
        assert!(!fields.contains("f:spec"), "{fields}");
    }

    // A quota edit through Git: the operator follows it, says so, and keeps the spec as applied.
    queues
        .patch("team", &argo, &Patch::Apply(spec(12, None)))
        .await
        .unwrap();
    queue_status(&client, "team", "guaranteed 12 for generation 2", |q| {
        let status = q.status.as_ref();
        status.and_then(|s| s.observed_generation) == Some(2)
            && status
                .and_then(|s| s.resources.first())
                .map(|r| r.guaranteed)
                == Some(12)
    })
    .await;
    let message = event(&client, "default", "team", "QuotaChanged").await;
    assert!(message.contains("guaranteed 8 → 12"), "{message}");
    let stored = queues.get("team").await.unwrap();
    assert_eq!(stored.spec.resources[0].guaranteed, 12);
    assert_eq!(stored.spec.resources[0].burstable, 4);

    // An invalid edit is refused by the API server, naming the field; status is untouched.
    let refused = queues
        .patch("team", &argo, &Patch::Apply(spec(12, Some(20))))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("lendingLimit"), "{refused}");
    let after = queues.get("team").await.unwrap();
    assert_eq!(after.metadata.generation, Some(2));

    // Git applies once more, without force, after all of the operator's writes: still no conflict.
    queues
        .patch("team", &argo, &Patch::Apply(spec(12, None)))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_admits_nothing_twice_and_loses_nothing() {
    let cluster = start("operator_restart", None).await;
    let client = cluster.client();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let mut operator = Operator::start(&cluster, Options::new("restarting", webhook_port)).await;

    let team = cluster.namespace("team").await.unwrap();
    apply_queue(&client, &queue_yaml("team", &[team.name()], 8, 0)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), team.name());
    for i in 0..4 {
        create(
            &pods,
            &gated(gpu_pod(&format!("before-{i}"), NVIDIA_GPU, 1)),
        )
        .await;
    }
    let mut admitted_at = BTreeMap::new();
    for i in 0..4 {
        let pod = bound(&pods, &format!("before-{i}")).await;
        admitted_at.insert(
            pod.metadata.name.clone().unwrap(),
            annotation(&pod, annotations::ADMITTED_AT)
                .unwrap()
                .to_owned(),
        );
    }

    // Events are published in the background and a kill loses the queued ones: the
    // admissions to check are those announced before it.
    for name in admitted_at.keys() {
        event(&client, team.name(), name, "Admitted").await;
    }

    // Killed without warning; meanwhile more pods arrive, gated by hand.
    operator.process.kill();
    for i in 0..3 {
        create(
            &pods,
            &gated(gpu_pod(&format!("during-{i}"), NVIDIA_GPU, 1)),
        )
        .await;
    }
    let operator = Operator::start(&cluster, Options::new("restarting", webhook_port)).await;
    for i in 0..3 {
        bound(&pods, &format!("during-{i}")).await;
    }
    queue_status(&client, "team", "7 allocated", |q| {
        numbers(q) == Some((7, 0, 0, 0))
    })
    .await;

    // The pods admitted before the restart were not admitted again, and each admission was
    // announced once.
    for (name, at) in &admitted_at {
        let pod = pods.get(name).await.unwrap();
        assert_eq!(
            annotation(&pod, annotations::ADMITTED_AT),
            Some(at.as_str()),
            "{name}"
        );
        let admitted = events(&client, team.name(), name, "Admitted").await;
        assert_eq!(admitted.len(), 1, "{name}: {admitted:?}");
        assert!(
            admitted[0].count.unwrap_or(1) <= 1,
            "{name}: announced more than once"
        );
    }
    let restarted = operator.metrics().await;
    assert!(
        restarted.contains(
            r#"gpuqueue_admission_decisions_total{queue="team",outcome="admitted_guaranteed"} 3"#
        ),
        "{restarted}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_when_the_leader_stops_and_never_acts_before() {
    let cluster = start("operator_failover", None).await;
    let client = cluster.client();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let first = Operator::start(&cluster, Options::new("first", webhook_port)).await;
    // The second replica serves its webhook elsewhere; only leadership matters here.
    let second = Operator::start(&cluster, Options::new("second", free_port())).await;

    let (mut leader, standby) = wait_for("exactly one leader", DEFAULT_TIMEOUT, || async {
        match (first.is_leader().await, second.is_leader().await) {
            (true, false) => Ok(true),
            (false, true) => Ok(false),
            both => Err(format!("leader flags {both:?}")),
        }
    })
    .await
    .map(|first_leads| {
        if first_leads {
            (first, second)
        } else {
            (second, first)
        }
    })
    .unwrap();

    let team = cluster.namespace("team").await.unwrap();
    apply_queue(&client, &queue_yaml("team", &[team.name()], 8, 0)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), team.name());
    for i in 0..2 {
        create(&pods, &gated(gpu_pod(&format!("early-{i}"), NVIDIA_GPU, 1))).await;
        bound(&pods, &format!("early-{i}")).await;
    }
    let admitted_by = |name: String| {
        let client = client.clone();
        let namespace = team.name().to_owned();
        async move {
            // Events are published in the background after the gate is released: wait for it.
            let found = wait_for("the Admitted event", DEFAULT_TIMEOUT, || async {
                let found = events(&client, &namespace, &name, "Admitted").await;
                if found.is_empty() {
                    Err(format!("{name}: no Admitted event yet"))
                } else {
                    Ok(found)
                }
            })
            .await
            .unwrap();
            assert_eq!(found.len(), 1, "{name}: {found:?}");
            found[0].reporting_instance.clone().unwrap_or_default()
        }
    };
    assert_eq!(admitted_by("early-0".into()).await, leader.identity);
    let idle = standby.metrics().await;
    assert!(
        !idle.contains("gpuqueue_admission_decisions_total{"),
        "the standby decided:\n{idle}"
    );
    assert!(!standby.is_leader().await);

    // The leader dies without releasing its lease; the standby takes over once it expires.
    leader.process.kill();
    for i in 0..2 {
        create(&pods, &gated(gpu_pod(&format!("late-{i}"), NVIDIA_GPU, 1))).await;
    }
    for i in 0..2 {
        bound(&pods, &format!("late-{i}")).await;
        assert_eq!(admitted_by(format!("late-{i}")).await, standby.identity);
    }
    assert!(standby.is_leader().await);
    // Nothing admitted before the failover was admitted again.
    for i in 0..2 {
        admitted_by(format!("early-{i}")).await;
    }
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        client.clone(),
        OPERATOR_NAMESPACE,
    )
    .get("gpuqueue-operator")
    .await
    .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some(standby.identity.as_str())
    );
}

/// A rolling update stops a replica with SIGTERM. It hands its lease on at once, but answers
/// the webhook through its drain, not ready: the API server learns that it left the Service
/// only a moment later, and a call that found the port closed would create its pod ungated
/// (`failurePolicy: Ignore`). Here the webhook configuration names the stopping replica only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_replica_hands_on_its_lease_and_gates_pods_through_its_drain() {
    let cluster = start("operator_drain", None).await;
    let client = cluster.client();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let mut options = Options::new("stopping", webhook_port);
    options.args.push("--webhook-drain=20s".to_owned());
    let mut stopping = Operator::start(&cluster, options).await;
    stopping.wait_leading().await;
    let successor = Operator::start(&cluster, Options::new("successor", free_port())).await;
    let team = cluster.namespace("team").await.unwrap();
    apply_queue(&client, &queue_yaml("team", &[team.name()], 8, 0)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), team.name());

    stopping.process.stop().unwrap();
    successor.wait_leading().await;
    let readyz = reqwest::get(format!("http://{}/readyz", stopping.metrics))
        .await
        .unwrap();
    assert_eq!(readyz.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(readyz.text().await.unwrap(), "not ready: stopping\n");

    // Created while the stopping replica drains: its webhook gates the pod (it no longer
    // leads, so it admits nothing at creation), and the successor admits it.
    let created = pods
        .create(
            &PostParams::default(),
            &gpu_pod("during-drain", NVIDIA_GPU, 1),
        )
        .await
        .unwrap();
    assert!(is_gated(&created), "{}", describe_pod(&created));
    bound(&pods, "during-drain").await;

    let exit = stopping
        .process
        .terminate(Duration::from_secs(90))
        .await
        .unwrap();
    assert!(exit.success(), "{exit}");
}

/// README's install: its image step, as README writes it (`cd config && kustomize edit set
/// image …`, which edits kustomization.yaml in place; in a copy of the checkout's `config/`,
/// with the kustomize CLI v5 from the Go module proxy), then exactly its install command with
/// the kubectl (and built-in kustomize) of v1.36. Returns the image the edit set.
fn install_with_readmes_image(cluster: &ControlPlane) -> String {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let edit = readme
        .lines()
        .find(|line| line.starts_with("cd config && kustomize edit set image "))
        .expect("README.md has no `cd config && kustomize edit set image` line");
    let (_, image) = edit.rsplit_once('=').unwrap();
    let image = image.split_whitespace().next().unwrap().to_owned();
    let checkout = cluster.run_dir().join("checkout");
    std::fs::create_dir_all(&checkout).unwrap();
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(repo_root().join("config"))
        .arg(&checkout)
        .status()
        .unwrap();
    assert!(copied.success(), "cp -a config: {copied}");
    let edited = cluster
        .command("bash")
        .args(["-c", edit])
        .current_dir(&checkout)
        .output()
        .unwrap();
    assert!(
        edited.status.success(),
        "{edit}: {}",
        String::from_utf8_lossy(&edited.stderr)
    );
    let applied = cluster
        .kubectl()
        .args(["apply", "--server-side", "-k"])
        .arg(checkout.join("config"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&applied.stderr);
    assert!(
        applied.status.success(),
        "kubectl apply -k config/: {stderr}"
    );
    assert!(!stderr.contains("PodSecurity"), "{stderr}");
    image
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_install_manifests_apply_with_kustomize_and_run_under_pod_security_restricted() {
    let cluster = start("operator_install", None).await;
    let client = cluster.client();

    let image = install_with_readmes_image(&cluster);
    // The opt-in NetworkPolicy is valid too (KWOK enforces none; a CNI would).
    let network_policy = cluster
        .kubectl()
        .args(["apply", "--server-side", "-k"])
        .arg(repo_root().join("config/network-policy"))
        .output()
        .unwrap();
    assert!(
        network_policy.status.success(),
        "kubectl apply -k config/network-policy: {}",
        String::from_utf8_lossy(&network_policy.stderr)
    );

    // The ReplicaSet's pods pass Pod Security `restricted` (enforced by the namespace) and run.
    let pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    wait_for(
        "both operator replicas to be created and running",
        DEFAULT_TIMEOUT,
        || async {
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/name=gpuqueue-operator"))
                .await
                .map_err(|e| e.to_string())?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            let images: Vec<_> = list
                .items
                .iter()
                .flat_map(|p| &p.spec.as_ref().unwrap().containers)
                .filter_map(|c| c.image.as_deref())
                .collect();
            // The image the README's edit set, not the one config/ ships.
            assert!(images.iter().all(|i| *i == image), "{images:?}");
            if running == 2 {
                Ok(())
            } else {
                Err(format!("{running} of {} pods running", list.items.len()))
            }
        },
    )
    .await
    .unwrap();

    // The README's next commands: the rollout, then the example queues.
    let kubectl = |args: &[&str]| {
        let out = cluster.kubectl().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "kubectl {}: {stderr}", args.join(" "));
        String::from_utf8(out.stdout).unwrap()
    };
    let rollout = kubectl(&[
        "-n",
        OPERATOR_NAMESPACE,
        "rollout",
        "status",
        "deploy/gpuqueue-operator",
        "--timeout=120s",
    ]);
    assert!(rollout.contains("successfully rolled out"), "{rollout}");
    let example = repo_root().join("examples/two-tenants.yaml");
    kubectl(&["apply", "--server-side", "-f", example.to_str().unwrap()]);
    let queues = kubectl(&["get", "gq"]);
    for queue in ["online", "batch"] {
        assert!(queues.lines().any(|l| l.starts_with(queue)), "{queues}");
    }

    // The check is real: a pod that asks for root is refused in that namespace.
    let privileged: Pod = serde_json::from_value(json!({
        "metadata": {"name": "root"},
        "spec": {"containers": [{"name": "root", "image": "busybox",
            "securityContext": {"runAsUser": 0, "privileged": true}}]},
    }))
    .unwrap();
    let refused = pods
        .create(&PostParams::default(), &privileged)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("violates PodSecurity"), "{refused}");

    // The webhook configuration calls the Service the manifests created.
    let webhook = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get("gpuqueue-operator")
        .await
        .unwrap();
    let service = webhook.webhooks.unwrap()[0]
        .client_config
        .service
        .clone()
        .unwrap();
    Api::<Service>::namespaced(client.clone(), &service.namespace)
        .get(&service.name)
        .await
        .unwrap();
}
