//! What a run asked of the API server: its write requests so far, from its own
//! `apiserver_request_total`, for benchmarks that compare what each system writes.

use std::collections::BTreeMap;

use kube::Client;

/// The API server's write requests so far, by `VERB resource[/subresource]` (`POST pods`,
/// `PATCH pods/status`, …); empty if `/metrics` cannot be read.
pub async fn api_writes(client: &Client) -> BTreeMap<String, f64> {
    let Ok(request) = http::Request::get("/metrics").body(Vec::new()) else {
        return BTreeMap::new();
    };
    let text = client.request_text(request).await.unwrap_or_default();
    let mut writes = BTreeMap::new();
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
        let verb = label("verb");
        if !matches!(verb, "POST" | "PATCH" | "PUT" | "DELETE" | "APPLY") {
            continue;
        }
        let mut key = format!("{verb} {}", label("resource"));
        if !label("subresource").is_empty() {
            key = format!("{key}/{}", label("subresource"));
        }
        *writes.entry(key).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    writes
}
