//! Executing the state machine's actions: VIP addresses, announcements, heartbeats,
//! Lease compare-and-swap, persistence and reports; and reading the VIPs back from
//! the kernel. What to do is the machine's; how is here.

use super::task::Runtime;
use super::types::{Event, Reply, ResolvedVip};
use crate::announce::{bgp, spawn_schedule};
use crate::netlink::Vip;
use crate::probes::{L2Port, tcp_probe};
use crate::sm;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The most neighbours a VIP is announced to unicast (`announce.unicastToNeighbours`).
const UNICAST_NEIGHBOURS_MAX: usize = 256;

/// A VIP the kernel refused to add is retried this often.
const VIP_ADD_RETRY: Duration = Duration::from_secs(1);

/// How long a Lease write that timed out (for the machine) is still awaited, for the log.
const LATE_CAS_LIMIT: Duration = Duration::from_secs(30);

impl Runtime {
    /// Keeps the metric of the routed VIPs held here equal to the epoch they are held
    /// under (see [`bgp::route_metric`]): a holder whose epoch moved on without adding
    /// its VIPs again (one adopted at a restart, a claim renewed under a newer epoch)
    /// advertises the newer epoch's metric. Nothing to do for layer-2 VIPs.
    pub(super) async fn sync_routed_metric(&mut self) {
        let held = match self.machine.held_epoch() {
            Some(e) if self.machine.holds_vips() => e,
            _ => return,
        };
        if self.routed_epoch == Some(held) || !self.vips.iter().any(|v| v.advertised().is_some()) {
            return;
        }
        // Tried once per epoch: a kernel that refuses is not asked again at every step.
        self.routed_epoch = Some(held);
        let metric = Some(bgp::route_metric(held));
        for a in self.vips.iter().filter_map(ResolvedVip::advertised) {
            match self.nl.add_vip_with_metric(a, metric).await {
                Ok(()) => tracing::info!(vip = %a.addr, epoch = held, "routed VIP advertises its epoch"),
                Err(e) => {
                    self.metrics.io_error(e.category());
                    tracing::warn!(error = %e, vip = %a.addr, epoch = held,
                        "failed to set the routed VIP's metric: routers prefer its path only by age until the next takeover");
                }
            }
        }
    }

    /// What the node's BGP speaker said: metrics, the reporter, and a warning when what
    /// is wrong with it changes (a member that holds routed VIPs the speaker does not
    /// advertise, or a speaker that does not answer, is unreachable however well havip
    /// holds them).
    pub(super) fn speaker_report(&mut self, r: bgp::SpeakerReport) {
        self.metrics.set_speaker(r.error.is_none(), r.sessions.len(), r.established(), r.advertised_count());
        let carries = r.carries();
        if self.speaker_ok.swap(carries, Ordering::Relaxed) != carries {
            match carries {
                true => {
                    tracing::info!("the node's BGP speaker carries routes again: routed VIPs' listeners count again")
                }
                false => tracing::warn!(
                    "the node's BGP speaker carries no route (no established session, or it cannot be asked): this member is no ready target for routed VIPs, and hands them over after 10 s if it holds them"
                ),
            }
        }
        self.reporter.speaker(&r);
        let problem = r.problem();
        if problem != self.speaker_problem {
            match &problem {
                Some(p) => tracing::warn!(
                    speaker = r.kind.map(bgp::SpeakerKind::as_str).unwrap_or("none"),
                    problem = %p,
                    "the node's BGP speaker does not carry this pair's routed VIPs"
                ),
                None => tracing::info!(
                    speaker = r.kind.map(bgp::SpeakerKind::as_str).unwrap_or("none"),
                    sessions = r.established(),
                    advertised = r.advertised_count(),
                    "the node's BGP speaker carries this pair's routed VIPs"
                ),
            }
            self.speaker_problem = problem;
        }
    }

