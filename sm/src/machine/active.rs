//! What a member holding the VIPs decides: two actives, Lease reconcile, maintenance,
//! carrier and gateway moves (fencing), unhealthy VIPs and listeners, automatic failback.

use super::partition::NewerLease;
use super::state::{CasPurpose, Machine, Need, OpPhase, Origin};
use crate::config::FailbackPolicy;
use crate::io::{Action, Alarm, Reason};
use crate::types::{AnnounceKind, Millis, Role};

/// How often a holder probes for a foreign holder of its VIPs while a peer's heartbeats
/// fail verification (see `yield_to_unverified_peer`).
pub const UNVERIFIED_PROBE_MS: u64 = 2_000;

impl Machine {
    pub(super) fn eval_active(&mut self, now: Millis, out: &mut Vec<Action>) {
        if !self.holding {
            if self.store.claim.is_some() {
                if self.maintenance {
                    self.abandon_claim(now, Reason::MaintenanceOn, out);
                } else if self.cut_off() {
                    self.abandon_claim(now, Reason::Fenced, out);
                } else if !self.check_rival(now, out) {
                    // Claiming: a better claimer or holder heard meanwhile wins (above). A
                    // claim granted during a catch-up after a stall is settled now.
                    self.settle_granted_claim(now, out);
                }
            } else {
                self.set_role(Role::Standby, Reason::ClaimAbandoned, now, out);
            }
            return;
        }
        if self.check_rival(now, out) {
            return;
        }
        if self.yield_to_unverified_peer(now, out) {
            return;
        }
        if self.fence_without_quorum(now, out) {
            return;
        }
        if self.store.lease_disowned_since.is_some() {
            // Waiting to see whether the peer a newer Lease names acts on it.
            self.reconcile_lease(now, out);
            if !self.holding {
                return;
            }
        }
        if self.ops.op.is_some() {
            self.op_timeouts(now, out);
            return;
        }
        if self.role == Role::Demoting {
            // Not reachable (Demoting always has an operation); keep the role honest.
            self.set_role(Role::Active, Reason::Aborted, now, out);
        }
        let retry_ok = self.ops.handover_retry_at.is_none_or(|t| now >= t);

        // Maintenance: hand over first, then stay out; the only member leaves only forced.
        if self.maintenance {
            if retry_ok && let Some(t) = self.best_candidate(now, Need::Planned) {
                self.start_op(now, None, Origin::Maintenance, t, false, out);
                return;
            }
            if self.maintenance_force {
                self.release(now, Role::Maintenance, Reason::MaintenanceOn, out);
                return;
            }
            self.raise(
                Alarm::MaintenancePending,
                "maintenance requested but no ready standby can take the VIPs; use force".to_owned(),
                out,
            );
        } else {
            self.clear_alarm(Alarm::MaintenancePending, out);
        }

        // Own link lost carrier: hand over if a standby is ready, else fence (give up). With
        // nobody eligible (for example the peer's own link is still settling after a flap)
        // the VIPs stay for the dampening time first: a short loss then moves nothing.
        if self.carrier_lost() {
            if retry_ok && let Some(t) = self.best_candidate(now, Need::Urgent) {
                self.start_op(now, None, Origin::Auto(Reason::CarrierLost), t, false, out);
                return;
            }
            if self.link.carrier_lost_at.is_some_and(|t| now.since(t) < self.t().carrier_stable_ms) {
                return;
            }
            let to = self.out_role(Role::Fenced);
            self.release(now, to, Reason::CarrierLost, out);
            return;
        }

        // Gateway unreachable: hand over to a peer that still reaches its own; fence when
        // nobody is heard (we are the one cut off); keep when every heard peer lost its
        // gateway too (the gateway itself is down).
        if self.gateway == Some(false) {
            if retry_ok && let Some(t) = self.best_gateway_candidate(now) {
                self.start_op(now, None, Origin::Auto(Reason::GatewayLost), t, false, out);
                return;
            }
            if !self.any_peer_heard(now) {
                let to = self.out_role(Role::Fenced);
                self.release(now, to, Reason::GatewayLost, out);
            }
            return;
        }

        // Discretionary: a VIP missing from the kernel or a listener down for too long.
        if let Some(reason) = self.unhealthy_reason(now) {
            let unhealthy = reason == Reason::VipUnhealthy;
            let allowed = !self.pair_suspended(now) && !self.paused && retry_ok;
            if allowed && let Some(t) = self.best_candidate(now, Need::Urgent) {
                self.start_op(now, None, Origin::Auto(reason), t, false, out);
                return;
            }
            let detail = if unhealthy {
                "a VIP is missing from the interface and no standby can take the VIPs"
            } else {
                "a listener is down and no standby can take the VIPs"
            };
            self.raise(Alarm::VipUnhealthy, detail.to_owned(), out);
        } else {
            self.clear_alarm(Alarm::VipUnhealthy, out);
        }

        if retry_ok && let Some(t) = self.failback_target(now) {
            self.start_op(now, None, Origin::Auto(Reason::Failback), t, false, out);
        }
    }

