//! The wire format: netlink message framing, nfnetlink's `nfgenmsg`, and netlink
//! attributes (a builder and a bounds-checked parser).
//!
//! Everything here works on byte slices and never panics on what it reads: a short
//! header, a length that runs past its buffer or an attribute of the wrong size is a
//! [`ParseError`]. Integers in nf_tables attributes are big-endian (`NLA_F_NET_BYTEORDER`
//! is not set on them, nft and the kernel agree on the byte order by attribute type);
//! netlink's own headers are in host byte order.

use std::fmt;

/// `sizeof(struct nlmsghdr)`.
pub(crate) const NLMSG_HDRLEN: usize = 16;
/// `sizeof(struct nfgenmsg)`.
pub(crate) const NFGENMSG_LEN: usize = 4;
const NLA_HDRLEN: usize = 4;

pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;

pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_DUMP_INTR: u16 = 0x10;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_APPEND: u16 = 0x800;
/// In an error message: the echoed request was cut to its header (`NETLINK_CAP_ACK`).
const NLM_F_CAPPED: u16 = 0x100;
/// In an error message: extended-ack TLVs follow (`NETLINK_EXT_ACK`).
const NLM_F_ACK_TLVS: u16 = 0x200;
/// `NLMSGERR_ATTR_MSG`: a human-readable reason, NUL-terminated.
const NLMSGERR_ATTR_MSG: u16 = 1;

const NLA_F_NESTED: u16 = 0x8000;
const NLA_F_NET_BYTEORDER: u16 = 0x4000;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

