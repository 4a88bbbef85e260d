#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The Helm chart (`config/helm/gpuqueue`) against `config/`, with helm v4 built from the Go
//! module proxy (`e2e/tools/helm`): with its defaults it renders exactly the objects
//! `kubectl kustomize config/` does, `helm lint` passes, bad values are refused naming the
//! value, and `helm install` into a real API server creates every object, with the three
//! admission policies accepted and enforced for the release's own namespace. With the
//! Prometheus Operator's CRDs (from its Go module, `e2e/tools/prometheus-operator`), the API
//! server accepts `kubectl apply -k config/prometheus` as README has it and the chart's
//! ServiceMonitor and PrometheusRule, and refuses a misspelt field.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpuqueue_api::v1alpha1::GpuQueue;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, apply_yaml, bin_dir, repo_root, wait_for,
};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde::Deserialize;
use serde_json::Value;

use common::run_ok;

const CHART: &str = "config/helm/gpuqueue";
/// The Kubernetes version `helm template` and `helm lint` assume (the chart needs 1.34 or newer).
const KUBE_VERSION: &str = "1.36.3";

/// Helm's own bookkeeping on top of config/'s objects: the only differences allowed.
const HELM_LABELS: [&str; 2] = ["app.kubernetes.io/managed-by", "helm.sh/chart"];
const HELM_ANNOTATIONS: [&str; 1] = ["helm.sh/resource-policy"];

fn helm() -> Command {
    let helm = bin_dir().unwrap().join("helm");
    assert!(
        helm.exists(),
        "{} is missing: run e2e/scripts/build-tools.sh",
        helm.display()
    );
    let mut command = Command::new(helm);
    // Helm's caches and settings stay inside the target directory.
    let home = gpuqueue_e2e::target_dir().join("helm-home");
    command
        .current_dir(repo_root())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    command
}

fn template(args: &[&str]) -> String {
    let output = run_ok(
        helm()
            .args([
                "template",
                "gpuqueue",
                CHART,
                "--kube-version",
                KUBE_VERSION,
            ])
            .args(args),
    );
    String::from_utf8(output.stdout).unwrap()
}

