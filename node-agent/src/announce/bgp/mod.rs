//! The routed transport: VIPs made known by the node's own BGP speaker (FRR, BIRD),
//! never by a BGP implementation of havip's.
//!
//! The hand-off is the kernel's interface addresses. A VIP in `BGP` mode is held as a
//! host address (/32, /128) of the dummy interface [`LINK`] (`havip0`), which the agent
//! creates; the speaker is configured to advertise the connected routes of that
//! interface (FRR: `redistribute connected route-map …` with `match interface havip0`;
//! BIRD: `protocol direct { interface "havip0"; }`). So the route exists exactly while
//! the address does: every rule of the state machine about holding a VIP — the epoch,
//! fencing, demotion, the dual-holder bound the simulator checks — is a rule about
//! advertising it, with nothing in between that could disagree (a crashed agent cannot
//! leave a route without the address, nor the address without the route). A drain keeps
//! the VIP as a local route on `lo` instead (see `Netlink::add_local_route`), which the
//! speaker does not see: the route is withdrawn at the drain's start while established
//! connections keep their local address.
//!
//! Why not a route in a dedicated kernel table (kube-vip's routing-table mode): FRR
//! imports such a table (`ip import-table`) at a worse distance than the connected
//! route of the same address, so the holder (which must have the address to answer)
//! would advertise nothing through it; a route and an address are also two facts that
//! can disagree after a crash. See docs/bgp.md for the speaker's configuration.
//!
//! Nothing is announced at layer 2 for such a VIP (no gratuitous ARP or NA, no
//! duplicate-address probe: nobody shares a link with it). A member that receives
//! traffic for it without holding it drops it (the guard, on the links the traffic
//! arrives on) instead of routing it back to the router.

pub mod speaker;

pub use speaker::{Advertised, BACKUP_TABLE, Session, SpeakerConfig, SpeakerError, SpeakerKind, SpeakerReport};

/// The dummy interface whose addresses the node's BGP speaker advertises.
pub const LINK: &str = "havip0";

/// The metric (`IFA_RT_PRIORITY`) of a routed VIP's address held under `epoch`:
/// `u32::MAX - 1 - epoch`, so a newer epoch has the lower metric. FRR advertises a
/// connected route's metric as its MED, and a router prefers the lower MED among paths
/// from the same neighbouring AS (every AS with `bgp always-compare-med`): a takeover's
/// path wins the moment it arrives, while the dead holder's path still waits for BFD or
/// the hold timer to go, and a stale holder that still advertises loses to the newer
/// epoch. `u32::MAX` itself is never used: zebra (FRR 8.4) reads it as metric 0, the
/// best. The epoch never exceeds `i32::MAX` (the Lease's `leaseTransitions`), so the
/// metric stays at or above 2³¹ − 1 and never wraps.
pub fn route_metric(epoch: u64) -> u32 {
    (u32::MAX - 1).saturating_sub(u32::try_from(epoch).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::route_metric;

    #[test]
    fn a_newer_epoch_has_the_lower_metric() {
        assert_eq!(route_metric(0), u32::MAX - 1);
        assert_eq!(route_metric(1), u32::MAX - 2);
        assert!(route_metric(8) < route_metric(7));
        let top = u64::try_from(i32::MAX).unwrap_or(0);
        assert_eq!(route_metric(top), u32::MAX - (1 << 31));
        assert_eq!(route_metric(top), i32::MAX.unsigned_abs());
        assert_eq!(route_metric(u64::MAX), 0);
    }
}
