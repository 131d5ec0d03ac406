//! Two members that cannot verify each other's heartbeats (a key change gone wrong before
//! both restarted): their datagrams arrive from each other's configured address and fail
//! verification (`AdvertRejected { reason: KeyMismatch, from }`). When both hold the VIPs —
//! each also sees the other's MAC answer for the VIP (`Conflict`) — the member of lower
//! priority gives them up (`UnverifiedPeer`) and, as a standby, does not take them back
//! while the data plane answers.

#![allow(clippy::unwrap_used)]

mod sm_support;

use havip_sm::*;
use sm_support::*;

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

/// Member `me` of the usual pair, holding the VIP (adopted at start), hearing nothing
/// verifiable from its peer. Time is 3000.
fn holder(me: &str) -> H {
    let mut h = H::new(pair(me), Persisted { epoch: 1, last_role: Role::Active, ..Persisted::default() });
    h.env_links_standalone();
    h.local_vips(&[VIP]);
    h.run(3_000, &[], None);
    assert_eq!(h.role(), Role::Active, "{:?}", h.status());
    h
}

/// Advances to `until`: every 100 ms a rejected heartbeat from `from`'s address (if
/// any), every 500 ms a conflict with `mac` (if any), ticks every 20 ms, the data-plane
/// probe (a standby's) up every 50 ms.
fn run(h: &mut H, until: u64, from: Option<&str>, mac: Option<[u8; 6]>) -> Vec<Action> {
    let mut out = Vec::new();
    while h.now < until {
        h.now += 10;
        if h.now.is_multiple_of(100)
            && let Some(f) = from
        {
            out.extend(h.feed(Input::AdvertRejected {
                path: PathId(0),
                reason: RejectReason::KeyMismatch,
                from: Some(node(f)),
            }));
        }
        if h.now.is_multiple_of(500)
            && let Some(m) = mac
        {
            out.extend(h.feed(Input::Conflict { vip: vip(VIP), foreign_mac: m }));
        }
        if h.now.is_multiple_of(50) && !h.m.holds_vips() {
            out.extend(h.probe(true));
        }
        if h.now.is_multiple_of(20) {
            out.extend(h.feed(Input::Tick));
        }
    }
    out
}

#[test]
fn of_two_holders_with_different_keys_the_lower_priority_one_gives_the_vips_up() {
    let mut b = holder(B);
    let out = run(&mut b, 6_000, Some(A), Some(MAC_A));
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Standby, Reason::UnverifiedPeer, 1)]);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert!(b.status().alarms.contains(&Alarm::KeyMismatch));
    // A keeps answering through the VIP: B stays a standby.
    let out = run(&mut b, 20_000, Some(A), None);
    assert!(adds(&out).is_empty(), "took the VIPs back: {:?}", role_changes(&out));
    assert_eq!(b.role(), Role::Standby);
}

#[test]
fn the_higher_priority_holder_keeps_the_vips() {
    let mut a = holder(A);
    let out = run(&mut a, 10_000, Some(B), Some(MAC_B));
    // While B is unverifiable, A probes for a foreign holder every 2 s.
    let probes = out.iter().filter(|x| matches!(x, Action::SelfCheck { conflict_probe: true })).count();
    assert_eq!(probes, 4, "conflict probes over 7 s: {probes}");
    assert!(role_changes(&out).is_empty(), "{:?}", role_changes(&out));
    assert!(removes(&out).is_empty());
    assert!(a.m.holds_vips());
    assert!(a.status().alarms.contains(&Alarm::VipConflict) && a.status().alarms.contains(&Alarm::KeyMismatch));
}

#[test]
fn one_signal_alone_moves_nothing() {
    // Unverifiable datagrams from A's address, no other MAC for the VIP: anybody can send
    // those; B keeps the VIPs (and says A is silent, with why).
    let mut b = holder(B);
    let out = run(&mut b, 10_000, Some(A), None);
    assert!(role_changes(&out).is_empty(), "{:?}", role_changes(&out));
    assert!(b.m.holds_vips());
    let st = b.status();
    assert!(st.alarms.contains(&Alarm::KeyMismatch) && st.alarms.contains(&Alarm::PeerSilent), "{:?}", st.alarms);
    // Another MAC answers, no datagram from A: a foreign host; B keeps the VIPs.
    let mut b = holder(B);
    let out = run(&mut b, 10_000, None, Some(MAC_A));
    assert!(role_changes(&out).is_empty(), "{:?}", role_changes(&out));
    assert!(b.m.holds_vips());
}
