//! The `NETLINK_NETFILTER` socket: atomic batches with every answer read back, and
//! dumps, each bounded by a deadline.

use super::error::{NftError, Op};
use super::msg::{
    self, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, ParseError, Writer,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, setsockopt, sockopt};
use nix::sys::time::TimeVal;
use std::io;
use std::time::{Duration, Instant};

/// Receive buffer for one datagram. A dump datagram is at most 32 KiB (the kernel
/// caps `max_recvmsg_len` there) unless a single message is larger, which no
/// message of havip's tables is; a larger datagram is reported, not cut silently.
const RECV_BUF: usize = 64 * 1024;
/// A batch up to this size fits any default send buffer.
const SMALL_BATCH: usize = 64 * 1024;
/// A batch of up to this many messages has its answers fit any default receive buffer.
const SMALL_BATCH_MESSAGES: usize = 100;
/// How often a dump that the kernel marked inconsistent (`NLM_F_DUMP_INTR`: the
/// ruleset changed while it was being dumped) is retried.
const DUMP_TRIES: usize = 3;

/// An nf_tables batch being built: its messages, and the operation each performs (by
/// sequence number, for error reports).
#[derive(Debug)]
pub(crate) struct Batch {
    w: Writer,
    begin_seq: u32,
    next_seq: u32,
    ops: Vec<(u32, Op)>,
}

impl Batch {
    /// An empty batch whose messages are numbered from `first_seq`.
    pub(crate) fn new(first_seq: u32) -> Self {
        let mut w = Writer::new();
        // res_id names the subsystem the batch is for, in network byte order.
        w.message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, first_seq, 0, NFNL_SUBSYS_NFTABLES, |_| {});
        Self { w, begin_seq: first_seq, next_seq: first_seq.wrapping_add(1), ops: Vec::new() }
    }

    /// Appends an nf_tables message (`NFT_MSG_*` `msg_type`) with `NLM_F_ACK`, so that
    /// the kernel answers it on success too.
    pub(crate) fn push(&mut self, op: Op, msg_type: u8, family: u8, flags: u16, body: impl FnOnce(&mut Writer)) {
        let seq = self.next_seq;
        self.next_seq = seq.wrapping_add(1);
        let ty = (NFNL_SUBSYS_NFTABLES << 8) | u16::from(msg_type);
        self.w.message(ty, NLM_F_REQUEST | NLM_F_ACK | flags, seq, family, 0, body);
        self.ops.push((seq, op));
    }

    /// The number of nf_tables messages.
    pub(crate) fn len(&self) -> usize {
        self.ops.len()
    }

    /// Closes the batch: the bytes to send, and how to read the answers.
    pub(crate) fn finish(self) -> Result<Sealed, ParseError> {
        let Batch { mut w, begin_seq, next_seq, ops } = self;
        w.message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, next_seq, 0, NFNL_SUBSYS_NFTABLES, |_| {});
        Ok(Sealed { bytes: w.finish()?, begin_seq, after: next_seq.wrapping_add(1), ops })
    }
}

/// A closed batch.
#[derive(Debug)]
pub(crate) struct Sealed {
    /// The datagram.
    pub(crate) bytes: Vec<u8>,
    /// The sequence number of `BATCH_BEGIN`: errors on the batch as a whole carry it.
    pub(crate) begin_seq: u32,
    /// The first sequence number after the batch.
    pub(crate) after: u32,
    /// The operations, by sequence number.
    pub(crate) ops: Vec<(u32, Op)>,
}

/// A bound `NETLINK_NETFILTER` socket.
pub(crate) struct Conn {
    sock: Socket,
    seq: u32,
    timeout: Duration,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("seq", &self.seq).field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

/// A receive that did not produce a datagram.
enum RecvError {
    /// Nothing arrived before the deadline (or, non-blocking, nothing is queued).
    Empty,
    Io(io::Error),
}

impl Conn {
    pub(crate) fn open(timeout: Duration) -> Result<Self, NftError> {
        let mut sock = Socket::new(NETLINK_NETFILTER).map_err(NftError::Open)?;
        sock.bind(&SocketAddr::new(0, 0)).map_err(NftError::Open)?;
        // Errors echo only the failing request's header, and carry the kernel's
        // extended-ack message when it has one. Both are best effort: without them
        // errors are longer and less specific, nothing else changes.
        let _ = sock.set_cap_ack(true);
        let _ = sock.set_ext_ack(true);
        // Sequence numbers start somewhere different per socket, so that a late answer
        // to an earlier socket's request can never look like one of ours.
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
            .unwrap_or(1);
        Ok(Self { sock, seq, timeout, buf: Vec::with_capacity(RECV_BUF) })
    }

    pub(crate) fn next_seq(&self) -> u32 {
        self.seq
    }

