//! The Service reconcile: plans a Service's addresses ([`super::alloc::plan`]) and
//! applies the plan — FloatingIPs created (by name, so the API server refuses a second
//! claim of an address), joined, rewritten or deleted — then `status.loadBalancer` and
//! the Events. Every allocation change runs under one lock, so two Services planned at
//! once never pick the same free address; the FloatingIP's name is the last guard.

use super::alloc::{self, Choice, Plan, ReleaseWhy, ServiceKey};
use super::model::{
    self, PoolState, desired_fip, eligible, ingress_ips, is_allocated, pool_states, request_of, service_key,
    services_of,
};
use crate::Error;
use crate::context::LbStores;
use crate::context::{Context, Ev, ReconcileTimer, backoff};
use crate::error::is_status;
use havip_crds::vippool::service as contract;
use havip_crds::{FloatingIP, manager, reason};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// Reconciles one Service.
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, Error> {
    let mut timer = ReconcileTimer::start("service", ctx.metrics.clone());
    ctx.wait_lb_ready().await?;
    let key = service_key(&svc);
    tracing::debug!(service = %key, "reconciling");
    let res = reconcile_service(&svc, &key, &ctx).await;
    if res.is_ok() {
        timer.result("ok");
        ctx.lb.with_memory(&key, |m| m.failures = 0);
    }
    res
}

/// Backs off per Service (1 s doubling to 5 min); a Warning Event on the first failure
/// and every tenth.
pub fn error_policy(svc: Arc<Service>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = service_key(&svc);
    ctx.metrics.error(err);
    if matches!(err, Error::NotLeader { .. }) {
        return Action::await_change();
    }
    let failures = ctx.lb.with_memory(&key, |m| {
        m.failures = m.failures.saturating_add(1);
        m.failures
    });
    let delay = backoff(failures);
    tracing::warn!(service = %key, error = %err, category = err.category(), failures, retry_in = ?delay, "reconcile failed");
    if failures == 1 || failures.is_multiple_of(10) {
        let note = format!("{err} (attempt {failures}, retrying in {}s)", delay.as_secs());
        tokio::spawn(async move {
            ctx.event(svc.as_ref(), Ev::warning(reason::RECONCILE_ERROR, "Reconcile", note)).await;
        });
    }
    Action::requeue(delay)
}

/// The readable FloatingIPs.
fn fips(ctx: &Context) -> Vec<FloatingIP> {
    ctx.fips.state().iter().filter_map(|f| f.0.as_ref().ok().cloned()).collect()
}

/// Every pool, read.
pub(crate) fn pools(ctx: &Context) -> Vec<PoolState> {
    let pools: Vec<havip_crds::VIPPool> =
        ctx.lb.pools.state().iter().filter_map(|p| p.0.as_ref().ok().cloned()).collect();
    pool_states(&pools, |pair| ctx.pairs.get(&kube::runtime::reflector::ObjectRef::new(pair)).is_some())
}

fn service(stores: &LbStores, key: &str) -> Option<Arc<Service>> {
    let (ns, name) = key.split_once('/')?;
    stores.services.get(&kube::runtime::reflector::ObjectRef::new(name).within(ns))
}

