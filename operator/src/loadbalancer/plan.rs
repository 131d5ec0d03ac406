//! The Service reconcile as one pure function, as [`crate::model::plan`] is the HAPair
//! reconcile's: [`plan`] takes what the operator observed of one Service ([`Observed`]:
//! the Service, its namespace's labels, the FloatingIPs, the pools, the other Services,
//! the reserved addresses) and what it remembers ([`ServiceMemo`]), runs the allocator
//! ([`alloc::plan`]) and decides everything the reconcile does: which FloatingIPs to
//! create, join, rewrite or delete, `status.loadBalancer.ingress`, the Events and when
//! to look again ([`Plan`]). [`sweep`] plans the release of the addresses of Services
//! that are gone. No I/O and no clock: [`super::service`] gathers the inputs and only
//! executes the steps. Applying a plan to the observation and planning again plans
//! nothing (tested).
//!
//! The rules, in order:
//! 1. A Service havip does not serve (any more) leaves every FloatingIP that records it:
//!    the FloatingIP is deleted when no other Service is left on it, else rewritten for
//!    the others; the addresses deleted leave its status.
//! 2. A Service whose annotations cannot be read gets a Warning (once per message) and
//!    nothing else.
//! 3. A Service whose namespace is not in the cache yet waits for it.
//! 4. Addresses it must leave ([`alloc::Release`]) are left as in 1, with
//!    `AddressReleased` when one was deleted, or `AddressRefused` (a Warning) when the
//!    address can no longer be served at all.
//! 5. An address it keeps is rewritten when its FloatingIP differs from what its Services
//!    need (pair, interface, probe ports, health checks, the Services and sharing key it
//!    records).
//! 6. Only when the Service gets everything it needs ([`alloc::Plan::complete`]): it
//!    joins a shared FloatingIP (rewritten with it added) and creates a FloatingIP per
//!    free address, each with `AddressAllocated`; otherwise a Warning
//!    `AllocationFailed` says why (once per message).
//! 7. `status.loadBalancer.ingress` lists an address once a node announces it, and keeps
//!    it while it is allocated (a failover's moment without a holder does not blank the
//!    EXTERNAL-IP); written only when it changes.
//! 8. `Announced` when a node first announces an address, `HolderChanged` when the holder
//!    changes (a moment without one between two holders reads as one change; an address
//!    the status showed before a restart is not announced again).

use super::alloc::{self, Choice, ReleaseWhy, ServiceKey};
use super::model::{
    Placement, PoolState, desired_fip, eligible, health_check, holdings, ingress_ips, is_allocated, probe_ports,
    request_of, service_key, services_of,
};
use crate::model::{Ev, Reserved};
use havip_crds::floatingip::vip_address;
use havip_crds::vippool::service as contract;
use havip_crds::{FloatingIP, reason};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// How long a Service with an annotation that cannot be read waits before it is looked
/// at again (a change of it triggers a reconcile at once).
pub const INVALID_REQUEUE: Duration = Duration::from_secs(600);
/// How long a Service waits for its namespace to appear in the cache.
pub const NAMESPACE_REQUEUE: Duration = Duration::from_secs(5);
/// How soon a Service is planned again when a FloatingIP it was to create was claimed
/// meanwhile (the cache did not show it yet).
pub const CLAIMED_REQUEUE: Duration = Duration::from_millis(500);

/// Everything one Service reconcile decides from (a snapshot of the caches).
#[derive(Clone, Copy)]
pub struct Observed<'a> {
    /// The Service.
    pub service: &'a Service,
    /// havip serves Services without a `loadBalancerClass` too.
    pub default_provider: bool,
    /// The labels of the Service's namespace (None: not in the cache yet).
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// Every FloatingIP that can be read.
    pub fips: &'a [FloatingIP],
    /// Every pool, read ([`super::model::pool_states`]).
    pub pools: &'a [PoolState],
    /// A Service by `namespace/name`, from the cache (None: it does not exist).
    pub service_of: &'a dyn Fn(&str) -> Option<Arc<Service>>,
    /// Why an address is never handed out (None: it may be).
    pub reserved: &'a dyn Fn(IpAddr) -> Option<Reserved>,
    /// The periodic resync.
    pub resync: Duration,
}

