//! The status the operator owns: conditions, the last transition, when to look again
//! (staleness, settling), and the status compared without its timestamps. Pure.

use super::assess::Assessment;
use super::observed::{NOT_REPORTING_AFTER, Observed, age, member_status};
use super::spec::published_addresses;
use havip_crds::{
    HAPairStatus, KeyRotation, MemberRole, Operation, PairCommand, Phase, TransitionReason, condition, reason,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use std::time::Duration;
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
    let ready_reason = if ready || !serving { a.phase.as_str() } else { reason::NO_READY_STANDBY };
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
    // The holder's own report of its last role change: roles in `from`/`to` (it became
    // Active under the Lease's epoch).
    let reported = member_status(&o.status, &holder)
        .and_then(|s| s.last_transition.as_ref())
        .filter(|t| t.epoch == lease.transitions && t.to == MemberRole::Active.as_str())
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
        member_addresses: published_addresses(o),
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

/// The entries of `status.members` whose node is no longer in `spec.members`, with their
/// positions (highest first, the order in which they can be removed one by one): a
/// departed member's agent stops writing its entry, so the operator removes it.
pub fn departed_members(o: &Observed) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = o
        .status
        .members
        .iter()
        .enumerate()
        .filter(|(_, s)| !o.spec.members.iter().any(|m| m.node == s.node))
        .map(|(i, s)| (i, s.node.clone()))
        .collect();
    out.reverse();
    out
}
