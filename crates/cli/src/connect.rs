//! Reaching the cluster for the read-only commands (`queues`, `explain`, `handovers`), and
//! turning the API server's refusals into messages that say what is wrong and what to do.

use std::ffi::OsStr;
use std::fmt::Display;
use std::path::{Path, PathBuf};

use gpuqueue_api::v1alpha1::GpuQueue;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::args::ClusterArgs;

/// Why an inspecting command failed. Each message names the object or permission at fault.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// No usable kubeconfig, or the client could not be built.
    #[error("cannot connect to the cluster: {0}")]
    Connect(String),
    /// The object does not exist.
    #[error("{what} not found")]
    NotFound {
        /// The object, such as `pod batch/vllm-0`.
        what: String,
    },
    /// RBAC refused a read.
    #[error("no permission to {action}: {message}")]
    Forbidden {
        /// What was refused, such as `get pods in namespace batch`.
        action: String,
        /// The API server's message, which names the user.
        message: String,
    },
    /// The cluster does not serve `gpuqueues.gpuqueue.io`.
    #[error(
        "the GpuQueue CRD (gpuqueues.gpuqueue.io) is not installed in this cluster; install gpuqueue first (kubectl apply --server-side -k config/)"
    )]
    CrdMissing,
    /// Any other failed request, such as an unreachable API server.
    #[error("cannot {action}: {message}")]
    Api {
        /// What was asked, such as `list GpuQueues`.
        action: String,
        /// The client's error with its causes: kube's own text alone ("client error
        /// (Connect)") does not say that the connection was refused.
        message: String,
    },
    /// Printing the result failed.
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    /// Encoding the result as JSON or YAML failed.
    #[error("cannot encode the output: {0}")]
    Encode(String),
}

impl InspectError {
    /// Classifies a failed request to `action` (`get pods in namespace batch`) on `what`
    /// (`pod batch/vllm-0`): not found, forbidden, or anything else.
    pub fn from_api(action: impl Into<String>, what: impl Display, error: kube::Error) -> Self {
        // By code as well as reason: a resource the server does not serve answers a plain-text
        // `404 page not found`, which kube turns into a Status without the `NotFound` reason.
        match error {
            kube::Error::Api(status) if status.is_not_found() || status.code == 404 => {
                Self::NotFound {
                    what: what.to_string(),
                }
            }
            kube::Error::Api(status) if status.is_forbidden() || status.code == 403 => {
                Self::Forbidden {
                    action: action.into(),
                    message: status.message,
                }
            }
            other => Self::Api {
                action: action.into(),
                message: with_causes(&other),
            },
        }
    }

    /// Classifies a failed list of GpuQueues, where "not found" means the CRD is missing.
    pub fn from_queue_list(error: kube::Error) -> Self {
        match Self::from_api("list GpuQueues", "GpuQueues", error) {
            Self::NotFound { .. } => Self::CrdMissing,
            other => other,
        }
    }
}

/// `error` and its causes on one line, each after a colon.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        // kube repeats its cause in its own text at times; say each thing once.
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// Why there is no kubeconfig to read, when that is why the client cannot be configured:
/// `$KUBECONFIG` (or `~/.kube/config` without it) names no existing file and the command does
/// not run in a pod. `None` when a kubeconfig exists (its error is then the one to show).
pub fn no_kubeconfig(
    kubeconfig_env: Option<&OsStr>,
    home: Option<&Path>,
    in_cluster: bool,
    exists: impl Fn(&Path) -> bool,
) -> Option<String> {
    if in_cluster {
        return None;
    }
    let tried = if let Some(paths) = kubeconfig_env.filter(|v| !v.is_empty()) {
        if std::env::split_paths(paths).any(|p| exists(&p)) {
            return None;
        }
        format!(
            "$KUBECONFIG ({}) names no existing file",
            paths.to_string_lossy()
        )
    } else {
        let default = home?.join(".kube").join("config");
        if exists(&default) {
            return None;
        }
        format!(
            "$KUBECONFIG is not set and {} does not exist",
            default.display()
        )
    };
    Some(format!(
        "no kubeconfig: {tried}, and this is not a pod in a cluster; pass --kubeconfig FILE or set KUBECONFIG"
    ))
}

