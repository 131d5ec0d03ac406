//! The virtual MAC (the HAPair's `virtualMAC`): the interfaces that carry a pair's
//! layer-2 VIPs with a MAC that moves with them.
//!
//! Each VIP link (the parent) gets one macvlan interface per MAC, in private mode, named
//! by [`crate::config::VirtualMac::link_name`]. Every member creates it when it applies the
//! configuration and keeps it **down**; the holder sets it up before it adds the VIPs
//! (host addresses, /32 and /128, so that no second connected route of the VIP's subnet
//! appears beside the parent's) and sets it down again when the last of them is gone from
//! it (demotion, a drain moving them to `lo`). A macvlan that is down takes no frames: its
//! MAC leaves the parent's unicast filter, so a standby's NIC drops what is sent to the
//! virtual MAC, and the switch learns the MAC only from the holder's frames — the
//! announcements sent from the macvlan ([`super::L2Port`] on it), whose source is the
//! virtual MAC.
//!
//! Kernel settings, written through netlink (they work where `/proc/sys` is read-only):
//! - the macvlan: `arp_ignore=1` (it answers ARP only for the VIPs on it, never for the
//!   node's own addresses with the virtual MAC), `rp_filter=2` (loose: a client's packet
//!   arrives on the macvlan while the route back to it goes out of the parent, which strict
//!   reverse-path filtering would drop), and IPv6 `addr_gen_mode=none` (no link-local
//!   address: two members' macvlans share the MAC and would fail each other's duplicate
//!   address detection during a planned move);
//! - the parent: `arp_ignore=1` (the kernel answers ARP for any local address on any
//!   interface: without it the parent would answer for the VIP with its own MAC, and the
//!   clients would learn the node instead of the virtual MAC) and `arp_announce=2` (ARP
//!   requests the node sends carry its own address of the parent's subnet, never the VIP,
//!   which would teach the clients the parent's MAC for the VIP). These two stay when the
//!   pair goes: they are also what IPVS-mode kube-proxy sets on every node.
//!
//! IPv6 needs neither: neighbour discovery answers only for addresses of the interface a
//! solicitation arrives on. The IPv4 interface gets IPv6 turned off (`/proc/sys`, best
//! effort): it would send multicast listener reports from the virtual MAC.

use crate::netlink::{LinkState, Netlink, NetlinkError, errno};
use netlink_packet_route::link::{
    AfSpecInet, AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InetDevConf, LinkAttribute, LinkInfo, LinkMessage,
    MacVlanMode,
};

const EEXIST: i32 = 17;
const ENODEV: i32 = 19;

/// The prefix of every virtual MAC interface's name (see
/// [`crate::config::VirtualMac::link_name`]); nothing else is ever deleted as one.
pub const LINK_PREFIX: &str = "hv";

/// Whether `name` is the name of a virtual MAC interface.
pub fn is_virtual_link_name(name: &str) -> bool {
    name.strip_prefix(LINK_PREFIX).is_some_and(|rest| {
        let rest = rest.strip_prefix(['4', '6']).unwrap_or(rest);
        let mut parts = rest.split('-');
        parts.next() == Some("")
            && parts.next().is_some_and(|id| id.len() == 2 && id.chars().all(|c| c.is_ascii_hexdigit()))
            && parts.next().is_some_and(|ix| !ix.is_empty() && ix.chars().all(|c| c.is_ascii_hexdigit()))
            && parts.next().is_none()
    })
}

impl Netlink {
    /// Makes sure the macvlan `name` exists on the link `parent` with MAC `mac` (private
    /// mode), with its settings and its parent's (see the module). One that is created is
    /// left down; an existing one keeps its state (a holder's stays up across a
    /// reconfiguration). An interface of that name with another MAC or parent, or of
    /// another kind, is refused: it is not this pair's.
    pub async fn ensure_macvlan(
        &self,
        name: &str,
        parent: &LinkState,
        mac: [u8; 6],
        ipv4_only: bool,
    ) -> Result<(), NetlinkError> {
        let found = match self.link_facts(name).await? {
            Some(found) => found,
            None => {
                let msg =
                    rtnetlink::LinkMacVlan::new(name, parent.index, MacVlanMode::Private).address(mac.to_vec()).build();
                match self.handle().link().add(msg).execute().await {
                    Ok(()) => {
                        tracing::info!(ifname = name, mac = %format_mac(&mac), "created the virtual MAC interface")
                    }
                    // A concurrent start created it: checked below like any existing one.
                    Err(e) if errno(&e) == Some(EEXIST) => {}
                    Err(source) => return Err(NetlinkError::AddLink { ifname: name.to_owned(), source }),
                }
                self.link_facts(name).await?.ok_or_else(|| NetlinkError::LinkNotFound(name.to_owned()))?
            }
        };
        if found.kind.as_deref() != Some("macvlan") || found.parent != Some(parent.index) || found.mac != mac {
            return Err(NetlinkError::VirtualLinkTaken {
                ifname: name.to_owned(),
                found: format!(
                    "kind {}, parent index {}, MAC {}",
                    found.kind.as_deref().unwrap_or("unknown"),
                    found.parent.map_or_else(|| "none".to_owned(), |p| p.to_string()),
                    format_mac(&found.mac)
                ),
            });
        }
        let mut own = InetDevConf::default();
        own.arp_ignore = 1;
        own.rp_filter = 2;
        self.set_devconf(name, found.index, own, Some(In6AddrGenMode::None)).await?;
        if ipv4_only {
            disable_ipv6(name);
        }
        let mut conf = InetDevConf::default();
        conf.arp_ignore = 1;
        conf.arp_announce = 2;
        self.set_devconf(&parent.name, parent.index, conf, None).await
    }

