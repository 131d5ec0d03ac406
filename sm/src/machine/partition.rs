//! A partition between the members while both still reach the Lease store (Kubernetes
//! mode), Lease writes that land late, and the alarms that tell of a partition or of the
//! store (`PeerSilent`, `LeaseBehind`, `WitnessUnreachable`).
//!
//! Heartbeat silence cannot tell a dead holder from one cut off from this member only.
//! The Lease can: a holder that cannot hear a peer renews the Lease (same holder and
//! epoch, a fresh renew time) about once a second, as long as it is fit to serve; a
//! member that cannot hear the holder but has seen it renew the Lease within
//! `lease_alive_ms` does not take the VIPs from it and raises `PeerPartition`. A dead
//! holder stops renewing, so the takeover waits at most `lease_alive_ms` after its last
//! renewal — and a holder that was hearing its peer until it died never renewed at all.
//!
//! A claim whose compare-and-swap timed out can still land afterwards, naming a member
//! that gave the claim up. The holder, hearing that member act as a standby, takes the
//! Lease back under a newer epoch instead of giving up the VIPs to nobody.

use super::state::{CasPurpose, Machine};
use crate::io::{Action, Alarm};
use crate::status::LeaseView;
use crate::types::{Millis, NodeId, Role};

/// What a holder does about a Lease naming a peer under a newer epoch.
pub(super) enum NewerLease {
    /// The peer acts as the holder (or cannot be heard): give up the VIPs.
    Yield,
    /// The peer is heard but has not shown yet whether it acts on the Lease: wait.
    Wait,
    /// The peer is heard as a standby that knows the Lease: take it back.
    Reclaim,
}

impl Machine {
    /// The Lease holder wrote the Lease again (a renewal) under `epoch`.
    pub(super) fn on_lease_renewed(&mut self, now: Millis, holder: NodeId, epoch: u64) {
        if holder == self.cfg.local || self.store.lease.as_ref().is_some_and(|l| l.epoch > epoch) {
            return;
        }
        self.store.lease_written = Some((holder, now));
    }

    /// The member the Lease names as holder, if it cannot be heard on any path but was
    /// seen renewing the Lease within `lease_alive_ms`. (A claim is no such proof: a
    /// holder that took the VIPs while it heard its peers, then died, is taken over at
    /// once. One that wins a claim while a peer is silent renews at once, and the member
    /// that lost the VIPs to it is in its hold-down meanwhile.)
    pub(super) fn holder_alive_unheard(&self, now: Millis) -> Option<NodeId> {
        if self.store.lease_stale {
            return None;
        }
        let h = self.store.lease.as_ref()?.holder.as_ref()?;
        if h == &self.cfg.local {
            return None;
        }
        let (written_by, at) = self.store.lease_written.as_ref()?;
        if written_by != h || now.since(*at) >= self.t().lease_alive_ms {
            return None;
        }
        let i = self.peer_index(h)?;
        if self.peer_heard(i, now) {
            return None;
        }
        // Only a renewal seen after the holder fell silent proves it alive now (with three
        // members it renews while a third one is silent, and may die right after; a
        // renewal it sent just before it died still arrives, so "silent" means a whole
        // heartbeat timeout without a word).
        if self.heard_until(i).is_some_and(|u| *at < u) {
            return None;
        }
        Some(h.clone())
    }

    /// After every evaluation: the holder renews the Lease while a peer is silent; a
    /// member that does not hold raises or clears `PeerPartition`.
    pub(super) fn settle_partition(&mut self, now: Millis, out: &mut Vec<Action>) {
        if self.holding {
            self.clear_alarm(Alarm::PeerPartition, out);
            self.renew_lease(now, out);
            return;
        }
        self.store.last_renew = None;
        match self.holder_alive_unheard(now) {
            Some(h) => self.raise(
                Alarm::PeerPartition,
                format!(
                    "{h} holds the Lease and keeps renewing it, but none of its heartbeats arrives on any \
                     path: the members are partitioned from each other; this member does not take the VIPs \
                     from it"
                ),
                out,
            ),
            None => self.clear_alarm(Alarm::PeerPartition, out),
        }
    }

