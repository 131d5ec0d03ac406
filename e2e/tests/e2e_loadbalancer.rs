//! havip as the LoadBalancer provider end to end on the local control plane: the
//! operator, one agent per node namespace, a client on the data network. A VIPPool and a
//! Service of class havip.io/l2 → EXTERNAL-IP in `kubectl get svc`; the address answers
//! on the Service's node port from the client (a listener on each node stands in for
//! kube-proxy, which answers a node port on every local address, the VIP included; the
//! FloatingIP probes that port); the active is cut → the Service still answers, with an Event on it;
//! the Service deleted → the address leaves the node. `make e2e` runs it (root).

use havip_e2e::api::external_ip;
use havip_e2e::kubelab::{KubeLab, KubeLabOptions};
use havip_e2e::netns::{self, Link};
use havip_e2e::traffic::Prober;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The node port of the Services here (kube-proxy's stand-in listens on it in each node).
const NODE_PORT: u16 = 30080;
/// The Service port (only the API sees it: kube-proxy would serve it on the VIP too).
const PORT: u16 = 80;

/// A lab with the pair `web` over two nodes (no FloatingIP of its own) and the pool
/// `lan` of ten addresses on the data network held by it; both members standing by.
/// Returns the lab and the pool's first address.
fn lab_with_pool() -> (KubeLab, std::net::Ipv4Addr) {
    let lab = KubeLab::start(KubeLabOptions {
        nodes: 2,
        operator: true,
        dir: None,
        chart_rbac: false,
        bgp: None,
        ..Default::default()
    })
    .expect("lab");
    let (net, _) = lab.topo.data_subnet();
    let o = net.octets();
    let first = std::net::Ipv4Addr::new(o[0], o[1], o[2], 60);
    // The pair alone (its own FloatingIP is not needed), then the pool.
    let pair = lab.pair_yaml("web");
    let pair = pair.split("\n---\n").next().expect("the pair document").to_owned();
    let pool = format!(
        "apiVersion: havip.io/v1alpha1\nkind: VIPPool\nmetadata: {{name: lan}}\nspec:\n  pair: web\n  addresses: [\"{first}-{o0}.{o1}.{o2}.69\"]\n",
        o0 = o[0],
        o1 = o[1],
        o2 = o[2]
    );
    lab.block_on(async {
        lab.apply(&format!("{pair}\n---\n{pool}")).await.expect("apply");
        // A pair without VIPs elects nobody: both members stand by until the first
        // Service's address appears.
        lab.wait_pair("web", Duration::from_secs(15), "both members standing by", |p| {
            p.status.as_ref().is_some_and(|s| {
                s.members.len() == 2 && s.members.iter().all(|m| m.role == Some(havip_crds::MemberRole::Standby))
            })
        })
        .await
        .expect("both members standing by");
    });
    (lab, first)
}

#[test]
fn a_service_gets_an_external_ip_that_answers_and_survives_a_cut_of_its_holder() {
    if !netns::skip_unless_root(module_path!()) {
        return;
    }
    havip_e2e::init_tracing();
    let (mut lab, first) = lab_with_pool();
    for i in 0..2 {
        lab.serve(i, NODE_PORT).expect("kube-proxy's stand-in on the node port");
    }
    let (svc, took) = lab.block_on(async {
        let client = lab.client().await.expect("client");
        let services: Api<Service> = Api::namespaced(client, "default");
        let svc: Service = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"type": "LoadBalancer", "loadBalancerClass": "havip.io/l2",
                     "ports": [{"port": PORT, "nodePort": NODE_PORT, "protocol": "TCP"}], "selector": {"app": "web"}},
        }))
        .expect("service");
        let start = Instant::now();
        services.create(&PostParams::default(), &svc).await.expect("create the Service");
        let deadline = start + Duration::from_secs(3);
        loop {
            let s = services.get("web").await.expect("get");
            if external_ip(&s).is_some() {
                return (s, start.elapsed());
            }
            assert!(Instant::now() < deadline, "no EXTERNAL-IP within 3 s\n{}", lab.logs_tail(40));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let ip = external_ip(&svc).expect("ip");
    eprintln!("Service created → EXTERNAL-IP {ip} in {took:?}");
    assert_eq!(ip, IpAddr::V4(first), "the pool's first address");
    let (ok, out) = lab.kubectl(&["get", "svc", "web", "-n", "default"]);
    assert!(ok && out.contains(&ip.to_string()), "kubectl get svc shows the EXTERNAL-IP:\n{out}");
    let (ok, out) = lab.kubectl(&["get", "vippools"]);
    assert!(ok && out.lines().any(|l| l.starts_with("lan") && l.contains("web")), "kubectl get vippools:\n{out}");

    // The address answers on the node port from the client, from the active.
    let prober = Prober::on_client(&lab.topo, SocketAddr::new(ip, NODE_PORT)).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("n0 answers on the Service's address");
    // The active is cut: the standby takes the address, the Service answers again.
    lab.topo.cut_cable(0, Link::Mgmt).expect("cut");
    lab.topo.cut_cable(0, Link::Data).expect("cut");
    prober.wait_for_responder("n1", Duration::from_secs(5)).expect("n1 answers after the cut");
    let report = prober.stop().expect("report");
    eprintln!("cut: {}", report.summary());
    assert!(report.longest_gap_ms < 1000.0, "{}", report.summary());
    lab.block_on(async {
        let client = lab.client().await.expect("client");
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let evs = events.list(&ListParams::default()).await.expect("events");
            let notes: Vec<String> = evs
                .items
                .iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Service"))
                .map(|e| format!("{} {}", e.reason.as_deref().unwrap_or(""), e.note.as_deref().unwrap_or("")))
                .collect();
            if notes.iter().any(|n| n.starts_with("HolderChanged") && n.contains("from node n0 to node n1")) {
                assert!(notes.iter().any(|n| n.starts_with("Announced") && n.contains("node n0")), "{notes:#?}");
                break;
            }
            assert!(Instant::now() < deadline, "no HolderChanged Event on the Service: {notes:#?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Deleted: the address leaves the node and its FloatingIP goes.
        Api::<Service>::namespaced(client.clone(), "default")
            .delete("web", &DeleteParams::default())
            .await
            .expect("delete the Service");
        let fips: Api<havip_crds::FloatingIP> = Api::all(client);
        let n1 = lab.topo.node(1);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let held = netns::has_address(&n1.ns, &n1.data_if, ip).expect("addresses");
            let fip_gone = fips.get_opt(&havip_crds::vippool::service::fip_name(ip)).await.expect("get").is_none();
            if !held && fip_gone {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the deleted Service's address is still held ({held}) or its FloatingIP left ({})\n{}",
                !fip_gone,
                lab.logs_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// `externalTrafficPolicy: Local`: the address lives only on a member whose node has a
/// ready local endpoint, as kube-proxy's health check of the node says (here a listener
/// on the Service's healthCheckNodePort in each node stands in for kube-proxy: 200 with
/// an endpoint, 503 without). The active losing its last endpoint hands the address over
/// to the member that has one, without a failed connect.
#[test]
fn external_traffic_policy_local_keeps_the_address_on_a_node_with_an_endpoint() {
    if !netns::skip_unless_root(module_path!()) {
        return;
    }
    havip_e2e::init_tracing();
    let (mut lab, first) = lab_with_pool();
    for i in 0..2 {
        lab.serve(i, NODE_PORT).expect("kube-proxy's stand-in on the node port");
    }
    let ip = IpAddr::V4(first);
    let svc: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "local"},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "havip.io/l2", "externalTrafficPolicy": "Local",
                 "ports": [{"port": PORT, "nodePort": NODE_PORT, "protocol": "TCP"}], "selector": {"app": "local"}},
    }))
    .expect("service");
    // A client belongs to the runtime it was made in: one per block_on.
    let services = || async { Api::<Service>::namespaced(lab.client().await.expect("client"), "default") };
    let created = lab
        .block_on(async { services().await.create(&PostParams::default(), &svc).await })
        .expect("create the Service");
    let hc = created.spec.and_then(|s| s.health_check_node_port).expect("healthCheckNodePort");
    let hc = u16::try_from(hc).expect("port");
    // kube-proxy's answers: n0 has an endpoint, n1 has none (yet).
    let mut health: Vec<_> =
        [true, false].into_iter().enumerate().map(|(i, ok)| lab.endpoint_health(i, hc, ok).expect("health")).collect();
    lab.block_on(async {
        let services = services().await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while services.get("local").await.ok().as_ref().and_then(external_ip) != Some(ip) {
            assert!(Instant::now() < deadline, "no EXTERNAL-IP\n{}", lab.logs_tail(40));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let prober = Prober::on_client(&lab.topo, SocketAddr::new(ip, NODE_PORT)).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("n0 holds it");
    // n1 is not ready: it reports so, and nothing moves.
    lab.block_on(lab.wait_pair("web", Duration::from_secs(10), "n1 reported not ready", |p| {
        p.status.as_ref().is_some_and(|s| {
            s.members.iter().any(|m| {
                m.node == "n1" && m.role == Some(havip_crds::MemberRole::Standby) && m.ready.iter().any(|r| !r.ready)
            })
        })
    }))
    .expect("the pair reports a standby that cannot take over");
    // The endpoint moves: n1 gets one, n0 loses its last.
    lab.move_endpoint("web", &mut health, hc, 0, 1).expect("the endpoint moves to n1");
    // Handed over once n0's check has failed for 10 s (a planned move: no failed connect).
    prober.wait_for_responder("n1", Duration::from_secs(20)).expect("n1 holds it after n0 lost its endpoint");
    let report = prober.stop().expect("report");
    eprintln!("endpoint moved: {}", report.summary());
    // A planned move: no failed connect, but for at most one connection whose handshake
    // straddled the flip (README: connections are not drained).
    assert!(
        report.failed <= 1 && report.failures_beyond_the_flip(20.0).is_empty(),
        "a planned move: {}",
        report.summary()
    );
    // The pair records the move as n1 accepting n0's automatic handover, and n0's own
    // report says why it handed over: its listener (the health check) was down.
    let p = lab
        .block_on(lab.wait_pair("web", Duration::from_secs(10), "the move to n1 recorded", |p| {
            // RoleChange until n1 reports its reason.
            p.status.as_ref().is_some_and(|s| {
                s.last_transition
                    .as_ref()
                    .is_some_and(|t| t.to == "n1" && t.reason != havip_crds::TransitionReason::RoleChange)
                    && s.members.iter().any(|m| m.node == "n0" && m.role == Some(havip_crds::MemberRole::Standby))
            })
        }))
        .expect("the pair's last transition names n1");
    let st = p.status.expect("status");
    assert_eq!(
        st.last_transition.as_ref().map(|t| &t.reason),
        Some(&havip_crds::TransitionReason::AutoHandoverAccepted),
        "{:?}",
        st.last_transition
    );
    let n0 = st.members.iter().find(|m| m.node == "n0").expect("n0's report");
    assert_eq!(
        n0.last_transition.as_ref().map(|t| &t.reason),
        Some(&havip_crds::TransitionReason::VipUnhealthy),
        "n0 handed over for its failing health check: {:?}",
        n0.last_transition
    );
    drop(health);
}
