//! Configuration of one member's state machine: the pair, its VIPs and every timing.

use std::collections::BTreeSet;

use thiserror::Error;

use super::types::{NodeId, PROTOCOL, PathId, ProtocolVersion, VipId};

/// Most members a pair may have.
pub const MAX_MEMBERS: usize = 8;

/// One member of the pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Node name.
    pub node: NodeId,
    /// Election priority, 1..=254, distinct within the pair; higher wins.
    pub priority: u8,
}

/// One VIP of the pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipSpec {
    /// Identifier used in [`crate::Action::AddVips`] and friends.
    pub id: VipId,
    /// TCP ports probed through the VIP. Empty = no data-plane target for this VIP (UDP-only
    /// listeners): the probe of the pair reads unknown when no VIP has a port.
    pub probe_ports: Vec<u16>,
    /// Ports of this member's own health checks (HTTP on its own address): listeners of
    /// its own like `probe_ports`, but never probed by a peer.
    pub health_ports: Vec<u16>,
}

impl VipSpec {
    /// The ports of this member's own listeners: the probe ports, then the health checks.
    pub fn listener_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.probe_ports.iter().chain(&self.health_ports).copied()
    }
}

/// All timings, in milliseconds. The defaults are the project's decisions (brief of issue
/// 3); every one can be overridden.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How often the I/O layer feeds [`crate::Input::Tick`] while anything is pending
    /// (the machine's resolution; a steady member ticks about once per heartbeat interval,
    /// see [`crate::Machine::next_tick`]).
    pub tick_ms: u64,
    /// Heartbeat interval: an advert is sent at least this often.
    pub heartbeat_interval_ms: u64,
    /// A peer silent on a path for this long is not heard on that path (a quiet peer:
    /// its declared interval times `heartbeat_timeout_ms / heartbeat_interval_ms`).
    pub heartbeat_timeout_ms: u64,
    /// A quiet standby's heartbeat interval: a standby that hears every peer, one of them
    /// an active holder whose heartbeats are on time, with no operation, claim or drain of
    /// its own, sends this often instead of every heartbeat interval — and at once when
    /// what it says changes. Only the standby must detect a dead holder fast; the holder
    /// needs to know that a ready standby exists (status, planned moves, a peer silent),
    /// which it learns within `quiet_interval_ms × heartbeat_timeout_ms /
    /// heartbeat_interval_ms`. Each member declares its interval in its heartbeats
    /// ([`crate::Advert::interval_ms`]); a standby is quiet only towards peers that declare
    /// theirs (they honour it), and a receiver believes a declared interval up to its own
    /// `quiet_interval_ms`. At most the heartbeat interval (0): never quiet.
    pub quiet_interval_ms: u64,
    /// Consecutive failed data-plane probes needed to read the active's data plane as down.
    pub probe_failures: u32,
    /// Minimum time between the first and the last of those failures.
    pub probe_span_ms: u64,
    /// A probe verdict whose last result is older than this is stale (reads "pending",
    /// which blocks a takeover). The I/O layer must probe well within it: every ≤ 100 ms
    /// with a connect timeout ≤ 100 ms (the simulator models 50 ms and 80 ms).
    pub probe_fresh_ms: u64,
    /// No unplanned takeover within this time after taking or giving up the VIPs.
    pub hold_down_ms: u64,
    /// A member that has never heard a peer waits this long after start before it serves
    /// alone (unless [`Config::start_alone`]).
    pub boot_hold_ms: u64,
    /// Length of the Init listen, and the time a peer must be heard steadily before an
    /// election counts it.
    pub init_listen_ms: u64,
    /// Planned handover: the active aborts when the prepare is not acked, or the commit not
    /// confirmed, within this time.
    pub confirm_timeout_ms: u64,
    /// A Lease compare-and-swap without an answer after this long counts as unavailable.
    pub cas_timeout_ms: u64,
    /// A listener down for this long makes the active hand over.
    pub listener_down_ms: u64,
    /// A VIP missing from the kernel (while held) for this long makes the active hand over.
    pub vip_unhealthy_ms: u64,
    /// A traffic sample older than this makes the traffic unknown (failback waits).
    pub traffic_stale_ms: u64,
    /// The VipConflict alarm clears when no conflict was reported for this long.
    pub conflict_clear_ms: u64,
    /// KeyMismatch / ClockSkew alarms clear when no such rejection was seen for this long.
    pub reject_alarm_clear_ms: u64,
    /// After an automatic handover attempt failed, wait this long before the next one.
    pub handover_retry_ms: u64,
    /// A winner of a two-actives conflict re-announces at most this often.
    pub reannounce_min_ms: u64,
    /// A holder that cannot hear a peer renews the Lease this often.
    pub lease_renew_ms: u64,
    /// A Lease holder seen renewing (or claiming) within this long is alive: a member
    /// that cannot hear it does not take the VIPs from it.
    pub lease_alive_ms: u64,
    /// Link dampening: a member whose carrier returned takes no VIPs by takeover or
    /// election until its links have had carrier continuously for this long. As a handover
    /// target it stays "not ready" (in its adverts, and it refuses a prepare or commit) for
    /// this long too, and a carrier lost again before that doubles this second time for
    /// the next return (up to [`CARRIER_STABLE_MAX_FACTOR`] times; a carrier that stayed up
    /// for the full time resets it): a flapping link stops attracting the VIPs from a
    /// holder, yet a pair that nobody holds is taken after the base time. A holder that
    /// loses carrier with no eligible successor keeps the VIPs for this long before it
    /// gives them up (a short flap moves nothing). 0 turns all of it off.
    pub carrier_stable_ms: u64,
    /// A member that handed the VIPs over in a planned move keeps them this long, silently,
    /// for the connections established on it (the new holder forwards their segments); 0
    /// turns draining off.
    pub drain_ms: u64,
}