/// `NFNETLINK_V0`.
const NFNETLINK_V0: u8 = 0;
/// `NFNL_SUBSYS_NFTABLES`: the high byte of every nf_tables message type.
pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFNL_MSG_BATCH_BEGIN` / `_END` (`NLMSG_MIN_TYPE` and the next one).
pub(crate) const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub(crate) const NFNL_MSG_BATCH_END: u16 = 0x11;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// What went wrong reading a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParseError(pub(crate) String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub(crate) fn malformed<T>(what: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError(what.into()))
}

/// Builds netlink messages and their attributes into one buffer (a batch is several
/// messages back to back, sent with one `send`).
///
/// Lengths are patched in when a message or nest is closed. A nest longer than an
/// attribute's 16-bit length can express is recorded and reported by
/// [`Writer::finish`] instead of being written wrong.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
    overflow: bool,
}

impl Writer {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Appends one netlink message with an `nfgenmsg` header; `body` writes its
    /// attributes.
    pub(crate) fn message(
        &mut self,
        ty: u16,
        flags: u16,
        seq: u32,
        family: u8,
        res_id: u16,
        body: impl FnOnce(&mut Writer),
    ) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, patched below
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel fills it in
        self.buf.push(family);
        self.buf.push(NFNETLINK_V0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        body(self);
        match u32::try_from(self.buf.len() - start) {
            Ok(len) => self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes()),
            Err(_) => self.overflow = true,
        }
    }

    /// One attribute with `value` (padded to 4 bytes).
    pub(crate) fn bytes(&mut self, ty: u16, value: &[u8]) {
        let Ok(len) = u16::try_from(NLA_HDRLEN + value.len()) else {
            self.overflow = true;
            return;
        };
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.pad();
    }

    /// A big-endian `u32` attribute (nf_tables' registers, offsets, hooks, verdicts).
    pub(crate) fn u32_be(&mut self, ty: u16, value: u32) {
        self.bytes(ty, &value.to_be_bytes());
    }

    /// A NUL-terminated string attribute.
    pub(crate) fn string(&mut self, ty: u16, value: &str) {
        let mut v = Vec::with_capacity(value.len() + 1);
        v.extend_from_slice(value.as_bytes());
        v.push(0);
        self.bytes(ty, &v);
    }

    /// A nested attribute (`NLA_F_NESTED` set, as libmnl does); `body` writes its members.
    pub(crate) fn nest(&mut self, ty: u16, body: impl FnOnce(&mut Writer)) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        body(self);
        match u16::try_from(self.buf.len() - start) {
            Ok(len) => self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes()),
            Err(_) => self.overflow = true,
        }
    }

    fn pad(&mut self) {
        let padded = align4(self.buf.len());
        self.buf.resize(padded, 0);
    }

    /// The bytes, or an error if some length did not fit its field.
    pub(crate) fn finish(self) -> Result<Vec<u8>, ParseError> {
        if self.overflow {
            return malformed("a message or attribute is longer than netlink can express");
        }
        Ok(self.buf)
    }
}

/// One netlink message as read from the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NlMsg<'a> {
    pub(crate) ty: u16,
    pub(crate) flags: u16,
    pub(crate) seq: u32,
    /// Everything after the `nlmsghdr`.
    pub(crate) payload: &'a [u8],
}

fn u16_ne(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_ne(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Iterates over the netlink messages in one datagram.
pub(crate) struct Messages<'a> {
    rest: &'a [u8],
}

/// The messages in `buf`.
pub(crate) fn messages(buf: &[u8]) -> Messages<'_> {
    Messages { rest: buf }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<NlMsg<'a>, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let b = self.rest;
        let (Some(len), Some(ty), Some(flags), Some(seq)) = (u32_ne(b, 0), u16_ne(b, 4), u16_ne(b, 6), u32_ne(b, 8))
        else {
            self.rest = &[];
            return Some(malformed(format!("a netlink header needs {NLMSG_HDRLEN} bytes, {} left", b.len())));
        };
        let len = len as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            self.rest = &[];
            return Some(malformed(format!("netlink message length {len} with {} bytes in the buffer", b.len())));
        }
        self.rest = b.get(align4(len)..).unwrap_or_default();
        Some(Ok(NlMsg { ty, flags, seq, payload: &b[NLMSG_HDRLEN..len] }))
    }
}

/// What an `NLMSG_ERROR` message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ack {
    /// 0 for an acknowledgement, else the positive errno.
    pub(crate) errno: i32,
    /// The sequence number of the request it answers (from the echoed header).
    pub(crate) seq: u32,
    /// The kernel's extended-ack message, if it gave one.
    pub(crate) message: Option<String>,
}

/// Parses the payload of an `NLMSG_ERROR` message with header flags `flags`.
pub(crate) fn parse_ack(flags: u16, payload: &[u8]) -> Result<Ack, ParseError> {
    let (Some(error), Some(orig_len), Some(orig_seq)) = (u32_ne(payload, 0), u32_ne(payload, 4), u32_ne(payload, 12))
    else {
        return malformed(format!("an error message needs 20 bytes, got {}", payload.len()));
    };
    let error = error as i32;
    // The kernel sends negative errnos; i32::MIN cannot be negated.
    let errno = error.checked_neg().ok_or_else(|| ParseError(format!("error code {error}")))?;
    if errno < 0 {
        return malformed(format!("positive error code {error}"));
    }
    // The echoed request: its header only when capped (or for an ack, which never
    // echoes the payload), else the whole request; the extended-ack TLVs follow.
    let echoed = if flags & NLM_F_CAPPED != 0 || errno == 0 { NLMSG_HDRLEN } else { orig_len as usize };
    let mut message = None;
    if flags & NLM_F_ACK_TLVS != 0 {
        let tlvs = payload.get(4 + align4(echoed)..).ok_or_else(|| {
            ParseError(format!("extended ack after a {echoed}-byte request in a {}-byte error", payload.len()))
        })?;
        for a in attrs(tlvs) {
            let a = a?;
            if a.ty == NLMSGERR_ATTR_MSG {
                message = Some(a.string()?.to_owned());
            }
        }
    }
    Ok(Ack { errno, seq: orig_seq, message })
}

/// The payload of an nfnetlink message: its `nfgenmsg` family and its attributes.
pub(crate) fn nfgen(payload: &[u8]) -> Result<(u8, &[u8]), ParseError> {
    match (payload.first(), payload.get(NFGENMSG_LEN..)) {
        (Some(family), Some(rest)) => Ok((*family, rest)),
        _ => malformed(format!("an nfnetlink message needs a {NFGENMSG_LEN}-byte header, got {}", payload.len())),
    }
}

/// One attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attr<'a> {
    /// The type, without the nested/byte-order flags.
    pub(crate) ty: u16,
    pub(crate) value: &'a [u8],
}

impl<'a> Attr<'a> {
    /// A big-endian `u32`; any other size is an error.
    pub(crate) fn u32_be(&self) -> Result<u32, ParseError> {
        match <[u8; 4]>::try_from(self.value) {
            Ok(b) => Ok(u32::from_be_bytes(b)),
            Err(_) => malformed(format!("attribute {} has {} bytes, a u32 has 4", self.ty, self.value.len())),
        }
    }

    /// A big-endian `u64`; any other size is an error.
    pub(crate) fn u64_be(&self) -> Result<u64, ParseError> {
        match <[u8; 8]>::try_from(self.value) {
            Ok(b) => Ok(u64::from_be_bytes(b)),
            Err(_) => malformed(format!("attribute {} has {} bytes, a u64 has 8", self.ty, self.value.len())),
        }
    }

    /// A NUL-terminated UTF-8 string.
    pub(crate) fn string(&self) -> Result<&'a str, ParseError> {
        let Some((0, s)) = self.value.split_last() else {
            return malformed(format!("attribute {} is not a NUL-terminated string", self.ty));
        };
        if s.contains(&0) {
            return malformed(format!("attribute {} has a NUL inside the string", self.ty));
        }
        std::str::from_utf8(s).map_err(|e| ParseError(format!("attribute {}: {e}", self.ty)))
    }

    /// The attributes nested in this one.
    pub(crate) fn nested(&self) -> Attrs<'a> {
        attrs(self.value)
    }
}

/// Iterates over a run of attributes.
pub(crate) struct Attrs<'a> {
    rest: &'a [u8],
}

/// The attributes in `buf`.
pub(crate) fn attrs(buf: &[u8]) -> Attrs<'_> {
    Attrs { rest: buf }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let b = self.rest;
        let (Some(len), Some(ty)) = (u16_ne(b, 0), u16_ne(b, 2)) else {
            self.rest = &[];
            return Some(malformed(format!("an attribute header needs {NLA_HDRLEN} bytes, {} left", b.len())));
        };
        let len = usize::from(len);
        if len < NLA_HDRLEN || len > b.len() {
            self.rest = &[];
            return Some(malformed(format!("attribute length {len} with {} bytes left", b.len())));
        }
        // The last attribute's padding may be missing (the message length is not
        // required to be aligned), hence `unwrap_or_default`.
        self.rest = b.get(align4(len)..).unwrap_or_default();
        Some(Ok(Attr { ty: ty & NLA_TYPE_MASK, value: &b[NLA_HDRLEN..len] }))
    }
}

#[cfg(test)]
mod tests {
    use super::{
        Ack, Attr, NLA_F_NESTED, NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_REQUEST, Writer, attrs, messages, nfgen,
        parse_ack, u16_ne, u32_ne,
    };

    #[test]
    fn writer_pads_and_patches_lengths() {
        let mut w = Writer::new();
        w.message(0x0a00, NLM_F_REQUEST, 7, 2, 0, |w| {
            w.string(1, "abcde");
            w.nest(4, |w| w.u32_be(1, 0x01020304));
        });
        let b = w.finish().unwrap();
        assert_eq!(b.len(), 16 + 4 + 12 + 12);
        assert_eq!(u32_ne(&b, 0), Some(44));
        let m: Vec<_> = messages(&b).collect::<Result<_, _>>().unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].ty, m[0].flags, m[0].seq), (0x0a00, NLM_F_REQUEST, 7));
        let (family, body) = nfgen(m[0].payload).unwrap();
        assert_eq!(family, 2);
        let a: Vec<_> = attrs(body).collect::<Result<_, _>>().unwrap();
        assert_eq!(a[0].string().unwrap(), "abcde");
        assert_eq!(a[1].ty, 4);
        let inner: Vec<_> = a[1].nested().collect::<Result<_, _>>().unwrap();
        assert_eq!(inner[0].u32_be().unwrap(), 0x01020304);
        // The nested flag is set on the wire and masked off when read.
        assert_eq!(u16_ne(&b, 16 + 4 + 12 + 2), Some(4 | NLA_F_NESTED));
    }

    #[test]
    fn oversized_attribute_is_an_error_not_garbage() {
        let mut w = Writer::new();
        w.bytes(1, &vec![0u8; 70_000]);
        assert!(w.finish().is_err());
        let mut w = Writer::new();
        w.nest(1, |w| {
            for _ in 0..20 {
                w.bytes(1, &[0u8; 4000]);
            }
        });
        assert!(w.finish().is_err());
    }

    #[test]
    fn truncated_and_garbage_input_is_an_error() {
        let mut w = Writer::new();
        w.message(0x0a00, 0, 1, 2, 0, |w| w.string(1, "havip-x-fwd"));
        let good = w.finish().unwrap();
        for cut in 1..good.len() {
            let r: Result<Vec<_>, _> = messages(&good[..cut]).collect();
            if let Ok(msgs) = r {
                // A cut inside the attributes leaves a whole header whose length lies.
                panic!("{cut} bytes parsed as {msgs:?}");
            }
        }
        // A header claiming less than a header.
        let mut bad = good.clone();
        bad[0..4].copy_from_slice(&4u32.to_ne_bytes());
        assert!(messages(&bad).any(|m| m.is_err()));
        // Attributes: a zero length, a length past the end, a short header.
        assert!(attrs(&[0, 0, 1, 0]).next().unwrap().is_err());
        assert!(attrs(&[9, 0, 1, 0, 1]).next().unwrap().is_err());
        assert!(attrs(&[8, 0]).next().unwrap().is_err());
        // The iterator stops after an error instead of looping.
        assert_eq!(attrs(&[0, 0, 1, 0, 8, 0, 1, 0]).count(), 1);
        // Wrong sizes for typed reads.
        let a = Attr { ty: 1, value: &[1, 2, 3] };
        assert!(a.u32_be().is_err() && a.u64_be().is_err() && a.string().is_err());
        assert!(Attr { ty: 1, value: b"a\0b\0" }.string().is_err());
        assert!(Attr { ty: 1, value: &[0xff, 0xfe, 0] }.string().is_err());
        assert!(nfgen(&[2, 0]).is_err());
    }

    #[test]
    fn acks_and_errors_are_read_with_and_without_extended_ack() {
        // An ack: error 0, then the request's header.
        let mut p = 0i32.to_ne_bytes().to_vec();
        p.extend_from_slice(&[20, 0, 0, 0, 0, 0x0a, 5, 0, 42, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_ack(0, &p).unwrap(), Ack { errno: 0, seq: 42, message: None });
        // A capped error with an extended-ack message.
        let mut p = (-2i32).to_ne_bytes().to_vec();
        p.extend_from_slice(&[120, 0, 0, 0, 2, 0x0a, 5, 0, 43, 0, 0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(&[8, 0, 1, 0, b'n', b'o', b'!', 0]);
        let ack = parse_ack(NLM_F_CAPPED | NLM_F_ACK_TLVS, &p).unwrap();
        assert_eq!(ack, Ack { errno: 2, seq: 43, message: Some("no!".into()) });
        // Not capped: the TLVs come after the whole echoed request, which is missing here.
        assert!(parse_ack(NLM_F_ACK_TLVS, &p).is_err());
        // Short, and a positive error code.
        assert!(parse_ack(0, &p[..10]).is_err());
        let mut p2 = p.clone();
        p2[0..4].copy_from_slice(&5i32.to_ne_bytes());
        assert!(parse_ack(0, &p2).is_err());
        p2[0..4].copy_from_slice(&i32::MIN.to_ne_bytes());
        assert!(parse_ack(0, &p2).is_err());
    }
}
