//! The `HAPair` resource: a group of 2..8 nodes that hold a set of VIPs together.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::contract::{GatewayState, MemberAlarm, MemberRole, OperationKind, OperationResult, TransitionReason};

/// Desired state of an HA pair: its members, heartbeat, takeover rules and policies.
///
/// The VIPs of the pair are the `FloatingIP` objects whose `spec.pair` names it; the
/// whole member moves, never a single VIP.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "havip.io",
    version = "v1alpha1",
    kind = "HAPair",
    doc = "A group of 2 to 8 nodes that hold a set of virtual IPs (the FloatingIPs naming it) together: one member is active, the others stand by and take over within well under a second when it is lost.",
    plural = "hapairs",
    singular = "hapair",
    shortname = "hap",
    category = "havip",
    status = "HAPairStatus",
    printcolumn = r#"{"name":"Active","type":"string","jsonPath":".status.active","description":"The member that holds the VIPs"}"#,
    printcolumn = r#"{"name":"Standby","type":"string","jsonPath":".status.standby","description":"The members ready to take over"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"Pending, Live, FailedOver, Degraded, Suspended or Failed"}"#,
    printcolumn = r#"{"name":"Epoch","type":"integer","jsonPath":".status.epoch","description":"Fencing epoch: increments on every role change"}"#,
    printcolumn = r#"{"name":"VIPs","type":"integer","jsonPath":".status.vips","description":"Number of FloatingIPs of this pair"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("size(self.metadata.name) <= 63").message("a pair name must be at most 63 characters (it names the pair's Lease and Secret)")
)]
#[serde(rename_all = "camelCase")]
pub struct HAPairSpec {
    /// The nodes of the pair, 2 to 8, each with a distinct priority. When nobody is
    /// active, the highest priority member that is ready becomes active.
    #[x_kube(
        validation = Rule::new("size(self) >= 2").message("a pair needs at least 2 members (spec.members)"),
        validation = Rule::new("self.all(m, self.exists_one(n, n.node == m.node))").message("each node may appear only once in spec.members"),
        validation = Rule::new("self.all(m, self.exists_one(n, n.priority == m.priority))").message("member priorities must be distinct (two members have the same priority)"),
        validation = Rule::new("self.filter(m, m.maintenance).size() <= 1").message("only one member can be in maintenance at a time")
    )]
    #[schemars(length(max = 8))]
    pub members: Vec<Member>,

    /// Peer heartbeat between the members' agents.
    #[serde(default)]
    pub heartbeat: HeartbeatSpec,

    /// When a standby takes the VIPs of a lost active.
    #[serde(default)]
    pub takeover: TakeoverSpec,

    /// Whether and when the VIPs return to the preferred (highest priority) member
    /// after a failover.
    #[serde(default)]
    pub failback: FailbackSpec,

    /// Suspends discretionary moves after too many automatic role changes.
    #[serde(default)]
    pub flap_suspension: FlapSuspensionSpec,

    /// No automatic policy moves (failback, handovers for unhealthy VIPs) while true.
    /// Agents still take over a provably dead peer.
    #[serde(default)]
    pub paused: bool,

    /// How the pair's FloatingIPs are made known unless a FloatingIP (or its VIPPool)
    /// says otherwise: `L2` (default; gratuitous ARP / unsolicited NA), `BGP` (a host
    /// address of the dummy interface `havip0`, advertised by the node's own BGP
    /// speaker; docs/bgp.md) or `Both` (the two at once).
    #[serde(default, skip_serializing_if = "crate::AnnounceMode::is_default")]
    pub announce_mode: crate::AnnounceMode,

    /// Routed VIPs (`BGP` mode): every member that is a ready standby (not holding, not
    /// fenced, not in maintenance) also hands its node's speaker a **backup path** of each
    /// routed VIP — a route in the kernel table the agent's `--bgp-backup-table` names
    /// (default 104), which the speaker imports and advertises with the worse preference
    /// its configuration gives it (AS-path prepend, MED, LOCAL_PREF) — so that routers
    /// already know the next path. Traffic that follows a backup path to a member that
    /// does not hold the VIP is dropped there, never routed back. Default false. See
    /// docs/bgp.md, "Backup paths".
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bgp_backup_paths: bool,

    /// Timing profile: `Standard` (heartbeat 100 ms, timeout 300 ms; a cut active is
    /// replaced in about 300 ms) or `Fast` (heartbeat 30 ms, timeout 90 ms, probes every
    /// 15 ms with a 30 ms timeout over at least 20 ms; about 120 ms, for roughly three
    /// times the idle CPU and a higher risk of an unneeded move on a node stalled for
    /// 90 ms). The profile sets the heartbeat and probe timings that are left at their
    /// defaults; a field set to another value keeps it. See the README, "Timings and defaults".
    /// (Left out of the configuration revision while `Standard`, so members that predate
    /// it agree on the revision.)
    #[serde(default, skip_serializing_if = "TimingProfile::is_standard")]
    pub profile: TimingProfile,

    /// After a planned move (failover, maintenance, failback) the old holder keeps the
    /// VIPs this long, without answering ARP/ND for them, for the connections established
    /// on it: the new holder forwards their segments to it, so they keep working; new
    /// connections are the new holder's at once. When it ends, connections still open
    /// lose their path (the new holder resets them at their next segment). `0s` turns
    /// draining off; unplanned failovers never drain. TCP only; needs conntrack on the
    /// new holder with `net.netfilter.nf_conntrack_tcp_loose=1` (the default).
    /// (Left out of the configuration revision while it is the default.)
    #[serde(default = "default_drain_timeout", skip_serializing_if = "is_default_drain_timeout")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32), extend("default" = crate::defaults::DRAIN_TIMEOUT))]
    pub drain_timeout: String,

    /// A virtual MAC address that moves with the VIPs, for networks that ignore
    /// gratuitous ARP (static ARP entries, ARP suppression, firewalls that learn from
    /// replies only). The holder carries each layer-2 VIP (`L2`, `Both`) on a macvlan
    /// interface of the VIP's link whose MAC is the pair's virtual MAC, answers ARP/ND
    /// with it and announces from it, so switches relearn its port from the first frame
    /// and clients keep the entry they have; standbys keep that interface down. Unset
    /// (the default): the VIPs are addresses of their link and answered with its MAC.
    /// See docs/virtual-mac.md for the limits (switch port security, NICs that filter
    /// unknown MACs, `arp_ignore` on the link).
    #[serde(default, rename = "virtualMAC", skip_serializing_if = "Option::is_none")]
    pub virtual_mac: Option<VirtualMacSpec>,

    /// Routes that follow the holder: the member that holds the VIPs adds each (protocol
    /// 0x68) after its VIPs and removes it before it gives them up (a demotion, a planned
    /// move, the pair leaving the node, an uninstall); the others have none. For edge or
    /// NAT nodes whose default route, or whose routes sourced from a VIP, must be where
    /// the VIPs are. Checked again every 10 s while held (an interface going down takes
    /// its routes with it). An agent restart keeps them, as it keeps the VIPs. See
    /// docs/routes.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub routes: Vec<crate::routes::HolderRouteSpec>,

    /// Policy rules that follow the holder, like `routes` (e.g. `from: <VIP>/32, table:
    /// 100`: what the node sends from a VIP is routed by table 100). Added after the
    /// routes, removed before them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub rules: Vec<crate::routes::HolderRuleSpec>,
}

