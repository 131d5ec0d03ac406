//! The control-plane VIP (issue 28): API unavailability through the VIP on a real
//! three-node control plane (etcd and kube-apiserver on every node, [`CpCluster`]), havip's
//! control-plane mode against keepalived configured as the kubeadm HA guide shows.
//!
//! A client in its own namespace sends a fresh HTTPS `GET /readyz` through the VIP every
//! 20 ms (each on a new TCP and TLS connection, 1 s timeout, without waiting for the ones
//! before: [`CpCluster::watch_readyz`]). Scenarios, each `--api-runs` times in one lab per
//! system (the holder of the moment is the victim; after each run the lab is healed and
//! left to settle):
//! - `api-kill`: the holder's kube-apiserver is SIGKILLed — the time until a request sent
//!   after the kill is answered `ok`;
//! - `api-cut`: the holder node's cables are cut, management first (a dead node) — the same
//!   time (etcd loses a member too);
//! - `api-planned`: a planned move (havip: `admin failover`; keepalived: SIGTERM, its
//!   priority-0 handover) — the requests that failed around it.
//!
//! Systems: `havip-cp` (three voting members, `quorum.lease 400ms`, `apiServer` with its
//! defaults: `/readyz` every 200 ms, 500 ms timeout, notReadyFor 600 ms), `keepalived-kubeadm`
//! (the guide's `keepalived.conf`: VRRPv2, `advert_int 1`, priorities 101/100/100, and its
//! `check_apiserver.sh` track script at the guide's timings: `interval 3`, `weight -2`,
//! `fall 10`, `rise 2`; the script's `curl` asks `/healthz`, which anonymous clients may
//! read, where the guide asks `/`) and `keepalived-kubeadm-tuned` (VRRPv3 `advert_int 0.1`,
//! the script every second, `fall 2`, `rise 2`, `curl --max-time 1`).

use crate::moves::percentile;
use havip_e2e::agent::{AgentLab, PairOptions};
use havip_e2e::baselines::keepalived::{Keepalived, KeepalivedConfig};
use havip_e2e::cpcluster::{APISERVER_PORT, CpCluster, ReadyzReport};
use havip_e2e::host::netns::Topology;
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The scenarios of this module.
pub(crate) const SCENARIOS: [&str; 3] = ["api-planned", "api-kill", "api-cut"];
/// The systems of this module.
pub(crate) const SYSTEMS: [&str; 3] = ["havip-cp", "keepalived-kubeadm", "keepalived-kubeadm-tuned"];

const REQUEST_EVERY: Duration = Duration::from_millis(20);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest a run waits for the API to answer through the VIP again.
const RECOVERY_LIMIT: Duration = Duration::from_secs(90);

/// What runs the VIP.
enum Vip {
    Havip(Box<AgentLab>),
    Keepalived { topo: Box<Topology>, instances: Vec<Keepalived>, settle: Duration },
}

/// A control-plane lab: the VIP's system and the control plane on the same nodes.
struct Lab {
    vip: Vip,
    cp: CpCluster,
}

impl Lab {
    fn start(system: &str) -> Result<Lab, String> {
        match system {
            "havip-cp" => {
                let lab = AgentLab::start(PairOptions::control_plane()).map_err(|e| e.to_string())?;
                let cp = CpCluster::for_agent_lab(&lab).map_err(|e| e.to_string())?;
                Ok(Lab { vip: Vip::Havip(Box::new(lab)), cp })
            }
            "keepalived-kubeadm" | "keepalived-kubeadm-tuned" => {
                let tuned = system.ends_with("tuned");
                let topo = Topology::builder().nodes(3).build().map_err(|e| e.to_string())?;
                let vip = topo.vip(0);
                let cp = CpCluster::start(&topo, &[0, 1, 2], &[IpAddr::V4(vip)]).map_err(|e| e.to_string())?;
                let script = cp.dir().join("check_apiserver.sh");
                std::fs::write(&script, check_apiserver_sh(vip, tuned)).map_err(|e| e.to_string())?;
                set_mode(&script, 0o755)?;
                let (interval, fall, rise) = if tuned { (1, 2, 2) } else { (3, 10, 2) };
                let base = if tuned { KeepalivedConfig::v3_fast() } else { KeepalivedConfig::v2_defaults() };
                let mut instances = Vec::new();
                for (i, priority) in [101u8, 100, 100].into_iter().enumerate() {
                    let mut c = base.clone().priority(priority);
                    c.extra_global = vec!["enable_script_security".to_owned(), "script_user root".to_owned()];
                    c.extra_top = vec![format!(
                        "vrrp_script check_apiserver {{\n    script \"{}\"\n    interval {interval}\n    weight -2\n    fall {fall}\n    rise {rise}\n}}",
                        script.display()
                    )];
                    c.extra_instance = vec!["track_script {\n        check_apiserver\n    }".to_owned()];
                    instances.push(Keepalived::start(&topo, i, c).map_err(|e| e.to_string())?);
                }
                // A restarted API server counts again after `rise` checks; then the node
                // with priority 101 takes the VIP back (preemption).
                let settle = Duration::from_secs(interval * (rise + 1)) + Duration::from_secs(2);
                Ok(Lab { vip: Vip::Keepalived { topo: Box::new(topo), instances, settle }, cp })
            }
            other => Err(format!("unknown system {other}")),
        }
    }

