//! The EtherTypes the layer-2 frames and sockets use and the lookup of an interface
//! with its MAC address: a leaf module that [`super`] and its frames and listeners share.

use super::super::transport::AnnounceError;
use pnet::datalink::{self, MacAddr, NetworkInterface};

/// EtherType of ARP.
pub(crate) const ETH_P_ARP: u16 = 0x0806;
/// EtherType of IPv6.
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;

/// The interface named `ifname` and its MAC address.
pub(crate) fn find_interface(ifname: &str) -> Result<(NetworkInterface, MacAddr), AnnounceError> {
    let iface = datalink::interfaces()
        .into_iter()
        .find(|i| i.name == ifname)
        .ok_or_else(|| AnnounceError::NoInterface(ifname.to_owned()))?;
    let mac =
        iface.mac.filter(|m| *m != MacAddr::zero()).ok_or_else(|| AnnounceError::NoInterface(ifname.to_owned()))?;
    Ok((iface, mac))
}
