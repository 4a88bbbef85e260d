#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! The CRDs in `crds/` install on a real API server, every file in `examples/` applies, and
//! every file in `examples/invalid/` is refused with the message its second line promises
//! (`# expect-error: <text>`), whether it is created or server-side applied. The CEL rules run
//! in kube-apiserver here, with its cost limits and its own error formatting.

use std::path::Path;

use gpuqueue_api::v1alpha1::GpuQueue;
use gpuqueue_e2e::{
    ControlPlane, ControlPlaneConfig, WriteMode, apply_file, install_crds, repo_root, write_file,
    yaml_files,
};
use kube::api::{Api, ListParams};

const EXPECT_ERROR: &str = "# expect-error: ";

/// The text after `# expect-error: ` on the file's second line.
fn expected_error(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    text.lines()
        .nth(1)
        .and_then(|line| line.strip_prefix(EXPECT_ERROR))
        .map(|expected| expected.trim().to_owned())
        .filter(|expected| !expected.is_empty())
        .ok_or_else(|| format!("its second line must be `{EXPECT_ERROR}<text of the refusal>`"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crds_install_examples_apply_and_invalid_examples_are_refused_with_their_message() {
    // Nothing here schedules pods: no nodes, no controller manager, for a faster start.
    let mut config = ControlPlaneConfig::new("api_examples").with_nodes(Vec::new());
    config.controller_manager = false;
    let cluster = ControlPlane::start(config).await.unwrap();
    let client = cluster.client();
    let root = repo_root();

    let crds = install_crds(&client, &root.join("crds")).await.unwrap();
    assert_eq!(crds, ["gpuqueues.gpuqueue.io"]);

    let mut failures = Vec::new();
    let mut applied = 0;
    let valid = yaml_files(&root.join("examples")).unwrap();
    for path in &valid {
        match apply_file(&client, path, None).await {
            Ok(objects) => applied += objects.len(),
            Err(e) => failures.push(format!("{}: refused: {e}", path.display())),
        }
    }
    // What the API server stored reads back into the Rust types.
    let queues = Api::<GpuQueue>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(
        queues.items.len(),
        applied,
        "every applied example is a GpuQueue"
    );

    let invalid = yaml_files(&root.join("examples/invalid")).unwrap();
    assert!(
        !invalid.is_empty(),
        "examples/invalid/ has one file per validation rule"
    );
    for path in &invalid {
        let expected = match expected_error(path) {
            Ok(expected) => expected,
            Err(problem) => {
                failures.push(format!("{}: {problem}", path.display()));
                continue;
            }
        };
        // Both ways users write queues: `kubectl create`/client-side `kubectl apply` (a create)
        // and `kubectl apply --server-side`/GitOps tools (server-side apply).
        for mode in [WriteMode::Create, WriteMode::Apply] {
            let refusal = match write_file(&client, path, None, mode).await {
                Ok(_) => Err(format!("accepted, expected a refusal with `{expected}`")),
                Err(e) => match e.api_status() {
                    Some(status) => Ok(status.clone()),
                    None => Err(format!("failed before reaching the API server: {e}")),
                },
            };
            let problem = match refusal {
                Err(problem) => Some(problem),
                Ok(status) if status.code == 422 && status.message.contains(&expected) => None,
                // Server-side apply cannot build a patch from a list with duplicate map keys,
                // and kube-apiserver answers 500 before validation runs (kubernetes#121575:
                // "you can't SSA duplicate items"). Still a refusal that names the key.
                Ok(status)
                    if mode == WriteMode::Apply
                        && status.code == 500
                        && status
                            .message
                            .starts_with("failed to create typed patch object")
                        && status.message.contains("duplicate entries for key") =>
                {
                    None
                }
                Ok(status) => Some(format!(
                    "refused with {} but without `{expected}`: {}",
                    status.code, status.message
                )),
            };
            if let Some(problem) = problem {
                failures.push(format!("{} ({mode:?}): {problem}", path.display()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} example files misbehaved:\n{}",
        failures.len(),
        valid.len() + invalid.len(),
        failures.join("\n")
    );
}
