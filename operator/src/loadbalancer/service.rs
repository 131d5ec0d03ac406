//! The Service reconcile: observe (the caches), plan ([`super::plan::plan`], pure: the
//! allocator and every decision around it), apply — FloatingIPs created (by name, so
//! the API server refuses a second claim of an address), rewritten or deleted,
//! `status.loadBalancer`, the Events — executing the plan's steps and nothing else.
//! Every allocation change runs under one lock, so two Services planned at once never
//! pick the same free address; the FloatingIP's name is the last guard.

use super::alloc::ServiceKey;
use super::model::{PoolState, eligible, ingress_ips, is_allocated, pool_states, service_key, services_of};
use super::plan::{self, Observed, Plan, Step};
use crate::Error;
use crate::context::{Context, Ev, LbStores, ReconcileTimer, backoff};
use crate::error::is_status;
use havip_crds::vippool::service as contract;
use havip_crds::{FloatingIP, manager, reason};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use std::net::IpAddr;
use std::sync::Arc;

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
    pool_states(&pools, |pair| ctx.pairs.get(&ObjectRef::new(pair)).is_some())
}

fn service(stores: &LbStores, key: &str) -> Option<Arc<Service>> {
    let (ns, name) = key.split_once('/')?;
    stores.services.get(&ObjectRef::new(name).within(ns))
}

/// Observe (the caches, under the allocation lock), plan ([`plan::plan`], pure), apply.
async fn reconcile_service(svc: &Service, key: &ServiceKey, ctx: &Context) -> Result<Action, Error> {
    let _lock = ctx.lb.lock.lock().await;
    let namespace = ctx.lb.namespaces.get(&ObjectRef::new(&svc.namespace().unwrap_or_default()));
    let fips = fips(ctx);
    let pools = pools(ctx);
    let memo = ctx.lb.with_memory(key, |m| m.service.clone());
    let plan = plan::plan(
        &Observed {
            service: svc,
            default_provider: ctx.settings.default_load_balancer,
            namespace_labels: namespace.as_ref().map(|n| n.labels()),
            fips: &fips,
            pools: &pools,
            service_of: &|k| service(&ctx.lb, k),
            reserved: &|a| ctx.reserved.lookup(a),
            resync: ctx.settings.resync,
        },
        &memo,
    );
    tracing::debug!(service = %key, steps = plan.steps.len(), allocation_failed = plan.allocation_failed, "planned");
    apply(ctx, svc, key, plan).await
}

/// Executes `plan`'s steps in order, then keeps its memory. Decides nothing: a create
/// that finds its FloatingIP already there (claimed meanwhile; the cache did not show
/// it) drops the rest of the plan, which rested on that address, and plans again after
/// [`plan::CLAIMED_REQUEUE`]; any other failed write stops the reconcile (the error
/// policy retries it with a fresh plan).
async fn apply(ctx: &Context, svc: &Service, key: &ServiceKey, plan: Plan) -> Result<Action, Error> {
    if plan.allocation_failed {
        ctx.metrics.errors.get_or_create(&crate::metrics::ErrorLabels { category: "allocation" }).inc();
    }
    if !execute(ctx, Some((svc, key)), &plan.steps).await? {
        return Ok(Action::requeue(plan::CLAIMED_REQUEUE));
    }
    ctx.lb.with_memory(key, |m| m.service = plan.memory);
    Ok(plan.requeue.map_or_else(Action::await_change, Action::requeue))
}

/// Executes steps in order; `svc` is the Service the status and Events are about (none
/// in the sweep). Returns false when a create found its FloatingIP already there (the
/// steps after it are not executed).
async fn execute(ctx: &Context, svc: Option<(&Service, &ServiceKey)>, steps: &[Step]) -> Result<bool, Error> {
    for step in steps {
        match step {
            Step::Create(fip) => {
                if !create(ctx, fip).await? {
                    let key = svc.map(|(_, k)| k.as_str()).unwrap_or_default();
                    tracing::debug!(service = %key, floatingip = %fip.name_any(), "address claimed meanwhile; planning again");
                    return Ok(false);
                }
            }
            Step::Replace(fip) => replace(ctx, fip).await?,
            Step::Delete(fip) => delete(ctx, fip).await?,
            Step::Ingress(addresses) => {
                if let Some((svc, _)) = svc {
                    write_ingress(ctx, svc, addresses).await?;
                }
            }
            Step::Event(ev) => {
                let Some((svc, key)) = svc else { continue };
                if ev.warning {
                    tracing::warn!(service = %key, reason = %ev.reason, note = %ev.note, "warning");
                }
                ctx.event(svc, ev.clone()).await;
            }
        }
    }
    Ok(true)
}

/// Creates an allocated FloatingIP (by name, so the API server refuses a second claim of
/// an address). False when it exists already.
async fn create(ctx: &Context, fip: &FloatingIP) -> Result<bool, Error> {
    ctx.guard("floatingip")?;
    let api: Api<FloatingIP> = Api::all(ctx.client.clone());
    let params = PostParams { field_manager: Some(manager::OPERATOR_LOAD_BALANCER.to_owned()), ..Default::default() };
    match api.create(&params, fip).await {
        Ok(_) => Ok(true),
        Err(e) if is_status(&e, 409) => Ok(false),
        Err(e) => Err(Error::FloatingIp { op: "create", name: fip.name_any(), source: Box::new(e) }),
    }
}

/// Replaces an allocated FloatingIP: a read-modify-write of the cached object under its
/// resourceVersion (a stale cache gets a conflict and plans again).
async fn replace(ctx: &Context, fip: &FloatingIP) -> Result<(), Error> {
    ctx.guard("floatingip")?;
    let name = fip.name_any();
    let api: Api<FloatingIP> = Api::all(ctx.client.clone());
    let params = PostParams { field_manager: Some(manager::OPERATOR_LOAD_BALANCER.to_owned()), ..Default::default() };
    api.replace(&name, &params, fip).await.map_err(|source| Error::FloatingIp {
        op: "update",
        name,
        source: Box::new(source),
    })?;
    Ok(())
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

/// Releases the addresses of Services that are gone (deleted while the operator did
/// not see it, or since): run on every Service deletion and periodically. Plans with
/// [`plan::sweep`]; returns how many FloatingIPs it deleted.
pub async fn sweep(ctx: &Context) -> Result<usize, Error> {
    ctx.wait_lb_ready().await?;
    let _lock = ctx.lb.lock.lock().await;
    let steps = plan::sweep(&fips(ctx), &pools(ctx), &|k| service(&ctx.lb, k));
    for step in &steps {
        if let Step::Delete(fip) | Step::Replace(fip) = step {
            tracing::info!(floatingip = %fip.name_any(), "releasing the address of deleted Services");
        }
    }
    execute(ctx, None, &steps).await?;
    Ok(steps.iter().filter(|s| matches!(s, Step::Delete(_))).count())
}

/// Whether a FloatingIP event concerns a Service: its Services.
pub fn services_of_fip(f: &FloatingIP) -> Vec<ObjectRef<Service>> {
    if !is_allocated(f) {
        return Vec::new();
    }
    services_of(f).iter().filter_map(|k| k.split_once('/')).map(|(ns, name)| ObjectRef::new(name).within(ns)).collect()
}

/// Every Service havip serves (for a pool or pair change).
pub fn served(stores: &LbStores, default_provider: bool) -> Vec<ObjectRef<Service>> {
    stores
        .services
        .state()
        .iter()
        .filter(|s| eligible(s, default_provider) || !ingress_ips(s).is_empty())
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}
