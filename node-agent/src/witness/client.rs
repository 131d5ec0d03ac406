//! A member's side of the witness: the pair's [`LeaseStore`] in standalone mode, and the
//! poll that shows the machine the record (holder, epoch, renewals) a few times a second.

use super::error::WitnessError;
use crate::lease::{LeaseFeed, LeaseSnapshot};
use crate::runtime::{Handle, LeaseStore};
use crate::sm;
use havip_crds::wire::Keyring;
use havip_crds::witness::{self, Op, Outcome, Request, Response};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::oneshot;

/// A request is sent again after this long without an answer.
const RESEND: Duration = Duration::from_millis(50);
/// How long one compare-and-swap or renewal may take in all (the machine gives up on a
/// compare-and-swap earlier and acts on the late answer, if any, through the poll).
const WRITE_LIMIT: Duration = Duration::from_secs(2);
/// How often the record is read at most (more often for a short heartbeat timeout: a
/// holder's reads are what the witness hears it by, so they must come well within it).
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// Unanswered reads in a row after which the machine is told the witness is unreachable.
const UNREACHABLE_AFTER: u32 = 2;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Response>>>>;

/// Removes a request's waiter when dropped.
struct Forget<'a> {
    pending: &'a Pending,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&self.id);
        }
    }
}

/// No later than when the witness issued the challenge this member holds: the beginning
/// of the exchange whose answer brought it, or of an earlier one whose answer was lost.
/// (A witness that restarted issued it at its start: a member reads every voter each
/// poll interval, so that is at most about a poll interval earlier — the quorum grace's
/// margin covers it.)
#[derive(Default)]
struct Proof {
    since: Option<std::time::Instant>,
    unanswered_since: Option<std::time::Instant>,
}

/// One member's connection to the witness, for one pair.
pub struct WitnessClient {
    sock: Arc<UdpSocket>,
    keys: Keyring,
    pair: String,
    member: String,
    address: SocketAddr,
    /// The pair's heartbeat timeout.
    timeout: Duration,
    challenge: AtomicU64,
    /// When the exchange that brought the current challenge began: the witness dates this
    /// member's liveness at the challenge's issue, which is no earlier (quorum fencing
    /// measures a holder's lease from it).
    challenge_from: Mutex<Proof>,
    /// The grace a claim asks for, when not [`Self::grace`]'s default (quorum voters).
    grace_override: Option<Duration>,
    pending: Pending,
    receiver: tokio::task::JoinHandle<()>,
}

impl Drop for WitnessClient {
    fn drop(&mut self) {
        self.receiver.abort();
    }
}

impl WitnessClient {
    /// A client of the witness at `address` for `member` of `pair`, whose heartbeat timeout
    /// is `timeout`.
    pub async fn connect(
        address: SocketAddr,
        keys: Keyring,
        pair: &str,
        member: &str,
        timeout: Duration,
    ) -> Result<Arc<WitnessClient>, WitnessError> {
        Self::connect_with_grace(address, keys, pair, member, timeout, None).await
    }

    /// Like [`Self::connect`], with the grace every claim asks for given (a quorum voter's:
    /// the quorum lease plus two reads and a margin).
    pub async fn connect_with_grace(
        address: SocketAddr,
        keys: Keyring,
        pair: &str,
        member: &str,
        timeout: Duration,
        grace: Option<Duration>,
    ) -> Result<Arc<WitnessClient>, WitnessError> {
        let any = match address.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let err = |source| WitnessError::Connect { address, source };
        let sock = UdpSocket::bind(SocketAddr::new(any, 0)).await.map_err(err)?;
        sock.connect(address).await.map_err(err)?;
        let sock = Arc::new(sock);
        let pending: Pending = Arc::default();
        let receiver = tokio::spawn(receive(sock.clone(), keys.clone(), pending.clone()));
        Ok(Arc::new(WitnessClient {
            sock,
            keys,
            pair: pair.to_owned(),
            member: member.to_owned(),
            address,
            timeout,
            challenge: AtomicU64::new(0),
            challenge_from: Mutex::new(Proof::default()),
            grace_override: grace,
            pending,
            receiver,
        }))
    }

    /// Sends `op` until an answer arrives or `limit` passes; a stale challenge is replaced
    /// by the one the answer carries and the request sent again (at most three times).
    async fn ask(&self, op: Op, limit: Duration) -> Option<Response> {
        self.ask_proven(op, limit).await.map(|(r, _)| r)
    }

