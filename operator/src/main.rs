//! `havip-operator`: reconciles HAPair and FloatingIP resources and per-pair Leases.
//!
//! The controllers arrive with the operator issue; today the binary parses its
//! configuration, logs it and exits cleanly on SIGTERM or SIGINT.

use clap::Parser;

/// The havip operator.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Namespace holding the per-pair Leases and heartbeat-key Secrets.
    #[arg(long, env = "HAVIP_NAMESPACE", default_value = "havip-system")]
    namespace: String,
    /// Address of the metrics and health endpoints.
    #[arg(long, env = "HAVIP_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    metrics_address: std::net::SocketAddr,
    /// Log format: `text` or `json`.
    #[arg(long, env = "HAVIP_LOG_FORMAT", default_value = "text")]
    log_format: String,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if args.log_format == "json" {
        tracing_subscriber::fmt().json().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    tracing::info!(namespace = %args.namespace, metrics = %args.metrics_address, "havip-operator starting");
    match shutdown_signal().await {
        Ok(signal) => {
            tracing::info!(signal, "shutting down");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "failed to install signal handlers");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Waits for SIGTERM or SIGINT and names the one that arrived.
async fn shutdown_signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
