//! How the fake kubelets (KWOK stages) run pods: like a kubelet where a handover's timing
//! depends on it (`e2e/stages/kubelet.yaml`, the default), or KWOK's fast stages.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_yaml::Value;

use crate::error::{Error, Result};

/// The pod stages of [`NodeBehaviour::Kubelet`], reviewed and versioned in the repository.
const KUBELET_STAGES: &str = include_str!("../stages/kubelet.yaml");

/// The stage file build-tools.sh copies from KWOK's module: its node-initialize stage and
/// its fast pod stages.
const MODULE_STAGES: &str = "kwok-stages.yaml";

/// Annotation of a pod whose process ignores SIGTERM: on [`NodeBehaviour::Kubelet`] nodes it
/// ends only when its grace period is over (the kubelet's SIGKILL), seen at the relist after.
pub const IGNORES_SIGTERM_ANNOTATION: &str = "e2e.gpuqueue.io/ignores-sigterm";

/// Annotation of a pod whose containers never end on [`NodeBehaviour::Kubelet`] nodes once it
/// is deleted, as on a node whose kubelet has stopped: it stays Terminating until it is deleted
/// with grace 0.
pub const NEVER_ENDS_ANNOTATION: &str = "e2e.gpuqueue.io/never-ends";

/// Annotation overriding [`KubeletTiming::ready_after`] for one pod (a Go duration, `"2s"`).
pub const READY_AFTER_ANNOTATION: &str = "e2e.gpuqueue.io/ready-after";

/// How the fake nodes run pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeBehaviour {
    /// A bound pod is Running with its IP at once and Ready after
    /// [`KubeletTiming::ready_after`]; a Job's pod succeeds once Ready; a deleted pod's
    /// containers end a relist or two after it exits within its grace period (when SIGKILL
    /// comes, with [`IGNORES_SIGTERM_ANNOTATION`]; never, with [`NEVER_ENDS_ANNOTATION`]), its
    /// phase turns terminal, and its object is removed 50-750 ms later, or once its finalizers
    /// are gone.
    Kubelet(KubeletTiming),
    /// KWOK's fast stages: Running and Ready at once, removed as soon as it has a deletion
    /// timestamp (no grace period). Only for tests that say why they need it.
    Fast,
}

impl Default for NodeBehaviour {
    fn default() -> Self {
        Self::Kubelet(KubeletTiming::default())
    }
}

/// The delays of [`NodeBehaviour::Kubelet`] that are not taken from the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeletTiming {
    /// From Running (containers started) to Ready.
    pub ready_after: Duration,
    /// The kubelet's generic PLEG relist period: a deleted pod's kill starts at the first
    /// relist after the deletion, and its containers' exit is seen at a later one.
    pub relist: Duration,
}

impl Default for KubeletTiming {
    /// Half a second to Ready: visible in a test, short enough not to slow the suite; the
    /// kubelet's own relist period (1 s).
    fn default() -> Self {
        Self {
            ready_after: Duration::from_millis(500),
            relist: Duration::from_secs(1),
        }
    }
}

/// The stage file KWOK runs with for `behaviour`: the module's for [`NodeBehaviour::Fast`];
/// otherwise the module's node stages and ours for pods, written into `run_dir`.
pub(crate) fn stage_file(
    behaviour: &NodeBehaviour,
    bin_dir: &Path,
    run_dir: &Path,
) -> Result<PathBuf> {
    let module_file = bin_dir.join(MODULE_STAGES);
    let NodeBehaviour::Kubelet(timing) = behaviour else {
        return Ok(module_file);
    };
    let module_text = std::fs::read_to_string(&module_file)
        .map_err(Error::io(format!("reading {}", module_file.display())))?;
    let path = run_dir.join("kwok-kubelet-stages.yaml");
    let text = kubelet_stages(&module_text, *timing)?;
    std::fs::write(&path, text).map_err(Error::io(format!("writing {}", path.display())))?;
    Ok(path)
}

