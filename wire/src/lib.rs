//! havip's wire protocols, without Kubernetes: the heartbeat datagram (this module) and
//! the witness protocol ([`witness`]), with their keys, MACs and replay windows. The
//! agent, the witness and the tests speak them; `havip-crds` re-exports them as
//! `havip_crds::wire` and `havip_crds::witness`.
//!
//! # The heartbeat
//!
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
//! Since minor version 2 the session is followed by the sender's [`PathEcho`]es: a count
//! (≤ [`MAX_ECHOES`]), then per path the receiver's address on it (a byte 4 or 6 and
//! the address), the receiver's sequence number the sender heard last there (8 bytes)
//! and the microseconds it held it before sending (4 bytes). The receiver takes the
//! echo naming the address a heartbeat arrived on and reads that path's round-trip time:
//! now − when it sent that sequence number − held. A receiver of minor 1 ignores them.
//!
//! Since minor version 3 the echoes are followed by the sender's interval: 4 bytes, the
//! milliseconds within which its next heartbeat comes (a quiet standby sends less often
//! than its profile's interval; its peers scale their timeout for it). A receiver of
//! minor 2 ignores it — and a sender sees that it does (its heartbeats declare none), so
//! it is never quiet towards such a peer.
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
//!
//! Since minor version 4 an agent reads **bundles** ([`bundle`]): the heartbeats of several
//! pairs to the same member address in one datagram, each section a whole heartbeat
//! verified on its own. A minor-4 heartbeat is laid out as a minor-3 one; the minor says
//! that its sender reads bundles, which an agent learns only from authenticated heartbeats.
//!
//! Rooms: `message` (the protocol constants and what a heartbeat carries), `codec`
//! (encoding and authenticated decoding of the datagram, [`DecodeError`]), `mac` (keys,
//! keyrings, HMAC-SHA256), `replay` (the receiver's [`ReplayWindow`] and
//! [`SenderWindow`]), `bundle` (several pairs' heartbeats in one datagram), `tests`. Every
//! public item is re-exported here:
//! `havip_crds::wire::X` is the path.

#![deny(missing_docs)]

pub mod bundle;
mod codec;
mod mac;
mod message;
mod replay;
#[cfg(test)]
mod tests;
pub mod witness;

pub use bundle::{BUNDLE_MINOR, MAX_BUNDLE};
pub use codec::{DecodeError, decode, encode, peek_pair};
pub use mac::{Key, Keyring, MAC_LEN};
pub use message::{
    Body, ECHO_MINOR, Heartbeat, INTERVAL_MINOR, MAX_DATAGRAM, MAX_ECHOES, MAX_NAME, PROTOCOL_MAJOR, PROTOCOL_MINOR,
    PathEcho, SESSION_MINOR, Session, WireGateway, WireOp, WireRole,
};
pub use replay::{RETIRED_SESSIONS, ReplayError, ReplayWindow, SenderWindow};

pub(crate) use codec::{Reader, put_name};
pub(crate) use mac::mac_of;
