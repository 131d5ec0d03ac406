//! A partition between the members while both reach the Lease store, and Lease writes
//! that land after their sender gave up: the Lease settles who holds the VIPs.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod sm_support;

use havip_sm::*;
use sm_support::*;

fn renewals(a: &[Action]) -> Vec<u64> {
    a.iter()
        .filter_map(|x| match x {
            Action::RenewLease { epoch, .. } => Some(*epoch),
            _ => None,
        })
        .collect()
}

/// B cannot hear A from 2000 on and the data plane through the VIP reads down from its
/// side (the partition), while A renews the Lease every second until `until`.
fn partitioned_standby_with_renewals(h: &mut H, from: u64, until: u64) -> Vec<Action> {
    // A's first renewal comes once A too found B silent (a heartbeat timeout); B's probe
    // through the VIP has not failed long enough yet then.
    let mut out = h.run(2_320, &[], None);
    out.extend(h.feed(Input::LeaseRenewed { holder: node(A), epoch: 1 }));
    let mut t = from;
    while t <= until {
        out.extend(h.run(t, &[], Some(false)));
        out.extend(h.feed(Input::LeaseRenewed { holder: node(A), epoch: 1 }));
        t += 1_000;
    }
    out
}

#[test]
fn a_standby_does_not_take_the_vips_from_a_holder_that_renews_the_lease() {
    let mut h = standby_b_hearing_a();
    let out = partitioned_standby_with_renewals(&mut h, 3_320, 7_320);
    let more = h.run(7_500, &[], Some(false));
    assert!(cas_of(&out).is_empty() && cas_of(&more).is_empty(), "no claim while the holder renews");
    assert_eq!(h.role(), Role::Standby);
    assert_eq!(h.status().blocker, Some(Blocker::PeerAliveViaLease));
    assert!(raised(&out).contains(&Alarm::PeerPartition), "{:?}", raised(&out));
    assert!(h.status().alarms.contains(&Alarm::PeerPartition));

    // A stops renewing (it died, or wants out): B takes over once the last renewal is
    // older than lease_alive_ms (3 s), not before.
    let out = h.run(11_000, &[], Some(false));
    let claim = h.first_at(|x| matches!(x, Action::CasLease { .. })).expect("a claim after the renewals stopped");
    assert!((10_320..=10_400).contains(&claim), "claimed at {claim}");
    assert_eq!(cas_of(&out), vec![(2, 1)]);
    assert!(cleared(&out).contains(&Alarm::PeerPartition));
}

#[test]
fn the_lease_holder_heard_again_clears_the_partition_alarm() {
    let mut h = standby_b_hearing_a();
    partitioned_standby_with_renewals(&mut h, 3_320, 3_320);
    assert!(h.status().alarms.contains(&Alarm::PeerPartition));
    let out = h.run(3_600, &[active(A, 200, 1)], Some(false));
    assert!(cleared(&out).contains(&Alarm::PeerPartition), "{:?}", cleared(&out));
    assert_eq!(h.role(), Role::Standby);
}

#[test]
fn a_holder_renews_the_lease_once_a_second_only_while_a_peer_is_silent_and_it_can_serve() {
    let mut h = active_a_with_b(1);
    let out = h.run(3_000 + 200, &[], None);
    assert!(renewals(&out).is_empty(), "the peer is still heard");
    // B silent from 3000 (last advert at 3000): renewals after the heartbeat timeout,
    // once a second.
    let out = h.run(6_000, &[], None);
    assert_eq!(renewals(&out), vec![1, 1, 1]);
    let first = h.first_at(|x| matches!(x, Action::RenewLease { .. })).unwrap();
    assert!((3_300..=3_320).contains(&first), "first renewal at {first}");
    assert!(h.m.holds_vips());

    // B heard again: no more renewals.
    let out = h.run(8_000, &[standby(B, 100, 1)], None);
    assert!(renewals(&out).len() <= 1, "at most the one due as B came back");
    let out = h.run(10_000, &[standby(B, 100, 1)], None);
    assert!(renewals(&out).is_empty());

    // Silent again, and its listener goes down: it renews until the listener has been
    // down for listener_down_ms (the point where it would hand over), then stops, so
    // that the peer it cannot reach may take the VIPs.
    h.listeners(false);
    let out = h.run(20_000, &[], None);
    assert!(!renewals(&out).is_empty());
    let out = h.run(25_000, &[], None);
    assert!(renewals(&out).is_empty(), "an unfit holder does not renew");
    assert!(h.m.holds_vips(), "nobody can take them: it keeps them (VipUnhealthy)");
}

