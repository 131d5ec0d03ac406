//! The witness: an optional third party for standalone pairs.
//!
//! Two members that cannot hear each other cannot tell a dead peer from a cut between
//! them. In Kubernetes mode the pair Lease settles it; a standalone pair can name a
//! witness (`havip-agent witness`, on any third host both members reach) that keeps the
//! same fencing record — holder and epoch with compare-and-swap, and renewals — so that:
//!
//! * a standby takes the VIPs only after the witness granted its claim (no vote, no
//!   takeover: while the witness is unreachable nobody takes over, and the members raise
//!   `WitnessUnreachable`);
//! * a holder that cannot hear its peer renews the record about once a second, and a
//!   standby that sees those renewals while its peer is silent does not take the VIPs
//!   from it (`PeerPartition`): a cut between the members moves nothing.
//!
//! Wire format: [`havip_crds::witness`]. See docs/standalone.md for the set-up.

pub mod client;
pub mod daemon;
mod error;
pub mod server;

pub use client::WitnessClient;
pub use error::WitnessError;
pub use server::{Records, WitnessMetrics, WitnessOptions, WitnessState};
