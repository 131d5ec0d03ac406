//! The decisions of one pass of the Kubernetes loop, as a pure function: what the
//! watches and the runtimes show ([`Observed`]) and what the loop remembers of each pair
//! it runs ([`Memory`]) → the [`Step`]s to take, in order ([`plan`]). No I/O and no clock
//! but [`Observed::now`]; [`super`]'s `apply` only executes the steps, and records each
//! one that succeeded in the memory with [`Memory::record`] — the same function the
//! tests use, so "planning again after applying plans nothing" is checked on the code
//! that runs.
//!
//! The rules, each with its table test below:
//! - **Unreadable objects** (version skew): a running pair whose HAPair, or one of whose
//!   FloatingIPs, cannot be read keeps its last configuration and says why.
//! - **Departure**: a running pair no longer in view is read once more by name (while
//!   not catching up); it is released only when the API says this node left it, kept
//!   when the API does not answer, and kept — with every object watched until the
//!   operator labels it — when it still names this node without a member label.
//! - **Catch-up**: while every object is watched, the complete watches stop once this
//!   node's own labelled objects give every pair the very configuration the complete
//!   view gives.
//! - **Configuration**: a new pair starts; a changed revision reconfigures in place; a
//!   configuration that cannot be built keeps the last one (or waits, for a new pair).
//! - **Key rotation**: a rotated key (the old one moved to `previous`) is accepted at
//!   once and signs [`KEY_SWITCH_DELAY`] later; any other key change applies at once.
//! - **Snapshot**: the objects a running configuration came from are saved when they
//!   change, so that a restart without the API server resumes the pair.
//! - **Lease**: the record is fed when holder or epoch changed, and again while the
//!   runtime knows its record is behind; a new renewal mark alone is a renewal.
//! - **Commands**: maintenance, pause and a new operator command are handed to the
//!   machine once per change.

use super::snapshot::PairSnapshot;
use crate::config::AgentConfig;
use crate::lease::{LeaseInput, LeaseSnapshot, lease_input};
use havip_crds::wire::Keyring;
use havip_crds::{HAPair, PairCommand};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How long after a key rotation reaches it an agent keeps signing with the old key
/// (while accepting both): longer than watch events take to reach every member.
pub(super) const KEY_SWITCH_DELAY: Duration = Duration::from_secs(2);

/// What the API server says of a pair that left this node's view, read by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Membership {
    /// The pair is gone, unreadable, or no longer names this node.
    Left,
    /// The pair still names this node.
    Member,
    /// The API server did not answer (the error).
    Unknown(String),
}

/// One pair naming this node, as the watches show it.
#[derive(Clone, Debug)]
pub(super) struct PairObserved {
    /// The HAPair.
    pub pair: HAPair,
    /// Its configuration on this node, or why it has none.
    pub config: Result<AgentConfig, String>,
    /// The FloatingIPs it skips, each with the reason.
    pub skipped: BTreeMap<String, String>,
    /// What its configuration is built from (saved for a restart without the API).
    pub snapshot: PairSnapshot,
    /// Its fencing record, if read.
    pub lease: Option<LeaseSnapshot>,
}

/// What one pass observed.
#[derive(Clone, Debug)]
pub(super) struct Observed {
    /// The time of the pass.
    pub now: Instant,
    /// The complete watches (every object, not only this node's) have listed.
    pub every_ready: bool,
    /// The pairs naming this node.
    pub pairs: BTreeMap<String, PairObserved>,
    /// HAPairs that cannot be read, with why.
    pub unreadable_pairs: BTreeMap<String, String>,
    /// FloatingIPs that cannot be read, with why.
    pub unreadable_fips: BTreeMap<String, String>,
    /// Running pairs that left the view, read again by name (only while not catching up).
    pub membership: BTreeMap<String, Membership>,
    /// This node's own labelled objects give every pair the configuration the complete
    /// view gives (only computed while catching up).
    pub own_view_agrees: bool,
    /// Running pairs whose runtime knows its Lease record is behind.
    pub lease_stale: BTreeSet<String>,
}

