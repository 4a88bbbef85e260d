//! Faults injected per route (latency, a fixed status, a hang, a dropped connection) and the log
//! of the calls a server received. Both sit in front of the vLLM routes and never apply to the
//! fake's own `/_fake/` admin routes.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The route key that matches every vLLM route without a fault of its own.
pub const ANY_ROUTE: &str = "*";

/// What happens to a call on a faulty route, after the delay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultAction {
    /// Answer normally (with only a delay, this is injected latency).
    #[default]
    Respond,
    /// Answer with this status and the route's error body instead.
    Status(u16),
    /// Accept the request and never answer.
    Hang,
    /// Close the connection without answering.
    Close,
}

/// One injected fault.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// Milliseconds to wait before acting.
    #[serde(default)]
    pub delay_ms: u64,
    #[serde(default)]
    pub action: FaultAction,
    /// How many calls it applies to before it clears itself; unset: until cleared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
}

impl Fault {
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms)
    }

    /// Parses the CLI form: comma-separated `delay:1200ms`, `status:500`, `hang`, `close`,
    /// `times:N`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut fault = Self::default();
        for item in spec
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
        {
            let (key, value) = item.split_once(':').unwrap_or((item, ""));
            match (key, value) {
                ("delay", value) => {
                    let delay = crate::config::parse_duration(value)?;
                    fault.delay_ms = u64::try_from(delay.as_millis())
                        .map_err(|_| format!("delay {value:?} is too long"))?;
                }
                ("status", value) => {
                    let status: u16 = value
                        .parse()
                        .ok()
                        .filter(|status| (100..=599).contains(status))
                        .ok_or_else(|| format!("status {value:?} must be 100..=599"))?;
                    fault.action = FaultAction::Status(status);
                }
                ("hang", "") => fault.action = FaultAction::Hang,
                ("close", "") => fault.action = FaultAction::Close,
                ("times", value) => {
                    fault.times = Some(
                        value
                            .parse()
                            .map_err(|_| format!("times {value:?} must be a count"))?,
                    );
                }
                _ => {
                    return Err(format!(
                        "unknown fault item {item:?}; use delay:DURATION, status:CODE, hang, close, times:N"
                    ));
                }
            }
        }
        Ok(fault)
    }
}

/// A fault bound to a route, as the admin API and `--fault ROUTE=SPEC` take it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteFault {
    /// A vLLM path such as `/pause`, or `*` for every route.
    pub route: String,
    #[serde(flatten)]
    pub fault: Fault,
}

impl std::str::FromStr for RouteFault {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (route, spec) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?} must be ROUTE=SPEC, e.g. /pause=delay:1200ms"))?;
        if route != ANY_ROUTE && !route.starts_with('/') {
            return Err(format!(
                "route {route:?} must be a path such as /pause, or *"
            ));
        }
        Ok(Self {
            route: route.to_owned(),
            fault: Fault::parse(spec)?,
        })
    }
}

/// The faults in force on one server.
#[derive(Debug, Default)]
pub struct FaultTable {
    faults: Mutex<BTreeMap<String, Fault>>,
}

impl FaultTable {
    pub fn set(&self, route: &str, fault: Fault) {
        self.lock().insert(route.to_owned(), fault);
    }

    pub fn clear(&self, route: Option<&str>) {
        let mut faults = self.lock();
        match route {
            Some(route) => {
                faults.remove(route);
            }
            None => faults.clear(),
        }
    }

    pub fn list(&self) -> Vec<RouteFault> {
        self.lock()
            .iter()
            .map(|(route, fault)| RouteFault {
                route: route.clone(),
                fault: fault.clone(),
            })
            .collect()
    }

