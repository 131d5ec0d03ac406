//! Checks of the node an agent runs on: what in its environment keeps havip from working
//! even though havip itself is right — the failures users report most with every VIP tool
//! (reverse-path filtering, `arp_ignore`, missing capabilities, a VIP taken for the node's
//! address, a heartbeat path blocked on one side).
//!
//! [`gather`] reads the facts (addresses, links and main-table routes through netlink,
//! sysctls from /proc/sys, the effective capabilities from /proc/self/status); [`check`]
//! judges them against the pairs' configurations and, where the agent runs them, the state
//! machines' status — a pure function, so that every finding is unit-tested. The Kubernetes
//! agent reports the findings in its member status (`members[].findings`, read by
//! `kubectl havip doctor`); `havip-agent doctor` prints them for standalone pairs.
//!
//! Size: one check per function; what a finding means and its fix live in the crds crate
//! ([`havip_crds::DoctorCheck`]), shared with the plugin.

use crate::config::AgentConfig;
use crate::netlink::{AddrInfo, LinkState, Netlink, NetlinkError, RouteFact, same_subnet};
use havip_crds::{AnnounceMode, DoctorCheck, Finding, wire};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// `CAP_NET_ADMIN`.
const CAP_NET_ADMIN: u32 = 12;
/// `CAP_NET_RAW`.
const CAP_NET_RAW: u32 = 13;

/// What the checks read from the node.
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    /// Every address of every interface.
    pub addresses: Vec<AddrInfo>,
    /// Every interface.
    pub links: Vec<LinkState>,
    /// The main table's routes.
    pub routes: Vec<RouteFact>,
    /// IPv4 interface settings that matter, by interface (`all` included):
    /// `rp_filter`, `arp_ignore`. Missing: unreadable.
    pub ipv4_conf: BTreeMap<String, Ipv4Conf>,
    /// The agent's effective capabilities (`CapEff`); `None` when unreadable.
    pub cap_eff: Option<u64>,
}

/// An interface's IPv4 settings read by the checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ipv4Conf {
    /// `rp_filter`: 0 off, 1 strict, 2 loose.
    pub rp_filter: Option<u8>,
    /// `arp_ignore`.
    pub arp_ignore: Option<u8>,
}

/// Reads the facts of this node (its network namespace and this process) that the checks
/// of `pairs` need: the interface settings of the interfaces their heartbeat paths and
/// VIPs use, and `all` — not of every interface (a Kubernetes node has one per pod).
pub async fn gather(nl: &Netlink, pairs: &[&AgentConfig]) -> Result<NodeFacts, NetlinkError> {
    let mut facts = NodeFacts {
        links: nl.links().await?,
        addresses: nl.addresses().await?,
        routes: nl.main_routes().await?,
        ipv4_conf: BTreeMap::new(),
        cap_eff: std::fs::read_to_string("/proc/self/status").ok().and_then(|s| effective_caps(&s)),
    };
    let mut names: Vec<String> = vec!["all".to_owned()];
    for cfg in pairs {
        let mine = cfg.members.iter().filter(|m| m.node == cfg.node).flat_map(|m| m.addresses.values());
        names.extend(mine.filter_map(|a| interface_of(&facts, *a)).map(str::to_owned));
        names.extend(cfg.vips.iter().filter_map(|v| vip_interface(&facts, v)).map(str::to_owned));
    }
    names.sort();
    names.dedup();
    for name in names {
        let read = |key: &str| {
            std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{name}/{key}"))
                .ok()
                .and_then(|v| v.trim().parse::<u8>().ok())
        };
        let conf = Ipv4Conf { rp_filter: read("rp_filter"), arp_ignore: read("arp_ignore") };
        facts.ipv4_conf.insert(name, conf);
    }
    Ok(facts)
}

