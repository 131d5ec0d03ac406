//! The plan converges: applying a plan to the observation (as the API server would leave
//! the objects) and planning again yields no writes — for a new pair, a healthy one,
//! requests, key rotations, member changes and refused FloatingIPs, and for generated
//! observations.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::fip::fip_conditions;
use super::observed::{KeyInfo, LeaseInfo, Observed, Refusal, VipInfo};
use super::plan::{
    KeyChange, LabelTarget, LeaseSeed, MEMBER_REMOVAL, PairInputs, PairMemo, Plan, fip_status_current, key_after,
    new_key, plan,
};
use super::spec::{member_labels, member_nodes};
use super::tests::{apply_revision, fip, healthy, member, node};
use havip_crds::request::{RequestKind, annotation, handled_ids};
use havip_crds::{FloatingIP, FloatingIPSpec, MemberRole, OperationResult, Phase, VipState};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

fn fip_object(name: &str, spec: &FloatingIPSpec) -> FloatingIP {
    let mut f = FloatingIP::new(name, spec.clone());
    f.metadata.generation = Some(1);
    f
}

fn inputs(o: Observed) -> PairInputs {
    let fips = o
        .vips
        .iter()
        .chain(o.refused.iter().map(|(v, _)| v))
        .map(|v| (v.name.clone(), fip_object(&v.name, v.spec.as_ref().unwrap())))
        .collect();
    let lease_labels = o.lease.as_ref().map(|_| BTreeMap::new());
    let lease_annotations = lease_labels.clone();
    let secret_labels = o.key.as_ref().map(|_| BTreeMap::new());
    PairInputs {
        observed: o,
        namespace: "havip-system".to_owned(),
        lease_seed: LeaseSeed::default(),
        fips,
        pair_labels: BTreeMap::new(),
        lease_labels,
        lease_annotations,
        secret_labels,
        shared_secret: None,
        resync: Duration::from_secs(300),
    }
}

/// A JSON merge patch of `metadata.labels` applied to `labels`.
fn merge_labels(labels: &mut BTreeMap<String, String>, patch: &serde_json::Value) {
    let Some(m) = patch["metadata"]["labels"].as_object() else { panic!("not a label patch: {patch}") };
    merge_map(labels, m);
}

/// A member patch (labels and/or the member-nodes annotation) applied to an object's
/// `labels` and `annotations`.
fn merge_member_patch(
    labels: &mut BTreeMap<String, String>,
    annotations: &mut BTreeMap<String, String>,
    patch: &serde_json::Value,
) {
    let meta = &patch["metadata"];
    assert!(meta["labels"].is_object() || meta["annotations"].is_object(), "not a member patch: {patch}");
    if let Some(m) = meta["labels"].as_object() {
        merge_map(labels, m);
    }
    if let Some(m) = meta["annotations"].as_object() {
        assert!(m.keys().all(|k| k == havip_crds::membership::NODES_ANNOTATION), "{patch}");
        merge_map(annotations, m);
    }
}

fn merge_map(map: &mut BTreeMap<String, String>, m: &serde_json::Map<String, serde_json::Value>) {
    for (k, v) in m {
        match v.as_str() {
            Some(v) => map.insert(k.clone(), v.to_owned()),
            None => map.remove(k),
        };
    }
}

