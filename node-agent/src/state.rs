//! The agent's persisted state (epoch, maintenance, last role, pauses), one JSON file
//! per pair in the state directory (a hostPath in Kubernetes), written atomically
//! (temporary file, fsync, rename, fsync of the directory) so that a crash or power
//! loss leaves either the old or the new version — never a torn one, and never an
//! epoch that went backwards.

use crate::sm;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Errors of the state file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file could not be written.
    #[error("failed to write state file {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Another agent runs this pair on this node.
    #[error("another havip agent runs this pair on this node (lock {path} is held): {source}")]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file holds an epoch outside the epoch's domain (`0..=`[`sm::MAX_EPOCH`]): it was
    /// not written by havip (or was corrupted), and starting from it could reuse an epoch.
    #[error(
        "failed to read state file {path}: its epoch {epoch} is outside 0..={max} (the pair epoch is \
         the Lease's 32-bit leaseTransitions); remove the file to start this member afresh (it \
         learns the pair's epoch from its peers)",
        max = sm::MAX_EPOCH
    )]
    EpochOutOfRange {
        /// The file.
        path: PathBuf,
        /// The epoch it holds.
        epoch: u64,
    },
    /// The file exists but could not be read or parsed.
    #[error("failed to read state file {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct OnDisk {
    version: u32,
    epoch: u64,
    maintenance: bool,
    last_role: String,
    failback_paused: bool,
    paused: bool,
    suspended: bool,
}

/// The state file of one pair.
#[derive(Clone, Debug)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// The state file of `pair` in `dir`.
    pub fn new(dir: &Path, pair: &str) -> Self {
        Self { path: dir.join(format!("{pair}.state.json")) }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pair's lock file (see [`StateFile::lock`]).
    pub fn lock_path(&self) -> PathBuf {
        self.path.with_extension("lock")
    }

    /// Removes the lock file of a pair that is gone from this node, holding the lock
    /// meanwhile: a file another agent holds (it runs the pair right now) stays, and
    /// nobody can lock the file in the moment between the check and the removal.
    pub fn remove_lock_file(&self) -> Result<(), StateError> {
        let path = self.lock_path();
        if !path.exists() {
            return Ok(());
        }
        let _held = self.lock()?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StateError::Write { path, source }),
        }
    }

    /// Takes an exclusive lock on the pair's lock file next to the state file, so that
    /// two agents never run the same pair on one node (with a heartbeat port of its own
    /// each, their binds would not catch it). The lock lives as long as the returned value.
    pub fn lock(&self) -> Result<nix::fcntl::Flock<std::fs::File>, StateError> {
        let path = self.lock_path();
        let err = |source| StateError::Write { path: path.clone(), source };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(err)?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| StateError::Locked { path: path.clone(), source: std::io::Error::from(e) })
    }

    /// Loads the persisted state; a missing file is a fresh member (defaults).
    pub fn load(&self) -> Result<sm::Persisted, StateError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(sm::Persisted::default()),
            Err(e) => return Err(StateError::Read { path: self.path.clone(), message: e.to_string() }),
        };
        let d: OnDisk = serde_json::from_str(&text)
            .map_err(|e| StateError::Read { path: self.path.clone(), message: e.to_string() })?;
        self.persisted(d)
    }

    /// What a parsed file says, refused when its epoch is outside the domain.
    fn persisted(&self, d: OnDisk) -> Result<sm::Persisted, StateError> {
        if d.epoch > sm::MAX_EPOCH {
            return Err(StateError::EpochOutOfRange { path: self.path.clone(), epoch: d.epoch });
        }
        let last_role = sm::Role::ALL.into_iter().find(|r| r.as_str() == d.last_role).unwrap_or(sm::Role::Standby);
        Ok(sm::Persisted {
            epoch: d.epoch,
            maintenance: d.maintenance,
            last_role,
            failback_paused: d.failback_paused,
            paused: d.paused,
            suspended: d.suspended,
        })
    }

    /// Loads the persisted state like [`StateFile::load`], except that a file that is not
    /// a state file at all — not UTF-8, or not the JSON of one (a crash of the filesystem,
    /// an edit by hand) — is moved aside to `<file>.corrupt` and the member starts afresh,
    /// as with no file: it learns the pair's epoch from its peers and the Lease, the same
    /// as when the file is deleted. Returns where the bad file went. A file that parses
    /// but holds an epoch outside the domain is still refused
    /// ([`StateError::EpochOutOfRange`]): it may be a newer version's.
    pub fn load_or_set_aside(&self) -> Result<(sm::Persisted, Option<PathBuf>), StateError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((sm::Persisted::default(), None)),
            Err(e) => return Err(StateError::Read { path: self.path.clone(), message: e.to_string() }),
        };
        if let Some(d) = std::str::from_utf8(&bytes).ok().and_then(|t| serde_json::from_str::<OnDisk>(t).ok()) {
            return self.persisted(d).map(|p| (p, None));
        }
        let aside = self.path.with_extension("json.corrupt");
        std::fs::rename(&self.path, &aside).map_err(|source| StateError::Write { path: aside.clone(), source })?;
        Ok((sm::Persisted::default(), Some(aside)))
    }

    /// Writes `p` durably. The epoch never goes backwards: a lower epoch than the one
    /// on disk is raised to it.
    pub fn store(&self, p: &sm::Persisted) -> Result<(), StateError> {
        let err = |source| StateError::Write { path: self.path.clone(), source };
        let on_disk_epoch = self.load().map(|o| o.epoch).unwrap_or(0);
        let d = OnDisk {
            version: 1,
            epoch: p.epoch.max(on_disk_epoch),
            maintenance: p.maintenance,
            last_role: p.last_role.as_str().to_owned(),
            failback_paused: p.failback_paused,
            paused: p.paused,
            suspended: p.suspended,
        };
        let json = serde_json::to_vec_pretty(&d).map_err(|e| err(std::io::Error::other(e)))?;
        write_atomic(&self.path, &json).map_err(err)
    }
}

