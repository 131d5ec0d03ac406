//! The virtual world: nodes (kernel VIPs, listener, links, agent process), a two-path
//! network, a client, a Lease store, and a discrete-event queue on a virtual clock.
//!
//! Size: one discrete-event loop whose cases all act on the same world state (nodes,
//! network, client, store); kept in one file so that the model of the network is read in
//! one place. It must not contain checks (those are in `check`) or schedule generation.
//!
//! The world does not know its checker: it tells an [`Observer`] what happens as it
//! happens ([`Observation`]), with itself to read but not to change, and traces the
//! violations the observer reports.

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap};
use std::fmt::Write as _;
use std::rc::Rc;

use super::rng::SplitMix64;
use super::types::{Findings, MAX_NODES, TraceEntry, TraceKind, Violation};
use crate::{
    Action, Advert, CasResult, Command, Config, Event, FailbackPolicy, Input, Link, Machine, Millis, NodeId, Persisted,
    ProbeResult, Reason, RejectReason, Role, Timings, VipId, VipSpec,
};

/// Heartbeat paths: 0 = data network (shares the cable with the VIPs), 1 = management.
pub(super) const PATHS: usize = 2;
/// The I/O layer's data-plane probe cadence and connect timeout, as modelled.
pub(super) const PROBE_INTERVAL: u64 = 50;
/// Connect timeout of a probe to an address nobody answers for.
pub(super) const PROBE_TIMEOUT: u64 = 80;
const LOCAL_PROBE_INTERVAL: u64 = 250;
/// The fence-target (gateway) check cadence.
pub(super) const GATEWAY_INTERVAL: u64 = 200;
const VIPS_INTERVAL: u64 = 1_000;
const TRAFFIC_INTERVAL: u64 = 1_000;
/// Heartbeats whose wall-clock timestamp is further than this from the receiver's clock are
/// rejected (`ClockSkew`), as the heartbeat layer does.
pub(super) const MAX_SKEW: u64 = 60_000;
/// Most inputs queued for a stopped agent (its socket buffers and channel are bounded).
const STALL_QUEUE: usize = 512;
/// Invariants (a) and (d) are evaluated every this many virtual ms.
pub(super) const CHECK_INTERVAL: u64 = 10;
const TRACE_KEEP: usize = 48;

/// Parameters of one schedule (drawn from its seed).
#[derive(Clone, Debug)]
pub(super) struct Params {
    pub n: usize,
    pub vips: Vec<VipSpec>,
    pub has_target: bool,
    pub gateway_configured: bool,
    pub store_fast_fail: bool,
    /// Per path: one-way delay range in ms.
    pub delay: [(u64, u64); PATHS],
    /// Lease store one-way latency range in ms.
    pub store_lat: (u64, u64),
    pub timings: Timings,
    pub failback: FailbackPolicy,
    pub start_alone: bool,
    /// Warm start: this node is already active (epoch `base_epoch`, VIPs on its interface).
    pub warm: Option<usize>,
    /// Epoch every member starts with (a few schedules start at the top of the domain).
    pub base_epoch: u64,
    /// Faults happen before this time; then everything heals.
    pub fault_end: u64,
    /// Time after the heal before the final check.
    pub settle: u64,
    /// Standalone mode with a witness: the store is the witness (takeovers need its vote;
    /// it refuses a claim while it hears the holder, which reads it every
    /// [`Params::witness_poll`]).
    pub witness: bool,
    /// Quorum fencing (the control-plane mode; only with `witness`): the store stands for
    /// the majority of the members' votes, and a holder keeps the VIPs only while it
    /// confirms it within this quorum lease (ms).
    pub quorum: Option<u64>,
}

impl Params {
    pub(super) fn max_delay(&self) -> u64 {
        self.delay.iter().map(|d| d.1).max().unwrap_or(0)
    }

    /// How often a member reads the witness (the client's: a third of the heartbeat
    /// timeout, 20 to 200 ms).
    pub(super) fn witness_poll(&self) -> u64 {
        (self.timings.heartbeat_timeout_ms / 3).clamp(20, 200)
    }

    /// How long the witness must not have heard a holder for a claim (the client's: half
    /// the heartbeat timeout).
    pub(super) fn witness_grace(&self) -> u64 {
        match self.quorum {
            // The quorum client's: the lease plus two reads and a margin, so that a holder
            // gives the VIPs up before any voter grants another claim.
            Some(lease) => lease + 2 * self.witness_poll() + 50,
            None => self.timings.heartbeat_timeout_ms / 2,
        }
    }
}

/// One simulated node.
pub(super) struct Node {
    pub priority: u8,
    pub cfg: Config,
    pub machine: Option<Machine>,
    /// Agent incarnation; events of older incarnations are dropped.
    pub inc: u32,
    pub powered: bool,
    pub paused: bool,
    pub persisted: Persisted,
    /// Kernel-held VIPs (bit per VIP index).
    pub kernel: u8,
    pub listener: bool,
    pub carrier: bool,
    pub mgmt: bool,
    pub gw: bool,
    pub client: bool,
    pub store: bool,
    /// Offset of this node's wall clock from true time, in ms (heartbeats carry wall-clock
    /// timestamps: receivers reject those more than [`MAX_SKEW`] off their own clock).
    pub wall_offset: i64,
    /// The state file is corrupt (or holds an epoch outside the domain): the agent refuses
    /// to start until an operator removes it ([`Fault::StateRepair`]).
    pub state_corrupt: bool,
    /// Inputs that arrived while the agent was stopped (heartbeats, Lease events, CAS
    /// answers), fed in order when it resumes: the kernel and the runtime queue them.
    pub stalled: Vec<Input>,
    /// Heartbeat sessions: incremented at every agent start (the heartbeat layer's hook;
    /// see [`World::replay_ok`]).
    pub session: u64,
    /// The heartbeat layer's replay windows of this node's agent, per path and sender.
    pub replay: [[Option<ReplayState>; MAX_NODES]; PATHS],
    /// Sequence number of this node's last heartbeat.
    pub seq_sent: u64,
    pub key: u32,
    pub traffic: Option<u64>,
    /// The kernel refuses to add addresses (for example DAD failure).
    pub add_fails: bool,
    /// Offset of this boot's monotonic clock.
    pub mono_base: u64,
    pub agent_started: u64,
    /// When the agent's last Tick was fed (true time).
    pub tick_base: u64,
    /// When its next Tick is due (true time); a Tick event at any other time is stale.
    pub tick_at: u64,
}

impl Node {
    pub(super) fn live(&self) -> bool {
        self.powered && self.machine.is_some() && !self.paused
    }
}

/// A receiver's replay window for one sender on one path (the heartbeat layer's).
#[derive(Clone, Copy, Debug)]
pub(super) struct ReplayState {
    session: u64,
    highest: u64,
    bitmap: u64,
}

/// How a state file is damaged while its agent is down.
#[derive(Clone, Copy, Debug)]
pub(super) enum StateDamage {
    /// Deleted (a wiped state directory): the agent starts from the defaults.
    Lost,
    /// Replaced by one that says Standby (a restored backup) with the same epoch.
    SaysStandby,
    /// Unreadable, or an epoch outside the domain: the agent refuses to start until an
    /// operator removes the file.
    Corrupt,
}

