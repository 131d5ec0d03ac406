//! State-machine rules seen from the member holding the VIPs: handovers, two actives, planned
//! and forced failover (both sides), maintenance.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod sm_support;

use havip_sm::*;
use sm_support::*;

/// Active A (epoch 3) that heard `b` for 3 s.
fn active_a_with(b: Advert) -> H {
    let mut h = H::new(pair(A), Persisted { epoch: 3, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP]);
    h.lease(Some(A), 3);
    h.run(3_000, &[b], None);
    assert_eq!(h.role(), Role::Active);
    h
}

// ---------------------------------------------------------------- handovers

#[test]
fn handover_on_carrier_loss_to_ready_standby() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.carrier(false);
    let (id, to) = first_prepare(&out).expect("prepare");
    assert_eq!(to, node(B));
    assert_ne!(id & AUTO_OP_BIT, 0, "automatic operations carry the auto bit");
    let out = complete_handover(&mut h, id);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(
        role_changes(&h.since(3_010)),
        vec![
            (Role::Active, Role::Demoting, Reason::CarrierLost, 3),
            (Role::Demoting, Role::Fenced, Reason::CarrierLost, 4),
        ]
    );
    assert_eq!(h.status().epoch, 4);
    assert!(results(&h.since(0)).is_empty(), "no operator result for automatic moves");
}

#[test]
fn handover_on_carrier_loss_without_ready_standby_gives_up_after_the_dampening_time() {
    let mut b = standby(B, 100, 3);
    b.ready_all = false;
    let mut h = active_a_with(b.clone());
    h.now = 3_010;
    let out = h.carrier(false);
    assert!(first_prepare(&out).is_none());
    // Nobody can take the VIPs: a loss shorter than the link-dampening time (2 s) moves
    // nothing, a longer one fences.
    assert!(removes(&out).is_empty());
    let out = h.run(5_000, &[b.clone()], None);
    assert!(removes(&out).is_empty() && role_changes(&out).is_empty());
    let out = h.run(5_020, &[b], None);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Fenced, Reason::CarrierLost, 3)]);
}

#[test]
fn handover_on_gateway_loss_when_peer_reaches_its_own() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.gateway(Some(false));
    let (id, _) = first_prepare(&out).expect("prepare");
    let out = complete_handover(&mut h, id);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(role_changes(&out), vec![(Role::Demoting, Role::Fenced, Reason::GatewayLost, 4)]);
}

#[test]
fn handover_on_gateway_loss_keeps_vips_when_peer_lost_its_gateway_too() {
    let mut b = standby(B, 100, 3);
    b.gateway = Some(false);
    let mut h = active_a_with(b.clone());
    h.gateway(Some(false));
    let out = h.run(8_000, &[b], None);
    assert!(first_prepare(&out).is_none() && removes(&out).is_empty());
    assert_eq!(h.role(), Role::Active);
}

#[test]
fn handover_on_vip_unhealthy_after_3s() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    // The VIP vanished from the interface: re-added at once.
    let out = h.local_vips(&[]);
    assert_eq!(adds(&out), vec![vec![vip(VIP)]]);
    // ... but it keeps missing.
    let mut out = Vec::new();
    for t in (3_500..=6_500).step_by(500) {
        out.extend(h.run(t, &[standby(B, 100, 3)], None));
        out.extend(h.local_vips(&[]));
    }
    let prepared = h
        .first_at(
            |x| matches!(x, Action::SendAdvert(a) if matches!(a.op, Some(OpMsg { kind: OpKind::Prepare { .. }, .. }))),
        )
        .unwrap();
    assert_eq!(prepared, 6_020, "first tick at or after 3 s");
    let (id, _) = first_prepare(&out).unwrap();
    complete_handover(&mut h, id);
    assert!(role_changes(&h.since(0)).contains(&(Role::Active, Role::Demoting, Reason::VipUnhealthy, 3)));
}

#[test]
fn handover_on_listener_down_10s() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    h.listeners(false);
    let out = h.run(13_000, &[standby(B, 100, 3)], None);
    assert!(first_prepare(&out).is_none());
    let out = h.run(13_100, &[standby(B, 100, 3)], None);
    let (id, _) = first_prepare(&out).expect("prepare after 10 s");
    assert_eq!(h.first_at(|x| matches!(x, Action::SendAdvert(a) if a.op.is_some())), Some(13_020));
    complete_handover(&mut h, id);
    assert!(role_changes(&h.since(0)).contains(&(Role::Active, Role::Demoting, Reason::ListenerDown, 3)));
}

