//! What the machine remembers: the [`Machine`] struct, its constructor, and the records
//! the rooms keep in it (peers, probes, listeners, the Lease store and its claims, planned
//! operations, carrier, flap guard, drain, advert pacing).
//!
//! A leaf: every room reads and writes these fields, and nothing here decides or uses a
//! room (the decisions are in the rooms; `mod.rs` has the `step` dispatch and the helpers
//! they share).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::advert::{Advert, OpMsg};
use crate::config::{Config, ConfigError};
use crate::io::{Alarm, Persisted, Reason};
use crate::status::{LeaseView, Transition};
use crate::types::{MAX_EPOCH, Millis, NodeId, Role, VipId};

/// What this member knows of one peer.
#[derive(Clone, Debug)]
pub(super) struct Peer {
    pub(super) node: NodeId,
    pub(super) priority: u8,
    /// Last time an advert arrived on each configured path (index = `Config::paths`).
    pub(super) last_heard: Vec<Option<Millis>>,
    /// Per path: until when that last advert keeps the peer heard there — a heartbeat
    /// timeout after it, scaled by the interval it declared (a quiet standby's), so that
    /// a peer leaving quiet does not make its other paths' quiet heartbeats look late.
    pub(super) heard_until: Vec<Option<Millis>>,
    /// Start of the current stretch of continuous hearing (on any path).
    pub(super) heard_since: Option<Millis>,
    /// Latest advert (kept after the peer falls silent: its last known state).
    pub(super) advert: Option<Advert>,
    /// Ready as a planned-handover target continuously since then (failback recovery).
    pub(super) ready_since: Option<Millis>,
    /// Last time a heartbeat that failed verification (a key mismatch) came from this
    /// member's configured address.
    pub(super) key_mismatch_at: Option<Millis>,
}

/// Per-VIP streak of data-plane probe results.
#[derive(Clone, Debug, Default)]
pub(super) struct ProbeTrack {
    pub(super) last_up: Option<Millis>,
    pub(super) fail_count: u32,
    pub(super) fail_first: Option<Millis>,
    pub(super) fail_last: Option<Millis>,
}

impl ProbeTrack {
    /// Forgets the run of failures (an answer ended it, or it says nothing any more).
    pub(super) fn clear_failures(&mut self) {
        self.fail_count = 0;
        self.fail_first = None;
        self.fail_last = None;
    }
}

/// Per (VIP, port) local listener state.
#[derive(Clone, Copy, Debug)]
pub(super) struct ListenerTrack {
    pub(super) up: bool,
    pub(super) since: Millis,
}

/// A takeover claim waiting for the Lease compare-and-swap.
#[derive(Clone, Debug)]
pub(super) struct Claim {
    pub(super) epoch: u64,
    pub(super) reason: Reason,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CasPurpose {
    Claim,
    Reconcile,
}

#[derive(Clone, Debug)]
pub(super) struct CasPending {
    pub(super) purpose: CasPurpose,
    pub(super) sent_at: Millis,
    pub(super) retries: u8,
}

/// Who started a planned operation (initiator side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    Operator { forced: bool },
    Maintenance,
    Auto(Reason),
}

impl Origin {
    /// Whether a handover of this origin drains: a move of a healthy member does; a safety
    /// handover (lost link, gateway or listener) does not — the member could not serve
    /// its connections anyway.
    pub(super) fn drains(self) -> bool {
        matches!(self, Origin::Operator { .. } | Origin::Maintenance | Origin::Auto(Reason::Failback))
    }

