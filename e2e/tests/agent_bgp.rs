//! Routed VIPs (`announce.mode: BGP`) on real kernels and real routing daemons: the
//! members run FRR (or BIRD) configured as docs/bgp.md says, the gateway is an FRR router
//! peering with each of them over eBGP with BFD, and the client sits in another subnet
//! behind it — it reaches a VIP only through the route the holder's speaker advertises.
//! Forwarding is on on every member, as on a Kubernetes node. Root only; each test
//! builds and removes its own lab, one at a time (they time failovers).

#![allow(clippy::unwrap_used)]

use havip_e2e::agent::{AgentLab, HEARTBEAT_PORT, PairOptions};
use havip_e2e::bgp::Speaker;
use havip_e2e::netns::{self, Link};
use havip_e2e::traffic::{LongLived, LongLivedConfig, Prober, ProberConfig};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const UP: Duration = Duration::from_secs(30);

/// One lab at a time: the tests time route moves and count single failed connects.
static SERIAL: Mutex<()> = Mutex::new(());

type Serial = std::sync::MutexGuard<'static, ()>;

/// A routed lab's options: `speaker` on the members, forwarding on.
fn routed(speaker: Speaker) -> PairOptions {
    PairOptions { bgp: Some(speaker), forwarding: true, ..Default::default() }
}

/// A lab of `opts`, one at a time.
fn lab_of(opts: PairOptions) -> Option<(AgentLab, Serial)> {
    let guard = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    havip_e2e::agent::lab_for_test(module_path!(), opts).map(|l| (l, guard))
}

fn lab(speaker: Speaker, pairs: usize) -> Option<(AgentLab, Serial)> {
    lab_of(PairOptions { pairs, ..routed(speaker) })
}

fn wait(lab: &AgentLab, what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "{what} not within {timeout:?}\n{}", diagnostics(lab));
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

fn diagnostics(lab: &AgentLab) -> String {
    let routing = lab.routing.as_ref().map(|r| r.diagnostics()).unwrap_or_default();
    format!("{}\n{routing}", lab.diagnostics())
}

/// The router's best next hops towards VIP `j`.
fn next_hops(lab: &AgentLab, j: u8) -> Vec<String> {
    lab.routing.as_ref().map(|r| r.best_next_hops(&format!("{}/32", lab.vip_addr(j)))).unwrap_or_default()
}

/// Waits until the router's only best next hop towards VIP `j` is member `to`'s.
fn wait_routed(lab: &AgentLab, j: u8, to: usize, timeout: Duration) -> Duration {
    let hop = IpAddr::V4(lab.topo.node(to).ip(Link::Data));
    let routing = lab.routing.as_ref().expect("a routed lab");
    routing
        .wait_routed(IpAddr::V4(lab.vip_addr(j)), hop, timeout)
        .unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(lab)))
}

/// The members whose paths the router knows for VIP `j`, and whether each is best.
fn paths(lab: &AgentLab, j: u8) -> Vec<(String, bool)> {
    lab.routing.as_ref().and_then(|r| r.router.bgp_paths(&format!("{}/32", lab.vip_addr(j))).ok()).unwrap_or_default()
}

fn data_ip(lab: &AgentLab, i: usize) -> String {
    lab.topo.node(i).ip(Link::Data).to_string()
}

/// n0 holds the VIP, the router routes it to n0 alone, and the client behind the
/// router is answered by n0.
fn up(lab: &AgentLab) -> Prober {
    // The route first: a prober started before it exists counts the failures of a VIP
    // nobody can reach yet.
    wait_routed(lab, 0, 0, UP);
    let prober = havip_e2e::agent::bring_up(lab, UP);
    let p = paths(lab, 0);
    assert_eq!(p, vec![(data_ip(lab, 0), true)], "only the holder advertises the VIP\n{}", diagnostics(lab));
    prober
}

#[test]
fn the_holders_route_is_the_routers_only_path_and_a_cut_moves_it() {
    let Some((lab, _serial)) = lab(Speaker::Frr, 1) else { return };
    let prober = up(&lab);
    // Control: the standby's speaker runs and is peered, yet advertises nothing.
    assert!(lab.holders(0).unwrap() == vec![0], "n0 holds the VIP on havip0\n{}", diagnostics(&lab));
    let cut = Instant::now();
    lab.topo.cut_node(0).unwrap();
    let moved = wait(&lab, "the router to route the VIP to n1", Duration::from_secs(10), || {
        next_hops(&lab, 0) == vec![data_ip(&lab, 1)]
    });
    prober.wait_for_responder("n1", Duration::from_secs(10)).unwrap();
    eprintln!("route moved {moved:?} after the cut; the client reached n1 {:?} after it", cut.elapsed());
    // The cut n0 fences itself (carrier lost) and gives the address up too.
    wait(&lab, "n1 to hold the VIP alone", Duration::from_secs(10), || lab.holders(0).is_ok_and(|h| h == vec![1]));
}

