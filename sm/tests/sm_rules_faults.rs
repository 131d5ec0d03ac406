//! Rules for faults of the environment: the epoch's domain, a flapping link, a lost state
//! file, a silent peer.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod sm_support;

use havip_sm::*;
use sm_support::*;

// ---------------------------------------------------------------- the epoch's domain

/// Standby B persisted at `persisted_epoch`, hearing A active at `a_epoch` for 2 s (the
/// data plane answering), no Lease (standalone). Time is 2000.
fn standby_b_at(persisted_epoch: u64, a_epoch: u64) -> H {
    let mut h = H::new(pair(B), Persisted { epoch: persisted_epoch, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[]);
    h.run(2_000, &[active(A, 200, a_epoch)], Some(true));
    assert_eq!(h.role(), Role::Standby);
    h
}

#[test]
fn epoch_takeover_at_the_top_of_the_domain_is_refused_with_an_alarm() {
    let mut h = standby_b_at(MAX_EPOCH, MAX_EPOCH);
    // A dies; its data plane stops answering: everything but the epoch says "take over".
    let out = h.run(4_000, &[], Some(false));
    assert!(cas_of(&out).is_empty(), "no claim without a fresh epoch: {:?}", cas_of(&out));
    assert!(role_changes(&out).is_empty());
    assert_eq!(h.status().blocker, Some(Blocker::EpochExhausted));
    assert!(h.status().alarms.contains(&Alarm::EpochExhausted));
    assert!(h.m.epoch() <= MAX_EPOCH);
}

#[test]
fn epoch_one_below_the_top_still_takes_over_under_the_top() {
    let mut h = standby_b_at(MAX_EPOCH - 1, MAX_EPOCH - 1);
    let out = h.run(2_400, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(MAX_EPOCH, 0)], "the Lease as last seen (none) is what the CAS expects");
    // From the claim on the pair is at the top: the alarm tells the operator.
    let alarm_at =
        |h: &H| h.first_at(|x| matches!(x, Action::Report(Event::AlarmRaised { alarm: Alarm::EpochExhausted, .. })));
    let claim_at = h.first_at(|x| matches!(x, Action::CasLease { .. })).unwrap();
    assert!(alarm_at(&h).is_none_or(|t| t >= claim_at));
    h.cas(CasResult::Unavailable);
    assert!(h.m.holds_vips());
    assert!(h.status().alarms.contains(&Alarm::EpochExhausted));
}

// ---------------------------------------------------------------- the Lease's step limit

/// The usual pair seen from `local`, against a store that refuses a compare-and-swap
/// raising the epoch by more than [`MAX_LEASE_STEP`] (the Kubernetes admission policy).
fn step_limited(local: &str) -> Config {
    let mut c = pair(local);
    c.lease_max_step = Some(MAX_LEASE_STEP);
    c
}

/// Standby B whose epoch (persisted, and A's) is `epoch`, hearing A active for 2 s; the
/// Lease names A under `lease`. Time is 2000.
fn limited_standby_b(epoch: u64, lease: u64) -> H {
    let mut h = H::new(step_limited(B), Persisted { epoch, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[]);
    h.lease(Some(A), lease);
    h.run(2_000, &[active(A, 200, epoch)], Some(true));
    assert_eq!(h.role(), Role::Standby);
    h
}

#[test]
fn lease_step_a_claim_within_the_limit_is_written() {
    let mut h = limited_standby_b(1_002, 3);
    let out = h.run(4_000, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(1_003, 3)], "a step of exactly {MAX_LEASE_STEP}");
    assert!(!h.status().alarms.contains(&Alarm::LeaseBehind));
}

