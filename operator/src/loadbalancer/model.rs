//! Pure decisions around the allocator: which Services havip serves, what a Service
//! asks for, which pools are usable (and why not), what the allocator sees of a
//! FloatingIP, and the FloatingIP an allocation is written as.

use super::alloc::{Allocation, Holding, PoolView, PortKey, Refused, Request, ServiceKey};
use crate::model::{AddressIndex, Refusal, Reserved};
use havip_crds::vippool::{Block, BlockError, Family, pool_blocks, service};
use havip_crds::{FloatingIP, FloatingIPSpec, HealthCheck, ProbeSpec, VIPPool, reason};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

/// Label on every FloatingIP the operator allocated for Services (with
/// [`crate::labels::MANAGED_BY`]), so that `kubectl get fip -l havip.io/load-balancer`
/// lists them and the operator never mistakes one written by hand for its own.
pub const LB_LABEL: (&str, &str) = ("havip.io/load-balancer", "true");

/// Probe ports a FloatingIP can carry (the CRD's limit).
pub const MAX_PROBE_PORTS: usize = 16;
/// Health checks a FloatingIP can carry (the CRD's limit).
pub const MAX_HEALTH_CHECKS: usize = 8;

/// `namespace/name` of a Service.
pub fn service_key(svc: &Service) -> ServiceKey {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

/// Whether havip serves this Service: type LoadBalancer, class `havip.io/l2` (or no
/// class when havip is the default provider), not being deleted.
pub fn eligible(svc: &Service, default_provider: bool) -> bool {
    let Some(spec) = &svc.spec else { return false };
    if spec.type_.as_deref() != Some("LoadBalancer") || svc.metadata.deletion_timestamp.is_some() {
        return false;
    }
    match spec.load_balancer_class.as_deref() {
        Some(c) => c == service::LOAD_BALANCER_CLASS,
        None => default_provider,
    }
}

/// A Service annotation that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {annotation}: {value:?} is not a comma-separated list of IP addresses")]
pub struct BadAnnotation {
    /// The annotation.
    pub annotation: &'static str,
    /// Its value.
    pub value: String,
}

fn list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// What a Service asks the allocator for.
pub fn request_of(svc: &Service) -> Result<Request, BadAnnotation> {
    let spec = svc.spec.clone().unwrap_or_default();
    let annotations = svc.annotations();
    let mut families: Vec<Family> = spec
        .ip_families
        .unwrap_or_default()
        .iter()
        .filter_map(|f| match f.as_str() {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        })
        .collect();
    if families.is_empty() {
        families.push(Family::V4);
    }
    let require_all = spec.ip_family_policy.as_deref() != Some("PreferDualStack");
    let requested = match annotations.get(service::ADDRESS) {
        Some(v) => list(v)
            .map(|a| a.parse::<IpAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| BadAnnotation { annotation: service::ADDRESS, value: v.clone() })?,
        None => match spec.load_balancer_ip.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            Some(v) => {
                vec![v.parse().map_err(|_| BadAnnotation { annotation: "spec.loadBalancerIP", value: v.to_owned() })?]
            }
            None => Vec::new(),
        },
    };
    let pools = annotations.get(service::POOL).map(|v| list(v).map(str::to_owned).collect::<BTreeSet<_>>());
    let sharing_key = annotations.get(service::SHARING_KEY).map(|k| k.trim().to_owned()).filter(|k| !k.is_empty());
    let ports = ports_of(svc);
    let previous = ingress_ips(svc);
    Ok(Request { service: service_key(svc), families, require_all, requested, pools, sharing_key, ports, previous })
}

/// A Service's `spec.ports` (empty when absent).
fn service_ports(svc: &Service) -> &[k8s_openapi::api::core::v1::ServicePort] {
    svc.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or_default()
}

/// The ports of a Service.
pub fn ports_of(svc: &Service) -> BTreeSet<PortKey> {
    service_ports(svc)
        .iter()
        .map(|p| PortKey { protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()), port: p.port })
        .collect()
}