/// A client and the namespace the kubeconfig context names.
#[derive(Clone)]
pub struct Cluster {
    pub client: Client,
    /// The context's namespace, else `default`, as kubectl uses it.
    pub default_namespace: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("default_namespace", &self.default_namespace)
            .finish_non_exhaustive()
    }
}

/// Connects with kubectl's rules: `--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`,
/// else the in-cluster service account; `--context` picks a context.
pub async fn connect(args: &ClusterArgs) -> Result<Cluster, InspectError> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let mut config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            if !path.exists() {
                return Err(InspectError::Connect(format!(
                    "kubeconfig {} does not exist (--kubeconfig)",
                    path.display()
                )));
            }
            let source = format!("kubeconfig {}", path.display());
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| InspectError::Connect(format!("{source}: {e}")))?;
            from_kubeconfig(kubeconfig, &options, &source).await?
        }
        (None, Some(_)) => {
            let kubeconfig = Kubeconfig::read().map_err(|e| {
                let home = std::env::var_os("HOME").map(PathBuf::from);
                let env = std::env::var_os("KUBECONFIG");
                InspectError::Connect(
                    no_kubeconfig(env.as_deref(), home.as_deref(), false, Path::exists)
                        .unwrap_or_else(|| with_causes(&e)),
                )
            })?;
            from_kubeconfig(kubeconfig, &options, "the kubeconfig").await?
        }
        (None, None) => Config::infer().await.map_err(|e| {
            let home = std::env::var_os("HOME").map(PathBuf::from);
            let env = std::env::var_os("KUBECONFIG");
            let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
            InspectError::Connect(
                no_kubeconfig(env.as_deref(), home.as_deref(), in_cluster, Path::exists)
                    .unwrap_or_else(|| with_causes(&e)),
            )
        })?,
    };
    config.read_timeout = Some(args.request_timeout);
    // kube's default retries 429/503/504 with backoff for minutes; a person at a terminal
    // wants the answer or the error now.
    config.default_retry = false;
    let default_namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(|e| InspectError::Connect(e.to_string()))?;
    Ok(Cluster {
        client,
        default_namespace,
    })
}

/// Every GpuQueue, or only the one named.
pub async fn read_queues(
    client: Client,
    name: Option<&str>,
) -> Result<Vec<GpuQueue>, InspectError> {
    let api = Api::<GpuQueue>::all(client);
    let Some(name) = name else {
        return api
            .list(&ListParams::default())
            .await
            .map(|list| list.items)
            .map_err(InspectError::from_queue_list);
    };
    match api.get(name).await {
        Ok(queue) => Ok(vec![queue]),
        Err(e) => match InspectError::from_api("get GpuQueues", format!("GpuQueue {name}"), e) {
            not_found @ InspectError::NotFound { .. } => {
                // A missing queue, or no such resource at all: the list tells which.
                api.list(&ListParams::default().limit(1))
                    .await
                    .map_err(InspectError::from_queue_list)?;
                Err(not_found)
            }
            other => Err(other),
        },
    }
}

/// The client configuration of `kubeconfig` (read from `source`, for messages), after checking
/// that the context asked for exists: kube reports a missing one as "failed to load current
/// context", which names neither the file nor the contexts there are.
async fn from_kubeconfig(
    kubeconfig: Kubeconfig,
    options: &KubeConfigOptions,
    source: &str,
) -> Result<Config, InspectError> {
    if let Some(context) = &options.context
        && let Some(message) = missing_context(&kubeconfig, context, source)
    {
        return Err(InspectError::Connect(message));
    }
    Config::from_custom_kubeconfig(kubeconfig, options)
        .await
        .map_err(|e| InspectError::Connect(format!("{source}: {}", with_causes(&e))))
}

/// Why `context` cannot be used: `source` has no context of that name.
pub fn missing_context(kubeconfig: &Kubeconfig, context: &str, source: &str) -> Option<String> {
    let names: Vec<&str> = kubeconfig
        .contexts
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    if names.contains(&context) {
        return None;
    }
    Some(if names.is_empty() {
        format!("{source} has no context {context:?} (it has no contexts)")
    } else {
        format!(
            "{source} has no context {context:?} (it has: {})",
            names.join(", ")
        )
    })
}