/// The pair's virtual MAC (see [`HAPairSpec::virtual_mac`]).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMacSpec {
    /// 1 to 255, like a VRRP router id: IPv4 VIPs answer with `00:00:5e:00:01:<id>`,
    /// IPv6 VIPs with `00:00:5e:00:02:<id>` (RFC 5798's virtual router MACs). Unique
    /// among the pairs that share a node and a link: an agent refuses a pair whose
    /// virtual MAC interface another pair already uses.
    #[schemars(range(min = 1, max = 255))]
    pub id: i32,

    /// A locally administered unicast MAC (`02:…`, lower-case hex, colon-separated)
    /// used for both families instead of the VRRP ones, where `00:00:5e:00:0x:…` is
    /// taken by routers running VRRP on the same segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(r"self.matches('^[0-9a-f][26ae](:[0-9a-f]{2}){5}$')").message("virtualMAC.address must be a locally administered unicast MAC such as 02:00:00:00:00:01 (lower-case hex; the first octet's second digit 2, 6, a or e)"))]
    #[schemars(length(max = 17))]
    pub address: Option<String>,
}

/// Why a [`VirtualMacSpec`] gives no MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VirtualMacError {
    /// The id is out of 1..=255.
    #[error("virtualMAC.id {0} is not between 1 and 255")]
    Id(i32),
    /// The address is not a locally administered unicast MAC.
    #[error("virtualMAC.address {0:?} is not a locally administered unicast MAC such as 02:00:00:00:00:01")]
    Address(String),
}

