//! Standalone pairs with a witness (`Config::lease_vote_required`): a takeover needs the
//! witness's vote; while the witness does not answer nobody takes over; a holder the
//! standby sees renewing at the witness keeps the VIPs through a cut between the members.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod sm_support;

use havip_sm::*;
use sm_support::*;

/// Standby B of a pair with a witness that has heard A active for 2 s; the witness's
/// record names A under epoch 1. Time is 2000.
fn witnessed_standby() -> H {
    let mut cfg = pair(B);
    cfg.lease_vote_required = true;
    let mut h = H::new(cfg, Persisted::default());
    h.env_ok();
    h.lease(Some(A), 1);
    h.run(2_000, &[active(A, 200, 1)], Some(true));
    assert_eq!(h.role(), Role::Standby);
    h
}

#[test]
fn a_dead_holder_is_taken_over_with_the_witnesss_vote() {
    let mut h = witnessed_standby();
    // A falls silent at 2000 and its VIP stops answering: B claims at 2300.
    h.run(2_300, &[], Some(false));
    assert_eq!(cas_of(&h.since(2_000)), vec![(2, 1)], "one claim at the witness");
    assert!(!h.m.holds_vips(), "no VIPs before the vote");
    let out = h.cas(CasResult::Ok { epoch: 2 });
    assert_eq!(adds(&out).len(), 1, "the vote granted: the VIPs are taken");
    assert!(h.m.holds_vips());
}

#[test]
fn without_an_answer_from_the_witness_a_claim_is_abandoned_and_nobody_claims_again() {
    let mut h = witnessed_standby();
    h.run(2_300, &[], Some(false));
    assert_eq!(cas_of(&h.since(2_000)).len(), 1);
    let out = h.cas(CasResult::Unavailable);
    assert!(adds(&out).is_empty(), "no vote, no VIPs (Kubernetes mode would take them)");
    assert!(!h.m.holds_vips());
    assert_eq!(h.role(), Role::Standby);
    h.run(2_400, &[], Some(false));
    assert!(h.status().alarms.contains(&Alarm::WitnessUnreachable));
    // Long after: still no claim, no VIPs, the blocker says why.
    let later = h.run(10_000, &[], Some(false));
    assert!(cas_of(&later).is_empty(), "no claim while the witness is unreachable: {:?}", cas_of(&later));
    assert!(!h.m.holds_vips());
    assert_eq!(h.status().blocker, Some(Blocker::WitnessUnreachable));
    // The witness answers again (its record still names A at 1): B claims at once.
    let out = h.lease(Some(A), 1);
    let out2 = h.run(10_100, &[], Some(false));
    assert_eq!(cas_of(&[out, out2.clone()].concat()).len(), 1, "claims again once the witness answers");
    assert!(
        cleared(&out2).contains(&Alarm::WitnessUnreachable) || !h.status().alarms.contains(&Alarm::WitnessUnreachable)
    );
}

#[test]
fn a_witness_that_stops_answering_blocks_takeovers_and_raises_an_alarm_on_both_members() {
    let mut h = witnessed_standby();
    let mut out = h.feed(Input::LeaseUnreachable);
    out.extend(h.run(2_100, &[active(A, 200, 1)], Some(true)));
    assert!(raised(&out).contains(&Alarm::WitnessUnreachable));
    // A dies now: no takeover.
    let out = h.run(6_000, &[], Some(false));
    assert!(cas_of(&out).is_empty() && !h.m.holds_vips());
    assert_eq!(h.status().blocker, Some(Blocker::WitnessUnreachable));

    // The holder's side: it keeps the VIPs and raises the alarm.
    let mut cfg = pair(A);
    cfg.lease_vote_required = true;
    let mut a = H::new(cfg, Persisted { epoch: 1, last_role: Role::Active, ..Persisted::default() });
    a.env_links();
    a.local_vips(&[VIP]);
    a.lease(Some(A), 1);
    a.run(3_000, &[standby(B, 100, 1)], None);
    assert!(a.m.holds_vips());
    let mut out = a.feed(Input::LeaseUnreachable);
    out.extend(a.run(4_000, &[standby(B, 100, 1)], None));
    assert!(raised(&out).contains(&Alarm::WitnessUnreachable));
    assert!(removes(&out).is_empty() && a.m.holds_vips(), "the holder keeps the VIPs");
    let out = a.lease(Some(A), 1);
    let out2 = a.run(4_100, &[standby(B, 100, 1)], None);
    assert!(cleared(&[out, out2].concat()).contains(&Alarm::WitnessUnreachable));
}

