//! Standalone mode (no Kubernetes): pairs run from local files, a sibling of the
//! Kubernetes mode in [`crate::kube`]. The daemon ([`daemon`], `havip-agent standalone`),
//! its pair files ([`config`]), its admin socket ([`admin`]), the node checks ([`doctor`]) and the start-up sweep of
//! what pairs that are no longer configured left behind ([`sweep`]). The optional
//! witness that arbitrates standalone takeovers lives in [`crate::witness`].

pub mod admin;
pub mod config;
pub mod daemon;
pub mod doctor;
pub mod sweep;
