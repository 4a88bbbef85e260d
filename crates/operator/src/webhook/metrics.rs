//! What the webhook answered, and the state of its serving certificate.

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

/// What the webhook did with one admission request.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum WebhookResult {
    /// The pod was admitted at its creation: pinned to a node, never gated.
    Admitted,
    /// The pod was given the admission gate.
    Gated,
    /// The pod was given the admission gate because admission passes held the lock for as long
    /// as the webhook may wait (it never blocks on one).
    Busy,
    /// The pod already carried the gate.
    AlreadyGated,
    /// No queue manages the pod; it passes unchanged.
    NotManaged,
    /// The pod was refused: a queue claims its namespace but could not count it (a GPU pod
    /// with `spec.nodeName`).
    Refused,
    /// The request could not be read; it was answered without a change.
    Invalid,
}

impl WebhookResult {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Gated => "gated",
            Self::Busy => "busy",
            Self::AlreadyGated => "already_gated",
            Self::NotManaged => "not_managed",
            Self::Refused => "refused",
            Self::Invalid => "invalid",
        }
    }
}

impl EncodeLabelValue for WebhookResult {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    result: WebhookResult,
}

/// Webhook requests and the serving certificate.
#[derive(Debug, Clone)]
pub struct WebhookMetrics {
    requests: Family<WebhookLabels, Counter>,
    ready: Gauge,
    certificate_expiry: Gauge,
    rotations: Counter,
    ca_bundle_updates: Counter,
}

impl WebhookMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            ready: Gauge::default(),
            certificate_expiry: Gauge::default(),
            rotations: Counter::default(),
            ca_bundle_updates: Counter::default(),
        };
        registry.register(
            "webhook_requests",
            "Pod admission requests answered by the webhook, by result",
            metrics.requests.clone(),
        );
        registry.register(
            "webhook_ready",
            "1 while the webhook serves with its CA published in the webhook configuration (what /readyz requires of it), else 0",
            metrics.ready.clone(),
        );
        registry.register(
            "webhook_certificate_expiry_timestamp_seconds",
            "When the webhook's current serving certificate expires (Unix time)",
            metrics.certificate_expiry.clone(),
        );
        registry.register(
            "webhook_certificate_rotations",
            "Serving certificates issued by this process",
            metrics.rotations.clone(),
        );
        registry.register(
            "webhook_ca_bundle_updates",
            "Writes of this process's CA into the MutatingWebhookConfiguration",
            metrics.ca_bundle_updates.clone(),
        );
        metrics
    }

    pub fn answered(&self, result: WebhookResult) {
        self.requests.get_or_create(&WebhookLabels { result }).inc();
    }

    /// Whether the webhook serves with its CA published (the readiness it reports).
    pub fn serving(&self, serving: bool) {
        self.ready.set(i64::from(serving));
    }

    pub fn certificate_issued(&self, expires_at_unix: i64) {
        self.rotations.inc();
        self.certificate_expiry.set(expires_at_unix);
    }

    pub fn ca_bundle_updated(&self) {
        self.ca_bundle_updates.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{encode, registry};

    #[test]
    fn webhook_state_is_exposed() {
        let mut registry = registry();
        let metrics = WebhookMetrics::register(&mut registry);
        metrics.answered(WebhookResult::Gated);
        metrics.certificate_issued(1_900_000_000);
        let text = encode(&registry).unwrap();
        assert!(text.contains("gpuqueue_webhook_ready 0"), "{text}");
        assert!(
            text.contains(r#"gpuqueue_webhook_requests_total{result="gated"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("gpuqueue_webhook_certificate_expiry_timestamp_seconds 1900000000"),
            "{text}"
        );
        metrics.serving(true);
        assert!(
            encode(&registry)
                .unwrap()
                .contains("gpuqueue_webhook_ready 1")
        );
    }
}