    fn send(&mut self, bytes: &[u8], op: &Op) -> Result<(), NftError> {
        // A batch is one datagram, and netlink refuses one larger than the socket's send
        // buffer (EMSGSIZE). The default (`wmem_default`, about 208 KiB) holds some 280
        // forwarder rules; for more, raise the buffer, past `wmem_max` with
        // SO_SNDBUFFORCE where CAP_NET_ADMIN allows it, as nft does.
        if bytes.len() > SMALL_BATCH {
            let want = bytes.len() + 4096;
            if setsockopt(&self.sock, sockopt::SndBufForce, &want).is_err() {
                let _ = setsockopt(&self.sock, sockopt::SndBuf, &want);
            }
        }
        loop {
            match self.sock.send(bytes, 0) {
                Ok(n) if n == bytes.len() => return Ok(()),
                Ok(n) => {
                    let source = io::Error::other(format!("sent {n} of {} bytes", bytes.len()));
                    return Err(NftError::Send { op: op.clone(), source });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(NftError::Send { op: op.clone(), source }),
            }
        }
    }

    /// Receives one datagram into `self.buf`, waiting until `deadline` at most (not at
    /// all when `deadline` is `None`).
    fn recv(&mut self, deadline: Option<Instant>) -> Result<(), RecvError> {
        let mut flags = MsgFlags::MSG_TRUNC;
        match deadline {
            None => flags |= MsgFlags::MSG_DONTWAIT,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(RecvError::Empty);
                }
                // SO_RCVTIMEO of zero means "block forever": never set it.
                let left = left.max(Duration::from_millis(1));
                setsockopt(&self.sock, sockopt::ReceiveTimeout, &TimeVal::from(libc_timeval(left)))
                    .map_err(|e| RecvError::Io(e.into()))?;
            }
        }
        loop {
            self.buf.clear();
            self.buf.reserve(RECV_BUF);
            match self.sock.recv(&mut self.buf, flags.bits()) {
                // With MSG_TRUNC the datagram's real length comes back.
                Ok(n) if n > self.buf.len() => {
                    return Err(RecvError::Io(io::Error::other(format!(
                        "a {n}-byte datagram did not fit the {}-byte buffer",
                        self.buf.len()
                    ))));
                }
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(Errno::EAGAIN as i32) => return Err(RecvError::Empty),
                Err(e) => return Err(RecvError::Io(e)),
            }
        }
    }

    /// For tests: waits up to `wait` for a datagram; `None` if none came.
    #[cfg(test)]
    pub(crate) fn recv_for_test(&mut self, wait: Duration) -> Option<usize> {
        self.recv(Some(Instant::now() + wait)).ok().map(|()| self.buf.len())
    }

    /// Sends `batch` and reads every answer: one ack or error per message, plus an
    /// error on the batch itself if the kernel refused it as a whole (no permission,
    /// or the commit failed). Returns the errors in batch order.
    pub(crate) fn transact(&mut self, batch: Batch) -> Result<Vec<NftError>, NftError> {
        let Sealed { bytes, begin_seq, after, ops } =
            batch.finish().map_err(|e| NftError::Malformed { op: Op::Batch, reason: e.0 })?;
        self.seq = after;
        // The kernel queues every answer before `send` returns, so the receive buffer
        // must hold them all, or the overflow is lost (ENOBUFS) and with it the outcome.
        // An ack is a small skb, but it costs its truesize (under 1 KiB) against the
        // buffer; the default (`rmem_default`, about 208 KiB) holds some 200.
        if ops.len() > SMALL_BATCH_MESSAGES {
            let want = ops.len() * 1024 + SMALL_BATCH;
            if setsockopt(&self.sock, sockopt::RcvBufForce, &want).is_err() {
                let _ = setsockopt(&self.sock, sockopt::RcvBuf, &want);
            }
        }
        self.send(&bytes, &Op::Batch)?;
        let mut pending: Vec<(u32, Op)> = ops;
        let mut errors: Vec<(u32, NftError)> = Vec::new();
        let deadline = Instant::now() + self.timeout;
        // After an error on the batch as a whole the kernel may not answer the single
        // messages: it queues all its answers before `send` returns, so from then on we
        // only take what is already there.
        let mut batch_failed = false;
        while !pending.is_empty() {
            match self.recv(if batch_failed { None } else { Some(deadline) }) {
                Ok(()) => {}
                Err(RecvError::Empty) if batch_failed => break,
                Err(RecvError::Empty) => {
                    let op = pending.first().map_or(Op::Batch, |(_, op)| op.clone());
                    return Err(NftError::Timeout { op, timeout: self.timeout });
                }
                Err(RecvError::Io(source)) => return Err(NftError::Receive { op: Op::Batch, source }),
            }
            for m in msg::messages(&self.buf) {
                let m = m.map_err(|e| NftError::Malformed { op: Op::Batch, reason: e.0 })?;
                if m.ty != NLMSG_ERROR {
                    tracing::debug!(ty = m.ty, seq = m.seq, "nft: ignoring a message that is not an ack");
                    continue;
                }
                let ack = msg::parse_ack(m.flags, m.payload)
                    .map_err(|e| NftError::Malformed { op: Op::Batch, reason: e.0 })?;
                if ack.seq == begin_seq {
                    if ack.errno != 0 {
                        batch_failed = true;
                        errors.push((begin_seq, NftError::kernel(Op::Batch, ack.errno, ack.message)));
                    }
                    continue;
                }
                let Some(i) = pending.iter().position(|(s, _)| *s == ack.seq) else {
                    // An answer to an earlier request that timed out.
                    tracing::debug!(seq = ack.seq, "nft: ignoring a stale ack");
                    continue;
                };
                let (seq, op) = pending.swap_remove(i);
                if ack.errno != 0 {
                    errors.push((seq, NftError::kernel(op, ack.errno, ack.message)));
                }
            }
        }
        // Batch order: the kernel reports the first failing message first in practice,
        // but the order of its answers is not a promise.
        errors.sort_by_key(|(seq, _)| seq.wrapping_sub(begin_seq));
        Ok(errors.into_iter().map(|(_, e)| e).collect())
    }

