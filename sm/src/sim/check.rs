//! The invariants, checked against the world's ground truth while a schedule runs.
//! Bounds and their justification are documented in [`super`].
//!
//! The checker is the world's [`Observer`]: the world tells it what happens as it happens
//! and it reads the world, never changes it (the world does not know it; it only traces
//! the violations reported back).
//!
//! Size: the invariants (a)–(m) side by side, each a short function over the same recorded
//! history; they are read and reviewed together.

use std::collections::VecDeque;

use super::bounds;
use super::types::{Findings, Invariant, MAX_NODES, MAX_VIPS, Violation};
use super::world::{CHECK_INTERVAL, GATEWAY_INTERVAL, Observation, Observer, PATHS, Snap, World, node_name};
use crate::config::FailbackPolicy;
use crate::io::{Alarm, Command, Reason};
use crate::machine::UNVERIFIED_PROBE_MS;
use crate::types::{MAX_EPOCH, Role};

/// A pending check of invariant (d): a crashed sole holder must be replaced by `deadline`.
#[derive(Clone, Debug)]
struct PendingD {
    /// Set by the power-off's own world event; any further one cancels the check.
    armed: bool,
    t0: u64,
    deadline: u64,
    dead: usize,
    standby: usize,
}

/// A pending check of invariant (i): the restarted sole holder still holds alone then.
#[derive(Clone, Debug)]
struct PendingI {
    t0: u64,
    deadline: u64,
    n: usize,
}

/// Checker state: ground-truth timelines plus mirrors of the policy counters.
pub(super) struct Checker {
    /// The violations and counters so far.
    found: Findings,
    /// Violations found while being told of the current observation (for the trace).
    fresh: Vec<Violation>,
    /// Since when node `n` holds VIP `v` in its kernel.
    hold_since: [[Option<u64>; MAX_VIPS]; MAX_NODES],
    listener_since: [Option<u64>; MAX_NODES],
    data_since: [[Option<u64>; MAX_NODES]; MAX_NODES],
    conn_since: [[Option<u64>; MAX_NODES]; MAX_NODES],
    conn_lossless_since: [[Option<u64>; MAX_NODES]; MAX_NODES],
    gw_bad_since: [Option<u64>; MAX_NODES],
    max_epoch: [u64; MAX_NODES],
    moves: Vec<VecDeque<u64>>,
    suspended: [bool; MAX_NODES],
    quiet_from: [u64; MAX_NODES],
    nonpref: Vec<VecDeque<u64>>,
    quarantined_until: [u64; MAX_NODES],
    maintenance: [bool; MAX_NODES],
    any_maintenance: bool,
    pending_d: Option<PendingD>,
    /// When node `n`'s carrier last returned while its agent was running (for (h)).
    carrier_back_at: [Option<u64>; MAX_NODES],
    pending_i: Vec<PendingI>,
    /// (j): the node whose post-stall burst is being fed, and whether it announced.
    burst: Option<(usize, bool)>,
    /// (k): since when node `i` hears nothing (verifiable or not) from node `j`.
    deaf_since: [[Option<u64>; MAX_NODES]; MAX_NODES],
    /// (l): since when nodes `i` and `j` both hold a client-reachable VIP while both run
    /// and reach the witness.
    witness_dual_since: [[Option<u64>; MAX_NODES]; MAX_NODES],
    /// (l): since when node `n` runs, reaches the witness and holds the VIPs.
    witness_ok_since: [Option<u64>; MAX_NODES],
    /// (m): since when nodes `i` and `j` both hold a VIP while they cannot verify each
    /// other's heartbeats (different keys) but exchange them and reach each other on the
    /// data network.
    unverified_dual_since: [[Option<u64>; MAX_NODES]; MAX_NODES],
    /// (o): since when node `n` runs, cannot reach the store and holds a VIP.
    minority_since: [Option<u64>; MAX_NODES],
    last_world: u64,
    n: usize,
    nv: usize,
}

fn upd(slot: &mut Option<u64>, on: bool, t: u64) {
    if on {
        slot.get_or_insert(t);
    } else {
        *slot = None;
    }
}

fn held_for(since: Option<u64>, t: u64, w: u64) -> bool {
    since.is_some_and(|s| t.saturating_sub(s) >= w)
}

impl Checker {
    pub(super) fn new(n: usize, nv: usize) -> Checker {
        Checker {
            found: Findings::default(),
            fresh: Vec::new(),
            hold_since: [[None; MAX_VIPS]; MAX_NODES],
            listener_since: [None; MAX_NODES],
            data_since: [[None; MAX_NODES]; MAX_NODES],
            conn_since: [[None; MAX_NODES]; MAX_NODES],
            conn_lossless_since: [[None; MAX_NODES]; MAX_NODES],
            gw_bad_since: [None; MAX_NODES],
            max_epoch: [0; MAX_NODES],
            moves: vec![VecDeque::new(); MAX_NODES],
            suspended: [false; MAX_NODES],
            quiet_from: [0; MAX_NODES],
            nonpref: vec![VecDeque::new(); MAX_NODES],
            quarantined_until: [0; MAX_NODES],
            maintenance: [false; MAX_NODES],
            any_maintenance: false,
            pending_d: None,
            carrier_back_at: [None; MAX_NODES],
            pending_i: Vec::new(),
            burst: None,
            deaf_since: [[None; MAX_NODES]; MAX_NODES],
            witness_dual_since: [[None; MAX_NODES]; MAX_NODES],
            witness_ok_since: [None; MAX_NODES],
            unverified_dual_since: [[None; MAX_NODES]; MAX_NODES],
            minority_since: [None; MAX_NODES],
            last_world: 0,
            n,
            nv,
        }
    }

