//! What the lab runs: the names of its objects, MetalLB's ports, and the
//! [`MetalLbConfig`].

use crate::harness::agent::SERVICE_PORT;
use std::time::Duration;

/// The namespace MetalLB runs in.
pub const METALLB_NAMESPACE: &str = "metallb-system";
/// The namespace of the benchmark's Service.
pub const SERVICE_NAMESPACE: &str = "default";
/// The benchmark's Service.
pub const SERVICE_NAME: &str = "havip-bench";
/// The IPAddressPool (and L2Advertisement) name.
pub const POOL: &str = "havip-bench";
/// The labels of the speaker Pods, as `--ml-labels` selects them.
pub const SPEAKER_LABELS: &str = "app=metallb,component=speaker";
/// memberlist's port (MetalLB's default).
pub const MEMBERLIST_PORT: u16 = 7946;
/// The speakers' metrics port, inside each node's namespace (MetalLB's default).
pub const SPEAKER_METRICS_PORT: u16 = 7472;
/// The nftables table that stands in for kube-proxy in each node's namespace.
pub const KUBE_PROXY_TABLE: &str = "havip_kube_proxy";

/// The field manager of the objects the lab applies.
pub(super) const FIELD_MANAGER: &str = "havip-e2e";
/// The memberlist Secret.
pub(super) const MEMBERLIST_SECRET: &str = "memberlist";

/// The Service's `externalTrafficPolicy` (see the module docs for why `Local` is the
/// default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// Only nodes with a ready local endpoint announce; traffic stays on the node.
    Local,
    /// Every node with a speaker may announce.
    Cluster,
}

impl TrafficPolicy {
    /// The API value.
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficPolicy::Local => "Local",
            TrafficPolicy::Cluster => "Cluster",
        }
    }
}

/// How MetalLB makes the address known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Layer 2: one elected speaker answers ARP for the address.
    #[default]
    Layer2,
    /// BGP, MetalLB's native speaker: every speaker with a ready local endpoint advertises
    /// the address to the lab's router (FRR on the gateway), the client sits behind the
    /// router in another subnet (see the module docs).
    Bgp {
        /// The BGPPeer's `holdTime` (`None`: MetalLB's default, 90 s; the session's hold
        /// time is the smaller of the two ends', and the lab's router offers 9 s).
        hold_time: Option<Duration>,
    },
}

/// What to run. MetalLB's own settings stay at its defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct MetalLbConfig {
    /// Layer 2 (the default) or BGP.
    pub mode: Mode,
    /// Lab nodes (2..=5), each with a speaker and a listener.
    pub nodes: usize,
    /// The Service's port, and the listeners' (8080).
    pub port: u16,
    /// The Service's `externalTrafficPolicy` (`Local`).
    pub traffic_policy: TrafficPolicy,
    /// The controller's and speakers' `--log-level` (`info`).
    pub log_level: String,
    /// How long [`MetalLbLab::start`](super::MetalLbLab::start) waits for each step (60 s).
    pub timeout: Duration,
}

impl Default for MetalLbConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Layer2,
            nodes: 2,
            port: SERVICE_PORT,
            traffic_policy: TrafficPolicy::Local,
            log_level: "info".to_owned(),
            timeout: Duration::from_secs(60),
        }
    }
}

/// The speaker Pod of node `node`.
pub fn speaker_pod(node: &str) -> String {
    format!("speaker-{node}")
}

#[cfg(test)]
mod tests {
    use super::{MetalLbConfig, TrafficPolicy};

    #[test]
    fn traffic_policy_names() {
        assert_eq!(TrafficPolicy::Local.as_str(), "Local");
        assert_eq!(TrafficPolicy::Cluster.as_str(), "Cluster");
        assert_eq!(MetalLbConfig::default().traffic_policy, TrafficPolicy::Local);
    }
}
