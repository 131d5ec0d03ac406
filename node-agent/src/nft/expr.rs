//! nf_tables messages: tables, base chains, and the two rule programs havip installs,
//! encoded expression by expression as nft 1.0 encodes the equivalent rule text
//! (compare `nft --debug=netlink` and `--debug=mnl`; the unit tests hold nft's bytes).
//!
//! Byte order is the subtle part. Packet fields (addresses, ports, flags) are compared
//! in network byte order, as they sit in the packet. Values the kernel produces itself
//! are host-endian `u32`s in the register: `ct state` bits and the interface index
//! `dup … device` reads. Attribute integers (registers, offsets, lengths, hook numbers,
//! verdict codes) are big-endian.

use super::msg::{self, Attr, ParseError, Writer, malformed};
use std::net::IpAddr;

// enum nf_tables_msg_types
pub(crate) const NFT_MSG_NEWTABLE: u8 = 0;
pub(crate) const NFT_MSG_GETTABLE: u8 = 1;
pub(crate) const NFT_MSG_DELTABLE: u8 = 2;
pub(crate) const NFT_MSG_NEWCHAIN: u8 = 3;
pub(crate) const NFT_MSG_NEWRULE: u8 = 6;
pub(crate) const NFT_MSG_GETRULE: u8 = 7;

// NFPROTO_*
pub(crate) const NFPROTO_UNSPEC: u8 = 0;
pub(crate) const NFPROTO_INET: u8 = 1;
pub(crate) const NFPROTO_IPV4: u8 = 2;
pub(crate) const NFPROTO_ARP: u8 = 3;
pub(crate) const NFPROTO_NETDEV: u8 = 5;
pub(crate) const NFPROTO_BRIDGE: u8 = 7;
pub(crate) const NFPROTO_IPV6: u8 = 10;

// enum nft_table_attributes
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
// enum nft_chain_attributes
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
// enum nft_hook_attributes
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
// enum nft_rule_attributes
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
// NFTA_LIST_ELEM and enum nft_expr_attributes
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
// enum nft_data_attributes, enum nft_verdict_attributes
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
// enum nft_payload_attributes
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_PAYLOAD_SREG: u16 = 5;
const NFTA_PAYLOAD_CSUM_TYPE: u16 = 6;
const NFTA_PAYLOAD_CSUM_OFFSET: u16 = 7;
const NFTA_PAYLOAD_CSUM_FLAGS: u16 = 8;
// enum nft_cmp_attributes
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
// enum nft_meta_attributes
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
// enum nft_bitwise_attributes
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_BITWISE_OP: u16 = 6;
// enum nft_ct_attributes
const NFTA_CT_DREG: u16 = 1;
const NFTA_CT_KEY: u16 = 2;
// enum nft_counter_attributes
const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
// enum nft_immediate_attributes
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
// enum nft_dup_attributes
const NFTA_DUP_SREG_ADDR: u16 = 1;
const NFTA_DUP_SREG_DEV: u16 = 2;
// enum nft_fib_attributes
const NFTA_FIB_DREG: u16 = 1;
const NFTA_FIB_RESULT: u16 = 2;
const NFTA_FIB_FLAGS: u16 = 3;
// enum nft_socket_attributes
const NFTA_SOCKET_KEY: u16 = 1;
const NFTA_SOCKET_DREG: u16 = 2;
const NFTA_SOCKET_LEVEL: u16 = 3;

/// `NFT_REG_VERDICT`, and the first two 16-byte data registers (an IPv6 address
/// fills one).
const REG_VERDICT: u32 = 0;
const REG_1: u32 = 1;
const REG_2: u32 = 2;

