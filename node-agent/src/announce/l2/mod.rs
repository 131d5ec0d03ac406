//! The layer-2 transport: gratuitous ARP, unsolicited IPv6 neighbour
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

pub mod frames;
mod iface;
pub mod listeners;
pub mod vmac;

use super::transport::{AnnounceError, Transport};
use frames::{
    arp_request_frame, garp_frame, neighbor_solicitation_frame, unicast_arp_reply_frame, unicast_na_frame,
    unsolicited_na_frame,
};
use iface::find_interface;
use pnet::datalink::{self, Channel, ChannelType, DataLinkSender, MacAddr};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::IntoRawFd;
use std::sync::Mutex;
use std::time::Duration;

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

impl Transport for L2Sender {
    fn announce(&self, vip: IpAddr) -> Result<&'static str, AnnounceError> {
        match vip {
            IpAddr::V4(ip) => self.send_garp(ip).map(|()| "garp"),
            IpAddr::V6(ip) => self.send_unsolicited_na(ip).map(|()| "na"),
        }
    }

    fn announce_to(&self, vip: IpAddr, to: IpAddr, to_mac: [u8; 6]) -> Result<&'static str, AnnounceError> {
        let to_mac = MacAddr::from(to_mac);
        match (vip, to) {
            (IpAddr::V4(ip), IpAddr::V4(t)) => self
                .send("unicast ARP reply", &unicast_arp_reply_frame(self.mac, ip, to_mac, t))
                .map(|()| "arp_unicast"),
            (IpAddr::V6(ip), IpAddr::V6(t)) => {
                self.send("unicast NA", &unicast_na_frame(self.mac, ip, to_mac, t)).map(|()| "na_unicast")
            }
            _ => Err(AnnounceError::Send {
                what: "unicast announcement",
                ifname: self.ifname.clone(),
                source: std::io::Error::other("the VIP and the neighbour are of different families"),
            }),
        }
    }
}
