//! The admission loop's metrics: decisions and latencies as they happen, and the queue and
//! fragmentation gauges, published as a whole table after every pass and rendered at scrape
//! time by a collector, so a deleted queue or node disappears from `/metrics` instead of
//! lingering as a stale series.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use gpuqueue_api::v1alpha1::ResourceStatus;
use gpuqueue_core::{
    admission::{Decision, Wait},
    model::AdmittedAs,
};
use prometheus_client::{
    collector::Collector,
    encoding::{
        DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
    },
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

/// What the admission loop decided for one pod.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// The gate was released within the queue's guaranteed quota.
    AdmittedGuaranteed,
    /// The gate was released as a borrower, within the burstable quota.
    AdmittedBorrowed,
    /// Borrowers must give GPUs back first.
    Reclaim,
    /// The pod waits; its reason was recorded.
    Wait,
}

impl Outcome {
    /// An admission against the quota the pod was admitted as.
    pub fn admitted(admitted_as: AdmittedAs) -> Self {
        match admitted_as {
            AdmittedAs::Guaranteed => Self::AdmittedGuaranteed,
            AdmittedAs::Borrowed => Self::AdmittedBorrowed,
        }
    }

    /// The label value: snake case, as Prometheus conventions ask.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AdmittedGuaranteed => "admitted_guaranteed",
            Self::AdmittedBorrowed => "admitted_borrowed",
            Self::Reclaim => "reclaim",
            Self::Wait => "wait",
        }
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    queue: String,
    outcome: Outcome,
}

/// Decisions and how long pods wait for them.
#[derive(Debug, Clone)]
pub struct AdmissionMetrics {
    decisions: Family<DecisionLabels, Counter>,
    latency: Histogram,
    passes: Counter,
    pass_duration: Histogram,
    apply_errors: Family<ApplyErrorLabels, Counter>,
    bypass_evictions: Family<BypassLabels, Counter>,
    left_out: Gauge,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BypassLabels {
    queue: String,
    /// What the pod broke: `OverCeiling` or `HoldsGuarantee`.
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApplyErrorLabels {
    /// The error's `category()`: which write failed, and how.
    kind: &'static str,
}

impl AdmissionMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            decisions: Family::default(),
            // 5 ms to about 22 minutes: a pod admitted at once lands in the first buckets, one
            // that waits for quota in the last.
            latency: Histogram::new(exponential_buckets(0.005, 2.0, 19)),
            passes: Counter::default(),
            pass_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            apply_errors: Family::default(),
            bypass_evictions: Family::default(),
            left_out: Gauge::default(),
        };
        registry.register(
            "admission_decisions",
            "Admission decisions applied, by queue and outcome",
            metrics.decisions.clone(),
        );
        registry.register_with_unit(
            "admission_latency",
            "Time from a pod's creation to the release of its admission gate",
            Unit::Seconds,
            metrics.latency.clone(),
        );
        registry.register(
            "admission_passes",
            "Admission passes run (snapshot, decide, apply)",
            metrics.passes.clone(),
        );
        registry.register_with_unit(
            "admission_pass_duration",
            "Time one admission pass took, API writes included",
            Unit::Seconds,
            metrics.pass_duration.clone(),
        );
        registry.register(
            "admission_apply_errors",
            "API writes of the admission loop that failed, by error kind (they are retried on the next pass)",
            metrics.apply_errors.clone(),
        );
        registry.register(
            "quota_bypass_evictions",
            "Pods evicted because they held capacity without admission and broke a quota (their queue's ceiling, or another queue's guarantee), by queue and reason",
            metrics.bypass_evictions.clone(),
        );
        registry.register(
            "objects_left_out",
            "Nodes and pods the last admission pass left out, or read with a default, for a problem the leader logs (as a warning, once)",
            metrics.left_out.clone(),
        );
        metrics
    }

    /// How many nodes and pods the last pass left out or read with a default (0 when this
    /// replica stops leading: a standby reads nothing).
    pub fn left_out(&self, objects: usize) {
        self.left_out
            .set(i64::try_from(objects).unwrap_or(i64::MAX));
    }

    /// Counts an unadmitted pod evicted for breaking a quota.
    pub fn bypass_evicted(&self, queue: &str, reason: &'static str) {
        self.bypass_evictions
            .get_or_create(&BypassLabels {
                queue: queue.to_owned(),
                reason,
            })
            .inc();
    }

    /// Counts one applied decision.
    pub fn decided(&self, queue: &str, outcome: Outcome) {
        self.decisions
            .get_or_create(&DecisionLabels {
                queue: queue.to_owned(),
                outcome,
            })
            .inc();
    }

    /// Records the time from a pod's creation to the release of its gate.
    pub fn admitted_after(&self, seconds: f64) {
        self.latency.observe(seconds.max(0.0));
    }

    /// Records one admission pass.
    pub fn pass_took(&self, seconds: f64) {
        self.passes.inc();
        self.pass_duration.observe(seconds);
    }

    /// Counts a failed API write, by its error's category.
    pub fn apply_failed(&self, kind: &'static str) {
        self.apply_errors
            .get_or_create(&ApplyErrorLabels { kind })
            .inc();
    }
}

