//! The demultiplexer on loopback: several pairs on one socket, unknown pairs, forged
//! and truncated datagrams, a restarted peer, and the exclusive bind.

use super::*;
use havip_crds::wire::Key;
use std::net::Ipv4Addr;

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

fn dropped(m: &Member, reason: &str) -> u64 {
    m.metrics
        .encode()
        .lines()
        .filter(|l| {
            l.starts_with("havip_agent_heartbeats_dropped_total") && l.contains(&format!("reason=\"{reason}\""))
        })
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
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
