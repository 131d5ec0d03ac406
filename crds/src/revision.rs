//! The pair's configuration revision: one stable hash of everything pair-wide, computed
//! the same way by the operator (into `status.configRevision`) and by every agent (into
//! its heartbeats and `members[].appliedRevision`). Planned failovers require equal
//! revisions on both sides.

use crate::{FloatingIPSpec, HAPairSpec};
use std::collections::BTreeMap;

/// FNV-1a, 64 bit: stable across builds and platforms (unlike `std`'s hasher).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The revision of a pair: its spec, its FloatingIPs (by name) and the members' heartbeat
/// path addresses (`node → path → address`). `serde_json` maps are sorted, so the
/// rendering is canonical.
pub fn config_revision(
    spec: &HAPairSpec,
    floating_ips: &BTreeMap<String, FloatingIPSpec>,
    member_addresses: &BTreeMap<String, BTreeMap<String, String>>,
) -> u64 {
    let doc = serde_json::json!({
        "spec": spec,
        "floatingIPs": floating_ips,
        "addresses": member_addresses,
    });
    fnv1a(doc.to_string().as_bytes())
}

/// The revision as written in status (16 hex digits).
pub fn format_revision(rev: u64) -> String {
    format!("{rev:016x}")
}

/// Parses a revision written by [`format_revision`].
pub fn parse_revision(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::{BTreeMap, HAPairSpec, config_revision, fnv1a, format_revision, parse_revision};

    fn spec() -> HAPairSpec {
        serde_json::from_value(serde_json::json!({
            "members": [{"node": "a", "priority": 2}, {"node": "b", "priority": 1}]
        }))
        .expect("spec")
    }

    #[test]
    fn stable_and_sensitive() {
        let fips = BTreeMap::new();
        let mut addrs = BTreeMap::new();
        addrs.insert("a".to_owned(), BTreeMap::from([("data".to_owned(), "10.0.0.1".to_owned())]));
        let r1 = config_revision(&spec(), &fips, &addrs);
        assert_eq!(r1, config_revision(&spec(), &fips, &addrs), "deterministic");
        let mut s2 = spec();
        s2.members[1].priority = 3;
        assert_ne!(r1, config_revision(&s2, &fips, &addrs), "priority change");
        addrs.insert("b".to_owned(), BTreeMap::new());
        assert_ne!(r1, config_revision(&spec(), &fips, &addrs), "address change");
        assert_eq!(parse_revision(&format_revision(r1)), Some(r1));
        // A field added later is left out while it has its default: members that predate
        // it compute the same revision (a planned failover across an upgrade still works).
        let base = config_revision(&spec(), &fips, &addrs);
        let mut s3 = spec();
        s3.takeover.carrier_stable_for = crate::defaults::CARRIER_STABLE_FOR.to_owned();
        assert_eq!(base, config_revision(&s3, &fips, &addrs), "default carrierStableFor");
        assert!(!serde_json::to_string(&s3).expect("json").contains("carrierStableFor"));
        s3.takeover.carrier_stable_for = "5s".to_owned();
        assert_ne!(base, config_revision(&s3, &fips, &addrs), "carrierStableFor change");
        // Known FNV-1a vectors: the hash must never change between builds.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
