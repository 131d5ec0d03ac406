//! The node agent on real kernels: two standalone members and a client in network
//! namespaces (bridges in a switch namespace), each scenario checking what the client
//! sees (connects to VIP:port, who answered) and what the kernels hold (addresses,
//! the client's neighbour entry). Root only; each test creates and removes its own
//! namespaces.

use havip_e2e::agent::{AgentLab, PairOptions};
use havip_e2e::netns::{self, Link};
use havip_e2e::traffic::Prober;
use std::net::IpAddr;
use std::time::Duration;

const UP: Duration = Duration::from_secs(15);

fn lab(opts: PairOptions) -> Option<AgentLab> {
    havip_e2e::agent::lab_for_test(module_path!(), opts)
}

fn bring_up(lab: &AgentLab) -> Prober {
    havip_e2e::agent::bring_up(lab, UP)
}

/// For `period`, sampled every 50 ms: n0 alone holds the VIP and none of `standbys` is
/// Active (a serving holder whose agent died must not be taken over).
fn n0_alone_holds_for(lab: &AgentLab, period: Duration, standbys: &[usize]) {
    let until = std::time::Instant::now() + period;
    while std::time::Instant::now() < until {
        assert_eq!(lab.holders(0).expect("holders"), vec![0], "only n0 holds the VIP\n{}", lab.diagnostics());
        for i in standbys {
            assert_ne!(lab.role(*i).as_deref(), Some("Active"), "n{i}\n{}", lab.diagnostics());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (up to 10 s) until member `i` reports itself Fenced.
fn wait_fenced(lab: &AgentLab, i: usize) {
    netns::wait_until(&format!("n{i} to go Fenced"), Duration::from_secs(10), Duration::from_millis(50), || {
        Ok(lab.role(i).as_deref() == Some("Fenced"))
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", lab.role(i), lab.diagnostics()));
}

#[test]
fn bring_up_higher_priority_holds_the_vip() {
    let Some(lab) = lab(PairOptions::default()) else { return };
    let prober = bring_up(&lab);
    // The client's neighbour entry for the VIP carries n0's MAC.
    let client = lab.topo.client();
    let vip = IpAddr::V4(lab.topo.vip(0));
    let mac = netns::resolve_neighbour(&client.ns, &client.ifname, vip, Duration::from_secs(2)).expect("resolved");
    assert_eq!(mac.to_lowercase(), lab.topo.node(0).data_mac.to_lowercase(), "neighbour entry names n0");
    // Labelled as havip's.
    let addrs = netns::addresses(&lab.topo.node(0).ns, "eth0").expect("addresses");
    let a = addrs.iter().find(|a| a.ip == vip).expect("VIP on eth0");
    assert_eq!(a.label.as_deref(), Some("eth0:hv"));
    assert_eq!(lab.role(0).as_deref(), Some("Active"));
    assert_eq!(lab.role(1).as_deref(), Some("Standby"));
    // Both members measure both paths' round trips from each other's echoes, well under
    // the heartbeat timeout on this quiet segment.
    for i in 0..2 {
        for path in ["data", "mgmt"] {
            let filter = format!("path=\"{path}\"");
            let count = lab.metric_sum(i, "havip_agent_heartbeat_rtt_seconds_count", &[&filter]);
            let sum = lab.metric_sum(i, "havip_agent_heartbeat_rtt_seconds_sum", &[&filter]);
            assert!(count >= 5.0, "n{i} measured {count} round trips on {path}: {}", lab.metrics(i));
            assert!(sum / count < 0.05, "n{i}'s mean round trip on {path} is {} s", sum / count);
        }
    }
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "{}", report.summary());
}

#[test]
fn cable_cut_of_the_active_moves_the_vip_and_traffic_resumes() {
    let Some(lab) = lab(PairOptions::default()) else { return };
    let prober = bring_up(&lab);
    let epoch_before = lab.epoch(1).expect("status");
    lab.topo.cut_node(0).expect("cut n0");
    lab.wait_sole_holder(1, UP).map(|_| ()).unwrap_or_else(|e| {
        // n0 keeps the VIP in its own kernel (it cannot reach anybody), so n1 holds it
        // alone on the reachable side: check n1 holds it.
        assert!(lab.holders(0).expect("holders").contains(&1), "{e}");
    });
    prober.wait_for_responder("n1", Duration::from_secs(5)).expect("traffic resumes on n1");
    assert!(lab.epoch(1).expect("status") > epoch_before, "a takeover increments the epoch");
    let report = prober.stop().expect("report");
    assert_eq!(report.last_responder(), Some("n1"), "{}", report.summary());
    assert!(report.longest_gap_ms < 2000.0, "gap {} ms: {}", report.longest_gap_ms, report.summary());
    // n0 was cut: it sees no carrier and gives up (fences), so after restoring the cable
    // there is exactly one holder.
    lab.topo.restore_node(0).expect("restore");
    lab.wait_sole_holder(1, UP).expect("one holder after the heal");
}

#[test]
fn agent_sigkill_on_the_active_keeps_the_vip_then_node_cut_moves_it() {
    let Some(mut lab) = lab(PairOptions::default()) else { return };
    let prober = bring_up(&lab);
    lab.kill_agent(0);
    // The VIP lingers on n0's interface and its listener still answers: the standby sees
    // heartbeat silence but a live data plane, so it must not take over.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(lab.holders(0).expect("holders"), vec![0], "no takeover, no split brain:\n{}", lab.diagnostics());
    assert_eq!(lab.role(1).as_deref(), Some("Standby"));
    let mid = prober.failed_count();
    assert_eq!(mid, 0, "the client never failed while the agent was dead");
    // Now the node dies: takeover.
    lab.topo.cut_node(0).expect("cut n0");
    prober.wait_for_responder("n1", UP).expect("takeover after the node cut");
    let report = prober.stop().expect("report");
    assert_eq!(report.last_responder(), Some("n1"), "{}", report.summary());
}

#[test]
fn sigstop_of_the_active_agent_for_2s_leaves_no_split_brain() {
    let Some(lab) = lab(PairOptions::default()) else { return };
    let prober = bring_up(&lab);
    lab.signal_agent(0, nix::sys::signal::Signal::SIGSTOP);
    std::thread::sleep(Duration::from_secs(2));
    lab.signal_agent(0, nix::sys::signal::Signal::SIGCONT);
    // Give both members a few heartbeat rounds after the resume.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(lab.holders(0).expect("holders"), vec![0], "{}", lab.diagnostics());
    assert_eq!(lab.role(0).as_deref(), Some("Active"));
    assert_eq!(lab.role(1).as_deref(), Some("Standby"));
    let report = prober.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
    assert_eq!(report.responder_sequence(), vec!["n0"]);
}

#[test]
fn heartbeat_only_partition_on_both_paths_moves_nothing() {
    let Some(lab) = lab(PairOptions::default()) else { return };
    let prober = bring_up(&lab);
    let fault =
        lab.topo.partition_udp_port(1, havip_e2e::agent::HEARTBEAT_PORT, &[Link::Data, Link::Mgmt]).expect("partition");
    // Wait well past the heartbeat timeout and probe span.
    std::thread::sleep(Duration::from_secs(3));
    let st = lab.status(1).expect("status");
    assert!(st["peers"][0]["heardOn"].as_array().is_some_and(|a| a.is_empty()), "n1 hears nothing: {st}");
    assert_eq!(lab.holders(0).expect("holders"), vec![0], "{}", lab.diagnostics());
    lab.topo.heal(&fault).expect("heal");
    let report = prober.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
    assert_eq!(report.responder_sequence(), vec!["n0"]);
}

#[test]
fn management_path_down_only_moves_nothing() {
    let Some(lab) = lab(PairOptions::default()) else { return };
    let prober = bring_up(&lab);
    lab.topo.cut_cable(0, Link::Mgmt).expect("cut mgmt");
    let round_trips =
        |path: &str| lab.metric_sum(1, "havip_agent_heartbeat_rtt_seconds_count", &[&format!("path=\"{path}\"")]);
    let (mgmt, data) = (round_trips("mgmt"), round_trips("data"));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(lab.holders(0).expect("holders"), vec![0], "{}", lab.diagnostics());
    let st = lab.status(1).expect("status");
    assert_eq!(st["peers"][0]["heardOn"], serde_json::json!(["data"]), "heard on data only: {st}");
    // The cut path measures no round trip any more; the other keeps measuring.
    assert_eq!(round_trips("mgmt"), mgmt, "no round trip on the cut path");
    assert!(round_trips("data") > data, "the data path's round trips go on");
    let report = prober.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
}

#[test]
fn listener_stopped_on_the_active_hands_over() {
    let Some(mut lab) = lab(PairOptions::default()) else { return };
    let prober = bring_up(&lab);
    lab.listeners[0].stop();
    // A listener down for 10 s makes the active hand the whole member over.
    prober.wait_for_responder("n1", Duration::from_secs(20)).expect("handover to n1");
    lab.wait_sole_holder(1, Duration::from_secs(5)).expect("n1 sole holder");
    let report = prober.stop().expect("report");
    assert_eq!(report.last_responder(), Some("n1"), "{}", report.summary());
}

#[test]
fn planned_failover_through_the_admin_command_loses_no_connect() {
    let Some(lab) = lab(PairOptions::default()) else { return };
    let prober = bring_up(&lab);
    // The standby must be ready and heard on every path.
    std::thread::sleep(Duration::from_secs(1));
    let (ok, out) = lab.admin(0, &["failover"]);
    assert!(ok, "failover refused: {out}\n{}", lab.diagnostics());
    prober.wait_for_responder("n1", Duration::from_secs(3)).expect("n1 answers");
    lab.wait_sole_holder(1, Duration::from_secs(3)).expect("n1 sole holder");
    std::thread::sleep(Duration::from_millis(300));
    let report = prober.stop().expect("report");
    assert_eq!(report.failed, 0, "planned failover lost connects: {}", report.summary());
    assert_eq!(report.last_responder(), Some("n1"));
    // The client's neighbour entry now names n1.
    let client = lab.topo.client();
    let n = netns::neighbour(&client.ns, &client.ifname, IpAddr::V4(lab.topo.vip(0))).expect("neigh").expect("entry");
    assert_eq!(n.mac.as_deref().map(str::to_lowercase), Some(lab.topo.node(1).data_mac.to_lowercase()));
}

#[test]
fn restart_of_both_agents_leaves_one_holder_and_no_lower_epoch() {
    let Some(mut lab) = lab(PairOptions::default()) else { return };
    let _prober = bring_up(&lab);
    let e0 = lab.epoch(0).expect("epoch");
    lab.stop_agent(0);
    lab.stop_agent(1);
    lab.start_agent(0).expect("restart n0");
    lab.start_agent(1).expect("restart n1");
    std::thread::sleep(Duration::from_secs(3));
    let holders = lab.holders(0).expect("holders");
    assert_eq!(holders.len(), 1, "exactly one holder: {holders:?}\n{}", lab.diagnostics());
    for i in 0..2 {
        assert!(lab.epoch(i).expect("epoch") >= e0, "epoch went backwards on n{i}");
    }
}

#[test]
fn forged_and_replayed_heartbeats_are_dropped_and_counted() {
    use havip_crds::wire;
    let Some(lab) = lab(PairOptions::default()) else { return };
    let prober = bring_up(&lab);
    let n0 = lab.topo.node(0).ip(Link::Data);
    let n1 = lab.topo.node(1).ip(Link::Data);
    // A forged "I am n0, active with a huge epoch" signed with the wrong key, plus a
    // valid heartbeat sent twice (the second is a replay), from the client namespace.
    let forged_key = wire::Key { id: 1, secret: b"definitely-not-the-pair-key".to_vec() };
    let real_key =
        wire::Key { id: 1, secret: havip_node_agent::config::parse_hex_key(havip_e2e::agent::KEY_HEX).expect("key") };
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    let hb = wire::Heartbeat {
        major: wire::PROTOCOL_MAJOR,
        minor: wire::PROTOCOL_MINOR,
        key_id: 1,
        seq: 1,
        timestamp_ms: now_ms,
        pair: "lab".into(),
        sender: "n0".into(),
        body: wire::Body {
            role: wire::WireRole::Active,
            epoch: 1_000_000,
            priority: 254,
            holds_vips: true,
            ready_all: true,
            maintenance: false,
            carrier_ok: true,
            suspended: false,
            failback_paused: false,
            draining: false,
            gateway: wire::WireGateway::Reachable,
            config_revision: 0,
            op: None,
            interval_ms: 100,
        },
        session: Some(wire::Session { id: 0x5eed, echo: 0 }),
        echoes: Vec::new(),
    };
    let forged = wire::encode(&hb, &forged_key);
    // Under the real key, without a session (as n0 sent before sessions existed): n0
    // speaks with sessions now, so this can only be a replay of older traffic.
    let replayed = wire::encode(&wire::Heartbeat { minor: 0, session: None, ..hb.clone() }, &real_key);
    // Under the real key, a session n1 never heard that does not echo n1's session: an
    // unconfirmed new session cannot displace n0's current one.
    let unconfirmed = wire::encode(&hb, &real_key);
    let garbage = vec![0x48, 0x56, 1, 0, 0, 0, 0, 1, 9, 9, 9];
    let ns = lab.topo.client().ns.clone();
    let from_client = forged.clone();
    netns::in_netns(&ns, move || {
        // From n0's address (a spoofed source: the only datagrams n1 verifies at all) …
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).expect("udp");
        s.set_ip_transparent_v4(true).expect("IP_TRANSPARENT");
        s.bind(&std::net::SocketAddr::new(n0.into(), 0).into()).expect("bind n0's address");
        let s: std::net::UdpSocket = s.into();
        for _ in 0..5 {
            for d in [&forged, &replayed, &unconfirmed, &garbage] {
                let _ = s.send_to(d, (n1, havip_e2e::agent::HEARTBEAT_PORT));
            }
        }
        // … and from the client's own: a stranger, dropped unverified.
        let s = std::net::UdpSocket::bind("0.0.0.0:0").expect("udp");
        for _ in 0..5 {
            let _ = s.send_to(&from_client, (n1, havip_e2e::agent::HEARTBEAT_PORT));
        }
    })
    .expect("inject");
    std::thread::sleep(Duration::from_millis(500));
    let stranger = lab.metric_sum(1, "havip_agent_heartbeats_dropped", &["stranger"]);
    assert!(stranger >= 5.0, "a stranger's datagrams counted as such: {stranger}\n{}", lab.metrics(1));
    let bad_mac = lab.metric_sum(1, "havip_agent_heartbeats_dropped", &["bad_mac"]);
    let replay = lab.metric_sum(1, "havip_agent_heartbeats_dropped", &["replayed"]);
    let unconfirmed = lab.metric_sum(1, "havip_agent_heartbeats_dropped", &["unconfirmed_session"]);
    let truncated = lab.metric_sum(1, "havip_agent_heartbeats_dropped", &["truncated"]);
    assert!(bad_mac >= 5.0, "forged heartbeats counted: {bad_mac}\n{}", lab.metrics(1));
    assert!(replay >= 5.0, "replayed heartbeats counted: {replay}\n{}", lab.metrics(1));
    assert!(unconfirmed >= 5.0, "unconfirmed sessions counted: {unconfirmed}\n{}", lab.metrics(1));
    assert!(truncated >= 5.0, "garbage counted: {truncated}");
    assert_eq!(lab.role(1).as_deref(), Some("Standby"), "no role change");
    assert!(lab.epoch(1).expect("epoch") < 1000, "the forged epoch was not believed");
    assert_eq!(lab.holders(0).expect("holders"), vec![0]);
    let report = prober.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
}

#[test]
fn a_foreign_host_claiming_the_vip_is_reported_as_a_conflict() {
    let Some(lab) = lab(PairOptions::default()) else { return };
    let _prober = bring_up(&lab);
    // The gateway host adds the VIP too (a misconfigured neighbour).
    let gw = lab.topo.gateway();
    netns::exec(&gw.ns, "ip", &["addr", "add", &format!("{}/24", lab.topo.vip(0)), "dev", &gw.ifname]).expect("add");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let st = lab.status(0).expect("status");
        if st["alarms"].as_array().is_some_and(|a| a.iter().any(|x| x == "VipConflict")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no VipConflict alarm: {st}\n{}", lab.diagnostics());
        std::thread::sleep(Duration::from_millis(100));
    }
    let m = lab.metrics(0);
    assert!(lab.metric_sum(0, "havip_agent_vip_conflicts", &[]) >= 1.0, "{m:?}");
}

#[test]
fn ipv6_vip_is_added_without_dad_and_announced_with_unsolicited_na() {
    let Some(lab) = lab(PairOptions { ipv6_vip: true, ..Default::default() }) else { return };
    lab.topo.wait_ipv6_ready(Duration::from_secs(10)).expect("IPv6 link-local ready");
    let _prober = bring_up(&lab);
    let vip6 = IpAddr::V6(lab.topo.vip6(0));
    let n0 = lab.topo.node(0);
    let a = netns::addresses(&n0.ns, "eth0").expect("addresses");
    let v = a.iter().find(|x| x.ip == vip6).expect("IPv6 VIP on n0");
    assert!(!v.tentative && !v.dadfailed, "added with nodad: usable at once: {v:?}");
    assert!(v.deprecated, "never the source of n0's own connections (README: VIPs are not the node's address): {v:?}");
    // The client resolves the IPv6 VIP to n0, then a planned failover moves it and the
    // unsolicited NA (override flag) rewrites the client's existing entry to n1's MAC.
    let client = lab.topo.client();
    let mac = netns::resolve_neighbour(&client.ns, &client.ifname, vip6, Duration::from_secs(3)).expect("resolved");
    assert_eq!(mac.to_lowercase(), n0.data_mac.to_lowercase());
    std::thread::sleep(Duration::from_secs(1));
    let (ok, out) = lab.admin(0, &["failover"]);
    assert!(ok, "failover: {out}\n{}", lab.diagnostics());
    let n1_mac = lab.topo.node(1).data_mac.to_lowercase();
    netns::wait_until(
        "client's IPv6 neighbour entry to name n1",
        Duration::from_secs(3),
        Duration::from_millis(20),
        || {
            Ok(netns::neighbour(&client.ns, &client.ifname, vip6)?
                .and_then(|n| n.mac)
                .is_some_and(|m| m.to_lowercase() == n1_mac))
        },
    )
    .expect("NA updated the client");
    assert!(!netns::has_address(&n0.ns, "eth0", vip6).expect("addresses"), "n0 removed the IPv6 VIP");
}

#[test]
fn an_ipv6_standby_blackholed_with_carrier_up_does_not_take_over() {
    // The only fence target: the gateway's IPv6 address (no IPv4 gateway check).
    let takeover = "takeover:\n  bootHold: 60s\n  fenceTargets: [\"{gateway6}\"]\n".to_owned();
    let Some(lab) = lab(PairOptions { ipv6_vip: true, takeover_yaml: Some(takeover), ..Default::default() }) else {
        return;
    };
    lab.topo.wait_ipv6_ready(Duration::from_secs(10)).expect("IPv6 ready");
    let prober = bring_up(&lab);
    let gateway = |lab: &AgentLab, i: usize| lab.status(i).and_then(|s| s["gateway"].as_str().map(str::to_owned));
    netns::wait_until("n1 reaches its IPv6 gateway", Duration::from_secs(10), Duration::from_millis(50), || {
        Ok(gateway(&lab, 1).as_deref() == Some("Reachable"))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    // n1 loses everything but carrier: it hears no heartbeat and cannot reach the VIPs,
    // but it cannot reach its gateway either, so it must not take over.
    let fault = lab.topo.blackhole(1).expect("blackhole n1");
    netns::wait_until(
        "n1 finds its IPv6 gateway unreachable",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || Ok(gateway(&lab, 1).as_deref() == Some("Unreachable")),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    // Well past the heartbeat timeout and the probe span: still nobody but n0 holds a VIP.
    n0_alone_holds_for(&lab, Duration::from_secs(5), &[1]);
    lab.topo.heal(&fault).expect("heal");
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "nothing moved: {}", report.summary());
}

#[test]
fn a_foreign_host_claiming_an_ipv6_vip_is_reported_as_a_conflict() {
    let Some(lab) = lab(PairOptions { ipv6_vip: true, ..Default::default() }) else { return };
    lab.topo.wait_ipv6_ready(Duration::from_secs(10)).expect("IPv6 ready");
    let _prober = bring_up(&lab);
    // The gateway host adds the IPv6 VIP too, without duplicate address detection (a
    // misconfigured neighbour; with DAD it would find n0's copy and give up its own).
    let gw = lab.topo.gateway().clone();
    let vip6 = lab.topo.vip6(0);
    netns::exec(&gw.ns, "ip", &["addr", "add", &format!("{vip6}/64"), "dev", &gw.ifname, "nodad"]).expect("add");
    netns::wait_until("VipConflict on n0", Duration::from_secs(10), Duration::from_millis(100), || {
        Ok(lab.status(0).is_some_and(|s| s["alarms"].as_array().is_some_and(|a| a.iter().any(|x| x == "VipConflict"))))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    assert!(lab.metric_sum(0, "havip_agent_vip_conflicts", &[]) >= 1.0, "{}", lab.metrics(0));
    // n0 keeps the VIP: a foreign MAC is not a reason to give up.
    assert_eq!(lab.holders(0).expect("holders"), vec![0]);
}

#[test]
fn a_vip_removed_from_the_configuration_is_removed_at_start() {
    let Some(mut lab) = lab(PairOptions { vips: 2, ..PairOptions::default() }) else { return };
    let _prober = bring_up(&lab);
    let n0 = lab.topo.node(0).ns.clone();
    let removed = lab.topo.vip(1);
    assert!(netns::has_address(&n0, "eth0", IpAddr::V4(removed)).expect("addresses"), "n0 holds both VIPs");
    // While n0's agent is down its configuration loses the second VIP; next to it are a
    // foreign address and a havip-labelled address this pair never added (another
    // pair's): only the VIP the pair added and no longer has may go.
    lab.stop_agent(0);
    let file = lab.config_files(0)[0].clone();
    let yaml = std::fs::read_to_string(&file).expect("config");
    let line = format!("  - address: {removed}/24\n    interface: eth0\n    probePorts: [8080]\n");
    assert!(yaml.contains(&line), "{yaml}");
    std::fs::write(&file, yaml.replace(&line, "")).expect("rewrite config");
    let foreign = lab.topo.vip(8);
    let other_pair = lab.topo.vip(7);
    netns::exec(&n0, "ip", &["addr", "add", &format!("{foreign}/24"), "dev", "eth0"]).expect("add foreign");
    netns::exec(&n0, "ip", &["addr", "add", &format!("{other_pair}/24"), "dev", "eth0", "label", "eth0:hv"])
        .expect("add another pair's VIP");
    lab.start_agent(0).expect("restart");
    netns::wait_until("the stale VIP to be removed", Duration::from_secs(5), Duration::from_millis(20), || {
        Ok(!netns::has_address(&n0, "eth0", IpAddr::V4(removed))?)
    })
    .expect("stale VIP removed");
    assert!(netns::has_address(&n0, "eth0", IpAddr::V4(foreign)).expect("addresses"), "foreign address kept");
    assert!(netns::has_address(&n0, "eth0", IpAddr::V4(other_pair)).expect("addresses"), "another pair's VIP kept");
    lab.wait_sole_holder(0, UP).expect("n0 still holds the pair's VIP");
}

/// The chaos run's W8 (60-minute run 3): a standby whose kernel still names an earlier
/// holder's MAC for the VIP (it missed the current holder's announcements) probed the VIP
/// into that node, which drops it, and took over from a holder whose agent had died while
/// its kernel kept serving. Here n1, the best standby, gets such an entry (n2's MAC, the
/// "earlier holder"), then n0's agent is SIGKILLed: its VIP and listener keep serving, so
/// no member may take over. The urgent probes forget the VIPs' neighbour entries first and
/// reach n0 (without that, n1 takes over within a second: checked).
#[test]
fn a_standby_with_a_stale_neighbour_entry_for_the_vip_does_not_take_over_a_serving_holder() {
    let Some(mut lab) = lab(PairOptions { members: 3, forwarding: true, ..PairOptions::default() }) else { return };
    let prober = bring_up(&lab);
    let n1 = lab.topo.node(1).clone();
    let vip = lab.topo.vip(0).to_string();
    let n2_mac = lab.topo.node(2).data_mac.clone();
    netns::exec(&n1.ns, "ip", &["neigh", "replace", &vip, "lladdr", &n2_mac, "dev", &n1.data_if, "nud", "stale"])
        .expect("plant the stale entry");
    lab.kill_agent(0);
    n0_alone_holds_for(&lab, Duration::from_secs(5), &[1, 2]);
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "nothing moved: {}", report.summary());
    assert_eq!(report.failed_connects(), 0, "{}", report.summary());
}

/// The chaos run's W4 (60-minute run 3): a standby's agent restarted while its data cable
/// dropped every frame towards it never heard the gateway again, so the "never answered →
/// check off" rule switched its fence off, and when the holder's agent died it took the
/// VIP over a link it could not serve on. The node remembers which fence targets answered
/// (state directory): the restarted standby counts its misses and goes Fenced, and stays
/// off the VIP when the holder's agent is SIGKILLed (without the memory it is never
/// Fenced: checked).
#[test]
fn a_standby_restarted_while_it_hears_nothing_keeps_its_gateway_check_and_stays_fenced() {
    let Some(mut lab) = lab(PairOptions { forwarding: true, ..PairOptions::default() }) else { return };
    let prober = bring_up(&lab);
    let fault = lab.topo.set_link_loss_one_way(1, Link::Data, 100, true).expect("drop every frame towards n1");
    lab.stop_agent(1);
    lab.start_agent(1).expect("start n1's agent again");
    wait_fenced(&lab, 1);
    lab.kill_agent(0);
    n0_alone_holds_for(&lab, Duration::from_secs(3), &[1]);
    lab.topo.heal(&fault).expect("heal");
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "nothing moved: {}", report.summary());
}

/// The seventh 60-minute chaos run: a Fast pair's timings were edited while its standby's
/// data cable dropped every frame towards it (the standby was Fenced, its gateway
/// unanswered). The new configuration restarted the gateway watch, whose first unanswered
/// round said "reachable": the standby unfenced, and when the holder's agent stopped it
/// took the VIP over a link it could not hear on (two holders for 2 s). Here n1 is fenced
/// the same way, its configuration rewritten (applied at SIGHUP) and n0's agent SIGKILLed:
/// n1 stays Fenced and nothing moves (without the fix n1 unfenced about 0.6 s after the
/// SIGHUP — checked).
#[test]
fn a_fenced_standby_whose_configuration_changes_stays_fenced() {
    let Some(mut lab) = lab(PairOptions { fast_profile: true, forwarding: true, ..PairOptions::default() }) else {
        return;
    };
    let prober = bring_up(&lab);
    let fault = lab.topo.set_link_loss_one_way(1, Link::Data, 100, true).expect("drop every frame towards n1");
    wait_fenced(&lab, 1);
    let applied = |lab: &AgentLab| lab.agent_log(1).matches("applying a new configuration").count();
    let before = applied(&lab);
    lab.write_config_with(1, "drainTimeout: 7s\n").expect("rewrite n1's configuration");
    lab.signal_agent(1, nix::sys::signal::Signal::SIGHUP);
    netns::wait_until("n1 to apply its new configuration", Duration::from_secs(5), Duration::from_millis(20), || {
        Ok(applied(&lab) > before)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    // Three gateway rounds and more: a fresh watch that heard nothing must not unfence.
    let until = std::time::Instant::now() + Duration::from_millis(1_800);
    while std::time::Instant::now() < until {
        assert_eq!(lab.role(1).as_deref(), Some("Fenced"), "n1 stays Fenced\n{}", lab.diagnostics());
        std::thread::sleep(Duration::from_millis(50));
    }
    lab.kill_agent(0);
    n0_alone_holds_for(&lab, Duration::from_secs(3), &[1]);
    lab.topo.heal(&fault).expect("heal");
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "nothing moved: {}", report.summary());
}

/// The fifth 60-minute chaos run: the holder's agent died while its kernel kept serving,
/// and the standby's own cable lost frames — its probes of the VIP failed most of the time,
/// a few were answered, and on three failures in a row it took over (two holders until the
/// old holder's agent ran again). Here n0's agent is SIGKILLed (its VIP and listener keep
/// serving) while three of every four SYN-ACKs from the VIP to n1 are dropped (Fast
/// profile): n1 must not take over — a probe is three connects, up when any is answered,
/// and "down" needs no answer for a heartbeat timeout (without both, n1 takes over at once:
/// checked). Control: n0's listener stops too — a dead data plane (connects refused) — and
/// n1 takes over.
#[test]
fn a_standby_whose_own_cable_loses_frames_does_not_take_over_a_serving_holder() {
    let Some(mut lab) = lab(PairOptions { fast_profile: true, forwarding: true, ..PairOptions::default() }) else {
        return;
    };
    let prober = bring_up(&lab);
    let vip = IpAddr::V4(lab.topo.vip(0));
    let fault = lab
        .topo
        .drop_most_syn_acks_towards(1, Link::Data, vip, havip_e2e::agent::SERVICE_PORT)
        .expect("drop most SYN-ACKs towards n1");
    lab.kill_agent(0);
    n0_alone_holds_for(&lab, Duration::from_secs(3), &[1]);
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "nothing moved: {}", report.summary());
    assert_eq!(report.failed_connects(), 0, "{}", report.summary());

    // Control: the data plane dies too (refused: the RSTs pass) — n1 takes over.
    lab.listeners[0].stop();
    netns::wait_until("n1 to take over a dead data plane", Duration::from_secs(5), Duration::from_millis(20), || {
        Ok(lab.role(1).as_deref() == Some("Active"))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    lab.topo.heal(&fault).expect("heal");
}

/// The urgent probes forget the VIPs' neighbour entries (a stale one may name an earlier
/// holder), so each connect waits for the kernel to resolve the VIP again; a lost answer
/// made the kernel wait a second before asking again, every probe failing meanwhile — on
/// a lossy cable, a dead holder to the verdict (the fifth 60-minute chaos run). The probes
/// now ask who has the VIP themselves every round. Here every ARP reply to n1's kernel for
/// the VIP is dropped (an ARP probe's reply, addressed to 0.0.0.0, passes), and n0's agent
/// is SIGKILLed while its kernel serves: n1 must resolve the VIP through its own asking and
/// stay a standby (without the asking, n1 takes over: checked).
#[test]
fn a_standby_whose_kernel_cannot_resolve_the_vip_asks_itself_and_does_not_take_over() {
    let Some(mut lab) = lab(PairOptions { fast_profile: true, forwarding: true, ..PairOptions::default() }) else {
        return;
    };
    let prober = bring_up(&lab);
    let fault = lab
        .topo
        .drop_kernel_arp_replies_towards(1, Link::Data, lab.topo.vip(0))
        .expect("drop the ARP replies to n1's kernel");
    lab.kill_agent(0);
    n0_alone_holds_for(&lab, Duration::from_secs(3), &[1]);
    lab.topo.heal(&fault).expect("heal");
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "nothing moved: {}", report.summary());
}
