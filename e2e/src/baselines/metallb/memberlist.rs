//! What a speaker's log says about memberlist: who joined and who left.

use std::collections::BTreeSet;

/// The message of a speaker's log line about a memberlist event.
const MEMBERLIST_EVENT: &str = "node event - forcing sync";

/// One memberlist event a speaker logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberEvent {
    /// The member's node name.
    pub node: String,
    /// `NodeJoin`, `NodeLeave` or `NodeUpdate`.
    pub event: String,
}

/// The memberlist events in a speaker's log (its JSON lines), oldest first.
pub fn member_events(log: &str) -> Vec<MemberEvent> {
    log.lines()
        .filter(|l| l.contains(MEMBERLIST_EVENT))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("msg").and_then(|m| m.as_str()) == Some(MEMBERLIST_EVENT))
        .filter_map(|v| {
            Some(MemberEvent {
                node: v.get("node name")?.as_str()?.to_owned(),
                event: v.get("node event")?.as_str()?.to_owned(),
            })
        })
        .collect()
}

/// The members a speaker sees after `events` (joins and updates add, leaves remove).
pub fn members_after(events: &[MemberEvent]) -> BTreeSet<String> {
    let mut members = BTreeSet::new();
    for e in events {
        if e.event == "NodeLeave" {
            members.remove(&e.node);
        } else {
            members.insert(e.node.clone());
        }
    }
    members
}

#[cfg(test)]
mod tests {
    use super::{MemberEvent, member_events, members_after};
    use std::collections::BTreeSet;

    #[test]
    fn memberlist_view_follows_joins_and_leaves() {
        let log = r#"{"caller":"speakerlist.go:331","level":"info","msg":"node event - forcing sync","node addr":"10.1.0.10","node event":"NodeJoin","node name":"n0","ts":"2026-12-02T08:00:00Z"}
{"caller":"main.go:1","level":"info","msg":"something else","node name":"n7"}
not json at all, node event - forcing sync
{"caller":"speakerlist.go:331","level":"info","msg":"node event - forcing sync","node addr":"10.1.0.11","node event":"NodeJoin","node name":"n1","ts":"2026-12-02T08:00:01Z"}
{"caller":"speakerlist.go:331","level":"info","msg":"node event - forcing sync","node addr":"10.1.0.11","node event":"NodeLeave","node name":"n1","ts":"2026-12-02T08:00:09Z"}
"#;
        let events = member_events(log);
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[2], MemberEvent { node: "n1".into(), event: "NodeLeave".into() });
        assert_eq!(members_after(&events), BTreeSet::from(["n0".to_owned()]));
        assert_eq!(members_after(&events[..2]), BTreeSet::from(["n0".to_owned(), "n1".to_owned()]));
    }
}