#[test]
fn a_failing_health_check_is_a_listener_down_and_hands_over_after_10s() {
    // A health check (kube-proxy's healthCheckNodePort of an externalTrafficPolicy:
    // Local Service) is one more listener of the member's own, never probed by a peer.
    let mut cfg = pair(A);
    cfg.vips[0].health_ports = vec![31_000];
    let mut h = H::new(cfg, Persisted { epoch: 3, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP]);
    h.listeners(true);
    let out = h.run(3_000, &[standby(B, 100, 3)], None);
    assert!(adverts(&out).last().is_some_and(|a| a.ready_all), "both listeners up: ready");
    // The VIP's port answers, the node's health check fails (no local endpoint).
    h.feed(Input::LocalProbe { vip: vip(VIP), port: 31_000, up: false });
    let out = h.run(12_900, &[standby(B, 100, 3)], None);
    assert!(first_prepare(&out).is_none(), "not before 10 s");
    assert!(adverts(&out).last().is_some_and(|a| !a.ready_all), "a failing health check: not ready");
    let out = h.run(13_200, &[standby(B, 100, 3)], None);
    let (id, _) = first_prepare(&out).expect("prepare after 10 s");
    complete_handover(&mut h, id);
    assert!(role_changes(&h.since(0)).contains(&(Role::Active, Role::Demoting, Reason::ListenerDown, 3)));
    // A peer probe result for the health port is not a thing: peers probe VIP ports only.
    let mut cfg = pair(A);
    cfg.vips[0].health_ports = vec![31_000];
    assert_eq!(cfg.vips[0].listener_ports().collect::<Vec<_>>(), vec![80, 31_000]);
    assert_eq!(cfg.vips[0].probe_ports, vec![80]);
}

#[test]
fn handover_moves_the_whole_member() {
    let mut cfg = pair(A);
    cfg.vips.push(VipSpec { id: vip(VIP2), probe_ports: vec![443], health_ports: vec![] });
    let mut h = H::new(cfg, Persisted { epoch: 3, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP, VIP2]);
    h.run(3_000, &[standby(B, 100, 3)], None);
    // Only the second VIP's listener is down.
    h.feed(Input::LocalProbe { vip: vip(VIP2), port: 443, up: false });
    let out = h.run(13_100, &[standby(B, 100, 3)], None);
    let (id, _) = first_prepare(&out).unwrap();
    let out = complete_handover(&mut h, id);
    assert_eq!(removes(&out), vec![vec![vip(VIP), vip(VIP2)]]);
}

#[test]
fn handover_peer_that_cannot_take_the_unhealthy_vip_leaves_it_with_the_active() {
    let mut b = standby(B, 100, 3);
    b.ready_all = false;
    let mut h = active_a_with(b.clone());
    h.now = 3_010;
    h.listeners(false);
    let out = h.run(20_000, &[b], None);
    assert!(first_prepare(&out).is_none() && removes(&out).is_empty());
    assert_eq!(raised(&out), vec![Alarm::VipUnhealthy]);
    assert!(h.m.holds_vips());
    // Once the peer is ready it takes the VIPs.
    let out = h.run(20_200, &[standby(B, 100, 3)], None);
    assert!(first_prepare(&out).is_some());
}

// ---------------------------------------------------------------- two actives

#[test]
fn two_actives_newer_epoch_wins_loser_gives_up_at_once() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.hear_on(0, &active(B, 100, 4));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Standby, Reason::NewerEpochPeer, 4)]);
    let p = persisted(&out);
    assert_eq!(p.last().map(|p| (p.epoch, p.last_role)), Some((4, Role::Standby)));
}

#[test]
fn two_actives_winner_reannounces() {
    let mut h = active_a_with_b(4);
    h.now = 3_010;
    let out = h.hear_on(0, &active(B, 100, 3));
    assert_eq!(announces(&out), vec![AnnounceKind::Burst]);
    assert!(removes(&out).is_empty());
    // Rate-limited: not again within a second ...
    h.now = 3_500;
    assert!(announces(&h.hear_on(0, &active(B, 100, 3))).is_empty());
    // ... but again if the loser is still heard holding a second later.
    h.run(4_000, &[], None);
    h.now = 4_010;
    assert_eq!(announces(&h.hear_on(0, &active(B, 100, 3))), vec![AnnounceKind::Burst]);
}

#[test]
fn two_actives_same_epoch_higher_priority_wins() {
    // A (priority 200) keeps the VIPs and moves to a fresh epoch the Lease can record.
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.hear_on(0, &active(B, 100, 3));
    assert!(removes(&out).is_empty());
    assert_eq!(cas_of(&out), vec![(4, 3)]);
    assert_eq!(announces(&out), vec![AnnounceKind::Burst]);
    assert_eq!(last_advert(&out).epoch, 4);
    // B (priority 100) gives up.
    let mut b = H::new(pair(B), Persisted { epoch: 3, last_role: Role::Active, ..Persisted::default() });
    b.env_links();
    b.local_vips(&[VIP]);
    b.run(1_500, &[], None);
    let out = b.hear_on(0, &active(A, 200, 3));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
}

