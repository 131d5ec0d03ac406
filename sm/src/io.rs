//! Inputs (timestamped observations) and outputs (actions) of the machine.

use std::collections::BTreeSet;

use super::advert::Advert;
use super::config::Config;
use super::types::{AnnounceKind, Link, Millis, NodeId, PathId, ProbeResult, Role, VipId};

/// An observation fed to [`crate::Machine::step`].
///
/// Contract for the I/O layer: feed `Tick` when [`crate::Machine::next_tick`] says; feed
/// `Carrier` for both links, `Gateway`, `LocalVips` and (when the store is reachable)
/// `LeaseObserved` at start and on every change (`LocalVips` also after executing
/// `AddVips`/`RemoveVips`/`SelfCheck`); feed `LocalProbe` for every (VIP, port) on every
/// local probe; while the member is not holding the VIPs, probe the VIPs through the
/// network and feed `PeerProbe` (the simulator models one probe every 50 ms with an 80 ms
/// connect timeout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Timer tick.
    Tick,
    /// An authentic heartbeat from a peer, received on `path`.
    Advert {
        /// Path it arrived on.
        path: PathId,
        /// Its content.
        msg: Advert,
    },
    /// A heartbeat that failed verification (for reporting only; it never counts as
    /// hearing the peer and never blocks a takeover).
    AdvertRejected {
        /// Path it arrived on.
        path: PathId,
        /// Why it was rejected.
        reason: RejectReason,
        /// The member whose configured address it came from (the I/O layer drops what
        /// comes from any other address before this point).
        from: Option<NodeId>,
    },
    /// Result of one TCP connect probe to `vip` through the network (a standby probing the
    /// active's data plane).
    PeerProbe {
        /// The probed VIP.
        vip: VipId,
        /// The result.
        result: ProbeResult,
    },
    /// Result of probing a local listener for `vip`:`port`.
    LocalProbe {
        /// The VIP the listener serves.
        vip: VipId,
        /// The port.
        port: u16,
        /// Whether it answered.
        up: bool,
    },
    /// Carrier of a local link.
    Carrier {
        /// Which link.
        link: Link,
        /// Carrier present.
        up: bool,
    },
    /// The gateway (fence target) check: `None` = no fence target has ever answered, so the
    /// gateway check is off.
    Gateway {
        /// Reachability.
        reachable: Option<bool>,
    },
    /// The pair VIPs the kernel currently holds on this node (labelled as havip's).
    LocalVips {
        /// VIPs present.
        present: BTreeSet<VipId>,
    },
    /// A read or watch event of the pair's Lease (`holder` = holderIdentity, `epoch` =
    /// leaseTransitions). A missing Lease reads as `holder: None, epoch: 0`.
    LeaseObserved {
        /// Current holder.
        holder: Option<NodeId>,
        /// Current epoch.
        epoch: u64,
    },
    /// The holder named by the Lease wrote it again without changing holder or epoch (a
    /// renewal: see [`Action::RenewLease`]): it is alive and reaches the API server.
    LeaseRenewed {
        /// The holder that renewed.
        holder: NodeId,
        /// The epoch it renewed under.
        epoch: u64,
    },
    /// The Lease store could not be read (standalone mode with a witness: the witness did
    /// not answer). The Lease counts as stale until the next [`Input::LeaseObserved`].
    LeaseUnreachable,
    /// Quorum fencing ([`crate::Config::quorum_lease_ms`]): a majority of the store's voters
    /// confirmed this member as holder (or took no newer claim) on evidence no older than
    /// `at` — the member's own monotonic time when the oldest of those voters' proofs of
    /// its liveness was taken. A holder keeps the VIPs until `at` plus the quorum lease.
    /// The I/O layer feeds it before the [`Input::CasResult`] of a granted claim too.
    LeaseConfirmed {
        /// Since when the confirmation holds.
        at: Millis,
    },
    /// Answer to the last [`Action::CasLease`].
    CasResult(CasResult),
    /// Traffic through the VIPs on this member (`None` = unknown).
    Traffic {
        /// Bytes per second.
        bytes_per_sec: Option<u64>,
    },
    /// Duplicate-address detection: a foreign MAC answered for a VIP.
    Conflict {
        /// The VIP.
        vip: VipId,
        /// The foreign MAC.
        foreign_mac: [u8; 6],
    },
    /// An operator command.
    Command(Command),
    /// The configuration changed (boxed: a `Config` is much larger than the other inputs).
    ConfigChanged(Box<Config>),
    /// Answer to [`Action::DrainVips`]: the VIPs are kept silently (`ok`), or could not be
    /// and were removed (`detail` says why).
    DrainStarted {
        /// The drain runs.
        ok: bool,
        /// Why not, for people.
        detail: String,
    },
    /// The agent stops (a restart, a rolling update, the pair's release): the last step
    /// before the runtime exits. A member that drains ends its drain (`RemoveVips`), one
    /// that forwards stops (`Forward { to: None }`), and the step's heartbeat — sent at once
    /// — no longer says it drains, so that the new holder stops forwarding here without
    /// waiting for a heartbeat timeout (an older peer understands that too).
    Stopping,
}

