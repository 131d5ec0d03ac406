//! End to end on the local control plane: the operator, one agent per node namespace,
//! the kubectl plugin, a client on the data network. `make e2e` runs these (root).
//! A failure prints the operator's and the agents' logs and the pair's status.

use havip_crds::{HAPair, Phase};
use havip_e2e::kubelab::{KubeLab, KubeLabOptions, NAMESPACE};
use havip_e2e::netns::{self, Link};
use havip_e2e::traffic::Prober;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use std::time::{Duration, Instant};

fn phase(p: &HAPair) -> Option<Phase> {
    p.status.as_ref().and_then(|s| s.phase)
}

fn active(p: &HAPair) -> Option<String> {
    p.status.as_ref().and_then(|s| s.active.clone())
}

/// A lab with the operator and a pair over all nodes, Live with n0 active. Returns the
/// lab and how long the pair took from apply to Live.
fn live_pair(nodes: usize, extra_spec: &str) -> Option<(KubeLab, Duration)> {
    if !netns::skip_unless_root(module_path!()) {
        return None;
    }
    havip_e2e::init_tracing();
    let lab = KubeLab::start(KubeLabOptions { nodes, operator: true, dir: None, chart_rbac: false }).expect("lab");
    let took = lab.block_on(async {
        let mut yaml = lab.pair_yaml("web");
        if !extra_spec.is_empty() {
            yaml = yaml.replacen("  heartbeat:\n", &format!("{extra_spec}  heartbeat:\n"), 1);
        }
        let start = Instant::now();
        lab.apply(&yaml).await.expect("apply");
        lab.wait_pair("web", Duration::from_secs(10), "phase Live with n0 active", |p| {
            phase(p) == Some(Phase::Live) && active(p).as_deref() == Some("n0")
        })
        .await
        .expect("pair Live");
        start.elapsed()
    });
    Some((lab, took))
}

fn wait_phase(lab: &KubeLab, want: Phase, active_node: &str, timeout: Duration) -> HAPair {
    lab.block_on(lab.wait_pair("web", timeout, &format!("phase {want:?} with {active_node} active"), |p| {
        phase(p) == Some(want) && active(p).as_deref() == Some(active_node)
    }))
    .expect("phase reached")
}

/// Waits until `node` is the pair's active under `epoch` (whatever the phase: with the
/// old active gone the pair serves Degraded — no ready standby — until it returns).
fn wait_active(lab: &KubeLab, node: &str, epoch: i64, timeout: Duration) -> HAPair {
    lab.block_on(lab.wait_pair("web", timeout, &format!("{node} active under epoch {epoch}"), |p| {
        active(p).as_deref() == Some(node) && p.status.as_ref().and_then(|s| s.epoch) == Some(epoch)
    }))
    .expect("active")
}

fn events(lab: &KubeLab) -> Vec<String> {
    lab.block_on(async {
        let api: Api<Event> = Api::all(lab.client().await.expect("client"));
        api.list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter(|e| e.involved_object.name.as_deref() == Some("web"))
                    .map(|e| format!("{} {}", e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default()
    })
}

#[test]
fn pair_goes_live_within_5s_and_kubectl_shows_its_columns() {
    let Some((lab, took)) = live_pair(2, "") else { return };
    assert!(took < Duration::from_secs(5), "Live after {took:?}\n{}", lab.logs_tail(20));
    let (ok, out) = lab.kubectl(&["get", "hapairs"]);
    assert!(ok, "{out}");
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "ACTIVE", "STANDBY", "PHASE", "EPOCH", "VIPS", "AGE"]);
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(&row[..6], ["web", "n0", "n1", "Live", "1", "1"], "{out}");
    let (ok, out) = lab.kubectl(&["get", "fip"]);
    assert!(ok && out.contains("n0") && out.contains("Announced"), "{out}");
    let (ok, out) = lab.plugin(&["status", "web"]);
    assert!(ok && out.contains("n0") && out.contains("Active") && out.contains("n1"), "{out}");
}