/// The epoch as the MED (`announce::bgp::route_metric`): after a cut, the router prefers
/// the new holder's path the moment it arrives, while the dead holder's path is still
/// there (BFD at 1 s × 3 here, so it stays about 3 s). Control: n1's address given the
/// worst metric (epoch 0's) puts the route back on the dead n0 until BFD takes n0's path
/// away — without the metric, the router keeps the older path, the dead one.
#[test]
fn a_takeovers_newer_epoch_wins_the_route_before_the_dead_holders_path_is_gone() {
    let Some((lab, _serial)) = lab_of(PairOptions { bfd_ms: Some(1000), ..routed(Speaker::Frr) }) else { return };
    let prober = up(&lab);
    let cut = Instant::now();
    lab.topo.cut_node(0).unwrap();
    let moved = wait(&lab, "the router to route the VIP to n1", Duration::from_secs(10), || {
        next_hops(&lab, 0) == vec![data_ip(&lab, 1)]
    });
    let p = paths(&lab, 0);
    let (dead, new) = ((data_ip(&lab, 0), false), (data_ip(&lab, 1), true));
    assert!(p.contains(&dead) && p.contains(&new), "n0's path still known, n1's best: {p:?}\n{}", diagnostics(&lab));
    assert!(moved < Duration::from_millis(1500), "moved {moved:?} after the cut, before BFD (3 s)");
    prober.wait_for_responder("n1", Duration::from_secs(5)).unwrap();
    drop(prober);
    eprintln!("route moved {moved:?} after the cut; the dead holder's path was still known");
    // Control: n1's address with epoch 0's metric, worse than n0's (a replace keeps its
    // protocol: still havip's, the agent leaves it alone).
    let vip = format!("{}/32", lab.vip_addr(0));
    let link = havip_node_agent::announce::bgp::LINK;
    let worst = havip_node_agent::announce::bgp::route_metric(0).to_string();
    let args = ["addr", "replace", &vip, "dev", link, "metric", &worst];
    havip_e2e::netns::exec(&lab.topo.node(1).ns, "ip", &args).unwrap();
    let back = wait(&lab, "the dead n0's path to be best again", Duration::from_secs(5), || {
        next_hops(&lab, 0) == vec![data_ip(&lab, 0)] || cut.elapsed() > Duration::from_secs(3)
    });
    assert!(
        cut.elapsed() < Duration::from_secs(3) && next_hops(&lab, 0) == vec![data_ip(&lab, 0)],
        "with equal or worse metric the router routes to the dead n0 ({back:?} after the change)\n{}",
        diagnostics(&lab)
    );
    // BFD then takes n0's path away: n1 is the only path again.
    wait(&lab, "BFD to drop n0's path", Duration::from_secs(10), || next_hops(&lab, 0) == vec![data_ip(&lab, 1)]);
    eprintln!("n0's path went {:?} after the cut", cut.elapsed());
}

/// An IPv6 VIP in BGP mode, over the IPv6 sessions: a /128 on the holder's havip0, the
/// router's only path, reached by the client over IPv6; a cut moves it.
#[test]
fn an_ipv6_vip_is_routed_to_its_holder_and_moves_on_a_cut() {
    let Some((lab, _serial)) = lab_of(PairOptions { ipv6_vip: true, ..routed(Speaker::Frr) }) else { return };
    let _v4 = up(&lab);
    let vip6 = lab.target6().ip();
    let prefix = format!("{vip6}/128");
    let router = &lab.routing.as_ref().unwrap().router;
    let peer = |i: usize| lab.topo.node(i).data_ip6.to_string();
    wait(&lab, "the router's only IPv6 path to be n0's", UP, || {
        router.bgp_paths(&prefix).unwrap_or_default() == vec![(peer(0), true)]
    });
    assert!(!router.best_next_hops(&prefix).unwrap_or_default().is_empty(), "installed at the router");
    let n0 = lab.topo.node(0);
    assert!(netns::has_address(&n0.ns, "havip0", vip6).unwrap(), "a /128 on n0's havip0");
    let prober = Prober::start(lab.client_ns(), ProberConfig::new(lab.target6())).unwrap();
    prober.wait_for_responder("n0", Duration::from_secs(5)).unwrap();
    // A planned move (once n1 is a ready standby for the IPv6 VIP too): n0 keeps the /128
    // as a local route.
    lab.failover_when_ready(0, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&lab)));
    wait(&lab, "the router's only IPv6 path to be n1's", Duration::from_secs(10), || {
        router.bgp_paths(&prefix).unwrap_or_default() == vec![(peer(1), true)]
    });
    prober.wait_for_responder("n1", Duration::from_secs(5)).unwrap();
    assert!(local_routes(&lab, 0).contains(&vip6.to_string()), "n0 keeps the /128 as a local route while it drains");
    // Measured, not asserted: in about one IPv6 planned move in five the router's new
    // next hop (n1's link-local address) answered its neighbour solicitation only after
    // 1.6–2.3 s, and new connects timed out meanwhile (docs/bgp.md, Limits).
    eprintln!("IPv6 planned move: {} failed connects", prober.failed_count());
    // A cut of n1: back to n0.
    lab.topo.cut_node(1).unwrap();
    wait(&lab, "the router's only IPv6 path to be n0's again", Duration::from_secs(10), || {
        router.bgp_paths(&prefix).unwrap_or_default() == vec![(peer(0), true)]
    });
    prober.wait_for_responder("n0", Duration::from_secs(10)).unwrap();
}

