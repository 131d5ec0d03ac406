//! The agent runtime: feeds the pure state machine with timestamped observations
//! from the kernel and the network, and executes its actions (VIP addresses,
//! announcements, heartbeats, Lease compare-and-swap, persistence, reports).
//!
//! One task owns the [`sm::Machine`]; every other task (heartbeat receivers, probes,
//! link watch, gateway and conflict probes, traffic sampler, admin socket) only sends
//! it inputs through a channel. The machine's time is monotonic milliseconds since the
//! agent started.

use crate::announce::AnnounceGate;
use crate::config::AgentConfig;
use crate::heartbeat::{Endpoint, Hub, Received, SkewTracker};
use crate::ledger::VipLedger;
use crate::metrics::PairMetrics;
use crate::netlink::Netlink;
use crate::sm;
use crate::state::StateFile;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

mod backup;
mod drain;
mod execute;
mod io;
mod routes;
mod task;
mod types;

pub use types::{LeaseStore, Reply, Reporter, Request, RuntimeError, VipLink};

use io::{Io, build_io, remove_stale_vips};
use task::{DrainIo, Runtime};
use types::{Event, ResolvedVip};

/// A reporter that only logs (standalone mode).
pub struct LogReporter;

impl Reporter for LogReporter {
    fn event(&self, event: &sm::Event, _status: &sm::Status) {
        log_event(event);
    }
    fn status(&self, _status: &sm::Status) {}
}

/// Logs a state machine event with structured fields.
pub fn log_event(event: &sm::Event) {
    match event {
        sm::Event::RoleChanged { from, to, reason, epoch } => {
            tracing::info!(from = from.as_str(), to = to.as_str(), reason = ?reason, epoch, "role changed")
        }
        sm::Event::AlarmRaised { alarm, detail } => {
            tracing::warn!(alarm = alarm.as_str(), detail = %detail, "alarm raised")
        }
        sm::Event::AlarmCleared { alarm } => tracing::info!(alarm = alarm.as_str(), "alarm cleared"),
        sm::Event::OperationResult { id, ok, message } => {
            tracing::info!(id, ok, message = %message, "operation finished")
        }
        sm::Event::Drain { started, peer, detail } => {
            tracing::info!(started, peer = peer.as_str(), detail = %detail, "drain")
        }
    }
}

/// A handle to a running agent: send requests, read the status, stop it.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Event>,
    status: watch::Receiver<Arc<sm::Status>>,
    /// The machine's time origin.
    origin: Instant,
    /// The peers' clock skew, as their heartbeats show it.
    skew: Arc<SkewTracker>,
}

impl Handle {
    /// Sends a request and waits for its answer (operations wait for their result, up
    /// to `timeout`).
    pub async fn request(&self, req: Request, timeout: Duration) -> Option<Reply> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Event::Request(req, tx)).await.ok()?;
        tokio::time::timeout(timeout, rx).await.ok()?.ok()
    }
    /// The machine's monotonic time at `at` (an input dated in the past, such as a quorum
    /// confirmation's proof).
    pub fn millis_at(&self, at: Instant) -> sm::Millis {
        sm::Millis(u64::try_from(at.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX))
    }
    /// The latest status.
    pub fn status(&self) -> Arc<sm::Status> {
        self.status.borrow().clone()
    }
    /// Each peer's clock skew as its accepted heartbeats show it (ms, smoothed; positive:
    /// the peer's clock is behind this node's).
    pub fn clock_skew(&self) -> std::collections::BTreeMap<String, i64> {
        self.skew.by_peer()
    }
    /// Feeds an observation (Kubernetes mode: Lease watch, config changes).
    pub async fn input(&self, input: sm::Input) {
        let _ = self.tx.send(Event::Input(input)).await;
    }
    /// Stops the runtime; the VIPs stay where they are (a rolling upgrade keeps them).
    pub async fn stop(&self) {
        let _ = self.tx.send(Event::Stop).await;
    }
    /// Replaces the heartbeat keys (a key rotation); no restart, no missed heartbeat.
    pub async fn set_keys(&self, keys: havip_crds::wire::Keyring) {
        let _ = self.tx.send(Event::SetKeys(keys)).await;
    }
    /// Applies a new configuration without a restart: the machine keeps its role, epoch
    /// and peers (no Init period); VIPs added or removed are added or removed, the
    /// heartbeat sockets and probes are rebuilt. Returns once it was applied; on error
    /// the last configuration keeps running, unchanged.
    pub async fn reconfigure(&self, cfg: AgentConfig) -> Result<(), RuntimeError> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Event::Reconfigure(Box::new(cfg), tx)).await.is_err() {
            return Err(RuntimeError::Stopped);
        }
        rx.await.unwrap_or(Err(RuntimeError::Stopped))
    }
    /// Replaces the store that arbitrates takeovers (a standalone pair's witness or
    /// voters after a reload; `None`: no store). A request in flight at the old store
    /// still answers; later ones go to the new one.
    pub async fn set_lease(&self, lease: Option<Arc<dyn LeaseStore>>) {
        let _ = self.tx.send(Event::SetLease(lease)).await;
    }
    /// Removes the pair's VIPs from this node and stops (the node left the pair).
    pub async fn release(&self) {
        let _ = self.tx.send(Event::Release).await;
    }
}

