//! The drain on real kernels (issue 18): a planned move (`admin failover`) that keeps the
//! TCP connections established on the old holder. Two standalone members whose
//! listeners echo ([`Listener::echo`](havip_e2e::traffic::Listener::echo)), a client
//! with 20 long-lived connections (a message every 50 ms each) and a stream of new
//! connections (one every 5 ms), in network namespaces (see `agent_scenarios.rs` for the
//! topology). Root only; each test creates and removes its own namespaces.
//!
//! What a drain is, as the agent documents it: the old holder A keeps each VIP as a
//! local address on `lo` for `drainTimeout` and stops answering ARP/ND for it (tables
//! `arp|ip6 havip-<pair>-quiet`); the new holder B holds the VIP on eth0 and forwards
//! the TCP segments its conntrack does not know (not a plain SYN) to A (tables
//! `ip|ip6 havip-<pair>-fwd`). When the drain ends, A removes the VIPs from `lo`, both
//! delete their tables, and B resets what is still open at its next segment. A drain is
//! interrupted when A goes silent (B stops forwarding) or when either agent restarts
//! (its drain state is gone, and nothing of it is left behind).

#![allow(clippy::unwrap_used)]

use havip_e2e::agent::{AgentLab, PairOptions};
use havip_e2e::netns::{self, Link};
use havip_e2e::traffic::{BreakKind, HalfOpen, LongLived, ProbeError, Prober, ProberConfig};
use serde_json::Value;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

const UP: Duration = Duration::from_secs(15);
/// Long-lived connections per test.
const CONNS: usize = 20;

fn lab(opts: PairOptions) -> Option<AgentLab> {
    havip_e2e::agent::lab_for_test(module_path!(), opts)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ip {
    V4,
    V6,
}

/// A pair with echoing listeners and `drainTimeout: <drain>` (an IPv6 VIP too for V6).
fn drain_lab(drain: &str, ip: Ip) -> Option<AgentLab> {
    let lab = lab(PairOptions {
        drain_timeout: Some(drain.to_owned()),
        echo_listeners: true,
        ipv6_vip: ip == Ip::V6,
        ..Default::default()
    })?;
    if ip == Ip::V6 {
        lab.topo.wait_ipv6_ready(Duration::from_secs(10)).expect("IPv6 link-local ready");
    }
    Some(lab)
}

/// The VIP of the family under test, and VIP:port.
fn vip(lab: &AgentLab, ip: Ip) -> (IpAddr, SocketAddr) {
    match ip {
        Ip::V4 => (IpAddr::V4(lab.topo.vip(0)), lab.target()),
        Ip::V6 => (IpAddr::V6(lab.topo.vip6(0)), lab.target6()),
    }
}

/// Brings the pair up (n0 holds the VIP, the client reaches it, n1 probed it) and
/// returns a prober of `target` that n0 answered.
fn bring_up(lab: &AgentLab, target: SocketAddr) -> Prober {
    let v4 = havip_e2e::agent::bring_up(lab, UP);
    if target == lab.target() {
        return v4;
    }
    drop(v4);
    let p = Prober::on_client(&lab.topo, target).expect("prober");
    p.wait_for_responder("n0", Duration::from_secs(5)).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    p
}

/// `admin failover` on member `from`, retried until accepted: a planned move starts
/// only once the target is a ready standby.
fn planned_failover(lab: &AgentLab, from: usize) {
    let start = Instant::now();
    loop {
        let (ok, out) = lab.admin(from, &["failover"]);
        if ok {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "failover refused for 10 s: {out}\n{}", lab.diagnostics());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for `cond`, or panics with the lab's diagnostics.
fn wait(lab: &AgentLab, what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    netns::wait_until(what, timeout, Duration::from_millis(20), || Ok(cond()))
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()))
}

/// The value of `name{pair="lab"}` on member `i` (the exact metric, not its prefix).
fn metric(lab: &AgentLab, i: usize, name: &str) -> Option<f64> {
    lab.metrics(i)
        .lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter(|l| l.contains("pair=\"lab\"") || !l.contains('{'))
        .find_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
}

fn status_field(lab: &AgentLab, i: usize, key: &str) -> Value {
    lab.status(i).map(|s| s[key].clone()).unwrap_or(Value::Null)
}

/// Member `i` is draining: its status says how long is left.
fn draining_ms(lab: &AgentLab, i: usize) -> Option<u64> {
    status_field(lab, i, "drainingUntilMs").as_u64()
}

/// Member `i` forwards to `to`, per its status.
fn forwarding_to(lab: &AgentLab, i: usize) -> Option<String> {
    status_field(lab, i, "forwardingTo").as_str().map(str::to_owned)
}

/// The members with `vip` on eth0.
fn eth0_holders(lab: &AgentLab, vip: IpAddr) -> Vec<usize> {
    (0..2).filter(|i| netns::has_address(&lab.topo.node(*i).ns, "eth0", vip).expect("addresses")).collect()
}

/// Nothing of a drain on member `i`: no table of the pair, no VIP on `lo`.
fn clean(lab: &AgentLab, i: usize) -> bool {
    lab.drain_tables(i, 0).expect("nft").is_empty() && lab.vips_on_lo(i).expect("addresses").is_empty()
}

/// The drain's tables of the family under test: A's quieter, B's forwarder.
fn quiet_table(ip: Ip) -> &'static str {
    match ip {
        Ip::V4 => "arp havip-lab-quiet",
        Ip::V6 => "ip6 havip-lab-quiet",
    }
}

