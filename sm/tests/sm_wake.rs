//! When the machine asks for its next tick (`Machine::next_tick`): about once per
//! heartbeat when steady, every tick while anything is pending — a silent holder, a
//! planned handover, the Init listen.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod sm_support;

use havip_sm::*;
use sm_support::*;

const TICK: u64 = 20;
const INTERVAL: u64 = 100;

/// The next tick after one fed now, relative to now.
fn wait(h: &mut H) -> u64 {
    h.feed(Input::Tick);
    h.m.next_tick(Millis(h.now)).0 - h.now
}

#[test]
fn a_steady_standby_ticks_once_per_heartbeat_and_fast_once_its_holder_is_overdue() {
    let mut h = standby_b_hearing_a();
    let w = wait(&mut h);
    assert!(w > TICK && w <= INTERVAL, "a steady standby waits {w} ms");
    // The holder stops: by 120 ms after it was last heard the standby ticks fast.
    let heard = h.now;
    h.now = heard + INTERVAL + INTERVAL / 5 + 1;
    assert_eq!(wait(&mut h), TICK, "a standby whose holder is overdue ticks fast");
}

#[test]
fn a_steady_standby_never_sleeps_past_the_moment_its_holder_becomes_overdue() {
    let mut h = standby_b_hearing_a();
    // Just before the holder becomes overdue, the next tick is no later than that moment.
    let heard = h.now;
    h.now = heard + INTERVAL + 10;
    let due = h.m.next_tick(Millis(h.now)).0;
    let overdue = heard + INTERVAL + INTERVAL / 5;
    assert!(due <= overdue.max(h.now + TICK), "next tick at {due}, the holder is overdue at {overdue}");
    assert!(!h.m.holder_overdue(Millis(h.now)));
    assert!(h.m.holder_overdue(Millis(overdue + 1)), "the data-plane probes speed up once the holder is overdue");
}

#[test]
fn a_steady_active_ticks_once_per_heartbeat() {
    let mut h = active_a_with_b(1);
    let w = wait(&mut h);
    assert!(w > TICK && w <= INTERVAL, "a steady active waits {w} ms");
    // Its own heartbeat is the deadline: the tick comes when the next advert is due.
    let a = h.run(h.now + 1_000, &[standby(B, 100, 1)], None);
    assert!(adverts(&a).len() >= 9, "an active sends about ten heartbeats a second");
}

#[test]
fn a_planned_handover_ticks_fast_on_both_sides() {
    let mut h = active_a_with_b(1);
    h.cmd(Command::PlannedFailover { id: 7, target: None });
    assert_eq!(wait(&mut h), TICK, "the initiator of a handover ticks fast");

    let mut b = standby_b_hearing_a();
    let prepare = with_op(active(A, 200, 1), 7, OpKind::Prepare { to: node(B) });
    b.hear(&prepare);
    assert_eq!(wait(&mut b), TICK, "the target of a handover ticks fast");
}

#[test]
fn a_member_in_init_ticks_fast() {
    let mut h = H::new(pair(B), Persisted::default());
    h.env_ok();
    assert_eq!(h.role(), Role::Init);
    assert_eq!(wait(&mut h), TICK);
}

#[test]
fn hearing_the_holder_keeps_a_standby_steady() {
    let mut h = standby_b_hearing_a();
    h.feed(Input::Tick);
    let last_tick = h.now;
    for _ in 0..10 {
        h.now += 37;
        h.hear(&active(A, 200, 1));
        let due = h.m.next_tick(Millis(last_tick)).0;
        assert!(due > last_tick + TICK, "after hearing its holder at {}, the next tick is at {due}", h.now);
    }
}
