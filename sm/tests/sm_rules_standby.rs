//! State-machine rules seen from a member that does not hold the VIPs: start-up, takeover of
//! a lost peer, fencing, versions, agent restart on the active, N members.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod sm_support;

use havip_sm::*;
use sm_support::*;

// ---------------------------------------------------------------- start-up

#[test]
fn startup_booting_member_joins_as_standby() {
    let mut h = H::new(pair(B), Persisted::default());
    h.env_ok();
    let a = h.run(1_500, &[active(A, 200, 4)], Some(true));
    assert_eq!(h.role(), Role::Standby);
    assert_eq!(role_changes(&a), vec![(Role::Init, Role::Standby, Reason::Startup, 4)]);
    assert!(adds(&a).is_empty() && cas_of(&a).is_empty());
    // It learnt the pair's epoch from the active.
    assert_eq!(h.status().epoch, 4);
    assert_eq!(persisted(&a).last().map(|p| p.epoch), Some(4));
}

#[test]
fn startup_after_reboot_joins_as_standby_even_if_it_was_active() {
    // A reboot finds no VIPs on the interface: no adoption.
    let mut h = H::new(pair(A), Persisted { epoch: 7, last_role: Role::Active, ..Persisted::default() });
    h.env_ok(); // LocalVips: none
    let a = h.run(1_500, &[active(B, 100, 8)], Some(true));
    assert_eq!(h.role(), Role::Standby);
    assert!(adds(&a).is_empty());
    assert_eq!(role_changes(&a), vec![(Role::Init, Role::Standby, Reason::Startup, 8)]);
}

#[test]
fn startup_init_listen_lasts_one_second() {
    let mut h = H::new(pair(A), Persisted::default());
    h.env_ok();
    h.run(990, &[standby(B, 100, 0)], Some(false));
    assert_eq!(h.role(), Role::Init);
    h.run(1_000, &[standby(B, 100, 0)], Some(false));
    assert_ne!(h.role(), Role::Init);
}

#[test]
fn startup_higher_priority_wins_after_steady_hearing() {
    // The higher-priority member A: nobody holds the VIPs (the probe fails), B is heard as
    // a standby; at the end of its init listen A is elected.
    let mut a = H::new(pair(A), Persisted::default());
    a.env_ok();
    let out = a.run(1_000, &[standby(B, 100, 0)], Some(false));
    assert_eq!(
        role_changes(&out),
        vec![(Role::Init, Role::Standby, Reason::Startup, 0), (Role::Standby, Role::Active, Reason::Election, 1)]
    );
    assert_eq!(cas_of(&out), vec![(1, 0)]);
    assert_eq!(a.first_at(|x| matches!(x, Action::CasLease { .. })), Some(1_000));

    // The lower-priority member B hears A only from 800 ms: in the initial election it
    // waits until A has been heard steadily for two listens (A's first adverts may still
    // be settling), then gives A its turn (stagger), and stays standby once A claims.
    let mut b = H::new(pair(B), Persisted::default());
    b.env_ok();
    b.run(800, &[], Some(false));
    // (first advert at 900 ms)
    b.run(1_890, &[standby(A, 200, 0)], Some(false));
    assert_eq!(b.role(), Role::Standby);
    assert_eq!(b.status().blocker, Some(Blocker::PeerNotSteady));
    b.run(2_850, &[standby(A, 200, 0)], Some(false));
    assert_eq!(b.status().blocker, Some(Blocker::PeerNotSteady), "two listens in the initial election");
    b.run(2_950, &[standby(A, 200, 0)], Some(false));
    assert_eq!(b.status().blocker, Some(Blocker::Staggered));
    let out = b.run(5_000, &[adv(A, 200, Role::Active, 1, false)], Some(false));
    assert!(cas_of(&out).is_empty() && adds(&out).is_empty());
    assert_eq!(b.status().blocker, Some(Blocker::PeerActive));
}

