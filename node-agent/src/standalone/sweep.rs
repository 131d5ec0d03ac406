//! The standalone agent's start-up sweep: a pair removed from the configuration while the
//! agent was down leaves its VIPs (recorded in its ledger) and, after a crash mid-drain,
//! its drain's nftables tables. Nobody runs it any more, so nobody would ever remove them —
//! and a VIP nobody manages can be a second holder of an address another member now owns.
//!
//! Each pair a standalone agent starts records, next to its state file, where it came from
//! (`<pair>.source`, JSON): its configuration file and the `--config` arguments of the agent
//! that ran it. At start, before any pair runs, every pair found in a state directory this
//! agent uses (a ledger, a state file or a source record) that this agent does not
//! configure is swept **only if**
//! - its lock (`<pair>.state.lock`) is free: no other agent process runs it now, and
//! - the agent that ran it shared a `--config` argument with this one (the same service,
//!   whose configuration no longer has the pair: a file removed from a directory, an
//!   argument dropped, the pair renamed), or its configuration file no longer exists.
//!
//! So a node that runs one agent per pair (each with its own `--config` file and heartbeat
//! port) over one state directory never has one agent remove another's VIPs, even while
//! that other agent restarts. A pair with no source record (written by a version before
//! the record existed) is left alone with a warning that says what it left and how to
//! remove it. The sweep removes the VIPs and the drain tables; the state file stays (its
//! epoch must never go back if the pair is configured again).

use crate::ledger::VipLedger;
use crate::state::StateFile;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The file recording where `pair`'s configuration came from.
fn source_path(dir: &Path, pair: &str) -> PathBuf {
    dir.join(format!("{pair}.source"))
}

/// Where a pair's configuration came from.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// The pair's configuration file.
    pub file: PathBuf,
    /// The `--config` arguments of the agent that ran it.
    pub agent_config: Vec<PathBuf>,
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned())
}

/// Records that `pair` runs from `file`, in an agent started with `agent_config`
/// (written at its start, atomically).
pub fn record_source(dir: &Path, pair: &str, file: &Path, agent_config: &[PathBuf]) -> std::io::Result<()> {
    let src = Source { file: canonical(file), agent_config: agent_config.iter().map(|p| canonical(p)).collect() };
    let json = serde_json::to_vec_pretty(&src).map_err(std::io::Error::other)?;
    crate::state::write_atomic(&source_path(dir, pair), &json)
}

fn read_source(dir: &Path, pair: &str) -> Option<Source> {
    serde_json::from_slice(&std::fs::read(source_path(dir, pair)).ok()?).ok()
}

/// The pairs with something on record in `dir`: a ledger, a state file or a source record.
fn pairs_in(dir: &Path) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = VipLedger::pairs_in(dir).into_iter().collect();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for name in rd.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()) {
            if let Some(p) = name.strip_suffix(".state.json").or_else(|| name.strip_suffix(".source")) {
                out.insert(p.to_owned());
            }
        }
    }
    out
}

/// What this agent runs: its state directories with the pairs configured in each, and
/// the configuration files and directories it loads.
#[derive(Debug, Default)]
pub struct Configured {
    /// State directory → the pairs this agent runs there.
    pub dirs: BTreeMap<PathBuf, BTreeSet<String>>,
    /// The `--config` arguments (files and directories).
    pub sources: Vec<PathBuf>,
}

/// Why an unconfigured pair is, or is not, swept.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Its recorded source is one of ours, or gone: it is swept.
    Sweep,
    /// It has no source record: left alone (with a warning).
    NoRecord,
    /// Its source is another agent's configuration: left alone.
    OtherAgent(PathBuf),
}

/// The rule on a recorded source (pure, apart from whether files exist).
pub fn verdict(source: Option<&Source>, ours: &[PathBuf]) -> Verdict {
    let Some(src) = source else { return Verdict::NoRecord };
    let ours: Vec<PathBuf> = ours.iter().map(|p| canonical(p)).collect();
    let same_agent = src.agent_config.iter().any(|a| ours.contains(a));
    if same_agent || !src.file.exists() { Verdict::Sweep } else { Verdict::OtherAgent(src.file.clone()) }
}

