//! Draining a planned move: the member that handed the VIPs over keeps them — as local
//! addresses it no longer answers ARP/ND for — for `drain_ms`, and says so in its
//! heartbeats; the new holder forwards the segments of TCP flows it does not know to it
//! while it hears it say so. Established connections keep working through the new holder
//! until the drain ends; new ones are the new holder's at once.
//!
//! Old holder: from the commit of a handover that will drain its heartbeats say
//! `draining` (it still holds the VIPs then); the completed handover gives the VIPs up with
//! [`Action::DrainVips`] instead of `RemoveVips` and the I/O layer answers
//! [`Input::DrainStarted`]; a drain the I/O layer could not start stops the `draining` (a
//! new holder never forwards to a member without the addresses: it would route the
//! segments back). The drain ends with `RemoveVips` at its deadline, on a new
//! configuration, or — without one — when this member takes the VIPs back (`AddVips`).
//! Unplanned moves never drain: the old holder is gone.
//!
//! New holder: [`Action::Forward`] names the heard peer that drains while this member
//! holds the VIPs — emitted before the VIPs are added when it accepts the commit — and
//! `None` once it stops saying so, falls silent, or this member gives the VIPs up.
//!
//! A stopping agent ([`crate::Input::Stopping`]) ends both sides and says so in a
//! last heartbeat at once: a new holder that forwarded to it stops then, not a heartbeat
//! timeout later (its forwarder's copies would meet no address there; see the `nft`
//! module on loops).

use super::state::{Drain, Machine, OpPhase};
use crate::io::{Action, Event, Reason};
use crate::types::{Millis, NodeId, Role};

impl Machine {
    /// Gives the VIPs up after a completed planned handover to `to`: drained when the
    /// configuration asks for it, removed otherwise.
    pub(super) fn release_after_handover(
        &mut self,
        now: Millis,
        role: Role,
        reason: Reason,
        to: NodeId,
        out: &mut Vec<Action>,
    ) {
        let before = out.len();
        self.release(now, role, reason, out);
        let drain_ms = self.t().drain_ms;
        if drain_ms == 0 {
            return;
        }
        // The release's removal becomes a drain (same place in the action order).
        let Some(pos) = out[before..].iter().position(|a| matches!(a, Action::RemoveVips(_))) else {
            return;
        };
        if let Action::RemoveVips(vips) = &mut out[before + pos] {
            let vips = std::mem::take(vips);
            out[before + pos] = Action::DrainVips { vips, to: to.clone() };
            self.draining.drain = Some(Drain { to, until: now.plus(drain_ms), started: false });
        }
    }

    /// The I/O layer's answer to `DrainVips`.
    pub(super) fn on_drain_started(&mut self, now: Millis, ok: bool, detail: String, out: &mut Vec<Action>) {
        let Some(d) = self.draining.drain.as_mut() else {
            return;
        };
        if ok {
            d.started = true;
            let peer = d.to.clone();
            let left = d.until.since(now);
            self.pacing.advert_now = true;
            let detail = format!("keeps the VIPs for connections established here for {left} ms; {peer} forwards them");
            out.push(Action::Report(Event::Drain { started: true, peer, detail }));
        } else {
            // The I/O layer removed the VIPs itself; the new holder must stop forwarding
            // here at once.
            let peer = d.to.clone();
            self.draining.drain = None;
            self.pacing.advert_now = true;
            let detail = format!("could not keep the VIPs for a drain ({detail}): removed at once");
            out.push(Action::Report(Event::Drain { started: false, peer, detail }));
        }
    }

    /// The agent stops: the drain ends (the VIPs leave `lo`), forwarding stops, and the
    /// heartbeat of this step says so.
    pub(super) fn on_stopping(&mut self, out: &mut Vec<Action>) {
        self.draining.stopping = true;
        self.end_drain("the agent stops: connections still open lose their path", true, out);
        self.forward_to(None, out);
        self.pacing.advert_now = true;
    }

    /// Ends this member's drain, if any: `remove` the VIPs (its deadline, a new
    /// configuration), or not (the VIPs were just taken back).
    pub(super) fn end_drain(&mut self, why: &str, remove: bool, out: &mut Vec<Action>) {
        let Some(d) = self.draining.drain.take() else {
            return;
        };
        if remove {
            out.push(Action::RemoveVips(self.vip_ids()));
        }
        if d.started {
            self.pacing.advert_now = true;
            out.push(Action::Report(Event::Drain { started: false, peer: d.to, detail: why.to_owned() }));
        }
    }

    /// Every step: the drain's deadline (old holder) and whom to forward to (new holder).
    pub(super) fn eval_drain(&mut self, now: Millis, out: &mut Vec<Action>) {
        if self.draining.drain.as_ref().is_some_and(|d| now >= d.until) {
            self.end_drain("the drain time is over: connections still open lose their path", true, out);
        }
        let want = if self.holding && !self.draining.stopping {
            (0..self.peers.len())
                .find(|&i| self.heard_advert(i, now).is_some_and(|a| a.draining))
                .map(|i| self.peers[i].node.clone())
        } else {
            None
        };
        self.forward_to(want, out);
    }

    /// Forwards to `to` (or stops), if that changes anything.
    pub(super) fn forward_to(&mut self, to: Option<NodeId>, out: &mut Vec<Action>) {
        if to != self.draining.forwarding {
            self.draining.forwarding = to.clone();
            out.push(Action::Forward { to });
        }
    }

    /// Whether this member's heartbeats say it drains: from the commit of a handover that
    /// will drain (the VIPs are still on its interface) through the drain itself (on
    /// `lo`). The new holder forwards to it only while it says so, and it says so only
    /// while the VIPs are local addresses here — else the forwarded segments would be
    /// routed back.
    pub(super) fn drain_advertised(&self) -> bool {
        if self.draining.stopping {
            return false;
        }
        let committed_drain = self.t().drain_ms > 0
            && self
                .ops
                .op
                .as_ref()
                .is_some_and(|op| matches!(op.phase, OpPhase::Committed { .. }) && op.origin.drains());
        committed_drain || self.draining.drain.is_some()
    }

    /// When the drain ends (for the tick schedule and the status).
    pub(super) fn drain_until(&self) -> Option<Millis> {
        self.draining.drain.as_ref().map(|d| d.until)
    }
}
