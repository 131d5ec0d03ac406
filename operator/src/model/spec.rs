//! What a pair's spec and FloatingIPs imply before anything is observed: spec
//! validation, FloatingIP refusals across objects, member labels, the names of the
//! objects the operator creates, member addresses per heartbeat path and the
//! configuration revision. Pure.

use super::addresses::Reserved;
use super::observed::{NodeInfo, Observed, Refusal, member_status};
use havip_crds::hapair::NodeAddressType;
use havip_crds::revision::{config_revision, format_revision};
use havip_crds::{FloatingIPSpec, HAPairSpec, reason};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

impl Refusal {
    /// The reasons of every refusal (`Accepted=False` with one of them: the FloatingIP is
    /// refused for what it is, not for a passing state).
    pub const REASONS: [&'static str; 3] = [reason::ADDRESS_IN_USE, reason::NODE_ADDRESS, reason::API_SERVER_ADDRESS];

    /// The condition's and the Event's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::AddressInUse { .. } => reason::ADDRESS_IN_USE,
            Refusal::NodeAddress { .. } => reason::NODE_ADDRESS,
            Refusal::ApiServerAddress { .. } => reason::API_SERVER_ADDRESS,
        }
    }

    /// A sentence for `address` (the FloatingIP's `spec.address`).
    pub fn message(&self, address: &str) -> String {
        match self {
            Refusal::AddressInUse { holder, pair } => format!(
                "address {address} is already used by FloatingIP {holder} (pair {pair}), which is older: this \
                 FloatingIP is not served; give it another address, or delete one of the two"
            ),
            Refusal::NodeAddress { node, kind, member } => format!(
                "address {address} is the {kind} of {}node {node}: a VIP must not be a node's own \
                 address; this FloatingIP is not served",
                if *member { "member " } else { "" }
            ),
            Refusal::ApiServerAddress { source } => format!(
                "address {address} is {}: a VIP must not be the API server's address; this FloatingIP is not served",
                Reserved::ApiServer(*source)
            ),
        }
    }

    /// The refusal of a reserved address (see [`crate::model::AddressIndex`]), for a pair whose
    /// member Nodes are `members`.
    pub fn of_reserved(why: &Reserved, members: &BTreeMap<String, Option<NodeInfo>>) -> Refusal {
        match why {
            Reserved::ApiServer(source) => Refusal::ApiServerAddress { source: *source },
            Reserved::Node { node, kind } => {
                Refusal::NodeAddress { node: node.clone(), kind: kind.clone(), member: members.contains_key(node) }
            }
        }
    }
}

/// Whether the operator refuses FloatingIP `name` (address `address`) of a pair whose
/// member Nodes are `nodes`: its address is reserved (`reserved` looks it up in the
/// [`crate::model::AddressIndex`] of every Node's and the API server's addresses), or a member Node
/// reports it, or an older FloatingIP has it. `conflicts` comes from
/// [`havip_crds::floatingip::address_conflicts`] over every FloatingIP; `pair_of` names
/// the pair of another FloatingIP.
pub fn refusal(
    name: &str,
    address: &str,
    conflicts: &BTreeMap<String, String>,
    pair_of: impl Fn(&str) -> Option<String>,
    reserved: impl Fn(std::net::IpAddr) -> Option<Reserved>,
    nodes: &BTreeMap<String, Option<NodeInfo>>,
) -> Option<Refusal> {
    if let Some(ip) = havip_crds::floatingip::vip_address(address) {
        if let Some(why) = reserved(ip) {
            return Some(Refusal::of_reserved(&why, nodes));
        }
        for (node, info) in nodes {
            let Some(info) = info else { continue };
            if let Some((kind, _)) = info.addresses.iter().find(|(_, a)| a.parse::<std::net::IpAddr>().ok() == Some(ip))
            {
                return Some(Refusal::NodeAddress { node: node.clone(), kind: kind.clone(), member: true });
            }
        }
    }
    if let Some(holder) = conflicts.get(name) {
        let pair = pair_of(holder).unwrap_or_default();
        return Some(Refusal::AddressInUse { holder: holder.clone(), pair });
    }
    None
}

