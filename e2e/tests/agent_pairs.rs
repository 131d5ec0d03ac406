//! Several pairs on the same nodes, in standalone mode on real kernels: one agent process
//! per node serves every pair on one heartbeat port (the datagrams are demultiplexed by
//! pair name), a second process on that port is refused, and a member whose clock stepped
//! back across a restart is heard again at once. Root only; each test creates and removes
//! its own namespaces.

use havip_e2e::agent::{AgentLab, HEARTBEAT_PORT, PairOptions};
use havip_e2e::netns;
use havip_e2e::traffic::Prober;
use std::time::{Duration, Instant};

const UP: Duration = Duration::from_secs(20);

fn lab(opts: PairOptions) -> Option<AgentLab> {
    if !netns::skip_unless_root(module_path!()) {
        return None;
    }
    havip_e2e::init_tracing();
    Some(AgentLab::start(opts).expect("agent lab starts"))
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool, diag: impl Fn() -> String) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}\n{}", diag());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Member `i` hears every peer of pair `k` on both paths.
fn hears_all(lab: &AgentLab, i: usize, k: usize) -> bool {
    let Some(st) = lab.pair_status(i, k) else { return false };
    let peers = st["peers"].as_array().cloned().unwrap_or_default();
    !peers.is_empty()
        && peers.iter().all(|p| {
            let on: Vec<&str> =
                p["heardOn"].as_array().map(|a| a.iter().filter_map(|x| x.as_str()).collect()).unwrap_or_default();
            on.contains(&"data") && on.contains(&"mgmt")
        })
}

fn diagnostics(lab: &AgentLab, pairs: usize) -> String {
    let mut out = String::new();
    for k in 0..pairs {
        for i in 0..2 {
            out.push_str(&format!("--- pair {k} n{i}: {:?}\n", lab.pair_status(i, k)));
        }
    }
    out.push_str(&lab.logs_tail(40));
    out
}