#[test]
fn two_actives_holder_does_not_yield_to_a_mere_claimer() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    // B claims (CAS in flight) under epoch 4: A keeps serving until B actually holds.
    let out = h.hear_on(0, &adv(B, 100, Role::Active, 4, false));
    assert!(removes(&out).is_empty());
    h.now = 3_030;
    let out = h.hear_on(0, &active(B, 100, 4));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
}

#[test]
fn two_actives_lease_naming_a_newer_holder_demotes_the_active() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    // B claims (its adverts say Active before it writes the Lease); a B heard as a mere
    // standby would not demote A at once (see sm_rules_partition).
    h.hear(&adv(B, 100, Role::Active, 5, false));
    let out = h.lease(Some(B), 5);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Standby, Reason::NewerEpochLease, 5)]);
}

#[test]
fn a_holderless_lease_at_the_held_epoch_is_recorded_under_a_newer_epoch() {
    // Every compare-and-swap raises leaseTransitions: the chart's admission policy
    // refuses an agent's Lease write that does not.
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.lease(None, 3);
    let cas: Vec<_> = out
        .iter()
        .filter_map(|a| match a {
            Action::CasLease { holder, new_epoch, expected_epoch } => {
                Some((holder.clone(), *new_epoch, *expected_epoch))
            }
            _ => None,
        })
        .collect();
    assert_eq!(cas, vec![(node(A), 4, 3)]);
    assert_eq!(h.role(), Role::Active);
    assert!(removes(&out).is_empty());
}

#[test]
fn two_actives_standby_finding_a_pair_vip_removes_it() {
    let mut h = standby_b_hearing_a();
    let out = h.local_vips(&[VIP]);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(h.role(), Role::Standby);
}

// ---------------------------------------------------------------- planned failover

fn planned(h: &mut H, id: u64) -> Vec<Action> {
    h.cmd(Command::PlannedFailover { id, target: None })
}

#[test]
fn planned_failover_preconditions() {
    let cases: Vec<(Advert, &str)> = vec![
        (adv(B, 100, Role::Init, 3, false), "not a standby"),
        (Advert { config_revision: 9, ..standby(B, 100, 3) }, "configuration revision"),
        (Advert { protocol_major: PROTOCOL.major + 1, ..standby(B, 100, 3) }, "protocol major"),
        (Advert { ready_all: false, ..standby(B, 100, 3) }, "not ready"),
        (Advert { maintenance: true, ..standby(B, 100, 3) }, "maintenance"),
    ];
    for (b, why) in cases {
        let mut h = active_a_with(b.clone());
        let out = h.cmd(Command::PlannedFailover { id: 1, target: Some(node(B)) });
        assert!(first_prepare(&out).is_none(), "{why}");
        let r = results(&out);
        assert_eq!(r.len(), 1, "{why}");
        assert!(!r[0].1 && r[0].2.contains(why), "{why}: {:?}", r[0]);
    }
    // Heard on one path only.
    let mut h = active_a_with_b(3);
    for t in (3_100..=3_500).step_by(100) {
        h.run(t, &[], None);
        h.hear_on(0, &standby(B, 100, 3));
    }
    let out = h.cmd(Command::PlannedFailover { id: 2, target: Some(node(B)) });
    assert_eq!(results(&out), vec![(2, false, "the target is not heard on every path".to_owned())]);
    // Without a target named, nobody qualifies.
    let out = planned(&mut h, 4);
    assert_eq!(results(&out), vec![(4, false, "no peer can take the VIPs now".to_owned())]);
    // Not the active member.
    let mut h = standby_b_hearing_a();
    let out = planned(&mut h, 3);
    assert_eq!(results(&out), vec![(3, false, "this member is not the active member".to_owned())]);
}