/// What the runtime needs besides the configuration.
pub struct Options {
    /// The state file.
    pub state: StateFile,
    /// The Lease store (Kubernetes mode).
    pub lease: Option<Arc<dyn LeaseStore>>,
    /// Where reports go.
    pub reporter: Arc<dyn Reporter>,
    /// The pair's metrics.
    pub metrics: PairMetrics,
    /// The agent's heartbeat sockets, shared by every pair it runs.
    pub hub: Arc<Hub>,
}

/// Starts the agent for one pair and returns its handle and the task that runs it.
pub async fn start(cfg: AgentConfig, opts: Options) -> Result<(Handle, tokio::task::JoinHandle<()>), RuntimeError> {
    let lock = opts.state.lock()?;
    let (persisted, set_aside) = opts.state.load_or_set_aside()?;
    if let Some(aside) = set_aside {
        tracing::warn!(
            pair = %cfg.pair, file = %opts.state.path().display(), moved_to = %aside.display(),
            "the pair's state file was not a state file (corrupted): moved aside; this member starts afresh and \
             learns the pair's epoch from its peers and the Lease"
        );
    }
    let nl = Netlink::new()?;
    let ledger = VipLedger::new(opts.state.path().parent().unwrap_or(std::path::Path::new(".")), &cfg.pair);
    let io = build_io(&cfg, &nl, &HashMap::new(), &ledger).await?;
    // The guard first: a drain's addresses left on `lo` by a killed agent go next, and
    // the new holder may still forward to them (see `drain`).
    drain::install_guard(&cfg.pair, &nl, &io.vips, &opts.metrics).await;
    remove_stale_vips(&nl, &ledger, &io.vips).await;
    let machine = sm::Machine::new(cfg.sm.clone(), persisted);
    let (tx, rx) = mpsc::channel::<Event>(1024);
    // Heartbeats of this pair, from the hub's sockets; relayed into the runtime's queue
    // for as long as the runtime runs (reconfigurations keep the endpoint).
    let (rtx, mut rrx) = mpsc::channel::<Received>(256);
    let hb = Endpoint::attach(&opts.hub, io.hb.clone(), opts.metrics.clone(), rtx).await?;
    let relay_tx = tx.clone();
    let relay = tokio::spawn(async move {
        while let Some(r) = rrx.recv().await {
            if relay_tx.send(Event::Received(r)).await.is_err() {
                return;
            }
        }
    });
    let initial = machine.status();
    status_metrics(&opts.metrics, None, &initial);
    let (status_tx, status_rx) = watch::channel(Arc::new(initial));
    let holding = Arc::new(AtomicBool::new(false));
    // Every pair's machine counts from the agent's start: their routine heartbeats fall on
    // the same instants (`sm::Machine::next_tick`), one wakeup and one bundle for all.
    let origin = crate::timer::origin();

    let Io { vips, l2, hb: _, data_link, vip_links, fence, own } = io;
    opts.reporter.links(&vips.iter().map(ResolvedVip::link).collect::<Vec<_>>());
    // A stall is a gap of more than half a heartbeat timeout beyond the longest regular
    // gap between ticks — a heartbeat interval, when the machine is steady (shorter stalls
    // cannot have let a peer take over: this member's heartbeats go out on its ticks);
    // announcements then wait two heartbeat intervals, in which the peers' queued
    // heartbeats (and a Lease change) are read.
    let t = &cfg.sm.timings;
    let gate = AnnounceGate::new(
        Duration::from_millis(t.heartbeat_interval_ms.max(t.tick_ms)),
        Duration::from_millis((t.heartbeat_timeout_ms / 2).max(50)),
        Duration::from_millis((2 * t.heartbeat_interval_ms).max(200)),
    );
    let metrics = opts.metrics.clone();
    let timer = crate::timer::Timer::new();
    Runtime::drain_cleanup_at_start(&cfg.pair).await;
    let skew = Arc::new(SkewTracker::default());
    let mut rt = Runtime {
        timer,
        drain: DrainIo::default(),
        cfg,
        machine,
        origin,
        nl,
        vips,
        l2,
        hb,
        state: opts.state,
        lease: opts.lease,
        reporter: opts.reporter,
        metrics,
        tx: tx.clone(),
        status_tx,
        holding: holding.clone(),
        probes_urgent: Arc::new(AtomicBool::new(true)),
        speaker_ok: Arc::new(AtomicBool::new(true)),
        probes_wake: Arc::new(tokio::sync::Notify::new()),
        waiters: HashMap::new(),
        announcer: None,
        skew: skew.clone(),
        queue: VecDeque::new(),
        tasks: Vec::new(),
        relay,
        ledger,
        gate,
        routed_epoch: None,
        unicast_targets: Vec::new(),
        speaker_problem: None,
        backup_installed: None,
        backup_tried: None,
        holder_routes: task::HolderRoutes::default(),
        _lock: lock,
    };
    rt.spawn_tasks(data_link, vip_links, fence, own);
    let handle = Handle { tx, status: status_rx, origin, skew };
    let task = tokio::spawn(async move { rt.run(rx).await });
    Ok((handle, task))
}

