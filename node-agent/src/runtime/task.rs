//! The state of a pair's runtime task ([`Runtime`], with a drain's part, [`DrainIo`]):
//! definitions only, in a leaf module; the task's behaviour is in [`super`] (the loop,
//! reconfiguration, stepping the machine), `super::execute` (the actions), `super::io`
//! (the observers) and `super::drain` (a drain and the guard).

use super::types::{Event, LeaseStore, Reply, Reporter, ResolvedVip};
use crate::announce::AnnounceGate;
use crate::config::AgentConfig;
use crate::heartbeat::{Endpoint, SkewTracker};
use crate::ledger::VipLedger;
use crate::metrics::PairMetrics;
use crate::netlink::{Netlink, Vip};
use crate::probes::L2Port;
use crate::sm;
use crate::state::StateFile;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot, watch};

/// One pair's runtime: the task that owns the machine, and what it drives.
pub(super) struct Runtime {
    /// The tick timer.
    pub(super) timer: crate::timer::Timer,
    /// A drain's addresses and rules on this node.
    pub(super) drain: DrainIo,
    pub(super) cfg: AgentConfig,
    pub(super) machine: sm::Machine,
    pub(super) origin: Instant,
    pub(super) nl: Netlink,
    pub(super) vips: Vec<ResolvedVip>,
    pub(super) l2: HashMap<String, Arc<L2Port>>,
    pub(super) hb: Arc<Endpoint>,
    pub(super) state: StateFile,
    pub(super) lease: Option<Arc<dyn LeaseStore>>,
    pub(super) reporter: Arc<dyn Reporter>,
    pub(super) metrics: PairMetrics,
    pub(super) tx: mpsc::Sender<Event>,
    pub(super) status_tx: watch::Sender<Arc<sm::Status>>,
    pub(super) holding: Arc<AtomicBool>,
    /// Routed VIPs: the node's speaker carries routes (answers, a session established);
    /// true until it says otherwise. The local probes read it.
    pub(super) speaker_ok: Arc<AtomicBool>,
    /// Set while the machine needs a data-plane verdict now (the peer probes run fast).
    pub(super) probes_urgent: Arc<AtomicBool>,
    /// Wakes the peer probes when they must start (urgent, or the VIPs were given up).
    pub(super) probes_wake: Arc<tokio::sync::Notify>,
    pub(super) waiters: HashMap<u64, oneshot::Sender<Reply>>,
    pub(super) announcer: Option<tokio::task::JoinHandle<()>>,
    pub(super) skew: Arc<SkewTracker>,
    pub(super) queue: VecDeque<sm::Input>,
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Relays the endpoint's heartbeats into the queue (lives as long as the runtime).
    pub(super) relay: tokio::task::JoinHandle<()>,
    /// The VIPs this pair added on this node.
    pub(super) ledger: VipLedger,
    /// Holds announcements back after a stall.
    pub(super) gate: Arc<AnnounceGate>,
    /// The epoch whose metric the routed VIPs on this node carry (`None`: none held).
    pub(super) routed_epoch: Option<u64>,
    /// The neighbours each VIP with `announce.unicastToNeighbours` is also announced to,
    /// read when the VIPs were taken: (VIP, neighbour, its MAC).
    pub(super) unicast_targets: Vec<(std::net::IpAddr, std::net::IpAddr, [u8; 6])>,
    /// What was last wrong with the node's BGP speaker (pairs with routed VIPs).
    pub(super) speaker_problem: Option<String>,
    /// Routed VIPs' backup paths in the kernel (`None`: not read yet).
    pub(super) backup_installed: Option<std::collections::BTreeSet<std::net::IpAddr>>,
    /// The wanted backup paths last applied (`None`: apply at the next step).
    pub(super) backup_tried: Option<std::collections::BTreeSet<std::net::IpAddr>>,
    /// The routes and rules that follow the holder, as last applied.
    pub(super) holder_routes: HolderRoutes,
    pub(super) _lock: nix::fcntl::Flock<std::fs::File>,
}

/// What this member's drain holds now.
#[derive(Default)]
pub(super) struct DrainIo {
    /// Old holder: the VIPs kept on `lo` (their `lo` form).
    pub(super) kept: Vec<Vip>,
    /// New holder: the member forwarded to.
    pub(super) forwarding: Option<sm::NodeId>,
    /// Reads the forwarded counters or the drained connections once a second.
    pub(super) monitor: Option<tokio::task::JoinHandle<()>>,
    /// The forwarder's counters last read (packets, bytes), for the metric deltas.
    pub(super) counted: Arc<std::sync::Mutex<(u64, u64)>>,
}

/// What the runtime last did with the pair's routes and rules.
#[derive(Default, Debug)]
pub(super) struct HolderRoutes {
    /// Whether they are meant to be in the kernel (`None`: not applied yet since the
    /// start: the first step also removes what the ledger records beyond them).
    pub(super) applied: Option<bool>,
    /// When a holder next checks them.
    pub(super) next_check: Option<Instant>,
}
