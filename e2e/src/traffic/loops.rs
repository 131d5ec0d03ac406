//! Counting the copies of a drain that loop between the members (issue 25, section 5).
//!
//! With forwarding on (every Kubernetes node), a member that receives a packet addressed
//! to a VIP it does not hold routes it back out of the VIP's link; during a drain the
//! new holder's forwarder copies such a packet to the old holder again, and so on until
//! the TTL runs out. [`LoopWatch`] puts a test-only table, `inet hvtest-loops`, on every
//! node and counts, per node, for the client's packets to the watched VIPs:
//!
//! - `routed`: those the node forwards (the `forward` hook) — a member never routes a
//!   client's packet to a VIP on purpose, so each is a looped copy;
//! - `from_members`: those that arrive from another member's MAC — on the new holder, the
//!   copies its forwarder sent that came back (on the old holder they are the forwarded
//!   copies themselves);
//! - `ttl_exceeded`: ICMP/ICMPv6 time-exceeded messages the node sends — a copy whose
//!   TTL ran out while the node was about to route it.
//!
//! The table is only an observer (priority -400, no verdicts).

use crate::host::netns::{self, NetnsError, Topology};
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

const TABLE: &str = "hvtest-loops";

/// One node's counters (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeLoops {
    /// Client packets to a VIP this node routed.
    pub routed: u64,
    /// Client packets to a VIP that arrived from another member's MAC.
    pub from_members: u64,
    /// Time-exceeded messages this node sent.
    pub ttl_exceeded: u64,
}

/// The counters of every node, `n0` first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loops(pub Vec<NodeLoops>);

impl Loops {
    /// Client packets to a VIP routed by any node: looped copies.
    pub fn routed(&self) -> u64 {
        self.0.iter().map(|n| n.routed).sum()
    }

    /// Time-exceeded messages sent by any node.
    pub fn ttl_exceeded(&self) -> u64 {
        self.0.iter().map(|n| n.ttl_exceeded).sum()
    }

    /// The copies that came back to node `i` (the new holder) from another member.
    pub fn bounced_to(&self, i: usize) -> u64 {
        self.0.get(i).map_or(0, |n| n.from_members)
    }
}

impl fmt::Display for Loops {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "n{i}: routed {} from members {} ttl-exceeded {}", n.routed, n.from_members, n.ttl_exceeded)?;
        }
        Ok(())
    }
}

/// The observer tables on every node of a topology.
pub struct LoopWatch {
    namespaces: Vec<String>,
}

impl LoopWatch {
    /// Installs `inet hvtest-loops` on every node of `topo`, watching the client's
    /// packets (from its IPv4 and IPv6 address; in a routed lab the client behind the
    /// router) to `vips`.
    pub fn install(topo: &Topology, vips: &[IpAddr]) -> Result<LoopWatch, NetnsError> {
        let client = topo.routed_client().unwrap_or_else(|| topo.client());
        let nodes = topo.nodes();
        let mut namespaces = Vec::new();
        for n in nodes {
            let others: Vec<&str> = nodes.iter().filter(|o| o.index != n.index).map(|o| o.data_mac.as_str()).collect();
            let others = others.join(", ");
            let mut pre = String::new();
            let mut fwd = String::new();
            for vip in vips {
                let (fam, src) = match vip {
                    IpAddr::V4(_) => ("ip", client.ip.to_string()),
                    IpAddr::V6(_) => ("ip6", client.ip6.to_string()),
                };
                pre.push_str(&format!(
                    "    ether saddr {{ {others} }} {fam} saddr {src} {fam} daddr {vip} counter comment \"from_members\"\n"
                ));
                fwd.push_str(&format!("    {fam} saddr {src} {fam} daddr {vip} counter comment \"routed\"\n"));
            }
            let script = format!(
                "table inet {TABLE} {{
  chain arrived {{
    type filter hook prerouting priority -400; policy accept;
{pre}  }}
  chain routed {{
    type filter hook forward priority -400; policy accept;
{fwd}  }}
  chain sent {{
    type filter hook output priority -400; policy accept;
    icmp type time-exceeded counter comment \"ttl_exceeded\"
    icmpv6 type time-exceeded counter comment \"ttl_exceeded\"
  }}
}}
"
            );
            let path = topo.dir().join(format!("{}-loops.nft", n.name));
            std::fs::write(&path, script)
                .map_err(|source| NetnsError::Io { op: format!("write {}", path.display()), source })?;
            netns::exec(&n.ns, "nft", &["-f", &path.display().to_string()])?;
            namespaces.push(n.ns.clone());
        }
        Ok(LoopWatch { namespaces })
    }

    /// The counters now.
    pub fn read(&self) -> Result<Loops, NetnsError> {
        let mut out = Vec::new();
        for ns in &self.namespaces {
            let json = netns::exec(ns, "nft", &["-j", "list", "table", "inet", TABLE])?;
            let by = counters(&json);
            let get = |k: &str| by.get(k).copied().unwrap_or(0);
            out.push(NodeLoops {
                routed: get("routed"),
                from_members: get("from_members"),
                ttl_exceeded: get("ttl_exceeded"),
            });
        }
        Ok(Loops(out))
    }
}