    /// Records a violation (the first of each invariant per schedule; the world traces it).
    fn violate(&mut self, t: u64, invariant: Invariant, detail: String) {
        if self.found.violations.iter().any(|v| v.invariant == invariant) {
            return;
        }
        let v = Violation { invariant, at_ms: t, detail };
        self.found.violations.push(v.clone());
        self.fresh.push(v);
    }

    /// Recomputes the ground-truth timelines after a world change.
    fn refresh_links(&mut self, w: &World) {
        let t = w.t;
        let n = self.n;
        for i in 0..n {
            let l = w.nodes[i].powered && w.nodes[i].listener;
            upd(&mut self.listener_since[i], l, t);
            let node = &w.nodes[i];
            let gw_bad = w.p.gateway_configured && node.powered && !(node.gw && node.carrier);
            upd(&mut self.gw_bad_since[i], gw_bad, t);
            for j in 0..n {
                let d = w.data_reach(i, j);
                upd(&mut self.data_since[i][j], d, t);
                let deaf = i != j && !(0..PATHS).any(|p| w.path_ok(p, j, i) && w.nodes[j].live());
                upd(&mut self.deaf_since[i][j], deaf, t);
                if i < j {
                    let c = w.connected(i, j, false);
                    upd(&mut self.conn_since[i][j], c, t);
                    let cl = w.connected(i, j, true);
                    upd(&mut self.conn_lossless_since[i][j], cl, t);
                }
            }
        }
    }

    /// The agents are about to boot: a warm start's holder has held the VIPs from time 0.
    fn start(&mut self, w: &World) {
        for n in 0..self.n {
            for v in 0..self.nv {
                if w.nodes[n].kernel & (1 << v) != 0 {
                    self.hold_since[n][v] = Some(w.t);
                }
            }
        }
        self.refresh_links(w);
    }

    /// Node `n`'s kernel VIPs changed from `old` to `new`.
    fn on_kernel(&mut self, w: &World, n: usize, old: u8, new: u8) {
        for v in 0..self.nv {
            let (was, is) = (old & (1 << v) != 0, new & (1 << v) != 0);
            if was != is {
                self.hold_since[n][v] = is.then_some(w.t);
            }
        }
    }

    /// (f): a Lease compare-and-swap raises the epoch, by a step the store accepts.
    fn on_cas_sent(&mut self, w: &World, n: usize, expected: u64, new: u64) {
        if new <= expected {
            let d = format!("{} sent a Lease CAS from epoch {expected} to {new}", node_name(n));
            self.violate(w.t, Invariant::EpochBackwards, d);
        }
        if let Some(max) = w.nodes[n].cfg.lease_max_step
            && new > expected.saturating_add(max)
        {
            let d =
                format!("{} sent a Lease CAS from epoch {expected} to {new}, a step the store refuses", node_name(n));
            self.violate(w.t, Invariant::EpochBackwards, d);
        }
    }

    /// (f), (g): the Lease's epoch never goes back nor leaves the domain.
    fn on_lease_write(&mut self, w: &World, n: usize, old: u64, new: u64) {
        if new > MAX_EPOCH {
            let d = format!("Lease epoch {new} beyond the domain by {}", node_name(n));
            self.violate(w.t, Invariant::StaleEpoch, d);
        }
        if new < old {
            let d = format!("Lease epoch would go backwards: {old} -> {new} by {}", node_name(n));
            self.violate(w.t, Invariant::EpochBackwards, d);
        }
    }

    /// (f), (g): a persisted epoch never goes back nor leaves the domain (`w` still holds
    /// the state file before the write).
    fn on_persist(&mut self, w: &World, n: usize, epoch: u64) {
        if epoch > MAX_EPOCH {
            let d = format!("{} persisted epoch {epoch} beyond the domain", node_name(n));
            self.violate(w.t, Invariant::StaleEpoch, d);
        }
        let was = w.nodes[n].persisted.epoch;
        if epoch < was {
            let d = format!("{} persisted epoch {epoch} after {was}", node_name(n));
            self.violate(w.t, Invariant::EpochBackwards, d);
        }
    }

    fn after_world_event(&mut self, w: &World) {
        self.refresh_links(w);
        match self.pending_d.as_mut() {
            // The power-off that registered the check.
            Some(p) if !p.armed && w.t == p.t0 => p.armed = true,
            // Another change during the window (also in the same millisecond, e.g. the
            // standby paused as the holder dies): the bound no longer applies.
            Some(_) => self.pending_d = None,
            None => {}
        }
        let t = w.t;
        self.pending_i.retain(|p| t <= p.t0);
        self.last_world = w.t;
    }

