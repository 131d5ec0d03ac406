//! The agent in Kubernetes mode: one [`crate::runtime`] per HAPair that names this node.
//!
//! This module is the loop: it watches this node's HAPairs, FloatingIPs, key Secrets and
//! pair Leases (selected by its member label, see [`havip_crds::membership`]) and its own
//! Node into stores (`watches.rs`), and on every change runs one pass (`pass.rs`):
//! observe the stores and the runtimes, decide with the pure `plan.rs` (start,
//! reconfigure or release the pairs' runtimes, switch keys, save snapshots, feed the
//! Lease, maintenance, pause and the operator's commands — each rule with its table
//! test, and a property test that planning again after applying plans nothing), then
//! apply, which only executes. Until the operator has labelled every object of this
//! node's pairs (the first start after an upgrade from a release without member labels),
//! it watches every object of those kinds, as before.
//!
//! The rooms around it: `config.rs` turns the objects into an agent configuration
//! (pure), `lease.rs` is the fencing record's compare-and-swap, `report.rs` writes the
//! member entry, the FloatingIP status and the Events, `commands.rs` hands an operator
//! command to the machine, `departure.rs` decides at SIGTERM whether this is an
//! uninstall, `snapshot.rs` keeps what a restart without the API server resumes from,
//! `pairs.rs` starts and stops runtimes, [`daemon`] is the process. See
//! docs/kubernetes.md for the contract.
//!
//! When the API server is unreachable the pair runtimes keep running on the last
//! configuration: the compare-and-swap times out (200 ms) and the standalone rules
//! apply; the Lease and the status catch up when the API server answers again.

mod commands;
mod config;
pub mod daemon;
mod departure;
mod interfaces;
mod lease;
mod leftovers;
mod options;
mod pairs;
mod pass;
mod plan;
mod report;
mod resume;
mod snapshot;
mod watches;

use options::OFFLINE_AFTER;
use pairs::{PairRun, rand_id, start_from_snapshots};
use plan::Memory;
use watches::{Stores, Watches};

pub use crate::lease::LeaseSnapshot;
pub use commands::op_id;
pub use config::{
    ClusterView, KeySecretError, PairConfigError, agent_config, key_secret_name, keyring_from_secret,
    pick_path_address, skipped_floating_ips,
};
pub use interfaces::interface_addresses;
pub use lease::{KubeLease, lease_name, lease_view};
pub use options::{KubeAgentError, KubeAgentOptions};

use crate::heartbeat::Hub;
use crate::metrics::AgentMetrics;
use crate::runtime::Request;
use crate::sm;
use havip_crds::HAPair;
use havip_crds::membership;
use kube::api::Api;
use kube::api::ListParams;
use kube::core::DeserializeGuard;
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Runs the Kubernetes mode until SIGTERM/SIGINT.
pub async fn run(client: Client, opts: KubeAgentOptions, metrics: Arc<AgentMetrics>) -> Result<(), KubeAgentError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(KubeAgentError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(KubeAgentError::Signals)?;
    let notify = Arc::new(Notify::new());
    let own = Watches::own(&client, &opts.namespace, &opts.node, &notify, &metrics);
    // From the start: an uninstall may revoke this agent's token before its SIGTERM, and
    // then only what this watch saw tells an uninstall from a rolling update.
    let daemonset =
        opts.daemonset.as_deref().map(|d| departure::DaemonSetWatch::start(client.clone(), &opts.namespace, d));
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
    let (started, running, mut memory) = {
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
        let mut resumed: Option<(BTreeMap<String, PairRun>, Memory)> = None;
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
        let (running, memory) = resumed.unwrap_or_default();
        (started, running, memory)
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
            memory,
            daemonset,
        };
        agent.shutdown().await;
        return Ok(());
    };
    let every = started?;
    tracing::info!(node = %opts.node, namespace = %opts.namespace, "havip-agent running (kubernetes)");
    memory.watching_every = every.is_some();
    let stores = Stores { own, every, notify: notify.clone() };
    let mut agent = Agent { client, opts, metrics, hub, stores, running, memory, daemonset };
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

/// The loop's state: the stores and the pairs running.
struct Agent {
    client: Client,
    opts: KubeAgentOptions,
    metrics: Arc<AgentMetrics>,
    hub: Arc<Hub>,
    stores: Stores,
    /// The runtimes of the pairs running.
    running: BTreeMap<String, PairRun>,
    /// What the loop remembers for its decisions ([`plan`]).
    memory: Memory,
    /// The watch of the agent's own DaemonSet (when it is named).
    daemonset: Option<departure::DaemonSetWatch>,
}

impl Agent {
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
    /// node ([`departure::decide`]). A read that fails is no evidence: the VIPs stay
    /// unless the agent's watch saw the DaemonSet deleted (they are never dropped on a
    /// guess).
    async fn leaving(&self) -> Option<String> {
        let name = self.opts.daemonset.as_deref()?;
        let api: Api<k8s_openapi::api::apps::v1::DaemonSet> =
            Api::namespaced(self.client.clone(), &self.opts.namespace);
        let read = match tokio::time::timeout(Duration::from_secs(5), api.get_opt(name)).await {
            Ok(Ok(Some(ds))) => {
                let selector = ds.spec.template.spec.as_ref().and_then(|p| p.node_selector.as_ref());
                let selects_node =
                    self.stores.own.node_labels(&self.opts.node).map(|labels| departure::selects(selector, &labels));
                departure::DaemonSetRead::Found { deleting: ds.metadata.deletion_timestamp.is_some(), selects_node }
            }
            Ok(Ok(None)) => departure::DaemonSetRead::NotFound,
            Ok(Err(e)) => departure::DaemonSetRead::Failed(e.to_string()),
            Err(_) => departure::DaemonSetRead::Failed("no answer within 5 s".to_owned()),
        };
        let watched = self.daemonset.as_ref().map(departure::DaemonSetWatch::seen).unwrap_or_default();
        match departure::decide(name, &read, watched) {
            departure::Departure::Uninstall(why) => Some(why),
            departure::Departure::Stay { warning } => {
                if let Some(w) = warning {
                    tracing::warn!(daemonset = %name, "{w}");
                }
                None
            }
        }
    }
}
