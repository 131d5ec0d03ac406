//! The cluster API of havip and the contract between its binaries: the `HAPair`,
//! `FloatingIP` and `VIPPool` custom resources ([`hapair`], [`floatingip`], [`vippool`])
//! with their defaults and CRD generation, the typed agent–operator contract
//! ([`contract`]), condition types and every condition and Event reason ([`reason`]),
//! the request-annotation grammar the operator and the kubectl plugin share
//! ([`request`]), field managers, annotations and member labels ([`membership`]),
//! durations and the configuration revision, and the Kubernetes client of the
//! long-running binaries ([`client`], with TCP keepalive). The wire protocols (heartbeat and witness)
//! live in the kube-free crate `havip-wire` and are re-exported here as [`wire`] and
//! [`witness`].

#![deny(missing_docs)]

pub mod client;
pub mod contract;
pub mod duration;
pub mod floatingip;
pub mod hapair;
pub mod membership;
pub mod reason;
pub mod request;
pub mod revision;
pub mod routes;
pub mod vippool;

/// The heartbeat wire format (crate `havip-wire`, which has no Kubernetes dependency).
pub use havip_wire as wire;
/// The witness protocol (in `havip-wire`).
pub use havip_wire::witness;

pub use contract::{
    DoctorCheck, GatewayState, MemberAlarm, MemberRole, OperationKind, OperationResult, TransitionReason,
};
pub use floatingip::{
    AnnounceMode, AnnounceSpec, FloatingIP, FloatingIPSpec, FloatingIPStatus, HealthCheck, ProbeSpec, VipState,
};
pub use hapair::{
    FailbackMode, FailbackSpec, Finding, FlapSuspensionSpec, HAPair, HAPairSpec, HAPairStatus, HeartbeatPath,
    HeartbeatSpec, KeyRotation, Member, MemberAddresses, MemberStatus, NodeAddressType, Operation, PairCommand, Phase,
    QuarantineSpec, SecretRef, TakeoverSpec, Transition, VirtualMacError, VirtualMacSpec,
};
pub use routes::{HolderRoute, HolderRouteSpec, HolderRule, HolderRuleSpec, Prefix, RouteSpecError};
pub use vippool::{Block, Family, SharingScope, VIPPool, VIPPoolSpec, VIPPoolStatus};

use kube::CustomResourceExt;

/// The API group of every havip resource.
pub const GROUP: &str = "havip.io";
/// The API version of every havip resource.
pub const VERSION: &str = "v1alpha1";

/// Defaults of every tunable, in one place. The CRD schema, the standalone config file
/// and the state machine all take them from here.
pub mod defaults {
    /// UDP port of the heartbeat.
    pub const HEARTBEAT_PORT: i32 = 7946;
    /// Heartbeat interval per path.
    pub const HEARTBEAT_INTERVAL: &str = "100ms";
    /// A peer is silent after this long without a heartbeat on any path.
    pub const HEARTBEAT_TIMEOUT: &str = "300ms";
    /// Failed data-plane probes needed for a takeover.
    pub const PROBE_FAILURES: i32 = 2;
    /// Minimum span of those failures.
    pub const PROBE_SPAN: &str = "100ms";
    /// Interval between data-plane probes.
    pub const PROBE_INTERVAL: &str = "50ms";
    /// Connect timeout of a data-plane probe.
    pub const PROBE_TIMEOUT: &str = "100ms";
    /// No automatic takeover this long after taking or giving up the VIPs.
    pub const HOLD_DOWN: &str = "3s";
    /// A member that never heard its peer waits this long before serving alone.
    pub const BOOT_HOLD: &str = "60s";
    /// Link dampening: a member whose carrier returned takes no VIPs over until its links
    /// had carrier this long and is no handover target until then (a wait that doubles
    /// while the link keeps flapping); a holder without an eligible successor rides out a
    /// carrier loss this short. 2 s: longer than a link renegotiation bounce (typically
    /// 1–3 s of flapping settles within it), short next to the 3 s hold-down, so a repaired
    /// link is back in the election at once.
    pub const CARRIER_STABLE_FOR: &str = "2s";
    /// A planned move's old holder keeps the VIPs this long for the connections
    /// established on it (the new holder forwards their segments): long enough for
    /// handshakes that straddle the move and typical request/response exchanges to
    /// finish; long-lived connections need a longer value. `0s` turns draining off.
    pub const DRAIN_TIMEOUT: &str = "5s";
    /// Failback: the preferred member must be ready this long.
    pub const RECOVERY_WINDOW: &str = "15m";
    /// Failback: the VIPs stay on the failed-over member at least this long.
    pub const MINIMUM_TIME_ON_STANDBY: &str = "10m";
    /// Failback: traffic must be quiet this long.
    pub const QUIET_WINDOW: &str = "30s";
    /// Failback: traffic above this rate is active (32 KiB/s).
    pub const QUIET_THRESHOLD_BYTES_PER_SECOND: i64 = 32 * 1024;
    /// Quarantine after this many failovers …
    pub const QUARANTINE_FAILOVERS: i32 = 3;
    /// … within this window …
    pub const QUARANTINE_WITHIN: &str = "24h";
    /// … for this long.
    pub const QUARANTINE_HOLD: &str = "6h";
    /// Flap suspension after this many automatic moves …
    pub const FLAP_MOVES: i32 = 3;
    /// … within this window; …
    pub const FLAP_WITHIN: &str = "10m";
    /// it clears after this long without a move.
    pub const FLAP_QUIET_CLEAR: &str = "10m";
    /// Announcements at once on taking a VIP.
    pub const ANNOUNCE_BURST: i32 = 3;
    /// Announcement repeats after the burst.
    pub const ANNOUNCE_REPEATS: i32 = 3;
    /// Spacing of the repeats (more than the 1 s Linux ARP locktime).
    pub const ANNOUNCE_REPEAT_INTERVAL: &str = "1100ms";
    /// Periodic refresh while holding (a third of the usual 300 s switch MAC ageing).
    pub const ANNOUNCE_REFRESH_INTERVAL: &str = "90s";