#[test]
fn lease_step_a_claim_beyond_the_limit_takes_over_unwritten_with_an_alarm_and_no_retries() {
    // The pair's epoch ran 5000 ahead of its Lease (e.g. many takeovers while the API server
    // was unreachable). A dies; its data plane stops answering.
    let mut h = limited_standby_b(5_000, 3);
    let out = h.run(4_000, &[], Some(false));
    assert!(cas_of(&out).is_empty(), "a write the API server refuses is never sent: {:?}", cas_of(&out));
    assert!(h.m.holds_vips(), "the takeover goes on under the standalone rules");
    assert_eq!(h.m.held_epoch(), Some(5_001));
    assert!(raised(&out).contains(&Alarm::LeaseBehind), "{:?}", raised(&out));
    // The Lease observed again (a resync, the agent's feed while the store reads as
    // stale) brings no write, and time neither.
    let out = h.lease(Some(A), 3);
    assert!(cas_of(&out).is_empty(), "{:?}", cas_of(&out));
    let out = h.run(20_000, &[], Some(false));
    assert!(cas_of(&out).is_empty(), "{:?}", cas_of(&out));
    assert!(h.status().alarms.contains(&Alarm::LeaseBehind));
    assert!(!h.status().lease_stale, "the store answers; it only refuses the step");
    // Recorded by hand (kubectl patch of the Lease): the alarm clears, nothing is written.
    let out = h.lease(Some(B), 5_001);
    assert!(cas_of(&out).is_empty(), "{:?}", cas_of(&out));
    assert!(cleared(&out).contains(&Alarm::LeaseBehind), "{:?}", cleared(&out));
    assert!(h.m.holds_vips());
}

#[test]
fn lease_step_a_holders_catch_up_beyond_the_limit_is_not_written_and_says_so() {
    // An active restarted with its epoch persisted at 5000; the Lease names it under 3 (it
    // was re-created, or a catch-up never landed): the catch-up would be refused.
    let mut h = H::new(step_limited(A), Persisted { epoch: 5_000, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP]);
    h.lease(Some(A), 3);
    h.run(3_000, &[standby(B, 100, 5_000)], None);
    assert_eq!(h.role(), Role::Active);
    assert!(h.m.holds_vips());
    let all = h.since(0);
    assert!(cas_of(&all).is_empty(), "{:?}", cas_of(&all));
    assert!(raised(&all).contains(&Alarm::LeaseBehind), "{:?}", raised(&all));
    let out = h.lease(Some(A), 3);
    assert!(cas_of(&out).is_empty());
    // Within reach again (somebody raised the Lease to 4001): the catch-up is written.
    let out = h.lease(Some(A), 4_001);
    assert_eq!(cas_of(&out), vec![(5_000, 4_001)]);
    h.cas(CasResult::Ok { epoch: 5_000 });
    let out = h.run(4_000, &[standby(B, 100, 5_000)], None);
    assert!(h.status().alarms.iter().all(|a| *a != Alarm::LeaseBehind), "{out:?}");
}

#[test]
fn lease_step_no_limit_without_one_configured() {
    // Standalone mode (a witness keeps no such policy): the claim is written as before.
    let mut h = H::new(pair(B), Persisted { epoch: 5_000, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[]);
    h.lease(Some(A), 3);
    h.run(2_000, &[active(A, 200, 5_000)], Some(true));
    let out = h.run(4_000, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(5_001, 3)]);
}

