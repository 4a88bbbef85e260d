//! The CRD's validation, checked without an API server: every rule is in the generated schema,
//! every CEL rule has an example under `examples/invalid/` that trips exactly it, and every
//! valid example passes. The end-to-end suite applies the same files to a real API server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::{collections::BTreeSet, fs, path::PathBuf};

use gpuqueue_api::v1alpha1::{CheckpointDriver, GpuQueue};
use kube::core::cel::Validator;
use serde_json::Value;

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn schema() -> Value {
    let crd = gpuqueue_api::crds().remove(0);
    let schema = crd.spec.versions[0]
        .schema
        .clone()
        .unwrap()
        .open_api_v3_schema
        .unwrap();
    serde_json::to_value(schema).unwrap()
}

/// Every `x-kubernetes-validations` rule of the schema, as (JSON path, message).
fn cel_rules(node: &Value, path: &str, out: &mut Vec<(String, String)>) {
    if let Some(rules) = node
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for rule in rules {
            let message = rule["message"].as_str().unwrap_or_default().to_owned();
            let field_path = rule["fieldPath"].as_str().unwrap_or_default();
            out.push((format!("{path}{field_path}"), message));
        }
    }
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            cel_rules(child, &format!("{path}.{name}"), out);
        }
    }
    if let Some(items) = node.get("items") {
        cel_rules(items, &format!("{path}[]"), out);
    }
}

struct InvalidExample {
    file: String,
    expected_error: String,
    object: Value,
}

fn invalid_examples() -> Vec<InvalidExample> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = fs::read_dir(examples_dir().join("invalid"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let text = fs::read_to_string(&path).unwrap();
        let expected_error = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect-error: "))
            .unwrap_or_else(|| panic!("{} lacks an `# expect-error: ` line", path.display()))
            .to_owned();
        let object: Value = serde_yaml::from_str(&text).unwrap();
        out.push(InvalidExample {
            file: path.file_name().unwrap().to_string_lossy().into_owned(),
            expected_error,
            object,
        });
    }
    out
}

fn valid_examples() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(examples_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = fs::read_to_string(&path).unwrap();
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let value: Value = serde::Deserialize::deserialize(doc).unwrap();
                if value["kind"] == "GpuQueue" {
                    out.push((path.display().to_string(), value));
                }
            }
        }
    }
    assert!(
        out.len() >= 4,
        "expected the two-tenant and per-driver examples"
    );
    out
}

#[test]
fn crd_is_cluster_scoped_with_status_short_name_and_printer_columns() {
    let crd = gpuqueue_api::crds().remove(0);
    assert_eq!(crd.metadata.name.as_deref(), Some("gpuqueues.gpuqueue.io"));
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.short_names, Some(vec!["gq".to_owned()]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<_> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "Guaranteed",
            "Ceiling",
            "Allocated",
            "Borrowed",
            "Lent",
            "Pending",
            "Age"
        ]
    );
}

#[test]
fn conditions_and_resource_lists_merge_by_key_for_server_side_apply() {
    let schema = schema();
    let status = &schema["properties"]["status"]["properties"];
    assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
    assert_eq!(
        status["conditions"]["x-kubernetes-list-map-keys"][0],
        "type"
    );
    assert_eq!(status["resources"]["x-kubernetes-list-map-keys"][0], "name");
    let spec = &schema["properties"]["spec"]["properties"];
    assert_eq!(spec["resources"]["x-kubernetes-list-type"], "map");
    assert_eq!(spec["resources"]["x-kubernetes-list-map-keys"][0], "name");
    assert_eq!(spec["namespaces"]["x-kubernetes-list-type"], "set");
}

#[test]
fn schema_bounds_refuse_negative_and_absurd_numbers() {
    let schema = schema();
    let spec = &schema["properties"]["spec"]["properties"];
    let quota = &spec["resources"]["items"]["properties"];
    for field in ["guaranteed", "burstable", "lendingLimit", "maxBurstable"] {
        assert_eq!(quota[field]["minimum"], 0.0, "{field}");
        assert_eq!(quota[field]["maximum"], 100_000.0, "{field}");
    }
    assert_eq!(spec["weight"]["minimum"], 1.0);
    assert_eq!(spec["weight"]["maximum"], 1000.0);
    let reclaim = &spec["reclaim"]["properties"];
    assert_eq!(reclaim["victimGracePeriodSeconds"]["maximum"], 30.0);
    assert_eq!(
        reclaim["checkpoint"]["properties"]["port"]["maximum"],
        65535.0
    );
    assert_eq!(
        reclaim["checkpoint"]["properties"]["driver"]["enum"],
        serde_json::json!(["vllm", "http", "none"])
    );
}

