//! The simulator's vocabulary, shared by the world, the checker and the runner: the
//! invariants, the violations, the trace, and what the checker found. A leaf: it uses
//! neither the world nor the checker.

use std::fmt;

use crate::io::Reason;
use crate::types::Role;

/// Most members simulated.
pub const MAX_NODES: usize = 5;
/// Most VIPs simulated.
pub const MAX_VIPS: usize = 2;

/// An invariant of the simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Invariant {
    /// (a) two client-reachable holders beyond the bound.
    DualHolders,
    /// (b) a heartbeat-only problem moved the VIPs although the data plane worked.
    HeartbeatOnlyMove,
    /// (c) an isolated member took the VIPs.
    IsolatedTakeover,
    /// (d) a dead active was not replaced in time.
    SlowReplacement,
    /// (e) maintenance, quarantine or suspension violated.
    PolicyViolated,
    /// (f) an epoch went backwards, or a Lease compare-and-swap did not raise it, or raised
    /// it by a step the store refuses ([`crate::Config::lease_max_step`]).
    EpochBackwards,
    /// (g) a claim under an epoch that is not newer than every epoch the member knew
    /// (it would tie with its predecessor), or an epoch beyond the domain.
    StaleEpoch,
    /// (h) a member took the VIPs less than the link-dampening time after its carrier
    /// returned.
    FlappingLinkAttracts,
    /// (i) an agent restart (also without its state file, or with one that says Standby)
    /// moved the VIPs away from the member that held them alone.
    RestartMovedVips,
    /// (j) a member resumed after a stall announced the VIPs while processing the inputs
    /// queued during the stall, and no longer held them once it had processed them.
    AnnouncedStale,
    /// (k) two members held a VIP the client reaches, not hearing each other, and one of
    /// them (links and gateway fine) did not raise `PeerSilent`.
    SilentDualHolder,
    /// (l) with a witness, a member took the VIPs over from one that ran, reached the
    /// witness and held them throughout the claim; or two members held a VIP the client
    /// reaches while both were running and reached the witness, for longer than one witness
    /// read, a heartbeat timeout and the store's latency.
    WitnessDual,
    /// (m) two members held a VIP while their heartbeats reached each other but failed
    /// verification (different keys) and each saw the other answer for the VIP, for longer
    /// than a conflict probe, the settling time and a few ticks: the one of lower priority
    /// did not give it up.
    UnverifiedDual,
    /// (o) quorum fencing: a member that runs and cannot reach the store (the minority
    /// side of a partition) held a VIP for longer than the quorum lease and a heartbeat
    /// interval after it lost the store.
    QuorumMinority,
    /// After the final heal, not exactly one holder.
    NoHolderAfterHeal,
    /// (n) a member advertised a backup path of the VIPs (routed mode) while its kernel
    /// held one of them; or, after the final heal, a running member that holds nothing
    /// and is not in maintenance did not advertise one.
    BackupPath,
}

impl Invariant {
    /// Short code: "a".."n", or "heal".
    pub fn code(self) -> &'static str {
        match self {
            Invariant::DualHolders => "a",
            Invariant::HeartbeatOnlyMove => "b",
            Invariant::IsolatedTakeover => "c",
            Invariant::SlowReplacement => "d",
            Invariant::PolicyViolated => "e",
            Invariant::EpochBackwards => "f",
            Invariant::StaleEpoch => "g",
            Invariant::FlappingLinkAttracts => "h",
            Invariant::RestartMovedVips => "i",
            Invariant::AnnouncedStale => "j",
            Invariant::SilentDualHolder => "k",
            Invariant::WitnessDual => "l",
            Invariant::UnverifiedDual => "m",
            Invariant::NoHolderAfterHeal => "heal",
            Invariant::BackupPath => "n",
            Invariant::QuorumMinority => "o",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}) {:?}", self.code(), self)
    }
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which.
    pub invariant: Invariant,
    /// Virtual time.
    pub at_ms: u64,
    /// What happened.
    pub detail: String,
}

