#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The alert rules (`config/prometheus/`) and the Grafana dashboard (`config/grafana/`), proven
//! with the real tools: promtool checks the rules and runs their unit tests; the
//! PrometheusRule carries exactly the plain rule file's groups; and a real Prometheus server
//! (Debian's, 2.42) scraping the real operator on a real control plane, after a real reclaim,
//! evaluates every rule without error, returns data for every dashboard expression, and fires
//! `GpuQueueWebhookNotReady` once the webhook configuration is deleted.

mod common;

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{
    Operator, Options, all_running, apply_queue, bound, create, free_port, install, queue_status,
    queue_yaml, waiting_reason,
};
use gpuqueue_api::NVIDIA_GPU;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, DEFAULT_TIMEOUT, GpuNode, Prometheus, PrometheusConfig,
    TempNamespace, fake_vllm_on, gpu_pod, repo_root, wait_for,
};
use gpuqueue_fake_vllm::{Config as VllmConfig, FakeVllm};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::Value;

const RULES: &str = "config/prometheus/gpuqueue.rules.yaml";
const PROMETHEUS_RULE: &str = "config/prometheus/prometheus_rule.yaml";
const RULE_TESTS: &str = "config/prometheus/tests";
const DASHBOARD: &str = "config/grafana/gpuqueue-dashboard.json";
/// The job name the rules expect the operator under (the ServiceMonitor's Service).
const OPERATOR_JOB: &str = "gpuqueue-metrics";
/// The webhook configuration `config/webhook/` installs.
const WEBHOOK_CONFIG: &str = "gpuqueue-operator";
/// The port the batch queue's vLLM checkpoint driver calls.
const VLLM_PORT: u16 = 8000;

/// Series that have no sample until their event happens (a failed write, a watch error, an
/// eviction for a quota bypass, a handover planned over its budget). The operator does not
/// announce an empty family (prometheus-client skips it), so a dashboard expression reading
/// only these may return nothing, and the name is checked against the operator's source.
const EVENT_ONLY: &[&str] = &[
    "gpuqueue_admission_apply_errors_total",
    "gpuqueue_watch_errors_total",
    "gpuqueue_quota_bypass_evictions_total",
    "gpuqueue_reclaim_budget_overruns_planned_total",
];

fn path(relative: &str) -> PathBuf {
    repo_root().join(relative)
}

fn yaml(relative: &str) -> Value {
    serde_yaml::from_str(&std::fs::read_to_string(path(relative)).unwrap()).unwrap()
}

/// Runs `promtool` with `args`; its output when it fails.
fn promtool(args: &[&str]) -> Result<String, String> {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(repo_root())
        .output()
        .map_err(|error| {
            format!("running promtool: {error} (install Debian's prometheus: make e2e-packages)")
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    promtool(&["check", "rules", RULES]).unwrap_or_else(|out| panic!("{out}"));
    let mut tests: Vec<String> = std::fs::read_dir(path(RULE_TESTS))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|file| file.extension().is_some_and(|ext| ext == "yaml"))
        .map(|file| file.display().to_string())
        .collect();
    tests.sort();
    assert!(!tests.is_empty(), "no rule tests in {RULE_TESTS}");
    let mut args = vec!["test", "rules"];
    args.extend(tests.iter().map(String::as_str));
    promtool(&args).unwrap_or_else(|out| panic!("{out}"));
}

#[test]
fn every_alert_has_a_summary_a_description_a_runbook_and_a_unit_test() {
    let tests: String = std::fs::read_dir(path(RULE_TESTS))
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect();
    for rule in rules(&yaml(RULES)) {
        let Some(alert) = rule["alert"].as_str() else {
            continue;
        };
        for annotation in ["summary", "description", "runbook"] {
            assert!(
                rule["annotations"][annotation].is_string(),
                "{alert} has no {annotation}"
            );
        }
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "{alert} has no test in {RULE_TESTS}"
        );
    }
}

#[test]
fn the_prometheus_rule_carries_exactly_the_rule_files_groups() {
    let rule = yaml(PROMETHEUS_RULE);
    assert_eq!(rule["kind"], "PrometheusRule");
    assert_eq!(
        rule["spec"]["groups"],
        yaml(RULES)["groups"],
        "{PROMETHEUS_RULE} differs from {RULES}: run `make prometheus-rule`"
    );
}