fn fwd_table(ip: Ip) -> &'static str {
    match ip {
        Ip::V4 => "ip havip-lab-fwd",
        Ip::V6 => "ip6 havip-lab-fwd",
    }
}

/// Waits until the move from n0 to n1 is under way as a drain: n1 holds the VIP on
/// eth0 alone and forwards to n0, which drains with the VIP on `lo`.
fn wait_draining(lab: &AgentLab, ip: Ip, vip: IpAddr) {
    wait(lab, "n1 alone holds the VIP on eth0", Duration::from_secs(3), || eth0_holders(lab, vip) == vec![1]);
    wait(lab, "n0 drains and n1 forwards to it", Duration::from_secs(3), || {
        draining_ms(lab, 0).is_some() && forwarding_to(lab, 1).as_deref() == Some("n0")
    });
    wait(lab, "the drain's tables on both members", Duration::from_secs(3), || {
        lab.drain_tables(0, 0).expect("nft").iter().any(|t| t == quiet_table(ip))
            && lab.drain_tables(1, 0).expect("nft").iter().any(|t| t == fwd_table(ip))
    });
}

/// A planned move with a 4 s drain: the 20 long-lived connections opened on n0 are
/// served by n0 all through the drain (none breaks, every one keeps being answered), every
/// new connection after the flip is n1's and none fails, connections whose handshake
/// straddles the flip complete at n0; the agents say so (status, metrics, tables, `lo`).
/// When the drain ends nothing of it is left, and the connections still open are reset
/// by n1 at their next message and counted as cut.
fn drain_keeps_established_connections(ip: Ip) {
    let Some(lab) = drain_lab("4s", ip) else { return };
    let (vip, target) = vip(&lab, ip);
    let prober = bring_up(&lab, target);
    let conns = LongLived::on_client(&lab.topo, target, CONNS).expect("long-lived connections");
    let before = conns.snapshot();
    assert!(before.iter().all(|c| c.server == "n0"), "n0 serves them all: {before:?}");
    assert!(clean(&lab, 0) && clean(&lab, 1), "no drain before the move\n{}", lab.diagnostics());
    // Handshakes that straddle the flip: the SYN was n0's, the ACK comes after the move.
    let half = HalfOpen::open(&lab.topo.client().ns, target, 20000..20004, Duration::from_secs(2)).expect("half-open");

    planned_failover(&lab, 0);
    let flip_ms = conns.now_ms();
    let at_flip = conns.snapshot();
    prober.wait_for_responder("n1", Duration::from_secs(3)).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    wait_draining(&lab, ip, vip);

    // During the drain.
    let mid_handshake = half.complete();
    for (port, r) in &mid_handshake {
        assert_eq!(r.as_deref(), Ok("n0"), "the handshake from port {port} completes at n0, its SYN's server");
    }
    // Every VIP of the pair (the IPv6 lab has an IPv4 VIP too) stays on n0's lo as a
    // host address, and on no interface of n0 else.
    let mut lo: Vec<(IpAddr, u8)> =
        lab.vips_on_lo(0).expect("addresses").iter().map(|a| (a.ip, a.prefix_len)).collect();
    lo.sort();
    let mut want = vec![(IpAddr::V4(lab.topo.vip(0)), 32)];
    if ip == Ip::V6 {
        want.push((vip, 128));
    }
    assert_eq!(lo, want, "n0 keeps the VIPs on lo, as host addresses\n{}", lab.diagnostics());
    assert!(eth0_holders(&lab, IpAddr::V4(lab.topo.vip(0))) == vec![1] && eth0_holders(&lab, vip) == vec![1]);
    assert!(lab.vips_on_lo(1).expect("addresses").is_empty(), "n1 has nothing on lo");
    let left = draining_ms(&lab, 0).expect("n0 drains");
    assert!(left > 0 && left <= 4000, "drainingUntilMs {left} of a 4 s drain");
    assert_eq!(forwarding_to(&lab, 0), None, "the old holder forwards nowhere");
    assert_eq!(draining_ms(&lab, 1), None, "the new holder does not drain");
    for i in 0..2 {
        assert_eq!(metric(&lab, i, "havip_drain_active"), Some(1.0), "n{i} is in the drain\n{}", lab.metrics(i));
    }
    conns
        .wait_all_echoed(&at_flip, 10, Duration::from_secs(3))
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    wait(&lab, "n1 to count forwarded segments", Duration::from_secs(2), || {
        metric(&lab, 1, "havip_drain_forwarded_packets_total").is_some_and(|p| p > 0.0)
            && metric(&lab, 1, "havip_drain_forwarded_bytes_total").is_some_and(|b| b > 0.0)
    });
    wait(&lab, "n0 to count the drained connections", Duration::from_secs(3), || {
        metric(&lab, 0, "havip_drain_connections") == Some(CONNS as f64)
    });
    // Until the drain's last second: not one connection broke, every one is answered.
    wait(&lab, "the drain's last second", Duration::from_secs(5), || draining_ms(&lab, 0).is_none_or(|l| l <= 1000));
    assert!(draining_ms(&lab, 0).is_some(), "the drain ended early\n{}", lab.diagnostics());
    let late = conns.snapshot();
    assert_eq!(conns.broken_count(), 0, "connections broke during the drain: {late:?}\n{}", lab.diagnostics());
    conns
        .wait_all_echoed(&late, 3, Duration::from_millis(800))
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    assert!(
        late.iter().zip(&at_flip).all(|(l, f)| l.echoed >= f.echoed + 40),
        "every connection was answered all through the drain: at the flip {at_flip:?}, late {late:?}"
    );

    // The drain ends: nothing left, the connections still open are cut.
    wait(&lab, "the drain to end and leave nothing", Duration::from_secs(4), || {
        clean(&lab, 0) && clean(&lab, 1) && draining_ms(&lab, 0).is_none() && forwarding_to(&lab, 1).is_none()
    });
    conns.wait_broken(CONNS, Duration::from_secs(3)).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    let report = conns.stop().expect("report");
    assert!(
        report.connections.iter().all(|c| c.broken.as_ref().is_some_and(|b| b.kind == BreakKind::Reset)),
        "n1 resets them at their next message: {}",
        report.summary()
    );
    assert!(
        report.broken_between(f64::MIN, flip_ms + 3000.0).is_empty(),
        "none broke before the drain's end: {}",
        report.summary()
    );
    wait(&lab, "n0 to count the cut connections", Duration::from_secs(2), || {
        metric(&lab, 0, "havip_drain_connections_cut_total").is_some_and(|c| c >= CONNS as f64)
    });
    assert_eq!(metric(&lab, 0, "havip_drain_connections_cut_total"), Some(CONNS as f64), "{}", lab.metrics(0));
    for i in 0..2 {
        assert_eq!(metric(&lab, i, "havip_drain_active"), Some(0.0), "n{i} left the drain");
    }
    assert_eq!(eth0_holders(&lab, vip), vec![1], "n1 alone holds the VIP");

    let report = prober.stop().expect("report");
    assert_eq!(report.failed, 0, "no new connection failed: {}", report.summary());
    assert_eq!(report.responder_sequence(), vec!["n0", "n1"], "every new connection after the flip is n1's");
}

