//! The heartbeat wire format, shared by the agent and the tests.
//!
//! One UDP datagram per heartbeat per path. Layout (all integers big-endian):
//!
//! ```text
//! offset size  field
//! 0      2     magic "HV"
//! 2      1     protocol major version
//! 3      1     protocol minor version
//! 4      4     key id (which HMAC key signed it; two are accepted during a rotation)
//! 8      8     sequence number (per sender; starts at the sender's start-up time in µs)
//! 16     8     sender wall-clock timestamp, ms since the Unix epoch
//! 24     1+n   pair name (length-prefixed, ≤ 63 bytes)
//! ..     1+n   sender node name (length-prefixed, ≤ 63 bytes)
//! ..     2     body length
//! ..     n     body (see [`Body`]; a newer minor version may append fields)
//! ..     32    HMAC-SHA256 over every byte before it
//! ```
//!
//! Since minor version 1 the body ends with the sender's [`Session`]: 8 bytes of session
//! id (random per agent start) and 8 bytes of echo (the receiver's session id as the
//! sender last heard it, 0 if never). A receiver of minor 0 ignores them.
//!
//! **Demultiplexing.** One agent serves every pair of its node on one socket per (local
//! address, port). [`peek_pair`] reads the pair name from the header *before* the MAC
//! check — it is authenticated later, with that pair's keys — so that a datagram is
//! verified with the keys of the pair it names and never charged to another pair.
//!
//! Decoding checks, in order: size bounds, magic, that the key id is known, the MAC
//! (constant time), and only then the version and the fields — so nothing an attacker
//! without the key sends is ever interpreted. A different **major** version is
//! reported ([`DecodeError::UnsupportedMajor`], authenticated) so that the agent can
//! raise a version-mismatch alarm; a newer **minor** version is accepted and its extra
//! body bytes are ignored.
//!
//! Replay protection is the receiver's [`SenderWindow`]: per sender, the sender's current
//! session, and per path a [`ReplayWindow`] over sequence numbers (the same message goes
//! out on every path), plus a freshness bound on the timestamp. A restarted sender starts
//! a new session; the receiver switches to it as soon as the new session proves that it
//! was created after the receiver's own start (it echoes the receiver's session id), so
//! a sender whose clock stepped back is heard again at once, while replays of an older
//! session are refused for good.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The protocol major version this build speaks. Members with another major do not
/// take over from each other automatically.
pub const PROTOCOL_MAJOR: u8 = 1;
/// The protocol minor version this build writes (1: the body ends with a [`Session`]).
pub const PROTOCOL_MINOR: u8 = 1;
/// The first minor version that carries a [`Session`].
pub const SESSION_MINOR: u8 = 1;
/// Datagrams larger than this are dropped unread.
pub const MAX_DATAGRAM: usize = 512;
/// Bytes of the HMAC-SHA256 trailer.
pub const MAC_LEN: usize = 32;
/// Longest pair or node name on the wire.
pub const MAX_NAME: usize = 63;
const MAGIC: [u8; 2] = *b"HV";
const FIXED_HEADER: usize = 24;

type HmacSha256 = Hmac<Sha256>;

/// A member's role as carried in heartbeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WireRole {
    /// Starting up, listening for peers.
    Init = 0,
    /// Holds the VIPs.
    Active = 1,
    /// Ready to take over.
    Standby = 2,
    /// Handing the VIPs over.
    Demoting = 3,
    /// Out of the election.
    Maintenance = 4,
    /// Cut off; takes no VIPs.
    Fenced = 5,
    /// Belongs to no pair.
    Unpaired = 6,
}

impl WireRole {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Init,
            1 => Self::Active,
            2 => Self::Standby,
            3 => Self::Demoting,
            4 => Self::Maintenance,
            5 => Self::Fenced,
            6 => Self::Unpaired,
            _ => return None,
        })
    }
}

/// Gateway reachability as carried in heartbeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireGateway {
    /// No fence target ever answered: the check is off.
    Unknown,
    /// A fence target answers.
    Reachable,
    /// Fence targets answered before and do not now.
    Unreachable,
}

/// A step of a planned handover, carried in the heartbeat of the member that sends it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WireOp {
    /// Active → target: prepare to take the VIPs.
    Prepare {
        /// Operation id.
        id: u64,
        /// The member that should take them.
        to: String,
    },
    /// Target → active: ready.
    PrepareAck {
        /// Operation id.
        id: u64,
    },
    /// Target → active: not ready, with a reason code.
    Refuse {
        /// Operation id.
        id: u64,
        /// Why (a small code the state machine defines).
        reason: u8,
    },
    /// Active → target: take the VIPs under `epoch`.
    Commit {
        /// Operation id.
        id: u64,
        /// The member that should take them.
        to: String,
        /// The epoch the target takes them under.
        epoch: u64,
    },
    /// Target → active: took them.
    Confirm {
        /// Operation id.
        id: u64,
    },
    /// Active → target: the handover is off; drop the VIPs if you added them.
    Abort {
        /// Operation id.
        id: u64,
    },
}

