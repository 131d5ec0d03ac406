//! What the agent watches: its own node's objects by member label (and, in the upgrade
//! window, everything), slimmed before caching, and the views its reconcile reads
//! (pairs naming the node, unreadable objects, Leases, the Node's labels, configurations).

use super::config::{self, ClusterView, PairConfigs, agent_config, skipped_floating_ips};
use super::lease::lease_name;
use super::options::KubeAgentError;
use super::snapshot;
use crate::lease::LeaseSnapshot;
use crate::metrics::AgentMetrics;
use futures::StreamExt;
use havip_crds::membership;
use havip_crds::{FloatingIP, HAPair};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

/// The agent's view of the cluster: the watches of this node's own objects, and while
/// the operator has not labelled them all, watches of everything.
pub(super) struct Stores {
    /// Selected by this node's member label (its Node by name): what the agent runs on
    /// once the operator has labelled everything.
    pub(super) own: Watches,
    /// Every pair, FloatingIP, Node, Secret and Lease, as earlier releases watched them:
    /// only while the operator has not labelled this node's objects yet.
    pub(super) every: Option<Watches>,
    pub(super) notify: Arc<Notify>,
}

impl Stores {
    /// The view to configure from: every object while those watches run (and have
    /// listed once), else this node's own.
    pub(super) fn view(&self) -> &Watches {
        match &self.every {
            Some(e) if e.ready() => e,
            _ => &self.own,
        }
    }
}

