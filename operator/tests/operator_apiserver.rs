//! The operator (as its binary) against a real kube-apiserver + etcd, with simulated
//! agents: Lease and key Secret creation, `Pending` with the revision, every phase,
//! the annotation → command → answer flow, key rotation, invalid objects without a
//! retry storm, FloatingIP `PairFound`, and `kubectl-havip` end to end.
//!
//! One control plane and one operator serve every scenario (each with its own pair),
//! in order, in one test: starting a control plane takes seconds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use havip_crds::revision::{config_revision, format_revision};
use havip_crds::{FloatingIPSpec, HAPair, HAPairSpec, Phase, TransitionReason, condition};
use havip_e2e::controlplane::ControlPlane;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::time::Duration;

const VIP: &str = "10.0.0.10/24";

#[test]
fn operator_against_a_real_api_server() {
    let cp = ControlPlane::start(Default::default()).expect("control plane");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = cp.client().await.expect("client");
        install_crds(&client).await;
        create_namespace(&client, NS).await;
        for (n, ip) in [("n1", "10.0.0.1"), ("n2", "10.0.0.2"), ("n3", "10.0.0.3")] {
            create_node(&client, n, ip).await;
        }
        // The operator runs with least privileges, not as cluster admin.
        install_operator_rbac(&client, "havip-operator-test").await;
        let kubeconfig = cp.kubeconfig_for("havip-operator-test", None).expect("operator kubeconfig");
        let op = Operator::start_with(&cp, &kubeconfig, "op-1", &[]);
        creation(&client).await;
        phases(&client).await;
        commands(&client, &op).await;
        key_rotation(&client).await;
        invalid_objects(&client, &op).await;
        floating_ip_pair_found(&client).await;
        admission_and_member_labels(&client).await;
        reserved_addresses(&client).await;
        plugin_end_to_end(&client, &cp).await;
        member_replacement(&client).await;
        recreated_pair(&client).await;
        eprintln!(
            "operator metrics:\n{}",
            op.metrics()
                .lines()
                .filter(|l| l.starts_with("havip_operator_reconciles") || l.starts_with("havip_operator_status_writes"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        upgrade_from_old_lease_names(&client, &cp, &kubeconfig, op).await;
    });
}

fn secret_field(s: &Secret, k: &str) -> Option<String> {
    s.data.as_ref()?.get(k).map(|b| String::from_utf8(b.0.clone()).unwrap())
}

async fn secret(client: &Client, pair: &str) -> Secret {
    Api::<Secret>::namespaced(client.clone(), NS).get(&format!("havip-{pair}-key")).await.expect("key Secret")
}

/// The pair gets its Lease (no holder, epoch 0), its key Secret (64 hex digits, key
/// id 1) and a `Pending` status with the configuration revision the agents compute.
async fn creation(client: &Client) {
    apply_yaml(client, &fip_yaml("s1-vip", "s1", VIP)).await;
    apply_yaml(client, &pair_yaml("s1", "n1", "n2")).await;
    let p = wait_pair(client, "s1", "Pending with a revision", |p| {
        phase_of(p) == Some(Phase::Pending) && !revision_of(p).is_empty()
    })
    .await;
    let st = p.status.clone().unwrap();
    assert_eq!(st.vips, Some(1));
    assert_eq!(st.observed_generation, Some(1));
    assert_eq!(st.epoch, Some(0));
    let ready = condition_of(&p, condition::READY).unwrap();
    assert!(ready.message.contains("no member has reported yet"), "{ready:?}");
    // The revision is the shared function of spec, FloatingIPs and addresses.
    let fips = BTreeMap::from([(
        "s1-vip".to_owned(),
        serde_json::from_value::<FloatingIPSpec>(serde_json::json!({"pair": "s1", "address": VIP})).unwrap(),
    )]);
    let addrs = BTreeMap::from([
        ("n1".to_owned(), BTreeMap::from([("internal".to_owned(), "10.0.0.1".to_owned())])),
        ("n2".to_owned(), BTreeMap::from([("internal".to_owned(), "10.0.0.2".to_owned())])),
    ]);
    let spec: HAPairSpec = p.spec.clone();
    assert_eq!(revision_of(&p), format_revision(config_revision(&spec, &fips, &addrs)));

    let lease = Api::<Lease>::namespaced(client.clone(), NS).get("hapair-s1").await.expect("pair Lease");
    let ls = lease.spec.unwrap();
    assert_eq!(ls.holder_identity, None);
    assert_eq!(ls.lease_transitions, Some(0));
    let s = secret(client, "s1").await;
    let key = secret_field(&s, "key").unwrap();
    assert_eq!(key.len(), 64);
    assert!(key.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(secret_field(&s, "keyId").as_deref(), Some("1"));
    assert_eq!(s.metadata.owner_references.unwrap()[0].name, "s1");
    wait_event(client, "s1", "LeaseCreated", "hapair-s1").await;
    wait_event(client, "s1", "KeySecretCreated", "key 1").await;
    eprintln!("creation: Lease, Secret and Pending status with revision {} ✓", revision_of(&p));
}

async fn healthy(client: &Client, pair: &str, active: &str, standby: &str, epoch: i64) {
    let p = get_pair(client, pair).await;
    let rev = revision_of(&p);
    // A member reports its own roles, as its agent does.
    let mut a = entry(active, "Active", epoch, &rev, VIP);
    a["lastTransition"] = serde_json::json!({"from": "Standby", "to": "Active", "reason": if epoch == 1 { "Elected" } else { "PeerLost" }, "epoch": epoch});
    report(client, pair, a).await;
    report(client, pair, entry(standby, "Standby", epoch, &rev, VIP)).await;
}

/// Live → FailedOver → Degraded (version skew; member not reporting) → Suspended →
/// Failed → Live, each from what simulated agents report and the Lease says.
async fn phases(client: &Client) {
    set_lease(client, "s1", Some("n1"), 1).await;
    healthy(client, "s1", "n1", "n2", 1).await;
    let p = wait_pair(client, "s1", "Live", |p| phase_of(p) == Some(Phase::Live)).await;
    let st = p.status.clone().unwrap();
    assert_eq!((st.active.as_deref(), st.standby.as_deref(), st.epoch), (Some("n1"), Some("n2"), Some(1)));
    assert_eq!(st.last_transition.as_ref().map(|t| t.to.as_str()), Some("n1"));
    assert_eq!(condition_of(&p, condition::READY).unwrap().status, "True");
    assert_eq!(condition_of(&p, condition::CONFIG_APPLIED).unwrap().status, "True");
    wait_event(client, "s1", "Elected", "n1 (epoch 1)").await;

    // The active is lost: n2 takes the Lease under epoch 2.
    set_lease(client, "s1", Some("n2"), 2).await;
    healthy(client, "s1", "n2", "n1", 2).await;
    let p = wait_pair(client, "s1", "FailedOver", |p| phase_of(p) == Some(Phase::FailedOver)).await;
    let t = p.status.as_ref().unwrap().last_transition.clone().unwrap();
    assert_eq!((t.from.as_str(), t.to.as_str(), t.epoch), ("n1", "n2", 2));
    let ev = wait_event(client, "s1", "PeerLost", "n1 → n2 (epoch 2)").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let ready_since = condition_of(&p, condition::READY).unwrap().last_transition_time.clone();

    // Version skew.
    let rev = revision_of(&p);
    let mut skewed = entry("n1", "Standby", 2, &rev, VIP);
    skewed["agentVersion"] = "0.2.0".into();
    report(client, "s1", skewed).await;
    let p = wait_pair(client, "s1", "Degraded by version skew", |p| phase_of(p) == Some(Phase::Degraded)).await;
    let d = condition_of(&p, condition::DEGRADED).unwrap();
    assert_eq!(d.reason, "VersionSkew");
    assert!(d.message.contains("0.1.0 on n2; 0.2.0 on n1"), "{d:?}");
    wait_event(client, "s1", "Degraded", "different agent versions").await;
    let ready = condition_of(&p, condition::READY).unwrap();
    assert_eq!(ready.status, "True", "a version skew does not make the pair unready");
    assert_eq!(ready.last_transition_time, ready_since, "still Ready: its time is kept");

    // A member not reporting for more than 3 minutes.
    let mut stale = entry("n1", "Standby", 2, &rev, VIP);
    stale["lastSeen"] = ago_rfc3339(400).into();
    report(client, "s1", stale).await;
    let p = wait_pair(client, "s1", "Degraded: n1 not reporting", |p| {
        condition_of(p, condition::DEGRADED).is_some_and(|c| c.message.contains("member n1 has not reported since "))
    })
    .await;
    assert_eq!(phase_of(&p), Some(Phase::Degraded));

    // Flap suspension.
    let mut suspended = entry("n1", "Standby", 2, &rev, VIP);
    suspended["alarms"] = serde_json::json!(["Suspended"]);
    report(client, "s1", suspended).await;
    let p = wait_pair(client, "s1", "Suspended", |p| phase_of(p) == Some(Phase::Suspended)).await;
    assert_eq!(condition_of(&p, condition::SUSPENDED).unwrap().status, "True");

    // Nobody holds the VIPs.
    set_lease(client, "s1", None, 3).await;
    healthy(client, "s1", "n1", "n2", 3).await;
    report(client, "s1", entry("n1", "Standby", 3, &rev, VIP)).await;
    let p = wait_pair(client, "s1", "Failed", |p| phase_of(p) == Some(Phase::Failed)).await;
    assert!(condition_of(&p, condition::READY).unwrap().message.contains("nobody holds the VIPs"));

    // Back to Live.
    set_lease(client, "s1", Some("n1"), 4).await;
    healthy(client, "s1", "n1", "n2", 4).await;
    wait_pair(client, "s1", "Live again", |p| {
        phase_of(p) == Some(Phase::Live) && p.status.as_ref().unwrap().epoch == Some(4)
    })
    .await;
    eprintln!("phases: Live, FailedOver, Degraded (skew, not reporting), Suspended, Failed, Live ✓");
}

async fn annotate(client: &Client, pair: &str, key: &str, value: &str) {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    Api::<HAPair>::all(client.clone())
        .patch(pair, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("annotate {pair}: {e}"));
}

fn last_op(p: &HAPair) -> Option<(String, String, String)> {
    p.status.as_ref()?.last_operation.as_ref().map(|o| (o.id.clone(), o.result.to_string(), o.message.clone()))
}

async fn wait_answer(client: &Client, pair: &str, id: &str) -> (String, String) {
    let p = wait_pair(client, pair, &format!("an answer to {id}"), |p| {
        last_op(p).is_some_and(|(i, r, _)| i == id && r != "InProgress")
    })
    .await;
    let (_, r, m) = last_op(&p).unwrap();
    (r, m)
}

/// A failover annotation becomes `status.command`; the agent's answer becomes
/// `lastOperation` and an Event; an id is acted on once; refusals say why; an
/// unanswered command fails after 10 s.
async fn commands(client: &Client, op: &Operator) {
    annotate(client, "s1", "havip.io/failover", "f1").await;
    let p = wait_pair(client, "s1", "command f1", |p| p.status.as_ref().unwrap().command.is_some()).await;
    let cmd = p.status.unwrap().command.unwrap();
    assert_eq!((cmd.id.as_str(), cmd.kind.as_str(), cmd.target.as_deref()), ("f1", "PlannedFailover", Some("n2")));
    wait_event(client, "s1", "PlannedFailoverRequested", "f1").await;

    // The active agent executes it and answers.
    let rev = revision_of(&get_pair(client, "s1").await);
    let mut answer = entry("n1", "Standby", 5, &rev, VIP);
    answer["lastOperation"] = serde_json::json!({"id": "f1", "kind": "PlannedFailover", "result": "Succeeded", "message": "handed over to n2 in 35 ms"});
    report(client, "s1", answer).await;
    set_lease(client, "s1", Some("n2"), 5).await;
    let mut n2 = entry("n2", "Active", 5, &rev, VIP);
    n2["lastTransition"] =
        serde_json::json!({"from": "Standby", "to": "Active", "reason": "PlannedFailover", "epoch": 5});
    report(client, "s1", n2).await;
    let (result, message) = wait_answer(client, "s1", "f1").await;
    assert_eq!(result, "Succeeded");
    assert!(message.contains("n1: handed over to n2"), "{message}");
    let p = wait_pair(client, "s1", "command cleared", |p| p.status.as_ref().unwrap().command.is_none()).await;
    assert!(
        p.annotations().get("havip.io/handled").is_some_and(|h| h.contains("\"failover\":\"f1\"")),
        "{:?}",
        p.annotations()
    );
    wait_event(client, "s1", "PlannedFailoverSucceeded", "f1").await;
    wait_pair(client, "s1", "FailedOver to n2 at epoch 5", |p| {
        p.status
            .as_ref()
            .unwrap()
            .last_transition
            .as_ref()
            .is_some_and(|t| t.to == "n2" && t.reason == TransitionReason::PlannedFailover)
    })
    .await;

    // A refusal says why (nothing is suspended), and replaces lastOperation…
    annotate(client, "s1", "havip.io/clear", "c1").await;
    let (result, message) = wait_answer(client, "s1", "c1").await;
    assert_eq!(result, "Refused");
    assert!(message.contains("nothing to clear"), "{message}");
    wait_event(client, "s1", "ClearSuspensionRefused", "c1").await;
    // … yet f1, still in its annotation, is not acted on again. Touch the pair, then
    // wait for a later request's answer: by then the touch was reconciled.
    let touch = serde_json::json!({"metadata": {"labels": {"touched": "yes"}}});
    Api::<HAPair>::all(client.clone()).patch("s1", &PatchParams::default(), &Patch::Merge(&touch)).await.unwrap();
    annotate(client, "s1", "havip.io/resume-failback", "r1").await;
    let (result, message) = wait_answer(client, "s1", "r1").await;
    assert_eq!(result, "Refused");
    assert!(message.contains("Manual"), "{message}");
    let p = get_pair(client, "s1").await;
    assert!(p.status.as_ref().unwrap().command.is_none(), "f1 was issued again");
    let f1_requests = events_for(client, "s1")
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some("PlannedFailoverRequested"))
        .count();
    assert_eq!(f1_requests, 1, "the failover request f1 was acted on once");

    // A failover to a stranger is refused.
    annotate(client, "s1", "havip.io/failover", "f2:nope").await;
    let (result, message) = wait_answer(client, "s1", "f2").await;
    assert_eq!(result, "Refused");
    assert!(message.contains("nope is not a member"), "{message}");
    let ev = wait_event(client, "s1", "PlannedFailoverRefused", "nope is not a member").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));

    // Nobody answers f3: Failed after 10 s.
    annotate(client, "s1", "havip.io/force-failover", "f3").await;
    wait_pair(client, "s1", "command f3", |p| {
        p.status.as_ref().unwrap().command.as_ref().is_some_and(|c| c.id == "f3")
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (result, message) = loop {
        let p = get_pair(client, "s1").await;
        if let Some((id, r, m)) = last_op(&p)
            && id == "f3"
        {
            break (r, m);
        }
        assert!(std::time::Instant::now() < deadline, "f3 never answered; log:\n{}", op.log_tail(40));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(result, "Failed");
    assert!(message.contains("no agent answered"), "{message}");
    eprintln!("commands: command, answer, once per id, refusals with reasons, 10 s timeout ✓");
}

/// One rotation at a time; the old key goes only when both members report the new id.
async fn key_rotation(client: &Client) {
    let old = secret(client, "s1").await;
    let old_key = secret_field(&old, "key").unwrap();
    annotate(client, "s1", "havip.io/rotate-key", "k1").await;
    let p = wait_pair(client, "s1", "rotation k1 in progress", |p| {
        last_op(p).is_some_and(|(i, r, _)| i == "k1" && r == "InProgress")
    })
    .await;
    let kr = p.status.as_ref().unwrap().key_rotation.clone().expect("keyRotation");
    assert_eq!((kr.id.as_str(), kr.key_id), ("k1", 2));
    let s = secret(client, "s1").await;
    assert_eq!(secret_field(&s, "keyId").as_deref(), Some("2"));
    assert_eq!(secret_field(&s, "previousKeyId").as_deref(), Some("1"));
    assert_eq!(secret_field(&s, "previousKey").as_deref(), Some(old_key.as_str()));
    assert_ne!(secret_field(&s, "key").unwrap(), old_key);

    annotate(client, "s1", "havip.io/rotate-key", "k2").await;
    let (result, message) = wait_answer(client, "s1", "k2").await;
    assert_eq!(result, "Refused");
    assert!(message.contains("in progress") && message.contains("one rotation at a time"), "{message}");

    let rev = revision_of(&get_pair(client, "s1").await);
    let mut n2 = entry("n2", "Active", 5, &rev, VIP);
    n2["keyId"] = 2.into();
    report(client, "s1", n2).await;
    // n1 still signs with key 1: the rotation waits (observe a status write that
    // shows it, then check the Secret kept the previous key).
    let mut n1 = entry("n1", "Standby", 5, &rev, VIP);
    n1["alarms"] = serde_json::json!(["ClockSkew"]);
    report(client, "s1", n1).await;
    wait_pair(client, "s1", "n1's alarm seen", |p| {
        condition_of(p, condition::DEGRADED).is_some_and(|c| c.message.contains("n1 raises alarm ClockSkew"))
    })
    .await;
    let s = secret(client, "s1").await;
    assert_eq!(
        secret_field(&s, "previousKeyId").as_deref(),
        Some("1"),
        "the old key must stay until n1 has the new one"
    );
    assert!(get_pair(client, "s1").await.status.unwrap().key_rotation.is_some());

    let mut n1 = entry("n1", "Standby", 5, &rev, VIP);
    n1["keyId"] = 2.into();
    report(client, "s1", n1).await;
    let (result, message) = wait_answer(client, "s1", "k1").await;
    assert_eq!(result, "Succeeded");
    assert!(message.contains("key 1 is no longer accepted"), "{message}");
    let p = wait_pair(client, "s1", "keyRotation cleared", |p| p.status.as_ref().unwrap().key_rotation.is_none()).await;
    assert_eq!(phase_of(&p), Some(Phase::FailedOver), "{:?}", p.status);
    let s = secret(client, "s1").await;
    assert_eq!(secret_field(&s, "previousKey"), None);
    assert_eq!(secret_field(&s, "previousKeyId"), None);
    wait_event(client, "s1", "KeyRotated", "every member signs with key 2").await;
    eprintln!("key rotation: in progress, second refused, done only after both members ✓");
}

/// A missing member Node, a spec that slipped past CEL, and an object the operator
/// cannot even read: each gets a condition and a Warning Event, and no retry storm;
/// the watch keeps working for the others.
async fn invalid_objects(client: &Client, op: &Operator) {
    apply_yaml(client, &pair_yaml("s5", "n1", "ghost")).await;
    let p = wait_pair(client, "s5", "MemberLost", |p| {
        condition_of(p, condition::DEGRADED).is_some_and(|c| c.reason == "MemberLost")
    })
    .await;
    assert!(condition_of(&p, condition::DEGRADED).unwrap().message.contains("Node ghost does not exist"));
    let ev = wait_event(client, "s5", "MemberLost", "ghost").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));

    let bad = "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: s5b}\nspec:\n  members:\n  - {node: n1, priority: 200}\n  - {node: n2, priority: 100}\n  takeover: {holdDown: 999999999999999999999h}\n";
    apply_yaml(client, bad).await;
    let p = wait_pair(client, "s5b", "InvalidSpec", |p| {
        condition_of(p, condition::INVALID_SPEC).is_some_and(|c| c.status == "True")
    })
    .await;
    assert!(condition_of(&p, condition::INVALID_SPEC).unwrap().message.contains("takeover.holdDown"));
    wait_event(client, "s5b", "InvalidSpec", "takeover.holdDown").await;

    // An object the operator cannot read: loosen the CRD so that the API server
    // accepts a pair without members (as an older or newer schema might).
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut loose = serde_json::to_value(
        crd_docs().into_iter().find(|c| c.metadata.name.as_deref() == Some("hapairs.havip.io")).unwrap(),
    )
    .unwrap();
    loose["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("required");
    crds.patch("hapairs.havip.io", &PatchParams::apply("havip-test").force(), &Patch::Apply(&loose))
        .await
        .expect("loosen the CRD");
    let unreadable = "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: s5c}\nspec: {paused: true}\n";
    let raw: Api<kube::api::DynamicObject> =
        Api::all_with(client.clone(), &kube::api::ApiResource::erase::<HAPair>(&()));
    eventually("the API server accepts a pair without members", Duration::from_secs(20), || async {
        let docs = yaml_docs(unreadable);
        raw.patch("s5c", &PatchParams::apply("havip-test").force(), &Patch::Apply(&docs[0]))
            .await
            .map_err(|e| eprintln!("not yet: {e}"))
            .ok()
            .map(|_| ())
    })
    .await;
    let ev = wait_event(client, "s5c", "InvalidSpec", "cannot be read").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let obj = raw.get("s5c").await.unwrap();
    let conds = obj.data["status"]["conditions"].as_array().cloned().unwrap_or_default();
    assert!(
        conds.iter().any(|c| c["type"] == "InvalidSpec"
            && c["status"] == "True"
            && c["message"].as_str().unwrap_or("").to_lowercase().contains("missing field members")),
        "{conds:?}"
    );
    // The watch still works: a new pair is reconciled.
    apply_yaml(client, &pair_yaml("s5d", "n1", "n2")).await;
    wait_pair(client, "s5d", "reconciled after the unreadable object", |p| phase_of(p).is_some()).await;
    // Restore the CRD; the unreadable object goes.
    Api::<HAPair>::all(client.clone()).delete("s5c", &Default::default()).await.expect("delete s5c");
    install_crds(client).await;

    // No retry storm: over 5 s (a measurement window, not a synchronisation), the
    // invalid objects are reconciled at most a couple of times more.
    let before: Vec<usize> = ["s5", "s5b"].iter().map(|p| op.reconciles_of(p)).collect();
    assert!(before.iter().all(|n| *n >= 1), "the debug log shows reconciles: {before:?}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after: Vec<usize> = ["s5", "s5b"].iter().map(|p| op.reconciles_of(p)).collect();
    for (i, pair) in ["s5", "s5b"].iter().enumerate() {
        assert!(after[i] - before[i] <= 2, "{pair}: {} reconciles in 5 s (before {})", after[i] - before[i], before[i]);
    }
    assert!(op.reconciles_of("s5c") <= 3, "s5c reconciled {} times", op.reconciles_of("s5c"));
    eprintln!("invalid objects: conditions, Warning Events, reconciles {before:?} → {after:?} ✓");
}

/// A FloatingIP naming a missing pair gets `PairFound=False` and a Warning Event; it
/// turns True when the pair appears.
async fn floating_ip_pair_found(client: &Client) {
    apply_yaml(client, &fip_yaml("orphan", "s6", "10.0.0.60/24")).await;
    let api: Api<havip_crds::FloatingIP> = Api::all(client.clone());
    let found = |want: &'static str| {
        let api = api.clone();
        move || {
            let api = api.clone();
            async move {
                let f = api.get("orphan").await.ok()?;
                f.status?.conditions.into_iter().find(|c| c.type_ == "PairFound" && c.status == want)
            }
        }
    };
    let c = eventually("PairFound=False", Duration::from_secs(20), found("False")).await;
    assert!(c.message.contains("HAPair s6 does not exist"), "{c:?}");
    let ev = wait_event(client, "orphan", "PairNotFound", "s6").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    apply_yaml(client, &pair_yaml("s6", "n1", "n2")).await;
    eventually("PairFound=True", Duration::from_secs(20), found("True")).await;
    wait_pair(client, "s6", "counts its VIP", |p| p.status.as_ref().and_then(|s| s.vips) == Some(1)).await;
    eprintln!("FloatingIP PairFound ✓");
}

/// The member labels of an object (`member.havip.io/<node>` → nodes).
fn members_labelled(labels: &BTreeMap<String, String>) -> Vec<String> {
    labels.keys().filter_map(|k| k.strip_prefix(havip_crds::membership::PREFIX)).map(str::to_owned).collect()
}

async fn fip_accepted(client: &Client, name: &str) -> Option<(String, String, String, Vec<String>)> {
    let f = Api::<havip_crds::FloatingIP>::all(client.clone()).get(name).await.ok()?;
    let members = members_labelled(f.labels());
    let c = f.status?.conditions.into_iter().find(|c| c.type_ == condition::ACCEPTED)?;
    Some((c.status, c.reason, c.message, members))
}

/// Every object of a pair carries its members' labels (the agents select by them), the
/// status publishes the members' addresses; a FloatingIP on an address an older one uses,
/// or on a member Node's own address, is refused (condition, Event, no label, in no
/// revision); the older one deleted, the newer is accepted; a member change moves the
/// labels.
async fn admission_and_member_labels(client: &Client) {
    apply_yaml(client, &fip_yaml("s8-a", "s8", "10.0.0.80/24")).await;
    apply_yaml(client, &pair_yaml("s8", "n1", "n2")).await;
    let p = wait_pair(client, "s8", "labelled for n1 and n2, addresses published", |p| {
        members_labelled(p.labels()) == ["n1", "n2"]
            && p.status.as_ref().and_then(|s| s.member_address("n2", "internal")) == Some("10.0.0.2")
    })
    .await;
    assert_eq!(p.status.as_ref().and_then(|s| s.member_address("n1", "internal")), Some("10.0.0.1"));
    let lease = Api::<Lease>::namespaced(client.clone(), NS).get("hapair-s8").await.expect("Lease");
    assert_eq!(members_labelled(lease.labels()), ["n1", "n2"]);
    let key = secret(client, "s8").await;
    assert_eq!(members_labelled(key.labels()), ["n1", "n2"]);
    let a = eventually("s8-a accepted and labelled", Duration::from_secs(20), || async {
        fip_accepted(client, "s8-a").await.filter(|a| a.0 == "True" && a.3 == ["n1", "n2"])
    })
    .await;
    assert_eq!(a.1, "AsExpected", "{a:?}");

    // The same address again, later (another prefix length): refused.
    apply_yaml(client, &fip_yaml("s8-b", "s8", "10.0.0.80/32")).await;
    let b = eventually("s8-b refused", Duration::from_secs(20), || async {
        fip_accepted(client, "s8-b").await.filter(|a| a.0 == "False")
    })
    .await;
    assert_eq!(b.1, "AddressInUse", "{b:?}");
    assert!(b.2.contains("FloatingIP s8-a (pair s8)"), "{b:?}");
    assert!(b.3.is_empty(), "a refused FloatingIP carries no member label: {b:?}");
    let ev = wait_event(client, "s8-b", "AddressInUse", "s8-a").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    // A member Node's own address: refused.
    apply_yaml(client, &fip_yaml("s8-n", "s8", "10.0.0.2/24")).await;
    let n = eventually("s8-n refused", Duration::from_secs(20), || async {
        fip_accepted(client, "s8-n").await.filter(|a| a.0 == "False")
    })
    .await;
    assert_eq!(n.1, "NodeAddress", "{n:?}");
    assert!(n.2.contains("InternalIP of member node n2"), "{n:?}");
    wait_event(client, "s8-n", "NodeAddress", "n2").await;
    // The pair counts and hashes only the accepted one.
    let fips = BTreeMap::from([(
        "s8-a".to_owned(),
        serde_json::from_value::<FloatingIPSpec>(serde_json::json!({"pair": "s8", "address": "10.0.0.80/24"})).unwrap(),
    )]);
    let addrs = BTreeMap::from([
        ("n1".to_owned(), BTreeMap::from([("internal".to_owned(), "10.0.0.1".to_owned())])),
        ("n2".to_owned(), BTreeMap::from([("internal".to_owned(), "10.0.0.2".to_owned())])),
    ]);
    let want = format_revision(config_revision(&p.spec, &fips, &addrs));
    let p = wait_pair(client, "s8", "one VIP counted", |p| p.status.as_ref().and_then(|s| s.vips) == Some(1)).await;
    assert_eq!(revision_of(&p), want, "the refused FloatingIPs are in no revision");

    // The older one goes: the newer is accepted, labelled, in the revision.
    Api::<havip_crds::FloatingIP>::all(client.clone()).delete("s8-a", &Default::default()).await.expect("delete s8-a");
    eventually("s8-b accepted and labelled", Duration::from_secs(20), || async {
        fip_accepted(client, "s8-b").await.filter(|a| a.0 == "True" && a.3 == ["n1", "n2"])
    })
    .await;
    wait_event(client, "s8-b", "Accepted", "s8").await;

    // n2 leaves, n3 joins: every label follows.
    apply_yaml(client, &pair_yaml("s8", "n1", "n3")).await;
    wait_pair(client, "s8", "labelled for n1 and n3", |p| members_labelled(p.labels()) == ["n1", "n3"]).await;
    eventually("the FloatingIP, Lease and Secret relabelled", Duration::from_secs(20), || async {
        let f = fip_accepted(client, "s8-b").await?;
        let l = Api::<Lease>::namespaced(client.clone(), NS).get("hapair-s8").await.ok()?;
        let s = Api::<Secret>::namespaced(client.clone(), NS).get("havip-s8-key").await.ok()?;
        (f.3 == ["n1", "n3"]
            && members_labelled(l.labels()) == ["n1", "n3"]
            && members_labelled(s.labels()) == ["n1", "n3"])
        .then_some(())
    })
    .await;
    // n2 is no member any more, but still a Node: s8-n stays refused.
    let n = eventually("s8-n refused as a node's address once n2 left", Duration::from_secs(20), || async {
        fip_accepted(client, "s8-n").await.filter(|a| a.0 == "False" && !a.2.contains("member"))
    })
    .await;
    assert_eq!(n.1, "NodeAddress", "{n:?}");
    assert!(n.2.contains("InternalIP of node n2"), "{n:?}");
    assert!(n.3.is_empty(), "{n:?}");
    Api::<havip_crds::FloatingIP>::all(client.clone()).delete("s8-n", &Default::default()).await.expect("delete s8-n");
    eprintln!("FloatingIP admission and member labels ✓");
}

/// Addresses that are never a VIP, whichever pair's: any Node's (not only the pair's
/// members') and the API server's — the ClusterIP of `default/kubernetes` and the
/// addresses of its EndpointSlice. Refused (no member label: no agent configures them),
/// and accepted once no longer reserved (the change alone reconciles the pair).
async fn reserved_addresses(client: &Client) {
    use k8s_openapi::api::core::v1::{Node, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let refused = |name: &'static str| async move {
        eventually(&format!("{name} refused"), Duration::from_secs(20), || async {
            fip_accepted(client, name).await.filter(|a| a.0 == "False")
        })
        .await
    };
    // A Node that is no member of s8 (n1, n3).
    create_node(client, "n4", "10.0.0.4").await;
    apply_yaml(client, &fip_yaml("s9-node", "s8", "10.0.0.4/24")).await;
    let r = refused("s9-node").await;
    assert_eq!(r.1, "NodeAddress", "{r:?}");
    assert!(r.2.contains("is the InternalIP of node n4"), "{r:?}");
    assert!(r.3.is_empty(), "a refused FloatingIP carries no member label: {r:?}");
    wait_event(client, "s9-node", "NodeAddress", "node n4").await;
    // The API server's ClusterIP.
    let kubernetes = Api::<Service>::namespaced(client.clone(), "default").get("kubernetes").await.expect("Service");
    let cluster_ip = kubernetes.spec.and_then(|s| s.cluster_ip).expect("the API server's ClusterIP");
    apply_yaml(client, &fip_yaml("s9-api", "s8", &format!("{cluster_ip}/32"))).await;
    let r = refused("s9-api").await;
    assert_eq!(r.1, "ApiServerAddress", "{r:?}");
    assert!(r.2.contains("the API server's ClusterIP"), "{r:?}");
    wait_event(client, "s9-api", "ApiServerAddress", &cluster_ip).await;
    // The API server's own address, from its EndpointSlice (this control plane runs no
    // endpoint reconciler: the test writes the slice as the API server would).
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), "default");
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.5"], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
    }))
    .unwrap();
    slices.create(&PostParams::default(), &slice).await.expect("EndpointSlice");
    apply_yaml(client, &fip_yaml("s9-ep", "s8", "10.0.0.5/24")).await;
    let r = refused("s9-ep").await;
    assert_eq!(r.1, "ApiServerAddress", "{r:?}");
    assert!(r.2.contains("EndpointSlice default/kubernetes"), "{r:?}");
    // No longer reserved: accepted and labelled.
    Api::<Node>::all(client.clone()).delete("n4", &Default::default()).await.expect("delete n4");
    slices.delete("kubernetes", &Default::default()).await.expect("delete the EndpointSlice");
    for name in ["s9-node", "s9-ep"] {
        eventually(&format!("{name} accepted once its address is nobody's"), Duration::from_secs(20), || async {
            fip_accepted(client, name).await.filter(|a| a.0 == "True" && a.3 == ["n1", "n3"])
        })
        .await;
    }
    for name in ["s9-node", "s9-api", "s9-ep"] {
        Api::<havip_crds::FloatingIP>::all(client.clone()).delete(name, &Default::default()).await.expect("delete");
    }
    eprintln!("reserved addresses refused ✓");
}

