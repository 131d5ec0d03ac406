//! Pure tests of the operator's decisions: one per phase, one per Degraded reason,
//! request parsing and preconditions, command answers, key rotation, the revision.
//!
//! Size: one test per phase, reason and request kind; long by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::addresses::{AddressIndex, ApiServerSource};
use super::assess::{Assessment, assess, next_settle};
use super::fip::{fip_conditions, fip_conditions_current, fip_verdict, orphan_verdict};
use super::keys::{KeyAction, key_action, random_key_hex};
use super::requests::{Decision, command_answer, command_deadline, decide, next_request};
use super::spec::{
    is_dns1123_subdomain, lease_name, member_addresses, member_label_patch, member_labels, member_nodes, member_patch,
    published_addresses, refusal, revision, validate_spec,
};
use super::status::{conditions, last_transition, next_staleness, operator_status, without_timestamps};
use super::{HANDOVER_SETTLE, KeyInfo, LeaseInfo, NodeInfo, Observed, Refusal, VipInfo};
use havip_crds::hapair::{MemberStatus, PathHeard, VipReadiness};
use havip_crds::request::{Request, RequestKind, annotation};
use havip_crds::revision::{config_revision, format_revision};
use havip_crds::{FloatingIPSpec, HAPairSpec, Transition};
use havip_crds::{
    HAPairStatus, MemberAlarm, MemberRole, Operation, OperationKind, OperationResult, PairCommand, Phase,
    TransitionReason, VipState, condition, reason,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().expect("ip")
}

pub(super) fn t(secs_ago: i64, now: Timestamp) -> Time {
    Time(Timestamp::from_second(now.as_second() - secs_ago).unwrap())
}

pub(super) fn spec() -> HAPairSpec {
    serde_json::from_value(serde_json::json!({
        "members": [{"node": "a", "priority": 200}, {"node": "b", "priority": 100}]
    }))
    .unwrap()
}

pub(super) fn fip(addr: &str) -> FloatingIPSpec {
    serde_json::from_value(serde_json::json!({"pair": "p", "address": addr})).unwrap()
}

pub(super) fn member(node: &str, role_: MemberRole, now: Timestamp) -> MemberStatus {
    MemberStatus {
        node: node.to_owned(),
        role: Some(role_),
        epoch: Some(1),
        ready: vec![VipReadiness { address: "10.0.0.10/24".to_owned(), ready: true, reason: None }],
        heard: vec![PathHeard { path: "internal".to_owned(), heard: true }],
        agent_version: Some("0.1.0".to_owned()),
        protocol_version: Some("1.0".to_owned()),
        key_id: Some(1),
        last_seen: Some(t(5, now)),
        ..MemberStatus::default()
    }
}

pub(super) fn node(ip: &str) -> Option<NodeInfo> {
    Some(NodeInfo { addresses: vec![("InternalIP".to_owned(), ip.to_owned())] })
}

/// A healthy pair: a (preferred) active, b a ready standby, both on the revision.
pub(super) fn healthy() -> Observed {
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let mut o = Observed {
        name: "p".to_owned(),
        spec: spec(),
        status: HAPairStatus::default(),
        generation: Some(1),
        annotations: BTreeMap::new(),
        nodes: BTreeMap::from([("a".to_owned(), node("10.0.0.1")), ("b".to_owned(), node("10.0.0.2"))]),
        lease: Some(LeaseInfo { holder: Some("a".to_owned()), transitions: 1, renew_time: Some(t(60, now).0) }),
        key: Some(KeyInfo { key_id: 1, members: Some(["a".to_owned(), "b".to_owned()].into()), ..KeyInfo::default() }),
        vips: vec![VipInfo {
            name: "vip".to_owned(),
            spec: Some(fip("10.0.0.10/24")),
            state: Some(VipState::Announced),
        }],
        refused: Vec::new(),
        spec_problems: Vec::new(),
        now,
    };
    o.status.members = vec![member("a", MemberRole::Active, now), member("b", MemberRole::Standby, now)];
    apply_revision(&mut o);
    o
}

pub(super) fn apply_revision(o: &mut Observed) {
    let rev = revision(o);
    for m in &mut o.status.members {
        m.applied_revision = Some(rev.clone());
    }
}

fn m<'a>(o: &'a mut Observed, node: &str) -> &'a mut MemberStatus {
    o.status.members.iter_mut().find(|m| m.node == node).unwrap()
}

fn run(o: &Observed) -> Assessment {
    assess(o, &revision(o))
}

fn reasons(a: &Assessment) -> Vec<&'static str> {
    a.degraded.iter().map(|c| c.reason).collect()
}

#[test]
fn phase_live() {
    let a = run(&healthy());
    assert_eq!(a.phase, Phase::Live, "{a:?}");
    assert_eq!(a.active.as_deref(), Some("a"));
    assert_eq!(a.standbys, vec!["b"]);
    assert_eq!(a.epoch, 1);
    assert!(a.degraded.is_empty());
}

#[test]
fn phase_pending_before_any_report_and_before_election() {
    let mut o = healthy();
    o.status.members.clear();
    let a = run(&o);
    assert_eq!(a.phase, Phase::Pending);
    assert!(a.phase_message.contains("no member has reported"), "{}", a.phase_message);

    let mut o = healthy();
    o.lease = Some(LeaseInfo::default());
    let a = run(&o);
    assert_eq!(a.phase, Phase::Pending);
    assert!(a.phase_message.contains("nobody has been elected"), "{}", a.phase_message);
}

#[test]
fn phase_failed_over() {
    let mut o = healthy();
    o.lease = Some(LeaseInfo { holder: Some("b".to_owned()), transitions: 2, renew_time: None });
    m(&mut o, "a").role = Some(MemberRole::Standby);
    m(&mut o, "b").role = Some(MemberRole::Active);
    let a = run(&o);
    assert_eq!(a.phase, Phase::FailedOver, "{a:?}");
    assert_eq!(a.standbys, vec!["a"]);
    assert!(a.phase_message.contains("instead of the preferred a"), "{}", a.phase_message);
}

#[test]
fn phase_failed_when_nobody_holds_the_vips() {
    let mut o = healthy();
    o.lease = Some(LeaseInfo { holder: None, transitions: 3, renew_time: None });
    assert_eq!(run(&o).phase, Phase::Failed);

    let mut o = healthy();
    o.lease = Some(LeaseInfo { holder: Some("zz".to_owned()), transitions: 3, renew_time: None });
    let a = run(&o);
    assert_eq!(a.phase, Phase::Failed);
    assert!(a.phase_message.contains("zz, which is not a member"), "{}", a.phase_message);

    let mut o = healthy();
    m(&mut o, "a").role = Some(MemberRole::Fenced);
    let a = run(&o);
    assert_eq!(a.phase, Phase::Failed);
    assert!(a.phase_message.contains("reports role Fenced"), "{}", a.phase_message);
}

#[test]
fn phase_suspended() {
    let mut o = healthy();
    m(&mut o, "b").alarms = vec![MemberAlarm::Suspended];
    let a = run(&o);
    assert_eq!(a.phase, Phase::Suspended);
    assert_eq!(a.suspended, vec!["b"]);
}

