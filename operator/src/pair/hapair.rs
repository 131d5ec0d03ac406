//! The HAPair reconcile: observe (gather the inputs from the caches), plan
//! ([`model::plan`], pure), apply — Lease and key Secret creates first, member labels,
//! the FloatingIPs' status, key Secret changes, the pair's status by server-side apply,
//! the handled-request record, the Events, the pair's own labels. It decides nothing the
//! plan does not say; where a create finds its object already there (the cache lags
//! behind this operator's own earlier create), the rest of the plan rested on a guess and
//! is planned again shortly from a fresher cache.

use crate::Error;
use crate::context::{Context, lease_info, owned_meta};
use crate::error::is_status;
use crate::guard::guarded_reconcile;
use crate::model::{self, KeyChange, KeyInfo, LabelTarget, Observed};
use crate::pair::keysecret::{create_secret, finish_rotation, key_info, record_members, start_rotation};
use crate::pair::status::patch_member_labels;
use havip_crds::request::{RequestKind, annotation, handled_ids};
use havip_crds::{HAPair, HAPairStatus, manager};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Reconciles one HAPair (an unreadable one gets `InvalidSpec`; see [`crate::guard`]).
pub async fn reconcile(obj: Arc<DeserializeGuard<HAPair>>, ctx: Arc<Context>) -> Result<Action, Error> {
    guarded_reconcile(obj, ctx, reconcile_pair).await
}

/// The seed of pair `pair`'s new Lease: from the Lease under the name of earlier
/// releases (`havip-<pair>`) if this very pair owns it (an unrelated Lease of that name,
/// such as the leader-election Lease for a pair named `operator`, is ignored).
fn lease_seed(pair: &HAPair, legacy: Option<&Lease>) -> model::LeaseSeed {
    let uid = pair.meta().uid.as_deref();
    let owned = |l: &Lease| {
        uid.is_some()
            && l.metadata
                .owner_references
                .as_ref()
                .is_some_and(|refs| refs.iter().any(|r| Some(r.uid.as_str()) == uid && r.kind == "HAPair"))
    };
    match legacy.filter(|l| owned(l)).and_then(|l| l.spec.as_ref()) {
        Some(spec) => model::LeaseSeed {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            epoch: spec.lease_transitions.unwrap_or(0).max(0),
            from: legacy.map(ResourceExt::name_any),
        },
        None => model::LeaseSeed::default(),
    }
}

async fn create_lease(
    ctx: &Context,
    pair: &HAPair,
    name: &str,
    seed: &model::LeaseSeed,
) -> Result<Option<Lease>, Error> {
    ctx.guard("Lease")?;
    let ns = &ctx.settings.namespace;
    let mut metadata = owned_meta(pair, name.to_owned(), ns);
    // With the member labels, the members by name (the agents' Lease policy reads it).
    metadata.annotations = Some(
        [(havip_crds::membership::NODES_ANNOTATION.to_owned(), model::member_nodes(&pair.spec))].into_iter().collect(),
    );
    let lease = Lease {
        metadata,
        spec: Some(LeaseSpec {
            holder_identity: seed.holder.clone(),
            lease_transitions: Some(seed.epoch),
            ..LeaseSpec::default()
        }),
    };
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
    match api
        .create(&PostParams { field_manager: Some(manager::OPERATOR.to_owned()), ..PostParams::default() }, &lease)
        .await
    {
        Ok(l) => Ok(Some(l)),
        Err(e) if is_status(&e, 409) => Ok(None),
        Err(source) => {
            Err(Error::CreateLease { namespace: ns.clone(), name: name.to_owned(), source: Box::new(source) })
        }
    }
}

