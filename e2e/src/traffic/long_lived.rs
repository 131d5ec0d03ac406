//! [`LongLived`] connections: many TCP connections from a namespace to echo listeners,
//! each exchanging a message every 50 ms and recording when it breaks.

use super::error::{Result, TrafficError};
use super::lines::{MAX_LINE, read_line};
use super::report::ms_between;
use crate::host::netns::{NetnsError, NetnsThread, Topology, run_in_netns};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Settings of [`LongLived`] connections.
#[derive(Debug, Clone, PartialEq)]
pub struct LongLivedConfig {
    /// Where to connect, usually `VIP:port` of [`Listener::echo`](super::Listener::echo)s.
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

/// Long-lived TCP connections from a namespace to [`Listener::echo`](super::Listener::echo)s: each sends
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
