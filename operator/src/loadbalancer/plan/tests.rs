//! The Service plan's rules, one table per rule, and its convergence: applying a plan to
//! the observation (as the API server would leave the objects) and planning again plans
//! nothing — for each table, and for generated observations.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use super::{
    CLAIMED_REQUEUE, INVALID_REQUEUE, NAMESPACE_REQUEUE, Observed, Plan, ServiceMemo, Step, plan, replacement, sweep,
};
use crate::loadbalancer::alloc::ServiceKey;
use crate::loadbalancer::model::{PoolState, ingress_ips, pool_states, service_key, services_of};
use crate::model::{ApiServerSource, Reserved};
use havip_crds::vippool::service as contract;
use havip_crds::{FloatingIP, VIPPool, reason};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

const RESYNC: Duration = Duration::from_secs(60);

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn vippool(name: &str, addresses: &[&str], auto_assign: bool) -> VIPPool {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "havip.io/v1alpha1", "kind": "VIPPool",
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"pair": "web", "addresses": addresses, "autoAssign": auto_assign},
    }))
    .expect("pool")
}

/// The pools of every test: `lan` (192.0.2.1–6, auto-assigned), `v6` (2001:db8::/125)
/// and `manual` (198.51.100.1–2, only when asked for).
fn pools() -> Vec<PoolState> {
    pool_states(
        &[
            vippool("lan", &["192.0.2.0/29"], true),
            vippool("v6", &["2001:db8::/125"], true),
            vippool("manual", &["198.51.100.0/30"], false),
        ],
        |_| true,
    )
}

/// A Service of type LoadBalancer of class `havip.io/l2` with TCP `ports` (node port
/// 30000 + port).
fn service(key: &str, ports: &[i32]) -> Service {
    let (ns, name) = key.split_once('/').expect("ns/name");
    let ports: Vec<_> =
        ports.iter().map(|p| serde_json::json!({"port": p, "protocol": "TCP", "nodePort": 30000 + p})).collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "havip.io/l2", "ports": ports},
    }))
    .expect("service")
}

fn annotate(s: &mut Service, k: &str, v: &str) {
    s.annotations_mut().insert(k.to_owned(), v.to_owned());
}

fn with_ingress(s: &mut Service, addresses: &[IpAddr]) {
    let ingress: Vec<_> = addresses.iter().map(|a| serde_json::json!({"ip": a.to_string(), "ipMode": "VIP"})).collect();
    s.status = Some(
        serde_json::from_value(serde_json::json!({"loadBalancer": {"ingress": ingress}})).expect("service status"),
    );
}

/// The FloatingIP of `address` as the operator allocates it from `pool` to `services`.
fn allocated(address: &str, pool: &str, services: &[&str], sharing: Option<&str>) -> FloatingIP {
    let a = ip(address);
    let prefix = if a.is_ipv4() { 32 } else { 128 };
    let mut v = serde_json::json!({
        "apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP",
        "metadata": {"name": contract::fip_name(a), "generation": 1, "resourceVersion": "1", "uid": "u",
                     "labels": {"app.kubernetes.io/managed-by": "havip-operator", "havip.io/load-balancer": "true",
                                "havip.io/pool": pool},
                     "annotations": {"havip.io/services": services.join(",")}},
        "spec": {"pair": "web", "address": format!("{address}/{prefix}")},
    });
    if let Some(k) = sharing {
        v["metadata"]["annotations"]["havip.io/sharing-key"] = k.into();
    }
    serde_json::from_value(v).expect("fip")
}

fn by_hand(name: &str, address: &str) -> FloatingIP {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP",
        "metadata": {"name": name, "generation": 1},
        "spec": {"pair": "web", "address": format!("{address}/32")},
    }))
    .expect("fip")
}

fn set_holder(f: &mut FloatingIP, holder: Option<&str>) {
    f.status.get_or_insert_with(Default::default).holder = holder.map(str::to_owned);
}