/// The addresses in a Service's `status.loadBalancer.ingress`.
pub fn ingress_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|e| e.ip.as_deref()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// Why a pool hands out nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolProblem {
    /// An entry cannot be read (the schema should have refused it).
    #[error("{0}")]
    Invalid(#[from] BlockError),
    /// Two entries of the pool overlap.
    #[error("its entries {0} and {1} overlap")]
    SelfOverlap(String, String),
    /// It overlaps an older pool, which keeps the addresses.
    #[error("it overlaps VIPPool {0}, which is older and keeps the shared addresses")]
    Overlap(String),
    /// Its HAPair does not exist.
    #[error("HAPair {0} does not exist")]
    PairNotFound(String),
    /// A selector cannot be read.
    #[error("{0} cannot be read: {1}")]
    Selector(&'static str, String),
}

impl PoolProblem {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            PoolProblem::Invalid(_) | PoolProblem::Selector(..) => reason::INVALID_SPEC,
            PoolProblem::SelfOverlap(..) | PoolProblem::Overlap(_) => reason::OVERLAP,
            PoolProblem::PairNotFound(_) => reason::PAIR_NOT_FOUND,
        }
    }
}

/// A pool, read.
#[derive(Debug, Clone)]
pub struct PoolState {
    /// Its name.
    pub name: String,
    /// Its HAPair.
    pub pair: String,
    /// Its addresses.
    pub blocks: Vec<Block>,
    /// Why it hands out nothing (None: usable).
    pub problem: Option<PoolProblem>,
    /// Its spec.
    pub spec: havip_crds::VIPPoolSpec,
    /// Service selector, read.
    pub service_selector: Option<Selector>,
    /// Namespace selector, read.
    pub namespace_selector: Option<Selector>,
}

fn selector(s: &Option<LabelSelector>, what: &'static str) -> Result<Option<Selector>, PoolProblem> {
    s.clone().map(Selector::try_from).transpose().map_err(|e| PoolProblem::Selector(what, e.to_string()))
}

/// A pool's blocks and selectors, read.
type ReadPool = (Vec<Block>, Option<Selector>, Option<Selector>);

/// Reads every pool and decides which are usable: a pool whose entries overlap, or that
/// overlaps an older pool (by creation time, then name), or whose pair is missing, is not.
pub fn pool_states(pools: &[VIPPool], pair_exists: impl Fn(&str) -> bool) -> Vec<PoolState> {
    let mut sorted: Vec<&VIPPool> = pools.iter().collect();
    sorted.sort_by_key(|p| {
        let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (created.is_none(), created, p.name_any())
    });
    let mut out: Vec<PoolState> = Vec::new();
    for p in sorted {
        let mut state = PoolState {
            name: p.name_any(),
            pair: p.spec.pair.clone(),
            blocks: Vec::new(),
            problem: None,
            spec: p.spec.clone(),
            service_selector: None,
            namespace_selector: None,
        };
        let read = || -> Result<ReadPool, PoolProblem> {
            let blocks = pool_blocks(&p.spec)?;
            for (i, a) in blocks.iter().enumerate() {
                if let Some((j, _)) = blocks.iter().enumerate().skip(i + 1).find(|(_, b)| a.overlaps(b)) {
                    return Err(PoolProblem::SelfOverlap(p.spec.addresses[i].clone(), p.spec.addresses[j].clone()));
                }
            }
            Ok((
                blocks,
                selector(&p.spec.service_selector, "spec.serviceSelector")?,
                selector(&p.spec.namespace_selector, "spec.namespaceSelector")?,
            ))
        };
        match read() {
            Ok((blocks, s, n)) => {
                state.blocks = blocks;
                state.service_selector = s;
                state.namespace_selector = n;
                state.problem = out
                    .iter()
                    .find(|older| {
                        older.problem.is_none()
                            && older.blocks.iter().any(|a| state.blocks.iter().any(|b| a.overlaps(b)))
                    })
                    .map(|older| PoolProblem::Overlap(older.name.clone()))
                    .or_else(|| (!pair_exists(&p.spec.pair)).then(|| PoolProblem::PairNotFound(p.spec.pair.clone())));
            }
            Err(problem) => state.problem = Some(problem),
        }
        out.push(state);
    }
    out
}

