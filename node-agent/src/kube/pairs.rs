//! The pairs this agent runs: starting one (from the API's view or, while the API
//! server does not answer, from its last snapshot), applying a new configuration, and
//! stopping one.

use super::config::{ClusterView, agent_config};
use super::interfaces::interface_addresses;
use super::lease::KubeLease;
use super::options::{KubeAgentOptions, OFFLINE_AFTER};
use super::plan::{Memory, RunMemory};
use super::report::{self, KubeReporter};
use super::{leftovers, snapshot};
use crate::config::AgentConfig;
use crate::heartbeat::Hub;
use crate::metrics::AgentMetrics;
use crate::runtime::{self, Handle, Options, RuntimeError};
use crate::sm;
use crate::state::StateFile;
use havip_crds::{FloatingIP, HAPair};
use kube::api::Api;
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// One pair this agent runs: its runtime and writers (what the loop remembers of it
/// for its decisions is in [`super::plan::RunMemory`]).
pub(super) struct PairRun {
    pub(super) handle: Handle,
    pub(super) task: tokio::task::JoinHandle<()>,
    pub(super) aux: Vec<tokio::task::JoinHandle<()>>,
    pub(super) reporter: Arc<KubeReporter>,
}

impl PairRun {
    /// Waits (up to 5 s) for the runtime to finish, then stops the writers.
    pub(super) async fn finish(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        for t in self.aux {
            t.abort();
        }
    }
}

/// The API server has not answered the first lists in time: every pair with a
/// configuration snapshot here that names this node resumes from it. Its Lease
/// writes fail meanwhile, so it acts under the standalone rules; the first
/// successful lists bring it in line (or give it up, if it is gone).
pub(super) async fn start_from_snapshots(
    client: &Client,
    opts: &KubeAgentOptions,
    metrics: &Arc<AgentMetrics>,
    hub: &Arc<Hub>,
) -> (BTreeMap<String, PairRun>, Memory) {
    let mut running = BTreeMap::new();
    let mut memory = Memory::default();
    let dir = opts.state_dir.clone();
    let names = snapshot::PairSnapshot::pairs_in(&dir);
    if names.is_empty() {
        tracing::warn!(after = ?OFFLINE_AFTER, "the API server has not answered; no pair to resume from a snapshot");
        return (running, memory);
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
        let mut remembered = RunMemory::started(&cfg, snap.pair.metadata.uid.clone());
        remembered.snapshot = Some(snap.digest());
        match start_pair(client, opts, metrics, hub, &snap.pair, cfg).await {
            Ok(run) => {
                memory.running.insert(name.clone(), remembered);
                tracing::warn!(pair = %name, "the API server has not answered: the pair runs on its last applied configuration");
                running.insert(name, run);
            }
            Err(e) => {
                metrics.io_error("pair_start");
                tracing::error!(pair = %name, error = %e, "failed to resume the pair from its snapshot");
            }
        }
    }
    (running, memory)
}

pub(super) async fn start_pair(
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
    Ok(PairRun { handle, task, aux, reporter })
}

/// An operation id for the agent's own handover at shutdown (top bit clear).
pub(super) fn rand_id() -> u64 {
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    havip_crds::revision::fnv1a(&t.to_be_bytes()) & !sm::AUTO_OP_BIT
}
