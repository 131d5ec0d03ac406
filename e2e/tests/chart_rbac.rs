//! The Helm chart on the real API server: the rendered chart applies server-side, the
//! operator and the agents run with tokens of the chart's own ServiceAccounts (least
//! privilege), the pair scenario passes (create → Live → active cut → n1 active), and
//! what each binary must not do is refused by the API server.

use havip_crds::Phase;
use havip_crds::{FloatingIP, HAPair, MemberStatus, manager};
use havip_e2e::controlplane::client_from_kubeconfig;
use havip_e2e::kubelab::{KubeLab, KubeLabOptions, NAMESPACE};
use havip_e2e::netns::{self, Link};
use havip_e2e::traffic::Prober;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event as EventV1;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
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
    let mut lab = KubeLab::start(KubeLabOptions {
        nodes: 2,
        operator: true,
        dir: None,
        chart_rbac: true,
        bgp: None,
        ..Default::default()
    })
    .expect("lab");
    let live = lab.block_on(async {
        lab.apply(&lab.pair_yaml("web")).await.expect("apply");
        lab.wait_pair("web", Duration::from_secs(15), "Live under the chart's RBAC", |p| {
            p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Live)
                && p.status.as_ref().and_then(|s| s.active.as_deref()) == Some("n0")
        })
        .await
        .expect("Live")
    });
    // Usually 1; a claim that timed out on a loaded machine moves the election to 2.
    let live_epoch = live.status.as_ref().and_then(|s| s.epoch).expect("epoch");
    let prober = Prober::on_client(&lab.topo, lab.target()).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("n0 answers");
    lab.topo.cut_cable(0, Link::Mgmt).expect("cut");
    lab.topo.cut_cable(0, Link::Data).expect("cut");
    prober.wait_for_responder("n1", Duration::from_secs(5)).expect("takeover");
    lab.block_on(async {
        lab.wait_pair("web", Duration::from_secs(15), "n1 active under a newer epoch", |p| {
            let s = p.status.as_ref();
            s.and_then(|s| s.active.as_deref()) == Some("n1") && s.and_then(|s| s.epoch).is_some_and(|e| e > live_epoch)
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
    });
    // n1's holder fields may land a moment after the pair reads FailedOver.
    lab.block_on(async {
        let fips: Api<FloatingIP> = Api::all(lab.client().await.expect("admin"));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let f = fips.get("web-vip").await.expect("fip");
            if f.status.as_ref().and_then(|s| s.holder.as_deref()) == Some("n1") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "n1 never wrote itself as the holder: {:?}", f.status);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // The operator stops: the pair's status holds still while agents try to forge it (and
    // the leader Lease is not being renewed under the test's compare-and-swap).
    lab.stop_operator();
    lab.block_on(async {
        let admin = lab.client().await.expect("admin");
        let agent0 = client_from_kubeconfig(lab.agent_kubeconfig(0)).await.expect("agent n0 client");
        let agent = client_from_kubeconfig(lab.agent_kubeconfig(1)).await.expect("agent n1 client");
        hapair_status_forgeries(&admin, &agent0, &agent).await;
        floating_ip_forgeries(&agent0, &agent).await;
        lease_forgeries(&agent0, &agent).await;

        // What an agent must not do beyond status and Leases.
        let pairs: Api<havip_crds::HAPair> = Api::all(agent.clone());
        let spec_patch = serde_json::json!({"spec": {"paused": true}});
        let m = refused(
            pairs.patch("web", &PatchParams::default(), &Patch::Merge(&spec_patch)).await,
            "agent changes a HAPair's spec",
        );
        assert!(m.contains("forbidden"), "{m}");
        // Reading a Secret of another namespace.
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
        // … nor create Leases.
        let leases: Api<Lease> = Api::namespaced(agent.clone(), NAMESPACE);
        let l: Lease =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "hapair-stolen"}})).expect("lease");
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
            Api::<Secret>::namespaced(operator.clone(), "other").get("db-password").await,
            "operator reads a Secret of another namespace",
        );
        assert!(m.contains("forbidden"), "{m}");
        operator_reads_only_the_api_servers_endpoint_slice(&admin, &operator).await;
        // It labels pairs and FloatingIPs with their members (what the agents select on),
        // and no other label.
        let fips = Api::<havip_crds::FloatingIP>::all(operator.clone());
        let label = |k: &str, v: serde_json::Value| Patch::Merge(serde_json::json!({"metadata": {"labels": {k: v}}}));
        let member = havip_crds::membership::label_key("extra-node");
        fips.patch("web-vip", &PatchParams::default(), &label(&member, "true".into()))
            .await
            .expect("the operator sets a member label");
        fips.patch("web-vip", &PatchParams::default(), &label(&member, serde_json::Value::Null))
            .await
            .expect("the operator removes a member label");
        let m = refused(
            fips.patch("web-vip", &PatchParams::default(), &label("app", "x".into())).await,
            "operator sets another label on a FloatingIP",
        );
        assert!(m.contains("only the member labels"), "{m}");
        let m = refused(
            Api::<HAPair>::all(operator)
                .patch("web", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"paused": true}})))
                .await,
            "operator changes a HAPair's spec",
        );
        assert!(m.contains("forbidden") && m.contains("may not change the spec"), "{m}");
        // FloatingIPs: the operator creates, changes and deletes only those of Services'
        // addresses (labelled havip.io/load-balancer=true).
        let fip = |name: &str, lb: bool| -> FloatingIP {
            let mut v = serde_json::json!({"apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP",
                "metadata": {"name": name}, "spec": {"pair": "web", "address": "203.0.113.77/32"}});
            if lb {
                v["metadata"]["labels"] = serde_json::json!({"havip.io/load-balancer": "true"});
            }
            serde_json::from_value(v).expect("fip")
        };
        let m = refused(
            fips.create(&PostParams::default(), &fip("by-operator", false)).await,
            "operator creates a plain FloatingIP",
        );
        assert!(m.contains("only the FloatingIPs of Services' addresses"), "{m}");
        fips.create(&PostParams::default(), &fip("lb-203-0-113-77", true))
            .await
            .expect("the operator creates a Service's FloatingIP");
        fips.patch(
            "lb-203-0-113-77",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"probe": {"ports": [81]}}})),
        )
        .await
        .expect("the operator changes a Service's FloatingIP");
        let m = refused(
            fips.patch(
                "lb-203-0-113-77",
                &PatchParams::default(),
                &label("havip.io/load-balancer", serde_json::Value::Null),
            )
            .await,
            "operator turns a Service's FloatingIP into a plain one",
        );
        assert!(m.contains("forbidden"), "{m}");
        fips.delete("lb-203-0-113-77", &DeleteParams::default())
            .await
            .expect("the operator deletes a Service's FloatingIP");
        let m = refused(
            fips.delete("web-vip", &DeleteParams::default()).await,
            "operator deletes a FloatingIP written by hand",
        );
        assert!(m.contains("only the FloatingIPs it allocated"), "{m}");
        // The agents cannot label anything.
        let m = refused(
            Api::<havip_crds::FloatingIP>::all(agent.clone())
                .patch("web-vip", &PatchParams::default(), &label(&member, "true".into()))
                .await,
            "agent labels a FloatingIP",
        );
        assert!(m.contains("forbidden"), "{m}");
    });

    // A stop while the agent's token may not read its DaemonSet (403: an RBAC mistake, a
    // Role being edited) is no uninstall: the active keeps its VIP for the next agent.
    let vip = lab.topo.vip(0);
    let binding = lab.block_on(async {
        let bindings: Api<RoleBinding> = Api::namespaced(lab.client().await.expect("admin"), NAMESPACE);
        let b = bindings.get("havip-agent").await.expect("the agents' RoleBinding");
        bindings.delete("havip-agent", &DeleteParams::default()).await.expect("revoke the agents' Role");
        b
    });
    lab.stop_agent(1);
    let n1 = lab.topo.node(1);
    assert!(
        netns::has_address(&n1.ns, &n1.data_if, vip.into()).expect("addresses"),
        "n1 keeps its VIP when its agent stops unable to read its DaemonSet (403)\n{}",
        lab.logs_tail(30)
    );
    assert!(agent_log(&lab, 1).contains("keeping the VIPs"), "the agent says why it kept them");
    lab.block_on(async {
        let bindings: Api<RoleBinding> = Api::namespaced(lab.client().await.expect("admin"), NAMESPACE);
        let mut b = binding;
        b.metadata = ObjectMeta { name: b.metadata.name, labels: b.metadata.labels, ..ObjectMeta::default() };
        bindings.create(&PostParams::default(), &b).await.expect("restore the agents' Role");
    });
    lab.start_agent(1).expect("restart n1's agent");
    let report = prober.stop().expect("report");
    assert!(report.longest_gap_ms < 1000.0, "{}", report.summary());

    // `helm uninstall`: the DaemonSet goes, then the agents' ServiceAccount (its tokens
    // stop authenticating) while the pods are still terminating. The agents, told to stop
    // after that, must still remove their VIPs: their watch saw the DaemonSet go (under
    // Kubernetes the pods' SIGTERM comes after that, once the garbage collector deleted them).
    lab.block_on(async {
        lab.delete_agent_daemonset().await.expect("delete the DaemonSet");
    });
    for i in 0..2 {
        wait_for_log(&lab, i, "the agent's DaemonSet is gone", Duration::from_secs(20));
    }
    // Then, as `helm uninstall` goes on, the agents' RoleBinding (their reads of the
    // DaemonSet are refused from now on) and their ServiceAccount.
    lab.block_on(async {
        let admin = lab.client().await.expect("admin");
        Api::<RoleBinding>::namespaced(admin.clone(), NAMESPACE)
            .delete("havip-agent", &DeleteParams::default())
            .await
            .expect("delete the agents' RoleBinding");
        Api::<ServiceAccount>::namespaced(admin, NAMESPACE)
            .delete("havip-agent", &DeleteParams::default())
            .await
            .expect("delete the agents' ServiceAccount");
    });
    lab.stop_agent(0);
    lab.stop_agent(1);
    for i in 0..2 {
        let n = lab.topo.node(i);
        assert!(
            !netns::has_address(&n.ns, &n.data_if, vip.into()).expect("addresses"),
            "n{i} keeps no VIP after the uninstall\n{}",
            lab.logs_tail(30)
        );
        assert!(
            agent_log(&lab, i).contains("was deleted (seen by the agent's watch"),
            "n{i} decided on what its watch saw"
        );
    }
}

