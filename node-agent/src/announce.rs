//! Layer-2 announcements and probes: gratuitous ARP, unsolicited IPv6 neighbour
//! advertisements, ARP requests and IPv6 neighbour solicitations (duplicate-VIP and
//! gateway probes), and listeners for the ARP and neighbour-advertisement traffic that
//! answers them.
//!
//! Kernel facts this module is built on:
//! - Linux updates an *existing* neighbour entry at once (even inside the 1 s
//!   `locktime`) only for a gratuitous ARP, and `arp_is_garp()` requires sender IP ==
//!   target IP; for ARP *replies* it also requires target MAC == sender MAC. So the
//!   GARP is an ARP **request** with `spa == tpa`, broadcast (see [`garp_frame`]).
//!   `arp_accept=0` (the default) means a GARP never *creates* an entry; clients that
//!   have none ARP for the VIP and get the new holder's answer.
//! - An unsolicited NA must carry the Override flag, go to all-nodes (ff02::1) with hop
//!   limit 255 and a target link-layer address option, or receivers ignore it.
//!
//! - A neighbour solicitation from the unspecified address (`::`, a DAD probe) is
//!   answered by the address's holder with an NA to all-nodes and changes nobody's
//!   neighbour cache — the IPv6 form of an RFC 5227 ARP probe — but makes a host whose
//!   copy of the address is still tentative give it up. So `::` is used only for the
//!   VIPs (where that is right: the VIP is ours); gateways are asked from an own address.
//!
//! Sending uses a raw `AF_PACKET` socket opened with protocol 0, which receives
//! nothing (no copy of the host's traffic); receiving ARP uses a `SOCK_DGRAM` packet
//! socket bound to `ETH_P_ARP` on one interface, which sees only ARP; receiving
//! neighbour advertisements uses a raw ICMPv6 socket bound to the interface, which sees
//! only ICMPv6 (after netfilter's input hook, like any packet for this host).

use pnet::datalink::{self, Channel, ChannelType, DataLinkSender, MacAddr, NetworkInterface};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;

