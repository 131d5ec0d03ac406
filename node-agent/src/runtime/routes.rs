//! Routes and policy rules that follow the holder (the pair's `routes` and `rules`): what
//! the machine says ([`sm::Machine::holds_vips`]) applied to the kernel after every step —
//! so after the step that added the VIPs (a route sourced from a VIP needs the VIP on the
//! node) — and taken away before the VIPs go ([`Runtime::remove_holder_routes`], called by
//! `RemoveVips`, `DrainVips` and a release). While held they are checked again every
//! [`RECHECK`] (an interface that goes down takes its routes with it; someone may delete
//! one by hand), and a second after a failure. An agent that stops keeps them, as it keeps
//! the VIPs; the ledger records them before they are added, so a pair that leaves the
//! node, is uninstalled or is reconfigured without them has them removed.

use super::task::Runtime;
use crate::netlink::holder::Added;
use std::time::{Duration, Instant};

/// How often a holder checks that its routes and rules are still there.
pub(super) const RECHECK: Duration = Duration::from_secs(10);

/// How soon a holder tries again after the kernel refused one (a route sourced from a VIP
/// the kernel does not have yet, an interface that is missing).
const RETRY: Duration = Duration::from_secs(1);

impl Runtime {
    fn has_holder_routes(&self) -> bool {
        !self.cfg.routes.is_empty() || !self.cfg.rules.is_empty()
    }

    /// Brings the kernel to what the machine says (after every step).
    pub(super) async fn sync_holder_routes(&mut self) {
        if self.holder_routes.applied.is_none() {
            self.remove_unconfigured_holder_routes().await;
        }
        if !self.has_holder_routes() {
            self.holder_routes.applied = Some(false);
            return;
        }
        let want = self.machine.holds_vips();
        let due = want && self.holder_routes.next_check.is_none_or(|t| Instant::now() >= t);
        if self.holder_routes.applied == Some(want) && !due {
            return;
        }
        if want {
            self.add_holder_routes().await;
        } else {
            self.remove_holder_routes().await;
        }
    }

    /// Adds every route, then every rule (recorded in the ledger first). One that is there
    /// already is left as it is; one that was there at the last check and is gone now is
    /// reported at warn.
    async fn add_holder_routes(&mut self) {
        let checking = self.holder_routes.applied == Some(true);
        if let Err(e) = self.ledger.record_holder_routes(&self.cfg.routes, &self.cfg.rules) {
            self.metrics.io_error("persist");
            tracing::error!(error = %e, "failed to record the routes that follow the holder in the ledger");
        }
        let mut failed = false;
        let mut outcomes = Vec::new();
        for r in &self.cfg.routes {
            outcomes.push((r.to_string(), "route", self.nl.add_holder_route(r).await));
        }
        for r in &self.cfg.rules {
            outcomes.push((r.to_string(), "rule", self.nl.add_holder_rule(r).await));
        }
        for (what, kind, outcome) in outcomes {
            match outcome {
                Ok(Added::Present) => {}
                Ok(Added::New) if checking => {
                    tracing::warn!(kind, what = %what,
                        "a route or rule that follows the holder was gone from the kernel (its interface went down, or it was deleted): added again")
                }
                Ok(Added::New) => tracing::info!(kind, what = %what, "added a route or rule that follows the holder"),
                Err(e) => {
                    failed = true;
                    self.metrics.io_error(e.category());
                    tracing::warn!(error = %e, kind, what = %what,
                        "failed to add a route or rule that follows the holder; retrying in a second");
                }
            }
        }
        self.holder_routes.applied = Some(true);
        self.holder_routes.next_check = Some(Instant::now() + if failed { RETRY } else { RECHECK });
    }

    /// Removes every rule, then every route, of the pair (before its VIPs go: a demotion,
    /// a drain, a release). Nothing to do when they are not applied.
    pub(super) async fn remove_holder_routes(&mut self) {
        if self.holder_routes.applied == Some(false) || !self.has_holder_routes() {
            return;
        }
        let left = self.nl.remove_holder_all(&self.cfg.routes, &self.cfg.rules, "the member gives the VIPs up").await;
        for (what, e) in left.failures() {
            self.metrics.io_error(e.category());
            tracing::warn!(error = %e, what = %what, "failed to remove a route or rule that follows the holder");
        }
        self.holder_routes.applied = Some(false);
        self.holder_routes.next_check = None;
    }

    /// Removes the routes and rules the ledger records that the configuration no longer
    /// has (changed while the agent was down, or by a reconfiguration), and records only
    /// the configured ones — and those that could not be removed.
    pub(super) async fn remove_unconfigured_holder_routes(&mut self) {
        let (routes, rules) = match self.ledger.holder_routes() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the routes that follow the holder from the ledger; stale ones stay");
                return;
            }
        };
        let mut keep_routes = self.cfg.routes.clone();
        let mut keep_rules = self.cfg.rules.clone();
        let gone_routes: Vec<_> = routes.iter().filter(|r| !self.cfg.routes.contains(r)).cloned().collect();
        let gone_rules: Vec<_> = rules.iter().filter(|r| !self.cfg.rules.contains(r)).cloned().collect();
        let left = self.nl.remove_holder_all(&gone_routes, &gone_rules, "the pair no longer has it").await;
        for (what, e) in left.failures() {
            tracing::warn!(error = %e, what = %what, "failed to remove a route or rule the pair no longer has");
        }
        keep_routes.extend(left.routes.into_iter().map(|(r, _)| r));
        keep_rules.extend(left.rules.into_iter().map(|(r, _)| r));
        // What is configured is recorded when it is added; nothing else stays recorded.
        keep_routes.retain(|r| routes.contains(r));
        keep_rules.retain(|r| rules.contains(r));
        if let Err(e) = self.ledger.store_holder_routes(&keep_routes, &keep_rules) {
            self.metrics.io_error("persist");
            tracing::warn!(error = %e, "failed to update the routes that follow the holder in the ledger");
        }
    }

    /// A new configuration's routes and rules: those it no longer has go now, the others
    /// are applied at the next step (added at once if this member holds the VIPs).
    pub(super) async fn reconfigure_holder_routes(&mut self, old: &crate::config::AgentConfig) {
        if old.routes == self.cfg.routes && old.rules == self.cfg.rules {
            return;
        }
        self.remove_unconfigured_holder_routes().await;
        // Applied again from scratch: a route whose gateway or source changed is
        // removed above and added as new.
        if self.holder_routes.applied == Some(true) {
            self.holder_routes.applied = None;
        }
        self.holder_routes.next_check = None;
    }
}
