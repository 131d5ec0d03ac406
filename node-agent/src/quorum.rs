//! The control-plane mode's arbitration: the members vote. Every member runs a voter (the
//! witness protocol's server, [`crate::witness::server`]) and asks every voter, its own
//! included, as a witness client; the pair's fencing record is what a majority of the
//! voters hold.
//!
//! * **A takeover needs a majority.** A claim is a compare-and-swap at every voter; it is
//!   granted when a majority grants it. A voter refuses it while it heard another member
//!   holding the VIPs within the grace (the quorum lease, two reads and a margin), so a
//!   cut between the members moves nothing as long as the holder reaches a majority.
//! * **The minority side stops serving.** A holder reads every voter each poll interval
//!   saying that it holds; each fresh answer of a voter whose record it is not behind is a
//!   proof of its liveness there. When a majority's proofs are fresh, the machine is told
//!   ([`sm::Input::LeaseConfirmed`], dated at the oldest of those proofs); a holder that no
//!   majority confirmed for the quorum lease gives the VIPs up (`QuorumLost`) before any
//!   voter's grace ends, so the other side's claim is granted only after it stopped.
//! * **The record** the machine sees is the one a majority of the voters hold (the newest
//!   such); a claim granted by a minority only is not a record.
//!
//! See docs/control-plane.md for the choice (the members' votes rather than etcd) and its
//! limits.

use crate::config::QuorumConfig;
use crate::lease::{LeaseFeed, LeaseSnapshot};
use crate::runtime::{Handle, LeaseStore};
use crate::sm;
use crate::witness::{WitnessClient, WitnessError};
use havip_crds::witness::{Op, Outcome, Response};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long one compare-and-swap may take in all: it answers as soon as a majority
/// granted it or can no longer grant it, and well within the machine's compare-and-swap
/// timeout (200 ms) otherwise — an unreachable voter must not make a granted claim late.
const CAS_LIMIT: Duration = Duration::from_millis(150);
/// How long a renewal may take in all.
const WRITE_LIMIT: Duration = Duration::from_secs(1);
/// Rounds in a row without a majority after which the machine is told the store is
/// unreachable.
const UNREACHABLE_AFTER: u32 = 2;
/// The grace's margin beyond the lease and two reads.
const GRACE_MARGIN: Duration = Duration::from_millis(50);

/// One voter as this member sees it.
struct Voter {
    node: String,
    client: Arc<WitnessClient>,
    /// The epoch of its record at its last answer (the compare-and-swap's expectation).
    epoch: Mutex<Option<u64>>,
}

/// A member's client of every voter of its pair: the pair's [`LeaseStore`] and the
/// watch that shows the machine the majority's record and confirms a holder.
pub struct QuorumClient {
    pair: String,
    member: String,
    voters: Vec<Voter>,
    majority: usize,
    poll: Duration,
    handle: OnceLock<Handle>,
}

/// What one round of answers says.
#[derive(Debug, PartialEq, Eq)]
pub struct Tally {
    /// The newest record a majority holds, with the renewal marks of the voters that hold it.
    pub record: Option<(Option<String>, u64, String)>,
    /// How many voters answered.
    pub answered: usize,
    /// For a holder: the proof time a majority of confirming voters is no older than.
    pub confirmed_at: Option<Instant>,
}

/// Counts one round: `answers` holds, per voter, its answer and proof time (or nothing);
/// `me` holds under `held` (if it holds).
pub fn tally(answers: &[Option<(Response, Option<Instant>)>], majority: usize, me: &str, held: Option<u64>) -> Tally {
    let fresh: Vec<&(Response, Option<Instant>)> = answers
        .iter()
        .flatten()
        .filter(|(r, _)| r.outcome != Outcome::Refused && r.outcome != Outcome::Stale)
        .collect();
    let mut records: Vec<(Option<String>, u64)> = fresh.iter().map(|(r, _)| (r.holder.clone(), r.epoch)).collect();
    records.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    records.dedup();
    let record = records.into_iter().find_map(|rec| {
        let holding: Vec<&&(Response, Option<Instant>)> =
            fresh.iter().filter(|(r, _)| r.holder == rec.0 && r.epoch == rec.1).collect();
        (holding.len() >= majority).then(|| {
            let marks: Vec<String> = holding.iter().map(|(r, _)| format!("{:x}/{}", r.session, r.renewals)).collect();
            (rec.0, rec.1, marks.join(","))
        })
    });
    let confirmed_at = held.and_then(|held| {
        // A voter confirms a holder it is not behind: its record names this member, or
        // no newer epoch than the one it holds under.
        let mut proofs: Vec<Instant> = fresh
            .iter()
            .filter(|(r, _)| r.outcome == Outcome::Done && (r.holder.as_deref() == Some(me) || r.epoch <= held))
            .filter_map(|(_, p)| *p)
            .collect();
        proofs.sort_unstable_by(|a, b| b.cmp(a));
        proofs.get(majority.checked_sub(1)?).copied()
    });
    Tally { record, answered: fresh.len(), confirmed_at }
}