#[test]
fn active_node_cut_fails_over_with_a_new_epoch_lease_and_events() {
    let Some((lab, _)) = live_pair(2, "") else { return };
    let prober = Prober::on_client(&lab.topo, lab.target()).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("n0 answers");
    lab.topo.cut_cable(0, Link::Mgmt).expect("cut");
    lab.topo.cut_cable(0, Link::Data).expect("cut");
    prober.wait_for_responder("n1", Duration::from_secs(5)).expect("n1 answers");
    // While n0 is gone the pair serves without a standby: Degraded, saying why.
    let p = wait_active(&lab, "n1", 2, Duration::from_secs(10));
    let st = p.status.expect("status");
    assert_eq!(st.phase, Some(Phase::Degraded), "{st:?}");
    assert!(
        st.conditions.iter().any(|c| c.type_ == "Degraded" && c.status == "True" && c.message.contains("n0")),
        "{st:?}"
    );
    let (holder, epoch) = lab.block_on(lab.lease("web")).expect("lease");
    assert_eq!((holder.as_deref(), epoch), (Some("n1"), 2));
    let ev = events(&lab);
    assert!(ev.iter().any(|e| e.contains("n1") && e.contains("Active")), "role-change Events: {ev:?}");
    let report = prober.stop().expect("report");
    assert!(report.longest_gap_ms < 1000.0, "{}", report.summary());
    // n0 comes back as a standby: FailedOver, a healthy state under Manual failback.
    lab.topo.restore_cable(0, Link::Data).expect("restore");
    lab.topo.restore_cable(0, Link::Mgmt).expect("restore");
    wait_phase(&lab, Phase::FailedOver, "n1", Duration::from_secs(15));
}

#[test]
fn planned_failover_through_the_plugin_loses_no_connect() {
    let Some((lab, _)) = live_pair(2, "") else { return };
    let prober = Prober::on_client(&lab.topo, lab.target()).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("n0 answers");
    let (ok, out) = lab.plugin(&["failover", "web"]);
    assert!(ok, "plugin failover: {out}\n{}", lab.logs_tail(30));
    prober.wait_for_responder("n1", Duration::from_secs(3)).expect("n1 answers");
    wait_phase(&lab, Phase::FailedOver, "n1", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    let report = prober.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
    let p = lab.block_on(lab.pair("web")).expect("pair");
    let op = p.status.and_then(|s| s.last_operation).expect("lastOperation");
    assert_eq!(op.result, "Succeeded", "{op:?}");
}

#[test]
fn forced_failover_through_the_plugin() {
    let Some((lab, _)) = live_pair(2, "") else { return };
    let (ok, out) = lab.plugin(&["failover", "web", "--force"]);
    assert!(ok, "plugin failover --force: {out}\n{}", lab.logs_tail(30));
    wait_phase(&lab, Phase::FailedOver, "n1", Duration::from_secs(10));
    assert_eq!(lab.holders().expect("holders"), vec![1]);
}

#[test]
fn maintenance_on_the_active_hands_over_and_on_the_standby_takes_it_out() {
    let Some((lab, _)) = live_pair(2, "") else { return };
    let (ok, out) = lab.plugin(&["maintenance", "web", "n0", "on"]);
    assert!(ok, "{out}");
    let p = wait_active(&lab, "n1", 2, Duration::from_secs(10));
    assert_eq!(lab.holders().expect("holders"), vec![1]);
    let st = p.status.expect("status");
    assert!(
        st.conditions.iter().any(|c| c.type_ == "Degraded" && c.status == "True" && c.message.contains("maintenance")),
        "no standby while n0 is in maintenance: {st:?}"
    );
    let p = lab
        .block_on(lab.wait_pair("web", Duration::from_secs(10), "n0 in Maintenance", |p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.members.iter().any(|m| m.node == "n0" && m.role.as_deref() == Some("Maintenance")))
        }))
        .expect("n0 in maintenance");
    let _ = p;
    // Maintenance off: n0 comes back as standby; the VIPs stay on n1 (failback is Manual).
    let (ok, out) = lab.plugin(&["maintenance", "web", "n0", "off"]);
    assert!(ok, "{out}");
    lab.block_on(lab.wait_pair("web", Duration::from_secs(10), "n0 Standby", |p| {
        p.status
            .as_ref()
            .is_some_and(|s| s.members.iter().any(|m| m.node == "n0" && m.role.as_deref() == Some("Standby")))
    }))
    .expect("n0 standby");
    // Maintenance on the standby n0: if the active dies, nobody takes over.
    let (ok, out) = lab.plugin(&["maintenance", "web", "n0", "on"]);
    assert!(ok, "{out}");
    lab.block_on(lab.wait_pair("web", Duration::from_secs(10), "n0 Maintenance", |p| {
        p.status
            .as_ref()
            .is_some_and(|s| s.members.iter().any(|m| m.node == "n0" && m.role.as_deref() == Some("Maintenance")))
    }))
    .expect("n0 maintenance");
    lab.topo.cut_cable(1, Link::Mgmt).expect("cut");
    lab.topo.cut_cable(1, Link::Data).expect("cut");
    std::thread::sleep(Duration::from_secs(2));
    assert!(!lab.holders().expect("holders").contains(&0), "a member in maintenance never takes the VIPs");
}