/// Errors of the layer-2 socket layer.
#[derive(Debug, thiserror::Error)]
pub enum AnnounceError {
    /// The interface does not exist (or has no MAC address).
    #[error("failed to find interface {0} (or it has no MAC address)")]
    NoInterface(String),
    /// The packet socket could not be opened.
    #[error("failed to open a packet socket on {ifname}: {source}")]
    Open {
        /// The interface.
        ifname: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A frame could not be sent.
    #[error("failed to send {what} on {ifname}: {source}")]
    Send {
        /// What was sent.
        what: &'static str,
        /// The interface.
        ifname: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn find_interface(ifname: &str) -> Result<(NetworkInterface, MacAddr), AnnounceError> {
    let iface = datalink::interfaces()
        .into_iter()
        .find(|i| i.name == ifname)
        .ok_or_else(|| AnnounceError::NoInterface(ifname.to_owned()))?;
    let mac =
        iface.mac.filter(|m| *m != MacAddr::zero()).ok_or_else(|| AnnounceError::NoInterface(ifname.to_owned()))?;
    Ok((iface, mac))
}

/// A transmit-only layer-2 socket on one interface.
pub struct L2Sender {
    ifname: String,
    mac: MacAddr,
    tx: Mutex<Box<dyn DataLinkSender>>,
}

impl L2Sender {
    /// Opens the interface for sending (needs CAP_NET_RAW).
    pub fn open(ifname: &str) -> Result<Self, AnnounceError> {
        let (iface, mac) = find_interface(ifname)?;
        let open_err = |source| AnnounceError::Open { ifname: ifname.to_owned(), source };
        // Protocol 0: this socket receives nothing.
        let fd = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Packet,
            nix::sys::socket::SockType::Raw,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| open_err(std::io::Error::from(e)))?;
        let config = datalink::Config {
            channel_type: ChannelType::Layer3(0),
            socket_fd: Some(fd.into_raw_fd()),
            write_timeout: Some(Duration::from_millis(100)),
            ..Default::default()
        };
        let tx = match datalink::channel(&iface, config).map_err(open_err)? {
            Channel::Ethernet(tx, _rx) => tx,
            _ => return Err(open_err(std::io::Error::other("unsupported channel type"))),
        };
        Ok(Self { ifname: ifname.to_owned(), mac, tx: Mutex::new(tx) })
    }

    /// This interface's MAC address.
    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// The interface name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    fn send(&self, what: &'static str, frame: &[u8]) -> Result<(), AnnounceError> {
        let mut tx = self.tx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match tx.send_to(frame, None) {
            Some(Ok(())) => Ok(()),
            Some(Err(source)) => Err(AnnounceError::Send { what, ifname: self.ifname.clone(), source }),
            None => Err(AnnounceError::Send {
                what,
                ifname: self.ifname.clone(),
                source: std::io::Error::other("frame too large"),
            }),
        }
    }

    /// Sends one gratuitous ARP for `ip`.
    pub fn send_garp(&self, ip: Ipv4Addr) -> Result<(), AnnounceError> {
        self.send("gratuitous ARP", &garp_frame(self.mac, ip))
    }

    /// Sends one unsolicited neighbour advertisement for `ip`.
    pub fn send_unsolicited_na(&self, ip: Ipv6Addr) -> Result<(), AnnounceError> {
        self.send("unsolicited NA", &unsolicited_na_frame(self.mac, ip))
    }

    /// Asks "who has `target`?" with a neighbour solicitation from `src` (`::` makes it
    /// a DAD probe: see the module docs).
    pub fn send_neighbor_solicitation(&self, target: Ipv6Addr, src: Ipv6Addr) -> Result<(), AnnounceError> {
        self.send("neighbour solicitation", &neighbor_solicitation_frame(self.mac, src, target))
    }

    /// Broadcasts "who has `target`? tell `sender_ip`" (`sender_ip` 0.0.0.0 makes it an
    /// RFC 5227 probe that changes nobody's neighbour table).
    pub fn send_arp_request(&self, target: Ipv4Addr, sender_ip: Ipv4Addr) -> Result<(), AnnounceError> {
        self.send("ARP request", &arp_request_frame(self.mac, sender_ip, target))
    }
}

/// An Ethernet + ARP frame.
fn arp_frame(op: u16, dst: MacAddr, sha: MacAddr, spa: Ipv4Addr, tha: MacAddr, tpa: Ipv4Addr) -> [u8; 42] {
    let mut f = [0u8; 42];
    f[0..6].copy_from_slice(&dst.octets());
    f[6..12].copy_from_slice(&sha.octets());
    f[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
    f[14..16].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
    f[16..18].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4
    f[18] = 6;
    f[19] = 4;
    f[20..22].copy_from_slice(&op.to_be_bytes());
    f[22..28].copy_from_slice(&sha.octets());
    f[28..32].copy_from_slice(&spa.octets());
    f[32..38].copy_from_slice(&tha.octets());
    f[38..42].copy_from_slice(&tpa.octets());
    f
}

/// A gratuitous ARP: a broadcast ARP **request** with sender IP == target IP ==
/// `ip` and target MAC zero. This is the form Linux's `arp_is_garp()` accepts, so
/// receivers override an existing entry at once, inside locktime too.
pub fn garp_frame(mac: MacAddr, ip: Ipv4Addr) -> [u8; 42] {
    arp_frame(1, MacAddr::broadcast(), mac, ip, MacAddr::zero(), ip)
}

/// A broadcast ARP request for `target` from `sender_ip`.
pub fn arp_request_frame(mac: MacAddr, sender_ip: Ipv4Addr, target: Ipv4Addr) -> [u8; 42] {
    arp_frame(1, MacAddr::broadcast(), mac, sender_ip, MacAddr::zero(), target)
}

/// An unsolicited neighbour advertisement for `ip`: from `ip` to ff02::1, hop limit
/// 255, flags Override (not Solicited, not Router), with a target link-layer
/// address option carrying `mac`.
pub fn unsolicited_na_frame(mac: MacAddr, ip: Ipv6Addr) -> Vec<u8> {
    let dst = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    // ICMPv6: type, code, checksum, flags+reserved, target, option (2, 1, mac).
    let mut icmp = Vec::with_capacity(32);
    icmp.extend_from_slice(&[136, 0, 0, 0]);
    icmp.extend_from_slice(&[0b0010_0000, 0, 0, 0]); // Override
    icmp.extend_from_slice(&ip.octets());
    icmp.extend_from_slice(&[2, 1]);
    icmp.extend_from_slice(&mac.octets());
    icmpv6_frame(mac, multicast_mac(&dst), ip, dst, icmp)
}

/// A neighbour solicitation for `target` from `src`: to the target's solicited-node
/// multicast group (ff02::1:ffXX:XXXX), hop limit 255, with a source link-layer address
/// option unless `src` is `::` (RFC 4861 §4.3 forbids it then).
pub fn neighbor_solicitation_frame(mac: MacAddr, src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let t = target.octets();
    let dst = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00 | u16::from(t[13]), u16::from_be_bytes([t[14], t[15]]));
    let mut icmp = Vec::with_capacity(32);
    icmp.extend_from_slice(&[135, 0, 0, 0, 0, 0, 0, 0]);
    icmp.extend_from_slice(&t);
    if !src.is_unspecified() {
        icmp.extend_from_slice(&[1, 1]);
        icmp.extend_from_slice(&mac.octets());
    }
    icmpv6_frame(mac, multicast_mac(&dst), src, dst, icmp)
}

/// The Ethernet address of an IPv6 multicast group: 33:33 and its last 32 bits.
fn multicast_mac(group: &Ipv6Addr) -> [u8; 6] {
    let g = group.octets();
    [0x33, 0x33, g[12], g[13], g[14], g[15]]
}

/// An Ethernet + IPv6 frame (hop limit 255, as neighbour discovery requires: RFC 4861
/// §7.1) around the ICMPv6 message `icmp`, whose checksum it fills in.
fn icmpv6_frame(mac: MacAddr, dst_mac: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr, mut icmp: Vec<u8>) -> Vec<u8> {
    icmp[2..4].copy_from_slice(&[0, 0]);
    let csum = icmpv6_checksum(&src, &dst, &icmp);
    icmp[2..4].copy_from_slice(&csum.to_be_bytes());
    let mut f = Vec::with_capacity(14 + 40 + icmp.len());
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&mac.octets());
    f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
    f.extend_from_slice(&[0x60, 0, 0, 0]); // version 6, no traffic class or flow label
    f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    f.push(58); // next header: ICMPv6
    f.push(255); // hop limit: required by RFC 4861 §7.1.2
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&icmp);
    f
}

