//! Quota honesty, sampled: a watch keeps every pod, and after every pod change (and every
//! 100 ms meanwhile) the sampler checks each tenant against its quota: no tenant holds more
//! GPUs than its ceiling, and none that asks for its guarantee holds less than that for longer
//! than its budget while another tenant holds more than its own guarantee (GPUs it borrowed,
//! which a reclaim should have given back; a deficit nobody borrows against is admission still
//! catching up). The same check serves any system that enforces the quota (gpuqueue, or a peer
//! such as Kueue), since it reads only pods.
//!
//! A pod holds its GPUs from the moment it is bound until it is gone or terminal: a victim that
//! is terminating still holds them, as the scheduler counts it. A tenant asks for what its live
//! pods (not terminal, not deleted) request, bound or not.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::time::Instant;

use super::world::gpus_of;
use crate::pods::{has_finished, node_of};

/// How often the sampler looks when no pod changes.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// One tenant's quota in GPUs of one resource.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TenantQuota {
    pub name: String,
    pub namespace: String,
    /// What it may always have back (gpuqueue `guaranteed`, Kueue `nominalQuota` not lent).
    pub guarantee: u64,
    /// What it may never exceed (gpuqueue `guaranteed + burstable`, Kueue
    /// `nominalQuota + borrowingLimit`).
    pub ceiling: u64,
}

/// A moment (or a stretch) a tenant's quota did not hold.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Violation {
    pub tenant: String,
    /// Milliseconds since the sampler started, when it was first seen.
    pub at_ms: u64,
    /// `above ceiling`, or `below guarantee`.
    pub rule: &'static str,
    /// GPUs held, and the ceiling or the entitlement (guarantee capped by what it asks for).
    pub held: u64,
    pub limit: u64,
    /// How long it lasted, for a guarantee deficit (from its first sample to the last).
    pub lasted_ms: u64,
}

/// What the sampler saw.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct QuotaReport {
    pub samples: usize,
    pub violations: Vec<Violation>,
    /// Guarantee deficits that ended within the budget: how many, and the longest.
    pub deficits_within_budget: usize,
    pub longest_deficit_ms: u64,
}

/// A running sampler; [`QuotaSampler::finish`] stops it and returns the report.
#[derive(Debug)]
pub struct QuotaSampler {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<QuotaReport>,
}

impl QuotaSampler {
    /// Starts watching every pod of the cluster and sampling `tenants` against their quotas;
    /// a guarantee deficit longer than `budget` is a violation.
    pub fn start(client: &Client, tenants: Vec<TenantQuota>, budget: Duration) -> Self {
        let (reader, writer) = reflector::store::<Pod>();
        let pods: Api<Pod> = Api::all(client.clone());
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(
                watcher(pods, watcher::Config::default())
                    .default_backoff()
                    .reflect(writer)
            );
            let mut check = Check::new(tenants, budget);
            let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
            let mut listed = false;
            loop {
                tokio::select! {
                    event = events.next() => match event {
                        // The store has applied the event: each change is looked at, so a
                        // tenant whose pods are back at its entitlement between two ticks is
                        // seen there (one deficit is not taken for the next pod's).
                        Some(Ok(watcher::Event::InitDone)) => {
                            listed = true;
                            check.sample(&reader.state());
                        }
                        Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) if listed => {
                            check.sample(&reader.state());
                        }
                        Some(_) => {}
                        None => break,
                    },
                    _ = ticks.tick(), if listed => check.sample(&reader.state()),
                    _ = stopped.changed() => break,
                }
            }
            check.finish()
        });
        Self { stop, task }
    }

    /// Stops sampling; returns every violation seen.
    pub async fn finish(self) -> QuotaReport {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// The sampling state: tenants, open deficits, the report so far.
struct Check {
    tenants: Vec<TenantQuota>,
    budget: Duration,
    started: Instant,
    /// Per tenant: when its current deficit was first sampled, and the last sample of it.
    deficits: BTreeMap<String, (Instant, Instant, u64, u64)>,
    report: QuotaReport,
}

impl Check {
    fn new(tenants: Vec<TenantQuota>, budget: Duration) -> Self {
        Self {
            tenants,
            budget,
            started: Instant::now(),
            deficits: BTreeMap::new(),
            report: QuotaReport::default(),
        }
    }

    fn sample(&mut self, pods: &[Arc<Pod>]) {
        let now = Instant::now();
        self.report.samples += 1;
        let usages: Vec<(u64, u64)> = self
            .tenants
            .iter()
            .map(|tenant| usage(pods, &tenant.namespace))
            .collect();
        let borrowing: Vec<bool> = self
            .tenants
            .iter()
            .zip(&usages)
            .map(|(tenant, &(held, _))| held > tenant.guarantee)
            .collect();
        for (index, tenant) in self.tenants.clone().into_iter().enumerate() {
            let (held, asked) = usages[index];
            if held > tenant.ceiling {
                let at_ms = self.ms(now);
                self.report.violations.push(Violation {
                    tenant: tenant.name.clone(),
                    at_ms,
                    rule: "above ceiling",
                    held,
                    limit: tenant.ceiling,
                    lasted_ms: 0,
                });
            }
            let entitled = tenant.guarantee.min(asked);
            let others_borrow = borrowing
                .iter()
                .enumerate()
                .any(|(other, &borrows)| other != index && borrows);
            if held < entitled && others_borrow {
                let entry = self
                    .deficits
                    .entry(tenant.name.clone())
                    .or_insert((now, now, held, entitled));
                entry.1 = now;
            } else if let Some(deficit) = self.deficits.remove(&tenant.name) {
                self.close(&tenant.name, deficit);
            }
        }
    }

    /// Records a deficit that ended (or was still open at the end).
    fn close(&mut self, tenant: &str, (first, last, held, limit): (Instant, Instant, u64, u64)) {
        let lasted = last.duration_since(first);
        let lasted_ms = u64::try_from(lasted.as_millis()).unwrap_or(u64::MAX);
        if lasted > self.budget {
            let at_ms = self.ms(first);
            self.report.violations.push(Violation {
                tenant: tenant.to_owned(),
                at_ms,
                rule: "below guarantee",
                held,
                limit,
                lasted_ms,
            });
        } else {
            self.report.deficits_within_budget += 1;
        }
        self.report.longest_deficit_ms = self.report.longest_deficit_ms.max(lasted_ms);
    }

    fn finish(mut self) -> QuotaReport {
        for (tenant, deficit) in std::mem::take(&mut self.deficits) {
            self.close(&tenant, deficit);
        }
        self.report
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.started).as_millis()).unwrap_or(u64::MAX)
    }
}

