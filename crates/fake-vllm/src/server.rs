//! One fake vLLM server on one address: the handle to its engine, its faults and call log and
//! whether it accepts connections, and its vLLM request path (logged, then faults, then vLLM's
//! routes). Serving the socket is `listener.rs`; the admin routes over this handle are
//! `admin.rs`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tower::ServiceExt;

use crate::config::Config;
use crate::engine::{Engine, GenEvent, Snapshot};
use crate::faults::{Call, CallLog, Fault, FaultAction, FaultTable, RouteFault};
use crate::{errors, routes};

/// Whether a server accepts connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Listening {
    /// Bound and serving.
    Accepting,
    /// Socket closed: connections are refused (and open ones were closed) until accepting again.
    Refusing,
    /// Gone for good (stopped, or the engine exited after a shutdown).
    Stopped,
}

/// A handle to one running fake server; clones share it. The server stops when the last
/// clone is dropped: its own tasks hold handles that do not keep it alive, so a test's servers
/// never outlive the test (and its loopback addresses) however it ends.
#[derive(Clone, Debug)]
pub struct FakeVllm {
    inner: Arc<Inner>,
    /// Shared by the handles given out, `None` in the server's own tasks.
    _owner: Option<Arc<Owner>>,
}

/// Stops the server when the last handle given out is dropped.
#[derive(Debug)]
struct Owner(Arc<Inner>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.stop();
    }
}

#[derive(Debug)]
struct Inner {
    addr: SocketAddr,
    engine: Arc<Engine>,
    vllm: Router,
    faults: FaultTable,
    calls: CallLog,
    listening: watch::Sender<Listening>,
    /// Whether the socket is open now, as the listener last reported.
    bound: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Inner {
    fn stop(&self) {
        self.listening.send_replace(Listening::Stopped);
        let tasks = std::mem::take(&mut *self.lock_tasks());
        for task in tasks {
            task.abort();
        }
    }

    fn lock_tasks(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FakeVllm {
    /// A server for `addr` whose engine runs (with its synthetic load, and the server marked
    /// stopped once the engine exits) while nobody serves its socket yet:
    /// [`FakeVllm::start`] binds and serves it.
    pub(crate) fn launch(config: Config, addr: SocketAddr) -> Self {
        let busy = config.busy;
        let busy_max_tokens = config.busy_max_tokens;
        let engine = Engine::new(config);
        let inner = Arc::new(Inner {
            addr,
            vllm: routes::router(Arc::clone(&engine)),
            engine: Arc::clone(&engine),
            faults: FaultTable::default(),
            calls: CallLog::new(),
            listening: watch::channel(Listening::Accepting).0,
            bound: watch::channel(true).0,
            tasks: Mutex::new(Vec::new()),
        });
        let server = Self {
            _owner: Some(Arc::new(Owner(Arc::clone(&inner)))),
            inner,
        };
        server.spawn(Arc::clone(&engine).run());
        for _ in 0..busy {
            server.spawn(synthetic_client(
                Arc::clone(&engine),
                128,
                busy_max_tokens,
                true,
            ));
        }
        let exiting = server.for_task();
        server.spawn(async move {
            exiting.inner.engine.exited().await;
            exiting.inner.listening.send_replace(Listening::Stopped);
        });
        server
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.inner.addr)
    }

    pub fn config(&self) -> &Config {
        self.inner.engine.config()
    }

    /// The engine's state as the metrics and admin routes report it.
    pub fn snapshot(&self) -> Snapshot {
        self.inner.engine.snapshot()
    }

    /// Injects `fault` on `route` (a path such as `/pause`, or `*`).
    pub fn set_fault(&self, route: &str, fault: Fault) {
        self.inner.faults.set(route, fault);
    }

    /// Injects a fault with only an action (no delay, no count).
    pub fn set_fault_action(&self, route: &str, action: FaultAction) {
        self.set_fault(
            route,
            Fault {
                action,
                ..Fault::default()
            },
        );
    }

    /// Clears the fault on `route`, or every fault.
    pub fn clear_faults(&self, route: Option<&str>) {
        self.inner.faults.clear(route);
    }

    pub fn faults(&self) -> Vec<RouteFault> {
        self.inner.faults.list()
    }

    /// Every vLLM call received so far (admin calls are not logged).
    pub fn calls(&self) -> Vec<Call> {
        self.inner.calls.calls()
    }

    /// The calls to `path`.
    pub fn calls_to(&self, path: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|call| call.path == path)
            .collect()
    }

    pub fn clear_calls(&self) {
        self.inner.calls.clear();
    }

    pub fn listening(&self) -> Listening {
        *self.inner.listening.borrow()
    }

    /// Stops accepting (the socket closes: connections are refused and open ones are dropped),
    /// or starts again on the same address. Returns once the socket is closed or bound again.
    pub async fn set_accepting(&self, accepting: bool) {
        let changed = self.inner.listening.send_if_modified(|listening| {
            let next = match (*listening, accepting) {
                (Listening::Stopped, _) => return false,
                (_, true) => Listening::Accepting,
                (_, false) => Listening::Refusing,
            };
            let modified = *listening != next;
            *listening = next;
            modified
        });
        if changed {
            let mut bound = self.inner.bound.subscribe();
            // An error means the listener is gone, which is as closed as it gets.
            let _ = bound.wait_for(|bound| *bound == accepting).await;
        }
    }

    /// Makes `/health` answer 503, as after vLLM's `EngineDeadError`.
    pub fn set_engine_dead(&self, dead: bool) {
        self.inner.engine.set_dead(dead);
    }

    /// Emulates SIGTERM with `--shutdown-timeout`: new requests get 503, in-flight ones have
    /// `drain` to finish, then the engine exits and the address refuses connections.
    pub fn shutdown(&self, drain: Duration) {
        self.inner.engine.begin_shutdown(drain);
    }

    /// Resolves once the engine has exited after [`FakeVllm::shutdown`].
    pub async fn exited(&self) {
        self.inner.engine.exited().await;
    }

    /// Starts `requests` synthetic requests (no HTTP client) of `prompt_tokens` and
    /// `max_tokens`; like real clients' they are held while paused or asleep.
    pub fn add_load(&self, requests: usize, prompt_tokens: u32, max_tokens: u32) {
        for _ in 0..requests {
            self.spawn(synthetic_client(
                Arc::clone(&self.inner.engine),
                prompt_tokens,
                max_tokens,
                false,
            ));
        }
    }

    /// Stops the server for good: the address refuses connections and every task ends.
    pub fn stop(&self) {
        self.inner.stop();
    }

    /// A handle for the server's own tasks: it does not keep the server running.
    pub(crate) fn for_task(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            _owner: None,
        }
    }

