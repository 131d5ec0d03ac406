//! Draining a planned move, the I/O side (what and when is the machine's: see
//! `sm::machine::drain`).
//!
//! Old holder ([`sm::Action::DrainVips`]): each VIP moves from its interface to `lo` as a
//! host address (/32, /128) — a routed VIP as a local route on `lo` instead, which the
//! node's BGP speaker does not see (see `Netlink::add_local_route`) — recorded in the VIP
//! ledger first, so that an agent that
//! starts again removes it as a stale VIP; ARP requests for it are dropped and the ARP
//! requests the node sends from it carry the node's own address instead (nft table
//! `arp havip-<pair>-quiet`: the kernel answers ARP for any local address on any
//! interface and would otherwise pull the clients back). An IPv6 VIP on `lo` is neither
//! answered for on the link nor used as a neighbour-solicitation source there; the
//! `ip6 …-quiet` table makes sure of it. Its sockets keep working: the address is still
//! local. The drain ends with `RemoveVips` (removed from `lo`, the quiet tables deleted)
//! or `AddVips` (the VIPs are back on their interface first).
//!
//! New holder ([`sm::Action::Forward`]): nft table `ip`/`ip6 havip-<pair>-fwd` sends the
//! TCP segments of flows this node's conntrack does not know — those of connections
//! established on the old holder — to the old holder's address on the VIP's link, at L2.
//!
//! Guard (every member, see the `nft` module): table `ip`/`ip6 havip-<pair>-guard` drops a
//! packet addressed to a VIP that arrives on the VIP's link while the VIP is no local
//! address here, instead of routing it back out (with forwarding on, every Kubernetes
//! node, a member without the VIP would send the forwarder's copies straight back to the
//! new holder). Installed at the start — before the start-up removes a crashed drain's
//! addresses from `lo`, so that there is no moment without it — and again on every new
//! configuration; a SIGKILLed agent leaves it in place.
//!
//! Nothing else survives the agent: a stopping runtime feeds the machine
//! [`sm::Input::Stopping`] (the drain ends and a last heartbeat tells the peer at once,
//! so its forwarder goes now rather than a heartbeat timeout later), ends both sides and
//! removes the guard last; a starting one deletes its pair's drain tables and (through the
//! ledger) drained addresses.

use super::task::Runtime;
use super::types::ResolvedVip;
use crate::ledger::LedgerError;
use crate::metrics::PairMetrics;
use crate::netlink::{Netlink, NetlinkError, Vip};
use crate::nft::{ForwardRule, GuardRule, Nft, NftError, QuietRule};
use crate::sm;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The `lo` form of a VIP during a drain.
fn on_lo(v: &Vip) -> Vip {
    Vip { addr: v.addr, prefix: crate::netlink::host_prefix(v.addr), ifname: "lo".to_owned() }
}

/// Runs `f` with a fresh nf_tables socket on a blocking thread: a netlink request waits
/// for the kernel's nf_tables lock, which another program (kube-proxy) may hold for a
/// while, and the runtime's thread must keep heartbeating meanwhile.
async fn with_nft<T: Send + 'static>(
    f: impl FnOnce(&mut Nft) -> Result<T, NftError> + Send + 'static,
) -> Result<T, DrainError> {
    Ok(tokio::task::spawn_blocking(move || Nft::open().and_then(|mut n| f(&mut n))).await??)
}

/// Why a drain (or the guard) could not be set up or torn down.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// An nftables request failed.
    #[error(transparent)]
    Nft(#[from] NftError),
    /// The blocking task that talks to nftables panicked or was cancelled.
    #[error("the nftables task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// Reading or changing addresses failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The drained addresses could not be recorded.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The node has no address of its own on a VIP's link to send ARP/ND from.
    #[error("{vip} has no address of its own on {ifname} to speak for it")]
    NoOwnAddress {
        /// The VIP.
        vip: IpAddr,
        /// Its link.
        ifname: String,
    },
}

