#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! What a tenant holding the stock `edit` role in its namespace can no longer do to the
//! quotas (issue 13, cases 1, 2, 3, 5, 7, 10, 13): every write goes through the real API
//! server, with the webhook and the ValidatingAdmissionPolicies of `config/` installed and
//! the operator running as its ServiceAccount. Each refusal is checked for its message, which
//! names the rule and what to do instead.

mod common;

use std::collections::BTreeMap;

use common::{
    Operator, Options, annotation, apply_queue, bound, create, free_port, gated, install, is_gated,
    queue_yaml, waiting_reason,
};
use gpuqueue_api::{NVIDIA_GPU, annotations};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, UserAccess, apply_yaml, gpu_pod,
    wait_for,
};
use k8s_openapi::api::{
    authorization::v1::SelfSubjectRulesReview,
    core::v1::{Namespace, Pod},
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The words every refusal of a forged `gpuqueue.io/*` annotation ends with.
const LEAVE_ANNOTATIONS: &str =
    "leave every gpuqueue.io/* annotation but gpuqueue.io/checkpoint-cost as it is";

/// A cluster with one 8-GPU node, `config/` installed and the operator running; a namespace
/// `team` that queue `team` claims (`guaranteed` GPUs, nothing burstable), and its tenant.
struct World {
    cluster: ControlPlane,
    operator: Option<Operator>,
    namespace: gpuqueue_e2e::TempNamespace,
    tenant: UserAccess,
}

impl World {
    async fn start(name: &str, guaranteed: u32) -> Self {
        let cluster = ControlPlane::start(
            ControlPlaneConfig::new(name).with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", 8)]),
        )
        .await
        .unwrap();
        eprintln!("{name}: control plane up ({})", cluster.startup_summary());
        let webhook_port = free_port();
        install(&cluster, webhook_port).await;
        let operator = Operator::start(&cluster, Options::new("only", webhook_port)).await;
        let namespace = cluster.namespace("team").await.unwrap();
        apply_queue(
            &cluster.client(),
            &queue_yaml("team", &[namespace.name()], guaranteed, 0),
        )
        .await;
        let tenant = cluster.tenant_with_edit(namespace.name()).await.unwrap();
        Self {
            cluster,
            operator: Some(operator),
            namespace,
            tenant,
        }
    }

    /// The tenant's pods.
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.tenant.client.clone(), self.namespace.name())
    }

    /// Stops the operator: its webhook no longer answers (failure policy Ignore).
    fn stop_operator(&mut self) {
        drop(self.operator.take());
    }
}

/// The API server's message refusing a write.
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("the write was not refused: {other:?}"),
    }
}

