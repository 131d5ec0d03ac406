//! The witness process (`havip-agent witness`): keeps, for every pair that asks, the
//! fencing record (holder and epoch) with compare-and-swap and renewals — the standalone
//! counterpart of the Kubernetes pair Lease — and answers over UDP.
//!
//! The record is written to `<stateDir>/witness.json` (atomically, fsync'd) before a
//! compare-and-swap is answered, so a restarted witness never hands out an epoch twice.
//! Renewal counts live in memory under a session id drawn at start: members do not compare
//! counts across sessions.
//!
//! Size: the witness server's request handling, persistence and its unit tests.

use super::error::WitnessError;
use crate::sm::MAX_EPOCH;
use crate::state::write_atomic;
use havip_crds::wire::{Key, Keyring};
use havip_crds::witness::{self, Op, Outcome, Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::UdpSocket;

/// How many members of one pair the witness keeps a challenge for (a pair has at most 8).
const MEMBERS_PER_PAIR: usize = 16;

/// A member not heard for this long (ms) may make room for a new one when its pair's table
/// is full (a member renamed or removed from the pair), unless it is the record's holder or
/// was last heard holding.
const MEMBER_IDLE_MS: u64 = 10 * 60 * 1000;

/// The challenge the witness last issued to one member, and when (ms on its clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Challenge {
    value: u64,
    issued: u64,
}

/// One pair's record.
#[derive(Clone, Debug, Default)]
struct Record {
    holder: Option<String>,
    epoch: u64,
    renewals: u64,
    challenges: BTreeMap<String, Challenge>,
    /// When each member was last known alive (ms on the witness's monotonic clock: the
    /// issue time of the challenge its last fresh request carried), whether it said it
    /// holds the VIPs, and when it last sent anything authentic.
    heard: BTreeMap<String, Heard>,
}

#[derive(Clone, Copy, Debug)]
struct Heard {
    alive_at: u64,
    holding: bool,
    last_request: u64,
}

impl Record {
    /// Room for `member` in the member tables: there already, or a free slot, or the slot
    /// of a member idle for [`MEMBER_IDLE_MS`] that neither holds the record nor was last
    /// heard holding. Never evicts a live or holding member: a pair whose table is full of
    /// live names refuses the newcomer instead.
    fn make_room(&mut self, member: &str, now: u64) -> bool {
        if self.challenges.contains_key(member) || self.heard.contains_key(member) {
            return true;
        }
        if self.challenges.len() < MEMBERS_PER_PAIR && self.heard.len() < MEMBERS_PER_PAIR {
            return true;
        }
        let idle = self
            .heard
            .iter()
            .filter(|(m, h)| {
                self.holder.as_deref() != Some(m.as_str())
                    && !h.holding
                    && now.saturating_sub(h.last_request) >= MEMBER_IDLE_MS
            })
            .min_by_key(|(_, h)| h.last_request)
            .map(|(m, _)| m.clone())
            .or_else(|| {
                // A challenge of a member never heard fresh (it never used it).
                self.challenges
                    .iter()
                    .filter(|(m, c)| {
                        !self.heard.contains_key(m.as_str()) && now.saturating_sub(c.issued) >= MEMBER_IDLE_MS
                    })
                    .min_by_key(|(_, c)| c.issued)
                    .map(|(m, _)| m.clone())
            });
        match idle {
            Some(m) => {
                self.heard.remove(&m);
                self.challenges.remove(&m);
                true
            }
            None => false,
        }
    }
}

/// The records of every pair, and the rules that change them (no I/O: unit-tested alone).
#[derive(Debug)]
pub struct Records {
    session: u64,
    max_pairs: usize,
    pairs: BTreeMap<String, Record>,
}

/// The durable part: holder and epoch per pair.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OnDisk {
    version: u32,
    pairs: BTreeMap<String, DiskRecord>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct DiskRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
    epoch: u64,
}