async fn reconcile_service(svc: &Service, key: &ServiceKey, ctx: &Context) -> Result<Action, Error> {
    let _lock = ctx.lb.lock.lock().await;
    if !eligible(svc, ctx.settings.default_load_balancer) {
        // Not (or no longer) ours: leave every address, and take them out of the status.
        let mut released = Vec::new();
        for fip in fips(ctx).iter().filter(|f| is_allocated(f) && services_of(f).contains(key)) {
            released.extend(leave(ctx, fip, key).await?);
        }
        let current = ingress_ips(svc);
        if !released.is_empty() && current.iter().any(|a| released.contains(a)) {
            let keep: Vec<IpAddr> = current.into_iter().filter(|a| !released.contains(a)).collect();
            write_ingress(ctx, svc, &keep).await?;
        }
        return Ok(Action::await_change());
    }
    let req = match request_of(svc) {
        Ok(r) => r,
        Err(e) => {
            warn_once(ctx, svc, key, reason::INVALID_ANNOTATION, e.to_string()).await;
            return Ok(Action::requeue(Duration::from_secs(600)));
        }
    };
    // A namespace not in the cache yet has unknown labels, not none: allocation waits
    // for it (its appearance triggers this Service again).
    let namespace = svc.namespace().unwrap_or_default();
    let Some(ns) = ctx.lb.namespaces.get(&kube::runtime::reflector::ObjectRef::new(&namespace)) else {
        tracing::debug!(service = %key, namespace = %namespace, "namespace not in the cache yet: waiting for it");
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    let fips = fips(ctx);
    let holdings = model::holdings(&fips, key, |k| service(&ctx.lb, k));
    let states = pools(ctx);
    let views: Vec<_> = states.iter().filter_map(|s| s.view_for(svc.labels(), Some(ns.labels()))).collect();
    let plan = alloc::plan(&req, &views, &holdings, &|a| ctx.reserved.lookup(a));
    tracing::debug!(service = %key, ?plan, "plan");
    apply(ctx, svc, key, &req, &plan, &fips, &states).await
}

async fn apply(
    ctx: &Context,
    svc: &Service,
    key: &ServiceKey,
    req: &alloc::Request,
    plan: &Plan,
    fips: &[FloatingIP],
    states: &[PoolState],
) -> Result<Action, Error> {
    let by_name = |n: &str| fips.iter().find(|f| f.name_any() == n);
    for r in &plan.release {
        let Some(fip) = by_name(&r.fip) else { continue };
        let deleted = leave(ctx, fip, key).await?;
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
                let note = format!(
                    "{address} released: {why} (FloatingIP {name}); {}",
                    if req.requested.contains(&address) {
                        "the Service asked for it and waits"
                    } else {
                        "it gets another one if one is free"
                    }
                );
                tracing::warn!(service = %key, floatingip = %name, %address, note = %note, "address refused");
                ctx.event(svc, Ev::warning(reason::ADDRESS_REFUSED, "Release", note)).await;
            }
            None if deleted.is_some() => {
                ctx.event(
                    svc,
                    Ev::normal(reason::ADDRESS_RELEASED, "Release", format!("{address} released (FloatingIP {name})")),
                )
                .await;
            }
            None => {}
        }
    }
    let mut held = Vec::new();
    let mut requeue = None;
    for c in &plan.choices {
        match c {
            Choice::Keep { fip, address } => {
                if let Some(f) = by_name(fip) {
                    let services = services_of(f);
                    let key_of_fip = if services.len() <= 1 { req.sharing_key.clone() } else { sharing_key(f) };
                    rewrite(ctx, f, &services, key_of_fip.as_deref(), states).await?;
                }
                held.push(*address);
            }
            Choice::Join { fip, address } if plan.complete => {
                if let Some(f) = by_name(fip) {
                    let mut services = services_of(f);
                    services.insert(key.clone());
                    rewrite(ctx, f, &services, sharing_key(f).as_deref(), states).await?;
                    let note = format!("{address} shared with {} (FloatingIP {fip})", others(&services, key));
                    ctx.event(svc, Ev::normal(reason::ADDRESS_ALLOCATED, "Allocate", note)).await;
                }
                held.push(*address);
            }
            Choice::Create { address, pool } if plan.complete => {
                let Some(state) = states.iter().find(|s| &s.name == pool) else { continue };
                let services = BTreeSet::from([key.clone()]);
                let health: BTreeSet<_> = model::health_check(svc).into_iter().collect();
                let desired = desired_fip(
                    *address,
                    state,
                    &services,
                    req.sharing_key.as_deref(),
                    &model::probe_ports(svc),
                    &health,
                );
                let name = desired.name_any();
                ctx.guard("floatingip")?;
                let api: Api<FloatingIP> = Api::all(ctx.client.clone());
                match api
                    .create(
                        &PostParams {
                            field_manager: Some(manager::OPERATOR_LOAD_BALANCER.to_owned()),
                            ..Default::default()
                        },
                        &desired,
                    )
                    .await
                {
                    Ok(_) => {
                        let note = format!(
                            "{address} allocated from VIPPool {pool}, held by HAPair {} (FloatingIP {name})",
                            state.pair
                        );
                        ctx.event(svc, Ev::normal(reason::ADDRESS_ALLOCATED, "Allocate", note)).await;
                        held.push(*address);
                    }
                    // Claimed meanwhile (the cache did not show it yet): plan again soon.
                    Err(e) if is_status(&e, 409) => {
                        tracing::debug!(service = %key, floatingip = %name, "address claimed meanwhile; planning again");
                        requeue = Some(Duration::from_millis(500));
                    }
                    Err(e) => return Err(Error::FloatingIp { op: "create", name, source: Box::new(e) }),
                }
            }
            Choice::Join { .. } | Choice::Create { .. } => {}
        }
    }
    if plan.complete {
        ctx.lb.with_memory(key, |m| m.warned = None);
    } else {
        let why = plan.errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
        ctx.metrics.errors.get_or_create(&crate::metrics::ErrorLabels { category: "allocation" }).inc();
        warn_once(ctx, svc, key, reason::ALLOCATION_FAILED, why).await;
    }
    // The status lists an address once a node announces it, and keeps it while it is
    // allocated (a failover's moment without a holder does not blank the EXTERNAL-IP).
    let current = ingress_ips(svc);
    let holder_of =
        |a: IpAddr| by_name(&contract::fip_name(a)).and_then(|f| f.status.as_ref()).and_then(|s| s.holder.clone());
    let want: Vec<IpAddr> = held.iter().copied().filter(|a| holder_of(*a).is_some() || current.contains(a)).collect();
    if want != current {
        write_ingress(ctx, svc, &want).await?;
    }
    announce_holders(ctx, svc, key, &want, &current, &holder_of, fips).await;
    Ok(match requeue {
        Some(d) => Action::requeue(d),
        None if plan.complete => Action::requeue(ctx.settings.resync * 5),
        // Waiting for addresses: a pool or a FloatingIP change triggers a new plan; look
        // again now and then all the same.
        None => Action::requeue(ctx.settings.resync),
    })
}

