//! One interface's layer-2 sender and listeners ([`L2Port`]), shared by the gateway and
//! conflict probes and the announcer, and the book of who claimed which address.

use crate::announce::{AnnounceError, ArpListener, ArpSeen, L2Sender, NaSeen, NdListener, Transport};
use pnet::datalink::MacAddr;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an ARP request of the gateway or conflict probes waits for replies.
pub(crate) const ARP_WAIT: Duration = Duration::from_millis(300);

/// A question of [`L2Port::who_has`] asked again this soon after the same one was sent
/// shares it: an answer recorded since then is the answer (every pair's gateway watch
/// asks the same gateway from the same address, on the same grid).
pub(crate) const SHARED_QUESTION: Duration = Duration::from_millis(100);

/// Remembers who claimed which address on an interface — ARP packets for IPv4,
/// neighbour advertisements for IPv6 — so that probes can ask "who answered for this IP
/// since then?".
#[derive(Default)]
pub struct NeighborBook {
    seen: Mutex<HashMap<IpAddr, Vec<(MacAddr, Instant)>>>,
    /// Wakes the probes waiting for an answer (instead of polling the book).
    recorded: tokio::sync::Notify,
}

impl NeighborBook {
    /// Records that `mac` claimed `ip` (an ARP request counts too: a GARP from a
    /// foreign holder is a claim).
    pub fn record(&self, ip: IpAddr, mac: MacAddr) {
        if ip.is_unspecified() {
            return;
        }
        let mut m = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let v = m.entry(ip).or_default();
        v.retain(|(old, at)| *old != mac && at.elapsed() < Duration::from_secs(30));
        v.push((mac, Instant::now()));
        drop(m);
        self.recorded.notify_waiters();
    }

    /// Records an ARP packet.
    pub fn record_arp(&self, a: ArpSeen) {
        self.record(IpAddr::V4(a.sender_ip), a.sender_mac);
    }

    /// Records a neighbour advertisement (one without a link-layer address option is a
    /// claim by an unknown MAC, recorded as 00:00:00:00:00:00).
    pub fn record_na(&self, na: NaSeen) {
        self.record(IpAddr::V6(na.target), na.mac.unwrap_or(MacAddr::zero()));
    }

    /// MACs that claimed `ip` since `since`.
    pub fn claimants_since(&self, ip: IpAddr, since: Instant) -> Vec<MacAddr> {
        let m = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        m.get(&ip).map(|v| v.iter().filter(|(_, at)| *at >= since).map(|(mac, _)| *mac).collect()).unwrap_or_default()
    }
}

/// A layer-2 sender plus listeners on one interface — ARP always, IPv6 neighbour
/// advertisements when opened for IPv6 — shared by the gateway and conflict probes and
/// the announcer.
pub struct L2Port {
    /// The sender.
    pub sender: L2Sender,
    /// Who claimed which address.
    pub book: Arc<NeighborBook>,
    /// When each (target, source) question was last sent: a question asked again within
    /// [`SHARED_QUESTION`] waits for the answers to that one instead of sending another.
    asked: Mutex<HashMap<(IpAddr, IpAddr), Instant>>,
    _arp: ArpListener,
    nd: Option<NdListener>,
}

impl L2Port {
    /// Opens `ifname` for sending and listening to ARP, and to neighbour advertisements
    /// when `ipv6` (a raw ICMPv6 socket and a thread: only where IPv6 is probed).
    pub fn open(ifname: &str, ipv6: bool) -> Result<Self, AnnounceError> {
        let sender = L2Sender::open(ifname)?;
        let book = Arc::new(NeighborBook::default());
        let b = book.clone();
        let arp = ArpListener::start(ifname, move |a| b.record_arp(a))?;
        let nd = if ipv6 {
            let b = book.clone();
            Some(NdListener::start(ifname, move |na| b.record_na(na))?)
        } else {
            None
        };
        Ok(Self { sender, book, asked: Mutex::default(), _arp: arp, nd })
    }

    /// The agent's port of `ifname`, shared by every pair that uses the interface (one
    /// sender, one ARP listener and, once any pair needs IPv6, one neighbour listener per
    /// interface, not per pair): the open one when it serves `ipv6`, else a new one, which
    /// later requests then share. A port closes when its last pair lets go of it.
    pub fn shared(ifname: &str, ipv6: bool) -> Result<Arc<Self>, AnnounceError> {
        static PORTS: crate::netlink::SharedMap<(u64, String), L2Port> = std::sync::OnceLock::new();
        // Per network namespace: an interface name means another interface in another one.
        let key = (crate::netlink::netns_id(), ifname.to_owned());
        crate::netlink::shared_in(&PORTS, key, |p| p.has_ipv6() || !ipv6, || Self::open(ifname, ipv6))
    }