/// Who receives an operator command.
#[derive(Clone, Debug)]
pub(super) enum CmdTarget {
    /// The node holding the VIPs now (else node 0).
    Holder,
    /// A given node.
    Node(usize),
    /// Every node.
    All,
}

/// A world change (fault, repair, operator action).
#[derive(Clone, Debug)]
pub(super) enum Fault {
    PowerOff(usize),
    /// Power off whichever node holds the VIPs now (then power it on `after` ms later).
    PowerOffHolder {
        after: u64,
    },
    PowerOn(usize),
    AgentCrash(usize),
    AgentStart(usize),
    /// The node's wall clock steps by this many ms (NTP after a restart, a fixed RTC).
    ClockStep(usize, i64),
    /// The agent's state file is damaged (apply while the agent is down).
    StateDamage(usize, StateDamage),
    /// An operator removes a corrupt state file and starts the agent.
    StateRepair(usize),
    /// An agent restart of `node` (or of whichever node holds the VIPs now): the agent stops,
    /// its state file may be damaged and its node's wall clock may step, and it starts again
    /// `after` ms later (a corrupt file: an operator removes it `after` ms later still).
    Restart {
        node: Option<usize>,
        damage: Option<StateDamage>,
        clock_step: i64,
        after: u64,
    },
    /// SIGSTOP of `node` (or of the holder) for `len` ms.
    Stall {
        node: Option<usize>,
        len: u64,
    },
    Pause(usize),
    Resume(usize),
    /// Heartbeat-only block (a firewall on the heartbeat port) on `path`, one direction.
    HbBlock {
        path: usize,
        from: usize,
        to: usize,
        on: bool,
    },
    /// IP-level cut on network `net` (0 data, 1 management), one direction.
    Cut {
        net: usize,
        from: usize,
        to: usize,
        on: bool,
    },
    Carrier(usize, bool),
    /// One cycle of a flapping data link: the link of `node` (or, with `follow`, of
    /// whichever node holds the VIPs now) goes down for `down` ms, then up; the next cycle
    /// starts `down + up` ms later, until `until`.
    Flap {
        node: usize,
        follow: bool,
        down: u64,
        up: u64,
        until: u64,
    },
    Mgmt(usize, bool),
    Gateway(usize, bool),
    Client(usize, bool),
    Store(usize, bool),
    Listener(usize, bool),
    Skew(usize, bool),
    Key(usize, u32),
    /// Loss on a path, per mille.
    Loss(usize, u32),
    Traffic(usize, Option<u64>),
    /// Someone else deleted the node's VIPs from its interface.
    VipFlush(usize),
    /// The kernel refuses (or stops refusing) to add the VIPs on the node.
    AddFails(usize, bool),
    Cmd(CmdTarget, Command),
    /// Several changes at once, under one label.
    Many(&'static str, Vec<Fault>),
    HealAll,
}

#[derive(Clone, Debug)]
enum NodeEv {
    Tick,
    DrainStarted,
    ProbeStart,
    ProbeDone {
        vip: usize,
        up: bool,
    },
    LocalProbe,
    GatewayFeed,
    VipsFeed {
        periodic: bool,
    },
    TrafficFeed,
    InitFeed,
    LeaseFeed,
    LeaseRenewed {
        holder: usize,
        epoch: u64,
    },
    CasReply(CasResult),
    /// Quorum mode: the store confirmed this node as holder on a proof taken at true time
    /// `at`.
    LeaseConfirmed {
        at: u64,
    },
    /// The witness did not answer two reads (witness mode).
    WitnessUnreachable,
    /// Node `from` answers for VIP `vip` too (its announcement, or its answer to this
    /// node's ARP probe).
    Conflict {
        vip: usize,
        from: usize,
    },
}

#[derive(Clone, Debug)]
enum Ev {
    Node { n: usize, inc: u32, ev: NodeEv },
    Deliver { to: usize, from: usize, path: usize, msg: Rc<Advert>, session: u64, seq: u64 },
    CasAtStore { n: usize, inc: u32, new_epoch: u64, expected: u64 },
    World(Fault),
    Check,
}

struct Sched {
    t: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Sched {
    fn eq(&self, o: &Sched) -> bool {
        (self.t, self.seq) == (o.t, o.seq)
    }
}
impl Eq for Sched {}
impl PartialOrd for Sched {
    fn partial_cmp(&self, o: &Sched) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Sched {
    // Reversed: BinaryHeap is a max-heap and we pop the earliest (time, seq).
    fn cmp(&self, o: &Sched) -> Ordering {
        (o.t, o.seq).cmp(&(self.t, self.seq))
    }
}

/// Machine state before a step, to detect what the step changed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Snap {
    pub holds: bool,
    pub epoch: u64,
    pub held: Option<u64>,
    pub role: Role,
}

/// Counters of one schedule (the checker keeps its own, in [`Findings`]).
#[derive(Clone, Debug, Default)]
pub(super) struct Stats {
    pub steps: u64,
    pub events: u64,
    pub planned_ok: u64,
    /// Role changes per reason (`Reason as usize`).
    pub reasons: [u64; 32],
}

/// What happens in the world, as its [`Observer`] is told: at the moment it happens,
/// with the world in the state right after it (right before it where a variant says so).
#[derive(Clone, Copy, Debug)]
pub(super) enum Observation<'a> {
    /// The agents are about to boot (virtual time 0; a warm start's holder has the VIPs).
    Start,
    /// A scheduled world change (a fault, a heal, a command) was applied.
    WorldChanged,
    /// Every [`CHECK_INTERVAL`] virtual ms.
    Periodic,
    /// Node `n`'s machine took one step (`before` and `after` it), its actions applied.
    Stepped { n: usize, before: Snap, after: Snap },
    /// Node `n`'s kernel VIPs changed (bit masks).
    Kernel { n: usize, old: u8, new: u8 },
    /// Node `n` announced the VIPs.
    Announced { n: usize },
    /// Node `n` sent a Lease compare-and-swap from `expected` to `new`.
    CasSent { n: usize, expected: u64, new: u64 },
    /// The store takes node `n`'s compare-and-swap: the Lease's epoch goes from `old` to
    /// `new` (told before it is written).
    LeaseWrite { n: usize, old: u64, new: u64 },
    /// Node `n` persists `epoch` (told before the state file is written).
    Persist { n: usize, epoch: u64 },
    /// Node `n` committed a handover (it is Demoting) for `reason`.
    HandoverStarted { n: usize, reason: Reason },
    /// Node `n`'s agent started.
    AgentStarted { n: usize },
    /// Node `n` is about to be powered off (told before it is).
    PowerOff { n: usize },
    /// Node `n`'s state file was lost, replaced or repaired: its epoch may go back.
    StateReplaced { n: usize },
    /// Node `n`'s data-link carrier changed.
    Carrier { n: usize, up: bool },
    /// Node `n`'s agent resumed after a stop.
    Resumed { n: usize },
    /// Node `n`'s inputs queued during its stop are about to be fed.
    BurstBegins { n: usize },
    /// Node `n`'s queued inputs were fed.
    BurstEnds { n: usize },
    /// An operator command is delivered to node `n`.
    Command { n: usize, cmd: &'a Command },
    /// The schedule is over (after the heal and the settle time).
    End,
}

/// Who watches the world (the checker). It reads the world; it cannot change it.
pub(super) trait Observer {
    /// `ev` happens in `w` now. Returns the invariants found broken for the first time
    /// (the world traces them).
    fn observe(&mut self, w: &World, ev: Observation<'_>) -> Vec<Violation>;

    /// What it found so far.
    fn findings(&self) -> Findings;
}

/// The simulated world of one schedule.
pub(super) struct World {
    pub t: u64,
    seq: u64,
    queue: BinaryHeap<Sched>,
    pub rng: SplitMix64,
    pub p: Params,
    pub nodes: Vec<Node>,
    /// `[path][from][to]` heartbeat-only blocks.
    pub hb_block: [[[bool; MAX_NODES]; MAX_NODES]; PATHS],
    /// `[net][from][to]` IP-level cuts.
    pub cut: [[[bool; MAX_NODES]; MAX_NODES]; PATHS],
    /// Per-path loss, per mille.
    pub loss: [u32; PATHS],
    pub store_holder: Option<usize>,
    pub store_epoch: u64,
    /// When the witness last heard each member (a read, a claim or a renewal).
    pub witness_heard: [u64; MAX_NODES],
    /// Told of everything that happens (taken out while it is being told).
    observer: Option<Box<dyn Observer>>,
    pub stats: Stats,
    pub trace: std::collections::VecDeque<TraceEntry>,
    pub full_trace: Option<Vec<TraceEntry>>,
    pub digest: u64,
    next_op_id: u64,
    buf: Vec<Action>,
    #[cfg(test)]
    pub break_probe: bool,
}

impl World {
    pub(super) fn new(p: Params, rng: SplitMix64, full_trace: bool, observer: Box<dyn Observer>) -> World {
        let mut rng = rng;
        let members: Vec<crate::Member> = (0..p.n).map(|i| crate::Member { node: node_name(i), priority: 0 }).collect();
        // Distinct priorities in random order.
        let mut prios: Vec<u8> = Vec::new();
        while prios.len() < p.n {
            let c = u8::try_from(rng.range(1, 254)).unwrap_or(1);
            if !prios.contains(&c) {
                prios.push(c);
            }
        }
        let members: Vec<crate::Member> = members
            .into_iter()
            .zip(&prios)
            .map(|(mut m, pr)| {
                m.priority = *pr;
                m
            })
            .collect();
        let nodes = (0..p.n)
            .map(|i| {
                let mut cfg = Config::new(node_name(i), members.clone());
                cfg.paths = vec![crate::PathId(0), crate::PathId(1)];
                cfg.vips = p.vips.clone();
                cfg.timings = p.timings.clone();
                cfg.failback = p.failback.clone();
                cfg.start_alone = p.start_alone;
                cfg.lease_vote_required = p.witness;
                cfg.quorum_lease_ms = p.quorum;
                // The Kubernetes Lease store bounds an agent's epoch step (the admission
                // policy); the witness does not.
                cfg.lease_max_step = (!p.witness).then_some(crate::MAX_LEASE_STEP);
                cfg.config_revision = 1;
                cfg.flap = crate::FlapPolicy { moves: 3, window_ms: 20_000, quiet_ms: 10_000 };
                let persisted = Persisted {
                    epoch: p.base_epoch,
                    last_role: if p.warm == Some(i) { Role::Active } else { Role::Standby },
                    ..Persisted::default()
                };
                let all = if p.warm == Some(i) { (1u8 << p.vips.len()) - 1 } else { 0 };
                Node {
                    priority: prios[i],
                    cfg,
                    machine: None,
                    inc: 0,
                    powered: true,
                    paused: false,
                    persisted,
                    kernel: all,
                    listener: true,
                    carrier: true,
                    mgmt: true,
                    gw: true,
                    client: true,
                    store: true,
                    wall_offset: 0,
                    state_corrupt: false,
                    stalled: Vec::new(),
                    session: 0,
                    replay: [[None; MAX_NODES]; PATHS],
                    seq_sent: 0,
                    key: 0,
                    traffic: Some(1_000),
                    add_fails: false,
                    mono_base: rng.range(0, 1_000_000),
                    agent_started: 0,
                    tick_base: 0,
                    tick_at: 0,
                }
            })
            .collect();
        let store_holder = p.warm;
        let store_epoch = if p.warm.is_some() { p.base_epoch } else { 0 };
        World {
            t: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            rng,
            nodes,
            hb_block: [[[false; MAX_NODES]; MAX_NODES]; PATHS],
            cut: [[[false; MAX_NODES]; MAX_NODES]; PATHS],
            loss: [0; PATHS],
            store_holder,
            store_epoch,
            witness_heard: [0; MAX_NODES],
            observer: Some(observer),
            stats: Stats::default(),
            trace: std::collections::VecDeque::new(),
            full_trace: full_trace.then(Vec::new),
            digest: 0xcbf2_9ce4_8422_2325,
            next_op_id: 1,
            buf: Vec::new(),
            p,
            #[cfg(test)]
            break_probe: false,
        }
    }

