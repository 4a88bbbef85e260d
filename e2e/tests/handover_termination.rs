#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! A handover on nodes that honour the grace period (`NodeBehaviour::Kubelet`, the default):
//! the victim ignores SIGTERM, so it takes its whole grace period to terminate. The owner is
//! bound after its containers have ended (its phase terminal: kube-scheduler and the device
//! manager free its GPUs then, before its object goes), never before, and no other pod that
//! wants the GPUs meanwhile (a borrower of a third queue, a new pod of the victim's queue) gets
//! them. The order comes from one watch of every pod (the API server's order of changes), not
//! from timings.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use common::{
    Operator, Options, all_running, annotation, apply_queue, bound, create, event, free_port,
    install, is_gated, queue_status, waiting_reason,
};
use futures::StreamExt;
use gpuqueue_api::{NVIDIA_GPU, annotations, v1alpha1::HandoverRecord};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, IGNORES_SIGTERM_ANNOTATION,
    apply_yaml, gpu_pod, has_finished, node_of, pod_condition, wait_for,
};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{Pod, PodSchedulingGate};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

/// The victims' grace period: long enough that binding the owner early would be seen.
const VICTIM_GRACE_SECONDS: u32 = 3;

/// What the watch saw, in the API server's order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    /// The pod `namespace/name` got a deletion timestamp.
    Terminating(String),
    /// The pod's containers ended: its phase turned `Succeeded` or `Failed`.
    Finished(String),
    /// The pod was removed.
    Gone(String),
    /// The pod was bound to a node.
    Bound(String),
    /// The pod was marked `DisruptionTarget`.
    Disrupted(String),
}

/// Every pod change of the cluster that matters here, in order, while the test runs (the
/// watch stops when this is dropped, before the control plane goes).
struct Changes {
    log: Arc<Mutex<Vec<Change>>>,
    watch: tokio::task::JoinHandle<()>,
}

impl Drop for Changes {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Changes {
    fn watch(client: Client) -> Self {
        let log = Arc::new(Mutex::new(Vec::new()));
        let changes = log.clone();
        let watch = tokio::spawn(async move {
            let pods: Api<Pod> = Api::all(client);
            let mut events = watcher(pods, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let mut log = changes.lock().unwrap();
                match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                        let key = key(&pod);
                        let bound = node_of(&pod);
                        for change in [
                            bound.map(|_| Change::Bound(key.clone())),
                            pod.metadata
                                .deletion_timestamp
                                .as_ref()
                                .map(|_| Change::Terminating(key.clone())),
                            disrupted(&pod).then(|| Change::Disrupted(key.clone())),
                            has_finished(&pod).then(|| Change::Finished(key.clone())),
                        ]
                        .into_iter()
                        .flatten()
                        {
                            if !log.contains(&change) {
                                log.push(change);
                            }
                        }
                    }
                    Ok(watcher::Event::Delete(pod)) => log.push(Change::Gone(key(&pod))),
                    Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => {}
                }
            }
        });
        Self { log, watch }
    }

    /// The first pod of `namespace` the watch saw marked `DisruptionTarget`, once it has.
    async fn first_disrupted(&self, namespace: &str) -> String {
        self.first("a pod to be marked", namespace, |c| match c {
            Change::Disrupted(pod) => Some(pod),
            _ => None,
        })
        .await
    }

    /// The first pod of `namespace` the watch saw terminating, once it has.
    async fn first_evicted(&self, namespace: &str) -> String {
        self.first("a pod to be evicted", namespace, |c| match c {
            Change::Terminating(pod) => Some(pod),
            _ => None,
        })
        .await
    }

    /// The first pod of `namespace` that `pick` finds in a change the watch saw, once it has.
    async fn first(
        &self,
        what: &str,
        namespace: &str,
        pick: impl Fn(Change) -> Option<String>,
    ) -> String {
        wait_for(what, DEFAULT_TIMEOUT, || async {
            self.snapshot()
                .into_iter()
                .filter_map(&pick)
                .find(|pod| pod.starts_with(namespace))
                .ok_or_else(|| format!("{:?}", self.snapshot()))
        })
        .await
        .unwrap()
    }

    fn snapshot(&self) -> Vec<Change> {
        self.log.lock().unwrap().clone()
    }

    fn position(&self, change: &Change) -> Option<usize> {
        self.snapshot().iter().position(|c| c == change)
    }

    async fn wait_for(&self, change: Change) -> usize {
        wait_for(
            format!("the watch to see {change:?}"),
            DEFAULT_TIMEOUT,
            || {
                let found = self.position(&change);
                async move { found.ok_or_else(|| format!("{:?}", self.snapshot())) }
            },
        )
        .await
        .unwrap()
    }
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A one-resource GpuQueue with a 10 s budget (room for the grace period on either side).
fn queue(name: &str, namespace: &str, guaranteed: u32, burstable: u32, reclaim: &str) -> String {
    format!(
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: {name}\nspec:\n  namespaces: [{namespace}]\n  resources:\n    - {{name: nvidia.com/gpu, guaranteed: {guaranteed}, burstable: {burstable}}}\n  reclaim: {{budget: 10s, checkpoint: {{driver: none}}{reclaim}}}\n"
    )
}

