//! Routes and policy rules that follow the holder (issue 31, the pair's `routes` and
//! `rules`) on real kernels: standalone members in network namespaces on one switch (see
//! `agent_scenarios.rs` for the topology), forwarding on as on every Kubernetes node. The
//! routes are what an edge or NAT pair needs: a default route in table 100 through the
//! gateway, sourced from the VIP, and a rule that sends what leaves from the VIP to that
//! table — for both families. Root only; each test creates and removes its own namespaces.
//!
//! Each test reads the kernel of every member (`ip route show table … proto 104`, `ip rule
//! show`): the holder must carry every route and rule, the others none, at each step —
//! a cut of the holder, a planned move, a restart of either agent, a reconfiguration and a
//! pair leaving the node.

#![allow(clippy::unwrap_used)]

use havip_e2e::agent::{AgentLab, PairOptions};
use havip_e2e::netns;
use nix::sys::signal::Signal;
use std::time::Duration;

const UP: Duration = Duration::from_secs(15);
/// A takeover and the step after it (the Standard profile replaces a cut holder in about
/// 400 ms; the routes follow the VIPs in the same step).
const TAKEOVER: Duration = Duration::from_secs(5);

/// Pair `{k}`'s default routes (table 10k) and rules (priority 100k), for both families.
const ROUTES: &str = r#"routes:
  - {destination: 0.0.0.0/0, gateway: "{gateway}", table: 10{k}, source: "{vip}"}
  - {destination: "::/0", gateway: "{gateway6}", table: 10{k}, source: "{vip6}"}
rules:
  - {from: "{vip}/32", table: 10{k}, priority: 100{k}}
  - {from: "{vip6}/128", table: 10{k}, priority: 100{k}}
"#;

/// The same for IPv4 only (pairs other than the first have no IPv6 VIP in the lab).
const ROUTES4: &str = r#"routes:
  - {destination: 0.0.0.0/0, gateway: "{gateway}", table: 10{k}, source: "{vip}"}
rules:
  - {from: "{vip}/32", table: 10{k}, priority: 100{k}}
"#;

fn lab(opts: PairOptions) -> Option<AgentLab> {
    havip_e2e::agent::lab_for_test(module_path!(), PairOptions { forwarding: true, echo_listeners: true, ..opts })
}

fn wait(lab: &AgentLab, what: &str, timeout: Duration, cond: impl FnMut() -> bool) -> Duration {
    lab.wait_for(what, timeout, cond)
}

/// The gateway of the lab's IPv4 VIP subnet.
fn vip_gateway(lab: &AgentLab) -> String {
    lab.topo.gateway().ip.to_string()
}

fn json(ns: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let out = match netns::exec(ns, "ip", args) {
        Ok(out) => out,
        // A table that never had a route: nothing in it.
        Err(e) if e.to_string().contains("table does not exist") => return Vec::new(),
        Err(e) => panic!("ip {args:?} in {ns}: {e}"),
    };
    if out.trim().is_empty() {
        return Vec::new();
    }
    serde_json::from_str::<serde_json::Value>(&out)
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}: {out}"))
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// What member `i` carries in slot `k` (table 10k, priority 100k): its havip routes
/// (protocol 104, both families) in the table and the rules of that priority.
#[derive(Debug, PartialEq, Eq)]
struct Carried {
    routes: Vec<serde_json::Value>,
    rules: Vec<serde_json::Value>,
}

impl Carried {
    fn of(lab: &AgentLab, i: usize, k: usize) -> Self {
        let ns = &lab.topo.node(i).ns;
        let table = (100 + k).to_string();
        let mut routes = Vec::new();
        let mut rules = Vec::new();
        for family in ["-4", "-6"] {
            routes.extend(json(ns, &["-j", family, "route", "show", "table", &table, "proto", "104"]));
            rules.extend(
                json(ns, &["-j", family, "rule", "show"])
                    .into_iter()
                    .filter(|r| r["priority"].as_u64() == Some(1000 + k as u64)),
            );
        }
        Self { routes, rules }
    }

