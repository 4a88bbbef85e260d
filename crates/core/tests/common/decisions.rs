//! A summary of decisions that does not depend on pod ids: two cycles compared by pod key (ids
//! differ between snapshots).

use gpuqueue_core::admission::Decision;

pub fn describe(decisions: &[Decision]) -> Vec<String> {
    decisions
        .iter()
        .map(|d| match d {
            Decision::Admit(a) => format!(
                "admit {} on {} {:?} as {}",
                a.key, a.placement.node_name, a.placement.devices, a.admitted_as
            ),
            Decision::Reclaim(p) => format!(
                "reclaim for {} on {}: {:?}",
                p.owner_key,
                p.node_name,
                p.victims
                    .iter()
                    .map(|v| v.key.to_string())
                    .collect::<Vec<_>>()
            ),
            Decision::Wait(w) => format!("wait {}: {}", w.key, w.reason),
        })
        .collect()
}
