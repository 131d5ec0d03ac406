//! The nemesis's schedule: faults drawn at random from the whole catalogue, with overlaps,
//! each healing on its own after a random time. Pure: the same seed and shape give the
//! same schedule, so a run is reproduced from its seed (and cut to a prefix of it).

use serde::Serialize;
use std::collections::BTreeSet;
use std::time::Duration;

/// SplitMix64: small, fast, and the same everywhere (the schedule must not depend on a
/// crate's version).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (`lo` when `hi < lo`).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo { lo } else { lo + self.next_u64() % (hi - lo + 1) }
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn index(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { usize::try_from(self.next_u64() % n as u64).unwrap_or(0) }
    }

    /// True with probability `percent` %.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

/// One of a node's two cables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cable {
    /// `eth0`: the VIPs, the client, heartbeats' data path.
    Data,
    /// `eth1`: the API server, heartbeats' management path.
    Mgmt,
}

/// An edit of an HAPair that the heal reverts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "edit")]
pub enum Edit {
    /// Heartbeat interval and timeout 1.5× slower.
    Timings,
    /// A member leaves the pair (and comes back at the heal).
    RemoveMember {
        /// The node that leaves.
        node: usize,
    },
}

/// A fault, with its targets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Action {
    /// Both cables of a node pulled (management first, as a dead node goes).
    NodeCut {
        /// The node.
        node: usize,
    },
    /// One cable pulled.
    CableCut {
        /// The node.
        node: usize,
        /// Which cable.
        cable: Cable,
    },
    /// Every frame between two nodes dropped; both still reach the client, the gateway
    /// and the API server.
    PeerPartition {
        /// One node.
        a: usize,
        /// The other.
        b: usize,
    },
    /// Loss in one direction only on one cable.
    OneWayLoss {
        /// The node.
        node: usize,
        /// Which cable.
        cable: Cable,
        /// Frames towards the node (else from it).
        towards_node: bool,
        /// Percentage lost (100: all of them).
        percent: u8,
    },
    /// Random loss both ways on one cable.
    Loss {
        /// The node.
        node: usize,
        /// Which cable.
        cable: Cable,
        /// Percentage lost.
        percent: u8,
    },
    /// kube-apiserver stopped, started again at the heal.
    ApiServerDown,
    /// etcd stopped, started again at the heal.
    EtcdDown,
    /// The operator replica holding the leader Lease SIGKILLed; a new replica starts at
    /// the heal.
    OperatorLeaderKilled,
    /// An agent SIGKILLed; started again at the heal.
    AgentKill {
        /// The node.
        node: usize,
    },
    /// An agent SIGSTOPped; SIGCONT at the heal.
    AgentStop {
        /// The node.
        node: usize,
    },
    /// An agent stopped with SIGTERM (a rolling update) and started again at once.
    AgentRestart {
        /// The node.
        node: usize,
    },
    /// An agent's wall clock stepped (libfaketime); stepped back at the heal.
    ClockStep {
        /// The node.
        node: usize,
        /// The step.
        seconds: i64,
    },
    /// An agent's state files deleted or overwritten with garbage, then the agent
    /// SIGKILLed and started again so that it reads them.
    StateFile {
        /// The node.
        node: usize,
        /// Overwritten (else deleted).
        corrupt: bool,
    },
    /// `kubectl havip rotate-key`.
    KeyRotation {
        /// The pair.
        pair: usize,
    },
    /// The HAPair edited; reverted at the heal.
    PairEdit {
        /// The pair.
        pair: usize,
        /// What changes.
        #[serde(flatten)]
        edit: Edit,
    },
    /// `kubectl havip failover` (to a chosen member or the best one).
    PlannedFailover {
        /// The pair.
        pair: usize,
        /// The target, if one is named.
        to: Option<usize>,
    },
    /// `kubectl havip maintenance PAIR NODE on`; off at the heal.
    Maintenance {
        /// The pair.
        pair: usize,
        /// The member.
        node: usize,
    },
    /// `kubectl havip resume-failback`.
    FailbackResume {
        /// The pair.
        pair: usize,
    },
    /// A FloatingIP added to a pair; deleted at the heal.
    FloatingIpChurn {
        /// The pair.
        pair: usize,
    },
    /// A LoadBalancer Service added (its address from the pool); deleted at the heal.
    ServiceChurn,
    /// A planned failover, then the old holder's agent SIGKILLed in the drain; started
    /// again at the heal.
    DrainInterrupted {
        /// The pair.
        pair: usize,
    },
}

