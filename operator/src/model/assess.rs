//! The assessment of one observation: who is active, who is a ready standby, which
//! members report and what is wrong — the basis of the phase, the conditions and every
//! decision. Pure.

use super::observed::{HANDOVER_SETTLE, NOT_REPORTING_AFTER, Observed, age, member_status};
use super::spec::member_addresses;
use havip_crds::hapair::MemberStatus;
use havip_crds::{MemberAlarm, MemberRole, Phase, VipState, reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::time::Duration;
/// Whether a member reports: it has an entry whose `lastSeen` is recent (an entry
/// without `lastSeen` counts as reporting: its age cannot be told).
pub fn is_reporting(s: Option<&MemberStatus>, now: Timestamp) -> bool {
    s.is_some_and(|s| s.last_seen.as_ref().is_none_or(|t| age(now, t) <= NOT_REPORTING_AFTER))
}

/// What is wrong with a member's BGP speaker, as its agent reported it: it could not be
/// asked, has no established session, or does not advertise a VIP the member holds.
pub(super) fn speaker_problem(b: &havip_crds::hapair::SpeakerStatus) -> Option<String> {
    let name = b.speaker.as_deref().unwrap_or("BGP speaker");
    if let Some(e) = &b.error {
        return Some(format!("its {name} cannot be asked: {e}"));
    }
    if !b.sessions.iter().any(|s| s.established) {
        return Some(format!("its {name} has no established BGP session ({} configured)", b.sessions.len()));
    }
    let missing: Vec<&str> = b.advertised.iter().filter(|a| a.peers.is_empty()).map(|a| a.address.as_str()).collect();
    (!missing.is_empty()).then(|| format!("its {name} does not advertise {}", missing.join(", ")))
}

pub(super) fn protocol_major(v: &str) -> &str {
    v.split('.').next().unwrap_or(v)
}

/// While the pair's Lease changed less than [`HANDOVER_SETTLE`] ago: how long until
/// that has passed (a reconcile is due then, in case the new holder never reports).
pub fn next_settle(o: &Observed) -> Option<Duration> {
    let t = o.lease.as_ref()?.renew_time?;
    let since = age(o.now, &Time(t));
    HANDOVER_SETTLE.checked_sub(since).filter(|d| !d.is_zero())
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

pub(super) fn is_in_maintenance(o: &Observed, node: &str) -> bool {
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
        push(reason::ADDRESS_MISSING, missing);
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
        push(reason::NO_READY_STANDBY, format!("no ready standby: {}", not_ready.join("; ")));
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
                push(reason::MEMBER_ALARM, format!("{} raises alarm {a}", s.node));
            }
        }
    }
    for s in &reporting {
        if let Some(problem) = s.bgp.as_ref().and_then(speaker_problem) {
            let who = if s.role == Some(MemberRole::Active) { "holds the routed VIPs, but" } else { "(a standby):" };
            push(reason::BGP_NOT_ADVERTISED, format!("{} {who} {problem}", s.node));
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
