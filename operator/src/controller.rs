//! The controllers' wiring: the HAPair controller (primary:
//! HAPairs; triggered also by FloatingIPs, Nodes, the pair Leases and key Secrets) and
//! the FloatingIP controller (primary: FloatingIPs; triggered also by HAPairs). Every
//! watch is guarded by `DeserializeGuard` where the objects are ours, so that one
//! malformed object cannot stop it; reconciles read from reflector stores, never list.
//! The watch plumbing itself is in [`crate::triggers`].

use crate::Settings;
use crate::context::{Context, MANAGED_BY, PAIR_LABEL};
use crate::guard::error_policy;
use crate::metrics::Metrics;
use crate::model::pair_of_lease;
use crate::reserved::{ReservedAddresses, node_addresses};
use crate::triggers::{Filter, drive, drop_managed_fields, log_result};
use futures::{FutureExt, StreamExt};
use havip_crds::{FloatingIP, HAPair};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeStatus, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, reflector};
use kube::runtime::watcher::{self, watcher};
use kube::{Client, ResourceExt};
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Keeps only what the operator reads of a Node (name, uid, addresses), so that
/// the cache stays small on big clusters.
fn slim_node(n: &mut Node) {
    let addresses = n.status.as_ref().and_then(|s| s.addresses.clone());
    *n = Node {
        metadata: ObjectMeta {
            name: n.metadata.name.take(),
            uid: n.metadata.uid.take(),
            resource_version: n.metadata.resource_version.take(),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus { addresses, ..NodeStatus::default() }),
    };
}

/// Nodes per page of the operator's Node list.
const NODE_PAGE: u32 = 100;

/// Drops what the operator never reads of a Secret: managedFields always, and the data
/// of every Secret it did not create (a Secret named by `keySecretRef` is only labelled;
/// release records and the like only cost memory).
fn slim_secret(s: &mut Secret) {
    s.metadata.managed_fields = None;
    let ours = s.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)).map(String::as_str) == Some(MANAGED_BY.1);
    if !ours {
        s.data = None;
        s.string_data = None;
        s.metadata.annotations = None;
    }
}

/// A FloatingIP's pair and its address (None: unparsable).
type FipPair = (String, Option<std::net::IpAddr>);

