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
    if !netns::skip_unless_root(module_path!()) {
        return None;
    }
    havip_e2e::init_tracing();
    Some(AgentLab::start(opts).expect("agent lab starts"))
}

/// Waits for n0 (priority 200) to hold the VIP and the client to reach it.
fn bring_up(lab: &AgentLab) -> Prober {
    lab.wait_sole_holder(0, UP).expect("the higher priority member holds the VIP");
    let prober = Prober::on_client(&lab.topo, lab.target()).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("client reaches n0 through the VIP");
    prober
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
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "{}", report.summary());
}
