//! Reading the live cluster for `simulate --from-cluster`, and proposed GpuQueue manifests for
//! `--queue`. Only reads: the CLI never writes to the cluster.

use std::path::{Path, PathBuf};

use gpuqueue_api::v1alpha1::GpuQueue;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

/// The objects a simulation of the live cluster starts from.
#[derive(Debug)]
pub struct LiveCluster {
    /// Every node.
    pub nodes: Vec<Node>,
    /// Every GpuQueue.
    pub queues: Vec<GpuQueue>,
}

/// Why the cluster or a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No kubeconfig or in-cluster configuration, or the API server refused the client.
    #[error("cannot connect to the cluster (current kubeconfig context): {0}")]
    Connect(#[source] kube::Error),
    /// A list call failed.
    #[error("cannot list {what}: {source}")]
    List {
        /// What was listed.
        what: &'static str,
        /// The API error.
        source: kube::Error,
    },
    /// A manifest file could not be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A manifest is not a GpuQueue.
    #[error("{path}: document {index}: {message}")]
    Manifest {
        /// The file.
        path: PathBuf,
        /// 1-based document number in the file.
        index: usize,
        /// What is wrong.
        message: String,
    },
}

/// Lists nodes and GpuQueues with the current kubeconfig context.
pub async fn fetch() -> Result<LiveCluster, ClusterError> {
    let client = kube::Client::try_default()
        .await
        .map_err(ClusterError::Connect)?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|source| ClusterError::List {
            what: "nodes",
            source,
        })?
        .items;
    let queues = Api::<GpuQueue>::all(client)
        .list(&ListParams::default())
        .await
        .map_err(|source| ClusterError::List {
            what: "gpuqueues.gpuqueue.io (is the CRD installed?)",
            source,
        })?
        .items;
    Ok(LiveCluster { nodes, queues })
}

/// Reads GpuQueue manifests (multi-document YAML) from a file.
pub fn read_queue_manifests(path: &Path) -> Result<Vec<GpuQueue>, ClusterError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClusterError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse_queue_manifests(path, &text)
}

/// Parses GpuQueue manifests; `path` names the source in errors.
pub fn parse_queue_manifests(path: &Path, text: &str) -> Result<Vec<GpuQueue>, ClusterError> {
    // Two passes over the same documents: untyped to check the kind, then typed so that a bad
    // field is reported with its path, line and column in the user's file.
    let untyped = serde_yaml::Deserializer::from_str(text);
    let typed = serde_yaml::Deserializer::from_str(text);
    let mut queues = Vec::new();
    for (i, (raw, document)) in untyped.zip(typed).enumerate() {
        let manifest = |message: String| ClusterError::Manifest {
            path: path.to_owned(),
            index: i + 1,
            message,
        };
        let value: serde_yaml::Value =
            serde::Deserialize::deserialize(raw).map_err(|e| manifest(e.to_string()))?;
        if value.is_null() {
            continue; // an empty document, e.g. after a trailing `---`
        }
        let field = |name: &str| {
            value
                .get(name)
                .and_then(serde_yaml::Value::as_str)
                .unwrap_or_default()
        };
        let (api_version, kind) = (field("apiVersion"), field("kind"));
        if kind != "GpuQueue" || api_version != "gpuqueue.io/v1alpha1" {
            return Err(manifest(format!(
                "expected apiVersion gpuqueue.io/v1alpha1 and kind GpuQueue, found {api_version:?} {kind:?}"
            )));
        }
        let queue: GpuQueue =
            serde::Deserialize::deserialize(document).map_err(|e| manifest(e.to_string()))?;
        if queue
            .metadata
            .name
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            return Err(manifest("metadata.name must be set".into()));
        }
        queues.push(queue);
    }
    Ok(queues)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    const QUEUE: &str = "apiVersion: gpuqueue.io/v1alpha1
kind: GpuQueue
metadata: {name: search}
spec:
  namespaces: [search]
  resources: [{name: nvidia.com/gpu, guaranteed: 16, burstable: 8}]
";

    #[test]
    fn reads_multi_document_manifests() {
        let text = format!("{QUEUE}---\n{}---\n", QUEUE.replace("search", "ads"));
        let queues = parse_queue_manifests(Path::new("q.yaml"), &text).unwrap();
        let names: Vec<_> = queues
            .iter()
            .map(|q| q.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, vec!["search", "ads"]);
        assert_eq!(queues[0].spec.resources[0].guaranteed, 16);
    }

    #[test]
    fn refuses_other_kinds_and_bad_fields() {
        let err =
            parse_queue_manifests(Path::new("q.yaml"), &QUEUE.replace("GpuQueue", "ConfigMap"))
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            "q.yaml: document 1: expected apiVersion gpuqueue.io/v1alpha1 and kind GpuQueue, found \"gpuqueue.io/v1alpha1\" \"ConfigMap\""
        );
        let err = parse_queue_manifests(
            Path::new("q.yaml"),
            &QUEUE.replace("guaranteed: 16", "guaranteed: lots"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("q.yaml: document 1: spec.resources[0].guaranteed: invalid type"),
            "{err}"
        );
        assert!(err.contains("line 6"), "{err}");
    }
}