    /// Evaluated every few virtual ms: (a), (k) and the deadlines of (d) and (i).
    fn periodic(&mut self, w: &World) {
        self.check_dual(w);
        self.check_witness_dual(w);
        self.check_unverified_dual(w);
        self.check_quorum_minority(w);
        if w.p.quorum.is_some() {
            // The store lost during the window: the restarted member is on the minority side.
            self.pending_i.retain(|p| w.nodes[p.n].store);
        }
        let due: Vec<PendingI> = self.pending_i.iter().filter(|p| w.t >= p.deadline).cloned().collect();
        self.pending_i.retain(|p| w.t < p.deadline);
        for p in due {
            self.found.restarts_checked += 1;
            let all = (1u8 << self.nv) - 1;
            let (full, any) = w.holders();
            let holds = w.nodes[p.n].machine.as_ref().is_some_and(|m| m.holds_vips());
            if !(full == vec![p.n] && any == 1 && holds) {
                let d = format!(
                    "{} restarted at {} ms holding every VIP alone (persisted {:?}); {} ms later \
                     holders are {:?} (kernel {:#04b}, machine holds {holds})",
                    node_name(p.n),
                    p.t0,
                    w.nodes[p.n].persisted.last_role,
                    w.t - p.t0,
                    full.iter().map(|&i| node_name(i)).collect::<Vec<_>>(),
                    w.nodes[p.n].kernel & all,
                );
                self.violate(w.t, Invariant::RestartMovedVips, d);
            }
        }
        if let Some(p) = self.pending_d.clone()
            && w.t < p.deadline
            && !w.holders().0.is_empty()
        {
            self.pending_d = None;
            self.found.d_checked += 1;
            self.found.replacement_ms.push(w.t - p.t0);
        }
        if let Some(p) = self.pending_d.clone()
            && w.t >= p.deadline
        {
            self.pending_d = None;
            self.found.d_checked += 1;
            let (full, _) = w.holders();
            if full.is_empty() {
                let d = format!(
                    "{} (sole holder) powered off at {} ms with {} a ready standby; nobody \
                     holds the VIPs {} ms later (bound {} ms)",
                    node_name(p.dead),
                    p.t0,
                    node_name(p.standby),
                    w.t - p.t0,
                    p.deadline - p.t0
                );
                self.violate(w.t, Invariant::SlowReplacement, d);
            }
        }
    }

    /// (a): two holders of a VIP that the client reaches, while they have a working
    /// heartbeat path between them, for longer than the bound.
    fn check_dual(&mut self, w: &World) {
        let t = w.t;
        let lossless_bound = bounds::dual_lossless(&w.p.timings, w.p.max_delay());
        for v in 0..self.nv {
            for i in 0..self.n {
                if !(w.nodes[i].powered && w.nodes[i].kernel & (1 << v) != 0 && w.client_reach(i)) {
                    continue;
                }
                for j in (i + 1)..self.n {
                    if !(w.nodes[j].powered && w.nodes[j].kernel & (1 << v) != 0 && w.client_reach(j)) {
                        continue;
                    }
                    let both = self.hold_since[i][v].max(self.hold_since[j][v]);
                    let Some(both) = both else {
                        continue;
                    };
                    if let Some(c) = self.conn_since[i][j] {
                        self.found.dual_max_ms = self.found.dual_max_ms.max(t.saturating_sub(both.max(c)));
                    }
                    let mut bad = None;
                    if let Some(c) = self.conn_lossless_since[i][j]
                        && t.saturating_sub(both.max(c)) > lossless_bound
                    {
                        bad = Some(("a lossless", t - both.max(c), lossless_bound));
                    } else if let Some(c) = self.conn_since[i][j]
                        && t.saturating_sub(both.max(c)) > bounds::DUAL_LOSSY
                    {
                        bad = Some(("a lossy", t - both.max(c), bounds::DUAL_LOSSY));
                    }
                    if let Some((kind, dur, bound)) = bad {
                        let d = format!(
                            "{} and {} both hold VIP #{v} reachable by the client for {dur} ms \
                             while connected by {kind} heartbeat path (bound {bound} ms)",
                            node_name(i),
                            node_name(j)
                        );
                        self.violate(w.t, Invariant::DualHolders, d);
                    }
                    self.check_silent_dual(w, i, j, both);
                    self.check_silent_dual(w, j, i, both);
                }
            }
        }
    }

    /// (o): with quorum fencing, a member that runs but cannot reach the store (the
    /// minority side) gives the VIPs up within the quorum lease — counted from its last
    /// confirmation, which is no later than the loss — plus a heartbeat interval (an idle
    /// holder's tick) and the check's granularity. A stopped agent is not running; the count
    /// starts again when it resumes (its first step gives them up).
    fn check_quorum_minority(&mut self, w: &World) {
        let Some(lease) = w.p.quorum else {
            return;
        };
        let bound = lease + w.p.timings.heartbeat_interval_ms + w.p.timings.tick_ms + 2 * CHECK_INTERVAL;
        for n in 0..self.n {
            let nd = &w.nodes[n];
            let on = nd.live() && !nd.store && nd.kernel != 0;
            upd(&mut self.minority_since[n], on, w.t);
            if let Some(s) = self.minority_since[n]
                && w.t.saturating_sub(s) > bound
            {
                self.minority_since[n] = None;
                let d = format!(
                    "{} cannot reach the store (the minority side) and still holds a VIP {} ms later (bound {bound} ms)",
                    node_name(n),
                    w.t - s
                );
                self.violate(w.t, Invariant::QuorumMinority, d);
            }
        }
    }

