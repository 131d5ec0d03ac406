//! The pure HA state machine of a pair member: elections, takeovers, planned handovers,
//! fencing, failback policy and alarms (docs/state-machine.md lists every rule).
//!
//! No I/O, no clock reads, no randomness, no threads: time comes in as [`Millis`] with
//! every [`Input`], and the machine answers with [`Action`]s for the I/O layer to execute
//! in order. The same code runs in the node agent and in the deterministic simulator
//! ([`crate::sim`]).
//!
//! # Contract for the I/O layer
//!
//! * Call [`Machine::step`] for every observation with the current **monotonic** time;
//!   feed [`Input::Tick`] when [`Machine::next_tick`] says (every [`Timings::tick_ms`]
//!   while anything is pending, about once per heartbeat interval when steady); re-ask it
//!   after every step, since any input may bring the next tick forward. Execute the returned actions **in
//!   order**: a [`Action::Persist`] always precedes the actions it protects (a new epoch is
//!   on disk before the VIPs are added under it).
//! * After a stall (the process was stopped or starved for longer than the heartbeat
//!   timeout), feed the inputs that queued up meanwhile (heartbeats, Lease events, CAS
//!   answers) **before the next `Tick`**: until that Tick the machine only gives up what a
//!   newer holder or Lease claims; it takes, announces and times out nothing (a claim the
//!   Lease granted meanwhile is settled at the Tick), so a resumed member never announces
//!   VIPs that a queued heartbeat is about to take away. (The agent's runtime feeds no
//!   Tick for two heartbeat intervals after a stall, the time it gives the queued
//!   datagrams and watch events to be read.)
//! * At start (and after any gap in observation) feed `Carrier` for both links, `Gateway`,
//!   `LocalVips` and, if the API is reachable, `LeaseObserved`. The machine stays in
//!   [`Role::Init`] until the first `LocalVips` arrives: that observation decides whether
//!   a restarted agent adopts the VIPs (the VIPs still on the interface, whatever the
//!   persisted last role; tentatively until the init listen ruled out a holder with a
//!   newer or equal epoch).
//! * Unknown carrier counts as "no carrier" for taking the VIPs (but never fences);
//!   `Gateway { reachable: None }` (also before the first observation) turns the gateway
//!   check off.
//! * While not holding the VIPs, probe them through the network every ≤ 100 ms with a
//!   connect timeout ≤ 100 ms and feed [`Input::PeerProbe`]; on every member, probe the
//!   local listeners of every (VIP, port) and feed [`Input::LocalProbe`] (a standby's
//!   readiness for a planned handover is built from these).
//! * [`Action::SendAdvert`]: send on every path; it is emitted every heartbeat interval and
//!   at once on every role or operation change. [`Action::CasLease`]: answer with
//!   [`Input::CasResult`] (standalone mode: `Unavailable` at once); there is at most one
//!   CAS in flight; no answer within [`Timings::cas_timeout_ms`] counts as unavailable.
//! * Operator operation ids must be below [`AUTO_OP_BIT`]. Commands for the pair
//!   (planned/forced failover) go to the active member, or as [`Command::PairFailover`] to
//!   every member (the holder alone executes and answers it); `ResumeFailback`,
//!   `SetPaused`, `ClearSuspension` to every member (standbys follow the active's failback
//!   pause).
//!
//! # Decisions the machine makes (beyond the seeds)
//!
//! * Election and takeover are one rule set ([`Blocker`] lists every condition in order),
//!   including the data-plane probe: a VIP that answers means somebody holds it.
//! * A claiming standby advertises role Active with `holds_vips == false` while its CAS is
//!   in flight; holders yield only to holders (make-before-break), claimers yield to better
//!   claimers; after losing the Lease CAS a standby waits one heartbeat timeout before it
//!   claims again.
//! * Two holders with the same epoch: the higher priority wins and moves to a fresh epoch.
//! * A planned handover aborted after its commit takes the VIPs back under an epoch newer
//!   than the committed one, so a target that took them yields even if the `Abort` is lost.
//!
//! ```
//! use havip_sm::*;
//! let a = NodeId::new("node-a").unwrap();
//! let b = NodeId::new("node-b").unwrap();
//! let cfg = Config::new(a, vec![
//!     Member { node: NodeId::new("node-a").unwrap(), priority: 200 },
//!     Member { node: b, priority: 100 },
//! ]);
//! let mut m = Machine::new(cfg, Persisted::default());
//! let actions = m.step(Millis(0), Input::Tick);
//! assert!(matches!(actions.last(), Some(Action::SendAdvert(_))));
//! assert_eq!(m.status().role, Role::Init);
//! ```

mod advert;
mod config;
mod io;
mod machine;
pub mod sim;
mod status;
mod types;

pub use advert::{AUTO_OP_BIT, Advert, OpKind, OpMsg, RefuseReason};
pub use config::{
    AutoFailback, CARRIER_STABLE_MAX_FACTOR, Config, ConfigError, FailbackPolicy, FlapPolicy, MAX_MEMBERS, Member,
    Timings, VipSpec,
};
pub use io::{Action, Alarm, CasResult, Command, Event, Input, Persisted, Reason, RejectReason};
pub use machine::{Machine, UNVERIFIED_PROBE_MS};
pub use status::{
    Blocker, LeaseView, NotReady, OperationPhase, OperationStatus, PeerStatus, ProbeState, Status, Transition,
};
pub use types::{
    AnnounceKind, Link, MAX_EPOCH, MAX_LEASE_STEP, MAX_NODE_NAME, MAX_VIP_ID, Millis, NameError, NodeId, PROTOCOL,
    PathId, ProbeResult, ProtocolVersion, Role, VipId,
};
