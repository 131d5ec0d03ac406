//! The typed vocabulary of the agent–operator contract: the values of
//! `status.command.kind`, `lastOperation.{kind,result}`, `members[].{role,gateway,alarms}`
//! and `lastTransition.reason`, as Rust enums that serialize to the same CamelCase
//! strings as before.
//!
//! Version skew is the reason for their shape: an operator and its agents are upgraded
//! one after the other, so either side may read a value that only a newer peer knows.
//! Such a value deserializes to the `Other` variant, kept as written (and written back
//! unchanged), instead of failing the whole object. For the same reason the CRD schema
//! declares these fields plain `type: string` without an `enum` list: a list would make
//! the API server refuse a newer agent's report (or every status write of an object that
//! still holds an older agent's value) while the CRD and the binaries disagree.
//!
//! Nothing here decides anything; the meaning of each value is in its doc comment.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;

/// Defines a string enum of the contract: known variants with their wire names (and,
/// after `|`, older names that read as the same variant), plus `Other(String)`.
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal $(| $alias:literal)* ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this version does not know (written by a newer peer), kept as written.
            Other(String),
        }

        impl $name {
            /// Every known value, in declaration order.
            pub const KNOWN: &'static [$name] = &[$($name::$variant),+];

            /// The wire name.
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $text, )+
                    $name::Other(s) => s,
                }
            }

            /// The value for a wire name (older names included); never fails.
            pub fn parse(s: &str) -> $name {
                match s {
                    $( $text $(| $alias)* => $name::$variant, )+
                    other => $name::Other(other.to_owned()),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let s = Cow::<'de, str>::deserialize(d)?;
                Ok($name::parse(&s))
            }
        }

        impl JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }
            // A plain string, no `enum` list: see the module documentation.
            fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
                String::json_schema(g)
            }
        }
    };
}

string_enum! {
    /// What an imperative operation does (`status.command.kind`, `lastOperation.kind`).
    pub enum OperationKind {
        /// Readiness-checked make-before-break handover, executed by the active member.
        PlannedFailover = "PlannedFailover",
        /// Handover without the readiness checks, executed by the active member.
        ForcedFailover = "ForcedFailover",
        /// Clear a flap suspension, executed by every member.
        ClearSuspension = "ClearSuspension",
        /// Resume automatic failback, executed by every member.
        ResumeFailback = "ResumeFailback",
        /// Rotate the heartbeat key (the operator's own operation, never a command).
        RotateKey = "RotateKey",
    }
}

impl OperationKind {
    /// A failover: the active member alone executes and answers it.
    pub fn is_failover(&self) -> bool {
        matches!(self, OperationKind::PlannedFailover | OperationKind::ForcedFailover)
    }
}

string_enum! {
    /// The answer to an operation (`lastOperation.result`).
    pub enum OperationResult {
        /// Done.
        Succeeded = "Succeeded",
        /// A precondition did not hold; nothing was done.
        Refused = "Refused",
        /// Tried and failed, or nobody answered in time.
        Failed = "Failed",
        /// Started; the final answer follows (key rotations).
        InProgress = "InProgress",
    }
}

impl OperationResult {
    /// Succeeded for `true`, Failed for `false`.
    pub fn from_ok(ok: bool) -> OperationResult {
        if ok { OperationResult::Succeeded } else { OperationResult::Failed }
    }
}

string_enum! {
    /// A member's role as its agent reports it (`members[].role`).
    pub enum MemberRole {
        /// Starting up: listening for its peers.
        Init = "Init",
        /// Holds the VIPs (or claims them).
        Active = "Active",
        /// Ready to take the VIPs.
        Standby = "Standby",
        /// Handing the VIPs to a peer, still holding them until confirmed.
        Demoting = "Demoting",
        /// Out of the election.
        Maintenance = "Maintenance",
        /// Cut off (carrier, gateway): takes no VIPs.
        Fenced = "Fenced",
        /// The node is not in the pair's member list.
        Unpaired = "Unpaired",
    }
}

string_enum! {
    /// A member's gateway check (`members[].gateway`).
    pub enum GatewayState {
        /// A fence target answers.
        Reachable = "Reachable",
        /// No fence target answers any more.
        Unreachable = "Unreachable",
        /// No fence target ever answered: the check is off.
        Unknown = "Unknown",
    }
}