// enum nft_payload_bases
const BASE_NETWORK: u32 = 1;
const BASE_TRANSPORT: u32 = 2;
/// `NFT_PAYLOAD_CSUM_INET`: the internet checksum at the given offset of the same header.
const CSUM_INET: u32 = 1;
/// Offset of the IPv4 header checksum.
const IP_CSUM_OFFSET: u32 = 10;
/// `NFT_PAYLOAD_L4CSUM_PSEUDOHDR`: the field written is part of the L4 checksum's
/// pseudo-header, fix that checksum too.
const L4CSUM_PSEUDOHDR: u32 = 1;
// enum nft_cmp_ops
const CMP_EQ: u32 = 0;
const CMP_NEQ: u32 = 1;
/// `NFT_META_IIF`, `NFT_META_L4PROTO`.
const META_IIF: u32 = 4;
const META_L4PROTO: u32 = 16;
/// `NFT_FIB_RESULT_ADDRTYPE`, `NFTA_FIB_F_DADDR`, and the address type `RTN_LOCAL` (a
/// host-endian `u32` in the register).
const FIB_RESULT_ADDRTYPE: u32 = 3;
const FIB_F_DADDR: u32 = 1 << 1;
const RTN_LOCAL: u32 = 2;
/// The TTL / hop limit the forwarder gives a segment before `dup` copies it (and
/// decrements it once more, see [`forward_rule`]): the copy arrives with 1.
const COPY_TTL: u8 = 2;
/// `NFT_BITWISE_MASK_XOR` (called `NFT_BITWISE_BOOL` before 6.13; same value).
const BITWISE_MASK_XOR: u32 = 0;
/// `NFT_CT_STATE`.
const CT_STATE: u32 = 0;
/// `NFT_SOCKET_WILDCARD`: whether the socket the packet's lookup finds is bound to the
/// wildcard address (a full socket only; none or a request or time-wait socket: no match).
const SOCKET_WILDCARD: u32 = 2;
/// `NF_DROP`.
const VERDICT_DROP: u32 = 0;
/// ct state bits: `NF_CT_STATE_INVALID_BIT` and `NF_CT_STATE_BIT(IP_CT_NEW)`.
const CT_STATE_INVALID: u32 = 1;
const CT_STATE_NEW: u32 = 1 << 3;

// Hook numbers: enum nf_inet_hooks and NF_ARP_IN/OUT.
const NF_INET_PRE_ROUTING: u32 = 0;
const NF_INET_LOCAL_IN: u32 = 1;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_ARP_IN: u32 = 0;
const NF_ARP_OUT: u32 = 1;

const IPPROTO_TCP: u8 = 6;
const IPPROTO_ICMPV6: u8 = 58;
const TCP_FLAG_FIN: u8 = 0x01;
const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_RST: u8 = 0x04;
const TCP_FLAG_ACK: u8 = 0x10;
const ND_NEIGHBOR_SOLICIT: u8 = 135;
/// ARP over Ethernet for IPv4: htype 1, ptype 0x0800, then hlen 6, plen 4. The ARP
/// family's payload offsets (sender IP at 14, target IP at 24) hold only for this
/// layout, so both quieter chains check it first, as nft does for `arp htype 1 arp
/// ptype ip arp hlen 6 arp plen 4` (merged into these two loads).
const ARP_ETHER_IPV4: [u8; 4] = [0x00, 0x01, 0x08, 0x00];
const ARP_HLEN_PLEN: [u8; 2] = [6, 4];
const ARP_OP_REQUEST: [u8; 2] = [0, 1];

/// A base chain of one of havip's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChainSpec {
    pub(crate) name: &'static str,
    pub(crate) hook: u32,
    pub(crate) priority: i32,
}

/// The forwarder's chain: after conntrack (-200), which the `ct state` match needs,
/// and before DNAT (-100), so kube-proxy never rewrites a packet that belongs to the
/// old holder.
pub(crate) const FWD_PREROUTING: ChainSpec =
    ChainSpec { name: "prerouting", hook: NF_INET_PRE_ROUTING, priority: -150 };
/// The quieter's chains (the ARP family has the same names for its hooks).
/// The guard's chain: after DNAT (-100), so a packet kube-proxy (or any DNAT) rewrote
/// is no longer addressed to the VIP when the guard sees it.
pub(crate) const GUARD_PREROUTING: ChainSpec = ChainSpec { name: "prerouting", hook: NF_INET_PRE_ROUTING, priority: 0 };
pub(crate) const QUIET_ARP_INPUT: ChainSpec = ChainSpec { name: "input", hook: NF_ARP_IN, priority: 0 };
pub(crate) const QUIET_ARP_OUTPUT: ChainSpec = ChainSpec { name: "output", hook: NF_ARP_OUT, priority: 0 };
pub(crate) const QUIET_IP6_INPUT: ChainSpec = ChainSpec { name: "input", hook: NF_INET_LOCAL_IN, priority: 0 };
pub(crate) const QUIET_IP6_OUTPUT: ChainSpec = ChainSpec { name: "output", hook: NF_INET_LOCAL_OUT, priority: 0 };

/// `NFT_MSG_NEWTABLE` body.
pub(crate) fn table_attrs(w: &mut Writer, name: &str) {
    w.string(NFTA_TABLE_NAME, name);
    w.u32_be(NFTA_TABLE_FLAGS, 0);
}

