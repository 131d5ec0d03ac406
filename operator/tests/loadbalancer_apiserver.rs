//! havip as the LoadBalancer provider, against a real kube-apiserver + etcd, with the
//! operator under least-privilege RBAC and a simulated agent (it writes the FloatingIPs'
//! holder as the holder's agent would): allocation → FloatingIP → EXTERNAL-IP once
//! announced, Events, sharing, a requested address outside every pool, dual-stack,
//! other classes untouched, type change, deletion, exhaustion and release, pool shrink,
//! and an operator restart with 20 Services that keeps every address.
//!
//! One control plane and one operator, the scenarios in order.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use havip_crds::{FloatingIP, VIPPool, manager};
use havip_e2e::controlplane::ControlPlane;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const APPS: &str = "apps";
const TENANT: &str = "tenant";
const CLASS: &str = "havip.io/l2";

#[test]
fn the_operator_as_a_load_balancer_provider() {
    let cp = ControlPlane::start(Default::default()).expect("control plane");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = cp.client().await.expect("client");
        install_crds(&client).await;
        create_namespace(&client, NS).await;
        create_namespace(&client, APPS).await;
        create_namespace(&client, "bulk").await;
        create_namespace(&client, TENANT).await;
        for (n, ip) in [("n1", "10.0.0.1"), ("n2", "10.0.0.2")] {
            create_node(&client, n, ip).await;
        }
        install_operator_rbac(&client, "havip-operator-test").await;
        let kubeconfig = cp.kubeconfig_for("havip-operator-test", None).expect("operator kubeconfig");
        let op = Operator::start_with(&cp, &kubeconfig, "op-lb", &[]);
        apply_yaml(&client, &pair_yaml("lbpair", "n1", "n2")).await;
        pool(&client, "lan", &["192.0.2.0/29"], None).await;
        pool(&client, "v6", &["2001:db8::10-2001:db8::11"], None).await;

        allocation_and_announcement(&client).await;
        sharing(&client).await;
        dual_stack(&client).await;
        local_traffic_policy(&client).await;
        refusals(&client).await;
        type_change_and_deletion(&client).await;
        exhaustion_and_release(&client).await;
        pool_shrink(&client).await;
        reserved_addresses(&client).await;
        sharing_across_namespaces(&client).await;
        refused_address_released(&client).await;
        let op = restart_keeps_every_address(&client, &cp, &kubeconfig, op).await;
        eprintln!(
            "operator metrics:\n{}",
            op.metrics().lines().filter(|l| l.contains("controller=\"service\"")).collect::<Vec<_>>().join("\n")
        );
    });
}

async fn pool(client: &Client, name: &str, addresses: &[&str], extra: Option<serde_json::Value>) {
    let mut spec = serde_json::json!({"pair": "lbpair", "addresses": addresses});
    if let Some(serde_json::Value::Object(m)) = extra {
        for (k, v) in m {
            spec[k] = v;
        }
    }
    let doc = serde_json::json!({"apiVersion": "havip.io/v1alpha1", "kind": "VIPPool", "metadata": {"name": name}, "spec": spec});
    Api::<VIPPool>::all(client.clone())
        .patch(name, &PatchParams::apply("havip-test").force(), &Patch::Apply(&doc))
        .await
        .unwrap_or_else(|e| panic!("apply VIPPool {name}: {e}"));
}

/// Creates a Service of type LoadBalancer in `ns`.
async fn lb(client: &Client, ns: &str, name: &str, ports: &[(i32, &str)], extra: serde_json::Value) -> Service {
    let ports: Vec<serde_json::Value> = ports
        .iter()
        .map(|(p, proto)| serde_json::json!({"name": format!("p{p}"), "port": p, "protocol": proto}))
        .collect();
    let mut v = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": CLASS, "ports": ports, "selector": {"app": name}},
    });
    json_merge(&mut v, extra);
    let svc: Service = serde_json::from_value(v).unwrap();
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap_or_else(|e| panic!("create Service {ns}/{name}: {e}"))
}