/// The merge patch that makes an object's member labels (`member.havip.io/<node>`) the
/// `desired` ones: adds the missing, removes (`null`) the others; other labels are left
/// alone. None when they already are.
pub fn member_label_patch(current: &BTreeMap<String, String>, desired: &BTreeSet<String>) -> Option<serde_json::Value> {
    let mut labels = serde_json::Map::new();
    for key in desired {
        if current.get(key).map(String::as_str) != Some(havip_crds::membership::VALUE) {
            labels.insert(key.clone(), serde_json::Value::String(havip_crds::membership::VALUE.to_owned()));
        }
    }
    for key in current.keys().filter(|k| havip_crds::membership::is_member_label(k) && !desired.contains(*k)) {
        labels.insert(key.clone(), serde_json::Value::Null);
    }
    (!labels.is_empty()).then(|| serde_json::json!({"metadata": {"labels": labels}}))
}

/// The member label keys of the pair's members.
pub fn member_labels(spec: &HAPairSpec) -> BTreeSet<String> {
    havip_crds::membership::label_keys(spec.members.iter().map(|m| m.node.as_str()))
}

/// The pair's member nodes by their full names, as the annotation
/// [`havip_crds::membership::NODES_ANNOTATION`] lists them.
pub fn member_nodes(spec: &HAPairSpec) -> String {
    havip_crds::membership::nodes_value(spec.members.iter().map(|m| m.node.as_str()))
}

/// [`member_label_patch`], plus the annotation [`havip_crds::membership::NODES_ANNOTATION`]
/// made `nodes` (None: removed), on the objects the agents write (the pair's FloatingIPs
/// and its Lease): the chart's admission policies check an agent's membership by it, as a
/// policy cannot compute the hashed label of a node name longer than 63 characters. Other
/// annotations are left alone. None when both already are as desired.
pub fn member_patch(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    desired: &BTreeSet<String>,
    nodes: Option<&str>,
) -> Option<serde_json::Value> {
    let key = havip_crds::membership::NODES_ANNOTATION;
    let mut patch = member_label_patch(labels, desired).unwrap_or_else(|| serde_json::json!({"metadata": {}}));
    if annotations.get(key).map(String::as_str) != nodes {
        patch["metadata"]["annotations"] = serde_json::json!({ key: nodes });
    }
    patch["metadata"].as_object().is_some_and(|m| !m.is_empty()).then_some(patch)
}

/// Whether `s` is a DNS-1123 subdomain (what a Node's name must be): at most 253
/// characters, dot-separated labels of lower-case letters, digits and '-', each starting
/// and ending with a letter or digit.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !s.is_empty() && s.len() <= 253 && s.split('.').all(label_ok)
}

