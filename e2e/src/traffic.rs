//! Test traffic: TCP [`Listener`]s that answer with their node's name, and a
//! client [`Prober`] that connects to a VIP every few milliseconds and records who
//! answered and when nobody did.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use havip_e2e::netns::Topology;
//! use havip_e2e::traffic::{Listener, Prober};
//! use std::net::SocketAddr;
//! let topo = Topology::builder().nodes(2).build()?;
//! let _l0 = Listener::on_node(&topo, 0, 8080)?;
//! let _l1 = Listener::on_node(&topo, 1, 8080)?;
//! let prober = Prober::on_client(&topo, SocketAddr::from((topo.vip(0), 8080)))?;
//! // … move the VIP …
//! let report = prober.stop()?;
//! println!("{}", report.summary());
//! # Ok(()) }
//! ```
//!
//! Both run on threads that joined the namespace with
//! [`crate::netns::run_in_netns`]; no process is started.

use crate::netns::{NetnsError, NetnsThread, Topology, run_in_netns};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Errors of listeners and probers.
#[derive(Debug, thiserror::Error)]
pub enum TrafficError {
    /// Entering the namespace failed, or its thread panicked.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The listening socket could not be bound.
    #[error("failed to listen on {addr} in {ns}: {source}")]
    Bind {
        /// The namespace.
        ns: String,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A configuration value is unusable.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// A condition did not come true in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// The condition.
        what: String,
        /// How long we waited.
        timeout: Duration,
    },
}

type Result<T, E = TrafficError> = std::result::Result<T, E>;

struct Running {
    stop: Arc<AtomicBool>,
    thread: NetnsThread<()>,
    local: SocketAddr,
}

/// A TCP server in a namespace that accepts, writes `<name>\n` and closes
/// ([`Listener::http`]: reads an HTTP request first, as a health-check server would).
///
/// Bound to `0.0.0.0:port` it answers on every address of the namespace, also
/// on a VIP that an agent adds later. [`Listener::stop`] closes the listening
/// socket, so that connects get a RST; [`Listener::start_again`] reopens it.
pub struct Listener {
    ns: String,
    name: String,
    bind: SocketAddr,
    /// Read the request's head before answering.
    http: bool,
    accepted: Arc<AtomicU64>,
    running: Option<Running>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("ns", &self.ns)
            .field("name", &self.name)
            .field("bind", &self.bind)
            .field("running", &self.running.is_some())
            .field("accepted", &self.accepted())
            .finish()
    }
}

impl Listener {
    /// Starts answering `<name>\n` on `bind` inside namespace `ns`; returns once
    /// the socket listens.
    pub fn start(ns: &str, name: &str, bind: SocketAddr) -> Result<Self> {
        let mut l = Self {
            ns: ns.to_owned(),
            name: name.to_owned(),
            bind,
            http: false,
            accepted: Arc::new(AtomicU64::new(0)),
            running: None,
        };
        l.start_again()?;
        Ok(l)
    }

    /// An HTTP server on `bind` in `ns` answering every request with `status_line`
    /// (e.g. `HTTP/1.0 200 OK`) and no body: it reads the request's head first (up to
    /// 200 ms), so that closing does not reset a client whose request was unread.
    pub fn http(ns: &str, status_line: &str, bind: SocketAddr) -> Result<Self> {
        let mut l = Self {
            ns: ns.to_owned(),
            name: format!("{status_line}\r\nContent-Length: 0\r\n\r"),
            bind,
            http: true,
            accepted: Arc::new(AtomicU64::new(0)),
            running: None,
        };
        l.start_again()?;
        Ok(l)
    }

