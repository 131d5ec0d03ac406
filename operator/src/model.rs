//! The operator's decisions as pure functions of what it observed: member addresses
//! and the configuration revision, phase and conditions, the pair's last transition,
//! imperative requests (annotation → refusal or command), command answers and key
//! rotation. No I/O and no clock reads: `now` is an input. The controller
//! ([`crate::hapair`]) gathers the inputs from its caches and applies the outputs.

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
    /// The FloatingIPs naming the pair, sorted by name.
    pub vips: Vec<VipInfo>,
    /// Problems with the spec that the schema did not catch.
    pub spec_problems: Vec<String>,
    /// The current time.
    pub now: Timestamp,
}

/// Checks a spec for what CEL should have refused, plus what only the operator can
/// know (a pair name too long for its Lease and Secret names). A pair's Lease cannot be
/// the leader-election Lease: pair Leases carry a prefix the operator refuses for the
/// leader-election Lease at startup.
pub fn validate_spec(name: &str, spec: &HAPairSpec) -> Vec<String> {
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
    let durations = [
        ("heartbeat.interval", &hb.interval),
        ("heartbeat.timeout", &hb.timeout),
        ("takeover.probeSpan", &spec.takeover.probe_span),
        ("takeover.probeInterval", &spec.takeover.probe_interval),
        ("takeover.probeTimeout", &spec.takeover.probe_timeout),
        ("takeover.holdDown", &spec.takeover.hold_down),
        ("takeover.bootHold", &spec.takeover.boot_hold),
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
    out
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

fn address_type_name(t: &NodeAddressType) -> &'static str {
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

/// A member's own status entry.
pub fn member_status<'a>(status: &'a HAPairStatus, node: &str) -> Option<&'a MemberStatus> {
    status.members.iter().find(|m| m.node == node)
}

