//! `havip-agent`: the havip node agent.
//!
//! - `havip-agent standalone --config pair.yaml [--config other.yaml | --config dir/]`:
//!   runs this node's member of one or more pairs from local files, without Kubernetes
//!   (the epoch is kept in the state directory). One process serves every pair of the
//!   node: the pairs share the heartbeat sockets.
//! - `havip-agent kubernetes`: the DaemonSet mode (docs/kubernetes.md).
//! - `havip-agent admin …`: talks to a standalone agent through its admin socket.
//! - `havip-agent witness --listen ip:port --key-file F`: the optional third party of
//!   standalone pairs, whose vote every takeover needs (docs/standalone.md).
//! - `havip-agent witness-key --key-file F --pair P --member M`: prints the key member M
//!   of pair P signs its witness requests with (each member holds only its own).

use clap::{Parser, Subcommand};
use havip_node_agent::admin::{self, AdminRequest};
use havip_node_agent::config::StandaloneFile;
use havip_node_agent::heartbeat::Hub;
use havip_node_agent::metrics::AgentMetrics;
use havip_node_agent::runtime::{self, LogReporter, Options};
use havip_node_agent::state::StateFile;
use havip_node_agent::witness::WitnessClient;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// The havip node agent.
#[derive(Parser, Debug)]
#[command(name = "havip-agent", version, about)]
struct Args {
    /// Log format: `text` or `json`.
    #[arg(long, env = "HAVIP_LOG_FORMAT", default_value = "text", global = true)]
    log_format: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run this node's member of one or more pairs from local files (no Kubernetes).
    Standalone {
        /// A pair's configuration file, or a directory whose `*.yaml`/`*.yml` files are
        /// pairs (see docs/standalone.md). Repeat for several pairs; every pair of a node
        /// runs in one agent (two agents never share a heartbeat port).
        #[arg(long, env = "HAVIP_CONFIG", required = true, value_delimiter = ',')]
        config: Vec<PathBuf>,
        /// This member's node name (overrides `node:` in the file).
        #[arg(long, env = "NODE_NAME")]
        node: Option<String>,
        /// Directory for the persisted state (overrides `stateDir:`).
        #[arg(long, env = "HAVIP_STATE_DIR")]
        state_dir: Option<PathBuf>,
        /// Metrics and health address (overrides `metricsAddress:`); `off` disables it.
        #[arg(long, env = "HAVIP_METRICS_ADDRESS")]
        metrics_address: Option<String>,
        /// Admin socket (overrides `adminSocket:`; only with a single pair — with several,
        /// each file names its own).
        #[arg(long, env = "HAVIP_ADMIN_SOCKET")]
        admin_socket: Option<PathBuf>,
    },
    /// Run as the node agent of a Kubernetes cluster (the DaemonSet mode).
    Kubernetes {
        /// This node's name (from the downward API).
        #[arg(long, env = "NODE_NAME")]
        node_name: String,
        /// The operator namespace (pair Leases and key Secrets).
        #[arg(long, env = "HAVIP_NAMESPACE", default_value = "havip-system")]
        namespace: String,
        /// Directory for the persisted state (a hostPath).
        #[arg(long, env = "HAVIP_STATE_DIR", default_value = "/var/lib/havip")]
        state_dir: PathBuf,
        /// Metrics and health address: `IP:PORT`, `[IPv6]:PORT`, or `IPv6:PORT` unbracketed
        /// (the part after the last colon is the port: the chart passes the node's
        /// `status.hostIP` this way); `off` disables it. On the host network,
        /// `0.0.0.0` answers on every address of the node, the VIPs included.
        #[arg(long, env = "HAVIP_METRICS_ADDRESS", default_value = "0.0.0.0:9797")]
        metrics_address: String,
        /// Do not hand the VIPs over before exiting on a cordoned node.
        #[arg(long, env = "HAVIP_NO_HANDOVER_WHEN_CORDONED")]
        no_handover_when_cordoned: bool,
        /// The agent's DaemonSet (in the namespace): on SIGTERM, if it is gone or being
        /// deleted (an uninstall), or no longer selects this node, the agent removes its
        /// VIPs instead of keeping them for its successor. Empty: always keep them.
        #[arg(long, env = "HAVIP_DAEMONSET", default_value = "")]
        daemonset: String,
    },
    /// Run a witness for standalone pairs: it keeps each pair's holder and epoch, and a
    /// standby takes the VIPs only with its vote (docs/standalone.md).
    Witness {
        /// UDP address to listen on.
        #[arg(long, env = "HAVIP_WITNESS_LISTEN", default_value = "0.0.0.0:7947")]
        listen: std::net::SocketAddr,
        /// File holding the witness key (hex, at least 16 bytes).
        #[arg(long, env = "HAVIP_WITNESS_KEY_FILE")]
        key_file: PathBuf,
        /// Id of the key.
        #[arg(long, default_value_t = 1)]
        key_id: u32,
        /// During a rotation: a file holding the previous key, still accepted.
        #[arg(long)]
        previous_key_file: Option<PathBuf>,
        /// Id of the previous key.
        #[arg(long)]
        previous_key_id: Option<u32>,
        /// Directory for the records (holder and epoch of every pair).
        #[arg(long, env = "HAVIP_STATE_DIR", default_value = "/var/lib/havip-witness")]
        state_dir: PathBuf,
        /// Metrics and health address; `off` disables it.
        #[arg(long, env = "HAVIP_METRICS_ADDRESS", default_value = "off")]
        metrics_address: String,
        /// The most pairs it keeps a record for (further pairs are refused).
        #[arg(long, default_value_t = 10_000)]
        max_pairs: usize,
    },
    /// Print the witness key of one member of one pair (hex), derived from the witness key:
    /// put it in that member's `witness.keyFile`. A member key speaks for that member of that
    /// pair only; the witness key itself stays on the witness.
    WitnessKey {
        /// File holding the witness key (hex), as given to `havip-agent witness --key-file`.
        #[arg(long, env = "HAVIP_WITNESS_KEY_FILE")]
        key_file: PathBuf,
        /// The pair (its `pair:` name).
        #[arg(long)]
        pair: String,
        /// The member (its node name).
        #[arg(long)]
        member: String,
    },
    /// Send a command to a standalone agent.
    Admin {
        /// The agent's admin socket.
        #[arg(long, env = "HAVIP_ADMIN_SOCKET", default_value = "/run/havip/admin.sock")]
        socket: PathBuf,
        #[command(subcommand)]
        command: AdminCmd,
    },
}

