//! Random schedules: the pair's shape and a list of faults, all drawn from one seed.

use super::rng::SplitMix64;
use super::world::{CmdTarget, Fault, PATHS, Params, StateDamage};
use crate::{AutoFailback, Command, FailbackPolicy, Timings, VipId, VipSpec};

/// The simulator's timings: the production defaults for everything on the fast path
/// (tick, heartbeat, probe, hold-down, init listen, confirm and CAS timeouts), and
/// compressed long windows (boot hold, listener/VIP unhealthy, failback windows) so that
/// they actually expire within a schedule of a few virtual seconds.
pub fn sim_timings() -> Timings {
    Timings {
        boot_hold_ms: 4_000,
        listener_down_ms: 2_000,
        vip_unhealthy_ms: 1_000,
        traffic_stale_ms: 3_000,
        ..Timings::default()
    }
}

/// Compressed automatic failback policy for the simulator.
pub fn sim_failback() -> AutoFailback {
    AutoFailback {
        recovery_window_ms: 3_000,
        min_on_nonpreferred_ms: 2_000,
        quarantine_failovers: 3,
        quarantine_window_ms: 30_000,
        quarantine_hold_ms: 10_000,
        quiet_window_ms: 1_000,
        quiet_threshold_bps: 32 * 1024,
    }
}

fn vip(i: usize) -> VipId {
    VipId::new(format!("vip{i}")).expect("constant VIP names are valid")
}

/// Draws a schedule: parameters, the generator to continue with, and timed faults.
pub(super) fn generate(seed: u64) -> (Params, SplitMix64, Vec<(u64, Fault)>) {
    let mut r = SplitMix64::new(seed);
    let n = match r.below(100) {
        0..=39 => 2,
        40..=69 => 3,
        70..=84 => 4,
        _ => 5,
    };
    let nv = if r.chance(0.7) { 1 } else { 2 };
    let no_target = r.chance(0.12);
    let vips: Vec<VipSpec> = (0..nv)
        .map(|i| VipSpec {
            id: vip(i),
            probe_ports: if no_target || (i == 1 && r.chance(0.3)) {
                Vec::new()
            } else {
                vec![80 + u16::try_from(i).unwrap_or(0)]
            },
            health_ports: Vec::new(),
        })
        .collect();
    let has_target = vips.iter().any(|v| !v.probe_ports.is_empty());
    let mut delay = [(0, 0); PATHS];
    for d in &mut delay {
        let lo = r.range(0, 2);
        *d = (lo, lo + r.range(0, 15));
    }
    let fault_end = r.range(6_000, 16_000);
    let warm = if r.chance(0.5) { Some(r.index(n)) } else { None };
    // Now and then the pair starts a few epochs below the top of the domain, so that
    // schedules exhaust it.
    let base_epoch = if r.chance(0.05) {
        crate::MAX_EPOCH - r.range(0, 3)
    } else if warm.is_some() {
        5
    } else {
        0
    };
    let witness = r.chance(0.25);
    let p = Params {
        n,
        vips,
        has_target,
        gateway_configured: r.chance(0.85),
        store_fast_fail: r.chance(0.5),
        delay,
        store_lat: (1, r.range(2, 40)),
        timings: sim_timings(),
        failback: if r.chance(0.4) { FailbackPolicy::Automatic(sim_failback()) } else { FailbackPolicy::Manual },
        start_alone: r.chance(0.1),
        warm,
        base_epoch,
        fault_end,
        settle: 8_000,
        witness,
        // Half the witness schedules are control-plane schedules: quorum fencing with a
        // lease of one to two heartbeat timeouts.
        quorum: (witness && r.chance(0.5)).then(|| r.range(300, 600)),
    };
    let mut faults = Vec::new();
    let k = if r.chance(0.3) { r.range(1, 2) } else { r.range(0, 8) };
    for _ in 0..k {
        let s = r.range(2_000, fault_end.saturating_sub(300));
        scenario(&mut r, n, s, fault_end, &mut faults);
    }
    faults.sort_by_key(|(t, _)| *t);
    (p, r, faults)
}