impl Runtime {
    fn now(&self) -> sm::Millis {
        sm::Millis(self.origin.elapsed().as_millis() as u64)
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Event>) {
        // Initial observations: what the kernel holds now (adoption after an agent
        // restart), then a first tick.
        self.observe_local_vips().await;
        // Ticks come when the machine needs them (`Machine::next_tick`): every tick while
        // something is pending, about once per heartbeat when steady. The timer is re-armed
        // after every step, since any input may change what the machine waits for.
        let mut due = self.origin;
        let mut last_tick = self.now();
        let mut released = false;
        loop {
            tokio::select! {
                _ = self.timer.sleep_until(due) => {
                    last_tick = self.now();
                    self.stall_check();
                    // The machine's contract after a stall: the heartbeats, Lease events
                    // and CAS answers queued meanwhile come before its next Tick (until
                    // then it only gives up what a newer holder claims). They are read
                    // within the gate's settle time, so no Tick is fed before it ends.
                    if !self.gate.blocked() {
                        self.queue.push_back(sm::Input::Tick);
                    }
                }
                ev = rx.recv() => {
                    // Any step runs the machine's timers (a steady machine's next tick is
                    // counted from it): so a stall is also a gap between inputs.
                    self.stall_check();
                    match ev {
                    None | Some(Event::Stop) => break,
                    Some(Event::Input(i)) => self.queue.push_back(i),
                    Some(Event::ObserveVips) => self.observe_local_vips().await,
                    Some(Event::Speaker(r)) => self.speaker_report(r),
                    Some(Event::SetKeys(k)) => self.hb.set_keys(k),
                    Some(Event::SetLease(l)) => self.lease = l,
                    Some(Event::Reconfigure(cfg, done)) => {
                        let r = self.reconfigure(*cfg).await;
                        if let Err(e) = &r {
                            self.metrics.io_error("reconfigure");
                            tracing::warn!(error = %e, "failed to apply the new configuration; the last one keeps running");
                        }
                        let _ = done.send(r);
                    }
                    Some(Event::Release) => {
                        self.withdraw_backup_paths().await;
                        // Before the VIPs: a route sourced from one goes with it anyway.
                        self.remove_holder_routes().await;
                        self.stop_announcer();
                        self.drain_stop().await;
                        self.metrics.forget(&sm::Role::ALL.map(sm::Role::as_str), &sm::Alarm::ALL.map(sm::Alarm::as_str));
                        let mut all_gone = true;
                        for a in self.vips.iter().flat_map(ResolvedVip::addresses) {
                            if let Err(e) = self.nl.remove_vip(a).await {
                                all_gone = false;
                                tracing::warn!(vip = %a, error = %e, "failed to remove VIP on release");
                            }
                        }
                        if all_gone && let Err(e) = self.ledger.remove() {
                            tracing::warn!(error = %e, "failed to remove the VIP ledger");
                        }
                        released = true;
                        break;
                    }
                    Some(Event::Received(r)) => self.received(r),
                    Some(Event::Request(req, reply)) => self.request(req, reply),
                    }
                }
            }
            self.drain().await;
            due = self.origin + Duration::from_millis(self.machine.next_tick(last_tick).0);
        }
        // The machine's last step: a drain ends, and its heartbeat tells the peer at once
        // (the new holder stops forwarding here now, not a heartbeat timeout later).
        // (Not after a release: its VIPs are gone, and no step may act on them again.)
        let was_draining = self.drain_kept();
        if !released {
            self.queue.push_back(sm::Input::Stopping);
            self.drain().await;
        }
        // The last step's heartbeat leaves now, not at the hub's next turn.
        self.hb.flush();
        // A drain does not outlive the runtime (the held VIPs do), nor does the guard.
        self.drain_stop().await;
        // Before the guard goes: a backup path without the guard would send its traffic
        // back to the router.
        self.withdraw_backup_paths().await;
        if was_draining {
            self.guard_grace().await;
        }
        self.remove_guard().await;
        tracing::info!("agent stopping; VIPs and role are kept for the next start");
        for t in self.tasks.drain(..) {
            t.abort();
        }
        self.relay.abort();
        if let Some(a) = self.announcer.take() {
            a.abort();
        }
    }

