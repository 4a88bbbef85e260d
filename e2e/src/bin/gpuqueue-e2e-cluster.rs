//! `gpuqueue-e2e-cluster`: a local control plane with KWOK GPU nodes that outlives the command,
//! for `make cluster-up`, `make cluster-down`, `make demo` and trying things by hand.
//!
//! ```sh
//! gpuqueue-e2e-cluster up          # starts it, state in .e2e/
//! eval "$(gpuqueue-e2e-cluster env)"  # KUBECONFIG, the matching kubectl and kubectl-gpuqueue on PATH
//! gpuqueue-e2e-cluster down        # stops exactly its processes, removes .e2e/
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpuqueue_e2e::{ControlPlane, ControlPlaneConfig, GpuNode};

#[derive(Debug, Parser)]
#[command(
    about = "A local Kubernetes control plane with fake GPU nodes (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, KWOK)"
)]
struct Cli {
    /// The cluster's state directory (kubeconfig, PKI, etcd data, process list).
    #[arg(long, global = true, default_value = ".e2e")]
    dir: PathBuf,
    #[command(subcommand)]
    command: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Start the cluster and return once every node is Ready.
    Up {
        /// Nodes with whole GPUs (`gpu-node-0`, …).
        #[arg(long, default_value_t = 4)]
        gpu_nodes: u32,
        /// `nvidia.com/gpu` per node.
        #[arg(long, default_value_t = 8)]
        gpus_per_node: u32,
        /// Leave out `mig-node-0` (MIG instances 1g.10gb and 3g.40gb).
        #[arg(long)]
        no_mig_node: bool,
    },
    /// Stop the cluster's processes and remove its state directory.
    Down,
    /// Print `export` lines for KUBECONFIG and PATH (use with `eval`): the cluster's kubectl
    /// and the `kubectl-gpuqueue` plugin built beside this binary.
    Env,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Action::Up {
            gpu_nodes,
            gpus_per_node,
            no_mig_node,
        } => up(&cli.dir, gpu_nodes, gpus_per_node, !no_mig_node).await,
        Action::Down => down(&cli.dir).await,
        Action::Env => env(&cli.dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("gpuqueue-e2e-cluster: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn up(dir: &Path, gpu_nodes: u32, gpus_per_node: u32, mig_node: bool) -> Result<(), String> {
    let dir = absolute(dir)?;
    if let Some(running) = ControlPlane::running_detached(&dir) {
        return Err(format!(
            "a cluster is already running at {} (state in {}); stop it with `make cluster-down`",
            running.api_server,
            dir.display()
        ));
    }
    if dir.join("state.json").exists() {
        // A cluster that died (machine restart, killed API server): clear what is left.
        ControlPlane::stop_detached(&dir)
            .await
            .map_err(|e| e.to_string())?;
    }
    let mut nodes: Vec<GpuNode> = (0..gpu_nodes)
        .map(|i| GpuNode::whole_gpus(format!("gpu-node-{i}"), gpus_per_node))
        .collect();
    if mig_node {
        nodes.push(GpuNode::mig("mig-node-0"));
    }
    let node_count = nodes.len();
    let mut config = ControlPlaneConfig::new("cluster").with_nodes(nodes);
    config.run_dir = Some(dir.clone());
    config.detached = true;
    let cluster = ControlPlane::start(config)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!(
        "cluster up at {} with {node_count} KWOK nodes ({})\n  logs: {}\n  use it: eval \"$(make -s cluster-env)\"   stop it: make cluster-down",
        cluster.api_server(),
        cluster.startup_summary(),
        cluster.log_dir().display()
    );
    cluster.detach().map_err(|e| e.to_string())?;
    link_plugin(&dir)
}

/// The folder `env` puts first on the PATH: it holds only a link to the plugin, so the other
/// binaries of the build (the operator, the fake vLLM) stay off the user's PATH.
fn plugin_dir(dir: &Path) -> PathBuf {
    dir.join("plugin")
}

/// The `kubectl-gpuqueue` of this build: cargo writes it beside this binary (`make cluster-up`
/// builds both).
fn built_plugin() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating this binary: {e}"))?;
    Ok(exe.with_file_name(PLUGIN))
}

const PLUGIN: &str = "kubectl-gpuqueue";

fn link_plugin(dir: &Path) -> Result<(), String> {
    let plugin = built_plugin()?;
    let folder = plugin_dir(dir);
    std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    let link = folder.join(PLUGIN);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&plugin, &link).map_err(|e| format!("{}: {e}", link.display()))?;
    if !plugin.exists() {
        eprintln!("{}", plugin_missing(&plugin));
    }
    Ok(())
}

fn plugin_missing(plugin: &Path) -> String {
    format!(
        "note: {} is not built, so `kubectl gpuqueue` will not be found; build it with `cargo build -p gpuqueue-cli` (make cluster-up does)",
        plugin.display()
    )
}

async fn down(dir: &Path) -> Result<(), String> {
    let dir = absolute(dir)?;
    if !dir.join("state.json").exists() {
        eprintln!("no cluster state in {}; nothing to stop", dir.display());
        return Ok(());
    }
    ControlPlane::stop_detached(&dir)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!("cluster stopped; removed {}", dir.display());
    Ok(())
}

fn env(dir: &Path) -> Result<(), String> {
    let dir = absolute(dir)?;
    let cluster = ControlPlane::running_detached(&dir).ok_or_else(|| {
        format!(
            "no running cluster in {}; start one with `make cluster-up`",
            dir.display()
        )
    })?;
    let link = plugin_dir(&dir).join(PLUGIN);
    if !link.exists() {
        eprintln!(
            "{}",
            plugin_missing(&std::fs::read_link(&link).unwrap_or(link))
        );
    }
    println!("export KUBECONFIG={}", shell_quote(&cluster.kubeconfig));
    println!(
        "export PATH={}:{}:\"$PATH\"",
        shell_quote(&plugin_dir(&dir)),
        shell_quote(&cluster.bin_dir)
    );
    Ok(())
}

fn absolute(dir: &Path) -> Result<PathBuf, String> {
    std::path::absolute(dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// Single-quotes a path for a POSIX shell.
fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}
