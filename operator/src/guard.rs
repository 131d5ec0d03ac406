//! One guarded reconcile and one error policy for both controllers: the reconcile
//! timer, waiting for the caches, an object that cannot be read (a newer CRD's value,
//! a malformed edit) answered with `InvalidSpec` and a Warning Event once per
//! generation instead of an error loop, and a per-object backoff with a Warning Event
//! on the first failure and every tenth.

use crate::Error;
use crate::context::{Context, Ev, ReconcileTimer, backoff};
use crate::pair::status::apply_invalid_condition;
use havip_crds::{FloatingIP, HAPair, reason};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use std::sync::Arc;

pub use crate::model::INVALID_REQUEUE;

/// A kind reconciled through [`guarded_reconcile`].
pub trait Reconciled:
    Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// The controller's name: the metrics label and the logs' `controller` field.
    const CONTROLLER: &'static str;
    /// The key of an object's memory in [`Context::with_memory`].
    fn memory_key(name: &str) -> String;
    /// Logs (debug) that `name` is being reconciled, under the kind's own field
    /// (`pair`, `floatingip`), as the operator's logs always did.
    fn trace_reconciling(name: &str);
}

impl Reconciled for HAPair {
    const CONTROLLER: &'static str = "hapair";
    fn memory_key(name: &str) -> String {
        name.to_owned()
    }
    fn trace_reconciling(name: &str) {
        tracing::debug!(pair = %name, "reconciling");
    }
}

impl Reconciled for havip_crds::VIPPool {
    const CONTROLLER: &'static str = "vippool";
    fn memory_key(name: &str) -> String {
        format!("vippool/{name}")
    }
    fn trace_reconciling(name: &str) {
        tracing::debug!(vippool = %name, "reconciling");
    }
}

impl Reconciled for FloatingIP {
    const CONTROLLER: &'static str = "floatingip";
    fn memory_key(name: &str) -> String {
        format!("fip/{name}")
    }
    fn trace_reconciling(name: &str) {
        tracing::debug!(floatingip = %name, "reconciling");
    }
}

/// Runs `reconcile` on a readable object; an unreadable one gets the `InvalidSpec`
/// condition and a Warning Event (once per generation) and is looked at again after
/// [`INVALID_REQUEUE`]. Every reconcile is timed and counted, early returns included.
pub async fn guarded_reconcile<K: Reconciled>(
    obj: Arc<DeserializeGuard<K>>,
    ctx: Arc<Context>,
    reconcile: impl AsyncFnOnce(&K, &Context) -> Result<Action, Error>,
) -> Result<Action, Error> {
    let mut timer = ReconcileTimer::start(K::CONTROLLER, ctx.metrics.clone());
    ctx.wait_ready().await?;
    let name = obj.name_any();
    let key = K::memory_key(&name);
    K::trace_reconciling(&name);
    match &obj.0 {
        Err(invalid) => {
            let generation = obj.meta().generation;
            let first = ctx.with_memory(&key, |m| {
                let first = m.warned_generation != generation;
                m.warned_generation = generation;
                first
            });
            if first {
                tracing::warn!(
                    controller = K::CONTROLLER,
                    object = %name,
                    error = %invalid.error,
                    "the object cannot be read"
                );
                let message = format!("the object cannot be read: {}", invalid.error);
                apply_invalid_condition::<K>(&ctx, &name, generation, &message).await?;
                ctx.event(obj.as_ref(), Ev::warning(reason::INVALID_SPEC, "Validate", message)).await;
            }
            timer.result("invalid");
            Ok(Action::requeue(INVALID_REQUEUE))
        }
        Ok(o) => {
            let res = reconcile(o, &ctx).await;
            if res.is_ok() {
                timer.result("ok");
                ctx.with_memory(&key, |m| m.failures = 0);
            }
            res
        }
    }
}

/// What to do after a failed reconcile: back off per object (1 s doubling to 5 min),
/// publish the error as a Warning Event on the first failure and every tenth. A replica
/// that lost the leadership drops the reconcile.
pub fn error_policy<K: Reconciled>(obj: Arc<DeserializeGuard<K>>, err: &Error, ctx: Arc<Context>) -> Action {
    let name = obj.name_any();
    ctx.metrics.error(err);
    if matches!(err, Error::NotLeader { .. }) {
        tracing::debug!(controller = K::CONTROLLER, object = %name, "not the leader; dropping the reconcile");
        return Action::await_change();
    }
    let failures = ctx.with_memory(&K::memory_key(&name), |m| {
        m.failures = m.failures.saturating_add(1);
        m.failures
    });
    let delay = backoff(failures);
    tracing::warn!(
        controller = K::CONTROLLER,
        object = %name,
        error = %err,
        category = err.category(),
        failures,
        retry_in = ?delay,
        "reconcile failed"
    );
    if failures == 1 || failures.is_multiple_of(10) {
        let note = format!("{err} (attempt {failures}, retrying in {}s)", delay.as_secs());
        tokio::spawn(async move {
            ctx.event(obj.as_ref(), Ev::warning(reason::RECONCILE_ERROR, "Reconcile", note)).await;
        });
    }
    Action::requeue(delay)
}
