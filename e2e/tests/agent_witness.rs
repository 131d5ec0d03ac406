//! Standalone pairs with a witness, on real kernels: two members, a client and a witness
//! (`havip-agent witness`, in the client's namespace) in network namespaces. Root only;
//! each test creates and removes its own namespaces.
//!
//! Without a witness a cut between the members alone — the client still reaches both, the
//! standby's probe of the VIP fails from its side — leaves both holding the VIP (the
//! documented limit; the control test below shows the cut is real). With one, the holder
//! renews its record at the witness and the standby, seeing the renewals, stays put.

use havip_e2e::agent::{AgentLab, PairOptions};
use std::time::{Duration, Instant};

const UP: Duration = Duration::from_secs(15);

fn lab(opts: PairOptions) -> Option<AgentLab> {
    havip_e2e::agent::lab_for_test(module_path!(), opts)
}

fn witnessed() -> PairOptions {
    PairOptions { witness: true, ..PairOptions::default() }
}

fn alarms(lab: &AgentLab, i: usize) -> Vec<String> {
    lab.status(i)
        .and_then(|s| s["alarms"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect()
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool, diag: impl Fn() -> String) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "{what} not within {timeout:?}\n{}", diag());
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

/// Samples the holders of the VIP every 100 ms for `d`: the most members seen holding it
/// at once.
fn most_holders(lab: &AgentLab, d: Duration) -> usize {
    let start = Instant::now();
    let mut most = 0;
    while start.elapsed() < d {
        most = most.max(lab.holders(0).map(|h| h.len()).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(100));
    }
    most
}

#[test]
fn a_cut_between_the_members_moves_nothing_with_a_witness() {
    let Some(lab) = lab(witnessed()) else { return };
    let prober = havip_e2e::agent::bring_up(&lab, UP);
    let fault = lab.topo.partition_peer(0, 1).expect("partition n0 from n1");
    let most = most_holders(&lab, Duration::from_secs(6));
    assert_eq!(most, 1, "a second holder during the cut:\n{}", lab.diagnostics());
    assert_eq!(lab.holders(0).expect("holders"), vec![0], "{}", lab.diagnostics());
    wait_for(
        "n1 raises PeerPartition",
        Duration::from_secs(5),
        || alarms(&lab, 1).contains(&"PeerPartition".to_owned()),
        || lab.diagnostics(),
    );
    let st = lab.status(1).expect("status");
    assert_eq!(st["blocker"].as_str(), Some("PeerAliveViaLease"), "{st}");
    assert!(
        lab.witness_metrics().contains("havip_witness_requests_total{op=\"renew\",outcome=\"done\"}"),
        "n0 renews at the witness"
    );
    lab.topo.heal(&fault).expect("heal");
    wait_for(
        "n1 clears PeerPartition",
        Duration::from_secs(5),
        || !alarms(&lab, 1).contains(&"PeerPartition".to_owned()),
        || lab.diagnostics(),
    );
    assert_eq!(lab.holders(0).expect("holders"), vec![0]);
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "{}", report.summary());
}

/// The control: the same cut without a witness leaves both holding (the limit the README
/// states) — so the test above does exercise the cut.
#[test]
fn without_a_witness_the_same_cut_leaves_both_members_holding() {
    let Some(lab) = lab(PairOptions::default()) else { return };
    let _prober = havip_e2e::agent::bring_up(&lab, UP);
    let fault = lab.topo.partition_peer(0, 1).expect("partition n0 from n1");
    wait_for(
        "both members hold the VIP",
        Duration::from_secs(10),
        || lab.holders(0).is_ok_and(|h| h.len() == 2),
        || lab.diagnostics(),
    );
    assert!(alarms(&lab, 0).contains(&"PeerSilent".to_owned()) || alarms(&lab, 1).contains(&"PeerSilent".to_owned()));
    lab.topo.heal(&fault).expect("heal");
    lab.wait_sole_holder(1, UP).expect("the newer epoch wins after the heal");
}

#[test]
fn a_dead_holder_is_taken_over_with_the_witness_and_nobody_takes_over_without_it() {
    let Some(mut lab) = lab(witnessed()) else { return };
    let prober = havip_e2e::agent::bring_up(&lab, UP);
    // n0 dies (both cables): n1 takes over with the witness's vote, in well under 2 s.
    lab.topo.cut_node(0).expect("cut n0");
    prober.wait_for_responder("n1", Duration::from_secs(5)).expect("n1 takes over");
    let report = prober.stop().expect("report");
    assert!(report.longest_gap_ms < 2000.0, "gap {} ms: {}", report.longest_gap_ms, report.summary());
    lab.topo.restore_node(0).expect("restore n0");
    lab.wait_sole_holder(1, UP).expect("n1 alone after n0 is back");

    // The witness goes away: both members say so; the holder keeps the VIP.
    lab.kill_witness();
    for i in 0..2 {
        wait_for(
            &format!("n{i} raises WitnessUnreachable"),
            Duration::from_secs(5),
            || alarms(&lab, i).contains(&"WitnessUnreachable".to_owned()),
            || lab.diagnostics(),
        );
    }
    assert_eq!(lab.holders(0).expect("holders"), vec![1]);
    // Now n1 dies too: without the witness's vote n0 does not take over.
    lab.topo.cut_node(1).expect("cut n1");
    std::thread::sleep(Duration::from_secs(3));
    assert!(!lab.holders(0).expect("holders").contains(&0), "n0 took the VIP without a vote:\n{}", lab.diagnostics());
    assert_eq!(lab.status(0).expect("status")["blocker"].as_str(), Some("WitnessUnreachable"));
    // The witness is back (its record survived the restart): n0 takes over.
    lab.start_witness().expect("witness restarts");
    let took = wait_for(
        "n0 takes over once the witness answers",
        Duration::from_secs(10),
        || lab.holders(0).is_ok_and(|h| h.contains(&0)),
        || lab.diagnostics(),
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let st = lab.status(0).expect("status");
    assert!(st["epoch"].as_u64().unwrap_or(0) >= 3, "a new epoch above n1's: {st}");
}
