//! Names, places and addresses of the harness's namespaces (see the module docs of
//! [`crate::host::netns`]), and a node's two [`Link`]s.

use std::fmt;
use std::net::Ipv6Addr;

/// Every namespace of this harness starts with this.
pub const NS_PREFIX: &str = "hve2e-";
/// Where lock files live (tmpfs: gone after a reboot, as the namespaces are).
pub const STATE_DIR: &str = "/run/havip-e2e";
/// Where `ip netns` keeps its namespace handles.
pub const NETNS_DIR: &str = "/var/run/netns";
/// The data interface of nodes, the client and the gateway.
pub const DATA_IF: &str = "eth0";
/// The management interface of nodes.
pub const MGMT_IF: &str = "eth1";

/// The first `k` of the subnets `10.<k>.0.0/16` a topology may take.
pub(super) const SUBNET_FIRST: u8 = 100;
/// The last.
pub(super) const SUBNET_LAST: u8 = 250;

/// Which of a node's two links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Link {
    /// `eth0`, on the `data` bridge: the client, the gateway and the VIPs are here.
    Data,
    /// `eth1`, on the `mgmt` bridge: a second path for heartbeats.
    Mgmt,
}

impl Link {
    /// Both links.
    pub const BOTH: [Link; 2] = [Link::Data, Link::Mgmt];

    /// The node-side interface name.
    pub fn ifname(self) -> &'static str {
        match self {
            Link::Data => DATA_IF,
            Link::Mgmt => MGMT_IF,
        }
    }

    pub(super) fn short(self) -> &'static str {
        match self {
            Link::Data => "data",
            Link::Mgmt => "mgmt",
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short())
    }
}

/// The IPv6 address of `10.<k>.<net>.<host>`: `fd00:6876:<k>:<net>::<host>`.
pub(super) fn v6(k: u8, net: u8, host: u8) -> Ipv6Addr {
    // Written with the decimal digits read as hex, so that `fd00:6876:100::10`
    // matches `10.100.0.10`.
    let hex = |d: u32| -> u16 {
        u16::from_str_radix(&d.to_string(), 16).unwrap_or_default() // digits ≤ 255 always parse
    };
    Ipv6Addr::new(0xfd00, 0x6876, hex(u32::from(k)), hex(u32::from(net)), 0, 0, 0, hex(u32::from(host)))
}
