//! Folding inputs into the machine's state (decisions follow in `evaluate`).

use std::collections::BTreeSet;

use super::state::{CasPurpose, ListenerTrack, Machine};
use crate::advert::Advert;
use crate::config::{CARRIER_STABLE_MAX_FACTOR, Config};
use crate::io::{Action, Alarm, CasResult, Command, Input, Reason, RejectReason};
use crate::status::LeaseView;
use crate::types::{Link, MAX_EPOCH, Millis, NodeId, PathId, ProbeResult, Role, VipId};

impl Machine {
    pub(super) fn handle(&mut self, now: Millis, input: Input, out: &mut Vec<Action>) {
        match input {
            Input::Tick => {}
            Input::Advert { path, msg } => self.on_advert(now, path, msg, out),
            Input::AdvertRejected { reason, from, .. } => self.on_rejected(now, reason, from, out),
            Input::PeerProbe { vip, result } => self.on_peer_probe(now, &vip, result),
            Input::LocalProbe { vip, port, up } => self.on_local_probe(now, &vip, port, up),
            Input::Carrier { link, up } => self.on_carrier(now, link, up),
            Input::Gateway { reachable } => self.gateway = reachable,
            Input::LocalVips { present } => self.on_local_vips(now, present, out),
            Input::LeaseObserved { holder, epoch } => self.on_lease(now, holder, epoch, out),
            Input::LeaseRenewed { holder, epoch } => self.on_lease_renewed(now, holder, epoch),
            Input::LeaseUnreachable => self.store.lease_stale = true,
            Input::LeaseConfirmed { at } => {
                self.store.confirmed_at = Some(self.store.confirmed_at.map_or(at, |c| c.max(at)));
            }
            Input::CasResult(r) => self.on_cas(now, r, out),
            Input::Traffic { bytes_per_sec } => self.on_traffic(now, bytes_per_sec),
            Input::Conflict { vip, foreign_mac } => self.on_conflict(now, &vip, foreign_mac, out),
            Input::Command(c) => self.on_command(now, c, out),
            Input::ConfigChanged(c) => self.on_config(now, *c, out),
            Input::DrainStarted { ok, detail } => self.on_drain_started(now, ok, detail, out),
            Input::Stopping => self.on_stopping(out),
        }
    }

    fn on_advert(&mut self, now: Millis, path: PathId, msg: Advert, out: &mut Vec<Action>) {
        if msg.sender == self.cfg.local {
            return;
        }
        let Some(pi) = self.cfg.paths.iter().position(|p| *p == path) else {
            return;
        };
        let Some(i) = self.peer_index(&msg.sender) else {
            return;
        };
        let commit_epoch = match &msg.op {
            Some(crate::advert::OpMsg { kind: crate::advert::OpKind::Commit { epoch, .. }, .. }) => *epoch,
            _ => 0,
        };
        if msg.epoch > MAX_EPOCH || commit_epoch > MAX_EPOCH {
            // No havip member sends such an epoch (its state file refuses one): believing it
            // would lock the pair at the top of the domain. Not even "heard".
            self.ignored_adverts = self.ignored_adverts.saturating_add(1);
            return;
        }
        let was_heard = self.peer_heard(i, now);
        let until = now.plus(self.timeout_for(u64::from(msg.interval_ms)));
        {
            let p = &mut self.peers[i];
            if let Some(slot) = p.last_heard.get_mut(pi) {
                *slot = Some(now);
            }
            if let Some(slot) = p.heard_until.get_mut(pi) {
                *slot = Some(until);
            }
            if !was_heard {
                p.heard_since = Some(now);
            }
        }
        // A peer that held the VIPs and now says it gave them up (the loser of two holders,
        // an old holder whose handover or drain ended) may likewise have sent from the
        // virtual MAC until a moment ago.
        let gave_up = !msg.holds_vips && self.peers[i].advert.as_ref().is_some_and(|a| a.holds_vips);
        if (!was_heard || gave_up) && self.holding && self.role == Role::Active && !self.catch_up {
            // A member heard again — its cables are back, a partition healed, it started —
            // may have sent frames from the pair's virtual MAC moments ago (the kernel's
            // multicast listener reports as its links came up, before it learnt that it no
            // longer holds), and the switches learnt its port for that MAC; or clients
            // learnt it from a holder that answered there meanwhile. The holder announces
            // at once, whatever its last burst: without it the switch sent the VIP's
            // traffic to that member until the next refresh (about a second).
            self.pacing.last_burst = Some(now);
            out.push(Action::Announce { kind: crate::types::AnnounceKind::Burst });
        }
        self.heard_any_peer = true;
        if msg.holds_vips {
            self.seen_holder = true;
        }
        if msg.protocol_major != self.cfg.protocol.major {
            let detail = format!(
                "{} speaks protocol {}.{}, this member {}.{}",
                msg.sender, msg.protocol_major, msg.protocol_minor, self.cfg.protocol.major, self.cfg.protocol.minor
            );
            self.raise(Alarm::VersionMismatch, detail, out);
        }
        self.bump_epoch(msg.epoch);
        let op = msg.op.clone();
        self.peers[i].advert = Some(msg);
        // The planned-handover protocol first: a target that became Active under our
        // commit completes the operation (rather than counting as a rival).
        self.check_op_completion(now, i, out);
        if let Some(op) = op {
            self.on_op_msg(now, i, &op, out);
        }
    }

