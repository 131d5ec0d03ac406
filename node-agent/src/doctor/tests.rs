//! Each check against facts shaped like a node's, with the healthy case beside it.

#![allow(clippy::expect_used)]

use super::{Heard, Ipv4Conf, NodeFacts, check, effective_caps};
use crate::config::AgentConfig;
use crate::netlink::{AddrInfo, HAVIP_ADDR_PROTO, LinkState, RouteFact};
use crate::standalone::config::StandaloneFile;
use havip_crds::DoctorCheck;
use std::collections::BTreeMap;

/// Pair `web`: members a (this node: 10.0.0.1 data, 10.1.0.1 mgmt) and b (10.0.0.2,
/// 10.1.0.2), VIPs 10.0.0.50/24 and 10.0.0.60/32 on eth0.
fn pair() -> AgentConfig {
    let yaml = "pair: web\nnode: a\nmembers:\n  \
        - {node: a, priority: 200, addresses: {data: 10.0.0.1, mgmt: 10.1.0.1}}\n  \
        - {node: b, priority: 100, addresses: {data: 10.0.0.2, mgmt: 10.1.0.2}}\n\
        heartbeat: {key: 000102030405060708090a0b0c0d0e0f, paths: [data, mgmt]}\n\
        vips:\n  - {address: 10.0.0.50/24}\n  - {address: 10.0.0.60/32, interface: eth0}\n";
    let file: StandaloneFile = serde_yaml::from_str(yaml).expect("yaml");
    file.into_agent_config(None).expect("config")
}

fn link(index: u32, name: &str) -> LinkState {
    LinkState {
        index,
        name: name.into(),
        up: true,
        carrier: true,
        mac: vec![2, 0, 0, 0, 0, index as u8],
        mtu: Some(1500),
    }
}

fn addr(ifindex: u32, a: &str, prefix: u8, havip: bool) -> AddrInfo {
    AddrInfo {
        ifindex,
        addr: a.parse().expect("ip"),
        prefix,
        label: None,
        proto: havip.then_some(HAVIP_ADDR_PROTO),
        dad_failed: false,
        tentative: false,
        deprecated: false,
    }
}

fn route(dst: &str, prefix: u8, oif: u32) -> RouteFact {
    RouteFact { dst: dst.parse().expect("ip"), prefix, oif: Some(oif), metric: 0 }
}

/// A healthy node a: eth0 (data) and eth1 (mgmt), connected routes, a default route
/// through eth0, loose rp_filter on the interfaces (off on `all`), every capability.
fn healthy() -> NodeFacts {
    let conf = Ipv4Conf { rp_filter: Some(2), arp_ignore: Some(0) };
    NodeFacts {
        addresses: vec![addr(2, "10.0.0.1", 24, false), addr(3, "10.1.0.1", 24, false)],
        links: vec![link(1, "lo"), link(2, "eth0"), link(3, "eth1")],
        routes: vec![route("0.0.0.0", 0, 2), route("10.0.0.0", 24, 2), route("10.1.0.0", 24, 3)],
        ipv4_conf: ["lo", "eth0", "eth1"]
            .into_iter()
            .map(|n| (n.to_owned(), conf))
            .chain([("all".to_owned(), Ipv4Conf { rp_filter: Some(0), arp_ignore: Some(0) })])
            .collect(),
        cap_eff: Some(0x3f_ffff_ffff),
    }
}

fn checks(facts: &NodeFacts, heard: Option<Heard>) -> Vec<(DoctorCheck, String)> {
    let cfg = pair();
    check(facts, &[&cfg], &[heard]).into_iter().map(|f| (f.check, f.subject)).collect()
}

#[test]
fn a_healthy_node_has_no_findings() {
    let heard = Heard {
        peers: BTreeMap::from([("b".to_owned(), vec!["data".to_owned(), "mgmt".to_owned()])]),
        skew_ms: BTreeMap::from([("b".to_owned(), 3)]),
    };
    assert_eq!(checks(&healthy(), Some(heard)), vec![]);
}

#[test]
fn strict_rp_filter_with_the_route_back_elsewhere_drops_heartbeats() {
    let mut f = healthy();
    f.ipv4_conf.insert("eth1".into(), Ipv4Conf { rp_filter: Some(1), arp_ignore: Some(0) });
    // Symmetric: strict filtering is harmless.
    assert_eq!(checks(&f, None), vec![]);
    // b's management address routed back through eth0: heartbeats on eth1 are dropped.
    f.routes.push(route("10.1.0.2", 32, 2));
    assert_eq!(checks(&f, None), vec![(DoctorCheck::RpFilterDropsHeartbeats, "eth1 (path mgmt)".to_owned())]);
    // `all` strict counts too (the kernel takes the larger value).
    f.ipv4_conf.insert("eth1".into(), Ipv4Conf { rp_filter: Some(0), arp_ignore: Some(0) });
    assert_eq!(checks(&f, None), vec![]);
    f.ipv4_conf.insert("all".into(), Ipv4Conf { rp_filter: Some(1), arp_ignore: Some(0) });
    assert_eq!(checks(&f, None).len(), 1);
}