/// Events when an address is first announced and when its holder changes.
async fn announce_holders(
    ctx: &Context,
    svc: &Service,
    key: &ServiceKey,
    want: &[IpAddr],
    current: &[IpAddr],
    holder_of: &(dyn Fn(IpAddr) -> Option<String> + Sync),
    fips: &[FloatingIP],
) {
    for a in want {
        // Between two holders the FloatingIP may name none for a moment (the old one
        // cleared its fields before the new one wrote them): the memory keeps the last
        // holder, so the move reads as one change.
        let Some(h) = holder_of(*a) else {
            ctx.lb.with_memory(key, |m| {
                m.holders.entry(*a).or_insert(None);
            });
            continue;
        };
        let before = ctx.lb.with_memory(key, |m| m.holders.insert(*a, Some(h.clone())));
        let pair = fips
            .iter()
            .find(|f| f.name_any() == contract::fip_name(*a))
            .map(|f| f.spec.pair.clone())
            .unwrap_or_default();
        match before {
            // First sight after a restart of an address the status already shows: silent.
            None if current.contains(a) => {}
            None | Some(None) => {
                let note = format!("{a} is announced by node {h} (HAPair {pair})");
                ctx.event(svc, Ev::normal(reason::ANNOUNCED, "Announce", note)).await;
            }
            Some(Some(old)) if old != h => {
                let note = format!("{a} moved from node {old} to node {h} (HAPair {pair})");
                ctx.event(svc, Ev::normal(reason::HOLDER_CHANGED, "Failover", note)).await;
            }
            _ => {}
        }
    }
    ctx.lb.with_memory(key, |m| m.holders.retain(|a, _| want.contains(a)));
}