#[test]
fn startup_member_with_own_link_down_does_not_stand() {
    let mut h = H::new(pair(A), Persisted::default());
    h.env_ok();
    h.carrier(false);
    let out = h.run(5_000, &[standby(B, 100, 0)], Some(false));
    assert_eq!(h.role(), Role::Fenced);
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.status().blocker, Some(Blocker::NotStandby));
    // The peer, seeing A's advert with carrier down, does not wait for A: it stands.
    let mut b = H::new(pair(B), Persisted::default());
    b.env_ok();
    let mut a_adv = adv(A, 200, Role::Fenced, 0, false);
    a_adv.carrier_ok = false;
    let out = b.run(2_500, &[a_adv], Some(false));
    assert_eq!(role_changes(&out).last(), Some(&(Role::Standby, Role::Active, Reason::Election, 1)));
}

#[test]
fn startup_member_with_gateway_down_does_not_stand() {
    let mut h = H::new(pair(A), Persisted::default());
    h.env_ok();
    h.gateway(Some(false));
    let out = h.run(5_000, &[standby(B, 100, 0)], Some(false));
    assert_eq!(h.role(), Role::Fenced);
    assert!(cas_of(&out).is_empty());
}

#[test]
fn startup_boot_hold_60s_before_serving_alone() {
    let mut h = H::new(pair(A), Persisted::default());
    h.env_ok();
    let out = h.run(59_990, &[], Some(false));
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.status().blocker, Some(Blocker::BootHold));
    assert_eq!(h.status().boot_hold_until, Some(Millis(60_000)));
    let out = h.run(60_020, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(1, 0)]);
    assert_eq!(h.first_at(|x| matches!(x, Action::CasLease { .. })), Some(60_000));
    let out = h.cas(CasResult::Ok { epoch: 1 });
    assert_eq!(adds(&out), vec![vec![vip(VIP)]]);
}

#[test]
fn startup_start_alone_skips_boot_hold() {
    let mut cfg = pair(A);
    cfg.start_alone = true;
    let mut h = H::new(cfg, Persisted::default());
    h.env_ok();
    let out = h.run(1_100, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(1, 0)]);
    assert_eq!(h.first_at(|x| matches!(x, Action::CasLease { .. })), Some(1_000));
}

// ---------------------------------------------------------------- takeover

#[test]
fn takeover_of_lost_peer_when_all_conditions_hold() {
    let mut h = standby_b_hearing_a();
    // A dies at 2000 (last advert heard at 2000); its data plane stops answering.
    let out = h.run(2_400, &[], Some(false));
    // Decided exactly when the heartbeat timed out (300 ms): the probe was already down.
    assert_eq!(h.first_at(|x| matches!(x, Action::CasLease { .. })), Some(2_300));
    let claim_at = position(&out, |x| matches!(x, Action::CasLease { .. })).unwrap();
    let persist_at = position(&out, |x| matches!(x, Action::Persist(_))).unwrap();
    assert!(persist_at < claim_at, "the new epoch is persisted before acting");
    assert_eq!(persisted(&out), vec![Persisted { epoch: 2, last_role: Role::Active, ..Persisted::default() }]);
    assert_eq!(cas_of(&out), vec![(2, 1)]);
    assert_eq!(role_changes(&out), vec![(Role::Standby, Role::Active, Reason::Takeover, 2)]);
    assert!(adds(&out).is_empty(), "no VIP before the Lease answers");
    let claim = last_advert(&out);
    assert_eq!((claim.role, claim.epoch, claim.holds_vips), (Role::Active, 2, false));

    let out = h.cas(CasResult::Ok { epoch: 2 });
    assert_eq!(adds(&out), vec![vec![vip(VIP)]]);
    assert_eq!(announces(&out), vec![AnnounceKind::Burst]);
    assert!(out.contains(&Action::SelfCheck { conflict_probe: true }), "a takeover probes for a foreign holder");
    let a = last_advert(&out);
    assert!(a.holds_vips && a.epoch == 2 && a.role == Role::Active);
    assert_eq!(h.status().lease, Some(LeaseView { holder: Some(node(B)), epoch: 2 }));
}

#[test]
fn takeover_requires_no_heartbeat_on_any_path() {
    let mut h = standby_b_hearing_a();
    // A is still heard on the management path only.
    let mut out = Vec::new();
    for t in (2_100..=4_000).step_by(100) {
        out.extend(h.run(t, &[], Some(false)));
        out.extend(h.hear_on(1, &active(A, 200, 1)));
    }
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.status().blocker, Some(Blocker::PeerActive));
    assert_eq!(h.status().peers[0].heard_paths, vec![PathId(1)]);
}