#[test]
fn planned_failover_prepare_commit_confirm() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = planned(&mut h, 7);
    assert_eq!(first_prepare(&out), Some((7, node(B))));
    assert_eq!(h.role(), Role::Active);
    h.now = 3_015;
    let out = h.hear(&with_op(standby(B, 100, 3), 7, OpKind::PrepareAck));
    assert_eq!(last_commit(&out), Some((7, node(B), 4)));
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Demoting, Reason::PlannedFailover, 3)]);
    let a = last_advert(&out);
    assert!(a.holds_vips && a.role == Role::Demoting);
    h.now = 3_020;
    // The target accepted an operator handover, so it pauses failback too (and says so).
    let confirm = Advert { failback_paused: true, ..active(B, 100, 4) };
    let out = h.hear(&with_op(confirm, 7, OpKind::Confirm));
    // The VIPs are drained, not removed (the default drainTimeout).
    assert_eq!(drains(&out), vec![(vec![vip(VIP)], node(B))]);
    assert!(removes(&out).is_empty());
    assert_eq!(role_changes(&out), vec![(Role::Demoting, Role::Standby, Reason::PlannedFailover, 4)]);
    assert_eq!(results(&out), vec![(7, true, "handed over to node-b".to_owned())]);
    // A manual move pauses automatic failback (persisted).
    assert!(h.status().failback_paused);
    assert!(persisted(&out).iter().any(|p| p.failback_paused));
}

#[test]
fn planned_failover_rolls_back_after_1s_without_confirm() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    planned(&mut h, 7);
    h.now = 3_020;
    h.hear(&with_op(standby(B, 100, 3), 7, OpKind::PrepareAck));
    // B went quiet after acking (its commit/confirm is lost).
    let out = h.run(4_010, &[], None);
    assert_eq!(h.role(), Role::Demoting);
    assert!(results(&out).is_empty());
    let out = h.run(4_030, &[], None);
    assert_eq!(role_changes(&out), vec![(Role::Demoting, Role::Active, Reason::Aborted, 5)]);
    assert_eq!(announces(&out), vec![AnnounceKind::Burst]);
    assert_eq!(cas_of(&out), vec![(5, 3)]);
    assert!(removes(&out).is_empty() && h.m.holds_vips());
    assert_eq!(ops(&out).last(), Some(&OpMsg { id: 7, kind: OpKind::Abort }));
    let r = results(&out);
    assert_eq!(r.len(), 1);
    assert!(!r[0].1 && r[0].2.contains("did not confirm"));
    assert_eq!(
        h.first_at(|x| matches!(x, Action::Report(Event::RoleChanged { reason: Reason::Aborted, .. }))),
        Some(4_020),
        "one second after the commit at 3020"
    );
}

#[test]
fn a_handover_on_carrier_loss_whose_confirm_never_comes_gives_the_vips_up_without_a_newer_epoch() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.carrier(false);
    let (id, _) = first_prepare(&out).expect("prepare");
    h.now += 5;
    let out = h.hear_on(1, &with_op(standby(B, 100, 3), id, OpKind::PrepareAck));
    assert_eq!(last_commit(&out), Some((id, node(B), 4)));
    // B took over under the commit, but its Confirm is lost (the link went with it). The
    // confirm timeout passes with the carrier still down.
    let out = h.run(4_100, &[], None);
    assert!(!h.m.holds_vips(), "gave the VIPs up");
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert!(cas_of(&out).is_empty(), "no takeback");
    assert!(
        role_changes(&out).iter().all(|(_, to, _, _)| *to != Role::Active),
        "no takeback: {:?}",
        role_changes(&out)
    );
    // Its epoch is the commit's, never newer: B holding under 4 stays the holder.
    assert_eq!(h.status().epoch, 4);
    assert_eq!(last_advert(&h.since(4_000)).epoch, 4);
    // And no abort tells B to give the VIPs up: the adverts queued meanwhile reach B when
    // the links return (it gave them up once, leaving the pair without a holder for 3 s).
    let out = h.run(6_000, &[], None);
    let aborts: Vec<OpMsg> =
        ops(&h.since(4_000)).into_iter().chain(ops(&out)).filter(|o| o.kind == OpKind::Abort).collect();
    assert!(aborts.is_empty(), "{aborts:?}");
}

#[test]
fn planned_failover_without_prepare_ack_aborts_and_keeps_everything() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    planned(&mut h, 8);
    let out = h.run(4_100, &[standby(B, 100, 3)], None);
    let r = results(&out);
    assert_eq!(r.len(), 1);
    assert!(!r[0].1 && r[0].2.contains("prepare"));
    assert_eq!(h.role(), Role::Active);
    assert_eq!(h.status().epoch, 3);
    assert!(announces(&out).is_empty());
}

#[test]
fn planned_failover_refused_by_target() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    planned(&mut h, 7);
    h.now = 3_015;
    let out = h.hear(&with_op(standby(B, 100, 3), 7, OpKind::Refuse { reason: RefuseReason::NotReady }));
    assert_eq!(results(&out), vec![(7, false, "the target refused: target is not ready for every VIP".to_owned())]);
    assert_eq!(h.role(), Role::Active);
}