impl Records {
    /// Records restored from `disk`, under a fresh witness `session`, at `now` ms. Every
    /// restored holder counts as heard at `now`: a restarted witness has not heard anybody
    /// yet, and must not hand a live holder's record to a claimer in its first moments.
    pub fn new(session: u64, max_pairs: usize, disk: OnDisk, now: u64) -> Records {
        let pairs = disk
            .pairs
            .into_iter()
            .map(|(name, r)| {
                let heard = r
                    .holder
                    .iter()
                    .map(|h| (h.clone(), Heard { alive_at: now, holding: true, last_request: now }))
                    .collect();
                (name, Record { holder: r.holder, epoch: r.epoch, heard, ..Record::default() })
            })
            .collect();
        Records { session, max_pairs, pairs }
    }

    /// How many pairs the witness knows.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether it knows none.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// What must be on disk.
    pub fn durable(&self) -> OnDisk {
        OnDisk {
            version: 1,
            pairs: self
                .pairs
                .iter()
                .filter(|(_, r)| r.epoch > 0)
                .map(|(n, r)| (n.clone(), DiskRecord { holder: r.holder.clone(), epoch: r.epoch }))
                .collect(),
        }
    }

    /// Answers `req`, received at `now` ms. `fresh` draws a new challenge. The second value
    /// says whether the durable part changed: persist it before the answer leaves.
    pub fn handle(&mut self, req: &Request, now: u64, fresh: &mut impl FnMut() -> u64) -> (Response, bool) {
        let session = self.session;
        let refused = |challenge| Response {
            id: req.id,
            outcome: Outcome::Refused,
            session,
            challenge,
            holder: None,
            epoch: 0,
            renewals: 0,
        };
        if !self.pairs.contains_key(&req.pair) && self.pairs.len() >= self.max_pairs {
            return (refused(0), false);
        }
        let rec = self.pairs.entry(req.pair.clone()).or_default();
        if !rec.make_room(&req.member, now) {
            return (refused(0), false);
        }
        let current =
            *rec.challenges.entry(req.member.clone()).or_insert_with(|| Challenge { value: fresh(), issued: now });
        if let Some(h) = rec.heard.get_mut(&req.member) {
            h.last_request = now;
        }
        if req.challenge != current.value {
            // A replay, a retry after the first copy was accepted, or a member's first
            // request (it has no challenge yet): nothing changes, and nothing is learnt of
            // the member's liveness — a recorded request proves nothing.
            let r = Response {
                id: req.id,
                outcome: Outcome::Stale,
                session,
                challenge: current.value,
                holder: rec.holder.clone(),
                epoch: rec.epoch,
                renewals: rec.renewals,
            };
            return (r, false);
        }
        // Fresh: the member signed this after the witness issued `current`, so it was
        // alive then (not necessarily now: the request may have been held back).
        // The members heard saying they hold the VIPs, and when (before this request).
        let holding_heard: Vec<(String, u64)> =
            rec.heard.iter().filter(|(_, h)| h.holding).map(|(m, h)| (m.clone(), h.alive_at)).collect();
        let holding = match req.op {
            Op::Read { holding } => holding,
            Op::Renew { .. } => true,
            // A claimer does not hold yet; a holder reconciling the record still holds:
            // a write says nothing new about it.
            Op::Cas { .. } => rec.heard.get(&req.member).is_some_and(|h| h.holding),
        };
        rec.heard.insert(req.member.clone(), Heard { alive_at: current.issued, holding, last_request: now });
        let next = Challenge { value: fresh(), issued: now };
        rec.challenges.insert(req.member.clone(), next);
        let challenge = next.value;
        let mut alive_holder = None;
        let (outcome, changed) = match req.op {
            Op::Read { .. } => (Outcome::Done, false),
            Op::Cas { new_epoch, expected, grace_ms } => {
                // Another member heard holding the VIPs within the grace: the record's
                // holder, or one that took them in a handover whose write never landed.
                let alive = holding_heard.iter().find(|(m, t)| m != &req.member && now.saturating_sub(*t) < grace_ms);
                if new_epoch == 0 || new_epoch > MAX_EPOCH || new_epoch < expected {
                    (Outcome::Refused, false)
                } else if rec.epoch != expected {
                    (Outcome::Conflict, false)
                } else if let Some((m, _)) = alive {
                    alive_holder = Some(m.clone());
                    (Outcome::HolderAlive, false)
                } else {
                    rec.holder = Some(req.member.clone());
                    rec.epoch = new_epoch;
                    rec.renewals = 0;
                    // It takes the VIPs now: it counts as holding until its next read.
                    rec.heard.insert(req.member.clone(), Heard { alive_at: now, holding: true, last_request: now });
                    (Outcome::Done, true)
                }
            }
            Op::Renew { epoch } => {
                if rec.holder.as_deref() == Some(req.member.as_str()) && rec.epoch == epoch {
                    rec.renewals = rec.renewals.saturating_add(1);
                    (Outcome::Done, false)
                } else {
                    (Outcome::Conflict, false)
                }
            }
        };
        let r = Response {
            id: req.id,
            outcome,
            session,
            challenge,
            holder: alive_holder.or_else(|| rec.holder.clone()),
            epoch: rec.epoch,
            renewals: rec.renewals,
        };
        (r, changed)
    }

