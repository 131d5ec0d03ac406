//! The I/O a pair's configuration resolves to (VIP interfaces, the data link, layer-2
//! ports, fence targets, heartbeat paths), the stale VIPs of an earlier configuration,
//! and the observers started for it. Resolving and wiring only: no decision.

use super::task::Runtime;
use super::types::{Event, ResolvedVip, RuntimeError};
use crate::announce::bgp;
use crate::config::AgentConfig;
use crate::heartbeat::{EndpointSpec, PathSpec};
use crate::ledger::VipLedger;
use crate::netlink::{CarrierLinks, Netlink, Vip, spawn_carrier_watch};
use crate::probes::{
    FenceProbe, GatewayMemory, L2Port, LOCAL_PROBE_INTERVAL, LocalCheck, LocalTarget, PeerProbes, spawn_conflict_watch,
    spawn_gateway_watch, spawn_local_probes, spawn_traffic_sampler,
};
use crate::sm;
use havip_crds::AnnounceMode;
use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// A gateway or fence target: probed on `ifname` from `source`.
#[derive(Clone, Debug)]
pub(super) struct FenceTarget {
    pub(super) target: IpAddr,
    pub(super) ifname: String,
    pub(super) source: IpAddr,
}

fn is_link_local(a: IpAddr) -> bool {
    matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// The source of a fence target's probes among the interface's own addresses: for IPv4
/// the one in the target's subnet, else 0.0.0.0 (an RFC 5227 probe); for IPv6 the one in
/// the target's subnet, else the interface's link-local address — never `::`, whose
/// solicitation would make a router still checking its own address give it up.
fn probe_source(own: &[&crate::netlink::AddrInfo], target: IpAddr) -> Option<IpAddr> {
    // A tentative or duplicate IPv6 address cannot be a source yet.
    let own: Vec<&&crate::netlink::AddrInfo> = own.iter().filter(|a| !a.tentative && !a.dad_failed).collect();
    let same = own.iter().find(|a| {
        a.addr.is_ipv4() == target.is_ipv4()
            && !is_link_local(a.addr)
            && crate::netlink::same_subnet(a.addr, target, a.prefix)
    });
    match target {
        IpAddr::V4(_) => Some(same.map(|a| a.addr).unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))),
        IpAddr::V6(_) => same.or_else(|| own.iter().find(|a| is_link_local(a.addr))).map(|a| a.addr),
    }
}

/// The I/O resources built from a configuration (rebuilt on a reconfiguration).
pub(super) struct Io {
    pub(super) vips: Vec<ResolvedVip>,
    pub(super) l2: HashMap<String, Arc<L2Port>>,
    pub(super) hb: EndpointSpec,
    pub(super) data_link: String,
    pub(super) vip_links: BTreeSet<String>,
    pub(super) fence: Vec<FenceTarget>,
    pub(super) own: Vec<(IpAddr, u8)>,
}

