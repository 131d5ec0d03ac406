//! What a pair leaves on a node after it is gone: its VIPs (recorded in its ledger),
//! a drain's nft tables, its state file and its ledger. Removed when the agent learns, from a successful list,
//! that the pair no longer names this node (it was deleted, or the node was removed
//! from it, while the agent was down), and when a pair of the same name is a new
//! object (another UID): a re-created pair starts fresh instead of inheriting the old
//! one's suspension, paused failback or epoch.

use crate::ledger::VipLedger;
use crate::netlink::Netlink;
use crate::state::StateFile;
use std::collections::BTreeSet;
use std::path::Path;

fn uid_path(dir: &Path, pair: &str) -> std::path::PathBuf {
    dir.join(format!("{pair}.uid"))
}

/// Removes the VIPs `pair` recorded adding on this node, its ledger, its state file (and
/// a corrupted one set aside), its UID record and its lock file (unless an agent holds it). Errors are logged; what could
/// not be removed stays recorded.
pub(super) async fn remove_pair_leftovers(dir: &Path, pair: &str) {
    if !crate::leftovers::remove_vips_and_drain_tables(dir, pair).await {
        return;
    }
    let state = StateFile::new(dir, pair);
    // A corrupted state file set aside at a start (`.json.corrupt`) goes with its pair.
    let corrupt = state.path().with_extension("json.corrupt");
    // Each with the temporary file a write killed before its rename leaves.
    for p in [state.path().to_owned(), corrupt, uid_path(dir, pair), super::snapshot::path(dir, pair)] {
        if let Err(e) = crate::state::remove_with_temporary(&p) {
            tracing::warn!(pair, file = %p.display(), error = %e, "failed to remove a gone pair's file");
        }
    }
    if let Err(e) = state.remove_lock_file() {
        tracing::warn!(pair, error = %e, "failed to remove a gone pair's lock file");
    }
}

/// The agent leaves the node for good (an uninstall): the VIPs of every pair recorded
/// here are removed, with their ledgers; state files stay.
pub(super) async fn remove_all_vips(dir: &Path) {
    let nl = match Netlink::new() {
        Ok(nl) => nl,
        Err(e) => {
            tracing::warn!(error = %e, "cannot open netlink to remove the VIPs");
            return;
        }
    };
    for pair in VipLedger::pairs_in(dir) {
        let ledger = VipLedger::new(dir, &pair);
        let recorded = match ledger.load() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(pair = %pair, error = %e, "cannot read the VIP ledger; its VIPs stay");
                continue;
            }
        };
        let (removed, errors) = nl.remove_stale(&recorded, &[]).await;
        for a in removed {
            tracing::info!(pair = %pair, address = %a.addr, "removed a VIP (uninstall)");
        }
        for e in &errors {
            tracing::warn!(pair = %pair, error = %e, "failed to remove a VIP");
        }
        if errors.is_empty()
            && let Err(e) = ledger.remove()
        {
            tracing::warn!(pair = %pair, error = %e, "failed to remove the VIP ledger");
        }
    }
}

/// At start, once the lists succeeded: every pair with a ledger here that is not among
/// `current` (the pairs that name this node, plus objects that exist but cannot be
/// read) is gone from this node: its leftovers are removed.
pub(super) async fn remove_gone_pairs(dir: &Path, current: &BTreeSet<String>) {
    let mut recorded: BTreeSet<String> = VipLedger::pairs_in(dir).into_iter().collect();
    recorded.extend(super::snapshot::PairSnapshot::pairs_in(dir));
    for pair in recorded {
        if !current.contains(&pair) {
            tracing::info!(pair = %pair, "a pair this node served is gone: removing what it left");
            remove_pair_leftovers(dir, &pair).await;
        }
    }
}

/// Before a pair starts: if the state directory holds a pair of this name with another
/// UID (deleted and re-created), that one's leftovers go first. Then records `uid`.
pub(super) async fn check_incarnation(dir: &Path, pair: &str, uid: Option<&str>) {
    let Some(uid) = uid else { return };
    let path = uid_path(dir, pair);
    match std::fs::read_to_string(&path) {
        Ok(old) if old.trim() == uid => return,
        Ok(old) => {
            tracing::info!(pair, old_uid = old.trim(), uid, "the pair was re-created: it starts fresh");
            remove_pair_leftovers(dir, pair).await;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(pair, error = %e, "cannot read the pair's UID record"),
    }
    if let Err(e) = crate::state::write_atomic(&path, uid.as_bytes()) {
        tracing::warn!(pair, error = %e, "cannot record the pair's UID");
    }
}
