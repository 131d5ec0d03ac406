//! Small value types shared by the state machine's inputs, outputs and status.

use std::fmt;

use thiserror::Error;

/// A point on the local **monotonic** clock, in milliseconds.
///
/// The machine never reads a clock: every call to [`crate::Machine::step`] carries
/// `now`. Only differences between two `Millis` of the same process are meaningful, so a
/// `Millis` is never persisted and never sent to a peer. If a caller passes a `now` that is
/// smaller than a previous one, the machine treats it as the previous one (time never runs
/// backwards inside the machine).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);

impl Millis {
    /// Milliseconds elapsed from `earlier` to `self` (0 if `earlier` is later).
    pub fn since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// This instant plus `ms` milliseconds (saturating).
    pub fn plus(self, ms: u64) -> Millis {
        Millis(self.0.saturating_add(ms))
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// Highest pair epoch there is: the Kubernetes Lease records the epoch in
/// `leaseTransitions`, a 32-bit signed integer, so the epoch's domain is `0..=i32::MAX`
/// in both modes. A state file or a heartbeat with an epoch above it is refused, and a
/// member whose epoch reaches it takes no VIPs any more (alarm `EpochExhausted`) rather
/// than reuse an epoch: a reused epoch ties with its predecessor, and a tie falls back to
/// priority, which can hand the VIPs back to a member that lost them. At one takeover per
/// second the domain lasts 68 years.
pub const MAX_EPOCH: u64 = i32::MAX as u64;

/// The largest step by which an agent may raise a pair Lease's epoch in one write (the
/// chart's admission policy `havip-agent-pair-leases` refuses more; a test keeps the two
/// in agreement). Without it, one write of an agent's token could raise the epoch to the
/// top of the domain and leave the pair unable to fail over (`EpochExhausted`).
///
/// How far a member's epoch can legitimately run ahead of the Lease: by one per role
/// change the pair makes while the Lease cannot be written (a takeover under the
/// standalone rules while the API server is unreachable, a tie-break between two
/// actives, a planned or automatic handover), and each such change needs a holder that
/// failed or handed over, at most once per hold-down (3 s by default) per member. A
/// thousand covers a pair failing back and forth for the better part of an hour without
/// the API server; exhausting the domain in steps of this size takes over two million
/// writes, each of which makes the real holder step down in plain sight.
pub const MAX_LEASE_STEP: u64 = 1_000;

/// Longest node name accepted, in bytes (a Kubernetes node name label is at most 63 bytes,
/// and the heartbeat codec relies on this bound).
pub const MAX_NODE_NAME: usize = 63;

/// Longest VIP identifier accepted, in bytes (a Kubernetes object name is at most 253).
pub const MAX_VIP_ID: usize = 253;

/// A name that does not fit the bounds of [`NodeId`] or [`VipId`].
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum NameError {
    /// The name was empty.
    #[error("failed to accept name: it is empty")]
    Empty,
    /// The name was longer than allowed.
    #[error("failed to accept name {name:?}: it is longer than {max} bytes")]
    TooLong {
        /// The offending name.
        name: String,
        /// The limit in bytes.
        max: usize,
    },
}

fn check_name(s: &str, max: usize) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError::Empty);
    }
    if s.len() > max {
        return Err(NameError::TooLong { name: s.to_owned(), max });
    }
    Ok(())
}

/// A pair member, identified by its Kubernetes node name (1..=63 bytes).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(String);

impl NodeId {
    /// Validates and wraps a node name.
    pub fn new(name: impl Into<String>) -> Result<NodeId, NameError> {
        let name = name.into();
        check_name(&name, MAX_NODE_NAME)?;
        Ok(NodeId(name))
    }

    /// The node name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for NodeId {
    type Error = NameError;
    fn try_from(s: &str) -> Result<NodeId, NameError> {
        NodeId::new(s)
    }
}

/// One of the pair's VIPs, by an identifier the I/O layer chooses (for example the
/// `FloatingIP` object name). Opaque to the machine; 1..=253 bytes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VipId(String);

impl VipId {
    /// Validates and wraps a VIP identifier.
    pub fn new(id: impl Into<String>) -> Result<VipId, NameError> {
        let id = id.into();
        check_name(&id, MAX_VIP_ID)?;
        Ok(VipId(id))
    }

    /// The identifier.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VipId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for VipId {
    type Error = NameError;
    fn try_from(s: &str) -> Result<VipId, NameError> {
        VipId::new(s)
    }
}

/// A heartbeat path (for example 0 = data network, 1 = management network). The numbering
/// is the I/O layer's; [`crate::Config::paths`] lists the paths a peer must be heard on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathId(pub u8);

/// The role of a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Starting up: listening for peers (init listen); holds no VIP unless it adopts the
    /// VIPs it held before an agent restart.
    Init,
    /// Holds the pair's VIPs (or is claiming them: see `Status::holds_vips`).
    Active,
    /// Ready to take the VIPs.
    Standby,
    /// Handing the VIPs to a peer (planned handover), still holding them until confirmed.
    Demoting,
    /// Out of the election (operator maintenance); takes no VIPs.
    Maintenance,
    /// Took itself out after detecting that it is cut off (carrier, gateway); takes no VIPs.
    Fenced,
    /// Runs, but the local node is not a member of the pair's configuration.
    Unpaired,
}

impl Role {
    /// All roles, in wire-code order.
    pub const ALL: [Role; 7] =
        [Role::Init, Role::Active, Role::Standby, Role::Demoting, Role::Maintenance, Role::Fenced, Role::Unpaired];

    /// Stable one-byte code for the heartbeat codec.
    pub fn code(self) -> u8 {
        match self {
            Role::Init => 0,
            Role::Active => 1,
            Role::Standby => 2,
            Role::Demoting => 3,
            Role::Maintenance => 4,
            Role::Fenced => 5,
            Role::Unpaired => 6,
        }
    }

    /// Inverse of [`Role::code`]; `None` for an unknown code.
    pub fn from_code(code: u8) -> Option<Role> {
        Role::ALL.get(usize::from(code)).copied()
    }

    /// Name as used in status and events (`"Active"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Init => "Init",
            Role::Active => "Active",
            Role::Standby => "Standby",
            Role::Demoting => "Demoting",
            Role::Maintenance => "Maintenance",
            Role::Fenced => "Fenced",
            Role::Unpaired => "Unpaired",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which local link a [`crate::Input::Carrier`] observation is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Link {
    /// The data link (the interface the data-path heartbeat and the probes use).
    Data,
    /// The link that carries the VIPs (often the same interface as `Data`).
    Vip,
}

/// Result of one TCP connect probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    /// The connect succeeded.
    Up,
    /// The connect failed (refused, timed out, unreachable).
    Down,
}

/// Protocol version of the heartbeat/handover protocol a member speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProtocolVersion {
    /// Incompatible changes bump the major; members with different majors never take over
    /// from each other automatically.
    pub major: u16,
    /// Compatible additions.
    pub minor: u16,
}

/// The protocol version this build speaks.
pub const PROTOCOL: ProtocolVersion = ProtocolVersion { major: 1, minor: 0 };

/// Gratuitous ARP / unsolicited NA schedule to run for the held VIPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AnnounceKind {
    /// The takeover burst (repeats spaced over about a second).
    Burst,
    /// A single refresh (the VIPs did not move, for example after adopting them on an
    /// agent restart). Periodic refreshes while active are the I/O layer's own schedule.
    Refresh,
}
