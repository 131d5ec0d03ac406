//! `planned-drain`: a planned move with long-lived connections and connections in the
//! middle of their handshake, for havip and keepalived.

use crate::moves::{Kept, Outcome, complete, finish, half_open};
use crate::systems::echo_listeners;
use havip_e2e::baselines::keepalived::{Keepalived, KeepalivedConfig};
use havip_e2e::harness::agent::{AgentLab, PairOptions, SERVICE_PORT};
use havip_e2e::host::netns::Topology;
use havip_e2e::traffic::{HalfOpen, LongLived, Prober};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// `planned-drain` counts the long-lived connections that break within this of the move.
const MOVE_WINDOW: Duration = Duration::from_secs(2);
/// Long-lived connections of `planned-drain`.
const LONG_LIVED: usize = 20;
/// Mid-handshake connections of `planned-drain`.
const MID_HANDSHAKE: u16 = 4;

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
pub(crate) fn run_havip_drain() -> Result<Outcome, String> {
    let lab = AgentLab::start(PairOptions { echo_listeners: true, ..Default::default() }).map_err(|e| e.to_string())?;
    lab.wait_sole_holder(0, Duration::from_secs(15)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(1200));
    let client = lab.topo.client().ns.clone();
    let prober = Prober::on_client(&lab.topo, lab.target()).map_err(|e| e.to_string())?;
    prober.wait_for_responder("n0", Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let conns = LongLived::on_client(&lab.topo, lab.target(), LONG_LIVED).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    let half = half_open(&client, lab.target(), 20000, MID_HANDSHAKE)?;
    let moved = lab.failover_when_ready(0, Duration::from_secs(10)).map_err(|e| e.to_string())?;
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

/// `planned-drain` for keepalived: SIGTERM to the master (its planned handover) with
/// long-lived and mid-handshake connections.
pub(crate) fn run_keepalived_drain(config: KeepalivedConfig) -> Result<Outcome, String> {
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

/// The `planned-drain` fields of a (system, scenario) line, over its runs.
pub(crate) fn kept_fields(kept: &[Kept]) -> serde_json::Map<String, serde_json::Value> {
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
