//! [`HalfOpen`] connections: TCP connections from a namespace held in the middle of their
//! handshake, to be completed after a move.

use super::error::{Result, TrafficError};
use super::lines::read_line;
use super::report::ProbeError;
use crate::host::netns;
use serde::Serialize;
use std::io::{ErrorKind, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

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
        let nft =
            |args: &[&str]| -> Result<()> { netns::exec(ns, "nft", args).map(|_| ()).map_err(TrafficError::Netns) };
        nft(&["add", "table", "inet", &table])?;
        let mut h = Self { ns: ns.to_owned(), table: table.clone(), conns: Vec::new(), read_timeout: timeout };
        nft(&["add", "chain", "inet", &table, "out", "{ type filter hook output priority 0 ; policy accept ; }"])?;
        nft(&["add", "rule", "inet", &table, "out", "tcp", "sport", &range, "tcp", "flags", "==", "ack", "drop"])?;
        let ports_v: Vec<u16> = ports.collect();
        let conns = netns::in_netns(ns, move || -> std::result::Result<Vec<(u16, TcpStream)>, String> {
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
    /// (see [`Listener::echo`](super::Listener::echo)); removes the drop rule. Returns, per connection in
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
        if let Err(e) = netns::exec(&self.ns, "nft", &["delete", "table", "inet", &self.table]) {
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