    fn renew_lease(&mut self, now: Millis, out: &mut Vec<Action>) {
        let me = self.cfg.local.clone();
        let ours =
            self.store.lease.as_ref().is_some_and(|l| l.holder.as_ref() == Some(&me) && l.epoch == self.held_epoch);
        let silent = (0..self.peers.len()).any(|i| !self.peer_heard(i, now));
        if !ours || !silent || self.role != Role::Active || self.store.lease_stale || self.store.cas.is_some() {
            self.store.last_renew = None;
            return;
        }
        // A holder that wants out (or cannot serve) stops renewing, so that a peer it
        // cannot reach may take the VIPs after `lease_alive_ms`.
        let unfit = self.maintenance
            || self.ops.op.is_some()
            || !self.carrier_ok()
            || self.gateway == Some(false)
            || self.unhealthy_reason(now).is_some();
        if unfit {
            return;
        }
        if self.store.last_renew.is_some_and(|t| now.since(t) < self.t().lease_renew_ms) {
            return;
        }
        self.store.last_renew = Some(now);
        out.push(Action::RenewLease { holder: me, epoch: self.held_epoch });
    }

    /// A holder sees the Lease name peer `holder` under an epoch newer than its own.
    pub(super) fn newer_lease(&mut self, now: Millis, l: &LeaseView) -> NewerLease {
        let Some(i) = l.holder.as_ref().and_then(|h| self.peer_index(h)) else {
            return NewerLease::Yield;
        };
        // Its advert must be current: a quiet standby's last one can be a second old and
        // say nothing of a claim it made since (heard within the heartbeat timeout).
        let timeout = self.t().heartbeat_timeout_ms;
        let fresh = self.peers[i].last_heard.iter().any(|t| t.is_some_and(|t| now.since(t) < timeout));
        let Some(a) = self.peers[i].advert.as_ref().filter(|_| fresh) else {
            return NewerLease::Yield;
        };
        if a.holds_vips || matches!(a.role, Role::Active | Role::Demoting | Role::Init) {
            return NewerLease::Yield;
        }
        if a.epoch >= l.epoch {
            return NewerLease::Reclaim;
        }
        // Its adverts predate the Lease write: give it a heartbeat timeout to show
        // whether it acts on it (a claimer says Active before it writes).
        let since = *self.store.lease_disowned_since.get_or_insert(now);
        if now.since(since) < self.t().heartbeat_timeout_ms { NewerLease::Wait } else { NewerLease::Reclaim }
    }

    /// Takes the Lease back under a fresh epoch above `l`'s.
    pub(super) fn reclaim_lease(&mut self, now: Millis, l: &LeaseView, out: &mut Vec<Action>) {
        self.store.lease_disowned_since = None;
        self.bump_epoch(l.epoch);
        let e = self.epoch.max(self.held_epoch).saturating_add(1);
        self.epoch = e;
        self.held_epoch = e;
        self.pacing.advert_now = true;
        self.send_cas(e, l.epoch, CasPurpose::Reconcile, now, out);
    }