/// A one-GPU borrower whose process ignores SIGTERM: a kubelet kills it when its grace ends.
fn stubborn_pod(name: &str) -> Pod {
    let mut pod = gpu_pod(name, NVIDIA_GPU, 1);
    pod.metadata.annotations = Some(
        [(IGNORES_SIGTERM_ANNOTATION.to_owned(), "true".to_owned())]
            .into_iter()
            .collect(),
    );
    pod
}

async fn owner_record(client: &Client, owner: &str) -> HandoverRecord {
    let find = |q: &gpuqueue_api::v1alpha1::GpuQueue| {
        q.status.as_ref().and_then(|s| {
            s.last_handovers
                .iter()
                .find(|r| r.role == "owner" && r.owner_pod == owner && !r.outcome.is_empty())
                .cloned()
        })
    };
    let queue = queue_status(client, "online", &format!("a record for {owner}"), |q| {
        find(q).is_some()
    })
    .await;
    find(&queue).unwrap()
}

/// One node of four GPUs and the operator.
async fn start(name: &str) -> (ControlPlane, Operator) {
    let cluster = ControlPlane::start(
        ControlPlaneConfig::new(name).with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", 4)]),
    )
    .await
    .unwrap();
    eprintln!("{name}: control plane up ({})", cluster.startup_summary());
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let operator = Operator::start(&cluster, Options::new("first", webhook_port)).await;
    (cluster, operator)
}

/// Night: queue `online` is guaranteed the node's four GPUs, and queue `batch` borrows all of
/// them with four pods that ignore SIGTERM; the borrowers' API.
async fn night(client: &Client, online: &str, batch: &str) -> Api<Pod> {
    apply_queue(client, &queue("online", online, 4, 0, "")).await;
    let grace = format!(", victimGracePeriodSeconds: {VICTIM_GRACE_SECONDS}");
    apply_queue(client, &queue("batch", batch, 0, 4, &grace)).await;
    let borrowers: Api<Pod> = Api::namespaced(client.clone(), batch);
    for i in 0..4 {
        create(&borrowers, &stubborn_pod(&format!("b-{i}"))).await;
    }
    all_running(&borrowers, 4).await;
    borrowers
}

/// Whether the pod carries `DisruptionTarget` (true).
fn disrupted(pod: &Pod) -> bool {
    pod_condition(pod, "DisruptionTarget").is_some_and(|c| c.status == "True")
}