    fn on_rejected(&mut self, now: Millis, reason: RejectReason, from: Option<NodeId>, out: &mut Vec<Action>) {
        match reason {
            RejectReason::KeyMismatch => {
                self.timers.key_mismatch_at = Some(now);
                if let Some(p) = self.peers.iter_mut().find(|p| from.as_ref() == Some(&p.node)) {
                    p.key_mismatch_at = Some(now);
                }
                self.raise(Alarm::KeyMismatch, "heartbeats failing HMAC verification arrive".to_owned(), out);
            }
            RejectReason::ClockSkew => {
                self.timers.clock_skew_at = Some(now);
                self.raise(Alarm::ClockSkew, "heartbeats rejected for clock skew arrive".to_owned(), out);
            }
            RejectReason::Replay => {
                self.timers.replay_at = Some(now);
                self.raise(
                    Alarm::HeartbeatReplay,
                    "every heartbeat of a member is refused as a replay: it cannot be heard".to_owned(),
                    out,
                );
            }
            RejectReason::Malformed | RejectReason::UnknownSender => {}
        }
    }

    fn vip_index(&self, vip: &VipId) -> Option<usize> {
        self.cfg.vips.iter().position(|v| &v.id == vip)
    }

    fn on_peer_probe(&mut self, now: Millis, vip: &VipId, result: ProbeResult) {
        let Some(vi) = self.vip_index(vip) else {
            return;
        };
        let tr = &mut self.probes[vi];
        match result {
            ProbeResult::Up => {
                tr.last_up = Some(now);
                tr.clear_failures();
            }
            ProbeResult::Down => {
                if tr.fail_count == 0 {
                    tr.fail_first = Some(now);
                }
                tr.fail_count = tr.fail_count.saturating_add(1);
                tr.fail_last = Some(now);
            }
        }
    }

    fn on_local_probe(&mut self, now: Millis, vip: &VipId, port: u16, up: bool) {
        let Some(vi) = self.vip_index(vip) else {
            return;
        };
        let Some(pi) = self.cfg.vips[vi].listener_ports().position(|p| p == port) else {
            return;
        };
        let slot = &mut self.listeners[vi][pi];
        if slot.is_none_or(|l| l.up != up) {
            *slot = Some(ListenerTrack { up, since: now });
        }
    }

