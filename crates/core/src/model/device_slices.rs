//! GPUs a node offers through DRA: the devices DRA drivers publish in ResourceSlices, grouped
//! into the pools of the quota resources their DeviceClasses map to (see [`super::dra`]), for
//! nodes that show them nowhere else (the 1.36 extended-resource bridge: no `nvidia.com/gpu` in
//! `status.allocatable`). A node that does show a resource there keeps its device-plugin pool.
//!
//! Which devices a class selects is read from its CEL selectors as far as they are
//! conjunctions of equalities on `device.driver` and string attributes, the form NVIDIA's
//! classes take; a class selecting in any other way adds no pool (its devices stay invisible to
//! placement, never counted twice).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as dra;

use super::dra::{ClassRole, role_of};
use super::node::{GpuPool, Node};
use crate::quantity::{ResourceName, parse_bytes};

/// What a class's selectors require of a device, when gpuqueue can read them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Requirements {
    driver: Option<String>,
    /// (domain, attribute, value): `device.attributes['domain'].attribute == 'value'`.
    attributes: Vec<(String, String, String)>,
}

/// The requirements of `expression`, or `None` when it is not a conjunction of equalities.
fn requirements(expression: &str) -> Option<Requirements> {
    let mut found = Requirements::default();
    for term in expression.split("&&") {
        let term = term
            .trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .trim();
        let (left, right) = term.split_once("==")?;
        let value = quoted(right.trim())?;
        let left = left.trim();
        if left == "device.driver" {
            found.driver = Some(value);
        } else {
            let rest = left.strip_prefix("device.attributes[")?;
            let (domain, attribute) = rest.split_once("].")?;
            found
                .attributes
                .push((quoted(domain)?, attribute.to_string(), value));
        }
    }
    Some(found)
}

/// The string inside single or double quotes.
fn quoted(text: &str) -> Option<String> {
    let inner = text
        .strip_prefix('\'')
        .and_then(|t| t.strip_suffix('\''))
        .or_else(|| text.strip_prefix('"').and_then(|t| t.strip_suffix('"')))?;
    (!inner.contains(['\'', '"'])).then(|| inner.to_string())
}

impl Requirements {
    fn matches(&self, driver: &str, device: &dra::Device) -> bool {
        if self.driver.as_deref().is_some_and(|d| d != driver) {
            return false;
        }
        self.attributes.iter().all(|(domain, attribute, value)| {
            let attributes = device.attributes.as_ref();
            // Attribute names without a domain are in the driver's own.
            let qualified = format!("{domain}/{attribute}");
            let own = (domain == driver).then_some(attribute.as_str());
            let found = attributes.and_then(|a| {
                a.get(&qualified)
                    .or_else(|| own.and_then(|name| a.get(name)))
            });
            found.and_then(|a| a.string.as_deref()) == Some(value.as_str())
        })
    }
}

/// A counted class whose selectors gpuqueue can read: its resource and requirements.
struct Readable {
    resource: ResourceName,
    requirements: Vec<Requirements>,
}

fn readable(class: &dra::DeviceClass) -> Option<Readable> {
    let ClassRole::Counted(resource) = role_of(class) else {
        return None;
    };
    let requirements = class
        .spec
        .selectors
        .iter()
        .flatten()
        .map(|s| requirements(&s.cel.as_ref()?.expression))
        .collect::<Option<Vec<_>>>()?;
    Some(Readable {
        resource,
        requirements,
    })
}

/// The GPU pools each node offers through DRA, by node name: for every counted class, the
/// devices of the node's slices that all its selectors select, with the smallest device memory
/// (its `memory` capacity) as the pool's.
pub fn slice_pools<'a>(
    slices: impl IntoIterator<Item = &'a dra::ResourceSlice>,
    classes: impl IntoIterator<Item = &'a dra::DeviceClass>,
) -> BTreeMap<String, Vec<GpuPool>> {
    let classes: Vec<Readable> = classes.into_iter().filter_map(readable).collect();
    let mut pools: BTreeMap<String, BTreeMap<ResourceName, GpuPool>> = BTreeMap::new();
    for slice in slices {
        let Some(node) = &slice.spec.node_name else {
            continue;
        };
        for device in slice.spec.devices.iter().flatten() {
            let driver = &slice.spec.driver;
            let Some(class) = classes
                .iter()
                .find(|c| c.requirements.iter().all(|r| r.matches(driver, device)))
            else {
                continue;
            };
            let memory_mib = device
                .capacity
                .as_ref()
                .and_then(|c| c.get("memory"))
                .and_then(|m| parse_bytes(&m.value.0).ok())
                .map(|bytes| bytes / (1024 * 1024));
            let pool = pools
                .entry(node.clone())
                .or_default()
                .entry(class.resource.clone())
                .or_insert_with(|| GpuPool {
                    memory_mib,
                    ..GpuPool::exclusive(class.resource.clone(), 0)
                });
            pool.devices += 1;
            pool.memory_mib = match (pool.memory_mib, memory_mib) {
                (Some(smallest), Some(this)) => Some(smallest.min(this)),
                (known, other) => known.or(other),
            };
        }
    }
    pools
        .into_iter()
        .map(|(node, by_resource)| (node, by_resource.into_values().collect()))
        .collect()
}