/// What the loop remembers of one running pair: everything a decision reads.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct RunMemory {
    /// The UID of the HAPair object it runs for: another UID under the same name is a
    /// re-created pair, even when this node never saw the deletion (a watch that relisted
    /// after a cut, an agent that was down).
    pub uid: Option<String>,
    /// The configuration revision the runtime applied.
    pub revision: u64,
    /// The keys the runtime signs with.
    pub keys: Keyring,
    /// A rotated key accepted but not signing yet: when it starts to sign, and the keys.
    pub key_switch: Option<(Instant, Keyring)>,
    /// The FloatingIPs of the running configuration.
    pub vips: BTreeSet<String>,
    /// The configuration error the member entry shows.
    pub config_error: Option<String>,
    /// Digest of the snapshot last saved.
    pub snapshot: Option<u64>,
    /// The Lease record last fed.
    pub lease: Option<LeaseSnapshot>,
    /// The maintenance flag last fed.
    pub maintenance: Option<bool>,
    /// `spec.paused` last fed.
    pub paused: Option<bool>,
    /// The id of the operator command last dispatched.
    pub command: Option<String>,
}

impl RunMemory {
    /// A runtime just started on `cfg`.
    pub(super) fn started(cfg: &AgentConfig, uid: Option<String>) -> Self {
        RunMemory {
            uid,
            revision: cfg.sm.config_revision,
            keys: cfg.keys.clone(),
            key_switch: None,
            vips: vip_ids(cfg),
            config_error: None,
            snapshot: None,
            lease: None,
            maintenance: None,
            paused: None,
            command: None,
        }
    }
}

/// What the loop remembers across passes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Memory {
    /// The pairs running.
    pub running: BTreeMap<String, RunMemory>,
    /// The FloatingIPs skipped per pair, as last logged.
    pub skipped: BTreeMap<String, BTreeMap<String, String>>,
    /// Every object is watched, not only this node's labelled ones.
    pub watching_every: bool,
    /// The pairs whose start failed, with when to try again and the wait before that try
    /// (1 s, doubling to 30 s: a pair that cannot start does not retry at every watch
    /// event). Not running, but their files from an earlier run may be here: released like
    /// a running pair when they leave.
    pub failed_starts: BTreeMap<String, (Instant, Duration)>,
}

/// One step of a pass, in the order to take it.
#[derive(Clone, Debug)]
pub(super) enum Step {
    /// Show (or clear) a configuration error in the pair's member entry; the last
    /// configuration keeps running.
    ConfigError { pair: String, error: Option<String> },
    /// Watch every object: a pair names this node without its member label.
    WatchEvery { pair: String },
    /// Stop the complete watches: the labelled objects say it all.
    WatchOwnOnly { pairs: usize },
    /// Give the pair's VIPs up, stop its runtime and remove its files: this node left the
    /// pair, or the pair was deleted — or re-created under the same name (`recreated`),
    /// which a fresh runtime then serves.
    Release { pair: String, recreated: bool },
    /// Log the FloatingIPs the pair skips (they changed).
    Skipped { pair: String, skipped: BTreeMap<String, String> },
    /// Start a runtime for the HAPair object of this UID.
    Start { pair: String, uid: Option<String>, config: Box<AgentConfig> },
    /// Apply a new revision in place.
    Reconfigure { pair: String, config: Box<AgentConfig> },
    /// Accept a rotated key while still signing with the old one.
    AcceptKey { pair: String, accepting: Keyring, keys: Keyring, switch_at: Instant },
    /// Sign with (and accept only) these keys; `config` is what the member entry shows.
    SetKeys { pair: String, config: Box<AgentConfig> },
    /// Save the pair's snapshot.
    SaveSnapshot { pair: String, digest: u64 },
    /// Feed the Lease record.
    FeedLease { pair: String, lease: LeaseSnapshot, input: LeaseInput },
    /// Hand the maintenance flag to the machine.
    Maintenance { pair: String, on: bool },
    /// Hand `spec.paused` to the machine.
    Paused { pair: String, on: bool },
    /// Hand an operator command to the machine.
    Dispatch { pair: String, command: PairCommand },
}

/// What a pass reports without acting (logged at `warn`, every pass it holds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Note {
    /// A pair left the view but the API server did not confirm that this node left it.
    Unconfirmed { pair: String, error: String },
    /// A pair not running yet has no configuration.
    CannotRunYet { pair: String, why: String },
}

/// The steps of one pass and what it reports.
#[derive(Clone, Debug, Default)]
pub(super) struct Plan {
    /// In order.
    pub steps: Vec<Step>,
    /// Reported, not acted on.
    pub notes: Vec<Note>,
}

fn vip_ids(cfg: &AgentConfig) -> BTreeSet<String> {
    cfg.vips.iter().map(|v| v.id.clone()).collect()
}