    fn on_local_vips(&mut self, now: Millis, present: BTreeSet<VipId>, out: &mut Vec<Action>) {
        self.local_vips = Some(present);
        let ours = self.local_pair_vips();
        if self.role == Role::Init && !self.boot.adoption_decided {
            self.boot.adoption_decided = true;
            // Agent restart on the active (rolling upgrade): the VIPs are still on the
            // interface, so keep them instead of causing an outage. A reboot finds none.
            // The state file may be lost or say Standby (deleted, restored from a backup):
            // the VIPs on the interface are then the evidence, and keeping them is safe
            // because the adoption is tentative: during the init listen a holder with a
            // newer or equal epoch (or a Lease naming another holder under a newer one)
            // makes this member give them up, and it holds them under the epoch of its
            // state (0 when lost), which loses against any real takeover later. Not while
            // in maintenance: a member in maintenance holds nothing.
            let was_holder = matches!(self.boot.boot_last_role, Role::Active | Role::Demoting);
            if !ours.is_empty() && (was_holder || !self.maintenance) {
                self.holding = true;
                self.held_epoch = self.boot.boot_epoch;
                self.pacing.advert_now = true;
            }
        }
        if self.holding {
            let missing = self.missing_vips();
            if missing.is_empty() {
                self.vip_missing_since = None;
            } else if self.role != Role::Init {
                // (An adopting member adds what is missing only once its init listen has
                // ruled out a newer active.)
                self.vip_missing_since.get_or_insert(now);
                out.push(Action::AddVips(missing));
            }
        } else if !ours.is_empty() {
            // A member that must not hold pair VIPs removes them (only ours: labelled).
            out.push(Action::RemoveVips(ours));
        }
    }

    fn on_lease(&mut self, now: Millis, holder: Option<NodeId>, epoch: u64, out: &mut Vec<Action>) {
        if epoch > MAX_EPOCH {
            // leaseTransitions is an i32: a larger value is not a Lease's.
            return;
        }
        self.store.lease = Some(LeaseView { holder: holder.clone(), epoch });
        self.store.lease_stale = false;
        self.bump_epoch(epoch);
        let other = holder.as_ref().is_some_and(|h| h != &self.cfg.local);
        if self.role == Role::Init && self.holding && other && epoch >= self.held_epoch {
            // Adopting after a restart, but the pair moved on meanwhile (a re-adopting
            // member loses ties: its epoch may come from a lost or old state file).
            self.release(now, Role::Init, Reason::NewerEpochLease, out);
            return;
        }
        if self.holding && self.store.cas.is_none() {
            self.reconcile_lease(now, out);
        }
    }

