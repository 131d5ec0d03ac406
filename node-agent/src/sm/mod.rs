//! The pure HA state machine of a pair member (issue 3; seed 004 decisions, seed 003
//! failback policy).
//!
//! No I/O, no clock reads, no randomness, no threads: time comes in as [`Millis`] with
//! every [`Input`], and the machine answers with [`Action`]s for the I/O layer to execute
//! in order. The same code runs in the node agent and in the deterministic simulator
//! ([`crate::sim`]).
//!
//! ```
//! use havip_node_agent::sm::*;
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
mod status;
mod types;

pub use advert::{AUTO_OP_BIT, Advert, OpKind, OpMsg, RefuseReason};
pub use config::{
    AutoFailback, Config, ConfigError, FailbackPolicy, FlapPolicy, MAX_MEMBERS, Member, Timings, VipSpec,
};
pub use io::{Action, Alarm, CasResult, Command, Event, Input, Persisted, Reason, RejectReason};
pub use machine::Machine;
pub use status::{Blocker, LeaseView, OperationPhase, OperationStatus, PeerStatus, ProbeState, Status, Transition};
pub use types::{
    AnnounceKind, Link, MAX_NODE_NAME, MAX_VIP_ID, Millis, NameError, NodeId, PROTOCOL, PathId, ProbeResult,
    ProtocolVersion, Role, VipId,
};
