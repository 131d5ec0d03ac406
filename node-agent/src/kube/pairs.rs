//! The pairs this agent runs: starting one (from the API's view or, while the API
//! server does not answer, from its last snapshot), applying a new configuration, and
//! stopping one.

use super::*;

/// One pair this agent runs.
pub(super) struct PairRun {
    pub(super) revision: u64,
    pub(super) keys: Keyring,
    pub(super) handle: Handle,
    pub(super) task: tokio::task::JoinHandle<()>,
    pub(super) aux: Vec<tokio::task::JoinHandle<()>>,
    pub(super) reporter: Arc<KubeReporter>,
    pub(super) lease: LeaseFeed,
    pub(super) inputs: PairInputs,
    /// Digest of the configuration snapshot last written for this pair.
    pub(super) snapshot: Option<u64>,
    /// A rotated key accepted but not signing yet: when it starts to sign, and the keys.
    pub(super) key_switch: Option<(Instant, Keyring)>,
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

/// Applies a changed configuration to a running pair in place: role, epoch and peers
/// are kept (no Init period); a key change alone only swaps the keys.
pub(super) async fn apply_config(name: &str, run: &mut PairRun, cfg: AgentConfig) {
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
pub(super) async fn start_from_snapshots(
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
pub(super) fn rand_id() -> u64 {
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    havip_crds::revision::fnv1a(&t.to_be_bytes()) & !sm::AUTO_OP_BIT
}