    /// The transport that announces VIPs on this interface.
    pub fn transport(&self) -> &dyn Transport {
        &self.sender
    }

    /// Whether it listens to neighbour advertisements.
    pub fn has_ipv6(&self) -> bool {
        self.nd.is_some()
    }

    /// Asks who has `target` — by ARP from `source`, or by neighbour solicitation from
    /// `source` (`0.0.0.0` / `::`: a probe that changes nobody's neighbour cache) — and
    /// waits up to `wait` for answers; returns the MACs that claimed it, excluding our
    /// own. Every call sends its question (a resolver asking each round needs each answer).
    pub async fn who_has(&self, target: IpAddr, source: IpAddr, wait: Duration) -> Vec<MacAddr> {
        let now = Instant::now();
        if !self.ask(target, source, now) {
            return Vec::new();
        }
        self.answers_since(target, now, wait).await
    }

    /// [`Self::who_has`] for a question several pairs ask on the same grid (a gateway
    /// check): the same question sent less than [`SHARED_QUESTION`] ago is not sent
    /// again — the answers recorded since it are the answers.
    pub async fn who_has_shared(&self, target: IpAddr, source: IpAddr, wait: Duration) -> Vec<MacAddr> {
        let now = Instant::now();
        let shared = {
            let mut asked = self.asked.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            asked.retain(|_, at| now.duration_since(*at) < SHARED_QUESTION);
            asked.get(&(target, source)).copied()
        };
        let since = match shared {
            Some(at) => at,
            None if self.ask(target, source, now) => now,
            None => return Vec::new(),
        };
        self.answers_since(target, since, wait).await
    }

    /// Sends the question (false: not sent — another family, or the send failed).
    fn ask(&self, target: IpAddr, source: IpAddr, now: Instant) -> bool {
        let sent = match (target, source) {
            (IpAddr::V4(t), IpAddr::V4(s)) => self.sender.send_arp_request(t, s),
            (IpAddr::V6(t), IpAddr::V6(s)) if self.nd.is_some() => self.sender.send_neighbor_solicitation(t, s),
            _ => return false,
        };
        if sent.is_err() {
            return false;
        }
        self.asked.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert((target, source), now);
        true
    }

    /// The MACs (not ours) that claimed `target` since `since`, waiting until `since +
    /// wait` for the first.
    async fn answers_since(&self, target: IpAddr, since: Instant, wait: Duration) -> Vec<MacAddr> {
        let deadline = tokio::time::Instant::from_std(since + wait);
        loop {
            // Registered before the book is read, so an answer recorded in between wakes it.
            let recorded = self.book.recorded.notified();
            tokio::pin!(recorded);
            recorded.as_mut().enable();
            let found: Vec<MacAddr> =
                self.book.claimants_since(target, since).into_iter().filter(|m| *m != self.sender.mac()).collect();
            if !found.is_empty() || tokio::time::Instant::now() >= deadline {
                return found;
            }
            // An answer or the deadline; either way the book is read again above.
            let _ = tokio::time::timeout_at(deadline, recorded).await;
        }
    }
}

/// The unspecified address of `ip`'s family: the source of a probe that changes
/// nobody's neighbour cache.
pub fn unspecified_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

#[cfg(test)]
mod tests {
    use super::NeighborBook;
    use crate::announce::{ArpSeen, NaSeen};
    use pnet::datalink::MacAddr;
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::{Duration, Instant};

    #[test]
    fn neighbor_book_reports_claimants_after_a_point_in_time() {
        let book = NeighborBook::default();
        let ip = Ipv4Addr::new(10, 0, 0, 5);
        let mac = MacAddr::new(2, 0, 0, 0, 0, 1);
        let before = Instant::now();
        book.record_arp(ArpSeen { op: 2, sender_mac: mac, sender_ip: ip, target_ip: Ipv4Addr::new(10, 0, 0, 1) });
        assert_eq!(book.claimants_since(IpAddr::V4(ip), before), vec![mac]);
        std::thread::sleep(Duration::from_millis(2));
        assert!(book.claimants_since(IpAddr::V4(ip), Instant::now()).is_empty());
        assert!(book.claimants_since(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 6)), before).is_empty());
        // IPv6: an advertisement names its target; one without a MAC is an unknown one.
        let v6: std::net::Ipv6Addr = "2001:db8::10".parse().expect("ip");
        book.record_na(NaSeen { target: v6, mac: Some(mac) });
        book.record_na(NaSeen { target: v6, mac: None });
        assert_eq!(book.claimants_since(IpAddr::V6(v6), before), vec![mac, MacAddr::zero()]);
        assert!(book.claimants_since(IpAddr::V4(ip), Instant::now()).is_empty(), "families apart");
    }
}
