//! The systems havip is measured against, run in the same topologies: keepalived
//! ([`keepalived`], VRRP in the node namespaces) and MetalLB in layer-2 mode
//! ([`metallb`], its controller and speakers on the local control plane).
//!
//! Builds on [`crate::host`], [`crate::harness`] (control plane, test binaries) and
//! [`crate::traffic`].

pub mod keepalived;
pub mod metallb;
