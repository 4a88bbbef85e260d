//! Serving one fake server's socket: binding it, accepting while the server is accepting
//! (closing the socket and every open connection when it is not, binding again when it is),
//! and sending each request to the admin routes or to the server's vLLM path. Connections are
//! served with hyper directly so that a fault can drop a connection without answering.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tower::ServiceExt;

use crate::admin;
use crate::config::Config;
use crate::server::{FakeVllm, Listening};

impl FakeVllm {
    /// Binds `addr` (port 0 picks a free port) and starts serving.
    pub async fn start(config: Config, addr: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let server = Self::launch(config, addr);
        server.spawn(listen(server.for_task(), listener));
        tracing::info!(%addr, "fake vLLM serving");
        Ok(server)
    }
}

/// Accepts connections while the server is `Accepting`; closes the socket and every open
/// connection when it is not, and binds again when it is accepting again.
async fn listen(server: FakeVllm, listener: TcpListener) {
    let mut state = server.listening_changes();
    let closing = watch::channel(0u64).0;
    let mut listener = Some(listener);
    loop {
        let current = *state.borrow_and_update();
        match current {
            Listening::Stopped => {
                server.report_bound(false);
                return;
            }
            Listening::Refusing => {
                listener = None;
                closing.send_modify(|generation| *generation += 1);
                server.report_bound(false);
                if state.changed().await.is_err() {
                    return;
                }
            }
            Listening::Accepting => {
                let active = match listener.take() {
                    Some(active) => active,
                    None => match TcpListener::bind(server.addr()).await {
                        Ok(active) => active,
                        Err(error) => {
                            tracing::warn!(addr = %server.addr(), %error, "rebinding failed; retrying");
                            tokio::select! {
                                () = tokio::time::sleep(Duration::from_millis(50)) => {}
                                changed = state.changed() => if changed.is_err() { return },
                            }
                            continue;
                        }
                    },
                };
                server.report_bound(true);
                loop {
                    tokio::select! {
                        accepted = active.accept() => match accepted {
                            Ok((stream, _)) => {
                                tokio::spawn(connection(server.for_task(), stream, closing.subscribe()));
                            }
                            Err(error) => {
                                tracing::warn!(%error, "accept failed");
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        },
                        changed = state.changed() => {
                            if changed.is_err() {
                                return;
                            }
                            break;
                        }
                    }
                }
            }
        }
    }
}

/// Serves one connection until it ends, a `close` fault drops it, or the listener closes.
async fn connection(server: FakeVllm, stream: TcpStream, mut closing: watch::Receiver<u64>) {
    let _ = stream.set_nodelay(true);
    let kill = Arc::new(Notify::new());
    let service = {
        let kill = Arc::clone(&kill);
        hyper::service::service_fn(move |request| {
            let server = server.clone();
            let kill = Arc::clone(&kill);
            async move { Ok::<_, Infallible>(dispatch(&server, request, &kill).await) }
        })
    };
    let serving =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = serving => {}
        () = kill.notified() => {}
        _ = closing.changed() => {}
    }
}

/// One request: admin routes go to the admin router, the rest to the server's vLLM path.
async fn dispatch(server: &FakeVllm, request: Request<Incoming>, kill: &Notify) -> Response<Body> {
    let path = request.uri().path();
    if path == "/_fake" || path.starts_with("/_fake/") {
        let admin = admin::server_router(server.clone());
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(admin::ViaOwnAddress);
        return match admin.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
    }
    server.answer_vllm(request, kill).await
}
