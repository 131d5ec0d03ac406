//! havip node agent library: the pure HA state machine ([`sm`]) and its deterministic
//! simulator ([`sim`]), and the agent's I/O around it: VIP addresses through
//! rtnetlink ([`netlink`]), the drain's nftables rules ([`nft`]), announcements and ARP
//! probes ([`announce`]), the heartbeat ([`heartbeat`]), probes ([`probes`]), persisted state ([`state`]), configuration
//! ([`config`]), the runtime that ties them together ([`runtime`]), the Kubernetes mode
//! around the runtimes ([`kube`]), standalone mode with its admin socket ([`standalone`]), what gone pairs leave behind ([`leftovers`]) and metrics ([`metrics`]).

pub mod announce;
pub mod config;
pub mod heartbeat;
pub mod kube;
pub mod lease;
pub mod ledger;
pub mod leftovers;
pub mod metrics;
pub mod netlink;
pub mod nft;
pub mod probes;
pub mod runtime;
pub mod standalone;
pub mod state;
pub mod timer;
pub mod witness;

/// The pure state machine (crate `havip-sm`), re-exported so that `havip_node_agent::sm` keeps its path.
pub use havip_sm as sm;
/// The deterministic simulator of the state machine (in `havip-sm`).
pub use havip_sm::sim;
