#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! Tenant admins edit their own queue, and only what the cluster admin lets them: the role
//! stamped per queue (`config/rbac/tenant_admin.yaml`) and the ValidatingAdmissionPolicy
//! `config/policy/queue_edits.yaml`, both evaluated by the real API server. The operator does
//! not run: nothing here depends on it.

mod common;

use std::io::Write;
use std::process::Stdio;

use common::OPERATOR_NAMESPACE;
use gpuqueue_api::{FIELD_MANAGER, v1alpha1::GpuQueue};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, UserAccess, apply_file, install_crds,
    repo_root, wait_for,
};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The cap the cluster admin sets on batch's burstable (16 in the example).
const CAP: i32 = 20;

/// A cluster with the CRD, the policy, the two queues of `examples/two-tenants.yaml` with the
/// cap on batch, and the tenant-admin role of batch as shipped.
async fn start(name: &str) -> ControlPlane {
    let cluster = ControlPlane::start(ControlPlaneConfig::new(name).with_nodes(Vec::new()))
        .await
        .unwrap();
    let admin = cluster.client();
    install_crds(&admin, &repo_root().join("crds"))
        .await
        .unwrap();
    for file in [
        "config/policy/queue_edits.yaml",
        "config/rbac/tenant_admin.yaml",
        "examples/two-tenants.yaml",
    ] {
        apply_file(&admin, &repo_root().join(file), None)
            .await
            .unwrap();
    }
    let queues: Api<GpuQueue> = Api::all(admin);
    edit(&queues, "batch", |q| {
        q.spec.resources[0].max_burstable = Some(CAP);
    })
    .await
    .unwrap();
    cluster
}