#[test]
fn epoch_persisted_above_the_domain_is_clamped_never_saturated() {
    // A state file can no longer hold such an epoch (it is refused at load); a caller that
    // passes one anyway gets the top of the domain, and no takeover ties with it.
    let mut h = H::new(pair(B), Persisted { epoch: u64::MAX, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[]);
    assert_eq!(h.m.epoch(), MAX_EPOCH);
    h.run(2_000, &[active(A, 200, 7)], Some(true));
    let out = h.run(4_000, &[], Some(false));
    assert!(cas_of(&out).is_empty(), "{:?}", cas_of(&out));
    assert!(persisted(&h.since(0)).iter().all(|p| p.epoch <= MAX_EPOCH));
    assert_eq!(h.status().blocker, Some(Blocker::EpochExhausted));
}

#[test]
fn epoch_adverts_outside_the_domain_are_ignored_and_counted() {
    let mut h = standby_b_at(3, 3);
    let before = h.m.epoch();
    h.now += 10;
    let mut forged = active(A, 200, u64::MAX);
    forged.role = Role::Active;
    h.hear(&forged);
    let mut commit = standby(A, 200, 3);
    commit.op = Some(OpMsg { id: 9, kind: OpKind::Commit { to: node(B), epoch: MAX_EPOCH + 1 } });
    h.hear(&commit);
    assert_eq!(h.m.epoch(), before, "the epoch did not jump");
    assert_eq!(h.status().ignored_adverts, 4, "two adverts on two paths");
    assert_eq!(h.role(), Role::Standby, "the commit was not accepted");
    assert_eq!(h.status().peers[0].epoch, Some(3), "the last valid advert is what is known of A");
}

#[test]
fn epoch_lease_outside_the_domain_is_ignored() {
    let mut h = standby_b_at(3, 3);
    h.lease(Some(A), u64::MAX);
    assert_eq!(h.m.epoch(), 3);
    assert_eq!(h.status().lease, Some(LeaseView { holder: None, epoch: 0 }), "the last valid observation");
}

#[test]
fn epoch_two_actives_at_the_top_resolve_on_priority_without_a_new_epoch() {
    // A holds at the top; B holds at the top too (lower priority): B yields, A keeps the
    // VIPs under the same epoch (no fresh one is left) and never sends one above the top.
    let mut h = H::new(pair(A), Persisted { epoch: MAX_EPOCH, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP]);
    h.run(3_000, &[standby(B, 100, MAX_EPOCH)], None);
    assert!(h.m.holds_vips());
    let out = h.run(4_000, &[active(B, 100, MAX_EPOCH)], None);
    assert!(h.m.holds_vips(), "A wins the tie on priority");
    assert!(adverts(&out).iter().all(|a| a.epoch <= MAX_EPOCH));
    assert!(cas_of(&out).iter().all(|(e, _)| *e <= MAX_EPOCH));
    assert_eq!(h.m.epoch(), MAX_EPOCH);

    let mut b = H::new(pair(B), Persisted { epoch: MAX_EPOCH, last_role: Role::Active, ..Persisted::default() });
    b.env_links();
    b.local_vips(&[VIP]);
    let out = b.run(2_000, &[active(A, 200, MAX_EPOCH)], None);
    assert!(!b.m.holds_vips(), "B yields to the higher priority at the same epoch");
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
}

#[test]
fn epoch_planned_failover_needs_two_fresh_epochs() {
    // The commit takes one epoch and a takeback after a missing confirm another: one
    // below the top, a handover is refused rather than left without a way back.
    let mut h = active_a_with_b(MAX_EPOCH - 1);
    h.now += 10;
    let out = h.cmd(Command::PlannedFailover { id: 5, target: None });
    let prepare = ops(&out).into_iter().find(|o| matches!(o.kind, OpKind::Prepare { .. })).expect("prepare");
    h.now += 5;
    let out = h.hear(&with_op(standby(B, 100, MAX_EPOCH - 1), prepare.id, OpKind::PrepareAck));
    assert!(!ops(&out).iter().any(|o| matches!(o.kind, OpKind::Commit { .. })), "no commit");
    let r = results(&out);
    assert_eq!(r.len(), 1);
    assert!(!r[0].1 && r[0].2.contains("top of its domain"), "{r:?}");
    assert_eq!(h.role(), Role::Active);
    assert!(h.m.holds_vips());

    // Two below the top, it goes through.
    let mut h = active_a_with_b(MAX_EPOCH - 2);
    h.now += 10;
    let out = h.cmd(Command::PlannedFailover { id: 5, target: None });
    let prepare = ops(&out).into_iter().find(|o| matches!(o.kind, OpKind::Prepare { .. })).expect("prepare");
    h.now += 5;
    let out = h.hear(&with_op(standby(B, 100, MAX_EPOCH - 2), prepare.id, OpKind::PrepareAck));
    assert!(ops(&out).iter().any(|o| matches!(o.kind, OpKind::Commit { epoch, .. } if epoch == MAX_EPOCH - 1)));
}

// ---------------------------------------------------------------- link flapping

fn prepare_ids(a: &[Action]) -> Vec<u64> {
    ops(a).into_iter().filter(|o| matches!(o.kind, OpKind::Prepare { .. })).map(|o| o.id).collect()
}

#[test]
fn flap_member_whose_carrier_returned_takes_no_vips_until_stable() {
    let mut h = standby_b_hearing_a();
    // B's link blips (100 ms), and A dies right after it.
    h.now = 2_000;
    h.carrier(false);
    assert_eq!(h.status().not_ready, Some(NotReady::CutOff), "cut off while its link is down");
    h.now = 2_100;
    h.carrier(true);
    assert_eq!(h.status().carrier_settled_at, Some(Millis(4_100)));
    let out = h.run(4_080, &[], Some(false));
    assert!(cas_of(&out).is_empty(), "no takeover while the link settles");
    assert_eq!(h.status().blocker, Some(Blocker::CarrierSettling));
    assert!(!last_advert(&out).ready_all, "not ready in its adverts");
    assert_eq!(h.status().not_ready, Some(NotReady::CarrierSettling), "and in its status, for the same reason");
    let out = h.run(4_100, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(2, 1)], "takes over once the link was up for 2 s");
    assert_eq!(h.status().carrier_settled_at, None);
}

