//! The FloatingIP status tells the truth, end to end on the local control plane with
//! the operator and an agent per node namespace: `kubectl wait --for=condition=Ready`
//! works; the holder's interface and MAC are named; a foreign host answering for the
//! address is named by its MAC (state and condition `Conflict`) and forgotten when it
//! stops; when nobody holds the VIP, no holder is named and the state reads `Pending`.
//! `make e2e` runs it (root).

use havip_crds::{FloatingIP, MemberRole, VipState};
use havip_e2e::kubelab::{KubeLab, KubeLabOptions};
use havip_e2e::netns::{self, Link};
use kube::api::Api;
use std::time::{Duration, Instant};

const PAIR: &str = "web";
const FIP: &str = "web-vip";

fn condition<'a>(
    f: &'a FloatingIP,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    f.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

/// Waits until the FloatingIP satisfies `pred`; panics with its status and the logs.
fn wait_fip(lab: &KubeLab, what: &str, timeout: Duration, pred: impl Fn(&FloatingIP) -> bool) -> FloatingIP {
    lab.block_on(async {
        let api: Api<FloatingIP> = Api::all(lab.client().await.expect("client"));
        let deadline = Instant::now() + timeout;
        loop {
            let f = api.get(FIP).await.ok();
            if let Some(f) = f.as_ref().filter(|f| pred(f)) {
                return f.clone();
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}; FloatingIP status: {}\n{}",
                serde_json::to_string(&f.and_then(|f| f.status)).unwrap_or_default(),
                lab.logs_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

#[test]
fn the_floating_ip_status_names_its_holder_a_foreign_host_and_nobody() {
    if !netns::skip_unless_root(module_path!()) {
        return;
    }
    havip_e2e::init_tracing();
    // The lab's nodes serve the pair's probe port from the start.
    let lab = KubeLab::start(KubeLabOptions {
        nodes: 2,
        operator: true,
        dir: None,
        chart_rbac: false,
        bgp: None,
        ..Default::default()
    })
    .expect("lab");
    lab.block_on(lab.apply(&lab.pair_yaml(PAIR))).expect("apply the pair");
    lab.block_on(lab.wait_pair(PAIR, Duration::from_secs(10), "n0 active", |p| {
        p.status.as_ref().and_then(|s| s.active.as_deref()) == Some("n0")
    }))
    .expect("live");

    // `kubectl wait` on the Ready condition.
    let (ok, out) = lab.kubectl(&["wait", "--for=condition=Ready", &format!("floatingip/{FIP}"), "--timeout=15s"]);
    assert!(ok, "kubectl wait --for=condition=Ready: {out}\n{}", lab.logs_tail(30));
    let f = wait_fip(&lab, "the holder's fields", Duration::from_secs(5), |f| {
        f.status.as_ref().is_some_and(|s| s.holder_mac.is_some())
    });
    let st = f.status.clone().expect("status");
    let n0 = lab.topo.node(0).clone();
    assert_eq!(st.holder.as_deref(), Some("n0"));
    assert_eq!(st.state, Some(VipState::Announced));
    assert_eq!(st.interface.as_deref(), Some(n0.data_if.as_str()));
    assert_eq!(st.holder_mac.as_deref(), Some(n0.data_mac.as_str()), "the MAC of n0's eth0");
    assert_eq!(st.conflict_mac, None);
    assert_eq!(st.observed_generation, f.metadata.generation, "the operator's conditions describe this spec");
    assert_eq!(condition(&f, "Accepted").map(|c| c.status.as_str()), Some("True"));
    assert_eq!(condition(&f, "Conflict").map(|c| c.status.as_str()), Some("False"));
    let (ok, out) = lab.kubectl(&["get", "fip", FIP]);
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert!(ok && row.get(3..6) == Some(&["n0", "Announced", "True"][..]), "kubectl get fip:\n{out}");

    // A foreign host (the client) takes the address too: n0 names it by its MAC.
    let vip = lab.topo.vip(0);
    let client = lab.topo.client().clone();
    netns::exec(&client.ns, "ip", &["addr", "add", &format!("{vip}/32"), "dev", &client.ifname]).expect("claim");
    let f = wait_fip(&lab, "state Conflict naming the client's MAC", Duration::from_secs(20), |f| {
        f.status.as_ref().is_some_and(|s| {
            s.state == Some(VipState::Conflict) && s.conflict_mac.as_deref() == Some(client.mac.as_str())
        }) && condition(f, "Conflict").is_some_and(|c| c.status == "True" && c.message.contains(&client.mac))
    });
    let ready = condition(&f, "Ready").expect("Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "VipConflict"), "{ready:?}");
    assert_eq!(f.status.as_ref().and_then(|s| s.holder.as_deref()), Some("n0"), "n0 keeps it");
    netns::exec(&client.ns, "ip", &["addr", "del", &format!("{vip}/32"), "dev", &client.ifname]).expect("release");
    let f = wait_fip(&lab, "the conflict forgotten", Duration::from_secs(30), |f| {
        f.status.as_ref().is_some_and(|s| s.state == Some(VipState::Announced) && s.conflict_mac.is_none())
            && condition(f, "Ready").is_some_and(|c| c.status == "True")
    });
    assert_eq!(condition(&f, "Conflict").map(|c| c.status.as_str()), Some("False"));

    // Nobody holds it: n1 in maintenance, n0's data link loses carrier, n0 gives the
    // VIP up (no ready standby) while it still reaches the API server on its other link.
    let (ok, out) = lab.plugin(&["maintenance", PAIR, "n1", "on"]);
    assert!(ok, "{out}");
    lab.block_on(lab.wait_pair(PAIR, Duration::from_secs(10), "n1 in maintenance", |p| {
        p.status
            .as_ref()
            .is_some_and(|s| s.members.iter().any(|m| m.node == "n1" && m.role == Some(MemberRole::Maintenance)))
    }))
    .expect("maintenance");
    lab.topo.cut_cable(0, Link::Data).expect("cut n0's data link");
    // (The state and the conditions are two writes: wait for both.)
    let f = wait_fip(&lab, "no holder, state Pending, not Ready", Duration::from_secs(60), |f| {
        f.status.as_ref().is_some_and(|s| s.holder.is_none() && s.state == Some(VipState::Pending))
            && condition(f, "Ready").is_some_and(|c| c.status == "False")
    });
    let st = f.status.clone().expect("status");
    assert_eq!((&st.holder_mac, st.epoch, &st.interface), (&None, None, &None), "no holder fields: {st:?}");
    let ready = condition(&f, "Ready").expect("Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "NotHeld"), "{ready:?}");
    assert_eq!(lab.holders().expect("holders"), Vec::<usize>::new(), "no node has the VIP");

    // Back: the link returns, n1 leaves maintenance; somebody holds it again.
    lab.topo.restore_cable(0, Link::Data).expect("restore");
    let (ok, out) = lab.plugin(&["maintenance", PAIR, "n1", "off"]);
    assert!(ok, "{out}");
    let f = wait_fip(&lab, "held and Ready again", Duration::from_secs(60), |f| {
        condition(f, "Ready").is_some_and(|c| c.status == "True")
    });
    let holder = f.status.and_then(|s| s.holder).expect("holder");
    assert!(holder == "n0" || holder == "n1", "{holder}");
}