/// Why a heartbeat was rejected by the codec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// HMAC did not verify with any accepted key.
    KeyMismatch,
    /// The sender's wall clock is too far from ours.
    ClockSkew,
    /// Every datagram of a member refused as a replay for longer than the heartbeat
    /// timeout (single replays are only counted by the I/O layer).
    Replay,
    /// Could not be decoded.
    Malformed,
    /// Sender is not a member of the pair.
    UnknownSender,
}

/// Answer of the Lease store to a compare-and-swap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CasResult {
    /// Written: the Lease now names us under `epoch`.
    Ok {
        /// The epoch written.
        epoch: u64,
    },
    /// The Lease did not have the expected epoch; it currently reads this.
    Conflict {
        /// Current holder.
        holder: Option<NodeId>,
        /// Current epoch.
        epoch: u64,
    },
    /// The store could not be reached (standalone mode answers this at once).
    Unavailable,
    /// The store refused the claim because another member holds the VIPs and is alive: a
    /// witness that heard it say so in a fresh request within three quarters of a heartbeat
    /// timeout. Nothing changed.
    HolderAlive {
        /// The member the witness heard holding.
        holder: NodeId,
        /// The record's epoch.
        epoch: u64,
    },
}

/// An operator command. Operation ids must be below [`crate::AUTO_OP_BIT`]; a
/// repeated id is ignored (its result is reported exactly once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Make-before-break handover to `target` (or the best ready standby), after checking
    /// its readiness. Sent to the active member.
    PlannedFailover {
        /// Operation id.
        id: u64,
        /// Target, or `None` for the best candidate.
        target: Option<NodeId>,
    },
    /// Handover without the readiness checks and without waiting for the prepare ack.
    ForcedFailover {
        /// Operation id.
        id: u64,
        /// Target, or `None` for the best candidate.
        target: Option<NodeId>,
    },
    /// A failover addressed to every member of the pair at once (Kubernetes mode: the
    /// operator's `status.command`). Only the member that holds the VIPs executes it,
    /// exactly as [`Command::PlannedFailover`] or [`Command::ForcedFailover`]; every other
    /// member ignores it without a result, so that the pair's one answer is the holder's.
    /// A holder that is itself the target ignores it too: it can only hold the VIPs
    /// because the handover the command asked for has happened, and sees it late.
    PairFailover {
        /// Operation id.
        id: u64,
        /// Target, or `None` for the best candidate.
        target: Option<NodeId>,
        /// Skip the readiness checks and the prepare ack, as [`Command::ForcedFailover`].
        forced: bool,
    },
    /// Maintenance on/off for this member (declarative; persisted). An active member hands
    /// over first; `force` lets it leave even when nobody can take the VIPs.
    Maintenance {
        /// On or off.
        on: bool,
        /// Leave even without a successor (the pair stops serving).
        force: bool,
    },
    /// Clear the flap suspension now.
    ClearSuspension,
    /// Resume automatic failback after a manual or forced move (send to the active member,
    /// or to all members: standbys follow the active's flag).
    ResumeFailback,
    /// Pause (true) or resume (false) the automatic policy moves (failback and the
    /// discretionary handovers). A provably dead peer is still taken over.
    SetPaused(bool),
}

