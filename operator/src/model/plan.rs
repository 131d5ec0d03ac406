//! The HAPair reconcile as one pure function: [`plan`] takes what the operator observed
//! ([`PairInputs`]) and what it remembers ([`PairMemo`]) and returns every write the
//! reconcile makes ([`Plan`]), in the order the controller ([`crate::pair::hapair`]) applies
//! them. Where the plan creates or changes an object (the Lease, the key Secret), it goes
//! on from the object as that write leaves it, so one plan covers a whole reconcile.
//! Applying a plan to the observation and planning again yields no writes (tested).

use super::assess::{assess, next_settle};
use super::events::{
    Announcement, Ev, command_event, invalid_spec_event, member_lost_event, member_role_events, operation_event,
    phase_event, role_change_announcement, route_events,
};
use super::fip::{FipVerdict, fip_conditions_current, fip_verdict};
use super::keys::{KeyAction, key_action};
use super::observed::{COMMAND_TIMEOUT, INVALID_REQUEUE, KeyInfo, LeaseInfo, Observed, Refusal};
use super::requests::{Decision, command_answer, command_deadline, decide, next_request};
use super::spec::{lease_name, member_label_patch, member_labels, member_nodes, member_patch, revision, secret_name};
use super::status::{departed_members, last_transition, next_staleness, operator_status, without_timestamps};
use havip_crds::request::{RequestKind, annotation, handled_ids};
use havip_crds::{FloatingIP, HAPairSpec, HAPairStatus, KeyRotation, MemberRole, Operation, OperationResult, reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Prefix of the rotation ids the operator starts itself when members leave.
pub const MEMBER_REMOVAL: &str = "member-removal-";

/// What the operator remembers about a pair between reconciles, as far as the plan
/// reads it (lost on restart: nothing here is needed for correctness).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PairMemo {
    /// Member roles last seen (for role-change Events).
    pub roles: BTreeMap<String, MemberRole>,
    /// Routed VIPs: the members whose speakers advertised each, as last seen (for the
    /// route Events).
    pub routes: BTreeMap<String, BTreeSet<String>>,
    /// A role change seen but not yet announced by an Event (epoch), waiting for the
    /// new active to report why.
    pub unannounced_epoch: Option<i64>,
    /// Request ids acted on by this process (per request kind key), in case the cache
    /// does not show the operator's own record yet when the pair is reconciled again.
    pub handled: BTreeMap<String, String>,
}

/// What a new pair Lease starts from: no holder under epoch 0, or the holder and epoch
/// of the Lease an earlier release kept under the old name (so no epoch goes backwards).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseSeed {
    /// The holder.
    pub holder: Option<String>,
    /// The epoch (`leaseTransitions`).
    pub epoch: i32,
    /// The Lease it was carried over from (None: a fresh start).
    pub from: Option<String>,
}

/// A Secret named by `keySecretRef` in the operator's namespace, shared by the pairs
/// that name it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedSecret {
    /// Its name.
    pub name: String,
    /// Its labels now.
    pub labels: BTreeMap<String, String>,
    /// The member labels of every other pair that names it.
    pub others: BTreeSet<String>,
}

/// Everything one HAPair reconcile decides from.
#[derive(Clone, Debug)]
pub struct PairInputs {
    /// The pair as the model sees it.
    pub observed: Observed,
    /// The operator's namespace (where the Lease and the key Secret live).
    pub namespace: String,
    /// What the Lease starts from if it must be created.
    pub lease_seed: LeaseSeed,
    /// The pair's FloatingIPs (accepted and refused) by name.
    pub fips: BTreeMap<String, FloatingIP>,
    /// The pair's own labels.
    pub pair_labels: BTreeMap<String, String>,
    /// The Lease's labels (None: no Lease yet).
    pub lease_labels: Option<BTreeMap<String, String>>,
    /// The Lease's annotations (None: no Lease yet).
    pub lease_annotations: Option<BTreeMap<String, String>>,
    /// The own key Secret's labels (None: none yet, or `keySecretRef` names one).
    pub secret_labels: Option<BTreeMap<String, String>>,
    /// The Secret `keySecretRef` names, when it is in the operator's namespace and exists.
    pub shared_secret: Option<SharedSecret>,
    /// How long until the pair is looked at again when nothing is due sooner.
    pub resync: Duration,
}

/// Which kind of object a label patch is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelTarget {
    /// A FloatingIP (cluster-scoped).
    FloatingIP,
    /// The pair's Lease (operator namespace).
    Lease,
    /// A key Secret (operator namespace).
    Secret,
}

/// A merge patch of one object's member labels (and, on FloatingIPs and the Lease, of the
/// annotation listing the members by name: [`member_patch`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LabelPatch {
    /// The object's kind.
    pub target: LabelTarget,
    /// Its name.
    pub name: String,
    /// The patch (`{"metadata":{"labels":{…}}}`).
    pub patch: serde_json::Value,
}

