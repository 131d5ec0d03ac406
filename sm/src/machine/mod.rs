//! The machine: state, the `step` entry point, and helpers shared by the decision modules.
//!
//! Layout: `observe` folds inputs into the state, `standby` decides acquisitions (election
//! and takeover, with the Lease claim), `active` decides what a holder does (handovers,
//! fencing, two actives, Lease reconcile, failback), `planned` runs the make-before-break
//! handover protocol on both sides, `partition` settles a partition between the members
//! through the Lease, `report` builds adverts and status.
//!
//! Size: the machine's struct, `step` (the one dispatch every input goes through) and the
//! helpers every room shares (peers heard, carrier, epochs, role changes, alarms, flap
//! accounting, evaluate/expire); the rooms hold the rest. No I/O here, as everywhere in `sm`.

mod active;
mod drain;
mod observe;
mod partition;
mod planned;
mod report;
mod standby;
pub use active::UNVERIFIED_PROBE_MS;

use active::AdvertPacing;
use drain::Draining;
use observe::{AlarmTimers, Boot, FlapGuard};
use planned::Operations;
use standby::StoreTrack;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::advert::Advert;
use super::config::{Config, ConfigError, Timings};
use super::io::{Action, Alarm, Event, Input, Persisted, Reason};
use super::status::Transition;
use super::types::{MAX_EPOCH, Millis, NodeId, Role, VipId};

/// How many operator operation ids are remembered to ignore repeats.
const REMEMBERED_IDS: usize = 256;

/// What this member knows of one peer.
#[derive(Clone, Debug)]
struct Peer {
    node: NodeId,
    priority: u8,
    /// Last time an advert arrived on each configured path (index = `Config::paths`).
    last_heard: Vec<Option<Millis>>,
    /// Start of the current stretch of continuous hearing (on any path).
    heard_since: Option<Millis>,
    /// Latest advert (kept after the peer falls silent: its last known state).
    advert: Option<Advert>,
    /// Ready as a planned-handover target continuously since then (failback recovery).
    ready_since: Option<Millis>,
    /// Last time a heartbeat that failed verification (a key mismatch) came from this
    /// member's configured address.
    key_mismatch_at: Option<Millis>,
}

/// Per-VIP streak of data-plane probe results.
#[derive(Clone, Debug, Default)]
struct ProbeTrack {
    last_up: Option<Millis>,
    fail_count: u32,
    fail_first: Option<Millis>,
    fail_last: Option<Millis>,
}

/// Per (VIP, port) local listener state.
#[derive(Clone, Copy, Debug)]
struct ListenerTrack {
    up: bool,
    since: Millis,
}

/// A takeover claim waiting for the Lease compare-and-swap.
#[derive(Clone, Debug)]
struct Claim {
    epoch: u64,
    reason: Reason,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CasPurpose {
    Claim,
    Reconcile,
}

#[derive(Clone, Debug)]
struct CasPending {
    purpose: CasPurpose,
    sent_at: Millis,
    retries: u8,
}

/// Who started a planned operation (initiator side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Operator { forced: bool },
    Maintenance,
    Auto(Reason),
}

impl Origin {
    /// Whether a handover of this origin drains: a move of a healthy member does; a safety
    /// handover (lost link, gateway or listener) does not — the member could not serve
    /// its connections anyway.
    fn drains(self) -> bool {
        matches!(self, Origin::Operator { .. } | Origin::Maintenance | Origin::Auto(Reason::Failback))
    }

