//! A fake vLLM on each running batch pod's IP, as the pod's own server would listen, with the
//! checkpoint faults drawn per server from the seed: most pause after an injected latency,
//! some answer 500, some hang (the driver's timeout cuts them). A server is removed with its
//! pod; its `/pause` calls are kept for the invariant checker.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use gpuqueue_e2e::CheckpointCall;
use gpuqueue_fake_vllm::{Config as VllmConfig, FakeVllm, Fault, FaultAction};
use k8s_openapi::api::core::v1::Pod;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::VLLM_PORT;

/// The checkpoint faults injected, by kind, for the report.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FleetTally {
    pub servers: usize,
    pub pause_latency: usize,
    pub pause_500: usize,
    pub pause_hang: usize,
}

struct Served {
    key: String,
    uid: String,
    server: FakeVllm,
}

pub struct Fleet {
    by_uid: HashMap<String, Served>,
    rng: ChaCha8Rng,
    pub calls: Vec<CheckpointCall>,
    pub tally: FleetTally,
}

impl Fleet {
    pub fn new(seed: u64) -> Self {
        Self {
            by_uid: HashMap::new(),
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0xf1ee7),
            calls: Vec::new(),
            tally: FleetTally::default(),
        }
    }

    /// Serves every running batch pod in `pods` that has none yet; retires the servers of pods
    /// that are gone (or whose address a new pod took).
    async fn sync(&mut self, pods: &[std::sync::Arc<Pod>], batch_namespaces: &[String]) {
        let live: HashMap<String, (String, IpAddr)> = pods
            .iter()
            .filter(|p| {
                batch_namespaces.contains(p.metadata.namespace.as_ref().unwrap_or(&String::new()))
            })
            .filter_map(|p| {
                let ip: IpAddr = p.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
                let key = format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref()?,
                    p.metadata.name.as_deref()?
                );
                Some((p.metadata.uid.clone()?, (key, ip)))
            })
            .collect();
        let gone: Vec<String> = self
            .by_uid
            .keys()
            .filter(|uid| !live.contains_key(*uid))
            .cloned()
            .collect();
        for uid in gone {
            self.retire(&uid);
        }
        for (uid, (key, ip)) in live {
            if self.by_uid.contains_key(&uid) {
                continue;
            }
            let addr = SocketAddr::new(ip, VLLM_PORT);
            // KWOK hands a removed pod's IP to the next pod: the old server goes first.
            let holder = self
                .by_uid
                .iter()
                .find(|(_, s)| s.server.addr() == addr)
                .map(|(uid, _)| uid.clone());
            if let Some(holder) = holder {
                self.retire(&holder);
            }
            let config = VllmConfig {
                dev_mode: true,
                ..VllmConfig::default()
            };
            let Ok(server) = FakeVllm::start(config, addr).await else {
                continue; // the address is still taken; the next sync tries again
            };
            let draw: f64 = self.rng.random_range(0.0..1.0);
            let delay_ms = self.rng.random_range(100..1000);
            let action = if draw < 0.1 {
                self.tally.pause_500 += 1;
                FaultAction::Status(500)
            } else if draw < 0.2 {
                self.tally.pause_hang += 1;
                FaultAction::Hang
            } else {
                self.tally.pause_latency += 1;
                FaultAction::Respond
            };
            server.set_fault(
                "/pause",
                Fault {
                    delay_ms,
                    action,
                    times: None,
                },
            );
            self.tally.servers += 1;
            self.by_uid.insert(uid.clone(), Served { key, uid, server });
        }
    }

    fn retire(&mut self, uid: &str) {
        if let Some(served) = self.by_uid.remove(uid) {
            self.keep_calls(&served);
            served.server.stop();
        }
    }

    fn keep_calls(&mut self, served: &Served) {
        self.calls
            .extend(
                served
                    .server
                    .calls_to("/pause")
                    .into_iter()
                    .map(|call| CheckpointCall {
                        pod: served.key.clone(),
                        uid: served.uid.clone(),
                        at_ms: call.unix_ms,
                    }),
            );
    }

    /// Keeps the servers in step with `pods` in its own task (through every fault) until
    /// `stop`; then stops them all and returns every `/pause` call logged.
    pub fn spawn(
        mut self,
        pods: kube::runtime::reflector::Store<Pod>,
        batch_namespaces: Vec<String>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<(Vec<CheckpointCall>, FleetTally)> {
        tokio::spawn(async move {
            while !*stop.borrow() {
                self.sync(&pods.state(), &batch_namespaces).await;
                tokio::select! {
                    () = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
                    _ = stop.changed() => {}
                }
            }
            self.finish()
        })
    }

    /// Stops every server; returns every `/pause` call logged.
    fn finish(mut self) -> (Vec<CheckpointCall>, FleetTally) {
        let uids: Vec<String> = self.by_uid.keys().cloned().collect();
        for uid in uids {
            self.retire(&uid);
        }
        (self.calls, self.tally)
    }
}