#[test]
fn every_cel_rule_has_a_message_naming_its_field_and_an_invalid_example() {
    let mut rules = Vec::new();
    cel_rules(&schema(), "", &mut rules);
    assert!(rules.len() >= 17, "expected all CEL rules, found {rules:?}");
    let expected: BTreeSet<_> = invalid_examples()
        .into_iter()
        .map(|e| e.expected_error)
        .collect();
    for (path, message) in &rules {
        let field = path.rsplit('.').next().unwrap().trim_end_matches("[]");
        assert!(
            message.contains(field) || message.contains("resource name"),
            "the message of the rule at {path} does not name its field: {message:?}"
        );
        assert!(
            expected
                .iter()
                .any(|e| message.contains(e.as_str()) || e.contains(message.as_str())),
            "no file under examples/invalid/ exercises the rule at {path}: {message:?}"
        );
    }
}

#[test]
fn each_invalid_example_fails_with_its_expected_message() {
    let schema = schema();
    let validator = Validator::new();
    let cel_messages: BTreeSet<String> = {
        let mut rules = Vec::new();
        cel_rules(&schema, "", &mut rules);
        rules.into_iter().map(|(_, m)| m).collect()
    };
    let mut checked = BTreeSet::new();
    for example in invalid_examples() {
        // Files that trip a schema bound (minimum, enum, listType) are checked by the end-to-end
        // suite against a real API server; kube-cel evaluates CEL rules only.
        if !cel_messages.contains(&example.expected_error) {
            continue;
        }
        let errors = validator
            .validate(&schema, &example.object, None)
            .expect_err(&format!("{} was accepted", example.file));
        let messages: Vec<_> = errors.iter().map(|e| e.message.clone()).collect();
        assert!(
            messages.iter().any(|m| m == &example.expected_error),
            "{}: expected {:?}, got {messages:?}",
            example.file,
            example.expected_error
        );
        checked.insert(example.expected_error);
    }
    assert_eq!(
        checked, cel_messages,
        "every CEL rule is tripped by one invalid example"
    );
}

#[test]
fn valid_examples_pass_every_rule_and_deserialize() {
    let schema = schema();
    let validator = Validator::new();
    let mut drivers = BTreeSet::new();
    for (file, object) in valid_examples() {
        if let Err(errors) = validator.validate(&schema, &object, None) {
            panic!("{file} fails validation: {errors:?}");
        }
        let queue: GpuQueue = serde_json::from_value(object).unwrap();
        drivers.insert(format!("{:?}", queue.spec.reclaim.checkpoint.driver));
    }
    let all: BTreeSet<_> = [
        CheckpointDriver::Vllm,
        CheckpointDriver::Http,
        CheckpointDriver::None,
    ]
    .iter()
    .map(|d| format!("{d:?}"))
    .collect();
    assert_eq!(
        drivers, all,
        "examples/ needs one queue per checkpoint driver"
    );
}

#[test]
fn defaults_match_the_design() {
    let queue: GpuQueue = serde_json::from_value(serde_json::json!({
        "apiVersion": "gpuqueue.io/v1alpha1",
        "kind": "GpuQueue",
        "metadata": {"name": "defaults"},
        "spec": {"namespaces": ["a"], "resources": [{"name": "nvidia.com/gpu", "guaranteed": 1}]}
    }))
    .unwrap();
    let spec = queue.spec;
    assert_eq!(spec.weight, 1);
    assert_eq!(spec.resources[0].burstable, 0);
    assert_eq!(spec.resources[0].lending_limit, None);
    assert_eq!(spec.resources[0].max_burstable, None);
    assert_eq!(
        std::time::Duration::from(spec.reclaim.budget),
        std::time::Duration::from_secs(3)
    );
    assert_eq!(spec.reclaim.victim_grace_period_seconds, 1);
    assert_eq!(spec.reclaim.checkpoint.driver, CheckpointDriver::None);
    assert_eq!(
        std::time::Duration::from(spec.reclaim.checkpoint.timeout),
        std::time::Duration::from_millis(1500)
    );
    assert_eq!(spec.reclaim.min_borrow_duration, None);
}