/// What the operator remembers about a Service between reconciles, as far as the plan
/// reads it (lost on restart: nothing here is needed for correctness).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceMemo {
    /// The Warning last published about why the Service gets no address (not repeated
    /// while it holds).
    pub warned: Option<String>,
    /// The last holder seen of each address in the status (`None`: seen, never held yet).
    pub holders: BTreeMap<IpAddr, Option<String>>,
}

/// One step of a Service reconcile.
#[derive(Clone, Debug)]
pub enum Step {
    /// Create this FloatingIP (an address allocated). When the API server says it exists
    /// (claimed meanwhile), the rest of the plan is dropped and the Service planned again
    /// after [`CLAIMED_REQUEUE`].
    Create(FloatingIP),
    /// Replace the FloatingIP with this object (the cached one changed: its
    /// resourceVersion guards the write).
    Replace(FloatingIP),
    /// Delete this FloatingIP, if it is still the version the cache showed.
    Delete(FloatingIP),
    /// Set the Service's `status.loadBalancer.ingress` to these addresses.
    Ingress(Vec<IpAddr>),
    /// Publish this Event on the Service.
    Event(Ev),
}

impl Step {
    /// Whether the step writes an object (not an Event).
    pub fn is_write(&self) -> bool {
        !matches!(self, Step::Event(_))
    }
}

/// Everything one Service reconcile does.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The steps, in order: the FloatingIP writes, each followed by its Event, then the
    /// status, then the Events that depend on the memory.
    pub steps: Vec<Step>,
    /// The memory once every step is done.
    pub memory: ServiceMemo,
    /// The Service gets no address it needs (counted as an allocation error).
    pub allocation_failed: bool,
    /// When to look again (None: only when something changes).
    pub requeue: Option<Duration>,
}

impl Plan {
    /// True when the plan writes nothing and publishes nothing.
    pub fn is_quiet(&self) -> bool {
        self.steps.is_empty()
    }
}

