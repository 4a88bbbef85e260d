//! The HTTP client the drivers share: plain HTTP to pod IPs, no proxy (pod traffic must not
//! leave through a corporate proxy), no redirects (a pod must not steer the operator elsewhere),
//! capped bodies. Timeouts are the caller's deadline, applied around every call.

use std::error::Error as _;
use std::fmt;
use std::time::Duration;

use reqwest::redirect;

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The server answered with a status the driver treats as failure.
    Status(u16),
    /// No connection (refused, unreachable).
    Connect(String),
    /// The connection broke or the request could not be sent.
    Transport(String),
    /// The body was too large or not what the route returns.
    Body(String),
    /// vLLM accepted the pause but reports it is not paused (someone resumed it).
    NotPaused,
}

impl CallError {
    /// The kind of failure, in snake case: the label a failure counter carries.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Status(_) => "status",
            Self::Connect(_) => "connect",
            Self::Transport(_) => "transport",
            Self::Body(_) => "body",
            Self::NotPaused => "not_paused",
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status(202) => write!(
                f,
                "HTTP 202 Accepted: the work was taken, not made durable (answer 200 or 204 once it is)"
            ),
            Self::Status(status) => write!(f, "HTTP {status}"),
            Self::Connect(why) => write!(f, "cannot connect: {why}"),
            Self::Transport(why) => write!(f, "transport error: {why}"),
            Self::Body(why) => write!(f, "bad response body: {why}"),
            Self::NotPaused => f.write_str("the server reports it is not paused"),
        }
    }
}

/// A status and the body read (up to a cap).
#[derive(Debug)]
pub(super) struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// The operator's client for checkpoint calls; cheap to clone (one connection pool).
#[derive(Clone, Debug)]
pub struct CheckpointClient {
    http: reqwest::Client,
}

impl CheckpointClient {
    pub fn new() -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(redirect::Policy::none())
            .http1_only()
            .tcp_nodelay(true)
            // Reuse connections within a checkpoint; don't keep them long enough for the pod IP
            // to belong to another pod.
            .pool_idle_timeout(Duration::from_secs(5))
            .user_agent(concat!("gpuqueue-operator/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { http })
    }

    /// `POST url` without a body; reads at most `cap` bytes of the answer.
    pub(super) async fn post(&self, url: &str, cap: usize) -> Result<Reply, CallError> {
        let response = self.http.post(url).send().await;
        read(response.map_err(|error| classify(&error))?, cap).await
    }

    /// `POST url` with a JSON body; the answer's status, its body left unread.
    pub(super) async fn post_for_status(
        &self,
        url: &str,
        json: &serde_json::Value,
    ) -> Result<u16, CallError> {
        let response = self.http.post(url).json(json).send().await;
        Ok(response
            .map_err(|error| classify(&error))?
            .status()
            .as_u16())
    }

    /// `GET url`; reads at most `cap` bytes of the answer.
    pub(super) async fn get(&self, url: &str, cap: usize) -> Result<Reply, CallError> {
        read(
            self.http
                .get(url)
                .send()
                .await
                .map_err(|error| classify(&error))?,
            cap,
        )
        .await
    }
}

async fn read(mut response: reqwest::Response, cap: usize) -> Result<Reply, CallError> {
    let status = response.status().as_u16();
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|error| classify(&error))? {
        if body.len() + chunk.len() > cap {
            return Err(CallError::Body(format!("larger than {cap} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Reply { status, body })
}

/// Sorts a reqwest error into connect or transport, with the root cause (such as "Connection
/// refused (os error 111)") in the message.
fn classify(error: &reqwest::Error) -> CallError {
    let mut why = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        why = format!("{why}: {cause}");
        source = cause.source();
    }
    if error.is_connect() {
        CallError::Connect(why)
    } else {
        CallError::Transport(why)
    }
}
