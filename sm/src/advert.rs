//! The heartbeat content ("advert") exchanged by members, including the planned-handover
//! messages. Plain data: the binary codec (with HMAC, sequence number and wall-clock
//! timestamp) lives elsewhere and maps these fields one to one.

use super::types::{NodeId, Role};

/// Operation ids with this bit set were started by a member itself (automatic handover,
/// failback, maintenance); ids from the operator must leave it clear.
pub const AUTO_OP_BIT: u64 = 1 << 63;

/// One heartbeat, as sent by a member on every path every heartbeat interval and at once
/// on every role or operation change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advert {
    /// Sending node (at most 63 bytes, guaranteed by [`NodeId`]).
    pub sender: NodeId,
    /// Sender's role.
    pub role: Role,
    /// For a member holding (or claiming) the VIPs: the epoch it holds them under;
    /// otherwise the highest pair epoch it knows.
    pub epoch: u64,
    /// Sender's priority.
    pub priority: u8,
    /// The sender holds the pair's VIPs on its interface (an Init member adopting them after
    /// an agent restart also sets this).
    pub holds_vips: bool,
    /// Revision of the pair configuration the sender runs.
    pub config_revision: u64,
    /// Sender's protocol major version.
    pub protocol_major: u16,
    /// Sender's protocol minor version.
    pub protocol_minor: u16,
    /// The sender's listeners are up for every VIP (it could serve them all now).
    pub ready_all: bool,
    /// The sender is in maintenance (or has maintenance pending).
    pub maintenance: bool,
    /// The sender's data and VIP links have carrier.
    pub carrier_ok: bool,
    /// The sender's gateway check: `None` = off (no fence target ever answered).
    pub gateway: Option<bool>,
    /// The sender's flap suspension is active.
    pub suspended: bool,
    /// Automatic failback is paused on the sender (after a manual or forced move).
    pub failback_paused: bool,
    /// The sender drains: it gave the VIPs up in a planned move and keeps them, without
    /// answering ARP/ND for them, for connections established on it; the holder forwards
    /// their segments to it.
    pub draining: bool,
    /// Planned-handover message, repeated in every advert while it is current.
    pub op: Option<OpMsg>,
    /// The sender's next heartbeat comes within this many milliseconds (its current
    /// heartbeat interval: a quiet standby's is [`crate::Timings::quiet_interval_ms`]).
    /// 0: not declared — a sender of an earlier release, which sends every heartbeat
    /// interval and does not honour what its peers declare; no member is quiet towards it.
    pub interval_ms: u32,
}

/// A planned-handover message carried in an [`Advert`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpMsg {
    /// Operation id (see [`AUTO_OP_BIT`]).
    pub id: u64,
    /// What is said.
    pub kind: OpKind,
}

/// Planned handover (make-before-break): active → `Prepare{to}`; target → `PrepareAck` or
/// `Refuse`; active → `Commit{to, epoch}` (enters Demoting, keeps the VIPs); target adds the
/// VIPs, becomes Active under `epoch` → `Confirm`; active removes the VIPs. No confirm
/// within the confirm timeout → active takes the VIPs back and sends `Abort`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Active asks `to` to get ready to take the VIPs.
    Prepare {
        /// The target.
        to: NodeId,
    },
    /// Target is ready.
    PrepareAck,
    /// Target refuses.
    Refuse {
        /// Why.
        reason: RefuseReason,
    },
    /// Active hands the VIPs to `to` under `epoch`.
    Commit {
        /// The target.
        to: NodeId,
        /// New pair epoch.
        epoch: u64,
    },
    /// Target holds the VIPs now.
    Confirm,
    /// Active abandons the operation (a target that took the VIPs gives them back).
    Abort,
}

impl OpKind {
    /// Stable one-byte code for the codec.
    pub fn code(&self) -> u8 {
        match self {
            OpKind::Prepare { .. } => 0,
            OpKind::PrepareAck => 1,
            OpKind::Refuse { .. } => 2,
            OpKind::Commit { .. } => 3,
            OpKind::Confirm => 4,
            OpKind::Abort => 5,
        }
    }
}

/// Why a target refused a planned handover (a small code on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    /// The target is not a standby.
    NotStandby,
    /// A listener of the target is not up for some VIP.
    NotReady,
    /// The target is in maintenance.
    Maintenance,
    /// The target is cut off (carrier or gateway).
    CutOff,
    /// Different configuration revision.
    ConfigRevision,
    /// Different protocol major version.
    ProtocolMismatch,
    /// The target is busy with another operation.
    Busy,
    /// The target already knows a newer epoch than the one committed.
    StaleEpoch,
    /// The target's configuration is invalid.
    Misconfigured,
    /// A code this build does not know.
    Other,
}

impl RefuseReason {
    /// Stable one-byte code for the codec.
    pub fn code(self) -> u8 {
        match self {
            RefuseReason::NotStandby => 1,
            RefuseReason::NotReady => 2,
            RefuseReason::Maintenance => 3,
            RefuseReason::CutOff => 4,
            RefuseReason::ConfigRevision => 5,
            RefuseReason::ProtocolMismatch => 6,
            RefuseReason::Busy => 7,
            RefuseReason::StaleEpoch => 8,
            RefuseReason::Misconfigured => 9,
            RefuseReason::Other => 255,
        }
    }

    /// Inverse of [`RefuseReason::code`]; unknown codes map to `Other`.
    pub fn from_code(code: u8) -> RefuseReason {
        match code {
            1 => RefuseReason::NotStandby,
            2 => RefuseReason::NotReady,
            3 => RefuseReason::Maintenance,
            4 => RefuseReason::CutOff,
            5 => RefuseReason::ConfigRevision,
            6 => RefuseReason::ProtocolMismatch,
            7 => RefuseReason::Busy,
            8 => RefuseReason::StaleEpoch,
            9 => RefuseReason::Misconfigured,
            _ => RefuseReason::Other,
        }
    }

    /// Human-readable text.
    pub fn as_str(self) -> &'static str {
        match self {
            RefuseReason::NotStandby => "target is not a standby",
            RefuseReason::NotReady => "target is not ready for every VIP",
            RefuseReason::Maintenance => "target is in maintenance",
            RefuseReason::CutOff => "target is cut off (carrier or gateway)",
            RefuseReason::ConfigRevision => "target runs another configuration revision",
            RefuseReason::ProtocolMismatch => "target speaks another protocol major version",
            RefuseReason::Busy => "target is busy with another operation",
            RefuseReason::StaleEpoch => "target knows a newer epoch",
            RefuseReason::Misconfigured => "target is misconfigured",
            RefuseReason::Other => "target refused",
        }
    }
}