impl DrainError {
    /// A bounded label for logs.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Nft(e) => e.category(),
            Self::Task(_) => "task",
            Self::Netlink(e) => e.category(),
            Self::Ledger(_) => "ledger",
            Self::NoOwnAddress { .. } => "no_own_address",
        }
    }
}

/// Established TCP connections whose local address is one of `addrs`, from
/// `/proc/net/tcp` and `/proc/net/tcp6` (this network namespace).
pub(super) fn established_on(addrs: &[IpAddr]) -> usize {
    let mut n = 0;
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        if let Ok(text) = std::fs::read_to_string(file) {
            n += count_established(&text, v6, addrs);
        }
    }
    n
}

/// Counts the lines of a `/proc/net/tcp{,6}` table in state ESTABLISHED (`01`) whose local
/// address is in `addrs`. Lines that do not parse are skipped.
fn count_established(text: &str, v6: bool, addrs: &[IpAddr]) -> usize {
    text.lines()
        .skip(1)
        .filter(|line| {
            let mut f = line.split_whitespace();
            let (Some(local), Some(_remote), Some(state)) = (f.nth(1), f.next(), f.next()) else { return false };
            state == "01" && parse_proc_addr(local, v6).is_some_and(|a| addrs.contains(&a))
        })
        .count()
}

/// `0100007F:1F90` → 127.0.0.1 (the kernel prints each 32-bit word in host order, which
/// is little-endian on every platform this runs on); `v6`: four such words.
fn parse_proc_addr(s: &str, v6: bool) -> Option<IpAddr> {
    let hex = s.split(':').next()?;
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| hex.get(i * 8..i * 8 + 8).and_then(|w| u32::from_str_radix(w, 16).ok()))
        .collect::<Option<_>>()?;
    match (v6, words.as_slice()) {
        (false, [w]) => Some(IpAddr::V4(std::net::Ipv4Addr::from(w.swap_bytes()))),
        (true, [a, b, c, d]) => {
            let mut o = [0u8; 16];
            for (i, w) in [a, b, c, d].iter().enumerate() {
                o[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
            }
            let v6 = std::net::Ipv6Addr::from(o);
            // A dual-stack listener's IPv4 connections are IPv6 sockets with mapped
            // addresses (::ffff:a.b.c.d): they are the IPv4 VIP's.
            Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
        }
        _ => None,
    }
}

/// Replaces the pair's guard with one rule per VIP of `vips`, on its link. Errors are
/// logged: without the guard, the forwarder's TTL still keeps copies from looping.
pub(super) async fn install_guard(pair: &str, nl: &Netlink, vips: &[ResolvedVip], metrics: &PairMetrics) {
    let links = match nl.links().await {
        Ok(l) => l,
        Err(e) => {
            metrics.io_error(e.category());
            tracing::warn!(error = %e, "failed to read the links for the VIPs' guard; it stays as it was");
            return;
        }
    };
    let mut rules: Vec<GuardRule> = Vec::new();
    for v in vips {
        // On the link its traffic arrives on: its own, or for a routed VIP the one
        // facing the router (which would otherwise get it straight back).
        match links.iter().find(|l| l.name == v.ingress) {
            Some(l) if !rules.iter().any(|r| r.vip == v.vip.addr) => {
                rules.push(GuardRule { vip: v.vip.addr, ifindex: l.index })
            }
            Some(_) => {}
            None => tracing::warn!(
                vip = %v.vip.addr, interface = %v.ingress,
                "the VIP's interface is missing: it has no guard until the next configuration"
            ),
        }
    }
    let p = pair.to_owned();
    let n = rules.len();
    match with_nft(move |nft| nft.set_guard(&p, &rules)).await {
        Ok(()) => tracing::debug!(vips = n, "guard installed"),
        Err(e) => {
            metrics.io_error("guard");
            tracing::warn!(
                error = %e,
                "failed to install the guard: with forwarding on, this member routes packets to a VIP it does not \
                 hold back out of the VIP's link"
            );
        }
    }
}