/// Resolves a configuration's I/O: VIP interfaces, the data link, layer-2 ports (reusing
/// `reuse_l2`'s), fence targets, this node's own addresses and the heartbeat paths.
pub(super) async fn build_io(
    cfg: &AgentConfig,
    nl: &Netlink,
    reuse_l2: &HashMap<String, Arc<L2Port>>,
    ledger: &VipLedger,
) -> Result<Io, RuntimeError> {
    let me =
        cfg.local_member().cloned().ok_or_else(|| RuntimeError::Config(format!("{} is not a member", cfg.node)))?;
    // Resolve each VIP's interface.
    let mut vips = Vec::new();
    for v in &cfg.vips {
        let routed = v.announce.mode == AnnounceMode::BGP;
        let also_routed = if v.announce.mode == AnnounceMode::Both {
            nl.ensure_dummy(bgp::LINK).await?;
            Some(Vip { addr: v.addr, prefix: crate::netlink::host_prefix(v.addr), ifname: bgp::LINK.to_owned() })
        } else {
            None
        };
        let (ifname, prefix) = if routed {
            // A host address of the dummy interface the node's BGP speaker advertises.
            let ifname = v.interface.clone().unwrap_or_else(|| bgp::LINK.to_owned());
            nl.ensure_dummy(&ifname).await?;
            (ifname, crate::netlink::host_prefix(v.addr))
        } else {
            let ifname = match &v.interface {
                Some(i) => i.clone(),
                None => nl.interface_for_subnet(v.addr, v.prefix).await?,
            };
            (ifname, v.prefix)
        };
        // A virtual MAC: a host address of the pair's macvlan on the link, which the
        // holder alone sets up (see `announce::l2::vmac`); the link stays where its
        // traffic arrives from, for the carrier, the probes and the guard.
        let (vip, virtual_link) = match cfg.virtual_mac.filter(|_| !routed) {
            Some(vm) => {
                let parent = nl.link(&ifname).await?;
                let name = vm.link_name(v.addr.is_ipv6(), parent.index);
                if let Some(owner) = ledger.link_owner(&name) {
                    return Err(RuntimeError::Config(format!(
                        "virtualMAC id {}: the virtual MAC interface {name} on {ifname} is pair {owner}'s; pairs that \
                         share a link need different virtual MACs",
                        vm.id
                    )));
                }
                // Recorded before it is created: a crash right after still deletes it.
                if let Err(e) = ledger.record_links(std::slice::from_ref(&name)) {
                    tracing::warn!(error = %e, ifname = %name, "failed to record the virtual MAC interface in the ledger");
                }
                nl.ensure_macvlan(&name, &parent, vm.mac(v.addr.is_ipv6()), !v.addr.is_ipv6()).await?;
                (Vip { addr: v.addr, prefix: crate::netlink::host_prefix(v.addr), ifname: name }, true)
            }
            None => (Vip { addr: v.addr, prefix, ifname: ifname.clone() }, false),
        };
        vips.push(ResolvedVip {
            id: sm::VipId::new(v.id.clone()).map_err(|e| RuntimeError::Config(e.to_string()))?,
            ingress: ifname,
            vip,
            ports: v.probe_ports.clone(),
            health_checks: v.health_checks.clone(),
            announce: v.announce.clone(),
            mac: None,
            routed,
            also_routed,
            virtual_link,
            subnet_prefix: v.prefix,
        });
    }
    // The data link: the interface holding this node's address on the first path.
    let first_path_addr = cfg
        .paths
        .first()
        .and_then(|p| me.addresses.get(p))
        .copied()
        .ok_or_else(|| RuntimeError::Config("no heartbeat path address for this node".into()))?;
    let own = nl.addresses().await?;
    let links = nl.links().await?;
    let data_link = own
        .iter()
        .find(|a| a.addr == first_path_addr)
        .and_then(|a| links.iter().find(|l| l.index == a.ifindex))
        .map(|l| l.name.clone())
        .ok_or_else(|| RuntimeError::Config(format!("no interface holds this node's address {first_path_addr}")))?;
    for v in &mut vips {
        if v.routed {
            // Its traffic comes from the router, over the data link; it has no MAC of
            // its own that anyone resolves.
            v.ingress = data_link.clone();
        } else {
            v.mac =
                links.iter().find(|l| l.name == v.vip.ifname).and_then(|l| <[u8; 6]>::try_from(l.mac.as_slice()).ok());
        }
    }
    // The links whose carrier the VIPs need: where their traffic arrives.
    let vip_links: BTreeSet<String> = vips.iter().map(|v| v.ingress.clone()).collect();

    // Fence targets: the gateways of the default routes (IPv4 and IPv6), or the
    // configured ones, each with the interface it is reached on and the source address
    // its probes use.
    let gateways = nl.default_gateways().await.unwrap_or_default();
    let own_on = |ifname: &String| -> Vec<&crate::netlink::AddrInfo> {
        let index = links.iter().find(|l| &l.name == ifname).map(|l| l.index);
        own.iter().filter(|a| !a.is_havip() && Some(a.ifindex) == index).collect()
    };
    let targets: Vec<(IpAddr, String)> = if cfg.probe.fence_targets.is_empty() {
        gateways
            .iter()
            .filter_map(|(gw, idx)| links.iter().find(|l| l.index == *idx).map(|l| (*gw, l.name.clone())))
            .collect()
    } else {
        let mut v = Vec::new();
        for t in &cfg.probe.fence_targets {
            // The interface that holds an own address in the target's subnet (for a
            // link-local target, the interface of the default route through it), else
            // the data link.
            let ifname = own
                .iter()
                .filter(|a| {
                    !a.is_havip() && !is_link_local(a.addr) && crate::netlink::same_subnet(a.addr, *t, a.prefix)
                })
                .find_map(|a| links.iter().find(|l| l.index == a.ifindex))
                .map(|l| l.name.clone())
                .or_else(|| {
                    gateways
                        .iter()
                        .filter(|(gw, _)| gw == t)
                        .find_map(|(_, idx)| links.iter().find(|l| l.index == *idx).map(|l| l.name.clone()))
                })
                .unwrap_or_else(|| data_link.clone());
            v.push((*t, ifname));
        }
        v
    };
    let mut fence = Vec::new();
    for (target, ifname) in targets {
        match probe_source(&own_on(&ifname), target) {
            Some(source) => fence.push(FenceTarget { target, ifname, source }),
            None => {
                tracing::warn!(%target, ifname = %ifname, "no own address to ask this fence target from: it is not probed")
            }
        }
    }

    // Layer-2 ports: one per VIP interface and per fence target interface; IPv6 ones
    // also listen to neighbour advertisements.
    let mut needs: std::collections::BTreeMap<String, bool> = std::collections::BTreeMap::new();
    for (ifname, v6) in vips
        .iter()
        .filter(|v| !v.routed)
        // A virtual MAC VIP announces from its macvlan and is probed for from its link.
        .flat_map(|v| {
            [(v.vip.ifname.clone(), v.vip.addr.is_ipv6()), (v.probe_ifname().to_owned(), v.vip.addr.is_ipv6())]
        })
        .chain(fence.iter().map(|f| (f.ifname.clone(), f.target.is_ipv6())))
    {
        *needs.entry(ifname).or_default() |= v6;
    }
    let mut l2: HashMap<String, Arc<L2Port>> = HashMap::new();
    for (ifname, v6) in needs {
        let port = match reuse_l2.get(&ifname) {
            Some(p) if p.has_ipv6() || !v6 => p.clone(),
            _ => L2Port::shared(&ifname, v6)?,
        };
        l2.insert(ifname, port);
    }
    let own_v4: Vec<(IpAddr, u8)> = own.iter().filter(|a| !a.is_havip()).map(|a| (a.addr, a.prefix)).collect();

    // Heartbeat.
    let paths: Vec<PathSpec> = cfg
        .paths
        .iter()
        .map(|p| PathSpec {
            name: p.clone(),
            local: me.addresses.get(p).copied().unwrap_or(first_path_addr),
            peers: cfg
                .members
                .iter()
                .filter(|m| m.node != cfg.node)
                .filter_map(|m| m.addresses.get(p).map(|a| (m.node.clone(), *a)))
                .collect(),
        })
        .collect();
    let hb = EndpointSpec {
        pair: cfg.pair.clone(),
        node: cfg.node.clone(),
        port: cfg.heartbeat_port,
        paths,
        keys: cfg.keys.clone(),
        heartbeat_timeout: Duration::from_millis(cfg.sm.timings.heartbeat_timeout_ms),
    };
    Ok(Io { vips, l2, hb, data_link, vip_links, fence, own: own_v4 })
}

