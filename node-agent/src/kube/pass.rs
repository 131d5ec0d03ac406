//! One pass of the Kubernetes loop: observe (the stores, the runtimes, a by-name read of
//! each pair that left the view), [`plan`](super::plan::plan), apply. `apply` decides
//! nothing: it executes each step and records in the memory each one that succeeded;
//! a step that fails is logged and, where it must be, shown in the member entry, and
//! the next pass plans it again.

use super::Agent;
use super::commands::dispatch;
use super::interfaces::interface_addresses;
use super::leftovers;
use super::pairs::start_pair;
use super::plan::{self, Membership, Note, Observed, PairObserved, Step};
use super::watches::Watches;
use crate::lease::LeaseInput;
use crate::runtime::RuntimeError;
use crate::sm;
use crate::state::StateError;
use havip_crds::HAPair;
use kube::Client;
use kube::api::Api;
use kube::core::DeserializeGuard;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The first wait before a pair whose start failed is tried again…
const START_RETRY_FIRST: Duration = Duration::from_secs(1);
/// …doubling up to this.
const START_RETRY_MAX: Duration = Duration::from_secs(30);

/// Reads pair `pair` by name to tell whether it still names `node`.
async fn membership_of(client: &Client, pair: &str, node: &str) -> Membership {
    let api: Api<DeserializeGuard<HAPair>> = Api::all(client.clone());
    match api.get_opt(pair).await {
        Ok(Some(p)) if p.0.as_ref().is_ok_and(|p| p.spec.members.iter().any(|m| m.node == node)) => Membership::Member,
        Ok(_) => Membership::Left,
        Err(e) => Membership::Unknown(e.to_string()),
    }
}

impl Agent {
    /// Brings the running pairs in line with the stores.
    pub(super) async fn reconcile(&mut self) {
        let observed = self.observe().await;
        let plan = plan::plan(&observed, &self.memory, &self.opts.node);
        self.apply(&observed, plan).await;
    }

    /// What the stores and the runtimes show now.
    async fn observe(&self) -> Observed {
        let node = &self.opts.node;
        let ns = &self.opts.namespace;
        let every_ready = self.stores.every.as_ref().is_some_and(Watches::ready);
        let catching_up = self.memory.watching_every && every_ready;
        let view = self.stores.view();
        let wanted = view.pairs_of(node);
        let unreadable_pairs = view.unreadable_pairs();
        let ifnames: Vec<String> =
            wanted.values().flat_map(|p| p.spec.heartbeat.paths.iter().filter_map(|x| x.interface.clone())).collect();
        let local_interfaces = interface_addresses(&ifnames).await;
        let mut configs = view.configs(node, ns, &wanted, &local_interfaces);
        // Catching up: do this node's own (labelled) objects give every pair the very
        // configuration the complete view gives? Not while the node has no pair at all:
        // nothing then shows that the operator labels, and a pair an unlabelling operator
        // creates later would go unseen.
        let own_view_agrees = catching_up && {
            let own = self.stores.own.pairs_of(node);
            !own.is_empty() && own.keys().eq(wanted.keys()) && {
                let own_configs = self.stores.own.configs(node, ns, &own, &local_interfaces);
                configs.iter().all(|(name, (cfg, _))| match (cfg, own_configs.get(name).map(|c| &c.0)) {
                    (Ok(a), Some(Ok(b))) => a.sm.config_revision == b.sm.config_revision && a.keys == b.keys,
                    _ => false,
                })
            }
        };
        // A pair that leaves the labelled view is read once more by name before its VIPs
        // are given up.
        let mut membership = BTreeMap::new();
        if !catching_up {
            for name in self.running.keys().chain(self.memory.failed_starts.keys()) {
                if !wanted.contains_key(name) && !unreadable_pairs.contains_key(name) {
                    membership.insert(name.clone(), membership_of(&self.client, name, node).await);
                }
            }
        }
        let pairs = wanted
            .into_iter()
            .filter_map(|(name, pair)| {
                let (config, skipped) = configs.remove(&name)?;
                let observed = PairObserved {
                    snapshot: view.snapshot(node, ns, &pair),
                    lease: view.lease_of(&name),
                    config: config.map_err(|e| e.to_string()),
                    skipped,
                    pair,
                };
                Some((name, observed))
            })
            .collect();
        let lease_stale: BTreeSet<String> =
            self.running.iter().filter(|(_, r)| r.handle.status().lease_stale).map(|(n, _)| n.clone()).collect();
        Observed {
            now: Instant::now(),
            every_ready,
            pairs,
            unreadable_pairs,
            unreadable_fips: view.unreadable_fips(),
            membership,
            own_view_agrees,
            lease_stale,
        }
    }