/// State that must survive restarts and reboots; written by the caller whenever the machine
/// emits [`Action::Persist`], and passed back to [`crate::Machine::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Persisted {
    /// Highest pair epoch this member knows; never goes backwards.
    pub epoch: u64,
    /// Maintenance requested.
    pub maintenance: bool,
    /// Last role. An agent restart adopts the VIPs it finds on the interface whatever this
    /// says, except in maintenance, where only a member that was Active or Demoting does.
    pub last_role: Role,
    /// Automatic failback paused after a manual or forced move.
    pub failback_paused: bool,
    /// Policy moves paused ([`Command::SetPaused`]).
    pub paused: bool,
    /// Flap suspension active (its quiet period restarts after a restart).
    pub suspended: bool,
}

impl Default for Persisted {
    fn default() -> Persisted {
        Persisted {
            epoch: 0,
            maintenance: false,
            last_role: Role::Standby,
            failback_paused: false,
            paused: false,
            suspended: false,
        }
    }
}

/// What the I/O layer must do. Execute the actions of one step **in order** (a `Persist`
/// always precedes the actions it protects).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Add these VIPs to the interface (exists-on-add is success).
    AddVips(Vec<VipId>),
    /// Remove these VIPs (missing-on-delete is success).
    RemoveVips(Vec<VipId>),
    /// Announce all held VIPs (GARP / unsolicited NA).
    Announce {
        /// Which schedule.
        kind: AnnounceKind,
    },
    /// Send this heartbeat on every path.
    SendAdvert(Advert),
    /// Compare-and-swap the pair's Lease: succeed only if its epoch is `expected_epoch`;
    /// then set holder and epoch. Answer with [`Input::CasResult`].
    CasLease {
        /// New holder (always this node).
        holder: NodeId,
        /// New epoch.
        new_epoch: u64,
        /// Epoch the Lease must have now.
        expected_epoch: u64,
    },
    /// Rewrite the Lease's renew time, keeping holder and epoch, if it still names
    /// `holder` under `epoch` (no answer; a Lease that moved on arrives as
    /// [`Input::LeaseObserved`]). Sent by a holder that cannot hear a peer, so that the
    /// peer can tell "alive but unheard" from "dead".
    RenewLease {
        /// This node.
        holder: NodeId,
        /// The epoch it holds under.
        epoch: u64,
    },
    /// Write this durably before executing the following actions.
    Persist(Persisted),
    /// Report an event (status, Kubernetes Event, metrics).
    Report(Event),
    /// After a takeover: read the VIPs back from the kernel, probe the local listeners and
    /// (`conflict_probe`) ARP-probe for a foreign holder; feed the results back as inputs.
    SelfCheck {
        /// Probe for a foreign holder. Not after accepting a handover: the old holder still
        /// holds the VIPs then, and its answer to an IPv6 probe (a neighbour advertisement
        /// to all nodes, the probe coming from `::`) would pull the clients back to it.
        conflict_probe: bool,
    },
    /// A planned move handed the VIPs to `to`: keep them as local addresses for the
    /// connections established here, without answering ARP/ND for them and without
    /// reporting them in [`Input::LocalVips`], until an `AddVips` (taken back) or a
    /// `RemoveVips` (the drain's end) names them; answer with [`Input::DrainStarted`]. When
    /// they cannot be kept so, remove them and answer `ok: false`.
    DrainVips {
        /// The VIPs.
        vips: Vec<VipId>,
        /// The new holder (which forwards the drained connections' segments here).
        to: NodeId,
    },
    /// While holding the VIPs: forward the segments of TCP flows this node does not know
    /// to `to` (a member that drains them), or stop forwarding (`None`).
    Forward {
        /// The draining member.
        to: Option<NodeId>,
    },
}

/// Something worth reporting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The member's role changed.
    RoleChanged {
        /// Previous role.
        from: Role,
        /// New role.
        to: Role,
        /// Why.
        reason: Reason,
        /// Epoch after the change.
        epoch: u64,
    },
    /// An alarm was raised.
    AlarmRaised {
        /// Which.
        alarm: Alarm,
        /// Details for people.
        detail: String,
    },
    /// An alarm cleared.
    AlarmCleared {
        /// Which.
        alarm: Alarm,
    },
    /// A drain started or ended on this member (it keeps the VIPs of a planned move for
    /// the connections established on it).
    Drain {
        /// Started (`true`) or ended.
        started: bool,
        /// The new holder.
        peer: NodeId,
        /// For people: how long, or why it ended.
        detail: String,
    },
    /// Outcome of an operator operation (reported exactly once per id).
    OperationResult {
        /// Operation id.
        id: u64,
        /// Success.
        ok: bool,
        /// Details for people.
        message: String,
    },
}