/// One reflector per kind, each fed by a watch that never gives up. Agents read Leases
/// and Secrets only in the operator namespace. The caches keep what the agent reads
/// (no managedFields; of a Node only its labels, addresses and whether it is cordoned).
pub(super) struct Watches {
    pub(super) pairs: Store<DeserializeGuard<HAPair>>,
    pub(super) fips: Store<DeserializeGuard<FloatingIP>>,
    pub(super) nodes: Store<Node>,
    pub(super) secrets: Store<Secret>,
    pub(super) leases: Store<Lease>,
    pub(super) listed: Vec<Arc<AtomicBool>>,
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Watches {
    /// The objects that concern `node`: pairs, FloatingIPs, Leases and key Secrets
    /// carrying its member label, and its own Node. Lists come from the API server's
    /// watch cache (the cheapest list; a watch then follows every change).
    pub(super) fn own(
        client: &Client,
        namespace: &str,
        node: &str,
        notify: &Arc<Notify>,
        metrics: &Arc<AgentMetrics>,
    ) -> Watches {
        let labelled = watcher::Config::default().any_semantic().labels(&membership::selector(node));
        let mine = watcher::Config::default().any_semantic().fields(&format!("metadata.name={node}"));
        let mut w = Watches::empty();
        let n = notify.clone();
        w.pairs = w.spawn("HAPair", Api::all(client.clone()), labelled.clone(), slim_pair, &n, metrics);
        w.fips = w.spawn("FloatingIP", Api::all(client.clone()), labelled.clone(), slim_fip, &n, metrics);
        w.nodes = w.spawn("Node", Api::all(client.clone()), mine, slim_node, &n, metrics);
        w.secrets =
            w.spawn("Secret", Api::namespaced(client.clone(), namespace), labelled.clone(), slim_meta, &n, metrics);
        w.leases = w.spawn("Lease", Api::namespaced(client.clone(), namespace), labelled, slim_meta, &n, metrics);
        w
    }

    /// Every pair, FloatingIP, Node, Secret and Lease (of the operator namespace), as
    /// releases before member labels watched them. Nodes are listed in pages of 50.
    pub(super) fn every(
        client: &Client,
        namespace: &str,
        notify: &Arc<Notify>,
        metrics: &Arc<AgentMetrics>,
    ) -> Watches {
        let all = watcher::Config::default().any_semantic();
        let paged = watcher::Config::default().page_size(50);
        let mut w = Watches::empty();
        let n = notify.clone();
        w.pairs = w.spawn("HAPair", Api::all(client.clone()), all.clone(), slim_pair, &n, metrics);
        w.fips = w.spawn("FloatingIP", Api::all(client.clone()), all.clone(), slim_fip, &n, metrics);
        w.nodes = w.spawn("Node", Api::all(client.clone()), paged, slim_node, &n, metrics);
        w.secrets = w.spawn("Secret", Api::namespaced(client.clone(), namespace), all.clone(), slim_meta, &n, metrics);
        w.leases = w.spawn("Lease", Api::namespaced(client.clone(), namespace), all, slim_meta, &n, metrics);
        w
    }

    pub(super) fn empty() -> Watches {
        Watches {
            pairs: reflector::store().0,
            fips: reflector::store().0,
            nodes: reflector::store().0,
            secrets: reflector::store().0,
            leases: reflector::store().0,
            listed: Vec::new(),
            tasks: Vec::new(),
        }
    }

    /// A reflector store fed by a watcher that never gives up (errors back off and
    /// retry); every object it delivers is slimmed, counted and notifies `notify`.
    pub(super) fn spawn<K>(
        &mut self,
        kind: &'static str,
        api: Api<K>,
        config: watcher::Config,
        slim: fn(&mut K),
        notify: &Arc<Notify>,
        metrics: &Arc<AgentMetrics>,
    ) -> Store<K>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Default,
    {
        let (store, writer) = reflector::store();
        let stream = reflector::reflector(writer, watcher(api, config).default_backoff().modify(slim));
        let listed = Arc::new(AtomicBool::new(false));
        self.listed.push(listed.clone());
        let (notify, metrics) = (notify.clone(), metrics.clone());
        self.tasks.push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            // A failing watch (RBAC, admission, an unreachable API server) is a warning
            // once, then quiet until it works again (the watcher retries with backoff).
            let mut failing = false;
            while let Some(ev) = stream.next().await {
                if ev.is_ok() && std::mem::take(&mut failing) {
                    tracing::info!(kind, "watch works again");
                }
                let event = match ev {
                    Ok(watcher::Event::Apply(_)) => "applied",
                    Ok(watcher::Event::Delete(_)) => "deleted",
                    Ok(watcher::Event::InitApply(_)) => "listed",
                    Ok(watcher::Event::Init) => continue,
                    Ok(watcher::Event::InitDone) => {
                        listed.store(true, Ordering::SeqCst);
                        notify.notify_one();
                        continue;
                    }
                    Err(e) => {
                        if std::mem::replace(&mut failing, true) {
                            tracing::debug!(kind, error = %e, "watch still failing (retrying)");
                        } else {
                            tracing::warn!(kind, error = %e, "watch failed; retrying with backoff");
                        }
                        continue;
                    }
                };
                metrics.watch_event(kind, event);
                notify.notify_one();
            }
        }));
        store
    }

    /// Whether every watch has listed once.
    pub(super) fn ready(&self) -> bool {
        self.listed.iter().all(|l| l.load(Ordering::SeqCst))
    }

    /// Waits until every watch has listed once.
    pub(super) async fn wait_until_ready(&self) -> Result<(), KubeAgentError> {
        let failed = |what| move |_| KubeAgentError::InitialList { what };
        self.pairs.wait_until_ready().await.map_err(failed("HAPairs"))?;
        self.fips.wait_until_ready().await.map_err(failed("FloatingIPs"))?;
        self.nodes.wait_until_ready().await.map_err(failed("Nodes"))?;
        self.secrets.wait_until_ready().await.map_err(failed("Secrets"))?;
        self.leases.wait_until_ready().await.map_err(failed("Leases"))?;
        Ok(())
    }

    /// The pairs that name `node` as a member, by name (malformed objects are skipped).
    pub(super) fn pairs_of(&self, node: &str) -> BTreeMap<String, HAPair> {
        let mut out = BTreeMap::new();
        for p in self.pairs.state() {
            match &p.0 {
                Ok(pair) if pair.spec.members.iter().any(|m| m.node == node) => {
                    out.insert(pair.name_any(), pair.clone());
                }
                Ok(_) | Err(_) => {}
            }
        }
        out
    }

    /// HAPairs that exist but cannot be read by this version (a newer schema, a value
    /// it does not know): name → why. A running pair among them keeps running on its
    /// last configuration rather than being taken for deleted.
    pub(super) fn unreadable_pairs(&self) -> BTreeMap<String, String> {
        unreadable(&self.pairs)
    }

    /// FloatingIPs that exist but cannot be read: name → why. A pair that runs a VIP of
    /// that name keeps its last configuration (the VIP is not dropped).
    pub(super) fn unreadable_fips(&self) -> BTreeMap<String, String> {
        unreadable(&self.fips)
    }

    /// The pair's Lease as the machine reads it, if the Lease exists.
    pub(super) fn lease_of(&self, pair: &str) -> Option<LeaseSnapshot> {
        let name = lease_name(pair);
        self.leases.state().iter().find(|l| l.name_any() == name).map(|l| LeaseSnapshot::of(l))
    }

    /// The labels of `node`, if it is known.
    pub(super) fn node_labels(&self, node: &str) -> Option<BTreeMap<String, String>> {
        self.nodes.state().iter().find(|n| n.name_any() == node).map(|n| n.labels().clone())
    }

    /// Whether `node` is cordoned (`spec.unschedulable`).
    pub(super) fn cordoned(&self, node: &str) -> bool {
        self.nodes
            .state()
            .iter()
            .find(|n| n.name_any() == node)
            .and_then(|n| n.spec.as_ref().and_then(|s| s.unschedulable))
            .unwrap_or(false)
    }

    /// The configuration of each of `pairs` from this view (see [`agent_config`]).
    pub(super) fn configs(
        &self,
        node: &str,
        namespace: &str,
        pairs: &BTreeMap<String, HAPair>,
        local_interfaces: &BTreeMap<String, IpAddr>,
    ) -> BTreeMap<String, PairConfigs> {
        let nodes = self.nodes.state();
        let secrets = self.secrets.state();
        let fips = self.fips.state();
        let fips: Vec<&FloatingIP> = fips.iter().filter_map(|f| f.0.as_ref().ok()).collect();
        let view = ClusterView { node, namespace, nodes: &nodes, fips: &fips, secrets: &secrets, local_interfaces };
        pairs
            .iter()
            .map(|(name, pair)| (name.clone(), (agent_config(pair, &view), skipped_floating_ips(pair, &view))))
            .collect()
    }

    /// What the configuration of `pair` is built from, for its snapshot.
    pub(super) fn snapshot(&self, node: &str, namespace: &str, pair: &HAPair) -> snapshot::PairSnapshot {
        let nodes = self.nodes.state();
        let secrets = self.secrets.state();
        let all = self.fips.state();
        let fips: Vec<&FloatingIP> = all.iter().filter_map(|f| f.0.as_ref().ok()).collect();
        let none = BTreeMap::new();
        let view =
            ClusterView { node, namespace, nodes: &nodes, fips: &fips, secrets: &secrets, local_interfaces: &none };
        let secret = config::pair_key_secret(pair, &view).ok().map(|s| s.as_ref());
        let name = pair.name_any();
        let mine: Vec<FloatingIP> = fips.iter().filter(|f| f.spec.pair == name).map(|f| (*f).clone()).collect();
        snapshot::PairSnapshot::new(pair, &mine, &nodes, secret)
    }
}