/// Plans one Service's reconcile.
pub fn plan(o: &Observed, memo: &ServiceMemo) -> Plan {
    let key = service_key(o.service);
    let mut memory = memo.clone();
    let mut steps = Vec::new();
    // 1. Not (or no longer) ours: leave every address, and take the deleted ones out of
    // the status.
    if !eligible(o.service, o.default_provider) {
        let mut released = Vec::new();
        for fip in o.fips.iter().filter(|f| is_allocated(f) && services_of(f).contains(&key)) {
            released.extend(leave(o, fip, &key, &mut steps));
        }
        let current = ingress_ips(o.service);
        if !released.is_empty() && current.iter().any(|a| released.contains(a)) {
            steps.push(Step::Ingress(current.into_iter().filter(|a| !released.contains(a)).collect()));
        }
        return Plan { steps, memory, allocation_failed: false, requeue: None };
    }
    // 2. An annotation that cannot be read.
    let req = match request_of(o.service) {
        Ok(r) => r,
        Err(e) => {
            steps.extend(warn_once(&mut memory, reason::INVALID_ANNOTATION, e.to_string()));
            return Plan { steps, memory, allocation_failed: false, requeue: Some(INVALID_REQUEUE) };
        }
    };
    // 3. A namespace not in the cache yet has unknown labels, not none: allocation waits
    // for it (its appearance triggers this Service again).
    let Some(namespace_labels) = o.namespace_labels else {
        return Plan { steps, memory, allocation_failed: false, requeue: Some(NAMESPACE_REQUEUE) };
    };
    let holdings = holdings(o.fips, &key, o.service_of);
    let views: Vec<_> = o.pools.iter().filter_map(|s| s.view_for(o.service.labels(), Some(namespace_labels))).collect();
    let allocation = alloc::plan(&req, &views, &holdings, o.reserved);
    let by_name = |n: &str| o.fips.iter().find(|f| f.name_any() == n);

    // 4. What it must leave.
    for r in &allocation.release {
        let Some(fip) = by_name(&r.fip) else { continue };
        let deleted = leave(o, fip, &key, &mut steps);
        let (address, name) = (r.address, &r.fip);
        let unusable = match &r.why {
            ReleaseWhy::NotWanted => None,
            ReleaseWhy::Reserved(why) => Some(format!("it is {why}, never a Service's address")),
            ReleaseWhy::Refused(refused) => {
                Some(format!("the operator refused it ({}: {})", refused.reason, refused.message))
            }
        };
        match unusable {
            Some(why) => {
                let next = if req.requested.contains(&address) {
                    "the Service asked for it and waits"
                } else {
                    "it gets another one if one is free"
                };
                let note = format!("{address} released: {why} (FloatingIP {name}); {next}");
                steps.push(Step::Event(Ev::warning(reason::ADDRESS_REFUSED, "Release", note)));
            }
            None if deleted.is_some() => {
                let note = format!("{address} released (FloatingIP {name})");
                steps.push(Step::Event(Ev::normal(reason::ADDRESS_RELEASED, "Release", note)));
            }
            None => {}
        }
    }

    // 5. and 6. What it keeps, joins and creates.
    let mut held = Vec::new();
    for c in &allocation.choices {
        match c {
            Choice::Keep { fip, address } => {
                if let Some(f) = by_name(fip) {
                    let services = services_of(f);
                    let sharing = sharing_of(f, &services, &req);
                    steps.extend(
                        replacement(o.pools, o.service_of, f, &services, sharing.as_deref()).map(Step::Replace),
                    );
                }
                held.push(*address);
            }
            Choice::Join { fip, address } if allocation.complete => {
                if let Some(f) = by_name(fip) {
                    let mut services = services_of(f);
                    services.insert(key.clone());
                    let sharing = sharing_of(f, &services, &req);
                    steps.extend(
                        replacement(o.pools, o.service_of, f, &services, sharing.as_deref()).map(Step::Replace),
                    );
                    let note = format!("{address} shared with {} (FloatingIP {fip})", others(&services, &key));
                    steps.push(Step::Event(Ev::normal(reason::ADDRESS_ALLOCATED, "Allocate", note)));
                }
                held.push(*address);
            }
            Choice::Create { address, pool } if allocation.complete => {
                let Some(state) = o.pools.iter().find(|s| &s.name == pool) else { continue };
                let services = BTreeSet::from([key.clone()]);
                let health: BTreeSet<_> = health_check(o.service).into_iter().collect();
                let desired = desired_fip(
                    *address,
                    state.placement(),
                    &services,
                    req.sharing_key.as_deref(),
                    &probe_ports(o.service),
                    &health,
                );
                let note = format!(
                    "{address} allocated from VIPPool {pool}, held by HAPair {} (FloatingIP {})",
                    state.pair,
                    desired.name_any()
                );
                steps.push(Step::Create(desired));
                steps.push(Step::Event(Ev::normal(reason::ADDRESS_ALLOCATED, "Allocate", note)));
                held.push(*address);
            }
            Choice::Join { .. } | Choice::Create { .. } => {}
        }
    }
    let mut after = Vec::new();
    if allocation.complete {
        memory.warned = None;
    } else {
        let why = allocation.errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
        after.extend(warn_once(&mut memory, reason::ALLOCATION_FAILED, why));
    }

    // 7. The status.
    let current = ingress_ips(o.service);
    let holder_of = |a: IpAddr| by_name(&contract::fip_name(a)).and_then(|f| f.status.as_ref()?.holder.clone());
    let want: Vec<IpAddr> = held.iter().copied().filter(|a| holder_of(*a).is_some() || current.contains(a)).collect();
    if want != current {
        steps.push(Step::Ingress(want.clone()));
    }
    steps.extend(after);
    // 8. The holders.
    steps.extend(holder_events(&mut memory, &want, &current, &holder_of, &|a| {
        by_name(&contract::fip_name(a)).map(|f| f.spec.pair.clone())
    }));
    let requeue = if allocation.complete {
        o.resync * 5
    } else {
        // Waiting for addresses: a pool or a FloatingIP change triggers a new plan; look
        // again now and then all the same.
        o.resync
    };
    Plan { steps, memory, allocation_failed: !allocation.complete, requeue: Some(requeue) }
}

