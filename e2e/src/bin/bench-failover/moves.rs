//! What one move is measured with: the [`Scenario`]s, a run's [`Outcome`], the client's
//! probes around the gap, the mid-handshake connections, and the JSON lines of a timeline.

use havip_e2e::traffic::{HalfOpen, ProbeError, ProbeReport, Prober};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// A failover scenario.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scenario {
    Cut,
    KillThenCut,
    Planned,
    PlannedDrain,
    Planned200,
    /// `cut` with the client's neighbour entry of the VIP pinned (`nud permanent`) to the
    /// MAC it resolved before the cut: a client that never relearns the VIP.
    StaticArp,
}

impl Scenario {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::Cut => "cut",
            Scenario::KillThenCut => "kill-then-cut",
            Scenario::Planned => "planned",
            Scenario::PlannedDrain => "planned-drain",
            Scenario::Planned200 => "planned-200",
            Scenario::StaticArp => "static-arp",
        }
    }

    /// The systems that can run it (None: every system).
    pub(crate) fn systems(self) -> Option<&'static [&'static str]> {
        match self {
            Scenario::PlannedDrain => Some(&["havip", "keepalived-v3"]),
            Scenario::Planned200 => Some(&["havip", "havip-bgp", "keepalived-v3"]),
            Scenario::StaticArp => Some(&["havip", "havip-vmac", "keepalived-v3", "keepalived-v3-vmac"]),
            _ => None,
        }
    }

    /// Whether `system` is measured in this scenario: the scenario's systems, and the
    /// virtual MAC systems (`…-vmac`) in `cut` and `static-arp` only.
    pub(crate) fn measures(self, system: &str) -> bool {
        let listed = self.systems().is_none_or(|only| only.contains(&system));
        listed && (!system.ends_with("-vmac") || matches!(self, Scenario::Cut | Scenario::StaticArp))
    }

    /// How long a run waits for the new holder to answer: a pinned client that cannot
    /// follow the VIP (the control of `static-arp`) never gets an answer.
    pub(crate) fn deadline(self, usual: Duration) -> Duration {
        if self == Scenario::StaticArp { usual.min(Duration::from_secs(5)) } else { usual }
    }
}

/// One run's outcome.
pub(crate) struct Outcome {
    pub(crate) gap_ms: f64,
    pub(crate) failed: usize,
    pub(crate) new_holder_reached: bool,
    /// The client's probes from `TIMELINE_BEFORE_MS` before the last answer of the old
    /// holder to `TIMELINE_AFTER_MS` after the first answer of the new one: (start, end,
    /// responder), in ms relative to that last answer.
    pub(crate) timeline: Timeline,
    /// `planned-drain`: what became of the connections open or opening at the move.
    pub(crate) kept: Option<Kept>,
}

/// `planned-drain`: the connections that were open, or opening, when the VIP moved.
#[derive(Debug, Clone, Default)]
pub(crate) struct Kept {
    /// Long-lived connections open at the move.
    pub(crate) longlived: usize,
    /// Of those, broken within `MOVE_WINDOW` (2 s) of the move.
    pub(crate) broken_in_move: usize,
    /// havip: broken when the drain ended (still open then).
    pub(crate) cut_at_drain_end: Option<usize>,
    /// How the long-lived connections broke (all of the run).
    pub(crate) break_kinds: BTreeMap<String, usize>,
    /// Connections in the middle of their handshake at the move.
    pub(crate) mid_handshake: usize,
    /// Of those, failed (reset or not answered).
    pub(crate) mid_handshake_failed: usize,
    /// The 5 ms stream's connections reset after they were set up.
    pub(crate) resets: usize,
}

/// A run's probes around the move: (start ms, end ms, responder).
pub(crate) type Timeline = Vec<(f64, f64, Option<String>)>;

const TIMELINE_BEFORE_MS: f64 = 150.0;
const TIMELINE_AFTER_MS: f64 = 150.0;

/// The probes around the longest gap, relative to its start (see [`Outcome::timeline`]).
pub(crate) fn around_the_gap(report: &ProbeReport) -> Timeline {
    let Some(gap) = report.longest_gap.as_ref() else { return Vec::new() };
    let (from, to) = (gap.from_ms - TIMELINE_BEFORE_MS, gap.to_ms + TIMELINE_AFTER_MS);
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    report
        .timeline
        .iter()
        .filter(|p| p.end_ms >= from && p.start_ms <= to)
        .map(|p| (r1(p.start_ms - gap.from_ms), r1(p.end_ms - gap.from_ms), p.outcome.as_ref().ok().cloned()))
        .collect()
}

/// Waits until `new_holder` answers (then 20 more answers, so the gap closes), stops the
/// prober and sums up the run.
pub(crate) fn finish(prober: Prober, new_holder: &str, deadline: Duration) -> Outcome {
    // Wait until the new holder answers, then a little longer so the gap closes.
    let reached = prober.wait_for_responder(new_holder, deadline).is_ok();
    if reached {
        let _ = prober.wait_until_ok(prober.ok_count() + 20, Duration::from_secs(2));
    }
    let report: ProbeReport = match prober.stop() {
        Ok(r) => r,
        Err(_) => {
            return Outcome {
                gap_ms: f64::NAN,
                failed: usize::MAX,
                new_holder_reached: false,
                timeline: Vec::new(),
                kept: None,
            };
        }
    };
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        eprintln!("  {}", report.summary());
    }
    Outcome {
        gap_ms: report.longest_gap_ms,
        failed: report.failed,
        new_holder_reached: reached,
        timeline: around_the_gap(&report),
        kept: Some(Kept { resets: report.resets(), ..Kept::default() }),
    }
}

/// The mid-handshake connections of a move from `ns` to `target`, from source ports
/// `[first, first + n)`.
pub(crate) fn half_open(ns: &str, target: SocketAddr, first: u16, n: u16) -> Result<HalfOpen, String> {
    HalfOpen::open(ns, target, first..first + n, Duration::from_secs(2)).map_err(|e| e.to_string())
}

/// Completes mid-handshake connections: how many, how many failed, and why.
pub(crate) fn complete(half: HalfOpen, kinds: &mut BTreeMap<String, usize>) -> (usize, usize) {
    let results = half.complete();
    let failed: Vec<&ProbeError> = results.iter().filter_map(|(_, r)| r.as_ref().err()).collect();
    for e in &failed {
        *kinds.entry(e.kind().to_owned()).or_insert(0) += 1;
    }
    (results.len(), failed.len())
}

/// Prints the `timeline` line of a (system, scenario): the probes around a move.
pub(crate) fn print_timeline(system: &str, scenario: &str, gap: f64, probes: &Timeline) {
    println!(
        "{}",
        json!({
            "bench": "timeline",
            "system": system,
            "scenario": scenario,
            "gap_ms": (gap * 10.0).round() / 10.0,
            "interval_ms": 5,
            "probes": probes.iter().map(|(s, e, who)| json!([s, e, who])).collect::<Vec<_>>(),
        })
    );
}

/// The `p`-th percentile of `sorted` (nearest rank; NaN when empty).
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}