    /// Undoes a compare-and-swap whose record could not be persisted.
    fn restore(&mut self, pair: &str, before: Option<(Option<String>, u64, u64)>) {
        match before {
            Some((holder, epoch, renewals)) => {
                if let Some(r) = self.pairs.get_mut(pair) {
                    r.holder = holder;
                    r.epoch = epoch;
                    r.renewals = renewals;
                }
            }
            None => {
                self.pairs.remove(pair);
            }
        }
    }
}

/// The witness's state file.
#[derive(Clone, Debug)]
pub struct WitnessState {
    path: PathBuf,
}

impl WitnessState {
    /// `<dir>/witness.json`.
    pub fn new(dir: &Path) -> WitnessState {
        WitnessState { path: dir.join("witness.json") }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the directory's lock: one witness per state directory.
    pub fn lock(&self) -> Result<nix::fcntl::Flock<std::fs::File>, WitnessError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let lock = dir.join("witness.lock");
        let err = |source| WitnessError::Locked { path: lock.clone(), source };
        std::fs::create_dir_all(dir).map_err(err)?;
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock).map_err(err)?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| err(std::io::Error::from_raw_os_error(e as i32)))
    }

    /// Reads the file (missing: empty). Refuses an epoch outside the domain.
    pub fn load(&self) -> Result<OnDisk, WitnessError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(OnDisk::default()),
            Err(e) => return Err(WitnessError::State { path: self.path.clone(), message: e.to_string() }),
        };
        let d: OnDisk = serde_json::from_slice(&bytes)
            .map_err(|e| WitnessError::State { path: self.path.clone(), message: e.to_string() })?;
        if let Some((pair, r)) = d.pairs.iter().find(|(_, r)| r.epoch > MAX_EPOCH) {
            return Err(WitnessError::State {
                path: self.path.clone(),
                message: format!("pair {pair} has epoch {} outside 0..={MAX_EPOCH}", r.epoch),
            });
        }
        Ok(d)
    }

    /// Writes the file durably.
    pub fn store(&self, d: &OnDisk) -> Result<(), WitnessError> {
        let json = serde_json::to_vec_pretty(d)
            .map_err(|e| WitnessError::State { path: self.path.clone(), message: e.to_string() })?;
        write_atomic(&self.path, &json)
            .map_err(|e| WitnessError::State { path: self.path.clone(), message: e.to_string() })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The witness's metrics.
pub struct WitnessMetrics {
    registry: Registry,
    requests: Family<OpLabels, Counter>,
    dropped: Family<ReasonLabels, Counter>,
    pairs: Gauge,
}

impl Default for WitnessMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl WitnessMetrics {
    /// Registers the metrics.
    pub fn new() -> WitnessMetrics {
        let mut registry = Registry::default();
        let requests = Family::<OpLabels, Counter>::default();
        let dropped = Family::<ReasonLabels, Counter>::default();
        let pairs = Gauge::default();
        registry.register("havip_witness_requests", "Requests answered, by operation and outcome", requests.clone());
        registry.register(
            "havip_witness_dropped",
            "Datagrams dropped (failed authentication or decoding), by reason",
            dropped.clone(),
        );
        registry.register("havip_witness_pairs", "Pairs the witness keeps a record for", pairs.clone());
        WitnessMetrics { registry, requests, dropped, pairs }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Requests answered with `outcome`.
    pub fn requests(&self, op: &'static str, outcome: &'static str) -> u64 {
        self.requests.get_or_create(&OpLabels { op, outcome }).get()
    }
}

/// What the witness serves with.
pub struct WitnessOptions {
    /// Its keys.
    pub keys: Keyring,
    /// Its state file.
    pub state: WitnessState,
    /// The most pairs it keeps a record for.
    pub max_pairs: usize,
}

/// Binds `listen` (UDP).
pub async fn bind(listen: SocketAddr) -> Result<UdpSocket, WitnessError> {
    UdpSocket::bind(listen).await.map_err(|source| WitnessError::Bind { address: listen, source })
}

/// Serves requests on `sock` until the task is dropped. Restores the records from the
/// state file first.
pub async fn serve(sock: UdpSocket, opts: WitnessOptions, metrics: Arc<WitnessMetrics>) -> Result<(), WitnessError> {
    let disk = opts.state.load()?;
    let start = std::time::Instant::now();
    let now_ms = move || u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut records = Records::new(crate::heartbeat::random_session(), opts.max_pairs, disk, now_ms());
    metrics.pairs.set(records.len() as i64);
    let mut fresh = crate::heartbeat::random_session;
    let mut buf = [0u8; witness::MAX_DATAGRAM + 1];
    loop {
        let (n, from) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "witness receive failed");
                continue;
            }
        };
        let req = match witness::decode_request(&buf[..n], &opts.keys) {
            Ok(r) => r,
            Err(e) => {
                metrics.dropped.get_or_create(&ReasonLabels { reason: e.reason() }).inc();
                tracing::debug!(from = %from, error = %e, "witness datagram dropped");
                continue;
            }
        };
        let before = records.pairs.get(&req.pair).map(|r| (r.holder.clone(), r.epoch, r.renewals));
        let (mut resp, changed) = records.handle(&req, now_ms(), &mut fresh);
        if changed {
            if let Err(e) = opts.state.store(&records.durable()) {
                // Not durable, so not granted: the member treats the witness as unreachable.
                tracing::warn!(error = %e, pair = %req.pair, "witness failed to persist a record; refusing the write");
                records.restore(&req.pair, before);
                resp.outcome = Outcome::Refused;
            } else {
                tracing::info!(pair = %req.pair, holder = %req.member, epoch = resp.epoch, "witness record written");
            }
        }
        metrics.pairs.set(records.len() as i64);
        metrics.requests.get_or_create(&OpLabels { op: req.op.as_str(), outcome: resp.outcome.as_str() }).inc();
        let key = response_key(&opts.keys, &buf[..n], &req);
        if let Err(e) = sock.send_to(&witness::encode_response(&resp, &key), from).await {
            tracing::debug!(to = %from, error = %e, "witness answer not sent");
        }
    }
}