    /// (l): with a witness, two members that both run and reach it never hold a VIP the
    /// client reaches at once for longer than a read of the witness and its latency.
    fn check_witness_dual(&mut self, w: &World) {
        if !w.p.witness {
            return;
        }
        let t = w.t;
        for k in 0..self.n {
            let nd = &w.nodes[k];
            let ok = nd.live() && nd.store && nd.machine.as_ref().is_some_and(|m| m.holds_vips());
            upd(&mut self.witness_ok_since[k], ok, t);
        }
        // Plus a heartbeat timeout: a holder resumed after a stall may find queued adverts of
        // the new holder from before it took over, and gives a peer it hears as a standby
        // that long to show it acts on the newer record (the rule for late writes).
        let bound = w.p.witness_poll()
            + w.p.timings.heartbeat_timeout_ms
            + 4 * w.p.store_lat.1
            + 2 * w.p.timings.tick_ms
            + w.p.max_delay()
            + 2 * CHECK_INTERVAL
            + 50;
        for i in 0..self.n {
            for j in (i + 1)..self.n {
                // (A member in Demoting is in a planned handover's make-before-break overlap,
                // bounded by the 1 s confirm timeout: not this rule's.)
                let ok = |k: usize| {
                    let nd = &w.nodes[k];
                    let demoting = nd.machine.as_ref().is_some_and(|m| m.role() == Role::Demoting);
                    nd.live() && nd.store && w.client_reach(k) && !demoting
                };
                let shared = w.nodes[i].kernel & w.nodes[j].kernel != 0;
                let on = shared && ok(i) && ok(j);
                let since = &mut self.witness_dual_since[i][j];
                match (on, *since) {
                    (false, _) => *since = None,
                    (true, None) => *since = Some(t),
                    (true, Some(s)) if t.saturating_sub(s) > bound => {
                        *since = None;
                        let d = format!(
                            "{} and {} both hold a VIP the client reaches for {} ms while both run and \
                             reach the witness (bound {bound} ms)",
                            node_name(i),
                            node_name(j),
                            t - s
                        );
                        self.violate(w.t, Invariant::WitnessDual, d);
                    }
                    (true, Some(_)) => {}
                }
            }
        }
    }

    /// (m): two members holding a VIP whose heartbeats reach each other but fail
    /// verification (different keys), and who reach each other on the data network (each
    /// sees the other answer for the VIP): the one of lower priority gives the VIPs up
    /// within a conflict probe period, the settling time after an acquisition and a few
    /// ticks and delays.
    fn check_unverified_dual(&mut self, w: &World) {
        let t = w.t;
        let tm = &w.p.timings;
        let bound = UNVERIFIED_PROBE_MS
            + tm.reannounce_min_ms
            + tm.heartbeat_interval_ms
            + 3 * tm.tick_ms
            + 2 * w.p.max_delay()
            + 2 * CHECK_INTERVAL
            + 200;
        for i in 0..self.n {
            for j in (i + 1)..self.n {
                let holds = |k: usize| {
                    let nd = &w.nodes[k];
                    nd.live() && nd.machine.as_ref().is_some_and(|m| m.holds_vips() && m.role() == Role::Active)
                };
                let exchange = (0..PATHS).any(|p| w.path_ok(p, i, j) && w.path_ok(p, j, i) && w.path_loss(p) == 0);
                let on = w.nodes[i].kernel & w.nodes[j].kernel != 0
                    && holds(i)
                    && holds(j)
                    && w.nodes[i].key != w.nodes[j].key
                    && exchange
                    && w.data_reach(i, j);
                let since = &mut self.unverified_dual_since[i][j];
                match (on, *since) {
                    (false, _) => *since = None,
                    (true, None) => *since = Some(t),
                    (true, Some(s)) if t.saturating_sub(s) > bound => {
                        *since = None;
                        let d = format!(
                            "{} and {} both hold a VIP for {} ms while their heartbeats fail verification \
                             (different keys) and they reach each other (bound {bound} ms)",
                            node_name(i),
                            node_name(j),
                            t - s
                        );
                        self.violate(w.t, Invariant::UnverifiedDual, d);
                    }
                    (true, Some(s)) => {
                        self.found.unverified_dual_max_ms = self.found.unverified_dual_max_ms.max(t - s);
                    }
                }
            }
        }
    }