impl QuorumClient {
    /// A client of every voter in `q` for `member` of `pair`, whose heartbeat timeout is
    /// `timeout`.
    pub async fn connect(
        q: &QuorumConfig,
        pair: &str,
        member: &str,
        timeout: Duration,
    ) -> Result<Arc<QuorumClient>, WitnessError> {
        let poll = (timeout / 4).clamp(Duration::from_millis(20), crate::witness::client::POLL_INTERVAL);
        let grace = Self::grace_for(q.lease, poll);
        let keys = havip_crds::witness::member_keyring(&q.keys, pair, member);
        let mut voters = Vec::new();
        for (node, address) in &q.voters {
            let client =
                WitnessClient::connect_with_grace(*address, keys.clone(), pair, member, timeout, Some(grace)).await?;
            voters.push(Voter { node: node.clone(), client, epoch: Mutex::new(None) });
        }
        Ok(Arc::new(QuorumClient {
            pair: pair.to_owned(),
            member: member.to_owned(),
            voters,
            majority: q.majority(),
            poll,
            handle: OnceLock::new(),
        }))
    }

    /// The voters' grace for a quorum lease `lease` read every `poll`: a holder's proof at
    /// a voter is at most two reads old while it lives, so a holder that gives the VIPs
    /// up a lease after its oldest majority proof has done so before any voter's grace
    /// ends.
    pub fn grace_for(lease: Duration, poll: Duration) -> Duration {
        lease + 2 * poll + GRACE_MARGIN
    }

    /// Asks every voter at once.
    async fn round(&self, op: Op, limit: Duration) -> Vec<Option<(Response, Option<Instant>)>> {
        let asks = self.voters.iter().map(|v| v.client.ask_proven(op, limit));
        let answers = futures::future::join_all(asks).await;
        for (v, a) in self.voters.iter().zip(&answers) {
            if let Some((r, _)) = a
                && r.outcome != Outcome::Refused
                && let Ok(mut e) = v.epoch.lock()
            {
                *e = Some(r.epoch);
            }
        }
        answers
    }

    fn held(&self, handle: &Handle) -> Option<u64> {
        let s = handle.status();
        if s.holds_vips { s.held_epoch } else { None }
    }

    async fn confirm(&self, handle: &Handle, at: Instant) {
        handle.input(sm::Input::LeaseConfirmed { at: handle.millis_at(at) }).await;
    }

