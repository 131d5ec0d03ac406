//! State-machine rules about policy: flap suspension, automatic failback, and the
//! defaults, codes and validation the I/O layer relies on.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod sm_support;

use havip_sm::*;
use sm_support::*;

/// Ids of the operations prepared (each id once, in order).
fn prepares(a: &[Action]) -> Vec<u64> {
    let mut ids: Vec<u64> = Vec::new();
    for o in ops(a) {
        if matches!(o.kind, OpKind::Prepare { .. }) && !ids.contains(&o.id) {
            ids.push(o.id);
        }
    }
    ids
}

fn first_prepare_at(h: &H) -> Option<u64> {
    h.first_at(|x| {
        matches!(x, Action::SendAdvert(a)
            if matches!(a.op, Some(OpMsg { kind: OpKind::Prepare { .. }, .. })))
    })
}

// ---------------------------------------------------------------- flap suspension

/// B takes over (1), loses carrier and fences after the link-dampening time (2), takes
/// over again after the hold-down (3). Returns B, suspended, at 8000 ms.
fn three_automatic_moves() -> (H, Vec<Action>) {
    let mut h = standby_b_hearing_a();
    h.run(2_300, &[], Some(false));
    h.cas(CasResult::Ok { epoch: 2 }); // move 1: takeover
    h.now = 3_000;
    h.carrier(false);
    h.run(5_000, &[], None); // move 2: cut off, nobody to hand over to: gives up
    assert_eq!(h.role(), Role::Fenced);
    h.now = 5_100;
    h.carrier(true);
    let out = h.run(8_000, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(3, 2)]);
    assert_eq!(h.first_at(|x| matches!(x, Action::CasLease { new_epoch: 3, .. })), Some(8_000));
    let out = h.cas(CasResult::Ok { epoch: 3 }); // move 3: takeover
    (h, out)
}

#[test]
fn flap_suspension_after_three_automatic_moves_in_10_minutes() {
    let (h, out) = three_automatic_moves();
    assert_eq!(raised(&out), vec![Alarm::Suspended]);
    assert!(h.status().suspended);
    assert!(last_advert(&out).suspended);
    assert!(persisted(&out).last().unwrap().suspended);
}

#[test]
fn flap_suspension_moves_spread_over_more_than_10_minutes_do_not_suspend() {
    let mut h = standby_b_hearing_a();
    h.run(2_300, &[], Some(false));
    h.cas(CasResult::Ok { epoch: 2 }); // move 1 at 2_300
    h.run(400_000, &[], None);
    h.carrier(false); // move 2 at 402_000, after the link-dampening time
    h.run(600_300, &[], Some(false));
    h.carrier(true);
    let out = h.run(602_300, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(3, 2)], "takeover as soon as the link is back and stable");
    assert_eq!(h.first_at(|x| matches!(x, Action::CasLease { new_epoch: 3, .. })), Some(602_300));
    let out = h.cas(CasResult::Ok { epoch: 3 }); // move 3 at 602_300: move 1 left the window
    assert!(!raised(&out).contains(&Alarm::Suspended));
    assert!(!h.status().suspended);
}

#[test]
fn flap_suspension_operator_moves_do_not_count() {
    // Three planned failovers away from A, each handed back by B: no suspension on A.
    let mut h = active_a_with_b(3);
    let mut e = 3;
    for (i, id) in [31u64, 32, 33].into_iter().enumerate() {
        let t = 3_000 + 100 * i as u64;
        h.now = t + 10;
        h.cmd(Command::PlannedFailover { id, target: None });
        h.now = t + 20;
        h.hear(&with_op(standby(B, 100, e), id, OpKind::PrepareAck));
        h.now = t + 30;
        h.hear(&with_op(active(B, 100, e + 1), id, OpKind::Confirm));
        assert_eq!(h.role(), Role::Standby);
        // B hands back (an operator move on B).
        let back = 100 + id;
        h.now = t + 40;
        h.hear(&with_op(active(B, 100, e + 1), back, OpKind::Prepare { to: node(A) }));
        h.now = t + 50;
        h.hear(&with_op(adv(B, 100, Role::Demoting, e + 1, true), back, OpKind::Commit { to: node(A), epoch: e + 2 }));
        assert!(h.m.holds_vips(), "took the VIPs back via a commit");
        h.now = t + 60;
        h.hear(&standby(B, 100, e + 2));
        e += 2;
    }
    assert_eq!(results(&h.since(0)).len(), 3);
    assert!(results(&h.since(0)).iter().all(|r| r.1));
    assert!(!h.status().suspended);
    assert!(!raised(&h.since(0)).contains(&Alarm::Suspended));
}

