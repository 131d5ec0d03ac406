//! Probes that feed the state machine: TCP connect probes of the VIP listeners,
//! gateway (fence target) reachability and duplicate-VIP detection by ARP (IPv4) and
//! neighbour solicitation (IPv6), and a
//! traffic sampler for the failback quiet window; and the observer tasks that run them
//! for a pair (`spawn_…`, [`PeerProbes`]). Probes observe and report; what a verdict
//! means is the state machine's business, never decided here.

use crate::announce::{ArpListener, ArpSeen, L2Sender, NaSeen, NdListener};
use crate::metrics::PairMetrics;
use crate::sm;
use crate::timer::Timer;
use pnet::datalink::MacAddr;
use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// One TCP connect probe: `true` when the three-way handshake completes within
/// `timeout` (the connection is closed at once).
pub async fn tcp_probe(addr: SocketAddr, timeout: Duration) -> bool {
    matches!(tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await, Ok(Ok(_)))
}

/// `GET path` over HTTP/1.0 on `addr`: true when the answer's status is 200 within
/// `timeout` (connect, request and status line together).
pub async fn http_probe(addr: SocketAddr, path: &str, timeout: Duration) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: havip-agent\r\n\r\n");
        s.write_all(request.as_bytes()).await.ok()?;
        // The status line is all that is read: "HTTP/1.x 200 …".
        let mut buf = [0u8; 64];
        let mut n = 0;
        while n < buf.len() {
            let read = s.read(&mut buf[n..]).await.ok()?;
            if read == 0 {
                break;
            }
            n += read;
            if buf[..n].contains(&b'\n') {
                break;
            }
        }
        let line = std::str::from_utf8(&buf[..n]).ok()?;
        let mut words = line.split_whitespace();
        let version = words.next()?;
        Some(version.starts_with("HTTP/") && words.next() == Some("200"))
    };
    matches!(tokio::time::timeout(timeout, exchange).await, Ok(Some(true)))
}

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
    _arp: ArpListener,
    nd: Option<NdListener>,
}

impl L2Port {
    /// Opens `ifname` for sending and listening to ARP, and to neighbour advertisements
    /// when `ipv6` (a raw ICMPv6 socket and a thread: only where IPv6 is probed).
    pub fn open(ifname: &str, ipv6: bool) -> Result<Self, crate::announce::AnnounceError> {
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
        Ok(Self { sender, book, _arp: arp, nd })
    }

    /// Whether it listens to neighbour advertisements.
    pub fn has_ipv6(&self) -> bool {
        self.nd.is_some()
    }

