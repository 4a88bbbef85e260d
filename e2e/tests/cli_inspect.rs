#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! `kubectl gpuqueue queues | explain | handovers` as a user types them: the real `kubectl`
//! finds the `kubectl-gpuqueue` plugin on its PATH, against a real control plane where the
//! real `gpuqueue-operator` binary gates and admits pods, so every status, waiting reason and
//! event the CLI shows was written by the operator.

mod common;

use std::process::Output;

use gpuqueue_api::{ADMISSION_GATE, annotations, v1alpha1::GpuQueue};
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, TempNamespace, apply_yaml,
    describe_pod, gpu_pod, node_of, repo_root, wait_for,
};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{
    Client,
    api::{Api, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

/// `kubectl <args>` with the plugin's folder first on the PATH, as a user who installed it.
fn kubectl(cluster: &ControlPlane, args: &[&str]) -> Output {
    common::kubectl_with_plugin(cluster)
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs a command that must succeed; returns its stdout.
fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// Runs a command that must fail; returns its stderr.
fn fails(output: &Output) -> String {
    assert!(
        !output.status.success(),
        "expected a failure, got stdout:\n{}",
        text(&output.stdout)
    );
    assert!(output.stdout.is_empty(), "{}", text(&output.stdout));
    text(&output.stderr)
}

/// The JSONPath of the README's command that starts with `command` (`kubectl get ... -o
/// jsonpath='...'`, one line), so that the test runs what the README tells a user to type.
fn readme_jsonpath(command: &str) -> String {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let line = readme
        .lines()
        .find(|line| line.starts_with(command))
        .unwrap_or_else(|| panic!("README.md has no command starting with {command:?}"));
    let (_, quoted) = line.split_once("-o jsonpath='").unwrap();
    quoted.strip_suffix('\'').unwrap().to_owned()
}

/// The table row of `queue` (first resource), split on whitespace.
fn row<'a>(table: &'a str, queue: &str) -> Vec<&'a str> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(queue))
        .unwrap_or_else(|| panic!("no row for {queue} in\n{table}"))
        .split_whitespace()
        .collect()
}

/// The value of `Key:` in explain's text.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {key}: in\n{out}"))
        .trim()
}

fn queue_yaml(name: &str, namespace: &str, guaranteed: u32, burstable: u32) -> String {
    format!(
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: {name}\nspec:\n  namespaces: [{namespace}]\n  resources:\n    - name: nvidia.com/gpu\n      guaranteed: {guaranteed}\n      burstable: {burstable}\n"
    )
}

fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|g| g.name == ADMISSION_GATE))
}

fn waiting_reason(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(annotations::WAITING_REASON)
        .map(String::as_str)
}