#[test]
fn flap_settling_member_refuses_a_handover() {
    let mut h = standby_b_hearing_a();
    h.now = 2_000;
    h.carrier(false);
    h.now = 2_100;
    h.carrier(true);
    h.now = 2_200;
    let out = h.hear(&with_op(active(A, 200, 1), 77, OpKind::Prepare { to: node(B) }));
    assert_eq!(ops(&out).last(), Some(&OpMsg { id: 77, kind: OpKind::Refuse { reason: RefuseReason::NotReady } }));
    // A commit (a forced failover skips the prepare) is refused too.
    let out = h.hear(&with_op(adv(A, 200, Role::Demoting, 1, true), 78, OpKind::Commit { to: node(B), epoch: 2 }));
    assert!(adds(&out).is_empty());
    assert_eq!(h.role(), Role::Standby);
}

#[test]
fn flap_holder_rides_out_a_short_loss_when_no_peer_is_eligible() {
    // B is heard but not ready (its own link settles after a flap): A's carrier blip of
    // 200 ms moves nothing and removes nothing.
    let mut b = standby(B, 100, 3);
    b.ready_all = false;
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.run(3_100, &[b.clone()], None);
    assert!(prepare_ids(&out).is_empty());
    h.now = 3_110;
    let mut out = h.carrier(false);
    out.extend(h.run(3_300, &[b.clone()], None));
    h.now = 3_310;
    out.extend(h.carrier(true));
    out.extend(h.run(6_000, &[b], None));
    assert!(prepare_ids(&out).is_empty(), "nobody to hand over to");
    assert!(removes(&out).is_empty() && role_changes(&out).is_empty(), "{:?}", role_changes(&out));
    assert!(h.m.holds_vips());
    assert_eq!(h.role(), Role::Active);
}

#[test]
fn flap_holder_hands_over_once_a_peer_becomes_eligible_during_its_loss() {
    let mut b = standby(B, 100, 3);
    b.ready_all = false;
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    h.run(3_100, &[b.clone()], None);
    h.now = 3_110;
    h.carrier(false);
    let out = h.run(3_500, &[b], None);
    assert!(prepare_ids(&out).is_empty());
    // B's link is stable now: A, still without carrier, hands over.
    let out = h.run(3_600, &[standby(B, 100, 3)], None);
    assert_eq!(prepare_ids(&out).len(), 1);
}

