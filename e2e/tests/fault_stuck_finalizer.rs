#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! Victims stuck Terminating (issue 16). A foreign finalizer (a backup controller's, say) keeps
//! an evicted borrower's object in the API, but not its containers: they end within the grace
//! period as a kubelet ends them, its phase turns terminal, kube-scheduler counts its GPUs free,
//! and the owner is bound into them while the object stays. A victim whose containers never end
//! (its node's kubelet has stopped) keeps its GPUs: the owner is not bound before it is gone
//! and no other pod gets them; the operator closes the handover over budget, warns on the owner
//! (HandoverIncomplete), evicts nobody else, and once the victim is deleted the owner, still
//! pinned, is bound to the freed node.

mod common;
mod fault_common;

use common::{
    Operator, Options, all_running, apply_queue, bound, create, event, events, is_gated,
    waiting_reason,
};
use std::time::Duration;

use fault_common::{gone, handover_record, installed, name, queue, uid};
use gpuqueue_api::{NVIDIA_GPU, v1alpha1::GpuQueue};
use gpuqueue_e2e::{
    ControlPlane, NEVER_ENDS_ANNOTATION, TempNamespace, gpu_pod, has_finished, node_of, wait_for,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

/// A finalizer no operator of ours knows.
const FOREIGN_FINALIZER: &str = "backup.example.com/snapshot";

/// Longer than a handover waits for a victim that does not end: its deadline, the victim's
/// grace and 30 s more.
const SETTLED: Duration = Duration::from_mins(1);

/// Queues `online` (guaranteed 2), `batch` and `labs` (burstable 2 each) on one node of 2 GPUs,
/// the operator, and batch's two borrowers of 1 GPU with a 1 s grace, each `made` first.
/// Fields drop in order: the operator first, the cluster last.
struct Stuck {
    operator: Operator,
    borrowers: Api<Pod>,
    owners: Api<Pod>,
    labs: Api<Pod>,
    running: Vec<Pod>,
    _namespaces: [TempNamespace; 3],
    cluster: ControlPlane,
}

impl Stuck {
    async fn start(name: &str, made: impl Fn(&mut Pod)) -> Self {
        let (cluster, port) = installed(name, 2).await;
        let client = cluster.client();
        let operator = Operator::start(&cluster, Options::new("only", port)).await;
        let online = cluster.namespace("online").await.unwrap();
        let batch = cluster.namespace("batch").await.unwrap();
        let labs = cluster.namespace("labs").await.unwrap();
        apply_queue(&client, &queue("online", online.name(), 2, 0, None)).await;
        apply_queue(&client, &queue("batch", batch.name(), 0, 2, None)).await;
        apply_queue(&client, &queue("labs", labs.name(), 0, 2, None)).await;
        let borrowers: Api<Pod> = Api::namespaced(client.clone(), batch.name());
        for pod in ["b-0", "b-1"] {
            let mut pod = gpu_pod(pod, NVIDIA_GPU, 1);
            pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(1);
            made(&mut pod);
            create(&borrowers, &pod).await;
        }
        let running = all_running(&borrowers, 2).await;
        Self {
            operator,
            borrowers,
            owners: Api::namespaced(client.clone(), online.name()),
            labs: Api::namespaced(client, labs.name()),
            running,
            _namespaces: [online, batch, labs],
            cluster,
        }
    }

    /// The other borrower runs on as the same pod, never evicted.
    async fn nobody_else_evicted(&self, victim: &str) {
        let survivor = self.running.iter().find(|p| name(p) != victim).unwrap();
        let now = self.borrowers.get(&name(survivor)).await.unwrap();
        assert_eq!(uid(&now), uid(survivor));
        assert!(now.metadata.deletion_timestamp.is_none(), "evicted too");
        let namespace = self.borrowers.namespace().unwrap_or_default();
        let client = self.cluster.client();
        assert!(
            events(&client, namespace, &name(survivor), "Evicted")
                .await
                .is_empty()
        );
        assert_eq!(
            self.operator
                .metric("gpuqueue_reclaims_started_total")
                .await,
            Some(1.0)
        );
    }

    async fn remove_finalizers(&self, pod: &str) {
        let patch = json!([{"op": "remove", "path": "/metadata/finalizers"}]);
        self.borrowers
            .patch(
                pod,
                &PatchParams::default(),
                &Patch::<()>::Json(serde_json::from_value(patch).unwrap()),
            )
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_victim_held_by_a_foreign_finalizer_frees_its_gpus_when_its_containers_end() {
    let stuck = Stuck::start("fault_stuck_finalizer", |pod| {
        pod.metadata.finalizers = Some(vec![FOREIGN_FINALIZER.to_owned()]);
    })
    .await;
    let client = stuck.cluster.client();

    // The owner takes one GPU back: its victim ends and the owner is bound into its GPU,
    // while the finalizer keeps the victim's object.
    create(&stuck.owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;
    let owner_namespace = stuck.owners.namespace().unwrap_or_default();
    let record = handover_record(&client, "online", &format!("{owner_namespace}/owner")).await;
    assert_eq!(record.outcome, "Completed", "{record:?}");
    assert!(record.total_millis <= record.budget_millis, "{record:?}");
    let victim = record.victims[0].split('/').nth(1).unwrap().to_owned();
    let owner = bound(&stuck.owners, "owner").await;
    assert_eq!(node_of(&owner), Some(record.node.as_str()));
    let held = stuck.borrowers.get(&victim).await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_some() && has_finished(&held),
        "the object stays, its containers ended: {held:?}"
    );
    stuck.nobody_else_evicted(&victim).await;

    // A pod of a third queue finds both GPUs taken: the owner's and the survivor's.
    create(&stuck.labs, &gpu_pod("l-0", NVIDIA_GPU, 1)).await;
    assert!(!waiting_reason(&stuck.labs, "l-0").await.is_empty());

    // The finalizer goes: so does the object. The survivor's too, so the namespace can go.
    stuck.remove_finalizers(&victim).await;
    gone(&stuck.borrowers, &victim).await;
    let survivor = stuck.running.iter().find(|p| name(p) != victim).unwrap();
    stuck.remove_finalizers(&name(survivor)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_victim_whose_containers_never_end_keeps_its_gpus_until_it_is_gone() {
    let stuck = Stuck::start("fault_never_ends", |pod| {
        let annotations = pod.metadata.annotations.get_or_insert_default();
        annotations.insert(NEVER_ENDS_ANNOTATION.to_owned(), "true".to_owned());
    })
    .await;
    let client = stuck.cluster.client();

    // The owner takes one GPU back: its victim is evicted, and does not end. The handover
    // waits for it 30 s past its deadline and grace before it records it as incomplete.
    create(&stuck.owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;
    let owner_namespace = stuck.owners.namespace().unwrap_or_default();
    let owner_key = format!("{owner_namespace}/owner");
    let queues: Api<GpuQueue> = Api::all(client.clone());
    let record = wait_for("the owner's handover record", SETTLED, || async {
        let online = queues.get("online").await.map_err(|e| e.to_string())?;
        let records = online.status.map(|s| s.last_handovers).unwrap_or_default();
        records
            .into_iter()
            .find(|r| r.role == "owner" && r.owner_pod == owner_key)
            .ok_or_else(|| "not recorded yet".to_owned())
    })
    .await
    .unwrap();
    assert_eq!(record.victims.len(), 1, "{record:?}");
    let victim = record.victims[0].split('/').nth(1).unwrap().to_owned();
    assert!(record.outcome.starts_with("VictimsNotGone"), "{record:?}");
    assert!(record.total_millis > record.budget_millis, "{record:?}");
    event(&client, owner_namespace, "owner", "HandoverIncomplete").await;

    // Meanwhile: the victim is still there, terminating; the owner waits pinned, unbound; a
    // pod of a third queue that wants a GPU is not given the victim's.
    let terminating = stuck.borrowers.get(&victim).await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert!(!has_finished(&terminating));
    let owner = stuck.owners.get("owner").await.unwrap();
    assert!(!is_gated(&owner));
    assert!(node_of(&owner).is_none());
    create(&stuck.labs, &gpu_pod("l-0", NVIDIA_GPU, 1)).await;
    assert!(!waiting_reason(&stuck.labs, "l-0").await.is_empty());
    stuck.nobody_else_evicted(&victim).await;

    // An admin deletes the victim at once (grace 0), as for a node that is gone: the owner is
    // bound where it was pinned, and the labs pod still waits.
    stuck
        .borrowers
        .delete(&victim, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    gone(&stuck.borrowers, &victim).await;
    let owner = bound(&stuck.owners, "owner").await;
    assert_eq!(node_of(&owner), Some(record.node.as_str()));
    let l0 = stuck.labs.get("l-0").await.unwrap();
    assert!(is_gated(&l0), "the freed GPU went to the owner");
    assert_eq!(
        stuck
            .operator
            .metric("gpuqueue_reclaims_started_total")
            .await,
        Some(1.0)
    );
}
