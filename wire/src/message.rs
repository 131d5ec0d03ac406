//! What a heartbeat carries: the protocol constants and the decoded datagram
//! ([`Heartbeat`], its [`Body`] and [`Session`]). Plain data; `codec` reads and writes it.

/// The protocol major version this build speaks. Members with another major do not
/// take over from each other automatically.
pub const PROTOCOL_MAJOR: u8 = 1;
/// The protocol minor version this build writes (1: the body ends with a [`Session`];
/// 2: then with the sender's [`PathEcho`]es; 3: then with its interval; 4: the same
/// layout, from an agent that reads bundles — see [`crate::bundle`]).
pub const PROTOCOL_MINOR: u8 = 4;
/// The first minor version that carries a [`Session`].
pub const SESSION_MINOR: u8 = 1;
/// The first minor version that carries [`PathEcho`]es (after the [`Session`]).
pub const ECHO_MINOR: u8 = 2;
/// The first minor version that carries the sender's interval ([`Body::interval_ms`],
/// after the [`PathEcho`]es).
pub const INTERVAL_MINOR: u8 = 3;
/// Most [`PathEcho`]es one heartbeat carries (more is malformed).
pub const MAX_ECHOES: usize = 4;
/// Datagrams larger than this are dropped unread.
pub const MAX_DATAGRAM: usize = 512;
/// Longest pair or node name on the wire.
pub const MAX_NAME: usize = 63;

/// A member's role as carried in heartbeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WireRole {
    /// Starting up, listening for peers.
    Init = 0,
    /// Holds the VIPs.
    Active = 1,
    /// Ready to take over.
    Standby = 2,
    /// Handing the VIPs over.
    Demoting = 3,
    /// Out of the election.
    Maintenance = 4,
    /// Cut off; takes no VIPs.
    Fenced = 5,
    /// Belongs to no pair.
    Unpaired = 6,
}

impl WireRole {
    pub(super) fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Init,
            1 => Self::Active,
            2 => Self::Standby,
            3 => Self::Demoting,
            4 => Self::Maintenance,
            5 => Self::Fenced,
            6 => Self::Unpaired,
            _ => return None,
        })
    }
}

/// Gateway reachability as carried in heartbeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireGateway {
    /// No fence target ever answered: the check is off.
    Unknown,
    /// A fence target answers.
    Reachable,
    /// Fence targets answered before and do not now.
    Unreachable,
}

/// A step of a planned handover, carried in the heartbeat of the member that sends it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WireOp {
    /// Active → target: prepare to take the VIPs.
    Prepare {
        /// Operation id.
        id: u64,
        /// The member that should take them.
        to: String,
    },
    /// Target → active: ready.
    PrepareAck {
        /// Operation id.
        id: u64,
    },
    /// Target → active: not ready, with a reason code.
    Refuse {
        /// Operation id.
        id: u64,
        /// Why (a small code the state machine defines).
        reason: u8,
    },
    /// Active → target: take the VIPs under `epoch`.
    Commit {
        /// Operation id.
        id: u64,
        /// The member that should take them.
        to: String,
        /// The epoch the target takes them under.
        epoch: u64,
    },
    /// Target → active: took them.
    Confirm {
        /// Operation id.
        id: u64,
    },
    /// Active → target: the handover is off; drop the VIPs if you added them.
    Abort {
        /// Operation id.
        id: u64,
    },
}

/// The content of a heartbeat (what the state machine needs of its peers).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Body {
    /// The sender's role.
    pub role: WireRole,
    /// The sender's epoch.
    pub epoch: u64,
    /// The sender's priority (1..254).
    pub priority: u8,
    /// The sender holds the VIPs in its kernel.
    pub holds_vips: bool,
    /// The sender could serve every VIP now.
    pub ready_all: bool,
    /// The sender is in maintenance.
    pub maintenance: bool,
    /// The sender's data and VIP links have carrier.
    pub carrier_ok: bool,
    /// The sender's flap suspension is on.
    pub suspended: bool,
    /// The sender's automatic failback is paused.
    pub failback_paused: bool,
    /// The sender gave the VIPs up in a planned move and still keeps them, silently, for
    /// connections established on it: the holder may forward their segments to it (flag
    /// bit 8; a receiver of an older build ignores it).
    pub draining: bool,
    /// The sender's gateway reachability.
    pub gateway: WireGateway,
    /// The configuration revision the sender applied.
    pub config_revision: u64,
    /// A planned-handover step, if one is in progress.
    pub op: Option<WireOp>,
    /// The sender's next heartbeat comes within this many milliseconds (minor ≥ 3; 0 from
    /// an older sender: it does not declare one, nor honour its peers').
    pub interval_ms: u32,
}

/// A decoded, authenticated heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Heartbeat {
    /// Sender's protocol major version.
    pub major: u8,
    /// Sender's protocol minor version.
    pub minor: u8,
    /// The key that signed it.
    pub key_id: u32,
    /// Per-sender sequence number.
    pub seq: u64,
    /// Sender's wall clock, ms since the Unix epoch.
    pub timestamp_ms: u64,
    /// The pair.
    pub pair: String,
    /// The sending node.
    pub sender: String,
    /// The content.
    pub body: Body,
    /// The sender's session (minor ≥ 1; `None` from an older sender).
    pub session: Option<Session>,
    /// The receiver's heartbeats the sender heard last, one per path (minor ≥ 2 with a
    /// session; empty from an older sender). They give the receiver each path's round trip.
    pub echoes: Vec<PathEcho>,
}

/// The last heartbeat the sender heard from the receiver on one path, and how long before
/// sending this one: the receiver, knowing when it sent that sequence number, reads the
/// path's round-trip time off a heartbeat arriving on the same path
/// (`now − sent − held`). The path is named by the receiver's address on it — the source
/// address of what the sender heard — which both ends agree on whatever their paths are
/// called or in which order they are configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PathEcho {
    /// The receiver's address on the path.
    pub to: std::net::IpAddr,
    /// The receiver's sequence number the sender heard last on it.
    pub seq: u64,
    /// Microseconds between hearing it and sending this heartbeat (saturated).
    pub held_us: u32,
}

/// A sender's session, carried at the end of the body since minor version 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Session {
    /// Random, nonzero, new at every agent start.
    pub id: u64,
    /// The receiver's session id as the sender last heard it (0: not heard yet). It proves
    /// to the receiver that this session began after the receiver's own start.
    pub echo: u64,
}