    fn on_cas(&mut self, now: Millis, r: CasResult, out: &mut Vec<Action>) {
        let r = match r {
            CasResult::Ok { epoch } | CasResult::Conflict { epoch, .. } | CasResult::HolderAlive { epoch, .. }
                if epoch > MAX_EPOCH =>
            {
                CasResult::Unavailable
            }
            r => r,
        };
        let pending = self.store.cas.take();
        let me = self.cfg.local.clone();
        match r {
            CasResult::Ok { epoch } => {
                // A newer write may have been observed before this answer arrived (the
                // watch and the write are separate paths): the answer does not roll it back.
                let newer = self.store.lease.as_ref().is_some_and(|l| l.epoch > epoch);
                if !newer {
                    self.store.lease = Some(LeaseView { holder: Some(me), epoch });
                }
                self.store.lease_stale = false;
                self.bump_epoch(epoch);
                if let Some(c) = self.store.claim.clone() {
                    if c.epoch == epoch && newer {
                        self.abandon_claim(now, Reason::LeaseConflict, out);
                    } else if c.epoch == epoch {
                        self.claim_won(now, c.reason, out);
                    }
                } else if self.holding {
                    self.reconcile_lease(now, out);
                }
            }
            CasResult::Conflict { holder, epoch } => {
                if self.store.lease.as_ref().is_none_or(|l| l.epoch <= epoch) {
                    self.store.lease = Some(LeaseView { holder: holder.clone(), epoch });
                }
                self.store.lease_stale = false;
                self.bump_epoch(epoch);
                if let Some(c) = self.store.claim.clone() {
                    if holder.as_ref() == Some(&me) && epoch == c.epoch {
                        self.claim_won(now, c.reason, out);
                    } else if epoch >= c.epoch {
                        // Someone else took the pair under this epoch or a newer one.
                        self.abandon_claim(now, Reason::LeaseConflict, out);
                    } else {
                        // The Lease is behind what we expected: retry against what it reads.
                        let retries = pending.map_or(0, |p| p.retries);
                        if retries < 3 {
                            self.send_cas(c.epoch, epoch, CasPurpose::Claim, now, out);
                            if let Some(p) = self.store.cas.as_mut() {
                                p.retries = retries + 1;
                            }
                        } else {
                            self.on_cas_unavailable(now, out);
                        }
                    }
                } else if self.holding {
                    self.reconcile_lease(now, out);
                }
            }
            CasResult::HolderAlive { holder: _, epoch } => {
                // The witness heard a member holding the VIPs a moment ago; the record is
                // unchanged (what the reads show). Not proof enough to wait
                // `lease_alive_ms`: the last read may have come just before that member
                // died, after the last heartbeat this member heard. Back off a heartbeat
                // timeout instead (the claim is given up as lost); a holder that is alive
                // renews meanwhile, and its renewals keep this member from claiming again.
                self.store.lease_stale = false;
                self.bump_epoch(epoch);
                if self.store.claim.is_some() {
                    self.abandon_claim(now, Reason::LeaseConflict, out);
                } else if self.holding {
                    // A holder reconciling (after a handover, or both sides holding after
                    // a partition): again at an observation a heartbeat interval from now.
                    self.store.reconcile_backoff_until = Some(now.plus(self.t().heartbeat_interval_ms));
                    self.reconcile_lease(now, out);
                }
            }
            CasResult::Unavailable => {
                self.store.lease_stale = true;
                if self.store.claim.is_some() {
                    self.on_cas_unavailable(now, out);
                }
            }
        }
    }

    fn on_traffic(&mut self, now: Millis, bps: Option<u64>) {
        self.traffic_at = Some(now);
        let threshold = match &self.cfg.failback {
            crate::config::FailbackPolicy::Automatic(p) => p.quiet_threshold_bps,
            crate::config::FailbackPolicy::Manual => crate::config::AutoFailback::default().quiet_threshold_bps,
        };
        match bps {
            Some(b) if b < threshold => {
                self.quiet_since.get_or_insert(now);
            }
            // Active or unknown traffic: the quiet window starts over.
            _ => self.quiet_since = None,
        }
    }

    fn on_conflict(&mut self, now: Millis, vip: &VipId, mac: [u8; 6], out: &mut Vec<Action>) {
        // During a planned handover both members hold the VIPs for a moment
        // (make-before-break), and an ARP answer from that overlap can arrive after it.
        // Such a "conflict" is the pair itself: it must neither raise the alarm nor make
        // the old active re-announce (which would pull clients back to it just before it
        // removes the address).
        let settled = self.last_vip_change.is_none_or(|t| now.since(t) >= self.t().reannounce_min_ms);
        if self.role != Role::Active || self.ops.op.is_some() || self.ops.tgt.is_some() || !settled {
            return;
        }
        self.conflict_last = Some(now);
        self.conflict_macs.insert(vip.clone(), mac);
        let detail = format!(
            "{vip} answered by {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
        );
        self.raise(Alarm::VipConflict, detail, out);
        if self.holding {
            let min = self.t().reannounce_min_ms;
            if self.pacing.last_burst.is_none_or(|t| now.since(t) >= min) {
                self.pacing.last_burst = Some(now);
                out.push(Action::Announce { kind: crate::types::AnnounceKind::Burst });
            }
        }
    }