#[test]
fn a_holder_renewing_at_the_witness_keeps_the_vips_through_a_cut_between_the_members() {
    let mut h = witnessed_standby();
    // Cut between the members from 2000; the VIP reads down from B's side; A renews at the
    // witness once a second after a heartbeat timeout.
    let mut out = h.run(2_320, &[], None);
    out.extend(h.feed(Input::LeaseRenewed { holder: node(A), epoch: 1 }));
    let mut t = 3_320;
    while t <= 9_320 {
        out.extend(h.run(t, &[], Some(false)));
        out.extend(h.feed(Input::LeaseRenewed { holder: node(A), epoch: 1 }));
        t += 1_000;
    }
    assert!(cas_of(&out).is_empty(), "no claim while the holder renews: {:?}", cas_of(&out));
    assert!(!h.m.holds_vips());
    assert_eq!(h.status().blocker, Some(Blocker::PeerAliveViaLease));
    assert!(h.status().alarms.contains(&Alarm::PeerPartition));
}

#[test]
fn without_a_witness_an_unreachable_store_changes_nothing() {
    // Kubernetes mode: an API server that does not answer never blocks a takeover.
    let mut h = standby_b_hearing_a();
    h.feed(Input::LeaseUnreachable);
    h.run(2_300, &[], Some(false));
    assert_eq!(cas_of(&h.since(2_000)).len(), 1);
    let out = h.cas(CasResult::Unavailable);
    assert_eq!(adds(&out).len(), 1, "takes the VIPs under its own epoch");
    assert!(!h.status().alarms.contains(&Alarm::WitnessUnreachable));
}

#[test]
fn a_claim_the_witness_refuses_because_it_hears_the_holder_is_given_up_and_not_repeated() {
    let mut h = witnessed_standby();
    h.run(2_300, &[], Some(false));
    assert_eq!(cas_of(&h.since(2_000)), vec![(2, 1)]);
    let out = h.cas(CasResult::HolderAlive { holder: node(A), epoch: 1 });
    assert!(adds(&out).is_empty() && !h.m.holds_vips());
    assert_eq!(h.role(), Role::Standby);
    assert_eq!(h.status().blocker, Some(Blocker::LeaseConflictBackoff), "a heartbeat timeout of back-off");
    // The holder is alive: it renews at the witness once a second from now on, and B never
    // claims again meanwhile.
    let mut later = Vec::new();
    for t in (2_350..=8_350).step_by(1_000) {
        later.extend(h.run(t, &[], Some(false)));
        later.extend(h.feed(Input::LeaseRenewed { holder: node(A), epoch: 1 }));
    }
    assert!(cas_of(&later).is_empty(), "claimed again: {:?}", cas_of(&later));
    assert_eq!(h.status().blocker, Some(Blocker::PeerAliveViaLease));
    assert!(h.status().alarms.contains(&Alarm::PeerPartition));
}

#[test]
fn a_claim_refused_just_as_the_holder_died_is_retried_after_a_heartbeat_timeout() {
    // The witness heard A's last read after the last heartbeat B heard: it refuses B's
    // first claim. A is dead and renews nothing: B claims again after its back-off.
    let mut h = witnessed_standby();
    h.run(2_300, &[], Some(false));
    h.cas(CasResult::HolderAlive { holder: node(A), epoch: 1 });
    let out = h.run(2_700, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(3, 1)], "a second claim under a fresh epoch");
    let at = h.first_at(|x| matches!(x, Action::CasLease { new_epoch: 3, .. })).unwrap();
    assert!((2_600..=2_640).contains(&at), "claimed again at {at}");
    let out = h.cas(CasResult::Ok { epoch: 3 });
    assert_eq!(adds(&out).len(), 1);
}

#[test]
fn a_holders_reconciling_write_refused_because_another_holds_is_not_repeated_at_once() {
    // A holds under epoch 1; the record names B under the same epoch (a handover's
    // target, or the other side of a partition) while the witness hears B holding: A's
    // reconciling write is refused. Retried at once, it would spin for as long as both
    // hold (seen: eight writes in 10 ms during a handover); A waits a heartbeat interval.
    let mut cfg = pair(A);
    cfg.lease_vote_required = true;
    let interval = cfg.timings.heartbeat_interval_ms;
    let mut a = H::new(cfg, Persisted { epoch: 1, last_role: Role::Active, ..Persisted::default() });
    a.env_links();
    a.local_vips(&[VIP]);
    a.lease(Some(A), 1);
    a.run(3_000, &[standby(B, 100, 1)], None);
    assert!(a.m.holds_vips());
    let out = a.lease(Some(B), 1);
    let first = cas_of(&out);
    assert_eq!(first.len(), 1, "A reconciles the record: {first:?}");
    let out = a.cas(CasResult::HolderAlive { holder: node(B), epoch: 1 });
    assert!(cas_of(&out).is_empty(), "written again at once: {:?}", cas_of(&out));
    let out = a.lease(Some(B), 1);
    assert!(cas_of(&out).is_empty(), "written again at the next observation: {:?}", cas_of(&out));
    a.run(3_000 + interval, &[standby(B, 100, 1)], None);
    let out = a.lease(Some(B), 1);
    assert_eq!(cas_of(&out).len(), 1, "written again after a heartbeat interval");
}