#[test]
fn automatic_failback_honours_its_recovery_window_and_quarantine() {
    let spec = "  failback:\n    mode: Automatic\n    recoveryWindow: 3s\n    minimumTimeOnStandby: 1s\n    quietWindow: 1s\n    quarantine:\n      failovers: 2\n      within: 10m\n      hold: 10m\n  flapSuspension:\n    moves: 20\n";
    let Some((lab, _)) = live_pair(2, spec) else { return };
    // Failover 1: n0 cut → n1.
    lab.topo.cut_cable(0, Link::Mgmt).expect("cut");
    lab.topo.cut_cable(0, Link::Data).expect("cut");
    wait_active(&lab, "n1", 2, Duration::from_secs(10));
    let back = Instant::now();
    lab.topo.restore_cable(0, Link::Data).expect("restore");
    lab.topo.restore_cable(0, Link::Mgmt).expect("restore");
    // n0 must be ready for the whole recovery window before the pair moves back.
    wait_phase(&lab, Phase::Live, "n0", Duration::from_secs(30));
    assert!(
        back.elapsed() >= Duration::from_secs(3),
        "failback after {:?}, before the 3 s recovery window",
        back.elapsed()
    );
    // Failover 2 within the window: quarantine, no failback this time.
    lab.topo.cut_cable(0, Link::Mgmt).expect("cut");
    lab.topo.cut_cable(0, Link::Data).expect("cut");
    wait_active(&lab, "n1", 4, Duration::from_secs(10));
    lab.topo.restore_cable(0, Link::Data).expect("restore");
    lab.topo.restore_cable(0, Link::Mgmt).expect("restore");
    std::thread::sleep(Duration::from_secs(8));
    let p = lab.block_on(lab.pair("web")).expect("pair");
    assert_eq!(active(&p).as_deref(), Some("n1"), "quarantined: no failback\n{}", lab.logs_tail(20));
}

#[test]
fn operator_stopped_failover_still_works() {
    let Some((mut lab, _)) = live_pair(2, "") else { return };
    lab.stop_operator();
    let prober = Prober::on_client(&lab.topo, lab.target()).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("n0 answers");
    lab.topo.cut_cable(0, Link::Mgmt).expect("cut");
    lab.topo.cut_cable(0, Link::Data).expect("cut");
    prober.wait_for_responder("n1", Duration::from_secs(5)).expect("failover without the operator");
    let (holder, epoch) = lab.block_on(lab.lease("web")).expect("lease");
    assert_eq!((holder.as_deref(), epoch), (Some("n1"), 2), "the agents record the move in the Lease themselves");
    lab.start_operator().expect("operator back");
    wait_active(&lab, "n1", 2, Duration::from_secs(15));
}

