//! Routed VIPs' backup paths (the HAPair's `bgpBackupPaths`): what the state machine says
//! ([`sm::Machine::advertises_backup`]: a ready standby only) applied to the kernel table
//! the node's speaker imports, after every step. See `announce::bgp` for the hand-off.

use super::task::Runtime;
use crate::announce::bgp;
use std::collections::BTreeSet;
use std::net::IpAddr;

impl Runtime {
    /// The addresses of this pair's VIPs that the node's speaker advertises (`BGP`, `Both`).
    pub(super) fn advertised_addrs(&self) -> BTreeSet<IpAddr> {
        self.vips.iter().filter_map(|v| v.advertised().map(|a| a.addr)).collect()
    }

    /// The backup paths in `table` of this pair's advertised VIPs, as the kernel has them.
    async fn own_backup_routes(&self, table: u32) -> Result<BTreeSet<IpAddr>, crate::netlink::NetlinkError> {
        let own = self.advertised_addrs();
        if own.is_empty() {
            return Ok(own);
        }
        Ok(self.nl.backup_routes(table).await?.into_iter().filter(|a| own.contains(a)).collect())
    }

    /// The routed VIPs whose backup paths this member should advertise now.
    fn wanted_backup_paths(&self) -> BTreeSet<IpAddr> {
        if !self.cfg.bgp_backup_paths || !self.machine.advertises_backup() {
            return BTreeSet::new();
        }
        self.advertised_addrs()
    }

    /// Brings the backup paths in the kernel to what the machine says (after each step,
    /// so after the step's own actions: a takeover's address is on `havip0` before its
    /// backup path goes, a demotion's is off before the backup path comes). Each wanted
    /// set is tried once: a failure is logged and retried when the wanted set changes,
    /// never at every step.
    pub(super) async fn sync_backup_paths(&mut self) {
        let want = self.wanted_backup_paths();
        if self.backup_tried.as_ref() == Some(&want) {
            return;
        }
        let table = bgp::speaker::configured().backup_table;
        let installed = match self.backup_installed.take() {
            Some(s) => s,
            // First time: what an earlier run of this pair left (a crash), of its VIPs.
            None => {
                let mut found = self.ledger.backup_paths().unwrap_or_default();
                found.retain(|(_, t)| *t == table);
                let mut s: BTreeSet<IpAddr> = found.into_iter().map(|(a, _)| a).collect();
                match self.own_backup_routes(table).await {
                    Ok(r) => s.extend(r),
                    Err(e) => tracing::warn!(error = %e, table, "cannot list the backup paths in the kernel"),
                }
                s
            }
        };
        let mut now = installed.clone();
        for &addr in installed.difference(&want) {
            match self.nl.remove_backup_route(addr, table).await {
                Ok(()) => {
                    now.remove(&addr);
                    self.metrics.bgp_route_change("backup_withdrawn");
                    tracing::info!(vip = %addr, table, "backup path withdrawn");
                }
                Err(e) => {
                    self.metrics.io_error(e.category());
                    tracing::warn!(error = %e, vip = %addr, table,
                        "failed to withdraw a backup path: routers may still send this VIP here, where it is dropped");
                }
            }
        }
        let adding: Vec<IpAddr> = want.difference(&installed).copied().collect();
        if !adding.is_empty() {
            let gateways = match self.nl.default_gateways().await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the default gateways for the backup paths");
                    Vec::new()
                }
            };
            let record: Vec<(IpAddr, u32)> = adding.iter().map(|a| (*a, table)).collect();
            if let Err(e) = self.ledger.record_backup_paths(&record) {
                self.metrics.io_error("persist");
                tracing::error!(error = %e, "failed to record the backup paths in the ledger");
            }
            for addr in adding {
                // Through the default gateway of the VIP's family: where the node's own
                // traffic to the VIP goes anyway once the speaker installs the import.
                let Some(&(gw, oif)) = gateways.iter().find(|(g, _)| g.is_ipv4() == addr.is_ipv4()) else {
                    tracing::warn!(vip = %addr, "no default gateway of the VIP's family: no backup path for it");
                    continue;
                };
                match self.nl.add_backup_route(addr, table, gw, oif).await {
                    Ok(()) => {
                        now.insert(addr);
                        self.metrics.bgp_route_change("backup_advertised");
                        tracing::info!(vip = %addr, table, gateway = %gw, "backup path advertised");
                    }
                    Err(e) => {
                        self.metrics.io_error(e.category());
                        tracing::warn!(error = %e, vip = %addr, table, "failed to add a backup path");
                    }
                }
            }
        }
        self.backup_installed = Some(now);
        self.backup_tried = Some(want);
    }

    /// Withdraws every backup path of the pair (the agent stops or leaves the pair: a
    /// member without its agent is no standby, and its guard goes too).
    pub(super) async fn withdraw_backup_paths(&mut self) {
        if !self.cfg.bgp_backup_paths && self.backup_installed.as_ref().is_none_or(BTreeSet::is_empty) {
            return;
        }
        self.backup_tried = None;
        self.backup_installed = Some(BTreeSet::new());
        // Everything of this pair's VIPs in the table, whatever was believed installed.
        let table = bgp::speaker::configured().backup_table;
        let present = match self.own_backup_routes(table).await {
            Ok(r) => r,
            Err(_) => self.advertised_addrs(),
        };
        for addr in present {
            match self.nl.remove_backup_route(addr, table).await {
                Ok(()) => {
                    self.metrics.bgp_route_change("backup_withdrawn");
                    tracing::info!(vip = %addr, table, "backup path withdrawn");
                }
                Err(e) => tracing::warn!(error = %e, vip = %addr, table, "failed to withdraw a backup path"),
            }
        }
    }
}
