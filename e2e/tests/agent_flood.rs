//! A flood of forged heartbeats on real kernels (issue 25): 20,000 datagrams a second
//! naming the pair at the standby's heartbeat port — half from the client's own address
//! (a stranger), half with the active's address forged as their source — for 5 s, while a
//! client connects through the VIP. Root only; the test creates and removes its own
//! namespaces.
//!
//! What must hold: the standby loses no authentic heartbeat of the active (its received
//! counter grows as the active's sent counter does), its queue never overflows, nothing
//! moves, no connect fails, and the flood costs the standby's agent a bounded share of a
//! core (measured from /proc and printed as a JSON line).

#![allow(clippy::unwrap_used)]

use havip_crds::wire;
use havip_e2e::agent::{AgentLab, PairOptions};
use havip_e2e::netns::{self, Link};
use std::time::{Duration, Instant};

const UP: Duration = Duration::from_secs(15);

fn lab(opts: PairOptions) -> Option<AgentLab> {
    havip_e2e::agent::lab_for_test(module_path!(), opts)
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // state is field 3 of stat, i.e. index 0 here; utime 14 → 11, stime 15 → 12.
    n(11) + n(12)
}

fn forged(seq: u64) -> Vec<u8> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let hb = wire::Heartbeat {
        major: wire::PROTOCOL_MAJOR,
        minor: wire::PROTOCOL_MINOR,
        key_id: 1,
        seq,
        timestamp_ms: now,
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
    wire::encode(&hb, &wire::Key { id: 1, secret: b"not the pair's key, not at all".to_vec() })
}

#[test]
fn a_flood_of_forged_heartbeats_loses_no_authentic_one_and_moves_nothing() {
    let Some(lab) = lab(PairOptions::default()) else { return };
    let prober = havip_e2e::agent::bring_up(&lab, UP);
    let n0 = lab.topo.node(0).ip(Link::Data);
    let n1 = lab.topo.node(1).ip(Link::Data);
    let pid = lab.agents[1].as_ref().and_then(|p| p.pid()).expect("n1's agent runs");
    let sent = |lab: &AgentLab| lab.metric_sum(0, "havip_agent_heartbeats_sent_total", &["pair=\"lab\""]);
    let received = |lab: &AgentLab| lab.metric_sum(1, "havip_agent_heartbeats_received_total", &["pair=\"lab\""]);
    let (sent0, received0, cpu0) = (sent(&lab), received(&lab), cpu_ticks(pid));
    let start = Instant::now();
    let flood = netns::run_in_netns(&lab.topo.client().ns.clone(), move || {
        let stranger = std::net::UdpSocket::bind("0.0.0.0:0").expect("udp");
        let spoofed = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).expect("udp");
        spoofed.set_ip_transparent_v4(true).expect("IP_TRANSPARENT");
        spoofed.bind(&std::net::SocketAddr::new(n0.into(), 0).into()).expect("bind n0's address");
        let spoofed: std::net::UdpSocket = spoofed.into();
        let to = (n1, havip_e2e::agent::HEARTBEAT_PORT);
        let begin = Instant::now();
        let mut n = 0u64;
        while begin.elapsed() < Duration::from_secs(5) {
            // 20,000 a second, in bursts of 20 every millisecond.
            let due = begin.elapsed().as_micros() as u64 / 50;
            while n < due {
                n += 1;
                let d = forged(n);
                let s = if n.is_multiple_of(2) { &stranger } else { &spoofed };
                let _ = s.send_to(&d, to);
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        n
    })
    .expect("flooder");
    let n = flood.join().expect("flood");
    let elapsed = start.elapsed();
    // Let the last authentic heartbeats land before reading both counters.
    std::thread::sleep(Duration::from_millis(300));
    let (sent1, received1, cpu1) = (sent(&lab), received(&lab), cpu_ticks(pid));
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let cpu_share = (cpu1 - cpu0) as f64 / ticks / (elapsed.as_secs_f64() + 0.3);
    let (sent_d, received_d) = (sent1 - sent0, received1 - received0);
    let stranger = lab.metric_sum(1, "havip_agent_heartbeats_dropped_total", &["reason=\"stranger\""]);
    let bad_mac = lab.metric_sum(1, "havip_agent_heartbeats_dropped_total", &["reason=\"bad_mac\""]);
    let queue_full = lab.metric_sum(1, "havip_agent_io_errors_total", &["heartbeat_queue_full"]);
    println!(
        "{}",
        serde_json::json!({
            "bench": "heartbeat-flood", "datagrams": n, "seconds": elapsed.as_secs_f64(),
            "stranger_dropped": stranger, "bad_mac_dropped": bad_mac,
            "authentic_sent": sent_d, "authentic_received": received_d, "queue_full": queue_full,
            "standby_agent_cpu_share": (cpu_share * 1000.0).round() / 1000.0,
        })
    );
    assert!(n >= 90_000, "the flood sent {n} datagrams");
    assert!(stranger >= n as f64 * 0.45 && bad_mac >= n as f64 * 0.45, "stranger {stranger}, bad_mac {bad_mac} of {n}");
    // The counters are read a moment apart on the two members: a few heartbeats in flight.
    assert!(received_d + 4.0 >= sent_d, "authentic heartbeats lost: {received_d} received of {sent_d} sent");
    assert_eq!(queue_full, 0.0, "the standby's queue overflowed");
    assert!(cpu_share < 0.5, "the flood took {:.0} % of a core on the standby", cpu_share * 100.0);
    assert_eq!(lab.role(0).as_deref(), Some("Active"));
    assert_eq!(lab.role(1).as_deref(), Some("Standby"));
    assert_eq!(lab.holders(0).expect("holders"), vec![0]);
    let st = lab.status(1).expect("status");
    let alarms: Vec<&str> = st["alarms"].as_array().unwrap().iter().filter_map(|a| a.as_str()).collect();
    assert!(!alarms.contains(&"PeerSilent"), "n0 is heard: {alarms:?}");
    let report = prober.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
    assert_eq!(report.responder_sequence(), vec!["n0"], "nothing moved: {}", report.summary());
}
