//! MetalLB in layer-2 mode in bench-failover's lab (`havip_e2e::metallb`): it comes up on
//! the local control plane, the client reaches the VIP through the announcing node, and a
//! cut (or a SIGTERM to that node's speaker) moves the address to the other node.
//!
//! Root only (network namespaces), and MetalLB and the control plane must be built
//! (`bash hack/testbin.sh metallb`, `bash hack/testbin.sh control-plane`): otherwise each
//! test prints a SKIPPED line and passes.

use havip_e2e::metallb::{MetalLbConfig, MetalLbLab, SERVICE_NAME};
use havip_e2e::netns::{self, Link};
use havip_e2e::testbin::{MetalLbBin, TestBin};
use havip_e2e::traffic::Prober;
use std::io::Write;
use std::time::Duration;

/// `true` when root and MetalLB and the control plane are built; otherwise prints why not.
fn can_run(test: &str) -> bool {
    if !netns::skip_unless_root(test) {
        return false;
    }
    let missing = match (MetalLbBin::find(), TestBin::find()) {
        (Err(e), _) => e.to_string(),
        (_, Err(e)) => format!("{e} (or `bash hack/testbin.sh control-plane`)"),
        (Ok(_), Ok(_)) => return true,
    };
    let line = format!("SKIPPED: {test}: {missing}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    false
}

/// The lab, the announcing node and the other one, with the client answered by the first.
fn lab_and_holder() -> (MetalLbLab, usize, usize) {
    let lab = MetalLbLab::start(MetalLbConfig::default()).expect("MetalLB lab");
    let holder = lab.announcer_index().expect("one announcer");
    let other = 1 - holder;
    assert_eq!(lab.ingress_ips().expect("read the Service"), vec![lab.vip().to_string()], "{SERVICE_NAME}'s ingress");
    (lab, holder, other)
}

#[test]
fn a_cut_moves_the_vip_to_the_other_node() {
    if !can_run("metallb_l2::a_cut_moves_the_vip_to_the_other_node") {
        return;
    }
    havip_e2e::init_tracing();
    let (lab, holder, other) = lab_and_holder();
    let (old, new) = (lab.topo.node(holder).name.clone(), lab.topo.node(other).name.clone());
    let prober = Prober::on_client(&lab.topo, lab.target()).expect("prober");
    prober.wait_for_responder(&old, Duration::from_secs(5)).expect("the announcing node answers through the VIP");
    lab.topo.cut_cable(holder, Link::Mgmt).expect("cut mgmt");
    lab.topo.cut_cable(holder, Link::Data).expect("cut data");
    if let Err(e) = prober.wait_for_responder(&new, Duration::from_secs(30)) {
        panic!("{new} never answered after {old}'s cut: {e}\n{}", lab.logs_tail(40));
    }
    // MetalLB says so too, and the client's ARP entry names the new node.
    lab.wait_announced_by(other, Duration::from_secs(10)).expect("ServiceL2Status of the new node");
    lab.wait_client_arp(other, Duration::from_secs(10)).expect("client ARP entry");
    prober.wait_until_ok(prober.ok_count() + 20, Duration::from_secs(5)).expect("steady after the move");
    let report = prober.stop().expect("report");
    eprintln!("{}", report.summary());
    assert_eq!(report.responder_sequence(), vec![old.as_str(), new.as_str()], "one move, no flapping");
    // memberlist's failure detection takes seconds (MetalLB documents "a few seconds",
    // more than 10 s being a bug); the client saw no answer for that long.
    assert!(report.longest_gap_ms < 15_000.0, "gap {} ms", report.longest_gap_ms);
}

#[test]
fn a_stopped_speaker_hands_the_vip_over() {
    if !can_run("metallb_l2::a_stopped_speaker_hands_the_vip_over") {
        return;
    }
    havip_e2e::init_tracing();
    let (mut lab, holder, other) = lab_and_holder();
    let (old, new) = (lab.topo.node(holder).name.clone(), lab.topo.node(other).name.clone());
    let prober = Prober::on_client(&lab.topo, lab.target()).expect("prober");
    prober.wait_for_responder(&old, Duration::from_secs(5)).expect("the announcing node answers through the VIP");
    lab.terminate_speaker(holder).expect("SIGTERM");
    if let Err(e) = prober.wait_for_responder(&new, Duration::from_secs(30)) {
        panic!("{new} never answered after {old}'s speaker stopped: {e}\n{}", lab.logs_tail(40));
    }
    assert!(lab.wait_speaker_exit(holder, Duration::from_secs(30)), "the speaker exits on SIGTERM");
    lab.wait_client_arp(other, Duration::from_secs(10)).expect("client ARP entry");
    let report = prober.stop().expect("report");
    eprintln!("{}", report.summary());
    assert_eq!(report.responder_sequence(), vec![old.as_str(), new.as_str()], "one move, no flapping");
}
