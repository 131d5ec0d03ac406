//! Quorum fencing (`Config::quorum_lease_ms`, the control-plane mode): the store is a
//! majority of the members' votes, and a holder keeps the VIPs only while a majority
//! confirms it (`Input::LeaseConfirmed`) within the quorum lease; the minority side of a
//! partition stops serving by itself.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod sm_support;

use havip_sm::*;
use sm_support::*;

const LEASE: u64 = 400;

fn quorum_cfg(local: &str) -> Config {
    let mut cfg = pair(local);
    cfg.lease_vote_required = true;
    cfg.quorum_lease_ms = Some(LEASE);
    cfg
}

/// Active A (epoch 1) hearing standby B, confirmed by the votes every 100 ms until 3000.
fn confirmed_holder() -> H {
    let mut a = H::new(quorum_cfg(A), Persisted { epoch: 1, last_role: Role::Active, ..Persisted::default() });
    a.env_links();
    a.local_vips(&[VIP]);
    a.lease(Some(A), 1);
    while a.now < 3_000 {
        let at = Millis(a.now);
        a.feed(Input::LeaseConfirmed { at });
        let until = a.now + 100;
        a.run(until, &[standby(B, 100, 1)], None);
    }
    assert!(a.m.holds_vips(), "confirmed every 100 ms, A holds: {:?}", a.status());
    a
}

#[test]
fn a_holder_confirmed_by_the_votes_keeps_the_vips() {
    let mut a = confirmed_holder();
    let out = a.run(3_050, &[standby(B, 100, 1)], None);
    assert!(removes(&out).is_empty());
    assert_eq!(a.role(), Role::Active);
}

#[test]
fn a_holder_without_a_majority_gives_the_vips_up_within_the_lease() {
    let mut a = confirmed_holder();
    // The last confirmation covers 2900 (fed at 2900); no more from now on: the lease ends at 3300.
    let out = a.run(3_280, &[standby(B, 100, 1)], None);
    assert!(removes(&out).is_empty(), "still within the lease");
    let out = a.run(3_400, &[standby(B, 100, 1)], None);
    let changes = role_changes(&out);
    assert_eq!(removes(&out).len(), 1, "gave the VIPs up: {changes:?}");
    assert!(changes.iter().any(|c| c.2 == Reason::QuorumLost), "{changes:?}");
    let removed_at = a.first_at(|x| matches!(x, Action::RemoveVips(_))).unwrap();
    assert!((3_300..=3_320).contains(&removed_at), "at the lease's end, not later: {removed_at}");
    assert!(!a.m.holds_vips());
    // Without the votes it takes nothing back, even with nobody holding.
    let out = a.run(6_000, &[standby(B, 100, 2)], Some(false));
    assert!(adds(&out).is_empty() && !a.m.holds_vips());
}

#[test]
fn a_confirmation_that_predates_the_last_one_extends_nothing() {
    let mut a = confirmed_holder();
    // A late answer of an old round: its proof is older than the lease already covers.
    a.feed(Input::LeaseConfirmed { at: Millis(1_000) });
    let out = a.run(3_400, &[standby(B, 100, 1)], None);
    assert_eq!(removes(&out).len(), 1, "the lease still ends 400 ms after the newest proof");
}

#[test]
fn without_quorum_fencing_a_holder_that_hears_nothing_from_the_votes_keeps_the_vips() {
    // The control: a witness pair without a quorum lease keeps serving (havip prefers
    // serving over an empty VIP when nothing else holds it).
    let mut cfg = pair(A);
    cfg.lease_vote_required = true;
    let mut a = H::new(cfg, Persisted { epoch: 1, last_role: Role::Active, ..Persisted::default() });
    a.env_links();
    a.local_vips(&[VIP]);
    a.lease(Some(A), 1);
    let out = a.run(6_000, &[standby(B, 100, 1)], None);
    assert!(removes(&out).is_empty());
    assert!(a.m.holds_vips());
}

#[test]
fn a_restarted_holder_adopts_the_vips_only_while_the_votes_confirm_it() {
    // Confirmed during the init listen: adopts and keeps them.
    let mut a = H::new(quorum_cfg(A), Persisted { epoch: 1, last_role: Role::Active, ..Persisted::default() });
    a.env_links();
    a.local_vips(&[VIP]);
    while a.now < 2_000 {
        let at = Millis(a.now);
        a.feed(Input::LeaseConfirmed { at });
        let until = a.now + 100;
        a.run(until, &[standby(B, 100, 1)], None);
    }
    assert!(a.m.holds_vips() && a.role() == Role::Active, "{:?}", a.status());
    assert!(removes(&a.since(0)).is_empty(), "no gap for a confirmed restart");

    // Not confirmed (it restarted on the minority side): it gives them up within a lease
    // of its start, while still listening.
    let mut b = H::new(quorum_cfg(A), Persisted { epoch: 1, last_role: Role::Active, ..Persisted::default() });
    b.env_links();
    b.local_vips(&[VIP]);
    let out = b.run(2_000, &[], None);
    let at = b.first_at(|x| matches!(x, Action::RemoveVips(_))).unwrap();
    assert!(at <= LEASE + 20, "gave them up {at} ms after its start: {:?}", role_changes(&out));
    assert!(!b.m.holds_vips());
}

#[test]
fn a_takeover_granted_by_the_votes_holds_on_the_confirmation_that_came_with_the_grant() {
    let mut b = H::new(quorum_cfg(B), Persisted::default());
    b.env_ok();
    b.lease(Some(A), 1);
    b.run(2_000, &[active(A, 200, 1)], Some(true));
    b.run(2_300, &[], Some(false));
    assert_eq!(cas_of(&b.since(2_000)).len(), 1, "claims once A is silent and the VIP down");
    let at = Millis(b.now - 5);
    b.feed(Input::LeaseConfirmed { at });
    let out = b.cas(CasResult::Ok { epoch: 2 });
    assert_eq!(adds(&out).len(), 1);
    // Confirmed by its reads afterwards: keeps them.
    while b.now < 4_000 {
        let at = Millis(b.now);
        b.feed(Input::LeaseConfirmed { at });
        let until = b.now + 100;
        b.run(until, &[], Some(true));
    }
    assert!(b.m.holds_vips());
}

#[test]
fn a_quorum_lease_without_votes_is_refused() {
    let mut cfg = pair(A);
    cfg.quorum_lease_ms = Some(LEASE);
    assert!(cfg.validate().is_err(), "quorum fencing needs takeovers that need a vote");
    let mut cfg = quorum_cfg(A);
    cfg.quorum_lease_ms = Some(50);
    assert!(cfg.validate().is_err(), "a lease shorter than a heartbeat interval");
    assert!(quorum_cfg(A).validate().is_ok());
}
