//! Repeated runs of one (system, scenario), the JSON lines that sum them up, and the
//! ratios of havip's gaps to the other systems'.

use crate::drain::{kept_fields, run_havip_drain, run_keepalived_drain};
use crate::many::{print_many, run_havip_many, run_keepalived_many};
use crate::moves::{Kept, Outcome, Scenario, Timeline, percentile, print_timeline};
use crate::single::{run_havip, run_keepalived, run_metallb};
use crate::systems::keepalived_config;
use havip_e2e::baselines::metallb::Mode;
use serde_json::json;
use std::time::Duration;

/// What a (system, scenario) measured: the system, the scenario, the p50 and p99 gap
/// (ms) and the most failed connects of a run.
pub(crate) type Summary = (String, Scenario, f64, f64, usize);

/// `havip-bgp-fast-backup`'s BFD interval (ms, × 3) unless `$HAVIP_BACKUP_BFD_MS`
/// (10..=1000) says otherwise: the router drops a dead holder's path after three intervals
/// and falls back on the standby's backup path, which it already has.
const BACKUP_BFD_MS: u32 = 50;

fn backup_bfd_ms() -> u32 {
    std::env::var("HAVIP_BACKUP_BFD_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v| (10..=1000).contains(v))
        .unwrap_or(BACKUP_BFD_MS)
}

/// One run of `scenario` (one move per lab, or `planned-drain`) on `system`.
fn run_once(scenario: Scenario, system: &str) -> Result<Outcome, String> {
    match (scenario, system) {
        (Scenario::PlannedDrain, "havip") => run_havip_drain(),
        (Scenario::PlannedDrain, other) => match keepalived_config(other) {
            Some(c) => run_keepalived_drain(c),
            None => Err(format!("unknown system {other}")),
        },
        (_, "havip") => run_havip(scenario, false, false, None, false),
        (_, "havip-fast") => run_havip(scenario, true, false, None, false),
        (_, "havip-vmac") => run_havip(scenario, false, false, None, true),
        (_, "havip-bgp") => run_havip(scenario, false, true, None, false),
        (_, "havip-bgp-fast") => run_havip(scenario, true, true, None, false),
        (_, "havip-bgp-fast-backup") => run_havip(scenario, true, true, Some(backup_bfd_ms()), false),
        (_, "metallb-l2") => run_metallb(scenario, Mode::Layer2),
        (_, "metallb-bgp") => run_metallb(scenario, Mode::Bgp { hold_time: None }),
        (_, "metallb-bgp-3s") => run_metallb(scenario, Mode::Bgp { hold_time: Some(Duration::from_secs(3)) }),
        (_, other) => match keepalived_config(other) {
            Some(c) => run_keepalived(scenario, c),
            None => Err(format!("unknown system {other}")),
        },
    }
}

/// `planned-200` on `system` (one lab, `moves` moves at least `interval` apart): prints
/// its line; `None` when the lab could not run, and `failed_runs` counts that and a
/// lab that stopped before all moves.
pub(crate) fn many(system: &str, moves: usize, interval: Duration, failed_runs: &mut usize) -> Option<Summary> {
    let r = match system {
        "havip" => run_havip_many(moves, interval, false),
        "havip-bgp" => run_havip_many(moves, interval, true),
        other => match keepalived_config(other) {
            Some(c) => run_keepalived_many(c, moves, interval),
            None => Err(format!("unknown system {other}")),
        },
    };
    match r {
        Ok(many) => {
            let (p50, p99) = print_many(system, &many, moves);
            if many.aborted.is_some() {
                *failed_runs += 1;
            }
            Some((system.to_owned(), Scenario::Planned200, p50, p99, many.failed_connects))
        }
        Err(e) => {
            *failed_runs += 1;
            eprintln!("{system} {}: error: {e}", Scenario::Planned200.name());
            None
        }
    }
}

/// `runs` runs of `scenario` on `system`: each run on stderr, then the (system, scenario)
/// line and the median run's timeline on stdout; `failed_runs` counts the runs that
/// could not be made.
pub(crate) fn repeated(scenario: Scenario, system: &str, runs: usize, failed_runs: &mut usize) -> Summary {
    let mut gaps = Vec::new();
    let mut timelines: Vec<(f64, Timeline)> = Vec::new();
    let mut failed_max = 0usize;
    let mut unreached = 0;
    let mut kept: Vec<Kept> = Vec::new();
    for run in 0..runs {
        match run_once(scenario, system) {
            Ok(o) => {
                if !o.new_holder_reached {
                    unreached += 1;
                }
                let extra = match (&o.kept, scenario) {
                    (Some(k), Scenario::PlannedDrain) => format!(
                        ", {}/{} long-lived broken in the move{}, {}/{} mid-handshake failed, {} resets",
                        k.broken_in_move,
                        k.longlived,
                        k.cut_at_drain_end.map(|c| format!(" ({c} cut at the drain's end)")).unwrap_or_default(),
                        k.mid_handshake_failed,
                        k.mid_handshake,
                        k.resets
                    ),
                    _ => String::new(),
                };
                eprintln!(
                    "{system} {} run {}: gap {:.1} ms, {} failed connects{extra}{}",
                    scenario.name(),
                    run + 1,
                    o.gap_ms,
                    o.failed,
                    if o.new_holder_reached { "" } else { " (new holder never answered)" }
                );
                gaps.push(o.gap_ms);
                failed_max = failed_max.max(o.failed);
                timelines.push((o.gap_ms, o.timeline));
                if scenario == Scenario::PlannedDrain
                    && let Some(k) = o.kept
                {
                    kept.push(k);
                }
            }
            Err(e) => {
                *failed_runs += 1;
                eprintln!("{system} {} run {}: error: {e}", scenario.name(), run + 1);
            }
        }
    }
    gaps.sort_by(|a, b| a.total_cmp(b));
    let p50 = percentile(&gaps, 50.0);
    let p99 = percentile(&gaps, 99.0);
    let mut line = json!({
        "system": system,
        "scenario": scenario.name(),
        "runs": gaps.len(),
        "p50_gap_ms": (p50 * 10.0).round() / 10.0,
        "p99_gap_ms": (p99 * 10.0).round() / 10.0,
        "max_gap_ms": gaps.last().map(|g| (g * 10.0).round() / 10.0),
        "failed_connects_max": failed_max,
        "runs_without_takeover": unreached,
    });
    if scenario == Scenario::PlannedDrain
        && let Some(obj) = line.as_object_mut()
    {
        obj.extend(kept_fields(&kept));
    }
    println!("{line}");
    // The median run's probes, for the picture.
    timelines.sort_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((gap, probes)) = timelines.get(timelines.len().saturating_sub(1) / 2) {
        print_timeline(system, scenario.name(), *gap, probes);
    }
    (system.to_owned(), scenario, p50, p99, failed_max)
}

/// Prints the ratios of each havip profile's gaps to each other system's, for `scenario`.
pub(crate) fn print_ratios(results: &[Summary], scenario: Scenario) {
    let here: Vec<_> = results.iter().filter(|r| r.1 == scenario).collect();
    // Routed rows against routed rows only: a BGP failover is not a layer-2 one.
    let routed = |s: &str| s.contains("bgp");
    for (h, _, h50, h99, _) in here.iter().filter(|r| r.0.starts_with("havip")) {
        for (sys, _, k50, k99, _) in here.iter().filter(|r| !r.0.starts_with("havip") && routed(&r.0) == routed(h)) {
            println!(
                "{}",
                json!({
                    "ratio": format!("{h}/{sys}"),
                    "scenario": scenario.name(),
                    "p50_gap_ratio": ((h50 / k50) * 1000.0).round() / 1000.0,
                    "p99_gap_ratio": ((h99 / k99) * 1000.0).round() / 1000.0,
                })
            );
        }
    }
}