/// Alarms a member raises (each kept in [`crate::Status::alarms`] while active).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Alarm {
    /// Flap suspension active.
    Suspended,
    /// A peer speaks another protocol major version (no automatic takeover).
    VersionMismatch,
    /// Heartbeats failing HMAC verification arrive.
    KeyMismatch,
    /// Heartbeats rejected for clock skew arrive.
    ClockSkew,
    /// A held VIP is missing or its listener is down, and nobody can take it.
    VipUnhealthy,
    /// A foreign MAC answers for a held VIP.
    VipConflict,
    /// The configuration is invalid.
    Misconfigured,
    /// Maintenance requested but nobody can take the VIPs (use force).
    MaintenancePending,
    /// The pair epoch reached the top of its domain ([`crate::MAX_EPOCH`]): this
    /// member takes no VIPs and starts no handover any more (a new epoch would tie with
    /// its predecessor). Reset the pair's epochs (state files, Lease) to recover.
    EpochExhausted,
    /// A peer is silent on every heartbeat path while this member's links have carrier and
    /// its gateway answers: the peer is down, or partitioned from this member. In
    /// standalone mode (no Lease to arbitrate) a partition between the members alone, with
    /// the data-plane probe failing from each side, can leave both holding the VIPs.
    PeerSilent,
    /// Every heartbeat of a member has been refused as a replay for longer than the
    /// heartbeat timeout: it cannot be heard (e.g. it restarted and never heard us).
    HeartbeatReplay,
    /// The Lease's holder is silent on every heartbeat path but renews the Lease (it is
    /// alive and reaches the API server): a partition between the members. This member
    /// does not take the VIPs from it.
    PeerPartition,
    /// Takeovers need the Lease store's vote ([`crate::Config::lease_vote_required`]:
    /// standalone mode with a witness) and the store cannot be reached: no member takes
    /// the VIPs over until it answers again; the holder keeps them.
    WitnessUnreachable,
    /// This member holds the VIPs under an epoch more than [`crate::Config::lease_max_step`]
    /// above the Lease's: the store refuses a step that large, so the epoch is not recorded
    /// there (the heartbeats still settle who holds the VIPs, but the Lease cannot
    /// arbitrate a partition between the members meanwhile). Record it by hand.
    LeaseBehind,
}

impl Alarm {
    /// Every alarm, in declaration order (for metrics that export one series per alarm).
    pub const ALL: [Alarm; 14] = [
        Alarm::Suspended,
        Alarm::VersionMismatch,
        Alarm::KeyMismatch,
        Alarm::ClockSkew,
        Alarm::VipUnhealthy,
        Alarm::VipConflict,
        Alarm::Misconfigured,
        Alarm::MaintenancePending,
        Alarm::EpochExhausted,
        Alarm::PeerSilent,
        Alarm::HeartbeatReplay,
        Alarm::PeerPartition,
        Alarm::WitnessUnreachable,
        Alarm::LeaseBehind,
    ];

    /// Name for status and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Alarm::Suspended => "Suspended",
            Alarm::VersionMismatch => "VersionMismatch",
            Alarm::KeyMismatch => "KeyMismatch",
            Alarm::ClockSkew => "ClockSkew",
            Alarm::VipUnhealthy => "VipUnhealthy",
            Alarm::VipConflict => "VipConflict",
            Alarm::Misconfigured => "Misconfigured",
            Alarm::MaintenancePending => "MaintenancePending",
            Alarm::EpochExhausted => "EpochExhausted",
            Alarm::PeerSilent => "PeerSilent",
            Alarm::HeartbeatReplay => "HeartbeatReplay",
            Alarm::PeerPartition => "PeerPartition",
            Alarm::WitnessUnreachable => "WitnessUnreachable",
            Alarm::LeaseBehind => "LeaseBehind",
        }
    }
}

