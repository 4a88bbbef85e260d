//! Child processes with their output in a log file: the control-plane components and anything
//! a test starts against the cluster (the operator).
//!
//! A process is killed when its handle is dropped, so a failing test leaves nothing running;
//! if the test is failing, the last lines of the log are printed first, which is where the
//! reason usually is.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::error::{Error, Result};

/// How many log lines a failure prints per process.
pub const TAIL_LINES: usize = 30;

/// A running child process whose stdout and stderr go to a log file.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Child,
    log: PathBuf,
    kill_on_drop: bool,
}

impl ManagedProcess {
    /// Starts `command` with stdout and stderr appended to `log` and stdin from `stdin`.
    pub(crate) fn spawn(
        name: &str,
        mut command: Command,
        log: &Path,
        stdin: Stdio,
    ) -> Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(Error::io(format!("opening {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(Error::io(format!("opening {}", log.display())))?;
        let child = command
            .stdin(stdin)
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(Error::io(format!(
                "starting {name} ({})",
                command.get_program().to_string_lossy()
            )))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
            kill_on_drop: true,
        })
    }

    /// The name the process was started under (also its log file's stem).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The operating-system process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The file holding the process's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything the process has written so far.
    pub fn log(&self) -> String {
        std::fs::read(&self.log)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// The exit status if the process has exited, without waiting.
    pub fn exit_status(&mut self) -> Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .map_err(Error::io(format!("checking on {}", self.name)))
    }

    /// An error if the process has exited: used to fail fast instead of waiting for a deadline.
    pub fn ensure_running(&mut self) -> Result<()> {
        match self.exit_status()? {
            None => Ok(()),
            Some(status) => Err(Error::ComponentExited {
                component: self.name.clone(),
                status: status.to_string(),
                log: self.log.clone(),
                tail: self.log_tail(TAIL_LINES),
            }),
        }
    }

    /// Waits for the process to exit on its own (for one-shot commands), up to `timeout`.
    pub async fn wait(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status()? {
                return Ok(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("{} to exit", self.name),
                    timeout,
                    last: self.log_tail(5),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the process (SIGKILL) and reaps it. The control plane is disposable, so there is
    /// nothing a graceful shutdown would save; tests of graceful shutdown use [`Self::terminate`].
    pub fn kill(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // An error means it exited in the meantime; either way it is gone after wait().
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and returns at once: the process shuts down while the test goes on.
    pub fn stop(&self) -> Result<()> {
        self.signal_live(nix::sys::signal::Signal::SIGTERM, "stopping")
    }

    /// Sends SIGTERM and waits up to `grace` for the process to exit, then kills it. Returns
    /// the exit status, so a test can check that the process shut down cleanly.
    pub async fn terminate(&mut self, grace: Duration) -> Result<ExitStatus> {
        if self.exit_status()?.is_none() {
            send_signal(self.pid(), nix::sys::signal::Signal::SIGTERM);
        }
        if let Ok(status) = self.wait(grace).await {
            return Ok(status);
        }
        self.kill();
        self.child
            .wait()
            .map_err(Error::io(format!("reaping {}", self.name)))
    }

    /// Stops the process (SIGSTOP) where it is, as a long GC pause or a frozen VM would: it
    /// keeps its sockets and its state, but neither reads nor writes until [`Self::resume`].
    /// Returns once the kernel has stopped it.
    pub fn pause(&self) -> Result<()> {
        self.signal_live(nix::sys::signal::Signal::SIGSTOP, "pausing")?;
        self.await_state(true, "pausing")
    }

    /// Lets a paused process run on (SIGCONT); returns once it is no longer stopped.
    pub fn resume(&self) -> Result<()> {
        self.signal_live(nix::sys::signal::Signal::SIGCONT, "resuming")?;
        self.await_state(false, "resuming")
    }

    /// Whether the process is stopped by a signal (state `T` in `/proc/<pid>/stat`).
    pub fn is_paused(&self) -> bool {
        process_state(self.pid()) == Some('T')
    }

    /// Signals are delivered asynchronously: waits (briefly, polling) until the process is
    /// stopped or not, as asked.
    fn await_state(&self, paused: bool, what: &str) -> Result<()> {
        const PATIENCE: Duration = Duration::from_secs(5);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while self.is_paused() != paused {
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("{what} {} (pid {})", self.name, self.pid()),
                    timeout: PATIENCE,
                    last: format!("state {:?}", process_state(self.pid())),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Sends `signal`, failing if the process has exited (a zombie would accept it silently).
    fn signal_live(&self, signal: nix::sys::signal::Signal, what: &str) -> Result<()> {
        let exited = || Error::ComponentExited {
            component: self.name.clone(),
            status: format!("gone before {what} it"),
            log: self.log.clone(),
            tail: self.log_tail(TAIL_LINES),
        };
        if matches!(process_state(self.pid()), None | Some('Z' | 'X')) {
            return Err(exited());
        }
        let pid = i32::try_from(self.pid()).map_err(|_| exited())?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).map_err(|errno| {
            Error::io(format!("{what} {} (pid {pid})", self.name))(std::io::Error::from(errno))
        })
    }

    /// Leaves the process running when the handle is dropped (detached clusters).
    pub(crate) fn detach(mut self) {
        self.kill_on_drop = false;
    }

    fn print_tail_if_panicking(&self) {
        if std::thread::panicking() {
            eprintln!(
                "---- last lines of {} ({}) ----\n{}",
                self.name,
                self.log.display(),
                self.log_tail(TAIL_LINES)
            );
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        if self.kill_on_drop {
            self.kill();
            self.print_tail_if_panicking();
        }
    }
}

/// Sends `signal` to `pid`; a process that is already gone is not an error.
pub(crate) fn send_signal(pid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// The state letter of a process (`R`, `S`, `T` stopped, `Z` zombie, …), `None` if it is gone.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) S …`: the command may hold spaces and parentheses, the state follows the last `)`.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The last `lines` lines of a file, reading at most its last 64 KiB.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    const WINDOW: u64 = 64 * 1024;
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(WINDOW)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paused_process_is_stopped_until_resumed_and_an_exited_one_cannot_be_paused() {
        let log =
            std::env::temp_dir().join(format!("gpuqueue-e2e-pause-{}.log", std::process::id()));
        let mut command = Command::new("sleep");
        command.arg("30");
        let mut sleeper = ManagedProcess::spawn("sleeper", command, &log, Stdio::null()).unwrap();
        sleeper.pause().unwrap();
        assert!(sleeper.is_paused());
        sleeper.resume().unwrap();
        assert!(!sleeper.is_paused());
        sleeper.kill();
        assert!(
            sleeper.pause().is_err(),
            "pausing a reaped process is an error"
        );
        let _ = std::fs::remove_file(log);
    }
}