    /// Tells the observer that `ev` happens, and traces the violations it reports.
    pub(super) fn tell(&mut self, ev: Observation<'_>) {
        let Some(mut observer) = self.observer.take() else {
            return;
        };
        let found = observer.observe(self, ev);
        self.observer = Some(observer);
        for v in found {
            self.trace_push(TraceKind::Violation(v.invariant, v.detail));
        }
    }

    /// What the observer found.
    pub(super) fn findings(&self) -> Findings {
        self.observer.as_ref().map(|o| o.findings()).unwrap_or_default()
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Sched { t: at, seq: self.seq, ev });
    }

    fn push_node(&mut self, n: usize, after: u64, ev: NodeEv) {
        let inc = self.nodes[n].inc;
        self.push(self.t + after, Ev::Node { n, inc, ev });
    }

    /// Schedules a world change.
    pub(super) fn at(&mut self, t: u64, f: Fault) {
        self.push(t, Ev::World(f));
    }

    /// Starts the schedule: agents boot (cold: at random offsets; warm: all at once).
    pub(super) fn boot(&mut self) {
        for n in 0..self.p.n {
            let at = if self.p.warm.is_some() { 0 } else { self.rng.range(0, 800) };
            self.at(at, Fault::AgentStart(n));
        }
        self.push(CHECK_INTERVAL, Ev::Check);
        self.tell(Observation::Start);
    }

    /// Runs until `end` (virtual ms).
    pub(super) fn run_until(&mut self, end: u64) {
        while let Some(top) = self.queue.peek() {
            if top.t > end {
                break;
            }
            let Some(s) = self.queue.pop() else {
                break;
            };
            self.t = s.t;
            self.stats.events += 1;
            self.dispatch(s.ev);
        }
        self.t = end;
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Node { n, inc, ev } => {
                if self.nodes[n].inc == inc && self.nodes[n].machine.is_some() {
                    self.node_event(n, ev);
                }
            }
            Ev::Deliver { to, from, path, msg, session, seq } => self.deliver(to, from, path, &msg, session, seq),
            Ev::CasAtStore { n, inc, new_epoch, expected } => self.cas_at_store(n, inc, new_epoch, expected),
            Ev::World(f) => {
                self.trace_push(TraceKind::Fault(fault_label(&f)));
                self.world(f);
                self.tell(Observation::WorldChanged);
            }
            Ev::Check => {
                self.witness_reads();
                self.tell(Observation::Periodic);
                self.push(self.t + CHECK_INTERVAL, Ev::Check);
            }
        }
    }