/// The node ports the API server allocated to a Service's TCP ports, lowest first.
fn tcp_node_ports(svc: &Service) -> Vec<i32> {
    let mut ports: Vec<i32> = svc
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .filter(|p| p.protocol.as_deref() == Some("TCP"))
        .map(|p| p.node_port.expect("the API server allocates node ports to a LoadBalancer Service"))
        .collect();
    ports.sort_unstable();
    ports
}

fn json_merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

async fn get_svc(client: &Client, ns: &str, name: &str) -> Service {
    Api::<Service>::namespaced(client.clone(), ns).get(name).await.unwrap()
}

fn external_ips(s: &Service) -> Vec<String> {
    s.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .map(|i| i.iter().filter_map(|e| e.ip.clone()).collect())
        .unwrap_or_default()
}

async fn fips(client: &Client) -> BTreeMap<String, FloatingIP> {
    Api::<FloatingIP>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|f| (f.name_any(), f))
        .collect()
}

/// The FloatingIPs recording `ns/name`.
async fn fips_of(client: &Client, key: &str) -> Vec<FloatingIP> {
    fips(client)
        .await
        .into_values()
        .filter(|f| f.annotations().get("havip.io/services").is_some_and(|v| v.split(',').any(|s| s == key)))
        .collect()
}

/// Waits until `key` holds `n` FloatingIPs; returns their addresses (sorted).
async fn wait_allocated(client: &Client, key: &str, n: usize) -> Vec<String> {
    eventually(&format!("{key} holds {n} address(es)"), Duration::from_secs(10), || async {
        let f = fips_of(client, key).await;
        (f.len() == n).then(|| {
            let mut a: Vec<String> = f.iter().map(|f| f.spec.address.split('/').next().unwrap().to_owned()).collect();
            a.sort();
            a
        })
    })
    .await
}

/// The holder's agent reports the VIP as held (as the agent does, with its manager).
async fn hold(client: &Client, fip: &str, node: &str) {
    let patch = serde_json::json!({"apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP",
        "status": {"holder": node, "state": "Announced"}});
    Api::<FloatingIP>::all(client.clone())
        .patch_status(fip, &PatchParams::apply(&manager::agent("any")).force(), &Patch::Apply(&patch))
        .await
        .unwrap_or_else(|e| panic!("hold {fip}: {e}"));
}

