//! havip as the load-balancer provider of Services of type LoadBalancer
//! (`spec.loadBalancerClass: havip.io/l2`): address pools ([`havip_crds::VIPPool`]),
//! the allocator ([`alloc`], pure), the pure decisions around it ([`model`]: which
//! Services, what they ask for, which pools, the FloatingIP an allocation is written
//! as), the Service reconcile's plan ([`plan`], pure: allocation → FloatingIPs,
//! `status.loadBalancer`, Events, release) and its apply ([`service`]), and the pool
//! reconcile ([`pool`]: size, used, reserved, held by hand, free, `Ready`).
//!
//! The source of truth of every allocation is in the API, never only in memory: a
//! FloatingIP named after its address (`lb-192-0-2-10`) carries the pool (label
//! `havip.io/pool`), the Services using it (annotation `havip.io/services`) and their
//! sharing key. A restarted operator, or a new leader, reads the same allocations back.
//! FloatingIPs are cluster-scoped and Services are not, so a FloatingIP cannot name its
//! Service as an owner (the garbage collector refuses namespaced owners of
//! cluster-scoped objects); the operator releases them instead, on the Service's
//! deletion and in a periodic sweep.

pub mod alloc;
pub mod model;
pub mod plan;
pub mod pool;
pub mod service;

use crate::context::{Context, LbStores};
use crate::guard::error_policy;
use crate::triggers::{Filter, Triggers, drive, drop_managed_fields};
use futures::StreamExt;
use havip_crds::{FloatingIP, HAPair, VIPPool};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, watcher};
use kube::{Client, ResourceExt};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The watches of the load-balancer controllers (their trigger streams).
pub struct LbWatches {
    services: Triggers<Service>,
    services_touched: Triggers<Service>,
    pools: Triggers<DeserializeGuard<VIPPool>>,
    pools_for_services: Triggers<DeserializeGuard<VIPPool>>,
    namespaces: Triggers<Namespace>,
}

/// Trigger streams of the pair and FloatingIP watches, for the load-balancer
/// controllers.
pub struct SharedTriggers {
    /// Pairs appearing or going → every Service havip serves.
    pub pairs_for_services: Triggers<DeserializeGuard<HAPair>>,
    /// Pairs appearing or going → every pool.
    pub pairs_for_pools: Triggers<DeserializeGuard<HAPair>>,
    /// FloatingIPs touched → the Services they record.
    pub fips_for_services: Triggers<DeserializeGuard<FloatingIP>>,
    /// FloatingIPs touched → every pool.
    pub fips_for_pools: Triggers<DeserializeGuard<FloatingIP>>,
}

