//! The speakers' answers, as FRR 8.4 and BIRD 2.0.12 gave them in the lab.

use super::{
    Advertised, BirdBgp, Session, SpeakerReport, bird_bgp_protocols, bird_has_route, bird_line, bird_refused,
    frr_advertised_to, frr_answer, frr_sessions,
};
use std::net::IpAddr;

const FRR_SUMMARY: &str = r#"{
"ipv4Unicast":{"routerId":"10.99.0.2","as":64600,"peers":{
  "10.99.0.1":{"hostname":"vm","remoteAs":64512,"pfxSnt":1,"state":"Established","peerState":"OK"}}},
"ipv6Unicast":{"routerId":"10.99.0.2","as":64600,"peers":{
  "fd00::1":{"remoteAs":64512,"state":"Active","peerState":"OK"},
  "10.99.0.1":{"remoteAs":64512,"state":"Established"}}}
}"#;

const FRR_PREFIX: &str = r#"{"prefix":"10.1.9.50/32","version":1,
"advertisedTo":{"10.99.0.1":{"hostname":"vm"}},
"paths":[{"aspath":{"string":"Local","segments":[],"length":0},"origin":"incomplete","metric":4294967200,
  "weight":32768,"valid":true,"sourced":true,
  "bestpath":{"bestpathFromAs":0,"overall":true,"selectionReason":"First path received"},
  "nexthops":[{"ip":"0.0.0.0","afi":"ipv4","metric":0,"accessible":true,"used":true}],
  "peer":{"peerId":"0.0.0.0","routerId":"10.99.0.2"}}]}"#;

/// A VIP this speaker learned from a peer (never a member's own): not advertised by it.
const FRR_LEARNED: &str = r#"{"prefix":"10.1.9.50/32","advertisedTo":{"10.99.0.1":{}},
"paths":[{"valid":true,"bestpath":{"overall":true},"peer":{"peerId":"10.99.0.1"}}]}"#;

#[test]
fn a_vty_answer_ends_with_three_nuls_and_its_status() {
    assert_eq!(frr_answer(b"{\n}\n\0\0\0\0"), Some(("{\n}\n".to_owned(), 0)));
    let refused = b"% [BGP] Unknown command: show bgp nonsense json\n\0\0\0\x02";
    assert_eq!(frr_answer(refused).map(|a| a.1), Some(2));
    // Not complete yet: more is to be read.
    assert_eq!(frr_answer(b"{\"ipv4Unicast\":"), None);
    assert_eq!(frr_answer(b"ab\0\0"), None);
}

#[test]
fn frr_sessions_are_read_once_per_peer_across_families() {
    let v: serde_json::Value = serde_json::from_str(FRR_SUMMARY).unwrap_or_default();
    let s = frr_sessions(&v);
    assert_eq!(
        s,
        vec![
            Session { peer: "10.99.0.1".into(), state: "Established".into(), established: true },
            Session { peer: "fd00::1".into(), state: "Active".into(), established: false },
        ]
    );
    assert!(frr_sessions(&serde_json::json!({})).is_empty());
}

#[test]
fn frr_advertises_only_its_own_best_path() {
    let own: serde_json::Value = serde_json::from_str(FRR_PREFIX).unwrap_or_default();
    assert_eq!(frr_advertised_to(&own), vec!["10.99.0.1".to_owned()]);
    let learned: serde_json::Value = serde_json::from_str(FRR_LEARNED).unwrap_or_default();
    assert!(frr_advertised_to(&learned).is_empty());
    // Not in the table ("{}"): not advertised.
    assert!(frr_advertised_to(&serde_json::json!({})).is_empty());
}

const BIRD_PROTOCOLS: &str = "2002-Name       Proto      Table      State  Since         Info
1002-device1    Device     ---        up     14:07:47.564  
1006-
1002-havip      Direct     ---        up     14:07:47.564  
1006-  Channel ipv4
     State:          UP
     Routes:         1 imported, 0 exported, 1 preferred
1002-upstream   BGP        ---        up     14:07:52.069  Established   
1006-  BGP state:          Established
     Neighbor address: 10.99.0.1
     Neighbor AS:      64512
     Hold timer:       7.566/9
   Channel ipv4
     State:          UP
