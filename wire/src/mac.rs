//! Heartbeat authentication: the keys a member signs with and accepts ([`Key`],
//! [`Keyring`]) and HMAC-SHA256 over the datagram. The witness protocol signs with the
//! same primitives.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of the HMAC-SHA256 trailer.
pub const MAC_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

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

pub(crate) fn mac_of(secret: &[u8], data: &[u8]) -> [u8; MAC_LEN] {
    // HMAC accepts keys of any length, so new_from_slice cannot fail.
    let mut mac = match HmacSha256::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => return [0; MAC_LEN],
    };
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// Whether `mac` is the HMAC-SHA256 of `data` under `secret` (compared in constant time).
pub(crate) fn verify_mac(secret: &[u8], data: &[u8], mac: &[u8]) -> bool {
    let Ok(mut verifier) = HmacSha256::new_from_slice(secret) else {
        return false;
    };
    verifier.update(data);
    verifier.verify_slice(mac).is_ok()
}