/// The model's view of the pair, and its FloatingIPs (accepted and refused) by name.
fn gather(
    pair: &HAPair,
    ctx: &Context,
    lease: Option<&Lease>,
    key: Option<KeyInfo>,
    now: Timestamp,
) -> (Observed, BTreeMap<String, havip_crds::FloatingIP>) {
    let name = pair.name_any();
    let nodes: BTreeMap<String, Option<model::NodeInfo>> = pair
        .spec
        .members
        .iter()
        .map(|m| {
            let info = ctx.nodes.get(&ObjectRef::new(&m.node)).map(|n| model::NodeInfo {
                addresses: n
                    .status
                    .as_ref()
                    .and_then(|s| s.addresses.as_ref())
                    .map(|a| a.iter().map(|x| (x.type_.clone(), x.address.clone())).collect())
                    .unwrap_or_default(),
            });
            (m.node.clone(), info)
        })
        .collect();
    let all = ctx.fips.state();
    let readable: Vec<&havip_crds::FloatingIP> = all.iter().filter_map(|f| f.0.as_ref().ok()).collect();
    let conflicts = havip_crds::floatingip::address_conflicts(readable.iter().copied());
    let pair_of = |n: &str| readable.iter().find(|f| f.name_any() == n).map(|f| f.spec.pair.clone());
    let mut vips = Vec::new();
    let mut refused = Vec::new();
    for fip in readable.iter().filter(|f| f.spec.pair == name) {
        let info = model::VipInfo {
            name: fip.name_any(),
            spec: Some(fip.spec.clone()),
            state: fip.status.as_ref().and_then(|s| s.state),
        };
        match model::refusal(&info.name, &fip.spec.address, &conflicts, pair_of, |a| ctx.reserved.lookup(a), &nodes) {
            None => vips.push(info),
            Some(r) => refused.push((info, r)),
        }
    }
    vips.sort_by(|a, b| a.name.cmp(&b.name));
    refused.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    let fips = readable.iter().filter(|f| f.spec.pair == name).map(|f| (f.name_any(), (*f).clone())).collect();
    let mut spec_problems = model::validate_spec(&name, &pair.spec, &ctx.settings.namespace);
    let pairs = ctx.pairs.state();
    spec_problems.extend(model::virtual_mac_conflict(
        &name,
        &pair.spec,
        pair.metadata.creation_timestamp.as_ref().map(|t| &t.0),
        pairs.iter().filter_map(|p| p.0.as_ref().ok()).map(|p| {
            (
                p.metadata.name.as_deref().unwrap_or_default(),
                &p.spec,
                p.metadata.creation_timestamp.as_ref().map(|t| &t.0),
            )
        }),
    ));
    let observed = Observed {
        refused,
        spec_problems,
        name,
        spec: pair.spec.clone(),
        status: pair.status.clone().unwrap_or_default(),
        generation: pair.meta().generation,
        annotations: pair.annotations().clone(),
        nodes,
        lease: lease.map(lease_info),
        key,
        vips,
        now,
    };
    (observed, fips)
}

async fn reconcile_pair(pair: &HAPair, ctx: &Context) -> Result<Action, Error> {
    match reconcile_pair_inner(pair, ctx).await {
        // A compare-and-swap on the key Secret lost against the operator's own previous
        // write that the cache does not show yet: try again shortly, quietly.
        Err(e @ (Error::UpdateSecret { .. } | Error::UpdateLease { .. })) if e.is_conflict() => {
            tracing::debug!(pair = %pair.name_any(), error = %e, "key Secret changed meanwhile; retrying");
            Ok(Action::requeue(Duration::from_millis(500)))
        }
        other => other,
    }
}

/// What one reconcile starts from: the plan's inputs and the pair's own key Secret as
/// cached (the object its changes are made on).
struct Observation {
    inputs: model::PairInputs,
    lease: Option<Lease>,
    secret: Option<Secret>,
}

fn observe(pair: &HAPair, ctx: &Context, now: Timestamp) -> Result<Observation, Error> {
    let name = pair.name_any();
    let ns = ctx.settings.namespace.clone();
    let fits = name.len() <= 63;
    let lease = ctx.leases.get(&ObjectRef::new(&model::lease_name(&name)).within(&ns));
    let lease_seed = match &lease {
        None if fits => {
            let legacy = ctx.leases.get(&ObjectRef::new(&havip_crds::lease::legacy_pair_lease_name(&name)).within(&ns));
            lease_seed(pair, legacy.as_deref())
        }
        _ => model::LeaseSeed::default(),
    };
    let secret_name = model::secret_name(&name);
    let secret = (pair.spec.heartbeat.key_secret_ref.is_none() && fits)
        .then(|| ctx.secrets.get(&ObjectRef::new(&secret_name).within(&ns)).map(|s| (*s).clone()))
        .flatten();
    let key = match &secret {
        Some(s) => Some(key_info(s).map_err(|message| Error::MalformedSecret {
            namespace: ns.clone(),
            name: secret_name.clone(),
            message,
        })?),
        None => None,
    };
    let (observed, fips) = gather(pair, ctx, lease.as_deref(), key, now);
    let inputs = model::PairInputs {
        observed,
        shared_secret: shared_secret(ctx, pair),
        namespace: ns,
        lease_seed,
        fips,
        pair_labels: pair.labels().clone(),
        lease_labels: lease.as_ref().map(|l| l.labels().clone()),
        lease_annotations: lease.as_ref().map(|l| l.annotations().clone()),
        secret_labels: secret.as_ref().map(|s| s.labels().clone()),
        resync: ctx.settings.resync,
    };
    Ok(Observation { inputs, lease: lease.as_deref().cloned(), secret })
}

