//! Scenarios only a real kubelet can run, on the kind provider after the shared
//! [`crate::scenarios`]: the agent DaemonSet rolled, the operator's leader pod deleted,
//! a node drained, the chart upgraded with a changed value and uninstalled, a Service of
//! type LoadBalancer with a Deployment behind kube-proxy, and the holder's kubelet
//! restarted.
//!
//! The agent pod deleted on the active is the shared scenario
//! `agent_restart_on_the_active_loses_no_connect_and_moves_nothing` (on kind, an agent
//! restart is exactly that).

use crate::harness::cluster::{Cluster, Result};
use crate::harness::kind::{KindCluster, NAMESPACE, PREVIOUS_TAG};
use crate::scenarios::{self, PAIR};
use havip_crds::{HAPair, MemberRole, Phase};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

/// What a scenario is expected to do today.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// It passes.
    Pass,
    /// It fails until the named behaviour is implemented; the suite reports it as
    /// `xfail` and does not fail for it, and fails when it passes (`xpass`: remove the
    /// marker).
    FailUntilImplemented(&'static str),
}

/// A kubelet-level scenario.
pub struct KindScenario {
    /// Its name.
    pub name: &'static str,
    /// What it is expected to do.
    pub expect: Expect,
    /// Runs it (panics with a message when something is wrong).
    pub run: fn(&mut KindCluster),
}

/// Every kubelet-level scenario, in the order the suite runs them (the uninstall last).
pub fn all() -> Vec<KindScenario> {
    vec![
        KindScenario {
            name: "agent_daemonset_rollout_restart_loses_no_connect_and_moves_nothing",
            expect: Expect::Pass,
            run: rollout_restart,
        },
        KindScenario {
            name: "operator_leader_pod_deleted_a_follower_leads_and_a_failover_still_works",
            expect: Expect::Pass,
            run: operator_leader_deleted,
        },
        KindScenario {
            name: "drained_active_hands_over_before_its_agent_stops",
            expect: Expect::Pass,
            run: drain_active,
        },
        KindScenario {
            name: "helm_upgrade_with_a_changed_value_rolls_without_a_failed_connect",
            expect: Expect::Pass,
            run: helm_upgrade,
        },
        KindScenario {
            name: "load_balancer_service_with_external_traffic_policy_local_follows_its_endpoint",
            expect: Expect::Pass,
            run: load_balancer_local,
        },
        KindScenario {
            name: "bgp_with_the_charts_in_pod_frr_routes_the_vip_to_its_holder_and_moves_on_a_cut",
            expect: Expect::Pass,
            run: super::kind_bgp::in_pod_frr,
        },
        KindScenario {
            name: "kubelet_restarted_on_the_holder_keeps_its_internal_ip_and_the_vip_stays",
            expect: Expect::Pass,
            run: kubelet_restart_on_the_holder,
        },
        KindScenario {
            name: "helm_upgrade_from_the_previous_release_with_skewed_versions_loses_no_connect",
            expect: Expect::Pass,
            run: upgrade_from_the_previous_release,
        },
        KindScenario { name: "helm_uninstall_leaves_no_vip_on_any_node", expect: Expect::Pass, run: helm_uninstall },
    ]
}

/// The shared reset plus what these scenarios change: cordons and chart values.
pub fn reset(c: &mut KindCluster) -> Result<()> {
    c.restore_baseline()?;
    scenarios::reset(c)
}

fn node(c: &KindCluster, i: usize) -> String {
    c.nodes().get(i).cloned().unwrap_or_else(|| panic!("the cluster has no node {i}"))
}

fn active(p: &HAPair) -> Option<String> {
    p.status.as_ref().and_then(|s| s.active.clone())
}

fn member_active_under(p: &HAPair, node: &str, epoch: i64) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.members.iter().any(|m| m.node == node && m.role == Some(MemberRole::Active) && m.epoch == Some(epoch))
    })
}