    /// The fault for a call to `path`, counting it against `times`.
    pub fn take(&self, path: &str) -> Option<Fault> {
        let mut faults = self.lock();
        let route = if faults.contains_key(path) {
            path
        } else if faults.contains_key(ANY_ROUTE) {
            ANY_ROUTE
        } else {
            return None;
        };
        let fault = faults.get_mut(route)?;
        let taken = fault.clone();
        if let Some(times) = fault.times.as_mut() {
            *times = times.saturating_sub(1);
            if *times == 0 {
                faults.remove(route);
            }
        }
        Some(taken)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Fault>> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One call a server received, logged before any fault applies (so hung calls appear too).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Call {
    /// Order of arrival on this server, from 1.
    pub seq: u64,
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// Milliseconds since the server started.
    pub elapsed_ms: f64,
    /// Wall-clock time, milliseconds since the Unix epoch (to line up with Kubernetes events).
    pub unix_ms: u64,
}

impl Call {
    /// The value of query parameter `name`, if the call had it (first occurrence).
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query.as_deref()?.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (key == name).then_some(value)
        })
    }
}

/// The calls a server received, in order.
#[derive(Debug)]
pub struct CallLog {
    started: Instant,
    calls: Mutex<Vec<Call>>,
}

impl CallLog {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            calls: Mutex::new(Vec::new()),
        }
    }

    pub fn record(&self, method: &str, path: &str, query: Option<&str>) {
        // Wall-clock time lines calls up with Kubernetes events; this is a test double, not core.
        #[allow(clippy::disallowed_methods)]
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            });
        let mut calls = self.lock();
        let seq = calls.last().map_or(1, |call| call.seq + 1);
        calls.push(Call {
            seq,
            method: method.to_owned(),
            path: path.to_owned(),
            query: query.map(str::to_owned),
            elapsed_ms: self.started.elapsed().as_secs_f64() * 1e3,
            unix_ms,
        });
    }

    pub fn calls(&self) -> Vec<Call> {
        self.lock().clone()
    }

    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Call>> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_faults_parse_every_action() {
        let fault: RouteFault = "/pause=delay:1200ms,status:500,times:2".parse().unwrap();
        assert_eq!(fault.route, "/pause");
        assert_eq!(
            fault.fault,
            Fault {
                delay_ms: 1200,
                action: FaultAction::Status(500),
                times: Some(2)
            }
        );
        assert_eq!(
            "*=hang".parse::<RouteFault>().unwrap().fault.action,
            FaultAction::Hang
        );
        assert_eq!(
            "/metrics=close".parse::<RouteFault>().unwrap().fault.action,
            FaultAction::Close
        );
    }

    #[test]
    fn bad_cli_faults_name_the_problem() {
        assert!(
            "/pause"
                .parse::<RouteFault>()
                .unwrap_err()
                .contains("ROUTE=SPEC")
        );
        assert!(
            "pause=hang"
                .parse::<RouteFault>()
                .unwrap_err()
                .contains("path")
        );
        assert!(
            "/pause=status:700"
                .parse::<RouteFault>()
                .unwrap_err()
                .contains("100..=599")
        );
        assert!(
            "/pause=explode"
                .parse::<RouteFault>()
                .unwrap_err()
                .contains("unknown fault")
        );
    }

    #[test]
    fn counted_faults_clear_themselves_and_routes_beat_the_wildcard() {
        let table = FaultTable::default();
        table.set(
            ANY_ROUTE,
            Fault {
                action: FaultAction::Hang,
                ..Fault::default()
            },
        );
        table.set(
            "/pause",
            Fault {
                action: FaultAction::Status(500),
                times: Some(1),
                ..Fault::default()
            },
        );
        assert_eq!(
            table.take("/pause").unwrap().action,
            FaultAction::Status(500)
        );
        assert_eq!(table.take("/pause").unwrap().action, FaultAction::Hang);
        assert_eq!(table.take("/metrics").unwrap().action, FaultAction::Hang);
        table.clear(None);
        assert_eq!(table.take("/pause"), None);
    }

    #[test]
    fn calls_expose_their_query_parameters() {
        let log = CallLog::new();
        log.record("POST", "/pause", Some("mode=keep&clear_cache=false"));
        let call = &log.calls()[0];
        assert_eq!(call.seq, 1);
        assert_eq!(call.query_param("mode"), Some("keep"));
        assert_eq!(call.query_param("clear_cache"), Some("false"));
        assert_eq!(call.query_param("level"), None);
    }
}