    pub(super) fn reason(self) -> Reason {
        match self {
            Origin::Operator { forced: false } => Reason::PlannedFailover,
            Origin::Operator { forced: true } => Reason::ForcedFailover,
            Origin::Maintenance => Reason::MaintenanceOn,
            Origin::Auto(r) => r,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpPhase {
    Preparing,
    Committed { epoch: u64, at: Millis },
}

/// Initiator side of a planned handover.
#[derive(Clone, Debug)]
pub(super) struct Op {
    pub(super) id: u64,
    pub(super) origin: Origin,
    pub(super) to: NodeId,
    pub(super) phase: OpPhase,
    pub(super) started: Millis,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TgtPhase {
    Acked,
    Accepted { epoch: u64 },
}

/// Target side of a planned handover.
#[derive(Clone, Debug)]
pub(super) struct TargetOp {
    pub(super) id: u64,
    pub(super) from: NodeId,
    pub(super) phase: TgtPhase,
    pub(super) at: Millis,
}

/// Requirements on a handover target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Need {
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
    pub(super) cfg: Config,
    pub(super) cfg_error: Option<ConfigError>,
    pub(super) in_pair: bool,
    pub(super) my_priority: u8,
    pub(super) role: Role,
    /// Highest pair epoch known (persisted, monotonic).
    pub(super) epoch: u64,
    /// Epoch under which the VIPs are held or claimed.
    pub(super) held_epoch: u64,
    /// This member added (or adopted) the VIPs and has not removed them.
    pub(super) holding: bool,
    pub(super) started_at: Option<Millis>,
    pub(super) first_step_done: bool,
    pub(super) last_now: Millis,
    pub(super) last_persisted: Persisted,
    pub(super) maintenance: bool,
    pub(super) maintenance_force: bool,
    pub(super) paused: bool,
    pub(super) failback_paused: bool,
    pub(super) peers: Vec<Peer>,
    pub(super) gateway: Option<bool>,
    pub(super) local_vips: Option<BTreeSet<VipId>>,
    pub(super) probes: Vec<ProbeTrack>,
    pub(super) listeners: Vec<Vec<Option<ListenerTrack>>>,
    pub(super) vip_missing_since: Option<Millis>,
    pub(super) conflict_last: Option<Millis>,
    /// The foreign MAC last seen answering for each VIP while the conflict alarm stands.
    pub(super) conflict_macs: BTreeMap<VipId, [u8; 6]>,
    pub(super) traffic_at: Option<Millis>,
    pub(super) quiet_since: Option<Millis>,
    pub(super) last_vip_change: Option<Millis>,
    pub(super) heard_any_peer: bool,
    pub(super) seen_holder: bool,
    pub(super) active_since: Option<Millis>,
    pub(super) alarms: BTreeSet<Alarm>,
    pub(super) last_transition: Option<Transition>,
    /// Heartbeats ignored for an epoch outside the domain.
    pub(super) ignored_adverts: u64,
    /// After a stall, until the next `Tick`: the inputs queued during the stall are being
    /// processed; the machine gives up what a newer holder or Lease claims but takes,
    /// announces and times out nothing (its view is stale until the queue is processed).
    pub(super) catch_up: bool,
    /// Test-only knob for the simulator's deliberate-break test: take over without the
    /// data-plane probe condition. Not reachable from any configuration.
    #[cfg(test)]
    pub(crate) test_skip_probe: bool,
    pub(super) link: CarrierTrack,
    pub(super) store: StoreTrack,
    pub(super) flap: FlapGuard,
    pub(super) timers: AlarmTimers,
    pub(super) pacing: AdvertPacing,
    pub(super) ops: Operations,
    pub(super) boot: Boot,
    pub(super) draining: Draining,
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
                confirmed_at: None,
                last_renew: None,
                lease_disowned_since: None,
                cas: None,
                claim: None,
                candidate_since: None,
                claim_backoff_until: None,
                reconcile_backoff_until: None,
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
            pacing: AdvertPacing { last_advert_at: None, advert_now: false, last_burst: None, last_sent: None },
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
        m.rebuild_for_config(&[]);
        m
    }

    /// Rebuilds the per-peer and per-VIP tables after a configuration change, keeping what
    /// is known about peers, VIPs and listeners that are still configured (`old_vips`: the
    /// previous configuration's VIPs, in its order).
    pub(super) fn rebuild_for_config(&mut self, old_vips: &[VipId]) {
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
                heard_until: Vec::new(),
                heard_since: None,
                advert: None,
                ready_since: None,
                key_mismatch_at: None,
            });
            p.priority = m.priority;
            p.last_heard.resize(npaths, None);
            p.heard_until.resize(npaths, None);
            self.peers.push(p);
        }
        // A VIP still configured keeps its last answered probe: "down" needs no answer
        // within a heartbeat timeout, and a reconfiguration is no evidence that the holder
        // died (the seventh 60-minute chaos run edited a Fast pair's timings while its
        // standby was cut off). Its failures start afresh (the probed ports may change).
        let old_probes = std::mem::take(&mut self.probes);
        self.probes = self
            .cfg
            .vips
            .iter()
            .map(|v| ProbeTrack {
                last_up: old_vips
                    .iter()
                    .position(|o| *o == v.id)
                    .and_then(|i| old_probes.get(i))
                    .and_then(|p| p.last_up),
                ..ProbeTrack::default()
            })
            .collect();
        let old_listeners = std::mem::take(&mut self.listeners);
        self.listeners = self.cfg.vips.iter().map(|v| vec![None; v.listener_ports().count()]).collect();
        // Listener states are keyed by position; keep them only if the shape is unchanged.
        if old_listeners.len() == self.listeners.len()
            && old_listeners.iter().zip(&self.listeners).all(|(a, b)| a.len() == b.len())
        {
            self.listeners = old_listeners;
        }
    }
}