#[test]
fn a_heartbeat_only_partition_changes_no_advertisement() {
    let Some((lab, _serial)) = lab(Speaker::Frr, 1) else { return };
    let prober = up(&lab);
    let faults: Vec<_> = (0..2).map(|i| lab.topo.partition_udp_port(i, HEARTBEAT_PORT, &Link::BOTH).unwrap()).collect();
    // Long enough for several heartbeat timeouts and the standby's probes of the VIP
    // through the router (which still reach n0).
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        assert_eq!(next_hops(&lab, 0), vec![data_ip(&lab, 0)], "the route stays on n0\n{}", diagnostics(&lab));
        assert_eq!(paths(&lab, 0).len(), 1, "n1 advertises nothing\n{}", diagnostics(&lab));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(lab.holders(0).unwrap(), vec![0]);
    let failed = prober.failed_count();
    let report = prober.stop().unwrap();
    assert_eq!(failed, 0, "no failed connect during the partition: {}\n{}", report.summary(), diagnostics(&lab));
    for f in &faults {
        lab.topo.heal(f).unwrap();
    }
}

/// A holder that fences itself withdraws its route: n0 hears no heartbeat (a heartbeat-only
/// partition) and no answer to its ARP or neighbour solicitations (dropped at its switch
/// port, so its gateway check fails) while IP passes both ways — its BGP session and BFD
/// stay up, so only havip's fencing can take the route away. n0 goes Fenced and its path leaves the router while the
/// router's session with it is still Established (the control: the withdrawal is n0's own,
/// not the router's); n1, its probes now failing, takes over and the route follows.
#[test]
fn a_holder_that_fences_itself_withdraws_its_route_while_its_session_stays_up() {
    let Some((lab, _serial)) = lab(Speaker::Frr, 1) else { return };
    let prober = up(&lab);
    let router = &lab.routing.as_ref().expect("a routed lab").router;
    let n0 = data_ip(&lab, 0);
    let mut faults: Vec<_> =
        (0..2).map(|i| lab.topo.partition_udp_port(i, HEARTBEAT_PORT, &Link::BOTH).unwrap()).collect();
    for link in Link::BOTH {
        faults.push(lab.topo.drop_neighbour_answers_towards(0, link).unwrap());
    }
    wait(&lab, "n0 to fence itself", Duration::from_secs(15), || lab.role(0).as_deref() == Some("Fenced"));
    wait(&lab, "n0's path to leave the router", Duration::from_secs(5), || {
        !paths(&lab, 0).iter().any(|(hop, _)| *hop == n0)
    });
    assert!(router.established(&n0), "the router's session with n0 is still up\n{}", diagnostics(&lab));
    assert!(lab.holders(0).is_ok_and(|h| !h.contains(&0)), "n0 gave the address up\n{}", diagnostics(&lab));
    wait_routed(&lab, 0, 1, Duration::from_secs(10));
    prober.wait_for_responder("n1", Duration::from_secs(10)).unwrap();
    for f in &faults {
        lab.topo.heal(f).unwrap();
    }
}

/// The local routes havip keeps on member `i` for drained routed VIPs (`ip route show
/// table local proto 0x68`, IPv4 then IPv6), as destinations.
fn local_routes(lab: &AgentLab, i: usize) -> Vec<String> {
    let mut routes = Vec::new();
    for family in ["-4", "-6"] {
        let args = [family, "route", "show", "table", "local", "proto", "104"];
        let out = havip_e2e::netns::exec(&lab.topo.node(i).ns, "ip", &args).unwrap_or_default();
        routes.extend(out.lines().filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned)));
    }
    routes
}

#[test]
fn a_planned_move_advertises_on_the_target_withdraws_on_the_old_holder_and_loses_no_connect() {
    let Some((lab, _serial)) = lab_of(PairOptions { drain_timeout: Some("3s".into()), ..routed(Speaker::Frr) }) else {
        return;
    };
    let _warmup = up(&lab);
    let probers = Prober::start_many(lab.client_ns(), &ProberConfig::new(lab.target()), 2).unwrap();
    let (ok, out) = lab.admin(0, &["failover"]);
    assert!(ok, "failover: {out}");
    wait_routed(&lab, 0, 1, Duration::from_secs(10));
    // n0's session stays up: it withdrew the route, it did not lose the router.
    let router = &lab.routing.as_ref().unwrap().router;
    assert!(router.established(&data_ip(&lab, 0)), "n0's session is up\n{}", diagnostics(&lab));
    wait(&lab, "n0's path to go", Duration::from_secs(10), || paths(&lab, 0).len() == 1);
    // n0 drains: the VIP is a local route on its lo, no address the speaker could see.
    let vip = lab.vip_addr(0).to_string();
    assert_eq!(local_routes(&lab, 0), vec![vip.clone()], "n0 keeps the VIP as a local route\n{}", diagnostics(&lab));
    assert!(
        !havip_e2e::netns::has_address(&lab.topo.node(0).ns, "lo", lab.vip_addr(0).into()).unwrap(),
        "not as an address on lo"
    );
    for p in &probers {
        p.wait_for_responder("n1", Duration::from_secs(5)).unwrap();
    }
    // The drain ends (3 s): the local route goes with it.
    wait(&lab, "n0's local route to go at the drain's end", Duration::from_secs(10), || {
        local_routes(&lab, 0).is_empty()
    });
    let failed: u64 = probers.iter().map(Prober::failed_count).sum();
    let ok: u64 = probers.iter().map(Prober::ok_count).sum();
    let reports: Vec<String> = probers.into_iter().map(|p| p.stop().map(|r| r.summary()).unwrap_or_default()).collect();
    eprintln!("planned move: {ok} connects, {failed} failed: {reports:?}");
    assert_eq!(failed, 0, "no failed connect across a planned move: {reports:?}\n{}", diagnostics(&lab));
}

