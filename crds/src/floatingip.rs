//! The `FloatingIP` resource: one VIP held by the active member of a pair.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A virtual IP address held by the active member of an `HAPair`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "havip.io",
    version = "v1alpha1",
    kind = "FloatingIP",
    doc = "A virtual IP address held, added to an interface and announced, by the active member of an HAPair.",
    plural = "floatingips",
    singular = "floatingip",
    shortname = "fip",
    category = "havip",
    status = "FloatingIPStatus",
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.address","description":"The VIP"}"#,
    printcolumn = r#"{"name":"Pair","type":"string","jsonPath":".spec.pair","description":"The HAPair that holds it"}"#,
    printcolumn = r#"{"name":"Holder","type":"string","jsonPath":".status.holder","description":"The node that holds it now"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state","description":"Pending, Announced, Unhealthy or Conflict"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Held by the pair's active and announced"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct FloatingIPSpec {
    /// Name of the HAPair whose active member holds this VIP.
    #[x_kube(validation = Rule::new("size(self) > 0").message("spec.pair must name an HAPair (it is empty)"))]
    #[schemars(length(max = 63))]
    pub pair: String,

    /// The VIP with its prefix length, IPv4 or IPv6, e.g. `192.0.2.10/24` or
    /// `2001:db8::10/64`. The prefix decides the subnet (and the interface when
    /// `interface` is not set).
    #[x_kube(
        validation = Rule::new("self.matches('^[0-9a-fA-F.:]+/[0-9]+$')").message("spec.address must be an IP address with a prefix length, e.g. 192.0.2.10/24 or 2001:db8::10/64"),
        validation = Rule::new("!self.matches('^[0-9.]+/[0-9]+$') || int(self.substring(self.indexOf('/') + 1)) <= 32").message("spec.address: an IPv4 prefix length must be between 0 and 32"),
        validation = Rule::new("!self.matches('^[0-9a-fA-F:]*:[0-9a-fA-F:.]*/[0-9]+$') || int(self.substring(self.indexOf('/') + 1)) <= 128").message("spec.address: an IPv6 prefix length must be between 0 and 128"),
        validation = Rule::new("!self.matches('^[0-9a-fA-F.:]+/[0-9]+$') || isIP(self.substring(0, self.indexOf('/')))").message("spec.address: the part before the / is not a valid IPv4 or IPv6 address")
    )]
    #[schemars(length(max = 64))]
    pub address: String,

    /// The interface to add the VIP to. Default: the interface that holds the node's
    /// own address in the VIP's subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15), regex(pattern = r"^[^\s/:]+$"))]
    pub interface: Option<String>,

    /// TCP data-plane probes of this VIP.
    #[serde(default)]
    pub probe: ProbeSpec,

    /// Gratuitous ARP / unsolicited neighbour advertisement schedule.
    #[serde(default)]
    pub announce: AnnounceSpec,
}

/// TCP probes of the VIP's listeners: the standby probes the active through the VIP,
/// the active probes its own listeners. No ports: the data plane reads unknown and
/// takeover rests on heartbeat and gateway.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ProbeSpec {
    /// TCP ports served on the VIP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("self.all(p, p >= 1 && p <= 65535)").message("spec.probe.ports: a port must be between 1 and 65535"))]
    #[schemars(length(max = 16))]
    pub ports: Vec<i32>,

    /// HTTP health checks of each member's own node, answered with 200 when the node
    /// can serve the VIP — such as kube-proxy's `healthCheckNodePort` of a Service with
    /// `externalTrafficPolicy: Local`, which says whether the node runs a ready endpoint.
    /// They count as the member's own listeners: a member whose check fails is not
    /// ready (no takeover or handover target), and the active hands over when its check
    /// stays failed (reason `ListenerDown`). The operator sets them for Services; set
    /// by hand, they work the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub health_checks: Vec<HealthCheck>,
}

/// An HTTP health check of a member's own node: `GET http://<node address>:<port><path>`;
/// status 200 is healthy, anything else (or no answer within the probe timeout) is not.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// The TCP port, on the node's own address in the VIP's subnet.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// The request path.
    #[serde(default = "default_health_path")]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("spec.probe.healthChecks: a path must start with /"))]
    #[schemars(length(max = 256))]
    pub path: String,
}

/// The path of kube-proxy's Service health check.
pub const DEFAULT_HEALTH_PATH: &str = "/healthz";

fn default_health_path() -> String {
    DEFAULT_HEALTH_PATH.to_owned()
}

