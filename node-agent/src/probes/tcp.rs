//! TCP and HTTP probes of the data plane: through the VIPs while this member does not
//! hold them ([`PeerProbes`]), and of the member's own listeners ([`spawn_local_probes`]).
//!
//! Its observer is a task are tasks that run probes for a pair and feed their verdicts to the
//! state machine as `sm::Input`s through the runtime's queue (`E` is the queue's event
//! type; observers know only the inputs they produce). It stops once the queue is
//! closed (the runtime's tasks are also aborted when it stops).

use crate::metrics::PairMetrics;
use crate::sm;
use crate::timer::Timer;
use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// One TCP connect probe: `true` when the three-way handshake completes within
/// `timeout` (the connection is closed at once).
pub async fn tcp_probe(addr: SocketAddr, timeout: Duration) -> bool {
    matches!(tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await, Ok(Ok(_)))
}

/// How far past the agent's whole seconds the local probe rounds run: between two heartbeat
/// instants of every profile (the Fast profile's 30 ms and the Standard 100 ms both divide
/// a second, and the heartbeats go out on their multiples).
pub const LOCAL_PROBE_PHASE: Duration = Duration::from_millis(15);

/// How long a probe of a listener answers for every caller that asks for the same address
/// ([`tcp_probe_shared`]).
pub const SHARED_PROBE: Duration = Duration::from_millis(250);

/// [`tcp_probe`], shared by every caller in this network namespace that asks for the same
/// address and timeout within [`SHARED_PROBE`] of the first: one connect, its answer for
/// all. The local probes of every pair run on the agent's grid, and a standby's pairs all
/// probe the node's own address: one connect a round instead of one per pair.
pub async fn tcp_probe_shared(addr: SocketAddr, timeout: Duration) -> bool {
    type Probes = HashMap<(u64, SocketAddr, Duration), (Instant, Arc<tokio::sync::OnceCell<bool>>)>;
    static PROBES: std::sync::OnceLock<std::sync::Mutex<Probes>> = std::sync::OnceLock::new();
    let key = (crate::netlink::netns_id(), addr, timeout);
    let cell = {
        let mut probes = PROBES.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        probes.retain(|_, (since, _)| now.duration_since(*since) < SHARED_PROBE);
        probes.entry(key).or_insert_with(|| (now, Arc::default())).1.clone()
    };
    // The first caller connects; the others wait for its answer (another caller takes over
    // should it be cancelled).
    *cell.get_or_init(|| tcp_probe(addr, timeout)).await
}

/// Connects one peer probe makes at once ([`tcp_probe_any`]).
pub const PEER_PROBE_CONNECTS: usize = 3;

/// `n` connects to `addr` at once, each within `timeout`: true when any completes. A
/// lossy path (the standby's own cable, or the holder's) loses a probe only when every
/// one of its connects loses its SYN or SYN-ACK — at 30 % loss each way one connect fails
/// about half the time, three together about one time in eight — while a dead data plane
/// (refused, or nothing answering) fails all of them as before, in the same time.
pub async fn tcp_probe_any(addr: SocketAddr, timeout: Duration, n: usize) -> bool {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n.max(1) {
        set.spawn(tcp_probe(addr, timeout));
    }
    while let Some(r) = set.join_next().await {
        if matches!(r, Ok(true)) {
            set.abort_all();
            return true;
        }
    }
    false
}