    fn node_event(&mut self, n: usize, ev: NodeEv) {
        let tick = self.p.timings.tick_ms;
        match ev {
            NodeEv::Tick => {
                if self.nodes[n].tick_at != self.t {
                    // Superseded: the tick was brought forward (or already fed at this time).
                    return;
                }
                self.feed(n, Input::Tick);
                self.nodes[n].tick_base = self.t;
                // Like the runtime: the next tick when the machine needs it, at the regular
                // interval while the agent is stopped (its timer fires into a stopped process).
                let next = self.wanted_tick(n).unwrap_or(self.t + tick);
                self.nodes[n].tick_at = next;
                self.push(next, Ev::Node { n, inc: self.nodes[n].inc, ev: NodeEv::Tick });
            }
            NodeEv::ProbeStart => {
                self.probe(n);
                self.push_node(n, PROBE_INTERVAL, NodeEv::ProbeStart);
            }
            NodeEv::ProbeDone { vip, up } => {
                let vip = self.p.vips[vip].id.clone();
                let result = if up { ProbeResult::Up } else { ProbeResult::Down };
                self.feed(n, Input::PeerProbe { vip, result });
            }
            NodeEv::LocalProbe => {
                self.local_probes(n);
                self.push_node(n, LOCAL_PROBE_INTERVAL, NodeEv::LocalProbe);
            }
            NodeEv::GatewayFeed => {
                self.feed_gateway(n);
                self.push_node(n, GATEWAY_INTERVAL, NodeEv::GatewayFeed);
            }
            NodeEv::VipsFeed { periodic } => {
                self.feed_vips(n);
                if periodic {
                    self.push_node(n, VIPS_INTERVAL, NodeEv::VipsFeed { periodic });
                }
            }
            NodeEv::TrafficFeed => {
                let bytes_per_sec = self.nodes[n].traffic;
                self.feed(n, Input::Traffic { bytes_per_sec });
                self.push_node(n, TRAFFIC_INTERVAL, NodeEv::TrafficFeed);
            }
            NodeEv::InitFeed => self.resync(n),
            NodeEv::DrainStarted => self.feed(n, Input::DrainStarted { ok: true, detail: String::new() }),
            NodeEv::LeaseFeed => {
                if self.nodes[n].store {
                    let holder = self.store_holder.map(node_name);
                    let epoch = self.store_epoch;
                    self.feed(n, Input::LeaseObserved { holder, epoch });
                }
            }
            NodeEv::LeaseRenewed { holder, epoch } => {
                if self.nodes[n].store {
                    self.feed(n, Input::LeaseRenewed { holder: node_name(holder), epoch });
                }
            }
            NodeEv::CasReply(r) => self.feed(n, Input::CasResult(r)),
            NodeEv::LeaseConfirmed { at } => {
                let at = crate::Millis(at + self.nodes[n].mono_base);
                self.feed(n, Input::LeaseConfirmed { at });
            }
            NodeEv::WitnessUnreachable => {
                if !self.nodes[n].store {
                    self.feed(n, Input::LeaseUnreachable);
                }
            }
            NodeEv::Conflict { vip, from } => {
                // Only while both still hold it and reach each other on the data network.
                let bit = 1u8 << vip;
                if self.nodes[n].kernel & bit != 0 && self.nodes[from].kernel & bit != 0 && self.data_reach(n, from) {
                    let id = self.p.vips[vip].id.clone();
                    self.feed(n, Input::Conflict { vip: id, foreign_mac: mac_of(from) });
                }
            }
        }
    }

    /// Node `from`'s frames for the VIPs it holds reach the nodes that hold one of them too
    /// (its announcements, its answers to their ARP probes): they see a foreign holder.
    fn conflicts_seen(&mut self, seen_by: &[usize], from: usize) {
        for &m in seen_by {
            let shared = self.nodes[m].kernel & self.nodes[from].kernel;
            if m == from || shared == 0 || !self.data_reach(m, from) {
                continue;
            }
            let vip = shared.trailing_zeros() as usize;
            let (lo, hi) = self.p.delay[0];
            let d = self.rng.range(lo, hi) + 1;
            self.push_node(m, d, NodeEv::Conflict { vip, from });
        }
    }

    /// The members' reads of the witness: a live member that reaches it is heard once per
    /// poll interval (at its own phase).
    fn witness_reads(&mut self) {
        if !self.p.witness {
            return;
        }
        let poll = self.p.witness_poll();
        for n in 0..self.p.n {
            let phase = (n as u64 * 37) % poll;
            let holds = self.nodes[n].machine.as_ref().is_some_and(|m| m.holds_vips());
            if self.nodes[n].live() && self.nodes[n].store && (self.t + phase) % poll < CHECK_INTERVAL {
                // A read: it says whether this member holds the VIPs (only a holder's counts;
                // 0: not heard holding).
                self.witness_heard[n] = if holds { self.t.max(1) } else { 0 };
                // Quorum mode: the answer confirms a holder that no newer claim superseded.
                let held = self.nodes[n].machine.as_ref().and_then(|m| m.held_epoch()).unwrap_or(0);
                if holds && self.p.quorum.is_some() && (self.store_holder == Some(n) || self.store_epoch <= held) {
                    let d = self.store_delay();
                    let at = self.t;
                    self.push_node(n, d, NodeEv::LeaseConfirmed { at });
                }
            }
        }
    }

    /// A member that cannot reach the witness learns it after two unanswered reads.
    fn witness_lost(&mut self, n: usize) {
        if self.p.witness && self.nodes[n].machine.is_some() {
            let after = 2 * self.p.witness_poll() + 100;
            self.push_node(n, after, NodeEv::WitnessUnreachable);
        }
    }

    /// Feeds the current state of links, gateway, VIPs, listeners and traffic (at start
    /// and after a pause: the I/O layer re-reads everything).
    fn resync(&mut self, n: usize) {
        let up = self.nodes[n].carrier;
        self.feed(n, Input::Carrier { link: Link::Data, up });
        self.feed(n, Input::Carrier { link: Link::Vip, up });
        self.feed_gateway(n);
        self.feed_vips(n);
        self.local_probes(n);
        let bytes_per_sec = self.nodes[n].traffic;
        self.feed(n, Input::Traffic { bytes_per_sec });
    }

    fn feed_gateway(&mut self, n: usize) {
        let reachable = if self.p.gateway_configured { Some(self.nodes[n].gw && self.nodes[n].carrier) } else { None };
        self.feed(n, Input::Gateway { reachable });
    }

    fn feed_vips(&mut self, n: usize) {
        let k = self.nodes[n].kernel;
        let present: BTreeSet<VipId> =
            self.p.vips.iter().enumerate().filter(|(i, _)| k & (1 << i) != 0).map(|(_, v)| v.id.clone()).collect();
        self.feed(n, Input::LocalVips { present });
    }

    fn local_probes(&mut self, n: usize) {
        let up = self.nodes[n].listener;
        for vi in 0..self.p.vips.len() {
            for pi in 0..self.p.vips[vi].probe_ports.len() {
                let vip = self.p.vips[vi].id.clone();
                let port = self.p.vips[vi].probe_ports[pi];
                self.feed(n, Input::LocalProbe { vip, port, up });
            }
        }
    }

