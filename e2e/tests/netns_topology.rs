//! The network-namespace harness against the real kernel: topology, faults,
//! listeners, the prober and keepalived. Needs root (CAP_NET_ADMIN); prints a
//! `SKIPPED:` line and passes otherwise. Every test creates and removes its own
//! namespaces, so they run in parallel.

use havip_e2e::keepalived::{Keepalived, KeepalivedConfig, VrrpState};
use havip_e2e::netns::{self, Link, Topology};
use havip_e2e::traffic::{Listener, ProbeError, Prober, ProberConfig, probe_once};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

macro_rules! require_root {
    () => {
        if !netns::skip_unless_root(std::thread::current().name().unwrap_or(module_path!())) {
            return;
        }
        havip_e2e::init_tracing();
    };
}

/// One TCP connect from `ns` to `addr`, reading the responder's name.
fn tcp_name(ns: &str, addr: impl Into<SocketAddr>) -> Result<String, ProbeError> {
    let config = ProberConfig::new(addr.into())
        .connect_timeout(Duration::from_millis(300))
        .read_timeout(Duration::from_millis(300));
    netns::in_netns(ns, move || probe_once(&config)).expect("thread in namespace")
}

/// Polls until a connect from `ns` to `addr` is answered by `want`.
fn await_tcp_name(ns: &str, addr: impl Into<SocketAddr>, want: &str, timeout: Duration) -> Duration {
    let addr = addr.into();
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < timeout {
        match tcp_name(ns, addr) {
            Ok(name) if name == want => return start.elapsed(),
            other => last = Some(other),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{ns} → {addr}: not answered by {want} within {timeout:?}; last: {last:?}");
}

/// A UDP echo server in `ns` on `0.0.0.0:port`, for `timeout`.
fn udp_echo(ns: &str, port: u16, timeout: Duration) -> netns::NetnsThread<usize> {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = netns::run_in_netns(ns, move || {
        let s = UdpSocket::bind(("0.0.0.0", port)).expect("bind udp");
        s.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        tx.send(()).expect("ready");
        let (mut echoed, start, mut buf) = (0, Instant::now(), [0u8; 64]);
        while start.elapsed() < timeout {
            if let Ok((n, peer)) = s.recv_from(&mut buf) {
                if &buf[..n] == b"stop" {
                    break;
                }
                let _ = s.send_to(&buf[..n], peer);
                echoed += 1;
            }
        }
        echoed
    })
    .expect("udp echo thread");
    rx.recv().expect("echo server ready");
    t
}

/// Whether a UDP datagram from `ns` (source port `src_port`, 0 for any) to `to`
/// is echoed within `wait` — a few tries.
fn udp_roundtrip(ns: &str, src_port: u16, to: SocketAddr, wait: Duration) -> bool {
    netns::in_netns(ns, move || {
        let s = UdpSocket::bind(("0.0.0.0", src_port)).expect("bind");
        s.set_read_timeout(Some(wait / 3)).expect("timeout");
        let mut buf = [0u8; 64];
        for _ in 0..3 {
            s.send_to(b"ping", to).expect("send");
            if let Ok((n, _)) = s.recv_from(&mut buf) {
                return &buf[..n] == b"ping";
            }
        }
        false
    })
    .expect("thread in namespace")
}

fn ours(prefix: &str) -> Vec<String> {
    netns::list_namespaces().expect("list").into_iter().filter(|n| n.starts_with(&format!("{prefix}-"))).collect()
}

#[test]
fn topology_comes_up_connects_and_is_removed() {
    require_root!();
    let topo = Topology::builder().nodes(5).build().expect("topology");
    let prefix = topo.prefix().to_owned();
    let k = topo.k();
    assert_eq!(ours(&prefix).len(), 8, "switch, gateway, client and 5 nodes: {:?}", ours(&prefix));
    assert!(Topology::builder().nodes(6).build().is_err(), "2..=5 nodes");
    assert_eq!(netns::link_state(topo.switch_ns(), "data").expect("bridge").operstate, "UP");

    // Address plan.
    for (i, n) in topo.nodes().iter().enumerate() {
        assert_eq!(n.data_ip.octets(), [10, k, 0, 10 + i as u8]);
        assert_eq!(n.mgmt_ip.octets(), [10, k, 1, 10 + i as u8]);
        let addrs = netns::addresses(&n.ns, "eth0").expect("addresses");
        assert!(addrs.iter().any(|a| a.ip == IpAddr::V4(n.data_ip) && a.prefix_len == 24), "{addrs:?}");
        assert!(addrs.iter().any(|a| a.ip == IpAddr::V6(n.data_ip6) && a.prefix_len == 64), "{addrs:?}");
        assert_eq!(netns::link_state(&n.ns, "eth0").expect("link").mac, n.data_mac);
        assert!(netns::has_address(&n.ns, "eth1", n.mgmt_ip.into()).expect("addresses"));
        let routes = netns::exec(&n.ns, "ip", &["route", "show", "default"]).expect("routes");
        assert!(routes.contains(&format!("via {}", topo.gateway().ip)), "{routes}");
    }
    assert_eq!(topo.client().ip.octets(), [10, k, 0, 100]);
    assert_eq!(topo.gateway().ip.octets(), [10, k, 0, 254]);
    assert_eq!(netns::sysctl(&topo.client().ns, "net.ipv4.conf.eth0.arp_accept").expect("sysctl"), "0");
    // The load generator may reuse its TIME_WAIT ports; the nodes keep the default (2:
    // loopback only).
    assert_eq!(netns::sysctl(&topo.client().ns, "net.ipv4.tcp_tw_reuse").expect("sysctl"), "1");
    assert_eq!(netns::sysctl(&topo.node(0).ns, "net.ipv4.tcp_tw_reuse").expect("sysctl"), "2");
    // Sysctls are per namespace: the switch has IPv6 off, the nodes on.
    assert_eq!(netns::sysctl(topo.switch_ns(), "net.ipv6.conf.data.disable_ipv6").expect("sysctl"), "1");
    assert_eq!(netns::sysctl(&topo.node(0).ns, "net.ipv6.conf.eth0.disable_ipv6").expect("sysctl"), "0");
    assert_eq!(
        netns::exec(topo.switch_ns(), "cat", &["/proc/sys/net/ipv6/conf/data/disable_ipv6"]).expect("cat").trim(),
        "1"
    );

    // Every node answers on data and mgmt, node to node and client to node.
    let listeners: Vec<Listener> = (0..5).map(|i| Listener::on_node(&topo, i, 7000).expect("listener")).collect();
    for from in topo.nodes() {
        for to in topo.nodes().iter().filter(|t| t.index != from.index) {
            for link in Link::BOTH {
                assert_eq!(
                    tcp_name(&from.ns, (to.ip(link), 7000)),
                    Ok(to.name.clone()),
                    "{} → {} {link}",
                    from.name,
                    to.name
                );
            }
        }
    }
    for n in topo.nodes() {
        assert_eq!(tcp_name(&topo.client().ns, (n.data_ip, 7000)), Ok(n.name.clone()));
        // The client is on the data network only.
        assert!(tcp_name(&topo.client().ns, (n.mgmt_ip, 7000)).is_err(), "client reached {} via mgmt", n.name);
    }
    // Each listener counts a connection after it answered, so the count may trail the
    // client's read of the last answer by a moment: await it.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !listeners.iter().all(|l| l.accepted() >= 9) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(listeners.iter().all(|l| l.accepted() >= 9), "{listeners:?}");

    // The gateway answers ARP; disconnected, it does not.
    let n0 = topo.node(0);
    let mac = netns::resolve_neighbour(&n0.ns, "eth0", topo.gateway().ip.into(), Duration::from_secs(3))
        .expect("gateway resolves");
    assert_eq!(mac, topo.gateway().mac);
    topo.set_gateway_up(false).expect("gateway down");
    topo.set_gateway_up(false).expect("idempotent");
    let n1 = topo.node(1);
    assert!(
        netns::resolve_neighbour(&n1.ns, "eth0", topo.gateway().ip.into(), Duration::from_millis(1500)).is_err(),
        "a disconnected gateway must not answer ARP"
    );
    topo.set_gateway_up(true).expect("gateway up");
    let mac = netns::resolve_neighbour(&n1.ns, "eth0", topo.gateway().ip.into(), Duration::from_secs(5))
        .expect("gateway resolves again");
    assert_eq!(mac, topo.gateway().mac);

    // IPv6 works on the links: link-local after DAD, and TCP over the ULA.
    topo.wait_ipv6_ready(Duration::from_secs(10)).expect("IPv6 ready");
    let ll = netns::addresses(&n0.ns, "eth0").expect("addresses");
    assert!(ll.iter().any(|a| a.scope == "link" && a.ip.is_ipv6() && !a.tentative), "{ll:?}");
    let _l6 = Listener::start(&n0.ns, "n0-v6", SocketAddr::from((Ipv6Addr::UNSPECIFIED, 7001))).expect("v6 listener");
    assert_eq!(tcp_name(&topo.client().ns, (n0.data_ip6, 7001)), Ok("n0-v6".to_owned()));
    assert_eq!(tcp_name(&n1.ns, (n0.mgmt_ip6, 7001)), Ok("n0-v6".to_owned()));

    drop(listeners);
    drop(topo);
    assert!(ours(&prefix).is_empty(), "namespaces left behind: {:?}", ours(&prefix));
    assert!(!Path::new(netns::STATE_DIR).join(format!("{prefix}.lock")).exists(), "owner lock left behind");
}

#[test]
fn cut_cable_drops_carrier_and_restore_brings_it_back() {
    require_root!();
    let topo = Topology::builder().nodes(2).build().expect("topology");
    let (n0, client) = (topo.node(0).clone(), topo.client().clone());
    let _l0 = Listener::on_node(&topo, 0, 7000).expect("listener");
    await_tcp_name(&client.ns, (n0.data_ip, 7000), "n0", Duration::from_secs(2));

    topo.cut_cable(0, Link::Data).expect("cut");
    topo.cut_cable(0, Link::Data).expect("cut is idempotent");
    let eth0 = netns::link_state(&n0.ns, "eth0").expect("link");
    assert!(eth0.flags.iter().any(|f| f == "NO-CARRIER"), "{eth0:?}");
    assert!(!eth0.has_carrier() && eth0.admin_up(), "{eth0:?}");
    assert_eq!(eth0.operstate, "DOWN");
    assert!(netns::link_state(&n0.ns, "eth1").expect("link").has_carrier(), "only the data cable is cut");
    // The node keeps its addresses; it is just unreachable.
    assert!(netns::has_address(&n0.ns, "eth0", n0.data_ip.into()).expect("addresses"));
    assert!(tcp_name(&client.ns, (n0.data_ip, 7000)).is_err());
    assert_eq!(tcp_name(&topo.node(1).ns, (n0.mgmt_ip, 7000)), Ok("n0".to_owned()), "mgmt still works");

    topo.restore_cable(0, Link::Data).expect("restore");
    topo.restore_cable(0, Link::Data).expect("restore is idempotent");
    let eth0 = netns::link_state(&n0.ns, "eth0").expect("link");
    assert!(eth0.has_carrier() && eth0.flags.iter().any(|f| f == "LOWER_UP"), "{eth0:?}");
    assert_eq!(eth0.operstate, "UP");
    await_tcp_name(&client.ns, (n0.data_ip, 7000), "n0", Duration::from_secs(5));

    topo.cut_node(0).expect("cut node");
    for dev in ["eth0", "eth1"] {
        assert!(!netns::link_state(&n0.ns, dev).expect("link").has_carrier(), "{dev}");
    }
    assert!(tcp_name(&topo.node(1).ns, (n0.mgmt_ip, 7000)).is_err());
    topo.restore_node(0).expect("restore node");
    for dev in ["eth0", "eth1"] {
        assert!(netns::link_state(&n0.ns, dev).expect("link").has_carrier(), "{dev}");
    }
    await_tcp_name(&topo.node(1).ns, (n0.mgmt_ip, 7000), "n0", Duration::from_secs(5));
}

#[test]
fn udp_partition_drops_udp_on_the_port_but_tcp_passes() {
    require_root!();
    let topo = Topology::builder().nodes(2).build().expect("topology");
    let (n0, n1) = (topo.node(0).clone(), topo.node(1).clone());
    let _l1 = Listener::on_node(&topo, 1, 7000).expect("listener");
    let echo = udp_echo(&n1.ns, 5405, Duration::from_secs(60));
    let other = udp_echo(&n1.ns, 5406, Duration::from_secs(60));
    let wait = Duration::from_millis(600);
    for link in Link::BOTH {
        assert!(udp_roundtrip(&n0.ns, 0, (n1.ip(link), 5405).into(), wait), "UDP before the fault on {link}");
    }

    let mgmt = topo.partition_udp_port(0, 5405, &[Link::Mgmt]).expect("partition mgmt");
    assert_eq!(topo.partition_udp_port(0, 5405, &[Link::Mgmt]).expect("again"), mgmt, "same fault, same table");
    assert!(!udp_roundtrip(&n0.ns, 0, (n1.mgmt_ip, 5405).into(), wait), "UDP to the port on mgmt is dropped");
    // From the port, too: n0 sends from 5405 to n1's other port.
    assert!(!udp_roundtrip(&n0.ns, 5405, (n1.mgmt_ip, 5406).into(), wait), "UDP from the port is dropped");
    assert!(udp_roundtrip(&n0.ns, 0, (n1.mgmt_ip, 5406).into(), wait), "other UDP ports pass");
    assert!(udp_roundtrip(&n0.ns, 0, (n1.data_ip, 5405).into(), wait), "the data link is not partitioned");
    assert_eq!(tcp_name(&n0.ns, (n1.mgmt_ip, 7000)), Ok("n1".to_owned()), "TCP passes");

    let data = topo.partition_udp_port(0, 5405, &[Link::Data]).expect("partition data");
    assert_ne!(data.table, mgmt.table);
    assert!(!udp_roundtrip(&n0.ns, 0, (n1.data_ip, 5405).into(), wait));
    assert_eq!(topo.faults_in(&n0.ns).expect("faults").len(), 2);

    // Healing one removes exactly that one.
    topo.heal(&mgmt).expect("heal");
    topo.heal(&mgmt).expect("heal is idempotent");
    assert_eq!(topo.faults_in(&n0.ns).expect("faults"), vec![data.clone()]);
    assert!(udp_roundtrip(&n0.ns, 0, (n1.mgmt_ip, 5405).into(), wait), "mgmt healed");
    assert!(!udp_roundtrip(&n0.ns, 0, (n1.data_ip, 5405).into(), wait), "data still partitioned");

    // TCP can be blocked on its own too: silently (a timeout, not an error on send).
    let tcp = topo.block_tcp_port(0, 7000, &[Link::Mgmt]).expect("block tcp");
    assert_eq!(tcp_name(&n0.ns, (n1.mgmt_ip, 7000)), Err(ProbeError::ConnectTimeout));
    assert_eq!(tcp_name(&n0.ns, (n1.data_ip, 7000)), Ok("n1".to_owned()));
    topo.heal(&tcp).expect("heal tcp");
    assert_eq!(tcp_name(&n0.ns, (n1.mgmt_ip, 7000)), Ok("n1".to_owned()));

    // Total loss at the switch port: carrier stays, nothing passes; then heal all.
    topo.set_link_loss(1, Link::Mgmt, 100).expect("loss");
    assert!(netns::link_state(&n1.ns, "eth1").expect("link").has_carrier());
    assert!(tcp_name(&n0.ns, (n1.mgmt_ip, 7000)).is_err(), "black-holed link");
    topo.heal_all().expect("heal all");
    assert!(topo.faults_in(&n0.ns).expect("faults").is_empty());
    assert!(topo.faults_in(topo.switch_ns()).expect("faults").is_empty());
    assert!(udp_roundtrip(&n0.ns, 0, (n1.data_ip, 5405).into(), wait));
    assert_eq!(tcp_name(&n0.ns, (n1.mgmt_ip, 7000)), Ok("n1".to_owned()));

    for port in [5405, 5406] {
        assert!(udp_roundtrip(&n0.ns, 0, (n1.data_ip, port).into(), wait));
        netns::in_netns(&n0.ns, move || {
            UdpSocket::bind(("0.0.0.0", 0)).and_then(|s| s.send_to(b"stop", (n1.data_ip, port))).expect("stop echo")
        })
        .expect("thread");
    }
    assert!(echo.join().expect("echo") >= 5);
    assert!(other.join().expect("echo") >= 1);
}

#[test]
fn prober_records_gaps_and_who_answered() {
    require_root!();
    let topo = Topology::builder().nodes(2).build().expect("topology");
    let (n0, n1, client) = (topo.node(0).clone(), topo.node(1).clone(), topo.client().clone());
    let mut l0 = Listener::on_node(&topo, 0, 8080).expect("listener");
    let _l1 = Listener::on_node(&topo, 1, 8080).expect("listener");
    let vip = topo.vip(0);
    netns::exec(&n0.ns, "ip", &["addr", "add", &format!("{vip}/24"), "dev", "eth0"]).expect("add VIP");

    let prober = Prober::on_client(&topo, (vip, 8080).into()).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(3)).expect("n0 answers");
    let ok_before = prober.ok_count();
    prober.wait_until_ok(ok_before + 20, Duration::from_secs(3)).expect("steady answers");

    // Listener down: connects are refused.
    l0.stop();
    let closed_at = Instant::now();
    prober.wait_for_failures(10, Duration::from_secs(3)).expect("failures while stopped");
    let min_closed = Duration::from_millis(300);
    if let Some(left) = min_closed.checked_sub(closed_at.elapsed()) {
        std::thread::sleep(left); // the length of the outage, not synchronisation
    }
    let closed_for = closed_at.elapsed();
    l0.start_again().expect("listener again");
    let ok_mid = prober.ok_count();
    prober.wait_until_ok(ok_mid + 10, Duration::from_secs(3)).expect("answers again");

    // Move the VIP to n1 by hand (no GARP: drop the client's neighbour entry).
    netns::exec(&n0.ns, "ip", &["addr", "del", &format!("{vip}/24"), "dev", "eth0"]).expect("del VIP");
    netns::exec(&n1.ns, "ip", &["addr", "add", &format!("{vip}/24"), "dev", "eth0"]).expect("add VIP");
    netns::exec(&client.ns, "ip", &["neigh", "flush", "to", &vip.to_string(), "dev", "eth0"]).expect("flush");
    prober.wait_for_responder("n1", Duration::from_secs(3)).expect("n1 answers");
    let ok_n1 = prober.ok_count();
    prober.wait_until_ok(ok_n1 + 10, Duration::from_secs(3)).expect("n1 steady");

    let report = prober.stop().expect("report");
    println!("{}", report.summary());
    assert!(report.failed > 0 && report.failures.len() == report.failed, "{}", report.summary());
    assert!(report.failure_kinds().contains_key("refused"), "{}", report.summary());
    assert_eq!(report.ok + report.failed, report.attempts);
    let gap = report.longest_gap.as_ref().expect("a gap");
    assert!(
        report.longest_gap_ms >= closed_for.as_secs_f64() * 1e3,
        "gap {:.1} ms must cover the {closed_for:?} outage: {}",
        report.longest_gap_ms,
        report.summary()
    );
    assert_eq!((gap.before.as_str(), gap.after.as_str()), ("n0", "n0"), "{}", report.summary());
    assert_eq!(report.responder_sequence(), vec!["n0", "n1"], "{}", report.summary());
    assert_eq!(report.holder_changes(), 1);
    assert_eq!(report.last_responder(), Some("n1"));
    assert!(report.runs[0].count >= 30 && report.runs[1].count >= 10, "{}", report.summary());
    // The cadence: ~5 ms between starts while answers are quick.
    let steady: Vec<f64> =
        report.timeline.windows(2).filter(|w| w[0].outcome.is_ok()).map(|w| w[1].start_ms - w[0].start_ms).collect();
    let median = {
        let mut s = steady.clone();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    assert!((3.0..=10.0).contains(&median), "median spacing {median:.2} ms between probe starts");
    assert!(l0.accepted() as usize >= report.runs[0].count);
}

/// The benchmarks' overlapping probes: a probe starts every cadence while earlier ones
/// wait out their connect timeouts in a silent black hole, so the gap ends within about
/// one cadence of the path returning; one at a time, a probe that started into the hole
/// holds the next one back for its whole connect timeout (here 300 ms, to make the
/// difference plain).
#[test]
fn overlapping_probes_end_a_gap_within_one_cadence_of_the_path_returning() {
    require_root!();
    let topo = Topology::builder().nodes(2).build().expect("topology");
    let _l0 = Listener::on_node(&topo, 0, 8080).expect("listener");
    let vip = topo.vip(0);
    netns::exec(&topo.node(0).ns, "ip", &["addr", "add", &format!("{vip}/24"), "dev", "eth0"]).expect("add VIP");
    let config = ProberConfig::new((vip, 8080).into())
        .interval(Duration::from_millis(10))
        .connect_timeout(Duration::from_millis(300));
    let overlapping = Prober::start(&topo.client().ns, config.clone().overlapping()).expect("prober");
    let one_at_a_time = Prober::start(&topo.client().ns, config).expect("prober");
    for p in [&overlapping, &one_at_a_time] {
        p.wait_for_responder("n0", Duration::from_secs(3)).expect("n0 answers");
        p.wait_until_ok(p.ok_count() + 10, Duration::from_secs(3)).expect("steady answers");
    }

    let hole = topo.set_link_loss(0, Link::Data, 100).expect("black hole");
    let cut_at = Instant::now();
    overlapping.wait_for_failures(5, Duration::from_secs(3)).expect("connects time out in the hole");
    if let Some(left) = Duration::from_millis(600).checked_sub(cut_at.elapsed()) {
        std::thread::sleep(left); // the length of the outage, not synchronisation
    }
    let healing = Instant::now();
    topo.heal(&hole).expect("heal");
    let healed = Instant::now();
    for p in [&overlapping, &one_at_a_time] {
        p.wait_until_ok(p.ok_count() + 10, Duration::from_secs(3)).expect("answers again");
    }
    let (from, to) = (overlapping.ms_at(healing), overlapping.ms_at(healed));
    let report = overlapping.stop().expect("report");
    let sequential = one_at_a_time.stop().expect("report");
    println!("overlapping: {}\none at a time: {}", report.summary(), sequential.summary());

    let gap = report.longest_gap.as_ref().expect("a gap");
    assert!(gap.to_ms >= from, "an answer through the hole: gap ends {:.1} ms, heal began {from:.1} ms", gap.to_ms);
    assert!(
        gap.to_ms <= to + 30.0,
        "the gap ends {:.1} ms after the path returned (cadence 10 ms): {}",
        gap.to_ms - to,
        report.summary()
    );
    // About 60 probes started into the 600 ms hole and each timed out; one at a time, two
    // or three did.
    assert!(report.failed >= 30, "{}", report.summary());
    assert!(sequential.failed <= 4 && sequential.failed * 8 <= report.failed, "{}", sequential.summary());
    assert!(report.timeline.windows(2).all(|w| w[0].end_ms <= w[1].end_ms), "the timeline is ordered by completion");
    assert_eq!(report.ok + report.failed, report.attempts);
}

#[test]
fn keepalived_v3_fast_elects_the_higher_priority_and_fails_over() {
    require_root!();
    let topo = Topology::builder().nodes(2).build().expect("topology");
    let client = topo.client().clone();
    let vip = topo.vip(0);
    let _l0 = Listener::on_node(&topo, 0, 80).expect("listener");
    let _l1 = Listener::on_node(&topo, 1, 80).expect("listener");
    let mut k0 = Keepalived::start(&topo, 0, KeepalivedConfig::v3_fast()).expect("keepalived n0");
    let k1 = Keepalived::start(&topo, 1, KeepalivedConfig::v3_fast()).expect("keepalived n1");
    assert!(k0.priority() > k1.priority());

    k0.wait_holds_vip(true, Duration::from_secs(3)).expect("the higher priority takes the VIP");
    assert!(!k1.holds_vip().expect("addresses"), "only the master holds the VIP");
    assert_eq!(k0.state(), Some(VrrpState::Master), "{}", k0.log_tail(20));
    await_tcp_name(&client.ns, (vip, 80), "n0", Duration::from_secs(2));
    let neigh = netns::neighbour(&client.ns, "eth0", vip.into()).expect("neigh").expect("client has an entry");
    assert_eq!(neigh.mac.as_deref(), Some(topo.node(0).data_mac.as_str()), "{neigh:?}");

    // Pull both of the master's cables: the backup takes over.
    let prober = Prober::on_client(&topo, (vip, 80).into()).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(2)).expect("n0 answers");
    topo.cut_node(0).expect("cut n0");
    let took = k1.wait_holds_vip(true, Duration::from_secs(2)).expect("backup takes the VIP within 2 s");
    println!("keepalived v3_fast: backup holds the VIP {took:?} after the cable cut");
    prober.wait_for_responder("n1", Duration::from_secs(2)).expect("client reaches n1 via the VIP");
    // The client (arp_accept=0) had an entry for the VIP: the new master's GARP updated it.
    let neigh = netns::neighbour(&client.ns, "eth0", vip.into()).expect("neigh").expect("client has an entry");
    assert_eq!(neigh.mac.as_deref(), Some(topo.node(1).data_mac.as_str()), "{neigh:?}");
    k0.wait_holds_vip(false, Duration::from_secs(2)).expect("carrier loss: FAULT removes the VIP");
    assert_eq!(k0.state(), Some(VrrpState::Fault), "{}", k0.log_tail(20));
    let report = prober.stop().expect("report");
    println!("{}", report.summary());
    assert_eq!(report.responder_sequence(), vec!["n0", "n1"], "{}", report.summary());
    assert!(report.longest_gap_ms < 2000.0, "{}", report.summary());

    // Back: n0 preempts (nopreempt is off).
    topo.restore_node(0).expect("restore n0");
    k0.wait_holds_vip(true, Duration::from_secs(3)).expect("n0 takes the VIP back");
    k1.wait_holds_vip(false, Duration::from_secs(2)).expect("n1 gives it up");
    await_tcp_name(&client.ns, (vip, 80), "n0", Duration::from_secs(2));

    // Planned handover: SIGTERM sends priority 0.
    k0.stop_graceful();
    assert!(!k0.is_running());
    let took = k1.wait_holds_vip(true, Duration::from_secs(1)).expect("backup takes over after priority 0");
    println!("keepalived v3_fast: graceful handover in {took:?}");
    assert!(!k0.holds_vip().expect("addresses"), "a graceful stop removes the VIP");

    // A crash: the VIP stays behind on the dead node.
    k0.start_again().expect("restart n0");
    k0.wait_holds_vip(true, Duration::from_secs(3)).expect("n0 preempts again");
    k1.wait_holds_vip(false, Duration::from_secs(2)).expect("n1 gives it up");
    k0.kill();
    assert!(!k0.is_running());
    let took = k1.wait_holds_vip(true, Duration::from_secs(2)).expect("backup takes the VIP after SIGKILL");
    println!("keepalived v3_fast: backup holds the VIP {took:?} after SIGKILL of the master");
    assert!(k0.holds_vip().expect("addresses"), "SIGKILL leaves the VIP on the dead master (duplicate)");
}

#[test]
fn keepalived_v2_defaults_elect_the_higher_priority() {
    require_root!();
    let topo = Topology::builder().nodes(3).build().expect("topology");
    let ks: Vec<Keepalived> = [(0, 100), (1, 150), (2, 120)]
        .into_iter()
        .map(|(i, p)| Keepalived::start(&topo, i, KeepalivedConfig::v2_defaults().priority(p)).expect("keepalived"))
        .collect();
    ks[1].wait_holds_vip(true, Duration::from_secs(6)).expect("priority 150 takes the VIP");
    for k in [&ks[0], &ks[2]] {
        assert!(!k.holds_vip().expect("addresses"), "{} must not hold the VIP", k.node());
    }
    let _l1 = Listener::on_node(&topo, 1, 80).expect("listener");
    await_tcp_name(&topo.client().ns, (topo.vip(0), 80), "n1", Duration::from_secs(2));
}

#[test]
fn cleanup_stale_removes_namespaces_of_dead_owners_only() {
    require_root!();
    // A dead owner: pid 99999999 cannot exist (pid_max ≤ 4194304).
    let dead = format!("{}99999999-0-n0", netns::NS_PREFIX);
    // A live pid (ours) whose owner lock is not held: a reused pid.
    let me = std::process::id();
    let reused = format!("{}{me}-999999-n0", netns::NS_PREFIX);
    // A live pid without a lock file: left alone.
    let live = format!("{}{me}-999998-n0", netns::NS_PREFIX);
    std::fs::create_dir_all(netns::STATE_DIR).expect("state dir");
    let lock = Path::new(netns::STATE_DIR).join(format!("{}{me}-999999.lock", netns::NS_PREFIX));
    for ns in [&dead, &reused, &live] {
        std::process::Command::new("ip").args(["netns", "add", ns]).status().expect("ip netns add");
    }
    std::fs::write(&lock, b"").expect("lock file");
    let dead_dir = std::env::temp_dir().join(format!("{}99999999-0-logs", netns::NS_PREFIX));
    std::fs::create_dir_all(dead_dir.join("sub")).expect("stale temp dir");
    let deleted = netns::cleanup_stale().expect("cleanup");
    let left = netns::list_namespaces().expect("list");
    let _ = std::process::Command::new("ip").args(["netns", "delete", &live]).status();
    // Another test's `build()` may have cleaned them up first: check what is left.
    assert!(!left.contains(&dead), "dead owner's namespace left: {deleted:?}");
    assert!(!left.contains(&reused), "reused pid's namespace left: {deleted:?}");
    assert!(!deleted.contains(&live) && left.contains(&live), "{deleted:?}");
    assert!(!lock.exists(), "the stale owner lock is removed");
    assert!(!dead_dir.exists(), "the dead owner's temporary directory is removed");
}

#[test]
fn keepalived_split_brain_when_vrrp_is_blocked() {
    require_root!();
    let topo = Topology::builder().nodes(2).build().expect("topology");
    let k0 = Keepalived::start(&topo, 0, KeepalivedConfig::v3_fast()).expect("keepalived n0");
    let k1 = Keepalived::start(&topo, 1, KeepalivedConfig::v3_fast()).expect("keepalived n1");
    k0.wait_holds_vip(true, Duration::from_secs(3)).expect("n0 is master");
    assert!(!k1.holds_vip().expect("addresses"));

    // n1 stops hearing (and sending) VRRP: it promotes itself, n0 stays master.
    let vrrp = topo.block_ip_proto(1, 112, &[Link::Data]).expect("block VRRP");
    k1.wait_holds_vip(true, Duration::from_secs(2)).expect("n1 promotes itself");
    assert!(k0.holds_vip().expect("addresses"), "split brain: both hold the VIP");
    assert!(netns::link_state(&topo.node(1).ns, "eth0").expect("link").has_carrier(), "carrier stays up");

    topo.heal(&vrrp).expect("heal");
    k1.wait_holds_vip(false, Duration::from_secs(2)).expect("n1 backs off once it hears n0 again");
    assert!(k0.holds_vip().expect("addresses"));
}
