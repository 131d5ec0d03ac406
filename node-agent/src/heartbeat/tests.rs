//! The demultiplexer on loopback: several pairs on one socket, unknown pairs, forged
//! and truncated datagrams, a restarted peer, and the exclusive bind.

use super::{Endpoint, EndpointSpec, HeartbeatError, Hub, PathSpec, Received, to_wire, unix_ms};
use crate::sm;
use havip_crds::wire::{self, Heartbeat, Key, Keyring, Session};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

fn keys(b: u8) -> Keyring {
    Keyring { current: Key { id: 1, secret: vec![b; 32] }, previous: None }
}

fn advert(node: &str, epoch: u64) -> sm::Advert {
    sm::Advert {
        sender: sm::NodeId::new(node.to_owned()).expect("node id"),
        role: sm::Role::Active,
        epoch,
        priority: 200,
        holds_vips: true,
        config_revision: 1,
        protocol_major: u16::from(wire::PROTOCOL_MAJOR),
        protocol_minor: u16::from(wire::PROTOCOL_MINOR),
        ready_all: true,
        maintenance: false,
        carrier_ok: true,
        gateway: None,
        suspended: false,
        failback_paused: false,
        draining: false,
        op: None,
        interval_ms: 100,
    }
}

/// A free UDP port on both test addresses.
fn free_port() -> u16 {
    loop {
        let s = std::net::UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 1), 0)).expect("bind");
        let port = s.local_addr().expect("addr").port();
        if std::net::UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 2), port)).is_ok() {
            return port;
        }
    }
}

const N0: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const N1: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

fn spec(pair: &str, me: &str, local: IpAddr, peer: (&str, IpAddr), port: u16, key: u8) -> EndpointSpec {
    EndpointSpec {
        pair: pair.to_owned(),
        node: me.to_owned(),
        port,
        paths: vec![PathSpec { name: "data".into(), local, peers: vec![(peer.0.to_owned(), peer.1)] }],
        keys: keys(key),
        heartbeat_timeout: Duration::from_millis(300),
    }
}

struct Member {
    hub: Arc<Hub>,
    metrics: Arc<crate::metrics::AgentMetrics>,
    endpoints: Vec<(Arc<Endpoint>, mpsc::Receiver<Received>)>,
}

/// A member `me` at `local` serving `pairs` (name, key byte) with one peer.
async fn member(me: &str, local: IpAddr, peer: (&str, IpAddr), port: u16, pairs: &[(&str, u8)]) -> Member {
    let metrics = Arc::new(crate::metrics::AgentMetrics::new());
    let hub = Hub::new(metrics.clone());
    let mut endpoints = Vec::new();
    for (pair, key) in pairs {
        let (tx, rx) = mpsc::channel(64);
        let ep = Endpoint::attach(&hub, spec(pair, me, local, peer, port, *key), metrics.pair(pair), tx)
            .await
            .expect("attach");
        endpoints.push((ep, rx));
    }
    Member { hub, metrics, endpoints }
}

/// Waits until the receiver of a dropped hub is gone (its socket closed), as a
/// restarted process would find it.
async fn port_closed(ip: IpAddr, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while std::net::UdpSocket::bind((ip, port)).is_err() {
        assert!(Instant::now() < deadline, "{ip}:{port} still bound");
        tokio::task::yield_now().await;
    }
}

/// The next message of an endpoint within a deadline.
async fn next(rx: &mut mpsc::Receiver<Received>) -> Option<Received> {
    tokio::time::timeout(Duration::from_secs(2), rx.recv()).await.ok().flatten()
}

/// Nothing arrives within a short window (after the sender's datagrams were flushed).
async fn silent(rx: &mut mpsc::Receiver<Received>) -> bool {
    tokio::time::timeout(Duration::from_millis(200), rx.recv()).await.is_err()
}