/// Keeps what the allocator reads of a Service (not managedFields, nor the last-applied
/// configuration kubectl writes).
fn slim_service(s: &mut Service) {
    s.metadata.managed_fields = None;
    if let Some(a) = s.metadata.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

fn slim_namespace(n: &mut Namespace) {
    *n = Namespace {
        metadata: ObjectMeta {
            name: n.metadata.name.take(),
            labels: n.metadata.labels.take(),
            resource_version: n.metadata.resource_version.take(),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
}

/// Starts the watches of Services, VIPPools and Namespaces (each in a task of `tasks`).
/// The Service watch also keeps the API server's ClusterIPs in `reserved`; the last
/// value returned turns true once the Services are listed (and those ClusterIPs known).
pub fn watch(
    client: &Client,
    reserved: Arc<crate::reserved::ReservedAddresses>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> (LbStores, LbWatches, tokio::sync::watch::Receiver<bool>) {
    let wc = watcher::Config::default().any_semantic();
    let (services, services_w) = reflector::store();
    let (pools, pools_w) = reflector::store();
    let (namespaces, namespaces_w) = reflector::store();
    let (services_ready, services_ready_rx) = tokio::sync::watch::channel(false);
    let (pools_ready, pools_ready_rx) = tokio::sync::watch::channel(false);
    let (namespaces_ready, namespaces_ready_rx) = tokio::sync::watch::channel(false);
    let [services_primary, services_touched] = drive(
        watcher(Api::<Service>::all(client.clone()), wc.clone())
            .default_backoff()
            .modify(slim_service)
            .map(move |ev| {
                if let Ok(ev) = &ev {
                    reserved.service_event(ev);
                }
                ev
            })
            .reflect(services_w),
        [Filter::<_, ()>::Applied, Filter::Touched],
        services_ready,
        tasks,
    );
    let [pools_primary, pools_for_services] = drive(
        watcher(Api::<DeserializeGuard<VIPPool>>::all(client.clone()), wc.clone())
            .default_backoff()
            .modify(drop_managed_fields)
            .reflect(pools_w),
        [Filter::<_, ()>::Applied, Filter::Touched],
        pools_ready,
        tasks,
    );
    let [namespaces_stream] = drive(
        watcher(Api::<Namespace>::all(client.clone()), wc)
            .default_backoff()
            .modify(slim_namespace)
            .reflect(namespaces_w),
        [Filter::Changed(Box::new(|n: &Namespace| n.labels().clone()))],
        namespaces_ready,
        tasks,
    );
    let api_server_ready = services_ready_rx.clone();
    let stores = LbStores {
        services,
        pools,
        namespaces,
        ready: vec![services_ready_rx, pools_ready_rx, namespaces_ready_rx],
        lock: tokio::sync::Mutex::new(()),
        memory: Mutex::default(),
    };
    let watches = LbWatches {
        services: services_primary,
        services_touched,
        pools: pools_primary,
        pools_for_services,
        namespaces: namespaces_stream,
    };
    (stores, watches, api_server_ready)
}

/// How long after an event-driven sweep the sweep runs once more.
const SWEEP_AGAIN: Duration = Duration::from_secs(2);

/// Runs the Service and VIPPool controllers and the release sweep until `stop`.
/// `pairs_*` and `fips_*` are trigger streams of the pair and FloatingIP watches.
pub async fn run(
    ctx: Arc<Context>,
    watches: LbWatches,
    shared: SharedTriggers,
    config: ControllerConfig,
    stop: futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) {
    let default_provider = ctx.settings.default_load_balancer;
    // Service controller: its Services; a FloatingIP → the Services it records; a pool
    // or a pair appearing, changing or going → every Service havip serves; a
    // Namespace's labels → its Services.
    let services_ctrl = Controller::for_stream(watches.services, ctx.lb.services.clone());
    let by_fip = |f: DeserializeGuard<FloatingIP>| f.0.as_ref().map(service::services_of_fip).unwrap_or_default();
    let (c1, c2, c3) = (ctx.clone(), ctx.clone(), ctx.clone());
    let by_pool = move |_: DeserializeGuard<VIPPool>| service::served(&c1.lb, default_provider);
    let by_pair = move |_: DeserializeGuard<HAPair>| service::served(&c2.lb, default_provider);
    let by_namespace = move |n: Namespace| {
        let ns = n.name_any();
        service::served(&c3.lb, default_provider)
            .into_iter()
            .filter(|r| r.namespace.as_deref() == Some(&ns))
            .collect::<Vec<_>>()
    };
    let services = services_ctrl
        .with_config(config.clone())
        .watches_stream(shared.fips_for_services, by_fip)
        .watches_stream(watches.pools_for_services, by_pool)
        .watches_stream(shared.pairs_for_services, by_pair)
        .watches_stream(watches.namespaces, by_namespace)
        .graceful_shutdown_on(stop.clone())
        .run(service::reconcile, service::error_policy, ctx.clone())
        .for_each(|res| async move { crate::triggers::log_result("service", res) });
    // Pool controller: its pools; any FloatingIP or pair change → every pool (few); a
    // reserved address changed → the pools that contain it (their Services follow when
    // the pool's status changes).
    let (p1, p2, p3) = (ctx.clone(), ctx.clone(), ctx.clone());
    let all_pools =
        |stores: &LbStores| stores.pools.state().iter().map(|p| ObjectRef::new(&p.name_any())).collect::<Vec<_>>();
    let pools_of = move |changed: std::collections::HashSet<std::net::IpAddr>| {
        let refs: Vec<ObjectRef<DeserializeGuard<VIPPool>>> = p3
            .lb
            .pools
            .state()
            .iter()
            .filter(|p| {
                p.0.as_ref().is_ok_and(|p| {
                    havip_crds::vippool::pool_blocks(&p.spec)
                        .is_ok_and(|blocks| blocks.iter().any(|b| changed.iter().any(|a| b.contains(*a))))
                })
            })
            .map(|p| ObjectRef::new(&p.name_any()))
            .collect();
        futures::stream::iter(refs)
    };
    let pools = Controller::for_stream(watches.pools, ctx.lb.pools.clone())
        .with_config(config)
        .watches_stream(shared.fips_for_pools, move |_| all_pools(&p1.lb))
        .watches_stream(shared.pairs_for_pools, move |_| all_pools(&p2.lb))
        .reconcile_on(crate::reserved::batched(ctx.reserved.subscribe()).flat_map(pools_of))
        .graceful_shutdown_on(stop.clone())
        .run(pool::reconcile, error_policy::<VIPPool>, ctx.clone())
        .for_each(|res| async move { crate::triggers::log_result("vippool", res) });
    // The sweep: on every Service event (deletions are what it is for) and every resync.
    let sweep = {
        let ctx = ctx.clone();
        let mut touched = watches.services_touched;
        async move {
            let mut tick = tokio::time::interval(ctx.settings.resync);
            // A sweep after an event plans from the caches, and the FloatingIP cache may not
            // have caught up with a FloatingIP written just before: one more sweep a moment
            // later, so that a deleted Service's address never waits for the resync.
            let mut again: Option<tokio::time::Instant> = None;
            loop {
                let by_event = tokio::select! {
                    ev = touched.next() => if ev.is_none() { return } else { true },
                    _ = tick.tick() => false,
                    () = async {
                        match again {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    } => {
                        again = None;
                        false
                    }
                };
                // Events come in bursts (the initial list): settle, then one sweep.
                tokio::time::sleep(Duration::from_millis(200)).await;
                while let Some(Some(_)) = futures::FutureExt::now_or_never(touched.next()) {}
                match service::sweep(&ctx).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(released = n, "released the addresses of deleted Services"),
                    Err(e) => tracing::warn!(error = %e, "sweep of released Services failed"),
                }
                if by_event {
                    again = Some(tokio::time::Instant::now() + SWEEP_AGAIN);
                }
            }
        }
    };
    tokio::select! {
        () = async { futures::join!(services, pools); } => {}
        () = sweep => {}
        () = stop => {}
    }
}