fn degraded_by(o: &Observed, reason: &str, phrase: &str) {
    let a = run(o);
    assert_eq!(a.phase, Phase::Degraded, "{a:?}");
    let c = a.degraded.iter().find(|c| c.reason == reason).unwrap_or_else(|| panic!("no {reason} in {a:?}"));
    assert!(c.message.contains(phrase), "{reason}: {:?} lacks {phrase:?}", c.message);
    let conds = conditions(o, &a, &revision(o));
    let d = conds.iter().find(|c| c.type_ == condition::DEGRADED).unwrap();
    assert_eq!(d.status, "True");
    assert!(d.message.contains(phrase), "{d:?}");
}

#[test]
fn degraded_member_lost() {
    let mut o = healthy();
    o.nodes.insert("b".to_owned(), None);
    degraded_by(&o, reason::MEMBER_LOST, "Node b does not exist");
}

#[test]
fn degraded_member_never_reported() {
    let mut o = healthy();
    o.status.members.retain(|m| m.node != "b");
    degraded_by(&o, reason::MEMBER_NOT_REPORTING, "member b has never reported");
}

#[test]
fn degraded_member_not_reporting_after_three_minutes() {
    let mut o = healthy();
    let now = o.now;
    m(&mut o, "b").last_seen = Some(t(179, now));
    assert!(!reasons(&run(&o)).contains(&reason::MEMBER_NOT_REPORTING));
    m(&mut o, "b").last_seen = Some(t(300, now));
    degraded_by(&o, reason::MEMBER_NOT_REPORTING, "member b has not reported since 2027-01-15T07:55:00Z");
    // The message names the time, not the age: a later reconcile writes nothing new.
    let first = conditions(&o, &run(&o), &revision(&o));
    o.now = Timestamp::from_second(o.now.as_second() + 60).unwrap();
    m(&mut o, "a").last_seen = Some(t(5, o.now));
    assert_eq!(conditions(&o, &run(&o), &revision(&o))[1].message, first[1].message);
    assert_eq!(next_staleness(&o), Some(Duration::from_secs(175)), "a's lastSeen ages out next");
}

#[test]
fn degraded_version_skew() {
    let mut o = healthy();
    m(&mut o, "b").agent_version = Some("0.2.0".to_owned());
    degraded_by(&o, reason::VERSION_SKEW, "0.1.0 on a; 0.2.0 on b");
}

#[test]
fn degraded_version_mismatch() {
    let mut o = healthy();
    m(&mut o, "b").protocol_version = Some("2.0".to_owned());
    degraded_by(&o, reason::VERSION_MISMATCH, "incompatible heartbeat protocols");
}

#[test]
fn degraded_config_pending() {
    let mut o = healthy();
    m(&mut o, "b").applied_revision = Some("0000000000000001".to_owned());
    degraded_by(&o, reason::CONFIG_PENDING, "b applied 0000000000000001");
    let a = run(&o);
    let conds = conditions(&o, &a, &revision(&o));
    let c = conds.iter().find(|c| c.type_ == condition::CONFIG_APPLIED).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason::CONFIG_PENDING));
}

#[test]
fn degraded_when_a_bgp_speaker_does_not_carry_the_routed_vips() {
    use havip_crds::hapair::{BgpAdvertisement, BgpSession, SpeakerStatus};
    let up = BgpSession { peer: "10.0.0.254".to_owned(), state: "Established".to_owned(), established: true };
    let fine = SpeakerStatus {
        speaker: Some("FRR".to_owned()),
        error: None,
        sessions: vec![up.clone()],
        advertised: vec![BgpAdvertisement { address: "10.9.0.50/32".to_owned(), peers: vec!["10.0.0.254".to_owned()] }],
    };
    let mut o = healthy();
    m(&mut o, "a").bgp = Some(fine.clone());
    m(&mut o, "b").bgp = Some(SpeakerStatus { advertised: vec![], ..fine.clone() });
    assert!(!reasons(&run(&o)).contains(&reason::BGP_NOT_ADVERTISED), "a speaker that carries them: fine");
    // The holder's speaker holds the VIP but advertises it to nobody.
    m(&mut o, "a").bgp = Some(SpeakerStatus {
        advertised: vec![BgpAdvertisement { address: "10.9.0.50/32".to_owned(), peers: vec![] }],
        ..fine.clone()
    });
    degraded_by(&o, reason::BGP_NOT_ADVERTISED, "a holds the routed VIPs, but its FRR does not advertise 10.9.0.50/32");
    // The standby's speaker cannot be asked: it could not advertise them after a takeover.
    let mut o = healthy();
    m(&mut o, "b").bgp = Some(SpeakerStatus {
        speaker: None,
        error: Some("no BGP speaker found".to_owned()),
        ..SpeakerStatus::default()
    });
    degraded_by(&o, reason::BGP_NOT_ADVERTISED, "b (a standby): its BGP speaker cannot be asked: no BGP speaker found");
    // No session is established.
    let mut o = healthy();
    let down = BgpSession { established: false, state: "Active".to_owned(), ..up };
    m(&mut o, "a").bgp = Some(SpeakerStatus { sessions: vec![down], ..fine });
    degraded_by(&o, reason::BGP_NOT_ADVERTISED, "has no established BGP session (1 configured)");
}

#[test]
fn degraded_key_mismatch_by_alarm_and_by_key_id() {
    let mut o = healthy();
    m(&mut o, "b").alarms = vec![MemberAlarm::KeyMismatch];
    degraded_by(&o, reason::KEY_MISMATCH, "unknown key");
    let mut o = healthy();
    m(&mut o, "b").key_id = Some(7);
    degraded_by(&o, reason::KEY_MISMATCH, "b signs with key 7");
    // During a rotation a member still on the previous key is expected.
    let mut o = healthy();
    o.key = Some(KeyInfo { key_id: 2, previous_key_id: Some(1), ..KeyInfo::default() });
    assert!(!reasons(&run(&o)).contains(&reason::KEY_MISMATCH));
}

#[test]
fn degraded_no_ready_standby() {
    let mut o = healthy();
    m(&mut o, "b").ready[0].ready = false;
    m(&mut o, "b").ready[0].reason = Some("carrier down".to_owned());
    degraded_by(&o, reason::NO_READY_STANDBY, "b is not ready for VIP 10.0.0.10/24 (carrier down)");
    let mut o = healthy();
    o.spec.members[1].maintenance = true;
    apply_revision(&mut o);
    degraded_by(&o, reason::NO_READY_STANDBY, "b is in maintenance");
    let a = run(&o);
    let ready = conditions(&o, &a, &revision(&o)).into_iter().find(|c| c.type_ == condition::READY).unwrap();
    assert_eq!(ready.status, "False");
}

#[test]
fn degraded_vip_unhealthy_and_conflict() {
    let mut o = healthy();
    o.vips[0].state = Some(VipState::Unhealthy);
    degraded_by(&o, reason::VIP_UNHEALTHY, "vip (10.0.0.10/24)");
    let mut o = healthy();
    o.vips[0].state = Some(VipState::Conflict);
    degraded_by(&o, reason::VIP_CONFLICT, "foreign host answers for VIP vip");
}

