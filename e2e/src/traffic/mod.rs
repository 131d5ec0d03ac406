//! Test traffic: TCP [`Listener`]s that answer with their node's name, a client
//! [`Prober`] that connects to a VIP every few milliseconds and records who answered
//! and when nobody did, [`LongLived`] connections that exchange a message every 50 ms
//! and record when they break, and [`HalfOpen`] connections held in the middle of their
//! handshake (the client sent its SYN and got the SYN-ACK; the server has not seen the
//! ACK yet) to be completed after a move.
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
//! [`crate::host::netns::run_in_netns`]; no process is started.

pub mod loops;

use crate::host::netns::{NetnsError, NetnsThread, Topology, run_in_netns};
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
/// ([`Listener::http`]: reads an HTTP request first, as a health-check server would;
/// [`Listener::echo`]: writes `<name>\n` and keeps the connection, answering each line
/// with `<name> <line>`).
///
/// Bound to `0.0.0.0:port` it answers on every address of the namespace, also
/// on a VIP that an agent adds later. [`Listener::stop`] closes the listening
/// socket, so that connects get a RST; [`Listener::start_again`] reopens it.
pub struct Listener {
    ns: String,
    name: String,
    bind: SocketAddr,
    mode: Mode,
    accepted: Arc<AtomicU64>,
    running: Option<Running>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("ns", &self.ns)
            .field("name", &self.name)
            .field("bind", &self.bind)
            .field("mode", &self.mode)
            .field("running", &self.running.is_some())
            .field("accepted", &self.accepted())
            .finish()
    }
}

/// What a [`Listener`] does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Write the name, close.
    Name,
    /// Read an HTTP request's head, write the reply, close.
    Http,
    /// Write the name, then answer every line with `<name> <line>` until the peer closes.
    Echo,
}

impl Listener {
    /// Starts answering `<name>\n` on `bind` inside namespace `ns`; returns once
    /// the socket listens.
    pub fn start(ns: &str, name: &str, bind: SocketAddr) -> Result<Self> {
        let mut l = Self {
            ns: ns.to_owned(),
            name: name.to_owned(),
            bind,
            mode: Mode::Name,
            accepted: Arc::new(AtomicU64::new(0)),
            running: None,
        };
        l.start_again()?;
        Ok(l)
    }