/// Events about a namespaced object.
async fn service_events(client: &Client, ns: &str, name: &str) -> Vec<(String, String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

async fn wait_service_event(client: &Client, ns: &str, name: &str, reason: &str, phrase: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let evs = service_events(client, ns, name).await;
        if evs.iter().any(|(_, r, n)| r == reason && n.contains(phrase)) {
            return;
        }
        assert!(Instant::now() < deadline, "no Event {reason} ({phrase:?}) on Service {ns}/{name}: {evs:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn allocation_and_announcement(client: &Client) {
    let start = Instant::now();
    let web = lb(client, APPS, "web", &[(80, "TCP"), (443, "TCP"), (53, "UDP")], serde_json::json!({})).await;
    assert_eq!(wait_allocated(client, "apps/web", 1).await, vec!["192.0.2.1"], "the first address of the pool");
    let fip = Api::<FloatingIP>::all(client.clone()).get("lb-192-0-2-1").await.unwrap();
    assert_eq!(fip.spec.pair, "lbpair");
    assert_eq!(fip.spec.address, "192.0.2.1/32");
    assert_eq!(fip.spec.probe.ports, tcp_node_ports(&web), "the node ports of the Service's TCP ports are probed");
    assert_eq!(fip.spec.probe.ports.len(), 2, "{:?}", fip.spec.probe.ports);
    assert_eq!(fip.labels().get("havip.io/pool").map(String::as_str), Some("lan"));
    wait_service_event(client, APPS, "web", "AddressAllocated", "192.0.2.1 allocated from VIPPool lan").await;
    // Not announced yet: no EXTERNAL-IP.
    assert!(external_ips(&get_svc(client, APPS, "web").await).is_empty());
    hold(client, "lb-192-0-2-1", "n1").await;
    let svc = eventually("EXTERNAL-IP once announced", Duration::from_secs(3), || async {
        let s = get_svc(client, APPS, "web").await;
        (external_ips(&s) == ["192.0.2.1"]).then_some(s)
    })
    .await;
    eprintln!("Service created → EXTERNAL-IP (agent simulated): {:?}", start.elapsed());
    let ingress = svc.status.unwrap().load_balancer.unwrap().ingress.unwrap();
    assert_eq!(ingress[0].ip_mode.as_deref(), Some("VIP"));
    wait_service_event(client, APPS, "web", "Announced", "192.0.2.1 is announced by node n1 (HAPair lbpair)").await;
    // A failover: an Event on the Service, the EXTERNAL-IP stays.
    hold(client, "lb-192-0-2-1", "n2").await;
    wait_service_event(client, APPS, "web", "HolderChanged", "192.0.2.1 moved from node n1 to node n2").await;
    assert_eq!(external_ips(&get_svc(client, APPS, "web").await), ["192.0.2.1"]);
    // The pool counts it.
    eventually("pool lan: 6 addresses, 1 used, Ready", Duration::from_secs(10), || async {
        let p = Api::<VIPPool>::all(client.clone()).get("lan").await.ok()?;
        let s = p.status?;
        let ready = s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        (s.size == Some(6) && s.used == Some(1) && s.free == Some(5) && ready).then_some(())
    })
    .await;
}

async fn sharing(client: &Client) {
    let key = serde_json::json!({"metadata": {"annotations": {"havip.io/sharing-key": "edge"}}});
    lb(client, APPS, "dns", &[(53, "UDP")], key.clone()).await;
    let dns = wait_allocated(client, "apps/dns", 1).await;
    let api_svc = lb(client, APPS, "api", &[(8080, "TCP")], key.clone()).await;
    let api = wait_allocated(client, "apps/api", 1).await;
    assert_eq!(dns, api, "same key, other ports: one address");
    let f = &fips_of(client, "apps/api").await[0];
    assert_eq!(f.annotations()["havip.io/services"], "apps/api,apps/dns");
    assert_eq!(f.spec.probe.ports, tcp_node_ports(&api_svc), "the UDP Service adds no probe port");
    lb(client, APPS, "api2", &[(8080, "TCP")], key).await;
    let api2 = wait_allocated(client, "apps/api2", 1).await;
    assert_ne!(api2, api, "same key, same port: another address");
    // No key: never shares, even when asking for the address.
    lb(
        client,
        APPS,
        "nokey",
        &[(9000, "TCP")],
        serde_json::json!({"metadata": {"annotations": {"havip.io/address": api[0].clone()}}}),
    )
    .await;
    wait_service_event(client, APPS, "nokey", "AllocationFailed", "both Services need the same havip.io/sharing-key")
        .await;
    assert!(fips_of(client, "apps/nokey").await.is_empty());
    Api::<Service>::namespaced(client.clone(), APPS).delete("nokey", &DeleteParams::default()).await.unwrap();
}

async fn dual_stack(client: &Client) {
    lb(
        client,
        APPS,
        "ds",
        &[(80, "TCP")],
        serde_json::json!({"spec": {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"],
                            "allocateLoadBalancerNodePorts": false}}),
    )
    .await;
    let a = wait_allocated(client, "apps/ds", 2).await;
    assert!(a.contains(&"2001:db8::10".to_owned()), "{a:?}");
    let v6 = Api::<FloatingIP>::all(client.clone()).get("lb-2001-db8-0-0-0-0-0-10").await.unwrap();
    assert_eq!(v6.spec.address, "2001:db8::10/128");
    assert!(v6.spec.probe.ports.is_empty(), "no node ports, no probe ports: {:?}", v6.spec.probe.ports);
    hold(client, &havip_crds::vippool::service::fip_name(a[0].parse().unwrap()), "n1").await;
    hold(client, "lb-2001-db8-0-0-0-0-0-10", "n1").await;
    eventually("both families in the status, IPv4 first", Duration::from_secs(5), || async {
        let ips = external_ips(&get_svc(client, APPS, "ds").await);
        (ips.len() == 2 && ips[1] == "2001:db8::10").then_some(())
    })
    .await;
}

/// `externalTrafficPolicy: Local`: the FloatingIP checks kube-proxy's health check of
/// each member's node (the Service's healthCheckNodePort), so that only a member with a
/// ready local endpoint holds the address.
async fn local_traffic_policy(client: &Client) {
    let svc = lb(
        client,
        APPS,
        "local",
        &[(80, "TCP")],
        serde_json::json!({"spec": {"externalTrafficPolicy": "Local", "ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"]}}),
    )
    .await;
    let hc = svc
        .spec
        .as_ref()
        .and_then(|s| s.health_check_node_port)
        .expect("the API server allocates a healthCheckNodePort");
    assert_eq!(wait_allocated(client, "apps/local", 1).await, vec!["2001:db8::11"]);
    let f = Api::<FloatingIP>::all(client.clone()).get("lb-2001-db8-0-0-0-0-0-11").await.unwrap();
    assert_eq!(f.spec.probe.ports, tcp_node_ports(&svc));
    assert_eq!(
        f.spec.probe.health_checks,
        vec![havip_crds::HealthCheck { port: hc, path: "/healthz".into() }],
        "kube-proxy's health check of the node"
    );
    // Back to Cluster: the health check goes.
    Api::<Service>::namespaced(client.clone(), APPS)
        .patch(
            "local",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"externalTrafficPolicy": "Cluster"}})),
        )
        .await
        .unwrap();
    eventually("the health check removed with externalTrafficPolicy: Cluster", Duration::from_secs(5), || async {
        let f = Api::<FloatingIP>::all(client.clone()).get("lb-2001-db8-0-0-0-0-0-11").await.ok()?;
        f.spec.probe.health_checks.is_empty().then_some(())
    })
    .await;
    Api::<Service>::namespaced(client.clone(), APPS).delete("local", &DeleteParams::default()).await.unwrap();
}