    /// Executes the plan's steps in order.
    async fn apply(&mut self, observed: &Observed, plan: plan::Plan) {
        for note in &plan.notes {
            match note {
                Note::Unconfirmed { pair, error } => {
                    tracing::warn!(pair = %pair, error = %error, "cannot confirm that this node left the pair; keeping it for now")
                }
                Note::CannotRunYet { pair, why } => {
                    tracing::warn!(pair = %pair, reason = %why, "cannot run the pair yet")
                }
            }
        }
        // Pairs whose start or reconfiguration failed in this pass: what depends on it
        // waits for the next pass.
        let mut failed: BTreeSet<String> = BTreeSet::new();
        for step in plan.steps {
            if matches!(&step, Step::SaveSnapshot { pair, .. } if failed.contains(pair)) {
                continue;
            }
            if self.execute(observed, &step, &mut failed).await {
                self.memory.record(&step);
            }
        }
    }

    /// Executes one step; whether it succeeded.
    async fn execute(&mut self, observed: &Observed, step: &Step, failed: &mut BTreeSet<String>) -> bool {
        match step {
            Step::ConfigError { pair, error } => {
                let Some(run) = self.running.get(pair) else { return false };
                run.reporter.set_config_error(error.clone(), &run.handle.status());
                if let Some(e) = error {
                    tracing::warn!(pair = %pair, error = %e, "keeping the last applied configuration");
                }
                true
            }
            Step::WatchEvery { pair } => {
                tracing::warn!(pair = %pair, "the pair still names this node but carries no member label for it: keeping it, and watching every object until the operator labels it");
                if self.stores.every.is_none() {
                    self.stores.every =
                        Some(Watches::every(&self.client, &self.opts.namespace, &self.stores.notify, &self.metrics));
                }
                true
            }
            Step::WatchOwnOnly { pairs } => {
                tracing::info!(
                    pairs,
                    "every object of this node's pairs carries its member label: watching only those from now on"
                );
                self.stores.every = None;
                true
            }
            Step::Release { pair, recreated } => {
                if let Some(run) = self.running.remove(pair) {
                    if *recreated {
                        tracing::info!(pair = %pair, "the pair was deleted and re-created: giving up the old one's VIPs, the new one starts fresh");
                    } else {
                        tracing::info!(pair = %pair, "this node is no longer a member: giving up the pair's VIPs");
                    }
                    run.handle.release().await;
                    run.finish().await;
                } else {
                    // A pair whose start failed: what an earlier run left here goes too.
                    tracing::info!(pair = %pair, "this node is no longer a member of a pair that could not start: removing what it left");
                }
                // Its files too: a later start must not resume it from its snapshot.
                leftovers::remove_pair_leftovers(&self.opts.state_dir, pair).await;
                true
            }
            Step::Skipped { pair, skipped } => {
                for (fip, why) in skipped {
                    tracing::warn!(pair = %pair, floatingip = %fip, reason = %why, "FloatingIP not configured");
                }
                true
            }
            Step::Start { pair, config, .. } => {
                let Some(seen) = observed.pairs.get(pair) else { return false };
                if self.memory.failed_starts.get(pair).is_some_and(|(at, _)| Instant::now() < *at) {
                    failed.insert(pair.clone());
                    return false;
                }
                match start_pair(&self.client, &self.opts, &self.metrics, &self.hub, &seen.pair, (**config).clone())
                    .await
                {
                    Ok(run) => {
                        self.running.insert(pair.clone(), run);
                        true
                    }
                    Err(err) => {
                        self.metrics.io_error("pair_start");
                        let first = !self.memory.failed_starts.contains_key(pair);
                        let wait = self
                            .memory
                            .failed_starts
                            .get(pair)
                            .map_or(START_RETRY_FIRST, |(_, w)| (*w * 2).min(START_RETRY_MAX));
                        self.memory.failed_starts.insert(pair.clone(), (Instant::now() + wait, wait));
                        tracing::error!(pair = %pair, error = %err, retry_in = ?wait, "failed to start the pair");
                        // A pair that cannot run here must not leave its addresses
                        // answering: a killed agent's VIPs stay in the kernel, and nothing
                        // here would give them up when a peer takes over. Unless another
                        // agent runs the pair on this node: they are its VIPs.
                        let locked = matches!(&err, RuntimeError::State(StateError::Locked { .. }));
                        if !locked
                            && crate::leftovers::remove_vips_and_drain_tables(&self.opts.state_dir, pair).await
                            && first
                        {
                            tracing::warn!(pair = %pair, "gave up the VIPs of a pair that cannot start on this node");
                        }
                        failed.insert(pair.clone());
                        false
                    }
                }
            }
            Step::Reconfigure { pair, config } => {
                let Some(run) = self.running.get(pair) else { return false };
                tracing::info!(pair = %pair, revision = config.sm.config_revision, "configuration changed");
                // Recorded (and reported as applied) only once the runtime applied it; a
                // failure is reported in the member entry and retried on the next pass.
                match run.handle.reconfigure((**config).clone()).await {
                    Ok(()) => {
                        run.reporter.set_config(config);
                        run.reporter.set_config_error(None, &run.handle.status());
                        true
                    }
                    Err(e) => {
                        let msg = format!(
                            "cannot apply revision {}: {e}",
                            havip_crds::revision::format_revision(config.sm.config_revision)
                        );
                        if run.reporter.set_config_error(Some(msg.clone()), &run.handle.status()) {
                            tracing::warn!(pair = %pair, error = %msg, "keeping the last applied configuration; retrying");
                        }
                        self.memory.record(&Step::ConfigError { pair: pair.clone(), error: Some(msg) });
                        failed.insert(pair.clone());
                        false
                    }
                }
            }
            Step::AcceptKey { pair, accepting, keys, switch_at } => {
                let Some(run) = self.running.get(pair) else { return false };
                let after = switch_at.saturating_duration_since(observed.now);
                tracing::info!(pair = %pair, key_id = keys.current.id, after = ?after, "heartbeat key rotated: accepting the new key, signing with it shortly");
                run.handle.set_keys(accepting.clone()).await;
                true
            }
            Step::SetKeys { pair, config } => {
                let Some(run) = self.running.get(pair) else { return false };
                tracing::info!(pair = %pair, key_id = config.keys.current.id, "signing with the new heartbeat key");
                run.handle.set_keys(config.keys.clone()).await;
                run.reporter.set_config(config);
                true
            }
            Step::SaveSnapshot { pair, .. } => {
                let Some(seen) = observed.pairs.get(pair) else { return false };
                match seen.snapshot.save(&self.opts.state_dir) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(pair = %pair, error = %e, "cannot save the pair's configuration snapshot");
                        false
                    }
                }
            }
            // (While it holds the VIPs and cannot hear a peer, the active also reads the
            // Lease itself about once a second, when it renews it: a peer that took the
            // pair over is learnt within a second even if this watch went stale.)
            Step::FeedLease { pair, lease, input } => {
                let Some(run) = self.running.get(pair) else { return false };
                let input = match (input, &lease.holder) {
                    (LeaseInput::Renewed, Some(holder)) => {
                        sm::Input::LeaseRenewed { holder: holder.clone(), epoch: lease.epoch }
                    }
                    _ => sm::Input::LeaseObserved { holder: lease.holder.clone(), epoch: lease.epoch },
                };
                run.handle.input(input).await;
                true
            }
            Step::Maintenance { pair, on } => {
                let Some(run) = self.running.get(pair) else { return false };
                run.handle.input(sm::Input::Command(sm::Command::Maintenance { on: *on, force: false })).await;
                true
            }
            Step::Paused { pair, on } => {
                let Some(run) = self.running.get(pair) else { return false };
                run.handle.input(sm::Input::Command(sm::Command::SetPaused(*on))).await;
                true
            }
            Step::Dispatch { pair, command } => {
                let Some(run) = self.running.get(pair) else { return false };
                dispatch(command, &run.handle, &run.reporter).await;
                true
            }
        }
    }
}
