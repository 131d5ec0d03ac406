//! Wire format of the witness: the optional third party of a standalone pair that keeps the
//! pair's fencing record (holder and epoch, like the Kubernetes Lease) and whose vote a
//! standby needs before it takes the VIPs from a peer it cannot hear.
//!
//! One UDP datagram per request and per response, signed with HMAC-SHA256 under the
//! **member key** of the member that asks ([`member_key`]; during a rotation the keys of
//! both witness keys are accepted):
//!
//! ```text
//! request:  "HW" | version u8 | kind u8 (1 read, 2 cas, 3 renew) | key id u32 |
//!           pair name | member name | request id u64 | challenge u64 | a u64 | b u64 | c u64 | MAC
//! response: "HW" | version u8 | kind u8 (0x81) | key id u32 |
//!           request id u64 | outcome u8 | witness session u64 | challenge u64 |
//!           holder name (empty: none) | epoch u64 | renewals u64 | MAC
//! ```
//!
//! Names are a length byte and at most [`MAX_NAME`](crate::MAX_NAME) bytes of UTF-8. For a compare-and-swap
//! `a` is the new epoch, `b` the expected one and `c` the claimer's grace in milliseconds;
//! for a renewal `a` is the epoch; for a read `a` is 1 when the sender holds the VIPs, else
//! 0; unused fields are zero.
//!
//! **Keys.** The witness holds one *witness key*; each member of each pair holds only its
//! own member key, `HMAC-SHA256(witness key, "havip-witness-member-key-v2" | 0 | pair |
//! 0 | member | 1)` (the HKDF-Expand step with the witness key as the pseudo-random key,
//! under the witness key's id): `havip-agent witness-key` prints it. The witness reads
//! the pair and member names of a request first (unauthenticated, like the heartbeat's
//! pair name), derives that member's key, and only then checks the MAC; it answers under
//! the same member key. So a member's key speaks for that member of that pair only: a
//! member of pair `db` cannot sign a request of pair `web`, nor of another member of `db`,
//! and nobody without a member key can make the witness remember a name.
//!
//! **Votes.** The witness notes when it last heard each member of a pair and whether that
//! member said it holds the VIPs (members read the record several times a second; a renewal
//! says "holding", a claim "not yet"). It refuses a compare-and-swap that would take the
//! record from a holder it heard holding within the claimer's grace
//! ([`Outcome::HolderAlive`]): that holder is alive and serving, only cut off from the
//! claimer. A holder that gave the VIPs up (fenced, cut off from its gateway) says so in its
//! reads, and is taken over at once. Any member heard holding counts, not only the record's
//! holder: one that took the VIPs in a planned handover whose write never landed is as
//! alive.
//!
//! **Freshness.** Every request — reads too — must carry the challenge the witness last
//! gave this member of this pair; the witness replaces it as soon as it accepts one (single
//! use) and draws all of them afresh when it restarts. A request with any other challenge
//! is answered [`Outcome::Stale`] (with the record and the current challenge, for a genuine
//! retry), changes nothing and **is not evidence of life**: a recorded read or renewal
//! replayed after its sender died proves nothing. What a fresh request proves is that its
//! sender was alive when the witness *issued* the challenge it carries (it could not sign
//! it before), so the witness dates the member's liveness at that moment, not at the
//! request's arrival: a request held back in the network proves no more than it did when
//! it was signed. A response echoes the request id (random per request), so a member never
//! takes a recorded response for a fresh one.

use crate::{Key, Keyring, MAC_LEN, Reader, mac_of, put_name};

const MAGIC: [u8; 2] = *b"HW";
/// Version of the witness wire format (2: member keys, challenges on every request).
pub const VERSION: u8 = 2;
/// Largest datagram either side sends or accepts.
pub const MAX_DATAGRAM: usize = 256;
const RESPONSE_KIND: u8 = 0x81;
/// Default UDP port of the witness.
pub const DEFAULT_PORT: u16 = 7947;

