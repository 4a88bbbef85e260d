//! Slots keep concurrent control planes apart, across tests and across processes.
//!
//! A slot is a small directory under the system temp dir with a lock file. Slot `i` owns the
//! pod IP range `127.100.16i.0/20` and node addresses `127.99.16i.0/20`, so two clusters
//! never hand the same pod IP to servers that tests bind on the host. The slot's lock is held
//! by the harness *and* by every component (it is their stdin), so a slot stays taken exactly
//! as long as any process of its cluster lives, even if the test process was killed.
//! A second lock, `owner.lock`, is held only by the process that started the cluster: if it is
//! free while the slot is still taken, the cluster is orphaned, and the next claim reaps it.
//!
//! A claim takes the free slot claimed longest ago, not the first free one: the servers a test
//! binds on its pods' IPs live in the test process (a fake vLLM until its last handle is
//! dropped) and can outlive its cluster by the seconds its teardown takes, and a slot handed
//! out again at once gave the next test's pods the same IPs (a fake vLLM's bind then failed
//! with "address in use").

use std::collections::HashSet;
use std::fs::{File, TryLockError};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::process::send_signal;

/// How many control planes may run at once on one machine.
pub const SLOTS: u32 = 16;

/// A claimed slot; released when this and every component holding its lock are gone.
#[derive(Debug)]
pub(crate) struct Slot {
    index: u32,
    dir: PathBuf,
    lock: File,
    // Held for as long as this process owns the cluster; never read.
    _owner: File,
}

impl Slot {
    /// Claims the free slot claimed longest ago (never claimed first), reaping orphaned
    /// clusters found on the way.
    pub(crate) fn claim() -> Result<Self> {
        let root = std::env::temp_dir().join("gpuqueue-e2e");
        for index in least_recently_claimed(&root) {
            let dir = root.join(format!("slot-{index}"));
            std::fs::create_dir_all(&dir)
                .map_err(Error::io(format!("creating {}", dir.display())))?;
            let lock = open_lock(&dir.join("slot.lock"))?;
            match lock.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    reap_if_orphaned(&dir);
                    continue;
                }
                Err(TryLockError::Error(e)) => {
                    return Err(Error::io(format!("locking {}", dir.display()))(e));
                }
            }
            let owner = open_lock(&dir.join("owner.lock"))?;
            if owner.try_lock().is_err() {
                // Its owner is alive but all its components died; that test still owns it.
                continue;
            }
            // Whatever is left here belongs to a cluster whose processes are all gone.
            let _ = std::fs::remove_file(dir.join(STATE_FILE));
            let _ = std::fs::remove_dir_all(dir.join("run"));
            std::fs::write(dir.join(CLAIMED_FILE), b"")
                .map_err(Error::io(format!("marking {} claimed", dir.display())))?;
            return Ok(Self {
                index,
                dir,
                lock,
                _owner: owner,
            });
        }
        Err(Error::NoFreeSlot(SLOTS as usize))
    }

    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// The slot's own directory (its state file, and the default run directory `run/`).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// A stdin for a component: a handle on the slot lock, so the component holds the slot.
    pub(crate) fn component_stdin(&self) -> Result<Stdio> {
        self.lock
            .try_clone()
            .map(Stdio::from)
            .map_err(Error::io("sharing the slot lock"))
    }

    /// The pod IP range KWOK assigns from.
    pub(crate) fn pod_cidr(&self) -> String {
        format!("{}/20", Ipv4Addr::from(POD_BASE + self.index * 4096))
    }

    /// The address of the `n`th node (from 0).
    pub(crate) fn node_ip(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(NODE_BASE + self.index * 4096 + 1 + n)
    }

    pub(crate) fn write_state(&self, state: &State) -> Result<()> {
        state.write(&self.dir.join(STATE_FILE))
    }
}

/// Whether a live cluster, of any process, writes its logs to `log_dir` (its slot is taken and
/// its state names that folder).
pub(crate) fn log_dir_in_use(log_dir: &Path) -> bool {
    let root = std::env::temp_dir().join("gpuqueue-e2e");
    (0..SLOTS).any(|index| {
        let dir = root.join(format!("slot-{index}"));
        let taken = matches!(
            open_lock(&dir.join("slot.lock")).map(|lock| lock.try_lock()),
            Ok(Err(TryLockError::WouldBlock))
        );
        taken && State::read(&dir.join(STATE_FILE)).is_ok_and(|state| state.log_dir == log_dir)
    })
}

/// 127.100.0.0: pods' addresses, on loopback so a test can bind a server to a pod's IP.
const POD_BASE: u32 = u32::from_be_bytes([127, 100, 0, 0]);
/// 127.99.0.0: nodes' `InternalIP`s (and `hostNetwork` pods').
const NODE_BASE: u32 = u32::from_be_bytes([127, 99, 0, 0]);

pub(crate) const STATE_FILE: &str = "state.json";
/// Written on every claim: its modification time orders the slots for the next claims.
const CLAIMED_FILE: &str = "claimed";