/// Removes what the pair's ledger holds beyond `current` (VIPs of a configuration that
/// changed while the agent was down), then records exactly what is left. The pair's
/// current VIPs are left to the state machine (adopted after an agent restart, removed
/// on a standby). An address another pair's ledger records is that pair's now (a VIP
/// that moved between pairs): it is neither removed nor kept in this ledger.
pub(super) async fn remove_stale_vips(nl: &Netlink, ledger: &VipLedger, current: &[ResolvedVip]) {
    let keep: Vec<Vip> = current.iter().flat_map(|v| v.addresses().cloned()).collect();
    let recorded = match ledger.load_unclaimed(&keep) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the VIP ledger; stale VIPs of this pair are left in place");
            return;
        }
    };
    let (removed, errors) = nl.remove_stale(&recorded, &keep).await;
    for a in &removed {
        tracing::info!(address = %a.addr, "removed a stale VIP of this pair");
    }
    for e in &errors {
        tracing::warn!(error = %e, "failed to remove a stale VIP");
    }
    // What stays recorded: the current VIPs added before, and stale ones still in the
    // kernel (their removal failed: retried at the next start or reconfiguration).
    let present = match nl.havip_addresses().await {
        Ok(p) => p,
        Err(_) => return,
    };
    let left: Vec<Vip> =
        recorded.into_iter().filter(|r| keep.contains(r) || present.iter().any(|a| a.addr == r.addr)).collect();
    if let Err(e) = ledger.store(&left) {
        tracing::warn!(error = %e, "failed to write the VIP ledger");
    }
    // Virtual MAC interfaces of an earlier configuration (virtualMAC changed or removed,
    // a VIP's link changed): deleted, with whatever address is left on them.
    let links: BTreeSet<String> = current.iter().filter(|v| v.virtual_link).map(|v| v.vip.ifname.clone()).collect();
    let stale_links = match ledger.links() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the VIP ledger; stale virtual MAC interfaces are left in place");
            return;
        }
    };
    let mut kept: Vec<String> = Vec::new();
    for name in stale_links {
        if links.contains(&name) {
            kept.push(name);
            continue;
        }
        if let Err(e) = nl.delete_virtual_link(&name).await {
            tracing::warn!(error = %e, ifname = %name, "failed to delete a stale virtual MAC interface");
            kept.push(name);
        }
    }
    if let Err(e) = ledger.store_links(&kept) {
        tracing::warn!(error = %e, "failed to write the VIP ledger");
    }
}

