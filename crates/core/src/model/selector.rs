//! Label selectors, node affinity and taints: the node rules kube-scheduler applies to a pod,
//! evaluated here so that a pod is only ever pinned to a node it can actually be bound to.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

/// Labels of a node or namespace.
pub type Labels = BTreeMap<String, String>;

/// How a requirement compares a label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    /// The label is an integer greater than the single value (node affinity only).
    Gt,
    /// The label is an integer less than the single value (node affinity only).
    Lt,
}

/// One `key <operator> values` requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

impl Requirement {
    /// Whether `labels` satisfy the requirement.
    pub fn matches(&self, labels: &Labels) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Gt | Operator::Lt => {
                let (Some(label), Some(bound)) = (
                    value.and_then(|v| v.parse::<i64>().ok()),
                    self.values.first().and_then(|v| v.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.operator == Operator::Gt {
                    label > bound
                } else {
                    label < bound
                }
            }
        }
    }

    fn parse(
        key: &str,
        operator: &str,
        values: Option<&Vec<String>>,
        field: &str,
        allow_numeric: bool,
    ) -> Result<Self, SelectorError> {
        let err = |rule: String| SelectorError {
            field: field.to_string(),
            rule,
        };
        let values = values.cloned().unwrap_or_default();
        let operator = match operator {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" if allow_numeric => Operator::Gt,
            "Lt" if allow_numeric => Operator::Lt,
            other => return Err(err(format!("operator {other:?} is not supported"))),
        };
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return Err(err(format!(
                    "operator {operator:?} needs at least one value"
                )));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return Err(err(format!("operator {operator:?} takes no values")));
            }
            Operator::Gt | Operator::Lt
                if values.len() != 1 || values[0].parse::<i64>().is_err() =>
            {
                return Err(err(format!(
                    "operator {operator:?} needs exactly one integer value"
                )));
            }
            _ => {}
        }
        Ok(Self {
            key: key.to_string(),
            operator,
            values,
        })
    }
}

/// A selector that cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct SelectorError {
    pub field: String,
    pub rule: String,
}

/// A label selector (`matchLabels` and `matchExpressions`, all of which must hold).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Reads a Kubernetes label selector; `field` names it in errors.
    pub fn from_k8s(selector: &meta::LabelSelector, field: &str) -> Result<Self, SelectorError> {
        let mut requirements: Vec<Requirement> = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(key, value)| Requirement {
                key: key.clone(),
                operator: Operator::In,
                values: vec![value.clone()],
            })
            .collect();
        for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
            requirements.push(Requirement::parse(
                &expr.key,
                &expr.operator,
                expr.values.as_ref(),
                &format!("{field}.matchExpressions[{i}]"),
                false,
            )?);
        }
        Ok(Self { requirements })
    }

    /// Whether `labels` satisfy every requirement. An empty selector matches everything.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

/// What a taint does to pods that do not tolerate it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    fn parse(effect: &str) -> Option<Self> {
        match effect {
            "NoSchedule" => Some(Self::NoSchedule),
            "PreferNoSchedule" => Some(Self::PreferNoSchedule),
            "NoExecute" => Some(Self::NoExecute),
            _ => None,
        }
    }
}

/// A node taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: TaintEffect,
}

impl Taint {
    /// Reads a node's taint; unknown effects are kept out (kube-scheduler ignores them too).
    pub fn from_k8s(taint: &k8s::Taint) -> Option<Self> {
        Some(Self {
            key: taint.key.clone(),
            value: taint.value.clone().unwrap_or_default(),
            effect: TaintEffect::parse(&taint.effect)?,
        })
    }
}

/// A pod's toleration of taints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toleration {
    /// Empty with `exists`: tolerates every taint.
    pub key: String,
    /// `Exists` ignores the value; `Equal` compares it.
    pub exists: bool,
    pub value: String,
    /// `None`: every effect.
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    pub fn from_k8s(toleration: &k8s::Toleration) -> Self {
        Self {
            key: toleration.key.clone().unwrap_or_default(),
            exists: toleration.operator.as_deref() == Some("Exists"),
            value: toleration.value.clone().unwrap_or_default(),
            effect: toleration.effect.as_deref().and_then(TaintEffect::parse),
        }
    }

    fn tolerates(&self, taint: &Taint) -> bool {
        if self.effect.is_some_and(|effect| effect != taint.effect) {
            return false;
        }
        if self.key.is_empty() {
            return self.exists;
        }
        self.key == taint.key && (self.exists || self.value == taint.value)
    }
}

/// The node rules of a pod that kube-scheduler enforces: node selector, required node affinity
/// and tolerations. Preferences (soft affinity, `PreferNoSchedule`) do not restrict placement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRules {
    /// `spec.nodeSelector`: every label must match exactly.
    pub node_selector: Labels,
    /// Required node affinity: any term may match; within a term every requirement must.
    /// Empty: no affinity.
    pub affinity_terms: Vec<NodeSelectorTerm>,
    pub tolerations: Vec<Toleration>,
}

/// One term of required node affinity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSelectorTerm {
    /// Requirements on node labels.
    pub labels: Vec<Requirement>,
    /// Requirements on `metadata.name` (the only field node affinity can match).
    pub names: Vec<Requirement>,
}