    /// An echo server on `bind` in `ns`: it greets every connection with `<name>\n` (so
    /// a [`Prober`] sees who answered, as with [`Listener::start`]), then answers every
    /// line it reads with `<name> <line>\n` until the peer closes, so a [`LongLived`]
    /// connection learns with every message which node still serves it. One thread
    /// serves every connection (poll); `TCP_NODELAY` on each, so an answer never waits
    /// for the client's delayed ACK of the one before.
    pub fn echo(ns: &str, name: &str, bind: SocketAddr) -> Result<Self> {
        let mut l = Self {
            ns: ns.to_owned(),
            name: name.to_owned(),
            bind,
            mode: Mode::Echo,
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
            mode: Mode::Http,
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
        let (stop2, accepted, name, bind, mode) =
            (stop.clone(), self.accepted.clone(), self.name.clone(), self.bind, self.mode);
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
            match mode {
                Mode::Echo => serve_echo(&listener, &stop2, &accepted, &name),
                Mode::Name | Mode::Http => {
                    serve(&listener, &stop2, &accepted, format!("{name}\n").as_bytes(), mode == Mode::Http)
                }
            }
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

    /// Whether it echoes ([`Listener::echo`]).
    pub fn is_echo(&self) -> bool {
        self.mode == Mode::Echo
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

/// One connection of [`serve_echo`]: its socket and the bytes of an unfinished line.
struct EchoConn {
    stream: TcpStream,
    pending: Vec<u8>,
}

/// The longest line [`serve_echo`] buffers; a peer that sends more without a newline is
/// not one of ours and is dropped.
const MAX_LINE: usize = 4096;

/// [`Listener::echo`]'s loop: one poll over the listening socket and every connection.
fn serve_echo(listener: &TcpListener, stop: &AtomicBool, accepted: &AtomicU64, name: &str) {
    let greeting = format!("{name}\n");
    let mut conns: Vec<EchoConn> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let ready: Vec<bool> = {
            let mut fds = Vec::with_capacity(conns.len() + 1);
            fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
            fds.extend(conns.iter().map(|c| PollFd::new(c.stream.as_fd(), PollFlags::POLLIN)));
            match poll(&mut fds, PollTimeout::from(20u16)) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "echo listener poll failed");
                    return;
                }
            }
            fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect()
        };
        // Connections first (their indices are 1..), then new ones.
        let mut i = 0;
        conns.retain_mut(|c| {
            i += 1;
            !ready.get(i).copied().unwrap_or(false) || echo_lines(c, name)
        });
        if ready.first().copied().unwrap_or(false) {
            loop {
                match listener.accept() {
                    Ok((mut stream, _peer)) => {
                        accepted.fetch_add(1, Ordering::SeqCst);
                        let ok = stream.set_nonblocking(true).is_ok()
                            && stream.set_nodelay(true).is_ok()
                            && stream.write_all(greeting.as_bytes()).is_ok();
                        if ok {
                            conns.push(EchoConn { stream, pending: Vec::new() });
                        }
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
}

/// Reads what `c` has, answers every complete line; false once the connection is over
/// (EOF, an error, or an answer that did not fit into the socket buffer at once).
fn echo_lines(c: &mut EchoConn, name: &str) -> bool {
    let mut chunk = [0u8; 1024];
    loop {
        match c.stream.read(&mut chunk) {
            Ok(0) => return false,
            Ok(n) => c.pending.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    while let Some(end) = c.pending.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = c.pending.drain(..=end).collect();
        let mut reply = Vec::with_capacity(name.len() + 1 + line.len());
        reply.extend_from_slice(name.as_bytes());
        reply.push(b' ');
        reply.extend_from_slice(&line);
        // Answers are a few dozen bytes on an otherwise idle socket: a full send buffer
        // means the peer stopped reading, and the connection is dropped.
        if c.stream.write_all(&reply).is_err() {
            return false;
        }
    }
    c.pending.len() <= MAX_LINE
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
            // EPIPE: a write after the connection was reset.
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => Self::Reset,
            _ => Self::Other(e.to_string()),
        }
    }

    /// The connection was never set up (refused, connect timeout, unreachable), as
    /// opposed to one that was set up and then lost.
    pub fn is_connect_failure(&self) -> bool {
        matches!(self, Self::Refused | Self::ConnectTimeout | Self::Unreachable)
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

    /// The report of the probes that began in `[from_ms, to_ms)` (same time base; the
    /// duration is the window's, missed slots are not known per window and are 0).
    pub fn slice(&self, from_ms: f64, to_ms: f64) -> ProbeReport {
        let timeline: Vec<Probe> =
            self.timeline.iter().filter(|p| p.start_ms >= from_ms && p.start_ms < to_ms).cloned().collect();
        // An open window (`to_ms` infinite) lasts until the report's end.
        let span = to_ms.min(self.duration_ms) - from_ms.max(0.0);
        let secs = |ms: f64| Duration::try_from_secs_f64((ms / 1e3).max(0.0)).unwrap_or_default();
        let (duration, interval) = (secs(span), secs(self.interval_ms));
        ProbeReport::from_timeline(self.target, interval, duration, 0, timeline)
    }

    /// Connection attempts that never connected: refused, connect timeout, unreachable.
    pub fn failed_connects(&self) -> usize {
        self.failures.iter().filter(|f| f.kind.is_connect_failure()).count()
    }

    /// Connections reset after they were set up.
    pub fn resets(&self) -> usize {
        self.failures.iter().filter(|f| f.kind == ProbeError::Reset).count()
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
    epoch: Instant,
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
        let epoch = Instant::now();
        let thread = run_in_netns(ns, move || probe_loop_with(&config, epoch, &stop2, &live2, &mut |_| {}))?;
        Ok(Self { stop, thread: Some(thread), live, ns: ns.to_owned(), epoch })
    }

    /// Starts `n` probers from `ns` with the same settings, their cadences spread evenly
    /// over one interval (prober `k` starts `k × interval / n` after the first): `n`
    /// concurrent clients.
    pub fn start_many(ns: &str, config: &ProberConfig, n: usize) -> Result<Vec<Self>> {
        let mut out = Vec::with_capacity(n);
        let step = config.interval / u32::try_from(n.max(1)).unwrap_or(u32::MAX);
        let first = Instant::now();
        for k in 0..n {
            // A phase offset, not synchronisation: the cadences must not coincide.
            let due = first + step * u32::try_from(k).unwrap_or(u32::MAX);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            out.push(Self::start(ns, config.clone())?);
        }
        Ok(out)
    }

    /// The instant its report's times count from (`start_ms` 0).
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// `t` in the report's time base: ms since [`Prober::epoch`] (negative before it).
    pub fn ms_at(&self, t: Instant) -> f64 {
        ms_between(self.epoch, t)
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
    probe_loop_with(config, Instant::now(), stop, &Live::default(), each)
}

/// `to − from` in ms, negative when `to` is earlier.
fn ms_between(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(from.duration_since(to).as_secs_f64() * 1e3),
    }
}

fn probe_loop_with(
    config: &ProberConfig,
    start: Instant,
    stop: &AtomicBool,
    live: &Live,
    each: &mut dyn FnMut(&Probe),
) -> ProbeReport {
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

// ---------------------------------------------------------------------------------
// Long-lived connections.

/// Settings of [`LongLived`] connections.
#[derive(Debug, Clone, PartialEq)]
pub struct LongLivedConfig {
    /// Where to connect, usually `VIP:port` of [`Listener::echo`]s.
    pub target: SocketAddr,
    /// How many connections (20).
    pub connections: usize,
    /// Every connection sends a message this often (50 ms), the connections' cadences
    /// spread evenly over it.
    pub interval: Duration,
    /// An answer that has not arrived this long after its message breaks the connection
    /// ([`BreakKind::Timeout`]; 1 s: beyond one TCP retransmission, 200 ms minimum RTO).
    pub reply_timeout: Duration,
    /// Connect timeout of each connection, and time allowed for its greeting (2 s).
    pub connect_timeout: Duration,
}

impl LongLivedConfig {
    /// 20 connections to `target`, a message every 50 ms each, 1 s reply timeout.
    pub fn new(target: SocketAddr) -> Self {
        Self {
            target,
            connections: 20,
            interval: Duration::from_millis(50),
            reply_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
        }
    }

    /// Sets the number of connections.
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n;
        self
    }

    /// Sets the reply timeout.
    pub fn reply_timeout(mut self, d: Duration) -> Self {
        self.reply_timeout = d;
        self
    }
}

/// How a long-lived connection ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum BreakKind {
    /// Reset by the peer (`ECONNRESET`, or `EPIPE` on a write after one).
    Reset,
    /// The server closed it (EOF).
    Eof,
    /// No answer within the reply timeout.
    Timeout,
    /// An answer that is not the echo of the message sent (another server, or garbage).
    WrongEcho(String),
    /// Any other error.
    Other(String),
}

impl BreakKind {
    fn from_io(e: &std::io::Error) -> Self {
        match e.kind() {
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => Self::Reset,
            ErrorKind::TimedOut => Self::Timeout,
            _ => Self::Other(e.to_string()),
        }
    }

    /// A short stable name (`reset`, `eof`, `timeout`, `wrong_echo`, `other`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Reset => "reset",
            Self::Eof => "eof",
            Self::Timeout => "timeout",
            Self::WrongEcho(_) => "wrong_echo",
            Self::Other(_) => "other",
        }
    }
}

/// The end of a long-lived connection.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Break {
    /// When it was noticed (ms since the connections' epoch).
    pub t_ms: f64,
    /// How.
    pub kind: BreakKind,
}

/// One long-lived connection: who serves it and whether (and when) it broke.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ConnReport {
    /// Its index (0..connections).
    pub index: usize,
    /// Its local address.
    pub local: Option<SocketAddr>,
    /// The server that greeted it (the node that accepted it).
    pub server: String,
    /// Messages sent.
    pub sent: u64,
    /// Correct answers received.
    pub echoed: u64,
    /// The longest time from a message to its answer.
    pub longest_reply_ms: f64,
    /// When the last correct answer arrived.
    pub last_echo_ms: Option<f64>,
    /// How it ended, if it did.
    pub broken: Option<Break>,
}