    /// Two holders that cannot verify each other's heartbeats (different keys: a key change
    /// gone wrong before both members restarted) each see the other alive — its address
    /// sends heartbeats that fail verification, and another MAC answers for the VIP — but
    /// neither can read the other's epoch. The one of lower priority gives the VIPs up
    /// (`UnverifiedPeer`); as a standby it does not take them back while the data plane
    /// answers. Both signals are needed: anybody on the segment can send datagrams from a
    /// member's address, and a foreign MAC alone may be any misconfigured host.
    ///
    /// While some peer is unverifiable this way, the holder probes for a foreign holder of
    /// its VIPs every [`UNVERIFIED_PROBE_MS`] (an ARP probe / neighbour solicitation, with
    /// the self-check): two holders that were partitioned find each other without waiting
    /// for an announcement.
    fn yield_to_unverified_peer(&mut self, now: Millis, out: &mut Vec<Action>) -> bool {
        let (reject_clear, conflict_clear) = (self.t().reject_alarm_clear_ms, self.t().conflict_clear_ms);
        let unverified = |m: &Machine, i: usize| {
            m.peers[i].key_mismatch_at.is_some_and(|k| now.since(k) < reject_clear) && m.heard_advert(i, now).is_none()
        };
        if self.role != Role::Active || self.ops.op.is_some() || self.catch_up {
            return false;
        }
        let any = (0..self.peers.len()).any(|i| unverified(self, i));
        if any && self.timers.unverified_probe_at.is_none_or(|p| now.since(p) >= UNVERIFIED_PROBE_MS) {
            self.timers.unverified_probe_at = Some(now);
            out.push(Action::SelfCheck { conflict_probe: true });
        }
        let conflict = self.conflict_last.is_some_and(|c| now.since(c) < conflict_clear);
        let stronger = (0..self.peers.len()).any(|i| self.peers[i].priority > self.my_priority && unverified(self, i));
        if !conflict || !stronger {
            return false;
        }
        let to = self.out_role(Role::Standby);
        self.release(now, to, Reason::UnverifiedPeer, out);
        true
    }

    /// Why the held VIPs are unhealthy, if they are: one missing from the kernel, or a
    /// listener down, for too long.
    pub(super) fn unhealthy_reason(&self, now: Millis) -> Option<Reason> {
        let t = self.t();
        if self.vip_missing_since.is_some_and(|s| now.since(s) >= t.vip_unhealthy_ms) {
            return Some(Reason::VipUnhealthy);
        }
        let listener_down = self
            .listeners
            .iter()
            .flatten()
            .any(|l| l.is_some_and(|l| !l.up && now.since(l.since) >= t.listener_down_ms));
        listener_down.then_some(Reason::ListenerDown)
    }