impl PoolState {
    /// The pool as the allocator sees it for a Service with these labels in a namespace
    /// with these labels (None when the pool is not usable). A namespace the operator
    /// has not seen yet (`None`) matches no namespace selector, `NotIn` included: its
    /// labels are unknown, not empty.
    pub fn view_for(
        &self,
        service_labels: &BTreeMap<String, String>,
        namespace_labels: Option<&BTreeMap<String, String>>,
    ) -> Option<PoolView> {
        if self.problem.is_some() {
            return None;
        }
        let namespace_selected = match (&self.namespace_selector, namespace_labels) {
            (None, _) => true,
            (Some(s), Some(labels)) => s.matches(labels),
            (Some(_), None) => false,
        };
        let selects = self.service_selector.as_ref().is_none_or(|s| s.matches(service_labels)) && namespace_selected;
        Some(PoolView {
            name: self.name.clone(),
            blocks: self.blocks.clone(),
            auto_assign: self.spec.auto_assign,
            selects,
            sharing_scope: self.spec.sharing_scope,
        })
    }

    /// The reserved addresses of the pool that no FloatingIP holds (those it skips), in
    /// order.
    pub fn reserved(&self, index: &AddressIndex, holdings: &[Holding]) -> Vec<(IpAddr, Reserved)> {
        let held: std::collections::HashSet<IpAddr> = holdings.iter().map(|h| h.address).collect();
        self.blocks
            .iter()
            .flat_map(|b| {
                let (first, last) = (
                    havip_crds::vippool::from_u128(b.family, b.first),
                    havip_crds::vippool::from_u128(b.family, b.last),
                );
                index.range(first, last).filter(|(a, _)| !held.contains(a)).map(|(a, why)| (a, why.clone()))
            })
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect()
    }

    /// Addresses in the pool (capped at i64::MAX).
    pub fn size(&self) -> i64 {
        let n: u128 = self.blocks.iter().map(Block::size).fold(0u128, u128::saturating_add);
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    /// Addresses of the pool held by any FloatingIP.
    pub fn used(&self, holdings: &[Holding]) -> i64 {
        let n = holdings.iter().filter(|h| self.blocks.iter().any(|b| b.contains(h.address))).count();
        i64::try_from(n).unwrap_or(i64::MAX)
    }
}

/// Whether the operator allocated this FloatingIP for Services.
pub fn is_allocated(fip: &FloatingIP) -> bool {
    fip.labels().get(LB_LABEL.0).map(String::as_str) == Some(LB_LABEL.1)
}

/// The Services an allocated FloatingIP records.
pub fn services_of(fip: &FloatingIP) -> BTreeSet<ServiceKey> {
    fip.annotations().get(service::SERVICES).map(|v| list(v).map(str::to_owned).collect()).unwrap_or_default()
}

/// What the allocator sees of every FloatingIP, for planning `for_service`: the ports of
/// the other Services on each and the namespace of its oldest Service (the Services
/// looked up by `service`), and whether the operator refused it.
pub fn holdings<'a>(
    fips: impl IntoIterator<Item = &'a FloatingIP>,
    for_service: &str,
    service: impl Fn(&str) -> Option<Arc<Service>>,
) -> Vec<Holding> {
    fips.into_iter()
        .filter_map(|f| {
            let address = havip_crds::floatingip::vip_address(&f.spec.address)?;
            let allocation = is_allocated(f).then(|| {
                let services = services_of(f);
                let known: Vec<(&ServiceKey, Arc<Service>)> =
                    services.iter().filter_map(|k| service(k).map(|s| (k, s))).collect();
                Allocation {
                    pool: f.labels().get(service::POOL_LABEL).cloned().unwrap_or_default(),
                    ports: known
                        .iter()
                        .filter(|(k, _)| k.as_str() != for_service)
                        .flat_map(|(_, s)| ports_of(s))
                        .collect(),
                    sharing_key: f.annotations().get(service::FIP_SHARING_KEY).cloned(),
                    namespace: owner_namespace(&known),
                    services,
                }
            });
            Some(Holding { fip: f.name_any(), address, allocation, refused: refused(f) })
        })
        .collect()
}

/// The namespace an address belongs to: that of its oldest Service (creation time, then
/// `namespace/name`). A Service of another namespace that joined it before sharing was
/// limited to a namespace (or while its pool allowed it) is the one that leaves.
fn owner_namespace(known: &[(&ServiceKey, Arc<Service>)]) -> Option<String> {
    known
        .iter()
        .min_by_key(|(k, s)| {
            let created = s.metadata.creation_timestamp.as_ref().map(|t| t.0);
            (created.is_none(), created, (*k).clone())
        })
        .and_then(|(_, s)| s.namespace())
}

