//! `planned-200`: many planned moves back and forth in one lab, with concurrent streams
//! of new connections and mid-handshake connections at every move.

use crate::moves::{Timeline, around_the_gap, complete, half_open, percentile, print_timeline};
use crate::systems::echo_listeners;
use havip_e2e::baselines::keepalived::{Keepalived, KeepalivedConfig};
use havip_e2e::harness::agent::{AgentLab, PairOptions, SERVICE_PORT};
use havip_e2e::host::netns::Topology;
use havip_e2e::traffic::{ProbeReport, Prober, ProberConfig};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Concurrent client streams of `planned-200`.
const STREAMS: usize = 4;
/// Mid-handshake connections per move of `planned-200`.
const MID_HANDSHAKE_PER_MOVE: u16 = 2;

/// What `planned-200` saw in one lab.
#[derive(Debug, Default)]
pub(crate) struct Many {
    /// Moves done.
    pub(crate) moves: usize,
    /// Per move: the longest gap of any stream around it (ms).
    pub(crate) gaps: Vec<f64>,
    /// Per move: how long the move waited to be accepted (ms).
    pub(crate) waits: Vec<f64>,
    pub(crate) failed_connects: usize,
    pub(crate) resets: usize,
    /// Connected, then no answer (read timeout, closed without reply, other).
    pub(crate) lost: usize,
    pub(crate) failure_kinds: BTreeMap<String, usize>,
    pub(crate) mid_handshake: usize,
    pub(crate) mid_handshake_failed: usize,
    pub(crate) mid_handshake_kinds: BTreeMap<String, usize>,
    /// The median move's probes around its gap.
    pub(crate) timeline: Timeline,
    /// The first failures of the streams: (move number, ms since that move began, kind,
    /// where the move went).
    pub(crate) failures_at: Vec<(usize, f64, String, String)>,
    /// Why it stopped before all moves, if it did.
    pub(crate) aborted: Option<String>,
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
        self.0.failover_when_ready(from, Duration::from_secs(30)).map_err(|e| e.to_string())
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
    // The client behind the router in a routed lab.
    let client = topo.routed_client().unwrap_or(topo.client()).ns.clone();
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

/// Prints `planned-200`'s line (and its median move's timeline); returns the per-move
/// gap p50 and p99.
pub(crate) fn print_many(system: &str, many: &Many, asked: usize) -> (f64, f64) {
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
pub(crate) fn run_havip_many(moves: usize, interval: Duration, bgp: bool) -> Result<Many, String> {
    let bgp = bgp.then_some(havip_e2e::bgp::Speaker::Frr);
    let lab =
        AgentLab::start(PairOptions { echo_listeners: true, forwarding: bgp.is_some(), bgp, ..Default::default() })
            .map_err(|e| e.to_string())?;
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
pub(crate) fn run_keepalived_many(config: KeepalivedConfig, moves: usize, interval: Duration) -> Result<Many, String> {
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
