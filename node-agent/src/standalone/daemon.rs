//! The standalone daemon (`havip-agent standalone`): loads the pair files, sweeps what
//! pairs no longer configured left behind, starts one runtime per pair on a shared
//! heartbeat hub, serves the admin sockets, the witness watch and the metrics endpoint,
//! applies changed files at SIGHUP or when it sees them change, and stops every pair at
//! SIGTERM/SIGINT without removing the VIPs.

use super::admin;
use super::config::StandaloneFile;
use crate::config::AgentConfig;
use crate::heartbeat::Hub;
use crate::metrics::AgentMetrics;
use crate::quorum::QuorumClient;
use crate::runtime::{self, LogReporter, Options};
use crate::state::StateFile;
use crate::witness::WitnessClient;
use std::path::PathBuf;
use std::sync::Arc;

/// Every pair file named by `--config` (directories expand to their `*.yaml`/`*.yml`
/// files, sorted), each loaded.
pub(crate) fn load_pair_files(config: &[PathBuf]) -> Result<Vec<(PathBuf, StandaloneFile)>, String> {
    let mut files = Vec::new();
    for c in config {
        if c.is_dir() {
            let rd = std::fs::read_dir(c).map_err(|e| format!("failed to read {}: {e}", c.display()))?;
            let mut found: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && matches!(p.extension().and_then(|x| x.to_str()), Some("yaml" | "yml")))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(format!("{} holds no *.yaml or *.yml pair file", c.display()));
            }
            files.extend(found);
        } else {
            files.push(c.clone());
        }
    }
    files.into_iter().map(|f| StandaloneFile::load(&f).map(|file| (f, file)).map_err(|e| e.to_string())).collect()
}

/// One pair file, validated.
struct PairFile {
    path: PathBuf,
    cfg: AgentConfig,
    dir: PathBuf,
    admin: Option<PathBuf>,
}

/// One pair the standalone agent runs.
struct StandalonePair {
    pair: String,
    /// The configuration it runs with (replaced by a reload).
    cfg: AgentConfig,
    dir: PathBuf,
    handle: runtime::Handle,
    task: tokio::task::JoinHandle<()>,
    admin: Option<PathBuf>,
    /// Reads the witness's record (pairs with a witness), or the voters' (quorum pairs).
    witness_watch: Option<tokio::task::JoinHandle<()>>,
    /// This member's voter (quorum pairs).
    voter: Option<Voter>,
}

/// What `havip-agent standalone` was started with.
#[derive(Debug, Clone, Default)]
pub struct DaemonOptions {
    /// The pair files and directories of pair files (`--config`).
    pub config: Vec<PathBuf>,
    /// This node's member name (`--node`; default: the host name).
    pub node: Option<String>,
    /// Overrides every file's `stateDir`.
    pub state_dir: Option<PathBuf>,
    /// Overrides the files' `metricsAddress` (`off` turns the endpoint off).
    pub metrics_address: Option<String>,
    /// One admin socket (only with a single pair).
    pub admin_socket: Option<PathBuf>,
}