    /// Runs `task` until it ends or the server stops.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = self.inner.lock_tasks();
        tasks.retain(|task| !task.is_finished());
        tasks.push(tokio::spawn(task));
    }

    /// Follows whether the server should accept connections (for its listener).
    pub(crate) fn listening_changes(&self) -> watch::Receiver<Listening> {
        self.inner.listening.subscribe()
    }

    /// The listener's word on whether the socket is open now.
    pub(crate) fn report_bound(&self, bound: bool) {
        self.inner.bound.send_replace(bound);
    }

    /// One vLLM request (not an admin one): logged, then faults apply (`kill` drops the
    /// connection), then the vLLM router answers.
    pub(crate) async fn answer_vllm(
        &self,
        request: Request<Incoming>,
        kill: &Notify,
    ) -> Response<Body> {
        let path = request.uri().path().to_owned();
        self.inner
            .calls
            .record(request.method().as_str(), &path, request.uri().query());
        tracing::debug!(addr = %self.inner.addr, method = %request.method(), %path, "call");
        if let Some(fault) = self.inner.faults.take(&path) {
            tokio::time::sleep(fault.delay()).await;
            match fault.action {
                FaultAction::Respond => {}
                FaultAction::Status(code) => {
                    let status =
                        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    return errors::injected(self.config().error_style, &path, status);
                }
                FaultAction::Hang => return std::future::pending().await,
                FaultAction::Close => {
                    kill.notify_one();
                    return std::future::pending().await;
                }
            }
        }
        match self
            .inner
            .vllm
            .clone()
            .oneshot(request.map(Body::new))
            .await
        {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

/// A client that needs no HTTP: waits at the door, submits, reads until finished; `forever`
/// keeps one request in flight for as long as the engine runs.
async fn synthetic_client(engine: Arc<Engine>, prompt_tokens: u32, max_tokens: u32, forever: bool) {
    loop {
        let Ok((_, mut events)) = engine.admit(prompt_tokens, max_tokens).await else {
            return;
        };
        while let Some(event) = events.recv().await {
            if matches!(event, GenEvent::Finished(_)) {
                break;
            }
        }
        if !forever {
            return;
        }
    }
}