    /// Sets the link `name` up or down. Idempotent.
    pub async fn set_link_up(&self, name: &str, up: bool) -> Result<(), NetlinkError> {
        let link = self.link(name).await?;
        if link.up == up {
            return Ok(());
        }
        let b = rtnetlink::LinkUnspec::new_with_index(link.index);
        let msg = if up { b.up() } else { b.down() }.build();
        self.handle()
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|source| NetlinkError::AddLink { ifname: name.to_owned(), source })?;
        tracing::debug!(ifname = name, up, "virtual MAC interface set");
        Ok(())
    }

    /// Deletes the virtual MAC interface `name` (its addresses go with it). Only a macvlan
    /// whose name [`is_virtual_link_name`] is deleted; a missing one is success.
    pub async fn delete_virtual_link(&self, name: &str) -> Result<bool, NetlinkError> {
        if !is_virtual_link_name(name) {
            return Ok(false);
        }
        let Some(found) = self.link_facts(name).await? else { return Ok(false) };
        if found.kind.as_deref() != Some("macvlan") {
            return Ok(false);
        }
        match self.handle().link().del(found.index).execute().await {
            Ok(()) => {
                tracing::info!(ifname = name, "deleted the virtual MAC interface");
                Ok(true)
            }
            Err(e) if errno(&e) == Some(ENODEV) => Ok(false),
            Err(source) => Err(NetlinkError::AddLink { ifname: name.to_owned(), source }),
        }
    }

    /// The kind, parent and MAC of link `name` (`None`: no such link).
    async fn link_facts(&self, name: &str) -> Result<Option<LinkFacts>, NetlinkError> {
        use futures::TryStreamExt;
        let mut s = self.handle().link().get().match_name(name.to_owned()).execute();
        let msg = match s.try_next().await {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(None),
            Err(e) if errno(&e) == Some(ENODEV) => return Ok(None),
            Err(e) => return Err(NetlinkError::ListLinks(e)),
        };
        Ok(Some(link_facts(&msg)))
    }

    /// Writes the non-zero fields of `conf` (and the IPv6 address generation mode) on the
    /// link with index `index`.
    async fn set_devconf(
        &self,
        ifname: &str,
        index: u32,
        conf: InetDevConf,
        v6: Option<In6AddrGenMode>,
    ) -> Result<(), NetlinkError> {
        let mut spec = vec![AfSpecUnspec::Inet(vec![AfSpecInet::DevConfRequest(conf)])];
        if let Some(mode) = v6 {
            spec.push(AfSpecUnspec::Inet6(vec![AfSpecInet6::AddrGenMode(mode)]));
        }
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::AfSpecUnspec(spec));
        self.handle()
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|source| NetlinkError::LinkSettings { ifname: ifname.to_owned(), source })
    }
}

/// Turns IPv6 off on the IPv4 virtual MAC interface `name` (`/proc/sys`; netlink cannot):
/// without it the kernel sends multicast listener reports from the virtual MAC whenever
/// the interface or its parent comes up — also on a member that is about to give the VIPs
/// up — and switches learn that member's port for the MAC. Best effort: where `/proc/sys`
/// is read-only the holder's announcement when it hears that member again covers it.
fn disable_ipv6(name: &str) {
    let path = format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6");
    match std::fs::write(&path, "1") {
        Ok(()) => tracing::debug!(ifname = name, "IPv6 off on the IPv4 virtual MAC interface"),
        Err(e) => tracing::info!(ifname = name, error = %e, "cannot turn IPv6 off on the IPv4 virtual MAC interface"),
    }
}

struct LinkFacts {
    index: u32,
    kind: Option<String>,
    parent: Option<u32>,
    mac: [u8; 6],
}

fn link_facts(msg: &LinkMessage) -> LinkFacts {
    let mut out = LinkFacts { index: msg.header.index, kind: None, parent: None, mac: [0; 6] };
    for a in &msg.attributes {
        match a {
            LinkAttribute::Link(p) => out.parent = Some(*p),
            LinkAttribute::Address(m) => {
                if let Ok(m) = <[u8; 6]>::try_from(m.as_slice()) {
                    out.mac = m;
                }
            }
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        out.kind = Some(k.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// `00:00:5e:00:01:33`.
pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

#[cfg(test)]
mod tests {
    use super::is_virtual_link_name;
    use crate::config::VirtualMac;

    #[test]
    fn only_the_names_havip_gives_are_virtual_links() {
        let v = VirtualMac { id: 0x33, v4: [0, 0, 0x5e, 0, 1, 0x33], v6: [0, 0, 0x5e, 0, 2, 0x33] };
        assert_eq!(v.link_name(false, 2), "hv4-33-2");
        assert_eq!(v.link_name(true, 0xffff_ffff), "hv6-33-ffffffff");
        assert!(v.link_name(true, u32::MAX).len() <= 15);
        let same = VirtualMac { id: 1, v4: [2, 0, 0, 0, 0, 1], v6: [2, 0, 0, 0, 0, 1] };
        assert_eq!(same.link_name(false, 7), "hv-01-7");
        assert_eq!(same.link_name(true, 7), "hv-01-7");
        for good in ["hv4-33-2", "hv6-ff-ffffffff", "hv-01-7"] {
            assert!(is_virtual_link_name(good), "{good}");
        }
        for bad in
            ["havip0", "hv4-33", "hv5-33-2", "hv4-333-2", "hv4-33-2-1", "eth0", "hv4-3g-2", "hv--33-2", "hv4-33-"]
        {
            assert!(!is_virtual_link_name(bad), "{bad}");
        }
    }
}