/// Creates `pod` as `pods`' client and returns the refusal's message, once the API server
/// refuses it: a dry run is retried until then (the policy reads new GpuQueues, and the
/// operator its stores, a moment after they change), so the real creation is never a race.
async fn refused_creation(pods: &Api<Pod>, pod: &Pod, expected: &str) -> String {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_for(
        format!("the creation to be refused with {expected:?}"),
        DEFAULT_TIMEOUT,
        || async {
            match pods.create(&dry_run, pod).await {
                Err(kube::Error::Api(status)) if status.message.contains(expected) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    let message = refusal(pods.create(&PostParams::default(), pod).await);
    assert!(message.contains(expected), "{message}");
    message
}

/// A merge patch of the pod as the tenant.
async fn patch(pods: &Api<Pod>, name: &str, patch: serde_json::Value) -> Result<Pod, kube::Error> {
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// A GPU pod bound at creation to the only node.
fn bound_at_creation(name: &str) -> Pod {
    let mut pod = gpu_pod(name, NVIDIA_GPU, 1);
    pod.spec.as_mut().unwrap().node_name = Some("gpu-node-0".into());
    pod
}

/// A pod whose container uses a DRA claim from the tenant's template `one-gpu`.
fn with_resource_claim(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{
                "name": "main",
                "image": "registry.invalid/gpuqueue-e2e/fake:1",
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        },
    }))
    .unwrap()
}

/// The ResourceClaimTemplate a tenant writes for one GPU through DRA (`edit` may create it).
const CLAIM_TEMPLATE: &str = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata:\n  name: one-gpu\nspec:\n  spec:\n    devices:\n      requests:\n        - name: gpu\n          exactly:\n            deviceClassName: gpu.nvidia.com\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_release_its_pods_gate() {
    // Case 2: a queue without room, so the pod waits at the gate.
    let world = World::start("tenant_gate", 0).await;
    let pods = world.pods();
    create(&pods, &gpu_pod("waiting", NVIDIA_GPU, 1)).await;
    let reason = waiting_reason(&pods, "waiting").await;
    assert!(reason.starts_with("OverCeiling: queue team"), "{reason}");

    for removal in [
        json!({"spec": {"schedulingGates": []}}),
        json!({"spec": {"schedulingGates": null}}),
    ] {
        let message = refusal(patch(&pods, "waiting", removal).await);
        assert!(
            message.contains(
                "gpuqueue: the scheduling gate gpuqueue.io/admission is released only by the \
                 gpuqueue operator, when the pod's GpuQueue admits it; keep the gate, or delete \
                 the pod and create it again."
            ),
            "{message}"
        );
    }
    // A JSON patch, and a PUT of the whole pod, are refused alike.
    let ungate: Patch<serde_json::Value> = Patch::Json(
        serde_json::from_value(json!([{"op": "remove", "path": "/spec/schedulingGates/0"}]))
            .unwrap(),
    );
    let message = refusal(
        pods.patch("waiting", &PatchParams::default(), &ungate)
            .await,
    );
    assert!(message.contains("gpuqueue.io/admission"), "{message}");
    let mut replaced = pods.get("waiting").await.unwrap();
    replaced.spec.as_mut().unwrap().scheduling_gates = None;
    let message = refusal(
        pods.replace("waiting", &PostParams::default(), &replaced)
            .await,
    );
    assert!(message.contains("gpuqueue.io/admission"), "{message}");
    assert!(is_gated(&pods.get("waiting").await.unwrap()));

    // Deleting and recreating, what the message says to do instead, is allowed.
    pods.delete("waiting", &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_bind_a_gpu_pod_at_creation_even_while_the_operator_is_down() {
    // Case 3.
    let mut world = World::start("tenant_node_name", 8).await;
    let pods = world.pods();
    let expected = format!(
        "gpuqueue: spec.nodeName is refused for a GPU pod in namespace {}, which GpuQueue team \
         claims: a pod bound at creation skips the queue's admission. Leave spec.nodeName unset \
         (choose nodes with a nodeSelector or node affinity); the queue admits the pod and \
         kube-scheduler binds it.",
        world.namespace.name()
    );
    // The webhook refuses it first.
    let message = refused_creation(&pods, &bound_at_creation("pinned"), &expected).await;
    assert!(message.contains("admission webhook"), "{message}");

    // With no operator answering, the API server's own policy refuses it.
    world.stop_operator();
    let message = refused_creation(&pods, &bound_at_creation("pinned"), &expected).await;
    assert!(
        message.contains("ValidatingAdmissionPolicy 'gpuqueue-pod-creations'"),
        "{message}"
    );
    // A CPU pod bound at creation is no business of the queue's.
    let mut cpu = bound_at_creation("cpu");
    cpu.spec.as_mut().unwrap().containers[0].resources = None;
    create(&pods, &cpu).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_pod_waits_at_the_gate_and_preempts_nothing() {
    // Case 5: queue `online` is guaranteed the whole node and uses it; the tenant of queue
    // `team` (no guarantee) asks for a GPU with the highest PriorityClass there is.
    let world = World::start("tenant_priority", 0).await;
    let admin = world.cluster.client();
    let online = world.cluster.namespace("online").await.unwrap();
    apply_queue(&admin, &queue_yaml("online", &[online.name()], 8, 0)).await;
    let online_pods: Api<Pod> = Api::namespaced(admin.clone(), online.name());
    let mut guaranteed = BTreeMap::new();
    for i in 0..8 {
        let name = format!("online-{i}");
        create(&online_pods, &gpu_pod(&name, NVIDIA_GPU, 1)).await;
        let pod = bound(&online_pods, &name).await;
        guaranteed.insert(name, pod.metadata.uid.unwrap());
    }

    let pods = world.pods();
    let mut urgent = gpu_pod("urgent", NVIDIA_GPU, 1);
    urgent.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
    create(&pods, &urgent).await;
    let reason = waiting_reason(&pods, "urgent").await;
    assert!(reason.starts_with("OverCeiling: queue team"), "{reason}");

    // What the pod spec holds: the top priority, free to preempt, but behind the gate.
    let spec = pods.get("urgent").await.unwrap().spec.unwrap();
    assert_eq!(spec.priority, Some(2_000_001_000));
    assert_eq!(
        spec.preemption_policy.as_deref(),
        Some("PreemptLowerPriority")
    );
    assert!(
        spec.scheduling_gates
            .unwrap()
            .iter()
            .any(|gate| gate.name == gpuqueue_api::ADMISSION_GATE)
    );
    // The gate cannot be removed, so kube-scheduler never sees the pod.
    let message = refusal(patch(&pods, "urgent", json!({"spec": {"schedulingGates": []}})).await);
    assert!(message.contains("gpuqueue.io/admission"), "{message}");

    // Nothing was preempted: the same 8 guaranteed pods run, none marked for disruption.
    let running = online_pods.list(&ListParams::default()).await.unwrap();
    let now: BTreeMap<String, String> = running
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            (
                p.metadata.name.clone().unwrap(),
                p.metadata.uid.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(now, guaranteed);
    for pod in &running.items {
        let disrupted = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "DisruptionTarget");
        assert!(!disrupted, "{:?}", pod.metadata.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_forge_or_change_the_operators_annotations() {
    // Cases 1, 7 and 13: reclaim intents and admission state written by the tenant.
    let world = World::start("tenant_annotations", 1).await;
    let pods = world.pods();

    // At creation, forged annotations are removed; the knob is kept, capped.
    let mut forged = gated(gpu_pod("forged", NVIDIA_GPU, 2));
    forged.metadata.annotations = Some(BTreeMap::from([
        (annotations::RECLAIM_ID.to_owned(), "forged".to_owned()),
        (annotations::RECLAIM_ROLE.to_owned(), "victim".to_owned()),
        (
            annotations::RECLAIM_DEADLINE.to_owned(),
            "2099-01-01T00:00:00Z".to_owned(),
        ),
        (
            annotations::RECLAIM_VICTIMS.to_owned(),
            r#"[{"pod": "other/victim", "uid": "x", "queue": "other"}]"#.to_owned(),
        ),
        (annotations::ADMITTED_AS.to_owned(), "guaranteed".to_owned()),
        (annotations::CHECKPOINT_COST.to_owned(), "99999".to_owned()),
        ("team.example.com/owner".to_owned(), "search".to_owned()),
    ]));
    create(&pods, &forged).await;
    // Two GPUs against a ceiling of one: it waits, and the operator says why.
    waiting_reason(&pods, "forged").await;
    let created = pods.get("forged").await.unwrap();
    let notes = created.metadata.annotations.clone().unwrap();
    let ours: Vec<&String> = notes
        .keys()
        .filter(|k| k.starts_with("gpuqueue.io/"))
        .collect();
    assert_eq!(
        ours,
        [annotations::CHECKPOINT_COST, annotations::WAITING_REASON],
        "{notes:?}"
    );
    assert_eq!(notes[annotations::CHECKPOINT_COST], "1000");
    assert_eq!(notes["team.example.com/owner"], "search");

    // On update: adding, changing or removing any of them is refused, naming the annotation.
    let attempts = [
        (
            json!({"metadata": {"annotations": {annotations::RECLAIM_ID: "forged"}}}),
            annotations::RECLAIM_ID,
        ),
        (
            json!({"metadata": {"annotations": {annotations::RECLAIM_ROLE: "victim", annotations::RECLAIM_DEADLINE: "2099-01-01T00:00:00Z"}}}),
            "gpuqueue.io/reclaim-", // either of the two
        ),
        (
            json!({"metadata": {"annotations": {annotations::WAITING_REASON: "edited"}}}),
            annotations::WAITING_REASON,
        ),
        (
            json!({"metadata": {"annotations": {annotations::WAITING_REASON: null}}}),
            annotations::WAITING_REASON,
        ),
    ];
    for (change, key) in attempts {
        let message = refusal(patch(&pods, "forged", change).await);
        assert!(
            message.contains(&format!("gpuqueue: annotation {key}"))
                && message.contains("is written only by the gpuqueue operator")
                && message.contains(LEAVE_ANNOTATIONS),
            "{message}"
        );
    }
    // The knob stays the tenant's, within its documented range.
    let lowered = json!({"metadata": {"annotations": {annotations::CHECKPOINT_COST: "50"}}});
    patch(&pods, "forged", lowered).await.unwrap();
    let raised = json!({"metadata": {"annotations": {annotations::CHECKPOINT_COST: "5000"}}});
    let message = refusal(patch(&pods, "forged", raised).await);
    assert!(
        message.contains(
            "gpuqueue: annotation gpuqueue.io/checkpoint-cost must be a whole number from 0 to \
             1000, not \"5000\""
        ),
        "{message}"
    );
    // Other annotations are the tenant's to change.
    let own = json!({"metadata": {"annotations": {"team.example.com/owner": "ads"}}});
    patch(&pods, "forged", own).await.unwrap();

    // An admitted pod's admission record is as closed: the pod admitted at creation.
    create(&pods, &gpu_pod("admitted", NVIDIA_GPU, 1)).await;
    let admitted = bound(&pods, "admitted").await;
    assert_eq!(annotation(&admitted, annotations::QUEUE), Some("team"));
    for change in [
        json!({"metadata": {"annotations": {annotations::QUEUE: "other"}}}),
        json!({"metadata": {"annotations": {annotations::ADMITTED_AS: null}}}),
    ] {
        let message = refusal(patch(&pods, "admitted", change).await);
        assert!(message.contains(LEAVE_ANNOTATIONS), "{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_take_gpus_through_dra_claims_in_a_claimed_namespace() {
    // Case 10 (issue 17): `edit` may create ResourceClaimTemplates; their pods wait at the gate
    // until their claims are counted, and are refused without it (the webhook down).
    let mut world = World::start("tenant_dra", 8).await;
    apply_yaml(
        &world.tenant.client,
        CLAIM_TEMPLATE,
        Some(world.namespace.name()),
    )
    .await
    .unwrap();
    let pods = world.pods();
    // No extended resource at all: the webhook is sent the pod for its claims, and gates it.
    create(&pods, &with_resource_claim("dra")).await;
    assert!(is_gated(&pods.get("dra").await.unwrap()));
    // Nor through the claim kube-scheduler makes for a class asked for by its implicit name.
    let by_class = |name| gpu_pod(name, "deviceclass.resource.kubernetes.io/gpu.nvidia.com", 8);
    create(&pods, &by_class("by-class")).await;
    assert!(is_gated(&pods.get("by-class").await.unwrap()));
    world.stop_operator();
    let expected = format!(
        "gpuqueue: a pod with spec.resourceClaims in namespace {}, which GpuQueue team claims, \
         must wait at the scheduling gate gpuqueue.io/admission until its claims are counted, \
         and the gpuqueue webhook that adds the gate did not answer. Retry when the operator is \
         up, or add the gate (spec.schedulingGates: [{{name: gpuqueue.io/admission}}]) yourself.",
        world.namespace.name()
    );
    let message = refused_creation(&pods, &with_resource_claim("dra-2"), &expected).await;
    assert!(
        message.contains("ValidatingAdmissionPolicy 'gpuqueue-pod-creations'"),
        "{message}"
    );
    let expected = format!(
        "gpuqueue: a pod asking for devices by a deviceclass.resource.kubernetes.io/ name in \
         namespace {}, which GpuQueue team claims, must wait at the scheduling gate \
         gpuqueue.io/admission until its devices are counted, and the gpuqueue webhook that \
         adds the gate did not answer. Retry when the operator is up, or add the gate \
         (spec.schedulingGates: [{{name: gpuqueue.io/admission}}]) yourself.",
        world.namespace.name()
    );
    refused_creation(&pods, &by_class("by-class-2"), &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_an_unclaimed_namespace_are_created_as_written() {
    let world = World::start("tenant_unclaimed", 8).await;
    let elsewhere = world.cluster.namespace("elsewhere").await.unwrap();
    let tenant = world
        .cluster
        .tenant_with_edit(elsewhere.name())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(tenant.client.clone(), elsewhere.name());

    // Bound at creation, annotated with our keys, or with a DRA claim: no queue counts them,
    // so nothing refuses or changes them.
    let mut pinned = bound_at_creation("pinned");
    pinned.metadata.annotations = Some(BTreeMap::from([(
        annotations::RECLAIM_ID.to_owned(),
        "theirs".to_owned(),
    )]));
    create(&pods, &pinned).await;
    let pinned = bound(&pods, "pinned").await;
    assert_eq!(annotation(&pinned, annotations::RECLAIM_ID), Some("theirs"));
    assert!(!is_gated(&pinned));
    create(&pods, &gpu_pod("plain", NVIDIA_GPU, 1)).await;
    let plain = bound(&pods, "plain").await;
    assert!(!is_gated(&plain) && annotation(&plain, annotations::QUEUE).is_none());
    apply_yaml(&tenant.client, CLAIM_TEMPLATE, Some(elsewhere.name()))
        .await
        .unwrap();
    create(&pods, &with_resource_claim("dra")).await;

    // Updates are refused everywhere alike (a claim may come at any time, and the operator's
    // state must not be forged before it does).
    let message = refusal(
        patch(
            &pods,
            "plain",
            json!({"metadata": {"annotations": {annotations::RECLAIM_ID: "forged"}}}),
        )
        .await,
    );
    assert!(message.contains(LEAVE_ANNOTATIONS), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edit_writes_no_pod_subresource_that_could_carry_the_gate_or_annotations() {
    // The update policy matches `pods` only; this is why that is enough.
    let world = World::start("tenant_subresources", 0).await;
    let review: SelfSubjectRulesReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": world.namespace.name()},
    }))
    .unwrap();
    let reviews: Api<SelfSubjectRulesReview> = Api::all(world.tenant.client.clone());
    let rules = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
        .resource_rules;
    let writes = ["create", "update", "patch", "*"];
    let mut written: Vec<String> = rules
        .iter()
        .filter(|rule| {
            rule.api_groups
                .as_ref()
                .is_some_and(|g| g.iter().any(String::is_empty))
        })
        .filter(|rule| rule.verbs.iter().any(|v| writes.contains(&v.as_str())))
        .flat_map(|rule| rule.resources.clone().unwrap_or_default())
        .filter(|resource| resource.starts_with("pods/"))
        .collect();
    written.sort();
    written.dedup();
    assert_eq!(
        written,
        [
            "pods/attach",
            "pods/eviction",
            "pods/exec",
            "pods/portforward",
            "pods/proxy"
        ],
        "a new pod subresource is writable with `edit`: check whether it can change the gate \
         or annotations, and match it in config/policy/pod_updates.yaml"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_decides_claims_by_namespace_selector_as_the_operator_does() {
    // Queue `labs` claims by labels only; the policy alone (no operator) must read them.
    let mut world = World::start("tenant_selector", 8).await;
    world.stop_operator();
    let admin = world.cluster.client();
    apply_queue(
        &admin,
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: labs\nspec:\n  namespaceSelector:\n    matchLabels: {team: labs}\n    matchExpressions:\n      - {key: tier, operator: In, values: [research]}\n      - {key: frozen, operator: DoesNotExist}\n  resources:\n    - {name: nvidia.com/gpu, guaranteed: 2, burstable: 0}\n",
    )
    .await;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let labelled = |labels: serde_json::Value| {
        let namespaces = namespaces.clone();
        let cluster = &world.cluster;
        async move {
            let namespace = cluster.namespace("lab").await.unwrap();
            namespaces
                .patch(
                    namespace.name(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": labels}})),
                )
                .await
                .unwrap();
            namespace
        }
    };
    let claimed = labelled(json!({"team": "labs", "tier": "research"})).await;
    let frozen = labelled(json!({"team": "labs", "tier": "research", "frozen": "yes"})).await;
    let other_tier = labelled(json!({"team": "labs", "tier": "prod"})).await;

    let in_claimed: Api<Pod> = Api::namespaced(admin.clone(), claimed.name());
    refused_creation(
        &in_claimed,
        &bound_at_creation("pinned"),
        &format!(
            "spec.nodeName is refused for a GPU pod in namespace {}, which GpuQueue labs claims",
            claimed.name()
        ),
    )
    .await;
    // The queue is loaded (it refused above); namespaces it does not select are free.
    for namespace in [&frozen, &other_tier] {
        let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace.name());
        create(&pods, &bound_at_creation("pinned")).await;
    }
}
