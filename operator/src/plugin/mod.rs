//! The `kubectl havip` plugin: its command line ([`cli`]), which cluster it talks to
//! ([`config`]), its errors and exit codes ([`error`]), whether the operator runs
//! ([`liveness`]), what it prints ([`render`]), shell completion ([`complete`]), and
//! here the requests: ids, writing a request annotation, waiting for its answer,
//! withdrawing an unanswered one, and the maintenance patch.

pub mod cli;
pub mod complete;
pub mod config;
pub mod error;
pub mod liveness;
pub mod render;

pub use error::{Action, PluginError, exit};
pub use render::render_status;

use futures::StreamExt;
use havip_crds::request::{RequestKind, handled_ids};
use havip_crds::{HAPair, Operation, OperationResult, manager};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use std::time::Duration;

/// havip's namespace when `-n` is not given (the chart's default).
pub const DEFAULT_NAMESPACE: &str = "havip-system";

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
            Err(e) if crate::error::is_status(&e, 404) => return Withdrawal::Withdrawn,
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
            Err(e) if crate::error::is_status(&e, 409) => continue,
            Err(e) => return Withdrawal::Failed(PluginError::from_kube(Action::pair("patch", pair), e).to_string()),
        }
    }
    Withdrawal::Failed("the pair kept changing".to_owned())
}

/// The merge patch that sets `spec.members[].maintenance` for `node`: the whole
/// (atomic) member list with that one flag changed, guarded by the object's
/// `resourceVersion` so that a concurrent edit of the list makes it fail (409)
/// instead of being overwritten.
pub fn maintenance_patch(pair: &HAPair, node: &str, on: bool) -> Result<serde_json::Value, PluginError> {
    if !pair.spec.members.iter().any(|m| m.node == node) {
        let members: Vec<&str> = pair.spec.members.iter().map(|m| m.node.as_str()).collect();
        return Err(PluginError::Usage(format!(
            "{node} is not a member of HAPair {} (members: {})",
            pair.name_any(),
            members.join(", ")
        )));
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
pub async fn set_maintenance(api: &Api<HAPair>, pair: &str, node: &str, on: bool) -> Result<(), PluginError> {
    let pp = PatchParams { field_manager: Some(manager::PLUGIN.to_owned()), ..PatchParams::default() };
    let mut attempts = 0;
    loop {
        let current = api.get(pair).await.map_err(|e| PluginError::from_kube(Action::pair("get", pair), e))?;
        let patch = maintenance_patch(&current, node, on)?;
        match api.patch(pair, &pp, &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(e) if crate::error::is_status(&e, 409) && attempts < 5 => attempts += 1,
            Err(e) => return Err(PluginError::from_kube(Action::pair("patch", pair), e)),
        }
    }
}

/// Who the API server says this client is (a SelfSubjectReview, which every
/// authenticated user may create); `None` when it does not say within 3 s.
pub async fn who_am_i(client: &kube::Client) -> Option<error::Identity> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = tokio::time::timeout(
        Duration::from_secs(3),
        api.create(&kube::api::PostParams::default(), &SelfSubjectReview::default()),
    )
    .await
    .ok()?
    .ok()?;
    let info = review.status?.user_info?;
    Some(error::Identity { user: info.username?, groups: info.groups.unwrap_or_default() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::maintenance_patch;
    use super::render::sample_pair as pair;
    use super::request_id;
    use super::taken_up;
    use havip_crds::request::RequestKind;

    #[test]
    fn request_ids_are_fresh_and_valid() {
        let a = request_id().unwrap();
        let b = request_id().unwrap();
        assert_ne!(a, b);
        assert!(havip_crds::request::parse_request(RequestKind::Failover, &a).is_ok(), "{a}");
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

    #[test]
    fn a_request_is_taken_up_once_the_operator_records_it() {
        let mut p = pair();
        assert!(!taken_up(&p, RequestKind::Failover, "x1"));
        p.metadata.annotations = Some(
            [(havip_crds::request::annotation::HANDLED.to_owned(), r#"{"failover":"x1"}"#.to_owned())]
                .into_iter()
                .collect(),
        );
        assert!(taken_up(&p, RequestKind::Failover, "x1"));
        assert!(!taken_up(&p, RequestKind::Clear, "x1"), "handled per kind");
        assert!(taken_up(&pair(), RequestKind::Clear, "r1"), "the last answer's id");
    }
}
