//! `havip-agent`: the havip node agent.
//!
//! - `havip-agent standalone --config pair.yaml`: runs one pair member from a local
//!   file, without Kubernetes (the epoch is kept in the state directory).
//! - `havip-agent kubernetes`: the DaemonSet mode (docs/kubernetes.md).
//! - `havip-agent admin …`: talks to a standalone agent through its admin socket.

use clap::{Parser, Subcommand};
use havip_node_agent::admin::{self, AdminRequest};
use havip_node_agent::config::StandaloneFile;
use havip_node_agent::metrics::AgentMetrics;
use havip_node_agent::runtime::{self, LogReporter, Options};
use havip_node_agent::state::StateFile;
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
    /// Run one pair member from a local configuration file (no Kubernetes).
    Standalone {
        /// The pair's configuration file (see docs/standalone.md).
        #[arg(long, env = "HAVIP_CONFIG")]
        config: PathBuf,
        /// This member's node name (overrides `node:` in the file).
        #[arg(long, env = "NODE_NAME")]
        node: Option<String>,
        /// Directory for the persisted state (overrides `stateDir:`).
        #[arg(long, env = "HAVIP_STATE_DIR")]
        state_dir: Option<PathBuf>,
        /// Metrics and health address (overrides `metricsAddress:`); `off` disables it.
        #[arg(long, env = "HAVIP_METRICS_ADDRESS")]
        metrics_address: Option<String>,
        /// Admin socket (overrides `adminSocket:`).
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
        /// Metrics and health address; `off` disables it.
        #[arg(long, env = "HAVIP_METRICS_ADDRESS", default_value = "0.0.0.0:9797")]
        metrics_address: String,
        /// Do not hand the VIPs over before exiting on a cordoned node.
        #[arg(long, env = "HAVIP_NO_HANDOVER_WHEN_CORDONED")]
        no_handover_when_cordoned: bool,
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

#[tokio::main]
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
        Cmd::Kubernetes { node_name, namespace, state_dir, metrics_address, no_handover_when_cordoned } => {
            init_logging(&args.log_format);
            let r = kubernetes(node_name, namespace, state_dir, metrics_address, !no_handover_when_cordoned).await;
            match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "havip-agent failed");
                    eprintln!("havip-agent: {e}");
                    ExitCode::FAILURE
                }
            }
        }
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

async fn standalone(
    config: PathBuf,
    node: Option<String>,
    state_dir: Option<PathBuf>,
    metrics_address: Option<String>,
    admin_socket: Option<PathBuf>,
) -> Result<(), String> {
    let file = StandaloneFile::load(&config).map_err(|e| e.to_string())?;
    let state_dir = state_dir.or(file.state_dir.clone()).unwrap_or_else(|| PathBuf::from("/var/lib/havip"));
    let metrics_address = match metrics_address.as_deref() {
        Some("off") => None,
        Some(a) => Some(a.parse().map_err(|e| format!("--metrics-address {a:?}: {e}"))?),
        None => file.metrics_address.or_else(|| "127.0.0.1:9797".parse().ok()),
    };
    let admin_socket = admin_socket.or(file.admin_socket.clone());
    let cfg = file.into_agent_config(node.as_deref()).map_err(|e| e.to_string())?;
    tracing::info!(pair = %cfg.pair, node = %cfg.node, vips = cfg.vips.len(), paths = ?cfg.paths, "havip-agent starting (standalone)");
    let metrics = Arc::new(AgentMetrics::new());
    let paths = cfg.paths.clone();
    let (handle, task) = runtime::start(
        cfg.clone(),
        Options {
            state: StateFile::new(&state_dir, &cfg.pair),
            lease: None,
            reporter: Arc::new(LogReporter),
            metrics: metrics.clone(),
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let _http = match metrics_address {
        Some(addr) => {
            let ep = Arc::new(Endpoints { metrics, agent: handle.clone() });
            let (bound, t) = havip_crds::httpd::serve(addr, ep)
                .await
                .map_err(|e| format!("failed to serve metrics on {addr}: {e}"))?;
            tracing::info!(address = %bound, "metrics and health endpoints");
            Some(t)
        }
        None => None,
    };
    let _admin = match &admin_socket {
        Some(p) => Some(
            admin::serve(p, handle.clone(), paths)
                .await
                .map_err(|e| format!("failed to open admin socket {}: {e}", p.display()))?,
        ),
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
    handle.stop().await;
    let _ = task.await;
    if let Some(p) = admin_socket {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

async fn kubernetes(
    node: String,
    namespace: String,
    state_dir: PathBuf,
    metrics_address: String,
    handover_when_cordoned: bool,
) -> Result<(), String> {
    let client = kube::Client::try_default().await.map_err(|e| format!("failed to build a Kubernetes client: {e}"))?;
    let metrics = Arc::new(AgentMetrics::new());
    let _http = if metrics_address == "off" {
        None
    } else {
        let addr: std::net::SocketAddr =
            metrics_address.parse().map_err(|e| format!("--metrics-address {metrics_address:?}: {e}"))?;
        let ep = Arc::new(MetricsOnly(metrics.clone()));
        let (bound, t) =
            havip_crds::httpd::serve(addr, ep).await.map_err(|e| format!("failed to serve metrics on {addr}: {e}"))?;
        tracing::info!(address = %bound, "metrics and health endpoints");
        Some(t)
    };
    havip_node_agent::kube::run(
        client,
        havip_node_agent::kube::KubeAgentOptions { node, namespace, state_dir, handover_when_cordoned },
        metrics,
    )
    .await
    .map_err(|e| e.to_string())
}

struct MetricsOnly(Arc<AgentMetrics>);

impl havip_crds::httpd::Endpoints for MetricsOnly {
    fn metrics(&self) -> String {
        self.0.encode()
    }
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

struct Endpoints {
    metrics: Arc<AgentMetrics>,
    agent: runtime::Handle,
}

impl havip_crds::httpd::Endpoints for Endpoints {
    fn metrics(&self) -> String {
        self.metrics.encode()
    }
    fn ready(&self) -> Result<(), String> {
        let st = self.agent.status();
        if st.config_valid { Ok(()) } else { Err("configuration invalid".into()) }
    }
}