/// `NFT_MSG_DELTABLE` body (also the filter of a rule dump).
pub(crate) fn table_name_attr(w: &mut Writer, name: &str) {
    w.string(NFTA_TABLE_NAME, name);
}

/// A rule dump's filter: only the rules of table `name`.
pub(crate) fn rule_dump_attrs(w: &mut Writer, table: &str) {
    w.string(NFTA_RULE_TABLE, table);
}

/// `NFT_MSG_NEWCHAIN` body: a filter base chain, policy accept.
pub(crate) fn chain_attrs(w: &mut Writer, table: &str, chain: ChainSpec) {
    w.string(NFTA_CHAIN_TABLE, table);
    w.string(NFTA_CHAIN_NAME, chain.name);
    w.string(NFTA_CHAIN_TYPE, "filter");
    w.u32_be(NFTA_CHAIN_POLICY, 1); // NF_ACCEPT
    w.nest(NFTA_CHAIN_HOOK, |w| {
        w.u32_be(NFTA_HOOK_HOOKNUM, chain.hook);
        // A signed priority travels as its two's-complement big-endian u32.
        w.bytes(NFTA_HOOK_PRIORITY, &chain.priority.to_be_bytes());
    });
}

/// The expressions of one rule, in order.
struct Program<'w> {
    w: &'w mut Writer,
}