/// The Secret `keySecretRef` names, if it is in the operator's namespace and exists,
/// with the member labels of every other pair that names it.
fn shared_secret(ctx: &Context, pair: &HAPair) -> Option<model::SharedSecret> {
    let ns = &ctx.settings.namespace;
    let r = pair.spec.heartbeat.key_secret_ref.as_ref()?;
    if r.namespace.as_deref().is_some_and(|n| n != ns) {
        return None;
    }
    let s = ctx.secrets.get(&ObjectRef::new(&r.name).within(ns))?;
    let others = ctx
        .pairs
        .state()
        .iter()
        .filter_map(|p| p.0.as_ref().ok())
        .filter(|p| p.name_any() != pair.name_any())
        .filter(|p| {
            p.spec
                .heartbeat
                .key_secret_ref
                .as_ref()
                .is_some_and(|x| x.name == r.name && x.namespace.as_deref().is_none_or(|n| n == ns))
        })
        .flat_map(|p| model::member_labels(&p.spec))
        .collect();
    Some(model::SharedSecret { name: r.name.clone(), labels: s.labels().clone(), others })
}

/// Whether `meta` belongs to an earlier pair of the same name: it is owned by an HAPair,
/// but not by this one (deleted and re-created under the same name; the garbage
/// collector has not removed it yet, or there is none, as on a bare API server).
pub(crate) fn of_an_earlier_pair(meta: &ObjectMeta, pair_uid: Option<&str>) -> bool {
    let Some(uid) = pair_uid else { return false };
    let pairs: Vec<&str> = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.kind == "HAPair" && r.api_version.starts_with("havip.io/"))
        .map(|r| r.uid.as_str())
        .collect();
    !pairs.is_empty() && !pairs.contains(&uid)
}

/// The pair's Lease and key Secret, when an earlier pair of the same name left them, are
/// this pair's from now on: the Lease keeps its epoch (the fencing epoch never goes back,
/// whatever incarnation of the pair writes it) and loses its holder; the Secret gets a
/// fresh key under the next id (see [`crate::pair::keysecret::adopt_secret`]). Inheriting
/// them silently — as before — let the garbage collector delete them under the running
/// pair, and the operator then created a new key under the same id, which members that
/// missed it (an API outage, a cut node) could not verify: both raised `KeyMismatch`.
/// Returns whether anything was written (the caller reconciles again on the fresh cache).
async fn adopt_earlier_objects(ctx: &Context, pair: &HAPair, seen: &Observation) -> Result<bool, Error> {
    let uid = pair.meta().uid.as_deref();
    let name = pair.name_any();
    let mut adopted = Vec::new();
    if let Some(lease) = seen.lease.as_ref().filter(|l| of_an_earlier_pair(&l.metadata, uid)) {
        if lease.metadata.deletion_timestamp.is_some() {
            return Ok(true);
        }
        let mut l = lease.clone();
        l.metadata.owner_references = owned_meta(pair, l.name_any(), &ctx.settings.namespace).owner_references;
        l.metadata.managed_fields = None;
        let epoch = l.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0);
        if let Some(spec) = l.spec.as_mut() {
            spec.holder_identity = None;
        }
        ctx.guard("Lease")?;
        let ns = &ctx.settings.namespace;
        let api: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
        api.replace(
            &l.name_any(),
            &PostParams { field_manager: Some(manager::OPERATOR.to_owned()), ..PostParams::default() },
            &l,
        )
        .await
        .map_err(|source| Error::UpdateLease {
            namespace: ns.clone(),
            name: l.name_any(),
            what: "take over an earlier pair's Lease",
            source: Box::new(source),
        })?;
        adopted.push(format!("its Lease {} (epoch {epoch} kept, no holder)", l.name_any()));
    }
    if let Some(secret) = seen.secret.as_ref().filter(|s| of_an_earlier_pair(&s.metadata, uid)) {
        if secret.metadata.deletion_timestamp.is_some() {
            return Ok(true);
        }
        let s = crate::pair::keysecret::adopt_secret(ctx, pair, secret).await?;
        let id = s.data.as_ref().and_then(|d| d.get("keyId")).map(|b| String::from_utf8_lossy(&b.0).into_owned());
        adopted.push(format!("its key Secret {} (a fresh key, id {})", s.name_any(), id.unwrap_or_default()));
    }
    if adopted.is_empty() {
        return Ok(false);
    }
    let note = format!("an earlier pair named {name} left {}: taken over", adopted.join(" and "));
    tracing::info!(pair = %name, "{note}");
    ctx.event(pair, model::Ev::normal(havip_crds::reason::EARLIER_PAIR_ADOPTED, "Adopt", note)).await;
    Ok(true)
}

