//! The drain's nftables rules ([`havip_node_agent::nft`]) against the real kernel, in
//! network namespaces: the rules as `nft` shows them, their removal, and the drain
//! itself — a client's established TCP connection survives a planned move of its VIP
//! from node A to node B, IPv4 and IPv6 — with the controls that show each rule set
//! is needed; and, with forwarding on in every node as on a Kubernetes node, that no
//! forwarded copy loops between the two nodes (the forwarder's TTL, the old holder's
//! guard) and what the guard leaves alone. Needs root (CAP_NET_ADMIN); prints a
//! `SKIPPED:` line and passes otherwise. Every test builds its own topology, so they run in parallel.
//!
//! The `nft` binary only observes here (`nft -j list ruleset`, and test-only counter
//! tables); the rules themselves are installed through netlink by the agent's code.

use havip_e2e::loops::{LoopWatch, StraySegments};
use havip_e2e::netns::{self, NodeInfo, Topology};
use havip_node_agent::announce::L2Sender;
use havip_node_agent::nft::{Counter, ForwardRule, GuardRule, Nft, NftError, QuietRule, TableRef};
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, sendto, socket};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

macro_rules! require_root {
    () => {
        if !netns::skip_unless_root(std::thread::current().name().unwrap_or(module_path!())) {
            return;
        }
        havip_e2e::init_tracing();
    };
}

const PAIR: &str = "web";
const PORT: u16 = 7300;

// ---------------------------------------------------------------------------------
// Helpers: nft in a namespace, what `nft` shows, echo servers, the client's stream.

/// An [`Nft`] whose socket lives in `ns` (a socket keeps the namespace it was made in,
/// so it can be used from any thread afterwards).
fn nft_in(ns: &str) -> Nft {
    netns::in_netns(ns, Nft::open).expect("thread in namespace").expect("open nft")
}

fn ifindex(ns: &str, dev: &str) -> u32 {
    let path = format!("/sys/class/net/{dev}/ifindex");
    netns::exec(ns, "cat", &[&path]).expect("ifindex").trim().parse().expect("ifindex is a number")
}

/// `nft -j list ruleset` in `ns`: the objects of the `nftables` array, without metainfo.
fn ruleset(ns: &str) -> Vec<Value> {
    let out = netns::exec(ns, "nft", &["-j", "list", "ruleset"]).expect("nft -j list ruleset");
    let v: Value = serde_json::from_str(&out).expect("nft JSON");
    v["nftables"].as_array().expect("nftables array").iter().filter(|o| o.get("metainfo").is_none()).cloned().collect()
}

/// The tables in `ns`, as `(family, name)`, sorted.
fn tables(ns: &str) -> Vec<(String, String)> {
    let mut t: Vec<(String, String)> = ruleset(ns)
        .iter()
        .filter_map(|o| o.get("table"))
        .map(|t| (t["family"].as_str().unwrap_or("?").to_owned(), t["name"].as_str().unwrap_or("?").to_owned()))
        .collect();
    t.sort();
    t
}

/// The base chains in `ns`: `"<family> <table> <chain>" → "<type> <hook> <prio> <policy>"`.
fn chains(ns: &str) -> BTreeMap<String, String> {
    ruleset(ns)
        .iter()
        .filter_map(|o| o.get("chain"))
        .map(|c| {
            let s = |k: &str| c[k].as_str().map(str::to_owned).unwrap_or_else(|| c[k].to_string());
            (
                format!("{} {} {}", s("family"), s("table"), s("name")),
                format!("{} {} {} {}", s("type"), s("hook"), s("prio"), s("policy")),
            )
        })
        .collect()
}

/// The rule lines of `nft list ruleset` in `ns`, trimmed (the text form is the most
/// readable statement of what a rule does; it is nft 1.0.6's spelling).
fn rule_lines(ns: &str) -> Vec<String> {
    let out = netns::exec(ns, "nft", &["list", "ruleset"]).expect("nft list ruleset");
    out.lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("table ")
                && !l.starts_with("chain ")
                && !l.starts_with("type ")
                && *l != "}"
        })
        .map(str::to_owned)
        .collect()
}

/// Packet counters of the rules of `family table` in `ns`, by the rule's comment, or
/// by its chain when it has none.
fn counters(ns: &str, family: &str, table: &str) -> BTreeMap<String, u64> {
    let out = netns::exec(ns, "nft", &["-j", "list", "table", family, table]).expect("nft -j list table");
    let v: Value = serde_json::from_str(&out).expect("nft JSON");
    let mut m = BTreeMap::new();
    for r in v["nftables"].as_array().into_iter().flatten().filter_map(|o| o.get("rule")) {
        let key = r["comment"].as_str().or(r["chain"].as_str()).unwrap_or("?").to_owned();
        let packets = r["expr"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|e| e.get("counter").and_then(|c| c["packets"].as_u64()))
            .unwrap_or(0);
        *m.entry(key).or_insert(0) += packets;
    }
    m
}

fn counter(ns: &str, family: &str, table: &str, key: &str) -> u64 {
    counters(ns, family, table).get(key).copied().unwrap_or_else(|| panic!("no rule {key} in {family} {table} in {ns}"))
}

fn forwarded(nft: &mut Nft, vip: IpAddr) -> Counter {
    let all = nft.forwarded(PAIR).expect("forwarded");
    all.iter()
        .find(|(v, _)| *v == vip)
        .map(|(_, c)| *c)
        .unwrap_or_else(|| panic!("no forwarder rule for {vip}: {all:?}"))
}

/// A TCP server in a namespace that answers every line with `<name> <line>`, one
/// thread per connection, until dropped.
struct Echo {
    stop: Arc<AtomicBool>,
    thread: Option<netns::NetnsThread<()>>,
}

impl Echo {
    fn start(ns: &str, name: &str, bind: SocketAddr) -> Echo {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop2, name) = (stop.clone(), name.to_owned());
        let thread = netns::run_in_netns(ns, move || {
            let l = TcpListener::bind(bind).expect("bind echo");
            l.set_nonblocking(true).expect("nonblocking");
            tx.send(()).expect("ready");
            let mut conns = Vec::new();
            while !stop2.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((s, _)) => {
                        let (stop, name) = (stop2.clone(), name.clone());
                        conns.push(std::thread::spawn(move || echo(s, &name, &stop)));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                    Err(e) => panic!("accept: {e}"),
                }
            }
            for c in conns {
                let _ = c.join();
            }
        })
        .expect("echo thread");
        rx.recv().expect("echo listening");
        Echo { stop, thread: Some(thread) }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn echo(mut s: TcpStream, name: &str, stop: &AtomicBool) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let mut pending = Vec::new();
    let mut chunk = [0u8; 512];
    while !stop.load(Ordering::SeqCst) {
        match s.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                continue;
            }
            Err(_) => return,
        }
        while let Some(i) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            let reply = format!("{name} {}", String::from_utf8_lossy(&line));
            if s.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    }
}