/// The node stages of `module_text` followed by the kubelet pod stages with `timing` applied.
fn kubelet_stages(module_text: &str, timing: KubeletTiming) -> Result<String> {
    let node_stages = stages(module_text, MODULE_STAGES)?
        .into_iter()
        .filter(|stage| stage["spec"]["resourceRef"]["kind"] == "Node");
    let mut pod_stages = stages(KUBELET_STAGES, "e2e/stages/kubelet.yaml")?;
    let ready = pod_stages
        .iter_mut()
        .find(|stage| stage["metadata"]["name"] == "pod-ready")
        .ok_or_else(|| invalid("e2e/stages/kubelet.yaml has no pod-ready stage"))?;
    ready["spec"]["delay"]["durationMilliseconds"] = Value::from(millis(timing.ready_after));
    let relist = millis(timing.relist);
    let grace = ".metadata.deletionGracePeriodSeconds * 1000";
    for stage in &mut pod_stages {
        let name = stage["metadata"]["name"].as_str().map(str::to_owned);
        let delay = &mut stage["spec"]["delay"];
        match name.as_deref() {
            // Killed at the next relist, exited within the grace, seen at a later relist.
            Some("pod-terminate") => {
                delay["durationMilliseconds"] = Value::from(relist);
                delay["jitterDurationFrom"]["expressionFrom"] =
                    jq_millis(&format!("([{grace}, {relist}] | max) + {relist}"));
            }
            // Killed at the next relist, SIGKILLed at the grace's end, seen at the relist after.
            Some("pod-terminate-ignoring-sigterm") => {
                delay["durationMilliseconds"] = Value::from(2 * relist);
                delay["durationFrom"]["expressionFrom"] = jq_millis(&format!("{grace} + {relist}"));
                delay["jitterDurationFrom"]["expressionFrom"] =
                    jq_millis(&format!("{grace} + {}", 2 * relist));
            }
            _ => {}
        }
    }
    node_stages
        .chain(pod_stages)
        .map(|stage| {
            serde_yaml::to_string(&stage).map_err(|e| invalid(format!("writing a stage: {e}")))
        })
        .collect::<Result<Vec<_>>>()
        .map(|documents| documents.join("---\n"))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A KWOK delay expression: jq computing `milliseconds` from the pod, as a Go duration.
fn jq_millis(milliseconds: &str) -> Value {
    Value::from(format!("\"\\({milliseconds})ms\""))
}

/// The non-empty documents of a multi-document stage file.
fn stages(text: &str, what: &str) -> Result<Vec<Value>> {
    serde_yaml::Deserializer::from_str(text)
        .map(|document| {
            Value::deserialize(document).map_err(|e| invalid(format!("parsing {what}: {e}")))
        })
        .filter(|value| !matches!(value, Ok(Value::Null)))
        .collect()
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::Manifest {
        what: "KWOK stages".to_owned(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODULE: &str = "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\n\
        metadata: {name: node-initialize}\nspec: {resourceRef: {apiGroup: v1, kind: Node}}\n---\n\
        apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\n\
        metadata: {name: pod-delete}\nspec: {resourceRef: {apiGroup: v1, kind: Pod}}\n---\n";

    fn names(text: &str) -> Vec<String> {
        stages(text, "test")
            .unwrap()
            .iter()
            .map(|stage| stage["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn keeps_the_module_node_stages_and_replaces_its_pod_stages() {
        let text = kubelet_stages(MODULE, KubeletTiming::default()).unwrap();
        assert_eq!(
            names(&text),
            [
                "node-initialize",
                "pod-start",
                "pod-ready",
                "pod-complete",
                "pod-terminate",
                "pod-terminate-ignoring-sigterm",
                "pod-remove"
            ]
        );
    }

    fn delay(text: &str, name: &str) -> Value {
        stages(text, "test")
            .unwrap()
            .into_iter()
            .find(|stage| stage["metadata"]["name"] == name)
            .unwrap()["spec"]["delay"]
            .clone()
    }

    #[test]
    fn the_delays_come_from_the_timing() {
        let timing = KubeletTiming {
            ready_after: Duration::from_millis(1500),
            relist: Duration::from_millis(400),
        };
        let text = kubelet_stages(MODULE, timing).unwrap();
        assert_eq!(delay(&text, "pod-ready")["durationMilliseconds"], 1500);
        let terminate = delay(&text, "pod-terminate");
        assert_eq!(terminate["durationMilliseconds"], 400);
        assert_eq!(
            terminate["jitterDurationFrom"]["expressionFrom"],
            r#""\(([.metadata.deletionGracePeriodSeconds * 1000, 400] | max) + 400)ms""#
        );
        let stubborn = delay(&text, "pod-terminate-ignoring-sigterm");
        assert_eq!(
            stubborn["durationFrom"]["expressionFrom"],
            r#""\(.metadata.deletionGracePeriodSeconds * 1000 + 400)ms""#
        );
        assert_eq!(
            stubborn["jitterDurationFrom"]["expressionFrom"],
            r#""\(.metadata.deletionGracePeriodSeconds * 1000 + 800)ms""#
        );
    }

    /// The file's own values are those of the default timing, so that it reads as it runs.
    #[test]
    fn the_file_holds_the_default_timing() {
        let written = kubelet_stages(MODULE, KubeletTiming::default()).unwrap();
        for name in ["pod-terminate", "pod-terminate-ignoring-sigterm"] {
            assert_eq!(delay(&written, name), delay(KUBELET_STAGES, name), "{name}");
        }
    }

    /// KWOK picks at random among stages matching the same pod, so the two deletion stages
    /// must split pods on the annotation, one `In`, the other `NotIn` the same value.
    #[test]
    fn the_deletion_stages_split_pods_on_the_sigterm_annotation() {
        let all = stages(KUBELET_STAGES, "test").unwrap();
        let key = format!(".metadata.annotations[\"{IGNORES_SIGTERM_ANNOTATION}\"]");
        let operator = |name: &str| {
            let stage = all
                .iter()
                .find(|stage| stage["metadata"]["name"] == name)
                .unwrap();
            let requirement = stage["spec"]["selector"]["matchExpressions"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|requirement| requirement["key"] == key.as_str())
                .unwrap();
            (
                requirement["operator"].as_str().unwrap().to_owned(),
                requirement["values"].clone(),
            )
        };
        let (normal, normal_values) = operator("pod-terminate");
        let (ignoring, ignoring_values) = operator("pod-terminate-ignoring-sigterm");
        assert_eq!((normal.as_str(), ignoring.as_str()), ("NotIn", "In"));
        assert_eq!(normal_values, ignoring_values);
        for name in ["pod-terminate", "pod-terminate-ignoring-sigterm"] {
            let stage = all
                .iter()
                .find(|stage| stage["metadata"]["name"] == name)
                .unwrap();
            let key = format!(".metadata.annotations[\"{NEVER_ENDS_ANNOTATION}\"]");
            let excludes = stage["spec"]["selector"]["matchExpressions"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|r| r["key"] == key.as_str() && r["operator"] == "NotIn");
            assert!(excludes, "{name} must leave a pod that never ends alone");
        }
    }
}
