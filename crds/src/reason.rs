//! Every CamelCase reason havip writes, in one place: the reasons of conditions, of
//! Events and of transitions, whoever writes them (the operator, the agents). Grouped by
//! what they explain:
//!
//! 1. **Role changes**: `lastTransition.reason` and the agents' and operator's role-change
//!    Events (the typed form is [`crate::TransitionReason`], which spells these).
//! 2. **Pair conditions** (`Ready`, `Degraded`, `Suspended`, `ConfigApplied`,
//!    `InvalidSpec` of an HAPair).
//! 3. **The operator's Events on pairs** besides phase, role and operation Events (those
//!    take the phase's, the transition's and the operation kind's names).
//! 4. **FloatingIP conditions** (`Accepted`, `PairFound`, `Ready`, `Conflict`) and their
//!    Events.
//! 5. **VIPPool** `Ready` and its Events.
//! 6. **Service** Events (Services of type LoadBalancer).
//!
//! A reason used by several groups is defined once, in the first group that uses it.
//! The README's Conditions and Events sections document them.

// 1. Role changes.

/// Initial assignment to the highest-priority member.
pub const ELECTED: &str = "Elected";
/// A standby took the VIPs of a lost active.
pub const PEER_LOST: &str = "PeerLost";
/// Planned failover completed.
pub const PLANNED_FAILOVER: &str = "PlannedFailover";
/// Forced failover completed.
pub const FORCED_FAILOVER: &str = "ForcedFailover";
/// The active handed over because of carrier loss.
pub const CARRIER_LOST: &str = "CarrierLost";
/// The active handed over because it lost its gateway.
pub const GATEWAY_LOST: &str = "GatewayLost";
/// The active handed over because a VIP or listener stayed unhealthy (also the pair's
/// `Degraded` reason, and a FloatingIP's `Ready` reason, while a VIP is unhealthy).
pub const VIP_UNHEALTHY: &str = "VipUnhealthy";
/// Automatic failback to the preferred member.
pub const FAILBACK: &str = "Failback";
/// A member entered maintenance.
pub const MAINTENANCE: &str = "Maintenance";
/// Two actives met; the older epoch gave up.
pub const DUAL_ACTIVE_RESOLVED: &str = "DualActiveResolved";
/// A member found itself cut off and gave up the VIPs.
pub const FENCED: &str = "Fenced";
/// The old holder of a planned move keeps the VIPs for its established connections.
pub const DRAIN_STARTED: &str = "DrainStarted";
/// A drain ended (its time was over, or the VIPs were taken back).
pub const DRAIN_ENDED: &str = "DrainEnded";
/// An agent's answer to a command it executed (an agent Event, Normal or Warning).
pub const OPERATION_RESULT: &str = "OperationResult";

// 2. Pair conditions.

/// Everything is as it should be (the False side of `Degraded`, `Suspended`,
/// `InvalidSpec`; the True side of `ConfigApplied`, a FloatingIP's `Accepted`, a
/// VIPPool's `Ready`).
pub const AS_EXPECTED: &str = "AsExpected";
/// Flap suspension.
pub const SUSPENDED: &str = "Suspended";
/// Members run different protocol major versions.
pub const VERSION_MISMATCH: &str = "VersionMismatch";
/// Members run different agent versions.
pub const VERSION_SKEW: &str = "VersionSkew";
/// A heartbeat with a key the member does not know arrived.
pub const KEY_MISMATCH: &str = "KeyMismatch";
/// A member is not reporting.
pub const MEMBER_NOT_REPORTING: &str = "MemberNotReporting";
/// A member node is missing (also its Warning Event).
pub const MEMBER_LOST: &str = "MemberLost";
/// A member has not applied the current configuration.
pub const CONFIG_PENDING: &str = "ConfigPending";
/// A foreign MAC answers for a VIP.
pub const VIP_CONFLICT: &str = "VipConflict";
/// The spec cannot be acted on (also its Warning Event, on any havip object).
pub const INVALID_SPEC: &str = "InvalidSpec";
/// No member is a ready standby (`Ready` False while the VIPs are served).
pub const NO_READY_STANDBY: &str = "NoReadyStandby";
/// A member has no address on a heartbeat path (its peers cannot reach it there).
pub const ADDRESS_MISSING: &str = "AddressMissing";
/// A member raises an alarm the other reasons do not cover.
pub const MEMBER_ALARM: &str = "MemberAlarm";
/// Routed VIPs: a member's BGP speaker cannot be asked, has no established session, or
/// (on the holder) does not advertise a held VIP.
pub const BGP_NOT_ADVERTISED: &str = "BgpNotAdvertised";