fn age(now: Timestamp, t: &Time) -> Duration {
    let ms = now.as_millisecond().saturating_sub(t.0.as_millisecond());
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Whether a member reports: it has an entry whose `lastSeen` is recent (an entry
/// without `lastSeen` counts as reporting: its age cannot be told).
pub fn is_reporting(s: Option<&MemberStatus>, now: Timestamp) -> bool {
    s.is_some_and(|s| s.last_seen.as_ref().is_none_or(|t| age(now, t) <= NOT_REPORTING_AFTER))
}

fn protocol_major(v: &str) -> &str {
    v.split('.').next().unwrap_or(v)
}

/// One cause of degradation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// CamelCase reason.
    pub reason: &'static str,
    /// A sentence that says why.
    pub message: String,
}

/// What the operator concludes about a pair.
#[derive(Clone, Debug, PartialEq)]
pub struct Assessment {
    /// The phase.
    pub phase: Phase,
    /// Why this phase, as a sentence.
    pub phase_message: String,
    /// The Lease holder, if a member.
    pub active: Option<String>,
    /// The ready standbys, by priority.
    pub standbys: Vec<String>,
    /// Why each other member is not a ready standby.
    pub not_ready: Vec<String>,
    /// The epoch.
    pub epoch: i64,
    /// Everything that degrades the pair.
    pub degraded: Vec<Cause>,
    /// Members that report flap suspension.
    pub suspended: Vec<String>,
    /// Members that have not applied the revision (with what they applied).
    pub config_pending: Vec<String>,
    /// The highest-priority member not in maintenance.
    pub preferred: Option<String>,
}

fn is_in_maintenance(o: &Observed, node: &str) -> bool {
    o.spec.members.iter().any(|m| m.node == node && m.maintenance)
        || member_status(&o.status, node).and_then(|s| s.maintenance).unwrap_or(false)
}

/// Why `node` is not a ready standby (None: it is one). `active` is the Lease holder.
pub fn standby_problem(o: &Observed, node: &str, active: Option<&str>) -> Option<String> {
    if active == Some(node) {
        return Some(format!("{node} is active"));
    }
    if is_in_maintenance(o, node) {
        return Some(format!("{node} is in maintenance"));
    }
    if o.nodes.get(node).is_none_or(Option::is_none) {
        return Some(format!("{node}'s Node does not exist"));
    }
    let s = member_status(&o.status, node);
    let Some(s) = s.filter(|_| is_reporting(s, o.now)) else {
        return Some(format!("{node} is not reporting"));
    };
    if s.role != Some(MemberRole::Standby) {
        let role = s.role.as_ref().map(MemberRole::as_str).unwrap_or("unknown");
        return Some(format!("{node} reports role {role}"));
    }
    if let Some(r) = s.ready.iter().find(|r| !r.ready) {
        return Some(format!(
            "{node} is not ready for VIP {}{}",
            r.address,
            r.reason.as_deref().map(|x| format!(" ({x})")).unwrap_or_default()
        ));
    }
    let vips = o.vips.iter().filter(|v| v.spec.is_some()).count();
    if vips > 0 && s.ready.is_empty() {
        return Some(format!("{node} has not reported readiness for the VIPs"));
    }
    None
}

/// Phase, standbys and every cause of degradation, from one observation.
pub fn assess(o: &Observed, revision: &str) -> Assessment {
    let now = o.now;
    let mut members: Vec<_> = o.spec.members.iter().collect();
    members.sort_by_key(|m| std::cmp::Reverse(m.priority));
    let lease = o.lease.clone().unwrap_or_default();
    let holder = lease.holder.clone().filter(|h| !h.is_empty());
    let active = holder.clone().filter(|h| members.iter().any(|m| &m.node == h));
    let preferred = members.iter().find(|m| !m.maintenance).map(|m| m.node.clone());

    let mut standbys = Vec::new();
    let mut not_ready = Vec::new();
    for m in &members {
        if active.as_deref() == Some(m.node.as_str()) {
            continue;
        }
        match standby_problem(o, &m.node, active.as_deref()) {
            None => standbys.push(m.node.clone()),
            Some(p) => not_ready.push(p),
        }
    }

    let mut degraded = Vec::new();
    let mut push = |reason: &'static str, message: String| degraded.push(Cause { reason, message });
    for m in &members {
        if o.nodes.get(&m.node).is_none_or(Option::is_none) {
            push(reason::MEMBER_LOST, format!("member {}: Node {} does not exist", m.node, m.node));
        }
    }
    let (_, missing_addresses) = member_addresses(o);
    for missing in missing_addresses {
        push(local_reason::ADDRESS_MISSING, missing);
    }
    for m in &members {
        match member_status(&o.status, &m.node) {
            None => push(reason::MEMBER_NOT_REPORTING, format!("member {} has never reported", m.node)),
            Some(s) if !is_reporting(Some(s), now) => {
                // The time it was last seen, not its age: the message must not change
                // on every reconcile (each change would be a status write).
                let since =
                    s.last_seen.as_ref().map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()).unwrap_or_default();
                push(reason::MEMBER_NOT_REPORTING, format!("member {} has not reported since {since}", m.node));
            }
            Some(_) => {}
        }
    }
    let reporting: Vec<&MemberStatus> = members
        .iter()
        .filter_map(|m| member_status(&o.status, &m.node))
        .filter(|s| is_reporting(Some(s), now))
        .collect();
    let protocols: BTreeMap<&str, Vec<&str>> = reporting
        .iter()
        .filter_map(|s| s.protocol_version.as_deref().map(|v| (protocol_major(v), s.node.as_str())))
        .fold(BTreeMap::new(), |mut acc, (v, n)| {
            acc.entry(v).or_default().push(n);
            acc
        });
    let alarm_nodes = |alarm: MemberAlarm| {
        reporting.iter().filter(|s| s.alarms.contains(&alarm)).map(|s| s.node.clone()).collect::<Vec<_>>()
    };
    if protocols.len() > 1 {
        let list: Vec<String> = protocols.iter().map(|(v, ns)| format!("{v}.x on {}", ns.join(", "))).collect();
        push(reason::VERSION_MISMATCH, format!("members run incompatible heartbeat protocols: {}", list.join("; ")));
    } else if !alarm_nodes(MemberAlarm::VersionMismatch).is_empty() {
        push(
            reason::VERSION_MISMATCH,
            format!("{} report(s) a heartbeat protocol mismatch", alarm_nodes(MemberAlarm::VersionMismatch).join(", ")),
        );
    }
    let versions: BTreeMap<&str, Vec<&str>> = reporting
        .iter()
        .filter_map(|s| s.agent_version.as_deref().map(|v| (v, s.node.as_str())))
        .fold(BTreeMap::new(), |mut acc, (v, n)| {
            acc.entry(v).or_default().push(n);
            acc
        });
    if versions.len() > 1 {
        let list: Vec<String> = versions.iter().map(|(v, ns)| format!("{v} on {}", ns.join(", "))).collect();
        push(reason::VERSION_SKEW, format!("members run different agent versions: {}", list.join("; ")));
    }
    let mut config_pending = Vec::new();
    for m in &members {
        let st = member_status(&o.status, &m.node);
        let why = st.and_then(|s| s.config_error.as_deref()).map(|e| format!(" ({e})")).unwrap_or_default();
        match st.and_then(|s| s.applied_revision.as_deref()) {
            Some(r) if r == revision => {}
            Some(r) => config_pending.push(format!("{} applied {r}{why}", m.node)),
            None => config_pending.push(format!("{} has applied no revision{why}", m.node)),
        }
    }
    let stale_config: Vec<&String> =
        config_pending.iter().filter(|p| reporting.iter().any(|s| p.starts_with(&format!("{} ", s.node)))).collect();
    if !stale_config.is_empty() {
        push(
            reason::CONFIG_PENDING,
            format!(
                "configuration {revision} not applied yet: {}",
                stale_config.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ),
        );
    }
    let key_alarms = alarm_nodes(MemberAlarm::KeyMismatch);
    if !key_alarms.is_empty() {
        push(
            reason::KEY_MISMATCH,
            format!("{} receive(s) heartbeats signed with an unknown key", key_alarms.join(", ")),
        );
    } else if let Some(k) = o.key.as_ref().filter(|k| k.previous_key_id.is_none()) {
        let wrong: Vec<String> = reporting
            .iter()
            .filter_map(|s| s.key_id.filter(|id| *id != k.key_id).map(|id| format!("{} signs with key {id}", s.node)))
            .collect();
        if !wrong.is_empty() {
            push(reason::KEY_MISMATCH, format!("the key Secret holds key {}, but {}", k.key_id, wrong.join(", ")));
        }
    }
    // The old active of a planned handover reports Demoting until it has removed the
    // VIPs, then Standby: not a missing standby.
    let demoting = reporting.iter().any(|s| s.role == Some(MemberRole::Demoting));
    if active.is_some() && standbys.is_empty() && !demoting {
        push(local_reason::NO_READY_STANDBY, format!("no ready standby: {}", not_ready.join("; ")));
    }
    let unhealthy: Vec<String> = o
        .vips
        .iter()
        .filter(|v| v.state == Some(VipState::Unhealthy))
        .map(|v| format!("{} ({})", v.name, v.spec.as_ref().map(|s| s.address.as_str()).unwrap_or("?")))
        .collect();
    let unhealthy_alarm = alarm_nodes(MemberAlarm::VipUnhealthy);
    if !unhealthy.is_empty() {
        push(reason::VIP_UNHEALTHY, format!("VIP unhealthy: {}", unhealthy.join(", ")));
    } else if !unhealthy_alarm.is_empty() {
        push(reason::VIP_UNHEALTHY, format!("{} report(s) an unhealthy VIP", unhealthy_alarm.join(", ")));
    }
    let conflict: Vec<String> = o
        .vips
        .iter()
        .filter(|v| v.state == Some(VipState::Conflict))
        .map(|v| format!("{} ({})", v.name, v.spec.as_ref().map(|s| s.address.as_str()).unwrap_or("?")))
        .collect();
    let conflict_alarm = alarm_nodes(MemberAlarm::VipConflict);
    if !conflict.is_empty() {
        push(reason::VIP_CONFLICT, format!("a foreign host answers for VIP {}", conflict.join(", ")));
    } else if !conflict_alarm.is_empty() {
        push(
            reason::VIP_CONFLICT,
            format!("{} report(s) a foreign host answering for a VIP", conflict_alarm.join(", ")),
        );
    }
    for s in &reporting {
        for a in &s.alarms {
            // These have causes of their own above.
            let covered = matches!(
                a,
                MemberAlarm::Suspended
                    | MemberAlarm::VersionMismatch
                    | MemberAlarm::KeyMismatch
                    | MemberAlarm::VipUnhealthy
                    | MemberAlarm::VipConflict
            );
            if !covered {
                push(local_reason::MEMBER_ALARM, format!("{} raises alarm {a}", s.node));
            }
        }
    }
    let suspended = alarm_nodes(MemberAlarm::Suspended);

    let any_reported = members.iter().any(|m| member_status(&o.status, &m.node).is_some());
    let someone_active_reported = reporting.iter().any(|s| s.role == Some(MemberRole::Active));
    // A handover in flight: the old active is demoting (both hold the VIPs, make before
    // break), or the Lease changed a moment ago and the new holder has not reported yet.
    let settling = demoting || next_settle(o).is_some();
    let (phase, phase_message) = if !any_reported {
        (Phase::Pending, "no member has reported yet".to_owned())
    } else if holder.is_none() && lease.transitions == 0 {
        (Phase::Pending, "nobody has been elected yet".to_owned())
    } else if holder.is_none() {
        (Phase::Failed, format!("nobody holds the VIPs (the Lease has no holder at epoch {})", lease.transitions))
    } else if active.is_none() {
        (
            Phase::Failed,
            format!(
                "nobody holds the VIPs: the Lease names {}, which is not a member",
                holder.as_deref().unwrap_or("")
            ),
        )
    } else if let Some(a) = active.as_deref()
        && let Some(r) = member_status(&o.status, a)
            .and_then(|s| s.role.as_ref())
            .filter(|r| !matches!(r, MemberRole::Active | MemberRole::Demoting))
        && !someone_active_reported
        && !settling
    {
        (Phase::Failed, format!("nobody holds the VIPs: {a} holds the Lease but reports role {r}"))
    } else if !suspended.is_empty() {
        (
            Phase::Suspended,
            format!("flap suspension on {}: discretionary moves are suspended until cleared", suspended.join(", ")),
        )
    } else if !degraded.is_empty() {
        (Phase::Degraded, degraded.iter().map(|c| c.message.as_str()).collect::<Vec<_>>().join("; "))
    } else if active == preferred {
        (
            Phase::Live,
            format!(
                "{} (preferred) is active; ready standby: {}",
                active.as_deref().unwrap_or(""),
                standbys.join(", ")
            ),
        )
    } else {
        (
            Phase::FailedOver,
            format!(
                "{} is active instead of the preferred {}; ready standby: {}",
                active.as_deref().unwrap_or(""),
                preferred.as_deref().unwrap_or("(none)"),
                standbys.join(", ")
            ),
        )
    };
    Assessment {
        phase,
        phase_message,
        active,
        standbys,
        not_ready,
        epoch: lease.transitions,
        degraded,
        suspended,
        config_pending,
        preferred,
    }
}

