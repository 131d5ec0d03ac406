//! The end-to-end scenarios, written once against [`Cluster`] and run by `make e2e`
//! on the local provider (`e2e/tests/e2e_pairs.rs`) and by the kind suite
//! (`kind-e2e run`) on a kind cluster. A scenario panics with a message (the pair's
//! status and the logs) when something is wrong.

pub mod kind;
pub mod kind_bgp;

use crate::harness::cluster::{Cluster, ClusterError, Result, SHARED_VIPS};
use havip_crds::{HAPair, MemberRole, OperationResult, Phase};
use std::time::{Duration, Instant};

/// The pair every scenario uses.
pub const PAIR: &str = "web";

/// A named scenario and how many nodes it needs.
pub struct Scenario<C> {
    /// Its name (the test's name).
    pub name: &'static str,
    /// Nodes it needs.
    pub nodes: usize,
    /// Runs it.
    pub run: fn(&mut C),
}

/// Every scenario, in the order the kind suite runs them.
pub fn all<C: Cluster>() -> Vec<Scenario<C>> {
    vec![
        Scenario { name: "pair_goes_live_within_5s_and_kubectl_shows_its_columns", nodes: 2, run: pair_goes_live },
        Scenario {
            name: "active_node_cut_fails_over_with_a_new_epoch_lease_and_events",
            nodes: 2,
            run: active_node_cut,
        },
        Scenario { name: "planned_failover_through_the_plugin_loses_no_connect", nodes: 2, run: planned_failover },
        Scenario { name: "forced_failover_through_the_plugin", nodes: 2, run: forced_failover },
        Scenario {
            name: "maintenance_on_the_active_hands_over_and_on_the_standby_takes_it_out",
            nodes: 2,
            run: maintenance,
        },
        Scenario {
            name: "automatic_failback_honours_its_recovery_window_and_quarantine",
            nodes: 2,
            run: automatic_failback,
        },
        Scenario { name: "operator_stopped_failover_still_works", nodes: 2, run: operator_stopped },
        Scenario {
            name: "api_server_unreachable_then_active_cut_still_takes_over_and_catches_up",
            nodes: 2,
            run: api_outage,
        },
        Scenario {
            name: "agent_restart_on_the_active_loses_no_connect_and_moves_nothing",
            nodes: 2,
            run: agent_restart,
        },
        Scenario { name: "a_bad_spec_edit_is_refused_or_conditioned_and_nothing_moves", nodes: 2, run: bad_spec_edit },
        Scenario { name: "key_rotation_through_the_plugin_misses_no_heartbeat", nodes: 2, run: key_rotation },
        Scenario {
            name: "member_replacement_keeps_the_vips_rotates_the_key_and_the_newcomer_joins_as_standby",
            nodes: 3,
            run: member_replacement,
        },
        Scenario {
            name: "a_floating_ip_on_an_address_in_use_is_refused_and_nothing_moves",
            nodes: 2,
            run: floating_ip_address_conflict,
        },
    ]
}

/// The scenarios with several pairs on shared nodes (each pair its own VIP and service
/// port; a service stopped; the agents' metrics read): `make e2e` and the kind suite run
/// them.
pub fn shared_nodes<C: Cluster>() -> Vec<Scenario<C>> {
    vec![
        Scenario {
            name: "two_pairs_on_the_same_two_nodes_and_port_stay_apart_and_move_together",
            nodes: 2,
            run: two_pairs_on_two_nodes,
        },
        Scenario {
            name: "three_pairs_on_three_nodes_two_sharing_only_one_node_all_leave_the_cut_node",
            nodes: 3,
            run: three_pairs_on_three_nodes,
        },
    ]
}

