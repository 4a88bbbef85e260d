//! A namespace as the policy sees it: its name and labels.

use k8s_openapi::api::core::v1 as k8s;

use super::selector::Labels;

/// A namespace: its name and labels, which queues' namespace selectors match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    pub labels: Labels,
}

impl Namespace {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            labels: Labels::new(),
        }
    }

    #[must_use]
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub fn from_k8s(namespace: &k8s::Namespace) -> Self {
        Self {
            name: namespace.metadata.name.clone().unwrap_or_default(),
            labels: namespace
                .metadata
                .labels
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
        }
    }
}