/// Runs both controllers until `stop` resolves (graceful: running reconciles finish).
pub async fn run_controllers(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    leader: Arc<AtomicBool>,
    stop: futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) {
    let ns = settings.namespace.clone();
    let pairs_api: Api<DeserializeGuard<HAPair>> = Api::all(client.clone());
    let fips_api: Api<DeserializeGuard<FloatingIP>> = Api::all(client.clone());
    let nodes_api: Api<Node> = Api::all(client.clone());
    let leases_api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let secrets_api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let wc = watcher::Config::default().any_semantic();

    let (fips, fips_w) = reflector::store();
    let (pairs, pairs_w) = reflector::store();
    let (nodes, nodes_w) = reflector::store();
    let (leases, leases_w) = reflector::store();
    let (secrets, secrets_w) = reflector::store();

    let (pairs_ready, pairs_ready_rx) = tokio::sync::watch::channel(false);
    let (fips_ready, fips_ready_rx) = tokio::sync::watch::channel(false);
    let (nodes_ready, nodes_ready_rx) = tokio::sync::watch::channel(false);
    let (leases_ready, leases_ready_rx) = tokio::sync::watch::channel(false);
    let (secrets_ready, secrets_ready_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    // The addresses that are never a VIP: every Node's (the Node watch below), the API
    // server's ClusterIP (the Service watch) and its own addresses (its EndpointSlice).
    // Subscribed before the watches start, so that no change is missed.
    let reserved = Arc::new(ReservedAddresses::default());
    let reserved_for_pairs = reserved.subscribe();
    let (slice_ready, slice_ready_rx) = tokio::sync::watch::channel(false);
    tasks.push(reserved.clone().watch_api_server_slice(&client, slice_ready));
    let (lb, lb_watches, services_ready_rx) = crate::loadbalancer::watch(&client, reserved.clone(), &mut tasks);
    // havip_operator_pairs{phase}: counted from the HAPair cache at every scrape.
    let phase_store: reflector::Store<DeserializeGuard<HAPair>> = pairs.clone();
    metrics.pair_phases.set_source(Box::new(move || {
        let mut counts = std::collections::BTreeMap::new();
        for p in phase_store.state() {
            let phase = match &p.0 {
                Ok(pair) => pair
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.as_ref())
                    .map(|ph| format!("{ph:?}"))
                    .unwrap_or_else(|| "Unknown".to_owned()),
                Err(_) => "Unreadable".to_owned(),
            };
            *counts.entry(phase).or_insert(0i64) += 1;
        }
        counts
    }));
    let ctx = Arc::new(Context {
        client: client.clone(),
        settings: settings.clone(),
        metrics: metrics.clone(),
        leader,
        pairs: pairs.clone(),
        fips: fips.clone(),
        nodes: nodes.clone(),
        leases,
        secrets,
        memory: Mutex::default(),
        // Refusals need every reserved address: the Nodes', and the API server's from
        // the Service and EndpointSlice watches.
        ready: vec![
            pairs_ready_rx,
            fips_ready_rx,
            nodes_ready_rx,
            leases_ready_rx,
            secrets_ready_rx,
            services_ready_rx,
            slice_ready_rx,
        ],
        reserved: reserved.clone(),
        lb,
    });

    // FloatingIP → its pair (and the pair it named before, when it moved), and the pairs
    // of every FloatingIP with the same address (now or before): which of them is
    // refused may have changed.
    let fip_pairs: Arc<Mutex<HashMap<String, FipPair>>> = Arc::default();
    let fips_for_fips = fips.clone();
    // HAPairs and FloatingIPs are each watched once: the watch feeds the store every
    // reconcile reads, its own controller (primary) and the other controller (secondary).
    // Their caches drop managedFields (several managers per object: the user, the
    // operator, one per agent): nothing here reads them.
    let [pair_primary, pair_stream, pairs_for_services, pairs_for_pools] = drive(
        watcher(pairs_api, wc.clone()).default_backoff().modify(drop_managed_fields).reflect(pairs_w),
        [
            Filter::Applied,
            Filter::Changed(Box::new(|_: &DeserializeGuard<HAPair>| ())),
            Filter::Changed(Box::new(|_: &DeserializeGuard<HAPair>| ())),
            Filter::Changed(Box::new(|_: &DeserializeGuard<HAPair>| ())),
        ],
        pairs_ready,
        &mut tasks,
    );
    let [fip_primary, fip_stream, fips_for_services, fips_for_pools] = drive(
        watcher(fips_api, wc.clone()).default_backoff().modify(drop_managed_fields).reflect(fips_w),
        [Filter::<_, ()>::Applied, Filter::Touched, Filter::Touched, Filter::Touched],
        fips_ready,
        &mut tasks,
    );
    let hapair_ctrl = Controller::for_stream(pair_primary, pairs.clone());
    let fip_ctrl = Controller::for_stream(fip_primary, fips.clone());
    let fip_mapper = move |f: DeserializeGuard<FloatingIP>| {
        let name = f.name_any();
        let mut out = Vec::new();
        let mut map = match fip_pairs.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let mut addresses = Vec::new();
        let now =
            f.0.as_ref()
                .ok()
                .map(|fip| (fip.spec.pair.clone(), havip_crds::floatingip::vip_address(&fip.spec.address)));
        let before = match &now {
            Some(n) => map.insert(name, n.clone()),
            None => map.remove(&name),
        };
        for (pair, address) in before.into_iter().chain(now) {
            out.push(ObjectRef::new(&pair));
            addresses.extend(address);
        }
        drop(map);
        if !addresses.is_empty() {
            for other in fips_for_fips.state().iter().filter_map(|o| o.0.as_ref().ok()) {
                if havip_crds::floatingip::vip_address(&other.spec.address).is_some_and(|a| addresses.contains(&a)) {
                    out.push(ObjectRef::new(&other.spec.pair));
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out.dedup_by(|a, b| a.name == b.name);
        out
    };
    // Node → the pairs naming it.
    // Nodes are listed in pages, not from the watch cache at once: a cluster's Nodes
    // carry ~20 KB of status each (5,000 of them would be a 100 MB answer).
    let reserved_for_nodes = reserved.clone();
    let [node_stream] = drive(
        watcher(nodes_api, watcher::Config::default().page_size(NODE_PAGE))
            .default_backoff()
            .modify(slim_node)
            .map(move |ev| {
                if let Ok(ev) = &ev {
                    reserved_for_nodes.node_event(ev);
                }
                ev
            })
            .reflect(nodes_w),
        [Filter::Changed(Box::new(node_addresses))],
        nodes_ready,
        &mut tasks,
    );
    let pairs_for_nodes = pairs.clone();
    let node_mapper = move |n: Node| {
        let name = n.name_any();
        pairs_for_nodes
            .state()
            .iter()
            .filter(|p| p.0.as_ref().is_ok_and(|p| p.spec.members.iter().any(|m| m.node == name)))
            .map(|p| ObjectRef::new(&p.name_any()))
            .collect::<Vec<_>>()
    };
    // Reserved addresses changed → the pairs of the FloatingIPs on them (refused or
    // accepted again). One scan of the FloatingIPs per batch of changes (the initial list
    // of 5,000 Nodes is 5,000 changes), never a scan of the Nodes.
    let fips_for_reserved = fips.clone();
    let reserved_mapper = move |changed: &std::collections::HashSet<std::net::IpAddr>| {
        let mut out: Vec<ObjectRef<DeserializeGuard<HAPair>>> = fips_for_reserved
            .state()
            .iter()
            .filter_map(|f| f.0.as_ref().ok())
            .filter(|f| havip_crds::floatingip::vip_address(&f.spec.address).is_some_and(|a| changed.contains(&a)))
            .map(|f| ObjectRef::new(&f.spec.pair))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out.dedup_by(|a, b| a.name == b.name);
        out
    };
    let reserved_stream = crate::reserved::batched(reserved_for_pairs)
        .flat_map(move |changed| futures::stream::iter(reserved_mapper(&changed)))
        .boxed();
    // Lease hapair-<pair> → pair (the leader-election Lease never has that prefix).
    let [lease_stream] = drive(
        reflector(
            leases_w,
            watcher(leases_api, wc.clone()).default_backoff().modify(|l: &mut Lease| {
                l.metadata.managed_fields = None;
            }),
        ),
        [Filter::<_, ()>::Touched],
        leases_ready,
        &mut tasks,
    );
    let lease_mapper = |l: Lease| pair_of_lease(&l.name_any()).map(ObjectRef::new);
    // Key Secret → pair: the operator's own by label, a Secret named by keySecretRef →
    // the pairs naming it (the operator keeps their member labels on it). Every Secret of
    // the namespace is watched; only havip's own keep their data in the cache.
    let [secret_stream] = drive(
        reflector(secrets_w, watcher(secrets_api, wc.clone()).default_backoff().modify(slim_secret)),
        [Filter::<_, ()>::Touched],
        secrets_ready,
        &mut tasks,
    );
    let pairs_for_secrets = pairs.clone();
    let secret_mapper = move |s: Secret| {
        if let Some(p) = s.labels().get(PAIR_LABEL)
            && s.labels().get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1)
        {
            return vec![ObjectRef::new(p)];
        }
        let name = s.name_any();
        pairs_for_secrets
            .state()
            .iter()
            .filter(|p| {
                p.0.as_ref().is_ok_and(|p| p.spec.heartbeat.key_secret_ref.as_ref().is_some_and(|r| r.name == name))
            })
            .map(|p| ObjectRef::new(&p.name_any()))
            .collect::<Vec<_>>()
    };
    // HAPair → the FloatingIPs naming it (for the FloatingIP controller).
    let fips_for_pairs = fips.clone();
    let pair_mapper = move |p: DeserializeGuard<HAPair>| {
        let name = p.name_any();
        fips_for_pairs
            .state()
            .iter()
            .filter(|f| f.0.as_ref().is_ok_and(|f| f.spec.pair == name))
            .map(|f| ObjectRef::new(&f.name_any()))
            .collect::<Vec<_>>()
    };

    // Forget the memory of deleted objects now and then (the primary streams carry
    // no deletions).
    let gc = {
        let ctx = ctx.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(300)).await;
                let pairs: std::collections::HashSet<String> = ctx.pairs.state().iter().map(|p| p.name_any()).collect();
                let fips: std::collections::HashSet<String> =
                    ctx.fips.state().iter().map(|f| format!("fip/{}", f.name_any())).collect();
                let mut memory = match ctx.memory.lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                memory.retain(|k, _| pairs.contains(k) || fips.contains(k));
                drop(memory);
                let services: std::collections::HashSet<String> =
                    ctx.lb.services.state().iter().map(|s| crate::loadbalancer::model::service_key(s)).collect();
                let mut lb_memory = match ctx.lb.memory.lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                lb_memory.retain(|k, _| services.contains(k));
            }
        }
    };
    let config = ControllerConfig::default().concurrency(settings.concurrency);
    let (config_lb, stop_lb) = (config.clone(), stop.clone());
    let hapair = hapair_ctrl
        .with_config(config.clone())
        .watches_stream(fip_stream, fip_mapper)
        .watches_stream(node_stream, node_mapper)
        .watches_stream(lease_stream, lease_mapper)
        .watches_stream(secret_stream, secret_mapper)
        .reconcile_on(reserved_stream)
        .graceful_shutdown_on(stop.clone())
        .run(crate::pair::hapair::reconcile, error_policy::<HAPair>, ctx.clone())
        .for_each(|res| async move { log_result("hapair", res) });
    let fip = fip_ctrl
        .with_config(config)
        .watches_stream(pair_stream, pair_mapper)
        .graceful_shutdown_on(stop)
        .run(crate::pair::floatingip::reconcile, error_policy::<FloatingIP>, ctx.clone())
        .for_each(|res| async move { log_result("floatingip", res) });
    let lb = crate::loadbalancer::run(
        ctx.clone(),
        lb_watches,
        crate::loadbalancer::SharedTriggers { pairs_for_services, pairs_for_pools, fips_for_services, fips_for_pools },
        config_lb,
        stop_lb,
    );
    tracing::info!(namespace = %ns, "controllers started");
    tokio::select! {
        () = async { futures::join!(hapair, fip, lb); } => {}
        () = gc => {}
    }
    for t in tasks {
        t.abort();
    }
    tracing::info!("controllers stopped");
}

/// A shareable future that resolves when `rx` turns true.
pub fn stop_future(
    mut rx: tokio::sync::watch::Receiver<bool>,
) -> futures::future::Shared<futures::future::BoxFuture<'static, ()>> {
    async move {
        let _ = rx.wait_for(|v| *v).await;
    }
    .boxed()
    .shared()
}

#[cfg(test)]
mod tests {
    use super::slim_node;
    use crate::reserved::node_addresses;
    use k8s_openapi::api::core::v1::Node;
    use kube::ResourceExt;

    #[test]
    fn slim_node_keeps_only_addresses() {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "labels": {"x": "y"}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}], "capacity": {"cpu": "4"}}
        }))
        .expect("node");
        slim_node(&mut n);
        assert_eq!(n.name_any(), "a");
        assert!(n.metadata.labels.is_none() && n.metadata.managed_fields.is_none() && n.spec.is_none());
        assert_eq!(node_addresses(&n), vec![("InternalIP".to_owned(), "10.0.0.1".to_owned())]);
    }
}