/// Adds to `node` the DRA pools of resources it shows no device-plugin pool of.
pub fn add_slice_pools(node: &mut Node, pools: &[GpuPool]) {
    for pool in pools {
        if !node.pools.iter().any(|p| p.resource == pool.resource) {
            node.pools.push(pool.clone());
        }
    }
    node.pools.sort_by(|a, b| a.resource.cmp(&b.resource));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn classes() -> Vec<dra::DeviceClass> {
        serde_json::from_value(json!([
            {"metadata": {"name": "gpu.nvidia.com"}, "spec": {"extendedResourceName": "nvidia.com/gpu",
                "selectors": [{"cel": {"expression":
                    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}},
            {"metadata": {"name": "mig", "annotations": {"gpuqueue.io/quota-resource": "nvidia.com/mig-1g.10gb"}},
                "spec": {"selectors": [{"cel": {"expression":
                    "device.driver == \"gpu.nvidia.com\" && device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}]}},
            {"metadata": {"name": "clever", "annotations": {"gpuqueue.io/quota-resource": "amd.com/gpu"}},
                "spec": {"selectors": [{"cel": {"expression": "device.capacity['x'].memory.compareTo(quantity('1Gi')) > 0"}}]}},
        ]))
        .unwrap()
    }

    fn slice(node: &str, devices: serde_json::Value) -> dra::ResourceSlice {
        let mut slice = json!({
            "metadata": {"name": node},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
        });
        slice["spec"]["devices"] = devices;
        serde_json::from_value(slice).unwrap()
    }

    #[test]
    fn slices_become_pools_of_the_classes_that_select_their_devices() {
        let slices = [slice(
            "dra-0",
            json!([
                {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "80Gi"}}},
                {"name": "gpu-1", "attributes": {"gpu.nvidia.com/type": {"string": "gpu"}}, "capacity": {"memory": {"value": "40Gi"}}},
                {"name": "mig-0", "attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.10gb"}},
                    "capacity": {"memory": {"value": "9856Mi"}}},
                {"name": "nic-0", "attributes": {"type": {"string": "nic"}}},
            ]),
        )];
        let classes = classes();
        let pools = slice_pools(&slices, &classes);
        assert_eq!(
            pools["dra-0"],
            vec![
                GpuPool {
                    memory_mib: Some(40 * 1024),
                    ..GpuPool::exclusive("nvidia.com/gpu", 2)
                },
                GpuPool {
                    memory_mib: Some(9856),
                    ..GpuPool::exclusive("nvidia.com/mig-1g.10gb", 1)
                },
            ]
        );
        let mut node = Node::new("dra-0");
        node.pools.push(GpuPool {
            memory_mib: None,
            ..GpuPool::exclusive("nvidia.com/gpu", 8)
        });
        add_slice_pools(&mut node, &pools["dra-0"]);
        // The device plugin's pool stays; the MIG pool only DRA shows is added.
        assert_eq!(node.pools.len(), 2);
        assert_eq!(node.pools[0].devices, 8);
        assert_eq!(node.pools[1].resource, "nvidia.com/mig-1g.10gb".into());
    }

    #[test]
    fn only_conjunctions_of_equalities_are_read() {
        assert_eq!(
            requirements("device.driver == 'a' && (device.attributes['a'].type == \"gpu\")"),
            Some(Requirements {
                driver: Some("a".into()),
                attributes: vec![("a".into(), "type".into(), "gpu".into())],
            })
        );
        assert_eq!(
            requirements("device.driver == 'a' || device.driver == 'b'"),
            None
        );
        assert_eq!(requirements("device.driver != 'a'"), None);
    }
}
