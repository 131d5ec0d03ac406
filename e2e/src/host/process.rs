//! Child processes that are always cleaned up.
//!
//! Every process is started under `setpriv --pdeathsig SIGKILL` when `setpriv`
//! exists (util-linux, on every Debian system), so that it dies with the thread
//! that started it even when the harness itself is killed; `Drop` stops it
//! (SIGTERM, then SIGKILL after a grace period) when a test ends or panics.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Errors of process management.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The program could not be started.
    #[error("failed to start {name} ({program}): {source}")]
    Spawn {
        /// Short name.
        name: String,
        /// The program path.
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The log file could not be created.
    #[error("failed to create log file {path}: {source}")]
    Log {
        /// Path of the log.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A child process with its output in a log file; stopped on drop.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

fn setpriv() -> Option<&'static str> {
    ["/usr/bin/setpriv", "/bin/setpriv"].into_iter().find(|p| Path::new(p).exists())
}

impl ManagedProcess {
    /// Starts `program args…` with stdout and stderr appended to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(String, String)],
        log: &Path,
    ) -> Result<Self, ProcessError> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| ProcessError::Log { path: log.to_owned(), source })?;
        let err = out.try_clone().map_err(|source| ProcessError::Log { path: log.to_owned(), source })?;
        let mut cmd = match setpriv() {
            Some(sp) => {
                let mut c = Command::new(sp);
                c.arg("--pdeathsig").arg("KILL").arg("--").arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args)
            .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd.spawn().map_err(|source| ProcessError::Spawn {
            name: name.to_owned(),
            program: program.display().to_string(),
            source,
        })?;
        tracing::debug!(name, pid = child.id(), log = %log.display(), "started process");
        Ok(Self { name: name.to_owned(), child: Some(child), log: log.to_owned() })
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the log, for failure reports.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends `signal` to the process (e.g. SIGSTOP / SIGCONT in tests).
    pub fn signal(&self, signal: Signal) -> nix::Result<()> {
        match self.pid() {
            Some(pid) => kill(Pid::from_raw(pid as i32), signal),
            None => Ok(()),
        }
    }

    /// Stops the process: SIGTERM, then SIGKILL after `grace`. Idempotent.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = Pid::from_raw(child.id() as i32);
        // A SIGCONT first, in case a test left it stopped.
        let _ = kill(pid, Signal::SIGCONT);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
        tracing::debug!(name = %self.name, "stopped process");
    }

    /// Kills the process at once with SIGKILL and reaps it.
    pub fn kill_now(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// The last `lines` lines of a file (empty when it cannot be read).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A TCP port that was free a moment ago on `ip`.
pub fn free_port(ip: std::net::IpAddr) -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind((ip, 0))?;
    Ok(l.local_addr()?.port())
}