/// Answers under the member key the request was signed with (the keyring accepted it).
fn response_key(keys: &Keyring, request: &[u8], req: &Request) -> Key {
    let witness_key = match (&keys.previous, witness::request_key_id(request)) {
        (Some(p), Some(id)) if p.id == id => p,
        _ => &keys.current,
    };
    witness::member_key(witness_key, &req.pair, &req.member)
}

#[cfg(test)]
mod tests {
    use super::{DiskRecord, MEMBER_IDLE_MS, MEMBERS_PER_PAIR, OnDisk, Records, WitnessState};
    use crate::sm::MAX_EPOCH;
    use havip_crds::witness::{Op, Outcome, Request, Response};

    const READ: Op = Op::Read { holding: true };
    const GRACE: u64 = 300;

    fn req(member: &str, challenge: u64, op: Op) -> Request {
        Request { id: 1, challenge, pair: "web".into(), member: member.into(), op }
    }

    fn counter() -> impl FnMut() -> u64 {
        let mut n = 100;
        move || {
            n += 1;
            n
        }
    }

    fn cas(new_epoch: u64, expected: u64) -> Op {
        Op::Cas { new_epoch, expected, grace_ms: GRACE }
    }

    /// A member as the client behaves: it sends the challenge it last got, and on a stale
    /// answer sends again with the new one. `sent` keeps the last request it sent (what
    /// an attacker could record).
    struct Member {
        name: &'static str,
        challenge: u64,
        sent: Option<Request>,
    }

    impl Member {
        fn new(name: &'static str) -> Member {
            Member { name, challenge: 0, sent: None }
        }

