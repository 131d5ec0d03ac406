//! A stalled active (SIGSTOP) whose peer took over meanwhile must not announce the VIP
//! when it resumes: it reads the peer's newer epoch first and gives the VIP up. What the
//! client's segment sees is captured with an ARP listener in the client namespace.
//! Root only; the test creates and removes its own namespaces.

use havip_e2e::agent::{AgentLab, PairOptions};
use havip_e2e::netns;
use havip_node_agent::announce::{ArpListener, ArpSeen};
use nix::sys::signal::Signal;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const UP: Duration = Duration::from_secs(15);

#[test]
fn a_resumed_old_active_does_not_announce_a_vip_its_peer_took_over() {
    if !netns::skip_unless_root(module_path!()) {
        return;
    }
    havip_e2e::init_tracing();
    let mut lab = AgentLab::start(PairOptions::default()).expect("lab");
    lab.wait_sole_holder(0, UP).expect("n0 holds the VIP");
    // Right after its election burst: the repeats of n0's announcement schedule (1.1 s
    // apart) are pending when it is stopped, and overdue when it resumes.
    lab.signal_agent(0, Signal::SIGSTOP);
    lab.listeners[0].stop();
    let vip = lab.topo.vip(0);
    // n1 hears nothing and probes the VIP down: it takes over (both kernels hold it now).
    netns::wait_until("n1 to take the VIP over", UP, Duration::from_millis(10), || {
        Ok(lab.holders(0).is_ok_and(|h| h.contains(&1)))
    })
    .expect("takeover");
    // Every ARP packet on the client's segment from now on.
    let seen: Arc<Mutex<Vec<(Instant, ArpSeen)>>> = Arc::default();
    let sink = seen.clone();
    let client = lab.topo.client();
    let ifname = client.ifname.clone();
    let listener = netns::in_netns(&client.ns, move || {
        ArpListener::start(&ifname, move |a| sink.lock().expect("lock").push((Instant::now(), a)))
    })
    .expect("netns")
    .expect("ARP listener in the client namespace");
    // Let the stall outlast the first overdue repeat.
    std::thread::sleep(Duration::from_millis(1500));
    let resumed = Instant::now();
    lab.signal_agent(0, Signal::SIGCONT);
    lab.wait_sole_holder(1, UP).expect("n0 gives the VIP up after reading n1's newer epoch");
    // Watch a while longer for late announcements of the old holder.
    std::thread::sleep(Duration::from_millis(1500));
    drop(listener);
    let n0_mac = lab.topo.node(0).data_mac.to_lowercase();
    let all = seen.lock().expect("lock").clone();
    let garps_of_n0: Vec<&(Instant, ArpSeen)> = all
        .iter()
        .filter(|(t, a)| {
            *t >= resumed
                && a.op == 1
                && a.sender_ip == vip
                && a.target_ip == vip
                && a.sender_mac.to_string().to_lowercase() == n0_mac
        })
        .collect();
    assert!(
        garps_of_n0.is_empty(),
        "the resumed old active announced the VIP it lost: {:?} (of {} ARP packets seen)\n{}",
        garps_of_n0.iter().map(|(t, _)| t.duration_since(resumed)).collect::<Vec<_>>(),
        all.len(),
        lab.diagnostics()
    );
    assert!(
        all.iter().any(|(_, a)| a.sender_ip == vip && a.sender_mac.to_string().to_lowercase() != n0_mac),
        "the capture works: n1's announcements of the VIP were seen ({} packets)",
        all.len()
    );
    assert!(!netns::has_address(&lab.topo.node(0).ns, "eth0", IpAddr::V4(vip)).expect("addresses"));
}
