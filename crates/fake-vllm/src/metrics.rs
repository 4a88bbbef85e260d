//! `/metrics` in the Prometheus text format (0.0.4) vLLM serves, with vLLM's metric names,
//! help texts and labels (`engine`, `model_name`, and per metric `sleep_state`,
//! `finished_reason`, `transfer_type`).

use std::fmt::Write;

use crate::config::Config;
use crate::engine::{Snapshot, Weights};

/// The content type of vLLM's `/metrics`.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders the exposition for one engine (`engine="0"`), in vLLM's order of families.
pub fn render(config: &Config, snapshot: &Snapshot) -> String {
    let model = escape(&config.model);
    let base = format!("engine=\"0\",model_name=\"{model}\"");
    let mut out = String::new();
    scheduler_state(&mut out, &base, snapshot);
    if config.enable_sleep_mode {
        sleep_state(&mut out, &base, snapshot);
    }
    engine_totals(&mut out, &base, snapshot);
    if config.kv_offload {
        kv_offload(&mut out, &base, snapshot);
    }
    cache_config(&mut out, config);
    out
}

/// One metric family: its `HELP` and `TYPE` lines, then one line per labelled sample.
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{{{labels}}} {}", number(*value));
    }
}

#[allow(clippy::cast_precision_loss)] // counts stay far below 2^52
fn count(value: usize) -> f64 {
    value as f64
}

#[allow(clippy::cast_precision_loss)] // totals stay far below 2^52
fn total(value: u64) -> f64 {
    value as f64
}

/// Running and waiting requests, and KV-cache usage.
fn scheduler_state(out: &mut String, base: &str, snapshot: &Snapshot) {
    family(
        out,
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        &[(base.to_owned(), count(snapshot.running))],
    );
    family(
        out,
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        &[(base.to_owned(), count(snapshot.waiting))],
    );
    family(
        out,
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        &[(base.to_owned(), snapshot.kv_cache_usage)],
    );
}

/// `vllm:engine_sleep_state`, served only with `--enable-sleep-mode`.
fn sleep_state(out: &mut String, base: &str, snapshot: &Snapshot) {
    let level = snapshot.sleep_level.unwrap_or(0);
    let asleep = snapshot.sleep_level.is_some_and(|level| level > 0);
    let offloaded = asleep && level == 1 && snapshot.weights == Weights::Offloaded;
    let discarded = asleep && level >= 2;
    let flag = |on: bool| if on { 1.0 } else { 0.0 };
    family(
        out,
        "vllm:engine_sleep_state",
        "gauge",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        &[
            (format!("{base},sleep_state=\"awake\""), flag(!asleep)),
            (
                format!("{base},sleep_state=\"weights_offloaded\""),
                flag(offloaded),
            ),
            (
                format!("{base},sleep_state=\"discard_all\""),
                flag(discarded),
            ),
        ],
    );
}

/// The engine's counters: preemptions, tokens and finished requests by reason.
fn engine_totals(out: &mut String, base: &str, snapshot: &Snapshot) {
    family(
        out,
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemption from the engine.",
        &[(base.to_owned(), total(snapshot.preemptions_total))],
    );
    family(
        out,
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        &[(base.to_owned(), total(snapshot.prompt_tokens_total))],
    );
    family(
        out,
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        &[(base.to_owned(), total(snapshot.generation_tokens_total))],
    );
    family(
        out,
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        &[
            (
                format!("{base},finished_reason=\"stop\""),
                total(snapshot.finished_stop),
            ),
            (
                format!("{base},finished_reason=\"length\""),
                total(snapshot.finished_length),
            ),
            (
                format!("{base},finished_reason=\"abort\""),
                total(snapshot.finished_abort),
            ),
        ],
    );
}

/// The KV connector's offload counters, served only with KV offloading on.
fn kv_offload(out: &mut String, base: &str, snapshot: &Snapshot) {
    family(
        out,
        "vllm:kv_offload_total_bytes_total",
        "counter",
        "Number of bytes offloaded by KV connector",
        &[
            (
                format!("{base},transfer_type=\"GPU_to_CPU\""),
                total(snapshot.offload_bytes_total),
            ),
            (format!("{base},transfer_type=\"CPU_to_GPU\""), 0.0),
        ],
    );
    family(
        out,
        "vllm:kv_offload_total_time_total",
        "counter",
        "Total time measured by all KV offloading operations",
        &[
            (
                format!("{base},transfer_type=\"GPU_to_CPU\""),
                snapshot.offload_seconds_total,
            ),
            (format!("{base},transfer_type=\"CPU_to_GPU\""), 0.0),
        ],
    );
}

/// `vllm:cache_config_info`: the cache configuration as labels of a constant 1.
fn cache_config(out: &mut String, config: &Config) {
    let cache_info = format!(
        "block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\"",
        config.block_size, config.num_gpu_blocks
    );
    family(
        out,
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig",
        &[(cache_info, 1.0)],
    );
}

/// Python's float repr, as prometheus_client writes values: `0.0`, `3.0`, `0.25`.
fn number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.1}")
    } else {
        format!("{value}")
    }
}

/// Escapes a label value (backslash, quote, newline).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