/// Packet counters of a table's rules (`nft -j list table`), summed by comment.
fn counters(json: &str) -> BTreeMap<String, u64> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let mut m = BTreeMap::new();
    for r in v["nftables"].as_array().into_iter().flatten().filter_map(|o| o.get("rule")) {
        let Some(key) = r["comment"].as_str() else { continue };
        let packets = r["expr"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|e| e.get("counter").and_then(|c| c["packets"].as_u64()))
            .unwrap_or(0);
        *m.entry(key.to_owned()).or_insert(0) += packets;
    }
    m
}

/// Stray TCP segments from the client to a VIP: an ACK from a new source port every
/// `every`, of no connection anybody has — as late segments of connections already
/// closed or reset, or a scanner's, look. The old holder has no socket for them, so
/// once it no longer holds the VIP, a node that routes them makes them loop (unlike a
/// segment of a connection still open there, which the kernel's early demultiplexing
/// may still hand to its socket). Sent through a raw socket in the client's namespace.
pub struct StraySegments {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<netns::NetnsThread<u64>>,
}

impl StraySegments {
    /// Starts sending from `src` (the client's address of the VIP's family) to `dst`.
    pub fn start(ns: &str, src: IpAddr, dst: std::net::SocketAddr, every: std::time::Duration) -> StraySegments {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = netns::run_in_netns(ns, move || {
            let mut sent = 0u64;
            let Ok(sock) = RawTcp::open(src) else { return 0 };
            let mut port: u16 = 30000;
            while !stop2.load(Ordering::SeqCst) {
                let seg = tcp_ack(src, dst.ip(), port, dst.port());
                if sock.send(&seg, dst.ip()) {
                    sent += 1;
                }
                port = if port >= 39999 { 30000 } else { port + 1 };
                std::thread::sleep(every);
            }
            sent
        })
        .expect("stray segment thread");
        StraySegments { stop, thread: Some(thread) }
    }

    /// Stops sending; returns how many were sent.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
}

impl Drop for StraySegments {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A raw IPv4 or IPv6 TCP socket bound to a source address (the kernel writes the IP
/// header; the TCP checksum is ours).
struct RawTcp {
    fd: std::os::fd::OwnedFd,
}

impl RawTcp {
    fn open(src: IpAddr) -> nix::Result<RawTcp> {
        use nix::sys::socket::{
            AddressFamily, SockFlag, SockProtocol, SockType, SockaddrIn, SockaddrIn6, bind, socket,
        };
        let family = if src.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
        let fd = socket(family, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::Tcp)?;
        use std::os::fd::AsRawFd;
        match src {
            IpAddr::V4(a) => bind(fd.as_raw_fd(), &SockaddrIn::from(std::net::SocketAddrV4::new(a, 0)))?,
            IpAddr::V6(a) => bind(fd.as_raw_fd(), &SockaddrIn6::from(std::net::SocketAddrV6::new(a, 0, 0, 0)))?,
        }
        Ok(RawTcp { fd })
    }

    fn send(&self, seg: &[u8], dst: IpAddr) -> bool {
        use nix::sys::socket::{MsgFlags, SockaddrIn, SockaddrIn6, sendto};
        use std::os::fd::AsRawFd;
        let r = match dst {
            IpAddr::V4(a) => sendto(
                self.fd.as_raw_fd(),
                seg,
                &SockaddrIn::from(std::net::SocketAddrV4::new(a, 0)),
                MsgFlags::empty(),
            ),
            IpAddr::V6(a) => sendto(
                self.fd.as_raw_fd(),
                seg,
                &SockaddrIn6::from(std::net::SocketAddrV6::new(a, 0, 0, 0)),
                MsgFlags::empty(),
            ),
        };
        r.is_ok()
    }
}

/// A bare TCP ACK header from `src:sport` to `dst:dport`, checksummed over the IPv4 or
/// IPv6 pseudo-header.
fn tcp_ack(src: IpAddr, dst: IpAddr, sport: u16, dport: u16) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..8].copy_from_slice(&0x1000_0000u32.to_be_bytes());
    h[8..12].copy_from_slice(&0x2000_0000u32.to_be_bytes());
    h[12] = 5 << 4;
    h[13] = 0x10; // ACK
    h[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let mut pseudo = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&[0, 6, 0, 20]);
        }
        (s, d) => {
            let six = |a: IpAddr| match a {
                IpAddr::V6(a) => a.octets(),
                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            };
            pseudo.extend_from_slice(&six(s));
            pseudo.extend_from_slice(&six(d));
            pseudo.extend_from_slice(&[0, 0, 0, 20, 0, 0, 0, 6]);
        }
    }
    pseudo.extend_from_slice(&h);
    let mut sum: u32 = pseudo.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    h
}