/// When the next heartbeat (advert) is due, and the last announcement burst.
#[derive(Clone, Debug)]
pub(super) struct AdvertPacing {
    /// When the last advert went out.
    pub(super) last_advert_at: Option<Millis>,
    pub(super) advert_now: bool,
    pub(super) last_burst: Option<Millis>,
    /// The last advert sent, kept while quiet: a change goes out at once.
    pub(super) last_sent: Option<Advert>,
}

/// A drain on the old holder.
#[derive(Clone, Debug)]
pub(super) struct Drain {
    /// The new holder.
    pub(super) to: NodeId,
    /// When it ends.
    pub(super) until: Millis,
    /// The I/O layer keeps the addresses ([`crate::Input::DrainStarted`] said so).
    pub(super) started: bool,
}

/// Both sides of draining.
#[derive(Clone, Debug, Default)]
pub(super) struct Draining {
    /// This member drains (old holder).
    pub(super) drain: Option<Drain>,
    /// This member forwards to that draining peer (new holder).
    pub(super) forwarding: Option<NodeId>,
    /// The agent stops: nothing drains or forwards any more, whatever is heard.
    pub(super) stopping: bool,
}

/// Flap suspension and failback quarantine: the automatic moves counted.
#[derive(Clone, Debug)]
pub(super) struct FlapGuard {
    pub(super) auto_moves: VecDeque<Millis>,
    pub(super) suspended: bool,
    pub(super) quiet_from: Millis,
    pub(super) nonpref_acq: VecDeque<Millis>,
    pub(super) quarantined_until: Option<Millis>,
}

/// When the alarms that clear by themselves were last triggered.
#[derive(Clone, Debug)]
pub(super) struct AlarmTimers {
    pub(super) key_mismatch_at: Option<Millis>,
    /// Last conflict probe asked for because a peer's heartbeats fail verification while
    /// this member holds the VIPs.
    pub(super) unverified_probe_at: Option<Millis>,
    pub(super) clock_skew_at: Option<Millis>,
    pub(super) replay_at: Option<Millis>,
}

/// What the persisted state said at start, for adopting the VIPs after a restart.
#[derive(Clone, Debug)]
pub(super) struct Boot {
    pub(super) boot_last_role: Role,
    /// Epoch from the persisted state at start: what an adopting member can prove it held
    /// the VIPs under (never an epoch it merely heard of since).
    pub(super) boot_epoch: u64,
    pub(super) adoption_decided: bool,
}

/// Planned operations: the one this member started or answers as a target, the last
/// answer repeated in heartbeats, and the request ids already acted on.
#[derive(Clone, Debug)]
pub(super) struct Operations {
    /// The operation this member started (initiator side).
    pub(super) op: Option<Op>,
    /// The operation this member takes part in as its target.
    pub(super) tgt: Option<TargetOp>,
    /// The last operation message, repeated in heartbeats for a while.
    pub(super) sticky: Option<(OpMsg, Millis)>,
    /// Request ids already acted on (each is acted on once).
    pub(super) seen_ids: VecDeque<u64>,
    /// Sequence of the operations this member started.
    pub(super) op_seq: u16,
    /// No automatic handover attempt before then.
    pub(super) handover_retry_at: Option<Millis>,
}

/// What the machine knows of the Lease store (or witness) and the claims and
/// compare-and-swaps it has in flight there.
#[derive(Clone, Debug)]
pub(super) struct StoreTrack {
    pub(super) lease: Option<LeaseView>,
    pub(super) lease_stale: bool,
    /// The Lease's holder and when it was last seen writing the Lease (a claim or a
    /// renewal): proof through the API server that it is alive.
    pub(super) lease_written: Option<(NodeId, Millis)>,
    /// Quorum fencing: since when the store's last confirmation of this member as holder
    /// holds ([`crate::Input::LeaseConfirmed`]; a handover or an adoption starts one).
    pub(super) confirmed_at: Option<Millis>,
    /// Last renewal this holder sent (while a peer was silent).
    pub(super) last_renew: Option<Millis>,
    /// Since when this holder has seen the Lease name a peer that is heard but does not
    /// act as its holder (a claim that landed after its sender gave up).
    pub(super) lease_disowned_since: Option<Millis>,
    pub(super) cas: Option<CasPending>,
    pub(super) claim: Option<Claim>,
    pub(super) candidate_since: Option<Millis>,
    /// No new claim before then (after losing a Lease CAS to another member).
    pub(super) claim_backoff_until: Option<Millis>,
    /// No reconciling write before then (the store refused the last one because it heard
    /// another member holding: retried at the next observation after a heartbeat
    /// interval, not at once — that would spin as long as both hold).
    pub(super) reconcile_backoff_until: Option<Millis>,
    /// A claim the Lease granted (`Some(true)`) or that an unavailable store left to the
    /// local rules (`Some(false)`) during a catch-up: settled at its end.
    pub(super) claim_granted: Option<bool>,
}