/// Plans the release of the addresses of Services that are gone (deleted while the
/// operator did not see it, or since): every allocated FloatingIP that records one is
/// deleted when none of its Services is left, else rewritten for those that are.
pub fn sweep(fips: &[FloatingIP], pools: &[PoolState], service_of: &dyn Fn(&str) -> Option<Arc<Service>>) -> Vec<Step> {
    let mut steps = Vec::new();
    for fip in fips.iter().filter(|f| is_allocated(f)) {
        let services = services_of(fip);
        let alive: BTreeSet<ServiceKey> = services.iter().filter(|k| service_of(k).is_some()).cloned().collect();
        if alive.len() == services.len() {
            continue;
        }
        if alive.is_empty() {
            steps.push(Step::Delete(fip.clone()));
        } else {
            steps.extend(replacement(pools, service_of, fip, &alive, sharing_key(fip).as_deref()).map(Step::Replace));
        }
    }
    steps
}

/// `key` leaves `fip`: a [`Step::Delete`] when nobody is left, else the rewrite for the
/// others (only the remaining Services' ports are probed). Returns the address when the
/// FloatingIP is deleted.
fn leave(o: &Observed, fip: &FloatingIP, key: &str, steps: &mut Vec<Step>) -> Option<IpAddr> {
    let mut services = services_of(fip);
    services.remove(key);
    if services.is_empty() {
        steps.push(Step::Delete(fip.clone()));
        return vip_address(&fip.spec.address);
    }
    steps.extend(replacement(o.pools, o.service_of, fip, &services, sharing_key(fip).as_deref()).map(Step::Replace));
    None
}

/// The allocated FloatingIP as its Services need it (pair, interface, probe ports and
/// health checks of the Services that exist, the Services and sharing key it records),
/// when that differs from what it is: the cached object with those fields changed (a
/// replace under its resourceVersion; its status is not written). None when it is as
/// needed.
pub fn replacement(
    pools: &[PoolState],
    service_of: &dyn Fn(&str) -> Option<Arc<Service>>,
    fip: &FloatingIP,
    services: &BTreeSet<ServiceKey>,
    sharing: Option<&str>,
) -> Option<FloatingIP> {
    let address = vip_address(&fip.spec.address)?;
    let label_pool = fip.labels().get(contract::POOL_LABEL).cloned().unwrap_or_default();
    let usable = |s: &&PoolState| s.problem.is_none() && s.blocks.iter().any(|b| b.contains(address));
    let state = pools.iter().filter(usable).find(|s| s.name == label_pool).or_else(|| pools.iter().find(usable));
    // In no usable pool (its pool gone, changed or unusable), the Services' plans release
    // it; meanwhile it stays where it is and still records who uses it.
    let placement = state.map_or(
        Placement {
            pool: &label_pool,
            pair: &fip.spec.pair,
            interface: fip.spec.interface.as_deref(),
            announce_mode: fip.spec.announce.mode,
        },
        PoolState::placement,
    );
    let users: Vec<Arc<Service>> = services.iter().filter_map(|k| service_of(k)).collect();
    let probe: BTreeSet<i32> = users.iter().flat_map(|s| probe_ports(s)).collect();
    let health: BTreeSet<_> = users.iter().filter_map(|s| health_check(s)).collect();
    let desired = desired_fip(address, placement, services, sharing, &probe, &health);
    let same = desired.spec == fip.spec
        && desired.labels().iter().all(|(k, v)| fip.labels().get(k) == Some(v))
        && fip.annotations().get(contract::SERVICES) == desired.annotations().get(contract::SERVICES)
        && fip.annotations().get(contract::FIP_SHARING_KEY) == desired.annotations().get(contract::FIP_SHARING_KEY);
    if same {
        return None;
    }
    // Not an apply: the FloatingIP was created by this manager with `create`, which owns
    // its fields as an update, and an apply that leaves a field out (the last health
    // check gone) would not remove it.
    let mut next = fip.clone();
    next.spec = desired.spec.clone();
    next.metadata.managed_fields = None;
    next.status = None;
    next.labels_mut().extend(desired.labels().clone());
    let annotations = next.annotations_mut();
    for key in [contract::SERVICES, contract::FIP_SHARING_KEY] {
        match desired.annotations().get(key) {
            Some(v) => annotations.insert(key.to_owned(), v.clone()),
            None => annotations.remove(key),
        };
    }
    Some(next)
}

