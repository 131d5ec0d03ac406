#![allow(clippy::expect_used, clippy::unwrap_used)]
use super::{AllocError, Allocation, Choice, Holding, Plan, PoolView, PortKey, Refused, Release, ReleaseWhy, Request};
use crate::model::Reserved;
use havip_crds::SharingScope;
use havip_crds::vippool::{Block, Family};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn block(s: &str) -> Block {
    Block::parse(s).expect("block")
}

fn pool(name: &str, blocks: &[&str], auto_assign: bool) -> PoolView {
    PoolView {
        name: name.into(),
        blocks: blocks.iter().map(|b| block(b)).collect(),
        auto_assign,
        selects: true,
        sharing_scope: SharingScope::Namespace,
    }
}

/// Plans with nothing reserved.
fn plan(req: &Request, pools: &[PoolView], holdings: &[Holding]) -> Plan {
    super::plan(req, pools, holdings, &|_| None)
}

/// The FloatingIPs a plan releases.
fn released(p: &Plan) -> Vec<String> {
    p.release.iter().map(|r| r.fip.clone()).collect()
}

fn tcp(port: i32) -> PortKey {
    PortKey { protocol: "TCP".into(), port }
}

fn req(service: &str, families: &[Family]) -> Request {
    Request {
        service: service.into(),
        families: families.to_vec(),
        require_all: true,
        ports: [tcp(80)].into(),
        ..Request::default()
    }
}

fn held(fip: &str, address: &str, services: &[&str], key: Option<&str>, ports: &[PortKey]) -> Holding {
    Holding {
        fip: fip.into(),
        address: ip(address),
        allocation: Some(Allocation {
            pool: "a".into(),
            services: services.iter().map(|s| s.to_string()).collect(),
            sharing_key: key.map(Into::into),
            ports: ports.iter().cloned().collect(),
            namespace: services.first().and_then(|s| s.split_once('/')).map(|(ns, _)| ns.to_owned()),
        }),
        refused: None,
    }
}

fn by_hand(fip: &str, address: &str) -> Holding {
    Holding { fip: fip.into(), address: ip(address), allocation: None, refused: None }
}

#[test]
fn the_first_free_address_of_the_first_pool_skips_every_held_one() {
    let pools = [pool("b", &["192.0.2.10/32"], true), pool("a", &["192.0.2.1-192.0.2.3"], true)];
    let holdings = [by_hand("x", "192.0.2.1"), held("lb", "192.0.2.2", &["ns/other"], None, &[tcp(80)])];
    let p = plan(&req("ns/s", &[Family::V4]), &pools, &holdings);
    assert!(p.complete, "{p:?}");
    assert_eq!(p.choices, vec![Choice::Create { address: ip("192.0.2.3"), pool: "a".into() }]);
    // Exhausted: the error names the pools tried, and nothing is created.
    let holdings =
        [by_hand("x", "192.0.2.1"), by_hand("y", "192.0.2.2"), by_hand("z", "192.0.2.3"), by_hand("w", "192.0.2.10")];
    let p = plan(&req("ns/s", &[Family::V4]), &pools, &holdings);
    assert!(!p.complete);
    assert_eq!(p.errors, vec![AllocError::Exhausted { family: "IPv4", pools: ["a".into(), "b".into()].into() }]);
    assert_eq!(p.errors[0].to_string(), "no free IPv4 address left in VIPPool(s) a, b");
}

#[test]
fn a_requested_address_is_honoured_or_refused_with_the_reason() {
    let pools = [pool("a", &["192.0.2.0/29"], false)];
    let mut r = req("ns/s", &[Family::V4]);
    r.requested = vec![ip("192.0.2.5")];
    let p = plan(&r, &pools, &[]);
    assert_eq!(
        p.choices,
        vec![Choice::Create { address: ip("192.0.2.5"), pool: "a".into() }],
        "autoAssign does not matter"
    );
    r.requested = vec![ip("198.51.100.1")];
    let p = plan(&r, &pools, &[]);
    assert!(!p.complete);
    assert!(p.errors[0].to_string().contains("198.51.100.1 is in no VIPPool"), "{}", p.errors[0]);
    r.requested = vec![ip("192.0.2.5")];
    let p = plan(&r, &pools, &[by_hand("manual", "192.0.2.5")]);
    assert!(!p.complete);
    assert_eq!(
        p.errors[0].to_string(),
        "the requested address 192.0.2.5 is in use by FloatingIP manual (a FloatingIP written by hand)"
    );
    // A requested address of a family the Service does not have.
    r.requested = vec![ip("2001:db8::1")];
    assert!(matches!(plan(&r, &pools, &[]).errors[0], AllocError::RequestedFamilies(_)));
}