        fn ask(&mut self, r: &mut Records, op: Op, now: u64, f: &mut impl FnMut() -> u64) -> Response {
            for _ in 0..2 {
                let q = req(self.name, self.challenge, op);
                let (resp, _) = r.handle(&q, now, f);
                self.sent = Some(q);
                self.challenge = resp.challenge;
                if resp.outcome != Outcome::Stale {
                    return resp;
                }
            }
            panic!("{} got two stale answers in a row at {now}", self.name);
        }
    }

    #[test]
    fn every_request_needs_the_current_challenge_and_uses_it_up() {
        let mut f = counter();
        let mut r = Records::new(7, 10, OnDisk::default(), 0);
        // A member's first request carries no challenge: stale, nothing changes.
        let (first, changed) = r.handle(&req("n0", 0, READ), 1_000, &mut f);
        assert_eq!((first.outcome, first.epoch, first.holder.clone(), changed), (Outcome::Stale, 0, None, false));
        let ch = first.challenge;
        let (read, _) = r.handle(&req("n0", ch, READ), 1_000, &mut f);
        assert_eq!(read.outcome, Outcome::Done);
        assert_ne!(read.challenge, ch, "a used challenge is replaced, for reads too");
        let (again, _) = r.handle(&req("n0", ch, READ), 1_000, &mut f);
        assert_eq!((again.outcome, again.challenge), (Outcome::Stale, read.challenge), "a read replayed");
        let (ok, changed) = r.handle(&req("n0", read.challenge, cas(1, 0)), 1_000, &mut f);
        assert_eq!((ok.outcome, ok.holder.as_deref(), ok.epoch, changed), (Outcome::Done, Some("n0"), 1, true));
        // The same datagram again (a replay, or a retry): stale.
        let (replay, changed) = r.handle(&req("n0", read.challenge, cas(1, 0)), 1_000, &mut f);
        assert_eq!((replay.outcome, changed), (Outcome::Stale, false));
        // n1 expected epoch 0 too: conflict, the record shows n0 at 1.
        let mut n1 = Member::new("n1");
        let conflict = n1.ask(&mut r, cas(1, 0), 1_000, &mut f);
        assert_eq!((conflict.outcome, conflict.holder.as_deref(), conflict.epoch), (Outcome::Conflict, Some("n0"), 1));
        // n0 was last proven alive when its last challenge was issued (1000): until 1300
        // it counts as alive.
        let alive = n1.ask(&mut r, cas(2, 1), 1_299, &mut f);
        assert_eq!((alive.outcome, alive.holder.as_deref(), alive.epoch), (Outcome::HolderAlive, Some("n0"), 1));
        let won = n1.ask(&mut r, cas(2, 1), 1_300, &mut f);
        assert_eq!((won.outcome, won.holder.as_deref(), won.epoch), (Outcome::Done, Some("n1"), 2));
    }

    #[test]
    fn a_replayed_request_of_a_dead_holder_does_not_keep_it_alive() {
        let mut f = counter();
        let mut r = Records::new(7, 10, OnDisk::default(), 0);
        let (mut n0, mut n1) = (Member::new("n0"), Member::new("n1"));
        n0.ask(&mut r, READ, 0, &mut f);
        assert_eq!(n0.ask(&mut r, cas(1, 0), 0, &mut f).outcome, Outcome::Done);
        n1.ask(&mut r, Op::Read { holding: false }, 0, &mut f);
        // n0 reads every 50 ms until it dies at 1000; an attacker recorded its last read
        // and its last renewal.
        let mut t = 50;
        while t <= 1_000 {
            n0.ask(&mut r, READ, t, &mut f);
            t += 50;
        }
        let recorded_read = n0.sent.clone().expect("a read was sent");
        let renewal = n0.ask(&mut r, Op::Renew { epoch: 1 }, 1_000, &mut f);
        assert_eq!(renewal.outcome, Outcome::Done);
        let recorded_renewal = n0.sent.clone().expect("a renewal was sent");
        // From 1000 on the attacker replays both every 20 ms; n1 claims from 1300 (its
        // heartbeat timeout after n0's death) every 100 ms: granted once n0 has not been
        // proven alive for the grace — at the first claim.
        let mut granted = None;
        let mut t = 1_000;
        while t <= 3_000 && granted.is_none() {
            for q in [&recorded_read, &recorded_renewal] {
                let (x, changed) = r.handle(q, t, &mut f);
                assert_eq!((x.outcome, changed), (Outcome::Stale, false), "a replay at {t}");
            }
            if t >= 1_300 && t % 100 == 0 {
                let x = n1.ask(&mut r, cas(2, 1), t, &mut f);
                if x.outcome == Outcome::Done {
                    granted = Some(t);
                }
            }
            t += 20;
        }
        assert_eq!(granted, Some(1_300), "the replays kept a dead holder alive at the witness");
    }