fn plugin(cp: &ControlPlane, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(plugin_binary())
        .env("KUBECONFIG", cp.kubeconfig())
        .args(args)
        .output()
        .expect("kubectl-havip runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl havip failover` against a simulated agent that executes the command;
/// a refused one exits non-zero with the reason; `status` reads well.
async fn plugin_end_to_end(client: &Client, cp: &ControlPlane) {
    // s1: n2 active at epoch 5, n1 ready. A simulated agent on n2 executes commands.
    let agent = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut answered = std::collections::BTreeSet::new();
            loop {
                let p = get_pair(&client, "s1").await;
                let st = p.status.clone().unwrap_or_default();
                if let Some(c) = st.command.filter(|c| !answered.contains(&c.id)) {
                    let rev = st.config_revision.clone().unwrap_or_default();
                    let mut e = entry("n2", "Standby", 6, &rev, VIP);
                    e["keyId"] = 2.into();
                    e["lastOperation"] = serde_json::json!({"id": c.id, "kind": c.kind, "result": "Succeeded", "message": format!("handed over to {}", c.target.clone().unwrap_or_default())});
                    set_lease(&client, "s1", c.target.as_deref(), 6).await;
                    report(&client, "s1", e).await;
                    answered.insert(c.id);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let cp_kube = cp.kubeconfig();
    let (code, out, err) = tokio::task::spawn_blocking({
        let kc = cp_kube.clone();
        move || {
            let out = std::process::Command::new(plugin_binary())
                .env("KUBECONFIG", kc)
                .args(["failover", "s1"])
                .output()
                .expect("kubectl-havip runs");
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    })
    .await
    .unwrap();
    agent.abort();
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("PlannedFailover") && out.contains("Succeeded") && out.contains("handed over to n1"), "{out}");

    let (code, out, err) = plugin(cp, &["failover", "s1", "--to", "nope"]);
    assert_eq!(code, 6, "refused: stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("Refused") && out.contains("nope is not a member"), "{out}");

    let (code, out, err) = plugin(cp, &["--timeout", "2s", "failover", "no-such-pair"]);
    assert_eq!(code, 3, "not found: {out}{err}");
    assert!(err.contains("no-such-pair") && err.contains("kubectl havip list"), "{err}");

    let (code, out, _) = plugin(cp, &["status", "s1"]);
    assert_eq!(code, 0);
    for phrase in ["HAPair s1:", "NODE", "n1", "n2", "last transition:", "last operation: PlannedFailover"] {
        assert!(out.contains(phrase), "status lacks {phrase:?}:\n{out}");
    }
    eprintln!("kubectl havip status s1:\n{out}");
    let (code, out, _) = plugin(cp, &["status"]);
    assert_eq!(code, 0);
    for phrase in ["HAPair s1:", "HAPair s5:", "HAPair s6:", "(no report)"] {
        assert!(out.contains(phrase), "status (all) lacks {phrase:?}:\n{out}");
    }

    // Maintenance is declarative: the spec changes at once; the verb waits for the
    // member's agent to confirm it.
    let (code, out, err) = plugin(cp, &["--timeout", "2s", "maintenance", "s6", "n2", "on"]);
    assert_eq!(code, 7, "no agent confirms: pending\n{out}{err}");
    assert!(out.contains("has not confirmed"), "{out}");
    let p = get_pair(client, "s6").await;
    assert!(p.spec.members.iter().any(|m| m.node == "n2" && m.maintenance), "{:?}", p.spec.members);
    assert!(p.spec.members.iter().any(|m| m.node == "n1" && !m.maintenance && m.priority == 200), "the rest unchanged");
    let mut n2 = entry("n2", "Maintenance", 0, &revision_of(&p), VIP);
    n2["maintenance"] = true.into();
    report(client, "s6", n2).await;
    let (code, out, err) = plugin(cp, &["--timeout", "5s", "maintenance", "s6", "n2", "on"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("applied by its agent"), "{out}");
    let (code, out, err) = plugin(cp, &["maintenance", "s6", "zz", "on"]);
    assert_eq!(code, 2, "usage: {out}{err}");
    assert!(err.contains("zz is not a member"), "{err}");

    // rotate-key answers InProgress until the members use the new key: a timeout.
    let (code, out, err) = plugin(cp, &["--timeout", "3s", "rotate-key", "s6"]);
    assert_eq!(code, 7, "pending: {out}{err}");
    assert!(out.contains("RotateKey") && out.contains("InProgress"), "{out}");
    eprintln!("kubectl-havip: failover end to end, refusal, maintenance, rotate-key, status ✓");
}

/// A member removed from the spec and a new one added: the key is rotated so the old
/// node becomes a stranger; the rotation ends when the current members use the new key.
async fn member_replacement(client: &Client) {
    apply_yaml(client, &pair_yaml("s7", "n1", "n2")).await;
    let p = wait_pair(client, "s7", "Pending", |p| phase_of(p) == Some(Phase::Pending)).await;
    let rev = revision_of(&p);
    set_lease(client, "s7", Some("n1"), 1).await;
    report(client, "s7", entry("n1", "Active", 1, &rev, VIP)).await;
    report(client, "s7", entry("n2", "Standby", 1, &rev, VIP)).await;
    // n2 dies and is replaced by n3.
    apply_yaml(client, &pair_yaml("s7", "n1", "n3")).await;
    let p = wait_pair(client, "s7", "rotation for the removed member", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.key_rotation.as_ref())
            .is_some_and(|k| k.id.starts_with("member-removal-") && k.key_id == 2)
    })
    .await;
    wait_event(client, "s7", "KeyRotationStarted", "n2 left the pair").await;
    let s = secret(client, "s7").await;
    assert_eq!(secret_field(&s, "keyId").as_deref(), Some("2"));
    let rev = revision_of(&p);
    let mut n1 = entry("n1", "Active", 1, &rev, VIP);
    n1["keyId"] = 2.into();
    report(client, "s7", n1).await;
    let mut n3 = entry("n3", "Standby", 1, &rev, VIP);
    n3["keyId"] = 2.into();
    report(client, "s7", n3).await;
    wait_pair(client, "s7", "rotation done, Live with n3, n2's entry removed", |p| {
        let st = p.status.as_ref().unwrap();
        st.key_rotation.is_none()
            && st.phase == Some(Phase::Live)
            && st.standby.as_deref() == Some("n3")
            && !st.members.iter().any(|m| m.node == "n2")
    })
    .await;
    assert_eq!(secret_field(&secret(client, "s7").await, "previousKey"), None);
    eprintln!("member replacement: key rotated, newcomer standby ✓");
}

/// A pair deleted and created again under the same name, before any garbage collector
/// removed its Lease and key Secret (this API server runs none): the new pair takes them
/// over — the Lease keeps its epoch and loses its holder, the Secret gets a fresh key under
/// the next id — instead of inheriting them silently (where a collector would later delete
/// them under the running pair, and the operator create a new key under the same id).
async fn recreated_pair(client: &Client) {
    apply_yaml(client, &pair_yaml("s10", "n1", "n2")).await;
    let first = wait_pair(client, "s10", "Pending", |p| phase_of(p) == Some(Phase::Pending)).await;
    set_lease(client, "s10", Some("n1"), 7).await;
    let old = secret(client, "s10").await;
    let old_key = secret_field(&old, "key").unwrap();
    Api::<HAPair>::all(client.clone()).delete("s10", &Default::default()).await.expect("delete s10");
    eventually("s10 gone", Duration::from_secs(10), || async {
        Api::<HAPair>::all(client.clone()).get_opt("s10").await.ok().flatten().is_none().then_some(())
    })
    .await;
    apply_yaml(client, &pair_yaml("s10", "n1", "n3")).await;
    let again = wait_pair(client, "s10", "the new s10", |p| p.metadata.uid != first.metadata.uid).await;
    let uid = again.metadata.uid.clone().unwrap();
    let owned_by_new = |refs: &Option<Vec<OwnerReference>>| refs.iter().flatten().any(|r| r.uid == uid);
    let s = eventually("the key Secret taken over", Duration::from_secs(10), || async {
        let s = secret(client, "s10").await;
        owned_by_new(&s.metadata.owner_references).then_some(s)
    })
    .await;
    assert_ne!(secret_field(&s, "key").unwrap(), old_key, "a fresh key for the new pair");
    assert_eq!(secret_field(&s, "keyId").as_deref(), Some("2"), "under the next id");
    assert_eq!(secret_field(&s, "previousKey"), None);
    assert_eq!(s.metadata.owner_references.as_ref().map(Vec::len), Some(1));
    let lease = eventually("the Lease taken over", Duration::from_secs(10), || async {
        let l = Api::<Lease>::namespaced(client.clone(), NS).get("hapair-s10").await.ok()?;
        owned_by_new(&l.metadata.owner_references).then_some(l)
    })
    .await;
    let ls = lease.spec.unwrap();
    assert_eq!((ls.holder_identity, ls.lease_transitions), (None, Some(7)), "the epoch kept, no holder");
    wait_event(client, "s10", havip_crds::reason::EARLIER_PAIR_ADOPTED, "taken over").await;
    eprintln!("re-created pair: Lease (epoch kept) and a fresh key taken over ✓");
}

/// An upgrade from a release that named pair Leases `havip-<pair>`: the new operator
/// creates `hapair-<pair>` with the holder and epoch of the pair's old Lease (no
/// epoch goes backwards) and leaves the old one alone; a pair named `operator` gets its
/// own Lease and never touches the leader-election Lease `havip-operator`.
async fn upgrade_from_old_lease_names(client: &Client, cp: &ControlPlane, kubeconfig: &std::path::Path, op: Operator) {
    // The running operator stops (releasing the leader Lease); pairs appear meanwhile,
    // one with a Lease under the old name, as an earlier release left it.
    op.signal("TERM");
    let mut op = op;
    eventually("the operator exits", Duration::from_secs(20), || {
        let exited = op.child.try_wait().ok().flatten().is_some();
        async move { exited.then_some(()) }
    })
    .await;
    drop(op);
    apply_yaml(client, &pair_yaml("up1", "n1", "n2")).await;
    apply_yaml(client, &pair_yaml("operator", "n1", "n2")).await;
    let up1 = get_pair(client, "up1").await;
    let uid = up1.metadata.uid.clone().expect("uid");
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let old: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "havip-up1", "namespace": NS, "ownerReferences": [{
            "apiVersion": "havip.io/v1alpha1", "kind": "HAPair", "name": "up1", "uid": uid, "controller": true,
        }]},
        "spec": {"holderIdentity": "n2", "leaseTransitions": 7},
    }))
    .unwrap();
    leases.create(&PostParams::default(), &old).await.expect("old-name Lease");
    let leader_before = leases.get("havip-operator").await.expect("leader Lease");

    let op = Operator::start_with(cp, kubeconfig, "op-2", &[]);
    let view = |l: &Lease| {
        let s = l.spec.clone().unwrap_or_default();
        (s.holder_identity, s.lease_transitions)
    };
    let carried = eventually("hapair-up1 carried over", Duration::from_secs(30), || {
        let leases = leases.clone();
        async move { leases.get_opt("hapair-up1").await.ok().flatten() }
    })
    .await;
    assert_eq!(view(&carried), (Some("n2".to_owned()), Some(7)), "holder and epoch of the old Lease");
    let fresh = eventually("hapair-operator created", Duration::from_secs(30), || {
        let leases = leases.clone();
        async move { leases.get_opt("hapair-operator").await.ok().flatten() }
    })
    .await;
    assert_eq!(view(&fresh), (None, Some(0)), "the leader Lease's holder and epoch are not a pair's");
    wait_pair(client, "up1", "epoch 7 from the carried-over Lease", |p| {
        p.status.as_ref().and_then(|s| s.epoch) == Some(7)
    })
    .await;
    wait_event(client, "up1", "LeaseCreated", "from the Lease havip-up1").await;
    let p = wait_pair(client, "operator", "Pending", |p| phase_of(p) == Some(Phase::Pending)).await;
    assert!(condition_of(&p, condition::INVALID_SPEC).is_none_or(|c| c.status == "False"), "{:?}", p.status);
    // The old Lease stays as it was (the operator may not delete Leases).
    assert_eq!(view(&leases.get("havip-up1").await.expect("old Lease")), (Some("n2".to_owned()), Some(7)));
    // The leader Lease is the new operator's, and no pair wrote it.
    let leader = eventually("op-2 leads", Duration::from_secs(30), || {
        let leases = leases.clone();
        async move {
            leases
                .get("havip-operator")
                .await
                .ok()
                .filter(|l| l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some("op-2"))
        }
    })
    .await;
    assert_eq!(leader.metadata.owner_references, leader_before.metadata.owner_references);
    drop(op);
    eprintln!("upgrade: pair Lease carried over under the new name; a pair named operator is harmless ✓");
}