/// The observation after the API server took `p`'s writes.
fn applied(i: &PairInputs, p: &Plan) -> PairInputs {
    let mut i = i.clone();
    let members = member_labels(&i.observed.spec);
    let member_map: BTreeMap<String, String> =
        members.iter().map(|k| (k.clone(), havip_crds::membership::VALUE.to_owned())).collect();
    let now = i.observed.now;
    if let Some((seed, _)) = &p.create_lease {
        i.observed.lease =
            Some(LeaseInfo { holder: seed.holder.clone(), transitions: i64::from(seed.epoch), renew_time: None });
        i.lease_labels = Some(member_map.clone());
        let nodes = member_nodes(&i.observed.spec);
        i.lease_annotations = Some([(havip_crds::membership::NODES_ANNOTATION.to_owned(), nodes)].into());
    }
    if p.create_secret.is_some() {
        i.observed.key = Some(new_key(&i.observed.spec));
        i.secret_labels = Some(member_map.clone());
    }
    for l in &p.labels {
        match l.target {
            LabelTarget::FloatingIP => {
                let f = i.fips.get_mut(&l.name).unwrap();
                let m = &mut f.metadata;
                merge_member_patch(
                    m.labels.get_or_insert_with(BTreeMap::new),
                    m.annotations.get_or_insert_with(BTreeMap::new),
                    &l.patch,
                );
            }
            LabelTarget::Lease => {
                merge_member_patch(i.lease_labels.as_mut().unwrap(), i.lease_annotations.as_mut().unwrap(), &l.patch)
            }
            LabelTarget::Secret => match &mut i.shared_secret {
                Some(s) if s.name == l.name => merge_labels(&mut s.labels, &l.patch),
                _ => merge_labels(i.secret_labels.as_mut().unwrap(), &l.patch),
            },
        }
    }
    for (name, v) in &p.fip_verdicts {
        let f = i.fips.get_mut(name).unwrap();
        let generation = f.metadata.generation;
        let st = f.status.get_or_insert_with(Default::default);
        if v.pending {
            st.state = Some(VipState::Pending);
            st.holder = None;
            st.epoch = None;
        }
        st.conditions = fip_conditions(&st.conditions, v, generation, now);
        st.observed_generation = generation;
        let state = st.state;
        for vi in i.observed.vips.iter_mut().chain(i.observed.refused.iter_mut().map(|(v, _)| v)) {
            if vi.name == *name {
                vi.state = state;
            }
        }
    }
    for c in &p.key_changes {
        let k = i.observed.key.clone().expect("a key change needs a key");
        i.observed.key = Some(key_after(&k, c, &i.observed.spec, now));
    }
    if let Some(st) = &p.status {
        let mut st = st.clone();
        st.members = i.observed.status.members.clone();
        i.observed.status = st;
    }
    for (pos, node) in &p.departed {
        assert_eq!(&i.observed.status.members[*pos].node, node, "departed entries are addressed by position");
        i.observed.status.members.remove(*pos);
    }
    if let Some((kind, id)) = &p.handled {
        let mut ids = handled_ids(&i.observed.annotations);
        ids.insert(kind.key().to_owned(), id.clone());
        i.observed.annotations.insert(annotation::HANDLED.to_owned(), serde_json::to_string(&ids).unwrap());
    }
    if let Some(patch) = &p.pair_labels {
        merge_labels(&mut i.pair_labels, patch);
    }
    i
}

/// Plans, applies and plans again until quiet; returns the plans made. Panics when it
/// does not converge within `rounds` or the quiet plan still wants a FloatingIP write.
fn converge(i: PairInputs, rounds: usize) -> (Vec<Plan>, PairInputs, PairMemo) {
    let mut i = i;
    let mut memo = PairMemo::default();
    let mut plans = Vec::new();
    for _ in 0..rounds {
        let p = plan(&i, &memo);
        let quiet = p.is_quiet();
        if quiet {
            for (name, v) in &p.fip_verdicts {
                assert!(fip_status_current(&i.fips[name], v), "{name}: a FloatingIP write after convergence: {v:?}");
            }
            plans.push(p);
            return (plans, i, memo);
        }
        i = applied(&i, &p);
        memo = p.memory.clone();
        plans.push(p);
    }
    panic!("no quiet plan after {rounds} rounds: last {:#?}", plans.last());
}

#[test]
fn a_new_pair_is_created_labelled_and_reported_then_nothing_more_is_written() {
    let mut o = healthy();
    o.lease = None;
    o.key = None;
    o.status.members.clear();
    let (plans, after, _) = converge(inputs(o), 2);
    let first = &plans[0];
    assert_eq!(first.create_lease.as_ref().map(|(s, _)| s.clone()), Some(LeaseSeed::default()));
    assert!(first.create_secret.is_some());
    assert_eq!(first.labels.len(), 1, "the accepted FloatingIP gets the member labels: {:?}", first.labels);
    assert!(first.pair_labels.is_some());
    assert_eq!(first.status.as_ref().and_then(|s| s.phase), Some(Phase::Pending));
    let reasons: Vec<&str> = first.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Pending"], "creation Events travel with the creates: {reasons:?}");
    assert_eq!(plans.len(), 2, "the second plan is quiet");
    assert_eq!(after.observed.key.as_ref().map(|k| k.key_id), Some(1));
}

#[test]
fn a_healthy_pair_seen_for_the_first_time_writes_its_status_once() {
    let (plans, _, memo) = converge(inputs(healthy()), 3);
    assert_eq!(plans[0].status.as_ref().and_then(|s| s.phase), Some(Phase::Live));
    assert_eq!(plans.len(), 2, "{plans:#?}");
    assert_eq!(memo.roles.len(), 2, "roles remembered for the role-change Events");
}