#[test]
fn the_dashboard_shows_what_a_platform_team_watches() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "gpuqueue");
    let titles: Vec<String> = panels(&dashboard)
        .iter()
        .map(|panel| panel["title"].as_str().unwrap().to_owned())
        .collect();
    for wanted in [
        "Guaranteed GPUs",
        "Allocated GPUs",
        "Borrowed GPUs",
        "Lent GPUs",
        "Pending GPUs",
        "Handover p50 by phase (cumulative from start)",
        "Handover p99 by phase (cumulative from start)",
        "Handovers over budget",
        "Admission latency",
        "Cluster fragmentation",
        "Fragmented GPUs per node",
        "GPU utilisation per GPU",
    ] {
        assert!(titles.iter().any(|t| t == wanted), "no panel {wanted:?}");
    }
    for panel in panels(&dashboard) {
        let title = &panel["title"];
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        assert!(
            panel["description"].is_string(),
            "{title} has no description"
        );
        if title.as_str().unwrap().starts_with("Handover p") {
            let description = panel["description"].as_str().unwrap();
            assert!(description.contains("cumulative"), "{title}: {description}");
        }
    }
    for title in ["Fragmented GPUs per node", "GPU utilisation per GPU"] {
        let panel = panels(&dashboard)
            .into_iter()
            .find(|p| p["title"] == title)
            .unwrap();
        assert_eq!(panel["type"], "heatmap", "{title}");
    }
    assert!(expressions(&dashboard).len() > 30);
}

fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(path(DASHBOARD)).unwrap()).unwrap()
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<Value> {
    fn walk(list: &Value, into: &mut Vec<Value>) {
        for panel in list.as_array().into_iter().flatten() {
            into.push(panel.clone());
            walk(&panel["panels"], into);
        }
    }
    let mut all = Vec::new();
    walk(&dashboard["panels"], &mut all);
    all
}

/// `(panel title, expression)` of every query target, with the dashboard's variables as
/// Grafana would expand them for "All" over a one-second scrape.
fn expressions(dashboard: &Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
                .replace("$queue", ".*")
                .replace("$resource", ".*")
                .replace("$node", ".*");
            found.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    found
}

/// Every rule of a rule file's groups.
fn rules(file: &Value) -> Vec<Value> {
    file["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap().clone())
        .collect()
}

/// A copy of the rule file with every `for:` cut to a second, so an alert fires within the
/// test (the promtool unit tests check the real durations).
fn rules_with_short_for(dir: &Path) -> PathBuf {
    let mut file = yaml(RULES);
    for group in file["groups"].as_array_mut().unwrap() {
        for rule in group["rules"].as_array_mut().unwrap() {
            if rule.get("for").is_some() {
                rule["for"] = "1s".into();
            }
        }
    }
    let copy = dir.join("gpuqueue.rules.yaml");
    std::fs::write(&copy, serde_yaml::to_string(&file).unwrap()).unwrap();
    copy
}

/// dcgm-exporter's text for the GPUs of `pods` (namespace, name), as its Kubernetes mapping
/// writes it: the second busy, the others idle; plus one idle GPU no pod holds.
fn dcgm_text(node: &str, pods: &[(String, String)]) -> String {
    let mut text = String::from(
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n",
    );
    let spare = (String::new(), String::new());
    for (gpu, (namespace, pod)) in pods.iter().chain([&spare]).enumerate() {
        let utilisation = if gpu == 1 { 70 } else { 0 };
        let container = if pod.is_empty() { "" } else { "main" };
        writeln!(
            text,
            "DCGM_FI_DEV_GPU_UTIL{{gpu=\"{gpu}\",UUID=\"GPU-{gpu}\",device=\"nvidia{gpu}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"{node}\",container=\"{container}\",namespace=\"{namespace}\",pod=\"{pod}\"}} {utilisation}"
        )
        .unwrap();
    }
    text
}

/// Serves `text` at `/metrics` on a free loopback port, as dcgm-exporter would.
async fn fake_dcgm_exporter(text: String) -> SocketAddr {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let text = text.clone();
            async move { text }
        }),
    );
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Whether the operator's source registers the family of `series` (its name without the
/// prefix and the suffix the encoding adds, as a string literal).
fn registered(series: &str) -> bool {
    let family = series.strip_prefix("gpuqueue_").unwrap();
    let family = ["_total", "_bucket", "_count", "_sum", "_seconds"]
        .iter()
        .fold(family, |name, suffix| {
            name.strip_suffix(suffix).unwrap_or(name)
        });
    let needle = format!("\"{family}\"");
    let mut dirs = vec![path("crates/operator/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let file = entry.unwrap().path();
            if file.is_dir() {
                dirs.push(file);
            } else if std::fs::read_to_string(&file).unwrap().contains(&needle) {
                return true;
            }
        }
    }
    false
}

/// The metric names an expression reads (a rough scan: identifiers with our prefix).
fn gpuqueue_series(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("gpuqueue_"))
        .collect()
}

/// What [`stage_a_reclaim`] leaves running, kept for the test's life.
struct Staged {
    /// online's and batch's.
    namespaces: [TempNamespace; 2],
    _vllm_servers: Vec<FakeVllm>,
    /// `(namespace, name)` of the batch pods that held the node's GPUs.
    borrowers: Vec<(String, String)>,
}