/// The sum of `m`'s series of `family` whose labels include `label`.
fn metric_sum(m: &Member, family: &str, label: &str) -> u64 {
    m.metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(family) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

fn dropped(m: &Member, reason: &str) -> u64 {
    metric_sum(m, "havip_agent_heartbeats_dropped_total", &format!("reason=\"{reason}\""))
}

fn epoch_of(r: Option<Received>) -> Option<u64> {
    match r {
        Some(Received::Advert { advert, .. }) => Some(advert.epoch),
        _ => None,
    }
}

#[tokio::test]
async fn two_pairs_on_one_socket_each_hear_their_own_heartbeats() {
    let port = free_port();
    let mut n0 = member("n0", N0, ("n1", N1), port, &[("web", 1), ("db", 2)]).await;
    let mut n1 = member("n1", N1, ("n0", N0), port, &[("web", 1), ("db", 2)]).await;
    assert_eq!(n0.hub.bound_addresses(), vec![SocketAddr::new(N0, port)], "one socket for both pairs");
    for round in 0..20u64 {
        n0.endpoints[0].0.send(&advert("n0", 100 + round));
        n0.endpoints[1].0.send(&advert("n0", 200 + round));
        n1.endpoints[0].0.send(&advert("n1", 300 + round));
        n1.endpoints[1].0.send(&advert("n1", 400 + round));
    }
    for round in 0..20u64 {
        assert_eq!(
            epoch_of(next(&mut n1.endpoints[0].1).await),
            Some(100 + round),
            "web hears web: {}",
            n1.metrics.encode()
        );
        assert_eq!(epoch_of(next(&mut n1.endpoints[1].1).await), Some(200 + round), "db hears db");
        assert_eq!(epoch_of(next(&mut n0.endpoints[0].1).await), Some(300 + round));
        assert_eq!(epoch_of(next(&mut n0.endpoints[1].1).await), Some(400 + round));
    }
    for m in [&n0, &n1] {
        assert_eq!(dropped(m, "bad_mac"), 0, "no pair is charged with another pair's datagrams");
        assert_eq!(dropped(m, "unknown_pair"), 0);
    }
}

#[tokio::test]
async fn unknown_pairs_truncated_and_forged_datagrams_are_counted_where_they_belong() {
    let port = free_port();
    let mut n1 = member("n1", N1, ("n0", N0), port, &[("web", 1), ("db", 2)]).await;
    let s = std::net::UdpSocket::bind((N0, 0)).expect("bind");
    let to = SocketAddr::new(N1, port);
    let hb = |pair: &str| Heartbeat {
        major: wire::PROTOCOL_MAJOR,
        minor: wire::PROTOCOL_MINOR,
        key_id: 1,
        seq: 1,
        timestamp_ms: unix_ms(),
        pair: pair.to_owned(),
        sender: "n0".to_owned(),
        body: to_wire(&advert("n0", 9)),
        session: Some(Session { id: 42, echo: 0 }),
        echoes: Vec::new(),
    };
    // A pair this agent does not run (even signed with a key it knows).
    s.send_to(&wire::encode(&hb("other"), &keys(1).current), to).expect("send");
    // A truncated header.
    s.send_to(b"HV\x01\x01", to).expect("send");
    // A known pair with a wrong MAC: charged to that pair only, as a key mismatch.
    s.send_to(&wire::encode(&hb("web"), &Key { id: 1, secret: vec![9; 32] }), to).expect("send");
    match next(&mut n1.endpoints[0].1).await {
        Some(Received::Rejected { reason: sm::RejectReason::KeyMismatch, .. }) => {}
        other => panic!("web should report a key mismatch, got {other:?}"),
    }
    assert!(silent(&mut n1.endpoints[1].1).await, "db hears nothing of it");
    assert!(silent(&mut n1.endpoints[0].1).await, "nothing else reaches web");
    let text = n1.metrics.encode();
    assert_eq!(dropped(&n1, "unknown_pair"), 1, "{text}");
    assert_eq!(dropped(&n1, "truncated"), 1, "{text}");
    assert!(text.contains("reason=\"bad_mac\"") && text.contains("pair=\"web\""), "{text}");
    assert!(!text.contains("pair=\"db\",path=\"data\",reason=\"bad_mac\""), "{text}");
}

#[tokio::test]
async fn a_second_agent_on_the_same_address_and_port_is_refused() {
    let port = free_port();
    let _n0 = member("n0", N0, ("n1", N1), port, &[("web", 1)]).await;
    let metrics = Arc::new(crate::metrics::AgentMetrics::new());
    let other = Hub::new(metrics.clone());
    let (tx, _rx) = mpsc::channel(4);
    let err = Endpoint::attach(&other, spec("db", "n0", N0, ("n1", N1), port, 2), metrics.pair("db"), tx)
        .await
        .err()
        .expect("the port is taken");
    assert!(matches!(err, HeartbeatError::PortInUse { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("127.0.0.1:{port}")) && msg.contains("--config"), "{msg}");
}

#[tokio::test]
async fn a_restarted_peer_is_heard_again_once_it_has_heard_us() {
    let port = free_port();
    let mut n0 = member("n0", N0, ("n1", N1), port, &[("web", 1)]).await;
    let n1 = member("n1", N1, ("n0", N0), port, &[("web", 1)]).await;
    n1.endpoints[0].0.send(&advert("n1", 1));
    assert_eq!(epoch_of(next(&mut n0.endpoints[0].1).await), Some(1));
    // n1 restarts: a new hub, a new session; it has not heard n0 yet.
    drop(n1);
    port_closed(N1, port).await;
    let mut n1 = member("n1", N1, ("n0", N0), port, &[("web", 1)]).await;
    n1.endpoints[0].0.send(&advert("n1", 2));
    assert!(silent(&mut n0.endpoints[0].1).await, "an unconfirmed session is refused");
    assert_eq!(dropped(&n0, "unconfirmed_session"), 1);
    // n0 speaks; n1 hears it and from then on echoes n0's session: heard at once.
    n0.endpoints[0].0.send(&advert("n0", 1));
    assert_eq!(epoch_of(next(&mut n1.endpoints[0].1).await), Some(1));
    n1.endpoints[0].0.send(&advert("n1", 3));
    assert_eq!(epoch_of(next(&mut n0.endpoints[0].1).await), Some(3));
}

#[tokio::test]
async fn lasting_refusal_is_reported_once_per_timeout() {
    let port = free_port();
    let mut n0 = member("n0", N0, ("n1", N1), port, &[("web", 1)]).await;
    let n1 = member("n1", N1, ("n0", N0), port, &[("web", 1)]).await;
    n1.endpoints[0].0.send(&advert("n1", 1));
    assert_eq!(epoch_of(next(&mut n0.endpoints[0].1).await), Some(1));
    drop(n1);
    port_closed(N1, port).await;
    // A restarted n1 that never hears n0 (one-way loss): every datagram refused.
    let n1 = member("n1", N1, ("n0", N0), port, &[("web", 1)]).await;
    let start = Instant::now();
    let mut reported = None;
    while start.elapsed() < Duration::from_secs(3) && reported.is_none() {
        n1.endpoints[0].0.send(&advert("n1", 2));
        if let Ok(Some(r)) = tokio::time::timeout(Duration::from_millis(50), n0.endpoints[0].1.recv()).await {
            reported = Some((r, start.elapsed()));
        }
    }
    match reported {
        Some((Received::Rejected { reason: sm::RejectReason::Replay, .. }, after)) => {
            assert!(after >= Duration::from_millis(300), "not before a heartbeat timeout: {after:?}");
        }
        other => panic!("expected a lasting-replay report, got {other:?}"),
    }
}

#[tokio::test]
async fn a_reconfiguration_moves_sockets_and_keeps_what_it_knows_of_peers() {
    let port = free_port();
    let mut n0 = member("n0", N0, ("n1", N1), port, &[("web", 1)]).await;
    let n1 = member("n1", N1, ("n0", N0), port, &[("web", 1)]).await;
    n1.endpoints[0].0.send(&advert("n1", 1));
    assert_eq!(epoch_of(next(&mut n0.endpoints[0].1).await), Some(1));
    // Same sockets, new keys on both: no rebind, the session stays.
    let ep = n0.endpoints[0].0.clone();
    ep.update(spec("web", "n0", N0, ("n1", N1), port, 5)).await.expect("update");
    n1.endpoints[0].0.update(spec("web", "n1", N1, ("n0", N0), port, 5)).await.expect("update");
    n1.endpoints[0].0.send(&advert("n1", 2));
    assert_eq!(epoch_of(next(&mut n0.endpoints[0].1).await), Some(2), "heard under the new key, same session");
    // Another port: the new socket is bound, the old one closed.
    let port2 = free_port();
    ep.update(spec("web", "n0", N0, ("n1", N1), port2, 5)).await.expect("update");
    assert_eq!(n0.hub.bound_addresses(), vec![SocketAddr::new(N0, port2)]);
    drop(ep);
    drop(n0.endpoints);
    assert!(n0.hub.bound_addresses().is_empty(), "the last pair closes the socket");
}

const STRANGER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

fn forged(pair: &str, sender: &str, seq: u64) -> Vec<u8> {
    let hb = Heartbeat {
        major: wire::PROTOCOL_MAJOR,
        minor: wire::PROTOCOL_MINOR,
        key_id: 1,
        seq,
        timestamp_ms: unix_ms(),
        pair: pair.to_owned(),
        sender: sender.to_owned(),
        body: to_wire(&advert(sender, 9)),
        session: Some(Session { id: 42, echo: 0 }),
        echoes: Vec::new(),
    };
    wire::encode(&hb, &Key { id: 1, secret: vec![9; 32] })
}

#[tokio::test]
async fn a_strangers_datagrams_raise_nothing_and_are_dropped_unverified() {
    let port = free_port();
    let mut n1 = member("n1", N1, ("n0", N0), port, &[("web", 1)]).await;
    let s = std::net::UdpSocket::bind((STRANGER, 0)).expect("bind");
    for seq in 0..50 {
        s.send_to(&forged("web", "n0", seq), SocketAddr::new(N1, port)).expect("send");
    }
    assert!(silent(&mut n1.endpoints[0].1).await, "a stranger's datagrams reach the machine");
    assert_eq!(dropped(&n1, "stranger"), 50, "{}", n1.metrics.encode());
    assert_eq!(dropped(&n1, "bad_mac"), 0, "not even verified");
}

#[tokio::test]
async fn a_flood_from_a_members_address_loses_no_authentic_heartbeat_and_reports_the_mismatch_sparingly() {
    let port = free_port();
    let mut n1 = member("n1", N1, ("n0", N0), port, &[("web", 1)]).await;
    let n0 = member("n0", N0, ("n1", N1), port, &[("web", 1)]).await;
    // Forged datagrams from n0's own address (a spoofed source) at 20,000 per second for
    // the second in which n0 sends 100 authentic heartbeats.
    let flooder = std::thread::spawn(move || {
        let s = std::net::UdpSocket::bind((N0, 0)).expect("bind");
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < Duration::from_millis(1_100) {
            let due = start.elapsed().as_micros() as u64 / 50;
            while sent < due {
                sent += 1;
                let _ = s.send_to(&forged("web", "n0", sent), SocketAddr::new(N1, port));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        sent
    });
    let (_ep, mut rx) = n1.endpoints.remove(0);
    // The consumer (the runtime) comes back to the queue every 20 ms, as one busy with
    // probes and ticks may: the queue must hold what arrives meanwhile.
    let reader = tokio::spawn(async move {
        let (mut adverts, mut mismatches) = (0u64, 0u64);
        let mut idle = 0;
        while idle < 25 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            idle += 1;
            while let Ok(r) = rx.try_recv() {
                idle = 0;
                match r {
                    Received::Advert { .. } => adverts += 1,
                    Received::Rejected { reason: sm::RejectReason::KeyMismatch, .. } => mismatches += 1,
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        (adverts, mismatches)
    });
    for round in 0..100u64 {
        n0.endpoints[0].0.send(&advert("n0", round + 1));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sent = flooder.join().expect("flooder");
    let (adverts, mismatches) = reader.await.expect("reader");
    let dropped_mac = dropped(&n1, "bad_mac");
    assert_eq!(
        adverts, 100,
        "authentic heartbeats lost; {mismatches} mismatch reports, {dropped_mac} of {sent} forged dropped"
    );
    assert!((1..=8).contains(&mismatches), "{mismatches} mismatch reports for {dropped_mac} forged datagrams");
    assert!(dropped_mac > 15_000, "{dropped_mac} of {sent}");
}

#[tokio::test]
async fn an_authentic_heartbeat_from_another_members_address_is_dropped() {
    let port = free_port();
    let metrics = Arc::new(crate::metrics::AgentMetrics::new());
    let hub = Hub::new(metrics.clone());
    let (tx, mut rx) = mpsc::channel(64);
    let mut sp = spec("web", "n1", N1, ("n0", N0), port, 1);
    sp.paths[0].peers.push(("n2".to_owned(), STRANGER));
    let _ep = Endpoint::attach(&hub, sp, metrics.pair("web"), tx).await.expect("attach");
    let m = Member { hub, metrics, endpoints: Vec::new() };
    // n2 (a member: it holds the key) speaks as n0.
    let hb = Heartbeat {
        major: wire::PROTOCOL_MAJOR,
        minor: wire::PROTOCOL_MINOR,
        key_id: 1,
        seq: 1,
        timestamp_ms: unix_ms(),
        pair: "web".to_owned(),
        sender: "n0".to_owned(),
        body: to_wire(&advert("n0", 99)),
        session: Some(Session { id: 42, echo: 0 }),
        echoes: Vec::new(),
    };
    let s = std::net::UdpSocket::bind((STRANGER, 0)).expect("bind");
    s.send_to(&wire::encode(&hb, &keys(1).current), SocketAddr::new(N1, port)).expect("send");
    assert!(silent(&mut rx).await, "n2 was taken for n0");
    assert_eq!(dropped(&m, "wrong_address"), 1, "{}", m.metrics.encode());
}

#[tokio::test]
async fn replays_of_another_major_version_are_refused() {
    let port = free_port();
    let mut n1 = member("n1", N1, ("n0", N0), port, &[("web", 1)]).await;
    let hb = Heartbeat {
        major: wire::PROTOCOL_MAJOR + 1,
        minor: 0,
        key_id: 1,
        seq: 7,
        timestamp_ms: unix_ms(),
        pair: "web".to_owned(),
        sender: "n0".to_owned(),
        body: to_wire(&advert("n0", 99)),
        session: None,
        echoes: Vec::new(),
    };
    let d = wire::encode(&hb, &keys(1).current);
    let s = std::net::UdpSocket::bind((N0, 0)).expect("bind");
    for _ in 0..3 {
        s.send_to(&d, SocketAddr::new(N1, port)).expect("send");
    }
    match next(&mut n1.endpoints[0].1).await {
        Some(Received::Advert { advert, .. }) => assert_eq!(advert.protocol_major, u16::from(wire::PROTOCOL_MAJOR) + 1),
        other => panic!("the first copy shows a member of another version, got {other:?}"),
    }
    assert!(silent(&mut n1.endpoints[0].1).await, "a replayed copy was taken for a live member");
    assert_eq!(dropped(&n1, "replayed"), 2, "{}", n1.metrics.encode());
}

/// The count and sum of a pair's round-trip histogram on `path` (0, 0 when absent).
fn rtt(m: &Member, pair: &str, path: &str) -> (u64, f64) {
    let text = m.metrics.encode();
    let value = |suffix: &str| {
        let prefix = format!("havip_agent_heartbeat_rtt_seconds_{suffix}{{pair=\"{pair}\",path=\"{path}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|v| v.parse::<f64>().ok())
    };
    (value("count").unwrap_or(0.0) as u64, value("sum").unwrap_or(0.0))
}

#[tokio::test]
async fn each_path_measures_its_round_trip_from_the_peers_echoes_less_the_time_the_peer_held_it() {
    let port = free_port();
    let mut n0 = member("n0", N0, ("n1", N1), port, &[("web", 1)]).await;
    let mut n1 = member("n1", N1, ("n0", N0), port, &[("web", 1)]).await;
    // n0 speaks, n1 hears it and answers (echoing it), n0 hears the echo: a round trip per
    // round for n0; n1's answers are echoed by n0's next round.
    for round in 0..5u64 {
        n0.endpoints[0].0.send(&advert("n0", 1 + round));
        assert!(epoch_of(next(&mut n1.endpoints[0].1).await).is_some());
        n1.endpoints[0].0.send(&advert("n1", 1 + round));
        assert!(epoch_of(next(&mut n0.endpoints[0].1).await).is_some());
    }
    let (count, sum) = rtt(&n0, "web", "data");
    assert_eq!(count, 5, "one round trip per echo: {}", n0.metrics.encode());
    assert_eq!(rtt(&n1, "web", "data").0, 4, "n0's first heartbeat had nothing of n1's to echo");
    // An echo repeated while n1 hears nothing newer of n0 counts once.
    for round in 0..2u64 {
        n1.endpoints[0].0.send(&advert("n1", 10 + round));
        assert!(epoch_of(next(&mut n0.endpoints[0].1).await).is_some());
    }
    assert_eq!(rtt(&n0, "web", "data").0, 5, "a repeated echo is no new round trip");
    // n1 holds n0's heartbeat for 400 ms before it answers: the round trip leaves that out.
    n0.endpoints[0].0.send(&advert("n0", 20));
    assert!(epoch_of(next(&mut n1.endpoints[0].1).await).is_some());
    tokio::time::sleep(Duration::from_millis(400)).await;
    n1.endpoints[0].0.send(&advert("n1", 20));
    assert!(epoch_of(next(&mut n0.endpoints[0].1).await).is_some());
    let (count6, sum6) = rtt(&n0, "web", "data");
    assert_eq!(count6, 6);
    let last = sum6 - sum;
    assert!(last < 0.2, "the 400 ms n1 held the heartbeat are not part of the round trip: {last} s");
}

#[test]
fn an_echo_counts_only_on_the_path_it_names_and_for_a_heartbeat_we_sent() {
    use super::echo_rtt;
    use std::collections::VecDeque;
    let t0 = Instant::now();
    let sent: VecDeque<(u64, Instant)> = [(7, t0), (9, t0 + Duration::from_millis(10))].into_iter().collect();
    let echo = |to: IpAddr, seq: u64, held_us: u32| vec![wire::PathEcho { to, seq, held_us }];
    let now = t0 + Duration::from_millis(30);
    assert_eq!(echo_rtt(&sent, &echo(N0, 9, 5_000), N0, None, now), Some((9, Duration::from_millis(15))));
    assert_eq!(echo_rtt(&sent, &echo(N1, 9, 5_000), N0, None, now), None, "another path's echo");
    assert_eq!(echo_rtt(&sent, &echo(N0, 8, 0), N0, None, now), None, "a sequence number we never sent");
    assert_eq!(echo_rtt(&sent, &echo(N0, 9, 0), N0, Some(9), now), None, "already counted");
    assert_eq!(echo_rtt(&sent, &echo(N0, 7, 40_000), N0, None, now), None, "held longer than the trip: no sample");
}

/// Heartbeat datagrams `m` sent of `kind` (`single`, `bundle`).
fn datagrams(m: &Member, kind: &str) -> u64 {
    metric_sum(m, "havip_agent_heartbeat_datagrams_sent_total", &format!("name=\"{kind}\""))
}

/// Every endpoint of `m` sends, in the same turn of the runtime.
fn round(m: &Member, node: &str, epoch: u64) {
    for (ep, _) in &m.endpoints {
        ep.send(&advert(node, epoch));
    }
}

/// The next message of every endpoint of `m`: its epoch (`None`: something else or nothing).
async fn epochs(m: &mut Member) -> Vec<Option<u64>> {
    let mut out = Vec::new();
    for (_, rx) in &mut m.endpoints {
        out.push(epoch_of(next(rx).await));
    }
    out
}

#[tokio::test]
async fn pairs_that_share_a_member_go_in_bundles_once_it_is_heard_to_read_them() {
    let port = free_port();
    let names: Vec<(String, u8)> = (0..12u8).map(|i| (format!("pair-{i}"), i + 1)).collect();
    let pairs: Vec<(&str, u8)> = names.iter().map(|(p, k)| (p.as_str(), *k)).collect();
    let mut n0 = member("n0", N0, ("n1", N1), port, &pairs).await;
    let mut n1 = member("n1", N1, ("n0", N0), port, &pairs).await;
    // n0 has heard nothing from n1 yet: one datagram per pair.
    round(&n0, "n0", 1);
    assert_eq!(epochs(&mut n1).await, vec![Some(1); 12]);
    assert_eq!((datagrams(&n0, "single"), datagrams(&n0, "bundle")), (12, 0));
    // n1's heartbeats (this release) tell n0 that it reads bundles.
    round(&n1, "n1", 1);
    assert_eq!(epochs(&mut n0).await, vec![Some(1); 12]);
    round(&n0, "n0", 2);
    assert_eq!(epochs(&mut n1).await, vec![Some(2); 12], "every pair hears its own heartbeat out of the bundles");
    let bundles = datagrams(&n0, "bundle");
    assert!((1..=2).contains(&bundles), "12 heartbeats in {bundles} bundles: {}", n0.metrics.encode());
    assert_eq!(datagrams(&n0, "single"), 12, "no single datagram once bundles are read");
    assert_eq!(dropped(&n1, "malformed") + dropped(&n1, "bad_magic"), 0);
}

#[tokio::test]
async fn in_a_bundle_a_key_mismatch_or_a_deleted_pair_changes_nothing_the_other_pairs_hear() {
    let port = free_port();
    let mut n0 = member("n0", N0, ("n1", N1), port, &[("a", 1), ("b", 2), ("c", 3), ("d", 4)]).await;
    // n1 holds another key for b.
    let mut n1 = member("n1", N1, ("n0", N0), port, &[("a", 1), ("b", 9), ("c", 3), ("d", 4)]).await;
    round(&n1, "n1", 1);
    let _ = epochs(&mut n0).await;
    // d is deleted on n1 (its endpoint gone); n0 still sends it.
    drop(n1.endpoints.pop());
    round(&n0, "n0", 7);
    let a = epoch_of(next(&mut n1.endpoints[0].1).await);
    let b = next(&mut n1.endpoints[1].1).await;
    let c = epoch_of(next(&mut n1.endpoints[2].1).await);
    assert_eq!((a, c), (Some(7), Some(7)), "a and c hear theirs");
    assert!(
        matches!(b, Some(Received::Rejected { reason: sm::RejectReason::KeyMismatch, .. })),
        "b's section fails b's verification alone: {b:?}"
    );
    assert_eq!(dropped(&n1, "unknown_pair"), 1, "d's section is counted, charged to no pair");
    assert!(datagrams(&n0, "bundle") >= 1);
    // A rotation in a (both sides accept the new key; n0 signs with it) changes nothing for c.
    let rotated = Keyring { current: wire::Key { id: 2, secret: vec![42; 32] }, previous: Some(keys(1).current) };
    n1.endpoints[0].0.set_keys(rotated.clone());
    n0.endpoints[0].0.set_keys(rotated);
    round(&n0, "n0", 8);
    assert_eq!(epoch_of(next(&mut n1.endpoints[0].1).await), Some(8));
    assert_eq!(epoch_of(next(&mut n1.endpoints[2].1).await), Some(8));
    // b's second section was refused too (counted; reported to the machine at most every
    // 250 ms), in the same bundles.
    assert_eq!(dropped(&n1, "bad_mac") + dropped(&n1, "unknown_key"), 2, "{}", n1.metrics.encode());
}

/// An authentic heartbeat of `pair` (key byte `key`) from `sender`, in protocol minor `minor`
/// and the sender's session `session` (echoing nothing: a session the receiver confirms
/// only when it knows no other of the sender).
fn authentic_in(pair: &str, sender: &str, key: u8, minor: u8, seq: u64, session: u64) -> Vec<u8> {
    let body = crate::heartbeat::to_wire(&advert(sender, 3));
    let ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    wire::encode(
        &wire::Heartbeat {
            major: wire::PROTOCOL_MAJOR,
            minor,
            key_id: 1,
            seq,
            timestamp_ms: ms,
            pair: pair.into(),
            sender: sender.into(),
            body,
            session: Some(wire::Session { id: session, echo: 0 }),
            echoes: Vec::new(),
        },
        &keys(key).current,
    )
}

#[tokio::test]
async fn a_member_of_an_earlier_release_gets_single_datagrams_and_bundles_once_it_reads_them() {
    const OLD: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
    let port = loop {
        let p = free_port();
        if std::net::UdpSocket::bind((OLD, p)).is_ok() {
            break p;
        }
    };
    let mut n0 = member("n0", N0, ("old", OLD), port, &[("x", 1), ("y", 2)]).await;
    let old = std::net::UdpSocket::bind((OLD, port)).expect("bind");
    old.set_nonblocking(true).expect("nonblocking");
    let old = tokio::net::UdpSocket::from_std(old).expect("socket");
    let mut seq = 1_000;
    // (minor, session, heard, bundles): an earlier release, then this one, then the earlier
    // one again in the same session; then a restart into the earlier release — a new
    // session that cannot echo n0's yet, refused until it has read n0's heartbeats, which
    // must therefore be single datagrams at once (else neither would ever hear the other).
    let (earlier, this) = (wire::BUNDLE_MINOR - 1, wire::BUNDLE_MINOR);
    for (minor, session, heard, expect_bundle) in [
        (earlier, 0x01d, true, false),
        (this, 0x01d, true, true),
        (earlier, 0x01d, true, false),
        (this, 0x01d, true, true),
        (earlier, 0x02e, false, false),
    ] {
        seq += 1;
        old.send_to(&authentic_in("x", "old", 1, minor, seq, session), (N0, port)).await.expect("send");
        if heard {
            assert_eq!(epoch_of(next(&mut n0.endpoints[0].1).await), Some(3), "x hears the old member");
        } else {
            // Nothing reaches the machine: wait until the endpoint has counted the refusal.
            let start = std::time::Instant::now();
            while dropped(&n0, "unconfirmed_session") < 1 {
                assert!(start.elapsed() < Duration::from_secs(2), "the new session's heartbeat was not refused");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        round(&n0, "n0", 5);
        // What the old member receives: (a bundle, sections) per datagram, both pairs' heartbeats.
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while got.iter().map(|(_, n)| n).sum::<usize>() < 2 {
            let n = tokio::time::timeout(Duration::from_secs(2), old.recv(&mut buf))
                .await
                .expect("n0's heartbeats within 2 s")
                .expect("recv");
            let d = &buf[..n];
            let sections =
                if wire::bundle::is_bundle(d) { wire::bundle::sections(d).expect("framing").len() } else { 1 };
            got.push((wire::bundle::is_bundle(d), sections));
        }
        assert_eq!(got.iter().any(|(b, _)| *b), expect_bundle, "minor {minor}: {got:?}");
    }
}