/// `CapEff` of a /proc/PID/status text.
fn effective_caps(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// A peer whose clock is this far from this node's (as its heartbeats' timestamps show,
/// smoothed) is reported: NTP keeps clocks within milliseconds of each other.
pub const CLOCK_SKEW_FINDING_MS: i64 = 2_000;

/// What one pair's agent knows at run time that the checks use: which peers it hears on
/// which paths (from its state machine's status), and how far their clocks are from this
/// node's.
#[derive(Clone, Debug, Default)]
pub struct Heard {
    /// Per peer node: the names of the paths it is heard on now.
    pub peers: BTreeMap<String, Vec<String>>,
    /// Per peer node: its clock's skew (ms; positive: behind this node's), from the
    /// timestamps of the heartbeats accepted from it.
    pub skew_ms: BTreeMap<String, i64>,
}

impl Heard {
    /// From a state machine's status and the pair's path names.
    pub fn of(status: &crate::sm::Status, paths: &[String]) -> Heard {
        let peers = status
            .peers
            .iter()
            .map(|p| {
                let heard = p.heard_paths.iter().filter_map(|id| paths.get(usize::from(id.0)).cloned()).collect();
                (p.node.as_str().to_owned(), heard)
            })
            .collect();
        Heard { peers, skew_ms: BTreeMap::new() }
    }

    /// With the peers' clock skew (from [`crate::runtime::Handle::clock_skew`]).
    pub fn with_skew(mut self, skew_ms: BTreeMap<String, i64>) -> Heard {
        self.skew_ms = skew_ms;
        self
    }
}

/// Every finding for this node's pairs, sorted and without duplicates (two pairs on the
/// same interface find its settings once). `heard[i]` goes with `pairs[i]` when given.
pub fn check(facts: &NodeFacts, pairs: &[&AgentConfig], heard: &[Option<Heard>]) -> Vec<Finding> {
    let mut out = capabilities(facts);
    for (i, cfg) in pairs.iter().enumerate() {
        out.extend(rp_filter(facts, cfg));
        out.extend(arp_ignore(facts, cfg));
        out.extend(first_address(facts, cfg));
        out.extend(heartbeat_mtu(facts, cfg));
        if let Some(Some(h)) = heard.get(i) {
            out.extend(silent_paths(cfg, h));
            out.extend(clock_skew(cfg, h));
        }
    }
    out.sort();
    out.dedup();
    out
}

fn finding(check: DoctorCheck, subject: impl Into<String>, detail: impl Into<String>) -> Finding {
    Finding { check, subject: subject.into(), detail: detail.into() }
}

fn capabilities(facts: &NodeFacts) -> Vec<Finding> {
    let Some(eff) = facts.cap_eff else { return Vec::new() };
    [(CAP_NET_ADMIN, "CAP_NET_ADMIN", "addresses, routes and nftables"), (CAP_NET_RAW, "CAP_NET_RAW", "ARP and NA")]
        .into_iter()
        .filter(|(bit, _, _)| eff & (1u64 << bit) == 0)
        .map(|(_, name, what)| {
            finding(
                DoctorCheck::MissingCapability,
                name,
                format!("the agent runs without {name}: it cannot manage {what}"),
            )
        })
        .collect()
}

fn link_name(facts: &NodeFacts, index: u32) -> Option<&str> {
    facts.links.iter().find(|l| l.index == index).map(|l| l.name.as_str())
}

/// The interface holding this node's own (not havip's) address `addr`.
fn interface_of(facts: &NodeFacts, addr: IpAddr) -> Option<&str> {
    let a = facts.addresses.iter().find(|a| a.addr == addr && !a.is_havip())?;
    link_name(facts, a.ifindex)
}

/// The interface the main table sends packets for `dst` out of (longest prefix; the
/// lowest metric among equals). Policy rules are not consulted.
fn route_out(facts: &NodeFacts, dst: IpAddr) -> Option<&str> {
    let best = facts
        .routes
        .iter()
        .filter(|r| r.dst.is_ipv4() == dst.is_ipv4() && same_subnet(r.dst, dst, r.prefix))
        .max_by(|a, b| a.prefix.cmp(&b.prefix).then(b.metric.cmp(&a.metric)))?;
    link_name(facts, best.oif?)
}

/// The larger of `all` and the interface's value (what the kernel applies to
/// `rp_filter` and `arp_ignore`).
fn effective(facts: &NodeFacts, ifname: &str, pick: impl Fn(&Ipv4Conf) -> Option<u8>) -> Option<u8> {
    let all = facts.ipv4_conf.get("all").and_then(&pick);
    let own = facts.ipv4_conf.get(ifname).and_then(&pick);
    all.max(own)
}

/// This node's IPv4 heartbeat paths: (path, the interface holding its address on it).
fn own_ipv4_paths<'a>(facts: &'a NodeFacts, cfg: &'a AgentConfig) -> Vec<(&'a String, &'a str)> {
    let Some(me) = cfg.members.iter().find(|m| m.node == cfg.node) else { return Vec::new() };
    me.addresses
        .iter()
        .filter(|(_, a)| a.is_ipv4())
        .filter_map(|(path, mine)| Some((path, interface_of(facts, *mine)?)))
        .collect()
}

