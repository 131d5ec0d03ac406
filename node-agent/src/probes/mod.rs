//! Probes that feed the state machine: TCP connect probes of the VIP listeners,
//! gateway (fence target) reachability and duplicate-VIP detection by ARP (IPv4) and
//! neighbour solicitation (IPv6), and a
//! traffic sampler for the failback quiet window; and the observer tasks that run them
//! for a pair (`spawn_…`, [`PeerProbes`]). Probes observe and report; what a verdict
//! means is the state machine's business, never decided here.
//!
//! Rooms: [`tcp`] (the data plane through the VIPs and the member's own listeners),
//! [`l2`] (an interface's sender and listeners, who claimed what), [`https`] (the
//! control-plane mode's readiness check of the local API server), [`gateway`],
//! [`conflict`] and [`traffic`].

pub mod conflict;
pub mod gateway;
pub mod https;
pub mod l2;
pub mod tcp;
pub mod traffic;

pub use conflict::spawn_conflict_watch;
pub use gateway::{FenceProbe, GatewayMemory, GatewayTracker, spawn_gateway_watch};
pub use l2::{L2Port, NeighborBook, unspecified_like};
pub use tcp::{
    LOCAL_PROBE_INTERVAL, LOCAL_PROBE_ROTATION, LocalCheck, LocalTarget, PeerProbes, SLOW_PROBE_INTERVAL, http_probe,
    spawn_local_probes, tcp_probe,
};
pub use traffic::{TrafficSampler, spawn_traffic_sampler};