    /// (k): holder `i` has heard nothing from holder `j` for a second (a quiet standby's
    /// timeout and an interval, if longer) while both hold a VIP
    /// the client reaches: if its own links and gateway are fine (and no rejected heartbeats
    /// explain the silence), it raises `PeerSilent`.
    fn check_silent_dual(&mut self, w: &World, i: usize, j: usize, both_since: u64) {
        let t = w.t;
        let Some(deaf) = self.deaf_since[i][j] else {
            return;
        };
        let node = &w.nodes[i];
        // A second, or — when `j` was a quiet standby until the split — its timeout (the
        // quiet interval times the heartbeat timeout's multiple) and an interval more.
        let tm = &w.p.timings;
        let quiet_timeout =
            tm.quiet_interval_ms.saturating_mul(tm.heartbeat_timeout_ms) / tm.heartbeat_interval_ms.max(1);
        let bound = 1_000.max(quiet_timeout + tm.heartbeat_interval_ms);
        if t.saturating_sub(both_since.max(deaf)) < bound
            || !node.live()
            || t.saturating_sub(node.agent_started) < 2_000
        {
            return;
        }
        if self.gw_bad_since[i].is_some() || t.saturating_sub(self.last_world) < 1_000 {
            return;
        }
        let Some(m) = node.machine.as_ref() else {
            return;
        };
        let alarms = m.status().alarms;
        if alarms.contains(&Alarm::PeerSilent) {
            self.found.splits_checked += 1;
            return;
        }
        if alarms.contains(&Alarm::KeyMismatch) || alarms.contains(&Alarm::ClockSkew) {
            return;
        }
        let d = format!(
            "{} and {} both hold a VIP the client reaches and {} has heard nothing from {} since {deaf} ms, \
             with its links and gateway fine, but raises no PeerSilent",
            node_name(i),
            node_name(j),
            node_name(i),
            node_name(j)
        );
        self.violate(w.t, Invariant::SilentDualHolder, d);
    }

    /// Registers the (d) check when a sole holder is powered off in a quiet moment with a
    /// ready standby.
    fn before_power_off(&mut self, w: &World, h: usize) {
        let t = w.t;
        if t < 3_000 || t.saturating_sub(self.last_world) < 2_000 {
            return;
        }
        // No loss, and no kernel refusing addresses (the best-ranked standby could win the
        // race and fail to add them: the machine then moves on via its VIP-unhealthy
        // handover, which is not this bound).
        if w.loss.iter().any(|l| *l > 0) || w.nodes.iter().any(|n| n.add_fails) {
            return;
        }
        let all = (1u8 << self.nv) - 1;
        if w.nodes[h].kernel != all {
            return;
        }
        if (0..self.n).any(|i| i != h && w.nodes[i].powered && w.nodes[i].kernel != 0) {
            return;
        }
        let Some(s) = (0..self.n).find(|&s| s != h && Self::ready_standby(w, s)) else {
            return;
        };
        let store_down = (0..self.n).any(|i| !w.nodes[i].store);
        if store_down && w.p.witness {
            // No vote, no takeover: by design nobody replaces the holder meanwhile.
            return;
        }
        let mut bound = bounds::takeover(&w.p.timings, w.p.max_delay(), self.n, w.p.store_lat.1, store_down);
        // A standby partitioned from the holder that saw it renew the Lease waits, by
        // design, until the last renewal is lease_alive_ms old.
        if w.nodes[s].machine.as_ref().is_some_and(|m| m.status().alarms.contains(&Alarm::PeerPartition)) {
            bound += w.p.timings.lease_alive_ms;
        }
        if w.p.witness {
            // The witness may have heard the holder after the last heartbeat the standby
            // heard: one refused claim, then a heartbeat timeout of back-off.
            bound += w.p.timings.heartbeat_timeout_ms + w.p.witness_poll();
            // Quorum fencing: the voters' longer grace (the quorum lease and two reads).
            bound += w.p.witness_grace().saturating_sub(w.p.timings.heartbeat_timeout_ms / 2);
        }
        self.pending_d = Some(PendingD { armed: false, t0: t, deadline: t + bound, dead: h, standby: s });
    }

    /// A standby that must be able to take over at once: its agent runs (for a while),
    /// it is Standby and outside hold-down and boot hold, healthy links, a kernel that
    /// accepts addresses, no maintenance, and (without a data-plane target) not suspended
    /// or paused.
    fn ready_standby(w: &World, s: usize) -> bool {
        let node = &w.nodes[s];
        if !node.live() || w.t.saturating_sub(node.agent_started) < 3_000 {
            return false;
        }
        if !node.carrier || (w.p.gateway_configured && !node.gw) || node.add_fails {
            return false;
        }
        let Some(m) = node.machine.as_ref() else {
            return false;
        };
        if m.role() != Role::Standby {
            return false;
        }
        let st = m.status();
        let now = w.t + node.mono_base;
        let hold_ok = st.hold_down_until.is_none_or(|u| u.0 <= now) && st.carrier_settled_at.is_none_or(|u| u.0 <= now);
        let unknown_ok = w.p.has_target || (!st.suspended && !st.paused && !st.peers.iter().any(|p| p.suspended));
        hold_ok
            && st.boot_hold_until.is_none()
            && st.config_valid
            && !st.maintenance
            && st.carrier_ok
            && st.gateway != Some(false)
            && !st.alarms.contains(&Alarm::VersionMismatch)
            && !st.alarms.contains(&Alarm::EpochExhausted)
            && st.operation.is_none()
            && unknown_ok
    }

    /// A carrier change of node `n` (for (h): a return its running agent observes).
    /// A return in the agent's first millisecond is none: the agent's first reading of the
    /// links (1 ms after its start) is of a carrier that is up, as after any start.
    fn on_carrier(&mut self, w: &World, n: usize, up: bool) {
        let observed = w.t > w.nodes[n].agent_started.saturating_add(1);
        self.carrier_back_at[n] = (up && w.nodes[n].live() && observed).then_some(w.t);
    }

    /// Node `n`'s agent resumed after a pause: carrier changes during the pause were not
    /// observed as such.
    fn on_resume(&mut self, n: usize) {
        self.carrier_back_at[n] = None;
    }

