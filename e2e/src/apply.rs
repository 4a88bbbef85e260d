//! Server-side apply of YAML manifests (one or many documents), the way `kubectl apply
//! --server-side` does it: each object's kind is looked up in discovery, so CRDs work too.

use std::path::Path;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::{self, Scope};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::wait::{DEFAULT_TIMEOUT, wait_for};

/// The field manager the tests apply with (not the operator's).
pub const FIELD_MANAGER: &str = "gpuqueue-e2e";

/// Applies every document of `yaml` with server-side apply, forcing ownership. Namespaced
/// objects without a namespace go to `namespace` (or `default`). Returns the applied objects
/// as the API server stored them.
pub async fn apply_yaml(
    client: &Client,
    yaml: &str,
    namespace: Option<&str>,
) -> Result<Vec<DynamicObject>> {
    write_yaml(client, yaml, namespace, WriteMode::Apply).await
}

/// Writes every document of `yaml` with `mode`, in order, stopping at the first refusal.
pub async fn write_yaml(
    client: &Client,
    yaml: &str,
    namespace: Option<&str>,
    mode: WriteMode,
) -> Result<Vec<DynamicObject>> {
    let mut written = Vec::new();
    for (index, document) in documents(yaml)?.into_iter().enumerate() {
        written.push(write_document(client, document, namespace, index + 1, mode).await?);
    }
    Ok(written)
}

/// [`apply_yaml`] on a file; errors name the file.
pub async fn apply_file(
    client: &Client,
    path: &Path,
    namespace: Option<&str>,
) -> Result<Vec<DynamicObject>> {
    write_file(client, path, namespace, WriteMode::Apply).await
}

/// [`write_yaml`] on a file; errors name the file.
pub async fn write_file(
    client: &Client,
    path: &Path,
    namespace: Option<&str>,
    mode: WriteMode,
) -> Result<Vec<DynamicObject>> {
    let yaml =
        std::fs::read_to_string(path).map_err(Error::io(format!("reading {}", path.display())))?;
    write_yaml(client, &yaml, namespace, mode)
        .await
        .map_err(|e| match e {
            Error::Kube { what, source } => Error::Kube {
                what: format!("{}: {what}", path.display()),
                source,
            },
            Error::Manifest { what, reason } => Error::Manifest {
                what: format!("{}: {what}", path.display()),
                reason,
            },
            other => other,
        })
}

/// Applies every `*.yaml` in `dir` (the repository's `crds/`) and waits until each
/// CustomResourceDefinition is Established and each of its versions is discovered and listed,
/// so its kinds can be applied right after: the API server sets Established before its
/// discovery handler knows the group (a lookup in between is a 404) and before its cache of
/// the resource is ready (a 429).
pub async fn install_crds(client: &Client, dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for path in yaml_files(dir)? {
        for object in apply_file(client, &path, None).await? {
            names.extend(object.metadata.name);
        }
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    stream::iter(names.iter())
        .map(|name| {
            let (crds, client) = (crds.clone(), client.clone());
            wait_for(
                format!("CRD {name} to be Established and discoverable"),
                DEFAULT_TIMEOUT,
                move || {
                    let (crds, client) = (crds.clone(), client.clone());
                    async move {
                        let crd = crds.get(name).await.map_err(|e| e.to_string())?;
                        let established = crd
                            .status
                            .and_then(|s| s.conditions)
                            .unwrap_or_default()
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True");
                        if !established {
                            return Err("not Established".to_owned());
                        }
                        for version in crd.spec.versions.iter().filter(|v| v.served) {
                            let gvk = GroupVersionKind::gvk(
                                &crd.spec.group,
                                &version.name,
                                &crd.spec.names.kind,
                            );
                            let gv = format!("{}/{}", crd.spec.group, version.name);
                            let (resource, _) = discovery::pinned_kind(&client, &gvk)
                                .await
                                .map_err(|e| format!("{gv} not discoverable: {e}"))?;
                            // A list answers 429 until the API server's cache of it is ready.
                            Api::<DynamicObject>::all_with(client.clone(), &resource)
                                .list_metadata(&ListParams::default().limit(1))
                                .await
                                .map_err(|e| format!("{gv} not yet served: {e}"))?;
                        }
                        Ok(())
                    }
                },
            )
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(names)
}

/// The `*.yaml` files directly in `dir`, sorted by name.
pub fn yaml_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let entries =
        std::fs::read_dir(dir).map_err(Error::io(format!("listing {}", dir.display())))?;
    let mut files: Vec<_> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file() && path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

/// The non-empty documents of a multi-document YAML text.
fn documents(yaml: &str) -> Result<Vec<DynamicObject>> {
    let mut objects = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
        let what = format!("YAML document {}", index + 1);
        let value = serde_yaml::Value::deserialize(document).map_err(|e| Error::Manifest {
            what: what.clone(),
            reason: e.to_string(),
        })?;
        if value.is_null() {
            continue; // a document of comments only, or a trailing `---`
        }
        let object: DynamicObject = serde_yaml::from_value(value).map_err(|e| Error::Manifest {
            what,
            reason: e.to_string(),
        })?;
        objects.push(object);
    }
    Ok(objects)
}

/// How a document is written: server-side apply (`kubectl apply --server-side`, GitOps tools)
/// or a plain create (`kubectl create`, and what client-side `kubectl apply` does first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Server-side apply with the harness's field manager, forcing ownership.
    Apply,
    /// A create (POST); fails if the object exists.
    Create,
}

async fn write_document(
    client: &Client,
    object: DynamicObject,
    namespace: Option<&str>,
    index: usize,
    mode: WriteMode,
) -> Result<DynamicObject> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let Some(types) = object.types.clone() else {
        return Err(Error::Manifest {
            what: format!("document {index} ({name})"),
            reason: "apiVersion and kind are required".to_owned(),
        });
    };
    let verb = match mode {
        WriteMode::Apply => "applying",
        WriteMode::Create => "creating",
    };
    let what = format!("{verb} {} {name} (document {index})", types.kind);
    if name.is_empty() {
        return Err(Error::Manifest {
            what,
            reason: "metadata.name is required".to_owned(),
        });
    }
    let gvk = GroupVersionKind::try_from(&types).map_err(|e| Error::Manifest {
        what: what.clone(),
        reason: e.to_string(),
    })?;
    let (resource, capabilities) =
        discovery::pinned_kind(client, &gvk)
            .await
            .map_err(Error::kube(format!(
                "{what}: looking up {}",
                types.api_version
            )))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => {
            let ns = object
                .metadata
                .namespace
                .as_deref()
                .or(namespace)
                .unwrap_or("default");
            Api::namespaced_with(client.clone(), ns, &resource)
        }
    };
    let written = match mode {
        WriteMode::Apply => {
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
        }
        WriteMode::Create => api.create(&PostParams::default(), &object).await,
    };
    written.map_err(Error::kube(what))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    #[test]
    fn documents_skip_empty_ones_and_keep_order() {
        let yaml = "# only a comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n";
        let names: Vec<_> = documents(yaml)
            .unwrap()
            .into_iter()
            .map(|o| (o.types.unwrap().kind, o.metadata.name.unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                ("ConfigMap".into(), "a".into()),
                ("Namespace".into(), "b".into())
            ]
        );
    }

    #[test]
    fn broken_yaml_names_the_document() {
        let err = documents("apiVersion: v1\nkind: ConfigMap\n---\nkind: [unclosed\n").unwrap_err();
        assert!(err.to_string().starts_with("YAML document 2"), "{err}");
    }
}