fn icmpv6_checksum(src: &Ipv6Addr, dst: &Ipv6Addr, icmp: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for chunk in b.chunks(2) {
            let word =
                if chunk.len() == 2 { u16::from_be_bytes([chunk[0], chunk[1]]) } else { u16::from(chunk[0]) << 8 };
            sum += u32::from(word);
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(icmp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 58]);
    add(icmp);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An ARP packet seen on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArpSeen {
    /// 1 = request, 2 = reply.
    pub op: u16,
    /// Sender hardware address.
    pub sender_mac: MacAddr,
    /// Sender protocol address.
    pub sender_ip: Ipv4Addr,
    /// Target protocol address.
    pub target_ip: Ipv4Addr,
}

/// Parses an ARP payload (no Ethernet header) for Ethernet/IPv4. Never panics.
pub fn parse_arp(payload: &[u8]) -> Option<ArpSeen> {
    if payload.len() < 28 || payload[0..2] != [0, 1] || payload[2..4] != [8, 0] || payload[4] != 6 || payload[5] != 4 {
        return None;
    }
    let mac = |b: &[u8]| MacAddr::new(b[0], b[1], b[2], b[3], b[4], b[5]);
    let ip = |b: &[u8]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    Some(ArpSeen {
        op: u16::from_be_bytes([payload[6], payload[7]]),
        sender_mac: mac(&payload[8..14]),
        sender_ip: ip(&payload[14..18]),
        target_ip: ip(&payload[24..28]),
    })
}

/// A neighbour advertisement seen on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NaSeen {
    /// The address it advertises.
    pub target: Ipv6Addr,
    /// Its target link-layer address option (sent in answer to a multicast
    /// solicitation and in unsolicited advertisements), if present.
    pub mac: Option<MacAddr>,
}