#[test]
fn planned_failover_target_acks_takes_and_confirms() {
    let mut h = standby_b_hearing_a();
    h.now = 2_010;
    let out = h.hear(&with_op(active(A, 200, 1), 9, OpKind::Prepare { to: node(B) }));
    assert_eq!(ops(&out).last(), Some(&OpMsg { id: 9, kind: OpKind::PrepareAck }));
    assert_eq!(h.status().blocker, Some(Blocker::PeerActive));
    h.now = 2_020;
    let out = h.hear(&with_op(adv(A, 200, Role::Demoting, 1, true), 9, OpKind::Commit { to: node(B), epoch: 2 }));
    let persist = position(&out, |x| matches!(x, Action::Persist(_))).unwrap();
    let add = position(&out, |x| matches!(x, Action::AddVips(_))).unwrap();
    assert!(persist < add);
    assert_eq!(adds(&out), vec![vec![vip(VIP)]]);
    assert_eq!(announces(&out), vec![AnnounceKind::Burst]);
    assert_eq!(cas_of(&out), vec![(2, 1)]);
    assert_eq!(role_changes(&out), vec![(Role::Standby, Role::Active, Reason::HandoverAccepted, 2)]);
    let a = last_advert(&out);
    assert_eq!(
        (a.role, a.epoch, a.holds_vips, a.op),
        (Role::Active, 2, true, Some(OpMsg { id: 9, kind: OpKind::Confirm }))
    );
    assert!(h.status().failback_paused);
}

#[test]
fn planned_failover_target_gives_vips_back_on_abort() {
    let mut h = standby_b_hearing_a();
    h.now = 2_010;
    h.hear(&with_op(active(A, 200, 1), 9, OpKind::Prepare { to: node(B) }));
    h.now = 2_020;
    h.hear(&with_op(adv(A, 200, Role::Demoting, 1, true), 9, OpKind::Commit { to: node(B), epoch: 2 }));
    h.now = 3_100;
    let out = h.hear(&with_op(active(A, 200, 3), 9, OpKind::Abort));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(h.role(), Role::Standby);
}

/// The abort of an initiator that gave the VIPs up as well (a handover on carrier loss
/// whose confirm never came; an agent of an earlier release sent it then) leaves them on
/// the target that holds them under the commit: obeying it left the pair without a holder
/// until a takeover, 3 s (a lab run: cut, then heal, of the holder's cables).
#[test]
fn planned_failover_target_keeps_the_vips_on_the_abort_of_an_initiator_that_gave_them_up() {
    let mut h = standby_b_hearing_a();
    h.now = 2_010;
    h.hear(&with_op(active(A, 200, 1), 9, OpKind::Prepare { to: node(B) }));
    h.now = 2_020;
    h.hear(&with_op(adv(A, 200, Role::Demoting, 1, true), 9, OpKind::Commit { to: node(B), epoch: 2 }));
    assert!(h.m.holds_vips());
    h.now = 3_100;
    let out = h.hear(&with_op(adv(A, 200, Role::Standby, 2, false), 9, OpKind::Abort));
    assert!(removes(&out).is_empty(), "kept: {:?}", role_changes(&out));
    assert_eq!(h.role(), Role::Active);
    assert!(h.m.holds_vips());
}

#[test]
fn planned_failover_target_refuses_when_not_ready() {
    let mut h = standby_b_hearing_a();
    h.listeners(false);
    h.now = 2_010;
    let out = h.hear(&with_op(active(A, 200, 1), 9, OpKind::Prepare { to: node(B) }));
    assert_eq!(ops(&out).last(), Some(&OpMsg { id: 9, kind: OpKind::Refuse { reason: RefuseReason::NotReady } }));
}

#[test]
fn forced_failover_skips_readiness_checks() {
    let b = Advert { ready_all: false, config_revision: 9, ..standby(B, 100, 3) };
    let mut h = active_a_with(b);
    h.now = 3_010;
    let out = h.cmd(Command::ForcedFailover { id: 11, target: Some(node(B)) });
    assert!(first_prepare(&out).is_none(), "no prepare: commit at once");
    assert_eq!(last_commit(&out), Some((11, node(B), 4)));
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Demoting, Reason::ForcedFailover, 3)]);
    h.now = 3_020;
    let out = h.hear(&with_op(active(B, 100, 4), 11, OpKind::Confirm));
    // A forced move of a healthy member drains too.
    assert_eq!(drains(&out), vec![(vec![vip(VIP)], node(B))]);
    assert_eq!(results(&out).len(), 1);
}

