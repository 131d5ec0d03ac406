//! The FloatingIP reconcile: the operator owns the `PairFound` condition of each
//! FloatingIP (its own entry of the list-map, field manager `havip-operator`); while the
//! pair exists its reconcile writes `Accepted`, `Ready` and `Conflict`, and here, when the
//! pair is missing, they say so. The holder's agent owns the holder fields.

use crate::context::{Context, Ev};
use crate::guard::guarded_reconcile;
use crate::{Error, model};
use havip_crds::{FloatingIP, condition, manager, reason};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use std::sync::Arc;

/// Reconciles one FloatingIP (an unreadable one gets `InvalidSpec`; see [`crate::guard`]).
pub async fn reconcile(obj: Arc<DeserializeGuard<FloatingIP>>, ctx: Arc<Context>) -> Result<Action, Error> {
    guarded_reconcile(obj, ctx, reconcile_fip).await
}

async fn reconcile_fip(fip: &FloatingIP, ctx: &Context) -> Result<Action, Error> {
    let name = fip.name_any();
    let pair = &fip.spec.pair;
    let found = ctx.pairs.get(&ObjectRef::new(pair)).is_some();
    let (reason, message) = if found {
        (reason::PAIR_FOUND, format!("HAPair {pair} exists"))
    } else {
        (reason::PAIR_NOT_FOUND, format!("HAPair {pair} does not exist: no member will hold this VIP"))
    };
    let previous = fip.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let current = previous.iter().find(|c| c.type_ == condition::PAIR_FOUND);
    let generation = fip.meta().generation;
    let unchanged = current.is_some_and(|c| {
        c.status == if found { "True" } else { "False" }
            && c.reason == reason
            && c.message == message
            && c.observed_generation == generation
    });
    if !unchanged {
        ctx.guard("status")?;
        let cond = model::condition(
            previous,
            condition::PAIR_FOUND,
            found,
            reason,
            message.clone(),
            generation,
            Timestamp::now(),
        );
        let patch = serde_json::json!({
            "apiVersion": FloatingIP::api_version(&()),
            "kind": FloatingIP::kind(&()),
            "status": {"conditions": [cond]},
        });
        let api: Api<FloatingIP> = Api::all(ctx.client.clone());
        api.patch_status(&name, &PatchParams::apply(manager::OPERATOR).force(), &Patch::Apply(&patch)).await.map_err(
            |source| Error::ApplyStatus { kind: "FloatingIP", name: name.clone(), source: Box::new(source) },
        )?;
        ctx.metrics.status_writes.get_or_create(&crate::metrics::KindLabels { kind: "FloatingIP" }).inc();
        let was_missing = current.is_some_and(|c| c.status == "False");
        if !found {
            ctx.event(fip, Ev::warning(reason, "Resolve", message)).await;
        } else if was_missing {
            ctx.event(fip, Ev::normal(reason, "Resolve", message)).await;
        }
    }
    // Without its pair no agent must see it: drop the member labels it kept from a pair
    // it named before (the pair's reconcile sets them while the pair exists).
    if !found {
        let api: Api<FloatingIP> = Api::all(ctx.client.clone());
        crate::pair::status::label_members(ctx, &api, "FloatingIP", &name, fip.labels(), &Default::default()).await?;
        // Not accepted, not ready: the conditions the pair's reconcile writes while the
        // pair exists.
        crate::pair::status::apply_fip_status(ctx, fip, model::orphan_verdict(fip)).await?;
    }
    Ok(Action::requeue(ctx.settings.resync * 5))
}
