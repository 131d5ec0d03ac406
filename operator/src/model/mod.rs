//! The operator's decisions as pure functions of what it observed: member addresses
//! and the configuration revision, phase and conditions, the pair's last transition,
//! imperative requests (annotation → refusal or command), command answers and key
//! rotation. No I/O and no clock reads: `now` is an input. The controller
//! ([`crate::pair::hapair`]) gathers the inputs from its caches and applies the outputs.
//!
//! Here: the observation ([`Observed`] and its parts) and the constants; the decisions
//! are in `spec`, `assess`, `status`, `requests`, `keys`, `fip` and `events` (their
//! items are re-exported here), and [`plan()`] composes them into every write of one
//! HAPair reconcile.

use havip_crds::hapair::MemberStatus;
use havip_crds::{FloatingIPSpec, HAPairSpec, HAPairStatus, VipState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
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

/// A member's own status entry.
pub fn member_status<'a>(status: &'a HAPairStatus, node: &str) -> Option<&'a MemberStatus> {
    status.members.iter().find(|m| m.node == node)
}

/// How long ago `t` was, at `now` (zero when `t` is later).
pub(super) fn age(now: Timestamp, t: &Time) -> Duration {
    let ms = now.as_millisecond().saturating_sub(t.0.as_millisecond());
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

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

pub use addresses::{AddressIndex, ApiServerSource, Reserved};
pub use assess::{Assessment, Cause, assess, is_reporting, next_settle, standby_problem};
pub use events::{
    Announcement, Ev, ROLE_CHANGE_GRACE, command_event, invalid_spec_event, is_warning_transition, member_lost_event,
    member_role_events, operation_event, phase_event, role_change_announcement,
};
pub use fip::{FipVerdict, Verdict, fip_conditions, fip_conditions_current, fip_verdict, orphan_verdict};
pub use keys::{KeyAction, key_action, key_progress, random_key_hex};
pub use plan::{
    KeyChange, LabelPatch, LabelTarget, LeaseSeed, MEMBER_REMOVAL, PairInputs, PairMemo, Plan, SharedSecret,
    fip_refusals, fip_status_current, key_after, new_key, plan, spec_member_set,
};
pub use requests::{Decision, command_answer, command_deadline, decide, next_request};
pub use spec::{
    Refusal, is_dns1123_subdomain, lease_name, member_addresses, member_label_patch, member_labels, member_nodes,
    member_patch, pair_of_lease, published_addresses, refusal, revision, secret_name, validate_spec,
};
pub use status::{
    condition, conditions, departed_members, last_transition, next_staleness, operator_status, without_timestamps,
};

#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod tests;