#[test]
fn flap_suspension_still_takes_a_provably_dead_peer() {
    let (mut h, _) = three_automatic_moves();
    // B is suspended and active. A comes back, takes the pair with a newer epoch (B yields),
    // then dies: B, still suspended, takes the provably dead peer's VIPs.
    h.now = 8_100;
    h.hear(&active(A, 200, 4));
    assert_eq!(h.role(), Role::Standby);
    let out = h.run(11_500, &[], Some(false));
    assert!(h.status().suspended);
    assert_eq!(cas_of(&out), vec![(5, 3)]);
}

#[test]
fn flap_suspension_clears_after_10_quiet_minutes() {
    let (mut h, _) = three_automatic_moves();
    let out = h.run(607_990, &[], None);
    assert!(cleared(&out).is_empty());
    let out = h.run(608_020, &[], None);
    assert_eq!(cleared(&out), vec![Alarm::Suspended]);
    assert!(!h.status().suspended);
}

#[test]
fn flap_suspension_clears_on_command() {
    let (mut h, _) = three_automatic_moves();
    h.now = 9_000;
    let out = h.cmd(Command::ClearSuspension);
    assert_eq!(cleared(&out), vec![Alarm::Suspended]);
    assert!(!last_advert(&out).suspended);
}

#[test]
fn flap_suspension_blocks_discretionary_handovers_not_carrier_moves() {
    let mut h =
        H::new(pair(A), Persisted { epoch: 3, last_role: Role::Active, suspended: true, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP]);
    h.run(3_000, &[standby(B, 100, 3)], None);
    h.listeners(false);
    let out = h.run(20_000, &[standby(B, 100, 3)], None);
    assert!(prepares(&out).is_empty());
    assert!(raised(&out).contains(&Alarm::VipUnhealthy));
    // A carrier loss still moves the VIPs.
    let out = h.carrier(false);
    assert_eq!(prepares(&out).len(), 1);
}

// ---------------------------------------------------------------- failback

fn quick_failback() -> AutoFailback {
    AutoFailback {
        recovery_window_ms: 10_000,
        min_on_nonpreferred_ms: 5_000,
        quarantine_failovers: 3,
        quarantine_window_ms: 60_000,
        quarantine_hold_ms: 100_000,
        quiet_window_ms: 2_000,
        quiet_threshold_bps: 32 * 1024,
    }
}

/// B (non-preferred, priority 100) active under epoch 2 since 1000 ms, with `policy`.
fn nonpreferred_active(policy: FailbackPolicy, p: Persisted) -> H {
    let mut cfg = pair(B);
    cfg.failback = policy;
    let mut h = H::new(cfg, Persisted { epoch: 2, last_role: Role::Active, ..p });
    h.env_links();
    h.local_vips(&[VIP]);
    h.lease(Some(B), 2);
    h
}

/// Runs `h` to `until` hearing `a` and feeding `traffic` every second.
fn run_with_traffic(h: &mut H, until: u64, a: &[Advert], traffic: Option<u64>) -> Vec<Action> {
    let mut out = Vec::new();
    while h.now < until {
        let next = (h.now / 1_000 + 1) * 1_000;
        out.extend(h.run(next.min(until), a, None));
        out.extend(h.feed(Input::Traffic { bytes_per_sec: traffic }));
    }
    out
}

#[test]
fn failback_manual_by_default_never_moves_back() {
    let mut h = nonpreferred_active(FailbackPolicy::Manual, Persisted::default());
    let out = run_with_traffic(&mut h, 1_200_000, &[standby(A, 200, 2)], Some(0));
    assert!(prepares(&out).is_empty());
    assert_eq!(h.role(), Role::Active);
}