impl Runtime {
    /// Start-up: this pair's drain tables from an earlier run are deleted (drained
    /// addresses on `lo` are the ledger's: removed as stale VIPs); the guard was replaced
    /// before.
    pub(super) async fn drain_cleanup_at_start(pair: &str) {
        let p = pair.to_owned();
        if let Err(e) = with_nft(move |n| n.remove_drain(&p)).await {
            tracing::warn!(error = %e, "failed to delete this pair's drain tables left from an earlier run");
        }
    }

    /// `DrainVips`: keep `ids` on `lo`, silently. Queues `DrainStarted`.
    pub(super) async fn drain_start(&mut self, ids: &[sm::VipId], to: &sm::NodeId) {
        self.stop_announcer();
        self.holding.store(false, Ordering::Relaxed);
        let vips: Vec<ResolvedVip> = self.vips.iter().filter(|v| ids.contains(&v.id)).cloned().collect();
        match self.try_drain(&vips).await {
            Ok(()) => {
                tracing::info!(
                    to = to.as_str(),
                    vips = vips.len(),
                    "drain: the VIPs stay on lo for established connections"
                );
                self.metrics.set_drain_active(true);
                self.start_drain_monitor();
                self.queue.push_back(sm::Input::DrainStarted { ok: true, detail: String::new() });
            }
            Err(why) => {
                self.metrics.io_error("drain");
                tracing::warn!(error = %why, category = why.category(), "failed to start a drain; the VIPs are removed at once");
                self.drain_end().await;
                for v in &vips {
                    if let Err(e) = self.nl.remove_vip(&v.vip).await {
                        tracing::error!(error = %e, "failed to remove VIP");
                    }
                }
                self.queue.push_back(sm::Input::DrainStarted { ok: false, detail: why.to_string() });
            }
        }
    }

    async fn try_drain(&mut self, vips: &[ResolvedVip]) -> Result<(), DrainError> {
        // The node's own address on each VIP's link: the source of its ARP/NS while the
        // VIP is kept (IPv6: one in the VIP's subnet, else the link-local one).
        let own = self.nl.addresses().await?;
        let links = self.nl.links().await?;
        let mut rules = Vec::new();
        for v in vips {
            let index = links.iter().find(|l| l.name == v.ingress).map(|l| l.index);
            let mine: Vec<&crate::netlink::AddrInfo> = own
                .iter()
                .filter(|a| Some(a.ifindex) == index && !a.is_havip() && a.addr.is_ipv4() == v.vip.addr.is_ipv4())
                .collect();
            // A routed VIP has no subnet of its own: any own address of its ingress link.
            let src = mine
                .iter()
                .find(|a| v.routed || crate::netlink::same_subnet(a.addr, v.vip.addr, v.subnet_prefix))
                .or_else(|| mine.iter().find(|a| matches!(a.addr, IpAddr::V6(x) if x.segments()[0] & 0xffc0 == 0xfe80)))
                .map(|a| a.addr)
                .ok_or_else(|| DrainError::NoOwnAddress { vip: v.vip.addr, ifname: v.ingress.clone() })?;
            rules.push(QuietRule { vip: v.vip.addr, own: src });
        }
        let pair = self.cfg.pair.clone();
        with_nft(move |n| n.set_quieter(&pair, &rules)).await?;
        let kept: Vec<Vip> = vips.iter().map(|v| on_lo(&v.vip)).collect();
        // Recorded first: an agent that dies from here on removes them at its next start.
        self.ledger.record(&kept)?;
        self.drain.kept = kept.clone();
        let mut leaving = Vec::new();
        for (k, v) in kept.iter().zip(vips) {
            if v.routed {
                // Not an address on `lo`: the same prefix as a connected route of both `lo`
                // and `havip0` for a moment kept FRR 8.4 advertising the old holder until
                // the drain ended (one planned move in three in the lab). A local route is
                // invisible to the speaker and keeps the VIP local: the route is withdrawn
                // the moment the address leaves `havip0`, and no segment finds the VIP
                // missing meanwhile.
                self.nl.add_local_route(v.vip.addr).await?;
                self.nl.remove_vip(&v.vip).await?;
                self.metrics.bgp_route_change("withdrawn");
            } else {
                // `Both`: the route is withdrawn now (the target advertises it already),
                // the address kept on `lo` as for any layer-2 VIP.
                if let Some(a) = &v.also_routed {
                    self.nl.remove_vip(a).await?;
                    self.metrics.bgp_route_change("withdrawn");
                }
                self.nl.add_vip(k).await?;
                leaving.push(v);
            }
        }
        // Every kept VIP on `lo` first; then the virtual MAC interfaces down before the
        // addresses leave them (see `lower_virtual_links`: an IPv6 address's removal would
        // send an MLD report from the virtual MAC, which the new holder carries now).
        let ids: Vec<sm::VipId> = leaving.iter().filter(|v| v.virtual_link).map(|v| v.id.clone()).collect();
        self.lower_virtual_links(&ids).await;
        for v in leaving {
            self.nl.remove_vip(&v.vip).await?;
        }
        Ok(())
    }