/// Writes `bytes` to `path` durably: a temporary file next to it (mode 0600: snapshots
/// carry the pair's key), fsync, rename, fsync of the directory — a crash leaves the old or
/// the new content, never a torn file. The one atomic write of the agent's files (state
/// file, VIP ledger, fence-target memory, pair snapshots).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = temporary_of(path);
    {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The temporary file [`write_atomic`] writes `path` through: `<path>.tmp`. An agent killed
/// between the write and the rename leaves it; the next write replaces it, and a gone
/// pair's cleanup removes it with the file (the eighth 60-minute chaos run found one left).
pub(crate) fn temporary_of(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    PathBuf::from(tmp)
}

/// Removes `path` and its [`temporary_of`] file; missing ones are success.
pub(crate) fn remove_with_temporary(path: &Path) -> std::io::Result<()> {
    for p in [path.to_owned(), temporary_of(path)] {
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::StateFile;

    #[test]
    fn a_file_goes_with_the_temporary_a_killed_write_left() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("web.state.json");
        super::write_atomic(&path, b"{}").expect("write");
        assert!(!super::temporary_of(&path).exists(), "a write that completes leaves no temporary");
        std::fs::write(super::temporary_of(&path), b"{").expect("a write killed before its rename");
        assert_eq!(super::temporary_of(&path), dir.path().join("web.state.json.tmp"));
        super::remove_with_temporary(&path).expect("remove");
        assert!(!path.exists() && !super::temporary_of(&path).exists());
        super::remove_with_temporary(&path).expect("missing is success");
    }
    use crate::sm;

    #[test]
    fn roundtrip_and_epoch_never_goes_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = StateFile::new(dir.path(), "web");
        assert_eq!(f.load().expect("missing is default"), sm::Persisted::default());
        let p = sm::Persisted {
            epoch: 7,
            maintenance: true,
            last_role: sm::Role::Active,
            failback_paused: true,
            paused: false,
            suspended: true,
        };
        f.store(&p).expect("store");
        assert_eq!(f.load().expect("load"), p);
        f.store(&sm::Persisted { epoch: 3, ..p.clone() }).expect("store");
        assert_eq!(f.load().expect("load").epoch, 7, "a lower epoch never overwrites a higher one");
    }

    #[test]
    fn only_one_agent_per_pair_and_node() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = StateFile::new(dir.path(), "web");
        let first = f.lock().expect("first lock");
        let e = f.lock().expect_err("second agent refused");
        assert!(e.to_string().contains("another havip agent runs this pair"), "{e}");
        drop(first);
        f.lock().expect("free again after the first agent is gone");
        StateFile::new(dir.path(), "db").lock().expect("another pair is independent");
    }

    #[test]
    fn a_corrupted_state_file_is_set_aside_and_the_member_starts_afresh() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = StateFile::new(dir.path(), "web");
        assert_eq!(f.load_or_set_aside().expect("no file"), (sm::Persisted::default(), None));
        let p = sm::Persisted { epoch: 7, ..Default::default() };
        f.store(&p).expect("store");
        assert_eq!(f.load_or_set_aside().expect("a good file").0.epoch, 7);
        for garbage in [&b"{\"epoch\": garbage\x00\xff"[..], b"", b"[1, 2]", b"{\"version\": 1}"] {
            std::fs::write(f.path(), garbage).expect("write");
            assert!(f.load().is_err(), "load refuses {garbage:?}");
            let (loaded, aside) = f.load_or_set_aside().expect("set aside");
            assert_eq!(loaded, sm::Persisted::default());
            let aside = aside.expect("moved aside");
            assert_eq!(std::fs::read(&aside).expect("kept for a post-mortem"), garbage);
            assert!(!f.path().exists());
        }
        // An epoch beyond the domain parses: refused, not set aside.
        let beyond = format!(
            r#"{{"version":1,"epoch":{},"maintenance":false,"lastRole":"Active","failbackPaused":false,"paused":false,"suspended":false}}"#,
            sm::MAX_EPOCH + 1
        );
        std::fs::write(f.path(), beyond).expect("write");
        assert!(matches!(f.load_or_set_aside(), Err(super::StateError::EpochOutOfRange { .. })));
        assert!(f.path().exists());
    }

    #[test]
    fn a_gone_pairs_lock_file_is_removed_unless_an_agent_holds_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = StateFile::new(dir.path(), "web");
        f.remove_lock_file().expect("no lock file: nothing to do");
        let held = f.lock().expect("lock");
        assert!(f.remove_lock_file().is_err(), "held by a running agent: refused");
        assert!(f.lock_path().exists(), "and left in place");
        drop(held);
        f.remove_lock_file().expect("free: removed");
        assert!(!f.lock_path().exists());
    }

    #[test]
    fn epoch_outside_the_domain_is_refused_naming_file_and_value() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = StateFile::new(dir.path(), "web");
        let json = |epoch: u64| {
            format!(
                r#"{{"version":1,"epoch":{epoch},"maintenance":false,"lastRole":"Active","failbackPaused":false,"paused":false,"suspended":false}}"#
            )
        };
        for bad in [u64::MAX, sm::MAX_EPOCH + 1] {
            std::fs::write(f.path(), json(bad)).expect("write");
            let e = f.load().expect_err("an epoch outside the domain is refused");
            let text = e.to_string();
            assert!(text.contains(&f.path().display().to_string()), "{text}");
            assert!(text.contains(&bad.to_string()), "{text}");
            assert!(text.contains("outside 0..=2147483647"), "{text}");
        }
        std::fs::write(f.path(), json(sm::MAX_EPOCH)).expect("write");
        assert_eq!(f.load().expect("the top of the domain is valid").epoch, sm::MAX_EPOCH);
    }

    #[test]
    fn corrupt_file_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = StateFile::new(dir.path(), "web");
        std::fs::write(f.path(), "{not json").expect("write");
        let e = f.load().expect_err("corrupt");
        assert!(e.to_string().contains("failed to read state file"), "{e}");
    }
}