/// A condition, keeping `lastTransitionTime` from `previous` when the status did not
/// change.
pub fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_owned();
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// The pair's conditions: Ready, Degraded, Suspended, ConfigApplied, InvalidSpec.
pub fn conditions(o: &Observed, a: &Assessment, revision: &str) -> Vec<Condition> {
    let prev = &o.status.conditions;
    let g = o.generation;
    let now = o.now;
    let paused = if o.spec.paused { "; automatic policy moves are paused (spec.paused)" } else { "" };
    let serving = matches!(a.phase, Phase::Live | Phase::FailedOver | Phase::Degraded | Phase::Suspended);
    let ready = serving && a.active.is_some() && !a.standbys.is_empty();
    let ready_reason = if ready || !serving { a.phase.as_str() } else { local_reason::NO_READY_STANDBY };
    let ready_msg = if serving {
        format!(
            "{} is active; ready standby: {}{paused}",
            a.active.as_deref().unwrap_or(""),
            if a.standbys.is_empty() { "none".to_owned() } else { a.standbys.join(", ") }
        )
    } else {
        format!("{}{paused}", a.phase_message)
    };
    let mut out = vec![condition(prev, condition::READY, ready, ready_reason, ready_msg, g, now)];
    out.push(match a.degraded.first() {
        Some(first) => condition(
            prev,
            condition::DEGRADED,
            true,
            first.reason,
            a.degraded.iter().map(|c| c.message.as_str()).collect::<Vec<_>>().join("; "),
            g,
            now,
        ),
        None => condition(prev, condition::DEGRADED, false, reason::AS_EXPECTED, String::new(), g, now),
    });
    out.push(if a.suspended.is_empty() {
        condition(prev, condition::SUSPENDED, false, reason::AS_EXPECTED, String::new(), g, now)
    } else {
        condition(
            prev,
            condition::SUSPENDED,
            true,
            reason::SUSPENDED,
            format!(
                "flap suspension on {}; it clears after flapSuspension.quietClear, or with `kubectl havip clear {}`",
                a.suspended.join(", "),
                o.name
            ),
            g,
            now,
        )
    });
    out.push(if a.config_pending.is_empty() {
        condition(
            prev,
            condition::CONFIG_APPLIED,
            true,
            reason::AS_EXPECTED,
            format!("every member applied revision {revision}"),
            g,
            now,
        )
    } else {
        condition(
            prev,
            condition::CONFIG_APPLIED,
            false,
            reason::CONFIG_PENDING,
            format!("revision {revision}: {}", a.config_pending.join(", ")),
            g,
            now,
        )
    });
    out.push(if o.spec_problems.is_empty() {
        condition(prev, condition::INVALID_SPEC, false, reason::AS_EXPECTED, String::new(), g, now)
    } else {
        condition(prev, condition::INVALID_SPEC, true, reason::INVALID_SPEC, o.spec_problems.join("; "), g, now)
    });
    out
}

