//! A snapshot of the machine for reporting (`status.members[]`, metrics, `kubectl havip
//! status`) and for tests.

use super::io::{Alarm, Reason};
use super::types::{Millis, NodeId, PathId, Role, VipId};

/// Snapshot returned by [`crate::Machine::status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// This node.
    pub node: NodeId,
    /// This member drains a planned move to that new holder, until then (machine time).
    pub draining: Option<(NodeId, Millis)>,
    /// This member holds the VIPs and forwards the connections of that draining member.
    pub forwarding_to: Option<NodeId>,
    /// Current role.
    pub role: Role,
    /// Highest pair epoch known (never goes backwards).
    pub epoch: u64,
    /// Epoch under which this member holds or claims the VIPs (when Active/Demoting or
    /// adopting).
    pub held_epoch: Option<u64>,
    /// This member believes it holds the VIPs (it added or adopted them). An Active member
    /// with `holds_vips == false` is claiming: waiting for the Lease compare-and-swap.
    pub holds_vips: bool,
    /// Own priority (0 when unpaired).
    pub priority: u8,
    /// Maintenance requested.
    pub maintenance: bool,
    /// Policy moves paused.
    pub paused: bool,
    /// Automatic failback paused after a manual move.
    pub failback_paused: bool,
    /// Flap suspension active on this member.
    pub suspended: bool,
    /// Failback quarantine in force until then.
    pub quarantined_until: Option<Millis>,
    /// No unplanned takeover before then.
    pub hold_down_until: Option<Millis>,
    /// Boot hold in force until then (only while no peer was ever heard).
    pub boot_hold_until: Option<Millis>,
    /// Own listeners up for every VIP.
    pub ready_all: bool,
    /// Why peers would not hand this member the VIPs now (what its heartbeats say), or
    /// `None`: it is a ready target.
    pub not_ready: Option<NotReady>,
    /// Own data and VIP links have carrier (unknown reads false).
    pub carrier_ok: bool,
    /// Link dampening: the own carrier returned and counts as stable (ready as a handover
    /// target) only from then on; `None` when no return is pending. A takeover waits only
    /// the base time ([`crate::Timings::carrier_stable_ms`]) after the return.
    pub carrier_settled_at: Option<Millis>,
    /// Own gateway check (`None` = off).
    pub gateway: Option<bool>,
    /// Aggregate verdict of the data-plane probes through the VIPs.
    pub probe: ProbeState,
    /// Why this member would not take the VIPs now (`None` when it holds them, or would).
    pub blocker: Option<Blocker>,
    /// What this member knows of each peer.
    pub peers: Vec<PeerStatus>,
    /// Active alarms, sorted.
    pub alarms: Vec<Alarm>,
    /// While the `VipConflict` alarm stands: each VIP a foreign host answered for, with
    /// the foreign MAC last seen, sorted by VIP.
    pub conflicts: Vec<(VipId, [u8; 6])>,
    /// Last Lease state seen (from a watch, a read or a CAS answer).
    pub lease: Option<LeaseView>,
    /// The Lease may be behind this member's epoch (a CAS was unavailable).
    pub lease_stale: bool,
    /// Planned operation in progress, if any.
    pub operation: Option<OperationStatus>,
    /// Last role change.
    pub last_transition: Option<Transition>,
    /// The configuration is valid.
    pub config_valid: bool,
    /// Heartbeats ignored because they carried an epoch outside the epoch's domain
    /// (above [`crate::MAX_EPOCH`]), since start.
    pub ignored_adverts: u64,
    /// The pair VIPs the kernel holds, as last observed (`None` before the first
    /// observation).
    pub local_vips: Option<Vec<VipId>>,
}

/// One peer as seen by this member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerStatus {
    /// The peer.
    pub node: NodeId,
    /// Its configured priority.
    pub priority: u8,
    /// Paths it is heard on now.
    pub heard_paths: Vec<PathId>,
    /// When it was last heard on any path.
    pub last_heard: Option<Millis>,
    /// Its last advertised role.
    pub role: Option<Role>,
    /// Its last advertised epoch.
    pub epoch: Option<u64>,
    /// It advertised holding the VIPs.
    pub holds_vips: bool,
    /// It advertised readiness for every VIP.
    pub ready_all: bool,
    /// It advertised maintenance.
    pub maintenance: bool,
    /// It advertised a flap suspension.
    pub suspended: bool,
    /// Its protocol version (major, minor).
    pub protocol: Option<(u16, u16)>,
    /// Its configuration revision.
    pub config_revision: Option<u64>,
}

