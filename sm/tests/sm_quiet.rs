//! The quiet standby (`Timings::quiet_interval_ms`): a standby that hears an active holder
//! declaring its interval sends every quiet interval instead of every heartbeat interval,
//! and at once when what it says changes; the holder hears it for its declared timeout;
//! a member of an earlier release (no declared interval) sees no change.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod sm_support;

use havip_sm::*;
use sm_support::*;

const QUIET: u64 = 500;

/// An advert of an agent of this release: it declares its interval.
fn declaring(a: Advert, interval_ms: u32) -> Advert {
    Advert { interval_ms, ..a }
}

/// Standby B hearing A active and declaring 100 ms, for 2 s. Time is 2000.
fn quiet_b() -> H {
    let mut h = H::new(pair(B), Persisted::default());
    h.env_ok();
    h.lease(Some(A), 1);
    h.run(2_000, &[declaring(active(A, 200, 1), 100)], Some(true));
    assert_eq!(h.role(), Role::Standby);
    h
}

#[test]
fn a_standby_hearing_a_declaring_holder_sends_every_quiet_interval_and_says_so() {
    let mut h = quiet_b();
    let t = h.now;
    h.run(t + 2_000, &[declaring(active(A, 200, 1), 100)], Some(true));
    let sent = adverts(&h.since(t + 1));
    assert!((3..=5).contains(&sent.len()), "{} adverts in 2 s", sent.len());
    assert!(sent.iter().all(|a| u64::from(a.interval_ms) == QUIET), "{sent:?}");
    assert!(h.m.quiet(Millis(h.now)));
}

#[test]
fn a_standby_hearing_a_holder_of_an_earlier_release_sends_every_heartbeat_interval() {
    let mut h = standby_b_hearing_a();
    let t = h.now;
    h.run(t + 1_000, &[active(A, 200, 1)], Some(true));
    let sent = adverts(&h.since(t + 1));
    assert!(sent.len() >= 9, "{} adverts in 1 s", sent.len());
    assert!(sent.iter().all(|a| a.interval_ms == 100), "it declares its own interval");
    assert!(!h.m.quiet(Millis(h.now)));
}

#[test]
fn a_quiet_standby_sends_at_once_when_what_it_says_changes() {
    let mut h = quiet_b();
    // Let the quiet interval start afresh, then a listener goes down in the middle of it.
    let t = h.now;
    h.run(t + 600, &[declaring(active(A, 200, 1), 100)], Some(true));
    let before = adverts(&h.since(t + 1)).len();
    let out = h.listeners(false);
    let sent = adverts(&out);
    assert_eq!(sent.len(), 1, "the change goes out in the same step ({before} before)");
    assert!(!sent[0].ready_all);
    // Nothing more until the next point of the quiet grid (multiples of 500 ms of the
    // machine's clock: an advert sent off the grid brings the next one forward).
    let t = h.now;
    let next = (t / QUIET + 1) * QUIET;
    let out = h.run(next - 10, &[declaring(active(A, 200, 1), 100)], Some(true));
    assert!(adverts(&out).is_empty(), "{:?}", adverts(&out));
    let out = h.run(next + 10, &[declaring(active(A, 200, 1), 100)], Some(true));
    assert_eq!(adverts(&out).len(), 1, "on the grid at {next}");
}

#[test]
fn a_quiet_standby_sends_every_heartbeat_interval_once_its_holder_is_overdue() {
    let mut h = quiet_b();
    let t = h.now;
    // A falls silent: 120 ms after it was last heard B is no longer quiet and tells it at
    // once (interval 100), then every heartbeat interval.
    let out = h.run(t + 400, &[], Some(true));
    let sent = adverts(&out);
    assert!(sent.len() >= 2, "{} adverts after the holder fell silent", sent.len());
    assert!(sent.iter().all(|a| a.interval_ms == 100), "{sent:?}");
    let first = h.log.iter().find(|(at, a)| *at > t && matches!(a, Action::SendAdvert(_))).map(|(at, _)| *at);
    assert!(first.is_some_and(|f| f <= t + 140), "the first fast advert at {first:?} (holder last heard at {t})");
}

#[test]
fn a_standby_in_a_handover_is_never_quiet() {
    let mut h = quiet_b();
    let prepare = with_op(declaring(active(A, 200, 1), 100), 7, OpKind::Prepare { to: node(B) });
    let t = h.now;
    let out = h.run(t + 300, &[prepare], Some(true));
    let sent = adverts(&out);
    assert!(sent.iter().any(|a| matches!(a.op, Some(OpMsg { kind: OpKind::PrepareAck, .. }))), "{sent:?}");
    assert!(sent.len() >= 3, "every heartbeat interval while it acks: {}", sent.len());
    assert!(sent.iter().all(|a| a.interval_ms == 100));
}