/// Brings a shared cluster back to a clean slate between scenarios: every node
/// connected, the API reachable, the operator running, no pair, no VIP anywhere.
pub fn reset<C: Cluster>(c: &mut C) -> Result<()> {
    for i in 0..c.nodes().len() {
        c.restore_node(i)?;
    }
    c.api_outage_end()?;
    c.start_operator()?;
    c.delete_pair(PAIR)?;
    c.delete_every_pair()?;
    let start = Instant::now();
    loop {
        let mut h = Vec::new();
        for vip in 0..SHARED_VIPS {
            h.extend(c.holders_of(vip)?);
        }
        if h.is_empty() {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err(ClusterError::VipStillHeld { nodes: h, waited: start.elapsed() });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn phase(p: &HAPair) -> Option<Phase> {
    p.status.as_ref().and_then(|s| s.phase)
}

fn active(p: &HAPair) -> Option<String> {
    p.status.as_ref().and_then(|s| s.active.clone())
}

fn node<C: Cluster>(c: &C, i: usize) -> String {
    c.nodes().get(i).cloned().unwrap_or_else(|| panic!("the cluster has no node {i}"))
}

fn member_role(p: &HAPair, node: &str) -> Option<MemberRole> {
    p.status.as_ref().and_then(|s| s.members.iter().find(|m| m.node == node).and_then(|m| m.role.clone()))
}

/// Applies the standard pair over `members` nodes (with `extra_spec` inserted before
/// `heartbeat:`) and waits until it is Live with node 0 active. Returns the time
/// from the apply to Live and the epoch it went Live under: 1 for a name the nodes never
/// saw, higher when an agent still had a state file of an earlier pair of that name
/// (epochs never go back on a node), so the scenarios count from it.
pub fn live_pair<C: Cluster>(c: &mut C, members: usize, extra_spec: &str) -> (Duration, i64) {
    let mut yaml = c.pair_yaml(PAIR, members);
    if !extra_spec.is_empty() {
        yaml = yaml.replacen("  heartbeat:\n", &format!("{extra_spec}  heartbeat:\n"), 1);
    }
    let n0 = node(c, 0);
    let start = Instant::now();
    c.apply_yaml(&yaml).expect("apply the pair");
    let p = c
        .wait_pair(PAIR, Duration::from_secs(10), &format!("phase Live with {n0} active"), |p| {
            phase(p) == Some(Phase::Live)
                && active(p).as_deref() == Some(n0.as_str())
                && p.status.as_ref().and_then(|s| s.epoch).is_some()
        })
        .expect("pair Live");
    (start.elapsed(), p.status.and_then(|s| s.epoch).unwrap_or_default())
}

fn wait_phase<C: Cluster>(c: &C, want: Phase, active_node: &str, timeout: Duration) -> HAPair {
    c.wait_pair(PAIR, timeout, &format!("phase {want:?} with {active_node} active"), |p| {
        phase(p) == Some(want) && active(p).as_deref() == Some(active_node)
    })
    .expect("phase reached")
}

/// Waits until `node` is the active under `epoch`, whatever the phase (with the old
/// active gone the pair serves Degraded — no ready standby — until it returns).
fn wait_active<C: Cluster>(c: &C, node: &str, epoch: i64, timeout: Duration) -> HAPair {
    c.wait_pair(PAIR, timeout, &format!("{node} active under epoch {epoch}"), |p| {
        active(p).as_deref() == Some(node) && p.status.as_ref().and_then(|s| s.epoch) == Some(epoch)
    })
    .expect("active")
}

fn wait_lease<C: Cluster>(c: &C, holder: &str, epoch: i64, timeout: Duration) {
    let start = Instant::now();
    loop {
        let l = c.lease(PAIR);
        if let Ok((h, e)) = &l
            && h.as_deref() == Some(holder)
            && *e == epoch
        {
            return;
        }
        assert!(start.elapsed() < timeout, "the Lease never became {holder}/{epoch}: {l:?}\n{}", c.logs_tail(30));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Create a pair → Live within 5 s; `kubectl get hapairs` shows its columns.
pub fn pair_goes_live<C: Cluster>(c: &mut C) {
    let (took, epoch) = live_pair(c, 2, "");
    assert!(took < Duration::from_secs(5), "Live after {took:?}\n{}", c.logs_tail(20));
    let (n0, n1) = (node(c, 0), node(c, 1));
    let (ok, out) = c.kubectl(&["get", "hapairs"]);
    assert!(ok, "{out}");
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "ACTIVE", "STANDBY", "PHASE", "EPOCH", "VIPS", "AGE"]);
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(&row[..6], [PAIR, n0.as_str(), n1.as_str(), "Live", epoch.to_string().as_str(), "1"], "{out}");
    let (ok, out) = c.kubectl(&["get", "fip"]);
    assert!(ok && out.contains(&n0) && out.contains("Announced"), "{out}");
    let (ok, out) = c.plugin(&["status", PAIR]);
    assert!(ok && out.contains(&n0) && out.contains("Active") && out.contains(&n1), "{out}");
}

/// The active node is cut → the standby takes over within a second: new epoch, Lease
/// holder, Events; the pair reads Degraded (naming the lost member) until the old
/// active returns as standby (FailedOver).
pub fn active_node_cut<C: Cluster>(c: &mut C) {
    let (_, e) = live_pair(c, 2, "");
    let (n0, n1) = (node(c, 0), node(c, 1));
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    c.cut_node(0).expect("cut");
    client.wait_for_responder(&n1, Duration::from_secs(5)).expect("n1 answers");
    let p = wait_active(c, &n1, e + 1, Duration::from_secs(10));
    let st = p.status.expect("status");
    assert_eq!(st.phase, Some(Phase::Degraded), "{st:?}");
    assert!(
        st.conditions.iter().any(|x| x.type_ == "Degraded" && x.status == "True" && x.message.contains(&n0)),
        "{st:?}"
    );
    assert_eq!(c.lease(PAIR).expect("lease"), (Some(n1.clone()), e + 1));
    // The pair's last transition carries the new active's own reason: it took over a
    // lost peer (RoleChange only until n1's report arrives).
    c.wait_pair(PAIR, Duration::from_secs(10), "lastTransition n0 → n1: PeerLost", |p| {
        p.status.as_ref().and_then(|s| s.last_transition.as_ref()).is_some_and(|t| {
            t.from == n0 && t.to == n1 && t.epoch == e + 1 && t.reason == havip_crds::TransitionReason::PeerLost
        })
    })
    .expect("the takeover's reason");
    let ev = c.events_about(PAIR);
    assert!(ev.iter().any(|e| e.contains(&n1) && e.contains("Active")), "role-change Events: {ev:?}");
    let report = client.stop().expect("report");
    assert!(report.longest_gap_ms < 1000.0, "{}", report.summary());
    c.restore_node(0).expect("restore");
    wait_phase(c, Phase::FailedOver, &n1, Duration::from_secs(15));
}

/// `kubectl havip failover` → the standby takes over; no failed connect but one whose
/// handshake straddles the flip.
pub fn planned_failover<C: Cluster>(c: &mut C) {
    live_pair(c, 2, "");
    let (n0, n1) = (node(c, 0), node(c, 1));
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    let (ok, out) = c.plugin(&["failover", PAIR]);
    assert!(ok, "plugin failover: {out}\n{}", c.logs_tail(30));
    client.wait_for_responder(&n1, Duration::from_secs(3)).expect("n1 answers");
    wait_phase(c, Phase::FailedOver, &n1, Duration::from_secs(10));
    // Keep probing a little after the move: late failures count too.
    std::thread::sleep(Duration::from_millis(300));
    let report = client.stop().expect("report");
    // No failed connect, but for at most one connection whose handshake straddled the
    // flip (README: a planned move does not drain connections).
    assert!(report.failed <= 1 && report.failures_beyond_the_flip(20.0).is_empty(), "{}", report.summary());
    let op = c.pair(PAIR).expect("pair").status.and_then(|s| s.last_operation).expect("lastOperation");
    assert_eq!(op.result, OperationResult::Succeeded, "{op:?}");
}

/// `kubectl havip failover --force` moves the VIPs without the readiness checks.
pub fn forced_failover<C: Cluster>(c: &mut C) {
    live_pair(c, 2, "");
    let n1 = node(c, 1);
    let (ok, out) = c.plugin(&["failover", PAIR, "--force"]);
    assert!(ok, "plugin failover --force: {out}\n{}", c.logs_tail(30));
    wait_phase(c, Phase::FailedOver, &n1, Duration::from_secs(10));
    assert_eq!(c.holders().expect("holders"), vec![1]);
}

/// Maintenance on the active hands over; on the standby it takes the member out of
/// the takeover candidates.
pub fn maintenance<C: Cluster>(c: &mut C) {
    let (_, e) = live_pair(c, 2, "");
    let (n0, n1) = (node(c, 0), node(c, 1));
    let (ok, out) = c.plugin(&["maintenance", PAIR, &n0, "on"]);
    assert!(ok, "{out}");
    wait_active(c, &n1, e + 1, Duration::from_secs(10));
    assert_eq!(c.holders().expect("holders"), vec![1]);
    // The operator recomputes the conditions after n0 reports Maintenance (it reports
    // Demoting first, which is not a missing standby).
    c.wait_pair(PAIR, Duration::from_secs(10), "Degraded: no standby while n0 is in maintenance", |p| {
        p.status.as_ref().is_some_and(|st| {
            st.conditions
                .iter()
                .any(|x| x.type_ == "Degraded" && x.status == "True" && x.message.contains("maintenance"))
        })
    })
    .expect("Degraded while n0 is in maintenance");
    c.wait_pair(PAIR, Duration::from_secs(10), "n0 in Maintenance", |p| {
        member_role(p, &n0) == Some(MemberRole::Maintenance)
    })
    .expect("n0 in maintenance");
    // Off: n0 comes back as standby; the VIPs stay on n1 (failback is Manual).
    let (ok, out) = c.plugin(&["maintenance", PAIR, &n0, "off"]);
    assert!(ok, "{out}");
    c.wait_pair(PAIR, Duration::from_secs(10), "n0 Standby", |p| member_role(p, &n0) == Some(MemberRole::Standby))
        .expect("n0 standby");
    // Maintenance on the standby: if the active dies, nobody takes over.
    let (ok, out) = c.plugin(&["maintenance", PAIR, &n0, "on"]);
    assert!(ok, "{out}");
    c.wait_pair(PAIR, Duration::from_secs(10), "n0 Maintenance", |p| {
        member_role(p, &n0) == Some(MemberRole::Maintenance)
    })
    .expect("n0 maintenance");
    c.cut_node(1).expect("cut");
    // Longer than a takeover takes (heartbeat timeout + probe span + stagger, < 1 s).
    std::thread::sleep(Duration::from_secs(2));
    assert!(!c.holders().expect("holders").contains(&0), "a member in maintenance never takes the VIPs");
}

/// Automatic failback waits for the recovery window; a second failover within the
/// quarantine window suspends failback.
pub fn automatic_failback<C: Cluster>(c: &mut C) {
    let spec = "  failback:\n    mode: Automatic\n    recoveryWindow: 3s\n    minimumTimeOnStandby: 1s\n    quietWindow: 1s\n    quarantine:\n      failovers: 2\n      within: 10m\n      hold: 10m\n  flapSuspension:\n    moves: 20\n";
    let (_, e) = live_pair(c, 2, spec);
    let (n0, n1) = (node(c, 0), node(c, 1));
    c.cut_node(0).expect("cut");
    wait_active(c, &n1, e + 1, Duration::from_secs(10));
    let back = Instant::now();
    c.restore_node(0).expect("restore");
    wait_phase(c, Phase::Live, &n0, Duration::from_secs(30));
    assert!(back.elapsed() >= Duration::from_secs(3), "failback after {:?}, before the 3 s window", back.elapsed());
    // Failover 2 within the window: quarantine, no failback this time.
    c.cut_node(0).expect("cut");
    wait_active(c, &n1, e + 3, Duration::from_secs(10));
    c.restore_node(0).expect("restore");
    // Past the recovery window (3 s) with margin: a failback would have happened.
    std::thread::sleep(Duration::from_secs(8));
    let p = c.pair(PAIR).expect("pair");
    assert_eq!(active(&p).as_deref(), Some(n1.as_str()), "quarantined: no failback\n{}", c.logs_tail(20));
}

/// With the operator stopped, a cut active still fails over (the agents CAS the
/// Lease themselves); the operator catches up when it returns.
pub fn operator_stopped<C: Cluster>(c: &mut C) {
    let (_, e) = live_pair(c, 2, "");
    let (n0, n1) = (node(c, 0), node(c, 1));
    c.stop_operator().expect("stop the operator");
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    c.cut_node(0).expect("cut");
    client.wait_for_responder(&n1, Duration::from_secs(5)).expect("failover without the operator");
    wait_lease(c, &n1, e + 1, Duration::from_secs(5));
    c.start_operator().expect("operator back");
    wait_active(c, &n1, e + 1, Duration::from_secs(15));
    drop(client.stop());
}

/// API server unreachable, then the active is cut: the standby still takes over
/// (standalone rules), and Lease and status catch up when the API returns.
pub fn api_outage<C: Cluster>(c: &mut C) {
    let (_, e) = live_pair(c, 2, "");
    let (n0, n1) = (node(c, 0), node(c, 1));
    wait_lease(c, &n0, e, Duration::from_secs(5));
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    c.api_outage_begin().expect("API outage");
    c.cut_node(0).expect("cut");
    client.wait_for_responder(&n1, Duration::from_secs(5)).expect("takeover without the API server");
    let report = client.stop().expect("report");
    assert!(report.longest_gap_ms < 1500.0, "{}", report.summary());
    c.api_outage_end().expect("API back");
    wait_lease(c, &n1, e + 1, Duration::from_secs(20));
    c.wait_pair(PAIR, Duration::from_secs(20), "n1's status caught up", |p| {
        p.status.as_ref().is_some_and(|s| {
            s.members.iter().any(|m| m.node == n1 && m.role == Some(MemberRole::Active) && m.epoch == Some(e + 1))
        })
    })
    .expect("status caught up");
}

/// A rolling upgrade of the active's agent (SIGTERM, new process) loses no connect
/// and moves nothing.
pub fn agent_restart<C: Cluster>(c: &mut C) {
    let (_, e) = live_pair(c, 2, "");
    let n0 = node(c, 0);
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    c.restart_agent(0).expect("restart the agent");
    c.wait_pair(PAIR, Duration::from_secs(30), &format!("n0 Active again under epoch {e}"), |p| {
        p.status.as_ref().is_some_and(|s| {
            s.members.iter().any(|m| m.node == n0 && m.role == Some(MemberRole::Active) && m.epoch == Some(e))
        })
    })
    .expect("n0 adopted the VIPs");
    std::thread::sleep(Duration::from_millis(500));
    let report = client.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
    assert_eq!(report.responder_sequence(), vec![n0.as_str()], "no takeover");
    wait_lease(c, &n0, e, Duration::from_secs(2));
}

/// A bad spec edit: refused by the API server (CEL), or accepted but impossible
/// (a member Node that does not exist) → a condition naming it; nothing moves.
pub fn bad_spec_edit<C: Cluster>(c: &mut C) {
    live_pair(c, 2, "");
    let (n0, n1) = (node(c, 0), node(c, 1));
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    let bad = c.pair_yaml(PAIR, 2).replace("priority: 190", "priority: 200");
    let err = c.apply_yaml(&bad).expect_err("duplicate priority refused");
    assert!(err.to_string().contains("priorities must be distinct"), "{err}");
    let ghost = c.pair_yaml(PAIR, 2).replace(&format!("node: {n1}\n"), "node: ghost\n");
    c.apply_yaml(&ghost).expect("schema-valid");
    let p = c
        .wait_pair(PAIR, Duration::from_secs(10), "a condition naming the missing node", |p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.conditions.iter().any(|x| x.status == "True" && x.message.contains("ghost")))
        })
        .expect("conditioned");
    assert_eq!(active(&p).as_deref(), Some(n0.as_str()));
    // Long enough for a wrong move to show up in the client's record.
    std::thread::sleep(Duration::from_secs(2));
    let report = client.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec![n0.as_str()], "nothing moved: {}", report.summary());
    assert_eq!(report.failed, 0);
}