    /// Ends this member's drain (old holder): the VIPs leave `lo` (connections still open
    /// lose their path: the new holder resets them at their next segment) and the quiet
    /// tables go. Nothing to do without one.
    pub(super) async fn drain_end(&mut self) {
        if self.drain.kept.is_empty() {
            return;
        }
        self.stop_drain_monitor();
        let kept = std::mem::take(&mut self.drain.kept);
        let cut = established_on(&kept.iter().map(|v| v.addr).collect::<Vec<_>>());
        self.metrics.drain_connections_cut(cut);
        self.metrics.set_drain_connections(0);
        for k in &kept {
            let routed = self.vips.iter().any(|v| v.routed && v.vip.addr == k.addr);
            let r = if routed { self.nl.remove_local_route(k.addr).await } else { self.nl.remove_vip(k).await };
            if let Err(e) = r {
                self.metrics.io_error(e.category());
                tracing::warn!(error = %e, vip = %k.addr, "failed to remove a drained VIP from lo");
            }
        }
        let pair = self.cfg.pair.clone();
        if let Err(e) = with_nft(move |n| n.set_quieter(&pair, &[])).await {
            self.metrics.io_error("drain");
            tracing::warn!(error = %e, "failed to delete the drain's quiet tables");
        }
        self.metrics.set_drain_active(self.drain.forwarding.is_some());
        tracing::info!(connections_cut = cut, "drain ended");
    }

    /// Whether `id` is kept on `lo` by a drain now.
    pub(super) fn drained(&self, v: &ResolvedVip) -> bool {
        self.drain.kept.iter().any(|k| k.addr == v.vip.addr)
    }

