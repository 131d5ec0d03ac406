//! The address allocator for Services of type LoadBalancer, as a pure function: what
//! one Service should hold, given the pools and every address held by a FloatingIP.
//! No I/O: [`super::service`] gathers the inputs from the caches and applies the plan.
//!
//! Rules, in order, per IP family the Service asks for:
//! 1. an address it already holds stays while it is still allowed (in a pool that
//!    selects the Service, equal to what it requests, its sharing still valid);
//! 2. a requested address (annotation `havip.io/address`, else `spec.loadBalancerIP`)
//!    is given when a pool that selects the Service contains it and it is free, or held
//!    by Services with the same sharing key on other ports; otherwise the Service
//!    waits, with the reason;
//! 3. with a sharing key, an address already held under that key (other ports);
//! 4. the address the Service's status showed before (an operator restart, a
//!    FloatingIP deleted by hand), when still free and in a pool;
//! 5. the first free address of the first pool (by name) that selects the Service and
//!    has `autoAssign` (or that the annotation `havip.io/pool` names).
//!
//! An address is never handed out while any FloatingIP holds it, whoever wrote it, nor
//! when it is reserved (the API server's or a Node's own address: see
//! [`crate::model::AddressIndex`]). A Service shares an address only with Services of the
//! address's namespace, unless the address's pool has `sharingScope: Cluster`. An address
//! the Service holds but may no longer use (reserved since, or its FloatingIP refused by
//! the operator) is released with the reason, and the Service gets another one unless it
//! asked for that one.

use crate::model::Reserved;
use havip_crds::SharingScope;
use havip_crds::vippool::{Block, Family};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// A Service, `namespace/name`.
pub type ServiceKey = String;

/// A port of a Service: protocol and port. Two Services may share an address only on
/// disjoint sets of these.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The Service port.
    pub port: i32,
}

/// A pool as the allocator sees it, for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolView {
    /// Its name.
    pub name: String,
    /// Its addresses.
    pub blocks: Vec<Block>,
    /// It hands out addresses to Services that ask for none.
    pub auto_assign: bool,
    /// Its selectors match the Service.
    pub selects: bool,
    /// Which Services may share one of its addresses.
    pub sharing_scope: SharingScope,
}

/// An address held by a FloatingIP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    /// The FloatingIP.
    pub fip: String,
    /// Its address.
    pub address: IpAddr,
    /// Set when the operator allocated it to Services; None: written by hand.
    pub allocation: Option<Allocation>,
    /// The operator refused it (`Accepted=False` for its current generation with a
    /// refusal's reason): no agent serves it.
    pub refused: Option<Refused>,
}

/// Why the operator refused a FloatingIP (its `Accepted` condition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The condition's reason (one of [`crate::model::Refusal::REASONS`]).
    pub reason: String,
    /// The condition's message.
    pub message: String,
}

/// What the operator recorded on a FloatingIP it allocated.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Allocation {
    /// The pool it came from.
    pub pool: String,
    /// The Services using it.
    pub services: BTreeSet<ServiceKey>,
    /// Their sharing key (None: not shared).
    pub sharing_key: Option<String>,
    /// The ports of its Services other than the one being planned.
    pub ports: BTreeSet<PortKey>,
    /// The namespace the address belongs to: that of its oldest Service (None: none of
    /// its Services is known).
    pub namespace: Option<String>,
}

/// What one Service asks for.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Request {
    /// The Service.
    pub service: ServiceKey,
    /// Its IP families, in order (`spec.ipFamilies`).
    pub families: Vec<Family>,
    /// Every family must get an address (`RequireDualStack`, or a single family);
    /// false: at least one (`PreferDualStack`).
    pub require_all: bool,
    /// Addresses it asks for, at most one per family.
    pub requested: Vec<IpAddr>,
    /// The pools it names (None: any pool that selects it).
    pub pools: Option<BTreeSet<String>>,
    /// Its sharing key.
    pub sharing_key: Option<String>,
    /// Its ports.
    pub ports: BTreeSet<PortKey>,
    /// The addresses its status showed (kept when possible).
    pub previous: Vec<IpAddr>,
}