    /// Like [`Self::ask`], with the earliest moment the witness can have dated this
    /// member's liveness at, for an accepted request (the beginning of the exchange that
    /// brought the challenge it carried; `None` when unknown).
    pub async fn ask_proven(&self, op: Op, limit: Duration) -> Option<(Response, Option<std::time::Instant>)> {
        let deadline = tokio::time::Instant::now() + limit;
        for _ in 0..4 {
            let req = Request {
                id: crate::heartbeat::random_session(),
                challenge: self.challenge.load(Ordering::Relaxed),
                pair: self.pair.clone(),
                member: self.member.clone(),
                op,
            };
            let proof = self.challenge_from.lock().ok().and_then(|c| c.since);
            let began = std::time::Instant::now();
            let Some(resp) = self.exchange(&req, deadline).await else {
                // Its answer may have been lost after the witness issued a challenge
                // (which a later answer then carries): date that one from here.
                if let Ok(mut c) = self.challenge_from.lock() {
                    c.unanswered_since.get_or_insert(began);
                }
                return None;
            };
            self.challenge.store(resp.challenge, Ordering::Relaxed);
            if let Ok(mut c) = self.challenge_from.lock() {
                c.since = Some(c.unanswered_since.take().map_or(began, |u| u.min(began)));
            }
            if resp.outcome != Outcome::Stale {
                return Some((resp, proof));
            }
        }
        None
    }

    /// One request, sent every [`RESEND`] until its answer arrives or `deadline` passes.
    async fn exchange(&self, req: &Request, deadline: tokio::time::Instant) -> Option<Response> {
        let (tx, mut rx) = oneshot::channel();
        if let Ok(mut p) = self.pending.lock() {
            p.insert(req.id, tx);
        }
        // Forgets the waiter however this ends, also when the caller drops the future (a
        // quorum claim stops asking once a majority decided).
        let _forget = Forget { pending: &self.pending, id: req.id };
        let buf = witness::encode_request(req, &self.keys.current);
        loop {
            if let Err(e) = self.sock.send(&buf).await {
                tracing::debug!(witness = %self.address, error = %e, "witness request not sent");
            }
            let wait = (tokio::time::Instant::now() + RESEND).min(deadline);
            match tokio::time::timeout_at(wait, &mut rx).await {
                Ok(Ok(r)) => break Some(r),
                Ok(Err(_)) => break None,
                Err(_) if tokio::time::Instant::now() >= deadline => break None,
                Err(_) => {}
            }
        }
    }

    /// Reads the record, saying whether this member holds the VIPs.
    pub async fn read(&self, holding: bool, limit: Duration) -> Option<Response> {
        self.ask(Op::Read { holding }, limit).await
    }

    /// How often the record is read: a quarter of the heartbeat timeout, between 20 ms and
    /// [`POLL_INTERVAL`].
    pub fn poll_interval(&self) -> Duration {
        (self.timeout / 4).clamp(Duration::from_millis(20), POLL_INTERVAL)
    }

    /// How long the holder must have been silent at the witness for a claim: three
    /// quarters of the heartbeat timeout. The witness dates a member's liveness at the
    /// issue of the challenge its last request carried — the answer to the request before
    /// — so a live holder that reads every [`Self::poll_interval`] (at most a quarter of
    /// the timeout) is never older there than two intervals (half the timeout) plus the
    /// round trip; a dead one last proved itself before it died, and a peer claims no
    /// earlier than a heartbeat timeout after that.
    pub fn grace(&self) -> Duration {
        self.grace_override.unwrap_or(self.timeout * 3 / 4)
    }