    /// A claim granted while the machine caught up after a stall: a Lease naming another
    /// holder under a newer epoch drops it; otherwise the Lease's grant takes the VIPs, and
    /// an unavailable store's goes through the local rules again.
    fn settle_granted_claim(&mut self, now: Millis, out: &mut Vec<Action>) {
        let Some(by_lease) = self.store.claim_granted.take() else {
            return;
        };
        let Some(c) = self.store.claim.clone() else {
            return;
        };
        let me = self.cfg.local.clone();
        if self.store.lease.as_ref().is_some_and(|l| l.holder.as_ref() != Some(&me) && l.epoch >= c.epoch) {
            self.abandon_claim(now, Reason::NewerEpochLease, out);
        } else if by_lease {
            self.claim_won(now, c.reason, out);
        } else {
            self.on_cas_unavailable(now, out);
        }
    }

    /// Quorum fencing ([`crate::Config::quorum_lease_ms`]): whether this holder's last
    /// confirmation by a majority of the votes is older than the quorum lease.
    pub(super) fn quorum_lost(&self, now: Millis) -> bool {
        // Before any confirmation, the lease runs from the start (an adopting holder's).
        let since = self.store.confirmed_at.or(self.started_at);
        self.holding && self.cfg.quorum_lease_ms.is_some_and(|l| since.is_none_or(|c| now.since(c) >= l))
    }

    /// Gives the VIPs up when [`Self::quorum_lost`] (also during a catch-up after a stall:
    /// giving up is always allowed then); a planned operation in flight ends unsuccessfully.
    pub(super) fn fence_without_quorum(&mut self, now: Millis, out: &mut Vec<Action>) -> bool {
        if !self.quorum_lost(now) {
            return false;
        }
        if let Some(op) = self.ops.op.take() {
            let msg = "no majority of the members' votes confirms this holder: it gave the VIPs up".to_owned();
            self.report_op(op.id, false, msg, out);
        }
        let to = self.out_role(Role::Standby);
        self.release(now, to, Reason::QuorumLost, out);
        true
    }

    /// Role to leave to when giving up: maintenance wins over `otherwise`, and a member
    /// that is cut off rests in Fenced rather than Standby.
    pub(super) fn out_role(&self, otherwise: Role) -> Role {
        if self.maintenance {
            Role::Maintenance
        } else if otherwise == Role::Standby && self.cut_off() {
            Role::Fenced
        } else {
            otherwise
        }
    }

    /// Two actives: compares (epoch, priority) with every heard peer that holds the VIPs
    /// (and, while this member is only claiming, also with peers that claim). Loses → gives
    /// up at once (returns true). A holder never yields to a mere claimer: it yields when
    /// the claimer holds, one advert later (make-before-break; no gap while the claimer
    /// waits for its CAS). Wins against a holder → re-announces (rate-limited); a tie on the
    /// epoch is broken by priority and the winner moves to a fresh epoch so the Lease can
    /// name it unambiguously.
    pub(super) fn check_rival(&mut self, now: Millis, out: &mut Vec<Action>) -> bool {
        let mine = (self.held_epoch, self.my_priority);
        let mut best: Option<u64> = None;
        let mut weaker_holder = false;
        let mut tie = false;
        let claiming = !self.holding;
        for i in 0..self.peers.len() {
            let Some(a) = self.heard_advert(i, now) else {
                continue;
            };
            let rival = a.holds_vips || (claiming && matches!(a.role, Role::Active | Role::Demoting));
            if !rival {
                continue;
            }
            // A member re-adopting the VIPs after a restart (still in Init) can prove its
            // epoch only from its state file, which may be lost or old: it loses a tie to a
            // holder that is not re-adopting, and such a holder keeps the VIPs on a tie
            // whatever the priorities. Two re-adopting members fall back to priority.
            let theirs_win = match (self.role == Role::Init, a.role == Role::Init) {
                (true, false) => a.epoch >= mine.0,
                (false, true) => a.epoch > mine.0,
                _ => (a.epoch, a.priority) > mine,
            };
            if theirs_win {
                best = Some(best.map_or(a.epoch, |b: u64| b.max(a.epoch)));
            } else if a.holds_vips {
                weaker_holder = true;
                tie |= a.epoch == self.held_epoch;
            }
        }
        if let Some(e) = best {
            self.bump_epoch(e);
            self.abort_op_superseded(out);
            if self.role == Role::Init {
                self.release(now, Role::Init, Reason::NewerEpochPeer, out);
            } else if self.holding {
                let to = self.out_role(Role::Standby);
                self.release(now, to, Reason::NewerEpochPeer, out);
            } else {
                self.abandon_claim(now, Reason::NewerEpochPeer, out);
            }
            return true;
        }
        if weaker_holder && self.holding && self.role != Role::Init && !self.catch_up {
            // At the top of the epoch domain the tie stays: the loser yields on priority
            // all the same.
            if tie && let Some(e) = Self::fresh_epoch(self.epoch.max(self.held_epoch)) {
                let expected = self.lease_expected(self.held_epoch);
                self.epoch = e;
                self.held_epoch = e;
                self.pacing.advert_now = true;
                if self.store.cas.is_none() {
                    self.send_cas(e, expected, CasPurpose::Reconcile, now, out);
                } else {
                    self.persist_if_changed(out);
                }
            }
            let min = self.t().reannounce_min_ms;
            if self.pacing.last_burst.is_none_or(|t| now.since(t) >= min) {
                self.pacing.last_burst = Some(now);
                self.pacing.advert_now = true;
                out.push(Action::Announce { kind: AnnounceKind::Burst });
            }
        }
        false
    }