#[test]
fn services_share_an_address_only_with_the_same_key_on_other_ports() {
    let pools = [pool("a", &["192.0.2.1-192.0.2.2"], true)];
    let mine = held("lb-1", "192.0.2.1", &["ns/one"], Some("k"), &[tcp(80)]);
    let mut r = req("ns/two", &[Family::V4]);
    r.sharing_key = Some("k".into());
    r.ports = [tcp(443)].into();
    let p = plan(&r, &pools, std::slice::from_ref(&mine));
    assert_eq!(p.choices, vec![Choice::Join { fip: "lb-1".into(), address: ip("192.0.2.1") }]);
    // Same port: a free address instead.
    r.ports = [tcp(80)].into();
    let p = plan(&r, &pools, std::slice::from_ref(&mine));
    assert_eq!(p.choices, vec![Choice::Create { address: ip("192.0.2.2"), pool: "a".into() }]);
    // Asking for the shared address on the same port: refused with the port.
    r.requested = vec![ip("192.0.2.1")];
    let p = plan(&r, &pools, std::slice::from_ref(&mine));
    assert!(p.errors[0].to_string().contains("port 80/TCP is used there already"), "{}", p.errors[0]);
    // Another key, or none: never shared.
    r.ports = [tcp(443)].into();
    r.sharing_key = Some("other".into());
    assert!(!plan(&r, &pools, std::slice::from_ref(&mine)).complete);
    r.sharing_key = None;
    assert!(!plan(&r, &pools, std::slice::from_ref(&mine)).complete);
}

#[test]
fn sharing_stays_in_the_namespace_of_the_address() {
    let pools = [pool("a", &["192.0.2.1-192.0.2.2"], true)];
    let theirs = held("lb-1", "192.0.2.1", &["apps/web"], Some("k"), &[tcp(80)]);
    // A tenant reuses the key it read on the (cluster-scoped) FloatingIP.
    let mut r = req("tenant/x", &[Family::V4]);
    r.sharing_key = Some("k".into());
    r.ports = [tcp(443)].into();
    let p = plan(&r, &pools, std::slice::from_ref(&theirs));
    assert_eq!(
        p.choices,
        vec![Choice::Create { address: ip("192.0.2.2"), pool: "a".into() }],
        "another namespace's address is not joined"
    );
    r.requested = vec![ip("192.0.2.1")];
    let p = plan(&r, &pools, std::slice::from_ref(&theirs));
    assert!(!p.complete, "{p:?}");
    assert_eq!(
        p.errors[0].to_string(),
        "the requested address 192.0.2.1 is in use by FloatingIP lb-1 (it belongs to namespace apps, and VIPPool a \
         shares addresses only within a namespace)"
    );
    // The same namespace shares.
    let mut r = req("apps/dns", &[Family::V4]);
    r.sharing_key = Some("k".into());
    r.ports = [tcp(53)].into();
    let p = plan(&r, &pools, std::slice::from_ref(&theirs));
    assert_eq!(p.choices, vec![Choice::Join { fip: "lb-1".into(), address: ip("192.0.2.1") }]);
    // A tenant that joined before sharing was kept within a namespace leaves; the
    // address's own Services keep it.
    let mixed = held("lb-1", "192.0.2.1", &["apps/web", "tenant/x"], Some("k"), &[tcp(80)]);
    let mut r = req("tenant/x", &[Family::V4]);
    r.sharing_key = Some("k".into());
    r.ports = [tcp(443)].into();
    let p = plan(&r, &pools, std::slice::from_ref(&mixed));
    assert_eq!(released(&p), vec!["lb-1".to_owned()]);
    assert_eq!(p.choices, vec![Choice::Create { address: ip("192.0.2.2"), pool: "a".into() }]);
    let mut web = req("apps/web", &[Family::V4]);
    web.sharing_key = Some("k".into());
    let mut mixed_for_web = mixed.clone();
    if let Some(a) = mixed_for_web.allocation.as_mut() {
        a.ports = [tcp(443)].into();
    }
    let p = plan(&web, &pools, std::slice::from_ref(&mixed_for_web));
    assert_eq!(p.choices, vec![Choice::Keep { fip: "lb-1".into(), address: ip("192.0.2.1") }]);
    // A pool with `sharingScope: Cluster` lets every namespace share.
    let mut open = pools.clone();
    open[0].sharing_scope = SharingScope::Cluster;
    let p = plan(&r, &open, std::slice::from_ref(&theirs));
    assert_eq!(p.choices, vec![Choice::Join { fip: "lb-1".into(), address: ip("192.0.2.1") }]);
}

