//! The errors of the MetalLB lab.

use crate::harness::controlplane::ControlPlaneError;
use crate::harness::kubelab::CrdError;
use crate::harness::testbin::MetalLbNotFound;
use crate::host::netns::NetnsError;
use crate::host::process::ProcessError;
use crate::host::routing::RoutingError;
use crate::traffic::TrafficError;

/// Errors of the MetalLB lab.
#[derive(Debug, thiserror::Error)]
pub enum MetalLbError {
    /// MetalLB is not built.
    #[error(transparent)]
    NotFound(#[from] MetalLbNotFound),
    /// A namespace operation failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The control plane failed.
    #[error(transparent)]
    ControlPlane(#[from] ControlPlaneError),
    /// MetalLB's CRDs could not be read or did not become Established.
    #[error(transparent)]
    Crds(#[from] CrdError),
    /// A listener or probe failed.
    #[error(transparent)]
    Traffic(#[from] TrafficError),
    /// A process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The router (BGP mode) failed.
    #[error(transparent)]
    Routing(#[from] RoutingError),
    /// An API call failed.
    #[error("failed to {op}: {source}")]
    Kube {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A file operation failed.
    #[error("failed to {op}: {source}")]
    Io {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A manifest could not be read.
    #[error("invalid manifest {what}: {reason}")]
    Manifest {
        /// Which.
        what: String,
        /// Why.
        reason: String,
    },
    /// The configuration is unusable.
    #[error("invalid MetalLB lab configuration: {0}")]
    Invalid(String),
    /// MetalLB did not get where it should, or a process exited.
    #[error("MetalLB {what}; last log lines:\n{logs}")]
    Failed {
        /// What went wrong.
        what: String,
        /// The controller's and speakers' log tails.
        logs: String,
    },
}

/// Results of the MetalLB lab.
pub(super) type Result<T, E = MetalLbError> = std::result::Result<T, E>;

/// An API error of operation `op`.
pub(super) fn kerr(op: impl Into<String>) -> impl FnOnce(kube::Error) -> MetalLbError {
    let op = op.into();
    move |source| MetalLbError::Kube { op, source }
}
