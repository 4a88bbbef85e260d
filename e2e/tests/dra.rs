#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! DRA claims on a real control plane (issue 17): the test plays NVIDIA's DRA driver,
//! publishing a ResourceSlice of fake GPUs (driver `gpu.nvidia.com`) for the node, and applies
//! `examples/dra/`. kube-controller-manager creates template claims, kube-scheduler's DRA
//! plugin allocates them; gpuqueue counts each claim against the queue of its namespace.

mod common;

use common::{
    Operator, Options, apply_queue, bound, create, free_port, install, queue_status, queue_yaml,
    waiting_reason,
};
use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, UserAccess, apply_file, apply_yaml,
    gpu_pod, node_of, wait_for,
};
use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The only node: 4 GPUs, shown both as `nvidia.com/gpu` and in the driver's ResourceSlice.
const NODE: &str = "gpu-node-0";

/// A node whose GPUs only the DRA driver shows (no `nvidia.com/gpu` in allocatable).
const DRA_ONLY_NODE: &str = "dra-node-0";

/// The extended-resource name class `gpu.nvidia.com` answers to without declaring it
/// (KEP-5004): kube-scheduler allocates its devices through a claim it creates for the pod.
const IMPLICIT_GPU: &str = "deviceclass.resource.kubernetes.io/gpu.nvidia.com";

/// A cluster with `examples/dra/device-classes.yaml`, the node's ResourceSlice, the operator,
/// and a namespace `team` that queue `team` claims with `guaranteed` GPUs and no burst.
struct World {
    cluster: ControlPlane,
    _operator: Operator,
    namespace: gpuqueue_e2e::TempNamespace,
    tenant: UserAccess,
}

impl World {
    async fn start(name: &str, guaranteed: u32) -> Self {
        Self::with_node(name, guaranteed, GpuNode::whole_gpus(NODE, 4), 4).await
    }

    /// The same world with `node` instead, whose slice has `gpus` devices.
    async fn with_node(name: &str, guaranteed: u32, node: GpuNode, gpus: u32) -> Self {
        let node_name = node.name.clone();
        let cluster = ControlPlane::start(ControlPlaneConfig::new(name).with_nodes(vec![node]))
            .await
            .unwrap();
        eprintln!("{name}: control plane up ({})", cluster.startup_summary());
        let admin = cluster.client();
        apply_file(&admin, &examples("device-classes.yaml"), None)
            .await
            .unwrap();
        apply_yaml(&admin, &slice(&node_name, gpus), None)
            .await
            .unwrap();
        let webhook_port = free_port();
        install(&cluster, webhook_port).await;
        let operator = Operator::start(&cluster, Options::new("only", webhook_port)).await;
        let namespace = cluster.namespace("team").await.unwrap();
        apply_queue(
            &admin,
            &queue_yaml("team", &[namespace.name()], guaranteed, 0),
        )
        .await;
        let tenant = cluster.tenant_with_edit(namespace.name()).await.unwrap();
        Self {
            cluster,
            _operator: operator,
            namespace,
            tenant,
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.tenant.client.clone(), self.namespace.name())
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.cluster.client(), self.namespace.name())
    }

    /// Applies `yaml` in the tenant's namespace, as the tenant.
    async fn tenant_applies(&self, yaml: &str) {
        apply_yaml(&self.tenant.client, yaml, Some(self.namespace.name()))
            .await
            .unwrap();
    }
}

fn examples(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/dra")
        .join(file)
}

/// The ResourceSlice NVIDIA's driver would publish for `node` with `gpus` whole H100s.
fn slice(node: &str, gpus: u32) -> String {
    let gpu = |i| {
        json!({
            "name": format!("gpu-{i}"),
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "architecture": {"string": "Hopper"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        })
    };
    pool_slice(node, node, &(0..gpus).map(gpu).collect::<Vec<_>>())
}

/// A second ResourceSlice for `node`: `slices` MIG 1g.10gb instances, in a pool of their own.
fn mig_slice(node: &str, slices: u32) -> String {
    let mig = |i| {
        json!({
            "name": format!("mig-{i}"),
            "attributes": {
                "type": {"string": "mig"},
                "profile": {"string": "1g.10gb"},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
            },
            "capacity": {"memory": {"value": "10Gi"}},
        })
    };
    let devices: Vec<_> = (0..slices).map(mig).collect();
    pool_slice(node, &format!("{node}-mig"), &devices)
}

/// The driver's one-slice pool `pool` of `devices` on `node`.
fn pool_slice(node: &str, pool: &str, devices: &[serde_json::Value]) -> String {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("{pool}-gpu.nvidia.com")},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    })
    .to_string()
}

