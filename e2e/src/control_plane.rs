//! One real control plane on loopback: etcd → kube-apiserver → kube-scheduler,
//! kube-controller-manager and KWOK, with fake GPU nodes.
//!
//! Start-up follows `shared/research/e2e-control-plane.md` §4.2, with the differences noted
//! where they are made. Each control plane has its own slot (ports, pod IP range, directory),
//! so tests may start several at once.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{
    Container, Namespace, Node, Pod, PodSpec, ServiceAccount, Toleration,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, RoleBinding, RoleRef, Subject,
};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::binaries;
use crate::error::{Error, Result};
use crate::namespace::TempNamespace;
use crate::nodes::GpuNode;
use crate::process::ManagedProcess;
use crate::slot::{self, ProcessRecord, Slot, State};
use crate::stages::{self, NodeBehaviour};

/// How long each start-up phase may take on a loaded machine before start-up fails.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(90);

/// Start-up attempts when another process takes a port we picked before a component binds it.
const STARTUP_ATTEMPTS: u32 = 3;

/// Controllers of kube-controller-manager the tests rely on: garbage collection and namespace
/// deletion (tests delete what they create), Deployments/ReplicaSets/Jobs (workloads create
/// pods), the disruption controller (PodDisruptionBudget status, which the Eviction API
/// reads) and ClusterRole aggregation (the built-in `view`, `edit` and `admin` roles are
/// empty without it). Node lifecycle stays off: KWOK sends no heartbeats it would expect.
pub const CONTROLLERS: &[&str] = &[
    "clusterrole-aggregation-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
    "disruption-controller",
    // DRA: creates the claims of ResourceClaimTemplates and deallocates a claim once no pod
    // uses it.
    "resourceclaim-controller",
];

/// What to start.
#[derive(Debug, Clone)]
pub struct ControlPlaneConfig {
    /// Names the log directory `target/e2e-logs/<name>/`; use the test's name.
    pub name: String,
    /// The fake nodes to create; [`GpuNode::default_set`] unless changed.
    pub nodes: Vec<GpuNode>,
    /// How the nodes run pods; [`NodeBehaviour::Kubelet`] with its default timing unless changed.
    pub node_behaviour: NodeBehaviour,
    /// Start kube-controller-manager with [`CONTROLLERS`] (on by default).
    pub controller_manager: bool,
    /// Where etcd's data, the PKI and kubeconfigs go; a per-slot temp directory by default.
    /// Removed when the control plane stops.
    pub run_dir: Option<PathBuf>,
    /// Where component logs go; `target/e2e-logs/<name>/` by default. Kept after a stop.
    pub log_dir: Option<PathBuf>,
    /// The components outlive this process (their own process group, not killed on drop);
    /// for `gpuqueue-e2e-cluster up`, stopped by [`ControlPlane::stop_detached`].
    pub detached: bool,
}

impl ControlPlaneConfig {
    /// The default cluster (four 8-GPU nodes and one MIG node, with controller manager).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            nodes: GpuNode::default_set(),
            node_behaviour: NodeBehaviour::default(),
            controller_manager: true,
            run_dir: None,
            log_dir: None,
            detached: false,
        }
    }

    /// Replaces the nodes.
    #[must_use]
    pub fn with_nodes(mut self, nodes: Vec<GpuNode>) -> Self {
        self.nodes = nodes;
        self
    }

    /// Replaces how the nodes run pods.
    #[must_use]
    pub fn with_node_behaviour(mut self, behaviour: NodeBehaviour) -> Self {
        self.node_behaviour = behaviour;
        self
    }
}