#[test]
fn flap_repeated_losses_double_the_dampening_time_and_a_stable_link_resets_it() {
    let mut h = standby_b_hearing_a();
    let mut t = 2_000;
    let mut settled = Vec::new();
    for _ in 0..7 {
        h.now = t;
        h.carrier(false);
        h.now = t + 100;
        h.carrier(true);
        settled.push(h.status().carrier_settled_at.map(|m| m.0 - (t + 100)));
        t += 400;
    }
    // 2 s, doubling with each loss before the link was stable, up to 32 × 2 s.
    let want: Vec<Option<u64>> = [2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 64_000].map(Some).to_vec();
    assert_eq!(settled, want);
    // Up for the whole 64 s: the next loss costs the base time again.
    let back = t - 400 + 100;
    h.run(back + 64_000, &[active(A, 200, 1)], Some(true));
    assert_eq!(h.status().carrier_settled_at, None);
    h.now = back + 64_100;
    h.carrier(false);
    h.now = back + 64_200;
    h.carrier(true);
    assert_eq!(h.status().carrier_settled_at, Some(Millis(back + 66_200)));
}

#[test]
fn flap_the_first_carrier_observation_is_no_return() {
    // At start a link seen up is not a return (the agent does not know its history); one
    // first seen down and then up is.
    let mut h = H::new(pair(B), Persisted::default());
    h.env_ok();
    assert_eq!(h.status().carrier_settled_at, None);
    let mut h = H::new(pair(B), Persisted::default());
    h.carrier(false);
    h.now = 50;
    h.env_ok();
    assert_eq!(h.status().carrier_settled_at, Some(Millis(2_050)));
}

#[test]
fn flap_zero_dampening_turns_it_off() {
    let mut cfg = pair(B);
    cfg.timings.carrier_stable_ms = 0;
    let mut h = H::new(cfg, Persisted::default());
    h.env_ok();
    h.lease(Some(A), 1);
    h.run(2_000, &[active(A, 200, 1)], Some(true));
    h.now = 2_000;
    h.carrier(false);
    h.now = 2_100;
    h.carrier(true);
    assert_eq!(h.status().carrier_settled_at, None);
    let out = h.run(2_500, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(2, 1)]);
}

#[test]
fn flap_a_long_dampened_member_still_takes_a_lost_pair_after_the_base_time() {
    // B's link flapped three times (its readiness waits 8 s), then A dies: nobody holds
    // the VIPs, so B takes them after the base 2 s rather than leave the pair down.
    let mut h = standby_b_hearing_a();
    for t in [2_000, 2_200, 2_400] {
        h.now = t;
        h.carrier(false);
        h.now = t + 100;
        h.carrier(true);
    }
    assert_eq!(h.status().carrier_settled_at, Some(Millis(2_500 + 8_000)));
    let out = h.run(4_480, &[], Some(false));
    assert!(cas_of(&out).is_empty());
    let out = h.run(4_500, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(2, 1)]);
}

// ---------------------------------------------------------------- a lost state file

/// Member A restarted with `p` as its state and the VIP still on its interface, hearing B
/// as `b` during its init listen, in standalone mode (no Lease). Time is 1100 (the listen
/// is over).
fn restarted_a(p: Persisted, b: &Advert) -> (H, Vec<Action>) {
    let mut h = H::new(pair(A), p);
    h.env_links_standalone();
    let mut out = h.local_vips(&[VIP]);
    out.extend(h.run(1_100, std::slice::from_ref(b), None));
    (h, out)
}

#[test]
fn lost_state_active_restarted_without_its_state_file_adopts_the_vips() {
    let (h, out) = restarted_a(Persisted::default(), &standby(B, 100, 3));
    assert!(removes(&out).is_empty(), "the VIP stays: {:?}", role_changes(&out));
    assert_eq!(role_changes(&out), vec![(Role::Init, Role::Active, Reason::Adopted, 0)]);
    assert!(h.m.holds_vips());
    assert!(last_advert(&out).holds_vips);
    assert_eq!(announces(&out), vec![AnnounceKind::Refresh], "no burst: the VIP did not move");
    // It holds under the epoch it can prove (none), but knows the pair's.
    assert_eq!((h.m.held_epoch(), h.m.epoch()), (Some(0), 3));
    assert_eq!(persisted(&out).last().map(|p| p.last_role), Some(Role::Active));
}

