//! The request-annotation grammar the operator and the kubectl plugin share: which
//! annotations request an imperative action ([`annotation`], [`RequestKind`]), how a
//! value reads (`<id>` or `<id>:<target node>`: [`parse_request`]), and the record of
//! the ids the operator acted on ([`annotation::HANDLED`], [`handled_ids`]).
//!
//! Each value is a request id; the operator acts on a given id once and answers in
//! `status.lastOperation` (see `docs/kubernetes.md`).

use crate::OperationKind;
use std::collections::BTreeMap;

/// Annotations on an HAPair that request imperative actions, and the operator's record
/// of the ids it acted on.
pub mod annotation {
    /// Planned failover; value `<id>` or `<id>:<target node>`.
    pub const FAILOVER: &str = "havip.io/failover";
    /// Forced failover (skips readiness checks); value as for [`FAILOVER`].
    pub const FORCE_FAILOVER: &str = "havip.io/force-failover";
    /// Clear a flap suspension.
    pub const CLEAR: &str = "havip.io/clear";
    /// Rotate the heartbeat key.
    pub const ROTATE_KEY: &str = "havip.io/rotate-key";
    /// Resume automatic failback after a manual move paused it.
    pub const RESUME_FAILBACK: &str = "havip.io/resume-failback";
    /// Owned by the operator: per request annotation, the last request id acted on, as
    /// JSON (`{"failover":"<id>",…}`; the keys are [`super::RequestKind::key`]).
    /// `lastOperation` holds one answer only, so it cannot remember five annotations.
    pub const HANDLED: &str = "havip.io/handled";
}

/// The imperative requests, in the order the operator considers them.
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

    /// The key in [`annotation::HANDLED`].
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

/// Whether `id` is a valid request id: 1 to 63 letters, digits, `-`, `_` or `.`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 63 && id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// The id part of an annotation value (before any `:`; possibly empty or invalid): what
/// [`annotation::HANDLED`] and the answers are compared with.
pub fn raw_id(value: &str) -> &str {
    value.trim().split(':').next().unwrap_or("")
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

/// The ids already acted on, per request kind key (from [`annotation::HANDLED`]; empty
/// when it is missing or unreadable).
pub fn handled_ids(annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    annotations.get(annotation::HANDLED).and_then(|v| serde_json::from_str(v).ok()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{RequestKind, annotation, handled_ids, parse_request, raw_id};
    use std::collections::BTreeMap;

    #[test]
    fn parses_request_annotations() {
        let r = parse_request(RequestKind::Failover, "abc-1").unwrap();
        assert_eq!((r.id.as_str(), r.target), ("abc-1", None));
        let r = parse_request(RequestKind::ForceFailover, "x:node-b").unwrap();
        assert_eq!(r.target.as_deref(), Some("node-b"));
        assert!(parse_request(RequestKind::Clear, "x:node-b").unwrap_err().1.contains("takes no target"));
        assert!(parse_request(RequestKind::Failover, "").unwrap_err().1.contains("malformed request id"));
        assert!(parse_request(RequestKind::Failover, "a b").is_err());
        assert!(parse_request(RequestKind::Failover, "x:").unwrap_err().1.contains("malformed target"));
        assert!(parse_request(RequestKind::Failover, &"x".repeat(64)).is_err());
        assert_eq!(RequestKind::RotateKey.key(), "rotate-key");
        assert_eq!(raw_id(" r1:node-b "), "r1");
        assert_eq!(raw_id("bad id!"), "bad id!");
    }

    #[test]
    fn handled_ids_are_read_per_kind_and_an_unreadable_record_is_empty() {
        let mut a = BTreeMap::new();
        assert!(handled_ids(&a).is_empty());
        a.insert(annotation::HANDLED.to_owned(), r#"{"failover":"r1","rotate-key":"k1"}"#.to_owned());
        let h = handled_ids(&a);
        assert_eq!(h.get(RequestKind::Failover.key()).map(String::as_str), Some("r1"));
        assert_eq!(h.get(RequestKind::RotateKey.key()).map(String::as_str), Some("k1"));
        a.insert(annotation::HANDLED.to_owned(), "not json".to_owned());
        assert!(handled_ids(&a).is_empty());
    }
}
