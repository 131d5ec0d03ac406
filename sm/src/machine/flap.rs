//! The preferred member, flap suspension and the failback quarantine: the automatic
//! moves counted (the records are `state::FlapGuard`).

use super::state::Machine;
use crate::config::FailbackPolicy;
use crate::io::{Action, Alarm};
use crate::types::Millis;

impl Machine {
    /// Records an automatic role change for flap suspension.
    pub(super) fn note_auto_move(&mut self, now: Millis, out: &mut Vec<Action>) {
        let window = self.cfg.flap.window_ms;
        self.flap.auto_moves.push_back(now);
        while self.flap.auto_moves.front().is_some_and(|&t| now.since(t) >= window) {
            self.flap.auto_moves.pop_front();
        }
        self.flap.quiet_from = now;
        let limit = usize::try_from(self.cfg.flap.moves).unwrap_or(usize::MAX);
        if !self.flap.suspended && self.flap.auto_moves.len() >= limit {
            self.flap.suspended = true;
            let detail = format!("{} automatic role changes within {} ms", self.flap.auto_moves.len(), window);
            self.raise(Alarm::Suspended, detail, out);
        }
    }

    /// Records a failover onto this (non-preferred) member for the failback quarantine.
    pub(super) fn note_nonpreferred_acquisition(&mut self, now: Millis) {
        let FailbackPolicy::Automatic(p) = &self.cfg.failback else {
            return;
        };
        let (window, n, hold) = (p.quarantine_window_ms, p.quarantine_failovers, p.quarantine_hold_ms);
        self.flap.nonpref_acq.push_back(now);
        while self.flap.nonpref_acq.front().is_some_and(|&t| now.since(t) >= window) {
            self.flap.nonpref_acq.pop_front();
        }
        if self.flap.nonpref_acq.len() >= usize::try_from(n).unwrap_or(usize::MAX) {
            self.flap.quarantined_until = Some(now.plus(hold));
        }
    }

    pub(super) fn quarantined(&self, now: Millis) -> bool {
        self.flap.quarantined_until.is_some_and(|u| now < u)
    }

    /// The preferred member: highest priority not in maintenance (peers by their last
    /// advert). `None` when that is this member.
    pub(super) fn preferred_peer(&self) -> Option<usize> {
        let mut best: Option<(u8, Option<usize>)> =
            if self.maintenance { None } else { Some((self.my_priority, None)) };
        for (i, p) in self.peers.iter().enumerate() {
            let maint = p.advert.as_ref().is_some_and(|a| a.maintenance);
            if maint {
                continue;
            }
            if best.is_none_or(|(bp, _)| p.priority > bp) {
                best = Some((p.priority, Some(i)));
            }
        }
        best.and_then(|(_, i)| i)
    }

    pub(super) fn is_preferred(&self) -> bool {
        !self.maintenance && self.preferred_peer().is_none()
    }
}
