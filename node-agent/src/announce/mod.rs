//! Making VIPs known to the network: what the runtime calls ([`Transport`]), its
//! layer-2 implementation ([`l2`]: gratuitous ARP and unsolicited neighbour
//! advertisements, plus the ARP/ND probes and listeners the duplicate-VIP and gateway
//! checks use), and the announcement schedule with its stall gate ([`schedule`]).
//!
//! A routed transport (BGP, through the node's routing daemon) is a sibling of [`l2`]:
//! another [`Transport`], chosen per VIP, scheduled the same way.

pub mod l2;
pub mod schedule;

use std::net::IpAddr;

pub use l2::L2Sender;
pub use l2::frames::{
    ArpSeen, NaSeen, arp_request_frame, garp_frame, neighbor_solicitation_frame, parse_arp, parse_na,
    unsolicited_na_frame,
};
pub use l2::listeners::{ArpListener, NdListener};
pub use schedule::{AnnounceGate, spawn_schedule};

/// What the runtime calls to make a VIP it holds known to the network. Each call is one
/// announcement of one VIP; the schedule ([`spawn_schedule`]) decides how often. A
/// transport must be cheap to call from the scheduling task and never block for long.
pub trait Transport: Send + Sync {
    /// Announces `vip` once; returns what was sent (the `kind` label of
    /// `havip_agent_announcements_total`: `garp`, `na`).
    fn announce(&self, vip: IpAddr) -> Result<&'static str, AnnounceError>;
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
