//! TCP [`Listener`]s in a namespace that answer with their node's name (plain, after an
//! HTTP request, or echoing every line), and [`respond`], the same server in the current
//! namespace.

use super::error::{Result, TrafficError};
use super::lines::MAX_LINE;
use crate::host::netns::{NetnsError, NetnsThread, Topology, run_in_netns};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

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
    /// a [`Prober`](super::Prober) sees who answered, as with [`Listener::start`]), then answers every
    /// line it reads with `<name> <line>\n` until the peer closes, so a [`LongLived`](super::LongLived)
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

/// Answers `<name>\n` to every connection on `bind` in the current network namespace
/// until `stop` is set (the `e2e-tool respond` of the kind suite).
pub fn respond(bind: SocketAddr, name: &str, stop: &AtomicBool) -> std::io::Result<()> {
    let listener = TcpListener::bind(bind)?;
    listener.set_nonblocking(true)?;
    let accepted = AtomicU64::new(0);
    serve(&listener, stop, &accepted, format!("{name}\n").as_bytes(), false);
    Ok(())
}
