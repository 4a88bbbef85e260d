//! The operator as the end-to-end tests run it: the real `gpuqueue-operator` binary as a
//! process against the test's control plane, as its ServiceAccount with the RBAC of `config/`,
//! and with everything else `config/` ships but the Deployment and its Services installed as
//! shipped: the admission policies, and the webhook configuration (pointed at the process by
//! URL instead of a Service, the one change, since nothing runs in-cluster here).

#![allow(dead_code)] // each test file uses its own part of these helpers

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use gpuqueue_api::{ADMISSION_GATE, annotations, v1alpha1::GpuQueue};
use gpuqueue_e2e::{
    ControlPlane, DEFAULT_TIMEOUT, ManagedProcess, UserAccess, apply_yaml, describe_pod,
    install_crds, node_of, repo_root, target_dir, wait_for, without_crate_env,
};
use k8s_openapi::api::core::v1::{Event, Pod, PodSchedulingGate};
use kube::{
    Client,
    api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde::Deserialize;
use serde_json::json;

/// The operator's namespace, as `config/` installs it.
pub const OPERATOR_NAMESPACE: &str = "gpuqueue-system";

/// A lease short enough that failover tests finish quickly.
const LEASE_DURATION: &str = "6s";
const LEASE_GRACE: &str = "2s";

/// Names a prebuilt `gpuqueue-operator` to run instead of building this checkout's, so that a
/// script can compare two builds on one machine, run after run, without rebuilding between them.
const OPERATOR_BINARY_ENV: &str = "GPUQUEUE_OPERATOR_BINARY";

/// The `gpuqueue-operator` binary, built once per test binary (a no-op when up to date): the
/// debug build for tests, the release build for benchmarks; or [`OPERATOR_BINARY_ENV`]'s.
pub fn operator_binary(release: bool) -> &'static Path {
    static DEBUG: OnceLock<PathBuf> = OnceLock::new();
    static RELEASE: OnceLock<PathBuf> = OnceLock::new();
    static PREBUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    if let Some(prebuilt) =
        PREBUILT.get_or_init(|| std::env::var_os(OPERATOR_BINARY_ENV).map(PathBuf::from))
    {
        return prebuilt;
    }
    let (cell, profile) = if release {
        (&RELEASE, "release")
    } else {
        (&DEBUG, "debug")
    };
    cell.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut command = Command::new(cargo);
        command.args(["build", "--quiet", "--locked", "-p", "gpuqueue-operator"]);
        if release {
            command.arg("--release");
        }
        let status = without_crate_env(&mut command)
            .current_dir(repo_root())
            .status()
            .expect("running cargo build for gpuqueue-operator");
        assert!(status.success(), "building gpuqueue-operator failed");
        target_dir().join(profile).join("gpuqueue-operator")
    })
}

/// Builds `kubectl-gpuqueue` and `gpuqueue-operator` in one command (the e2e crate cannot name
/// another package's binaries; one command for both, as `make cluster-up` runs it, so no test
/// rebuilds what another built); returns the folder that holds both.
pub fn cli_binaries() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let status = without_crate_env(&mut Command::new(env!("CARGO")))
            .args([
                "build",
                "--quiet",
                "--locked",
                "-p",
                "gpuqueue-cli",
                "-p",
                "gpuqueue-operator",
                // `--bin` selects across every package named, so each binary is named.
                "--bin",
                "kubectl-gpuqueue",
                "--bin",
                "gpuqueue-operator",
            ])
            .current_dir(repo_root())
            .status()
            .unwrap();
        assert!(status.success(), "building the CLI and the operator failed");
        target_dir().join("debug")
    })
}