string_enum! {
    /// An alarm a member raises (`members[].alarms`).
    pub enum MemberAlarm {
        /// Flap suspension: discretionary moves are suspended.
        Suspended = "Suspended",
        /// A peer speaks another heartbeat protocol major version.
        VersionMismatch = "VersionMismatch",
        /// Heartbeats signed with an unknown key arrive.
        KeyMismatch = "KeyMismatch",
        /// Heartbeats rejected for clock skew arrive.
        ClockSkew = "ClockSkew",
        /// A held VIP is missing or its listener is down, and nobody can take it.
        VipUnhealthy = "VipUnhealthy",
        /// A foreign MAC answers for a held VIP.
        VipConflict = "VipConflict",
        /// The member's configuration is invalid.
        Misconfigured = "Misconfigured",
        /// Maintenance requested, but nobody can take the VIPs.
        MaintenancePending = "MaintenancePending",
        /// Every heartbeat of a peer has been refused as a replay for a heartbeat
        /// timeout: the peer restarted and cannot prove its new session (it cannot hear
        /// this member).
        HeartbeatReplay = "HeartbeatReplay",
        /// The Lease's holder is silent on every heartbeat path but keeps renewing the
        /// Lease: the members are partitioned from each other; this member does not take
        /// the VIPs from it.
        PeerPartition = "PeerPartition",
        /// The pair epoch reached the top of its domain (2147483647): this member takes no
        /// VIPs over and hands none over any more.
        EpochExhausted = "EpochExhausted",
        /// A peer is silent on every heartbeat path while this member's links and gateway
        /// are fine: the peer is down, or the members are partitioned from each other.
        PeerSilent = "PeerSilent",
        /// Standalone mode only: takeovers need the witness's vote and the witness does not
        /// answer; no member takes the VIPs over until it does.
        WitnessUnreachable = "WitnessUnreachable",
        /// This member holds the VIPs under an epoch more than an agent may raise the pair
        /// Lease by in one write (1000) above the Lease's: the Lease does not record it
        /// until somebody brings it within reach by hand.
        LeaseBehind = "LeaseBehind",
    }
}

string_enum! {
    /// What a node check (`kubectl havip doctor`, `havip-agent doctor`) found wrong in a
    /// member's environment (`members[].findings[].check`); [`DoctorCheck::fix`] says what
    /// to do about it.
    pub enum DoctorCheck {
        /// The agent lacks a capability it needs (`CAP_NET_ADMIN`: addresses, routes,
        /// nftables; `CAP_NET_RAW`: ARP/NA and their listeners).
        MissingCapability = "MissingCapability",
        /// Strict reverse-path filtering (`rp_filter=1`) on an interface that heartbeats
        /// arrive on, while the route back to that peer leaves by another interface: the
        /// kernel drops them.
        RpFilterDropsHeartbeats = "RpFilterDropsHeartbeats",
        /// `arp_ignore` on a VIP's interface keeps the kernel from answering ARP for the
        /// VIP (8: never; 2: only to senders in the VIP's own subnet, none for a `/32`).
        ArpIgnoreHidesVip = "ArpIgnoreHidesVip",
        /// A VIP is the first IPv4 address of its interface (the interface has none of its
        /// own before it): kubelet, CNIs and the kernel take it for the node's address.
        VipIsFirstAddress = "VipIsFirstAddress",
        /// A peer is heard on some heartbeat paths but not on this one (its port blocked, a
        /// route or a filter in between): a path less to tell a dead peer from a cut one.
        HeartbeatPathSilent = "HeartbeatPathSilent",
        /// A VIP is a Node's address in the Kubernetes API (`status.addresses`): kubelet or
        /// a cloud provider reported it, and whatever routes to that Node follows the VIP.
        VipIsNodeAddress = "VipIsNodeAddress",
        /// A peer's clock is seconds away from this node's (the timestamps of its
        /// heartbeats): NTP is not keeping them together. Lease times, Events and logs
        /// disagree across the nodes, and heartbeats more than 60 s off are refused.
        ClockSkewed = "ClockSkewed",
        /// A heartbeat path's interface has an IPv4 MTU below the largest heartbeat on
        /// the wire: larger heartbeats leave in fragments, which firewalls and some
        /// networks drop.
        HeartbeatMtuTooSmall = "HeartbeatMtuTooSmall",
    }
}