#[test]
fn a_failover_request_is_commanded_once_and_recorded() {
    let (_, mut i, memo) = converge(inputs(healthy()), 3);
    i.observed.annotations.insert(annotation::FAILOVER.to_owned(), "r1".to_owned());
    let p = plan(&i, &memo);
    let cmd = p.status.as_ref().and_then(|s| s.command.clone()).expect("a command for the members");
    assert_eq!(cmd.id, "r1");
    assert_eq!(p.handled.as_ref().map(|(_, id)| id.as_str()), Some("r1"));
    assert_eq!(p.memory.handled.get(RequestKind::Failover.key()).map(String::as_str), Some("r1"));
    // Applied, and planned again (also with a cache that has not seen the handled record
    // yet: the memory keeps the request from being acted on twice).
    let after = applied(&i, &p);
    assert!(plan(&after, &p.memory).is_quiet(), "{:#?}", plan(&after, &p.memory));
    let mut lagging = after.clone();
    lagging.observed.annotations.remove(annotation::HANDLED);
    let again = plan(&lagging, &p.memory);
    assert!(again.handled.is_none() && again.events.is_empty(), "{again:#?}");
}

#[test]
fn a_key_rotation_starts_waits_for_the_members_and_finishes_each_once() {
    let (_, mut i, memo) = converge(inputs(healthy()), 3);
    i.observed.annotations.insert(annotation::ROTATE_KEY.to_owned(), "k1".to_owned());
    let p = plan(&i, &memo);
    assert_eq!(p.key_changes, [KeyChange::StartRotation { id: "k1".to_owned() }]);
    let started = p.status.as_ref().and_then(|s| s.key_rotation.clone()).expect("rotation in the status");
    assert_eq!((started.id.as_str(), started.key_id), ("k1", 2));
    let mut i = applied(&i, &p);
    let mut memo = p.memory.clone();
    let waiting = plan(&i, &memo);
    assert!(waiting.is_quiet(), "members still sign with key 1: {waiting:#?}");
    // Every member signs with key 2: the rotation finishes, once.
    for m in &mut i.observed.status.members {
        m.key_id = Some(2);
    }
    let p = plan(&i, &memo);
    assert_eq!(p.key_changes, [KeyChange::FinishRotation]);
    assert_eq!(
        p.status.as_ref().and_then(|s| s.last_operation.as_ref()).map(|o| o.result.clone()),
        Some(OperationResult::Succeeded)
    );
    i = applied(&i, &p);
    memo = p.memory.clone();
    assert!(plan(&i, &memo).is_quiet(), "{:#?}", plan(&i, &memo));
    assert_eq!(i.observed.key.as_ref().and_then(|k| k.previous_key_id), None);
}

#[test]
fn a_removed_member_loses_its_entry_and_the_key_rotates_once() {
    let (_, mut i, memo) = converge(inputs(healthy()), 3);
    // c joins, then b leaves.
    i.observed.spec.members[1].node = "c".to_owned();
    i.observed.generation = Some(2);
    i.observed.nodes.insert("c".to_owned(), node("10.0.0.3"));
    i.observed.nodes.remove("b");
    let now = i.observed.now;
    i.observed.status.members.push(member("c", MemberRole::Standby, now));
    apply_revision(&mut i.observed);
    let p = plan(&i, &memo);
    assert_eq!(p.departed, [(1, "b".to_owned())]);
    assert_eq!(p.key_changes, [KeyChange::StartRotation { id: format!("{MEMBER_REMOVAL}2") }]);
    let (plans, after, _) = converge(applied(&i, &p), 3);
    assert!(plans.len() <= 2, "{plans:#?}");
    assert!(after.observed.status.members.iter().all(|m| m.node != "b"));
}

#[test]
fn the_floating_ips_and_the_lease_list_the_members_by_name_and_follow_member_changes() {
    let nodes = |i: &PairInputs, fip: &str| {
        let f = i.fips[fip].metadata.annotations.clone().unwrap_or_default();
        let l = i.lease_annotations.clone().unwrap_or_default();
        let key = havip_crds::membership::NODES_ANNOTATION;
        (f.get(key).cloned(), l.get(key).cloned())
    };
    let (_, after, _) = converge(inputs(healthy()), 2);
    let fip = after.fips.keys().next().unwrap().clone();
    assert_eq!(nodes(&after, &fip), (Some("a,b".to_owned()), Some("a,b".to_owned())));
    // A member whose name is too long for a label name is listed in full.
    let long = format!("{}.example.internal", "node-".repeat(15));
    let mut i = after.clone();
    i.observed.spec.members[1].node = long.clone();
    let (plans, after, _) = converge(i, 3);
    assert!(plans[0].labels.iter().any(|l| l.target == LabelTarget::Lease), "{:?}", plans[0].labels);
    let want = format!("a,{long}");
    assert_eq!(nodes(&after, &fip), (Some(want.clone()), Some(want)));
}