/// Runs every configured pair until SIGTERM or SIGINT; the VIPs stay where they are.
pub async fn run(opts: DaemonOptions) -> Result<(), String> {
    let DaemonOptions { config, node, state_dir, metrics_address, admin_socket } = opts;
    let files = load_pair_files(&config)?;
    if admin_socket.is_some() && files.len() > 1 {
        return Err(
            "--admin-socket names one socket but several pairs are configured: set adminSocket in each pair's file"
                .into(),
        );
    }
    // Process-wide settings: the files that set them must agree.
    let mut file_metrics: Option<(std::net::SocketAddr, &PathBuf)> = None;
    for (path, f) in &files {
        if let Some(a) = f.metrics_address {
            match file_metrics {
                Some((b, other)) if b != a => {
                    return Err(format!(
                        "metricsAddress differs between {} ({b}) and {} ({a}): one agent serves one metrics endpoint",
                        other.display(),
                        path.display()
                    ));
                }
                _ => file_metrics = Some((a, path)),
            }
        }
    }
    let metrics_address = match metrics_address.as_deref() {
        Some(a) => crate::metrics::parse_address(a).map_err(|e| format!("--metrics-address: {e}"))?,
        None => file_metrics.map(|(a, _)| a).or_else(|| "127.0.0.1:9797".parse().ok()),
    };
    let mut configs: Vec<PairFile> = Vec::new();
    for (path, f) in files {
        let dir = state_dir.clone().or(f.state_dir.clone()).unwrap_or_else(|| PathBuf::from("/var/lib/havip"));
        let admin = admin_socket.clone().or(f.admin_socket.clone());
        let cfg = f.into_agent_config(node.as_deref()).map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some(other) = configs.iter().find(|c| c.cfg.pair == cfg.pair) {
            return Err(format!(
                "pair {} is configured twice: {} and {}",
                cfg.pair,
                other.path.display(),
                path.display()
            ));
        }
        if let Some(a) = &admin
            && configs.iter().any(|c| c.admin.as_ref() == Some(a))
        {
            return Err(format!("adminSocket {} is named by two pairs: give each pair its own", a.display()));
        }
        configs.push(PairFile { path, cfg, dir, admin });
    }
    // What pairs that are no longer configured left behind (VIPs, drain tables), before
    // any pair starts.
    let mut configured = super::sweep::Configured { sources: config.clone(), ..Default::default() };
    for c in &configs {
        configured.dirs.entry(c.dir.clone()).or_default().insert(c.cfg.pair.clone());
    }
    super::sweep::sweep(&configured).await;
    let metrics = Arc::new(AgentMetrics::new());
    let hub = Hub::new(metrics.clone());
    let mut pairs: Vec<StandalonePair> = Vec::new();
    for PairFile { path, cfg, dir, admin } in configs {
        tracing::info!(file = %path.display(), pair = %cfg.pair, node = %cfg.node, vips = cfg.vips.len(), paths = ?cfg.paths, "havip-agent starting a pair (standalone)");
        let paths = cfg.paths.clone();
        let voter = match &cfg.quorum {
            Some(q) => Some(
                start_voter(q, &dir, &cfg.pair)
                    .await
                    .map_err(|e| format!("pair {} ({}): {e}", cfg.pair, path.display()))?,
            ),
            None => None,
        };
        let arbiter =
            Arbiter::connect(&cfg).await.map_err(|e| format!("pair {} ({}): {e}", cfg.pair, path.display()))?;
        let lease = arbiter.store();
        let (handle, task) = runtime::start(
            cfg.clone(),
            Options {
                state: StateFile::new(&dir, &cfg.pair),
                lease,
                reporter: Arc::new(LogReporter),
                metrics: metrics.pair(&cfg.pair),
                hub: hub.clone(),
            },
        )
        .await
        .map_err(|e| format!("pair {} ({}): {e}", cfg.pair, path.display()))?;
        if let Err(e) = super::sweep::record_source(&dir, &cfg.pair, &path, &config) {
            tracing::warn!(pair = %cfg.pair, error = %e, "cannot record which file configures the pair (a later start cannot sweep it if it is removed)");
        }
        if let Some(p) = &admin {
            admin::serve(p, handle.clone(), paths)
                .await
                .map_err(|e| format!("failed to open admin socket {}: {e}", p.display()))?;
        }
        let witness_watch = arbiter.watch(&cfg, &handle);
        pairs.push(StandalonePair { pair: cfg.pair.clone(), cfg, dir, handle, task, admin, witness_watch, voter });
    }
    let _http = match metrics_address {
        Some(addr) => {
            let ep = Arc::new(Endpoints {
                metrics,
                agents: pairs.iter().map(|p| (p.pair.clone(), p.handle.clone())).collect(),
            });
            let (bound, t) = havip_endpoints::serve(addr, ep)
                .await
                .map_err(|e| format!("failed to serve metrics on {addr}: {e}"))?;
            tracing::info!(address = %bound, "metrics and health endpoints");
            Some(t)
        }
        None => None,
    };
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
    let sources = Sources { config, node, state_dir, admin_socket };
    // The files are also watched: a change (seen within FILE_CHECK) reloads as SIGHUP does —
    // a static pod's mounted file can be edited without a signal.
    let mut seen = files_stamp(&sources.config);
    let mut check = tokio::time::interval(FILE_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let sig = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = hup.recv() => {
                seen = files_stamp(&sources.config);
                reload(&mut pairs, &sources, "SIGHUP").await;
            }
            _ = check.tick() => {
                let now = files_stamp(&sources.config);
                if now != seen {
                    seen = now;
                    reload(&mut pairs, &sources, "a pair file changed").await;
                }
            }
        }
    };
    tracing::info!(signal = sig, "shutting down; the VIPs stay where they are");
    for p in &pairs {
        p.handle.stop().await;
    }
    for p in pairs {
        if let Some(w) = p.witness_watch {
            w.abort();
        }
        if let Some(v) = p.voter {
            v.task.abort();
        }
        let _ = p.task.await;
        if let Some(a) = p.admin {
            let _ = std::fs::remove_file(a);
        }
    }
    Ok(())
}

