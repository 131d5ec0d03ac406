//! Imperative requests (annotations; their grammar is [`havip_crds::request`]): which
//! one is next, the decision (refuse, command, maintenance …) and the answer to a
//! command from what the members report. Pure.

use super::assess::{Assessment, is_reporting, protocol_major, standby_problem};
use super::keys::key_progress;
use super::observed::{COMMAND_TIMEOUT, Observed, age, member_status};
use havip_crds::request::{Request, RequestKind, handled_ids, parse_request, raw_id};
use havip_crds::{Operation, OperationResult, PairCommand};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeSet;
use std::time::Duration;
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
        let raw_id = raw_id(value);
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