/// The steps that bring the running pairs in line with what was observed.
pub(super) fn plan(obs: &Observed, mem: &Memory, node: &str) -> Plan {
    let mut p = Plan::default();
    let catching_up = mem.watching_every && obs.every_ready;
    // A running pair whose object cannot be read (version skew) is not gone: it keeps its
    // last configuration, and says why it cannot take the new one.
    for (name, why) in &obs.unreadable_pairs {
        if let Some(run) = mem.running.get(name) {
            config_error(&mut p, name, run, format!("cannot read the HAPair: {why}"));
        }
    }
    // Pairs this node left (or that were deleted).
    let mut watching_every = mem.watching_every;
    for name in mem.running.keys().chain(mem.failed_starts.keys().filter(|n| !mem.running.contains_key(*n))) {
        if obs.pairs.contains_key(name) || obs.unreadable_pairs.contains_key(name) {
            continue;
        }
        if !catching_up {
            match obs.membership.get(name) {
                Some(Membership::Left) => {}
                Some(Membership::Member) => {
                    if !watching_every {
                        watching_every = true;
                        p.steps.push(Step::WatchEvery { pair: name.clone() });
                    }
                    continue;
                }
                Some(Membership::Unknown(e)) => {
                    p.notes.push(Note::Unconfirmed { pair: name.clone(), error: e.clone() });
                    continue;
                }
                None => {
                    p.notes.push(Note::Unconfirmed { pair: name.clone(), error: "not read".to_owned() });
                    continue;
                }
            }
        }
        p.steps.push(Step::Release { pair: name.clone(), recreated: false });
    }
    if catching_up && obs.own_view_agrees {
        p.steps.push(Step::WatchOwnOnly { pairs: obs.pairs.len() });
    }
    for (name, seen) in &obs.pairs {
        let uid = seen.pair.metadata.uid.as_ref();
        let mut remembered_skipped = mem.skipped.get(name);
        let run = match mem.running.get(name) {
            // Deleted and re-created while this node did not look: the old incarnation's
            // runtime (its flap history, alarms, role) must not serve the new object.
            Some(run) if run.uid.is_some() && uid.is_some() && run.uid.as_ref() != uid => {
                p.steps.push(Step::Release { pair: name.clone(), recreated: true });
                remembered_skipped = None;
                None
            }
            run => run,
        };
        // A VIP of the running configuration whose FloatingIP cannot be read is not
        // dropped: the last configuration stays until the object reads again.
        if let Some(run) = run
            && let Some((fip, why)) = obs.unreadable_fips.iter().find(|(f, _)| run.vips.contains(*f))
        {
            config_error(&mut p, name, run, format!("cannot read FloatingIP {fip}: {why}"));
            continue;
        }
        if remembered_skipped != Some(&seen.skipped) {
            p.steps.push(Step::Skipped { pair: name.clone(), skipped: seen.skipped.clone() });
        }
        let cfg = match &seen.config {
            Ok(c) => c,
            Err(why) => {
                match run {
                    Some(run) => config_error(&mut p, name, run, format!("cannot build the new configuration: {why}")),
                    None => p.notes.push(Note::CannotRunYet { pair: name.clone(), why: why.clone() }),
                }
                continue;
            }
        };
        // The pair's memory as it will be once the configuration step succeeded.
        let after = match run {
            None => {
                p.steps.push(Step::Start { pair: name.clone(), uid: uid.cloned(), config: Box::new(cfg.clone()) });
                RunMemory::started(cfg, uid.cloned())
            }
            Some(run) => {
                plan_config(&mut p, name, run, cfg, obs.now);
                let mut after = run.clone();
                if run.revision != cfg.sm.config_revision {
                    after.revision = cfg.sm.config_revision;
                }
                after
            }
        };
        let digest = seen.snapshot.digest();
        if after.revision == cfg.sm.config_revision && after.snapshot != Some(digest) {
            p.steps.push(Step::SaveSnapshot { pair: name.clone(), digest });
        }
        if let Some(input) = lease_input(after.lease.as_ref(), seen.lease.as_ref(), obs.lease_stale.contains(name))
            && let Some(lease) = &seen.lease
        {
            p.steps.push(Step::FeedLease { pair: name.clone(), lease: lease.clone(), input });
        }
        let maintenance = seen.pair.spec.members.iter().find(|m| m.node == node).is_some_and(|m| m.maintenance);
        if after.maintenance != Some(maintenance) {
            p.steps.push(Step::Maintenance { pair: name.clone(), on: maintenance });
        }
        if after.paused != Some(seen.pair.spec.paused) {
            p.steps.push(Step::Paused { pair: name.clone(), on: seen.pair.spec.paused });
        }
        if let Some(cmd) = seen.pair.status.as_ref().and_then(|s| s.command.as_ref())
            && after.command.as_deref() != Some(cmd.id.as_str())
        {
            p.steps.push(Step::Dispatch { pair: name.clone(), command: cmd.clone() });
        }
    }
    p
}

