//! The errors of listeners, probers and connections.

use crate::host::netns::NetnsError;
use std::net::SocketAddr;
use std::time::Duration;

/// Errors of listeners and probers.
#[derive(Debug, thiserror::Error)]
pub enum TrafficError {
    /// Entering the namespace failed, or its thread panicked.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The listening socket could not be bound.
    #[error("failed to listen on {addr} in {ns}: {source}")]
    Bind {
        /// The namespace.
        ns: String,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A configuration value is unusable.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// A condition did not come true in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// The condition.
        what: String,
        /// How long we waited.
        timeout: Duration,
    },
}

/// Results of this room.
pub(super) type Result<T, E = TrafficError> = std::result::Result<T, E>;