async fn refusals(client: &Client) {
    // Another class and a Service without a class (havip is not the default here).
    lb(client, APPS, "other", &[(80, "TCP")], serde_json::json!({"spec": {"loadBalancerClass": "example.com/lb"}}))
        .await;
    let mut plain = serde_json::json!({});
    json_merge(&mut plain, serde_json::json!({"spec": {"loadBalancerClass": null}}));
    lb(client, APPS, "plain", &[(80, "TCP")], plain).await;
    // A requested address in no pool.
    lb(
        client,
        APPS,
        "outside",
        &[(80, "TCP")],
        serde_json::json!({"metadata": {"annotations": {"havip.io/address": "198.51.100.7"}}}),
    )
    .await;
    wait_service_event(client, APPS, "outside", "AllocationFailed", "198.51.100.7 is in no VIPPool").await;
    // A malformed annotation.
    lb(
        client,
        APPS,
        "garbled",
        &[(80, "TCP")],
        serde_json::json!({"metadata": {"annotations": {"havip.io/address": "web.example"}}}),
    )
    .await;
    wait_service_event(client, APPS, "garbled", "InvalidAnnotation", "web.example").await;
    // By then the operator had seen the other two as well: nothing was allocated.
    for key in ["apps/other", "apps/plain", "apps/outside", "apps/garbled"] {
        assert!(fips_of(client, key).await.is_empty(), "{key} got an address");
    }
    for name in ["other", "plain"] {
        assert!(external_ips(&get_svc(client, APPS, name).await).is_empty());
    }
    let api = Api::<Service>::namespaced(client.clone(), APPS);
    for name in ["other", "plain", "outside", "garbled"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
}

async fn type_change_and_deletion(client: &Client) {
    let api = Api::<Service>::namespaced(client.clone(), APPS);
    // api2 has an EXTERNAL-IP, then becomes a ClusterIP Service: released, status cleared.
    let addr = wait_allocated(client, "apps/api2", 1).await;
    let fip = havip_crds::vippool::service::fip_name(addr[0].parse().unwrap());
    hold(client, &fip, "n1").await;
    eventually("api2 EXTERNAL-IP", Duration::from_secs(5), || async {
        (!external_ips(&get_svc(client, APPS, "api2").await).is_empty()).then_some(())
    })
    .await;
    api.patch("api2", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"type": "ClusterIP"}})))
        .await
        .unwrap();
    eventually("api2 released and its status cleared", Duration::from_secs(5), || async {
        let gone = !fips(client).await.contains_key(&fip);
        (gone && external_ips(&get_svc(client, APPS, "api2").await).is_empty()).then_some(())
    })
    .await;
    // A shared address outlives one of its Services: dns leaves, api keeps it.
    let shared = wait_allocated(client, "apps/dns", 1).await;
    api.delete("dns", &DeleteParams::default()).await.unwrap();
    eventually("dns left the shared FloatingIP", Duration::from_secs(5), || async {
        let f = fips_of(client, "apps/api").await;
        (f.len() == 1 && f[0].annotations()["havip.io/services"] == "apps/api").then_some(())
    })
    .await;
    assert_eq!(wait_allocated(client, "apps/api", 1).await, shared);
    // Deleted: the FloatingIP goes.
    api.delete("api", &DeleteParams::default()).await.unwrap();
    let fip = havip_crds::vippool::service::fip_name(shared[0].parse().unwrap());
    eventually("api's FloatingIP deleted", Duration::from_secs(5), || async {
        (!fips(client).await.contains_key(&fip)).then_some(())
    })
    .await;
}