/// Opens a TCP connection from `ns` (the socket stays in that namespace).
fn connect(ns: &str, to: SocketAddr) -> TcpStream {
    let s = netns::in_netns(ns, move || TcpStream::connect_timeout(&to, Duration::from_secs(2)))
        .expect("thread in namespace")
        .unwrap_or_else(|e| panic!("connect from {ns} to {to}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    s
}

/// Sends `line` and returns the server's answer (`<node> <line>`).
fn say(s: &mut TcpStream, line: &str) -> std::io::Result<String> {
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut got = Vec::new();
    let mut chunk = [0u8; 256];
    while !got.contains(&b'\n') {
        match s.read(&mut chunk)? {
            0 => return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "closed")),
            n => got.extend_from_slice(&chunk[..n]),
        }
    }
    Ok(String::from_utf8_lossy(&got).trim().to_owned())
}

/// One new connection, one line: who answered.
fn served_by(ns: &str, to: SocketAddr) -> String {
    let mut s = connect(ns, to);
    let answer = say(&mut s, "who").expect("new connection answers");
    let _ = s.shutdown(Shutdown::Both);
    answer.trim_end_matches(" who").to_owned()
}

// ---------------------------------------------------------------------------------
// The drain: a topology, a VIP on node A, a client connection to it, and the move.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ip {
    V4,
    V6,
}

fn addr_of(n: &NodeInfo, ip: Ip) -> IpAddr {
    match ip {
        Ip::V4 => n.data_ip.into(),
        Ip::V6 => n.data_ip6.into(),
    }
}