// === impl QueueGauges ===

/// One queue's row of the per-queue gauges: the numbers its status reports.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueRow {
    pub queue: String,
    pub resources: Vec<ResourceStatus>,
    pub admitted_pods: i64,
    pub pending_pods: i64,
    /// Pods holding capacity without gpuqueue's admission.
    pub unadmitted_pods: i64,
    /// Pods left waiting by the last pass, by reason code (`NoRoom`, `OverCeiling`, ...).
    pub waiting: BTreeMap<&'static str, i64>,
    /// The namespaces the queue alone claims, whose pods it holds: the series dashboards and
    /// alerts join per-pod metrics (dcgm-exporter's `namespace`) on.
    pub namespaces: Vec<String>,
}

/// Pods left waiting, by queue and reason code.
pub type Waiting = BTreeMap<String, BTreeMap<&'static str, i64>>;

/// Pods left waiting by `decisions`, by queue and reason code.
pub fn waiting_pods(decisions: &[Decision]) -> Waiting {
    let mut waiting = Waiting::new();
    for decision in decisions {
        if let Decision::Wait(Wait {
            queue: Some(queue),
            reason,
            ..
        }) = decision
        {
            *waiting
                .entry(queue.clone())
                .or_default()
                .entry(reason.code())
                .or_default() += 1;
        }
    }
    waiting
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueResourceLabels {
    queue: String,
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WaitingLabels {
    queue: String,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabels {
    queue: String,
    namespace: String,
}

/// Per-queue guaranteed, ceiling, allocated, borrowed, lent and pending GPUs by resource, and
/// admitted and pending pods. Rendered from the last published table at scrape time.
#[derive(Debug, Clone, Default)]
pub struct QueueGauges {
    table: Arc<RwLock<Arc<Vec<QueueRow>>>>,
}

impl QueueGauges {
    pub fn register(registry: &mut Registry) -> Self {
        let gauges = Self::default();
        registry.register_collector(Box::new(gauges.clone()));
        gauges
    }

    /// Replaces the table; the next scrape shows exactly these queues.
    pub fn publish(&self, rows: Vec<QueueRow>) {
        *crate::sync::write(&self.table) = Arc::new(rows);
    }

    fn rows(&self) -> Arc<Vec<QueueRow>> {
        crate::sync::read(&self.table).clone()
    }
}

/// A gauge rendered from the table: metric name, help, and which number of a row it shows.
type GaugeColumn<Row> = (&'static str, &'static str, fn(&Row) -> i64);

/// The per-resource gauges.
const RESOURCE_GAUGES: [GaugeColumn<ResourceStatus>; 6] = [
    (
        "queue_guaranteed_gpus",
        "GPUs guaranteed to the queue",
        |r| r.guaranteed,
    ),
    (
        "queue_ceiling_gpus",
        "Guaranteed plus burstable GPUs: the most the queue may hold",
        |r| r.ceiling,
    ),
    (
        "queue_allocated_gpus",
        "GPUs held by the queue's admitted pods",
        |r| r.allocated,
    ),
    (
        "queue_borrowed_gpus",
        "GPUs the queue holds above its guarantee",
        |r| r.borrowed,
    ),
    (
        "queue_lent_gpus",
        "Guaranteed GPUs of the queue in use by other queues",
        |r| r.lent,
    ),
    (
        "queue_pending_gpus",
        "GPUs requested by the queue's pods waiting at the gate",
        |r| r.pending,
    ),
];

impl Collector for QueueGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.rows();
        for (name, help, value) in RESOURCE_GAUGES {
            let family = Family::<QueueResourceLabels, Gauge>::default();
            for row in rows.iter() {
                for resource in &row.resources {
                    let labels = QueueResourceLabels {
                        queue: row.queue.clone(),
                        resource: resource.name.clone(),
                    };
                    family.get_or_create(&labels).set(value(resource));
                }
            }
            encode_family(&mut encoder, name, help, &family)?;
        }
        let pod_gauges: [GaugeColumn<QueueRow>; 3] = [
            (
                "queue_admitted_pods",
                "Pods of the queue whose gate was released",
                |r| r.admitted_pods,
            ),
            (
                "queue_pending_pods",
                "Pods of the queue waiting at the gate",
                |r| r.pending_pods,
            ),
            (
                "queue_unadmitted_pods",
                "Pods of the queue that hold capacity without gpuqueue's admission (created while its webhook was down, or ungated by hand)",
                |r| r.unadmitted_pods,
            ),
        ];
        for (name, help, value) in pod_gauges {
            let family = Family::<QueueLabels, Gauge>::default();
            for row in rows.iter() {
                let labels = QueueLabels {
                    queue: row.queue.clone(),
                };
                family.get_or_create(&labels).set(value(row));
            }
            encode_family(&mut encoder, name, help, &family)?;
        }
        encode_waiting_and_claims(&mut encoder, &rows)
    }
}

/// Waiting pods by reason, and one info series per claimed namespace.
fn encode_waiting_and_claims(
    encoder: &mut DescriptorEncoder,
    rows: &[QueueRow],
) -> Result<(), std::fmt::Error> {
    let waiting = Family::<WaitingLabels, Gauge>::default();
    let claims = Family::<ClaimLabels, Gauge>::default();
    for row in rows {
        for (reason, pods) in &row.waiting {
            let labels = WaitingLabels {
                queue: row.queue.clone(),
                reason,
            };
            waiting.get_or_create(&labels).set(*pods);
        }
        for namespace in &row.namespaces {
            let labels = ClaimLabels {
                queue: row.queue.clone(),
                namespace: namespace.clone(),
            };
            claims.get_or_create(&labels).set(1);
        }
    }
    encode_family(
        encoder,
        "queue_waiting_pods",
        "Pods of the queue left waiting at the gate by the last admission pass, by reason",
        &waiting,
    )?;
    encode_family(
        encoder,
        "queue_namespace_info",
        "1 for each namespace the queue alone claims: join per-pod series on namespace to get the queue",
        &claims,
    )
}

fn encode_family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &M,
) -> Result<(), std::fmt::Error> {
    let metric_encoder = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(metric_encoder)
}