    /// Executes one action; returns whether it changed the kernel's VIPs.
    pub(super) async fn execute(&mut self, action: sm::Action) -> bool {
        match action {
            sm::Action::Persist(p) => {
                if let Err(e) = self.state.store(&p) {
                    self.metrics.io_error("persist");
                    tracing::error!(error = %e, "failed to persist state");
                }
                false
            }
            sm::Action::DrainVips { vips, to } => {
                // The routes that follow the holder go before the VIPs leave their link.
                self.remove_holder_routes().await;
                self.drain_start(&vips, &to).await;
                true
            }
            sm::Action::Forward { to } => {
                self.drain_forward(to).await;
                false
            }
            sm::Action::AddVips(ids) => {
                // Taken back during a drain: off `lo` first, answered for again.
                self.drain_end().await;
                self.read_unicast_targets(&ids).await;
                // Recorded before they are added: a crash after the add still knows them.
                let adding: Vec<Vip> =
                    self.vips.iter().filter(|v| ids.contains(&v.id)).flat_map(|v| v.addresses().cloned()).collect();
                if let Err(e) = self.ledger.record(&adding) {
                    self.metrics.io_error("persist");
                    tracing::error!(error = %e, "failed to record the VIPs in the ledger");
                }
                let mut failed = false;
                // Routed VIPs carry the epoch they are held under as their metric.
                let epoch = self.machine.held_epoch().unwrap_or(self.machine.epoch());
                for v in self.vips.iter().filter(|v| ids.contains(&v.id)) {
                    if v.advertised().is_some() {
                        self.routed_epoch = Some(epoch);
                    }
                    // The virtual MAC interface up first: the address is answered for,
                    // and announced, from its MAC.
                    if v.virtual_link
                        && let Err(e) = self.nl.set_link_up(&v.vip.ifname, true).await
                    {
                        self.metrics.io_error(e.category());
                        tracing::error!(error = %e, ifname = %v.vip.ifname,
                            "failed to set the virtual MAC interface up; retrying in a second");
                        failed = true;
                        continue;
                    }
                    // The layer-2 address first (`Both`): answered for before advertised.
                    for a in v.addresses() {
                        let metric =
                            (a.ifname == bgp::LINK && v.advertised().is_some()).then(|| bgp::route_metric(epoch));
                        match self.nl.add_vip_with_metric(a, metric).await {
                            Ok(()) if metric.is_some() => self.metrics.bgp_route_change("advertised"),
                            Ok(()) => {}
                            Err(e) => {
                                self.metrics.io_error(e.category());
                                tracing::error!(error = %e, vip = %a.addr, ifname = %a.ifname,
                                    "failed to add VIP; retrying in a second");
                                failed = true;
                            }
                        }
                    }
                }
                if failed {
                    // Reading the VIPs back at once would make the machine ask again at
                    // once: a kernel that refuses the address would spin the agent. The
                    // read-back (and with it the retry) comes a second later.
                    let tx = self.tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(VIP_ADD_RETRY).await;
                        let _ = tx.send(Event::ObserveVips).await;
                    });
                    return false;
                }
                true
            }
            sm::Action::RemoveVips(ids) => {
                self.stop_announcer();
                // The routes that follow the holder go before the VIPs (when the machine
                // gives them all up; not for a VIP the configuration dropped).
                if !self.machine.holds_vips() {
                    self.remove_holder_routes().await;
                }
                self.drain_end().await;
                // At once, not after the step: an announcement schedule checks it.
                self.holding.store(false, Ordering::Relaxed);
                self.routed_epoch = None;
                self.lower_virtual_links(&ids).await;
                // The advertised address first (`Both`): withdrawn before it stops answering.
                for v in self.vips.iter().filter(|v| ids.contains(&v.id)) {
                    for a in v.addresses().collect::<Vec<_>>().into_iter().rev() {
                        match self.nl.remove_vip(a).await {
                            Ok(()) if v.advertised() == Some(a) => self.metrics.bgp_route_change("withdrawn"),
                            Ok(()) => {}
                            Err(e) => {
                                self.metrics.io_error(e.category());
                                tracing::error!(error = %e, "failed to remove VIP");
                            }
                        }
                    }
                }
                true
            }
            sm::Action::Announce { kind } => {
                // The machine announces only what it holds; the flag the schedule checks
                // is otherwise updated after the whole step.
                self.holding.store(true, Ordering::Relaxed);
                self.announce(kind);
                false
            }
            sm::Action::SendAdvert(advert) => {
                self.hb.send(&advert);
                false
            }
            sm::Action::CasLease { holder, new_epoch, expected_epoch } => {
                let tx = self.tx.clone();
                match self.lease.clone() {
                    None => self.queue.push_back(sm::Input::CasResult(sm::CasResult::Unavailable)),
                    Some(store) => {
                        let timeout = Duration::from_millis(self.cfg.sm.timings.cas_timeout_ms);
                        let metrics = self.metrics.clone();
                        tokio::spawn(async move {
                            let cas = store.cas(holder.as_str(), new_epoch, expected_epoch);
                            let mut cas = std::pin::pin!(cas);
                            let r = match tokio::time::timeout(timeout, &mut cas).await {
                                Ok(r) => r,
                                Err(_) => {
                                    // No answer in time: the machine goes on under the
                                    // standalone rules. The write is not abandoned (a
                                    // dropped request may still land): it runs to its
                                    // end, and what the Lease became arrives through the
                                    // watch like any other write.
                                    let _ =
                                        tx.send(Event::Input(sm::Input::CasResult(sm::CasResult::Unavailable))).await;
                                    let late = tokio::time::timeout(LATE_CAS_LIMIT, cas).await;
                                    metrics.io_error("lease_cas_late");
                                    match late {
                                        Ok(sm::CasResult::Ok { epoch }) => tracing::warn!(
                                            epoch,
                                            "a Lease write that timed out landed afterwards; the pair settles it from the Lease"
                                        ),
                                        Ok(other) => {
                                            tracing::info!(result = ?other, "a Lease write that timed out ended")
                                        }
                                        Err(_) => {
                                            tracing::warn!("a Lease write is still unanswered after its time limit")
                                        }
                                    }
                                    return;
                                }
                            };
                            let _ = tx.send(Event::Input(sm::Input::CasResult(r))).await;
                        });
                    }
                }
                false
            }
            sm::Action::RenewLease { holder, epoch } => {
                if let Some(store) = self.lease.clone() {
                    let tx = self.tx.clone();
                    // A renewal is due about once a second; one that takes longer is moot.
                    let limit = Duration::from_millis(self.cfg.sm.timings.lease_renew_ms);
                    tokio::spawn(async move {
                        match tokio::time::timeout(limit, store.renew(holder.as_str(), epoch)).await {
                            // The Lease moved on (a peer took the pair): tell the machine
                            // now rather than when the watch catches up.
                            Ok(Some((h, e))) if (h.as_ref(), e) != (Some(&holder), epoch) => {
                                let _ = tx.send(Event::Input(sm::Input::LeaseObserved { holder: h, epoch: e })).await;
                            }
                            Ok(_) => {}
                            Err(_) => tracing::debug!("Lease renewal timed out"),
                        }
                    });
                }
                false
            }
            sm::Action::Report(ev) => {
                let st = self.machine.status();
                if let sm::Event::RoleChanged { reason, .. } = &ev {
                    self.metrics.transition(reason.as_str());
                }
                if let sm::Event::OperationResult { id, ok, message } = &ev
                    && let Some(w) = self.waiters.remove(id)
                {
                    let _ = w.send(Reply::Done { ok: *ok, message: message.clone() });
                }
                self.reporter.event(&ev, &st);
                false
            }
            sm::Action::SelfCheck { conflict_probe } => {
                self.self_check(conflict_probe);
                false
            }
        }
    }

    /// Reads the pair's VIPs back from the kernel and feeds `LocalVips`.
    pub(super) async fn observe_local_vips(&mut self) {
        match self.nl.havip_addresses().await {
            Ok(addrs) => {
                // A drained VIP (kept on `lo`) is not held: the machine gave it up.
                let present: BTreeSet<sm::VipId> = self
                    .vips
                    .iter()
                    .filter(|v| !self.drained(v))
                    .filter(|v| addrs.iter().any(|a| a.addr == v.vip.addr && a.prefix == v.vip.prefix))
                    .map(|v| v.id.clone())
                    .collect();
                self.metrics.set_vips_held(present.len());
                self.sync_virtual_links(&addrs).await;
                tracing::debug!(present = present.len(), "observed the pair's VIPs in the kernel");
                self.queue.push_back(sm::Input::LocalVips { present });
            }
            Err(e) => {
                self.metrics.io_error(e.category());
                tracing::error!(error = %e, "failed to read addresses; retrying");
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let _ = tx.send(Event::ObserveVips).await;
                });
            }
        }
    }

    /// The neighbours this node knows in the subnet of each VIP of `ids` that is announced
    /// unicast too (`announce.unicastToNeighbours`), from its neighbour table on the VIP's
    /// link: read before the VIPs are added, so that the burst that follows reaches them.
    async fn read_unicast_targets(&mut self, ids: &[sm::VipId]) {
        let wanted: Vec<&ResolvedVip> =
            self.vips.iter().filter(|v| ids.contains(&v.id) && v.announce.unicast && !v.routed).collect();
        if wanted.is_empty() {
            return;
        }
        let links = self.nl.links().await.unwrap_or_default();
        let mut targets = Vec::new();
        for v in wanted {
            let Some(index) = links.iter().find(|l| l.name == v.ingress).map(|l| l.index) else { continue };
            let known = match self.nl.neighbours_on(index).await {
                Ok(n) => n,
                Err(e) => {
                    self.metrics.io_error(e.category());
                    tracing::warn!(error = %e, vip = %v.vip.addr, "failed to read the neighbours to announce the VIP to");
                    continue;
                }
            };
            targets.extend(
                known
                    .into_iter()
                    .filter(|(ip, _)| {
                        ip.is_ipv4() == v.vip.addr.is_ipv4()
                            && *ip != v.vip.addr
                            && crate::netlink::same_subnet(*ip, v.vip.addr, v.subnet_prefix)
                    })
                    .take(UNICAST_NEIGHBOURS_MAX)
                    .map(|(ip, mac)| (v.vip.addr, ip, mac)),
            );
        }
        tracing::debug!(neighbours = targets.len(), "the VIPs are also announced to these neighbours, unicast");
        self.unicast_targets.retain(|(vip, _, _)| !targets.iter().any(|(t, _, _)| t == vip));
        self.unicast_targets.extend(targets);
    }

    /// Sets down the virtual MAC interfaces of the VIPs `ids` that no VIP this member keeps
    /// holding shares, **before** their addresses go. Removing an IPv6 address sends an MLD
    /// report (it leaves the address's solicited-node group) out of its interface — from
    /// the virtual MAC — after the new holder took that MAC over: the switch learned it at
    /// this node's port again and sent the new holder's clients here until the new holder's
    /// next frame (up to a second). A link that is down sends nothing. (IPv6 addresses go
    /// with the link; removing them afterwards finds them gone, which is success.)
    pub(super) async fn lower_virtual_links(&self, ids: &[sm::VipId]) {
        let holding = self.machine.holds_vips();
        let names: BTreeSet<&str> = self
            .vips
            .iter()
            .filter(|v| v.virtual_link && ids.contains(&v.id))
            .map(|v| v.vip.ifname.as_str())
            .filter(|name| !(holding && self.vips.iter().any(|o| !ids.contains(&o.id) && o.vip.ifname == *name)))
            .collect();
        for name in names {
            if let Err(e) = self.nl.set_link_up(name, false).await {
                self.metrics.io_error(e.category());
                tracing::warn!(error = %e, ifname = name,
                    "failed to set a virtual MAC interface down before its VIPs go: the switch may send its clients here for a moment");
            }
        }
    }

    /// Sets each virtual MAC interface of the pair down when no address of havip's is left
    /// on it (after a demotion, a drain moving the VIPs to `lo`, a VIP removed from the
    /// configuration, or a start that finds one up on a standby): its MAC then leaves the
    /// link. Setting one up is [`sm::Action::AddVips`]' (before the addresses, so that
    /// the announcements from it go out).
    pub(super) async fn sync_virtual_links(&self, havip_addrs: &[crate::netlink::AddrInfo]) {
        let names: BTreeSet<&str> =
            self.vips.iter().filter(|v| v.virtual_link).map(|v| v.vip.ifname.as_str()).collect();
        if names.is_empty() {
            return;
        }
        let links = match self.nl.links().await {
            Ok(l) => l,
            Err(e) => {
                self.metrics.io_error(e.category());
                tracing::warn!(error = %e, "failed to read the links; the virtual MAC interfaces stay as they are");
                return;
            }
        };
        for l in links.iter().filter(|l| l.up && names.contains(l.name.as_str())) {
            if havip_addrs.iter().any(|a| a.ifindex == l.index) {
                continue;
            }
            if let Err(e) = self.nl.set_link_up(&l.name, false).await {
                self.metrics.io_error(e.category());
                tracing::warn!(error = %e, ifname = %l.name,
                    "failed to set an empty virtual MAC interface down: the node still accepts frames for the virtual MAC");
            }
        }
    }

    pub(super) fn stop_announcer(&mut self) {
        if let Some(a) = self.announcer.take() {
            a.abort();
        }
    }

    /// Runs the announcement schedule for every held VIP: a burst now, repeats spaced
    /// more than a second apart, then a periodic refresh until the VIPs are removed.
    pub(super) fn announce(&mut self, kind: sm::AnnounceKind) {
        self.stop_announcer();
        let vips: Vec<(ResolvedVip, Arc<L2Port>)> =
            self.vips.iter().filter_map(|v| self.l2.get(&v.vip.ifname).map(|p| (v.clone(), p.clone()))).collect();
        let Some((first, _)) = vips.first() else { return };
        let sched = first.announce.clone();
        let metrics = self.metrics.clone();
        let unicast = self.unicast_targets.clone();
        let send_all = move |count: u32| {
            for (v, port) in &vips {
                for _ in 0..count {
                    let r = port.transport().announce(v.vip.addr);
                    match r {
                        Ok(k) => metrics.announced(k),
                        Err(e) => {
                            metrics.io_error("announce");
                            tracing::warn!(error = %e, "announcement failed");
                        }
                    }
                }
                if !v.announce.unicast {
                    continue;
                }
                for (_, to, mac) in unicast.iter().filter(|(vip, _, _)| *vip == v.vip.addr) {
                    match port.transport().announce_to(v.vip.addr, *to, *mac) {
                        Ok(k) => metrics.announced(k),
                        Err(e) => {
                            metrics.io_error("announce");
                            tracing::warn!(error = %e, neighbour = %to, "unicast announcement failed");
                        }
                    }
                }
            }
        };
        self.announcer = Some(spawn_schedule(kind, sched, self.gate.clone(), self.holding.clone(), send_all));
    }

    /// After a takeover: the VIPs are read back, the local listeners probed, and a
    /// foreign holder looked for; the results come back as inputs.
    pub(super) fn self_check(&mut self, conflict_probe: bool) {
        let tx = self.tx.clone();
        let vips = self.vips.clone();
        let l2 = self.l2.clone();
        let timeout = self.cfg.probe.timeout.max(Duration::from_millis(200));
        tokio::spawn(async move {
            for v in &vips {
                for p in &v.ports {
                    let up = tcp_probe(SocketAddr::new(v.vip.addr, *p), timeout).await;
                    if !up {
                        tracing::warn!(vip = %v.vip, port = p, "self-check: listener does not answer on the VIP");
                    }
                    let _ = tx.send(Event::Input(sm::Input::LocalProbe { vip: v.id.clone(), port: *p, up })).await;
                }
                if let Some(port) = l2.get(v.probe_ifname()).filter(|_| conflict_probe) {
                    let ip = v.vip.addr;
                    for mac in port.who_has(ip, crate::probes::unspecified_like(ip), Duration::from_millis(300)).await {
                        tracing::warn!(vip = %v.vip, foreign_mac = %mac, "self-check: a foreign host answers for the VIP");
                        let _ = tx
                            .send(Event::Input(sm::Input::Conflict { vip: v.id.clone(), foreign_mac: mac.octets() }))
                            .await;
                    }
                }
            }
        });
        // The read-back.
        let tx = self.tx.clone();
        let nl = self.nl.clone();
        let vips = self.vips.clone();
        tokio::spawn(async move {
            if let Ok(addrs) = nl.havip_addresses().await {
                let present: BTreeSet<sm::VipId> =
                    vips.iter().filter(|v| addrs.iter().any(|a| a.addr == v.vip.addr)).map(|v| v.id.clone()).collect();
                if present.len() != vips.len() {
                    tracing::warn!(
                        held = present.len(),
                        expected = vips.len(),
                        "self-check: VIPs missing from the kernel"
                    );
                }
                let _ = tx.send(Event::Input(sm::Input::LocalVips { present })).await;
            }
        });
    }
}
