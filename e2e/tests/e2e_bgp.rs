//! Routed VIPs through the Kubernetes path, on the local control plane: the operator,
//! one agent per node namespace, FRR on every node peering with an FRR router (the
//! topology's gateway), and a client in another subnet behind the router. An HAPair with
//! `announceMode: BGP` and its FloatingIP: the holder's route is the router's, the client
//! reaches the VIP, a cut moves it. A VIPPool with `announceMode: BGP`: a LoadBalancer
//! Service's EXTERNAL-IP, outside every subnet of the nodes, answers through the router;
//! with `externalTrafficPolicy: Local` the route follows the node with a ready endpoint.
//! Root only.

use havip_e2e::bgp::Speaker;
use havip_e2e::kubelab::{KubeLab, KubeLabOptions};
use havip_e2e::netns::{self, Link};
use havip_e2e::traffic::{Prober, ProberConfig};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The node port of the Service (kube-proxy's stand-in listens on it in each node).
const NODE_PORT: u16 = 30080;

fn lab() -> Option<KubeLab> {
    if !netns::skip_unless_root(module_path!()) {
        return None;
    }
    havip_e2e::init_tracing();
    Some(KubeLab::start(KubeLabOptions { bgp: Some(Speaker::Frr), ..Default::default() }).expect("lab"))
}

fn next_hops(lab: &KubeLab, ip: IpAddr) -> Vec<String> {
    lab.routing.as_ref().map(|r| r.best_next_hops(&format!("{ip}/32"))).unwrap_or_default()
}

fn wait_next_hop(lab: &KubeLab, ip: IpAddr, node: usize, timeout: Duration) -> Duration {
    let hop = IpAddr::V4(lab.topo.node(node).ip(Link::Data));
    let routing = lab.routing.as_ref().expect("a routed lab");
    routing.wait_routed(ip, hop, timeout).unwrap_or_else(|e| panic!("{e}\n{}", lab.logs_tail(30)))
}

fn client_ns(lab: &KubeLab) -> String {
    lab.topo.routed_client().map(|c| c.ns.clone()).expect("a routed client")
}

#[test]
fn a_pair_in_bgp_mode_is_routed_to_its_holder_and_moves_on_a_cut() {
    let Some(lab) = lab() else { return };
    let vip = lab.topo.routed_vip(0);
    let yaml = format!(
        "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {{name: web}}\nspec:\n  announceMode: BGP\n  members:\n    \
         - {{node: n0, priority: 200}}\n    - {{node: n1, priority: 190}}\n  heartbeat:\n    paths:\n      \
         - {{name: data, addressType: InternalIP}}\n      - {{name: mgmt, addressType: ExternalIP}}\n---\n\
         apiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata: {{name: web-vip}}\nspec:\n  pair: web\n  \
         address: {vip}/32\n  probe: {{ports: [8080]}}\n"
    );
    lab.block_on(async { lab.apply(&yaml).await.expect("apply") });
    let took = wait_next_hop(&lab, IpAddr::V4(vip), 0, Duration::from_secs(20));
    eprintln!("the router routes {vip} to n0 {took:?} after the apply");
    let n0 = lab.topo.node(0);
    assert!(netns::has_address(&n0.ns, "havip0", IpAddr::V4(vip)).expect("addresses"), "on n0's havip0");
    assert!(!netns::has_address(&n0.ns, &n0.data_if, IpAddr::V4(vip)).expect("addresses"), "not on its eth0");
    let prober =
        Prober::start(&client_ns(&lab), ProberConfig::new(SocketAddr::new(IpAddr::V4(vip), 8080))).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("the client reaches n0 through the router");
    // The FloatingIP's status: held by n0 and announced (the holder's self-check found
    // the address in its kernel and its listener answering), no MAC to show.
    lab.block_on(async {
        let fips: Api<havip_crds::FloatingIP> = Api::all(lab.client().await.expect("client"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let f = fips.get("web-vip").await.expect("get");
            let st = f.status.clone().unwrap_or_default();
            if st.holder.as_deref() == Some("n0") && st.state == Some(havip_crds::VipState::Announced) {
                break;
            }
            assert!(Instant::now() < deadline, "FloatingIP status: {st:?}\n{}", lab.logs_tail(30));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    lab.topo.cut_node(0).expect("cut");
    wait_next_hop(&lab, IpAddr::V4(vip), 1, Duration::from_secs(10));
    prober.wait_for_responder("n1", Duration::from_secs(10)).expect("n1 answers after the cut");
    eprintln!("cut: {}", prober.stop().expect("report").summary());
    // The pair deleted: its holder gives the address up, and with it the route.
    lab.block_on(async {
        let pairs: Api<havip_crds::HAPair> = Api::all(lab.client().await.expect("client"));
        pairs.delete("web", &kube::api::DeleteParams::default()).await.expect("delete the pair");
    });
    let start = Instant::now();
    while !next_hops(&lab, IpAddr::V4(vip)).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the deleted pair's route is still at the router: {:?}\n{}",
            next_hops(&lab, IpAddr::V4(vip)),
            lab.logs_tail(30)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let n1 = lab.topo.node(1);
    assert!(!netns::has_address(&n1.ns, "havip0", IpAddr::V4(vip)).expect("addresses"), "off n1's havip0");
    eprintln!("the deleted pair's route withdrawn {:?} after the delete", start.elapsed());
}

/// Each member's status entry says what its node's FRR says (asked over its vty socket):
/// the holder advertises the VIP to the router, the standby has its sessions and
/// advertises nothing; with the standby's bgpd gone the pair is Degraded
/// (`BgpNotAdvertised`, naming the standby) — it could not advertise the VIP after a
/// takeover.
#[test]
fn the_members_status_says_what_their_speakers_advertise() {
    let Some(mut lab) = lab() else { return };
    let vip = lab.topo.routed_vip(0);
    let yaml = format!(
        "{}\n---\napiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata: {{name: web-vip}}\nspec:\n  pair: web\n  \
         address: {vip}/32\n  announce: {{mode: BGP}}\n  probe: {{ports: [8080]}}\n",
        lab.pair_yaml("web").split("\n---\n").next().expect("the pair document")
    );
    lab.block_on(async { lab.apply(&yaml).await.expect("apply") });
    wait_next_hop(&lab, IpAddr::V4(vip), 0, Duration::from_secs(20));
    let router = lab.topo.gateway().ip.to_string();
    let pair = |lab: &KubeLab| -> havip_crds::HAPair {
        lab.block_on(async {
            let pairs: Api<havip_crds::HAPair> = Api::all(lab.client().await.expect("client"));
            pairs.get("web").await.expect("get the pair")
        })
    };
    let member = |p: &havip_crds::HAPair, node: &str| {
        p.status.as_ref().and_then(|s| s.members.iter().find(|m| m.node == node).cloned()).and_then(|m| m.bgp)
    };
    let start = Instant::now();
    loop {
        let p = pair(&lab);
        let (n0, n1) = (member(&p, "n0"), member(&p, "n1"));
        let advertised = n0.as_ref().is_some_and(|b| {
            b.advertised.iter().any(|a| a.address == format!("{vip}/32") && a.peers.contains(&router))
                && b.sessions.iter().any(|s| s.peer == router && s.established)
        });
        let standby = n1.as_ref().is_some_and(|b| {
            b.error.is_none() && b.advertised.is_empty() && b.sessions.iter().any(|s| s.peer == router && s.established)
        });
        if advertised && standby {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "members' bgp: n0 {n0:?}, n1 {n1:?}\n{}", lab.logs_tail(30));
        std::thread::sleep(Duration::from_millis(200));
    }
    let degraded = |p: &havip_crds::HAPair| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Degraded").cloned())
            .map(|c| (c.status, c.reason, c.message))
    };
    let before = degraded(&pair(&lab));
    assert!(
        before.as_ref().is_none_or(|(_, _, m)| !m.contains("BGP")),
        "no BGP cause while both speakers carry it: {before:?}"
    );
    // Control: the standby's bgpd dies.
    if let Some(havip_e2e::bgp::NodeSpeaker::Frr(f)) = lab.routing.as_mut().and_then(|r| r.nodes.get_mut(1)) {
        f.kill_bgpd();
    }
    let start = Instant::now();
    loop {
        let d = degraded(&pair(&lab));
        if let Some((status, _, message)) = &d
            && status == "True"
            && message.contains("n1 (a standby): its FRR cannot be asked")
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "Degraded: {d:?}\n{}", lab.logs_tail(30));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Applies the pair `web` and the VIPPool `routed` (BGP mode, its first address outside
/// every subnet of the nodes), creates the Service `svc` (a LoadBalancer of class
/// havip.io/l2 on [`NODE_PORT`]) and waits for its EXTERNAL-IP, the pool's first address.
/// Returns it and the Service as created (its healthCheckNodePort, if any).
fn routed_service(lab: &KubeLab, svc: serde_json::Value) -> (IpAddr, Service) {
    let first = lab.topo.routed_vip(0);
    let o = first.octets();
    let pair = lab.pair_yaml("web");
    let pair = pair.split("\n---\n").next().expect("the pair document").to_owned();
    let pool = format!(
        "apiVersion: havip.io/v1alpha1\nkind: VIPPool\nmetadata: {{name: routed}}\nspec:\n  pair: web\n  \
         announceMode: BGP\n  addresses: [\"{first}-{}.{}.{}.59\"]\n",
        o[0], o[1], o[2]
    );
    let svc: Service = serde_json::from_value(svc).expect("service");
    let name = svc.metadata.name.clone().unwrap_or_default();
    let (ip, created) = lab.block_on(async {
        lab.apply(&format!("{pair}\n---\n{pool}")).await.expect("apply");
        let client = lab.client().await.expect("client");
        let services: Api<Service> = Api::namespaced(client, "default");
        let created = services.create(&PostParams::default(), &svc).await.expect("create the Service");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = services.get(&name).await.expect("get");
            if let Some(ip) = havip_e2e::api::external_ip(&s) {
                return (ip, created);
            }
            assert!(Instant::now() < deadline, "no EXTERNAL-IP within 10 s\n{}", lab.logs_tail(40));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert_eq!(ip, IpAddr::V4(first), "the pool's first address");
    (ip, created)
}

#[test]
fn a_pool_in_bgp_mode_gives_a_service_an_address_answered_through_the_router() {
    let Some(mut lab) = lab() else { return };
    for i in 0..2 {
        lab.serve(i, NODE_PORT).expect("kube-proxy's stand-in on the node port");
    }
    let (ip, _) = routed_service(
        &lab,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"type": "LoadBalancer", "loadBalancerClass": "havip.io/l2",
                     "ports": [{"port": 80, "nodePort": NODE_PORT, "protocol": "TCP"}], "selector": {"app": "web"}},
        }),
    );
    let holder = {
        let start = Instant::now();
        loop {
            let h: Vec<usize> =
                (0..2).filter(|i| netns::has_address(&lab.topo.node(*i).ns, "havip0", ip).unwrap_or(false)).collect();
            if h.len() == 1 {
                break h[0];
            }
            assert!(start.elapsed() < Duration::from_secs(10), "one holder on havip0: {h:?}\n{}", lab.logs_tail(30));
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_next_hop(&lab, ip, holder, Duration::from_secs(10));
    let prober = Prober::start(&client_ns(&lab), ProberConfig::new(SocketAddr::new(ip, NODE_PORT))).expect("prober");
    prober
        .wait_for_responder(&format!("n{holder}"), Duration::from_secs(5))
        .expect("the Service's address answers through the router");
}

/// `externalTrafficPolicy: Local` in BGP mode: the address is advertised only by a member
/// whose node has a ready local endpoint (kube-proxy's health check, stood in for by a
/// listener on the Service's healthCheckNodePort in each node: 200 with an endpoint, 503
/// without), and the router's route follows the endpoint when it moves: the active that
/// loses its last endpoint hands the address over (advertised on the target first, then
/// withdrawn: new connections time out only while the router switches).
#[test]
fn external_traffic_policy_local_in_bgp_mode_routes_the_address_to_a_node_with_an_endpoint() {
    let Some(mut lab) = lab() else { return };
    for i in 0..2 {
        lab.serve(i, NODE_PORT).expect("kube-proxy's stand-in on the node port");
    }
    let (ip, created) = routed_service(
        &lab,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "local"},
            "spec": {"type": "LoadBalancer", "loadBalancerClass": "havip.io/l2", "externalTrafficPolicy": "Local",
                     "ports": [{"port": 80, "nodePort": NODE_PORT, "protocol": "TCP"}], "selector": {"app": "local"}},
        }),
    );
    let hc = created.spec.and_then(|s| s.health_check_node_port).expect("healthCheckNodePort");
    let hc = u16::try_from(hc).expect("port");
    // kube-proxy's answers: n0 has an endpoint, n1 has none (yet).
    let mut health: Vec<_> =
        [true, false].into_iter().enumerate().map(|(i, ok)| lab.endpoint_health(i, hc, ok).expect("health")).collect();
    wait_next_hop(&lab, ip, 0, Duration::from_secs(15));
    let prober = Prober::start(&client_ns(&lab), ProberConfig::new(SocketAddr::new(ip, NODE_PORT))).expect("prober");
    prober.wait_for_responder("n0", Duration::from_secs(5)).expect("n0 answers through the router");
    lab.block_on(lab.wait_member_ready("web", "n1", false, Duration::from_secs(10)))
        .expect("the pair reports a standby without an endpoint");
    assert_eq!(next_hops(&lab, ip), vec![lab.topo.node(0).ip(Link::Data).to_string()], "n1 advertises nothing");

    // The endpoint moves: n1 gets one, then n0 loses its last.
    lab.move_endpoint("web", &mut health, hc, 0, 1).expect("the endpoint moves to n1");
    wait_next_hop(&lab, ip, 1, Duration::from_secs(25));
    prober.wait_for_responder("n1", Duration::from_secs(10)).expect("n1 answers through the router");
    let report = prober.stop().expect("report");
    eprintln!("endpoint moved, routed: {}", report.summary());
    // An automatic handover (the old holder's last endpoint gone) is not drained: the old
    // holder withdraws at once, and new connections that reach the router before the
    // target's route does time out — the router's switch, about 160 ms here (each bgpd on
    // the way holds a change 50 ms). In layer 2 that switch is one ARP. Bounded to it.
    assert_eq!(report.responder_sequence(), vec!["n0", "n1"], "{}", report.summary());
    let (last_n0, first_n1) = (report.runs[0].last_ms, report.runs[1].first_ms);
    assert!(
        report.failures.iter().all(|f| f.start_ms >= last_n0 - 60.0 && f.start_ms <= first_n1),
        "failures beyond the route's switch: {}",
        report.summary()
    );
    assert!(first_n1 - last_n0 < 400.0, "{}", report.summary());
    drop(health);
}