/// A lab under the chart's RBAC with the pair `web` Live, n0 active.
fn live_lab() -> Option<KubeLab> {
    if !netns::skip_unless_root(module_path!()) {
        return None;
    }
    havip_e2e::init_tracing();
    let lab = KubeLab::start(KubeLabOptions {
        nodes: 2,
        operator: true,
        dir: None,
        chart_rbac: true,
        bgp: None,
        ..Default::default()
    })
    .expect("lab");
    lab.block_on(async {
        lab.apply(&lab.pair_yaml("web")).await.expect("apply");
        lab.wait_pair("web", Duration::from_secs(15), "Live under the chart's RBAC", |p| {
            p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Live)
                && p.status.as_ref().and_then(|s| s.active.as_deref()) == Some("n0")
        })
        .await
        .expect("Live")
    });
    Some(lab)
}

/// An Event as the agents' recorder writes it (events.k8s.io/v1), in `ns`, reported by
/// `controller` on `instance`, about `regarding`.
fn event(ns: &str, name: &str, controller: &str, instance: &str, regarding: serde_json::Value) -> EventV1 {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "eventTime": now(), "reportingController": controller, "reportingInstance": instance,
        "action": "RoleChange", "reason": "Takeover", "type": "Normal", "note": "forged", "regarding": regarding,
    }))
    .expect("event")
}

