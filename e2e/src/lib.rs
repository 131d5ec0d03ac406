//! The havip end-to-end harness: a real local control plane (etcd and
//! kube-apiserver processes with generated certificates and RBAC), helpers that
//! always clean up, and the `lab` binary built on them.

pub mod agent;
pub mod api;
pub mod certs;
pub mod cluster;
pub mod controlplane;
pub mod footprint;
pub mod keepalived;
pub mod kind;
pub mod kind_scenarios;
pub mod kubelab;
pub mod loops;
pub mod metallb;
pub mod netns;
pub mod process;
pub mod scenarios;
pub mod testbin;
pub mod traffic;

/// Initialises `tracing` for tests and binaries (idempotent); `RUST_LOG` filters.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_test_writer()
        .try_init();
}
