//! Heartbeat I/O of one pair: the mapping between the state machine's [`sm::Advert`]
//! and the wire format, authentication, replay protection and drop accounting. The
//! sockets belong to the agent's [`Hub`] (one per local address and port, shared by every
//! pair); a pair's [`Endpoint`] sends through them and receives the datagrams that name
//! its pair. A malformed, forged, replayed or foreign datagram is counted in
//! `havip_agent_heartbeats_dropped{pair,path,reason}` and dropped; nothing a datagram
//! holds can crash the agent.

mod hub;
mod types;

pub(crate) use hub::random_session;
pub use types::{Endpoint, EndpointSpec, HeartbeatError, Hub, PathSpec, Received};

use crate::metrics::PairMetrics;
use crate::sm;
use havip_crds::wire::{self, Body, DecodeError, Heartbeat, Keyring, PathEcho, Session, WireGateway, WireOp, WireRole};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use types::{Outgoing, Peer, SocketLease, State};

/// Heartbeats whose timestamp is further than this from the local clock are dropped
/// as stale (and reported as clock skew). Clocks must be NTP-synchronised to well
/// within it.
pub const MAX_CLOCK_DIFFERENCE: Duration = Duration::from_secs(60);

/// A member's datagrams that fail verification (or are refused for clock skew) are
/// reported to the state machine at most this often: the machine only needs to know that
/// they keep coming (its alarms clear seconds after the last one), and a flood of them
/// must not crowd the authentic heartbeats out of the queue they share.
pub const REJECT_REPORT_EVERY: Duration = Duration::from_millis(250);

/// Our heartbeats kept to match the members' echoes against: an echo comes back within a
/// round trip plus the member's interval, a few of our intervals at most.
pub(super) const SENT_KEPT: usize = 64;

/// The round trip on the path that ends at `local`, from the member's echo naming it:
/// now − when we sent the echoed sequence number − how long the member held it. `None`
/// without such an echo, for a sequence number we no longer know, or one already counted.
fn echo_rtt(
    sent: &VecDeque<(u64, Instant)>,
    echoes: &[PathEcho],
    local: IpAddr,
    already: Option<u64>,
    now: Instant,
) -> Option<(u64, Duration)> {
    let e = echoes.iter().find(|e| e.to == local)?;
    if already == Some(e.seq) {
        return None;
    }
    let (_, at) = sent.iter().rev().find(|(s, _)| *s == e.seq)?;
    let rtt = now.checked_duration_since(*at)?.checked_sub(Duration::from_micros(u64::from(e.held_us)))?;
    Some((e.seq, rtt))
}

/// What we echo to a member: per address of it, its last sequence number we accepted from
/// there and how long ago (saturated), newest first, at most [`wire::MAX_ECHOES`].
fn echoes_for(peer: Option<&Peer>, now: Instant) -> Vec<PathEcho> {
    let Some(peer) = peer else { return Vec::new() };
    let mut heard: Vec<(&IpAddr, &(u64, Instant))> = peer.heard.iter().collect();
    heard.sort_by_key(|(_, (_, at))| std::cmp::Reverse(*at));
    heard
        .into_iter()
        .take(wire::MAX_ECHOES)
        .map(|(to, (seq, at))| PathEcho {
            to: *to,
            seq: *seq,
            held_us: u32::try_from(now.duration_since(*at).as_micros()).unwrap_or(u32::MAX),
        })
        .collect()
}

