//! How a node shares its GPUs among pods: one pod per device, the NVIDIA device plugin's
//! replicas (time-slicing or MPS, from GPU feature discovery labels), or HAMi's virtual GPUs
//! (from the device list HAMi's device plugin writes on the node).

use gpuqueue_api::{hami, node_labels};

use super::selector::Labels;

/// How the devices of one pool are shared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Sharing {
    /// Each device goes to one pod (whole GPUs, MIG slices), or to fractional requests that
    /// sum to at most one device (the simulator's traces).
    #[default]
    Exclusive,
    /// The device plugin advertises each device `replicas` times; each replica is `1/replicas`
    /// of the device's compute and (by right, not isolation with time-slicing) memory.
    Replicas {
        replicas: u32,
        strategy: ReplicaStrategy,
    },
    /// HAMi: up to `split` pods per device, each asking for memory and compute of it.
    Hami { split: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplicaStrategy {
    TimeSlicing,
    Mps,
}

/// Most pods one device may be shared by: the slot count of a device is kept in 16 bits, and
/// no sharing configuration we know of comes close.
pub const MAX_SHARES_PER_DEVICE: u32 = 1024;

impl Sharing {
    /// Pods one device can take at once; `None`: no limit but the device's milli.
    pub fn slots_per_device(self) -> Option<u32> {
        match self {
            Self::Exclusive => None,
            Self::Replicas { replicas, .. } => Some(replicas),
            Self::Hami { split } => Some(split),
        }
    }

    /// Schedulable units per device, as kube-scheduler counts them in allocatable.
    pub fn units_per_device(self) -> u32 {
        self.slots_per_device().unwrap_or(1)
    }

    /// The device plugin's replicas from GPU feature discovery labels (`nvidia.com/gpu.replicas`
    /// above 1 with `nvidia.com/gpu.sharing-strategy` `time-slicing` or `mps`). An error names
    /// the label and the rule.
    pub fn from_labels(labels: &Labels) -> Result<Self, (String, String)> {
        let strategy = labels
            .get(node_labels::GPU_SHARING_STRATEGY)
            .map(String::as_str);
        let replicas = labels.get(node_labels::GPU_REPLICAS);
        let field = |key: &str| format!("metadata.labels[{key}]");
        let strategy = match strategy {
            None | Some("none") => return Ok(Self::Exclusive),
            Some("time-slicing") => ReplicaStrategy::TimeSlicing,
            Some("mps") => ReplicaStrategy::Mps,
            Some(other) => {
                return Err((
                    field(node_labels::GPU_SHARING_STRATEGY),
                    format!("{other:?} is not none, time-slicing or mps"),
                ));
            }
        };
        let replicas = replicas
            .and_then(|r| r.parse::<u32>().ok())
            .filter(|r| (1..=MAX_SHARES_PER_DEVICE).contains(r))
            .ok_or_else(|| {
                (
                    field(node_labels::GPU_REPLICAS),
                    format!(
                        "must be a number of replicas from 1 to {MAX_SHARES_PER_DEVICE} on a node that shares GPUs by {}",
                        labels[node_labels::GPU_SHARING_STRATEGY]
                    ),
                )
            })?;
        Ok(if replicas == 1 {
            Self::Exclusive
        } else {
            Self::Replicas { replicas, strategy }
        })
    }
}

/// One device HAMi registered on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HamiDevice {
    pub uuid: String,
    pub split: u32,
    pub memory_mib: u64,
    pub cores_percent: u32,
    pub healthy: bool,
}

/// The devices in HAMi's `hami.io/node-nvidia-register` annotation; `None` without it. An
/// error names the annotation and the rule.
pub fn hami_devices(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<Option<Vec<HamiDevice>>, (String, String)> {
    let Some(value) = annotations.and_then(|a| a.get(hami::NODE_REGISTER)) else {
        return Ok(None);
    };
    let field = format!("metadata.annotations[{}]", hami::NODE_REGISTER);
    let mut devices = Vec::new();
    for entry in value.split(':').map(str::trim).filter(|e| !e.is_empty()) {
        let parts: Vec<&str> = entry.split(',').collect();
        let number = |i: usize| parts.get(i).and_then(|p| p.trim().parse::<u64>().ok());
        let (Some(split), Some(memory_mib), Some(cores), Some(healthy)) =
            (number(1), number(2), number(3), parts.get(6))
        else {
            return Err((
                field,
                format!(
                    "device {entry:?} is not `uuid,split count,memory MiB,cores %,type,numa,healthy`"
                ),
            ));
        };
        let split = u32::try_from(split)
            .ok()
            .filter(|s| (1..=MAX_SHARES_PER_DEVICE).contains(s))
            .ok_or_else(|| {
                (
                    field.clone(),
                    format!(
                        "device {entry:?}: the split count must be from 1 to {MAX_SHARES_PER_DEVICE}"
                    ),
                )
            })?;
        devices.push(HamiDevice {
            uuid: parts[0].trim().to_owned(),
            split,
            memory_mib,
            cores_percent: u32::try_from(cores).unwrap_or(u32::MAX),
            healthy: healthy.trim() == "true",
        });
    }
    Ok(Some(devices))
}

/// Where HAMi's device plugin records the devices it gave a pod: per container
/// `{uuid},{type},{memory MiB},{cores %}:` for each device, and `;` after each container.
pub const DEVICES_ALLOCATED: &str = "hami.io/vgpu-devices-allocated";

/// The UUIDs of the devices HAMi gave the pod (`hami.io/vgpu-devices-allocated`), in order,
/// each once.
pub fn hami_allocated(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Vec<String> {
    let Some(value) = annotations.and_then(|a| a.get(DEVICES_ALLOCATED)) else {
        return Vec::new();
    };
    let mut uuids: Vec<String> = Vec::new();
    for device in value
        .split([';', ':'])
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        let uuid = device.split(',').next().unwrap_or_default().trim();
        if !uuid.is_empty() && !uuids.iter().any(|u| u == uuid) {
            uuids.push(uuid.to_owned());
        }
    }
    uuids
}