/// GPUs the namespace's pods hold (bound, not terminal) and ask for (not terminal, not
/// deleted).
fn usage(pods: &[Arc<Pod>], namespace: &str) -> (u64, u64) {
    let (mut held, mut asked) = (0, 0);
    for pod in pods
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
    {
        if has_finished(pod) {
            continue;
        }
        let gpus = gpus_of(pod);
        if node_of(pod).is_some() {
            held += gpus;
        }
        if pod.metadata.deletion_timestamp.is_none() {
            asked += gpus;
        }
    }
    (held, asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::gpu_pod;

    fn pod(namespace: &str, bound: bool, deleting: bool) -> Arc<Pod> {
        let mut pod = gpu_pod("p", gpuqueue_api::NVIDIA_GPU, 1);
        pod.metadata.namespace = Some(namespace.to_owned());
        if bound {
            pod.spec.get_or_insert_default().node_name = Some("n".to_owned());
        }
        if deleting {
            pod.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        Arc::new(pod)
    }

    fn tenant(guarantee: u64, ceiling: u64) -> TenantQuota {
        named("t", guarantee, ceiling)
    }

    fn named(name: &str, guarantee: u64, ceiling: u64) -> TenantQuota {
        TenantQuota {
            name: name.to_owned(),
            namespace: name.to_owned(),
            guarantee,
            ceiling,
        }
    }

    #[test]
    fn a_terminating_victim_holds_but_does_not_ask() {
        let pods = [
            pod("t", true, true),
            pod("t", true, false),
            pod("t", false, false),
        ];
        assert_eq!(usage(&pods, "t"), (2, 2));
        assert_eq!(usage(&pods, "other"), (0, 0));
    }

    #[test]
    fn more_than_the_ceiling_is_a_violation_at_once() {
        let mut check = Check::new(vec![tenant(0, 1)], Duration::from_secs(3));
        check.sample(&[pod("t", true, false), pod("t", true, false)]);
        let report = check.finish();
        assert_eq!(report.violations.len(), 1);
        assert_eq!(report.violations[0].rule, "above ceiling");
    }

    #[test]
    fn a_deficit_within_the_budget_is_not_a_violation_and_one_beyond_it_is() {
        let tenants = vec![tenant(1, 1), named("borrower", 0, 1)];
        let borrower = pod("borrower", true, false);
        let waiting = [pod("t", false, false), borrower.clone()];
        let mut check = Check::new(tenants.clone(), Duration::from_secs(3));
        check.sample(&waiting);
        check.sample(&[pod("t", true, false)]);
        let report = check.finish();
        assert!(report.violations.is_empty(), "{report:?}");
        assert_eq!(report.deficits_within_budget, 1);

        let mut check = Check::new(tenants, Duration::ZERO);
        check.sample(&waiting);
        std::thread::sleep(Duration::from_millis(5));
        check.sample(&waiting);
        let report = check.finish();
        assert_eq!(report.violations.len(), 1, "{report:?}");
        assert_eq!(report.violations[0].rule, "below guarantee");
    }

    #[test]
    fn a_deficit_nobody_borrows_against_is_admission_catching_up() {
        let tenants = vec![tenant(2, 2), named("other", 1, 2)];
        let pods = [
            pod("t", true, false),
            pod("t", false, false),
            pod("other", true, false),
        ];
        let mut check = Check::new(tenants, Duration::ZERO);
        check.sample(&pods);
        std::thread::sleep(Duration::from_millis(5));
        check.sample(&pods);
        let report = check.finish();
        assert!(report.violations.is_empty(), "{report:?}");
    }

    #[test]
    fn a_tenant_that_asks_for_less_than_its_guarantee_is_entitled_to_what_it_asks() {
        let mut check = Check::new(vec![tenant(8, 8)], Duration::ZERO);
        check.sample(&[pod("t", true, false)]);
        check.sample(&[pod("t", true, false)]);
        assert!(check.finish().violations.is_empty());
    }
}
