//! Start-up, election and unplanned takeover (with the Lease claim); the way back to
//! Standby from Fenced and Maintenance.
//!
//! One rule set covers the election when nobody is active and the takeover of a lost
//! active: a standby acquires the VIPs only if nobody is heard holding or claiming them, the
//! data plane through the VIPs is proven down (or there is no data-plane target at all),
//! its own links have carrier and its gateway is not unreachable, it is outside the
//! hold-down and the boot hold, every heard peer has been heard steadily for the init
//! listen, and no better candidate is heard (or that candidate had its priority-staggered
//! turn). Heartbeat silence alone never suffices while a data-plane target exists.

use super::state::{CasPending, CasPurpose, Claim, Machine};
use crate::io::{Action, Reason};
use crate::status::{Blocker, ProbeState};
use crate::types::{AnnounceKind, Millis, Role};

impl Machine {
    pub(super) fn eval_init(&mut self, now: Millis, out: &mut Vec<Action>) {
        if self.holding {
            // Adopting after an agent restart: a peer holding under a newer epoch wins;
            // with quorum fencing, the votes must confirm it within a lease of the start.
            if !self.check_rival(now, out) && self.quorum_lost(now) {
                self.release(now, Role::Init, Reason::QuorumLost, out);
            }
        }
        let started = self.started_at.unwrap_or(now);
        if now.since(started) < self.t().init_listen_ms || self.local_vips.is_none() {
            return;
        }
        if self.holding {
            self.active_since = Some(now);
            self.set_role(Role::Active, Reason::Adopted, now, out);
            let missing = self.missing_vips();
            if !missing.is_empty() {
                out.push(Action::AddVips(missing));
            }
            out.push(Action::Announce { kind: AnnounceKind::Refresh });
            self.reconcile_lease(now, out);
        } else if self.maintenance {
            self.set_role(Role::Maintenance, Reason::MaintenanceOn, now, out);
        } else if self.cut_off() {
            self.set_role(Role::Fenced, Reason::Fenced, now, out);
        } else {
            self.set_role(Role::Standby, Reason::Startup, now, out);
        }
    }

    pub(super) fn eval_standby(&mut self, now: Millis, out: &mut Vec<Action>) {
        if self.maintenance {
            self.set_role(Role::Maintenance, Reason::MaintenanceOn, now, out);
            return;
        }
        if self.cut_off() {
            self.set_role(Role::Fenced, Reason::Fenced, now, out);
            return;
        }
        self.mirror_failback_paused(now);
        if let Ok(reason) = self.takeover_check(now) {
            self.claim(now, reason, out);
        }
    }

    /// Standbys follow the active's automatic-failback pause, so the flag survives moves.
    fn mirror_failback_paused(&mut self, now: Millis) {
        let mut best: Option<(u64, bool)> = None;
        for i in 0..self.peers.len() {
            if let Some(a) = self.heard_advert(i, now)
                && a.holds_vips
                && best.is_none_or(|(e, _)| a.epoch > e)
            {
                best = Some((a.epoch, a.failback_paused));
            }
        }
        if let Some((_, p)) = best {
            self.failback_paused = p;
        }
    }

    /// Aggregate data-plane verdict over the VIPs that have probe ports.
    pub(super) fn probe_state(&self, now: Millis) -> ProbeState {
        self.probe_state_within(now, self.t().probe_fresh_ms)
    }

    /// [`Machine::probe_state`] with results up to `fresh_ms` old counting as current.
    pub(super) fn probe_state_within(&self, now: Millis, fresh_ms: u64) -> ProbeState {
        let t = self.t();
        let needed = t.probe_failures;
        let mut targets = 0usize;
        let mut down = 0usize;
        for (v, tr) in self.cfg.vips.iter().zip(&self.probes) {
            if v.probe_ports.is_empty() {
                continue;
            }
            targets += 1;
            if tr.fail_count == 0 {
                if tr.last_up.is_some_and(|u| now.since(u) <= fresh_ms) {
                    return ProbeState::Up;
                }
            } else if let (Some(first), Some(last)) = (tr.fail_first, tr.fail_last)
                && tr.fail_count >= needed
                && last.since(first) >= t.probe_span_ms
                && now.since(last) <= fresh_ms
                // Nothing answered within a heartbeat timeout: a probe that succeeded
                // that recently shows a live data plane, and the failures since are loss
                // on the path (the standby's own lossy cable, the fifth 60-minute chaos
                // run) rather than a dead holder. A dead holder's last answer is older
                // than its heartbeats' silence, so a real takeover waits for nothing more.
                && tr.last_up.is_none_or(|u| now.since(u) >= t.heartbeat_timeout_ms)
            {
                down += 1;
            }
        }
        if targets == 0 {
            ProbeState::NoTarget
        } else if down == targets {
            ProbeState::Down
        } else {
            ProbeState::Pending
        }
    }

