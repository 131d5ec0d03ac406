//! `kind-e2e`: the end-to-end scenarios of `make e2e` on a kind cluster.
//!
//! `kind-e2e up` creates the cluster (`e2e/kind/cluster.yaml`: one control plane,
//! three workers), loads the images `make images` built, installs the chart and the
//! responders; `kind-e2e run [--only NAME]…` runs every scenario of
//! `havip_e2e::scenarios` (the very functions `make e2e` runs locally), one JSON line
//! each, exit 1 if any failed; `kind-e2e down` deletes the cluster. `make kind-e2e`
//! does all three. Needs Docker and the node image `hack/kind-node-image.sh` builds.

use clap::{Parser, Subcommand};
use havip_e2e::harness::cluster::{Cluster, ClusterError};
use havip_e2e::harness::kind::{KindCluster, KindConfig};
use havip_e2e::scenarios;
use havip_e2e::scenarios::kind::{self as kind_scenarios, Expect};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The kind cluster's name.
    #[arg(long, default_value = "havip-e2e", global = true)]
    cluster: String,
    /// Image prefix (`<prefix>/havip-agent:<tag>`), as `make images` tags them.
    #[arg(long, default_value = "havip", global = true)]
    image_prefix: String,
    /// Image tag.
    #[arg(long, default_value = "dev", global = true)]
    tag: String,
    /// Where the cluster's kubeconfig goes.
    #[arg(long, default_value = "/tmp/havip-kind/kubeconfig", global = true)]
    kubeconfig: PathBuf,
    /// kind binary (`hack/testbin.sh kind` builds v0.33.0).
    #[arg(long, default_value = "kind", global = true)]
    kind: PathBuf,
    /// helm binary.
    #[arg(long, default_value = "helm", global = true)]
    helm: PathBuf,
    /// kubectl binary.
    #[arg(long, default_value = "kubectl", global = true)]
    kubectl: PathBuf,
    /// The kind node image (`hack/kind-node-image.sh` builds it offline); empty: kind's default.
    #[arg(long, env = "HAVIP_KIND_NODE_IMAGE", default_value = "havip/kind-node:v1.37.2", global = true)]
    node_image: String,
    /// The previous release (the directory `hack/previous-release.sh` prints: its chart and
    /// CRDs; its images tagged `prev`), for the upgrade scenario; without it that scenario
    /// fails saying so.
    #[arg(long, env = "HAVIP_KIND_PREVIOUS_RELEASE", global = true)]
    previous_release: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create the cluster, load the images, install the chart and the responders.
    Up,
    /// Run the scenarios (all, or those named by --only) against the cluster.
    Run {
        /// Run only these scenarios.
        #[arg(long)]
        only: Vec<String>,
    },
    /// Delete the cluster.
    Down,
    /// Print the scenario names, one a line (those `make e2e` runs too first, then the
    /// kubelet-level ones).
    List,
}

fn main() -> ExitCode {
    // Progress on stderr: stdout carries one JSON line per scenario.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let cfg = KindConfig {
        cluster: args.cluster,
        workers: 3,
        image_prefix: args.image_prefix,
        tag: args.tag,
        kubeconfig: args.kubeconfig,
        kind: args.kind,
        helm: args.helm,
        kubectl: args.kubectl,
        repo,
        node_image: Some(args.node_image).filter(|i| !i.is_empty()),
        previous: args.previous_release,
    };
    let res = match args.command {
        Cmd::Up => {
            if let Some(d) = cfg.kubeconfig.parent() {
                let _ = std::fs::create_dir_all(d);
            }
            KindCluster::up(cfg.clone()).map(|_| {
                println!("export KUBECONFIG={}", cfg.kubeconfig.display());
            })
        }
        Cmd::Down => KindCluster::down(&cfg),
        Cmd::Run { only } => return run(cfg, &only),
        Cmd::List => {
            for n in names() {
                println!("{n}");
            }
            Ok(())
        }
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kind-e2e: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The outcome of one scenario: Ok, or why the reset before it failed, or the panic message.
fn outcome(reset: Result<(), ClusterError>, f: impl FnOnce()) -> Result<(), String> {
    reset.map_err(|e| e.to_string()).and_then(|()| {
        std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panicked".to_owned())
        })
    })
}

/// Prints the scenario's JSON line; true when it counts as a failure of the suite.
fn report(name: &str, expect: Expect, secs: f64, res: Result<(), String>) -> bool {
    let (result, message, failed) = match (expect, res) {
        (Expect::Pass, Ok(())) => ("pass", None, false),
        (Expect::Pass, Err(m)) => ("fail", Some(m), true),
        (Expect::FailUntilImplemented(why), Err(m)) => {
            ("xfail", Some(format!("expected to fail until implemented: {why}; failure: {m}")), false)
        }
        (Expect::FailUntilImplemented(why), Ok(())) => (
            "xpass",
            Some(format!("passes now ({why}): remove its expected-failure marker in e2e/src/kind_scenarios.rs")),
            true,
        ),
    };
    let mut line = serde_json::json!({"scenario": name, "result": result, "seconds": secs});
    if let Some(m) = message {
        line["message"] = serde_json::Value::String(m);
    }
    println!("{line}");
    failed
}

fn names() -> Vec<&'static str> {
    shared::<KindCluster>().iter().map(|s| s.name).chain(kind_scenarios::all().iter().map(|s| s.name)).collect()
}

/// The scenarios `make e2e` runs too: one pair, then several pairs on shared nodes.
fn shared<C: havip_e2e::harness::cluster::Cluster>() -> Vec<scenarios::Scenario<C>> {
    scenarios::all::<C>().into_iter().chain(scenarios::shared_nodes::<C>()).collect()
}

fn run(cfg: KindConfig, only: &[String]) -> ExitCode {
    let unknown: Vec<&String> = only.iter().filter(|o| !names().contains(&o.as_str())).collect();
    if !unknown.is_empty() {
        eprintln!("kind-e2e: no scenario named {unknown:?}; `kind-e2e list` names them");
        return ExitCode::FAILURE;
    }
    let mut cluster = match KindCluster::attach(cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kind-e2e: {e} (run `kind-e2e up` first)");
            return ExitCode::FAILURE;
        }
    };
    let selected = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let workers = cluster.nodes().len();
    let mut failed = 0;
    for s in shared::<KindCluster>() {
        if !selected(s.name) {
            continue;
        }
        if s.nodes > workers {
            println!("{}", serde_json::json!({"scenario": s.name, "result": "skipped", "why": "not enough workers"}));
            continue;
        }
        let start = Instant::now();
        let res = outcome(kind_scenarios::reset(&mut cluster), || (s.run)(&mut cluster));
        failed += usize::from(report(s.name, Expect::Pass, start.elapsed().as_secs_f64(), res));
    }
    for s in kind_scenarios::all() {
        if !selected(s.name) {
            continue;
        }
        let start = Instant::now();
        let res = outcome(kind_scenarios::reset(&mut cluster), || (s.run)(&mut cluster));
        failed += usize::from(report(s.name, s.expect, start.elapsed().as_secs_f64(), res));
    }
    if let Err(e) = kind_scenarios::reset(&mut cluster) {
        eprintln!("kind-e2e: the final reset failed: {e}");
    }
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