/// `kubectl havip rotate-key` → both members on the new key, no role change, no
/// failed connect.
pub fn key_rotation<C: Cluster>(c: &mut C) {
    live_pair(c, 2, "");
    let n0 = node(c, 0);
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    let (ok, out) = c.plugin(&["rotate-key", PAIR]);
    assert!(ok, "rotate-key: {out}\n{}", c.logs_tail(30));
    let st = c.pair(PAIR).expect("pair").status.expect("status");
    assert!(st.members.iter().all(|m| m.key_id == Some(2)), "{:?}", st.members);
    assert!(st.key_rotation.is_none(), "rotation finished");
    std::thread::sleep(Duration::from_millis(500));
    let report = client.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
    assert_eq!(report.responder_sequence(), vec![n0.as_str()], "no role change");
}

/// A dead member replaced in the spec: the VIPs stay on the survivor, the key is
/// rotated, the newcomer joins as standby, the departed member's entry leaves
/// `status.members`.
pub fn member_replacement<C: Cluster>(c: &mut C) {
    live_pair(c, 2, "");
    let (n0, n1, n2) = (node(c, 0), node(c, 1), node(c, 2));
    let key_before = c
        .pair(PAIR)
        .expect("pair")
        .status
        .and_then(|s| s.members.iter().find(|m| m.node == n0).and_then(|m| m.key_id))
        .expect("key id");
    c.cut_node(1).expect("cut");
    let replaced = c.pair_yaml(PAIR, 2).replace(&format!("node: {n1}\n"), &format!("node: {n2}\n"));
    c.apply_yaml(&replaced).expect("replacement");
    let p = c
        .wait_pair(PAIR, Duration::from_secs(20), "n2 standby, key rotated, n1's entry gone", |p| {
            member_role(p, &n2) == Some(MemberRole::Standby)
                && p.status.as_ref().is_some_and(|s| {
                    s.members.iter().any(|m| m.node == n0 && m.key_id.is_some_and(|k| k > key_before))
                        && !s.members.iter().any(|m| m.node == n1)
                })
        })
        .expect("replaced");
    assert_eq!(active(&p).as_deref(), Some(n0.as_str()), "the VIPs stayed on the survivor");
    assert_eq!(c.holders().expect("holders"), vec![0]);
}

