//! Code inside a namespace: a closure on a thread that joined it ([`run_in_netns`],
//! [`in_netns`]), or a program under `ip netns exec` ([`spawn_in`]).

use super::command::IP;
use super::error::{NetnsError, Result};
use super::layout::NETNS_DIR;
use crate::host::process::ManagedProcess;
use nix::sched::{CloneFlags, setns};
use std::fs::File;
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// A thread running inside a network namespace (see [`run_in_netns`]).
#[derive(Debug)]
pub struct NetnsThread<T> {
    ns: String,
    handle: JoinHandle<Option<T>>,
}

impl<T> NetnsThread<T> {
    /// Waits for the closure's result.
    pub fn join(self) -> Result<T> {
        match self.handle.join() {
            Ok(Some(v)) => Ok(v),
            _ => Err(NetnsError::Panicked { ns: self.ns }),
        }
    }

    /// Whether the closure has returned.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The namespace it runs in.
    pub fn ns(&self) -> &str {
        &self.ns
    }
}

/// Runs `f` on a new OS thread that first joins network namespace `ns`
/// (`setns(/var/run/netns/<ns>, CLONE_NEWNET)`): sockets it creates live in that
/// namespace. Only that thread moves; the rest of the process stays where it is.
///
/// Returns once the thread is inside the namespace (an error if it could not get
/// there). Threads that `f` spawns start in the namespace too, but a tokio runtime
/// created elsewhere does *not* run in it: async code must build its own runtime
/// (e.g. `tokio::runtime::Builder::new_current_thread().enable_all().build()`)
/// inside `f`. Processes started from such a thread with `std::process::Command`
/// inherit the namespace, but beware `--pdeathsig` (see [`crate::host::process`]): they
/// die when that thread ends; prefer [`spawn_in`].
pub fn run_in_netns<T, F>(ns: &str, f: F) -> Result<NetnsThread<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let path = Path::new(NETNS_DIR).join(ns);
    let (tx, rx) = mpsc::sync_channel::<Result<()>>(1);
    let ns_owned = ns.to_owned();
    let handle = std::thread::Builder::new()
        .name(format!("netns {ns}"))
        .spawn(move || {
            let entered = File::open(&path)
                .map_err(|source| NetnsError::Io { op: format!("open {}", path.display()), source })
                .and_then(|f| {
                    setns(&f, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Setns { ns: ns_owned, source })
                });
            let ok = entered.is_ok();
            let _ = tx.send(entered);
            if ok { Some(f()) } else { None }
        })
        .map_err(|source| NetnsError::Io { op: format!("spawn a thread for namespace {ns}"), source })?;
    match rx.recv() {
        Ok(Ok(())) => Ok(NetnsThread { ns: ns.to_owned(), handle }),
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e)
        }
        Err(_) => {
            let _ = handle.join();
            Err(NetnsError::Panicked { ns: ns.to_owned() })
        }
    }
}

/// Runs `f` inside `ns` and waits for its result.
pub fn in_netns<T, F>(ns: &str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    run_in_netns(ns, f)?.join()
}

/// Starts `program args…` inside network namespace `ns` (`ip netns exec`), with
/// output appended to `log`, under [`ManagedProcess`] (stopped on drop, killed if
/// the starting thread dies). `ip netns exec` also gives the process a private
/// mount namespace with that namespace's `/sys`.
pub fn spawn_in(
    ns: &str,
    name: &str,
    program: &Path,
    args: &[String],
    envs: &[(String, String)],
    log: &Path,
) -> Result<ManagedProcess> {
    let mut all = vec!["netns".to_owned(), "exec".to_owned(), ns.to_owned(), program.display().to_string()];
    all.extend(args.iter().cloned());
    Ok(ManagedProcess::spawn(name, Path::new(IP), &all, envs, log)?)
}