/// The pair's last transition: kept while the Lease's holder and epoch are unchanged
/// (its reason refined once the new active reports it: agents report the pair's
/// reasons), a new one when they changed.
/// The flag says whether it is new (an Event is due).
pub fn last_transition(o: &Observed) -> (Option<havip_crds::Transition>, bool) {
    let Some(lease) = &o.lease else {
        return (o.status.last_transition.clone(), false);
    };
    let holder = lease.holder.clone().unwrap_or_default();
    if lease.transitions == 0 && holder.is_empty() {
        return (o.status.last_transition.clone(), false);
    }
    let reported = member_status(&o.status, &holder)
        .and_then(|s| s.last_transition.as_ref())
        .filter(|t| t.epoch == lease.transitions && t.to == holder)
        .map(|t| t.reason.clone());
    if let Some(prev) = &o.status.last_transition
        && prev.epoch == lease.transitions
        && prev.to == holder
    {
        let mut t = prev.clone();
        if t.reason == TransitionReason::RoleChange
            && let Some(r) = reported
        {
            t.reason = r;
        }
        return (Some(t), false);
    }
    let from =
        o.status.active.clone().or_else(|| o.status.last_transition.as_ref().map(|t| t.to.clone())).unwrap_or_default();
    let reason =
        reported.unwrap_or(if from.is_empty() { TransitionReason::Elected } else { TransitionReason::RoleChange });
    let time = lease.renew_time.map(Time).unwrap_or(Time(o.now));
    (Some(havip_crds::Transition { from, to: holder, reason, epoch: lease.transitions, time: Some(time) }), true)
}

