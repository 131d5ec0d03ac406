//! The standalone daemon (`havip-agent standalone`): loads the pair files, sweeps what
//! pairs no longer configured left behind, starts one runtime per pair on a shared
//! heartbeat hub, serves the admin sockets, the witness watch and the metrics endpoint,
//! and stops every pair at SIGTERM/SIGINT without removing the VIPs.

use super::admin;
use super::config::StandaloneFile;
use crate::config::AgentConfig;
use crate::heartbeat::Hub;
use crate::metrics::AgentMetrics;
use crate::runtime::{self, LogReporter, Options};
use crate::state::StateFile;
use crate::witness::WitnessClient;
use std::path::PathBuf;
use std::sync::Arc;

/// Every pair file named by `--config` (directories expand to their `*.yaml`/`*.yml`
/// files, sorted), each loaded.
fn load_pair_files(config: &[PathBuf]) -> Result<Vec<(PathBuf, StandaloneFile)>, String> {
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
    handle: runtime::Handle,
    task: tokio::task::JoinHandle<()>,
    admin: Option<PathBuf>,
    /// Reads the witness's record (pairs with a witness).
    witness_watch: Option<tokio::task::JoinHandle<()>>,
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
        let witness = match &cfg.witness {
            Some(w) => Some(
                WitnessClient::connect(
                    w.address,
                    w.keys.clone(),
                    &cfg.pair,
                    &cfg.node,
                    std::time::Duration::from_millis(cfg.sm.timings.heartbeat_timeout_ms),
                )
                .await
                .map_err(|e| format!("pair {} ({}): {e}", cfg.pair, path.display()))?,
            ),
            None => None,
        };
        let lease = witness.clone().map(|w| w as Arc<dyn runtime::LeaseStore>);
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
        let witness_watch = witness.map(|w| {
            tracing::info!(pair = %cfg.pair, witness = ?cfg.witness.as_ref().map(|x| x.address), "takeovers of this pair need the witness's vote");
            tokio::spawn(w.watch(handle.clone()))
        });
        pairs.push(StandalonePair { pair: cfg.pair.clone(), handle, task, admin, witness_watch });
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
    let sig = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = sig, "shutting down; the VIPs stay where they are");
    for p in &pairs {
        p.handle.stop().await;
    }
    for p in pairs {
        if let Some(w) = p.witness_watch {
            w.abort();
        }
        let _ = p.task.await;
        if let Some(a) = p.admin {
            let _ = std::fs::remove_file(a);
        }
    }
    Ok(())
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