/// One address of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Keep the address the Service holds.
    Keep {
        /// The FloatingIP.
        fip: String,
        /// The address.
        address: IpAddr,
    },
    /// Join a FloatingIP of other Services with the same sharing key.
    Join {
        /// The FloatingIP.
        fip: String,
        /// The address.
        address: IpAddr,
    },
    /// Create a FloatingIP for a free address.
    Create {
        /// The address.
        address: IpAddr,
        /// The pool it comes from.
        pool: String,
    },
}

impl Choice {
    /// The address.
    pub fn address(&self) -> IpAddr {
        match self {
            Choice::Keep { address, .. } | Choice::Join { address, .. } | Choice::Create { address, .. } => *address,
        }
    }
}

/// Why a Service gets no address (of a family).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// No pool selects the Service (or none of the pools it names does).
    #[error("no VIPPool with {family} addresses selects this Service{}", named(.pools))]
    NoPool {
        /// The family.
        family: &'static str,
        /// The pools the Service names.
        pools: Option<BTreeSet<String>>,
    },
    /// The requested address is in no pool that selects the Service.
    #[error("the requested address {address} is in no VIPPool that selects this Service{}", named(.pools))]
    OutsidePools {
        /// The address.
        address: IpAddr,
        /// The pools the Service names.
        pools: Option<BTreeSet<String>>,
    },
    /// The requested address is never a Service's: the API server's or a Node's.
    #[error("the requested address {address} is {why}: it is never handed out")]
    Reserved {
        /// The address.
        address: IpAddr,
        /// Whose it is.
        why: Reserved,
    },
    /// The requested address's FloatingIP was refused by the operator.
    #[error("the requested address {address} cannot be served: {message}")]
    Refused {
        /// The address.
        address: IpAddr,
        /// The refusal (the FloatingIP's `Accepted` message).
        message: String,
    },
    /// The requested address is held by a FloatingIP it cannot share.
    #[error("the requested address {address} is in use by FloatingIP {fip}{why}")]
    InUse {
        /// The address.
        address: IpAddr,
        /// The FloatingIP holding it.
        fip: String,
        /// Why it cannot be shared.
        why: String,
    },
    /// Every address of the selecting pools is taken.
    #[error("no free {family} address left in VIPPool(s) {}", .pools.iter().cloned().collect::<Vec<_>>().join(", "))]
    Exhausted {
        /// The family.
        family: &'static str,
        /// The pools tried.
        pools: BTreeSet<String>,
    },
    /// Two requested addresses of one family, or an address of a family the Service
    /// does not have.
    #[error("the requested addresses {0} do not fit the Service's IP families")]
    RequestedFamilies(String),
}

fn named(pools: &Option<BTreeSet<String>>) -> String {
    match pools {
        Some(p) => format!(" among the pools it names ({})", p.iter().cloned().collect::<Vec<_>>().join(", ")),
        None => String::new(),
    }
}

/// A FloatingIP a Service must leave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The FloatingIP.
    pub fip: String,
    /// Its address.
    pub address: IpAddr,
    /// Why.
    pub why: ReleaseWhy,
}

/// Why a Service leaves a FloatingIP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseWhy {
    /// No longer allowed or wanted: outside the pools that select it, another address
    /// requested, its sharing no longer valid.
    NotWanted,
    /// The address is reserved (it became the API server's or a Node's).
    Reserved(Reserved),
    /// The operator refused the FloatingIP.
    Refused(Refused),
}

/// What a Service should hold.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Plan {
    /// The addresses, in the Service's family order.
    pub choices: Vec<Choice>,
    /// FloatingIPs the Service must leave, and why.
    pub release: Vec<Release>,
    /// Why a family got no address.
    pub errors: Vec<AllocError>,
    /// The Service gets what it needs: create and join only then; otherwise it keeps
    /// what it may keep, leaves what it must leave, and waits.
    pub complete: bool,
}

/// The namespace of a Service key (`namespace/name`).
fn namespace_of(service: &str) -> &str {
    service.split_once('/').map_or("", |(ns, _)| ns)
}

