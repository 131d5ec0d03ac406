//! The Events a reconcile publishes, as data: what an operation's answer, a phase
//! change, a role change, a member's role change, a missing Node and an invalid spec
//! say. Pure: the controller publishes them ([`crate::context::Context::event`]).

use super::assess::Assessment;
use super::observed::Observed;
use havip_crds::{
    HAPairStatus, MemberRole, Operation, OperationResult, PairCommand, Phase, TransitionReason, condition, reason,
};
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
/// An Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ev {
    /// Warning (else Normal).
    pub warning: bool,
    /// CamelCase reason.
    pub reason: String,
    /// What the operator did (CamelCase).
    pub action: &'static str,
    /// A sentence.
    pub note: String,
}

impl Ev {
    /// A Normal Event.
    pub fn normal(reason: impl Into<String>, action: &'static str, note: impl Into<String>) -> Self {
        Self { warning: false, reason: reason.into(), action, note: note.into() }
    }
    /// A Warning Event.
    pub fn warning(reason: impl Into<String>, action: &'static str, note: impl Into<String>) -> Self {
        Self { warning: true, reason: reason.into(), action, note: note.into() }
    }
}

/// How long a role change waits for the new active to report its cause before it is
/// announced with the generic reason.
pub const ROLE_CHANGE_GRACE: Duration = Duration::from_secs(5);

/// Role changes that are news somebody must look at: the VIPs moved because something
/// broke.
pub fn is_warning_transition(reason: &TransitionReason) -> bool {
    matches!(
        reason,
        TransitionReason::PeerLost
            | TransitionReason::CarrierLost
            | TransitionReason::GatewayLost
            | TransitionReason::VipUnhealthy
            | TransitionReason::Fenced
            | TransitionReason::DualActiveResolved
    )
}

/// The Event that reports an operation's answer (or its start).
pub fn operation_event(op: &Operation) -> Ev {
    let note = format!("{} {}: {}", op.kind, op.id, op.message);
    match op.result {
        OperationResult::Succeeded => Ev::normal(format!("{}Succeeded", op.kind), "Answer", note),
        OperationResult::InProgress => Ev::normal(format!("{}Started", op.kind), "Act", note),
        OperationResult::Refused => Ev::warning(format!("{}Refused", op.kind), "Refuse", note),
        OperationResult::Failed | OperationResult::Other(_) => {
            Ev::warning(format!("{}Failed", op.kind), "Answer", note)
        }
    }
}

/// The Event that says a command went out to the members.
pub fn command_event(c: &PairCommand) -> Ev {
    Ev::normal(
        format!("{}Requested", c.kind),
        "Command",
        format!(
            "{} {}: asked {}{}",
            c.kind,
            c.id,
            if c.kind.is_failover() { "the active member" } else { "every member" },
            c.target.as_deref().map(|t| format!(" (target {t})")).unwrap_or_default()
        ),
    )
}

/// The phase change from `previous` to `desired`, if any.
pub fn phase_event(previous: &HAPairStatus, desired: &HAPairStatus, a: &Assessment) -> Option<Ev> {
    if previous.phase == desired.phase {
        return None;
    }
    let phase = desired.phase.unwrap_or(Phase::Pending);
    let bad = matches!(phase, Phase::Degraded | Phase::Failed | Phase::Suspended);
    let from = previous.phase.map(Phase::as_str).unwrap_or("(none)");
    let note = format!("{from} → {}: {}", phase.as_str(), a.phase_message);
    Some(if bad { Ev::warning(phase.as_str(), "Assess", note) } else { Ev::normal(phase.as_str(), "Assess", note) })
}

/// What a role change announcement decided: the Event, or how long until it is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Announcement {
    /// Nothing to announce.
    None,
    /// Announce now (and forget the pending epoch).
    Now(Ev),
    /// Wait this long for the new active to report the cause.
    Wait(Duration),
}

/// A role change is announced once its cause is known (the new active reports it),
/// or after [`ROLE_CHANGE_GRACE`] with the generic reason. `pending`: the epoch of a
/// role change seen but not announced yet.
pub fn role_change_announcement(
    transition: Option<&havip_crds::Transition>,
    pending: Option<i64>,
    now: Timestamp,
) -> Announcement {
    let (Some(epoch), Some(t)) = (pending, transition) else { return Announcement::None };
    if t.epoch != epoch {
        return Announcement::None;
    }
    let since = t.time.as_ref().map(|x| now.as_millisecond() - x.0.as_millisecond()).unwrap_or(0);
    let grace = i64::try_from(ROLE_CHANGE_GRACE.as_millis()).unwrap_or(i64::MAX);
    if t.reason == TransitionReason::RoleChange && since < grace {
        let left = u64::try_from(grace - since).unwrap_or(0);
        return Announcement::Wait(Duration::from_millis(left + 100));
    }
    let who = |s: &str| if s.is_empty() { "(nobody)".to_owned() } else { s.to_owned() };
    let note = format!("{} → {} (epoch {}): {}", who(&t.from), who(&t.to), t.epoch, t.reason);
    Announcement::Now(if is_warning_transition(&t.reason) || t.to.is_empty() {
        Ev::warning(t.reason.as_str(), "ObserveRoleChange", note)
    } else {
        Ev::normal(t.reason.as_str(), "ObserveRoleChange", note)
    })
}