/// The fault kinds, for the report's per-kind table.
pub const KINDS: [&str; 21] = [
    "node_cut",
    "cable_cut",
    "peer_partition",
    "one_way_loss",
    "loss",
    "api_server_down",
    "etcd_down",
    "operator_leader_killed",
    "agent_kill",
    "agent_stop",
    "agent_restart",
    "clock_step",
    "state_file",
    "key_rotation",
    "pair_edit",
    "planned_failover",
    "maintenance",
    "failback_resume",
    "floating_ip_churn",
    "service_churn",
    "drain_interrupted",
];

/// What a fault holds while it lasts: two faults that hold the same thing never overlap
/// (their heals would undo each other).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    /// A node's agent process (and its clock and state).
    Agent(usize),
    /// A node's cable.
    Cable(usize, Cable),
    /// The partition between two nodes (lower index first).
    Partition(usize, usize),
    /// etcd and the API server.
    ControlPlane,
    /// The operator replicas.
    Operator,
    /// A pair's spec and commands.
    Pair(usize),
    /// The extra FloatingIP.
    ExtraFloatingIp,
    /// The extra Service.
    ExtraService,
}

impl Action {
    /// The kind's name (as in [`KINDS`] and the JSON lines).
    pub fn kind(&self) -> &'static str {
        match self {
            Action::NodeCut { .. } => "node_cut",
            Action::CableCut { .. } => "cable_cut",
            Action::PeerPartition { .. } => "peer_partition",
            Action::OneWayLoss { .. } => "one_way_loss",
            Action::Loss { .. } => "loss",
            Action::ApiServerDown => "api_server_down",
            Action::EtcdDown => "etcd_down",
            Action::OperatorLeaderKilled => "operator_leader_killed",
            Action::AgentKill { .. } => "agent_kill",
            Action::AgentStop { .. } => "agent_stop",
            Action::AgentRestart { .. } => "agent_restart",
            Action::ClockStep { .. } => "clock_step",
            Action::StateFile { .. } => "state_file",
            Action::KeyRotation { .. } => "key_rotation",
            Action::PairEdit { .. } => "pair_edit",
            Action::PlannedFailover { .. } => "planned_failover",
            Action::Maintenance { .. } => "maintenance",
            Action::FailbackResume { .. } => "failback_resume",
            Action::FloatingIpChurn { .. } => "floating_ip_churn",
            Action::ServiceChurn => "service_churn",
            Action::DrainInterrupted { .. } => "drain_interrupted",
        }
    }

    /// What it holds while it lasts.
    pub fn resources(&self, shape: &Shape) -> Vec<Resource> {
        match *self {
            Action::NodeCut { node } => vec![Resource::Cable(node, Cable::Data), Resource::Cable(node, Cable::Mgmt)],
            Action::CableCut { node, cable }
            | Action::OneWayLoss { node, cable, .. }
            | Action::Loss { node, cable, .. } => vec![Resource::Cable(node, cable)],
            Action::PeerPartition { a, b } => vec![Resource::Partition(a.min(b), a.max(b))],
            Action::ApiServerDown | Action::EtcdDown => vec![Resource::ControlPlane],
            Action::OperatorLeaderKilled => vec![Resource::Operator],
            Action::AgentKill { node }
            | Action::AgentStop { node }
            | Action::AgentRestart { node }
            | Action::ClockStep { node, .. }
            | Action::StateFile { node, .. } => vec![Resource::Agent(node)],
            Action::KeyRotation { pair }
            | Action::PairEdit { pair, .. }
            | Action::PlannedFailover { pair, .. }
            | Action::Maintenance { pair, .. }
            | Action::FailbackResume { pair } => vec![Resource::Pair(pair)],
            Action::FloatingIpChurn { .. } => vec![Resource::ExtraFloatingIp],
            Action::ServiceChurn => vec![Resource::ExtraService],
            Action::DrainInterrupted { pair } => {
                let mut r: Vec<Resource> = shape.members(pair).iter().map(|n| Resource::Agent(*n)).collect();
                r.push(Resource::Pair(pair));
                r
            }
        }
    }

    /// The nodes it acts on directly (for the checker: a fault on a pair's member may
    /// explain that pair's outages).
    pub fn nodes(&self, shape: &Shape) -> Vec<usize> {
        match *self {
            Action::NodeCut { node }
            | Action::CableCut { node, .. }
            | Action::OneWayLoss { node, .. }
            | Action::Loss { node, .. }
            | Action::AgentKill { node }
            | Action::AgentStop { node }
            | Action::AgentRestart { node }
            | Action::ClockStep { node, .. }
            | Action::StateFile { node, .. }
            | Action::Maintenance { node, .. } => vec![node],
            Action::PairEdit { edit: Edit::RemoveMember { node }, .. } => vec![node],
            Action::PeerPartition { a, b } => vec![a, b],
            Action::DrainInterrupted { pair } => shape.members(pair).to_vec(),
            _ => Vec::new(),
        }
    }

    /// The pair it acts on directly, if any.
    pub fn pair(&self) -> Option<usize> {
        match *self {
            Action::KeyRotation { pair }
            | Action::PairEdit { pair, .. }
            | Action::PlannedFailover { pair, .. }
            | Action::Maintenance { pair, .. }
            | Action::FailbackResume { pair }
            | Action::FloatingIpChurn { pair }
            | Action::DrainInterrupted { pair } => Some(pair),
            _ => None,
        }
    }

    /// Whether clients of a VIP of a pair whose member it hits may lose answers while it
    /// lasts (and shortly after). Everything havip claims to ride out without a failed
    /// connection — the API server, etcd or the operator down, a rolling restart of an
    /// agent, an agent frozen while its node's kernel serves, a clock step, a key
    /// rotation, a planned move, maintenance, a timing edit — explains nothing: an outage
    /// during only those is a defect. (A peer partition explains the outages of a pair
    /// whose two members it separates: the checker decides that.)
    pub fn may_interrupt(&self) -> bool {
        match self {
            Action::NodeCut { .. }
            | Action::CableCut { .. }
            | Action::OneWayLoss { .. }
            | Action::Loss { .. }
            | Action::AgentKill { .. }
            | Action::StateFile { .. }
            | Action::DrainInterrupted { .. } => true,
            Action::PairEdit { edit, .. } => matches!(edit, Edit::RemoveMember { .. }),
            _ => false,
        }
    }
}