impl Program<'_> {
    fn expr(&mut self, name: &str, data: impl FnOnce(&mut Writer)) {
        self.w.nest(NFTA_LIST_ELEM, |w| {
            w.string(NFTA_EXPR_NAME, name);
            w.nest(NFTA_EXPR_DATA, data);
        });
    }

    /// `payload load <len>b @ <base> + <offset> => reg 1`
    fn load(&mut self, base: u32, offset: u32, len: u32) {
        self.expr("payload", |w| {
            w.u32_be(NFTA_PAYLOAD_DREG, REG_1);
            w.u32_be(NFTA_PAYLOAD_BASE, base);
            w.u32_be(NFTA_PAYLOAD_OFFSET, offset);
            w.u32_be(NFTA_PAYLOAD_LEN, len);
        });
    }

    /// `cmp <op> reg 1 <value>`
    fn cmp(&mut self, op: u32, value: &[u8]) {
        self.expr("cmp", |w| {
            w.u32_be(NFTA_CMP_SREG, REG_1);
            w.u32_be(NFTA_CMP_OP, op);
            w.nest(NFTA_CMP_DATA, |w| w.bytes(NFTA_DATA_VALUE, value));
        });
    }

    /// A packet field equals `value`.
    fn field_eq(&mut self, base: u32, offset: u32, value: &[u8]) {
        self.load(base, offset, value.len() as u32);
        self.cmp(CMP_EQ, value);
    }

    /// `meta l4proto <proto>`
    fn l4proto(&mut self, proto: u8) {
        self.expr("meta", |w| {
            w.u32_be(NFTA_META_KEY, META_L4PROTO);
            w.u32_be(NFTA_META_DREG, REG_1);
        });
        self.cmp(CMP_EQ, &[proto]);
    }

    /// `bitwise reg 1 = (reg 1 & mask) ^ 0`. Without `NFTA_BITWISE_OP` the kernel
    /// does mask-and-xor too; nft 1.0.6 names the operation for the TCP flags match
    /// but not for ct state, and `explicit_op` copies that so the bytes compare equal.
    fn and(&mut self, mask: &[u8], explicit_op: bool) {
        self.mask_xor(mask, &vec![0; mask.len()], explicit_op);
    }

    /// `bitwise reg 1 = (reg 1 & mask) ^ xor`
    fn mask_xor(&mut self, mask: &[u8], xor: &[u8], explicit_op: bool) {
        self.expr("bitwise", |w| {
            w.u32_be(NFTA_BITWISE_SREG, REG_1);
            w.u32_be(NFTA_BITWISE_DREG, REG_1);
            if explicit_op {
                w.u32_be(NFTA_BITWISE_OP, BITWISE_MASK_XOR);
            }
            w.u32_be(NFTA_BITWISE_LEN, mask.len() as u32);
            w.nest(NFTA_BITWISE_MASK, |w| w.bytes(NFTA_DATA_VALUE, mask));
            w.nest(NFTA_BITWISE_XOR, |w| w.bytes(NFTA_DATA_VALUE, xor));
        });
    }

    /// `ct load state => reg 1`
    fn ct_state(&mut self) {
        self.expr("ct", |w| {
            w.u32_be(NFTA_CT_KEY, CT_STATE);
            w.u32_be(NFTA_CT_DREG, REG_1);
        });
    }

    /// `meta iif <ifindex>` (the index is a host-endian `u32` in the register)
    fn iif(&mut self, ifindex: u32) {
        self.expr("meta", |w| {
            w.u32_be(NFTA_META_KEY, META_IIF);
            w.u32_be(NFTA_META_DREG, REG_1);
        });
        self.cmp(CMP_EQ, &ifindex.to_ne_bytes());
    }

    /// `fib daddr type != local`: the destination is no address of this host.
    fn daddr_not_local(&mut self) {
        self.expr("fib", |w| {
            // nft's order.
            w.u32_be(NFTA_FIB_FLAGS, FIB_F_DADDR);
            w.u32_be(NFTA_FIB_RESULT, FIB_RESULT_ADDRTYPE);
            w.u32_be(NFTA_FIB_DREG, REG_1);
        });
        self.cmp(CMP_NEQ, &RTN_LOCAL.to_ne_bytes());
    }

    fn counter(&mut self) {
        self.expr("counter", |_| {});
    }

    /// `socket load wildcard => reg 1` (nft also sends the cgroup level, 0, which only
    /// the cgroupv2 key reads)
    fn socket_wildcard(&mut self) {
        self.expr("socket", |w| {
            w.u32_be(NFTA_SOCKET_KEY, SOCKET_WILDCARD);
            w.u32_be(NFTA_SOCKET_DREG, REG_1);
            w.u32_be(NFTA_SOCKET_LEVEL, 0);
        });
    }

    /// `immediate reg <reg> <value>`
    fn immediate(&mut self, reg: u32, value: &[u8]) {
        self.expr("immediate", |w| {
            w.u32_be(NFTA_IMMEDIATE_DREG, reg);
            w.nest(NFTA_IMMEDIATE_DATA, |w| w.bytes(NFTA_DATA_VALUE, value));
        });
    }

    /// `payload write reg 1 => <len>b @ network header + <offset>`, with the L4
    /// checksum fixed for the pseudo-header when `l4csum`.
    fn store(&mut self, offset: u32, len: u32, l4csum: bool) {
        self.store_csum(offset, len, None, l4csum);
    }

    /// [`Program::store`], also fixing the internet checksum at `ip_csum` of the network
    /// header (the IPv4 header checksum) when given.
    fn store_csum(&mut self, offset: u32, len: u32, ip_csum: Option<u32>, l4csum: bool) {
        self.expr("payload", |w| {
            w.u32_be(NFTA_PAYLOAD_SREG, REG_1);
            w.u32_be(NFTA_PAYLOAD_BASE, BASE_NETWORK);
            w.u32_be(NFTA_PAYLOAD_OFFSET, offset);
            w.u32_be(NFTA_PAYLOAD_LEN, len);
            if let Some(at) = ip_csum {
                w.u32_be(NFTA_PAYLOAD_CSUM_TYPE, CSUM_INET);
                w.u32_be(NFTA_PAYLOAD_CSUM_OFFSET, at);
            }
            if l4csum {
                // No CSUM_TYPE (the IPv6 header has no checksum of its own), only the
                // flag: nf_tables then fixes the ICMPv6 checksum, whose pseudo-header
                // holds the source address. This is exactly what nft sends.
                w.u32_be(NFTA_PAYLOAD_CSUM_FLAGS, L4CSUM_PSEUDOHDR);
            }
        });
    }

    /// `dup sreg_addr 1 sreg_dev 2`
    fn dup(&mut self) {
        self.expr("dup", |w| {
            w.u32_be(NFTA_DUP_SREG_ADDR, REG_1);
            w.u32_be(NFTA_DUP_SREG_DEV, REG_2);
        });
    }

    fn drop(&mut self) {
        self.expr("immediate", |w| {
            w.u32_be(NFTA_IMMEDIATE_DREG, REG_VERDICT);
            w.nest(NFTA_IMMEDIATE_DATA, |w| {
                w.nest(NFTA_DATA_VERDICT, |w| w.u32_be(NFTA_VERDICT_CODE, VERDICT_DROP));
            });
        });
    }

    /// `<ip|ip6> daddr <vip> iif <ifindex> meta l4proto tcp tcp flags & <mask> != <not>`
    /// (the flags are byte 13 of the TCP header).
    fn tcp_to_vip_with_flags(&mut self, vip: IpAddr, ifindex: u32, mask: u8, not: u8) {
        self.field_eq(BASE_NETWORK, daddr_offset(vip), &octets(vip));
        self.iif(ifindex);
        self.l4proto(IPPROTO_TCP);
        self.load(BASE_TRANSPORT, 13, 1);
        self.and(&[mask], true);
        self.cmp(CMP_NEQ, &[not]);
    }

    /// `ip ttl set 2` / `ip6 hoplimit set 2`. The IPv4 TTL shares a 16-bit word of the
    /// header checksum with the protocol: as nft does, the word is read, the TTL byte
    /// replaced, and the word written back with the checksum fixed.
    fn set_copy_ttl(&mut self, v4: bool) {
        if v4 {
            self.load(BASE_NETWORK, 8, 2);
            self.mask_xor(&[0x00, 0xff], &[COPY_TTL, 0x00], true);
            self.store_csum(8, 2, Some(IP_CSUM_OFFSET), false);
        } else {
            self.immediate(REG_1, &[COPY_TTL]);
            self.store(7, 1, false);
        }
    }

    /// `counter <ip ttl|ip6 hoplimit> set 2 dup to <to> device <ifindex> drop`
    fn count_dup_drop(&mut self, to: IpAddr, ifindex: u32) {
        self.counter();
        self.set_copy_ttl(to.is_ipv4());
        self.immediate(REG_1, &octets(to));
        self.immediate(REG_2, &ifindex.to_ne_bytes());
        self.dup();
        self.drop();
    }
}