/// The imperative requests, in the order they are considered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RequestKind {
    /// Planned failover.
    Failover,
    /// Forced failover.
    ForceFailover,
    /// Clear a flap suspension.
    Clear,
    /// Rotate the heartbeat key.
    RotateKey,
    /// Resume automatic failback.
    ResumeFailback,
}

impl RequestKind {
    /// Every kind.
    pub const ALL: [RequestKind; 5] = [
        RequestKind::Failover,
        RequestKind::ForceFailover,
        RequestKind::Clear,
        RequestKind::RotateKey,
        RequestKind::ResumeFailback,
    ];

    /// The annotation that requests it.
    pub fn annotation(self) -> &'static str {
        match self {
            RequestKind::Failover => annotation::FAILOVER,
            RequestKind::ForceFailover => annotation::FORCE_FAILOVER,
            RequestKind::Clear => annotation::CLEAR,
            RequestKind::RotateKey => annotation::ROTATE_KEY,
            RequestKind::ResumeFailback => annotation::RESUME_FAILBACK,
        }
    }

    /// The key in [`HANDLED_ANNOTATION`].
    pub fn key(self) -> &'static str {
        self.annotation().trim_start_matches("havip.io/")
    }

    /// The operation kind in `command` and `lastOperation`.
    pub fn operation(self) -> OperationKind {
        match self {
            RequestKind::Failover => OperationKind::PlannedFailover,
            RequestKind::ForceFailover => OperationKind::ForcedFailover,
            RequestKind::Clear => OperationKind::ClearSuspension,
            RequestKind::RotateKey => OperationKind::RotateKey,
            RequestKind::ResumeFailback => OperationKind::ResumeFailback,
        }
    }

    /// Whether a target node may follow the id.
    pub fn takes_target(self) -> bool {
        matches!(self, RequestKind::Failover | RequestKind::ForceFailover)
    }
}

/// A parsed request annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// What is asked.
    pub kind: RequestKind,
    /// The request id.
    pub id: String,
    /// For failovers: the member that should take the VIPs.
    pub target: Option<String>,
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 63 && id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Parses an annotation value `<id>` or `<id>:<target>`. On error, returns the id to
/// answer under (the value before any `:`, possibly empty) and why.
pub fn parse_request(kind: RequestKind, value: &str) -> Result<Request, (String, String)> {
    let value = value.trim();
    let (id, target) = match value.split_once(':') {
        Some((id, t)) => (id, Some(t)),
        None => (value, None),
    };
    if !valid_id(id) {
        return Err((
            id.to_owned(),
            format!(
                "malformed request id {id:?} in {}: use 1 to 63 letters, digits, '-', '_' or '.'",
                kind.annotation()
            ),
        ));
    }
    match target {
        None => Ok(Request { kind, id: id.to_owned(), target: None }),
        Some(_) if !kind.takes_target() => {
            Err((id.to_owned(), format!("{} takes no target (value {value:?})", kind.annotation())))
        }
        Some(t) if t.is_empty() || t.len() > 253 || t.contains(char::is_whitespace) => {
            Err((id.to_owned(), format!("malformed target node {t:?} in {}", kind.annotation())))
        }
        Some(t) => Ok(Request { kind, id: id.to_owned(), target: Some(t.to_owned()) }),
    }
}