    /// TCP connect through the VIP from `n`: succeeds iff some node `n` reaches on the data
    /// network holds the VIP in its kernel with its listener up; a holder without a
    /// listener answers RST (fast failure); nobody → connect timeout.
    fn probe(&mut self, n: usize) {
        if !self.p.has_target || !self.nodes[n].live() {
            return;
        }
        if self.nodes[n].machine.as_ref().is_some_and(|m| m.holds_vips()) {
            return;
        }
        for vi in 0..self.p.vips.len() {
            if self.p.vips[vi].probe_ports.is_empty() {
                continue;
            }
            let mut answer: Option<bool> = None;
            for h in 0..self.p.n {
                let node = &self.nodes[h];
                if node.powered && node.kernel & (1 << vi) != 0 && self.data_reach(n, h) {
                    let up = node.listener;
                    answer = Some(answer.unwrap_or(false) || up);
                }
            }
            let (delay, up) = match answer {
                Some(up) => (self.rng.range(1, 3), up),
                None => (PROBE_TIMEOUT, false),
            };
            self.push_node(n, delay, NodeEv::ProbeDone { vip: vi, up });
        }
    }

    pub(super) fn path_ok(&self, p: usize, i: usize, j: usize) -> bool {
        let (a, b) = (&self.nodes[i], &self.nodes[j]);
        a.powered
            && b.powered
            && !self.hb_block[p][i][j]
            && !self.cut[p][i][j]
            && if p == 0 { a.carrier && b.carrier } else { a.mgmt && b.mgmt }
    }

    /// Loss on heartbeat path `p` (per mille).
    pub(super) fn path_loss(&self, p: usize) -> u32 {
        self.loss[p]
    }

    /// Bidirectional IP reachability on the data network (or the node itself).
    pub(super) fn data_reach(&self, i: usize, h: usize) -> bool {
        if i == h {
            return self.nodes[i].powered;
        }
        let (a, b) = (&self.nodes[i], &self.nodes[h]);
        a.powered && b.powered && a.carrier && b.carrier && !self.cut[0][i][h] && !self.cut[0][h][i]
    }

    pub(super) fn client_reach(&self, h: usize) -> bool {
        let a = &self.nodes[h];
        a.powered && a.carrier && a.client
    }

    /// Two agents exchange verifiable heartbeats in both directions on some path (with
    /// `lossless`: on a path without loss).
    pub(super) fn connected(&self, i: usize, j: usize, lossless: bool) -> bool {
        let (a, b) = (&self.nodes[i], &self.nodes[j]);
        if !a.live() || !b.live() || a.key != b.key || a.wall_offset.abs_diff(b.wall_offset) > MAX_SKEW {
            return false;
        }
        (0..PATHS).any(|p| self.path_ok(p, i, j) && self.path_ok(p, j, i) && (!lossless || self.loss[p] == 0))
    }

    fn broadcast(&mut self, from: usize, adv: Advert) {
        let msg = Rc::new(adv);
        let session = self.nodes[from].session;
        self.nodes[from].seq_sent += 1;
        let seq = self.nodes[from].seq_sent;
        for to in 0..self.p.n {
            if to == from {
                continue;
            }
            for path in 0..PATHS {
                if !self.path_ok(path, from, to) {
                    continue;
                }
                if self.loss[path] > 0 && self.rng.below(1000) < u64::from(self.loss[path]) {
                    continue;
                }
                let (lo, hi) = self.p.delay[path];
                let d = self.rng.range(lo, hi);
                self.push(self.t + d, Ev::Deliver { to, from, path, msg: Rc::clone(&msg), session, seq });
            }
        }
    }

    fn deliver(&mut self, to: usize, from: usize, path: usize, msg: &Rc<Advert>, session: u64, seq: u64) {
        if !self.nodes[to].powered || self.nodes[to].machine.is_none() {
            return;
        }
        let p = crate::PathId(u8::try_from(path).unwrap_or(0));
        let input = if self.nodes[from].key != self.nodes[to].key {
            Input::AdvertRejected { path: p, reason: RejectReason::KeyMismatch, from: Some(node_name(from)) }
        } else if self.nodes[from].wall_offset.abs_diff(self.nodes[to].wall_offset) > MAX_SKEW {
            Input::AdvertRejected { path: p, reason: RejectReason::ClockSkew, from: Some(node_name(from)) }
        } else if !self.replay_ok(to, path, from, session, seq) {
            // Single replays are only counted by the heartbeat layer; the machine hears of
            // replays only when every datagram of a member is refused for a heartbeat
            // timeout, which a model whose newer session always wins never produces.
            return;
        } else {
            Input::Advert { path: p, msg: (**msg).clone() }
        };
        self.feed(to, input);
    }

    /// The heartbeat layer's replay check (the hook for its model): a 64-wide window per
    /// sender and path, and a sender's new session (a restarted agent) resets it, so a
    /// restarted peer is heard at once whatever its clock did; an older session is a replay.
    /// (The real layer takes a new session once it echoes the receiver's session id, proof
    /// that it began later; sessions numbered in start order stand in for that proof.)
    /// The sequence numbers themselves never depend on the wall clock here: a model whose
    /// sequence started at the wall clock and whose window outlived the sender's restarts
    /// would lock out a peer restarted with its clock stepped back.
    fn replay_ok(&mut self, to: usize, path: usize, from: usize, session: u64, seq: u64) -> bool {
        let slot = &mut self.nodes[to].replay[path][from];
        match slot {
            Some(w) if session < w.session => false,
            Some(w) if session == w.session => {
                if seq > w.highest {
                    let shift = seq - w.highest;
                    w.bitmap = if shift >= 64 { 1 } else { (w.bitmap << shift) | 1 };
                    w.highest = seq;
                    true
                } else {
                    let back = w.highest - seq;
                    if back >= 64 || w.bitmap & (1 << back) != 0 {
                        false
                    } else {
                        w.bitmap |= 1 << back;
                        true
                    }
                }
            }
            _ => {
                *slot = Some(ReplayState { session, highest: seq, bitmap: 1 });
                true
            }
        }
    }

    fn store_delay(&mut self) -> u64 {
        let (lo, hi) = self.p.store_lat;
        self.rng.range(lo, hi)
    }

    fn cas_at_store(&mut self, n: usize, inc: u32, new_epoch: u64, expected: u64) {
        if !self.nodes[n].store {
            if self.p.store_fast_fail {
                self.push(self.t + 1, Ev::Node { n, inc, ev: NodeEv::CasReply(CasResult::Unavailable) });
            }
            return;
        }
        // (A write says nothing new about whether the writer holds: the witness keeps what
        // its last read said.)
        // The witness refuses a claim while it hears another member holding the VIPs (the
        // record's holder, or one that took them in a handover whose write never landed).
        let grace = self.p.witness_grace();
        let holding = (0..self.p.n).find(|&h| {
            self.p.witness
                && h != n
                && self.witness_heard[h] > 0
                && self.t.saturating_sub(self.witness_heard[h]) < grace
        });
        let r = if let Some(h) = holding.filter(|_| self.store_epoch == expected) {
            CasResult::HolderAlive { holder: node_name(h), epoch: self.store_epoch }
        } else if self.store_epoch == expected {
            self.tell(Observation::LeaseWrite { n, old: self.store_epoch, new: new_epoch });
            self.store_holder = Some(n);
            self.store_epoch = new_epoch;
            self.trace_push(TraceKind::Lease { holder: n, epoch: new_epoch });
            // Watch notifications to every member that reaches the store.
            for m in 0..self.p.n {
                if self.nodes[m].store && self.nodes[m].machine.is_some() {
                    let d = self.store_delay();
                    self.push_node(m, d, NodeEv::LeaseFeed);
                }
            }
            if self.p.quorum.is_some() {
                // The voters count a granted claimer as holding from the grant (it adds the
                // VIPs next), and the claimer's lease starts there; the confirmation
                // reaches it before the answer.
                self.witness_heard[n] = self.t.max(1);
                let (d, at) = (self.store_delay(), self.t);
                self.push(self.t + d, Ev::Node { n, inc, ev: NodeEv::LeaseConfirmed { at } });
                self.push(self.t + d, Ev::Node { n, inc, ev: NodeEv::CasReply(CasResult::Ok { epoch: new_epoch }) });
                return;
            }
            CasResult::Ok { epoch: new_epoch }
        } else {
            CasResult::Conflict { holder: self.store_holder.map(node_name), epoch: self.store_epoch }
        };
        let d = self.store_delay();
        self.push(self.t + d, Ev::Node { n, inc, ev: NodeEv::CasReply(r) });
    }