    /// A state file was damaged or replaced: its epoch may go backwards (a lost file starts
    /// at 0) without that being the machine's fault.
    fn on_state_damage(&mut self, w: &World, n: usize) {
        self.max_epoch[n] = w.nodes[n].persisted.epoch;
    }

    /// (j): the post-stall burst of node `n` begins.
    fn burst_begin(&mut self, n: usize) {
        self.burst = Some((n, false));
    }

    /// (j): an `Announce` by node `n`.
    fn on_announce(&mut self, n: usize) {
        if let Some((b, announced)) = self.burst.as_mut()
            && *b == n
        {
            *announced = true;
        }
    }

    /// (j): the burst is processed; an announcement in it must have been for VIPs still held.
    fn burst_end(&mut self, w: &World, n: usize) {
        self.found.bursts_checked += 1;
        let announced = self.burst.take().is_some_and(|(b, a)| b == n && a);
        let holds = w.nodes[n].machine.as_ref().is_some_and(|m| m.holds_vips());
        if announced && !holds {
            let d = format!(
                "{} announced the VIPs while processing the inputs queued during its stall, then gave them up",
                node_name(n)
            );
            self.violate(w.t, Invariant::AnnouncedStale, d);
        }
    }

    /// (i): registers the check that this restart moves nothing, when it must not.
    fn register_restart_check(&mut self, w: &World, n: usize) {
        let all = (1u8 << self.nv) - 1;
        let node = &w.nodes[n];
        let alone = node.kernel == all && (0..self.n).all(|i| i == n || w.nodes[i].kernel == 0 || !w.nodes[i].powered);
        let fine = node.listener && node.carrier && (!w.p.gateway_configured || node.gw) && !node.add_fails;
        let adopts = !node.persisted.maintenance || matches!(node.persisted.last_role, Role::Active | Role::Demoting);
        // (With quorum fencing a member that cannot reach the store is on the minority side:
        // it gives the VIPs up by design — invariant (o) — so its restart may move them.)
        let lease_ok =
            (w.store_holder == Some(n) || w.store_epoch == 0 || !node.store) && (w.p.quorum.is_none() || node.store);
        // Every peer has reached the VIP for a while (its probes say "up"): a partition that
        // began just before the restart may rightly move the VIPs.
        let window = bounds::stale_evidence(&w.p.timings);
        let reached = held_for(self.listener_since[n], w.t, window)
            && (0..self.n).all(|j| j == n || !w.nodes[j].powered || held_for(self.data_since[j][n], w.t, window));
        let nobody_claims = (0..self.n)
            .filter(|&i| i != n)
            .all(|i| w.nodes[i].machine.as_ref().is_none_or(|m| m.held_epoch().is_none()) && !w.nodes[i].add_fails);
        // Without a data-plane target a peer takes over an agent that is down for a heartbeat
        // timeout (heartbeat and gateway decide): then a restart may find a newer holder.
        if w.p.has_target && alone && fine && adopts && lease_ok && nobody_claims && reached {
            let deadline = w.t + w.p.timings.init_listen_ms + 500;
            self.pending_i.push(PendingI { t0: w.t, deadline, n });
        }
    }

    fn on_agent_start(&mut self, w: &World, n: usize) {
        self.carrier_back_at[n] = None;
        self.register_restart_check(w, n);
        let e = w.nodes[n].persisted.epoch;
        if e < self.max_epoch[n] {
            let d = format!("{} restarted with epoch {e} after having known {}", node_name(n), self.max_epoch[n]);
            self.violate(w.t, Invariant::EpochBackwards, d);
        }
        self.moves[n].clear();
        self.nonpref[n].clear();
        self.quarantined_until[n] = 0;
        self.suspended[n] = w.nodes[n].persisted.suspended;
        self.quiet_from[n] = w.t;
        self.maintenance[n] = w.nodes[n].persisted.maintenance;
    }

    fn on_command(&mut self, n: usize, cmd: &Command) {
        match cmd {
            Command::Maintenance { on, .. } => {
                self.maintenance[n] = *on;
                self.any_maintenance |= *on;
            }
            Command::ClearSuspension => {
                self.suspended[n] = false;
                self.moves[n].clear();
            }
            _ => {}
        }
    }

    /// Mirror of the flap suspension (same rule as the machine, from its own outputs).
    fn suspended_at(&mut self, n: usize, t: u64, quiet: u64) -> bool {
        if self.suspended[n] && t.saturating_sub(self.quiet_from[n]) >= quiet {
            self.suspended[n] = false;
            self.moves[n].clear();
        }
        self.suspended[n]
    }

    fn record_move(&mut self, w: &World, n: usize) {
        let t = w.t;
        let quiet = 10_000;
        let window = 20_000;
        self.suspended_at(n, t, quiet);
        let q = &mut self.moves[n];
        q.push_back(t);
        while q.front().is_some_and(|&m| t.saturating_sub(m) >= window) {
            q.pop_front();
        }
        self.quiet_from[n] = t;
        if self.moves[n].len() >= 3 {
            self.suspended[n] = true;
        }
    }

    fn top_priority(w: &World, n: usize) -> bool {
        w.nodes.iter().all(|x| x.priority <= w.nodes[n].priority)
    }

