//! The make-before-break planned handover, both sides.
//!
//! Initiator (the active): `Prepare{to}` → on `PrepareAck` re-validate, then
//! `Commit{to, epoch+1}` and Demoting (still holding) → on `Confirm` (or the target heard
//! Active under the commit epoch, or the Lease naming it) remove the VIPs, Standby. No ack
//! or no confirm within the confirm timeout → abort; after a commit the abort takes the
//! VIPs back under a fresh epoch (newer than the one committed, so the target yields by the
//! two-actives rule even if it never sees the `Abort`) and re-announces.
//!
//! Target (a standby): `Prepare` → `PrepareAck` or `Refuse`; `Commit` → CAS the Lease (in
//! parallel, not waited for: the active's commit already serialises the move), add the
//! VIPs, burst, Active, `Confirm`; `Abort` after accepting → give the VIPs back.

use super::state::{CasPurpose, Machine, Need, Op, OpPhase, Origin, TargetOp, TgtPhase};
use crate::advert::{AUTO_OP_BIT, OpKind, OpMsg, RefuseReason};
use crate::io::{Action, Event, Reason};
use crate::types::{AnnounceKind, Millis, NodeId, Role};

/// How many operator operation ids are remembered to ignore repeats.
const REMEMBERED_IDS: usize = 256;

impl Machine {
    fn next_auto_id(&mut self) -> u64 {
        self.ops.op_seq = self.ops.op_seq.wrapping_add(1);
        AUTO_OP_BIT | ((self.epoch & 0x7fff_ffff_ffff) << 16) | u64::from(self.ops.op_seq)
    }

    fn sticky_life(&self) -> u64 {
        self.t().confirm_timeout_ms.saturating_mul(2)
    }

    /// Starts a handover of the whole member to peer `target`.
    pub(super) fn start_op(
        &mut self,
        now: Millis,
        id: Option<u64>,
        origin: Origin,
        target: usize,
        forced: bool,
        out: &mut Vec<Action>,
    ) {
        let id = match id {
            Some(id) => id,
            None => self.next_auto_id(),
        };
        let to = self.peers[target].node.clone();
        self.ops.op = Some(Op { id, origin, to, phase: OpPhase::Preparing, started: now });
        self.ops.sticky = None;
        self.pacing.advert_now = true;
        if forced {
            self.commit(now, out);
        }
    }

    fn commit(&mut self, now: Millis, out: &mut Vec<Action>) {
        let lease_epoch = self.store.lease.as_ref().map_or(0, |l| l.epoch);
        // Two fresh epochs: the commit's, and a newer one to take the VIPs back under if
        // the target does not confirm.
        let base = self.epoch.max(self.held_epoch).max(lease_epoch);
        let Some(epoch) = Self::fresh_epoch(base).filter(|e| Self::fresh_epoch(*e).is_some()) else {
            self.abort_op(now, "the pair epoch is at the top of its domain: no handover is possible", out);
            return;
        };
        let Some(op) = self.ops.op.as_mut() else {
            return;
        };
        op.phase = OpPhase::Committed { epoch, at: now };
        let reason = op.origin.reason();
        self.set_role(Role::Demoting, reason, now, out);
        self.pacing.advert_now = true;
    }

    pub(super) fn complete_op(&mut self, now: Millis, out: &mut Vec<Action>) {
        let Some(op) = self.ops.op.take() else {
            return;
        };
        let OpPhase::Committed { epoch, .. } = op.phase else {
            self.ops.op = Some(op);
            return;
        };
        self.bump_epoch(epoch);
        if matches!(op.origin, Origin::Operator { .. }) {
            // A manual or forced move pauses automatic failback until resumed.
            self.failback_paused = true;
        }
        let to = self.out_role(Role::Standby);
        if op.origin.drains() {
            self.release_after_handover(now, to, op.origin.reason(), op.to.clone(), out);
        } else {
            self.release(now, to, op.origin.reason(), out);
        }
        self.ops.handover_retry_at = None;
        self.report_op(op.id, true, format!("handed over to {}", op.to), out);
    }

    fn abort_op(&mut self, now: Millis, message: &str, out: &mut Vec<Action>) {
        let Some(op) = self.ops.op.take() else {
            return;
        };
        // The abort tells the target to give the VIPs up — unless this member gave them up
        // too (a committed handover aborted without carrier): the target may hold them
        // under the commit, and must keep them (an abort heard once the links return left
        // the pair without a holder until a takeover, 3 s).
        let took_back = match op.phase {
            OpPhase::Committed { epoch, .. } => self.abort_committed(epoch, now, out),
            OpPhase::Preparing => true,
        };
        if took_back {
            self.ops.sticky = Some((OpMsg { id: op.id, kind: OpKind::Abort }, now.plus(self.sticky_life())));
        }
        self.pacing.advert_now = true;
        if !matches!(op.origin, Origin::Operator { .. }) {
            self.ops.handover_retry_at = Some(now.plus(self.t().handover_retry_ms));
        }
        self.report_op(op.id, false, message.to_owned(), out);
    }