fn kustomize_build(dir: &str) -> String {
    let kubectl = bin_dir().unwrap().join("kubectl");
    let output = run_ok(
        Command::new(kubectl)
            .current_dir(repo_root())
            .args(["kustomize", dir]),
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Kinds without a namespace that kustomize v5 does not know as such: it gives them the
/// kustomization's namespace, which the API server drops.
const CLUSTER_SCOPED_UNKNOWN_TO_KUSTOMIZE: [&str; 2] = [
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// The objects of a multi-document YAML stream, keyed by `kind namespace/name`, with numbers
/// compared as numbers (`65535.0` and `65535` are one value).
fn objects(yaml: &str) -> BTreeMap<String, Value> {
    let mut objects = BTreeMap::new();
    for document in serde_yaml::Deserializer::from_str(yaml) {
        let mut object = normalise_numbers(Value::deserialize(document).unwrap());
        if object.is_null() {
            continue;
        }
        if CLUSTER_SCOPED_UNKNOWN_TO_KUSTOMIZE.contains(&object["kind"].as_str().unwrap()) {
            object["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("namespace");
        }
        let key = format!(
            "{} {}/{}",
            object["kind"].as_str().unwrap(),
            object["metadata"]["namespace"].as_str().unwrap_or(""),
            object["metadata"]["name"].as_str().unwrap()
        );
        assert!(objects.insert(key.clone(), object).is_none(), "{key} twice");
    }
    objects
}

fn normalise_numbers(value: Value) -> Value {
    match value {
        Value::Number(n) => serde_json::json!(n.as_f64().unwrap()),
        Value::Array(items) => Value::Array(items.into_iter().map(normalise_numbers).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, normalise_numbers(v)))
                .collect(),
        ),
        other => other,
    }
}

/// Removes Helm's labels and annotations, and the maps they leave empty.
fn without_helm_bookkeeping(mut objects: BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    for object in objects.values_mut() {
        let metadata = object["metadata"].as_object_mut().unwrap();
        for (field, keys) in [
            ("labels", &HELM_LABELS[..]),
            ("annotations", &HELM_ANNOTATIONS),
        ] {
            if let Some(map) = metadata.get_mut(field).and_then(Value::as_object_mut) {
                for key in keys {
                    map.remove(*key);
                }
                if map.is_empty() {
                    metadata.remove(field);
                }
            }
        }
    }
    objects
}

/// Every difference between two object sets, one line each.
fn differences(
    chart: &BTreeMap<String, Value>,
    kustomize: &BTreeMap<String, Value>,
) -> Vec<String> {
    let mut differences = Vec::new();
    for (key, object) in kustomize {
        match chart.get(key) {
            None => differences.push(format!("{key}: missing from the chart")),
            Some(rendered) if rendered != object => {
                let hint = if squeezed(rendered) == squeezed(object) {
                    " only in whitespace: a folded (>-) YAML string with more-indented lines, \
                     which kustomize and Helm unfold differently; write it literal (|-)"
                } else {
                    ""
                };
                differences.push(format!(
                    "{key} differs{hint}:\n  chart:     {rendered}\n  kustomize: {object}"
                ));
            }
            Some(_) => {}
        }
    }
    for key in chart.keys().filter(|k| !kustomize.contains_key(*k)) {
        differences.push(format!("{key}: only in the chart"));
    }
    differences
}

/// The object as text with every run of whitespace one space.
fn squeezed(object: &Value) -> String {
    object
        .to_string()
        .replace("\\n", " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn chart_defaults_render_exactly_what_kustomize_renders_from_config() {
    // namespace.create: kustomize ships the Namespace; `helm install` cannot own its own.
    let chart = without_helm_bookkeeping(objects(&template(&[
        "--namespace",
        "gpuqueue-system",
        "--set",
        "namespace.create=true",
    ])));
    let kustomize = objects(&kustomize_build("config"));
    assert!(kustomize.len() > 15, "kustomize rendered {kustomize:?}");
    let found = differences(&chart, &kustomize);
    assert!(found.is_empty(), "{}", found.join("\n"));

    // And the opt-in parts: config/prometheus (ServiceMonitor, PrometheusRule) and
    // config/network-policy.
    let chart = without_helm_bookkeeping(objects(&template(&[
        "--namespace",
        "gpuqueue-system",
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.apiServerCIDR=192.0.2.0/24",
        "--show-only",
        "templates/service_monitor.yaml",
        "--show-only",
        "templates/prometheus_rule.yaml",
        "--show-only",
        "templates/network_policy.yaml",
    ])));
    let mut opt_in = objects(&kustomize_build("config/prometheus"));
    opt_in.extend(objects(&kustomize_build("config/network-policy")));
    // Those kustomizations add no common label; the chart labels everything alike.
    for object in opt_in.values_mut() {
        object["metadata"]["labels"]["app.kubernetes.io/part-of"] = "gpuqueue".into();
    }
    let found = differences(&chart, &opt_in);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn values_reach_the_objects_they_name() {
    let rendered = objects(&template(&[
        "--namespace",
        "platform",
        "--set",
        "image.repository=registry.example/gq",
        "--set",
        "image.tag=v9",
        "--set",
        "replicas=3",
        "--set",
        "logFormat=text",
        "--set",
        "admitAtCreation=false",
        "--set",
        "webhook.excludedNamespaces={kube-system,monitoring}",
        "--set",
        "resources.limits.memory=1Gi",
        "--set",
        "crd.keep=false",
        "--set-json",
        r#"extraVolumes=[{"name":"client-ca","configMap":{"name":"webhook-client-ca"}}]"#,
        "--set-json",
        r#"extraVolumeMounts=[{"name":"client-ca","mountPath":"/etc/gpuqueue/client-ca","readOnly":true}]"#,
    ]));
    let deployment = &rendered["Deployment platform/gpuqueue-operator"];
    assert_eq!(deployment["spec"]["replicas"], 3.0);
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["image"], "registry.example/gq:v9");
    assert_eq!(
        container["args"],
        serde_json::json!(["--log-format=text", "--admit-at-creation=false"])
    );
    assert_eq!(container["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(
        pod["volumes"],
        serde_json::json!([{"name": "client-ca", "configMap": {"name": "webhook-client-ca"}}])
    );
    assert_eq!(
        container["volumeMounts"],
        serde_json::json!([{"name": "client-ca", "mountPath": "/etc/gpuqueue/client-ca", "readOnly": true}])
    );
    assert!(rendered.contains_key("PodDisruptionBudget platform/gpuqueue-operator"));

    let excluded = serde_json::json!(["kube-system", "monitoring", "platform"]);
    let webhook = &rendered["MutatingWebhookConfiguration /gpuqueue-operator"]["webhooks"][0];
    assert_eq!(webhook["clientConfig"]["service"]["namespace"], "platform");
    assert_eq!(
        webhook["namespaceSelector"]["matchExpressions"][0]["values"],
        excluded
    );
    let creations = &rendered["ValidatingAdmissionPolicy /gpuqueue-pod-creations"];
    assert_eq!(
        creations["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]["values"],
        excluded
    );
    // The one identity the policies exempt follows the release's namespace.
    for policy in [
        "gpuqueue-pod-creations",
        "gpuqueue-pod-updates",
        "gpuqueue-claim-updates",
    ] {
        let condition = &rendered[&format!("ValidatingAdmissionPolicy /{policy}")]["spec"]["matchConditions"]
            [0]["expression"];
        assert_eq!(
            condition,
            "request.userInfo.username != 'system:serviceaccount:platform:gpuqueue-operator'",
            "{policy}"
        );
    }
    for binding in [
        "ClusterRoleBinding /gpuqueue-operator",
        "RoleBinding platform/gpuqueue-operator-leader-election",
        "RoleBinding platform/gpuqueue-operator-admission-seal",
    ] {
        assert_eq!(rendered[binding]["subjects"][0]["namespace"], "platform");
    }
    let crd = &rendered["CustomResourceDefinition /gpuqueues.gpuqueue.io"];
    assert!(crd["metadata"].get("annotations").is_none(), "{crd}");

    // The dashboard, for Grafana's sidecar, is config/grafana's file as it is.
    let dashboard = objects(&template(&["--set", "grafanaDashboard.enabled=true"]));
    let config_map = &dashboard["ConfigMap default/gpuqueue-dashboard"];
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    let file = "config/grafana/gpuqueue-dashboard.json";
    assert_eq!(
        config_map["data"]["gpuqueue-dashboard.json"]
            .as_str()
            .unwrap(),
        std::fs::read_to_string(repo_root().join(file)).unwrap(),
        "{file}"
    );

    // One replica gets no budget: one available of one would block every drain of its node.
    let single = objects(&template(&["--set", "replicas=1"]));
    assert!(single.contains_key("Deployment default/gpuqueue-operator"));
    assert!(!single.contains_key("PodDisruptionBudget default/gpuqueue-operator"));

    let digest = objects(&template(&["--set", "image.digest=sha256:0123"]));
    assert_eq!(
        digest["Deployment default/gpuqueue-operator"]["spec"]["template"]["spec"]["containers"][0]
            ["image"],
        "ghcr.io/gpuqueue/gpuqueue-operator@sha256:0123"
    );
}

#[test]
fn helm_lint_passes_and_bad_values_are_refused_naming_the_value() {
    run_ok(helm().args(["lint", "--strict", CHART, "--kube-version", KUBE_VERSION]));

    for (args, expected) in [
        (
            &["--set", "networkPolicy.enabled=true"][..],
            "networkPolicy.apiServerCIDR is required",
        ),
        (&["--set", "logFormat=yaml"][..], "/logFormat"),
        (&["--set", "replicas=-1"][..], "/replicas"),
        (&["--set", "image.repository="][..], "/image/repository"),
        (
            &["--set", "webhooks.excludedNamespaces={a}"][..],
            "'webhooks' not allowed",
        ),
    ] {
        let output = helm()
            .args([
                "template",
                "gpuqueue",
                CHART,
                "--kube-version",
                KUBE_VERSION,
            ])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(expected),
            "{args:?}: expected a refusal naming {expected:?}, got: {stderr}"
        );
    }
}

/// The manifest of an installed release, as `helm get manifest` prints it.
fn release_objects(kubeconfig: &Path, namespace: &str) -> BTreeMap<String, Value> {
    let output = run_ok(
        helm()
            .args(["get", "manifest", "gpuqueue", "--namespace", namespace])
            .env("KUBECONFIG", kubeconfig),
    );
    objects(&String::from_utf8(output.stdout).unwrap())
}

fn assert_every_object_exists(cluster: &ControlPlane, release: &BTreeMap<String, Value>) {
    for (key, object) in release {
        let kind = object["kind"].as_str().unwrap();
        let name = object["metadata"]["name"].as_str().unwrap();
        let mut get = cluster.kubectl();
        get.args(["get", &kind.to_lowercase(), name, "-o", "name"]);
        if let Some(ns) = object["metadata"]["namespace"].as_str() {
            get.args(["--namespace", ns]);
        }
        let output = get.output().unwrap();
        assert!(
            output.status.success(),
            "{key} from the release is not in the API server: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The creation policy's refusal of a GPU pod that names its node in a claimed namespace.
async fn refusal_of_a_pinned_gpu_pod(pods: &Api<Pod>) -> String {
    let mut pod = gpuqueue_e2e::gpu_pod("pinned", "nvidia.com/gpu", 1);
    pod.spec.as_mut().unwrap().node_name = Some("gpu-node-0".into());
    wait_for(
        "the creation policy to refuse a pinned GPU pod",
        DEFAULT_TIMEOUT,
        || {
            let pods = pods.clone();
            let pod = pod.clone();
            async move {
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(created) => {
                        let name = created.metadata.name.unwrap_or_default();
                        let _ = pods.delete(&name, &DeleteParams::default()).await;
                        Err(format!("pod {name} was created"))
                    }
                    // Until the API server has loaded the queues, every creation is refused.
                    Err(e) if e.to_string().contains("spec.nodeName is refused") => {
                        Ok(e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await
    .unwrap()
}

/// With the Prometheus Operator's CRDs installed, the API server (kubectl's strict field
/// validation) accepts README's `kubectl apply -k config/prometheus` and the release upgraded
/// with the chart's ServiceMonitor and PrometheusRule, and refuses a field the CRD lacks.
fn prometheus_objects_are_accepted(cluster: &ControlPlane, namespace: &str) {
    let crds = cluster.bin_dir().join("prometheus-operator-crds.yaml");
    run_ok(
        cluster
            .kubectl()
            .args(["apply", "--server-side", "-f"])
            .arg(&crds),
    );
    run_ok(cluster.kubectl().args([
        "wait",
        "--for=condition=Established",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
    ]));

    run_ok(
        cluster
            .kubectl()
            .args(["apply", "-f", "config/namespace.yaml"])
            .current_dir(repo_root()),
    );
    run_ok(
        cluster
            .kubectl()
            .args(["apply", "-k", "config/prometheus"])
            .current_dir(repo_root()),
    );
    run_ok(cluster.kubectl().args([
        "get",
        "--namespace",
        "gpuqueue-system",
        "servicemonitor/gpuqueue-operator",
        "prometheusrule/gpuqueue",
    ]));

    run_ok(
        helm()
            .args([
                "upgrade",
                "gpuqueue",
                CHART,
                "--namespace",
                namespace,
                "--reuse-values",
            ])
            .args([
                "--set",
                "serviceMonitor.enabled=true",
                "--set",
                "prometheusRule.enabled=true",
            ])
            .args(["--wait", "--timeout", "3m"])
            .env("KUBECONFIG", cluster.kubeconfig_path()),
    );
    run_ok(cluster.kubectl().args([
        "get",
        "--namespace",
        namespace,
        "servicemonitor/gpuqueue-operator",
        "prometheusrule/gpuqueue",
    ]));

    // The CRDs hold the objects to their schema: a misspelt field is refused, naming it.
    let service_monitor =
        std::fs::read_to_string(repo_root().join("config/prometheus/service_monitor.yaml"))
            .unwrap();
    let misspelt = service_monitor.replacen("endpoints:", "endpoint:", 1);
    assert_ne!(misspelt, service_monitor);
    let file = cluster.run_dir().join("misspelt_service_monitor.yaml");
    std::fs::write(&file, misspelt).unwrap();
    let refused = cluster
        .kubectl()
        .args(["apply", "--namespace", "gpuqueue-system", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && message.contains("endpoint"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_creates_every_object_and_the_api_server_enforces_its_policies() {
    let cluster = ControlPlane::start(ControlPlaneConfig::new("helm_chart"))
        .await
        .unwrap();
    let kubeconfig: PathBuf = cluster.kubeconfig_path().to_owned();
    // Not the default namespace, so the test sees the chart follow the release's namespace.
    let namespace = "platform-gpuqueue";
    run_ok(cluster.kubectl().args(["create", "namespace", namespace]));
    run_ok(cluster.kubectl().args([
        "label",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=restricted",
    ]));

    // --wait: the Deployment's pods pass Pod Security `restricted` and become Ready (KWOK runs
    // them: the image is never pulled).
    run_ok(
        helm()
            .args(["install", "gpuqueue", CHART, "--namespace", namespace])
            .args(["--wait", "--timeout", "3m"])
            .env("KUBECONFIG", &kubeconfig),
    );
    let release = release_objects(&kubeconfig, namespace);
    assert!(release.len() > 15, "{release:?}");
    assert_every_object_exists(&cluster, &release);
    // Enforced: a queue claims `team`, and the creation policy refuses a GPU pod there that
    // names its node, for the cluster admin too.
    let client = cluster.client();
    let team = cluster.namespace("team").await.unwrap();
    apply_yaml(
        &client,
        &format!(
            "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata: {{name: team}}\n\
             spec:\n  namespaces: [{}]\n  resources: [{{name: nvidia.com/gpu, guaranteed: 8}}]\n",
            team.name()
        ),
        None,
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), team.name());
    let refusal = refusal_of_a_pinned_gpu_pod(&pods).await;
    assert!(refusal.contains("gpuqueue-pod-creations"), "{refusal}");

    // The update policy: nobody but the operator's ServiceAccount of this release writes a
    // gpuqueue.io/ annotation.
    let mut plain = gpuqueue_e2e::gpu_pod("plain", "cpu", 1);
    plain.spec.as_mut().unwrap().containers[0].resources = None;
    pods.create(&PostParams::default(), &plain).await.unwrap();
    let annotate = serde_json::json!({"metadata": {"annotations": {"gpuqueue.io/queue": "team"}}});
    let refusal = pods
        .patch("plain", &PatchParams::default(), &Patch::Merge(&annotate))
        .await
        .unwrap_err()
        .to_string();
    assert!(refusal.contains("gpuqueue-pod-updates"), "{refusal}");

    // The queue-edits policy: whoever may patch queues but not `set-quota` (a tenant admin;
    // without resourceNames here, which the harness's access check cannot wait for) may not
    // change a queue's weight.
    run_ok(cluster.kubectl().args([
        "create",
        "clusterrole",
        "gpuqueue-queue-editor",
        "--resource=gpuqueues.gpuqueue.io",
        "--verb=get,list,watch,patch,update",
    ]));
    let tenant_admin = cluster
        .user_with_cluster_role("queue-editor", "gpuqueue-queue-editor")
        .await
        .unwrap();
    let queues: Api<GpuQueue> = Api::all(tenant_admin.client.clone());
    let reweigh = serde_json::json!({"spec": {"weight": 5}});
    let refusal = queues
        .patch("team", &PatchParams::default(), &Patch::Merge(&reweigh))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refusal.contains("gpuqueue-queue-edits") && refusal.contains("spec.weight"),
        "{refusal}"
    );

    prometheus_objects_are_accepted(&cluster, namespace);

    // Uninstall removes the release's objects but keeps the CRD (and so every GpuQueue).
    run_ok(
        helm()
            .args(["uninstall", "gpuqueue", "--namespace", namespace, "--wait"])
            .env("KUBECONFIG", &kubeconfig),
    );
    let deployment = cluster
        .kubectl()
        .args([
            "get",
            "deployment",
            "gpuqueue-operator",
            "--namespace",
            namespace,
        ])
        .output()
        .unwrap();
    assert!(
        !deployment.status.success(),
        "the Deployment outlived the release"
    );
    run_ok(cluster.kubectl().args(["get", "gpuqueue", "team"]));
}
