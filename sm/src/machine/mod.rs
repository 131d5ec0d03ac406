//! The machine: the `step` entry point, the tick schedule, and helpers shared by the
//! decision modules.
//!
//! Layout: `state` holds the machine's struct and every room's records (a leaf: the rooms
//! use it, it uses no room), `observe` folds inputs into the state, `standby` decides
//! acquisitions (election and takeover, with the Lease claim, and the way back from
//! Fenced and Maintenance), `active` decides what a holder does (handovers, fencing, two
//! actives, Lease reconcile, failback), `planned` runs the make-before-break handover
//! protocol on both sides (and remembers the operator's request ids), `partition` settles
//! a partition between the members through the Lease (and raises the alarms that tell of
//! one), `flap` counts automatic moves (flap suspension, failback quarantine, the
//! preferred member), `drain` drains a planned move, `report` builds adverts and status.
//!
//! Size: `step` (the one dispatch every input goes through), `next_tick`, and the helpers
//! every room shares (peers heard, carrier, epochs, role changes, alarms, evaluate/expire,
//! release/acquire); the rooms hold the rest. No I/O here, as everywhere in `sm`.

mod active;
mod drain;
mod flap;
mod observe;
mod partition;
mod planned;
mod report;
mod standby;
mod state;

pub use active::UNVERIFIED_PROBE_MS;
pub use state::Machine;

use state::{CasPurpose, Need, ProbeTrack, TgtPhase};

use crate::advert::Advert;
use crate::config::Timings;
use crate::io::{Action, Alarm, Event, Input, Persisted, Reason};
use crate::status::{NotReady, Transition};
use crate::types::{AnnounceKind, MAX_EPOCH, Millis, NodeId, Role, VipId};

/// The first multiple of `interval` after `t`: when a routine advert sent at `t` is next
/// due. Routine adverts go out on this grid of the machine's clock, not `interval` after
/// the last one: machines whose clocks share an origin (the pairs of one agent) send on the
/// same instants — one wakeup of the agent, and one datagram per member address for all of
/// them ([`crate::Advert`]s are bundled by the I/O layer) — and an advert sent off the
/// grid (at once, on a change) brings the next one forward, never later.
fn next_slot(t: Millis, interval: u64) -> Millis {
    let i = interval.max(1);
    Millis((t.0 / i).saturating_add(1).saturating_mul(i))
}

impl Machine {
    /// Feeds one observation taken at `now` and returns what to do, in order.
    pub fn step(&mut self, now: Millis, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        self.step_into(now, input, &mut out);
        out
    }

    /// Like [`Machine::step`], appending the actions to `out` (lets a caller reuse a
    /// buffer).
    pub fn step_into(&mut self, now: Millis, input: Input, out: &mut Vec<Action>) {
        let now = now.max(self.last_now);
        if self.started_at.is_some() && now.since(self.last_now) > self.t().heartbeat_timeout_ms {
            // The process was stalled (SIGSTOP, a suspended VM): data-plane evidence
            // gathered before the stall says nothing about now, and the inputs that queued
            // up meanwhile come first (the I/O layer feeds them before the next Tick).
            for tr in &mut self.probes {
                *tr = ProbeTrack::default();
            }
            self.catch_up = true;
        }
        if input == Input::Tick {
            self.catch_up = false;
        }
        self.last_now = now;
        if self.started_at.is_none() {
            self.started_at = Some(now);
            self.flap.quiet_from = now;
        }
        if !self.first_step_done {
            self.first_step_done = true;
            if let Some(e) = self.cfg_error.clone() {
                self.raise(Alarm::Misconfigured, e.to_string(), out);
            }
            if self.flap.suspended {
                self.raise(Alarm::Suspended, "flap suspension persisted across a restart".to_owned(), out);
            }
        }
        self.handle(now, input, out);
        if self.catch_up {
            // Only give up what a newer holder claims (the Lease side is in `on_lease`).
            if (self.holding || self.store.claim.is_some()) && !self.check_rival(now, out) {
                self.fence_without_quorum(now, out);
            }
        } else {
            self.evaluate(now, out);
        }
        self.persist_if_changed(out);
        self.pace_advert(now, out);
    }