/// How the holder makes the VIP known (`mode`), and for layer 2 when it announces it
/// (GARP requests with sender = target IP for IPv4, unsolicited NA with the override
/// flag for IPv6).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AnnounceSpec {
    /// `L2`: the VIP is an address of its link, announced with gratuitous ARP /
    /// unsolicited NA — clients share a broadcast domain with the members. `BGP`: the
    /// VIP is a host address (/32, /128) of the agent's dummy interface `havip0` on the
    /// holder only, and the node's own BGP speaker (FRR, BIRD) advertises that
    /// interface's connected routes — clients anywhere behind the routers. `Both`: the
    /// two at once on the holder (the address of the link, announced, and the host
    /// address of `havip0`, advertised). Default: the HAPair's `spec.announceMode`
    /// (itself `L2` by default). The burst and repeat fields are for `L2` and `Both`.
    /// See docs/bgp.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<AnnounceMode>,

    /// Announcements sent at once on taking the VIP.
    #[serde(default = "default_burst")]
    #[schemars(range(min = 1, max = 10))]
    pub burst: i32,

    /// Further announcements after the burst, each `repeatInterval` apart.
    #[serde(default = "default_repeats")]
    #[schemars(range(min = 0, max = 10))]
    pub repeats: i32,

    /// Spacing of the repeats; more than 1s so that each one passes the Linux ARP locktime.
    #[serde(default = "default_repeat_interval")]
    #[x_kube(
        validation = Rule::new(r"self.matches('^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$')").message("must be a duration such as 1100ms or 2s"),
        validation = Rule::new(r"!self.matches('^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$') || duration(self) > duration('1s')").message("announce.repeatInterval must be more than 1s (the Linux ARP locktime)")
    )]
    #[schemars(length(max = 32))]
    pub repeat_interval: String,

    /// Periodic refresh while holding the VIP (switch MAC tables age out in 300s); `0s` disables it.
    #[serde(default = "default_refresh_interval")]
    #[x_kube(validation = Rule::new(r"self.matches('^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$')").message("must be a duration such as 90s"))]
    #[schemars(length(max = 32))]
    pub refresh_interval: String,

    /// Also announce to each neighbour the holder knows in the VIP's subnet (the entries
    /// of its neighbour table on the VIP's link: the router, hosts it talked to), unicast —
    /// an ARP reply or an unsolicited NA addressed to it — with every burst, repeat and
    /// refresh: for hosts and firewalls that drop broadcast gratuitous ARP but take a reply
    /// addressed to them. At most 256 neighbours. Default false. See docs/virtual-mac.md.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unicast_to_neighbours: bool,
}

fn default_burst() -> i32 {
    crate::defaults::ANNOUNCE_BURST
}
fn default_repeats() -> i32 {
    crate::defaults::ANNOUNCE_REPEATS
}
fn default_repeat_interval() -> String {
    crate::defaults::ANNOUNCE_REPEAT_INTERVAL.to_owned()
}
fn default_refresh_interval() -> String {
    crate::defaults::ANNOUNCE_REFRESH_INTERVAL.to_owned()
}

/// How the holder makes a VIP known to the network.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AnnounceMode {
    /// An address of the VIP's link, announced with gratuitous ARP / unsolicited NA.
    #[default]
    L2,
    /// A host address of the dummy interface `havip0`, advertised by the node's BGP
    /// speaker as a connected route.
    BGP,
    /// Both at once: an address of the VIP's link, announced at layer 2, and a host
    /// address of `havip0` that the node's BGP speaker advertises — for clients on the
    /// members' segment and clients behind routers alike.
    Both,
}

impl AnnounceMode {
    /// Whether this is the default (`L2`).
    pub fn is_default(&self) -> bool {
        *self == AnnounceMode::default()
    }

    /// The word of the spec (`L2`, `BGP`, `Both`).
    pub fn as_str(self) -> &'static str {
        match self {
            AnnounceMode::L2 => "L2",
            AnnounceMode::BGP => "BGP",
            AnnounceMode::Both => "Both",
        }
    }

    /// Whether the node's BGP speaker advertises the VIP (`BGP`, `Both`).
    pub fn advertises(self) -> bool {
        matches!(self, AnnounceMode::BGP | AnnounceMode::Both)
    }
}

impl Default for AnnounceSpec {
    fn default() -> Self {
        Self {
            mode: None,
            burst: default_burst(),
            repeats: default_repeats(),
            repeat_interval: default_repeat_interval(),
            refresh_interval: default_refresh_interval(),
            unicast_to_neighbours: false,
        }
    }
}

/// Observed state of a VIP, written by the agent of the member that holds it (and by
/// the operator when nobody does).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FloatingIPStatus {
    /// The node that holds the VIP (written by its agent; removed when it stops holding
    /// it, or by the operator once the holder reports that it holds nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Pending (nobody holds it), Announced (held and announced, the self-check passes),
    /// Unhealthy (held, but missing from the kernel or its listeners do not answer) or
    /// Conflict (a foreign host answers for the address too; see conflictMac).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<VipState>,
    /// MAC address of the holder's interface: what clients' neighbour entries should show
    /// for the address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_mac: Option<String>,
    /// The interface that carries the VIP on the holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// The epoch of the pair when the holder took the VIP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    /// When the holder last wrote these fields (on taking the VIP and on every change of
    /// its state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_announced: Option<Time>,
    /// The foreign MAC address last seen answering for the VIP (state Conflict only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict_mac: Option<String>,
    /// The spec generation the operator's conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions, written by the operator: Ready (True: held by the pair's active and
    /// announced; False with the reason NotHeld, HolderNotActive, VipUnhealthy,
    /// VipConflict, or why it was refused; Unknown, HolderNotReporting: the holder has not
    /// reported for a while and may still hold it), Accepted (handed to the pair's agents,
    /// or refused: AddressInUse, NodeAddress, ApiServerAddress), Conflict (True: a
    /// foreign host answers for the address), PairFound.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// State of a VIP.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VipState {
    /// Nobody holds it.
    Pending,
    /// Held and announced; the self-check passed.
    Announced,
    /// Held, but its listeners or the self-check fail.
    Unhealthy,
    /// A foreign host answers for the address.
    Conflict,
}

