//! `bench-failover`: failover gaps of havip, keepalived and MetalLB (layer 2), side by
//! side, in the same network-namespace topology, as JSON lines.
//!
//! A client in its own namespace connects to VIP:8080 every 5 ms with a 50 ms timeout
//! (each member runs a listener that names itself) and records the longest gap between
//! successful connects and the number of failed connects, for three scenarios:
//! `cut` (the active's cables are pulled), `kill-then-cut` (the active's HA daemon is
//! SIGKILLed, then its cables pulled 2 s later) and `planned` (havip: `admin failover`;
//! keepalived: SIGTERM, its priority-0 handover; MetalLB: SIGTERM to the announcing node's
//! speaker, which leaves memberlist). Systems: `havip` (defaults), `keepalived-v2` (Debian
//! keepalived, VRRPv2 defaults), `keepalived-v3` (VRRPv3, `advert_int 0.1`) and
//! `metallb-l2` (MetalLB v0.15.2 in layer-2 mode with its defaults, on a local control
//! plane: see `havip_e2e::metallb`; the active is whichever node MetalLB elects to
//! announce). `metallb-l2` is in the default list only when `hack/testbin.sh metallb` and
//! `hack/testbin.sh control-plane` have built its binaries; otherwise it prints a
//! `{"system":"metallb-l2","skipped":…}` line and goes on. Then the havip agent's idle RSS
//! and CPU with each VIP count of `--footprint-vips` (default 1, 10 and 100).
//!
//! Two scenarios measure planned moves that should keep connections (issue 17 §3,
//! issue 18), for `havip` (its default `drainTimeout`) and `keepalived-v3` only (other
//! systems are skipped for them; the members' listeners echo, see
//! `havip_e2e::traffic::Listener::echo`):
//! - `planned-drain`: as `planned`, with 20 long-lived connections (a message every
//!   50 ms each) and 4 connections held in the middle of their handshake (the SYN
//!   answered by the old holder, the ACK sent once the new holder has answered 20 new
//!   connections, about 100 ms after the move; `traffic::HalfOpen`) besides the 5 ms
//!   stream: how many long-lived connections break within 2 s of the
//!   move (keepalived: all of them, its new holder resets them), how many handshakes
//!   fail, and for havip how many were still open, and cut, when the drain ended.
//! - `planned-200`: 200 planned moves back and forth in one lab (`--moves`), a move at
//!   most every `--move-interval-ms` (default 1200: beyond the client's 1 s neighbour
//!   locktime) and no sooner than the system accepts it (havip: `admin failover` is
//!   retried until the target is a ready standby; keepalived, `nopreempt`: SIGTERM to the
//!   master, then started again as backup), with 4 concurrent streams of new connections
//!   (every 5 ms each) and 2 mid-handshake connections per move (their ACK sent as soon
//!   as every stream has seen the new holder: right after the flip): failed connects and
//!   resets over all moves (goal 0 each) and the per-move gap (the longest of the 4
//!   streams' gaps around the move) p50/p99. `--runs` does not apply: one lab each.
//!
//! For each (system, scenario) the median run's client probes around the move are
//! printed too (`"bench": "timeline"`: each probe's start and end relative to the last
//! answer of the old holder, and who answered); `bench-report` draws them as an SVG.
//!
//! Root only. `make bench-failover` and `make bench` run it; `--runs N` sets the runs per
//! scenario.

use clap::Parser;
use havip_e2e::agent::{AgentLab, PairOptions, SERVICE_PORT};
use havip_e2e::footprint;
use havip_e2e::keepalived::{Keepalived, KeepalivedConfig};
use havip_e2e::metallb::{MetalLbConfig, MetalLbLab};
use havip_e2e::netns::{Link, Topology};
use havip_e2e::traffic::{HalfOpen, Listener, LongLived, ProbeError, ProbeReport, Prober, ProberConfig};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

/// Failover benchmark: havip against keepalived and MetalLB.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Runs per (system, scenario).
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Only these systems (comma separated): havip, havip-fast (the Fast timing profile),
    /// keepalived-v2, keepalived-v3 (`advert_int 0.1`), keepalived-v3-30ms (`advert_int
    /// 0.03`), metallb-l2. Default: all of them, metallb-l2 only when its binaries are built
    /// (`bash hack/testbin.sh metallb` and `bash hack/testbin.sh control-plane`).
    #[arg(long)]
    systems: Option<String>,
    /// Only these scenarios (comma separated): cut, kill-then-cut, planned, planned-drain,
    /// planned-200 (the last two for havip and keepalived-v3 only).
    #[arg(long, default_value = "cut,kill-then-cut,planned,planned-drain,planned-200")]
    scenarios: String,
    /// Moves of `planned-200`.
    #[arg(long, default_value_t = 200)]
    moves: usize,
    /// `planned-200`: a move starts no sooner than this after the one before was
    /// accepted (ms; the client's neighbour locktime is 1 s).
    #[arg(long, default_value_t = 1200)]
    move_interval_ms: u64,
    /// Skip the idle footprint measurement.
    #[arg(long)]
    no_footprint: bool,
    /// VIP counts of the idle footprint measurement, one pair per count (comma separated,
    /// 1 to 109 each: the topology's VIP range).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100", value_parser = clap::value_parser!(u8).range(1..=109))]
    footprint_vips: Vec<u8>,
    /// Seconds of idle for the footprint measurement.
    #[arg(long, default_value_t = 30)]
    idle_seconds: u64,
    /// Systems of the idle measurement (comma separated): havip, havip-fast and the
    /// keepalived systems of `--systems`.
    #[arg(long, default_value = "havip,havip-fast,keepalived-v3,keepalived-v3-30ms")]
    idle_systems: String,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    Cut,
    KillThenCut,
    Planned,
    PlannedDrain,
    Planned200,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Cut => "cut",
            Scenario::KillThenCut => "kill-then-cut",
            Scenario::Planned => "planned",
            Scenario::PlannedDrain => "planned-drain",
            Scenario::Planned200 => "planned-200",
        }
    }

    /// The systems that can run it (None: every system).
    fn systems(self) -> Option<&'static [&'static str]> {
        match self {
            Scenario::PlannedDrain | Scenario::Planned200 => Some(&["havip", "keepalived-v3"]),
            _ => None,
        }
    }
}