    /// `Forward`: forward to `to`'s address on each VIP's link, or stop.
    pub(super) async fn drain_forward(&mut self, to: Option<sm::NodeId>) {
        self.stop_drain_monitor();
        let pair = self.cfg.pair.clone();
        let Some(peer) = to else {
            if self.drain.forwarding.take().is_some() {
                self.read_forwarded().await;
                if let Err(e) = with_nft(move |n| n.set_forwarder(&pair, &[])).await {
                    self.metrics.io_error("drain");
                    tracing::warn!(error = %e, "failed to delete the drain's forwarding tables");
                }
                self.metrics.set_drain_active(!self.drain.kept.is_empty());
                tracing::info!("drain: forwarding ended");
            }
            return;
        };
        let Some(member) = self.cfg.members.iter().find(|m| m.node == peer.as_str()) else { return };
        let links = self.nl.links().await.unwrap_or_default();
        let mut rules = Vec::new();
        for v in &self.vips {
            // The old holder's address on the VIP's link — for a routed VIP, on the link
            // facing the router (the first heartbeat path's), where it is a neighbour.
            let old = if v.routed {
                self.cfg
                    .paths
                    .first()
                    .and_then(|p| member.addresses.get(p))
                    .filter(|a| a.is_ipv4() == v.vip.addr.is_ipv4())
            } else {
                member.addresses.values().find(|a| {
                    a.is_ipv4() == v.vip.addr.is_ipv4() && crate::netlink::same_subnet(**a, v.vip.addr, v.subnet_prefix)
                })
            };
            let index = links.iter().find(|l| l.name == v.ingress).map(|l| l.index);
            // A virtual MAC VIP's segments arrive on its macvlan; the copies leave by the
            // link, where the old holder is a neighbour.
            let iif =
                if v.virtual_link { links.iter().find(|l| l.name == v.vip.ifname).map(|l| l.index) } else { index };
            match (old, index, iif) {
                (Some(old), Some(ifindex), Some(iif)) => {
                    rules.push(ForwardRule { vip: v.vip.addr, old_holder: *old, ifindex, iif })
                }
                _ => tracing::warn!(
                    vip = %v.vip.addr, peer = peer.as_str(),
                    "drain: the old holder has no address in this VIP's subnet; its connections are not forwarded"
                ),
            }
        }
        *self.drain.counted.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = (0, 0);
        match with_nft(move |n| n.set_forwarder(&pair, &rules)).await {
            Ok(()) => {
                tracing::info!(to = peer.as_str(), "drain: forwarding the old holder's connections to it");
                if std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_tcp_loose")
                    .is_ok_and(|s| s.trim() == "0")
                {
                    tracing::warn!(
                        "net.netfilter.nf_conntrack_tcp_loose is 0: segments of connections established on the old \
                         holder are not recognised and not forwarded (the drain does nothing)"
                    );
                }
                self.drain.forwarding = Some(peer);
                self.metrics.set_drain_active(true);
                self.start_drain_monitor();
            }
            Err(e) => {
                self.metrics.io_error("drain");
                tracing::warn!(error = %e, "failed to install the drain's forwarding; connections of the old holder are reset");
            }
        }
    }

    /// Reads the forwarder's counters into the metrics (new holder).
    async fn read_forwarded(&mut self) {
        let pair = self.cfg.pair.clone();
        if let Ok(counts) = with_nft(move |n| n.forwarded(&pair)).await {
            let (p, b) = counts.iter().fold((0, 0), |(p, b), (_, c)| (p + c.packets, b + c.bytes));
            record_forwarded(&self.metrics, &self.drain.counted, p, b);
        }
    }

    /// Every second while draining or forwarding: the drained connections (old holder) or
    /// the forwarded counters (new holder) into the metrics.
    fn start_drain_monitor(&mut self) {
        self.stop_drain_monitor();
        let metrics = self.metrics.clone();
        let pair = self.cfg.pair.clone();
        let addrs: Vec<IpAddr> = self.drain.kept.iter().map(|v| v.addr).collect();
        let forwarding = self.drain.forwarding.is_some();
        let counted = self.drain.counted.clone();
        self.drain.monitor = Some(tokio::spawn(async move {
            let mut timer = crate::timer::Timer::new();
            loop {
                if !addrs.is_empty() {
                    metrics.set_drain_connections(established_on(&addrs));
                }
                if forwarding {
                    let p = pair.clone();
                    if let Ok(counts) = with_nft(move |n| n.forwarded(&p)).await {
                        let (pk, by) = counts.iter().fold((0, 0), |(p, b), (_, c)| (p + c.packets, b + c.bytes));
                        record_forwarded(&metrics, &counted, pk, by);
                    }
                }
                timer.sleep(Duration::from_secs(1)).await;
            }
        }));
    }