    #[test]
    fn a_request_held_back_proves_life_only_when_its_challenge_was_issued() {
        let mut f = counter();
        let mut r = Records::new(7, 10, OnDisk::default(), 0);
        let (mut n0, mut n1) = (Member::new("n0"), Member::new("n1"));
        n0.ask(&mut r, READ, 0, &mut f);
        assert_eq!(n0.ask(&mut r, cas(1, 0), 0, &mut f).outcome, Outcome::Done);
        n0.ask(&mut r, READ, 500, &mut f);
        // n0 signs one more read at 550 (with the challenge issued at 500) and dies; the
        // network (or an attacker) holds it back until 1000.
        let held = req("n0", n0.challenge, READ);
        let (late, _) = r.handle(&held, 1_000, &mut f);
        assert_eq!(late.outcome, Outcome::Done, "it is a genuine request");
        // It proves n0 alive at 500, not at 1000: a claim at 800 + grace is granted.
        let x = n1.ask(&mut r, cas(2, 1), 799, &mut f);
        assert_eq!(x.outcome, Outcome::HolderAlive);
        let y = n1.ask(&mut r, cas(2, 1), 800, &mut f);
        assert_eq!((y.outcome, y.holder.as_deref()), (Outcome::Done, Some("n1")));
    }

    #[test]
    fn a_holder_that_keeps_reading_is_never_taken_over_and_a_silent_one_is() {
        let mut f = counter();
        let mut r = Records::new(7, 10, OnDisk::default(), 0);
        let (mut n0, mut n1) = (Member::new("n0"), Member::new("n1"));
        n0.ask(&mut r, READ, 0, &mut f);
        n0.ask(&mut r, cas(1, 0), 0, &mut f);
        n1.ask(&mut r, READ, 0, &mut f);
        // n0 reads every 100 ms (a quarter of a 400 ms timeout; the grace is 300 ms); n1
        // claims every 100 ms for 3 s: always refused.
        for t in (100..3_000).step_by(100) {
            n0.ask(&mut r, READ, t, &mut f);
            let x = n1.ask(&mut r, cas(2, 1), t + 50, &mut f);
            assert_eq!(x.outcome, Outcome::HolderAlive, "at {}", t + 50);
        }
        // n0 falls silent after its read at 2900 (which proved it alive at 2800):
        // granted from 3100 on.
        let x = n1.ask(&mut r, cas(2, 1), 3_099, &mut f);
        assert_eq!(x.outcome, Outcome::HolderAlive);
        let x = n1.ask(&mut r, cas(2, 1), 3_100, &mut f);
        assert_eq!((x.outcome, x.holder.as_deref()), (Outcome::Done, Some("n1")));
    }

    #[test]
    fn a_holder_that_gave_the_vips_up_is_taken_over_at_once() {
        let mut f = counter();
        let mut r = Records::new(7, 10, OnDisk::default(), 0);
        let (mut n0, mut n1) = (Member::new("n0"), Member::new("n1"));
        n0.ask(&mut r, READ, 0, &mut f);
        n0.ask(&mut r, Op::Cas { new_epoch: 1, expected: 0, grace_ms: 150 }, 0, &mut f);
        // n0 fenced itself: it keeps reading, saying it does not hold.
        n0.ask(&mut r, Op::Read { holding: false }, 100, &mut f);
        n1.ask(&mut r, READ, 100, &mut f);
        let x = n1.ask(&mut r, Op::Cas { new_epoch: 2, expected: 1, grace_ms: 150 }, 110, &mut f);
        assert_eq!((x.outcome, x.holder.as_deref()), (Outcome::Done, Some("n1")));
    }