/// How often the pair files are checked for changes.
const FILE_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// A file's inode, size and modification time (`None`: it cannot be read).
type FileStamp = Option<(u64, u64, std::time::SystemTime)>;

/// Every pair file's path and [`FileStamp`] (directories expanded): a change of any is a
/// reason to read them again.
fn files_stamp(config: &[PathBuf]) -> Vec<(PathBuf, FileStamp)> {
    let mut paths = Vec::new();
    for c in config {
        match std::fs::read_dir(c) {
            Ok(rd) => {
                let mut found: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
                found.sort();
                paths.extend(found);
            }
            Err(_) => paths.push(c.clone()),
        }
    }
    paths
        .into_iter()
        .map(|p| {
            let m = crate::probes::https::stamp(&p);
            (p, m)
        })
        .collect()
}

/// What the files are read from again at a reload.
struct Sources {
    config: Vec<PathBuf>,
    node: Option<String>,
    state_dir: Option<PathBuf>,
    admin_socket: Option<PathBuf>,
}

/// What arbitrates a pair's takeovers: nothing, a witness, or the members' voters.
enum Arbiter {
    None,
    Witness(Arc<WitnessClient>),
    Quorum(Arc<QuorumClient>),
}

impl Arbiter {
    async fn connect(cfg: &AgentConfig) -> Result<Arbiter, String> {
        let timeout = std::time::Duration::from_millis(cfg.sm.timings.heartbeat_timeout_ms);
        if let Some(w) = &cfg.witness {
            let c = WitnessClient::connect(w.address, w.keys.clone(), &cfg.pair, &cfg.node, timeout)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(Arbiter::Witness(c));
        }
        if let Some(q) = &cfg.quorum {
            if q.voters.len() == 2 {
                tracing::warn!(pair = %cfg.pair, "two voting members: both are needed — losing either stops takeovers and the holder gives the VIPs up (as a two-member etcd stops); add a third member, or use a witness for a pair that stays at two");
            }
            let c = QuorumClient::connect(q, &cfg.pair, &cfg.node, timeout).await.map_err(|e| e.to_string())?;
            return Ok(Arbiter::Quorum(c));
        }
        Ok(Arbiter::None)
    }

    fn store(&self) -> Option<Arc<dyn runtime::LeaseStore>> {
        match self {
            Arbiter::None => None,
            Arbiter::Witness(w) => Some(w.clone()),
            Arbiter::Quorum(q) => Some(q.clone()),
        }
    }