/// `kubectl rollout restart daemonset/havip-agent`: every agent replaced, one node at a
/// time; the VIP stays where it is and no client connect fails.
fn rollout_restart(c: &mut KindCluster) {
    let (_, e) = scenarios::live_pair(c, 2, "");
    let n0 = node(c, 0);
    let before = c.agent_pods().expect("agent pods");
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    c.kubectl_run(&["-n", NAMESPACE, "rollout", "restart", "daemonset/havip-agent"]).expect("rollout restart");
    c.kubectl_run(&["-n", NAMESPACE, "rollout", "status", "daemonset/havip-agent", "--timeout=300s"])
        .expect("rollout finished");
    // `rollout status` returns once every new pod is available; the last old pod's
    // object may still be terminating (its container already stopped): wait for it.
    let start = Instant::now();
    let after = loop {
        let after = c.agent_pods().expect("agent pods");
        if after.iter().all(|p| !before.contains(p)) {
            break after;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "every agent pod replaced: before {before:?}, after {after:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(after.len(), before.len(), "one agent per node: {after:?}");
    c.wait_pair(PAIR, Duration::from_secs(30), &format!("n0 Active under epoch {e}"), |p| {
        member_active_under(p, &n0, e)
    })
    .expect("n0 still active");
    // Keep probing a little after the rollout: late failures count too.
    std::thread::sleep(Duration::from_millis(500));
    let report = client.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
    assert_eq!(report.responder_sequence(), vec![n0.as_str()], "nothing moved: {}", report.summary());
    assert_eq!(c.lease(PAIR).expect("lease"), (Some(n0), e));
}

/// The operator's leader pod deleted: it releases the leader Lease on SIGTERM, a
/// follower takes it, and a planned failover right after works (0 failed connects).
fn operator_leader_deleted(c: &mut KindCluster) {
    scenarios::live_pair(c, 2, "");
    let (n0, n1) = (node(c, 0), node(c, 1));
    let leader = c.operator_leader().expect("leader Lease").expect("a leader");
    c.kubectl_run(&["-n", NAMESPACE, "delete", "pod", &leader, "--wait=true"]).expect("delete the leader pod");
    let start = Instant::now();
    let new_leader = loop {
        match c.operator_leader() {
            Ok(Some(l)) if l != leader => break l,
            other => {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "no new leader 30 s after {leader} was deleted: {other:?}\n{}",
                    c.logs_tail(30)
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    tracing::info!(%leader, %new_leader, seconds = start.elapsed().as_secs_f64(), "a follower leads");
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    let (ok, out) = c.plugin(&["failover", PAIR]);
    assert!(ok, "plugin failover under the new leader: {out}\n{}", c.logs_tail(30));
    client.wait_for_responder(&n1, Duration::from_secs(5)).expect("n1 answers");
    c.wait_pair(PAIR, Duration::from_secs(15), "FailedOver with n1 active", |p| {
        p.status.as_ref().and_then(|s| s.phase) == Some(Phase::FailedOver) && active(p).as_deref() == Some(n1.as_str())
    })
    .expect("failed over");
    std::thread::sleep(Duration::from_millis(300));
    let report = client.stop().expect("report");
    // A planned move: no failed connect but at most one whose handshake straddled the
    // flip (README: a planned move does not drain connections).
    assert!(report.failed <= 1 && report.failures_beyond_the_flip(20.0).is_empty(), "{}", report.summary());
    c.kubectl_run(&["-n", NAMESPACE, "rollout", "status", "deployment/havip-operator", "--timeout=120s"])
        .expect("the Deployment replaced the deleted replica");
}

/// `kubectl drain` of the active's node: the drain itself leaves the agent (a DaemonSet
/// pod) and the VIP alone; when the agent then stops (the node shuts down: SIGTERM) on
/// the cordoned node, it hands the VIP over first — make-before-break, no failed connect.
fn drain_active(c: &mut KindCluster) {
    scenarios::live_pair(c, 2, "");
    let (n0, n1) = (node(c, 0), node(c, 1));
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    c.kubectl_run(&["drain", &n0, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=180s"]).expect("drain");
    assert_eq!(c.holders().expect("holders"), vec![0], "the drain alone moves nothing");
    c.restart_agent(0).expect("stop the drained node's agent (SIGTERM)");
    c.wait_pair(PAIR, Duration::from_secs(15), "FailedOver with n1 active", |p| {
        p.status.as_ref().and_then(|s| s.phase) == Some(Phase::FailedOver) && active(p).as_deref() == Some(n1.as_str())
    })
    .expect("handed over");
    std::thread::sleep(Duration::from_millis(300));
    let report = client.stop().expect("report");
    // A planned move: no failed connect but at most one whose handshake straddled the
    // flip (README: a planned move does not drain connections).
    assert!(report.failed <= 1 && report.failures_beyond_the_flip(20.0).is_empty(), "{}", report.summary());
    assert_eq!(report.responder_sequence(), vec![n0.as_str(), n1.as_str()], "{}", report.summary());
    assert_eq!(c.holders().expect("holders"), vec![1]);
}

/// `helm upgrade` with a changed value (the log format of both components: new pod
/// templates, so both roll): the VIP stays, no connect fails, the new value is live.
fn helm_upgrade(c: &mut KindCluster) {
    let (_, e) = scenarios::live_pair(c, 2, "");
    let n0 = node(c, 0);
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    c.helm_upgrade(&["agent.logFormat=text", "operator.logFormat=text"]).expect("helm upgrade");
    c.kubectl_run(&["-n", NAMESPACE, "rollout", "status", "daemonset/havip-agent", "--timeout=300s"])
        .expect("agents rolled");
    let env = c
        .kubectl_run(&[
            "-n",
            NAMESPACE,
            "get",
            "daemonset/havip-agent",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].env[?(@.name==\"HAVIP_LOG_FORMAT\")].value}",
        ])
        .expect("agent env");
    assert_eq!(env.trim(), "text", "the new value reached the DaemonSet");
    c.wait_pair(PAIR, Duration::from_secs(30), &format!("n0 Active under epoch {e}"), |p| {
        member_active_under(p, &n0, e)
    })
    .expect("n0 still active");
    std::thread::sleep(Duration::from_millis(500));
    let report = client.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
    assert_eq!(report.responder_sequence(), vec![n0.as_str()], "nothing moved: {}", report.summary());
}

/// The Node's addresses as `Type=address` lines.
fn node_addresses(c: &KindCluster, node: &str) -> Vec<String> {
    let out = c
        .kubectl_run(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={range .status.addresses[*]}{.type}={.address}{\"\\n\"}{end}",
        ])
        .expect("node addresses");
    out.lines().map(str::to_owned).filter(|l| !l.is_empty()).collect()
}

/// When the Node's Ready condition was last posted by its kubelet.
fn ready_heartbeat(c: &KindCluster, node: &str) -> String {
    c.kubectl_run(&["get", "node", node, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].lastHeartbeatTime}"])
        .expect("node conditions")
        .trim()
        .to_owned()
}

/// The holder's kubelet restarted while the VIP sits on the node's eth0 (after the node's
/// own address): the restarted kubelet posts the Node's status again with the same
/// InternalIP, never the VIP, and the VIP neither moves nor misses a connect (README, "VIPs
/// are not the node's address").
fn kubelet_restart_on_the_holder(c: &mut KindCluster) {
    let (_, e) = scenarios::live_pair(c, 2, "");
    let n0 = node(c, 0);
    let vip = c.vip().0.to_string();
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    let eth0 = crate::harness::kind::run(&crate::harness::kind::KindConfig::addresses(&n0)).expect("n0's addresses");
    assert!(eth0.contains(&format!(" {vip}/")), "n0 holds the VIP on eth0: {eth0}");
    let before = node_addresses(c, &n0);
    assert!(before.iter().any(|a| a.starts_with("InternalIP=")), "n0 has an InternalIP: {before:?}");
    assert!(!before.iter().any(|a| a.ends_with(&format!("={vip}"))), "the VIP is not a Node address: {before:?}");
    let posted = ready_heartbeat(c, &n0);
    let restart = ["docker", "exec", n0.as_str(), "systemctl", "restart", "kubelet"].map(str::to_owned);
    crate::harness::kind::run(&restart).expect("restart n0's kubelet");
    // The restarted kubelet posts the Node's status at once (its first sync).
    let start = Instant::now();
    while ready_heartbeat(c, &n0) == posted {
        assert!(start.elapsed() < Duration::from_secs(90), "n0's restarted kubelet never posted its status");
        std::thread::sleep(Duration::from_millis(500));
    }
    let after = node_addresses(c, &n0);
    assert_eq!(after, before, "the restarted kubelet reports the same addresses (the VIP {vip} is held on eth0)");
    std::thread::sleep(Duration::from_millis(500));
    let report = client.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
    assert_eq!(report.responder_sequence(), vec![n0.as_str()], "nothing moved: {}", report.summary());
    assert_eq!(c.lease(PAIR).expect("lease"), (Some(n0), e));
}

/// The images a component's pods run (`operator`, `agent`), terminating pods included.
fn pod_images(c: &KindCluster, component: &str) -> Vec<String> {
    let out = c.pods_of(component, "{range .items[*]}{.spec.containers[0].image}{\"\\n\"}{end}").expect("pod images");
    out.lines().map(str::to_owned).collect()
}

/// Waits until every pod of `component` runs an image tagged `tag`.
fn wait_pod_images(c: &KindCluster, component: &str, tag: &str) {
    let start = Instant::now();
    loop {
        let images = pod_images(c, component);
        if !images.is_empty() && images.iter().all(|i| i.ends_with(&format!(":{tag}"))) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(180), "the {component} pods never all ran :{tag}: {images:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The names of the pods in the chart's namespace that match `selector`, with `extra`
/// flags for `kubectl get` (none when kubectl fails: the callers wait or report).
fn pod_names(c: &KindCluster, selector: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["-n", NAMESPACE, "get", "pods", "-l", selector];
    args.extend_from_slice(extra);
    args.extend(["-o", "jsonpath={.items[*].metadata.name}"]);
    c.kubectl_run(&args).map(|o| o.split_whitespace().map(str::to_owned).collect()).unwrap_or_default()
}

/// Waits until a running operator pod holds the leader-election Lease.
fn wait_operator_leader(c: &KindCluster) {
    let start = Instant::now();
    loop {
        let pods = pod_names(c, "app.kubernetes.io/component=operator", &["--field-selector=status.phase=Running"]);
        let leader = c.operator_leader().ok().flatten().unwrap_or_default();
        if !leader.is_empty() && pods.iter().any(|p| leader.starts_with(p.as_str())) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no operator pod of {pods:?} leads (Lease holder {leader:?})"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The ERROR lines the havip pods logged in the last `since` (JSON or text format).
fn error_lines(c: &KindCluster, since: Duration) -> Vec<String> {
    let since = format!("--since={}s", since.as_secs() + 1);
    let mut out = Vec::new();
    let pods = pod_names(c, "app.kubernetes.io/name=havip", &[]);
    assert!(!pods.is_empty(), "no havip pod listed: nothing to read the logs of");
    for pod in &pods {
        let Ok(log) = c.kubectl_run(&["-n", NAMESPACE, "logs", pod, "--all-containers", &since]) else { continue };
        out.extend(
            log.lines()
                .filter(|l| l.contains("\"level\":\"ERROR\"") || l.contains(" ERROR "))
                .map(|l| format!("{pod}: {l}")),
        );
    }
    out
}

/// Every `spec` property path (`a.b.c`) of each CRD in a CRD file, by CRD name.
fn crd_spec_properties(yaml: &str) -> std::collections::BTreeSet<String> {
    fn walk(prefix: &str, schema: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
        for (k, v) in schema["properties"].as_object().into_iter().flatten() {
            let path = format!("{prefix}.{k}");
            out.insert(path.clone());
            walk(&path, v, out);
            walk(&format!("{path}[]"), &v["items"], out);
        }
    }
    let mut out = std::collections::BTreeSet::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let Ok(v) = <serde_json::Value as serde::Deserialize>::deserialize(doc) else { continue };
        let name = v["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        for ver in v["spec"]["versions"].as_array().into_iter().flatten() {
            walk(&name, &ver["schema"]["openAPIV3Schema"], &mut out);
        }
    }
    out
}

fn crd_dir_properties(dir: &std::path::Path) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        out.extend(crd_spec_properties(&std::fs::read_to_string(e.path()).expect("a CRD file")));
    }
    out
}

/// The previous release (`hack/previous-release.sh`: the chart, CRDs and images of a
/// pinned earlier commit, built here) installed as a user has it, then upgraded to this
/// release the way the README's upgrade section says, with a client on the VIP throughout
/// and the versions held skewed on purpose each way: the previous operator with this
/// release's agents (the operator's rollout paused while the agents roll), then this
/// release's operator with the previous agents (the agents rolled back, the operator
/// resumed), then everything new. Throughout: 0 failed connects, the VIP never moves,
/// its epoch stays, the pair keeps its active and its standby, and no pod logs an ERROR;
/// the CRD fields the previous release lacked are in the cluster after the CRD step.
fn upgrade_from_the_previous_release(c: &mut KindCluster) {
    let prev = c.cfg.previous.clone().unwrap_or_else(|| {
        panic!("no previous release: hack/kind-e2e.sh builds it (hack/previous-release.sh; kind-e2e --previous-release DIR)")
    });
    let tag = c.cfg.tag.clone();
    let this_chart = c.cfg.repo.join("charts/havip");
    let this_crds = this_chart.join("charts/crds/crds");
    // The previous release as a user has it: its chart installed on a cluster without
    // CRDs (so that helm creates them, as it did for the user), its images.
    c.helm_uninstall().expect("helm uninstall");
    for crd in ["hapairs.havip.io", "floatingips.havip.io", "vippools.havip.io"] {
        c.kubectl_run(&["delete", "crd", crd, "--ignore-not-found", "--wait"]).expect("delete the CRD");
    }
    c.helm_install_from(&prev.join("chart"), PREVIOUS_TAG, true).expect("install the previous release");
    wait_pod_images(c, "operator", PREVIOUS_TAG);
    wait_pod_images(c, "agent", PREVIOUS_TAG);
    // The uninstalled operator's leader Lease outlives it: a fresh replica leads once it
    // has expired.
    wait_operator_leader(c);
    let (_, e) = scenarios::live_pair(c, 2, "");
    let (n0, n1) = (node(c, 0), node(c, 1));
    // A second pair on the same two nodes: while agents of both releases run side by side
    // an upgraded agent must speak the single-pair format to a previous one (a bundle
    // would be dropped there, its standby would take over), and bundle with an upgraded one.
    let second = c.pair_yaml_on(SECOND_PAIR, &[0, 1], 1, 8081).expect("the second pair's manifest");
    c.apply_yaml(&second).expect("apply the second pair");
    let e2 = c
        .wait_pair(SECOND_PAIR, Duration::from_secs(30), &format!("Live, {n0} active"), |p| {
            p.status.as_ref().is_some_and(|s| s.phase == Some(Phase::Live)) && active(p).as_deref() == Some(n0.as_str())
        })
        .unwrap_or_else(|err| panic!("{SECOND_PAIR}: {err}\n{}", c.logs_tail(40)))
        .status
        .and_then(|s| s.epoch)
        .unwrap_or_else(|| panic!("{SECOND_PAIR} is Live without an epoch"));
    let client = c.client().expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(5)).expect("n0 answers");
    let steady = |c: &KindCluster, what: &str| {
        for (pair, e) in [(PAIR, e), (SECOND_PAIR, e2)] {
            c.wait_pair(
                pair,
                Duration::from_secs(60),
                &format!("{what}: {n0} Active under epoch {e}, {n1} Standby"),
                |p| {
                    member_active_under(p, &n0, e)
                        && p.status.as_ref().is_some_and(|s| {
                            s.members.iter().any(|m| m.node == n1 && m.role == Some(MemberRole::Standby))
                        })
                },
            )
            .unwrap_or_else(|err| panic!("{what}, pair {pair}: {err}\n{}", c.logs_tail(40)));
        }
    };

    // README, step 3: this release's CRDs first (server-side apply, as written there).
    let started = Instant::now();
    let before = crd_dir_properties(&prev.join("crds"));
    let now = crd_dir_properties(&this_crds);
    let crds = this_crds.display().to_string();
    // Without --force-conflicts it is refused: helm's field manager owns the CRDs it created
    // (the README says so, and this shows it still holds).
    let refused = c.kubectl_run(&["apply", "--server-side", "-f", &crds]);
    assert!(
        refused.as_ref().is_err_and(|e| e.to_string().contains("conflict with \"helm\"")),
        "a server-side apply without --force-conflicts over helm's CRDs: {refused:?}"
    );
    c.kubectl_run(&["apply", "--server-side", "--force-conflicts", "-f", &crds]).expect("the README's CRD step");
    let live = c.kubectl_run(&["get", "crd", "-o", "yaml"]).expect("the cluster's CRDs");
    let live: serde_json::Value = serde_yaml::from_str(&live).expect("CRD list");
    let mut applied = std::collections::BTreeSet::new();
    for item in live["items"].as_array().into_iter().flatten() {
        applied.extend(crd_spec_properties(&serde_yaml::to_string(item).expect("yaml")));
    }
    let added: Vec<&String> = now.difference(&before).collect();
    let missing: Vec<&&String> = added.iter().filter(|p| !applied.contains(**p)).collect();
    assert!(missing.is_empty(), "CRD fields of this release missing in the cluster after the CRD step: {missing:?}");
    tracing::info!(added = added.len(), "CRD fields the previous release lacked are in the cluster");

    // The previous operator with this release's agents: the operator's rollout paused,
    // the chart upgraded, the agents rolled.
    c.kubectl_run(&["-n", NAMESPACE, "rollout", "pause", "deployment/havip-operator"]).expect("pause");
    c.helm_install_from(&this_chart, &tag, false).expect("helm upgrade to this release");
    c.kubectl_run(&["-n", NAMESPACE, "rollout", "status", "daemonset/havip-agent", "--timeout=300s"])
        .expect("agents rolled");
    wait_pod_images(c, "agent", &tag);
    assert!(pod_images(c, "operator").iter().all(|i| i.ends_with(&format!(":{PREVIOUS_TAG}"))), "the operator rolled");
    steady(c, "previous operator, new agents");
    for i in [0, 1] {
        wait_bundles(c, i);
    }
    let errors = error_lines(c, started.elapsed());
    assert!(errors.is_empty(), "previous operator, new agents: {errors:#?}");

    // Agents of both releases side by side for as long as it takes to look: the agents'
    // DaemonSet set to update on delete and rolled back, then only the standby's pod
    // replaced. n0 (this release) must send n1 (the previous one, which would drop a
    // bundle) single-pair heartbeats: both pairs stay put, every member hears its peer,
    // and n0 sends no bundle.
    let started = Instant::now();
    set_agent_update_strategy(c, "OnDelete");
    c.kubectl_run(&["-n", NAMESPACE, "rollout", "undo", "daemonset/havip-agent"]).expect("roll the agents back");
    replace_agent_pod(c, &n1, PREVIOUS_TAG);
    let bundles = |c: &KindCluster| {
        c.agent_metric(0, "havip_agent_heartbeat_datagrams_sent_total", &["name=\"bundle\""]).expect("n0's metrics")
    };
    let before = bundles(c);
    for what in ["mixed releases", "mixed releases, 5 s later"] {
        steady(c, what);
        for pair in [PAIR, SECOND_PAIR] {
            c.wait_pair(pair, Duration::from_secs(20), &format!("{what}: every member hears its peer"), |p| {
                p.status.as_ref().is_some_and(|s| {
                    s.members.len() == 2
                        && s.members.iter().all(|m| !m.heard.is_empty() && m.heard.iter().all(|h| h.heard))
                })
            })
            .unwrap_or_else(|err| panic!("pair {pair}: {err}\n{}", c.logs_tail(40)));
        }
        std::thread::sleep(Duration::from_secs(5));
    }
    let after = bundles(c);
    assert_eq!(after, before, "{n0} (this release) sent {} bundles to {n1} (the previous release)", after - before);

    // This release's operator with the previous agents: the other agents rolled back too,
    // then the operator's rollout resumed.
    let agent_nodes = c.pods_of("agent", "{.items[*].spec.nodeName}").expect("the agents' nodes");
    for n in agent_nodes.split_whitespace() {
        replace_agent_pod(c, n, PREVIOUS_TAG);
    }
    set_agent_update_strategy(c, "RollingUpdate");
    wait_pod_images(c, "agent", PREVIOUS_TAG);
    c.kubectl_run(&["-n", NAMESPACE, "rollout", "resume", "deployment/havip-operator"]).expect("resume");
    c.kubectl_run(&["-n", NAMESPACE, "rollout", "status", "deployment/havip-operator", "--timeout=300s"])
        .expect("operator rolled");
    wait_pod_images(c, "operator", &tag);
    steady(c, "new operator, previous agents");
    let errors = error_lines(c, started.elapsed());
    assert!(errors.is_empty(), "new operator, previous agents: {errors:#?}");

    // Everything of this release.
    let started = Instant::now();
    c.helm_install_from(&this_chart, &tag, true).expect("helm upgrade, all new");
    c.kubectl_run(&["-n", NAMESPACE, "rollout", "status", "daemonset/havip-agent", "--timeout=300s"])
        .expect("agents rolled");
    wait_pod_images(c, "agent", &tag);
    wait_pod_images(c, "operator", &tag);
    steady(c, "all new");
    let errors = error_lines(c, started.elapsed());
    assert!(errors.is_empty(), "all new: {errors:#?}");
    std::thread::sleep(Duration::from_millis(500));
    let report = client.stop().expect("report");
    assert_eq!(report.failed, 0, "{}", report.summary());
    assert_eq!(report.responder_sequence(), vec![n0.as_str()], "nothing moved: {}", report.summary());
}

/// The upgrade scenario's second pair (VIP number 1, port 8081, on the first two workers).
const SECOND_PAIR: &str = "db";

/// Sets the agents' DaemonSet's update strategy (`OnDelete`: a changed template replaces
/// a pod only when it is deleted; `RollingUpdate`: the chart's).
fn set_agent_update_strategy(c: &KindCluster, strategy: &str) {
    let patch = if strategy == "RollingUpdate" {
        r#"{"spec":{"updateStrategy":{"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":1}}}}"#.to_owned()
    } else {
        format!(r#"{{"spec":{{"updateStrategy":{{"type":"{strategy}","rollingUpdate":null}}}}}}"#)
    };
    c.kubectl_run(&["-n", NAMESPACE, "patch", "daemonset/havip-agent", "--type=merge", "-p", &patch])
        .unwrap_or_else(|e| panic!("set the agents' update strategy to {strategy}: {e}"));
}

/// Replaces node `node`'s agent pod unless it runs an image tagged `tag` already, and waits
/// until the new one runs `tag` and is ready.
fn replace_agent_pod(c: &KindCluster, node: &str, tag: &str) {
    let selector = ["-n", NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/component=agent"];
    let on_node = format!("--field-selector=spec.nodeName={node}");
    let state = |c: &KindCluster| {
        let mut args = selector.to_vec();
        args.extend([
            on_node.as_str(),
            "-o",
            "jsonpath={range .items[*]}{.spec.containers[0].image} {.status.containerStatuses[0].ready}{\"\\n\"}{end}",
        ]);
        c.kubectl_run(&args).unwrap_or_default()
    };
    let ready = |out: &str| {
        let lines: Vec<&str> = out.lines().collect();
        lines.len() == 1
            && lines[0].split_once(' ').is_some_and(|(i, r)| i.ends_with(&format!(":{tag}")) && r == "true")
    };
    if ready(&state(c)) {
        return;
    }
    c.delete_agent_pod(node).unwrap_or_else(|e| panic!("delete {node}'s agent pod: {e}"));
    let start = Instant::now();
    loop {
        let out = state(c);
        if ready(&out) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "{node}'s agent pod never ran :{tag}, ready: {out:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until node `i`'s agent has sent bundled heartbeats.
fn wait_bundles(c: &KindCluster, i: usize) {
    let start = Instant::now();
    loop {
        let sent = c.agent_metric(i, "havip_agent_heartbeat_datagrams_sent_total", &["name=\"bundle\""]);
        if sent.as_ref().is_ok_and(|n| *n > 0.0) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{}'s agent sends no bundled heartbeat to a peer of this release that shares two pairs with it ({sent:?})\n{}",
            node(c, i),
            c.logs_tail(30)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `helm uninstall`: within 30 s no node holds the VIP any more.
fn helm_uninstall(c: &mut KindCluster) {
    scenarios::live_pair(c, 2, "");
    assert_eq!(c.holders().expect("holders"), vec![0]);
    c.helm_uninstall().expect("helm uninstall");
    let start = Instant::now();
    loop {
        let h = c.holders().expect("holders");
        if h.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "30 s after helm uninstall the VIP {} is still on nodes {:?}",
            c.vip().0,
            h.iter().map(|i| node(c, *i)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The objects of [`load_balancer_local`], for its cleanup.
const LB_OBJECTS: [&str; 3] = ["service/echo", "deployment/echo", "vippool.havip.io/kind-lb"];

fn echo_yaml(c: &KindCluster, node: &str, pool_address: Ipv4Addr) -> String {
    format!(
        r#"apiVersion: havip.io/v1alpha1
kind: VIPPool
metadata: {{name: kind-lb}}
spec:
  pair: {PAIR}
  addresses: ["{pool_address}/32"]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: default}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo}}}}
    spec:
      nodeSelector: {{kubernetes.io/hostname: {node}}}
      containers:
        - name: echo
          image: {image}
          imagePullPolicy: Never
          args: ["respond", "--port", "8080", "--name", "$(NODE_NAME)"]
          env:
            - name: NODE_NAME
              valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
          readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: default}}
spec:
  type: LoadBalancer
  loadBalancerClass: havip.io/l2
  externalTrafficPolicy: Local
  selector: {{app: echo}}
  ports: [{{port: 80, targetPort: 8080, protocol: TCP}}]
"#,
        image = c.tools_image()
    )
}

/// A Service of type LoadBalancer (class havip.io/l2, `externalTrafficPolicy: Local`)
/// with a real Deployment behind kube-proxy: the address from a VIPPool of the pair is
/// the Service's EXTERNAL-IP and answers through kube-proxy from the pod on the active's
/// node; the pod moved to the standby's node, the active's kube-proxy health check fails
/// (no local endpoint) and the pair hands the address over to the node with the pod.
fn load_balancer_local(c: &mut KindCluster) {
    scenarios::live_pair(c, 2, "");
    let (n0, n1) = (node(c, 0), node(c, 1));
    let cleanup = |c: &KindCluster| {
        for o in LB_OBJECTS {
            let _ = c.kubectl_run(&["-n", "default", "delete", o, "--ignore-not-found", "--wait=true"]);
        }
    };
    cleanup(c);
    let (vip, _) = c.vip();
    let address = Ipv4Addr::from(u32::from(vip) + 1);
    c.apply_yaml(&echo_yaml(c, &n0, address)).expect("pool, Deployment and Service");
    c.kubectl_run(&["-n", "default", "rollout", "status", "deployment/echo", "--timeout=120s"]).expect("echo runs");
    let start = Instant::now();
    loop {
        let ip = c
            .kubectl_run(&[
                "-n",
                "default",
                "get",
                "service/echo",
                "-o",
                "jsonpath={.status.loadBalancer.ingress[0].ip}",
            ])
            .unwrap_or_default();
        if ip.trim() == address.to_string() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no EXTERNAL-IP {address} (have {ip:?})\n{}",
            c.logs_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    tracing::info!(%address, seconds = start.elapsed().as_secs_f64(), "EXTERNAL-IP");
    // Through kube-proxy to the pod on n0, from a client on the kind network.
    let client = c.client_for(SocketAddr::from((address, 80))).expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(15)).expect("the pod on n0 answers on the EXTERNAL-IP");
    // The pod moves to n1: n0 keeps no local endpoint, kube-proxy's health check on n0
    // answers 503, and after the listener-down time the pair moves to n1.
    let patch =
        format!(r#"{{"spec":{{"template":{{"spec":{{"nodeSelector":{{"kubernetes.io/hostname":"{n1}"}}}}}}}}}}"#);
    c.kubectl_run(&["-n", "default", "patch", "deployment/echo", "-p", &patch]).expect("move the pod");
    c.kubectl_run(&["-n", "default", "rollout", "status", "deployment/echo", "--timeout=120s"]).expect("echo moved");
    client.wait_for_responder(&n1, Duration::from_secs(40)).expect("the address follows the pod to n1");
    let report = client.stop().expect("report");
    tracing::info!(summary = %report.summary(), "endpoint moved");
    c.wait_pair(PAIR, Duration::from_secs(15), "n1 active", |p| active(p).as_deref() == Some(n1.as_str()))
        .expect("n1 active");
    cleanup(c);
}