    /// Applies `cfg`, or leaves everything as it was and says why.
    async fn reconfigure(&mut self, cfg: AgentConfig) -> Result<(), RuntimeError> {
        let io = build_io(&cfg, &self.nl, &self.l2, &self.ledger).await?;
        self.hb.update(io.hb.clone()).await?;
        // VIPs of the old configuration are the machine's to remove (below); only what the
        // ledger holds beyond both is stale.
        let old: Vec<ResolvedVip> =
            self.vips.iter().filter(|o| !io.vips.iter().any(|v| v.id == o.id)).cloned().collect();
        let keep: Vec<ResolvedVip> = io.vips.iter().cloned().chain(old).collect();
        remove_stale_vips(&self.nl, &self.ledger, &keep).await;
        tracing::info!(revision = cfg.sm.config_revision, vips = cfg.vips.len(), "applying a new configuration");
        self.reporter.links(&io.vips.iter().map(ResolvedVip::link).collect::<Vec<_>>());
        for t in self.tasks.drain(..) {
            t.abort();
        }
        // The machine may remove VIPs of the old configuration: keep their entries until
        // this step's actions ran.
        let mut all = io.vips.clone();
        for old in &self.vips {
            if !all.iter().any(|v| v.id == old.id) {
                all.push(old.clone());
            }
        }
        self.vips = all;
        self.l2 = io.l2;
        self.queue.push_back(sm::Input::ConfigChanged(Box::new(cfg.sm.clone())));
        let old_cfg = std::mem::replace(&mut self.cfg, cfg);
        // Routes and rules the new configuration no longer has go now; the step below
        // applies the others.
        self.reconfigure_holder_routes(&old_cfg).await;
        self.spawn_tasks(io.data_link, io.vip_links, io.fence, io.own);
        self.drain().await;
        self.vips = io.vips;
        drain::install_guard(&self.cfg.pair, &self.nl, &self.vips, &self.metrics).await;
        // The backup paths of the new VIPs (and none of a VIP that is gone, nor any if
        // the pair no longer asks for them).
        self.backup_tried = None;
        self.sync_backup_paths().await;
        self.observe_local_vips().await;
        Ok(())
    }