#[test]
fn takeover_requires_data_plane_down() {
    let mut h = standby_b_hearing_a();
    // Heartbeat silence alone never suffices: the VIP still answers.
    let out = h.run(5_000, &[], Some(true));
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.status().blocker, Some(Blocker::DataPlaneUp));
    // One failure: pending.
    h.now = 5_010;
    h.probe(false);
    assert_eq!(h.status().blocker, Some(Blocker::DataPlanePending));
    // A second failure only 50 ms later: still pending (span < 100 ms).
    h.now = 5_060;
    assert!(cas_of(&h.probe(false)).is_empty());
    assert_eq!(h.status().probe, ProbeState::Pending);
    // Two failures spanning 100 ms, but the VIP answered 110 ms ago (the last probe of
    // the run at 5,000): still pending — a data plane that answered within a heartbeat
    // timeout is alive, and failures since may be loss on the path.
    h.now = 5_110;
    assert!(cas_of(&h.probe(false)).is_empty());
    assert_eq!(h.status().probe, ProbeState::Pending);
    // Failing on until the last answer is a heartbeat timeout (300 ms) old: down →
    // takeover at once.
    let mut out = Vec::new();
    for t in [5_160, 5_210, 5_260] {
        h.now = t;
        out.extend(h.probe(false));
    }
    assert!(cas_of(&out).is_empty(), "the VIP answered less than 300 ms ago");
    h.now = 5_300;
    let out = h.probe(false);
    assert_eq!(cas_of(&out), vec![(2, 1)]);
}

/// The fifth 60-minute chaos run: the holder's agent dead while its kernel serves, the
/// standby's own cable losing frames — its probes fail most of the time but some are
/// answered. Any answer within the heartbeat timeout keeps the verdict from "down",
/// however many failures surround it; once nothing answers for that long, it is down.
#[test]
fn takeover_waits_while_any_probe_answered_within_the_heartbeat_timeout() {
    let mut h = standby_b_hearing_a();
    // A's agent dies at 2,000; three probes of four fail (every 50 ms) for 3 s.
    let mut out = Vec::new();
    let mut k = 0u64;
    let mut last_up = 0;
    while h.now < 5_000 {
        h.now += 50;
        let up = k % 4 == 3;
        if up {
            last_up = h.now;
        }
        out.extend(h.probe(up));
        out.extend(h.feed(Input::Tick));
        k += 1;
    }
    assert!(cas_of(&out).is_empty(), "no takeover while the VIP answers now and then");
    assert!(matches!(h.status().blocker, Some(Blocker::DataPlanePending | Blocker::DataPlaneUp)));
    // Nothing answers any more: down 300 ms after the last answer.
    let mut out = Vec::new();
    while h.now < last_up + 400 {
        h.now += 50;
        out.extend(h.probe(false));
        out.extend(h.feed(Input::Tick));
    }
    assert_eq!(cas_of(&out), vec![(2, 1)]);
    assert!(h.first_at(|x| matches!(x, Action::CasLease { .. })).is_some_and(|t| t >= last_up + 300));
}

/// The seventh 60-minute chaos run: a pair's timings were edited while its standby was
/// cut off. A reconfiguration is no evidence that the holder died: the standby keeps the
/// time of its last answered probe, and two failures right after a new configuration do
/// not make the data plane "down" while that answer is younger than a heartbeat timeout.
#[test]
fn a_reconfiguration_keeps_the_last_answered_probe() {
    let mut h = standby_b_hearing_a();
    // A's agent is dead (no heartbeats from 2,000); its VIP answered at 2,100.
    h.now = 2_100;
    h.probe(true);
    h.feed(Input::Tick);
    h.now = 2_120;
    let mut cfg = pair(B);
    cfg.config_revision = 99;
    h.feed(Input::ConfigChanged(Box::new(cfg)));
    let mut out = Vec::new();
    while h.now < 2_600 {
        h.now += 50;
        out.extend(h.probe(false));
        out.extend(h.feed(Input::Tick));
    }
    assert_eq!(cas_of(&out), vec![(2, 1)], "the takeover happens");
    let at = h.first_at(|x| matches!(x, Action::CasLease { .. }));
    assert!(at.is_some_and(|t| t >= 2_100 + 300), "not before the last answer is a heartbeat timeout old: {at:?}");
}

