//! What the operator writes onto objects besides their own status and the objects it
//! creates: the `InvalidSpec` condition of an object it cannot read, and the member
//! labels (`member.havip.io/<node>`) that let each agent watch only its own objects.

use crate::Error;
use crate::context::Context;
use crate::error::is_status;
use crate::model;
use havip_crds::{manager, reason};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
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
    let Some(patch) = model::member_label_patch(current, desired) else { return Ok(false) };
    ctx.guard("labels")?;
    let pp = PatchParams { field_manager: Some(manager::OPERATOR_LABELS.to_owned()), ..PatchParams::default() };
    match api.patch(name, &pp, &Patch::Merge(&patch)).await {
        Ok(_) => {
            tracing::debug!(kind, object = %name, patch = %patch, "member labels set");
            Ok(true)
        }
        Err(e) if is_status(&e, 404) => Ok(false),
        Err(source) => Err(Error::Label { kind, name: name.to_owned(), source: Box::new(source) }),
    }
}
