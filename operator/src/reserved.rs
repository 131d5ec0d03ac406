//! The addresses that are never a VIP ([`AddressIndex`]), kept up to date from
//! the watches: every Node (the operator's Node watch), the Service `default/kubernetes`
//! (its Service watch) and the EndpointSlice `default/kubernetes` (a watch of that one
//! object, which is all the chart lets the operator read of EndpointSlices). Each change
//! is published to the subscribers as the addresses it concerns, so that the
//! controllers reconcile only what those addresses touch.

use crate::model::{AddressIndex, ApiServerSource, Reserved};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, ResourceExt};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Mutex, RwLock};

/// The namespace and name of the API server's Service and EndpointSlice.
pub const API_SERVER: (&str, &str) = ("default", "kubernetes");

/// The reserved addresses and their subscribers.
#[derive(Default)]
pub struct ReservedAddresses {
    index: RwLock<AddressIndex>,
    subscribers: Mutex<Vec<tokio::sync::mpsc::UnboundedSender<Vec<IpAddr>>>>,
    /// Whether this relist of the Service watch listed `default/kubernetes`.
    service_listed: Mutex<Option<bool>>,
    /// Whether this relist of the EndpointSlice watch listed the slice.
    slice_listed: Mutex<Option<bool>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl ReservedAddresses {
    /// Why `a` is never a VIP (None: it may be one).
    pub fn lookup(&self, a: IpAddr) -> Option<Reserved> {
        self.read(|idx| idx.lookup(a).cloned())
    }

    /// Runs `f` on the index.
    pub fn read<T>(&self, f: impl FnOnce(&AddressIndex) -> T) -> T {
        match self.index.read() {
            Ok(g) => f(&g),
            Err(p) => f(&p.into_inner()),
        }
    }

    fn update(&self, f: impl FnOnce(&mut AddressIndex) -> Vec<IpAddr>) {
        let changed = match self.index.write() {
            Ok(mut g) => f(&mut g),
            Err(p) => f(&mut p.into_inner()),
        };
        if changed.is_empty() {
            return;
        }
        tracing::debug!(addresses = ?changed, "reserved addresses changed");
        lock(&self.subscribers).retain(|tx| tx.send(changed.clone()).is_ok());
    }

    /// A stream of the addresses each change concerns (from now on). Unbounded: the
    /// changes are few and small (a Node's addresses), and a watch task must never wait
    /// on a controller that is not polling yet.
    pub fn subscribe(&self) -> impl Stream<Item = Vec<IpAddr>> + Send + 'static {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        lock(&self.subscribers).push(tx);
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
    }

    /// Follows the Node watch (call it on every event, before the store sees it).
    pub fn node_event(&self, ev: &Event<Node>) {
        match ev {
            Event::Init => self.update(|idx| {
                idx.begin_node_relist();
                Vec::new()
            }),
            Event::InitApply(n) | Event::Apply(n) => self.update(|idx| idx.set_node(&n.name_any(), &node_addresses(n))),
            Event::Delete(n) => self.update(|idx| idx.remove_node(&n.name_any())),
            Event::InitDone => self.update(AddressIndex::end_node_relist),
        }
    }

    /// Follows the Service watch: the ClusterIPs of `default/kubernetes`.
    pub fn service_event(&self, ev: &Event<Service>) {
        let is_api = |s: &Service| s.namespace().as_deref() == Some(API_SERVER.0) && s.name_any() == API_SERVER.1;
        let cluster_ips = |s: &Service| -> BTreeSet<IpAddr> {
            let spec = s.spec.as_ref();
            spec.and_then(|s| s.cluster_ips.clone())
                .unwrap_or_default()
                .into_iter()
                .chain(spec.and_then(|s| s.cluster_ip.clone()))
                .filter_map(|a| a.parse().ok())
                .collect()
        };
        self.follow(&self.service_listed, ApiServerSource::ClusterIp, ev, is_api, cluster_ips);
    }

    /// Follows the EndpointSlice watch: the addresses of `default/kubernetes`.
    pub fn slice_event(&self, ev: &Event<EndpointSlice>) {
        let addresses = |s: &EndpointSlice| -> BTreeSet<IpAddr> {
            s.endpoints.iter().flatten().flat_map(|e| e.addresses.iter()).filter_map(|a| a.parse().ok()).collect()
        };
        self.follow(&self.slice_listed, ApiServerSource::Endpoint, ev, |s| s.name_any() == API_SERVER.1, addresses);
    }

    /// One object of a watch names the API server's addresses from `source`: set them
    /// when it is applied, clear them when it is deleted or a relist does not list it.
    fn follow<K>(
        &self,
        listed: &Mutex<Option<bool>>,
        source: ApiServerSource,
        ev: &Event<K>,
        is_it: impl Fn(&K) -> bool,
        addresses: impl Fn(&K) -> BTreeSet<IpAddr>,
    ) {
        match ev {
            Event::Init => *lock(listed) = Some(false),
            Event::InitApply(o) | Event::Apply(o) if is_it(o) => {
                if let Some(l) = lock(listed).as_mut() {
                    *l = true;
                }
                self.update(|idx| idx.set_api_server(source, addresses(o)));
            }
            Event::Delete(o) if is_it(o) => self.update(|idx| idx.set_api_server(source, BTreeSet::new())),
            Event::InitDone => {
                let unlisted = lock(listed).take() == Some(false);
                if unlisted {
                    self.update(|idx| idx.set_api_server(source, BTreeSet::new()));
                }
            }
            _ => {}
        }
    }

