//! The heartbeat's types: what a pair's endpoint is configured with ([`EndpointSpec`],
//! [`PathSpec`]), what it hands to the runtime ([`Received`]), its errors
//! ([`HeartbeatError`]), and the definitions of the endpoint ([`Endpoint`]) and the hub
//! ([`Hub`]) with the state they keep. The two refer to each other (an endpoint holds the
//! hub's socket leases, the hub routes datagrams to the endpoints), so both are defined
//! here, in a leaf module; their behaviour lives in [`super`] (the endpoint) and
//! `super::hub` (the hub, its sockets and receivers).

use crate::metrics::{AgentMetrics, Counter, PairMetrics};
use crate::sm;
use havip_crds::wire::{self, Keyring, SenderWindow};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A heartbeat path as the I/O layer runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathSpec {
    /// Path name (metrics label).
    pub name: String,
    /// This node's address on the path (the socket binds it).
    pub local: IpAddr,
    /// The peers' addresses on the path: node name → address.
    pub peers: Vec<(String, IpAddr)>,
}

/// What a pair's endpoint needs to know of its configuration.
#[derive(Clone, Debug)]
pub struct EndpointSpec {
    /// The pair.
    pub pair: String,
    /// This node.
    pub node: String,
    /// UDP port of every path.
    pub port: u16,
    /// The paths, in the order of the state machine's path ids.
    pub paths: Vec<PathSpec>,
    /// Accepted and signing keys.
    pub keys: Keyring,
    /// After this long with every datagram of a member refused as a replay (and none
    /// accepted), the refusal is reported to the state machine (an alarm).
    pub heartbeat_timeout: Duration,
}

/// What the receivers hand to the runtime.
#[derive(Debug)]
pub enum Received {
    /// An authentic, fresh heartbeat, mapped for the state machine.
    Advert {
        /// Path index.
        path: sm::PathId,
        /// Its content.
        advert: sm::Advert,
        /// Local clock minus the sender's clock, ms.
        skew_ms: i64,
    },
    /// A datagram that was dropped and matters to the state machine (key mismatch,
    /// clock skew, version mismatch, lasting replays …); the others are only counted.
    Rejected {
        /// Path index.
        path: sm::PathId,
        /// Why.
        reason: sm::RejectReason,
        /// The member whose address it came from.
        from: Option<sm::NodeId>,
    },
}

/// Errors of heartbeat sockets.
#[derive(Debug, thiserror::Error)]
pub enum HeartbeatError {
    /// Another process (or socket) holds the address and port.
    #[error(
        "failed to bind heartbeat socket {addr}: the UDP port is in use by another process. One havip-agent \
         serves every pair of a node (standalone: pass every pair's file to one agent with --config, or give \
         this pair another heartbeat.port); two agents never share a port"
    )]
    PortInUse {
        /// The address.
        addr: SocketAddr,
    },
    /// A socket could not be bound for another reason.
    #[error("failed to bind heartbeat socket {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Two runtimes of the same pair in one agent.
    #[error("pair {pair} is already running on heartbeat socket {addr} in this agent")]
    PairTwice {
        /// The pair.
        pair: String,
        /// The address.
        addr: SocketAddr,
    },
}

/// What the endpoint knows of one peer.
#[derive(Default)]
pub(super) struct Peer {
    pub(super) window: SenderWindow,
    /// Per path: the replay window of the member's datagrams of another major version.
    pub(super) other_major: HashMap<String, wire::ReplayWindow>,
    /// First refusal (as a replay) since the last accepted datagram.
    pub(super) refused_since: Option<Instant>,
    /// Last time a lasting refusal was reported.
    pub(super) reported_at: Option<Instant>,
    /// Last time a key mismatch or clock skew was reported.
    pub(super) rejection_reported_at: Option<Instant>,
    /// Per address of the member (one per path): its last sequence number accepted from
    /// there, and when — echoed back to it on every heartbeat ([`wire::PathEcho`]).
    pub(super) heard: HashMap<IpAddr, (u64, Instant)>,
    /// Per local address: the last of our sequence numbers the member echoed there that
    /// gave a round trip (an echo repeated while the member hears nothing newer counts once).
    pub(super) echo_sampled: HashMap<IpAddr, u64>,
}