/// What [`LongLived`] connections saw.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct LongLivedReport {
    /// Where they were connected.
    pub target: SocketAddr,
    /// How long they ran (ms since the epoch).
    pub duration_ms: f64,
    /// Every connection.
    pub connections: Vec<ConnReport>,
}

impl LongLivedReport {
    /// Connections that broke.
    pub fn broken(&self) -> usize {
        self.connections.iter().filter(|c| c.broken.is_some()).count()
    }

    /// Connections that broke in `[from_ms, to_ms)`.
    pub fn broken_between(&self, from_ms: f64, to_ms: f64) -> Vec<&ConnReport> {
        self.connections
            .iter()
            .filter(|c| c.broken.as_ref().is_some_and(|b| b.t_ms >= from_ms && b.t_ms < to_ms))
            .collect()
    }

    /// Breaks counted by kind.
    pub fn break_kinds(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for b in self.connections.iter().filter_map(|c| c.broken.as_ref()) {
            *m.entry(b.kind.kind()).or_insert(0) += 1;
        }
        m
    }

    /// Connections per server that greeted them.
    pub fn servers(&self) -> BTreeMap<&str, usize> {
        let mut m = BTreeMap::new();
        for c in &self.connections {
            *m.entry(c.server.as_str()).or_insert(0) += 1;
        }
        m
    }

