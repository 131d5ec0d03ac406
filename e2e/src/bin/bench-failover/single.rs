//! The scenarios of one move per lab (`cut`, `kill-then-cut`, `planned`) for havip (on
//! one layer-2 segment or routed), keepalived and MetalLB.

use crate::moves::{Outcome, Scenario, finish};
use crate::systems::cut_node;
use havip_e2e::baselines::keepalived::{Keepalived, KeepalivedConfig};
use havip_e2e::baselines::metallb::{MetalLbConfig, MetalLbLab, Mode};
use havip_e2e::harness::agent::{AgentLab, PairOptions, SERVICE_PORT};
use havip_e2e::host::netns::{self, Topology};
use havip_e2e::traffic::{Listener, Prober, ProberConfig};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// One move of havip (the Standard or the Fast profile).
/// `bgp`: the routed lab (FRR on the router and the members, BFD 100 ms × 3), the
/// client behind the router. `backup_bfd`: with backup paths (`bgpBackupPaths`), BFD at
/// that interval (ms, × 3) instead.
pub(crate) fn run_havip(
    scenario: Scenario,
    fast_profile: bool,
    bgp: bool,
    backup_bfd: Option<u32>,
    virtual_mac: bool,
) -> Result<Outcome, String> {
    let bgp = bgp.then_some(havip_e2e::bgp::Speaker::Frr);
    let forwarding = bgp.is_some();
    let mut lab = AgentLab::start(PairOptions {
        fast_profile,
        bgp,
        forwarding,
        bgp_backup_paths: backup_bfd.is_some(),
        bfd_ms: backup_bfd,
        virtual_mac: virtual_mac.then_some(0x33),
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    lab.wait_sole_holder(0, Duration::from_secs(15)).map_err(|e| e.to_string())?;
    if let Some(r) = &lab.routing {
        r.wait_routed(lab.vip_addr(0).into(), lab.topo.node(0).data_ip.into(), Duration::from_secs(15))
            .map_err(|e| e.to_string())?;
    }
    // The standby must be steady (heard, ready) before any scenario.
    std::thread::sleep(Duration::from_millis(1200));
    let prober =
        Prober::start(lab.client_ns(), ProberConfig::new(lab.target()).overlapping()).map_err(|e| e.to_string())?;
    prober.wait_for_responder("n0", Duration::from_secs(5)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    match scenario {
        // The node dies: management first, so that the data-link carrier loss cannot
        // trigger a (faster) planned handover over the still-connected management path.
        Scenario::Cut => cut_node(&lab.topo, 0)?,
        Scenario::StaticArp => {
            pin_vip(lab.client_ns(), &lab.topo.client().ifname, lab.target().ip())?;
            cut_node(&lab.topo, 0)?;
        }
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
    let out = finish(prober, "n1", scenario.deadline(Duration::from_secs(15)));
    if std::env::var_os("BENCH_VERBOSE").is_some() && out.gap_ms > 600.0 {
        eprintln!("{}", lab.logs_tail(40));
    }
    Ok(out)
}

/// `static-arp`: the client's entry of the VIP pinned to the MAC it resolves now.
fn pin_vip(ns: &str, dev: &str, vip: IpAddr) -> Result<(), String> {
    let mac = netns::pin_neighbour(ns, dev, vip, Duration::from_secs(3)).map_err(|e| e.to_string())?;
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        eprintln!("  the client's entry of {vip} pinned to {mac}");
    }
    Ok(())
}

/// One move of keepalived with `config`.
pub(crate) fn run_keepalived(scenario: Scenario, config: KeepalivedConfig) -> Result<Outcome, String> {
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
    let prober =
        Prober::start(&topo.client().ns, ProberConfig::new(target).overlapping()).map_err(|e| e.to_string())?;
    prober.wait_for_responder("n0", Duration::from_secs(5)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    match scenario {
        Scenario::Cut => cut_node(&topo, 0)?,
        Scenario::StaticArp => {
            pin_vip(&topo.client().ns, &topo.client().ifname, target.ip())?;
            cut_node(&topo, 0)?;
        }
        Scenario::KillThenCut => {
            k0.kill();
            std::thread::sleep(Duration::from_secs(2));
            cut_node(&topo, 0)?;
        }
        Scenario::Planned => k0.stop_graceful(),
        Scenario::PlannedDrain | Scenario::Planned200 => return Err(format!("{} runs elsewhere", scenario.name())),
    }
    let out = finish(prober, "n1", scenario.deadline(Duration::from_secs(20)));
    drop(k1);
    Ok(out)
}

/// MetalLB: in layer 2 the active is the node MetalLB elected to announce the Service's
/// address; in BGP mode (every node advertises it, the router spreads flows by ECMP) the
/// node the router sends the client's connections to. `planned` is a SIGTERM to its
/// speaker (layer 2: it leaves memberlist; BGP: it closes its session, the router
/// withdraws its path).
pub(crate) fn run_metallb(scenario: Scenario, mode: Mode) -> Result<Outcome, String> {
    let mut lab = MetalLbLab::start(MetalLbConfig { mode, ..Default::default() }).map_err(|e| e.to_string())?;
    let holder = lab.active().map_err(|e| e.to_string())?;
    let Some(other) = (0..lab.topo.nodes().len()).find(|i| *i != holder) else {
        return Err("no second node".into());
    };
    let (old, new) = (lab.topo.node(holder).name.clone(), lab.topo.node(other).name.clone());
    let prober =
        Prober::start(lab.client_ns(), ProberConfig::new(lab.target()).overlapping()).map_err(|e| e.to_string())?;
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
        Scenario::PlannedDrain | Scenario::Planned200 | Scenario::StaticArp => {
            return Err(format!("{} is not measured for MetalLB", scenario.name()));
        }
    }
    // memberlist's failure detection and BGP's hold time take seconds by design: a
    // generous deadline.
    let out = finish(prober, &new, Duration::from_secs(30));
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        let now = match mode {
            Mode::Layer2 => format!("announcers now {:?}", lab.announcers()),
            Mode::Bgp { .. } => format!("router: {:?}", lab.router().map(|r| r.vtysh("show bgp summary"))),
        };
        eprintln!("  metallb: {old} served first, {new} took over; {now}");
        if !out.new_holder_reached {
            eprintln!("{}", lab.logs_tail(40));
        }
    }
    Ok(out)
}
