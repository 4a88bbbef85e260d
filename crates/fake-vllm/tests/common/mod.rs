//! Helpers shared by the fake server's tests: start a server on a loopback "pod IP", call it
//! over real HTTP, read SSE streams.

#![allow(dead_code)] // each test file uses its own subset

use std::net::SocketAddr;
use std::time::Duration;

use gpuqueue_fake_vllm::{Config, FakeVllm};
use serde_json::Value;

pub fn dev() -> Config {
    Config {
        dev_mode: true,
        enable_sleep_mode: true,
        ..Config::default()
    }
}

/// A server on `127.100.<net>.<pod>` with a free port.
pub async fn start(config: Config, net: u8, pod: u8) -> FakeVllm {
    let addr: SocketAddr = format!("127.100.{net}.{pod}:0").parse().unwrap();
    FakeVllm::start(config, addr).await.unwrap()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// Status, content type and body of a call.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {:?}", self.body))
    }
}

pub async fn call(method: &str, url: &str, body: Option<&str>) -> Answer {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = client().request(method, url);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|value| value.to_str().unwrap().to_owned())
        .unwrap_or_default();
    Answer {
        status,
        content_type,
        body: response.text().await.unwrap(),
    }
}

pub async fn get(server: &FakeVllm, path: &str) -> Answer {
    call("GET", &server.url(path), None).await
}

pub async fn post(server: &FakeVllm, path: &str, body: Option<&str>) -> Answer {
    call("POST", &server.url(path), body).await
}

/// The value, as written, of the first sample of `name` whose labels contain `labels`.
pub fn metric(text: &str, name: &str, labels: &str) -> String {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find(|line| line.starts_with(&format!("{name}{{")) && line.contains(labels))
        .and_then(|line| line.rsplit(' ').next())
        .map_or_else(
            || panic!("no sample {name} with {labels} in\n{text}"),
            str::to_owned,
        )
}

/// Waits (up to 10 s, a liveness bound, not a timing assertion) until `done` holds.
pub async fn eventually(done: impl Fn() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition never held");
}

/// An SSE response being read frame by frame.
pub struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    pub async fn open(server: &FakeVllm, path: &str, body: &str) -> Self {
        let response = client()
            .post(server.url(path))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next `data:` payload, or `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let frame: String = self.buffer.drain(..end + 2).collect();
                let data = frame.trim_end().strip_prefix("data: ").unwrap();
                return Some(data.to_owned());
            }
            let chunk = self.response.chunk().await.unwrap()?;
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// Every remaining payload.
    pub async fn rest(&mut self) -> Vec<String> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            frames.push(frame);
        }
        frames
    }
}
