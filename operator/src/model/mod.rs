//! The operator's decisions as pure functions of what it observed: member addresses
//! and the configuration revision, phase and conditions, the pair's last transition,
//! imperative requests (annotation → refusal or command), command answers and key
//! rotation. No I/O and no clock reads: `now` is an input. The controller
//! ([`crate::pair::hapair`]) gathers the inputs from its caches and applies the outputs.
//!
//! Here: the observation ([`Observed`] and its parts) and the constants; the decisions
//! are in [`spec`], [`assess`], [`status`], [`requests`], [`keys`], [`fip`] and
//! [`events`], and [`plan`] composes them into every write of one HAPair reconcile.

use havip_crds::hapair::{MemberStatus, NodeAddressType};
use havip_crds::revision::{config_revision, format_revision};
use havip_crds::{
    FloatingIPSpec, HAPairSpec, HAPairStatus, KeyRotation, MemberAlarm, MemberRole, Operation, OperationKind,
    OperationResult, PairCommand, Phase, TransitionReason, VipState,
};
use havip_crds::{annotation, condition, reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A member whose `lastSeen` is older than this is "not reporting" (agents refresh it
/// every 60 s).
pub const NOT_REPORTING_AFTER: Duration = Duration::from_secs(180);
/// How long after a Lease change the new holder may still report its old role (its
/// status write trails the compare-and-swap) before the pair reads Failed.
pub const HANDOVER_SETTLE: Duration = Duration::from_secs(5);
/// A command nobody answered within this long is answered `Failed`.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Requeue of an object that cannot be acted on: slow, it will not fix itself (a change
/// to it triggers a reconcile at once).
pub const INVALID_REQUEUE: Duration = Duration::from_secs(600);

/// Reasons the operator adds to those of [`havip_crds::reason`].
pub mod local_reason {
    /// No member is a ready standby.
    pub const NO_READY_STANDBY: &str = "NoReadyStandby";
    /// A member has no address on a heartbeat path (its peers cannot reach it there).
    pub const ADDRESS_MISSING: &str = "AddressMissing";
    /// A member raises an alarm the other reasons do not cover.
    pub const MEMBER_ALARM: &str = "MemberAlarm";
    /// Nobody holds the VIPs.
    pub const NO_ACTIVE: &str = "NoActive";
    /// The pair is waiting for its first report or election.
    pub const PENDING: &str = "Pending";
    /// The FloatingIP names a pair that does not exist.
    pub const PAIR_NOT_FOUND: &str = "PairNotFound";
    /// The FloatingIP's pair exists.
    pub const PAIR_FOUND: &str = "PairFound";
}

/// Condition type of a FloatingIP that says whether its pair exists.
pub const CONDITION_PAIR_FOUND: &str = "PairFound";

/// Annotation on the HAPair (owned by the operator) that remembers, per request
/// annotation, the last request id acted on: `{"failover":"<id>",…}`.
pub const HANDLED_ANNOTATION: &str = "havip.io/handled";

/// One member Node as the operator sees it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NodeInfo {
    /// `Node.status.addresses` as (type, address), in order.
    pub addresses: Vec<(String, String)>,
}

/// The pair's Lease (the fencing record).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LeaseInfo {
    /// The active member (None or empty: nobody).
    pub holder: Option<String>,
    /// The epoch.
    pub transitions: i64,
    /// When the last role change was recorded.
    pub renew_time: Option<Timestamp>,
}

/// The pair's key Secret, as far as the operator needs it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct KeyInfo {
    /// The id of the key in use.
    pub key_id: i64,
    /// The previous key's id while a rotation runs.
    pub previous_key_id: Option<i64>,
    /// The request id of the running rotation.
    pub rotation_id: Option<String>,
    /// When the running rotation started.
    pub rotation_started: Option<Timestamp>,
    /// The member nodes the key was issued for (None: not recorded).
    pub members: Option<BTreeSet<String>>,
}

/// One FloatingIP of the pair.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct VipInfo {
    /// Its name (the VIP id).
    pub name: String,
    /// Its spec (None: the object cannot be read).
    pub spec: Option<FloatingIPSpec>,
    /// The holder's report.
    pub state: Option<VipState>,
}

/// Everything the operator knows about one pair at one instant.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The pair's name.
    pub name: String,
    /// Its spec.
    pub spec: HAPairSpec,
    /// Its status as read (agents' entries and the operator's last write).
    pub status: HAPairStatus,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// Each spec member's Node (None: no such Node).
    pub nodes: BTreeMap<String, Option<NodeInfo>>,
    /// The pair's Lease (None: not created yet).
    pub lease: Option<LeaseInfo>,
    /// The key Secret (None: unknown — not created yet, or named by keySecretRef).
    pub key: Option<KeyInfo>,
    /// The FloatingIPs naming the pair that the operator accepted, sorted by name (the
    /// refused ones are in `refused`: no agent configures them, they count nowhere).
    pub vips: Vec<VipInfo>,
    /// The FloatingIPs naming the pair that the operator refused, sorted by name.
    pub refused: Vec<(VipInfo, Refusal)>,
    /// Problems with the spec that the schema did not catch.
    pub spec_problems: Vec<String>,
    /// The current time.
    pub now: Timestamp,
}

mod addresses;
mod assess;
mod events;
mod fip;
mod keys;
mod plan;
mod requests;
mod spec;
mod status;

pub use addresses::*;
pub use assess::*;
pub use events::*;
pub use fip::*;
pub use keys::*;
pub use plan::*;
pub use requests::*;
pub use spec::*;
pub use status::*;

#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod tests;