    /// Asks who has `target` — by ARP from `source`, or by neighbour solicitation from
    /// `source` (`0.0.0.0` / `::`: a probe that changes nobody's neighbour cache) — and
    /// waits up to `wait` for answers; returns the MACs that claimed it, excluding our
    /// own. Nothing is asked across families, nor for IPv6 on a port opened without it.
    pub async fn who_has(&self, target: IpAddr, source: IpAddr, wait: Duration) -> Vec<MacAddr> {
        let since = Instant::now();
        let sent = match (target, source) {
            (IpAddr::V4(t), IpAddr::V4(s)) => self.sender.send_arp_request(t, s),
            (IpAddr::V6(t), IpAddr::V6(s)) if self.nd.is_some() => self.sender.send_neighbor_solicitation(t, s),
            _ => return Vec::new(),
        };
        if sent.is_err() {
            return Vec::new();
        }
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

/// Gateway reachability with the "never answered → check off" rule.
#[derive(Debug, Default, Clone)]
pub struct GatewayTracker {
    ever_answered: bool,
    misses: u32,
}

impl GatewayTracker {
    /// Consecutive misses after which a gateway that answered before is unreachable.
    pub const MISSES: u32 = 3;

    /// Records one probe round (`answered`: some fence target answered) and returns
    /// the state machine's view: `None` = check off, `Some(reachable)`.
    pub fn observe(&mut self, answered: bool) -> Option<bool> {
        if answered {
            self.ever_answered = true;
            self.misses = 0;
        } else {
            self.misses = self.misses.saturating_add(1);
        }
        if !self.ever_answered { None } else { Some(self.misses < Self::MISSES) }
    }
}

/// Bytes per second over some interfaces, from `/sys/class/net/<if>/statistics`.
pub struct TrafficSampler {
    ifaces: Vec<String>,
    last: Option<(Instant, u64)>,
}

impl TrafficSampler {
    /// Samples the sum of rx+tx bytes of `ifaces`.
    pub fn new(ifaces: Vec<String>) -> Self {
        Self { ifaces, last: None }
    }

    fn total(&self) -> Option<u64> {
        let mut sum = 0u64;
        for i in &self.ifaces {
            for dir in ["rx_bytes", "tx_bytes"] {
                let s = std::fs::read_to_string(format!("/sys/class/net/{i}/statistics/{dir}")).ok()?;
                sum = sum.saturating_add(s.trim().parse::<u64>().ok()?);
            }
        }
        Some(sum)
    }

    /// The rate since the previous call (`None`: unknown — first call or unreadable).
    pub fn sample(&mut self) -> Option<u64> {
        let now = Instant::now();
        let total = self.total();
        let out = match (self.last, total) {
            (Some((t0, b0)), Some(b1)) if b1 >= b0 => {
                let secs = now.duration_since(t0).as_secs_f64();
                (secs > 0.0).then(|| ((b1 - b0) as f64 / secs) as u64)
            }
            _ => None,
        };
        self.last = total.map(|b| (now, b));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_never_answered_is_off_then_reachable_then_unreachable() {
        let mut g = GatewayTracker::default();
        assert_eq!(g.observe(false), None, "no answer ever: the check is off");
        assert_eq!(g.observe(false), None);
        assert_eq!(g.observe(true), Some(true));
        assert_eq!(g.observe(false), Some(true), "one miss is not yet unreachable");
        assert_eq!(g.observe(false), Some(true));
        assert_eq!(g.observe(false), Some(false), "three misses in a row");
        assert_eq!(g.observe(true), Some(true));
    }

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

    #[tokio::test]
    async fn tcp_probe_up_and_down() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        assert!(tcp_probe(addr, Duration::from_millis(500)).await);
        drop(l);
        assert!(!tcp_probe(addr, Duration::from_millis(500)).await, "refused is down");
    }
}

// ---------------------------------------------------------------------------------
// Observers: the tasks that run these probes for a pair and feed their verdicts to the
// state machine as `sm::Input`s, through the runtime's queue (`E` is the queue's event
// type; observers know only the inputs they produce). Each stops once the queue is
// closed (the runtime's tasks are also aborted when it stops).
// ---------------------------------------------------------------------------------

/// Probe interval through the VIPs while every peer is heard (a standby's steady state):
/// the evidence a takeover needs is gathered at the fast rate once a heartbeat is
/// overdue; this slow round only keeps the reported verdict current.
pub const SLOW_PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// Interval between two rounds of probes of the member's own listeners.
pub const LOCAL_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Listeners probed in turn per round beyond one per port (see [`spawn_local_probes`]):
/// with 100 VIPs each VIP's own listener is probed every 10 s — a listener down is acted on
/// after 10 s anyway (`listener_down_ms`) — and a wildcard listener's failure within a round.
pub const LOCAL_PROBE_ROTATION: usize = 10;

/// Gateway (fence target) probes: one ARP round this often.
const GATEWAY_PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Duplicate-VIP detection while holding: one ARP round this often.
const CONFLICT_PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// Traffic is sampled this often.
const TRAFFIC_SAMPLE_INTERVAL: Duration = Duration::from_secs(2);

/// How long an ARP request of the gateway or conflict probes waits for replies.
const ARP_WAIT: Duration = Duration::from_millis(300);

/// Data-plane probes through the VIPs while this member does not hold them: every
/// target at the fast rate while the machine needs a verdict ([`PeerProbes::urgent`]: no
/// holder heard, or its heartbeat overdue), one target per [`SLOW_PROBE_INTERVAL`]
/// otherwise, nothing while holding. The task sleeps between rounds and is woken when
/// the flags change, so an idle standby wakes for it once every two seconds.
pub struct PeerProbes {
    /// Every (VIP, address:port) to probe.
    pub targets: Vec<(sm::VipId, SocketAddr)>,
    /// The fast rate (`probe.interval`).
    pub interval: Duration,
    /// One connect's timeout.
    pub timeout: Duration,
    /// Set while this member holds the VIPs (no probes then).
    pub holding: Arc<AtomicBool>,
    /// Set while the machine needs the verdict now ([`sm::Machine::holder_overdue`]).
    pub urgent: Arc<AtomicBool>,
    /// Notified when `urgent` is set or `holding` cleared.
    pub wake: Arc<tokio::sync::Notify>,
    /// Where probe results are counted.
    pub metrics: PairMetrics,
}

impl PeerProbes {
    /// Starts probing (nothing to do without targets: the task ends at once).
    pub fn spawn<E: From<sm::Input> + Send + 'static>(self, tx: mpsc::Sender<E>) -> JoinHandle<()> {
        tokio::spawn(async move {
            if self.targets.is_empty() {
                return;
            }
            let mut slow_due = Instant::now();
            let mut next = 0usize;
            let mut timer = Timer::new();
            loop {
                if tx.is_closed() {
                    return;
                }
                // Registered before the flags are read, so a change in between wakes it.
                let woken = self.wake.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                let holding = self.holding.load(Ordering::Relaxed);
                let urgent = !holding && self.urgent.load(Ordering::Relaxed);
                let now = Instant::now();
                let round: Vec<&(sm::VipId, SocketAddr)> = if urgent {
                    // "Down" needs every target.
                    self.targets.iter().collect()
                } else if !holding && now >= slow_due {
                    // Any VIP answering means the active serves: one target per round, in turn.
                    slow_due = now + SLOW_PROBE_INTERVAL;
                    next = (next + 1) % self.targets.len();
                    vec![&self.targets[next]]
                } else {
                    Vec::new()
                };
                for (vip, addr) in round {
                    let tx = tx.clone();
                    let vip = vip.clone();
                    let addr = *addr;
                    let metrics = self.metrics.clone();
                    let timeout = self.timeout;
                    tokio::spawn(async move {
                        let up = tcp_probe(addr, timeout).await;
                        let result = if up { sm::ProbeResult::Up } else { sm::ProbeResult::Down };
                        metrics.probe("peer", up);
                        let _ = tx.send(sm::Input::PeerProbe { vip, result }.into()).await;
                    });
                }
                if urgent {
                    timer.sleep(self.interval).await;
                } else if holding {
                    woken.await;
                } else {
                    tokio::select! {
                        _ = timer.sleep_until(slow_due) => {}
                        _ = woken => {}
                    }
                }
            }
        })
    }
}

/// One of this member's own listeners: probed on the VIP while holding it, else on the
/// node's own address in the VIP's subnet (the readiness of a standby).
#[derive(Clone, Debug)]
pub struct LocalTarget {
    /// The VIP.
    pub vip: sm::VipId,
    /// Its address.
    pub vip_addr: IpAddr,
    /// The node's own address in the VIP's subnet (the VIP's when it has none).
    pub own_addr: IpAddr,
    /// The probed port.
    pub port: u16,
    /// How.
    pub check: LocalCheck,
}

/// How a local target is probed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LocalCheck {
    /// A TCP connect: on the VIP while holding it, else on the node's own address.
    Tcp,
    /// `GET <path>` over HTTP/1.0 on the node's own address; healthy on status 200.
    Http(String),
}

