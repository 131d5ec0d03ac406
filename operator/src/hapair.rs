//! The HAPair reconcile: gather the observation from the caches, let [`crate::model`]
//! decide, then apply — Lease and key Secret first, status by server-side apply (only
//! when more than timestamps changed), the handled-request record, and the Events.
//!
//! Size: this file still interleaves the second decision (key rotation, requests) with the
//! writes; a pure plan in `model` that this file only applies would shrink it. It must
//! not decide anything the model does not say.

use crate::Error;
use crate::context::{Context, Ev, MANAGED_BY, PAIR_LABEL, lease_info};
use crate::error::is_status;
use crate::guard::{INVALID_REQUEUE, guarded_reconcile};
use crate::model::{self, Decision, KeyAction, KeyInfo, Observed, RequestKind};
use crate::status::label_members;
use havip_crds::{
    HAPair, HAPairStatus, KeyRotation, Operation, OperationResult, Phase, TransitionReason, manager, reason,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

const ROTATION_ID: &str = "havip.io/rotation-id";
const ROTATION_STARTED: &str = "havip.io/rotation-started";
const KEY_MEMBERS: &str = "havip.io/members";
/// Prefix of the rotation ids the operator starts itself when members leave.
const MEMBER_REMOVAL: &str = "member-removal-";
/// How long a role change waits for the new active to report its cause before it is
/// announced with the generic reason.
pub const ROLE_CHANGE_GRACE: Duration = Duration::from_secs(5);

/// Reconciles one HAPair (an unreadable one gets `InvalidSpec`; see [`crate::guard`]).
pub async fn reconcile(obj: Arc<DeserializeGuard<HAPair>>, ctx: Arc<Context>) -> Result<Action, Error> {
    guarded_reconcile(obj, ctx, reconcile_pair).await
}

fn secret_data(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .map(|v| v.trim().to_owned())
}

/// Reads the key Secret into [`KeyInfo`].
pub fn key_info(s: &Secret) -> Result<KeyInfo, String> {
    let key = secret_data(s, "key").ok_or("data.key is missing")?;
    if key.len() != 64 || !key.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err("data.key is not 64 hex digits".to_owned());
    }
    let key_id = secret_data(s, "keyId")
        .ok_or("data.keyId is missing")?
        .parse::<i64>()
        .map_err(|_| "data.keyId is not a decimal number".to_owned())?;
    let previous_key_id = match secret_data(s, "previousKeyId") {
        Some(v) => Some(v.parse::<i64>().map_err(|_| "data.previousKeyId is not a decimal number".to_owned())?),
        None => None,
    };
    let ann = s.annotations();
    Ok(KeyInfo {
        key_id,
        previous_key_id,
        rotation_id: ann.get(ROTATION_ID).cloned(),
        rotation_started: ann.get(ROTATION_STARTED).and_then(|t| t.parse::<Timestamp>().ok()),
        members: ann
            .get(KEY_MEMBERS)
            .map(|m| m.split(',').filter(|x| !x.is_empty()).map(str::to_owned).collect::<BTreeSet<_>>()),
    })
}

fn members_of(pair: &HAPair) -> String {
    let set: BTreeSet<&str> = pair.spec.members.iter().map(|m| m.node.as_str()).collect();
    set.into_iter().collect::<Vec<_>>().join(",")
}

fn owned_meta(pair: &HAPair, name: String, ns: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(ns.to_owned()),
        labels: Some(
            [(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()), (PAIR_LABEL.to_owned(), pair.name_any())]
                .into_iter()
                .chain(
                    model::member_labels(&pair.spec).into_iter().map(|k| (k, havip_crds::membership::VALUE.to_owned())),
                )
                .collect(),
        ),
        owner_references: pair.controller_owner_ref(&()).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}

/// What a new pair Lease starts from: no holder under epoch 0, or the holder and epoch
/// of the Lease an earlier release kept under the old name (so no epoch goes backwards).
#[derive(Clone, Debug, Default, PartialEq)]
struct LeaseSeed {
    holder: Option<String>,
    epoch: i32,
}