impl DoctorCheck {
    /// What to do about it.
    pub fn fix(&self) -> &'static str {
        match self {
            DoctorCheck::MissingCapability => {
                "run the agent with CAP_NET_ADMIN and CAP_NET_RAW (the chart's DaemonSet and the static pod ask for both; \
                 a PodSecurity or runtime policy may have dropped them)"
            }
            DoctorCheck::RpFilterDropsHeartbeats => {
                "set loose reverse-path filtering on that interface and on all (sysctl net.ipv4.conf.all.rp_filter=2 and \
                 net.ipv4.conf.IFACE.rp_filter=2; the kernel uses the larger of the two), or route the peer's address \
                 back through the interface its heartbeats arrive on"
            }
            DoctorCheck::ArpIgnoreHidesVip => {
                "set net.ipv4.conf.IFACE.arp_ignore and net.ipv4.conf.all.arp_ignore to 0 or 1 (the kernel uses the \
                 larger of the two)"
            }
            DoctorCheck::VipIsFirstAddress => {
                "give the interface its own IPv4 address before any VIP (re-adding the node's address puts it after the \
                 VIPs: add it back, then move the VIPs once with kubectl havip failover); pin kubelet's --node-ip and \
                 the CNI's interface address (README: VIPs are not the node's address)"
            }
            DoctorCheck::HeartbeatPathSilent => {
                "let UDP to the heartbeat port through on that path in both directions (firewall, security group, \
                 nftables), and check that each member's address on the path routes there"
            }
            DoctorCheck::VipIsNodeAddress => {
                "start kubelet with --node-ip set to the node's own address (kubeadm: nodeRegistration.kubeletExtraArgs), \
                 then restart kubelet; a cloud provider's node addresses must not include the VIP"
            }
            DoctorCheck::ClockSkewed => {
                "synchronise both nodes' clocks with NTP (chrony, systemd-timesyncd) from the same servers, and check \
                 that the service runs (chronyc tracking, timedatectl)"
            }
            DoctorCheck::HeartbeatMtuTooSmall => {
                "raise the interface's MTU to at least 576 bytes (ip link set dev IFACE mtu 1500, or the network's MTU), \
                 or use another heartbeat path"
            }
            DoctorCheck::Other(_) => {
                "see the agent's documentation for this check (an agent newer than this tool wrote it)"
            }
        }
    }
}

