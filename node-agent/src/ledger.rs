//! The VIPs a pair has added on this node, persisted next to its state file
//! (`<pair>.vips.json`), so that the agent can later remove exactly those of them that
//! are no VIP of the pair any more (a FloatingIP deleted or changed while the agent was
//! down) — and never an address of another pair, whatever its subnet or interface, nor
//! an address havip did not add. Written before an address is added, so a crash right
//! after the add still finds it here.
//!
//! A lost ledger only means a stale VIP is left in place (the safe direction); the
//! Kubernetes agent's start-up cleanup of pairs that no longer exist reads the ledgers
//! of every pair in the state directory.

use crate::netlink::Vip;
use havip_crds::{HolderRoute, HolderRule};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Errors of the ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The file could not be written.
    #[error("failed to write the VIP ledger {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file exists but could not be read or parsed.
    #[error("failed to read the VIP ledger {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
struct Entry {
    address: IpAddr,
    prefix: u8,
    interface: String,
}

/// A routed VIP's backup path: its destination and kernel table.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct BackupEntry {
    address: IpAddr,
    table: u32,
}

#[derive(Serialize, Deserialize, Debug, Default)]
struct OnDisk {
    version: u32,
    vips: Vec<Entry>,
    /// Backup paths the pair added (routed VIPs; an agent without them reads none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    backup: Vec<BackupEntry>,
    /// Virtual MAC interfaces the pair created (an agent without them reads none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    links: Vec<String>,
    /// Routes that follow the holder that the pair may have added (an agent without them
    /// reads none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<HolderRoute>,
    /// Policy rules that follow the holder, likewise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    rules: Vec<HolderRule>,
}

/// The ledger of one pair.
#[derive(Clone, Debug)]
pub struct VipLedger {
    path: PathBuf,
}

impl VipLedger {
    /// The ledger of `pair` in `dir`.
    pub fn new(dir: &Path, pair: &str) -> Self {
        Self { path: dir.join(format!("{pair}.vips.json")) }
    }