async fn exhaustion_and_release(client: &Client) {
    // lan: 6 addresses, web and ds hold 2; four more fill it.
    for i in 1..=4 {
        lb(client, APPS, &format!("fill{i}"), &[(80, "TCP")], serde_json::json!({})).await;
        wait_allocated(client, &format!("apps/fill{i}"), 1).await;
    }
    lb(client, APPS, "waiting", &[(80, "TCP")], serde_json::json!({})).await;
    wait_service_event(client, APPS, "waiting", "AllocationFailed", "no free IPv4 address left in VIPPool(s) lan")
        .await;
    eventually("pool lan full", Duration::from_secs(10), || async {
        let s = Api::<VIPPool>::all(client.clone()).get("lan").await.ok()?.status?;
        (s.free == Some(0) && s.used == Some(6)).then_some(())
    })
    .await;
    let freed = wait_allocated(client, "apps/fill2", 1).await;
    Api::<Service>::namespaced(client.clone(), APPS).delete("fill2", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        wait_allocated(client, "apps/waiting", 1).await,
        freed,
        "the released address goes to the waiting Service"
    );
}

async fn pool_shrink(client: &Client) {
    // lan shrinks to its first three addresses: the Services above them are released
    // (and wait, since nothing is free).
    let before: BTreeMap<String, Vec<String>> = {
        let mut m = BTreeMap::new();
        for s in ["web", "fill1", "fill3", "fill4", "waiting"] {
            m.insert(s.to_owned(), wait_allocated(client, &format!("apps/{s}"), 1).await);
        }
        m
    };
    pool(client, "lan", &["192.0.2.1-192.0.2.3"], None).await;
    eventually("addresses outside the shrunk pool released", Duration::from_secs(10), || async {
        let all = fips(client).await;
        let v4: Vec<&FloatingIP> = all.values().filter(|f| f.spec.address.starts_with("192.0.2.")).collect();
        (v4.len() == 3
            && v4.iter().all(|f| {
                let last: u8 = f.spec.address.split('/').next().unwrap().rsplit('.').next().unwrap().parse().unwrap();
                (1..=3).contains(&last)
            }))
        .then_some(())
    })
    .await;
    // Those inside kept their address.
    for (s, a) in &before {
        let last: u8 = a[0].rsplit('.').next().unwrap().parse().unwrap();
        if (1..=3).contains(&last) && s != "ds" {
            assert_eq!(&wait_allocated(client, &format!("apps/{s}"), 1).await, a, "{s} kept its address");
        }
    }
}

