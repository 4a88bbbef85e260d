//! The one error type of the harness. Every variant says what was being done, so a failed
//! test reads as a sentence ("starting kube-apiserver: exited with status 1; last lines: …").

use std::path::PathBuf;
use std::time::Duration;

/// Why the harness could not do what a test asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// `e2e/scripts/build-tools.sh` failed or printed no binary directory.
    #[error("building the control-plane binaries failed: {0}")]
    Build(String),

    /// A component exited while the control plane was starting or running.
    #[error("{component} exited ({status}); last lines of {log}:\n{tail}")]
    ComponentExited {
        component: String,
        status: String,
        log: PathBuf,
        tail: String,
    },

    /// A condition did not hold before its deadline.
    #[error("timed out after {timeout:?} waiting for {what}; last observed: {last}")]
    Timeout {
        what: String,
        timeout: Duration,
        last: String,
    },

    /// Every control-plane slot (pod IP range and state directory) is in use.
    #[error("all {0} control-plane slots are in use; stop a cluster (`make cluster-down`) or wait")]
    NoFreeSlot(usize),

    /// A request to the API server failed.
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },

    /// A kubeconfig could not be read or turned into a client configuration.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// A YAML document could not be parsed or lacks what server-side apply needs.
    #[error("{what}: {reason}")]
    Manifest { what: String, reason: String },

    /// Key generation for the service-account signer failed.
    #[error("generating the service-account signing key: {0}")]
    Key(#[from] rcgen::Error),

    /// A test server (Prometheus) could not be reached or answered an error.
    #[error("{what}: {reason}")]
    Http { what: String, reason: String },

    /// The state of a detached cluster is missing or unreadable.
    #[error("cluster state {path}: {reason}")]
    State { path: PathBuf, reason: String },
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }

    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let what = what.into();
        move |source| Self::Kube { what, source }
    }

    /// The API server's answer, when the error is one: tests of refused requests check its
    /// `code`, `reason` and `message`.
    pub fn api_status(&self) -> Option<&kube::core::Status> {
        match self {
            Self::Kube {
                source: kube::Error::Api(status),
                ..
            } => Some(status),
            _ => None,
        }
    }

    /// Whether a component died because another process took its port between our probe
    /// and its bind; start-up retries with fresh ports then.
    pub(crate) fn is_port_clash(&self) -> bool {
        matches!(self, Self::ComponentExited { tail, .. } if tail.contains("address already in use"))
    }
}

/// The harness's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