#[test]
fn takeover_requires_own_data_and_vip_carrier() {
    for link in [Link::Data, Link::Vip] {
        let mut h = standby_b_hearing_a();
        h.feed(Input::Carrier { link, up: false });
        let out = h.run(4_000, &[], Some(false));
        assert!(cas_of(&out).is_empty(), "{link:?}");
        assert_eq!(h.role(), Role::Fenced);
    }
}

#[test]
fn takeover_requires_gateway_not_unreachable() {
    let mut h = standby_b_hearing_a();
    h.gateway(Some(false));
    let out = h.run(4_000, &[], Some(false));
    assert!(cas_of(&out).is_empty());
    // No answering fence target at all: the gateway check is off.
    let mut h = standby_b_hearing_a();
    h.gateway(None);
    let out = h.run(2_400, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(2, 1)]);
}

#[test]
fn takeover_blocked_by_hold_down() {
    // B held the VIPs and gave them up at 2000 (a newer active appeared).
    let mut h = H::new(pair(B), Persisted { epoch: 3, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP]);
    h.run(1_500, &[], None);
    assert!(h.m.holds_vips());
    let out = h.run(2_000, &[active(A, 200, 4)], None);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    let gave_up = h.first_at(|x| matches!(x, Action::RemoveVips(_))).unwrap();
    assert_eq!(h.status().hold_down_until, Some(Millis(gave_up + 3_000)));
    // A dies right away: no takeover inside the 3 s hold-down ...
    let out = h.run(gave_up + 2_990, &[], Some(false));
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.status().blocker, Some(Blocker::HoldDown));
    // ... and at once after it.
    let out = h.run(gave_up + 3_000, &[], Some(false));
    assert_eq!(cas_of(&out).len(), 1);
}

#[test]
fn takeover_blocked_by_misconfiguration() {
    let cfg = config(B, &[(A, 100), (B, 100)]); // duplicate priority
    let mut h = H::new(cfg, Persisted::default());
    let out = h.env_ok();
    assert_eq!(raised(&out), vec![Alarm::Misconfigured]);
    h.lease(Some(A), 1);
    h.run(2_000, &[active(A, 100, 1)], Some(true));
    let out = h.run(5_000, &[], Some(false));
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.status().blocker, Some(Blocker::Misconfigured));
    assert!(!h.status().config_valid);
}

#[test]
fn takeover_suspension_blocks_only_while_data_plane_unknown() {
    let suspended = Persisted { epoch: 1, suspended: true, ..Persisted::default() };
    // With a data-plane target proven down, a suspended member still takes over.
    let mut h = H::new(pair(B), suspended.clone());
    let out = h.env_ok();
    assert_eq!(raised(&out), vec![Alarm::Suspended]);
    h.run(2_000, &[active(A, 200, 1)], Some(true));
    let out = h.run(2_400, &[], Some(false));
    assert_eq!(cas_of(&out).len(), 1);
    // Without a data-plane target (unknown), the suspension blocks it.
    let mut cfg = pair(B);
    cfg.vips[0].probe_ports.clear();
    let mut h = H::new(cfg, suspended);
    h.env_ok();
    h.run(2_000, &[active(A, 200, 1)], None);
    let out = h.run(5_000, &[], None);
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.status().probe, ProbeState::NoTarget);
    assert_eq!(h.status().blocker, Some(Blocker::SuspendedUnknownDataPlane));
}

#[test]
fn takeover_key_mismatch_or_clock_skew_do_not_block_dead_data_plane() {
    for reason in [RejectReason::KeyMismatch, RejectReason::ClockSkew] {
        let mut h = standby_b_hearing_a();
        // From now on A's heartbeats arrive but fail verification.
        let mut out = Vec::new();
        for t in (2_010..=2_400).step_by(10) {
            out.extend(h.run(t, &[], Some(false)));
            if t % 100 == 0 {
                out.extend(h.feed(Input::AdvertRejected { path: PathId(0), reason, from: None }));
            }
        }
        // Datagrams that fail verification do not hide a silent peer (anybody can send
        // them from its address): PeerSilent is raised next to KeyMismatch. Authentic ones
        // refused for clock skew explain the silence.
        let alarms = match reason {
            RejectReason::KeyMismatch => vec![Alarm::KeyMismatch, Alarm::PeerSilent],
            _ => vec![Alarm::ClockSkew],
        };
        let mut got = raised(&out);
        got.sort_by_key(|a| a.as_str());
        assert_eq!(got, alarms, "{reason:?}");
        assert_eq!(cas_of(&out), vec![(2, 1)], "{reason:?}");
        assert_eq!(h.first_at(|x| matches!(x, Action::CasLease { .. })), Some(2_300));
    }
}

