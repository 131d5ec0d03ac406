//! `kind-e2e`: the end-to-end scenarios of `make e2e` on a kind cluster.
//!
//! `kind-e2e up` creates the cluster (`e2e/kind/cluster.yaml`: one control plane,
//! three workers), loads the images `make images` built, installs the chart and the
//! responders; `kind-e2e run [--only NAME]…` runs every scenario of
//! `havip_e2e::scenarios` (the very functions `make e2e` runs locally), one JSON line
//! each, exit 1 if any failed; `kind-e2e down` deletes the cluster. `make kind-e2e`
//! does all three. Needs Docker and the kindest/node image (it is pulled).

use clap::{Parser, Subcommand};
use havip_e2e::cluster::Cluster;
use havip_e2e::kind::{KindCluster, KindConfig};
use havip_e2e::scenarios;
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
}

fn main() -> ExitCode {
    havip_e2e::init_tracing();
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
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kind-e2e: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cfg: KindConfig, only: &[String]) -> ExitCode {
    let mut cluster = match KindCluster::attach(cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kind-e2e: {e} (run `kind-e2e up` first)");
            return ExitCode::FAILURE;
        }
    };
    let workers = cluster.nodes().len();
    let mut failed = 0;
    for s in scenarios::all::<KindCluster>() {
        if !only.is_empty() && !only.iter().any(|o| o == s.name) {
            continue;
        }
        if s.nodes > workers {
            println!("{}", serde_json::json!({"scenario": s.name, "result": "skipped", "why": "not enough workers"}));
            continue;
        }
        let start = Instant::now();
        let outcome = scenarios::reset(&mut cluster).and_then(|()| {
            std::panic::catch_unwind(AssertUnwindSafe(|| (s.run)(&mut cluster))).map_err(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panicked".to_owned())
            })
        });
        let secs = start.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => println!("{}", serde_json::json!({"scenario": s.name, "result": "pass", "seconds": secs})),
            Err(message) => {
                failed += 1;
                println!(
                    "{}",
                    serde_json::json!({"scenario": s.name, "result": "fail", "seconds": secs, "message": message})
                );
            }
        }
    }
    let _ = scenarios::reset(&mut cluster);
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
