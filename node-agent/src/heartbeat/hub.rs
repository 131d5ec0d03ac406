//! The node's heartbeat sockets, shared by every pair the agent runs.
//!
//! One UDP socket per (local address, port), bound exclusively (no `SO_REUSEPORT`, no
//! `SO_REUSEADDR`): with a reused port the kernel hashes each peer flow to one socket of
//! the group, so one pair would receive — and reject — another pair's heartbeats while
//! the other heard nothing. Here a socket's receiver reads the pair name from the header
//! ([`wire::peek_pair`]) and hands the datagram to that pair's [`Endpoint`], which
//! verifies it with that pair's keys. A datagram for a pair this agent does not run is
//! counted (`reason="unknown_pair"`) and dropped, never charged to another pair.
//!
//! Sockets are reference-counted by the pairs that use them: a reconfiguration binds the
//! new sockets before it releases the old ones, and a socket closes when its last pair
//! leaves. The hub also owns the agent's heartbeat session id (random per start, see
//! [`wire::SenderWindow`]) and the sequence counter shared by every pair.

use super::types::{Bound, Endpoint, HeartbeatError, Hub, Outgoing, Route, Routes, SocketLease};
use crate::metrics::AgentMetrics;
use havip_crds::wire;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

impl Drop for SocketLease {
    fn drop(&mut self) {
        self.hub.release(self.addr, &self.pair, &self.endpoint);
    }
}

/// Binds `addr` for this agent alone. `EADDRINUSE` gets a message that names the fix.
/// Returns the receiving side (on the reactor) and the sending side (a duplicate).
/// The receiving half is registered for readability only: the sending half is the same
/// socket, and a registration for writability too would wake the receiver's task (an
/// edge-triggered `EPOLLOUT`) after every heartbeat sent.
fn bind_exclusive(addr: SocketAddr) -> Result<(AsyncFd<std::net::UdpSocket>, std::net::UdpSocket), HeartbeatError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let io = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            HeartbeatError::PortInUse { addr }
        } else {
            HeartbeatError::Bind { addr, source }
        }
    };
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(io)?;
    if addr.is_ipv6() {
        sock.set_only_v6(true).map_err(io)?;
    }
    sock.set_nonblocking(true).map_err(io)?;
    grow_receive_buffer(&sock);
    sock.bind(&addr.into()).map_err(io)?;
    let std: std::net::UdpSocket = sock.into();
    let send = std.try_clone().map_err(io)?;
    // `with_interest` is deprecated in favour of an `unsafe` constructor (this crate forbids
    // unsafe code) because a registration could outlive a descriptor it does not own;
    // here the `AsyncFd` owns the socket, so it cannot.
    #[allow(deprecated)]
    let recv = AsyncFd::with_interest(std, Interest::READABLE).map_err(io)?;
    Ok((recv, send))
}

/// The receive buffer a heartbeat socket asks for. The kernel's default (about 208 KiB)
/// holds some 270 datagrams in flight; under a flood of forged datagrams (20,000 a second
/// and more) an agent delayed by a few milliseconds would see the kernel drop datagrams at
/// random — authentic heartbeats among them. 4 MiB holds about a quarter of a second of
/// such a flood.
pub const RECEIVE_BUFFER: usize = 4 << 20;

/// Asks for [`RECEIVE_BUFFER`]: beyond `net.core.rmem_max` with `SO_RCVBUFFORCE` (the agent
/// has CAP_NET_ADMIN), else as far as `SO_RCVBUF` allows. Best effort: a smaller buffer
/// works, it only holds less of a flood.
fn grow_receive_buffer(sock: &socket2::Socket) {
    use nix::sys::socket::{setsockopt, sockopt};
    if setsockopt(sock, sockopt::RcvBufForce, &RECEIVE_BUFFER).is_err() {
        let _ = sock.set_recv_buffer_size(RECEIVE_BUFFER);
    }
}

/// A random non-zero u64 (a session id, a challenge, a request id).
pub(crate) fn random_session() -> u64 {
    let mut b = [0u8; 8];
    loop {
        if getrandom::fill(&mut b).is_err() {
            // No entropy source: the start time still differs between two starts.
            let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
            b = (t ^ u64::from(std::process::id()).rotate_left(32)).to_be_bytes();
        }
        let id = u64::from_be_bytes(b);
        if id != 0 {
            return id;
        }
    }
}