    /// Every condition for acquiring the VIPs except the priority stagger; on success the
    /// reason to report and this member's rank among the heard candidates.
    /// `as_claimer` re-validates an ongoing claim (role Active, not holding yet).
    pub(super) fn takeover_conditions(&self, now: Millis, as_claimer: bool) -> Result<(Reason, u64), Blocker> {
        let role_ok = if as_claimer { self.role == Role::Active && !self.holding } else { self.role == Role::Standby };
        if !role_ok {
            return Err(Blocker::NotStandby);
        }
        if self.cfg_error.is_some() {
            return Err(Blocker::Misconfigured);
        }
        if !as_claimer && self.epoch_exhausted() {
            return Err(Blocker::EpochExhausted);
        }
        if self.maintenance {
            return Err(Blocker::Maintenance);
        }
        if !self.carrier_ok() {
            return Err(Blocker::CarrierDown);
        }
        if self.link.carrier_returned_at.is_some_and(|t| now.since(t) < self.t().carrier_stable_ms) {
            // Only the base time here, however often the link flapped: when nobody holds the
            // VIPs, a member serving them beats none (the doubling keeps a flapping member
            // from being chosen as a handover target while a stable one holds them).
            return Err(Blocker::CarrierSettling);
        }
        if self.gateway == Some(false) {
            return Err(Blocker::GatewayUnreachable);
        }
        if self.version_mismatch() {
            return Err(Blocker::VersionMismatch);
        }
        if !as_claimer && self.in_hold_down(now) {
            return Err(Blocker::HoldDown);
        }
        if !as_claimer && self.store.claim_backoff_until.is_some_and(|u| now < u) {
            return Err(Blocker::LeaseConflictBackoff);
        }
        for i in 0..self.peers.len() {
            if let Some(a) = self.heard_advert(i, now)
                && (a.holds_vips || matches!(a.role, Role::Active | Role::Demoting))
            {
                return Err(Blocker::PeerActive);
            }
        }
        if self.holder_alive_unheard(now).is_some() {
            return Err(Blocker::PeerAliveViaLease);
        }
        if self.cfg.lease_vote_required && (self.store.lease_stale || self.store.lease.is_none()) {
            return Err(Blocker::WitnessUnreachable);
        }
        if !as_claimer && self.ops.tgt.is_some() {
            return Err(Blocker::OperationInProgress);
        }
        if self.boot_hold_until().is_some_and(|u| now < u) {
            return Err(Blocker::BootHold);
        }
        // Steady hearing: a higher-priority peer heard for less than the init listen may
        // still turn out to be the better candidate (or active); wait for it. So may one
        // that is still in its own Init listen (it started later): wait until it leaves
        // Init, for at most two listens. Lower-priority peers cannot outrank this member,
        // so they never delay it.
        let listen = self.t().init_listen_ms;
        // In the initial election (nobody has held the VIPs yet) a better peer gets two
        // listens in every case: its first adverts may still say carrier or gateway
        // unknown, or its heartbeats may pause while its agent starts (seen on a loaded
        // machine: the lower-priority member elected itself 100 ms after its listen).
        let electing = !self.seen_holder;
        for i in 0..self.peers.len() {
            if self.peers[i].priority <= self.my_priority {
                continue;
            }
            if !self.peer_heard(i, now) {
                let last = self.peers[i].last_heard.iter().flatten().max().copied();
                if electing && last.is_some_and(|t| now.since(t) < 2 * listen) {
                    return Err(Blocker::PeerNotSteady);
                }
                continue;
            }
            let since = self.peers[i].heard_since;
            if since.is_none_or(|s| now.since(s) < listen) {
                return Err(Blocker::PeerNotSteady);
            }
            let in_init = self.heard_advert(i, now).is_some_and(|a| a.role == Role::Init && !a.holds_vips);
            if (in_init || electing) && since.is_some_and(|s| now.since(s) < 2 * listen) {
                return Err(Blocker::PeerNotSteady);
            }
        }
        let probe = self.probe_state(now);
        #[cfg(test)]
        let probe = if self.test_skip_probe { ProbeState::Down } else { probe };
        let unknown = match probe {
            ProbeState::Up => return Err(Blocker::DataPlaneUp),
            ProbeState::Pending => return Err(Blocker::DataPlanePending),
            ProbeState::Down => false,
            ProbeState::NoTarget => true,
        };
        if unknown && self.pair_suspended(now) {
            return Err(Blocker::SuspendedUnknownDataPlane);
        }
        if unknown && self.paused {
            return Err(Blocker::PausedUnknownDataPlane);
        }
        let major = self.cfg.protocol.major;
        let mut rank = 0u64;
        for i in 0..self.peers.len() {
            // A peer still in its Init listen is a candidate too: it becomes a standby
            // within the listen, and counting it keeps two members that finish their
            // listens a few milliseconds apart from both electing themselves.
            if let Some(a) = self.heard_advert(i, now)
                && matches!(a.role, Role::Standby | Role::Init)
                && a.priority > self.my_priority
                && !a.maintenance
                && a.carrier_ok
                && a.gateway != Some(false)
                && a.protocol_major == major
                && !(unknown && a.suspended)
            {
                rank += 1;
            }
        }
        let reason = if self.seen_holder { Reason::Takeover } else { Reason::Election };
        Ok((reason, rank))
    }

