//! The watches' health: errors by resource, and queue objects the operator cannot read.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    resource: String,
}

/// Health of the watches behind the stores.
#[derive(Debug, Clone)]
pub struct WatchMetrics {
    errors: Family<WatchLabels, Counter>,
    invalid_queues: Gauge,
}

impl WatchMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            errors: Family::default(),
            invalid_queues: Gauge::default(),
        };
        registry.register(
            "watch_errors",
            "Errors of the watches behind the stores, by resource (each is retried with backoff)",
            metrics.errors.clone(),
        );
        registry.register(
            "invalid_queue_objects",
            "GpuQueue objects the operator could not read (reported on their status)",
            metrics.invalid_queues.clone(),
        );
        metrics
    }

    pub fn watch_failed(&self, resource: &str) {
        self.errors
            .get_or_create(&WatchLabels {
                resource: resource.to_owned(),
            })
            .inc();
    }

    pub fn set_invalid_queues(&self, count: i64) {
        self.invalid_queues.set(count);
    }
}