    /// Sends this member's advert when one is owed: at once when asked, every heartbeat
    /// interval (a quiet standby: every [`Timings::quiet_interval_ms`]), and — while quiet,
    /// or on leaving quiet — as soon as anything it says differs from the last one sent.
    fn pace_advert(&mut self, now: Millis, out: &mut Vec<Action>) {
        if self.role == Role::Unpaired {
            return;
        }
        let interval = self.advert_interval(now);
        let quiet = interval > self.t().heartbeat_interval_ms;
        let due = self.pacing.last_advert_at.is_none_or(|t| now >= next_slot(t, interval));
        let watch = quiet || self.pacing.last_sent.is_some();
        if !(self.pacing.advert_now || due || watch) {
            return;
        }
        let advert = self.make_advert(interval);
        if self.pacing.advert_now || due || self.pacing.last_sent.as_ref() != Some(&advert) {
            self.pacing.advert_now = false;
            self.pacing.last_advert_at = Some(now);
            self.pacing.last_sent = quiet.then(|| advert.clone());
            out.push(Action::SendAdvert(advert));
        }
    }

    /// This member's heartbeat interval now: [`Timings::quiet_interval_ms`] for a quiet
    /// standby ([`Machine::quiet`]), else the heartbeat interval.
    fn advert_interval(&self, now: Millis) -> u64 {
        let t = self.t();
        if self.quiet(now) { t.quiet_interval_ms } else { t.heartbeat_interval_ms }
    }

    /// A quiet standby: a standby (not holding, claiming, draining, catching up after a
    /// stall, in no operation) that hears every peer, each of which declares its interval
    /// (an agent that honours this member's), and hears an active holder whose heartbeat
    /// is not overdue. Nothing is pending that needs its heartbeats often: the holder only
    /// needs to know that it exists; the standby itself still hears the holder at full rate.
    pub fn quiet(&self, now: Millis) -> bool {
        let t = self.t();
        t.quiet_interval_ms > t.heartbeat_interval_ms
            && self.role == Role::Standby
            && self.first_step_done
            && !self.holding
            && !self.catch_up
            && self.ops.op.is_none()
            && self.ops.tgt.is_none()
            && self.ops.sticky.is_none()
            && self.store.claim.is_none()
            && self.store.cas.is_none()
            && !self.drain_advertised()
            && !self.peers.is_empty()
            && (0..self.peers.len()).all(|i| self.heard_advert(i, now).is_some_and(|a| a.interval_ms > 0))
            && (0..self.peers.len())
                .any(|i| self.heard_advert(i, now).is_some_and(|a| a.holds_vips && a.role == Role::Active))
            && self.holder_deadline().is_some_and(|d| d > now)
    }

    /// When the I/O layer must feed the next [`Input::Tick`], the last one having been fed
    /// at `last_tick`.
    ///
    /// Every `tick_ms` while anything time-critical may be pending. In a steady state —
    /// an Active, Standby or Maintenance member with no planned operation, Lease write or
    /// claim outstanding, not catching up after a stall, no heartbeat owed now, and (when
    /// it does not hold the VIPs) hearing a holder whose next heartbeat is not overdue —
    /// only when its own next heartbeat is due and when a heard holder would become
    /// overdue (a fifth of an interval late), at least every heartbeat interval. Nothing else
    /// here needs a finer clock: a takeover starts with a silent holder (and from then on
    /// the ticks are fast again); the other timers (hold-down, failback windows, alarm
    /// clearing, the Lease renewals of a holder that cannot hear a peer) run for seconds
    /// and fire at most one heartbeat interval late. An idle member wakes about once per
    /// heartbeat instead of every tick — counted from its last step of any kind, since
    /// every step runs the same evaluation as a tick: a standby that hears its holder every
    /// interval needs no tick of its own in between.
    pub fn next_tick(&self, last_tick: Millis) -> Millis {
        let t = self.t();
        let fast = last_tick.plus(t.tick_ms);
        match self.steady_until() {
            Some(at) => at.min(self.last_now.max(last_tick).plus(t.heartbeat_interval_ms)).max(fast),
            None => fast,
        }
    }

    /// Whether this member, not holding the VIPs, needs the data-plane verdict now: no
    /// holder is heard, or a heard holder's heartbeat is overdue (a fifth of an interval late).
    /// The I/O layer probes the VIPs at the fast rate while this holds, slowly otherwise.
    pub fn holder_overdue(&self, now: Millis) -> bool {
        !self.holding && self.holder_deadline().is_none_or(|d| d <= now)
    }