    /// Starts reading the record into the machine.
    fn watch(self, cfg: &AgentConfig, handle: &runtime::Handle) -> Option<tokio::task::JoinHandle<()>> {
        match self {
            Arbiter::None => None,
            Arbiter::Witness(w) => {
                tracing::info!(pair = %cfg.pair, witness = ?cfg.witness.as_ref().map(|x| x.address), "takeovers of this pair need the witness's vote");
                Some(tokio::spawn(w.watch(handle.clone())))
            }
            Arbiter::Quorum(q) => {
                if let Some(c) = &cfg.quorum {
                    tracing::info!(pair = %cfg.pair, voters = c.voters.len(), majority = c.majority(), lease = ?c.lease,
                        "takeovers of this pair need a majority of the members' votes, and a holder without one gives the VIPs up");
                }
                Some(tokio::spawn(q.watch(handle.clone())))
            }
        }
    }
}

/// SIGHUP, or a pair file changed: reads every pair file again and applies what changed to the running pairs,
/// without a restart (role, epoch and VIPs stay; see docs/standalone.md, "Reloading").
/// Nothing is applied unless every file is valid and every change can be applied.
async fn reload(pairs: &mut [StandalonePair], src: &Sources, why: &str) {
    tracing::info!(config = ?src.config, why, "reading the pair files again");
    let refuse = |why: String| {
        tracing::warn!(error = %why, "reload refused: the running configuration stays");
    };
    let files = match load_pair_files(&src.config) {
        Ok(f) => f,
        Err(e) => return refuse(e),
    };
    let mut next: Vec<PairFile> = Vec::new();
    for (path, f) in files {
        let dir = src.state_dir.clone().or(f.state_dir.clone()).unwrap_or_else(|| PathBuf::from("/var/lib/havip"));
        let admin = src.admin_socket.clone().or(f.admin_socket.clone());
        match f.into_agent_config(src.node.as_deref()) {
            Ok(cfg) => next.push(PairFile { path, cfg, dir, admin }),
            Err(e) => return refuse(format!("{}: {e}", path.display())),
        }
    }
    let mut running: Vec<&str> = pairs.iter().map(|p| p.pair.as_str()).collect();
    let mut configured: Vec<&str> = next.iter().map(|n| n.cfg.pair.as_str()).collect();
    running.sort_unstable();
    configured.sort_unstable();
    if running != configured {
        return refuse(format!(
            "the files configure pairs {configured:?}, the agent runs {running:?}: restart the agent to start or stop a pair"
        ));
    }
    for n in &next {
        if let Some(p) = pairs.iter().find(|p| p.pair == n.cfg.pair)
            && let Err(why) = reload_allowed(p, n)
        {
            return refuse(format!("pair {} ({}): {why}", n.cfg.pair, n.path.display()));
        }
    }
    for n in next {
        if let Some(p) = pairs.iter_mut().find(|p| p.pair == n.cfg.pair) {
            apply(p, n.cfg).await;
        }
    }
}

/// Whether a pair's new configuration can be applied to the running one.
fn reload_allowed(p: &StandalonePair, n: &PairFile) -> Result<(), String> {
    if p.dir != n.dir || p.admin != n.admin {
        return Err("stateDir and adminSocket take effect at a restart".to_owned());
    }
    let kind = |c: &AgentConfig| (c.witness.is_some(), c.quorum.is_some());
    if kind(&p.cfg) != kind(&n.cfg) {
        return Err("switching between a witness, a quorum and neither takes a restart of every member".to_owned());
    }
    if let (Some(old), Some(new)) = (&p.cfg.quorum, &n.cfg.quorum) {
        let names = |q: &crate::config::QuorumConfig| -> std::collections::BTreeSet<String> {
            q.voters.iter().map(|(v, _)| v.clone()).collect()
        };
        let (a, b) = (names(old), names(new));
        let changed = a.symmetric_difference(&b).count();
        if changed > 1 {
            return Err(format!(
                "the voters change by {changed} members ({a:?} → {b:?}): add or remove one member per reload — only then \
                 does every majority of the old members share a voter with every majority of the new ones while the \
                 members' files differ"
            ));
        }
    }
    Ok(())
}

