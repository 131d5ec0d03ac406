//! What the plugin prints: the readable status view, the `list` table, and the JSON
//! and YAML forms of both.
//!
//! `-o json|yaml` prints, for `status PAIR`, the HAPair object as the API serves it
//! (without `metadata.managedFields`, as kubectl does), and for `status` a `v1` `List`
//! of them: scripts read the same fields as with `kubectl get hapair -o json`. `list
//! -o json|yaml` prints the table's data, one [`PairSummary`] per pair under `items`.

use havip_crds::hapair::MemberStatus;
use havip_crds::{HAPair, HAPairStatus, MemberAlarm, Phase, Transition, condition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// A member's own entry of the pair's status.
pub fn member_status<'a>(status: &'a HAPairStatus, node: &str) -> Option<&'a MemberStatus> {
    status.members.iter().find(|m| m.node == node)
}

/// How long ago `t` was, `5m0s`; `-` when unknown.
pub fn ago(now: Timestamp, t: Option<&Time>) -> String {
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

fn table(rows: &[Vec<String>], indent: &str, gap: usize) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::from(indent);
        for (c, cell) in r.iter().enumerate() {
            line.push_str(cell);
            if c + 1 < r.len() {
                line.push_str(
                    &" ".repeat(widths.get(c).copied().unwrap_or(0).saturating_sub(cell.chars().count()) + gap),
                );
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
        let s = member_status(&st, &m.node);
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
        if let Some(to) = &s.draining_to {
            whys.push(format!("  {}: drains its established connections through {to}", m.node));
        }
        if let Some(from) = &s.forwarding_to {
            whys.push(format!("  {}: forwards the established connections of {from} to it (a drain)", m.node));
        }
        if let Some(b) = &s.bgp {
            whys.push(format!("  {}: {}", m.node, speaker_line(b)));
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
    out.push_str(&table(&rows, "  ", 2));
    if !whys.is_empty() {
        out.push_str("  member transitions:\n");
        for w in whys {
            out.push_str(&w);
            out.push('\n');
        }
    }
    out
}

/// A member's BGP speaker in one line: its sessions, and what it advertises to whom.
pub fn speaker_line(b: &havip_crds::hapair::SpeakerStatus) -> String {
    let name = b.speaker.as_deref().unwrap_or("BGP speaker");
    if let Some(e) = &b.error {
        return format!("{name}: cannot be asked: {e}");
    }
    let sessions: Vec<String> = b
        .sessions
        .iter()
        .map(|s| if s.established { s.peer.clone() } else { format!("{} {}", s.peer, s.state) })
        .collect();
    let up = b.sessions.iter().filter(|s| s.established).count();
    let mut line = format!("{name}: {up}/{} sessions up ({})", b.sessions.len(), sessions.join(", "));
    for a in &b.advertised {
        match a.peers.as_slice() {
            [] => line.push_str(&format!("; {} NOT advertised", a.address)),
            peers => line.push_str(&format!("; {} advertised to {}", a.address, peers.join(", "))),
        }
    }
    line
}

/// One pair's line of `kubectl havip list`, and its item in `list -o json|yaml`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PairSummary {
    /// The HAPair's name.
    pub name: String,
    /// `status.phase` (`null` until the operator assessed the pair).
    pub phase: Option<String>,
    /// `spec.paused`: the operator refuses moves.
    pub paused: bool,
    /// The member that holds the VIPs (`status.active`).
    pub active: Option<String>,
    /// The members ready to take over (`status.standby`, split).
    pub standby: Vec<String>,
    /// The fencing epoch (`status.epoch`).
    pub epoch: Option<i64>,
    /// The number of FloatingIPs (`status.vips`).
    pub vips: Option<i32>,
    /// The last change of the active member (`status.lastTransition`: from, to, reason,
    /// epoch, time), `null` if there was none.
    pub last_transition: Option<Transition>,
}

impl PairSummary {
    /// The summary of `pair`.
    pub fn of(pair: &HAPair) -> Self {
        let st = pair.status.clone().unwrap_or_default();
        Self {
            name: pair.name_any(),
            phase: st.phase.map(|p| p.as_str().to_owned()),
            paused: pair.spec.paused,
            active: st.active.filter(|a| !a.is_empty()),
            standby: st
                .standby
                .as_deref()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            epoch: st.epoch,
            vips: st.vips,
            last_transition: st.last_transition,
        }
    }
}

/// `list -o json|yaml`: `{"items": [PairSummary…]}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct PairList {
    /// One per pair, by name.
    pub items: Vec<PairSummary>,
}

fn or_dash(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("-").to_owned()
}

/// The `list` table: NAME, PHASE, ACTIVE, EPOCH, VIPS, LAST FAILOVER (how long ago the
/// active member last changed), REASON (why). `wide` adds STANDBY, the move (FROM→TO)
/// and its time (RFC 3339).
pub fn render_list(pairs: &[HAPair], now: Timestamp, wide: bool) -> String {
    let mut header = vec!["NAME", "PHASE", "ACTIVE"];
    if wide {
        header.push("STANDBY");
    }
    header.extend(["EPOCH", "VIPS", "LAST FAILOVER", "REASON"]);
    if wide {
        header.extend(["MOVE", "AT"]);
    }
    let mut rows = vec![header.into_iter().map(str::to_owned).collect::<Vec<_>>()];
    for p in pairs {
        let s = PairSummary::of(p);
        let phase = s.phase.clone().unwrap_or_else(|| "Unknown".to_owned());
        let mut row = vec![
            s.name.clone(),
            if s.paused { format!("{phase}(paused)") } else { phase },
            or_dash(s.active.as_deref()),
        ];
        if wide {
            row.push(if s.standby.is_empty() { "-".to_owned() } else { s.standby.join(",") });
        }
        let t = s.last_transition.as_ref();
        row.extend([
            s.epoch.map(|e| e.to_string()).unwrap_or_else(|| "-".into()),
            s.vips.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
            t.map(|t| ago(now, t.time.as_ref())).unwrap_or_else(|| "-".into()),
            t.map(|t| t.reason.to_string()).unwrap_or_else(|| "-".into()),
        ]);
        if wide {
            row.push(
                t.map(|t| format!("{}→{}", or_dash(Some(&t.from)), or_dash(Some(&t.to)))).unwrap_or_else(|| "-".into()),
            );
            row.push(
                t.and_then(|t| t.time.as_ref())
                    .map(|x| x.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                    .unwrap_or_else(|| "-".into()),
            );
        }
        rows.push(row);
    }
    table(&rows, "", 3)
}

/// The pair as the API serves it, without `metadata.managedFields`.
pub fn object_value(pair: &HAPair) -> serde_json::Value {
    let mut p = pair.clone();
    p.metadata.managed_fields = None;
    serde_json::to_value(&p).unwrap_or(serde_json::Value::Null)
}

/// `status -o json|yaml`: one pair's object, or a `v1` `List` of every pair's.
pub fn status_value(pairs: &[HAPair], single: bool) -> serde_json::Value {
    match (single, pairs) {
        (true, [p]) => object_value(p),
        _ => serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": ""},
            "items": pairs.iter().map(object_value).collect::<Vec<_>>(),
        }),
    }
}

