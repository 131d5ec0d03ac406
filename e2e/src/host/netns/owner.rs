//! Who owns which namespaces and subnets: the lock files a live topology holds, the
//! deletion of namespaces, and the cleanup of what dead test runs left behind.

use super::command::{IP, ns_pids, run};
use super::error::{NetnsError, Result};
use super::layout::{NETNS_DIR, NS_PREFIX, STATE_DIR, SUBNET_FIRST, SUBNET_LAST};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The names of all namespaces in `/var/run/netns`.
pub fn list_namespaces() -> Result<Vec<String>> {
    let dir = match std::fs::read_dir(NETNS_DIR) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(NetnsError::Io { op: format!("list {NETNS_DIR}"), source }),
    };
    let mut names: Vec<String> = dir.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).collect();
    names.sort();
    Ok(names)
}

/// SIGKILLs every process in `ns` (never this process), then deletes it.
/// A namespace that is already gone is not an error.
pub(super) fn destroy_ns(ns: &str) -> Result<()> {
    if !Path::new(NETNS_DIR).join(ns).exists() {
        return Ok(());
    }
    let me = std::process::id() as i32;
    match ns_pids(ns) {
        Ok(pids) => {
            for pid in pids.into_iter().filter(|p| *p != me) {
                tracing::debug!(ns, pid, "killing process left in namespace");
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        Err(e) => tracing::debug!(ns, error = %e, "cannot list processes in namespace"),
    }
    match run(IP, &["netns", "delete", ns]) {
        Ok(_) => Ok(()),
        Err(_) if !Path::new(NETNS_DIR).join(ns).exists() => Ok(()),
        Err(e) => Err(e),
    }
}

pub(super) fn owner_lock_path(owner: &str) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{owner}.lock"))
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// `Some(true)` if the owner lock file exists and nobody holds it.
fn owner_lock_free(owner: &str) -> Option<bool> {
    let f = File::options().read(true).write(true).open(owner_lock_path(owner)).ok()?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(_held) => Some(true), // released on drop
        Err(_) => Some(false),
    }
}

/// Parses `hve2e-<pid>-<ctr>-<role>` into (`hve2e-<pid>-<ctr>`, pid).
fn parse_owner(ns: &str) -> Option<(String, u32)> {
    let rest = ns.strip_prefix(NS_PREFIX)?;
    let mut parts = rest.splitn(3, '-');
    let pid: u32 = parts.next()?.parse().ok()?;
    let ctr: u32 = parts.next()?.parse().ok()?;
    Some((format!("{NS_PREFIX}{pid}-{ctr}"), pid))
}

/// Deletes namespaces left behind by dead topologies: names starting with
/// `hve2e-<pid>-` whose pid is dead, or whose owner lock is no longer held (pid
/// reused), with their temporary directories (`$TMPDIR/hve2e-<pid>-…`) and
/// lock files. Live topologies, also of this process, are left alone. Returns the
/// namespaces deleted. Called by every [`TopologyBuilder::build`](super::TopologyBuilder::build).
pub fn cleanup_stale() -> Result<Vec<String>> {
    let mut deleted = Vec::new();
    let mut owners_done = Vec::new();
    for ns in list_namespaces()? {
        let Some((owner, pid)) = parse_owner(&ns) else { continue };
        let stale = !pid_alive(pid) || owner_lock_free(&owner) == Some(true);
        if !stale {
            continue;
        }
        tracing::info!(ns, owner, "deleting stale namespace of a dead test run");
        match destroy_ns(&ns) {
            Ok(()) => deleted.push(ns),
            Err(e) => tracing::warn!(ns, error = %e, "failed to delete stale namespace"),
        }
        if !owners_done.contains(&owner) {
            owners_done.push(owner);
        }
    }
    // Temporary directories (logs, keepalived configurations) and owner lock
    // files of dead owners; a lock file only once none of its namespaces is left.
    let owners_with_ns: Vec<String> =
        list_namespaces()?.iter().filter_map(|ns| parse_owner(ns)).map(|(owner, _)| owner).collect();
    let mut stale_locks = Vec::new();
    for dir in [std::env::temp_dir(), PathBuf::from(STATE_DIR)] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.filter_map(|e| e.ok()) {
            let Ok(name) = entry.file_name().into_string() else { continue };
            let Some((owner, pid)) = parse_owner(name.trim_end_matches(".lock")) else { continue };
            if !(owners_done.contains(&owner) || !pid_alive(pid) || owner_lock_free(&owner) == Some(true)) {
                continue;
            }
            let path = entry.path();
            if name.ends_with(".lock") {
                if !owners_with_ns.contains(&owner) {
                    stale_locks.push(path);
                }
                continue;
            }
            match std::fs::remove_dir_all(&path) {
                Ok(()) => tracing::debug!(path = %path.display(), "removed stale directory of a dead test run"),
                Err(e) => tracing::debug!(path = %path.display(), error = %e, "cannot remove stale directory"),
            }
        }
    }
    for lock in stale_locks {
        let _ = std::fs::remove_file(lock);
    }
    Ok(deleted)
}

pub(super) fn lock_file(path: &Path) -> Result<Option<Flock<File>>> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|source| NetnsError::Io { op: format!("open {}", path.display()), source })?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(NetnsError::Io { op: format!("lock {}", path.display()), source: e.into() }),
    }
}

pub(super) fn allocate_subnet(seed: u32) -> Result<(u8, Flock<File>)> {
    let span = u32::from(SUBNET_LAST - SUBNET_FIRST) + 1;
    for off in 0..span {
        let k = SUBNET_FIRST + ((seed.wrapping_add(off)) % span) as u8;
        let path = Path::new(STATE_DIR).join(format!("subnet-{k}.lock"));
        if let Some(lock) = lock_file(&path)? {
            return Ok((k, lock));
        }
    }
    Err(NetnsError::NoSubnet)
}