/// Most a flapping link's dampening time grows to, as a multiple of
/// [`Timings::carrier_stable_ms`] (64 s with the default 2 s).
pub const CARRIER_STABLE_MAX_FACTOR: u64 = 32;

impl Default for Timings {
    fn default() -> Timings {
        Timings {
            tick_ms: 20,
            heartbeat_interval_ms: 100,
            heartbeat_timeout_ms: 300,
            quiet_interval_ms: 500,
            probe_failures: 2,
            probe_span_ms: 100,
            probe_fresh_ms: 500,
            hold_down_ms: 3_000,
            boot_hold_ms: 60_000,
            init_listen_ms: 1_000,
            confirm_timeout_ms: 1_000,
            cas_timeout_ms: 200,
            listener_down_ms: 10_000,
            vip_unhealthy_ms: 3_000,
            traffic_stale_ms: 10_000,
            conflict_clear_ms: 10_000,
            reject_alarm_clear_ms: 5_000,
            handover_retry_ms: 3_000,
            reannounce_min_ms: 1_000,
            lease_renew_ms: 1_000,
            lease_alive_ms: 3_000,
            carrier_stable_ms: 2_000,
            drain_ms: 5_000,
        }
    }
}

/// Automatic failback parameters (seed 003 defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AutoFailback {
    /// The preferred member must have been ready continuously for this long.
    pub recovery_window_ms: u64,
    /// The pair must have been on the non-preferred member for at least this long.
    pub min_on_nonpreferred_ms: u64,
    /// Quarantine: this many failovers onto a non-preferred member ...
    pub quarantine_failovers: u32,
    /// ... within this window ...
    pub quarantine_window_ms: u64,
    /// ... hold the pair off the preferred member for this long after the last one.
    pub quarantine_hold_ms: u64,
    /// Traffic must have been below the threshold continuously for this long.
    pub quiet_window_ms: u64,
    /// Traffic threshold in bytes per second (below = quiet).
    pub quiet_threshold_bps: u64,
}

impl Default for AutoFailback {
    fn default() -> AutoFailback {
        AutoFailback {
            recovery_window_ms: 15 * 60_000,
            min_on_nonpreferred_ms: 10 * 60_000,
            quarantine_failovers: 3,
            quarantine_window_ms: 24 * 3_600_000,
            quarantine_hold_ms: 6 * 3_600_000,
            quiet_window_ms: 30_000,
            quiet_threshold_bps: 32 * 1024,
        }
    }
}

