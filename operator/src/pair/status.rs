//! What the operator writes onto objects besides their own status and the objects it
//! creates: the `InvalidSpec` condition of an object it cannot read, the operator's part
//! of a FloatingIP's status (its conditions, and `state: Pending` while nobody holds
//! it), and the member labels (`member.havip.io/<node>`) that let each agent watch only
//! its own objects.

use crate::context::{Context, Ev};
use crate::error::is_status;
use crate::{Error, model};
use havip_crds::{manager, reason};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};

/// Applies `{status: {conditions: [InvalidSpec=True]}}` to an object that cannot be read.
pub async fn apply_invalid_condition<K>(
    ctx: &Context,
    name: &str,
    generation: Option<i64>,
    message: &str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>,
{
    ctx.guard("status")?;
    let api: Api<kube::api::DynamicObject> =
        Api::all_with(ctx.client.clone(), &kube::api::ApiResource::erase::<K>(&()));
    let cond = model::condition(
        &[],
        havip_crds::condition::INVALID_SPEC,
        true,
        reason::INVALID_SPEC,
        message.to_owned(),
        generation,
        Timestamp::now(),
    );
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": {"conditions": [cond]},
    });
    let kind: &'static str = if K::kind(&()) == "HAPair" { "HAPair" } else { "FloatingIP" };
    api.patch_status(name, &PatchParams::apply(manager::OPERATOR).force(), &Patch::Apply(&patch))
        .await
        .map_err(|source| Error::ApplyStatus { kind, name: name.to_owned(), source: Box::new(source) })?;
    ctx.metrics.status_writes.get_or_create(&crate::metrics::KindLabels { kind }).inc();
    Ok(())
}

/// Makes `name`'s member labels the `desired` ones (a merge patch under the
/// operator's label field manager, only when they differ). An object deleted meanwhile
/// is not an error. Returns whether it patched.
pub async fn label_members<K>(
    ctx: &Context,
    api: &Api<K>,
    kind: &'static str,
    name: &str,
    current: &BTreeMap<String, String>,
    desired: &BTreeSet<String>,
) -> Result<bool, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match model::member_label_patch(current, desired) {
        Some(patch) => Ok(patch_member_labels(ctx, api, kind, name, &patch).await?.is_some()),
        None => Ok(false),
    }
}

/// Applies a member-label merge patch ([`model::member_label_patch`]) under the
/// operator's label field manager. An object deleted meanwhile is not an error.
/// Returns the patched object (None: it was gone).
pub async fn patch_member_labels<K>(
    ctx: &Context,
    api: &Api<K>,
    kind: &'static str,
    name: &str,
    patch: &serde_json::Value,
) -> Result<Option<K>, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    ctx.guard("labels")?;
    let pp = PatchParams { field_manager: Some(manager::OPERATOR_LABELS.to_owned()), ..PatchParams::default() };
    match api.patch(name, &pp, &Patch::Merge(patch)).await {
        Ok(o) => {
            tracing::debug!(kind, object = %name, patch = %patch, "member labels set");
            Ok(Some(o))
        }
        Err(e) if is_status(&e, 404) => Ok(None),
        Err(source) => Err(Error::Label { kind, name: name.to_owned(), source: Box::new(source) }),
    }
}

/// Applies a FloatingIP's operator conditions when they changed (their own field
/// manager) and, when the verdict says nobody holds it, `state: Pending` without holder
/// fields (a merge patch under the observed resourceVersion: a holder that wrote since
/// wins). Events on a refusal and on an acceptance after one.
pub async fn apply_fip_status(
    ctx: &Context,
    fip: &havip_crds::FloatingIP,
    verdict: model::FipVerdict,
) -> Result<(), Error> {
    let name = fip.name_any();
    let api: Api<havip_crds::FloatingIP> = Api::all(ctx.client.clone());
    if verdict.pending {
        pending_state(ctx, &api, fip).await?;
    }
    let previous = fip.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let generation = fip.meta().generation;
    let key = format!("fip/{name}");
    let memo = (fip.uid(), generation, verdict.clone());
    if model::fip_conditions_current(previous, &verdict, generation)
        && fip.status.as_ref().is_some_and(|s| s.observed_generation == generation)
    {
        // (With `pending` handled above, this is [`model::fip_status_current`].)
        ctx.with_memory(&key, |m| m.admission = Some(memo));
        return Ok(());
    }
    if ctx.with_memory(&key, |m| m.admission.as_ref() == Some(&memo)) {
        // Applied by this process already; the cache has not caught up yet.
        return Ok(());
    }
    ctx.guard("status")?;
    let conditions = model::fip_conditions(previous, &verdict, generation, Timestamp::now());
    let patch = serde_json::json!({
        "apiVersion": havip_crds::FloatingIP::api_version(&()),
        "kind": havip_crds::FloatingIP::kind(&()),
        "status": {"conditions": conditions, "observedGeneration": generation},
    });
    match api.patch_status(&name, &PatchParams::apply(manager::OPERATOR_ADMISSION).force(), &Patch::Apply(&patch)).await
    {
        Ok(_) => {}
        Err(e) if is_status(&e, 404) => return Ok(()),
        Err(source) => {
            return Err(Error::ApplyStatus { kind: "FloatingIP", name, source: Box::new(source) });
        }
    }
    ctx.metrics.status_writes.get_or_create(&crate::metrics::KindLabels { kind: "FloatingIP" }).inc();
    ctx.with_memory(&key, |m| m.admission = Some(memo));
    let was = previous.iter().find(|c| c.type_ == havip_crds::condition::ACCEPTED).map(|c| c.status.as_str());
    let accepted = &verdict.accepted;
    if accepted.status == "False" && was != Some("False") {
        tracing::warn!(floatingip = %name, reason = accepted.reason, message = %accepted.message, "FloatingIP refused");
        ctx.event(fip, Ev::warning(accepted.reason, "Validate", accepted.message.clone())).await;
    } else if accepted.status == "True" && was == Some("False") {
        ctx.event(fip, Ev::normal(reason::ACCEPTED, "Validate", accepted.message.clone())).await;
    }
    Ok(())
}

/// `state: Pending` and no holder fields on a FloatingIP nobody holds: a JSON merge patch
/// of the status under the resourceVersion the verdict was made on, so that a holder's
/// write since then is never undone (a conflict: the next reconcile sees it).
async fn pending_state(
    ctx: &Context,
    api: &Api<havip_crds::FloatingIP>,
    fip: &havip_crds::FloatingIP,
) -> Result<(), Error> {
    let name = fip.name_any();
    ctx.guard("status")?;
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": fip.resource_version()},
        "status": {
            "state": havip_crds::VipState::Pending,
            "holder": null, "holderMac": null, "conflictMac": null, "epoch": null,
            "interface": null, "lastAnnounced": null,
        },
    });
    let pp = PatchParams { field_manager: Some(manager::OPERATOR_ADMISSION.to_owned()), ..PatchParams::default() };
    match api.patch_status(&name, &pp, &Patch::Merge(&patch)).await {
        Ok(_) => {
            let holder = fip.status.as_ref().and_then(|s| s.holder.clone());
            if let Some(h) = holder {
                tracing::info!(floatingip = %name, holder = %h, "cleared the holder of a FloatingIP nobody holds");
            }
            ctx.metrics.status_writes.get_or_create(&crate::metrics::KindLabels { kind: "FloatingIP" }).inc();
            Ok(())
        }
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
        Err(source) => Err(Error::ApplyStatus { kind: "FloatingIP", name, source: Box::new(source) }),
    }
}