#[test]
fn failback_automatic_defaults_after_recovery_window() {
    let mut h = nonpreferred_active(FailbackPolicy::Automatic(AutoFailback::default()), Persisted::default());
    let out = run_with_traffic(&mut h, 900_000, &[standby(A, 200, 2)], Some(1_000));
    assert!(prepares(&out).is_empty(), "not before 15 min of readiness");
    let out = run_with_traffic(&mut h, 900_200, &[standby(A, 200, 2)], Some(1_000));
    let id = prepares(&out)[0];
    assert_ne!(id & AUTO_OP_BIT, 0);
    // A first heard ready at 100 ms: 15 min later.
    assert_eq!(first_prepare_at(&h), Some(900_100));
    h.now = 900_210;
    let out = h.hear(&with_op(standby(A, 200, 2), id, OpKind::PrepareAck));
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Demoting, Reason::Failback, 2)]);
    h.now = 900_220;
    let out = h.hear(&with_op(active(A, 200, 3), id, OpKind::Confirm));
    // Failback is a move of a healthy member: drained.
    assert_eq!(drains(&out), vec![(vec![vip(VIP)], node(A))]);
}

#[test]
fn failback_waits_for_the_recovery_window() {
    let mut h = nonpreferred_active(FailbackPolicy::Automatic(quick_failback()), Persisted::default());
    run_with_traffic(&mut h, 5_000, &[standby(A, 200, 2)], Some(1_000));
    // The preferred member is briefly not ready: the window starts over.
    let mut not_ready = standby(A, 200, 2);
    not_ready.ready_all = false;
    run_with_traffic(&mut h, 6_000, &[not_ready], Some(1_000));
    let out = run_with_traffic(&mut h, 15_900, &[standby(A, 200, 2)], Some(1_000));
    assert!(prepares(&out).is_empty());
    let out = run_with_traffic(&mut h, 16_300, &[standby(A, 200, 2)], Some(1_000));
    assert_eq!(prepares(&out).len(), 1);
    assert_eq!(first_prepare_at(&h), Some(16_100));
}

#[test]
fn failback_waits_minimum_time_on_the_nonpreferred_member() {
    let mut policy = quick_failback();
    policy.min_on_nonpreferred_ms = 30_000;
    let mut h = nonpreferred_active(FailbackPolicy::Automatic(policy), Persisted::default());
    let out = run_with_traffic(&mut h, 30_990, &[standby(A, 200, 2)], Some(1_000));
    assert!(prepares(&out).is_empty());
    run_with_traffic(&mut h, 31_200, &[standby(A, 200, 2)], Some(1_000));
    // Active since the adoption at 1000 ms.
    assert_eq!(first_prepare_at(&h), Some(31_000));
}

#[test]
fn failback_blocked_by_quarantine() {
    // B takes over from A three times within the quarantine window.
    let mut cfg = pair(B);
    cfg.failback = FailbackPolicy::Automatic(quick_failback());
    cfg.flap.moves = 100; // keep flap suspension out of this test
    let mut h = H::new(cfg, Persisted::default());
    h.env_ok();
    let mut epoch = 1;
    let mut t = 0;
    for _ in 0..3 {
        h.run(t + 2_000, &[active(A, 200, epoch)], Some(true));
        // (from the second round on, the hold-down after yielding ends at t + 2_500)
        let out = h.run(t + 2_600, &[], Some(false));
        assert_eq!(cas_of(&out).len(), 1);
        assert_eq!(cas_of(&out)[0].0, epoch + 1);
        epoch += 1;
        h.cas(CasResult::Ok { epoch });
        // A comes back and takes the pair over under a newer epoch; B yields.
        epoch += 1;
        h.now = t + 5_500;
        h.hear(&active(A, 200, epoch));
        assert_eq!(h.role(), Role::Standby);
        t += 6_000;
    }
    // Three failovers onto B inside the window: quarantined for 100 s after the third.
    let q = h.status().quarantined_until.unwrap();
    assert!(q.0 > 100_000 && q.0 < 100_000 + t);
    // Now A dies once more and B holds; A returns as a ready standby.
    h.run(t + 2_000, &[active(A, 200, epoch)], Some(true));
    h.run(t + 5_400, &[], Some(false));
    assert!(h.m.holds_vips());
    let q4 = h.status().quarantined_until.unwrap();
    assert!(q4 > q, "the fourth failover extends the quarantine");
    let out = run_with_traffic(&mut h, q4.0 - 10, &[standby(A, 200, epoch + 1)], Some(1_000));
    assert!(prepares(&out).is_empty(), "no failback inside the quarantine");
    let out = run_with_traffic(&mut h, q4.0 + 1_000, &[standby(A, 200, epoch + 1)], Some(1_000));
    assert_eq!(prepares(&out).len(), 1);
    // Every other condition held long before: the failback starts as the quarantine ends.
    assert_eq!(first_prepare_at(&h), Some(q4.0));
}