/// Checks a spec for what CEL should have refused, plus what only the operator can
/// know (a pair name too long for its Lease and Secret names; a key Secret outside the
/// operator's `namespace`, where no agent reads Secrets). A pair's Lease cannot be the
/// leader-election Lease: pair Leases carry a prefix the operator refuses for the
/// leader-election Lease at startup.
pub fn validate_spec(name: &str, spec: &HAPairSpec, namespace: &str) -> Vec<String> {
    let mut out = Vec::new();
    if name.len() > 63 {
        out.push(format!("the pair name {name:?} is longer than 63 characters"));
    }
    if spec.members.len() < 2 || spec.members.len() > 8 {
        out.push(format!("a pair needs 2 to 8 members, it has {}", spec.members.len()));
    }
    let mut nodes = BTreeSet::new();
    let mut prios = BTreeSet::new();
    for m in &spec.members {
        if m.node.is_empty() {
            out.push("a member has an empty node name".to_owned());
        } else if !is_dns1123_subdomain(&m.node) {
            out.push(format!("member {:?}: not a Node name (a DNS-1123 subdomain)", m.node));
        } else if !nodes.insert(m.node.as_str()) {
            out.push(format!("node {} appears twice in spec.members", m.node));
        }
        if !(1..=254).contains(&m.priority) {
            out.push(format!("member {}: priority {} is not between 1 and 254", m.node, m.priority));
        } else if !prios.insert(m.priority) {
            out.push(format!("member {}: priority {} is used twice", m.node, m.priority));
        }
    }
    if spec.members.iter().filter(|m| m.maintenance).count() > 1 {
        out.push("more than one member is in maintenance".to_owned());
    }
    let hb = &spec.heartbeat;
    if let Some(ns) = hb.key_secret_ref.as_ref().and_then(|r| r.namespace.as_deref()).filter(|n| *n != namespace) {
        out.push(format!(
            "heartbeat.keySecretRef.namespace {ns:?}: the key Secret must be in the operator's namespace {namespace:?} (the agents read Secrets only there)"
        ));
    }
    let durations = [
        ("heartbeat.interval", &hb.interval),
        ("heartbeat.timeout", &hb.timeout),
        ("takeover.probeSpan", &spec.takeover.probe_span),
        ("takeover.probeInterval", &spec.takeover.probe_interval),
        ("takeover.probeTimeout", &spec.takeover.probe_timeout),
        ("takeover.holdDown", &spec.takeover.hold_down),
        ("takeover.bootHold", &spec.takeover.boot_hold),
        ("takeover.carrierStableFor", &spec.takeover.carrier_stable_for),
        ("failback.recoveryWindow", &spec.failback.recovery_window),
        ("failback.minimumTimeOnStandby", &spec.failback.minimum_time_on_standby),
        ("failback.quietWindow", &spec.failback.quiet_window),
        ("failback.quarantine.within", &spec.failback.quarantine.within),
        ("failback.quarantine.hold", &spec.failback.quarantine.hold),
        ("flapSuspension.within", &spec.flap_suspension.within),
        ("flapSuspension.quietClear", &spec.flap_suspension.quiet_clear),
    ];
    let mut parsed = BTreeMap::new();
    for (field, value) in durations {
        match havip_crds::duration::parse_duration(value) {
            // Durations beyond a year are certainly a typo and overflow timers.
            Ok(d) if d > Duration::from_secs(366 * 24 * 3600) => {
                out.push(format!("{field}: {value} is longer than a year"));
            }
            Ok(d) => {
                parsed.insert(field, d);
            }
            Err(e) => out.push(format!("{field}: {e}")),
        }
    }
    if let (Some(i), Some(t)) = (parsed.get("heartbeat.interval"), parsed.get("heartbeat.timeout"))
        && *t < *i * 2
    {
        out.push("heartbeat.timeout must be at least twice heartbeat.interval".to_owned());
    }
    if hb.paths.is_empty() {
        out.push("heartbeat.paths is empty".to_owned());
    }
    let mut path_names = BTreeSet::new();
    for p in &hb.paths {
        if !path_names.insert(p.name.as_str()) {
            out.push(format!("heartbeat path {} appears twice", p.name));
        }
        if p.address_type.is_some() == p.interface.is_some() {
            out.push(format!("heartbeat path {} must name exactly one of addressType or interface", p.name));
        }
    }
    if let Err(e) = havip_crds::routes::parse_all(&spec.routes, &spec.rules) {
        out.push(e.to_string());
    }
    out
}

/// The spec problem of a pair whose virtual MAC (`virtualMAC`) another pair that shares
/// a member node with it uses too, for either family; the older pair (by creation time,
/// then name) keeps it. `others`: every other pair as (name, spec, creation time). Two
/// pairs answering with one MAC on one link would steal each other's frames, and their
/// agents would share one macvlan; the agent of the later one refuses it on that node
/// as well. `None`: no conflict (or no virtual MAC).
pub fn virtual_mac_conflict<'a>(
    name: &str,
    spec: &HAPairSpec,
    created: Option<&k8s_openapi::jiff::Timestamp>,
    others: impl IntoIterator<Item = (&'a str, &'a HAPairSpec, Option<&'a k8s_openapi::jiff::Timestamp>)>,
) -> Option<String> {
    let vm = spec.virtual_mac.as_ref()?;
    let macs = |v: &havip_crds::VirtualMacSpec| [v.mac(false).ok(), v.mac(true).ok()];
    let mine = macs(vm);
    let nodes: BTreeSet<&str> = spec.members.iter().map(|m| m.node.as_str()).collect();
    // Oldest first; a pair without a creation time (not stored yet) is the youngest.
    let age_key = |when: Option<&k8s_openapi::jiff::Timestamp>, n: &str| (when.is_none(), when.copied(), n.to_owned());
    let mine_key = age_key(created, name);
    let mut older: Vec<(_, String)> = others
        .into_iter()
        .filter(|(other, _, when)| *other != name && age_key(*when, other) < mine_key)
        .filter_map(|(other, s, when)| {
            let theirs = macs(s.virtual_mac.as_ref()?);
            mine.iter().flatten().any(|m| theirs.iter().flatten().any(|t| t == m)).then_some(())?;
            let shared = s.members.iter().find(|m| nodes.contains(m.node.as_str()))?;
            Some((age_key(when, other), shared.node.clone()))
        })
        .collect();
    older.sort();
    let ((_, _, other), node) = older.into_iter().next()?;
    Some(format!(
        "virtualMAC: pair {other}, which is older and shares node {node} with this pair, uses the same virtual MAC; \
         give this pair another virtualMAC id (or address)"
    ))
}