/// The content of a heartbeat (what the state machine needs of its peers).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Body {
    /// The sender's role.
    pub role: WireRole,
    /// The sender's epoch.
    pub epoch: u64,
    /// The sender's priority (1..254).
    pub priority: u8,
    /// The sender holds the VIPs in its kernel.
    pub holds_vips: bool,
    /// The sender could serve every VIP now.
    pub ready_all: bool,
    /// The sender is in maintenance.
    pub maintenance: bool,
    /// The sender's data and VIP links have carrier.
    pub carrier_ok: bool,
    /// The sender's flap suspension is on.
    pub suspended: bool,
    /// The sender's automatic failback is paused.
    pub failback_paused: bool,
    /// The sender gave the VIPs up in a planned move and still keeps them, silently, for
    /// connections established on it: the holder may forward their segments to it (flag
    /// bit 8; a receiver of an older build ignores it).
    pub draining: bool,
    /// The sender's gateway reachability.
    pub gateway: WireGateway,
    /// The configuration revision the sender applied.
    pub config_revision: u64,
    /// A planned-handover step, if one is in progress.
    pub op: Option<WireOp>,
}

/// A decoded, authenticated heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Heartbeat {
    /// Sender's protocol major version.
    pub major: u8,
    /// Sender's protocol minor version.
    pub minor: u8,
    /// The key that signed it.
    pub key_id: u32,
    /// Per-sender sequence number.
    pub seq: u64,
    /// Sender's wall clock, ms since the Unix epoch.
    pub timestamp_ms: u64,
    /// The pair.
    pub pair: String,
    /// The sending node.
    pub sender: String,
    /// The content.
    pub body: Body,
    /// The sender's session (minor ≥ 1; `None` from an older sender).
    pub session: Option<Session>,
}

/// A sender's session, carried at the end of the body since minor version 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Session {
    /// Random, nonzero, new at every agent start.
    pub id: u64,
    /// The receiver's session id as the sender last heard it (0: not heard yet). It proves
    /// to the receiver that this session began after the receiver's own start.
    pub echo: u64,
}

/// Why a datagram was dropped. [`DecodeError::reason`] gives a bounded metric label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than the smallest possible heartbeat.
    #[error("failed to decode heartbeat: truncated ({len} bytes)")]
    Truncated {
        /// Datagram length.
        len: usize,
    },
    /// Larger than [`MAX_DATAGRAM`].
    #[error("failed to decode heartbeat: oversized ({len} bytes)")]
    Oversized {
        /// Datagram length.
        len: usize,
    },
    /// Not a havip heartbeat.
    #[error("failed to decode heartbeat: bad magic")]
    BadMagic,
    /// Signed with a key id this member does not hold.
    #[error("failed to authenticate heartbeat: unknown key id {key_id}")]
    UnknownKey {
        /// The key id in the datagram.
        key_id: u32,
    },
    /// The MAC does not match (forged, corrupted, or a different key under the same id).
    #[error("failed to authenticate heartbeat: bad MAC")]
    BadMac,
    /// Authentic, but of a protocol major version this build does not speak. The fixed
    /// header (sequence number, timestamp, names) has the same layout in every major
    /// version, so the receiver can still refuse replays of such datagrams.
    #[error("heartbeat from {sender} speaks protocol {major}.x, this agent speaks {PROTOCOL_MAJOR}.x")]
    UnsupportedMajor {
        /// Their major.
        major: u8,
        /// Who sent it (authenticated).
        sender: String,
        /// Its sequence number (authenticated).
        seq: u64,
        /// Its timestamp, ms since the Unix epoch (authenticated).
        timestamp_ms: u64,
    },
    /// Authentic but structurally invalid.
    #[error("failed to decode heartbeat: malformed {field}")]
    Malformed {
        /// The field that did not parse.
        field: &'static str,
    },
}

impl DecodeError {
    /// A bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "truncated",
            Self::Oversized { .. } => "oversized",
            Self::BadMagic => "bad_magic",
            Self::UnknownKey { .. } => "unknown_key",
            Self::BadMac => "bad_mac",
            Self::UnsupportedMajor { .. } => "unsupported_major",
            Self::Malformed { .. } => "malformed",
        }
    }
}

/// An HMAC key with its id.
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    /// Key id carried on the wire.
    pub id: u32,
    /// Secret bytes (at least 16 recommended; the operator generates 32).
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("id", &self.id).field("secret", &"<redacted>").finish()
    }
}

/// The keys a member accepts: the current one (also used to sign) and, during a
/// rotation, the previous one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keyring {
    /// Signs outgoing heartbeats; accepted on input.
    pub current: Key,
    /// Accepted on input until the rotation completes.
    pub previous: Option<Key>,
}

impl Keyring {
    pub(crate) fn find(&self, id: u32) -> Option<&Key> {
        std::iter::once(&self.current).chain(self.previous.as_ref()).find(|k| k.id == id)
    }
}

pub(crate) fn put_name(out: &mut Vec<u8>, name: &str) {
    let bytes = name.as_bytes();
    let len = bytes.len().min(MAX_NAME);
    out.push(len as u8);
    out.extend_from_slice(&bytes[..len]);
}