fn octets(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Offset of the destination address in the IP header.
fn daddr_offset(vip: IpAddr) -> u32 {
    if vip.is_ipv4() { 16 } else { 24 }
}

/// Offset of the source address in the IP header.
const IP6_SADDR: u32 = 8;

fn rule(w: &mut Writer, table: &str, chain: ChainSpec, body: impl FnOnce(&mut Program<'_>)) {
    w.string(NFTA_RULE_TABLE, table);
    w.string(NFTA_RULE_CHAIN, chain.name);
    w.nest(NFTA_RULE_EXPRESSIONS, |w| body(&mut Program { w }));
}

/// The forwarder's first rule for one VIP, in table `ip`/`ip6 <table>` chain
/// `prerouting`: a segment that only a listening socket bound to the wildcard address
/// would take — no connection of this host's has it.
///
/// `ip daddr <vip> iif <ifindex> meta l4proto tcp tcp flags & (syn|ack) != syn socket
/// wildcard 1 counter ip ttl set 2 dup to <old_holder> device <ifindex> drop`
///
/// [`forward_rule`] asks conntrack, which is wrong when the flow's addresses and ports
/// were used before: a client that reuses a port (TIME_WAIT reuse, a busy proxy) may
/// send the ACK of a handshake the old holder answered to a 4-tuple that this host's
/// conntrack still keeps from an earlier connection it served (TIME_WAIT: 120 s). For
/// conntrack that segment is `established` or `invalid`, not `new`, and this host would
/// answer it with a reset. The socket lookup is exact for this host's own connections
/// (an established socket is bound to the VIP; a handshake in progress or a time-wait
/// socket is no full socket: no match) and matches only when the service listens on the
/// wildcard address; a listener bound to the VIP itself leaves it to the conntrack rules.
pub(crate) fn forward_unowned_rule(
    w: &mut Writer,
    table: &str,
    vip: IpAddr,
    old_holder: IpAddr,
    iif: u32,
    ifindex: u32,
) {
    rule(w, table, FWD_PREROUTING, |p| {
        p.tcp_to_vip_with_flags(vip, iif, TCP_FLAG_SYN | TCP_FLAG_ACK, TCP_FLAG_SYN);
        p.socket_wildcard();
        p.cmp(CMP_EQ, &[1]);
        p.count_dup_drop(old_holder, ifindex);
    });
}

/// The forwarder's second rule for one VIP, in table `ip`/`ip6 <table>` chain `prerouting`:
///
/// `ip daddr <vip> iif <ifindex> meta l4proto tcp tcp flags & (syn|ack) != syn ct state
/// new counter ip ttl set 2 dup to <old_holder> device <ifindex> drop` (IPv6: `ip6
/// hoplimit set 2`)
///
/// What all three rules share, against loops between the two members (issue 25):
///
/// - `iif <ifindex>`: only segments that arrive on the VIP's link, where the clients
///   are; nothing that reaches this host another way (a tunnel, a pod's interface) is
///   sent to the old holder.
/// - `ip ttl set 2` before `dup`, which decrements it once more in PREROUTING: every
///   copy reaches the old holder with TTL (hop limit) 1. Delivered locally — the VIP is
///   still an address there while it drains — a TTL is never checked; but no node can
///   route such a copy on (a router drops a packet whose TTL would reach 0), so an old
///   holder that no longer has the VIP (its drain ended first, its agent stopped or
///   restarted, or it runs a version without the guard) can never send a copy back here
///   to be copied again. The copy's L2 source would also tell it apart, but the old
///   holder's MAC is not known when the rules are written (and changes with a bond's
///   failover); the TTL needs nothing. The original is dropped, so setting its TTL harms
///   nothing; an application on the old holder that insists on a minimum TTL
///   (`IP_MINTTL`, GTSM) would refuse the copies.
///
/// The caller checks that `vip` and `old_holder` are of one family.
pub(crate) fn forward_rule(w: &mut Writer, table: &str, vip: IpAddr, old_holder: IpAddr, iif: u32, ifindex: u32) {
    rule(w, table, FWD_PREROUTING, |p| {
        // TCP flags are byte 13 of the header: everything but a plain SYN (a SYN-ACK
        // would be odd towards a VIP, and is a reply to the old holder's SYN anyway).
        p.tcp_to_vip_with_flags(vip, iif, TCP_FLAG_SYN | TCP_FLAG_ACK, TCP_FLAG_SYN);
        // A flow this host's conntrack does not know: `new` (nf_conntrack_tcp_loose, the
        // default, picks up a mid-stream segment). Not `invalid` in general: conntrack also
        // calls an out-of-window segment of this host's own connection invalid, and the old
        // holder would answer that with a reset that kills it ([`forward_close_rule`] takes
        // the invalid FIN and RST). With tcp_loose off nothing but those is forwarded (the
        // agent warns).
        p.ct_state();
        p.and(&CT_STATE_NEW.to_ne_bytes(), false);
        p.cmp(CMP_NEQ, &[0; 4]);
        p.count_dup_drop(old_holder, ifindex);
    });
}

/// The forwarder's third rule for one VIP: the closing segments of a flow this host's
/// conntrack does not know.
///
/// `ip daddr <vip> iif <ifindex> meta l4proto tcp tcp flags & (fin|rst) != 0 ct state
/// invalid counter ip ttl set 2 dup to <old_holder> device <ifindex> drop`
///
/// Conntrack picks up no flow from a FIN or a RST: those of the old holder's connections
/// are `invalid`, not `new`. Forwarded, the old holder sees its clients close (else it
/// keeps them open until the drain ends, and this host answers the close with a reset).
/// Only FIN and RST: an invalid segment of this host's own connection (out of its
/// window) forwarded would be answered by the old holder with a reset; a forwarded RST is
/// answered by nobody, and an invalid FIN of its own is rare.
pub(crate) fn forward_close_rule(w: &mut Writer, table: &str, vip: IpAddr, old_holder: IpAddr, iif: u32, ifindex: u32) {
    rule(w, table, FWD_PREROUTING, |p| {
        p.tcp_to_vip_with_flags(vip, iif, TCP_FLAG_FIN | TCP_FLAG_RST, 0);
        p.ct_state();
        p.and(&CT_STATE_INVALID.to_ne_bytes(), false);
        p.cmp(CMP_NEQ, &[0; 4]);
        p.count_dup_drop(old_holder, ifindex);
    });
}

/// The guard's rule for one VIP, in table `ip`/`ip6 <table>` chain `prerouting`
/// (priority 0, after DNAT): a packet to the VIP that arrives on the VIP's link while
/// the VIP is no address of this host is dropped rather than routed back out of that
/// link.
///
/// `<ip|ip6> daddr <vip> iif <ifindex> fib daddr type != local counter drop`
///
/// A member that holds the VIP (on its link, or on `lo` while it drains) has it as a
/// local address: nothing is dropped. One that does not would, with forwarding on (every
/// Kubernetes node), route the packet to the VIP's current holder — the very next hop
/// it came from when the holder's drain forwarder sent it, and so on until the TTL runs
/// out. Packets kube-proxy (or any DNAT at priority -100) rewrote are no longer addressed
/// to the VIP here; a pod's packets to the VIP arrive on its own interface, not the
/// VIP's link, and are routed as before.
pub(crate) fn guard_rule(w: &mut Writer, table: &str, vip: IpAddr, ifindex: u32) {
    rule(w, table, GUARD_PREROUTING, |p| {
        p.field_eq(BASE_NETWORK, daddr_offset(vip), &octets(vip));
        p.iif(ifindex);
        p.daddr_not_local();
        p.counter();
        p.drop();
    });
}

/// The quieter's input rule for one VIP: do not answer who-has for it.
///
/// - ARP (table `arp`, chain `input`): `arp htype 1 arp ptype ip arp hlen 6 arp plen 4
///   arp operation request arp daddr ip <vip> counter drop`;
/// - IPv6 (table `ip6`, chain `input`): `icmpv6 type nd-neighbor-solicit @th,64,128
///   <vip> counter drop` (bytes 8..24 of a neighbour solicitation are its target).
pub(crate) fn quiet_input_rule(w: &mut Writer, table: &str, vip: IpAddr) {
    match vip {
        IpAddr::V4(v) => rule(w, table, QUIET_ARP_INPUT, |p| {
            p.field_eq(BASE_NETWORK, 0, &ARP_ETHER_IPV4);
            let mut hlen_plen_op = ARP_HLEN_PLEN.to_vec();
            hlen_plen_op.extend_from_slice(&ARP_OP_REQUEST);
            p.field_eq(BASE_NETWORK, 4, &hlen_plen_op);
            p.field_eq(BASE_NETWORK, 24, &v.octets());
            p.counter();
            p.drop();
        }),
        IpAddr::V6(v) => rule(w, table, QUIET_IP6_INPUT, |p| {
            p.l4proto(IPPROTO_ICMPV6);
            p.field_eq(BASE_TRANSPORT, 0, &[ND_NEIGHBOR_SOLICIT]);
            p.field_eq(BASE_TRANSPORT, 8, &v.octets());
            p.counter();
            p.drop();
        }),
    }
}

/// The quieter's output rule for one VIP: never ask who-has *from* the VIP.
///
/// When this node resolves a client while answering from the VIP, the kernel takes
/// the VIP as the sender address (ARP with `arp_announce=0`; a neighbour solicitation
/// uses the triggering packet's source), and the client would point its entry for
/// the VIP back at this node. The sender becomes `own` instead:
///
/// - ARP (table `arp`, chain `output`): `arp htype 1 arp ptype ip arp hlen 6 arp plen 4
///   arp saddr ip <vip> counter arp saddr ip set <own>`;
/// - IPv6 (table `ip6`, chain `output`): `ip6 saddr <vip> icmpv6 type
///   nd-neighbor-solicit counter ip6 saddr set <own>`, with the ICMPv6 checksum fixed.
///
/// The caller checks that `vip` and `own` are of one family.
pub(crate) fn quiet_output_rule(w: &mut Writer, table: &str, vip: IpAddr, own: IpAddr) {
    match vip {
        IpAddr::V4(v) => rule(w, table, QUIET_ARP_OUTPUT, |p| {
            p.field_eq(BASE_NETWORK, 0, &ARP_ETHER_IPV4);
            p.field_eq(BASE_NETWORK, 4, &ARP_HLEN_PLEN);
            p.field_eq(BASE_NETWORK, 14, &v.octets());
            p.counter();
            p.immediate(REG_1, &octets(own));
            p.store(14, 4, false);
        }),
        IpAddr::V6(v) => rule(w, table, QUIET_IP6_OUTPUT, |p| {
            p.field_eq(BASE_NETWORK, IP6_SADDR, &v.octets());
            p.l4proto(IPPROTO_ICMPV6);
            p.field_eq(BASE_TRANSPORT, 0, &[ND_NEIGHBOR_SOLICIT]);
            p.counter();
            p.immediate(REG_1, &octets(own));
            p.store(IP6_SADDR, 16, true);
        }),
    }
}

/// A counter's value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Counter {
    /// Packets that matched.
    pub packets: u64,
    /// Their bytes (at the network layer).
    pub bytes: u64,
}

/// What a rule dump says about one forwarder rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DumpedRule {
    pub(crate) family: u8,
    pub(crate) table: String,
    pub(crate) chain: String,
    /// The address the rule's first comparison matches (its VIP).
    pub(crate) vip: IpAddr,
    pub(crate) counter: Counter,
}