#[test]
fn planned_move_with_drain_keeps_established_connections_ipv4() {
    drain_keeps_established_connections(Ip::V4);
}

#[test]
fn planned_move_with_drain_keeps_established_connections_ipv6() {
    drain_keeps_established_connections(Ip::V6);
}

/// The control: the same move with `drainTimeout: 0s` breaks every long-lived connection
/// (n1 resets them at their next message) and the handshakes that straddle the flip, and
/// installs nothing.
#[test]
fn planned_move_without_drain_breaks_established_connections() {
    let Some(lab) = drain_lab("0s", Ip::V4) else { return };
    let (vip, target) = vip(&lab, Ip::V4);
    let prober = bring_up(&lab, target);
    let conns = LongLived::on_client(&lab.topo, target, CONNS).expect("long-lived connections");
    let half = HalfOpen::open(&lab.topo.client().ns, target, 20000..20004, Duration::from_secs(2)).expect("half-open");
    planned_failover(&lab, 0);
    prober.wait_for_responder("n1", Duration::from_secs(3)).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    wait(&lab, "n1 alone holds the VIP", Duration::from_secs(3), || eth0_holders(&lab, vip) == vec![1]);
    conns.wait_broken(CONNS, Duration::from_secs(5)).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    for (port, r) in half.complete() {
        assert_eq!(r, Err(ProbeError::Reset), "n1 resets the handshake from port {port}");
    }
    assert!(clean(&lab, 0) && clean(&lab, 1), "no drain at all\n{}", lab.diagnostics());
    assert_eq!(draining_ms(&lab, 0), None);
    assert_eq!(forwarding_to(&lab, 1), None);
    let report = conns.stop().expect("report");
    assert_eq!(report.break_kinds().get("reset"), Some(&CONNS), "{}", report.summary());
    let _ = prober.stop().expect("report");
}

