//! What a pair that no longer runs on this node left behind, and its removal: the VIPs,
//! backup paths, routes and rules that follow the holder, and virtual MAC interfaces it
//! recorded adding (its ledger) and a drain's nftables tables. Shared by both modes: the
//! Kubernetes agent removes them when the API says a pair no longer names the node, a
//! standalone agent when a pair's configuration is gone (`standalone::sweep`).

use crate::ledger::VipLedger;
use crate::netlink::Netlink;
use std::path::Path;

/// Deletes `pair`'s drain tables and removes the VIPs its ledger in `dir` records, then
/// the ledger. Every step is tried; errors are logged at warn. Returns whether every
/// recorded VIP is gone (and with it the ledger): what could not be removed stays
/// recorded for a later attempt.
pub async fn remove_vips_and_drain_tables(dir: &Path, pair: &str) -> bool {
    // A drain's nft tables (the drained addresses on `lo` are in the ledger).
    let p = pair.to_owned();
    match tokio::task::spawn_blocking(move || crate::nft::Nft::open().and_then(|mut n| n.remove_pair(&p))).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(pair, error = %e, "failed to delete the drain tables of a pair that is gone"),
        Err(e) => tracing::warn!(pair, error = %e, "failed to delete the drain tables of a pair that is gone"),
    }
    let ledger = VipLedger::new(dir, pair);
    // An address that moved to another pair is that pair's now.
    let recorded = match ledger.load_unclaimed(&[]) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(pair, error = %e, "cannot read the VIP ledger of a pair that is gone; its VIPs stay");
            return false;
        }
    };
    let backup = match ledger.backup_paths() {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(pair, error = %e, "cannot read the backup paths of a pair that is gone; they stay");
            return false;
        }
    };
    if !backup.is_empty() {
        let Ok(nl) = Netlink::new() else {
            tracing::warn!(pair, "cannot open netlink to remove a gone pair's backup paths");
            return false;
        };
        for (addr, table) in backup {
            if let Err(e) = nl.remove_backup_route(addr, table).await {
                tracing::warn!(pair, error = %e, "failed to remove a backup path of a pair that is gone");
                return false;
            }
            tracing::info!(pair, address = %addr, table, "removed a backup path of a pair that no longer runs on this node");
        }
    }
    // The routes and rules that follow the holder, before the VIPs they may be sourced from.
    let (routes, rules) = match ledger.holder_routes() {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(pair, error = %e, "cannot read the routes of a pair that is gone; they stay");
            return false;
        }
    };
    if !routes.is_empty() || !rules.is_empty() {
        let Ok(nl) = Netlink::new() else {
            tracing::warn!(pair, "cannot open netlink to remove a gone pair's routes");
            return false;
        };
        let left = nl.remove_holder_all(&routes, &rules, "its pair no longer runs on this node").await;
        if !left.is_empty() {
            for (what, e) in left.failures() {
                tracing::warn!(pair, error = %e, what = %what, "failed to remove a route or rule of a pair that is gone");
            }
            return false;
        }
        tracing::info!(
            pair,
            routes = routes.len(),
            rules = rules.len(),
            "removed the routes and rules of a pair that no longer runs on this node"
        );
    }
    if !recorded.is_empty() {
        match Netlink::new() {
            Ok(nl) => {
                let (removed, errors) = nl.remove_stale(&recorded, &[]).await;
                for a in removed {
                    tracing::info!(pair, address = %a.addr, "removed a VIP of a pair that no longer runs on this node");
                }
                if !errors.is_empty() {
                    for e in errors {
                        tracing::warn!(pair, error = %e, "failed to remove a VIP of a pair that is gone");
                    }
                    return false;
                }
            }
            Err(e) => {
                tracing::warn!(pair, error = %e, "cannot open netlink to remove a gone pair's VIPs");
                return false;
            }
        }
    }
    // The virtual MAC interfaces it created (whatever address is left on them goes too).
    let links = match ledger.links() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(pair, error = %e, "cannot read the virtual MAC interfaces of a pair that is gone; they stay");
            return false;
        }
    };
    if !links.is_empty() {
        let Ok(nl) = Netlink::new() else {
            tracing::warn!(pair, "cannot open netlink to delete a gone pair's virtual MAC interfaces");
            return false;
        };
        for name in links {
            if let Err(e) = nl.delete_virtual_link(&name).await {
                tracing::warn!(pair, error = %e, ifname = %name, "failed to delete a virtual MAC interface of a pair that is gone");
                return false;
            }
        }
    }
    if let Err(e) = ledger.remove() {
        tracing::warn!(pair, error = %e, "failed to remove a gone pair's VIP ledger");
    }
    true
}