/// Creates four one-GPU pods in batch (two within the guarantee, one borrowed, one over the
/// ceiling) and one in web; waits until the operator has admitted three, holds the fourth
/// with its reason, counted them in the status and published the waiting pod's event.
/// Returns the admitted pods and the waiting pod's name.
async fn create_pods(
    client: &Client,
    batch: &TempNamespace,
    web: &TempNamespace,
) -> (Vec<Pod>, String) {
    // Four one-GPU pods in batch, written as a tenant writes them (the webhook gates them):
    // two within the guarantee, one borrowed, one over the ceiling of 3.
    let pods: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    for i in 0..4 {
        pods.create(
            &PostParams::default(),
            &gpu_pod(&format!("vllm-{i}"), "nvidia.com/gpu", 1),
        )
        .await
        .unwrap();
    }
    // And one in a namespace no queue claims: kube-scheduler places it alone.
    let web_pods: Api<Pod> = Api::namespaced(client.clone(), web.name());
    web_pods
        .create(
            &PostParams::default(),
            &gpu_pod("render", "nvidia.com/gpu", 1),
        )
        .await
        .unwrap();

    let (admitted, waiting) = wait_for(
        "3 batch pods bound and 1 waiting over the ceiling",
        DEFAULT_TIMEOUT,
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let bound: Vec<Pod> = list
                .items
                .iter()
                .filter(|p| node_of(p).is_some())
                .cloned()
                .collect();
            let over: Vec<Pod> = list
                .items
                .iter()
                .filter(|p| {
                    is_gated(p) && waiting_reason(p).is_some_and(|r| r.starts_with("OverCeiling"))
                })
                .cloned()
                .collect();
            if bound.len() == 3 && over.len() == 1 {
                Ok((bound, over[0].clone()))
            } else {
                Err(list
                    .items
                    .iter()
                    .map(describe_pod)
                    .collect::<Vec<_>>()
                    .join("\n"))
            }
        },
    )
    .await
    .unwrap();
    let waiting_name = waiting.metadata.name.clone().unwrap();
    let queues: Api<GpuQueue> = Api::all(client.clone());
    wait_for(
        "batch's status to count 3 admitted and 1 pending",
        DEFAULT_TIMEOUT,
        || async {
            let queue = queues.get("batch").await.map_err(|e| e.to_string())?;
            let status = queue.status.clone().unwrap_or_default();
            let row = status.resources.first().cloned().unwrap_or_default();
            if (
                status.admitted_pods,
                status.pending_pods,
                row.allocated,
                row.pending,
            ) == (3, 1, 3, 1)
            {
                Ok(())
            } else {
                Err(format!("{status:?}"))
            }
        },
    )
    .await
    .unwrap();
    // Events are published by a task of their own; wait for the one explain should show.
    let events: Api<Event> = Api::namespaced(client.clone(), batch.name());
    let selector = format!("involvedObject.name={waiting_name},reason=OverCeiling");
    wait_for("the OverCeiling event", DEFAULT_TIMEOUT, || async {
        let list = events
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|e| e.to_string())?;
        if list.items.is_empty() {
            Err("none yet".to_owned())
        } else {
            Ok(())
        }
    })
    .await
    .unwrap();

    (admitted, waiting_name)
}

/// The cluster, the plugin and the namespaces the stages of the test share.
struct Ctx<'a> {
    cluster: &'a ControlPlane,
    batch: &'a TempNamespace,
    online: &'a TempNamespace,
    web: &'a TempNamespace,
}

impl Ctx<'_> {
    fn run(&self, args: &[&str]) -> Output {
        kubectl(self.cluster, args)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_explain_and_handovers_tell_what_the_operator_decided() {
    // Built before the cluster starts, so that its clock does not run meanwhile.
    common::cli_binaries();
    let config = ControlPlaneConfig::new("cli_inspect").with_nodes(vec![
        GpuNode::whole_gpus("gpu-a", 4),
        GpuNode::whole_gpus("gpu-b", 4),
    ]);
    // Pods are created directly and nothing is deleted; the controller manager runs for the
    // tenant's stock `edit` role, which its ClusterRole aggregation fills.
    let cluster = ControlPlane::start(config).await.unwrap();
    let client = cluster.client();
    let run = |args: &[&str]| kubectl(&cluster, args);

    // Before the CRD exists, the CLI says how to install it.
    let stderr = fails(&run(&["gpuqueue", "queues"]));
    assert!(
        stderr.contains("the GpuQueue CRD (gpuqueues.gpuqueue.io) is not installed"),
        "{stderr}"
    );

    let webhook_port = common::free_port();
    common::install(&cluster, webhook_port).await;
    let batch = cluster.namespace("batch").await.unwrap();
    let online = cluster.namespace("online").await.unwrap();
    let web = cluster.namespace("web").await.unwrap();
    // 8 GPUs: online is guaranteed 4 and lends them while idle; batch is guaranteed 2 and may
    // borrow 1 more.
    apply_yaml(&client, &queue_yaml("online", online.name(), 4, 0), None)
        .await
        .unwrap();
    apply_yaml(&client, &queue_yaml("batch", batch.name(), 2, 1), None)
        .await
        .unwrap();

    // No operator yet: the queues are listed with their spec and the reason for no numbers.
    let table = ok(&run(&["gpuqueue", "queues"]));
    assert_eq!(
        row(&table, "batch"),
        [
            "batch",
            "nvidia.com/gpu",
            "2",
            "3",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-"
        ],
        "{table}"
    );
    assert!(
        table.contains("batch: no status: the operator has not reported on this queue (is gpuqueue-operator running?)"),
        "{table}"
    );

    let _operator =
        common::Operator::start(&cluster, common::Options::new("cli-e2e", webhook_port)).await;

    let (admitted, waiting_name) = create_pods(&client, &batch, &web).await;

    let ctx = Ctx {
        cluster: &cluster,
        batch: &batch,
        online: &online,
        web: &web,
    };
    check_queues(&ctx);
    check_explain(&ctx, &admitted, &waiting_name);
    check_handovers(&ctx).await;
    check_errors(&ctx, &waiting_name).await;
    cluster.stop();
}

/// `queues`: the operator's numbers, by name, aliases and formats.
fn check_queues(ctx: &Ctx<'_>) {
    let run = |args: &[&str]| ctx.run(args);

    // kubectl gpuqueue queues: the operator's numbers.
    let table = ok(&run(&["gpuqueue", "queues"]));
    assert_eq!(
        row(&table, "batch"),
        [
            "batch",
            "nvidia.com/gpu",
            "2",
            "3",
            "3",
            "1",
            "0",
            "1",
            "3",
            "1",
            "-"
        ],
        "{table}"
    );
    assert_eq!(
        row(&table, "online")[..4],
        ["online", "nvidia.com/gpu", "4", "4"],
        "{table}"
    );
    assert!(!table.contains("Needs attention"), "{table}");
    // The aliases and -o json say the same.
    assert_eq!(ok(&run(&["gpuqueue", "get"])), table);
    let json: serde_json::Value =
        serde_json::from_str(&ok(&run(&["gpuqueue", "ls", "-o", "json"]))).unwrap();
    let batch_json = json
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "batch")
        .unwrap();
    assert_eq!(batch_json["resources"][0]["borrowed"], 1);
    assert_eq!(batch_json["pendingPods"], 1);
    let yaml: serde_yaml::Value =
        serde_yaml::from_str(&ok(&run(&["gpuqueue", "queues", "-o", "yaml"]))).unwrap();
    assert_eq!(yaml.as_sequence().unwrap().len(), 2);
    // One queue by name, and one that does not exist.
    let one = ok(&run(&["gpuqueue", "queues", "batch"]));
    assert_eq!(one.lines().count(), 2, "{one}");
    assert_eq!(row(&one, "batch"), row(&table, "batch"));
    assert_eq!(
        fails(&run(&["gpuqueue", "queues", "nope"])),
        "error: GpuQueue nope not found\n"
    );
}