#[derive(Subcommand, Debug)]
enum AdminCmd {
    /// Planned failover (make-before-break); `--force` skips the readiness checks.
    Failover {
        /// Target member (default: the best ready standby).
        #[arg(long)]
        to: Option<String>,
        /// Skip the readiness checks.
        #[arg(long)]
        force: bool,
    },
    /// Maintenance of this member: `on` or `off`.
    Maintenance {
        /// on or off.
        state: String,
        /// Leave even when nobody can take the VIPs.
        #[arg(long)]
        force: bool,
    },
    /// Clear a flap suspension.
    Clear,
    /// Resume automatic failback after a manual move.
    ResumeFailback,
    /// Pause (`on`) or resume (`off`) automatic policy moves.
    Pause {
        /// on or off.
        state: String,
    },
    /// This member's view of the pair.
    Status,
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if format == "json" {
        tracing_subscriber::fmt().json().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        other => Err(format!("expected on or off, got {other:?}")),
    }
}

// One thread runs every task: the agent's work is small and I/O-bound (heartbeats,
// probes, a state machine step per input), and a single-threaded runtime wakes once per
// event, where a multi-threaded one also wakes a second worker and its I/O driver through
// futexes and eventfds on nearly every event — most of an idle agent's CPU time. Blocking
// work (the L2 listeners) runs on threads of its own.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match args.command {
        Cmd::Standalone { config, node, state_dir, metrics_address, admin_socket } => {
            init_logging(&args.log_format);
            match standalone(config, node, state_dir, metrics_address, admin_socket).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "havip-agent failed");
                    eprintln!("havip-agent: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Kubernetes { node_name, namespace, state_dir, metrics_address, no_handover_when_cordoned, daemonset } => {
            init_logging(&args.log_format);
            let opts = havip_node_agent::kube::KubeAgentOptions {
                node: node_name,
                namespace,
                state_dir,
                handover_when_cordoned: !no_handover_when_cordoned,
                daemonset: Some(daemonset).filter(|d| !d.is_empty()),
            };
            let r = kubernetes(opts, metrics_address).await;
            match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "havip-agent failed");
                    eprintln!("havip-agent: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Witness {
            listen,
            key_file,
            key_id,
            previous_key_file,
            previous_key_id,
            state_dir,
            metrics_address,
            max_pairs,
        } => {
            init_logging(&args.log_format);
            let keys = WitnessKeys { key_file, key_id, previous_key_file, previous_key_id };
            match witness(listen, keys, state_dir, metrics_address, max_pairs).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "havip-agent witness failed");
                    eprintln!("havip-agent witness: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::WitnessKey { key_file, pair, member } => match witness_key(&key_file, &pair, &member) {
            Ok(hex) => {
                println!("{hex}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("havip-agent witness-key: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Admin { socket, command } => {
            let req = match command {
                AdminCmd::Failover { to, force } => Ok(AdminRequest::Failover { to, force }),
                AdminCmd::Maintenance { state, force } => {
                    on_off(&state).map(|on| AdminRequest::Maintenance { on, force })
                }
                AdminCmd::Clear => Ok(AdminRequest::Clear),
                AdminCmd::ResumeFailback => Ok(AdminRequest::ResumeFailback),
                AdminCmd::Pause { state } => on_off(&state).map(|on| AdminRequest::Pause { on }),
                AdminCmd::Status => Ok(AdminRequest::Status),
            };
            let req = match req {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("havip-agent admin: {e}");
                    return ExitCode::from(2);
                }
            };
            match admin::call(&socket, &req).await {
                Ok(reply) => {
                    match &reply.status {
                        Some(s) => println!("{}", serde_json::to_string_pretty(s).unwrap_or_default()),
                        None => println!("{}", reply.message),
                    }
                    if reply.ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
                }
                Err(e) => {
                    eprintln!("havip-agent admin: failed to reach {}: {e}", socket.display());
                    ExitCode::FAILURE
                }
            }
        }
    }
}

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
    cfg: havip_node_agent::config::AgentConfig,
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