// 3. The operator's Events on pairs.

/// The operator created the pair's Lease.
pub const LEASE_CREATED: &str = "LeaseCreated";
/// The operator created the pair's key Secret.
pub const KEY_SECRET_CREATED: &str = "KeySecretCreated";
/// The operator took over the Lease and key Secret an earlier pair of the same name
/// left.
pub const EARLIER_PAIR_ADOPTED: &str = "EarlierPairAdopted";
/// A member left the pair: the key is rotated so that it can no longer join.
pub const KEY_ROTATION_STARTED: &str = "KeyRotationStarted";
/// Every member signs with the new key; the previous one is no longer accepted.
pub const KEY_ROTATED: &str = "KeyRotated";
/// A member's reported role changed.
pub const MEMBER_ROLE_CHANGED: &str = "MemberRoleChanged";
/// Routed VIPs: the member whose speaker advertises a VIP changed (as the members'
/// speakers report it).
pub const ROUTE_MOVED: &str = "RouteMoved";
/// Routed VIPs: no member's speaker advertises a VIP any more.
pub const ROUTE_WITHDRAWN: &str = "RouteWithdrawn";
/// A reconcile failed (on any object the operator reconciles).
pub const RECONCILE_ERROR: &str = "ReconcileError";

// 4. FloatingIP conditions.

/// The operator accepted the FloatingIP again after a refusal (an Event).
pub const ACCEPTED: &str = "Accepted";
/// A FloatingIP's address is already used by an older FloatingIP (also a VIPPool's
/// Warning Event when FloatingIPs written by hand hold addresses of the pool).
pub const ADDRESS_IN_USE: &str = "AddressInUse";
/// A FloatingIP's address is an address of a Node (a member of its pair or not).
pub const NODE_ADDRESS: &str = "NodeAddress";
/// A FloatingIP's address is an address of the API server (the ClusterIP of the
/// Service `default/kubernetes`, or an address of its EndpointSlice).
pub const API_SERVER_ADDRESS: &str = "ApiServerAddress";
/// The FloatingIP's (or VIPPool's) pair does not exist.
pub const PAIR_NOT_FOUND: &str = "PairNotFound";
/// The FloatingIP's pair exists.
pub const PAIR_FOUND: &str = "PairFound";
/// Held by the pair's active, announced, its self-check passing (also the Service
/// Event when a node first announces its address).
pub const ANNOUNCED: &str = "Announced";
/// Nobody holds the VIP.
pub const NOT_HELD: &str = "NotHeld";
/// The member named as holder is not the pair's active (a move in progress, or a stale
/// holder).
pub const HOLDER_NOT_ACTIVE: &str = "HolderNotActive";
/// The holder has not reported for a while: it may still hold the VIP (an agent cut off
/// from the API server keeps serving), or be gone.
pub const HOLDER_NOT_REPORTING: &str = "HolderNotReporting";
/// No foreign host answers for the address.
pub const NO_CONFLICT: &str = "NoConflict";

// 5. VIPPools.