    /// Brings the Lease in line with what this holder knows: a newer epoch naming another
    /// holder demotes at once; an older one is compare-and-swapped to this member.
    pub(super) fn reconcile_lease(&mut self, now: Millis, out: &mut Vec<Action>) {
        if !self.holding || self.store.cas.is_some() || self.role == Role::Init {
            return;
        }
        let Some(l) = self.store.lease.clone() else {
            return;
        };
        let me = self.cfg.local.clone();
        let mine = l.holder.as_ref() == Some(&me);
        if mine || l.epoch <= self.held_epoch {
            self.store.lease_disowned_since = None;
        }
        if mine && l.epoch == self.held_epoch {
            return;
        }
        if let Some(op) = &self.ops.op
            && let OpPhase::Committed { epoch, .. } = op.phase
            && l.holder.as_ref() == Some(&op.to)
            && l.epoch == epoch
        {
            // The target of our handover recorded itself: the handover happened.
            self.complete_op(now, out);
            return;
        }
        if !mine && l.epoch > self.held_epoch {
            match self.newer_lease(now, &l) {
                NewerLease::Wait => return,
                NewerLease::Reclaim => {
                    self.reclaim_lease(now, &l, out);
                    return;
                }
                NewerLease::Yield => {}
            }
            self.store.lease_disowned_since = None;
            self.bump_epoch(l.epoch);
            self.abort_op_superseded(out);
            let to = self.out_role(Role::Standby);
            self.release(now, to, Reason::NewerEpochLease, out);
            return;
        }
        if mine && l.epoch > self.held_epoch {
            // Written by an earlier incarnation of this member: hold under it.
            self.bump_epoch(l.epoch);
            self.held_epoch = l.epoch;
            self.pacing.advert_now = true;
            return;
        }
        if !mine
            && l.epoch == self.held_epoch
            && let Some(h) = &l.holder
            && self.cfg.priority_of(h).unwrap_or(0) > self.my_priority
        {
            self.abort_op_superseded(out);
            let to = self.out_role(Role::Standby);
            self.release(now, to, Reason::NewerEpochLease, out);
            return;
        }
        if self.store.reconcile_backoff_until.is_some_and(|u| now < u) {
            return;
        }
        if !mine && l.epoch == self.held_epoch {
            // Tie won on priority, or a Lease with no holder under our epoch: move to a
            // fresh epoch (every compare-and-swap raises the epoch; the Kubernetes
            // admission policy refuses one that does not), if the domain has one left.
            let Some(e) = Self::fresh_epoch(self.epoch.max(self.held_epoch)) else {
                return;
            };
            self.epoch = e;
            self.held_epoch = e;
            self.pacing.advert_now = true;
        }
        let (held, expected) = (self.held_epoch, l.epoch);
        self.send_cas(held, expected, CasPurpose::Reconcile, now, out);
    }