    /// The VIPs after a committed handover was aborted (this member still holds them):
    /// whether it took them back (false: it gave them up).
    fn abort_committed(&mut self, epoch: u64, now: Millis, out: &mut Vec<Action>) -> bool {
        if self.carrier_lost() {
            // Without carrier the VIPs serve nobody here. Taking them back under an epoch
            // newer than the commit would only outrank the target, which may well hold them
            // under the commit (its Confirm lost with the link): once the links return, the
            // adverts this member queued meanwhile (held in the neighbour queue) would make
            // that holder yield to a member that no longer holds. Give them up instead; the
            // target holds under the commit, or takes over by its own rules.
            self.bump_epoch(epoch);
            let to = self.out_role(Role::Standby);
            self.release(now, to, Reason::CarrierLost, out);
            return false;
        }
        // Take the VIPs back under an epoch newer than the committed one.
        let lease_epoch = self.store.lease.as_ref().map_or(0, |l| l.epoch);
        let expected = self.lease_expected(self.held_epoch);
        // The commit left a fresh epoch for this unless the Lease moved on meanwhile;
        // then keep the held one (a target holding under the commit wins by epoch).
        let e = Self::fresh_epoch(self.epoch.max(epoch).max(lease_epoch)).unwrap_or(self.held_epoch);
        self.epoch = self.epoch.max(e);
        self.held_epoch = e;
        self.set_role(Role::Active, Reason::Aborted, now, out);
        self.pacing.last_burst = Some(now);
        out.push(Action::Announce { kind: AnnounceKind::Burst });
        if self.store.cas.is_none() {
            self.send_cas(e, expected, CasPurpose::Reconcile, now, out);
        }
        true
    }

    /// Drops the operation because another holder with a newer epoch won (no takeback).
    pub(super) fn abort_op_superseded(&mut self, out: &mut Vec<Action>) {
        if let Some(op) = self.ops.op.take() {
            self.report_op(
                op.id,
                false,
                "superseded: another member holds the VIPs under a newer epoch".to_owned(),
                out,
            );
        }
    }

    pub(super) fn op_timeouts(&mut self, now: Millis, out: &mut Vec<Action>) {
        let Some(op) = self.ops.op.as_ref() else {
            return;
        };
        let limit = self.t().confirm_timeout_ms;
        match op.phase {
            OpPhase::Preparing if now.since(op.started) >= limit => {
                self.abort_op(now, "the target did not answer the prepare in time", out);
            }
            OpPhase::Committed { at, .. } if now.since(at) >= limit => {
                self.abort_op(now, "the target did not confirm in time; took the VIPs back", out);
            }
            _ => {}
        }
    }

    /// Initiator: the target heard Active holding under the committed epoch completes the
    /// operation even when the `Confirm` itself was lost.
    pub(super) fn check_op_completion(&mut self, now: Millis, i: usize, out: &mut Vec<Action>) {
        let Some(op) = self.ops.op.as_ref() else {
            return;
        };
        let OpPhase::Committed { epoch, .. } = op.phase else {
            return;
        };
        let p = &self.peers[i];
        if p.node != op.to {
            return;
        }
        if let Some(a) = &p.advert
            && a.role == Role::Active
            && a.holds_vips
            && a.epoch == epoch
        {
            self.complete_op(now, out);
        }
    }