/// A real reclaim: batch borrows all four GPUs of the node online guarantees, with a vLLM
/// checkpoint; online's owner takes one back. Leaves one online pod waiting (over its
/// ceiling).
async fn stage_a_reclaim(cluster: &ControlPlane) -> Staged {
    let client = cluster.client();
    let online = cluster.namespace("online").await.unwrap();
    let batch = cluster.namespace("batch").await.unwrap();
    apply_queue(&client, &queue_yaml("online", &[online.name()], 4, 0)).await;
    let batch_queue = queue_yaml("batch", &[batch.name()], 0, 4)
        + &format!(
            "  reclaim: {{checkpoint: {{driver: vllm, port: {VLLM_PORT}, timeout: 1500ms}}}}\n"
        );
    apply_queue(&client, &batch_queue).await;

    let borrowers: Api<Pod> = Api::namespaced(client.clone(), batch.name());
    for i in 0..4 {
        create(
            &borrowers,
            &gpu_pod(&format!("borrower-{i}"), NVIDIA_GPU, 1),
        )
        .await;
    }
    let mut servers = Vec::new();
    let mut held = Vec::new();
    for pod in all_running(&borrowers, 4).await {
        let config = VllmConfig {
            dev_mode: true,
            ..VllmConfig::default()
        };
        servers.push(fake_vllm_on(&pod, VLLM_PORT, config).await.unwrap());
        held.push((batch.name().to_owned(), pod.metadata.name.clone().unwrap()));
    }

    let owners: Api<Pod> = Api::namespaced(client.clone(), online.name());
    create(&owners, &gpu_pod("owner", NVIDIA_GPU, 1)).await;
    bound(&owners, "owner").await;
    queue_status(&client, "online", "a finished handover", |q| {
        q.status
            .as_ref()
            .is_some_and(|s| s.last_handovers.iter().any(|r| !r.outcome.is_empty()))
    })
    .await;
    create(&owners, &gpu_pod("too-big", NVIDIA_GPU, 4)).await;
    waiting_reason(&owners, "too-big").await;
    Staged {
        namespaces: [online, batch],
        _vllm_servers: servers,
        borrowers: held,
    }
}

/// Waits until Prometheus returns data for `expr`.
async fn has_data(prometheus: &Prometheus, expr: &str) {
    wait_for(
        format!("Prometheus to return {expr}"),
        DEFAULT_TIMEOUT,
        || async {
            match prometheus.query(expr).await {
                Ok(series) if !series.is_empty() => Ok(()),
                Ok(_) => Err("no data".to_owned()),
                Err(error) => Err(error.to_string()),
            }
        },
    )
    .await
    .unwrap();
}

/// The value of the one series `expr` returns.
async fn value(prometheus: &Prometheus, expr: &str) -> f64 {
    let series = prometheus.query(expr).await.unwrap();
    assert_eq!(series.len(), 1, "{expr}: {series:?}");
    series[0]["value"][1].as_str().unwrap().parse().unwrap()
}

/// The series added for the alerts, after the staged reclaim: one handover of online's within
/// its budget or not, online's pod waiting over its ceiling, the namespaces each queue claims,
/// a ready webhook.
async fn the_series_the_alerts_need_say_what_happened(prometheus: &Prometheus, staged: &Staged) {
    let [online, batch] = &staged.namespaces;
    let handovers = value(
        prometheus,
        "sum(gpuqueue_handovers_total{queue=\"online\"})",
    )
    .await;
    assert!((handovers - 1.0).abs() < f64::EPSILON, "{handovers}");
    let waiting = "gpuqueue_queue_waiting_pods{queue=\"online\", reason=\"OverCeiling\"}";
    assert!((value(prometheus, waiting).await - 1.0).abs() < f64::EPSILON);
    for (queue, namespace) in [("online", online.name()), ("batch", batch.name())] {
        let claim = format!(
            "gpuqueue_queue_namespace_info{{queue=\"{queue}\", namespace=\"{namespace}\"}}"
        );
        assert!((value(prometheus, &claim).await - 1.0).abs() < f64::EPSILON);
    }
    assert!((value(prometheus, "gpuqueue_webhook_ready").await - 1.0).abs() < f64::EPSILON);
}

/// Waits until every rule has been evaluated; fails at once on a rule in error.
async fn every_rule_evaluates(prometheus: &Prometheus) {
    let expected = rules(&yaml(RULES)).len();
    wait_for("every rule evaluated", DEFAULT_TIMEOUT, || async {
        let rules = prometheus.rules().await.map_err(|e| e.to_string())?;
        if let Some(broken) = rules.iter().find(|r| r.health == "err") {
            panic!("rule {} fails: {}", broken.name, broken.last_error);
        }
        let ok = rules.iter().filter(|r| r.health == "ok").count();
        if ok == expected {
            Ok(())
        } else {
            Err(format!("{ok} of {expected} rules evaluated: {rules:?}"))
        }
    })
    .await
    .unwrap();
}

