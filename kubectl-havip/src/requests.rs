//! The requests: a fresh id, the request annotation written, the answer waited for,
//! and an unanswered request withdrawn again (unless the operator took it up meanwhile).
//! The annotations' grammar and the operator's record of handled ids are
//! [`havip_crds::request`], which the operator reads too.

use crate::error::{Action, PluginError, is_status};
use futures::StreamExt;
use havip_crds::request::{RequestKind, handled_ids};
use havip_crds::{HAPair, Operation, OperationResult, manager};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use std::time::Duration;

/// A fresh request id: the time in base 36 and 4 random bytes, e.g. `lz3k9q-1f2e3d4c`.
pub fn request_id() -> Result<String, PluginError> {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).map_err(|e| PluginError::Internal(format!("failed to generate random bytes: {e}")))?;
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
pub async fn annotate(api: &Api<HAPair>, pair: &str, kind: RequestKind, value: &str) -> Result<(), PluginError> {
    let patch = serde_json::json!({
        "apiVersion": HAPair::api_version(&()),
        "kind": HAPair::kind(&()),
        "metadata": {"name": pair, "annotations": {kind.annotation(): value}},
    });
    api.patch(pair, &PatchParams::apply(manager::PLUGIN).force(), &Patch::Apply(&patch))
        .await
        .map_err(|e| PluginError::from_kube(Action::pair("patch", pair), e))?;
    Ok(())
}

/// Whether an answer is final (not `InProgress`).
pub fn is_final(op: &Operation) -> bool {
    op.result != OperationResult::InProgress
}

/// How waiting for an answer ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Waited {
    /// A final answer (`Succeeded`, `Refused`, `Failed`).
    Answered(Operation),
    /// The timeout, with the last answer seen for the id (`InProgress`), if any.
    TimedOut(Option<Operation>),
}

/// Watches `pair` until `status.lastOperation.id == id` with a final result, or the
/// timeout. Calls `on_progress` for each new `InProgress` answer, and fires `ready`
/// once the watch has started (its initial list arrives), so that the request is
/// written only when its answer can be seen. A watch the API server refuses (no
/// `list`/`watch` permission) is an error at once; other watch errors are retried.
pub async fn wait_for_answer(
    api: &Api<HAPair>,
    pair: &str,
    id: &str,
    timeout: Duration,
    mut ready: Option<tokio::sync::oneshot::Sender<()>>,
    mut on_progress: impl FnMut(&Operation),
) -> Result<Waited, PluginError> {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={pair}"));
    let mut stream = watcher::watcher(api.clone(), cfg).boxed();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last: Option<Operation> = None;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next()).await;
        let Ok(Some(ev)) = next else { return Ok(Waited::TimedOut(last)) };
        if ev.is_ok()
            && let Some(tx) = ready.take()
        {
            let _ = tx.send(());
        }
        let obj = match ev {
            Ok(Event::Apply(o) | Event::InitApply(o)) => o,
            Ok(_) => continue,
            Err(
                watcher::Error::InitialListFailed(e)
                | watcher::Error::WatchStartFailed(e)
                | watcher::Error::WatchFailed(e),
            ) if matches!(&e, kube::Error::Api(s) if s.code == 401 || s.code == 403) => {
                let verb = if matches!(&e, kube::Error::Api(s) if s.message.contains("cannot list")) {
                    "list"
                } else {
                    "watch"
                };
                return Err(PluginError::from_kube(Action::pair(verb, pair), e));
            }
            Err(e) => {
                tracing::debug!(error = %e, "watch error; the watcher retries");
                continue;
            }
        };
        let Some(op) = obj.status.and_then(|s| s.last_operation).filter(|op| op.id == id) else { continue };
        if is_final(&op) {
            return Ok(Waited::Answered(op));
        }
        if last.as_ref() != Some(&op) {
            on_progress(&op);
        }
        last = Some(op);
    }
}

/// Whether the operator has taken request `id` up: it is the pair's command, answer or
/// key rotation, or recorded as handled.
pub fn taken_up(pair: &HAPair, kind: RequestKind, id: &str) -> bool {
    let st = pair.status.clone().unwrap_or_default();
    st.command.as_ref().is_some_and(|c| c.id == id)
        || st.last_operation.as_ref().is_some_and(|o| o.id == id)
        || st.key_rotation.as_ref().is_some_and(|k| k.id == id)
        || handled_ids(pair.annotations()).get(kind.key()).is_some_and(|h| h == id)
}

/// What became of an unanswered request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Withdrawal {
    /// The annotation is gone (removed now, or replaced by someone else's request).
    Withdrawn,
    /// The operator took the request up after all: it may still complete.
    TakenUp,
    /// It could not be removed.
    Failed(String),
}

/// Removes the request annotation `kind` = `value` (id `id`) again, unless the
/// operator has taken it up meanwhile, so that an operator that comes back later does
/// not act on a request the user was told had no answer. A merge patch guarded by the
/// `resourceVersion`, retried on conflicts.
pub async fn withdraw(api: &Api<HAPair>, pair: &str, kind: RequestKind, id: &str, value: &str) -> Withdrawal {
    let pp = PatchParams { field_manager: Some(manager::PLUGIN.to_owned()), ..PatchParams::default() };
    for _ in 0..5 {
        let current = match api.get(pair).await {
            Ok(p) => p,
            Err(e) if is_status(&e, 404) => return Withdrawal::Withdrawn,
            Err(e) => return Withdrawal::Failed(PluginError::from_kube(Action::pair("get", pair), e).to_string()),
        };
        if taken_up(&current, kind, id) {
            return Withdrawal::TakenUp;
        }
        if current.annotations().get(kind.annotation()).map(String::as_str) != Some(value) {
            return Withdrawal::Withdrawn;
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": current.resource_version(), "annotations": {kind.annotation(): null}},
        });
        match api.patch(pair, &pp, &Patch::Merge(&patch)).await {
            Ok(_) => return Withdrawal::Withdrawn,
            Err(e) if is_status(&e, 409) => continue,
            Err(e) => return Withdrawal::Failed(PluginError::from_kube(Action::pair("patch", pair), e).to_string()),
        }
    }
    Withdrawal::Failed("the pair kept changing".to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{request_id, taken_up};
    use crate::render::sample_pair as pair;
    use havip_crds::request::{RequestKind, annotation, parse_request};

    #[test]
    fn request_ids_are_fresh_and_valid() {
        let a = request_id().unwrap();
        let b = request_id().unwrap();
        assert_ne!(a, b);
        assert!(parse_request(RequestKind::Failover, &a).is_ok(), "{a}");
    }

    #[test]
    fn a_request_is_taken_up_once_the_operator_records_it() {
        let mut p = pair();
        assert!(!taken_up(&p, RequestKind::Failover, "x1"));
        p.metadata.annotations =
            Some([(annotation::HANDLED.to_owned(), r#"{"failover":"x1"}"#.to_owned())].into_iter().collect());
        assert!(taken_up(&p, RequestKind::Failover, "x1"));
        assert!(!taken_up(&p, RequestKind::Clear, "x1"), "handled per kind");
        assert!(taken_up(&pair(), RequestKind::Clear, "r1"), "the last answer's id");
    }
}