/// The Lease as last seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    /// holderIdentity.
    pub holder: Option<NodeId>,
    /// leaseTransitions.
    pub epoch: u64,
}

/// A role change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// Previous role.
    pub from: Role,
    /// New role.
    pub to: Role,
    /// Why.
    pub reason: Reason,
    /// Epoch after the change.
    pub epoch: u64,
    /// When.
    pub at: Millis,
}

/// Verdict of the data-plane probe (through the VIPs) of the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeState {
    /// No VIP has a probe port: the data plane reads unknown; heartbeat and gateway decide.
    NoTarget,
    /// Not enough fresh evidence yet (no result, a failure streak too short, or stale).
    Pending,
    /// Some VIP answers.
    Up,
    /// Every probed VIP failed enough times over the minimum span, recently.
    Down,
}

/// Why a member would not take the VIPs now (first failing condition, in the order the
/// machine checks them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Blocker {
    /// Not a standby (Init, Maintenance, Fenced, Unpaired, or already Active).
    NotStandby,
    /// Configuration invalid.
    Misconfigured,
    /// The pair epoch is at the top of its domain: no fresh epoch to take the VIPs under.
    EpochExhausted,
    /// In maintenance.
    Maintenance,
    /// Own data or VIP link without carrier (or not yet observed).
    CarrierDown,
    /// Own carrier returned less than the link-dampening time
    /// ([`crate::Timings::carrier_stable_ms`]) ago.
    CarrierSettling,
    /// Own gateway unreachable.
    GatewayUnreachable,
    /// A peer speaks another protocol major version.
    VersionMismatch,
    /// Within the hold-down after taking or giving up the VIPs.
    HoldDown,
    /// A takeover claim just lost the Lease to another member: wait one heartbeat timeout
    /// to hear the winner before claiming again.
    LeaseConflictBackoff,
    /// A peer is heard being active or holding the VIPs.
    PeerActive,
    /// The Lease's holder cannot be heard but renews the Lease: it is alive (a
    /// partition between the members), and keeps the VIPs.
    PeerAliveViaLease,
    /// Takeovers need the Lease store's vote (a witness) and it cannot be reached.
    WitnessUnreachable,
    /// A planned handover to this member is in progress.
    OperationInProgress,
    /// Never heard a peer, boot hold not over.
    BootHold,
    /// A peer has been heard for less than the init listen.
    PeerNotSteady,
    /// The VIPs answer through the data plane.
    DataPlaneUp,
    /// The data plane is not proven down yet.
    DataPlanePending,
    /// Flap suspension, with an unknown data plane.
    SuspendedUnknownDataPlane,
    /// Policy moves paused, with an unknown data plane.
    PausedUnknownDataPlane,
    /// A higher-priority candidate gets its turn first (priority stagger).
    Staggered,
}

/// A planned operation in progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationStatus {
    /// Operation id.
    pub id: u64,
    /// The peer: the target (initiator side) or the initiator (target side).
    pub peer: NodeId,
    /// This member's side and phase.
    pub phase: OperationPhase,
}

/// Phase of a planned operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OperationPhase {
    /// Initiator: prepare sent, waiting for the ack.
    Preparing,
    /// Initiator: commit sent, waiting for the confirm (Demoting).
    Committed,
    /// Target: acked, waiting for the commit.
    Acked,
    /// Target: took the VIPs, confirming.
    Accepted,
}

/// Why a member is no ready handover target (its heartbeats carry `ready_all: false`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotReady {
    /// A listener (a probe port or a health check of its own) does not answer.
    Listener,
    /// Cut off: a link without carrier, or the gateway unreachable.
    CutOff,
    /// Its carrier returned a moment ago and does not count as stable yet.
    CarrierSettling,
}
