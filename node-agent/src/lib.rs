//! The havip node agent, in rooms.
//!
//! - Modes, siblings around one runtime per pair: Kubernetes ([`kube`]: the loop as
//!   observe → pure plan → apply), standalone from local files ([`standalone`]: daemon,
//!   pair files, admin socket, start-up sweep) and the witness that arbitrates standalone
//!   takeovers ([`witness`]).
//! - [`runtime`]: feeds the pure state machine ([`sm`], crate `havip-sm`, with its
//!   simulator [`sim`]) from sockets, netlink and timers and executes its actions, drains
//!   included; [`config`]: the configuration every mode builds.
//! - Transports, which make a held VIP known: [`announce`] (the `Transport` trait, its
//!   layer-2 implementation and the announcement schedule).
//! - Observation: [`heartbeat`] (authenticated multi-path heartbeats on sockets shared by
//!   every pair), [`probes`] (TCP through the VIPs and of the own listeners, gateway,
//!   conflicts, traffic), [`netlink`] (addresses and carrier), [`lease`] (the fencing
//!   record's reads).
//! - The kernel's other state: [`nft`] (the drain's forwarder and quieter and every
//!   member's guard, through nf_tables netlink); what must be cleaned up later:
//!   [`ledger`] (VIPs added), [`state`] (the persisted epoch and role), [`leftovers`]
//!   (what gone pairs left behind).
//! - [`metrics`] (served by `havip-endpoints` with the health endpoints) and [`timer`].

pub mod announce;
pub mod config;
pub mod controlplane;
pub mod doctor;
pub mod heartbeat;
pub mod kube;
pub mod lease;
pub mod ledger;
pub mod leftovers;
pub mod metrics;
pub mod netlink;
pub mod nft;
pub mod probes;
pub mod quorum;
pub mod runtime;
pub mod standalone;
pub mod state;
pub mod timer;
pub mod witness;

/// The pure state machine (crate `havip-sm`), re-exported so that `havip_node_agent::sm` keeps its path.
pub use havip_sm as sm;
/// The deterministic simulator of the state machine (in `havip-sm`).
pub use havip_sm::sim;