/// The name of a pair's Lease (`hapair-<pair>`; see [`havip_crds::lease`]).
pub fn lease_name(pair: &str) -> String {
    havip_crds::lease::pair_lease_name(pair)
}

/// The name of a pair's key Secret.
pub fn secret_name(pair: &str) -> String {
    format!("havip-{pair}-key")
}

/// The pair a Lease name belongs to (`hapair-<pair>`), if any.
pub fn pair_of_lease(lease: &str) -> Option<&str> {
    havip_crds::lease::pair_of_lease(lease)
}

pub(super) fn address_type_name(t: &NodeAddressType) -> &'static str {
    match t {
        NodeAddressType::InternalIP => "InternalIP",
        NodeAddressType::ExternalIP => "ExternalIP",
    }
}

/// The heartbeat address of every member on every path (`node → path → address`):
/// addressType paths from the Node's addresses (first IPv4, else first IPv6),
/// interface paths from the member's published `pathAddresses`. Also returns what is
/// missing, as sentences.
pub fn member_addresses(o: &Observed) -> (BTreeMap<String, BTreeMap<String, String>>, Vec<String>) {
    let mut out = BTreeMap::new();
    let mut missing = Vec::new();
    for m in &o.spec.members {
        let mut paths = BTreeMap::new();
        let node = o.nodes.get(&m.node).and_then(Option::as_ref);
        let reported = member_status(&o.status, &m.node);
        for p in &o.spec.heartbeat.paths {
            let addr = if let Some(t) = &p.address_type {
                let t = address_type_name(t);
                node.and_then(|n| {
                    let of_type = || n.addresses.iter().filter(|(ty, _)| ty == t).map(|(_, a)| a);
                    of_type()
                        .find(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
                        .or_else(|| of_type().find(|a| a.parse::<std::net::Ipv6Addr>().is_ok()))
                        .cloned()
                })
            } else {
                reported.and_then(|s| s.path_addresses.iter().find(|a| a.path == p.name)).map(|a| a.address.clone())
            };
            match addr {
                Some(a) => {
                    paths.insert(p.name.clone(), a);
                }
                None if node.is_some() => missing.push(format!("member {} has no address on path {}", m.node, p.name)),
                None => {}
            }
        }
        out.insert(m.node.clone(), paths);
    }
    (out, missing)
}

/// `status.configRevision` for this observation.
pub fn revision(o: &Observed) -> String {
    let (addrs, _) = member_addresses(o);
    let fips: BTreeMap<String, FloatingIPSpec> =
        o.vips.iter().filter_map(|v| v.spec.clone().map(|s| (v.name.clone(), s))).collect();
    format_revision(config_revision(&o.spec, &fips, &addrs))
}

/// `status.memberAddresses`: every member's heartbeat address per path (see
/// [`member_addresses`]), members without any left out.
pub fn published_addresses(o: &Observed) -> Vec<havip_crds::MemberAddresses> {
    let (table, _) = member_addresses(o);
    table
        .into_iter()
        .filter(|(_, paths)| !paths.is_empty())
        .map(|(node, paths)| havip_crds::MemberAddresses {
            node,
            paths: paths.into_iter().map(|(path, address)| havip_crds::hapair::PathAddress { path, address }).collect(),
        })
        .collect()
}