impl VirtualMacSpec {
    /// The MAC the VIPs of one family answer with (`v6`: IPv6).
    pub fn mac(&self, v6: bool) -> Result<[u8; 6], VirtualMacError> {
        let id = u8::try_from(self.id).ok().filter(|i| *i != 0).ok_or(VirtualMacError::Id(self.id))?;
        match &self.address {
            None => Ok([0x00, 0x00, 0x5e, 0x00, if v6 { 0x02 } else { 0x01 }, id]),
            Some(a) => parse_local_mac(a).ok_or_else(|| VirtualMacError::Address(a.clone())),
        }
    }
}

/// `02:00:00:00:00:01` → its octets, if it is a locally administered unicast MAC.
fn parse_local_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for o in &mut out {
        let p = parts.next()?;
        if p.len() != 2 || p.chars().any(|c| c.is_ascii_uppercase()) {
            return None;
        }
        *o = u8::from_str_radix(p, 16).ok()?;
    }
    // Bit 1 of the first octet: locally administered; bit 0: multicast.
    (parts.next().is_none() && out[0] & 0b11 == 0b10).then_some(out)
}

fn default_drain_timeout() -> String {
    crate::defaults::DRAIN_TIMEOUT.to_owned()
}

fn is_default_drain_timeout(s: &str) -> bool {
    s == crate::defaults::DRAIN_TIMEOUT
}

/// A set of heartbeat and probe timings (see [`HAPairSpec::profile`]).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimingProfile {
    /// The defaults: heartbeat 100 ms, timeout 300 ms, probes every 50 ms (100 ms timeout,
    /// 100 ms span).
    #[default]
    Standard,
    /// Heartbeat 30 ms, timeout 90 ms, probes every 15 ms (30 ms timeout, 20 ms span).
    Fast,
}

impl TimingProfile {
    /// Whether this is the default profile.
    pub fn is_standard(&self) -> bool {
        *self == TimingProfile::Standard
    }

    /// Sets the profile's values in the heartbeat interval and timeout and the takeover
    /// probe timings that are at their (`Standard`) defaults; other values stay.
    pub fn apply(self, heartbeat_interval: &mut String, heartbeat_timeout: &mut String, takeover: &mut TakeoverSpec) {
        use crate::defaults::{self as d, fast as f};
        if self != TimingProfile::Fast {
            return;
        }
        for (field, standard, fast) in [
            (heartbeat_interval, d::HEARTBEAT_INTERVAL, f::HEARTBEAT_INTERVAL),
            (heartbeat_timeout, d::HEARTBEAT_TIMEOUT, f::HEARTBEAT_TIMEOUT),
            (&mut takeover.probe_span, d::PROBE_SPAN, f::PROBE_SPAN),
            (&mut takeover.probe_interval, d::PROBE_INTERVAL, f::PROBE_INTERVAL),
            (&mut takeover.probe_timeout, d::PROBE_TIMEOUT, f::PROBE_TIMEOUT),
        ] {
            if field == standard {
                fast.clone_into(field);
            }
        }
    }
}

/// One node of a pair.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// Name of the Node object of this member: a DNS-1123 subdomain, as Node names are.
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("spec.members[].node must be a Node name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit (a DNS-1123 subdomain)"))]
    #[schemars(length(max = 253))]
    pub node: String,

    /// Election priority, 1 (lowest) to 254 (highest); distinct within the pair.
    #[schemars(range(min = 1, max = 254))]
    pub priority: i32,

    /// Takes the member out of the election. An active member first hands the VIPs to
    /// a ready peer; a standby stops being a takeover candidate. Persisted by the agent.
    #[serde(default)]
    pub maintenance: bool,
}

