#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The operator's image (`config/image/`, `make image`): built offline FROM scratch, it holds
//! one static binary and no shell, declares a numeric non-root user, answers `--version`, and
//! run by podman against a real API server as its ServiceAccount, it becomes ready (stores
//! synced over TLS, webhook serving, CA published) as uid 65532.
//!
//! The test packs the dev build (`--profile dev`): the image is the same but for the
//! optimisation level, and a second static release build would cost CI minutes.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Output};

use gpuqueue_e2e::{ControlPlane, ControlPlaneConfig, repo_root, without_crate_env};

use common::{OPERATOR_NAMESPACE, free_port, install, operator_access, run_ok, wait_readyz};

const IMAGE: &str = "localhost/gpuqueue-operator:e2e";
/// The image's user (config/image/Containerfile), the Deployment's runAsUser too.
const USER: &str = "65532:65532";

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// `podman run` with the settings of the Deployment's securityContext: non-root by the image's
/// user, read-only root filesystem, no capabilities, no privilege escalation. The runtime is
/// runc: crun (podman's default on Debian) refuses a hybrid cgroup layout, cgroup v1 with
/// controllers left on the v2 hierarchy ("cgroups in hybrid mode not supported"), which some
/// machines (this project's CI) have; runc runs on it and on pure v1 or v2 alike.
fn podman_run() -> Command {
    let mut command = Command::new("podman");
    command.args([
        "--runtime=runc",
        "run",
        "--read-only",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        // podman raises nofile and nproc by default, which a root without CAP_SYS_RESOURCE
        // (this sandbox, some CI runners) may not; lower limits work everywhere.
        "--ulimit=nofile=1024:1024",
        "--ulimit=nproc=1024:1024",
    ]);
    command
}

/// Removes the named container when the test ends, however it ends.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "--force", "--time=2", &self.0])
            .output();
    }
}

fn build_image() {
    let build = run_ok(
        without_crate_env(&mut Command::new(repo_root().join("config/image/build.sh"))).args([
            "--profile",
            "dev",
            "--tag",
            IMAGE,
        ]),
    );
    assert_eq!(stdout(&build).lines().last(), Some(IMAGE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_is_static_non_root_without_a_shell_and_runs_the_operator_against_a_cluster() {
    build_image();

    // What the image declares: a numeric user (runAsNonRoot can only check a number), the
    // operator as entrypoint, and one layer holding one file.
    let inspect = run_ok(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{.Config.User}} {{json .Config.Entrypoint}} {{len .RootFS.Layers}}",
        IMAGE,
    ]));
    assert_eq!(
        stdout(&inspect),
        format!("{USER} [\"/gpuqueue-operator\"] 1")
    );

    let version = run_ok(podman_run().args(["--rm", IMAGE, "--version"]));
    assert_eq!(
        stdout(&version),
        format!("gpuqueue-operator {}", env!("CARGO_PKG_VERSION"))
    );
    let no_shell = podman_run()
        .args(["--rm", "--entrypoint=/bin/sh", IMAGE, "-c", "true"])
        .output()
        .unwrap();
    assert!(
        !no_shell.status.success(),
        "the image has a /bin/sh: {}",
        stdout(&no_shell)
    );

    let cluster = ControlPlane::start(ControlPlaneConfig::new("image").with_nodes(Vec::new()))
        .await
        .unwrap();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let mount = credentials_for_the_container(&cluster).await;

    let name = format!("gpuqueue-e2e-image-{}", std::process::id());
    let container = Container(name.clone());
    let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let mut operator = podman_run();
    operator
        .args(["--name", &name, "--network=host"])
        .arg(format!("--volume={}:/etc/gpuqueue:ro", mount.display()))
        .args([IMAGE, "--kubeconfig=/etc/gpuqueue/kubeconfig"])
        .arg(format!("--namespace={OPERATOR_NAMESPACE}"))
        .arg(format!("--metrics-addr={metrics}"))
        .arg(format!("--webhook-addr=127.0.0.1:{webhook_port}"))
        .arg("--webhook-extra-san=127.0.0.1")
        .arg("--webhook-client-ca=/etc/gpuqueue/webhook-client-ca.crt")
        .arg("--lease-identity=image");
    let process = cluster.spawn("operator-image", operator).unwrap();

    wait_readyz(
        "the operator in the image to be ready",
        metrics,
        process.log_path(),
    )
    .await;

    // The process itself, seen from the host: uid and gid 65532, no capabilities.
    let pid = stdout(&run_ok(Command::new("podman").args([
        "inspect",
        "--format",
        "{{.State.Pid}}",
        &container.0,
    ])));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|value| value.split_whitespace().collect::<Vec<_>>())
            .unwrap()
    };
    assert_eq!(field("Uid:"), ["65532"; 4], "{status}");
    assert_eq!(field("Gid:"), ["65532"; 4], "{status}");
    assert_eq!(field("CapEff:"), ["0000000000000000"], "{status}");
    drop(process);
}

/// The operator's ServiceAccount kubeconfig, the API server's CA and the webhook client CA,
/// copied where the container's user may read them (the harness keeps them private).
async fn credentials_for_the_container(cluster: &ControlPlane) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;

    let dir = cluster.run_dir().join("image-mount");
    std::fs::create_dir_all(&dir).unwrap();
    let access = operator_access(cluster).await;
    let kubeconfig = std::fs::read_to_string(&access.kubeconfig).unwrap();
    let ca = ca_path(&kubeconfig);
    std::fs::copy(&ca, dir.join("ca.crt")).unwrap();
    std::fs::write(
        dir.join("kubeconfig"),
        kubeconfig.replace(&ca, "/etc/gpuqueue/ca.crt"),
    )
    .unwrap();
    std::fs::copy(
        cluster.webhook_client_ca(),
        dir.join("webhook-client-ca.crt"),
    )
    .unwrap();
    for file in ["kubeconfig", "ca.crt", "webhook-client-ca.crt"] {
        std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// The `certificate-authority` file a harness kubeconfig names.
fn ca_path(kubeconfig: &str) -> String {
    let line = kubeconfig
        .lines()
        .find_map(|line| line.trim().strip_prefix("certificate-authority:"))
        .unwrap_or_else(|| panic!("no certificate-authority in {kubeconfig}"));
    let path = line.trim().trim_matches('"').trim_matches('\'');
    assert!(Path::new(path).exists(), "{path}");
    path.to_owned()
}