/// Probes this member's own listeners every [`LOCAL_PROBE_INTERVAL`] — all of them after
/// a start or a change of holding, then one per port and [`LOCAL_PROBE_ROTATION`] more in
/// turn, and every one of a port that failed — and sends their results (nothing to do
/// without targets: nothing then blocks readiness).
pub fn spawn_local_probes<E: From<sm::Input> + Send + 'static>(
    targets: Vec<LocalTarget>,
    holding: Arc<AtomicBool>,
    timeout: Duration,
    metrics: PairMetrics,
    tx: mpsc::Sender<E>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut timer = Timer::new();
        if targets.is_empty() {
            return;
        }
        // Every result probed is sent, also an unchanged one: the machine hears of a
        // listener from other probes too (the self-check after a takeover), and must not
        // keep a state this task last saw otherwise.
        let mut last: Vec<Option<bool>> = vec![None; targets.len()];
        // Probed this round: every target of a check that failed in the last round (to find
        // which), one target of every check (port and kind) — a listener on the wildcard
        // address serves them all — and the next `LOCAL_PROBE_ROTATION` in turn; so with many
        // VIPs each one's own listener is still probed every few seconds.
        let mut failing: BTreeSet<(u16, bool)> = BTreeSet::new();
        let mut next = 0usize;
        let mut last_hold = None;
        loop {
            let hold = holding.load(Ordering::Relaxed);
            // Taking or giving up the VIPs changes the addresses probed: a full round.
            let all = last_hold != Some(hold);
            last_hold = Some(hold);
            let key = |t: &LocalTarget| (t.port, matches!(t.check, LocalCheck::Http(_)));
            let mut due = vec![false; targets.len()];
            let mut seen: BTreeSet<(u16, bool)> = BTreeSet::new();
            for (i, t) in targets.iter().enumerate() {
                due[i] = all || last[i].is_none() || failing.contains(&key(t)) || seen.insert(key(t));
            }
            for _ in 0..LOCAL_PROBE_ROTATION.min(targets.len()) {
                due[next] = true;
                next = (next + 1) % targets.len();
            }
            failing.clear();
            // One probe per distinct address in a round: the VIPs of a standby all probe the
            // node's own address, usually on the same port.
            let mut round: HashMap<(SocketAddr, &LocalCheck), bool> = HashMap::new();
            for (i, t) in targets.iter().enumerate().filter(|(i, _)| due[*i]) {
                let addr = match &t.check {
                    LocalCheck::Tcp => SocketAddr::new(if hold { t.vip_addr } else { t.own_addr }, t.port),
                    LocalCheck::Http(_) => SocketAddr::new(t.own_addr, t.port),
                };
                let up = match round.get(&(addr, &t.check)) {
                    Some(up) => *up,
                    None => {
                        let up = match &t.check {
                            LocalCheck::Tcp => tcp_probe(addr, timeout).await,
                            LocalCheck::Http(path) => http_probe(addr, path, timeout).await,
                        };
                        metrics.probe("local", up);
                        round.insert((addr, &t.check), up);
                        up
                    }
                };
                if !up {
                    failing.insert(key(t));
                }
                last[i] = Some(up);
                if tx.send(sm::Input::LocalProbe { vip: t.vip.clone(), port: t.port, up }.into()).await.is_err() {
                    return;
                }
            }
            timer.sleep(LOCAL_PROBE_INTERVAL).await;
        }
    })
}