#[test]
fn takeover_without_data_plane_target_rests_on_heartbeat_and_gateway() {
    let mut cfg = pair(B);
    cfg.vips[0].probe_ports.clear();
    let mut h = H::new(cfg.clone(), Persisted::default());
    h.env_ok();
    h.run(2_000, &[active(A, 200, 1)], None);
    let out = h.run(2_400, &[], None);
    assert_eq!(h.status().probe, ProbeState::NoTarget);
    assert_eq!(cas_of(&out).len(), 1);
    assert_eq!(h.first_at(|x| matches!(x, Action::CasLease { .. })), Some(2_300));
    // The gateway still decides.
    let mut h = H::new(cfg, Persisted::default());
    h.env_ok();
    h.run(2_000, &[active(A, 200, 1)], None);
    h.gateway(Some(false));
    let out = h.run(5_000, &[], None);
    assert!(cas_of(&out).is_empty());
}

#[test]
fn takeover_lease_conflict_means_someone_else_took_it() {
    // Three members; C cannot hear B (an asymmetric partition) and also claimed.
    let mut h = H::new(config(B, &[(A, 200), (B, 150), (C, 100)]), Persisted::default());
    h.env_ok();
    h.lease(Some(A), 1);
    h.run(2_000, &[active(A, 200, 1)], Some(true));
    h.run(2_300, &[], Some(false));
    assert_eq!(cas_of(&h.since(2_300)), vec![(2, 1)]);
    let out = h.cas(CasResult::Conflict { holder: Some(node(C)), epoch: 2 });
    assert!(adds(&out).is_empty());
    assert_eq!(h.role(), Role::Standby);
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Standby, Reason::LeaseConflict, 2)]);
    // It does not claim again at once (that would steal from the winner before its adverts
    // arrive); it waits a heartbeat timeout, and hears the winner meanwhile.
    assert_eq!(h.status().blocker, Some(Blocker::LeaseConflictBackoff));
    let out = h.run(3_000, &[active(C, 100, 2)], Some(false));
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.status().blocker, Some(Blocker::PeerActive));
}

#[test]
fn takeover_lease_behind_is_retried_against_what_it_reads() {
    let mut h = standby_b_hearing_a();
    h.run(2_300, &[], Some(false));
    // The Lease was still at 0 (an earlier reconcile never happened).
    let out = h.cas(CasResult::Conflict { holder: Some(node(A)), epoch: 0 });
    assert_eq!(cas_of(&out), vec![(2, 0)]);
    let out = h.cas(CasResult::Ok { epoch: 2 });
    assert_eq!(adds(&out).len(), 1);
}

#[test]
fn takeover_store_unavailable_proceeds_and_reconciles_later() {
    let mut h = standby_b_hearing_a();
    h.run(2_300, &[], Some(false));
    let out = h.cas(CasResult::Unavailable);
    assert_eq!(adds(&out), vec![vec![vip(VIP)]]);
    assert!(h.status().lease_stale);
    // The store is back and still names A under epoch 1: CAS it to B.
    h.now = 3_000;
    let out = h.lease(Some(A), 1);
    assert_eq!(cas_of(&out), vec![(2, 1)]);
    h.cas(CasResult::Ok { epoch: 2 });
    assert!(!h.status().lease_stale);
    // A newer epoch naming another holder makes B give up at once.
    h.now = 4_000;
    let out = h.lease(Some(C), 3);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Standby, Reason::NewerEpochLease, 3)]);
}