fn add_vip(ns: &str, vip: IpAddr) {
    let args: Vec<String> = match vip {
        IpAddr::V4(v) => ["addr", "add", &format!("{v}/24"), "dev", "eth0"].map(str::to_owned).to_vec(),
        // No DAD: the old holder still has the address, DAD would fail.
        IpAddr::V6(v) => ["addr", "add", &format!("{v}/64"), "dev", "eth0", "nodad"].map(str::to_owned).to_vec(),
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    netns::exec(ns, "ip", &args).expect("add VIP");
}

/// A gratuitous ARP or unsolicited NA for `vip` from `ns`'s eth0, as the agent sends.
fn announce(ns: &str, vip: IpAddr) {
    netns::in_netns(ns, move || {
        let tx = L2Sender::open("eth0").expect("layer-2 sender");
        match vip {
            IpAddr::V4(v) => tx.send_garp(v),
            IpAddr::V6(v) => tx.send_unsolicited_na(v),
        }
        .expect("announce");
    })
    .expect("thread in namespace");
}

fn neighbour_mac(ns: &str, ip: IpAddr) -> Option<String> {
    netns::neighbour(ns, "eth0", ip).expect("neighbours").filter(|n| n.is_resolved()).and_then(|n| n.mac)
}

struct Drain {
    /// Its namespaces.
    topo: Topology,
    ip: Ip,
    a: NodeInfo,
    b: NodeInfo,
    vip: IpAddr,
    client_ns: String,
    client: IpAddr,
    _echo: [Echo; 2],
    /// The client's connection made while A held the VIP.
    old: TcpStream,
    nft_a: Nft,
    nft_b: Nft,
}

impl Drain {
    /// A (node 0) holds the VIP and serves the client's long-lived connection.
    fn new(ip: Ip) -> Drain {
        let topo = Topology::builder().nodes(2).build().expect("topology");
        if ip == Ip::V6 {
            topo.wait_ipv6_ready(Duration::from_secs(10)).expect("IPv6 ready");
        }
        let (a, b) = (topo.node(0).clone(), topo.node(1).clone());
        forwarding_on(&a.ns);
        forwarding_on(&b.ns);
        let (vip, client): (IpAddr, IpAddr) = match ip {
            Ip::V4 => (topo.vip(0).into(), topo.client().ip.into()),
            Ip::V6 => (topo.vip6(0).into(), topo.client().ip6.into()),
        };
        let any: SocketAddr = match ip {
            Ip::V4 => (Ipv4Addr::UNSPECIFIED, PORT).into(),
            Ip::V6 => (std::net::Ipv6Addr::UNSPECIFIED, PORT).into(),
        };
        let echo = [Echo::start(&a.ns, &a.name, any), Echo::start(&b.ns, &b.name, any)];
        add_vip(&a.ns, vip);
        let client_ns = topo.client().ns.clone();
        let mut old = connect(&client_ns, (vip, PORT).into());
        assert_eq!(say(&mut old, "hello").expect("echo"), format!("{} hello", a.name));
        assert_eq!(
            neighbour_mac(&client_ns, vip).as_deref(),
            Some(a.data_mac.as_str()),
            "the client reaches the VIP at A"
        );
        let (nft_a, nft_b) = (nft_in(&a.ns), nft_in(&b.ns));
        Drain { topo, ip, a, b, vip, client_ns, client, _echo: echo, old, nft_a, nft_b }
    }

    fn target(&self) -> SocketAddr {
        (self.vip, PORT).into()
    }

    /// The planned move as the drain does it: A stops attracting the VIP (quieter), B
    /// forwards what is not its own (forwarder), B takes the VIP and announces it until
    /// the client's neighbour entry points at B.
    fn move_to_b(&mut self, quieter: bool, forwarder: bool) {
        if quieter {
            let own = addr_of(&self.a, self.ip);
            self.nft_a.set_quieter(PAIR, &[QuietRule { vip: self.vip, own }]).expect("quieter on A");
        }
        if forwarder {
            let rule = ForwardRule {
                vip: self.vip,
                old_holder: addr_of(&self.a, self.ip),
                ifindex: ifindex(&self.b.ns, "eth0"),
                iif: ifindex(&self.b.ns, "eth0"),
            };
            self.nft_b.set_forwarder(PAIR, &[rule]).expect("forwarder on B");
        }
        add_vip(&self.b.ns, self.vip);
        // The client accepts an announcement only outside the entry's locktime (1 s
        // after its last update): announce until it took.
        let start = Instant::now();
        while neighbour_mac(&self.client_ns, self.vip).as_deref() != Some(self.b.data_mac.as_str()) {
            assert!(start.elapsed() < Duration::from_secs(5), "the client never moved the VIP to B");
            announce(&self.b.ns, self.vip);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Makes A resolve the client again: its next answer needs an ARP request /
    /// neighbour solicitation, which the kernel sends from the VIP.
    fn flush_a_neighbour(&self) {
        let to = self.client.to_string();
        netns::exec(&self.a.ns, "ip", &["neigh", "flush", "to", &to, "dev", "eth0"]).expect("flush");
        assert_eq!(neighbour_mac(&self.a.ns, self.client), None, "A forgot the client");
    }

    /// Polls for `within` that the client's entry for the VIP stays at B.
    fn assert_client_stays_at_b(&self, within: Duration) {
        let start = Instant::now();
        while start.elapsed() < within {
            let mac = neighbour_mac(&self.client_ns, self.vip);
            assert_eq!(mac.as_deref(), Some(self.b.data_mac.as_str()), "the client's entry for the VIP left B");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn is_reset(r: &std::io::Result<String>) -> bool {
    matches!(r, Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe))
}

fn drain_keeps_the_old_connection(ip: Ip) {
    let mut d = Drain::new(ip);
    d.move_to_b(true, true);
    let (a, b) = (d.a.name.clone(), d.b.name.clone());

    // The old connection is still served by A, through B's forwarder; a new one is B's.
    for i in 0..5 {
        assert_eq!(say(&mut d.old, &format!("moved {i}")).expect("old connection"), format!("{a} moved {i}"));
    }
    assert_eq!(served_by(&d.client_ns, d.target()), b, "a new connection goes to B");
    let fwd = forwarded(&mut d.nft_b, d.vip);
    assert!(fwd.packets >= 5 && fwd.bytes > 0, "B forwarded the old connection's segments: {fwd:?}");

    // A must resolve the client again: it asks from its own address, not the VIP, so
    // the client's entry for the VIP stays at B.
    d.flush_a_neighbour();
    assert_eq!(say(&mut d.old, "after flush").expect("old connection"), format!("{a} after flush"));
    assert!(neighbour_mac(&d.a.ns, d.client).is_some(), "A resolved the client again");
    d.assert_client_stays_at_b(Duration::from_millis(300));
    let (family, output) = match ip {
        Ip::V4 => ("arp", "output"),
        Ip::V6 => ("ip6", "output"),
    };
    let quiet =
        TableRef::of_pair(PAIR).expect("names").into_iter().find(|t| t.name.ends_with("-quiet")).expect("quiet");
    assert!(counter(&d.a.ns, family, &quiet.name, output) >= 1, "the quieter rewrote A's request");
    assert_eq!(served_by(&d.client_ns, d.target()), b);
    assert_eq!(say(&mut d.old, "still").expect("old connection"), format!("{a} still"));

    // Without the rules the old connection is B's to reset, and nothing is left.
    d.nft_b.remove_pair(PAIR).expect("remove B's rules");
    d.nft_a.remove_pair(PAIR).expect("remove A's rules");
    let r = say(&mut d.old, "gone");
    assert!(is_reset(&r), "B resets the old connection once it stops forwarding: {r:?}");
    for n in [&d.a, &d.b] {
        let left = netns::exec(&n.ns, "nft", &["list", "ruleset"]).expect("nft list ruleset");
        assert_eq!(left.trim(), "", "rules left on {}", n.name);
    }
    assert_eq!(served_by(&d.client_ns, d.target()), b);
}

#[test]
fn drain_keeps_the_old_connection_ipv4() {
    require_root!();
    drain_keeps_the_old_connection(Ip::V4);
}

#[test]
fn drain_keeps_the_old_connection_ipv6() {
    require_root!();
    drain_keeps_the_old_connection(Ip::V6);
}

/// The control: the same move without B's forwarder resets the old connection, so
/// the drain test above would fail if the forwarder did nothing.
fn without_forwarder_the_old_connection_is_reset(ip: Ip) {
    let mut d = Drain::new(ip);
    d.move_to_b(true, false);
    let r = say(&mut d.old, "moved");
    assert!(is_reset(&r), "without a forwarder B resets the old connection: {r:?}");
    assert_eq!(served_by(&d.client_ns, d.target()), d.b.name);
}

#[test]
fn without_forwarder_the_old_connection_is_reset_ipv4() {
    require_root!();
    without_forwarder_the_old_connection_is_reset(Ip::V4);
}

#[test]
fn without_forwarder_the_old_connection_is_reset_ipv6() {
    require_root!();
    without_forwarder_the_old_connection_is_reset(Ip::V6);
}

/// The control for the quieter: without it, A's own request for the client (sent from
/// the VIP) points the client's entry for the VIP back at A.
fn without_quieter_the_old_holder_pulls_the_vip_back(ip: Ip) {
    let mut d = Drain::new(ip);
    d.move_to_b(false, true);
    assert_eq!(say(&mut d.old, "moved").expect("old connection"), format!("{} moved", d.a.name));
    d.flush_a_neighbour();
    assert_eq!(say(&mut d.old, "after flush").expect("old connection"), format!("{} after flush", d.a.name));
    let what = format!("the client's entry for {} to point at A again", d.vip);
    netns::wait_until(&what, Duration::from_secs(2), Duration::from_millis(10), || {
        Ok(neighbour_mac(&d.client_ns, d.vip).as_deref() == Some(d.a.data_mac.as_str()))
    })
    .expect("without the quieter, A's solicitation from the VIP pulls the VIP back");
}

#[test]
fn without_quieter_the_old_holder_pulls_the_vip_back_ipv4() {
    require_root!();
    without_quieter_the_old_holder_pulls_the_vip_back(Ip::V4);
}

#[test]
fn without_quieter_the_old_holder_pulls_the_vip_back_ipv6() {
    require_root!();
    without_quieter_the_old_holder_pulls_the_vip_back(Ip::V6);
}

fn del_vip(ns: &str, vip: IpAddr) {
    let with_prefix = match vip {
        IpAddr::V4(v) => format!("{v}/24"),
        IpAddr::V6(v) => format!("{v}/64"),
    };
    netns::exec(ns, "ip", &["addr", "del", &with_prefix, "dev", "eth0"]).expect("delete VIP");
}

/// A's drain ends (the VIP and its quieter go) while B still forwards to it — the gap
/// until the new holder hears of the end, or an old holder whose agent stopped or
/// restarted. With forwarding on in both (issue 25), nothing the client sends may loop
/// between them: no node routes a client's packet to the VIP, none comes back to B.
/// (A segment of a connection still open on A may be handed to its socket by the
/// kernel's early demultiplexing even without the address; stray segments are not.)
///
/// Without A's guard (an old holder of a version without it), B's copies arrive with TTL
/// 1 and A drops them as it would route them, answering with time-exceeded; with the
/// guard (every member runs one), A drops them silently, before routing.
fn a_drain_end_before_the_forwarder_loops_nothing(ip: Ip, guard_on_a: bool) {
    let mut d = Drain::new(ip);
    let guard = GuardRule { vip: d.vip, ifindex: ifindex(&d.a.ns, "eth0") };
    if guard_on_a {
        d.nft_a.set_guard(PAIR, &[guard]).expect("A's guard");
    }
    d.move_to_b(true, true);
    assert_eq!(say(&mut d.old, "moved").expect("old connection"), format!("{} moved", d.a.name));
    let watch = LoopWatch::install(&d.topo, &[d.vip]).expect("loop counters");
    let before = forwarded(&mut d.nft_b, d.vip).packets;
    del_vip(&d.a.ns, d.vip);
    d.nft_a.set_quieter(PAIR, &[]).expect("remove A's quieter");
    // Stray segments (of no connection A has a socket for: late segments of connections
    // closed there) reach B, which forwards them to A.
    let stray = StraySegments::start(&d.client_ns, d.client, d.target(), Duration::from_millis(5));
    netns::wait_until("B forwards stray segments", Duration::from_secs(5), Duration::from_millis(20), || {
        Ok(forwarded(&mut d.nft_b, d.vip).packets >= before + 20)
    })
    .expect("B forwarded the stray segments");
    let strays = stray.stop();
    std::thread::sleep(Duration::from_millis(200));
    let loops = watch.read().expect("loop counters");
    let copies = forwarded(&mut d.nft_b, d.vip).packets - before;
    let family = if ip == Ip::V4 { "ip" } else { "ip6" };
    let guarded = if guard_on_a { counter(&d.a.ns, family, "havip-web-guard", "prerouting") } else { 0 };
    eprintln!(
        "{ip:?} guard on A {guard_on_a}: {strays} stray segments, {copies} copies, {guarded} dropped by the guard; {loops}"
    );
    assert_eq!((loops.routed(), loops.bounced_to(1)), (0, 0), "copies looped between A and B: {loops}");
    if guard_on_a {
        assert_eq!(loops.ttl_exceeded(), 0, "the guard drops them before routing: {loops}");
        assert_eq!(guarded, copies, "A's guard dropped every copy");
    } else {
        assert!(loops.0[0].ttl_exceeded > 0, "A drops TTL-1 copies as it would route them: {loops}");
    }
}

#[test]
fn a_drain_end_before_the_forwarder_loops_nothing_ipv4() {
    require_root!();
    a_drain_end_before_the_forwarder_loops_nothing(Ip::V4, false);
}

#[test]
fn a_drain_end_before_the_forwarder_loops_nothing_ipv6() {
    require_root!();
    a_drain_end_before_the_forwarder_loops_nothing(Ip::V6, false);
}

#[test]
fn the_old_holders_guard_drops_the_copies_silently_ipv4() {
    require_root!();
    a_drain_end_before_the_forwarder_loops_nothing(Ip::V4, true);
}

#[test]
fn the_old_holders_guard_drops_the_copies_silently_ipv6() {
    require_root!();
    a_drain_end_before_the_forwarder_loops_nothing(Ip::V6, true);
}

/// What the guard drops and what it leaves alone, on node A (forwarding on, the VIP held
/// by B): a client's packet to the VIP that reaches A on the VIP's link is dropped rather
/// than routed back to B; one that a DNAT rewrote first (kube-proxy's LoadBalancer rules,
/// `prerouting` priority -100) is routed; one that enters A on another interface (a
/// pod's, here the management link from node C) is routed to B; and once A holds the VIP
/// (on `lo`, as while it drains) the packet is delivered.
fn the_guard_drops_only_what_would_be_routed_back(ip: Ip) {
    let topo = Topology::builder().nodes(3).build().expect("topology");
    if ip == Ip::V6 {
        topo.wait_ipv6_ready(Duration::from_secs(10)).expect("IPv6 ready");
    }
    let (a, b, c) = (topo.node(0).clone(), topo.node(1).clone(), topo.node(2).clone());
    for n in [&a, &b, &c] {
        forwarding_on(&n.ns);
    }
    let (vip, client, fam, host) = match ip {
        Ip::V4 => (IpAddr::from(topo.vip(0)), IpAddr::from(topo.client().ip), "ip", 32),
        Ip::V6 => (IpAddr::from(topo.vip6(0)), IpAddr::from(topo.client().ip6), "ip6", 128),
    };
    let client_ns = topo.client().ns.clone();
    add_vip(&b.ns, vip);
    let mut nft_a = nft_in(&a.ns);
    nft_a.set_guard(PAIR, &[GuardRule { vip, ifindex: ifindex(&a.ns, "eth0") }]).expect("guard");
    let target: SocketAddr = (vip, PORT).into();
    // The client's entry for the VIP points at A (a stale entry, or a forwarder's copy).
    let vip_s = vip.to_string();
    netns::exec(
        &client_ns,
        "ip",
        &["neigh", "replace", &vip_s, "lladdr", &a.data_mac, "dev", "eth0", "nud", "permanent"],
    )
    .expect("client's entry for the VIP at A");
    let b_data = addr_of(&b, ip);
    let obs = format!(
        "table inet hvtest-obs {{
           chain routed {{
             type filter hook forward priority 0; policy accept;
             {fam} daddr {vip} counter comment \"to-vip\"
             {fam} daddr {b_data} counter comment \"to-b\"
           }}
           chain local {{
             type filter hook input priority 0; policy accept;
             {fam} daddr {vip} counter comment \"delivered\"
           }}
         }}"
    );
    nft_file(&topo, &a.ns, &obs);
    let guarded = || counter(&a.ns, fam, "havip-web-guard", "prerouting");
    let obs_a = |key: &str| counter(&a.ns, "inet", "hvtest-obs", key);
    let burst = |ns: &str, src: IpAddr| {
        let s = StraySegments::start(ns, src, target, Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(100));
        let n = s.stop();
        std::thread::sleep(Duration::from_millis(100));
        n
    };

    // Arrives on the VIP's link, the VIP is not A's: dropped, not routed.
    let n = burst(&client_ns, client);
    assert!(n > 0);
    assert_eq!((guarded(), obs_a("to-vip")), (n, 0), "dropped by the guard, none routed");

    // kube-proxy's DNAT comes first: the packet is no longer the VIP's, and is routed.
    let nat = format!(
        "table {fam} hvtest-nat {{
           chain pre {{
             type nat hook prerouting priority -100; policy accept;
             {fam} daddr {vip} dnat to {b_data}
           }}
         }}"
    );
    nft_file(&topo, &a.ns, &nat);
    let m = burst(&client_ns, client);
    assert_eq!(guarded(), n, "a DNATed packet is not the guard's");
    assert_eq!(obs_a("to-b"), m, "A routed the DNATed packets");
    netns::exec(&a.ns, "nft", &["delete", "table", fam, "hvtest-nat"]).expect("no NAT");

    // From another interface (a pod's): routed to the VIP's holder as before.
    let a_mgmt: IpAddr = match ip {
        Ip::V4 => a.mgmt_ip.into(),
        Ip::V6 => a.mgmt_ip6.into(),
    };
    let route = format!("{vip}/{host}");
    let via = a_mgmt.to_string();
    netns::exec(&c.ns, "ip", &["route", "replace", &route, "via", &via, "dev", "eth1"])
        .expect("C routes the VIP via A");
    let c_src: IpAddr = match ip {
        Ip::V4 => c.mgmt_ip.into(),
        Ip::V6 => c.mgmt_ip6.into(),
    };
    let k = burst(&c.ns, c_src);
    assert_eq!(guarded(), n, "what enters on another link is not the guard's");
    assert_eq!(obs_a("to-vip"), k, "A routed C's packets to the VIP's holder");

    // A holds the VIP (on lo, as while it drains): delivered, nothing dropped.
    netns::exec(&a.ns, "ip", &["addr", "add", &route, "dev", "lo"]).expect("VIP on lo");
    let l = burst(&client_ns, client);
    assert_eq!(guarded(), n, "a VIP A holds is not dropped");
    assert_eq!(obs_a("delivered"), l, "delivered to A");
    nft_a.remove_pair(PAIR).expect("remove");
}

#[test]
fn the_guard_drops_only_what_would_be_routed_back_ipv4() {
    require_root!();
    the_guard_drops_only_what_would_be_routed_back(Ip::V4);
}

#[test]
fn the_guard_drops_only_what_would_be_routed_back_ipv6() {
    require_root!();
    the_guard_drops_only_what_would_be_routed_back(Ip::V6);
}

// ---------------------------------------------------------------------------------
// The rules as nft sees them; removal.

#[test]
fn rules_appear_as_nft_shows_them_and_removal_leaves_nothing() {
    require_root!();
    let topo = Topology::builder().nodes(2).build().expect("topology");
    let (n0, n1) = (topo.node(0).clone(), topo.node(1).clone());
    let ns = n0.ns.clone();
    let (vip, vip6, vip2) = (IpAddr::from(topo.vip(0)), IpAddr::from(topo.vip6(0)), IpAddr::from(topo.vip(1)));
    let eth0 = ifindex(&ns, "eth0");
    let mut nft = nft_in(&ns);
    let fwd = [
        ForwardRule { vip, old_holder: n1.data_ip.into(), ifindex: eth0, iif: eth0 },
        ForwardRule { vip: vip6, old_holder: n1.data_ip6.into(), ifindex: eth0, iif: eth0 },
    ];
    let quiet = [QuietRule { vip, own: n0.data_ip.into() }, QuietRule { vip: vip6, own: n0.data_ip6.into() }];
    nft.set_forwarder("web", &fwd).expect("forwarder");
    nft.set_quieter("web", &quiet).expect("quieter");
    let guard = [GuardRule { vip, ifindex: eth0 }, GuardRule { vip: vip6, ifindex: eth0 }];
    nft.set_guard("web", &guard).expect("guard");
    nft.set_forwarder("db", &[ForwardRule { vip: vip2, old_holder: n1.data_ip.into(), ifindex: eth0, iif: eth0 }])
        .expect("db");

    let t = |f: &str, n: &str| (f.to_owned(), n.to_owned());
    let web = [
        t("arp", "havip-web-quiet"),
        t("ip", "havip-web-fwd"),
        t("ip", "havip-web-guard"),
        t("ip6", "havip-web-fwd"),
        t("ip6", "havip-web-guard"),
        t("ip6", "havip-web-quiet"),
    ];
    let mut all = web.to_vec();
    all.push(t("ip", "havip-db-fwd"));
    all.sort();
    assert_eq!(tables(&ns), all);
    let c = chains(&ns);
    assert_eq!(c["ip havip-web-fwd prerouting"], "filter prerouting -150 accept");
    assert_eq!(c["ip6 havip-web-fwd prerouting"], "filter prerouting -150 accept");
    assert_eq!(c["arp havip-web-quiet input"], "filter input 0 accept");
    assert_eq!(c["arp havip-web-quiet output"], "filter output 0 accept");
    assert_eq!(c["ip6 havip-web-quiet input"], "filter input 0 accept");
    assert_eq!(c["ip6 havip-web-quiet output"], "filter output 0 accept");
    assert_eq!(c["ip havip-web-guard prerouting"], "filter prerouting 0 accept");
    assert_eq!(c["ip6 havip-web-guard prerouting"], "filter prerouting 0 accept");
    assert_eq!(c.len(), 9, "{c:?}");
    let hex6 = match vip6 {
        IpAddr::V6(v) => format!("0x{:032x}", u128::from(v)),
        IpAddr::V4(_) => unreachable!(),
    };
    // Every forwarder rule: only what arrives on the VIP's link, and the copy leaves with
    // TTL 1 (set to 2; dup decrements it).
    let ttl = |vip: &str| if vip.starts_with("ip6") { "ip6 hoplimit set 2" } else { "ip ttl set 2" };
    let new = |vip: String, to: String| {
        format!(
            "{vip} iif \"eth0\" tcp flags != syn / syn,ack ct state new counter packets 0 bytes 0 {} dup to {to} device \"eth0\" drop",
            ttl(&vip)
        )
    };
    let db_rule = new(format!("ip daddr {vip2}"), n1.data_ip.to_string());
    let close = |vip: String, to: String| {
        format!(
            "{vip} iif \"eth0\" tcp flags fin,rst ct state invalid counter packets 0 bytes 0 {} dup to {to} device \"eth0\" drop",
            ttl(&vip)
        )
    };
    let unowned = |vip: String, to: String| {
        format!(
            "{vip} iif \"eth0\" tcp flags != syn / syn,ack socket wildcard 1 counter packets 0 bytes 0 {} dup to {to} device \"eth0\" drop",
            ttl(&vip)
        )
    };
    let mut want = vec![
        unowned(format!("ip daddr {vip}"), n1.data_ip.to_string()),
        unowned(format!("ip6 daddr {vip6}"), n1.data_ip6.to_string()),
        unowned(format!("ip daddr {vip2}"), n1.data_ip.to_string()),
        new(format!("ip daddr {vip}"), n1.data_ip.to_string()),
        close(format!("ip daddr {vip}"), n1.data_ip.to_string()),
        new(format!("ip6 daddr {vip6}"), n1.data_ip6.to_string()),
        close(format!("ip6 daddr {vip6}"), n1.data_ip6.to_string()),
        format!(
            "arp htype 1 arp ptype ip arp hlen 6 arp plen 4 arp operation request arp daddr ip {vip} counter packets 0 bytes 0 drop"
        ),
        format!(
            "arp htype 1 arp ptype ip arp hlen 6 arp plen 4 arp saddr ip {vip} counter packets 0 bytes 0 arp saddr ip set {}",
            n0.data_ip
        ),
        format!("icmpv6 type nd-neighbor-solicit @th,64,128 {hex6} counter packets 0 bytes 0 drop"),
        format!(
            "ip6 saddr {vip6} icmpv6 type nd-neighbor-solicit counter packets 0 bytes 0 ip6 saddr set {}",
            n0.data_ip6
        ),
        db_rule.clone(),
        close(format!("ip daddr {vip2}"), n1.data_ip.to_string()),
        format!("ip daddr {vip} iif \"eth0\" fib daddr type != local counter packets 0 bytes 0 drop"),
        format!("ip6 daddr {vip6} iif \"eth0\" fib daddr type != local counter packets 0 bytes 0 drop"),
    ];
    let mut got = rule_lines(&ns);
    want.sort();
    got.sort();
    assert_eq!(got, want);
    let mut listed: Vec<(String, String)> =
        nft.havip_tables().expect("havip tables").iter().map(|t| (t.family.to_string(), t.name.clone())).collect();
    listed.sort();
    assert_eq!(listed, all);
    let mut f = nft.forwarded("web").expect("forwarded");
    f.sort_by_key(|(v, _)| *v);
    assert_eq!(f, [(vip, Counter::default()), (vip6, Counter::default())]);

    // Replacing with fewer rules keeps exactly those.
    nft.set_quieter("web", &quiet[1..]).expect("quieter, IPv6 only");
    assert!(!tables(&ns).contains(&t("arp", "havip-web-quiet")), "the ARP quieter is gone");
    assert!(tables(&ns).contains(&t("ip6", "havip-web-quiet")));

    // Two pairs are independent: removing one keeps the other, rules and all.
    nft.remove_pair("web").expect("remove web");
    assert_eq!(tables(&ns), [t("ip", "havip-db-fwd")]);
    let mut db_rules = rule_lines(&ns);
    db_rules.sort();
    let mut want_db = vec![
        db_rule,
        close(format!("ip daddr {vip2}"), n1.data_ip.to_string()),
        unowned(format!("ip daddr {vip2}"), n1.data_ip.to_string()),
    ];
    want_db.sort();
    assert_eq!(db_rules, want_db);
    nft.remove_pair("web").expect("removing again is fine");
    assert_eq!(nft.forwarded("web").expect("forwarded of a removed pair"), []);
    nft.remove_pair("db").expect("remove db");
    assert_eq!(netns::exec(&ns, "nft", &["list", "ruleset"]).expect("nft").trim(), "", "nothing left");

    // Start-up cleanup: everything havip's that is not a configured pair goes; tables
    // of others are left alone.
    netns::exec(&ns, "nft", &["add", "table", "ip", "someone-else"]).expect("a foreign table");
    nft.set_forwarder("gone", &fwd).expect("gone");
    nft.set_guard("gone", &guard).expect("gone's guard");
    nft.set_quieter("kept", &quiet).expect("kept");
    let removed = nft.remove_leftovers(&["kept"]).expect("cleanup");
    let removed: Vec<String> = removed.iter().map(ToString::to_string).collect();
    assert_eq!(removed, ["ip havip-gone-fwd", "ip havip-gone-guard", "ip6 havip-gone-fwd", "ip6 havip-gone-guard"]);
    assert_eq!(tables(&ns), [t("arp", "havip-kept-quiet"), t("ip", "someone-else"), t("ip6", "havip-kept-quiet")]);

    // A rule havip did not write in a forwarder table is reported, not misread.
    nft.set_forwarder("edited", &fwd[..1]).expect("edited");
    netns::exec(&ns, "nft", &["add", "rule", "ip", "havip-edited-fwd", "prerouting", "counter"])
        .expect("hand-made rule");
    match nft.forwarded("edited") {
        Err(e @ NftError::Malformed { .. }) => {
            assert!(e.to_string().starts_with("failed to list the rules of table ip havip-edited-fwd"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    nft.remove_pair("edited").expect("remove edited");
}

#[test]
fn the_longest_pair_name_gets_valid_table_names() {
    require_root!();
    let topo = Topology::builder().nodes(2).build().expect("topology");
    let ns = topo.node(0).ns.clone();
    let pair = format!("{}.{}", "a".repeat(126), "b".repeat(126));
    let vip = IpAddr::from(topo.vip(0));
    let mut nft = nft_in(&ns);
    nft.set_quieter(&pair, &[QuietRule { vip, own: topo.node(0).data_ip.into() }]).expect("quieter");
    nft.set_forwarder(
        &pair,
        &[ForwardRule {
            vip,
            old_holder: topo.node(1).data_ip.into(),
            ifindex: ifindex(&ns, "eth0"),
            iif: ifindex(&ns, "eth0"),
        }],
    )
    .expect("forwarder");
    let t = tables(&ns);
    assert_eq!(t.len(), 2, "{t:?}");
    assert!(t.iter().all(|(_, name)| name.len() <= 255 && name.contains('_')), "{t:?}");
    assert_eq!(nft.forwarded(&pair).expect("forwarded").len(), 1);
    nft.remove_pair(&pair).expect("remove");
    assert_eq!(tables(&ns), []);
}

// ---------------------------------------------------------------------------------
// Forged segments: what is forwarded and how.

/// A bare TCP header from `src:sport` to `dst:dport` with `flags`, checksummed.
fn tcp_segment(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..8].copy_from_slice(&0x1000_0000u32.to_be_bytes());
    h[8..12].copy_from_slice(&0x2000_0000u32.to_be_bytes());
    h[12] = 5 << 4;
    h[13] = flags;
    h[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 6, 0, 20]);
    pseudo.extend_from_slice(&h);
    let mut sum: u32 = pseudo.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    h
}

/// Sends one forged TCP segment from `ns` (a raw socket: no connection behind it).
fn forge(ns: &str, src: Ipv4Addr, dst: Ipv4Addr, sport: u16, flags: u8) {
    netns::in_netns(ns, move || {
        let fd =
            socket(AddressFamily::Inet, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::Tcp).expect("raw socket");
        let seg = tcp_segment(src, dst, sport, PORT, flags);
        sendto(fd.as_raw_fd(), &seg, &SockaddrIn::from(SocketAddrV4::new(dst, 0)), MsgFlags::empty()).expect("send");
    })
    .expect("thread in namespace");
}

/// Loads a test-only ruleset into `ns` with `nft -f`.
fn nft_file(topo: &Topology, ns: &str, text: &str) {
    let path = topo.dir().join(format!("{ns}.nft"));
    std::fs::write(&path, text).expect("write ruleset");
    netns::exec(ns, "nft", &["-f", &path.display().to_string()]).expect("nft -f");
}

const ACK: u8 = 0x10;
const SYN: u8 = 0x02;

/// The lab of the forged-segment tests: two nodes with forwarding on, the VIP on B (the
/// new holder), A (the old holder) an observer without the VIP, the client's entry for
/// the VIP resolved to B, and B's for A resolved — as the heartbeats keep it on a real
/// pair (a copy of a segment to an unresolved neighbour waits in its queue).
struct ForgedLab {
    topo: Topology,
    a: NodeInfo,
    b: NodeInfo,
    client: Ipv4Addr,
    client_ns: String,
    vip: Ipv4Addr,
}

fn forged_lab() -> ForgedLab {
    let topo = Topology::builder().nodes(2).build().expect("topology");
    let (a, b) = (topo.node(0).clone(), topo.node(1).clone());
    let (client, client_ns) = (topo.client().ip, topo.client().ns.clone());
    let vip = topo.vip(0);
    add_vip(&b.ns, vip.into());
    forwarding_on(&a.ns);
    forwarding_on(&b.ns);
    netns::resolve_neighbour(&client_ns, "eth0", vip.into(), Duration::from_secs(3)).expect("client resolves the VIP");
    netns::resolve_neighbour(&b.ns, "eth0", a.data_ip.into(), Duration::from_secs(3)).expect("B resolves A");
    ForgedLab { topo, a, b, client, client_ns, vip }
}

/// Forwarding on in `ns` (IPv4 and IPv6), as on every Kubernetes node: a member that
/// does not hold a VIP routes what it receives for it back out of the VIP's link. Every
/// test here runs so (issue 25); a test used to turn it off on the observing node instead.
fn forwarding_on(ns: &str) {
    netns::set_forwarding(ns, true).expect("forwarding on");
}

fn set_tcp_loose(ns: &str, on: bool) {
    netns::in_netns(ns, move || {
        std::fs::write("/proc/sys/net/netfilter/nf_conntrack_tcp_loose", if on { "1" } else { "0" })
    })
    .expect("thread in namespace")
    .expect("nf_conntrack_tcp_loose");
}

#[test]
fn forged_segments_are_forwarded_only_by_the_forwarder_and_never_a_syn() {
    require_root!();
    let ForgedLab { topo, a, b, client, client_ns, vip } = forged_lab();
    let mut nft_b = nft_in(&b.ns);
    // Observers (test-only tables): what reaches A, and what B does with the copy.
    let obs_a = format!(
        "table ip hvtest-obs {{
           chain pre {{
             type filter hook prerouting priority -300; policy accept;
             ip saddr {client} tcp dport {PORT} counter comment \"seen\"
             ip saddr {client} tcp dport {PORT} ip ttl 1 counter comment \"ttl1\"
           }}
         }}"
    );
    nft_file(&topo, &a.ns, &obs_a);
    let obs_b = format!(
        "table ip hvtest-obs {{
           chain pre {{
             type filter hook prerouting priority -160; policy accept;
             ip daddr {vip} tcp dport {PORT} ct state new counter comment \"new\"
             ip daddr {vip} tcp dport {PORT} ct state invalid counter comment \"invalid\"
           }}
           chain out {{
             type filter hook output priority 0; policy accept;
             ip daddr {vip} tcp dport {PORT} counter comment \"output\"
             ip daddr {vip} tcp dport {PORT} ct state untracked counter comment \"output-untracked\"
           }}
           chain post {{
             type filter hook postrouting priority 0; policy accept;
             ip daddr {vip} tcp dport {PORT} counter comment \"postrouting\"
           }}
         }}"
    );
    nft_file(&topo, &b.ns, &obs_b);
    let seen_on_a = || counter(&a.ns, "ip", "hvtest-obs", "seen");
    let settle = || std::thread::sleep(Duration::from_millis(300));

    // No forwarder: a stray ACK for an unknown flow is B's (B answers it with a reset),
    // nothing reaches A.
    forge(&client_ns, client, vip, 40001, ACK);
    settle();
    assert_eq!(seen_on_a(), 0, "nothing is forwarded without a forwarder");
    assert_eq!(counter(&b.ns, "ip", "hvtest-obs", "new"), 1, "B saw it (conntrack: new, tcp_loose=1)");
    assert_eq!(nft_b.forwarded(PAIR).expect("forwarded"), []);

    // With the forwarder: the same kind of segment is copied to A, hop limit one less,
    // through B's OUTPUT and POSTROUTING hooks, untracked.
    let rule = ForwardRule {
        vip: vip.into(),
        old_holder: a.data_ip.into(),
        ifindex: ifindex(&b.ns, "eth0"),
        iif: ifindex(&b.ns, "eth0"),
    };
    nft_b.set_forwarder(PAIR, &[rule]).expect("forwarder");
    forge(&client_ns, client, vip, 40002, ACK);
    if let Err(e) =
        netns::wait_until("A sees the forwarded segment", Duration::from_secs(5), Duration::from_millis(10), || {
            Ok(seen_on_a() >= 1)
        })
    {
        panic!(
            "forwarded to A: {e}; A's observer {:?}; B's observer {:?}; B's forwarder {:?}; B's neighbours {:?}",
            counters(&a.ns, "ip", "hvtest-obs"),
            counters(&b.ns, "ip", "hvtest-obs"),
            nft_b.forwarded(PAIR),
            netns::exec(&b.ns, "ip", &["neigh", "show"]),
        );
    }
    // A has no VIP and routes what it gets for it: the copy must not come back.
    settle();
    assert_eq!(seen_on_a(), 1, "one copy of one segment");
    assert_eq!(
        counter(&a.ns, "ip", "hvtest-obs", "ttl1"),
        1,
        "the copy leaves with TTL 1 (set to 2, and nf_dup decrements it in PREROUTING): no node can route it on"
    );
    assert_eq!(forwarded(&mut nft_b, vip.into()), Counter { packets: 1, bytes: 40 });
    let ob = counters(&b.ns, "ip", "hvtest-obs");
    assert_eq!(
        (ob["output"], ob["output-untracked"], ob["postrouting"]),
        (1, 1, 1),
        "the copy leaves through OUTPUT: {ob:?}"
    );

    // A plain SYN is a new connection: B's, never forwarded.
    forge(&client_ns, client, vip, 40003, SYN);
    settle();
    assert_eq!(forwarded(&mut nft_b, vip.into()).packets, 1, "a SYN is not forwarded");
    assert_eq!(seen_on_a(), 1);

    // With nf_conntrack_tcp_loose=0 conntrack calls a mid-stream segment invalid
    // instead of new: not forwarded (conntrack also calls out-of-window segments of B's
    // own connections invalid; forwarding those would have A reset them).
    set_tcp_loose(&b.ns, false);
    forge(&client_ns, client, vip, 40004, ACK);
    netns::wait_until("B's conntrack sees the segment", Duration::from_secs(2), Duration::from_millis(10), || {
        Ok(counter(&b.ns, "ip", "hvtest-obs", "invalid") == 1)
    })
    .expect("seen by B");
    settle();
    assert_eq!(seen_on_a(), 1, "an invalid segment is not forwarded");
    assert_eq!(forwarded(&mut nft_b, vip.into()).packets, 1);
    set_tcp_loose(&b.ns, true);
    forge(&client_ns, client, vip, 40006, ACK);
    netns::wait_until("A sees the second forwarded segment", Duration::from_secs(5), Duration::from_millis(10), || {
        Ok(seen_on_a() == 2)
    })
    .expect("forwarded to A");
    assert_eq!(forwarded(&mut nft_b, vip.into()).packets, 2);

    // A connection B knows is B's: served there, nothing forwarded.
    let _echo_b = Echo::start(&b.ns, &b.name, (Ipv4Addr::UNSPECIFIED, PORT).into());
    let mut s = connect(&client_ns, (vip, PORT).into());
    for i in 0..3 {
        assert_eq!(say(&mut s, &format!("{i}")).expect("B's connection"), format!("{} {i}", b.name));
    }
    assert_eq!(forwarded(&mut nft_b, vip.into()).packets, 2, "B's own connection is not forwarded");
    set_tcp_loose(&b.ns, true);

    // Removal stops it.
    nft_b.remove_pair(PAIR).expect("remove");
    forge(&client_ns, client, vip, 40005, ACK);
    settle();
    assert_eq!(seen_on_a(), 2, "nothing is forwarded after removal");
}