#[test]
fn pair_failover_is_executed_by_the_holder_alone() {
    let pair_failover =
        |id, target: Option<&str>, forced| Command::PairFailover { id, target: target.map(node), forced };
    // The holder executes it: planned (prepare first) …
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.cmd(pair_failover(7, None, false));
    assert_eq!(first_prepare(&out), Some((7, node(B))));
    // … or forced (commit at once).
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.cmd(pair_failover(8, Some(B), true));
    assert!(first_prepare(&out).is_none());
    assert_eq!(last_commit(&out), Some((8, node(B), 4)));
    // A member that does not hold the VIPs stays silent: the holder answers for the pair
    // (the same command sent to it alone is refused: planned_failover_preconditions).
    for forced in [false, true] {
        let mut h = standby_b_hearing_a();
        for (id, target) in [(9, None), (10, Some(B)), (11, Some(A))] {
            let out = h.cmd(pair_failover(id, target, forced));
            assert!(results(&out).is_empty() && ops(&out).is_empty(), "{id} {forced}: {out:?}");
            assert_eq!(h.role(), Role::Standby);
        }
    }
    // A holder named as the target sees the command after the handover it asked for.
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.cmd(pair_failover(12, Some(A), false));
    assert!(results(&out).is_empty() && ops(&out).is_empty(), "{out:?}");
    assert_eq!(h.role(), Role::Active);
}

#[test]
fn planned_failover_repeated_id_is_reported_once() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    planned(&mut h, 7);
    let again = planned(&mut h, 7);
    assert!(again.is_empty() || results(&again).is_empty());
    h.now = 3_015;
    h.hear(&with_op(standby(B, 100, 3), 7, OpKind::PrepareAck));
    h.now = 3_020;
    h.hear(&with_op(active(B, 100, 4), 7, OpKind::Confirm));
    h.now = 3_030;
    planned(&mut h, 7);
    let all = results(&h.since(0));
    assert_eq!(all, vec![(7, true, "handed over to node-b".to_owned())]);
}

/// Two real machines wired back to back (instant delivery on both paths, a Lease store,
/// the kernel of each node): a planned failover never leaves the VIP without a holder.
#[test]
fn planned_failover_end_to_end_is_make_before_break() {
    struct Net {
        h: [H; 2],
        kernel: [bool; 2],
        lease: (Option<NodeId>, u64),
        holders_seen: Vec<(bool, bool)>,
    }
    impl Net {
        fn apply(&mut self, i: usize, actions: Vec<Action>) {
            for a in actions {
                match a {
                    Action::AddVips(_) => self.kernel[i] = true,
                    Action::RemoveVips(_) => self.kernel[i] = false,
                    Action::DrainVips { .. } => {
                        // Kept silently: no longer a holder for the clients.
                        self.kernel[i] = false;
                        let out = self.h[i].feed(Input::DrainStarted { ok: true, detail: String::new() });
                        self.apply(i, out);
                    }
                    Action::SendAdvert(adv) => {
                        let j = 1 - i;
                        let out = self.h[j].hear(&adv);
                        self.holders_seen.push((self.kernel[0], self.kernel[1]));
                        self.apply(j, out);
                    }
                    Action::CasLease { holder, new_epoch, expected_epoch } => {
                        let r = if self.lease.1 == expected_epoch {
                            self.lease = (Some(holder), new_epoch);
                            CasResult::Ok { epoch: new_epoch }
                        } else {
                            CasResult::Conflict { holder: self.lease.0.clone(), epoch: self.lease.1 }
                        };
                        let out = self.h[i].cas(r);
                        self.apply(i, out);
                    }
                    _ => {}
                }
            }
            self.holders_seen.push((self.kernel[0], self.kernel[1]));
        }
        fn tick(&mut self, t: u64) {
            for i in 0..2 {
                self.h[i].now = t;
                let out = self.h[i].feed(Input::Tick);
                self.apply(i, out);
            }
        }
    }
    let mut a = H::new(pair(A), Persisted { epoch: 3, last_role: Role::Active, ..Persisted::default() });
    a.env_links();
    a.local_vips(&[VIP]);
    a.lease(Some(A), 3);
    let mut b = H::new(pair(B), Persisted::default());
    b.env_ok();
    b.lease(Some(A), 3);
    let mut net = Net { h: [a, b], kernel: [true, false], lease: (Some(node(A)), 3), holders_seen: Vec::new() };
    for t in (20..=3_000).step_by(20) {
        net.tick(t);
    }
    assert_eq!(net.h[0].role(), Role::Active);
    assert_eq!(net.h[1].role(), Role::Standby);
    net.holders_seen.clear();
    net.h[0].now = 3_005;
    let out = net.h[0].cmd(Command::PlannedFailover { id: 21, target: Some(node(B)) });
    net.apply(0, out);
    for t in (3_020..=3_200).step_by(20) {
        net.tick(t);
    }
    assert!(net.holders_seen.iter().all(|(x, y)| *x || *y), "the VIP always had a holder: {:?}", net.holders_seen);
    assert_eq!(net.kernel, [false, true]);
    assert_eq!(net.h[0].role(), Role::Standby);
    assert_eq!(net.h[1].role(), Role::Active);
    assert_eq!(net.lease, (Some(node(B)), 4));
    assert_eq!(results(&net.h[0].since(0)), vec![(21, true, "handed over to node-b".to_owned())]);
    // The handover took no time at all on an instant network: confirm at the command.
    assert_eq!(net.h[0].first_at(|x| matches!(x, Action::DrainVips { .. })), Some(3_005));
}