#[test]
fn agent_tokens_write_events_only_in_default_about_havip_objects_as_their_own_node() {
    let Some(lab) = live_lab() else { return };
    let pair = serde_json::json!({"apiVersion": "havip.io/v1alpha1", "kind": "HAPair", "name": "web"});
    lab.block_on(async {
        let admin = lab.client().await.expect("admin");
        let agent0 = client_from_kubeconfig(lab.agent_kubeconfig(0)).await.expect("agent n0 client");
        let pp = PostParams::default();
        // Where the agents' Events go: `default` (the API server puts the Events of
        // cluster-scoped objects there or in kube-system), and they get there.
        let in_default: Api<EventV1> = Api::namespaced(admin.clone(), "default");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let list = in_default.list(&Default::default()).await.expect("events");
            if list.items.iter().any(|e| {
                e.reporting_controller.as_deref() == Some("havip-agent")
                    && e.reporting_instance.as_deref() == Some("n0")
            }) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no Event of n0's agent in default\n{}", lab.logs_tail(30));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Nowhere else.
        let m = refused(
            Api::<EventV1>::namespaced(agent0.clone(), "kube-system")
                .create(&pp, &event("kube-system", "forged-1", "havip-agent", "n0", pair.clone()))
                .await,
            "agent creates an Event in kube-system",
        );
        assert!(m.contains("forbidden"), "{m}");
        let core = serde_json::from_value::<k8s_openapi::api::core::v1::Event>(serde_json::json!({
            "metadata": {"name": "forged-2", "namespace": "kube-system"},
            "involvedObject": {"kind": "Pod", "namespace": "kube-system", "name": "kube-apiserver"},
            "reason": "Killing", "message": "forged", "type": "Warning",
        }))
        .expect("core event");
        let m = refused(
            Api::<k8s_openapi::api::core::v1::Event>::namespaced(agent0.clone(), "kube-system")
                .create(&pp, &core)
                .await,
            "agent creates a core Event in kube-system",
        );
        assert!(m.contains("forbidden"), "{m}");
        // In default, only as havip-agent of its own node, about havip's objects.
        let mine: Api<EventV1> = Api::namespaced(agent0.clone(), "default");
        let m = refused(
            mine.create(&pp, &event("default", "forged-3", "havip-agent", "n1", pair.clone())).await,
            "agent n0 writes an Event as n1",
        );
        assert!(m.contains("as reportingController havip-agent on its own node"), "{m}");
        let m = refused(
            mine.create(&pp, &event("default", "forged-4", "kubelet", "n0", pair.clone())).await,
            "agent writes an Event as the kubelet",
        );
        assert!(m.contains("as reportingController havip-agent on its own node"), "{m}");
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "web-0"});
        let m = refused(
            mine.create(&pp, &event("default", "forged-5", "havip-agent", "n0", pod)).await,
            "agent writes an Event about a Pod",
        );
        assert!(m.contains("only about havip objects"), "{m}");
        // Its own Event, and a repeat of it (the recorder patches the series).
        mine.create(&pp, &event("default", "own-1", "havip-agent", "n0", pair.clone())).await.expect("its own Event");
        let series = serde_json::json!({"series": {"count": 2, "lastObservedTime": now()}});
        mine.patch("own-1", &PatchParams::default(), &Patch::Merge(&series)).await.expect("a repeat of its own Event");
        // Another writer's Event in default: not rewritten.
        in_default
            .create(&pp, &event("default", "operator-1", "havip-operator", "havip-operator-0", pair.clone()))
            .await
            .expect("admin writes an operator Event");
        let m = refused(
            mine.patch("operator-1", &PatchParams::default(), &Patch::Merge(&series)).await,
            "agent rewrites the operator's Event",
        );
        assert!(m.contains("as reportingController havip-agent on its own node"), "{m}");
        // (Nor made its own: the API server keeps the reporting fields immutable.)
        let takeover = serde_json::json!({"reportingController": "havip-agent", "reportingInstance": "n0"});
        refused(
            mine.patch("operator-1", &PatchParams::default(), &Patch::Merge(&takeover)).await,
            "agent turns the operator's Event into its own",
        );
    });
}