#[test]
fn a_refused_floating_ip_loses_the_member_labels_and_says_why_once() {
    let mut o = healthy();
    let v = VipInfo { name: "other".to_owned(), spec: Some(fip("10.0.0.11/24")), state: None };
    o.refused.push((v, Refusal::AddressInUse { holder: "vip-elsewhere".to_owned(), pair: "q".to_owned() }));
    let mut i = inputs(o);
    // It carried the labels from before it was refused.
    let labels =
        member_labels(&i.observed.spec).into_iter().map(|k| (k, havip_crds::membership::VALUE.to_owned())).collect();
    i.fips.get_mut("other").unwrap().metadata.labels = Some(labels);
    let (plans, after, _) = converge(i, 3);
    assert!(plans[0].labels.iter().any(|l| l.name == "other" && l.target == LabelTarget::FloatingIP));
    assert!(after.fips["other"].metadata.labels.as_ref().is_none_or(|l| l.keys().all(|k| !k.starts_with("member."))));
    let annotations = after.fips["other"].metadata.annotations.clone().unwrap_or_default();
    assert!(!annotations.contains_key(havip_crds::membership::NODES_ANNOTATION), "{annotations:?}");
    let (_, v) = plans[0].fip_verdicts.iter().find(|(n, _)| n == "other").unwrap();
    assert_eq!(v.accepted.status, "False");
}

prop_compose! {
    fn observations()(
        lease in prop::option::of((prop::option::of(prop::sample::select(vec!["a", "b", ""])), 0i64..4)),
        key in prop::option::of((1i64..4, any::<bool>(), any::<bool>())),
        roles in prop::collection::vec(prop::option::of(prop::sample::select(vec![MemberRole::Active, MemberRole::Standby, MemberRole::Fenced, MemberRole::Maintenance])), 0..=2),
        key_ids in prop::collection::vec(1i64..4, 2),
        request in prop::option::of((prop::sample::select(vec![annotation::FAILOVER, annotation::ROTATE_KEY, annotation::CLEAR, annotation::FORCE_FAILOVER]), prop::sample::select(vec!["r1", "bad id!", "r2:b"]))),
        extra_member in any::<bool>(),
        labelled in any::<bool>(),
        missing_node in any::<bool>(),
    ) -> PairInputs {
        let mut o = healthy();
        let now = o.now;
        o.lease = lease.map(|(h, e)| LeaseInfo { holder: h.filter(|h| !h.is_empty()).map(str::to_owned), transitions: e, renew_time: None });
        o.key = key.map(|(id, rotating, recorded)| KeyInfo {
            key_id: id,
            previous_key_id: rotating.then_some(id - 1),
            rotation_id: rotating.then(|| "k0".to_owned()),
            rotation_started: None,
            members: recorded.then(|| ["a".to_owned(), "b".to_owned()].into()),
        });
        o.status.members = roles.iter().zip(["a", "b"]).filter_map(|(r, n)| r.clone().map(|r| member(n, r, now))).collect();
        for (m, k) in o.status.members.iter_mut().zip(&key_ids) {
            m.key_id = Some(*k);
        }
        if extra_member {
            o.status.members.push(member("gone", MemberRole::Standby, now));
        }
        if missing_node {
            o.nodes.insert("b".to_owned(), None);
        }
        if let Some((k, v)) = request {
            o.annotations.insert(k.to_owned(), v.to_owned());
        }
        apply_revision(&mut o);
        let mut i = inputs(o);
        if labelled {
            i.pair_labels = member_labels(&i.observed.spec).into_iter().map(|k| (k, havip_crds::membership::VALUE.to_owned())).collect();
        }
        i
    }
}

proptest! {
    #[test]
    fn every_plan_converges_to_no_writes(i in observations()) {
        // A request, a key change and the writes that follow take at most four rounds.
        let (plans, _, _) = converge(i, 5);
        prop_assert!(plans.last().is_some_and(Plan::is_quiet));
    }
}