fn sharing_key(f: &FloatingIP) -> Option<String> {
    f.annotations().get(contract::FIP_SHARING_KEY).cloned()
}

fn others(services: &BTreeSet<ServiceKey>, key: &str) -> String {
    services.iter().filter(|s| s.as_str() != key).cloned().collect::<Vec<_>>().join(", ")
}

/// Publishes a Warning Event on the Service unless the same one was the last published.
async fn warn_once(ctx: &Context, svc: &Service, key: &str, reason: &'static str, note: String) {
    let first = ctx.lb.with_memory(key, |m| {
        let first = m.warned.as_deref() != Some(note.as_str());
        m.warned = Some(note.clone());
        first
    });
    if first {
        tracing::warn!(service = %key, reason, note = %note, "the Service gets no address");
        ctx.event(svc, Ev::warning(reason, "Allocate", note)).await;
    }
}

/// Sets `status.loadBalancer.ingress` to these addresses (`ipMode: VIP`).
async fn write_ingress(ctx: &Context, svc: &Service, addresses: &[IpAddr]) -> Result<(), Error> {
    ctx.guard("status")?;
    let ingress: Vec<serde_json::Value> =
        addresses.iter().map(|a| serde_json::json!({"ip": a.to_string(), "ipMode": contract::IP_MODE})).collect();
    let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": ingress}}});
    let ns = svc.namespace().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    api.patch_status(&svc.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::ApplyStatus { kind: "Service", name: service_key(svc), source: Box::new(source) })?;
    ctx.metrics.status_writes.get_or_create(&crate::metrics::KindLabels { kind: "Service" }).inc();
    Ok(())
}

/// `key` leaves `fip`: deleted when nobody is left, else rewritten for the others.
/// Returns the address when it was deleted.
async fn leave(ctx: &Context, fip: &FloatingIP, key: &str) -> Result<Option<IpAddr>, Error> {
    let mut services = services_of(fip);
    services.remove(key);
    if services.is_empty() {
        delete(ctx, fip).await?;
        return Ok(havip_crds::floatingip::vip_address(&fip.spec.address));
    }
    // Only the remaining Services' ports are probed now.
    let states = pools(ctx);
    rewrite(ctx, fip, &services, sharing_key(fip).as_deref(), &states).await?;
    Ok(None)
}

/// Deletes an allocated FloatingIP, if it is still the version the cache showed.
async fn delete(ctx: &Context, fip: &FloatingIP) -> Result<(), Error> {
    ctx.guard("floatingip")?;
    let name = fip.name_any();
    let api: Api<FloatingIP> = Api::all(ctx.client.clone());
    let dp = DeleteParams {
        preconditions: Some(Preconditions { uid: fip.uid(), resource_version: fip.resource_version() }),
        ..Default::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => {
            tracing::info!(floatingip = %name, address = %fip.spec.address, "released");
            Ok(())
        }
        Err(e) if is_status(&e, 404) => Ok(()),
        Err(e) => Err(Error::FloatingIp { op: "delete", name, source: Box::new(e) }),
    }
}