/// A gateway or fence target probed by ARP or neighbour solicitation: (target, source
/// address, port).
pub type FenceProbe = (IpAddr, IpAddr, Arc<L2Port>);

/// Asks the fence targets every 500 ms (any answer means reachable) and sends the
/// [`GatewayTracker`]'s view whenever it changes.
pub fn spawn_gateway_watch<E: From<sm::Input> + Send + 'static>(
    targets: Vec<FenceProbe>,
    tx: mpsc::Sender<E>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut timer = Timer::new();
        let mut tracker = GatewayTracker::default();
        let mut last: Option<Option<bool>> = None;
        loop {
            let mut answered = false;
            for (target, src, port) in &targets {
                if !port.who_has(*target, *src, ARP_WAIT).await.is_empty() {
                    answered = true;
                    break;
                }
            }
            let view = tracker.observe(answered);
            if last != Some(view) {
                last = Some(view);
                if tx.send(sm::Input::Gateway { reachable: view }.into()).await.is_err() {
                    return;
                }
            }
            timer.sleep(GATEWAY_PROBE_INTERVAL).await;
        }
    })
}

/// Duplicate-VIP detection every 2 s while holding: any host that answers an ARP
/// request or a neighbour solicitation for a held VIP is a conflict (this host does not
/// answer its own requests).
pub fn spawn_conflict_watch<E: From<sm::Input> + Send + 'static>(
    targets: Vec<(sm::VipId, IpAddr, Arc<L2Port>)>,
    holding: Arc<AtomicBool>,
    tx: mpsc::Sender<E>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut timer = Timer::new();
        loop {
            timer.sleep(CONFLICT_PROBE_INTERVAL).await;
            if tx.is_closed() {
                return;
            }
            if !holding.load(Ordering::Relaxed) {
                continue;
            }
            for (vip, ip, port) in &targets {
                for mac in port.who_has(*ip, unspecified_like(*ip), ARP_WAIT).await {
                    tracing::warn!(vip = %ip, foreign_mac = %mac, "a foreign host answers for a held VIP");
                    let _ = tx.send(sm::Input::Conflict { vip: vip.clone(), foreign_mac: mac.octets() }.into()).await;
                }
            }
        }
    })
}

/// Samples the traffic of the VIP interfaces every 2 s (the failback quiet window).
pub fn spawn_traffic_sampler<E: From<sm::Input> + Send + 'static>(
    ifaces: Vec<String>,
    tx: mpsc::Sender<E>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut timer = Timer::new();
        let mut sampler = TrafficSampler::new(ifaces);
        loop {
            let bps = sampler.sample();
            if tx.send(sm::Input::Traffic { bytes_per_sec: bps }.into()).await.is_err() {
                return;
            }
            timer.sleep(TRAFFIC_SAMPLE_INTERVAL).await;
        }
    })
}
