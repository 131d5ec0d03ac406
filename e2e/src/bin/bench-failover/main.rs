//! `bench-failover`: failover gaps of havip, keepalived and MetalLB (layer 2 and BGP), side by
//! side, in the same network-namespace topology, as JSON lines.
//!
//! A client in its own namespace starts a connection to VIP:8080 every 5 ms, each with a
//! 50 ms timeout, without waiting for the earlier ones (`ProberConfig::overlapping`: a gap
//! ends within 5 ms of service returning, not within one timeout)
//! (each member runs a listener that names itself) and records the longest gap between
//! successful connects and the number of failed connects, for three scenarios:
//! `cut` (the active's cables are pulled), `kill-then-cut` (the active's HA daemon is
//! SIGKILLed, then its cables pulled 2 s later) and `planned` (havip: `admin failover`;
//! keepalived: SIGTERM, its priority-0 handover; MetalLB: SIGTERM to the announcing node's
//! speaker, which leaves memberlist). Systems: `havip` (defaults), `keepalived-v2` (Debian
//! keepalived, VRRPv2 defaults), `keepalived-v3` (VRRPv3, `advert_int 0.1`) and
//! `metallb-l2` (MetalLB v0.15.2 in layer-2 mode with its defaults, on a local control
//! plane: see `havip_e2e::baselines::metallb`; the active is whichever node MetalLB elects to
//! announce), and the routed `havip-bgp` / `havip-bgp-fast` (`announce.mode: BGP` on a
//! router namespace running FRR with BFD 100 ms × 3 that peers with FRR on both members,
//! the client in another subnet behind it: see `havip_e2e::bgp`; their ratios are taken
//! against routed systems only), beside `metallb-bgp` (MetalLB's native BGP speaker at
//! its defaults, peering with the same router: holdTime 90 s, so the session's hold time
//! is the router's 9 s) and `metallb-bgp-3s` (`holdTime: 3s`, the shortest it accepts;
//! its native speaker has no BFD). The MetalLB systems are in the default list only when
//! `hack/testbin.sh metallb` and `hack/testbin.sh control-plane` have built their
//! binaries (and, for BGP, FRR is installed); otherwise each prints a
//! `{"system":"metallb-…","skipped":…}` line and the run goes on. Then the havip agent's idle RSS
//! and CPU with each VIP count of `--footprint-vips` (default 1, 10 and 100).
//!
//! `static-arp` (issue 31) is `cut` with the client's neighbour entry of the VIP pinned
//! (`nud permanent`) to the MAC it resolved before the cut, as a router with a static ARP
//! entry: `havip-vmac` (`virtualMAC`, the VIP's MAC moves with it) and `keepalived-v3-vmac`
//! (`use_vmac`) follow the VIP; `havip` and `keepalived-v3` are the controls (their new
//! holder is never reached: the run waits 5 s and counts it in `runs_without_takeover`).
//! The `-vmac` systems also run `cut`.
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
//! `mass-cut` (issue 30): `--mass-pairs` pairs of one VIP each on the same two nodes
//! (keepalived: as many VRRP instances), every one held by n0; n0 is cut as a dead node
//! goes and the client probes every VIP at once: the gap of the first and of the **last**
//! pair (p50/p99 over `--runs` fresh labs). The idle measurement gains a pairs dimension
//! (`--idle-pairs`: that many pairs of one VIP, keepalived with as many instances).
//!
//! For each (system, scenario) the median run's client probes around the move are
//! printed too (`"bench": "timeline"`: each probe's start and end relative to the last
//! answer of the old holder, and who answered); `bench-report` draws them as an SVG.
//!
//! Root only. `make bench-failover` and `make bench` run it; `--runs N` sets the runs per
//! scenario.

mod apiserver;
mod drain;
mod idle;
mod many;
mod mass;
mod moves;
mod runs;
mod single;
mod systems;

use clap::Parser;
use moves::Scenario;
use runs::Summary;
use serde_json::json;
use std::time::Duration;
use systems::metallb_missing;

