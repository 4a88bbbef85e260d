//! Pods as tests write them, one-line descriptions of pods for wait messages, and waiting for a
//! pod to be bound.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use gpuqueue_fake_vllm::{Config as VllmConfig, FakeVllm};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams, ObjectMeta};

use crate::error::{Error, Result};
use crate::wait::{DEFAULT_TIMEOUT, wait_for};

/// A pod asking for `count` of GPU resource `resource` (such as `nvidia.com/gpu` or a MIG
/// profile). Extended resources go in limits (requests default to them). KWOK never pulls
/// the image, so it only has to look real.
pub fn gpu_pod(name: &str, resource: &str, count: u32) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([("app".to_owned(), name.to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".to_owned(),
                image: Some("registry.invalid/gpuqueue-e2e/fake:1".to_owned()),
                resources: Some(ResourceRequirements {
                    limits: Some(BTreeMap::from([(
                        resource.to_owned(),
                        Quantity(count.to_string()),
                    )])),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// Whether the pod's containers have ended for good (phase `Succeeded` or `Failed`): a
/// kubelet's device manager and kube-scheduler count its devices free from then on, while its
/// object may stay a while longer.
pub fn has_finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// The node the pod is bound to (`spec.nodeName`), if it is.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// `team/p-0 phase=Pending node=- ip=- PodScheduled=False(Unschedulable: 0/5 nodes are available: …)`:
/// what a failed wait should say about a pod.
pub fn describe_pod(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let conditions: Vec<String> = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| {
            let detail = match (&c.reason, &c.message) {
                (Some(reason), Some(message)) => format!("({reason}: {message})"),
                (Some(reason), None) => format!("({reason})"),
                _ => String::new(),
            };
            format!("{}={}{detail}", c.type_, c.status)
        })
        .collect();
    format!(
        "{}/{} phase={} node={} ip={} deleting={} {}",
        pod.metadata.namespace.as_deref().unwrap_or("-"),
        pod.metadata.name.as_deref().unwrap_or("-"),
        status.and_then(|s| s.phase.as_deref()).unwrap_or("-"),
        node_of(pod).unwrap_or("-"),
        status.and_then(|s| s.pod_ip.as_deref()).unwrap_or("-"),
        pod.metadata.deletion_timestamp.is_some(),
        conditions.join(" ")
    )
}

/// The pod's condition of `type_` (`PodScheduled`, `Ready`, …), if it has one.
pub fn pod_condition<'a>(
    pod: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// Waits until the pod is bound to a node (by kube-scheduler or anyone); returns it.
///
/// # Errors
/// When it is not bound within [`DEFAULT_TIMEOUT`]; the error describes the pod as last seen.
pub async fn bound_pod(pods: &Api<Pod>, name: &str) -> Result<Pod> {
    wait_for(
        format!("pod {name} to be bound"),
        DEFAULT_TIMEOUT,
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            if node_of(&pod).is_some() {
                Ok(pod)
            } else {
                Err(describe_pod(&pod))
            }
        },
    )
    .await
}

/// Waits until a pod of `pods` other than `first` (by name) is bound: the replacement that
/// `first`'s controller created once it was evicted. Returns it.
///
/// # Errors
/// When none is bound within `timeout`; the error describes every pod as last seen.
pub async fn bound_replacement(pods: &Api<Pod>, first: &str, timeout: Duration) -> Result<Pod> {
    wait_for("a replacement pod bound", timeout, || async {
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .find(|p| p.metadata.name.as_deref() != Some(first) && node_of(p).is_some())
            .cloned()
            .ok_or_else(|| {
                list.items
                    .iter()
                    .map(describe_pod)
                    .collect::<Vec<_>>()
                    .join("; ")
            })
    })
    .await
}

/// A fake vLLM on `pod`'s IP and `port`, as the pod's own server would listen. When the
/// address is taken, the error names what listens there (`ss`): a CI run once failed here
/// with nothing in the test's logs to say which process held the pod's address.
pub async fn fake_vllm_on(pod: &Pod, port: u16, config: VllmConfig) -> Result<FakeVllm> {
    let what = format!("serving a fake vLLM for pod {}", describe_pod(pod));
    let ip: IpAddr = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| Error::Manifest {
            what: what.clone(),
            reason: "the pod has no IP address".to_owned(),
        })?;
    let addr = SocketAddr::new(ip, port);
    FakeVllm::start(config, addr).await.map_err(|source| {
        let holders = if source.kind() == std::io::ErrorKind::AddrInUse {
            format!("; listening there: {}", listeners_on(addr))
        } else {
            String::new()
        };
        Error::Io {
            what: format!("{what} on {addr}{holders}"),
            source,
        }
    })
}

/// `ss`'s line for each socket listening on `addr`, with its process, or why there is none.
fn listeners_on(addr: SocketAddr) -> String {
    let output = std::process::Command::new("ss")
        .args(["-Hltnp", &format!("src {addr}")])
        .output();
    match output {
        Ok(out) if !out.stdout.is_empty() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        Ok(out) => format!(
            "no listener found ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(error) => format!("`ss` could not run: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_taken_pod_address_names_its_listener() {
        // A loopback address outside every slot's pod and node ranges (127.100/16, 127.99/16).
        let taken = tokio::net::TcpListener::bind("127.101.255.254:0")
            .await
            .unwrap();
        let addr = taken.local_addr().unwrap();
        let mut pod = gpu_pod("holder", "nvidia.com/gpu", 1);
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            pod_ip: Some(addr.ip().to_string()),
            ..Default::default()
        });
        let error = fake_vllm_on(&pod, addr.port(), VllmConfig::default())
            .await
            .err()
            .unwrap()
            .to_string();
        let (_, holders) = error
            .split_once(&format!("on {addr}; listening there: "))
            .unwrap_or_else(|| panic!("{error}"));
        // `ss` shows the listener and its process: this test's.
        assert!(
            holders.contains(&addr.to_string()) && holders.contains("users:"),
            "{error}"
        );
    }
}