#[test]
fn a_lease_claim_that_landed_after_its_sender_gave_up_is_taken_back() {
    let mut h = active_a_with_b(1);
    // B's claim timed out, B gave it up and is a standby again; then the write landed.
    let out = h.lease(Some(B), 2);
    assert!(removes(&out).is_empty(), "B's adverts predate the Lease: wait");
    assert!(h.m.holds_vips());
    // B saw the Lease too (its adverts now carry epoch 2) and still acts as a standby.
    let out = h.run(3_200, &[standby(B, 100, 2)], None);
    assert!(removes(&out).is_empty(), "{out:?}");
    assert_eq!(cas_of(&out), vec![(3, 2)], "A takes the Lease back under a fresh epoch");
    let out = h.cas(CasResult::Ok { epoch: 3 });
    assert!(removes(&out).is_empty());
    assert!(h.m.holds_vips());
    assert_eq!(h.role(), Role::Active);
}

#[test]
fn a_late_lease_claim_whose_sender_never_learns_of_it_is_taken_back_after_a_heartbeat_timeout() {
    let mut h = active_a_with_b(1);
    h.lease(Some(B), 2);
    // B's watch is behind: its adverts keep saying standby under epoch 1.
    let out = h.run(3_200, &[standby(B, 100, 1)], None);
    assert!(cas_of(&out).is_empty(), "within the heartbeat timeout: wait");
    let out = h.run(3_500, &[standby(B, 100, 1)], None);
    assert_eq!(cas_of(&out), vec![(3, 2)]);
    assert!(removes(&out).is_empty());
    assert!(h.m.holds_vips());
}

#[test]
fn a_newer_lease_whose_holder_acts_on_it_still_demotes_at_once() {
    let mut h = active_a_with_b(1);
    // B took the pair (it claims: Active, not holding yet), the Lease names it.
    h.hear(&adv(B, 100, Role::Active, 2, false));
    let out = h.lease(Some(B), 2);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Standby, Reason::NewerEpochLease, 2)]);
}

#[test]
fn a_newer_lease_naming_an_unheard_peer_demotes_at_once() {
    let mut h = active_a_with_b(1);
    h.run(3_500, &[], None);
    let out = h.lease(Some(B), 2);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
}

#[test]
fn renewals_seen_while_the_holder_was_still_heard_do_not_delay_its_takeover() {
    // Three members: A renews because C is silent, while B still hears A. Then A dies:
    // B takes over at once — those renewals say nothing about A after it fell silent.
    let mut h = H::new(config(B, &[(A, 200), (B, 100), (C, 50)]), Persisted::default());
    h.env_ok();
    h.lease(Some(A), 1);
    h.run(1_500, &[active(A, 200, 1), standby(C, 50, 1)], Some(true));
    let mut t = 1_600;
    while t < 3_000 {
        h.run(t, &[active(A, 200, 1)], Some(true));
        h.feed(Input::LeaseRenewed { holder: node(A), epoch: 1 });
        t += 500;
    }
    h.run(3_000, &[active(A, 200, 1)], Some(true));
    assert_eq!(h.role(), Role::Standby);
    // A dies at 3000 (its renewal at 2900 was seen while B heard it).
    h.run(3_400, &[], Some(false));
    let claim = h.first_at(|x| matches!(x, Action::CasLease { .. })).expect("a claim");
    assert!(claim <= 3_350, "claimed at {claim}: not delayed by the renewals");
}
