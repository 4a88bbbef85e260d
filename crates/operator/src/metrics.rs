//! Prometheus metrics, served at `/metrics` in the OpenMetrics text format: the registry and
//! its encoding. Each component owns a `…Metrics` struct with `register(&mut Registry) -> Self`
//! beside its code, and the wiring (`run.rs`) registers each one; nothing below the wiring
//! holds another component's metrics.
//!
//! Every name carries the `gpuqueue_` prefix.

use prometheus_client::registry::Registry;

/// The prefix of every metric name.
pub const PREFIX: &str = "gpuqueue";

/// A registry with the operator's prefix.
pub fn registry() -> Registry {
    Registry::with_prefix(PREFIX)
}

/// Renders a registry in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}