/// One expression of a dumped rule: its name and its data attributes.
struct DumpedExpr<'a> {
    name: &'a str,
    data: Vec<Attr<'a>>,
}

impl DumpedExpr<'_> {
    fn get(&self, ty: u16) -> Result<&Attr<'_>, ParseError> {
        match self.data.iter().find(|a| a.ty == ty) {
            Some(a) => Ok(a),
            None => malformed(format!("{} expression without attribute {ty}", self.name)),
        }
    }
}

fn exprs<'a>(list: &Attr<'a>) -> Result<Vec<DumpedExpr<'a>>, ParseError> {
    let mut out = Vec::new();
    for elem in list.nested() {
        let elem = elem?;
        if elem.ty != NFTA_LIST_ELEM {
            return malformed(format!("attribute {} in an expression list", elem.ty));
        }
        let (mut name, mut data) = (None, Vec::new());
        for a in elem.nested() {
            let a = a?;
            match a.ty {
                NFTA_EXPR_NAME => name = Some(a.string()?),
                NFTA_EXPR_DATA => data = a.nested().collect::<Result<_, _>>()?,
                _ => {} // newer kernels may add attributes: skip, as netlink intends
            }
        }
        let Some(name) = name else { return malformed("an expression without a name") };
        out.push(DumpedExpr { name, data });
    }
    Ok(out)
}