    /// `PeerSilent`: some peer has been silent on every path for a heartbeat timeout (since
    /// it was last heard, or since this agent started) after the init listen, while this
    /// member's own links and gateway are fine — so the silence is not explained by this
    /// member being cut off. Cleared when every peer is heard again, or when this member
    /// itself is cut off (then its own role and reason tell), or while authentic heartbeats
    /// arrive that are refused for clock skew (ClockSkew tells). Heartbeats that fail
    /// verification do not clear it: anybody can send those from a member's address, so
    /// they must not hide a silent peer; the detail says they arrive.
    pub(super) fn check_peer_silent(&mut self, now: Millis, out: &mut Vec<Action>) {
        let started = self.started_at.unwrap_or(now);
        // Authentic heartbeats refused for clock skew are no silence: ClockSkew tells.
        let rejected = self.alarms.contains(&Alarm::ClockSkew);
        let own_ok = self.carrier_ok() && self.gateway != Some(false) && !rejected;
        let listening = matches!(self.role, Role::Init | Role::Unpaired);
        let silent: Vec<(String, u64)> = if own_ok && !listening {
            let base = self.t().heartbeat_timeout_ms;
            self.peers
                .iter()
                .enumerate()
                .filter_map(|(i, p)| {
                    let last = p.last_heard.iter().flatten().max().copied().unwrap_or(started).max(started);
                    let quiet = now.since(last);
                    // Silent once its last heartbeat stopped counting (a quiet standby's
                    // counts longer), and never before a heartbeat timeout after the start.
                    let until = self.heard_until(i).unwrap_or(started).max(started.plus(base));
                    let unverified = p.key_mismatch_at.is_some_and(|t| now.since(t) < self.t().reject_alarm_clear_ms);
                    let name = if unverified {
                        format!("{} (its address sends heartbeats that fail verification)", p.node)
                    } else {
                        p.node.to_string()
                    };
                    (now >= until).then_some((name, quiet))
                })
                .collect()
        } else {
            Vec::new()
        };
        if silent.is_empty() {
            self.clear_alarm(Alarm::PeerSilent, out);
        } else {
            let who: Vec<String> = silent.iter().map(|(n, q)| format!("{n} for {q} ms")).collect();
            let detail = format!(
                "silent on every heartbeat path while this member's links and gateway are fine: {} \
                 (down, or partitioned from this member)",
                who.join(", ")
            );
            self.raise(Alarm::PeerSilent, detail, out);
        }
    }

    /// `LeaseBehind`: this member holds the VIPs under an epoch the store refuses to be
    /// raised to in one write ([`Config::lease_max_step`]), so the Lease does not record
    /// it. Cleared once the Lease is within reach (and caught up) or the member holds
    /// nothing.
    pub(super) fn check_lease_behind(&mut self, out: &mut Vec<Action>) {
        let behind = match (self.cfg.lease_max_step, &self.store.lease) {
            (Some(max), Some(l)) if self.holding && self.held_epoch > l.epoch.saturating_add(max) => {
                Some((max, l.epoch))
            }
            _ => None,
        };
        match behind {
            Some((max, lease)) => {
                let detail = format!(
                    "this member holds the VIPs under epoch {held}, {gap} above the pair Lease's {lease}: an agent \
                     may raise the Lease's epoch by at most {max} in one write, so it is not recorded there \
                     (heartbeats still settle who holds the VIPs; the Lease cannot arbitrate a partition between \
                     the members meanwhile). If the epoch is genuine, record it in the Lease by hand \
                     (leaseTransitions {held}, holderIdentity this node)",
                    held = self.held_epoch,
                    gap = self.held_epoch - lease,
                );
                self.raise(Alarm::LeaseBehind, detail, out);
            }
            None => self.clear_alarm(Alarm::LeaseBehind, out),
        }
    }

    /// `WitnessUnreachable`: takeovers need the Lease store's vote and the store did not
    /// answer its last read or write. Cleared by the next answer.
    pub(super) fn check_witness(&mut self, out: &mut Vec<Action>) {
        if self.cfg.lease_vote_required && self.store.lease_stale {
            let detail = if self.holding {
                "the witness does not answer: this member keeps the VIPs, but no member could take them \
                 over if it failed now"
            } else {
                "the witness does not answer: this member takes no VIPs over until it answers again"
            };
            self.raise(Alarm::WitnessUnreachable, detail.to_owned(), out);
        } else {
            self.clear_alarm(Alarm::WitnessUnreachable, out);
        }
    }
}
