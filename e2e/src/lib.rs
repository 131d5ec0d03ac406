//! The havip end-to-end harness: a real local control plane (etcd and kube-apiserver
//! processes with generated certificates and RBAC), network-namespace topologies as nodes,
//! test traffic, the baselines havip is measured against, the end-to-end scenarios, and
//! the `lab`, `kind-e2e` and `bench-*` binaries built on them.
//!
//! Rooms, bottom up (a room uses only the rooms above it in this list):
//!
//! - [`host`]: child processes that never outlive the test, network namespaces and
//!   topologies, tracing;
//! - [`traffic`]: listeners, probers, long-lived and half-open connections, and the
//!   counters of looping packets;
//! - [`harness`]: the systems under test: test binaries, the control plane, the
//!   standalone agent lab, the Kubernetes lab, and the cluster providers (local, kind);
//! - [`baselines`]: keepalived and MetalLB, run in the same topologies;
//! - [`scenarios`]: the end-to-end scenarios, written once against
//!   [`harness::cluster::Cluster`];
//! - [`bench`](mod@bench): what the benchmark binaries share;
//! - [`chaos`]: the chaos run's nemesis, checker and lab (on [`harness::kubelab`]).
//!
//! The modules are also re-exported here under their former flat names
//! (`havip_e2e::netns`, `havip_e2e::agent`, …), which the tests use. `e2e/README.md`
//! says which test layer to pick for what.

pub mod baselines;
pub mod bench;
pub mod chaos;
pub mod harness;
pub mod host;
pub mod scenarios;
pub mod traffic;

pub use baselines::{keepalived, metallb};
pub use bench::footprint;
pub use harness::{agent, api, bgp, certs, cluster, controlplane, cpcluster, kind, kubelab, testbin};
pub use host::logging::init_tracing;
pub use host::{netns, process, routing};
pub use scenarios::kind as kind_scenarios;
pub use traffic::loops;
