//! The `kubectl havip` plugin's parts that are worth testing on their own: request
//! ids, writing a request annotation, waiting for its answer, the maintenance patch,
//! and the readable status view.

use crate::Error;
use crate::model::{self, RequestKind};
use futures::StreamExt;
use havip_crds::{HAPair, MemberAlarm, Operation, OperationResult, Phase, condition, manager};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use std::fmt::Write as _;
use std::time::Duration;

/// A fresh request id: the time in base 36 and 4 random bytes, e.g. `lz3k9q-1f2e3d4c`.
pub fn request_id() -> Result<String, Error> {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).map_err(|e| Error::Random(e.to_string()))?;
    let mut n = u64::try_from(Timestamp::now().as_millisecond()).unwrap_or(0);
    let mut t = Vec::new();
    while n > 0 {
        let d = u8::try_from(n % 36).unwrap_or(0);
        t.push(if d < 10 { b'0' + d } else { b'a' + d - 10 });
        n /= 36;
    }
    t.reverse();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{}-{hex}", String::from_utf8_lossy(&t)))
}

/// Writes the request annotation (`<id>` or `<id>:<target>`) with the plugin's field
/// manager.
pub async fn annotate(api: &Api<HAPair>, pair: &str, kind: RequestKind, value: &str) -> Result<(), Error> {
    let patch = serde_json::json!({
        "apiVersion": HAPair::api_version(&()),
        "kind": HAPair::kind(&()),
        "metadata": {"name": pair, "annotations": {kind.annotation(): value}},
    });
    api.patch(pair, &PatchParams::apply(manager::PLUGIN).force(), &Patch::Apply(&patch))
        .await
        .map_err(|source| Error::Annotate { kind: "HAPair", name: pair.to_owned(), source: Box::new(source) })?;
    Ok(())
}

/// Whether an answer is final (not `InProgress`).
pub fn is_final(op: &Operation) -> bool {
    op.result != OperationResult::InProgress
}

/// Watches `pair` until `status.lastOperation.id == id` with a final result, or the
/// timeout. Returns the last answer seen for that id (possibly `InProgress`) on timeout
/// as `Err`.
pub async fn wait_for_answer(
    api: &Api<HAPair>,
    pair: &str,
    id: &str,
    timeout: Duration,
    mut on_progress: impl FnMut(&Operation),
) -> Result<Operation, Option<Operation>> {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={pair}"));
    let mut stream = watcher::watcher(api.clone(), cfg).boxed();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last: Option<Operation> = None;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next()).await;
        let Ok(Some(ev)) = next else { return Err(last) };
        let obj = match ev {
            Ok(Event::Apply(o) | Event::InitApply(o)) => o,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "watch error; the watcher retries");
                continue;
            }
        };
        let Some(op) = obj.status.and_then(|s| s.last_operation).filter(|op| op.id == id) else { continue };
        if is_final(&op) {
            return Ok(op);
        }
        if last.as_ref() != Some(&op) {
            on_progress(&op);
        }
        last = Some(op);
    }
}

/// The merge patch that sets `spec.members[].maintenance` for `node`: the whole
/// (atomic) member list with that one flag changed, guarded by the object's
/// `resourceVersion` so that a concurrent edit of the list makes it fail (409)
/// instead of being overwritten.
pub fn maintenance_patch(pair: &HAPair, node: &str, on: bool) -> Result<serde_json::Value, Error> {
    if !pair.spec.members.iter().any(|m| m.node == node) {
        return Err(Error::Usage(format!("{node} is not a member of HAPair {}", pair.name_any())));
    }
    let mut members = pair.spec.members.clone();
    for m in &mut members {
        if m.node == node {
            m.maintenance = on;
        }
    }
    Ok(serde_json::json!({
        "metadata": {"resourceVersion": pair.resource_version()},
        "spec": {"members": members},
    }))
}