/// Peer heartbeat settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!self.interval.matches('^([0-9]+(\\\\.[0-9]+)?(ms|s|m|h))+$') || !self.timeout.matches('^([0-9]+(\\\\.[0-9]+)?(ms|s|m|h))+$') || duration(self.timeout) >= duration(self.interval) + duration(self.interval)").message("heartbeat.timeout must be at least twice heartbeat.interval, so that one lost heartbeat does not look like a dead peer")
)]
pub struct HeartbeatSpec {
    /// UDP port the agents exchange heartbeats on (on every path).
    #[serde(default = "default_heartbeat_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,

    /// Time between two heartbeats on each path (a duration such as `100ms`).
    #[serde(default = "default_heartbeat_interval")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub interval: String,

    /// A peer is lost when no heartbeat arrived on any path for this long.
    #[serde(default = "default_heartbeat_timeout")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub timeout: String,

    /// The heartbeat paths, each a node address type (as in `Node.status.addresses`) or
    /// an interface name. Use at least two independent paths (data + management): a
    /// takeover needs silence on every path.
    #[serde(default = "default_paths")]
    #[x_kube(
        validation = Rule::new("size(self) >= 1").message("heartbeat.paths needs at least one path"),
        validation = Rule::new("self.all(p, self.exists_one(q, q.name == p.name))").message("heartbeat path names must be distinct")
    )]
    #[schemars(length(max = 4))]
    pub paths: Vec<HeartbeatPath>,

    /// A Secret holding the heartbeat HMAC key (`key`, and `previousKey` during a
    /// rotation). When absent the operator creates and rotates one per pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_secret_ref: Option<SecretRef>,
}

/// One heartbeat path.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.addressType) != has(self.interface)").message("a heartbeat path names exactly one of addressType or interface")
)]
pub struct HeartbeatPath {
    /// A short name for the path (used in status and metrics), e.g. `data`, `mgmt`.
    #[schemars(length(min = 1, max = 32), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,

    /// Use this node address type of every member (`InternalIP` or `ExternalIP`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_type: Option<NodeAddressType>,

    /// Use the first address of this interface on every member (the agents report it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15), regex(pattern = r"^[^\s/:]+$"))]
    pub interface: Option<String>,
}

/// A node address type usable as a heartbeat path.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAddressType {
    /// The node's `InternalIP`.
    InternalIP,
    /// The node's `ExternalIP`.
    ExternalIP,
}

/// A reference to a Secret.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the Secret: only the operator's own namespace (the default) works —
    /// the agents read Secrets there only — and another one is refused with the
    /// InvalidSpec condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// When a standby takes over the VIPs of a lost active. All of these must hold: no
/// heartbeat on any path; the active's data plane probed down; own links up and the
/// gateway not unreachable; no hold-down; no boot hold.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TakeoverSpec {
    /// Consecutive failed TCP probes of the active's VIP listeners needed.
    #[serde(default = "default_probe_failures")]
    #[schemars(range(min = 1, max = 10))]
    pub probe_failures: i32,

    /// The failed probes must span at least this long.
    #[serde(default = "default_probe_span")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub probe_span: String,

    /// Time between two probes.
    #[serde(default = "default_probe_interval")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub probe_interval: String,

    /// A TCP connect that has not completed within this time is a failure.
    #[serde(default = "default_probe_timeout")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub probe_timeout: String,

    /// No automatic takeover this long after the member last took or gave up the VIPs.
    #[serde(default = "default_hold_down")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub hold_down: String,

    /// A member that never heard its peer waits this long after start before it serves alone.
    #[serde(default = "default_boot_hold")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub boot_hold: String,

    /// Link dampening: a member whose link carrier returned takes no VIPs over until its
    /// links had carrier this long, and is no handover target for this long either — a
    /// wait that doubles each time the link drops again before it ends (up to 32 times), so
    /// a flapping link stops attracting the VIPs. An active whose link fails with nobody
    /// eligible keeps the VIPs this long before it gives them up, so a short flap moves
    /// nothing. `0s` turns dampening off.
    /// (Left out of the configuration revision while it is the default, so members that
    /// predate it agree on the revision.)
    #[serde(default = "default_carrier_stable_for", skip_serializing_if = "is_default_carrier_stable_for")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32), extend("default" = crate::defaults::CARRIER_STABLE_FOR))]
    pub carrier_stable_for: String,

    /// Addresses probed to decide whether this member is cut off: by ARP (IPv4) or
    /// neighbour solicitation (IPv6, from the node's own address in the target's subnet,
    /// else its link-local address). Empty: the node's default gateways (IPv4 and IPv6).
    /// When none ever answers, the gateway check is off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("self.all(a, isIP(a))").message("takeover.fenceTargets must be IP addresses"))]
    #[schemars(length(max = 4))]
    pub fence_targets: Vec<String>,
}