1002-backup     BGP        ---        start  14:07:52.069  Active        Socket: Connection refused
1006-  BGP state:          Active
     Neighbor address: 10.99.0.3
0000 ";

fn bird_reply(text: &str) -> Vec<(u16, String)> {
    let mut code = 0;
    text.lines()
        .map(|l| {
            let (c, _, t) = bird_line(l, code);
            code = c;
            (c, t)
        })
        .collect()
}

#[test]
fn bird_lines_carry_their_codes_and_the_last_one_ends_the_reply() {
    assert_eq!(bird_line("0001 BIRD 2.0.12 ready.", 0), (1, true, "BIRD 2.0.12 ready.".to_owned()));
    assert_eq!(bird_line("1002-upstream BGP", 0), (1002, false, "upstream BGP".to_owned()));
    assert_eq!(
        bird_line("     Neighbor address: 10.99.0.1", 1006),
        (1006, false, "    Neighbor address: 10.99.0.1".into())
    );
    assert_eq!(bird_line("0000 ", 1006), (0, true, String::new()));
    assert_eq!(bird_line("8001 Network not found", 0), (8001, true, "Network not found".to_owned()));
}

#[test]
fn bird_bgp_protocols_with_their_neighbours_and_states() {
    let p = bird_bgp_protocols(&bird_reply(BIRD_PROTOCOLS));
    assert_eq!(
        p,
        vec![
            BirdBgp {
                name: "upstream".into(),
                peer: "10.99.0.1".into(),
                state: "Established".into(),
                established: true
            },
            BirdBgp { name: "backup".into(), peer: "10.99.0.3".into(), state: "Active".into(), established: false },
        ]
    );
}

#[test]
fn a_bird_export_lists_the_route_or_says_not_found() {
    let found = bird_reply(
        "1007-Table master4:\n 10.1.9.50/32         unicast [havip 14:07:47.566] * (240)\n \tdev havip0\n0000 ",
    );
    assert!(bird_has_route(&found, "10.1.9.50/32"));
    assert!(!bird_has_route(&found, "10.1.9.5/32"));
    let missing = bird_reply("8001 Network not found");
    assert!(!bird_has_route(&missing, "10.1.9.50/32"));
    assert!(bird_refused(&missing, "show route", &[8001]).is_ok());
    let syntax = bird_reply("9001 syntax error, unexpected CF_SYM_UNDEFINED");
    let e = bird_refused(&syntax, "show route 10.1.9.50/32 export nosuch", &[8001]);
    assert!(e.is_err_and(|e| e.to_string().contains("9001 syntax error")));
}

#[test]
fn a_report_says_what_is_wrong_first() {
    let vip: IpAddr = "10.1.9.50".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let up = Session { peer: "10.99.0.1".into(), state: "Established".into(), established: true };
    let down = Session { peer: "10.99.0.1".into(), state: "Active".into(), established: false };
    let fine = SpeakerReport {
        kind: Some(super::SpeakerKind::Frr),
        error: None,
        sessions: vec![up.clone()],
        advertised: vec![Advertised { address: vip, peers: vec!["10.99.0.1".into()] }],
    };
    assert_eq!(fine.problem(), None);
    assert_eq!((fine.established(), fine.advertised_count()), (1, 1));
    let unreachable = SpeakerReport { error: Some("no BGP speaker found".into()), ..fine.clone() };
    assert_eq!(unreachable.problem().as_deref(), Some("no BGP speaker found"));
    let no_session = SpeakerReport { sessions: vec![down], ..fine.clone() };
    assert_eq!(no_session.problem().as_deref(), Some("no BGP session is established (1 configured)"));
    let not_advertised = SpeakerReport { advertised: vec![Advertised { address: vip, peers: vec![] }], ..fine.clone() };
    assert_eq!(not_advertised.problem().as_deref(), Some("the BGP speaker does not advertise 10.1.9.50"));
    // A standby holds nothing: its sessions are all that matters.
    let standby = SpeakerReport { advertised: vec![], sessions: vec![up], ..fine };
    assert_eq!(standby.problem(), None);
}