    /// Exactly the default routes and rules of pair `pair`'s VIPs (IPv6 too when `v6`),
    /// each once, in table `table`.
    fn exactly(&self, lab: &AgentLab, pair: usize, v6: bool, table: usize) -> bool {
        let mut want = vec![(lab.vip_addr(lab.pair_vip(pair, 0)).to_string(), lab.topo.gateway().ip.to_string())];
        if v6 {
            want.push((lab.topo.vip6(0).to_string(), lab.topo.gateway().ip6.to_string()));
        }
        let table = (100 + table).to_string();
        let route = |src: &str, gw: &str| {
            self.routes.iter().filter(|r| r["dst"] == "default" && r["prefsrc"] == src && r["gateway"] == gw).count()
                == 1
        };
        let rule = |src: &str| {
            self.rules
                .iter()
                .filter(|r| r["src"] == src && r["table"] == table.as_str() && r["protocol"] == "104")
                .count()
                == 1
        };
        self.routes.len() == want.len()
            && self.rules.len() == want.len()
            && want.iter().all(|(src, gw)| route(src, gw) && rule(src))
    }

    fn none(&self) -> bool {
        self.routes.is_empty() && self.rules.is_empty()
    }
}

/// Waits until `holder` carries every route and rule of pair `k` (in slot `k`) and every
/// other member none of them.
fn wait_carried_by(lab: &AgentLab, k: usize, v6: bool, holder: usize, timeout: Duration) -> Duration {
    wait(lab, &format!("n{holder} alone to carry pair {k}'s routes and rules"), timeout, || {
        (0..2).all(|i| {
            let c = Carried::of(lab, i, k);
            if i == holder { c.exactly(lab, k, v6, k) } else { c.none() }
        })
    })
}

fn assert_carried_by(lab: &AgentLab, holder: usize, when: &str) {
    for i in 0..2 {
        let c = Carried::of(lab, i, 0);
        let ok = if i == holder { c.exactly(lab, 0, true, 0) } else { c.none() };
        assert!(ok, "{when}: n{i} carries {c:?} (n{holder} holds the VIPs)\n{}", lab.diagnostics());
    }
}

/// The holder carries the routes and rules, the standby none; they follow the VIP
/// through a cut of the holder (n1 carries them once it holds the VIP; n0, back, has none),
/// a planned move back to n0, SIGKILL and restart of the holder's agent (they stay, once
/// each: the restarted agent adopts the VIPs and adds nothing twice) and of the standby's.
#[test]
fn routes_and_rules_follow_the_holder_through_a_cut_a_planned_move_and_restarts() {
    let Some(mut lab) = lab(PairOptions { ipv6_vip: true, pair_yaml: Some(ROUTES.to_owned()), ..Default::default() })
    else {
        return;
    };
    lab.wait_sole_holder(0, UP).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    wait_carried_by(&lab, 0, true, 0, UP);
    // What leaves the holder from the VIP is routed by table 100.
    let vip = lab.vip_addr(0).to_string();
    let got = json(&lab.topo.node(0).ns, &["-j", "route", "get", "198.51.100.7", "from", &vip]);
    let first = got.first().unwrap_or_else(|| panic!("no route from the VIP: {got:?}"));
    assert_eq!(
        (first["table"].as_str(), first["gateway"].as_str()),
        (Some("100"), Some(vip_gateway(&lab).as_str())),
        "{got:?}"
    );

    // A cut of the holder.
    lab.topo.kill_node_links(0).unwrap();
    wait(&lab, "n1 to hold the VIP", TAKEOVER, || lab.holders(0).is_ok_and(|h| h.contains(&1)));
    let followed =
        wait(&lab, "n1 to carry the routes and rules", TAKEOVER, || Carried::of(&lab, 1, 0).exactly(&lab, 0, true, 0));
    eprintln!("n1 carried the routes and rules {followed:?} after it held the VIP");
    lab.topo.heal_all().unwrap();
    wait(&lab, "n0 back as a standby", UP, || lab.status(0).is_some_and(|s| s["role"] == "Standby"));
    wait_carried_by(&lab, 0, true, 1, TAKEOVER);

    // A planned move back to n0.
    lab.failover_when_ready(1, UP).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    wait(&lab, "n0 to hold the VIP", TAKEOVER, || lab.holders(0).is_ok_and(|h| h == [0]));
    wait_carried_by(&lab, 0, true, 0, TAKEOVER);

    // The holder's agent killed: the routes stay with the VIPs, and the agent that starts
    // again adopts them without adding any twice.
    lab.kill_agent(0);
    assert_carried_by(&lab, 0, "n0's agent killed");
    lab.start_agent(0).unwrap();
    wait(&lab, "n0's agent to hold the VIP again", UP, || lab.status(0).is_some_and(|s| s["role"] == "Active"));
    assert_carried_by(&lab, 0, "n0's agent restarted");
    // The standby's: nothing appears there.
    lab.kill_agent(1);
    lab.start_agent(1).unwrap();
    wait(&lab, "n1's agent back as a standby", UP, || lab.status(1).is_some_and(|s| s["role"] == "Standby"));
    assert_carried_by(&lab, 0, "n1's agent restarted");
    assert_eq!(lab.holders(0).unwrap(), vec![0], "{}", lab.diagnostics());
}