/// Reads one message of a forwarder rule dump (`NFT_MSG_NEWRULE`, attributes after
/// the `nfgenmsg`).
///
/// The rule must look like [`forward_rule`]'s: it starts by comparing the destination
/// address of its family with a VIP, and it has exactly one counter. Anything else in
/// a havip table (someone edited it by hand, or a newer havip wrote it) is an error
/// rather than a guess.
pub(crate) fn parse_forward_rule(family: u8, body: &[u8]) -> Result<DumpedRule, ParseError> {
    let (mut table, mut chain, mut list) = (None, None, None);
    for a in msg::attrs(body) {
        let a = a?;
        match a.ty {
            NFTA_RULE_TABLE => table = Some(a.string()?),
            NFTA_RULE_CHAIN => chain = Some(a.string()?),
            NFTA_RULE_EXPRESSIONS => list = Some(a),
            _ => {}
        }
    }
    let (Some(table), Some(chain), Some(list)) = (table, chain, list) else {
        return malformed("a rule without table, chain or expressions");
    };
    let exprs = exprs(&list)?;
    let (addr_len, offset): (u32, u32) = match family {
        NFPROTO_IPV4 => (4, 16),
        NFPROTO_IPV6 => (16, 24),
        other => return malformed(format!("a forwarder rule in family {other}")),
    };
    let vip = match exprs.as_slice() {
        [load, cmp, ..] if load.name == "payload" && cmp.name == "cmp" => {
            let base = load.get(NFTA_PAYLOAD_BASE)?.u32_be()?;
            let off = load.get(NFTA_PAYLOAD_OFFSET)?.u32_be()?;
            let len = load.get(NFTA_PAYLOAD_LEN)?.u32_be()?;
            if (base, off, len) != (BASE_NETWORK, offset, addr_len) || cmp.get(NFTA_CMP_OP)?.u32_be()? != CMP_EQ {
                return malformed(format!("rule in {table} does not start with a destination address match"));
            }
            let mut value: &[u8] = &[];
            for a in cmp.get(NFTA_CMP_DATA)?.nested() {
                let a = a?;
                if a.ty == NFTA_DATA_VALUE {
                    value = a.value;
                }
            }
            match (family, value.len()) {
                (NFPROTO_IPV4, 4) => IpAddr::from(<[u8; 4]>::try_from(value).unwrap_or_default()),
                (NFPROTO_IPV6, 16) => IpAddr::from(<[u8; 16]>::try_from(value).unwrap_or_default()),
                (_, n) => return malformed(format!("rule in {table} compares the address with {n} bytes")),
            }
        }
        _ => return malformed(format!("rule in {table} does not start with a destination address match")),
    };
    let mut counters = exprs.iter().filter(|e| e.name == "counter");
    let (Some(c), None) = (counters.next(), counters.next()) else {
        return malformed(format!("rule for {vip} in {table} does not have exactly one counter"));
    };
    let counter =
        Counter { packets: c.get(NFTA_COUNTER_PACKETS)?.u64_be()?, bytes: c.get(NFTA_COUNTER_BYTES)?.u64_be()? };
    Ok(DumpedRule { family, table: table.to_owned(), chain: chain.to_owned(), vip, counter })
}

/// Reads one message of a table dump (`NFT_MSG_NEWTABLE`): the table's name.
pub(crate) fn parse_table_name(body: &[u8]) -> Result<String, ParseError> {
    for a in msg::attrs(body) {
        let a = a?;
        if a.ty == NFTA_TABLE_NAME {
            return Ok(a.string()?.to_owned());
        }
    }
    malformed("a table without a name")
}

#[cfg(test)]
mod tests;