/// Applies [`maintenance_patch`] with the plugin's field manager, re-reading and
/// retrying when the pair changed in between.
pub async fn set_maintenance(api: &Api<HAPair>, pair: &str, node: &str, on: bool) -> Result<(), Error> {
    let pp = PatchParams { field_manager: Some(manager::PLUGIN.to_owned()), ..PatchParams::default() };
    let mut attempts = 0;
    loop {
        let current = api.get(pair).await.map_err(|source| Error::Get {
            kind: "HAPair",
            name: pair.to_owned(),
            source: Box::new(source),
        })?;
        let patch = maintenance_patch(&current, node, on)?;
        match api.patch(pair, &pp, &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(e) if crate::error::is_status(&e, 409) && attempts < 5 => attempts += 1,
            Err(source) => {
                return Err(Error::PatchSpec { kind: "HAPair", name: pair.to_owned(), source: Box::new(source) });
            }
        }
    }
}

fn ago(now: Timestamp, t: Option<&Time>) -> String {
    let Some(t) = t else { return "-".to_owned() };
    let s = (now.as_second() - t.0.as_second()).max(0);
    if s >= 86400 {
        format!("{}d", s / 86400)
    } else if s >= 3600 {
        format!("{}h{}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::from("  ");
        for (c, cell) in r.iter().enumerate() {
            line.push_str(cell);
            if c + 1 < r.len() {
                line.push_str(&" ".repeat(widths[c] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A readable view of one pair: phase and why, the last transition and operation, and
/// one line per member (role, epoch, readiness, paths heard, key, revision, last seen,
/// alarms), then each member's last role change and why.
pub fn render_status(pair: &HAPair, now: Timestamp) -> String {
    let name = pair.name_any();
    let st = pair.status.clone().unwrap_or_default();
    let mut out = String::new();
    let phase = st.phase.map(Phase::as_str).unwrap_or("Unknown");
    let _ = writeln!(
        out,
        "HAPair {name}: {phase}, active {}, epoch {}, {} VIP(s), revision {}{}",
        st.active.as_deref().unwrap_or("(none)"),
        st.epoch.unwrap_or(0),
        st.vips.unwrap_or(0),
        st.config_revision.as_deref().unwrap_or("-"),
        if pair.spec.paused { ", PAUSED" } else { "" }
    );
    let cond = |t: &str| st.conditions.iter().find(|c| c.type_ == t);
    if let Some(c) = cond(condition::READY) {
        let _ = writeln!(out, "  Ready={} ({}): {}", c.status, c.reason, c.message);
    }
    for t in [condition::DEGRADED, condition::SUSPENDED, condition::INVALID_SPEC, condition::CONFIG_APPLIED] {
        if let Some(c) = cond(t).filter(|c| (c.status == "True") != (t == condition::CONFIG_APPLIED)) {
            let _ = writeln!(out, "  {t}={} ({}): {}", c.status, c.reason, c.message);
        }
    }
    match &st.last_transition {
        Some(t) => {
            let _ = writeln!(
                out,
                "  last transition: {} → {} at epoch {}, {} ago: {}",
                if t.from.is_empty() { "(nobody)" } else { &t.from },
                if t.to.is_empty() { "(nobody)" } else { &t.to },
                t.epoch,
                ago(now, t.time.as_ref()),
                t.reason
            );
        }
        None => {
            let _ = writeln!(out, "  last transition: none");
        }
    }
    if let Some(op) = &st.last_operation {
        let _ = writeln!(
            out,
            "  last operation: {} {} {} ({} ago): {}",
            op.kind,
            op.id,
            op.result,
            ago(now, op.time.as_ref()),
            op.message
        );
    }
    if let Some(c) = &st.command {
        let _ = writeln!(
            out,
            "  pending command: {} {}{} (issued {} ago)",
            c.kind,
            c.id,
            c.target.as_deref().map(|t| format!(" → {t}")).unwrap_or_default(),
            ago(now, c.issued.as_ref())
        );
    }
    if let Some(k) = &st.key_rotation {
        let _ =
            writeln!(out, "  key rotation {} to key {} running for {}", k.id, k.key_id, ago(now, k.started.as_ref()));
    }
    let mut rows = vec![
        ["NODE", "PRIO", "ROLE", "EPOCH", "READY", "HEARD", "KEY", "CONFIG", "SEEN", "ALARMS"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect::<Vec<_>>(),
    ];
    let mut members: Vec<_> = pair.spec.members.iter().collect();
    members.sort_by_key(|m| std::cmp::Reverse(m.priority));
    let mut whys = Vec::new();
    for m in &members {
        let s = model::member_status(&st, &m.node);
        let role = s.and_then(|s| s.role.as_ref()).map(|r| r.as_str()).unwrap_or("(no report)").to_owned();
        let role = if m.maintenance { format!("{role}+maint") } else { role };
        let Some(s) = s else {
            rows.push(vec![
                m.node.clone(),
                m.priority.to_string(),
                role,
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "never".into(),
                "-".into(),
            ]);
            continue;
        };
        let ready = format!("{}/{}", s.ready.iter().filter(|r| r.ready).count(), s.ready.len());
        let heard = if s.heard.is_empty() {
            "-".to_owned()
        } else {
            s.heard
                .iter()
                .map(|h| if h.heard { h.path.clone() } else { format!("{}!", h.path) })
                .collect::<Vec<_>>()
                .join(",")
        };
        let config = match (&s.applied_revision, &st.config_revision) {
            (Some(a), Some(c)) if a == c => "current".to_owned(),
            (Some(a), _) => format!("old {a}"),
            (None, _) => "-".to_owned(),
        };
        let alarms = if s.alarms.is_empty() {
            "-".to_owned()
        } else {
            s.alarms.iter().map(MemberAlarm::as_str).collect::<Vec<_>>().join(",")
        };
        rows.push(vec![
            m.node.clone(),
            m.priority.to_string(),
            role,
            s.epoch.map(|e| e.to_string()).unwrap_or_else(|| "-".into()),
            ready,
            heard,
            s.key_id.map(|k| k.to_string()).unwrap_or_else(|| "-".into()),
            config,
            ago(now, s.last_seen.as_ref()),
            alarms,
        ]);
        if let Some(t) = &s.last_transition {
            whys.push(format!(
                "  {}: {} → {} at epoch {}, {} ago: {}",
                m.node,
                if t.from.is_empty() { "(nobody)" } else { &t.from },
                if t.to.is_empty() { "(nobody)" } else { &t.to },
                t.epoch,
                ago(now, t.time.as_ref()),
                t.reason
            ));
        }
        for r in s.ready.iter().filter(|r| !r.ready) {
            whys.push(format!(
                "  {}: not ready for {}{}",
                m.node,
                r.address,
                r.reason.as_deref().map(|x| format!(": {x}")).unwrap_or_default()
            ));
        }
    }
    for s in st.members.iter().filter(|s| !pair.spec.members.iter().any(|m| m.node == s.node)) {
        rows.push(vec![
            s.node.clone(),
            "-".into(),
            format!("{} (not a member)", s.role.as_ref().map(|r| r.as_str()).unwrap_or("?")),
            s.epoch.map(|e| e.to_string()).unwrap_or_else(|| "-".into()),
            "-".into(),
            "-".into(),
            s.key_id.map(|k| k.to_string()).unwrap_or_else(|| "-".into()),
            "-".into(),
            ago(now, s.last_seen.as_ref()),
            "-".into(),
        ]);
    }
    out.push_str(&table(&rows));
    if !whys.is_empty() {
        out.push_str("  member transitions:\n");
        for w in whys {
            out.push_str(&w);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pair() -> HAPair {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "HAPair",
            "metadata": {"name": "web"},
            "spec": {"members": [{"node": "a", "priority": 200}, {"node": "b", "priority": 100, "maintenance": true}]},
            "status": {
                "phase": "Degraded", "active": "a", "epoch": 3, "vips": 1, "configRevision": "00000000000000aa",
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "NoReadyStandby", "message": "a is active; ready standby: none", "lastTransitionTime": "2027-01-15T08:00:00Z"},
                    {"type": "Degraded", "status": "True", "reason": "NoReadyStandby", "message": "no ready standby: b is in maintenance", "lastTransitionTime": "2027-01-15T08:00:00Z"},
                    {"type": "ConfigApplied", "status": "True", "reason": "AsExpected", "message": "ok", "lastTransitionTime": "2027-01-15T08:00:00Z"}
                ],
                "lastTransition": {"from": "b", "to": "a", "reason": "PlannedFailover", "epoch": 3, "time": "2027-01-15T07:55:00Z"},
                "lastOperation": {"id": "r1", "kind": "PlannedFailover", "result": "Succeeded", "message": "b: handed over", "time": "2027-01-15T07:55:00Z"},
                "members": [
                    {"node": "a", "role": "Active", "epoch": 3, "ready": [{"address": "10.0.0.10/24", "ready": true}],
                     "heard": [{"path": "data", "heard": true}, {"path": "mgmt", "heard": false}], "keyId": 1,
                     "appliedRevision": "00000000000000aa", "lastSeen": "2027-01-15T07:59:50Z",
                     "lastTransition": {"from": "b", "to": "a", "reason": "PlannedFailover", "epoch": 3}},
                    {"node": "b", "role": "Maintenance", "epoch": 3, "ready": [{"address": "10.0.0.10/24", "ready": false, "reason": "maintenance"}],
                     "keyId": 1, "appliedRevision": "00000000000000a0", "alarms": ["ClockSkew"], "lastSeen": "2027-01-15T07:59:00Z"},
                    {"node": "old", "role": "Standby", "lastSeen": "2027-01-10T07:59:00Z"}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn renders_a_readable_member_view() {
        let now: Timestamp = "2027-01-15T08:00:00Z".parse().unwrap();
        let text = render_status(&pair(), now);
        for phrase in [
            "HAPair web: Degraded, active a, epoch 3, 1 VIP(s), revision 00000000000000aa",
            "Degraded=True (NoReadyStandby): no ready standby: b is in maintenance",
            "last transition: b → a at epoch 3, 5m0s ago: PlannedFailover",
            "last operation: PlannedFailover r1 Succeeded (5m0s ago): b: handed over",
            "NODE  PRIO  ROLE",
            "data,mgmt!",
            "Maintenance+maint",
            "old 00000000000000a0",
            "ClockSkew",
            "Standby (not a member)",
            "b: not ready for 10.0.0.10/24: maintenance",
            "a: b → a at epoch 3",
        ] {
            assert!(text.contains(phrase), "missing {phrase:?} in:\n{text}");
        }
        assert!(!text.contains("ConfigApplied"), "a True ConfigApplied is not news:\n{text}");
    }

    #[test]
    fn request_ids_are_fresh_and_valid() {
        let a = request_id().unwrap();
        let b = request_id().unwrap();
        assert_ne!(a, b);
        assert!(model::parse_request(RequestKind::Failover, &a).is_ok(), "{a}");
    }

    #[test]
    fn maintenance_patch_changes_one_flag_under_the_resource_version() {
        let mut p = pair();
        p.metadata.resource_version = Some("42".to_owned());
        let patch = maintenance_patch(&p, "b", false).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(patch["spec"]["members"][1]["node"], "b");
        assert_eq!(patch["spec"]["members"][1]["maintenance"], false);
        assert_eq!(patch["spec"]["members"][0]["priority"], 200);
        assert!(maintenance_patch(&p, "zz", true).is_err());
    }
}
