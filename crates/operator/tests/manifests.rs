//! The install manifests in `config/` agree with the operator: names and ports match its
//! defaults, the RBAC is the least privilege the design allows, the Deployment passes Pod
//! Security `restricted`, and the webhook configuration says what the webhook module documents.
//! (The end-to-end tests apply these same files to a real API server.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::{fs, path::PathBuf};

use clap::Parser;
use gpuqueue_operator::{Args, webhook::server::MUTATE_PODS_PATH};
use k8s_openapi::api::{
    admissionregistration::v1::MutatingWebhookConfiguration,
    apps::v1::Deployment,
    rbac::v1::{ClusterRole, PolicyRule, Role},
};
use serde::de::DeserializeOwned;

fn config_path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../config")
        .join(file)
}

fn read<T: DeserializeOwned>(file: &str) -> T {
    let text = fs::read_to_string(config_path(file)).unwrap();
    serde_yaml::from_str(&text).unwrap_or_else(|error| panic!("config/{file}: {error}"))
}

fn defaults() -> Args {
    Args::try_parse_from(["gpuqueue-operator"]).unwrap()
}

fn grants(rules: &[PolicyRule], resource: &str, verb: &str) -> bool {
    rules.iter().any(|rule| {
        rule.resources
            .iter()
            .flatten()
            .any(|r| r == resource || r == "*")
            && rule.verbs.iter().any(|v| v == verb || v == "*")
    })
}

#[test]
fn the_crd_copy_in_config_matches_crds() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    for entry in fs::read_dir(root).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let copy = fs::read_to_string(config_path(&format!("crd/{name}"))).unwrap_or_default();
        assert!(
            copy == fs::read_to_string(&path).unwrap(),
            "config/crd/{name} differs from crds/{name}: run `make crds`"
        );
    }
}

#[test]
fn the_cluster_role_is_least_privilege() {
    let role: ClusterRole = read("rbac/cluster_role.yaml");
    let rules = role.rules.unwrap();
    // Pods are patched, never updated (a typed PUT drops newer fields); evicted through the
    // Eviction API, or deleted (marked DisruptionTarget first) where no budget guards them;
    // budgets are read, never written.
    assert!(grants(&rules, "pods", "patch"));
    assert!(!grants(&rules, "pods", "update"));
    assert!(!grants(&rules, "pods", "create"));
    assert!(grants(&rules, "pods/eviction", "create"));
    assert!(grants(&rules, "pods/status", "patch"));
    assert!(!grants(&rules, "pods/status", "update"));
    assert!(grants(&rules, "poddisruptionbudgets", "watch"));
    for verb in ["create", "update", "patch", "delete"] {
        assert!(
            !grants(&rules, "poddisruptionbudgets", verb),
            "poddisruptionbudgets {verb}"
        );
    }
    // Queues: status only.
    assert!(grants(&rules, "gpuqueues/status", "patch"));
    for verb in ["create", "update", "patch", "delete"] {
        assert!(!grants(&rules, "gpuqueues", verb), "gpuqueues {verb}");
    }
    assert!(!grants(&rules, "gpuqueues/status", "update"));
    // Nothing secret, nothing wildcard.
    for rule in &rules {
        assert!(
            !rule
                .resources
                .iter()
                .flatten()
                .any(|r| r == "secrets" || r == "*")
        );
        assert!(!rule.verbs.iter().any(|v| v == "*"));
        assert!(!rule.api_groups.iter().flatten().any(|g| g == "*"));
    }
    // Its own webhook configuration only, by name.
    let webhook_rules: Vec<_> = rules
        .iter()
        .filter(|rule| {
            rule.resources
                .iter()
                .flatten()
                .any(|r| r == "mutatingwebhookconfigurations")
        })
        .collect();
    assert_eq!(webhook_rules.len(), 1);
    assert_eq!(
        webhook_rules[0].resource_names.as_deref().unwrap(),
        [defaults().webhook.webhook_config_name]
    );
    assert!(!grants(&rules, "validatingwebhookconfigurations", "patch"));
}