/// One trace entry (role changes, kernel VIP changes, Lease writes, faults, results).
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEntry {
    /// Virtual time.
    pub t: u64,
    /// What.
    pub kind: TraceKind,
}

/// Kinds of trace entries.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceKind {
    /// A world change.
    Fault(String),
    /// A member's role changed.
    Role {
        /// Member index.
        n: usize,
        /// From.
        from: Role,
        /// To.
        to: Role,
        /// Why.
        reason: Reason,
        /// Epoch.
        epoch: u64,
    },
    /// A member's kernel VIPs changed (bit mask).
    Kernel {
        /// Member index.
        n: usize,
        /// VIP bits.
        vips: u8,
    },
    /// The Lease was written.
    Lease {
        /// Holder index.
        holder: usize,
        /// Epoch.
        epoch: u64,
    },
    /// An operator operation ended.
    OpResult {
        /// Member index.
        n: usize,
        /// Operation id.
        id: u64,
        /// Success.
        ok: bool,
    },
    /// A violation was detected.
    Violation(Invariant, String),
}

impl TraceEntry {
    /// What the run's digest folds in for this entry.
    pub(super) fn hash_key(&self) -> u64 {
        let k = match &self.kind {
            TraceKind::Fault(s) => s.len() as u64,
            TraceKind::Role { n, from, to, reason, epoch } => {
                (*n as u64)
                    ^ (u64::from(from.code()) << 8)
                    ^ (u64::from(to.code()) << 16)
                    ^ ((*reason as u64) << 24)
                    ^ (epoch << 32)
            }
            TraceKind::Kernel { n, vips } => 0x100 ^ (*n as u64) ^ (u64::from(*vips) << 8),
            TraceKind::Lease { holder, epoch } => 0x200 ^ (*holder as u64) ^ (epoch << 8),
            TraceKind::OpResult { n, id, ok } => 0x300 ^ (*n as u64) ^ (id << 8) ^ u64::from(*ok),
            TraceKind::Violation(i, _) => 0x400 ^ (*i as u64),
        };
        self.t.wrapping_mul(0x9E37_79B9) ^ k
    }

    /// Human-readable line.
    pub fn render(&self) -> String {
        let body = match &self.kind {
            TraceKind::Fault(s) => format!("world: {s}"),
            TraceKind::Role { n, from, to, reason, epoch } => {
                format!("n{n}: {from} -> {to} ({reason:?}, epoch {epoch})")
            }
            TraceKind::Kernel { n, vips } => format!("n{n}: kernel VIPs = {vips:#04b}"),
            TraceKind::Lease { holder, epoch } => format!("lease: holder n{holder}, epoch {epoch}"),
            TraceKind::OpResult { n, id, ok } => format!("n{n}: operation {id} ok={ok}"),
            TraceKind::Violation(i, d) => format!("VIOLATION {i}: {d}"),
        };
        format!("{:>7} ms  {body}", self.t)
    }
}

/// What the checker found in one schedule: the broken invariants (the first of each kind)
/// and how much it checked.
#[derive(Clone, Debug, Default)]
pub(super) struct Findings {
    /// Broken invariants, the first of each kind.
    pub violations: Vec<Violation>,
    /// Unplanned acquisitions (takeovers and elections).
    pub takeovers: u64,
    /// (d) checks that ran to their deadline.
    pub d_checked: u64,
    /// Longest time two client-reachable, connected members both held a VIP.
    pub dual_max_ms: u64,
    /// Unplanned acquisitions checked against (b) with a data-plane target.
    pub b_checked: u64,
    /// Crash-to-replacement times of the (d) checks (to the check granularity).
    pub replacement_ms: Vec<u64>,
    /// (i) restart checks that ran to their deadline.
    pub restarts_checked: u64,
    /// (j) post-stall bursts checked.
    pub bursts_checked: u64,
    /// (k) split episodes checked (counted once per check that found the alarm raised).
    pub splits_checked: u64,
    /// (m) longest episode of two holders that cannot verify each other (ms).
    pub unverified_dual_max_ms: u64,
}