#[test]
fn reserved_addresses_are_never_handed_out() {
    let pools = [pool("a", &["10.96.0.1-10.96.0.4"], true)];
    let reserved = |a: IpAddr| -> Option<Reserved> {
        match a.to_string().as_str() {
            "10.96.0.1" => Some(Reserved::ApiServer(crate::model::ApiServerSource::ClusterIp)),
            "10.96.0.2" => Some(Reserved::Node { node: "n9".into(), kind: "InternalIP".into() }),
            _ => None,
        }
    };
    // The first free address skips them, and so does the previous address.
    let mut r = req("ns/s", &[Family::V4]);
    r.previous = vec![ip("10.96.0.2")];
    let p = super::plan(&r, &pools, &[], &reserved);
    assert_eq!(p.choices, vec![Choice::Create { address: ip("10.96.0.3"), pool: "a".into() }]);
    // Asked for: refused with the reason.
    r.requested = vec![ip("10.96.0.1")];
    let p = super::plan(&r, &pools, &[], &reserved);
    assert!(!p.complete && p.choices.is_empty(), "{p:?}");
    assert_eq!(
        p.errors[0].to_string(),
        "the requested address 10.96.0.1 is the API server's ClusterIP (Service default/kubernetes): it is never \
         handed out"
    );
    // Held when it became reserved (a Node got it): released with the reason, and
    // another one taken.
    let mine = held("lb-10-96-0-2", "10.96.0.2", &["ns/s"], Some("k"), &[]);
    let p = super::plan(&req("ns/s", &[Family::V4]), &pools, std::slice::from_ref(&mine), &reserved);
    assert_eq!(
        p.release,
        vec![Release {
            fip: "lb-10-96-0-2".into(),
            address: ip("10.96.0.2"),
            why: ReleaseWhy::Reserved(Reserved::Node { node: "n9".into(), kind: "InternalIP".into() }),
        }]
    );
    assert_eq!(p.choices, vec![Choice::Create { address: ip("10.96.0.3"), pool: "a".into() }]);
    // Nor joined under its sharing key.
    let mut r = req("ns/t", &[Family::V4]);
    r.sharing_key = Some("k".into());
    r.ports = [tcp(443)].into();
    let p = super::plan(&r, &pools, std::slice::from_ref(&mine), &reserved);
    assert_eq!(p.choices, vec![Choice::Create { address: ip("10.96.0.3"), pool: "a".into() }]);
    // Everything else held: the pool is exhausted, not the reserved addresses handed out.
    let full = [by_hand("x", "10.96.0.3"), by_hand("y", "10.96.0.4")];
    let p = super::plan(&req("ns/s", &[Family::V4]), &pools, &full, &reserved);
    assert!(matches!(p.errors[..], [AllocError::Exhausted { .. }]), "{p:?}");
}