    #[test]
    fn a_member_heard_holding_blocks_a_claim_even_when_the_record_names_another() {
        // n0 took the VIPs in a handover whose write never landed: the record still names
        // n2 (now a standby), but n0's reads say it holds.
        let mut f = counter();
        let mut r = Records::new(7, 10, OnDisk::default(), 0);
        let (mut n0, mut n1, mut n2) = (Member::new("n0"), Member::new("n1"), Member::new("n2"));
        n2.ask(&mut r, READ, 0, &mut f);
        n2.ask(&mut r, Op::Cas { new_epoch: 5, expected: 0, grace_ms: 150 }, 0, &mut f);
        n2.ask(&mut r, Op::Read { holding: false }, 500, &mut f);
        n0.ask(&mut r, READ, 500, &mut f);
        n1.ask(&mut r, Op::Read { holding: false }, 500, &mut f);
        let x = n1.ask(&mut r, Op::Cas { new_epoch: 6, expected: 5, grace_ms: 150 }, 550, &mut f);
        assert_eq!((x.outcome, x.holder.as_deref(), x.epoch), (Outcome::HolderAlive, Some("n0"), 5));
        let y = n1.ask(&mut r, Op::Cas { new_epoch: 6, expected: 5, grace_ms: 150 }, 700, &mut f);
        assert_eq!((y.outcome, y.holder.as_deref()), (Outcome::Done, Some("n1")), "n0 silent for 200 ms");
    }

    #[test]
    fn a_full_member_table_never_evicts_the_holder() {
        let mut f = counter();
        let mut r = Records::new(7, 10, OnDisk::default(), 0);
        // The holder's name sorts first.
        let mut holder = Member::new("a-holder");
        holder.ask(&mut r, READ, 0, &mut f);
        assert_eq!(holder.ask(&mut r, cas(1, 0), 0, &mut f).outcome, Outcome::Done);
        // Many authentic members (every one a key holder) fill the pair's table.
        let names: Vec<&'static str> =
            (0..2 * MEMBERS_PER_PAIR).map(|i| &*Box::leak(format!("m{i:02}").into_boxed_str())).collect();
        for (i, n) in names.iter().enumerate() {
            let t = 10 + i as u64;
            let (x, _) = r.handle(&req(n, 0, Op::Read { holding: false }), t, &mut f);
            let _ = r.handle(&req(n, x.challenge, Op::Read { holding: false }), t, &mut f);
            holder.ask(&mut r, READ, t, &mut f);
        }
        // The holder keeps reading; a member claims: refused, the holder is alive.
        let mut m00 = Member::new("m00");
        let x = m00.ask(&mut r, cas(2, 1), 100, &mut f);
        assert_eq!((x.outcome, x.holder.as_deref()), (Outcome::HolderAlive, Some("a-holder")));
        // The newcomers beyond the table's room were refused, not let in by evicting.
        let (late, _) = r.handle(&req(names[names.len() - 1], 0, READ), 100, &mut f);
        assert_eq!(late.outcome, Outcome::Refused);
    }

    #[test]
    fn an_idle_member_makes_room_for_a_new_one() {
        let mut f = counter();
        let mut r = Records::new(7, 10, OnDisk::default(), 0);
        for i in 0..MEMBERS_PER_PAIR {
            let mut m = Member { name: Box::leak(format!("m{i:02}").into_boxed_str()), challenge: 0, sent: None };
            m.ask(&mut r, Op::Read { holding: false }, 0, &mut f);
        }
        let (x, _) = r.handle(&req("new", 0, READ), 1_000, &mut f);
        assert_eq!(x.outcome, Outcome::Refused, "every member was heard a second ago");
        let mut new = Member::new("new");
        let y = new.ask(&mut r, READ, MEMBER_IDLE_MS, &mut f);
        assert_eq!(y.outcome, Outcome::Done, "ten minutes later one idle member made room");
    }

