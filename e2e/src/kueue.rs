//! Kueue, the closest peer, run out of cluster against a harness control plane, so a bench can
//! measure gpuqueue and Kueue on the same nodes with the same pods.
//!
//! The binary, its CRDs and its webhook manifest come from the module `e2e/tools/kueue/` pins,
//! built by `e2e/scripts/build-tools.sh --peers` (linked into the binary directory as `kueue`
//! and `kueue-config/`); nothing of Kueue is copied into the repository. Kueue serves its
//! webhooks on loopback with a certificate made here, and the webhook configurations from its
//! manifest are rewritten to call it by URL.
//!
//! With its internal certificate management off, Kueue reads a metrics certificate from the
//! fixed path `/etc/kueue/metrics/certs/` and exits without one, even with metrics off. It runs
//! in a private mount namespace with an overlay on `/etc` holding that certificate, so the
//! host's `/etc` is never touched; that needs root (`CAP_SYS_ADMIN`), and [`Kueue::start`]
//! says so plainly where it is missing.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ObjectMeta, PostParams,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::apply::{apply_yaml, install_crds};
use crate::control_plane::ControlPlane;
use crate::error::{Error, Result};
use crate::pods::gpu_pod;
use crate::process::{ManagedProcess, send_signal};
use crate::slot;
use crate::wait::wait_for;

/// Kueue's namespace (its configuration's `namespace`; its webhooks leave it alone).
pub const KUEUE_NAMESPACE: &str = "kueue-system";
/// The label that puts a pod in a Kueue `LocalQueue`.
pub const QUEUE_NAME_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The scheduling gate Kueue's pod webhook adds and removes on admission.
pub const KUEUE_GATE: &str = "kueue.x-k8s.io/admission";

/// The binary and the module's `config/components` folder, as build-tools.sh links them.
const BINARY: &str = "kueue";
const CONFIG_DIR: &str = "kueue-config";
/// Webhooks kept from the manifest: pods, Deployments (their pods are Kueue pods) and Kueue's
/// own objects. The others serve integrations whose CRDs this cluster does not have.
const KEPT_WEBHOOK_PATHS: &[&str] = &["-v1-pod", "-apps-v1-deployment", "-kueue-x-k8s-io-"];
/// Start-up (CRDs, webhook server, first reconcile) on a loaded 2-core machine.
const STARTUP_TIMEOUT: Duration = Duration::from_mins(2);

/// How to run Kueue.
#[derive(Debug, Clone)]
pub struct KueueConfig {
    /// Client QPS and burst towards the API server (the operator's are unthrottled in effect).
    pub qps: u32,
    pub burst: u32,
    /// Kueue's `--v` log level.
    pub verbosity: u8,
}

impl Default for KueueConfig {
    fn default() -> Self {
        // kube-scheduler runs with 1000/1000 here; Kueue gets the same.
        Self {
            qps: 1000,
            burst: 1000,
            verbosity: 2,
        }
    }
}

/// One tenant as Kueue objects: a ClusterQueue in the cohort and a LocalQueue of the same name
/// in its namespace (README, "How it maps to Volcano and Kueue").
#[derive(Debug, Clone)]
pub struct KueueTenant {
    pub name: String,
    pub namespace: String,
    /// gpuqueue's `guaranteed`.
    pub nominal_quota: usize,
    /// gpuqueue's `burstable`.
    pub borrowing_limit: usize,
}

/// A running Kueue; dropping it removes its webhook configurations (they fail closed) and kills
/// its process group.
pub struct Kueue {
    client: Client,
    process: Option<ManagedProcess>,
    webhooks: Vec<String>,
}