/// One run's outcome.
struct Outcome {
    gap_ms: f64,
    failed: usize,
    new_holder_reached: bool,
    /// The client's probes from `TIMELINE_BEFORE_MS` before the last answer of the old
    /// holder to `TIMELINE_AFTER_MS` after the first answer of the new one: (start, end,
    /// responder), in ms relative to that last answer.
    timeline: Timeline,
    /// `planned-drain`: what became of the connections open or opening at the move.
    kept: Option<Kept>,
}

/// `planned-drain`: the connections that were open, or opening, when the VIP moved.
#[derive(Debug, Clone, Default)]
struct Kept {
    /// Long-lived connections open at the move.
    longlived: usize,
    /// Of those, broken within [`MOVE_WINDOW`] of the move.
    broken_in_move: usize,
    /// havip: broken when the drain ended (still open then).
    cut_at_drain_end: Option<usize>,
    /// How the long-lived connections broke (all of the run).
    break_kinds: BTreeMap<String, usize>,
    /// Connections in the middle of their handshake at the move.
    mid_handshake: usize,
    /// Of those, failed (reset or not answered).
    mid_handshake_failed: usize,
    /// The 5 ms stream's connections reset after they were set up.
    resets: usize,
}

/// `planned-drain` counts the long-lived connections that break within this of the move.
const MOVE_WINDOW: Duration = Duration::from_secs(2);
/// Long-lived connections of `planned-drain`.
const LONG_LIVED: usize = 20;
/// Mid-handshake connections of `planned-drain`.
const MID_HANDSHAKE: u16 = 4;
/// Concurrent client streams of `planned-200`.
const STREAMS: usize = 4;
/// Mid-handshake connections per move of `planned-200`.
const MID_HANDSHAKE_PER_MOVE: u16 = 2;

/// A run's probes around the move: (start ms, end ms, responder).
type Timeline = Vec<(f64, f64, Option<String>)>;

const TIMELINE_BEFORE_MS: f64 = 150.0;
const TIMELINE_AFTER_MS: f64 = 150.0;