pub(super) struct State {
    pub(super) spec: EndpointSpec,
    /// Per path (in path order): its heartbeats-sent and heartbeats-received counters.
    pub(super) counters: Vec<(Counter, Counter)>,
    /// One socket per path, in path order.
    pub(super) sockets: Vec<Arc<SocketLease>>,
    pub(super) peers: HashMap<String, Peer>,
    /// Our last heartbeats (sequence number, when sent), oldest first, at most
    /// [`super::SENT_KEPT`]: what a member's echo is matched against.
    pub(super) sent: VecDeque<(u64, Instant)>,
}

/// One pair's heartbeat sender and receiver on the hub's sockets.
pub struct Endpoint {
    pub(super) hub: Arc<Hub>,
    pub(super) metrics: PairMetrics,
    pub(super) tx: mpsc::Sender<Received>,
    pub(super) state: Mutex<State>,
}

/// Which pair's endpoint receives the datagrams naming it, per socket.
pub(super) type Routes = Arc<RwLock<HashMap<String, Route>>>;

pub(super) struct Route {
    pub(super) endpoint: Weak<Endpoint>,
    /// Leases of that endpoint on this socket (a reconfiguration briefly holds two).
    pub(super) leases: usize,
}

pub(super) struct Bound {
    pub(super) sock: Arc<std::net::UdpSocket>,
    pub(super) routes: Routes,
    pub(super) users: usize,
    pub(super) task: tokio::task::JoinHandle<()>,
}

/// The heartbeat sockets of this agent (one per local address and port), demultiplexed
/// by pair name.
pub struct Hub {
    pub(super) session: u64,
    pub(super) seq: AtomicU64,
    pub(super) metrics: Arc<AgentMetrics>,
    pub(super) bound: Mutex<HashMap<SocketAddr, Bound>>,
    /// Receivers of released sockets, aborted; the socket is closed once the task is
    /// gone, so a new bind of the address waits for it.
    pub(super) closing: Mutex<HashMap<SocketAddr, tokio::task::JoinHandle<()>>>,
    /// Heartbeats handed over by the endpoints in this turn of the runtime, sent together
    /// (bundled per destination) by the flusher once every task woken with them ran.
    pub(super) outbox: Mutex<Vec<Outgoing>>,
    /// Wakes the flusher.
    pub(super) flush_wake: Arc<tokio::sync::Notify>,
    /// The flusher task (started with the first heartbeat).
    pub(super) flusher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Member addresses whose last authentic heartbeat says that they read bundles.
    pub(super) bundle_readers: Mutex<std::collections::HashSet<IpAddr>>,
}

/// A heartbeat in the hub's outbox.
pub(super) struct Outgoing {
    /// The socket it leaves on (one per local address and port).
    pub(super) sock: Arc<std::net::UdpSocket>,
    /// That socket's address.
    pub(super) local: SocketAddr,
    /// The member address and port it goes to.
    pub(super) to: SocketAddr,
    /// The datagram (one pair's heartbeat).
    pub(super) bytes: Arc<Vec<u8>>,
    /// Its pair's heartbeats-sent counter of that path.
    pub(super) sent: Counter,
}

/// A socket held by an endpoint; released (and closed with its last user) on drop.
pub(super) struct SocketLease {
    pub(super) hub: Arc<Hub>,
    pub(super) addr: SocketAddr,
    /// The sending side: the same socket, non-blocking, without the reactor (a send
    /// never waits for readiness; a full buffer is an error that is counted).
    pub(super) sock: Arc<std::net::UdpSocket>,
    pub(super) pair: String,
    pub(super) endpoint: Weak<Endpoint>,
}
