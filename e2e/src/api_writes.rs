//! What a run asked of the API server: its requests (and its writes) so far, from its own
//! `apiserver_request_total`, for benchmarks that compare what each system writes.

use std::collections::BTreeMap;

use kube::Client;

/// The API server's write requests so far, by `VERB resource[/subresource]` (`POST pods`,
/// `PATCH pods/status`, …); empty if `/metrics` cannot be read.
pub async fn api_writes(client: &Client) -> BTreeMap<String, f64> {
    let mut writes = api_requests(client).await;
    writes.retain(|key, _| {
        let verb = key.split(' ').next().unwrap_or_default();
        matches!(verb, "POST" | "PATCH" | "PUT" | "DELETE" | "APPLY")
    });
    writes
}

/// Every request the API server has answered so far (watches and reads included), by
/// `VERB resource[/subresource]`, from its `apiserver_request_total`; empty if `/metrics`
/// cannot be read.
pub async fn api_requests(client: &Client) -> BTreeMap<String, f64> {
    let Ok(request) = http::Request::get("/metrics").body(Vec::new()) else {
        return BTreeMap::new();
    };
    let text = client.request_text(request).await.unwrap_or_default();
    let mut requests = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix("=\""))
                .map_or("", |v| v.trim_end_matches('"'))
        };
        let mut key = format!("{} {}", label("verb"), label("resource"));
        if !label("subresource").is_empty() {
            key = format!("{key}/{}", label("subresource"));
        }
        *requests.entry(key).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    requests
}