/// Why a role changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Init listen over: joined as standby.
    Startup,
    /// Agent restart: adopted the VIPs still on the interface.
    Adopted,
    /// Initial assignment: nobody was active and this member is the best candidate.
    Election,
    /// Took over a lost active.
    Takeover,
    /// A takeover claim lost the Lease compare-and-swap.
    LeaseConflict,
    /// A takeover claim was dropped because its conditions no longer held.
    ClaimAbandoned,
    /// Operator planned failover.
    PlannedFailover,
    /// Operator forced failover.
    ForcedFailover,
    /// Took the VIPs from a peer's planned handover (operator-initiated).
    HandoverAccepted,
    /// Took the VIPs from a peer's automatic handover or failback.
    AutoHandoverAccepted,
    /// Handed over because a local link lost carrier (or gave up without a successor).
    CarrierLost,
    /// Handed over because the gateway is unreachable while a peer reaches its own.
    GatewayLost,
    /// Handed over because a VIP stayed missing/unhealthy.
    VipUnhealthy,
    /// Handed over because a listener stayed down.
    ListenerDown,
    /// Automatic failback to the preferred member.
    Failback,
    /// Maintenance on.
    MaintenanceOn,
    /// Maintenance off.
    MaintenanceOff,
    /// Cut off (carrier, gateway): fenced.
    Fenced,
    /// No longer cut off.
    Unfenced,
    /// Another holder has a newer epoch (or the same epoch and a higher priority).
    NewerEpochPeer,
    /// The Lease names another holder under a newer epoch.
    NewerEpochLease,
    /// Gave the VIPs up to a member of higher priority that answers for them too (a VIP
    /// conflict) while its heartbeats arrive from its address but fail verification (a key
    /// mismatch): two holders that cannot verify each other end with one.
    UnverifiedPeer,
    /// The planned handover was not confirmed in time: took the VIPs back.
    Aborted,
    /// The active aborted the handover this member had accepted.
    AbortedByPeer,
    /// The local node left the pair's configuration.
    Unpaired,
    /// The local node joined the pair's configuration.
    Paired,
    /// Quorum fencing: no majority of the members' votes confirmed this holder within the
    /// quorum lease (it is on the minority side of a partition, or cannot reach the others).
    QuorumLost,
}

impl Reason {
    /// Every reason, in declaration order (the label values of
    /// `havip_agent_role_transitions_total{name}`: the chart's dashboard test checks the
    /// reasons it queries against these).
    pub const ALL: [Reason; 27] = [
        Reason::Startup,
        Reason::Adopted,
        Reason::Election,
        Reason::Takeover,
        Reason::LeaseConflict,
        Reason::ClaimAbandoned,
        Reason::PlannedFailover,
        Reason::ForcedFailover,
        Reason::HandoverAccepted,
        Reason::AutoHandoverAccepted,
        Reason::CarrierLost,
        Reason::GatewayLost,
        Reason::VipUnhealthy,
        Reason::ListenerDown,
        Reason::Failback,
        Reason::MaintenanceOn,
        Reason::MaintenanceOff,
        Reason::Fenced,
        Reason::Unfenced,
        Reason::NewerEpochPeer,
        Reason::NewerEpochLease,
        Reason::UnverifiedPeer,
        Reason::Aborted,
        Reason::AbortedByPeer,
        Reason::Unpaired,
        Reason::Paired,
        Reason::QuorumLost,
    ];