/// The operator's refusal of a FloatingIP: `Accepted=False` for its current generation
/// with one of the refusals' reasons (a passing state, such as a missing pair, is not a
/// refusal of the address).
pub fn refused(f: &FloatingIP) -> Option<Refused> {
    let status = f.status.as_ref()?;
    let c = status.conditions.iter().find(|c| c.type_ == havip_crds::condition::ACCEPTED)?;
    (c.status == "False"
        && Refusal::REASONS.contains(&c.reason.as_str())
        && c.observed_generation.is_some()
        && c.observed_generation == f.metadata.generation)
        .then(|| Refused { reason: c.reason.clone(), message: c.message.clone() })
}

/// Where an allocated address lives: its pool, and the pair and interface that pool
/// gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement<'a> {
    /// The pool (label [`service::POOL_LABEL`]).
    pub pool: &'a str,
    /// The HAPair that holds it.
    pub pair: &'a str,
    /// The interface it goes on (None: the one whose subnet contains it).
    pub interface: Option<&'a str>,
    /// How it is made known (None: the pair's `announceMode`).
    pub announce_mode: Option<havip_crds::AnnounceMode>,
}

impl PoolState {
    /// Where the pool puts its addresses.
    pub fn placement(&self) -> Placement<'_> {
        Placement {
            pool: &self.name,
            pair: &self.pair,
            interface: self.spec.interface.as_deref(),
            announce_mode: self.spec.announce_mode,
        }
    }
}

/// The FloatingIP that holds `address` where `placement` says for `services` (sorted),
/// probing `probe_ports` (at most [`MAX_PROBE_PORTS`], lowest first; see [`probe_ports`])
/// and checking the health of each member's node for those with
/// `externalTrafficPolicy: Local`.
pub fn desired_fip(
    address: IpAddr,
    placement: Placement<'_>,
    services: &BTreeSet<ServiceKey>,
    sharing_key: Option<&str>,
    probe_ports: &BTreeSet<i32>,
    health_checks: &BTreeSet<HealthCheck>,
) -> FloatingIP {
    let prefix = if address.is_ipv4() { 32 } else { 128 };
    let mut fip = FloatingIP::new(
        &service::fip_name(address),
        FloatingIPSpec {
            pair: placement.pair.to_owned(),
            address: format!("{address}/{prefix}"),
            interface: placement.interface.map(str::to_owned),
            probe: ProbeSpec {
                ports: probe_ports.iter().copied().take(MAX_PROBE_PORTS).collect(),
                health_checks: health_checks.iter().take(MAX_HEALTH_CHECKS).cloned().collect(),
            },
            announce: havip_crds::AnnounceSpec { mode: placement.announce_mode, ..Default::default() },
        },
    );
    let labels = fip.labels_mut();
    labels.insert(crate::labels::MANAGED_BY.0.to_owned(), crate::labels::MANAGED_BY.1.to_owned());
    labels.insert(LB_LABEL.0.to_owned(), LB_LABEL.1.to_owned());
    labels.insert(service::POOL_LABEL.to_owned(), placement.pool.to_owned());
    let annotations = fip.annotations_mut();
    annotations.insert(service::SERVICES.to_owned(), services.iter().cloned().collect::<Vec<_>>().join(","));
    if let Some(k) = sharing_key {
        annotations.insert(service::FIP_SHARING_KEY.to_owned(), k.to_owned());
    }
    fip
}

/// A Service with `externalTrafficPolicy: Local`: kube-proxy's health check of its node
/// (`healthCheckNodePort`, 200 when the node runs a ready endpoint).
pub fn health_check(svc: &Service) -> Option<HealthCheck> {
    let spec = svc.spec.as_ref()?;
    if spec.external_traffic_policy.as_deref() != Some("Local") {
        return None;
    }
    let port = spec.health_check_node_port.filter(|p| (1..=65535).contains(p))?;
    Some(HealthCheck { port, path: havip_crds::floatingip::DEFAULT_HEALTH_PATH.to_owned() })
}