    /// The `Fast` timing profile ([`crate::hapair::TimingProfile::Fast`]): the fastest
    /// takeover that still rests on the same evidence (silence on every path for three
    /// heartbeats, two failed probes spanning more than one probe interval). It replaces
    /// the defaults above of the fields that are left at them.
    pub mod fast {
        /// Heartbeat interval per path.
        pub const HEARTBEAT_INTERVAL: &str = "30ms";
        /// A peer is silent after this long without a heartbeat on any path.
        pub const HEARTBEAT_TIMEOUT: &str = "90ms";
        /// Minimum span of the failed probes.
        pub const PROBE_SPAN: &str = "20ms";
        /// Interval between data-plane probes (while a heartbeat is overdue).
        pub const PROBE_INTERVAL: &str = "15ms";
        /// Connect timeout of a data-plane probe (a LAN round trip is well under 1 ms; a
        /// loaded listener's kernel still answers a SYN from its backlog).
        pub const PROBE_TIMEOUT: &str = "30ms";
    }
}

/// Condition types used in `status.conditions`.
pub mod condition {
    /// The pair serves its VIPs with a ready standby / the VIP is held and healthy.
    pub const READY: &str = "Ready";
    /// Something needs attention; the message says what.
    pub const DEGRADED: &str = "Degraded";
    /// Discretionary moves are suspended after flapping.
    pub const SUSPENDED: &str = "Suspended";
    /// Every member applied the current configRevision.
    pub const CONFIG_APPLIED: &str = "ConfigApplied";
    /// The spec cannot be acted on (for objects that slipped past validation).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A foreign host answers for a VIP.
    pub const CONFLICT: &str = "Conflict";
    /// The operator accepted the FloatingIP: it is handed to the pair's agents (False:
    /// refused, the message says why, and no agent configures it).
    pub const ACCEPTED: &str = "Accepted";
    /// The FloatingIP's pair exists (the operator's own condition of a FloatingIP).
    pub const PAIR_FOUND: &str = "PairFound";
}

pub mod reporting {
    //! The `reportingController` of the Events each binary publishes (the README's Events
    //! tables name them; a test keeps the two in step).
    /// The operator's Events.
    pub const OPERATOR: &str = "havip-operator";
    /// The agents' Events (`reportingInstance`: the node).
    pub const AGENT: &str = "havip-agent";

    #[cfg(test)]
    mod tests {
        #[test]
        fn the_readme_names_the_reporting_controllers_the_binaries_use() {
            let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README");
            for (who, c) in [("Operator", super::OPERATOR), ("Agent", super::AGENT)] {
                let phrase = format!("{who} Events (reporting controller `{c}`");
                assert!(readme.contains(&phrase), "README: {phrase:?}");
            }
        }
    }
}

