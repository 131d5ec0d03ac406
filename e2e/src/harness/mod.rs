//! The systems under test, set up and torn down: the pinned test binaries
//! ([`testbin`]), a real control plane of etcd and kube-apiserver with its certificates
//! ([`certs`], [`controlplane`]), a highly available one of several members inside node
//! namespaces ([`cpcluster`]), Kubernetes API helpers ([`api`]), havip agents in
//! standalone mode on a namespace topology ([`agent`]), the Kubernetes lab with agents and
//! the operator on that control plane ([`kubelab`]), their Prometheus metrics ([`metrics`]), and the cluster providers the
//! end-to-end scenarios run against: the local one on the lab and kind ([`cluster`],
//! [`kind`]).
//!
//! Builds on [`crate::host`] (processes, namespaces) and [`crate::traffic`] (listeners and
//! probers).

pub mod agent;
pub mod api;
pub mod bgp;
pub mod certs;
pub mod cluster;
pub mod controlplane;
pub mod cpcluster;
pub mod kind;
pub mod kubelab;
pub mod metrics;
pub mod testbin;