    fn topo(&self) -> &Topology {
        match &self.vip {
            Vip::Havip(l) => &l.topo,
            Vip::Keepalived { topo, .. } => topo,
        }
    }

    fn client_ns(&self) -> String {
        self.topo().client().ns.clone()
    }

    fn target(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.topo().vip(0)), APISERVER_PORT)
    }

    /// The members holding the VIP.
    fn holders(&self) -> Vec<usize> {
        match &self.vip {
            Vip::Havip(l) => l.holders(0).unwrap_or_default(),
            Vip::Keepalived { instances, .. } => {
                (0..instances.len()).filter(|&i| instances[i].holds_vip().unwrap_or(false)).collect()
            }
        }
    }

    /// Waits until one member holds the VIP and has for `stable`, every member's API
    /// server is ready (a reconnected node's etcd member may still be catching up, and an
    /// API server that is not ready would make the holder hand over during the next run),
    /// and the API answers through the VIP; returns that member.
    fn settled(&self, stable: Duration, timeout: Duration) -> Result<usize, String> {
        let start = Instant::now();
        let mut since: Option<(usize, Instant)> = None;
        loop {
            let h = self.holders();
            match (h.as_slice(), since) {
                ([one], Some((who, t))) if *one == who => {
                    if t.elapsed() >= stable
                        && self.cp.nodes().iter().all(|&i| self.cp.readyz(i, REQUEST_TIMEOUT))
                        && self.cp.readyz_at(&self.client_ns(), self.target(), REQUEST_TIMEOUT)
                    {
                        return Ok(who);
                    }
                }
                ([one], _) => since = Some((*one, Instant::now())),
                _ => since = None,
            }
            if start.elapsed() > timeout {
                return Err(format!("no settled holder within {timeout:?} (holders {h:?})"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn settle_time(&self) -> Duration {
        match &self.vip {
            Vip::Havip(_) => Duration::from_secs(2),
            Vip::Keepalived { settle, .. } => *settle,
        }
    }
}

fn set_mode(path: &std::path::Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| e.to_string())
}

/// The kubeadm HA guide's `check_apiserver.sh` for a VIP on 6443 without a load balancer
/// in front (`APISERVER_DEST_PORT=6443`), asking `/healthz` (`/` is refused to anonymous
/// clients by current API servers, which would fail every check).
fn check_apiserver_sh(vip: std::net::Ipv4Addr, tuned: bool) -> String {
    let max_time = if tuned { 1 } else { 2 };
    format!(
        "#!/bin/sh\n\
         errorExit() {{\n    echo \"*** $*\" 1>&2\n    exit 1\n}}\n\
         curl -sfk --max-time {max_time} https://localhost:{APISERVER_PORT}/healthz -o /dev/null || errorExit \"Error GET https://localhost:{APISERVER_PORT}/healthz\"\n\
         if ip addr | grep -q {vip}; then\n    \
         curl -sfk --max-time {max_time} https://{vip}:{APISERVER_PORT}/healthz -o /dev/null || errorExit \"Error GET https://{vip}:{APISERVER_PORT}/healthz\"\n\
         fi\n"
    )
}

/// One run's result.
struct Run {
    /// The member that held the VIP at the fault, and those holding it once the API
    /// answered again.
    victim: usize,
    after: Vec<usize>,
    /// Until a request sent after the fault was answered (kill, cut), ms.
    unavailable_ms: Option<f64>,
    failed: usize,
    requests: usize,
}

fn run_once(lab: &mut Lab, scenario: &str) -> Result<Run, String> {
    let holder = lab.settled(lab.settle_time(), RECOVERY_LIMIT)?;
    let watch = lab
        .cp
        .watch_readyz(&lab.client_ns(), lab.target(), REQUEST_EVERY, REQUEST_TIMEOUT)
        .map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    let mut fault = Instant::now();
    match scenario {
        "api-kill" => lab.cp.kill_apiserver(holder),
        "api-cut" => {
            lab.topo().kill_node_links(holder).map_err(|e| e.to_string())?;
            // The cables go one after the other (a few ms): the node is gone once the
            // data cable is down — a request sent before may still be answered by it.
            fault = Instant::now();
        }
        "api-planned" => match &mut lab.vip {
            Vip::Havip(l) => {
                l.failover_when_ready(holder, Duration::from_secs(10)).map_err(|e| e.to_string())?;
            }
            Vip::Keepalived { instances, .. } => instances[holder].stop_graceful(),
        },
        other => return Err(format!("unknown scenario {other}")),
    }
    let answered = watch.wait_ok_after(fault, RECOVERY_LIMIT);
    let holders_after = lab.holders();
    // Long enough after the move for a request sent then to have been answered or not.
    let moved_by = Instant::now();
    while moved_by.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let report: ReadyzReport = watch.stop();
    let after: Vec<_> = report.samples.iter().filter(|s| s.at >= fault - Duration::from_millis(300)).collect();
    let run = Run {
        victim: holder,
        after: holders_after,
        unavailable_ms: answered.map(|t| t.duration_since(fault).as_secs_f64() * 1000.0),
        failed: after.iter().filter(|s| !s.ok).count(),
        requests: after.len(),
    };
    // Heal for the next run.
    match scenario {
        "api-kill" => lab.cp.start_apiserver(holder).map_err(|e| e.to_string())?,
        "api-cut" => {
            lab.topo().restore_node(holder).map_err(|e| e.to_string())?;
            lab.cp.wait_ready(holder, Duration::from_secs(60)).map_err(|e| e.to_string())?;
        }
        _ => {
            if let Vip::Keepalived { instances, .. } = &mut lab.vip {
                instances[holder].start_again().map_err(|e| e.to_string())?;
            }
        }
    }
    if answered.is_none() {
        return Err(format!("the API did not answer through the VIP within {RECOVERY_LIMIT:?}"));
    }
    Ok(run)
}

/// Runs every scenario `runs` times on every system (one lab per system) and prints a
/// JSON line per (system, scenario), then havip's ratios to each keepalived variant.
pub(crate) fn bench(systems: &[&str], scenarios: &[&str], runs: usize, failed_runs: &mut usize) {
    if let Err(e) = havip_e2e::testbin::TestBin::find() {
        let why = format!("{e} (bash hack/testbin.sh control-plane)");
        for s in systems {
            println!("{}", json!({"bench": "control-plane", "system": s, "skipped": why}));
        }
        return;
    }
    let mut p50s: Vec<(String, String, f64)> = Vec::new();
    for system in systems {
        let mut lab = match Lab::start(system) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{system}: the control-plane lab did not start: {e}");
                *failed_runs += 1;
                continue;
            }
        };
        for scenario in scenarios {
            let mut results = Vec::new();
            for r in 0..runs {
                match run_once(&mut lab, scenario) {
                    Ok(run) => results.push(run),
                    Err(e) => {
                        eprintln!("{system} {scenario} run {r}: {e}");
                        *failed_runs += 1;
                    }
                }
            }
            let mut times: Vec<f64> = results.iter().filter_map(|r| r.unavailable_ms).collect();
            times.sort_by(f64::total_cmp);
            let round = |v: f64| (v * 10.0).round() / 10.0;
            let (p50, p99) = (percentile(&times, 50.0), percentile(&times, 99.0));
            let line = json!({
                "bench": "control-plane",
                "system": system,
                "scenario": scenario,
                "runs": results.len(),
                "unavailable_ms": {"p50": round(p50), "p99": round(p99), "max": times.last().copied().map(round)},
                "failed_requests": results.iter().map(|r| r.failed).sum::<usize>(),
                "requests": results.iter().map(|r| r.requests).sum::<usize>(),
                "per_run_ms": times.iter().map(|t| round(*t)).collect::<Vec<_>>(),
                "run_detail": results
                    .iter()
                    .map(|r| json!({"victim": r.victim, "holders_after": r.after, "ms": r.unavailable_ms.map(round)}))
                    .collect::<Vec<_>>(),
            });
            println!("{line}");
            eprintln!("{line}");
            p50s.push((system.to_string(), scenario.to_string(), p50));
        }
    }
    for (h, scenario, h50) in p50s.iter().filter(|r| r.0.starts_with("havip")) {
        for (k, _, k50) in p50s.iter().filter(|r| !r.0.starts_with("havip") && &r.1 == scenario) {
            if scenario != "api-planned" && *k50 > 0.0 {
                println!(
                    "{}",
                    json!({"bench": "control-plane", "ratio": format!("{h}/{k}"), "scenario": scenario, "p50_unavailable_ratio": ((h50 / k50) * 1000.0).round() / 1000.0})
                );
            }
        }
    }
}