/// A change of the key Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyChange {
    /// Every member signs with the new key: drop the previous one.
    FinishRotation,
    /// A new random key under the next id; the old one stays accepted meanwhile.
    StartRotation {
        /// The rotation id (a request id, or [`MEMBER_REMOVAL`] + generation).
        id: String,
    },
    /// Record the member set the key is issued for.
    RecordMembers,
}

/// The member set a key Secret records for `spec`.
pub fn spec_member_set(spec: &HAPairSpec) -> BTreeSet<String> {
    spec.members.iter().map(|m| m.node.clone()).filter(|n| !n.is_empty()).collect()
}

/// The key Secret as `change` leaves it (`now`: when a rotation starts).
pub fn key_after(k: &KeyInfo, change: &KeyChange, spec: &HAPairSpec, now: Timestamp) -> KeyInfo {
    let mut k = k.clone();
    match change {
        KeyChange::FinishRotation => {
            k.previous_key_id = None;
            k.rotation_id = None;
            k.rotation_started = None;
        }
        KeyChange::StartRotation { id } => {
            k.previous_key_id = Some(k.key_id);
            k.key_id += 1;
            k.rotation_id = Some(id.clone());
            k.rotation_started = Some(now);
            k.members = Some(spec_member_set(spec));
        }
        KeyChange::RecordMembers => k.members = Some(spec_member_set(spec)),
    }
    k
}

/// The key Secret the operator creates: key 1, issued for the spec's members.
pub fn new_key(spec: &HAPairSpec) -> KeyInfo {
    KeyInfo { key_id: 1, members: Some(spec_member_set(spec)), ..KeyInfo::default() }
}

/// Every write of one HAPair reconcile, in the order they are applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Create the Lease from this seed; the Event goes out if the create happened.
    pub create_lease: Option<(LeaseSeed, Ev)>,
    /// Create the key Secret; the Event goes out if the create happened.
    pub create_secret: Option<Ev>,
    /// Member labels of the FloatingIPs (accepted ones carry them, refused ones none),
    /// the Lease and the key Secret(s): before the pair's own, so that an agent that
    /// sees the pair finds everything the pair needs.
    pub labels: Vec<LabelPatch>,
    /// The operator's part of each FloatingIP's status (applied where it changed).
    pub fip_verdicts: Vec<(String, FipVerdict)>,
    /// Key Secret changes, in order (each on the result of the previous).
    pub key_changes: Vec<KeyChange>,
    /// The operator's status (None: unchanged but for timestamps).
    pub status: Option<HAPairStatus>,
    /// Status entries of departed members to remove (position, node; highest first).
    pub departed: Vec<(usize, String)>,
    /// The request acted on, to record in the handled annotation.
    pub handled: Option<(RequestKind, String)>,
    /// The memory after this reconcile.
    pub memory: PairMemo,
    /// Events, after the writes.
    pub events: Vec<Ev>,
    /// The pair's own member labels, last.
    pub pair_labels: Option<serde_json::Value>,
    /// When to look again.
    pub requeue: Duration,
}

impl Plan {
    /// True when the plan writes nothing (FloatingIP verdicts are checked against the
    /// objects separately: see [`fip_status_current`]).
    pub fn is_quiet(&self) -> bool {
        self.create_lease.is_none()
            && self.create_secret.is_none()
            && self.labels.is_empty()
            && self.key_changes.is_empty()
            && self.status.is_none()
            && self.departed.is_empty()
            && self.handled.is_none()
            && self.events.is_empty()
            && self.pair_labels.is_none()
    }
}

/// True when `fip`'s status already says what `v` says (no write is due).
pub fn fip_status_current(fip: &FloatingIP, v: &FipVerdict) -> bool {
    let generation = fip.metadata.generation;
    let previous = fip.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    !v.pending
        && fip_conditions_current(previous, v, generation)
        && fip.status.as_ref().is_some_and(|s| s.observed_generation == generation)
}

