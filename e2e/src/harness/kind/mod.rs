//! The kind provider of the end-to-end suite: the same [`crate::scenarios`] as
//! `make e2e`, on a kind cluster (one control plane, three workers) with the chart
//! installed from `charts/havip` and the images `make images` builds.
//!
//! Everything here is command construction (pure functions, unit-tested: kind cannot
//! create a cluster where no image can be pulled) and a thin [`Cluster`]
//! implementation that runs those commands:
//! node cut = the host end of the node's eth0 on the kind bridge down · agent restart =
//! delete the node's agent pod (the DaemonSet starts a new one) · operator stop =
//! scale the Deployment to 0 · API outage = drop the nodes' TCP to the API server
//! port · client = a container on the kind network running `e2e-tool probe`.
//!
//! [`commands`] builds the command lines and manifests (pure, unit-tested); [`cluster`]
//! is the [`KindCluster`] that runs them.
//!
//! [`Cluster`]: crate::harness::cluster::Cluster

pub mod cluster;
pub mod commands;

pub use cluster::{KindCluster, run};
pub use commands::{API_PORT, KindConfig, NAMESPACE, NETWORK, PREVIOUS_TAG, SERVICE_PORT, vip_in_subnet};
