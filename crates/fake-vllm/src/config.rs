//! What a fake server pretends to be: which vLLM release (route set), whether dev mode is on,
//! how its errors look, and the timing knobs of its simulated engine.

use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;

/// The vLLM release whose route set and query parameters the fake reproduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// v0.14: `/pause?wait_for_inflight_requests=&clear_cache=` (no `mode`), the pause routes are
    /// attached without dev mode, no `/abort_requests`.
    #[value(name = "v0_14")]
    V0_14,
    /// v0.19: `/pause?mode=abort|wait|keep&clear_cache=`, dev-gated; `/sleep?level=` only.
    #[value(name = "v0_19")]
    V0_19,
    /// Newest: adds `/abort_requests`; `/sleep` also takes `mode` and `tags`; `clear_cache` is
    /// ignored with `mode=keep`.
    Latest,
}

impl Profile {
    /// The version string `/version` reports unless overridden.
    pub fn default_version(self) -> &'static str {
        match self {
            Self::V0_14 => "0.14.1",
            Self::V0_19 => "0.19.0",
            Self::Latest => "0.32.0",
        }
    }
}

/// How framework-level errors (unknown route, validation, `HTTPException`) are rendered.
/// vLLM's own serving errors (unknown model, context too long) are OpenAI-shaped in both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorStyle {
    /// FastAPI defaults: `{"detail": ...}`, 422 for validation errors.
    Fastapi,
    /// vLLM's own handlers: `{"error": {"message", "type", "param", "code"}}`, 400 for validation.
    Openai,
}

/// Everything that shapes one fake vLLM server. The same struct is the CLI's flags.
#[derive(Clone, Debug, Args, Serialize)]
#[allow(clippy::struct_excessive_bools)] // they are vLLM's own on/off flags
pub struct Config {
    /// vLLM release to imitate (route set and pause parameters).
    #[arg(long, value_enum, default_value = "latest")]
    pub profile: Profile,

    /// `VLLM_SERVER_DEV_MODE=1`: without it the dev routes are not registered (404).
    #[arg(long)]
    pub dev_mode: bool,

    /// `--enable-sleep-mode`: without it `/sleep` fails with 500.
    #[arg(long)]
    pub enable_sleep_mode: bool,

    /// Shape of framework-level error bodies.
    #[arg(long, value_enum, default_value = "fastapi")]
    pub error_style: ErrorStyle,

    /// Version string reported by `/version` (default: the profile's).
    #[arg(long)]
    pub vllm_version: Option<String>,

    /// Served model name.
    #[arg(long, default_value = "meta-llama/Llama-3.1-8B-Instruct")]
    pub model: String,

    /// Context length (`--max-model-len`).
    #[arg(long, default_value_t = 8192)]
    pub max_model_len: u32,

    /// Scheduler batch size (`--max-num-seqs`); requests beyond it wait.
    #[arg(long, default_value_t = 16)]
    pub max_num_seqs: usize,

    /// KV cache blocks on the GPU (`num_gpu_blocks`), for `vllm:kv_cache_usage_perc`.
    #[arg(long, default_value_t = 4096)]
    pub num_gpu_blocks: u32,

    /// Tokens per KV block (`--block-size`).
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,

    /// Time for one engine step (one token per running request).
    #[arg(long, value_parser = parse_duration, default_value = "20ms")]
    pub decode_interval: Duration,

    /// A generation ends with `stop` after this many tokens unless `max_tokens` is smaller.
    #[arg(long, default_value_t = 64)]
    pub natural_length: u32,

    /// How long aborted requests still count in `vllm:num_requests_*` (abort reaches the engine
    /// asynchronously, vLLM issue #27901).
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    pub abort_lag: Duration,

    /// Latency of `POST /pause` before it acts.
    #[arg(long, value_parser = parse_duration, default_value = "5ms")]
    pub pause_latency: Duration,

    /// Latency of `POST /sleep?level=1` (weights copied to host memory).
    #[arg(long, value_parser = parse_duration, default_value = "200ms")]
    pub sleep_l1_latency: Duration,

    /// Latency of `POST /sleep?level=2`.
    #[arg(long, value_parser = parse_duration, default_value = "50ms")]
    pub sleep_l2_latency: Duration,

    /// Latency of `POST /wake_up`.
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    pub wake_latency: Duration,

    /// Enable the KV offloading connector (`--kv-offloading-size`): exports the
    /// `vllm:kv_offload_*` metrics and writes completed blocks through to CPU.
    #[arg(long)]
    pub kv_offload: bool,

    /// KV bytes per token (Llama-3-8B bf16: 131072).
    #[arg(long, default_value_t = 131_072)]
    pub bytes_per_token: u64,

    /// Offload only prompt blocks (upstream default `offload_prompt_only: true`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub offload_prompt_only: bool,

    /// Write-through bandwidth of the offload tier, bytes per second.
    #[arg(long, default_value_t = 25_000_000_000)]
    pub offload_bandwidth: u64,

    /// `/health` answers 503 while shutting down (upstream behaviour unconfirmed; default 200).
    #[arg(long)]
    pub unhealthy_while_draining: bool,

    /// Keep this many synthetic requests in flight (a busy server, no clients needed). They are
    /// held while paused or asleep, like real clients' requests.
    #[arg(long, default_value_t = 0)]
    pub busy: usize,

    /// `max_tokens` of each synthetic request.
    #[arg(long, default_value_t = 256)]
    pub busy_max_tokens: u32,
}

/// The CLI's defaults: a plain `vllm serve` (no dev mode, no sleep mode, latest release).
impl Default for Config {
    fn default() -> Self {
        Self {
            profile: Profile::Latest,
            dev_mode: false,
            enable_sleep_mode: false,
            error_style: ErrorStyle::Fastapi,
            vllm_version: None,
            model: "meta-llama/Llama-3.1-8B-Instruct".to_owned(),
            max_model_len: 8192,
            max_num_seqs: 16,
            num_gpu_blocks: 4096,
            block_size: 16,
            decode_interval: Duration::from_millis(20),
            natural_length: 64,
            abort_lag: Duration::from_millis(100),
            pause_latency: Duration::from_millis(5),
            sleep_l1_latency: Duration::from_millis(200),
            sleep_l2_latency: Duration::from_millis(50),
            wake_latency: Duration::from_millis(100),
            kv_offload: false,
            bytes_per_token: 131_072,
            offload_prompt_only: true,
            offload_bandwidth: 25_000_000_000,
            unhealthy_while_draining: false,
            busy: 0,
            busy_max_tokens: 256,
        }
    }
}

impl Config {
    /// The version `/version` reports.
    pub fn version(&self) -> &str {
        self.vllm_version
            .as_deref()
            .unwrap_or_else(|| self.profile.default_version())
    }
}

/// Parses `1500ms`, `2s`, `1.5s`, `250us` or a bare number of milliseconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 150ms or 2s"))?;
    let seconds = match unit {
        "" | "ms" => value / 1e3,
        "s" => value,
        "us" | "µs" => value / 1e6,
        "m" => value * 60.0,
        _ => return Err(format!("{text:?} has an unknown unit; use us, ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("150ms"), Ok(Duration::from_millis(150)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("40"), Ok(Duration::from_millis(40)));
        assert!(parse_duration("2h").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("fast").is_err());
    }
}