    /// Dumps nf_tables objects: `msg_type` (`NFT_MSG_GET*`) for `family`, with `filter`
    /// attributes. Calls `each` with every answer's family and attributes.
    pub(crate) fn dump(
        &mut self,
        op: &Op,
        msg_type: u8,
        family: u8,
        filter: impl Fn(&mut Writer),
        mut each: impl FnMut(u8, &[u8]) -> Result<(), ParseError>,
    ) -> Result<(), NftError> {
        let malformed = |e: ParseError| NftError::Malformed { op: op.clone(), reason: e.0 };
        let mut tries = 0;
        'retry: loop {
            tries += 1;
            let seq = self.seq;
            self.seq = seq.wrapping_add(1);
            let mut w = Writer::new();
            let ty = (NFNL_SUBSYS_NFTABLES << 8) | u16::from(msg_type);
            w.message(ty, NLM_F_REQUEST | NLM_F_DUMP, seq, family, 0, &filter);
            let bytes = w.finish().map_err(malformed)?;
            self.send(&bytes, op)?;
            let deadline = Instant::now() + self.timeout;
            // Answers are collected first and handed to `each` only once the dump is
            // complete and consistent.
            let mut answers: Vec<(u8, Vec<u8>)> = Vec::new();
            let mut interrupted = false;
            loop {
                match self.recv(Some(deadline)) {
                    Ok(()) => {}
                    Err(RecvError::Empty) => return Err(NftError::Timeout { op: op.clone(), timeout: self.timeout }),
                    Err(RecvError::Io(source)) => return Err(NftError::Receive { op: op.clone(), source }),
                }
                for m in msg::messages(&self.buf) {
                    let m = m.map_err(malformed)?;
                    if m.seq != seq {
                        tracing::debug!(seq = m.seq, "nft: ignoring a stale answer");
                        continue;
                    }
                    interrupted |= m.flags & NLM_F_DUMP_INTR != 0;
                    match m.ty {
                        NLMSG_ERROR => {
                            let ack = msg::parse_ack(m.flags, m.payload).map_err(malformed)?;
                            if ack.errno == 0 {
                                continue;
                            }
                            return Err(NftError::kernel(op.clone(), ack.errno, ack.message));
                        }
                        NLMSG_DONE => {
                            // NLMSG_DONE carries the dump's status: 0, or a negative errno
                            // when it failed part way.
                            let status = m.payload.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok());
                            match status.map(i32::from_ne_bytes) {
                                Some(0) | None => {}
                                Some(e) => return Err(NftError::kernel(op.clone(), e.saturating_neg(), None)),
                            }
                            if interrupted {
                                if tries < DUMP_TRIES {
                                    tracing::debug!(%op, tries, "nft: dump interrupted by a ruleset change, again");
                                    continue 'retry;
                                }
                                return Err(NftError::DumpInterrupted { op: op.clone(), tries });
                            }
                            for (family, body) in &answers {
                                each(*family, body).map_err(malformed)?;
                            }
                            return Ok(());
                        }
                        _ => {
                            let (family, body) = msg::nfgen(m.payload).map_err(malformed)?;
                            answers.push((family, body.to_vec()));
                        }
                    }
                }
            }
        }
    }
}

fn libc_timeval(d: Duration) -> nix::libc::timeval {
    nix::libc::timeval {
        tv_sec: d.as_secs().try_into().unwrap_or(nix::libc::time_t::MAX),
        tv_usec: d.subsec_micros().into(),
    }
}
