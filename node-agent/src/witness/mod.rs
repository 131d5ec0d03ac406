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
pub mod server;

pub use client::WitnessClient;
pub use server::{Records, WitnessMetrics, WitnessOptions, WitnessState};

use std::net::SocketAddr;
use std::path::PathBuf;

/// Errors of the witness and its clients.
#[derive(Debug, thiserror::Error)]
pub enum WitnessError {
    /// The witness could not bind its address.
    #[error("failed to bind the witness to {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A member could not open its socket to the witness.
    #[error("failed to open a socket to the witness at {address}: {source}")]
    Connect {
        /// The witness's address.
        address: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Another witness uses the state directory.
    #[error("another witness uses this state directory (lock {path} is held): {source}")]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The state file could not be read, parsed or written.
    #[error("witness state file {path}: {message}")]
    State {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}
