//! Where the control-plane binaries are, and where this repository's files are.
//!
//! The binaries are built from the Go module proxy by `e2e/scripts/build-tools.sh`, which caches
//! them outside the repository and prints their directory (a no-op when they are cached). The
//! Makefile passes that directory in `GPUQUEUE_E2E_BIN`; without it the harness runs the script
//! itself, so `cargo test -p gpuqueue-e2e` works on its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The environment variable naming the binary directory (skips running the build script).
pub const BIN_DIR_ENV: &str = "GPUQUEUE_E2E_BIN";

/// Every file the harness runs or reads from the binary directory.
const REQUIRED: [&str; 7] = [
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubectl",
    "kwok",
    "kwok-stages.yaml",
];

/// The repository root (the workspace holding this crate).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or_else(|| Path::new("."))
}

/// Cargo's target directory, where component logs are kept under `e2e-logs/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo_root().join("target"), PathBuf::from)
}

/// `command` (cargo, or a script or `make` target that runs it) without the variables cargo
/// sets for the test or bench that starts it (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, …). Build
/// scripts read some of them and rerun when they change (ring's reads `CARGO_PKG_NAME`): a
/// nested build that inherits them rebuilds ring and all that depends on it, and the next
/// build from a shell rebuilds it all again.
pub fn without_crate_env(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(is_crate_env) {
            command.env_remove(name);
        }
    }
    command
}

/// Whether cargo sets `name` for the crate it builds or runs (not for cargo itself, such as
/// `CARGO_HOME` or `CARGO_TARGET_DIR`).
fn is_crate_env(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "OUT_DIR"
        )
}

/// The directory holding etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
/// kubectl, kwok and kwok's stage file; built on first use if needed.
pub fn bin_dir() -> Result<&'static Path> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| locate().map_err(|e| e.to_string()))
        .as_deref()
        .map_err(|e| Error::Build(e.clone()))
}

fn locate() -> Result<PathBuf> {
    let dir = match std::env::var_os(BIN_DIR_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => run_build_script()?,
    };
    let missing: Vec<&str> = REQUIRED
        .into_iter()
        .filter(|f| !dir.join(f).exists())
        .collect();
    if missing.is_empty() {
        Ok(dir)
    } else {
        Err(Error::Build(format!(
            "{} lacks {} (run e2e/scripts/build-tools.sh, or unset {BIN_DIR_ENV})",
            dir.display(),
            missing.join(", ")
        )))
    }
}

fn run_build_script() -> Result<PathBuf> {
    let script = repo_root().join("e2e/scripts/build-tools.sh");
    // Build progress goes to our stderr; the last line of stdout is the directory.
    let output = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(Error::io(format!("running {}", script.display())))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stdout.lines().last() {
        Some(dir) if output.status.success() => Ok(PathBuf::from(dir.trim())),
        _ => Err(Error::Build(format!(
            "{} exited with {}",
            script.display(),
            output.status
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::is_crate_env;

    #[test]
    fn a_nested_build_loses_the_crates_variables_and_keeps_cargos_own() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_BIN_EXE_x",
            "OUT_DIR",
        ] {
            assert!(is_crate_env(name), "{name}");
        }
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_JOBS",
            "PATH",
        ] {
            assert!(!is_crate_env(name), "{name}");
        }
    }
}