/// Marks a FloatingIP refused by the operator (its current generation).
fn refuse(f: &mut FloatingIP, reason: &str) {
    let status = serde_json::json!({"conditions": [{"type": "Accepted", "status": "False", "reason": reason,
        "message": "it is a Node's address", "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    let holder = f.status.as_ref().and_then(|s| s.holder.clone());
    f.status = Some(serde_json::from_value(status).expect("status"));
    set_holder(f, holder.as_deref());
}

/// Everything the plan observes, and the API server the steps are applied to.
#[derive(Clone)]
struct World {
    service: Service,
    others: BTreeMap<ServiceKey, Arc<Service>>,
    namespace: Option<BTreeMap<String, String>>,
    fips: Vec<FloatingIP>,
    pools: Vec<PoolState>,
    reserved: BTreeMap<IpAddr, Reserved>,
    memo: ServiceMemo,
}

impl World {
    fn new(service: Service) -> Self {
        World {
            service,
            others: BTreeMap::new(),
            namespace: Some(BTreeMap::new()),
            fips: Vec::new(),
            pools: pools(),
            reserved: BTreeMap::new(),
            memo: ServiceMemo::default(),
        }
    }

    fn key(&self) -> ServiceKey {
        service_key(&self.service)
    }

    fn other(&mut self, s: Service) {
        self.others.insert(service_key(&s), Arc::new(s));
    }

    fn lookup(&self, k: &str) -> Option<Arc<Service>> {
        if k == self.key() { Some(Arc::new(self.service.clone())) } else { self.others.get(k).cloned() }
    }

    fn fip(&mut self, name: &str) -> &mut FloatingIP {
        self.fips.iter_mut().find(|f| f.name_any() == name).expect("no such FloatingIP")
    }

    fn plan(&self) -> Plan {
        let service_of = |k: &str| self.lookup(k);
        let reserved = |a: IpAddr| self.reserved.get(&a).cloned();
        plan(
            &Observed {
                service: &self.service,
                default_provider: false,
                namespace_labels: self.namespace.as_ref(),
                fips: &self.fips,
                pools: &self.pools,
                service_of: &service_of,
                reserved: &reserved,
                resync: RESYNC,
            },
            &self.memo,
        )
    }

    /// Applies the plan as the API server would (a replace keeps the status: it is a
    /// subresource) and keeps its memory.
    fn apply(&mut self, p: &Plan) {
        apply_steps(&mut self.fips, Some(&mut self.service), &p.steps);
        self.memo = p.memory.clone();
    }

    /// Plans, applies, and checks that planning again plans nothing.
    fn converge(&mut self) -> Plan {
        let p = self.plan();
        self.apply(&p);
        let again = self.plan();
        assert!(again.is_quiet(), "planning again after\n{p:#?}\nplanned\n{again:#?}");
        assert_eq!(again.memory, self.memo, "the memory changed on a quiet plan");
        p
    }
}

fn apply_steps(fips: &mut Vec<FloatingIP>, mut service: Option<&mut Service>, steps: &[Step]) {
    for s in steps {
        match s {
            Step::Create(f) => {
                assert!(!fips.iter().any(|x| x.name_any() == f.name_any()), "{} created twice", f.name_any());
                fips.push(f.clone());
            }
            Step::Replace(f) => {
                let old = fips.iter_mut().find(|x| x.name_any() == f.name_any()).expect("replace of a missing object");
                let status = old.status.take();
                *old = f.clone();
                old.status = status;
            }
            Step::Delete(f) => {
                let before = fips.len();
                fips.retain(|x| x.name_any() != f.name_any());
                assert_eq!(fips.len() + 1, before, "delete of a missing object");
            }
            Step::Ingress(a) => with_ingress(service.as_deref_mut().expect("a status write in a sweep"), a),
            Step::Event(_) => {}
        }
    }
}

/// The steps, as short strings: `create lb-…`, `replace lb-…`, `delete lb-…`,
/// `ingress 192.0.2.1,…`, `Normal AddressAllocated`.
fn kinds(p: &Plan) -> Vec<String> {
    p.steps.iter().map(describe).collect()
}

fn describe(s: &Step) -> String {
    match s {
        Step::Create(f) => format!("create {}", f.name_any()),
        Step::Replace(f) => format!("replace {}", f.name_any()),
        Step::Delete(f) => format!("delete {}", f.name_any()),
        Step::Ingress(a) => format!("ingress {}", a.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")),
        Step::Event(e) => format!("{} {}", if e.warning { "Warning" } else { "Normal" }, e.reason),
    }
}

fn notes(p: &Plan) -> Vec<String> {
    p.steps.iter().filter_map(|s| if let Step::Event(e) = s { Some(e.note.clone()) } else { None }).collect()
}

fn replaced<'a>(p: &'a Plan, name: &str) -> &'a FloatingIP {
    p.steps
        .iter()
        .find_map(|s| match s {
            Step::Replace(f) if f.name_any() == name => Some(f),
            _ => None,
        })
        .expect("replaced")
}

#[test]
fn a_free_address_is_created_then_shown_once_a_node_announces_it() {
    let mut w = World::new(service("apps/web", &[80]));
    let p = w.converge();
    assert_eq!(kinds(&p), ["create lb-192-0-2-1", "Normal AddressAllocated"]);
    assert_eq!(notes(&p), ["192.0.2.1 allocated from VIPPool lan, held by HAPair web (FloatingIP lb-192-0-2-1)"]);
    assert_eq!(p.requeue, Some(RESYNC * 5));
    let Step::Create(f) = &p.steps[0] else { unreachable!() };
    assert_eq!(f.spec.probe.ports, [30080], "the node ports are probed");
    assert_eq!(services_of(f), BTreeSet::from(["apps/web".to_owned()]));
    assert!(ingress_ips(&w.service).is_empty(), "no holder yet: not in the status");

    set_holder(w.fip("lb-192-0-2-1"), Some("n1"));
    let p = w.converge();
    assert_eq!(kinds(&p), ["ingress 192.0.2.1", "Normal Announced"]);
    assert_eq!(notes(&p), ["192.0.2.1 is announced by node n1 (HAPair web)"]);
}

#[test]
fn a_new_holder_is_one_change_even_with_a_moment_without_one() {
    // No ports: the FloatingIP probes none, as written.
    let mut w = World::new(service("apps/web", &[]));
    w.fips.push(allocated("192.0.2.1", "lan", &["apps/web"], None));
    with_ingress(&mut w.service, &[ip("192.0.2.1")]);
    set_holder(w.fip("lb-192-0-2-1"), Some("n1"));
    // First sight after a restart of an address the status shows: silent.
    assert!(w.converge().is_quiet());
    assert_eq!(w.memo.holders.get(&ip("192.0.2.1")), Some(&Some("n1".to_owned())));
    // The old holder cleared its fields; the new one has not written them yet.
    set_holder(w.fip("lb-192-0-2-1"), None);
    assert!(w.converge().is_quiet(), "the address stays in the status, nothing announced");
    assert_eq!(ingress_ips(&w.service), [ip("192.0.2.1")]);
    set_holder(w.fip("lb-192-0-2-1"), Some("n2"));
    let p = w.converge();
    assert_eq!(kinds(&p), ["Normal HolderChanged"]);
    assert_eq!(notes(&p), ["192.0.2.1 moved from node n1 to node n2 (HAPair web)"]);
}

#[test]
fn an_address_no_longer_wanted_is_released_for_the_one_asked_for() {
    let mut s = service("apps/web", &[80]);
    annotate(&mut s, contract::ADDRESS, "192.0.2.3");
    with_ingress(&mut s, &[ip("192.0.2.1")]);
    let mut w = World::new(s);
    w.fips.push(allocated("192.0.2.1", "lan", &["apps/web"], None));
    let p = w.converge();
    assert_eq!(
        kinds(&p),
        ["delete lb-192-0-2-1", "Normal AddressReleased", "create lb-192-0-2-3", "Normal AddressAllocated", "ingress "]
    );
    assert_eq!(notes(&p)[0], "192.0.2.1 released (FloatingIP lb-192-0-2-1)");
}

#[test]
fn an_address_that_can_no_longer_be_served_is_released_with_a_warning() {
    // Reserved since (a Node got it): another one, unless it asked for that one.
    let mut w = World::new(service("apps/web", &[80]));
    w.fips.push(allocated("192.0.2.1", "lan", &["apps/web"], None));
    w.reserved.insert(ip("192.0.2.1"), Reserved::Node { node: "n9".into(), kind: "InternalIP".into() });
    let p = w.converge();
    assert_eq!(
        kinds(&p),
        ["delete lb-192-0-2-1", "Warning AddressRefused", "create lb-192-0-2-2", "Normal AddressAllocated"]
    );
    assert_eq!(
        notes(&p)[0],
        "192.0.2.1 released: it is the InternalIP of node n9, never a Service's address (FloatingIP lb-192-0-2-1); \
         it gets another one if one is free"
    );

    // Refused by the operator, and asked for: released, and the Service waits.
    let mut s = service("apps/web", &[80]);
    annotate(&mut s, contract::ADDRESS, "192.0.2.1");
    let mut w = World::new(s);
    w.fips.push(allocated("192.0.2.1", "lan", &["apps/web"], None));
    refuse(w.fip("lb-192-0-2-1"), "NodeAddress");
    w.reserved.insert(ip("192.0.2.1"), Reserved::ApiServer(ApiServerSource::Endpoint));
    let p = w.converge();
    assert_eq!(kinds(&p), ["delete lb-192-0-2-1", "Warning AddressRefused", "Warning AllocationFailed"]);
    assert!(notes(&p)[0].ends_with("the Service asked for it and waits"), "{:?}", notes(&p));
    assert!(p.allocation_failed);
}

#[test]
fn a_shared_address_is_joined_and_left_again() {
    let mut other = service("apps/dns", &[53]);
    annotate(&mut other, contract::SHARING_KEY, "k");
    let mut s = service("apps/web", &[80]);
    annotate(&mut s, contract::SHARING_KEY, "k");
    let mut w = World::new(s);
    w.other(other);
    w.fips.push(allocated("192.0.2.1", "lan", &["apps/dns"], Some("k")));
    let p = w.converge();
    assert_eq!(kinds(&p), ["replace lb-192-0-2-1", "Normal AddressAllocated"]);
    assert_eq!(notes(&p), ["192.0.2.1 shared with apps/dns (FloatingIP lb-192-0-2-1)"]);
    let f = replaced(&p, "lb-192-0-2-1");
    assert_eq!(services_of(f).len(), 2);
    assert_eq!(f.spec.probe.ports, [30053, 30080], "both Services' node ports");

    // No longer a load balancer: it leaves, the FloatingIP stays for the other.
    w.service.spec.as_mut().expect("spec").type_ = Some("ClusterIP".into());
    let p = w.converge();
    assert_eq!(kinds(&p), ["replace lb-192-0-2-1"]);
    assert_eq!(p.requeue, None);
    assert_eq!(services_of(&w.fips[0]), BTreeSet::from(["apps/dns".to_owned()]));
    assert_eq!(w.fips[0].spec.probe.ports, [30053]);
}

#[test]
fn a_service_that_is_not_ours_leaves_its_address_and_the_status() {
    let mut s = service("apps/web", &[80]);
    with_ingress(&mut s, &[ip("192.0.2.1")]);
    s.spec.as_mut().expect("spec").load_balancer_class = Some("other.io/lb".into());
    let mut w = World::new(s);
    w.fips.push(allocated("192.0.2.1", "lan", &["apps/web"], None));
    w.fips.push(by_hand("mine", "192.0.2.2"));
    let p = w.converge();
    assert_eq!(kinds(&p), ["delete lb-192-0-2-1", "ingress "]);
    assert_eq!(p.requeue, None);
    assert_eq!(w.fips.len(), 1, "a FloatingIP written by hand is never touched");
}

#[test]
fn a_kept_address_follows_its_services_ports() {
    let mut w = World::new(service("apps/web", &[80, 443]));
    w.fips.push(allocated("192.0.2.1", "lan", &["apps/web"], None));
    let p = w.converge();
    assert_eq!(kinds(&p), ["replace lb-192-0-2-1"]);
    assert_eq!(replaced(&p, "lb-192-0-2-1").spec.probe.ports, [30080, 30443]);
    // As it should be: nothing.
    assert!(w.plan().is_quiet());
}

#[test]
fn a_service_that_gets_no_address_warns_once_and_waits() {
    let mut s = service("apps/web", &[80]);
    annotate(&mut s, contract::ADDRESS, "203.0.113.5");
    let mut w = World::new(s);
    let p = w.converge();
    assert_eq!(kinds(&p), ["Warning AllocationFailed"]);
    assert_eq!(notes(&p), ["the requested address 203.0.113.5 is in no VIPPool that selects this Service"]);
    assert!(p.allocation_failed);
    assert_eq!(p.requeue, Some(RESYNC));
    assert!(w.plan().allocation_failed, "counted on every plan, warned once");
    // Given what it needs: created, and the warning forgotten.
    annotate(&mut w.service, contract::ADDRESS, "198.51.100.1");
    let p = w.converge();
    assert_eq!(kinds(&p), ["create lb-198-51-100-1", "Normal AddressAllocated"]);
    assert_eq!(w.memo.warned, None);

    // RequireDualStack without a free IPv6 address: nothing created, not even IPv4.
    let mut s = service("apps/dual", &[80]);
    s.spec.as_mut().expect("spec").ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    s.spec.as_mut().expect("spec").ip_family_policy = Some("RequireDualStack".into());
    let mut w = World::new(s);
    w.pools = pool_states(&[vippool("lan", &["192.0.2.0/29"], true)], |_| true);
    let p = w.converge();
    assert_eq!(kinds(&p), ["Warning AllocationFailed"]);
    // PreferDualStack: what there is.
    w.service.spec.as_mut().expect("spec").ip_family_policy = Some("PreferDualStack".into());
    let p = w.converge();
    assert_eq!(kinds(&p), ["create lb-192-0-2-1", "Normal AddressAllocated"]);
}

#[test]
fn an_annotation_that_cannot_be_read_warns_once() {
    let mut s = service("apps/web", &[80]);
    annotate(&mut s, contract::ADDRESS, "web.example");
    let mut w = World::new(s);
    let p = w.converge();
    assert_eq!(kinds(&p), ["Warning InvalidAnnotation"]);
    assert_eq!(p.requeue, Some(INVALID_REQUEUE));
}

#[test]
fn a_service_in_a_namespace_not_seen_yet_waits() {
    let mut w = World::new(service("apps/web", &[80]));
    w.namespace = None;
    let p = w.converge();
    assert!(p.is_quiet());
    assert_eq!(p.requeue, Some(NAMESPACE_REQUEUE));
    assert!(CLAIMED_REQUEUE < NAMESPACE_REQUEUE);
}

#[test]
fn the_sweep_releases_the_addresses_of_services_that_are_gone() {
    let alive = service("apps/dns", &[53]);
    let lookup = |k: &str| (k == "apps/dns").then(|| Arc::new(alive.clone()));
    let mut fips = vec![
        allocated("192.0.2.1", "lan", &["apps/gone"], None),
        allocated("192.0.2.2", "lan", &["apps/dns", "apps/gone"], Some("k")),
        allocated("192.0.2.3", "lan", &["apps/dns"], None),
        by_hand("mine", "192.0.2.4"),
    ];
    let pools = pools();
    let steps = sweep(&fips, &pools, &lookup);
    assert_eq!(steps.iter().map(describe).collect::<Vec<_>>(), ["delete lb-192-0-2-1", "replace lb-192-0-2-2"]);
    let Step::Replace(f) = &steps[1] else { unreachable!() };
    assert_eq!(services_of(f), BTreeSet::from(["apps/dns".to_owned()]));
    assert_eq!(f.annotations().get(contract::FIP_SHARING_KEY).map(String::as_str), Some("k"));
    apply_steps(&mut fips, None, &steps);
    assert!(sweep(&fips, &pools, &lookup).is_empty(), "the sweep converges");
    // What is as its Services need it is not rewritten.
    let lb = allocated("192.0.2.5", "lan", &["apps/dns"], None);
    let once = replacement(&pools, &lookup, &lb, &services_of(&lb), None).expect("probe ports differ");
    assert!(replacement(&pools, &lookup, &once, &services_of(&once), None).is_none());
}

// The convergence property over generated observations.

/// The addresses a generated world uses (in the pools, and one outside them).
const ADDRESSES: [&str; 7] =
    ["192.0.2.1", "192.0.2.2", "192.0.2.3", "2001:db8::1", "198.51.100.1", "198.51.100.2", "203.0.113.9"];

/// The other Services a generated world may have.
const OTHERS: [&str; 3] = ["apps/dns", "apps/mail", "tenant/x"];

#[derive(Clone, Debug)]
struct GenFip {
    address: usize,
    /// None: written by hand.
    services: Option<Vec<usize>>,
    mine: bool,
    sharing: Option<&'static str>,
    holder: Option<&'static str>,
}

#[derive(Clone, Debug)]
struct GenWorld {
    eligible: bool,
    request: Option<usize>,
    bad_annotation: bool,
    pool: Option<&'static str>,
    sharing: Option<&'static str>,
    ports: Vec<i32>,
    families: usize,
    prefer_dual: bool,
    ingress: Vec<usize>,
    namespace_known: bool,
    others: Vec<(bool, Vec<i32>, Option<&'static str>)>,
    fips: Vec<GenFip>,
    reserved: Vec<usize>,
    holders_seen: Vec<(usize, Option<&'static str>)>,
}

fn gen_fip() -> impl Strategy<Value = GenFip> {
    (
        0..ADDRESSES.len(),
        prop::option::weighted(0.8, prop::collection::vec(0..OTHERS.len(), 0..3)),
        any::<bool>(),
        prop::option::of(prop::sample::select(vec!["k", "j"])),
        prop::option::of(prop::sample::select(vec!["n1", "n2"])),
    )
        .prop_map(|(address, services, mine, sharing, holder)| GenFip { address, services, mine, sharing, holder })
}

fn gen_world() -> impl Strategy<Value = GenWorld> {
    (
        (
            prop::bool::weighted(0.85),
            prop::option::of(0..ADDRESSES.len()),
            prop::bool::weighted(0.05),
            prop::option::weighted(0.2, prop::sample::select(vec!["lan", "manual"])),
            prop::option::of(prop::sample::select(vec!["k", "j"])),
            prop::sample::subsequence(vec![53, 80, 443], 0..3),
            0..3usize,
            any::<bool>(),
        ),
        (
            prop::sample::subsequence((0..ADDRESSES.len()).collect::<Vec<_>>(), 0..3),
            prop::bool::weighted(0.9),
            prop::collection::vec(
                (
                    any::<bool>(),
                    prop::sample::subsequence(vec![53, 80, 443], 0..3),
                    prop::option::of(prop::sample::select(vec!["k", "j"])),
                ),
                OTHERS.len(),
            ),
            prop::collection::vec(gen_fip(), 0..5),
            prop::sample::subsequence((0..ADDRESSES.len()).collect::<Vec<_>>(), 0..2),
            prop::collection::vec((0..ADDRESSES.len(), prop::option::of(prop::sample::select(vec!["n1", "n2"]))), 0..3),
        ),
    )
        .prop_map(
            |(
                (eligible, request, bad_annotation, pool, sharing, ports, families, prefer_dual),
                (ingress, namespace_known, others, fips, reserved, holders_seen),
            )| GenWorld {
                eligible,
                request,
                bad_annotation,
                pool,
                sharing,
                ports,
                families,
                prefer_dual,
                ingress,
                namespace_known,
                others,
                fips,
                reserved,
                holders_seen,
            },
        )
}

impl GenWorld {
    fn build(&self) -> World {
        let mut s = service("apps/web", &self.ports);
        {
            let spec = s.spec.as_mut().expect("spec");
            if !self.eligible {
                spec.type_ = Some("ClusterIP".into());
            }
            spec.ip_families = Some(match self.families {
                0 => vec!["IPv4".into()],
                1 => vec!["IPv6".into()],
                _ => vec!["IPv4".into(), "IPv6".into()],
            });
            spec.ip_family_policy = Some(if self.prefer_dual { "PreferDualStack" } else { "RequireDualStack" }.into());
        }
        if let Some(a) = self.request {
            annotate(&mut s, contract::ADDRESS, ADDRESSES[a]);
        }
        if self.bad_annotation {
            annotate(&mut s, contract::ADDRESS, "not-an-address");
        }
        if let Some(p) = self.pool {
            annotate(&mut s, contract::POOL, p);
        }
        if let Some(k) = self.sharing {
            annotate(&mut s, contract::SHARING_KEY, k);
        }
        with_ingress(&mut s, &self.ingress.iter().map(|i| ip(ADDRESSES[*i])).collect::<Vec<_>>());
        let mut w = World::new(s);
        if !self.namespace_known {
            w.namespace = None;
        }
        // Every Service a FloatingIP records exists: the sweep, run on every Service
        // deletion, keeps it so (a FloatingIP that names a Service gone meanwhile can
        // need a second plan: the allocator's reason changes once the Service left it).
        let recorded: BTreeSet<usize> = self.fips.iter().flat_map(|f| f.services.iter().flatten().copied()).collect();
        for (i, (exists, ports, sharing)) in self.others.iter().enumerate() {
            if *exists || recorded.contains(&i) {
                let mut o = service(OTHERS[i], ports);
                if let Some(k) = sharing {
                    annotate(&mut o, contract::SHARING_KEY, k);
                }
                w.other(o);
            }
        }
        // One FloatingIP per address (the name is the address's); the API server refuses
        // a second.
        let mut seen = BTreeSet::new();
        for f in &self.fips {
            if !seen.insert(f.address) {
                continue;
            }
            let address = ADDRESSES[f.address];
            let mut fip = match &f.services {
                None => by_hand(&format!("hand-{}", f.address), address),
                Some(others) => {
                    let mut services: BTreeSet<&str> = others.iter().map(|i| OTHERS[*i]).collect();
                    if f.mine {
                        services.insert("apps/web");
                    }
                    // As the operator shares an address: under one sharing key, within the
                    // namespace of the pools here (a namespace mix needs a pool that
                    // allowed it once; keys and ports change with the Services).
                    let shared = services.len() > 1;
                    if shared {
                        services.retain(|k| k.starts_with("apps/"));
                    }
                    let sharing = if shared { f.sharing.or(Some("k")) } else { f.sharing };
                    let pool = w
                        .pools
                        .iter()
                        .find(|p| p.blocks.iter().any(|b| b.contains(ip(address))))
                        .map_or("gone", |p| p.name.as_str())
                        .to_owned();
                    allocated(address, &pool, &services.into_iter().collect::<Vec<_>>(), sharing)
                }
            };
            set_holder(&mut fip, f.holder);
            w.fips.push(fip);
        }
        // Reserved addresses; the operator refuses the FloatingIPs on them.
        for i in &self.reserved {
            let a = ip(ADDRESSES[*i]);
            w.reserved.insert(a, Reserved::Node { node: "n9".into(), kind: "InternalIP".into() });
            for f in w.fips.iter_mut().filter(|f| f.spec.address.starts_with(&format!("{a}/"))) {
                refuse(f, reason::NODE_ADDRESS);
            }
        }
        for (i, h) in &self.holders_seen {
            w.memo.holders.insert(ip(ADDRESSES[*i]), h.map(str::to_owned));
        }
        w
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever the observation, applying the plan and planning again plans nothing.
    #[test]
    fn planning_again_after_applying_a_plan_plans_nothing(g in gen_world()) {
        let mut w = g.build();
        let p = w.plan();
        w.apply(&p);
        let again = w.plan();
        prop_assert!(
            again.is_quiet(),
            "{g:#?}\nfirst: {:?}\nagain: {:?}",
            kinds(&p),
            kinds(&again)
        );
        prop_assert_eq!(&again.memory, &w.memo);
        // Nothing is created twice, and no address of the status is one it does not hold.
        let mine: BTreeSet<IpAddr> = w
            .fips
            .iter()
            .filter(|f| services_of(f).contains("apps/web"))
            .filter_map(|f| havip_crds::floatingip::vip_address(&f.spec.address))
            .collect();
        if g.eligible {
            for a in ingress_ips(&w.service) {
                prop_assert!(mine.contains(&a) || g.ingress.iter().any(|i| ip(ADDRESSES[*i]) == a), "{a} in the status");
            }
        } else {
            prop_assert!(mine.is_empty(), "a Service not ours still holds {mine:?}");
        }
    }
}