    /// Why peer `i` cannot take the VIPs under `need` (`None` = it can).
    pub(super) fn candidate_problem(&self, i: usize, now: Millis, need: Need) -> Option<&'static str> {
        let heard = match need {
            Need::Planned => self.peer_heard_all(i, now),
            Need::Urgent | Need::Forced => self.peer_heard(i, now),
        };
        if !heard {
            return Some(match need {
                Need::Planned => "the target is not heard on every path",
                _ => "the target is not heard",
            });
        }
        let Some(a) = self.peers[i].advert.as_ref() else {
            return Some("the target is not heard");
        };
        if a.role != Role::Standby {
            return Some("the target is not a standby");
        }
        if a.maintenance {
            return Some("the target is in maintenance");
        }
        if a.protocol_major != self.cfg.protocol.major {
            return Some("the target speaks another protocol major version");
        }
        if need == Need::Forced {
            return None;
        }
        if !a.carrier_ok || a.gateway == Some(false) {
            return Some("the target is cut off (carrier or gateway)");
        }
        if need == Need::Planned && a.config_revision != self.cfg.config_revision {
            return Some("the target runs another configuration revision");
        }
        if !a.ready_all {
            return Some("the target is not ready for every VIP");
        }
        None
    }

    /// Highest-priority peer that can take the VIPs under `need`.
    pub(super) fn best_candidate(&self, now: Millis, need: Need) -> Option<usize> {
        (0..self.peers.len())
            .filter(|&i| self.candidate_problem(i, now, need).is_none())
            .max_by_key(|&i| self.peers[i].priority)
    }

    fn best_gateway_candidate(&self, now: Millis) -> Option<usize> {
        (0..self.peers.len())
            .filter(|&i| self.candidate_problem(i, now, Need::Urgent).is_none())
            .filter(|&i| self.peers[i].advert.as_ref().is_some_and(|a| a.gateway == Some(true)))
            .max_by_key(|&i| self.peers[i].priority)
    }

    /// Automatic failback, decided by the active non-preferred member: the
    /// preferred member ready for the recovery window, the pair on this member for the
    /// minimum time, no quarantine, quiet traffic for the quiet window (unknown waits), not
    /// paused or suspended. Re-validated again just before the commit.
    pub(super) fn failback_target(&self, now: Millis) -> Option<usize> {
        if self.ops.op.is_some() || self.role != Role::Active {
            return None;
        }
        self.failback_conditions(now)
    }

    /// The failback conditions alone (also used to re-validate an ongoing failback right
    /// before its commit).
    pub(super) fn failback_conditions(&self, now: Millis) -> Option<usize> {
        let FailbackPolicy::Automatic(p) = &self.cfg.failback else {
            return None;
        };
        if !self.holding {
            return None;
        }
        if self.paused || self.failback_paused || self.pair_suspended(now) || self.maintenance {
            return None;
        }
        if self.quarantined(now) {
            return None;
        }
        let fresh = self.traffic_at.is_some_and(|t| now.since(t) <= self.t().traffic_stale_ms);
        let quiet = fresh && self.quiet_since.is_some_and(|q| now.since(q) >= p.quiet_window_ms);
        if !quiet {
            return None;
        }
        if self.active_since.is_none_or(|s| now.since(s) < p.min_on_nonpreferred_ms) {
            return None;
        }
        let pref = self.preferred_peer()?;
        let ready_since = self.peers[pref].ready_since?;
        if now.since(ready_since) < p.recovery_window_ms {
            return None;
        }
        if self.candidate_problem(pref, now, Need::Planned).is_some() {
            return None;
        }
        Some(pref)
    }
}