/// The seed of pair `pair`'s new Lease: from the Lease under the name of earlier
/// releases (`havip-<pair>`) if this very pair owns it (an unrelated Lease of that name,
/// such as the leader-election Lease for a pair named `operator`, is ignored).
fn lease_seed(pair: &HAPair, legacy: Option<&Lease>) -> LeaseSeed {
    let uid = pair.meta().uid.as_deref();
    let owned = |l: &Lease| {
        uid.is_some()
            && l.metadata
                .owner_references
                .as_ref()
                .is_some_and(|refs| refs.iter().any(|r| Some(r.uid.as_str()) == uid && r.kind == "HAPair"))
    };
    match legacy.filter(|l| owned(l)).and_then(|l| l.spec.as_ref()) {
        Some(spec) => LeaseSeed {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            epoch: spec.lease_transitions.unwrap_or(0).max(0),
        },
        None => LeaseSeed::default(),
    }
}

async fn create_lease(ctx: &Context, pair: &HAPair, name: &str, seed: &LeaseSeed) -> Result<Option<Lease>, Error> {
    ctx.guard("Lease")?;
    let ns = &ctx.settings.namespace;
    let lease = Lease {
        metadata: owned_meta(pair, name.to_owned(), ns),
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

async fn create_secret(ctx: &Context, pair: &HAPair, name: &str) -> Result<Option<Secret>, Error> {
    ctx.guard("Secret")?;
    let ns = &ctx.settings.namespace;
    let mut metadata = owned_meta(pair, name.to_owned(), ns);
    metadata.annotations = Some(BTreeMap::from([(KEY_MEMBERS.to_owned(), members_of(pair))]));
    let secret = Secret {
        metadata,
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([
            ("key".to_owned(), ByteString(model::random_key_hex()?.into_bytes())),
            ("keyId".to_owned(), ByteString(b"1".to_vec())),
        ])),
        ..Secret::default()
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    match api
        .create(&PostParams { field_manager: Some(manager::OPERATOR.to_owned()), ..PostParams::default() }, &secret)
        .await
    {
        Ok(s) => Ok(Some(s)),
        Err(e) if is_status(&e, 409) => Ok(None),
        Err(source) => {
            Err(Error::CreateSecret { namespace: ns.clone(), name: name.to_owned(), source: Box::new(source) })
        }
    }
}

/// Replaces the key Secret (compare-and-swap on its resourceVersion).
async fn replace_secret(ctx: &Context, secret: &Secret, what: &'static str) -> Result<Secret, Error> {
    ctx.guard("Secret")?;
    let ns = &ctx.settings.namespace;
    let name = secret.name_any();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    api.replace(
        &name,
        &PostParams { field_manager: Some(manager::OPERATOR.to_owned()), ..PostParams::default() },
        secret,
    )
    .await
    .map_err(|source| Error::UpdateSecret { namespace: ns.clone(), name, what, source: Box::new(source) })
}

/// Starts a rotation: a new random key with id + 1; the old one stays accepted as
/// `previousKey` until every member signs with the new one.
async fn start_rotation(
    ctx: &Context,
    pair: &HAPair,
    secret: &Secret,
    id: &str,
    now: Timestamp,
) -> Result<Secret, Error> {
    let mut s = secret.clone();
    let old_key = secret_data(secret, "key").unwrap_or_default();
    let old_id = secret_data(secret, "keyId").and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    let data = s.data.get_or_insert_with(BTreeMap::new);
    data.insert("key".to_owned(), ByteString(model::random_key_hex()?.into_bytes()));
    data.insert("keyId".to_owned(), ByteString((old_id + 1).to_string().into_bytes()));
    data.insert("previousKey".to_owned(), ByteString(old_key.into_bytes()));
    data.insert("previousKeyId".to_owned(), ByteString(old_id.to_string().into_bytes()));
    let ann = s.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(ROTATION_ID.to_owned(), id.to_owned());
    ann.insert(ROTATION_STARTED.to_owned(), now.to_string());
    ann.insert(KEY_MEMBERS.to_owned(), members_of(pair));
    s.metadata.managed_fields = None;
    replace_secret(ctx, &s, "start a key rotation").await
}

async fn finish_rotation(ctx: &Context, secret: &Secret) -> Result<Secret, Error> {
    let mut s = secret.clone();
    if let Some(d) = s.data.as_mut() {
        d.remove("previousKey");
        d.remove("previousKeyId");
    }
    if let Some(a) = s.metadata.annotations.as_mut() {
        a.remove(ROTATION_ID);
        a.remove(ROTATION_STARTED);
    }
    s.metadata.managed_fields = None;
    replace_secret(ctx, &s, "finish a key rotation").await
}

async fn record_members(ctx: &Context, pair: &HAPair, secret: &Secret) -> Result<Secret, Error> {
    let mut s = secret.clone();
    s.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(KEY_MEMBERS.to_owned(), members_of(pair));
    s.metadata.managed_fields = None;
    replace_secret(ctx, &s, "record the members").await
}

fn gather(pair: &HAPair, ctx: &Context, lease: Option<&Lease>, key: Option<KeyInfo>, now: Timestamp) -> Observed {
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
        match model::refusal(&info.name, &fip.spec.address, &conflicts, pair_of, &nodes) {
            None => vips.push(info),
            Some(r) => refused.push((info, r)),
        }
    }
    vips.sort_by(|a, b| a.name.cmp(&b.name));
    refused.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    Observed {
        refused,
        spec_problems: model::validate_spec(&name, &pair.spec, &ctx.settings.namespace),
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
    }
}

/// Role changes that are news somebody must look at: the VIPs moved because something
/// broke.
fn is_warning_transition(reason: &TransitionReason) -> bool {
    matches!(
        reason,
        TransitionReason::PeerLost
            | TransitionReason::CarrierLost
            | TransitionReason::GatewayLost
            | TransitionReason::VipUnhealthy
            | TransitionReason::Fenced
            | TransitionReason::DualActiveResolved
    )
}

fn operation_event(op: &Operation) -> Ev {
    let note = format!("{} {}: {}", op.kind, op.id, op.message);
    match op.result {
        OperationResult::Succeeded => Ev::normal(format!("{}Succeeded", op.kind), "Answer", note),
        OperationResult::InProgress => Ev::normal(format!("{}Started", op.kind), "Act", note),
        OperationResult::Refused => Ev::warning(format!("{}Refused", op.kind), "Refuse", note),
        OperationResult::Failed | OperationResult::Other(_) => {
            Ev::warning(format!("{}Failed", op.kind), "Answer", note)
        }
    }
}

async fn reconcile_pair(pair: &HAPair, ctx: &Context) -> Result<Action, Error> {
    match reconcile_pair_inner(pair, ctx).await {
        // A compare-and-swap on the key Secret lost against the operator's own previous
        // write that the cache does not show yet: try again shortly, quietly.
        Err(e @ Error::UpdateSecret { .. }) if e.is_conflict() => {
            tracing::debug!(pair = %pair.name_any(), error = %e, "key Secret changed meanwhile; retrying");
            Ok(Action::requeue(Duration::from_millis(500)))
        }
        other => other,
    }
}

async fn reconcile_pair_inner(pair: &HAPair, ctx: &Context) -> Result<Action, Error> {
    let name = pair.name_any();
    let ns = ctx.settings.namespace.clone();
    let now = Timestamp::now();
    let mut events: Vec<Ev> = Vec::new();
    let mut requeue = ctx.settings.resync;

    // The pair's Lease: created once, with no holder (or carried over from the Lease an
    // earlier release named `havip-<pair>`); afterwards only agents write it.
    let lease_name = model::lease_name(&name);
    let mut lease = ctx.leases.get(&ObjectRef::new(&lease_name).within(&ns)).map(|l| (*l).clone());
    if lease.is_none() && name.len() <= 63 {
        let legacy_name = havip_crds::lease::legacy_pair_lease_name(&name);
        let legacy = ctx.leases.get(&ObjectRef::new(&legacy_name).within(&ns));
        let seed = lease_seed(pair, legacy.as_deref());
        match create_lease(ctx, pair, &lease_name, &seed).await? {
            Some(l) => {
                let note = if seed == LeaseSeed::default() {
                    format!("created Lease {ns}/{lease_name} (no holder, epoch 0)")
                } else {
                    tracing::info!(pair = %name, lease = %lease_name, from = %legacy_name, holder = ?seed.holder, epoch = seed.epoch, "pair Lease carried over from the old name");
                    format!(
                        "created Lease {ns}/{lease_name} (holder {}, epoch {}) from the Lease {legacy_name} of an earlier release",
                        seed.holder.as_deref().unwrap_or("none"),
                        seed.epoch
                    )
                };
                events.push(Ev::normal("LeaseCreated", "Create", note));
                lease = Some(l);
            }
            // Created by a previous reconcile; the cache will catch up.
            None => requeue = requeue.min(Duration::from_secs(1)),
        }
    }

    // The key Secret, unless the spec names one.
    let secret_name = model::secret_name(&name);
    let mut secret = None;
    if pair.spec.heartbeat.key_secret_ref.is_none() && name.len() <= 63 {
        secret = ctx.secrets.get(&ObjectRef::new(&secret_name).within(&ns)).map(|s| (*s).clone());
        if secret.is_none() {
            match create_secret(ctx, pair, &secret_name).await? {
                Some(s) => {
                    events.push(Ev::normal(
                        "KeySecretCreated",
                        "Create",
                        format!("created heartbeat key Secret {ns}/{secret_name} (key 1)"),
                    ));
                    secret = Some(s);
                }
                None => requeue = requeue.min(Duration::from_secs(1)),
            }
        }
    }
    let key = match &secret {
        Some(s) => Some(key_info(s).map_err(|message| Error::MalformedSecret {
            namespace: ns.clone(),
            name: secret_name.clone(),
            message,
        })?),
        None => None,
    };

    let mut o = gather(pair, ctx, lease.as_ref(), key, now);
    // Requests this process already acted on count as handled even when the cache
    // lags behind the operator's own writes (no request is acted on twice).
    let remembered = ctx.with_memory(&name, |m| m.handled.clone());
    if !remembered.is_empty() {
        let mut handled_ids = model::handled_ids(&o.annotations);
        for (k, v) in remembered {
            handled_ids.insert(k, v);
        }
        o.annotations
            .insert(model::HANDLED_ANNOTATION.to_owned(), serde_json::to_string(&handled_ids).unwrap_or_default());
    }
    // Which FloatingIPs the agents get: each gets its Accepted condition, and the accepted
    // ones (only those) carry the members' labels the agents select on. The Lease and the
    // key Secret carry them too; the pair itself last, so that an agent that sees the pair
    // finds everything the pair needs.
    admit_floating_ips(ctx, pair, &o).await?;
    label_lease_and_secret(ctx, pair, lease.as_ref(), secret.as_ref()).await?;
    let revision = model::revision(&o);
    let assessment = model::assess(&o, &revision);
    fip_statuses(ctx, &o, &assessment).await?;
    let (transition, new_transition) = model::last_transition(&o);
    let mut command = o.status.command.clone();
    let mut last_op = o.status.last_operation.clone();
    let mut handled: Option<(RequestKind, String)> = None;

    // 1. The answer to the pending command.
    if let Some(cmd) = &command {
        if let Some(op) = model::command_answer(&o, cmd) {
            tracing::info!(pair = %name, id = %op.id, kind = %op.kind, result = %op.result, "command answered");
            events.push(operation_event(&op));
            last_op = Some(op);
            command = None;
        } else {
            requeue = requeue.min(model::command_deadline(&o, cmd) + Duration::from_millis(100));
        }
    }
    o.status.command = command.clone();

    // 2. The key Secret's own progress (finish a rotation, member replacement).
    if let Some(s) = secret.clone() {
        match model::key_action(&o) {
            KeyAction::FinishRotation => {
                let done = finish_rotation(ctx, &s).await?;
                let k = o.key.clone().unwrap_or_default();
                let id = k.rotation_id.clone().unwrap_or_default();
                let note = format!(
                    "every member signs with key {}; key {} is no longer accepted",
                    k.key_id,
                    k.previous_key_id.unwrap_or(0)
                );
                tracing::info!(pair = %name, id = %id, key_id = k.key_id, "key rotation complete");
                events.push(Ev::normal("KeyRotated", "Rotate", format!("rotation {id}: {note}")));
                // Answer a requested rotation (not one for a member removal), even if
                // another answer came in between: its requester is still waiting.
                if !id.is_empty() && !id.starts_with(MEMBER_REMOVAL) {
                    last_op = Some(Operation {
                        id,
                        kind: RequestKind::RotateKey.operation(),
                        result: OperationResult::Succeeded,
                        message: note,
                        time: Some(Time(now)),
                    });
                }
                o.key = key_info(&done).ok();
                secret = Some(done);
            }
            KeyAction::RotateForRemoval { removed } => {
                let id = format!("{MEMBER_REMOVAL}{}", pair.meta().generation.unwrap_or(0));
                let started = start_rotation(ctx, pair, &s, &id, now).await?;
                let note = format!(
                    "{} left the pair: rotating the heartbeat key so that {} can no longer join",
                    removed.join(", "),
                    if removed.len() == 1 { "it" } else { "they" }
                );
                tracing::info!(pair = %name, id = %id, removed = ?removed, "key rotation for member removal");
                events.push(Ev::normal("KeyRotationStarted", "Rotate", note));
                o.key = key_info(&started).ok();
                secret = Some(started);
            }
            KeyAction::RecordMembers => {
                let recorded = record_members(ctx, pair, &s).await?;
                o.key = key_info(&recorded).ok();
                secret = Some(recorded);
            }
            KeyAction::None => {}
        }
    }

    // 3. At most one new request per reconcile (each answer must be seen on its own).
    if let Some(req) = model::next_request(&o) {
        requeue = requeue.min(Duration::from_millis(200));
        match req {
            Err((kind, id, why)) => {
                let op = refused(kind, &id, why, now);
                events.push(operation_event(&op));
                last_op = Some(op);
                handled = Some((kind, id));
            }
            Ok(req) => {
                let decision = model::decide(&o, &assessment, &revision, &req);
                tracing::info!(pair = %name, id = %req.id, kind = %req.kind.operation(), decision = ?decision, "request");
                match decision {
                    Decision::Refuse(why) => {
                        let op = refused(req.kind, &req.id, why, now);
                        events.push(operation_event(&op));
                        last_op = Some(op);
                    }
                    Decision::Command(c) => {
                        events.push(Ev::normal(
                            format!("{}Requested", c.kind),
                            "Command",
                            format!(
                                "{} {}: asked {}{}",
                                c.kind,
                                c.id,
                                if c.kind.is_failover() { "the active member" } else { "every member" },
                                c.target.as_deref().map(|t| format!(" (target {t})")).unwrap_or_default()
                            ),
                        ));
                        requeue = requeue.min(model::COMMAND_TIMEOUT + Duration::from_millis(100));
                        command = Some(c);
                    }
                    Decision::RotateKey { key_id } => match secret.clone() {
                        Some(s) => {
                            let started = start_rotation(ctx, pair, &s, &req.id, now).await?;
                            o.key = key_info(&started).ok();
                            let op = Operation {
                                id: req.id.clone(),
                                kind: req.kind.operation(),
                                result: OperationResult::InProgress,
                                message: format!(
                                    "key {key_id} is in use; key {} stays accepted until every member signs with key {key_id}",
                                    key_id - 1
                                ),
                                time: Some(Time(now)),
                            };
                            events.push(operation_event(&op));
                            last_op = Some(op);
                        }
                        None => {
                            let op = refused(req.kind, &req.id, "the key Secret does not exist yet".to_owned(), now);
                            events.push(operation_event(&op));
                            last_op = Some(op);
                        }
                    },
                }
                handled = Some((req.kind, req.id));
            }
        }
    }

    let key_rotation = o.key.as_ref().filter(|k| k.previous_key_id.is_some()).map(|k| KeyRotation {
        id: k.rotation_id.clone().unwrap_or_default(),
        key_id: k.key_id,
        started: k.rotation_started.map(Time),
    });
    // Keep the timestamps of an unchanged rotation record.
    let key_rotation = match (key_rotation, &o.status.key_rotation) {
        (Some(mut k), Some(prev)) if prev.id == k.id && prev.key_id == k.key_id => {
            k.started = k.started.or_else(|| prev.started.clone());
            Some(k)
        }
        (k, _) => k,
    };
    let previous = pair.status.clone().unwrap_or_default();
    let desired =
        model::operator_status(&o, &assessment, &revision, transition.clone(), command, last_op, key_rotation);
    if model::without_timestamps(&desired) != model::without_timestamps(&previous) {
        apply_status(ctx, &name, &desired).await?;
    }
    let departed = model::departed_members(&o);
    if !departed.is_empty() {
        remove_member_entries(ctx, &name, &departed).await?;
    }
    if let Some((kind, id)) = handled {
        ctx.with_memory(&name, |m| m.handled.insert(kind.key().to_owned(), id.clone()));
        // Not fatal: the answer is already in the status (which also keeps the id from
        // being acted on again while it is the last one), and this process remembers
        // it; the annotation makes the record survive a restart of the operator.
        if let Err(e) = record_handled(ctx, pair, kind, &id).await {
            ctx.metrics.error(&e);
            tracing::warn!(pair = %name, id = %id, error = %e, "failed to record the handled request id (RBAC: patch hapairs?)");
        }
    }

    // The audit log: phase changes, role changes, member role changes.
    if previous.phase != desired.phase {
        let phase = desired.phase.unwrap_or(Phase::Pending);
        let bad = matches!(phase, Phase::Degraded | Phase::Failed | Phase::Suspended);
        let from = previous.phase.map(Phase::as_str).unwrap_or("(none)");
        let note = format!("{from} → {}: {}", phase.as_str(), assessment.phase_message);
        events.push(if bad {
            Ev::warning(phase.as_str(), "Assess", note)
        } else {
            Ev::normal(phase.as_str(), "Assess", note)
        });
    }
    // A role change is announced once its cause is known (the new active reports it),
    // or after ROLE_CHANGE_GRACE with the generic reason.
    if new_transition && let Some(t) = &transition {
        ctx.with_memory(&name, |m| m.unannounced_epoch = Some(t.epoch));
    }
    let pending = ctx.with_memory(&name, |m| m.unannounced_epoch);
    if let (Some(epoch), Some(t)) = (pending, &transition)
        && t.epoch == epoch
    {
        let since = t.time.as_ref().map(|x| now.as_millisecond() - x.0.as_millisecond()).unwrap_or(0);
        let grace = i64::try_from(ROLE_CHANGE_GRACE.as_millis()).unwrap_or(i64::MAX);
        if t.reason != TransitionReason::RoleChange || since >= grace {
            ctx.with_memory(&name, |m| m.unannounced_epoch = None);
            let note = format!(
                "{} → {} (epoch {}): {}",
                if t.from.is_empty() { "(nobody)" } else { &t.from },
                if t.to.is_empty() { "(nobody)" } else { &t.to },
                t.epoch,
                t.reason
            );
            tracing::info!(pair = %name, from = %t.from, to = %t.to, epoch = t.epoch, reason = %t.reason, "role change");
            events.push(if is_warning_transition(&t.reason) || t.to.is_empty() {
                Ev::warning(t.reason.as_str(), "ObserveRoleChange", note)
            } else {
                Ev::normal(t.reason.as_str(), "ObserveRoleChange", note)
            });
        } else {
            let left = u64::try_from(grace - since).unwrap_or(0);
            requeue = requeue.min(Duration::from_millis(left + 100));
        }
    }
    let member_changes = ctx.with_memory(&name, |m| {
        let mut out = Vec::new();
        for s in o.status.members.iter().filter(|s| o.spec.members.iter().any(|x| x.node == s.node)) {
            let Some(role) = s.role.clone() else { continue };
            if let Some(old) = m.roles.insert(s.node.clone(), role.clone())
                && old != role
            {
                out.push(format!("{}: {old} → {role} (epoch {})", s.node, s.epoch.unwrap_or(0)));
            }
        }
        out
    });
    for change in member_changes {
        events.push(Ev::normal("MemberRoleChanged", "ObserveRoleChange", change));
    }
    let node_missing: Vec<&str> = o.nodes.iter().filter(|(_, n)| n.is_none()).map(|(k, _)| k.as_str()).collect();
    let newly_lost = !node_missing.is_empty()
        && !previous.conditions.iter().any(|c| {
            c.type_ == havip_crds::condition::DEGRADED && c.reason == reason::MEMBER_LOST && c.status == "True"
        })
        && assessment.degraded.first().is_some_and(|c| c.reason == reason::MEMBER_LOST);
    if newly_lost {
        events.push(Ev::warning(
            reason::MEMBER_LOST,
            "Resolve",
            format!("member Node(s) {} do not exist", node_missing.join(", ")),
        ));
    }
    if !o.spec_problems.is_empty() {
        let was_invalid = previous.conditions.iter().any(|c| {
            c.type_ == havip_crds::condition::INVALID_SPEC
                && c.status == "True"
                && c.observed_generation == o.generation
        });
        if !was_invalid {
            events.push(Ev::warning(reason::INVALID_SPEC, "Validate", o.spec_problems.join("; ")));
        }
        requeue = requeue.max(INVALID_REQUEUE);
    }
    for ev in events {
        ctx.event(pair, ev).await;
    }
    let pairs: Api<HAPair> = Api::all(ctx.client.clone());
    label_members(ctx, &pairs, "HAPair", &name, pair.labels(), &model::member_labels(&pair.spec)).await?;
    if let Some(d) = model::next_staleness(&o) {
        requeue = requeue.min(d + Duration::from_secs(1));
    }
    if let Some(d) = model::next_settle(&o) {
        requeue = requeue.min(d + Duration::from_millis(100));
    }
    Ok(Action::requeue(requeue))
}

/// The member labels of each FloatingIP of the pair: the accepted ones carry them (the
/// agents select on them), the refused ones none.
async fn admit_floating_ips(ctx: &Context, pair: &HAPair, o: &Observed) -> Result<(), Error> {
    let members = model::member_labels(&pair.spec);
    let none = BTreeSet::new();
    let api: Api<havip_crds::FloatingIP> = Api::all(ctx.client.clone());
    for (name, refusal) in fip_refusals(o) {
        let Some(fip) = ctx.fips.get(&ObjectRef::new(name)) else { continue };
        let Ok(fip) = &fip.0 else { continue };
        let desired = if refusal.is_none() { &members } else { &none };
        label_members(ctx, &api, "FloatingIP", name, fip.labels(), desired).await?;
    }
    Ok(())
}

/// Each FloatingIP of the pair by name, with why it was refused (`None`: accepted).
fn fip_refusals(o: &Observed) -> impl Iterator<Item = (&str, Option<&model::Refusal>)> {
    o.vips.iter().map(|v| (v.name.as_str(), None)).chain(o.refused.iter().map(|(v, r)| (v.name.as_str(), Some(r))))
}

/// The operator's part of each FloatingIP's status (`Accepted`, `Ready`, `Conflict`,
/// `observedGeneration`, and `state: Pending` while nobody holds it), with an Event on a
/// refusal and on an acceptance after one.
async fn fip_statuses(ctx: &Context, o: &Observed, a: &model::Assessment) -> Result<(), Error> {
    for (name, refusal) in fip_refusals(o) {
        let Some(fip) = ctx.fips.get(&ObjectRef::new(name)) else { continue };
        let Ok(fip) = &fip.0 else { continue };
        let verdict = model::fip_verdict(o, a, fip, refusal);
        crate::status::apply_fip_status(ctx, fip, verdict).await?;
    }
    Ok(())
}

/// The member labels of the pair's Lease and key Secret: its own Secret carries the
/// pair's members; a Secret named by `keySecretRef` in the operator's namespace carries
/// the members of every pair that names it.
async fn label_lease_and_secret(
    ctx: &Context,
    pair: &HAPair,
    lease: Option<&Lease>,
    own_secret: Option<&Secret>,
) -> Result<(), Error> {
    let ns = &ctx.settings.namespace;
    let members = model::member_labels(&pair.spec);
    if let Some(l) = lease {
        let api: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
        label_members(ctx, &api, "Lease", &l.name_any(), l.labels(), &members).await?;
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    if let Some(s) = own_secret {
        label_members(ctx, &secrets, "Secret", &s.name_any(), s.labels(), &members).await?;
    }
    if let Some(r) = &pair.spec.heartbeat.key_secret_ref
        && r.namespace.as_deref().is_none_or(|n| n == ns)
        && let Some(s) = ctx.secrets.get(&ObjectRef::new(&r.name).within(ns))
    {
        let desired: BTreeSet<String> = ctx
            .pairs
            .state()
            .iter()
            .filter_map(|p| p.0.as_ref().ok())
            .filter(|p| {
                p.spec
                    .heartbeat
                    .key_secret_ref
                    .as_ref()
                    .is_some_and(|x| x.name == r.name && x.namespace.as_deref().is_none_or(|n| n == ns))
            })
            .flat_map(|p| model::member_labels(&p.spec))
            .chain(members.iter().cloned())
            .collect();
        label_members(ctx, &secrets, "Secret", &r.name, s.labels(), &desired).await?;
    }
    Ok(())
}

fn refused(kind: RequestKind, id: &str, why: String, now: Timestamp) -> Operation {
    Operation {
        id: id.to_owned(),
        kind: kind.operation(),
        result: OperationResult::Refused,
        message: why,
        time: Some(Time(now)),
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
    let mut handled = model::handled_ids(pair.annotations());
    handled.insert(kind.key().to_owned(), id.to_owned());
    let value = serde_json::to_string(&handled).unwrap_or_default();
    let api: Api<HAPair> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({
        "apiVersion": HAPair::api_version(&()),
        "kind": HAPair::kind(&()),
        "metadata": {"name": pair.name_any(), "annotations": {model::HANDLED_ANNOTATION: value}},
    });
    api.patch(&pair.name_any(), &PatchParams::apply(manager::OPERATOR).force(), &Patch::Apply(&patch))
        .await
        .map_err(|source| Error::Annotate { kind: "HAPair", name: pair.name_any(), source: Box::new(source) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

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
    fn a_new_pair_lease_carries_over_the_holder_and_epoch_of_the_pairs_old_lease() {
        let p = pair("u1");
        assert_eq!(
            lease_seed(&p, Some(&lease(Some("u1"), "a", 7))),
            LeaseSeed { holder: Some("a".to_owned()), epoch: 7 }
        );
        // Nothing to carry over.
        assert_eq!(lease_seed(&p, None), LeaseSeed::default());
        // The old name held somebody else's Lease (the leader-election Lease for a pair
        // named `operator`, or a deleted pair's): start afresh.
        assert_eq!(lease_seed(&p, Some(&lease(None, "operator-pod-1", 4))), LeaseSeed::default());
        assert_eq!(lease_seed(&p, Some(&lease(Some("u0"), "a", 9))), LeaseSeed::default());
    }
}