impl Kueue {
    /// Why Kueue cannot run here, if it cannot: not built (`build-tools.sh --peers`), or no
    /// private mount namespace. Tests skip with this message.
    pub fn unavailable(bin_dir: &Path) -> Option<String> {
        if !bin_dir.join(BINARY).exists() || !bin_dir.join(CONFIG_DIR).exists() {
            return Some(format!(
                "Kueue is not built in {}: run `e2e/scripts/build-tools.sh --peers` (about \
                 280 CPU-seconds and 1.9 GB of memory once)",
                bin_dir.display()
            ));
        }
        let probe = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "true"])
            .output();
        match probe {
            Ok(output) if output.status.success() => None,
            Ok(output) => Some(format!(
                "Kueue needs a private mount namespace for its fixed metrics-certificate path \
                 /etc/kueue/metrics/certs (run as root with CAP_SYS_ADMIN); `unshare --mount` \
                 said: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )),
            Err(e) => Some(format!(
                "Kueue needs `unshare` (util-linux) for a private mount namespace: {e}"
            )),
        }
    }

    /// Installs Kueue's CRDs and webhooks on `cluster`, starts it, and returns once its
    /// webhook gates a labelled pod (a dry run) and it reports ready.
    pub async fn start(cluster: &ControlPlane, config: &KueueConfig) -> Result<Self> {
        if let Some(reason) = Self::unavailable(cluster.bin_dir()) {
            return Err(Error::Build(reason));
        }
        let client = cluster.client();
        let components = cluster.bin_dir().join(CONFIG_DIR);
        install_crds(&client, &components.join("crd/bases")).await?;
        create_namespace(&client).await?;

        let dir = cluster.run_dir().join("kueue");
        let [webhook_port, health_port] = slot::free_ports()?;
        let ca = write_certificates(&dir)?;
        let config_file = write_configuration(&dir, config, webhook_port, health_port)?;
        let mut kueue = Self {
            client: client.clone(),
            process: None,
            webhooks: Vec::new(),
        };
        kueue.webhooks = install_webhooks(&client, &components, webhook_port, &ca).await?;
        let command = in_private_etc(
            &dir,
            &cluster.bin_dir().join(BINARY),
            &[
                format!("--config={}", config_file.display()),
                format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
                // The on-demand visibility API needs the aggregation layer, which is not wired.
                "--feature-gates=VisibilityOnDemand=false".to_owned(),
                format!("--zap-log-level={}", config.verbosity),
            ],
        );
        kueue.process = Some(cluster.spawn("kueue", command)?);
        kueue.wait_ready(health_port).await?;
        Ok(kueue)
    }

    /// Installs one ResourceFlavor, one Cohort, and per tenant a ClusterQueue of
    /// `nvidia.com/gpu` (everything lendable, reclaim within the cohort from any borrower, no
    /// preemption inside the queue) and its LocalQueue. Returns once every ClusterQueue is
    /// Active.
    pub async fn install_queues(&self, tenants: &[KueueTenant]) -> Result<()> {
        let mut yaml = String::from(
            "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: default}\n---\n\
             apiVersion: kueue.x-k8s.io/v1beta2\nkind: Cohort\nmetadata: {name: gpuqueue-e2e}\n",
        );
        for t in tenants {
            let _ = write!(
                yaml,
                "---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata: {{name: {name}}}\nspec:\n  cohortName: gpuqueue-e2e\n  namespaceSelector: {{}}\n  preemption: {{reclaimWithinCohort: Any, withinClusterQueue: Never}}\n  resourceGroups:\n    - coveredResources: [nvidia.com/gpu]\n      flavors:\n        - name: default\n          resources:\n            - {{name: nvidia.com/gpu, nominalQuota: {nominal}, borrowingLimit: {borrowing}}}\n---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec: {{clusterQueue: {name}}}\n",
                name = t.name,
                namespace = t.namespace,
                nominal = t.nominal_quota,
                borrowing = t.borrowing_limit,
            );
        }
        apply_yaml(&self.client, &yaml, None).await?;
        let gvk = GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "ClusterQueue");
        let queues: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &ApiResource::from_gvk(&gvk));
        for t in tenants {
            wait_for(
                format!("ClusterQueue {} to be Active", t.name),
                STARTUP_TIMEOUT,
                || async {
                    let queue = queues.get(&t.name).await.map_err(|e| e.to_string())?;
                    let active = queue.data["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Active" && c["status"] == "True");
                    if active {
                        Ok(())
                    } else {
                        Err(queue.data["status"].to_string())
                    }
                },
            )
            .await?;
        }
        Ok(())
    }

    /// The running process (its log, its pid for CPU accounting).
    pub fn process(&self) -> Option<&ManagedProcess> {
        self.process.as_ref()
    }

    /// Removes the webhook configurations, then stops the process group.
    pub async fn stop(mut self) {
        delete_webhooks(&self.client, &self.webhooks).await;
        self.webhooks.clear();
        self.kill();
    }

    fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            // `unshare --fork` and `sh` sit above Kueue: kill the whole group, then reap.
            if let Ok(pid) = i32::try_from(process.pid()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            send_signal(process.pid(), nix::sys::signal::Signal::SIGKILL);
            process.kill();
        }
    }

    /// `/readyz` answers ok, and the pod webhook gates a labelled pod (a dry run, so nothing
    /// stays behind).
    async fn wait_ready(&mut self, health_port: u16) -> Result<()> {
        let url = format!("http://127.0.0.1:{health_port}/readyz");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let mut probe = gpu_pod("kueue-probe", "nvidia.com/gpu", 1);
        probe
            .metadata
            .labels
            .get_or_insert_default()
            .insert(QUEUE_NAME_LABEL.to_owned(), "kueue-probe".to_owned());
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        wait_for("Kueue to be ready and gate pods", STARTUP_TIMEOUT, || {
            let (url, pods, probe, dry_run) =
                (url.clone(), pods.clone(), probe.clone(), dry_run.clone());
            async move {
                let ready = http_get(&url).await?;
                if ready.trim() != "ok" {
                    return Err(format!("/readyz: {ready}"));
                }
                let created = pods
                    .create(&dry_run, &probe)
                    .await
                    .map_err(|e| e.to_string())?;
                let gated = created
                    .spec
                    .and_then(|s| s.scheduling_gates)
                    .is_some_and(|gates| gates.iter().any(|g| g.name == KUEUE_GATE));
                if gated {
                    Ok(())
                } else {
                    Err("the pod webhook does not gate pods yet".to_owned())
                }
            }
        })
        .await
        // If Kueue exited, its log says why better than the timeout does.
        .map_err(
            |e| match self.process.as_mut().map(ManagedProcess::ensure_running) {
                Some(Err(exited)) => exited,
                _ => e,
            },
        )
    }
}