/// Applies a pair's new configuration: the runtime reconfigures in place; the heartbeat
/// keys, this member's voter and the arbiter's client follow where they changed.
async fn apply(p: &mut StandalonePair, cfg: AgentConfig) {
    let arbiter_changed = p.cfg.witness != cfg.witness || p.cfg.quorum != cfg.quorum;
    if p.cfg.sm.config_revision == cfg.sm.config_revision && p.cfg.keys == cfg.keys && !arbiter_changed {
        tracing::info!(pair = %p.pair, "unchanged");
        return;
    }
    // Connected before anything changes: a failure leaves the pair as it was.
    let arbiter = if arbiter_changed {
        match Arbiter::connect(&cfg).await {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!(pair = %p.pair, error = %e, "reload refused: the running configuration stays");
                return;
            }
        }
    } else {
        None
    };
    if let Err(e) = p.handle.reconfigure(cfg.clone()).await {
        tracing::warn!(pair = %p.pair, error = %e, "reload refused: the running configuration stays");
        return;
    }
    if p.cfg.keys != cfg.keys {
        p.handle.set_keys(cfg.keys.clone()).await;
    }
    let voter_changed = match (&p.cfg.quorum, &cfg.quorum) {
        (Some(a), Some(b)) => a.listen != b.listen || a.keys != b.keys,
        (a, b) => a.is_some() != b.is_some(),
    };
    if voter_changed {
        if let Some(Voter { task, _lock }) = p.voter.take() {
            task.abort();
            let _ = task.await;
            drop(_lock);
        }
        if let Some(q) = &cfg.quorum {
            match start_voter(q, &p.dir, &p.pair).await {
                Ok(v) => p.voter = Some(v),
                Err(e) => {
                    tracing::warn!(pair = %p.pair, error = %e, "the quorum voter did not start again: this member's vote is missing")
                }
            }
        }
    }
    if let Some(a) = arbiter {
        p.handle.set_lease(a.store()).await;
        if let Some(w) = p.witness_watch.take() {
            w.abort();
        }
        p.witness_watch = a.watch(&cfg, &p.handle);
    }
    tracing::info!(pair = %p.pair, revision = cfg.sm.config_revision, members = cfg.sm.members.len(), "reloaded");
    p.cfg = cfg;
}

/// This member's voter of a quorum pair: the witness protocol's server on its address,
/// with its records in `<stateDir>/<pair>.quorum/` (locked: one voter per pair and node).
struct Voter {
    task: tokio::task::JoinHandle<()>,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

async fn start_voter(q: &crate::config::QuorumConfig, dir: &std::path::Path, pair: &str) -> Result<Voter, String> {
    use crate::witness::{WitnessMetrics, WitnessOptions, WitnessState, server};
    let state = WitnessState::new(&dir.join(format!("{pair}.quorum")));
    let lock = state.lock().map_err(|e| e.to_string())?;
    // A voter that started empty after losing its records could grant an epoch twice.
    state.load().map_err(|e| e.to_string())?;
    let sock = server::bind(q.listen).await.map_err(|e| format!("the quorum voter: {e}"))?;
    tracing::info!(pair, listen = %q.listen, state = %state.path().display(), "quorum voter serving");
    let opts = WitnessOptions { keys: q.keys.clone(), state, max_pairs: 1 };
    let pair = pair.to_owned();
    let task = tokio::spawn(async move {
        if let Err(e) = server::serve(sock, opts, Arc::new(WitnessMetrics::new())).await {
            tracing::error!(pair = %pair, error = %e, "the quorum voter stopped: this member's vote is missing");
        }
    });
    Ok(Voter { task, _lock: lock })
}

struct Endpoints {
    metrics: Arc<AgentMetrics>,
    agents: Vec<(String, runtime::Handle)>,
}

impl havip_endpoints::Endpoints for Endpoints {
    fn metrics(&self) -> String {
        self.metrics.encode()
    }
    fn ready(&self) -> Result<(), String> {
        let invalid: Vec<String> =
            self.agents.iter().filter(|(_, a)| !a.status().config_valid).map(|(pair, _)| pair.clone()).collect();
        if invalid.is_empty() { Ok(()) } else { Err(format!("configuration invalid: {}", invalid.join(", "))) }
    }
}