#[test]
fn takeover_cas_without_answer_times_out_after_200ms() {
    let mut h = standby_b_hearing_a();
    h.run(2_300, &[], Some(false));
    let out = h.run(2_480, &[], Some(false));
    assert!(adds(&out).is_empty());
    let out = h.run(2_500, &[], Some(false));
    assert_eq!(adds(&out), vec![vec![vip(VIP)]]);
    assert_eq!(h.first_at(|x| matches!(x, Action::AddVips(_))), Some(2_500));
}

#[test]
fn takeover_paused_policy_still_takes_provably_dead_peer() {
    let mut h = standby_b_hearing_a();
    h.cmd(Command::SetPaused(true));
    let out = h.run(2_400, &[], Some(false));
    assert_eq!(cas_of(&out), vec![(2, 1)]);
}

#[test]
fn takeover_after_stall_ignores_probe_evidence_from_before() {
    let mut h = standby_b_hearing_a();
    // The data plane reads down (the active is momentarily unreachable), and A is silent.
    h.run(2_150, &[], Some(false));
    h.cmd(Command::Maintenance { on: true, force: false }); // blocks the takeover for now
    h.run(2_200, &[], Some(false));
    h.cmd(Command::Maintenance { on: false, force: false });
    // Now the process is stopped for 2 s; at SIGCONT the old "down" must not count.
    h.now = 4_300;
    let out = h.feed(Input::Tick);
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.status().probe, ProbeState::Pending);
}

// ---------------------------------------------------------------- fencing

#[test]
fn fencing_isolated_standby_takes_no_vips() {
    let mut h = standby_b_hearing_a();
    // Cut off: gateway unreachable and nobody heard, the VIP unreachable.
    let out = h.gateway(Some(false));
    assert_eq!(role_changes(&out), vec![(Role::Standby, Role::Fenced, Reason::Fenced, 1)]);
    let out = h.run(10_000, &[], Some(false));
    assert!(cas_of(&out).is_empty() && adds(&out).is_empty());
    // Back to standby when no longer cut off.
    let out = h.gateway(Some(true));
    assert_eq!(role_changes(&out)[0], (Role::Fenced, Role::Standby, Reason::Unfenced, 1));
    // …without taking over on the probe failures of the time it was cut off (the sixth
    // 60-minute chaos run): fresh evidence first.
    assert!(cas_of(&out).is_empty(), "no takeover on stale probe failures");
    assert_eq!(h.status().probe, ProbeState::Pending);
    let out = h.run(h.now + 200, &[], Some(false));
    assert_eq!(cas_of(&out).len(), 1, "fresh failures: the silent holder is taken over");
}

#[test]
fn fencing_cut_off_active_gives_up_its_vips() {
    let mut h = H::new(pair(A), Persisted { epoch: 2, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP]);
    h.run(1_500, &[], None);
    assert_eq!(h.role(), Role::Active);
    // Gateway unreachable and no peer heard: this member is the one cut off.
    let out = h.gateway(Some(false));
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(role_changes(&out), vec![(Role::Active, Role::Fenced, Reason::GatewayLost, 2)]);
}

#[test]
fn fencing_fenced_member_removes_pair_vips_it_finds() {
    let mut h = standby_b_hearing_a();
    h.carrier(false);
    assert_eq!(h.role(), Role::Fenced);
    let out = h.local_vips(&[VIP]);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
}

// ---------------------------------------------------------------- versions

#[test]
fn versions_different_protocol_major_blocks_automatic_takeover() {
    let mut h = H::new(pair(B), Persisted::default());
    h.env_ok();
    let mut a = active(A, 200, 1);
    a.protocol_major = PROTOCOL.major + 1;
    let out = h.run(2_000, &[a], Some(true));
    assert_eq!(raised(&out), vec![Alarm::VersionMismatch]);
    let out = h.run(6_000, &[], Some(false));
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.status().blocker, Some(Blocker::VersionMismatch));
}

#[test]
fn versions_different_minor_is_compatible() {
    let mut h = H::new(pair(B), Persisted::default());
    h.env_ok();
    let mut a = active(A, 200, 1);
    a.protocol_minor = PROTOCOL.minor + 3;
    let out = h.run(2_000, &[a], Some(true));
    assert!(raised(&out).is_empty());
    let out = h.run(2_400, &[], Some(false));
    assert_eq!(cas_of(&out).len(), 1);
}

