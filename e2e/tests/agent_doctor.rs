//! `havip-agent doctor` on the standalone lab (two members, a client; see
//! `agent_scenarios.rs`): a healthy node reports nothing, and each check provoked on n0 —
//! a heartbeat path blocked one way, `arp_ignore`, strict reverse-path filtering with the
//! route back elsewhere, a heartbeat interface's MTU too small, the peer's clock 30 s
//! ahead, a capability dropped — is found with its fix, and gone once the cause is. Root only; the test creates and removes its own namespaces.

use havip_e2e::agent::{AgentLab, HEARTBEAT_PORT, PairOptions};
use havip_e2e::netns::{self, Link};
use std::time::Duration;

const UP: Duration = Duration::from_secs(15);

fn lab(opts: PairOptions) -> Option<AgentLab> {
    havip_e2e::agent::lab_for_test(module_path!(), opts)
}

/// Runs the doctor on n0 until its answer satisfies `want` (findings come from the
/// running agents' view, which takes a heartbeat timeout to change), or fails with the
/// last answer.
fn wait_doctor(lab: &AgentLab, what: &str, wrap: &[&str], want: impl Fn(Option<i32>, &str) -> bool) -> String {
    let mut last = (None, String::new());
    let found = netns::wait_until(what, Duration::from_secs(10), Duration::from_millis(200), || {
        last = lab.doctor(0, wrap);
        Ok(want(last.0, &last.1))
    });
    if let Err(e) = found {
        panic!("{e}: exit {:?}\n{}\n{}", last.0, last.1, lab.diagnostics());
    }
    last.1
}

fn healthy(lab: &AgentLab) {
    wait_doctor(lab, "no findings on n0", &[], |code, out| code == Some(0) && out.contains("no findings"));
}

fn found(lab: &AgentLab, what: &str, needle: &str) -> String {
    wait_doctor(lab, what, &[], |code, out| code == Some(1) && out.contains(needle) && out.contains("fix: "))
}

fn sh(ns: &str, program: &str, args: &[&str]) {
    netns::exec(ns, program, args).unwrap_or_else(|e| panic!("{program} {args:?}: {e}"));
}

#[test]
fn the_doctor_finds_each_provoked_fault_and_nothing_on_a_healthy_node() {
    let Some(mut lab) = lab(PairOptions::default()) else { return };
    let _prober = havip_e2e::agent::bring_up(&lab, UP);
    let n0 = lab.topo.node(0);
    let n1 = lab.topo.node(1);
    let (data, mgmt) = (n0.ifname(Link::Data).to_owned(), n0.ifname(Link::Mgmt).to_owned());
    healthy(&lab);

    // Heartbeats from n1 dropped on n0's management path (a firewall in between): n1 is
    // still heard on the data path.
    let port = HEARTBEAT_PORT.to_string();
    sh(&n0.ns, "nft", &["add", "table", "inet", "hvdoctor"]);
    sh(&n0.ns, "nft", &["add", "chain", "inet", "hvdoctor", "in", "{ type filter hook input priority -10 ; }"]);
    sh(&n0.ns, "nft", &["add", "rule", "inet", "hvdoctor", "in", "iifname", &mgmt, "udp", "dport", &port, "drop"]);
    found(&lab, "n1 silent on the management path", "HeartbeatPathSilent n1 on path mgmt");
    sh(&n0.ns, "nft", &["delete", "table", "inet", "hvdoctor"]);
    healthy(&lab);

    // arp_ignore=8: the kernel answers no ARP request on the VIP's interface.
    sh(&n0.ns, "sysctl", &["-qw", &format!("net.ipv4.conf.{data}.arp_ignore=8")]);
    found(&lab, "arp_ignore on the VIP's interface", &format!("ArpIgnoreHidesVip {data}"));
    sh(&n0.ns, "sysctl", &["-qw", &format!("net.ipv4.conf.{data}.arp_ignore=0")]);
    healthy(&lab);

    // Strict reverse-path filtering on the management interface, with n1's management
    // address routed back through the data interface.
    let back = format!("{}/32", n1.ip(Link::Mgmt));
    sh(&n0.ns, "sysctl", &["-qw", &format!("net.ipv4.conf.{mgmt}.rp_filter=1")]);
    healthy(&lab);
    sh(&n0.ns, "ip", &["route", "add", &back, "dev", &data]);
    let out = found(&lab, "strict rp_filter with an asymmetric route", &format!("RpFilterDropsHeartbeats {mgmt}"));
    assert!(out.contains(&format!("leaves by {data}")), "{out}");
    sh(&n0.ns, "ip", &["route", "del", &back, "dev", &data]);
    sh(&n0.ns, "sysctl", &["-qw", &format!("net.ipv4.conf.{mgmt}.rp_filter=0")]);
    healthy(&lab);

    // An MTU below the largest heartbeat on the wire on n0's management interface.
    sh(&n0.ns, "ip", &["link", "set", "dev", &mgmt, "mtu", "500"]);
    found(&lab, "a heartbeat path's MTU too small", &format!("HeartbeatMtuTooSmall {mgmt} (path mgmt)"));
    sh(&n0.ns, "ip", &["link", "set", "dev", &mgmt, "mtu", "1500"]);
    healthy(&lab);

    // n1's clock 30 s ahead (its agent under libfaketime): n0 reads it from the
    // timestamps of n1's heartbeats.
    let lib = havip_e2e::chaos::lab::libfaketime().expect("libfaketime (Debian's faketime; make prereqs)");
    lab.stop_agent(1);
    let env = [("LD_PRELOAD", lib), ("FAKETIME", "+30s"), ("FAKETIME_DONT_FAKE_MONOTONIC", "1")]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
    lab.start_agent_with_env(1, &env).expect("n1's agent with its clock ahead");
    let out = found(&lab, "n1's clock 30 s ahead", "ClockSkewed n1");
    assert!(out.contains("ahead of this node's"), "{out}");
    lab.stop_agent(1);
    lab.start_agent(1).expect("n1's agent on time again");
    healthy(&lab);

    // The agent's capabilities: CAP_NET_RAW dropped (as a restrictive pod policy would).
    wait_doctor(&lab, "CAP_NET_RAW missing", &["setpriv", "--bounding-set", "-net_raw", "--"], |code, out| {
        code == Some(1)
            && out.contains("MissingCapability CAP_NET_RAW")
            && !out.contains("MissingCapability CAP_NET_ADMIN")
    });
}