    /// Steps node `n`'s machine with `input` (if its agent runs and is not stopped) and
    /// carries out the actions.
    pub(super) fn feed(&mut self, n: usize, input: Input) {
        let node = &mut self.nodes[n];
        if !node.powered {
            return;
        }
        if node.paused {
            // What arrives from outside waits in socket buffers and the runtime's channel;
            // the agent's own observations (timers, probes, netlink reads) do not run.
            let queued = matches!(
                input,
                Input::Advert { .. } | Input::AdvertRejected { .. } | Input::CasResult(_) | Input::LeaseObserved { .. }
            );
            if queued && node.machine.is_some() && node.stalled.len() < STALL_QUEUE {
                node.stalled.push(input);
            }
            return;
        }
        let now = Millis(self.t + node.mono_base);
        let Some(m) = node.machine.as_mut() else {
            return;
        };
        let before = Snap { holds: m.holds_vips(), epoch: m.epoch(), held: m.held_epoch(), role: m.role() };
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        m.step_into(now, input, &mut buf);
        let after = Snap { holds: m.holds_vips(), epoch: m.epoch(), held: m.held_epoch(), role: m.role() };
        self.stats.steps += 1;
        for a in buf.drain(..) {
            self.apply(n, a);
        }
        self.buf = buf;
        self.tell(Observation::Stepped { n, before, after });
        // The runtime re-arms its timer after every step: an input may bring the next
        // tick forward (never back: the one scheduled still fires).
        if let Some(want) = self.wanted_tick(n)
            && want < self.nodes[n].tick_at
        {
            self.nodes[n].tick_at = want;
            self.push(want, Ev::Node { n, inc: self.nodes[n].inc, ev: NodeEv::Tick });
        }
    }

    /// When node `n`'s machine wants its next Tick (true time, after now), or `None`
    /// when no agent runs or it is stopped.
    fn wanted_tick(&self, n: usize) -> Option<u64> {
        let node = &self.nodes[n];
        if node.paused || !node.powered {
            return None;
        }
        let m = node.machine.as_ref()?;
        let at = m.next_tick(Millis(node.tick_base + node.mono_base)).0.saturating_sub(node.mono_base);
        Some(at.max(self.t + 1))
    }

    fn vip_mask(&self, vips: &[VipId]) -> u8 {
        let mut mask = 0u8;
        for (i, v) in self.p.vips.iter().enumerate() {
            if vips.contains(&v.id) {
                mask |= 1 << i;
            }
        }
        mask
    }

    pub(super) fn set_kernel(&mut self, n: usize, k: u8) {
        let old = self.nodes[n].kernel;
        if old == k {
            return;
        }
        self.nodes[n].kernel = k;
        self.tell(Observation::Kernel { n, old, new: k });
        self.trace_push(TraceKind::Kernel { n, vips: k });
    }

    fn apply(&mut self, n: usize, a: Action) {
        match a {
            Action::AddVips(v) => {
                if !self.nodes[n].add_fails {
                    let k = self.nodes[n].kernel | self.vip_mask(&v);
                    self.set_kernel(n, k);
                }
                self.push_node(n, 1, NodeEv::VipsFeed { periodic: false });
            }
            Action::DrainVips { vips, .. } => {
                // The drained addresses answer no ARP: for the world (and its checks) they
                // are gone from this node, as `RemoveVips` would make them.
                let k = self.nodes[n].kernel & !self.vip_mask(&vips);
                self.set_kernel(n, k);
                self.push_node(n, 1, NodeEv::VipsFeed { periodic: false });
                self.push_node(n, 1, NodeEv::DrainStarted);
            }
            Action::Forward { .. } => {}
            Action::RemoveVips(v) => {
                let k = self.nodes[n].kernel & !self.vip_mask(&v);
                self.set_kernel(n, k);
                self.push_node(n, 1, NodeEv::VipsFeed { periodic: false });
            }
            Action::Announce { .. } => {
                self.tell(Observation::Announced { n });
                let others: Vec<usize> = (0..self.p.n).collect();
                self.conflicts_seen(&others, n);
            }
            Action::SendAdvert(adv) => self.broadcast(n, adv),
            Action::CasLease { new_epoch, expected_epoch, .. } => {
                self.tell(Observation::CasSent { n, expected: expected_epoch, new: new_epoch });
                let inc = self.nodes[n].inc;
                if self.nodes[n].store {
                    let d = self.store_delay();
                    self.push(self.t + d, Ev::CasAtStore { n, inc, new_epoch, expected: expected_epoch });
                } else if self.p.store_fast_fail {
                    self.push_node(n, 1, NodeEv::CasReply(CasResult::Unavailable));
                }
            }
            Action::RenewLease { epoch, .. } => {
                // The store takes the renewal if it still names n under `epoch`; the
                // members that reach it see it through their watch.
                if self.p.witness && self.nodes[n].store {
                    self.witness_heard[n] = self.t;
                }
                if self.nodes[n].store && self.store_holder == Some(n) && self.store_epoch == epoch {
                    for m in 0..self.p.n {
                        if m != n && self.nodes[m].store && self.nodes[m].machine.is_some() {
                            let d = self.store_delay() + self.store_delay();
                            self.push_node(m, d, NodeEv::LeaseRenewed { holder: n, epoch });
                        }
                    }
                }
            }
            Action::Persist(p) => {
                self.tell(Observation::Persist { n, epoch: p.epoch });
                self.nodes[n].persisted = p;
            }
            Action::Report(Event::RoleChanged { from, to, reason, epoch }) => {
                if let Some(c) = self.stats.reasons.get_mut(reason as usize) {
                    *c += 1;
                }
                self.trace_push(TraceKind::Role { n, from, to, reason, epoch });
                if to == Role::Demoting {
                    self.tell(Observation::HandoverStarted { n, reason });
                }
            }
            Action::Report(Event::OperationResult { id, ok, .. }) => {
                if ok {
                    self.stats.planned_ok += 1;
                }
                self.trace_push(TraceKind::OpResult { n, id, ok });
            }
            Action::Report(_) => {}
            Action::SelfCheck { conflict_probe } => {
                self.push_node(n, 1, NodeEv::VipsFeed { periodic: false });
                self.push_node(n, 1, NodeEv::LocalProbe);
                if conflict_probe {
                    for m in 0..self.p.n {
                        self.conflicts_seen(&[n], m);
                    }
                }
            }
        }
    }

