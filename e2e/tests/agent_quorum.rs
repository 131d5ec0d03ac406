//! Quorum arbitration (the control-plane mode's), on real kernels: three standalone
//! members that vote (`quorum:` in the pair file — every member runs a voter, a takeover
//! needs a majority, a holder without one gives the VIPs up after the quorum lease), a
//! client, in network namespaces. Root only; each test creates and removes its own
//! namespaces.
//!
//! The claims tried here: a dead or cut-off holder is taken over by the majority; a holder
//! cut off from the other members — while the client still reaches it — gives the VIPs up
//! *before* the majority takes them (never two holders); a member on the minority side
//! never takes them; restarting every agent keeps the one holder and loses no connect.
//! Controls: the same partition without votes leaves two holders; a lone member keeps
//! serving without a quorum requirement.

use havip_e2e::agent::{AgentLab, PairOptions};
use std::time::{Duration, Instant};

const UP: Duration = Duration::from_secs(20);
const LEASE: &str = "400ms";

fn lab(opts: PairOptions) -> Option<AgentLab> {
    havip_e2e::agent::lab_for_test(module_path!(), opts)
}

fn voting() -> PairOptions {
    PairOptions { members: 3, quorum: Some(LEASE.to_owned()), ..PairOptions::default() }
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool, diag: impl Fn() -> String) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "{what} not within {timeout:?}\n{}", diag());
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// Samples VIP 0's holders every 10 ms for `d` (or until `stop` says so): the most
/// members seen holding it at once, and the holders at the end.
fn watch_holders(lab: &AgentLab, d: Duration, mut stop: impl FnMut(&[usize]) -> bool) -> (usize, Vec<usize>) {
    let start = Instant::now();
    let mut most = 0;
    let mut last = Vec::new();
    while start.elapsed() < d {
        last = lab.holders(0).unwrap_or_default();
        most = most.max(last.len());
        if stop(&last) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (most, last)
}

/// The last transition's reason in member `i`'s status.
fn last_reason(lab: &AgentLab, i: usize) -> Option<String> {
    lab.status(i)?.get("lastTransition")?.get("reason")?.as_str().map(str::to_owned)
}

/// Cuts member `i` off from every other member (frames from and to their MACs dropped on
/// both sides); the client and the gateway still reach everybody.
fn isolate(lab: &AgentLab, i: usize) -> Vec<havip_e2e::netns::Fault> {
    let mut faults = Vec::new();
    for j in (0..lab.topo.nodes().len()).filter(|&j| j != i) {
        faults.push(lab.topo.partition_peer(i, j).expect("partition"));
        faults.push(lab.topo.partition_peer(j, i).expect("partition"));
    }
    faults
}

#[test]
fn a_holder_cut_off_from_the_others_gives_the_vip_up_before_the_majority_takes_it() {
    let Some(lab) = lab(voting()) else { return };
    let prober = havip_e2e::agent::bring_up(&lab, UP);
    let cut = Instant::now();
    let _faults = isolate(&lab, 0);
    // Never two holders: n0 (one vote of three) gives the VIP up after its quorum lease,
    // and n1 and n2 grant n1's claim only once their grace for n0 has run out.
    let (most, last) = watch_holders(&lab, Duration::from_secs(8), |h| h == [1]);
    let moved = cut.elapsed();
    assert_eq!(most, 1, "two members held the VIP at once\n{}", lab.diagnostics());
    assert_eq!(last, vec![1], "the majority's best member holds it\n{}", lab.diagnostics());
    assert_eq!(last_reason(&lab, 0).as_deref(), Some("QuorumLost"), "{}", lab.diagnostics());
    prober.wait_for_responder("n1", Duration::from_secs(5)).expect("the client reaches n1");
    let report = prober.stop().expect("report");
    eprintln!("isolated holder: n1 holds {moved:?} after the cut; {}", report.summary());
    assert_eq!(report.responder_sequence(), vec!["n0", "n1"], "{}", report.summary());
    // n0 stays out while cut off.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lab.holders(0).expect("holders"), vec![1], "{}", lab.diagnostics());
}

/// The control: three members without votes, the same partition — n0 keeps serving the
/// client it still reaches while n1 takes over: two holders.
#[test]
fn without_votes_the_same_partition_leaves_two_holders() {
    let Some(lab) = lab(PairOptions { members: 3, ..PairOptions::default() }) else { return };
    let _prober = havip_e2e::agent::bring_up(&lab, UP);
    let _faults = isolate(&lab, 0);
    let (most, _) = watch_holders(&lab, Duration::from_secs(8), |h| h.len() == 2);
    assert_eq!(most, 2, "the partition is real: without votes both sides hold\n{}", lab.diagnostics());
}

#[test]
fn a_member_on_the_minority_side_never_takes_the_vip() {
    let Some(lab) = lab(voting()) else { return };
    let prober = havip_e2e::agent::bring_up(&lab, UP);
    // n2 hears nobody and its probe through the VIP fails (n0's frames are dropped): it
    // claims, and only its own voter answers.
    let _faults = isolate(&lab, 2);
    let (most, last) = watch_holders(&lab, Duration::from_secs(5), |_| false);
    assert_eq!((most, last), (1, vec![0]), "{}", lab.diagnostics());
    let st = lab.status(2).expect("n2's status");
    assert_eq!(st["role"].as_str(), Some("Standby"), "{st}");
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "{}", report.summary());
    assert_eq!(report.failed_connects(), 0, "{}", report.summary());
}