/// Builds a current-thread runtime and runs `future` on it: the commands make a handful of
/// sequential requests, so one thread is enough.
pub fn block_on<T>(
    future: impl Future<Output = Result<T, InspectError>>,
) -> Result<T, InspectError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(future)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;
    use kube::core::Status;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure(message, reason).with_code(code)))
    }

    #[test]
    fn refusals_are_named() {
        let cases = [
            (
                api(404, "NotFound", "pods \"x\" not found"),
                "pod batch/x not found",
            ),
            (
                api(
                    403,
                    "Forbidden",
                    "pods \"x\" is forbidden: User \"alice\" cannot get resource \"pods\"",
                ),
                "no permission to get pods in namespace batch: pods \"x\" is forbidden: User \"alice\" cannot get resource \"pods\"",
            ),
            (
                api(500, "InternalError", "etcd is down"),
                "cannot get pods in namespace batch: ",
            ),
        ];
        for (error, expected) in cases {
            let message =
                InspectError::from_api("get pods in namespace batch", "pod batch/x", error)
                    .to_string();
            assert!(message.starts_with(expected), "{message}");
        }
    }

    #[test]
    fn a_missing_kubeconfig_is_named() {
        let home = Path::new("/home/alice");
        let none = |_: &Path| false;
        assert_eq!(
            no_kubeconfig(None, Some(home), false, none).unwrap(),
            "no kubeconfig: $KUBECONFIG is not set and /home/alice/.kube/config does not exist, and this is not a pod in a cluster; pass --kubeconfig FILE or set KUBECONFIG"
        );
        assert_eq!(
            no_kubeconfig(Some(OsStr::new("/a:/b")), Some(home), false, none).unwrap(),
            "no kubeconfig: $KUBECONFIG (/a:/b) names no existing file, and this is not a pod in a cluster; pass --kubeconfig FILE or set KUBECONFIG"
        );
        // An empty $KUBECONFIG is unset, as kubectl reads it.
        assert!(
            no_kubeconfig(Some(OsStr::new("")), Some(home), false, none)
                .unwrap()
                .contains("$KUBECONFIG is not set")
        );
        // A file that exists, or a pod's service account: the client's own error is the one.
        let only_b = |p: &Path| p == Path::new("/b");
        assert_eq!(
            no_kubeconfig(Some(OsStr::new("/a:/b")), Some(home), false, only_b),
            None
        );
        assert_eq!(no_kubeconfig(None, Some(home), true, none), None);
    }

    #[test]
    fn a_missing_context_is_named_with_the_ones_there_are() {
        let kubeconfig: Kubeconfig = serde_yaml::from_str(
            "contexts: [{name: dev, context: {cluster: c}}, {name: staging, context: {cluster: c}}]",
        )
        .unwrap();
        assert_eq!(missing_context(&kubeconfig, "dev", "kubeconfig k"), None);
        assert_eq!(
            missing_context(&kubeconfig, "prod", "kubeconfig k").unwrap(),
            "kubeconfig k has no context \"prod\" (it has: dev, staging)"
        );
        assert_eq!(
            missing_context(&Kubeconfig::default(), "prod", "the kubeconfig").unwrap(),
            "the kubeconfig has no context \"prod\" (it has no contexts)"
        );
    }

    #[test]
    fn a_missing_queue_resource_means_the_crd_is_not_installed() {
        let error = InspectError::from_queue_list(api(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
        assert!(matches!(error, InspectError::CrdMissing));
        // What kube-apiserver answers for a resource it does not serve: plain text, no reason.
        let error = InspectError::from_queue_list(api(
            404,
            "Failed to parse error data",
            "404 page not found",
        ));
        assert!(matches!(error, InspectError::CrdMissing));
        assert!(
            error
                .to_string()
                .contains("kubectl apply --server-side -k config/")
        );
        let error = InspectError::from_queue_list(api(403, "Forbidden", "no"));
        assert_eq!(error.to_string(), "no permission to list GpuQueues: no");
    }
}