// === impl FragmentationGauges ===

/// Fragmentation as the FGD measure defines it: free GPU capacity the workload mix cannot use
/// because of where it sits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FragmentationReport {
    /// Fragmented GPUs in the whole cluster.
    pub cluster_gpus: f64,
    /// Fragmented GPUs as a share of all GPU capacity.
    pub share_of_capacity: f64,
    /// Fragmented GPUs as a share of idle GPU capacity.
    pub share_of_idle: f64,
    /// Fragmented GPUs of each node.
    pub nodes: Vec<(String, f64)>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
enum ShareOf {
    Capacity,
    Idle,
}

impl EncodeLabelValue for ShareOf {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        let value = match self {
            Self::Capacity => "capacity",
            Self::Idle => "idle",
        };
        EncodeLabelValue::encode(&value, encoder)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareLabels {
    of: ShareOf,
}

/// Cluster and per-node fragmentation, rendered from the last report at scrape time.
#[derive(Debug, Clone, Default)]
pub struct FragmentationGauges {
    report: Arc<RwLock<Arc<FragmentationReport>>>,
}

impl FragmentationGauges {
    pub fn register(registry: &mut Registry) -> Self {
        let gauges = Self::default();
        registry.register_collector(Box::new(gauges.clone()));
        gauges
    }