/// What a member asks the witness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read the record; `holding`: the sender holds the VIPs now.
    Read {
        /// The sender holds the VIPs.
        holding: bool,
    },
    /// Set holder (the sender) and epoch if the record's epoch is `expected` — and, when
    /// the record names another holder, that holder has not been heard for `grace_ms`.
    Cas {
        /// The new epoch.
        new_epoch: u64,
        /// The epoch the sender believes the record has.
        expected: u64,
        /// How long the current holder must have been silent at the witness.
        grace_ms: u64,
    },
    /// The record names the sender under `epoch`: count a renewal (proof of life).
    Renew {
        /// The epoch the sender holds.
        epoch: u64,
    },
}

impl Op {
    /// A bounded label for metrics and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Op::Read { .. } => "read",
            Op::Cas { .. } => "cas",
            Op::Renew { .. } => "renew",
        }
    }
}

/// A request of one member of one pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Random per request; echoed by the response.
    pub id: u64,
    /// The challenge the witness last gave this member (0 when it has none yet).
    pub challenge: u64,
    /// The pair.
    pub pair: String,
    /// The member sending it (the holder a compare-and-swap names).
    pub member: String,
    /// What it asks.
    pub op: Op,
}

/// How the witness answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done: the record after the request is in the response.
    Done,
    /// The record's epoch is not the expected one (compare-and-swap), or it does not name
    /// the sender under that epoch (renewal): nothing changed; the record is in the response.
    Conflict,
    /// The challenge is not the current one (a replay, or a retry after the witness
    /// accepted the first copy or restarted): nothing changed; retry with the response's.
    Stale,
    /// A compare-and-swap refused because another member was heard saying it holds the VIPs
    /// within the claimer's grace: it is alive and serving. Nothing changed; the response
    /// names that member as holder (with the record's epoch).
    HolderAlive,
    /// Refused: an epoch outside the pair epoch's domain (`1..=2147483647`, the Lease's
    /// 32-bit `leaseTransitions`), or a pair (or a new member of a pair) the witness has no
    /// room for.
    Refused,
}

impl Outcome {
    fn code(self) -> u8 {
        match self {
            Outcome::Done => 0,
            Outcome::Conflict => 1,
            Outcome::Stale => 2,
            Outcome::Refused => 3,
            Outcome::HolderAlive => 4,
        }
    }
    fn from_code(c: u8) -> Option<Outcome> {
        Some(match c {
            0 => Outcome::Done,
            1 => Outcome::Conflict,
            2 => Outcome::Stale,
            3 => Outcome::Refused,
            4 => Outcome::HolderAlive,
            _ => return None,
        })
    }
    /// A bounded label for metrics and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Conflict => "conflict",
            Outcome::Stale => "stale",
            Outcome::Refused => "refused",
            Outcome::HolderAlive => "holder_alive",
        }
    }
}

/// The witness's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The request's id.
    pub id: u64,
    /// How it went.
    pub outcome: Outcome,
    /// Random per witness start: renewal counts of different sessions do not compare.
    pub session: u64,
    /// The challenge the member's next compare-and-swap or renewal must carry.
    pub challenge: u64,
    /// The record's holder (`None`: nobody).
    pub holder: Option<String>,
    /// The record's epoch (0: never written).
    pub epoch: u64,
    /// Renewals counted under this holder and epoch in this witness session.
    pub renewals: u64,
}

/// Why a witness datagram was dropped. [`WitnessDecodeError::reason`] gives a metric label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WitnessDecodeError {
    /// Shorter than the smallest possible datagram of its kind.
    #[error("failed to decode witness datagram: truncated ({len} bytes)")]
    Truncated {
        /// Datagram length.
        len: usize,
    },
    /// Larger than [`MAX_DATAGRAM`].
    #[error("failed to decode witness datagram: oversized ({len} bytes)")]
    Oversized {
        /// Datagram length.
        len: usize,
    },
    /// Not a witness datagram (or not of the expected direction).
    #[error("failed to decode witness datagram: bad magic or kind")]
    BadMagic,
    /// A version this build does not speak.
    #[error("witness datagram of version {version}, this build speaks {VERSION}")]
    UnsupportedVersion {
        /// Its version.
        version: u8,
    },
    /// Signed with a key id this side does not hold.
    #[error("failed to authenticate witness datagram: unknown key id {key_id}")]
    UnknownKey {
        /// The key id in the datagram.
        key_id: u32,
    },
    /// The MAC does not match (forged, corrupted, or another key under the same id).
    #[error("failed to authenticate witness datagram: bad MAC")]
    BadMac,
    /// Authentic but structurally invalid.
    #[error("failed to decode witness datagram: malformed {field}")]
    Malformed {
        /// The field that did not parse.
        field: &'static str,
    },
}