#[test]
fn lost_state_file_saying_standby_adopts_too() {
    let p = Persisted { epoch: 3, last_role: Role::Standby, ..Persisted::default() };
    let (h, out) = restarted_a(p, &standby(B, 100, 3));
    assert!(removes(&out).is_empty());
    assert_eq!(role_changes(&out), vec![(Role::Init, Role::Active, Reason::Adopted, 3)]);
    assert!(h.m.holds_vips());
}

#[test]
fn lost_state_adopter_yields_to_a_holder_with_a_newer_or_equal_epoch() {
    // B holds under 3 (newer than A's lost 0): A gives the VIP up at once.
    let (h, out) = restarted_a(Persisted::default(), &active(B, 100, 3));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(h.first_at(|x| matches!(x, Action::RemoveVips(_))), Some(100), "at the first advert");
    assert!(!h.m.holds_vips());
    assert_eq!(h.role(), Role::Standby);
    // The same epoch: A (higher priority) still yields: its epoch comes from an old file.
    let p = Persisted { epoch: 3, last_role: Role::Standby, ..Persisted::default() };
    let (h, out) = restarted_a(p, &active(B, 100, 3));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert!(!h.m.holds_vips());
}

#[test]
fn lost_state_holder_keeps_the_vips_against_a_readopting_peer_on_a_tie() {
    // B (priority 100) holds under 4; A (priority 200) re-adopts a stale VIP under 4 too.
    let mut b = H::new(pair(B), Persisted { epoch: 4, last_role: Role::Active, ..Persisted::default() });
    b.env_links();
    b.local_vips(&[VIP]);
    b.run(3_000, &[standby(A, 200, 4)], None);
    assert!(b.m.holds_vips());
    let out = b.run(4_000, &[adv(A, 200, Role::Init, 4, true)], None);
    assert!(b.m.holds_vips(), "the holder keeps the VIPs");
    assert!(removes(&out).is_empty());
    assert!(announces(&out).contains(&AnnounceKind::Burst), "and re-announces them");
}

#[test]
fn lost_state_two_readopting_members_resolve_on_priority() {
    // Both lost their state (epoch 0) and find the VIP (a partition healed while both
    // agents restarted): the higher priority keeps it.
    let (a, out) = restarted_a(Persisted::default(), &adv(B, 100, Role::Init, 0, true));
    assert!(removes(&out).is_empty());
    assert!(a.m.holds_vips());
    let mut b = H::new(pair(B), Persisted::default());
    b.env_links();
    b.local_vips(&[VIP]);
    let out = b.run(1_100, &[adv(A, 200, Role::Init, 0, true)], None);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert!(!b.m.holds_vips());
}

#[test]
fn lost_state_lease_naming_another_holder_makes_the_adopter_release() {
    let mut h = H::new(pair(A), Persisted::default());
    h.env_links();
    h.local_vips(&[VIP]);
    let out = h.lease(Some(B), 1);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    // A Lease naming A itself is no reason to let go.
    let mut h = H::new(pair(A), Persisted::default());
    h.env_links();
    h.local_vips(&[VIP]);
    h.lease(Some(A), 5);
    let out = h.run(1_100, &[standby(B, 100, 5)], None);
    assert!(removes(&out).is_empty());
    assert_eq!(h.m.held_epoch(), Some(5), "holds under the Lease's epoch once Active");
}

