//! The agent's layer-2 port of an interface on a real kernel: one per interface for every
//! pair ([`L2Port::shared`]), and one request for the same question asked by many pairs at
//! once ([`L2Port::who_has`]). A fresh network namespace per test (unshare on a dedicated
//! thread); needs root (CAP_NET_ADMIN, CAP_NET_RAW) — without it the test says SKIPPED.

use havip_node_agent::announce::ArpListener;
use havip_node_agent::probes::L2Port;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn ip(args: &[&str]) {
    let ok = std::process::Command::new("ip").args(args).status().expect("ip").success();
    assert!(ok, "ip {args:?}");
}

/// Runs `f` in a new network namespace with a veth pair: `hv0` (10.9.0.1/24) here, `hv1`
/// (10.9.0.2/24) in a namespace of its own (`ip netns`, removed afterwards), whose kernel
/// answers ARP for 10.9.0.2.
fn in_netns<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let peer = format!("hvl2-{}", std::process::id());
    let peer2 = peer.clone();
    let r = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        ip(&["netns", "add", &peer2]);
        ip(&["link", "add", "hv0", "type", "veth", "peer", "name", "hv1"]);
        ip(&["link", "set", "hv1", "netns", &peer2]);
        ip(&["addr", "add", "10.9.0.1/24", "dev", "hv0"]);
        ip(&["-n", &peer2, "addr", "add", "10.9.0.2/24", "dev", "hv1"]);
        for dev in ["lo", "hv0"] {
            ip(&["link", "set", dev, "up"]);
        }
        ip(&["-n", &peer2, "link", "set", "hv1", "up"]);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        rt.block_on(f());
    })
    .join();
    ip(&["netns", "del", &peer]);
    r.expect("test thread");
}

#[test]
fn pairs_share_one_port_per_interface_and_one_request_per_question() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to create network namespaces and packet sockets");
        return;
    }
    in_netns(|| async {
        let a = L2Port::shared("hv0", false).expect("port");
        let b = L2Port::shared("hv0", false).expect("port");
        assert!(Arc::ptr_eq(&a, &b), "one port per interface");
        let v6 = L2Port::shared("hv0", true).expect("port");
        assert!(!Arc::ptr_eq(&a, &v6) && v6.has_ipv6(), "IPv6 needs a port that listens to it");
        assert!(Arc::ptr_eq(&L2Port::shared("hv0", false).expect("port"), &v6), "which serves IPv4 too from then on");
        // Requests for 10.9.0.2 as they reach hv1 (a listener opened in the peer's namespace).
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = requests.clone();
        let peer = std::fs::File::open(format!("/run/netns/hvl2-{}", std::process::id())).expect("peer netns");
        let _listener = std::thread::spawn(move || {
            nix::sched::setns(&peer, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            ArpListener::start("hv1", move |a| {
                if a.op == 1 && a.target_ip == std::net::Ipv4Addr::new(10, 9, 0, 2) {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .join()
        .expect("thread")
        .expect("listener");
        let (target, source): (IpAddr, IpAddr) = ("10.9.0.2".parse().expect("ip"), "10.9.0.1".parse().expect("ip"));
        // Ten pairs ask the same question at once: one request, ten answers.
        let asks = (0..10).map(|_| a.who_has_shared(target, source, Duration::from_millis(300)));
        let answers = futures::future::join_all(asks).await;
        assert!(answers.iter().all(|m| m.len() == 1), "every asker hears the answer: {answers:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(requests.load(Ordering::Relaxed), 1, "one request on the wire");
        // Asked again later: a new request.
        let again = a.who_has_shared(target, source, Duration::from_millis(300)).await;
        assert_eq!(again.len(), 1);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(requests.load(Ordering::Relaxed), 2, "a question asked later is sent again");
        // `who_has` always asks (a resolver needs every answer): two calls, two requests.
        let _ = a.who_has(target, source, Duration::from_millis(300)).await;
        let _ = a.who_has(target, source, Duration::from_millis(300)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(requests.load(Ordering::Relaxed), 4, "who_has asks every time");
        // Another question is never shared: 10.9.0.3 is nobody's.
        let none = a.who_has_shared("10.9.0.3".parse().expect("ip"), source, Duration::from_millis(100)).await;
        assert!(none.is_empty());
    });
}