/// One pair of the shared-node scenarios.
struct PairOn {
    name: &'static str,
    /// Member node indices; the first is the preferred active, the second takes over.
    members: &'static [usize],
    /// The cluster's VIP number.
    vip: u8,
    /// The service port its VIP is probed on.
    port: u16,
}

/// Two pairs on the same two nodes and the same heartbeat port (the default), each with
/// its own VIP and service.
pub fn two_pairs_on_two_nodes<C: Cluster>(c: &mut C) {
    pairs_on_shared_nodes(
        c,
        &[
            PairOn { name: "web", members: &[0, 1], vip: 0, port: 8080 },
            PairOn { name: "db", members: &[0, 1], vip: 1, port: 8081 },
        ],
    );
}

/// Three pairs on three nodes: web and api on n0/n1, db on n0/n2 (db shares only n0
/// with each of the others); n0 is preferred by all three.
pub fn three_pairs_on_three_nodes<C: Cluster>(c: &mut C) {
    pairs_on_shared_nodes(
        c,
        &[
            PairOn { name: "web", members: &[0, 1], vip: 0, port: 8080 },
            PairOn { name: "api", members: &[0, 1], vip: 1, port: 8081 },
            PairOn { name: "db", members: &[0, 2], vip: 2, port: 8082 },
        ],
    );
}