impl Hub {
    /// A hub with a fresh session id. Sequence numbers start at the start-up time in µs,
    /// so that receivers of protocol minor 0 (no sessions) see them increase across
    /// restarts as before.
    pub fn new(metrics: Arc<AgentMetrics>) -> Arc<Self> {
        let seq0 = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(1);
        Arc::new(Self {
            session: random_session(),
            seq: AtomicU64::new(seq0),
            metrics,
            bound: Mutex::new(HashMap::new()),
            closing: Mutex::new(HashMap::new()),
            outbox: Mutex::new(Vec::new()),
            flush_wake: Arc::new(tokio::sync::Notify::new()),
            flusher: Mutex::new(None),
            bundle_readers: Mutex::new(HashSet::new()),
        })
    }

    /// Hands a heartbeat to the outbox. It leaves once every task woken in this turn of the
    /// runtime has run (the flusher is woken behind them), together with the other pairs'
    /// heartbeats to the same member address: in bundles to an agent that reads them.
    /// Outside a runtime it leaves at once.
    pub(super) fn enqueue(self: &Arc<Self>, out: Outgoing) {
        lock(&self.outbox).push(out);
        let mut flusher = lock(&self.flusher);
        if flusher.is_none() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => *flusher = Some(rt.spawn(flush_loop(Arc::downgrade(self), self.flush_wake.clone()))),
                Err(_) => {
                    drop(flusher);
                    self.flush();
                    return;
                }
            }
        }
        self.flush_wake.notify_one();
    }

    /// Sends every heartbeat in the outbox now: per (socket, member address), in the
    /// order handed over, as bundles when that address reads them and more than one is
    /// waiting, else one datagram each. Non-blocking: a full socket buffer is an error
    /// (counted), never a wait.
    pub fn flush(&self) {
        let pending = std::mem::take(&mut *lock(&self.outbox));
        if pending.is_empty() {
            return;
        }
        let mut groups: Vec<Vec<Outgoing>> = Vec::new();
        for o in pending {
            match groups.iter_mut().find(|g| g[0].local == o.local && g[0].to == o.to) {
                Some(g) => g.push(o),
                None => groups.push(vec![o]),
            }
        }
        for group in groups {
            let (sock, to) = (group[0].sock.clone(), group[0].to);
            if group.len() > 1 && lock(&self.bundle_readers).contains(&to.ip()) {
                let sections: Vec<&[u8]> = group.iter().map(|o| o.bytes.as_slice()).collect();
                let mut next = 0;
                for (datagram, n) in wire::bundle::pack(&sections) {
                    let result = sock.send_to(&datagram, to);
                    self.sent(&group[next..next + n], result.map(|_| ()), to);
                    next += n;
                }
            } else {
                for o in &group {
                    let result = sock.send_to(&o.bytes, to);
                    self.sent(std::slice::from_ref(o), result.map(|_| ()), to);
                }
            }
        }
    }

    /// Counts what one datagram carried.
    fn sent(&self, carried: &[Outgoing], result: std::io::Result<()>, to: SocketAddr) {
        match result {
            Ok(()) => {
                self.metrics.datagram_sent(if carried.len() > 1 { "bundle" } else { "single" });
                for o in carried {
                    o.sent.inc();
                }
            }
            Err(e) => {
                for _ in carried {
                    self.metrics.io_error("heartbeat_send");
                }
                tracing::debug!(peer = %to, heartbeats = carried.len(), error = %e, "heartbeat send failed");
            }
        }
    }

    /// Notes what an authentic heartbeat from `from` says of its sender: whether it reads
    /// bundles (protocol minor ≥ [`wire::BUNDLE_MINOR`]). A member downgraded to an
    /// earlier release gets single datagrams again from its first heartbeat on.
    pub(super) fn note_minor(&self, from: IpAddr, minor: u8) {
        let mut readers = lock(&self.bundle_readers);
        if minor >= wire::BUNDLE_MINOR {
            readers.insert(from);
        } else {
            readers.remove(&from);
        }
    }

    /// This agent's heartbeat session id.
    pub fn session(&self) -> u64 {
        self.session
    }

    pub(super) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// The local addresses and ports bound now (for tests and the admin status).
    pub fn bound_addresses(&self) -> Vec<SocketAddr> {
        let mut v: Vec<SocketAddr> = self.lock().keys().copied().collect();
        v.sort();
        v
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Bound>> {
        lock(&self.bound)
    }

    /// Routes the datagrams that name `pair` and arrive on `addr` to `endpoint`, binding
    /// the socket if no pair uses it yet. Another live endpoint of the same pair on the
    /// same socket is an error (two runtimes of one pair in one agent).
    pub(super) async fn acquire(
        self: &Arc<Self>,
        addr: SocketAddr,
        pair: &str,
        endpoint: &Weak<Endpoint>,
    ) -> Result<SocketLease, HeartbeatError> {
        // A socket of this address released a moment ago is still closing.
        let closing = lock(&self.closing).remove(&addr);
        if let Some(task) = closing {
            let _ = task.await;
        }
        let lease = |sock: Arc<std::net::UdpSocket>| SocketLease {
            hub: self.clone(),
            addr,
            sock,
            pair: pair.to_owned(),
            endpoint: endpoint.clone(),
        };
        let mut bound = self.lock();
        if let Some(b) = bound.get_mut(&addr) {
            let mut routes = b.routes.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            match routes.get_mut(pair) {
                Some(r) if r.endpoint.ptr_eq(endpoint) => r.leases += 1,
                Some(r) if r.endpoint.strong_count() > 0 => {
                    return Err(HeartbeatError::PairTwice { pair: pair.to_owned(), addr });
                }
                // No route, or the route of an endpoint being dropped: ours now.
                _ => {
                    routes.insert(pair.to_owned(), Route { endpoint: endpoint.clone(), leases: 1 });
                }
            }
            drop(routes);
            b.users += 1;
            return Ok(lease(b.sock.clone()));
        }
        let (recv, send) = bind_exclusive(addr)?;
        let sock = Arc::new(send);
        let routes: Routes =
            Arc::new(RwLock::new(HashMap::from([(pair.to_owned(), Route { endpoint: endpoint.clone(), leases: 1 })])));
        let task = tokio::spawn(receive(recv, addr, routes.clone(), self.metrics.clone()));
        tracing::info!(address = %addr, "heartbeat socket bound");
        bound.insert(addr, Bound { sock: sock.clone(), routes, users: 1, task });
        Ok(lease(sock))
    }

    fn release(&self, addr: SocketAddr, pair: &str, endpoint: &Weak<Endpoint>) {
        let mut bound = self.lock();
        let Some(b) = bound.get_mut(&addr) else { return };
        b.users = b.users.saturating_sub(1);
        {
            let mut routes = b.routes.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Only this endpoint's own route is touched: a newer endpoint of the same pair
            // may have replaced it on this socket.
            if let Some(r) = routes.get_mut(pair)
                && r.endpoint.ptr_eq(endpoint)
            {
                r.leases = r.leases.saturating_sub(1);
                if r.leases == 0 {
                    routes.remove(pair);
                }
            }
        }
        if b.users == 0
            && let Some(b) = bound.remove(&addr)
        {
            b.task.abort();
            lock(&self.closing).insert(addr, b.task);
            tracing::info!(address = %addr, "heartbeat socket closed");
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.flush();
        if let Some(f) = lock(&self.flusher).take() {
            f.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sends the outbox each time it is woken (after the tasks queued before it have run),
/// for as long as the hub lives.
async fn flush_loop(hub: Weak<Hub>, wake: Arc<tokio::sync::Notify>) {
    loop {
        wake.notified().await;
        let Some(hub) = hub.upgrade() else { return };
        hub.flush();
    }
}

/// The receiver of one socket: demultiplexes by pair name, and splits bundles.
async fn receive(sock: AsyncFd<std::net::UdpSocket>, local: SocketAddr, routes: Routes, metrics: Arc<AgentMetrics>) {
    let label = local.ip().to_string();
    let mut buf = vec![0u8; wire::MAX_BUNDLE + 1];
    loop {
        let received = match sock.readable().await {
            Ok(mut ready) => match ready.try_io(|s| s.get_ref().recv_from(&mut buf)) {
                Ok(r) => r,
                // Not readable after all (the readiness was stale): wait again.
                Err(_would_block) => continue,
            },
            Err(e) => Err(e),
        };
        let (n, from) = match received {
            Ok(x) => x,
            Err(e) => {
                metrics.io_error("heartbeat_recv");
                tracing::debug!(address = %local, error = %e, "heartbeat receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let datagram = &buf[..n];
        if wire::bundle::is_bundle(datagram) {
            match wire::bundle::sections(datagram) {
                Ok(sections) => {
                    for s in sections {
                        route(s, local, from, &routes, &metrics, &label);
                    }
                }
                Err(e) => metrics.dropped("", &label, e.reason()),
            }
        } else {
            route(datagram, local, from, &routes, &metrics, &label);
        }
    }
}

/// Hands one heartbeat to the endpoint of the pair it names (unauthenticated: the
/// endpoint verifies it with that pair's keys).
fn route(datagram: &[u8], local: SocketAddr, from: SocketAddr, routes: &Routes, metrics: &AgentMetrics, label: &str) {
    let endpoint = match wire::peek_pair(datagram) {
        Ok(pair) => routes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(pair)
            .and_then(|r| r.endpoint.upgrade()),
        Err(e) => {
            metrics.dropped("", label, e.reason());
            return;
        }
    };
    match endpoint {
        Some(ep) => ep.deliver(datagram, local, from),
        None => metrics.dropped("", label, "unknown_pair"),
    }
}