async fn reconcile_pair_inner(pair: &HAPair, ctx: &Context) -> Result<Action, Error> {
    let seen = observe(pair, ctx, Timestamp::now())?;
    if adopt_earlier_objects(ctx, pair, &seen).await? {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let memo = ctx.with_memory(&pair.name_any(), |m| m.pair.clone());
    let plan = model::plan(&seen.inputs, &memo);
    tracing::debug!(
        pair = %pair.name_any(),
        quiet = plan.is_quiet(),
        labels = plan.labels.len(),
        key_changes = plan.key_changes.len(),
        status = plan.status.is_some(),
        events = plan.events.len(),
        "planned"
    );
    apply(ctx, pair, seen, plan).await
}

/// Applies `plan` in its order. Stops at the first failed write (the error policy
/// retries the whole reconcile with a fresh plan).
async fn apply(ctx: &Context, pair: &HAPair, seen: Observation, plan: model::Plan) -> Result<Action, Error> {
    let name = pair.name_any();
    let now = seen.inputs.observed.now;
    let mut secret = seen.secret;
    let mut events = Vec::new();
    let mut already_there = false;
    if let Some((seed, ev)) = &plan.create_lease {
        match create_lease(ctx, pair, &model::lease_name(&name), seed).await? {
            Some(_) => events.push(ev.clone()),
            None => already_there = true,
        }
    }
    if let Some(ev) = &plan.create_secret {
        match create_secret(ctx, pair, &model::secret_name(&name)).await? {
            Some(s) => {
                events.push(ev.clone());
                secret = Some(s);
            }
            None => already_there = true,
        }
    }
    if already_there {
        for ev in events {
            ctx.event(pair, ev).await;
        }
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    // FloatingIPs whose labels this reconcile patched, as the patch left them.
    let mut relabelled: BTreeMap<String, havip_crds::FloatingIP> = BTreeMap::new();
    for l in &plan.labels {
        if let Some(f) = apply_labels(ctx, l).await? {
            relabelled.insert(l.name.clone(), f);
        }
    }
    for (fname, verdict) in &plan.fip_verdicts {
        let Some(seen_fip) = seen.inputs.fips.get(fname) else { continue };
        // The verdict was made on the observed object; writes that depend on it (state
        // Pending) are guarded by its resourceVersion. The operator's own label patch
        // changed that version: when the patched object's status is still the observed
        // one, the verdict holds for it and its version is the guard.
        let fip = match relabelled.get(fname) {
            Some(f) if f.status == seen_fip.status => f,
            _ => seen_fip,
        };
        crate::pair::status::apply_fip_status(ctx, fip, verdict.clone()).await?;
    }
    for change in &plan.key_changes {
        let Some(s) = &secret else {
            tracing::warn!(pair = %name, change = ?change, "a key change is planned but the key Secret is not known; planning again");
            return Ok(Action::requeue(Duration::from_secs(1)));
        };
        secret = Some(match change {
            KeyChange::FinishRotation => finish_rotation(ctx, s).await?,
            KeyChange::StartRotation { id } => start_rotation(ctx, pair, s, id, now).await?,
            KeyChange::RecordMembers => record_members(ctx, pair, s).await?,
        });
    }
    if let Some(status) = &plan.status {
        apply_status(ctx, &name, status).await?;
    }
    if !plan.departed.is_empty() {
        remove_member_entries(ctx, &name, &plan.departed).await?;
    }
    ctx.with_memory(&name, |m| m.pair = plan.memory.clone());
    if let Some((kind, id)) = &plan.handled {
        // Not fatal: the answer is already in the status (which also keeps the id from
        // being acted on again while it is the last one), and this process remembers
        // it; the annotation makes the record survive a restart of the operator.
        if let Err(e) = record_handled(ctx, pair, *kind, id).await {
            ctx.metrics.error(&e);
            tracing::warn!(pair = %name, id = %id, error = %e, "failed to record the handled request id (RBAC: patch hapairs?)");
        }
    }
    for ev in events.into_iter().chain(plan.events) {
        ctx.event(pair, ev).await;
    }
    if let Some(patch) = &plan.pair_labels {
        let pairs: Api<HAPair> = Api::all(ctx.client.clone());
        patch_member_labels(ctx, &pairs, "HAPair", &name, patch).await?;
    }
    Ok(Action::requeue(plan.requeue))
}

/// Applies one planned label patch; returns the FloatingIP as patched (for the others,
/// and when the object is gone: None).
async fn apply_labels(ctx: &Context, l: &model::LabelPatch) -> Result<Option<havip_crds::FloatingIP>, Error> {
    let ns = &ctx.settings.namespace;
    match l.target {
        LabelTarget::FloatingIP => {
            let api: Api<havip_crds::FloatingIP> = Api::all(ctx.client.clone());
            patch_member_labels(ctx, &api, "FloatingIP", &l.name, &l.patch).await
        }
        LabelTarget::Lease => {
            let api: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
            patch_member_labels(ctx, &api, "Lease", &l.name, &l.patch).await.map(|_| None)
        }
        LabelTarget::Secret => {
            let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
            patch_member_labels(ctx, &api, "Secret", &l.name, &l.patch).await.map(|_| None)
        }
    }
}

/// Removes the `status.members` entries of departed members (`(position, node)`, highest
/// position first) with one JSON patch that first tests each position still holds that
/// node (an entry added or removed since the cache was read fails the patch; the next
/// reconcile retries). A departed agent that still writes adds its entry back until it
/// notices; it is removed again then.
async fn remove_member_entries(ctx: &Context, name: &str, departed: &[(usize, String)]) -> Result<(), Error> {
    ctx.guard("status")?;
    let mut ops = Vec::new();
    for (i, node) in departed {
        ops.push(serde_json::json!({"op": "test", "path": format!("/status/members/{i}/node"), "value": node}));
        ops.push(serde_json::json!({"op": "remove", "path": format!("/status/members/{i}")}));
    }
    let patch: json_patch::Patch = match serde_json::from_value(serde_json::Value::Array(ops)) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(pair = %name, error = %e, "failed to build the JSON patch removing departed members");
            return Ok(());
        }
    };
    let api: Api<HAPair> = Api::all(ctx.client.clone());
    let pp = PatchParams { field_manager: Some(manager::OPERATOR.to_owned()), ..PatchParams::default() };
    match api.patch_status(name, &pp, &Patch::Json::<()>(patch)).await {
        Ok(_) => {
            let nodes: Vec<&str> = departed.iter().map(|(_, n)| n.as_str()).collect();
            tracing::info!(pair = %name, members = ?nodes, "removed the status entries of departed members");
            ctx.metrics.status_writes.get_or_create(&crate::metrics::KindLabels { kind: "HAPair" }).inc();
            Ok(())
        }
        // The entries moved since the cache was read (a failed test), or the pair is gone.
        Err(e) if is_status(&e, 422) || is_status(&e, 409) || is_status(&e, 404) => Ok(()),
        Err(source) => Err(Error::ApplyStatus { kind: "HAPair", name: name.to_owned(), source: Box::new(source) }),
    }
}

