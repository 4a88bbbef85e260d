#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The health GitOps tools give a GpuQueue, each computed by the tool's own code: Argo CD's
//! health check (`config/argocd/gpuqueue.io/GpuQueue/health.lua`) in gopher-lua set up as Argo
//! CD sets it up (`e2e/tools/argocd-lua`), and Flux's kstatus and the CEL health checks README
//! gives a Kustomization, in Flux's own packages (`e2e/tools/flux-health`). Each runs on the
//! sample statuses beside the Lua script and on the statuses a real operator writes; README's
//! `argocd-cm` patch is run as written against a real API server.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use gpuqueue_api::v1alpha1::GpuQueue;
use gpuqueue_e2e::{ControlPlane, ControlPlaneConfig, bin_dir, repo_root};
use kube::Api;
use serde_json::Value;

use common::{
    Operator, Options, apply_queue, condition, free_port, install, queue_status, queue_yaml,
};

const HEALTH_CHECK: &str = "config/argocd/gpuqueue.io/GpuQueue";

/// What Flux's CEL checks give an object with no `status` yet: they cannot be evaluated there,
/// and Flux keeps waiting, as for `InProgress`, until the operator writes it.
const NO_STATUS_YET: &str = "no such attribute(s): status.conditions";

/// One of the tools of `e2e/tools`, run from the repository's root.
fn tool(name: &str) -> Command {
    let binary = bin_dir().unwrap().join(name);
    assert!(
        binary.exists(),
        "{} is missing: run e2e/scripts/build-tools.sh",
        binary.display()
    );
    let mut command = Command::new(binary);
    command.current_dir(repo_root());
    command
}

/// The JSON a tool prints, or what it says on failing.
fn verdict(command: &mut Command) -> Result<Value, String> {
    let output = command.output().unwrap();
    if output.status.success() {
        Ok(serde_json::from_slice(&output.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// The health Argo CD gives the object in `file`.
fn argo_cd(file: &Path) -> Value {
    let script = format!("{HEALTH_CHECK}/health.lua");
    verdict(
        tool("gpuqueue-argocd-lua")
            .args(["health", &script])
            .arg(file),
    )
    .unwrap()
}

/// The health Flux gives the object in `file` with no health check of its kind: kstatus.
fn kstatus(file: &Path) -> Value {
    verdict(tool("gpuqueue-flux-health").arg("kstatus").arg(file)).unwrap()
}

/// The health Flux gives the object in `file` with README's `healthCheckExprs`.
fn flux_cel(file: &Path) -> Result<Value, String> {
    verdict(
        tool("gpuqueue-flux-health")
            .arg("cel")
            .arg(readme_flux_checks())
            .arg(file),
    )
}

/// A file this test process writes for the tools, under the target directory.
fn scratch(name: &str) -> PathBuf {
    let dir = gpuqueue_e2e::target_dir().join("gitops-health");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{}-{name}", std::process::id()))
}

/// README's `healthCheckExprs` block, as a file: what a user copies into a Kustomization.
/// Written once per process, so that tests running together never read it half written.
fn readme_flux_checks() -> &'static Path {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
        let start = readme
            .find("```yaml\n  healthCheckExprs:")
            .expect("README.md has no healthCheckExprs block")
            + "```yaml\n".len();
        let block = &readme[start..];
        let block = &block[..block.find("```").unwrap()];
        let file = scratch("flux-checks.yaml");
        std::fs::write(&file, block).unwrap();
        file
    })
}

/// Flux's name for the health Argo CD gives as `argo_cd`, as README pairs them.
fn as_flux(argo_cd: &str) -> &'static str {
    match argo_cd {
        "Healthy" => "Current",
        "Progressing" => "InProgress",
        "Degraded" => "Failed",
        other => panic!("no Flux status stands for Argo CD's {other}"),
    }
}

#[test]
fn the_health_check_gives_each_sample_status_its_argo_cd_health() {
    let output = tool("gpuqueue-argocd-lua")
        .args(["test", HEALTH_CHECK])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("7 passed, 0 failed"), "{report}");
}

/// The samples of the Argo CD check, each with the health README says kstatus gives it.
const SAMPLES: &[(&str, &str)] = &[
    ("healthy", "Current"),
    ("no_status", "Current"),
    ("stale_generation", "InProgress"),
    ("reclaiming", "Current"),
    ("namespace_conflict", "Current"),
    ("overcommitted", "Current"),
    ("invalid_spec", "InProgress"),
];

#[test]
fn flux_gives_each_sample_status_the_health_readme_says() {
    let samples = repo_root().join(HEALTH_CHECK).join("testdata");
    for (sample, by_kstatus) in SAMPLES {
        let file = samples.join(format!("{sample}.yaml"));
        let kstatus = kstatus(&file);
        assert_eq!(
            kstatus["status"], *by_kstatus,
            "kstatus of {sample}: {kstatus}"
        );

        // README's CEL checks give what Argo CD's check gives, wherever they can be evaluated.
        let argo_cd = argo_cd(&file);
        match flux_cel(&file) {
            Ok(cel) => assert_eq!(
                cel["status"],
                as_flux(argo_cd["status"].as_str().unwrap()),
                "{sample}: Flux {cel}, Argo CD {argo_cd}"
            ),
            Err(error) => assert!(
                *sample == "no_status" && error.contains(NO_STATUS_YET),
                "{sample}: {error}"
            ),
        }
    }
}