/// A lab with echoing listeners and `drain_timeout`, ten long-lived connections to n0,
/// then a planned move routed to n1; the prober of `up` and the connections.
fn moved_with_connections(drain_timeout: &str) -> Option<(AgentLab, Serial, Prober, LongLived)> {
    let opts = PairOptions { echo_listeners: true, drain_timeout: Some(drain_timeout.into()), ..routed(Speaker::Frr) };
    let (lab, serial) = lab_of(opts)?;
    let prober = up(&lab);
    let conns = LongLived::start(lab.client_ns(), LongLivedConfig::new(lab.target()).connections(10)).unwrap();
    conns.wait_all_echoed(&conns.snapshot(), 5, Duration::from_secs(5)).unwrap();
    let (ok, out) = lab.admin(0, &["failover"]);
    assert!(ok, "failover: {out}\n{}", diagnostics(&lab));
    wait_routed(&lab, 0, 1, Duration::from_secs(10));
    Some((lab, serial, prober, conns))
}

/// Connections established on n0 keep working across a planned move: the router sends
/// their segments to n1 once n0 withdrew, n1's drain forwarder hands them to n0 on the
/// link they share, and n0 — the VIP a local route on its `lo` — answers them.
#[test]
fn established_connections_survive_a_planned_move() {
    let Some((lab, _serial, _p, conns)) = moved_with_connections("30s") else { return };
    let after = conns.snapshot();
    conns.wait_all_echoed(&after, 20, Duration::from_secs(5)).unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&lab)));
    assert_eq!(conns.broken_count(), 0, "no connection broke: {:?}\n{}", conns.snapshot(), diagnostics(&lab));
    let servers: Vec<String> = conns.snapshot().iter().map(|c| c.server.clone()).collect();
    assert!(servers.iter().all(|s| s == "n0"), "every connection is still n0's: {servers:?}");
}