/// The slot indices, least recently claimed first (never claimed first of all, then by index).
fn least_recently_claimed(root: &Path) -> Vec<u32> {
    let claimed_at = |index: u32| {
        std::fs::metadata(root.join(format!("slot-{index}")).join(CLAIMED_FILE))
            .and_then(|m| m.modified())
            .ok()
    };
    let mut order: Vec<(Option<std::time::SystemTime>, u32)> =
        (0..SLOTS).map(|index| (claimed_at(index), index)).collect();
    order.sort();
    order.into_iter().map(|(_, index)| index).collect()
}

fn open_lock(path: &Path) -> Result<File> {
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(Error::io(format!("opening {}", path.display())))
}

/// What is running for one cluster: enough to stop it from another process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct State {
    /// Started by `gpuqueue-e2e-cluster up`: outlives its starter, stopped by `down`.
    pub detached: bool,
    pub slot: u32,
    pub api_server: String,
    pub kubeconfig: PathBuf,
    pub run_dir: PathBuf,
    pub log_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub processes: Vec<ProcessRecord>,
}

/// One process of a cluster; its full command line tells it apart from a reused pid.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ProcessRecord {
    pub name: String,
    pub pid: u32,
    pub argv: Vec<String>,
}

impl State {
    pub(crate) fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::State {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        serde_json::from_str(&text).map_err(|e| Error::State {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    }

    pub(crate) fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::State {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(Error::io(format!("writing {}", path.display())))
    }

    /// Kills, newest first, every recorded process that is still the one we started; returns
    /// how many there were.
    pub(crate) fn kill_all(&self) -> usize {
        let alive: Vec<&ProcessRecord> = self
            .processes
            .iter()
            .rev()
            .filter(|p| p.is_alive())
            .collect();
        for process in &alive {
            send_signal(process.pid, nix::sys::signal::Signal::SIGKILL);
        }
        alive.len()
    }
}

impl ProcessRecord {
    /// Whether the pid still runs the command line we started (pids are reused).
    pub(crate) fn is_alive(&self) -> bool {
        let Ok(raw) = std::fs::read(format!("/proc/{}/cmdline", self.pid)) else {
            return false;
        };
        let argv: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|part| !part.is_empty())
            .map(|part| String::from_utf8_lossy(part).into_owned())
            .collect();
        argv == self.argv
    }
}

/// Kills the processes of a cluster whose owner died without stopping it.
fn reap_if_orphaned(dir: &Path) {
    let Ok(state) = State::read(&dir.join(STATE_FILE)) else {
        return; // starting up, or not ours to judge
    };
    if state.detached {
        return; // `gpuqueue-e2e-cluster down` stops it
    }
    let Ok(owner) = open_lock(&dir.join("owner.lock")) else {
        return;
    };
    if owner.try_lock().is_ok() {
        let killed = state.kill_all();
        if killed > 0 {
            eprintln!(
                "gpuqueue-e2e: stopped {killed} processes of the orphaned cluster in {} (its test process is gone)",
                dir.display()
            );
        }
    }
}

/// Loopback ports that are free now. Ports handed out earlier in this process are never
/// handed out again, so concurrent start-ups in one test binary cannot collide; another
/// process can still take one before the component binds it, which start-up retries.
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    let mut found = 0;
    while found < N {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(Error::io("finding a free loopback port"))?;
        let port = listener
            .local_addr()
            .map_err(Error::io("finding a free loopback port"))?
            .port();
        if handed_out.insert(port) {
            ports[found] = port;
            found += 1;
        }
        // Keep every listener open until all are chosen, so the kernel hands out distinct ports.
        listeners.push(listener);
    }
    Ok(ports)
}

/// One loopback port that is free now and was never handed out before in this process: a test
/// that asks for two (an operator's webhook and metrics) never gets the same one twice.
pub fn free_port() -> Result<u16> {
    let [port] = free_ports()?;
    Ok(port)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly
    use super::*;

    /// The kernel reuses a port once its listener closes (the operator's metrics and webhook
    /// once got the same one); a thousand asked one at a time would repeat many times over.
    #[test]
    fn a_port_is_never_handed_out_twice() {
        let mut seen = HashSet::new();
        for _ in 0..1_000 {
            let port = free_port().unwrap();
            assert!(seen.insert(port), "port {port} handed out twice");
        }
    }

    #[test]
    fn a_slot_just_released_is_claimed_last() {
        let root = std::env::temp_dir().join(format!("gpuqueue-slot-order-{}", std::process::id()));
        let claim = |index: u32, at_second: u64| {
            let dir = root.join(format!("slot-{index}"));
            std::fs::create_dir_all(&dir).unwrap();
            let file = File::create(dir.join(CLAIMED_FILE)).unwrap();
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(at_second);
            file.set_modified(at).unwrap();
        };
        // Slot 0 was claimed a minute after slot 1, the others never.
        claim(0, 1_000_060);
        claim(1, 1_000_000);
        let order = least_recently_claimed(&root);
        std::fs::remove_dir_all(&root).unwrap();
        let never: Vec<u32> = (2..SLOTS).collect();
        assert_eq!(order[..never.len()], never[..]);
        assert_eq!(order[never.len()..], [1, 0]);
    }
}