    /// Feeds the announcement gate at every wake: a gap longer than its stall bound (the
    /// machine's longest regular gap between steps plus half a heartbeat timeout) was a
    /// stall, and announcements wait until the inputs queued meanwhile are processed.
    fn stall_check(&self) {
        if let Some(gap) = self.gate.tick() {
            tracing::warn!(
                stalled_ms = gap.as_millis() as u64,
                "the agent was stalled; announcements wait until the inputs queued meanwhile are processed"
            );
        }
    }

    fn received(&mut self, r: Received) {
        match r {
            Received::Advert { path, advert, skew_ms } => {
                self.skew.record(advert.sender.as_str(), skew_ms);
                self.queue.push_back(sm::Input::Advert { path, msg: advert });
            }
            Received::Rejected { path, reason, from } => {
                self.queue.push_back(sm::Input::AdvertRejected { path, reason, from })
            }
        }
    }

    fn request(&mut self, req: Request, reply: oneshot::Sender<Reply>) {
        match req {
            Request::Status => {
                let _ = reply.send(Reply::Status(Box::new(self.machine.status())));
            }
            Request::Command(cmd) => {
                let id = match &cmd {
                    sm::Command::PlannedFailover { id, .. } | sm::Command::ForcedFailover { id, .. } => Some(*id),
                    _ => None,
                };
                self.queue.push_back(sm::Input::Command(cmd));
                match id {
                    Some(id) => {
                        self.waiters.insert(id, reply);
                    }
                    None => {
                        let _ = reply.send(Reply::Done { ok: true, message: "accepted".into() });
                    }
                }
            }
        }
    }

    /// Steps the machine through every queued input, executing actions in order.
    async fn drain(&mut self) {
        let mut changed = false;
        while let Some(input) = self.queue.pop_front() {
            if matches!(input, sm::Input::Conflict { .. }) {
                self.metrics.conflict();
            }
            let now = self.now();
            let actions = self.machine.step(now, input);
            changed = true;
            let mut vips_touched = false;
            for a in actions {
                vips_touched |= self.execute(a).await;
            }
            if vips_touched {
                self.observe_local_vips().await;
            }
        }
        if changed {
            self.sync_routed_metric().await;
            self.sync_backup_paths().await;
            self.sync_holder_routes().await;
            let st = self.machine.status();
            let released = self.holding.swap(st.holds_vips, Ordering::Relaxed) && !st.holds_vips;
            let urgent = self.machine.holder_overdue(self.now());
            let became_urgent = !self.probes_urgent.swap(urgent, Ordering::Relaxed) && urgent;
            if released || became_urgent {
                self.probes_wake.notify_waiters();
            }
            let prev = self.status_tx.borrow().clone();
            if *prev != st {
                status_metrics(&self.metrics, Some(&prev), &st);
                self.reporter.status(&st);
                let _ = self.status_tx.send(Arc::new(st));
            }
        }
    }
}

/// Sets the metrics that mirror the status (only those that changed since `prev`: most
/// steps change only a peer's last-heard time).
fn status_metrics(metrics: &PairMetrics, prev: Option<&sm::Status>, st: &sm::Status) {
    if prev.is_none_or(|p| p.epoch != st.epoch) {
        metrics.set_epoch(st.epoch);
    }
    if prev.is_none_or(|p| p.role != st.role) {
        metrics.set_role(st.role.as_str(), &sm::Role::ALL.map(sm::Role::as_str));
    }
    if prev.is_none_or(|p| p.ignored_adverts != st.ignored_adverts) {
        metrics.set_adverts_ignored(st.ignored_adverts);
    }
    if prev.is_none_or(|p| p.alarms != st.alarms) {
        for a in sm::Alarm::ALL {
            metrics.set_alarm(a.as_str(), st.alarms.contains(&a));
        }
    }
}