/// The ids already acted on, per request kind key (from [`HANDLED_ANNOTATION`]).
pub fn handled_ids(annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    annotations.get(HANDLED_ANNOTATION).and_then(|v| serde_json::from_str(v).ok()).unwrap_or_default()
}

/// The first request annotation whose id has not been acted on yet.
pub fn next_request(o: &Observed) -> Option<Result<Request, (RequestKind, String, String)>> {
    let handled = handled_ids(&o.annotations);
    let seen = |id: &str| {
        o.status.command.as_ref().is_some_and(|c| c.id == id)
            || o.status.last_operation.as_ref().is_some_and(|op| op.id == id)
            || o.status.key_rotation.as_ref().is_some_and(|k| k.id == id)
            || o.key.as_ref().and_then(|k| k.rotation_id.as_deref()) == Some(id)
    };
    for kind in RequestKind::ALL {
        let Some(value) = o.annotations.get(kind.annotation()) else { continue };
        let raw_id = value.trim().split(':').next().unwrap_or("");
        if handled.get(kind.key()).map(String::as_str) == Some(raw_id) || seen(raw_id) {
            continue;
        }
        return Some(parse_request(kind, value).map_err(|(id, why)| (kind, id, why)));
    }
    None
}

/// What to do with a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Answer `Refused` with this message.
    Refuse(String),
    /// Write this command for the agents.
    Command(PairCommand),
    /// Start a key rotation to this key id.
    RotateKey {
        /// The new key's id.
        key_id: i64,
    },
}

/// Checks a request's preconditions (those the operator can see).
pub fn decide(o: &Observed, a: &Assessment, revision: &str, req: &Request) -> Decision {
    use Decision::Refuse;
    if !o.spec_problems.is_empty() {
        return Refuse(format!("the spec is invalid: {}", o.spec_problems.join("; ")));
    }
    let pending = o.status.command.as_ref();
    let command = |target: Option<String>| {
        Decision::Command(PairCommand {
            id: req.id.clone(),
            kind: req.kind.operation(),
            target,
            issued: Some(Time(o.now)),
        })
    };
    if req.kind != RequestKind::RotateKey
        && let Some(c) = pending
    {
        return Refuse(format!("{} {} is still in progress; retry when it is answered", c.kind, c.id));
    }
    let is_member = |n: &str| o.spec.members.iter().any(|m| m.node == n);
    match req.kind {
        RequestKind::Failover | RequestKind::ForceFailover => {
            let forced = req.kind == RequestKind::ForceFailover;
            if !forced && o.spec.paused {
                return Refuse(
                    "the pair is paused (spec.paused): unpause it for a planned failover, or force one".to_owned(),
                );
            }
            let Some(active) = a.active.as_deref() else {
                return Refuse("nobody is active: there is nothing to fail over".to_owned());
            };
            if let Some(t) = req.target.as_deref() {
                if !is_member(t) {
                    return Refuse(format!("{t} is not a member of the pair"));
                }
                if t == active {
                    return Refuse(format!("{t} is already active"));
                }
                if o.spec.members.iter().any(|m| m.node == t && m.maintenance) {
                    return Refuse(format!("{t} is in maintenance"));
                }
            }
            let mut candidates: Vec<_> = o.spec.members.iter().filter(|m| m.node != active && !m.maintenance).collect();
            candidates.sort_by_key(|m| std::cmp::Reverse(m.priority));
            if let Some(t) = req.target.as_deref() {
                candidates.retain(|m| m.node == t);
            }
            if forced {
                // A forced failover skips the readiness checks; prefer a reporting member.
                let pick = candidates
                    .iter()
                    .find(|m| is_reporting(member_status(&o.status, &m.node), o.now))
                    .or(candidates.first());
                return match pick {
                    Some(m) => command(Some(m.node.clone())),
                    None => Refuse("no other member to fail over to".to_owned()),
                };
            }
            let active_status = member_status(&o.status, active);
            if !is_reporting(active_status, o.now) {
                return Refuse(format!("the active member {active} is not reporting"));
            }
            let active_rev = active_status.and_then(|s| s.applied_revision.as_deref());
            let active_proto = active_status.and_then(|s| s.protocol_version.as_deref()).map(protocol_major);
            let mut why = Vec::new();
            for m in &candidates {
                if let Some(p) = standby_problem(o, &m.node, Some(active)) {
                    why.push(p);
                    continue;
                }
                let Some(s) = member_status(&o.status, &m.node) else { continue };
                if let Some(p) = s.heard.iter().find(|h| !h.heard) {
                    why.push(format!("{} does not hear its peer on path {}", m.node, p.path));
                    continue;
                }
                if s.applied_revision.as_deref() != Some(revision) || active_rev != Some(revision) {
                    why.push(format!(
                        "{} and {active} have not both applied revision {revision} ({} / {})",
                        m.node,
                        s.applied_revision.as_deref().unwrap_or("none"),
                        active_rev.unwrap_or("none")
                    ));
                    continue;
                }
                if s.protocol_version.as_deref().map(protocol_major) != active_proto {
                    why.push(format!("{} and {active} run different heartbeat protocols", m.node));
                    continue;
                }
                return command(Some(m.node.clone()));
            }
            if why.is_empty() {
                why.push("no other member can take over".to_owned());
            }
            Refuse(format!("no standby is ready for a planned failover: {}", why.join("; ")))
        }
        RequestKind::Clear => {
            if a.suspended.is_empty() {
                Refuse("no member reports a flap suspension: nothing to clear".to_owned())
            } else {
                command(None)
            }
        }
        RequestKind::ResumeFailback => {
            if o.spec.failback.mode == havip_crds::FailbackMode::Manual {
                Refuse("spec.failback.mode is Manual: there is no automatic failback to resume".to_owned())
            } else {
                command(None)
            }
        }
        RequestKind::RotateKey => {
            if let Some(r) = &o.spec.heartbeat.key_secret_ref {
                return Refuse(format!(
                    "the key comes from Secret {}/{} (spec.heartbeat.keySecretRef): rotate it there",
                    r.namespace.as_deref().unwrap_or("<operator namespace>"),
                    r.name
                ));
            }
            let Some(k) = &o.key else {
                return Refuse("the key Secret does not exist yet".to_owned());
            };
            if k.previous_key_id.is_some() {
                let waiting = key_progress(o, k);
                return Refuse(format!(
                    "key rotation {} to key {} is in progress (waiting for {}); one rotation at a time",
                    k.rotation_id.as_deref().unwrap_or("?"),
                    k.key_id,
                    if waiting.is_empty() { "its completion".to_owned() } else { waiting.join(", ") }
                ));
            }
            Decision::RotateKey { key_id: k.key_id + 1 }
        }
    }
}