#[test]
fn a_holder_hears_a_quiet_standby_for_its_declared_timeout_and_no_longer() {
    let mut h = active_a_with_b(1);
    let b = declaring(standby(B, 100, 1), QUIET as u32);
    h.hear(&b);
    let heard = h.now;
    // 1 s of silence: a quiet standby's next heartbeat is due within 0.5 s and its timeout
    // is 1.5 s — still heard, no alarm, no Lease renewal.
    h.run(heard + 1_000, &[], None);
    assert!(!h.status().alarms.contains(&Alarm::PeerSilent));
    assert!(h.status().peers[0].heard_paths.len() == 2, "{:?}", h.status().peers);
    assert!(!h.since(heard + 1).iter().any(|a| matches!(a, Action::RenewLease { .. })));
    // Past 1.5 s it is silent.
    h.run(heard + 1_600, &[], None);
    assert!(h.status().alarms.contains(&Alarm::PeerSilent));
    assert!(h.since(heard + 1).iter().any(|a| matches!(a, Action::RenewLease { .. })));
}

#[test]
fn a_declared_interval_beyond_the_receivers_own_quiet_interval_is_not_believed() {
    let mut h = active_a_with_b(1);
    let b = declaring(standby(B, 100, 1), 60_000);
    h.hear(&b);
    let heard = h.now;
    h.run(heard + 1_600, &[], None);
    assert!(h.status().alarms.contains(&Alarm::PeerSilent), "silent after 1.5 s, whatever it declared");
}

#[test]
fn a_holder_yields_to_a_lease_claimed_by_a_quiet_standby_it_heard_half_a_second_ago() {
    let mut h = active_a_with_b(1);
    h.hear(&declaring(standby(B, 100, 1), QUIET as u32));
    let heard = h.now;
    // B, partitioned from A since, took over and wrote the Lease: A still counts B as heard
    // (its quiet timeout), but its last advert is too old to say B did not claim.
    h.now = heard + 400;
    h.lease(Some(B), 2);
    h.run(heard + 500, &[], None);
    assert!(!h.m.holds_vips(), "A gave the VIPs up to the newer Lease");
    assert!(cas_of(&h.since(heard)).is_empty(), "A did not take the Lease back: {:?}", cas_of(&h.since(heard)));
}

#[test]
fn a_planned_failover_to_a_quiet_standby_commits_when_its_ack_comes_on_one_path() {
    let mut h = active_a_with_b(1);
    let b = declaring(standby(B, 100, 1), QUIET as u32);
    let t = h.now;
    for k in 0..4 {
        h.now = t + k * QUIET;
        h.hear(&b);
        h.feed(Input::Tick);
    }
    h.now += 300;
    h.feed(Input::Tick);
    let out = h.cmd(Command::PlannedFailover { id: 1, target: None });
    assert!(results(&out).is_empty(), "{:?}", results(&out));
    let (op, _) = first_prepare(&out).expect("a prepare");
    // B acks at once, no longer quiet (interval 100), heard first on one path: its other
    // path's last heartbeat is a quiet one from 300 ms ago, which still counts (1.5 s) —
    // the commit goes out (the BGP suite's planned moves were refused here).
    h.now += 5;
    let ack = with_op(declaring(standby(B, 100, 1), 100), op, OpKind::PrepareAck);
    let out = h.hear_on(0, &ack);
    assert!(results(&out).is_empty(), "{:?}", results(&out));
    assert!(last_commit(&out).is_some(), "{out:?}");
}

#[test]
fn routine_adverts_go_out_on_the_grid_of_the_machines_clock() {
    // Started at an odd moment: its heartbeats still fall on multiples of the interval (the
    // pairs of one agent share the clock's origin, so they send in one wakeup, bundled).
    let mut h = H::new(pair(A), Persisted { epoch: 1, last_role: Role::Active, ..Persisted::default() });
    h.now = 1_230;
    h.env_links();
    h.local_vips(&[VIP]);
    h.lease(Some(A), 1);
    h.run(4_000, &[standby(B, 100, 1)], None);
    let times: Vec<u64> =
        h.log.iter().filter(|(at, a)| *at > 3_000 && matches!(a, Action::SendAdvert(_))).map(|(at, _)| *at).collect();
    assert!(times.len() >= 9, "{times:?}");
    assert!(times.iter().all(|t| t % 100 == 0), "on the 100 ms grid: {times:?}");
}