/// `explain`: admitted pods, the pod over its ceiling, an unmanaged pod.
fn check_explain(ctx: &Ctx<'_>, admitted: &[Pod], waiting_name: &str) {
    let run = |args: &[&str]| ctx.run(args);
    let (batch, web) = (ctx.batch, ctx.web);

    // explain an admitted pod: its queue, how it was admitted, and the node it is bound to.
    for pod in admitted {
        let name = pod.metadata.name.as_deref().unwrap();
        let node = node_of(pod).unwrap();
        let out = ok(&run(&["gpuqueue", "explain", name, "-n", batch.name()]));
        assert_eq!(
            field(&out, "Queue"),
            format!("batch (claims namespace {})", batch.name())
        );
        assert_eq!(field(&out, "Node"), format!("{node} (bound)"));
        assert_eq!(field(&out, "Gate"), "gpuqueue.io/admission not present");
        let summary = field(&out, "Summary");
        assert!(
            summary == format!("admitted as guaranteed by queue batch; bound to node {node}")
                || summary == format!("admitted as borrowed by queue batch; bound to node {node}"),
            "{out}"
        );
        assert!(
            field(&out, "Admitted").contains(", queue batch, at "),
            "{out}"
        );
    }

    // explain the pod over the ceiling: the operator's reason with the queue and its numbers,
    // the queue's row, and the operator's event.
    let out = ok(&run(&[
        "gpuqueue",
        "explain",
        waiting_name,
        "--namespace",
        batch.name(),
    ]));
    let reason = "OverCeiling: queue batch: nvidia.com/gpu allocated 3 + requested 1 exceeds its ceiling of 3 (guaranteed 2 + burstable 1)";
    assert_eq!(
        field(&out, "Summary"),
        format!("waiting at the gate: {reason}")
    );
    assert_eq!(field(&out, "Gate"), "gpuqueue.io/admission (held)");
    assert_eq!(field(&out, "Waiting reason"), reason);
    assert!(
        out.contains("Queue batch (3 pods admitted, 1 pending):"),
        "{out}"
    );
    let numbers: Vec<&str> = out
        .lines()
        .find(|l| l.trim_start().starts_with("nvidia.com/gpu"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        numbers,
        ["nvidia.com/gpu", "2", "3", "3", "1", "0", "1"],
        "{out}"
    );
    let event = out
        .lines()
        .find(|l| l.contains("OverCeiling") && l.contains("Normal"))
        .unwrap_or_else(|| panic!("no OverCeiling event in\n{out}"));
    assert!(event.contains("exceeds its ceiling of 3"), "{out}");
    let json: serde_json::Value = serde_json::from_str(&ok(&run(&[
        "gpuqueue",
        "explain",
        waiting_name,
        "-n",
        batch.name(),
        "-o",
        "json",
    ])))
    .unwrap();
    assert_eq!(json["gated"], true);
    assert_eq!(json["waitingReason"], reason);
    assert_eq!(json["claim"]["queue"], "batch");

    check_waiting_with_kubectl(ctx, waiting_name, reason);

    // explain a pod in a namespace no queue claims.
    let out = ok(&run(&["gpuqueue", "explain", "render", "-n", web.name()]));
    assert!(
        field(&out, "Summary").starts_with(&format!(
            "no queue claims namespace {}: the pod is not managed",
            web.name()
        )),
        "{out}"
    );
    assert_eq!(
        field(&out, "Queue"),
        format!("none: no queue claims namespace {}", web.name())
    );
}

/// The README's plain kubectl commands for a waiting pod: its reason, and its events.
fn check_waiting_with_kubectl(ctx: &Ctx<'_>, waiting_name: &str, reason: &str) {
    let run = |args: &[&str]| ctx.run(args);
    let batch = ctx.batch.name();
    let jsonpath = format!(
        "jsonpath={}",
        readme_jsonpath("kubectl get pod <pod> -o jsonpath=")
    );
    let get = [
        "get",
        "pod",
        waiting_name,
        "-n",
        batch,
        "-o",
        jsonpath.as_str(),
    ];
    assert_eq!(ok(&run(&get)), reason);
    let selector = format!("involvedObject.name={waiting_name}");
    let events = ok(&run(&[
        "get",
        "events",
        "-n",
        batch,
        "--field-selector",
        selector.as_str(),
    ]));
    assert!(events.contains("OverCeiling"), "{events}");
}

/// `handovers`: none, then records written as the reclaim path writes them.
async fn check_handovers(ctx: &Ctx<'_>) {
    let run = |args: &[&str]| ctx.run(args);
    let (batch, online) = (ctx.batch, ctx.online);
    let queues: Api<GpuQueue> = Api::all(ctx.cluster.client());

    // handovers: none yet, and a queue that does not exist.
    assert_eq!(
        ok(&run(&["gpuqueue", "handovers"])),
        "No queue has recorded a handover yet.\n"
    );
    assert_eq!(
        ok(&run(&["gpuqueue", "handovers", "batch"])),
        "Queue batch has recorded no handover yet.\n"
    );
    assert_eq!(
        fails(&run(&["gpuqueue", "handovers", "nope"])),
        "error: GpuQueue nope not found\n"
    );

    // Handovers. A real reclaim is exercised by e2e/tests/reclaim.rs; here the records are
    // written as the reclaim path writes them, so the output can be compared exactly: one per queue, the owner's and the
    // victim's, into `status.lastHandovers`, which the operator's own status writes carry over.
    let record = |role: &str| {
        json!({
            "id": "rc-e2e", "role": role, "ownerPod": format!("{}/vllm-owner", online.name()),
            "node": "gpu-a", "victims": [format!("{}/vllm-0", batch.name())],
            "startedAt": "2026-01-10T11:55:00Z", "outcome": "Completed",
            "budgetMillis": 3000, "totalMillis": 2710,
            "phases": [
                {"phase": "plan", "atMillis": 12}, {"phase": "checkpoint", "atMillis": 1265},
                {"phase": "victimsGone", "atMillis": 2405}, {"phase": "ownerBound", "atMillis": 2710},
            ],
            "checkpoints": [{"pod": format!("{}/vllm-0", batch.name()), "driver": "vllm",
                "result": "Succeeded", "millis": 1180}],
        })
    };
    for (queue, role) in [("online", "owner"), ("batch", "victim")] {
        queues
            .patch_status(
                queue,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"lastHandovers": [record(role)]}})),
            )
            .await
            .unwrap();
    }
    let out = ok(&run(&["gpuqueue", "handovers"]));
    assert!(
        out.starts_with(
            "rc-e2e   Completed   2710ms of 3000ms budget   started 2026-01-10T11:55:00Z ("
        ),
        "{out}"
    );
    assert!(
        out.contains("  queues      online (owner), batch (victim)\n"),
        "{out}"
    );
    assert!(
        out.contains("  timeline    plan +12, checkpoint +1253, victimsGone +1140, ownerBound +305 = 2710ms\n"),
        "{out}"
    );
    assert_eq!(
        out.matches("rc-e2e").count(),
        1,
        "each handover once:\n{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&run(&["gpuqueue", "handovers", "batch", "-o", "json"]))).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 1, "{json}");
    assert_eq!(
        json[0]["queues"],
        json!([{"queue": "batch", "role": "victim"}])
    );
    assert_eq!(json[0]["checkpoints"][0]["result"], "Succeeded");
    let yaml: serde_yaml::Value = serde_yaml::from_str(&ok(&run(&[
        "gpuqueue",
        "handovers",
        "online",
        "-o",
        "yaml",
    ])))
    .unwrap();
    assert_eq!(yaml[0]["phases"][1]["tookMillis"], 1253);
    let table = ok(&run(&["gpuqueue", "queues"]));
    assert_eq!(
        row(&table, "online")[10..],
        ["rc-e2e", "2710ms", "Completed"],
        "{table}"
    );
    // The README's plain kubectl command for the records.
    let jsonpath = format!(
        "jsonpath={}",
        readme_jsonpath("kubectl get gq online -o jsonpath=")
    );
    assert_eq!(
        ok(&run(&["get", "gq", "online", "-o", jsonpath.as_str()])),
        format!("rc-e2e {}/vllm-owner Completed 2710ms\n", online.name())
    );
}