/// A running control plane. Dropping it kills its processes (only those) and removes its run
/// directory; if the current test is failing, the last lines of every log are printed first.
pub struct ControlPlane {
    name: String,
    slot: Slot,
    bin_dir: PathBuf,
    run_dir: PathBuf,
    log_dir: PathBuf,
    kubeconfig: PathBuf,
    api_server: String,
    client: Client,
    nodes: Vec<GpuNode>,
    components: Vec<ManagedProcess>,
    state: Mutex<State>,
    startup: Vec<(&'static str, Duration)>,
    detached: bool,
}

/// A service account's credentials, for tests of what a less privileged client may do.
#[derive(Clone)]
pub struct UserAccess {
    /// `system:serviceaccount:<namespace>:<name>`, as RBAC and audit see it.
    pub username: String,
    /// A kubeconfig file with the account's token (for spawned processes).
    pub kubeconfig: PathBuf,
    /// A client acting as the account.
    pub client: Client,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver, kube-scheduler, kube-controller-manager (if configured)
    /// and KWOK, creates the nodes and returns when every node is Ready.
    pub async fn start(config: ControlPlaneConfig) -> Result<Self> {
        // The build script may take minutes on a cold cache; keep it off the async threads.
        let bin_dir = tokio::task::spawn_blocking(|| binaries::bin_dir().map(Path::to_owned))
            .await
            .map_err(|e| Error::Build(e.to_string()))??;
        let mut attempt = 1;
        loop {
            // Boxed: a start's future is large, and every test awaits one.
            match Box::pin(Self::start_once(&config, &bin_dir)).await {
                Err(e) if e.is_port_clash() && attempt < STARTUP_ATTEMPTS => {
                    eprintln!(
                        "gpuqueue-e2e: {}: a port was taken meanwhile, retrying: {e}",
                        config.name
                    );
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(config: &ControlPlaneConfig, bin_dir: &Path) -> Result<Self> {
        let began = Instant::now();
        let mut startup = Vec::new();
        let slot = Slot::claim()?;
        let (run_dir, log_dir) = fresh_dirs(config, &slot)?;
        let pki = run_dir.join("pki");
        std::fs::create_dir_all(&pki).map_err(Error::io(format!("creating {}", pki.display())))?;
        let [etcd_port, etcd_peer_port, api_port] = slot::free_ports()?;
        let api_server = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = run_dir.join("kubeconfig");
        let mut launcher = Launcher {
            bin_dir,
            log_dir: &log_dir,
            slot: &slot,
            detached: config.detached,
            state: State {
                detached: config.detached,
                slot: slot.index(),
                api_server: api_server.clone(),
                kubeconfig: kubeconfig.clone(),
                run_dir: run_dir.clone(),
                log_dir: log_dir.clone(),
                bin_dir: bin_dir.to_owned(),
                processes: Vec::new(),
            },
            components: Vec::new(),
        };

        let etcd_url = launcher
            .start_etcd(&run_dir, etcd_port, etcd_peer_port)
            .await?;
        startup.push(("etcd", began.elapsed()));

        let token = write_credentials(&pki)?;
        write_webhook_client(&pki)?;
        write(&pki.join(AUDIT_POLICY), AUDIT_POLICY_YAML)?;
        let apiserver_started = Instant::now();
        let client = launcher
            .start_apiserver(&pki, &etcd_url, api_port, &api_server, &kubeconfig, &token)
            .await?;
        startup.push(("kube-apiserver", apiserver_started.elapsed()));

        let scheduler_config = write_scheduler_config(&run_dir, &kubeconfig)?;
        let rest_started = Instant::now();
        let stage_file = stages::stage_file(&config.node_behaviour, bin_dir, &run_dir)?;
        launcher.start_agents(config, &kubeconfig, &scheduler_config, &stage_file)?;
        launcher.create_nodes(&client, &config.nodes).await?;
        startup.push((
            "scheduler, controller manager, KWOK, nodes Ready",
            rest_started.elapsed(),
        ));
        let warm_started = Instant::now();
        launcher.warm_pod_ips(&client, &config.nodes).await?;
        startup.push(("KWOK's pod IP pool", warm_started.elapsed()));
        startup.push(("total", began.elapsed()));

        let Launcher {
            components, state, ..
        } = launcher;
        Ok(Self {
            name: config.name.clone(),
            slot,
            bin_dir: bin_dir.to_owned(),
            run_dir,
            log_dir,
            kubeconfig,
            api_server,
            client,
            nodes: config.nodes.clone(),
            components,
            state: Mutex::new(state),
            startup,
            detached: config.detached,
        })
    }

    /// A client with cluster-admin rights (`system:masters`). Like every client the harness
    /// makes, it does not retry 429/503 answers: tests see what the API server said.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The admin kubeconfig (for `kubectl` and processes a test starts).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's URL, `https://127.0.0.1:<port>`.
    pub fn api_server(&self) -> &str {
        &self.api_server
    }

    /// The directory of etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl
    /// and kwok.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// Where etcd's data, the PKI and kubeconfigs are; removed when the control plane stops.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// The CA (PEM) that signed the client certificate kube-apiserver presents to admission
    /// webhooks: give it to the operator as `--webhook-client-ca`.
    pub fn webhook_client_ca(&self) -> PathBuf {
        webhook_client_ca(&self.run_dir.join("pki"))
    }

    /// Where component logs (and logs of processes from [`Self::spawn`]) are written.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// etcd's client URL (`http://127.0.0.1:<port>`), for faults such as a compaction.
    pub fn etcd_url(&self) -> String {
        let state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state
            .processes
            .iter()
            .filter(|record| record.name == "etcd")
            .flat_map(|record| &record.argv)
            .find_map(|arg| arg.strip_prefix("--listen-client-urls="))
            .unwrap_or_default()
            .to_owned()
    }

    /// kube-apiserver's audit log: one JSON line (level `Metadata`) per eviction, pod deletion,
    /// binding and Deployment change, whoever asked, with its answer; what the invariant
    /// checker counts evictions from, and what benchmarks time on the API server's clock.
    pub fn audit_log_path(&self) -> PathBuf {
        self.log_dir.join(AUDIT_LOG)
    }

    /// The component processes (etcd, kube-apiserver, kube-scheduler, …), for benchmarks that
    /// tell where CPU time goes.
    pub fn components(&self) -> &[ManagedProcess] {
        &self.components
    }

    /// The nodes the cluster was started with.
    pub fn nodes(&self) -> &[GpuNode] {
        &self.nodes
    }

    /// The range KWOK assigns pod IPs from (inside 127.100.0.0/16, distinct per cluster).
    pub fn pod_cidr(&self) -> String {
        self.slot.pod_cidr()
    }

    /// How long each start-up phase took, last entry `total`.
    pub fn startup_times(&self) -> &[(&'static str, Duration)] {
        &self.startup
    }

    /// The start-up times on one line, for logs and the CLI.
    pub fn startup_summary(&self) -> String {
        self.startup
            .iter()
            .map(|(phase, took)| format!("{phase} {:.2}s", took.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Creates a namespace for one test; see [`TempNamespace`].
    pub async fn namespace(&self, prefix: &str) -> Result<TempNamespace> {
        TempNamespace::create(&self.client, prefix).await
    }

    /// A command with `KUBECONFIG` set to the admin kubeconfig and the binary directory first
    /// in `PATH` (so `kubectl` is the matching v1.36 one).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new(program);
        let mut path = OsString::from(self.bin_dir.as_os_str());
        if let Some(rest) = std::env::var_os("PATH") {
            path.push(":");
            path.push(rest);
        }
        command
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PATH", path);
        command
    }

    /// `kubectl` against this cluster.
    pub fn kubectl(&self) -> Command {
        self.command(self.bin_dir.join("kubectl"))
    }

    /// Starts `command` (from [`Self::command`], or with its own `KUBECONFIG`) as a process
    /// whose output goes to `<log dir>/<name>.log`. It is killed when the handle is dropped,
    /// and reaped with the cluster if the test process dies.
    pub fn spawn(&self, name: &str, command: Command) -> Result<ManagedProcess> {
        let log = self.log_dir.join(format!("{name}.log"));
        let record_argv = argv(&command);
        let process = ManagedProcess::spawn(name, command, &log, Stdio::null())?;
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.processes.push(ProcessRecord {
            name: name.to_owned(),
            pid: process.pid(),
            argv: record_argv,
        });
        self.slot.write_state(&state)?;
        Ok(process)
    }

    /// Credentials of service account `name` in namespace `gpuqueue-e2e-users`, bound to
    /// ClusterRole `cluster_role` (created if missing). For RBAC tests: the API server checks
    /// this account's requests like any other non-admin's.
    pub async fn user_with_cluster_role(
        &self,
        name: &str,
        cluster_role: &str,
    ) -> Result<UserAccess> {
        const NAMESPACE: &str = "gpuqueue-e2e-users";
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        create_if_missing(&namespaces, &namespace, "namespace").await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), NAMESPACE);
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        create_if_missing(&accounts, &account, "service account").await?;
        let bindings: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(format!("gpuqueue-e2e:{name}:{cluster_role}")),
                ..ObjectMeta::default()
            },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "ClusterRole".to_owned(),
                name: cluster_role.to_owned(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".to_owned(),
                name: name.to_owned(),
                namespace: Some(NAMESPACE.to_owned()),
                ..Subject::default()
            }]),
        };
        create_if_missing(&bindings, &binding, "cluster role binding").await?;
        let access = self.service_account_access(NAMESPACE, name).await?;
        self.wait_until_granted(&access.username, cluster_role)
            .await?;
        Ok(access)
    }

    /// A tenant as the product's users are: service account `tenant` in `namespace`, bound by a
    /// RoleBinding to the stock `edit` ClusterRole there and nothing else. Returns once the
    /// authorizer lets it patch pods in `namespace` (`edit` is aggregated by the controller
    /// manager, so its rules appear a moment after start).
    pub async fn tenant_with_edit(&self, namespace: &str) -> Result<UserAccess> {
        const NAME: &str = "tenant";
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(NAME.to_owned()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        create_if_missing(&accounts, &account, "service account").await?;
        let bindings: Api<RoleBinding> = Api::namespaced(self.client.clone(), namespace);
        let binding = RoleBinding {
            metadata: ObjectMeta {
                name: Some(format!("{NAME}-edit")),
                ..ObjectMeta::default()
            },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "ClusterRole".to_owned(),
                name: "edit".to_owned(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".to_owned(),
                name: NAME.to_owned(),
                namespace: Some(namespace.to_owned()),
                ..Subject::default()
            }]),
        };
        create_if_missing(&bindings, &binding, "role binding").await?;
        let access = self.service_account_access(namespace, NAME).await?;
        let reviews: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(access.username.clone()),
                resource_attributes: Some(ResourceAttributes {
                    resource: Some("pods".to_owned()),
                    namespace: Some(namespace.to_owned()),
                    verb: Some("patch".to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        crate::wait::wait_for(
            format!("RBAC to let {} patch pods through `edit`", access.username),
            crate::wait::DEFAULT_TIMEOUT,
            || {
                let (reviews, review) = (reviews.clone(), review.clone());
                async move {
                    let answer = reviews
                        .create(&PostParams::default(), &review)
                        .await
                        .map_err(|e| e.to_string())?;
                    match answer.status {
                        Some(status) if status.allowed => Ok(()),
                        other => Err(format!("not allowed yet: {other:?}")),
                    }
                }
            },
        )
        .await?;
        Ok(access)
    }

    /// Waits until the API server's authorizer grants `user` the first rule of `cluster_role`:
    /// RBAC caches bindings, and aggregated roles get their rules from the controller manager.
    async fn wait_until_granted(&self, user: &str, cluster_role: &str) -> Result<()> {
        let roles: Api<ClusterRole> = Api::all(self.client.clone());
        let reviews: Api<SubjectAccessReview> = Api::all(self.client.clone());
        crate::wait::wait_for(
            format!("RBAC to grant {user} the rules of ClusterRole {cluster_role}"),
            crate::wait::DEFAULT_TIMEOUT,
            || {
                let (roles, reviews) = (roles.clone(), reviews.clone());
                async move {
                    let role = roles.get(cluster_role).await.map_err(|e| e.to_string())?;
                    let Some(first_rule) = role.rules.as_ref().and_then(|rules| rules.first())
                    else {
                        return Err(format!("ClusterRole {cluster_role} has no rules (yet)"));
                    };
                    let review = reviews
                        .create(&PostParams::default(), &access_review(user, first_rule))
                        .await
                        .map_err(|e| e.to_string())?;
                    match review.status {
                        Some(status) if status.allowed => Ok(()),
                        other => Err(format!("not allowed yet: {other:?}")),
                    }
                }
            },
        )
        .await
    }

    /// Credentials of an existing service account (such as the operator's, from `config/`),
    /// through a TokenRequest: the token a pod of that account would get.
    pub async fn service_account_access(&self, namespace: &str, name: &str) -> Result<UserAccess> {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(24 * 3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let token = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(Error::kube(format!(
                "requesting a token for {namespace}/{name}"
            )))?
            .status
            .and_then(|s| s.token)
            .unwrap_or_default();
        let users = self.run_dir.join("users");
        std::fs::create_dir_all(&users)
            .map_err(Error::io(format!("creating {}", users.display())))?;
        let kubeconfig = users.join(format!("{namespace}.{name}.kubeconfig"));
        let username = format!("system:serviceaccount:{namespace}:{name}");
        let ca = self.run_dir.join("pki/serving/apiserver.crt");
        write_kubeconfig(&kubeconfig, &self.api_server, &ca, &username, &token)?;
        let client = client_for(&kubeconfig).await?;
        Ok(UserAccess {
            username,
            kubeconfig,
            client,
        })
    }

    /// Kills the components (newest first) and removes the run directory; logs are kept.
    pub fn stop(self) {
        drop(self);
    }

    /// Leaves the components running after this process exits (they were started in their own
    /// process group) and returns where the state is; [`Self::stop_detached`] stops them.
    pub fn detach(mut self) -> Result<PathBuf> {
        let state_file = self.run_dir.join(slot::STATE_FILE);
        {
            let state = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state.write(&state_file)?;
        }
        self.detached = true;
        for component in std::mem::take(&mut self.components) {
            component.detach();
        }
        Ok(state_file)
    }

    /// Stops a detached cluster whose run directory is `run_dir`: kills exactly the processes
    /// it recorded (checked by pid and full command line) and removes the directory.
    pub async fn stop_detached(run_dir: &Path) -> Result<()> {
        let state = State::read(&run_dir.join(slot::STATE_FILE))?;
        let _ = state.kill_all();
        crate::wait::wait_for(
            "the cluster's processes to exit",
            Duration::from_secs(20),
            || {
                let alive: Vec<String> = state
                    .processes
                    .iter()
                    .filter(|p| p.is_alive())
                    .map(|p| format!("{} (pid {})", p.name, p.pid))
                    .collect();
                async move {
                    if alive.is_empty() {
                        Ok(())
                    } else {
                        Err(alive.join(", "))
                    }
                }
            },
        )
        .await?;
        std::fs::remove_dir_all(run_dir)
            .map_err(Error::io(format!("removing {}", run_dir.display())))
    }

    /// The state of a detached cluster, if `run_dir` holds one whose API server still runs.
    pub fn running_detached(run_dir: &Path) -> Option<DetachedCluster> {
        let state = State::read(&run_dir.join(slot::STATE_FILE)).ok()?;
        state
            .processes
            .iter()
            .any(|p| p.name == "kube-apiserver" && p.is_alive())
            .then_some(DetachedCluster {
                api_server: state.api_server,
                kubeconfig: state.kubeconfig,
                bin_dir: state.bin_dir,
                log_dir: state.log_dir,
            })
    }
}

/// A control-plane component [`ControlPlane::restart`] can kill and start again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Component {
    Etcd,
    ApiServer,
    Scheduler,
    ControllerManager,
}

impl Component {
    /// Every component, in start-up order.
    pub const ALL: [Self; 4] = [
        Self::Etcd,
        Self::ApiServer,
        Self::Scheduler,
        Self::ControllerManager,
    ];

    /// Its process name (binary and log file stem).
    pub fn process_name(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::ApiServer => "kube-apiserver",
            Self::Scheduler => "kube-scheduler",
            Self::ControllerManager => "kube-controller-manager",
        }
    }
}

impl ControlPlane {
    /// Kills `component` (SIGKILL, as a crash or an OOM kill would) and starts it again with
    /// the same command line, so the same data directory, ports and certificates; returns once
    /// it serves again, with how long it was down (from the kill until it served). Serving
    /// means: etcd answers `/health` and, since every client goes through it, the API server's
    /// `/readyz` is ok again (not counted in the downtime); kube-apiserver's `/readyz` is ok;
    /// kube-scheduler has its pod cache, kube-controller-manager its first synced caches
    /// (they serve no port here, so their logs tell). Its output goes on in the same log file.
    pub async fn restart(&mut self, component: Component) -> Result<Duration> {
        let name = component.process_name();
        let index = self
            .components
            .iter()
            .position(|process| process.name() == name)
            .ok_or_else(|| Error::Manifest {
                what: format!("restarting {name}"),
                reason: "this control plane did not start it (controller_manager: false?)".into(),
            })?;
        let argv = {
            let state = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state
                .processes
                .iter()
                .rev()
                .find(|record| record.name == name)
                .map(|record| record.argv.clone())
                .unwrap_or_default()
        };
        let log = self.components[index].log_path().to_owned();
        let log_offset = std::fs::metadata(&log).map_or(0, |m| m.len());
        let killed_at = Instant::now();
        self.components[index].kill();
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]);
        if self.detached {
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        let process = ManagedProcess::spawn(name, command, &log, self.slot.component_stdin()?)?;
        {
            let mut state = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(record) = state.processes.iter_mut().rev().find(|r| r.name == name) {
                record.pid = process.pid();
            }
            self.slot.write_state(&state)?;
        }
        self.components[index] = process;
        let ready = Readiness::of(component, &argv, log, log_offset, self.client.clone());
        self.wait_restarted(index, &ready).await?;
        let down = killed_at.elapsed();
        if component == Component::Etcd {
            let api = Readiness::of(Component::ApiServer, &[], PathBuf::new(), 0, self.client());
            self.wait_restarted(index, &api).await?;
        }
        Ok(down)
    }

    /// Waits until `ready` holds, failing at once if the restarted process exits.
    async fn wait_restarted(&mut self, index: usize, ready: &Readiness) -> Result<()> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            self.components[index].ensure_running()?;
            let last = match ready.check().await {
                Ok(()) => return Ok(()),
                Err(observation) => observation,
            };
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("{} to serve again", ready.what()),
                    timeout: STARTUP_TIMEOUT,
                    last,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// How [`ControlPlane::restart`] tells a component serves again.
enum Readiness {
    /// etcd's `/health` on its client URL says `"health":"true"`.
    EtcdHealth(String),
    /// The API server's `/readyz` says ok.
    ApiReady(Client),
    /// The component's log, past where it was when it was killed, holds this line.
    LogLine {
        component: &'static str,
        log: PathBuf,
        offset: u64,
        line: &'static str,
    },
}

impl Readiness {
    fn of(
        component: Component,
        argv: &[String],
        log: PathBuf,
        offset: u64,
        client: Client,
    ) -> Self {
        match component {
            Component::Etcd => {
                let url = argv
                    .iter()
                    .find_map(|arg| arg.strip_prefix("--listen-client-urls="))
                    .unwrap_or_default();
                Self::EtcdHealth(format!("{url}/health"))
            }
            Component::ApiServer => Self::ApiReady(client),
            Component::Scheduler => Self::LogLine {
                component: "kube-scheduler",
                log,
                offset,
                line: r#""Caches populated" type="*v1.Pod""#,
            },
            Component::ControllerManager => Self::LogLine {
                component: "kube-controller-manager",
                log,
                offset,
                line: r#""Caches are synced""#,
            },
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Self::EtcdHealth(_) => "etcd",
            Self::ApiReady(_) => "kube-apiserver",
            Self::LogLine { component, .. } => component,
        }
    }

    async fn check(&self) -> Result<(), String> {
        match self {
            Self::EtcdHealth(url) => {
                let body = reqwest::get(url)
                    .await
                    .map_err(|e| e.to_string())?
                    .text()
                    .await
                    .map_err(|e| e.to_string())?;
                if body.contains(r#""health":"true""#) {
                    Ok(())
                } else {
                    Err(body)
                }
            }
            Self::ApiReady(client) => {
                let request = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                match client.request_text(request).await {
                    Ok(body) if body.trim() == "ok" => Ok(()),
                    Ok(body) => Err(body),
                    Err(e) => Err(e.to_string()),
                }
            }
            Self::LogLine {
                log, offset, line, ..
            } => {
                let bytes = std::fs::read(log).map_err(|e| e.to_string())?;
                let fresh = bytes
                    .get(usize::try_from(*offset).unwrap_or(usize::MAX)..)
                    .unwrap_or_default();
                if String::from_utf8_lossy(fresh).contains(line) {
                    Ok(())
                } else {
                    Err(format!("no {line} in its log since the restart yet"))
                }
            }
        }
    }
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("name", &self.name)
            .field("api_server", &self.api_server)
            .field("slot", &self.slot.index())
            .field("run_dir", &self.run_dir)
            .field("log_dir", &self.log_dir)
            .field("components", &self.components)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for UserAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserAccess")
            .field("username", &self.username)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

/// Where to reach a cluster started by `gpuqueue-e2e-cluster up`.
#[derive(Debug, Clone)]
pub struct DetachedCluster {
    /// `https://127.0.0.1:<port>`.
    pub api_server: String,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The directory with the matching `kubectl`.
    pub bin_dir: PathBuf,
    /// The component logs.
    pub log_dir: PathBuf,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        if std::thread::panicking() {
            eprintln!(
                "---- control plane {} ({}); logs in {} ----",
                self.name,
                self.api_server,
                self.log_dir.display()
            );
        }
        // Newest first: KWOK and the controllers stop before the API server and etcd.
        while let Some(component) = self.components.pop() {
            drop(component);
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

/// Starts components and remembers them (and their command lines, in the slot's state file).
struct Launcher<'a> {
    bin_dir: &'a Path,
    log_dir: &'a Path,
    slot: &'a Slot,
    detached: bool,
    state: State,
    components: Vec<ManagedProcess>,
}

impl Launcher<'_> {
    fn start(&mut self, name: &str, args: &[String]) -> Result<()> {
        let mut command = Command::new(self.bin_dir.join(name));
        command.args(args);
        if self.detached {
            // Out of the starter's process group: a Ctrl-C meant for `make` does not stop it.
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        let log = self.log_dir.join(format!("{name}.log"));
        let record_argv = argv(&command);
        let process = ManagedProcess::spawn(name, command, &log, self.slot.component_stdin()?)?;
        self.state.processes.push(ProcessRecord {
            name: name.to_owned(),
            pid: process.pid(),
            argv: record_argv,
        });
        self.components.push(process);
        self.slot.write_state(&self.state)?;
        if self.detached {
            // `down` must find a half-started cluster too.
            self.state
                .write(&self.state.run_dir.join(slot::STATE_FILE))?;
        }
        Ok(())
    }

    /// Waits for `check` like [`crate::wait::wait_for`], failing at once (with the log tail)
    /// if a component exits.
    async fn wait<F, Fut>(&mut self, what: &str, mut check: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let deadline = tokio::time::Instant::now() + STARTUP_TIMEOUT;
        loop {
            for component in &mut self.components {
                component.ensure_running()?;
            }
            let last = match check().await {
                Ok(()) => return Ok(()),
                Err(observation) => observation,
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: what.to_owned(),
                    timeout: STARTUP_TIMEOUT,
                    last,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

// === the start-up phases, in the order `ControlPlane::start_once` runs them ===

impl Launcher<'_> {
    /// etcd: fsync off (the data is thrown away); watch progress every 5 s as kubeadm does.
    /// Returns its client URL once it listens.
    async fn start_etcd(
        &mut self,
        run_dir: &Path,
        etcd_port: u16,
        etcd_peer_port: u16,
    ) -> Result<String> {
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        self.start(
            "etcd",
            &[
                "--name=e2e".into(),
                format!("--data-dir={}", run_dir.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=e2e={peer_url}"),
                "--initial-cluster-state=new".into(),
                "--unsafe-no-fsync=true".into(),
                "--watch-progress-notify-interval=5s".into(),
                "--log-level=warn".into(),
            ],
        )?;
        self.wait("etcd to listen", || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", etcd_port))
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .await?;
        Ok(etcd_url)
    }

    /// kube-apiserver, with the admin token and service-account keys `write_credentials` made;
    /// once it has written its serving certificate, writes the admin kubeconfig, and returns
    /// that admin's client once `/readyz` says ok.
    async fn start_apiserver(
        &mut self,
        pki: &Path,
        etcd_url: &str,
        api_port: u16,
        api_server: &str,
        kubeconfig: &Path,
        token: &str,
    ) -> Result<Client> {
        let tokens = pki.join("tokens.csv");
        let serving = pki.join("serving");
        self.start(
            "kube-apiserver",
            &[
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={api_port}"),
                // The API server writes a self-signed serving certificate (and its CA) here.
                format!("--cert-dir={}", serving.display()),
                format!("--token-auth-file={}", tokens.display()),
                "--authorization-mode=RBAC".into(),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!(
                    "--service-account-key-file={}",
                    pki.join("sa.pub").display()
                ),
                format!(
                    "--service-account-signing-key-file={}",
                    pki.join("sa.key").display()
                ),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                // No controller creates `default` service accounts in time for a new namespace's
                // first pod, and no node controller removes the not-ready taint from KWOK nodes.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition".into(),
                // The `kubernetes` Endpoints may not point at loopback; skip writing it.
                "--endpoint-reconciler-type=none".into(),
                "--allow-privileged=true".into(),
                // No server-side throttling: benchmarks measure our code, not the limiter.
                "--enable-priority-and-fairness=false".into(),
                "--max-requests-inflight=0".into(),
                "--max-mutating-requests-inflight=0".into(),
                "--profiling=false".into(),
                // Webhooks are called with the client certificate `write_webhook_client` made.
                format!(
                    "--admission-control-config-file={}",
                    pki.join(ADMISSION_CONFIG).display()
                ),
                // Evictions and pod deletions, one JSON line each, for the invariant checker.
                format!("--audit-policy-file={}", pki.join(AUDIT_POLICY).display()),
                format!(
                    "--audit-log-path={}",
                    self.log_dir.join(AUDIT_LOG).display()
                ),
                "--v=1".into(),
            ],
        )?;
        let ca = serving.join("apiserver.crt");
        // The file exists before it is written (kube-apiserver creates, then writes it): a
        // client made from it empty trusts no certificate and never connects.
        self.wait("kube-apiserver to write its serving certificate", || {
            let ca = ca.clone();
            async move {
                match std::fs::read_to_string(&ca) {
                    Ok(pem) if pem.trim_end().ends_with("-----END CERTIFICATE-----") => Ok(()),
                    Ok(pem) => Err(format!("{} bytes, no whole certificate yet", pem.len())),
                    Err(error) => Err(error.to_string()),
                }
            }
        })
        .await?;
        write_kubeconfig(kubeconfig, api_server, &ca, "gpuqueue-e2e-admin", token)?;
        let client = client_for(kubeconfig).await?;
        self.wait("kube-apiserver to be ready (/readyz)", || {
            let client = client.clone();
            async move {
                let request = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                match client.request_text(request).await {
                    Ok(body) if body.trim() == "ok" => Ok(()),
                    Ok(body) => Err(body),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await?;
        Ok(client)
    }

    /// kube-scheduler, kube-controller-manager (if configured) and KWOK, the API server's
    /// clients, with no serving ports and no leader election. KWOK runs the stages of
    /// `stage_file` (see [`NodeBehaviour`]); pod IPs come from this slot's range.
    fn start_agents(
        &mut self,
        config: &ControlPlaneConfig,
        kubeconfig: &Path,
        scheduler_config: &Path,
        stage_file: &Path,
    ) -> Result<()> {
        self.start(
            "kube-scheduler",
            &[
                format!("--config={}", scheduler_config.display()),
                "--secure-port=0".into(),
                "--v=2".into(),
            ],
        )?;
        if config.controller_manager {
            self.start(
                "kube-controller-manager",
                &[
                    format!("--kubeconfig={}", kubeconfig.display()),
                    "--leader-elect=false".into(),
                    "--secure-port=0".into(),
                    format!("--controllers={}", CONTROLLERS.join(",")),
                    "--use-service-account-credentials=false".into(),
                    "--kube-api-qps=500".into(),
                    "--kube-api-burst=1000".into(),
                    "--v=1".into(),
                ],
            )?;
        }
        self.start(
            "kwok",
            &[
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--config={}", stage_file.display()),
                // Only the harness's fake nodes: a real kubelet's node (e2e/kubelet/) is its own.
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
                format!("--cidr={}", self.slot.pod_cidr()),
                format!("--node-ip={}", self.slot.node_ip(0)),
                "--node-lease-duration-seconds=0".into(),
            ],
        )
    }

    /// Creates the nodes (32 at a time) and waits until KWOK has made them all Ready.
    async fn create_nodes(&mut self, client: &Client, nodes: &[GpuNode]) -> Result<()> {
        let nodes_api: Api<Node> = Api::all(client.clone());
        let manifests: Vec<Node> = (0u32..)
            .zip(nodes)
            .map(|(i, node)| node.to_node(self.slot.node_ip(i)))
            .collect();
        stream::iter(manifests.iter())
            .map(|node| {
                let nodes_api = nodes_api.clone();
                async move {
                    let name = node.metadata.name.clone().unwrap_or_default();
                    nodes_api
                        .create(&PostParams::default(), node)
                        .await
                        .map_err(Error::kube(format!("creating node {name}")))
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<_>>()
            .await?;
        let expected = nodes.len();
        self.wait(&format!("{expected} KWOK nodes to be Ready"), || {
            let nodes_api = nodes_api.clone();
            async move {
                let nodes = nodes_api
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let ready = nodes.items.iter().filter(|n| is_ready(n)).count();
                if ready >= expected {
                    Ok(())
                } else {
                    Err(format!("{ready} of {expected} Ready"))
                }
            }
        })
        .await?;
        Ok(())
    }

    /// Runs one pod through KWOK and deletes it, so that KWOK makes its pod IP pool now: it
    /// makes the pool on the first pod IP it hands out, without a lock (kwok v0.8.0,
    /// `PodController.ipPool`), and two pods started at once on a fresh KWOK could each make
    /// one and both get the range's first address (a fake vLLM's bind then failed with
    /// "address in use").
    async fn warm_pod_ips(&mut self, client: &Client, nodes: &[GpuNode]) -> Result<()> {
        let Some(node) = nodes.first() else {
            return Ok(());
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let name = "gpuqueue-e2e-warm-pod-ips";
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.name.clone()),
                tolerations: Some(vec![Toleration {
                    operator: Some("Exists".to_owned()),
                    ..Toleration::default()
                }]),
                containers: vec![Container {
                    name: "warm".to_owned(),
                    image: Some("registry.k8s.io/pause:3.10".to_owned()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        // Created in the wait: the API server makes the `default` namespace just after it
        // starts serving.
        self.wait("KWOK to give a pod an IP", || {
            let (pods, pod) = (pods.clone(), pod.clone());
            async move {
                let Some(pod) = pods.get_opt(name).await.map_err(|e| e.to_string())? else {
                    pods.create(&PostParams::default(), &pod)
                        .await
                        .map_err(|e| format!("creating the pod: {e}"))?;
                    return Err("created".to_owned());
                };
                match pod.status.and_then(|s| s.pod_ip) {
                    Some(_) => Ok(()),
                    None => Err("no IP yet".to_owned()),
                }
            }
        })
        .await?;
        // Deleted at once (grace 0): KWOK puts its IP back in the pool.
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .map_err(Error::kube("deleting the pod that warmed KWOK's IP pool"))?;
        self.wait("the pod that warmed KWOK's IP pool to be gone", || {
            let pods = pods.clone();
            async move {
                match pods.get_opt(name).await.map_err(|e| e.to_string())? {
                    None => Ok(()),
                    Some(_) => Err("still there".to_owned()),
                }
            }
        })
        .await
    }
}

/// Empty run and log folders for this start (the config's, else the slot's and the target's).
fn fresh_dirs(config: &ControlPlaneConfig, slot: &Slot) -> Result<(PathBuf, PathBuf)> {
    let run_dir = config
        .run_dir
        .clone()
        .unwrap_or_else(|| slot.dir().join("run"));
    let log_dir = config.log_dir.clone().unwrap_or_else(|| {
        let default = binaries::target_dir().join("e2e-logs").join(&config.name);
        // A live cluster of the same name keeps its logs: this one gets a folder of its own.
        if slot::log_dir_in_use(&default) {
            default.with_file_name(format!("{}.slot-{}", config.name, slot.index()))
        } else {
            default
        }
    });
    for dir in [&run_dir, &log_dir] {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    }
    Ok((run_dir, log_dir))
}

/// The API server's credentials: a static admin token in system:masters (RBAC for everyone
/// else), returned, and the key that signs service-account tokens (TokenRequest).
fn write_credentials(pki: &Path) -> Result<String> {
    let token = format!("{:032x}", rand::random::<u128>());
    let tokens = pki.join("tokens.csv");
    write(
        &tokens,
        &format!("{token},gpuqueue-e2e-admin,gpuqueue-e2e-admin,system:masters\n"),
    )?;
    // Service-account tokens (TokenRequest) are signed with an ECDSA key made here instead of
    // `openssl genrsa`: no external tool, and P-256 keys take microseconds.
    let signer = rcgen::KeyPair::generate()?;
    write(&pki.join("sa.key"), &signer.serialize_pem())?;
    write(&pki.join("sa.pub"), &signer.public_key_pem())?;
    Ok(token)
}

/// The admission configuration kube-apiserver reads, in the PKI folder.
const ADMISSION_CONFIG: &str = "admission.yaml";

/// The audit policy (in the PKI folder) and the audit log (in the log folder, kept).
const AUDIT_POLICY: &str = "audit-policy.yaml";
const AUDIT_LOG: &str = "kube-apiserver-audit.log";
/// Only evictions, pod deletions and bindings, and changes of Deployments (a benchmark's
/// scale request), once each when answered: a few lines per handover, so the audit log costs
/// nothing measurable elsewhere. Its timestamps are the API server's, in microseconds.
const AUDIT_POLICY_YAML: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\n\
    omitStages: [RequestReceived, ResponseStarted, Panic]\nrules:\n\
    - level: Metadata\n  verbs: [create]\n  resources: [{group: \"\", resources: [pods/eviction, pods/binding]}]\n\
    - level: Metadata\n  verbs: [delete]\n  resources: [{group: \"\", resources: [pods]}]\n\
    - level: Metadata\n  verbs: [patch, update]\n  resources: [{group: apps, resources: [deployments, deployments/scale]}]\n\
    - level: None\n";

fn webhook_client_ca(pki: &Path) -> PathBuf {
    pki.join("webhook-client-ca.crt")
}

/// The identity kube-apiserver presents to admission webhooks, as a cluster admin configures
/// it: a CA (the webhook verifies clients against it), a client certificate it signs, a
/// kubeconfig that gives the certificate to every webhook host (`*`: the tests' webhooks
/// listen on ports picked at run time) and the `AdmissionConfiguration` naming that kubeconfig
/// for mutating and validating webhooks.
fn write_webhook_client(pki: &Path) -> Result<()> {
    let pki =
        std::path::absolute(pki).map_err(Error::io(format!("resolving {}", pki.display())))?;
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "gpuqueue-e2e webhook client CA");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = ca_params.self_signed(&ca_key)?;
    write(&webhook_client_ca(&pki), &ca.pem())?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver-webhook-client");
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let certificate = params.signed_by(&key, &issuer)?;
    let (cert_path, key_path) = (
        pki.join("webhook-client.crt"),
        pki.join("webhook-client.key"),
    );
    write(&cert_path, &certificate.pem())?;
    write(&key_path, &key.serialize_pem())?;

    let kubeconfig = pki.join("webhook-client.kubeconfig");
    write(
        &kubeconfig,
        &format!(
            "apiVersion: v1\nkind: Config\nusers:\n- name: \"*\"\n  user:\n    \
             client-certificate: {}\n    client-key: {}\n",
            yaml_string(&cert_path),
            yaml_string(&key_path)
        ),
    )?;
    let plugin = |name: &str| {
        format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    \
             kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
            yaml_string(&kubeconfig)
        )
    };
    write(
        &pki.join(ADMISSION_CONFIG),
        &format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
            plugin("MutatingAdmissionWebhook"),
            plugin("ValidatingAdmissionWebhook")
        ),
    )
}

/// kube-scheduler's config file, instead of the deprecated --kubeconfig flag, so client QPS can
/// be raised for benchmarks; no leader election.
fn write_scheduler_config(run_dir: &Path, kubeconfig: &Path) -> Result<PathBuf> {
    let scheduler_config = run_dir.join("kube-scheduler.yaml");
    write(
        &scheduler_config,
        &format!(
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
                 clientConnection:\n  kubeconfig: {}\n  qps: 1000\n  burst: 1000\n\
                 leaderElection:\n  leaderElect: false\n",
            yaml_string(kubeconfig)
        ),
    )?;
    Ok(scheduler_config)
}

fn argv(command: &Command) -> Vec<String> {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect()
}

/// A review of whether `user` may do what `rule` allows (its first verb on its first resource).
fn access_review(user: &str, rule: &PolicyRule) -> SubjectAccessReview {
    let first = |items: Option<&Vec<String>>, wildcard: &str| {
        items
            .and_then(|items| items.first())
            .filter(|item| item.as_str() != "*")
            .map_or_else(|| wildcard.to_owned(), Clone::clone)
    };
    let verb = first(Some(&rule.verbs), "get");
    let spec = match &rule.non_resource_urls {
        Some(urls) if !urls.is_empty() => SubjectAccessReviewSpec {
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(urls[0].trim_end_matches('*').to_owned()),
                verb: Some(verb),
            }),
            ..SubjectAccessReviewSpec::default()
        },
        _ => SubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(first(rule.api_groups.as_ref(), "")),
                resource: Some(first(rule.resources.as_ref(), "pods")),
                namespace: Some("default".to_owned()),
                verb: Some(verb),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
    };
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            ..spec
        },
        ..SubjectAccessReview::default()
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

async fn create_if_missing<K>(api: &Api<K>, object: &K, what: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
        Err(e) => Err(Error::kube(format!("creating {what} {name}"))(e)),
    }
}

/// A kubeconfig with one cluster, one token user and one context.
fn write_kubeconfig(path: &Path, server: &str, ca: &Path, user: &str, token: &str) -> Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters:\n- name: gpuqueue-e2e\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: {user}\n  user:\n    token: {token}\n\
         contexts:\n- name: gpuqueue-e2e\n  context:\n    cluster: gpuqueue-e2e\n    user: {user}\n\
         current-context: gpuqueue-e2e\n",
        server = yaml_string(server),
        ca = yaml_string(ca),
        user = yaml_string(user),
        token = yaml_string(token),
    );
    write(path, &text)
}

/// A client from a kubeconfig file written by [`write_kubeconfig`]; it does not retry.
async fn client_for(kubeconfig: &Path) -> Result<Client> {
    let config_error = |source| Error::Kubeconfig {
        path: kubeconfig.to_owned(),
        source,
    };
    let file = Kubeconfig::read_from(kubeconfig).map_err(config_error)?;
    let mut config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(config_error)?;
    // kube retries 429/503/504 by default (15 times, backing off for minutes): an Eviction
    // refused by a PodDisruptionBudget would hang the test instead of showing the 429.
    config.default_retry = false;
    Client::try_from(config).map_err(Error::kube("building a client"))
}

/// A YAML double-quoted string (JSON strings are valid YAML).
fn yaml_string(value: impl AsRef<OsStr>) -> String {
    serde_json::Value::String(value.as_ref().to_string_lossy().into_owned()).to_string()
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(Error::io(format!("writing {}", path.display())))
}
