//! The standalone file's `quorum:` section (the control-plane mode's arbitration).
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use havip_node_agent::config::AgentConfig;
use havip_node_agent::standalone::config::StandaloneFile;

fn load(members: usize, extra: &str) -> Result<AgentConfig, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pair.yaml");
    let mut yaml = String::from("pair: api\nnode: a\nmembers:\n");
    for (i, n) in ["a", "b", "c", "d"].iter().take(members).enumerate() {
        yaml.push_str(&format!(
            "  - {{node: {n}, priority: {}, addresses: {{data: 10.0.0.{}, mgmt: 10.0.1.{}}}}}\n",
            200 - i * 10,
            i + 1,
            i + 1
        ));
    }
    yaml.push_str("heartbeat: {key: 000102030405060708090a0b0c0d0e0f, paths: [data, mgmt]}\n");
    yaml.push_str("vips:\n  - {address: 10.0.0.50/24}\n");
    yaml.push_str(extra);
    std::fs::write(&path, yaml).unwrap();
    StandaloneFile::load(&path).map_err(|e| e.to_string())?.into_agent_config(None).map_err(|e| e.to_string())
}

#[test]
fn every_member_votes_on_its_first_path_address_and_takeovers_need_the_votes() {
    let c = load(3, "quorum: {}\n").unwrap();
    let q = c.quorum.as_ref().unwrap();
    let voters: Vec<String> = q.voters.iter().map(|(n, a)| format!("{n}={a}")).collect();
    assert_eq!(voters, ["a=10.0.0.1:7948", "b=10.0.0.2:7948", "c=10.0.0.3:7948"]);
    assert_eq!(q.listen.to_string(), "10.0.0.1:7948");
    assert_eq!(q.majority(), 2);
    assert_eq!(q.lease.as_millis(), 400, "the documented default");
    assert!(c.sm.lease_vote_required);
    assert_eq!(c.sm.quorum_lease_ms, Some(400));
    let c = load(4, "quorum: {port: 7999, lease: 1s}\n").unwrap();
    let q = c.quorum.as_ref().unwrap();
    assert_eq!((q.majority(), q.lease.as_millis(), q.listen.port()), (3, 1000, 7999));
    // One member alone is its own majority; two need both (a step while growing).
    assert_eq!(load(1, "quorum: {}\n").unwrap().quorum.unwrap().majority(), 1);
    assert_eq!(load(2, "quorum: {}\n").unwrap().quorum.unwrap().majority(), 2);
}

#[test]
fn the_voters_key_follows_the_heartbeat_key_and_every_member_must_agree_on_the_quorum() {
    let a = load(3, "quorum: {}\n").unwrap();
    let b = load(3, "quorum: {}\n").unwrap();
    assert_eq!(a.quorum.as_ref().unwrap().keys, b.quorum.as_ref().unwrap().keys, "derived, the same on every member");
    assert_ne!(a.quorum.as_ref().unwrap().keys.current.secret, a.keys.current.secret, "not the heartbeat key itself");
    let plain = load(3, "").unwrap();
    assert_ne!(plain.sm.config_revision, a.sm.config_revision, "the quorum is part of the pair's revision");
    let other_lease = load(3, "quorum: {lease: 500ms}\n").unwrap();
    assert_ne!(other_lease.sm.config_revision, a.sm.config_revision);
}

#[test]
fn a_quorum_that_cannot_work_is_refused_with_the_reason() {
    let e = load(3, "quorum: {}\nwitness: {address: 10.0.0.9, key: 000102030405060708090a0b0c0d0e0f}\n").unwrap_err();
    assert!(e.contains("one or the other"), "{e}");
    let e = load(3, "quorum: {lease: 50ms}\n").unwrap_err();
    assert!(e.contains("quorum.lease"), "{e}");
    let e = load(3, "quorum: {lease: soon}\n").unwrap_err();
    assert!(e.contains("quorum.lease"), "{e}");
    let e = load(3, "quorum: {port: 0}\n").unwrap_err();
    assert!(e.contains("quorum.port"), "{e}");
    let e = load(3, "quorum: {votes: 3}\n").unwrap_err();
    assert!(e.contains("votes"), "unknown keys are refused: {e}");
}

#[test]
fn a_control_plane_pair_practically_never_suspends_its_moves_unless_told_to() {
    let api = "apiServer: {caFile: /nonexistent/pki/ca.crt}\n";
    let c = load(3, &format!("quorum: {{}}\n{api}")).unwrap();
    assert_eq!(c.sm.flap.moves, 100, "with apiServer the suspension needs 100 moves");
    let plain = load(3, "quorum: {}\n").unwrap();
    assert_eq!(plain.sm.flap.moves, 3, "without it, the HAPair default");
    let told = load(3, &format!("quorum: {{}}\n{api}flapSuspension: {{moves: 5}}\n")).unwrap();
    assert_eq!(told.sm.flap.moves, 5, "the file's own setting wins");
    assert_ne!(c.sm.config_revision, told.sm.config_revision, "the suspension is part of the revision");
}