/// Failback policy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FailbackSpec {
    /// `Manual` (default): the VIPs stay where they are after a failover (a healthy
    /// `FailedOver` phase) until a planned failover. `Automatic`: they return to the
    /// preferred member when every condition below holds.
    #[serde(default)]
    pub mode: FailbackMode,

    /// The preferred member must have been ready continuously for this long.
    #[serde(default = "default_recovery_window")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub recovery_window: String,

    /// The VIPs stay on the member they failed over to for at least this long.
    #[serde(default = "default_minimum_time_on_standby")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub minimum_time_on_standby: String,

    /// Traffic guard: fail back only after the VIPs carried less than
    /// `quietThresholdBytesPerSecond` for this long. Unknown traffic waits.
    #[serde(default = "default_quiet_window")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub quiet_window: String,

    /// Traffic above this rate (bytes per second over the pair's VIP interfaces) is "active".
    #[serde(default = "default_quiet_threshold")]
    #[schemars(range(min = 0))]
    pub quiet_threshold_bytes_per_second: i64,

    /// After too many failovers the preferred member is held in quarantine.
    #[serde(default)]
    pub quarantine: QuarantineSpec,
}

/// Failback mode.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FailbackMode {
    /// No automatic failback (preemption off).
    #[default]
    Manual,
    /// Automatic failback to the preferred member, with windows and quarantine.
    Automatic,
}

/// Quarantine: after `failovers` failovers within `within`, no automatic failback for `hold`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineSpec {
    /// Number of failovers that starts a quarantine.
    #[serde(default = "default_quarantine_failovers")]
    #[schemars(range(min = 1, max = 100))]
    pub failovers: i32,
    /// The window the failovers are counted in.
    #[serde(default = "default_quarantine_within")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub within: String,
    /// How long the quarantine lasts.
    #[serde(default = "default_quarantine_hold")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub hold: String,
}

/// Flap suspension: `moves` automatic role changes within `within` suspend discretionary
/// moves until `quietClear` passes without a move, or `kubectl havip clear`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FlapSuspensionSpec {
    /// Number of automatic role changes that suspends discretionary moves.
    #[serde(default = "default_flap_moves")]
    #[schemars(range(min = 1, max = 100))]
    pub moves: i32,
    /// The window the moves are counted in.
    #[serde(default = "default_flap_within")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub within: String,
    /// The suspension clears itself after this long without a move.
    #[serde(default = "default_flap_quiet_clear")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub quiet_clear: String,
}

/// Observed state of a pair. The operator owns every field but `members`; each agent
/// owns its own entry of `members` (server-side apply, one field manager per node).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HAPairStatus {
    /// Pending, Live, FailedOver, Degraded, Suspended or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The member that holds the VIPs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<String>,
    /// The members ready to take over, comma separated (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<String>,
    /// The fencing epoch: increments on every role change (= the Lease's leaseTransitions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    /// Number of FloatingIPs of this pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vips: Option<i32>,
    /// Standard conditions (Ready, Degraded, Suspended, ConfigApplied, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The last role change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition: Option<Transition>,
    /// The answer to the last imperative operation (failover, clear, rotate-key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<Operation>,
    /// Hash of the configuration the members must apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_revision: Option<String>,
    /// The generation of the spec the operator last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// A command for the agents, set by the operator from an annotation and cleared once
    /// answered: the active member executes failovers, every member the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<PairCommand>,
    /// The heartbeat key rotation in progress, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_rotation: Option<KeyRotation>,
    /// Each member's heartbeat address on each path, as the operator resolves them
    /// (from the Node's addresses for `addressType` paths, from the member's published
    /// `pathAddresses` for interface paths). Agents send their heartbeats there, so that
    /// no agent needs to watch other Nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["node".into()]))]
    pub member_addresses: Vec<MemberAddresses>,
    /// One entry per member, each written by that member's agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["node".into()]))]
    pub members: Vec<MemberStatus>,
}

