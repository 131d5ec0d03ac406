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
//! For each (system, scenario) the median run's client probes around the move are
//! printed too (`"bench": "timeline"`: each probe's start and end relative to the last
//! answer of the old holder, and who answered); `bench-report` draws them as an SVG.
//!
//! Root only. `make bench-failover` and `make bench` run it; `--runs N` sets the runs per
//! scenario.

use clap::Parser;
use havip_e2e::agent::{AgentLab, PairOptions, SERVICE_PORT};
use havip_e2e::keepalived::{Keepalived, KeepalivedConfig};
use havip_e2e::metallb::{MetalLbConfig, MetalLbLab};
use havip_e2e::netns::{Link, Topology};
use havip_e2e::traffic::{Listener, ProbeReport, Prober};
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Failover benchmark: havip against keepalived and MetalLB.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Runs per (system, scenario).
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Only these systems (comma separated): havip, keepalived-v2, keepalived-v3,
    /// metallb-l2. Default: all four, metallb-l2 only when its binaries are built
    /// (`bash hack/testbin.sh metallb` and `bash hack/testbin.sh control-plane`).
    #[arg(long)]
    systems: Option<String>,
    /// Only these scenarios (comma separated): cut, kill-then-cut, planned.
    #[arg(long, default_value = "cut,kill-then-cut,planned")]
    scenarios: String,
    /// Skip the idle footprint measurement.
    #[arg(long)]
    no_footprint: bool,
    /// VIP counts of the idle footprint measurement, one pair per count (comma separated,
    /// 1 to 109 each: the topology's VIP range).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100", value_parser = clap::value_parser!(u8).range(1..=109))]
    footprint_vips: Vec<u8>,
    /// Seconds of idle for the footprint measurement.
    #[arg(long, default_value_t = 20)]
    idle_seconds: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    Cut,
    KillThenCut,
    Planned,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Cut => "cut",
            Scenario::KillThenCut => "kill-then-cut",
            Scenario::Planned => "planned",
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
}

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
            return Outcome { gap_ms: f64::NAN, failed: usize::MAX, new_holder_reached: false, timeline: Vec::new() };
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
    }
}

fn cut_node(topo: &Topology, node: usize) -> Result<(), String> {
    topo.cut_cable(node, Link::Mgmt).map_err(|e| e.to_string())?;
    topo.cut_cable(node, Link::Data).map_err(|e| e.to_string())
}

fn run_havip(scenario: Scenario) -> Result<Outcome, String> {
    let mut lab = AgentLab::start(PairOptions::default()).map_err(|e| e.to_string())?;
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
    }
    let out = finish(prober, "n1", Duration::from_secs(15));
    if std::env::var_os("BENCH_VERBOSE").is_some() && out.gap_ms > 600.0 {
        eprintln!("{}", lab.logs_tail(40));
    }
    Ok(out)
}

fn run_keepalived(scenario: Scenario, v3: bool) -> Result<Outcome, String> {
    let topo = Topology::builder().nodes(2).build().map_err(|e| e.to_string())?;
    let _l0 = Listener::on_node(&topo, 0, SERVICE_PORT).map_err(|e| e.to_string())?;
    let _l1 = Listener::on_node(&topo, 1, SERVICE_PORT).map_err(|e| e.to_string())?;
    let cfg = || if v3 { KeepalivedConfig::v3_fast() } else { KeepalivedConfig::v2_defaults() };
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

fn rss_and_cpu(pid: u32, window: Duration) -> Option<(u64, f64)> {
    let ticks = || -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name (which may contain spaces) start after ") ".
        let rest = stat.rsplit_once(") ")?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    };
    let t0 = ticks()?;
    let start = Instant::now();
    std::thread::sleep(window);
    let t1 = ticks()?;
    let hz = 100.0; // USER_HZ on Linux
    let cpu = (t1 - t0) as f64 / hz / start.elapsed().as_secs_f64() * 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some((rss_kib, cpu))
}