/// The pod waits with a reason, was never admitted and the watch never saw it bound.
async fn still_waiting(pods: &Api<Pod>, name: &str, changes: &Changes) {
    let reason = waiting_reason(pods, name).await;
    let pod = pods.get(name).await.unwrap();
    assert!(node_of(&pod).is_none(), "{name} was bound ({reason})");
    assert!(
        annotation(&pod, annotations::ADMITTED_AS).is_none(),
        "{name} was admitted: {:?}",
        pod.metadata.annotations
    );
    let log = changes.snapshot();
    assert!(
        !log.contains(&Change::Bound(key(&pod))),
        "{name} was bound: {log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_is_bound_only_after_a_victim_that_uses_its_whole_grace_period_is_gone() {
    let (cluster, _operator) = start("handover_waits_for_termination").await;
    let client = cluster.client();
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    let lab = cluster.namespace("lab").await.unwrap();
    let borrowers = night(&client, online.name(), batch.name()).await;
    apply_queue(&client, &queue("lab", lab.name(), 0, 4, "")).await;
    let changes = Changes::watch(client.clone());

    // Morning: online wants one GPU back.
    let owners: Api<Pod> = Api::namespaced(client.clone(), online.name());
    create(&owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;
    let owner_key = format!("{}/owner", online.name());
    let victim = changes.first_evicted(batch.name()).await;

    // While the victim terminates, two more pods want its GPU: a borrower of a third queue,
    // and a new pod of the victim's own queue (below its ceiling again once the victim goes).
    let labs: Api<Pod> = Api::namespaced(client.clone(), lab.name());
    create(&labs, &gpu_pod("third", NVIDIA_GPU, 1)).await;
    create(&borrowers, &gpu_pod("b-new", NVIDIA_GPU, 1)).await;
    let victim_pod = borrowers
        .get(victim.rsplit('/').next().unwrap())
        .await
        .unwrap();
    assert!(
        victim_pod.metadata.deletion_timestamp.is_some(),
        "the victim is still terminating when the others arrive: {victim_pod:?}"
    );
    // No disruption budget guards it: deleted without the Eviction API, and marked as the
    // Eviction API would mark it (a Job's podFailurePolicy reads the condition).
    let disruption = pod_condition(&victim_pod, "DisruptionTarget");
    assert!(
        disruption.is_some_and(
            |c| c.status == "True" && c.reason.as_deref() == Some("PreemptionByGpuQueue")
        ),
        "{victim_pod:?}"
    );
    let deadline = victim_pod.metadata.deletion_timestamp.unwrap().0;

    let owner = bound(&owners, "owner").await;
    let finished = changes.wait_for(Change::Finished(victim.clone())).await;
    let owner_bound = changes.wait_for(Change::Bound(owner_key.clone())).await;
    assert!(
        finished < owner_bound,
        "the owner was bound while its victim still held the GPU: {:?}",
        changes.snapshot()
    );
    let scheduled = pod_condition(&owner, "PodScheduled").unwrap();
    assert!(
        scheduled.last_transition_time.as_ref().unwrap().0 >= deadline,
        "bound at {:?}, before the victim's grace period ended at {deadline}",
        scheduled.last_transition_time
    );

    let record = owner_record(&client, &owner_key).await;
    assert_eq!(record.outcome, "Completed", "{record:?}");
    assert_eq!(record.victims, std::slice::from_ref(&victim), "{record:?}");
    let at = |phase: &str| {
        record
            .phases
            .iter()
            .find(|p| p.phase == phase)
            .unwrap_or_else(|| panic!("no {phase} phase: {record:?}"))
            .at_millis
    };
    assert!(at("victimsGone") <= at("ownerBound"), "{record:?}");

    // Neither of the others got the freed GPU (nor any: the node is full again), and both
    // wait with a reason; no other borrower was evicted.
    still_waiting(&labs, "third", &changes).await;
    still_waiting(&borrowers, "b-new", &changes).await;
    let log = changes.snapshot();
    let evicted: Vec<&Change> = log
        .iter()
        .filter(|c| matches!(c, Change::Terminating(_)))
        .collect();
    assert_eq!(evicted, [&Change::Terminating(victim)], "{log:?}");
}

/// Waits until a policy just applied is in force: `write` (given the number of its try) is
/// refused; the API server's message.
async fn policy_refusal<F, Fut>(write: F) -> String
where
    F: Fn(u32) -> Fut,
    Fut: Future<Output = kube::Result<Pod>>,
{
    let tries = AtomicU32::new(0);
    wait_for("the policy to refuse", DEFAULT_TIMEOUT, || async {
        match write(tries.fetch_add(1, Ordering::Relaxed)).await {
            Err(kube::Error::Api(status)) => Ok(status.message),
            Ok(_) => Err("written".to_owned()),
            Err(other) => Err(other.to_string()),
        }
    })
    .await
    .unwrap()
}

/// A cluster policy that refuses any `pods/status` write changing a pod's annotations, as a
/// cluster that guards annotations by policy may have.
const STATUS_KEEPS_ANNOTATIONS: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: status-keeps-annotations
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: [v1]
        operations: [UPDATE]
        resources: [pods/status]
  validations:
    - expression: >-
        has(object.metadata.annotations) == has(oldObject.metadata.annotations) &&
        (!has(object.metadata.annotations) ||
         object.metadata.annotations == oldObject.metadata.annotations)
      message: pods/status may not change annotations
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: status-keeps-annotations
spec:
  policyName: status-keeps-annotations
  validationActions: [Deny]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_victim_whose_status_may_not_change_annotations_is_still_marked_and_handed_over() {
    // The operator writes a victim's intent and its DisruptionTarget mark in one pods/status
    // write. Where a policy refuses that, it writes the intent alone and marks the victim just
    // before its delete: the handover still completes, and the victim still carries the mark.
    let (cluster, _operator) = start("handover_status_policy").await;
    let client = cluster.client();
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    let borrowers = night(&client, online.name(), batch.name()).await;

    // The policy is in force: the API server refuses an annotation written through status.
    apply_yaml(&client, STATUS_KEEPS_ANNOTATIONS, None)
        .await
        .unwrap();
    // A new value each try: one written before the policy took effect must not make the next
    // try a no-op the policy lets through.
    let refused = policy_refusal(|attempt| {
        let forged =
            json!({"metadata": {"annotations": {"example.com/note": attempt.to_string()}}});
        let borrowers = borrowers.clone();
        async move {
            borrowers
                .patch_status("b-0", &PatchParams::default(), &Patch::Merge(&forged))
                .await
        }
    })
    .await;
    assert!(
        refused.contains("pods/status may not change annotations"),
        "{refused}"
    );
    let changes = Changes::watch(client.clone());

    let owners: Api<Pod> = Api::namespaced(client.clone(), online.name());
    create(&owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;
    let owner_key = format!("{}/owner", online.name());
    let victim = changes.first_evicted(batch.name()).await;
    // Still terminating (its grace is 3 s): marked as the Eviction API would mark it.
    let victim_pod = borrowers
        .get(victim.rsplit('/').next().unwrap())
        .await
        .unwrap();
    let disruption = pod_condition(&victim_pod, "DisruptionTarget");
    assert!(
        disruption.is_some_and(
            |c| c.status == "True" && c.reason.as_deref() == Some("PreemptionByGpuQueue")
        ),
        "{victim_pod:?}"
    );
    // The intent went on through `pods`: the victim carries it.
    assert!(
        annotation(&victim_pod, annotations::RECLAIM_ID).is_some(),
        "{:?}",
        victim_pod.metadata.annotations
    );

    bound(&owners, "owner").await;
    let record = owner_record(&client, &owner_key).await;
    assert_eq!(record.outcome, "Completed", "{record:?}");
    assert_eq!(record.victims, [victim], "{record:?}");
}

/// A cluster policy that keeps the nodeSelector of every pod of namespace `namespace`: the
/// operator may not pin an owner there, so it can never reserve one.
fn keeps_node_selector(namespace: &str) -> String {
    format!(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: keeps-node-selector
spec:
  failurePolicy: Fail
  matchConstraints:
    namespaceSelector:
      matchLabels: {{kubernetes.io/metadata.name: {namespace}}}
    resourceRules:
      - apiGroups: [""]
        apiVersions: [v1]
        operations: [UPDATE]
        resources: [pods]
  validations:
    - expression: >-
        has(object.spec.nodeSelector) == has(oldObject.spec.nodeSelector) &&
        (!has(object.spec.nodeSelector) ||
         object.spec.nodeSelector == oldObject.spec.nodeSelector)
      message: pods of this namespace keep their nodeSelector
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: keeps-node-selector
spec:
  policyName: keeps-node-selector
  validationActions: [Deny]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_a_policy_may_not_pin_is_tried_again_at_the_retry_pace_and_costs_no_borrower_its_pod()
 {
    // Every try to start the reclaim marks the victims and is refused at the owner's reserve.
    // The operator tries again after its retry interval (2 s), not on the changes its own failed
    // try made (which would be every few milliseconds), tells the owner why, and evicts nobody.
    let (cluster, operator) = start("handover_owner_policy").await;
    let client = cluster.client();
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    let borrowers = night(&client, online.name(), batch.name()).await;

    apply_yaml(&client, &keeps_node_selector(online.name()), None)
        .await
        .unwrap();
    // The policy is in force: a pod held by another gate (no GPU: not ours) may not be pinned.
    let owners: Api<Pod> = Api::namespaced(client.clone(), online.name());
    let mut probe = gpu_pod("probe", "cpu", 1);
    probe.spec.as_mut().unwrap().scheduling_gates = Some(vec![PodSchedulingGate {
        name: "example.com/hold".to_owned(),
    }]);
    create(&owners, &probe).await;
    // A new key each try: only additions to a gated pod's nodeSelector are valid.
    let refused = policy_refusal(|attempt| {
        let pin =
            json!({"spec": {"nodeSelector": {format!("example.com/probe-{attempt}"): "yes"}}});
        let owners = owners.clone();
        async move {
            owners
                .patch("probe", &PatchParams::default(), &Patch::Merge(&pin))
                .await
        }
    })
    .await;
    assert!(refused.contains("keep their nodeSelector"), "{refused}");
    let changes = Changes::watch(client.clone());

    create(&owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;
    let series = r#"gpuqueue_admission_apply_errors_total{kind="pod_refused"}"#;
    let first = wait_for(
        "the owner's reserve to be refused",
        DEFAULT_TIMEOUT,
        || async {
            match operator.metric(series).await {
                Some(count) if count >= 1.0 => Ok(count),
                other => Err(format!("{series}: {other:?}")),
            }
        },
    )
    .await
    .unwrap();
    #[allow(clippy::disallowed_methods)] // the window the refusals are counted in
    let since = std::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let more = operator.metric(series).await.unwrap() - first;
    let elapsed = since.elapsed();
    // At most one try per retry interval: a slower machine only tries less often.
    let most = (elapsed.as_secs_f64() / 2.0).floor() + 1.0;
    assert!(more <= most, "{more} more refusals in {elapsed:?}");

    // The owner was told why, is still at the gate and unpinned, and no borrower was evicted.
    let why = event(&client, online.name(), "owner", "ReclaimNotStarted").await;
    assert!(why.contains("keep their nodeSelector"), "{why}");
    let owner = owners.get("owner").await.unwrap();
    assert!(is_gated(&owner), "{owner:?}");
    assert!(
        owner.spec.as_ref().unwrap().node_selector.is_none(),
        "{owner:?}"
    );
    let log = changes.snapshot();
    assert!(
        !log.iter().any(|c| matches!(c, Change::Terminating(_))),
        "{log:?}"
    );
    all_running(&borrowers, 4).await;
    // Each try marked a victim `DisruptionTarget` with its intent, and took both back: between
    // tries no borrower carries either (a mark left behind would stay for two minutes).
    changes.first_disrupted(batch.name()).await;
    wait_for(
        "no borrower to carry a reclaim's marks",
        DEFAULT_TIMEOUT,
        || async {
            let list = borrowers
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let marked: Vec<String> = list
                .items
                .iter()
                .filter(|p| disrupted(p) || annotation(p, annotations::RECLAIM_ID).is_some())
                .map(|p| format!("{}: {:?}", key(p), p.metadata.annotations))
                .collect();
            if marked.is_empty() {
                Ok(())
            } else {
                Err(format!("{marked:?}"))
            }
        },
    )
    .await
    .unwrap();

    // Without the policy, the owner is handed over.
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    bindings
        .delete("keeps-node-selector", &DeleteParams::default())
        .await
        .unwrap();
    policies
        .delete("keeps-node-selector", &DeleteParams::default())
        .await
        .unwrap();
    bound(&owners, "owner").await;
    let record = owner_record(&client, &format!("{}/owner", online.name())).await;
    assert_eq!(record.outcome, "Completed", "{record:?}");
}