#[test]
fn lost_state_adopter_with_a_holderless_lease_moves_to_a_fresh_epoch() {
    // With a Lease store, a Lease naming nobody under the epoch the adopter can prove is
    // claimed like any holderless Lease: under an epoch newer than any it knows, by CAS.
    let mut h = H::new(pair(A), Persisted::default());
    h.env_links();
    h.local_vips(&[VIP]);
    let out = h.run(1_100, &[standby(B, 100, 3)], None);
    assert!(removes(&out).is_empty(), "the VIP stays");
    assert!(h.m.holds_vips());
    assert_eq!((h.m.held_epoch(), h.m.epoch()), (Some(4), 4));
    assert_eq!(cas_of(&out), vec![(4, 0)]);
}

#[test]
fn lost_state_adoption_loses_to_any_later_takeover() {
    let (mut h, _) = restarted_a(Persisted::default(), &standby(B, 100, 3));
    assert!(h.m.holds_vips());
    // A partition: B takes over under 4. When A hears it, A yields despite its priority.
    h.now = 2_000;
    let out = h.hear(&active(B, 100, 4));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(h.role(), Role::Standby);
}

#[test]
fn lost_state_member_in_maintenance_does_not_adopt() {
    let p = Persisted { maintenance: true, ..Persisted::default() };
    let (h, out) = restarted_a(p, &standby(B, 100, 3));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(h.role(), Role::Maintenance);
}

// ---------------------------------------------------------------- a silent peer

fn peer_silent_raised_at(h: &H) -> Option<u64> {
    h.first_at(|x| matches!(x, Action::Report(Event::AlarmRaised { alarm: Alarm::PeerSilent, .. })))
}

#[test]
fn peer_silent_alarm_when_a_peer_is_silent_on_every_path_while_own_links_are_fine() {
    let mut h = standby_b_hearing_a();
    assert!(!h.status().alarms.contains(&Alarm::PeerSilent));
    // A falls silent at 2000 (the data plane still answers: no takeover, but the alarm).
    h.run(2_400, &[], Some(true));
    assert_eq!(peer_silent_raised_at(&h), Some(2_300), "after one heartbeat timeout");
    assert!(h.status().alarms.contains(&Alarm::PeerSilent));
    // Heard again (on one path is enough): cleared.
    h.now = 2_410;
    let out = h.hear_on(1, &active(A, 200, 1));
    assert_eq!(cleared(&out), vec![Alarm::PeerSilent]);
}

#[test]
fn peer_silent_alarm_on_both_sides_of_a_peer_only_partition() {
    // The active sees its standby fall silent too (it keeps serving: nothing to decide).
    let mut h = active_a_with_b(3);
    let out = h.run(3_400, &[], None);
    assert!(raised(&out).contains(&Alarm::PeerSilent));
    assert!(h.m.holds_vips());
}

#[test]
fn peer_silent_alarm_not_raised_while_heard_on_one_path() {
    let mut h = standby_b_hearing_a();
    for t in (2_100..=4_000).step_by(100) {
        h.run(t, &[], Some(true));
        h.hear_on(0, &active(A, 200, 1));
    }
    assert_eq!(peer_silent_raised_at(&h), None);
}

#[test]
fn peer_silent_alarm_not_raised_when_this_member_is_cut_off() {
    // Own carrier down: the silence is explained by this member's own link.
    let mut h = standby_b_hearing_a();
    h.now = 2_000;
    h.carrier(false);
    h.run(3_000, &[], Some(false));
    assert_eq!(peer_silent_raised_at(&h), None);
    // Own gateway unreachable: the same.
    let mut h = standby_b_hearing_a();
    h.now = 2_000;
    h.gateway(Some(false));
    h.run(3_000, &[], Some(false));
    assert_eq!(peer_silent_raised_at(&h), None);
    // And a raised alarm clears when this member loses its own link.
    let mut h = standby_b_hearing_a();
    h.run(2_400, &[], Some(true));
    assert!(h.status().alarms.contains(&Alarm::PeerSilent));
    h.now = 2_410;
    let out = h.carrier(false);
    assert_eq!(cleared(&out), vec![Alarm::PeerSilent]);
}