impl WitnessDecodeError {
    /// A bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "truncated",
            Self::Oversized { .. } => "oversized",
            Self::BadMagic => "bad_magic",
            Self::UnsupportedVersion { .. } => "unsupported_version",
            Self::UnknownKey { .. } => "unknown_key",
            Self::BadMac => "bad_mac",
            Self::Malformed { .. } => "malformed",
        }
    }
}

impl From<crate::DecodeError> for WitnessDecodeError {
    fn from(e: crate::DecodeError) -> Self {
        match e {
            crate::DecodeError::Malformed { field } => Self::Malformed { field },
            _ => Self::Malformed { field: "field" },
        }
    }
}

fn header(kind: u8, key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_DATAGRAM);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(kind);
    out.extend_from_slice(&key.id.to_be_bytes());
    out
}

fn sign(mut out: Vec<u8>, key: &Key) -> Vec<u8> {
    let mac = mac_of(&key.secret, &out);
    out.extend_from_slice(&mac);
    out
}

/// The label that separates member keys from every other use of the witness key.
const MEMBER_KEY_LABEL: &[u8] = b"havip-witness-member-key-v2";

/// The key `member` of `pair` signs its witness requests with, derived from the witness
/// key (the witness alone holds that one): HKDF-Expand with the witness key as the
/// pseudo-random key and `label | 0 | pair | 0 | member` as the info, one block. It keeps
/// the witness key's id. Names are taken as they are sent (at most
/// [`MAX_NAME`](crate::MAX_NAME) bytes).
pub fn member_key(witness: &Key, pair: &str, member: &str) -> Key {
    let cut = |s: &str| -> Vec<u8> { s.as_bytes().iter().take(crate::MAX_NAME).copied().collect() };
    let mut info = Vec::with_capacity(MEMBER_KEY_LABEL.len() + 2 * crate::MAX_NAME + 3);
    info.extend_from_slice(MEMBER_KEY_LABEL);
    info.push(0);
    info.extend_from_slice(&cut(pair));
    info.push(0);
    info.extend_from_slice(&cut(member));
    info.push(1);
    Key { id: witness.id, secret: mac_of(&witness.secret, &info).to_vec() }
}

/// The member keys of `member` of `pair` under every key of the witness keyring (what the
/// member's configuration holds during a rotation).
pub fn member_keyring(witness: &Keyring, pair: &str, member: &str) -> Keyring {
    Keyring {
        current: member_key(&witness.current, pair, member),
        previous: witness.previous.as_ref().map(|k| member_key(k, pair, member)),
    }
}

/// Checks size, magic, kind and version; returns the key id.
fn check_header(buf: &[u8], kinds: &[u8]) -> Result<u32, WitnessDecodeError> {
    if buf.len() > MAX_DATAGRAM {
        return Err(WitnessDecodeError::Oversized { len: buf.len() });
    }
    if buf.len() < 8 + MAC_LEN {
        return Err(WitnessDecodeError::Truncated { len: buf.len() });
    }
    if buf[0..2] != MAGIC || !kinds.contains(&buf[3]) {
        return Err(WitnessDecodeError::BadMagic);
    }
    if buf[2] != VERSION {
        return Err(WitnessDecodeError::UnsupportedVersion { version: buf[2] });
    }
    Ok(u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]))
}