/// Encodes and signs a heartbeat with `key`. Names longer than [`MAX_NAME`] bytes are
/// truncated (the CRD limits them to 63).
pub fn encode(hb: &Heartbeat, key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(&MAGIC);
    out.push(hb.major);
    out.push(hb.minor);
    out.extend_from_slice(&key.id.to_be_bytes());
    out.extend_from_slice(&hb.seq.to_be_bytes());
    out.extend_from_slice(&hb.timestamp_ms.to_be_bytes());
    put_name(&mut out, &hb.pair);
    put_name(&mut out, &hb.sender);
    let mut body = encode_body(&hb.body);
    if let Some(sess) = hb.session.filter(|_| hb.minor >= SESSION_MINOR) {
        body.extend_from_slice(&sess.id.to_be_bytes());
        body.extend_from_slice(&sess.echo.to_be_bytes());
    }
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(&body);
    let mac = mac_of(&key.secret, &out);
    out.extend_from_slice(&mac);
    out
}

fn encode_body(b: &Body) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(b.role as u8);
    out.extend_from_slice(&b.epoch.to_be_bytes());
    out.push(b.priority);
    let mut flags: u16 = 0;
    for (bit, on) in [
        (0, b.holds_vips),
        (1, b.ready_all),
        (2, b.maintenance),
        (3, b.carrier_ok),
        (4, b.suspended),
        (5, b.failback_paused),
        (8, b.draining),
    ] {
        if on {
            flags |= 1 << bit;
        }
    }
    flags |= match b.gateway {
        WireGateway::Unknown => 0,
        WireGateway::Reachable => 1,
        WireGateway::Unreachable => 2,
    } << 6;
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&b.config_revision.to_be_bytes());
    match &b.op {
        None => out.push(0),
        Some(WireOp::Prepare { id, to }) => {
            out.push(1);
            out.extend_from_slice(&id.to_be_bytes());
            put_name(&mut out, to);
        }
        Some(WireOp::PrepareAck { id }) => {
            out.push(2);
            out.extend_from_slice(&id.to_be_bytes());
        }
        Some(WireOp::Refuse { id, reason }) => {
            out.push(3);
            out.extend_from_slice(&id.to_be_bytes());
            out.push(*reason);
        }
        Some(WireOp::Commit { id, to, epoch }) => {
            out.push(4);
            out.extend_from_slice(&id.to_be_bytes());
            put_name(&mut out, to);
            out.extend_from_slice(&epoch.to_be_bytes());
        }
        Some(WireOp::Confirm { id }) => {
            out.push(5);
            out.extend_from_slice(&id.to_be_bytes());
        }
        Some(WireOp::Abort { id }) => {
            out.push(6);
            out.extend_from_slice(&id.to_be_bytes());
        }
    }
    out
}

pub(crate) fn mac_of(secret: &[u8], data: &[u8]) -> [u8; MAC_LEN] {
    // HMAC accepts keys of any length, so new_from_slice cannot fail.
    let mut mac = match HmacSha256::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => return [0; MAC_LEN],
    };
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// A cursor over untrusted bytes that never panics.
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Malformed { field })?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Malformed { field })?;
        self.pos = end;
        Ok(s)
    }
    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, field)?[0])
    }
    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        let s = self.take(2, field)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let s = self.take(4, field)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let s = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_be_bytes(a))
    }
    pub(crate) fn name(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let len = self.u8(field)? as usize;
        if len > MAX_NAME {
            return Err(DecodeError::Malformed { field });
        }
        let s = self.take(len, field)?;
        String::from_utf8(s.to_vec()).map_err(|_| DecodeError::Malformed { field })
    }
}

/// Authenticates and decodes one datagram. Never panics, whatever the input.
pub fn decode(buf: &[u8], keys: &Keyring) -> Result<Heartbeat, DecodeError> {
    if buf.len() > MAX_DATAGRAM {
        return Err(DecodeError::Oversized { len: buf.len() });
    }
    // Fixed header + two empty names + body length + MAC.
    if buf.len() < FIXED_HEADER + 2 + 2 + MAC_LEN {
        return Err(DecodeError::Truncated { len: buf.len() });
    }
    if buf[0..2] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let key_id = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let key = keys.find(key_id).ok_or(DecodeError::UnknownKey { key_id })?;
    let (signed, mac) = buf.split_at(buf.len() - MAC_LEN);
    let mut verifier = HmacSha256::new_from_slice(&key.secret).map_err(|_| DecodeError::BadMac)?;
    verifier.update(signed);
    verifier.verify_slice(mac).map_err(|_| DecodeError::BadMac)?;

    // Authentic from here on.
    let mut r = Reader { buf: signed, pos: 2 };
    let major = r.u8("major")?;
    let minor = r.u8("minor")?;
    let _key_id = r.u32("key id")?;
    let seq = r.u64("seq")?;
    let timestamp_ms = r.u64("timestamp")?;
    let pair = r.name("pair")?;
    let sender = r.name("sender")?;
    if major != PROTOCOL_MAJOR {
        return Err(DecodeError::UnsupportedMajor { major, sender, seq, timestamp_ms });
    }
    let body_len = r.u16("body length")? as usize;
    let body_bytes = r.take(body_len, "body")?;
    if r.pos != signed.len() {
        return Err(DecodeError::Malformed { field: "trailing bytes" });
    }
    let (body, session) = decode_body(body_bytes, minor)?;
    Ok(Heartbeat { major, minor, key_id, seq, timestamp_ms, pair, sender, body, session })
}