fn footprint(vips: u8, idle: Duration) -> Result<serde_json::Value, String> {
    let lab = AgentLab::start(PairOptions { vips, ..Default::default() }).map_err(|e| e.to_string())?;
    lab.wait_sole_holder(0, Duration::from_secs(20)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_secs(3));
    let pid = |i: usize| lab.agents[i].as_ref().and_then(|p| p.pid());
    let (Some(p0), Some(p1)) = (pid(0), pid(1)) else { return Err("agent not running".into()) };
    let h = std::thread::spawn(move || rss_and_cpu(p1, idle));
    let active = rss_and_cpu(p0, idle).ok_or("cannot read /proc for the active")?;
    let standby = h.join().ok().flatten().ok_or("cannot read /proc for the standby")?;
    Ok(json!({
        "bench": "agent-idle-footprint",
        "vips": vips,
        "idle_seconds": idle.as_secs(),
        "active_rss_kib": active.0,
        "active_cpu_percent": (active.1 * 100.0).round() / 100.0,
        "standby_rss_kib": standby.0,
        "standby_cpu_percent": (standby.1 * 100.0).round() / 100.0,
    }))
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(why) = havip_e2e::netns::require_root() {
        eprintln!("bench-failover needs root (network namespaces): {why}");
        return std::process::ExitCode::FAILURE;
    }
    let metallb_missing = metallb_missing();
    let asked = args.systems.clone().unwrap_or_else(|| "havip,keepalived-v2,keepalived-v3,metallb-l2".to_owned());
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
            _ => None,
        })
        .collect();
    let mut results: Vec<(String, Scenario, f64, f64, usize)> = Vec::new();
    let mut failed_runs = 0;
    for scenario in &scenarios {
        for system in &systems {
            let mut gaps = Vec::new();
            let mut timelines: Vec<(f64, Timeline)> = Vec::new();
            let mut failed_max = 0usize;
            let mut unreached = 0;
            for run in 0..args.runs {
                let r = match *system {
                    "havip" => run_havip(*scenario),
                    "keepalived-v2" => run_keepalived(*scenario, false),
                    "keepalived-v3" => run_keepalived(*scenario, true),
                    "metallb-l2" => run_metallb(*scenario),
                    other => Err(format!("unknown system {other}")),
                };
                match r {
                    Ok(o) => {
                        if !o.new_holder_reached {
                            unreached += 1;
                        }
                        eprintln!(
                            "{system} {} run {}: gap {:.1} ms, {} failed connects{}",
                            scenario.name(),
                            run + 1,
                            o.gap_ms,
                            o.failed,
                            if o.new_holder_reached { "" } else { " (new holder never answered)" }
                        );
                        gaps.push(o.gap_ms);
                        failed_max = failed_max.max(o.failed);
                        timelines.push((o.gap_ms, o.timeline));
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
            println!(
                "{}",
                json!({
                    "system": system,
                    "scenario": scenario.name(),
                    "runs": gaps.len(),
                    "p50_gap_ms": (p50 * 10.0).round() / 10.0,
                    "p99_gap_ms": (p99 * 10.0).round() / 10.0,
                    "max_gap_ms": gaps.last().map(|g| (g * 10.0).round() / 10.0),
                    "failed_connects_max": failed_max,
                    "runs_without_takeover": unreached,
                })
            );
            // The median run's probes, for the picture.
            timelines.sort_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((gap, probes)) = timelines.get(timelines.len().saturating_sub(1) / 2) {
                println!(
                    "{}",
                    json!({
                        "bench": "timeline",
                        "system": system,
                        "scenario": scenario.name(),
                        "gap_ms": (gap * 10.0).round() / 10.0,
                        "interval_ms": 5,
                        "probes": probes.iter().map(|(s, e, who)| json!([s, e, who])).collect::<Vec<_>>(),
                    })
                );
            }
            results.push(((*system).to_owned(), *scenario, p50, p99, failed_max));
        }
        // Ratios havip / keepalived for this scenario.
        if let Some((_, _, h50, h99, _)) = results.iter().find(|r| r.0 == "havip" && r.1 == *scenario).cloned() {
            for (sys, _, k50, k99, _) in results.iter().filter(|r| r.0 != "havip" && r.1 == *scenario) {
                println!(
                    "{}",
                    json!({
                        "ratio": format!("havip/{sys}"),
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
            match footprint(vips, Duration::from_secs(args.idle_seconds)) {
                Ok(v) => println!("{v}"),
                Err(e) => {
                    failed_runs += 1;
                    eprintln!("footprint with {vips} VIPs: error: {e}");
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