/// Clear errors for a missing pod and a refused read.
async fn check_errors(ctx: &Ctx<'_>, waiting_name: &str) {
    let run = |args: &[&str]| ctx.run(args);
    let (cluster, batch) = (ctx.cluster, ctx.batch);
    let client = cluster.client();

    // Clear errors: a pod that does not exist, and a user who may read queues but not pods.
    assert_eq!(
        fails(&run(&["gpuqueue", "explain", "nope", "-n", batch.name()])),
        format!("error: pod {}/nope not found\n", batch.name())
    );
    apply_yaml(
        &client,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: gpuqueue-e2e-queue-reader}\nrules:\n  - {apiGroups: [gpuqueue.io], resources: [gpuqueues], verbs: [get, list]}\n",
        None,
    )
    .await
    .unwrap();
    let reader = cluster
        .user_with_cluster_role("queue-reader", "gpuqueue-e2e-queue-reader")
        .await
        .unwrap();
    let kubeconfig = reader.kubeconfig.to_str().unwrap();
    let table = ok(&run(&["gpuqueue", "queues", "--kubeconfig", kubeconfig]));
    assert_eq!(row(&table, "batch")[4], "3", "{table}");
    let explain_as = |kubeconfig: &str| {
        run(&[
            "gpuqueue",
            "explain",
            waiting_name,
            "-n",
            batch.name(),
            "--kubeconfig",
            kubeconfig,
        ])
    };
    let stderr = fails(&explain_as(kubeconfig));
    assert!(
        stderr.starts_with(&format!(
            "error: no permission to get pods in namespace {}: ",
            batch.name()
        )) && stderr.contains(&reader.username),
        "{stderr}"
    );

    // The reverse, and the common case: a tenant with `edit` in its namespace reads its pods but
    // no queue (cluster-scoped). explain says what it can, and which read was refused.
    let tenant = cluster.tenant_with_edit(batch.name()).await.unwrap();
    let out = ok(&explain_as(tenant.kubeconfig.to_str().unwrap()));
    let queue = field(&out, "Queue");
    assert!(
        queue.starts_with(&format!(
            "unknown for namespace {}: cannot list GpuQueues (no permission to list GpuQueues: ",
            batch.name()
        )),
        "{out}"
    );
    assert!(
        field(&out, "Summary").starts_with("waiting at the gate: "),
        "{out}"
    );
}