#[test]
fn failback_needs_a_quiet_traffic_window() {
    let mut h = nonpreferred_active(FailbackPolicy::Automatic(quick_failback()), Persisted::default());
    let out = run_with_traffic(&mut h, 30_000, &[standby(A, 200, 2)], Some(200_000));
    assert!(prepares(&out).is_empty(), "active traffic blocks");
    // Quiet samples from 31_000 on: the quiet window ends at 33_000.
    let out = run_with_traffic(&mut h, 32_990, &[standby(A, 200, 2)], Some(1_000));
    assert!(prepares(&out).is_empty(), "quiet for less than the quiet window");
    run_with_traffic(&mut h, 34_000, &[standby(A, 200, 2)], Some(1_000));
    assert_eq!(first_prepare_at(&h), Some(33_000));
}

#[test]
fn failback_unknown_traffic_waits() {
    let mut h = nonpreferred_active(FailbackPolicy::Automatic(quick_failback()), Persisted::default());
    let out = run_with_traffic(&mut h, 40_000, &[standby(A, 200, 2)], None);
    assert!(prepares(&out).is_empty(), "unknown traffic");
    // Quiet samples, then they stop coming: stale traffic is unknown again.
    run_with_traffic(&mut h, 41_000, &[standby(A, 200, 2)], Some(1_000));
    let mut h2 = nonpreferred_active(FailbackPolicy::Automatic(quick_failback()), Persisted::default());
    h2.feed(Input::Traffic { bytes_per_sec: Some(1_000) });
    let out = h2.run(40_000, &[standby(A, 200, 2)], None);
    assert!(prepares(&out).is_empty(), "a single sample goes stale");
}

#[test]
fn failback_paused_blocks_until_resumed() {
    let mut h = nonpreferred_active(FailbackPolicy::Automatic(quick_failback()), Persisted::default());
    h.cmd(Command::SetPaused(true));
    let out = run_with_traffic(&mut h, 30_000, &[standby(A, 200, 2)], Some(1_000));
    assert!(prepares(&out).is_empty());
    h.cmd(Command::SetPaused(false));
    let out = run_with_traffic(&mut h, 30_100, &[standby(A, 200, 2)], Some(1_000));
    assert_eq!(prepares(&out).len(), 1);
}

#[test]
fn failback_after_a_manual_move_waits_for_resume() {
    let mut h = nonpreferred_active(
        FailbackPolicy::Automatic(quick_failback()),
        Persisted { failback_paused: true, ..Persisted::default() },
    );
    let out = run_with_traffic(&mut h, 30_000, &[standby(A, 200, 2)], Some(1_000));
    assert!(prepares(&out).is_empty());
    assert!(last_advert(&out).failback_paused);
    let out = h.cmd(Command::ResumeFailback);
    assert!(!persisted(&out).last().unwrap().failback_paused);
    let out = run_with_traffic(&mut h, 30_100, &[standby(A, 200, 2)], Some(1_000));
    assert_eq!(prepares(&out).len(), 1);
}

#[test]
fn failback_is_revalidated_just_before_acting() {
    let mut h = nonpreferred_active(FailbackPolicy::Automatic(quick_failback()), Persisted::default());
    let out = run_with_traffic(&mut h, 10_150, &[standby(A, 200, 2)], Some(1_000));
    assert_eq!(first_prepare_at(&h), Some(10_100));
    let id = prepares(&out)[0];
    // Traffic picks up between the prepare and the ack.
    h.now = 10_160;
    h.feed(Input::Traffic { bytes_per_sec: Some(500_000) });
    h.now = 10_170;
    let out = h.hear(&with_op(standby(A, 200, 2), id, OpKind::PrepareAck));
    assert!(role_changes(&out).is_empty(), "no commit");
    assert_eq!(ops(&out).last(), Some(&OpMsg { id, kind: OpKind::Abort }));
    assert!(h.m.holds_vips());
}

