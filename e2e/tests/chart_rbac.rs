//! The Helm chart on the real API server: the rendered chart applies server-side, the
//! operator and the agents run with tokens of the chart's own ServiceAccounts (least
//! privilege), the pair scenario passes (create → Live → active cut → n1 active), and
//! what each binary must not do is refused by the API server.

use havip_crds::Phase;
use havip_e2e::controlplane::client_from_kubeconfig;
use havip_e2e::kubelab::{KubeLab, KubeLabOptions, NAMESPACE};
use havip_e2e::netns::{self, Link};
use havip_e2e::traffic::Prober;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::time::Duration;

fn refused(r: Result<impl std::fmt::Debug, kube::Error>, what: &str) -> String {
    match r {
        Ok(v) => panic!("{what}: the API server accepted it: {v:?}"),
        Err(kube::Error::Api(s)) => {
            assert!(s.code == 403 || s.code == 422, "{what}: expected 403/422, got {} {}", s.code, s.message);
            s.message
        }
        Err(e) => panic!("{what}: unexpected error {e}"),
    }
}

#[test]
fn the_chart_runs_the_pair_under_its_own_service_accounts_and_refuses_the_rest() {
    if !netns::skip_unless_root(module_path!()) {
        return;
    }
    havip_e2e::init_tracing();
    let lab = KubeLab::start(KubeLabOptions { nodes: 2, operator: true, dir: None, chart_rbac: true }).expect("lab");
    lab.block_on(async {
        lab.apply(&lab.pair_yaml("web")).await.expect("apply");
        lab.wait_pair("web", Duration::from_secs(15), "Live under the chart's RBAC", |p| {
            p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Live)
                && p.status.as_ref().and_then(|s| s.active.as_deref()) == Some("n0")
        })
        .await
        .expect("Live");
    });
    let prober = Prober::on_client(&lab.topo, lab.target()).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("n0 answers");
    lab.topo.cut_cable(0, Link::Mgmt).expect("cut");
    lab.topo.cut_cable(0, Link::Data).expect("cut");
    prober.wait_for_responder("n1", Duration::from_secs(5)).expect("takeover");
    lab.block_on(async {
        lab.wait_pair("web", Duration::from_secs(15), "n1 active under epoch 2", |p| {
            let s = p.status.as_ref();
            s.and_then(|s| s.active.as_deref()) == Some("n1") && s.and_then(|s| s.epoch) == Some(2)
        })
        .await
        .expect("failover recorded");
        lab.topo.restore_cable(0, Link::Data).expect("restore");
        lab.topo.restore_cable(0, Link::Mgmt).expect("restore");
        lab.wait_pair("web", Duration::from_secs(15), "FailedOver", |p| {
            p.status.as_ref().and_then(|s| s.phase) == Some(Phase::FailedOver)
        })
        .await
        .expect("FailedOver");

        // What an agent must not do.
        let agent = client_from_kubeconfig(lab.agent_kubeconfig(1)).await.expect("agent client");
        let pairs: Api<havip_crds::HAPair> = Api::all(agent.clone());
        let spec_patch = serde_json::json!({"spec": {"paused": true}});
        let m = refused(
            pairs.patch("web", &PatchParams::default(), &Patch::Merge(&spec_patch)).await,
            "agent changes a HAPair's spec",
        );
        assert!(m.contains("forbidden"), "{m}");
        // Reading a Secret of another namespace.
        let admin = lab.client().await.expect("admin");
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": "other"}})).expect("ns");
        let _ = Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &ns).await;
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-password", "namespace": "other"}, "stringData": {"password": "hunter2"}
        }))
        .expect("secret");
        let _ = Api::<Secret>::namespaced(admin.clone(), "other").create(&PostParams::default(), &secret).await;
        let m = refused(
            Api::<Secret>::namespaced(agent.clone(), "other").get("db-password").await,
            "agent reads a Secret of another namespace",
        );
        assert!(m.contains("forbidden"), "{m}");
        // Writing another node's member entry (n1's agent writing n0's): the admission policy.
        let forged = serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "HAPair",
            "status": {"members": [{"node": "n0", "role": "Standby", "epoch": 99}]},
        });
        let m = refused(
            pairs
                .patch_status(
                    "web",
                    &PatchParams::apply(&havip_crds::manager::agent("n1")).force(),
                    &Patch::Apply(&forged),
                )
                .await,
            "agent n1 writes n0's member entry",
        );
        assert!(m.contains("may only change its own status.members entry"), "{m}");
        // … nor the operator's fields.
        let forged = serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "HAPair", "status": {"phase": "Failed"},
        });
        let m = refused(
            pairs.patch_status("web", &PatchParams::apply("someone").force(), &Patch::Apply(&forged)).await,
            "agent writes the operator's phase",
        );
        assert!(m.contains("operator's status fields"), "{m}");
        // … nor create Leases, nor read the operator's leader Lease for writing.
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(agent.clone(), NAMESPACE);
        let l: k8s_openapi::api::coordination::v1::Lease =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "havip-stolen"}})).expect("lease");
        let m = refused(leases.create(&PostParams::default(), &l).await, "agent creates a Lease");
        assert!(m.contains("forbidden"), "{m}");

        // What the operator must not do: change a spec, or read Secrets elsewhere.
        let operator = client_from_kubeconfig(lab.operator_kubeconfig()).await.expect("operator client");
        let m = refused(
            Api::<havip_crds::FloatingIP>::all(operator.clone())
                .patch(
                    "web-vip",
                    &PatchParams::default(),
                    &Patch::Merge(&serde_json::json!({"spec": {"interface": "eth9"}})),
                )
                .await,
            "operator changes a FloatingIP's spec",
        );
        assert!(m.contains("forbidden"), "{m}");
        let m = refused(
            Api::<Secret>::namespaced(operator, "other").get("db-password").await,
            "operator reads a Secret of another namespace",
        );
        assert!(m.contains("forbidden"), "{m}");
    });
    let report = prober.stop().expect("report");
    assert!(report.longest_gap_ms < 1000.0, "{}", report.summary());
}