/// The addresses a pool never hands out: the API server's ClusterIP, its own address (its
/// EndpointSlice) and any Node's. The pool skips them and says so (status, `Ready`'s
/// message, an Event); a Service that asks for one waits, with the reason.
async fn reserved_addresses(client: &Client) {
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let kubernetes = get_svc(client, "default", "kubernetes").await;
    let cluster_ip = kubernetes.spec.and_then(|s| s.cluster_ip).expect("the API server's ClusterIP");
    create_node(client, "n9", "10.30.0.1").await;
    // This control plane runs no endpoint reconciler: the test writes the slice as the
    // API server would.
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), "default");
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.30.0.2"], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
    }))
    .unwrap();
    slices.create(&PostParams::default(), &slice).await.expect("EndpointSlice");
    let cidr = format!("{cluster_ip}/32");
    pool(client, "guarded", &[&cidr, "10.30.0.1-10.30.0.3"], Some(serde_json::json!({"autoAssign": false}))).await;
    let guarded = serde_json::json!({"metadata": {"annotations": {"havip.io/pool": "guarded"}}});
    let got = wait_allocated_after(client, APPS, "guarded", 80, guarded).await;
    assert_eq!(got, ["10.30.0.3"], "the reserved addresses are skipped");
    let message = eventually("pool guarded: 4 addresses, 3 reserved, 1 used", Duration::from_secs(10), || async {
        let s = Api::<VIPPool>::all(client.clone()).get("guarded").await.ok()?.status?;
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready" && c.status == "True")?;
        (s.size == Some(4) && s.reserved == Some(3) && s.used == Some(1) && s.free == Some(0))
            .then(|| ready.message.clone())
    })
    .await;
    for phrase in
        [cluster_ip.as_str(), "10.30.0.1 (the InternalIP of node n9)", "10.30.0.2 (an address of the API server"]
    {
        assert!(message.contains(phrase), "{phrase:?} in {message:?}");
    }
    wait_event(client, "guarded", "ReservedAddress", "node n9").await;
    let ask = serde_json::json!({"metadata": {"annotations": {"havip.io/address": cluster_ip.clone()}}});
    lb(client, APPS, "apiserver", &[(443, "TCP")], ask).await;
    wait_service_event(client, APPS, "apiserver", "AllocationFailed", "the API server's ClusterIP").await;
    assert!(fips_of(client, "apps/apiserver").await.is_empty());
    let api = Api::<Service>::namespaced(client.clone(), APPS);
    for name in ["guarded", "apiserver"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    slices.delete("kubernetes", &DeleteParams::default()).await.unwrap();
    Api::<Node>::all(client.clone()).delete("n9", &DeleteParams::default()).await.unwrap();
    eventually("pool guarded: only the ClusterIP reserved", Duration::from_secs(10), || async {
        let s = Api::<VIPPool>::all(client.clone()).get("guarded").await.ok()?.status?;
        (s.reserved == Some(1) && s.used == Some(0) && s.free == Some(3)).then_some(())
    })
    .await;
}