// ---------------------------------------------------------------- defaults, codes, validation

#[test]
fn defaults_are_the_decided_ones() {
    let t = Timings::default();
    assert_eq!(
        (
            t.tick_ms,
            t.heartbeat_interval_ms,
            t.heartbeat_timeout_ms,
            t.probe_failures,
            t.probe_span_ms,
            t.hold_down_ms,
            t.boot_hold_ms,
            t.init_listen_ms,
            t.confirm_timeout_ms,
            t.cas_timeout_ms,
            t.listener_down_ms,
            t.vip_unhealthy_ms,
        ),
        (20, 100, 300, 2, 100, 3_000, 60_000, 1_000, 1_000, 200, 10_000, 3_000)
    );
    let f = FlapPolicy::default();
    assert_eq!((f.moves, f.window_ms, f.quiet_ms), (3, 600_000, 600_000));
    let a = AutoFailback::default();
    assert_eq!(
        (
            a.recovery_window_ms,
            a.min_on_nonpreferred_ms,
            a.quarantine_failovers,
            a.quarantine_window_ms,
            a.quarantine_hold_ms,
            a.quiet_window_ms,
            a.quiet_threshold_bps
        ),
        (900_000, 600_000, 3, 86_400_000, 21_600_000, 30_000, 32_768)
    );
    assert_eq!(pair(A).failback, FailbackPolicy::Manual);
}

#[test]
fn wire_codes_round_trip() {
    for r in Role::ALL {
        assert_eq!(Role::from_code(r.code()), Some(r));
    }
    assert_eq!(Role::from_code(200), None);
    for r in [
        RefuseReason::NotStandby,
        RefuseReason::NotReady,
        RefuseReason::Maintenance,
        RefuseReason::CutOff,
        RefuseReason::ConfigRevision,
        RefuseReason::ProtocolMismatch,
        RefuseReason::Busy,
        RefuseReason::StaleEpoch,
        RefuseReason::Misconfigured,
    ] {
        assert_eq!(RefuseReason::from_code(r.code()), r);
    }
    assert_eq!(RefuseReason::from_code(77), RefuseReason::Other);
}

#[test]
fn node_names_are_bounded() {
    assert!(NodeId::new("a".repeat(MAX_NODE_NAME)).is_ok());
    assert_eq!(NodeId::new("a".repeat(MAX_NODE_NAME + 1)), Err(NameError::TooLong { name: "a".repeat(64), max: 63 }));
    assert_eq!(NodeId::new(""), Err(NameError::Empty));
}

#[test]
fn config_validation_reports_what_is_wrong() {
    assert_eq!(pair(A).validate(), Ok(()));
    assert!(matches!(config(A, &[(A, 1), (B, 1)]).validate(), Err(ConfigError::DuplicatePriority { priority: 1 })));
    assert!(matches!(config(A, &[(A, 0), (B, 1)]).validate(), Err(ConfigError::PriorityRange { .. })));
    let mut c = pair(A);
    c.timings.heartbeat_timeout_ms = 100;
    assert!(matches!(c.validate(), Err(ConfigError::Timing { .. })));
    let nine: Vec<(String, u8)> = (0..9).map(|i| (format!("n{i}"), 10 + i)).collect();
    let refs: Vec<(&str, u8)> = nine.iter().map(|(n, p)| (n.as_str(), *p)).collect();
    assert!(matches!(config("n0", &refs).validate(), Err(ConfigError::MemberCount { count: 9 })));
}

#[test]
fn unpaired_member_gives_up_what_it_holds() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let mut cfg = pair(A);
    cfg.members.retain(|m| m.node != node(A));
    let out = h.feed(Input::ConfigChanged(Box::new(cfg)));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(h.role(), Role::Unpaired);
}
