//! The virtual MAC on real kernels (issue 31): a pair whose VIPs answer with a MAC that
//! moves with them (`virtualMAC: {id: …}`), for clients and routers that never relearn a
//! VIP's MAC — a permanent neighbour entry, a host or firewall that ignores gratuitous
//! ARP. Standalone members in network namespaces on one switch (see `agent_scenarios.rs`
//! for the topology), forwarding on as on every Kubernetes node. Root only; each test
//! creates and removes its own namespaces.
//!
//! The virtual MAC tests pin the client's neighbour entry of the VIP (`nud permanent`) to
//! the MAC it resolved while n0 held it, cut or move n0, and watch which node answers the
//! client's connects. With the virtual MAC the entry stays right and n1 answers as soon
//! as it holds the VIP (the switch learns the virtual MAC at n1's port from its first
//! announcement); without it (the control) the client keeps sending to the dead node.
//!
//! The unicast announcement tests (`announce.unicastToNeighbours`) make the client drop
//! every gratuitous ARP for the VIP (an nft rule for ARP whose sender and target are the
//! VIP) while it keeps its learned entry: the new holder's unicast ARP reply, addressed to
//! it, moves it at once; without it the client keeps sending to the dead node until its
//! entry expires (tens of seconds).

#![allow(clippy::unwrap_used)]

use havip_e2e::agent::{AgentLab, PairOptions};
use havip_e2e::netns::{self, Link};
use havip_e2e::traffic::{LongLived, Prober, ProberConfig};
use std::net::IpAddr;
use std::time::Duration;

const UP: Duration = Duration::from_secs(15);
/// How long a takeover may take to reach the client with the virtual MAC (the Standard
/// profile replaces a cut holder in about 400 ms).
const TAKEOVER: Duration = Duration::from_secs(5);
const VMAC4: &str = "00:00:5e:00:01:33";
const VMAC6: &str = "00:00:5e:00:02:33";

/// One lab of this file at a time: they time takeovers to the client.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lab(opts: PairOptions) -> Option<(AgentLab, std::sync::MutexGuard<'static, ()>)> {
    let turn = TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    havip_e2e::agent::lab_for_test(module_path!(), PairOptions { forwarding: true, ..opts }).map(|l| (l, turn))
}

/// The virtual MAC 0x33 with echo listeners and a 3 s drain (planned moves keep the
/// established connections); with an IPv6 VIP too when `ipv6_vip`.
fn with_drain(ipv6_vip: bool) -> PairOptions {
    PairOptions {
        virtual_mac: Some(0x33),
        ipv6_vip,
        echo_listeners: true,
        drain_timeout: Some("3s".into()),
        ..Default::default()
    }
}

fn wait(lab: &AgentLab, what: &str, timeout: Duration, cond: impl FnMut() -> bool) -> Duration {
    lab.wait_for(what, timeout, cond)
}