fn subset(r: &mut SplitMix64, n: usize) -> Vec<bool> {
    loop {
        let mask = r.below(1 << n);
        if mask != 0 && mask != (1 << n) - 1 {
            return (0..n).map(|i| mask & (1 << i) != 0).collect();
        }
    }
}

/// Appends one fault scenario starting at `s` (its repair is dropped if it would fall after
/// `end`: the final heal repairs everything).
fn scenario(r: &mut SplitMix64, n: usize, s: u64, end: u64, out: &mut Vec<(u64, Fault)>) {
    let x = r.index(n);
    let pair = |on: Fault, len: u64, off: Fault, out: &mut Vec<(u64, Fault)>| {
        out.push((s, on));
        if s + len < end {
            out.push((s + len, off));
        }
    };
    match r.below(176) {
        0..=9 => {
            let l = r.range(300, 5_000);
            pair(Fault::PowerOff(x), l, Fault::PowerOn(x), out);
        }
        10..=17 => {
            let l = r.range(50, 3_000);
            pair(Fault::AgentCrash(x), l, Fault::AgentStart(x), out);
        }
        18..=23 => {
            let l = r.range(50, 3_000);
            pair(Fault::Pause(x), l, Fault::Resume(x), out);
        }
        24..=35 => {
            // Heartbeat-only partition (the data plane keeps working).
            let a = subset(r, n);
            let paths: Vec<usize> = match r.below(10) {
                0..=6 => vec![0, 1],
                7 | 8 => vec![0],
                _ => vec![1],
            };
            let dir = r.below(10);
            let l = r.range(200, 6_000);
            let mut on = Vec::new();
            let mut off = Vec::new();
            for i in 0..n {
                for j in 0..n {
                    if a[i] == a[j] {
                        continue;
                    }
                    let forward = a[i];
                    let include = match dir {
                        0..=5 => true,
                        6 | 7 => forward,
                        _ => !forward,
                    };
                    if !include {
                        continue;
                    }
                    for &path in &paths {
                        on.push(Fault::HbBlock { path, from: i, to: j, on: true });
                        off.push(Fault::HbBlock { path, from: i, to: j, on: false });
                    }
                }
            }
            pair(
                Fault::Many("heartbeat-only partition", on),
                l,
                Fault::Many("heartbeat-only partition healed", off),
                out,
            );
        }
        36..=43 => {
            // IP partition of data and/or management network, maybe one-directional, maybe
            // also cutting the client off the minority.
            let a = subset(r, n);
            let nets: Vec<usize> = match r.below(10) {
                0..=5 => vec![0, 1],
                6..=7 => vec![0],
                _ => vec![1],
            };
            let one_way = r.chance(0.25);
            let cut_client = r.chance(0.5);
            let l = r.range(200, 6_000);
            let mut on = Vec::new();
            let mut off = Vec::new();
            for i in 0..n {
                for j in 0..n {
                    if a[i] == a[j] || (one_way && !a[i]) {
                        continue;
                    }
                    for &net in &nets {
                        on.push(Fault::Cut { net, from: i, to: j, on: true });
                        off.push(Fault::Cut { net, from: i, to: j, on: false });
                    }
                }
                if cut_client && a[i] {
                    on.push(Fault::Client(i, false));
                    off.push(Fault::Client(i, true));
                }
            }
            pair(Fault::Many("network partition", on), l, Fault::Many("network partition healed", off), out);
        }
        44..=49 => {
            // A node isolated from everything (the switch port's VLAN is gone).
            let l = r.range(200, 5_000);
            let store_too = r.chance(0.5);
            let mut on = vec![Fault::Gateway(x, false), Fault::Client(x, false)];
            let mut off = vec![Fault::Gateway(x, true), Fault::Client(x, true)];
            if store_too {
                on.push(Fault::Store(x, false));
                off.push(Fault::Store(x, true));
            }
            for j in 0..n {
                if j == x {
                    continue;
                }
                for net in 0..PATHS {
                    for (from, to) in [(x, j), (j, x)] {
                        on.push(Fault::Cut { net, from, to, on: true });
                        off.push(Fault::Cut { net, from, to, on: false });
                    }
                }
            }
            pair(Fault::Many("node isolated", on), l, Fault::Many("node isolation healed", off), out);
        }
        50..=55 => {
            let l = r.range(100, 4_000);
            pair(Fault::Carrier(x, false), l, Fault::Carrier(x, true), out);
        }
        56..=58 => {
            let l = r.range(100, 4_000);
            pair(Fault::Mgmt(x, false), l, Fault::Mgmt(x, true), out);
        }
        59..=63 => {
            let l = r.range(100, 4_000);
            if r.chance(0.3) {
                let on = (0..n).map(|i| Fault::Gateway(i, false)).collect();
                let off = (0..n).map(|i| Fault::Gateway(i, true)).collect();
                pair(Fault::Many("gateway down", on), l, Fault::Many("gateway back", off), out);
            } else {
                pair(Fault::Gateway(x, false), l, Fault::Gateway(x, true), out);
            }
        }
        64..=66 => {
            let l = r.range(100, 4_000);
            pair(Fault::Client(x, false), l, Fault::Client(x, true), out);
        }
        67..=71 => {
            let l = r.range(100, 5_000);
            if r.chance(0.4) {
                let on = (0..n).map(|i| Fault::Store(i, false)).collect();
                let off = (0..n).map(|i| Fault::Store(i, true)).collect();
                pair(Fault::Many("API server down", on), l, Fault::Many("API server back", off), out);
            } else {
                pair(Fault::Store(x, false), l, Fault::Store(x, true), out);
            }
        }
        72..=78 => {
            let l = r.range(300, 5_000);
            pair(Fault::Listener(x, false), l, Fault::Listener(x, true), out);
        }
        79..=81 => {
            let l = r.range(200, 4_000);
            pair(Fault::Skew(x, true), l, Fault::Skew(x, false), out);
        }
        82..=84 => {
            let l = r.range(200, 4_000);
            let k = u32::try_from(r.range(1, 1_000)).unwrap_or(1);
            pair(Fault::Key(x, k), l, Fault::Key(x, 0), out);
        }
        85..=88 => {
            let l = r.range(200, 5_000);
            let path = r.index(PATHS);
            let loss = u32::try_from(r.range(10, 300)).unwrap_or(100);
            pair(Fault::Loss(path, loss), l, Fault::Loss(path, 0), out);
        }
        89..=96 => {
            let target = if r.chance(0.5) { None } else { Some(super::world::node_name(r.index(n))) };
            out.push((s, Fault::Cmd(CmdTarget::Holder, Command::PlannedFailover { id: 0, target })));
        }
        97..=99 => {
            let target = if r.chance(0.5) { None } else { Some(super::world::node_name(r.index(n))) };
            out.push((s, Fault::Cmd(CmdTarget::Holder, Command::ForcedFailover { id: 0, target })));
        }
        100..=104 => {
            let l = r.range(500, 6_000);
            let force = r.chance(0.3);
            let who = if r.chance(0.5) { CmdTarget::Holder } else { CmdTarget::Node(x) };
            // The repair goes to every node: the holder may have changed meanwhile.
            pair(
                Fault::Cmd(who, Command::Maintenance { on: true, force }),
                l,
                Fault::Cmd(CmdTarget::All, Command::Maintenance { on: false, force: false }),
                out,
            );
        }
        105..=107 => {
            let l = r.range(500, 6_000);
            pair(
                Fault::Cmd(CmdTarget::All, Command::SetPaused(true)),
                l,
                Fault::Cmd(CmdTarget::All, Command::SetPaused(false)),
                out,
            );
        }
        108..=110 => out.push((s, Fault::Cmd(CmdTarget::All, Command::ClearSuspension))),
        111..=113 => out.push((s, Fault::Cmd(CmdTarget::All, Command::ResumeFailback))),
        114..=117 => {
            // A key change gone wrong before every member restarted: the nodes power off and
            // come back at about the same time with x on another key, so that nobody can
            // verify anybody else's heartbeats; the key is fixed later.
            let k = u32::try_from(r.range(1, 1_000)).unwrap_or(1);
            // One world change per node (a power-off registers the dead-holder check, which
            // the next change cancels: nobody is left to take over).
            // Without the Lease store (a standalone pair): nothing but the members themselves
            // can settle who holds.
            let on: Vec<Fault> = (0..n).map(Fault::PowerOn).collect();
            out.push((s, Fault::Many("no Lease store", (0..n).map(|i| Fault::Store(i, false)).collect())));
            out.push((s, Fault::Key(x, k)));
            for i in 0..n {
                out.push((s + 2 + i as u64, Fault::PowerOff(i)));
            }
            let back = s + r.range(200, 1_000);
            if back < end {
                out.push((back, Fault::Many("every node back at once", on)));
            }
            let fixed = back + r.range(3_000, 12_000);
            if fixed < end {
                out.push((fixed, Fault::Key(x, 0)));
                out.push((fixed, Fault::Many("Lease store back", (0..n).map(|i| Fault::Store(i, true)).collect())));
            }
        }
        124..=135 => {
            let after = r.range(300, 5_000);
            out.push((s, Fault::PowerOffHolder { after }));
        }
        136..=143 => {
            // Our addresses vanish from a node; maybe the kernel also refuses them back.
            let l = r.range(200, 4_000);
            if r.chance(0.5) {
                out.push((s, Fault::VipFlush(x)));
            } else {
                pair(
                    Fault::Many("VIPs flushed and refused", vec![Fault::AddFails(x, true), Fault::VipFlush(x)]),
                    l,
                    Fault::AddFails(x, false),
                    out,
                );
            }
        }
        144..=151 => {
            // A flapping data link: a fixed node's, or whichever node holds the VIPs at each
            // cycle (the worst case: every link that gets the VIPs starts to flap).
            let follow = r.chance(0.5);
            let down = r.range(50, 400);
            let up = r.range(100, 600);
            let until = s + r.range(1_000, 8_000);
            out.push((s, Fault::Flap { node: x, follow, down, up, until }));
        }
        152..=161 => {
            // An agent restart (often of the holder), with a damaged state file and/or a
            // wall-clock step (NTP after the restart, a fixed RTC: up to 90 s either way).
            let node = if r.chance(0.6) { None } else { Some(x) };
            let damage = match r.below(10) {
                0..=3 => Some(StateDamage::Lost),
                4..=5 => Some(StateDamage::SaysStandby),
                6..=7 => Some(StateDamage::Corrupt),
                _ => None,
            };
            let clock_step = if r.chance(0.4) { r.range(1_000, 180_000) as i64 - 90_000 } else { 0 };
            let after = r.range(50, 2_000);
            out.push((s, Fault::Restart { node, damage, clock_step, after }));
        }
        162..=167 => {
            // A stall (SIGSTOP, a frozen VM), often of the holder, long enough for a peer to
            // take over meanwhile; what arrives during it is processed in a burst after.
            let node = if r.chance(0.6) { None } else { Some(x) };
            out.push((s, Fault::Stall { node, len: r.range(200, 4_000) }));
        }
        168..=175 => {
            // A partition between the members alone, on every path: clients and gateways
            // still reach everybody (nobody can tell it from a dead peer without an arbiter).
            let a = subset(r, n);
            let l = r.range(500, 5_000);
            let mut on = Vec::new();
            let mut off = Vec::new();
            for i in 0..n {
                for j in 0..n {
                    if a[i] == a[j] {
                        continue;
                    }
                    for net in 0..PATHS {
                        on.push(Fault::Cut { net, from: i, to: j, on: true });
                        off.push(Fault::Cut { net, from: i, to: j, on: false });
                    }
                }
            }
            pair(Fault::Many("peer-only partition", on), l, Fault::Many("peer-only partition healed", off), out);
        }
        _ => {
            let l = r.range(500, 6_000);
            let level = match r.below(3) {
                0 => Some(200_000),
                1 => None,
                _ => Some(100),
            };
            if r.chance(0.5) {
                let on = (0..n).map(|i| Fault::Traffic(i, level)).collect();
                let off = (0..n).map(|i| Fault::Traffic(i, Some(1_000))).collect();
                pair(Fault::Many("traffic change", on), l, Fault::Many("traffic back to quiet", off), out);
            } else {
                pair(Fault::Traffic(x, level), l, Fault::Traffic(x, Some(1_000)), out);
            }
        }
    }
}