async fn apply_status(ctx: &Context, name: &str, status: &HAPairStatus) -> Result<(), Error> {
    ctx.guard("status")?;
    let api: Api<HAPair> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({
        "apiVersion": HAPair::api_version(&()),
        "kind": HAPair::kind(&()),
        "status": status,
    });
    api.patch_status(name, &PatchParams::apply(manager::OPERATOR).force(), &Patch::Apply(&patch))
        .await
        .map_err(|source| Error::ApplyStatus { kind: "HAPair", name: name.to_owned(), source: Box::new(source) })?;
    ctx.metrics.status_writes.get_or_create(&crate::metrics::KindLabels { kind: "HAPair" }).inc();
    tracing::debug!(pair = %name, phase = ?status.phase, "status applied");
    Ok(())
}

async fn record_handled(ctx: &Context, pair: &HAPair, kind: RequestKind, id: &str) -> Result<(), Error> {
    ctx.guard("annotation")?;
    let mut handled = handled_ids(pair.annotations());
    handled.insert(kind.key().to_owned(), id.to_owned());
    let value = serde_json::to_string(&handled).unwrap_or_default();
    let api: Api<HAPair> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({
        "apiVersion": HAPair::api_version(&()),
        "kind": HAPair::kind(&()),
        "metadata": {"name": pair.name_any(), "annotations": {annotation::HANDLED: value}},
    });
    api.patch(&pair.name_any(), &PatchParams::apply(manager::OPERATOR).force(), &Patch::Apply(&patch))
        .await
        .map_err(|source| Error::Annotate { kind: "HAPair", name: pair.name_any(), source: Box::new(source) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::{lease_seed, of_an_earlier_pair};
    use crate::model;
    use havip_crds::HAPair;
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn pair(uid: &str) -> HAPair {
        let mut p: HAPair = serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "HAPair",
            "metadata": {"name": "operator", "uid": uid},
            "spec": {"members": [{"node": "a", "priority": 200}, {"node": "b", "priority": 100}]},
        }))
        .unwrap();
        p.metadata.uid = Some(uid.to_owned());
        p
    }

    fn lease(owner_uid: Option<&str>, holder: &str, epoch: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("havip-operator".to_owned()),
                owner_references: owner_uid.map(|u| {
                    vec![OwnerReference {
                        api_version: "havip.io/v1alpha1".to_owned(),
                        kind: "HAPair".to_owned(),
                        name: "operator".to_owned(),
                        uid: u.to_owned(),
                        controller: Some(true),
                        block_owner_deletion: None,
                    }]
                }),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_transitions: Some(epoch),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn an_object_owned_by_another_pair_of_the_same_name_is_an_earlier_pairs() {
        let meta = |uid: Option<&str>| lease(uid, "a", 3).metadata;
        assert!(of_an_earlier_pair(&meta(Some("old")), Some("new")), "owned by the deleted incarnation");
        assert!(!of_an_earlier_pair(&meta(Some("new")), Some("new")), "this pair's own");
        assert!(!of_an_earlier_pair(&meta(None), Some("new")), "no owner (orphaned, or hand-made): not another pair's");
        assert!(!of_an_earlier_pair(&meta(Some("old")), None), "a pair without uid decides nothing");
        let mut both = meta(Some("old"));
        both.owner_references.as_mut().unwrap().extend(meta(Some("new")).owner_references.unwrap());
        assert!(!of_an_earlier_pair(&both, Some("new")), "also owned by this pair");
        let mut other_kind = meta(Some("old"));
        other_kind.owner_references.as_mut().unwrap()[0].kind = "Service".to_owned();
        assert!(!of_an_earlier_pair(&other_kind, Some("new")), "owned by something else");
    }

    #[test]
    fn a_new_pair_lease_carries_over_the_holder_and_epoch_of_the_pairs_old_lease() {
        let p = pair("u1");
        assert_eq!(
            lease_seed(&p, Some(&lease(Some("u1"), "a", 7))),
            model::LeaseSeed { holder: Some("a".to_owned()), epoch: 7, from: Some("havip-operator".to_owned()) }
        );
        // Nothing to carry over.
        assert_eq!(lease_seed(&p, None), model::LeaseSeed::default());
        // The old name held somebody else's Lease (the leader-election Lease for a pair
        // named `operator`, or a deleted pair's): start afresh.
        assert_eq!(lease_seed(&p, Some(&lease(None, "operator-pod-1", 4))), model::LeaseSeed::default());
        assert_eq!(lease_seed(&p, Some(&lease(Some("u0"), "a", 9))), model::LeaseSeed::default());
    }
}