#[test]
fn a_floating_ip_the_operator_refused_is_released_with_the_reason() {
    let pools = [pool("a", &["192.0.2.1-192.0.2.2"], true)];
    let mut mine = held("lb-192-0-2-1", "192.0.2.1", &["ns/s"], None, &[]);
    let why = Refused { reason: "AddressInUse".into(), message: "an older FloatingIP has it".into() };
    mine.refused = Some(why.clone());
    let p = plan(&req("ns/s", &[Family::V4]), &pools, std::slice::from_ref(&mine));
    assert_eq!(
        p.release,
        vec![Release { fip: "lb-192-0-2-1".into(), address: ip("192.0.2.1"), why: ReleaseWhy::Refused(why) }]
    );
    assert_eq!(p.choices, vec![Choice::Create { address: ip("192.0.2.2"), pool: "a".into() }]);
    assert!(p.complete);
    // Asked for: the Service waits, with the refusal.
    let mut r = req("ns/s", &[Family::V4]);
    r.requested = vec![ip("192.0.2.1")];
    let p = plan(&r, &pools, std::slice::from_ref(&mine));
    assert!(!p.complete);
    assert_eq!(released(&p), vec!["lb-192-0-2-1".to_owned()]);
    assert_eq!(p.errors[0].to_string(), "the requested address 192.0.2.1 cannot be served: an older FloatingIP has it");
}

#[test]
fn dual_stack_prefers_or_requires_both_families() {
    let pools = [pool("v4", &["192.0.2.1/32"], true)];
    let mut r = req("ns/s", &[Family::V4, Family::V6]);
    r.require_all = false;
    let p = plan(&r, &pools, &[]);
    assert!(p.complete, "PreferDualStack takes what there is: {p:?}");
    assert_eq!(p.choices.len(), 1);
    r.require_all = true;
    let p = plan(&r, &pools, &[]);
    assert!(!p.complete, "RequireDualStack waits for both");
    assert!(p.errors[0].to_string().contains("no VIPPool with IPv6 addresses"), "{}", p.errors[0]);
    let pools = [pool("v4", &["192.0.2.1/32"], true), pool("v6", &["2001:db8::/126"], true)];
    let p = plan(&r, &pools, &[]);
    assert_eq!(p.choices.iter().map(Choice::address).collect::<Vec<_>>(), vec![ip("192.0.2.1"), ip("2001:db8::")]);
}

#[test]
fn a_held_address_stays_and_one_outside_the_pools_is_released() {
    let pools = [pool("a", &["192.0.2.1-192.0.2.4"], true)];
    let mine = held("lb-192-0-2-3", "192.0.2.3", &["ns/s"], None, &[]);
    let p = plan(&req("ns/s", &[Family::V4]), &pools, std::slice::from_ref(&mine));
    assert_eq!(p.choices, vec![Choice::Keep { fip: "lb-192-0-2-3".into(), address: ip("192.0.2.3") }]);
    assert!(p.release.is_empty());
    // The pool shrank: released (not for what the address is), and a new address taken.
    let shrunk = [pool("a", &["192.0.2.1-192.0.2.2"], true)];
    let p = plan(&req("ns/s", &[Family::V4]), &shrunk, std::slice::from_ref(&mine));
    assert_eq!(
        p.release,
        vec![Release { fip: "lb-192-0-2-3".into(), address: ip("192.0.2.3"), why: ReleaseWhy::NotWanted }]
    );
    assert_eq!(p.choices, vec![Choice::Create { address: ip("192.0.2.1"), pool: "a".into() }]);
    // Nothing left: released all the same, and the Service waits.
    let p = plan(
        &req("ns/s", &[Family::V4]),
        &shrunk,
        &[mine.clone(), by_hand("x", "192.0.2.1"), by_hand("y", "192.0.2.2")],
    );
    assert!(!p.complete);
    assert_eq!(released(&p), vec!["lb-192-0-2-3".to_owned()]);
    // The previous address is preferred over the first free one.
    let mut r = req("ns/s", &[Family::V4]);
    r.previous = vec![ip("192.0.2.4")];
    let p = plan(&r, &pools, &[]);
    assert_eq!(p.choices, vec![Choice::Create { address: ip("192.0.2.4"), pool: "a".into() }]);
    // A pool that does not select the Service is not used, nor one it does not name.
    let mut unselected = pools.clone();
    unselected[0].selects = false;
    assert!(!plan(&req("ns/s", &[Family::V4]), &unselected, &[]).complete);
    let mut r = req("ns/s", &[Family::V4]);
    r.pools = Some(["other".to_owned()].into());
    assert!(!plan(&r, &pools, &[]).complete);
}

