//! The agent's Kubernetes mode against a real API server, without the operator (the
//! test creates what the operator would: the pair Lease and the key Secret).

use havip_e2e::kubelab::{KubeLab, KubeLabOptions, NAMESPACE};
use havip_e2e::netns;
use havip_e2e::traffic::Prober;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use std::time::Duration;

async fn operator_objects(lab: &KubeLab, pair: &str) {
    let client = lab.client().await.expect("client");
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("havip-{pair}"), "namespace": NAMESPACE},
        "spec": {"leaseTransitions": 0},
    }))
    .expect("lease");
    Api::<Lease>::namespaced(client.clone(), NAMESPACE).create(&PostParams::default(), &lease).await.expect("lease");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("havip-{pair}-key"), "namespace": NAMESPACE},
        "stringData": {"key": havip_e2e::agent::KEY_HEX, "keyId": "1"},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client, NAMESPACE).create(&PostParams::default(), &secret).await.expect("secret");
}

#[test]
fn agents_elect_record_the_lease_and_report_status() {
    if !netns::skip_unless_root(module_path!()) {
        return;
    }
    havip_e2e::init_tracing();
    let mut lab = KubeLab::start(KubeLabOptions { nodes: 2, operator: false, dir: None }).expect("lab");
    lab.block_on(async {
        operator_objects(&lab, "web").await;
        lab.apply(&lab.pair_yaml("web")).await.expect("apply");
        // n0 (priority 200) becomes active; its role change is a Lease CAS.
        let p = lab
            .wait_pair("web", Duration::from_secs(20), "both member entries, n0 Active", |p| {
                let m = p.status.as_ref().map(|s| s.members.clone()).unwrap_or_default();
                m.iter().any(|e| e.node == "n0" && e.role.as_deref() == Some("Active"))
                    && m.iter().any(|e| e.node == "n1" && e.role.as_deref() == Some("Standby"))
            })
            .await
            .expect("members reported");
        let (holder, epoch) = lab.lease("web").await.expect("lease");
        assert_eq!(holder.as_deref(), Some("n0"), "the Lease names the active");
        assert_eq!(epoch, 1, "leaseTransitions is the epoch");
        let st = p.status.expect("status");
        let n1 = st.members.iter().find(|m| m.node == "n1").expect("n1");
        assert!(n1.heard.iter().all(|h| h.heard), "n1 hears n0 on every path: {:?}", n1.heard);
        assert!(n1.applied_revision.is_some());
        assert_eq!(lab.holders().expect("holders"), vec![0]);
    });
    // A client reaches the VIP; cutting n0 moves it to n1 and bumps the Lease.
    let prober = Prober::on_client(&lab.topo, lab.target()).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("n0 answers");
    lab.topo.cut_cable(0, netns::Link::Mgmt).expect("cut mgmt");
    lab.topo.cut_cable(0, netns::Link::Data).expect("cut data");
    prober.wait_for_responder("n1", Duration::from_secs(5)).expect("n1 answers after the cut");
    lab.block_on(async {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let (holder, epoch) = lab.lease("web").await.expect("lease");
            if holder.as_deref() == Some("n1") && epoch == 2 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "Lease not moved: {holder:?} {epoch}\n{}", lab.logs_tail(30));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let report = prober.stop().expect("report");
    assert!(report.longest_gap_ms < 1500.0, "{}", report.summary());
    lab.stop_agent(1);
}