/// A Node named `node` (no kubelet: never ready) and a client with a token of the
/// agents' ServiceAccount bound to a Pod on it, as the kubelet would give an agent there.
async fn node_with_agent_token(lab: &KubeLab, admin: &Client, node: &str) -> Client {
    let n: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": node}})).expect("node");
    Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone()).create(&PostParams::default(), &n).await.expect("node");
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "havip-agent-long", "namespace": NAMESPACE},
        "spec": {"nodeName": node, "serviceAccountName": "havip-agent",
                 "containers": [{"name": "agent", "image": "ghcr.io/havip/havip-agent:0.1.0"}]},
    }))
    .expect("pod");
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod");
    let out = lab
        .cp
        .kubectl()
        .args(["-n", NAMESPACE, "create", "token", "havip-agent", "--bound-object-kind=Pod"])
        .arg("--bound-object-name=havip-agent-long")
        .arg("--duration=1h")
        .output()
        .expect("kubectl create token");
    assert!(out.status.success(), "create token: {}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let kubeconfig = lab.cp.kubeconfig_with_token("havip-agent-long", &token).expect("kubeconfig");
    client_from_kubeconfig(&kubeconfig).await.expect("client")
}

/// Waits until `get` returns an object whose labels satisfy `ok`.
async fn wait_labels<K>(api: &Api<K>, name: &str, what: &str, ok: impl Fn(&BTreeMap<String, String>) -> bool)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(Some(o)) = api.get_opt(name).await
            && ok(o.meta().labels.as_ref().unwrap_or(&BTreeMap::new()))
        {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: never labelled so");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A FloatingIP take-over as the agent on `node` writes it (a forced apply of the holder fields).
async fn take_fip(client: &Client, fip: &str, node: &str, epoch: i64) -> kube::Result<FloatingIP> {
    let take = serde_json::json!({"apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP", "status": {
        "holder": node, "state": "Announced", "interface": "eth0", "epoch": epoch, "lastAnnounced": now(),
    }});
    Api::<FloatingIP>::all(client.clone())
        .patch_status(fip, &PatchParams::apply(&manager::agent(node)).force(), &Patch::Apply(&take))
        .await
}

/// The member entry of `node` in pair `pair`, as its agent applies it.
async fn own_entry(client: &Client, pair: &str, node: &str, epoch: i64) -> kube::Result<HAPair> {
    let apply = serde_json::json!({"apiVersion": "havip.io/v1alpha1", "kind": "HAPair",
        "status": {"members": [{"node": node, "role": "Standby", "epoch": epoch}]}});
    Api::<HAPair>::all(client.clone())
        .patch_status(pair, &PatchParams::apply(&manager::agent(node)).force(), &Patch::Apply(&apply))
        .await
}

#[test]
fn agent_tokens_write_only_the_pairs_of_their_own_node_whatever_its_name() {
    let Some(mut lab) = live_lab() else { return };
    // A node name longer than a label name may be (its member label is a hashed form no
    // policy can compute), a member of the pair `db` with n0; n1 is no member of `db`.
    let long = "n7.rack-17.row-3.datacenter-frankfurt-1.cluster-prod.example.internal";
    assert!(long.len() > 63 && havip_crds::membership::label_name(long) != long);
    let db = format!(
        "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata:\n  name: db\nspec:\n  members:\n    - node: n0\n      priority: 200\n    - node: {long}\n      priority: 190\n  heartbeat:\n    paths:\n      - name: data\n        addressType: InternalIP\n---\napiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata:\n  name: db-vip\nspec:\n  pair: db\n  address: {}/24\n  interface: eth0\n",
        lab.topo.vip(1)
    );
    let db_lease = havip_crds::lease::pair_lease_name("db");
    let long_key = havip_crds::membership::label_key(long);
    lab.block_on(async {
        let admin = lab.client().await.expect("admin");
        let as_long = node_with_agent_token(&lab, &admin, long).await;
        let n1 = client_from_kubeconfig(lab.agent_kubeconfig(1)).await.expect("agent n1 client");
        lab.apply(&db).await.expect("apply db");
        // The operator creates db's Lease and labels it and the FloatingIP with the members.
        let leases: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
        wait_labels(&leases, &db_lease, "db's Lease", |l| l.contains_key(&long_key)).await;
        wait_labels(&Api::<FloatingIP>::all(admin.clone()), "db-vip", "db-vip", |l| l.contains_key(&long_key)).await;

        // n1 is no member of db: neither its Lease, nor its FloatingIP, nor a member entry.
        let m = refused(
            agent_cas(&Api::namespaced(n1.clone(), NAMESPACE), &db_lease, "n1", 1).await,
            "n1 takes db's Lease",
        );
        assert!(m.contains("not a member of the pair"), "{m}");
        let m = refused(take_fip(&n1, "db-vip", "n1", 1).await, "n1 takes db's FloatingIP");
        assert!(m.contains("not a member of the pair"), "{m}");
        let m = refused(own_entry(&n1, "db", "n1", 1).await, "n1 writes a member entry into db");
        assert!(m.contains("not a member of the pair"), "{m}");

        // The member with the long name may, as its agent does.
        let leases_long: Api<Lease> = Api::namespaced(as_long.clone(), NAMESPACE);
        let l = agent_cas(&leases_long, &db_lease, long, 1).await.expect("the long-named member takes db's Lease");
        assert_eq!(l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()), Some(long));
        agent_cas(&leases_long, &db_lease, long, 1).await.expect("and renews it");
        take_fip(&as_long, "db-vip", long, 1).await.expect("the long-named member takes db's FloatingIP");
        own_entry(&as_long, "db", long, 1).await.expect("the long-named member writes its member entry");

        // Removed from the pair: the operator relabels, and the former member may write
        // nothing of the pair any more but the removal of its own holder fields.
        let pairs: Api<HAPair> = Api::all(admin.clone());
        let members = serde_json::json!({"spec": {"members": [
            {"node": "n0", "priority": 200}, {"node": "n9", "priority": 190}]}});
        pairs
            .patch("db", &PatchParams::default(), &Patch::Merge(&members))
            .await
            .expect("remove the long-named member");
        wait_labels(&leases, &db_lease, "db's Lease", |l| !l.contains_key(&long_key)).await;
        wait_labels(&Api::<FloatingIP>::all(admin.clone()), "db-vip", "db-vip", |l| !l.contains_key(&long_key)).await;
        let m = refused(agent_cas(&leases_long, &db_lease, long, 2).await, "a former member takes db's Lease");
        assert!(m.contains("not a member of the pair"), "{m}");
        let m = refused(take_fip(&as_long, "db-vip", long, 2).await, "a former member takes db's FloatingIP again");
        assert!(m.contains("not a member of the pair"), "{m}");
        let m = refused(own_entry(&as_long, "db", long, 2).await, "a former member changes its member entry");
        assert!(m.contains("not a member of the pair"), "{m}");
        let release = serde_json::json!({"metadata": {}, "status": {
            "holder": null, "state": null, "interface": null, "epoch": null, "lastAnnounced": null}});
        Api::<FloatingIP>::all(as_long.clone())
            .patch_status("db-vip", &PatchParams::default(), &Patch::Merge(&release))
            .await
            .expect("a former member removes its own holder fields");
    });

    // Objects an earlier operator labelled but did not annotate (an upgrade): a node name
    // that is a label name is checked by its member label.
    lab.stop_operator();
    lab.block_on(async {
        let admin = lab.client().await.expect("admin");
        let leases: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
        let web_lease = havip_crds::lease::pair_lease_name("web");
        let strip = serde_json::json!({"metadata": {"annotations": {havip_crds::membership::NODES_ANNOTATION: null}}});
        let l = leases.patch(&web_lease, &PatchParams::default(), &Patch::Merge(&strip)).await.expect("strip");
        let holder = l.spec.as_ref().and_then(|s| s.holder_identity.clone()).expect("web has a holder");
        let i = if holder == "n0" { 0 } else { 1 };
        let agent = client_from_kubeconfig(lab.agent_kubeconfig(i)).await.expect("agent client");
        agent_cas(&Api::namespaced(agent, NAMESPACE), &web_lease, &holder, epoch_of(&l))
            .await
            .expect("the holder renews web's Lease, a member by its label");
        let as_long = {
            let out = lab
                .cp
                .kubectl()
                .args(["-n", NAMESPACE, "create", "token", "havip-agent", "--bound-object-kind=Pod"])
                .arg("--bound-object-name=havip-agent-long")
                .output()
                .expect("kubectl create token");
            let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            client_from_kubeconfig(&lab.cp.kubeconfig_with_token("havip-agent-long-2", &token).expect("kubeconfig"))
                .await
                .expect("client")
        };
        let m = refused(
            agent_cas(&Api::namespaced(as_long, NAMESPACE), &web_lease, long, epoch_of(&l) + 1).await,
            "a node of no label takes web's Lease",
        );
        assert!(m.contains("not a member of the pair"), "{m}");
    });
}