// ---- Property tests: a world of pools, hand-written FloatingIPs and Services that
// come, change and go, with every plan applied as the operator applies it.

#[derive(Clone, Debug)]
struct Spec {
    families: Vec<Family>,
    require_all: bool,
    requested: Vec<IpAddr>,
    pools: Option<BTreeSet<String>>,
    sharing_key: Option<String>,
    ports: BTreeSet<PortKey>,
}

#[derive(Clone, Debug)]
enum Op {
    Upsert(usize, Spec),
    Remove(usize),
}

const ADDRESSES: [&str; 7] =
    ["192.0.2.1", "192.0.2.3", "192.0.2.10", "198.51.100.1", "2001:db8::1", "2001:db8::2", "192.0.2.2"];

fn spec() -> impl Strategy<Value = Spec> {
    let families = prop_oneof![
        Just((vec![Family::V4], true)),
        Just((vec![Family::V6], true)),
        Just((vec![Family::V4, Family::V6], false)),
        Just((vec![Family::V4, Family::V6], true)),
    ];
    let requested = prop::collection::vec(prop::sample::select(ADDRESSES.to_vec()), 0..2)
        .prop_map(|v| v.iter().map(|a| ip(a)).collect::<Vec<_>>());
    let pools = prop_oneof![3 => Just(None), 1 => Just(Some(BTreeSet::from(["b".to_owned()])))];
    let key = prop_oneof![Just(None), Just(Some("k1".to_owned())), Just(Some("k2".to_owned()))];
    let ports = prop::collection::btree_set(
        prop::sample::select(vec![tcp(80), tcp(443), PortKey { protocol: "UDP".into(), port: 53 }]),
        1..3,
    );
    (families, requested, pools, key, ports).prop_map(
        |((families, require_all), requested, pools, sharing_key, ports)| Spec {
            families,
            require_all,
            requested,
            pools,
            sharing_key,
            ports,
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![3 => (0..6usize, spec()).prop_map(|(i, s)| Op::Upsert(i, s)), 1 => (0..6usize).prop_map(Op::Remove)]
}

/// Services 0 to 2 live in namespace `ns`, the others in `other`.
fn key(i: usize) -> String {
    format!("{}/s{i}", if i < 3 { "ns" } else { "other" })
}

struct World {
    pools: Vec<PoolView>,
    holdings: Vec<Holding>,
    services: BTreeMap<String, Spec>,
    /// When each Service was created (the oldest Service of an address owns it).
    created: BTreeMap<String, usize>,
    /// Addresses never handed out.
    reserved: BTreeMap<IpAddr, Reserved>,
}

impl World {
    fn new() -> Self {
        let mut open = pool("c", &["2001:db8::1-2001:db8::2"], true);
        open.sharing_scope = SharingScope::Cluster;
        World {
            pools: vec![pool("a", &["192.0.2.1-192.0.2.3"], true), pool("b", &["192.0.2.10/31"], false), open],
            holdings: vec![by_hand("manual", "192.0.2.2")],
            services: BTreeMap::new(),
            created: BTreeMap::new(),
            reserved: BTreeMap::from([(
                ip("192.0.2.3"),
                Reserved::Node { node: "n9".into(), kind: "InternalIP".into() },
            )]),
        }
    }

    fn reserved(&self, a: IpAddr) -> Option<Reserved> {
        self.reserved.get(&a).cloned()
    }

    fn upsert(&mut self, key: &str, s: Spec) {
        let n = self.created.values().max().map_or(0, |m| m + 1);
        self.created.entry(key.to_owned()).or_insert(n);
        self.services.insert(key.to_owned(), s);
    }

    fn remove(&mut self, key: &str) {
        self.services.remove(key);
        self.created.remove(key);
    }

    fn request(&self, key: &str) -> Request {
        let s = &self.services[key];
        Request {
            service: key.to_owned(),
            families: s.families.clone(),
            require_all: s.require_all,
            requested: s.requested.clone(),
            pools: s.pools.clone(),
            sharing_key: s.sharing_key.clone(),
            ports: s.ports.clone(),
            previous: Vec::new(),
        }
    }

    /// The holdings as the operator reads them for `key`: the ports of the others, the
    /// namespace of the oldest.
    fn view(&self, key: &str) -> Vec<Holding> {
        let mut v = self.holdings.clone();
        for h in &mut v {
            if let Some(a) = &mut h.allocation {
                a.ports =
                    a.services.iter().filter(|s| *s != key).flat_map(|s| self.services[s].ports.clone()).collect();
                a.namespace = a
                    .services
                    .iter()
                    .min_by_key(|s| self.created.get(*s))
                    .and_then(|s| s.split_once('/'))
                    .map(|(ns, _)| ns.to_owned());
            }
        }
        v
    }

    fn leave(&mut self, key: &str, fip: &str) {
        for h in &mut self.holdings {
            if h.fip == fip
                && let Some(a) = &mut h.allocation
            {
                a.services.remove(key);
            }
        }
        self.holdings.retain(|h| h.allocation.as_ref().is_none_or(|a| !a.services.is_empty()));
    }

    /// Plans `key` and applies the plan; returns it.
    fn reconcile(&mut self, key: &str) -> Result<Plan, TestCaseError> {
        let p = super::plan(&self.request(key), &self.pools, &self.view(key), &|a| self.reserved(a));
        for r in &p.release {
            self.leave(key, &r.fip);
        }
        let sharing_key = self.services[key].sharing_key.clone();
        // Keeps are applied always (the sharing key of a sole user), creations and
        // joins only when the plan is complete.
        for c in &p.choices {
            if !p.complete && !matches!(c, Choice::Keep { .. }) {
                continue;
            }
            {
                match c {
                    Choice::Keep { fip, .. } => {
                        let h = self.holdings.iter_mut().find(|h| &h.fip == fip);
                        prop_assert!(h.is_some(), "kept {fip}, which is gone");
                        // A sole user's sharing key is the FloatingIP's (the operator
                        // rewrites the annotation when it changed).
                        if let Some(a) = h.and_then(|h| h.allocation.as_mut())
                            && a.services.len() == 1
                        {
                            a.sharing_key = sharing_key.clone();
                        }
                    }
                    Choice::Join { fip, .. } => {
                        let h = self.holdings.iter_mut().find(|h| &h.fip == fip).expect("joined FloatingIP");
                        let a = h.allocation.as_mut().expect("only allocated ones are joined");
                        prop_assert_eq!(&a.sharing_key, &sharing_key);
                        a.services.insert(key.to_owned());
                    }
                    Choice::Create { address, pool } => {
                        prop_assert!(self.holdings.iter().all(|h| h.address != *address), "{address} handed out twice");
                        let p = self.pools.iter().find(|p| &p.name == pool).expect("pool");
                        prop_assert!(p.blocks.iter().any(|b| b.contains(*address)), "{address} not in pool {pool}");
                        self.holdings.push(Holding {
                            fip: havip_crds::vippool::service::fip_name(*address),
                            address: *address,
                            allocation: Some(Allocation {
                                pool: pool.clone(),
                                services: [key.to_owned()].into(),
                                sharing_key: sharing_key.clone(),
                                ports: BTreeSet::new(),
                                namespace: None,
                            }),
                            refused: None,
                        });
                    }
                }
            }
        }
        Ok(p)
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let mut seen = BTreeSet::new();
        for h in &self.holdings {
            prop_assert!(seen.insert(h.address), "{} held twice", h.address);
            let Some(a) = &h.allocation else { continue };
            prop_assert!(!a.services.is_empty(), "an allocated FloatingIP without Services");
            prop_assert!(!self.reserved.contains_key(&h.address), "reserved {} handed out", h.address);
            let scope =
                self.pools.iter().find(|p| p.blocks.iter().any(|b| b.contains(h.address))).map(|p| p.sharing_scope);
            let namespaces: BTreeSet<&str> =
                a.services.iter().filter_map(|s| s.split_once('/')).map(|(ns, _)| ns).collect();
            prop_assert!(
                namespaces.len() <= 1 || scope == Some(SharingScope::Cluster),
                "{} shared across namespaces {namespaces:?} by a pool that keeps sharing within one",
                h.address
            );
            if a.services.len() > 1 {
                let mut ports = BTreeSet::new();
                for s in &a.services {
                    let spec = &self.services[s];
                    prop_assert!(
                        spec.sharing_key.is_some() && spec.sharing_key == a.sharing_key,
                        "{s} shares {} without its key",
                        h.address
                    );
                    for p in &spec.ports {
                        prop_assert!(ports.insert(p.clone()), "port {p:?} twice on shared {}", h.address);
                    }
                }
            }
            for s in &a.services {
                prop_assert!(self.services.contains_key(s), "{s} was removed but still holds {}", h.address);
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// No address is handed out twice nor a reserved one, sharing keeps its rules (same
    /// key, other ports, one namespace unless the pool opens it), requested addresses are
    /// honoured, a removed Service's addresses come back, and planning again after a
    /// plan was applied changes nothing.
    #[test]
    fn the_allocator_never_hands_out_an_address_twice(ops in prop::collection::vec(op(), 1..40)) {
        let mut w = World::new();
        for op in ops {
            match op {
                Op::Upsert(i, s) => {
                    let key = key(i);
                    w.upsert(&key, s.clone());
                    let p = w.reconcile(&key)?;
                    if p.complete {
                        let mine: Vec<&Holding> = w.holdings.iter().filter(|h| h.allocation.as_ref().is_some_and(|a| a.services.contains(&key))).collect();
                        for f in [Family::V4, Family::V6] {
                            prop_assert!(mine.iter().filter(|h| Family::of(h.address) == f).count() <= 1, "two {f:?} addresses");
                        }
                        for a in &s.requested {
                            prop_assert!(mine.iter().any(|h| h.address == *a), "requested {a} not given: {p:?}");
                        }
                        for h in &mine {
                            prop_assert!(s.families.contains(&Family::of(h.address)));
                        }
                        // Stable: a second plan keeps everything.
                        let again = super::plan(&w.request(&key), &w.pools, &w.view(&key), &|a| w.reserved(a));
                        prop_assert!(again.release.is_empty() && again.complete, "{again:?}");
                        prop_assert!(again.choices.iter().all(|c| matches!(c, Choice::Keep { .. })), "{again:?}");
                    }
                }
                Op::Remove(i) => {
                    let key = key(i);
                    let fips: Vec<String> = w.holdings.iter().filter(|h| h.allocation.as_ref().is_some_and(|a| a.services.contains(&key))).map(|h| h.fip.clone()).collect();
                    for f in fips {
                        w.leave(&key, &f);
                    }
                    w.remove(&key);
                }
            }
            w.check()?;
        }
        // Everything released: only the hand-written FloatingIP is left.
        let keys: Vec<String> = w.services.keys().cloned().collect();
        for key in keys {
            let fips: Vec<String> = w.holdings.iter().filter(|h| h.allocation.as_ref().is_some_and(|a| a.services.contains(&key))).map(|h| h.fip.clone()).collect();
            for f in fips {
                w.leave(&key, &f);
            }
            w.remove(&key);
        }
        prop_assert_eq!(w.holdings.len(), 1);
        // And the whole pool can be handed out again.
        w.upsert("ns/new", Spec { families: vec![Family::V4], require_all: true, requested: vec![], pools: None, sharing_key: None, ports: [tcp(80)].into() });
        prop_assert!(w.reconcile("ns/new")?.complete);
    }
}
