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
use havip_e2e::footprint;
use havip_e2e::keepalived::{Keepalived, KeepalivedConfig};
use havip_e2e::metallb::{MetalLbConfig, MetalLbLab};
use havip_e2e::netns::{Link, Topology};
use havip_e2e::traffic::{Listener, ProbeReport, Prober};
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

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
                    "havip" => run_havip(*scenario, false),
                    "havip-fast" => run_havip(*scenario, true),
                    "metallb-l2" => run_metallb(*scenario),
                    other => match keepalived_config(other) {
                        Some(c) => run_keepalived(*scenario, c),
                        None => Err(format!("unknown system {other}")),
                    },
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