/// A connection from the client's `sport` (bound before connecting, as a client that
/// reuses its ports does).
fn connect_from(ns: &str, sport: u16, to: SocketAddrV4) -> TcpStream {
    let s = netns::in_netns(ns, move || -> std::io::Result<TcpStream> {
        use nix::sys::socket::{bind, connect, setsockopt, sockopt::ReuseAddr};
        let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
        setsockopt(&fd, ReuseAddr, &true)?;
        bind(fd.as_raw_fd(), &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, sport)))?;
        connect(fd.as_raw_fd(), &SockaddrIn::from(to))?;
        Ok(TcpStream::from(fd))
    })
    .expect("thread in namespace")
    .unwrap_or_else(|e| panic!("connect from {ns} port {sport} to {to}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    s
}

/// Whether `ns` has a TCP socket (any state) whose remote port is `port`.
fn has_socket_with_remote_port(ns: &str, port: u16) -> bool {
    let table = netns::in_netns(ns, || std::fs::read_to_string("/proc/net/tcp"))
        .expect("thread in namespace")
        .expect("/proc/net/tcp");
    let want = format!(":{port:04X}");
    table.lines().skip(1).any(|l| l.split_whitespace().nth(2).is_some_and(|remote| remote.ends_with(&want)))
}

/// The segment the planned-move benchmark once saw reset: a client reuses a port whose
/// earlier connection the new holder served (its conntrack keeps that 4-tuple for two
/// minutes), and the ACK of a handshake the old holder answered arrives at the new holder
/// on that 4-tuple. Conntrack does not call it `new`; the socket rule forwards it anyway.
#[test]
fn an_ack_on_a_4_tuple_the_new_holder_served_before_is_forwarded() {
    require_root!();
    const SPORT: u16 = 40200;
    let ForgedLab { topo, a, b, client, client_ns, vip } = forged_lab();
    let obs_a = format!(
        "table ip hvtest-obs {{
           chain pre {{
             type filter hook prerouting priority -300; policy accept;
             ip saddr {client} tcp sport {SPORT} counter comment \"seen\"
           }}
         }}"
    );
    nft_file(&topo, &a.ns, &obs_a);
    let obs_b = format!(
        "table ip hvtest-obs {{
           chain pre {{
             type filter hook prerouting priority -160; policy accept;
             ip daddr {vip} tcp sport {SPORT} ct state new counter comment \"new\"
             ip daddr {vip} tcp sport {SPORT} ct state established counter comment \"established\"
             ip daddr {vip} tcp sport {SPORT} ct state invalid counter comment \"invalid\"
           }}
         }}"
    );
    nft_file(&topo, &b.ns, &obs_b);
    let _echo_b = Echo::start(&b.ns, &b.name, (Ipv4Addr::UNSPECIFIED, PORT).into());

    // B serves a connection from the client's port SPORT; the client closes it first.
    let mut s = connect_from(&client_ns, SPORT, SocketAddrV4::new(vip, PORT));
    assert_eq!(say(&mut s, "before").expect("B's connection"), format!("{} before", b.name));
    s.shutdown(Shutdown::Both).expect("close");
    drop(s);
    netns::wait_until("B's socket is closed", Duration::from_secs(5), Duration::from_millis(10), || {
        Ok(!has_socket_with_remote_port(&b.ns, SPORT))
    })
    .expect("B closed its side");
    let before = counters(&b.ns, "ip", "hvtest-obs");
    assert_eq!(before["new"], 1, "the connection's SYN: {before:?}");
    assert_eq!(counter(&a.ns, "ip", "hvtest-obs", "seen"), 0);

    // Now a planned move: B forwards to A, and the ACK of a handshake A answered comes
    // to B on the same 4-tuple.
    let mut nft_b = nft_in(&b.ns);
    let rule = ForwardRule {
        vip: vip.into(),
        old_holder: a.data_ip.into(),
        ifindex: ifindex(&b.ns, "eth0"),
        iif: ifindex(&b.ns, "eth0"),
    };
    nft_b.set_forwarder(PAIR, &[rule]).expect("forwarder");
    forge(&client_ns, client, vip, SPORT, ACK);
    if let Err(e) = netns::wait_until("A sees the ACK", Duration::from_secs(5), Duration::from_millis(10), || {
        Ok(counter(&a.ns, "ip", "hvtest-obs", "seen") >= 1)
    }) {
        panic!("{e}; B's observer {:?}", counters(&b.ns, "ip", "hvtest-obs"));
    }
    let after = counters(&b.ns, "ip", "hvtest-obs");
    assert_eq!(after["new"], before["new"], "conntrack did not call it new (the 4-tuple is known): {after:?}");
    assert_eq!(
        after["established"] + after["invalid"],
        before["established"] + before["invalid"] + 1,
        "conntrack knew the 4-tuple: {after:?}"
    );
    assert_eq!(forwarded(&mut nft_b, vip.into()).packets, 1);
    assert_eq!(counter(&a.ns, "ip", "hvtest-obs", "seen"), 1);

    // B's own connection on a listener of the wildcard address is still B's.
    let mut own = connect(&client_ns, (vip, PORT).into());
    for i in 0..3 {
        assert_eq!(say(&mut own, &format!("{i}")).expect("B's connection"), format!("{} {i}", b.name));
    }
    assert_eq!(forwarded(&mut nft_b, vip.into()).packets, 1, "B's own connection is not forwarded");
    nft_b.remove_pair(PAIR).expect("remove");
}