    /// A one-paragraph human summary.
    pub fn summary(&self) -> String {
        let worst = self.connections.iter().map(|c| c.longest_reply_ms).fold(0.0, f64::max);
        let breaks: Vec<String> = self
            .connections
            .iter()
            .filter_map(|c| c.broken.as_ref().map(|b| format!("#{} {} @{:.0}", c.index, b.kind.kind(), b.t_ms)))
            .collect();
        format!(
            "{} long-lived connections to {} for {:.0} ms, servers {:?}, {} broken {:?}, longest reply {:.1} ms{}",
            self.connections.len(),
            self.target,
            self.duration_ms,
            self.servers(),
            self.broken(),
            self.break_kinds(),
            worst,
            if breaks.is_empty() { String::new() } else { format!(": {}", breaks.join(", ")) }
        )
    }
}

/// A live connection of the [`LongLived`] loop.
struct LiveConn {
    stream: TcpStream,
    read: Vec<u8>,
    seq: u64,
    next_send: Instant,
    /// The message waiting for its answer: (its text, when it was sent).
    outstanding: Option<(String, Instant)>,
}

/// Long-lived TCP connections from a namespace to [`Listener::echo`]s: each sends
/// `<index> <seq>\n` every [`LongLivedConfig::interval`] and expects `<server> <index>
/// <seq>\n` back, where `<server>` is the node that greeted it when it connected. A
/// connection that is reset, closed, answered wrongly or not within the reply timeout
/// is recorded as broken (with the time) and not reopened.
///
/// One thread in the namespace drives every connection (poll); [`LongLived::start`]
/// returns once all of them are connected and greeted.
#[derive(Debug)]
pub struct LongLived {
    stop: Arc<AtomicBool>,
    thread: Option<NetnsThread<LongLivedReport>>,
    live: Arc<Mutex<Vec<ConnReport>>>,
    ns: String,
    epoch: Instant,
}