#[test]
fn conditions_keep_their_timestamps_and_show_paused() {
    let mut o = healthy();
    let a = run(&o);
    let first = conditions(&o, &a, &revision(&o));
    o.status.conditions = first.clone();
    let later = o.now.as_second() + 100;
    o.now = Timestamp::from_second(later).unwrap();
    for c in &mut o.status.members {
        c.last_seen = Some(Time(o.now));
    }
    let second = conditions(&o, &run(&o), &revision(&o));
    assert_eq!(first, second, "nothing changed: the same conditions, the same times");
    o.spec.paused = true;
    apply_revision(&mut o);
    let third = conditions(&o, &run(&o), &revision(&o));
    let ready = third.iter().find(|c| c.type_ == condition::READY).unwrap();
    assert!(ready.message.contains("paused (spec.paused)"), "{ready:?}");
    assert_eq!(ready.last_transition_time, first[0].last_transition_time, "still Ready: time kept");
    // A flip gets a new time.
    m(&mut o, "b").role = Some(MemberRole::Init);
    let fourth = conditions(&o, &run(&o), &revision(&o));
    let ready = fourth.iter().find(|c| c.type_ == condition::READY).unwrap();
    assert_eq!(ready.status, "False");
    assert_eq!(ready.last_transition_time, Time(o.now));
}

#[test]
fn invalid_spec_condition() {
    let mut s = spec();
    s.members[1].priority = 200;
    s.takeover.hold_down = "999999999999999999999h".to_owned();
    let problems = validate_spec("p", &s, "havip-system");
    assert!(problems.iter().any(|p| p.contains("priority 200 is used twice")), "{problems:?}");
    assert!(problems.iter().any(|p| p.contains("takeover.holdDown")), "{problems:?}");
    // A pair named `operator` is fine: its Lease is not the leader-election Lease.
    assert!(validate_spec("operator", &spec(), "havip-system").is_empty());
    assert_eq!(lease_name("operator"), "hapair-operator");
    assert!(validate_spec(&"p".repeat(64), &spec(), "havip-system").iter().any(|p| p.contains("longer than 63")));
    assert!(validate_spec("p", &spec(), "havip-system").is_empty());
    // A node name no Node can have; a key Secret where no agent reads Secrets.
    let mut s = spec();
    s.members[0].node = "Node_B!".to_owned();
    s.heartbeat.key_secret_ref =
        Some(serde_json::from_value(serde_json::json!({"name": "k", "namespace": "apps"})).unwrap());
    let bad = validate_spec("p", &s, "havip-system");
    assert!(bad.iter().any(|p| p.contains("\"Node_B!\": not a Node name")), "{bad:?}");
    assert!(bad.iter().any(|p| p.contains("keySecretRef.namespace \"apps\"")), "{bad:?}");
    s.heartbeat.key_secret_ref =
        Some(serde_json::from_value(serde_json::json!({"name": "k", "namespace": "havip-system"})).unwrap());
    s.members[0].node = "node-a.example.com".to_owned();
    assert!(validate_spec("p", &s, "havip-system").is_empty());
    // Routes and rules that follow the holder: checked as the agents apply them.
    let mut s = spec();
    s.routes = serde_json::from_value(serde_json::json!([
        {"destination": "0.0.0.0/0", "gateway": "192.0.2.1", "table": 100, "source": "192.0.2.10"}
    ]))
    .unwrap();
    s.rules =
        serde_json::from_value(serde_json::json!([{"from": "192.0.2.10/32", "table": 100, "priority": 1000}])).unwrap();
    assert!(validate_spec("p", &s, "havip-system").is_empty());
    s.routes[0].destination = "10.0.0.1/8".to_owned();
    let bad = validate_spec("p", &s, "havip-system");
    assert!(bad.iter().any(|p| p.contains("\"10.0.0.1/8\" is not a prefix")), "{bad:?}");
    s.routes.clear();
    s.rules[0].from = None;
    let bad = validate_spec("p", &s, "havip-system");
    assert!(bad.iter().any(|p| p.contains("needs from, to or both")), "{bad:?}");
    for (name, ok) in
        [("a", true), ("a-b.c", true), ("-a", false), ("a-", false), ("A", false), ("a..b", false), ("", false)]
    {
        assert_eq!(is_dns1123_subdomain(name), ok, "{name:?}");
    }
    assert!(!is_dns1123_subdomain(&"a".repeat(254)));
    let mut o = healthy();
    o.spec_problems = problems;
    let conds = conditions(&o, &run(&o), &revision(&o));
    let c = conds.iter().find(|c| c.type_ == condition::INVALID_SPEC).unwrap();
    assert_eq!(c.status, "True");
    assert!(c.message.contains("used twice"));
}

#[test]
fn config_revision_follows_spec_fips_and_addresses() {
    let o = healthy();
    let r = revision(&o);
    assert_eq!(r.len(), 16);
    assert_eq!(r, revision(&o), "stable");
    let mut o2 = healthy();
    o2.vips[0].spec = Some(fip("10.0.0.11/24"));
    assert_ne!(r, revision(&o2), "a FloatingIP change");
    let mut o3 = healthy();
    o3.nodes.insert("b".to_owned(), node("10.0.0.99"));
    assert_ne!(r, revision(&o3), "an address change");
    // Equal to what agents compute from the same inputs.
    let (addrs, missing) = member_addresses(&o);
    assert!(missing.is_empty());
    assert_eq!(addrs["a"]["internal"], "10.0.0.1");
    let fips = BTreeMap::from([("vip".to_owned(), fip("10.0.0.10/24"))]);
    assert_eq!(r, format_revision(config_revision(&o.spec, &fips, &addrs)));
    let status = operator_status(&o, &run(&o), &r, None, None, None, None);
    assert_eq!(status.config_revision.as_deref(), Some(r.as_str()));
    assert_eq!(status.vips, Some(1));
    assert_eq!(status.standby.as_deref(), Some("b"));
}

#[test]
fn interface_paths_take_the_published_address_and_ipv4_first() {
    let mut o = healthy();
    o.spec.heartbeat.paths = serde_json::from_value(serde_json::json!([
        {"name": "data", "interface": "eth1"}, {"name": "internal", "addressType": "InternalIP"}
    ]))
    .unwrap();
    o.nodes.insert(
        "a".to_owned(),
        Some(NodeInfo {
            addresses: vec![
                ("InternalIP".to_owned(), "fd00::1".to_owned()),
                ("InternalIP".to_owned(), "10.0.0.1".to_owned()),
            ],
        }),
    );
    m(&mut o, "a").path_addresses =
        vec![havip_crds::hapair::PathAddress { path: "data".to_owned(), address: "192.168.1.1".to_owned() }];
    let (addrs, missing) = member_addresses(&o);
    assert_eq!(addrs["a"]["data"], "192.168.1.1");
    assert_eq!(addrs["a"]["internal"], "10.0.0.1");
    assert_eq!(missing, vec!["member b has no address on path data"]);
    apply_revision(&mut o);
    degraded_by(&o, reason::ADDRESS_MISSING, "member b has no address on path data");
}