/// Routes added, changed and removed by reconfiguration while n0 holds the VIP: each new
/// configuration is applied without a restart (SIGHUP), the route of the old table goes
/// when the table changes, and none is left when the configuration drops them.
#[test]
fn a_reconfiguration_adds_moves_and_removes_the_holders_routes() {
    let Some(lab) = lab(PairOptions { ipv6_vip: true, ..Default::default() }) else { return };
    lab.wait_sole_holder(0, UP).unwrap_or_else(|e| panic!("{e}\n{}", lab.diagnostics()));
    let apply = |yaml: &str| {
        for i in 0..2 {
            lab.write_config_with(i, yaml).unwrap();
            lab.signal_agent(i, Signal::SIGHUP);
        }
    };
    // Table 100, then table 101 (slot 1).
    apply(&lab.substitute(&ROUTES.replace("{k}", "0"), 0));
    wait_carried_by(&lab, 0, true, 0, UP);
    apply(&lab.substitute(&ROUTES.replace("{k}", "1"), 0));
    wait(&lab, "the routes and rules to move from table 100 to table 101", UP, || {
        Carried::of(&lab, 0, 0).none() && Carried::of(&lab, 0, 1).exactly(&lab, 0, true, 1)
    });
    assert!(Carried::of(&lab, 1, 1).none(), "the standby carries none\n{}", lab.diagnostics());
    apply("");
    wait(&lab, "the routes and rules to go", UP, || Carried::of(&lab, 0, 1).none());
    assert_eq!(lab.holders(0).unwrap(), vec![0], "the VIP stays where it was\n{}", lab.diagnostics());
}

/// Two pairs with routes of their own (tables 100 and 101) held by n0. Pair 1 removed
/// from n0's configuration while its agent is down: the agent that starts again removes
/// pair 1's routes and rules (its ledger recorded them) and keeps pair 0's.
#[test]
fn a_pair_that_leaves_the_node_leaves_no_route_or_rule() {
    let Some(mut lab) = lab(PairOptions { pairs: 2, pair_yaml: Some(ROUTES4.to_owned()), ..Default::default() }) else {
        return;
    };
    for k in 0..2 {
        wait(&lab, &format!("n0 holds pair {k}"), UP, || lab.pair_holders(k).is_ok_and(|h| h == vec![0]));
        wait_carried_by(&lab, k, false, 0, UP);
    }
    lab.kill_agent(0);
    let only_pair_0 = lab.config_files(0)[..1].to_vec();
    let _agent = lab.spawn_agent(0, "agent-0-only", &only_pair_0, &[]).expect("start n0 with pair 0");
    wait(&lab, "pair 1's routes and rules to go from n0", UP, || Carried::of(&lab, 0, 1).none());
    wait(&lab, "n0 to serve pair 0 again", UP, || lab.pair_status(0, 0).is_some());
    assert!(Carried::of(&lab, 0, 0).exactly(&lab, 0, false, 0), "pair 0's stay\n{}", lab.diagnostics());
    assert_eq!(lab.pair_holders(0).unwrap(), vec![0], "pair 0 stays where it was\n{}", lab.diagnostics());
}