    fn stop_drain_monitor(&mut self) {
        if let Some(m) = self.drain.monitor.take() {
            m.abort();
        }
    }

    /// The runtime stops: nothing of a drain outlives it.
    pub(super) async fn drain_stop(&mut self) {
        self.drain_end().await;
        self.drain_forward(None).await;
    }

    /// Whether this member keeps drained VIPs on `lo` now (old holder).
    pub(super) fn drain_kept(&self) -> bool {
        !self.drain.kept.is_empty()
    }

    /// A stop in the middle of a drain: the new holder may still forward here until it
    /// heard the last heartbeat or, if that was lost, until this member's silence times
    /// out. The guard stays that long (a heartbeat timeout and an interval, at most 5 s),
    /// so that those copies are dropped here rather than answered with time-exceeded
    /// (with their TTL of 1 they cannot loop either way). Other stops do not wait.
    pub(super) async fn guard_grace(&mut self) {
        let t = &self.cfg.sm.timings;
        let grace = Duration::from_millis(t.heartbeat_timeout_ms.saturating_add(t.heartbeat_interval_ms))
            .min(Duration::from_secs(5));
        tracing::debug!(
            grace_ms = grace.as_millis() as u64,
            "drain: the guard stays until the new holder stopped forwarding"
        );
        self.timer.sleep(grace).await;
    }

    /// The runtime stops: the guard goes last, after the drain's addresses and tables.
    pub(super) async fn remove_guard(&mut self) {
        let pair = self.cfg.pair.clone();
        if let Err(e) = with_nft(move |n| n.set_guard(&pair, &[])).await {
            self.metrics.io_error("guard");
            tracing::warn!(error = %e, "failed to delete the VIPs' guard");
        }
    }
}

/// Adds what the forwarder counted since the last reading to the metrics.
fn record_forwarded(metrics: &PairMetrics, counted: &std::sync::Mutex<(u64, u64)>, packets: u64, bytes: u64) {
    let mut last = counted.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    metrics.drain_forwarded(packets.saturating_sub(last.0), bytes.saturating_sub(last.1));
    *last = (packets.max(last.0), bytes.max(last.1));
}

#[cfg(test)]
mod tests {
    use super::{count_established, parse_proc_addr};
    use std::net::IpAddr;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 3200870A:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 3200870A:1F90 6400870A:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:C351 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
   3: 3200870A:1F90 6400870A:C352 06 00000000:00000000 00:00000000 00000000     0        0 0 3 0000000000000000
   4: garbage
";

    #[test]
    fn established_connections_on_the_vips_are_counted() {
        let vip: IpAddr = "10.135.0.50".parse().unwrap_or_else(|_| unreachable!());
        // The listener (0A) and the TIME_WAIT (06) do not count, nor another address.
        assert_eq!(count_established(TCP, false, &[vip]), 1);
        assert_eq!(count_established(TCP, false, &["127.0.0.1".parse().unwrap_or_else(|_| unreachable!())]), 1);
        assert_eq!(count_established(TCP, false, &[]), 0);
    }

    #[test]
    fn ipv6_addresses_parse_word_by_word() {
        // fd00:6876:87::32 as /proc/net/tcp6 prints it.
        assert_eq!(parse_proc_addr("766800FD:1F90", true), None, "one word is not an IPv6 address");
        let a = parse_proc_addr("766800FD000087000000000032000000:1F90", true);
        assert_eq!(a, Some("fd00:6876:87::32".parse().unwrap_or_else(|_| unreachable!())));
        assert_eq!(parse_proc_addr("zz:1F90", false), None);
        // ::ffff:10.135.0.50, an IPv4 connection of a dual-stack listener.
        let a = parse_proc_addr("0000000000000000FFFF00003200870A:1F90", true);
        assert_eq!(a, Some("10.135.0.50".parse().unwrap_or_else(|_| unreachable!())));
    }
}
