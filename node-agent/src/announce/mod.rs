//! Making VIPs known to the network: what the runtime calls ([`Transport`]), its
//! layer-2 implementation ([`l2`]: gratuitous ARP and unsolicited neighbour
//! advertisements, plus the ARP/ND probes and listeners the duplicate-VIP and gateway
//! checks use), and the announcement schedule with its stall gate ([`schedule`]).
//!
//! The routed transport ([`bgp`]) is its sibling, chosen per VIP (`announce.mode`): the
//! VIP becomes an address of a dummy interface that the node's BGP speaker advertises,
//! so there is nothing to send and nothing to schedule.

pub mod bgp;
pub mod l2;
pub mod schedule;
mod transport;

pub use l2::L2Sender;
pub use l2::frames::{
    ArpSeen, NaSeen, arp_request_frame, garp_frame, neighbor_solicitation_frame, parse_arp, parse_na,
    unsolicited_na_frame,
};
pub use l2::listeners::{ArpListener, NdListener};
pub use schedule::{AnnounceGate, spawn_schedule};
pub use transport::{AnnounceError, Transport};