#[test]
fn agent_tokens_raise_a_pair_lease_epoch_by_a_bounded_step() {
    let Some(lab) = live_lab() else { return };
    let step = i32::try_from(havip_node_agent::sm::MAX_LEASE_STEP).expect("step");
    lab.block_on(async {
        let agent0 = client_from_kubeconfig(lab.agent_kubeconfig(0)).await.expect("agent n0 client");
        let leases: Api<Lease> = Api::namespaced(agent0, NAMESPACE);
        let name = havip_crds::lease::pair_lease_name("web");
        let l = leases.get(&name).await.expect("web's Lease");
        assert_eq!(l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()), Some("n0"));
        let e = epoch_of(&l);
        // One write to the top of the domain would leave the pair unable to fail over.
        let m = refused(agent_cas(&leases, &name, "n0", i32::MAX).await, "the holder raises the epoch to the top");
        assert!(m.contains(&format!("by at most {step}")), "{m}");
        let m = refused(agent_cas(&leases, &name, "n0", e + step + 1).await, "the holder raises the epoch by step + 1");
        assert!(m.contains(&format!("by at most {step}")), "{m}");
        let l = agent_cas(&leases, &name, "n0", e + step).await.expect("the holder raises the epoch by the step");
        assert_eq!(epoch_of(&l), e + step);
    });
}

