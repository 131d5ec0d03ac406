//! `havip-agent`: the havip node agent.
//!
//! - `havip-agent standalone --config pair.yaml [--config other.yaml | --config dir/]`:
//!   runs this node's member of one or more pairs from local files, without Kubernetes
//!   (the epoch is kept in the state directory). One process serves every pair of the
//!   node: the pairs share the heartbeat sockets.
//! - `havip-agent kubernetes`: the DaemonSet mode (docs/kubernetes.md).
//! - `havip-agent admin …`: talks to a standalone agent through its admin socket.
//! - `havip-agent control-plane manifest --node N`: the static pod of the control-plane
//!   mode (the cluster's own API VIP, docs/control-plane.md).
//! - `havip-agent witness --listen ip:port --key-file F`: the optional third party of
//!   standalone pairs, whose vote every takeover needs (docs/standalone.md).
//! - `havip-agent witness-key --key-file F --pair P --member M`: prints the key member M
//!   of pair P signs its witness requests with (each member holds only its own).

use clap::{Parser, Subcommand};
use havip_node_agent::announce::bgp::speaker::{self, SpeakerConfig, SpeakerKind};
use havip_node_agent::standalone::admin::{self, AdminRequest};
use havip_node_agent::standalone::daemon::{self as standalone, DaemonOptions};
use havip_node_agent::witness::daemon::{self as witness, WitnessKeys};
use std::path::PathBuf;
use std::process::ExitCode;

/// The havip node agent.
#[derive(Parser, Debug)]
#[command(name = "havip-agent", version, about)]
struct Args {
    /// Log format: `text` or `json`.
    #[arg(long, env = "HAVIP_LOG_FORMAT", default_value = "text", global = true)]
    log_format: String,
    /// Routed VIPs: the node's BGP speaker the agent asks for its sessions and
    /// advertisements: `auto` (FRR's socket if it exists, else BIRD's), `frr` or `bird`.
    #[arg(long, env = "HAVIP_BGP_SPEAKER", default_value = "auto", global = true)]
    bgp_speaker: String,
    /// FRR's vty directory (its `bgpd.vty` socket).
    #[arg(long, env = "HAVIP_FRR_VTY_DIR", default_value = "/var/run/frr", global = true)]
    frr_vty_dir: PathBuf,
    /// BIRD's control socket.
    #[arg(long, env = "HAVIP_BIRD_SOCKET", default_value = "/run/bird/bird.ctl", global = true)]
    bird_socket: PathBuf,
    /// Routed VIPs' backup paths (HAPair `bgpBackupPaths`): the kernel routing table
    /// they go to, which the node's speaker imports (FRR `ip import-table N`).
    #[arg(long, env = "HAVIP_BGP_BACKUP_TABLE", default_value_t = havip_node_agent::announce::bgp::BACKUP_TABLE,
          value_parser = clap::value_parser!(u32).range(1..=252), global = true)]
    bgp_backup_table: u32,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum ControlPlaneCmd {
    /// Print this node's static pod manifest (for /etc/kubernetes/manifests), after checking
    /// the pair file as this member would read it.
    Manifest {
        /// The control-plane pair's file on the node.
        #[arg(long, default_value = "/etc/havip/control-plane.yaml")]
        config: PathBuf,
        /// This node's member name in the file.
        #[arg(long, env = "NODE_NAME")]
        node: String,
        /// The agent's image.
        #[arg(long, default_value = concat!("ghcr.io/havip/havip-agent:", env!("CARGO_PKG_VERSION")))]
        image: String,
        /// The state directory on the node.
        #[arg(long, default_value = "/var/lib/havip-control-plane")]
        state_dir: PathBuf,
        /// Metrics and health address (host network; the DaemonSet agent has 9797).
        #[arg(long, default_value = "127.0.0.1:9798")]
        metrics_address: String,
    },
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
    /// Check this node for what keeps standalone pairs from working (capabilities,
    /// reverse-path filtering, arp_ignore, a VIP first on its interface, a heartbeat path
    /// silent): each finding with its fix; exit 1 when there is one. In Kubernetes the
    /// agents check their nodes themselves (`kubectl havip doctor`).
    Doctor {
        /// The pair files or directories, as `standalone --config` takes them.
        #[arg(long, env = "HAVIP_CONFIG", required = true, value_delimiter = ',')]
        config: Vec<PathBuf>,
        /// This member's node name (overrides `node:` in the file).
        #[arg(long, env = "NODE_NAME")]
        node: Option<String>,
        /// The running agent's admin socket (overrides `adminSocket:`; a single pair).
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
    /// The control-plane mode: the cluster's own API VIP, held among the control-plane
    /// nodes without the API (docs/control-plane.md).
    ControlPlane {
        #[command(subcommand)]
        command: ControlPlaneCmd,
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
    let kind = match args.bgp_speaker.as_str() {
        "auto" => None,
        "frr" | "FRR" => Some(SpeakerKind::Frr),
        "bird" | "BIRD" => Some(SpeakerKind::Bird),
        other => {
            eprintln!("havip-agent: --bgp-speaker {other}: expected auto, frr or bird");
            return ExitCode::FAILURE;
        }
    };
    speaker::configure(SpeakerConfig {
        kind,
        frr_dir: args.frr_vty_dir.clone(),
        bird_socket: args.bird_socket.clone(),
        backup_table: args.bgp_backup_table,
    });
    match args.command {
        Cmd::Standalone { config, node, state_dir, metrics_address, admin_socket } => {
            init_logging(&args.log_format);
            match standalone::run(DaemonOptions { config, node, state_dir, metrics_address, admin_socket }).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "havip-agent failed");
                    eprintln!("havip-agent: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Doctor { config, node, admin_socket } => {
            match havip_node_agent::standalone::doctor::run(&config, node.as_deref(), admin_socket.as_deref()).await {
                Ok(report) => {
                    print!("{}", havip_node_agent::standalone::doctor::render(&report));
                    if report.findings.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
                }
                Err(e) => {
                    eprintln!("havip-agent doctor: {e}");
                    ExitCode::from(2)
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
            let r = havip_node_agent::kube::daemon::serve(opts, metrics_address).await;
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
            match witness::run(listen, keys, state_dir, metrics_address, max_pairs).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "havip-agent witness failed");
                    eprintln!("havip-agent witness: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::ControlPlane {
            command: ControlPlaneCmd::Manifest { config, node, image, state_dir, metrics_address },
        } => {
            let opts =
                havip_node_agent::controlplane::ManifestOptions { config, node, image, state_dir, metrics_address };
            match havip_node_agent::controlplane::manifest(&opts) {
                Ok(m) => {
                    print!("{m}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("havip-agent control-plane manifest: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::WitnessKey { key_file, pair, member } => match witness::member_key_hex(&key_file, &pair, &member) {
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