/// Plans the addresses of one Service; `reserved` says why an address is never handed
/// out (None: it may be).
pub fn plan(
    req: &Request,
    pools: &[PoolView],
    holdings: &[Holding],
    reserved: &dyn Fn(IpAddr) -> Option<Reserved>,
) -> Plan {
    let mut out = Plan::default();
    // Requested addresses: at most one per family, of the Service's families.
    let mut requested: BTreeMap<Family, IpAddr> = BTreeMap::new();
    for a in &req.requested {
        let f = Family::of(*a);
        if requested.insert(f, *a).is_some() || !req.families.contains(&f) {
            let list = req.requested.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
            out.errors.push(AllocError::RequestedFamilies(list));
        }
    }
    let allowed = |p: &&PoolView| p.selects && req.pools.as_ref().is_none_or(|n| n.contains(&p.name));
    let candidates: Vec<&PoolView> = {
        let mut v: Vec<&PoolView> =
            pools.iter().filter(allowed).filter(|p| p.auto_assign || req.pools.is_some()).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    };
    let allowed_pool_of = |a: IpAddr| -> Option<&PoolView> {
        let mut v: Vec<&PoolView> =
            pools.iter().filter(allowed).filter(|p| p.blocks.iter().any(|b| b.contains(a))).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v.into_iter().next()
    };
    let held: BTreeMap<IpAddr, &Holding> = holdings.iter().map(|h| (h.address, h)).collect();
    let mine: Vec<&Holding> =
        holdings.iter().filter(|h| h.allocation.as_ref().is_some_and(|a| a.services.contains(&req.service))).collect();
    // Whether this Service may share `h` (other Services on it): within the address's
    // namespace (unless its pool says otherwise), same key, other ports.
    let shareable = |h: &Holding| -> Result<(), String> {
        let Some(a) = &h.allocation else { return Err(" (a FloatingIP written by hand)".to_owned()) };
        let others = a.services.iter().any(|s| s != &req.service);
        if !others {
            return Ok(());
        }
        let pool = pools.iter().find(|p| p.blocks.iter().any(|b| b.contains(h.address)));
        let scope = pool.map(|p| p.sharing_scope).unwrap_or_default();
        let mine = namespace_of(&req.service);
        if scope == SharingScope::Namespace && a.namespace.as_deref() != Some(mine) {
            return Err(format!(
                " (it belongs to namespace {}, and VIPPool {} shares addresses only within a namespace)",
                a.namespace.as_deref().unwrap_or("unknown"),
                pool.map_or(a.pool.as_str(), |p| p.name.as_str())
            ));
        }
        match (&a.sharing_key, &req.sharing_key) {
            (Some(k), Some(mine)) if k == mine => {}
            (Some(_), Some(_)) => return Err(" (its Services have another sharing key)".to_owned()),
            _ => return Err(" (both Services need the same havip.io/sharing-key to share it)".to_owned()),
        }
        let clash: Vec<String> =
            a.ports.intersection(&req.ports).map(|p| format!("{}/{}", p.port, p.protocol)).collect();
        if clash.is_empty() { Ok(()) } else { Err(format!(" (port {} is used there already)", clash.join(", "))) }
    };

    // Why a held address can no longer be served at all (whoever asks for it).
    let unusable = |h: &Holding| -> Option<ReleaseWhy> {
        if let Some(why) = reserved(h.address) {
            return Some(ReleaseWhy::Reserved(why));
        }
        h.refused.clone().map(ReleaseWhy::Refused)
    };

    let mut errors_fatal = !out.errors.is_empty();
    let mut kept: BTreeSet<String> = BTreeSet::new();
    for &family in &req.families {
        let want = requested.get(&family).copied();
        // 1. What it holds, while allowed.
        let holds = mine.iter().find(|h| {
            Family::of(h.address) == family
                && !kept.contains(&h.fip)
                && want.is_none_or(|w| w == h.address)
                && unusable(h).is_none()
                && allowed_pool_of(h.address).is_some()
                && shareable(h).is_ok()
        });
        if let Some(h) = holds {
            kept.insert(h.fip.clone());
            out.choices.push(Choice::Keep { fip: h.fip.clone(), address: h.address });
            continue;
        }
        // 2. A requested address.
        if let Some(a) = want {
            if let Some(why) = reserved(a) {
                out.errors.push(AllocError::Reserved { address: a, why });
                errors_fatal = true;
                continue;
            }
            let Some(pool) = allowed_pool_of(a) else {
                out.errors.push(AllocError::OutsidePools { address: a, pools: req.pools.clone() });
                errors_fatal = true;
                continue;
            };
            match held.get(&a) {
                None => out.choices.push(Choice::Create { address: a, pool: pool.name.clone() }),
                Some(h) if h.allocation.is_some() && h.refused.is_some() => {
                    let message = h.refused.as_ref().map(|r| r.message.clone()).unwrap_or_default();
                    out.errors.push(AllocError::Refused { address: a, message });
                    errors_fatal = true;
                }
                Some(h) => match shareable(h) {
                    Ok(()) => out.choices.push(Choice::Join { fip: h.fip.clone(), address: a }),
                    Err(why) => {
                        out.errors.push(AllocError::InUse { address: a, fip: h.fip.clone(), why });
                        errors_fatal = true;
                    }
                },
            }
            continue;
        }
        // 3. An address shared under its key.
        if req.sharing_key.is_some() {
            let join = holdings.iter().find(|h| {
                Family::of(h.address) == family
                    && h.allocation.as_ref().is_some_and(|a| a.sharing_key == req.sharing_key)
                    && unusable(h).is_none()
                    && candidates.iter().any(|p| p.blocks.iter().any(|b| b.contains(h.address)))
                    && shareable(h).is_ok()
            });
            if let Some(h) = join {
                out.choices.push(Choice::Join { fip: h.fip.clone(), address: h.address });
                continue;
            }
        }
        // 4. Its previous address; 5. the first free one.
        let previous = req
            .previous
            .iter()
            .copied()
            .filter(|a| Family::of(*a) == family && !held.contains_key(a) && reserved(*a).is_none())
            .find_map(|a| {
                candidates.iter().find(|p| p.blocks.iter().any(|b| b.contains(a))).map(|p| (a, p.name.clone()))
            });
        let free = previous.or_else(|| {
            candidates.iter().find_map(|p| {
                p.blocks
                    .iter()
                    .filter(|b| b.family == family)
                    .find_map(|b| first_free(b, &held, reserved))
                    .map(|a| (a, p.name.clone()))
            })
        });
        match free {
            Some((address, pool)) => out.choices.push(Choice::Create { address, pool }),
            None => {
                let tried: BTreeSet<String> = candidates
                    .iter()
                    .filter(|p| p.blocks.iter().any(|b| b.family == family))
                    .map(|p| p.name.clone())
                    .collect();
                out.errors.push(if tried.is_empty() {
                    AllocError::NoPool { family: family.as_str(), pools: req.pools.clone() }
                } else {
                    AllocError::Exhausted { family: family.as_str(), pools: tried }
                });
                if req.require_all {
                    errors_fatal = true;
                }
            }
        }
    }
    out.release = mine
        .iter()
        .filter(|h| !kept.contains(&h.fip))
        .map(|h| Release { fip: h.fip.clone(), address: h.address, why: unusable(h).unwrap_or(ReleaseWhy::NotWanted) })
        .collect();
    out.complete = !errors_fatal && !out.choices.is_empty();
    out
}

/// The first address of `b` no FloatingIP holds and that is not reserved (steps over
/// held and reserved addresses only, so the cost is bounded by those, not by the
/// block's size).
fn first_free(
    b: &Block,
    held: &BTreeMap<IpAddr, &Holding>,
    reserved: &dyn Fn(IpAddr) -> Option<Reserved>,
) -> Option<IpAddr> {
    let mut n = b.first;
    loop {
        let a = havip_crds::vippool::from_u128(b.family, n);
        if !held.contains_key(&a) && reserved(a).is_none() {
            return Some(a);
        }
        if n == b.last {
            return None;
        }
        n += 1;
    }
}

#[cfg(test)]
mod tests;