/// One member's heartbeat addresses (written by the operator).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MemberAddresses {
    /// The member node.
    pub node: String,
    /// Its address on each heartbeat path it has one on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathAddress>,
}

impl HAPairStatus {
    /// The published heartbeat address of `node` on `path`, if any.
    pub fn member_address(&self, node: &str, path: &str) -> Option<&str> {
        self.member_addresses
            .iter()
            .find(|m| m.node == node)
            .and_then(|m| m.paths.iter().find(|p| p.path == path))
            .map(|p| p.address.as_str())
    }
}

/// A command the operator passes to the agents.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PairCommand {
    /// The request id (from the annotation).
    pub id: String,
    /// PlannedFailover, ForcedFailover, ClearSuspension or ResumeFailback.
    pub kind: OperationKind,
    /// For failovers: the member that should take the VIPs (empty: the best standby).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// When the operator issued it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued: Option<Time>,
}

/// A heartbeat key rotation: the new key is in use, the previous one still accepted
/// until every member applied the new one.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KeyRotation {
    /// The request id.
    pub id: String,
    /// The id of the new key.
    pub key_id: i64,
    /// When the rotation started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
}

/// Phase of a pair.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Members are being resolved or have not reported yet.
    Pending,
    /// The preferred member is active and a standby is ready.
    Live,
    /// A non-preferred member is active after a failover (healthy under Manual failback).
    FailedOver,
    /// Serving, but something needs attention (see the Degraded condition's message).
    Degraded,
    /// Discretionary moves are suspended after flapping.
    Suspended,
    /// Nobody holds the VIPs.
    Failed,
}

impl Phase {
    /// The name, as in the schema (and as Event reasons and conditions use it).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Live => "Live",
            Phase::FailedOver => "FailedOver",
            Phase::Degraded => "Degraded",
            Phase::Suspended => "Suspended",
            Phase::Failed => "Failed",
        }
    }
}

/// A role change.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Transition {
    /// The pair's `lastTransition`: the previous active member (empty if none); a
    /// member's: its previous role.
    #[serde(default)]
    pub from: String,
    /// The pair's `lastTransition`: the new active member (empty if none); a member's:
    /// its new role.
    #[serde(default)]
    pub to: String,
    /// Why, as a CamelCase reason (see the reasons in the havip-crds crate).
    pub reason: TransitionReason,
    /// Epoch after the change.
    pub epoch: i64,
    /// When it happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

/// The answer to an imperative operation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// The request id of the annotation that asked for it.
    pub id: String,
    /// PlannedFailover, ForcedFailover, ClearSuspension or RotateKey.
    pub kind: OperationKind,
    /// Succeeded, Refused, Failed or InProgress.
    pub result: OperationResult,
    /// A sentence for people.
    #[serde(default)]
    pub message: String,
    /// When the answer was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

/// What one member's agent reports.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// The node.
    pub node: String,
    /// Init, Active, Standby, Demoting, Maintenance, Fenced or Unpaired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<MemberRole>,
    /// The epoch this member last acted under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    /// Readiness per VIP (the member could serve it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ready: Vec<VipReadiness>,
    /// Heartbeat paths on which the peers are heard.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub heard: Vec<PathHeard>,
    /// This node's own address on each interface path (peers send heartbeats there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path_addresses: Vec<PathAddress>,
    /// Carrier of the data and VIP links.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carrier: Option<bool>,
    /// Reachable, Unreachable or Unknown (no fence target ever answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayState>,
    /// Why this member cannot apply the pair's current configuration revision (it keeps
    /// running the last one it applied, `appliedRevision`, and retries); absent when it
    /// applied it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_error: Option<String>,
    /// The configRevision this member applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_revision: Option<String>,
    /// The agent's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// The heartbeat protocol version (major.minor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// Largest observed clock difference to a peer, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_skew_ms: Option<i64>,
    /// Whether this member is in maintenance (as applied by the agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<bool>,
    /// Alarms raised by this member (Suspended, VersionMismatch, KeyMismatch, ClockSkew, VipUnhealthy, VipConflict, Misconfigured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alarms: Vec<MemberAlarm>,
    /// Last role change of this member and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition: Option<Transition>,
    /// The id of the heartbeat key this member signs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<i64>,
    /// This member's answer to the last command it executed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<Operation>,
    /// When the agent last wrote this entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Time>,
    /// This member handed the VIPs to that member in a planned move and still keeps them,
    /// silently, for the connections established on it (a drain; see `spec.drainTimeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining_to: Option<String>,
    /// This member holds the VIPs and forwards the connections of that draining member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding_to: Option<String>,
    /// Routed VIPs (`announce.mode: BGP`): what the node's BGP speaker says, asked over its
    /// control socket every 5 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<SpeakerStatus>,
    /// What the agent's checks of its node found wrong (`kubectl havip doctor` prints them
    /// with the fix), checked at the pair's start and every minute; empty when all is well.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
}