    fn on_command(&mut self, now: Millis, c: Command, out: &mut Vec<Action>) {
        match c {
            Command::PlannedFailover { id, target } => {
                if self.remember_id(id) {
                    self.operator_failover(now, id, target, false, out);
                }
            }
            Command::ForcedFailover { id, target } => {
                if self.remember_id(id) {
                    self.operator_failover(now, id, target, true, out);
                }
            }
            Command::PairFailover { id, target, forced } => {
                // Only the holder answers for the pair (see `Command::PairFailover`).
                let executes = self.holding && target.as_ref() != Some(&self.cfg.local);
                if executes && self.remember_id(id) {
                    self.operator_failover(now, id, target, forced, out);
                }
            }
            Command::Maintenance { on, force } => {
                self.maintenance = on;
                self.maintenance_force = on && force;
                if !on {
                    self.clear_alarm(Alarm::MaintenancePending, out);
                }
                self.pacing.advert_now = true;
            }
            Command::ClearSuspension => {
                self.flap.suspended = false;
                self.flap.auto_moves.clear();
                self.clear_alarm(Alarm::Suspended, out);
                self.pacing.advert_now = true;
            }
            Command::ResumeFailback => {
                self.failback_paused = false;
                self.pacing.advert_now = true;
            }
            Command::SetPaused(p) => self.paused = p,
        }
    }

    fn on_config(&mut self, now: Millis, cfg: Config, out: &mut Vec<Action>) {
        // A drain of the old configuration's VIPs ends before anything changes.
        self.end_drain("a new configuration ends the drain", true, out);
        let in_pair = cfg.priority_of(&cfg.local).is_some();
        if !in_pair && self.role != Role::Unpaired {
            // Left the pair: give up what we hold under the old configuration first.
            self.release(now, Role::Unpaired, Reason::Unpaired, out);
        }
        let old_order: Vec<VipId> = self.cfg.vips.iter().map(|v| v.id.clone()).collect();
        let old: BTreeSet<VipId> = old_order.iter().cloned().collect();
        let new: BTreeSet<VipId> = cfg.vips.iter().map(|v| v.id.clone()).collect();
        self.cfg_error = cfg.validate().err();
        self.my_priority = cfg.priority_of(&cfg.local).unwrap_or(0);
        self.in_pair = in_pair;
        self.cfg = cfg;
        self.rebuild_for_config(&old_order);
        match self.cfg_error.clone() {
            Some(e) => self.raise(Alarm::Misconfigured, e.to_string(), out),
            None => self.clear_alarm(Alarm::Misconfigured, out),
        }
        if in_pair && self.role == Role::Unpaired {
            self.set_role(Role::Standby, Reason::Paired, now, out);
        }
        if self.holding {
            let added: Vec<VipId> = new.difference(&old).cloned().collect();
            let removed: Vec<VipId> = old.difference(&new).cloned().collect();
            if !removed.is_empty() {
                out.push(Action::RemoveVips(removed));
            }
            if !added.is_empty() {
                out.push(Action::AddVips(added));
                out.push(Action::Announce { kind: crate::types::AnnounceKind::Burst });
            }
        }
        self.pacing.advert_now = true;
    }

    /// Folds a carrier observation into the dampening state.
    pub(super) fn on_carrier(&mut self, now: Millis, link: Link, up: bool) {
        let (was_lost, was_settling) = (self.carrier_lost(), self.carrier_settling(now));
        match link {
            Link::Data => self.link.carrier_data = Some(up),
            Link::Vip => self.link.carrier_vip = Some(up),
        }
        let base = self.t().carrier_stable_ms;
        if self.carrier_lost() && !was_lost {
            // Lost again before the last return was stable: the link flaps, so it waits
            // twice as long next time; lost after a stable stretch: the base time again.
            self.link.carrier_required_ms = if was_settling {
                let max = base.saturating_mul(CARRIER_STABLE_MAX_FACTOR);
                self.link.carrier_required_ms.saturating_mul(2).min(max)
            } else {
                base
            };
            self.link.carrier_returned_at = None;
            self.link.carrier_lost_at = Some(now);
        } else if self.carrier_ok() && self.link.carrier_lost_at.is_some() {
            self.link.carrier_returned_at = Some(now);
            self.link.carrier_lost_at = None;
        }
    }
}