/// The pool hands out addresses (its Normal Event when `Ready` turns True).
pub const READY: &str = "Ready";
/// The pool's entries overlap each other, or an older pool.
pub const OVERLAP: &str = "Overlap";
/// A VIPPool holds addresses it never hands out: the API server's or Nodes' own.
pub const RESERVED_ADDRESS: &str = "ReservedAddress";

// 6. Services.

/// An address was allocated (or joined) for the Service.
pub const ADDRESS_ALLOCATED: &str = "AddressAllocated";
/// The Service gets no address; the note says why.
pub const ALLOCATION_FAILED: &str = "AllocationFailed";
/// An address was released.
pub const ADDRESS_RELEASED: &str = "AddressReleased";
/// The address moved to another node (a failover).
pub const HOLDER_CHANGED: &str = "HolderChanged";
/// An annotation of the Service cannot be read.
pub const INVALID_ANNOTATION: &str = "InvalidAnnotation";
/// An address of the Service can no longer be served (it became the API server's or a
/// Node's, or the operator refused its FloatingIP): released; the note says why.
pub const ADDRESS_REFUSED: &str = "AddressRefused";

/// Every reason above, for the checks that keep them documented and distinct.
pub const ALL: &[&str] = &[
    OPERATION_RESULT,
    ELECTED,
    PEER_LOST,
    PLANNED_FAILOVER,
    FORCED_FAILOVER,
    CARRIER_LOST,
    GATEWAY_LOST,
    VIP_UNHEALTHY,
    FAILBACK,
    MAINTENANCE,
    DUAL_ACTIVE_RESOLVED,
    FENCED,
    DRAIN_STARTED,
    DRAIN_ENDED,
    AS_EXPECTED,
    SUSPENDED,
    VERSION_MISMATCH,
    VERSION_SKEW,
    KEY_MISMATCH,
    MEMBER_NOT_REPORTING,
    MEMBER_LOST,
    CONFIG_PENDING,
    VIP_CONFLICT,
    INVALID_SPEC,
    NO_READY_STANDBY,
    ADDRESS_MISSING,
    MEMBER_ALARM,
    BGP_NOT_ADVERTISED,
    LEASE_CREATED,
    KEY_SECRET_CREATED,
    EARLIER_PAIR_ADOPTED,
    KEY_ROTATION_STARTED,
    KEY_ROTATED,
    MEMBER_ROLE_CHANGED,
    ROUTE_MOVED,
    ROUTE_WITHDRAWN,
    RECONCILE_ERROR,
    ACCEPTED,
    ADDRESS_IN_USE,
    NODE_ADDRESS,
    API_SERVER_ADDRESS,
    PAIR_NOT_FOUND,
    PAIR_FOUND,
    ANNOUNCED,
    NOT_HELD,
    HOLDER_NOT_ACTIVE,
    HOLDER_NOT_REPORTING,
    NO_CONFLICT,
    READY,
    OVERLAP,
    RESERVED_ADDRESS,
    ADDRESS_ALLOCATED,
    ALLOCATION_FAILED,
    ADDRESS_RELEASED,
    HOLDER_CHANGED,
    INVALID_ANNOTATION,
    ADDRESS_REFUSED,
];

#[cfg(test)]
mod tests {
    use super::ALL;
    use std::collections::BTreeSet;

    #[test]
    fn every_reason_is_one_camel_case_word_defined_once() {
        let distinct: BTreeSet<&str> = ALL.iter().copied().collect();
        assert_eq!(distinct.len(), ALL.len(), "a reason is defined twice");
        for r in ALL {
            assert!(r.starts_with(|c: char| c.is_ascii_uppercase()), "{r}");
            assert!(r.chars().all(|c| c.is_ascii_alphanumeric()), "{r}");
        }
    }

    #[test]
    fn the_readme_documents_every_reason() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README");
        let missing: Vec<&str> = ALL.iter().copied().filter(|r| !readme.contains(&format!("`{r}`"))).collect();
        assert!(missing.is_empty(), "reasons the README does not name: {missing:?}");
    }
}