    pub(super) fn on_op_msg(&mut self, now: Millis, i: usize, msg: &OpMsg, out: &mut Vec<Action>) {
        if self.catch_up && !matches!(msg.kind, OpKind::Confirm | OpKind::Abort) {
            // Queued during a stall and maybe stale: a current operation repeats its message
            // in every advert, so it is acted on once the queue is processed. A confirm or
            // an abort only ever gives VIPs up.
            return;
        }
        let from = self.peers[i].node.clone();
        if let Some(op) = self.ops.op.as_ref()
            && op.to == from
            && op.id == msg.id
        {
            match (&msg.kind, op.phase) {
                (OpKind::PrepareAck, OpPhase::Preparing) => {
                    if let Some(why) = self.revalidate_op(now) {
                        self.abort_op(now, why, out);
                    } else {
                        self.commit(now, out);
                    }
                }
                (OpKind::Refuse { reason }, _) => {
                    let m = format!("the target refused: {}", reason.as_str());
                    self.abort_op(now, &m, out);
                }
                (OpKind::Confirm, OpPhase::Committed { .. }) => self.complete_op(now, out),
                _ => {}
            }
            return;
        }
        let me = self.cfg.local.clone();
        match &msg.kind {
            OpKind::Prepare { to } if *to == me => self.on_prepare(now, i, msg.id),
            OpKind::Commit { to, epoch } if *to == me => {
                self.on_commit(now, i, msg.id, *epoch, out);
            }
            OpKind::Abort => {
                let Some(t) = self.ops.tgt.as_ref() else {
                    return;
                };
                if t.id != msg.id || t.from != from {
                    return;
                }
                // Given up only for an initiator that took the VIPs back: one that gave
                // them up too (an agent of an earlier release sent the abort then) leaves
                // them here, where the commit put them.
                let took_back = self.peers[i].advert.as_ref().is_some_and(|a| a.holds_vips);
                if let TgtPhase::Accepted { epoch } = t.phase
                    && self.holding
                    && self.held_epoch == epoch
                    && took_back
                {
                    let to = self.out_role(Role::Standby);
                    self.release(now, to, Reason::AbortedByPeer, out);
                }
                self.ops.tgt = None;
            }
            _ => {}
        }
    }

