//! What the operator observed of one pair ([`Observed`] and its parts), the constants the
//! decisions share, and two small readers of the pair's status: a leaf every decision
//! room reads, which uses none of them.

use super::addresses::ApiServerSource;
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

/// Why the operator refuses a FloatingIP: it gets `Accepted=False` and an Event, and no
/// agent ever configures it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// An older FloatingIP (by creation time, then name) has the same address.
    AddressInUse {
        /// The FloatingIP that keeps the address.
        holder: String,
        /// That FloatingIP's pair.
        pair: String,
    },
    /// The address is one of a Node's own addresses (a member of the pair or any other
    /// Node): adding it as a VIP would take the node's address over, and giving it up
    /// would remove it from the holder.
    NodeAddress {
        /// The node.
        node: String,
        /// Which of its addresses (`InternalIP`, `ExternalIP`, …).
        kind: String,
        /// Whether the node is a member of the FloatingIP's pair.
        member: bool,
    },
    /// The address is one of the API server's: the holder would answer for the API
    /// server, and take the cluster's control plane away from the nodes it reaches.
    ApiServerAddress {
        /// Where the operator learnt that address.
        source: ApiServerSource,
    },
}