/// Failback policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FailbackPolicy {
    /// Preemption off: after a failover the VIPs stay where they are (the default).
    #[default]
    Manual,
    /// Move back to the preferred member under the seed-003 conditions.
    Automatic(AutoFailback),
}

/// Flap suspension: `moves` automatic role changes within `window_ms` suspend the
/// discretionary moves; the suspension clears after `quiet_ms` without one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlapPolicy {
    /// Number of automatic role changes that suspend.
    pub moves: u32,
    /// Window in which they are counted.
    pub window_ms: u64,
    /// Quiet time after which the suspension clears by itself.
    pub quiet_ms: u64,
}

impl Default for FlapPolicy {
    fn default() -> FlapPolicy {
        FlapPolicy { moves: 3, window_ms: 10 * 60_000, quiet_ms: 10 * 60_000 }
    }
}

/// Everything one member's machine needs to know about the pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This node.
    pub local: NodeId,
    /// All members, including `local` (1..=8; one member is a degraded pair whose peer was
    /// removed). If `local` is not listed the member is [`crate::Role::Unpaired`].
    pub members: Vec<Member>,
    /// Heartbeat paths; a planned handover requires the target to be heard on each.
    pub paths: Vec<PathId>,
    /// The pair's VIPs. The whole set always moves together.
    pub vips: Vec<VipSpec>,
    /// Revision of the pair's configuration (planned handovers require equal revisions).
    pub config_revision: u64,
    /// Protocol version this member speaks.
    pub protocol: ProtocolVersion,
    /// Serve alone without the boot hold when no peer was ever heard.
    pub start_alone: bool,
    /// Timings.
    pub timings: Timings,
    /// Failback policy.
    pub failback: FailbackPolicy,
    /// Flap suspension policy.
    pub flap: FlapPolicy,
    /// Takeovers need the Lease store's vote (standalone mode with a witness): a member
    /// claims only while the store answers, and abandons a claim the store does not
    /// answer, instead of taking the VIPs under its own epoch as it does when the Kubernetes
    /// API server is unreachable. A planned handover needs no vote (both members agree on
    /// it over their heartbeats).
    pub lease_vote_required: bool,
    /// The largest step by which one compare-and-swap may raise the store's epoch (`None`:
    /// any). The Kubernetes admission policy refuses an agent's Lease write that raises
    /// `leaseTransitions` by more than [`crate::MAX_LEASE_STEP`]; such a write would be
    /// refused at every try, so the member does not send it: a claim goes on under the
    /// standalone rules, a holder keeps its VIPs and raises `LeaseBehind` until the
    /// Lease is brought within reach.
    pub lease_max_step: Option<u64>,
    /// Quorum fencing (the control-plane mode, where the store is a majority of the
    /// members' votes): a holder keeps the VIPs only while the store has confirmed it as
    /// holder within this long ([`crate::Input::LeaseConfirmed`]); otherwise it gives them
    /// up (`QuorumLost`) — the side of a partition without a majority stops serving before
    /// the majority's voters grant anybody else a claim (they refuse one for longer than
    /// this after they last heard the holder). Needs [`Config::lease_vote_required`].
    /// `None`: off (a holder that cannot reach its store keeps the VIPs).
    pub quorum_lease_ms: Option<u64>,
}

impl Config {
    /// A configuration with one heartbeat path (`PathId(0)`), no VIPs, revision 0 and all
    /// defaults; set the public fields for the rest.
    pub fn new(local: NodeId, members: Vec<Member>) -> Config {
        Config {
            local,
            members,
            paths: vec![PathId(0)],
            vips: Vec::new(),
            config_revision: 0,
            protocol: PROTOCOL,
            start_alone: false,
            timings: Timings::default(),
            failback: FailbackPolicy::Manual,
            flap: FlapPolicy::default(),
            lease_vote_required: false,
            lease_max_step: None,
            quorum_lease_ms: None,
        }
    }