/// The old holder dies during the drain (both cables pulled): the new holder stops
/// forwarding once n0 is silent and removes its tables, keeps serving new connections
/// without a failure, and nobody else ever holds the VIP on eth0.
#[test]
fn drain_interrupted_by_cutting_the_old_holder() {
    let Some(lab) = drain_lab("30s", Ip::V4) else { return };
    let (vip, target) = vip(&lab, Ip::V4);
    let prober = bring_up(&lab, target);
    let _conns = LongLived::on_client(&lab.topo, target, CONNS).expect("long-lived connections");
    planned_failover(&lab, 0);
    prober.wait_for_responder("n1", Duration::from_secs(3)).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    wait_draining(&lab, Ip::V4, vip);
    // Management first, so that n0 cannot hear of its carrier loss over it.
    lab.topo.cut_cable(0, Link::Mgmt).expect("cut mgmt");
    lab.topo.cut_cable(0, Link::Data).expect("cut data");
    let cut = Instant::now();
    let took = wait(&lab, "n1 to stop forwarding and remove its tables", Duration::from_secs(5), || {
        assert_eq!(eth0_holders(&lab, vip), vec![1], "one holder\n{}", lab.diagnostics());
        lab.drain_tables(1, 0).expect("nft").is_empty() && forwarding_to(&lab, 1).is_none()
    });
    eprintln!("n1 stopped forwarding {took:?} after the cut");
    assert_eq!(metric(&lab, 1, "havip_drain_active"), Some(0.0), "{}", lab.metrics(1));
    // New connections keep going to n1; over 3 s after the cut nobody else takes the VIP.
    let ok = prober.ok_count();
    prober.wait_until_ok(ok + 100, Duration::from_secs(3)).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    while cut.elapsed() < Duration::from_secs(3) {
        assert_eq!(eth0_holders(&lab, vip), vec![1], "one holder\n{}", lab.diagnostics());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(lab.role(1).as_deref(), Some("Active"));
    let report = prober.stop().expect("report");
    assert_eq!(report.failed, 0, "no new connection failed: {}", report.summary());
    assert_eq!(report.last_responder(), Some("n1"));
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Kill,
    Term,
}

/// Member `who` is stopped (`how`) and started again during an 8 s drain: its drain
/// state is gone. A SIGTERMed agent removes its drain addresses and tables before it
/// exits; a SIGKILLed one leaves them (checked: the control that the start-up cleanup
/// is what removes them) and removes them when it starts — within 3 s, well before the
/// drain would have ended. The other member is clean by the end of the drain at the
/// latest, n1 holds the VIP alone all along and serves every new connection.
fn restart_during_drain(who: usize, how: Stop) {
    let Some(mut lab) = drain_lab("8s", Ip::V4) else { return };
    let (vip, target) = vip(&lab, Ip::V4);
    let prober = bring_up(&lab, target);
    let _conns = LongLived::on_client(&lab.topo, target, CONNS).expect("long-lived connections");
    planned_failover(&lab, 0);
    let flip = Instant::now();
    prober.wait_for_responder("n1", Duration::from_secs(3)).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    wait_draining(&lab, Ip::V4, vip);
    match how {
        Stop::Kill => {
            lab.kill_agent(who);
            assert!(!clean(&lab, who), "a SIGKILLed agent cleans nothing up\n{}", lab.diagnostics());
        }
        Stop::Term => {
            lab.stop_agent(who);
            assert!(clean(&lab, who), "n{who} cleaned up its drain before it exited\n{}", lab.diagnostics());
        }
    }
    assert_eq!(eth0_holders(&lab, vip), vec![1]);
    lab.start_agent(who).expect("start again");
    let took =
        wait(&lab, &format!("the restarted n{who} to leave nothing of the drain"), Duration::from_secs(3), || {
            assert_eq!(eth0_holders(&lab, vip), vec![1], "one holder\n{}", lab.diagnostics());
            clean(&lab, who)
        });
    eprintln!("n{who} clean {took:?} after its start");
    let other = 1 - who;
    let deadline = Duration::from_secs(8 + 3).saturating_sub(flip.elapsed());
    wait(&lab, &format!("n{other} to leave nothing of the drain"), deadline, || {
        assert_eq!(eth0_holders(&lab, vip), vec![1], "one holder\n{}", lab.diagnostics());
        clean(&lab, other)
    });
    eprintln!("n{other} clean {:?} after the flip (drain 8 s)", flip.elapsed());
    wait(&lab, "n0 standby and n1 active", Duration::from_secs(10), || {
        lab.role(0).as_deref() == Some("Standby") && lab.role(1).as_deref() == Some("Active")
    });
    assert_eq!(draining_ms(&lab, 0), None);
    assert_eq!(forwarding_to(&lab, 1), None);
    assert_eq!(eth0_holders(&lab, vip), vec![1], "one holder");
    let ok = prober.ok_count();
    prober.wait_until_ok(ok + 20, Duration::from_secs(2)).expect("n1 serves");
    let report = prober.stop().expect("report");
    assert_eq!(report.failed, 0, "no new connection failed: {}", report.summary());
    assert_eq!(report.responder_sequence(), vec!["n0", "n1"], "{}", report.summary());
}

#[test]
fn drain_interrupted_by_sigkill_and_start_of_the_old_holder() {
    restart_during_drain(0, Stop::Kill);
}

#[test]
fn drain_interrupted_by_sigterm_and_start_of_the_old_holder() {
    restart_during_drain(0, Stop::Term);
}

#[test]
fn drain_interrupted_by_sigkill_and_start_of_the_new_holder() {
    restart_during_drain(1, Stop::Kill);
}

#[test]
fn drain_interrupted_by_sigterm_and_start_of_the_new_holder() {
    restart_during_drain(1, Stop::Term);
}

/// The client-side helpers themselves, without an agent: an echo listener serves
/// long-lived connections and names itself; a half-open connection completes at the
/// server that saw its SYN; removing the address breaks them, and is seen.
#[test]
fn long_lived_and_half_open_connections_see_what_happens_to_them() {
    if !netns::skip_unless_root(module_path!()) {
        return;
    }
    havip_e2e::init_tracing();
    let topo = netns::Topology::builder().nodes(2).build().expect("topology");
    let bind: SocketAddr = (std::net::Ipv6Addr::UNSPECIFIED, 8080).into();
    let _l0 = havip_e2e::traffic::Listener::echo(&topo.node(0).ns, "n0", bind).expect("listener n0");
    let _l1 = havip_e2e::traffic::Listener::echo(&topo.node(1).ns, "n1", bind).expect("listener n1");
    let vip = topo.vip(0);
    let target: SocketAddr = (vip, 8080).into();
    netns::exec(&topo.node(0).ns, "ip", &["addr", "add", &format!("{vip}/24"), "dev", "eth0"]).expect("add VIP");
    // The prober reads the greeting as the name.
    let probe = netns::in_netns(&topo.client().ns, move || {
        havip_e2e::traffic::probe_once(&ProberConfig::new(target).connect_timeout(Duration::from_secs(1)))
    })
    .expect("thread");
    assert_eq!(probe.as_deref(), Ok("n0"));
    let conns = LongLived::on_client(&topo, target, 5).expect("connections");
    let first = conns.snapshot();
    conns.wait_all_echoed(&first, 10, Duration::from_secs(3)).expect("answered");
    // A handshake held open completes where its SYN went (the positive control).
    let held = HalfOpen::open(&topo.client().ns, target, 20010..20012, Duration::from_secs(2)).expect("half-open");
    for (port, r) in held.complete() {
        assert_eq!(r.as_deref(), Ok("n0"), "port {port}");
    }
    let half = HalfOpen::open(&topo.client().ns, target, 20000..20002, Duration::from_secs(2)).expect("half-open");
    // The server holds them as request sockets: its listener has not seen them.
    let syn_recv = netns::exec(&topo.node(0).ns, "ss", &["-Htn", "state", "syn-recv"]).expect("ss");
    for port in [20000, 20001] {
        assert!(syn_recv.contains(&format!(":{port}")), "port {port} is in SYN_RECV at n0: {syn_recv:?}");
    }
    assert_eq!(conns.broken_count(), 0);
    // A plain move without any drain: n1 gets the address, the client's entry is moved
    // by a flush; n1 has no socket for anything of n0's and resets it.
    netns::exec(&topo.node(0).ns, "ip", &["addr", "del", &format!("{vip}/24"), "dev", "eth0"]).expect("del VIP");
    netns::exec(&topo.node(1).ns, "ip", &["addr", "add", &format!("{vip}/24"), "dev", "eth0"]).expect("add VIP");
    netns::exec(&topo.client().ns, "ip", &["neigh", "flush", "dev", "eth0"]).expect("flush");
    conns.wait_broken(5, Duration::from_secs(3)).expect("all broken");
    for (port, r) in half.complete() {
        assert_eq!(r, Err(ProbeError::Reset), "port {port}");
    }
    let report = conns.stop().expect("report");
    assert_eq!(report.servers().get("n0"), Some(&5), "{}", report.summary());
    assert_eq!(report.break_kinds().get("reset"), Some(&5), "{}", report.summary());
    assert!(report.connections.iter().all(|c| c.echoed >= 10), "{}", report.summary());
}