/// Parses an ICMPv6 message (no IPv6 header) as a neighbour advertisement. Never
/// panics; anything else is `None`.
pub fn parse_na(icmp: &[u8]) -> Option<NaSeen> {
    if icmp.len() < 24 || icmp[0] != 136 || icmp[1] != 0 {
        return None;
    }
    let target = Ipv6Addr::from(<[u8; 16]>::try_from(&icmp[8..24]).ok()?);
    let mut mac = None;
    let mut opts = &icmp[24..];
    // Options: type, length in units of 8 bytes (0 is invalid: stop), data.
    while opts.len() >= 8 {
        let len = usize::from(opts[1]) * 8;
        if len == 0 || len > opts.len() {
            break;
        }
        if opts[0] == 2 && len >= 8 {
            mac = Some(MacAddr::new(opts[2], opts[3], opts[4], opts[5], opts[6], opts[7]));
        }
        opts = &opts[len..];
    }
    Some(NaSeen { target, mac })
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use pnet::packet::Packet;
    use pnet::packet::arp::{ArpOperations, ArpPacket};
    use pnet::packet::ethernet::{EtherTypes, EthernetPacket};
    use pnet::packet::icmpv6::{Icmpv6Packet, Icmpv6Types};
    use pnet::packet::ipv6::Ipv6Packet;

    const MAC: MacAddr = MacAddr(0x02, 0, 0, 0, 0, 0x0a);

    #[test]
    fn garp_is_a_request_with_sender_ip_equal_to_target_ip() {
        let ip = Ipv4Addr::new(192, 0, 2, 10);
        let f = garp_frame(MAC, ip);
        let eth = EthernetPacket::new(&f).expect("ethernet");
        assert_eq!(eth.get_destination(), MacAddr::broadcast());
        assert_eq!(eth.get_source(), MAC);
        assert_eq!(eth.get_ethertype(), EtherTypes::Arp);
        let arp = ArpPacket::new(eth.payload()).expect("arp");
        assert_eq!(arp.get_operation(), ArpOperations::Request);
        assert_eq!(arp.get_sender_hw_addr(), MAC);
        assert_eq!(arp.get_sender_proto_addr(), ip);
        assert_eq!(arp.get_target_proto_addr(), ip, "Linux treats only spa == tpa as gratuitous");
        assert_eq!(arp.get_target_hw_addr(), MacAddr::zero());
        assert_eq!(parse_arp(eth.payload()).map(|a| (a.op, a.sender_ip)), Some((1, ip)));
    }

    #[test]
    fn unsolicited_na_has_override_hop_limit_and_valid_checksum() {
        let ip: Ipv6Addr = "2001:db8::10".parse().expect("ip");
        let f = unsolicited_na_frame(MAC, ip);
        let eth = EthernetPacket::new(&f).expect("ethernet");
        assert_eq!(eth.get_destination(), MacAddr(0x33, 0x33, 0, 0, 0, 1));
        assert_eq!(eth.get_ethertype(), EtherTypes::Ipv6);
        let v6 = Ipv6Packet::new(eth.payload()).expect("ipv6");
        assert_eq!(v6.get_hop_limit(), 255);
        assert_eq!(v6.get_destination(), "ff02::1".parse::<Ipv6Addr>().expect("ip"));
        assert_eq!(v6.get_source(), ip);
        let icmp = Icmpv6Packet::new(v6.payload()).expect("icmpv6");
        assert_eq!(icmp.get_icmpv6_type(), Icmpv6Types::NeighborAdvert);
        let expected = pnet::packet::icmpv6::checksum(&icmp, &v6.get_source(), &v6.get_destination());
        assert_eq!(icmp.get_checksum(), expected, "checksum matches pnet's computation");
        let na = pnet::packet::icmpv6::ndp::NeighborAdvertPacket::new(v6.payload()).expect("na");
        assert_eq!(na.get_flags(), pnet::packet::icmpv6::ndp::NeighborAdvertFlags::Override);
        assert_eq!(na.get_target_addr(), ip);
        let opts = na.get_options();
        assert_eq!(opts.len(), 1);
        assert_eq!(opts[0].option_type, pnet::packet::icmpv6::ndp::NdpOptionTypes::TargetLLAddr);
        assert_eq!(opts[0].data, MAC.octets().to_vec());
    }

    #[test]
    fn neighbor_solicitation_goes_to_the_solicited_node_group_with_a_valid_checksum() {
        let target: Ipv6Addr = "2001:db8::a:bc:de10".parse().expect("ip");
        for src in ["fe80::1".parse::<Ipv6Addr>().expect("ip"), Ipv6Addr::UNSPECIFIED] {
            let f = neighbor_solicitation_frame(MAC, src, target);
            let eth = EthernetPacket::new(&f).expect("ethernet");
            assert_eq!(eth.get_destination(), MacAddr(0x33, 0x33, 0xff, 0xbc, 0xde, 0x10));
            let v6 = Ipv6Packet::new(eth.payload()).expect("ipv6");
            assert_eq!(v6.get_hop_limit(), 255);
            assert_eq!(v6.get_source(), src);
            assert_eq!(v6.get_destination(), "ff02::1:ffbc:de10".parse::<Ipv6Addr>().expect("ip"));
            let icmp = Icmpv6Packet::new(v6.payload()).expect("icmpv6");
            assert_eq!(icmp.get_icmpv6_type(), Icmpv6Types::NeighborSolicit);
            let expected = pnet::packet::icmpv6::checksum(&icmp, &v6.get_source(), &v6.get_destination());
            assert_eq!(icmp.get_checksum(), expected);
            let ns = pnet::packet::icmpv6::ndp::NeighborSolicitPacket::new(v6.payload()).expect("ns");
            assert_eq!(ns.get_target_addr(), target);
            let opts = ns.get_options();
            if src.is_unspecified() {
                assert!(opts.is_empty(), "no source link-layer option from ::");
            } else {
                assert_eq!(opts.len(), 1);
                assert_eq!(opts[0].option_type, pnet::packet::icmpv6::ndp::NdpOptionTypes::SourceLLAddr);
                assert_eq!(opts[0].data, MAC.octets().to_vec());
            }
        }
    }

    #[test]
    fn a_neighbour_advertisement_parses_with_its_target_and_mac() {
        let ip: Ipv6Addr = "2001:db8::10".parse().expect("ip");
        let f = unsolicited_na_frame(MAC, ip);
        let icmp = &f[14 + 40..];
        assert_eq!(parse_na(icmp), Some(NaSeen { target: ip, mac: Some(MAC) }));
        // Without options (a solicited NA to a unicast solicitation may carry none).
        assert_eq!(parse_na(&icmp[..24]), Some(NaSeen { target: ip, mac: None }));
        // Not an NA, or broken options: nothing, or no MAC; garbage never panics.
        let mut ns = icmp.to_vec();
        ns[0] = 135;
        assert_eq!(parse_na(&ns), None);
        let mut bad = icmp.to_vec();
        bad[25] = 0;
        assert_eq!(parse_na(&bad).and_then(|n| n.mac), None, "a zero option length ends the parse");
        for len in 0..64 {
            let junk: Vec<u8> = (0..len).map(|i| if i == 0 { 136 } else { (i * 37 % 251) as u8 }).collect();
            let _ = parse_na(&junk);
        }
    }

    #[test]
    fn parse_arp_never_panics_on_garbage() {
        for len in 0..64 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            let _ = parse_arp(&junk);
        }
        assert_eq!(parse_arp(&[0u8; 27]), None);
    }
}

