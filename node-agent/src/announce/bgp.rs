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

/// The dummy interface whose addresses the node's BGP speaker advertises.
pub const LINK: &str = "havip0";
