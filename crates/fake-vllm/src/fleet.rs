//! Several fake servers in one process, one per address, and the fleet's admin routes that add
//! and remove servers and reach each one's own admin routes (the only way back to a server
//! after it stops accepting).

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use http::{StatusCode, Uri};
use serde::Deserialize;
use serde_json::json;
use tower::ServiceExt;

use crate::admin::{bad_request, body, server_router};
use crate::config::Config;
use crate::faults::RouteFault;
use crate::server::FakeVllm;

/// Several fake servers in one process, one per address, each with its own state; the admin
/// listener reaches each through `/_fake/servers/{addr}/...` and can add or remove servers.
#[derive(Debug)]
pub struct Fleet {
    config: Config,
    faults: Vec<RouteFault>,
    servers: Mutex<BTreeMap<SocketAddr, FakeVllm>>,
}

impl Fleet {
    /// A fleet whose servers all take `config` and start with `faults`.
    pub fn new(config: Config, faults: Vec<RouteFault>) -> Arc<Self> {
        Arc::new(Self {
            config,
            faults,
            servers: Mutex::new(BTreeMap::new()),
        })
    }

    /// Starts a server on `addr`.
    pub async fn add(&self, addr: SocketAddr) -> io::Result<FakeVllm> {
        if self.get(addr).is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{addr} is already served"),
            ));
        }
        let server = FakeVllm::start(self.config.clone(), addr).await?;
        for fault in &self.faults {
            server.set_fault(&fault.route, fault.fault.clone());
        }
        self.lock().insert(server.addr(), server.clone());
        Ok(server)
    }

    pub fn get(&self, addr: SocketAddr) -> Option<FakeVllm> {
        self.lock().get(&addr).cloned()
    }

    /// Stops and forgets the server on `addr`.
    pub fn remove(&self, addr: SocketAddr) -> Option<FakeVllm> {
        let server = self.lock().remove(&addr)?;
        server.stop();
        Some(server)
    }

    pub fn servers(&self) -> Vec<FakeVllm> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<SocketAddr, FakeVllm>> {
        self.servers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The fleet's admin routes: list, add and remove servers, and reach each one's admin routes.
pub fn fleet_router(fleet: Arc<Fleet>) -> Router {
    Router::new()
        .route("/_fake/servers", get(list_servers).post(add_server))
        .route(
            "/_fake/servers/{addr}",
            axum::routing::delete(remove_server),
        )
        .route("/_fake/servers/{addr}/{*rest}", any(forward))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                axum::Json(json!({"error": "no such admin route"})),
            )
        })
        .with_state(fleet)
}

async fn list_servers(State(fleet): State<Arc<Fleet>>) -> Response {
    let servers: Vec<_> = fleet
        .servers()
        .iter()
        .map(|server| {
            json!({
                "addr": server.addr(),
                "listening": server.listening(),
                "phase": server.snapshot().phase,
            })
        })
        .collect();
    axum::Json(servers).into_response()
}

#[derive(Deserialize)]
struct AddBody {
    listen: String,
}

/// `POST /_fake/servers {"listen": "127.100.0.9:8000"}` starts one more server.
async fn add_server(
    State(fleet): State<Arc<Fleet>>,
    body: Result<axum::Json<AddBody>, JsonRejection>,
) -> Response {
    let body = body!(body);
    let Ok(addr) = body.listen.parse::<SocketAddr>() else {
        return bad_request("listen must be an IP:port address such as 127.100.0.9:8000");
    };
    match fleet.add(addr).await {
        Ok(server) => (
            StatusCode::CREATED,
            axum::Json(json!({ "addr": server.addr() })),
        )
            .into_response(),
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => (
            StatusCode::CONFLICT,
            axum::Json(json!({ "error": error.to_string() })),
        )
            .into_response(),
        Err(error) => bad_request(&format!("cannot listen on {addr}: {error}")),
    }
}

fn server_of(fleet: &Fleet, addr: &str) -> Result<FakeVllm, Response> {
    addr.parse::<SocketAddr>()
        .ok()
        .and_then(|addr| fleet.get(addr))
        .ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                axum::Json(json!({ "error": format!("no server on {addr}") })),
            )
                .into_response()
        })
}

async fn remove_server(State(fleet): State<Arc<Fleet>>, Path(addr): Path<String>) -> Response {
    match server_of(&fleet, &addr) {
        Ok(server) => {
            fleet.remove(server.addr());
            StatusCode::NO_CONTENT.into_response()
        }
        Err(response) => response,
    }
}

/// `/_fake/servers/{addr}/{rest}` → that server's `/_fake/{rest}`.
async fn forward(
    State(fleet): State<Arc<Fleet>>,
    Path((addr, rest)): Path<(String, String)>,
    request: Request,
) -> Response {
    let server = match server_of(&fleet, &addr) {
        Ok(server) => server,
        Err(response) => return response,
    };
    let (mut parts, body) = request.into_parts();
    let query = parts
        .uri
        .query()
        .map(|query| format!("?{query}"))
        .unwrap_or_default();
    let Ok(uri) = format!("/_fake/{rest}{query}").parse::<Uri>() else {
        return bad_request("malformed admin path");
    };
    parts.uri = uri;
    match server_router(server)
        .oneshot(Request::from_parts(parts, Body::new(body)))
        .await
    {
        Ok(response) => response,
        Err(never) => match never {},
    }
}
