//! Layer-2 frames: the ARP and neighbour-discovery frames the agent sends, and the
//! parsers of what its listeners receive. Pure: no sockets.

use super::iface::{ETH_P_ARP, ETH_P_IPV6};
use pnet::datalink::MacAddr;
use std::net::{Ipv4Addr, Ipv6Addr};

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

/// A unicast ARP **reply** telling `to_ip` (at `to_mac`) that `ip` is at `mac`: not
/// gratuitous (its target is the neighbour), so a host that drops gratuitous ARP still
/// takes it, and Linux overrides an existing entry with it once the entry is older than
/// its `locktime` (1 s).
pub fn unicast_arp_reply_frame(mac: MacAddr, ip: Ipv4Addr, to_mac: MacAddr, to_ip: Ipv4Addr) -> [u8; 42] {
    arp_frame(2, to_mac, mac, ip, to_mac, to_ip)
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
    icmpv6_frame(mac, multicast_mac(&dst), ip, dst, override_na(mac, ip))
}

/// The ICMPv6 message of an unsolicited neighbour advertisement for `ip` at `mac`: type,
/// code, checksum (filled in later), flags Override, the target, and a target link-layer
/// address option (2, 1, mac).
fn override_na(mac: MacAddr, ip: Ipv6Addr) -> Vec<u8> {
    let mut icmp = Vec::with_capacity(32);
    icmp.extend_from_slice(&[136, 0, 0, 0]);
    icmp.extend_from_slice(&[0b0010_0000, 0, 0, 0]); // Override
    icmp.extend_from_slice(&ip.octets());
    icmp.extend_from_slice(&[2, 1]);
    icmp.extend_from_slice(&mac.octets());
    icmp
}

/// An unsolicited neighbour advertisement for `ip` sent to one neighbour (`to_ip` at
/// `to_mac`) instead of all-nodes: the same message as [`unsolicited_na_frame`].
pub fn unicast_na_frame(mac: MacAddr, ip: Ipv6Addr, to_mac: MacAddr, to_ip: Ipv6Addr) -> Vec<u8> {
    icmpv6_frame(mac, to_mac.octets(), ip, to_ip, override_na(mac, ip))
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

#[cfg(test)]
mod tests {
    use super::{
        NaSeen, garp_frame, neighbor_solicitation_frame, parse_arp, parse_na, unicast_arp_reply_frame,
        unicast_na_frame, unsolicited_na_frame,
    };
    use pnet::datalink::MacAddr;
    use pnet::packet::Packet;
    use pnet::packet::arp::{ArpOperations, ArpPacket};
    use pnet::packet::ethernet::{EtherTypes, EthernetPacket};
    use pnet::packet::icmpv6::{Icmpv6Packet, Icmpv6Types};
    use pnet::packet::ipv6::Ipv6Packet;
    use std::net::{Ipv4Addr, Ipv6Addr};

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

    /// A unicast announcement is a reply addressed to the neighbour, not a gratuitous ARP
    /// (its target is the neighbour), so a host that drops gratuitous ARP takes it.
    #[test]
    fn a_unicast_arp_reply_is_addressed_to_the_neighbour() {
        let ip = Ipv4Addr::new(192, 0, 2, 10);
        let (to_mac, to_ip) = (MacAddr(0x02, 0, 0, 0, 0, 0x64), Ipv4Addr::new(192, 0, 2, 100));
        let f = unicast_arp_reply_frame(MAC, ip, to_mac, to_ip);
        let eth = EthernetPacket::new(&f).expect("ethernet");
        assert_eq!((eth.get_destination(), eth.get_source()), (to_mac, MAC));
        let arp = ArpPacket::new(eth.payload()).expect("arp");
        assert_eq!(arp.get_operation(), ArpOperations::Reply);
        assert_eq!((arp.get_sender_hw_addr(), arp.get_sender_proto_addr()), (MAC, ip));
        assert_eq!((arp.get_target_hw_addr(), arp.get_target_proto_addr()), (to_mac, to_ip));
    }

    /// The unicast NA is the unsolicited one (same message, same checksum rules) sent to one
    /// neighbour's addresses.
    #[test]
    fn a_unicast_na_is_the_unsolicited_one_addressed_to_the_neighbour() {
        let ip: Ipv6Addr = "2001:db8::10".parse().expect("ip");
        let (to_mac, to_ip) = (MacAddr(0x02, 0, 0, 0, 0, 0x64), "2001:db8::64".parse::<Ipv6Addr>().expect("ip"));
        let f = unicast_na_frame(MAC, ip, to_mac, to_ip);
        let eth = EthernetPacket::new(&f).expect("ethernet");
        assert_eq!(eth.get_destination(), to_mac);
        let v6 = Ipv6Packet::new(eth.payload()).expect("ipv6");
        assert_eq!((v6.get_source(), v6.get_destination(), v6.get_hop_limit()), (ip, to_ip, 255));
        let icmp = Icmpv6Packet::new(v6.payload()).expect("icmpv6");
        let expected = pnet::packet::icmpv6::checksum(&icmp, &v6.get_source(), &v6.get_destination());
        assert_eq!(icmp.get_checksum(), expected);
        assert_eq!(parse_na(v6.payload()).map(|n| (n.target, n.mac)), Some((ip, Some(MAC))));
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
