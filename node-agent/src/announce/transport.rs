//! What the runtime calls to announce a VIP ([`Transport`]) and the errors of the
//! layer-2 socket layer ([`AnnounceError`]): a leaf module that the transports
//! ([`super::l2`]) and the rest of [`super`] build on, re-exported from [`super`].

use std::net::IpAddr;

/// What the runtime calls to make a VIP it holds known to the network. Each call is one
/// announcement of one VIP; the schedule ([`spawn_schedule`](super::spawn_schedule))
/// decides how often. A transport must be cheap to call from the scheduling task and
/// never block for long.
pub trait Transport: Send + Sync {
    /// Announces `vip` once; returns what was sent (the `kind` label of
    /// `havip_agent_announcements_total`: `garp`, `na`).
    fn announce(&self, vip: IpAddr) -> Result<&'static str, AnnounceError>;

    /// Announces `vip` once to one neighbour (`to`, at `to_mac`), unicast: an ARP reply or
    /// an unsolicited NA addressed to it, for hosts that drop broadcast announcements
    /// (`announce.unicastToNeighbours`); returns its kind (`arp_unicast`, `na_unicast`).
    fn announce_to(&self, vip: IpAddr, to: IpAddr, to_mac: [u8; 6]) -> Result<&'static str, AnnounceError>;
}

/// Errors of the layer-2 socket layer.
#[derive(Debug, thiserror::Error)]
pub enum AnnounceError {
    /// The interface does not exist (or has no MAC address).
    #[error("failed to find interface {0} (or it has no MAC address)")]
    NoInterface(String),
    /// The packet socket could not be opened.
    #[error("failed to open a packet socket on {ifname}: {source}")]
    Open {
        /// The interface.
        ifname: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A frame could not be sent.
    #[error("failed to send {what} on {ifname}: {source}")]
    Send {
        /// What was sent.
        what: &'static str,
        /// The interface.
        ifname: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}
