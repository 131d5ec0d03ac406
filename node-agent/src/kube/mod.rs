//! The agent in Kubernetes mode: one [`runtime`] per HAPair that names this node.
//!
//! This module is the loop: it watches this node's HAPairs, FloatingIPs, key Secrets and
//! pair Leases (selected by its member label, see [`havip_crds::membership`]) and its own
//! Node into [`Stores`], and on every change starts, reconfigures or releases the
//! pairs' runtimes and feeds them what the objects say. Until the operator has labelled
//! every object of this node's pairs (the first start after an upgrade from a release
//! without member labels), it watches every object of those kinds, as before. The rooms around it: [`config`] turns
//! the objects into an agent configuration (pure), [`lease`] is the fencing record's
//! compare-and-swap, [`report`] writes the member entry, the FloatingIP status and the
//! Events, [`commands`] hands maintenance, pause and the operator's commands to the
//! machine. See docs/kubernetes.md for the contract.
//!
//! When the API server is unreachable the pair runtimes keep running on the last
//! configuration: the compare-and-swap times out (200 ms) and the standalone rules
//! apply; the Lease and the status catch up when the API server answers again.

mod commands;
mod config;
mod lease;
mod leftovers;
mod report;
mod snapshot;

pub use crate::lease::LeaseSnapshot;
pub use commands::op_id;
pub use config::{
    ClusterView, KeySecretError, PairConfigError, agent_config, key_secret_name, keyring_from_secret,
    pick_path_address, skipped_floating_ips,
};
pub use lease::{KubeLease, lease_name, lease_view};

use crate::config::AgentConfig;
use crate::heartbeat::Hub;
use crate::lease::LeaseFeed;
use crate::metrics::AgentMetrics;
use crate::runtime::{self, Handle, Options, Request, RuntimeError};
use crate::sm;
use crate::state::StateFile;
use commands::PairInputs;
use futures::StreamExt;
use havip_crds::membership;
use havip_crds::wire::Keyring;
use havip_crds::{FloatingIP, HAPair};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::api::ListParams;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use report::KubeReporter;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How the Kubernetes agent runs.
#[derive(Clone, Debug)]
pub struct KubeAgentOptions {
    /// This node.
    pub node: String,
    /// The operator namespace (pair Leases and key Secrets).
    pub namespace: String,
    /// Persisted state directory (a hostPath).
    pub state_dir: PathBuf,
    /// Hand the VIPs over before exiting when the node is cordoned.
    pub handover_when_cordoned: bool,
    /// The agent's DaemonSet in `namespace`: on SIGTERM, if it is gone, being deleted or
    /// no longer selects this node, the VIPs are removed (an uninstall leaves none);
    /// otherwise (a rolling update, a restarted pod) they stay. `None`: they always stay.
    pub daemonset: Option<String>,
}

