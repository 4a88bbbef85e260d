//! Counters read from the processes: deltas of the API server's requests
//! (`gpuqueue_e2e::api_requests`), the operator's admission-pass histogram, and the passes its
//! debug log records one by one.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

/// `after - before`, keeping the keys that moved.
pub fn delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(key, value)| (key.clone(), value - before.get(key).copied().unwrap_or(0.0)))
        .filter(|(_, moved)| *moved > 0.0)
        .collect()
}

/// The cumulative buckets (upper bound in seconds, count) of a Prometheus histogram in
/// `metrics`, `+Inf` last.
pub fn histogram(metrics: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (bound, count) = rest.split_once("\"} ")?;
            let bound = if bound == "+Inf" {
                f64::INFINITY
            } else {
                bound.parse().ok()?
            };
            Some((bound, count.trim().parse().ok()?))
        })
        .collect()
}

/// The `q` quantile of the observations between two readings of one histogram, interpolated
/// within its bucket as Prometheus' `histogram_quantile` does; `None` without observations.
pub fn histogram_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|(bound, count)| {
            let earlier = before
                .iter()
                .find(|(b, _)| b.total_cmp(bound).is_eq())
                .map_or(0.0, |(_, c)| *c);
            (*bound, count - earlier)
        })
        .collect();
    let total = counts.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(bound, count) in &counts {
        if count >= rank {
            if bound.is_infinite() {
                return Some(lower.0);
            }
            let within = (rank - lower.1) / (count - lower.1).max(f64::MIN_POSITIVE);
            return Some(lower.0 + (bound - lower.0) * within);
        }
        lower = (bound, count);
    }
    None
}

/// One admission pass as the operator's debug log records it.
#[derive(Debug, Clone, Copy)]
pub struct LoggedPass {
    pub at: Timestamp,
    /// Wall time.
    pub millis: f64,
    /// The pass thread's CPU time: the wall time less the time other processes held the CPU
    /// (operators from before it was logged have none).
    pub cpu_millis: Option<f64>,
    /// Whether the pass brought the last snapshot up to date rather than building one
    /// (operators from before it was logged say nothing).
    pub updated: Option<bool>,
}

/// The passes in an operator log (`admission pass took=…`), colours and all.
pub fn logged_passes(log: &str) -> Vec<LoggedPass> {
    log.lines()
        .filter_map(|line| {
            let plain = strip_ansi(line);
            if !plain.contains("admission pass took=") {
                return None;
            }
            let at: Timestamp = plain.split_whitespace().next()?.parse().ok()?;
            let field = |name: &str| plain.split(name).nth(1)?.split_whitespace().next();
            Some(LoggedPass {
                at,
                millis: duration_millis(field("took=")?)?,
                cpu_millis: field(" cpu=").and_then(duration_millis),
                updated: field(" updated=").and_then(|v| v.parse().ok()),
            })
        })
        .collect()
}

/// Milliseconds in a `Duration`'s debug form: `850ns`, `12.3µs`, `1.33ms`, `2.1s`.
fn duration_millis(text: &str) -> Option<f64> {
    let units = [("ns", 1e-6), ("µs", 1e-3), ("ms", 1.0), ("s", 1e3)];
    units.iter().find_map(|(unit, scale)| {
        let number: f64 = text.strip_suffix(unit)?.parse().ok()?;
        Some(number * scale)
    })
}

fn strip_ansi(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The value at `p` of sorted values (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some(sorted[index.min(sorted.len() - 1)])
}