/// The switch port the data bridge has learned `mac` on.
fn fdb_port(lab: &AgentLab, mac: &str) -> Option<String> {
    let out = netns::exec(lab.topo.switch_ns(), "bridge", &["-j", "fdb", "show", "br", "data"]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    // Learned entries only: a port's own MAC is a permanent one.
    v.as_array()?
        .iter()
        .find(|e| e["mac"] == mac && e["state"].as_str().unwrap_or_default() != "permanent")
        .and_then(|e| e["ifname"].as_str().map(str::to_owned))
}

/// The client resolves `ip` to `want` and pins its entry for good (`nud permanent`): it
/// ignores every announcement from now on.
fn pin(lab: &AgentLab, ip: IpAddr, want: &str) {
    let dev = &lab.topo.client().ifname;
    let mac = netns::pin_neighbour(lab.client_ns(), dev, ip, Duration::from_secs(5)).unwrap();
    assert_eq!(mac, want, "the client resolves {ip}");
    let n = netns::neighbour(lab.client_ns(), dev, ip).unwrap().unwrap();
    assert!(n.states.iter().any(|s| s == "PERMANENT"), "{n:?}");
}

fn link_up(lab: &AgentLab, i: usize, ifname: &str) -> bool {
    netns::link_state(&lab.topo.node(i).ns, ifname).is_ok_and(|l| l.flags.iter().any(|f| f == "UP"))
}

/// The holder carries the VIP on its virtual MAC interface (up, the pair's MAC) and the
/// standby has that interface down; the client resolves the VIP to the virtual MAC and the
/// switch has learned it at the holder's port. A cut of the holder: the client, whose entry
/// is now permanent, is answered by n1 as soon as n1 holds the VIP, and the switch has
/// moved the virtual MAC to n1's port by then. n0 comes back a standby with its interface
/// down.
#[test]
fn a_client_that_never_relearns_the_vip_follows_the_virtual_mac_through_a_cut() {
    let Some((lab, _turn)) = lab(PairOptions { virtual_mac: Some(0x33), ..Default::default() }) else { return };
    lab.wait_sole_holder(0, UP).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    let (if0, if1) = (lab.virtual_if(0, 0, false), lab.virtual_if(1, 0, false));
    let held = netns::link_state(&lab.topo.node(0).ns, &if0).unwrap();
    assert_eq!(held.mac, VMAC4, "the holder's virtual MAC interface");
    assert!(link_up(&lab, 0, &if0), "the holder's virtual MAC interface is up: {held:?}");
    assert!(!link_up(&lab, 1, &if1), "the standby's virtual MAC interface is down\n{}", lab.diagnostics());
    assert!(
        !netns::has_address(&lab.topo.node(0).ns, &lab.topo.node(0).data_if, IpAddr::V4(lab.vip_addr(0))).unwrap(),
        "the VIP is not on the link itself"
    );
    // The client resolves the VIP to the virtual MAC.
    pin(&lab, IpAddr::V4(lab.vip_addr(0)), VMAC4);
    wait(&lab, "the switch to learn the virtual MAC at n0's port", UP, || {
        fdb_port(&lab, VMAC4).as_deref() == Some(lab.topo.node(0).switch_port(Link::Data))
    });

    let prober = Prober::start(lab.client_ns(), ProberConfig::new(lab.target()).overlapping()).unwrap();
    prober.wait_for_responder("n0", Duration::from_secs(5)).unwrap();
    lab.topo.kill_node_links(0).unwrap();
    let answered = prober.wait_for_responder("n1", TAKEOVER).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    let port = fdb_port(&lab, VMAC4);
    let report = prober.stop().unwrap();
    eprintln!(
        "n1 answered the pinned client {answered:?} after the cut (longest gap {:.1} ms, {} failed connects)",
        report.longest_gap_ms, report.failed
    );
    assert_eq!(port.as_deref(), Some(lab.topo.node(1).switch_port(Link::Data)), "the switch learned n1's port");
    assert!(link_up(&lab, 1, &if1));
    // n0, cut off with nobody eligible in sight, keeps the VIP for carrierStableFor (2 s).
    wait(&lab, "n1 alone to hold the VIP", UP, || lab.holders(0).is_ok_and(|h| h == [1]));

    lab.topo.heal_all().unwrap();
    wait(&lab, "n0 back as a standby with its virtual MAC interface down", UP, || {
        lab.status(0).is_some_and(|s| s["role"] == "Standby") && !link_up(&lab, 0, &if0)
    });
    assert_eq!(lab.holders(0).unwrap(), vec![1], "n1 keeps the VIP\n{}", lab.diagnostics());
}

/// The control: the same cut without a virtual MAC. The client's permanent entry names
/// n0's own MAC, so n1 holding the VIP (and announcing it) changes nothing for it: not
/// one of its connects reaches n1.
#[test]
fn without_the_virtual_mac_a_client_that_never_relearns_the_vip_is_lost_with_the_holder() {
    let Some((lab, _turn)) = lab(PairOptions::default()) else { return };
    lab.wait_sole_holder(0, UP).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    // Without a virtual MAC the VIP resolves to the holder's own MAC.
    let n0_mac = netns::link_state(&lab.topo.node(0).ns, &lab.topo.node(0).data_if).unwrap().mac;
    pin(&lab, IpAddr::V4(lab.vip_addr(0)), &n0_mac);
    let prober = Prober::start(lab.client_ns(), ProberConfig::new(lab.target()).overlapping()).unwrap();
    prober.wait_for_responder("n0", Duration::from_secs(5)).unwrap();
    lab.topo.kill_node_links(0).unwrap();
    wait(&lab, "n1 to hold the VIP", TAKEOVER, || lab.holders(0).is_ok_and(|h| h == [1]));
    assert!(
        prober.wait_for_responder("n1", TAKEOVER).is_err(),
        "a client pinned to n0's MAC reached n1: the control does not control"
    );
    let report = prober.stop().unwrap();
    eprintln!("control: {} connects failed, none answered by n1", report.failed);
    assert!(report.runs.iter().all(|r| r.name != "n1"), "{:?}", report.runs);
}

/// A planned move with its drain, the client's entry of the VIP pinned to the virtual
/// MAC: every new connect is answered (by n0, then n1) and the long-lived connections
/// established on n0 keep working through the move (n1 forwards their segments, which
/// arrive on its macvlan, to n0 by the link). IPv4 only: an IPv6 VIP on a virtual MAC
/// interface that has just come up is not answered for about a second (docs/virtual-mac.md,
/// "Known issue").
#[test]
fn a_planned_move_keeps_a_pinned_client_and_established_connections() {
    let Some((lab, _turn)) = lab(with_drain(false)) else { return };
    lab.wait_sole_holder(0, UP).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    pin(&lab, IpAddr::V4(lab.vip_addr(0)), VMAC4);
    let conns = LongLived::on_client(&lab.topo, lab.target(), 5).unwrap();
    let prober = Prober::start(lab.client_ns(), ProberConfig::new(lab.target()).overlapping()).unwrap();
    prober.wait_for_responder("n0", Duration::from_secs(5)).unwrap();
    let (ok, out) = lab.admin(0, &["failover"]);
    assert!(ok, "planned failover: {out}");
    prober.wait_for_responder("n1", TAKEOVER).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    // The established connections are n0's, reached through n1's forwarder while n0 drains.
    let after = conns.snapshot();
    conns.wait_all_echoed(&after, 5, Duration::from_secs(2)).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    // n0's interface goes down as its VIP moves to `lo` for the drain.
    wait(&lab, "n0's virtual MAC interface to go down", Duration::from_secs(10), || {
        !link_up(&lab, 0, &lab.virtual_if(0, 0, false))
    });
    assert_eq!(fdb_port(&lab, VMAC4).as_deref(), Some(lab.topo.node(1).switch_port(Link::Data)));
    let r = prober.stop().unwrap();
    assert_eq!(r.failed, 0, "{} connects failed across the move: {:?}", r.failed, r.failures);
    let broken = conns.stop().unwrap();
    assert_eq!(broken.broken(), 0, "established connections broken by the move: {broken:?}");
}

/// Waits until no address of the nodes and the client is tentative (duplicate address
/// detection, about 1–2 s after a link comes up). Until the parent's link-local address
/// passed it, the holder cannot solicit a new neighbour for a reply from the VIP on the
/// virtual MAC interface (docs/virtual-mac.md, IPv6): a real node's links have been up
/// for long.
fn wait_dad_done(lab: &AgentLab) {
    let namespaces: Vec<String> =
        (0..2).map(|i| lab.topo.node(i).ns.clone()).chain(std::iter::once(lab.client_ns().to_owned())).collect();
    wait(lab, "duplicate address detection to end on every link", UP, || {
        namespaces.iter().all(|ns| {
            netns::exec(ns, "ip", &["-6", "-o", "addr", "show", "tentative"]).is_ok_and(|o| o.trim().is_empty())
        })
    });
}

/// IPv6: the pair's IPv6 VIP on its own interface with the IPv6 virtual MAC. The client's
/// entry of the VIP pinned to it: a cut of n0 is answered by n1 within the Standard
/// takeover (about 300 ms; an earlier build lost another second to a neighbour
/// solicitation nobody answered), the switch learns the MAC at n1's port, and a planned
/// move back to n0 loses no connect.
#[test]
fn an_ipv6_vip_follows_its_virtual_mac_through_a_cut_and_a_planned_move() {
    let Some((lab, _turn)) = lab(with_drain(true)) else { return };
    lab.wait_sole_holder(0, UP).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    wait_dad_done(&lab);
    let target = lab.target6();
    let if1 = lab.virtual_if(1, 0, true);
    pin(&lab, target.ip(), VMAC6);
    let prober = Prober::start(lab.client_ns(), ProberConfig::new(target).overlapping()).unwrap();
    prober.wait_for_responder("n0", Duration::from_secs(5)).unwrap();
    lab.topo.kill_node_links(0).unwrap();
    prober.wait_for_responder("n1", TAKEOVER).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    let port = fdb_port(&lab, VMAC6);
    let report = prober.stop().unwrap();
    eprintln!("IPv6 cut: longest gap {:.1} ms, {} failed connects", report.longest_gap_ms, report.failed);
    assert!(report.longest_gap_ms < 1000.0, "the pinned IPv6 client waited: {}", report.summary());
    assert_eq!(port.as_deref(), Some(lab.topo.node(1).switch_port(Link::Data)), "the switch learned n1's port");
    assert_eq!(netns::link_state(&lab.topo.node(1).ns, &if1).unwrap().mac, VMAC6);

    lab.topo.heal_all().unwrap();
    // n0 came back holding (its carrier returned before it gave the VIP up) and its links
    // sent from the virtual MAC; it yields to n1's newer epoch, and n1 announces as it
    // hears that: the switch learns n1's port again.
    wait(&lab, "n0 back as a ready standby, the switch at n1's port", UP, || {
        lab.status(0).is_some_and(|s| s["role"] == "Standby")
            && lab.holders(0).is_ok_and(|h| h == [1])
            && fdb_port(&lab, VMAC6).as_deref() == Some(lab.topo.node(1).switch_port(Link::Data))
    });
    wait_dad_done(&lab);
    let prober = Prober::start(lab.client_ns(), ProberConfig::new(target).overlapping()).unwrap();
    prober.wait_for_responder("n1", Duration::from_secs(5)).unwrap();
    let mut moved = false;
    wait(&lab, "a planned move back to n0 to be accepted", UP, || {
        moved = moved || lab.admin(1, &["failover"]).0;
        moved
    });
    prober.wait_for_responder("n0", TAKEOVER).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    let r = prober.stop().unwrap();
    eprintln!("IPv6 planned move: longest gap {:.1} ms, {} failed connects", r.longest_gap_ms, r.failed);
    assert_eq!(r.failed, 0, "{} connects failed across the move: {:?}", r.failed, r.failures);
    assert_eq!(fdb_port(&lab, VMAC6).as_deref(), Some(lab.topo.node(0).switch_port(Link::Data)));
}

/// Two pairs on the same members with their own virtual MACs: each holder's interface
/// carries its pair's MAC. Pair 1 removed from n0's configuration while its agent is down:
/// the agent that starts again deletes pair 1's virtual MAC interfaces (its ledger
/// recorded them) and keeps pair 0's.
#[test]
fn pairs_have_their_own_virtual_macs_and_a_removed_pair_leaves_no_interface() {
    let Some((mut lab, _turn)) = lab(PairOptions { virtual_mac: Some(0x40), pairs: 2, ..Default::default() }) else {
        return;
    };
    for k in 0..2 {
        wait(&lab, &format!("n0 holds pair {k}"), UP, || lab.pair_holders(k).is_ok_and(|h| h == vec![0]));
    }
    let ns0 = lab.topo.node(0).ns.clone();
    let (p0, p1) = (lab.virtual_if(0, 0, false), lab.virtual_if(0, 1, false));
    assert_ne!(p0, p1);
    assert_eq!(netns::link_state(&ns0, &p0).unwrap().mac, "00:00:5e:00:01:40");
    assert_eq!(netns::link_state(&ns0, &p1).unwrap().mac, "00:00:5e:00:01:41");
    lab.kill_agent(0);
    let only_pair_0 = lab.config_files(0)[..1].to_vec();
    let _agent = lab.spawn_agent(0, "agent-0-only", &only_pair_0, &[]).expect("start n0 with pair 0");
    wait(&lab, "pair 1's virtual MAC interface to go", UP, || netns::link_state(&ns0, &p1).is_err());
    wait(&lab, "n0 to serve pair 0 again", UP, || lab.pair_status(0, 0).is_some());
    assert!(netns::link_state(&ns0, &p0).is_ok(), "pair 0's interface stays");
    assert_eq!(lab.pair_holders(0).unwrap(), vec![0], "pair 0 stays where it was\n{}", lab.diagnostics());
}

/// A cut of n0 while the client drops gratuitous ARP for the VIP; n1 knows the client
/// (its neighbour table has it, as a node has its router). Returns whether n1 answered the
/// client within 3 s, and how many gratuitous ARPs the client dropped.
fn cut_with_gratuitous_arp_dropped(unicast: bool) -> Option<(bool, u64)> {
    let (lab, _turn) = lab(PairOptions { unicast_announce: unicast, ..Default::default() })?;
    lab.wait_sole_holder(0, UP).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    let client = lab.topo.client().clone();
    let vip = lab.vip_addr(0);
    netns::resolve_neighbour(&client.ns, &client.ifname, IpAddr::V4(vip), Duration::from_secs(3)).unwrap();
    let rule = format!("arp saddr ip {vip} arp daddr ip {vip} counter drop");
    for cmd in [
        "add table arp havip_test".to_owned(),
        "add chain arp havip_test in { type filter hook input priority 0 ; }".to_owned(),
        format!("add rule arp havip_test in {rule}"),
    ] {
        let args: Vec<&str> = cmd.split(' ').collect();
        netns::exec(&client.ns, "nft", &args).unwrap();
    }
    let n1 = lab.topo.node(1);
    netns::resolve_neighbour(&n1.ns, &n1.data_if, IpAddr::V4(client.ip), Duration::from_secs(3)).unwrap();
    let prober = Prober::start(&client.ns, ProberConfig::new(lab.target()).overlapping()).unwrap();
    prober.wait_for_responder("n0", Duration::from_secs(5)).unwrap();
    lab.topo.kill_node_links(0).unwrap();
    wait(&lab, "n1 to hold the VIP", TAKEOVER, || lab.holders(0).is_ok_and(|h| h == [1]));
    let reached = prober.wait_for_responder("n1", Duration::from_secs(3));
    let report = prober.stop().unwrap();
    eprintln!(
        "unicast {unicast}: n1 {} (longest gap {:.1} ms, {} failed connects)",
        reached.as_ref().map_or_else(|e| e.to_string(), |d| format!("answered {d:?} after it held the VIP")),
        report.longest_gap_ms,
        report.failed
    );
    let listed = netns::exec(&client.ns, "nft", &["list", "chain", "arp", "havip_test", "in"]).unwrap();
    let dropped =
        listed.split_whitespace().skip_while(|w| *w != "packets").nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
    Some((reached.is_ok(), dropped))
}

/// With `announce.unicastToNeighbours` the client that drops gratuitous ARP is answered
/// by n1 within 3 s of n1 taking the VIP: n1's unicast ARP reply moved its entry.
#[test]
fn a_client_that_drops_gratuitous_arp_learns_the_new_holder_from_a_unicast_reply() {
    let Some((reached, dropped)) = cut_with_gratuitous_arp_dropped(true) else { return };
    assert!(dropped > 0, "the client dropped none of n1's gratuitous ARPs: the test tests nothing");
    assert!(reached, "n1 never answered the client that drops gratuitous ARP");
}

/// The control: without unicast announcements the same client keeps sending to n0 (its
/// entry is still good for tens of seconds): n1 does not answer it within 3 s.
#[test]
fn without_unicast_announcements_a_client_that_drops_gratuitous_arp_stays_on_the_dead_holder() {
    let Some((reached, dropped)) = cut_with_gratuitous_arp_dropped(false) else { return };
    assert!(dropped > 0, "the client dropped none of n1's gratuitous ARPs");
    assert!(
        !reached,
        "n1 reached a client that drops gratuitous ARP without a unicast reply: the control does not control"
    );
}
