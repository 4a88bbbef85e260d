//! A real Prometheus server for tests of the alert rules and the dashboard: Debian's
//! `prometheus` (2.42, `make e2e-packages` installs it) on a free loopback port, scraping
//! targets on loopback and evaluating rule files, with its configuration and TSDB under the
//! cluster's run directory. It is started as one of the cluster's processes, so it is killed
//! by pid with the cluster (or when the handle drops) and reaped if the test process dies.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::control_plane::ControlPlane;
use crate::error::{Error, Result};
use crate::process::ManagedProcess;
use crate::slot;
use crate::wait::{DEFAULT_TIMEOUT, wait_for};

/// What the server scrapes and evaluates.
#[derive(Debug, Clone)]
pub struct PrometheusConfig {
    /// `(job name, address)` of each target, scraped at `/metrics` over plain HTTP.
    pub targets: Vec<(String, SocketAddr)>,
    /// Rule files to load (`rule_files:`).
    pub rule_files: Vec<PathBuf>,
    /// How often targets are scraped and rules evaluated.
    pub interval: Duration,
}

impl PrometheusConfig {
    /// Scrapes `targets` every second, with no rules.
    pub fn new(targets: Vec<(String, SocketAddr)>) -> Self {
        Self {
            targets,
            rule_files: Vec::new(),
            interval: Duration::from_secs(1),
        }
    }

    #[must_use]
    pub fn with_rule_files(mut self, files: Vec<PathBuf>) -> Self {
        self.rule_files = files;
        self
    }

    /// The `prometheus.yml` of this configuration.
    fn to_yaml(&self) -> String {
        let interval = format!("{}ms", self.interval.as_millis());
        let scrape_configs: Vec<Value> = self
            .targets
            .iter()
            .map(|(job, address)| {
                serde_json::json!({
                    "job_name": job,
                    "static_configs": [{"targets": [address.to_string()]}],
                })
            })
            .collect();
        let config = serde_json::json!({
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": self.rule_files,
            "scrape_configs": scrape_configs,
        });
        serde_yaml::to_string(&config).unwrap_or_default()
    }
}

/// One alert as `/api/v1/alerts` lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct Alert {
    pub labels: std::collections::BTreeMap<String, String>,
    /// `pending` or `firing`.
    pub state: String,
}

/// One rule's evaluation health as `/api/v1/rules` reports it.
#[derive(Debug, Clone, Deserialize)]
pub struct RuleHealth {
    pub name: String,
    /// `ok`, `err` or `unknown` (not evaluated yet).
    pub health: String,
    #[serde(default, rename = "lastError")]
    pub last_error: String,
}

/// A running Prometheus server; killed when dropped.
#[derive(Debug)]
pub struct Prometheus {
    process: ManagedProcess,
    url: String,
    http: reqwest::Client,
}

impl Prometheus {
    /// Writes the configuration under `<run dir>/prometheus/`, starts the server and waits
    /// until it is ready (`/-/ready`).
    pub async fn start(cluster: &ControlPlane, config: &PrometheusConfig) -> Result<Self> {
        let dir = cluster.run_dir().join("prometheus");
        std::fs::create_dir_all(dir.join("data"))
            .map_err(Error::io(format!("creating {}", dir.display())))?;
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config.to_yaml())
            .map_err(Error::io(format!("writing {}", config_file.display())))?;
        let [port] = slot::free_ports()?;
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=info");
        let process = cluster
            .spawn("prometheus", command)
            .map_err(|error| match error {
                Error::Io { source, .. } => Error::Io {
                    what: "starting prometheus (Debian's prometheus package: make e2e-packages)"
                        .into(),
                    source,
                },
                other => other,
            })?;
        let server = Self {
            process,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        let ready = format!("{}/-/ready", server.url);
        wait_for("Prometheus to be ready", DEFAULT_TIMEOUT, || async {
            match server.http.get(&ready).send().await {
                Ok(response) if response.status().is_success() => Ok(()),
                Ok(response) => Err(response.status().to_string()),
                Err(error) => Err(error.to_string()),
            }
        })
        .await?;
        Ok(server)
    }

    /// Its base URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn process(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }

    /// Evaluates `expr` now (`/api/v1/query`) and returns the result's series (samples of a
    /// vector, or one scalar); an expression Prometheus refuses is an error naming it.
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>> {
        let data = self
            .api("api/v1/query", &[("query", expr)], &format!("query {expr}"))
            .await?;
        Ok(match &data["result"] {
            Value::Array(series) => series.clone(),
            Value::Null => Vec::new(),
            scalar => vec![scalar.clone()],
        })
    }

    /// The alerts that are pending or firing.
    pub async fn alerts(&self) -> Result<Vec<Alert>> {
        let data = self.api("api/v1/alerts", &[], "listing alerts").await?;
        serde_json::from_value(data["alerts"].clone()).map_err(|error| Error::Http {
            what: "listing alerts".into(),
            reason: error.to_string(),
        })
    }

    /// Every loaded rule (recording and alerting) with its evaluation health.
    pub async fn rules(&self) -> Result<Vec<RuleHealth>> {
        let data = self.api("api/v1/rules", &[], "listing rules").await?;
        let mut rules = Vec::new();
        for group in data["groups"].as_array().into_iter().flatten() {
            let listed: Vec<RuleHealth> =
                serde_json::from_value(group["rules"].clone()).map_err(|error| Error::Http {
                    what: "listing rules".into(),
                    reason: error.to_string(),
                })?;
            rules.extend(listed);
        }
        Ok(rules)
    }

    /// Calls the HTTP API and returns its `data`, or the error it answered.
    async fn api(&self, path: &str, params: &[(&str, &str)], what: &str) -> Result<Value> {
        let failed = |reason: String| Error::Http {
            what: what.to_owned(),
            reason,
        };
        let url = reqwest::Url::parse_with_params(&format!("{}/{path}", self.url), params)
            .map_err(|error| failed(error.to_string()))?;
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|error| failed(error.to_string()))?;
        let body: Value = response
            .json()
            .await
            .map_err(|error| failed(error.to_string()))?;
        if body["status"] == "success" {
            Ok(body["data"].clone())
        } else {
            Err(failed(format!("{}: {}", body["errorType"], body["error"])))
        }
    }
}