#[test]
fn the_budget_holds_the_checkpoint_timeout_the_grace_and_the_bind_reserve() {
    let schema = schema();
    let validator = Validator::new();
    let queue = |budget: &str, timeout: &str, grace: i64| {
        serde_json::json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "q"},
            "spec": {
                "namespaces": ["team-a"],
                "resources": [{"name": "nvidia.com/gpu", "guaranteed": 1}],
                "reclaim": {"budget": budget, "victimGracePeriodSeconds": grace,
                            "checkpoint": {"driver": "none", "timeout": timeout}},
            },
        })
    };
    let refused = |object: &Value| {
        validator
            .validate(&schema, object, None)
            .err()
            .is_some_and(|errors| {
                errors
                    .iter()
                    .any(|e| e.message == gpuqueue_api::v1alpha1::BUDGET_RULE)
            })
    };
    // Exactly enough: 1500ms + 1s + 250ms = 2750ms.
    assert!(!refused(&queue("2750ms", "1500ms", 1)));
    assert!(refused(&queue("2749ms", "1500ms", 1)));
    // In whole milliseconds, as the operator's own check (core's conversions test).
    assert!(!refused(&queue("2750ms", "1500500us", 1)));
    assert!(refused(&queue("2749ms", "1500500us", 1)));
    // The grace counts in whole seconds: 3s cannot hold 1s + 2s + 250ms.
    assert!(!refused(&queue("3s", "500ms", 2)));
    assert!(refused(&queue("3s", "1s", 2)));
    assert!(!refused(&queue("3s", "1500ms", 0)));
}

/// Review finding: a `gpuMemory` of 20Ei passed the API server and the operator then refused
/// the queue (a byte count past 64 bits); both now draw the line at 8Ei.
#[test]
fn gpu_memory_is_bounded_where_the_operator_can_count_it() {
    let schema = schema();
    let validator = Validator::new();
    let refused = |memory: &str| {
        let queue = serde_json::json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "q"},
            "spec": {
                "namespaces": ["team-a"],
                "resources": [{"name": "nvidia.com/gpu", "guaranteed": 1, "gpuMemory": memory}],
            },
        });
        validator
            .validate(&schema, &queue, None)
            .err()
            .is_some_and(|errors| errors.iter().any(|e| e.message.contains("below 8Ei")))
    };
    assert!(!refused("80Gi"));
    assert!(!refused("7Ei"));
    assert!(refused("8Ei"));
    assert!(refused("20Ei"));
    assert!(refused("0"));
}

/// Review finding: a `namespaceSelector` requirement the operator refuses (an `In` without
/// values, an unknown operator) passed the API server, and the queue admitted nothing.
#[test]
fn a_namespace_selector_is_refused_where_the_operator_would_refuse_it() {
    let schema = schema();
    let validator = Validator::new();
    let refused = |expression: Value| {
        let queue = serde_json::json!({
            "apiVersion": "gpuqueue.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "q"},
            "spec": {
                "namespaceSelector": {"matchExpressions": [expression]},
                "resources": [{"name": "nvidia.com/gpu", "guaranteed": 1}],
            },
        });
        validator
            .validate(&schema, &queue, None)
            .err()
            .is_some_and(|errors| {
                errors.iter().any(|e| {
                    e.message
                        .starts_with("namespaceSelector.matchExpressions: ")
                })
            })
    };
    let requirement = |operator: &str, values: Option<&[&str]>| {
        let mut e = serde_json::json!({"key": "team", "operator": operator});
        if let Some(values) = values {
            e["values"] = serde_json::json!(values);
        }
        e
    };
    assert!(!refused(requirement("In", Some(&["a"]))));
    assert!(!refused(requirement("NotIn", Some(&["a", "b"]))));
    assert!(!refused(requirement("Exists", None)));
    assert!(!refused(requirement("DoesNotExist", Some(&[]))));
    assert!(refused(requirement("In", None)));
    assert!(refused(requirement("NotIn", Some(&[]))));
    assert!(refused(requirement("Exists", Some(&["a"]))));
    assert!(refused(requirement("Foo", Some(&["a"]))));
    assert!(refused(requirement("Gt", Some(&["1"]))));
}