    /// Watches the EndpointSlice `default/kubernetes` (by name: the chart grants
    /// get/list/watch on that name only) until the task is aborted; `ready` turns true
    /// after its first list.
    pub fn watch_api_server_slice(
        self: std::sync::Arc<Self>,
        client: &Client,
        ready: tokio::sync::watch::Sender<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), API_SERVER.0);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", API_SERVER.1)).any_semantic();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ev) => {
                        self.slice_event(&ev);
                        if matches!(ev, Event::InitDone) {
                            ready.send_replace(true);
                        }
                    }
                    // Without it the API server's own addresses are unknown: the caches
                    // never read ready and nothing is accepted or allocated (RBAC:
                    // get/list/watch endpointslices `kubernetes` in `default`).
                    Err(e) => tracing::warn!(error = %e, "failed to watch the EndpointSlice default/kubernetes"),
                }
            }
        })
    }
}

/// The changes that are ready, merged (up to 1,024 at a time): whoever maps them to
/// objects scans its cache once per batch, not once per Node.
pub fn batched(
    changes: impl Stream<Item = Vec<IpAddr>> + Send + 'static,
) -> impl Stream<Item = std::collections::HashSet<IpAddr>> + Send + 'static {
    changes.ready_chunks(1024).map(|chunks| chunks.into_iter().flatten().collect())
}

/// A Node's addresses as (type, address).
pub fn node_addresses(n: &Node) -> Vec<(String, String)> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| a.iter().map(|x| (x.type_.clone(), x.address.clone())).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::{ReservedAddresses, batched};
    use crate::model::{ApiServerSource, Reserved};
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::{Node, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::runtime::watcher::Event;
    use std::net::IpAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn svc(ns: &str, name: &str, ips: &[&str]) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ips.first(), "clusterIPs": ips},
        }))
        .expect("service")
    }

    fn node(name: &str, ip: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
        }))
        .expect("node")
    }

    #[tokio::test]
    async fn the_watches_feed_the_index_and_every_change_reaches_the_subscribers() {
        let r = ReservedAddresses::default();
        let mut changes = std::pin::pin!(r.subscribe());
        r.service_event(&Event::Init);
        r.service_event(&Event::InitApply(svc("apps", "kubernetes", &["10.96.0.9"])));
        r.service_event(&Event::InitApply(svc("default", "kubernetes", &["10.96.0.1", "fd00::1"])));
        r.service_event(&Event::InitDone);
        assert_eq!(r.lookup(ip("10.96.0.9")), None, "a Service of that name elsewhere is not the API server");
        assert_eq!(r.lookup(ip("fd00::1")), Some(Reserved::ApiServer(ApiServerSource::ClusterIp)));
        assert_eq!(changes.next().await, Some(vec![ip("10.96.0.1"), ip("fd00::1")]));
        // A relist without it: gone.
        r.service_event(&Event::Init);
        r.service_event(&Event::InitDone);
        assert_eq!(r.lookup(ip("10.96.0.1")), None);
        assert_eq!(changes.next().await, Some(vec![ip("10.96.0.1"), ip("fd00::1")]));
        r.node_event(&Event::Apply(node("n9", "192.0.2.9")));
        assert_eq!(
            r.lookup(ip("192.0.2.9")),
            Some(Reserved::Node { node: "n9".to_owned(), kind: "InternalIP".to_owned() })
        );
        assert_eq!(changes.next().await, Some(vec![ip("192.0.2.9")]));
        r.node_event(&Event::Delete(node("n9", "192.0.2.9")));
        assert_eq!(r.lookup(ip("192.0.2.9")), None);
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["172.18.0.2"]}, {"addresses": ["172.18.0.3"]}],
        }))
        .expect("slice");
        r.slice_event(&Event::Apply(slice.clone()));
        assert_eq!(r.lookup(ip("172.18.0.3")), Some(Reserved::ApiServer(ApiServerSource::Endpoint)));
        r.slice_event(&Event::Delete(slice));
        assert_eq!(r.lookup(ip("172.18.0.3")), None);
    }

    #[tokio::test]
    async fn changes_that_are_ready_are_handed_over_as_one_batch() {
        let r = ReservedAddresses::default();
        let mut batches = std::pin::pin!(batched(r.subscribe()));
        for i in 1..=3u8 {
            r.node_event(&Event::Apply(node(&format!("n{i}"), &format!("192.0.2.{i}"))));
        }
        let batch = batches.next().await.expect("a batch");
        assert_eq!(batch, [ip("192.0.2.1"), ip("192.0.2.2"), ip("192.0.2.3")].into());
    }
}
