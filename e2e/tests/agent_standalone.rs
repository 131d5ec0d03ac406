//! What the standalone daemon leaves on a node and who may talk to it, on real kernels:
//! members in network namespaces (see `agent_scenarios.rs` for the topology). Root only;
//! each test creates and removes its own namespaces.

#![allow(clippy::unwrap_used)]

use havip_e2e::agent::{AgentLab, PairOptions};
use havip_e2e::traffic::LongLived;
use std::net::IpAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::Duration;

const UP: Duration = Duration::from_secs(15);

fn lab(opts: PairOptions) -> Option<AgentLab> {
    havip_e2e::agent::lab_for_test(module_path!(), opts)
}

fn wait(lab: &AgentLab, what: &str, timeout: Duration, cond: impl FnMut() -> bool) -> Duration {
    lab.wait_for(what, timeout, cond)
}

/// Two pairs on the same members, a long drain; n0's agent is SIGKILLed while it drains
/// pair 1 (its drain tables and the VIP on `lo` stay behind), and pair 1 is removed from
/// its configuration before it starts again: the new agent sweeps what pair 1 left
/// (it ran from a file this agent reads, and no agent holds its lock), and keeps
/// serving pair 0.
#[test]
fn a_pair_removed_while_the_agent_was_down_leaves_nothing_behind() {
    let Some(mut lab) = lab(PairOptions { pairs: 2, drain_timeout: Some("30s".into()), ..Default::default() }) else {
        return;
    };
    for k in 0..2 {
        wait(&lab, &format!("n0 holds pair {k}"), UP, || lab.pair_holders(k).is_ok_and(|h| h == vec![0]));
    }
    let target = lab.pair_target(1);
    // A connection keeps the drain from ending early.
    let _conns = LongLived::on_client(&lab.topo, target, 2).expect("long-lived connections");
    // Accepted once n1 is a ready standby of pair 1 (heard, its probes done), which
    // holding both pairs on n0 does not wait for.
    lab.pair_failover_when_ready(0, 1, UP).unwrap_or_else(|e| panic!("failover of pair 1: {e}\n{}", lab.diagnostics()));
    wait(&lab, "n0 drains pair 1", Duration::from_secs(5), || !lab.drain_tables(0, 1).expect("nft").is_empty());
    let vip1 = IpAddr::V4(lab.vip_addr(lab.pair_vip(1, 0)));
    let on_lo = |lab: &AgentLab| lab.vips_on_lo(0).expect("addresses").iter().any(|a| a.ip == vip1);
    assert!(on_lo(&lab), "pair 1's VIP is kept on n0's lo while it drains\n{}", lab.diagnostics());
    lab.kill_agent(0);
    assert!(!lab.drain_tables(0, 1).expect("nft").is_empty(), "a SIGKILLed agent leaves its drain behind");
    // n0 starts again with pair 0 only.
    let only_pair_0 = lab.config_files(0)[..1].to_vec();
    let _agent = lab.spawn_agent(0, "agent-0-only", &only_pair_0, &[]).expect("start n0 with pair 0");
    let took = wait(&lab, "the drain tables and the VIP of the removed pair to go", Duration::from_secs(5), || {
        lab.drain_tables(0, 1).expect("nft").is_empty() && !on_lo(&lab)
    });
    eprintln!("pair 1's leftovers swept {took:?} after n0 started");
    wait(&lab, "n0 serves pair 0 again", UP, || lab.pair_status(0, 0).is_some());
    assert_eq!(lab.pair_holders(0).expect("holders"), vec![0], "pair 0 stays where it was\n{}", lab.diagnostics());
}

/// The admin socket is the owner's alone, whatever umask the daemon was started with.
#[test]
fn the_admin_socket_is_owner_only() {
    let Some(lab) = lab(PairOptions::default()) else { return };
    let path = lab.admin_socket(0);
    wait(&lab, "the admin socket", UP, || path.exists());
    let meta = std::fs::metadata(&path).expect("socket");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "mode of {}", path.display());
}
