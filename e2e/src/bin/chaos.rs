//! `chaos`: random, overlapping faults on the Kubernetes lab for as long as you let it run,
//! judged from the clients' side (issue 29; docs/chaos.md). Prints JSON lines (the
//! schedule, every fault as carried out, every outage and dual-answer window, a row per
//! fault kind, what was left behind, the verdict) and a summary table on standard error;
//! exits 1 when an invariant broke, naming the command that reproduces it. Root.

use clap::Parser;
use havip_e2e::chaos::run::{RunOptions, run};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "A chaos run on the Kubernetes lab, judged from the clients' side")]
struct Args {
    /// How long the nemesis acts (`90s`, `10m`, `1h`).
    #[arg(long, default_value = "10m", value_parser = duration)]
    duration: Duration,
    /// The schedule's seed; a fresh one (printed) when absent.
    #[arg(long)]
    seed: Option<u64>,
    /// Run only the first N faults of the schedule (a reproduction).
    #[arg(long)]
    faults: Option<usize>,
    /// Calm after the last heal, the clients still probing.
    #[arg(long, default_value = "15s", value_parser = duration)]
    settle: Duration,
    /// Keep the lab's files (logs, state) in this directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Write the JSON lines to this file too.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("not a duration: {s:?} (e.g. 90s, 10m, 1h)"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("not a duration: {s:?} (e.g. 90s, 10m, 1h)")),
    }
}

fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
}

fn main() -> ExitCode {
    // Standard output carries the JSON lines only; the harness's own logs go to standard
    // error, warnings and worse unless RUST_LOG says otherwise.
    havip_e2e::host::logging::init_tracing_quiet();
    let args = Args::parse();
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("chaos: needs root (network namespaces, nftables)");
        return ExitCode::from(2);
    }
    let seed = args.seed.unwrap_or_else(fresh_seed);
    eprintln!("chaos: seed {seed}, {} s of faults", args.duration.as_secs());
    let opts = RunOptions {
        seed,
        duration: args.duration,
        faults: args.faults,
        settle: args.settle,
        dir: args.dir,
        out: args.out,
    };
    match run(&opts) {
        Ok(outcome) => {
            eprintln!("{}", havip_e2e::chaos::checker::summary_table(&outcome.verdict, &outcome.leftovers));
            if outcome.broken.is_empty() {
                eprintln!("chaos: seed {seed}: every invariant held");
                ExitCode::SUCCESS
            } else {
                eprintln!("chaos: seed {seed}: {} broken invariant(s):", outcome.broken.len());
                for b in &outcome.broken {
                    eprintln!("  - {b}");
                }
                if let Some(r) = &outcome.reproduce {
                    eprintln!("reproduce with: {r}");
                }
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("chaos: seed {seed}: the run failed: {e}");
            ExitCode::from(2)
        }
    }
}