    /// When the first heard holder becomes overdue: a fifth of an interval after its
    /// heartbeat was due (`None`: no peer is heard holding). From then on the data-plane
    /// verdict is gathered at the fast rate, so that it is ready when the heartbeat
    /// timeout expires.
    fn holder_deadline(&self) -> Option<Millis> {
        self.peers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.advert.as_ref().is_some_and(|a| a.holds_vips))
            .map(|(i, p)| {
                let interval = self.peer_interval(i);
                p.last_heard.iter().flatten().max().map_or(Millis(0), |h| h.plus(interval + interval / 5))
            })
            .min()
    }

    /// The latest tick a steady machine needs (`None`: not steady, tick fast).
    fn steady_until(&self) -> Option<Millis> {
        let steady_role = matches!(self.role, Role::Active | Role::Standby | Role::Maintenance);
        if !steady_role
            || !self.first_step_done
            || self.catch_up
            || self.ops.op.is_some()
            || self.ops.tgt.is_some()
            || self.store.cas.is_some()
            || self.store.claim.is_some()
            || self.pacing.advert_now
        {
            return None;
        }
        let mut at = next_slot(self.pacing.last_advert_at?, self.advert_interval(self.last_now));
        if let Some(until) = self.drain_until() {
            at = at.min(until);
        }
        if !self.holding {
            // A heard holder's takeover clock starts once it is overdue; with nobody heard
            // holding, elections and takeovers are due any moment.
            let deadline = self.holder_deadline().filter(|d| *d > self.last_now)?;
            at = at.min(deadline);
        }
        Some(at)
    }

    fn t(&self) -> &Timings {
        &self.cfg.timings
    }

    fn vip_ids(&self) -> Vec<VipId> {
        self.cfg.vips.iter().map(|v| v.id.clone()).collect()
    }

    /// Pair VIPs the kernel was last seen holding.
    fn local_pair_vips(&self) -> Vec<VipId> {
        match &self.local_vips {
            Some(present) => self.cfg.vips.iter().filter(|v| present.contains(&v.id)).map(|v| v.id.clone()).collect(),
            None => Vec::new(),
        }
    }

    fn missing_vips(&self) -> Vec<VipId> {
        match &self.local_vips {
            Some(present) => self.cfg.vips.iter().filter(|v| !present.contains(&v.id)).map(|v| v.id.clone()).collect(),
            None => Vec::new(),
        }
    }

    fn peer_index(&self, node: &NodeId) -> Option<usize> {
        self.peers.iter().position(|p| &p.node == node)
    }

    /// A declared interval as believed: up to this member's own quiet interval; the
    /// heartbeat interval when it is less or none.
    fn believed_interval(&self, declared: u64) -> u64 {
        let t = self.t();
        declared.min(t.quiet_interval_ms).max(t.heartbeat_interval_ms)
    }

    /// Peer `i`'s heartbeat interval, as its last advert declares it.
    fn peer_interval(&self, i: usize) -> u64 {
        self.believed_interval(self.peers[i].advert.as_ref().map_or(0, |a| u64::from(a.interval_ms)))
    }

    /// How long a heartbeat declaring `declared` keeps its sender heard on its path: the
    /// heartbeat timeout, scaled by the interval (a quiet standby's).
    fn timeout_for(&self, declared: u64) -> u64 {
        let t = self.t();
        let interval = self.believed_interval(declared);
        if interval <= t.heartbeat_interval_ms {
            return t.heartbeat_timeout_ms;
        }
        interval.saturating_mul(t.heartbeat_timeout_ms).div_ceil(t.heartbeat_interval_ms)
    }

    /// Until when peer `i` counts as heard (on the path heard last), if it was ever heard.
    fn heard_until(&self, i: usize) -> Option<Millis> {
        self.peers[i].heard_until.iter().flatten().max().copied()
    }

    fn peer_heard(&self, i: usize, now: Millis) -> bool {
        self.peers[i].heard_until.iter().any(|u| u.is_some_and(|u| now < u))
    }

    fn peer_heard_all(&self, i: usize, now: Millis) -> bool {
        let p = &self.peers[i];
        !p.heard_until.is_empty() && p.heard_until.iter().all(|u| u.is_some_and(|u| now < u))
    }

    /// The peer's advert if the peer is heard now.
    fn heard_advert(&self, i: usize, now: Millis) -> Option<&Advert> {
        if self.peer_heard(i, now) { self.peers[i].advert.as_ref() } else { None }
    }

    fn any_peer_heard(&self, now: Millis) -> bool {
        (0..self.peers.len()).any(|i| self.peer_heard(i, now))
    }

    /// Both local links have carrier (unknown counts as no).
    fn carrier_ok(&self) -> bool {
        self.link.carrier_data == Some(true) && self.link.carrier_vip == Some(true)
    }

    /// A local link is known to have lost carrier.
    fn carrier_lost(&self) -> bool {
        self.link.carrier_data == Some(false) || self.link.carrier_vip == Some(false)
    }

    /// Link dampening: the carrier returned less than the required time ago (not eligible
    /// to take the VIPs yet).
    fn carrier_settling(&self, now: Millis) -> bool {
        self.carrier_settled_at().is_some_and(|t| now < t)
    }

    /// When the returned carrier counts as stable (`None`: no return pending).
    fn carrier_settled_at(&self) -> Option<Millis> {
        if !self.carrier_ok() {
            return None;
        }
        self.link.carrier_returned_at.map(|t| t.plus(self.link.carrier_required_ms))
    }

    /// Cut off: a link without carrier or the gateway unreachable (fencing).
    fn cut_off(&self) -> bool {
        self.carrier_lost() || self.gateway == Some(false)
    }

    /// Own listeners answer for every (VIP, port); a VIP without ports is ready.
    fn ready_all(&self) -> bool {
        self.listeners.iter().all(|ports| ports.iter().all(|l| l.is_some_and(|l| l.up)))
    }

    /// Why peers would not hand this member the VIPs now (`None`: a ready target); the
    /// heartbeats' `ready_all` and the status agree through this.
    fn not_ready(&self) -> Option<NotReady> {
        if !self.ready_all() {
            Some(NotReady::Listener)
        } else if self.cut_off() {
            Some(NotReady::CutOff)
        } else if self.carrier_settling(self.last_now) {
            Some(NotReady::CarrierSettling)
        } else {
            None
        }
    }

    fn version_mismatch(&self) -> bool {
        let major = self.cfg.protocol.major;
        self.peers.iter().any(|p| p.advert.as_ref().is_some_and(|a| a.protocol_major != major))
    }

    /// This member or a heard peer is flap-suspended (discretionary moves are a pair-level
    /// decision, so the stricter view wins).
    fn pair_suspended(&self, now: Millis) -> bool {
        self.flap.suspended || (0..self.peers.len()).any(|i| self.heard_advert(i, now).is_some_and(|a| a.suspended))
    }

    fn in_hold_down(&self, now: Millis) -> bool {
        self.last_vip_change.is_some_and(|t| now.since(t) < self.t().hold_down_ms)
    }

    fn boot_hold_until(&self) -> Option<Millis> {
        if self.heard_any_peer || self.cfg.start_alone {
            return None;
        }
        self.started_at.map(|s| s.plus(self.t().boot_hold_ms))
    }

    fn bump_epoch(&mut self, e: u64) {
        self.epoch = self.epoch.max(e.min(MAX_EPOCH));
    }

    /// A fresh epoch newer than `base`, if the domain has one left. Never saturates: an
    /// epoch equal to its predecessor would tie with it (and ties fall back to priority).
    fn fresh_epoch(base: u64) -> Option<u64> {
        base.checked_add(1).filter(|e| *e <= MAX_EPOCH)
    }

    /// No fresh epoch is left above what this member knows.
    fn epoch_exhausted(&self) -> bool {
        let lease = self.store.lease.as_ref().map_or(0, |l| l.epoch);
        Self::fresh_epoch(self.epoch.max(self.held_epoch).max(lease)).is_none()
    }

    /// Epoch a CAS should expect: the Lease as last seen, else `fallback`.
    fn lease_expected(&self, fallback: u64) -> u64 {
        self.store.lease.as_ref().map_or(fallback, |l| l.epoch)
    }

    fn current_persisted(&self) -> Persisted {
        // Init is never recorded: an agent that crashes again during its Init listen must
        // still know whether it was the active member (to adopt the VIPs).
        let last_role = match self.role {
            Role::Init if !self.boot.adoption_decided => self.boot.boot_last_role,
            Role::Init if self.holding => Role::Active,
            Role::Init => Role::Standby,
            r => r,
        };
        Persisted {
            epoch: self.epoch,
            maintenance: self.maintenance,
            last_role,
            failback_paused: self.failback_paused,
            paused: self.paused,
            suspended: self.flap.suspended,
        }
    }

    /// Emits `Persist` when the durable state changed. Called before every action it
    /// protects (adding VIPs under a new epoch, ...) and at the end of each step.
    fn persist_if_changed(&mut self, out: &mut Vec<Action>) {
        let p = self.current_persisted();
        if p != self.last_persisted {
            self.last_persisted = p.clone();
            out.push(Action::Persist(p));
        }
    }

    fn set_role(&mut self, to: Role, reason: Reason, now: Millis, out: &mut Vec<Action>) {
        let from = self.role;
        if from == to {
            return;
        }
        self.role = to;
        if to != Role::Standby {
            self.store.candidate_since = None;
        }
        let epoch = if matches!(to, Role::Active | Role::Demoting) { self.held_epoch } else { self.epoch };
        self.last_transition = Some(Transition { from, to, reason, epoch, at: now });
        self.pacing.advert_now = true;
        self.persist_if_changed(out);
        out.push(Action::Report(Event::RoleChanged { from, to, reason, epoch }));
    }

    fn raise(&mut self, alarm: Alarm, detail: String, out: &mut Vec<Action>) {
        if self.alarms.insert(alarm) {
            out.push(Action::Report(Event::AlarmRaised { alarm, detail }));
        }
    }

    fn clear_alarm(&mut self, alarm: Alarm, out: &mut Vec<Action>) {
        if self.alarms.remove(&alarm) {
            out.push(Action::Report(Event::AlarmCleared { alarm }));
        }
    }

    /// Runs the decision for the current role until the role settles.
    fn evaluate(&mut self, now: Millis, out: &mut Vec<Action>) {
        self.expire(now, out);
        for _ in 0..4 {
            let before = (self.role, self.holding, self.ops.op.is_some());
            match self.role {
                Role::Init => self.eval_init(now, out),
                Role::Standby => self.eval_standby(now, out),
                Role::Active | Role::Demoting => self.eval_active(now, out),
                Role::Fenced => self.eval_fenced(now, out),
                Role::Maintenance => self.eval_maintenance(now, out),
                Role::Unpaired => {}
            }
            if (self.role, self.holding, self.ops.op.is_some()) == before {
                break;
            }
        }
        self.settle_partition(now, out);
        self.eval_drain(now, out);
    }

    /// Timers that do not depend on the role.
    fn expire(&mut self, now: Millis, out: &mut Vec<Action>) {
        if self.epoch_exhausted() {
            let detail = format!(
                "the pair epoch reached {MAX_EPOCH}, the top of its domain: no takeover or handover is possible \
                 until the pair's epochs are reset"
            );
            self.raise(Alarm::EpochExhausted, detail, out);
        }
        let clear = self.t().reject_alarm_clear_ms;
        if self.timers.key_mismatch_at.is_some_and(|t| now.since(t) >= clear) {
            self.timers.key_mismatch_at = None;
            self.clear_alarm(Alarm::KeyMismatch, out);
        }
        if self.timers.clock_skew_at.is_some_and(|t| now.since(t) >= clear) {
            self.timers.clock_skew_at = None;
            self.clear_alarm(Alarm::ClockSkew, out);
        }
        if self.timers.replay_at.is_some_and(|t| now.since(t) >= clear) {
            self.timers.replay_at = None;
            self.clear_alarm(Alarm::HeartbeatReplay, out);
        }
        let conflict_clear = self.t().conflict_clear_ms;
        if self.conflict_last.is_some_and(|t| now.since(t) >= conflict_clear) {
            self.conflict_last = None;
            self.conflict_macs.clear();
            self.clear_alarm(Alarm::VipConflict, out);
        }
        if self.ops.sticky.as_ref().is_some_and(|(_, until)| now >= *until) {
            self.ops.sticky = None;
        }
        let tgt_life = self.t().confirm_timeout_ms.saturating_mul(2);
        if self.ops.tgt.as_ref().is_some_and(|t| now.since(t.at) >= tgt_life) {
            self.ops.tgt = None;
        }
        // An accepted handover is over once the initiator is heard no longer holding.
        if let Some(t) = &self.ops.tgt
            && matches!(t.phase, TgtPhase::Accepted { .. })
            && let Some(i) = self.peer_index(&t.from)
            && self.heard_advert(i, now).is_some_and(|a| !a.holds_vips)
        {
            self.ops.tgt = None;
        }
        // An acked prepare whose initiator fell silent must not delay a takeover.
        if let Some(t) = &self.ops.tgt
            && t.phase == TgtPhase::Acked
            && self.peer_index(&t.from).is_none_or(|i| !self.peer_heard(i, now))
        {
            self.ops.tgt = None;
        }
        if self.flap.suspended && now.since(self.flap.quiet_from) >= self.cfg.flap.quiet_ms {
            self.flap.suspended = false;
            self.flap.auto_moves.clear();
            self.clear_alarm(Alarm::Suspended, out);
        }
        if self.store.cas.as_ref().is_some_and(|c| now.since(c.sent_at) >= self.t().cas_timeout_ms) {
            // No answer in time: the store counts as unavailable.
            let purpose = self.store.cas.as_ref().map(|c| c.purpose);
            self.store.cas = None;
            self.store.lease_stale = true;
            if purpose == Some(CasPurpose::Claim) {
                self.on_cas_unavailable(now, out);
            }
        }
        if !self.version_mismatch() {
            self.clear_alarm(Alarm::VersionMismatch, out);
        }
        self.check_peer_silent(now, out);
        self.check_lease_behind(out);
        self.check_witness(out);
        for i in 0..self.peers.len() {
            let ok = self.candidate_problem(i, now, Need::Planned).is_none();
            let p = &mut self.peers[i];
            if ok {
                p.ready_since.get_or_insert(now);
            } else {
                p.ready_since = None;
            }
        }
    }

    /// Gives up the VIPs (or a claim) and moves to `to`.
    fn release(&mut self, now: Millis, to: Role, reason: Reason, out: &mut Vec<Action>) {
        let had = self.holding;
        self.holding = false;
        self.store.claim = None;
        self.active_since = None;
        self.vip_missing_since = None;
        if had {
            self.last_vip_change = Some(now);
        }
        if self.role != to {
            self.set_role(to, reason, now, out);
        }
        self.persist_if_changed(out);
        if had || !self.local_pair_vips().is_empty() {
            out.push(Action::RemoveVips(self.vip_ids()));
        }
        self.clear_alarm(Alarm::VipUnhealthy, out);
        self.clear_alarm(Alarm::MaintenancePending, out);
        if had && reason.automatic() {
            self.note_auto_move(now, out);
        }
        self.pacing.advert_now = true;
    }

    /// Takes the VIPs (after a successful claim, an unavailable store, or a commit).
    fn acquire(&mut self, now: Millis, reason: Reason, out: &mut Vec<Action>) {
        // A drain ends when the VIPs come back: `AddVips` makes them ordinary again.
        self.end_drain("the VIPs were taken back", false, out);
        self.store.claim = None;
        self.holding = true;
        self.active_since = Some(now);
        self.last_vip_change = Some(now);
        self.vip_missing_since = None;
        if matches!(reason, Reason::HandoverAccepted | Reason::AutoHandoverAccepted) {
            // A handover is the confirmed holder's own decision: the quorum lease starts
            // with it (the voters hear the new holder from its next read).
            self.store.confirmed_at = Some(now);
        }
        self.persist_if_changed(out);
        out.push(Action::AddVips(self.vip_ids()));
        out.push(Action::Announce { kind: AnnounceKind::Burst });
        let conflict_probe = !matches!(reason, Reason::HandoverAccepted | Reason::AutoHandoverAccepted);
        out.push(Action::SelfCheck { conflict_probe });
        self.pacing.last_burst = Some(now);
        self.pacing.advert_now = true;
        if reason.automatic() {
            self.note_auto_move(now, out);
        }
        if matches!(reason, Reason::Takeover | Reason::AutoHandoverAccepted) && !self.is_preferred() {
            self.note_nonpreferred_acquisition(now);
        }
    }
}