/// The address of a FloatingIP without its prefix length (`192.0.2.10/24` →
/// `192.0.2.10`), if it parses. Two spellings of one IPv6 address give the same value.
pub fn vip_address(address: &str) -> Option<std::net::IpAddr> {
    address.split('/').next()?.trim().parse().ok()
}

/// Which FloatingIPs lose their address to an older one: refused name → the name of
/// the FloatingIP that keeps the address.
///
/// Two FloatingIPs conflict when their addresses are equal, prefix lengths ignored (one
/// address cannot be held by two pairs, nor twice by one). The oldest by
/// `metadata.creationTimestamp`, then by name, keeps it; every other one is refused.
/// The operator refuses those (a condition and an Event, and it never hands them to an
/// agent), and an agent skips them with this same function over the FloatingIPs it
/// sees, so both always agree on the winner. A FloatingIP without a creation time (not
/// yet stored by the API server) counts as the newest. Unparsable addresses conflict
/// with nothing (the schema refuses them).
pub fn address_conflicts<'a>(
    fips: impl IntoIterator<Item = &'a FloatingIP>,
) -> std::collections::BTreeMap<String, String> {
    use kube::ResourceExt;
    let mut by_address: std::collections::BTreeMap<std::net::IpAddr, Vec<&FloatingIP>> = Default::default();
    for f in fips {
        if let Some(a) = vip_address(&f.spec.address) {
            by_address.entry(a).or_default().push(f);
        }
    }
    let mut out = std::collections::BTreeMap::new();
    for mut group in by_address.into_values().filter(|g| g.len() > 1) {
        group.sort_by_key(|f| {
            let created = f.metadata.creation_timestamp.as_ref().map(|t| t.0);
            (created.is_none(), created, f.name_any())
        });
        let winner = group[0].name_any();
        for f in &group[1..] {
            if f.name_any() != winner {
                out.insert(f.name_any(), winner.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::{FloatingIP, address_conflicts, vip_address};

    fn fip(name: &str, address: &str, created: Option<&str>) -> FloatingIP {
        let mut v = serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP",
            "metadata": {"name": name},
            "spec": {"pair": "p", "address": address},
        });
        if let Some(t) = created {
            v["metadata"]["creationTimestamp"] = serde_json::json!(t);
        }
        serde_json::from_value(v).expect("fip")
    }

    #[test]
    fn the_older_floating_ip_keeps_the_address_prefix_ignored() {
        let fips = [
            fip("new", "192.0.2.10/24", Some("2026-01-02T00:00:00Z")),
            fip("old", "192.0.2.10/32", Some("2026-01-01T00:00:00Z")),
            fip("other", "192.0.2.11/24", Some("2026-01-03T00:00:00Z")),
        ];
        let c = address_conflicts(&fips);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c.get("new").map(String::as_str), Some("old"));
        // The input order does not matter.
        let reversed: Vec<FloatingIP> = fips.iter().rev().cloned().collect();
        assert_eq!(address_conflicts(&reversed), c);
    }

    #[test]
    fn equal_creation_times_are_decided_by_name_and_unstored_objects_are_newest() {
        let t = Some("2026-01-01T00:00:00Z");
        let c = address_conflicts(&[fip("b", "2001:db8::10/64", t), fip("a", "2001:db8:0::10/128", t)]);
        assert_eq!(c.get("b").map(String::as_str), Some("a"), "two spellings of one IPv6 address: {c:?}");
        let c = address_conflicts(&[fip("a", "10.0.0.1/24", None), fip("z", "10.0.0.1/24", t)]);
        assert_eq!(c.get("a").map(String::as_str), Some("z"), "{c:?}");
        // Three of a kind: both newer ones lose to the oldest.
        let c = address_conflicts(&[
            fip("x", "10.0.0.2/24", Some("2026-01-03T00:00:00Z")),
            fip("y", "10.0.0.2/24", Some("2026-01-01T00:00:00Z")),
            fip("z", "10.0.0.2/24", Some("2026-01-02T00:00:00Z")),
        ]);
        assert_eq!(c.len(), 2);
        assert!(c.values().all(|w| w == "y"), "{c:?}");
    }

    #[test]
    fn unparsable_addresses_conflict_with_nothing() {
        assert!(address_conflicts(&[fip("a", "not-an-ip/24", None), fip("b", "not-an-ip/24", None)]).is_empty());
        assert_eq!(vip_address("192.0.2.10/24"), Some("192.0.2.10".parse().expect("ip")));
        assert_eq!(vip_address("192.0.2.300/24"), None);
    }
}
