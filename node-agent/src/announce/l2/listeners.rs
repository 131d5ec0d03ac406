//! Listeners for the ARP and neighbour-advertisement traffic that answers the agent's
//! probes, each on a thread of its own.

use super::super::transport::AnnounceError;
use super::frames::{ArpSeen, NaSeen, parse_arp, parse_na};
use super::iface::{ETH_P_ARP, find_interface};
use pnet::datalink::{self, Channel, ChannelType};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long an L2 listener thread blocks in one read before it looks at its stop flag:
/// a read that times out is a wakeup of an idle agent, so it is long; a dropped listener
/// ends within it.
const L2_LISTENER_POLL: Duration = Duration::from_secs(2);

/// Receives the neighbour advertisements that reach this host on one interface (a
/// raw ICMPv6 socket bound to it, on a dedicated thread) and hands each to a callback.
/// Stops when dropped.
pub struct NdListener {
    stop: Arc<AtomicBool>,
}

impl NdListener {
    /// Starts listening on `ifname` (needs CAP_NET_RAW); `on_na` runs on the listener
    /// thread.
    pub fn start(ifname: &str, on_na: impl Fn(NaSeen) + Send + 'static) -> Result<Self, AnnounceError> {
        use socket2::{Domain, Protocol, Socket, Type};
        let open_err = |source| AnnounceError::Open { ifname: ifname.to_owned(), source };
        let socket = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6)).map_err(open_err)?;
        socket.bind_device(Some(ifname.as_bytes())).map_err(open_err)?;
        socket.set_read_timeout(Some(L2_LISTENER_POLL)).map_err(open_err)?;
        // A datagram socket for `recv`: a raw ICMPv6 socket hands over one ICMPv6
        // message per read, without the IPv6 header.
        let socket = std::net::UdpSocket::from(socket);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let name = ifname.to_owned();
        std::thread::Builder::new()
            .name(format!("nd-{ifname}"))
            .spawn(move || {
                let mut buf = [0u8; 1500];
                while !stop2.load(Ordering::Relaxed) {
                    match socket.recv(&mut buf) {
                        Ok(n) => {
                            if let Some(na) = parse_na(&buf[..n]) {
                                on_na(na);
                            }
                        }
                        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        }
                        Err(e) => {
                            tracing::warn!(ifname = %name, error = %e, "neighbour advertisement listener read failed");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })
            .map_err(open_err)?;
        Ok(Self { stop })
    }
}

impl Drop for NdListener {
    fn drop(&mut self) {
        // Not joined: the thread sees the flag at its next packet or read timeout (at most
        // `L2_LISTENER_POLL`) and ends; waiting for it here would stall the caller's task.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Receives every ARP packet on one interface (a dedicated thread) and hands each to
/// a callback. Stops when dropped.
pub struct ArpListener {
    stop: Arc<AtomicBool>,
}

impl ArpListener {
    /// Starts listening on `ifname`; `on_arp` runs on the listener thread.
    pub fn start(ifname: &str, on_arp: impl Fn(ArpSeen) + Send + 'static) -> Result<Self, AnnounceError> {
        let (iface, _) = find_interface(ifname)?;
        let config = datalink::Config {
            channel_type: ChannelType::Layer3(ETH_P_ARP),
            read_timeout: Some(L2_LISTENER_POLL),
            ..Default::default()
        };
        let open_err = |source| AnnounceError::Open { ifname: ifname.to_owned(), source };
        let mut rx = match datalink::channel(&iface, config).map_err(open_err)? {
            Channel::Ethernet(_tx, rx) => rx,
            _ => return Err(open_err(std::io::Error::other("unsupported channel type"))),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let name = ifname.to_owned();
        std::thread::Builder::new()
            .name(format!("arp-{ifname}"))
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    match rx.next() {
                        Ok(payload) => {
                            if let Some(seen) = parse_arp(payload) {
                                on_arp(seen);
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                        Err(e) => {
                            tracing::warn!(ifname = %name, error = %e, "ARP listener read failed");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })
            .map_err(open_err)?;
        Ok(Self { stop })
    }
}

impl Drop for ArpListener {
    fn drop(&mut self) {
        // Not joined, as for `NdListener`.
        self.stop.store(true, Ordering::Relaxed);
    }
}