// ---------------------------------------------------------------- maintenance

#[test]
fn maintenance_active_hands_over_first_then_stays_out() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.cmd(Command::Maintenance { on: true, force: false });
    let (id, _) = first_prepare(&out).expect("hands over first");
    assert!(h.m.holds_vips());
    let out = complete_handover(&mut h, id);
    assert_eq!(drains(&out), vec![(vec![vip(VIP)], node(B))]);
    assert_eq!(role_changes(&out), vec![(Role::Demoting, Role::Maintenance, Reason::MaintenanceOn, 4)]);
    assert!(persisted(&out).last().unwrap().maintenance);
    // It does not take the VIPs back, even when the peer dies.
    let out = h.run(10_000, &[], Some(false));
    assert!(cas_of(&out).is_empty() && adds(&out).is_empty());
    assert!(last_advert(&out).maintenance);
}

#[test]
fn maintenance_standby_is_no_takeover_candidate() {
    let mut h = standby_b_hearing_a();
    let out = h.cmd(Command::Maintenance { on: true, force: false });
    assert_eq!(role_changes(&out), vec![(Role::Standby, Role::Maintenance, Reason::MaintenanceOn, 1)]);
    let out = h.run(10_000, &[], Some(false));
    assert!(cas_of(&out).is_empty());
    // Off: back in the election as a standby (and then takes the dead peer's VIPs).
    let out = h.cmd(Command::Maintenance { on: false, force: false });
    assert_eq!(role_changes(&out)[0], (Role::Maintenance, Role::Standby, Reason::MaintenanceOff, 1));
}

#[test]
fn maintenance_only_member_leaves_only_when_forced() {
    let mut h = H::new(pair(A), Persisted { epoch: 3, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP]);
    h.run(1_500, &[], None);
    let out = h.cmd(Command::Maintenance { on: true, force: false });
    assert_eq!(raised(&out), vec![Alarm::MaintenancePending]);
    let out = h.run(5_000, &[], None);
    assert!(removes(&out).is_empty());
    assert_eq!(h.role(), Role::Active);
    let out = h.cmd(Command::Maintenance { on: true, force: true });
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Maintenance, Reason::MaintenanceOn, 3)]);
    assert_eq!(cleared(&out), vec![Alarm::MaintenancePending]);
}

#[test]
fn maintenance_is_persisted_across_restarts() {
    let mut h = standby_b_hearing_a();
    let out = h.cmd(Command::Maintenance { on: true, force: false });
    let p = persisted(&out).pop().unwrap();
    assert!(p.maintenance);
    let mut h2 = H::new(pair(B), p);
    h2.env_ok();
    let out = h2.run(1_200, &[], Some(false));
    assert_eq!(role_changes(&out), vec![(Role::Init, Role::Maintenance, Reason::MaintenanceOn, 1)]);
}

// ---------------------------------------------------------------- alarms on the active

#[test]
fn two_actives_foreign_holder_conflict_raises_alarm_and_reannounces() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.feed(Input::Conflict { vip: vip(VIP), foreign_mac: [2, 0, 0, 0, 0, 9] });
    assert_eq!(raised(&out), vec![Alarm::VipConflict]);
    assert_eq!(announces(&out), vec![AnnounceKind::Burst]);
    assert!(removes(&out).is_empty(), "a foreign MAC is not a reason to give up");
    assert_eq!(h.status().conflicts, vec![(vip(VIP), [2, 0, 0, 0, 0, 9])], "the status names the foreign MAC");
    // Reported again 2 s later (the next duplicate probe), by another host: re-announced,
    // alarm still up, the status names the MAC seen last.
    h.now = 5_010;
    let out = h.feed(Input::Conflict { vip: vip(VIP), foreign_mac: [2, 0, 0, 0, 0, 0xa] });
    assert!(!raised(&out).contains(&Alarm::VipConflict));
    assert_eq!(announces(&out), vec![AnnounceKind::Burst]);
    assert_eq!(h.status().conflicts, vec![(vip(VIP), [2, 0, 0, 0, 0, 0xa])]);
    // Clears 10 s after the last report, and the MAC with it.
    let out = h.run(15_020, &[standby(B, 100, 3)], None);
    assert!(cleared(&out).contains(&Alarm::VipConflict));
    assert!(h.status().conflicts.is_empty());
}