impl Drop for Kueue {
    fn drop(&mut self) {
        // Without `stop` (a failing test) the webhook configurations stay and fail closed, until
        // the cluster, which is disposable, stops too.
        self.kill();
    }
}

impl std::fmt::Debug for Kueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kueue")
            .field("process", &self.process)
            .field("webhooks", &self.webhooks)
            .finish_non_exhaustive()
    }
}

async fn http_get(url: &str) -> Result<String, String> {
    // A plain HTTP/1.0 GET: the health endpoint is loopback HTTP, and the harness has no
    // HTTP client of its own.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split_once('/'))
        .ok_or_else(|| format!("not an http URL: {url}"))?;
    let mut stream = tokio::net::TcpStream::connect(address.0)
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(format!("GET /{} HTTP/1.0\r\n\r\n", address.1).as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    Ok(response
        .split_once("\r\n\r\n")
        .map_or(response.as_str(), |(_, body)| body)
        .to_owned())
}

async fn create_namespace(client: &Client) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(KUEUE_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
        Err(e) => Err(Error::kube(format!("creating namespace {KUEUE_NAMESPACE}"))(e)),
    }
}

/// A CA and a serving certificate for 127.0.0.1 signed by it, in `dir/certs/` (the webhook's
/// `certDir`) and in the overlay's `kueue/metrics/certs/`; returns the CA's PEM.
fn write_certificates(dir: &Path) -> Result<String> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "gpuqueue-e2e Kueue CA");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kueue-webhook");
    let certificate = params.signed_by(&key, &issuer)?;
    for certs in [dir.join("certs"), dir.join("etc-upper/kueue/metrics/certs")] {
        std::fs::create_dir_all(&certs)
            .map_err(Error::io(format!("creating {}", certs.display())))?;
        write(&certs.join("tls.crt"), &certificate.pem())?;
        write(&certs.join("tls.key"), &key.serialize_pem())?;
    }
    Ok(ca.pem())
}

