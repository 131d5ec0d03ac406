//! `mass-cut`: a node holding every one of P pairs (one VIP each; keepalived: P VRRP
//! instances) is cut as a dead node goes; what users see is the time until the **last**
//! pair's VIP answers again from the other member. Each run is a fresh lab; the client
//! probes every VIP at once from the cut on (one connect in flight per VIP, 30 ms timeout,
//! the next at once), and a VIP counts as back at its first connect answered by the
//! other member's listener.

use crate::idle::{wait_addresses, wait_all_held_by_n0};
use crate::moves::percentile;
use crate::systems::{cut_node, keepalived_config};
use havip_e2e::baselines::keepalived::{Keepalived, KeepalivedConfig};
use havip_e2e::harness::agent::{AgentLab, PairOptions, SERVICE_PORT};
use havip_e2e::host::netns::{self, Topology};
use havip_e2e::traffic::Listener;
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a run waits for the last VIP.
const DEADLINE: Duration = Duration::from_secs(15);

/// Cuts (`cut`, in this thread) and from then on probes every target until each is
/// answered by `new_holder`; per target, ms from the cut (`None`: not within
/// [`DEADLINE`]).
fn probe_after_cut(
    ns: &str,
    targets: Vec<SocketAddr>,
    new_holder: &'static str,
    cut: impl FnOnce() -> Result<(), String>,
) -> Result<Vec<Option<f64>>, String> {
    let (tx, rx) = std::sync::mpsc::channel::<Instant>();
    let thread = netns::run_in_netns(ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let start = rx.recv().map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let mut set = tokio::task::JoinSet::new();
            for (i, t) in targets.into_iter().enumerate() {
                set.spawn(async move {
                    while start.elapsed() < DEADLINE {
                        if answered_by(t, new_holder).await {
                            return (i, Some(start.elapsed().as_secs_f64() * 1000.0));
                        }
                    }
                    (i, None)
                });
            }
            let mut out = Vec::new();
            while let Some(r) = set.join_next().await {
                out.push(r.map_err(|e| e.to_string())?);
            }
            out.sort_by_key(|(i, _)| *i);
            Ok::<_, String>(out.into_iter().map(|(_, ms)| ms).collect())
        })
    })
    .map_err(|e| e.to_string())?;
    let at = Instant::now();
    let cut = cut();
    let _ = tx.send(at);
    cut?;
    thread.join().map_err(|e| e.to_string())?
}

/// One connect to `t` within 30 ms, answered with the greeting of member `who`.
async fn answered_by(t: SocketAddr, who: &str) -> bool {
    use tokio::io::AsyncReadExt;
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(t).await.ok()?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).await.ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).contains(who))
    };
    matches!(tokio::time::timeout(Duration::from_millis(30), attempt).await, Ok(Some(true)))
}

/// One run: a fresh lab of `system` with `pairs` pairs, every VIP on n0, n0 cut.
fn run(system: &str, pairs: usize) -> Result<Vec<Option<f64>>, String> {
    match system {
        "havip" | "havip-fast" => {
            let lab = AgentLab::start(PairOptions {
                pairs,
                vips: 1,
                fast_profile: system == "havip-fast",
                ..Default::default()
            })
            .map_err(|e| e.to_string())?;
            lab.wait_sole_holder(0, Duration::from_secs(20)).map_err(|e| e.to_string())?;
            wait_all_held_by_n0(&lab, pairs)?;
            // The standbys must be steady (heard, ready) before the cut.
            std::thread::sleep(Duration::from_millis(1500));
            let targets: Vec<SocketAddr> = (0..pairs)
                .map(|k| SocketAddr::new(lab.vip_addr(lab.pair_vip(k, 0)).into(), SERVICE_PORT + k as u16))
                .collect();
            probe_after_cut(lab.client_ns(), targets, "n1", || cut_node(&lab.topo, 0))
        }
        k if keepalived_config(k).is_some() => {
            let topo = Topology::builder().nodes(2).build().map_err(|e| e.to_string())?;
            let _l0 = Listener::on_node(&topo, 0, SERVICE_PORT).map_err(|e| e.to_string())?;
            let _l1 = Listener::on_node(&topo, 1, SERVICE_PORT).map_err(|e| e.to_string())?;
            let base = keepalived_config(k).unwrap_or_else(KeepalivedConfig::v3_fast);
            let cfg =
                || base.clone().vip(topo.vip_at(0), 24).more_instances((1..pairs).map(|j| (topo.vip_at(j as u8), 24)));
            let _k0 = Keepalived::start(&topo, 0, cfg()).map_err(|e| e.to_string())?;
            let _k1 = Keepalived::start(&topo, 1, cfg()).map_err(|e| e.to_string())?;
            wait_addresses(&topo.node(0).ns, pairs)?;
            std::thread::sleep(Duration::from_millis(1500));
            let targets: Vec<SocketAddr> =
                (0..pairs).map(|j| SocketAddr::new(topo.vip_at(j as u8).into(), SERVICE_PORT)).collect();
            probe_after_cut(&topo.client().ns, targets, "n1", || cut_node(&topo, 0))
        }
        other => Err(format!("unknown system {other}")),
    }
}

/// `runs` mass cuts of `system` with `pairs` pairs: a JSON line with the first and the
/// last pair's gap (p50/p99 over the runs), and the runs that missed a VIP.
pub(crate) fn mass_cut(system: &str, pairs: usize, runs: usize, failed_runs: &mut usize) {
    let (mut first, mut last, mut missing) = (Vec::new(), Vec::new(), 0usize);
    for r in 0..runs {
        match run(system, pairs) {
            Ok(gaps) => {
                let got: Vec<f64> = gaps.iter().flatten().copied().collect();
                missing += gaps.len() - got.len();
                if got.len() == gaps.len() {
                    first.push(got.iter().copied().fold(f64::INFINITY, f64::min));
                    last.push(got.iter().copied().fold(0.0, f64::max));
                }
                eprintln!(
                    "mass-cut {system} {pairs} pairs run {r}: {} of {} back, last {:?} ms",
                    got.len(),
                    gaps.len(),
                    last.last()
                );
            }
            Err(e) => {
                *failed_runs += 1;
                eprintln!("mass-cut {system} {pairs} pairs run {r}: error: {e}");
            }
        }
    }
    first.sort_by(f64::total_cmp);
    last.sort_by(f64::total_cmp);
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    println!(
        "{}",
        json!({
            "bench": "mass-cut", "system": system, "pairs": pairs, "runs": runs, "complete_runs": last.len(),
            "vips_not_back": missing,
            "first_ms": {"p50": r1(percentile(&first, 50.0)), "p99": r1(percentile(&first, 99.0))},
            "last_ms": {"p50": r1(percentile(&last, 50.0)), "p99": r1(percentile(&last, 99.0))},
        })
    );
}