    /// A listener on `0.0.0.0:port` in node `node`'s namespace, answering with the
    /// node's name (`n<i>`).
    pub fn on_node(topo: &Topology, node: usize, port: u16) -> Result<Self> {
        let n = topo.nodes().get(node).ok_or_else(|| TrafficError::Invalid(format!("no node {node}")))?;
        Self::start(&n.ns, &n.name, SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
    }

    /// Listens again after [`Listener::stop`]; does nothing if running.
    pub fn start_again(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Ok(());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::sync_channel::<std::io::Result<SocketAddr>>(1);
        let (stop2, accepted, reply, bind, http) =
            (stop.clone(), self.accepted.clone(), format!("{}\n", self.name).into_bytes(), self.bind, self.http);
        let thread = run_in_netns(&self.ns, move || {
            let listener = match TcpListener::bind(bind).and_then(|l| {
                l.set_nonblocking(true)?;
                Ok(l)
            }) {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let _ = tx.send(listener.local_addr());
            serve(&listener, &stop2, &accepted, &reply, http);
        })?;
        match rx.recv() {
            Ok(Ok(local)) => {
                tracing::debug!(ns = %self.ns, name = %self.name, %local, "listener started");
                self.running = Some(Running { stop, thread, local });
                Ok(())
            }
            Ok(Err(source)) => {
                let _ = thread.join();
                Err(TrafficError::Bind { ns: self.ns.clone(), addr: self.bind, source })
            }
            Err(_) => Err(TrafficError::Netns(NetnsError::Panicked { ns: self.ns.clone() })),
        }
    }

    /// Closes the listening socket (connects are then refused with a RST) and
    /// waits for the thread. Idempotent.
    pub fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop.store(true, Ordering::SeqCst);
            if r.thread.join().is_err() {
                tracing::warn!(ns = %self.ns, "listener thread panicked");
            }
            tracing::debug!(ns = %self.ns, name = %self.name, "listener stopped");
        }
    }

    /// Whether it is listening.
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Connections accepted (and answered) so far, over all starts.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The bound address while running (the real port if 0 was asked for).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.running.as_ref().map(|r| r.local)
    }

    /// What it answers.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its namespace.
    pub fn ns(&self) -> &str {
        &self.ns
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(listener: &TcpListener, stop: &AtomicBool, accepted: &AtomicU64, reply: &[u8], http: bool) {
    while !stop.load(Ordering::SeqCst) {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(20u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "listener poll failed");
                return;
            }
        }
        loop {
            match listener.accept() {
                Ok((mut s, _peer)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
                    if http {
                        read_request_head(&mut s);
                    }
                    if let Err(e) = s.write_all(reply) {
                        tracing::debug!(error = %e, "listener could not answer");
                    }
                    accepted.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    break;
                }
            }
        }
    }
}

/// Reads until the blank line that ends an HTTP request's head, EOF, 4 KiB or 200 ms.
fn read_request_head(s: &mut TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut head = Vec::new();
    let mut chunk = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 4096 {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Why one probe failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize, thiserror::Error)]
pub enum ProbeError {
    /// RST to the SYN: the address is there, nothing listens.
    #[error("connection refused")]
    Refused,
    /// No answer to the SYN within the connect timeout (nobody has the address,
    /// ARP unresolved, or packets dropped).
    #[error("connect timed out")]
    ConnectTimeout,
    /// ICMP unreachable or no route (`EHOSTUNREACH`/`ENETUNREACH`).
    #[error("unreachable")]
    Unreachable,
    /// Reset after the connection was set up.
    #[error("connection reset")]
    Reset,
    /// Connected, but no name arrived within the read timeout.
    #[error("no reply within the read timeout")]
    ReadTimeout,
    /// Connected, but the peer closed without a name.
    #[error("closed without a reply")]
    NoReply,
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl ProbeError {
    fn from_io(e: &std::io::Error, connecting: bool) -> Self {
        match e.kind() {
            ErrorKind::ConnectionRefused => Self::Refused,
            ErrorKind::TimedOut | ErrorKind::WouldBlock if connecting => Self::ConnectTimeout,
            ErrorKind::TimedOut | ErrorKind::WouldBlock => Self::ReadTimeout,
            ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => Self::Unreachable,
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => Self::Reset,
            _ => Self::Other(e.to_string()),
        }
    }

    /// A short stable name (`refused`, `connect_timeout`, …) for reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::ConnectTimeout => "connect_timeout",
            Self::Unreachable => "unreachable",
            Self::Reset => "reset",
            Self::ReadTimeout => "read_timeout",
            Self::NoReply => "no_reply",
            Self::Other(_) => "other",
        }
    }
}

/// One probe: start and completion time (ms since the prober started) and outcome.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Probe {
    /// When the connect began.
    pub start_ms: f64,
    /// When the probe completed (answer read, or failure).
    pub end_ms: f64,
    /// The responder's name, or why there was none.
    pub outcome: std::result::Result<String, ProbeError>,
}

/// A failed probe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    /// When the probe began.
    pub start_ms: f64,
    /// When it failed.
    pub t_ms: f64,
    /// Why.
    pub kind: ProbeError,
}

