//! Encoding and authenticated decoding of the heartbeat datagram (the layout is in the
//! module documentation of [`super`]): [`encode`], [`decode`], [`peek_pair`], and the
//! bounds-checked [`Reader`] the witness protocol shares.

use super::mac::{Key, Keyring, MAC_LEN, mac_of, verify_mac};
use super::message::{
    Body, ECHO_MINOR, Heartbeat, INTERVAL_MINOR, MAX_DATAGRAM, MAX_ECHOES, MAX_NAME, PROTOCOL_MAJOR, PathEcho,
    SESSION_MINOR, Session, WireGateway, WireOp, WireRole,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The first two bytes of every heartbeat.
pub(super) const MAGIC: [u8; 2] = *b"HV";
/// Bytes before the pair name: magic, versions, key id, sequence number, timestamp.
pub(super) const FIXED_HEADER: usize = 24;

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
        if hb.minor >= ECHO_MINOR {
            encode_echoes(&mut body, &hb.echoes);
            if hb.minor >= INTERVAL_MINOR {
                body.extend_from_slice(&hb.body.interval_ms.to_be_bytes());
            }
        }
    }
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(&body);
    let mac = mac_of(&key.secret, &out);
    out.extend_from_slice(&mac);
    out
}

/// A count, then per echo: the address (a byte 4 or 6, then its bytes), the sequence
/// number and the µs held. At most [`MAX_ECHOES`] (the first ones).
fn encode_echoes(out: &mut Vec<u8>, echoes: &[PathEcho]) {
    let echoes = &echoes[..echoes.len().min(MAX_ECHOES)];
    out.push(echoes.len() as u8);
    for e in echoes {
        match e.to {
            IpAddr::V4(a) => {
                out.push(4);
                out.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                out.push(6);
                out.extend_from_slice(&a.octets());
            }
        }
        out.extend_from_slice(&e.seq.to_be_bytes());
        out.extend_from_slice(&e.held_us.to_be_bytes());
    }
}

fn decode_echoes(r: &mut Reader<'_>) -> Result<Vec<PathEcho>, DecodeError> {
    let n = usize::from(r.u8("echo count")?);
    if n > MAX_ECHOES {
        return Err(DecodeError::Malformed { field: "echo count" });
    }
    let mut echoes = Vec::with_capacity(n);
    for _ in 0..n {
        let to = match r.u8("echo address")? {
            4 => {
                let mut a = [0u8; 4];
                a.copy_from_slice(r.take(4, "echo address")?);
                IpAddr::V4(Ipv4Addr::from(a))
            }
            6 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(r.take(16, "echo address")?);
                IpAddr::V6(Ipv6Addr::from(a))
            }
            _ => return Err(DecodeError::Malformed { field: "echo address" }),
        };
        let seq = r.u64("echo seq")?;
        let held_us = r.u32("echo held")?;
        echoes.push(PathEcho { to, seq, held_us });
    }
    Ok(echoes)
}

pub(super) fn encode_body(b: &Body) -> Vec<u8> {
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
    if !verify_mac(&key.secret, signed, mac) {
        return Err(DecodeError::BadMac);
    }

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
    let (body, session, echoes) = decode_body(body_bytes, minor)?;
    Ok(Heartbeat { major, minor, key_id, seq, timestamp_ms, pair, sender, body, session, echoes })
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

/// A decoded body: its fields, the sender's session, its echoes.
type Decoded = (Body, Option<Session>, Vec<PathEcho>);

fn decode_body(buf: &[u8], minor: u8) -> Result<Decoded, DecodeError> {
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
    let echoes = if minor >= ECHO_MINOR { decode_echoes(&mut r)? } else { Vec::new() };
    let interval_ms = if minor >= INTERVAL_MINOR && session.is_some() { r.u32("interval")? } else { 0 };
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
        interval_ms,
    };
    Ok((body, session, echoes))
}