fn rp_filter(facts: &NodeFacts, cfg: &AgentConfig) -> Vec<Finding> {
    let mut out = Vec::new();
    for (path, arrive) in own_ipv4_paths(facts, cfg) {
        if effective(facts, arrive, |c| c.rp_filter) != Some(1) {
            continue;
        }
        for peer in cfg.members.iter().filter(|m| m.node != cfg.node) {
            let Some(theirs) = peer.addresses.get(path) else { continue };
            match route_out(facts, *theirs) {
                Some(back) if back != arrive => out.push(finding(
                    DoctorCheck::RpFilterDropsHeartbeats,
                    format!("{arrive} (path {path})"),
                    format!(
                        "heartbeats from {} ({theirs}) arrive on {arrive}, whose rp_filter is strict (1), but the route \
                         back to {theirs} leaves by {back}: the kernel drops them",
                        peer.node
                    ),
                )),
                _ => {}
            }
        }
    }
    out
}

/// The interface a layer-2 VIP goes on: the configured one, else the interface of the
/// node's own address in its subnet (as the agent resolves it).
fn vip_interface<'a>(facts: &'a NodeFacts, vip: &'a crate::config::VipConfig) -> Option<&'a str> {
    if let Some(i) = &vip.interface {
        return Some(i.as_str());
    }
    let own: Vec<&AddrInfo> = facts.addresses.iter().filter(|a| !a.is_havip()).collect();
    let a = own
        .iter()
        .find(|a| same_subnet(a.addr, vip.addr, vip.prefix))
        .or_else(|| own.iter().find(|a| same_subnet(a.addr, vip.addr, a.prefix)))?;
    link_name(facts, a.ifindex)
}

fn layer2(vip: &crate::config::VipConfig) -> bool {
    matches!(vip.announce.mode, AnnounceMode::L2 | AnnounceMode::Both)
}

fn arp_ignore(facts: &NodeFacts, cfg: &AgentConfig) -> Vec<Finding> {
    let mut out = Vec::new();
    for vip in cfg.vips.iter().filter(|v| v.addr.is_ipv4() && layer2(v)) {
        let Some(ifname) = vip_interface(facts, vip) else { continue };
        let why = match effective(facts, ifname, |c| c.arp_ignore) {
            Some(8) => "arp_ignore=8: the kernel answers no ARP request on it".to_owned(),
            Some(2) if vip.prefix == 32 => format!(
                "arp_ignore=2: the kernel answers only senders in the target's subnet, and {}/32 has none",
                vip.addr
            ),
            _ => continue,
        };
        out.push(finding(DoctorCheck::ArpIgnoreHidesVip, format!("{ifname} ({})", vip.addr), why));
    }
    out
}