/// The lab's pairs as the schedule sees them: each pair's members, in priority order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Nodes.
    pub nodes: usize,
    /// Members of each pair.
    pub pairs: Vec<Vec<usize>>,
}

impl Shape {
    /// Members of pair `p` (empty for an unknown pair).
    pub fn members(&self, p: usize) -> &[usize] {
        self.pairs.get(p).map(Vec::as_slice).unwrap_or_default()
    }
}

/// A fault in the schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fault {
    /// Its place in the schedule (0, 1, …): `--faults n` runs the first n.
    pub id: usize,
    /// When it is injected, from the run's start.
    pub at_ms: u64,
    /// How long until it heals.
    pub hold_ms: u64,
    /// What.
    #[serde(flatten)]
    pub action: Action,
}

impl Fault {
    /// When it heals.
    pub fn heal_ms(&self) -> u64 {
        self.at_ms + self.hold_ms
    }
}

/// At most this many faults at once.
pub const MAX_CONCURRENT: usize = 3;

/// The clock steps drawn (seconds): beyond the 60 s skew alarm and within it, both ways.
const CLOCK_STEPS: [i64; 5] = [-90, -30, 30, 90, 600];

/// Draws one action and how long it holds (ms).
fn draw(rng: &mut Rng, shape: &Shape, clock: bool) -> (Action, u64) {
    let n = shape.nodes.max(1);
    let node = rng.index(n);
    let cable = if rng.chance(50) { Cable::Data } else { Cable::Mgmt };
    let pair = rng.index(shape.pairs.len());
    let members = shape.members(pair);
    let member = members.get(rng.index(members.len())).copied().unwrap_or(0);
    // Weighted: the network and the agents most often, the control plane and the
    // administrators' actions less.
    let weights: [(u64, u8); 21] = [
        (8, 0),
        (8, 1),
        (6, 2),
        (5, 3),
        (5, 4),
        (3, 5),
        (2, 6),
        (3, 7),
        (5, 8),
        (5, 9),
        (5, 10),
        (if clock { 4 } else { 0 }, 11),
        (3, 12),
        (3, 13),
        (3, 14),
        (6, 15),
        (3, 16),
        (2, 17),
        (3, 18),
        (3, 19),
        (4, 20),
    ];
    let total: u64 = weights.iter().map(|w| w.0).sum();
    let mut pick = rng.between(0, total.saturating_sub(1));
    let mut which = 0u8;
    for (w, k) in weights {
        if pick < w {
            which = k;
            break;
        }
        pick -= w;
    }
    match which {
        0 => (Action::NodeCut { node }, rng.between(2_000, 15_000)),
        1 => (Action::CableCut { node, cable }, rng.between(1_000, 10_000)),
        2 => {
            let other = (node + 1 + rng.index(n.saturating_sub(1).max(1))) % n;
            (Action::PeerPartition { a: node, b: other }, rng.between(2_000, 15_000))
        }
        3 => {
            let percent = if rng.chance(50) { 100 } else { 30 };
            (Action::OneWayLoss { node, cable, towards_node: rng.chance(50), percent }, rng.between(2_000, 10_000))
        }
        4 => (Action::Loss { node, cable, percent: 30 }, rng.between(2_000, 10_000)),
        5 => (Action::ApiServerDown, rng.between(3_000, 20_000)),
        6 => (Action::EtcdDown, rng.between(1_000, 8_000)),
        7 => (Action::OperatorLeaderKilled, rng.between(1_000, 10_000)),
        8 => (Action::AgentKill { node }, rng.between(500, 5_000)),
        9 => (Action::AgentStop { node }, rng.between(200, 3_000)),
        10 => (Action::AgentRestart { node }, 2_000),
        11 => {
            let seconds = CLOCK_STEPS[rng.index(CLOCK_STEPS.len())];
            (Action::ClockStep { node, seconds }, rng.between(5_000, 20_000))
        }
        12 => (Action::StateFile { node, corrupt: rng.chance(50) }, 3_000),
        13 => (Action::KeyRotation { pair }, 3_000),
        14 => {
            let edit =
                if members.len() > 2 && rng.chance(50) { Edit::RemoveMember { node: member } } else { Edit::Timings };
            (Action::PairEdit { pair, edit }, rng.between(5_000, 20_000))
        }
        15 => {
            let to = if rng.chance(50) { Some(member) } else { None };
            (Action::PlannedFailover { pair, to }, 3_000)
        }
        16 => (Action::Maintenance { pair, node: member }, rng.between(3_000, 15_000)),
        17 => (Action::FailbackResume { pair }, 2_000),
        18 => (Action::FloatingIpChurn { pair }, rng.between(5_000, 20_000)),
        19 => (Action::ServiceChurn, rng.between(5_000, 20_000)),
        _ => (Action::DrainInterrupted { pair }, 3_000),
    }
}

