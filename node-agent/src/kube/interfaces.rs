//! This node's addresses on the interfaces that `interface:` heartbeat paths name
//! ([`interface_addresses`]), read from the kernel; re-exported from [`super`].

use super::config::pick_path_address;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// This node's address on each of `names` (interfaces of `interface:` heartbeat paths),
/// read from the kernel; see [`pick_path_address`]. Interfaces that do not exist or
/// have no usable address are left out (the pair then waits, saying why).
pub async fn interface_addresses(names: &[String]) -> BTreeMap<String, IpAddr> {
    let mut out = BTreeMap::new();
    if names.is_empty() {
        return out;
    }
    let nl = match crate::netlink::Netlink::new() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read interface addresses for interface heartbeat paths");
            return out;
        }
    };
    let (links, addrs) = match (nl.links().await, nl.addresses().await) {
        (Ok(l), Ok(a)) => (l, a),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(error = %e, "cannot read interface addresses for interface heartbeat paths");
            return out;
        }
    };
    for name in names {
        if let Some(link) = links.iter().find(|l| &l.name == name)
            && let Some(a) = pick_path_address(addrs.iter().filter(|a| a.ifindex == link.index))
        {
            out.insert(name.clone(), a);
        }
    }
    out
}
