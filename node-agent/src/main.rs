//! `havip-agent`: the node agent.
//!
//! The data plane arrives with the node-agent issue; today the binary parses its
//! configuration, logs it and exits cleanly on SIGTERM or SIGINT.

use clap::Parser;

/// The havip node agent.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// This node's name (from the downward API in Kubernetes).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Directory for the agent's persisted state (epoch, maintenance).
    #[arg(long, env = "HAVIP_STATE_DIR", default_value = "/var/lib/havip")]
    state_dir: std::path::PathBuf,
    /// Address of the metrics and health endpoints.
    #[arg(long, env = "HAVIP_METRICS_ADDRESS", default_value = "0.0.0.0:9797")]
    metrics_address: std::net::SocketAddr,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    tracing::info!(node = %args.node_name, state_dir = %args.state_dir.display(), metrics = %args.metrics_address, "havip-agent starting");
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "failed to install signal handlers");
            return std::process::ExitCode::FAILURE;
        }
    };
    let signal = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal, "shutting down");
    std::process::ExitCode::SUCCESS
}