struct WitnessKeys {
    key_file: PathBuf,
    key_id: u32,
    previous_key_file: Option<PathBuf>,
    previous_key_id: Option<u32>,
}

async fn witness(
    listen: std::net::SocketAddr,
    keys: WitnessKeys,
    state_dir: PathBuf,
    metrics_address: String,
    max_pairs: usize,
) -> Result<(), String> {
    use havip_node_agent::config::{KeySource, keyring};
    use havip_node_agent::witness::{WitnessMetrics, WitnessOptions, WitnessState, server};
    let previous = match &keys.previous_key_file {
        Some(f) => Some(std::fs::read_to_string(f).map_err(|e| format!("failed to read {}: {e}", f.display()))?),
        None => None,
    };
    let keys = keyring(
        "witness",
        KeySource { key: None, key_file: Some(&keys.key_file) },
        keys.key_id,
        previous.as_deref(),
        keys.previous_key_id,
    )
    .map_err(|e| e.to_string())?;
    let state = WitnessState::new(&state_dir);
    let _lock = state.lock().map_err(|e| e.to_string())?;
    // Refuse a bad state file before binding: a witness that starts empty could grant
    // an epoch twice.
    state.load().map_err(|e| e.to_string())?;
    let sock = server::bind(listen).await.map_err(|e| e.to_string())?;
    let metrics = Arc::new(WitnessMetrics::new());
    let _http = match havip_node_agent::metrics::parse_address(&metrics_address)? {
        None => None,
        Some(addr) => {
            let (bound, t) = havip_endpoints::serve(addr, Arc::new(WitnessEndpoints(metrics.clone())))
                .await
                .map_err(|e| format!("failed to serve metrics on {addr}: {e}"))?;
            tracing::info!(address = %bound, "metrics and health endpoints");
            Some(t)
        }
    };
    tracing::info!(listen = %listen, state = %state.path().display(), max_pairs, "havip witness serving");
    let serve = server::serve(sock, WitnessOptions { keys, state, max_pairs }, metrics);
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    tokio::select! {
        r = serve => r.map_err(|e| e.to_string()),
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    }
}