/// The members that do not report the current key id yet (empty: the rotation is done).
pub fn key_progress(o: &Observed, k: &KeyInfo) -> Vec<String> {
    o.spec
        .members
        .iter()
        .filter(|m| member_status(&o.status, &m.node).and_then(|s| s.key_id) != Some(k.key_id))
        .map(|m| m.node.clone())
        .collect()
}

/// What the key Secret needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyAction {
    /// Nothing.
    None,
    /// Every member signs with the new key: drop the previous one.
    FinishRotation,
    /// Members were removed from the spec: rotate, so they become strangers.
    RotateForRemoval {
        /// The removed nodes.
        removed: Vec<String>,
    },
    /// Members were only added (or never recorded): record the member set.
    RecordMembers,
}

/// The key Secret's next step, from its state and the spec's members.
pub fn key_action(o: &Observed) -> KeyAction {
    let Some(k) = &o.key else { return KeyAction::None };
    if o.spec.heartbeat.key_secret_ref.is_some() {
        return KeyAction::None;
    }
    if k.previous_key_id.is_some() {
        return if key_progress(o, k).is_empty() { KeyAction::FinishRotation } else { KeyAction::None };
    }
    let spec: BTreeSet<String> = o.spec.members.iter().map(|m| m.node.clone()).collect();
    match &k.members {
        None => KeyAction::RecordMembers,
        Some(recorded) => {
            let removed: Vec<String> = recorded.difference(&spec).cloned().collect();
            if !removed.is_empty() {
                KeyAction::RotateForRemoval { removed }
            } else if *recorded != spec {
                KeyAction::RecordMembers
            } else {
                KeyAction::None
            }
        }
    }
}