    /// Priority of `node`, if it is a member.
    pub fn priority_of(&self, node: &NodeId) -> Option<u8> {
        self.members.iter().find(|m| &m.node == node).map(|m| m.priority)
    }

    /// Checks the configuration. An invalid configuration does not stop a member from
    /// keeping VIPs it holds, but it blocks every automatic acquisition (alarm
    /// `Misconfigured`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.members.is_empty() || self.members.len() > MAX_MEMBERS {
            return Err(ConfigError::MemberCount { count: self.members.len() });
        }
        let mut nodes = BTreeSet::new();
        let mut prios = BTreeSet::new();
        for m in &self.members {
            if !nodes.insert(m.node.clone()) {
                return Err(ConfigError::DuplicateNode { node: m.node.to_string() });
            }
            if m.priority == 0 || m.priority == 255 {
                return Err(ConfigError::PriorityRange { node: m.node.to_string(), priority: m.priority });
            }
            if !prios.insert(m.priority) {
                return Err(ConfigError::DuplicatePriority { priority: m.priority });
            }
        }
        if self.paths.is_empty() {
            return Err(ConfigError::NoPaths);
        }
        let mut vips = BTreeSet::new();
        for v in &self.vips {
            if !vips.insert(v.id.clone()) {
                return Err(ConfigError::DuplicateVip { vip: v.id.to_string() });
            }
        }
        let t = &self.timings;
        let bad = |what: &'static str| Err(ConfigError::Timing { what });
        if t.tick_ms == 0 {
            return bad("tick must be positive");
        }
        if t.heartbeat_interval_ms == 0 {
            return bad("heartbeat interval must be positive");
        }
        if t.heartbeat_timeout_ms <= t.heartbeat_interval_ms {
            return bad("heartbeat timeout must exceed the interval");
        }
        if t.probe_failures == 0 {
            return bad("probe failures must be at least 1");
        }
        if t.confirm_timeout_ms == 0 || t.cas_timeout_ms == 0 {
            return bad("confirm and CAS timeouts must be positive");
        }
        if t.lease_renew_ms == 0 || t.lease_alive_ms <= t.lease_renew_ms {
            return bad("the Lease renewal interval must be positive and below the Lease alive window");
        }
        if let Some(l) = self.quorum_lease_ms
            && (l <= t.heartbeat_interval_ms || !self.lease_vote_required)
        {
            return bad("a quorum lease must exceed the heartbeat interval, and needs takeovers that need a vote");
        }
        if let FailbackPolicy::Automatic(a) = &self.failback
            && a.quarantine_failovers == 0
        {
            return bad("quarantine failovers must be at least 1");
        }
        if self.flap.moves == 0 {
            return bad("flap suspension moves must be at least 1");
        }
        Ok(())
    }
}

/// Why a [`Config`] is invalid.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// Wrong number of members.
    #[error("failed to validate the pair: {count} members (allowed 1..=8)")]
    MemberCount {
        /// Members found.
        count: usize,
    },
    /// A node listed twice.
    #[error("failed to validate the pair: node {node} is listed twice")]
    DuplicateNode {
        /// The node.
        node: String,
    },
    /// Two members with the same priority.
    #[error("failed to validate the pair: priority {priority} is used twice")]
    DuplicatePriority {
        /// The priority.
        priority: u8,
    },
    /// A priority outside 1..=254.
    #[error("failed to validate the pair: node {node} has priority {priority} (allowed 1..=254)")]
    PriorityRange {
        /// The node.
        node: String,
        /// Its priority.
        priority: u8,
    },
    /// No heartbeat path.
    #[error("failed to validate the pair: no heartbeat path")]
    NoPaths,
    /// A VIP listed twice.
    #[error("failed to validate the pair: VIP {vip} is listed twice")]
    DuplicateVip {
        /// The VIP.
        vip: String,
    },
    /// A timing that makes no sense.
    #[error("failed to validate the timings: {what}")]
    Timing {
        /// What is wrong.
        what: &'static str,
    },
}