/// Consecutive successful probes answered by the same responder (failures in
/// between do not split a run).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    /// The responder.
    pub name: String,
    /// Completion time of the first answer in the run.
    pub first_ms: f64,
    /// Completion time of the last answer in the run.
    pub last_ms: f64,
    /// Number of answers.
    pub count: usize,
}

/// The longest stretch without a successful probe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gap {
    /// Completion time of the success before it.
    pub from_ms: f64,
    /// Completion time of the success after it.
    pub to_ms: f64,
    /// Who answered before.
    pub before: String,
    /// Who answered after.
    pub after: String,
}

impl Gap {
    /// Its length.
    pub fn len_ms(&self) -> f64 {
        self.to_ms - self.from_ms
    }
}

/// What a [`Prober`] saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    /// What was probed.
    pub target: SocketAddr,
    /// Planned cadence.
    pub interval_ms: f64,
    /// How long it ran.
    pub duration_ms: f64,
    /// Probes made.
    pub attempts: usize,
    /// Probes answered with a name.
    pub ok: usize,
    /// Probes that failed.
    pub failed: usize,
    /// Cadence slots skipped because an earlier probe was still running.
    pub missed_slots: u64,
    /// Longest time between the completions of two consecutive successful
    /// probes; 0 with fewer than two successes.
    pub longest_gap_ms: f64,
    /// Where that gap was.
    pub longest_gap: Option<Gap>,
    /// Completion time of the first success.
    pub first_ok_ms: Option<f64>,
    /// Completion time of the last success.
    pub last_ok_ms: Option<f64>,
    /// Every failure, in order.
    pub failures: Vec<Failure>,
    /// Who answered, compressed into runs.
    pub runs: Vec<Run>,
    /// Every probe.
    pub timeline: Vec<Probe>,
}

impl ProbeReport {
    /// Computes the report from a timeline (probes in order of start).
    pub fn from_timeline(
        target: SocketAddr,
        interval: Duration,
        duration: Duration,
        missed_slots: u64,
        timeline: Vec<Probe>,
    ) -> Self {
        let mut failures = Vec::new();
        let mut runs: Vec<Run> = Vec::new();
        let mut longest_gap: Option<Gap> = None;
        let mut prev_ok: Option<(f64, &str)> = None;
        let (mut first_ok_ms, mut last_ok_ms) = (None, None);
        for p in &timeline {
            match &p.outcome {
                Ok(name) => {
                    first_ok_ms.get_or_insert(p.end_ms);
                    last_ok_ms = Some(p.end_ms);
                    if let Some((t, before)) = prev_ok {
                        let len = p.end_ms - t;
                        if longest_gap.as_ref().is_none_or(|g| len > g.len_ms()) {
                            longest_gap = Some(Gap {
                                from_ms: t,
                                to_ms: p.end_ms,
                                before: before.to_owned(),
                                after: name.clone(),
                            });
                        }
                    }
                    prev_ok = Some((p.end_ms, name));
                    match runs.last_mut() {
                        Some(r) if r.name == *name => {
                            r.last_ms = p.end_ms;
                            r.count += 1;
                        }
                        _ => runs.push(Run { name: name.clone(), first_ms: p.end_ms, last_ms: p.end_ms, count: 1 }),
                    }
                }
                Err(kind) => failures.push(Failure { start_ms: p.start_ms, t_ms: p.end_ms, kind: kind.clone() }),
            }
        }
        let ok = timeline.len() - failures.len();
        Self {
            target,
            interval_ms: interval.as_secs_f64() * 1e3,
            duration_ms: duration.as_secs_f64() * 1e3,
            attempts: timeline.len(),
            ok,
            failed: failures.len(),
            missed_slots,
            longest_gap_ms: longest_gap.as_ref().map_or(0.0, Gap::len_ms),
            longest_gap,
            first_ok_ms,
            last_ok_ms,
            failures,
            runs,
            timeline,
        }
    }

    /// How often the responder changed (runs − 1).
    pub fn holder_changes(&self) -> usize {
        self.runs.len().saturating_sub(1)
    }

    /// Who answered last.
    pub fn last_responder(&self) -> Option<&str> {
        self.runs.last().map(|r| r.name.as_str())
    }

    /// The responders in order of runs (`["n0", "n1", "n0"]`).
    pub fn responder_sequence(&self) -> Vec<&str> {
        self.runs.iter().map(|r| r.name.as_str()).collect()
    }