/// A Warning Event about why the Service gets no address, unless it is the one last
/// published (`memory.warned`, updated).
fn warn_once(memory: &mut ServiceMemo, reason: &'static str, note: String) -> Option<Step> {
    if memory.warned.as_deref() == Some(note.as_str()) {
        return None;
    }
    memory.warned = Some(note.clone());
    Some(Step::Event(Ev::warning(reason, "Allocate", note)))
}

/// Events when an address of the status is first announced and when its holder changes
/// (`memory.holders`, updated to the addresses `want`ed).
fn holder_events(
    memory: &mut ServiceMemo,
    want: &[IpAddr],
    current: &[IpAddr],
    holder_of: &dyn Fn(IpAddr) -> Option<String>,
    pair_of: &dyn Fn(IpAddr) -> Option<String>,
) -> Vec<Step> {
    let mut out = Vec::new();
    for a in want {
        // Between two holders the FloatingIP may name none for a moment (the old one
        // cleared its fields before the new one wrote them): the memory keeps the last
        // holder, so the move reads as one change.
        let Some(h) = holder_of(*a) else {
            memory.holders.entry(*a).or_insert(None);
            continue;
        };
        let before = memory.holders.insert(*a, Some(h.clone()));
        let pair = pair_of(*a).unwrap_or_default();
        match before {
            // First sight after a restart of an address the status already shows: silent.
            None if current.contains(a) => {}
            None | Some(None) => {
                let note = format!("{a} is announced by node {h} (HAPair {pair})");
                out.push(Step::Event(Ev::normal(reason::ANNOUNCED, "Announce", note)));
            }
            Some(Some(old)) if old != h => {
                let note = format!("{a} moved from node {old} to node {h} (HAPair {pair})");
                out.push(Step::Event(Ev::normal(reason::HOLDER_CHANGED, "Failover", note)));
            }
            _ => {}
        }
    }
    memory.holders.retain(|a, _| want.contains(a));
    out
}

/// The sharing key a FloatingIP of `services` records: the Service's own when it is
/// alone on it, else the one the FloatingIP has (those who share it agreed on it).
fn sharing_of(f: &FloatingIP, services: &BTreeSet<ServiceKey>, req: &alloc::Request) -> Option<String> {
    if services.len() <= 1 { req.sharing_key.clone() } else { sharing_key(f) }
}

fn sharing_key(f: &FloatingIP) -> Option<String> {
    f.annotations().get(contract::FIP_SHARING_KEY).cloned()
}

fn others(services: &BTreeSet<ServiceKey>, key: &str) -> String {
    services.iter().filter(|s| s.as_str() != key).cloned().collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests;