// The announcement schedule.

/// Holds announcements back after the agent was stalled (SIGSTOP, a VM pause, a long
/// scheduling delay). A stalled active may have been taken over meanwhile: the peer's
/// newer epoch sits in the socket buffer, unread. Announcing before reading it would
/// pull the clients back to a member that is about to drop the VIP. So once the runtime
/// sees a gap between its ticks (or an announcement finds the runtime has not ticked
/// for that long), announcements wait a settle time in which the queued inputs are
/// processed; a member that still holds the VIPs then announces.
#[derive(Debug)]
pub struct AnnounceGate {
    origin: tokio::time::Instant,
    /// A gap longer than this between two ticks of the runtime is a stall.
    stall_ms: u64,
    /// How long announcements wait after a stall.
    settle_ms: u64,
    last_tick_ms: std::sync::atomic::AtomicU64,
    blocked_until_ms: std::sync::atomic::AtomicU64,
}

impl AnnounceGate {
    /// A gate for a runtime that ticks every `tick`: a gap of `tick + stall` is a stall,
    /// after which announcements wait `settle`.
    pub fn new(tick: Duration, stall: Duration, settle: Duration) -> Arc<Self> {
        Arc::new(Self {
            origin: tokio::time::Instant::now(),
            stall_ms: (tick + stall).as_millis() as u64,
            settle_ms: settle.as_millis() as u64,
            last_tick_ms: std::sync::atomic::AtomicU64::new(0),
            blocked_until_ms: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// If the runtime has not ticked for longer than the stall bound, block
    /// announcements for the settle time; returns the gap when it did.
    fn check(&self, now: u64) -> Option<Duration> {
        let gap = now.saturating_sub(self.last_tick_ms.load(Ordering::Relaxed));
        if gap > self.stall_ms {
            self.blocked_until_ms.fetch_max(now + self.settle_ms, Ordering::Relaxed);
            return Some(Duration::from_millis(gap));
        }
        None
    }

    /// Called by the runtime on every tick; returns the length of a stall that ended
    /// just now (announcements are held back for the settle time).
    pub fn tick(&self) -> Option<Duration> {
        let now = self.now_ms();
        let stalled = self.check(now);
        self.last_tick_ms.store(now, Ordering::Relaxed);
        stalled
    }

    /// Whether announcements are held back now.
    pub fn blocked(&self) -> bool {
        let now = self.now_ms();
        self.check(now);
        now < self.blocked_until_ms.load(Ordering::Relaxed)
    }

    /// Waits until announcements may go out.
    pub async fn cleared(&self) {
        loop {
            let now = self.now_ms();
            self.check(now);
            let until = self.blocked_until_ms.load(Ordering::Relaxed);
            if now >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(until - now)).await;
        }
    }
}

/// Runs the announcement schedule of a held VIP set: for a burst, `burst` announcements
/// now and `repeats` more spaced past the ARP locktime; for a refresh, one; then one per
/// refresh interval until the task is aborted (the VIPs were removed). `send(n)` sends
/// `n` announcements of every VIP. Nothing is sent while the gate holds announcements
/// back, nor once `holding` turned false.
pub fn spawn_schedule(
    kind: crate::sm::AnnounceKind,
    sched: crate::config::AnnounceSchedule,
    gate: Arc<AnnounceGate>,
    holding: Arc<AtomicBool>,
    send: impl Fn(u32) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Waits for the gate; whether the VIPs are still held.
        let cleared = || async {
            gate.cleared().await;
            holding.load(Ordering::Relaxed)
        };
        let first = match kind {
            crate::sm::AnnounceKind::Burst => sched.burst,
            crate::sm::AnnounceKind::Refresh => 1,
        };
        if !cleared().await {
            return;
        }
        send(first);
        if kind == crate::sm::AnnounceKind::Burst {
            for _ in 0..sched.repeats {
                tokio::time::sleep(sched.repeat_interval).await;
                if !cleared().await {
                    return;
                }
                send(1);
            }
        }
        if sched.refresh_interval.is_zero() {
            return;
        }
        loop {
            tokio::time::sleep(sched.refresh_interval).await;
            if !cleared().await {
                return;
            }
            send(1);
        }
    })
}