    /// The failures a planned move must not have: every failure except one that
    /// connected and then lost its connection (a reset, or no reply within the read
    /// timeout) and began across a change of responder (from `margin_ms` before the old
    /// responder's last answer to `margin_ms` after the new one's first). Such a probe's
    /// handshake straddled the flip: its SYN reached the old holder, its ACK or request
    /// the new one, which has no socket for it (a reset) or does not have the address
    /// yet (dropped) — the documented limit of a move that does not drain connections
    /// (a window of about one round trip).
    pub fn failures_beyond_the_flip(&self, margin_ms: f64) -> Vec<&Failure> {
        let flips: Vec<(f64, f64)> =
            self.runs.windows(2).map(|w| (w[0].last_ms - margin_ms, w[1].first_ms + margin_ms)).collect();
        self.failures
            .iter()
            .filter(|f| {
                let lost = matches!(f.kind, ProbeError::Reset | ProbeError::ReadTimeout);
                !lost || !flips.iter().any(|(from, to)| f.start_ms >= *from && f.start_ms <= *to)
            })
            .collect()
    }

    /// Failures counted by kind.
    pub fn failure_kinds(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for f in &self.failures {
            *m.entry(f.kind.kind()).or_insert(0) += 1;
        }
        m
    }

    /// Longest stretch of consecutive failed probes (from the start of its first
    /// to the completion of its last), as `(from_ms, to_ms, count)`.
    pub fn longest_failure_streak(&self) -> Option<(f64, f64, usize)> {
        let mut best: Option<(f64, f64, usize)> = None;
        let mut cur: Option<(f64, f64, usize)> = None;
        for p in &self.timeline {
            match &p.outcome {
                Err(_) => {
                    let c = cur.get_or_insert((p.start_ms, p.end_ms, 0));
                    c.1 = p.end_ms;
                    c.2 += 1;
                }
                Ok(_) => cur = None,
            }
            if let Some(c) = cur
                && best.is_none_or(|b| c.2 > b.2)
            {
                best = Some(c);
            }
        }
        best
    }

    /// A one-paragraph human summary.
    pub fn summary(&self) -> String {
        let runs: Vec<String> = self
            .runs
            .iter()
            .map(|r| format!("{}×{} [{:.0}..{:.0} ms]", r.name, r.count, r.first_ms, r.last_ms))
            .collect();
        format!(
            "probe {}: {} attempts in {:.0} ms, {} ok, {} failed {:?}, {} missed slots, longest gap {:.1} ms{}; runs: {}",
            self.target,
            self.attempts,
            self.duration_ms,
            self.ok,
            self.failed,
            self.failure_kinds(),
            self.missed_slots,
            self.longest_gap_ms,
            self.longest_gap
                .as_ref()
                .map(|g| format!(" ({} @{:.0} → {} @{:.0})", g.before, g.from_ms, g.after, g.to_ms))
                .unwrap_or_default(),
            runs.join(", ")
        )
    }
}

/// Prober settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ProberConfig {
    /// The address to connect to, usually `VIP:port`.
    pub target: SocketAddr,
    /// Cadence: a probe starts at every multiple of this after the start (5 ms).
    pub interval: Duration,
    /// Connect timeout (50 ms).
    pub connect_timeout: Duration,
    /// Time allowed for the name to arrive after connecting (50 ms).
    pub read_timeout: Duration,
}

impl ProberConfig {
    /// The defaults: every 5 ms, 50 ms connect and read timeouts.
    pub fn new(target: SocketAddr) -> Self {
        Self {
            target,
            interval: Duration::from_millis(5),
            connect_timeout: Duration::from_millis(50),
            read_timeout: Duration::from_millis(50),
        }
    }

    /// Sets the cadence.
    pub fn interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Sets the read timeout.
    pub fn read_timeout(mut self, d: Duration) -> Self {
        self.read_timeout = d;
        self
    }
}

#[derive(Debug, Default)]
struct Live {
    ok: AtomicU64,
    failed: AtomicU64,
    last: Mutex<Option<String>>,
}

/// Probes a TCP address from a namespace at a fixed cadence until stopped.
///
/// Probes are scheduled by absolute deadlines (`start + n × interval`): a slow
/// probe does not shift later ones; when a probe overruns, the slot that is due
/// runs at once and the ones that passed entirely are skipped and counted in
/// [`ProbeReport::missed_slots`].
#[derive(Debug)]
pub struct Prober {
    stop: Arc<AtomicBool>,
    thread: Option<NetnsThread<ProbeReport>>,
    live: Arc<Live>,
    ns: String,
}