#[test]
fn every_rbac_rule_is_commented() {
    for file in [
        "rbac/cluster_role.yaml",
        "rbac/leader_election_role.yaml",
        "rbac/admission_seal_role.yaml",
    ] {
        let text = fs::read_to_string(config_path(file)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (index, line) in lines.iter().enumerate() {
            if line.trim_start().starts_with("- apiGroups:") {
                assert!(
                    index > 0 && lines[index - 1].trim_start().starts_with('#'),
                    "config/{file}:{}: a rule without a comment saying why",
                    index + 1
                );
            }
        }
    }
}

#[test]
fn leases_are_limited_to_the_operators_own() {
    let role: Role = read("rbac/leader_election_role.yaml");
    let rules = role.rules.unwrap();
    let lease_name = defaults().leader.lease_name;
    for rule in &rules {
        if rule.verbs.iter().any(|v| v != "create") {
            assert_eq!(
                rule.resource_names.as_deref().unwrap(),
                std::slice::from_ref(&lease_name)
            );
        }
        assert!(!rule.verbs.iter().any(|v| v == "delete" || v == "update"));
    }
    assert_eq!(
        role.metadata.namespace.as_deref(),
        Some(defaults().namespace.as_str())
    );
}

#[test]
fn the_seal_secret_is_the_only_one_the_operator_reads() {
    let role: Role = read("rbac/admission_seal_role.yaml");
    for rule in role.rules.unwrap() {
        assert_eq!(rule.resources.as_deref().unwrap(), ["secrets"]);
        if rule.verbs != ["create"] {
            assert_eq!(rule.verbs, ["get"]);
            assert_eq!(
                rule.resource_names.as_deref().unwrap(),
                [gpuqueue_operator::seal::SECRET]
            );
        }
    }
    assert_eq!(
        role.metadata.namespace.as_deref(),
        Some(defaults().namespace.as_str())
    );
}

#[test]
fn the_deployment_runs_two_replicas_under_pod_security_restricted() {
    let deployment: Deployment = read("manager/deployment.yaml");
    let spec = deployment.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    let pod_security = pod.security_context.unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(
        pod_security.seccomp_profile.unwrap().type_,
        "RuntimeDefault"
    );
    assert!(pod.host_network.is_none() && pod.host_pid.is_none() && pod.host_ipc.is_none());
    assert_eq!(pod.containers.len(), 1);
    let container = &pod.containers[0];
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    assert!(security.privileged.is_none());

    let args = defaults();
    let ports: Vec<i32> = container
        .ports
        .iter()
        .flatten()
        .map(|port| port.container_port)
        .collect();
    assert!(ports.contains(&i32::from(args.http.metrics_addr.port())));
    assert!(ports.contains(&i32::from(args.webhook.webhook_addr.port())));
    let probe_path = |probe: &Option<k8s_openapi::api::core::v1::Probe>| {
        probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .clone()
            .unwrap()
    };
    assert_eq!(probe_path(&container.liveness_probe), "/healthz");
    assert_eq!(probe_path(&container.readiness_probe), "/readyz");
    let env: Vec<&str> = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert!(env.contains(&"POD_NAMESPACE") && env.contains(&"POD_NAME"));
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("gpuqueue-operator")
    );
}

#[test]
fn the_webhook_configuration_matches_the_webhook() {
    let config: MutatingWebhookConfiguration = read("webhook/mutating_webhook_configuration.yaml");
    let args = defaults();
    assert_eq!(
        config.metadata.name.as_deref(),
        Some(args.webhook.webhook_config_name.as_str())
    );
    let webhooks = config.webhooks.unwrap();
    assert_eq!(webhooks.len(), 1);
    let webhook = &webhooks[0];
    // Ignore: an operator outage must not stop pod creation (see webhook module docs).
    assert_eq!(webhook.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(webhook.side_effects, "None");
    assert!(
        webhook.client_config.ca_bundle.is_none(),
        "the operator writes caBundle"
    );
    let service = webhook.client_config.service.as_ref().unwrap();
    assert_eq!(service.name, args.webhook.webhook_service_name);
    assert_eq!(service.namespace, args.namespace);
    assert_eq!(service.path.as_deref(), Some(MUTATE_PODS_PATH));
    let rules = webhook.rules.as_ref().unwrap();
    assert_eq!(rules[0].operations.as_deref().unwrap(), ["CREATE"]);
    assert_eq!(rules[0].resources.as_deref().unwrap(), ["pods"]);
    // The operator's own namespace and the system namespaces are never sent.
    let selector = webhook.namespace_selector.as_ref().unwrap();
    let excluded = &selector.match_expressions.as_ref().unwrap()[0];
    assert_eq!(excluded.operator, "NotIn");
    let excluded = excluded.values.as_ref().unwrap();
    assert!(excluded.contains(&args.namespace) && excluded.contains(&"kube-system".to_owned()));
    assert!(webhook.timeout_seconds.unwrap() <= 5);
}
