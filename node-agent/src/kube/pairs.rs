//! The pairs this agent runs: starting one (from the API's view or, while the API
//! server does not answer, from its last snapshot), applying a new configuration, and
//! stopping one.

use super::interfaces::interface_addresses;
use super::lease::KubeLease;
use super::options::{KubeAgentOptions, OFFLINE_AFTER};
use super::plan::Memory;
use super::report::{self, KubeReporter};
use super::resume::{self, Resume};
use super::{leftovers, snapshot};
use crate::config::AgentConfig;
use crate::heartbeat::Hub;
use crate::metrics::AgentMetrics;
use crate::runtime::{self, Handle, Options, RuntimeError};
use crate::sm;
use crate::state::StateFile;
use havip_crds::HAPair;
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
    // Observe: the snapshots, and this node's addresses on the interfaces they name.
    let loaded: Vec<_> = names.into_iter().map(|n| (n.clone(), snapshot::PairSnapshot::load(&dir, &n))).collect();
    let local_interfaces = interface_addresses(&resume::interfaces_named(&loaded)).await;
    // Plan (pure), then apply.
    for decision in resume::resume(&opts.node, &opts.namespace, loaded, &local_interfaces) {
        match decision {
            Resume::Start { name, pair, cfg, memory: remembered } => {
                match start_pair(client, opts, metrics, hub, &pair, *cfg).await {
                    Ok(run) => {
                        memory.running.insert(name.clone(), *remembered);
                        tracing::warn!(pair = %name, "the API server has not answered: the pair runs on its last applied configuration");
                        running.insert(name, run);
                    }
                    Err(e) => {
                        metrics.io_error("pair_start");
                        tracing::error!(pair = %name, error = %e, "failed to resume the pair from its snapshot");
                    }
                }
            }
            Resume::NotAMember { name } => {
                tracing::debug!(pair = %name, "the snapshot's pair does not name this node: not resumed");
            }
            Resume::Refused { name, why } => {
                tracing::warn!(pair = %name, error = %why, "cannot resume the pair from its snapshot");
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
    let mut aux = report::spawn_writers(client, pair, reporter.clone(), outlets);
    aux.push(report::spawn_doctor(handle.clone(), reporter.clone()));
    Ok(PairRun { handle, task, aux, reporter })
}

/// An operation id for the agent's own handover at shutdown (top bit clear).
pub(super) fn rand_id() -> u64 {
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    havip_crds::revision::fnv1a(&t.to_be_bytes()) & !sm::AUTO_OP_BIT
}
