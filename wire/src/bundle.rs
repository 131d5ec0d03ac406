//! Bundles: several pairs' heartbeats to the same member address in one datagram.
//!
//! Two agents that share many pairs would otherwise exchange one datagram per pair, peer
//! and path every interval. A bundle carries heartbeats of several pairs whole, each a
//! complete heartbeat datagram as [`super::encode`] writes it — with its own pair name, key
//! id, sequence number, session and MAC — so that each is verified with its own pair's keys
//! and goes through its own replay window, exactly as if it had come alone: a key mismatch,
//! a rotation, a reconfiguration or a deleted pair in one pair changes nothing another pair
//! hears. The bundle itself carries no MAC and nothing a receiver acts on.
//!
//! ```text
//! offset size  field
//! 0      2     magic "HB"
//! 2      1     bundle format version (1)
//! 3      1     number of sections n (2..=MAX_SECTIONS)
//! 4      ..    n × (2-byte length, then that many bytes: one heartbeat datagram)
//! ```
//!
//! A receiver of protocol minor < 4 knows no bundle (it drops one as `bad_magic`), so an
//! agent sends bundles only to a member address whose heartbeats it has authenticated at
//! minor ≥ [`BUNDLE_MINOR`], and one section alone always goes as a plain datagram.

use super::codec::DecodeError;
use super::message::MAX_DATAGRAM;

/// The first two bytes of a bundle.
pub const BUNDLE_MAGIC: [u8; 2] = *b"HB";
/// The bundle format this build writes and reads.
pub const BUNDLE_VERSION: u8 = 1;
/// The first protocol minor version whose agents read bundles.
pub const BUNDLE_MINOR: u8 = 4;
/// Most sections a bundle may carry (more is malformed: a forged bundle cannot make a
/// receiver verify more MACs per datagram than this).
pub const MAX_SECTIONS: usize = 16;
/// Largest bundle an agent sends: below the payload of a 1,280-byte IPv6 minimum MTU
/// path, and of IPv4 or IPv6 over most tunnels, so that a bundle is never fragmented.
pub const MAX_BUNDLE_SENT: usize = 1_200;
/// Largest bundle read (a bigger one is dropped unread).
pub const MAX_BUNDLE: usize = 1_472;
/// Bytes before the first section.
const HEADER: usize = 4;

/// Whether `buf` is a bundle (by its magic alone: it is not authenticated).
pub fn is_bundle(buf: &[u8]) -> bool {
    buf.len() >= 2 && buf[..2] == BUNDLE_MAGIC
}

/// Packs heartbeat datagrams into as few datagrams as fit [`MAX_BUNDLE_SENT`] bytes and
/// [`MAX_SECTIONS`] sections each, in order; each comes with the number of heartbeats it
/// carries. A heartbeat that would be alone goes out as it is (no bundle header), and so
/// does one too big to share a datagram.
pub fn pack(sections: &[&[u8]]) -> Vec<(Vec<u8>, usize)> {
    let mut out: Vec<(Vec<u8>, usize)> = Vec::new();
    let mut group: Vec<&[u8]> = Vec::new();
    let mut size = HEADER;
    let flush = |group: &mut Vec<&[u8]>, out: &mut Vec<(Vec<u8>, usize)>| {
        match group.len() {
            0 => {}
            1 => out.push((group[0].to_vec(), 1)),
            n => {
                let mut b = Vec::with_capacity(MAX_BUNDLE_SENT);
                b.extend_from_slice(&BUNDLE_MAGIC);
                b.push(BUNDLE_VERSION);
                b.push(n as u8);
                for s in group.iter() {
                    b.extend_from_slice(&(s.len() as u16).to_be_bytes());
                    b.extend_from_slice(s);
                }
                out.push((b, n));
            }
        }
        group.clear();
    };
    for s in sections {
        let cost = 2 + s.len();
        if HEADER + cost > MAX_BUNDLE_SENT {
            flush(&mut group, &mut out);
            size = HEADER;
            out.push((s.to_vec(), 1));
            continue;
        }
        if size + cost > MAX_BUNDLE_SENT || group.len() == MAX_SECTIONS {
            flush(&mut group, &mut out);
            size = HEADER;
        }
        group.push(s);
        size += cost;
    }
    flush(&mut group, &mut out);
    out
}

/// The sections of a bundle, each a heartbeat datagram to [`super::decode`] on its own.
/// Checks only the framing: size bounds, magic, version, the count and every length (each
/// section at most [`MAX_DATAGRAM`] bytes), and that nothing follows the last section.
/// Never panics, whatever the input.
pub fn sections(buf: &[u8]) -> Result<Vec<&[u8]>, DecodeError> {
    if buf.len() > MAX_BUNDLE {
        return Err(DecodeError::Oversized { len: buf.len() });
    }
    if buf.len() < HEADER {
        return Err(DecodeError::Truncated { len: buf.len() });
    }
    if !is_bundle(buf) {
        return Err(DecodeError::BadMagic);
    }
    if buf[2] != BUNDLE_VERSION {
        return Err(DecodeError::Malformed { field: "bundle version" });
    }
    let n = usize::from(buf[3]);
    if !(2..=MAX_SECTIONS).contains(&n) {
        return Err(DecodeError::Malformed { field: "bundle count" });
    }
    let mut out = Vec::with_capacity(n);
    let mut pos = HEADER;
    for _ in 0..n {
        let len = buf.get(pos..pos + 2).map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])));
        let Some(len) = len.filter(|l| *l <= MAX_DATAGRAM) else {
            return Err(DecodeError::Malformed { field: "bundle section" });
        };
        let section = buf.get(pos + 2..pos + 2 + len).ok_or(DecodeError::Malformed { field: "bundle section" })?;
        out.push(section);
        pos += 2 + len;
    }
    if pos != buf.len() {
        return Err(DecodeError::Malformed { field: "bundle trailing bytes" });
    }
    Ok(out)
}
