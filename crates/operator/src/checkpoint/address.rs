//! Which address of a pod a checkpoint may call. The address comes from the pod's status in the
//! API (the kubelet writes it, a tenant cannot), but a pod on the node's network shares the
//! node's address: a call there reaches whatever listens on the node (case 9 of the tenant
//! review), so such a pod is never called.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

use super::outcome::SkipReason;

/// The pod's own IP, or why a checkpoint must not call the pod at all.
pub fn pod_address(pod: &Pod) -> Result<IpAddr, SkipReason> {
    let status = pod.status.as_ref();
    let ip: IpAddr = status
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .ok_or(SkipReason::NoPodIp)?;
    let host: Option<IpAddr> = status
        .and_then(|s| s.host_ip.as_deref())
        .and_then(|ip| ip.parse().ok());
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let node_network = |how| Err(SkipReason::NodeNetwork { ip, how });
    if host_network {
        return node_network("spec.hostNetwork is true");
    }
    if host == Some(ip) {
        return node_network("its IP is its node's");
    }
    // The host's own loopback is never a pod's. Other loopback addresses are pod IPs only
    // where the whole cluster lives on loopback (the KWOK test clusters hand out 127.100/16
    // to pods and 127.99/16 to nodes); on a node with a real address they reach the node.
    let own_loopback =
        ip == IpAddr::from([127, 0, 0, 1]) || ip == IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]);
    if own_loopback || (ip.is_loopback() && !host.is_some_and(|h| h.is_loopback())) {
        return node_network("its IP is a loopback address");
    }
    Ok(ip)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(pod_ip: Option<&str>, host_ip: &str, host_network: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "v", "namespace": "batch"},
            "spec": {"containers": [], "hostNetwork": host_network},
            "status": {"podIP": pod_ip, "hostIP": host_ip},
        }))
        .unwrap()
    }

    fn refused(result: Result<IpAddr, SkipReason>) -> &'static str {
        match result {
            Err(SkipReason::NodeNetwork { how, .. }) => how,
            other => panic!("not refused as the node's network: {other:?}"),
        }
    }

    #[test]
    fn a_pod_on_its_own_network_is_called_at_its_ip() {
        let ip: IpAddr = "10.244.1.7".parse().unwrap();
        assert_eq!(
            pod_address(&pod(Some("10.244.1.7"), "10.0.0.5", false)),
            Ok(ip)
        );
        // A test cluster on loopback: pods and nodes both on 127/8, apart.
        let ip: IpAddr = "127.100.0.7".parse().unwrap();
        assert_eq!(
            pod_address(&pod(Some("127.100.0.7"), "127.99.0.2", false)),
            Ok(ip)
        );
    }

    #[test]
    fn a_pod_on_the_nodes_network_is_never_called() {
        let host_network = pod(Some("10.0.0.5"), "10.0.0.5", true);
        assert_eq!(
            refused(pod_address(&host_network)),
            "spec.hostNetwork is true"
        );
        let shares_ip = pod(Some("127.99.0.2"), "127.99.0.2", false);
        assert_eq!(refused(pod_address(&shares_ip)), "its IP is its node's");
        for loopback in ["127.0.0.1", "127.0.0.53"] {
            let on_real_node = pod(Some(loopback), "10.0.0.5", false);
            assert_eq!(
                refused(pod_address(&on_real_node)),
                "its IP is a loopback address"
            );
        }
        let own = pod(Some("127.0.0.1"), "127.99.0.2", false);
        assert_eq!(refused(pod_address(&own)), "its IP is a loopback address");
        let v6 = pod(Some("::1"), "fd00::5", false);
        assert_eq!(refused(pod_address(&v6)), "its IP is a loopback address");
        let message = pod_address(&host_network).unwrap_err().to_string();
        assert!(
            message.contains("the operator calls only pod addresses"),
            "{message}"
        );
    }

    #[test]
    fn a_pod_without_an_ip_has_nothing_to_call() {
        assert_eq!(
            pod_address(&pod(None, "10.0.0.5", false)),
            Err(SkipReason::NoPodIp)
        );
    }
}
