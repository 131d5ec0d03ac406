//! The havip operator (`havip-operator`) and the `kubectl-havip` plugin.
//!
//! - [`model`]: the decisions, as pure functions (phase, conditions, requests,
//!   command answers, key rotation).
//! - [`controller`], [`hapair`], [`floatingip`]: the kube-runtime controllers.
//! - [`leader`]: leader election on a Lease.
//! - [`metrics`]: Prometheus metrics.
//! - [`plugin`]: the plugin's rendering and request ids.
//!
//! The contract with the agents is `docs/kubernetes.md`.

pub mod controller;
pub mod error;
pub mod floatingip;
pub mod hapair;
pub mod leader;
pub mod metrics;
pub mod model;
pub mod plugin;

pub use error::Error;

use std::time::Duration;

/// The operator's settings (from its flags).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespace of the pair Leases, key Secrets and the leader-election Lease.
    pub namespace: String,
    /// Name of the leader-election Lease.
    pub leader_lease: String,
    /// This replica's identity (Events' reporting instance, Lease holder).
    pub identity: String,
    /// Periodic reconcile of every pair.
    pub resync: Duration,
    /// Reconciles running at once per controller.
    pub concurrency: u16,
}

/// Builds a client from a kubeconfig path, or the usual inference (KUBECONFIG,
/// `~/.kube/config`, in-cluster) when `None`.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, Error> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| Error::Client(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Client(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer().await.map_err(|e| Error::Client(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| Error::Client(e.to_string()))
}