impl Peer {
    /// Whether a key-mismatch or clock-skew rejection may be reported now (and notes it).
    fn report_due(&mut self, now: Instant) -> bool {
        let due = self.rejection_reported_at.is_none_or(|t| now.duration_since(t) >= REJECT_REPORT_EVERY);
        if due {
            self.rejection_reported_at = Some(now);
        }
        due
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Endpoint {
    /// Attaches a pair to the hub: binds (or shares) a socket per path and routes the
    /// datagrams naming the pair to `tx`.
    pub async fn attach(
        hub: &Arc<Hub>,
        spec: EndpointSpec,
        metrics: PairMetrics,
        tx: mpsc::Sender<Received>,
    ) -> Result<Arc<Self>, HeartbeatError> {
        let counters = counters_of(&metrics, &spec);
        let ep = Arc::new(Endpoint {
            hub: hub.clone(),
            metrics,
            tx,
            state: Mutex::new(State {
                counters,
                spec: spec.clone(),
                sockets: Vec::new(),
                peers: HashMap::new(),
                sent: VecDeque::with_capacity(SENT_KEPT),
            }),
        });
        let sockets = acquire_all(hub, &spec, &Arc::downgrade(&ep)).await?;
        ep.lock().sockets = sockets;
        Ok(ep)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies a new configuration: the new sockets are bound before the old ones are
    /// released; what is known of the peers (their sessions and replay windows) is kept.
    /// On error nothing changes.
    pub async fn update(self: &Arc<Self>, spec: EndpointSpec) -> Result<(), HeartbeatError> {
        let weak = Arc::downgrade(self);
        let same_sockets = {
            let st = self.lock();
            st.spec.port == spec.port
                && st.spec.paths.len() == spec.paths.len()
                && st.spec.paths.iter().zip(&spec.paths).all(|(a, b)| a.local == b.local)
        };
        let fresh = if same_sockets { None } else { Some(acquire_all(&self.hub, &spec, &weak).await?) };
        let old = {
            let mut st = self.lock();
            st.peers.retain(|name, _| spec.paths.iter().any(|p| p.peers.iter().any(|(n, _)| n == name)));
            for (name, peer) in &mut st.peers {
                let addresses: Vec<IpAddr> = spec
                    .paths
                    .iter()
                    .flat_map(|p| p.peers.iter().filter(|(n, _)| n == name).map(|(_, a)| *a))
                    .collect();
                peer.heard.retain(|a, _| addresses.contains(a));
            }
            st.counters = counters_of(&self.metrics, &spec);
            st.spec = spec;
            fresh.map(|f| std::mem::replace(&mut st.sockets, f))
        };
        // Released outside the lock (a release takes the hub's lock).
        drop(old);
        Ok(())
    }

    /// Replaces the keyring (key rotation).
    pub fn set_keys(&self, keys: Keyring) {
        self.lock().spec.keys = keys;
    }

    /// Sends what the hub holds for every pair now (the runtime's last step: the agent may
    /// exit before the hub's flusher runs again).
    pub fn flush(&self) {
        self.hub.flush();
    }

    /// Sends `advert` to every peer on every path (best effort; errors are counted): hands
    /// it to the hub, which sends it at the end of this turn of the runtime, bundled with
    /// the other pairs' heartbeats to the same member address. Each peer's copy echoes that
    /// peer's session as this member last heard it, and the peer's last heartbeat heard on
    /// each path ([`PathEcho`]: the peer's round trips).
    pub fn send(&self, advert: &sm::Advert) {
        let mut guard = self.lock();
        let body = to_wire(advert);
        let seq = self.hub.next_seq();
        let timestamp_ms = unix_ms();
        let now = Instant::now();
        if guard.sent.len() == SENT_KEPT {
            guard.sent.pop_front();
        }
        guard.sent.push_back((seq, now));
        let st = &*guard;
        let key = &st.spec.keys.current;
        let mut encoded: HashMap<&str, Arc<Vec<u8>>> = HashMap::new();
        for ((p, sock), (sent, _)) in st.spec.paths.iter().zip(&st.sockets).zip(&st.counters) {
            for (peer, addr) in &p.peers {
                let bytes = encoded.entry(peer.as_str()).or_insert_with(|| {
                    let known = st.peers.get(peer.as_str());
                    let echo = known.and_then(|x| x.window.session()).unwrap_or(0);
                    Arc::new(wire::encode(
                        &Heartbeat {
                            major: wire::PROTOCOL_MAJOR,
                            minor: wire::PROTOCOL_MINOR,
                            key_id: key.id,
                            seq,
                            timestamp_ms,
                            pair: st.spec.pair.clone(),
                            sender: st.spec.node.clone(),
                            body: body.clone(),
                            session: Some(Session { id: self.hub.session(), echo }),
                            echoes: echoes_for(known, now),
                        },
                        key,
                    ))
                });
                self.hub.enqueue(Outgoing {
                    sock: sock.sock.clone(),
                    local: sock.addr,
                    to: SocketAddr::new(*addr, st.spec.port),
                    bytes: bytes.clone(),
                    sent: sent.clone(),
                });
            }
        }
    }

    /// A datagram the hub routed here (it names this pair): authenticate, check, map,
    /// and hand it to the runtime. Never blocks: a full queue drops the datagram.
    pub(super) fn deliver(&self, datagram: &[u8], local: SocketAddr, from: SocketAddr) {
        let out = self.accept(datagram, local, from.ip(), Instant::now(), unix_ms());
        if let Some(msg) = out
            && self.tx.try_send(msg).is_err()
        {
            self.metrics.io_error("heartbeat_queue_full");
        }
    }

    /// Authenticates, checks and maps one datagram. Pure apart from counters and the
    /// endpoint's replay state.
    ///
    /// Only a datagram from a member's configured address on a path of this socket is
    /// looked at: anything else — a stranger on the LAN, whatever it names — is counted
    /// (`reason="stranger"`) and dropped before any MAC is computed, and can raise no
    /// alarm. From a member's address, a datagram that fails verification is a key mismatch
    /// (or a forgery with a spoofed source): counted, and reported to the machine at most
    /// once per [`REJECT_REPORT_EVERY`] per member, so that a flood cannot fill the queue the
    /// authentic heartbeats share. An authentic datagram must name the member whose address
    /// it comes from (`reason="wrong_address"` otherwise: a member's key speaking for
    /// another member).
    fn accept(&self, datagram: &[u8], local: SocketAddr, from: IpAddr, now: Instant, now_ms: u64) -> Option<Received> {
        let mut st = self.lock();
        let on_socket = |p: &PathSpec| p.local == local.ip();
        let member = st
            .spec
            .paths
            .iter()
            .enumerate()
            .filter(|(_, p)| on_socket(p))
            .find_map(|(pi, p)| p.peers.iter().find(|(_, a)| *a == from).map(|(n, _)| (pi, n.clone())));
        let Some((pi, peer_name)) = member else {
            let label = st.spec.paths.iter().find(|p| on_socket(p)).map_or("", |p| p.name.as_str());
            self.metrics.dropped(label, "stranger");
            return None;
        };
        let path = sm::PathId(pi as u8);
        let path_name = st.spec.paths[pi].name.clone();
        let from_node = sm::NodeId::new(peer_name.clone()).ok();
        let hb = match wire::decode(datagram, &st.spec.keys) {
            Ok(hb) => hb,
            Err(e) => {
                self.metrics.dropped(&path_name, e.reason());
                return match e {
                    DecodeError::BadMac | DecodeError::UnknownKey { .. } => {
                        let peer = st.peers.entry(peer_name).or_default();
                        peer.report_due(now).then_some(Received::Rejected {
                            path,
                            reason: sm::RejectReason::KeyMismatch,
                            from: from_node,
                        })
                    }
                    // Authentic, from a member, in another major version: the member is alive
                    // (it is heard) but nothing else of its heartbeat can be read — only the
                    // header, which every major version lays out alike: its sequence number
                    // and timestamp go through a replay window of their own, so a recorded
                    // datagram of an old version cannot keep a dead member "heard". The state
                    // machine raises VersionMismatch and takes no automatic action against it.
                    DecodeError::UnsupportedMajor { major, sender, seq, timestamp_ms } if sender == peer_name => {
                        let max_age = MAX_CLOCK_DIFFERENCE.as_millis() as u64;
                        let peer = st.peers.entry(peer_name).or_default();
                        let window = peer.other_major.entry(path_name.clone()).or_default();
                        if let Err(e) = window.check(seq, timestamp_ms, now_ms, max_age) {
                            self.metrics.dropped(&path_name, e.reason());
                            return None;
                        }
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
        if hb.sender == st.spec.node {
            self.metrics.dropped(&path_name, "own");
            return None;
        }
        if hb.sender != peer_name {
            self.metrics
                .dropped(&path_name, if is_member(&st.spec, &hb.sender) { "wrong_address" } else { "unknown_sender" });
            return None;
        }
        // A member that went back to an earlier release confirms its new session only once
        // it has read our heartbeats (it echoes our session id), and it cannot read a bundle:
        // its first authentic heartbeat stops our bundles to it, even one its new session's
        // replay check still refuses. (A replayed old heartbeat can only do the same: single
        // datagrams, which every release reads.) Bundles resume from an accepted heartbeat.
        if hb.minor < wire::BUNDLE_MINOR {
            self.hub.note_minor(from, hb.minor);
        }
        let timeout = st.spec.heartbeat_timeout;
        let own_session = self.hub.session();
        let peer = st.peers.entry(hb.sender.clone()).or_default();
        let max_age = MAX_CLOCK_DIFFERENCE.as_millis() as u64;
        if let Err(e) = peer.window.check(&path_name, hb.session, own_session, hb.seq, hb.timestamp_ms, now_ms, max_age)
        {
            self.metrics.dropped(&path_name, e.reason());
            if !e.is_replay() {
                return peer.report_due(now).then_some(Received::Rejected {
                    path,
                    reason: sm::RejectReason::ClockSkew,
                    from: from_node,
                });
            }
            // A lone replay is only counted. Every datagram of a member refused for longer
            // than a heartbeat timeout is a member we cannot hear (e.g. it restarted and
            // cannot prove it yet): reported, at most once per timeout.
            let since = *peer.refused_since.get_or_insert(now);
            let lasting = now.duration_since(since) > timeout;
            let due = peer.reported_at.is_none_or(|t| now.duration_since(t) > timeout);
            if lasting && due {
                peer.reported_at = Some(now);
                tracing::warn!(
                    pair = %st.spec.pair, peer = %hb.sender, path = %path_name, reason = e.reason(),
                    "every heartbeat of this member is refused as a replay"
                );
                return Some(Received::Rejected { path, reason: sm::RejectReason::Replay, from: from_node });
            }
            return None;
        }
        peer.refused_since = None;
        let Some(advert) = from_wire(&hb) else {
            self.metrics.dropped(&path_name, "malformed");
            return None;
        };
        if let Some((_, received)) = st.counters.get(pi) {
            received.inc();
        }
        // Authentic and fresh: what it says of its sender's protocol (bundles) is true.
        self.hub.note_minor(from, hb.minor);
        let st = &mut *st;
        if let Some(peer) = st.peers.get_mut(&hb.sender) {
            peer.heard.insert(from, (hb.seq, now));
            let already = peer.echo_sampled.get(&local.ip()).copied();
            if let Some((seq, rtt)) = echo_rtt(&st.sent, &hb.echoes, local.ip(), already, now) {
                peer.echo_sampled.insert(local.ip(), seq);
                self.metrics.rtt(&path_name, rtt);
            }
        }
        Some(Received::Advert { path, advert, skew_ms: now_ms as i64 - hb.timestamp_ms as i64 })
    }
}

/// Per path of `spec`: the pair's heartbeats-sent and -received counters.
fn counters_of(metrics: &PairMetrics, spec: &EndpointSpec) -> Vec<(crate::metrics::Counter, crate::metrics::Counter)> {
    spec.paths.iter().map(|p| (metrics.sent_counter(&p.name), metrics.received_counter(&p.name))).collect()
}

fn is_member(spec: &EndpointSpec, node: &str) -> bool {
    spec.paths.iter().any(|p| p.peers.iter().any(|(n, _)| n == node))
}

/// Acquires the socket of every path (sharing one among paths on the same address).
async fn acquire_all(
    hub: &Arc<Hub>,
    spec: &EndpointSpec,
    weak: &Weak<Endpoint>,
) -> Result<Vec<Arc<SocketLease>>, HeartbeatError> {
    let mut out: Vec<Arc<SocketLease>> = Vec::new();
    for p in &spec.paths {
        let addr = SocketAddr::new(p.local, spec.port);
        let lease = match out.iter().find(|l| l.addr == addr) {
            Some(l) => l.clone(),
            None => Arc::new(hub.acquire(addr, &spec.pair, weak).await?),
        };
        out.push(lease);
    }
    Ok(out)
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
        draining: a.draining,
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
        interval_ms: a.interval_ms,
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
        draining: b.draining,
        op,
        interval_ms: b.interval_ms,
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
        draining: false,
        op: None,
        interval_ms: 0,
    })
}

/// Clock-skew bookkeeping: each peer's skew as its accepted heartbeats show it, smoothed
/// (read by the doctor's `ClockSkewed` check).
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
    /// The smoothed skew of every peer heard (ms; positive: its clock is behind this
    /// node's, or its heartbeats were long on the way).
    pub fn by_peer(&self) -> std::collections::BTreeMap<String, i64> {
        let m = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        m.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

#[cfg(test)]
mod tests;