/// Brings an allocated FloatingIP to what its Services need (pair, interface, probe
/// ports, the Services and sharing key it records); writes only when something differs,
/// with the cached resourceVersion as a precondition (a stale cache gets 409, retried).
async fn rewrite(
    ctx: &Context,
    fip: &FloatingIP,
    services: &BTreeSet<ServiceKey>,
    sharing: Option<&str>,
    states: &[PoolState],
) -> Result<(), Error> {
    let Some(address) = havip_crds::floatingip::vip_address(&fip.spec.address) else { return Ok(()) };
    let label_pool = fip.labels().get(contract::POOL_LABEL).cloned().unwrap_or_default();
    let usable = |s: &&PoolState| s.problem.is_none() && s.blocks.iter().any(|b| b.contains(address));
    let state = states.iter().filter(usable).find(|s| s.name == label_pool).or_else(|| states.iter().find(usable));
    let users: Vec<Arc<Service>> = services.iter().filter_map(|k| service(&ctx.lb, k)).collect();
    let probe: BTreeSet<i32> = users.iter().flat_map(|s| model::probe_ports(s)).collect();
    let health: BTreeSet<_> = users.iter().filter_map(|s| model::health_check(s)).collect();
    let desired = match state {
        Some(state) => desired_fip(address, state, services, sharing, &probe, &health),
        None => return Ok(()), // in no usable pool: the Service's plan releases it
    };
    let same = desired.spec == fip.spec
        && desired.labels().iter().all(|(k, v)| fip.labels().get(k) == Some(v))
        && fip.annotations().get(contract::SERVICES) == desired.annotations().get(contract::SERVICES)
        && fip.annotations().get(contract::FIP_SHARING_KEY) == desired.annotations().get(contract::FIP_SHARING_KEY);
    if same {
        return Ok(());
    }
    ctx.guard("floatingip")?;
    // A read-modify-write of the cached object under its resourceVersion (a stale cache
    // gets a conflict and plans again). Not an apply: the FloatingIP was created by this
    // manager with `create`, which owns its fields as an update, and an apply that leaves
    // a field out (the last health check gone) would not remove it.
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
    let name = fip.name_any();
    let api: Api<FloatingIP> = Api::all(ctx.client.clone());
    let params = PostParams { field_manager: Some(manager::OPERATOR_LOAD_BALANCER.to_owned()), ..Default::default() };
    api.replace(&name, &params, &next).await.map_err(|source| Error::FloatingIp {
        op: "update",
        name,
        source: Box::new(source),
    })?;
    Ok(())
}

/// Releases the addresses of Services that are gone (deleted while the operator did
/// not see it, or since): run on every Service deletion and periodically.
pub async fn sweep(ctx: &Context) -> Result<usize, Error> {
    ctx.wait_lb_ready().await?;
    let _lock = ctx.lb.lock.lock().await;
    let mut released = 0;
    for fip in fips(ctx).iter().filter(|f| is_allocated(f)) {
        let services = services_of(fip);
        let gone: Vec<&ServiceKey> = services.iter().filter(|k| service(&ctx.lb, k).is_none()).collect();
        if gone.is_empty() {
            continue;
        }
        let alive: BTreeSet<ServiceKey> = services.iter().filter(|k| !gone.contains(k)).cloned().collect();
        tracing::info!(floatingip = %fip.name_any(), gone = ?gone, "releasing the address of deleted Services");
        if alive.is_empty() {
            delete(ctx, fip).await?;
            released += 1;
        } else {
            let states = pools(ctx);
            rewrite(ctx, fip, &alive, sharing_key(fip).as_deref(), &states).await?;
        }
    }
    Ok(released)
}

/// Whether a FloatingIP event concerns a Service: its Services.
pub fn services_of_fip(f: &FloatingIP) -> Vec<kube::runtime::reflector::ObjectRef<Service>> {
    if !is_allocated(f) {
        return Vec::new();
    }
    services_of(f)
        .iter()
        .filter_map(|k| k.split_once('/'))
        .map(|(ns, name)| kube::runtime::reflector::ObjectRef::new(name).within(ns))
        .collect()
}

/// Every Service havip serves (for a pool or pair change).
pub fn served(stores: &LbStores, default_provider: bool) -> Vec<kube::runtime::reflector::ObjectRef<Service>> {
    stores
        .services
        .state()
        .iter()
        .filter(|s| eligible(s, default_provider) || !ingress_ips(s).is_empty())
        .map(|s| kube::runtime::reflector::ObjectRef::from_obj(s.as_ref()))
        .collect()
}