/// Server-side-apply field managers: one per writer, never two owners of a field.
pub mod manager {
    /// The operator's field manager.
    pub const OPERATOR: &str = "havip-operator";
    /// The field manager of the agent on `node`.
    pub fn agent(node: &str) -> String {
        format!("havip-agent-{node}")
    }
    /// The kubectl plugin's field manager (annotations only).
    pub const PLUGIN: &str = "kubectl-havip";
    /// The operator's field manager for the `Accepted` condition of FloatingIPs. A manager
    /// of its own: the FloatingIP controller applies `PairFound` as [`OPERATOR`], and a
    /// server-side apply removes what its manager owned but left out.
    pub const OPERATOR_ADMISSION: &str = "havip-operator-admission";
    /// The operator's field manager for the member labels
    /// ([`crate::membership`]) it keeps on pairs, FloatingIPs, Leases and Secrets.
    pub const OPERATOR_LABELS: &str = "havip-operator-labels";
    /// The operator's field manager for the FloatingIPs it allocates to Services.
    pub const OPERATOR_LOAD_BALANCER: &str = "havip-operator-loadbalancer";
}

/// Names of the per-pair Leases.
///
/// Pair Leases live in the operator's namespace next to the operator's leader-election
/// Lease (`havip-operator` by default). Their names carry a prefix that no other Lease
/// of havip's uses, so no pair name can make the agents write another Lease, and the
/// chart's admission policy lets an agent update only Leases with this prefix.
pub mod lease {
    /// The prefix of every pair Lease's name (`hapair-<pair>`). The chart's
    /// ValidatingAdmissionPolicy spells it too (a test keeps the two in agreement).
    ///
    /// It does not start with `havip-`, so no new name can be the name an earlier release
    /// gave another pair's Lease (`havip-<pair>`: with a prefix `havip-pair-`, the old
    /// Lease of a pair named `pair-x` would have been the new Lease of pair `x`).
    pub const PAIR_PREFIX: &str = "hapair-";

    /// The name of pair `pair`'s Lease: `hapair-<pair>`. Pair names longer than 63
    /// characters are refused by the operator, so the name stays far below the 253
    /// characters a Lease name may have (and is a DNS subdomain like the pair's name).
    pub fn pair_lease_name(pair: &str) -> String {
        format!("{PAIR_PREFIX}{pair}")
    }

    /// The pair a Lease belongs to, if its name is a pair Lease's.
    pub fn pair_of_lease(lease: &str) -> Option<&str> {
        lease.strip_prefix(PAIR_PREFIX).filter(|p| !p.is_empty())
    }

    /// Whether `name` is (or would be taken for) a pair Lease's name. The operator
    /// refuses a leader-election Lease with such a name.
    pub fn is_pair_lease(name: &str) -> bool {
        name.starts_with(PAIR_PREFIX)
    }

    /// The name releases before the prefix gave a pair's Lease (`havip-<pair>`). The
    /// operator seeds a new pair Lease from the Lease of that name when the pair owns it,
    /// so that no epoch goes backwards on an upgrade.
    pub fn legacy_pair_lease_name(pair: &str) -> String {
        format!("havip-{pair}")
    }

    #[cfg(test)]
    mod tests {
        use super::{PAIR_PREFIX, is_pair_lease, legacy_pair_lease_name, pair_lease_name, pair_of_lease};

        #[test]
        fn pair_leases_never_share_a_name_with_the_leader_lease() {
            assert_eq!(pair_lease_name("web"), "hapair-web");
            assert_eq!(pair_of_lease("hapair-web"), Some("web"));
            // The pair named `operator` no longer lands on the leader-election Lease.
            assert_ne!(pair_lease_name("operator"), "havip-operator");
            assert_eq!(pair_of_lease("havip-operator"), None);
            assert_eq!(pair_of_lease("hapair-"), None);
            assert!(!is_pair_lease("havip-operator"));
            assert!(is_pair_lease(&pair_lease_name("operator")));
            // No new name is an old name (of whatever pair), so no Lease left by an
            // earlier release is ever taken for a pair Lease or writable by the agents.
            for pair in ["web", "pair-x", "x", "operator"] {
                assert!(!legacy_pair_lease_name(pair).starts_with(PAIR_PREFIX));
                assert!(!is_pair_lease(&legacy_pair_lease_name(pair)));
            }
            // The longest pair name the operator accepts still gives a valid Lease name.
            assert!(pair_lease_name(&"a".repeat(63)).len() <= 253);
        }
    }
}

/// Every CRD, as YAML documents separated by `---`, exactly as `crdgen` writes them.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::from("# Generated by `cargo run -p havip-crds --bin crdgen`; do not edit by hand.\n");
    for crd in [HAPair::crd(), FloatingIP::crd(), VIPPool::crd()] {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}

/// Where `crdgen` writes the CRDs, relative to the repository root: the `crds/` directory
/// of the chart's `crds` subchart, so that the chart's `crds.install` value (the
/// subchart's condition) can leave them out. Helm installs a chart's `crds/` only on the
/// first install and never upgrades or deletes them, with or without the subchart.
pub const CRDS_PATH: &str = "charts/havip/charts/crds/crds/havip.io_crds.yaml";