#[test]
fn a_bad_spec_edit_is_refused_or_conditioned_and_nothing_moves() {
    let Some((lab, _)) = live_pair(2, "") else { return };
    let prober = Prober::on_client(&lab.topo, lab.target()).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("n0 answers");
    // Refused by the API server.
    let bad = lab.pair_yaml("web").replace("priority: 190", "priority: 200");
    let err = lab.block_on(lab.apply(&bad)).expect_err("duplicate priority refused");
    assert!(err.to_string().contains("priorities must be distinct"), "{err}");
    // Accepted by the API server but impossible: a member Node that does not exist.
    let ghost = lab.pair_yaml("web").replace("node: n1", "node: ghost");
    lab.block_on(lab.apply(&ghost)).expect("schema-valid");
    let p = lab
        .block_on(lab.wait_pair("web", Duration::from_secs(10), "a condition naming the missing node", |p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.conditions.iter().any(|c| c.status == "True" && c.message.contains("ghost")))
        }))
        .expect("conditioned");
    assert_eq!(active(&p).as_deref(), Some("n0"));
    std::thread::sleep(Duration::from_secs(2));
    let report = prober.stop().expect("report");
    assert_eq!(report.responder_sequence(), vec!["n0"], "nothing moved: {}", report.summary());
    assert_eq!(report.failed, 0);
}

#[test]
fn key_rotation_through_the_plugin_misses_no_heartbeat() {
    let Some((lab, _)) = live_pair(2, "") else { return };
    let prober = Prober::on_client(&lab.topo, lab.target()).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("n0 answers");
    let (ok, out) = lab.plugin(&["rotate-key", "web"]);
    assert!(ok, "rotate-key: {out}\n{}", lab.logs_tail(30));
    let p = lab.block_on(lab.pair("web")).expect("pair");
    let st = p.status.expect("status");
    assert!(st.members.iter().all(|m| m.key_id == Some(2)), "{:?}", st.members);
    assert!(st.key_rotation.is_none(), "rotation finished");
    std::thread::sleep(Duration::from_millis(500));
    let report = prober.stop().expect("report");
    assert_eq!(report.failed, 0);
    assert_eq!(report.responder_sequence(), vec!["n0"], "no role change");
    // A second rotation right after is fine (the first finished); refusal of a
    // concurrent one is covered by the operator's tests.
}

#[test]
fn member_replacement_keeps_the_vips_rotates_the_key_and_the_newcomer_joins_as_standby() {
    let Some((lab, _)) = live_pair(3, "") else { return };
    // Start with the pair on n0 and n1 only.
    let two = lab.pair_yaml("web").replace("    - node: n2\n      priority: 180\n", "");
    lab.block_on(lab.apply(&two)).expect("two members");
    lab.block_on(lab.wait_pair("web", Duration::from_secs(10), "two members", |p| {
        p.spec.members.len() == 2 && phase(p) == Some(Phase::Live)
    }))
    .expect("two members Live");
    let key_before = lab
        .block_on(lab.pair("web"))
        .expect("pair")
        .status
        .and_then(|s| s.members.iter().find(|m| m.node == "n0").and_then(|m| m.key_id))
        .expect("key id");
    // n1 dies for good; it is replaced by n2.
    lab.topo.cut_cable(1, Link::Mgmt).expect("cut");
    lab.topo.cut_cable(1, Link::Data).expect("cut");
    let replaced = two.replace("node: n1\n      priority: 190", "node: n2\n      priority: 190");
    lab.block_on(lab.apply(&replaced)).expect("replacement");
    let p = lab
        .block_on(lab.wait_pair("web", Duration::from_secs(20), "n2 standby, key rotated", |p| {
            p.status.as_ref().is_some_and(|s| {
                s.members.iter().any(|m| m.node == "n2" && m.role.as_deref() == Some("Standby"))
                    && s.members.iter().any(|m| m.node == "n0" && m.key_id.is_some_and(|k| k > key_before))
            })
        }))
        .expect("replaced");
    assert_eq!(active(&p).as_deref(), Some("n0"), "the VIPs stayed on the survivor");
    assert_eq!(lab.holders().expect("holders"), vec![0]);
    let _ = NAMESPACE;
}