/// Members whose reported role differs from the one last seen (`roles`, updated).
pub fn member_role_events(o: &Observed, roles: &mut BTreeMap<String, MemberRole>) -> Vec<Ev> {
    let mut out = Vec::new();
    for s in o.status.members.iter().filter(|s| o.spec.members.iter().any(|x| x.node == s.node)) {
        let Some(role) = s.role.clone() else { continue };
        if let Some(old) = roles.insert(s.node.clone(), role.clone())
            && old != role
        {
            out.push(Ev::normal(
                reason::MEMBER_ROLE_CHANGED,
                "ObserveRoleChange",
                format!("{}: {old} → {role} (epoch {})", s.node, s.epoch.unwrap_or(0)),
            ));
        }
    }
    out
}

/// Routed VIPs: which members' speakers advertise each VIP (to at least one peer), as the
/// members report it (`status.members[].bgp`, refreshed every 5 s); an Event when that
/// changes from what was last seen (`routes`, updated): `RouteMoved` when somebody
/// advertises it now, `RouteWithdrawn` (Warning) when nobody does any more. The first
/// sight of a VIP only records it.
pub fn route_events(o: &Observed, routes: &mut BTreeMap<String, BTreeSet<String>>) -> Vec<Ev> {
    let mut now: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut peers: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for s in o.status.members.iter().filter(|s| o.spec.members.iter().any(|x| x.node == s.node)) {
        for a in s.bgp.iter().flat_map(|b| b.advertised.iter()).filter(|a| !a.peers.is_empty()) {
            now.entry(a.address.clone()).or_default().insert(s.node.clone());
            peers.insert((a.address.clone(), s.node.clone()), a.peers.clone());
        }
    }
    let names = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(", ");
    let mut out = Vec::new();
    for (vip, was) in routes.iter() {
        match now.get(vip) {
            Some(by) if by != was => {
                let to: Vec<String> = by
                    .iter()
                    .map(|n| {
                        format!(
                            "{n} (to {})",
                            peers.get(&(vip.clone(), n.clone())).map(|p| p.join(", ")).unwrap_or_default()
                        )
                    })
                    .collect();
                out.push(Ev::normal(
                    reason::ROUTE_MOVED,
                    "ObserveRoute",
                    format!(
                        "{vip}: advertised by {}; was {}",
                        to.join(", "),
                        if was.is_empty() { "nobody".to_owned() } else { names(was) }
                    ),
                ));
            }
            None if !was.is_empty() => out.push(Ev::warning(
                reason::ROUTE_WITHDRAWN,
                "ObserveRoute",
                format!("{vip}: no member advertises it any more (was {})", names(was)),
            )),
            _ => {}
        }
    }
    // A VIP nobody advertises stays remembered (empty), so that its return is news.
    for (vip, was) in routes.iter_mut() {
        *was = now.get(vip).cloned().unwrap_or_default();
    }
    for (vip, by) in now {
        routes.entry(vip).or_insert(by);
    }
    out
}

/// A member Node that went missing since the last status (the condition was not
/// already raised).
pub fn member_lost_event(o: &Observed, previous: &HAPairStatus, a: &Assessment) -> Option<Ev> {
    let missing: Vec<&str> = o.nodes.iter().filter(|(_, n)| n.is_none()).map(|(k, _)| k.as_str()).collect();
    let already = previous
        .conditions
        .iter()
        .any(|c| c.type_ == condition::DEGRADED && c.reason == reason::MEMBER_LOST && c.status == "True");
    let lost = !missing.is_empty() && !already && a.degraded.first().is_some_and(|c| c.reason == reason::MEMBER_LOST);
    lost.then(|| {
        Ev::warning(reason::MEMBER_LOST, "Resolve", format!("member Node(s) {} do not exist", missing.join(", ")))
    })
}

/// The spec's problems, unless this generation was already reported invalid.
pub fn invalid_spec_event(o: &Observed, previous: &HAPairStatus) -> Option<Ev> {
    if o.spec_problems.is_empty() {
        return None;
    }
    let reported = previous
        .conditions
        .iter()
        .any(|c| c.type_ == condition::INVALID_SPEC && c.status == "True" && c.observed_generation == o.generation);
    (!reported).then(|| Ev::warning(reason::INVALID_SPEC, "Validate", o.spec_problems.join("; ")))
}