impl NodeRules {
    /// Reads the node rules of a pod spec; `None` when the pod has none (the common case,
    /// which keeps placement on its fast path).
    pub fn from_k8s(spec: &k8s::PodSpec) -> Result<Option<Self>, SelectorError> {
        let node_selector: Labels = spec
            .node_selector
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let mut affinity_terms = Vec::new();
        let required = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|na| {
                na.required_during_scheduling_ignored_during_execution
                    .as_ref()
            });
        if let Some(required) = required {
            for (t, term) in required.node_selector_terms.iter().enumerate() {
                let field = format!(
                    "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{t}]"
                );
                let mut parsed = NodeSelectorTerm::default();
                for (i, expr) in term.match_expressions.iter().flatten().enumerate() {
                    parsed.labels.push(Requirement::parse(
                        &expr.key,
                        &expr.operator,
                        expr.values.as_ref(),
                        &format!("{field}.matchExpressions[{i}]"),
                        true,
                    )?);
                }
                for (i, expr) in term.match_fields.iter().flatten().enumerate() {
                    let field = format!("{field}.matchFields[{i}]");
                    if expr.key != "metadata.name" {
                        return Err(SelectorError {
                            field,
                            rule: format!(
                                "field {:?} is not supported; only metadata.name",
                                expr.key
                            ),
                        });
                    }
                    parsed.names.push(Requirement::parse(
                        &expr.key,
                        &expr.operator,
                        expr.values.as_ref(),
                        &field,
                        false,
                    )?);
                }
                affinity_terms.push(parsed);
            }
        }
        let tolerations: Vec<Toleration> = spec
            .tolerations
            .iter()
            .flatten()
            .map(Toleration::from_k8s)
            .collect();
        let rules = Self {
            node_selector,
            affinity_terms,
            tolerations,
        };
        Ok((rules != Self::default()).then_some(rules))
    }

    /// Whether a node with this name, labels and taints passes every rule.
    pub fn admits(&self, node_name: &str, labels: &Labels, taints: &[Taint]) -> bool {
        let selector_ok = self
            .node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v));
        let affinity_ok = self.affinity_terms.is_empty()
            || self.affinity_terms.iter().any(|term| {
                let name_labels: Labels = [("metadata.name".to_string(), node_name.to_string())]
                    .into_iter()
                    .collect();
                // An empty term matches nothing, as in Kubernetes.
                !(term.labels.is_empty() && term.names.is_empty())
                    && term.labels.iter().all(|r| r.matches(labels))
                    && term.names.iter().all(|r| r.matches(&name_labels))
            });
        selector_ok && affinity_ok && tolerates_all(&self.tolerations, taints)
    }
}

/// Whether the tolerations cover every taint that keeps pods off a node.
pub fn tolerates_all(tolerations: &[Toleration], taints: &[Taint]) -> bool {
    taints
        .iter()
        .filter(|t| t.effect != TaintEffect::PreferNoSchedule)
        .all(|taint| tolerations.iter().any(|t| t.tolerates(taint)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn requirements_follow_kubernetes_semantics() {
        let l = labels(&[("team", "a"), ("gpus", "8")]);
        let req = |key: &str, operator, values: &[&str]| Requirement {
            key: key.into(),
            operator,
            values: values.iter().map(|v| (*v).to_string()).collect(),
        };
        assert!(req("team", Operator::In, &["a", "b"]).matches(&l));
        assert!(!req("team", Operator::NotIn, &["a"]).matches(&l));
        assert!(
            req("zone", Operator::NotIn, &["x"]).matches(&l),
            "NotIn holds for a missing label"
        );
        assert!(req("team", Operator::Exists, &[]).matches(&l));
        assert!(req("zone", Operator::DoesNotExist, &[]).matches(&l));
        assert!(req("gpus", Operator::Gt, &["4"]).matches(&l));
        assert!(!req("gpus", Operator::Lt, &["4"]).matches(&l));
        assert!(
            !req("team", Operator::Gt, &["4"]).matches(&l),
            "a non-integer label never compares"
        );
    }

    #[test]
    fn selector_errors_name_the_field() {
        let selector: meta::LabelSelector = serde_json::from_value(serde_json::json!({
            "matchExpressions": [{"key": "team", "operator": "In", "values": []}]
        }))
        .unwrap();
        let err = LabelSelector::from_k8s(&selector, "spec.namespaceSelector").unwrap_err();
        assert_eq!(err.field, "spec.namespaceSelector.matchExpressions[0]");
        assert!(err.rule.contains("at least one value"), "{err}");
    }

    #[test]
    fn taints_keep_off_pods_without_tolerations() {
        let taints = vec![
            Taint {
                key: "gpu".into(),
                value: "h100".into(),
                effect: TaintEffect::NoSchedule,
            },
            Taint {
                key: "soft".into(),
                value: String::new(),
                effect: TaintEffect::PreferNoSchedule,
            },
        ];
        assert!(!tolerates_all(&[], &taints));
        let equal = Toleration {
            key: "gpu".into(),
            exists: false,
            value: "h100".into(),
            effect: Some(TaintEffect::NoSchedule),
        };
        assert!(tolerates_all(std::slice::from_ref(&equal), &taints));
        let wrong_value = Toleration {
            value: "a100".into(),
            ..equal.clone()
        };
        assert!(!tolerates_all(&[wrong_value], &taints));
        let everything = Toleration {
            key: String::new(),
            exists: true,
            value: String::new(),
            effect: None,
        };
        assert!(tolerates_all(&[everything], &taints));
    }
}
