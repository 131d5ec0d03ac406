//! The idle measurement: what each system costs holding VIPs on two nodes.

use crate::systems::keepalived_config;
use havip_e2e::baselines::keepalived::{Keepalived, KeepalivedConfig};
use havip_e2e::bench::footprint;
use havip_e2e::harness::agent::{AgentLab, PairOptions, SERVICE_PORT};
use havip_e2e::host::netns::Topology;
use havip_e2e::traffic::Listener;
use serde_json::json;
use std::time::Duration;

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

/// Waits until member 0 holds every pair's first VIP (each pair elects on its own).
pub(crate) fn wait_all_held_by_n0(lab: &AgentLab, pairs: usize) -> Result<(), String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for k in 0..pairs {
        let j = lab.pair_vip(k, 0);
        while lab.holders(j).map_err(|e| e.to_string())? != vec![0] {
            if std::time::Instant::now() > deadline {
                return Err(format!("pair {k} has no sole holder n0 after 60 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// Waits until `ns`'s `eth0` carries at least `n` IPv4 addresses besides its own.
pub(crate) fn wait_addresses(ns: &str, n: usize) -> Result<(), String> {
    let ipv4 = || havip_e2e::host::netns::addresses(ns, "eth0").map(|a| a.iter().filter(|x| x.ip.is_ipv4()).count());
    havip_e2e::host::netns::wait_until(
        &format!("{ns}'s eth0 to carry {n} addresses besides its own"),
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok(ipv4()? > n),
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// One idle measurement: `system` holding `vips` addresses in each of `pairs` pairs on two
/// nodes (keepalived: `pairs` VRRP instances), both daemons measured over the same window
/// (CPU time, wakeups and RSS of each process tree).
fn idle(system: &str, vips: u8, pairs: usize, window: Duration) -> Result<serde_json::Value, String> {
    let settle = Duration::from_secs(3);
    let (usage, profile) = match system {
        "havip" | "havip-fast" => {
            let fast = system == "havip-fast";
            let lab = AgentLab::start(PairOptions { vips, pairs, fast_profile: fast, ..Default::default() })
                .map_err(|e| e.to_string())?;
            lab.wait_sole_holder(0, Duration::from_secs(20)).map_err(|e| e.to_string())?;
            wait_all_held_by_n0(&lab, pairs)?;
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
            // One instance with `vips` addresses, or `pairs` instances with one each.
            let cfg = || {
                base.clone()
                    .vip(topo.vip_at(0), 24)
                    .more_vips((1..vips).map(|j| (topo.vip_at(j), 24)))
                    .more_instances((1..pairs).map(|k| (topo.vip_at(k as u8), 24)))
            };
            let k0 = Keepalived::start(&topo, 0, cfg()).map_err(|e| e.to_string())?;
            let k1 = Keepalived::start(&topo, 1, cfg()).map_err(|e| e.to_string())?;
            k0.wait_holds_vip(true, Duration::from_secs(15)).map_err(|e| e.to_string())?;
            wait_addresses(&topo.node(0).ns, usize::from(vips).max(pairs))?;
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
        "pairs": pairs,
        "window_s": r1(active.window_s),
        "cpu_ms_per_min_total": r1(active.cpu_ms_per_min + standby.cpu_ms_per_min),
        "packets_per_s_total": per_s(active_pkts.zip(standby_pkts).map(|(a, b)| a + b)),
        "active": {"cpu_ms_per_min": r1(active.cpu_ms_per_min), "wakeups_per_s": r1(active.wakeups_per_s), "rss_kib": active_rss, "private_kib": active_private, "threads_exited": active.threads_exited, "packets_per_s": per_s(active_pkts)},
        "standby": {"cpu_ms_per_min": r1(standby.cpu_ms_per_min), "wakeups_per_s": r1(standby.wakeups_per_s), "rss_kib": standby_rss, "private_kib": standby_private, "threads_exited": standby.threads_exited, "packets_per_s": per_s(standby_pkts)},
    }))
}

/// The idle measurement of every system of `systems` (comma separated) with `pairs` pairs
/// of `vips` VIPs, a line each, then the CPU ratio of each havip profile to each keepalived
/// (same counts, same run); `failed_runs` counts the measurements that could not be made.
pub(crate) fn idle_lines(vips: u8, pairs: usize, systems: &str, window: Duration, failed_runs: &mut usize) {
    let mut totals: Vec<(String, f64)> = Vec::new();
    for system in systems.split(',') {
        match idle(system, vips, pairs, window) {
            Ok(v) => {
                println!("{v}");
                if let Some(t) = v["cpu_ms_per_min_total"].as_f64() {
                    totals.push((system.to_owned(), t));
                }
            }
            Err(e) => {
                *failed_runs += 1;
                eprintln!("idle {system} with {pairs} pair(s) of {vips} VIP(s): error: {e}");
            }
        }
    }
    for (h, t) in totals.iter().filter(|(s, _)| s.starts_with("havip")) {
        for (k, kt) in totals.iter().filter(|(s, _)| s.starts_with("keepalived")) {
            let ratio = ((t / kt) * 100.0).round() / 100.0;
            println!(
                "{}",
                json!({"ratio": format!("{h}/{k}"), "bench": "idle", "vips": vips, "pairs": pairs, "cpu_ratio": ratio})
            );
        }
    }
}
