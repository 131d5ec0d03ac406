//! `kubectl havip`: imperative verbs for havip pairs and a readable status view.
//!
//! Each action writes its request annotation (a fresh id, field manager
//! `kubectl-havip`) and waits for `status.lastOperation` to answer that id; it exits
//! 0 on `Succeeded`, 1 on `Refused` or `Failed`, 2 on a timeout, 3 on other errors.

use clap::{Parser, Subcommand};
use havip_crds::{HAPair, OperationResult};
use havip_operator::model::RequestKind;
use havip_operator::{Error, plugin};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

fn duration(s: &str) -> Result<Duration, String> {
    havip_crds::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// Imperative verbs and status for havip HAPairs.
#[derive(Parser, Debug)]
#[command(name = "kubectl-havip", version, about)]
struct Args {
    /// Kubeconfig file (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, env = "HAVIP_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// How long to wait for the answer.
    #[arg(long, global = true, env = "HAVIP_TIMEOUT", default_value = "15s", value_parser = duration)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Move the VIPs to a standby (planned: make-before-break; --force: skip readiness checks).
    Failover {
        /// The HAPair.
        pair: String,
        /// Forced failover: skips the readiness checks.
        #[arg(long)]
        force: bool,
        /// The member that should take the VIPs (default: the best ready standby).
        #[arg(long)]
        to: Option<String>,
    },
    /// Put a member into maintenance or take it out (spec.members[].maintenance).
    Maintenance {
        /// The HAPair.
        pair: String,
        /// The member node.
        node: String,
        /// on or off.
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// Clear a flap suspension.
    Clear {
        /// The HAPair.
        pair: String,
    },
    /// Rotate the heartbeat key (waits until every member uses the new key).
    RotateKey {
        /// The HAPair.
        pair: String,
    },
    /// Resume automatic failback after a manual move paused it.
    ResumeFailback {
        /// The HAPair.
        pair: String,
    },
    /// Show one pair, or every pair, member by member.
    Status {
        /// The HAPair (default: all).
        pair: Option<String>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("HAVIP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(3)
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, Error> {
    let client = havip_operator::client(args.kubeconfig.as_deref()).await?;
    let api: Api<HAPair> = Api::all(client);
    let (pair, kind, target) = match args.command {
        Command::Status { pair } => return status(&api, pair.as_deref()).await,
        Command::Maintenance { pair, node, state } => {
            return maintenance(&api, &pair, &node, state == "on", args.timeout).await;
        }
        Command::Failover { pair, force, to } => {
            (pair, if force { RequestKind::ForceFailover } else { RequestKind::Failover }, to)
        }
        Command::Clear { pair } => (pair, RequestKind::Clear, None),
        Command::RotateKey { pair } => (pair, RequestKind::RotateKey, None),
        Command::ResumeFailback { pair } => (pair, RequestKind::ResumeFailback, None),
    };
    // Fail early, with the API's words, when the pair does not exist.
    api.get(&pair).await.map_err(|source| Error::Get {
        kind: "HAPair",
        name: pair.clone(),
        source: Box::new(source),
    })?;
    let id = plugin::request_id()?;
    let value = match &target {
        Some(t) => format!("{id}:{t}"),
        None => id.clone(),
    };
    let waiter = {
        let api = api.clone();
        let pair = pair.clone();
        let id = id.clone();
        let timeout = args.timeout;
        // The watch's initial list also shows an answer that came before it started.
        tokio::spawn(async move {
            plugin::wait_for_answer(&api, &pair, &id, timeout, |op| {
                println!("{} {}: {} — {}", op.kind, op.id, op.result, op.message);
            })
            .await
        })
    };
    plugin::annotate(&api, &pair, kind, &value).await?;
    eprintln!(
        "requested {} on {pair} (id {id}); waiting up to {}s for the answer",
        kind.operation(),
        args.timeout.as_secs()
    );
    let answer = waiter.await.map_err(|e| Error::Request(format!("waiting failed: {e}")))?;
    match answer {
        Ok(op) => {
            println!("{} {}: {} — {}", op.kind, op.id, op.result, op.message);
            Ok(if op.result == OperationResult::Succeeded { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Err(last) => {
            match last {
                Some(op) => println!(
                    "{} {}: still {} after {}s — {}",
                    op.kind,
                    op.id,
                    op.result,
                    args.timeout.as_secs(),
                    op.message
                ),
                None => println!(
                    "{} {id}: no answer within {}s (is havip-operator running?)",
                    kind.operation(),
                    args.timeout.as_secs()
                ),
            }
            Ok(ExitCode::from(2))
        }
    }
}

async fn status(api: &Api<HAPair>, pair: Option<&str>) -> Result<ExitCode, Error> {
    let now = Timestamp::now();
    let pairs = match pair {
        Some(p) => vec![api.get(p).await.map_err(|source| Error::Get {
            kind: "HAPair",
            name: p.to_owned(),
            source: Box::new(source),
        })?],
        None => {
            api.list(&ListParams::default())
                .await
                .map_err(|source| Error::List { kind: "HAPair", source: Box::new(source) })?
                .items
        }
    };
    if pairs.is_empty() {
        println!("no HAPairs");
    }
    for (i, p) in pairs.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{}", plugin::render_status(p, now));
    }
    Ok(ExitCode::SUCCESS)
}

async fn maintenance(
    api: &Api<HAPair>,
    pair: &str,
    node: &str,
    on: bool,
    timeout: Duration,
) -> Result<ExitCode, Error> {
    plugin::set_maintenance(api, pair, node, on).await?;
    let word = if on { "on" } else { "off" };
    eprintln!("set maintenance {word} for {node} in {pair}; waiting up to {}s for its agent", timeout.as_secs());
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let p = api.get(pair).await.map_err(|source| Error::Get {
            kind: "HAPair",
            name: pair.to_owned(),
            source: Box::new(source),
        })?;
        let applied =
            p.status.as_ref().and_then(|s| havip_operator::model::member_status(s, node)).and_then(|m| m.maintenance);
        if applied == Some(on) {
            println!("{node}: maintenance {word} (applied by its agent)");
            return Ok(ExitCode::SUCCESS);
        }
        if tokio::time::Instant::now() >= deadline {
            println!(
                "{node}: maintenance {word} is in the spec; the agent has not confirmed within {}s",
                timeout.as_secs()
            );
            return Ok(ExitCode::from(2));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
