//! Which devices a running HAMi pod holds: the ones HAMi's device plugin names on the pod
//! (`hami.io/vgpu-devices-allocated`), found by UUID among its node's HAMi devices, so that the
//! snapshot seats the pod there rather than on the lowest free devices.

use std::collections::HashMap;
use std::sync::Arc;

use super::node::Node;
use super::pod::{Assignment, DeviceSet, Pod, PodState};
use super::sharing::DEVICES_ALLOCATED;
use crate::quantity::ResourceName;

/// Seats each bound pod HAMi says holds devices (`hami.io/vgpu-devices-allocated`) on those
/// devices of its node, instead of the lowest free ones: its `devices`, by index in the node's
/// HAMi pool. A pod whose devices do not match its node (an unknown or unhealthy device, a
/// count other than its request) keeps the lowest ones, and the mismatch is returned as a
/// warning.
pub fn seat_hami_pods<'a>(
    pods: &mut [Arc<Pod>],
    nodes: impl IntoIterator<Item = &'a Node>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    if pods.iter().all(|p| p.hami_devices.is_empty()) {
        return warnings;
    }
    let by_name: HashMap<&str, &Node> = nodes
        .into_iter()
        .filter(|n| !n.hami_devices.is_empty())
        .map(|n| (n.name.as_str(), n))
        .collect();
    for pod in pods
        .iter_mut()
        .filter(|p| !p.hami_devices.is_empty() && p.devices.is_empty())
    {
        let PodState::Admitted(Assignment {
            node: Some(node),
            bound: true,
            ..
        }) = &pod.state
        else {
            continue;
        };
        let Some(node) = by_name.get(node.as_str()) else {
            continue;
        };
        let indices: Option<Vec<u16>> = pod
            .hami_devices
            .iter()
            .map(|uuid| {
                let i = node.hami_devices.iter().position(|d| d == uuid)?;
                u16::try_from(i).ok()
            })
            .collect();
        let resource = ResourceName::nvidia_gpu();
        let asked: u32 = pod
            .requests
            .gpus
            .iter()
            .filter(|g| g.resource == resource)
            .map(|g| g.count)
            .sum();
        match indices {
            Some(mut devices) if devices.len() == asked as usize => {
                devices.sort_unstable();
                // Copied only now (a pod model is shared from pass to pass).
                Arc::make_mut(pod).devices = vec![DeviceSet { resource, devices }];
            }
            _ => warnings.push(format!(
                "pod {}: {DEVICES_ALLOCATED} names devices {:?}, which do not match the {asked} healthy HAMi devices it asks of node {}; seated on the lowest free ones",
                pod.key, pod.hami_devices, node.name
            )),
        }
    }
    warnings
}