// ---------------------------------------------------------------- agent restart

#[test]
fn agent_restart_on_active_adopts_vips_and_resumes_with_persisted_epoch() {
    let mut h = H::new(pair(A), Persisted { epoch: 7, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.lease(Some(A), 7);
    let out = h.local_vips(&[VIP]);
    assert!(removes(&out).is_empty(), "the VIPs stay during the init listen");
    let a = last_advert(&h.run(500, &[standby(B, 100, 7)], None));
    assert_eq!((a.role, a.holds_vips, a.epoch), (Role::Init, true, 7));
    let out = h.run(1_100, &[standby(B, 100, 7)], None);
    assert_eq!(role_changes(&out), vec![(Role::Init, Role::Active, Reason::Adopted, 7)]);
    assert_eq!(announces(&out), vec![AnnounceKind::Refresh]);
    assert!(adds(&out).is_empty() && removes(&out).is_empty());
    assert!(cas_of(&out).is_empty(), "the Lease already names A under 7");
    assert_eq!(h.status().epoch, 7);
    // Persisted state never recorded Init: a second crash during the listen still adopts.
    assert!(h.log.iter().all(|(_, x)| !matches!(x, Action::Persist(Persisted { last_role: Role::Init, .. }))));
}

#[test]
fn agent_restart_on_active_yields_to_newer_epoch_heard_during_init() {
    let mut h = H::new(pair(A), Persisted { epoch: 7, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP]);
    let out = h.run(600, &[active(B, 100, 8)], None);
    assert_eq!(removes(&out), vec![vec![vip(VIP)]]);
    assert_eq!(h.first_at(|x| matches!(x, Action::RemoveVips(_))), Some(100));
    let out = h.run(1_200, &[active(B, 100, 8)], None);
    assert_eq!(role_changes(&out), vec![(Role::Init, Role::Standby, Reason::Startup, 8)]);
}

#[test]
fn agent_restart_standby_does_not_take_over_while_data_plane_answers() {
    let mut h = standby_b_hearing_a();
    // A's agent restarts: no heartbeats for 3 s, but the VIPs stay and the listener answers.
    let out = h.run(5_000, &[], Some(true));
    assert!(cas_of(&out).is_empty() && adds(&out).is_empty());
    // The restarted agent comes back in Init, holding: still no takeover.
    let out = h.run(6_000, &[adv(A, 200, Role::Init, 1, true)], Some(true));
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.status().blocker, Some(Blocker::PeerActive));
}

// ---------------------------------------------------------------- N members

fn three(local: &str) -> Config {
    config(local, &[(A, 200), (B, 150), (C, 100)])
}

#[test]
fn n_members_highest_priority_ready_standby_takes_over() {
    let mut h = H::new(three(B), Persisted::default());
    h.env_ok();
    h.lease(Some(A), 1);
    h.run(2_000, &[active(A, 200, 1), standby(C, 100, 1)], Some(true));
    let out = h.run(2_400, &[standby(C, 100, 1)], Some(false));
    assert_eq!(cas_of(&out), vec![(2, 1)]);
    assert_eq!(h.first_at(|x| matches!(x, Action::CasLease { .. })), Some(2_300));
}

#[test]
fn n_members_lower_priority_waits_its_stagger_and_does_not_race() {
    let mut h = H::new(three(C), Persisted::default());
    h.env_ok();
    h.lease(Some(A), 1);
    h.run(2_000, &[active(A, 200, 1), standby(B, 150, 1)], Some(true));
    // A dies; B (better) is heard claiming within one heartbeat.
    h.run(2_300, &[standby(B, 150, 1)], Some(false));
    assert_eq!(h.status().blocker, Some(Blocker::Staggered));
    let out = h.run(5_000, &[adv(B, 150, Role::Active, 2, false)], Some(false));
    assert!(cas_of(&out).is_empty());
    assert_eq!(h.role(), Role::Standby);
}

#[test]
fn n_members_lower_priority_takes_over_when_the_better_one_does_not() {
    let mut h = H::new(three(C), Persisted::default());
    h.env_ok();
    h.lease(Some(A), 1);
    h.run(2_000, &[active(A, 200, 1), standby(B, 150, 1)], Some(true));
    // B stays a silent-about-it standby (say, its probe still answers): C goes after one
    // heartbeat interval of stagger (rank 1).
    let out = h.run(2_500, &[standby(B, 150, 1)], Some(false));
    assert_eq!(cas_of(&out), vec![(2, 1)]);
    assert_eq!(h.first_at(|x| matches!(x, Action::CasLease { .. })), Some(2_400));
}

#[test]
fn n_members_maintenance_or_cut_off_peers_do_not_outrank() {
    let mut h = H::new(three(C), Persisted::default());
    h.env_ok();
    h.lease(Some(A), 1);
    let mut b = standby(B, 150, 1);
    b.maintenance = true;
    h.run(2_000, &[active(A, 200, 1), b.clone()], Some(true));
    let out = h.run(2_400, &[b], Some(false));
    assert_eq!(h.first_at(|x| matches!(x, Action::CasLease { .. })), Some(2_300));
    assert_eq!(cas_of(&out).len(), 1);
}

#[test]
fn agent_restart_on_active_adds_a_missing_vip_only_after_the_init_listen() {
    let mut cfg = pair(A);
    cfg.vips.push(VipSpec { id: vip(VIP2), probe_ports: vec![443], health_ports: vec![] });
    let mut h = H::new(cfg, Persisted { epoch: 7, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    let out = h.local_vips(&[VIP]); // one of the two is gone
    assert!(adds(&out).is_empty() && removes(&out).is_empty());
    let out = h.run(990, &[standby(B, 100, 7)], None);
    assert!(adds(&out).is_empty());
    let out = h.run(1_000, &[standby(B, 100, 7)], None);
    assert_eq!(adds(&out), vec![vec![vip(VIP2)]]);
    assert_eq!(h.role(), Role::Active);
}

#[test]
fn startup_better_peer_that_pauses_in_the_initial_election_still_gets_two_listens() {
    // B hears A from 900 ms to 1.2 s, then A's heartbeats pause (its agent is starting on
    // a busy machine): B does not elect itself until A has been silent for two listens.
    let mut b = H::new(pair(B), Persisted::default());
    b.env_ok();
    b.run(800, &[], Some(false));
    b.run(1_200, &[standby(A, 200, 0)], Some(false));
    let out = b.run(3_100, &[], Some(false));
    assert!(cas_of(&out).is_empty(), "elected while the better peer paused: {out:?}");
    assert_eq!(b.status().blocker, Some(Blocker::PeerNotSteady));
    // Silent for good: B serves.
    let out = b.run(4_500, &[], Some(false));
    assert_eq!(cas_of(&out).len(), 1, "{out:?}");
}

// ---------------------------------------------------------------- backup paths (routed VIPs)

/// Only a ready standby advertises a backup path: not while starting, not once its own
/// listeners fail or its carrier is gone (fenced), not in maintenance, and not as the
/// holder; it advertises again once ready.
#[test]
fn only_a_ready_standby_advertises_a_backup_path() {
    let mut h = H::new(pair(B), Persisted::default());
    h.env_ok();
    assert!(!h.m.advertises_backup(), "starting (Init): none");
    h.lease(Some(A), 1);
    h.run(2_000, &[active(A, 200, 1)], Some(true));
    assert_eq!(h.role(), Role::Standby);
    assert!(h.m.advertises_backup(), "a ready standby advertises one");
    h.listeners(false);
    assert!(!h.m.advertises_backup(), "its listeners down: not ready, none");
    h.listeners(true);
    assert!(h.m.advertises_backup());
    h.carrier(false);
    h.run(2_100, &[active(A, 200, 1)], Some(true));
    assert_eq!(h.role(), Role::Fenced);
    assert!(!h.m.advertises_backup(), "fenced: none");
    h.carrier(true);
    h.run(30_000, &[active(A, 200, 1)], Some(true));
    assert_eq!(h.role(), Role::Standby);
    assert!(h.m.advertises_backup(), "back once the carrier settled");
    h.cmd(Command::Maintenance { on: true, force: false });
    assert!(!h.m.advertises_backup(), "in maintenance: none");

    // The holder never does.
    let a = active_a_with_b(3);
    assert!(a.m.holds_vips() && !a.m.advertises_backup());
}