/// Runs `command`, fails the test with its output unless it succeeds, and returns the output.
pub fn run_ok(command: &mut Command) -> Output {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `kubectl` as a user who installed the plugin runs it: the folder of `kubectl-gpuqueue`
/// ([`cli_binaries`]) first on the PATH, then the cluster's binaries, then the rest.
pub fn kubectl_with_plugin(cluster: &ControlPlane) -> Command {
    let mut path = OsString::from(cli_binaries());
    path.push(":");
    path.push(cluster.bin_dir());
    if let Some(rest) = std::env::var_os("PATH") {
        path.push(":");
        path.push(rest);
    }
    let mut kubectl = cluster.kubectl();
    kubectl.env("PATH", path);
    kubectl
}

/// Waits until the operator whose metrics listen on `metrics` answers 200 on `/readyz`; `log`
/// is its log, named in the failure.
pub async fn wait_readyz(what: &str, metrics: impl std::fmt::Display, log: &Path) {
    let url = format!("http://{metrics}/readyz");
    wait_for(what, DEFAULT_TIMEOUT, || {
        let url = url.clone();
        async move {
            match reqwest::get(&url).await {
                Ok(response) if response.status().is_success() => Ok(()),
                Ok(response) => Err(response.text().await.unwrap_or_default()),
                Err(error) => Err(format!("{error}; log {}", log.display())),
            }
        }
    })
    .await
    .unwrap();
}

/// A free loopback port, never one handed out before in this test binary.
pub fn free_port() -> u16 {
    gpuqueue_e2e::free_port().expect("no free port")
}

/// The operator's ServiceAccount, as `config/rbac/` creates it; the operator runs as it.
pub const OPERATOR_ACCOUNT: &str = "gpuqueue-operator";

/// The parts of `config/kustomization.yaml` not installed here: the CRD comes from `crds/`
/// (the same files; a test keeps them equal), and `manager/` runs the operator in-cluster,
/// where the tests run it as a process instead.
const NOT_INSTALLED: &[&str] = &["crd", "manager"];

/// Installs what `config/` ships before the operator starts: the CRD, its namespace, its RBAC,
/// the admission policies, and its webhook configuration calling
/// `https://127.0.0.1:<webhook_port>/mutate-pods`. Returns once the policies are enforced.
pub async fn install(cluster: &ControlPlane, webhook_port: u16) {
    let client = cluster.client();
    install_crds(&client, &repo_root().join("crds"))
        .await
        .unwrap();
    let config = repo_root().join("config");
    for file in kustomized_files(&config) {
        if NOT_INSTALLED
            .iter()
            .any(|part| file.starts_with(config.join(part)))
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let mut yaml = String::new();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let mut object = serde_json::Value::deserialize(document).unwrap();
            let webhooks = object.get_mut("webhooks").and_then(|w| w.as_array_mut());
            for webhook in webhooks.into_iter().flatten() {
                webhook["clientConfig"] =
                    json!({"url": format!("https://127.0.0.1:{webhook_port}/mutate-pods")});
            }
            yaml.push_str("---\n");
            yaml.push_str(&serde_yaml::to_string(&object).unwrap());
        }
        apply_yaml(&client, &yaml, None)
            .await
            .unwrap_or_else(|error| panic!("applying {}: {error}", file.display()));
    }
    policies_enforced(&client).await;
}