/// A pod of the tenant using the claims named (`claim` entries of `spec.resourceClaims`).
fn claiming_pod(name: &str, claims: &serde_json::Value) -> String {
    let refs: Vec<_> = claims
        .as_array()
        .unwrap()
        .iter()
        .map(|c| json!({"name": c["name"]}))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": claims,
            "containers": [{
                "name": "main",
                "image": "registry.invalid/gpuqueue-e2e/fake:1",
                "resources": {"claims": refs},
            }],
        },
    })
    .to_string()
}

/// [`claiming_pod`] with a 1-second grace period, for a victim that should go quickly.
fn quick_claiming_pod(name: &str, claims: &serde_json::Value) -> String {
    let mut pod: serde_json::Value = serde_json::from_str(&claiming_pod(name, claims)).unwrap();
    pod["spec"]["terminationGracePeriodSeconds"] = json!(1);
    pod.to_string()
}

/// A claim of `count` devices of `class`, under `name`.
fn claim(name: &str, class: &str, count: u32) -> String {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": class, "count": count}},
        ]}},
    })
    .to_string()
}

/// Waits until claim `name` is allocated; returns the pools (nodes) its devices come from.
async fn allocated_pools(claims: &Api<ResourceClaim>, name: &str) -> Vec<String> {
    wait_for(
        format!("claim {name} to be allocated"),
        DEFAULT_TIMEOUT,
        || async {
            let claim = claims.get(name).await.map_err(|e| e.to_string())?;
            let results = claim
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref());
            match results {
                Some(results) => Ok(results.iter().map(|r| r.pool.clone()).collect()),
                None => Err(format!("status: {:?}", claim.status)),
            }
        },
    )
    .await
    .unwrap()
}