/// `GET path` over HTTP/1.0 on `addr`: true when the answer's status is 200 within
/// `timeout` (connect, request and status line together).
pub async fn http_probe(addr: SocketAddr, path: &str, timeout: Duration) -> bool {
    use tokio::io::AsyncWriteExt;
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: havip-agent\r\n\r\n");
        s.write_all(request.as_bytes()).await.ok()?;
        // The status line is all that is read: "HTTP/1.x 200 …".
        super::https::read_status_is_200(&mut s).await
    };
    matches!(tokio::time::timeout(timeout, exchange).await, Ok(Some(true)))
}

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
    /// When set, the kernel's neighbour entries of the probed addresses are forgotten each
    /// time the probes turn urgent ([`crate::netlink::Netlink::forget_neighbours`]): the
    /// verdict that lets this member take over must reach whoever answers for the VIPs
    /// now, not a node an entry left from an earlier holder still names.
    pub neighbours: Option<crate::netlink::Netlink>,
    /// The VIPs' layer-2 ports (layer-2 VIPs only): while the probes are urgent, each
    /// round also asks who has each VIP (ARP, neighbour solicitation). The answer fills the
    /// kernel's neighbour entry the probes' connects wait on — forgotten when the probes
    /// turned urgent — so a lost answer on a lossy path costs one round instead of the
    /// kernel's second before it asks again (every probe failing meanwhile: the fifth
    /// 60-minute chaos run).
    pub resolvers: Vec<(IpAddr, Arc<super::L2Port>)>,
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
            let mut was_urgent = false;
            let mut addrs: Vec<std::net::IpAddr> = self.targets.iter().map(|(_, a)| a.ip()).collect();
            addrs.sort();
            addrs.dedup();
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
                if urgent
                    && !was_urgent
                    && let Some(nl) = &self.neighbours
                {
                    match nl.forget_neighbours(&addrs).await {
                        Ok(n) => {
                            tracing::debug!(forgotten = n, "probes urgent: neighbour entries of the VIPs forgotten")
                        }
                        Err(e) => {
                            self.metrics.io_error(e.category());
                            tracing::warn!(error = %e, "failed to forget the VIPs' neighbour entries before probing them");
                        }
                    }
                }
                was_urgent = urgent;
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
                if urgent {
                    for (addr, port) in &self.resolvers {
                        let (addr, port, wait) = (*addr, port.clone(), self.interval);
                        tokio::spawn(async move {
                            port.who_has(addr, super::unspecified_like(addr), wait).await;
                        });
                    }
                }
                for (vip, addr) in round {
                    let tx = tx.clone();
                    let vip = vip.clone();
                    let addr = *addr;
                    let metrics = self.metrics.clone();
                    let timeout = self.timeout;
                    tokio::spawn(async move {
                        let up = tcp_probe_any(addr, timeout, PEER_PROBE_CONNECTS).await;
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
    /// Advertised by the node's BGP speaker (`BGP`, `Both`): up only while the speaker
    /// carries routes (see [`spawn_local_probes`]).
    pub needs_speaker: bool,
}

/// How a local target is probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalCheck {
    /// A TCP connect: on the VIP while holding it, else on the node's own address.
    Tcp,
    /// `GET <path>` over HTTP/1.0 on the node's own address; healthy on status 200.
    Http(String),
    /// `GET <path>` over HTTPS on the node's own address, the server's certificate
    /// verified (the control-plane mode's `/readyz` of the local kube-apiserver).
    Https(Arc<super::https::HttpsCheck>),
}

/// Probes this member's own listeners every [`LOCAL_PROBE_INTERVAL`] — all of them after
/// a start or a change of holding, then one per port and [`LOCAL_PROBE_ROTATION`] more in
/// turn, and every one of a port that failed — and sends their results (nothing to do
/// without targets: nothing then blocks readiness).
pub fn spawn_local_probes<E: From<sm::Input> + Send + 'static>(
    targets: Vec<LocalTarget>,
    holding: Arc<AtomicBool>,
    speaker_ok: Arc<AtomicBool>,
    timeout: Duration,
    interval: Duration,
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
        // Targets that share a check (equal kind, path, TLS set-up) share its result in a
        // round: each target's check by the index of the first target with an equal one.
        let check_of: Vec<usize> =
            targets.iter().map(|t| targets.iter().position(|o| o.check == t.check).unwrap_or_default()).collect();
        loop {
            let hold = holding.load(Ordering::Relaxed);
            // Taking or giving up the VIPs changes the addresses probed: a full round.
            let all = last_hold != Some(hold);
            last_hold = Some(hold);
            let key = |t: &LocalTarget| (t.port, !matches!(t.check, LocalCheck::Tcp));
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
            let mut round: HashMap<(SocketAddr, usize), bool> = HashMap::new();
            for (i, t) in targets.iter().enumerate().filter(|(i, _)| due[*i]) {
                let addr = match &t.check {
                    LocalCheck::Tcp => SocketAddr::new(if hold { t.vip_addr } else { t.own_addr }, t.port),
                    LocalCheck::Http(_) | LocalCheck::Https(_) => SocketAddr::new(t.own_addr, t.port),
                };
                let up = match round.get(&(addr, check_of[i])) {
                    Some(up) => *up,
                    None => {
                        let up = match &t.check {
                            LocalCheck::Tcp => tcp_probe_shared(addr, timeout).await,
                            LocalCheck::Http(path) => http_probe(addr, path, timeout).await,
                            LocalCheck::Https(check) => check.probe(addr, check.timeout).await,
                        };
                        metrics.probe("local", up);
                        round.insert((addr, check_of[i]), up);
                        up
                    }
                };
                // A routed VIP's listener is as good as the route to it: while the node's
                // speaker carries nothing (no established session, or it cannot be asked),
                // the member is no ready target and a holder hands over as for a listener
                // down.
                let up = up && (!t.needs_speaker || speaker_ok.load(Ordering::Relaxed));
                if !up {
                    failing.insert(key(t));
                }
                last[i] = Some(up);
                if tx.send(sm::Input::LocalProbe { vip: t.vip.clone(), port: t.port, up }.into()).await.is_err() {
                    return;
                }
            }
            // On the agent's grid, [`LOCAL_PROBE_PHASE`] past its instants (so that a round
            // of many pairs' probes does not delay their heartbeats): every pair's round
            // in the same wakeup, and a standby's pairs share their probes of the node's own
            // listeners (`tcp_probe_shared`).
            timer.sleep_until(crate::timer::next_on_grid(Instant::now(), interval) + LOCAL_PROBE_PHASE).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::tcp_probe;
    use std::time::Duration;

    #[tokio::test]
    async fn tcp_probe_up_and_down() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        assert!(tcp_probe(addr, Duration::from_millis(500)).await);
        drop(l);
        assert!(!tcp_probe(addr, Duration::from_millis(500)).await, "refused is down");
    }

    #[tokio::test]
    async fn callers_asking_for_one_listener_at_once_share_one_connect_and_a_later_one_connects_again() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            while l.accept().await.is_ok() {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        let wait_for = |n: usize| {
            let accepted = accepted.clone();
            async move {
                let start = std::time::Instant::now();
                while accepted.load(Ordering::SeqCst) < n {
                    assert!(start.elapsed() < Duration::from_secs(2), "{n} connects never came");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let timeout = Duration::from_millis(500);
        let results = futures::future::join_all((0..10).map(|_| super::tcp_probe_shared(addr, timeout))).await;
        assert!(results.iter().all(|up| *up), "{results:?}");
        wait_for(1).await;
        // Past the sharing window, the next caller connects itself.
        tokio::time::sleep(super::SHARED_PROBE).await;
        assert!(super::tcp_probe_shared(addr, timeout).await);
        wait_for(2).await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "ten callers at once share one connect, a later one makes its own"
        );
    }
}