fn first_address(facts: &NodeFacts, cfg: &AgentConfig) -> Vec<Finding> {
    let mut out = Vec::new();
    for vip in cfg.vips.iter().filter(|v| v.addr.is_ipv4() && layer2(v)) {
        let Some(ifname) = vip_interface(facts, vip) else { continue };
        let Some(link) = facts.links.iter().find(|l| l.name == ifname) else { continue };
        let first = facts.addresses.iter().find(|a| a.ifindex == link.index && a.addr.is_ipv4());
        if let Some(first) = first.filter(|a| a.is_havip())
            && first.addr == vip.addr
        {
            let own = facts.addresses.iter().any(|a| a.ifindex == link.index && a.addr.is_ipv4() && !a.is_havip());
            let detail = if own {
                format!("{} is the first IPv4 address of {ifname}, before the node's own", vip.addr)
            } else {
                format!("{} is the only kind of IPv4 address {ifname} has: none of the node's own", vip.addr)
            };
            out.push(finding(DoctorCheck::VipIsFirstAddress, format!("{ifname} ({})", vip.addr), detail));
        }
    }
    out
}

fn silent_paths(cfg: &AgentConfig, heard: &Heard) -> Vec<Finding> {
    let mut out = Vec::new();
    for (peer, on) in &heard.peers {
        if on.is_empty() {
            // Silent everywhere: the PeerSilent alarm's business (down or cut off).
            continue;
        }
        let Some(member) = cfg.members.iter().find(|m| &m.node == peer) else { continue };
        for path in cfg.paths.iter().filter(|p| !on.contains(p) && member.addresses.contains_key(*p)) {
            out.push(finding(
                DoctorCheck::HeartbeatPathSilent,
                format!("{peer} on path {path}"),
                format!(
                    "pair {}: {peer} is heard on {} but not on {path} (port {})",
                    cfg.pair,
                    on.join(", "),
                    cfg.heartbeat_port
                ),
            ));
        }
    }
    out
}

/// The most bytes a heartbeat takes on the wire over IPv4: the largest datagram a
/// receiver reads, a UDP and an IPv4 header.
const HEARTBEAT_WIRE_V4: u32 = wire::MAX_DATAGRAM as u32 + 8 + 20;

fn heartbeat_mtu(facts: &NodeFacts, cfg: &AgentConfig) -> Vec<Finding> {
    let mut out = Vec::new();
    // IPv6 links carry at least 1280 bytes: only IPv4 paths can be too small.
    for (path, ifname) in own_ipv4_paths(facts, cfg) {
        let Some(mtu) = facts.links.iter().find(|l| l.name == ifname).and_then(|l| l.mtu) else { continue };
        if mtu < HEARTBEAT_WIRE_V4 {
            out.push(finding(
                DoctorCheck::HeartbeatMtuTooSmall,
                format!("{ifname} (path {path})"),
                format!(
                    "{ifname}'s MTU is {mtu} bytes, and a heartbeat takes up to {HEARTBEAT_WIRE_V4} on the wire ({} \
                     bytes of payload, the most a receiver reads): larger ones leave in fragments",
                    wire::MAX_DATAGRAM
                ),
            ));
        }
    }
    out
}

fn clock_skew(cfg: &AgentConfig, heard: &Heard) -> Vec<Finding> {
    heard
        .skew_ms
        .iter()
        .filter(|(peer, skew)| skew.abs() >= CLOCK_SKEW_FINDING_MS && cfg.members.iter().any(|m| &&m.node == peer))
        .map(|(peer, skew)| {
            let way = if *skew > 0 { "behind" } else { "ahead of" };
            // Whole seconds: two pairs' smoothed samples of one peer name the same finding.
            let secs = (skew.abs() + 500) / 1000;
            finding(
                DoctorCheck::ClockSkewed,
                peer.clone(),
                format!(
                    "{peer}'s clock is about {secs} s {way} this node's (the timestamps of its heartbeats); heartbeats \
                     more than {} s off are refused",
                    crate::heartbeat::MAX_CLOCK_DIFFERENCE.as_secs()
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests;