/// Sweeps what pairs that are no longer configured left in this agent's state directories
/// (see the module doc). Returns the pairs swept.
pub async fn sweep(configured: &Configured) -> Vec<String> {
    let mut swept = Vec::new();
    for (dir, pairs) in &configured.dirs {
        for pair in pairs_in(dir).difference(pairs) {
            let state = StateFile::new(dir, pair);
            // Held: another agent runs it right now.
            let Ok(_lock) = state.lock() else {
                tracing::debug!(pair = %pair, dir = %dir.display(), "a pair this agent does not configure runs in another agent");
                continue;
            };
            match verdict(read_source(dir, pair).as_ref(), &configured.sources) {
                Verdict::Sweep => {
                    tracing::info!(pair = %pair, dir = %dir.display(), "a pair that is no longer configured: removing its VIPs and drain tables");
                    if crate::leftovers::remove_vips_and_drain_tables(dir, pair).await {
                        let _ = std::fs::remove_file(source_path(dir, pair));
                    }
                    swept.push(pair.clone());
                }
                Verdict::NoRecord => {
                    let vips = VipLedger::new(dir, pair).load().map(|v| v.len()).unwrap_or(0);
                    if vips > 0 {
                        tracing::warn!(
                            pair = %pair, dir = %dir.display(), vips,
                            "a pair that is not configured left VIPs here (and maybe drain tables), but nothing records which \
                             configuration ran it: left alone. If it is gone for good, remove its VIPs (`ip addr del`, label \
                             `<interface>:hv`), `nft delete table ip havip-{pair}-fwd` and the like, and {pair}.vips.json"
                        );
                    }
                }
                Verdict::OtherAgent(src) => {
                    tracing::debug!(pair = %pair, source = %src.display(), "a pair of another agent's configuration: left alone");
                }
            }
        }
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::{Configured, Source, Verdict, canonical, record_source, source_path, sweep, verdict};
    use crate::state::StateFile;
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    #[test]
    fn the_source_rule() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = dir.path().join("conf.d");
        std::fs::create_dir_all(&conf).expect("mkdir");
        let web = conf.join("web.yaml");
        let db = dir.path().join("db.yaml");
        std::fs::write(&web, "").expect("write");
        std::fs::write(&db, "").expect("write");
        let src = |file: &Path, agent: &[&Path]| Source {
            file: canonical(file),
            agent_config: agent.iter().map(|p| canonical(p)).collect(),
        };
        // No record: left alone.
        assert_eq!(verdict(None, std::slice::from_ref(&conf)), Verdict::NoRecord);
        // The same agent (a --config argument in common): ours, whether the file is still
        // there (the argument was dropped, the pair renamed) or not.
        assert_eq!(verdict(Some(&src(&web, &[&conf])), std::slice::from_ref(&conf)), Verdict::Sweep);
        assert_eq!(verdict(Some(&src(&db, &[&web, &db])), std::slice::from_ref(&web)), Verdict::Sweep);
        // Another agent's existing file (one agent per pair): not ours.
        assert_eq!(verdict(Some(&src(&db, &[&db])), std::slice::from_ref(&web)), Verdict::OtherAgent(canonical(&db)));
        // A file that is gone: nobody can run the pair from it any more.
        let gone = canonical(dir.path()).join("gone.yaml");
        assert_eq!(verdict(Some(&src(&gone, &[&gone])), std::slice::from_ref(&web)), Verdict::Sweep);
    }

    #[tokio::test]
    async fn a_locked_or_foreign_pair_is_left_and_a_removed_one_is_swept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().join("state");
        let conf = dir.path().join("web.yaml");
        let foreign = dir.path().join("db.yaml");
        std::fs::write(&conf, "").expect("write");
        std::fs::write(&foreign, "").expect("write");
        // "old" ran in this agent (its file was one of its arguments, now dropped); "db"
        // runs in another agent from another file;
        // "busy" is locked by a live agent; "legacy" has no source record. None has VIPs
        // recorded (no netlink needed).
        for p in ["old", "db", "busy", "legacy", "web"] {
            StateFile::new(&d, p).store(&crate::sm::Persisted::default()).expect("state");
        }
        let old_file = dir.path().join("old.yaml");
        std::fs::write(&old_file, "").expect("write");
        record_source(&d, "old", &old_file, &[conf.clone(), old_file.clone()]).expect("record");
        record_source(&d, "web", &conf, std::slice::from_ref(&conf)).expect("record");
        record_source(&d, "db", &foreign, std::slice::from_ref(&foreign)).expect("record");
        record_source(&d, "busy", &conf, std::slice::from_ref(&conf)).expect("record");
        let _held = StateFile::new(&d, "busy").lock().expect("lock");
        let configured = Configured {
            dirs: BTreeMap::from([(d.clone(), BTreeSet::from(["web".to_owned()]))]),
            sources: vec![conf.clone()],
        };
        // nft may be unavailable without root: the removal then logs and goes on.
        let swept = sweep(&configured).await;
        assert_eq!(swept, vec!["old".to_owned()]);
        assert!(!source_path(&d, "old").exists(), "the record of a swept pair goes");
        assert!(StateFile::new(&d, "old").path().exists(), "its state file (epoch) stays");
        assert!(source_path(&d, "db").exists() && source_path(&d, "busy").exists());
    }
}
