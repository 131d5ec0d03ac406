//! The agent in Kubernetes mode: one [`runtime`] per HAPair that names this node.
//!
//! This module is the loop: it watches HAPairs, FloatingIPs, Nodes, Secrets and Leases
//! into one [`Stores`], and on every change starts, reconfigures or releases the pairs'
//! runtimes and feeds them what the objects say. The rooms around it: [`config`] turns
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

pub use commands::op_id;
pub use config::{
    ClusterView, KeySecretError, PairConfigError, agent_config, key_secret_name, keyring_from_secret, pick_path_address,
};
pub use lease::{KubeLease, lease_name, lease_view};

use crate::config::AgentConfig;
use crate::heartbeat::Hub;
use crate::metrics::AgentMetrics;
use crate::runtime::{self, Handle, Options, Request, RuntimeError};
use crate::sm;
use crate::state::StateFile;
use commands::PairInputs;
use futures::StreamExt;
use havip_crds::wire::Keyring;
use havip_crds::{FloatingIP, HAPair};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use lease::LeaseFeed;
use report::KubeReporter;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
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
    let stores = Stores::spawn(&client, &opts.namespace, &notify);
    // Configure nothing before every watch has listed once: a pair started from a
    // partial view (a peer's Node not seen yet) would restart moments later with another
    // configuration revision.
    tracing::info!("waiting for the initial lists of pairs, FloatingIPs, Nodes, Secrets and Leases");
    let ready = tokio::select! {
        r = stores.wait_until_ready() => Some(r),
        _ = term.recv() => None,
        _ = int.recv() => None,
    };
    let Some(ready) = ready else {
        // Stopped before it ran anything: an uninstall still leaves no VIP behind.
        let agent =
            Agent { client, opts, metrics: metrics.clone(), hub: Hub::new(metrics), stores, running: BTreeMap::new() };
        agent.shutdown().await;
        return Ok(());
    };
    ready?;
    tracing::info!(node = %opts.node, namespace = %opts.namespace, "havip-agent running (kubernetes)");
    // One set of heartbeat sockets for every pair of this node.
    let hub = Hub::new(metrics.clone());
    // Pairs that left this node while the agent was down (deleted, or this node removed
    // from them) left their VIPs and state behind: removed now that the lists succeeded.
    let mut present: std::collections::BTreeSet<String> = stores.pairs_of(&opts.node).into_keys().collect();
    present.extend(stores.unreadable_pairs().into_keys());
    leftovers::remove_gone_pairs(&opts.state_dir, &present).await;
    let mut agent = Agent { client, opts, metrics, hub, stores, running: BTreeMap::new() };
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

/// The agent's view of the cluster: one reflector per kind, each fed by a watch that
/// never gives up. Agents read Leases and Secrets only in the operator namespace.
struct Stores {
    pairs: Store<DeserializeGuard<HAPair>>,
    fips: Store<DeserializeGuard<FloatingIP>>,
    nodes: Store<Node>,
    secrets: Store<Secret>,
    leases: Store<Lease>,
}

impl Stores {
    /// Starts the watches; each change notifies `notify`.
    fn spawn(client: &Client, namespace: &str, notify: &Arc<Notify>) -> Stores {
        Stores {
            pairs: spawn_store(Api::all(client.clone()), notify.clone()),
            fips: spawn_store(Api::all(client.clone()), notify.clone()),
            nodes: spawn_store(Api::all(client.clone()), notify.clone()),
            secrets: spawn_store(Api::namespaced(client.clone(), namespace), notify.clone()),
            leases: spawn_store(Api::namespaced(client.clone(), namespace), notify.clone()),
        }
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

    /// The FloatingIPs naming `pair` (malformed objects are skipped).
    fn fips_of(&self, pair: &str) -> Vec<FloatingIP> {
        self.fips.state().iter().filter_map(|f| f.0.as_ref().ok()).filter(|f| f.spec.pair == pair).cloned().collect()
    }

    /// The pair's Lease as the machine reads it, if the Lease exists.
    fn lease_of(&self, pair: &str) -> Option<(Option<sm::NodeId>, u64)> {
        let name = lease_name(pair);
        self.leases.state().iter().find(|l| l.name_any() == name).map(|l| lease_view(l))
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

/// A reflector store fed by a watcher that never gives up (errors back off and retry).
fn spawn_store<K>(api: Api<K>, notify: Arc<Notify>) -> Store<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => notify.notify_one(),
                Err(e) => tracing::debug!(error = %e, "watch error (retrying)"),
            }
        }
    });
    store
}

/// One pair this agent runs.
struct PairRun {
    revision: u64,
    keys: Keyring,
    handle: Handle,
    task: tokio::task::JoinHandle<()>,
    aux: Vec<tokio::task::JoinHandle<()>>,
    reporter: Arc<KubeReporter>,
    lease: LeaseFeed,
    /// The Lease itself, read directly while a peer cannot be heard.
    lease_store: Arc<KubeLease>,
    inputs: PairInputs,
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
}

impl Agent {
    /// Brings the running pairs in line with the stores.
    async fn reconcile(&mut self) {
        let wanted = self.stores.pairs_of(&self.opts.node);
        let unreadable = self.stores.unreadable_pairs();
        let unreadable_fips = self.stores.unreadable_fips();
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
            if let Some(run) = self.running.remove(&name) {
                tracing::info!(pair = %name, "this node is no longer a member: giving up the pair's VIPs");
                run.handle.release().await;
                run.finish().await;
            }
        }
        let ifnames: Vec<String> =
            wanted.values().flat_map(|p| p.spec.heartbeat.paths.iter().filter_map(|x| x.interface.clone())).collect();
        let local_interfaces = interface_addresses(&ifnames).await;
        let nodes = self.stores.nodes.state();
        let secrets = self.stores.secrets.state();
        let view = ClusterView {
            node: &self.opts.node,
            namespace: &self.opts.namespace,
            nodes: &nodes,
            secrets: &secrets,
            local_interfaces: &local_interfaces,
        };
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
            let cfg = match agent_config(&pair, &self.stores.fips_of(&name), &view) {
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
            run.lease.feed(&run.handle, self.stores.lease_of(&name)).await;
            // While it holds the VIPs and cannot hear a peer, the active reads the Lease
            // itself every pass (about once a second) rather than trusting the watch: a
            // peer that took the pair over is then learnt within a second even if the
            // watch connection went silently stale.
            let st = run.handle.status();
            if st.holds_vips && st.peers.iter().any(|p| p.heard_paths.is_empty()) {
                match tokio::time::timeout(Duration::from_millis(500), run.lease_store.read()).await {
                    Ok(Ok(view)) => run.lease.feed(&run.handle, Some(view)).await,
                    Ok(Err(e)) => tracing::debug!(pair = %name, error = %e, "Lease read failed"),
                    Err(_) => tracing::debug!(pair = %name, "Lease read timed out"),
                }
            }
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
        let cordoned = self.stores.cordoned(&self.opts.node);
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
        let labels = self.stores.node_labels(&self.opts.node)?;
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
        tracing::info!(pair = %name, key_id = cfg.keys.current.id, "heartbeat key changed");
        run.handle.set_keys(cfg.keys.clone()).await;
        run.reporter.set_config(&cfg);
        run.keys = cfg.keys;
    }
}

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
    let lease_store = lease.clone();
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
        lease_store,
        inputs: PairInputs::default(),
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