/// A queue reclaiming while the cluster cannot honour every guarantee is Degraded for Argo CD,
/// whose check looks at the faults first; Flux evaluates `inProgress` before `failed`, so
/// README's checks must not call it in progress.
#[test]
fn a_reclaiming_queue_with_a_fault_fails_flux_as_it_degrades_argo_cd() {
    let samples = repo_root().join(HEALTH_CHECK).join("testdata");
    let mut queue: Value =
        serde_yaml::from_str(&std::fs::read_to_string(samples.join("reclaiming.yaml")).unwrap())
            .unwrap();
    for condition in queue["status"]["conditions"].as_array_mut().unwrap() {
        if condition["type"] == "Overcommitted" {
            condition["status"] = "True".into();
            condition["message"] = "the guarantees add up to 40 but the cluster has 32".into();
        }
    }
    let file = scratch("reclaiming-overcommitted.json");
    std::fs::write(&file, serde_json::to_vec(&queue).unwrap()).unwrap();

    assert_eq!(argo_cd(&file)["status"], "Degraded");
    let cel = flux_cel(&file).unwrap();
    assert_eq!(cel["status"], "Failed", "{cel}");
}

/// Writes `queue` as the API server returned it, for the tools.
fn saved(dir: &Path, queue: &GpuQueue, label: &str) -> PathBuf {
    let name = queue.metadata.name.clone().unwrap();
    let file = dir.join(format!("{name}-{label}.json"));
    std::fs::write(&file, serde_json::to_vec(queue).unwrap()).unwrap();
    file
}

/// README's command that adds the health check to `argocd-cm` (a `jq` pipe over lines ending
/// in `\`), as written there.
fn readme_argocd_cm_patch() -> String {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let start = readme
        .find("kubectl -n argocd patch configmap argocd-cm")
        .expect("README.md has no argocd-cm patch");
    let command = &readme[start..];
    command[..command.find("\n```").unwrap()].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_checks_read_the_status_a_real_operator_writes() {
    let cluster = ControlPlane::start(ControlPlaneConfig::new("gitops_health"))
        .await
        .unwrap();
    let client = cluster.client();
    let webhook_port = free_port();
    install(&cluster, webhook_port).await;
    let _operator = Operator::start(&cluster, Options::new("only", webhook_port)).await;
    let dir = cluster.run_dir();

    apply_queue(&client, &queue_yaml("alone", &["alone"], 8, 0)).await;
    let alone = queue_status(&client, "alone", "Ready", |q| {
        condition(q, "Ready").is_some_and(|(status, _)| status == "True")
    })
    .await;
    let file = saved(dir, &alone, "ready");
    assert_eq!(argo_cd(&file)["status"], "Healthy");
    assert_eq!(kstatus(&file)["status"], "Current");
    assert_eq!(flux_cel(&file).unwrap()["status"], "Current");

    apply_queue(&client, &queue_yaml("first", &["shared"], 4, 0)).await;
    apply_queue(&client, &queue_yaml("second", &["shared"], 4, 0)).await;
    let conflicted = queue_status(&client, "second", "NamespaceConflict", |q| {
        condition(q, "NamespaceConflict").is_some_and(|(status, _)| status == "True")
    })
    .await;
    let file = saved(dir, &conflicted, "conflict");
    let degraded = argo_cd(&file);
    assert_eq!(degraded["status"], "Degraded", "{degraded}");
    assert!(
        degraded["message"].as_str().unwrap().contains("shared"),
        "{degraded}"
    );
    // kstatus reads only `Ready` of our conditions: a conflict does not fail a Kustomization
    // without README's checks.
    assert_eq!(kstatus(&file)["status"], "Current");
    assert_eq!(flux_cel(&file).unwrap()["status"], "Failed");

    // A queue the operator has not reported on yet (no status).
    let queues: Api<GpuQueue> = Api::all(client.clone());
    let mut fresh = queues.get("alone").await.unwrap();
    fresh.status = None;
    let file = saved(dir, &fresh, "fresh");
    let progressing = argo_cd(&file);
    assert_eq!(progressing["status"], "Progressing", "{progressing}");
    let error = flux_cel(&file).unwrap_err();
    assert!(error.contains(NO_STATUS_YET), "{error}");

    // README's patch puts the script into argocd-cm under the key Argo CD reads.
    let status = cluster
        .kubectl()
        .args(["create", "namespace", "argocd"])
        .status()
        .unwrap();
    assert!(status.success());
    let status = cluster
        .kubectl()
        .args(["-n", "argocd", "create", "configmap", "argocd-cm"])
        .arg("--from-literal=url=https://argocd.example.com")
        .status()
        .unwrap();
    assert!(status.success());
    let output = cluster
        .command("bash")
        .args(["-euo", "pipefail", "-c", &readme_argocd_cm_patch()])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = cluster
        .kubectl()
        .args([
            "-n",
            "argocd",
            "get",
            "configmap",
            "argocd-cm",
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    let config: Value = serde_json::from_slice(&output.stdout).unwrap();
    let script =
        std::fs::read_to_string(repo_root().join(HEALTH_CHECK).join("health.lua")).unwrap();
    assert_eq!(
        config["data"]["resource.customizations.health.gpuqueue.io_GpuQueue"],
        script.as_str()
    );
    assert_eq!(
        config["data"]["url"], "https://argocd.example.com",
        "the patch keeps the rest"
    );
}