/// Why the Kubernetes agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum KubeAgentError {
    /// A watch ended before it listed its objects once.
    #[error("failed to list {what}: the watch ended before its first list")]
    InitialList {
        /// The kind, plural.
        what: &'static str,
    },
    /// The check for pairs the operator has not labelled yet could not list the pairs.
    #[error("failed to list the HAPairs (to find those not labelled for this node yet): {0}")]
    Unlabelled(#[source] kube::Error),
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("failed to install the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
}

/// Runs the Kubernetes mode until SIGTERM/SIGINT.
pub async fn run(client: Client, opts: KubeAgentOptions, metrics: Arc<AgentMetrics>) -> Result<(), KubeAgentError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(KubeAgentError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(KubeAgentError::Signals)?;
    let notify = Arc::new(Notify::new());
    let own = Watches::own(&client, &opts.namespace, &opts.node, &notify, &metrics);
    // One set of heartbeat sockets for every pair of this node.
    let hub = Hub::new(metrics.clone());
    // Configure nothing before every watch has listed once: a pair started from a
    // partial view (its key Secret not seen yet) would restart moments later with
    // another configuration revision. An operator that has not labelled every object of
    // this node's pairs yet (the first start after an upgrade from a release without
    // member labels): watch everything, as earlier releases did, until it has. And when
    // the API server does not answer, the pairs resume from their last applied
    // configuration after OFFLINE_AFTER (a restart must not leave the VIPs in the kernel
    // with nobody heartbeating for them).
    tracing::info!(selector = %membership::selector(&opts.node), "waiting for the initial lists of this node's pairs, FloatingIPs, Secrets, Leases and its Node");
    let (started, running) = {
        let start = async {
            own.wait_until_ready().await?;
            match unlabelled_pairs(&client, &opts.node).await {
                Ok(missing) if missing.is_empty() => Ok(None),
                Ok(missing) => {
                    tracing::warn!(pairs = ?missing, "pairs naming this node carry no member label yet (the operator has not labelled them): watching every pair, FloatingIP, Node, Secret and Lease until it has");
                    let every = Watches::every(&client, &opts.namespace, &notify, &metrics);
                    every.wait_until_ready().await?;
                    Ok(Some(every))
                }
                Err(e) => Err(KubeAgentError::Unlabelled(e)),
            }
        };
        let mut start = std::pin::pin!(start);
        let offline = tokio::time::sleep(OFFLINE_AFTER);
        let mut offline = std::pin::pin!(offline);
        let mut resumed: Option<BTreeMap<String, PairRun>> = None;
        let started = loop {
            tokio::select! {
                r = &mut start => break Some(r),
                _ = &mut offline, if resumed.is_none() => {
                    resumed = Some(start_from_snapshots(&client, &opts, &metrics, &hub).await);
                }
                _ = term.recv() => break None,
                _ = int.recv() => break None,
            }
        };
        (started, resumed.unwrap_or_default())
    };
    let Some(started) = started else {
        // Stopped before the lists: an uninstall still leaves no VIP behind.
        let agent = Agent {
            client,
            opts,
            metrics,
            hub,
            stores: Stores { own, every: None, notify: notify.clone() },
            running,
            skipped: BTreeMap::new(),
        };
        agent.shutdown().await;
        return Ok(());
    };
    let every = started?;
    tracing::info!(node = %opts.node, namespace = %opts.namespace, "havip-agent running (kubernetes)");
    let stores = Stores { own, every, notify: notify.clone() };
    let mut agent = Agent { client, opts, metrics, hub, stores, running, skipped: BTreeMap::new() };
    // Pairs that left this node while the agent was down (deleted, or this node removed
    // from them) left their VIPs and state behind: removed now that the lists succeeded
    // (the view holds every pair naming this node: labelled, or all of them while some
    // are not; pairs resumed from a snapshot that are gone are given up by the first
    // reconcile).
    agent.reconcile().await;
    // Every view counts (the complete one may not say it is ready yet a moment after its
    // lists returned): a pair any of them shows is not gone.
    let mut present: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for w in std::iter::once(&agent.stores.own).chain(agent.stores.every.as_ref()) {
        present.extend(w.pairs_of(&agent.opts.node).into_keys());
        present.extend(w.unreadable_pairs().into_keys());
    }
    present.extend(agent.running.keys().cloned());
    leftovers::remove_gone_pairs(&agent.opts.state_dir, &present).await;
    loop {
        tokio::select! {
            _ = notify.notified() => {},
            _ = tokio::time::sleep(Duration::from_secs(1)) => {},
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
        // Coalesce bursts of watch events.
        tokio::time::sleep(Duration::from_millis(20)).await;
        agent.reconcile().await;
    }
    agent.shutdown().await;
    Ok(())
}

/// How long the agent waits for its first lists before it resumes its pairs from their
/// last applied configuration.
const OFFLINE_AFTER: Duration = Duration::from_secs(10);

/// The pairs naming `node` that do not carry its member label, from a paged list of
/// every HAPair (pages of 100, so that a big cluster never arrives in one answer).
/// Retries a failing list a few times before giving up.
async fn unlabelled_pairs(client: &Client, node: &str) -> Result<Vec<String>, kube::Error> {
    let api: Api<DeserializeGuard<HAPair>> = Api::all(client.clone());
    let key = membership::label_key(node);
    let mut attempt = 0u32;
    'again: loop {
        let mut out = Vec::new();
        let mut params = ListParams::default().limit(100);
        loop {
            let page = match api.list(&params).await {
                Ok(p) => p,
                Err(e) if attempt < 5 => {
                    attempt += 1;
                    tracing::warn!(error = %e, attempt, "failed to list the HAPairs; retrying");
                    tokio::time::sleep(Duration::from_secs(u64::from(attempt))).await;
                    continue 'again;
                }
                Err(e) => return Err(e),
            };
            for p in &page.items {
                if let Ok(pair) = &p.0
                    && pair.spec.members.iter().any(|m| m.node == node)
                    && !pair.labels().contains_key(&key)
                {
                    out.push(pair.name_any());
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => params = params.continue_token(&c),
                None => return Ok(out),
            }
        }
    }
}

/// The agent's view of the cluster: the watches of this node's own objects, and while
/// the operator has not labelled them all, watches of everything.
struct Stores {
    /// Selected by this node's member label (its Node by name): what the agent runs on
    /// once the operator has labelled everything.
    own: Watches,
    /// Every pair, FloatingIP, Node, Secret and Lease, as earlier releases watched them:
    /// only while the operator has not labelled this node's objects yet.
    every: Option<Watches>,
    notify: Arc<Notify>,
}

impl Stores {
    /// The view to configure from: every object while those watches run (and have
    /// listed once), else this node's own.
    fn view(&self) -> &Watches {
        match &self.every {
            Some(e) if e.ready() => e,
            _ => &self.own,
        }
    }
}

/// One reflector per kind, each fed by a watch that never gives up. Agents read Leases
/// and Secrets only in the operator namespace. The caches keep what the agent reads
/// (no managedFields; of a Node only its labels, addresses and whether it is cordoned).
struct Watches {
    pairs: Store<DeserializeGuard<HAPair>>,
    fips: Store<DeserializeGuard<FloatingIP>>,
    nodes: Store<Node>,
    secrets: Store<Secret>,
    leases: Store<Lease>,
    listed: Vec<Arc<AtomicBool>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
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
    fn own(client: &Client, namespace: &str, node: &str, notify: &Arc<Notify>, metrics: &Arc<AgentMetrics>) -> Watches {
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
    fn every(client: &Client, namespace: &str, notify: &Arc<Notify>, metrics: &Arc<AgentMetrics>) -> Watches {
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

    fn empty() -> Watches {
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
    fn spawn<K>(
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
            while let Some(ev) = stream.next().await {
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
                        tracing::debug!(kind, error = %e, "watch error (retrying)");
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
    fn ready(&self) -> bool {
        self.listed.iter().all(|l| l.load(Ordering::SeqCst))
    }

    /// Waits until every watch has listed once.
    async fn wait_until_ready(&self) -> Result<(), KubeAgentError> {
        let failed = |what| move |_| KubeAgentError::InitialList { what };
        self.pairs.wait_until_ready().await.map_err(failed("HAPairs"))?;
        self.fips.wait_until_ready().await.map_err(failed("FloatingIPs"))?;
        self.nodes.wait_until_ready().await.map_err(failed("Nodes"))?;
        self.secrets.wait_until_ready().await.map_err(failed("Secrets"))?;
        self.leases.wait_until_ready().await.map_err(failed("Leases"))?;
        Ok(())
    }

    /// The pairs that name `node` as a member, by name (malformed objects are skipped).
    fn pairs_of(&self, node: &str) -> BTreeMap<String, HAPair> {
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
    fn unreadable_pairs(&self) -> BTreeMap<String, String> {
        unreadable(&self.pairs)
    }

    /// FloatingIPs that exist but cannot be read: name → why. A pair that runs a VIP of
    /// that name keeps its last configuration (the VIP is not dropped).
    fn unreadable_fips(&self) -> BTreeMap<String, String> {
        unreadable(&self.fips)
    }

    /// The pair's Lease as the machine reads it, if the Lease exists.
    fn lease_of(&self, pair: &str) -> Option<LeaseSnapshot> {
        let name = lease_name(pair);
        self.leases.state().iter().find(|l| l.name_any() == name).map(|l| LeaseSnapshot::of(l))
    }

    /// The labels of `node`, if it is known.
    fn node_labels(&self, node: &str) -> Option<BTreeMap<String, String>> {
        self.nodes.state().iter().find(|n| n.name_any() == node).map(|n| n.labels().clone())
    }

    /// Whether `node` is cordoned (`spec.unschedulable`).
    fn cordoned(&self, node: &str) -> bool {
        self.nodes
            .state()
            .iter()
            .find(|n| n.name_any() == node)
            .and_then(|n| n.spec.as_ref().and_then(|s| s.unschedulable))
            .unwrap_or(false)
    }

    /// The configuration of each of `pairs` from this view (see [`agent_config`]).
    fn configs(
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
    fn snapshot(&self, node: &str, namespace: &str, pair: &HAPair) -> snapshot::PairSnapshot {
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
fn unreadable<K>(store: &Store<DeserializeGuard<K>>) -> BTreeMap<String, String>
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
fn slim_pair(p: &mut DeserializeGuard<HAPair>) {
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
fn slim_fip(f: &mut DeserializeGuard<FloatingIP>) {
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
fn slim_node(n: &mut Node) {
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
fn slim_meta<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

/// A pair's configuration (or why it has none) and the FloatingIPs it skips, each with
/// the reason.
type PairConfigs = (Result<AgentConfig, PairConfigError>, BTreeMap<String, String>);

/// One pair this agent runs.
struct PairRun {
    revision: u64,
    keys: Keyring,
    handle: Handle,
    task: tokio::task::JoinHandle<()>,
    aux: Vec<tokio::task::JoinHandle<()>>,
    reporter: Arc<KubeReporter>,
    lease: LeaseFeed,
    inputs: PairInputs,
    /// Digest of the configuration snapshot last written for this pair.
    snapshot: Option<u64>,
    /// A rotated key accepted but not signing yet: when it starts to sign, and the keys.
    key_switch: Option<(Instant, Keyring)>,
}

impl PairRun {
    /// Waits (up to 5 s) for the runtime to finish, then stops the writers.
    async fn finish(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        for t in self.aux {
            t.abort();
        }
    }
}

/// The loop's state: the stores and the pairs running.
struct Agent {
    client: Client,
    opts: KubeAgentOptions,
    metrics: Arc<AgentMetrics>,
    hub: Arc<Hub>,
    stores: Stores,
    running: BTreeMap<String, PairRun>,
    /// The FloatingIPs skipped per pair, as last logged.
    skipped: BTreeMap<String, BTreeMap<String, String>>,
}

/// Whether this node is still a member of a pair, read from the API server.
enum Membership {
    /// The pair is gone, unreadable, or no longer names this node.
    Left,
    /// The pair still names this node.
    Member,
    /// The API server did not answer.
    Unknown(kube::Error),
}

/// Reads pair `pair` by name to tell whether it still names `node`.
async fn membership_of(client: &Client, pair: &str, node: &str) -> Membership {
    let api: Api<DeserializeGuard<HAPair>> = Api::all(client.clone());
    match api.get_opt(pair).await {
        Ok(Some(p)) if p.0.as_ref().is_ok_and(|p| p.spec.members.iter().any(|m| m.node == node)) => Membership::Member,
        Ok(_) => Membership::Left,
        Err(e) => Membership::Unknown(e),
    }
}

impl Agent {
    /// Brings the running pairs in line with the stores.
    async fn reconcile(&mut self) {
        let node = self.opts.node.clone();
        let catching_up = self.stores.every.as_ref().is_some_and(Watches::ready);
        let wanted = self.stores.view().pairs_of(&node);
        let unreadable = self.stores.view().unreadable_pairs();
        let unreadable_fips = self.stores.view().unreadable_fips();
        // A running pair whose object cannot be read (version skew) is not gone: it keeps
        // its last configuration, and says why it cannot take the new one.
        for (name, why) in &unreadable {
            if let Some(run) = self.running.get(name) {
                let msg = format!("cannot read the HAPair: {why}");
                if run.reporter.set_config_error(Some(msg), &run.handle.status()) {
                    tracing::warn!(pair = %name, error = %why, "cannot read the HAPair; keeping the last configuration");
                }
            }
        }
        // Pairs this node left (or that were deleted): the runtime gives the VIPs up.
        let gone: Vec<String> =
            self.running.keys().filter(|k| !wanted.contains_key(*k) && !unreadable.contains_key(*k)).cloned().collect();
        for name in gone {
            // A pair that leaves the labelled view is read once more by name before its
            // VIPs are given up: a pair that still names this node but lost (or never
            // had) its member label keeps running, and the agent watches everything
            // until the operator labels it.
            if !catching_up {
                match membership_of(&self.client, &name, &node).await {
                    Membership::Left => {}
                    Membership::Member => {
                        if self.stores.every.is_none() {
                            tracing::warn!(pair = %name, "the pair still names this node but carries no member label for it: keeping it, and watching every object until the operator labels it");
                            self.stores.every = Some(Watches::every(
                                &self.client,
                                &self.opts.namespace,
                                &self.stores.notify,
                                &self.metrics,
                            ));
                        }
                        continue;
                    }
                    Membership::Unknown(e) => {
                        tracing::warn!(pair = %name, error = %e, "cannot confirm that this node left the pair; keeping it for now");
                        continue;
                    }
                }
            }
            if let Some(run) = self.running.remove(&name) {
                tracing::info!(pair = %name, "this node is no longer a member: giving up the pair's VIPs");
                run.handle.release().await;
                run.finish().await;
                // Its files too: a later start must not resume it from its snapshot.
                leftovers::remove_pair_leftovers(&self.opts.state_dir, &name).await;
            }
            self.skipped.remove(&name);
        }
        let ifnames: Vec<String> =
            wanted.values().flat_map(|p| p.spec.heartbeat.paths.iter().filter_map(|x| x.interface.clone())).collect();
        let local_interfaces = interface_addresses(&ifnames).await;
        let (ns, view) = (&self.opts.namespace, self.stores.view());
        let mut configs = view.configs(&node, ns, &wanted, &local_interfaces);
        let leases: BTreeMap<String, _> = wanted.keys().map(|n| (n.clone(), view.lease_of(n))).collect();
        // Catching up: once this node's own (labelled) objects give every pair the very
        // configuration the complete view gives, the complete watches go. Not while the
        // node has no pair at all: nothing then shows that the operator labels, and a
        // pair an unlabelling operator creates later would go unseen.
        if catching_up {
            let own = self.stores.own.pairs_of(&node);
            let same = !own.is_empty() && own.keys().eq(wanted.keys()) && {
                let own_configs = self.stores.own.configs(&node, ns, &own, &local_interfaces);
                configs.iter().all(|(name, (cfg, _))| match (cfg, own_configs.get(name).map(|c| &c.0)) {
                    (Ok(a), Some(Ok(b))) => a.sm.config_revision == b.sm.config_revision && a.keys == b.keys,
                    _ => false,
                })
            };
            if same {
                tracing::info!(
                    pairs = own.len(),
                    "every object of this node's pairs carries its member label: watching only those from now on"
                );
                self.stores.every = None;
            }
        }
        for (name, pair) in wanted {
            // A VIP of the running configuration whose FloatingIP cannot be read is not
            // dropped: the last configuration stays until the object reads again.
            if let Some(run) = self.running.get(&name)
                && let Some((fip, why)) = unreadable_fips.iter().find(|(f, _)| run.reporter.runs_vip(f))
            {
                let msg = format!("cannot read FloatingIP {fip}: {why}");
                if run.reporter.set_config_error(Some(msg), &run.handle.status()) {
                    tracing::warn!(pair = %name, fip = %fip, error = %why, "cannot read a FloatingIP of the pair; keeping the last configuration");
                }
                continue;
            }
            let Some((cfg, skipped)) = configs.remove(&name) else { continue };
            if self.skipped.get(&name) != Some(&skipped) {
                for (fip, why) in &skipped {
                    tracing::warn!(pair = %name, floatingip = %fip, reason = %why, "FloatingIP not configured");
                }
                self.skipped.insert(name.clone(), skipped);
            }
            let cfg = match cfg {
                Ok(c) => c,
                Err(why) => {
                    match self.running.get(&name) {
                        // Running: it keeps its last configuration; say why the new one
                        // cannot be built.
                        Some(run) => {
                            let msg = format!("cannot build the new configuration: {why}");
                            if run.reporter.set_config_error(Some(msg), &run.handle.status()) {
                                tracing::warn!(pair = %name, reason = %why, "keeping the last applied configuration");
                            }
                        }
                        None => tracing::warn!(pair = %name, reason = %why, "cannot run the pair yet"),
                    }
                    continue;
                }
            };
            let cfg_revision = cfg.sm.config_revision;
            let run = match self.running.entry(name.clone()) {
                std::collections::btree_map::Entry::Occupied(e) => {
                    let run = e.into_mut();
                    apply_config(&name, run, cfg).await;
                    run
                }
                std::collections::btree_map::Entry::Vacant(e) => {
                    match start_pair(&self.client, &self.opts, &self.metrics, &self.hub, &pair, cfg).await {
                        Ok(run) => e.insert(run),
                        Err(err) => {
                            self.metrics.io_error("pair_start");
                            tracing::error!(pair = %name, error = %err, "failed to start the pair");
                            continue;
                        }
                    }
                }
            };
            if run.revision == cfg_revision {
                let snap = self.stores.view().snapshot(&node, &self.opts.namespace, &pair);
                let digest = snap.digest();
                if run.snapshot != Some(digest) {
                    match snap.save(&self.opts.state_dir) {
                        Ok(()) => run.snapshot = Some(digest),
                        Err(e) => {
                            tracing::warn!(pair = %name, error = %e, "cannot save the pair's configuration snapshot")
                        }
                    }
                }
            }
            // (While it holds the VIPs and cannot hear a peer, the active also reads the
            // Lease itself about once a second, when it renews it: a peer that took the
            // pair over is learnt within a second even if this watch went stale.)
            run.lease.feed(&run.handle, leases.get(&name).cloned().flatten()).await;
            run.inputs.feed(&pair, &run.handle, &run.reporter).await;
        }
    }

    /// SIGTERM: a rolling upgrade keeps the VIPs and the role; a cordoned (draining)
    /// node hands them over first; an uninstall (the DaemonSet gone or deleting, or no
    /// longer selecting this node) removes them.
    async fn shutdown(self) {
        if let Some(why) = self.leaving().await {
            tracing::warn!(reason = %why, "the agent is being removed from this node: removing its VIPs");
            for (name, run) in self.running {
                tracing::info!(pair = %name, "giving up the pair's VIPs");
                run.handle.release().await;
                run.finish().await;
            }
            // Also what no runtime runs now (pairs not started yet, or a stop during the
            // start): every VIP recorded in a ledger here. State files stay (an epoch
            // never goes back, even across a reinstall).
            leftovers::remove_all_vips(&self.opts.state_dir).await;
            return;
        }
        let cordoned = self.stores.own.cordoned(&self.opts.node);
        for (name, run) in &self.running {
            if cordoned && self.opts.handover_when_cordoned && run.handle.status().holds_vips {
                tracing::info!(pair = %name, "node is cordoned: handing the VIPs over before exiting");
                let cmd = sm::Command::PlannedFailover { id: rand_id(), target: None };
                let r = run.handle.request(Request::Command(cmd), Duration::from_secs(5)).await;
                tracing::info!(pair = %name, result = ?r, "handover before exit");
            }
            run.handle.stop().await;
        }
        for (_, run) in self.running {
            run.finish().await;
        }
    }
}

impl Agent {
    /// Why this agent will not be replaced on this node (so its VIPs must go), if so: its
    /// DaemonSet is gone or being deleted, or its node selector no longer matches this
    /// node. When the API server cannot say, the VIPs stay (they are never dropped on a
    /// guess).
    async fn leaving(&self) -> Option<String> {
        let name = self.opts.daemonset.as_deref()?;
        let api: Api<k8s_openapi::api::apps::v1::DaemonSet> =
            Api::namespaced(self.client.clone(), &self.opts.namespace);
        let ds = match tokio::time::timeout(Duration::from_secs(5), api.get_opt(name)).await {
            Ok(Ok(Some(ds))) => ds,
            Ok(Ok(None)) => return Some(format!("DaemonSet {name} is gone")),
            // `helm uninstall` deletes the DaemonSet, then (while its pods are still
            // terminating) the ServiceAccount and its Role: a token that no longer
            // authenticates, or a permission the chart always grants that is gone, means
            // the installation is being removed.
            Ok(Err(kube::Error::Api(e))) if e.code == 401 || e.code == 403 => {
                return Some(format!(
                    "the agent's ServiceAccount or its permissions are gone ({} reading DaemonSet {name})",
                    e.code
                ));
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the agent's DaemonSet; keeping the VIPs");
                return None;
            }
            Err(_) => {
                tracing::warn!("cannot read the agent's DaemonSet in time; keeping the VIPs");
                return None;
            }
        };
        if ds.metadata.deletion_timestamp.is_some() {
            return Some(format!("DaemonSet {name} is being deleted"));
        }
        let selector = ds.spec.template.spec.as_ref().and_then(|p| p.node_selector.clone());
        let labels = self.stores.own.node_labels(&self.opts.node)?;
        match selector {
            Some(sel) if !sel.iter().all(|(k, v)| labels.get(k) == Some(v)) => {
                Some(format!("DaemonSet {name} no longer selects this node (nodeSelector)"))
            }
            _ => None,
        }
    }
}

/// Applies a changed configuration to a running pair in place: role, epoch and peers
/// are kept (no Init period); a key change alone only swaps the keys.
async fn apply_config(name: &str, run: &mut PairRun, cfg: AgentConfig) {
    if run.revision != cfg.sm.config_revision {
        tracing::info!(pair = %name, revision = cfg.sm.config_revision, "configuration changed");
        // Recorded (and reported as applied) only once the runtime applied it; a failure
        // is reported in the member entry and retried on the next pass.
        match run.handle.reconfigure(cfg.clone()).await {
            Ok(()) => {
                run.revision = cfg.sm.config_revision;
                run.keys = cfg.keys.clone();
                run.key_switch = None;
                run.reporter.set_config(&cfg);
                run.reporter.set_config_error(None, &run.handle.status());
            }
            Err(e) => {
                let msg = format!(
                    "cannot apply revision {}: {e}",
                    havip_crds::revision::format_revision(cfg.sm.config_revision)
                );
                if run.reporter.set_config_error(Some(msg.clone()), &run.handle.status()) {
                    tracing::warn!(pair = %name, error = %msg, "keeping the last applied configuration; retrying");
                }
            }
        }
    } else if run.keys != cfg.keys {
        if run.key_switch.as_ref().is_some_and(|(_, k)| *k == cfg.keys) {
            // Already accepting the new key; it signs once the switch is due.
            if run.key_switch.as_ref().is_some_and(|(at, _)| Instant::now() >= *at) {
                tracing::info!(pair = %name, key_id = cfg.keys.current.id, "signing with the new heartbeat key");
                run.handle.set_keys(cfg.keys.clone()).await;
                run.reporter.set_config(&cfg);
                run.keys = cfg.keys;
                run.key_switch = None;
            }
            return;
        }
        let rotation = cfg.keys.previous.as_ref() == Some(&run.keys.current) && cfg.keys.current != run.keys.current;
        if rotation {
            // A rotation (the old key moved to previous): accept the new key at once but
            // keep signing with the old one for a while, so that a peer whose watch
            // delivers the Secret later does not refuse our heartbeats meanwhile.
            tracing::info!(pair = %name, key_id = cfg.keys.current.id, after = ?KEY_SWITCH_DELAY, "heartbeat key rotated: accepting the new key, signing with it shortly");
            let accepting = Keyring { current: run.keys.current.clone(), previous: Some(cfg.keys.current.clone()) };
            run.handle.set_keys(accepting).await;
            run.key_switch = Some((Instant::now() + KEY_SWITCH_DELAY, cfg.keys));
            return;
        }
        tracing::info!(pair = %name, key_id = cfg.keys.current.id, "heartbeat key changed");
        run.handle.set_keys(cfg.keys.clone()).await;
        run.reporter.set_config(&cfg);
        run.keys = cfg.keys;
        run.key_switch = None;
    }
}

/// The API server has not answered the first lists in time: every pair with a
/// configuration snapshot here that names this node resumes from it. Its Lease
/// writes fail meanwhile, so it acts under the standalone rules; the first
/// successful lists bring it in line (or give it up, if it is gone).
async fn start_from_snapshots(
    client: &Client,
    opts: &KubeAgentOptions,
    metrics: &Arc<AgentMetrics>,
    hub: &Arc<Hub>,
) -> BTreeMap<String, PairRun> {
    let mut running = BTreeMap::new();
    let dir = opts.state_dir.clone();
    let names = snapshot::PairSnapshot::pairs_in(&dir);
    if names.is_empty() {
        tracing::warn!(after = ?OFFLINE_AFTER, "the API server has not answered; no pair to resume from a snapshot");
        return running;
    }
    for name in names {
        let snap = match snapshot::PairSnapshot::load(&dir, &name) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(pair = %name, error = %e, "cannot resume the pair from its snapshot");
                continue;
            }
        };
        if !snap.pair.spec.members.iter().any(|m| m.node == opts.node) {
            continue;
        }
        let ifnames: Vec<String> = snap.pair.spec.heartbeat.paths.iter().filter_map(|x| x.interface.clone()).collect();
        let local_interfaces = interface_addresses(&ifnames).await;
        let nodes: Vec<Arc<k8s_openapi::api::core::v1::Node>> = snap.nodes.iter().cloned().map(Arc::new).collect();
        let secrets: Vec<Arc<k8s_openapi::api::core::v1::Secret>> =
            snap.secrets.iter().cloned().map(Arc::new).collect();
        let fips: Vec<&FloatingIP> = snap.fips.iter().collect();
        let view = ClusterView {
            node: &opts.node,
            namespace: &opts.namespace,
            nodes: &nodes,
            fips: &fips,
            secrets: &secrets,
            local_interfaces: &local_interfaces,
        };
        let cfg = match agent_config(&snap.pair, &view) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(pair = %name, error = %e, "cannot build the pair's configuration from its snapshot");
                continue;
            }
        };
        match start_pair(client, opts, metrics, hub, &snap.pair, cfg).await {
            Ok(mut run) => {
                run.snapshot = Some(snap.digest());
                tracing::warn!(pair = %name, "the API server has not answered: the pair runs on its last applied configuration");
                running.insert(name, run);
            }
            Err(e) => {
                metrics.io_error("pair_start");
                tracing::error!(pair = %name, error = %e, "failed to resume the pair from its snapshot");
            }
        }
    }
    running
}

/// How long after a key rotation reaches it an agent keeps signing with the old key
/// (while accepting both): longer than watch events take to reach every member.
const KEY_SWITCH_DELAY: Duration = Duration::from_secs(2);

async fn start_pair(
    client: &Client,
    opts: &KubeAgentOptions,
    metrics: &Arc<AgentMetrics>,
    hub: &Arc<Hub>,
    pair: &HAPair,
    cfg: AgentConfig,
) -> Result<PairRun, RuntimeError> {
    let name = pair.name_any();
    let (reporter, outlets) = KubeReporter::new(&opts.node, &cfg);
    let reporter = Arc::new(reporter);
    leftovers::check_incarnation(&opts.state_dir, &name, pair.metadata.uid.as_deref()).await;
    let lease = Arc::new(KubeLease::new(Api::namespaced(client.clone(), &opts.namespace), &name));
    let keys = cfg.keys.clone();
    let revision = cfg.sm.config_revision;
    let (handle, task) = runtime::start(
        cfg,
        Options {
            state: StateFile::new(&opts.state_dir, &name),
            lease: Some(lease),
            reporter: reporter.clone(),
            metrics: metrics.pair(&name),
            hub: hub.clone(),
        },
    )
    .await?;
    let aux = report::spawn_writers(client, pair, reporter.clone(), outlets);
    Ok(PairRun {
        revision,
        keys,
        handle,
        task,
        aux,
        reporter,
        lease: LeaseFeed::default(),
        inputs: PairInputs::default(),
        snapshot: None,
        key_switch: None,
    })
}

/// An operation id for the agent's own handover at shutdown (top bit clear).
fn rand_id() -> u64 {
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    havip_crds::revision::fnv1a(&t.to_be_bytes()) & !sm::AUTO_OP_BIT
}

/// This node's address on each of `names` (interfaces of `interface:` heartbeat paths),
/// read from the kernel; see [`pick_path_address`]. Interfaces that do not exist or
/// have no usable address are left out (the pair then waits, saying why).
pub async fn interface_addresses(names: &[String]) -> BTreeMap<String, IpAddr> {
    let mut out = BTreeMap::new();
    if names.is_empty() {
        return out;
    }
    let nl = match crate::netlink::Netlink::new() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read interface addresses for interface heartbeat paths");
            return out;
        }
    };
    let (links, addrs) = match (nl.links().await, nl.addresses().await) {
        (Ok(l), Ok(a)) => (l, a),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(error = %e, "cannot read interface addresses for interface heartbeat paths");
            return out;
        }
    };
    for name in names {
        if let Some(link) = links.iter().find(|l| &l.name == name)
            && let Some(a) = pick_path_address(addrs.iter().filter(|a| a.ifindex == link.index))
        {
            out.insert(name.clone(), a);
        }
    }
    out
}