/// Node `i`'s agent log so far.
fn agent_log(lab: &KubeLab, i: usize) -> String {
    std::fs::read_to_string(lab.dir().join(format!("agent-{i}.log"))).unwrap_or_default()
}

/// Waits until node `i`'s agent logged `needle`.
fn wait_for_log(lab: &KubeLab, i: usize, needle: &str, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    while !agent_log(lab, i).contains(needle) {
        assert!(std::time::Instant::now() < deadline, "n{i}'s agent never logged {needle:?}\n{}", lab.logs_tail(30));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The operator reads the API server's own addresses from the EndpointSlice
/// `default/kubernetes` (by name, as it watches it), and no other EndpointSlice.
async fn operator_reads_only_the_api_servers_endpoint_slice(admin: &Client, operator: &Client) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::ListParams;
    // This control plane runs no endpoint reconciler: the slices are written here.
    let slice = |name: &str, address: &str| -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address]}],
        }))
        .expect("slice")
    };
    let slices = Api::<EndpointSlice>::namespaced(admin.clone(), "default");
    for (name, address) in [("kubernetes", "198.51.100.250"), ("tenant-app", "198.51.100.251")] {
        slices.create(&PostParams::default(), &slice(name, address)).await.expect("create an EndpointSlice");
    }
    let theirs = Api::<EndpointSlice>::namespaced(operator.clone(), "default");
    theirs.get("kubernetes").await.expect("the operator reads the API server's EndpointSlice");
    let named = theirs
        .list(&ListParams::default().fields("metadata.name=kubernetes"))
        .await
        .expect("the operator lists it by name (what its watch does)");
    assert_eq!(named.items.len(), 1);
    let m = refused(theirs.get("tenant-app").await, "operator reads another EndpointSlice");
    assert!(m.contains("forbidden"), "{m}");
    let m = refused(theirs.list(&ListParams::default()).await, "operator lists the EndpointSlices of default");
    assert!(m.contains("forbidden"), "{m}");
    let m = refused(
        Api::<EndpointSlice>::namespaced(operator.clone(), NAMESPACE).get("kubernetes").await,
        "operator reads an EndpointSlice of another namespace",
    );
    assert!(m.contains("forbidden"), "{m}");
    for name in ["kubernetes", "tenant-app"] {
        slices.delete(name, &DeleteParams::default()).await.expect("delete the EndpointSlice");
    }
}