/// A configuration error shown once per change.
fn config_error(p: &mut Plan, name: &str, run: &RunMemory, error: String) {
    if run.config_error.as_deref() != Some(error.as_str()) {
        p.steps.push(Step::ConfigError { pair: name.to_owned(), error: Some(error) });
    }
}

/// A running pair's configuration and keys.
fn plan_config(p: &mut Plan, name: &str, run: &RunMemory, cfg: &AgentConfig, now: Instant) {
    let pair = name.to_owned();
    if run.revision != cfg.sm.config_revision {
        p.steps.push(Step::Reconfigure { pair, config: Box::new(cfg.clone()) });
        return;
    }
    if run.keys == cfg.keys {
        return;
    }
    if let Some((at, keys)) = &run.key_switch
        && *keys == cfg.keys
    {
        // Already accepting the new key; it signs once the switch is due.
        if now >= *at {
            p.steps.push(Step::SetKeys { pair, config: Box::new(cfg.clone()) });
        }
        return;
    }
    let rotation = cfg.keys.previous.as_ref() == Some(&run.keys.current) && cfg.keys.current != run.keys.current;
    if rotation {
        // Accept the new key at once but keep signing with the old one for a while, so
        // that a peer whose watch delivers the Secret later does not refuse our
        // heartbeats meanwhile.
        let accepting = Keyring { current: run.keys.current.clone(), previous: Some(cfg.keys.current.clone()) };
        p.steps.push(Step::AcceptKey { pair, accepting, keys: cfg.keys.clone(), switch_at: now + KEY_SWITCH_DELAY });
        return;
    }
    p.steps.push(Step::SetKeys { pair, config: Box::new(cfg.clone()) });
}

impl Memory {
    /// Records a step that succeeded.
    pub(super) fn record(&mut self, step: &Step) {
        match step {
            Step::ConfigError { pair, error } => {
                if let Some(r) = self.running.get_mut(pair) {
                    r.config_error = error.clone();
                }
            }
            Step::WatchEvery { .. } => self.watching_every = true,
            Step::WatchOwnOnly { .. } => self.watching_every = false,
            Step::Release { pair, .. } => {
                self.running.remove(pair);
                self.skipped.remove(pair);
                self.failed_starts.remove(pair);
            }
            Step::Skipped { pair, skipped } => {
                self.skipped.insert(pair.clone(), skipped.clone());
            }
            Step::Start { pair, uid, config } => {
                self.failed_starts.remove(pair);
                self.running.insert(pair.clone(), RunMemory::started(config, uid.clone()));
            }
            Step::Reconfigure { pair, config } => {
                if let Some(r) = self.running.get_mut(pair) {
                    r.revision = config.sm.config_revision;
                    r.keys = config.keys.clone();
                    r.key_switch = None;
                    r.vips = vip_ids(config);
                    r.config_error = None;
                }
            }
            Step::AcceptKey { pair, keys, switch_at, .. } => {
                if let Some(r) = self.running.get_mut(pair) {
                    r.key_switch = Some((*switch_at, keys.clone()));
                }
            }
            Step::SetKeys { pair, config } => {
                if let Some(r) = self.running.get_mut(pair) {
                    r.keys = config.keys.clone();
                    r.key_switch = None;
                }
            }
            Step::SaveSnapshot { pair, digest } => {
                if let Some(r) = self.running.get_mut(pair) {
                    r.snapshot = Some(*digest);
                }
            }
            Step::FeedLease { pair, lease, .. } => {
                if let Some(r) = self.running.get_mut(pair) {
                    r.lease = Some(lease.clone());
                }
            }
            Step::Maintenance { pair, on } => {
                if let Some(r) = self.running.get_mut(pair) {
                    r.maintenance = Some(*on);
                }
            }
            Step::Paused { pair, on } => {
                if let Some(r) = self.running.get_mut(pair) {
                    r.paused = Some(*on);
                }
            }
            Step::Dispatch { pair, command } => {
                if let Some(r) = self.running.get_mut(pair) {
                    r.command = Some(command.id.clone());
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