    /// Name for logs, agent Events and metric labels (`"Takeover"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Startup => "Startup",
            Reason::Adopted => "Adopted",
            Reason::Election => "Election",
            Reason::Takeover => "Takeover",
            Reason::LeaseConflict => "LeaseConflict",
            Reason::ClaimAbandoned => "ClaimAbandoned",
            Reason::PlannedFailover => "PlannedFailover",
            Reason::ForcedFailover => "ForcedFailover",
            Reason::HandoverAccepted => "HandoverAccepted",
            Reason::AutoHandoverAccepted => "AutoHandoverAccepted",
            Reason::CarrierLost => "CarrierLost",
            Reason::GatewayLost => "GatewayLost",
            Reason::VipUnhealthy => "VipUnhealthy",
            Reason::ListenerDown => "ListenerDown",
            Reason::Failback => "Failback",
            Reason::MaintenanceOn => "MaintenanceOn",
            Reason::MaintenanceOff => "MaintenanceOff",
            Reason::Fenced => "Fenced",
            Reason::Unfenced => "Unfenced",
            Reason::NewerEpochPeer => "NewerEpochPeer",
            Reason::NewerEpochLease => "NewerEpochLease",
            Reason::UnverifiedPeer => "UnverifiedPeer",
            Reason::Aborted => "Aborted",
            Reason::AbortedByPeer => "AbortedByPeer",
            Reason::Unpaired => "Unpaired",
            Reason::Paired => "Paired",
            Reason::QuorumLost => "QuorumLost",
        }
    }

    /// Role changes with these reasons count towards flap suspension.
    pub fn automatic(self) -> bool {
        matches!(
            self,
            Reason::Takeover
                | Reason::AutoHandoverAccepted
                | Reason::CarrierLost
                | Reason::GatewayLost
                | Reason::VipUnhealthy
                | Reason::ListenerDown
                | Reason::Failback
        )
    }

    /// Moves that suspension and [`Command::SetPaused`] block (carrier and gateway moves and
    /// the takeover of a provably dead peer are not discretionary).
    pub fn discretionary(self) -> bool {
        matches!(self, Reason::VipUnhealthy | Reason::ListenerDown | Reason::Failback)
    }
}

#[cfg(test)]
mod tests {
    use super::{Alarm, Reason};

    /// Position of `a` in [`Alarm::ALL`], by an exhaustive match: a new variant does not
    /// compile until it is placed here, and the test below then wants it in `ALL` too.
    fn position(a: Alarm) -> usize {
        match a {
            Alarm::Suspended => 0,
            Alarm::VersionMismatch => 1,
            Alarm::KeyMismatch => 2,
            Alarm::ClockSkew => 3,
            Alarm::VipUnhealthy => 4,
            Alarm::VipConflict => 5,
            Alarm::Misconfigured => 6,
            Alarm::MaintenancePending => 7,
            Alarm::EpochExhausted => 8,
            Alarm::PeerSilent => 9,
            Alarm::HeartbeatReplay => 10,
            Alarm::PeerPartition => 11,
            Alarm::WitnessUnreachable => 12,
            Alarm::LeaseBehind => 13,
        }
    }

    /// Position of `r` in [`Reason::ALL`] (exhaustive, as [`position`]).
    fn reason_position(r: Reason) -> usize {
        match r {
            Reason::Startup => 0,
            Reason::Adopted => 1,
            Reason::Election => 2,
            Reason::Takeover => 3,
            Reason::LeaseConflict => 4,
            Reason::ClaimAbandoned => 5,
            Reason::PlannedFailover => 6,
            Reason::ForcedFailover => 7,
            Reason::HandoverAccepted => 8,
            Reason::AutoHandoverAccepted => 9,
            Reason::CarrierLost => 10,
            Reason::GatewayLost => 11,
            Reason::VipUnhealthy => 12,
            Reason::ListenerDown => 13,
            Reason::Failback => 14,
            Reason::MaintenanceOn => 15,
            Reason::MaintenanceOff => 16,
            Reason::Fenced => 17,
            Reason::Unfenced => 18,
            Reason::NewerEpochPeer => 19,
            Reason::NewerEpochLease => 20,
            Reason::UnverifiedPeer => 21,
            Reason::Aborted => 22,
            Reason::AbortedByPeer => 23,
            Reason::Unpaired => 24,
            Reason::Paired => 25,
            Reason::QuorumLost => 26,
        }
    }

    #[test]
    fn reason_all_lists_every_reason_once() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(reason_position(*r), i, "{r:?} out of place in Reason::ALL");
        }
        let mut names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len(), "reason names are unique");
    }

    #[test]
    fn alarm_all_lists_every_alarm_once() {
        for (i, a) in Alarm::ALL.iter().enumerate() {
            assert_eq!(position(*a), i, "{a:?} out of place in Alarm::ALL");
        }
        let mut names: Vec<&str> = Alarm::ALL.iter().map(|a| a.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Alarm::ALL.len(), "alarm names are unique");
    }
}