/// The claim kube-controller-manager generated for the pod's `spec.resourceClaims` entry.
async fn generated_claim(pods: &Api<Pod>, pod: &str, entry: &str) -> String {
    wait_for(
        format!("pod {pod}'s claim {entry}"),
        DEFAULT_TIMEOUT,
        || async {
            let pod = pods.get(pod).await.map_err(|e| e.to_string())?;
            pod.status
                .as_ref()
                .and_then(|s| s.resource_claim_statuses.as_ref())
                .and_then(|all| all.iter().find(|s| s.name == entry))
                .and_then(|s| s.resource_claim_name.clone())
                .ok_or_else(|| format!("status: {:?}", pod.status))
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_pod_is_counted_and_waits_above_the_ceiling() {
    let world = World::start("dra_counted", 2).await;
    let pods = world.pods();
    // The example: one GPU from a template; admitted, pinned, allocated on the pinned node.
    world
        .tenant_applies(&std::fs::read_to_string(examples("claim-template-workload.yaml")).unwrap())
        .await;
    let admitted = bound(&pods, "dra-inference").await;
    let node = admitted.spec.unwrap().node_name.unwrap();
    assert_eq!(node, NODE);
    let generated = generated_claim(&pods, "dra-inference", "gpu").await;
    assert_eq!(
        allocated_pools(&world.claims(), &generated).await,
        vec![NODE]
    );
    // One more GPU by a direct claim fills the queue's 2.
    world
        .tenant_applies(&claim("one-more", "gpu.nvidia.com", 1))
        .await;
    let one_more = json!([{"name": "gpu", "resourceClaimName": "one-more"}]);
    world
        .tenant_applies(&claiming_pod("second", &one_more))
        .await;
    bound(&pods, "second").await;
    // A third, by claim or by extended resource, waits: both count against the same 2.
    world
        .tenant_applies(&claim("too-many", "gpu.nvidia.com", 1))
        .await;
    let too_many = json!([{"name": "gpu", "resourceClaimName": "too-many"}]);
    world
        .tenant_applies(&claiming_pod("third", &too_many))
        .await;
    let reason = waiting_reason(&pods, "third").await;
    assert!(reason.starts_with("OverCeiling: queue team"), "{reason}");
    create(&pods, &gpu_pod("plain", NVIDIA_GPU, 1)).await;
    let reason = waiting_reason(&pods, "plain").await;
    assert!(reason.starts_with("OverCeiling: queue team"), "{reason}");
    // So does one asking for the class by its implicit name: the same GPUs, the same quota.
    create(&pods, &gpu_pod("by-class", IMPLICIT_GPU, 1)).await;
    let reason = waiting_reason(&pods, "by-class").await;
    assert!(reason.starts_with("OverCeiling: queue team"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_shared_by_two_pods_is_charged_once() {
    let world = World::start("dra_shared", 2).await;
    let pods = world.pods();
    world
        .tenant_applies(&claim("shared", "gpu.nvidia.com", 2))
        .await;
    let shared = json!([{"name": "gpus", "resourceClaimName": "shared"}]);
    world.tenant_applies(&claiming_pod("first", &shared)).await;
    world.tenant_applies(&claiming_pod("second", &shared)).await;
    // Both run on the claim's 2 GPUs: charged 2 once, not 4 (the queue has 2).
    assert_eq!(
        bound(&pods, "first").await.spec.unwrap().node_name.unwrap(),
        NODE
    );
    assert_eq!(node_of(&bound(&pods, "second").await), Some(NODE));
    assert_eq!(
        allocated_pools(&world.claims(), "shared").await,
        vec![NODE, NODE]
    );
    // And the 2 are charged: one GPU more waits.
    create(&pods, &gpu_pod("plain", NVIDIA_GPU, 1)).await;
    let reason = waiting_reason(&pods, "plain").await;
    assert!(reason.starts_with("OverCeiling: queue team"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_cannot_be_counted_waits_saying_why() {
    let world = World::start("dra_uncounted", 4).await;
    let pods = world.pods();
    // A class of GPUs with no quota resource: never admitted uncounted.
    apply_yaml(
        &world.cluster.client(),
        &json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "unmapped-gpu.example.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
        })
        .to_string(),
        None,
    )
    .await
    .unwrap();
    world
        .tenant_applies(&claim("unmapped", "unmapped-gpu.example.com", 1))
        .await;
    let unmapped = json!([{"name": "gpu", "resourceClaimName": "unmapped"}]);
    world
        .tenant_applies(&claiming_pod("unmapped", &unmapped))
        .await;
    let reason = waiting_reason(&pods, "unmapped").await;
    assert!(
        reason.contains("DeviceClass unmapped-gpu.example.com may select GPUs"),
        "{reason}"
    );
    // A claim that does not exist yet: the pod waits for it.
    let missing = json!([{"name": "gpu", "resourceClaimName": "later"}]);
    world.tenant_applies(&claiming_pod("early", &missing)).await;
    let reason = waiting_reason(&pods, "early").await;
    assert!(
        reason.contains("ResourceClaim later does not exist yet"),
        "{reason}"
    );
    world
        .tenant_applies(&claim("later", "gpu.nvidia.com", 1))
        .await;
    bound(&pods, "early").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_counts_and_places_nvidia_gpu_requests_on_a_dra_only_node() {
    let mut node = GpuNode::whole_gpus(DRA_ONLY_NODE, 2);
    node.resources.clear();
    let world = World::with_node("dra_bridge", 4, node, 2).await;
    let pods = world.pods();
    // The example, and one more by the class's implicit name: the node's 2 GPUs, known only
    // from its ResourceSlice.
    world
        .tenant_applies(&std::fs::read_to_string(examples("bridge-workload.yaml")).unwrap())
        .await;
    create(&pods, &gpu_pod("second", IMPLICIT_GPU, 1)).await;
    for name in ["bridged-inference", "second"] {
        let pod = bound(&pods, name).await;
        assert_eq!(pod.spec.unwrap().node_name.unwrap(), DRA_ONLY_NODE);
    }
    // The queue has room for 2 more, the node none: the third waits for capacity, not quota.
    create(&pods, &gpu_pod("third", NVIDIA_GPU, 1)).await;
    let reason = waiting_reason(&pods, "third").await;
    assert!(!reason.starts_with("OverCeiling"), "{reason}");
    assert!(common::is_gated(&pods.get("third").await.unwrap()));
}

/// Queue `borrowers` (guaranteed 0, burstable 4) borrows the node's 4 GPUs, which `team`
/// owns, through claim `borrowed` that `users` (pods with a 1 s grace) share; returns their
/// namespace once every user is bound.
async fn borrowed_through_a_claim(world: &World, users: &[&str]) -> gpuqueue_e2e::TempNamespace {
    let admin = world.cluster.client();
    let borrowers = world.cluster.namespace("borrowers").await.unwrap();
    apply_queue(&admin, &queue_yaml("borrowers", &[borrowers.name()], 0, 4)).await;
    let in_borrowers = |yaml: String| {
        let admin = admin.clone();
        let namespace = borrowers.name().to_owned();
        async move { apply_yaml(&admin, &yaml, Some(&namespace)).await.unwrap() }
    };
    in_borrowers(claim("borrowed", "gpu.nvidia.com", 4)).await;
    let borrowed = json!([{"name": "gpus", "resourceClaimName": "borrowed"}]);
    for user in users {
        in_borrowers(quick_claiming_pod(user, &borrowed)).await;
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), borrowers.name());
    for user in users {
        bound(&pods, user).await;
    }
    borrowers
}

/// The tenant's pod `owner` claims the node's 4 GPUs (kube-scheduler can allocate them only
/// once the borrowers' claim is released); returns its handover record once it is bound.
async fn owner_claims_the_node(world: &World) -> gpuqueue_api::v1alpha1::HandoverRecord {
    world
        .tenant_applies(&claim("owned", "gpu.nvidia.com", 4))
        .await;
    let owner_claims = json!([{"name": "gpus", "resourceClaimName": "owned"}]);
    world
        .tenant_applies(&claiming_pod("owner", &owner_claims))
        .await;
    assert_eq!(node_of(&bound(&world.pods(), "owner").await), Some(NODE));
    let owner = format!("{}/owner", world.namespace.name());
    let done = |r: &gpuqueue_api::v1alpha1::HandoverRecord| {
        r.owner_pod == owner && r.phases.iter().any(|p| p.phase == "ownerBound")
    };
    let queue = queue_status(
        &world.cluster.client(),
        "team",
        "the handover's record",
        |q| {
            q.status
                .as_ref()
                .is_some_and(|s| s.last_handovers.iter().any(done))
        },
    )
    .await;
    let mine: Vec<_> = queue
        .status
        .unwrap()
        .last_handovers
        .into_iter()
        .filter(|r| r.owner_pod == owner)
        .collect();
    assert_eq!(mine.len(), 1, "one handover: {mine:?}");
    mine.into_iter().next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_from_a_dra_borrower_ends_only_after_its_claim_is_released() {
    let world = World::start("dra_reclaim", 4).await;
    let borrowers = borrowed_through_a_claim(&world, &["borrower"]).await;
    let record = owner_claims_the_node(&world).await;
    let at = |phase: &str| {
        record.phases.iter().find(|p| p.phase == phase).map_or_else(
            || panic!("no phase {phase} in {:?}", record.phases),
            |p| p.at_millis,
        )
    };
    // Released after the victim is gone, and the handover is not over before.
    assert!(
        at("claimsFreed") >= at("victimsGone"),
        "{:?}",
        record.phases
    );
    eprintln!("dra_reclaim: phases {:?}", record.phases);
    let claims: Api<ResourceClaim> = Api::namespaced(world.cluster.client(), borrowers.name());
    let released = claims.get("borrowed").await.unwrap();
    let status = released.status.unwrap_or_default();
    assert!(status.allocation.is_none(), "{status:?}");
}

/// Two borrower pods share one claim of the node's 4 GPUs: its devices are freed only once
/// both are gone, so the reclaim for the owner evicts both in one handover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_evicts_every_pod_sharing_the_borrowed_claim() {
    let world = World::start("dra_reclaim_shared", 4).await;
    let borrowers = borrowed_through_a_claim(&world, &["borrower", "rider"]).await;
    let record = owner_claims_the_node(&world).await;
    assert_eq!(record.outcome, "Completed");
    let mut victims = record.victims;
    victims.sort();
    let ns = borrowers.name();
    assert_eq!(victims, [format!("{ns}/borrower"), format!("{ns}/rider")]);
}

/// The finalizer gpuqueue puts on a waiting pod's claims before counting them.
const CHARGED: &str = "gpuqueue.io/charged";

/// Whether the claim carries [`CHARGED`].
fn charged(claim: &ResourceClaim) -> bool {
    claim
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == CHARGED)
}

/// The tenant's own gate holds the pod once gpuqueue has released its own: the window between
/// the release and scheduling, held open for as long as the attack takes.
const HOLD: &str = "example.com/hold";

/// The tenant tries to take the finalizer off claim `mine`: refused by the policy (a dry run
/// first: the policy loads a moment after its creation, and a real removal before that would
/// go through).
async fn the_tenant_cannot_unmark(tenant_claims: &Api<ResourceClaim>) {
    let unmark: Patch<serde_json::Value> = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let refusal = |result: Result<ResourceClaim, kube::Error>| match result {
        Err(kube::Error::Api(status)) if status.message.contains(CHARGED) => Ok(status.message),
        other => Err(format!("{other:?}")),
    };
    wait_for(
        "the claim policy to be enforced",
        DEFAULT_TIMEOUT,
        || async { refusal(tenant_claims.patch("mine", &dry_run, &unmark).await) },
    )
    .await
    .unwrap();
    let message = refusal(
        tenant_claims
            .patch("mine", &PatchParams::default(), &unmark)
            .await,
    )
    .unwrap();
    assert!(
        message.contains("only by the gpuqueue operator"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counted_claim_cannot_be_swapped_for_a_larger_one_and_goes_with_its_pod() {
    // The queue's ceiling is 2 on a node of 4: a 1-GPU claim swapped for a 4-GPU one after the
    // gate's release would run 3 GPUs uncounted.
    let world = World::start("dra_swap", 2).await;
    let pods = world.pods();
    let tenant_claims: Api<ResourceClaim> =
        Api::namespaced(world.tenant.client.clone(), world.namespace.name());
    world
        .tenant_applies(&claim("mine", "gpu.nvidia.com", 1))
        .await;
    let mine = json!([{"name": "gpu", "resourceClaimName": "mine"}]);
    let mut pod: serde_json::Value = serde_json::from_str(&claiming_pod("swapper", &mine)).unwrap();
    pod["spec"]["schedulingGates"] = json!([{"name": HOLD}]);
    world.tenant_applies(&pod.to_string()).await;
    wait_for("gpuqueue to release its gate", DEFAULT_TIMEOUT, || async {
        let pod = pods.get("swapper").await.map_err(|e| e.to_string())?;
        let gates: Vec<String> = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|g| g.name)
            .collect();
        if gates == [HOLD] {
            Ok(())
        } else {
            Err(format!("gates {gates:?}"))
        }
    })
    .await
    .unwrap();
    assert!(charged(&world.claims().get("mine").await.unwrap()));

    the_tenant_cannot_unmark(&tenant_claims).await;

    // Deleting it is allowed by `edit`, but the claim stays, Terminating, under its name:
    // the larger one cannot be created.
    tenant_claims
        .delete("mine", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = world.claims().get("mine").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    let larger: ResourceClaim = serde_json::from_str(&claim("mine", "gpu.nvidia.com", 4)).unwrap();
    match tenant_claims.create(&PostParams::default(), &larger).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("the larger claim was created: {other:?}"),
    }

    // Released by the tenant, the pod still gets nothing: kube-scheduler's DRA plugin keeps a
    // pod whose claim is being deleted out of its queue (PreEnqueue: "resourceclaim is being
    // deleted"; it writes no condition for that), and the claim is the 1-GPU one counted.
    let release: Patch<serde_json::Value> = Patch::Json(
        serde_json::from_value(json!([
            {"op": "test", "path": "/spec/schedulingGates/0/name", "value": HOLD},
            {"op": "remove", "path": "/spec/schedulingGates"},
        ]))
        .unwrap(),
    );
    let released = pods
        .patch("swapper", &PatchParams::default(), &release)
        .await
        .unwrap();
    assert!(released.spec.unwrap().scheduling_gates.is_none());
    let pod = pods.get("swapper").await.unwrap();
    assert!(pod.spec.unwrap().node_name.is_none());
    let held = world.claims().get("mine").await.unwrap();
    assert!(held.status.unwrap_or_default().allocation.is_none());
    assert_eq!(
        held.spec.devices.unwrap().requests.unwrap()[0]
            .exactly
            .as_ref()
            .unwrap()
            .count,
        Some(1)
    );

    // Once the pod is gone, gpuqueue lets the claim go: it is not left Terminating.
    pods.delete("swapper", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the deleted claim to go", DEFAULT_TIMEOUT, || async {
        match world
            .claims()
            .get_opt("mine")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(claim) => Err(format!("{:?}", claim.metadata)),
        }
    })
    .await
    .unwrap();

    // Created again larger, with a new pod, it is counted as what it is: 4 > the ceiling of 2.
    world
        .tenant_applies(&claim("mine", "gpu.nvidia.com", 4))
        .await;
    world.tenant_applies(&claiming_pod("again", &mine)).await;
    let reason = waiting_reason(&pods, "again").await;
    assert!(reason.starts_with("OverCeiling: queue team"), "{reason}");
    assert!(charged(&world.claims().get("mine").await.unwrap()));
}

/// A tenant whose queue has MIG quota only claims "one GPU, else three MIG slices":
/// kube-scheduler allocates the first alternative that fits, the node's free GPU, so the pod
/// waits until the queue's `nvidia.com/gpu` quota could hold it. Admitted then, it is charged
/// what kube-scheduler allocated, not both alternatives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_available_claim_cannot_take_a_gpu_its_queue_has_no_quota_for() {
    let world = World::with_node("dra_first_available", 0, GpuNode::whole_gpus(NODE, 1), 1).await;
    let admin = world.cluster.client();
    apply_yaml(&admin, &mig_slice(NODE, 3), None).await.unwrap();
    let team = |gpus: u32| {
        format!(
            "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: team\nspec:\n  namespaces: [{}]\n  resources:\n    - {{name: nvidia.com/gpu, guaranteed: {gpus}}}\n    - {{name: nvidia.com/mig-1g.10gb, guaranteed: 3}}\n",
            world.namespace.name()
        )
    };
    apply_queue(&admin, &team(0)).await;
    let either = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "either"},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "whole", "deviceClassName": "gpu.nvidia.com"},
            {"name": "slices", "deviceClassName": "mig-1g.10gb.nvidia.com", "count": 3},
        ]}]}},
    });
    world.tenant_applies(&either.to_string()).await;
    let claims = json!([{"name": "gpu", "resourceClaimName": "either"}]);
    world.tenant_applies(&claiming_pod("walker", &claims)).await;
    let pods = world.pods();
    let reason = waiting_reason(&pods, "walker").await;
    assert!(
        reason.starts_with("OverCeiling: queue team: nvidia.com/gpu"),
        "{reason}"
    );
    // The administrator gives the queue one GPU: admitted, and kube-scheduler takes the GPU.
    apply_queue(&admin, &team(1)).await;
    bound(&pods, "walker").await;
    let allocated: ResourceClaim = world.claims().get("either").await.unwrap();
    let results = allocated
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap();
    let chosen: Vec<_> = results.iter().map(|r| r.request.as_str()).collect();
    assert_eq!(chosen, ["gpu/whole"]);
    queue_status(&admin, "team", "the GPU charged and the slices not", |q| {
        let allocated = |name: &str| {
            q.status
                .iter()
                .flat_map(|s| &s.resources)
                .find(|r| r.name == name)
                .map(|r| r.allocated)
        };
        allocated("nvidia.com/gpu") == Some(1) && allocated("nvidia.com/mig-1g.10gb") == Some(0)
    })
    .await;
}