    /// The priority stagger per rank: one heartbeat interval when taking over a lost active
    /// (speed matters, and the better candidate's claim is heard within it); one Init listen
    /// for the initial election (nothing is served yet, and a better candidate that
    /// started a little later, or is still collecting its first probe results, must win).
    fn stagger_unit(&self, reason: Reason) -> u64 {
        if reason == Reason::Election { self.t().init_listen_ms } else { self.t().heartbeat_interval_ms }
    }

    /// Conditions plus the priority stagger (rank × heartbeat interval after the conditions
    /// first held, so a better candidate's claim is heard first).
    fn takeover_check(&mut self, now: Millis) -> Result<Reason, Blocker> {
        match self.takeover_conditions(now, false) {
            Err(b) => {
                self.store.candidate_since = None;
                Err(b)
            }
            Ok((reason, rank)) => {
                let since = *self.store.candidate_since.get_or_insert(now);
                let wait = rank.saturating_mul(self.stagger_unit(reason));
                if now.since(since) < wait { Err(Blocker::Staggered) } else { Ok(reason) }
            }
        }
    }

    /// The blocker as reported in status (no state change).
    pub(super) fn current_blocker(&self, now: Millis) -> Option<Blocker> {
        if self.holding {
            return None;
        }
        if self.store.claim.is_some() {
            return self.takeover_conditions(now, true).err();
        }
        match self.takeover_conditions(now, false) {
            Err(b) => Some(b),
            Ok((reason, rank)) => {
                let wait = rank.saturating_mul(self.stagger_unit(reason));
                match self.store.candidate_since {
                    Some(s) if now.since(s) >= wait => None,
                    _ if rank == 0 => None,
                    _ => Some(Blocker::Staggered),
                }
            }
        }
    }

    /// Decides to take the VIPs: new epoch (persisted first), role Active (claiming), CAS.
    fn claim(&mut self, now: Millis, reason: Reason, out: &mut Vec<Action>) {
        let lease_epoch = self.store.lease.as_ref().map_or(0, |l| l.epoch);
        let expected = self.lease_expected(self.epoch);
        let Some(new_epoch) = Self::fresh_epoch(self.epoch.max(lease_epoch)) else {
            return;
        };
        self.epoch = new_epoch;
        self.held_epoch = new_epoch;
        self.store.claim = Some(Claim { epoch: new_epoch, reason });
        self.store.candidate_since = None;
        self.set_role(Role::Active, reason, now, out);
        self.send_cas(new_epoch, expected, CasPurpose::Claim, now, out);
    }