    /// (e) at the moment an active commits a handover.
    fn on_handover_start(&mut self, w: &World, n: usize, reason: Reason) {
        if !reason.discretionary() {
            return;
        }
        let t = w.t;
        if self.suspended_at(n, t, 10_000) {
            let d = format!("{} started a discretionary handover ({reason:?}) while flap-suspended", node_name(n));
            self.violate(w.t, Invariant::PolicyViolated, d);
        }
        if reason == Reason::Failback && !self.any_maintenance && t < self.quarantined_until[n] {
            let d =
                format!("{} failed back while in quarantine (until {} ms)", node_name(n), self.quarantined_until[n]);
            self.violate(w.t, Invariant::PolicyViolated, d);
        }
    }

    /// After every machine step: epochs (f), acquisitions (b, c, e) and the mirrors.
    fn after_step(&mut self, w: &World, n: usize, before: Snap, after: Snap) {
        if after.epoch < before.epoch || after.epoch < self.max_epoch[n] {
            let d =
                format!("{} epoch went from {} to {}", node_name(n), before.epoch.max(self.max_epoch[n]), after.epoch);
            self.violate(w.t, Invariant::EpochBackwards, d);
        }
        self.max_epoch[n] = self.max_epoch[n].max(after.epoch);
        if w.nodes[n].kernel != 0 && w.nodes[n].machine.as_ref().is_some_and(|m| m.advertises_backup()) {
            let d = format!(
                "{} advertises a backup path while its kernel holds VIPs {:#b}",
                node_name(n),
                w.nodes[n].kernel
            );
            self.violate(w.t, Invariant::BackupPath, d);
        }
        let reason = w.nodes[n].machine.as_ref().and_then(|m| m.last_transition().map(|t| t.reason));
        if after.epoch > MAX_EPOCH || after.held.is_some_and(|e| e > MAX_EPOCH) {
            let d = format!("{} knows epoch {} (held {:?}), beyond the domain", node_name(n), after.epoch, after.held);
            self.violate(w.t, Invariant::StaleEpoch, d);
        }
        let fresh = matches!(
            reason,
            Some(Reason::Takeover | Reason::Election | Reason::HandoverAccepted | Reason::AutoHandoverAccepted)
        );
        if fresh
            && before.role != after.role
            && after.role == Role::Active
            && after.held.is_none_or(|e| e <= before.epoch)
        {
            let d = format!(
                "{} took the VIPs ({:?}) under epoch {:?}, not newer than the epoch {} it knew",
                node_name(n),
                reason,
                after.held,
                before.epoch
            );
            self.violate(w.t, Invariant::StaleEpoch, d);
        }
        if !before.holds && after.holds {
            if before.role == Role::Init || after.role == Role::Init {
                return; // adoption after an agent restart: the kernel held them already
            }
            if let Some(r) = reason {
                self.on_acquire(w, n, r);
            }
        } else if before.holds
            && !after.holds
            && let Some(r) = reason
            && r.automatic()
        {
            self.record_move(w, n);
        }
    }

    fn on_acquire(&mut self, w: &World, n: usize, reason: Reason) {
        let t = w.t;
        let unplanned = matches!(reason, Reason::Takeover | Reason::Election);
        if unplanned {
            self.found.takeovers += 1;
        }
        if unplanned && w.p.witness {
            // (l): the witness refuses a claim while it hears the holder holding; so nobody
            // takes over from a member that ran, reached it and held the VIPs throughout
            // the claim (its last read, the claim's flight, the answer).
            let window = w.p.witness_grace()
                + w.p.witness_poll()
                + w.p.timings.cas_timeout_ms
                + 4 * w.p.store_lat.1
                + 3 * CHECK_INTERVAL;
            for h in (0..self.n).filter(|&h| h != n) {
                if let Some(s) = self.witness_ok_since[h]
                    && t.saturating_sub(s) > window
                {
                    let d = format!(
                        "{} took the VIPs ({reason:?}) from {}, which ran, reached the witness and \
                         held them for the last {} ms (window {window} ms)",
                        node_name(n),
                        node_name(h),
                        t - s
                    );
                    self.violate(w.t, Invariant::WitnessDual, d);
                }
            }
        }
        if self.maintenance[n] {
            let d = format!("{} took the VIPs ({reason:?}) while in maintenance", node_name(n));
            self.violate(w.t, Invariant::PolicyViolated, d);
        }
        if !w.nodes[n].carrier {
            let d = format!("{} took the VIPs ({reason:?}) without carrier", node_name(n));
            self.violate(w.t, Invariant::IsolatedTakeover, d);
        }
        let stable = w.p.timings.carrier_stable_ms;
        if let Some(b) = self.carrier_back_at[n]
            && t.saturating_sub(b) < stable
        {
            let d = format!(
                "{} took the VIPs ({reason:?}) {} ms after its carrier returned (dampening {stable} ms)",
                node_name(n),
                t - b
            );
            self.violate(w.t, Invariant::FlappingLinkAttracts, d);
        }
        if held_for(self.gw_bad_since[n], t, GATEWAY_INTERVAL + 50) {
            let d = format!(
                "{} took the VIPs ({reason:?}) with its gateway unreachable since {} ms",
                node_name(n),
                self.gw_bad_since[n].unwrap_or(0)
            );
            self.violate(w.t, Invariant::IsolatedTakeover, d);
        }
        if unplanned && w.p.has_target {
            self.found.b_checked += 1;
            let window = bounds::stale_evidence(&w.p.timings);
            for h in 0..self.n {
                if h == n {
                    continue;
                }
                for v in 0..self.nv {
                    if w.p.vips[v].probe_ports.is_empty() {
                        continue;
                    }
                    if held_for(self.hold_since[h][v], t, window)
                        && held_for(self.listener_since[h], t, window)
                        && held_for(self.data_since[n][h], t, window)
                    {
                        let d = format!(
                            "{} took the VIPs ({reason:?}) although {} served VIP #{v} with a \
                             working data plane between them for at least {window} ms",
                            node_name(n),
                            node_name(h)
                        );
                        self.violate(w.t, Invariant::HeartbeatOnlyMove, d);
                    }
                }
            }
        }
        if unplanned && !w.p.has_target && self.suspended_at(n, t, 10_000) {
            let d = format!("{} took over with an unknown data plane while flap-suspended", node_name(n));
            self.violate(w.t, Invariant::PolicyViolated, d);
        }
        if reason.automatic() {
            self.record_move(w, n);
        }
        if let FailbackPolicy::Automatic(p) = &w.p.failback
            && matches!(reason, Reason::Takeover | Reason::AutoHandoverAccepted)
            && !Self::top_priority(w, n)
        {
            let (window, count, hold) = (p.quarantine_window_ms, p.quarantine_failovers, p.quarantine_hold_ms);
            let q = &mut self.nonpref[n];
            q.push_back(t);
            while q.front().is_some_and(|&m| t.saturating_sub(m) >= window) {
                q.pop_front();
            }
            if q.len() >= usize::try_from(count).unwrap_or(usize::MAX) {
                self.quarantined_until[n] = t + hold;
            }
        }
    }