    /// Re-validation on the initiator right before the commit (re-check the
    /// conditions at the moment of acting). `Some(reason)` = abort.
    fn revalidate_op(&self, now: Millis) -> Option<&'static str> {
        let op = self.ops.op.as_ref()?;
        let Some(i) = self.peer_index(&op.to) else {
            return Some("the target left the pair");
        };
        let need = match op.origin {
            Origin::Operator { forced: true } => Need::Forced,
            Origin::Operator { forced: false } | Origin::Maintenance => Need::Planned,
            Origin::Auto(Reason::Failback) => {
                if self.failback_conditions(now) != Some(i) {
                    return Some("failback conditions no longer hold");
                }
                Need::Planned
            }
            Origin::Auto(Reason::VipUnhealthy | Reason::ListenerDown) => {
                if self.pair_suspended(now) || self.paused {
                    return Some("discretionary moves are suspended or paused");
                }
                Need::Urgent
            }
            Origin::Auto(_) => Need::Urgent,
        };
        self.candidate_problem(i, now, need)
    }

    fn prepare_refusal(&self, i: usize) -> Option<RefuseReason> {
        let a = self.peers[i].advert.as_ref()?;
        if self.role != Role::Standby {
            return Some(RefuseReason::NotStandby);
        }
        if self.cfg_error.is_some() {
            return Some(RefuseReason::Misconfigured);
        }
        if self.maintenance {
            return Some(RefuseReason::Maintenance);
        }
        if self.cut_off() || !self.carrier_ok() {
            return Some(RefuseReason::CutOff);
        }
        if a.protocol_major != self.cfg.protocol.major {
            return Some(RefuseReason::ProtocolMismatch);
        }
        if a.config_revision != self.cfg.config_revision {
            return Some(RefuseReason::ConfigRevision);
        }
        if !self.ready_all() || self.carrier_settling(self.last_now) {
            return Some(RefuseReason::NotReady);
        }
        None
    }

    fn on_prepare(&mut self, now: Millis, i: usize, id: u64) {
        let from = self.peers[i].node.clone();
        if self.ops.tgt.as_ref().is_some_and(|t| t.id == id && t.from == from) {
            return;
        }
        if self.ops.sticky.as_ref().is_some_and(|(m, _)| m.id == id) {
            return;
        }
        let busy = self.ops.tgt.is_some() || self.ops.op.is_some();
        let refusal = if busy { Some(RefuseReason::Busy) } else { self.prepare_refusal(i) };
        self.refuse_or(now, id, refusal, |m| {
            m.ops.tgt = Some(TargetOp { id, from, phase: TgtPhase::Acked, at: now });
        });
    }

    fn refuse_or(&mut self, now: Millis, id: u64, refusal: Option<RefuseReason>, accept: impl FnOnce(&mut Machine)) {
        self.pacing.advert_now = true;
        match refusal {
            Some(reason) => {
                self.ops.sticky = Some((OpMsg { id, kind: OpKind::Refuse { reason } }, now.plus(self.sticky_life())));
            }
            None => {
                self.ops.sticky = None;
                accept(self);
            }
        }
    }

    fn on_commit(&mut self, now: Millis, i: usize, id: u64, epoch: u64, out: &mut Vec<Action>) {
        let from = self.peers[i].node.clone();
        if self
            .ops
            .tgt
            .as_ref()
            .is_some_and(|t| t.id == id && t.from == from && matches!(t.phase, TgtPhase::Accepted { .. }))
        {
            return;
        }
        if self.ops.sticky.as_ref().is_some_and(|(m, _)| m.id == id) {
            return;
        }
        let initiator_major = self.peers[i].advert.as_ref().map(|a| a.protocol_major);
        let busy_other = self.ops.tgt.as_ref().is_some_and(|t| t.id != id) || self.ops.op.is_some();
        let refusal = if self.role != Role::Standby {
            Some(RefuseReason::NotStandby)
        } else if self.maintenance {
            Some(RefuseReason::Maintenance)
        } else if self.cut_off() || !self.carrier_ok() {
            Some(RefuseReason::CutOff)
        } else if self.carrier_settling(now) {
            Some(RefuseReason::NotReady)
        } else if self.cfg_error.is_some() {
            Some(RefuseReason::Misconfigured)
        } else if initiator_major != Some(self.cfg.protocol.major) {
            Some(RefuseReason::ProtocolMismatch)
        } else if epoch <= self.epoch {
            Some(RefuseReason::StaleEpoch)
        } else if busy_other {
            Some(RefuseReason::Busy)
        } else {
            None
        };
        if let Some(reason) = refusal {
            self.refuse_or(now, id, Some(reason), |_| {});
            return;
        }
        let previous = self.epoch;
        self.epoch = epoch;
        self.held_epoch = epoch;
        self.ops.tgt = Some(TargetOp { id, from, phase: TgtPhase::Accepted { epoch }, at: now });
        self.ops.sticky = None;
        let operator = Self::is_operator_id(id);
        if operator {
            self.failback_paused = true;
        }
        let reason = if operator { Reason::HandoverAccepted } else { Reason::AutoHandoverAccepted };
        // An initiator that will drain says so from its commit on (it still holds the VIPs):
        // forward its connections before the VIPs are announced here, so that no segment of
        // one reaches this member unforwarded (a handshake straddling the move included).
        if self.peers[i].advert.as_ref().is_some_and(|a| a.draining) {
            self.forward_to(Some(self.peers[i].node.clone()), out);
        }
        self.set_role(Role::Active, reason, now, out);
        self.acquire(now, reason, out);
        if self.store.cas.is_none() {
            let expected = self.lease_expected(previous);
            self.send_cas(epoch, expected, CasPurpose::Reconcile, now, out);
        }
    }

    /// Operator planned or forced failover (sent to the active member).
    pub(super) fn operator_failover(
        &mut self,
        now: Millis,
        id: u64,
        target: Option<NodeId>,
        forced: bool,
        out: &mut Vec<Action>,
    ) {
        if !(self.role == Role::Active && self.holding) {
            self.report_op(id, false, "this member is not the active member".to_owned(), out);
            return;
        }
        if self.ops.op.is_some() || self.ops.tgt.is_some() {
            self.report_op(id, false, "another operation is in progress".to_owned(), out);
            return;
        }
        let need = if forced { Need::Forced } else { Need::Planned };
        let idx = match target {
            Some(t) => match self.peer_index(&t) {
                Some(i) => i,
                None => {
                    let m = format!("{t} is not a peer in this pair");
                    self.report_op(id, false, m, out);
                    return;
                }
            },
            None => match self.best_candidate(now, need) {
                Some(i) => i,
                None => {
                    let m = "no peer can take the VIPs now".to_owned();
                    self.report_op(id, false, m, out);
                    return;
                }
            },
        };
        if let Some(why) = self.candidate_problem(idx, now, need) {
            self.report_op(id, false, why.to_owned(), out);
            return;
        }
        self.start_op(now, Some(id), Origin::Operator { forced }, idx, forced, out);
    }

    pub(super) fn report_op(&mut self, id: u64, ok: bool, message: String, out: &mut Vec<Action>) {
        if Self::is_operator_id(id) {
            out.push(Action::Report(Event::OperationResult { id, ok, message }));
        }
    }

    /// Remembers an operator id; false if it was seen before (the command is ignored).
    pub(super) fn remember_id(&mut self, id: u64) -> bool {
        if self.ops.seen_ids.contains(&id) {
            return false;
        }
        if self.ops.seen_ids.len() >= REMEMBERED_IDS {
            self.ops.seen_ids.pop_front();
        }
        self.ops.seen_ids.push_back(id);
        true
    }

    pub(super) fn is_operator_id(id: u64) -> bool {
        id & AUTO_OP_BIT == 0
    }
}