/// One thing wrong in a member's environment, found by the agent's node checks.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// Which check (its fix: [`crate::DoctorCheck::fix`]).
    pub check: crate::DoctorCheck,
    /// What it is about: an interface, a VIP, a peer and path.
    pub subject: String,
    /// What was seen.
    pub detail: String,
}

/// What a member's BGP speaker says (pairs with routed VIPs).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SpeakerStatus {
    /// FRR or BIRD; absent when no speaker was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speaker: Option<String>,
    /// Why the speaker could not be asked, or what it refused; absent when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its BGP sessions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<BgpSession>,
    /// The routed VIPs this member holds, each with the peers the speaker advertises it
    /// to (none: held but not advertised).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advertised: Vec<BgpAdvertisement>,
}

/// One BGP session of a member's speaker.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BgpSession {
    /// The peer (its address; a BIRD protocol without one: the protocol's name).
    pub peer: String,
    /// The state as the speaker names it (Established, Active, Connect, …).
    pub state: String,
    /// Whether it is established.
    pub established: bool,
}

/// A routed VIP a member holds, and the peers its speaker advertises it to.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BgpAdvertisement {
    /// The VIP (host route, e.g. `203.0.113.10/32`).
    pub address: String,
    /// The peers it is advertised to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<String>,
}

/// Readiness of one VIP on one member.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VipReadiness {
    /// The VIP address (CIDR).
    pub address: String,
    /// Whether this member could serve it now.
    pub ready: bool,
    /// Why not, when not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Whether the peers are heard on one path.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PathHeard {
    /// The path name.
    pub path: String,
    /// Whether every peer was heard on it within the heartbeat timeout.
    pub heard: bool,
}

/// This node's address on one heartbeat path.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PathAddress {
    /// The path name.
    pub path: String,
    /// The address.
    pub address: String,
}

/// CEL rule for duration strings; mirrors [`crate::duration::DURATION_PATTERN`].
const DURATION_RULE: &str = r"self.matches('^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$')";
const DURATION_MESSAGE: &str = "must be a duration such as 100ms, 3s, 15m or 1h30m";

fn default_heartbeat_port() -> i32 {
    crate::defaults::HEARTBEAT_PORT
}
fn default_heartbeat_interval() -> String {
    crate::defaults::HEARTBEAT_INTERVAL.to_owned()
}
fn default_heartbeat_timeout() -> String {
    crate::defaults::HEARTBEAT_TIMEOUT.to_owned()
}
fn default_paths() -> Vec<HeartbeatPath> {
    vec![HeartbeatPath {
        name: "internal".to_owned(),
        address_type: Some(NodeAddressType::InternalIP),
        interface: None,
    }]
}
fn default_probe_failures() -> i32 {
    crate::defaults::PROBE_FAILURES
}
fn default_probe_span() -> String {
    crate::defaults::PROBE_SPAN.to_owned()
}
fn default_probe_interval() -> String {
    crate::defaults::PROBE_INTERVAL.to_owned()
}
fn default_probe_timeout() -> String {
    crate::defaults::PROBE_TIMEOUT.to_owned()
}
fn default_hold_down() -> String {
    crate::defaults::HOLD_DOWN.to_owned()
}
fn default_boot_hold() -> String {
    crate::defaults::BOOT_HOLD.to_owned()
}
fn default_carrier_stable_for() -> String {
    crate::defaults::CARRIER_STABLE_FOR.to_owned()
}
fn is_default_carrier_stable_for(v: &str) -> bool {
    v == crate::defaults::CARRIER_STABLE_FOR
}
fn default_recovery_window() -> String {
    crate::defaults::RECOVERY_WINDOW.to_owned()
}
fn default_minimum_time_on_standby() -> String {
    crate::defaults::MINIMUM_TIME_ON_STANDBY.to_owned()
}
fn default_quiet_window() -> String {
    crate::defaults::QUIET_WINDOW.to_owned()
}
fn default_quiet_threshold() -> i64 {
    crate::defaults::QUIET_THRESHOLD_BYTES_PER_SECOND
}
fn default_quarantine_failovers() -> i32 {
    crate::defaults::QUARANTINE_FAILOVERS
}
fn default_quarantine_within() -> String {
    crate::defaults::QUARANTINE_WITHIN.to_owned()
}
fn default_quarantine_hold() -> String {
    crate::defaults::QUARANTINE_HOLD.to_owned()
}
fn default_flap_moves() -> i32 {
    crate::defaults::FLAP_MOVES
}
fn default_flap_within() -> String {
    crate::defaults::FLAP_WITHIN.to_owned()
}
fn default_flap_quiet_clear() -> String {
    crate::defaults::FLAP_QUIET_CLEAR.to_owned()
}