impl Runtime {
    /// Starts the pair's observers (each next to what it observes): carrier, probes of
    /// the peers' and its own listeners, gateway, duplicate VIPs, traffic.
    pub(super) fn spawn_tasks(
        &mut self,
        data_link: String,
        vip_links: BTreeSet<String>,
        fence: Vec<FenceTarget>,
        own: Vec<(IpAddr, u8)>,
    ) {
        // Carrier, from the agent's link events (one subscription for every pair).
        let nl = self.nl.clone();
        let links = CarrierLinks { data: data_link, vip: vip_links };
        self.tasks.push(spawn_carrier_watch(nl, links, self.metrics.clone(), self.tx.clone()));

        self.tasks.push(
            PeerProbes {
                targets: self
                    .vips
                    .iter()
                    .flat_map(|v| v.ports.iter().map(move |p| (v.id.clone(), SocketAddr::new(v.vip.addr, *p))))
                    .collect(),
                interval: self.cfg.probe.interval,
                timeout: self.cfg.probe.timeout,
                holding: self.holding.clone(),
                urgent: self.probes_urgent.clone(),
                wake: self.probes_wake.clone(),
                metrics: self.metrics.clone(),
                neighbours: Some(self.nl.clone()),
                resolvers: {
                    let mut r: Vec<(IpAddr, Arc<L2Port>)> = self
                        .vips
                        .iter()
                        .filter(|v| !v.ports.is_empty())
                        .filter_map(|v| self.l2.get(v.probe_ifname()).map(|p| (v.vip.addr, p.clone())))
                        .collect();
                    r.sort_by_key(|(a, _)| *a);
                    r.dedup_by_key(|(a, _)| *a);
                    r
                },
            }
            .spawn(self.tx.clone()),
        );

        let api = self.cfg.api_server.clone();
        let local: Vec<LocalTarget> = self
            .vips
            .iter()
            .flat_map(|v| {
                // A routed VIP is in no subnet of the node: a member that does not hold it
                // checks its listeners on the loopback address (listeners bound to every
                // address answer there) — not on the VIP, which would reach the holder
                // through the router, or, on a backup path, come back here.
                let loopback = match v.vip.addr {
                    IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                    IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
                };
                let needs_speaker = v.advertised().is_some();
                let own_addr = if v.routed {
                    loopback
                } else {
                    own.iter()
                        .find(|(a, p)| crate::netlink::same_subnet(*a, v.vip.addr, *p))
                        .map(|(a, _)| *a)
                        .unwrap_or(v.vip.addr)
                };
                // The control-plane mode's API server check stands for its port's listener.
                let api_port = api.as_ref().map(|a| a.port);
                let tcp = v.ports.iter().filter(move |p| Some(**p) != api_port).map(move |p| LocalTarget {
                    vip: v.id.clone(),
                    vip_addr: v.vip.addr,
                    own_addr,
                    port: *p,
                    check: LocalCheck::Tcp,
                    needs_speaker,
                });
                let http = v.health_checks.iter().map(move |(p, path)| LocalTarget {
                    vip: v.id.clone(),
                    vip_addr: v.vip.addr,
                    own_addr,
                    port: *p,
                    check: LocalCheck::Http(path.clone()),
                    needs_speaker,
                });
                let https = api.clone().map(|a| LocalTarget {
                    vip: v.id.clone(),
                    vip_addr: v.vip.addr,
                    own_addr,
                    port: a.port,
                    check: LocalCheck::Https(a.check),
                    needs_speaker,
                });
                tcp.chain(http).chain(https)
            })
            .collect();
        let timeout = self.cfg.probe.timeout.max(Duration::from_millis(200));
        let interval =
            self.cfg.api_server.as_ref().map_or(LOCAL_PROBE_INTERVAL, |a| a.interval.min(LOCAL_PROBE_INTERVAL));
        self.tasks.push(spawn_local_probes(
            local,
            self.holding.clone(),
            self.speaker_ok.clone(),
            timeout,
            interval,
            self.metrics.clone(),
            self.tx.clone(),
        ));

        let fence_ports: Vec<FenceProbe> =
            fence.iter().filter_map(|f| self.l2.get(&f.ifname).map(|p| (f.target, f.source, p.clone()))).collect();
        let memory = GatewayMemory::in_dir(self.ledger.dir());
        self.tasks.push(spawn_gateway_watch(fence_ports, memory, self.tx.clone()));

        let conflict_targets: Vec<(sm::VipId, IpAddr, Arc<L2Port>)> = self
            .vips
            .iter()
            .filter_map(|v| self.l2.get(v.probe_ifname()).map(|p| (v.id.clone(), v.vip.addr, p.clone())))
            .collect();
        self.tasks.push(spawn_conflict_watch(conflict_targets, self.holding.clone(), self.tx.clone()));

        let ifaces: Vec<String> =
            self.vips.iter().map(|v| v.ingress.clone()).collect::<BTreeSet<_>>().into_iter().collect();
        self.tasks.push(spawn_traffic_sampler(ifaces, self.tx.clone()));

        let routed: Vec<IpAddr> = self.advertised_addrs().into_iter().collect();
        if !routed.is_empty() {
            self.tasks.push(spawn_speaker_watch(routed, self.holding.clone(), self.tx.clone()));
        }
    }
}