#[cfg(test)]
mod schedule_tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn sched() -> crate::config::AnnounceSchedule {
        crate::config::AnnounceSchedule {
            burst: 3,
            repeats: 2,
            repeat_interval: Duration::from_millis(1100),
            refresh_interval: Duration::ZERO,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_holds_announcements_back_until_the_settle_time_passed() {
        let gate = AnnounceGate::new(Duration::from_millis(20), Duration::from_millis(150), Duration::from_millis(250));
        let holding = Arc::new(AtomicBool::new(true));
        let sent = Arc::new(AtomicU32::new(0));
        let s = sent.clone();
        // A runtime that ticks every 20 ms.
        let g = gate.clone();
        let ticker = tokio::spawn(async move {
            loop {
                g.tick();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let task = spawn_schedule(crate::sm::AnnounceKind::Burst, sched(), gate.clone(), holding.clone(), move |n| {
            s.fetch_add(n, Ordering::Relaxed);
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(sent.load(Ordering::Relaxed), 3, "the burst goes out at once");
        assert!(!gate.blocked());
        // The whole process stalls for 2 s (the runtime does not tick; time passes):
        // the first repeat is overdue when it resumes.
        ticker.abort();
        tokio::time::advance(Duration::from_millis(2000)).await;
        tokio::task::yield_now().await;
        assert_eq!(sent.load(Ordering::Relaxed), 3, "no announcement right after the stall");
        assert!(gate.blocked(), "the gate noticed the stall");
        // The runtime resumes ticking and, reading the queued inputs, learns that it lost
        // the VIPs.
        let g = gate.clone();
        let _ticker = tokio::spawn(async move {
            loop {
                g.tick();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        holding.store(false, Ordering::Relaxed);
        for _ in 0..15 {
            tokio::time::advance(Duration::from_millis(20)).await;
            tokio::task::yield_now().await;
        }
        assert_eq!(sent.load(Ordering::Relaxed), 3, "a member that gave the VIPs up never announces them");
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        assert!(task.is_finished(), "the schedule ends with the holding");
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_stall_a_member_that_still_holds_the_vips_announces_after_the_settle_time() {
        let gate = AnnounceGate::new(Duration::from_millis(20), Duration::from_millis(150), Duration::from_millis(250));
        assert_eq!(gate.tick(), None);
        tokio::time::advance(Duration::from_millis(1000)).await;
        let stall = gate.tick().expect("a 1 s gap is a stall");
        assert!(stall >= Duration::from_millis(1000));
        assert!(gate.blocked());
        let holding = Arc::new(AtomicBool::new(true));
        let sent = Arc::new(AtomicU32::new(0));
        let s = sent.clone();
        let _task = spawn_schedule(crate::sm::AnnounceKind::Refresh, sched(), gate.clone(), holding, move |n| {
            s.fetch_add(n, Ordering::Relaxed);
        });
        tokio::task::yield_now().await;
        assert_eq!(sent.load(Ordering::Relaxed), 0);
        // The runtime keeps ticking through the settle time.
        for _ in 0..15 {
            tokio::time::advance(Duration::from_millis(20)).await;
            gate.tick();
            tokio::task::yield_now().await;
        }
        assert_eq!(sent.load(Ordering::Relaxed), 1, "announced once the settle time passed");
    }
}