/// The hex member key of `member` of `pair` under the witness key in `key_file`.
fn witness_key(key_file: &std::path::Path, pair: &str, member: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(key_file).map_err(|e| format!("failed to read {}: {e}", key_file.display()))?;
    let secret = havip_node_agent::config::parse_hex_key(&text).map_err(|e| format!("{}: {e}", key_file.display()))?;
    for (what, name) in [("pair", pair), ("member", member)] {
        if name.is_empty() || name.len() > havip_crds::wire::MAX_NAME {
            return Err(format!("--{what} must have 1 to {} bytes", havip_crds::wire::MAX_NAME));
        }
    }
    let key = havip_crds::witness::member_key(&havip_crds::wire::Key { id: 0, secret }, pair, member);
    Ok(key.secret.iter().map(|b| format!("{b:02x}")).collect())
}

struct WitnessEndpoints(Arc<havip_node_agent::witness::WitnessMetrics>);

impl havip_endpoints::Endpoints for WitnessEndpoints {
    fn metrics(&self) -> String {
        self.0.encode()
    }
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

async fn standalone(
    config: Vec<PathBuf>,
    node: Option<String>,
    state_dir: Option<PathBuf>,
    metrics_address: Option<String>,
    admin_socket: Option<PathBuf>,
) -> Result<(), String> {
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
        Some(a) => havip_node_agent::metrics::parse_address(a).map_err(|e| format!("--metrics-address: {e}"))?,
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
    let mut configured =
        havip_node_agent::standalone::sweep::Configured { sources: config.clone(), ..Default::default() };
    for c in &configs {
        configured.dirs.entry(c.dir.clone()).or_default().insert(c.cfg.pair.clone());
    }
    havip_node_agent::standalone::sweep::sweep(&configured).await;
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
        if let Err(e) = havip_node_agent::standalone::sweep::record_source(&dir, &cfg.pair, &path, &config) {
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

async fn kubernetes(opts: havip_node_agent::kube::KubeAgentOptions, metrics_address: String) -> Result<(), String> {
    let client = kube::Client::try_default().await.map_err(|e| format!("failed to build a Kubernetes client: {e}"))?;
    let metrics = Arc::new(AgentMetrics::new());
    let _http = match havip_node_agent::metrics::parse_address(&metrics_address)? {
        None => None,
        Some(addr) => {
            let ep = Arc::new(MetricsOnly(metrics.clone()));
            let (bound, t) = havip_endpoints::serve(addr, ep)
                .await
                .map_err(|e| format!("failed to serve metrics on {addr}: {e}"))?;
            tracing::info!(address = %bound, "metrics and health endpoints");
            Some(t)
        }
    };
    havip_node_agent::kube::run(client, opts, metrics).await.map_err(|e| e.to_string())
}

struct MetricsOnly(Arc<AgentMetrics>);

impl havip_endpoints::Endpoints for MetricsOnly {
    fn metrics(&self) -> String {
        self.0.encode()
    }
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
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