impl Prober {
    /// Starts probing from namespace `ns`.
    pub fn start(ns: &str, config: ProberConfig) -> Result<Self> {
        if config.interval.is_zero() || config.connect_timeout.is_zero() || config.read_timeout.is_zero() {
            return Err(TrafficError::Invalid(format!("zero durations in {config:?}")));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Live::default());
        let (stop2, live2) = (stop.clone(), live.clone());
        let thread = run_in_netns(ns, move || probe_loop(&config, &stop2, &live2))?;
        Ok(Self { stop, thread: Some(thread), live, ns: ns.to_owned() })
    }

    /// Starts probing `target` from the topology's client with the default settings.
    pub fn on_client(topo: &Topology, target: SocketAddr) -> Result<Self> {
        Self::start(&topo.client().ns, ProberConfig::new(target))
    }

    /// Successful probes so far.
    pub fn ok_count(&self) -> u64 {
        self.live.ok.load(Ordering::SeqCst)
    }

    /// Failed probes so far.
    pub fn failed_count(&self) -> u64 {
        self.live.failed.load(Ordering::SeqCst)
    }

    /// Who answered the latest successful probe.
    pub fn last_responder(&self) -> Option<String> {
        self.live.last.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// Waits until a probe is answered by `name`; returns how long that took.
    pub fn wait_for_responder(&self, name: &str, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if self.last_responder().as_deref() == Some(name) {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(TrafficError::Timeout {
                    what: format!("a probe answered by {name} (last: {:?})", self.last_responder()),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until at least `n` probes in total have succeeded.
    pub fn wait_until_ok(&self, n: u64, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if self.ok_count() >= n {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(TrafficError::Timeout {
                    what: format!("{n} successful probes (have {})", self.ok_count()),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until `n` more probes have failed than when called.
    pub fn wait_for_failures(&self, n: u64, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        let base = self.failed_count();
        loop {
            if self.failed_count() >= base + n {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(TrafficError::Timeout { what: format!("{n} failed probes"), timeout });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops probing and returns the report.
    pub fn stop(mut self) -> Result<ProbeReport> {
        self.stop.store(true, Ordering::SeqCst);
        match self.thread.take() {
            Some(t) => Ok(t.join()?),
            None => Err(TrafficError::Netns(NetnsError::Panicked { ns: self.ns.clone() })),
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers `<name>\n` to every connection on `bind` in the current network namespace
/// until `stop` is set (the `e2e-tool respond` of the kind suite).
pub fn respond(bind: SocketAddr, name: &str, stop: &AtomicBool) -> std::io::Result<()> {
    let listener = TcpListener::bind(bind)?;
    listener.set_nonblocking(true)?;
    let accepted = AtomicU64::new(0);
    serve(&listener, stop, &accepted, format!("{name}\n").as_bytes(), false);
    Ok(())
}

/// Probes `config.target` from the current network namespace until `stop` is set,
/// handing every probe to `each` as it completes (the `e2e-tool probe` of the kind
/// suite streams them as JSON lines).
pub fn probe_stream(config: &ProberConfig, stop: &AtomicBool, each: &mut dyn FnMut(&Probe)) -> ProbeReport {
    probe_loop_with(config, stop, &Live::default(), each)
}

fn probe_loop(config: &ProberConfig, stop: &AtomicBool, live: &Live) -> ProbeReport {
    probe_loop_with(config, stop, live, &mut |_| {})
}

fn probe_loop_with(config: &ProberConfig, stop: &AtomicBool, live: &Live, each: &mut dyn FnMut(&Probe)) -> ProbeReport {
    let start = Instant::now();
    let ms = |t: Instant| t.duration_since(start).as_secs_f64() * 1e3;
    let interval_ns = config.interval.as_nanos().max(1);
    let mut timeline = Vec::new();
    let mut slot: u128 = 0;
    let mut missed: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        let due = start + Duration::from_nanos(u64::try_from(interval_ns * slot).unwrap_or(u64::MAX));
        let now = Instant::now();
        if now < due {
            std::thread::sleep(due - now);
            continue; // re-check the stop flag
        }
        let t0 = Instant::now();
        let outcome = probe_once(config);
        let t1 = Instant::now();
        match &outcome {
            Ok(name) => {
                live.ok.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut g) = live.last.lock()
                    && g.as_deref() != Some(name.as_str())
                {
                    *g = Some(name.clone());
                }
            }
            Err(_) => {
                live.failed.fetch_add(1, Ordering::SeqCst);
            }
        }
        let probe = Probe { start_ms: ms(t0), end_ms: ms(t1), outcome };
        each(&probe);
        timeline.push(probe);
        let next = slot + 1;
        let latest_due = t1.duration_since(start).as_nanos() / interval_ns;
        if latest_due > next {
            missed += u64::try_from(latest_due - next).unwrap_or(u64::MAX);
            slot = latest_due;
        } else {
            slot = next;
        }
    }
    ProbeReport::from_timeline(config.target, config.interval, start.elapsed(), missed, timeline)
}

/// One probe: connect, read `<name>\n`, close.
pub fn probe_once(config: &ProberConfig) -> std::result::Result<String, ProbeError> {
    let mut s = TcpStream::connect_timeout(&config.target, config.connect_timeout)
        .map_err(|e| ProbeError::from_io(&e, true))?;
    let deadline = Instant::now() + config.read_timeout;
    let mut buf = Vec::with_capacity(64);
    let mut chunk = [0u8; 256];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ProbeError::ReadTimeout);
        }
        s.set_read_timeout(Some(left)).map_err(|e| ProbeError::from_io(&e, false))?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.contains(&b'\n') || buf.len() > 1024 {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(ProbeError::from_io(&e, false)),
        }
    }
    let text = String::from_utf8_lossy(&buf);
    let name = text.lines().next().unwrap_or_default().trim();
    if name.is_empty() { Err(ProbeError::NoReply) } else { Ok(name.to_owned()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(start: f64, end: f64, name: &str) -> Probe {
        Probe { start_ms: start, end_ms: end, outcome: Ok(name.to_owned()) }
    }

    fn err(start: f64, end: f64, e: ProbeError) -> Probe {
        Probe { start_ms: start, end_ms: end, outcome: Err(e) }
    }

    fn report(timeline: Vec<Probe>) -> ProbeReport {
        ProbeReport::from_timeline(
            "10.0.0.1:80".parse().unwrap(),
            Duration::from_millis(5),
            Duration::from_millis(1000),
            3,
            timeline,
        )
    }

    #[test]
    fn empty_timeline() {
        let r = report(vec![]);
        assert_eq!((r.attempts, r.ok, r.failed), (0, 0, 0));
        assert_eq!(r.longest_gap_ms, 0.0);
        assert!(r.longest_gap.is_none());
        assert_eq!(r.holder_changes(), 0);
        assert_eq!(r.last_responder(), None);
        assert_eq!(r.longest_failure_streak(), None);
    }

    #[test]
    fn single_success_has_no_gap() {
        let r = report(vec![err(0.0, 50.0, ProbeError::ConnectTimeout), ok(50.0, 51.0, "n0")]);
        assert_eq!(r.longest_gap_ms, 0.0);
        assert_eq!(r.first_ok_ms, Some(51.0));
        assert_eq!(r.last_ok_ms, Some(51.0));
        assert_eq!(r.last_responder(), Some("n0"));
    }

    #[test]
    fn gaps_are_between_completion_times_of_successes() {
        let r = report(vec![
            ok(0.0, 1.0, "n0"),
            ok(5.0, 6.0, "n0"),
            err(10.0, 60.0, ProbeError::ConnectTimeout),
            err(60.0, 61.0, ProbeError::Refused),
            ok(65.0, 66.5, "n1"),
            ok(70.0, 71.0, "n1"),
        ]);
        assert_eq!((r.attempts, r.ok, r.failed, r.missed_slots), (6, 4, 2, 3));
        assert_eq!(r.longest_gap_ms, 60.5);
        let g = r.longest_gap.as_ref().unwrap();
        assert_eq!((g.from_ms, g.to_ms, g.before.as_str(), g.after.as_str()), (6.0, 66.5, "n0", "n1"));
        assert_eq!(r.failures.len(), 2);
        assert_eq!(r.failures[0].t_ms, 60.0);
        assert_eq!(r.failures[1].kind, ProbeError::Refused);
        assert_eq!(r.failure_kinds().get("connect_timeout"), Some(&1));
        assert_eq!(r.longest_failure_streak(), Some((10.0, 61.0, 2)));
    }

    #[test]
    fn runs_compress_consecutive_responders_across_failures() {
        let r = report(vec![
            ok(0.0, 1.0, "n0"),
            ok(5.0, 6.0, "n0"),
            err(10.0, 11.0, ProbeError::Reset),
            ok(15.0, 16.0, "n0"),
            ok(20.0, 21.0, "n1"),
            ok(25.0, 26.0, "n0"),
            ok(30.0, 31.0, "n0"),
        ]);
        assert_eq!(
            r.runs,
            vec![
                Run { name: "n0".into(), first_ms: 1.0, last_ms: 16.0, count: 3 },
                Run { name: "n1".into(), first_ms: 21.0, last_ms: 21.0, count: 1 },
                Run { name: "n0".into(), first_ms: 26.0, last_ms: 31.0, count: 2 },
            ]
        );
        assert_eq!(r.holder_changes(), 2);
        assert_eq!(r.responder_sequence(), vec!["n0", "n1", "n0"]);
        assert_eq!(r.last_responder(), Some("n0"));
        // The first of equal gaps is kept.
        assert_eq!(r.longest_gap_ms, 10.0);
        assert_eq!(r.longest_gap.as_ref().unwrap().from_ms, 6.0);
    }

    #[test]
    fn only_a_reset_across_the_flip_is_excused_on_a_planned_move() {
        let r = report(vec![
            ok(0.0, 1.0, "n0"),
            ok(5.0, 6.0, "n0"),
            err(8.0, 9.0, ProbeError::Reset),
            ok(10.0, 11.0, "n1"),
            ok(15.0, 16.0, "n1"),
        ]);
        assert!(r.failures_beyond_the_flip(2.0).is_empty(), "{:?}", r.failures);
        // A reset far from the flip, another kind of failure at the flip, or no flip.
        let far = report(vec![ok(0.0, 1.0, "n0"), err(100.0, 101.0, ProbeError::Reset), ok(200.0, 201.0, "n0")]);
        assert_eq!(far.failures_beyond_the_flip(2.0).len(), 1);
        let timeout = report(vec![ok(0.0, 1.0, "n0"), err(2.0, 9.0, ProbeError::ConnectTimeout), ok(10.0, 11.0, "n1")]);
        assert_eq!(timeout.failures_beyond_the_flip(2.0).len(), 1);
        // A connection set up with the old holder whose reply never came (its request
        // went to the new one) is the same case; one that began long before is not.
        let lost = report(vec![ok(0.0, 1.0, "n0"), err(2.0, 60.0, ProbeError::ReadTimeout), ok(10.0, 11.0, "n1")]);
        assert!(lost.failures_beyond_the_flip(2.0).is_empty());
        let early = report(vec![
            ok(0.0, 1.0, "n0"),
            ok(50.0, 51.0, "n0"),
            err(20.0, 90.0, ProbeError::ReadTimeout),
            ok(95.0, 96.0, "n1"),
        ]);
        assert_eq!(early.failures_beyond_the_flip(2.0).len(), 1);
        let late = report(vec![ok(0.0, 1.0, "n0"), ok(10.0, 11.0, "n1"), err(40.0, 41.0, ProbeError::Reset)]);
        assert_eq!(late.failures_beyond_the_flip(2.0).len(), 1);
    }

    #[test]
    fn report_serialises_to_json() {
        let r = report(vec![ok(0.0, 1.0, "n0"), err(5.0, 6.0, ProbeError::Other("x".into()))]);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["ok"], 1);
        assert_eq!(v["timeline"][0]["outcome"]["Ok"], "n0");
        assert!(r.summary().contains("1 ok"));
    }

    #[test]
    fn io_errors_are_classified() {
        let e = |k| std::io::Error::from(k);
        assert_eq!(ProbeError::from_io(&e(ErrorKind::ConnectionRefused), true), ProbeError::Refused);
        assert_eq!(ProbeError::from_io(&e(ErrorKind::TimedOut), true), ProbeError::ConnectTimeout);
        assert_eq!(ProbeError::from_io(&e(ErrorKind::WouldBlock), false), ProbeError::ReadTimeout);
        assert_eq!(ProbeError::from_io(&e(ErrorKind::HostUnreachable), true), ProbeError::Unreachable);
        assert_eq!(ProbeError::from_io(&e(ErrorKind::ConnectionReset), false), ProbeError::Reset);
    }
}
