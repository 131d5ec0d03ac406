#![allow(clippy::expect_used, clippy::unwrap_used)]
use super::*;
use proptest::prelude::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn block(s: &str) -> Block {
    Block::parse(s).expect("block")
}

fn pool(name: &str, blocks: &[&str], auto_assign: bool) -> PoolView {
    PoolView { name: name.into(), blocks: blocks.iter().map(|b| block(b)).collect(), auto_assign, selects: true }
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
        }),
    }
}

fn by_hand(fip: &str, address: &str) -> Holding {
    Holding { fip: fip.into(), address: ip(address), allocation: None }
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
    // The pool shrank: released, and a new address taken.
    let shrunk = [pool("a", &["192.0.2.1-192.0.2.2"], true)];
    let p = plan(&req("ns/s", &[Family::V4]), &shrunk, std::slice::from_ref(&mine));
    assert_eq!(p.release, vec!["lb-192-0-2-3".to_owned()]);
    assert_eq!(p.choices, vec![Choice::Create { address: ip("192.0.2.1"), pool: "a".into() }]);
    // Nothing left: released all the same, and the Service waits.
    let p = plan(
        &req("ns/s", &[Family::V4]),
        &shrunk,
        &[mine.clone(), by_hand("x", "192.0.2.1"), by_hand("y", "192.0.2.2")],
    );
    assert!(!p.complete);
    assert_eq!(p.release, vec!["lb-192-0-2-3".to_owned()]);
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

struct World {
    pools: Vec<PoolView>,
    holdings: Vec<Holding>,
    services: BTreeMap<String, Spec>,
}

impl World {
    fn new() -> Self {
        World {
            pools: vec![
                pool("a", &["192.0.2.1-192.0.2.3"], true),
                pool("b", &["192.0.2.10/31"], false),
                pool("c", &["2001:db8::1-2001:db8::2"], true),
            ],
            holdings: vec![by_hand("manual", "192.0.2.2")],
            services: BTreeMap::new(),
        }
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

    /// The holdings as the operator reads them for `key`: the ports of the others.
    fn view(&self, key: &str) -> Vec<Holding> {
        let mut v = self.holdings.clone();
        for h in &mut v {
            if let Some(a) = &mut h.allocation {
                a.ports =
                    a.services.iter().filter(|s| *s != key).flat_map(|s| self.services[s].ports.clone()).collect();
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
        let p = plan(&self.request(key), &self.pools, &self.view(key));
        for fip in &p.release {
            self.leave(key, fip);
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
                            }),
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

    /// No address is handed out twice, sharing keeps its rules, requested addresses are
    /// honoured, a removed Service's addresses come back, and planning again after a
    /// plan was applied changes nothing.
    #[test]
    fn the_allocator_never_hands_out_an_address_twice(ops in prop::collection::vec(op(), 1..40)) {
        let mut w = World::new();
        for op in ops {
            match op {
                Op::Upsert(i, s) => {
                    let key = format!("ns/s{i}");
                    w.services.insert(key.clone(), s.clone());
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
                        let again = plan(&w.request(&key), &w.pools, &w.view(&key));
                        prop_assert!(again.release.is_empty() && again.complete, "{again:?}");
                        prop_assert!(again.choices.iter().all(|c| matches!(c, Choice::Keep { .. })), "{again:?}");
                    }
                }
                Op::Remove(i) => {
                    let key = format!("ns/s{i}");
                    let fips: Vec<String> = w.holdings.iter().filter(|h| h.allocation.as_ref().is_some_and(|a| a.services.contains(&key))).map(|h| h.fip.clone()).collect();
                    for f in fips {
                        w.leave(&key, &f);
                    }
                    w.services.remove(&key);
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
            w.services.remove(&key);
        }
        prop_assert_eq!(w.holdings.len(), 1);
        // And the whole pool can be handed out again.
        w.services.insert("ns/new".into(), Spec { families: vec![Family::V4], require_all: true, requested: vec![], pools: None, sharing_key: None, ports: [tcp(80)].into() });
        prop_assert!(w.reconcile("ns/new")?.complete);
    }
}