/// The schedule of a run of `duration` on a lab of `shape`: arrivals 0.5–6 s apart
/// (so faults overlap), at most [`MAX_CONCURRENT`] at once, no two holding the same
/// [`Resource`], every fault healed `settle` before the end. Clock steps only with
/// `clock` (libfaketime present).
pub fn schedule(seed: u64, duration: Duration, settle: Duration, shape: &Shape, clock: bool) -> Vec<Fault> {
    let mut rng = Rng::new(seed);
    let end = u64::try_from(duration.saturating_sub(settle).as_millis()).unwrap_or(u64::MAX);
    let mut out: Vec<Fault> = Vec::new();
    // Give the lab a few seconds of calm first: the first outage then has a baseline.
    let mut t = 5_000u64;
    loop {
        t += rng.between(500, 6_000);
        if t >= end {
            break;
        }
        for _ in 0..10 {
            let (action, hold) = draw(&mut rng, shape, clock);
            let hold = hold.min(end - t);
            let active: Vec<&Fault> = out.iter().filter(|f| f.heal_ms() > t).collect();
            if active.len() >= MAX_CONCURRENT {
                break;
            }
            let held: BTreeSet<Resource> = active.iter().flat_map(|f| f.action.resources(shape)).collect();
            if action.resources(shape).iter().any(|r| held.contains(r)) {
                continue;
            }
            out.push(Fault { id: out.len(), at_ms: t, hold_ms: hold, action });
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape { nodes: 3, pairs: vec![vec![0, 1], vec![1, 2], vec![2, 0, 1]] }
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let s = shape();
        let a = schedule(7, Duration::from_secs(600), Duration::from_secs(20), &s, true);
        let b = schedule(7, Duration::from_secs(600), Duration::from_secs(20), &s, true);
        let c = schedule(8, Duration::from_secs(600), Duration::from_secs(20), &s, true);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.len() > 60, "about one fault every 3 s: {}", a.len());
    }

    #[test]
    fn faults_overlap_but_never_on_the_same_resource_nor_more_than_the_cap() {
        let s = shape();
        let mut overlaps = 0;
        for seed in 0..20 {
            let f = schedule(seed, Duration::from_secs(600), Duration::from_secs(20), &s, true);
            for (i, x) in f.iter().enumerate() {
                assert!(x.heal_ms() <= 580_000, "healed before the settle: {x:?}");
                let active: Vec<&Fault> =
                    f[..i].iter().filter(|y| y.heal_ms() > x.at_ms).chain(std::iter::once(x)).collect();
                assert!(active.len() <= MAX_CONCURRENT, "{active:?}");
                overlaps += usize::from(active.len() > 1);
                let mut held = BTreeSet::new();
                for y in active {
                    for r in y.action.resources(&s) {
                        assert!(held.insert(r.clone()), "{r:?} held twice at {} ms (seed {seed})", x.at_ms);
                    }
                }
            }
        }
        assert!(overlaps > 100, "faults overlap often: {overlaps}");
    }

    #[test]
    fn every_kind_is_drawn_and_named_in_the_catalogue() {
        let s = shape();
        let mut seen = BTreeSet::new();
        for seed in 0..10 {
            for f in schedule(seed, Duration::from_secs(600), Duration::from_secs(20), &s, true) {
                assert!(KINDS.contains(&f.action.kind()), "{:?}", f.action);
                seen.insert(f.action.kind());
            }
        }
        assert_eq!(seen.len(), KINDS.len(), "drawn: {seen:?}");
        let without_clock: BTreeSet<&str> = (0..10)
            .flat_map(|seed| schedule(seed, Duration::from_secs(600), Duration::from_secs(20), &s, false))
            .map(|f| f.action.kind())
            .collect();
        assert!(!without_clock.contains("clock_step"));
    }

    #[test]
    fn a_peer_partition_is_between_two_different_nodes() {
        let s = shape();
        for seed in 0..20 {
            for f in schedule(seed, Duration::from_secs(600), Duration::from_secs(20), &s, true) {
                if let Action::PeerPartition { a, b } = f.action {
                    assert_ne!(a, b);
                    assert!(a < 3 && b < 3);
                }
            }
        }
    }
}