/// Checks the MAC of `buf` under `key`; returns the signed part.
fn check_mac<'a>(buf: &'a [u8], key: &Key) -> Result<&'a [u8], WitnessDecodeError> {
    let (signed, mac) = buf.split_at(buf.len() - MAC_LEN);
    if !constant_time_eq(&mac_of(&key.secret, signed), mac) {
        return Err(WitnessDecodeError::BadMac);
    }
    Ok(signed)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn end(r: &Reader<'_>) -> Result<(), WitnessDecodeError> {
    if r.pos != r.buf.len() {
        return Err(WitnessDecodeError::Malformed { field: "trailing bytes" });
    }
    Ok(())
}

/// Encodes a request and signs it with the member's `key` (see [`member_key`]). Names
/// longer than 63 bytes are truncated.
pub fn encode_request(req: &Request, key: &Key) -> Vec<u8> {
    let (kind, a, b, c) = match req.op {
        Op::Read { holding } => (1, u64::from(holding), 0, 0),
        Op::Cas { new_epoch, expected, grace_ms } => (2, new_epoch, expected, grace_ms),
        Op::Renew { epoch } => (3, epoch, 0, 0),
    };
    let mut out = header(kind, key);
    put_name(&mut out, &req.pair);
    put_name(&mut out, &req.member);
    out.extend_from_slice(&req.id.to_be_bytes());
    out.extend_from_slice(&req.challenge.to_be_bytes());
    out.extend_from_slice(&a.to_be_bytes());
    out.extend_from_slice(&b.to_be_bytes());
    out.extend_from_slice(&c.to_be_bytes());
    sign(out, key)
}

/// Authenticates and decodes a request on the witness's side: `keys` is the **witness**
/// keyring; the request must be signed with the member key its pair and member names
/// derive ([`member_key`]). Never panics, whatever the input.
pub fn decode_request(buf: &[u8], keys: &Keyring) -> Result<Request, WitnessDecodeError> {
    let key_id = check_header(buf, &[1, 2, 3])?;
    let kind = buf[3];
    let witness_key = keys.find(key_id).ok_or(WitnessDecodeError::UnknownKey { key_id })?;
    // The names, unauthenticated: only to derive the key the MAC must verify under.
    let unsigned = &buf[..buf.len() - MAC_LEN];
    let mut r = Reader { buf: unsigned, pos: 8 };
    let pair = r.name("pair")?;
    let member = r.name("member")?;
    let signed = check_mac(buf, &member_key(witness_key, &pair, &member))?;
    // Authentic from here on.
    let mut r = Reader { buf: signed, pos: r.pos };
    let id = r.u64("request id")?;
    let challenge = r.u64("challenge")?;
    let a = r.u64("a")?;
    let b = r.u64("b")?;
    let c = r.u64("c")?;
    end(&r)?;
    if pair.is_empty() || member.is_empty() {
        return Err(WitnessDecodeError::Malformed { field: "empty name" });
    }
    let op = match kind {
        1 if a > 1 => return Err(WitnessDecodeError::Malformed { field: "holding" }),
        1 => Op::Read { holding: a == 1 },
        2 => Op::Cas { new_epoch: a, expected: b, grace_ms: c },
        _ => Op::Renew { epoch: a },
    };
    Ok(Request { id, challenge, pair, member, op })
}