/// The files a kustomization lists under `resources`, folders followed into their own
/// `kustomization.yaml`, in order.
pub fn kustomized_files(dir: &Path) -> Vec<PathBuf> {
    let kustomization: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap())
            .unwrap();
    let mut files = Vec::new();
    for resource in kustomization["resources"].as_array().into_iter().flatten() {
        let path = dir.join(resource.as_str().unwrap());
        if path.is_dir() {
            files.extend(kustomized_files(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// Waits until the API server enforces the pod policies of `config/policy/`. It loads each
/// policy, and the GpuQueues the creation policy reads, a moment after they are created, and
/// allows everything a policy it has not loaded would refuse, so each wait looks for a refusal:
/// a probe queue claims a probe namespace until a dry run creating a GPU pod with
/// `spec.nodeName` there is refused by the creation policy, and a dry run removing a CPU pod's
/// admission gate in `default` (which no webhook sees) is refused by the update policy.
async fn policies_enforced(client: &Client) {
    const PROBE: &str = "gpuqueue-policy-probe";
    apply_yaml(
        client,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {PROBE}\n---\n{}",
            queue_yaml(PROBE, &[PROBE], 1, 0)
        ),
        None,
    )
    .await
    .unwrap();
    let probe = |bound_gpu_pod: bool| -> Pod {
        let mut container = json!({"name": "probe", "image": "registry.k8s.io/pause:3.10"});
        let mut spec = json!({});
        if bound_gpu_pod {
            container["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
            spec["nodeName"] = json!(PROBE);
        }
        spec["containers"] = json!([container]);
        serde_json::from_value(json!({"metadata": {"name": PROBE}, "spec": spec})).unwrap()
    };
    let dry_run_create = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let probe_pods: Api<Pod> = Api::namespaced(client.clone(), PROBE);
    wait_for(
        "the creation policy to read GpuQueues",
        DEFAULT_TIMEOUT,
        || async {
            match probe_pods.create(&dry_run_create, &probe(true)).await {
                Err(kube::Error::Api(status))
                    if status.message.contains("spec.nodeName is refused") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    let queues: Api<GpuQueue> = Api::all(client.clone());
    queues
        .delete(PROBE, &DeleteParams::default())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &gated(probe(false)))
        .await
        .unwrap();
    let ungate: Patch<serde_json::Value> = Patch::Json(
        serde_json::from_value(json!([{"op": "remove", "path": "/spec/schedulingGates"}])).unwrap(),
    );
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    wait_for(
        "the pod policies to be enforced",
        DEFAULT_TIMEOUT,
        || async {
            match pods.patch(PROBE, &dry_run, &ungate).await {
                Err(kube::Error::Api(status))
                    if status.message.contains("gpuqueue.io/admission") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    pods.delete(PROBE, &DeleteParams::default()).await.unwrap();
}

/// Credentials of the operator's ServiceAccount (after [`install`]), to act as the operator.
pub async fn operator_access(cluster: &ControlPlane) -> UserAccess {
    cluster
        .service_account_access(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT)
        .await
        .unwrap()
}

/// How to start one operator process.
#[derive(Debug, Clone)]
pub struct Options {
    /// Its Lease identity, and the name of its log file.
    pub identity: String,
    /// The kubeconfig it uses; its ServiceAccount's by default (see [`install`]).
    pub kubeconfig: Option<PathBuf>,
    pub webhook_port: u16,
    /// Run the release build (benchmarks).
    pub release: bool,
    /// The log filter; debug for the operator's own logs by default.
    pub log_filter: String,
    /// Extra environment variables (such as the reclaim tests' crash hook).
    pub env: Vec<(String, String)>,
    /// `--lease-duration` and `--lease-grace`: short by default, so that failover tests
    /// finish quickly.
    pub lease: (&'static str, &'static str),
    /// More flags, after the harness's own.
    pub args: Vec<String>,
}

impl Options {
    pub fn new(identity: &str, webhook_port: u16) -> Self {
        Self {
            identity: identity.to_owned(),
            kubeconfig: None,
            webhook_port,
            release: false,
            log_filter: "info,gpuqueue_operator=debug".to_owned(),
            env: Vec::new(),
            lease: (LEASE_DURATION, LEASE_GRACE),
            args: Vec::new(),
        }
    }
}

/// A running operator process; killed when dropped.
pub struct Operator {
    pub process: ManagedProcess,
    pub metrics: SocketAddr,
    pub identity: String,
}

impl Operator {
    /// Starts the operator and waits until it is ready (stores synced, webhook CA published).
    pub async fn start(cluster: &ControlPlane, options: Options) -> Self {
        let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        let kubeconfig = match options.kubeconfig.clone() {
            Some(kubeconfig) => kubeconfig,
            None => operator_access(cluster).await.kubeconfig,
        };
        let mut command = Command::new(operator_binary(options.release));
        command
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--namespace={OPERATOR_NAMESPACE}"))
            .arg(format!("--metrics-addr={metrics}"))
            .arg(format!("--webhook-addr=127.0.0.1:{}", options.webhook_port))
            .arg("--webhook-extra-san=127.0.0.1")
            // Only the API server (with the harness's client certificate) may call the webhook.
            .arg(format!(
                "--webhook-client-ca={}",
                cluster.webhook_client_ca().display()
            ))
            .arg(format!("--lease-identity={}", options.identity))
            .arg(format!("--lease-duration={}", options.lease.0))
            .arg(format!("--lease-grace={}", options.lease.1))
            .arg(format!("--log-filter={}", options.log_filter))
            .args(&options.args)
            .env_remove("KUBECONFIG")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .envs(options.env.iter().map(|(k, v)| (k, v)));
        let process = cluster
            .spawn(&format!("operator-{}", options.identity), command)
            .unwrap();
        let mut operator = Self {
            process,
            metrics,
            identity: options.identity,
        };
        operator.wait_ready().await;
        operator
    }

    /// Waits for `/readyz` to answer 200.
    pub async fn wait_ready(&mut self) {
        let log = self.process.log_path().to_owned();
        wait_readyz("the operator to be ready", self.metrics, &log).await;
    }

    /// The text of `/metrics`.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.metrics))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The value of one metric line, such as `gpuqueue_leader`, if present.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let text = self.metrics().await;
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|value| value.parse().ok())
    }

    /// Whether this process acts as the leader.
    pub async fn is_leader(&self) -> bool {
        self.metric("gpuqueue_leader").await == Some(1.0)
    }

    /// Waits until this process acts as the leader.
    pub async fn wait_leading(&self) {
        let what = format!("{} to lead", self.identity);
        wait_for(&what, DEFAULT_TIMEOUT, || async {
            if self.is_leader().await {
                Ok(())
            } else {
                Err("not yet".to_owned())
            }
        })
        .await
        .unwrap();
    }
}

/// Applies a GpuQueue from YAML, as an admin would (field manager `kubectl`).
pub async fn apply_queue(client: &Client, yaml: &str) {
    apply_yaml(client, yaml, None).await.unwrap();
}

/// A one-resource queue of `nvidia.com/gpu` claiming `namespaces`.
pub fn queue_yaml(name: &str, namespaces: &[&str], guaranteed: u32, burstable: u32) -> String {
    format!(
        "apiVersion: gpuqueue.io/v1alpha1\nkind: GpuQueue\nmetadata:\n  name: {name}\nspec:\n  namespaces: [{}]\n  resources:\n    - name: nvidia.com/gpu\n      guaranteed: {guaranteed}\n      burstable: {burstable}\n",
        namespaces.join(", ")
    )
}

/// A pod gated by hand, as a tenant's tooling (or a test) may create it.
pub fn gated(mut pod: Pod) -> Pod {
    if let Some(spec) = pod.spec.as_mut() {
        spec.scheduling_gates = Some(vec![PodSchedulingGate {
            name: ADMISSION_GATE.to_owned(),
        }]);
    }
    pod
}

/// Creates `pod` in `pods`' namespace.
pub async fn create(pods: &Api<Pod>, pod: &Pod) {
    pods.create(&PostParams::default(), pod).await.unwrap();
}

/// Whether the pod still carries the admission gate.
pub fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.scheduling_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|gate| gate.name == ADMISSION_GATE))
}

/// An annotation of the pod.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Waits until the pod is bound to a node; returns it.
pub async fn bound(pods: &Api<Pod>, name: &str) -> Pod {
    gpuqueue_e2e::bound_pod(pods, name).await.unwrap()
}

/// Waits until the pod waits with a recorded reason; returns the reason.
pub async fn waiting_reason(pods: &Api<Pod>, name: &str) -> String {
    wait_for(
        format!("pod {name} to say why it waits"),
        DEFAULT_TIMEOUT,
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            match annotation(&pod, annotations::WAITING_REASON) {
                Some(reason) if is_gated(&pod) => Ok(reason.to_owned()),
                _ => Err(describe_pod(&pod)),
            }
        },
    )
    .await
    .unwrap()
}

/// Waits until `count` pods of the namespace are bound and the rest wait with a reason.
pub async fn settled(pods: &Api<Pod>, bound: usize, waiting: usize) -> Vec<Pod> {
    wait_for(
        format!("{bound} pods bound and {waiting} waiting with a reason"),
        DEFAULT_TIMEOUT,
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let has_reason =
                |p: &Pod| is_gated(p) && annotation(p, annotations::WAITING_REASON).is_some();
            let (b, w) = (
                list.items.iter().filter(|p| node_of(p).is_some()).count(),
                list.items.iter().filter(|p| has_reason(p)).count(),
            );
            if b == bound && w == waiting && list.items.len() == bound + waiting {
                Ok(list.items)
            } else {
                Err(format!(
                    "{b} bound, {w} waiting with a reason, {} pods",
                    list.items.len()
                ))
            }
        },
    )
    .await
    .unwrap()
}

/// Waits until the queue's status satisfies `check`; returns the queue.
pub async fn queue_status(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&GpuQueue) -> bool,
) -> GpuQueue {
    let queues: Api<GpuQueue> = Api::all(client.clone());
    wait_for(format!("queue {name}: {what}"), DEFAULT_TIMEOUT, || async {
        let queue = queues.get(name).await.map_err(|e| e.to_string())?;
        if check(&queue) {
            Ok(queue)
        } else {
            Err(format!(
                "status: {}",
                serde_json::to_string(&queue.status).unwrap()
            ))
        }
    })
    .await
    .unwrap()
}

/// The first resource row of a queue's status: (allocated, borrowed, lent, pending).
pub fn numbers(queue: &GpuQueue) -> Option<(i64, i64, i64, i64)> {
    let row = queue.status.as_ref()?.resources.first()?;
    Some((row.allocated, row.borrowed, row.lent, row.pending))
}

/// The status of a condition of a queue, such as `("True", "NamespaceConflict")`.
pub fn condition(queue: &GpuQueue, type_: &str) -> Option<(String, String)> {
    queue
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Events about the object `name` in `namespace` with `reason`, as kubectl shows them.
pub async fn events(client: &Client, namespace: &str, name: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let selector = format!("involvedObject.name={name},reason={reason}");
    events
        .list(&ListParams::default().fields(&selector))
        .await
        .unwrap()
        .items
}

/// Waits until an event with `reason` about `name` exists; returns its message.
pub async fn event(client: &Client, namespace: &str, name: &str, reason: &str) -> String {
    wait_for(
        format!("event {reason} on {name}"),
        DEFAULT_TIMEOUT,
        || async {
            let found = events(client, namespace, name, reason).await;
            found
                .first()
                .and_then(|e| e.message.clone())
                .ok_or_else(|| "no such event yet".to_owned())
        },
    )
    .await
    .unwrap()
}

/// Waits until `count` pods of the namespace run with an IP; returns them.
pub async fn all_running(pods: &Api<Pod>, count: usize) -> Vec<Pod> {
    wait_for(
        format!("{count} pods running with an IP"),
        DEFAULT_TIMEOUT,
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let running: Vec<Pod> = list
                .items
                .iter()
                .filter(|p| {
                    let status = p.status.as_ref();
                    status.and_then(|s| s.phase.as_deref()) == Some("Running")
                        && status.and_then(|s| s.pod_ip.as_ref()).is_some()
                        && p.metadata.deletion_timestamp.is_none()
                })
                .cloned()
                .collect();
            if running.len() == count && list.items.len() == count {
                Ok(running)
            } else {
                Err(list
                    .items
                    .iter()
                    .map(describe_pod)
                    .collect::<Vec<_>>()
                    .join("; "))
            }
        },
    )
    .await
    .unwrap()
}