/// Kueue's configuration (v1beta2): webhook on loopback with our certificate, no leader
/// election, no internal certificate management, metrics off, the shipped controller
/// concurrency, the pod and Deployment integrations, and kube-system and its own namespace
/// left alone.
fn write_configuration(
    dir: &Path,
    config: &KueueConfig,
    webhook_port: u16,
    health_port: u16,
) -> Result<PathBuf> {
    let file = dir.join("config.yaml");
    let configuration = json!({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": format!("127.0.0.1:{health_port}")},
        "metrics": {"bindAddress": "0"},
        "webhook": {
            "host": "127.0.0.1",
            "port": webhook_port,
            "certDir": dir.join("certs"),
        },
        "leaderElection": {"leaderElect": false},
        "internalCertManagement": {"enable": false},
        "clientConnection": {"qps": config.qps, "burst": config.burst},
        // As its install ships them (config/components/manager/controller_manager_config.yaml);
        // controller-runtime's default is one worker per controller.
        "controller": {"groupKindConcurrency": {
            "Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 10,
            "LocalQueue.kueue.x-k8s.io": 5, "Cohort.kueue.x-k8s.io": 1,
            "ClusterQueue.kueue.x-k8s.io": 5, "ResourceFlavor.kueue.x-k8s.io": 1,
        }},
        "managedJobsNamespaceSelector": excluded_namespaces(),
        "integrations": {"frameworks": ["pod", "deployment"]},
    });
    write(
        &file,
        &serde_yaml::to_string(&configuration).map_err(|e| Error::Manifest {
            what: "Kueue's configuration".to_owned(),
            reason: e.to_string(),
        })?,
    )?;
    Ok(file)
}

/// kube-system and Kueue's own namespace, as its install leaves them out.
fn excluded_namespaces() -> Value {
    json!({"matchExpressions": [{
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": ["kube-system", KUEUE_NAMESPACE],
    }]})
}

/// The webhooks of Kueue's manifest that this cluster needs, each calling
/// `https://127.0.0.1:<port><path>` with `ca`; returns the configurations' names.
async fn install_webhooks(
    client: &Client,
    components: &Path,
    port: u16,
    ca: &str,
) -> Result<Vec<String>> {
    let path = components.join("webhook/manifests.yaml");
    let text =
        std::fs::read_to_string(&path).map_err(Error::io(format!("reading {}", path.display())))?;
    let mut names = Vec::new();
    let mut yaml = String::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let mut object = Value::deserialize(document).map_err(|e| Error::Manifest {
            what: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let name = format!(
            "kueue-{}",
            object["metadata"]["name"].as_str().unwrap_or("webhooks")
        );
        object["metadata"] = json!({"name": name});
        let webhooks = object["webhooks"].as_array_mut().map(std::mem::take);
        let kept: Vec<Value> = webhooks
            .into_iter()
            .flatten()
            .filter_map(|mut webhook| {
                let hook_path = webhook["clientConfig"]["service"]["path"]
                    .as_str()?
                    .to_owned();
                KEPT_WEBHOOK_PATHS
                    .iter()
                    .any(|kept| hook_path.contains(kept))
                    .then(|| {
                        webhook["clientConfig"] = json!({
                            "url": format!("https://127.0.0.1:{port}{hook_path}"),
                            "caBundle": k8s_openapi::ByteString(ca.as_bytes().to_vec()),
                        });
                        webhook["namespaceSelector"] = excluded_namespaces();
                        webhook
                    })
            })
            .collect();
        object["webhooks"] = Value::Array(kept);
        names.push(name);
        yaml.push_str("---\n");
        yaml.push_str(
            &serde_yaml::to_string(&object).map_err(|e| Error::Manifest {
                what: path.display().to_string(),
                reason: e.to_string(),
            })?,
        );
    }
    apply_yaml(client, &yaml, None).await?;
    Ok(names)
}

async fn delete_webhooks(client: &Client, names: &[String]) {
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    for name in names {
        // Each name is one of the two kinds; the other answers 404.
        let _ = mutating.delete(name, &DeleteParams::default()).await;
        let _ = validating.delete(name, &DeleteParams::default()).await;
    }
}

/// `program args` in a private mount namespace where `/etc` is an overlay whose upper layer
/// (`dir/etc-upper`) holds `kueue/metrics/certs/`. `unshare --fork --kill-child` stays the
/// parent, so the harness's record of its command line matches while it lives, and Kueue dies
/// with it; the process group is Kueue's own, for a clean kill.
fn in_private_etc(dir: &Path, program: &Path, args: &[String]) -> Command {
    let (upper, work) = (dir.join("etc-upper"), dir.join("etc-work"));
    let _ = std::fs::create_dir_all(&work);
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--fork", "--kill-child", "--"])
        .arg("sh")
        .arg("-c")
        .arg(r#"mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && shift 2 && exec "$@""#)
        .arg("kueue-private-etc")
        .arg(upper)
        .arg(work)
        .arg(program)
        .args(args);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    command
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(Error::io(format!("writing {}", path.display())))
}
