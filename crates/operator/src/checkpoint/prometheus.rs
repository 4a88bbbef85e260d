//! Just enough of the Prometheus text format to read vLLM's request gauges and KV offload
//! counters: sample lines `name{labels} value [timestamp]`, with quoted, escaped label values.
//! Series are summed over label sets (one per engine with data parallelism).

/// One sample line.
#[derive(Debug, PartialEq)]
struct Sample<'a> {
    name: &'a str,
    labels: &'a str,
    value: f64,
}

/// The samples of `text`, skipping comments and lines that do not parse.
fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
        let name = &line[..name_end];
        let (labels, rest) = if line[name_end..].starts_with('{') {
            let close = closing_brace(&line[name_end + 1..])?;
            (
                &line[name_end + 1..name_end + 1 + close],
                &line[name_end + close + 2..],
            )
        } else {
            ("", &line[name_end..])
        };
        let value = rest.split_whitespace().next()?.parse().ok()?;
        Some(Sample {
            name,
            labels,
            value,
        })
    })
}

/// The index of the `}` that ends a label set, skipping braces inside quoted values.
fn closing_brace(labels: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (index, c) in labels.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(index),
            _ => {}
        }
    }
    None
}

/// The unescaped value of label `key` in a label set.
fn label(labels: &str, key: &str) -> Option<String> {
    let mut rest = labels;
    loop {
        let eq = rest.find('=')?;
        let name = rest[..eq].trim().trim_start_matches(',').trim();
        let after = rest[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (index, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break index,
                other => value.push(other),
            }
        };
        if name == key {
            return Some(value);
        }
        rest = &after[end + 1..];
    }
}

/// The sum of every sample named `name` (`None` when the series is absent).
pub(super) fn sum(text: &str, name: &str) -> Option<f64> {
    sum_where(text, name, |_| true)
}

/// The sum of the samples named `name` whose labels pass `keep`.
pub(super) fn sum_where(text: &str, name: &str, keep: impl Fn(&str) -> bool) -> Option<f64> {
    samples(text)
        .filter(|sample| sample.name == name && keep(sample.labels))
        .map(|sample| sample.value)
        .reduce(|total, value| total + value)
}

/// Whether label `key` of a label set passes `test`.
pub(super) fn label_matches(labels: &str, key: &str, test: impl Fn(&str) -> bool) -> bool {
    label(labels, key).is_some_and(|value| test(&value))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="we}ird \"name\""} 1.0 1700000000000
vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="GPU_to_CPU"} 4.194304e+06
vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"} 99.0
process_open_fds 12
garbage line {
"#;

    #[test]
    fn sums_series_over_engines() {
        assert_eq!(sum(TEXT, "vllm:num_requests_running"), Some(5.0));
        assert_eq!(sum(TEXT, "process_open_fds"), Some(12.0));
        assert_eq!(sum(TEXT, "vllm:kv_cache_usage_perc"), None);
    }

    #[test]
    fn braces_and_quotes_inside_label_values_do_not_end_the_label_set() {
        assert_eq!(sum(TEXT, "vllm:num_requests_waiting"), Some(1.0));
        let sample = samples(TEXT)
            .find(|sample| sample.name == "vllm:num_requests_waiting")
            .unwrap();
        assert_eq!(
            label(sample.labels, "model_name").as_deref(),
            Some("we}ird \"name\"")
        );
        assert_eq!(label(sample.labels, "engine").as_deref(), Some("0"));
        assert_eq!(label(sample.labels, "absent"), None);
    }

    #[test]
    fn filters_by_label() {
        let gpu_out = sum_where(TEXT, "vllm:kv_offload_total_bytes_total", |labels| {
            label_matches(labels, "transfer_type", |value| {
                value.starts_with("GPU_to_")
            })
        });
        assert_eq!(gpu_out, Some(4_194_304.0));
    }
}