    pub(super) fn send_cas(
        &mut self,
        new_epoch: u64,
        expected: u64,
        purpose: CasPurpose,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        self.persist_if_changed(out);
        if let Some(max) = self.cfg.lease_max_step
            && new_epoch > expected.saturating_add(max)
        {
            // The store refuses a step this large (the admission policy bounds an agent's
            // Lease writes), and would at every try: nothing is sent. A claim goes on as
            // when the store does not answer (the standalone rules); a holder keeps its
            // VIPs; either way `LeaseBehind` tells (`check_lease_behind`), and the next
            // Lease observation within reach is caught up as usual.
            if purpose == CasPurpose::Claim {
                self.on_cas_unavailable(now, out);
            }
            return;
        }
        self.store.cas = Some(CasPending { purpose, sent_at: now, retries: 0 });
        out.push(Action::CasLease { holder: self.cfg.local.clone(), new_epoch, expected_epoch: expected });
    }

    /// The store did not answer (or is unreachable): take over anyway if the same strict
    /// conditions still hold, with the local epoch; the Lease is reconciled when a
    /// `LeaseObserved` shows the store is back.
    pub(super) fn on_cas_unavailable(&mut self, now: Millis, out: &mut Vec<Action>) {
        self.store.lease_stale = true;
        let Some(c) = self.store.claim.clone() else {
            return;
        };
        if self.catch_up {
            self.store.claim_granted = Some(false);
            return;
        }
        match self.takeover_conditions(now, true) {
            Ok(_) => self.claim_won(now, c.reason, out),
            Err(_) => self.abandon_claim(now, Reason::ClaimAbandoned, out),
        }
    }

    /// The Lease names us under the claimed epoch: take the VIPs, unless this member became
    /// unfit meanwhile (maintenance, cut off): then the Lease is left to be overwritten by
    /// the next claimer.
    pub(super) fn claim_won(&mut self, now: Millis, reason: Reason, out: &mut Vec<Action>) {
        if self.catch_up {
            // Settled after the catch-up: a newer holder or Lease may still be queued.
            self.store.claim_granted = Some(true);
            return;
        }
        if self.maintenance {
            self.abandon_claim(now, Reason::MaintenanceOn, out);
        } else if !self.carrier_ok() || self.gateway == Some(false) {
            self.abandon_claim(now, Reason::Fenced, out);
        } else {
            self.acquire(now, reason, out);
        }
    }

    pub(super) fn abandon_claim(&mut self, now: Millis, reason: Reason, out: &mut Vec<Action>) {
        self.store.claim = None;
        self.store.claim_granted = None;
        if reason == Reason::LeaseConflict {
            self.store.claim_backoff_until = Some(now.plus(self.t().heartbeat_timeout_ms));
        }
        if self.store.cas.as_ref().is_some_and(|c| c.purpose == CasPurpose::Claim) {
            self.store.cas = None;
        }
        let to = if self.maintenance { Role::Maintenance } else { Role::Standby };
        self.set_role(to, reason, now, out);
    }

    pub(super) fn eval_fenced(&mut self, now: Millis, out: &mut Vec<Action>) {
        if self.maintenance {
            self.set_role(Role::Maintenance, Reason::MaintenanceOn, now, out);
        } else if !self.cut_off() {
            // Probe failures from while this member was cut off say nothing about the
            // holder: fresh ones are needed (the sixth 60-minute chaos run: a standby
            // whose own frames were dropped unfenced and took over a serving holder in the
            // same step, on the failures its own loss had caused).
            self.probes.iter_mut().for_each(super::state::ProbeTrack::clear_failures);
            self.set_role(Role::Standby, Reason::Unfenced, now, out);
        }
    }

    pub(super) fn eval_maintenance(&mut self, now: Millis, out: &mut Vec<Action>) {
        if !self.maintenance {
            self.set_role(Role::Standby, Reason::MaintenanceOff, now, out);
        }
    }
}