/// The pair a datagram names, read from its header **without authenticating it**: only
/// to pick the keys it must then be verified with ([`decode`]). Checks size bounds and
/// the magic first, like [`decode`].
pub fn peek_pair(buf: &[u8]) -> Result<&str, DecodeError> {
    if buf.len() > MAX_DATAGRAM {
        return Err(DecodeError::Oversized { len: buf.len() });
    }
    if buf.len() < FIXED_HEADER + 2 + 2 + MAC_LEN {
        return Err(DecodeError::Truncated { len: buf.len() });
    }
    if buf[0..2] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let signed = &buf[..buf.len() - MAC_LEN];
    let len = usize::from(signed[FIXED_HEADER]);
    if len > MAX_NAME {
        return Err(DecodeError::Malformed { field: "pair" });
    }
    let name = signed.get(FIXED_HEADER + 1..FIXED_HEADER + 1 + len).ok_or(DecodeError::Malformed { field: "pair" })?;
    std::str::from_utf8(name).map_err(|_| DecodeError::Malformed { field: "pair" })
}

fn decode_body(buf: &[u8], minor: u8) -> Result<(Body, Option<Session>), DecodeError> {
    let mut r = Reader { buf, pos: 0 };
    let role = WireRole::from_u8(r.u8("role")?).ok_or(DecodeError::Malformed { field: "role" })?;
    let epoch = r.u64("epoch")?;
    let priority = r.u8("priority")?;
    let flags = r.u16("flags")?;
    let bit = |n: u16| flags & (1 << n) != 0;
    let gateway = match (flags >> 6) & 0b11 {
        0 => WireGateway::Unknown,
        1 => WireGateway::Reachable,
        2 => WireGateway::Unreachable,
        _ => return Err(DecodeError::Malformed { field: "gateway" }),
    };
    let config_revision = r.u64("config revision")?;
    let op = match r.u8("op")? {
        0 => None,
        1 => Some(WireOp::Prepare { id: r.u64("op id")?, to: r.name("op target")? }),
        2 => Some(WireOp::PrepareAck { id: r.u64("op id")? }),
        3 => Some(WireOp::Refuse { id: r.u64("op id")?, reason: r.u8("op reason")? }),
        4 => Some(WireOp::Commit { id: r.u64("op id")?, to: r.name("op target")?, epoch: r.u64("op epoch")? }),
        5 => Some(WireOp::Confirm { id: r.u64("op id")? }),
        6 => Some(WireOp::Abort { id: r.u64("op id")? }),
        _ => return Err(DecodeError::Malformed { field: "op" }),
    };
    let session = if minor >= SESSION_MINOR {
        let id = r.u64("session")?;
        let echo = r.u64("session echo")?;
        if id == 0 {
            return Err(DecodeError::Malformed { field: "session" });
        }
        Some(Session { id, echo })
    } else {
        None
    };
    // Bytes after the known fields belong to a newer minor version: ignored.
    let body = Body {
        role,
        epoch,
        priority,
        holds_vips: bit(0),
        ready_all: bit(1),
        maintenance: bit(2),
        carrier_ok: bit(3),
        suspended: bit(4),
        failback_paused: bit(5),
        draining: bit(8),
        gateway,
        config_revision,
        op,
    };
    Ok((body, session))
}

/// Why an authentic heartbeat was still refused by the [`ReplayWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The sequence number was seen before, or is too old for the window.
    #[error("replayed heartbeat (sequence {seq})")]
    Replayed {
        /// The sequence number.
        seq: u64,
    },
    /// The timestamp is further from the local clock than the freshness bound.
    #[error("stale heartbeat (timestamp {skew_ms} ms away from the local clock)")]
    Stale {
        /// Local clock minus the sender's timestamp.
        skew_ms: i64,
    },
    /// From a session of the sender that a newer session replaced: a replay.
    #[error("heartbeat of a replaced session {session:#x} of its sender")]
    RetiredSession {
        /// The session id.
        session: u64,
    },
    /// From a session that has not proved yet that it began after the receiver's start
    /// (it does not echo the receiver's session id) while another session of the same
    /// sender is current: a replay, or a restarted sender that has not heard us yet.
    #[error("heartbeat of an unconfirmed new session {session:#x} of its sender")]
    UnconfirmedSession {
        /// The session id.
        session: u64,
    },
}

