//! Draining planned moves: the old holder keeps the VIPs for its established connections
//! (and says so only once the I/O layer keeps them), the new holder forwards to it while
//! it hears it say so; the drain ends at its deadline, when the VIPs come back, or on a
//! new configuration; safety handovers and unplanned takeovers never drain.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod sm_support;

use havip_sm::*;
use sm_support::*;

/// Active A hands over to B (operator planned failover, id 7); returns the actions of the
/// confirm step.
fn hand_over(h: &mut H) -> Vec<Action> {
    h.now = 3_010;
    h.cmd(Command::PlannedFailover { id: 7, target: Some(node(B)) });
    h.now = 3_015;
    h.hear(&with_op(standby(B, 100, 3), 7, OpKind::PrepareAck));
    h.now = 3_020;
    h.hear(&with_op(active(B, 100, 4), 7, OpKind::Confirm))
}

fn drain_events(a: &[Action]) -> Vec<bool> {
    a.iter()
        .filter_map(|x| match x {
            Action::Report(Event::Drain { started, .. }) => Some(*started),
            _ => None,
        })
        .collect()
}

fn forwards(a: &[Action]) -> Vec<Option<NodeId>> {
    a.iter()
        .filter_map(|x| match x {
            Action::Forward { to } => Some(to.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_old_holder_says_it_drains_from_its_commit_and_keeps_the_vips_until_the_deadline() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    h.cmd(Command::PlannedFailover { id: 7, target: Some(node(B)) });
    h.now = 3_015;
    let out = h.hear(&with_op(standby(B, 100, 3), 7, OpKind::PrepareAck));
    // Committed, still holding: the target may forward to it from now on.
    let a = last_advert(&out);
    assert!(a.draining && a.holds_vips, "{a:?}");
    h.now = 3_020;
    let out = h.hear(&with_op(active(B, 100, 4), 7, OpKind::Confirm));
    assert_eq!(drains(&out), vec![(vec![vip(VIP)], node(B))]);
    assert!(removes(&out).is_empty());
    assert!(!h.m.holds_vips());
    let a = last_advert(&out);
    assert!(a.draining && !a.holds_vips, "{a:?}");
    let out = h.feed(Input::DrainStarted { ok: true, detail: String::new() });
    assert_eq!(drain_events(&out), vec![true]);
    assert_eq!(h.status().draining, Some((node(B), Millis(3_020 + 5_000))));
    // Draining until the deadline, then removed.
    let out = h.run(8_000, &[active(B, 100, 4)], Some(true));
    assert!(removes(&out).is_empty() && adverts(&out).iter().all(|a| a.draining));
    let out = h.run(8_100, &[active(B, 100, 4)], Some(true));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(drain_events(&out), vec![false]);
    assert!(!last_advert(&out).draining);
    assert_eq!(h.status().draining, None);
}

#[test]
fn the_target_forwards_before_it_adds_the_vips_when_the_initiator_drains() {
    let mut h = standby_b_hearing_a();
    let prepare = with_op(active(A, 200, 1), 7, OpKind::Prepare { to: node(B) });
    h.hear(&prepare);
    let commit = Advert { draining: true, ..with_op(active(A, 200, 1), 7, OpKind::Commit { to: node(B), epoch: 2 }) };
    let out = h.hear(&commit);
    let fwd = out.iter().position(|a| matches!(a, Action::Forward { to: Some(n) } if *n == node(A)));
    let add = out.iter().position(|a| matches!(a, Action::AddVips(_)));
    assert!(fwd.is_some() && add.is_some() && fwd < add, "forward first, then add: {out:?}");
    // No probe for a foreign holder: the old holder still holds the VIPs, and its answer
    // to an IPv6 probe from `::` goes to all nodes.
    assert!(out.contains(&Action::SelfCheck { conflict_probe: false }), "{out:?}");
    // An initiator that does not drain (a safety handover) is not forwarded to.
    let mut h = standby_b_hearing_a();
    h.hear(&prepare);
    let out = h.hear(&with_op(active(A, 200, 1), 7, OpKind::Commit { to: node(B), epoch: 2 }));
    assert!(adds(&out).len() == 1 && forwards(&out).is_empty(), "{out:?}");
}

#[test]
fn a_drain_the_io_layer_could_not_keep_stops_being_announced_at_once() {
    let mut h = active_a_with_b(3);
    hand_over(&mut h);
    let out = h.feed(Input::DrainStarted { ok: false, detail: "no address".into() });
    assert_eq!(drain_events(&out), vec![false]);
    assert!(!last_advert(&out).draining, "the new holder must stop forwarding at once");
    let out = h.run(4_000, &[active(B, 100, 4)], Some(true));
    assert!(adverts(&out).iter().all(|a| !a.draining));
    // The I/O layer removed the VIPs itself: nothing more to remove at the old deadline.
    let out = h.run(9_000, &[active(B, 100, 4)], Some(true));
    assert!(removes(&out).is_empty());
}

#[test]
fn draining_off_removes_at_once() {
    let mut cfg = pair(A);
    cfg.timings.drain_ms = 0;
    let mut h = H::new(cfg, Persisted { epoch: 3, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP]);
    h.lease(Some(A), 3);
    h.run(3_000, &[standby(B, 100, 3)], None);
    let out = hand_over(&mut h);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert!(drains(&out).is_empty());
}

#[test]
fn taking_the_vips_back_ends_the_drain_without_a_removal() {
    let mut h = active_a_with_b(3);
    hand_over(&mut h);
    h.feed(Input::DrainStarted { ok: true, detail: String::new() });
    h.run(4_000, &[active(B, 100, 4)], Some(true));
    // B dies: A takes over by the usual rules (after the hold-down), the drain ends.
    let out = h.run(9_000, &[], Some(false));
    assert_eq!(adds(&out), vec![vec![vip(VIP)]], "A took the VIPs back");
    let add_at = out.iter().position(|a| matches!(a, Action::AddVips(_))).unwrap();
    assert!(
        !out[..add_at].iter().any(|a| matches!(a, Action::RemoveVips(_))),
        "the drained VIPs are taken back, not removed first"
    );
    assert!(drain_events(&out).contains(&false));
    assert!(!last_advert(&out).draining && last_advert(&out).holds_vips);
}

#[test]
fn a_safety_handover_does_not_drain() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.carrier(false);
    let (id, _) = first_prepare(&out).expect("hands over on carrier loss");
    let out = complete_handover(&mut h, id);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert!(drains(&out).is_empty());
}

#[test]
fn the_new_holder_forwards_while_it_hears_the_old_one_drain() {
    let mut h = active_a_with_b(3);
    let draining_b = Advert { draining: true, ..standby(B, 100, 3) };
    let out = h.hear(&draining_b);
    assert_eq!(forwards(&out), vec![Some(node(B))]);
    assert_eq!(h.status().forwarding_to, Some(node(B)));
    // Still draining: nothing new.
    let out = h.run(3_500, std::slice::from_ref(&draining_b), None);
    assert!(forwards(&out).is_empty());
    // The drain ends: forwarding stops.
    let out = h.run(3_700, &[standby(B, 100, 3)], None);
    assert_eq!(forwards(&out), vec![None]);
    // Again, and then the old holder falls silent.
    h.hear(&draining_b);
    let out = h.run(4_500, &[], None);
    assert_eq!(forwards(&out), vec![None], "a silent old holder is not forwarded to");
}

#[test]
fn a_standby_never_forwards() {
    let mut h = standby_b_hearing_a();
    let out = h.run(2_500, &[Advert { draining: true, ..active(A, 200, 1) }], Some(true));
    assert!(forwards(&out).is_empty());
}

#[test]
fn a_new_configuration_ends_the_drain() {
    let mut h = active_a_with_b(3);
    hand_over(&mut h);
    h.feed(Input::DrainStarted { ok: true, detail: String::new() });
    let mut cfg = pair(A);
    cfg.config_revision = 99;
    let out = h.feed(Input::ConfigChanged(Box::new(cfg)));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(drain_events(&out), vec![false]);
}

#[test]
fn a_stopping_old_holder_ends_its_drain_and_says_so_in_a_last_heartbeat_at_once() {
    let mut h = active_a_with_b(3);
    hand_over(&mut h);
    h.feed(Input::DrainStarted { ok: true, detail: String::new() });
    let out = h.run(4_000, &[active(B, 100, 4)], Some(true));
    assert!(adverts(&out).iter().all(|a| a.draining));
    // Mid-drain (the deadline is 8_020), between two heartbeats: the agent stops.
    h.now = 4_010;
    let out = h.feed(Input::Stopping);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]], "the drained VIPs leave lo");
    assert_eq!(drain_events(&out), vec![false]);
    let last = adverts(&out);
    assert!(!last.is_empty(), "a heartbeat in this very step: {out:?}");
    assert!(last.iter().all(|a| !a.draining && !a.holds_vips), "{last:?}");
    assert_eq!(h.status().draining, None);
    // Nothing of the drain comes back, even for a heartbeat step before the exit.
    let out = h.run(4_300, &[active(B, 100, 4)], Some(true));
    assert!(adverts(&out).iter().all(|a| !a.draining) && removes(&out).is_empty());
}

#[test]
fn a_stopping_old_holder_in_a_committed_handover_no_longer_says_it_drains() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    h.cmd(Command::PlannedFailover { id: 7, target: Some(node(B)) });
    h.now = 3_015;
    let out = h.hear(&with_op(standby(B, 100, 3), 7, OpKind::PrepareAck));
    assert!(last_advert(&out).draining, "committed: the target may forward to it");
    let out = h.feed(Input::Stopping);
    assert!(!last_advert(&out).draining, "{out:?}");
}

#[test]
fn a_stopping_new_holder_stops_forwarding_whatever_it_hears() {
    let mut h = active_a_with_b(3);
    let draining_b = Advert { draining: true, ..standby(B, 100, 3) };
    assert_eq!(forwards(&h.hear(&draining_b)), vec![Some(node(B))]);
    let out = h.feed(Input::Stopping);
    assert_eq!(forwards(&out), vec![None]);
    assert!(removes(&out).is_empty(), "the new holder keeps its VIPs");
    assert_eq!(h.status().forwarding_to, None);
    let out = h.hear(&draining_b);
    assert!(forwards(&out).is_empty(), "not forwarding again: {out:?}");
}