#[test]
fn each_request_id_is_taken_once() {
    let mut o = healthy();
    o.annotations.insert(annotation::FAILOVER.to_owned(), "r1".to_owned());
    assert_eq!(next_request(&o), Some(Ok(Request { kind: RequestKind::Failover, id: "r1".to_owned(), target: None })));
    // Handled (recorded), or visible in the status: not again.
    o.annotations.insert(annotation::HANDLED.to_owned(), r#"{"failover":"r1"}"#.to_owned());
    assert_eq!(next_request(&o), None);
    o.annotations.remove(annotation::HANDLED);
    o.status.last_operation = Some(Operation {
        id: "r1".to_owned(),
        kind: OperationKind::PlannedFailover,
        result: OperationResult::Succeeded,
        message: String::new(),
        time: None,
    });
    assert_eq!(next_request(&o), None);
    // A new id is.
    o.annotations.insert(annotation::CLEAR.to_owned(), "r2".to_owned());
    assert_eq!(next_request(&o).unwrap().unwrap().kind, RequestKind::Clear);
}

fn decide_on(o: &Observed, kind: RequestKind, target: Option<&str>) -> Decision {
    let req = Request { kind, id: "r".to_owned(), target: target.map(str::to_owned) };
    decide(o, &run(o), &revision(o), &req)
}

fn refused_with(d: Decision, phrase: &str) {
    match d {
        Decision::Refuse(why) => assert!(why.contains(phrase), "{why:?} lacks {phrase:?}"),
        other => panic!("expected a refusal containing {phrase:?}, got {other:?}"),
    }
}

#[test]
fn planned_failover_preconditions() {
    let o = healthy();
    match decide_on(&o, RequestKind::Failover, None) {
        Decision::Command(c) => {
            assert_eq!((&c.kind, c.target.as_deref()), (&OperationKind::PlannedFailover, Some("b")));
        }
        d => panic!("{d:?}"),
    }
    refused_with(decide_on(&o, RequestKind::Failover, Some("a")), "a is already active");
    refused_with(decide_on(&o, RequestKind::Failover, Some("zz")), "zz is not a member");
    let mut p = healthy();
    p.spec.paused = true;
    apply_revision(&mut p);
    refused_with(decide_on(&p, RequestKind::Failover, None), "paused");
    assert!(matches!(decide_on(&p, RequestKind::ForceFailover, None), Decision::Command(_)), "forced ignores paused");
    let mut s = healthy();
    m(&mut s, "b").applied_revision = Some("0000000000000001".to_owned());
    refused_with(decide_on(&s, RequestKind::Failover, None), "have not both applied revision");
    let mut h = healthy();
    m(&mut h, "b").heard[0].heard = false;
    refused_with(decide_on(&h, RequestKind::Failover, None), "does not hear its peer on path internal");
    let mut n = healthy();
    m(&mut n, "b").role = Some(MemberRole::Init);
    refused_with(decide_on(&n, RequestKind::Failover, None), "b reports role Init");
    // Forced skips readiness.
    assert!(matches!(decide_on(&n, RequestKind::ForceFailover, None), Decision::Command(_)));
    let mut x = healthy();
    x.lease = Some(LeaseInfo { holder: None, transitions: 2, renew_time: None });
    refused_with(decide_on(&x, RequestKind::ForceFailover, None), "nobody is active");
    let mut busy = healthy();
    busy.status.command =
        Some(PairCommand { id: "old".to_owned(), kind: OperationKind::PlannedFailover, target: None, issued: None });
    refused_with(decide_on(&busy, RequestKind::Failover, None), "PlannedFailover old is still in progress");
    let mut bad = healthy();
    bad.spec_problems = vec!["boom".to_owned()];
    refused_with(decide_on(&bad, RequestKind::Failover, None), "the spec is invalid: boom");
}

#[test]
fn clear_and_resume_preconditions() {
    let o = healthy();
    refused_with(decide_on(&o, RequestKind::Clear, None), "nothing to clear");
    refused_with(decide_on(&o, RequestKind::ResumeFailback, None), "Manual");
    let mut s = healthy();
    m(&mut s, "a").alarms = vec![MemberAlarm::Suspended];
    s.spec.failback.mode = havip_crds::FailbackMode::Automatic;
    apply_revision(&mut s);
    assert!(
        matches!(decide_on(&s, RequestKind::Clear, None), Decision::Command(ref c) if c.kind == OperationKind::ClearSuspension && c.target.is_none())
    );
    assert!(matches!(decide_on(&s, RequestKind::ResumeFailback, None), Decision::Command(_)));
}

#[test]
fn rotate_key_one_at_a_time() {
    let o = healthy();
    assert_eq!(decide_on(&o, RequestKind::RotateKey, None), Decision::RotateKey { key_id: 2 });
    let mut r = healthy();
    r.key =
        Some(KeyInfo { key_id: 2, previous_key_id: Some(1), rotation_id: Some("k1".to_owned()), ..KeyInfo::default() });
    refused_with(
        decide_on(&r, RequestKind::RotateKey, None),
        "key rotation k1 to key 2 is in progress (waiting for a, b)",
    );
    let mut s = healthy();
    s.spec.heartbeat.key_secret_ref = Some(havip_crds::SecretRef { name: "mine".to_owned(), namespace: None });
    refused_with(decide_on(&s, RequestKind::RotateKey, None), "rotate it there");
}

#[test]
fn key_rotation_finishes_only_when_every_member_reports_the_new_key() {
    let mut o = healthy();
    o.key = Some(KeyInfo {
        key_id: 2,
        previous_key_id: Some(1),
        members: Some(["a".to_owned(), "b".to_owned()].into()),
        ..KeyInfo::default()
    });
    assert_eq!(key_action(&o), KeyAction::None);
    m(&mut o, "a").key_id = Some(2);
    assert_eq!(key_action(&o), KeyAction::None, "b still on key 1");
    m(&mut o, "b").key_id = Some(2);
    assert_eq!(key_action(&o), KeyAction::FinishRotation);
}

#[test]
fn member_replacement_rotates_the_key() {
    let mut o = healthy();
    o.spec.members[1].node = "c".to_owned();
    assert_eq!(key_action(&o), KeyAction::RotateForRemoval { removed: vec!["b".to_owned()] });
    // Only an addition: record, no rotation.
    let mut o = healthy();
    o.spec.members.push(havip_crds::Member { node: "c".to_owned(), priority: 50, maintenance: false });
    assert_eq!(key_action(&o), KeyAction::RecordMembers);
    let mut o = healthy();
    o.key.as_mut().unwrap().members = None;
    assert_eq!(key_action(&o), KeyAction::RecordMembers);
    assert_eq!(key_action(&healthy()), KeyAction::None);
}

#[test]
fn command_answers_and_timeout() {
    let mut o = healthy();
    let now = o.now;
    let cmd = PairCommand {
        id: "r1".to_owned(),
        kind: OperationKind::PlannedFailover,
        target: Some("b".to_owned()),
        issued: Some(t(2, now)),
    };
    assert_eq!(command_answer(&o, &cmd), None, "nobody answered yet, not timed out");
    assert_eq!(command_deadline(&o, &cmd), Duration::from_secs(8));
    m(&mut o, "a").last_operation = Some(Operation {
        id: "r1".to_owned(),
        kind: OperationKind::PlannedFailover,
        result: OperationResult::Succeeded,
        message: "handed over to b in 40 ms".to_owned(),
        time: None,
    });
    let op = command_answer(&o, &cmd).unwrap();
    assert_eq!((&op.result, op.message.as_str()), (&OperationResult::Succeeded, "a: handed over to b in 40 ms"));
    // An answer to another id does not count; after 10 s: Failed.
    m(&mut o, "a").last_operation.as_mut().unwrap().id = "other".to_owned();
    let late = PairCommand { issued: Some(t(11, now)), ..cmd };
    let op = command_answer(&o, &late).unwrap();
    assert_eq!(op.result, OperationResult::Failed);
    assert!(op.message.contains("no agent answered"), "{}", op.message);
}

#[test]
fn clear_needs_every_reporting_member() {
    let mut o = healthy();
    let now = o.now;
    let cmd = PairCommand {
        id: "c1".to_owned(),
        kind: OperationKind::ClearSuspension,
        target: None,
        issued: Some(t(1, now)),
    };
    let ok = |id: &str| {
        Some(Operation {
            id: id.to_owned(),
            kind: OperationKind::ClearSuspension,
            result: OperationResult::Succeeded,
            message: "cleared".to_owned(),
            time: None,
        })
    };
    m(&mut o, "a").last_operation = ok("c1");
    assert_eq!(command_answer(&o, &cmd), None, "b has not answered");
    m(&mut o, "b").last_operation = ok("c1");
    assert_eq!(command_answer(&o, &cmd).unwrap().result, OperationResult::Succeeded);
}

#[test]
fn transitions_follow_the_lease() {
    let mut o = healthy();
    let (tr, new) = last_transition(&o);
    let tr = tr.unwrap();
    assert!(new);
    assert_eq!((tr.from.as_str(), tr.to.as_str(), tr.reason.as_str(), tr.epoch), ("", "a", reason::ELECTED, 1));
    o.status.last_transition = Some(tr.clone());
    o.status.active = Some("a".to_owned());
    assert_eq!(last_transition(&o), (Some(tr), false), "unchanged Lease: the same transition");
    // The Lease moves to b; b reports why.
    o.lease = Some(LeaseInfo { holder: Some("b".to_owned()), transitions: 2, renew_time: None });
    let (tr, new) = last_transition(&o);
    let tr = tr.unwrap();
    assert!(new);
    assert_eq!(
        (tr.from.as_str(), tr.to.as_str(), tr.reason.as_str()),
        ("a", "b", TransitionReason::RoleChange.as_str())
    );
    o.status.last_transition = Some(tr);
    // A member reports its own roles (what its agent writes).
    m(&mut o, "b").last_transition = Some(Transition {
        from: MemberRole::Standby.as_str().to_owned(),
        to: MemberRole::Active.as_str().to_owned(),
        reason: TransitionReason::PeerLost,
        epoch: 2,
        time: None,
    });
    let (tr, new) = last_transition(&o);
    assert!(!new, "a refinement, not a new transition");
    assert_eq!(tr.unwrap().reason, TransitionReason::PeerLost);
}

#[test]
fn status_comparison_ignores_timestamps_only() {
    let o = healthy();
    let a = run(&o);
    let r = revision(&o);
    let s1 = operator_status(&o, &a, &r, None, None, None, None);
    let mut s2 = s1.clone();
    s2.conditions[0].last_transition_time = Time(Timestamp::from_second(1).unwrap());
    s2.members = o.status.members.clone();
    assert_eq!(without_timestamps(&s1), without_timestamps(&s2));
    s2.phase = Some(Phase::Degraded);
    assert_ne!(without_timestamps(&s1), without_timestamps(&s2));
}

#[test]
fn random_keys_are_64_hex_digits_and_differ() {
    let k1 = random_key_hex().unwrap();
    let k2 = random_key_hex().unwrap();
    assert_eq!(k1.len(), 64);
    assert!(k1.chars().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(k1, k2);
}

/// An agent from before the typed contract reported its state machine's reason names;
/// the pair's transition still reads the documented reason (an upgrade runs old agents
/// next to a new operator), and a name nobody knows passes through unchanged.
#[test]
fn agent_transition_reasons_map_to_the_documented_reasons() {
    for (agent, pair) in [
        ("Takeover", reason::PEER_LOST),
        ("Election", reason::ELECTED),
        ("HandoverAccepted", reason::PLANNED_FAILOVER),
        ("NewerEpochLease", reason::DUAL_ACTIVE_RESOLVED),
        ("PeerLost", reason::PEER_LOST),
        ("SomethingNew", "SomethingNew"),
    ] {
        let mut o = healthy();
        o.lease = Some(LeaseInfo { holder: Some("b".to_owned()), transitions: 2, renew_time: None });
        m(&mut o, "b").last_transition = Some(
            serde_json::from_value(serde_json::json!({"from": "Standby", "to": "Active", "reason": agent, "epoch": 2}))
                .unwrap(),
        );
        let (tr, _) = last_transition(&o);
        assert_eq!(tr.unwrap().reason.as_str(), pair, "{agent}");
    }
    // Only the holder's report of becoming Active under the Lease's epoch counts.
    for (to, epoch) in [("Demoting", 2), ("Active", 1)] {
        let mut o = healthy();
        o.lease = Some(LeaseInfo { holder: Some("b".to_owned()), transitions: 2, renew_time: None });
        m(&mut o, "b").last_transition = Some(
            serde_json::from_value(
                serde_json::json!({"from": "Standby", "to": to, "reason": "PeerLost", "epoch": epoch}),
            )
            .unwrap(),
        );
        let (tr, _) = last_transition(&o);
        assert_ne!(tr.unwrap().reason, TransitionReason::PeerLost, "{to} at epoch {epoch}: not this report");
    }
}

#[test]
fn a_handover_in_flight_is_not_failed() {
    // The Lease moved to a a second ago; a still reports its old role Standby.
    let mut o = healthy();
    let now = o.now;
    o.lease = Some(LeaseInfo { holder: Some("a".to_owned()), transitions: 2, renew_time: Some(t(1, now).0) });
    m(&mut o, "a").role = Some(MemberRole::Standby);
    m(&mut o, "b").role = Some(MemberRole::Standby);
    assert_ne!(run(&o).phase, Phase::Failed);
    let left = next_settle(&o).expect("settling");
    assert!(left <= HANDOVER_SETTLE && left >= Duration::from_secs(3), "{left:?}");
    // The old active still demoting: a make-before-break handover, whatever the Lease age.
    let mut o = healthy();
    m(&mut o, "a").role = Some(MemberRole::Standby);
    m(&mut o, "b").role = Some(MemberRole::Demoting);
    assert_ne!(run(&o).phase, Phase::Failed);
    // Settled and still nobody active: Failed.
    let mut o = healthy();
    let now = o.now;
    o.lease = Some(LeaseInfo { holder: Some("a".to_owned()), transitions: 2, renew_time: Some(t(6, now).0) });
    m(&mut o, "a").role = Some(MemberRole::Standby);
    m(&mut o, "b").role = Some(MemberRole::Standby);
    assert_eq!(run(&o).phase, Phase::Failed);
    assert_eq!(next_settle(&o), None);
}

#[test]
fn the_demoting_old_active_is_not_a_missing_standby() {
    let mut o = healthy();
    m(&mut o, "b").role = Some(MemberRole::Demoting);
    let a = run(&o);
    assert!(!a.degraded.iter().any(|c| c.message.contains("no ready standby")), "{:?}", a.degraded);
    // Once it settles as something else than a ready standby, the pair is Degraded.
    m(&mut o, "b").role = Some(MemberRole::Fenced);
    let a = run(&o);
    assert_eq!(a.phase, Phase::Degraded, "{}", a.phase_message);
}

#[test]
fn a_floating_ip_whose_address_an_older_one_uses_is_refused() {
    let o = healthy();
    let conflicts = BTreeMap::from([("new".to_owned(), "old".to_owned())]);
    let pair_of = |n: &str| (n == "old").then(|| "web".to_owned());
    let r = refusal("new", "10.0.0.20/24", &conflicts, pair_of, |_| None, &o.nodes).expect("refused");
    assert_eq!(r, Refusal::AddressInUse { holder: "old".to_owned(), pair: "web".to_owned() });
    assert_eq!(r.reason(), reason::ADDRESS_IN_USE);
    assert!(r.message("10.0.0.20/24").contains("already used by FloatingIP old (pair web)"), "{}", r.message("x"));
    // The older one is not refused, nor an unrelated one.
    assert_eq!(refusal("old", "10.0.0.20/24", &conflicts, pair_of, |_| None, &o.nodes), None);
    assert_eq!(refusal("vip", "10.0.0.10/24", &conflicts, pair_of, |_| None, &o.nodes), None);
}

#[test]
fn a_floating_ip_on_a_member_nodes_own_address_is_refused() {
    let mut o = healthy();
    o.nodes.insert(
        "b".to_owned(),
        Some(NodeInfo {
            addresses: vec![
                ("InternalIP".to_owned(), "10.0.0.2".to_owned()),
                ("ExternalIP".to_owned(), "2001:db8::2".to_owned()),
                ("Hostname".to_owned(), "b".to_owned()),
            ],
        }),
    );
    let none = BTreeMap::new();
    let r = refusal("vip", "10.0.0.2/24", &none, |_| None, |_| None, &o.nodes).expect("refused");
    assert_eq!(r, Refusal::NodeAddress { node: "b".to_owned(), kind: "InternalIP".to_owned(), member: true });
    assert_eq!(r.reason(), reason::NODE_ADDRESS);
    // Another spelling of the node's IPv6 address, another prefix.
    let r = refusal("vip", "2001:db8:0::2/64", &none, |_| None, |_| None, &o.nodes).expect("refused");
    assert_eq!(r, Refusal::NodeAddress { node: "b".to_owned(), kind: "ExternalIP".to_owned(), member: true });
    assert_eq!(refusal("vip", "10.0.0.3/24", &none, |_| None, |_| None, &o.nodes), None);
    // A member whose Node is missing has no addresses to collide with.
    o.nodes.insert("b".to_owned(), None);
    assert_eq!(refusal("vip", "10.0.0.2/24", &none, |_| None, |_| None, &o.nodes), None);
}

#[test]
fn a_floating_ip_on_any_nodes_or_the_api_servers_address_is_refused() {
    let o = healthy();
    let mut idx = AddressIndex::default();
    idx.set_node("n7", &[("InternalIP".to_owned(), "10.0.0.7".to_owned())]);
    idx.set_node("b", &[("InternalIP".to_owned(), "10.0.0.2".to_owned())]);
    idx.set_api_server(ApiServerSource::ClusterIp, [ip("10.96.0.1")].into());
    idx.set_api_server(ApiServerSource::Endpoint, [ip("10.0.0.100")].into());
    let none = BTreeMap::new();
    let refuse = |address: &str| refusal("vip", address, &none, |_| None, |a| idx.lookup(a).cloned(), &o.nodes);
    // A Node that is no member of the pair.
    let r = refuse("10.0.0.7/24").expect("refused");
    assert_eq!(r, Refusal::NodeAddress { node: "n7".to_owned(), kind: "InternalIP".to_owned(), member: false });
    assert_eq!(r.reason(), reason::NODE_ADDRESS);
    assert_eq!(
        r.message("10.0.0.7/24"),
        "address 10.0.0.7/24 is the InternalIP of node n7: a VIP must not be a node's own address; this FloatingIP \
         is not served"
    );
    // A member, found in the index too.
    assert!(refuse("10.0.0.2/32").expect("refused").message("x").contains("of member node b"));
    // The API server: its ClusterIP and its own address.
    let r = refuse("10.96.0.1/32").expect("refused");
    assert_eq!(r, Refusal::ApiServerAddress { source: ApiServerSource::ClusterIp });
    assert_eq!(r.reason(), reason::API_SERVER_ADDRESS);
    assert!(r.message("10.96.0.1/32").contains("is the API server's ClusterIP (Service default/kubernetes)"), "{r:?}");
    let r = refuse("10.0.0.100/24").expect("refused");
    assert!(r.message("x").contains("EndpointSlice default/kubernetes"), "{}", r.message("x"));
    assert_eq!(refuse("10.0.0.8/24"), None);
    // A reserved address outranks an older FloatingIP on it: the refusal says what the
    // address is.
    let conflicts = BTreeMap::from([("vip".to_owned(), "old".to_owned())]);
    let r = refusal("vip", "10.0.0.7/24", &conflicts, |_| None, |a| idx.lookup(a).cloned(), &o.nodes);
    assert_eq!(r.map(|r| r.reason()), Some(reason::NODE_ADDRESS));
    assert!(Refusal::REASONS.contains(&reason::ADDRESS_IN_USE));
}

#[test]
fn member_labels_are_patched_to_the_desired_set_and_other_labels_are_left_alone() {
    let desired = member_labels(&spec());
    assert_eq!(desired.iter().map(String::as_str).collect::<Vec<_>>(), ["member.havip.io/a", "member.havip.io/b"]);
    let current = BTreeMap::from([
        ("app".to_owned(), "x".to_owned()),
        ("member.havip.io/a".to_owned(), "true".to_owned()),
        ("member.havip.io/gone".to_owned(), "true".to_owned()),
    ]);
    let patch = member_label_patch(&current, &desired).expect("a patch");
    assert_eq!(
        patch,
        serde_json::json!({"metadata": {"labels": {"member.havip.io/b": "true", "member.havip.io/gone": null}}})
    );
    let done = BTreeMap::from([
        ("app".to_owned(), "x".to_owned()),
        ("member.havip.io/a".to_owned(), "true".to_owned()),
        ("member.havip.io/b".to_owned(), "true".to_owned()),
    ]);
    assert_eq!(member_label_patch(&done, &desired), None, "nothing to do");
    // Refused: no member label at all.
    assert_eq!(
        member_label_patch(&done, &BTreeSet::new()),
        Some(serde_json::json!({"metadata": {"labels": {"member.havip.io/a": null, "member.havip.io/b": null}}}))
    );
}

#[test]
fn the_member_patch_also_lists_the_members_by_name_and_leaves_other_annotations_alone() {
    let key = havip_crds::membership::NODES_ANNOTATION;
    let desired = member_labels(&spec());
    assert_eq!(member_nodes(&spec()), "a,b");
    let labels: BTreeMap<String, String> =
        desired.iter().map(|k| (k.clone(), havip_crds::membership::VALUE.to_owned())).collect();
    let other = BTreeMap::from([("havip.io/services".to_owned(), "ns/svc".to_owned())]);
    // Labelled by an earlier release, not annotated yet: only the annotation is added.
    assert_eq!(
        member_patch(&labels, &other, &desired, Some("a,b")),
        Some(serde_json::json!({"metadata": {"annotations": {key: "a,b"}}}))
    );
    let mut done = other.clone();
    done.insert(key.to_owned(), "a,b".to_owned());
    assert_eq!(member_patch(&labels, &done, &desired, Some("a,b")), None, "nothing to do");
    // A member changed: labels and annotation in one patch.
    let patch = member_patch(&labels, &done, &member_labels(&spec()), Some("a,c")).expect("a patch");
    assert_eq!(patch, serde_json::json!({"metadata": {"annotations": {key: "a,c"}}}));
    // Refused: neither labels nor the annotation.
    assert_eq!(
        member_patch(&labels, &done, &BTreeSet::new(), None),
        Some(serde_json::json!({"metadata": {
            "labels": {"member.havip.io/a": null, "member.havip.io/b": null},
            "annotations": {key: null},
        }}))
    );
    assert_eq!(member_patch(&BTreeMap::new(), &other, &BTreeSet::new(), None), None);
}

#[test]
fn the_status_publishes_every_members_heartbeat_addresses() {
    let mut o = healthy();
    o.nodes.insert("b".to_owned(), None);
    let a = run(&o);
    let st = operator_status(&o, &a, &revision(&o), None, None, None, None);
    assert_eq!(st.member_addresses.len(), 1, "b has no Node, hence no address: {:?}", st.member_addresses);
    assert_eq!(st.member_address("a", "internal"), Some("10.0.0.1"));
    assert_eq!(st.member_address("b", "internal"), None);
    // The published addresses are what the revision hashes: an address change is a new
    // revision and a new publication in the same write.
    let before = revision(&o);
    o.nodes.insert("a".to_owned(), node("10.0.0.9"));
    assert_ne!(revision(&o), before);
    assert_eq!(published_addresses(&o)[0].paths[0].address, "10.0.0.9");
}

/// A FloatingIP of the pair with the holder fields an agent wrote `named_secs_ago`.
fn held_fip(
    holder: Option<&str>,
    state: Option<VipState>,
    named_secs_ago: i64,
    now: Timestamp,
) -> havip_crds::FloatingIP {
    let mut f = havip_crds::FloatingIP::new("vip", fip("10.0.0.10/24"));
    f.metadata.generation = Some(2);
    f.status = Some(havip_crds::FloatingIPStatus {
        holder: holder.map(str::to_owned),
        state,
        epoch: Some(1),
        last_announced: Some(t(named_secs_ago, now)),
        ..Default::default()
    });
    f
}

#[test]
fn a_floatingip_is_ready_when_the_pairs_active_announces_it() {
    let o = healthy();
    let a = run(&o);
    let v = fip_verdict(&o, &a, &held_fip(Some("a"), Some(VipState::Announced), 10, o.now), None);
    assert_eq!((v.ready.status, v.ready.reason), ("True", reason::ANNOUNCED), "{v:?}");
    assert_eq!(v.ready.message, "10.0.0.10/24 is announced by a (epoch 1)");
    assert_eq!((v.accepted.status, v.conflict.status), ("True", "False"));
    assert!(!v.pending);
    // Conditions carry the generation; the same verdict again is current.
    let conds = fip_conditions(&[], &v, Some(2), o.now);
    assert_eq!(conds.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(), ["Accepted", "Ready", "Conflict"]);
    assert!(conds.iter().all(|c| c.observed_generation == Some(2)));
    assert!(fip_conditions_current(&conds, &v, Some(2)));
    assert!(!fip_conditions_current(&conds, &v, Some(3)), "a newer generation needs a write");
}

#[test]
fn a_floatingip_nobody_holds_is_pending_and_not_ready() {
    let o = healthy();
    let a = run(&o);
    // Never held: not ready, and the operator writes state Pending once.
    let v = fip_verdict(&o, &a, &held_fip(None, None, 10, o.now), None);
    assert_eq!((v.ready.status, v.ready.reason), ("False", reason::NOT_HELD), "{v:?}");
    assert!(v.pending);
    let v = fip_verdict(&o, &a, &held_fip(None, Some(VipState::Pending), 10, o.now), None);
    assert!(!v.pending, "already Pending: no write");
    // A pair that failed: the message says why nobody holds it.
    let mut o = healthy();
    o.lease = Some(LeaseInfo { holder: None, transitions: 3, renew_time: None });
    m(&mut o, "a").role = Some(MemberRole::Fenced);
    let a = run(&o);
    assert_eq!(a.phase, Phase::Failed);
    let v = fip_verdict(&o, &a, &held_fip(None, Some(VipState::Pending), 10, o.now), None);
    assert!(v.ready.message.contains("the Lease has no holder"), "{}", v.ready.message);
}

#[test]
fn a_holder_that_reports_holding_nothing_since_is_cleared_but_a_silent_one_is_not() {
    let mut o = healthy();
    let now = o.now;
    // a fenced itself after naming itself holder (its report, 5 s ago, is later than the
    // holder fields, 10 s ago): it holds nothing.
    m(&mut o, "a").role = Some(MemberRole::Fenced);
    o.lease = Some(LeaseInfo { holder: None, transitions: 3, renew_time: None });
    let a = run(&o);
    let v = fip_verdict(&o, &a, &held_fip(Some("a"), Some(VipState::Announced), 10, now), None);
    assert!(v.pending, "{v:?}");
    assert_eq!((v.ready.status, v.ready.reason), ("False", reason::NOT_HELD));
    // The same role reported before the holder fields were written (a report that
    // lags): not proof, nothing is cleared.
    let v = fip_verdict(&o, &a, &held_fip(Some("a"), Some(VipState::Announced), 2, now), None);
    assert!(!v.pending, "{v:?}");
    // A holder that stopped reporting may still hold the VIP (cut off from the API):
    // Unknown, its fields stay.
    let mut o = healthy();
    m(&mut o, "a").last_seen = Some(t(600, now));
    let a = run(&o);
    let v = fip_verdict(&o, &a, &held_fip(Some("a"), Some(VipState::Announced), 700, now), None);
    assert_eq!((v.ready.status, v.ready.reason), ("Unknown", reason::HOLDER_NOT_REPORTING), "{v:?}");
    assert!(!v.pending);
}

#[test]
fn a_floatingip_in_conflict_or_held_by_another_member_is_not_ready() {
    let o = healthy();
    let a = run(&o);
    let mut f = held_fip(Some("a"), Some(VipState::Conflict), 10, o.now);
    f.status.as_mut().unwrap().conflict_mac = Some("02:00:00:00:00:09".to_owned());
    let v = fip_verdict(&o, &a, &f, None);
    assert_eq!((v.ready.status, v.ready.reason), ("False", reason::VIP_CONFLICT));
    assert_eq!((v.conflict.status, v.conflict.reason), ("True", reason::VIP_CONFLICT));
    assert!(v.conflict.message.contains("02:00:00:00:00:09"), "{}", v.conflict.message);
    let v = fip_verdict(&o, &a, &held_fip(Some("a"), Some(VipState::Unhealthy), 10, o.now), None);
    assert_eq!((v.ready.status, v.ready.reason), ("False", reason::VIP_UNHEALTHY));
    // b named itself holder (after its last report as standby) while the Lease still
    // names a: a move in progress.
    let v = fip_verdict(&o, &a, &held_fip(Some("b"), Some(VipState::Announced), 2, o.now), None);
    assert_eq!((v.ready.status, v.ready.reason), ("False", reason::HOLDER_NOT_ACTIVE), "{v:?}");
    // Refused: neither accepted nor ready.
    let r = Refusal::NodeAddress { node: "a".to_owned(), kind: "InternalIP".to_owned(), member: true };
    let v = fip_verdict(&o, &a, &held_fip(None, Some(VipState::Pending), 10, o.now), Some(&r));
    assert_eq!((v.accepted.status, v.accepted.reason), ("False", reason::NODE_ADDRESS));
    assert_eq!((v.ready.status, v.ready.reason), ("False", reason::NODE_ADDRESS));
    // Without its pair.
    let v = orphan_verdict(&held_fip(None, None, 10, o.now));
    assert_eq!((v.ready.status, v.ready.reason), ("False", reason::PAIR_NOT_FOUND));
    assert!(v.pending);
}

#[test]
fn route_events_say_which_member_advertises_a_routed_vip_now() {
    use havip_crds::hapair::{BgpAdvertisement, SpeakerStatus};
    let adv = |peers: &[&str]| SpeakerStatus {
        speaker: Some("FRR".to_owned()),
        advertised: vec![BgpAdvertisement {
            address: "10.9.0.50/32".to_owned(),
            peers: peers.iter().map(|p| (*p).to_owned()).collect(),
        }],
        ..SpeakerStatus::default()
    };
    let mut routes = std::collections::BTreeMap::new();
    let mut o = healthy();
    m(&mut o, "a").bgp = Some(adv(&["10.0.0.254"]));
    assert!(super::route_events(&o, &mut routes).is_empty(), "the first sight is recorded only");
    assert!(super::route_events(&o, &mut routes).is_empty(), "nothing changed");
    // The route moved: a holds it no more (advertised to nobody), b advertises it.
    m(&mut o, "a").bgp = Some(adv(&[]));
    m(&mut o, "b").bgp = Some(adv(&["10.0.0.254"]));
    let ev = super::route_events(&o, &mut routes);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!((ev[0].reason.as_str(), ev[0].warning), (reason::ROUTE_MOVED, false));
    assert_eq!(ev[0].note, "10.9.0.50/32: advertised by b (to 10.0.0.254); was a");
    // Nobody advertises it: a warning, once.
    m(&mut o, "b").bgp = None;
    let ev = super::route_events(&o, &mut routes);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!((ev[0].reason.as_str(), ev[0].warning), (reason::ROUTE_WITHDRAWN, true));
    assert_eq!(ev[0].note, "10.9.0.50/32: no member advertises it any more (was b)");
    assert!(super::route_events(&o, &mut routes).is_empty(), "said once");
    // Back on a.
    m(&mut o, "a").bgp = Some(adv(&["10.0.0.254"]));
    let ev = super::route_events(&o, &mut routes);
    assert_eq!(
        ev.iter().map(|e| e.note.as_str()).collect::<Vec<_>>(),
        ["10.9.0.50/32: advertised by a (to 10.0.0.254); was nobody"]
    );
}

#[test]
fn a_virtual_mac_is_the_older_pairs_on_the_nodes_they_share() {
    use super::spec::virtual_mac_conflict;
    let with = |id: i32, address: Option<&str>, nodes: [&str; 2]| {
        let mut s = spec();
        s.members[0].node = nodes[0].to_owned();
        s.members[1].node = nodes[1].to_owned();
        s.virtual_mac = Some(havip_crds::VirtualMacSpec { id, address: address.map(str::to_owned) });
        s
    };
    let t = |secs: i64| Timestamp::from_second(secs).unwrap();
    let (t1, t2) = (t(1_000), t(2_000));
    let web = with(51, None, ["a", "b"]);
    let db = with(51, None, ["b", "c"]);
    let others = [("web", &web, Some(&t1)), ("db", &db, Some(&t2))];
    // db is younger and shares node b: its problem, not web's.
    let p = virtual_mac_conflict("db", &db, Some(&t2), others).expect("a conflict");
    assert!(p.contains("pair web") && p.contains("node b"), "{p}");
    assert_eq!(virtual_mac_conflict("web", &web, Some(&t1), others), None);
    // No shared node, another id, no virtual MAC: no conflict.
    let far = with(51, None, ["c", "d"]);
    assert_eq!(virtual_mac_conflict("far", &far, Some(&t2), [("web", &web, Some(&t1))]), None);
    let other_id = with(52, None, ["a", "b"]);
    assert_eq!(virtual_mac_conflict("o", &other_id, Some(&t2), [("web", &web, Some(&t1))]), None);
    assert_eq!(virtual_mac_conflict("plain", &spec(), Some(&t2), [("web", &web, Some(&t1))]), None);
    // Another id but the same explicit address: the MAC is what counts.
    let a1 = with(7, Some("02:00:00:00:00:07"), ["a", "b"]);
    let a2 = with(8, Some("02:00:00:00:00:07"), ["a", "x"]);
    assert!(virtual_mac_conflict("a2", &a2, Some(&t2), [("a1", &a1, Some(&t1))]).is_some());
    // Same creation time: the name decides; no creation time yet: the youngest.
    assert!(virtual_mac_conflict("db", &db, Some(&t1), [("web", &web, Some(&t1))]).is_none(), "db < web by name");
    assert!(virtual_mac_conflict("web", &web, Some(&t1), [("db", &db, Some(&t1))]).is_some());
    assert!(virtual_mac_conflict("web", &web, None, [("db", &db, Some(&t2))]).is_some());
    assert!(virtual_mac_conflict("db", &db, Some(&t2), [("web", &web, None)]).is_none());
}
