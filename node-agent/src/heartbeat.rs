//! Heartbeat I/O: one UDP socket per path, the mapping between the state machine's
//! [`sm::Advert`] and the wire format, authentication, replay protection and drop
//! accounting. A malformed, forged, replayed or foreign datagram is counted in
//! `havip_agent_heartbeats_dropped{path,reason}` and dropped; nothing a datagram
//! holds can crash the agent.

use crate::metrics::{AgentMetrics, PathLabel};
use crate::sm;
use havip_crds::wire::{self, Body, DecodeError, Heartbeat, Keyring, ReplayWindow, WireGateway, WireOp, WireRole};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

/// Heartbeats whose timestamp is further than this from the local clock are dropped
/// as stale (and reported as clock skew). Clocks must be NTP-synchronised to well
/// within it.
pub const MAX_CLOCK_DIFFERENCE: Duration = Duration::from_secs(60);

/// A heartbeat path as the I/O layer runs it.
#[derive(Clone, Debug)]
pub struct PathSpec {
    /// Path name (metrics label).
    pub name: String,
    /// This node's address on the path (the socket binds it).
    pub local: IpAddr,
    /// The peers' addresses on the path: node name → address.
    pub peers: Vec<(String, IpAddr)>,
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
    /// clock skew, version mismatch …); the others are only counted.
    Rejected {
        /// Path index.
        path: sm::PathId,
        /// Why.
        reason: sm::RejectReason,
    },
}

