//! Fault injection beyond one process's restart ([`crate::ControlPlane::restart`],
//! [`crate::ManagedProcess::pause`]): the kinds of fault the soak injects, a seeded schedule of
//! them, and etcd compaction, which turns a watch's resumption after an API-server restart into
//! a relist.

use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};

/// A fault the soak injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL of the leading operator replica, restarted at once.
    KillLeader,
    /// SIGSTOP of the leader for longer than its lease, then SIGCONT: it must not act.
    PauseLeader,
    /// SIGKILL of kube-apiserver, started again.
    ApiServerRestart,
    /// SIGKILL of etcd, started again.
    EtcdRestart,
    /// etcd compacted to its current revision, then kube-apiserver restarted: every watch
    /// resumes from a revision that is gone ("too old resource version") and relists.
    WatchRelist,
}

impl FaultKind {
    pub const ALL: [Self; 5] = [
        Self::KillLeader,
        Self::PauseLeader,
        Self::ApiServerRestart,
        Self::EtcdRestart,
        Self::WatchRelist,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::KillLeader => "kill-leader",
            Self::PauseLeader => "pause-leader",
            Self::ApiServerRestart => "api-server-restart",
            Self::EtcdRestart => "etcd-restart",
            Self::WatchRelist => "watch-relist",
        }
    }
}

/// Rounds of faults: each round holds every kind once, in a seeded random order, each after
/// a seeded random quiet gap; so any stretch of rounds has as many faults of each kind.
#[derive(Debug)]
pub struct FaultSchedule {
    rng: ChaCha8Rng,
    gap: (Duration, Duration),
}

impl FaultSchedule {
    /// Gaps drawn uniformly from `gap`.
    pub fn new(seed: u64, gap: (Duration, Duration)) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            gap,
        }
    }

    /// The next round: each kind with the quiet time before it.
    pub fn round(&mut self) -> Vec<(Duration, FaultKind)> {
        let mut kinds = FaultKind::ALL.to_vec();
        for i in (1..kinds.len()).rev() {
            kinds.swap(i, self.rng.random_range(0..=i));
        }
        kinds
            .into_iter()
            .map(|kind| (self.draw(self.gap), kind))
            .collect()
    }

    /// A uniform draw from `range` (for other seeded choices of the same run).
    pub fn draw(&mut self, (low, high): (Duration, Duration)) -> Duration {
        if high <= low {
            return low;
        }
        low + high
            .saturating_sub(low)
            .mul_f64(self.rng.random_range(0.0..1.0))
    }

    /// A seeded coin with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.rng.random_range(0.0..1.0) < p
    }
}

/// Compacts etcd (its gRPC gateway at `etcd_url`) to its current revision; returns it.
pub async fn compact_etcd(etcd_url: &str) -> Result<i64> {
    let http = |reason: String| Error::Http {
        what: format!("compacting etcd at {etcd_url}"),
        reason,
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| http(e.to_string()))?;
    // Any range read answers with the store's current revision in its header. The key is
    // base64 ("/" is "Lw==").
    let range: serde_json::Value = client
        .post(format!("{etcd_url}/v3/kv/range"))
        .json(&serde_json::json!({"key": "Lw==", "limit": 1}))
        .send()
        .await
        .map_err(|e| http(e.to_string()))?
        .json()
        .await
        .map_err(|e| http(e.to_string()))?;
    let revision: i64 = range["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .ok_or_else(|| http(format!("no revision in {range}")))?;
    let answer = client
        .post(format!("{etcd_url}/v3/kv/compaction"))
        .json(&serde_json::json!({"revision": revision.to_string(), "physical": true}))
        .send()
        .await
        .map_err(|e| http(e.to_string()))?;
    if !answer.status().is_success() {
        let text = answer.text().await.unwrap_or_default();
        return Err(http(text));
    }
    Ok(revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_holds_every_kind_once_and_a_seed_repeats_its_schedule() {
        let gap = (Duration::from_millis(10), Duration::from_secs(2));
        let mut one = FaultSchedule::new(7, gap);
        let mut two = FaultSchedule::new(7, gap);
        for _ in 0..5 {
            let round = one.round();
            assert_eq!(round, two.round());
            let mut kinds: Vec<FaultKind> = round.iter().map(|(_, k)| *k).collect();
            kinds.sort();
            assert_eq!(kinds, FaultKind::ALL);
            assert!(round.iter().all(|(g, _)| *g >= gap.0 && *g <= gap.1));
        }
        let other: Vec<_> = (0..5).map(|_| FaultSchedule::new(8, gap).round()).collect();
        assert_ne!(other[0], FaultSchedule::new(7, gap).round());
    }
}