/// `list -o json|yaml`.
pub fn list_value(pairs: &[HAPair]) -> serde_json::Value {
    let list = PairList { items: pairs.iter().map(PairSummary::of).collect() };
    serde_json::to_value(&list).unwrap_or(serde_json::Value::Null)
}

/// A machine-readable format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Pretty-printed JSON.
    Json,
    /// YAML.
    Yaml,
}

/// `value` as JSON (pretty, newline-terminated) or YAML.
pub fn encode(value: &serde_json::Value, format: Format) -> Result<String, String> {
    match format {
        Format::Json => serde_json::to_string_pretty(value).map(|s| s + "\n").map_err(|e| e.to_string()),
        Format::Yaml => serde_yaml::to_string(value).map_err(|e| e.to_string()),
    }
}

/// A pair with every kind of status detail (for tests).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn sample_pair() -> HAPair {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{Format, PairList, encode, list_value, render_list, render_status, sample_pair, status_value};
    use havip_crds::HAPair;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn renders_a_readable_member_view() {
        let now: Timestamp = "2027-01-15T08:00:00Z".parse().unwrap();
        let text = render_status(&sample_pair(), now);
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
    fn a_members_bgp_speaker_reads_in_one_line() {
        use havip_crds::hapair::{BgpAdvertisement, BgpSession, SpeakerStatus};
        let b = SpeakerStatus {
            speaker: Some("FRR".into()),
            error: None,
            sessions: vec![
                BgpSession { peer: "10.0.0.254".into(), state: "Established".into(), established: true },
                BgpSession { peer: "10.0.1.254".into(), state: "Active".into(), established: false },
            ],
            advertised: vec![
                BgpAdvertisement { address: "203.0.113.10/32".into(), peers: vec!["10.0.0.254".into()] },
                BgpAdvertisement { address: "203.0.113.11/32".into(), peers: vec![] },
            ],
        };
        assert_eq!(
            super::speaker_line(&b),
            "FRR: 1/2 sessions up (10.0.0.254, 10.0.1.254 Active); 203.0.113.10/32 advertised to 10.0.0.254; \
             203.0.113.11/32 NOT advertised"
        );
        let down = SpeakerStatus { error: Some("no BGP speaker found".into()), ..SpeakerStatus::default() };
        assert_eq!(super::speaker_line(&down), "BGP speaker: cannot be asked: no BGP speaker found");
    }

    fn two() -> Vec<HAPair> {
        let a = sample_pair();
        let mut b: HAPair = serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "HAPair",
            "metadata": {"name": "db", "managedFields": [{"manager": "x", "operation": "Apply"}]},
            "spec": {"paused": true, "members": [{"node": "c", "priority": 2}, {"node": "d", "priority": 1}]},
        }))
        .unwrap();
        b.metadata.resource_version = Some("7".into());
        vec![b, a]
    }

    #[test]
    fn lists_every_pair_like_kubectl_get() {
        let now: Timestamp = "2027-01-15T08:00:00Z".parse().unwrap();
        let text = render_list(&two(), now, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0], "NAME   PHASE             ACTIVE   EPOCH   VIPS   LAST FAILOVER   REASON");
        assert_eq!(lines[1], "db     Unknown(paused)   -        -       -      -               -");
        assert_eq!(lines[2], "web    Degraded          a        3       1      5m0s            PlannedFailover");
        let wide = render_list(&two(), now, true);
        assert!(wide.lines().next().unwrap().contains("STANDBY"), "{wide}");
        assert!(wide.contains("b→a") && wide.contains("2027-01-15T07:55:00Z"), "{wide}");
    }

    #[test]
    fn machine_readable_output_parses_back() {
        let pairs = two();
        let list = list_value(&pairs);
        for f in [Format::Json, Format::Yaml] {
            let text = encode(&list, f).unwrap();
            let back: PairList = match f {
                Format::Json => serde_json::from_str(&text).unwrap(),
                Format::Yaml => serde_yaml::from_str(&text).unwrap(),
            };
            assert_eq!(back.items.len(), 2);
            assert_eq!(back.items[0].name, "db");
            assert!(back.items[0].paused && back.items[0].phase.is_none() && back.items[0].last_transition.is_none());
            let web = &back.items[1];
            assert_eq!(
                (web.phase.as_deref(), web.active.as_deref(), web.epoch),
                (Some("Degraded"), Some("a"), Some(3))
            );
            let t = web.last_transition.as_ref().unwrap();
            assert_eq!((t.from.as_str(), t.to.as_str(), t.reason.as_str()), ("b", "a", "PlannedFailover"));
        }
        assert_eq!(list["items"][1]["lastTransition"]["time"], "2027-01-15T07:55:00Z");
        assert!(list["items"][0]["active"].is_null(), "absent values are null, not missing: {list}");

        let one = status_value(&pairs[..1], true);
        assert_eq!(one["kind"], "HAPair");
        assert_eq!(one["metadata"]["name"], "db");
        assert!(one["metadata"].get("managedFields").is_none(), "{one}");
        let back: HAPair = serde_yaml::from_str(&encode(&one, Format::Yaml).unwrap()).unwrap();
        assert_eq!(back.metadata.resource_version.as_deref(), Some("7"));
        let all = status_value(&pairs, false);
        assert_eq!((all["kind"].as_str(), all["items"].as_array().map(Vec::len)), (Some("List"), Some(2)));
        assert_eq!(all["items"][1]["status"]["active"], "a");
        let empty = status_value(&[], false);
        assert_eq!(empty["items"], serde_json::json!([]));
    }
}