/// Failover benchmark: havip against keepalived and MetalLB.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Runs per (system, scenario).
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Only these systems (comma separated): havip, havip-fast (the Fast timing profile),
    /// havip-vmac (`virtualMAC`), keepalived-v2, keepalived-v3 (`advert_int 0.1`),
    /// keepalived-v3-30ms (`advert_int 0.03`), keepalived-v3-vmac (`use_vmac`), metallb-l2, havip-bgp and havip-bgp-fast (routed: FRR on a router and the
    /// members, the client behind the router), havip-bgp-fast-backup (Fast with backup
    /// paths and BFD 50 ms × 3), metallb-bgp and metallb-bgp-3s (MetalLB's
    /// BGP speaker peering with that router; holdTime default and 3 s). Default: all of
    /// them, MetalLB's only when its binaries are built (`bash hack/testbin.sh metallb` and
    /// `bash hack/testbin.sh control-plane`), the routed ones only when FRR is installed.
    #[arg(long)]
    systems: Option<String>,
    /// Only these scenarios (comma separated): cut, kill-then-cut, planned, planned-drain,
    /// planned-200 (the last two for havip and keepalived-v3 only), static-arp (havip,
    /// havip-vmac, keepalived-v3, keepalived-v3-vmac), and the control-plane
    /// VIP's api-planned, api-kill, api-cut (for `--api-systems`; see `apiserver.rs`), and
    /// mass-cut (`--mass-pairs` pairs on the same two nodes, the holder of all cut; see
    /// `mass.rs`).
    #[arg(
        long,
        default_value = "cut,kill-then-cut,planned,planned-drain,planned-200,static-arp,mass-cut,api-planned,api-kill,api-cut"
    )]
    scenarios: String,
    /// Systems of the control-plane scenarios (comma separated): havip-cp,
    /// keepalived-kubeadm (the kubeadm HA guide's keepalived.conf and check_apiserver.sh),
    /// keepalived-kubeadm-tuned.
    #[arg(long, default_value = "havip-cp,keepalived-kubeadm,keepalived-kubeadm-tuned")]
    api_systems: String,
    /// Runs of each control-plane scenario (one lab per system).
    #[arg(long, default_value_t = 5)]
    api_runs: usize,
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
    /// Pair counts of the idle measurement's pairs dimension: that many pairs of one VIP
    /// each on the same two nodes (keepalived: as many VRRP instances), comma separated,
    /// 2 to 100 each (one pair is the first VIP count's row).
    #[arg(long, value_delimiter = ',', default_value = "10,100", value_parser = clap::value_parser!(u8).range(2..=100))]
    idle_pairs: Vec<u8>,
    /// Pair counts of `mass-cut` (comma separated, 1 to 100): the node holding every pair is
    /// cut; the first and the last pair's gap.
    #[arg(long, value_delimiter = ',', default_value = "100", value_parser = clap::value_parser!(u8).range(1..=100))]
    mass_pairs: Vec<u8>,
    /// Systems of `mass-cut` (comma separated): havip, havip-fast, keepalived-v3,
    /// keepalived-v3-30ms.
    #[arg(long, default_value = "havip,keepalived-v3")]
    mass_systems: String,
    /// Seconds of idle for the footprint measurement.
    #[arg(long, default_value_t = 30)]
    idle_seconds: u64,
    /// Systems of the idle measurement (comma separated): havip, havip-fast and the
    /// keepalived systems of `--systems`.
    #[arg(long, default_value = "havip,havip-fast,keepalived-v3,keepalived-v3-30ms")]
    idle_systems: String,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(why) = havip_e2e::host::netns::require_root() {
        eprintln!("bench-failover needs root (network namespaces): {why}");
        return std::process::ExitCode::FAILURE;
    }
    let metallb_missing = metallb_missing();
    let asked = args.systems.clone().unwrap_or_else(|| {
        "havip,havip-fast,havip-vmac,keepalived-v2,keepalived-v3,keepalived-v3-30ms,keepalived-v3-vmac,metallb-l2,\
         havip-bgp,havip-bgp-fast,havip-bgp-fast-backup,metallb-bgp,metallb-bgp-3s"
            .to_owned()
    });
    let mut systems: Vec<&str> = asked.split(',').collect();
    if !havip_e2e::routing::Frr::available() {
        for s in systems.iter().filter(|s| s.contains("bgp")) {
            let why = "FRR is not installed (hack/prereqs.sh test installs it)";
            eprintln!("{s}: skipped: {why}");
            println!("{}", json!({"system": s, "skipped": why}));
        }
        systems.retain(|s| !s.contains("bgp"));
    }
    if let Some(why) = &metallb_missing {
        for s in systems.iter().filter(|s| s.starts_with("metallb")) {
            eprintln!("{s}: skipped: {why}");
            println!("{}", json!({"system": s, "skipped": why}));
        }
        systems.retain(|s| !s.starts_with("metallb"));
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
            "static-arp" => Some(Scenario::StaticArp),
            _ => None,
        })
        .collect();
    let mut results: Vec<Summary> = Vec::new();
    let mut failed_runs = 0;
    for scenario in &scenarios {
        for system in &systems {
            if !scenario.measures(system) {
                eprintln!("{system} {}: not measured", scenario.name());
                continue;
            }
            if *scenario == Scenario::Planned200 {
                let interval = Duration::from_millis(args.move_interval_ms);
                results.extend(runs::many(system, args.moves, interval, &mut failed_runs));
                continue;
            }
            results.push(runs::repeated(*scenario, system, args.runs, &mut failed_runs));
        }
        // Ratios of each havip profile to each other system, for this scenario.
        runs::print_ratios(&results, *scenario);
    }
    let api_scenarios: Vec<&str> = args.scenarios.split(',').filter(|s| apiserver::SCENARIOS.contains(s)).collect();
    if !api_scenarios.is_empty() {
        let api_systems: Vec<&str> = args
            .api_systems
            .split(',')
            .filter(|s| {
                let known = apiserver::SYSTEMS.contains(s);
                if !known {
                    eprintln!("--api-systems: unknown system {s}");
                }
                known
            })
            .collect();
        apiserver::bench(&api_systems, &api_scenarios, args.api_runs, &mut failed_runs);
    }
    if args.scenarios.split(',').any(|s| s == "mass-cut") {
        for &pairs in &args.mass_pairs {
            for system in args.mass_systems.split(',') {
                mass::mass_cut(system, usize::from(pairs), args.runs, &mut failed_runs);
            }
        }
    }
    if !args.no_footprint {
        let window = Duration::from_secs(args.idle_seconds);
        for &vips in &args.footprint_vips {
            idle::idle_lines(vips, 1, &args.idle_systems, window, &mut failed_runs);
        }
        for &pairs in &args.idle_pairs {
            idle::idle_lines(1, usize::from(pairs), &args.idle_systems, window, &mut failed_runs);
        }
    }
    if failed_runs > 0 {
        eprintln!("{failed_runs} runs failed");
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