    /// Reads the record every [`Self::poll_interval`] and shows it to the machine behind
    /// `handle`: changes of holder or epoch, renewals, and that the witness does not
    /// answer. Runs until the task is dropped.
    pub async fn watch(self: Arc<Self>, handle: Handle) {
        let mut feed = LeaseFeed::default();
        let mut session = None;
        let mut missed = 0u32;
        let every = self.poll_interval();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let holding = handle.status().holds_vips;
            match self.read(holding, every.max(Duration::from_millis(100))).await {
                Some(r) if r.outcome != Outcome::Refused => {
                    if missed >= UNREACHABLE_AFTER {
                        tracing::info!(pair = %self.pair, witness = %self.address, "the witness answers again");
                    }
                    missed = 0;
                    if session.replace(r.session).is_some_and(|s| s != r.session) {
                        feed.forget();
                    }
                    let holder = r.holder.as_deref().and_then(|h| sm::NodeId::new(h).ok());
                    let snap = LeaseSnapshot {
                        holder,
                        epoch: r.epoch,
                        renewed: Some(format!("{:x}/{}", r.session, r.renewals)),
                    };
                    feed.feed(&handle, Some(snap)).await;
                }
                other => {
                    missed = missed.saturating_add(1);
                    if missed == UNREACHABLE_AFTER {
                        let why = if other.is_some() {
                            "refuses this pair or member (no room)"
                        } else {
                            "does not answer (is it running and reachable, and is this member's key its own member key, \
                             printed by `havip-agent witness-key`? the witness counts what it drops in \
                             havip_witness_dropped_total)"
                        };
                        tracing::warn!(pair = %self.pair, witness = %self.address, "the witness {why}: no member takes the VIPs over until it answers");
                    }
                    if missed >= UNREACHABLE_AFTER && !handle.status().lease_stale {
                        handle.input(sm::Input::LeaseUnreachable).await;
                    }
                }
            }
        }
    }
}

async fn receive(sock: Arc<UdpSocket>, keys: Keyring, pending: Pending) {
    let mut buf = [0u8; witness::MAX_DATAGRAM + 1];
    loop {
        let n = match sock.recv(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                // ICMP port unreachable shows up here: the witness is down.
                tracing::debug!(error = %e, "witness receive failed");
                tokio::time::sleep(RESEND).await;
                continue;
            }
        };
        match witness::decode_response(&buf[..n], &keys) {
            Ok(r) => {
                let waiter = pending.lock().ok().and_then(|mut p| p.remove(&r.id));
                if let Some(w) = waiter {
                    let _ = w.send(r);
                }
            }
            Err(e) => tracing::debug!(error = %e, "witness answer dropped"),
        }
    }
}

#[async_trait::async_trait]
impl LeaseStore for WitnessClient {
    async fn cas(&self, holder: &str, new_epoch: u64, expected_epoch: u64) -> sm::CasResult {
        if holder != self.member {
            return sm::CasResult::Unavailable;
        }
        let grace_ms = u64::try_from(self.grace().as_millis()).unwrap_or(u64::MAX);
        match self.ask(Op::Cas { new_epoch, expected: expected_epoch, grace_ms }, WRITE_LIMIT).await {
            Some(r) if r.outcome == Outcome::Done => sm::CasResult::Ok { epoch: r.epoch },
            Some(Response { outcome: Outcome::HolderAlive, holder: Some(h), epoch, .. }) => {
                match sm::NodeId::new(h.clone()) {
                    Ok(holder) => {
                        // Normal right after a handover; a cut between the members shows in
                        // the machine's blocker and alarms.
                        tracing::debug!(pair = %self.pair, witness = %self.address, holder = %h, epoch, "the witness refused the write: it heard another member holding the VIPs within the grace");
                        sm::CasResult::HolderAlive { holder, epoch }
                    }
                    Err(_) => sm::CasResult::Unavailable,
                }
            }
            Some(r) if r.outcome == Outcome::Conflict => sm::CasResult::Conflict {
                holder: r.holder.as_deref().and_then(|h| sm::NodeId::new(h).ok()),
                epoch: r.epoch,
            },
            Some(r) => {
                tracing::warn!(pair = %self.pair, witness = %self.address, outcome = r.outcome.as_str(), new_epoch, "the witness refused a claim");
                sm::CasResult::Unavailable
            }
            None => sm::CasResult::Unavailable,
        }
    }

    async fn renew(&self, holder: &str, epoch: u64) -> Option<(Option<sm::NodeId>, u64)> {
        if holder != self.member {
            return None;
        }
        let r = self.ask(Op::Renew { epoch }, WRITE_LIMIT).await?;
        match r.outcome {
            Outcome::Done | Outcome::Conflict => {
                Some((r.holder.as_deref().and_then(|h| sm::NodeId::new(h).ok()), r.epoch))
            }
            Outcome::Stale | Outcome::Refused | Outcome::HolderAlive => None,
        }
    }
}