/// Runs kubectl as the cluster admin; returns its output.
fn kubectl(cluster: &ControlPlane, args: &[&str]) -> String {
    let output = cluster.kubectl().args(args).output().unwrap();
    assert!(
        output.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Runs kubectl as `user` with `stdin`.
fn kubectl_as(
    cluster: &ControlPlane,
    user: &UserAccess,
    args: &[&str],
    stdin: &str,
) -> std::process::Output {
    let mut child = cluster
        .kubectl()
        .env("KUBECONFIG", &user.kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Service account `<queue>-admin` in `namespace`, bound to `gpuqueue-tenant-admin-<queue>`
/// with the command `config/rbac/tenant_admin.yaml` documents. Returns once RBAC lets it read
/// the queue.
async fn tenant_admin(cluster: &ControlPlane, namespace: &str, queue: &str) -> UserAccess {
    let account = format!("{queue}-admin");
    kubectl(
        cluster,
        &["-n", namespace, "create", "serviceaccount", &account],
    );
    kubectl(
        cluster,
        &[
            "create",
            "clusterrolebinding",
            &format!("gpuqueue-tenant-admin-{queue}"),
            &format!("--clusterrole=gpuqueue-tenant-admin-{queue}"),
            &format!("--serviceaccount={namespace}:{account}"),
        ],
    );
    let access = cluster
        .service_account_access(namespace, &account)
        .await
        .unwrap();
    let queues: Api<GpuQueue> = Api::all(access.client.clone());
    wait_for(
        format!("RBAC to let {account} read queue {queue}"),
        DEFAULT_TIMEOUT,
        || async { queues.get(queue).await.map_err(|e| e.to_string()) },
    )
    .await
    .unwrap();
    access
}

/// Waits until the API server enforces the policy on `tenant_admin`'s `queue` (a dry run, so nothing
/// changes while it is not enforced yet).
async fn policy_enforced(tenant_admin: &Api<GpuQueue>, queue: &str) {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_for(
        "the policy to refuse a change of guaranteed",
        DEFAULT_TIMEOUT,
        || async {
            let mut queue_object = tenant_admin.get(queue).await.map_err(|e| e.to_string())?;
            queue_object.spec.resources[0].guaranteed += 1;
            match tenant_admin.replace(queue, &dry_run, &queue_object).await {
                Err(kube::Error::Api(status)) if status.message.contains("guaranteed") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
}

/// Reads the queue, changes it and writes it back (an update, as `kubectl edit` does).
async fn edit(
    queues: &Api<GpuQueue>,
    name: &str,
    change: impl FnOnce(&mut GpuQueue),
) -> kube::Result<GpuQueue> {
    let mut queue = queues.get(name).await?;
    change(&mut queue);
    queues.replace(name, &PostParams::default(), &queue).await
}

/// Asserts the API server refused the request with `code` and a message containing `needle`.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: kube::Result<T>, code: u16, needle: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, code, "{status:?}");
            assert!(
                status.message.contains(needle),
                "expected {needle:?} in: {}",
                status.message
            );
        }
        other => panic!("expected a refusal naming {needle:?}, got {other:?}"),
    }
}

/// A change of batch, and the field the policy names when a tenant admin tries it.
type Refusal = (&'static str, Box<dyn FnOnce(&mut GpuQueue)>);

/// Every change the policy refuses a tenant admin, one field each.
fn policy_refusals() -> Vec<Refusal> {
    vec![
        (
            "spec.resources[].guaranteed",
            Box::new(|q| q.spec.resources[0].guaranteed = 9),
        ),
        (
            "spec.resources[].burstable: nvidia.com/gpu 21 is above maxBurstable 20, the most",
            Box::new(|q| q.spec.resources[0].burstable = CAP + 1),
        ),
        (
            "spec.resources[].maxBurstable",
            Box::new(|q| q.spec.resources[0].max_burstable = Some(32)),
        ),
        (
            "spec.resources[].maxBurstable",
            Box::new(|q| q.spec.resources[0].max_burstable = None),
        ),
        (
            "spec.resources[].gpuMemory",
            Box::new(|q| q.spec.resources[0].gpu_memory = Some("1Ti".into())),
        ),
        (
            "spec.resources: a tenant admin may not add or remove",
            Box::new(|q| {
                let mut mig = q.spec.resources[0].clone();
                mig.name = "nvidia.com/mig-1g.10gb".into();
                q.spec.resources.push(mig);
            }),
        ),
        (
            "spec.namespaces",
            Box::new(|q| q.spec.namespaces.push("online".into())),
        ),
        (
            "spec.namespaces",
            Box::new(|q| q.spec.namespaces.retain(|n| n != "batch-2")),
        ),
        (
            "spec.resources: a tenant admin may not add or remove",
            Box::new(|q| q.spec.resources[0].name = "nvidia.com/mig-1g.10gb".into()),
        ),
        (
            "spec.resources[].gpuCores",
            Box::new(|q| q.spec.resources[0].gpu_cores = Some(50)),
        ),
        (
            "spec.namespaceSelector",
            Box::new(|q| {
                q.spec.namespace_selector = Some(LabelSelector {
                    match_labels: Some([("team".into(), "batch".into())].into()),
                    ..LabelSelector::default()
                });
            }),
        ),
        ("spec.weight", Box::new(|q| q.spec.weight = 3)),
        (
            "metadata.labels",
            Box::new(|q| {
                q.metadata.labels =
                    Some([("app.kubernetes.io/instance".into(), "x".into())].into());
            }),
        ),
        (
            "metadata.annotations",
            Box::new(|q| {
                q.metadata.annotations = Some([("gpuqueue.io/note".into(), "x".into())].into());
            }),
        ),
        (
            "metadata.ownerReferences",
            Box::new(|q| {
                q.metadata.owner_references = Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Namespace".into(),
                    name: "gone".into(),
                    uid: "00000000-0000-0000-0000-000000000000".into(),
                    ..OwnerReference::default()
                }]);
            }),
        ),
        (
            "metadata.finalizers",
            Box::new(|q| q.metadata.finalizers = Some(vec!["example.com/hold".into()])),
        ),
    ]
}

/// What RBAC refuses batch's tenant admin: another queue, creating, deleting, the status.
async fn rbac_refusals(cluster: &ControlPlane, queues: &Api<GpuQueue>) {
    refused(
        queues.get("online").await,
        403,
        r#"cannot get resource "gpuqueues""#,
    );
    let online = Api::<GpuQueue>::all(cluster.client()).get("online").await;
    refused(
        queues
            .replace("online", &PostParams::default(), &online.unwrap())
            .await,
        403,
        r#"cannot update resource "gpuqueues""#,
    );
    let mut copy = queues.get("batch").await.unwrap();
    copy.metadata = kube::api::ObjectMeta {
        name: Some("batch-2".into()),
        ..kube::api::ObjectMeta::default()
    };
    refused(
        queues.create(&PostParams::default(), &copy).await,
        403,
        r#"cannot create resource "gpuqueues""#,
    );
    refused(
        queues.delete("batch", &DeleteParams::default()).await,
        403,
        r#"cannot delete resource "gpuqueues""#,
    );
    let status = json!({"status": {"admittedPods": 99}});
    refused(
        queues
            .patch_status("batch", &PatchParams::default(), &Patch::Merge(&status))
            .await,
        403,
        r#"cannot patch resource "gpuqueues/status""#,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_admin_changes_lending_reclaim_and_burstable_up_to_the_cap() {
    let cluster = start("tenant_admin_allowed").await;
    let admins = cluster.namespace("tenant-admins").await.unwrap();
    let access = tenant_admin(&cluster, admins.name(), "batch").await;
    let queues: Api<GpuQueue> = Api::all(access.client.clone());
    policy_enforced(&queues, "batch").await;

    // `kubectl apply` as the tenant admin: the example's batch with burstable 18, and the cap
    // as the cluster admin set it (leaving it out would remove it, which is refused).
    let example = std::fs::read_to_string(repo_root().join("examples/two-tenants.yaml")).unwrap();
    let batch = example.split("\n---\n").nth(1).unwrap().replace(
        "burstable: 16",
        &format!("maxBurstable: {CAP}\n      burstable: 18"),
    );
    assert!(batch.contains("name: batch") && batch.contains("burstable: 18"));
    let output = kubectl_as(&cluster, &access, &["apply", "-f", "-"], &batch);
    assert!(output.status.success(), "{output:?}");

    edit(&queues, "batch", |q| {
        q.spec.resources[0].lending_limit = Some(4);
    })
    .await
    .unwrap();
    edit(&queues, "batch", |q| q.spec.resources[0].burstable = CAP)
        .await
        .unwrap();
    let reclaim = json!({"spec": {"reclaim": {
        "budget": "5s", "minBorrowDuration": "10s", "victimGracePeriodSeconds": 2,
        "checkpoint": {"timeout": "2s"},
    }}});
    queues
        .patch("batch", &PatchParams::default(), &Patch::Merge(&reclaim))
        .await
        .unwrap();
    edit(&queues, "batch", |q| q.spec.resources[0].burstable = 12)
        .await
        .unwrap();

    let spec = queues.get("batch").await.unwrap().spec;
    let gpu = &spec.resources[0];
    assert_eq!(
        (
            gpu.guaranteed,
            gpu.burstable,
            gpu.lending_limit,
            gpu.max_burstable
        ),
        (8, 12, Some(4), Some(CAP))
    );
    assert_eq!(spec.reclaim.budget.to_string(), "5s");
    assert_eq!(spec.reclaim.victim_grace_period_seconds, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_admin_cannot_change_guarantees_namespaces_the_cap_or_another_queue() {
    let cluster = start("tenant_admin_refused").await;
    let admins = cluster.namespace("tenant-admins").await.unwrap();
    let access = tenant_admin(&cluster, admins.name(), "batch").await;
    let queues: Api<GpuQueue> = Api::all(access.client.clone());
    policy_enforced(&queues, "batch").await;
    // A second namespace, for the tenant admin to try removing one.
    edit(&Api::all(cluster.client()), "batch", |q| {
        q.spec.namespaces.push("batch-2".into());
    })
    .await
    .unwrap();
    let before = queues.get("batch").await.unwrap().spec;

    for (field, change) in policy_refusals() {
        refused(edit(&queues, "batch", change).await, 403, field);
    }
    // Patch is checked like update.
    let patch = json!({"spec": {"namespaces": ["batch", "online"]}});
    refused(
        queues
            .patch("batch", &PatchParams::default(), &Patch::Merge(&patch))
            .await,
        403,
        "spec.namespaces",
    );
    assert_eq!(queues.get("batch").await.unwrap().spec, before);

    rbac_refusals(&cluster, &queues).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_kubectl_role_equals_the_template_and_binds_one_queue() {
    let cluster = start("tenant_admin_kubectl_role").await;
    kubectl(
        &cluster,
        &[
            "create",
            "clusterrole",
            "gpuqueue-tenant-admin-online",
            "--resource=gpuqueues.gpuqueue.io",
            "--resource-name=online",
            "--verb=get,list,watch,patch,update",
        ],
    );
    let roles: Api<ClusterRole> = Api::all(cluster.client());
    let stamped = roles.get("gpuqueue-tenant-admin-online").await.unwrap();
    let mut template = roles.get("gpuqueue-tenant-admin-batch").await.unwrap();
    for rule in template.rules.iter_mut().flatten() {
        rule.resource_names = Some(vec!["online".into()]);
    }
    assert_eq!(stamped.rules, template.rules);

    let admins = cluster.namespace("tenant-admins").await.unwrap();
    let access = tenant_admin(&cluster, admins.name(), "online").await;
    let queues: Api<GpuQueue> = Api::all(access.client.clone());
    edit(&queues, "online", |q| {
        q.spec.resources[0].lending_limit = Some(16);
    })
    .await
    .unwrap();
    // online has no maxBurstable: its burstable (0) may not be raised at all.
    policy_enforced(&queues, "online").await;
    refused(
        edit(&queues, "online", |q| q.spec.resources[0].burstable = 1).await,
        403,
        "nvidia.com/gpu 1 is above maxBurstable (unset: burstable may only be lowered)",
    );
    let batch = Api::<GpuQueue>::all(cluster.client()).get("batch").await;
    refused(
        queues
            .replace("batch", &PostParams::default(), &batch.unwrap())
            .await,
        403,
        r#"cannot update resource "gpuqueues""#,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_admins_quota_admins_and_the_operators_status_writes_pass_the_policy() {
    let cluster = start("tenant_admin_exempt").await;
    let admin = cluster.client();
    let admins = cluster.namespace("tenant-admins").await.unwrap();
    let tenant = tenant_admin(&cluster, admins.name(), "batch").await;
    policy_enforced(&Api::all(tenant.client.clone()), "batch").await;

    // cluster-admin (`*`) changes everything the tenant admin may not.
    let queues: Api<GpuQueue> = Api::all(admin.clone());
    edit(&queues, "batch", |q| {
        let gpu = &mut q.spec.resources[0];
        (gpu.guaranteed, gpu.burstable, gpu.max_burstable) = (6, 26, Some(26));
        q.spec.namespaces.push("batch-2".into());
        q.spec.weight = 2;
    })
    .await
    .unwrap();

    // A GitOps service account bound to gpuqueue-quota-admin, as config/rbac/quota_admin.yaml says.
    apply_file(
        &admin,
        &repo_root().join("config/rbac/quota_admin.yaml"),
        None,
    )
    .await
    .unwrap();
    let gitops = cluster
        .user_with_cluster_role("gitops", "gpuqueue-quota-admin")
        .await
        .unwrap();
    let queues: Api<GpuQueue> = Api::all(gitops.client.clone());
    edit(&queues, "batch", |q| q.spec.resources[0].guaranteed = 8)
        .await
        .unwrap();
    refused(
        edit(&queues, "batch", |q| q.spec.resources[0].guaranteed = -1).await,
        422,
        "guaranteed",
    );

    // The operator, as its ServiceAccount from config/, applies status through the subresource.
    let namespace_yaml = repo_root().join("config/namespace.yaml");
    apply_file(&admin, &namespace_yaml, None).await.unwrap();
    for file in [
        "service_account.yaml",
        "cluster_role.yaml",
        "cluster_role_binding.yaml",
    ] {
        apply_file(&admin, &repo_root().join("config/rbac").join(file), None)
            .await
            .unwrap();
    }
    let operator = cluster
        .service_account_access(OPERATOR_NAMESPACE, "gpuqueue-operator")
        .await
        .unwrap();
    let queues: Api<GpuQueue> = Api::all(operator.client.clone());
    let status = json!({
        "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
        "metadata": {"name": "batch"},
        "status": {"admittedPods": 3, "pendingPods": 1},
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let written = wait_for(
        "RBAC to let the operator apply status",
        DEFAULT_TIMEOUT,
        || async {
            queues
                .patch_status("batch", &params, &Patch::Apply(&status))
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await
    .unwrap();
    let status = written.status.unwrap();
    assert_eq!((status.admitted_pods, status.pending_pods), (3, 1));
}