    /// After the heal and the settle time: exactly one member holds every VIP.
    fn final_check(&mut self, w: &World) {
        if !final_ok(w) {
            let (full, any) = w.holders();
            let d = format!(
                "after the heal and {} ms: {} member(s) hold every VIP, {} hold some ({:?})",
                w.p.settle,
                full.len(),
                any,
                full.iter().map(|&i| node_name(i)).collect::<Vec<_>>()
            );
            self.violate(w.t, Invariant::NoHolderAfterHeal, d);
        }
        // (n): every healed member that holds nothing and is not in maintenance is the
        // ready standby a router should already know a path to.
        for (n, node) in w.nodes.iter().enumerate() {
            let Some(m) = node.machine.as_ref() else { continue };
            // A link that flapped may still be dampened (its settle time grows with the
            // flaps, beyond the settle period here): no backup path then, rightly.
            let dampened = matches!(m.status().not_ready, Some(crate::status::NotReady::CarrierSettling));
            if node.powered
                && !node.paused
                && node.kernel == 0
                && m.role() == Role::Standby
                && !dampened
                && !m.advertises_backup()
            {
                let d = format!(
                    "after the heal, {} is a standby that holds nothing yet advertises no backup path",
                    node_name(n)
                );
                self.violate(w.t, Invariant::BackupPath, d);
            }
        }
    }
}

impl Observer for Checker {
    fn observe(&mut self, w: &World, ev: Observation<'_>) -> Vec<Violation> {
        match ev {
            Observation::Start => self.start(w),
            Observation::WorldChanged => self.after_world_event(w),
            Observation::Periodic => self.periodic(w),
            Observation::Stepped { n, before, after } => self.after_step(w, n, before, after),
            Observation::Kernel { n, old, new } => self.on_kernel(w, n, old, new),
            Observation::Announced { n } => self.on_announce(n),
            Observation::CasSent { n, expected, new } => self.on_cas_sent(w, n, expected, new),
            Observation::LeaseWrite { n, old, new } => self.on_lease_write(w, n, old, new),
            Observation::Persist { n, epoch } => self.on_persist(w, n, epoch),
            Observation::HandoverStarted { n, reason } => self.on_handover_start(w, n, reason),
            Observation::AgentStarted { n } => self.on_agent_start(w, n),
            Observation::PowerOff { n } => self.before_power_off(w, n),
            Observation::StateReplaced { n } => self.on_state_damage(w, n),
            Observation::Carrier { n, up } => self.on_carrier(w, n, up),
            Observation::Resumed { n } => self.on_resume(n),
            Observation::BurstBegins { n } => self.burst_begin(n),
            Observation::BurstEnds { n } => self.burst_end(w, n),
            Observation::Command { n, cmd } => self.on_command(n, cmd),
            Observation::End => self.final_check(w),
        }
        std::mem::take(&mut self.fresh)
    }

    fn findings(&self) -> Findings {
        self.found.clone()
    }
}

/// After the heal and the settle time: exactly one member holds every VIP.
pub(super) fn final_ok(w: &World) -> bool {
    let (full, any) = w.holders();
    if any == 0 && exhausted(w) {
        return true;
    }
    full.len() == 1 && any == 1
}

/// Some running member reached the top of the epoch domain (nobody may take the VIPs).
fn exhausted(w: &World) -> bool {
    w.nodes.iter().filter_map(|n| n.machine.as_ref()).any(|m| m.status().alarms.contains(&Alarm::EpochExhausted))
}