#[test]
fn arp_ignore_that_hides_a_vip_is_found() {
    let mut f = healthy();
    f.ipv4_conf.insert("eth0".into(), Ipv4Conf { rp_filter: Some(2), arp_ignore: Some(1) });
    assert_eq!(checks(&f, None), vec![], "1: replies for addresses of the incoming interface, VIPs included");
    f.ipv4_conf.insert("eth0".into(), Ipv4Conf { rp_filter: Some(2), arp_ignore: Some(2) });
    assert_eq!(
        checks(&f, None),
        vec![(DoctorCheck::ArpIgnoreHidesVip, "eth0 (10.0.0.60)".to_owned())],
        "2: the /32 VIP has no subnet to share with a sender; the /24 one has"
    );
    f.ipv4_conf.insert("all".into(), Ipv4Conf { rp_filter: Some(0), arp_ignore: Some(8) });
    assert_eq!(checks(&f, None).len(), 2, "8 on all: no replies for either");
}

#[test]
fn a_vip_first_on_its_interface_is_found() {
    let mut f = healthy();
    f.addresses.push(addr(2, "10.0.0.60", 32, true));
    assert_eq!(checks(&f, None), vec![], "after the node's own address");
    // The node's address removed and added again: now after the VIP.
    f.addresses.retain(|a| a.addr.to_string() != "10.0.0.1");
    assert_eq!(checks(&f, None), vec![(DoctorCheck::VipIsFirstAddress, "eth0 (10.0.0.60)".to_owned())]);
    f.addresses.push(addr(2, "10.0.0.1", 24, false));
    assert_eq!(checks(&f, None), vec![(DoctorCheck::VipIsFirstAddress, "eth0 (10.0.0.60)".to_owned())]);
}

#[test]
fn missing_capabilities_are_found() {
    let mut f = healthy();
    f.cap_eff = Some(0x3f_ffff_ffff & !(1 << 13));
    assert_eq!(checks(&f, None), vec![(DoctorCheck::MissingCapability, "CAP_NET_RAW".to_owned())]);
    f.cap_eff = Some(0);
    assert_eq!(checks(&f, None).len(), 2);
    assert_eq!(effective_caps("Name:\tx\nCapEff:\t000001ffffffffff\n"), Some(0x1ff_ffff_ffff));
    assert_eq!(effective_caps("Name:\tx\n"), None);
}

#[test]
fn a_peer_heard_on_some_paths_but_not_another_is_found() {
    let one = Heard { peers: BTreeMap::from([("b".to_owned(), vec!["data".to_owned()])]), skew_ms: BTreeMap::new() };
    assert_eq!(checks(&healthy(), Some(one)), vec![(DoctorCheck::HeartbeatPathSilent, "b on path mgmt".to_owned())]);
    // Silent on every path: the PeerSilent alarm says so, not the doctor.
    let none = Heard { peers: BTreeMap::from([("b".to_owned(), vec![])]), skew_ms: BTreeMap::new() };
    assert_eq!(checks(&healthy(), Some(none)), vec![]);
}

#[test]
fn a_peer_whose_clock_is_seconds_away_is_found() {
    let heard = |skew: i64| {
        let both = vec!["data".to_owned(), "mgmt".to_owned()];
        Heard { peers: BTreeMap::from([("b".to_owned(), both)]), skew_ms: BTreeMap::from([("b".to_owned(), skew)]) }
    };
    assert_eq!(checks(&healthy(), Some(heard(1_999))), vec![], "under 2 s: transit and smoothing");
    assert_eq!(checks(&healthy(), Some(heard(-30_000))), vec![(DoctorCheck::ClockSkewed, "b".to_owned())]);
    let cfg = pair();
    let f = check(&healthy(), &[&cfg], &[Some(heard(30_200))]);
    assert!(f[0].detail.contains("b's clock is about 30 s behind this node's"), "{}", f[0].detail);
    let f = check(&healthy(), &[&cfg], &[Some(heard(-2_600))]);
    assert!(f[0].detail.contains("about 3 s ahead of this node's"), "{}", f[0].detail);
    // A node that is no member of the pair (a stale entry) is not reported.
    let stranger = Heard { peers: BTreeMap::new(), skew_ms: BTreeMap::from([("c".to_owned(), 90_000)]) };
    assert_eq!(checks(&healthy(), Some(stranger)), vec![]);
}

#[test]
fn a_heartbeat_path_whose_mtu_fragments_heartbeats_is_found() {
    let mut f = healthy();
    let mtu = |f: &mut NodeFacts, name: &str, m: u32| {
        if let Some(l) = f.links.iter_mut().find(|l| l.name == name) {
            l.mtu = Some(m);
        }
    };
    mtu(&mut f, "eth1", 540);
    assert_eq!(checks(&f, None), vec![], "540: the largest heartbeat fits");
    mtu(&mut f, "eth1", 539);
    assert_eq!(checks(&f, None), vec![(DoctorCheck::HeartbeatMtuTooSmall, "eth1 (path mgmt)".to_owned())]);
    // An interface no heartbeat path uses does not matter; unknown MTUs are not judged.
    mtu(&mut f, "eth1", 1500);
    mtu(&mut f, "lo", 200);
    assert_eq!(checks(&f, None), vec![]);
    f.links.iter_mut().for_each(|l| l.mtu = None);
    assert_eq!(checks(&f, None), vec![]);
}

#[test]
fn every_check_has_a_fix() {
    for c in DoctorCheck::KNOWN {
        assert!(c.fix().len() > 40, "{c}: {}", c.fix());
    }
}
