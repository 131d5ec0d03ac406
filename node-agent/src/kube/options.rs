//! How the Kubernetes agent runs ([`KubeAgentOptions`]), why it could not
//! ([`KubeAgentError`]) and how long it waits for the API server before it resumes its
//! pairs ([`OFFLINE_AFTER`]): a leaf module that the loop ([`super`]), its pairs and its
//! watches share; re-exported from [`super`].

use std::path::PathBuf;
use std::time::Duration;

/// How the Kubernetes agent runs.
#[derive(Clone, Debug)]
pub struct KubeAgentOptions {
    /// This node.
    pub node: String,
    /// The operator namespace (pair Leases and key Secrets).
    pub namespace: String,
    /// Persisted state directory (a hostPath).
    pub state_dir: PathBuf,
    /// Hand the VIPs over before exiting when the node is cordoned.
    pub handover_when_cordoned: bool,
    /// The agent's DaemonSet in `namespace`: on SIGTERM, if it is gone, being deleted or
    /// no longer selects this node, the VIPs are removed (an uninstall leaves none);
    /// otherwise (a rolling update, a restarted pod) they stay. `None`: they always stay.
    pub daemonset: Option<String>,
}

/// Why the Kubernetes agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum KubeAgentError {
    /// A watch ended before it listed its objects once.
    #[error("failed to list {what}: the watch ended before its first list")]
    InitialList {
        /// The kind, plural.
        what: &'static str,
    },
    /// The check for pairs the operator has not labelled yet could not list the pairs.
    #[error("failed to list the HAPairs (to find those not labelled for this node yet): {0}")]
    Unlabelled(#[source] kube::Error),
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("failed to install the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
}

/// How long the agent waits for its first lists before it resumes its pairs from their
/// last applied configuration. Short: meanwhile the VIPs its predecessor added stay in
/// the kernel with nobody heartbeating for them or able to give them up (a node cut off
/// while its agent restarted answers for them again the moment its cable is back, next
/// to the member that took them over). The lists of this node's own objects take
/// milliseconds when the API server answers; a pair resumed from its snapshot is brought
/// in line by the first lists anyway.
pub(super) const OFFLINE_AFTER: Duration = Duration::from_secs(2);