/// The id of the key a request is signed with (to answer under the same one); `None` for
/// a datagram too short to carry one.
pub fn request_key_id(buf: &[u8]) -> Option<u32> {
    buf.get(4..8).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Encodes a response and signs it with the member key of the member that asked.
pub fn encode_response(resp: &Response, key: &Key) -> Vec<u8> {
    let mut out = header(RESPONSE_KIND, key);
    out.extend_from_slice(&resp.id.to_be_bytes());
    out.push(resp.outcome.code());
    out.extend_from_slice(&resp.session.to_be_bytes());
    out.extend_from_slice(&resp.challenge.to_be_bytes());
    put_name(&mut out, resp.holder.as_deref().unwrap_or(""));
    out.extend_from_slice(&resp.epoch.to_be_bytes());
    out.extend_from_slice(&resp.renewals.to_be_bytes());
    sign(out, key)
}

/// Authenticates and decodes a response on the member's side: `keys` are the member's own
/// keys. Never panics, whatever the input.
pub fn decode_response(buf: &[u8], keys: &Keyring) -> Result<Response, WitnessDecodeError> {
    let key_id = check_header(buf, &[RESPONSE_KIND])?;
    let key = keys.find(key_id).ok_or(WitnessDecodeError::UnknownKey { key_id })?;
    let signed = check_mac(buf, key)?;
    let mut r = Reader { buf: signed, pos: 8 };
    let id = r.u64("request id")?;
    let outcome = Outcome::from_code(r.u8("outcome")?).ok_or(WitnessDecodeError::Malformed { field: "outcome" })?;
    let session = r.u64("session")?;
    let challenge = r.u64("challenge")?;
    let holder = r.name("holder")?;
    let epoch = r.u64("epoch")?;
    let renewals = r.u64("renewals")?;
    end(&r)?;
    let holder = (!holder.is_empty()).then_some(holder);
    Ok(Response { id, outcome, session, challenge, holder, epoch, renewals })
}

#[cfg(test)]
mod tests {
    use super::{
        Key, Keyring, Op, Outcome, RESPONSE_KIND, Request, Response, VERSION, WitnessDecodeError, decode_request,
        decode_response, encode_request, encode_response, member_key, member_keyring, put_name, request_key_id, sign,
    };

    /// The witness's keyring.
    fn ring() -> Keyring {
        Keyring { current: Key { id: 3, secret: b"0123456789abcdef".to_vec() }, previous: None }
    }

    /// Member n1 of pair web's keyring.
    fn n1() -> Keyring {
        member_keyring(&ring(), "web", "n1")
    }

    fn req(op: Op) -> Request {
        Request { id: 0x1122, challenge: 0x3344, pair: "web".into(), member: "n1".into(), op }
    }

    fn resp() -> Response {
        Response {
            id: 9,
            outcome: Outcome::Conflict,
            session: 77,
            challenge: 55,
            holder: Some("n0".into()),
            epoch: 12,
            renewals: 4,
        }
    }

    #[test]
    fn requests_and_responses_round_trip() {
        let (w, m) = (ring(), n1());
        for op in [
            Op::Read { holding: true },
            Op::Read { holding: false },
            Op::Cas { new_epoch: 5, expected: 4, grace_ms: 300 },
            Op::Renew { epoch: 5 },
        ] {
            let r = req(op);
            assert_eq!(decode_request(&encode_request(&r, &m.current), &w), Ok(r));
        }
        let p = resp();
        assert_eq!(decode_response(&encode_response(&p, &m.current), &m), Ok(p.clone()));
        let nobody = Response { holder: None, outcome: Outcome::Done, ..p };
        assert_eq!(decode_response(&encode_response(&nobody, &m.current), &m), Ok(nobody));
    }

    #[test]
    fn a_member_key_speaks_for_its_own_pair_and_member_only() {
        let w = ring();
        let db_n0 = member_key(&w.current, "db", "n0");
        // db's member signs a request naming web's members: refused, whatever it names.
        for (pair, member) in [("web", "n1"), ("web", "n0"), ("db", "n1"), ("db", "n00")] {
            let r = Request {
                pair: pair.into(),
                member: member.into(),
                ..req(Op::Cas { new_epoch: 2, expected: 1, grace_ms: 0 })
            };
            assert_eq!(
                decode_request(&encode_request(&r, &db_n0), &w),
                Err(WitnessDecodeError::BadMac),
                "{pair}/{member}"
            );
        }
        let own = Request { pair: "db".into(), member: "n0".into(), ..req(Op::Read { holding: true }) };
        assert!(decode_request(&encode_request(&own, &db_n0), &w).is_ok());
        // The witness key itself is not a member key.
        assert_eq!(
            decode_request(&encode_request(&req(Op::Read { holding: true }), &w.current), &w),
            Err(WitnessDecodeError::BadMac)
        );
        // Keys differ per pair, per member, per witness key; the separator keeps
        // ("ab", "c") and ("a", "bc") apart.
        let k = |p: &str, m: &str| member_key(&w.current, p, m).secret;
        assert_ne!(k("ab", "c"), k("a", "bc"));
        assert_ne!(k("web", "n0"), k("web", "n1"));
        let other = Key { id: 3, secret: b"another witness key".to_vec() };
        assert_ne!(member_key(&other, "web", "n0").secret, k("web", "n0"));
        assert_eq!(member_key(&w.current, "web", "n0").id, 3);
    }

    #[test]
    fn a_response_under_another_members_key_is_refused() {
        let w = ring();
        let n0 = member_key(&w.current, "web", "n0");
        assert_eq!(decode_response(&encode_response(&resp(), &n0), &n1()), Err(WitnessDecodeError::BadMac));
    }

    #[test]
    fn a_request_is_not_a_response_and_a_response_is_not_a_request() {
        let (w, m) = (ring(), n1());
        let q = encode_request(&req(Op::Read { holding: true }), &m.current);
        assert_eq!(decode_response(&q, &m), Err(WitnessDecodeError::BadMagic));
        let p = encode_response(&resp(), &m.current);
        assert_eq!(decode_request(&p, &w), Err(WitnessDecodeError::BadMagic));
    }

    #[test]
    fn a_request_of_version_1_is_refused_by_version() {
        let m = n1();
        let mut q = encode_request(&req(Op::Read { holding: true }), &m.current);
        q[2] = 1;
        assert_eq!(decode_request(&q, &ring()), Err(WitnessDecodeError::UnsupportedVersion { version: 1 }));
    }

    #[test]
    fn every_bit_flip_and_truncation_is_refused() {
        let (w, m) = (ring(), n1());
        for buf in [
            encode_request(&req(Op::Cas { new_epoch: 2, expected: 1, grace_ms: 300 }), &m.current),
            encode_response(&resp(), &m.current),
        ] {
            for i in 0..buf.len() {
                for bit in 0..8 {
                    let mut b = buf.clone();
                    b[i] ^= 1 << bit;
                    assert!(decode_request(&b, &w).is_err() && decode_response(&b, &m).is_err(), "flip {i}/{bit}");
                }
            }
            for n in 0..buf.len() {
                assert!(decode_request(&buf[..n], &w).is_err() && decode_response(&buf[..n], &m).is_err(), "cut {n}");
            }
        }
    }

    #[test]
    fn another_key_or_key_id_is_refused_and_the_previous_key_is_accepted() {
        let w = ring();
        let other = Key { id: 3, secret: b"fedcba9876543210".to_vec() };
        let buf = encode_request(&req(Op::Read { holding: true }), &member_key(&other, "web", "n1"));
        assert_eq!(decode_request(&buf, &w), Err(WitnessDecodeError::BadMac));
        let old = Key { id: 2, secret: b"old-key-old-key!".to_vec() };
        let buf = encode_request(&req(Op::Read { holding: true }), &member_key(&old, "web", "n1"));
        assert_eq!(decode_request(&buf, &w), Err(WitnessDecodeError::UnknownKey { key_id: 2 }));
        let rotating = Keyring { current: w.current.clone(), previous: Some(old) };
        assert!(decode_request(&buf, &rotating).is_ok());
        assert_eq!(request_key_id(&buf), Some(2));
    }

    #[test]
    fn authentic_garbage_never_panics() {
        let (w, m) = (ring(), n1());
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 120) as usize;
            let mut body = vec![b'H', b'W', VERSION, [1u8, 2, 3, RESPONSE_KIND][(seed >> 8) as usize % 4]];
            body.extend_from_slice(&3u32.to_be_bytes());
            if seed & 1 == 0 {
                // Names that verify, then garbage.
                put_name(&mut body, "web");
                put_name(&mut body, "n1");
            }
            body.extend((0..len).map(|i| (seed >> (i % 56)) as u8));
            let signed = sign(body, &m.current);
            let _ = decode_request(&signed, &w);
            let _ = decode_response(&signed, &m);
        }
    }
}