    fn start_agent(&mut self, n: usize) {
        if !self.nodes[n].powered || self.nodes[n].machine.is_some() || self.nodes[n].state_corrupt {
            // (A corrupt state file: the agent exits with an error naming it.)
            return;
        }
        let node = &mut self.nodes[n];
        node.inc += 1;
        node.session += 1;
        node.stalled.clear();
        node.replay = [[None; MAX_NODES]; PATHS];
        #[allow(unused_mut)]
        let mut m = Machine::new(node.cfg.clone(), node.persisted.clone());
        #[cfg(test)]
        if self.break_probe {
            m.test_skip_probe = true;
        }
        node.machine = Some(m);
        node.paused = false;
        node.agent_started = self.t;
        self.tell(Observation::AgentStarted { n });
        let tick = self.p.timings.tick_ms;
        let phase = self.rng.range(2, 1 + tick);
        self.push_node(n, 1, NodeEv::InitFeed);
        self.nodes[n].tick_base = self.t;
        self.nodes[n].tick_at = self.t + phase;
        self.push_node(n, phase, NodeEv::Tick);
        let pp = self.rng.range(2, PROBE_INTERVAL);
        self.push_node(n, pp, NodeEv::ProbeStart);
        self.push_node(n, 3, NodeEv::LocalProbe);
        self.push_node(n, 3, NodeEv::GatewayFeed);
        self.push_node(n, VIPS_INTERVAL, NodeEv::VipsFeed { periodic: true });
        self.push_node(n, TRAFFIC_INTERVAL, NodeEv::TrafficFeed);
        if self.nodes[n].store {
            let d = self.store_delay();
            self.push_node(n, 1 + d, NodeEv::LeaseFeed);
        } else {
            self.witness_lost(n);
        }
    }

    fn world(&mut self, f: Fault) {
        match f {
            Fault::PowerOff(n) => {
                if !self.nodes[n].powered {
                    return;
                }
                self.tell(Observation::PowerOff { n });
                let node = &mut self.nodes[n];
                node.powered = false;
                node.machine = None;
                node.paused = false;
                node.stalled.clear();
                node.inc += 1;
                self.set_kernel(n, 0);
            }
            Fault::PowerOffHolder { after } => {
                let all = (1u8 << self.p.vips.len()) - 1;
                if let Some(h) = (0..self.p.n).find(|&i| self.nodes[i].kernel == all) {
                    self.world(Fault::PowerOff(h));
                    if self.t + after < self.p.fault_end {
                        self.at(self.t + after, Fault::PowerOn(h));
                    }
                }
            }
            Fault::PowerOn(n) => {
                if self.nodes[n].powered {
                    return;
                }
                self.nodes[n].powered = true;
                self.nodes[n].mono_base = self.rng.range(0, 1_000_000);
                let boot = self.rng.range(100, 1_500);
                self.at(self.t + boot, Fault::AgentStart(n));
            }
            Fault::AgentCrash(n) => {
                let node = &mut self.nodes[n];
                if node.machine.take().is_some() {
                    node.inc += 1;
                    node.paused = false;
                    node.stalled.clear();
                }
            }
            Fault::AgentStart(n) => self.start_agent(n),
            Fault::ClockStep(n, d) => self.nodes[n].wall_offset = self.nodes[n].wall_offset.saturating_add(d),
            Fault::StateDamage(n, damage) => {
                let node = &mut self.nodes[n];
                match damage {
                    StateDamage::Lost => node.persisted = Persisted::default(),
                    StateDamage::SaysStandby => node.persisted.last_role = Role::Standby,
                    StateDamage::Corrupt => node.state_corrupt = true,
                }
                self.tell(Observation::StateReplaced { n });
            }
            Fault::StateRepair(n) => self.repair_state(n),
            Fault::Restart { node, damage, clock_step, after } => {
                let Some(n) = node.or_else(|| self.holder()) else {
                    return;
                };
                self.world(Fault::AgentCrash(n));
                if let Some(d) = damage {
                    self.world(Fault::StateDamage(n, d));
                }
                if clock_step != 0 {
                    self.world(Fault::ClockStep(n, clock_step));
                }
                if self.t + after < self.p.fault_end {
                    self.at(self.t + after, Fault::AgentStart(n));
                    if matches!(damage, Some(StateDamage::Corrupt)) && self.t + 2 * after < self.p.fault_end {
                        self.at(self.t + 2 * after, Fault::StateRepair(n));
                    }
                }
            }
            Fault::Stall { node, len } => {
                let Some(n) = node.or_else(|| self.holder()) else {
                    return;
                };
                self.world(Fault::Pause(n));
                if self.t + len < self.p.fault_end {
                    self.at(self.t + len, Fault::Resume(n));
                }
            }
            Fault::Pause(n) => {
                if self.nodes[n].machine.is_some() {
                    self.nodes[n].paused = true;
                }
            }
            Fault::Resume(n) => self.resume(n),
            Fault::HbBlock { path, from, to, on } => self.hb_block[path][from][to] = on,
            Fault::Cut { net, from, to, on } => self.cut[net][from][to] = on,
            Fault::Carrier(n, up) => {
                if self.nodes[n].carrier != up {
                    self.nodes[n].carrier = up;
                    self.tell(Observation::Carrier { n, up });
                    self.feed(n, Input::Carrier { link: Link::Data, up });
                    self.feed(n, Input::Carrier { link: Link::Vip, up });
                }
            }
            Fault::Flap { node, follow, down, up, until } => {
                let all = (1u8 << self.p.vips.len()) - 1;
                let holder = (0..self.p.n).find(|&i| self.nodes[i].powered && self.nodes[i].kernel == all);
                let victim = if follow { holder.unwrap_or(node) } else { node };
                self.world(Fault::Carrier(victim, false));
                if self.t + down < self.p.fault_end {
                    self.at(self.t + down, Fault::Carrier(victim, true));
                }
                let next = self.t + down + up;
                if next < until.min(self.p.fault_end) {
                    // The next cycle follows the VIP from where it is then.
                    self.at(next, Fault::Flap { node: victim, follow, down, up, until });
                }
            }
            Fault::Mgmt(n, up) => self.nodes[n].mgmt = up,
            Fault::Gateway(n, up) => self.nodes[n].gw = up,
            Fault::Client(n, up) => self.nodes[n].client = up,
            Fault::Store(n, up) => {
                let was = self.nodes[n].store;
                self.nodes[n].store = up;
                if up && !was && self.nodes[n].machine.is_some() {
                    let d = self.store_delay();
                    self.push_node(n, d, NodeEv::LeaseFeed);
                }
                if !up && was {
                    self.witness_lost(n);
                }
            }
            Fault::Listener(n, up) => {
                if self.nodes[n].listener != up {
                    self.nodes[n].listener = up;
                    self.push_node(n, 5, NodeEv::LocalProbe);
                }
            }
            Fault::Skew(n, on) => self.nodes[n].wall_offset = if on { 120_000 } else { 0 },
            Fault::Key(n, k) => self.nodes[n].key = k,
            Fault::Loss(p, l) => self.loss[p] = l.min(300),
            Fault::Traffic(n, t) => self.nodes[n].traffic = t,
            Fault::VipFlush(n) => {
                if self.nodes[n].kernel != 0 {
                    self.set_kernel(n, 0);
                    self.push_node(n, 1, NodeEv::VipsFeed { periodic: false });
                }
            }
            Fault::AddFails(n, on) => self.nodes[n].add_fails = on,
            Fault::Cmd(target, cmd) => self.command(target, cmd),
            Fault::Many(_, fs) => {
                for f in fs {
                    self.world(f);
                }
            }
            Fault::HealAll => self.heal_all(),
        }
    }

