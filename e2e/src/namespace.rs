//! A namespace of its own for each test, named after the test with a random suffix.

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

use crate::error::{Error, Result};

/// Label on every namespace the harness creates, so leftovers are easy to find.
pub const TEST_NAMESPACE_LABEL: &str = "gpuqueue.io/e2e-test";

/// A namespace created for one test. Dropping it deletes it in the background (when a tokio
/// runtime is running); [`TempNamespace::delete`] deletes it and waits for the answer.
pub struct TempNamespace {
    name: String,
    client: Client,
    deleted: bool,
}

impl TempNamespace {
    /// Creates `<prefix>-<random>`; `prefix` should name the test.
    pub async fn create(client: &Client, prefix: &str) -> Result<Self> {
        let name = format!("{prefix}-{:08x}", rand::random::<u32>());
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(TEST_NAMESPACE_LABEL.to_owned(), prefix.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(Error::kube(format!("creating namespace {name}")))?;
        Ok(Self {
            name,
            client: client.clone(),
            deleted: false,
        })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Deletes the namespace (kube-controller-manager then removes what is in it).
    pub async fn delete(mut self) -> Result<()> {
        self.deleted = true;
        Api::<Namespace>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await
            .map(|_| ())
            .map_err(Error::kube(format!("deleting namespace {}", self.name)))
    }
}

impl std::fmt::Debug for TempNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TempNamespace")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Drop for TempNamespace {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let api = Api::<Namespace>::all(self.client.clone());
            let name = std::mem::take(&mut self.name);
            // Best effort: a control plane torn down with the test takes the namespace anyway.
            runtime.spawn(async move { api.delete(&name, &DeleteParams::default()).await });
        }
    }
}
