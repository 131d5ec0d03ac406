//! The havip operator (`havip-operator`). The `kubectl havip` plugin is a crate of its
//! own (`kubectl-havip/`); the two share the CRD types and the request grammar of
//! `havip-crds` ([`havip_crds::request`]).
//!
//! Each reconcile is observe → plan (pure, tested for convergence) → apply:
//!
//! - [`model`]: the HAPair decisions, as pure functions of one observation (phase,
//!   conditions, last transition, requests and their preconditions, command answers,
//!   key rotation, the configuration revision), composed by [`model::plan`].
//! - [`pair`]: the HAPair controller's room — the pair reconcile ([`pair::hapair`]),
//!   the key Secret ([`pair::keysecret`]), the `InvalidSpec` condition, FloatingIP
//!   status and member labels ([`pair::status`]) and the FloatingIP reconcile
//!   ([`pair::floatingip`]).
//! - [`loadbalancer`]: Services of type LoadBalancer and VIPPools — the allocator
//!   ([`loadbalancer::alloc`]), the Service plan ([`loadbalancer::plan`]) and its
//!   apply ([`loadbalancer::service`]), the VIPPool reconcile ([`loadbalancer::pool`]).
//! - [`controller`]: the kube-runtime controllers' wiring (watches, caches, which
//!   change triggers which reconcile); [`triggers`]: the watch plumbing.
//! - [`guard`]: the reconcile guard and error policy every reconcile shares;
//!   [`context`]: what every reconcile reads (client, caches, memory, Events);
//!   [`reserved`]: the addresses that are never a VIP (every Node's, the API
//!   server's), kept from the watches.
//! - [`leader`]: leader election on a Lease; only the leader runs the controllers.
//! - [`metrics`]: Prometheus metrics (served with `/healthz`, `/readyz`).
//!
//! The contract with the agents is `docs/kubernetes.md`. How the operator keeps it:
//!
//! - **Objects.** Per pair it creates the Lease `hapair-<pair>` (no holder, epoch 0)
//!   and, unless `keySecretRef`, the Secret `havip-<pair>-key` (`key`: 64 hex digits,
//!   `keyId`: `1`), both labelled `havip.io/pair` and owned by the HAPair (garbage
//!   collected with it). It never writes the pair Lease afterwards.
//! - **Status** by server-side apply under `havip-operator` with everything the
//!   operator owns and nothing else (agents' `members[]` entries are theirs); applied
//!   only when more than timestamps changed; a condition keeps its
//!   `lastTransitionTime` while its status holds.
//! - **Requests.** An annotation id is acted on once: the id goes to
//!   `status.command`, `lastOperation` (refusals, answers) or the rotation, and is
//!   recorded per annotation in the operator-owned annotation `havip.io/handled`
//!   (`lastOperation` holds one answer only, so it cannot remember five annotations).
//!   One new request per reconcile, so that every answer is written on its own.
//! - **Key rotation.** The Secret gets a new key with `keyId + 1` and the old one as
//!   `previousKey`/`previousKeyId`; its annotations record the rotation id, start and
//!   the member set the key was issued for. When every spec member reports the new
//!   key id, the previous key is removed. A member removed from the spec starts the
//!   same rotation (id `member-removal-<generation>`).
//! - **Events** (events.k8s.io/v1, namespace `default`): every action, every phase
//!   change, every role change (announced once the new active reports why, or after
//!   5 s with `RoleChange`), every member role change seen, every refusal and failure.
pub mod context;
pub mod controller;
pub mod error;
pub mod guard;
pub mod labels;
pub mod leader;
pub mod loadbalancer;
pub mod metrics;
pub mod model;
pub mod pair;
pub mod reserved;
pub mod triggers;

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
    /// Serve Services of type LoadBalancer without a `loadBalancerClass` too (havip as
    /// the cluster's default load-balancer provider).
    pub default_load_balancer: bool,
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
    // TCP keepalive: a watch whose connection died silently fails within seconds
    // instead of minutes (havip_crds::client).
    havip_crds::client::build(config).map_err(|e| Error::Client(e.to_string()))
}
