//! How each system is set up and moved: keepalived's configurations, whether MetalLB can
//! run here, a node cut, echo listeners for keepalived (havip's planned failover is
//! `AgentLab::failover_when_ready`).

use havip_e2e::baselines::keepalived::KeepalivedConfig;
use havip_e2e::harness::agent::SERVICE_PORT;
use havip_e2e::host::netns::{Link, Topology};
use havip_e2e::traffic::Listener;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Cuts node `node` as a dead node goes: management first, then data.
pub(crate) fn cut_node(topo: &Topology, node: usize) -> Result<(), String> {
    topo.cut_cable(node, Link::Mgmt).map_err(|e| e.to_string())?;
    topo.cut_cable(node, Link::Data).map_err(|e| e.to_string())
}

/// keepalived's configuration for a system name: `keepalived-v2` (VRRPv2 defaults),
/// `keepalived-v3` (VRRPv3, `advert_int 0.1`, havip's default heartbeat) or
/// `keepalived-v3-30ms` (`advert_int 0.03`, the Fast profile's heartbeat) or
/// `keepalived-v3-vmac` (`keepalived-v3` with `use_vmac`: the VIP on `vrrp.<vrid>` with the
/// VRRP MAC).
pub(crate) fn keepalived_config(system: &str) -> Option<KeepalivedConfig> {
    match system {
        "keepalived-v2" => Some(KeepalivedConfig::v2_defaults()),
        "keepalived-v3" => Some(KeepalivedConfig::v3_fast()),
        "keepalived-v3-30ms" => {
            Some(KeepalivedConfig { advert_int: Duration::from_millis(30), ..KeepalivedConfig::v3_fast() })
        }
        "keepalived-v3-vmac" => Some(KeepalivedConfig { use_vmac: true, ..KeepalivedConfig::v3_fast() }),
        _ => None,
    }
}

/// Echoing listeners on both nodes of a keepalived topology.
pub(crate) fn echo_listeners(topo: &Topology) -> Result<Vec<Listener>, String> {
    (0..2)
        .map(|i| {
            let n = topo.node(i);
            Listener::echo(&n.ns, &n.name, SocketAddr::from((Ipv4Addr::UNSPECIFIED, SERVICE_PORT)))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// Why `metallb-l2` cannot run here, if it cannot: MetalLB or the control plane not built.
pub(crate) fn metallb_missing() -> Option<String> {
    if let Err(e) = havip_e2e::harness::testbin::MetalLbBin::find() {
        return Some(e.to_string());
    }
    havip_e2e::harness::testbin::TestBin::find()
        .err()
        .map(|e| format!("{e} (build it with `bash hack/testbin.sh control-plane`)"))
}