/// Planned moves back and forth, each 1.2 s after the one before — a move back starts
/// while the first drain still runs: every move is routed to its target and answered
/// there. (`HAVIP_BGP_MOVES` sets the count, default 20; the benchmark's planned-200 runs
/// 200 with four streams and counts every failed connect.) A debug build on a busy
/// machine may time out a read at a move: at most one connect in a thousand fails.
#[test]
fn planned_moves_back_and_forth_are_each_routed_to_their_target() {
    let Some((lab, _serial)) = lab(Speaker::Frr, 1) else { return };
    let _warmup = up(&lab);
    let prober = Prober::start(lab.client_ns(), ProberConfig::new(lab.target())).unwrap();
    let mut from = 0;
    let moves: usize = std::env::var("HAVIP_BGP_MOVES").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    for m in 0..moves {
        let to = 1 - from;
        let start = lab
            .failover_when_ready(from, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("move {m}: {e}\n{}", diagnostics(&lab)));
        let rstart = Instant::now();
        while next_hops(&lab, 0) != vec![data_ip(&lab, to)] {
            if rstart.elapsed() > Duration::from_secs(10) {
                let r = lab.routing.as_ref().unwrap();
                let vip = format!("{}/32", lab.vip_addr(0));
                panic!(
                    "move {m}: no route to n{to}: paths {:?}\nrouter: {}\nn{to} speaker: {}\nlocal routes n0 {:?} n1 {:?}\n{}",
                    paths(&lab, 0),
                    r.router.vtysh(&format!("show ip route {vip}")).unwrap_or_default(),
                    match &r.nodes[to] {
                        havip_e2e::bgp::NodeSpeaker::Frr(f) => format!(
                            "{}\n{}",
                            f.vtysh(&format!("show ip route {vip}")).unwrap_or_default(),
                            f.vtysh(&format!("show bgp ipv4 unicast {vip}")).unwrap_or_default()
                        ),
                        havip_e2e::bgp::NodeSpeaker::Bird(_) => String::new(),
                    },
                    local_routes(&lab, 0),
                    local_routes(&lab, 1),
                    diagnostics(&lab)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let routed = rstart.elapsed();
        prober.wait_for_responder(&format!("n{to}"), Duration::from_secs(10)).unwrap_or_else(|e| {
            panic!(
                "move {m}: {e}; local routes n0 {:?} n1 {:?}; routed after {routed:?}\n{}",
                local_routes(&lab, 0),
                local_routes(&lab, 1),
                diagnostics(&lab)
            )
        });
        std::thread::sleep(Duration::from_millis(1200).saturating_sub(start.elapsed()));
        from = to;
    }
    let (failed, ok) = (prober.failed_count(), prober.ok_count());
    let report = prober.stop().unwrap();
    assert!(failed * 1000 <= ok, "at most a connect in a thousand fails over {moves} moves: {}", report.summary());
}

/// The control of `established_connections_survive_a_planned_move`: with the drain
/// off (`drainTimeout: 0s`) the old holder gives the VIP up at once, and the connections
/// established on it break when the router sends their next segments to the new holder.
#[test]
fn without_the_drain_established_connections_break_on_a_planned_move() {
    let Some((lab, _serial, _p, conns)) = moved_with_connections("0s") else { return };
    conns.wait_broken(10, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&lab)));
}

/// n0's agent is SIGKILLed while it drains (its local route stays behind) and starts
/// again: the start-up removes the route, through the ledger.
#[test]
fn a_drain_killed_mid_way_leaves_no_local_route_after_the_restart() {
    let Some((mut lab, _serial)) = lab_of(PairOptions { drain_timeout: Some("30s".into()), ..routed(Speaker::Frr) })
    else {
        return;
    };
    let _p = up(&lab);
    let (ok, out) = lab.admin(0, &["failover"]);
    assert!(ok, "failover: {out}");
    let vip = lab.vip_addr(0).to_string();
    wait(&lab, "n0 to drain", Duration::from_secs(10), || local_routes(&lab, 0) == vec![vip.clone()]);
    // The router follows the move before the kill (its own convergence is not what this
    // test is about: asserting the route right after the restart raced it in CI).
    wait_routed(&lab, 0, 1, Duration::from_secs(10));
    lab.kill_agent(0);
    assert_eq!(local_routes(&lab, 0), vec![vip.clone()], "a SIGKILLed agent leaves its local route behind");
    lab.start_agent(0).unwrap();
    wait(&lab, "the restarted agent to remove it", Duration::from_secs(10), || local_routes(&lab, 0).is_empty());
    // The restarted member takes nothing back: for three seconds n1 alone holds the VIP
    // and the router's only next hop stays n1.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        assert_eq!(lab.holders(0).unwrap_or_default(), vec![1], "the VIP stays on n1\n{}", diagnostics(&lab));
        assert_eq!(next_hops(&lab, 0), vec![data_ip(&lab, 1)], "the route stays on n1\n{}", diagnostics(&lab));
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metric(lab: &AgentLab, i: usize, name: &str) -> f64 {
    lab.metric_sum(i, name, &[])
}

/// Each agent reports what its member's speaker says, asked over FRR's vty socket: n0's
/// FRR advertises the VIP to the router on its two sessions (IPv4, IPv6), n1's has the
/// same sessions and advertises nothing. Control: with n0's bgpd gone, n0 reports its
/// speaker unreachable and warns — the report is asked, not assumed.
#[test]
fn each_agent_reports_its_speakers_sessions_and_advertisements() {
    let Some((mut lab, _serial)) = lab(Speaker::Frr, 1) else { return };
    let _p = up(&lab);
    let t = Duration::from_secs(15);
    wait(&lab, "n0 to report its VIP advertised on two sessions", t, || {
        metric(&lab, 0, "havip_agent_bgp_vips_advertised") == 1.0
            && metric(&lab, 0, "havip_agent_bgp_sessions_established") == 2.0
    });
    wait(&lab, "n1 to report its speaker's two sessions", t, || {
        metric(&lab, 1, "havip_agent_bgp_speaker_up") == 1.0
            && metric(&lab, 1, "havip_agent_bgp_sessions_established") == 2.0
    });
    assert_eq!(metric(&lab, 1, "havip_agent_bgp_vips_advertised"), 0.0, "the standby advertises nothing");
    if let Some(havip_e2e::bgp::NodeSpeaker::Frr(f)) = lab.routing.as_mut().and_then(|r| r.nodes.get_mut(0)) {
        f.kill_bgpd();
    }
    wait(&lab, "n0 to report its speaker down", t, || metric(&lab, 0, "havip_agent_bgp_speaker_up") == 0.0);
    assert_eq!(metric(&lab, 0, "havip_agent_bgp_vips_advertised"), 0.0);
    let log = lab.logs_tail(400);
    assert!(log.contains("the node's BGP speaker does not carry this pair's routed VIPs"), "{log}");
}

/// bgpd on the holder is killed (no Cease to the router) and starts again: the router,
/// a graceful-restart helper, keeps n0's route as stale meanwhile, and nothing moves —
/// no takeover, the same holder, its route back. What FRR 8.4 does between the new
/// session and the re-advertisement (a gap of about a second, see docs/bgp.md) is
/// measured, not asserted.
#[test]
fn restarting_the_holders_bgpd_moves_nothing() {
    let Some((mut lab, _serial)) = lab(Speaker::Frr, 1) else { return };
    let prober = up(&lab);
    let before = prober.failed_count();
    if let Some(havip_e2e::bgp::NodeSpeaker::Frr(f)) = lab.routing.as_mut().and_then(|r| r.nodes.get_mut(0)) {
        f.restart_bgpd().unwrap();
    }
    let peer = data_ip(&lab, 0);
    let start = Instant::now();
    // What the router routes, as it changes.
    let mut seen: Vec<(Duration, Vec<String>)> = Vec::new();
    while start.elapsed() < Duration::from_secs(5) {
        assert_eq!(lab.holders(0).unwrap(), vec![0], "the VIP did not move\n{}", diagnostics(&lab));
        assert!(paths(&lab, 0).iter().all(|(p, _)| *p == peer), "n1 advertises nothing\n{}", diagnostics(&lab));
        let hops = next_hops(&lab, 0);
        if seen.last().map(|(_, h)| h) != Some(&hops) {
            seen.push((start.elapsed(), hops));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("the router's next hops after bgpd's restart: {seen:?}");
    wait(&lab, "n0's session and route to be back", Duration::from_secs(30), || {
        lab.routing.as_ref().is_some_and(|r| r.router.established(&peer)) && next_hops(&lab, 0) == vec![peer.clone()]
    });
    prober.wait_for_responder("n0", Duration::from_secs(5)).unwrap();
    let failed = prober.failed_count() - before;
    let report = prober.stop().unwrap();
    eprintln!("bgpd restart on the holder: {failed} failed connects; {}", report.summary());
    let status = lab.status(1).unwrap_or_default();
    assert_eq!(status.get("role").and_then(|r| r.as_str()), Some("Standby"), "n1 stayed standby: {status}");
}

#[test]
fn bird_as_the_members_speaker_advertises_the_holder_and_moves_on_a_cut() {
    let Some((lab, _serial)) = lab(Speaker::Bird, 1) else { return };
    let prober = up(&lab);
    // The agent asks BIRD over its control socket: one session, the VIP exported on it.
    wait(&lab, "n0 to report its VIP exported by BIRD", Duration::from_secs(15), || {
        metric(&lab, 0, "havip_agent_bgp_vips_advertised") == 1.0
            && metric(&lab, 0, "havip_agent_bgp_sessions_established") == 1.0
    });
    lab.topo.cut_node(0).unwrap();
    wait_routed(&lab, 0, 1, Duration::from_secs(10));
    prober.wait_for_responder("n1", Duration::from_secs(10)).unwrap();
}

#[test]
fn two_pairs_share_one_speaker_per_member() {
    let Some((lab, _serial)) = lab(Speaker::Frr, 2) else { return };
    let _p = up(&lab);
    let vip1 = lab.pair_vip(1, 0);
    wait_routed(&lab, vip1, 0, UP);
    // Accepted once n1 is a ready standby of pair 1, which its route does not wait for.
    lab.pair_failover_when_ready(0, 1, UP).unwrap_or_else(|e| panic!("failover of pair 1: {e}\n{}", diagnostics(&lab)));
    wait_routed(&lab, vip1, 1, Duration::from_secs(10));
    assert_eq!(next_hops(&lab, 0), vec![data_ip(&lab, 0)], "pair 0 stays on n0\n{}", diagnostics(&lab));
}

/// The routes of member `i`'s backup table (`ip route show table 104`), destinations only.
fn backup_routes(lab: &AgentLab, i: usize) -> Vec<String> {
    let table = havip_node_agent::announce::bgp::BACKUP_TABLE.to_string();
    let out = netns::exec(&lab.topo.node(i).ns, "ip", &["-4", "route", "show", "table", &table]).unwrap_or_default();
    out.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect()
}

/// The router's paths for VIP 0 by member index: (best, AS-path length, MED).
fn path_attrs(lab: &AgentLab) -> Vec<(usize, bool, u64, Option<u64>)> {
    let prefix = format!("{}/32", lab.vip_addr(0));
    let attrs = lab.routing.as_ref().and_then(|r| r.router.bgp_path_attrs(&prefix).ok()).unwrap_or_default();
    let mut out: Vec<_> = attrs
        .into_iter()
        .filter_map(|(peer, best, len, med)| {
            (0..lab.topo.nodes().len()).find(|&i| data_ip(lab, i) == peer).map(|i| (i, best, len, med))
        })
        .collect();
    out.sort();
    out
}

/// Backup paths (`bgpBackupPaths: true`): the ready standby advertises the VIP too, with
/// the worse preference its speaker's configuration gives imported routes (docs/bgp.md:
/// AS path prepended twice, the worst MED), so the router knows the next path; the holder
/// has none. A planned move swaps them. Traffic the router sends a member that does not
/// hold the VIP (here: the holder's session shut down at the router, so the backup path is
/// the only one) is dropped there, not routed back: nothing loops, with forwarding on.
/// Controls: without the option the router knows the holder's path only (`up`, in every
/// other test); with the member's guard deleted, the same traffic loops.
#[test]
fn a_ready_standby_advertises_a_worse_backup_path_and_drops_what_follows_it() {
    let Some((lab, _serial)) = lab_of(PairOptions { bgp_backup_paths: true, ..routed(Speaker::Frr) }) else { return };
    wait_routed(&lab, 0, 0, UP);
    let prober = havip_e2e::agent::bring_up(&lab, UP);
    wait(&lab, "the router to know n1's backup path", UP, || path_attrs(&lab).len() == 2);
    let p = path_attrs(&lab);
    eprintln!("paths (member, best, AS-path length, MED): {p:?}");
    assert!(p[0].1 && !p[1].1, "the holder's path is best: {p:?}\n{}", diagnostics(&lab));
    assert!(p[1].2 > p[0].2, "the backup path's AS path is longer: {p:?}");
    assert_eq!(p[1].3, Some(u64::from(u32::MAX)), "the backup path carries the worst MED: {p:?}");
    let vip = lab.vip_addr(0).to_string();
    assert_eq!((backup_routes(&lab, 0), backup_routes(&lab, 1)), (vec![], vec![vip.clone()]), "only n1 has one");

    // A planned move swaps them: n1's address first, then n0's backup path.
    let (ok, out) = lab.admin(0, &["failover"]);
    assert!(ok, "failover: {out}");
    wait_routed(&lab, 0, 1, Duration::from_secs(10));
    prober.wait_for_responder("n1", Duration::from_secs(5)).unwrap();
    wait(&lab, "n0's backup path and n1's best one", Duration::from_secs(10), || {
        let p = path_attrs(&lab);
        p.len() == 2 && !p[0].1 && p[1].1 && p[0].2 > p[1].2
    });
    assert_eq!((backup_routes(&lab, 0), backup_routes(&lab, 1)), (vec![vip.clone()], vec![]), "only n0 has one");

    // The holder's path gone at the router (its session shut down there): the client's
    // traffic follows n0's backup path to n0, which does not hold the VIP and drops it.
    let watch = havip_e2e::loops::LoopWatch::install(&lab.topo, &[IpAddr::V4(lab.vip_addr(0))]).unwrap();
    let router = &lab.routing.as_ref().unwrap().router;
    let n1 = data_ip(&lab, 1);
    router.configure(&["router bgp 64512", &format!("neighbor {n1} shutdown")]).unwrap();
    wait_routed(&lab, 0, 0, Duration::from_secs(10));
    let failed = prober.failed_count();
    wait(&lab, "connects to fail on n0", Duration::from_secs(10), || prober.failed_count() >= failed + 3);
    let loops = watch.read().unwrap();
    eprintln!("following the backup path to n0: {loops}");
    assert_eq!((loops.routed(), loops.ttl_exceeded()), (0, 0), "nothing routed back: {loops}\n{}", diagnostics(&lab));

    // Control: without n0's guard, the same traffic goes back to the router, and loops.
    let guard = format!("havip-{}-guard", havip_e2e::agent::pair_name(0));
    netns::exec(&lab.topo.node(0).ns, "nft", &["delete", "table", "ip", &guard]).unwrap();
    let start = Instant::now();
    while !watch.read().is_ok_and(|l| l.routed() > 0) {
        let ns = &lab.topo.node(0).ns;
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the control's traffic did not loop: {:?}\n{}\n{}\n{}",
            watch.read(),
            netns::exec(ns, "ip", &["route", "show", "table", "all"]).unwrap_or_default(),
            netns::exec(ns, "nft", &["list", "ruleset"]).unwrap_or_default(),
            diagnostics(&lab)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("control, without the guard: {}", watch.read().unwrap());
}

/// Backup paths with BIRD as the members' speaker (`protocol kernel` learning the backup
/// table, docs/bgp.md): the standby's path is known, worse, and a cut moves the route.
#[test]
fn bird_advertises_the_backup_path_too() {
    let Some((lab, _serial)) = lab_of(PairOptions { bgp_backup_paths: true, ..routed(Speaker::Bird) }) else {
        return;
    };
    wait_routed(&lab, 0, 0, UP);
    let prober = havip_e2e::agent::bring_up(&lab, UP);
    wait(&lab, "the router to know n1's backup path", UP, || path_attrs(&lab).len() == 2);
    let p = path_attrs(&lab);
    assert!(p[0].1 && !p[1].1 && p[1].2 > p[0].2, "n0's path is best, n1's longer: {p:?}\n{}", diagnostics(&lab));
    lab.topo.cut_node(0).unwrap();
    wait_routed(&lab, 0, 1, Duration::from_secs(10));
    prober.wait_for_responder("n1", Duration::from_secs(10)).unwrap();
}

/// A standby's agent that stops withdraws its backup path (its guard goes with it, and a
/// member without an agent is no standby); the agent started again advertises it again.
#[test]
fn a_stopped_standby_withdraws_its_backup_path() {
    let Some((mut lab, _serial)) = lab_of(PairOptions { bgp_backup_paths: true, ..routed(Speaker::Frr) }) else {
        return;
    };
    wait_routed(&lab, 0, 0, UP);
    let _prober = havip_e2e::agent::bring_up(&lab, UP);
    wait(&lab, "n1's backup path", UP, || path_attrs(&lab).len() == 2);
    lab.stop_agent(1);
    wait(&lab, "n1's backup path to go", Duration::from_secs(10), || path_attrs(&lab).len() == 1);
    assert!(backup_routes(&lab, 1).is_empty(), "n1's table is empty\n{}", diagnostics(&lab));
    lab.start_agent(1).unwrap();
    wait(&lab, "n1's backup path back", UP, || path_attrs(&lab).len() == 2);
}

/// `announce: {mode: Both}`: the holder has the VIP on its link (answered and announced at
/// layer 2) and as a host address of `havip0` (advertised by its speaker), so the client on
/// the members' segment and the client behind the router are both answered by it; the
/// standby has neither (the control: the router's only path is the holder's). A planned
/// move takes both to the target without a failed connect on either side, and a cut moves
/// both back.
#[test]
fn both_modes_at_once_serve_the_segment_and_the_routed_client() {
    let Some((lab, _serial)) =
        lab_of(PairOptions { announce_both: true, drain_timeout: Some("2s".into()), ..routed(Speaker::Frr) })
    else {
        return;
    };
    let routed = up(&lab);
    let local = Prober::start(&lab.topo.client().ns, ProberConfig::new(lab.target())).unwrap();
    local.wait_for_responder("n0", Duration::from_secs(5)).unwrap();
    let vip = IpAddr::V4(lab.vip_addr(0));
    let link = havip_node_agent::announce::bgp::LINK;
    let has = |i: usize, ifname: &str| netns::has_address(&lab.topo.node(i).ns, ifname, vip).unwrap();
    assert_eq!((has(0, "eth0"), has(0, link), has(1, "eth0"), has(1, link)), (true, true, false, false));

    let (ok, out) = lab.admin(0, &["failover"]);
    assert!(ok, "failover: {out}");
    wait_routed(&lab, 0, 1, Duration::from_secs(10));
    routed.wait_for_responder("n1", Duration::from_secs(5)).unwrap();
    local.wait_for_responder("n1", Duration::from_secs(5)).unwrap();
    assert!(has(1, "eth0") && has(1, link), "n1 holds both addresses\n{}", diagnostics(&lab));
    wait(&lab, "n0's path to go", Duration::from_secs(10), || paths(&lab, 0).len() == 1);
    let failed = (routed.failed_count(), local.failed_count());
    eprintln!("planned move: failed connects (routed, on the segment) {failed:?}");
    assert_eq!(failed, (0, 0), "no failed connect on either side\n{}", diagnostics(&lab));

    lab.topo.cut_node(1).unwrap();
    wait_routed(&lab, 0, 0, Duration::from_secs(10));
    routed.wait_for_responder("n0", Duration::from_secs(10)).unwrap();
    local.wait_for_responder("n0", Duration::from_secs(10)).unwrap();
    assert!(has(0, "eth0") && has(0, link), "n0 holds both addresses again\n{}", diagnostics(&lab));
}

/// Member `i`'s `readyAll` (its listeners, for routed VIPs also its speaker).
fn ready_all(lab: &AgentLab, i: usize) -> Option<bool> {
    lab.status(i).and_then(|s| s.get("readyAll").and_then(serde_json::Value::as_bool))
}

fn member_frr(lab: &mut AgentLab, i: usize) -> &mut havip_e2e::routing::Frr {
    match lab.routing.as_mut().and_then(|r| r.nodes.get_mut(i)) {
        Some(havip_e2e::bgp::NodeSpeaker::Frr(f)) => f,
        _ => panic!("n{i} runs FRR"),
    }
}

/// A member whose speaker carries nothing (its bgpd killed: no session) is no ready target
/// for routed VIPs: it reports itself not ready and a planned move to it is refused — the
/// VIP stays where the router reaches it (the routed demo once failed back to a member whose
/// session was not up yet: the router had no path). Control: with its bgpd started again it
/// is ready once its session is up, and the same planned move goes through with no failed
/// connect.
#[test]
fn a_member_whose_speaker_carries_nothing_is_no_ready_target() {
    let Some((mut lab, _serial)) = lab_of(PairOptions { drain_timeout: Some("2s".into()), ..routed(Speaker::Frr) })
    else {
        return;
    };
    let prober = up(&lab);
    wait(&lab, "n1 ready", UP, || ready_all(&lab, 1) == Some(true));
    member_frr(&mut lab, 1).kill_bgpd();
    let took =
        wait(&lab, "n1 to report itself not ready", Duration::from_secs(15), || ready_all(&lab, 1) == Some(false));
    eprintln!("n1 not ready {took:?} after its bgpd was killed");
    let (ok, out) = lab.admin(0, &["failover"]);
    assert!(!ok, "a planned move to a member without a BGP session is refused: {out}\n{}", diagnostics(&lab));
    assert_eq!(lab.holders(0).unwrap(), vec![0], "the VIP stays on n0");
    assert_eq!(next_hops(&lab, 0), vec![data_ip(&lab, 0)], "and the router still routes it there");

    // Control: the session back, the move goes through.
    member_frr(&mut lab, 1).start_bgpd().unwrap();
    wait(&lab, "n1 ready again", Duration::from_secs(30), || ready_all(&lab, 1) == Some(true));
    // A session just up may delay new routes (FRR's update-group coalesce timer, 1 s): the
    // move waits until the router's session with n1 is 2 s old (docs/bgp.md, Limits).
    let n1 = data_ip(&lab, 1);
    wait(&lab, "the router's session with n1 to be 2 s old", Duration::from_secs(30), || {
        let v = lab.routing.as_ref().and_then(|r| r.router.vtysh_json(&format!("show bgp neighbors {n1} json")).ok());
        v.and_then(|v| v.get(&n1).and_then(|n| n.get("bgpTimerUpMsec")).and_then(serde_json::Value::as_u64))
            .is_some_and(|ms| ms >= 2000)
    });
    let before = prober.failed_count();
    // (n0 learns of n1's readiness from n1's next heartbeats: retried until it accepts.)
    lab.failover_when_ready(0, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&lab)));
    wait_routed(&lab, 0, 1, Duration::from_secs(10));
    prober.wait_for_responder("n1", Duration::from_secs(5)).unwrap();
    assert_eq!(prober.failed_count() - before, 0, "no failed connect\n{}", diagnostics(&lab));
}