/// The agents' answer to the pending command, or `Failed` after [`COMMAND_TIMEOUT`].
/// Failovers are answered by one member (the active executes them); the others by
/// every member that reports.
pub fn command_answer(o: &Observed, cmd: &PairCommand) -> Option<Operation> {
    let answers: Vec<(&str, &Operation)> = o
        .spec
        .members
        .iter()
        .filter_map(|m| member_status(&o.status, &m.node))
        .filter_map(|s| s.last_operation.as_ref().map(|op| (s.node.as_str(), op)))
        .filter(|(_, op)| op.id == cmd.id && op.result != OperationResult::InProgress)
        .collect();
    let answer = |result: OperationResult, message: String| {
        Some(Operation { id: cmd.id.clone(), kind: cmd.kind.clone(), result, message, time: Some(Time(o.now)) })
    };
    let failover = cmd.kind.is_failover();
    if failover && let Some((node, op)) = answers.first() {
        let result = OperationResult::from_ok(op.result == OperationResult::Succeeded);
        return answer(result, format!("{node}: {}", op.message));
    }
    let expected: Vec<&str> = o
        .spec
        .members
        .iter()
        .filter(|m| is_reporting(member_status(&o.status, &m.node), o.now))
        .map(|m| m.node.as_str())
        .collect();
    let answered: BTreeSet<&str> = answers.iter().map(|(n, _)| *n).collect();
    let all_in = !failover && !expected.is_empty() && expected.iter().all(|n| answered.contains(n));
    let timed_out = cmd.issued.as_ref().is_some_and(|t| age(o.now, t) >= COMMAND_TIMEOUT);
    if all_in {
        let ok = answers.iter().all(|(_, op)| op.result == OperationResult::Succeeded);
        let msg = answers.iter().map(|(n, op)| format!("{n}: {}", op.message)).collect::<Vec<_>>().join("; ");
        return answer(OperationResult::from_ok(ok), msg);
    }
    if timed_out {
        if answers.is_empty() {
            return answer(OperationResult::Failed, "no agent answered; check the roles before retrying".to_owned());
        }
        let missing: Vec<&str> = expected.iter().filter(|n| !answered.contains(*n)).copied().collect();
        let msg = answers.iter().map(|(n, op)| format!("{n}: {}", op.message)).collect::<Vec<_>>().join("; ");
        return answer(OperationResult::Failed, format!("{msg}; no answer from {}", missing.join(", ")));
    }
    None
}

/// How long until the command times out (None: no command).
pub fn command_deadline(o: &Observed, cmd: &PairCommand) -> Duration {
    let elapsed = cmd.issued.as_ref().map(|t| age(o.now, t)).unwrap_or_default();
    COMMAND_TIMEOUT.saturating_sub(elapsed)
}

/// When the next member would turn "not reporting" (for the requeue).
pub fn next_staleness(o: &Observed) -> Option<Duration> {
    o.spec
        .members
        .iter()
        .filter_map(|m| member_status(&o.status, &m.node))
        .filter_map(|s| s.last_seen.as_ref())
        .map(|t| NOT_REPORTING_AFTER.saturating_sub(age(o.now, t)))
        .filter(|d| !d.is_zero())
        .min()
}

/// While the pair's Lease changed less than [`HANDOVER_SETTLE`] ago: how long until
/// that has passed (a reconcile is due then, in case the new holder never reports).
pub fn next_settle(o: &Observed) -> Option<Duration> {
    let t = o.lease.as_ref()?.renew_time?;
    let since = age(o.now, &Time(t));
    HANDOVER_SETTLE.checked_sub(since).filter(|d| !d.is_zero())
}

/// The status the operator owns, built from the parts; `members` stays empty (agents
/// own their entries).
#[allow(clippy::too_many_arguments)]
pub fn operator_status(
    o: &Observed,
    a: &Assessment,
    revision: &str,
    transition: Option<havip_crds::Transition>,
    command: Option<PairCommand>,
    last_operation: Option<Operation>,
    key_rotation: Option<KeyRotation>,
) -> HAPairStatus {
    HAPairStatus {
        phase: Some(a.phase),
        active: a.active.clone(),
        standby: (!a.standbys.is_empty()).then(|| a.standbys.join(",")),
        epoch: Some(a.epoch),
        vips: Some(i32::try_from(o.vips.len()).unwrap_or(i32::MAX)),
        conditions: conditions(o, a, revision),
        last_transition: transition,
        last_operation,
        config_revision: Some(revision.to_owned()),
        observed_generation: o.generation,
        command,
        key_rotation,
        members: Vec::new(),
    }
}

/// The operator's part of a status with every timestamp removed: two statuses that
/// differ only in timestamps need no write.
pub fn without_timestamps(s: &HAPairStatus) -> HAPairStatus {
    let mut s = s.clone();
    s.members.clear();
    for c in &mut s.conditions {
        c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
    }
    if let Some(t) = &mut s.last_transition {
        t.time = None;
    }
    if let Some(op) = &mut s.last_operation {
        op.time = None;
    }
    if let Some(c) = &mut s.command {
        c.issued = None;
    }
    if let Some(k) = &mut s.key_rotation {
        k.started = None;
    }
    s
}

/// A random 32-byte key as 64 lowercase hex digits.
pub fn random_key_hex() -> Result<String, crate::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| crate::Error::Random(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests;