impl ReplayError {
    /// A bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Replayed { .. } => "replayed",
            Self::Stale { .. } => "stale",
            Self::RetiredSession { .. } => "retired_session",
            Self::UnconfirmedSession { .. } => "unconfirmed_session",
        }
    }

    /// Whether the datagram was refused as (possibly) replayed, as opposed to stale.
    pub fn is_replay(&self) -> bool {
        !matches!(self, Self::Stale { .. })
    }
}

/// Anti-replay state for one (sender, path): the highest sequence number seen and a
/// 64-entry bitmap of the ones just below it (as in IPsec), plus a freshness bound.
///
/// A sender's sequence starts at its start-up time in microseconds, so a restarted
/// sender continues above its previous sequence without persisting anything.
#[derive(Clone, Debug, Default)]
pub struct ReplayWindow {
    highest: Option<u64>,
    bitmap: u64,
}

impl ReplayWindow {
    /// Window width in sequence numbers.
    pub const WIDTH: u64 = 64;

    /// Checks and records `seq`/`timestamp_ms` against the local clock `now_ms`;
    /// `max_age_ms` bounds |now − timestamp|.
    pub fn check(&mut self, seq: u64, timestamp_ms: u64, now_ms: u64, max_age_ms: u64) -> Result<(), ReplayError> {
        let skew_ms = now_ms as i64 - timestamp_ms as i64;
        if skew_ms.unsigned_abs() > max_age_ms {
            return Err(ReplayError::Stale { skew_ms });
        }
        match self.highest {
            None => {
                self.highest = Some(seq);
                self.bitmap = 1;
            }
            Some(h) if seq > h => {
                let shift = seq - h;
                self.bitmap = if shift >= Self::WIDTH { 1 } else { (self.bitmap << shift) | 1 };
                self.highest = Some(seq);
            }
            Some(h) => {
                let back = h - seq;
                if back >= Self::WIDTH || self.bitmap & (1 << back) != 0 {
                    return Err(ReplayError::Replayed { seq });
                }
                self.bitmap |= 1 << back;
            }
        }
        Ok(())
    }
}

/// How many replaced sessions of one sender a receiver remembers (and refuses).
pub const RETIRED_SESSIONS: usize = 8;

/// Anti-replay state of one sender, as one receiver keeps it: the sender's current
/// session, the sessions it replaced (refused for good), and a [`ReplayWindow`] per path
/// within the current session.
///
/// A datagram of a **new** session is accepted when
/// - no session of the sender is known yet (the receiver just started), or
/// - it echoes the receiver's own session id: it was signed after the sender heard the
///   receiver's current incarnation, so it cannot be a replay of anything older than that.
///
/// A restarted sender is thus heard again one heartbeat after it hears the receiver,
/// whatever its clock says; a replay of a replaced session is refused forever; and a
/// datagram of an unconfirmed session is refused while the current session stands (a
/// replay of captured traffic cannot displace it). Senders of minor version 0 carry no
/// session: their sequence numbers are checked in a window of their own per path, as
/// before sessions existed.
#[derive(Clone, Debug, Default)]
pub struct SenderWindow {
    current: Option<u64>,
    retired: std::collections::VecDeque<u64>,
    windows: std::collections::BTreeMap<String, ReplayWindow>,
    legacy: std::collections::BTreeMap<String, ReplayWindow>,
    /// Receiver's clock at the last datagram accepted in the current session.
    last_session_ms: u64,
}

