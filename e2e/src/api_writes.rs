//! What a run asked of the API server: its requests (and its writes) so far, from its own
//! `apiserver_request_total`, for benchmarks that compare what each system writes; and how
//! long it waited for a webhook.

use std::collections::BTreeMap;

use kube::Client;

/// The API server's write requests so far, by `VERB resource[/subresource]` (`POST pods`,
/// `PATCH pods/status`, …); empty if `/metrics` cannot be read.
pub async fn api_writes(client: &Client) -> BTreeMap<String, f64> {
    ServerMetrics::read(client).await.writes()
}

/// Every request the API server has answered so far (watches and reads included), by
/// `VERB resource[/subresource]`, from its `apiserver_request_total`; empty if `/metrics`
/// cannot be read.
pub async fn api_requests(client: &Client) -> BTreeMap<String, f64> {
    ServerMetrics::read(client).await.requests()
}

/// One read of the API server's `/metrics` (empty if it cannot be read), for a benchmark that
/// wants several of its counters at one moment: each read costs the API server tens of
/// milliseconds of CPU and garbage, which a burst measured right after it would pay for.
pub struct ServerMetrics {
    text: String,
}

impl std::fmt::Debug for ServerMetrics {
    /// Its size, not its text (megabytes).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerMetrics")
            .field("bytes", &self.text.len())
            .finish()
    }
}

impl ServerMetrics {
    pub async fn read(client: &Client) -> Self {
        let text = match http::Request::get("/metrics").body(Vec::new()) {
            Ok(request) => client.request_text(request).await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        Self { text }
    }

    /// [`api_requests`] as of this read.
    pub fn requests(&self) -> BTreeMap<String, f64> {
        let mut requests = BTreeMap::new();
        for line in self.text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let label = |name: &str| label(labels, name);
            let mut key = format!("{} {}", label("verb"), label("resource"));
            if !label("subresource").is_empty() {
                key = format!("{key}/{}", label("subresource"));
            }
            *requests.entry(key).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
        }
        requests
    }

    /// [`api_writes`] as of this read.
    pub fn writes(&self) -> BTreeMap<String, f64> {
        let mut writes = self.requests();
        writes.retain(|key, _| {
            let verb = key.split(' ').next().unwrap_or_default();
            matches!(verb, "POST" | "PATCH" | "PUT" | "DELETE" | "APPLY")
        });
        writes
    }

    /// The calls the API server made so far to the mutating webhook `name` (as its
    /// configuration names it), and how long it waited for their answers in all, from its
    /// `apiserver_admission_webhook_admission_duration_seconds`: round trip and the webhook's
    /// own time together. Zeros if `/metrics` could not be read.
    pub fn webhook_calls(&self, name: &str) -> WebhookCalls {
        webhook_calls_in(&self.text, name)
    }
}

/// [`ServerMetrics::webhook_calls`] from the `/metrics` text.
fn webhook_calls_in(text: &str, name: &str) -> WebhookCalls {
    let mut calls = WebhookCalls::default();
    let series = "apiserver_admission_webhook_admission_duration_seconds";
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(series) else {
            continue;
        };
        let Some((kind, rest)) = rest.split_once('{') else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        if label(labels, "name") != name {
            continue;
        }
        let value = value.trim().parse::<f64>().unwrap_or(0.0);
        match kind {
            "_count" => calls.count += value,
            "_sum" => calls.seconds += value,
            _ => {}
        }
    }
    calls
}

/// Calls of one webhook and the API server's wait for them, so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct WebhookCalls {
    pub count: f64,
    pub seconds: f64,
}

impl WebhookCalls {
    /// The mean wait per call made since `before`, in milliseconds; `None` without a call.
    pub fn mean_ms_since(&self, before: &Self) -> Option<f64> {
        let count = self.count - before.count;
        (count > 0.0).then(|| (self.seconds - before.seconds) * 1000.0 / count)
    }
}

/// The value of label `name` in a Prometheus series' `labels` (`""` when absent).
fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    labels
        .split(',')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix("=\""))
        .map_or("", |v| v.trim_end_matches('"'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhooks_calls_and_wait_are_summed_over_its_series_and_others_are_left_out() {
        let text = r#"# TYPE apiserver_admission_webhook_admission_duration_seconds histogram
apiserver_admission_webhook_admission_duration_seconds_bucket{name="gate.gpuqueue.io",operation="CREATE",rejected="false",type="admit",le="0.005"} 20
apiserver_admission_webhook_admission_duration_seconds_sum{name="gate.gpuqueue.io",operation="CREATE",rejected="false",type="admit"} 0.25
apiserver_admission_webhook_admission_duration_seconds_count{name="gate.gpuqueue.io",operation="CREATE",rejected="false",type="admit"} 40
apiserver_admission_webhook_admission_duration_seconds_sum{name="gate.gpuqueue.io",operation="CREATE",rejected="true",type="admit"} 0.05
apiserver_admission_webhook_admission_duration_seconds_count{name="gate.gpuqueue.io",operation="CREATE",rejected="true",type="admit"} 10
apiserver_admission_webhook_admission_duration_seconds_sum{name="mpod.kueue.x-k8s.io",operation="CREATE",rejected="false",type="admit"} 9
apiserver_admission_webhook_admission_duration_seconds_count{name="mpod.kueue.x-k8s.io",operation="CREATE",rejected="false",type="admit"} 9
"#;
        let before = WebhookCalls {
            count: 30.0,
            seconds: 0.1,
        };
        let now = webhook_calls_in(text, "gate.gpuqueue.io");
        assert!((now.count - 50.0).abs() < 1e-9, "{now:?}");
        assert!((now.seconds - 0.3).abs() < 1e-9);
        let mean = now.mean_ms_since(&before).unwrap();
        assert!((mean - 10.0).abs() < 1e-9, "{mean}");
        assert_eq!(now.mean_ms_since(&now), None, "no call since");
        let unread = webhook_calls_in("", "gate.gpuqueue.io");
        assert!(unread.count.abs() < 1e-9 && unread.seconds.abs() < 1e-9);
    }

    #[test]
    fn writes_are_summed_per_verb_and_resource_and_reads_are_left_out() {
        let metrics = ServerMetrics {
            text: r#"# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 12
apiserver_request_total{code="409",component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",group="gpuqueue.io",resource="gpuqueues",scope="resource",subresource="status",verb="APPLY",version="v1alpha1"} 2
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 40
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="WATCH",version="v1"} 5
"#
            .to_owned(),
        };
        let writes = metrics.writes();
        assert_eq!(
            writes.into_iter().collect::<Vec<_>>(),
            vec![
                ("APPLY gpuqueues/status".to_owned(), 2.0),
                ("POST pods".to_owned(), 15.0),
                ("POST pods/binding".to_owned(), 7.0),
            ]
        );
        assert_eq!(metrics.requests().get("LIST pods"), Some(&40.0));
        let unread = ServerMetrics {
            text: String::new(),
        };
        assert!(unread.writes().is_empty());
    }
}