/// The ports the data-plane probe checks for a Service: the node ports of its TCP ports.
/// kube-proxy answers a node port on every local address of a node, the VIP included,
/// whereas the Service's own port answers on the VIP only once the Service's status names
/// it (which waits for the VIP to be announced), so a standby probing `VIP:nodePort`
/// reaches the Service through the holder's kube-proxy. A Service without node ports
/// (`allocateLoadBalancerNodePorts: false`) adds none: its address is announced without a
/// data-plane check.
pub fn probe_ports(svc: &Service) -> BTreeSet<i32> {
    service_ports(svc)
        .iter()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| p.node_port)
        .filter(|p| (1..=65535).contains(p))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::{PoolProblem, desired_fip, eligible, holdings, pool_states, probe_ports, request_of};
    use crate::loadbalancer::alloc::{Holding, Refused};
    use crate::model::AddressIndex;
    use havip_crds::vippool::Family;
    use havip_crds::{FloatingIP, VIPPool};
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use std::collections::BTreeMap;
    use std::net::IpAddr;
    use std::sync::Arc;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).expect("service")
    }

    fn pool(name: &str, created: &str, addresses: &[&str]) -> VIPPool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "VIPPool",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"pair": "web", "addresses": addresses},
        }))
        .expect("pool")
    }

    #[test]
    fn a_pools_announce_mode_is_its_floating_ips_and_none_leaves_the_pairs() {
        let address: IpAddr = "198.51.100.7".parse().expect("ip");
        let services = std::collections::BTreeSet::new();
        let none = std::collections::BTreeSet::new();
        let fip_of = |mode: Option<&str>| {
            let mut p = pool("edge", "2026-01-01T00:00:00Z", &["198.51.100.0/28"]);
            if let Some(m) = mode {
                p = serde_json::from_value(serde_json::json!({
                    "apiVersion": "havip.io/v1alpha1", "kind": "VIPPool",
                    "metadata": {"name": "edge"},
                    "spec": {"pair": "web", "addresses": ["198.51.100.0/28"], "announceMode": m},
                }))
                .expect("pool");
            }
            let states = pool_states(&[p], |_| true);
            let state = states.first().expect("a state");
            desired_fip(address, state.placement(), &services, None, &none, &std::collections::BTreeSet::new())
        };
        assert_eq!(fip_of(Some("BGP")).spec.announce.mode, Some(havip_crds::AnnounceMode::BGP));
        assert_eq!(fip_of(Some("L2")).spec.announce.mode, Some(havip_crds::AnnounceMode::L2));
        let plain = fip_of(None);
        assert_eq!(plain.spec.announce.mode, None, "the pair's announceMode decides");
        let json = serde_json::to_value(&plain.spec).expect("json");
        assert!(json["announce"].get("mode").is_none(), "nothing written for the default: {json}");
    }

    #[test]
    fn only_load_balancers_of_our_class_are_served() {
        let lb = |class: Option<&str>| {
            let mut s =
                serde_json::json!({"metadata": {"name": "s", "namespace": "ns"}, "spec": {"type": "LoadBalancer"}});
            if let Some(c) = class {
                s["spec"]["loadBalancerClass"] = c.into();
            }
            svc(s)
        };
        assert!(eligible(&lb(Some("havip.io/l2")), false));
        assert!(!eligible(&lb(Some("other.io/lb")), true), "another class is never touched");
        assert!(!eligible(&lb(None), false) && eligible(&lb(None), true), "no class: only as the default provider");
        let cluster_ip = svc(
            serde_json::json!({"metadata": {"name": "s"}, "spec": {"type": "ClusterIP", "loadBalancerClass": "havip.io/l2"}}),
        );
        assert!(!eligible(&cluster_ip, true));
    }

    #[test]
    fn a_service_request_reads_families_addresses_pools_and_sharing() {
        let s = svc(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "annotations": {
                "havip.io/address": "192.0.2.10, 2001:db8::10", "havip.io/pool": "a,b", "havip.io/sharing-key": "k"}},
            "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "PreferDualStack",
                     "loadBalancerIP": "192.0.2.99",
                     "ports": [{"port": 80, "nodePort": 30080}, {"port": 53, "protocol": "UDP", "nodePort": 30053},
                               {"port": 443}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}},
        }));
        let r = request_of(&s).expect("request");
        assert_eq!(r.service, "ns/web");
        assert_eq!(r.families, vec![Family::V6, Family::V4]);
        assert!(!r.require_all);
        assert_eq!(r.requested.len(), 2, "the annotation wins over loadBalancerIP");
        assert_eq!(r.pools, Some(["a".to_owned(), "b".to_owned()].into()));
        assert_eq!(r.sharing_key.as_deref(), Some("k"));
        assert_eq!(r.ports.len(), 3);
        assert_eq!(probe_ports(&s), [30080].into(), "TCP node ports only");
        assert_eq!(r.previous, vec!["192.0.2.10".parse::<IpAddr>().expect("ip")]);
        let bad =
            svc(serde_json::json!({"metadata": {"name": "web", "annotations": {"havip.io/address": "web.example"}}}));
        assert_eq!(
            request_of(&bad).expect_err("bad").to_string(),
            "annotation havip.io/address: \"web.example\" is not a comma-separated list of IP addresses"
        );
        let plain = svc(serde_json::json!({"metadata": {"name": "web"}, "spec": {"loadBalancerIP": "192.0.2.7"}}));
        let r = request_of(&plain).expect("request");
        assert_eq!((r.families, r.require_all, r.requested.len()), (vec![Family::V4], true, 1));
    }

    #[test]
    fn the_newer_of_two_overlapping_pools_and_a_pool_without_its_pair_hand_out_nothing() {
        let pools = [
            pool("new", "2026-02-01T00:00:00Z", &["192.0.2.8/29"]),
            pool("old", "2026-01-01T00:00:00Z", &["192.0.2.0/28"]),
            pool("apart", "2026-03-01T00:00:00Z", &["198.51.100.0/30"]),
            pool("self", "2026-03-01T00:00:00Z", &["203.0.113.0/30", "203.0.113.2/32"]),
        ];
        let states = pool_states(&pools, |p| p == "web");
        let by_name = |n: &str| states.iter().find(|s| s.name == n).expect("state");
        assert!(by_name("old").problem.is_none());
        assert_eq!(by_name("new").problem, Some(PoolProblem::Overlap("old".into())));
        assert!(by_name("apart").problem.is_none());
        assert_eq!(by_name("apart").size(), 2);
        assert!(matches!(by_name("self").problem, Some(PoolProblem::SelfOverlap(..))));
        let states = pool_states(&pools[2..3], |_| false);
        assert_eq!(states[0].problem, Some(PoolProblem::PairNotFound("web".into())));
        assert!(states[0].view_for(&Default::default(), Some(&Default::default())).is_none());
    }

    #[test]
    fn selectors_decide_which_services_a_pool_serves() {
        let mut p = pool("p", "2026-01-01T00:00:00Z", &["192.0.2.0/28"]);
        p.spec.service_selector = Some(LabelSelector {
            match_labels: Some([("tier".to_owned(), "edge".to_owned())].into()),
            ..Default::default()
        });
        p.spec.namespace_selector = Some(LabelSelector {
            match_labels: Some([("env".to_owned(), "prod".to_owned())].into()),
            ..Default::default()
        });
        let s = &pool_states(&[p], |_| true)[0];
        let labels = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
        assert!(s.view_for(&labels("tier", "edge"), Some(&labels("env", "prod"))).expect("usable").selects);
        assert!(!s.view_for(&labels("tier", "edge"), Some(&labels("env", "dev"))).expect("usable").selects);
        assert!(!s.view_for(&labels("tier", "core"), Some(&labels("env", "prod"))).expect("usable").selects);
    }

    #[test]
    fn a_namespace_not_seen_yet_matches_no_namespace_selector() {
        let not_in = |p: &mut VIPPool| {
            p.spec.namespace_selector = Some(LabelSelector {
                match_expressions: Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                        key: "tenant".to_owned(),
                        operator: "NotIn".to_owned(),
                        values: Some(vec!["untrusted".to_owned()]),
                    },
                ]),
                ..Default::default()
            });
        };
        let mut p = pool("p", "2026-01-01T00:00:00Z", &["192.0.2.0/28"]);
        not_in(&mut p);
        let s = &pool_states(&[p], |_| true)[0];
        let none = BTreeMap::new();
        let untrusted = BTreeMap::from([("tenant".to_owned(), "untrusted".to_owned())]);
        assert!(s.view_for(&none, Some(&none)).expect("usable").selects, "a namespace without the label");
        assert!(!s.view_for(&none, Some(&untrusted)).expect("usable").selects);
        // Unknown labels are not "no labels": neither NotIn nor In matches.
        assert!(!s.view_for(&none, None).expect("usable").selects, "NotIn matched an unknown namespace");
        let mut p = pool("q", "2026-01-01T00:00:00Z", &["192.0.2.16/28"]);
        p.spec.namespace_selector = Some(LabelSelector {
            match_labels: Some([("env".to_owned(), "prod".to_owned())].into()),
            ..Default::default()
        });
        assert!(!pool_states(&[p], |_| true)[0].view_for(&none, None).expect("usable").selects);
        // A pool without a namespace selector does not look at namespaces.
        let open = &pool_states(&[pool("r", "2026-01-01T00:00:00Z", &["192.0.2.32/28"])], |_| true)[0];
        assert!(open.view_for(&none, None).expect("usable").selects);
    }

    fn fip_with(services: &str, accepted: Option<(&str, &str, i64)>, generation: i64) -> FloatingIP {
        let mut v = serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP",
            "metadata": {"name": "lb-192-0-2-1", "generation": generation,
                         "labels": {"havip.io/load-balancer": "true", "havip.io/pool": "p"},
                         "annotations": {"havip.io/services": services}},
            "spec": {"pair": "web", "address": "192.0.2.1/32"},
        });
        if let Some((status, reason, observed)) = accepted {
            v["status"] = serde_json::json!({"conditions": [{"type": "Accepted", "status": status, "reason": reason,
                "message": "why", "observedGeneration": observed, "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        }
        serde_json::from_value(v).expect("fip")
    }

    #[test]
    fn a_holding_knows_its_namespace_and_whether_the_operator_refused_it() {
        let services: BTreeMap<&str, Arc<Service>> = [
            ("apps/web", "2026-01-01T00:00:00Z"),
            ("tenant/x", "2026-02-01T00:00:00Z"),
            ("aaa/late", "2026-03-01T00:00:00Z"),
        ]
        .into_iter()
        .map(|(k, created)| {
            let (ns, name) = k.split_once('/').expect("key");
            let s = svc(serde_json::json!({"metadata": {"name": name, "namespace": ns, "creationTimestamp": created}}));
            (k, Arc::new(s))
        })
        .collect();
        let lookup = |k: &str| services.get(k).cloned();
        // The oldest Service's namespace, whatever the names sort as.
        let h = &holdings([&fip_with("aaa/late,apps/web,tenant/x", None, 1)], "tenant/x", lookup)[0];
        let a = h.allocation.as_ref().expect("allocated");
        assert_eq!(a.namespace.as_deref(), Some("apps"));
        assert_eq!(h.refused, None);
        // Refused for what the address is, for its current generation.
        let f = fip_with("apps/web", Some(("False", "NodeAddress", 2)), 2);
        assert_eq!(
            holdings([&f], "apps/web", lookup)[0].refused,
            Some(Refused { reason: "NodeAddress".into(), message: "why".into() })
        );
        // Not refused: a passing state, or a verdict on an older generation, or accepted.
        for (accepted, generation) in
            [(("False", "PairNotFound", 2), 2), (("False", "NodeAddress", 1), 2), (("True", "AsExpected", 2), 2)]
        {
            let f = fip_with("apps/web", Some(accepted), generation);
            assert_eq!(holdings([&f], "apps/web", lookup)[0].refused, None, "{accepted:?} at generation {generation}");
        }
    }

    #[test]
    fn a_pool_counts_the_reserved_addresses_it_skips() {
        let s =
            &pool_states(&[pool("p", "2026-01-01T00:00:00Z", &["10.96.0.0/30", "10.30.0.1-10.30.0.3"])], |_| true)[0];
        let mut idx = AddressIndex::default();
        idx.set_api_server(crate::model::ApiServerSource::ClusterIp, ["10.96.0.1".parse().expect("ip")].into());
        idx.set_node("n9", &[("InternalIP".to_owned(), "10.30.0.3".to_owned())]);
        idx.set_node("n1", &[("InternalIP".to_owned(), "10.30.0.4".to_owned())]);
        let held =
            Holding { fip: "x".into(), address: "10.30.0.3".parse().expect("ip"), allocation: None, refused: None };
        let r = s.reserved(&idx, &[]);
        assert_eq!(r.iter().map(|(a, _)| a.to_string()).collect::<Vec<_>>(), ["10.30.0.3", "10.96.0.1"]);
        assert_eq!(s.reserved(&idx, &[held]).len(), 1, "a held one counts as used");
    }
}