/// Services share an address only within its namespace, unless the pool says
/// `sharingScope: Cluster`: a Service of another namespace that reuses the sharing key it
/// read on the (cluster-scoped) FloatingIP gets an address of its own, or waits when it
/// asks for that one.
async fn sharing_across_namespaces(client: &Client) {
    pool(client, "share", &["198.51.100.1-198.51.100.3"], Some(serde_json::json!({"autoAssign": false}))).await;
    let annotations = |extra: serde_json::Value| {
        let mut a = serde_json::json!({"havip.io/pool": "share", "havip.io/sharing-key": "edge"});
        json_merge(&mut a, extra);
        serde_json::json!({"metadata": {"annotations": a}})
    };
    let owner = wait_allocated_after(client, APPS, "owner", 80, annotations(serde_json::json!({}))).await;
    assert_eq!(owner, ["198.51.100.1"]);
    let intruder = wait_allocated_after(client, TENANT, "intruder", 443, annotations(serde_json::json!({}))).await;
    assert_eq!(intruder, ["198.51.100.2"], "the key of another namespace's address is not joined");
    let f = &fips_of(client, "apps/owner").await[0];
    assert_eq!(f.annotations()["havip.io/services"], "apps/owner");
    let ask = annotations(serde_json::json!({"havip.io/address": "198.51.100.1"}));
    lb(client, TENANT, "asks", &[(8443, "TCP")], ask).await;
    wait_service_event(client, TENANT, "asks", "AllocationFailed", "namespace apps").await;
    assert!(fips_of(client, "tenant/asks").await.is_empty());
    // The pool lets every namespace share.
    pool(
        client,
        "share",
        &["198.51.100.1-198.51.100.3"],
        Some(serde_json::json!({"autoAssign": false, "sharingScope": "Cluster"})),
    )
    .await;
    assert_eq!(wait_allocated(client, "tenant/asks", 1).await, ["198.51.100.1"]);
    assert_eq!(fips_of(client, "apps/owner").await[0].annotations()["havip.io/services"], "apps/owner,tenant/asks");
    Api::<Service>::namespaced(client.clone(), APPS).delete("owner", &DeleteParams::default()).await.unwrap();
    for name in ["intruder", "asks"] {
        Api::<Service>::namespaced(client.clone(), TENANT).delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually("the pool share released", Duration::from_secs(10), || async {
        (!fips(client).await.values().any(|f| f.spec.address.starts_with("198.51.100."))).then_some(())
    })
    .await;
}

/// Creates a Service (one TCP port) and waits for its address.
async fn wait_allocated_after(
    client: &Client,
    ns: &str,
    name: &str,
    port: i32,
    extra: serde_json::Value,
) -> Vec<String> {
    lb(client, ns, name, &[(port, "TCP")], extra).await;
    wait_allocated(client, &format!("{ns}/{name}"), 1).await
}

/// An address that became a Node's after it was allocated (here: a member's, which
/// the operator refused before too): its FloatingIP is refused and released, the Service
/// gets another address, and an Event on the Service says why.
async fn refused_address_released(client: &Client) {
    use k8s_openapi::api::core::v1::Node;
    pool(client, "moving", &["203.0.113.1-203.0.113.2"], Some(serde_json::json!({"autoAssign": false}))).await;
    let mover = serde_json::json!({"metadata": {"annotations": {"havip.io/pool": "moving"}}});
    assert_eq!(wait_allocated_after(client, APPS, "mover", 80, mover).await, ["203.0.113.1"]);
    let nodes = Api::<Node>::all(client.clone());
    let addresses = |extra: &[(&str, &str)]| {
        let list: Vec<serde_json::Value> = [("InternalIP", "10.0.0.2")]
            .iter()
            .chain(extra)
            .map(|(t, a)| serde_json::json!({"type": t, "address": a}))
            .collect();
        Patch::Merge(serde_json::json!({"status": {"addresses": list}}))
    };
    nodes.patch_status("n2", &PatchParams::default(), &addresses(&[("ExternalIP", "203.0.113.1")])).await.unwrap();
    eventually("mover moved to 203.0.113.2", Duration::from_secs(15), || async {
        let f = fips_of(client, "apps/mover").await;
        (f.len() == 1 && f[0].spec.address == "203.0.113.2/32").then_some(())
    })
    .await;
    wait_service_event(client, APPS, "mover", "AddressRefused", "203.0.113.1").await;
    wait_service_event(client, APPS, "mover", "AddressRefused", "the ExternalIP of node n2").await;
    assert!(!fips(client).await.contains_key("lb-203-0-113-1"), "the refused FloatingIP is gone");
    nodes.patch_status("n2", &PatchParams::default(), &addresses(&[])).await.unwrap();
    Api::<Service>::namespaced(client.clone(), APPS).delete("mover", &DeleteParams::default()).await.unwrap();
    eventually("mover released", Duration::from_secs(10), || async {
        fips_of(client, "apps/mover").await.is_empty().then_some(())
    })
    .await;
}

async fn restart_keeps_every_address(
    client: &Client,
    cp: &ControlPlane,
    kubeconfig: &std::path::Path,
    op: Operator,
) -> Operator {
    pool(
        client,
        "bulk",
        &["10.20.0.0/24"],
        Some(serde_json::json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "bulk"}}})),
    )
    .await;
    for i in 0..20 {
        lb(client, "bulk", &format!("s{i}"), &[(80, "TCP")], serde_json::json!({})).await;
    }
    let mut before = BTreeMap::new();
    for i in 0..20 {
        let key = format!("bulk/s{i}");
        let a = wait_allocated(client, &key, 1).await;
        assert!(a[0].starts_with("10.20.0."), "{key}: {a:?} (the bulk pool selects only its namespace)");
        before.insert(key, a);
    }
    // Settled: every FloatingIP accepted, its pair found, its member labels set and,
    // where nobody holds it, `state: Pending` written (the first operator's last
    // writes), before the versions are taken.
    let versions: BTreeMap<String, Option<String>> =
        eventually("every FloatingIP settled", Duration::from_secs(20), || async {
            let all = fips(client).await;
            let settled = all.values().all(|f| {
                let conds = f.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
                let has = |t: &str| conds.iter().any(|c| c.type_ == t && c.status == "True");
                let st = f.status.clone().unwrap_or_default();
                let pending_or_held = st.state == Some(havip_crds::VipState::Pending) || st.holder.is_some();
                has("Accepted") && has("PairFound") && pending_or_held && f.labels().contains_key("member.havip.io/n1")
            });
            settled.then(|| all.into_iter().map(|(n, f)| (n, f.resource_version())).collect())
        })
        .await;
    drop(op);
    let op = Operator::start_with(cp, kubeconfig, "op-lb-2", &[]);
    // Every Service reconciled again by the new process …
    eventually("the new operator reconciled every Service", Duration::from_secs(30), || async {
        (op.metric("havip_operator_reconciles_total{controller=\"service\",result=\"ok\"}") >= 20.0).then_some(())
    })
    .await;
    // … and nothing moved: same addresses, no FloatingIP written.
    for (key, a) in &before {
        assert_eq!(&wait_allocated(client, key, 1).await, a, "{key} kept its address over the restart");
    }
    let after_fips = fips(client).await;
    let after: BTreeMap<String, Option<String>> =
        after_fips.iter().map(|(n, f)| (n.clone(), f.resource_version())).collect();
    let changed: Vec<String> = after_fips
        .iter()
        .filter(|(n, f)| versions.get(*n) != Some(&f.resource_version()))
        .map(|(_, f)| serde_json::to_string_pretty(f).unwrap())
        .collect();
    assert_eq!(after, versions, "the restarted operator rewrote no FloatingIP; rewritten:\n{}", changed.join("\n"));
    op
}