/// The probes around the longest gap, relative to its start (see [`Outcome::timeline`]).
fn around_the_gap(report: &ProbeReport) -> Timeline {
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

fn finish(prober: Prober, new_holder: &str, deadline: Duration) -> Outcome {
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

fn cut_node(topo: &Topology, node: usize) -> Result<(), String> {
    topo.cut_cable(node, Link::Mgmt).map_err(|e| e.to_string())?;
    topo.cut_cable(node, Link::Data).map_err(|e| e.to_string())
}

fn run_havip(scenario: Scenario, fast_profile: bool) -> Result<Outcome, String> {
    let mut lab = AgentLab::start(PairOptions { fast_profile, ..Default::default() }).map_err(|e| e.to_string())?;
    lab.wait_sole_holder(0, Duration::from_secs(15)).map_err(|e| e.to_string())?;
    // The standby must be steady (heard, ready) before any scenario.
    std::thread::sleep(Duration::from_millis(1200));
    let prober = Prober::on_client(&lab.topo, lab.target()).map_err(|e| e.to_string())?;
    prober.wait_for_responder("n0", Duration::from_secs(5)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    match scenario {
        // The node dies: management first, so that the data-link carrier loss cannot
        // trigger a (faster) planned handover over the still-connected management path.
        Scenario::Cut => cut_node(&lab.topo, 0)?,
        Scenario::KillThenCut => {
            lab.kill_agent(0);
            std::thread::sleep(Duration::from_secs(2));
            cut_node(&lab.topo, 0)?;
        }
        Scenario::Planned => {
            let (ok, out) = lab.admin(0, &["failover"]);
            if !ok {
                return Err(format!("planned failover refused: {out}"));
            }
        }
        Scenario::PlannedDrain | Scenario::Planned200 => return Err(format!("{} runs elsewhere", scenario.name())),
    }
    let out = finish(prober, "n1", Duration::from_secs(15));
    if std::env::var_os("BENCH_VERBOSE").is_some() && out.gap_ms > 600.0 {
        eprintln!("{}", lab.logs_tail(40));
    }
    Ok(out)
}

/// keepalived's configuration for a system name: `keepalived-v2` (VRRPv2 defaults),
/// `keepalived-v3` (VRRPv3, `advert_int 0.1`, havip's default heartbeat) or
/// `keepalived-v3-30ms` (`advert_int 0.03`, the Fast profile's heartbeat).
fn keepalived_config(system: &str) -> Option<KeepalivedConfig> {
    match system {
        "keepalived-v2" => Some(KeepalivedConfig::v2_defaults()),
        "keepalived-v3" => Some(KeepalivedConfig::v3_fast()),
        "keepalived-v3-30ms" => {
            Some(KeepalivedConfig { advert_int: Duration::from_millis(30), ..KeepalivedConfig::v3_fast() })
        }
        _ => None,
    }
}

fn run_keepalived(scenario: Scenario, config: KeepalivedConfig) -> Result<Outcome, String> {
    let topo = Topology::builder().nodes(2).build().map_err(|e| e.to_string())?;
    let _l0 = Listener::on_node(&topo, 0, SERVICE_PORT).map_err(|e| e.to_string())?;
    let _l1 = Listener::on_node(&topo, 1, SERVICE_PORT).map_err(|e| e.to_string())?;
    let cfg = || config.clone();
    let vip = topo.vip(0);
    let mut k0 = Keepalived::start(&topo, 0, cfg().vip(vip, 24)).map_err(|e| e.to_string())?;
    let k1 = Keepalived::start(&topo, 1, cfg().vip(vip, 24)).map_err(|e| e.to_string())?;
    k0.wait_holds_vip(true, Duration::from_secs(15)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(500));
    let target = SocketAddr::new(IpAddr::V4(vip), SERVICE_PORT);
    let prober = Prober::on_client(&topo, target).map_err(|e| e.to_string())?;
    prober.wait_for_responder("n0", Duration::from_secs(5)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    match scenario {
        Scenario::Cut => cut_node(&topo, 0)?,
        Scenario::KillThenCut => {
            k0.kill();
            std::thread::sleep(Duration::from_secs(2));
            cut_node(&topo, 0)?;
        }
        Scenario::Planned => k0.stop_graceful(),
        Scenario::PlannedDrain | Scenario::Planned200 => return Err(format!("{} runs elsewhere", scenario.name())),
    }
    let out = finish(prober, "n1", Duration::from_secs(20));
    drop(k1);
    Ok(out)
}

/// MetalLB layer 2: the active is the node MetalLB elected to announce the Service's
/// address; `planned` is a SIGTERM to its speaker.
fn run_metallb(scenario: Scenario) -> Result<Outcome, String> {
    let mut lab = MetalLbLab::start(MetalLbConfig::default()).map_err(|e| e.to_string())?;
    let holder = lab.announcer_index().map_err(|e| e.to_string())?;
    let Some(other) = (0..lab.topo.nodes().len()).find(|i| *i != holder) else {
        return Err("no second node".into());
    };
    let (old, new) = (lab.topo.node(holder).name.clone(), lab.topo.node(other).name.clone());
    let prober = Prober::on_client(&lab.topo, lab.target()).map_err(|e| e.to_string())?;
    prober.wait_for_responder(&old, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    match scenario {
        Scenario::Cut => cut_node(&lab.topo, holder)?,
        Scenario::KillThenCut => {
            lab.kill_speaker(holder);
            std::thread::sleep(Duration::from_secs(2));
            cut_node(&lab.topo, holder)?;
        }
        Scenario::Planned => lab.terminate_speaker(holder).map_err(|e| e.to_string())?,
        Scenario::PlannedDrain | Scenario::Planned200 => {
            return Err(format!("{} is not measured for MetalLB", scenario.name()));
        }
    }
    // memberlist's failure detection takes seconds by design: a generous deadline.
    let out = finish(prober, &new, Duration::from_secs(30));
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        eprintln!("  metallb-l2: {old} announced first, {new} took over; announcers now {:?}", lab.announcers());
        if !out.new_holder_reached {
            eprintln!("{}", lab.logs_tail(40));
        }
    }
    Ok(out)
}

/// `admin failover` on member `from` of `lab`, retried every 50 ms until accepted (a
/// planned move starts only once the target is a ready standby) or `timeout`; returns
/// when the accepted attempt began.
fn havip_failover(lab: &AgentLab, from: usize, timeout: Duration) -> Result<Instant, String> {
    let start = Instant::now();
    loop {
        let attempt = Instant::now();
        let (ok, out) = lab.admin(from, &["failover"]);
        if ok {
            return Ok(attempt);
        }
        if start.elapsed() > timeout {
            return Err(format!("n{from}: failover refused for {timeout:?}: {}", out.trim()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The mid-handshake connections of a move from `ns` to `target`, from source ports
/// `[first, first + n)`.
fn half_open(ns: &str, target: SocketAddr, first: u16, n: u16) -> Result<HalfOpen, String> {
    HalfOpen::open(ns, target, first..first + n, Duration::from_secs(2)).map_err(|e| e.to_string())
}

/// Completes mid-handshake connections: how many, how many failed, and why.
fn complete(half: HalfOpen, kinds: &mut BTreeMap<String, usize>) -> (usize, usize) {
    let results = half.complete();
    let failed: Vec<&ProbeError> = results.iter().filter_map(|(_, r)| r.as_ref().err()).collect();
    for e in &failed {
        *kinds.entry(e.kind().to_owned()).or_insert(0) += 1;
    }
    (results.len(), failed.len())
}

/// `planned-drain` after the move was started at `moved` (an instant): lets the 5 ms
/// stream reach `new_holder`, completes the mid-handshake connections, counts the
/// long-lived connections broken within [`MOVE_WINDOW`].
fn finish_drain(
    prober: Prober,
    conns: &LongLived,
    half: HalfOpen,
    new_holder: &str,
    moved: Instant,
) -> (Outcome, BTreeMap<String, usize>) {
    let mut out = finish(prober, new_holder, Duration::from_secs(15));
    let mut kinds = BTreeMap::new();
    let (mid, mid_failed) = complete(half, &mut kinds);
    // The window is an observation period, not a wait for something.
    std::thread::sleep((moved + MOVE_WINDOW).saturating_duration_since(Instant::now()));
    let moved_ms = conns.ms_at(moved);
    let broken = conns
        .snapshot()
        .iter()
        .filter(|c| c.broken.as_ref().is_some_and(|b| b.t_ms < moved_ms + MOVE_WINDOW.as_secs_f64() * 1e3))
        .count();
    let resets = out.kept.as_ref().map_or(0, |k| k.resets);
    out.kept = Some(Kept {
        longlived: LONG_LIVED,
        broken_in_move: broken,
        cut_at_drain_end: None,
        break_kinds: BTreeMap::new(),
        mid_handshake: mid,
        mid_handshake_failed: mid_failed,
        resets,
    });
    (out, kinds)
}

fn break_kinds(conns: LongLived) -> BTreeMap<String, usize> {
    conns.stop().map(|r| r.break_kinds().into_iter().map(|(k, v)| (k.to_owned(), v)).collect()).unwrap_or_default()
}

/// `planned-drain` for havip (default `drainTimeout`): `admin failover` with long-lived
/// and mid-handshake connections; then waits for the drain to end and counts what it cut.
fn run_havip_drain() -> Result<Outcome, String> {
    let lab = AgentLab::start(PairOptions { echo_listeners: true, ..Default::default() }).map_err(|e| e.to_string())?;
    lab.wait_sole_holder(0, Duration::from_secs(15)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(1200));
    let client = lab.topo.client().ns.clone();
    let prober = Prober::on_client(&lab.topo, lab.target()).map_err(|e| e.to_string())?;
    prober.wait_for_responder("n0", Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let conns = LongLived::on_client(&lab.topo, lab.target(), LONG_LIVED).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    let half = half_open(&client, lab.target(), 20000, MID_HANDSHAKE)?;
    let moved = havip_failover(&lab, 0, Duration::from_secs(10))?;
    let (mut out, _) = finish_drain(prober, &conns, half, "n1", moved);
    // The drain's end: n0 no longer drains (its status), and what was open is cut.
    let draining = |lab: &AgentLab| lab.status(0).is_some_and(|s| !s["drainingUntilMs"].is_null());
    let ended = Instant::now();
    while draining(&lab) && ended.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Cut: those that outlived the move window and broke once the drain was over.
    let _ = conns.wait_broken(LONG_LIVED, Duration::from_secs(2));
    let after_window = conns.ms_at(moved + MOVE_WINDOW);
    let cut = conns.snapshot().iter().filter(|c| c.broken.as_ref().is_some_and(|b| b.t_ms >= after_window)).count();
    if let Some(k) = out.kept.as_mut() {
        k.cut_at_drain_end = Some(cut);
        k.break_kinds = break_kinds(conns);
    }
    Ok(out)
}

/// Echoing listeners on both nodes of a keepalived topology.
fn echo_listeners(topo: &Topology) -> Result<Vec<Listener>, String> {
    (0..2)
        .map(|i| {
            let n = topo.node(i);
            Listener::echo(&n.ns, &n.name, SocketAddr::from((Ipv4Addr::UNSPECIFIED, SERVICE_PORT)))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// `planned-drain` for keepalived: SIGTERM to the master (its planned handover) with
/// long-lived and mid-handshake connections.
fn run_keepalived_drain(config: KeepalivedConfig) -> Result<Outcome, String> {
    let topo = Topology::builder().nodes(2).build().map_err(|e| e.to_string())?;
    let _listeners = echo_listeners(&topo)?;
    let vip = topo.vip(0);
    let mut k0 = Keepalived::start(&topo, 0, config.clone().vip(vip, 24)).map_err(|e| e.to_string())?;
    let k1 = Keepalived::start(&topo, 1, config.vip(vip, 24)).map_err(|e| e.to_string())?;
    k0.wait_holds_vip(true, Duration::from_secs(15)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(500));
    let target = SocketAddr::new(IpAddr::V4(vip), SERVICE_PORT);
    let prober = Prober::on_client(&topo, target).map_err(|e| e.to_string())?;
    prober.wait_for_responder("n0", Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let conns = LongLived::on_client(&topo, target, LONG_LIVED).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    let half = half_open(&topo.client().ns, target, 20000, MID_HANDSHAKE)?;
    let moved = Instant::now();
    k0.stop_graceful();
    let (mut out, _) = finish_drain(prober, &conns, half, "n1", moved);
    if let Some(k) = out.kept.as_mut() {
        k.break_kinds = break_kinds(conns);
    }
    drop(k1);
    Ok(out)
}

/// What `planned-200` saw in one lab.
#[derive(Debug, Default)]
struct Many {
    /// Moves done.
    moves: usize,
    /// Per move: the longest gap of any stream around it (ms).
    gaps: Vec<f64>,
    /// Per move: how long the move waited to be accepted (ms).
    waits: Vec<f64>,
    failed_connects: usize,
    resets: usize,
    /// Connected, then no answer (read timeout, closed without reply, other).
    lost: usize,
    failure_kinds: BTreeMap<String, usize>,
    mid_handshake: usize,
    mid_handshake_failed: usize,
    mid_handshake_kinds: BTreeMap<String, usize>,
    /// The median move's probes around its gap.
    timeline: Timeline,
    /// The first failures of the streams: (move number, ms since that move began, kind,
    /// where the move went).
    failures_at: Vec<(usize, f64, String, String)>,
    /// Why it stopped before all moves, if it did.
    aborted: Option<String>,
}

/// A system that moves its VIP on request.
trait Mover {
    /// Starts a planned move away from member `from`; returns, once it was accepted,
    /// when it began (after any refused attempts).
    fn start_move(&mut self, from: usize) -> Result<Instant, String>;
    /// After the new holder `to` answered: until the move is complete (the old holder
    /// let go of the VIP on its interface, the system is ready for the next one).
    fn settle(&mut self, from: usize, to: usize) -> Result<(), String>;
}

struct HavipMover<'a>(&'a AgentLab);

impl Mover for HavipMover<'_> {
    fn start_move(&mut self, from: usize) -> Result<Instant, String> {
        // A move can wait for the target to become a ready standby again (and for a
        // drain to end, if the agent makes it wait): that time is reported.
        havip_failover(self.0, from, Duration::from_secs(30))
    }

    fn settle(&mut self, _from: usize, to: usize) -> Result<(), String> {
        self.0.wait_sole_holder(to, Duration::from_secs(10)).map(|_| ()).map_err(|e| e.to_string())
    }
}

struct KeepalivedMover {
    k: Vec<Keepalived>,
}

impl Mover for KeepalivedMover {
    fn start_move(&mut self, from: usize) -> Result<Instant, String> {
        let k = self.k.get_mut(from).ok_or("no such member")?;
        // The priority-0 advert goes out at the SIGTERM; the exit takes longer.
        let at = Instant::now();
        k.stop_graceful();
        Ok(at)
    }

    fn settle(&mut self, from: usize, to: usize) -> Result<(), String> {
        let new = self.k.get(to).ok_or("no such member")?;
        new.wait_holds_vip(true, Duration::from_secs(10)).map_err(|e| e.to_string())?;
        // Back as a backup (nopreempt): ready for the next move.
        let old = self.k.get_mut(from).ok_or("no such member")?;
        old.start_again().map_err(|e| e.to_string())?;
        old.wait_holds_vip(false, Duration::from_secs(10)).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// `planned-200`: `moves` planned moves back and forth between nodes 0 and 1 (node 0
/// holds the VIP at the start) in one lab, `interval` apart at least, with
/// [`STREAMS`] client streams and [`MID_HANDSHAKE_PER_MOVE`] mid-handshake
/// connections per move.
fn planned_many(
    topo: &Topology,
    target: SocketAddr,
    mover: &mut dyn Mover,
    moves: usize,
    interval: Duration,
) -> Result<Many, String> {
    let client = topo.client().ns.clone();
    let probers = Prober::start_many(&client, &ProberConfig::new(target), STREAMS).map_err(|e| e.to_string())?;
    let name = |i: usize| topo.node(i).name.clone();
    for p in &probers {
        p.wait_for_responder(&name(0), Duration::from_secs(5)).map_err(|e| e.to_string())?;
    }
    let mut many = Many::default();
    let mut accepted: Vec<Instant> = Vec::with_capacity(moves);
    let mut targets: Vec<String> = Vec::with_capacity(moves);
    let mut holder = 0usize;
    for m in 0..moves {
        let to = 1 - holder;
        let first = 20000 + u16::try_from((m * usize::from(MID_HANDSHAKE_PER_MOVE)) % 1000).unwrap_or(0);
        let step = (|| -> Result<(), String> {
            let half = half_open(&client, target, first, MID_HANDSHAKE_PER_MOVE)?;
            let asked = Instant::now();
            let at = mover.start_move(holder)?;
            many.waits.push(at.duration_since(asked).as_secs_f64() * 1e3);
            accepted.push(at);
            targets.push(name(to));
            for p in &probers {
                p.wait_for_responder(&name(to), Duration::from_secs(10)).map_err(|e| format!("move {}: {e}", m + 1))?;
            }
            let (n, failed) = complete(half, &mut many.mid_handshake_kinds);
            many.mid_handshake += n;
            many.mid_handshake_failed += failed;
            mover.settle(holder, to).map_err(|e| format!("move {}: {e}", m + 1))?;
            std::thread::sleep((at + interval).saturating_duration_since(Instant::now()));
            Ok(())
        })();
        if let Err(e) = step {
            many.aborted = Some(e);
            break;
        }
        holder = to;
        many.moves += 1;
        if (m + 1) % 20 == 0 {
            eprintln!("  {} moves", m + 1);
        }
    }
    // Let every stream answer after the last move.
    for p in &probers {
        let _ = p.wait_until_ok(p.ok_count() + 20, Duration::from_secs(2));
    }
    let epochs: Vec<Instant> = probers.iter().map(Prober::epoch).collect();
    let reports: Vec<ProbeReport> =
        probers.into_iter().map(|p| p.stop().map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
    for r in &reports {
        many.failed_connects += r.failed_connects();
        many.resets += r.resets();
        many.lost += r.failed - r.failed_connects() - r.resets();
        for (k, v) in r.failure_kinds() {
            *many.failure_kinds.entry(k.to_owned()).or_insert(0) += v;
        }
    }
    // Per move: the window from just before it to just before the next; its gap is the
    // longest of the streams' gaps in it (each stream's times count from its own epoch).
    let mut per_move: Vec<(f64, Timeline)> = Vec::new();
    for (i, at) in accepted.iter().enumerate().take(many.moves) {
        let next = accepted.get(i + 1);
        let mut worst: Option<(f64, Timeline)> = None;
        for (r, epoch) in reports.iter().zip(&epochs) {
            let ms = |t: &Instant| t.duration_since(*epoch).as_secs_f64() * 1e3;
            let slice = r.slice(ms(at) - 100.0, next.map_or(f64::INFINITY, |n| ms(n) - 100.0));
            if worst.as_ref().is_none_or(|(g, _)| slice.longest_gap_ms > *g) {
                worst = Some((slice.longest_gap_ms, around_the_gap(&slice)));
            }
        }
        if let Some(w) = worst {
            many.gaps.push(w.0);
            per_move.push(w);
        }
    }
    // Where the failures were, relative to the move before them (at most 20).
    for (r, epoch) in reports.iter().zip(&epochs) {
        let ms = |t: &Instant| t.duration_since(*epoch).as_secs_f64() * 1e3;
        for f in &r.failures {
            let i = accepted.iter().rposition(|a| ms(a) <= f.start_ms);
            let (n, since, to) = match i {
                Some(i) => (i + 1, f.start_ms - ms(&accepted[i]), targets.get(i).cloned().unwrap_or_default()),
                None => (0, f.start_ms, String::new()),
            };
            many.failures_at.push((n, (since * 10.0).round() / 10.0, f.kind.kind().to_owned(), to));
        }
    }
    many.failures_at.sort_by(|a, b| (a.0, a.1).partial_cmp(&(b.0, b.1)).unwrap_or(std::cmp::Ordering::Equal));
    many.failures_at.truncate(20);
    per_move.sort_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((_, t)) = per_move.get(per_move.len().saturating_sub(1) / 2) {
        many.timeline = t.clone();
    }
    Ok(many)
}

/// The `planned-drain` fields of a (system, scenario) line, over its runs.
fn kept_fields(kept: &[Kept]) -> serde_json::Map<String, serde_json::Value> {
    let max = |f: fn(&Kept) -> usize| kept.iter().map(f).max();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for k in kept {
        for (kind, n) in &k.break_kinds {
            *kinds.entry(kind.clone()).or_insert(0) += n;
        }
    }
    let cut = kept.iter().filter_map(|k| k.cut_at_drain_end).max();
    let mut m = serde_json::Map::new();
    m.insert("longlived_connections".into(), json!(LONG_LIVED));
    m.insert("longlived_broken_max".into(), json!(max(|k| k.broken_in_move)));
    m.insert("longlived_broken_total".into(), json!(kept.iter().map(|k| k.broken_in_move).sum::<usize>()));
    m.insert("longlived_cut_at_drain_end_max".into(), json!(cut));
    m.insert("longlived_break_kinds".into(), json!(kinds));
    m.insert("mid_handshake_per_run".into(), json!(MID_HANDSHAKE));
    m.insert("mid_handshake_failed_max".into(), json!(max(|k| k.mid_handshake_failed)));
    m.insert("resets_max".into(), json!(max(|k| k.resets)));
    m
}

fn print_timeline(system: &str, scenario: &str, gap: f64, probes: &Timeline) {
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

/// Prints `planned-200`'s line (and its median move's timeline); returns the per-move
/// gap p50 and p99.
fn print_many(system: &str, many: &Many, asked: usize) -> (f64, f64) {
    let mut gaps = many.gaps.clone();
    gaps.sort_by(|a, b| a.total_cmp(b));
    let mut waits = many.waits.clone();
    waits.sort_by(|a, b| a.total_cmp(b));
    let (p50, p99) = (percentile(&gaps, 50.0), percentile(&gaps, 99.0));
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    eprintln!(
        "{system} planned-200: {} moves, per-move gap p50 {:.1} ms p99 {:.1} ms, {} failed connects, {} resets, {} lost {:?}, mid-handshake {}/{} failed {:?}{}",
        many.moves,
        p50,
        p99,
        many.failed_connects,
        many.resets,
        many.lost,
        many.failure_kinds,
        many.mid_handshake_failed,
        many.mid_handshake,
        many.mid_handshake_kinds,
        many.aborted.as_ref().map(|e| format!("; stopped: {e}")).unwrap_or_default()
    );
    println!(
        "{}",
        json!({
            "system": system,
            "scenario": "planned-200",
            "runs": 1,
            "moves": many.moves,
            "moves_asked": asked,
            "streams": STREAMS,
            "p50_gap_ms": r1(p50),
            "p99_gap_ms": r1(p99),
            "max_gap_ms": gaps.last().map(|g| r1(*g)),
            "failed_connects_max": many.failed_connects,
            "failed_connects_total": many.failed_connects,
            "resets_total": many.resets,
            "lost_after_connect_total": many.lost,
            "failure_kinds": many.failure_kinds,
            "mid_handshake": many.mid_handshake,
            "mid_handshake_failed": many.mid_handshake_failed,
            "mid_handshake_kinds": many.mid_handshake_kinds,
            "move_wait_p50_ms": r1(percentile(&waits, 50.0)),
            "move_wait_max_ms": waits.last().map(|w| r1(*w)),
            "failures_near_moves": many.failures_at.iter().map(|(n, ms, kind, to)| json!({"move": n, "ms_after_move": ms, "kind": kind, "to": to})).collect::<Vec<_>>(),
            "runs_without_takeover": usize::from(many.aborted.is_some()),
            "stopped": many.aborted,
        })
    );
    if !many.timeline.is_empty() {
        let gap = percentile(&gaps, 50.0);
        print_timeline(system, "planned-200", gap, &many.timeline);
    }
    (p50, p99)
}

/// `planned-200` for havip (default `drainTimeout`).
fn run_havip_many(moves: usize, interval: Duration) -> Result<Many, String> {
    let lab = AgentLab::start(PairOptions { echo_listeners: true, ..Default::default() }).map_err(|e| e.to_string())?;
    lab.wait_sole_holder(0, Duration::from_secs(15)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(1200));
    let many = planned_many(&lab.topo, lab.target(), &mut HavipMover(&lab), moves, interval)?;
    if many.aborted.is_some() && std::env::var_os("BENCH_VERBOSE").is_some() {
        eprintln!("{}", lab.diagnostics());
    }
    Ok(many)
}

/// `planned-200` for keepalived (`nopreempt`: a move is a SIGTERM to the master and a
/// start of it as backup).
fn run_keepalived_many(config: KeepalivedConfig, moves: usize, interval: Duration) -> Result<Many, String> {
    let topo = Topology::builder().nodes(2).build().map_err(|e| e.to_string())?;
    let _listeners = echo_listeners(&topo)?;
    let vip = topo.vip(0);
    let cfg = config.nopreempt(true).vip(vip, 24);
    // Node 0 first, alone until it is master, so that it holds the VIP at the start.
    let k0 = Keepalived::start(&topo, 0, cfg.clone()).map_err(|e| e.to_string())?;
    k0.wait_holds_vip(true, Duration::from_secs(15)).map_err(|e| e.to_string())?;
    let k1 = Keepalived::start(&topo, 1, cfg).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(500));
    let mut mover = KeepalivedMover { k: vec![k0, k1] };
    let target = SocketAddr::new(IpAddr::V4(vip), SERVICE_PORT);
    let many = planned_many(&topo, target, &mut mover, moves, interval)?;
    if many.aborted.is_some() && std::env::var_os("BENCH_VERBOSE").is_some() {
        for k in &mover.k {
            eprintln!("--- {} ---\n{}", k.node(), k.log_tail(30));
        }
    }
    Ok(many)
}

/// Why `metallb-l2` cannot run here, if it cannot: MetalLB or the control plane not built.
fn metallb_missing() -> Option<String> {
    if let Err(e) = havip_e2e::testbin::MetalLbBin::find() {
        return Some(e.to_string());
    }
    havip_e2e::testbin::TestBin::find()
        .err()
        .map(|e| format!("{e} (build it with `bash hack/testbin.sh control-plane`)"))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// [`footprint::measure`] of each node's daemon, with the packets each node sent in the
/// window (every interface: the daemons' own traffic, the lab sends nothing else).
fn measure_nodes(topo: &Topology, pids: &[u32], window: Duration) -> Vec<(footprint::Usage, u64, u64, Option<u64>)> {
    let ns: Vec<String> = topo.nodes().iter().map(|n| n.ns.clone()).collect();
    let before: Vec<Option<u64>> = ns.iter().map(|n| footprint::tx_packets(n)).collect();
    let usage = footprint::measure(pids, window);
    usage
        .into_iter()
        .zip(ns.iter().zip(before))
        .map(|((u, rss, private), (n, b))| {
            (u, rss, private, footprint::tx_packets(n).zip(b).map(|(a, b)| a.saturating_sub(b)))
        })
        .collect()
}

/// One idle measurement: `system` holding `vips` addresses on two nodes, both daemons
/// measured over the same window (CPU time, wakeups and RSS of each process tree).
fn idle(system: &str, vips: u8, window: Duration) -> Result<serde_json::Value, String> {
    let settle = Duration::from_secs(3);
    let (usage, profile) = match system {
        "havip" | "havip-fast" => {
            let fast = system == "havip-fast";
            let lab = AgentLab::start(PairOptions { vips, fast_profile: fast, ..Default::default() })
                .map_err(|e| e.to_string())?;
            lab.wait_sole_holder(0, Duration::from_secs(20)).map_err(|e| e.to_string())?;
            std::thread::sleep(settle);
            let pid = |i: usize| lab.agents[i].as_ref().and_then(|p| p.pid());
            let (Some(p0), Some(p1)) = (pid(0), pid(1)) else { return Err("agent not running".into()) };
            let usage = measure_nodes(&lab.topo, &[p0, p1], window);
            let profile = if fast {
                "Fast: heartbeat 30 ms, timeout 90 ms"
            } else {
                "Standard: heartbeat 100 ms, timeout 300 ms"
            };
            (usage, profile.to_owned())
        }
        k if keepalived_config(k).is_some() => {
            let topo = Topology::builder().nodes(2).build().map_err(|e| e.to_string())?;
            let _l0 = Listener::on_node(&topo, 0, SERVICE_PORT).map_err(|e| e.to_string())?;
            let _l1 = Listener::on_node(&topo, 1, SERVICE_PORT).map_err(|e| e.to_string())?;
            let base = keepalived_config(k).unwrap_or_else(KeepalivedConfig::v3_fast);
            let cfg = || base.clone().vip(topo.vip_at(0), 24).more_vips((1..vips).map(|j| (topo.vip_at(j), 24)));
            let k0 = Keepalived::start(&topo, 0, cfg()).map_err(|e| e.to_string())?;
            let k1 = Keepalived::start(&topo, 1, cfg()).map_err(|e| e.to_string())?;
            k0.wait_holds_vip(true, Duration::from_secs(15)).map_err(|e| e.to_string())?;
            std::thread::sleep(settle);
            let (Some(p0), Some(p1)) = (k0.pid(), k1.pid()) else { return Err("keepalived not running".into()) };
            let profile = format!("VRRPv{}, advert_int {} ms", base.version, base.advert_int.as_millis());
            (measure_nodes(&topo, &[p0, p1], window), profile)
        }
        other => return Err(format!("unknown system {other}")),
    };
    let [(active, active_rss, active_private, active_pkts), (standby, standby_rss, standby_private, standby_pkts)] =
        <[_; 2]>::try_from(usage).map_err(|_| "two nodes expected")?;
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    let per_s = |p: Option<u64>| p.map(|p| r1(p as f64 / active.window_s));
    Ok(json!({
        "bench": "idle",
        "system": system,
        "profile": profile,
        "vips": vips,
        "window_s": r1(active.window_s),
        "cpu_ms_per_min_total": r1(active.cpu_ms_per_min + standby.cpu_ms_per_min),
        "packets_per_s_total": per_s(active_pkts.zip(standby_pkts).map(|(a, b)| a + b)),
        "active": {"cpu_ms_per_min": r1(active.cpu_ms_per_min), "wakeups_per_s": r1(active.wakeups_per_s), "rss_kib": active_rss, "private_kib": active_private, "threads_exited": active.threads_exited, "packets_per_s": per_s(active_pkts)},
        "standby": {"cpu_ms_per_min": r1(standby.cpu_ms_per_min), "wakeups_per_s": r1(standby.wakeups_per_s), "rss_kib": standby_rss, "private_kib": standby_private, "threads_exited": standby.threads_exited, "packets_per_s": per_s(standby_pkts)},
    }))
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(why) = havip_e2e::netns::require_root() {
        eprintln!("bench-failover needs root (network namespaces): {why}");
        return std::process::ExitCode::FAILURE;
    }
    let metallb_missing = metallb_missing();
    let asked = args
        .systems
        .clone()
        .unwrap_or_else(|| "havip,havip-fast,keepalived-v2,keepalived-v3,keepalived-v3-30ms,metallb-l2".to_owned());
    let mut systems: Vec<&str> = asked.split(',').collect();
    if let Some(why) = &metallb_missing
        && systems.contains(&"metallb-l2")
    {
        eprintln!("metallb-l2: skipped: {why}");
        println!("{}", json!({"system": "metallb-l2", "skipped": why}));
        systems.retain(|s| *s != "metallb-l2");
    }
    let scenarios: Vec<Scenario> = args
        .scenarios
        .split(',')
        .filter_map(|s| match s {
            "cut" => Some(Scenario::Cut),
            "kill-then-cut" => Some(Scenario::KillThenCut),
            "planned" => Some(Scenario::Planned),
            "planned-drain" => Some(Scenario::PlannedDrain),
            "planned-200" => Some(Scenario::Planned200),
            _ => None,
        })
        .collect();
    let mut results: Vec<(String, Scenario, f64, f64, usize)> = Vec::new();
    let mut failed_runs = 0;
    for scenario in &scenarios {
        for system in &systems {
            if let Some(only) = scenario.systems()
                && !only.contains(system)
            {
                eprintln!("{system} {}: not measured (only {})", scenario.name(), only.join(", "));
                continue;
            }
            if *scenario == Scenario::Planned200 {
                let interval = Duration::from_millis(args.move_interval_ms);
                let r = match *system {
                    "havip" => run_havip_many(args.moves, interval),
                    other => match keepalived_config(other) {
                        Some(c) => run_keepalived_many(c, args.moves, interval),
                        None => Err(format!("unknown system {other}")),
                    },
                };
                match r {
                    Ok(many) => {
                        let (p50, p99) = print_many(system, &many, args.moves);
                        if many.aborted.is_some() {
                            failed_runs += 1;
                        }
                        results.push(((*system).to_owned(), *scenario, p50, p99, many.failed_connects));
                    }
                    Err(e) => {
                        failed_runs += 1;
                        eprintln!("{system} {}: error: {e}", scenario.name());
                    }
                }
                continue;
            }
            let mut gaps = Vec::new();
            let mut timelines: Vec<(f64, Timeline)> = Vec::new();
            let mut failed_max = 0usize;
            let mut unreached = 0;
            let mut kept: Vec<Kept> = Vec::new();
            for run in 0..args.runs {
                let r = match (*scenario, *system) {
                    (Scenario::PlannedDrain, "havip") => run_havip_drain(),
                    (Scenario::PlannedDrain, other) => match keepalived_config(other) {
                        Some(c) => run_keepalived_drain(c),
                        None => Err(format!("unknown system {other}")),
                    },
                    (_, "havip") => run_havip(*scenario, false),
                    (_, "havip-fast") => run_havip(*scenario, true),
                    (_, "metallb-l2") => run_metallb(*scenario),
                    (_, other) => match keepalived_config(other) {
                        Some(c) => run_keepalived(*scenario, c),
                        None => Err(format!("unknown system {other}")),
                    },
                };
                match r {
                    Ok(o) => {
                        if !o.new_holder_reached {
                            unreached += 1;
                        }
                        let extra = match (&o.kept, *scenario) {
                            (Some(k), Scenario::PlannedDrain) => format!(
                                ", {}/{} long-lived broken in the move{}, {}/{} mid-handshake failed, {} resets",
                                k.broken_in_move,
                                k.longlived,
                                k.cut_at_drain_end
                                    .map(|c| format!(" ({c} cut at the drain's end)"))
                                    .unwrap_or_default(),
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
                        if *scenario == Scenario::PlannedDrain
                            && let Some(k) = o.kept
                        {
                            kept.push(k);
                        }
                    }
                    Err(e) => {
                        failed_runs += 1;
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
            if *scenario == Scenario::PlannedDrain
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
            results.push(((*system).to_owned(), *scenario, p50, p99, failed_max));
        }
        // Ratios of each havip profile to each other system, for this scenario.
        let here: Vec<_> = results.iter().filter(|r| r.1 == *scenario).collect();
        for (h, _, h50, h99, _) in here.iter().filter(|r| r.0.starts_with("havip")) {
            for (sys, _, k50, k99, _) in here.iter().filter(|r| !r.0.starts_with("havip")) {
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
    if !args.no_footprint {
        for &vips in &args.footprint_vips {
            let mut totals: Vec<(String, f64)> = Vec::new();
            for system in args.idle_systems.split(',') {
                match idle(system, vips, Duration::from_secs(args.idle_seconds)) {
                    Ok(v) => {
                        println!("{v}");
                        if let Some(t) = v["cpu_ms_per_min_total"].as_f64() {
                            totals.push((system.to_owned(), t));
                        }
                    }
                    Err(e) => {
                        failed_runs += 1;
                        eprintln!("idle {system} with {vips} VIPs: error: {e}");
                    }
                }
            }
            // Ratios of each havip profile to each keepalived, same VIP count, same run.
            for (h, t) in totals.iter().filter(|(s, _)| s.starts_with("havip")) {
                for (k, kt) in totals.iter().filter(|(s, _)| s.starts_with("keepalived")) {
                    let ratio = ((t / kt) * 100.0).round() / 100.0;
                    println!(
                        "{}",
                        json!({"ratio": format!("{h}/{k}"), "bench": "idle", "vips": vips, "cpu_ratio": ratio})
                    );
                }
            }
        }
    }
    if failed_runs > 0 {
        eprintln!("{failed_runs} runs failed");
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