#[test]
fn two_pairs_on_the_same_nodes_and_port_hear_each_other_and_move_together() {
    let Some(mut lab) = lab(PairOptions { pairs: 2, ..PairOptions::default() }) else { return };
    let diag = |lab: &AgentLab| diagnostics(lab, 2);
    for k in 0..2 {
        wait_until(
            &format!("n0 to hold pair {k}'s VIP alone"),
            UP,
            || lab.pair_holders(k).ok() == Some(vec![0]),
            || diag(&lab),
        );
        for i in 0..2 {
            wait_until(
                &format!("n{i} to hear its peer of pair {k} on every path"),
                UP,
                || hears_all(&lab, i, k),
                || diag(&lab),
            );
        }
    }
    // A datagram for a pair the receiving agent has not attached yet (the first
    // milliseconds after a start) is counted as unknown_pair; from then on none is.
    let unknown_at_start: Vec<f64> =
        (0..2).map(|i| lab.metric_sum(i, "havip_agent_heartbeats_dropped", &["unknown_pair"])).collect();
    for i in 0..2 {
        for reason in ["bad_mac", "unknown_key"] {
            let n = lab.metric_sum(i, "havip_agent_heartbeats_dropped", &[reason]);
            assert_eq!(n, 0.0, "n{i}: {reason} drops: no pair hears another pair's heartbeats\n{}", lab.metrics(i));
        }
        for k in 0..2 {
            let alarms = lab.pair_status(i, k).map(|s| s["alarms"].clone());
            assert_eq!(alarms, Some(serde_json::json!([])), "n{i} pair {k}: no KeyMismatch or other alarm");
        }
    }

    // The service of pair 1 on the active blips for 1.5 s: the standby hears the active's
    // heartbeats, so nothing moves (this was a lasting split brain when pairs shared a
    // port through SO_REUSEPORT and one of them heard nothing).
    let prober = Prober::on_client(&lab.topo, lab.pair_target(1)).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("client reaches pair 1 on n0");
    lab.pair_listeners[0][0].stop();
    let blip = Instant::now();
    while blip.elapsed() < Duration::from_millis(1500) {
        for k in 0..2 {
            assert_eq!(
                lab.pair_holders(k).expect("holders"),
                vec![0],
                "pair {k} stays on n0 during the blip\n{}",
                diag(&lab)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    lab.pair_listeners[0][0].start_again().expect("listener back");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("pair 1 answers on n0 again");
    for k in 0..2 {
        assert_eq!(lab.pair_holders(k).expect("holders"), vec![0], "pair {k} never moved\n{}", diag(&lab));
        assert_eq!(
            lab.pair_status(1, k).and_then(|s| s["role"].as_str().map(str::to_owned)).as_deref(),
            Some("Standby")
        );
    }
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "{}", report.summary());
    for (i, before) in unknown_at_start.iter().enumerate() {
        let now = lab.metric_sum(i, "havip_agent_heartbeats_dropped", &["unknown_pair"]);
        assert_eq!(now, *before, "n{i}: no unknown_pair drop once both pairs run\n{}", lab.metrics(i));
        let received = lab.metric_sum(i, "havip_agent_heartbeats_received", &["pair=\"lab1\""]);
        assert!(received > 20.0, "n{i} received pair 1's heartbeats: {received}");
    }

    // The active's node is cut: both pairs move to n1, exactly one holder each on the
    // reachable side, and after the heal.
    lab.topo.cut_node(0).expect("cut n0");
    for k in 0..2 {
        wait_until(
            &format!("n1 to take pair {k}"),
            UP,
            || lab.pair_holders(k).is_ok_and(|h| h.contains(&1)),
            || diag(&lab),
        );
    }
    lab.topo.restore_node(0).expect("restore");
    for k in 0..2 {
        wait_until(
            &format!("pair {k} to have exactly one holder (n1)"),
            UP,
            || lab.pair_holders(k).ok() == Some(vec![1]),
            || diag(&lab),
        );
    }
    lab.stop_agent(0);
    lab.stop_agent(1);
}

#[test]
fn a_second_agent_process_on_the_same_heartbeat_port_is_refused() {
    let Some(lab) = lab(PairOptions { pairs: 2, ..PairOptions::default() }) else { return };
    wait_until("n0 to hold pair 0", UP, || lab.pair_holders(0).ok() == Some(vec![0]), || diagnostics(&lab, 2));
    // An operator starts another pair in a process of its own on n0, on the same port:
    // it must not start (two processes on one port would split the peers' datagrams
    // between them).
    let own = std::fs::read_to_string(&lab.config_files(0)[1]).expect("pair file");
    let other = own
        .replace("pair: lab1", "pair: other")
        .replace("admin-0-1.sock", "admin-other.sock")
        .replace("metricsAddress: 127.0.0.1:9797", "metricsAddress: 127.0.0.1:9798");
    assert_ne!(own, other);
    let file = lab.topo.dir().join("other.yaml");
    std::fs::write(&file, other).expect("write");
    let files = vec![file];
    let mut intruder = lab.spawn_agent(0, "intruder", &files, &[]).expect("spawn");
    let start = Instant::now();
    while intruder.is_running() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the second agent keeps running:\n{}",
            intruder.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = intruder.log_tail(20);
    let addr = format!("{}:{HEARTBEAT_PORT}", lab.topo.node(0).ip(havip_e2e::netns::Link::Data));
    assert!(log.contains("in use") && log.contains(&addr), "the error names the port and address:\n{log}");
    assert!(log.contains("--config"), "the error names the fix:\n{log}");
    // The running agent is unaffected: both pairs still heard.
    for k in 0..2 {
        assert!(hears_all(&lab, 0, k) && hears_all(&lab, 1, k), "pair {k}\n{}", diagnostics(&lab, 2));
    }
}

/// libfaketime, to run an agent with its wall clock shifted (the monotonic clock is left
/// alone, as a stepped NTP clock would leave it).
fn faketime(offset: &str) -> Vec<(String, String)> {
    let lib = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libfaketime is installed (Debian package faketime; .ci/run installs it)");
    vec![
        ("LD_PRELOAD".to_owned(), lib.to_owned()),
        ("FAKETIME".to_owned(), offset.to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
        ("FAKETIME_NO_CACHE".to_owned(), "1".to_owned()),
    ]
}

#[test]
fn a_member_restarted_with_its_clock_stepped_back_is_heard_at_once() {
    let Some(mut lab) = lab(PairOptions::default()) else { return };
    let diag = |lab: &AgentLab| diagnostics(lab, 1);
    // Each new incarnation of n1 is in its Init listen for a second: n0 must hear *that*,
    // not a stale view of the previous incarnation.
    let hears_new = |lab: &AgentLab| {
        hears_all(lab, 0, 0)
            && lab
                .pair_status(0, 0)
                .is_some_and(|s| s["peers"].as_array().is_some_and(|p| p.iter().any(|p| p["role"] == "Init")))
    };
    let standby = |lab: &AgentLab| lab.pair_status(1, 0).is_some_and(|s| s["role"] == "Standby");
    wait_until("n0 to hold the VIP", UP, || lab.pair_holders(0).ok() == Some(vec![0]), || diag(&lab));
    wait_until("n1 to be a standby", UP, || standby(&lab), || diag(&lab));
    // n1 runs with its clock 30 s ahead …
    lab.stop_agent(1);
    lab.start_agent_with_env(1, &faketime("+30s")).expect("start n1 ahead");
    wait_until("n0 to hear n1 (30 s ahead) in its Init listen", UP, || hears_new(&lab), || diag(&lab));
    wait_until("n1 (30 s ahead) to be a standby", UP, || standby(&lab), || diag(&lab));
    // … then restarts on the true clock: its sequence numbers are now far below what n0
    // saw. n0 must hear it again at once (not drop it as a replay forever).
    lab.stop_agent(1);
    let restarted = Instant::now();
    lab.start_agent(1).expect("start n1 on the true clock");
    wait_until(
        "n0 to hear the restarted n1 (in its Init listen)",
        Duration::from_secs(5),
        || hears_new(&lab),
        || diag(&lab),
    );
    let heard_after = restarted.elapsed();
    wait_until("n1 to be a standby again", UP, || standby(&lab), || diag(&lab));
    let st = lab.pair_status(0, 0).expect("status");
    assert!(!st["alarms"].as_array().is_some_and(|a| a.iter().any(|x| x == "HeartbeatReplay")), "{st}");
    // A planned failover needs n1 heard: it succeeds.
    let (ok, out) = lab.admin(0, &["failover"]);
    assert!(ok, "planned failover to the restarted member: {out}\n{}", diag(&lab));
    wait_until("n1 to hold the VIP alone", UP, || lab.pair_holders(0).ok() == Some(vec![1]), || diag(&lab));
    eprintln!("restarted member heard again {heard_after:?} after its start");
}

#[test]
fn restarting_the_agent_of_several_pairs_keeps_every_pairs_vip() {
    let Some(mut lab) = lab(PairOptions { pairs: 2, ..PairOptions::default() }) else { return };
    let diag = |lab: &AgentLab| diagnostics(lab, 2);
    for k in 0..2 {
        wait_until(
            &format!("n0 to hold pair {k}'s VIP"),
            UP,
            || lab.pair_holders(k).ok() == Some(vec![0]),
            || diag(&lab),
        );
        wait_until(&format!("n1 to hear pair {k}"), UP, || hears_all(&lab, 1, k), || diag(&lab));
    }
    let probers: Vec<Prober> = (0..2)
        .map(|k| {
            let p = Prober::on_client(&lab.topo, lab.pair_target(k)).expect("prober");
            p.wait_for_responder("n0", Duration::from_secs(5)).expect("client reaches n0");
            p
        })
        .collect();
    // A rolling restart of n0's agent: both pairs' VIPs are in one subnet on one
    // interface; neither pair may take the other's VIP for a stale one of its own.
    lab.stop_agent(0);
    lab.start_agent(0).expect("restart n0");
    for k in 0..2 {
        wait_until(
            &format!("n0 to adopt pair {k}"),
            UP,
            || lab.pair_status(0, k).is_some_and(|s| s["role"] == "Active"),
            || diag(&lab),
        );
        assert_eq!(lab.pair_holders(k).expect("holders"), vec![0], "pair {k}\n{}", diag(&lab));
    }
    for (k, p) in probers.into_iter().enumerate() {
        let report = p.stop().expect("report");
        assert_eq!(report.failed, 0, "pair {k}: no failed connect across the restart: {}", report.summary());
        assert_eq!(report.responder_sequence(), vec!["n0"], "pair {k}: {}", report.summary());
    }
}
