//! The errors of the namespace harness.

use super::layout::{SUBNET_FIRST, SUBNET_LAST};
use crate::host::process::ProcessError;
use std::time::Duration;

/// Errors of the namespace harness.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A command could not be started.
    #[error("failed to run `{cmd}`: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A command exited unsuccessfully.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// Its standard error.
        stderr: String,
    },
    /// A command's output could not be understood.
    #[error("cannot parse the output of `{cmd}`: {reason}")]
    Parse {
        /// The command line.
        cmd: String,
        /// Why.
        reason: String,
    },
    /// The topology asked for is not supported.
    #[error("invalid topology: {0}")]
    Invalid(String),
    /// All subnets 10.100..=250 are taken by live topologies.
    #[error("no free subnet: 10.{SUBNET_FIRST}..=10.{SUBNET_LAST} are all held by live topologies")]
    NoSubnet,
    /// A file operation failed.
    #[error("failed to {op}: {source}")]
    Io {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Entering a namespace failed.
    #[error("failed to enter network namespace {ns}: {source}")]
    Setns {
        /// The namespace.
        ns: String,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// A thread running inside a namespace panicked.
    #[error("the thread in network namespace {ns} panicked")]
    Panicked {
        /// The namespace.
        ns: String,
    },
    /// A condition did not come true in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// The condition.
        what: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// A process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
}

/// Results of the namespace harness.
pub(super) type Result<T, E = NetnsError> = std::result::Result<T, E>;