    fn reason(self) -> Reason {
        match self {
            Origin::Operator { forced: false } => Reason::PlannedFailover,
            Origin::Operator { forced: true } => Reason::ForcedFailover,
            Origin::Maintenance => Reason::MaintenanceOn,
            Origin::Auto(r) => r,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpPhase {
    Preparing,
    Committed { epoch: u64, at: Millis },
}

/// Initiator side of a planned handover.
#[derive(Clone, Debug)]
struct Op {
    id: u64,
    origin: Origin,
    to: NodeId,
    phase: OpPhase,
    started: Millis,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TgtPhase {
    Acked,
    Accepted { epoch: u64 },
}

/// Target side of a planned handover.
#[derive(Clone, Debug)]
struct TargetOp {
    id: u64,
    from: NodeId,
    phase: TgtPhase,
    at: Millis,
}

/// Requirements on a handover target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Need {
    /// Operator planned failover, maintenance, failback: heard on every path, same
    /// configuration revision, ready for every VIP.
    Planned,
    /// Automatic safety handover (carrier, gateway, unhealthy VIP): heard on some path,
    /// ready for every VIP.
    Urgent,
    /// Forced failover: heard on some path, standby, not in maintenance, same major.
    Forced,
}

/// The HA state machine of one member. Pure: no I/O, no clock, no randomness.
///
/// Create it with [`Machine::new`], feed every observation to [`Machine::step`] with the
/// current monotonic time, execute the returned actions in order, and read
/// [`Machine::status`] for reporting.
#[derive(Clone, Debug)]
pub struct Machine {
    cfg: Config,
    cfg_error: Option<ConfigError>,
    in_pair: bool,
    my_priority: u8,
    role: Role,
    /// Highest pair epoch known (persisted, monotonic).
    epoch: u64,
    /// Epoch under which the VIPs are held or claimed.
    held_epoch: u64,
    /// This member added (or adopted) the VIPs and has not removed them.
    holding: bool,
    started_at: Option<Millis>,
    first_step_done: bool,
    last_now: Millis,
    last_persisted: Persisted,
    maintenance: bool,
    maintenance_force: bool,
    paused: bool,
    failback_paused: bool,
    peers: Vec<Peer>,
    gateway: Option<bool>,
    local_vips: Option<BTreeSet<VipId>>,
    probes: Vec<ProbeTrack>,
    listeners: Vec<Vec<Option<ListenerTrack>>>,
    vip_missing_since: Option<Millis>,
    conflict_last: Option<Millis>,
    /// The foreign MAC last seen answering for each VIP while the conflict alarm stands.
    conflict_macs: BTreeMap<VipId, [u8; 6]>,
    traffic_at: Option<Millis>,
    quiet_since: Option<Millis>,
    last_vip_change: Option<Millis>,
    heard_any_peer: bool,
    seen_holder: bool,
    active_since: Option<Millis>,
    alarms: BTreeSet<Alarm>,
    last_transition: Option<Transition>,
    /// Heartbeats ignored for an epoch outside the domain.
    ignored_adverts: u64,
    /// After a stall, until the next `Tick`: the inputs queued during the stall are being
    /// processed; the machine gives up what a newer holder or Lease claims but takes,
    /// announces and times out nothing (its view is stale until the queue is processed).
    catch_up: bool,
    /// Test-only knob for the simulator's deliberate-break test: take over without the
    /// data-plane probe condition. Not reachable from any configuration.
    #[cfg(test)]
    pub(crate) test_skip_probe: bool,
    link: CarrierTrack,
    store: StoreTrack,
    flap: FlapGuard,
    timers: AlarmTimers,
    pacing: AdvertPacing,
    ops: Operations,
    boot: Boot,
    draining: Draining,
}

impl Machine {
    /// A machine for `config`, resuming from `persisted` (epoch, maintenance, last role,
    /// pauses, suspension). It starts in [`Role::Init`] (or [`Role::Unpaired`] when the
    /// local node is not a member); the first `step` fixes the start time.
    pub fn new(config: Config, persisted: Persisted) -> Machine {
        // The state file refuses an epoch outside the domain; a caller that passes one
        // anyway gets the top of the domain (and the EpochExhausted alarm), never a value
        // that would saturate into a tie.
        let persisted = Persisted { epoch: persisted.epoch.min(MAX_EPOCH), ..persisted };
        let cfg_error = config.validate().err();
        let my_priority = config.priority_of(&config.local);
        let in_pair = my_priority.is_some();
        let mut m = Machine {
            boot: Boot { boot_last_role: persisted.last_role, boot_epoch: persisted.epoch, adoption_decided: false },
            ops: Operations {
                op: None,
                tgt: None,
                sticky: None,
                seen_ids: VecDeque::new(),
                op_seq: 0,
                handover_retry_at: None,
            },
            link: CarrierTrack {
                carrier_data: None,
                carrier_vip: None,
                carrier_returned_at: None,
                carrier_required_ms: config.timings.carrier_stable_ms,
                carrier_lost_at: None,
            },
            store: StoreTrack {
                lease: None,
                lease_stale: false,
                lease_written: None,
                last_renew: None,
                lease_disowned_since: None,
                cas: None,
                claim: None,
                candidate_since: None,
                claim_backoff_until: None,
                claim_granted: None,
            },
            flap: FlapGuard {
                auto_moves: VecDeque::new(),
                suspended: persisted.suspended,
                quiet_from: Millis(0),
                nonpref_acq: VecDeque::new(),
                quarantined_until: None,
            },
            timers: AlarmTimers {
                key_mismatch_at: None,
                clock_skew_at: None,
                replay_at: None,
                unverified_probe_at: None,
            },
            pacing: AdvertPacing { next_advert_at: None, advert_now: false, last_burst: None },
            draining: Draining::default(),
            peers: Vec::new(),
            probes: Vec::new(),
            listeners: Vec::new(),
            cfg_error,
            in_pair,
            my_priority: my_priority.unwrap_or(0),
            role: if in_pair { Role::Init } else { Role::Unpaired },
            epoch: persisted.epoch,
            held_epoch: persisted.epoch,
            holding: false,
            started_at: None,
            first_step_done: false,
            last_now: Millis(0),
            maintenance: persisted.maintenance,
            maintenance_force: false,
            paused: persisted.paused,
            failback_paused: persisted.failback_paused,
            gateway: None,
            local_vips: None,
            vip_missing_since: None,
            conflict_last: None,
            conflict_macs: BTreeMap::new(),
            traffic_at: None,
            quiet_since: None,
            last_vip_change: None,
            heard_any_peer: false,
            seen_holder: false,
            active_since: None,
            alarms: BTreeSet::new(),
            last_transition: None,
            ignored_adverts: 0,
            catch_up: false,
            last_persisted: persisted,
            cfg: config,
            #[cfg(test)]
            test_skip_probe: false,
        };
        m.rebuild_for_config();
        m
    }

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
            if self.holding || self.store.claim.is_some() {
                self.check_rival(now, out);
            }
        } else {
            self.evaluate(now, out);
        }
        self.persist_if_changed(out);
        let due = self.pacing.next_advert_at.is_none_or(|t| now >= t);
        if self.role != Role::Unpaired && (self.pacing.advert_now || due) {
            out.push(Action::SendAdvert(self.make_advert()));
            self.pacing.advert_now = false;
            self.pacing.next_advert_at = Some(now.plus(self.cfg.timings.heartbeat_interval_ms));
        }
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
    /// heartbeat instead of every tick.
    pub fn next_tick(&self, last_tick: Millis) -> Millis {
        let t = self.t();
        let fast = last_tick.plus(t.tick_ms);
        match self.steady_until() {
            Some(at) => at.min(last_tick.plus(t.heartbeat_interval_ms)).max(fast),
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
        let t = self.t();
        let overdue = t.heartbeat_interval_ms + t.heartbeat_interval_ms / 5;
        self.peers
            .iter()
            .filter(|p| p.advert.as_ref().is_some_and(|a| a.holds_vips))
            .map(|p| p.last_heard.iter().flatten().max().map_or(Millis(0), |h| h.plus(overdue)))
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
        let mut at = self.pacing.next_advert_at?;
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

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Current role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether this member holds the VIPs (added or adopted, not removed).
    pub fn holds_vips(&self) -> bool {
        self.holding
    }

    /// Highest pair epoch known (persisted; never goes backwards).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Epoch under which the VIPs are held or claimed (`None` when neither).
    pub fn held_epoch(&self) -> Option<u64> {
        let holds_or_claims =
            self.holding || self.store.claim.is_some() || matches!(self.role, Role::Active | Role::Demoting);
        holds_or_claims.then_some(self.held_epoch)
    }

    /// Last role change, if any.
    pub fn last_transition(&self) -> Option<&Transition> {
        self.last_transition.as_ref()
    }

    /// Rebuilds the per-peer and per-VIP tables after a configuration change, keeping what
    /// is known about peers, VIPs and listeners that are still configured.
    fn rebuild_for_config(&mut self) {
        let old_peers = std::mem::take(&mut self.peers);
        let npaths = self.cfg.paths.len();
        for m in &self.cfg.members {
            if m.node == self.cfg.local {
                continue;
            }
            let mut p = old_peers.iter().find(|p| p.node == m.node).cloned().unwrap_or(Peer {
                node: m.node.clone(),
                priority: m.priority,
                last_heard: Vec::new(),
                heard_since: None,
                advert: None,
                ready_since: None,
                key_mismatch_at: None,
            });
            p.priority = m.priority;
            p.last_heard.resize(npaths, None);
            self.peers.push(p);
        }
        self.probes = vec![ProbeTrack::default(); self.cfg.vips.len()];
        let old_listeners = std::mem::take(&mut self.listeners);
        self.listeners = self.cfg.vips.iter().map(|v| vec![None; v.listener_ports().count()]).collect();
        // Listener states are keyed by position; keep them only if the shape is unchanged.
        if old_listeners.len() == self.listeners.len()
            && old_listeners.iter().zip(&self.listeners).all(|(a, b)| a.len() == b.len())
        {
            self.listeners = old_listeners;
        }
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

    fn peer_heard(&self, i: usize, now: Millis) -> bool {
        let timeout = self.t().heartbeat_timeout_ms;
        self.peers[i].last_heard.iter().any(|t| t.is_some_and(|t| now.since(t) < timeout))
    }

    fn peer_heard_all(&self, i: usize, now: Millis) -> bool {
        let timeout = self.t().heartbeat_timeout_ms;
        let p = &self.peers[i];
        !p.last_heard.is_empty() && p.last_heard.iter().all(|t| t.is_some_and(|t| now.since(t) < timeout))
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

    /// Folds a carrier observation into the dampening state.
    fn on_carrier(&mut self, now: Millis, link: super::types::Link, up: bool) {
        let (was_lost, was_settling) = (self.carrier_lost(), self.carrier_settling(now));
        match link {
            super::types::Link::Data => self.link.carrier_data = Some(up),
            super::types::Link::Vip => self.link.carrier_vip = Some(up),
        }
        let base = self.t().carrier_stable_ms;
        if self.carrier_lost() && !was_lost {
            // Lost again before the last return was stable: the link flaps, so it waits
            // twice as long next time; lost after a stable stretch: the base time again.
            self.link.carrier_required_ms = if was_settling {
                let max = base.saturating_mul(super::config::CARRIER_STABLE_MAX_FACTOR);
                self.link.carrier_required_ms.saturating_mul(2).min(max)
            } else {
                base
            };
            self.link.carrier_returned_at = None;
            self.link.carrier_lost_at = Some(now);
        } else if self.carrier_ok() && self.link.carrier_lost_at.is_some() {
            self.link.carrier_returned_at = Some(now);
            self.link.carrier_lost_at = None;
        }
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
    fn not_ready(&self) -> Option<super::status::NotReady> {
        use super::status::NotReady;
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

    fn is_operator_id(id: u64) -> bool {
        id & super::advert::AUTO_OP_BIT == 0
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

    fn report_op(&mut self, id: u64, ok: bool, message: String, out: &mut Vec<Action>) {
        if Self::is_operator_id(id) {
            out.push(Action::Report(Event::OperationResult { id, ok, message }));
        }
    }

    /// Remembers an operator id; false if it was seen before (the command is ignored).
    fn remember_id(&mut self, id: u64) -> bool {
        if self.ops.seen_ids.contains(&id) {
            return false;
        }
        if self.ops.seen_ids.len() >= REMEMBERED_IDS {
            self.ops.seen_ids.pop_front();
        }
        self.ops.seen_ids.push_back(id);
        true
    }

    /// Records an automatic role change for flap suspension.
    fn note_auto_move(&mut self, now: Millis, out: &mut Vec<Action>) {
        let window = self.cfg.flap.window_ms;
        self.flap.auto_moves.push_back(now);
        while self.flap.auto_moves.front().is_some_and(|&t| now.since(t) >= window) {
            self.flap.auto_moves.pop_front();
        }
        self.flap.quiet_from = now;
        let limit = usize::try_from(self.cfg.flap.moves).unwrap_or(usize::MAX);
        if !self.flap.suspended && self.flap.auto_moves.len() >= limit {
            self.flap.suspended = true;
            let detail = format!("{} automatic role changes within {} ms", self.flap.auto_moves.len(), window);
            self.raise(Alarm::Suspended, detail, out);
        }
    }

    /// Records a failover onto this (non-preferred) member for the failback quarantine.
    fn note_nonpreferred_acquisition(&mut self, now: Millis) {
        let super::config::FailbackPolicy::Automatic(p) = &self.cfg.failback else {
            return;
        };
        let (window, n, hold) = (p.quarantine_window_ms, p.quarantine_failovers, p.quarantine_hold_ms);
        self.flap.nonpref_acq.push_back(now);
        while self.flap.nonpref_acq.front().is_some_and(|&t| now.since(t) >= window) {
            self.flap.nonpref_acq.pop_front();
        }
        if self.flap.nonpref_acq.len() >= usize::try_from(n).unwrap_or(usize::MAX) {
            self.flap.quarantined_until = Some(now.plus(hold));
        }
    }

    fn quarantined(&self, now: Millis) -> bool {
        self.flap.quarantined_until.is_some_and(|u| now < u)
    }

    /// The preferred member: highest priority not in maintenance (peers by their last
    /// advert). `None` when that is this member.
    fn preferred_peer(&self) -> Option<usize> {
        let mut best: Option<(u8, Option<usize>)> =
            if self.maintenance { None } else { Some((self.my_priority, None)) };
        for (i, p) in self.peers.iter().enumerate() {
            let maint = p.advert.as_ref().is_some_and(|a| a.maintenance);
            if maint {
                continue;
            }
            if best.is_none_or(|(bp, _)| p.priority > bp) {
                best = Some((p.priority, Some(i)));
            }
        }
        best.and_then(|(_, i)| i)
    }

    fn is_preferred(&self) -> bool {
        !self.maintenance && self.preferred_peer().is_none()
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

    /// `PeerSilent`: some peer has been silent on every path for a heartbeat timeout (since
    /// it was last heard, or since this agent started) after the init listen, while this
    /// member's own links and gateway are fine — so the silence is not explained by this
    /// member being cut off. Cleared when every peer is heard again, or when this member
    /// itself is cut off (then its own role and reason tell), or while authentic heartbeats
    /// arrive that are refused for clock skew (ClockSkew tells). Heartbeats that fail
    /// verification do not clear it: anybody can send those from a member's address, so
    /// they must not hide a silent peer; the detail says they arrive.
    fn check_peer_silent(&mut self, now: Millis, out: &mut Vec<Action>) {
        let timeout = self.t().heartbeat_timeout_ms;
        let started = self.started_at.unwrap_or(now);
        // Authentic heartbeats refused for clock skew are no silence: ClockSkew tells.
        let rejected = self.alarms.contains(&Alarm::ClockSkew);
        let own_ok = self.carrier_ok() && self.gateway != Some(false) && !rejected;
        let listening = matches!(self.role, Role::Init | Role::Unpaired);
        let silent: Vec<(String, u64)> = if own_ok && !listening {
            self.peers
                .iter()
                .filter_map(|p| {
                    let last = p.last_heard.iter().flatten().max().copied().unwrap_or(started).max(started);
                    let quiet = now.since(last);
                    let unverified = p.key_mismatch_at.is_some_and(|t| now.since(t) < self.t().reject_alarm_clear_ms);
                    let name = if unverified {
                        format!("{} (its address sends heartbeats that fail verification)", p.node)
                    } else {
                        p.node.to_string()
                    };
                    (quiet >= timeout).then_some((name, quiet))
                })
                .collect()
        } else {
            Vec::new()
        };
        if silent.is_empty() {
            self.clear_alarm(Alarm::PeerSilent, out);
        } else {
            let who: Vec<String> = silent.iter().map(|(n, q)| format!("{n} for {q} ms")).collect();
            let detail = format!(
                "silent on every heartbeat path while this member's links and gateway are fine: {} \
                 (down, or partitioned from this member)",
                who.join(", ")
            );
            self.raise(Alarm::PeerSilent, detail, out);
        }
    }

    /// `LeaseBehind`: this member holds the VIPs under an epoch the store refuses to be
    /// raised to in one write ([`Config::lease_max_step`]), so the Lease does not record
    /// it. Cleared once the Lease is within reach (and caught up) or the member holds
    /// nothing.
    fn check_lease_behind(&mut self, out: &mut Vec<Action>) {
        let behind = match (self.cfg.lease_max_step, &self.store.lease) {
            (Some(max), Some(l)) if self.holding && self.held_epoch > l.epoch.saturating_add(max) => {
                Some((max, l.epoch))
            }
            _ => None,
        };
        match behind {
            Some((max, lease)) => {
                let detail = format!(
                    "this member holds the VIPs under epoch {held}, {gap} above the pair Lease's {lease}: an agent \
                     may raise the Lease's epoch by at most {max} in one write, so it is not recorded there \
                     (heartbeats still settle who holds the VIPs; the Lease cannot arbitrate a partition between \
                     the members meanwhile). If the epoch is genuine, record it in the Lease by hand \
                     (leaseTransitions {held}, holderIdentity this node)",
                    held = self.held_epoch,
                    gap = self.held_epoch - lease,
                );
                self.raise(Alarm::LeaseBehind, detail, out);
            }
            None => self.clear_alarm(Alarm::LeaseBehind, out),
        }
    }

    /// `WitnessUnreachable`: takeovers need the Lease store's vote and the store did not
    /// answer its last read or write. Cleared by the next answer.
    fn check_witness(&mut self, out: &mut Vec<Action>) {
        if self.cfg.lease_vote_required && self.store.lease_stale {
            let detail = if self.holding {
                "the witness does not answer: this member keeps the VIPs, but no member could take them \
                 over if it failed now"
            } else {
                "the witness does not answer: this member takes no VIPs over until it answers again"
            };
            self.raise(Alarm::WitnessUnreachable, detail.to_owned(), out);
        } else {
            self.clear_alarm(Alarm::WitnessUnreachable, out);
        }
    }

    fn eval_fenced(&mut self, now: Millis, out: &mut Vec<Action>) {
        if self.maintenance {
            self.set_role(Role::Maintenance, Reason::MaintenanceOn, now, out);
        } else if !self.cut_off() {
            self.set_role(Role::Standby, Reason::Unfenced, now, out);
        }
    }

    fn eval_maintenance(&mut self, now: Millis, out: &mut Vec<Action>) {
        if !self.maintenance {
            self.set_role(Role::Standby, Reason::MaintenanceOff, now, out);
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
        self.persist_if_changed(out);
        out.push(Action::AddVips(self.vip_ids()));
        out.push(Action::Announce { kind: super::types::AnnounceKind::Burst });
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

/// The carrier of the data and VIP links, and link dampening.
#[derive(Clone, Debug)]
pub(super) struct CarrierTrack {
    pub(super) carrier_data: Option<bool>,
    pub(super) carrier_vip: Option<bool>,
    /// Link dampening: when the carrier last returned (both links up again after a loss).
    pub(super) carrier_returned_at: Option<Millis>,
    /// Link dampening: how long the carrier must stay up after that return.
    pub(super) carrier_required_ms: u64,
    /// When the carrier was lost, until both links have carrier again (a holder's grace
    /// before it gives the VIPs up; a later return starts the dampening).
    pub(super) carrier_lost_at: Option<Millis>,
}