#[test]
fn a_holder_whose_cables_are_cut_is_taken_over_by_the_majority() {
    let Some(lab) = lab(voting()) else { return };
    let prober = havip_e2e::agent::bring_up(&lab, UP);
    lab.topo.cut_node(0).expect("cut n0");
    let took = prober.wait_for_responder("n1", Duration::from_secs(5)).expect("n1 takes over");
    // n0's agent runs on, alone: it gives the VIP up too.
    wait_for(
        "n0 to give the VIP up",
        Duration::from_secs(3),
        || lab.holders(0).is_ok_and(|h| h == [1]),
        || lab.diagnostics(),
    );
    let report = prober.stop().expect("report");
    eprintln!("cut holder: the client reached n1 after {took:?}; {}", report.summary());
    lab.topo.restore_node(0).expect("restore n0");
    // Back together: n1 keeps it (failback is manual), one holder.
    let (most, last) = watch_holders(&lab, Duration::from_secs(3), |_| false);
    assert_eq!((most, last), (1, vec![1]), "{}", lab.diagnostics());
}

#[test]
fn restarting_every_agent_keeps_the_one_holder_and_loses_no_connect() {
    let Some(mut lab) = lab(voting()) else { return };
    let prober = havip_e2e::agent::bring_up(&lab, UP);
    for i in [1, 2, 0] {
        lab.stop_agent(i);
    }
    // Everybody down at once (the VIP stays on n0's interface), then back.
    for i in [0, 1, 2] {
        lab.start_agent(i).expect("start");
    }
    wait_for(
        "every member to be back in its role",
        UP,
        || lab.role(0).as_deref() == Some("Active") && (1..3).all(|i| lab.role(i).as_deref() == Some("Standby")),
        || lab.diagnostics(),
    );
    let (most, last) = watch_holders(&lab, Duration::from_secs(2), |_| false);
    assert_eq!((most, last), (1, vec![0]), "{}", lab.diagnostics());
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "{}", report.summary());
    assert_eq!(report.failed_connects(), 0, "{}", report.summary());
}

/// The peers member `i`'s status lists.
fn peers_of(lab: &AgentLab, i: usize) -> Vec<String> {
    lab.status(i)
        .and_then(|s| {
            s["peers"].as_array().map(|a| a.iter().filter_map(|p| p["node"].as_str().map(str::to_owned)).collect())
        })
        .unwrap_or_default()
}

/// Waits until member `i`'s log says it applied a reload (the `n`-th one) or refused one.
fn wait_reload(lab: &AgentLab, i: usize, n: usize, what: &str) -> String {
    let log = lab.topo.dir().join(format!("agent-{i}.log"));
    let mut text = String::new();
    wait_for(
        &format!("n{i} to {what}"),
        Duration::from_secs(8),
        || {
            text = std::fs::read_to_string(&log).unwrap_or_default();
            text.matches("reloaded").count() + text.matches("reload refused").count() >= n
        },
        || lab.logs_tail(30),
    );
    text
}