impl Default for HeartbeatSpec {
    fn default() -> Self {
        Self {
            port: default_heartbeat_port(),
            interval: default_heartbeat_interval(),
            timeout: default_heartbeat_timeout(),
            paths: default_paths(),
            key_secret_ref: None,
        }
    }
}

impl Default for TakeoverSpec {
    fn default() -> Self {
        Self {
            probe_failures: default_probe_failures(),
            probe_span: default_probe_span(),
            probe_interval: default_probe_interval(),
            probe_timeout: default_probe_timeout(),
            hold_down: default_hold_down(),
            boot_hold: default_boot_hold(),
            carrier_stable_for: default_carrier_stable_for(),
            fence_targets: Vec::new(),
        }
    }
}

impl Default for FailbackSpec {
    fn default() -> Self {
        Self {
            mode: FailbackMode::Manual,
            recovery_window: default_recovery_window(),
            minimum_time_on_standby: default_minimum_time_on_standby(),
            quiet_window: default_quiet_window(),
            quiet_threshold_bytes_per_second: default_quiet_threshold(),
            quarantine: QuarantineSpec::default(),
        }
    }
}

impl Default for QuarantineSpec {
    fn default() -> Self {
        Self {
            failovers: default_quarantine_failovers(),
            within: default_quarantine_within(),
            hold: default_quarantine_hold(),
        }
    }
}

impl Default for FlapSuspensionSpec {
    fn default() -> Self {
        Self { moves: default_flap_moves(), within: default_flap_within(), quiet_clear: default_flap_quiet_clear() }
    }
}

#[cfg(test)]
mod virtual_mac_tests {
    use super::{VirtualMacError, VirtualMacSpec};

    #[test]
    fn the_vrrp_macs_carry_the_id_and_the_family() {
        let v = VirtualMacSpec { id: 51, address: None };
        assert_eq!(v.mac(false), Ok([0, 0, 0x5e, 0, 1, 51]));
        assert_eq!(v.mac(true), Ok([0, 0, 0x5e, 0, 2, 51]));
        assert_eq!(VirtualMacSpec { id: 0, address: None }.mac(false), Err(VirtualMacError::Id(0)));
        assert_eq!(VirtualMacSpec { id: 256, address: None }.mac(false), Err(VirtualMacError::Id(256)));
    }

    #[test]
    fn an_address_must_be_locally_administered_unicast() {
        let with = |a: &str| VirtualMacSpec { id: 1, address: Some(a.to_owned()) }.mac(true);
        assert_eq!(with("02:00:00:00:00:07"), Ok([2, 0, 0, 0, 0, 7]));
        assert_eq!(with("0e:aa:bb:cc:dd:ee"), Ok([0x0e, 0xaa, 0xbb, 0xcc, 0xdd, 0xee]));
        for bad in [
            "00:00:5e:00:01:01",
            "03:00:00:00:00:01",
            "02:00:00:00:00",
            "02:00:00:00:00:01:02",
            "02:AA:00:00:00:01",
            "02-00-00-00-00-01",
            "zz:00:00:00:00:01",
        ] {
            assert!(matches!(with(bad), Err(VirtualMacError::Address(_))), "{bad}");
        }
    }
}