/// Asks the node's BGP speaker every [`bgp::speaker::POLL`] (the first time after a
/// second, and every second while it carries nothing) for its sessions and, while this member holds the VIPs, what it advertises of
/// `routed`; the answer goes to the runtime.
fn spawn_speaker_watch(
    routed: Vec<IpAddr>,
    holding: Arc<std::sync::atomic::AtomicBool>,
    tx: tokio::sync::mpsc::Sender<Event>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let cfg = bgp::speaker::configured();
        let mut wait = Duration::from_secs(1);
        loop {
            tokio::time::sleep(wait).await;
            let held: &[IpAddr] = if holding.load(std::sync::atomic::Ordering::Relaxed) { &routed } else { &[] };
            let report = bgp::speaker::observe(&cfg, held).await;
            // Every second while the speaker carries nothing: the member's readiness
            // waits on it (a session that comes back makes it a ready target again).
            wait = if report.carries() { bgp::speaker::POLL } else { Duration::from_secs(1) };
            if tx.send(Event::Speaker(report)).await.is_err() {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::probe_source;
    use std::net::IpAddr;

    fn addr(a: &str, prefix: u8) -> crate::netlink::AddrInfo {
        crate::netlink::AddrInfo {
            ifindex: 2,
            addr: a.parse().expect("ip"),
            prefix,
            label: None,
            proto: None,
            dad_failed: false,
            tentative: false,
            deprecated: false,
        }
    }

    #[test]
    fn fence_probes_ask_from_an_own_address_in_the_subnet_or_the_link_local_one() {
        let (v4, other, v6, ll) =
            (addr("10.0.0.11", 24), addr("192.168.1.2", 24), addr("2001:db8::11", 64), addr("fe80::11", 64));
        let own = [&v4, &other, &v6, &ll];
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(probe_source(&own, ip("10.0.0.254")), Some(ip("10.0.0.11")));
        assert_eq!(probe_source(&own, ip("172.16.0.1")), Some(ip("0.0.0.0")), "an RFC 5227 probe");
        assert_eq!(probe_source(&own, ip("2001:db8::1")), Some(ip("2001:db8::11")));
        assert_eq!(probe_source(&own, ip("fe80::1")), Some(ip("fe80::11")), "a link-local gateway");
        assert_eq!(probe_source(&own, ip("2001:db8:1::1")), Some(ip("fe80::11")), "off-subnet: the link-local one");
        // Never `::`: without a usable link-local address an IPv6 target is not probed.
        let mut tentative = addr("fe80::11", 64);
        tentative.tentative = true;
        assert_eq!(probe_source(&[&v4, &tentative], ip("fe80::1")), None);
    }
}