    /// Reads every voter each poll interval: feeds the majority's record, confirms a
    /// holder, and tells the machine when no majority answers. Runs until dropped.
    pub async fn watch(self: Arc<Self>, handle: Handle) {
        let _ = self.handle.set(handle.clone());
        let mut feed = LeaseFeed::default();
        let mut missed = 0u32;
        let mut tick = tokio::time::interval(self.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let held = self.held(&handle);
            let answers =
                self.round(Op::Read { holding: held.is_some() }, self.poll.max(Duration::from_millis(100))).await;
            let t = tally(&answers, self.majority, &self.member, held);
            if let Some(at) = t.confirmed_at {
                self.confirm(&handle, at).await;
            }
            if t.answered >= self.majority {
                if missed >= UNREACHABLE_AFTER {
                    tracing::info!(pair = %self.pair, answered = t.answered, "a majority of the voters answers again");
                }
                missed = 0;
                if let Some((holder, epoch, mark)) = t.record {
                    let holder = holder.as_deref().and_then(|h| sm::NodeId::new(h).ok());
                    feed.feed(&handle, Some(LeaseSnapshot { holder, epoch, renewed: Some(mark) })).await;
                }
            } else {
                missed = missed.saturating_add(1);
                if missed == UNREACHABLE_AFTER {
                    let silent: Vec<&str> = self
                        .voters
                        .iter()
                        .zip(&answers)
                        .filter(|(_, a)| a.is_none())
                        .map(|(v, _)| v.node.as_str())
                        .collect();
                    tracing::warn!(pair = %self.pair, answered = t.answered, majority = self.majority, silent = ?silent,
                        "no majority of the members' voters answers: nobody takes the VIPs over, and a holder gives them up \
                         after the quorum lease (is this member cut off from the others, or do their agents run with the same \
                         heartbeat key and quorum port?)");
                }
                if missed >= UNREACHABLE_AFTER && !handle.status().lease_stale {
                    handle.input(sm::Input::LeaseUnreachable).await;
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl LeaseStore for QuorumClient {
    async fn cas(&self, holder: &str, new_epoch: u64, expected_epoch: u64) -> sm::CasResult {
        if holder != self.member {
            return sm::CasResult::Unavailable;
        }
        let grace_ms =
            self.voters.first().map_or(0, |v| u64::try_from(v.client.grace().as_millis()).unwrap_or(u64::MAX));
        let mut asks: futures::stream::FuturesUnordered<_> = self
            .voters
            .iter()
            .map(|v| async move {
                // Each voter is asked against its own record (a claim a minority granted
                // earlier left some ahead of the others).
                let known = v.epoch.lock().ok().and_then(|e| *e).filter(|e| *e < new_epoch);
                let expected = known.unwrap_or(expected_epoch);
                let a = v.client.ask_proven(Op::Cas { new_epoch, expected, grace_ms }, CAS_LIMIT).await;
                if let Some((r, _)) = &a
                    && let Ok(mut e) = v.epoch.lock()
                {
                    *e = Some(r.epoch);
                }
                a
            })
            .collect();
        // Until a majority granted it, or too few are left to.
        let mut answers = Vec::new();
        let mut pending = self.voters.len();
        while let Some(a) = futures::StreamExt::next(&mut asks).await {
            pending -= 1;
            answers.push(a);
            let done = answers.iter().flatten().filter(|(r, _)| r.outcome == Outcome::Done).count();
            if done >= self.majority || done + pending < self.majority {
                break;
            }
        }
        let granted: Vec<Option<Instant>> =
            answers.iter().flatten().filter(|(r, _)| r.outcome == Outcome::Done).map(|(_, p)| *p).collect();
        if granted.len() >= self.majority {
            // The voters count the claimer as holding from the grant: its lease starts at
            // the oldest of the majority's proofs (told before the answer, so that the
            // machine holds on it).
            let mut proofs: Vec<Instant> = granted.into_iter().flatten().collect();
            proofs.sort_unstable_by(|a, b| b.cmp(a));
            if let (Some(at), Some(handle)) = (proofs.get(self.majority - 1), self.handle.get()) {
                self.confirm(handle, *at).await;
            }
            return sm::CasResult::Ok { epoch: new_epoch };
        }
        let fresh = || answers.iter().flatten().map(|(r, _)| r);
        if let Some(r) = fresh().find(|r| r.outcome == Outcome::HolderAlive)
            && let Some(holder) = r.holder.as_deref().and_then(|h| sm::NodeId::new(h).ok())
        {
            // Normal right after a handover (the old holder's last read said holding) and
            // when this member cannot hear a holder the voters hear (the machine's blocker
            // and alarms say so): not a warning of its own.
            tracing::debug!(pair = %self.pair, holder = %holder, epoch = r.epoch, "the voters refused the write: they heard another member holding the VIPs within the grace");
            return sm::CasResult::HolderAlive { holder, epoch: r.epoch };
        }
        if let Some(r) =
            fresh().filter(|r| r.outcome == Outcome::Conflict && r.epoch >= new_epoch).max_by_key(|r| r.epoch)
        {
            return sm::CasResult::Conflict {
                holder: r.holder.as_deref().and_then(|h| sm::NodeId::new(h).ok()),
                epoch: r.epoch,
            };
        }
        tracing::warn!(pair = %self.pair, granted = answers.iter().flatten().filter(|(r, _)| r.outcome == Outcome::Done).count(),
            majority = self.majority, new_epoch, "no majority of the voters granted the claim");
        sm::CasResult::Unavailable
    }

    async fn renew(&self, holder: &str, epoch: u64) -> Option<(Option<sm::NodeId>, u64)> {
        if holder != self.member {
            return None;
        }
        let answers = self.round(Op::Renew { epoch }, WRITE_LIMIT).await;
        let renewed: Vec<&Response> = answers
            .iter()
            .flatten()
            .map(|(r, _)| r)
            .filter(|r| matches!(r.outcome, Outcome::Done | Outcome::Conflict))
            .collect();
        if renewed.len() < self.majority {
            return None;
        }
        // The newest record among them stands for the majority's.
        let r = renewed.into_iter().max_by_key(|r| r.epoch)?;
        Some((r.holder.as_deref().and_then(|h| sm::NodeId::new(h).ok()), r.epoch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(
        outcome: Outcome,
        holder: Option<&str>,
        epoch: u64,
        proof_ms: u64,
        t0: Instant,
    ) -> Option<(Response, Option<Instant>)> {
        let r = Response {
            id: 1,
            challenge: 2,
            outcome,
            holder: holder.map(str::to_owned),
            epoch,
            session: 7,
            renewals: 0,
        };
        Some((r, Some(t0 + Duration::from_millis(proof_ms))))
    }

    #[test]
    fn a_majority_of_fresh_answers_confirms_the_holder_at_the_oldest_of_their_proofs() {
        let t0 = Instant::now();
        let a = [
            answer(Outcome::Done, Some("a"), 3, 100, t0),
            answer(Outcome::Done, Some("a"), 3, 40, t0),
            answer(Outcome::Done, Some("a"), 3, 70, t0),
        ];
        let t = tally(&a, 2, "a", Some(3));
        assert_eq!(t.confirmed_at, Some(t0 + Duration::from_millis(70)), "the second newest of three");
        assert_eq!(t.record.as_ref().map(|r| (r.0.clone(), r.1)), Some((Some("a".to_owned()), 3)));
        // Not holding: no confirmation.
        assert_eq!(tally(&a, 2, "a", None).confirmed_at, None);
    }

    #[test]
    fn a_minority_answering_confirms_nothing_and_is_no_record() {
        let t0 = Instant::now();
        let a = [answer(Outcome::Done, Some("a"), 3, 100, t0), None, None];
        let t = tally(&a, 2, "a", Some(3));
        assert_eq!((t.confirmed_at, t.record, t.answered), (None, None, 1));
    }

    #[test]
    fn voters_that_granted_a_newer_claim_to_another_confirm_nothing() {
        let t0 = Instant::now();
        // Two of three voters now name b under 4; a holds under 3.
        let a = [
            answer(Outcome::Done, Some("a"), 3, 100, t0),
            answer(Outcome::Done, Some("b"), 4, 100, t0),
            answer(Outcome::Done, Some("b"), 4, 100, t0),
        ];
        let t = tally(&a, 2, "a", Some(3));
        assert_eq!(t.confirmed_at, None);
        assert_eq!(t.record.map(|r| (r.0, r.1)), Some((Some("b".to_owned()), 4)));
    }

    #[test]
    fn a_claim_a_minority_granted_is_not_the_record() {
        let t0 = Instant::now();
        let a = [
            answer(Outcome::Done, Some("b"), 4, 100, t0),
            answer(Outcome::Done, Some("a"), 3, 100, t0),
            answer(Outcome::Done, Some("a"), 3, 100, t0),
        ];
        let t = tally(&a, 2, "a", Some(3));
        assert_eq!(t.record.map(|r| (r.0, r.1)), Some((Some("a".to_owned()), 3)));
        assert!(t.confirmed_at.is_some(), "two voters still confirm a");
    }

    #[test]
    fn stale_and_refused_answers_count_for_nothing() {
        let t0 = Instant::now();
        let a = [
            answer(Outcome::Stale, Some("a"), 3, 100, t0),
            answer(Outcome::Refused, Some("a"), 3, 100, t0),
            answer(Outcome::Done, Some("a"), 3, 100, t0),
        ];
        let t = tally(&a, 2, "a", Some(3));
        assert_eq!((t.answered, t.confirmed_at), (1, None));
    }

    #[test]
    fn the_grace_outlasts_the_lease_by_two_reads_and_a_margin() {
        let g = QuorumClient::grace_for(Duration::from_millis(400), Duration::from_millis(75));
        assert_eq!(g, Duration::from_millis(600));
    }
}
