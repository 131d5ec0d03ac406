//! The I/O a pair's configuration resolves to (VIP interfaces, the data link, layer-2
//! ports, fence targets, heartbeat paths), the stale VIPs of an earlier configuration,
//! and the observers started for it. Resolving and wiring only: no decision.

use super::*;

/// A VIP of the configuration with its interface resolved.
#[derive(Clone)]
pub(super) struct ResolvedVip {
    pub(super) id: sm::VipId,
    pub(super) vip: Vip,
    pub(super) ports: Vec<u16>,
    pub(super) announce: AnnounceSchedule,
}

/// The I/O resources built from a configuration (rebuilt on a reconfiguration).
pub(super) struct Io {
    pub(super) vips: Vec<ResolvedVip>,
    pub(super) arp: HashMap<String, Arc<ArpPort>>,
    pub(super) hb: EndpointSpec,
    pub(super) data_link: String,
    pub(super) vip_links: BTreeSet<String>,
    pub(super) fence: Vec<(IpAddr, String)>,
    pub(super) own: Vec<(IpAddr, u8)>,
}

/// Resolves a configuration's I/O: VIP interfaces, the data link, layer-2 ports (reusing
/// `reuse_arp`'s), fence targets, this node's own addresses and the heartbeat paths.
pub(super) async fn build_io(
    cfg: &AgentConfig,
    nl: &Netlink,
    reuse_arp: &HashMap<String, Arc<ArpPort>>,
) -> Result<Io, RuntimeError> {
    let me =
        cfg.local_member().cloned().ok_or_else(|| RuntimeError::Config(format!("{} is not a member", cfg.node)))?;
    // Resolve each VIP's interface.
    let mut vips = Vec::new();
    for v in &cfg.vips {
        let ifname = match &v.interface {
            Some(i) => i.clone(),
            None => nl.interface_for_subnet(v.addr, v.prefix).await?,
        };
        vips.push(ResolvedVip {
            id: sm::VipId::new(v.id.clone()).map_err(|e| RuntimeError::Config(e.to_string()))?,
            vip: Vip { addr: v.addr, prefix: v.prefix, ifname },
            ports: v.probe_ports.clone(),
            announce: v.announce.clone(),
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
    let vip_links: BTreeSet<String> = vips.iter().map(|v| v.vip.ifname.clone()).collect();

    // Layer-2 ports: one per VIP interface and one for the gateway probe's interface.
    let gateways = nl.default_gateways().await.unwrap_or_default();
    let fence: Vec<(IpAddr, String)> = if cfg.probe.fence_targets.is_empty() {
        gateways
            .iter()
            .filter_map(|(gw, idx)| links.iter().find(|l| l.index == *idx).map(|l| (*gw, l.name.clone())))
            .filter(|(gw, _)| gw.is_ipv4())
            .collect()
    } else {
        let mut v = Vec::new();
        for t in &cfg.probe.fence_targets {
            // The interface that holds an own address in the target's subnet, else the data link.
            let ifname = own
                .iter()
                .filter(|a| !a.is_havip() && crate::netlink::same_subnet(a.addr, *t, a.prefix))
                .find_map(|a| links.iter().find(|l| l.index == a.ifindex))
                .map(|l| l.name.clone())
                .unwrap_or_else(|| data_link.clone());
            v.push((*t, ifname));
        }
        v
    };
    let mut arp: HashMap<String, Arc<ArpPort>> = HashMap::new();
    for ifname in vip_links.iter().cloned().chain(fence.iter().map(|(_, i)| i.clone())) {
        if !arp.contains_key(&ifname) {
            let port = match reuse_arp.get(&ifname) {
                Some(p) => p.clone(),
                None => Arc::new(ArpPort::open(&ifname)?),
            };
            arp.insert(ifname.clone(), port);
        }
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
    Ok(Io { vips, arp, hb, data_link, vip_links, fence, own: own_v4 })
}

/// Removes what the pair's ledger holds beyond `current` (VIPs of a configuration that
/// changed while the agent was down), then records exactly what is left. The pair's
/// current VIPs are left to the state machine (adopted after an agent restart, removed
/// on a standby); another pair's VIPs are never in this pair's ledger.
pub(super) async fn remove_stale_vips(nl: &Netlink, ledger: &VipLedger, current: &[ResolvedVip]) {
    let recorded = match ledger.load() {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the VIP ledger; stale VIPs of this pair are left in place");
            return;
        }
    };
    let keep: Vec<Vip> = current.iter().map(|v| v.vip.clone()).collect();
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
}

impl Runtime {
    /// Starts the pair's observers (each next to what it observes): carrier, probes of
    /// the peers' and its own listeners, gateway, duplicate VIPs, traffic.
    pub(super) fn spawn_tasks(
        &mut self,
        data_link: String,
        vip_links: BTreeSet<String>,
        fence: Vec<(IpAddr, String)>,
        own: Vec<(IpAddr, u8)>,
    ) {
        // Carrier, on a netlink connection of its own.
        let nl = match Netlink::new() {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "failed to open netlink for the carrier watch");
                self.nl.clone()
            }
        };
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
                overdue: Duration::from_millis(self.cfg.sm.timings.heartbeat_interval_ms * 6 / 5),
                holding: self.holding.clone(),
                pending: self.probe_pending.clone(),
                last_heard_ms: self.last_heard_ms.clone(),
                origin: self.origin,
                metrics: self.metrics.clone(),
            }
            .spawn(self.tx.clone()),
        );

        let local: Vec<LocalTarget> = self
            .vips
            .iter()
            .flat_map(|v| {
                let own_addr = own
                    .iter()
                    .find(|(a, p)| crate::netlink::same_subnet(*a, v.vip.addr, *p))
                    .map(|(a, _)| *a)
                    .unwrap_or(v.vip.addr);
                v.ports.iter().map(move |p| LocalTarget { vip: v.id.clone(), vip_addr: v.vip.addr, own_addr, port: *p })
            })
            .collect();
        let timeout = self.cfg.probe.timeout.max(Duration::from_millis(200));
        self.tasks.push(spawn_local_probes(
            local,
            self.holding.clone(),
            timeout,
            self.metrics.clone(),
            self.tx.clone(),
        ));

        let fence_ports: Vec<FenceProbe> = fence
            .iter()
            .filter_map(|(t, ifname)| match (t, self.arp.get(ifname)) {
                (IpAddr::V4(v4), Some(p)) => Some((*v4, arp_source_for(&own, *v4), p.clone())),
                _ => None,
            })
            .collect();
        self.tasks.push(spawn_gateway_watch(fence_ports, self.tx.clone()));

        let conflict_targets: Vec<(sm::VipId, std::net::Ipv4Addr, Arc<ArpPort>)> = self
            .vips
            .iter()
            .filter_map(|v| match (v.vip.addr, self.arp.get(&v.vip.ifname)) {
                (IpAddr::V4(ip), Some(p)) => Some((v.id.clone(), ip, p.clone())),
                _ => None,
            })
            .collect();
        self.tasks.push(spawn_conflict_watch(conflict_targets, self.holding.clone(), self.tx.clone()));

        let ifaces: Vec<String> =
            self.vips.iter().map(|v| v.vip.ifname.clone()).collect::<BTreeSet<_>>().into_iter().collect();
        self.tasks.push(spawn_traffic_sampler(ifaces, self.tx.clone()));
    }
}