impl LongLived {
    /// Opens the connections from `ns` and starts talking; fails if one cannot connect
    /// or is not greeted within the connect timeout.
    pub fn start(ns: &str, config: LongLivedConfig) -> Result<Self> {
        if config.connections == 0 || config.interval.is_zero() || config.reply_timeout.is_zero() {
            return Err(TrafficError::Invalid(format!("no connections or zero durations in {config:?}")));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Mutex::new(Vec::new()));
        let epoch = Instant::now();
        let (tx, rx) = mpsc::sync_channel::<std::result::Result<(), String>>(1);
        let (stop2, live2) = (stop.clone(), live.clone());
        let thread = run_in_netns(ns, move || {
            let conns = match connect_all(&config, epoch) {
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return LongLivedReport { target: config.target, duration_ms: 0.0, connections: Vec::new() };
                }
            };
            let (conns, reports): (Vec<LiveConn>, Vec<ConnReport>) = conns.into_iter().unzip();
            if let Ok(mut g) = live2.lock() {
                *g = reports.clone();
            }
            let _ = tx.send(Ok(()));
            long_lived_loop(&config, epoch, &stop2, &live2, conns, reports)
        })?;
        match rx.recv() {
            Ok(Ok(())) => Ok(Self { stop, thread: Some(thread), live, ns: ns.to_owned(), epoch }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(TrafficError::Invalid(format!("long-lived connections from {ns}: {e}")))
            }
            Err(_) => Err(TrafficError::Netns(NetnsError::Panicked { ns: ns.to_owned() })),
        }
    }

    /// [`LongLived::start`] from the topology's client with the defaults and `n`
    /// connections.
    pub fn on_client(topo: &Topology, target: SocketAddr, n: usize) -> Result<Self> {
        Self::start(&topo.client().ns, LongLivedConfig::new(target).connections(n))
    }

    /// The instant the report's times count from.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Now, in the report's time base.
    pub fn now_ms(&self) -> f64 {
        ms_between(self.epoch, Instant::now())
    }

    /// `t` in the report's time base.
    pub fn ms_at(&self, t: Instant) -> f64 {
        ms_between(self.epoch, t)
    }

    /// The connections as they are now.
    pub fn snapshot(&self) -> Vec<ConnReport> {
        self.live.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// Connections broken so far.
    pub fn broken_count(&self) -> usize {
        self.snapshot().iter().filter(|c| c.broken.is_some()).count()
    }

    /// Waits until every connection has had `more` correct answers more than in
    /// `before` (a snapshot): all of them are alive and served now.
    pub fn wait_all_echoed(&self, before: &[ConnReport], more: u64, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let now = self.snapshot();
            let behind: Vec<usize> = now
                .iter()
                .filter(|c| {
                    let base = before.iter().find(|b| b.index == c.index).map_or(0, |b| b.echoed);
                    c.echoed < base + more
                })
                .map(|c| c.index)
                .collect();
            if behind.is_empty() && !now.is_empty() {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(TrafficError::Timeout {
                    what: format!("{more} more answers on every long-lived connection (behind: {behind:?})"),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until at least `n` connections have broken.
    pub fn wait_broken(&self, n: usize, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let broken = self.broken_count();
            if broken >= n {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(TrafficError::Timeout { what: format!("{n} broken connections (have {broken})"), timeout });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Closes the connections and returns the report.
    pub fn stop(mut self) -> Result<LongLivedReport> {
        self.stop.store(true, Ordering::SeqCst);
        match self.thread.take() {
            Some(t) => Ok(t.join()?),
            None => Err(TrafficError::Netns(NetnsError::Panicked { ns: self.ns.clone() })),
        }
    }
}

impl Drop for LongLived {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connects and reads the greeting of every connection (in the namespace's thread).
fn connect_all(config: &LongLivedConfig, epoch: Instant) -> std::result::Result<Vec<(LiveConn, ConnReport)>, String> {
    let n = u32::try_from(config.connections).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(config.connections);
    let first_send = Instant::now() + config.interval;
    for index in 0..config.connections {
        let mut stream = TcpStream::connect_timeout(&config.target, config.connect_timeout)
            .map_err(|e| format!("connection {index} to {}: {e}", config.target))?;
        let setup = |s: &TcpStream| -> std::io::Result<()> {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(config.connect_timeout))
        };
        setup(&stream).map_err(|e| format!("connection {index}: {e}"))?;
        let (server, rest) = read_line(&mut stream).map_err(|e| format!("greeting of connection {index}: {e}"))?;
        stream.set_nonblocking(true).map_err(|e| format!("connection {index}: {e}"))?;
        let phase = config.interval * u32::try_from(index).unwrap_or(u32::MAX) / n.max(1);
        let report = ConnReport {
            index,
            local: stream.local_addr().ok(),
            server,
            sent: 0,
            echoed: 0,
            longest_reply_ms: 0.0,
            last_echo_ms: Some(ms_between(epoch, Instant::now())),
            broken: None,
        };
        out.push((LiveConn { stream, read: rest, seq: 0, next_send: first_send + phase, outstanding: None }, report));
    }
    Ok(out)
}

/// Reads one line (blocking, with the socket's read timeout); returns it and whatever
/// came after it.
fn read_line(s: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        if let Some(end) = got.iter().position(|b| *b == b'\n') {
            let rest = got.split_off(end + 1);
            let line = String::from_utf8_lossy(&got).trim().to_owned();
            return Ok((line, rest));
        }
        match s.read(&mut chunk) {
            Ok(0) => return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "closed before a full line")),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if got.len() > MAX_LINE {
            return Err(std::io::Error::new(ErrorKind::InvalidData, "line too long"));
        }
    }
}

fn long_lived_loop(
    config: &LongLivedConfig,
    epoch: Instant,
    stop: &AtomicBool,
    live: &Mutex<Vec<ConnReport>>,
    mut conns: Vec<LiveConn>,
    mut reports: Vec<ConnReport>,
) -> LongLivedReport {
    let ms = |t: Instant| ms_between(epoch, t);
    let mut alive: Vec<bool> = vec![true; conns.len()];
    while !stop.load(Ordering::SeqCst) && alive.iter().any(|a| *a) {
        let mut changed = false;
        // Send what is due, break what waited too long.
        let now = Instant::now();
        for (i, c) in conns.iter_mut().enumerate() {
            if !alive[i] {
                continue;
            }
            if let Some((_, sent)) = &c.outstanding {
                if now.duration_since(*sent) > config.reply_timeout {
                    reports[i].broken = Some(Break { t_ms: ms(now), kind: BreakKind::Timeout });
                    alive[i] = false;
                    changed = true;
                }
                continue;
            }
            if now < c.next_send {
                continue;
            }
            c.seq += 1;
            let msg = format!("{i} {}", c.seq);
            match c.stream.write_all(format!("{msg}\n").as_bytes()) {
                Ok(()) => {
                    reports[i].sent += 1;
                    c.outstanding = Some((msg, now));
                }
                Err(e) => {
                    reports[i].broken = Some(Break { t_ms: ms(now), kind: BreakKind::from_io(&e) });
                    alive[i] = false;
                }
            }
            changed = true;
            // The cadence is absolute; after a stall the next message goes at once.
            c.next_send += config.interval;
            if c.next_send < now {
                c.next_send = now + config.interval;
            }
        }
        // Wait for answers until the next send or deadline (at most 20 ms: the stop flag).
        let mut wake = Instant::now() + Duration::from_millis(20);
        for (_, c) in conns.iter().enumerate().filter(|(i, _)| alive[*i]) {
            let due = match &c.outstanding {
                Some((_, sent)) => *sent + config.reply_timeout,
                None => c.next_send,
            };
            wake = wake.min(due);
        }
        let idx: Vec<usize> = (0..conns.len()).filter(|i| alive[*i]).collect();
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd> =
                idx.iter().map(|i| PollFd::new(conns[*i].stream.as_fd(), PollFlags::POLLIN)).collect();
            let left = wake.saturating_duration_since(Instant::now());
            let timeout = PollTimeout::try_from(left.as_millis().min(20)).unwrap_or(PollTimeout::ZERO);
            match poll(&mut fds, timeout) {
                Ok(_) => fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect(),
                Err(nix::errno::Errno::EINTR) => vec![false; idx.len()],
                Err(e) => {
                    tracing::warn!(error = %e, "long-lived poll failed");
                    break;
                }
            }
        };
        for (k, i) in idx.into_iter().enumerate() {
            if !ready.get(k).copied().unwrap_or(false) {
                continue;
            }
            changed = true;
            if let Err(kind) = read_answers(&mut conns[i], &mut reports[i], epoch) {
                reports[i].broken = Some(Break { t_ms: ms(Instant::now()), kind });
                alive[i] = false;
            }
        }
        if changed && let Ok(mut g) = live.lock() {
            g.clone_from(&reports);
        }
    }
    LongLivedReport { target: config.target, duration_ms: ms(Instant::now()), connections: reports }
}

/// Reads what connection `c` has and checks its answers.
fn read_answers(c: &mut LiveConn, r: &mut ConnReport, epoch: Instant) -> std::result::Result<(), BreakKind> {
    let mut chunk = [0u8; 1024];
    loop {
        match c.stream.read(&mut chunk) {
            Ok(0) => return Err(BreakKind::Eof),
            Ok(n) => c.read.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(BreakKind::from_io(&e)),
        }
    }
    while let Some(end) = c.read.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = c.read.drain(..=end).collect();
        let line = String::from_utf8_lossy(&line).trim().to_owned();
        let Some((msg, sent)) = c.outstanding.take() else {
            return Err(BreakKind::WrongEcho(format!("unasked answer {line:?}")));
        };
        if line != format!("{} {msg}", r.server) {
            return Err(BreakKind::WrongEcho(format!("{line:?} for {msg:?} of {}", r.server)));
        }
        let now = Instant::now();
        r.echoed += 1;
        r.longest_reply_ms = r.longest_reply_ms.max(now.duration_since(sent).as_secs_f64() * 1e3);
        r.last_echo_ms = Some(ms_between(epoch, now));
    }
    if c.read.len() > MAX_LINE {
        return Err(BreakKind::WrongEcho("a line too long".into()));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Connections held in the middle of their handshake.

/// Why a [`HalfOpen`] connection failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct HalfOpenFailure {
    /// The connection's source port.
    pub port: u16,
    /// What happened (see [`ProbeError::kind`]).
    pub kind: ProbeError,
}

/// A [`HalfOpen`] connection completed: its source port, and the server that answered or
/// why none did.
pub type Completed = (u16, std::result::Result<String, ProbeError>);

/// TCP connections from a namespace held in the middle of their handshake: each has a
/// source port of its own, the client sent its SYN and got the SYN-ACK (the client
/// side is established) but the client's ACK is dropped by an nftables rule in the
/// client's namespace, so the server still holds a request socket (`SYN_RECV`) and its
/// listener has not accepted. [`HalfOpen::complete`] sends a line on each: its ACK
/// completes the handshake wherever it arrives — at the server that answered the SYN,
/// or at a node that never saw it, which resets it.
///
/// Used across a move: open before, complete after, and the connections that straddle
/// the move come out as they would with real clients whose ACK or request arrived just
/// after the flip. Only the ACK without data is dropped (exactly `ack` in the TCP
/// flags), so segments with data, FINs and RSTs pass.
#[derive(Debug)]
pub struct HalfOpen {
    ns: String,
    table: String,
    conns: Vec<(u16, TcpStream)>,
    read_timeout: Duration,
}

impl HalfOpen {
    /// Opens `ports.len()` connections from `ns` to `target`, one from each source port
    /// (ports below the ephemeral range, so nothing else holds them; each must not have
    /// a connection to `target` in `TIME_WAIT`). Returns once every client side is
    /// established; fails when one is not within `timeout`.
    pub fn open(ns: &str, target: SocketAddr, ports: std::ops::Range<u16>, timeout: Duration) -> Result<Self> {
        if ports.is_empty() {
            return Err(TrafficError::Invalid("no source ports".into()));
        }
        let table = format!("hvhalfopen_{}_{}", ports.start, ports.end);
        let range = format!("{}-{}", ports.start, ports.end - 1);
        let nft = |args: &[&str]| -> Result<()> {
            crate::host::netns::exec(ns, "nft", args).map(|_| ()).map_err(TrafficError::Netns)
        };
        nft(&["add", "table", "inet", &table])?;
        let mut h = Self { ns: ns.to_owned(), table: table.clone(), conns: Vec::new(), read_timeout: timeout };
        nft(&["add", "chain", "inet", &table, "out", "{ type filter hook output priority 0 ; policy accept ; }"])?;
        nft(&["add", "rule", "inet", &table, "out", "tcp", "sport", &range, "tcp", "flags", "==", "ack", "drop"])?;
        let ports_v: Vec<u16> = ports.collect();
        let conns = crate::host::netns::in_netns(ns, move || -> std::result::Result<Vec<(u16, TcpStream)>, String> {
            ports_v.into_iter().map(|p| half_connect(target, p, timeout).map(|s| (p, s))).collect()
        })?
        .map_err(|e| TrafficError::Invalid(format!("half-open connections from {ns} to {target}: {e}")))?;
        h.conns = conns;
        Ok(h)
    }

    /// How many connections it holds.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Sends `half <port>\n` on every connection and reads the greeting and the echo
    /// (see [`Listener::echo`]); removes the drop rule. Returns, per connection in
    /// order, the server that answered or why none did.
    pub fn complete(self) -> Vec<Completed> {
        self.complete_and_keep().0
    }

    /// [`HalfOpen::complete`], and the connections that completed, still open (closed
    /// when dropped).
    pub fn complete_and_keep(mut self) -> (Vec<Completed>, Vec<TcpStream>) {
        let mut out = Vec::with_capacity(self.conns.len());
        // Data first on every connection, so they all complete at about the same time.
        let mut sent = Vec::with_capacity(self.conns.len());
        for (port, s) in &mut self.conns {
            let r = s.write_all(format!("half {port}\n").as_bytes()).map_err(|e| ProbeError::from_io(&e, false));
            sent.push(r);
        }
        self.remove_rule();
        for ((port, s), r) in self.conns.iter_mut().zip(sent) {
            let result = r.and_then(|()| {
                s.set_read_timeout(Some(self.read_timeout)).map_err(|e| ProbeError::from_io(&e, false))?;
                let (server, mut rest) = read_line(s).map_err(|e| match e.kind() {
                    ErrorKind::UnexpectedEof => ProbeError::NoReply,
                    _ => ProbeError::from_io(&e, false),
                })?;
                // The echo, unless it came with the greeting.
                if !rest.contains(&b'\n') {
                    let (more, _) = read_line(s).map_err(|e| ProbeError::from_io(&e, false))?;
                    rest = more.into_bytes();
                }
                let echo = String::from_utf8_lossy(&rest).trim().to_owned();
                if echo == format!("{server} half {port}") {
                    Ok(server)
                } else {
                    Err(ProbeError::Other(format!("greeted by {server}, answered {echo:?}")))
                }
            });
            out.push((*port, result));
        }
        let open = std::mem::take(&mut self.conns)
            .into_iter()
            .zip(&out)
            .filter(|(_, (_, r))| r.is_ok())
            .map(|((_, s), _)| s)
            .collect();
        (out, open)
    }

    fn remove_rule(&mut self) {
        if self.table.is_empty() {
            return;
        }
        if let Err(e) = crate::host::netns::exec(&self.ns, "nft", &["delete", "table", "inet", &self.table]) {
            tracing::warn!(ns = %self.ns, table = %self.table, error = %e, "could not remove the half-open rule");
        }
        self.table.clear();
    }
}

impl Drop for HalfOpen {
    fn drop(&mut self) {
        self.remove_rule();
    }
}

/// A client connection from source port `port` whose handshake's last ACK the caller's
/// rule drops: returns once the client side is established.
fn half_connect(target: SocketAddr, port: u16, timeout: Duration) -> std::result::Result<TcpStream, String> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let local: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, port).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, port).into(),
    };
    let s = Socket::new(Domain::for_address(target), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| format!("socket: {e}"))?;
    s.set_reuse_address(true).map_err(|e| format!("SO_REUSEADDR: {e}"))?;
    s.bind(&SockAddr::from(local)).map_err(|e| format!("bind port {port}: {e}"))?;
    s.set_tcp_nodelay(true).map_err(|e| format!("TCP_NODELAY: {e}"))?;
    s.connect_timeout(&SockAddr::from(target), timeout).map_err(|e| format!("connect from port {port}: {e}"))?;
    Ok(TcpStream::from(s))
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
    fn a_slice_is_the_report_of_the_probes_that_began_in_it() {
        let r = report(vec![
            ok(0.0, 1.0, "n0"),
            err(5.0, 55.0, ProbeError::ConnectTimeout),
            ok(55.0, 56.0, "n1"),
            err(60.0, 61.0, ProbeError::Reset),
            ok(65.0, 66.0, "n1"),
        ]);
        let s = r.slice(4.0, 64.0);
        assert_eq!((s.attempts, s.ok, s.failed), (3, 1, 2));
        assert_eq!((s.failed_connects(), s.resets()), (1, 1));
        assert_eq!(s.duration_ms, 60.0);
        let open = r.slice(50.0, f64::INFINITY);
        assert_eq!((open.attempts, open.longest_gap_ms), (3, 10.0));
        assert_eq!(open.duration_ms, 950.0, "an open window ends with the report");
        assert_eq!((r.failed_connects(), r.resets()), (1, 1));
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