    /// SIGCONT: the inputs queued during the stop are processed first, in order, at the
    /// resume time (the I/O layer's contract: nothing the agent decides on its own timers
    /// runs before them); then the I/O layer re-reads links, VIPs and the Lease.
    fn resume(&mut self, n: usize) {
        if !self.nodes[n].paused {
            return;
        }
        self.nodes[n].paused = false;
        self.tell(Observation::Resumed { n });
        let queued = std::mem::take(&mut self.nodes[n].stalled);
        if !queued.is_empty() {
            self.tell(Observation::BurstBegins { n });
            for input in queued {
                self.feed(n, input);
            }
            self.tell(Observation::BurstEnds { n });
        }
        self.push_node(n, 1, NodeEv::InitFeed);
        self.push_node(n, 1, NodeEv::LeaseFeed);
    }

    /// An operator removes a corrupt state file: the agent starts from the defaults.
    fn repair_state(&mut self, n: usize) {
        if !self.nodes[n].state_corrupt {
            return;
        }
        self.nodes[n].state_corrupt = false;
        self.nodes[n].persisted = Persisted::default();
        self.tell(Observation::StateReplaced { n });
        self.start_agent(n);
    }

    fn command(&mut self, target: CmdTarget, cmd: Command) {
        let cmd = match cmd {
            Command::PlannedFailover { target, .. } => {
                self.next_op_id += 1;
                Command::PlannedFailover { id: self.next_op_id, target }
            }
            Command::ForcedFailover { target, .. } => {
                self.next_op_id += 1;
                Command::ForcedFailover { id: self.next_op_id, target }
            }
            c => c,
        };
        let targets: Vec<usize> = match target {
            CmdTarget::All => (0..self.p.n).collect(),
            CmdTarget::Node(i) => vec![i],
            CmdTarget::Holder => {
                let h = (0..self.p.n).find(|&i| self.nodes[i].machine.as_ref().is_some_and(|m| m.holds_vips()));
                vec![h.unwrap_or(0)]
            }
        };
        for n in targets {
            if !self.nodes[n].live() {
                continue;
            }
            self.tell(Observation::Command { n, cmd: &cmd });
            self.feed(n, Input::Command(cmd.clone()));
        }
    }

    fn heal_all(&mut self) {
        self.hb_block = [[[false; MAX_NODES]; MAX_NODES]; PATHS];
        self.cut = [[[false; MAX_NODES]; MAX_NODES]; PATHS];
        self.loss = [0; PATHS];
        for n in 0..self.p.n {
            if !self.nodes[n].carrier {
                self.nodes[n].carrier = true;
                self.tell(Observation::Carrier { n, up: true });
                self.feed(n, Input::Carrier { link: Link::Data, up: true });
                self.feed(n, Input::Carrier { link: Link::Vip, up: true });
            }
            let node = &mut self.nodes[n];
            node.mgmt = true;
            node.gw = true;
            node.client = true;
            node.wall_offset = 0;
            node.key = 0;
            node.add_fails = false;
            if !node.listener {
                node.listener = true;
                self.push_node(n, 5, NodeEv::LocalProbe);
            }
            if !self.nodes[n].store {
                self.nodes[n].store = true;
                if self.nodes[n].machine.is_some() {
                    let d = self.store_delay();
                    self.push_node(n, d, NodeEv::LeaseFeed);
                }
            }
            if !self.nodes[n].powered {
                self.nodes[n].powered = true;
                self.nodes[n].mono_base = self.rng.range(0, 1_000_000);
            }
            self.resume(n);
            if self.nodes[n].state_corrupt {
                self.repair_state(n);
            }
            if self.nodes[n].machine.is_none() {
                self.start_agent(n);
            }
        }
        let t = self.t + 20;
        self.at(
            t,
            Fault::Many(
                "operator clears maintenance, suspension, pause",
                vec![
                    Fault::Cmd(CmdTarget::All, Command::Maintenance { on: false, force: false }),
                    Fault::Cmd(CmdTarget::All, Command::ClearSuspension),
                    Fault::Cmd(CmdTarget::All, Command::SetPaused(false)),
                ],
            ),
        );
    }

    /// The node whose kernel holds every VIP now (the first one, if several do).
    pub(super) fn holder(&self) -> Option<usize> {
        let all = (1u8 << self.p.vips.len()) - 1;
        (0..self.p.n).find(|&i| self.nodes[i].powered && self.nodes[i].kernel == all)
    }

    /// Number of nodes holding every VIP and number holding any.
    pub(super) fn holders(&self) -> (Vec<usize>, usize) {
        let all = (1u8 << self.p.vips.len()) - 1;
        let full: Vec<usize> =
            (0..self.p.n).filter(|&i| self.nodes[i].powered && self.nodes[i].kernel == all).collect();
        let any = (0..self.p.n).filter(|&i| self.nodes[i].powered && self.nodes[i].kernel != 0).count();
        (full, any)
    }

    pub(super) fn trace_push(&mut self, kind: TraceKind) {
        let e = TraceEntry { t: self.t, kind };
        self.digest = fnv(self.digest, e.hash_key());
        if let Some(ft) = self.full_trace.as_mut() {
            ft.push(e.clone());
        }
        if self.trace.len() >= TRACE_KEEP {
            self.trace.pop_front();
        }
        self.trace.push_back(e);
    }

    /// A one-line description of the schedule's parameters.
    pub(super) fn describe(&self) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "members={} prios={:?} vips={} target={} gateway={} store_fast_fail={} warm={:?} \
             base_epoch={} start_alone={} failback={} delay={:?} store_lat={:?} witness={}",
            self.p.n,
            self.nodes.iter().map(|n| n.priority).collect::<Vec<_>>(),
            self.p.vips.len(),
            self.p.has_target,
            self.p.gateway_configured,
            self.p.store_fast_fail,
            self.p.warm,
            self.p.base_epoch,
            self.p.start_alone,
            matches!(self.p.failback, FailbackPolicy::Automatic(_)),
            self.p.delay,
            self.p.store_lat,
            self.p.witness,
        );
        s
    }
}

/// Name of simulated node `i` ("n0", "n1", ...).
/// The MAC of node `i`'s data interface.
pub(super) fn mac_of(i: usize) -> [u8; 6] {
    [2, 0, 0, 0, 0, u8::try_from(i).unwrap_or(0xff)]
}

pub(super) fn node_name(i: usize) -> NodeId {
    const NAMES: [&str; MAX_NODES] = ["n0", "n1", "n2", "n3", "n4"];
    NodeId::new(NAMES.get(i).copied().unwrap_or("nx")).expect("constant node names are valid")
}

fn fault_label(f: &Fault) -> String {
    match f {
        Fault::Many(label, fs) => format!("{label} ({} changes)", fs.len()),
        Fault::Cmd(t, c) => format!("command {c:?} to {t:?}"),
        other => format!("{other:?}"),
    }
}

pub(super) fn fnv(h: u64, x: u64) -> u64 {
    let mut h = h;
    for b in x.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}