#[test]
fn two_actives_rejected_heartbeat_alarms_clear_when_rejections_stop() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.feed(Input::AdvertRejected { path: PathId(1), reason: RejectReason::KeyMismatch, from: None });
    assert_eq!(raised(&out), vec![Alarm::KeyMismatch]);
    assert_eq!(h.status().alarms, vec![Alarm::KeyMismatch]);
    let out = h.run(8_000, &[standby(B, 100, 3)], None);
    assert!(cleared(&out).is_empty());
    let out = h.run(8_100, &[standby(B, 100, 3)], None);
    assert_eq!(cleared(&out), vec![Alarm::KeyMismatch]);
    // Malformed packets are counted elsewhere, never alarms here.
    let out = h.feed(Input::AdvertRejected { path: PathId(0), reason: RejectReason::Malformed, from: None });
    assert!(raised(&out).is_empty());
    // Replay reports reach the machine only when every datagram of a member has been
    // refused for a heartbeat timeout (a member it cannot hear): an alarm, cleared 5 s
    // after the reports stop.
    let out = h.feed(Input::AdvertRejected { path: PathId(0), reason: RejectReason::Replay, from: None });
    assert_eq!(raised(&out), vec![Alarm::HeartbeatReplay]);
    let out = h.run(h.now + 5_100, &[standby(B, 100, 3)], None);
    assert_eq!(cleared(&out), vec![Alarm::HeartbeatReplay]);
}

#[test]
fn planned_failover_overlap_is_not_a_conflict() {
    // Make-before-break: while A is Demoting, B already answers for the VIP. An ARP answer
    // from that overlap must neither raise VipConflict nor make A re-announce (which would
    // pull the clients back to A just before it removes the address).
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    planned(&mut h, 7);
    h.now = 3_015;
    h.hear(&with_op(standby(B, 100, 3), 7, OpKind::PrepareAck));
    assert_eq!(h.role(), Role::Demoting);
    h.now = 3_018;
    let out = h.feed(Input::Conflict { vip: vip(VIP), foreign_mac: [2, 0, 0, 0, 0, 0xb] });
    assert!(announces(&out).is_empty(), "no re-announce during the handover: {out:?}");
    assert!(!h.status().alarms.contains(&Alarm::VipConflict));
    // Once the member is settled as Active, a foreign MAC is a real conflict again.
    let mut h = active_a_with_b(3);
    h.now = 10_000;
    let out = h.feed(Input::Conflict { vip: vip(VIP), foreign_mac: [2, 0, 0, 0, 0, 0xc] });
    assert_eq!(announces(&out), vec![AnnounceKind::Burst]);
    assert!(h.status().alarms.contains(&Alarm::VipConflict));
}

/// A member heard again after a silence (its cables back, a partition healed) may have
/// sent frames from the virtual MAC as its links came up, moving the switch's entry to
/// its port: the holder announces at once, even right after a burst of its own (a lab
/// run lost an IPv6 VIP's traffic for about a second to the old holder's multicast
/// listener reports after a cut healed).
#[test]
fn the_holder_announces_when_a_silent_peer_is_heard_again() {
    let mut h = active_a_with_b(3);
    let b = standby(B, 100, 3);
    // B goes silent for longer than a heartbeat timeout; the holder keeps the VIPs.
    let out = h.run(4_000, &[], None);
    assert!(removes(&out).is_empty() && h.m.holds_vips());
    h.now = 4_010;
    let out = h.hear(&b);
    assert_eq!(announces(&out), vec![AnnounceKind::Burst], "announced when B was heard again");
    // Heard on: nothing more.
    h.now = 4_110;
    let out = h.hear(&b);
    assert!(announces(&out).is_empty());
}

/// A peer that held the VIPs too and then gives them up (the older epoch of two holders
/// after a heal): the holder announces once more, after the peer's virtual MAC interface
/// went down with its VIPs (the peer's last frames from it could come after the holder's
/// announcement when it was heard again).
#[test]
fn the_holder_announces_when_a_peer_that_held_the_vips_gives_them_up() {
    let mut h = active_a_with_b(3);
    h.now = 3_010;
    let out = h.hear(&active(B, 100, 2));
    assert!(h.m.holds_vips(), "the newer epoch keeps the VIPs: {:?}", role_changes(&out));
    h.now = 3_050;
    let out = h.hear(&standby(B, 100, 3));
    assert_eq!(announces(&out), vec![AnnounceKind::Burst], "announced when B gave the VIPs up");
    h.now = 3_150;
    assert!(announces(&h.hear(&standby(B, 100, 3))).is_empty());
}