    /// The state directory the ledger lives in.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// The pairs that have a ledger in `dir` (their names).
    pub fn pairs_in(dir: &Path) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
        let mut out: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|n| n.strip_suffix(".vips.json").map(str::to_owned))
            .collect();
        out.sort();
        out
    }

    fn read(&self) -> Result<OnDisk, LedgerError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(OnDisk::default()),
            Err(e) => return Err(LedgerError::Read { path: self.path.clone(), message: e.to_string() }),
        };
        serde_json::from_str(&text).map_err(|e| LedgerError::Read { path: self.path.clone(), message: e.to_string() })
    }

    fn write(&self, mut d: OnDisk) -> Result<(), LedgerError> {
        let err = |source| LedgerError::Write { path: self.path.clone(), source };
        d.version = 1;
        d.vips.sort();
        d.vips.dedup();
        d.backup.sort();
        d.backup.dedup();
        d.links.sort();
        d.links.dedup();
        d.routes.sort();
        d.routes.dedup();
        d.rules.sort();
        d.rules.dedup();
        let json = serde_json::to_vec_pretty(&d).map_err(|e| err(std::io::Error::other(e)))?;
        crate::state::write_atomic(&self.path, &json).map_err(err)
    }

    /// The recorded VIPs; a missing file is an empty ledger.
    pub fn load(&self) -> Result<Vec<Vip>, LedgerError> {
        let d = self.read()?;
        Ok(d.vips.into_iter().map(|e| Vip { addr: e.address, prefix: e.prefix, ifname: e.interface }).collect())
    }

    /// Replaces the recorded VIPs with `vips` (the recorded backup paths stay).
    pub fn store(&self, vips: &[Vip]) -> Result<(), LedgerError> {
        let mut d = self.read().unwrap_or_default();
        d.vips =
            vips.iter().map(|v| Entry { address: v.addr, prefix: v.prefix, interface: v.ifname.clone() }).collect();
        self.write(d)
    }

    /// The recorded backup paths (destination, kernel table).
    pub fn backup_paths(&self) -> Result<Vec<(IpAddr, u32)>, LedgerError> {
        Ok(self.read()?.backup.into_iter().map(|b| (b.address, b.table)).collect())
    }

    /// Adds backup paths to the record (before they are added to the kernel).
    pub fn record_backup_paths(&self, paths: &[(IpAddr, u32)]) -> Result<(), LedgerError> {
        let mut d = self.read().unwrap_or_default();
        let before = d.backup.len();
        for &(address, table) in paths {
            let e = BackupEntry { address, table };
            if !d.backup.contains(&e) {
                d.backup.push(e);
            }
        }
        if d.backup.len() == before && self.path.exists() {
            return Ok(());
        }
        self.write(d)
    }

    /// The virtual MAC interfaces the pair created (see `announce::l2::vmac`).
    pub fn links(&self) -> Result<Vec<String>, LedgerError> {
        Ok(self.read()?.links)
    }

    /// Adds virtual MAC interfaces to the record (before they are created).
    pub fn record_links(&self, names: &[String]) -> Result<(), LedgerError> {
        let mut d = self.read().unwrap_or_default();
        let before = d.links.len();
        for n in names {
            if !d.links.contains(n) {
                d.links.push(n.clone());
            }
        }
        if d.links.len() == before && (names.is_empty() || self.path.exists()) {
            return Ok(());
        }
        self.write(d)
    }

    /// Replaces the recorded virtual MAC interfaces with `names` (after the others were
    /// deleted).
    pub fn store_links(&self, names: &[String]) -> Result<(), LedgerError> {
        let mut d = self.read().unwrap_or_default();
        if d.links == names {
            return Ok(());
        }
        d.links = names.to_vec();
        self.write(d)
    }

    /// The routes and rules that follow the holder the pair may have added.
    pub fn holder_routes(&self) -> Result<(Vec<HolderRoute>, Vec<HolderRule>), LedgerError> {
        let d = self.read()?;
        Ok((d.routes, d.rules))
    }

    /// Adds routes and rules that follow the holder to the record (before they are added
    /// to the kernel).
    pub fn record_holder_routes(&self, routes: &[HolderRoute], rules: &[HolderRule]) -> Result<(), LedgerError> {
        let d = self.read().unwrap_or_default();
        let mut all_routes = d.routes.clone();
        all_routes.extend(routes.iter().filter(|r| !d.routes.contains(r)).cloned());
        let mut all_rules = d.rules.clone();
        all_rules.extend(rules.iter().filter(|r| !d.rules.contains(r)).cloned());
        self.store_holder_routes(&all_routes, &all_rules)
    }

    /// Replaces the recorded routes and rules that follow the holder (after the others
    /// were removed from the kernel).
    pub fn store_holder_routes(&self, routes: &[HolderRoute], rules: &[HolderRule]) -> Result<(), LedgerError> {
        let mut d = self.read().unwrap_or_default();
        let (mut r, mut u) = (routes.to_vec(), rules.to_vec());
        r.sort();
        r.dedup();
        u.sort();
        u.dedup();
        if d.routes == r && d.rules == u && (self.path.exists() || (r.is_empty() && u.is_empty())) {
            return Ok(());
        }
        (d.routes, d.rules) = (r, u);
        self.write(d)
    }

    /// Adds `vips` to the record (before they are added to the kernel).
    pub fn record(&self, vips: &[Vip]) -> Result<(), LedgerError> {
        let mut all = self.load().unwrap_or_default();
        let before = all.len();
        for v in vips {
            if !all.contains(v) {
                all.push(v.clone());
            }
        }
        if all.len() == before && self.path.exists() {
            return Ok(());
        }
        self.store(&all)
    }

    /// The recorded VIPs this pair may remove: those another pair's ledger does not
    /// record too (see [`VipLedger::claimed_by_others`]), and those in `keep` (its VIPs
    /// now) whatever the others record.
    pub fn load_unclaimed(&self, keep: &[Vip]) -> Result<Vec<Vip>, LedgerError> {
        let recorded = self.load()?;
        let others = self.claimed_by_others();
        Ok(recorded.into_iter().filter(|r| keep.contains(r) || !others.contains(&r.addr)).collect())
    }

    /// The addresses the other pairs' ledgers next to this one record. An address that
    /// moved from one pair to another (a FloatingIP deleted from one pair and created
    /// with the same address in another) is in both ledgers for a while: the pair it
    /// left must not remove it from under the pair that holds it now. An unreadable
    /// ledger of another pair claims nothing (warned).
    pub fn claimed_by_others(&self) -> Vec<IpAddr> {
        let (Some(dir), Some(own)) = (self.path.parent(), self.path.file_name()) else { return Vec::new() };
        let mut out = Vec::new();
        for pair in Self::pairs_in(dir) {
            let other = Self::new(dir, &pair);
            if other.path.file_name() == Some(own) {
                continue;
            }
            match other.load() {
                Ok(vips) => out.extend(vips.into_iter().map(|v| v.addr)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read another pair's VIP ledger; its VIPs are not protected from this pair's cleanup")
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The other pair (next to this one) whose ledger records the virtual MAC interface
    /// `name`, if any: two pairs with the same `virtualMAC` on one link would share it.
    pub fn link_owner(&self, name: &str) -> Option<String> {
        let (dir, own) = (self.path.parent()?, self.path.file_name()?);
        Self::pairs_in(dir).into_iter().find(|pair| {
            let other = Self::new(dir, pair);
            other.path.file_name() != Some(own) && other.links().is_ok_and(|l| l.iter().any(|n| n == name))
        })
    }

    /// Removes the ledger (the pair left this node and its VIPs are gone), with the
    /// temporary file a write killed before its rename left.
    pub fn remove(&self) -> Result<(), LedgerError> {
        crate::state::remove_with_temporary(&self.path)
            .map_err(|source| LedgerError::Write { path: self.path.clone(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::VipLedger;
    use crate::netlink::Vip;

    #[test]
    fn an_address_another_pair_records_is_claimed_by_it() {
        let dir = tempfile::tempdir().expect("dir");
        let gamma = VipLedger::new(dir.path(), "gamma");
        let alpha = VipLedger::new(dir.path(), "alpha");
        assert!(gamma.claimed_by_others().is_empty());
        // extra-vip was gamma's, then moved to alpha: in both ledgers.
        gamma.record(&[vip("10.0.0.55", "eth0"), vip("10.0.0.60", "eth0")]).expect("record");
        alpha.record(&[vip("10.0.0.55", "eth0"), vip("10.0.0.50", "eth0")]).expect("record");
        let addr = |a: &str| a.parse::<std::net::IpAddr>().expect("ip");
        assert_eq!(gamma.claimed_by_others(), vec![addr("10.0.0.50"), addr("10.0.0.55")]);
        assert_eq!(alpha.claimed_by_others(), vec![addr("10.0.0.55"), addr("10.0.0.60")]);
        // A pair whose name is a prefix of another's is another pair.
        VipLedger::new(dir.path(), "alpha2").record(&[vip("10.0.0.70", "eth0")]).expect("record");
        assert!(alpha.claimed_by_others().contains(&addr("10.0.0.70")));
        // An unreadable ledger claims nothing.
        std::fs::write(dir.path().join("broken.vips.json"), b"{garbage").expect("write");
        assert_eq!(gamma.claimed_by_others().len(), 3);
    }

    fn vip(a: &str, ifname: &str) -> Vip {
        Vip { addr: a.parse().expect("ip"), prefix: 24, ifname: ifname.to_owned() }
    }

    #[test]
    fn virtual_mac_interfaces_are_recorded_beside_the_vips_and_owned_by_one_pair() {
        let dir = tempfile::tempdir().expect("tempdir");
        let web = VipLedger::new(dir.path(), "web");
        let db = VipLedger::new(dir.path(), "db");
        assert!(web.links().expect("missing is empty").is_empty());
        web.record_links(&["hv4-33-2".to_owned()]).expect("record");
        web.record_links(&["hv4-33-2".to_owned(), "hv6-33-2".to_owned()]).expect("record");
        web.record(&[vip("10.0.0.50", "hv4-33-2")]).expect("record");
        web.store(&[vip("10.0.0.51", "hv4-33-2")]).expect("store");
        assert_eq!(web.links().expect("load"), vec!["hv4-33-2".to_owned(), "hv6-33-2".to_owned()]);
        assert_eq!(db.link_owner("hv4-33-2"), Some("web".to_owned()));
        assert_eq!(web.link_owner("hv4-33-2"), None, "its own");
        assert_eq!(db.link_owner("hv4-34-2"), None);
        web.store_links(&["hv6-33-2".to_owned()]).expect("store");
        assert_eq!(web.links().expect("load"), vec!["hv6-33-2".to_owned()]);
        assert_eq!(web.load().expect("load"), vec![vip("10.0.0.51", "hv4-33-2")], "the VIPs stay");
        assert_eq!(db.link_owner("hv4-33-2"), None);
    }

    #[test]
    fn routes_that_follow_the_holder_are_recorded_beside_the_vips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let web = VipLedger::new(dir.path(), "web");
        let (routes, rules) = web.holder_routes().expect("missing is empty");
        assert!(routes.is_empty() && rules.is_empty());
        // Storing nothing in a missing ledger writes no file.
        web.store_holder_routes(&[], &[]).expect("store");
        assert!(!dir.path().join("web.vips.json").exists());
        let spec: Vec<havip_crds::HolderRouteSpec> = serde_json::from_value(serde_json::json!([
            {"destination": "0.0.0.0/0", "gateway": "192.0.2.1", "table": 100, "source": "192.0.2.10"},
            {"destination": "198.51.100.0/24", "interface": "eth1"}
        ]))
        .expect("spec");
        let rule_spec: Vec<havip_crds::HolderRuleSpec> =
            serde_json::from_value(serde_json::json!([{"from": "192.0.2.10/32", "table": 100, "priority": 1000}]))
                .expect("spec");
        let (routes, rules) = havip_crds::routes::parse_all(&spec, &rule_spec).expect("valid");
        web.record(&[vip("10.0.0.50", "eth0")]).expect("record");
        web.record_holder_routes(&routes[..1], &rules).expect("record");
        web.record_holder_routes(&routes, &rules).expect("record");
        let (got_routes, got_rules) = web.holder_routes().expect("load");
        assert_eq!((got_routes.len(), got_rules), (2, rules.clone()));
        assert!(routes.iter().all(|r| got_routes.contains(r)));
        // Replaced: only what is left.
        web.store_holder_routes(&routes[1..], &[]).expect("store");
        assert_eq!(web.holder_routes().expect("load"), (routes[1..].to_vec(), Vec::new()));
        assert_eq!(web.load().expect("load"), vec![vip("10.0.0.50", "eth0")], "the VIPs stay");
        // A ledger of an agent that predates them reads none.
        std::fs::write(
            dir.path().join("old.vips.json"),
            br#"{"version":1,"vips":[{"address":"10.0.0.9","prefix":24,"interface":"eth0"}]}"#,
        )
        .expect("write");
        assert_eq!(VipLedger::new(dir.path(), "old").holder_routes().expect("load"), (Vec::new(), Vec::new()));
    }

    #[test]
    fn records_are_durable_deduplicated_and_per_pair() {
        let dir = tempfile::tempdir().expect("tempdir");
        let web = VipLedger::new(dir.path(), "web");
        assert!(web.load().expect("missing is empty").is_empty());
        web.record(&[vip("10.0.0.50", "eth0")]).expect("record");
        web.record(&[vip("10.0.0.50", "eth0"), vip("10.0.0.51", "eth0")]).expect("record");
        assert_eq!(web.load().expect("load"), vec![vip("10.0.0.50", "eth0"), vip("10.0.0.51", "eth0")]);
        VipLedger::new(dir.path(), "db").record(&[vip("10.0.0.60", "eth0")]).expect("record");
        assert_eq!(VipLedger::pairs_in(dir.path()), vec!["db".to_owned(), "web".to_owned()]);
        web.store(&[vip("10.0.0.51", "eth0")]).expect("store");
        assert_eq!(web.load().expect("load"), vec![vip("10.0.0.51", "eth0")]);
        web.remove().expect("remove");
        assert_eq!(VipLedger::pairs_in(dir.path()), vec!["db".to_owned()]);
        std::fs::write(dir.path().join("db.vips.json"), "{torn").expect("write");
        assert!(VipLedger::new(dir.path(), "db").load().is_err(), "a corrupt ledger is an error, not empty");
    }

    #[test]
    fn backup_paths_are_recorded_beside_the_vips_and_survive_a_store_of_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = VipLedger::new(dir.path(), "edge");
        let a: std::net::IpAddr = "203.0.113.10".parse().expect("ip");
        let b: std::net::IpAddr = "2001:db8::10".parse().expect("ip");
        l.record_backup_paths(&[(a, 104)]).expect("record");
        l.record_backup_paths(&[(a, 104), (b, 104)]).expect("record");
        l.record(&[vip("10.0.0.50", "eth0")]).expect("record");
        l.store(&[vip("10.0.0.51", "eth0")]).expect("store");
        assert_eq!(l.backup_paths().expect("load"), vec![(a, 104), (b, 104)]);
        assert_eq!(l.load().expect("load"), vec![vip("10.0.0.51", "eth0")]);
        // A ledger written before backup paths existed reads as none.
        std::fs::write(dir.path().join("old.vips.json"), r#"{"version":1,"vips":[]}"#).expect("write");
        assert!(VipLedger::new(dir.path(), "old").backup_paths().expect("load").is_empty());
    }
}