    /// Replaces the report; the next scrape shows exactly these nodes.
    pub fn publish(&self, report: FragmentationReport) {
        *crate::sync::write(&self.report) = Arc::new(report);
    }
}

impl Collector for FragmentationGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let report = crate::sync::read(&self.report).clone();
        let cluster = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        cluster.set(report.cluster_gpus);
        encode_family(
            &mut encoder,
            "cluster_fragmented_gpus",
            "Free GPUs the workload mix cannot use because of where they sit",
            &cluster,
        )?;
        let shares = Family::<ShareLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        shares
            .get_or_create(&ShareLabels {
                of: ShareOf::Capacity,
            })
            .set(report.share_of_capacity);
        shares
            .get_or_create(&ShareLabels { of: ShareOf::Idle })
            .set(report.share_of_idle);
        encode_family(
            &mut encoder,
            "cluster_fragmentation_ratio",
            "Fragmented GPUs as a share of all GPU capacity and of idle GPU capacity",
            &shares,
        )?;
        let nodes = Family::<NodeLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for (node, gpus) in &report.nodes {
            nodes
                .get_or_create(&NodeLabels { node: node.clone() })
                .set(*gpus);
        }
        encode_family(
            &mut encoder,
            "node_fragmented_gpus",
            "Free GPUs of the node the workload mix cannot use",
            &nodes,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{encode, registry};

    /// The admission loop's metrics, as the wiring registers them.
    struct Metrics {
        admission: AdmissionMetrics,
        queues: QueueGauges,
        fragmentation: FragmentationGauges,
    }

    fn setup() -> (Registry, Metrics) {
        let mut registry = registry();
        let metrics = Metrics {
            admission: AdmissionMetrics::register(&mut registry),
            queues: QueueGauges::register(&mut registry),
            fragmentation: FragmentationGauges::register(&mut registry),
        };
        (registry, metrics)
    }

    fn resource(name: &str, guaranteed: i64, allocated: i64) -> ResourceStatus {
        ResourceStatus {
            name: name.to_owned(),
            guaranteed,
            ceiling: guaranteed + 8,
            allocated,
            borrowed: (allocated - guaranteed).max(0),
            lent: 0,
            pending: 1,
        }
    }

    #[test]
    fn queue_gauges_show_every_number_by_queue_and_resource() {
        let (registry, metrics) = setup();
        metrics.queues.publish(vec![QueueRow {
            queue: "batch".into(),
            resources: vec![resource("nvidia.com/gpu", 8, 12)],
            admitted_pods: 12,
            pending_pods: 1,
            unadmitted_pods: 3,
            waiting: BTreeMap::from([("NoRoom", 1)]),
            namespaces: vec!["batch-jobs".into()],
        }]);
        metrics.admission.bypass_evicted("batch", "OverCeiling");
        let text = encode(&registry).unwrap();
        for line in [
            r#"gpuqueue_queue_guaranteed_gpus{queue="batch",resource="nvidia.com/gpu"} 8"#,
            r#"gpuqueue_queue_ceiling_gpus{queue="batch",resource="nvidia.com/gpu"} 16"#,
            r#"gpuqueue_queue_allocated_gpus{queue="batch",resource="nvidia.com/gpu"} 12"#,
            r#"gpuqueue_queue_borrowed_gpus{queue="batch",resource="nvidia.com/gpu"} 4"#,
            r#"gpuqueue_queue_lent_gpus{queue="batch",resource="nvidia.com/gpu"} 0"#,
            r#"gpuqueue_queue_pending_gpus{queue="batch",resource="nvidia.com/gpu"} 1"#,
            r#"gpuqueue_queue_admitted_pods{queue="batch"} 12"#,
            r#"gpuqueue_queue_pending_pods{queue="batch"} 1"#,
            r#"gpuqueue_queue_unadmitted_pods{queue="batch"} 3"#,
            r#"gpuqueue_quota_bypass_evictions_total{queue="batch",reason="OverCeiling"} 1"#,
            r#"gpuqueue_queue_waiting_pods{queue="batch",reason="NoRoom"} 1"#,
            r#"gpuqueue_queue_namespace_info{queue="batch",namespace="batch-jobs"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn a_deleted_queue_disappears_from_the_next_scrape() {
        let (registry, metrics) = setup();
        let row = |queue: &str| QueueRow {
            queue: queue.into(),
            resources: vec![resource("nvidia.com/gpu", 1, 0)],
            admitted_pods: 0,
            pending_pods: 0,
            unadmitted_pods: 0,
            waiting: BTreeMap::new(),
            namespaces: Vec::new(),
        };
        metrics.queues.publish(vec![row("online"), row("batch")]);
        assert!(encode(&registry).unwrap().contains(r#"queue="online""#));
        metrics.queues.publish(vec![row("batch")]);
        let text = encode(&registry).unwrap();
        assert!(!text.contains(r#"queue="online""#), "{text}");
        assert!(text.contains(r#"queue="batch""#), "{text}");
    }

    #[test]
    fn decisions_are_counted_by_queue_and_outcome() {
        let (registry, metrics) = setup();
        metrics
            .admission
            .decided("batch", Outcome::AdmittedBorrowed);
        metrics
            .admission
            .decided("batch", Outcome::AdmittedBorrowed);
        metrics.admission.decided("online", Outcome::Wait);
        let text = encode(&registry).unwrap();
        assert!(
            text.contains(
                r#"gpuqueue_admission_decisions_total{queue="batch",outcome="admitted_borrowed"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"gpuqueue_admission_decisions_total{queue="online",outcome="wait"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn failed_writes_are_counted_by_error_kind() {
        let (registry, metrics) = setup();
        metrics.admission.apply_failed("pod_api");
        metrics.admission.apply_failed("pod_api");
        metrics.admission.apply_failed("queue_status_api");
        let text = encode(&registry).unwrap();
        for line in [
            r#"gpuqueue_admission_apply_errors_total{kind="pod_api"} 2"#,
            r#"gpuqueue_admission_apply_errors_total{kind="queue_status_api"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn admission_latency_is_a_histogram_in_seconds() {
        let (registry, metrics) = setup();
        metrics.admission.admitted_after(0.2);
        metrics.admission.admitted_after(3.0);
        let text = encode(&registry).unwrap();
        assert!(
            text.contains("# UNIT gpuqueue_admission_latency_seconds seconds"),
            "{text}"
        );
        assert!(
            text.contains("gpuqueue_admission_latency_seconds_count 2"),
            "{text}"
        );
        assert!(
            text.contains("gpuqueue_admission_latency_seconds_sum 3.2"),
            "{text}"
        );
    }

    #[test]
    fn fragmentation_is_reported_for_the_cluster_and_each_node() {
        let (registry, metrics) = setup();
        metrics.fragmentation.publish(FragmentationReport {
            cluster_gpus: 2.5,
            share_of_capacity: 0.125,
            share_of_idle: 0.5,
            nodes: vec![("gpu-node-1".into(), 2.5), ("gpu-node-2".into(), 0.0)],
        });
        let text = encode(&registry).unwrap();
        for line in [
            "gpuqueue_cluster_fragmented_gpus 2.5",
            r#"gpuqueue_cluster_fragmentation_ratio{of="capacity"} 0.125"#,
            r#"gpuqueue_cluster_fragmentation_ratio{of="idle"} 0.5"#,
            r#"gpuqueue_node_fragmented_gpus{node="gpu-node-1"} 2.5"#,
            r#"gpuqueue_node_fragmented_gpus{node="gpu-node-2"} 0.0"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
