//! Errors of the witness and its clients ([`WitnessError`]), in a leaf module that the
//! server and the client share; re-exported from [`super`].

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