/// Each FloatingIP of the pair by name, with why it was refused (`None`: accepted).
pub fn fip_refusals(o: &Observed) -> impl Iterator<Item = (&str, Option<&Refusal>)> {
    o.vips.iter().map(|v| (v.name.as_str(), None)).chain(o.refused.iter().map(|(v, r)| (v.name.as_str(), Some(r))))
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

/// Plans one HAPair reconcile.
pub fn plan(i: &PairInputs, memo: &PairMemo) -> Plan {
    let mut o = i.observed.clone();
    let previous = i.observed.status.clone();
    let name = o.name.clone();
    let ns = i.namespace.as_str();
    let now = o.now;
    let mut memory = memo.clone();
    let mut events: Vec<Ev> = Vec::new();
    let mut requeue = i.resync;
    // Object names derived from the pair's must fit in 63 characters.
    let fits = name.len() <= 63;

    // The pair's Lease: created once, with no holder (or carried over from the Lease an
    // earlier release named `havip-<pair>`); afterwards only agents write it.
    let mut create_lease = None;
    if o.lease.is_none() && fits {
        let seed = i.lease_seed.clone();
        let lease_name = lease_name(&name);
        let note = match &seed.from {
            None => format!("created Lease {ns}/{lease_name} (no holder, epoch 0)"),
            Some(from) => format!(
                "created Lease {ns}/{lease_name} (holder {}, epoch {}) from the Lease {from} of an earlier release",
                seed.holder.as_deref().unwrap_or("none"),
                seed.epoch
            ),
        };
        o.lease = Some(LeaseInfo {
            holder: seed.holder.clone().filter(|h| !h.is_empty()),
            transitions: i64::from(seed.epoch),
            renew_time: None,
        });
        create_lease = Some((seed, Ev::normal(reason::LEASE_CREATED, "Create", note)));
    }

    // The key Secret, unless the spec names one.
    let own_secret = o.spec.heartbeat.key_secret_ref.is_none() && fits;
    let mut create_secret = None;
    if own_secret && o.key.is_none() {
        let note = format!("created heartbeat key Secret {ns}/{} (key 1)", secret_name(&name));
        create_secret = Some(Ev::normal(reason::KEY_SECRET_CREATED, "Create", note));
        o.key = Some(new_key(&o.spec));
    }

    // Requests this process already acted on count as handled even when the cache lags
    // behind the operator's own writes (no request is acted on twice).
    if !memory.handled.is_empty() {
        let mut ids = handled_ids(&o.annotations);
        ids.extend(memory.handled.iter().map(|(k, v)| (k.clone(), v.clone())));
        o.annotations.insert(annotation::HANDLED.to_owned(), serde_json::to_string(&ids).unwrap_or_default());
    }

    // Member labels: accepted FloatingIPs carry them, refused ones none; the Lease and
    // the key Secret(s) too (objects created now are created with them).
    let members = member_labels(&o.spec);
    let none = BTreeSet::new();
    let mut labels = Vec::new();
    // The FloatingIPs and the Lease (what the agents write) also list the members by their
    // full names: the admission policies check membership by that.
    let nodes = member_nodes(&o.spec);
    let empty = BTreeMap::new();
    for (fname, refusal) in fip_refusals(&o) {
        if let Some(f) = i.fips.get(fname) {
            let current = f.metadata.labels.as_ref().unwrap_or(&empty);
            let annotations = f.metadata.annotations.as_ref().unwrap_or(&empty);
            let (desired, listed) = if refusal.is_none() { (&members, Some(nodes.as_str())) } else { (&none, None) };
            if let Some(patch) = member_patch(current, annotations, desired, listed) {
                labels.push(LabelPatch { target: LabelTarget::FloatingIP, name: fname.to_owned(), patch });
            }
        }
    }
    if create_lease.is_none()
        && let Some(current) = &i.lease_labels
        && let Some(patch) =
            member_patch(current, i.lease_annotations.as_ref().unwrap_or(&empty), &members, Some(nodes.as_str()))
    {
        labels.push(LabelPatch { target: LabelTarget::Lease, name: lease_name(&name), patch });
    }
    let mut label = |target, name: &str, current: &BTreeMap<String, String>, desired: &BTreeSet<String>| {
        if let Some(patch) = member_label_patch(current, desired) {
            labels.push(LabelPatch { target, name: name.to_owned(), patch });
        }
    };
    if own_secret
        && create_secret.is_none()
        && let Some(current) = &i.secret_labels
    {
        label(LabelTarget::Secret, &secret_name(&name), current, &members);
    }
    if let Some(s) = &i.shared_secret {
        let desired: BTreeSet<String> = s.others.iter().chain(members.iter()).cloned().collect();
        label(LabelTarget::Secret, &s.name, &s.labels, &desired);
    }

    let revision = revision(&o);
    let assessment = assess(&o, &revision);
    let fip_verdicts = fip_refusals(&o)
        .filter_map(|(fname, refusal)| {
            i.fips.get(fname).map(|f| (fname.to_owned(), fip_verdict(&o, &assessment, f, refusal)))
        })
        .collect();
    let (transition, new_transition) = last_transition(&o);
    let mut command = o.status.command.clone();
    let mut last_op = o.status.last_operation.clone();
    let mut handled: Option<(RequestKind, String)> = None;
    let mut key_changes = Vec::new();

    // 1. The answer to the pending command.
    if let Some(cmd) = &command {
        if let Some(op) = command_answer(&o, cmd) {
            events.push(operation_event(&op));
            last_op = Some(op);
            command = None;
        } else {
            requeue = requeue.min(command_deadline(&o, cmd) + Duration::from_millis(100));
        }
    }
    o.status.command = command.clone();

    // 2. The key Secret's own progress (finish a rotation, member replacement).
    if let Some(k) = o.key.clone() {
        let change = match key_action(&o) {
            KeyAction::FinishRotation => {
                let id = k.rotation_id.clone().unwrap_or_default();
                let note = format!(
                    "every member signs with key {}; key {} is no longer accepted",
                    k.key_id,
                    k.previous_key_id.unwrap_or(0)
                );
                events.push(Ev::normal(reason::KEY_ROTATED, "Rotate", format!("rotation {id}: {note}")));
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
                Some(KeyChange::FinishRotation)
            }
            KeyAction::RotateForRemoval { removed } => {
                let id = format!("{MEMBER_REMOVAL}{}", o.generation.unwrap_or(0));
                let note = format!(
                    "{} left the pair: rotating the heartbeat key so that {} can no longer join",
                    removed.join(", "),
                    if removed.len() == 1 { "it" } else { "they" }
                );
                events.push(Ev::normal(reason::KEY_ROTATION_STARTED, "Rotate", note));
                Some(KeyChange::StartRotation { id })
            }
            KeyAction::RecordMembers => Some(KeyChange::RecordMembers),
            KeyAction::None => None,
        };
        if let Some(c) = change {
            o.key = Some(key_after(&k, &c, &o.spec, now));
            key_changes.push(c);
        }
    }

    // 3. At most one new request per reconcile (each answer must be seen on its own).
    if let Some(req) = next_request(&o) {
        requeue = requeue.min(Duration::from_millis(200));
        let (kind, id, op) = match req {
            Err((kind, id, why)) => {
                let op = refused(kind, &id, why, now);
                (kind, id, Some(op))
            }
            Ok(req) => {
                let op = match decide(&o, &assessment, &revision, &req) {
                    Decision::Refuse(why) => Some(refused(req.kind, &req.id, why, now)),
                    Decision::Command(c) => {
                        events.push(command_event(&c));
                        requeue = requeue.min(COMMAND_TIMEOUT + Duration::from_millis(100));
                        command = Some(c);
                        None
                    }
                    Decision::RotateKey { key_id } => match o.key.clone() {
                        Some(k) => {
                            let change = KeyChange::StartRotation { id: req.id.clone() };
                            o.key = Some(key_after(&k, &change, &o.spec, now));
                            key_changes.push(change);
                            Some(Operation {
                                id: req.id.clone(),
                                kind: req.kind.operation(),
                                result: OperationResult::InProgress,
                                message: format!(
                                    "key {key_id} is in use; key {} stays accepted until every member signs with key {key_id}",
                                    key_id - 1
                                ),
                                time: Some(Time(now)),
                            })
                        }
                        None => Some(refused(req.kind, &req.id, "the key Secret does not exist yet".to_owned(), now)),
                    },
                };
                (req.kind, req.id, op)
            }
        };
        if let Some(op) = op {
            events.push(operation_event(&op));
            last_op = Some(op);
        }
        memory.handled.insert(kind.key().to_owned(), id.clone());
        handled = Some((kind, id));
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
    let desired = operator_status(&o, &assessment, &revision, transition.clone(), command, last_op, key_rotation);
    let departed = departed_members(&o);

    // The audit log: phase changes, role changes, member role changes.
    events.extend(phase_event(&previous, &desired, &assessment));
    if new_transition && let Some(t) = &transition {
        memory.unannounced_epoch = Some(t.epoch);
    }
    match role_change_announcement(transition.as_ref(), memory.unannounced_epoch, now) {
        Announcement::None => {}
        Announcement::Now(ev) => {
            memory.unannounced_epoch = None;
            events.push(ev);
        }
        Announcement::Wait(d) => requeue = requeue.min(d),
    }
    events.extend(member_role_events(&o, &mut memory.roles));
    events.extend(route_events(&o, &mut memory.routes));
    events.extend(member_lost_event(&o, &previous, &assessment));
    events.extend(invalid_spec_event(&o, &previous));
    if !o.spec_problems.is_empty() {
        requeue = requeue.max(INVALID_REQUEUE);
    }
    if let Some(d) = next_staleness(&o) {
        requeue = requeue.min(d + Duration::from_secs(1));
    }
    if let Some(d) = next_settle(&o) {
        requeue = requeue.min(d + Duration::from_millis(100));
    }
    let status = (without_timestamps(&desired) != without_timestamps(&previous)).then_some(desired);
    Plan {
        create_lease,
        create_secret,
        labels,
        fip_verdicts,
        key_changes,
        status,
        departed,
        handled,
        memory,
        events,
        pair_labels: member_label_patch(&i.pair_labels, &members),
        requeue,
    }
}
