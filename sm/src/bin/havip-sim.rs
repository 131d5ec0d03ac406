//! `havip-sim`: runs random schedules of the deterministic simulator and checks the
//! invariants (see `havip_sm::sim`). The last line of its output is a JSON object
//! with at least `schedules`, `violations` and `schedules_per_sec`; the exit code is
//! non-zero when any invariant broke.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use havip_sm::sim::{Outcome, SimOptions, report, run_schedule, schedule_seed};

/// Deterministic simulation of havip pair members under partitions, crashes and pauses.
#[derive(Debug, Parser)]
#[command(name = "havip-sim", version)]
struct Args {
    /// Number of random schedules to run.
    #[arg(long, env = "SCHEDULES", default_value_t = 1_000)]
    schedules: u64,
    /// Seed of the run (schedule i uses a seed derived from it and i).
    #[arg(long, env = "SEED", default_value_t = 1)]
    seed: u64,
    /// Replay one schedule by its own seed (decimal or 0x-hex) and print its whole trace.
    #[arg(long, value_parser = parse_seed)]
    replay: Option<u64>,
    /// Print at most this many failing schedules in full.
    #[arg(long, default_value_t = 5)]
    max_reports: u64,
}

fn parse_seed(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse::<u64>(),
    };
    r.map_err(|e| format!("failed to parse seed {s:?}: {e}"))
}

fn json_line(fields: &[(&str, serde_json::Value)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> =
        fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    serde_json::Value::Object(map).to_string()
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(seed) = args.replay {
        let o = run_schedule(seed, &SimOptions::default().with_full_trace());
        println!("schedule seed {seed:#018x}: {}", o.summary);
        for line in &o.trace {
            println!("  {line}");
        }
        for v in &o.violations {
            println!("VIOLATION {} at {} ms: {}", v.invariant, v.at_ms, v.detail);
        }
        println!(
            "{}",
            json_line(&[
                ("replay", seed.into()),
                ("violations", (o.violations.len() as u64).into()),
                ("steps", o.steps.into()),
                ("digest", format!("{:#018x}", o.digest).into()),
            ])
        );
        return if o.violations.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    let start = Instant::now();
    let opts = SimOptions::default();
    let (mut violations, mut failing, mut steps, mut events, mut takeovers, mut planned) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut virtual_ms = 0u64;
    let (mut d_checked, mut b_checked, mut dual_max) = (0u64, 0u64, 0u64);
    let (mut restarts, mut bursts, mut splits, mut unverified_max) = (0u64, 0u64, 0u64, 0u64);
    let mut replacement: Vec<u64> = Vec::new();
    let mut reasons = std::collections::BTreeMap::<String, u64>::new();
    let mut by_invariant = std::collections::BTreeMap::<&'static str, u64>::new();
    let mut first_failing: Vec<u64> = Vec::new();
    for i in 0..args.schedules {
        let o: Outcome = run_schedule(schedule_seed(args.seed, i), &opts);
        steps += o.steps;
        events += o.events;
        takeovers += o.takeovers;
        planned += o.planned_ok;
        virtual_ms += o.virtual_ms;
        d_checked += o.d_checked;
        b_checked += o.b_checked;
        dual_max = dual_max.max(o.dual_max_ms);
        restarts += o.restarts_checked;
        bursts += o.bursts_checked;
        splits += o.splits_checked;
        unverified_max = unverified_max.max(o.unverified_dual_max_ms);
        replacement.extend_from_slice(&o.replacement_ms);
        for (r, c) in &o.role_changes {
            *reasons.entry(format!("{r:?}")).or_default() += c;
        }
        if !o.violations.is_empty() {
            failing += 1;
            violations += o.violations.len() as u64;
            for v in &o.violations {
                *by_invariant.entry(v.invariant.code()).or_default() += 1;
            }
            if failing <= args.max_reports {
                print!("{}", report(&o));
            }
            if first_failing.len() < 20 {
                first_failing.push(o.seed);
            }
        }
    }
    replacement.sort_unstable();
    let pct = |q: f64| -> serde_json::Value {
        if replacement.is_empty() {
            return serde_json::Value::Null;
        }
        let i = ((replacement.len() - 1) as f64 * q).round() as usize;
        replacement[i.min(replacement.len() - 1)].into()
    };
    let latency = serde_json::json!({
        "p50": pct(0.5),
        "p99": pct(0.99),
        "max": pct(1.0),
    });
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let rate = (args.schedules as f64 / secs * 10.0).round() / 10.0;
    let by: serde_json::Map<String, serde_json::Value> =
        by_invariant.into_iter().map(|(k, v)| (k.to_owned(), v.into())).collect();
    println!(
        "{}",
        json_line(&[
            ("schedules", args.schedules.into()),
            ("violations", violations.into()),
            ("failing_schedules", failing.into()),
            ("violations_by_invariant", serde_json::Value::Object(by)),
            ("schedules_per_sec", rate.into()),
            ("elapsed_sec", ((secs * 100.0).round() / 100.0).into()),
            ("seed", args.seed.into()),
            ("steps", steps.into()),
            ("events", events.into()),
            ("takeovers", takeovers.into()),
            ("planned_ok", planned.into()),
            ("virtual_sec", (virtual_ms / 1_000).into()),
            ("takeover_deadline_checks", d_checked.into()),
            ("unplanned_acquisitions_checked", b_checked.into()),
            ("longest_connected_dual_ms", dual_max.into()),
            ("restart_checks", restarts.into()),
            ("stall_bursts_checked", bursts.into()),
            ("split_alarm_checks", splits.into()),
            ("longest_unverified_dual_ms", unverified_max.into()),
            ("dead_active_replacement_ms", latency),
            (
                "role_changes_by_reason",
                serde_json::Value::Object(reasons.into_iter().map(|(k, v)| (k, v.into())).collect(),),
            ),
            (
                "failing_seeds",
                first_failing.iter().map(|s| serde_json::Value::from(format!("{s:#018x}"))).collect::<Vec<_>>().into()
            ),
        ])
    );
    if violations == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