/// Errors of heartbeat sockets.
#[derive(Debug, thiserror::Error)]
pub enum HeartbeatError {
    /// A socket could not be bound.
    #[error("failed to bind heartbeat socket {addr} (path {path}): {source}")]
    Bind {
        /// Path name.
        path: String,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The heartbeat sender and receivers of one pair member.
pub struct HeartbeatIo {
    pair: String,
    node: String,
    port: u16,
    keys: Arc<RwLock<Keyring>>,
    paths: Vec<PathSpec>,
    sockets: Vec<Arc<UdpSocket>>,
    seq: AtomicU64,
    metrics: Arc<AgentMetrics>,
}

/// Binds a UDP socket with SO_REUSEADDR and SO_REUSEPORT, so that a reconfiguration can
/// bind the new sockets before the old ones are gone.
fn bind_reuse(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    UdpSocket::from_std(sock.into())
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl HeartbeatIo {
    /// Binds one socket per path on `port`.
    pub async fn bind(
        pair: &str,
        node: &str,
        port: u16,
        keys: Arc<RwLock<Keyring>>,
        paths: Vec<PathSpec>,
        metrics: Arc<AgentMetrics>,
    ) -> Result<Self, HeartbeatError> {
        let mut sockets = Vec::new();
        for p in &paths {
            let addr = SocketAddr::new(p.local, port);
            let sock =
                bind_reuse(addr).map_err(|source| HeartbeatError::Bind { path: p.name.clone(), addr, source })?;
            sockets.push(Arc::new(sock));
        }
        // Sequence numbers start at the start-up time in µs, so a restarted agent
        // continues above its previous sequence without persisting anything.
        let seq0 = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(1);
        Ok(Self {
            pair: pair.to_owned(),
            node: node.to_owned(),
            port,
            keys,
            paths,
            sockets,
            seq: AtomicU64::new(seq0),
            metrics,
        })
    }

    /// Sends `advert` to every peer on every path (best effort; errors are counted).
    pub async fn send(&self, advert: &sm::Advert) {
        let key = self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner).current.clone();
        let hb = Heartbeat {
            major: wire::PROTOCOL_MAJOR,
            minor: wire::PROTOCOL_MINOR,
            key_id: key.id,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            timestamp_ms: unix_ms(),
            pair: self.pair.clone(),
            sender: self.node.clone(),
            body: to_wire(advert),
        };
        let bytes = wire::encode(&hb, &key);
        for (p, sock) in self.paths.iter().zip(&self.sockets) {
            for (_, peer) in &p.peers {
                match sock.send_to(&bytes, SocketAddr::new(*peer, self.port)).await {
                    Ok(_) => {
                        self.metrics.heartbeats_sent.get_or_create(&PathLabel { path: p.name.clone() }).inc();
                    }
                    Err(e) => {
                        self.metrics.io_error("heartbeat_send");
                        tracing::debug!(path = %p.name, peer = %peer, error = %e, "heartbeat send failed");
                    }
                };
            }
        }
    }

    /// Starts one receiver task per path, feeding `tx`.
    pub fn spawn_receivers(self: &Arc<Self>, tx: mpsc::Sender<Received>) -> Vec<tokio::task::JoinHandle<()>> {
        let members: Vec<String> = self.paths.iter().flat_map(|p| p.peers.iter().map(|(n, _)| n.clone())).collect();
        let mut tasks = Vec::new();
        for (i, sock) in self.sockets.iter().enumerate() {
            let me = self.clone();
            let sock = sock.clone();
            let tx = tx.clone();
            let members = members.clone();
            tasks.push(tokio::spawn(async move {
                let path = sm::PathId(i as u8);
                let name = me.paths[i].name.clone();
                let mut windows: HashMap<String, ReplayWindow> = HashMap::new();
                let mut buf = vec![0u8; wire::MAX_DATAGRAM + 1];
                loop {
                    let (n, _from) = match sock.recv_from(&mut buf).await {
                        Ok(x) => x,
                        Err(e) => {
                            me.metrics.io_error("heartbeat_recv");
                            tracing::debug!(path = %name, error = %e, "heartbeat receive failed");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let out = me.accept(&buf[..n], path, &name, &members, &mut windows);
                    if let Some(msg) = out
                        && tx.send(msg).await.is_err()
                    {
                        return;
                    }
                }
            }));
        }
        tasks
    }

    /// Authenticates, checks and maps one datagram. Pure apart from counters.
    fn accept(
        &self,
        datagram: &[u8],
        path: sm::PathId,
        path_name: &str,
        members: &[String],
        windows: &mut HashMap<String, ReplayWindow>,
    ) -> Option<Received> {
        let keys = self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let hb = match wire::decode(datagram, &keys) {
            Ok(hb) => hb,
            Err(e) => {
                self.metrics.dropped(path_name, e.reason());
                return match e {
                    DecodeError::BadMac | DecodeError::UnknownKey { .. } => {
                        Some(Received::Rejected { path, reason: sm::RejectReason::KeyMismatch })
                    }
                    // Authentic, from a member, in another major version: the member is alive
                    // (it is heard) but nothing else of its heartbeat can be read. The state
                    // machine raises VersionMismatch and takes no automatic action against it.
                    DecodeError::UnsupportedMajor { major, sender } if members.contains(&sender) => {
                        version_mismatch_advert(&sender, major).map(|advert| Received::Advert {
                            path,
                            advert,
                            skew_ms: 0,
                        })
                    }
                    _ => None,
                };
            }
        };
        if hb.pair != self.pair {
            self.metrics.dropped(path_name, "foreign_pair");
            return None;
        }
        if hb.sender == self.node {
            self.metrics.dropped(path_name, "own");
            return None;
        }
        if !members.contains(&hb.sender) {
            self.metrics.dropped(path_name, "unknown_sender");
            return Some(Received::Rejected { path, reason: sm::RejectReason::UnknownSender });
        }
        let now = unix_ms();
        let window = windows.entry(hb.sender.clone()).or_default();
        if let Err(e) = window.check(hb.seq, hb.timestamp_ms, now, MAX_CLOCK_DIFFERENCE.as_millis() as u64) {
            self.metrics.dropped(path_name, e.reason());
            return match e {
                wire::ReplayError::Stale { .. } => {
                    Some(Received::Rejected { path, reason: sm::RejectReason::ClockSkew })
                }
                wire::ReplayError::Replayed { .. } => None,
            };
        }
        let Some(advert) = from_wire(&hb) else {
            self.metrics.dropped(path_name, "malformed");
            return None;
        };
        self.metrics.heartbeats_received.get_or_create(&PathLabel { path: path_name.to_owned() }).inc();
        Some(Received::Advert { path, advert, skew_ms: now as i64 - hb.timestamp_ms as i64 })
    }

    /// Replaces the keyring (key rotation).
    pub fn set_keys(&self, keys: Keyring) {
        *self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner) = keys;
    }
}

fn role_to_wire(r: sm::Role) -> WireRole {
    match r {
        sm::Role::Init => WireRole::Init,
        sm::Role::Active => WireRole::Active,
        sm::Role::Standby => WireRole::Standby,
        sm::Role::Demoting => WireRole::Demoting,
        sm::Role::Maintenance => WireRole::Maintenance,
        sm::Role::Fenced => WireRole::Fenced,
        sm::Role::Unpaired => WireRole::Unpaired,
    }
}

fn role_from_wire(r: WireRole) -> sm::Role {
    match r {
        WireRole::Init => sm::Role::Init,
        WireRole::Active => sm::Role::Active,
        WireRole::Standby => sm::Role::Standby,
        WireRole::Demoting => sm::Role::Demoting,
        WireRole::Maintenance => sm::Role::Maintenance,
        WireRole::Fenced => sm::Role::Fenced,
        WireRole::Unpaired => sm::Role::Unpaired,
    }
}

/// The wire body of an advert.
pub fn to_wire(a: &sm::Advert) -> Body {
    Body {
        role: role_to_wire(a.role),
        epoch: a.epoch,
        priority: a.priority,
        holds_vips: a.holds_vips,
        ready_all: a.ready_all,
        maintenance: a.maintenance,
        carrier_ok: a.carrier_ok,
        suspended: a.suspended,
        failback_paused: a.failback_paused,
        gateway: match a.gateway {
            None => WireGateway::Unknown,
            Some(true) => WireGateway::Reachable,
            Some(false) => WireGateway::Unreachable,
        },
        config_revision: a.config_revision,
        op: a.op.as_ref().map(|op| match &op.kind {
            sm::OpKind::Prepare { to } => WireOp::Prepare { id: op.id, to: to.as_str().to_owned() },
            sm::OpKind::PrepareAck => WireOp::PrepareAck { id: op.id },
            sm::OpKind::Refuse { reason } => WireOp::Refuse { id: op.id, reason: reason.code() },
            sm::OpKind::Commit { to, epoch } => WireOp::Commit { id: op.id, to: to.as_str().to_owned(), epoch: *epoch },
            sm::OpKind::Confirm => WireOp::Confirm { id: op.id },
            sm::OpKind::Abort => WireOp::Abort { id: op.id },
        }),
    }
}

/// The advert carried by an authentic heartbeat (`None` when a name is invalid).
pub fn from_wire(hb: &Heartbeat) -> Option<sm::Advert> {
    let b = &hb.body;
    let op = match &b.op {
        None => None,
        Some(op) => Some(match op {
            WireOp::Prepare { id, to } => {
                sm::OpMsg { id: *id, kind: sm::OpKind::Prepare { to: sm::NodeId::new(to.clone()).ok()? } }
            }
            WireOp::PrepareAck { id } => sm::OpMsg { id: *id, kind: sm::OpKind::PrepareAck },
            WireOp::Refuse { id, reason } => {
                sm::OpMsg { id: *id, kind: sm::OpKind::Refuse { reason: sm::RefuseReason::from_code(*reason) } }
            }
            WireOp::Commit { id, to, epoch } => {
                sm::OpMsg { id: *id, kind: sm::OpKind::Commit { to: sm::NodeId::new(to.clone()).ok()?, epoch: *epoch } }
            }
            WireOp::Confirm { id } => sm::OpMsg { id: *id, kind: sm::OpKind::Confirm },
            WireOp::Abort { id } => sm::OpMsg { id: *id, kind: sm::OpKind::Abort },
        }),
    };
    Some(sm::Advert {
        sender: sm::NodeId::new(hb.sender.clone()).ok()?,
        role: role_from_wire(b.role),
        epoch: b.epoch,
        priority: b.priority,
        holds_vips: b.holds_vips,
        config_revision: b.config_revision,
        protocol_major: u16::from(hb.major),
        protocol_minor: u16::from(hb.minor),
        ready_all: b.ready_all,
        maintenance: b.maintenance,
        carrier_ok: b.carrier_ok,
        gateway: match b.gateway {
            WireGateway::Unknown => None,
            WireGateway::Reachable => Some(true),
            WireGateway::Unreachable => Some(false),
        },
        suspended: b.suspended,
        failback_paused: b.failback_paused,
        op,
    })
}

/// What is known of a member that speaks another protocol major version.
fn version_mismatch_advert(sender: &str, major: u8) -> Option<sm::Advert> {
    Some(sm::Advert {
        sender: sm::NodeId::new(sender.to_owned()).ok()?,
        role: sm::Role::Init,
        epoch: 0,
        priority: 0,
        holds_vips: false,
        config_revision: 0,
        protocol_major: u16::from(major),
        protocol_minor: 0,
        ready_all: false,
        maintenance: false,
        carrier_ok: false,
        gateway: None,
        suspended: false,
        failback_paused: false,
        op: None,
    })
}

/// Shared mutable keyring.
pub type SharedKeys = Arc<RwLock<Keyring>>;

/// Clock-skew bookkeeping for status: the largest |skew| seen per peer, decaying.
#[derive(Default)]
pub struct SkewTracker {
    inner: Mutex<HashMap<String, i64>>,
}

impl SkewTracker {
    /// Records a skew sample for `peer`.
    pub fn record(&self, peer: &str, skew_ms: i64) {
        let mut m = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let e = m.entry(peer.to_owned()).or_insert(0);
        // Exponential smoothing keeps one delayed packet from dominating.
        *e = (*e * 7 + skew_ms) / 8;
    }
    /// The largest absolute smoothed skew.
    pub fn max_abs(&self) -> i64 {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(|v| v.abs())
            .max()
            .unwrap_or(0)
    }
}