/// Every pair Live with every member hearing its peers on every path, no heartbeat
/// charged to the wrong pair, bundled heartbeats between nodes sharing several pairs;
/// one pair's service blips on the common active for 1.5 s →
/// nothing moves; the common active is cut → every pair moves to its standby, each VIP
/// with exactly one holder; back, it rejoins every pair as standby.
fn pairs_on_shared_nodes<C: Cluster>(c: &mut C, pairs: &[PairOn]) {
    let names = c.nodes();
    let name_of = |i: usize| names.get(i).cloned().unwrap_or_else(|| panic!("the cluster has no node {i}"));
    let mut yaml = String::new();
    for p in pairs {
        yaml.push_str(&c.pair_yaml_on(p.name, p.members, p.vip, p.port).expect("pair YAML"));
        yaml.push_str("---\n");
    }
    c.apply_yaml(&yaml).expect("apply the pairs");
    for p in pairs {
        let (first, size) = (name_of(p.members[0]), p.members.len());
        c.wait_pair(p.name, Duration::from_secs(30), "Live, every member hearing its peers on every path", |x| {
            let Some(s) = x.status.as_ref() else { return false };
            let paths = x.spec.heartbeat.paths.len();
            s.phase == Some(Phase::Live)
                && s.active.as_deref() == Some(first.as_str())
                && s.members.len() == size
                && s.members.iter().all(|m| m.heard.len() == paths && m.heard.iter().all(|h| h.heard))
        })
        .unwrap_or_else(|e| panic!("pair {}: {e}", p.name));
    }
    let used: std::collections::BTreeSet<usize> = pairs.iter().flat_map(|p| p.members.iter().copied()).collect();
    for &i in &used {
        for reason in ["bad_mac", "unknown_key"] {
            let n = c
                .agent_metric(i, "havip_agent_heartbeats_dropped", &[&format!("reason=\"{reason}\"")])
                .expect("agent metrics");
            assert_eq!(n, 0.0, "{}: {reason} drops — a pair was charged another pair's heartbeats", name_of(i));
        }
    }
    // Two nodes that share several pairs carry their heartbeats in bundles: every node
    // that shares two or more pairs with another sends bundle datagrams.
    for &i in &used {
        let shares_several = used
            .iter()
            .any(|&j| j != i && pairs.iter().filter(|p| p.members.contains(&i) && p.members.contains(&j)).count() >= 2);
        if !shares_several {
            continue;
        }
        let start = Instant::now();
        loop {
            let bundles = c
                .agent_metric(i, "havip_agent_heartbeat_datagrams_sent_total", &["name=\"bundle\""])
                .expect("agent metrics");
            if bundles > 0.0 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{} shares several pairs with a peer but sends no bundled heartbeat\n{}",
                name_of(i),
                c.logs_tail(30)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let epochs: Vec<Option<i64>> =
        pairs.iter().map(|p| c.pair(p.name).ok().and_then(|x| x.status.and_then(|s| s.epoch))).collect();

    // The first pair's service blips on its active: its standby still hears the active's
    // heartbeats, so nothing moves, in any pair.
    let (blip, common) = (&pairs[0], pairs[0].members[0]);
    let client = c.client_to(blip.vip, blip.port).expect("client");
    client.wait_for_responder(&name_of(common), Duration::from_secs(5)).expect("the active answers");
    c.set_service(common, blip.port, false).expect("stop the service");
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        for p in pairs {
            assert_eq!(
                c.holders_of(p.vip).expect("holders"),
                vec![p.members[0]],
                "pair {} moved during the blip of {}'s service\n{}",
                p.name,
                blip.name,
                c.logs_tail(30)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    c.set_service(common, blip.port, true).expect("restart the service");
    client.wait_for_responder(&name_of(common), Duration::from_secs(5)).expect("the active answers again");
    let report = client.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec![name_of(common).as_str()], "{}", report.summary());
    for (p, before) in pairs.iter().zip(&epochs) {
        let now = c.pair(p.name).ok().and_then(|x| x.status.and_then(|s| s.epoch));
        assert_eq!(now, *before, "pair {}: no role change", p.name);
    }

    // The common active is cut: every pair moves to its standby, one holder each.
    c.cut_node(common).expect("cut");
    for p in pairs {
        let to = name_of(p.members[1]);
        let next = epochs[pairs.iter().position(|x| x.name == p.name).unwrap_or(0)].unwrap_or(1) + 1;
        c.wait_pair(p.name, Duration::from_secs(15), &format!("{to} active under epoch {next}"), |x| {
            active(x).as_deref() == Some(to.as_str()) && x.status.as_ref().and_then(|s| s.epoch) == Some(next)
        })
        .unwrap_or_else(|e| panic!("pair {}: {e}", p.name));
        wait_holders(c, p, vec![p.members[1]], Duration::from_secs(10));
    }
    c.restore_node(common).expect("restore");
    let back = name_of(common);
    for p in pairs {
        c.wait_pair(p.name, Duration::from_secs(20), &format!("{back} back as standby"), |x| {
            member_role(x, &back) == Some(MemberRole::Standby)
        })
        .unwrap_or_else(|e| panic!("pair {}: {e}", p.name));
        wait_holders(c, p, vec![p.members[1]], Duration::from_secs(5));
    }
}

/// Waits until exactly `want` hold pair `p`'s VIP.
fn wait_holders<C: Cluster>(c: &C, p: &PairOn, want: Vec<usize>, timeout: Duration) {
    let start = Instant::now();
    loop {
        let h = c.holders_of(p.vip).expect("holders");
        if h == want {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "pair {}: VIP held by {h:?}, expected exactly {want:?}\n{}",
            p.name,
            c.logs_tail(30)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The status of FloatingIP `name`'s `Accepted` condition: (status, reason, message).
fn accepted<C: Cluster>(c: &C, name: &str) -> Option<(String, String, String)> {
    let f = c.floating_ip(name).ok()?;
    let cond = f.status?.conditions.into_iter().find(|x| x.type_ == havip_crds::condition::ACCEPTED)?;
    Some((cond.status, cond.reason, cond.message))
}

fn wait_accepted<C: Cluster>(c: &C, name: &str, want: &str, timeout: Duration) -> (String, String, String) {
    let start = Instant::now();
    loop {
        let a = accepted(c, name);
        if let Some(a) = a.as_ref().filter(|a| a.0 == want) {
            return a.clone();
        }
        assert!(
            start.elapsed() < timeout,
            "FloatingIP {name}: Accepted is {a:?}, expected {want}\n{}",
            c.logs_tail(30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A second FloatingIP with the address of the pair's VIP (another prefix length): the
/// newer one is refused (condition, Event), the pair keeps serving, its revision and
/// holder unchanged. With the older one deleted, the newer is accepted and served.
pub fn floating_ip_address_conflict<C: Cluster>(c: &mut C) {
    live_pair(c, 2, "");
    let n0 = node(c, 0);
    let before = c.pair(PAIR).expect("pair");
    let revision = before.status.as_ref().and_then(|s| s.config_revision.clone());
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    let yaml = c.pair_yaml(PAIR, 2);
    let address = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("address: "))
        .and_then(|a| a.split('/').next())
        .expect("the standard pair's VIP address")
        .to_owned();
    let dup = format!("{PAIR}-dup");
    let dup_yaml = format!(
        "apiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata:\n  name: {dup}\nspec:\n  pair: {PAIR}\n  address: {address}/32\n  interface: eth0\n"
    );
    c.apply_yaml(&dup_yaml).expect("apply the duplicate");
    let (_, why, message) = wait_accepted(c, &dup, "False", Duration::from_secs(10));
    assert_eq!(why, havip_crds::reason::ADDRESS_IN_USE, "{message}");
    assert!(message.contains(&format!("{PAIR}-vip")), "names the FloatingIP that keeps the address: {message}");
    wait_accepted(c, &format!("{PAIR}-vip"), "True", Duration::from_secs(10));
    let start = Instant::now();
    while !c.events_about(&dup).iter().any(|e| e.starts_with(havip_crds::reason::ADDRESS_IN_USE)) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no AddressInUse Event about {dup}: {:?}",
            c.events_about(&dup)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Nothing else moves: same holder, same revision, same epoch, one VIP counted.
    std::thread::sleep(Duration::from_secs(2));
    let p = c.pair(PAIR).expect("pair");
    let st = p.status.as_ref().expect("status");
    assert_eq!(st.phase, Some(Phase::Live), "{st:?}");
    assert_eq!(st.config_revision, revision, "the refused FloatingIP is in no revision");
    assert_eq!(st.epoch, before.status.as_ref().and_then(|s| s.epoch));
    assert_eq!(st.vips, Some(1));
    assert!(st.members.iter().all(|m| m.applied_revision == revision), "every agent kept the revision: {st:?}");
    assert_eq!(c.holders().expect("holders"), vec![0]);
    assert!(c.floating_ip(&dup).expect("dup").status.and_then(|s| s.holder).is_none(), "nobody holds the refused one");
    let report = client.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec![n0.as_str()], "{}", report.summary());
    assert_eq!(report.failed, 0, "{}", report.summary());

    // The older one goes: the newer is accepted and served by the active.
    c.delete_floating_ip(&format!("{PAIR}-vip")).expect("delete the older");
    wait_accepted(c, &dup, "True", Duration::from_secs(10));
    let start = Instant::now();
    while c.floating_ip(&dup).ok().and_then(|f| f.status.and_then(|s| s.holder)).as_deref() != Some(n0.as_str()) {
        assert!(start.elapsed() < Duration::from_secs(15), "{n0} never held {dup}\n{}", c.logs_tail(30));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(c.holders().expect("holders"), vec![0]);
    c.delete_floating_ip(&dup).expect("clean up");
}