/// The objects of a store that could not be decoded: name → the decode error.
pub(super) fn unreadable<K>(store: &Store<DeserializeGuard<K>>) -> BTreeMap<String, String>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    store
        .state()
        .iter()
        .filter_map(|o| o.0.as_ref().err())
        .filter_map(|i| i.metadata.name.clone().map(|n| (n, i.error.clone())))
        .collect()
}

/// Of a pair, what the agent never reads: managedFields, annotations, the operator's
/// conditions and records.
pub(super) fn slim_pair(p: &mut DeserializeGuard<HAPair>) {
    p.meta_mut().managed_fields = None;
    if let Ok(pair) = &mut p.0 {
        pair.metadata.annotations = None;
        if let Some(s) = &mut pair.status {
            s.conditions.clear();
            s.last_transition = None;
            s.last_operation = None;
            s.key_rotation = None;
        }
    }
}

/// Of a FloatingIP, what the agent never reads: managedFields, annotations, conditions.
pub(super) fn slim_fip(f: &mut DeserializeGuard<FloatingIP>) {
    f.meta_mut().managed_fields = None;
    if let Ok(fip) = &mut f.0 {
        fip.metadata.annotations = None;
        if let Some(s) = &mut fip.status {
            s.conditions.clear();
        }
    }
}

/// Of a Node, only its name, labels (the DaemonSet's node selector is matched against
/// them at shutdown), addresses and whether it is cordoned (a Node's status, with its
/// images and conditions, is ~20 KB).
pub(super) fn slim_node(n: &mut Node) {
    let addresses = n.status.as_ref().and_then(|s| s.addresses.clone());
    let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable);
    *n = Node {
        metadata: ObjectMeta {
            name: n.metadata.name.take(),
            labels: n.metadata.labels.take(),
            uid: n.metadata.uid.take(),
            resource_version: n.metadata.resource_version.take(),
            ..ObjectMeta::default()
        },
        spec: unschedulable.map(|u| NodeSpec { unschedulable: Some(u), ..NodeSpec::default() }),
        status: Some(NodeStatus { addresses, ..NodeStatus::default() }),
    };
}

/// Drops managedFields (Secrets and Leases have several managers).
pub(super) fn slim_meta<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}