/// Whether `alert` is in `state` (`pending` or `firing`) now.
async fn alert_state(prometheus: &Prometheus, alert: &str) -> Option<String> {
    let alerts = prometheus.alerts().await.unwrap();
    alerts
        .into_iter()
        .find(|a| a.labels.get("alertname").is_some_and(|name| name == alert))
        .map(|a| a.state)
}

/// Every dashboard query returns data, but those that read only [`EVENT_ONLY`] series.
async fn every_dashboard_query_returns_data(prometheus: &Prometheus) {
    let mut empty = Vec::new();
    for (title, expr) in expressions(&dashboard()) {
        let series = prometheus
            .query(&expr)
            .await
            .unwrap_or_else(|error| panic!("panel {title:?}: {error}"));
        if !series.is_empty() {
            continue;
        }
        let read = gpuqueue_series(&expr);
        let event_only = !read.is_empty() && read.iter().all(|s| EVENT_ONLY.contains(s));
        if !event_only {
            let mut raw = Vec::new();
            for series in &read {
                let samples = prometheus.query(series).await.map_or(0, |s| s.len());
                raw.push(format!("{series}: {samples} series"));
            }
            empty.push(format!("{title}: {expr} ({})", raw.join(", ")));
        }
        for series in read {
            assert!(
                registered(series),
                "the operator registers no {series}, which panel {title:?} reads"
            );
        }
    }
    assert!(empty.is_empty(), "no data for:\n{}", empty.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_prometheus_evaluates_every_rule_and_dashboard_query_and_fires_on_a_webhook_fault() {
    let cluster = ControlPlane::start(
        ControlPlaneConfig::new("observability")
            .with_nodes(vec![GpuNode::whole_gpus("gpu-node-0", 4)]),
    )
    .await
    .unwrap();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let operator = Operator::start(&cluster, Options::new("first", webhook_port)).await;
    let staged = stage_a_reclaim(&cluster).await;
    let dcgm = fake_dcgm_exporter(dcgm_text("gpu-node-0", &staged.borrowers)).await;

    let config = PrometheusConfig::new(vec![
        (OPERATOR_JOB.to_owned(), operator.metrics),
        ("dcgm-exporter".to_owned(), dcgm),
    ])
    .with_rule_files(vec![rules_with_short_for(cluster.run_dir())]);
    let prometheus = Prometheus::start(&cluster, &config).await.unwrap();
    has_data(&prometheus, &format!("up{{job=\"{OPERATOR_JOB}\"}} == 1")).await;
    has_data(&prometheus, "up{job=\"dcgm-exporter\"} == 1").await;
    // Rates need two samples of a series in their window: three scrapes of the newest ones.
    has_data(
        &prometheus,
        "count_over_time(gpuqueue_handovers_total[1m]) >= 3",
    )
    .await;
    has_data(
        &prometheus,
        "count_over_time(gpuqueue_queue_waiting_pods[1m]) >= 3",
    )
    .await;
    has_data(
        &prometheus,
        "count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 3",
    )
    .await;
    every_rule_evaluates(&prometheus).await;
    the_series_the_alerts_need_say_what_happened(&prometheus, &staged).await;

    // The recording rules join DCGM to the queues: data for the batch queue's GPUs.
    has_data(
        &prometheus,
        "gpuqueue:namespace_queue:info{queue=\"batch\"}",
    )
    .await;
    has_data(
        &prometheus,
        "gpuqueue:gpu_utilization:by_queue{queue=\"batch\"}",
    )
    .await;
    for rule in rules(&yaml(RULES)) {
        let expr = rule["expr"].as_str().unwrap();
        prometheus
            .query(expr)
            .await
            .unwrap_or_else(|error| panic!("{error}"));
    }

    every_dashboard_query_returns_data(&prometheus).await;

    // The fault: the webhook configuration is deleted, so the webhook cannot publish its CA
    // and is not ready; nothing calls it. Its alert was quiet and fires.
    assert_eq!(
        alert_state(&prometheus, "GpuQueueWebhookNotReady").await,
        None
    );
    let configs: Api<MutatingWebhookConfiguration> = Api::all(cluster.client());
    configs
        .delete(WEBHOOK_CONFIG, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "GpuQueueWebhookNotReady to fire",
        DEFAULT_TIMEOUT,
        || async {
            match alert_state(&prometheus, "GpuQueueWebhookNotReady").await {
                Some(state) if state == "firing" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    let readyz = reqwest::get(format!("http://{}/readyz", operator.metrics))
        .await
        .unwrap();
    assert_eq!(readyz.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
}