fn merge(status: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(serde_json::json!({ "status": status }))
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// The pair's status: an agent may change its own member entry and nothing else.
async fn hapair_status_forgeries(admin: &Client, agent0: &Client, agent1: &Client) {
    let pp = PatchParams::default();
    // A pending command, as the operator would leave it (every member just answers a
    // ClearSuspension, so it moves nothing).
    Api::<HAPair>::all(admin.clone())
        .patch_status("web", &pp, &merge(serde_json::json!({"command": {"id": "e2e-1", "kind": "ClearSuspension"}})))
        .await
        .expect("admin sets a command");
    let pairs: Api<HAPair> = Api::all(agent0.clone());
    let forgeries = [
        ("agent rewrites command.kind", serde_json::json!({"command": {"kind": "PlannedFailover"}}), "status.command"),
        ("agent rewrites command.target", serde_json::json!({"command": {"target": "n0"}}), "status.command"),
        ("agent rewrites command.id", serde_json::json!({"command": {"id": "e2e-2"}}), "status.command"),
        ("agent removes the command", serde_json::json!({"command": null}), "status.command"),
        (
            "agent forges lastOperation",
            serde_json::json!({"lastOperation": {"id": "e2e-1", "kind": "PlannedFailover", "result": "Succeeded", "message": "done"}}),
            "status.lastOperation",
        ),
        (
            "agent changes conditions",
            serde_json::json!({"conditions": [{"type": "Ready", "status": "True", "reason": "AsExpected", "message": "forged",
                                               "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
            "status.conditions",
        ),
        ("agent changes the epoch", serde_json::json!({"epoch": 99}), "status.epoch"),
        (
            "agent changes configRevision",
            serde_json::json!({"configRevision": "0000000000000000"}),
            "status.configRevision",
        ),
        ("agent changes phase", serde_json::json!({"phase": "Failed"}), "status.phase"),
        ("agent changes active", serde_json::json!({"active": "n0"}), "status.active"),
    ];
    for (what, status, field) in forgeries {
        let m = refused(pairs.patch_status("web", &pp, &merge(status)).await, what);
        assert!(m.contains(&format!("may not change {field}")) || m.contains(&format!(", {field}")), "{what}: {m}");
    }
    // Another node's member entry (n1's agent writing n0's).
    let forged = serde_json::json!({
        "apiVersion": "havip.io/v1alpha1", "kind": "HAPair",
        "status": {"members": [{"node": "n0", "role": "Standby", "epoch": 99}]},
    });
    let m = refused(
        Api::<HAPair>::all(agent1.clone())
            .patch_status("web", &PatchParams::apply(&manager::agent("n1")).force(), &Patch::Apply(&forged))
            .await,
        "agent n1 writes n0's member entry",
    );
    assert!(m.contains("may only change its own status.members entry"), "{m}");

    // Its own entry: accepted (server-side apply of the entry, as the agent writes it).
    let p = pairs.get("web").await.expect("pair");
    let mut own: MemberStatus =
        p.status.as_ref().and_then(|s| s.members.iter().find(|m| m.node == "n0").cloned()).expect("n0's entry");
    own.clock_skew_ms = Some(7);
    let apply = serde_json::json!({"apiVersion": "havip.io/v1alpha1", "kind": "HAPair", "status": {"members": [own]}});
    let p = pairs
        .patch_status("web", &PatchParams::apply(&manager::agent("n0")).force(), &Patch::Apply(&apply))
        .await
        .expect("an agent writes its own member entry");
    let entry = p.status.as_ref().and_then(|s| s.members.iter().find(|m| m.node == "n0"));
    assert_eq!(entry.and_then(|m| m.clock_skew_ms), Some(7));
    let st = p.status.as_ref().expect("status");
    assert_eq!(st.command.as_ref().map(|c| (c.id.as_str(), c.kind.as_str())), Some(("e2e-1", "ClearSuspension")));
    assert!(st.last_operation.as_ref().is_none_or(|o| o.message != "done"), "{:?}", st.last_operation);
    assert_ne!(st.epoch, Some(99));
    Api::<HAPair>::all(admin.clone())
        .patch_status("web", &pp, &merge(serde_json::json!({"command": null})))
        .await
        .expect("admin clears the command");
}

/// The FloatingIP's status: an agent may set the holder fields naming its own node
/// (taking them over by a forced apply) and remove its own (an apply without them, when
/// it stops holding), never name another node or remove another node's holder.
async fn floating_ip_forgeries(agent0: &Client, agent1: &Client) {
    let fips0: Api<FloatingIP> = Api::all(agent0.clone());
    let fips1: Api<FloatingIP> = Api::all(agent1.clone());
    let before = fips0.get("web-vip").await.expect("fip").status.expect("fip status");
    assert_eq!(before.holder.as_deref(), Some("n1"), "{before:?}");
    let m = refused(
        fips0.patch_status("web-vip", &PatchParams::default(), &merge(serde_json::json!({"holder": null}))).await,
        "agent n0 clears n1's FloatingIP holder",
    );
    assert!(m.contains("may only report itself as the FloatingIP holder, or remove its own"), "{m}");
    let m = refused(
        fips1.patch_status("web-vip", &PatchParams::default(), &merge(serde_json::json!({"holder": "n0"}))).await,
        "agent n1 names n0 as the FloatingIP holder",
    );
    assert!(m.contains("may only report itself as the FloatingIP holder"), "{m}");
    let m = refused(
        fips1
            .patch_status(
                "web-vip",
                &PatchParams::default(),
                &merge(serde_json::json!({"holder": "n1", "observedGeneration": 99})),
            )
            .await,
        "agent n1 changes the operator's FloatingIP fields",
    );
    assert!(m.contains("may not change status.observedGeneration"), "{m}");

    // What an agent that holds nothing applies (it owns no holder field): allowed, and it
    // changes nothing.
    let release = serde_json::json!({"apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP", "status": {}});
    let f = fips0
        .patch_status("web-vip", &PatchParams::apply(&manager::agent("n0")).force(), &Patch::Apply(&release))
        .await
        .expect("n0's release is a no-op");
    assert_eq!(f.status.as_ref().and_then(|s| s.holder.as_deref()), Some("n1"), "n1's fields stay");

    // A take-over by a forced apply of the holder fields (what a new active writes), then
    // back to the real holder.
    let take = |node: &str, epoch: i64| {
        serde_json::json!({"apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP", "status": {
            "holder": node, "state": "Announced", "interface": before.interface, "epoch": epoch, "lastAnnounced": now(),
        }})
    };
    let f = fips0
        .patch_status("web-vip", &PatchParams::apply(&manager::agent("n0")).force(), &Patch::Apply(&take("n0", 3)))
        .await
        .expect("n0 takes the FloatingIP over");
    assert_eq!(f.status.as_ref().and_then(|s| s.holder.as_deref()), Some("n0"));
    let n1_back = take("n1", before.epoch.unwrap_or(2));
    let pp1 = PatchParams::apply(&manager::agent("n1")).force();
    fips1.patch_status("web-vip", &pp1, &Patch::Apply(&n1_back)).await.expect("n1 takes the FloatingIP back");
    // The holder gives it up: it removes the holder fields (what an agent that holds
    // nothing any more writes while the FloatingIP still names it).
    let rv = fips1.get("web-vip").await.expect("fip").metadata.resource_version;
    let remove = serde_json::json!({"metadata": {"resourceVersion": rv}, "status": {
        "holder": null, "state": null, "holderMac": null, "conflictMac": null, "interface": null, "epoch": null,
        "lastAnnounced": null,
    }});
    let f = fips1
        .patch_status("web-vip", &PatchParams::default(), &Patch::Merge(&remove))
        .await
        .expect("n1 removes its own holder fields");
    let st = f.status.unwrap_or_default();
    assert_eq!((st.holder, st.state, st.epoch), (None, None, None), "its fields are gone");
    let f = fips1.patch_status("web-vip", &pp1, &Patch::Apply(&n1_back)).await.expect("n1 holds it again");
    assert_eq!(f.status.as_ref().and_then(|s| s.holder.as_deref()), Some("n1"));
}

/// An agent's Lease write as `KubeLease::cas` makes it: read, set holder, epoch and
/// times, replace with the resourceVersion read.
async fn agent_cas(leases: &Api<Lease>, name: &str, holder: &str, epoch: i32) -> kube::Result<Lease> {
    let mut l = leases.get(name).await?;
    let spec = l.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(holder.to_owned());
    spec.lease_transitions = Some(epoch);
    spec.acquire_time = Some(now());
    spec.renew_time = Some(now());
    leases.replace(name, &PostParams::default(), &l).await
}

fn epoch_of(l: &Lease) -> i32 {
    l.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0)
}

/// Leases: only pair Leases, naming the writer, with a higher leaseTransitions.
async fn lease_forgeries(agent0: &Client, agent1: &Client) {
    let leases0: Api<Lease> = Api::namespaced(agent0.clone(), NAMESPACE);
    let leases1: Api<Lease> = Api::namespaced(agent1.clone(), NAMESPACE);
    let pair_lease = havip_crds::lease::pair_lease_name("web");
    let leader = leases1.get("havip-operator").await.expect("the leader Lease exists");
    let m = refused(
        agent_cas(&leases1, "havip-operator", "n1", epoch_of(&leader) + 1).await,
        "agent writes the leader Lease",
    );
    assert!(m.contains("may write only pair Leases"), "{m}");

    let current = leases0.get(&pair_lease).await.expect("pair Lease");
    let e = epoch_of(&current);
    assert_eq!(current.spec.as_ref().and_then(|s| s.holder_identity.as_deref()), Some("n1"));
    let m = refused(agent_cas(&leases0, &pair_lease, "n1", e + 1).await, "agent n0 names n1 as the holder");
    assert!(m.contains("may only name itself as the holder of a pair Lease"), "{m}");
    let m = refused(agent_cas(&leases0, &pair_lease, "n9", e + 1).await, "agent n0 names n9 as the holder");
    assert!(m.contains("not n9"), "{m}");
    let m = refused(agent_cas(&leases0, &pair_lease, "n0", e).await, "agent n0 claims under the same epoch");
    assert!(m.contains("must raise leaseTransitions") && m.contains("only the holder may renew"), "{m}");
    let m = refused(agent_cas(&leases0, &pair_lease, "n0", e - 1).await, "agent n0 claims under a lower epoch");
    assert!(m.contains("must raise leaseTransitions"), "{m}");
    // The holder renews its Lease under the same epoch (it cannot hear its peer and shows
    // it is alive): allowed, and only that.
    let renewed = agent_cas(&leases1, &pair_lease, "n1", e).await.expect("the holder renews its Lease");
    assert_eq!(epoch_of(&renewed), e);
    let mut relabelled = leases1.get(&pair_lease).await.expect("pair Lease");
    relabelled.metadata.owner_references = None;
    let spec = relabelled.spec.get_or_insert_with(Default::default);
    spec.lease_transitions = Some(e + 1);
    let m = refused(
        leases1.replace(&pair_lease, &PostParams::default(), &relabelled).await,
        "agent drops the pair Lease's owner",
    );
    assert!(m.contains("metadata.ownerReferences"), "{m}");
    // The holder records a newer epoch under its own name: by 1 (a reconcile), by 5 (a
    // takeover after an API outage, its local epoch ran ahead).
    let l = agent_cas(&leases1, &pair_lease, "n1", e + 1).await.expect("the holder raises the epoch by 1");
    assert_eq!(epoch_of(&l), e + 1);
    let l = agent_cas(&leases1, &pair_lease, "n1", e + 6).await.expect("the holder raises the epoch by 5");
    assert_eq!(epoch_of(&l), e + 6);
    assert_eq!(l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()), Some("n1"));
    let after = leases1.get("havip-operator").await.expect("the leader Lease");
    assert_eq!(after.spec, leader.spec, "the leader Lease is untouched");
}