/// A control plane grows from its first node to three, one member at a time, and shrinks
/// back to two and to one — each step a file rewritten on every member and applied without a restart
/// (SIGHUP, or the agent seeing the file change): the VIP never moves unless asked, no
/// connect fails, the epoch never goes back; a change of two members at once is refused.
#[test]
fn a_pair_grows_from_one_member_to_three_and_shrinks_without_a_restart() {
    use nix::sys::signal::Signal;
    let Some(mut lab) = lab(PairOptions {
        members: 3,
        quorum: Some(LEASE.to_owned()),
        start_alone: true,
        started: Some(vec![0]),
        file_members: Some(vec![0]),
        ..PairOptions::default()
    }) else {
        return;
    };
    // `kubeadm init` on the first node: it serves alone, its own majority.
    lab.wait_sole_holder(0, UP).unwrap_or_else(|e| panic!("n0 holds alone: {e}\n{}", lab.diagnostics()));
    let prober =
        havip_e2e::traffic::Prober::start(lab.client_ns(), havip_e2e::traffic::ProberConfig::new(lab.target()))
            .expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("the client reaches n0");
    let epoch0 = lab.epoch(0).expect("epoch");

    // n1 joins: its agent starts with the two-member file first, then n0 is told (SIGHUP).
    lab.write_members(1, &[0, 1]).expect("n1's file");
    lab.start_agent(1).expect("n1 starts");
    wait_for("n1 to stand by", UP, || lab.role(1).as_deref() == Some("Standby"), || lab.diagnostics());
    lab.write_members(0, &[0, 1]).expect("n0's file");
    lab.signal_agent(0, Signal::SIGHUP);
    wait_reload(&lab, 0, 1, "apply the two-member file");
    wait_for("n0 to know n1", Duration::from_secs(5), || peers_of(&lab, 0) == ["n1"], || lab.diagnostics());

    // n2 joins: n0 sees its file change by itself (no signal), n1 gets SIGHUP.
    lab.write_members(2, &[0, 1, 2]).expect("n2's file");
    lab.start_agent(2).expect("n2 starts");
    wait_for("n2 to stand by", UP, || lab.role(2).as_deref() == Some("Standby"), || lab.diagnostics());
    lab.write_members(0, &[0, 1, 2]).expect("n0's file");
    lab.write_members(1, &[0, 1, 2]).expect("n1's file");
    lab.signal_agent(1, Signal::SIGHUP);
    wait_reload(&lab, 0, 2, "see its file change and apply it");
    wait_reload(&lab, 1, 1, "apply the three-member file");
    wait_for(
        "every member to know the other two",
        Duration::from_secs(5),
        || (0..3).all(|i| peers_of(&lab, i).len() == 2),
        || lab.diagnostics(),
    );
    assert_eq!(lab.holders(0).expect("holders"), vec![0], "growing moved the VIP\n{}", lab.diagnostics());
    assert_eq!(lab.epoch(0), Some(epoch0), "growing changed the epoch");

    // Two members at once is refused (no majority of the old and the new set need share a
    // voter): n0 keeps its three members.
    lab.write_members(0, &[0]).expect("n0's file");
    lab.signal_agent(0, Signal::SIGHUP);
    let log = wait_reload(&lab, 0, 3, "refuse the two-member change");
    assert!(log.contains("the voters change by 2 members"), "{}", lab.logs_tail(20));
    assert_eq!(peers_of(&lab, 0).len(), 2, "the refused file was applied");
    lab.write_members(0, &[0, 1, 2]).expect("n0's file back");

    // The grown pair works: a planned move to n1 needs and gets the majority.
    lab.failover_when_ready(0, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    prober.wait_for_responder("n1", Duration::from_secs(5)).expect("the client reaches n1");
    let epoch1 = lab.epoch(1).expect("epoch");
    assert!(epoch1 > epoch0, "the move raised the epoch: {epoch0} → {epoch1}");

    // n2 leaves: the others drop it (one member), then its agent stops.
    for i in [0, 1] {
        lab.write_members(i, &[0, 1]).expect("file");
        lab.signal_agent(i, Signal::SIGHUP);
    }
    wait_for(
        "n0 and n1 to drop n2",
        Duration::from_secs(8),
        || peers_of(&lab, 0) == ["n1"] && peers_of(&lab, 1) == ["n0"],
        || lab.diagnostics(),
    );
    lab.stop_agent(2);
    std::thread::sleep(Duration::from_secs(2)); // an observation period: nothing may move
    assert_eq!(lab.holders(0).expect("holders"), vec![1], "shrinking moved the VIP\n{}", lab.diagnostics());
    assert!(lab.epoch(1).is_some_and(|e| e >= epoch1), "the epoch went back");

    // …and back to one: n0 leaves, the holder n1 serves alone, its own majority.
    lab.write_members(1, &[1]).expect("n1's file");
    lab.signal_agent(1, Signal::SIGHUP);
    wait_reload(&lab, 1, 3, "apply the one-member file");
    wait_for(
        "n1 to know no peer",
        Duration::from_secs(5),
        || lab.status(1).is_some() && peers_of(&lab, 1).is_empty(),
        || lab.diagnostics(),
    );
    lab.stop_agent(0);
    std::thread::sleep(Duration::from_secs(2)); // an observation period: nothing may move
    assert_eq!(lab.holders(0).expect("holders"), vec![1], "shrinking to one moved the VIP\n{}", lab.diagnostics());
    assert_eq!(lab.role(1).as_deref(), Some("Active"), "n1 holds alone\n{}", lab.diagnostics());
    assert!(lab.epoch(1).is_some_and(|e| e >= epoch1), "the epoch went back");
    let report = prober.stop().expect("report");
    eprintln!("grown 1 → 3, moved once on purpose, shrunk to 2 and to 1: {}", report.summary());
    assert_eq!(report.responder_sequence(), vec!["n0", "n1"], "{}", report.summary());
    assert_eq!(report.failed_connects(), 0, "{}", report.summary());
}