string_enum! {
    /// Why a role changed (`lastTransition.reason` of the pair and of each member).
    ///
    /// The names after `|` are those agents wrote before they reported these reasons
    /// (their state machine's names); an operator reading an older agent's entry during
    /// an upgrade still sees the reason it means.
    pub enum TransitionReason {
        /// The Init listen is over: joined as standby.
        Startup = "Startup",
        /// After an agent restart: took back the VIPs still on the interface.
        Adopted = "Adopted",
        /// Initial assignment: nobody was active and this member was the best candidate.
        Elected = "Elected" | "Election",
        /// Took over a lost active (an unplanned failover).
        PeerLost = "PeerLost" | "Takeover",
        /// A takeover claim was dropped because its conditions no longer held.
        ClaimAbandoned = "ClaimAbandoned",
        /// A planned failover: the active handed over, or this member took the VIPs from it.
        PlannedFailover = "PlannedFailover" | "HandoverAccepted",
        /// A forced failover.
        ForcedFailover = "ForcedFailover",
        /// Took the VIPs from a peer's automatic handover or failback.
        AutoHandoverAccepted = "AutoHandoverAccepted",
        /// The active handed over because a local link lost carrier.
        CarrierLost = "CarrierLost",
        /// The active handed over because its gateway became unreachable.
        GatewayLost = "GatewayLost",
        /// The active handed over because a VIP or a listener stayed unhealthy.
        VipUnhealthy = "VipUnhealthy" | "ListenerDown",
        /// Automatic failback to the preferred member.
        Failback = "Failback",
        /// Maintenance applied.
        Maintenance = "Maintenance" | "MaintenanceOn",
        /// Maintenance lifted.
        MaintenanceOff = "MaintenanceOff",
        /// Cut off (carrier, gateway): gave the VIPs up.
        Fenced = "Fenced",
        /// No longer cut off.
        Unfenced = "Unfenced",
        /// Two holders met (or a claim lost the Lease): the older epoch gave up.
        DualActiveResolved = "DualActiveResolved" | "NewerEpochPeer" | "NewerEpochLease" | "LeaseConflict" | "UnverifiedPeer",
        /// A planned handover was not confirmed in time: the old active kept the VIPs.
        Aborted = "Aborted",
        /// The active aborted a handover this member had accepted: it gave the VIPs back.
        AbortedByPeer = "AbortedByPeer",
        /// The node left the pair's member list.
        Unpaired = "Unpaired",
        /// The node joined the pair's member list.
        Paired = "Paired",
        /// The operator's reason for a role change whose cause the new active has not
        /// reported (yet).
        RoleChange = "RoleChange",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{
        Deserialize, GatewayState, MemberAlarm, MemberRole, OperationKind, OperationResult, Serialize,
        TransitionReason, fmt,
    };

    #[test]
    fn every_known_value_round_trips_through_its_wire_name() {
        fn check<T: Serialize + for<'de> Deserialize<'de> + PartialEq + fmt::Debug + Clone>(
            known: &[T],
            name: impl Fn(&T) -> String,
        ) {
            for v in known {
                let json = serde_json::to_value(v).unwrap();
                assert_eq!(json, serde_json::Value::String(name(v)), "{v:?}");
                assert_eq!(&serde_json::from_value::<T>(json).unwrap(), v);
            }
        }
        check(OperationKind::KNOWN, |v| v.as_str().to_owned());
        check(OperationResult::KNOWN, |v| v.as_str().to_owned());
        check(MemberRole::KNOWN, |v| v.as_str().to_owned());
        check(GatewayState::KNOWN, |v| v.as_str().to_owned());
        check(MemberAlarm::KNOWN, |v| v.as_str().to_owned());
        check(TransitionReason::KNOWN, |v| v.as_str().to_owned());
    }

    #[test]
    fn a_value_from_a_newer_peer_is_kept_as_written() {
        let role: MemberRole = serde_json::from_str("\"Observer\"").unwrap();
        assert_eq!(role, MemberRole::Other("Observer".to_owned()));
        assert_eq!(serde_json::to_string(&role).unwrap(), "\"Observer\"");
        let alarms: Vec<MemberAlarm> = serde_json::from_str(r#"["ClockSkew","DiskFull"]"#).unwrap();
        assert_eq!(alarms, vec![MemberAlarm::ClockSkew, MemberAlarm::Other("DiskFull".to_owned())]);
    }

    #[test]
    fn reasons_older_agents_wrote_read_as_the_documented_reasons() {
        let read = |s: &str| serde_json::from_value::<TransitionReason>(serde_json::json!(s)).unwrap();
        assert_eq!(read("Takeover"), TransitionReason::PeerLost);
        assert_eq!(read("Election"), TransitionReason::Elected);
        assert_eq!(read("HandoverAccepted"), TransitionReason::PlannedFailover);
        assert_eq!(read("NewerEpochLease"), TransitionReason::DualActiveResolved);
        assert_eq!(read("NewerEpochPeer"), TransitionReason::DualActiveResolved);
        assert_eq!(read("LeaseConflict"), TransitionReason::DualActiveResolved);
        assert_eq!(read("MaintenanceOn"), TransitionReason::Maintenance);
        assert_eq!(read("ListenerDown"), TransitionReason::VipUnhealthy);
        assert_eq!(read("SomethingNew"), TransitionReason::Other("SomethingNew".to_owned()));
        // Written back under the documented name.
        assert_eq!(read("Takeover").as_str(), crate::reason::PEER_LOST);
    }

    #[test]
    fn transition_reasons_spell_the_documented_reason_constants() {
        use crate::reason;
        for (v, s) in [
            (TransitionReason::Elected, reason::ELECTED),
            (TransitionReason::PeerLost, reason::PEER_LOST),
            (TransitionReason::PlannedFailover, reason::PLANNED_FAILOVER),
            (TransitionReason::ForcedFailover, reason::FORCED_FAILOVER),
            (TransitionReason::CarrierLost, reason::CARRIER_LOST),
            (TransitionReason::GatewayLost, reason::GATEWAY_LOST),
            (TransitionReason::VipUnhealthy, reason::VIP_UNHEALTHY),
            (TransitionReason::Failback, reason::FAILBACK),
            (TransitionReason::Maintenance, reason::MAINTENANCE),
            (TransitionReason::DualActiveResolved, reason::DUAL_ACTIVE_RESOLVED),
            (TransitionReason::Fenced, reason::FENCED),
        ] {
            assert_eq!(v.as_str(), s);
        }
    }

    #[test]
    fn the_schema_is_a_plain_string() {
        let schema = schemars::schema_for!(MemberRole);
        assert_eq!(schema.get("type").and_then(|t| t.as_str()), Some("string"));
        assert!(schema.get("enum").is_none(), "an enum list would refuse a newer peer's values");
    }
}
