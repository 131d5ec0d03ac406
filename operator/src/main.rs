//! `havip-operator`: reconciles HAPair and FloatingIP resources, the pair Leases and
//! key Secrets, and writes the pairs' status. Replicas elect a leader on a Lease; only
//! the leader runs the controllers.

use clap::Parser;
use havip_operator::leader::{self, LeaderConfig};
use havip_operator::metrics::Metrics;
use havip_operator::{Error, Settings, controller};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Log output format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn duration(s: &str) -> Result<Duration, String> {
    havip_crds::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// The havip operator.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Namespace holding the per-pair Leases, heartbeat-key Secrets and the
    /// leader-election Lease.
    #[arg(long, env = "HAVIP_NAMESPACE", default_value = "havip-system")]
    namespace: String,
    /// Address of the metrics and health endpoints (`/metrics`, `/healthz`, `/readyz`).
    #[arg(long, env = "HAVIP_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    metrics_address: std::net::SocketAddr,
    /// Log format.
    #[arg(long, env = "HAVIP_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Kubeconfig file; empty: KUBECONFIG, ~/.kube/config or the in-cluster config.
    #[arg(long, env = "HAVIP_KUBECONFIG", default_value = "")]
    kubeconfig: String,
    /// Name of the leader-election Lease (never `hapair-…`: that prefix is the pair
    /// Leases', which the agents may write).
    #[arg(long, env = "HAVIP_LEADER_ELECTION_LEASE", default_value = "havip-operator")]
    leader_election_lease: String,
    /// How long a leader that stopped renewing keeps the Lease.
    #[arg(long, env = "HAVIP_LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    leader_election_lease_duration: Duration,
    /// How often the leader renews the Lease.
    #[arg(long, env = "HAVIP_LEADER_ELECTION_RENEW_INTERVAL", default_value = "2s", value_parser = duration)]
    leader_election_renew_interval: Duration,
    /// The leader stops reconciling when it could not renew for this long (must be
    /// shorter than the lease duration).
    #[arg(long, env = "HAVIP_LEADER_ELECTION_RENEW_DEADLINE", default_value = "10s", value_parser = duration)]
    leader_election_renew_deadline: Duration,
    /// This replica's identity in the Lease and in Events (the chart passes the pod
    /// name through the downward API); empty: `<hostname>-<pid>`.
    #[arg(long, env = "POD_NAME", default_value = "")]
    identity: String,
    /// Every pair is reconciled at least this often (stale members, timeouts).
    #[arg(long, env = "HAVIP_RESYNC", default_value = "60s", value_parser = duration)]
    resync: Duration,
    /// Reconciles running at once, per controller.
    #[arg(long, env = "HAVIP_CONCURRENCY", default_value = "8")]
    concurrency: u16,
    /// Serve Services of type LoadBalancer that name no `loadBalancerClass` as well as
    /// those of class havip.io/l2 (havip as the cluster's default provider).
    #[arg(long, env = "HAVIP_DEFAULT_LOAD_BALANCER", default_value_t = false, action = clap::ArgAction::Set)]
    default_load_balancer: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match args.log_format {
        LogFormat::Json => tracing_subscriber::fmt().json().with_env_filter(filter).init(),
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
    }
    tracing::info!(namespace = %args.namespace, metrics = %args.metrics_address, "havip-operator starting");
    match run(args).await {
        Ok(signal) => {
            tracing::info!(signal, "shut down");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, category = e.category(), "havip-operator failed");
            std::process::ExitCode::FAILURE
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "havip-operator".to_owned())
}

async fn run(args: Args) -> Result<&'static str, Error> {
    if args.leader_election_renew_deadline >= args.leader_election_lease_duration {
        return Err(Error::Usage(
            "--leader-election-renew-deadline must be shorter than --leader-election-lease-duration".to_owned(),
        ));
    }
    if havip_crds::lease::is_pair_lease(&args.leader_election_lease) {
        return Err(Error::Usage(format!(
            "--leader-election-lease {:?} starts with {:?}, the prefix of the pair Leases (which the agents may write)",
            args.leader_election_lease,
            havip_crds::lease::PAIR_PREFIX
        )));
    }
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Error::Signals)?;
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let signal_name = Arc::new(std::sync::Mutex::new("none"));
    let name_slot = signal_name.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
        if let Ok(mut slot) = name_slot.lock() {
            *slot = name;
        }
        let _ = shutdown_tx.send(true);
    });

    let metrics = Arc::new(Metrics::new());
    let (bound, _server) = havip_endpoints::serve(args.metrics_address, metrics.clone())
        .await
        .map_err(|source| Error::Metrics { addr: args.metrics_address, source })?;
    tracing::info!(address = %bound, "metrics and health endpoints listening");

    let kubeconfig = (!args.kubeconfig.is_empty()).then(|| PathBuf::from(&args.kubeconfig));
    let client = havip_operator::client(kubeconfig.as_deref()).await?;
    let identity =
        if args.identity.is_empty() { format!("{}-{}", hostname(), std::process::id()) } else { args.identity.clone() };
    let settings = Settings {
        namespace: args.namespace.clone(),
        leader_lease: args.leader_election_lease.clone(),
        identity: identity.clone(),
        resync: args.resync,
        concurrency: args.concurrency,
        default_load_balancer: args.default_load_balancer,
    };
    let cfg = LeaderConfig {
        namespace: args.namespace.clone(),
        name: args.leader_election_lease.clone(),
        identity,
        lease_duration: args.leader_election_lease_duration,
        renew_interval: args.leader_election_renew_interval,
        renew_deadline: args.leader_election_renew_deadline,
    };
    let leader_flag = Arc::new(AtomicBool::new(false));
    let work = {
        let client = client.clone();
        let metrics = metrics.clone();
        let leader_flag = leader_flag.clone();
        move |stop: tokio::sync::watch::Receiver<bool>| {
            let fut = controller::run_controllers(
                client.clone(),
                settings.clone(),
                metrics.clone(),
                leader_flag.clone(),
                controller::stop_future(stop),
            );
            Box::pin(fut) as futures::future::BoxFuture<'static, ()>
        }
    };
    leader::run(client, cfg, metrics, leader_flag, shutdown_rx, work).await?;
    let name = signal_name.lock().map(|s| *s).unwrap_or("none");
    Ok(name)
}