    #[test]
    fn a_restarted_witness_counts_every_holder_as_just_heard() {
        let mut disk = OnDisk::default();
        disk.pairs.insert("web".into(), DiskRecord { holder: Some("n0".into()), epoch: 4 });
        let mut f = counter();
        let mut r = Records::new(8, 10, disk, 50_000);
        let mut n1 = Member::new("n1");
        n1.ask(&mut r, READ, 50_000, &mut f);
        let x = n1.ask(&mut r, cas(5, 4), 50_100, &mut f);
        assert_eq!(x.outcome, Outcome::HolderAlive);
        let y = n1.ask(&mut r, cas(5, 4), 50_300, &mut f);
        assert_eq!((y.outcome, y.epoch), (Outcome::Done, 5));
    }

    #[test]
    fn epochs_outside_the_domain_or_going_back_are_refused() {
        let mut f = counter();
        let mut r = Records::new(7, 10, OnDisk::default(), 0);
        let mut n0 = Member::new("n0");
        for op in [cas(0, 0), cas(MAX_EPOCH + 1, 0), cas(3, 4)] {
            let x = n0.ask(&mut r, op, 1_000, &mut f);
            assert_eq!((x.outcome, x.epoch), (Outcome::Refused, 0), "{op:?}");
        }
    }

    #[test]
    fn only_the_holder_renews_and_renewals_are_counted() {
        let mut f = counter();
        let mut r = Records::new(7, 10, OnDisk::default(), 0);
        let (mut n0, mut n1) = (Member::new("n0"), Member::new("n1"));
        n0.ask(&mut r, cas(5, 0), 1_000, &mut f);
        let a = n0.ask(&mut r, Op::Renew { epoch: 5 }, 1_000, &mut f);
        assert_eq!((a.outcome, a.renewals), (Outcome::Done, 1));
        let renewal = n0.sent.clone().expect("sent");
        let b = n0.ask(&mut r, Op::Renew { epoch: 4 }, 1_000, &mut f);
        assert_eq!((b.outcome, b.renewals), (Outcome::Conflict, 1), "another epoch");
        let c = n1.ask(&mut r, Op::Renew { epoch: 5 }, 1_000, &mut f);
        assert_eq!((c.outcome, c.renewals), (Outcome::Conflict, 1), "not the holder");
        let (replay, _) = r.handle(&renewal, 1_000, &mut f);
        assert_eq!((replay.outcome, replay.renewals), (Outcome::Stale, 1), "a replayed renewal counts nothing");
    }

    #[test]
    fn a_restarted_witness_keeps_holder_and_epoch_under_a_new_session_and_new_challenges() {
        let dir = tempfile::tempdir().expect("tempdir");
        let st = WitnessState::new(dir.path());
        let mut f = counter();
        let mut r = Records::new(7, 10, st.load().expect("empty"), 0);
        let mut n0 = Member::new("n0");
        let ok = n0.ask(&mut r, cas(9, 0), 1_000, &mut f);
        assert_eq!(ok.outcome, Outcome::Done);
        st.store(&r.durable()).expect("store");
        let mut g = || 5000u64;
        let mut again = Records::new(8, 10, st.load().expect("load"), 100_000);
        let (stale, _) = again.handle(&req("n0", ok.challenge, Op::Renew { epoch: 9 }), 100_000, &mut g);
        assert_eq!(stale.outcome, Outcome::Stale, "challenges of the old session are void");
        assert_eq!((stale.holder.as_deref(), stale.epoch, stale.session, stale.renewals), (Some("n0"), 9, 8, 0));
    }

    #[test]
    fn the_pair_limit_refuses_new_pairs_only() {
        let mut f = counter();
        let mut r = Records::new(7, 1, OnDisk::default(), 0);
        assert_eq!(Member::new("n0").ask(&mut r, READ, 1_000, &mut f).outcome, Outcome::Done);
        let other = Request { pair: "db".into(), ..req("n0", 0, READ) };
        assert_eq!(r.handle(&other, 1_000, &mut f).0.outcome, Outcome::Refused);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn a_state_file_with_an_epoch_outside_the_domain_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let st = WitnessState::new(dir.path());
        std::fs::write(
            st.path(),
            format!(r#"{{"version":1,"pairs":{{"web":{{"holder":"n0","epoch":{}}}}}}}"#, MAX_EPOCH + 1),
        )
        .expect("write");
        let e = st.load().expect_err("refused");
        assert!(e.to_string().contains("outside"), "{e}");
        std::fs::write(st.path(), "{garbage").expect("write");
        assert!(st.load().is_err());
    }
}