impl SenderWindow {
    /// Checks and records a datagram of this sender received on `path`. `own_session` is
    /// the receiver's session id (what a confirmed new session echoes).
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &mut self,
        path: &str,
        session: Option<Session>,
        own_session: u64,
        seq: u64,
        timestamp_ms: u64,
        now_ms: u64,
        max_age_ms: u64,
    ) -> Result<(), ReplayError> {
        let skew_ms = now_ms as i64 - timestamp_ms as i64;
        if skew_ms.unsigned_abs() > max_age_ms {
            return Err(ReplayError::Stale { skew_ms });
        }
        let Some(sess) = session else {
            // A sender without sessions (minor 0). Once the sender spoke with sessions, a
            // datagram without one is a replay of its older traffic — unless the session
            // went silent for longer than the freshness bound (a downgrade: no datagram of
            // the session can still be fresh, so no session can be replayed any more).
            if self.current.is_some() && now_ms.saturating_sub(self.last_session_ms) <= max_age_ms {
                return Err(ReplayError::Replayed { seq });
            }
            self.retire_current();
            return self.legacy.entry(path.to_owned()).or_default().check(seq, timestamp_ms, now_ms, max_age_ms);
        };
        if self.current != Some(sess.id) {
            if self.retired.contains(&sess.id) {
                return Err(ReplayError::RetiredSession { session: sess.id });
            }
            if self.current.is_some() && sess.echo != own_session {
                return Err(ReplayError::UnconfirmedSession { session: sess.id });
            }
            self.retire_current();
            self.current = Some(sess.id);
        }
        self.windows.entry(path.to_owned()).or_default().check(seq, timestamp_ms, now_ms, max_age_ms)?;
        self.last_session_ms = now_ms;
        Ok(())
    }

    fn retire_current(&mut self) {
        if let Some(old) = self.current.take() {
            if self.retired.len() == RETIRED_SESSIONS {
                self.retired.pop_front();
            }
            self.retired.push_back(old);
        }
        self.windows.clear();
    }

    /// The sender's current session id, if one was accepted (what our heartbeats to it echo).
    pub fn session(&self) -> Option<u64> {
        self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn keyring() -> Keyring {
        Keyring { current: Key { id: 7, secret: b"0123456789abcdef0123456789abcdef".to_vec() }, previous: None }
    }

    fn sample() -> Heartbeat {
        Heartbeat {
            major: PROTOCOL_MAJOR,
            minor: PROTOCOL_MINOR,
            key_id: 7,
            seq: 1_700_000_000_000_000,
            timestamp_ms: 1_700_000_000_000,
            pair: "web".into(),
            sender: "node-a".into(),
            body: Body {
                role: WireRole::Active,
                epoch: 42,
                priority: 200,
                holds_vips: true,
                ready_all: true,
                maintenance: false,
                carrier_ok: true,
                suspended: false,
                failback_paused: true,
                draining: true,
                gateway: WireGateway::Reachable,
                config_revision: 0xdead_beef,
                op: Some(WireOp::Commit { id: 9, to: "node-b".into(), epoch: 43 }),
            },
            session: Some(Session { id: 0x1234_5678_9abc_def0, echo: 77 }),
        }
    }

    #[test]
    fn roundtrip() {
        let k = keyring();
        let bytes = encode(&sample(), &k.current);
        assert!(bytes.len() < 160, "compact: {} bytes", bytes.len());
        assert_eq!(decode(&bytes, &k), Ok(sample()));
    }

    #[test]
    fn every_truncation_is_refused() {
        let k = keyring();
        let bytes = encode(&sample(), &k.current);
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len], &k).is_err(), "truncated to {len} must fail");
        }
    }

    #[test]
    fn every_bit_flip_is_refused() {
        let k = keyring();
        let bytes = encode(&sample(), &k.current);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(decode(&b, &k).is_err(), "flip byte {i} bit {bit} must fail");
            }
        }
    }

    #[test]
    fn forged_with_another_key_is_refused() {
        let k = keyring();
        let forger = Key { id: 7, secret: b"not the key".to_vec() };
        assert_eq!(decode(&encode(&sample(), &forger), &k), Err(DecodeError::BadMac));
        let unknown = Key { id: 8, secret: k.current.secret.clone() };
        assert_eq!(decode(&encode(&sample(), &unknown), &k), Err(DecodeError::UnknownKey { key_id: 8 }));
    }

    #[test]
    fn rotation_accepts_previous_key() {
        let old = Key { id: 1, secret: b"old-old-old-old-old".to_vec() };
        let new = Key { id: 2, secret: b"new-new-new-new-new".to_vec() };
        let ring = Keyring { current: new.clone(), previous: Some(old.clone()) };
        assert!(decode(&encode(&sample(), &old), &ring).is_ok());
        assert!(decode(&encode(&sample(), &new), &ring).is_ok());
        let done = Keyring { current: new, previous: None };
        assert_eq!(decode(&encode(&sample(), &old), &done), Err(DecodeError::UnknownKey { key_id: 1 }));
    }

    #[test]
    fn other_major_is_reported_after_authentication() {
        let k = keyring();
        let mut hb = sample();
        hb.major = 2;
        assert_eq!(
            decode(&encode(&hb, &k.current), &k),
            Err(DecodeError::UnsupportedMajor {
                major: 2,
                sender: "node-a".into(),
                seq: hb.seq,
                timestamp_ms: hb.timestamp_ms
            })
        );
    }

    #[test]
    fn newer_minor_with_extra_body_bytes_is_accepted() {
        let k = keyring();
        let hb = sample();
        // Re-encode by hand with 3 extra body bytes and minor 5.
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.push(PROTOCOL_MAJOR);
        out.push(5);
        out.extend_from_slice(&k.current.id.to_be_bytes());
        out.extend_from_slice(&hb.seq.to_be_bytes());
        out.extend_from_slice(&hb.timestamp_ms.to_be_bytes());
        put_name(&mut out, &hb.pair);
        put_name(&mut out, &hb.sender);
        let mut body = encode_body(&hb.body);
        let sess = hb.session.expect("sample has a session");
        body.extend_from_slice(&sess.id.to_be_bytes());
        body.extend_from_slice(&sess.echo.to_be_bytes());
        body.extend_from_slice(&[1, 2, 3]);
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(&body);
        let mac = mac_of(&k.current.secret, &out);
        out.extend_from_slice(&mac);
        let got = decode(&out, &k).expect("accepted");
        assert_eq!(got.minor, 5);
        assert_eq!(got.body, hb.body);
        assert_eq!(got.session, hb.session);
    }

    #[test]
    fn minor_zero_senders_carry_no_session_and_still_decode() {
        let k = keyring();
        let mut hb = sample();
        hb.minor = 0;
        let got = decode(&encode(&hb, &k.current), &k).expect("accepted");
        assert_eq!(got.session, None, "a minor-0 datagram carries no session");
        assert_eq!(got.body, hb.body);
        // A minor-1 datagram without the session bytes is malformed (authentic but short).
        let mut out = encode(&Heartbeat { minor: 0, ..sample() }, &k.current);
        out[3] = SESSION_MINOR;
        let n = out.len() - MAC_LEN;
        out.truncate(n);
        let mac = mac_of(&k.current.secret, &out);
        out.extend_from_slice(&mac);
        assert_eq!(decode(&out, &k), Err(DecodeError::Malformed { field: "session" }));
    }

    #[test]
    fn peek_pair_reads_the_name_without_the_key() {
        let k = keyring();
        let bytes = encode(&sample(), &k.current);
        assert_eq!(peek_pair(&bytes), Ok("web"));
        // A forged datagram still names its pair; authentication comes after.
        let forged = encode(&sample(), &Key { id: 7, secret: b"not the key".to_vec() });
        assert_eq!(peek_pair(&forged), Ok("web"));
        assert_eq!(peek_pair(&bytes[..10]), Err(DecodeError::Truncated { len: 10 }));
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert_eq!(peek_pair(&bad), Err(DecodeError::BadMagic));
        let mut long = bytes.clone();
        long[FIXED_HEADER] = 200;
        assert_eq!(peek_pair(&long), Err(DecodeError::Malformed { field: "pair" }));
        let mut utf = bytes;
        utf[FIXED_HEADER + 1] = 0xff;
        assert_eq!(peek_pair(&utf), Err(DecodeError::Malformed { field: "pair" }));
        for len in 0..80 {
            let _ = peek_pair(&vec![b'H'; len]);
        }
    }

    const OWN: u64 = 0xaaaa;
    fn sess(id: u64, echo: u64) -> Option<Session> {
        Some(Session { id, echo })
    }

    #[test]
    fn a_restarted_sender_whose_clock_stepped_back_is_heard_once_it_echoes_us() {
        let mut w = SenderWindow::default();
        let now = 10_000_000;
        // The sender ran with its clock ahead: high sequence numbers.
        for seq in 5_000..5_010 {
            assert!(w.check("data", sess(1, OWN), OWN, seq, now, now, 60_000).is_ok());
        }
        // Restarted on the true clock: lower sequence numbers, a new session. Before it
        // heard us it cannot echo us: refused, and the old session stays current.
        assert_eq!(
            w.check("data", sess(2, 0), OWN, 100, now, now, 60_000),
            Err(ReplayError::UnconfirmedSession { session: 2 })
        );
        assert_eq!(w.session(), Some(1));
        // Once it echoes our session it is heard at once, lower sequence or not.
        assert!(w.check("data", sess(2, OWN), OWN, 101, now, now, 60_000).is_ok());
        assert!(w.check("mgmt", sess(2, OWN), OWN, 101, now, now, 60_000).is_ok(), "every path");
        assert_eq!(w.session(), Some(2));
        assert!(w.check("data", sess(2, OWN), OWN, 102, now, now, 60_000).is_ok());
        // Replay protection holds within the new session …
        assert_eq!(w.check("data", sess(2, OWN), OWN, 101, now, now, 60_000), Err(ReplayError::Replayed { seq: 101 }));
        // … and the replaced session is refused for good, echo or not.
        assert_eq!(
            w.check("data", sess(1, OWN), OWN, 9_999, now, now, 60_000),
            Err(ReplayError::RetiredSession { session: 1 })
        );
    }

    #[test]
    fn the_first_session_is_accepted_without_an_echo_and_replaced_by_a_confirmed_one() {
        let mut w = SenderWindow::default();
        let now = 10_000_000;
        // Receiver just started: the sender still echoes our previous incarnation.
        assert!(w.check("data", sess(7, 0x1111), OWN, 10, now, now, 60_000).is_ok());
        // Another unconfirmed session cannot displace it (a replay of older traffic) …
        assert_eq!(
            w.check("data", sess(8, 0x1111), OWN, 500, now, now, 60_000),
            Err(ReplayError::UnconfirmedSession { session: 8 })
        );
        // … a confirmed one can.
        assert!(w.check("data", sess(8, OWN), OWN, 1, now, now, 60_000).is_ok());
        assert_eq!(
            w.check("data", sess(7, OWN), OWN, 11, now, now, 60_000),
            Err(ReplayError::RetiredSession { session: 7 })
        );
    }

    #[test]
    fn retired_sessions_are_bounded_and_stale_comes_first() {
        let mut w = SenderWindow::default();
        let now = 10_000_000;
        for id in 1..=(RETIRED_SESSIONS as u64 + 3) {
            assert!(w.check("data", sess(id, OWN), OWN, 1, now, now, 60_000).is_ok());
        }
        assert_eq!(w.retired.len(), RETIRED_SESSIONS);
        assert_eq!(
            w.check("data", sess(RETIRED_SESSIONS as u64 + 3, OWN), OWN, 2, now - 61_000, now, 60_000),
            Err(ReplayError::Stale { skew_ms: 61_000 })
        );
    }

    #[test]
    fn senders_without_sessions_keep_the_old_window_per_path() {
        let mut w = SenderWindow::default();
        let now = 10_000_000;
        assert!(w.check("data", None, OWN, 100, now, now, 60_000).is_ok());
        assert!(w.check("mgmt", None, OWN, 100, now, now, 60_000).is_ok());
        assert_eq!(w.check("data", None, OWN, 100, now, now, 60_000), Err(ReplayError::Replayed { seq: 100 }));
        assert_eq!(w.session(), None);
        // Upgraded: sessions from now on.
        assert!(w.check("data", sess(3, 0), OWN, 1, now, now, 60_000).is_ok());
        // A datagram without a session is now a replay of the older traffic …
        assert_eq!(
            w.check("data", None, OWN, 101, now + 1_000, now + 1_000, 60_000),
            Err(ReplayError::Replayed { seq: 101 })
        );
        // … until the session has been silent past the freshness bound (a downgrade).
        assert!(w.check("data", None, OWN, 102, now + 61_000, now + 61_000, 60_000).is_ok());
        assert_eq!(w.session(), None);
        assert_eq!(
            w.check("data", sess(3, OWN), OWN, 2, now + 61_000, now + 61_000, 60_000),
            Err(ReplayError::RetiredSession { session: 3 })
        );
    }

    #[test]
    fn oversized_is_refused_unread() {
        let k = keyring();
        assert_eq!(decode(&[0u8; MAX_DATAGRAM + 1], &k), Err(DecodeError::Oversized { len: MAX_DATAGRAM + 1 }));
    }

    #[test]
    fn replay_window() {
        let mut w = ReplayWindow::default();
        let now = 1_000_000;
        assert!(w.check(100, now, now, 60_000).is_ok());
        assert_eq!(w.check(100, now, now, 60_000), Err(ReplayError::Replayed { seq: 100 }));
        assert!(w.check(102, now, now, 60_000).is_ok());
        assert!(w.check(101, now, now, 60_000).is_ok(), "out of order within the window");
        assert_eq!(w.check(101, now, now, 60_000), Err(ReplayError::Replayed { seq: 101 }));
        assert!(w.check(1000, now, now, 60_000).is_ok());
        assert_eq!(w.check(900, now, now, 60_000), Err(ReplayError::Replayed { seq: 900 }), "below the window");
        assert_eq!(w.check(2000, now - 61_000, now, 60_000), Err(ReplayError::Stale { skew_ms: 61_000 }));
        assert_eq!(w.check(2000, now + 61_000, now, 60_000), Err(ReplayError::Stale { skew_ms: -61_000 }));
    }

    fn arb_body() -> impl Strategy<Value = Body> {
        let op = prop_oneof![
            Just(None),
            (any::<u64>(), "[a-z0-9-]{0,63}").prop_map(|(id, to)| Some(WireOp::Prepare { id, to })),
            any::<u64>().prop_map(|id| Some(WireOp::PrepareAck { id })),
            (any::<u64>(), any::<u8>()).prop_map(|(id, reason)| Some(WireOp::Refuse { id, reason })),
            (any::<u64>(), "[a-z0-9-]{0,63}", any::<u64>()).prop_map(|(id, to, epoch)| Some(WireOp::Commit {
                id,
                to,
                epoch
            })),
            any::<u64>().prop_map(|id| Some(WireOp::Confirm { id })),
            any::<u64>().prop_map(|id| Some(WireOp::Abort { id })),
        ];
        let gateway =
            prop_oneof![Just(WireGateway::Unknown), Just(WireGateway::Reachable), Just(WireGateway::Unreachable)];
        (0u8..7, any::<u64>(), any::<u8>(), any::<[bool; 7]>(), gateway, any::<u64>(), op).prop_map(
            |(role, epoch, priority, f, gateway, config_revision, op)| Body {
                role: WireRole::from_u8(role).unwrap_or(WireRole::Init),
                epoch,
                priority,
                holds_vips: f[0],
                ready_all: f[1],
                maintenance: f[2],
                carrier_ok: f[3],
                suspended: f[4],
                failback_paused: f[5],
                draining: f[6],
                gateway,
                config_revision,
                op,
            },
        )
    }

    proptest! {
        #[test]
        fn any_heartbeat_roundtrips(body in arb_body(), seq in any::<u64>(), ts in any::<u64>(),
                                    pair in "[a-z0-9-]{1,63}", sender in "[a-z0-9.-]{1,63}") {
            let k = keyring();
            let session = Some(Session { id: seq | 1, echo: ts });
            let hb = Heartbeat { major: PROTOCOL_MAJOR, minor: PROTOCOL_MINOR, key_id: 7, seq, timestamp_ms: ts, pair, sender, body, session };
            let bytes = encode(&hb, &k.current);
            prop_assert!(bytes.len() <= MAX_DATAGRAM);
            prop_assert_eq!(decode(&bytes, &k), Ok(hb));
        }
    }
}