#[test]
fn peer_silent_alarm_for_a_peer_never_heard_after_the_init_listen() {
    let mut h = H::new(pair(B), Persisted::default());
    h.env_ok();
    h.run(990, &[], Some(false));
    assert_eq!(peer_silent_raised_at(&h), None, "not during the init listen");
    h.run(1_100, &[], Some(false));
    assert!(h.status().alarms.contains(&Alarm::PeerSilent));
}

// ---------------------------------------------------------------- after a stall

/// Standby B that claimed at 2300 (A silent, its data plane down); its CAS is in flight.
fn claiming_b() -> H {
    let mut h = standby_b_hearing_a();
    let out = h.run(2_300, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(2, 1)]);
    assert!(!h.m.holds_vips());
    h
}

#[test]
fn stall_resumed_claimer_yields_to_a_newer_lease_queued_behind_its_grant() {
    // B is stopped right after its claim. Meanwhile the Lease granted it, then C... here A
    // came back and took the pair under epoch 3. At SIGCONT both answers arrive in a burst.
    let mut h = claiming_b();
    h.now = 4_000;
    let mut out = h.cas(CasResult::Ok { epoch: 2 });
    assert!(adds(&out).is_empty() && announces(&out).is_empty(), "no VIP before the queue is processed");
    out.extend(h.lease(Some(A), 3));
    out.extend(h.feed(Input::Tick));
    assert!(adds(&out).is_empty() && announces(&out).is_empty(), "{out:?}");
    assert!(!h.m.holds_vips());
    assert_eq!(h.role(), Role::Standby);
}

#[test]
fn stall_resumed_claimer_takes_the_vips_at_the_first_tick_when_nothing_newer_is_queued() {
    let mut h = claiming_b();
    h.now = 4_000;
    let out = h.cas(CasResult::Ok { epoch: 2 });
    assert!(adds(&out).is_empty());
    let out = h.feed(Input::Tick);
    assert_eq!(adds(&out), vec![vec![vip(VIP)]]);
    assert_eq!(announces(&out), vec![AnnounceKind::Burst]);
    assert!(h.m.holds_vips());
}

#[test]
fn stall_resumed_initiator_processes_the_queued_confirm_before_its_timeout() {
    // A committed a handover to B and was stopped for 2 s (past its 1 s confirm timeout).
    // Queued meanwhile: B's older advert, then B's confirm. A completes the handover; it
    // neither aborts nor takes the VIPs back under a newer epoch.
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    h.cmd(Command::PlannedFailover { id: 7, target: None });
    h.now = 3_015;
    h.hear(&with_op(standby(B, 100, 3), 7, OpKind::PrepareAck));
    assert_eq!(h.role(), Role::Demoting);
    h.now = 5_100;
    let mut out = h.hear_on(1, &with_op(standby(B, 100, 3), 7, OpKind::PrepareAck));
    out.extend(h.hear_on(1, &with_op(active(B, 100, 4), 7, OpKind::Confirm)));
    out.extend(h.feed(Input::Tick));
    assert!(announces(&out).is_empty(), "no takeback: {:?}", role_changes(&out));
    // Given up (drained: a planned move of a healthy member), not taken back.
    assert_eq!(drains(&out), vec![(vec![vip(VIP)], node(B))]);
    assert!(adds(&out).is_empty());
    assert_eq!(results(&out), vec![(7, true, "handed over to node-b".to_owned())]);
    assert_eq!(h.role(), Role::Standby);
}

#[test]
fn stall_resumed_holder_yields_to_a_queued_newer_holder_without_announcing() {
    let mut h = active_a_with_b(3);
    h.now = 5_000;
    let mut out = h.hear_on(1, &adv(B, 100, Role::Active, 4, false));
    out.extend(h.hear_on(1, &active(B, 100, 4)));
    out.extend(h.feed(Input::Tick));
    assert!(announces(&out).is_empty());
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Standby, Reason::NewerEpochPeer, 4)]);
}
